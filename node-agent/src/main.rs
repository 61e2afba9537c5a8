//! `gpu-node-agent`: the command line. The agent itself is the library
//! (`src/lib.rs`).

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

use clap::{CommandFactory, Parser, Subcommand};
use gpu_health::xid::{self, Event};
use slurm_formats::pci::PciAddr;

use gpu_node_agent::agent::{Agent, Verdict};
use gpu_node_agent::config::{self, Config};
use gpu_node_agent::daemon::{self, log_report, write_metrics};
use gpu_node_agent::store::LoadError;
use gpu_node_agent::{policy::checks, reports::topo, sources::kmsg, sources::network};

/// The exit statuses of every command (docs/admin.md, "Exit statuses").
/// `check` and `status` exit with the verdict ([`Verdict::exit_code`]: 0, 1
/// or 3) unless one of these comes first.
mod exit {
    /// A command that could not do its work (`clear` refused, `scan-log`'s
    /// file unreadable, `topology` failed, `run` could not start).
    pub const FAILED: u8 = 1;
    // 2, the command line (an unknown command, option or word, a bad value):
    // cli_usage::USAGE.
    /// The agent cannot tell (`check --act` with a state file it may not write).
    pub const CANNOT_TELL: u8 = 3;
    /// The configuration file: unreadable, invalid, or missing when named with --config.
    pub const BAD_CONFIG: u8 = 4;
}

const SYNOPSIS: &str = "gpu-node-agent [--config FILE] COMMAND [OPTIONS]";

const AFTER_HELP: &str = "\
Exit status: 0 done (check, status: healthy); 1 check, status: the node needs draining,
other commands: failed; 2 a usage error (an unknown command, option or word, a bad value);
3 check, status: the agent cannot tell (NVML missing or hanging); 4 bad configuration.

The configuration is /etc/gpu-node-agent/config.toml unless --config is given
(every key has a default; see the packaged config.toml). `gpu-node-agent COMMAND --help`
describes each command.";

/// Finds bad GPUs and drains the node in Slurm, safely.
#[derive(Parser, Debug)]
#[command(
    name = "gpu-node-agent",
    version,
    override_usage = SYNOPSIS,
    after_help = AFTER_HELP,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    /// The configuration file (default /etc/gpu-node-agent/config.toml); before or after the command
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The daemon: watches NVML events, the kernel log and the GPU counters
    ///
    /// Drains and resumes the node in Slurm by the rules in the README, and writes the
    /// GPU table at start. Exit status: 0 stopped by SIGTERM/SIGINT, 1 it could not run
    /// (a state file of another version), 2 usage error, 4 bad configuration.
    #[command(override_usage = "gpu-node-agent [--config FILE] run", verbatim_doc_comment)]
    Run,
    /// One pass; exit 0 healthy, 1 needs draining, 3 cannot tell
    ///
    /// Without --act it changes nothing; with --act it drains/resumes like the daemon
    /// (usable as Slurm's HealthCheckProgram), taking turns with the daemon through a lock
    /// in state_dir. Prints `fault: ...`, `problem: ...` and `NODE: healthy|unhealthy|cannot tell`.
    ///
    /// Exit status: 0 healthy; 1 unhealthy, the node needs draining; 2 usage error;
    /// 3 cannot tell (NVML missing or hanging; with --act also a state file of another
    /// version); 4 bad configuration.
    #[command(override_usage = "gpu-node-agent [--config FILE] check [--act]", verbatim_doc_comment)]
    Check {
        /// Drain or resume the node in Slurm as the daemon would, and save the state
        #[arg(long)]
        act: bool,
    },
    /// A per-GPU table and the agent's view of the node; changes nothing
    ///
    /// Also whether the spank-gpu plugin fits the node's Slurm release, and the node's
    /// network interfaces (with the plugstack line's nccl_socket_net and NCCL's own choice).
    /// Exit status as for check: 0 healthy, 1 unhealthy, 2 usage error, 3 cannot tell,
    /// 4 bad configuration.
    #[command(override_usage = "gpu-node-agent [--config FILE] status", verbatim_doc_comment)]
    Status,
    /// After a GPU reset (nvidia-smi -r): the Xids seen so far never count again
    ///
    /// The Xids seen so far (on GPU N, or every GPU) never count again, so the agent's
    /// drain can be resumed without a reboot; new Xids still count. Exit status: 0 cleared,
    /// 1 refused (nothing changed), 2 usage error, 4 bad configuration.
    #[command(override_usage = "gpu-node-agent [--config FILE] clear [--gpu N]", verbatim_doc_comment)]
    Clear {
        /// Only the Xids of this GPU (NVML's index, as in status)
        #[arg(long, value_name = "N", value_parser = gpu_number)]
        gpu: Option<u32>,
    },
    /// Kernel-log text in, one JSON line per Xid with the policy's action out
    ///
    /// Reads kmsg, dmesg, dmesg -T, syslog or journalctl text from FILE, or from standard
    /// input without FILE or with -. Exit status: 0 read, 1 FILE unreadable, 2 usage error,
    /// 4 bad configuration.
    #[command(override_usage = "gpu-node-agent [--config FILE] scan-log [FILE|-]", verbatim_doc_comment)]
    ScanLog {
        /// The kernel-log text; - or none: standard input
        #[arg(value_name = "FILE|-")]
        file: Option<String>,
    },
    /// Slurm's Epilog: fails only when the running agent finds the node unhealthy
    ///
    /// Asks the running daemon (its socket in run_dir) for one health pass now; the
    /// daemon drains with its own reason first. Exit status: 1 the node is unhealthy
    /// (so Slurm fails the Epilog, and a job with an expedited requeue is requeued at
    /// once elsewhere); 0 in every other case: healthy, no daemon, no answer within
    /// --timeout, the agent cannot tell, even a bad configuration. One line on stderr.
    #[command(
        override_usage = "gpu-node-agent [--config FILE] epilog [--timeout DURATION]",
        verbatim_doc_comment
    )]
    Epilog {
        /// How long to wait for the daemon (default 10s)
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        timeout: Option<std::time::Duration>,
    },
    /// The node's GPU table from hwloc + NVML + `slurmd -G`
    ///
    /// Slurm index, minor, bus id, UUID, NUMA nodes, local CPUs and MIG devices, and the
    /// machine (NUMA nodes, cores). --write stores it in topology_dir for the plugin; with
    /// --xml and no NVML it works from the XML alone. Exit status: 0 made, 1 failed,
    /// 2 usage error, 4 bad configuration.
    #[command(
        override_usage = "gpu-node-agent [--config FILE] topology [--xml FILE] [--json] [--write]",
        verbatim_doc_comment
    )]
    Topology {
        /// Read the machine from this hwloc XML file instead of discovering it
        #[arg(long, value_name = "FILE")]
        xml: Option<PathBuf>,
        /// The table as JSON
        #[arg(long)]
        json: bool,
        /// Store the table in topology_dir
        #[arg(long)]
        write: bool,
    },
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    config::parse_duration(s)
}

fn gpu_number(s: &str) -> Result<u32, String> {
    s.parse().map_err(|_| "needs a GPU number (NVML's index, as in status)".to_owned())
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return cli_usage::exit(&Cli::command(), &args, &e),
    };
    gpu_node_agent::reports::logging::init();
    let explicit = cli.config.is_some();
    let path = cli.config.unwrap_or_else(|| PathBuf::from(config::DEFAULT_PATH));
    let cfg = match Config::load(&path, explicit) {
        Ok(cfg) => cfg,
        // The Epilog is never failed for the agent's own trouble.
        Err(e) if matches!(cli.command, Cmd::Epilog { .. }) => {
            eprintln!("gpu-node-agent epilog: bad configuration ({e}); Epilog not failed");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpu-node-agent: bad configuration: {e}");
            return ExitCode::from(exit::BAD_CONFIG);
        }
    };
    match cli.command {
        Cmd::Run => run(cfg),
        Cmd::Check { act } => check(cfg, act),
        Cmd::Status => status(cfg),
        Cmd::Clear { gpu } => clear(cfg, gpu),
        Cmd::ScanLog { file } => scan_log(&cfg, file.as_deref()),
        Cmd::Topology { xml, json, write } => topology(&cfg, xml, json, write),
        Cmd::Epilog { timeout } => {
            let job = std::env::var("SLURM_JOB_ID").ok().and_then(|j| j.trim().parse().ok());
            let (code, line) = gpu_node_agent::gate::ask(
                &cfg.run_dir,
                job,
                timeout.unwrap_or(gpu_node_agent::gate::DEFAULT_DEADLINE),
            );
            eprintln!("{line}");
            ExitCode::from(code)
        }
    }
}

fn exit_code(v: Verdict) -> ExitCode {
    ExitCode::from(v.exit_code())
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
            println!("{}: cannot tell", agent.node_name);
            return ExitCode::from(exit::CANNOT_TELL);
        }
    }
    replay_kmsg(&mut agent);
    let report = agent.pass(act);
    log_report(&report);
    if act {
        write_metrics(&agent, &report, None);
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

fn clear(cfg: Config, gpu: Option<u32>) -> ExitCode {
    let mut agent = Agent::new(cfg);
    replay_kmsg(&mut agent);
    match agent.clear(gpu) {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpu-node-agent: clear: {e}");
            ExitCode::from(exit::FAILED)
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
    let plugins = gpu_node_agent::slurm::release::check(&agent.cfg);
    out.push_str(&gpu_node_agent::slurm::release::status_text(&plugins));
    let fabric = network::Fabric::of(&plugins);
    out.push_str(&network::status_text(&network::gather(&network::System::default(), fabric)));
    for c in &agent.state.clears {
        let who = c.by.clone().unwrap_or_else(|| format!("by uid {}", c.uid));
        out.push_str(&format!(
            "cleared {who} at {}: {} ({} Xids before it no longer count)\n",
            gpu_node_agent::time::utc(c.at),
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
            gpu_node_agent::time::utc(l.at),
            l.error,
            l.kept_as
        ));
    }
    out.push_str(&format!("GPU table: {}\n", topo::table_status(&agent.cfg.topology_dir)));
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
fn xid_lines(state: &gpu_node_agent::store::State) -> String {
    let mut out = String::new();
    for r in state.xids.records().iter().filter(|r| r.counts()) {
        let gpu = r.gpu.map(|g| format!("gpu{g}")).or_else(|| r.bus.map(PciAddr::kernel)).unwrap_or_default();
        out.push_str(&format!(
            "xid{} {gpu}: {} time(s) ({} cleared), last at {}{}\n",
            r.xid,
            r.count,
            r.cleared,
            gpu_node_agent::time::utc(r.last_at),
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
fn checks_table(samples: &[gpu_node_agent::policy::health::GpuSample], history: &checks::History) -> String {
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

/// One line of `scan-log`'s output for an Xid (docs/admin.md, "Commands"):
/// the fields in this order, `null` where the log line has none.
#[derive(serde::Serialize)]
struct XidLine<'a> {
    time: Option<&'a str>,
    pci: String,
    xid: u32,
    pid: Option<u32>,
    process: Option<&'a str>,
    message: &'a str,
    action: String,
    meaning: &'a str,
}

/// One line of `scan-log`'s output for a GPU lost without an Xid number:
/// `xid` is `null`, `event` is `gpu-lost`.
#[derive(serde::Serialize)]
struct LostLine<'a> {
    time: Option<&'a str>,
    pci: String,
    xid: Option<u32>,
    event: &'static str,
    message: &'a str,
    action: String,
    meaning: &'static str,
}

fn scan_log(cfg: &Config, source: Option<&str>) -> ExitCode {
    let input: Box<dyn BufRead> = match source {
        None | Some("-") => Box::new(std::io::stdin().lock()),
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("gpu-node-agent: {path}: {e}");
                return ExitCode::from(exit::FAILED);
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
                Event::Xid(r) => serde_json::to_string(&XidLine {
                    time: r.time.as_deref(),
                    pci: r.pci_bus_id.to_string(),
                    xid: r.xid,
                    pid: r.pid,
                    process: r.process.as_deref(),
                    message: &r.message,
                    action: cfg.policy.xid_action(r.xid).to_string(),
                    meaning: xid::describe(r.xid),
                }),
                Event::Lost(l) => serde_json::to_string(&LostLine {
                    time: l.time.as_deref(),
                    pci: l.pci_bus_id.to_string(),
                    xid: None,
                    event: "gpu-lost",
                    message: &l.message,
                    action: cfg.policy.gpu_lost.to_string(),
                    meaning: xid::describe(xid::LOST_WITHOUT_XID),
                }),
            };
            // Serializing strings and numbers cannot fail; if it ever did, the
            // line is left out rather than printed half.
            let Ok(row) = row else { continue };
            if writeln!(out, "{row}").is_err() {
                return ExitCode::SUCCESS;
            }
        }
    }
    ExitCode::SUCCESS
}

fn topology(cfg: &Config, xml: Option<PathBuf>, json: bool, write: bool) -> ExitCode {
    // Under a deadline: NVML or hwloc can hang.
    let (tx, rx) = mpsc::channel();
    let (thread_cfg, thread_xml) = (cfg.clone(), xml.clone());
    let spawned = std::thread::Builder::new().name("topology".to_owned()).spawn(move || {
        // The receiver is gone past the deadline: nothing to tell then.
        let _ = tx.send(topo::make(&thread_cfg, thread_xml.as_deref(), write));
    });
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
            ExitCode::from(exit::FAILED)
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
            ExitCode::from(exit::FAILED)
        }
    }
}
