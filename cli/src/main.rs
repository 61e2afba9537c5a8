//! `spank-gpu`: the user's side of the plugin.
//!
//! ```text
//! spank-gpu explain [--env FILE] [--json] [--args "WORD ..."] [-- COMMAND ...]
//! spank-gpu why JOBID [--json]
//! spank-gpu autopsy JOBID [--json] [--log FILE]
//! spank-gpu usage JOBID [--json]
//! spank-gpu lint [--json] [--no-cluster] [--release X.Y] [--] [SBATCH OPTIONS] SCRIPT|-
//! ```
//! `why` says why a job is still pending and what resolves it; `autopsy` says
//! why an ended job died; `usage` whether a job uses (or used) its GPUs;
//! `lint` finds a batch script's traps before it is submitted (see
//! `docs/users.md`). All four only read from Slurm (`usage` of a running job
//! runs `cat` on its nodes through `srun --overlap`).
//!
//! Run inside a job step (`srun spank-gpu explain`), or given a file of the
//! task's `KEY=VALUE` lines, it prints what `--auto-rdzv` sets for that task and
//! why, computed by the same code the plugin runs. The admin's plugstack
//! arguments are read from `plugstack.conf` (next to `$SLURM_CONF`, else
//! `/etc/slurm`), or given with `--args`. The step's command line (whose
//! launcher flags beat the launchers' variables) is explain's own, as the
//! plugin sees it in that step, or the `COMMAND` given after `--`.
//!
//! The command line is clap's (`Cli`); a usage error exits 2 with a line
//! naming the word (the `cli-usage` crate, shared with `gpu-node-agent`), a command's own failure 1 (lint: 1 is
//! findings, 2 an unreadable script). clap is this binary's alone: the
//! plugin's cdylib does not link it.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{self, Binding, SlurmTask};
use task_plan::devices::{self, Access, DeviceView};
use task_plan::gputable::{self, GpuTable};
use task_plan::netif;
use task_plan::nodeaddr::{self, MasterAddr};
use task_plan::plugstack::{PluginConfig, StackEvent, StackFiles, StackLine, walk_stack};
use task_plan::rdzv;

mod gpu_use;
mod jobs;
mod limits;
mod lint;
mod slurm_cmd;
use cli_usage as usage;
use spank_gpu_cli::explain;

const SYNOPSIS: &str = "spank-gpu explain [--env FILE] [--json] [--args \"WORD ...\"] [-- COMMAND ...]
       spank-gpu why JOBID [--json]
       spank-gpu autopsy JOBID [--json] [--log FILE]
       spank-gpu usage JOBID [--json]
       spank-gpu lint [--json] [--no-cluster] [--release X.Y] [--] [SBATCH OPTIONS] SCRIPT|-";

const AFTER_HELP: &str = "\
why, autopsy, usage and lint only read from Slurm. `spank-gpu COMMAND --help` describes each command.

Exit status: 0 done (lint: no finding); 1 explain, why, autopsy, usage: failed, lint: findings;
2 a usage error (an unknown command, option or word), lint: the script could not be read.
With --json, a usage error is also one JSON object on stdout: {error, tip, usage, exit}.";

/// The user's side of the spank-gpu Slurm plugin (docs/users.md)
#[derive(Parser, Debug)]
#[command(
    name = "spank-gpu",
    version,
    override_usage = SYNOPSIS,
    after_help = AFTER_HELP,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Explain(ExplainArgs),
    Why(WhyArgs),
    Autopsy(AutopsyArgs),
    Usage(UsageArgs),
    Lint(lint::LintArgs),
}

/// What spank-gpu's --auto-rdzv sets for this task and why
///
/// Run it inside a job step (srun spank-gpu explain), or pass --env with a file of
/// KEY=VALUE lines (for example the output of `env` from a task); after --, the
/// step's command (torchrun ..., accelerate launch ...), whose flags the plugin reads.
///
/// Exit status: 0 explained, 1 failed, 2 a usage error.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "spank-gpu explain [--env FILE] [--json] [--args \"WORD ...\"] [-- COMMAND ...]",
    verbatim_doc_comment
)]
struct ExplainArgs {
    /// The task's KEY=VALUE lines (`env` run in the task), instead of this process's environment
    #[arg(long, value_name = "FILE")]
    env: Option<PathBuf>,
    /// One JSON object
    #[arg(long)]
    json: bool,
    /// The plugstack words, instead of those of plugstack.conf's spank_gpu.so line
    #[arg(long = "args", value_name = "WORD ...", allow_hyphen_values = true)]
    plugstack_words: Option<String>,
    /// After --: the step's command line, whose launcher flags the plugin reads (default: explain's own)
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Why a job is still PENDING, and what resolves it
///
/// Exit status: 0 answered, 1 failed (the job not found, Slurm not answering), 2 a usage error.
#[derive(clap::Args, Debug)]
#[command(override_usage = "spank-gpu why JOBID [--json]", verbatim_doc_comment)]
struct WhyArgs {
    /// The job (4242, or an array task: 4242_7)
    #[arg(value_name = "JOBID")]
    job: String,
    /// One JSON object (its keys: docs/users.md)
    #[arg(long)]
    json: bool,
}

/// Why an ended job died, and what to do next
///
/// Exit status: 0 answered, 1 failed (the job not found in accounting, slurmdbd not
/// answering), 2 a usage error.
#[derive(clap::Args, Debug)]
#[command(override_usage = "spank-gpu autopsy JOBID [--json] [--log FILE]", verbatim_doc_comment)]
struct AutopsyArgs {
    /// The job (4242, or an array task: 4242_7)
    #[arg(value_name = "JOBID")]
    job: String,
    /// One JSON object (its keys: docs/users.md)
    #[arg(long)]
    json: bool,
    /// The job's output file, when sacct cannot name it
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

/// Whether a job uses (or used) its GPUs, per node and GPU, and what to fix
///
/// A running job: read live on its nodes (srun --overlap, one task per node). An ended
/// job: the summaries its nodes' agents wrote into its AdminComment.
///
/// Exit status: 0 answered (findings included), 1 failed (the job not found, Slurm not
/// answering), 2 a usage error.
#[derive(clap::Args, Debug)]
#[command(override_usage = "spank-gpu usage JOBID [--json]", verbatim_doc_comment)]
struct UsageArgs {
    /// The job (4242, or an array task: 4242_7)
    #[arg(value_name = "JOBID")]
    job: String,
    /// One JSON object (its keys: docs/users.md)
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => return usage::exit(&Cli::command(), &argv, &e),
    };
    let failed = |e: String, code: u8| {
        // The error may quote a job's text or a Slurm command's output.
        eprintln!("spank-gpu: {}", slurm_formats::text::printable(&e));
        ExitCode::from(code)
    };
    match cli.command {
        Cmd::Lint(args) => match lint::lint(args) {
            Ok(lint::Outcome::Clean) => ExitCode::SUCCESS,
            Ok(lint::Outcome::Findings) => ExitCode::from(1),
            Err(lint::Failure::Script(e)) => failed(e, usage::USAGE),
            Err(lint::Failure::Usage(e)) => {
                let mut cmd = Cli::command();
                let e = match cmd.find_subcommand_mut("lint") {
                    Some(sub) => sub.error(clap::error::ErrorKind::MissingRequiredArgument, e),
                    None => cmd.error(clap::error::ErrorKind::MissingRequiredArgument, e),
                };
                usage::exit(&Cli::command(), &argv, &e)
            }
        },
        Cmd::Why(a) => jobs::why(&a.job, a.json).map_or_else(|e| failed(e, 1), |()| ExitCode::SUCCESS),
        Cmd::Autopsy(a) => jobs::autopsy(&a.job, a.json, a.log.as_deref())
            .map_or_else(|e| failed(e, 1), |()| ExitCode::SUCCESS),
        Cmd::Usage(a) => jobs::usage(&a.job, a.json).map_or_else(|e| failed(e, 1), |()| ExitCode::SUCCESS),
        Cmd::Explain(a) => run(a).map_or_else(|e| failed(e, 1), |()| ExitCode::SUCCESS),
    }
}

/// `KEY=VALUE` lines; blank lines and `#` comments are skipped.
fn read_env_file(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut env = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("{}:{}: expected KEY=VALUE", path.display(), n + 1))?;
        env.insert(k.trim_start_matches("export ").trim().to_owned(), v.to_owned());
    }
    Ok(env)
}

/// The words after `spank_gpu.so` on the plugstack line, following `include`s.
fn plugstack_words() -> Option<Vec<String>> {
    let dir = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("/etc/slurm"));
    find_plugin_line(&dir.join("plugstack.conf"))
}

/// The plugstack files as the user reads them.
struct UserFiles;

impl StackFiles for UserFiles {
    fn read(&mut self, path: &Path) -> std::io::Result<String> {
        fs::read(path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }

    fn names(&mut self, dir: &Path) -> std::io::Result<Vec<String>> {
        Ok(fs::read_dir(dir)?.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
    }

    fn exists(&mut self, path: &Path) -> bool {
        path.exists()
    }
}

/// The first spank_gpu line of the plugstack file `path` and its includes
/// (`walk_stack`, as Slurm reads them): its words after the plugin's path.
fn find_plugin_line(path: &Path) -> Option<Vec<String>> {
    let mut found = None;
    walk_stack(path, &mut UserFiles, &mut |event| match event {
        StackEvent::Plugin { entry, .. } if entry.is_spank_gpu() => {
            if let StackLine::Plugin { args, .. } = entry {
                found = Some(args);
            }
            false
        }
        _ => true,
    });
    found
}

fn num(env: &BTreeMap<String, String>, key: &str) -> Option<u32> {
    env.get(key).and_then(|v| v.trim().parse().ok())
}

/// The task's CPU mask: `# cpus_allowed=LIST` in an `--env` file, else this
/// process's own (run inside the task, it has the task's).
fn own_cpus(env_file: Option<&Path>) -> Option<CpuSet> {
    let text = match env_file {
        Some(path) => fs::read_to_string(path).ok()?,
        None => fs::read_to_string("/proc/self/status").ok()?,
    };
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix("# cpus_allowed=").or_else(|| l.strip_prefix("Cpus_allowed_list:")))?;
    CpuSet::parse(value.trim()).ok()
}

/// The task's GPUs as its device cgroup shows them, like the plugin's probe
/// ([`task_plan::devices`]): from `# gpus_openable=MINORS` in an `--env` file
/// (what `slurm-lab record-env` writes), else by opening each GPU's device
/// file from inside the task (a refusal with EPERM is the device cgroup's).
fn probed_devices(cfg: &PluginConfig, table: &GpuTable, env_file: Option<&Path>) -> DeviceView {
    let recorded: Option<Vec<u32>> = match env_file {
        Some(path) => {
            let text = fs::read_to_string(path).unwrap_or_default();
            text.lines()
                .find_map(|l| l.strip_prefix("# gpus_openable="))
                .map(|list| list.split(',').filter_map(|m| m.trim().parse().ok()).collect())
        }
        None => None,
    };
    if env_file.is_some() && recorded.is_none() {
        return DeviceView::Unknown;
    }
    let probes: Vec<(u32, Access)> = table
        .gpus
        .iter()
        .map(|g| {
            let access = match (g.minor, &recorded) {
                (None, _) => Access::Unknown,
                (Some(m), Some(open)) => {
                    if open.contains(&m) {
                        Access::Allowed
                    } else {
                        Access::Denied
                    }
                }
                (Some(m), None) => {
                    let opened = fs::File::open(devices::device_path(cfg.dev_dir(), m));
                    Access::from_errno(opened.err().map(|e| e.raw_os_error().unwrap_or(-1)), true)
                }
            };
            (g.slurm_index, access)
        })
        .collect();
    devices::view(&probes)
}

/// What `--gpu-affinity` decides for this task, from the node's GPU table
/// like the plugin (or why it decides nothing), and whether the table is an
/// older agent's, without machine records (the plan is then degraded).
fn binding_decision(
    cfg: &PluginConfig,
    env: &BTreeMap<String, String>,
    own: Option<&CpuSet>,
    local_tasks: u32,
    env_file: Option<&Path>,
) -> Result<(Vec<u32>, Binding, bool), String> {
    let dir = cfg.topology_dir.trim_end_matches('/');
    let read =
        |name: &str| fs::read_to_string(format!("{dir}/{name}")).map_err(|e| format!("{dir}/{name}: {e}"));
    let table = GpuTable::parse(&read(gputable::TABLE_FILE)?).map_err(|e| e.to_string())?;
    let (topology, degraded) = table.topology();
    let own =
        own.cloned().ok_or("the task's CPU mask is unknown (add '# cpus_allowed=LIST' to the --env file)")?;
    let lookup = |name: &str| env.get(name).cloned();
    let task = SlurmTask {
        local_id: num(env, "SLURM_LOCALID").unwrap_or(0),
        local_tasks,
        step_gpus: None,
        env: &lookup,
        own,
        slurm_version: slurm_sys::VERSION_NUMBER,
        devices: probed_devices(cfg, &table, env_file),
    };
    // Under ConstrainDevices with --gpus-per-task, slurmstepd tells every
    // task the step's first GPU; where the device cgroup cannot be read (an
    // --env file without '# gpus_openable='), the variables do not say which.
    let told_first = task.devices == DeviceView::Unknown
        && env.get("SLURMD_TRES_BIND").is_some_and(|b| b.contains("per_task:"))
        && task.local_id > 0
        && env.get("CUDA_VISIBLE_DEVICES").is_some_and(|c| c.split(',').next() == Some("0"))
        && env.get("SLURM_STEP_GPUS") == env.get("CUDA_VISIBLE_DEVICES");
    if told_first {
        return Err("slurmstepd told this task the step's first GPU, as it does for every task under \
             ConstrainDevices with --gpus-per-task; run explain inside the task (or add \
             '# gpus_openable=MINORS' to the --env file) so that its device cgroup says which GPU it has"
            .into());
    }
    let (share, binding) = binding::plan_slurm_task(&topology, &table, &task)?;
    Ok((share.gpus(), binding, degraded))
}

/// A file read as the plugin reads it: root's, not writable by others, no
/// link, capped (`None`: missing; `Err`: anything else).
fn trusted_text(path: &str, max: usize) -> Result<Option<String>, String> {
    match slurm_formats::trusted::read_trusted(Path::new(path), max, &[0]) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The network of the node explain runs on, as the plugin's `user_init`
/// reads it there: the live interfaces, what the plugin may set for NCCL
/// and gloo (with the plugstack line), `/etc/nccl.conf`, the host name and
/// what `/etc/hosts` gives it.
fn node_net(cfg: &PluginConfig) -> netif::NodeNet {
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    let node = hostname.as_deref().map_or("this node", |h| h.split('.').next().unwrap_or(h)).to_owned();
    let ifaces = node_info::getifaddrs()
        .map(|entries| {
            netif::group(
                entries.into_iter().map(|e| netif::Entry::from_flags(e.name, e.flags, e.addr, e.prefix)),
            )
        })
        .map_err(|e| format!("getifaddrs: {e}"));
    let offers = match &ifaces {
        Ok(i) => netif::node_offers(&cfg.nccl_socket_net, &cfg.env_defaults, i, &node),
        Err(e) => netif::unreadable(&cfg.nccl_socket_net, &cfg.env_defaults, e, &node),
    };
    let site_conf = trusted_text(netif::SITE_CONF, netif::MAX_CONF)
        .map(|text| text.and_then(|t| netif::conf_value(&t, netif::NCCL_VAR)));
    let hosts = match &hostname {
        Some(h) => trusted_text(netif::HOSTS_FILE, netif::MAX_HOSTS)
            .map(|text| text.map(|t| netif::hosts_addrs(&t, h)).unwrap_or_default()),
        None => Ok(Vec::new()),
    };
    netif::NodeNet { node, ifaces, offers, site_conf, hostname, hosts }
}

/// `~/.nccl.conf`'s `NCCL_SOCKET_IFNAME`, from this user's passwd home as NCCL
/// finds it (`getpwuid(getuid())`, not `$HOME`); explain is the user's own process.
fn user_conf() -> netif::ConfRead {
    use std::io::Read as _;
    let Ok(home) = node_info::home_of(rustix::process::getuid().as_raw()) else { return Ok(None) };
    let path = format!("{}/{}", home.trim_end_matches('/'), netif::USER_CONF);
    let mut text = String::new();
    match fs::File::open(&path) {
        Ok(f) => {
            let cap = u64::try_from(netif::MAX_CONF).unwrap_or(u64::MAX);
            f.take(cap).read_to_string(&mut text).map_err(|e| format!("{path}: {e}"))?;
            Ok(netif::conf_value(&text, netif::NCCL_VAR))
        }
        Err(_) => Ok(None),
    }
}

/// The name `master_addr=` asks for of the step's `MASTER_ADDR` node, found
/// as the plugin finds it ([`nodeaddr::find`]), in the slurm.conf this user
/// reads (`slurm_conf=`, else `$SLURM_CONF`, else the default); `Err` inside:
/// the line the plugin logs when it cannot.
fn first_node_name(
    cfg: &PluginConfig,
    env: &BTreeMap<String, String>,
    step: &rdzv::Step,
) -> Result<Result<String, String>, String> {
    let first = step.master_name().map_err(|e| e.to_string())?;
    let own_conf = std::env::var("SLURM_CONF").ok();
    let path = nodeaddr::slurm_conf_path(cfg.slurm_conf.as_deref(), own_conf.as_deref());
    let aliases = env.get("SLURM_NODE_ALIASES").map(String::as_str);
    let mut read = |file: &str| {
        let bytes = fs::read(file).map_err(|e| std::io::Error::new(e.kind(), format!("{file}: {e}")))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    Ok(nodeaddr::find(cfg.master_addr, &first, &path, aliases, slurm_sys::VERSION_NUMBER, &mut read))
}

fn run(args: ExplainArgs) -> Result<(), String> {
    let plugstack_words = args.plugstack_words.map(|w| w.split_whitespace().map(str::to_owned).collect());
    // The step's command line: after `--`, else explain's own.
    let argv = if args.command.is_empty() { std::env::args().collect() } else { args.command };
    let env: BTreeMap<String, String> = match &args.env {
        Some(path) => read_env_file(path)?,
        None => std::env::vars().collect(),
    };
    let words = plugstack_words.or_else(self::plugstack_words).unwrap_or_default();
    // Debug builds read the test-only keys as the plugin of the same build does.
    let cfg = PluginConfig::parse(&words, cfg!(debug_assertions)).map_err(|e| e.to_string())?;
    let own = own_cpus(args.env.as_deref());
    let step = {
        let lookup = |name: &str| env.get(name).cloned();
        rdzv::Step::from_env(&lookup, &rdzv::Items::default()).map_err(|e| e.to_string())?
    };
    let affinity = binding_decision(&cfg, &env, own.as_ref(), step.local_tasks, args.env.as_deref());
    let master_addr =
        (cfg.master_addr != MasterAddr::NodeName).then(|| first_node_name(&cfg, &env, &step)).transpose()?;
    let inputs = explain::Inputs {
        net: node_net(&cfg),
        user_conf: user_conf(),
        env,
        cfg,
        argv,
        own,
        affinity,
        master_addr,
        slurm_version: slurm_sys::VERSION_NUMBER,
    };
    let explained = explain::explain(&inputs)?;
    if args.json {
        println!("{}", serde_json::to_string(&explained).map_err(|e| e.to_string())?);
    } else {
        for line in explained.lines() {
            println!("{line}");
        }
    }
    Ok(())
}
