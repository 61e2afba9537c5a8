//! `gpu-node-agent`: the command line. The agent itself is the library
//! (`src/lib.rs`).

#![forbid(unsafe_code)]

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

use gpu_core::pci::PciAddr;
use gpu_core::xid::{self, Event};

use gpu_node_agent::agent::{self, Agent, Verdict};
use gpu_node_agent::config::{self, Config};
use gpu_node_agent::daemon::{self, log_report, write_metrics};
use gpu_node_agent::state::LoadError;
use gpu_node_agent::{checks, kmsg, topo};

const USAGE: &str = "\
usage: gpu-node-agent [--config FILE] COMMAND

commands:
  run                 the daemon: watch NVML events, the kernel log and the GPU counters;
                      drain and resume the node in Slurm by the rules in the README
  check [--act]       one pass; exit 0 healthy, 1 needs draining, 2 cannot tell.
                      Without --act it changes nothing; with --act it drains/resumes
                      like the daemon (usable as Slurm's HealthCheckProgram), taking
                      turns with the daemon through a lock in state_dir
  status              a per-GPU table and the agent's view of the node, and whether the
                      spank-gpu plugin fits the node's Slurm release; changes nothing
  clear [--gpu N]     after a GPU reset (nvidia-smi -r): the Xids seen so far (on GPU N,
                      or every GPU) never count again, so the agent's drain can be
                      resumed without a reboot; new Xids still count
  scan-log [FILE|-]   read kernel-log text (kmsg, dmesg, dmesg -T, syslog, journalctl)
                      and print one JSON line per Xid with the policy's action
  topology [--xml FILE] [--json] [--write]
                      the node's GPU table (Slurm index, minor, bus id, UUID, NUMA
                      nodes, local CPUs) from hwloc + NVML + `slurmd -G`; --write
                      stores it with the hwloc XML in topology_dir for the plugin;
                      with --xml and no NVML it works from the XML alone
  --version, --help

The configuration is /etc/gpu-node-agent/config.toml unless --config is given
(every key has a default; see the packaged config.toml).";

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut config_path: Option<PathBuf> = None;
    if let Some(i) = args.iter().position(|a| a == "--config") {
        args.remove(i);
        if i >= args.len() {
            eprintln!("gpu-node-agent: --config needs a file");
            return ExitCode::from(2);
        }
        config_path = Some(PathBuf::from(args.remove(i)));
    }
    let command = args.first().cloned().unwrap_or_default();
    let rest: Vec<String> = args.iter().skip(1).cloned().collect();
    match command.as_str() {
        "--version" | "-V" => {
            println!("gpu-node-agent {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        "" | "--help" | "-h" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    gpu_node_agent::logging::init();
    let explicit = config_path.is_some();
    let path = config_path.unwrap_or_else(|| PathBuf::from(config::DEFAULT_PATH));
    let cfg = match Config::load(&path, explicit) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("gpu-node-agent: bad configuration: {e}");
            return ExitCode::from(2);
        }
    };
    match command.as_str() {
        "run" => run(cfg),
        "check" => check(cfg, rest.iter().any(|a| a == "--act")),
        "status" => status(cfg),
        "clear" => clear(cfg, &rest),
        "scan-log" => scan_log(&cfg, rest.first().map(String::as_str)),
        "topology" => topology(&cfg, &rest),
        other => {
            eprintln!("gpu-node-agent: unknown command '{other}'\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn exit_code(v: Verdict) -> ExitCode {
    ExitCode::from(v as u8)
}

/// Reads the kernel log from its start, once.
fn replay_kmsg(agent: &mut Agent) {
    let Some(path) = agent.cfg.kmsg_path.clone() else { return };
    let mut reader = kmsg::KmsgReader::new(&path);
    match reader.poll() {
        Ok(events) => {
            for e in &events {
                agent.record_kmsg(e);
            }
        }
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot read the kernel log"),
    }
}

/// The one-line error for a state file of another version, when that is
/// the problem; such a file stops every command that would write.
fn format_error(agent: &Agent) -> Option<String> {
    match agent.load_error() {
        Some(e @ LoadError::Format(_)) => Some(format!("gpu-node-agent: {e}")),
        _ => None,
    }
}

fn check(cfg: Config, act: bool) -> ExitCode {
    let mut agent = Agent::new(cfg);
    if act {
        if let Some(e) = format_error(&agent) {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    replay_kmsg(&mut agent);
    let report = agent.pass(act);
    log_report(&report);
    if act {
        write_metrics(&agent, &report);
    }
    for f in &report.faults {
        println!("fault: {f}");
    }
    for p in &report.problems {
        println!("problem: {p}");
    }
    println!(
        "{}: {}",
        agent.node_name,
        match report.verdict {
            Verdict::Healthy => "healthy",
            Verdict::Unhealthy => "unhealthy",
            Verdict::Unknown => "cannot tell",
        }
    );
    exit_code(report.verdict)
}

fn clear(cfg: Config, args: &[String]) -> ExitCode {
    let gpu = match args {
        [] => None,
        [flag, n] if flag == "--gpu" => match n.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                eprintln!(
                    "gpu-node-agent: clear: --gpu needs a GPU number (NVML's index, as in status), not '{n}'"
                );
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("gpu-node-agent: clear: usage: gpu-node-agent clear [--gpu N]");
            return ExitCode::from(2);
        }
    };
    let mut agent = Agent::new(cfg);
    replay_kmsg(&mut agent);
    match agent.clear(gpu) {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpu-node-agent: clear: {e}");
            ExitCode::from(1)
        }
    }
}

fn status(cfg: Config) -> ExitCode {
    let mut agent = Agent::new(cfg);
    replay_kmsg(&mut agent);
    let mut report = agent.pass(false);
    if report.node.is_none() && !report.problems.iter().any(|p| p.starts_with("Slurm:")) {
        // The pass asked Slurm nothing: ask for the node, to show it.
        let slurm = gpu_node_agent::slurm::Slurm {
            scontrol: agent.cfg.scontrol.clone(),
            timeout: agent.cfg.scontrol_timeout,
        };
        report.node = slurm.node(&agent.node_name).ok().flatten();
    }
    let mut out = String::new();
    let verdict = match report.verdict {
        Verdict::Healthy => "healthy".to_owned(),
        Verdict::Unhealthy => "UNHEALTHY".to_owned(),
        Verdict::Unknown => "CANNOT TELL".to_owned(),
    };
    out.push_str(&format!("node {}: {verdict}\n", agent.node_name));
    for p in &report.problems {
        out.push_str(&format!("  agent problem: {p}\n"));
    }
    if !report.samples.is_empty() {
        out.push_str("GPU  BUS ID            UUID                                      ECC-DBE  REMAP c/u/pend/fail  STATE\n");
    }
    for s in &report.samples {
        let faults: Vec<String> = report
            .faults
            .iter()
            .filter(|f| f.gpu == Some(s.index))
            .map(|f| format!("{} ({})", f.class.name(), f.action))
            .collect();
        let state = match s.hang {
            Some(h) => format!("NVML HUNG {} s ({} polls)", h.secs, h.polls),
            None if faults.is_empty() => "ok".to_owned(),
            None => faults.join(", "),
        };
        let remap = s.remap.map_or("-".to_owned(), |r| {
            format!("{}/{}/{}/{}", r.correctable, r.uncorrectable, yes_no(r.pending), yes_no(r.failure))
        });
        out.push_str(&format!(
            "{:<4} {:<17} {:<41} {:<8} {:<20} {state}\n",
            s.index,
            s.bus_id.map_or_else(|| "-".to_owned(), PciAddr::nvml),
            s.uuid.as_deref().unwrap_or(if s.lost { "(lost)" } else { "-" }),
            s.ecc_uncorrectable.map_or("-".to_owned(), |n| n.to_string()),
            remap,
        ));
    }
    if !report.samples.is_empty() {
        out.push_str(&checks_table(&report.samples, &agent.state.history));
    }
    for f in report.faults.iter().filter(|f| f.gpu.is_none()) {
        out.push_str(&format!("node fault: {f}\n"));
    }
    match &report.node {
        Some(n) => out.push_str(&format!(
            "Slurm: {} {}{}\n",
            n.name,
            n.state,
            n.reason.as_ref().map(|r| format!(", reason \"{r}\"")).unwrap_or_default()
        )),
        None => out.push_str("Slurm: not answering\n"),
    }
    match &agent.state.drain {
        Some(d) => out.push_str(&format!(
            "drained by this agent: \"{}\" ({}; {} clean checks since{})\n",
            d.reason,
            d.action,
            agent.state.clean_checks,
            if d.needs_reboot { "; resumes only after a reboot" } else { "" }
        )),
        None => out.push_str("drained by this agent: no\n"),
    }
    if let Some(p) = &agent.state.pending {
        out.push_str(&format!("drain pending: {p}\n"));
    }
    if let Some(p) = &agent.state.suppressed {
        out.push_str(&format!("drain held back by the fleet guard: {p}\n"));
    }
    out.push_str(&gpu_node_agent::release::status_text(&gpu_node_agent::release::check(&agent.cfg)));
    for c in &agent.state.clears {
        let who = c.by.clone().unwrap_or_else(|| format!("by uid {}", c.uid));
        out.push_str(&format!(
            "cleared {who} at {}: {} ({} Xids before it no longer count)\n",
            agent::utc(c.at),
            c.gpu.map_or_else(|| "every GPU".to_owned(), |g| format!("GPU {g}")),
            c.xids
        ));
    }
    out.push_str(&xid_lines(&agent.state));
    if let Some(l) = &agent.state.lost {
        let then = if l.history_lost {
            "its history is LOST: Xids from before are not acted on; no reboot until the next boot or `gpu-node-agent clear`"
        } else {
            "written again from the agent's memory"
        };
        out.push_str(&format!(
            "state file corrupt at {} ({}); kept as {}; {then}\n",
            agent::utc(l.at),
            l.error,
            l.kept_as
        ));
    }
    if let Some(n) = report.node.as_ref().filter(|n| n.has_gpus()) {
        let configured = n.gres_gpus.unwrap_or(0) + n.gres_mig;
        match topo::slurm_gpu_minors(&agent.cfg.slurmd) {
            Ok(m) if !m.is_empty() => {
                out.push_str(&format!("GPU table order: Slurm's (`slurmd -G -v` lists {} GPU device files)\n", m.len()));
            }
            Ok(_) => out.push_str(&format!(
                "GPU table order: UNKNOWN: `slurmd -G -v` printed no GPU line, but Slurm configures {configured} GPU(s) here; the table is not written\n"
            )),
            Err(e) => out.push_str(&format!("GPU table order: UNKNOWN: {e}\n")),
        }
    }
    for (fault, n) in &agent.state.reboots {
        out.push_str(&format!("reboots requested for {fault}: {n} (then a drain, after max_reboots)\n"));
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    exit_code(report.verdict)
}

/// This boot's Xids in `status`: the records that count, and the ignored ones' counts.
fn xid_lines(state: &gpu_node_agent::state::State) -> String {
    let mut out = String::new();
    for r in state.xids.records().iter().filter(|r| r.counts()) {
        let gpu = r.gpu.map(|g| format!("gpu{g}")).or_else(|| r.bus.map(PciAddr::kernel)).unwrap_or_default();
        out.push_str(&format!(
            "xid{} {gpu}: {} time(s) ({} cleared), last at {}{}\n",
            r.xid,
            r.count,
            r.cleared,
            agent::utc(r.last_at),
            r.fatal.as_deref().map(|f| format!("; {f}")).unwrap_or_default()
        ));
    }
    if !state.xids.ignored.is_empty() {
        let counts: Vec<String> = state.xids.ignored.iter().map(|(x, n)| format!("xid{x} {n}")).collect();
        out.push_str(&format!("ignored Xids this boot (only counted): {}\n", counts.join(", ")));
    }
    out
}

/// The PCIe/NVLink/fabric/clock/mode checks, one row per GPU.
fn checks_table(samples: &[gpu_node_agent::health::GpuSample], history: &checks::History) -> String {
    let mut out = String::from(
        "GPU  PCIE            NVLINK     FABRIC        CLOCKS                       ECC-MODE  PERSISTENCE\n",
    );
    for s in samples.iter().filter(|s| !s.lost && s.open_error.is_none() && !s.reset_required) {
        let [pcie, nvlink, fabric, clocks, ecc, persistence] = checks::cells(s, history);
        out.push_str(&format!(
            "{:<4} {pcie:<15} {nvlink:<10} {fabric:<13} {clocks:<28} {ecc:<9} {persistence}\n",
            s.index
        ));
    }
    out.push_str("  n/s: not supported on this GPU, not checked\n");
    out
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn json(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn opt_json<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_owned(), |x| x.to_string())
}

fn scan_log(cfg: &Config, source: Option<&str>) -> ExitCode {
    let input: Box<dyn BufRead> = match source {
        None | Some("-") => Box::new(std::io::stdin().lock()),
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("gpu-node-agent: {path}: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut out = std::io::stdout().lock();
    let mut scanner = xid::Scanner::new();
    for line in input.split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line);
        for event in scanner.push(line.trim_end()) {
            let row = match &event {
                Event::Xid(r) => format!(
                    "{{\"time\":{},\"pci\":{},\"xid\":{},\"pid\":{},\"process\":{},\"message\":{},\"action\":\"{}\",\"meaning\":{}}}",
                    r.time.as_deref().map_or("null".to_owned(), json),
                    json(&r.pci_bus_id.to_string()),
                    r.xid,
                    opt_json(r.pid),
                    r.process.as_deref().map_or("null".to_owned(), json),
                    json(&r.message),
                    cfg.policy.xid_action(r.xid),
                    json(xid::describe(r.xid)),
                ),
                Event::Lost(l) => format!(
                    "{{\"time\":{},\"pci\":{},\"xid\":null,\"event\":\"gpu-lost\",\"message\":{},\"action\":\"{}\",\"meaning\":{}}}",
                    l.time.as_deref().map_or("null".to_owned(), json),
                    json(&l.pci_bus_id.to_string()),
                    json(&l.message),
                    cfg.policy.gpu_lost,
                    json(xid::describe(xid::LOST_WITHOUT_XID)),
                ),
            };
            if writeln!(out, "{row}").is_err() {
                return ExitCode::SUCCESS;
            }
        }
    }
    ExitCode::SUCCESS
}

fn topology(cfg: &Config, args: &[String]) -> ExitCode {
    let mut xml = None;
    let (mut json, mut write) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--write" => write = true,
            "--xml" => match it.next() {
                Some(f) => xml = Some(PathBuf::from(f)),
                None => {
                    eprintln!("gpu-node-agent: --xml needs a file");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!("gpu-node-agent: topology: unknown argument '{other}'");
                return ExitCode::from(2);
            }
        }
    }
    // Under a deadline: NVML or hwloc can hang.
    let (tx, rx) = mpsc::channel();
    let (thread_cfg, thread_xml) = (cfg.clone(), xml.clone());
    let spawned = std::thread::Builder::new()
        .name("topology".to_owned())
        .spawn(move || tx.send(topo::make(&thread_cfg, thread_xml.as_deref(), write)));
    let deadline = topo::deadline(cfg);
    let made = match spawned {
        Ok(_) => rx
            .recv_timeout(deadline)
            .unwrap_or_else(|_| Err(format!("no answer within {deadline:?} (NVML or hwloc hanging?)"))),
        Err(e) => Err(format!("cannot start the topology thread: {e}")),
    };
    match made {
        Ok((table, notes)) => {
            for n in notes {
                eprintln!("gpu-node-agent: note: {n}");
            }
            if json {
                println!("{}", topo::to_json(&table));
            } else {
                print!("{}", table.to_text());
            }
            if write {
                eprintln!("gpu-node-agent: wrote {}", cfg.topology_dir.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpu-node-agent: topology: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(cfg: Config) -> ExitCode {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            tracing::error!(error = %e, "cannot handle signals");
        }
    }
    match daemon::run(cfg, &stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-node-agent: {e}");
            ExitCode::from(2)
        }
    }
}
