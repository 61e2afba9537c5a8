//! Issue 32: the packaged Prometheus rules on a real Prometheus. Each node
//! runs its agent (writing `gpu_node_agent.prom`) and Debian's
//! `prometheus-node-exporter` with only the textfile collector on the agent's
//! directory, listening on the node's own address; a real `prometheus` on
//! the host scrapes both and evaluates the rule file the package ships (the
//! installed one under `SLURM_LAB_INSTALLED`), in a copy whose `for:`
//! durations are cut to 1 s (the shipped file keeps its own). An Xid 79 on
//! node2 must make `GpuNodeDrainedByAgent` fire for node2, and only for it.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use slurm_lab::Lab;
use slurm_lab::agents::{AgentFiles, add_event, reset, start_agent_edited};

use super::CaseResult;

/// The rule file as the package installs it.
const INSTALLED_RULES: &str = "/usr/share/spank-gpu/prometheus/gpu-node-agent.rules.yml";
/// node_exporter's port on each node's address.
const EXPORTER_PORT: u16 = 9100;

/// The rule file under test: the installed one, or the source tree's.
fn rules_file() -> PathBuf {
    if std::env::var_os("SLURM_LAB_INSTALLED").is_some() {
        PathBuf::from(INSTALLED_RULES)
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/prometheus/gpu-node-agent.rules.yml")
    }
}

/// The rules with every `for:` cut to 1 s, for a test that cannot wait minutes.
fn quick_rules(text: &str) -> (String, usize) {
    let mut cut = 0;
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("for: ") {
            cut += 1;
            let _ = writeln!(out, "{}for: 1s", &line[..line.len() - t.len()]);
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    (out, cut)
}

/// `s` as a URL query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An HTTP GET on Prometheus: status and body.
fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("127.0.0.1:{port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| format!("GET {path}: {e}"))?;
    let (head, body) =
        reply.split_once("\r\n\r\n").ok_or_else(|| format!("GET {path}: no HTTP reply: {reply}"))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// The `data` of a successful API call.
fn api(port: u16, path: &str) -> Result<Value, String> {
    let (status, body) = get(port, path)?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}: {body}"))?;
    ensure!(status == 200 && v["status"] == "success", "GET {path}: {status} {body}");
    Ok(v["data"].clone())
}

/// An instant query's samples: (labels, value).
fn query(port: u16, q: &str) -> Result<Vec<(Value, String)>, String> {
    let data = api(port, &format!("/api/v1/query?query={}", encode(q)))?;
    Ok(data["result"]
        .as_array()
        .map(|r| {
            r.iter().map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap_or("").to_owned())).collect()
        })
        .unwrap_or_default())
}

/// The alerts Prometheus holds now: (alertname, node, state, summary).
fn alerts(port: u16) -> Result<Vec<(String, String, String, String)>, String> {
    let data = api(port, "/api/v1/alerts")?;
    let field = |a: &Value, k: &str, f: &str| a[k][f].as_str().unwrap_or("").to_owned();
    Ok(data["alerts"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|a| {
                    let state = a["state"].as_str().unwrap_or("").to_owned();
                    (
                        field(a, "labels", "alertname"),
                        field(a, "labels", "node"),
                        state,
                        field(a, "annotations", "summary"),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Waits until `ready` says yes (polling every 100 ms), or fails with what it said last.
fn wait(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> Result<bool, String>,
) -> Result<Duration, String> {
    let t = Instant::now();
    let mut last = String::new();
    loop {
        match ready() {
            Ok(true) => return Ok(t.elapsed()),
            Ok(false) => {}
            Err(e) => last = e,
        }
        ensure!(t.elapsed() < timeout, "{what}: not after {timeout:?} {last}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn alerts_fire_on_a_real_drain(lab: &mut Lab) -> CaseResult {
    let result = run(lab);
    let mut logs = String::new();
    if result.is_err() {
        for name in ["prometheus", "node-exporter-node1", "node-exporter-node2"] {
            let text = fs::read_to_string(lab.dir.join(format!("log/{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            let _ =
                write!(logs, "\n--- {name} ---\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
    }
    lab.stop_daemon("prometheus");
    for node in lab.nodes.clone() {
        lab.stop_daemon(&format!("node-exporter-{node}"));
    }
    let cleanup = reset(lab);
    result.map_err(|e| e + &logs).and(cleanup)
}

fn run(lab: &mut Lab) -> CaseResult {
    let started = Instant::now();
    let rules = rules_file();
    let text = fs::read_to_string(&rules).map_err(|e| format!("{}: {e}", rules.display()))?;
    let (quick, cut) = quick_rules(&text);
    ensure!(cut >= 5, "{}: only {cut} `for:` lines", rules.display());
    let dir = lab.dir.join("prometheus");
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    fs::write(dir.join("rules.yml"), quick).map_err(|e| e.to_string())?;

    // Each node: its agent writing gpu_node_agent.prom (the name the stale-file
    // rule knows), and node_exporter reading the agent's directory.
    let mut targets = Vec::new();
    let mut agents: Vec<AgentFiles> = Vec::new();
    for (i, node) in lab.nodes.clone().iter().enumerate() {
        let agent_dir = lab.dir.join(format!("agent-{node}"));
        let from = format!("metrics_textfile = \"{}\"", agent_dir.join("metrics.prom").display());
        let to = format!("metrics_textfile = \"{}\"", agent_dir.join("gpu_node_agent.prom").display());
        agents.push(start_agent_edited(lab, node, &[(&from, &to)])?);
        let addr = format!("{}:{EXPORTER_PORT}", Lab::node_addr(i));
        let listen = format!("--web.listen-address={addr}");
        let textfiles = format!("--collector.textfile.directory={}", agent_dir.display());
        let args = ["--collector.disable-defaults", "--collector.textfile", &textfiles, &listen];
        lab.spawn_on(node, &format!("node-exporter-{node}"), "prometheus-node-exporter", &args, &[])
            .map_err(|e| e.to_string())?;
        targets.push(format!("'{addr}'"));
    }

    let port =
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
         scrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: [{}]\n",
        dir.join("rules.yml").display(),
        targets.join(", ")
    );
    fs::write(dir.join("prometheus.yml"), config).map_err(|e| e.to_string())?;
    let args = [
        format!("--config.file={}", dir.join("prometheus.yml").display()),
        format!("--storage.tsdb.path={}", dir.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lab.spawn_host("prometheus", "prometheus", &args).map_err(|e| e.to_string())?;
    wait("Prometheus ready", Duration::from_secs(30), || Ok(get(port, "/-/ready")?.0 == 200))?;

    // The rules loaded without error; both nodes' agents scraped; node_exporter's
    // mtime of the file is the series the stale-file rule selects.
    let groups = api(port, "/api/v1/rules")?;
    let loaded: Vec<String> = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .map(|r| format!("{}:{}", r["name"].as_str().unwrap_or(""), r["health"].as_str().unwrap_or("")))
        .collect();
    ensure!(loaded.iter().any(|r| r.starts_with("GpuNodeDrainedByAgent:")), "rules loaded: {loaded:?}");
    wait("both agents' metrics scraped", Duration::from_secs(20), || {
        Ok(query(port, "gpu_node_agent_up")?.len() == 2)
    })?;
    let bad: Vec<&String> = loaded.iter().filter(|r| r.ends_with(":err")).collect();
    ensure!(bad.is_empty(), "rules that fail to evaluate: {bad:?}");
    let mtimes = query(port, r#"node_textfile_mtime_seconds{file=~"(.*/)?gpu_node_agent\\.prom"}"#)?;
    ensure!(mtimes.len() == 2, "the stale-file rule's selector finds {mtimes:?}");
    let before = alerts(port)?;
    ensure!(
        !before.iter().any(|a| a.0 == "GpuNodeDrainedByAgent"),
        "a drain alert before any fault: {before:?}"
    );

    add_event(&agents[1], 3, 79)?;
    let mut firing = Vec::new();
    let took = wait("GpuNodeDrainedByAgent firing", Duration::from_secs(30), || {
        firing =
            alerts(port)?.into_iter().filter(|a| a.0 == "GpuNodeDrainedByAgent" && a.2 == "firing").collect();
        Ok(!firing.is_empty())
    })?;
    ensure!(firing.len() == 1 && firing[0].1 == "node2", "the drain alert names: {firing:?}");
    ensure!(firing[0].3.starts_with("node2: drained by gpu-node-agent "), "its summary: {}", firing[0].3);
    let fleet = query(port, "job:gpu_node_agent_drained:sum")?;
    ensure!(fleet.len() == 1 && fleet[0].1 == "1", "job:gpu_node_agent_drained:sum = {fleet:?}");
    let others: Vec<String> = alerts(port)?
        .into_iter()
        .filter(|a| a.0 != "GpuNodeDrainedByAgent")
        .map(|a| format!("{} {} ({})", a.0, a.1, a.2))
        .collect();
    println!(
        "    (Xid 79 injected → GpuNodeDrainedByAgent firing for node2 in {:.1} s: scrape and evaluation every 1 s, \
         `for` cut from 5m to 1s; {} `for`s cut; other alerts: {others:?}; case {:.1} s)",
        took.as_secs_f64(),
        cut,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
