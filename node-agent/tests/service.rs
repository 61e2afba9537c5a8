//! The daemon as systemd and an admin see it: its footprint with hwloc's
//! plugins and an OpenCL runtime installed, the service protocol (READY after
//! the GPU table, watchdog pings, STOPPING), its log under the journal
//! (priorities, `RUST_LOG`, repeats held back) and its source metrics when
//! NVML has no events. NVML is the fake library (build the workspace first:
//! `cargo build --workspace`); Slurm does not answer (`scontrol` is
//! `/bin/false`), which makes the agent report the same error every pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");
const HEALTHY: &str = include_str!("../../tests/fake-nvml/states/h100x8-healthy.json");

/// The daemon's limits on a GPU node (issue 12), here with the fake NVML.
const MAX_RSS_KIB: u64 = 20 * 1024;
/// The loop, NVML's Xid events, the kernel log, the Xids' forwarder to the
/// loop, the NVML probe's worker, the per-job usage sampler, its accounting
/// writer and its stale-record collector, the epilog gate's listener (its
/// connections' threads come and go).
const MAX_THREADS: u64 = 9;
/// Libraries hwloc's vendor plugins drag in; none may be mapped by the daemon.
const FORBIDDEN_MAPS: &[&str] = &["opencl", "pocl", "llvm", "clang", "libcuda", "/hwloc/hwloc_"];

struct Daemon {
    dir: PathBuf,
    child: Child,
    notify: UnixDatagram,
}

impl Daemon {
    /// Starts `gpu-node-agent run` in a fresh directory with `nvml` as the
    /// fake NVML's state and the given environment.
    fn start(
        name: &str,
        nvml: &serde_json::Value,
        journal: bool,
        env: &[(&str, &str)],
        kmsg: bool,
    ) -> Daemon {
        let dir = std::env::temp_dir().join(format!("agent-service-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let lib = Path::new(AGENT).with_file_name("libfake_nvml.so");
        assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
        fs::write(dir.join("nvml.json"), nvml.to_string()).unwrap();
        if kmsg {
            fs::write(dir.join("kmsg"), "").unwrap();
        }
        fs::write(dir.join("boot_id"), "b1\n").unwrap();
        let d = dir.display();
        let config = format!(
            "node_name = \"node1\"\nnvml_library = \"{}\"\nkmsg_path = \"{d}/kmsg\"\nstate_dir = \"{d}/state\"\n\
             topology_dir = \"{d}/topology\"\nboot_id_path = \"{d}/boot_id\"\nmetrics_textfile = \"{d}/metrics.prom\"\n\
             scontrol = \"/bin/false\"\nslurmd = \"/bin/false\"\npoll_interval = \"300ms\"\nnvml_timeout = \"2s\"\n",
            lib.display()
        );
        fs::write(dir.join("config.toml"), config).unwrap();
        let notify = UnixDatagram::bind(dir.join("notify")).unwrap();
        notify.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let stderr = fs::File::create(dir.join("stderr")).unwrap();
        let identity = stderr.metadata().unwrap();
        let mut cmd = Command::new(AGENT);
        cmd.arg("--config")
            .arg(dir.join("config.toml"))
            .arg("run")
            .env("FAKE_NVML_STATE", dir.join("nvml.json"))
            .env("NOTIFY_SOCKET", dir.join("notify"))
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if journal {
            cmd.env("JOURNAL_STREAM", format!("{}:{}", identity.dev(), identity.ino()));
        }
        let child = cmd.spawn().unwrap();
        Daemon { dir, child, notify }
    }

    /// The next notification; panics after a minute without one.
    fn next(&self) -> String {
        let mut buf = [0u8; 1024];
        let n = self.notify.recv(&mut buf).unwrap_or_else(|e| panic!("no notification: {e}\n{}", self.log()));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    fn status(&self, key: &str) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no {key} in /proc/PID/status"))
    }

    /// SIGTERM, as systemd stops it; returns the notifications sent since.
    fn stop(mut self) -> (Vec<String>, String) {
        let _ = self.notify.set_read_timeout(Some(Duration::from_secs(10)));
        let killed = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        assert!(killed.success());
        let mut after = Vec::new();
        let mut buf = [0u8; 1024];
        while let Ok(n) = self.notify.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = text == "STOPPING=1";
            after.push(text);
            if done {
                break;
            }
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the daemon exited with {status}:\n{}", self.log());
        let log = self.log();
        let _ = fs::remove_dir_all(&self.dir);
        (after, log)
    }
}

fn no_events() -> serde_json::Value {
    let mut state: serde_json::Value = serde_json::from_str(HEALTHY).unwrap();
    state["events_supported"] = serde_json::json!(false);
    state
}

/// hwloc's OpenCL plugin and an OpenCL runtime: what made the daemon map
/// LLVM. Without them the footprint check would prove nothing.
fn vendor_plugins_installed() -> Result<(), String> {
    let plugin = fs::read_dir("/usr/lib")
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .any(|d| d.path().join("hwloc/hwloc_opencl.so").is_file());
    let icd = Path::new("/etc/OpenCL/vendors/pocl.icd").is_file();
    if plugin && icd {
        Ok(())
    } else {
        Err("hwloc's OpenCL plugin or pocl is missing: apt-get install libhwloc-plugins pocl-opencl-icd \
             (tests/run and .ci/run install them); without them this test proves nothing"
            .to_owned())
    }
}

#[test]
fn the_daemon_is_lean_tells_systemd_and_logs_for_the_journal() {
    vendor_plugins_installed().unwrap();
    let daemon = Daemon::start("main", &no_events(), true, &[("WATCHDOG_USEC", "600000")], true);

    // READY only once the first pass is done and the GPU table written.
    let mut pings = 0;
    let ready = loop {
        let n = daemon.next();
        if n == "WATCHDOG=1" {
            pings += 1;
            continue;
        }
        break n;
    };
    assert!(ready.starts_with("READY=1"), "{ready}");
    let table = daemon.dir.join("topology/gpus.tsv");
    assert!(table.is_file(), "READY before the GPU table was written:\n{}", daemon.log());
    assert!(daemon.dir.join("metrics.prom").is_file(), "READY before the first pass");

    // Watchdog pings keep coming from the main loop (every 200 ms here).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        assert_eq!(daemon.next(), "WATCHDOG=1");
        pings += 1;
    }
    assert!(pings >= 5, "{pings} pings");

    // The footprint, once the table's child is gone.
    let pid = daemon.child.id();
    let rss = daemon.status("VmRSS:");
    let threads = daemon.status("Threads:");
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut libs: Vec<&str> = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).collect();
    libs.sort_unstable();
    libs.dedup();
    println!("idle daemon (fake NVML, hwloc plugins and pocl installed): RSS {rss} KiB, {threads} threads");
    println!("mapped: {}", libs.iter().filter(|l| l.starts_with('/')).copied().collect::<Vec<_>>().join(" "));
    assert!(libs.iter().any(|l| l.contains("libhwloc")), "the maps check reads the maps: {libs:?}");
    let forbidden: Vec<&&str> =
        libs.iter().filter(|l| FORBIDDEN_MAPS.iter().any(|f| l.to_ascii_lowercase().contains(f))).collect();
    assert!(forbidden.is_empty(), "the daemon maps {forbidden:?}");
    assert!(rss <= MAX_RSS_KIB, "RSS {rss} KiB > {MAX_RSS_KIB} KiB");
    assert!(threads <= MAX_THREADS, "{threads} threads > {MAX_THREADS}");

    // The sources, as the metrics show them.
    let metrics = fs::read_to_string(daemon.dir.join("metrics.prom")).unwrap();
    for want in [
        "gpu_node_agent_source_up{node=\"node1\",source=\"nvml_events\"} 0\n",
        "gpu_node_agent_source_up{node=\"node1\",source=\"kmsg\"} 1\n",
        "gpu_node_agent_source_up{node=\"node1\",source=\"nvml\"} 1\n",
        "nvml_driver=\"580.95.05\"} 1\n",
        "gpu_node_agent_last_pass_timestamp_seconds{node=\"node1\"} ",
        // slurmd -G and Slurm both fail here: the table is in NVML's order, and says so.
        "gpu_node_agent_gpu_table_ok{node=\"node1\"} 0\n",
    ] {
        assert!(metrics.contains(want), "no {want:?} in\n{metrics}");
    }

    let (after, log) = daemon.stop();
    assert_eq!(after.last().map(String::as_str), Some("STOPPING=1"), "{after:?}");

    // Journal lines: a priority each, no timestamps.
    assert!(log.lines().all(|l| l.starts_with('<')), "{log}");
    assert!(log.contains("<6>INFO gpu-node-agent started"), "{log}");
    assert!(log.contains("<6>INFO GPU table written gpus=8"), "{log}");
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("NVML Xid events unavailable")).collect();
    assert_eq!(warnings.len(), 1, "one warning, however often it is retried:\n{log}");
    assert!(warnings[0].starts_with("<4>WARN") && warnings[0].contains("kernel log"), "{}", warnings[0]);
    // Slurm failed on every pass (a dozen here); the error is logged once.
    let unhealthy = log.lines().filter(|l| l.contains("agent unhealthy")).count();
    assert_eq!(unhealthy, 1, "{log}");
    assert!(log.lines().any(|l| l.starts_with("<3>ERROR agent unhealthy")), "{log}");
}

#[test]
fn rust_log_is_honoured_and_a_failing_kernel_log_is_one_warning() {
    // No kernel-log file: the follower fails on every try (every 250 ms).
    let healthy = serde_json::from_str(HEALTHY).unwrap();
    let daemon = Daemon::start("rustlog", &healthy, false, &[("RUST_LOG", "warn")], false);
    let ready = daemon.next();
    assert!(ready.starts_with("READY=1"), "{ready}");
    std::thread::sleep(Duration::from_secs(1));
    let metrics = fs::read_to_string(daemon.dir.join("metrics.prom")).unwrap();
    for want in [
        "gpu_node_agent_source_up{node=\"node1\",source=\"nvml_events\"} 1\n",
        "gpu_node_agent_source_up{node=\"node1\",source=\"kmsg\"} 0\n",
    ] {
        assert!(metrics.contains(want), "no {want:?} in\n{metrics}");
    }
    let (_, log) = daemon.stop();
    assert!(!log.contains(" INFO "), "RUST_LOG=warn shows no info lines:\n{log}");
    let error = log.lines().find(|l| l.contains("agent unhealthy")).unwrap_or_else(|| panic!("{log}"));
    assert!(
        error.starts_with("20") && error.contains(" ERROR agent unhealthy"),
        "plain lines have times: {error}"
    );
    let kmsg: Vec<&str> = log.lines().filter(|l| l.contains("cannot read the kernel log")).collect();
    assert_eq!(kmsg.len(), 1, "{log}");
    assert!(
        kmsg[0].contains(" WARN ") && kmsg[0].contains("NVML events"),
        "says what still works: {}",
        kmsg[0]
    );
    assert!(!log.contains("NVML Xid events unavailable"), "events work here:\n{log}");
}
