//! `spank-gpu lint`: the traps of a batch script, found before it costs
//! GPU-hours. Pure: the caller reads the script and asks the cluster (what to
//! ask is [`needs`]); [`check`] turns the script and the answers into
//! findings, each with its line, what will happen and the fix.
//!
//! - [`script`] reads the file as sbatch does (`#SBATCH` lines up to the first
//!   command) and [`shell`] as bash will run it;
//! - [`getopt`] and [`table`] read sbatch's and srun's options per release;
//! - [`job`] builds the job (script, `SBATCH_*`, command line) and its `srun` steps;
//! - [`values`] reads option values, [`facts`] the cluster's answers;
//! - [`traps`] and [`resources`] are the checks, one small function per trap;
//!   [`onenode`] the multi-node job whose script starts nothing on its other nodes.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;

pub mod facts;
pub mod getopt;
pub mod job;
mod lexer;
mod onenode;
pub mod outdirs;
mod resources;
pub mod script;
pub mod shell;
pub mod table;
mod traps;
pub mod values;
mod word;

pub use facts::Cluster;
pub use job::{Input, Job, Origin};
pub use script::{ReadError, Script};

/// The traps lint knows, numbered as in `docs/users.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trap {
    /// 1: an `--output`/`--error` directory the job cannot write.
    OutputDir,
    /// 2: an array whose tasks write one log.
    ArrayOutput,
    /// 3: `--signal` without `B:` while the script traps the signal.
    SignalNotBatch,
    /// 4: a signal trap with `srun` in the foreground (or in the background with no `wait`).
    SrunForeground,
    /// 5: work lost on preemption or requeue.
    Preemption,
    /// 6: `--gpus-per-task=1` for a launcher that starts a process per GPU.
    LauncherGpus,
    /// 7: GPUs asked for two ways.
    GpusTwoWays,
    /// 8: a GRES name or type the cluster does not have.
    GresType,
    /// 9: `srun` without `--cpus-per-task` where it is not inherited.
    SrunCpus,
    /// 10: a multi-node `srun` that leaves ranks running after one dies.
    KillOnBadExit,
    /// 11: a constant `MASTER_PORT`.
    FixedPort,
    /// 12: a time limit at the partition's maximum.
    TimeAtMax,
    /// 13: a request no node (or partition) can satisfy.
    Unsatisfiable,
    /// 14: `--mem=0` without `--exclusive`.
    MemZero,
    /// 15: an `#SBATCH` line sbatch ignores.
    IgnoredDirective,
    /// 16: `afterok` on a job that can be preempted or cut short.
    AfterOk,
    /// 17: an interface variable NCCL or gloo misreads (`NCCL_SOCKET_IFNAME=^docker0`
    /// lets `lo` through; NCCL's `^`/`=` syntax in `GLOO_SOCKET_IFNAME`).
    SocketIfname,
    /// 18: a `--signal` the job relies on at preemption that the cluster does
    /// not send then (no `send_user_signal`), or sends with less grace time
    /// than the signal's lead time.
    PreemptSignal,
    /// 19: a job of more than one node whose script starts nothing on the
    /// other nodes (no `srun`, MPI launcher or remote shell): it runs on the
    /// first node only; `torchrun --nnodes=2` there waits for nodes that never come.
    OneNodeOnly,
    /// Not a trap of the guide: sbatch refuses the script or an option outright.
    Refused,
}

impl Trap {
    /// Every trap, in order.
    pub const ALL: [Trap; 20] = [
        Trap::OutputDir,
        Trap::ArrayOutput,
        Trap::SignalNotBatch,
        Trap::SrunForeground,
        Trap::Preemption,
        Trap::LauncherGpus,
        Trap::GpusTwoWays,
        Trap::GresType,
        Trap::SrunCpus,
        Trap::KillOnBadExit,
        Trap::FixedPort,
        Trap::TimeAtMax,
        Trap::Unsatisfiable,
        Trap::MemZero,
        Trap::IgnoredDirective,
        Trap::AfterOk,
        Trap::SocketIfname,
        Trap::PreemptSignal,
        Trap::OneNodeOnly,
        Trap::Refused,
    ];

    /// Its number in `docs/users.md` (none for [`Trap::Refused`]).
    pub fn number(self) -> Option<u8> {
        (self != Trap::Refused).then(|| u8::try_from(self as usize + 1).unwrap_or(0))
    }

    /// Its stable id (`--json`).
    pub fn id(self) -> &'static str {
        match self {
            Trap::OutputDir => "output-dir",
            Trap::ArrayOutput => "array-output",
            Trap::SignalNotBatch => "signal-not-batch",
            Trap::SrunForeground => "srun-foreground",
            Trap::Preemption => "preemption",
            Trap::LauncherGpus => "launcher-gpus",
            Trap::GpusTwoWays => "gpus-two-ways",
            Trap::GresType => "gres-type",
            Trap::SrunCpus => "srun-cpus",
            Trap::KillOnBadExit => "kill-on-bad-exit",
            Trap::FixedPort => "fixed-port",
            Trap::TimeAtMax => "time-at-max",
            Trap::Unsatisfiable => "unsatisfiable",
            Trap::MemZero => "mem-zero",
            Trap::IgnoredDirective => "ignored-directive",
            Trap::AfterOk => "afterok",
            Trap::SocketIfname => "socket-ifname",
            Trap::PreemptSignal => "preempt-signal",
            Trap::OneNodeOnly => "multi-node-no-launcher",
            Trap::Refused => "sbatch-refuses",
        }
    }

    /// Whether `lint=strict` refuses the submit for it: only the traps judged
    /// from what slurmctld itself judges the job by, `slurm.conf`'s nodes and
    /// partitions, where Slurm refuses the job or it can never start (8, 13).
    ///
    /// Not trap 1: the submit host's view of a directory (its mounts, root
    /// squash, a path that exists only on compute nodes) is not the compute
    /// node's, so it is a warning, never a refusal. Not trap 15: sbatch
    /// ignores the line and the job runs, only without that option.
    pub fn strict(self) -> bool {
        matches!(self, Trap::GresType | Trap::Unsatisfiable)
    }
}

impl fmt::Display for Trap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number() {
            Some(n) => write!(f, "trap {n} ({})", self.id()),
            None => f.write_str(self.id()),
        }
    }
}

/// One trap found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Which.
    pub trap: Trap,
    /// Where.
    pub at: Origin,
    /// What will happen.
    pub what: String,
    /// The fix.
    pub fix: String,
}

impl Finding {
    /// Where, in words: `job.sh:12`, `SBATCH_OUTPUT`, `the command line`.
    pub fn place(&self, file: &str) -> String {
        match &self.at {
            Origin::Line(n) => format!("{file}:{n}"),
            Origin::Env(var) => format!("{file}: {var} (environment)"),
            Origin::CommandLine => format!("{file}: sbatch's command line"),
        }
    }

    /// The line number, when it is on a line.
    pub fn line(&self) -> Option<usize> {
        match self.at {
            Origin::Line(n) => Some(n),
            _ => None,
        }
    }

    /// The finding as one line (what the plugin prints on sbatch's stderr).
    pub fn one_line(&self, file: &str) -> String {
        format!("{}: {}; fix: {}", self.place(file), self.what, self.fix)
    }
}

/// A check that was not made, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The trap it is about.
    pub trap: Trap,
    /// Why it was not checked (or what could not be read).
    pub text: String,
}

/// Where the release came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// `SLURM_VERSION_NUMBER`.
    pub number: u32,
    /// In words: `scontrol --version`, `the Slurm spank-gpu was built for`.
    pub from: String,
}

/// Everything [`check`] needs besides the script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The release the checks are made for.
    pub release: Release,
    /// The cluster's answers.
    pub cluster: Cluster,
    /// What each directory [`needs`] asked about is.
    pub dirs: BTreeMap<String, DirState>,
}

/// A directory an output file goes in, as seen from where lint runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirState {
    /// It exists.
    Dir {
        /// The user can create files in it.
        writable: bool,
    },
    /// It does not exist; `ancestor` is the deepest part of the path that does.
    Missing {
        /// That part.
        ancestor: String,
        /// It is a directory the user can create directories in.
        writable: bool,
    },
    /// A part of the path is a file, not a directory.
    NotDir {
        /// That part.
        at: String,
    },
    /// It could not be looked at (a permission, an I/O error).
    Unknown(String),
}

/// What to ask before [`check`]: the cluster's facts and the directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Directories to look at (absolute paths).
    pub dirs: Vec<String>,
    /// Partitions and their nodes (`sinfo`).
    pub partitions: bool,
    /// The configuration (`scontrol show config`).
    pub config: bool,
    /// The QoS (`sacctmgr show qos`).
    pub qos: bool,
    /// Jobs this one depends on (`squeue`).
    pub jobs: Vec<String>,
}

/// What lint found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The traps found, in line order.
    pub findings: Vec<Finding>,
    /// What was not checked, and why.
    pub notes: Vec<Note>,
}

impl Report {
    /// The findings that `lint=strict` refuses a submit for.
    pub fn strict(&self) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.trap.strict()).collect()
    }
}

/// The Slurm release from which slurmstepd creates a missing output
/// directory (`mkdirpath` in `_init_task_stdio_fds`, src/slurmd/slurmstepd/io.c,
/// from slurm-23-02-0-1 on); before it, the job fails at launch with no log.
pub const CREATES_OUTPUT_DIR_SINCE: u32 = (23 << 16) | (2 << 8);

/// The Slurm release from which srun reads `SLURM_CPUS_PER_TASK` (which
/// sbatch sets from `--cpus-per-task`) again; 22.05 and 23.02 read only
/// `SRUN_CPUS_PER_TASK` (the `env_vars[]` of src/srun/opt.c at each tag).
pub const SRUN_INHERITS_CPUS_SINCE: u32 = (23 << 16) | (11 << 8);

/// Joins `rel` to `base` unless it is absolute.
fn absolute(base: &str, rel: &str) -> String {
    if rel.starts_with('/') || base.is_empty() {
        rel.to_owned()
    } else if rel.is_empty() {
        base.to_owned()
    } else {
        format!("{}/{rel}", base.trim_end_matches('/'))
    }
}

/// The directories `--output`, `--error` and `--chdir` of a component name,
/// absolute, with the option they come from; `None` for a directory that
/// holds what is known only when the job runs (`%j`, a variable).
fn output_dirs(job: &Job, req: &job::Request) -> Vec<(Option<String>, &'static str, String)> {
    let cwd = &job.input.cwd;
    let workdir = match req.value("chdir") {
        Some(v) if v.known => absolute(cwd, &v.text),
        Some(v) => return vec![(None, "chdir", v.text.clone())],
        None => cwd.clone(),
    };
    let name = match req.value("job-name") {
        Some(v) => v.text.clone(),
        None => job.input.file.rsplit('/').next().unwrap_or(&job.input.file).to_owned(),
    };
    let mut out = Vec::new();
    if req.has("chdir") {
        out.push((Some(workdir.clone()), "chdir", workdir.clone()));
    }
    for opt in ["output", "error"] {
        let Some(v) = req.value(opt) else { continue };
        if v.text.starts_with("/dev/") {
            continue;
        }
        let dir = if v.known { values::pattern_dir(&v.text, &job.input.user, &name) } else { None };
        out.push((dir.map(|d| absolute(&workdir, &d)), opt, v.text.clone()));
    }
    out
}

/// What to ask the cluster and the file system before checking `job`.
pub fn needs(job: &Job) -> Needs {
    let mut n = Needs { partitions: true, ..Needs::default() };
    for req in &job.components {
        for (dir, _, _) in output_dirs(job, req) {
            let Some(dir) = dir else { continue };
            if !n.dirs.contains(&dir) {
                n.dirs.push(dir);
            }
        }
        if req.has("qos") {
            n.qos = true;
            n.config = true;
        }
        if let Some(dep) = req.value("dependency").and_then(|v| v.get()) {
            for (kind, jobs) in values::parse_dependency(dep) {
                if kind == "afterok" {
                    n.jobs.extend(
                        jobs.into_iter()
                            .filter(|j| !j.is_empty() && j.bytes().all(|b| b.is_ascii_digit() || b == b'_')),
                    );
                }
            }
        }
    }
    if !n.jobs.is_empty() {
        n.qos = true;
        n.config = true;
    }
    if job.sruns.iter().any(|s| !s.opts.has("kill-on-bad-exit"))
        || job.script.bytes > script::SLURM_MAX_SCRIPT
    {
        n.config = true;
    }
    n
}

/// Checks `job` against the facts.
pub fn check(job: &Job, facts: &Facts) -> Report {
    let mut out = Report::default();
    traps::script_traps(job, facts, &mut out);
    onenode::check(job, &mut out);
    for (i, req) in job.components.iter().enumerate() {
        let cx = Cx { job, facts, req, component: i };
        traps::component_traps(&cx, &mut out);
        resources::check(&cx, &mut out);
    }
    traps::step_traps(job, facts, &mut out);
    let key = |f: &Finding| match f.at {
        Origin::Line(n) => (0, n),
        Origin::Env(_) => (1, 0),
        Origin::CommandLine => (2, 0),
    };
    out.findings.sort_by_key(key);
    out.findings.dedup();
    out.notes.dedup();
    out
}

/// Reads nothing and asks nothing itself: builds the job from `script` and
/// `input`, asks `ask` for what [`needs`] says, and checks.
pub fn lint(script: &Script, input: &Input, ask: impl FnOnce(&Needs) -> Facts) -> Report {
    let job = Job::new(script, input);
    let facts = ask(&needs(&job));
    check(&job, &facts)
}

/// What a check of one job component sees.
pub(crate) struct Cx<'a> {
    pub job: &'a Job<'a>,
    pub facts: &'a Facts,
    pub req: &'a job::Request,
    pub component: usize,
}

impl Report {
    pub(crate) fn find(&mut self, trap: Trap, at: Origin, what: String, fix: String) {
        self.findings.push(Finding { trap, at, what, fix });
    }

    pub(crate) fn note(&mut self, trap: Trap, text: String) {
        let n = Note { trap, text };
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }
}
