//! The first failure of a job's steps: which task on which node died first
//! and how, what the other tasks died of after it ("consequences"), and the
//! GPU-hours the job held after it, from srun's and slurmstepd's own lines in
//! the job's log and the steps' accounting (`autopsy`'s `first_failure`).
//!
//! What srun and slurmstepd print, the same from 22.05 to 26.05 but where said
//! (each checked at slurm-22-05-8-1, -23-02-7-1, -23-11-11-1, -24-05-8-1,
//! -24-11-6-1, -25-05-8-1, -25-11-7-1, -26-05-3-1):
//!
//! - srun's `_task_finish` (src/srun/launch.c; 22.05 in
//!   src/plugins/launch/slurm/launch_slurm.c), one line per exit message of a
//!   node's slurmstepd, in the order they arrive: `srun: error: HOSTS: task|tasks
//!   LIST: Exited with exit code N`, `...: SIGNAL NAME[ (core dumped)]`
//!   (`strsignal`: `Killed`, `Terminated`, `Aborted`, `Segmentation fault`, ...)
//!   and `...: Out Of Memory`; LIST is `bit_fmt`'s (`0-3,5`). A death by
//!   signal after the user cancelled srun (Ctrl-C) is only `verbose`, not printed;
//!   with `SLURM_SRUN_REDUCE_TASK_EXIT_MSG` a repeated status is printed once.
//! - srun's kill on a bad exit (`--kill-on-bad-exit`, or `KillOnBadExit=1`):
//!   `_step_signal` logs `srun: Terminating StepId=J.S` and sends the step
//!   `SIG_TERM_KILL` (SIGCONT, SIGTERM, then SIGKILL after KillWait).
//! - slurmstepd's `_handle_signal_container` (src/slurmd/slurmstepd/req.c), on
//!   the step's first node: `*** STEP J.S ON NODE CANCELLED AT TIME ***` for
//!   SIGTERM, SIGKILL and `SIG_TERM_KILL` up to 24.11; from 25.05 `... CANCELLED
//!   AT TIME DUE TO TASK FAILURE ***` for `SIG_TERM_KILL` and `... DUE to SIGNAL
//!   Terminated ***` for SIGTERM/SIGKILL; on every release `DUE TO TIME LIMIT`,
//!   `DUE TO PREEMPTION`, `DUE TO NODE FAILURE, ...`, `DUE TO JOB REQUEUE`, and
//!   `JOB J` for the batch step. TIME is `slurm_make_time_str`'s,
//!   `YYYY-MM-DDTHH:MM:SS` by default.
//! - `srun: Job step aborted: Waiting up to N seconds for job step to
//!   finish.` (`slurm_step_launch_wait_finish`, src/api/step_launch.c): srun
//!   aborted the step (it was cancelled or killed).
//!
//! A log is the job's own text: a line may name 65536 hosts and 4 billion
//! tasks. Tasks are kept as srun prints them, ranges ([`Tasks`], at most
//! [`MAX_RANGES`] a line), hosts as the hostlist printed (its first host and
//! count read without expanding it), at most [`MAX_EXITS`] exit lines and
//! [`MAX_CONSEQUENCES`] consequences (the others counted), so that time and
//! memory grow with the log's length only.
//!
//! When the log has no such line, the steps' accounting (`sacct`, one row per
//! step: `J.S`, state, exit code, start, end, nodes) names the first step that
//! failed; its first task is then not known.

use std::fmt::Write as _;

use slurm_formats::hostlist;
use slurm_formats::units::format_duration;

use super::Row;
use super::causes::{self, Cause};
use crate::time::parse_time;

/// How a task died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Death {
    /// It exited with this status (not 0).
    Exit(u32),
    /// A signal killed it: its number, `strsignal`'s name, whether it dumped core.
    Signal(u32, String, bool),
    /// Slurm's cgroup out-of-memory kill (srun's `Out Of Memory`).
    OutOfMemory,
}

impl Death {
    /// In words: `exited with status 1`, `killed by signal 15 (Terminated)`.
    pub fn words(&self) -> String {
        match self {
            Death::Exit(n) => format!("exited with status {n}"),
            Death::Signal(n, name, core) => {
                format!("killed by signal {n} ({name}){}", if *core { ", core dumped" } else { "" })
            }
            Death::OutOfMemory => {
                "was killed for using more memory than the job's limit (Out Of Memory)".into()
            }
        }
    }

    /// `(exit status, signal)` as `--json` gives them.
    pub fn codes(&self) -> (Option<u32>, Option<u32>) {
        match self {
            Death::Exit(n) => (Some(*n), None),
            Death::Signal(n, _, _) => (None, Some(*n)),
            Death::OutOfMemory => (None, None),
        }
    }
}

/// `strsignal`'s English names (glibc) of the signals a task dies of.
const SIGNALS: &[(u32, &str)] = &[
    (1, "Hangup"),
    (2, "Interrupt"),
    (3, "Quit"),
    (4, "Illegal instruction"),
    (5, "Trace/breakpoint trap"),
    (6, "Aborted"),
    (7, "Bus error"),
    (8, "Floating point exception"),
    (9, "Killed"),
    (10, "User defined signal 1"),
    (11, "Segmentation fault"),
    (12, "User defined signal 2"),
    (13, "Broken pipe"),
    (14, "Alarm clock"),
    (15, "Terminated"),
    (24, "CPU time limit exceeded"),
    (25, "File size limit exceeded"),
];

/// The most ranges of task ids kept of one line (the rest counted).
pub const MAX_RANGES: usize = 64;
/// The most task-exit lines kept of one log (the rest counted).
pub const MAX_EXITS: usize = 4096;
/// The most consequences kept (the rest counted).
pub const MAX_CONSEQUENCES: usize = 32;
/// The longest hostlist of a task-exit line read (srun's names one node).
const MAX_HOSTLIST: usize = 1024;
/// The longest step id read (`J.S`, `J+O.S`, `J_T.S`).
const MAX_STEP: usize = 64;

/// Task ids as srun prints them (`bit_fmt`'s `0-3,5`): ranges, not ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tasks {
    /// The first [`MAX_RANGES`] ranges, `(first, last)`, in the order printed.
    ranges: Vec<(u32, u32)>,
    /// How many ids all the ranges hold.
    count: u64,
    /// Whether ranges were left out.
    cut: bool,
}

impl Tasks {
    /// `0-3,5`; `None` when it is not such a list.
    pub fn parse(s: &str) -> Option<Tasks> {
        let mut t = Tasks::default();
        for part in s.split(',') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
            if b < a {
                return None;
            }
            t.count += u64::from(b - a) + 1;
            if t.ranges.len() < MAX_RANGES {
                t.ranges.push((a, b));
            } else {
                t.cut = true;
            }
        }
        Some(t)
    }

    /// One task.
    pub fn one(id: u32) -> Tasks {
        Tasks { ranges: vec![(id, id)], count: 1, cut: false }
    }

    /// The first id printed.
    pub fn first(&self) -> Option<u32> {
        self.ranges.first().map(|r| r.0)
    }

    /// Whether `id` is among the ranges kept.
    pub fn contains(&self, id: u32) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&id))
    }

    /// Whether any of `sorted` (ascending) is among the ranges kept.
    fn any_of(&self, sorted: &[u32]) -> bool {
        self.ranges.iter().any(|&(a, b)| {
            let i = sorted.partition_point(|&x| x < a);
            sorted.get(i).is_some_and(|&x| x <= b)
        })
    }

    /// How many ids the list holds.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// At most `max` of the ids, in the order printed.
    pub fn ids(&self, max: usize) -> Vec<u32> {
        self.ranges.iter().flat_map(|&(a, b)| a..=b).take(max).collect()
    }
}

impl std::fmt::Display for Tasks {
    /// As srun prints them, `0-3,5`; `0,2,...` and the count when ranges were left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(a, b)) in self.ranges.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            if a == b {
                write!(f, "{sep}{a}")?;
            } else {
                write!(f, "{sep}{a}-{b}")?;
            }
        }
        if self.cut {
            write!(f, ",... ({} in all)", self.count)?;
        }
        Ok(())
    }
}

/// One of srun's task-exit lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskExit {
    /// The hostlist the line names, as printed (one node, as srun prints a node's message).
    pub hosts: String,
    /// Its first host.
    pub node: String,
    /// The task ids it names.
    pub tasks: Tasks,
    /// How they died.
    pub death: Death,
    /// Its line number (1-based).
    pub line_no: usize,
}

/// A slurmstepd `*** STEP J.S ON NODE CANCELLED AT TIME ... ***` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepCancel {
    /// `J.S`, or `J` for `*** JOB J ...`.
    pub step: String,
    /// The node that printed it.
    pub node: String,
    /// TIME as printed.
    pub at: String,
    /// What follows `DUE TO`/`DUE to` (`TASK FAILURE`, `TIME LIMIT`, `SIGNAL Terminated`), if anything.
    pub due: Option<String>,
    /// Its line number.
    pub line_no: usize,
}

/// What srun and slurmstepd said in a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFacts {
    /// srun's task-exit lines, in order.
    pub exits: Vec<TaskExit>,
    /// srun's `Terminating StepId=J.S` (a kill on a bad exit): (line, step).
    pub terminating: Vec<(usize, String)>,
    /// slurmstepd's cancel lines.
    pub cancels: Vec<StepCancel>,
    /// srun's `Job step aborted` lines.
    pub aborted: Vec<usize>,
    /// Task-exit lines past the first [`MAX_EXITS`], not kept.
    pub exits_left_out: usize,
}

/// One srun task-exit line: `HOSTS: task|tasks LIST: WHAT` after `srun: error: `.
fn task_exit(rest: &str, line_no: usize) -> Option<TaskExit> {
    let (hosts, rest) = rest.split_once(": ")?;
    let rest = rest.strip_prefix("tasks ").or_else(|| rest.strip_prefix("task "))?;
    let (list, what) = rest.split_once(": ")?;
    let what = what.trim_end();
    let death = if let Some(code) = what.strip_prefix("Exited with exit code ") {
        Death::Exit(code.trim().parse().ok()?)
    } else if what == "Out Of Memory" {
        Death::OutOfMemory
    } else {
        let (name, core) = match what.strip_suffix(" (core dumped)") {
            Some(n) => (n, true),
            None => (what, false),
        };
        let n = SIGNALS.iter().find(|(_, s)| *s == name).map(|(n, _)| *n).or_else(|| {
            // glibc's names for the others: "Real-time signal 3" (SIGRTMIN + 3, SIGRTMIN
            // being 34 on Linux), "Unknown signal 99".
            let number = |p: &str| name.strip_prefix(p).and_then(|d| d.parse::<u32>().ok());
            number("Real-time signal ").map(|d| 34 + d).or_else(|| number("Unknown signal "))
        })?;
        Death::Signal(n, name.to_owned(), core)
    };
    let hosts = hosts.trim();
    if hosts.len() > MAX_HOSTLIST {
        return None;
    }
    // The first host and the list's check, without expanding it.
    let node = hostlist::first(hosts).ok()?;
    Some(TaskExit { hosts: hosts.to_owned(), node, tasks: Tasks::parse(list)?, death, line_no })
}

/// `*** STEP J.S ON NODE CANCELLED AT TIME[ DUE TO ...] ***`.
fn step_cancel(line: &str, line_no: usize) -> Option<StepCancel> {
    let i = line.find("*** ")?;
    let body = line[i + 4..].trim_end().strip_suffix("***")?.trim_end();
    let body = body.strip_prefix("STEP ").or_else(|| body.strip_prefix("JOB "))?;
    let (step, rest) = body.split_once(" ON ")?;
    let (node, rest) = rest.split_once(" CANCELLED AT ")?;
    if step.len() > MAX_STEP || node.len() > hostlist::MAX_HOST_LEN || rest.len() > 200 {
        return None;
    }
    let (at, due) = match rest.split_once(" DUE ") {
        Some((at, due)) => {
            let due = due.strip_prefix("TO ").or_else(|| due.strip_prefix("to ")).unwrap_or(due);
            (at, Some(due.trim().to_owned()))
        }
        None => (rest, None),
    };
    (!step.contains(' ') && !node.contains(' ')).then(|| StepCancel {
        step: step.to_owned(),
        node: node.to_owned(),
        at: at.trim().to_owned(),
        due,
        line_no,
    })
}

/// srun's and slurmstepd's lines in `log`.
pub fn read_log(log: &str) -> LogFacts {
    let mut f = LogFacts::default();
    for (i, line) in log.lines().enumerate() {
        let n = i + 1;
        if let Some(at) = line.find("srun: error: ") {
            if f.exits.len() == MAX_EXITS {
                f.exits_left_out += usize::from(task_exit(&line[at + "srun: error: ".len()..], n).is_some());
            } else if let Some(e) = task_exit(&line[at + "srun: error: ".len()..], n) {
                f.exits.push(e);
            }
        } else if let Some(at) = line.find("srun: Terminating StepId=") {
            let step = line[at + "srun: Terminating StepId=".len()..].trim();
            if step.len() <= MAX_STEP && !step.contains(char::is_whitespace) {
                f.terminating.push((n, step.to_owned()));
            }
        } else if line.contains("srun: Job step aborted") {
            f.aborted.push(n);
        } else if line.contains("slurmstepd") && line.contains(" CANCELLED AT ") {
            if let Some(c) = step_cancel(line, n) {
                f.cancels.push(c);
            }
        }
    }
    f
}

/// Why another task died after the first failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// srun ended the step on the first bad exit (`--kill-on-bad-exit`).
    KillOnBadExit,
    /// PyTorch's NCCL watchdog ended it: it waited in a collective for the dead rank.
    NcclTimeout,
    /// SIGTERM or SIGKILL from srun or Slurm as the step or job was ended.
    Terminated,
    /// It failed on its own too.
    Other,
}

impl Why {
    /// `--json`'s word.
    pub fn id(self) -> &'static str {
        match self {
            Why::KillOnBadExit => "kill-on-bad-exit",
            Why::NcclTimeout => "nccl-timeout",
            Why::Terminated => "sigterm",
            Why::Other => "other",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Why::KillOnBadExit => "killed by srun on the first bad exit (--kill-on-bad-exit)",
            Why::NcclTimeout => "the NCCL watchdog's timeout: they waited in a collective for the dead rank",
            Why::Terminated => "SIGTERM from srun as Slurm ended the step or the job",
            Why::Other => "failed too",
        }
    }
}

/// Tasks that died after the first failure, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consequence {
    /// Their node(s): the hostlist srun printed.
    pub nodes: String,
    /// Their task ids.
    pub tasks: Tasks,
    /// How they died.
    pub death: Death,
    /// Why.
    pub why: Why,
}

/// Where the first failure's time comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtFrom {
    /// slurmstepd's `CANCELLED AT` of the step when srun killed it on the bad
    /// exit: seconds after the failure.
    StepCancel,
    /// The failed step's end in accounting: the failure was at or before it.
    StepEnd,
}

impl AtFrom {
    /// `--json`'s word.
    pub fn id(self) -> &'static str {
        match self {
            AtFrom::StepCancel => "step_cancel",
            AtFrom::StepEnd => "step_end",
        }
    }
}

/// The first failure of a job's steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstFailure {
    /// The node it was on, when known.
    pub node: Option<String>,
    /// The task (Slurm's task id, the rank where a task is a rank), when known.
    pub task: Option<u32>,
    /// The step (`J.S`), when known.
    pub step: Option<String>,
    /// How it died.
    pub death: Death,
    /// When (Slurm's `YYYY-MM-DDTHH:MM:SS`), and where that comes from.
    pub at: Option<(String, AtFrom)>,
    /// The job's GPUs times the time from `at` to the job's end, in GPU-seconds.
    pub gpu_seconds_after: Option<u64>,
    /// The job's GPUs (for the words).
    pub gpus: Option<u32>,
    /// What the others died of (the first [`MAX_CONSEQUENCES`]).
    pub consequences: Vec<Consequence>,
    /// The others' task-exit lines past those.
    pub more_consequences: usize,
    /// How long the others waited in NCCL before the watchdog ended them
    /// (its `ran for N milliseconds`), when it did.
    pub others_waited_s: Option<u64>,
}

/// A step's row: (id `J.S`, state, exit `STATUS:SIGNAL`, start, end, nodes).
struct StepRow<'a> {
    id: &'a str,
    state: &'a str,
    exit: &'a str,
    end: &'a str,
    nodes: Vec<String>,
}

/// The numeric steps (srun's, not `batch`, `extern` or `interactive`) of `rows`.
fn step_rows(rows: &[Row]) -> Vec<StepRow<'_>> {
    rows.iter()
        .filter_map(|r| {
            let id = r.get("JobID")?.as_str();
            let (_, step) = id.rsplit_once('.')?;
            if !step.bytes().all(|b| b.is_ascii_digit()) || step.is_empty() {
                return None;
            }
            let get = |k: &str| r.get(k).map_or("", String::as_str);
            let nodes = match get("NodeList") {
                "" | "None assigned" | "(null)" => Vec::new(),
                l => hostlist::expand(l).unwrap_or_default(),
            };
            Some(StepRow { id, state: get("State"), exit: get("ExitCode"), end: get("End"), nodes })
        })
        .collect()
}

/// A step that failed on its own: not one Slurm cancelled (time limit,
/// preemption, scancel), which ends `CANCELLED`, `TIMEOUT` or `PREEMPTED`.
fn failed(s: &StepRow) -> bool {
    matches!(s.state.split_whitespace().next().unwrap_or(""), "FAILED" | "OUT_OF_MEMORY" | "NODE_FAIL")
}

/// The death an accounting `STATUS:SIGNAL` and state say.
fn death_of(exit: &str, state: &str) -> Death {
    let (code, sig) = exit.split_once(':').unwrap_or((exit, "0"));
    let (code, sig) = (code.parse().unwrap_or(0), sig.parse().unwrap_or(0));
    if state.starts_with("OUT_OF_MEMORY") || sig == 125 {
        Death::OutOfMemory
    } else if sig != 0 {
        let name = SIGNALS.iter().find(|(n, _)| *n == sig).map_or("signal", |(_, s)| s);
        Death::Signal(sig, name.to_owned(), false)
    } else {
        Death::Exit(code)
    }
}

/// The first failure, from the log (`log`, its end as read) and the steps'
/// accounting (`rows`: `sacct`'s rows of the job and its steps), for a job
/// that ended at `job_end` holding `gpus` GPUs. `None` when neither shows one.
///
/// Tasks that SIGTERM or SIGKILL ended while Slurm ended the step or the job
/// (a time limit, a preemption, `scancel`: the job's state says so, or
/// slurmstepd's cancel for another reason than a task failure, or srun's
/// `Job step aborted`) did not fail: they are no first failure.
pub fn first_failure(
    rows: &[Row],
    log: Option<&str>,
    job_end: &str,
    gpus: Option<u32>,
) -> Option<FirstFailure> {
    let facts = log.map(read_log).unwrap_or_default();
    let steps = step_rows(rows);
    let job_state = rows
        .iter()
        .find(|r| r.get("JobID").is_some_and(|j| !j.contains('.')))
        .and_then(|r| r.get("State"))
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or("");
    let ended_by_slurm =
        matches!(job_state, "TIMEOUT" | "PREEMPTED" | "CANCELLED" | "DEADLINE" | "NODE_FAIL")
            || !facts.aborted.is_empty()
            || facts.cancels.iter().any(|c| c.due.as_deref().is_some_and(|d| d != "TASK FAILURE"));
    let slurm_kill = |e: &TaskExit| ended_by_slurm && matches!(e.death, Death::Signal(9 | 15, _, _));
    let first_at = facts.exits.iter().position(|e| !slurm_kill(e));
    let first = first_at.map(|i| &facts.exits[i]);
    let mut ff = match first {
        Some(e) => {
            // The step: named by srun's kill or slurmstepd's cancel after it, else
            // the first failed step in accounting on its node, else the only one.
            let named =
                facts.terminating.iter().find(|(n, _)| *n > e.line_no).map(|(_, s)| s.clone()).or_else(
                    || {
                        facts
                            .cancels
                            .iter()
                            .find(|c| c.line_no > e.line_no && c.step.contains('.'))
                            .map(|c| c.step.clone())
                    },
                );
            let by_node = || {
                // The line's hosts (one, as srun prints them; at most hostlist::MAX_HOSTS).
                let hosts = hostlist::expand(&e.hosts).unwrap_or_default();
                let mut f: Vec<&StepRow> =
                    steps.iter().filter(|s| failed(s) && s.nodes.iter().any(|n| hosts.contains(n))).collect();
                f.sort_by_key(|s| parse_time(s.end).unwrap_or(i64::MAX));
                f.first().map(|s| s.id.to_owned())
            };
            let step = named.or_else(by_node).or_else(|| (steps.len() == 1).then(|| steps[0].id.to_owned()));
            FirstFailure {
                node: Some(e.node.clone()),
                task: e.tasks.first(),
                step,
                death: e.death.clone(),
                at: None,
                gpu_seconds_after: None,
                gpus,
                consequences: Vec::new(),
                more_consequences: 0,
                others_waited_s: None,
            }
        }
        None => {
            let mut f: Vec<&StepRow> = steps.iter().filter(|s| failed(s)).collect();
            f.sort_by_key(|s| parse_time(s.end).unwrap_or(i64::MAX));
            let s = f.first()?;
            FirstFailure {
                node: (s.nodes.len() == 1).then(|| s.nodes[0].clone()),
                task: None,
                step: Some(s.id.to_owned()),
                death: death_of(s.exit, s.state),
                at: None,
                gpu_seconds_after: None,
                gpus,
                consequences: Vec::new(),
                more_consequences: 0,
                others_waited_s: None,
            }
        }
    };
    // When: slurmstepd's cancel of that step after srun's kill on the bad exit
    // (25.05 on: DUE TO TASK FAILURE), else the step's end in accounting.
    let after = first.map_or(0, |e| e.line_no);
    let killed = facts.terminating.iter().any(|(n, _)| *n > after);
    let cancel = facts.cancels.iter().find(|c| {
        c.line_no > after
            && ff.step.as_deref().is_none_or(|s| s == c.step)
            && match c.due.as_deref() {
                Some(d) => d == "TASK FAILURE",
                None => killed,
            }
    });
    ff.at = match cancel {
        Some(c) if first.is_some() && parse_time(&c.at).is_some() => Some((c.at.clone(), AtFrom::StepCancel)),
        _ => ff
            .step
            .as_deref()
            .and_then(|id| steps.iter().find(|s| s.id == id))
            .filter(|s| parse_time(s.end).is_some())
            .map(|s| (s.end.to_owned(), AtFrom::StepEnd)),
    };
    if let (Some((at, _)), Some(g), Some(end)) = (&ff.at, gpus, parse_time(job_end)) {
        if let Some(t) = parse_time(at) {
            ff.gpu_seconds_after =
                Some(u64::try_from(end.saturating_sub(t).max(0)).unwrap_or(0) * u64::from(g));
        }
    }
    // The others.
    if let Some(e) = first {
        let timeouts = log.map(|l| causes::nccl_timeouts(l, ff.task)).unwrap_or_default();
        // Each exit line against every timeout and kill, in O(log n) each.
        let unranked_timeout = timeouts.iter().any(Option::is_none);
        let mut timed_out: Vec<u32> = timeouts.iter().flatten().copied().collect();
        timed_out.sort_unstable();
        let kills: Vec<usize> = facts.terminating.iter().map(|(n, _)| *n).collect();
        let others = facts.exits.len() - 1 + facts.exits_left_out;
        ff.more_consequences = others.saturating_sub(MAX_CONSEQUENCES);
        for (i, o) in facts.exits.iter().enumerate() {
            if Some(i) == first_at {
                continue;
            }
            if ff.consequences.len() == MAX_CONSEQUENCES {
                break;
            }
            let tasks_timed_out = unranked_timeout || o.tasks.any_of(&timed_out);
            // A kill after the first failure's line and before this one (`kills` is ascending).
            let after_first = kills.partition_point(|&n| n <= e.line_no);
            let killed_before = kills.get(after_first).is_some_and(|&n| n < o.line_no);
            let why = match &o.death {
                Death::Signal(9 | 15, _, _) if killed_before => Why::KillOnBadExit,
                Death::Signal(9 | 15, _, _) => Why::Terminated,
                _ if tasks_timed_out => Why::NcclTimeout,
                _ => Why::Other,
            };
            ff.consequences.push(Consequence {
                nodes: o.hosts.clone(),
                tasks: o.tasks.clone(),
                death: o.death.clone(),
                why,
            });
        }
        if ff.consequences.iter().any(|c| c.why == Why::NcclTimeout) {
            ff.others_waited_s = log.and_then(|l| watchdog_wait_ms(l, ff.task)).map(|ms| ms / 1000);
        }
    }
    Some(ff)
}

/// The longest `ran for N milliseconds` of the NCCL watchdog's timeouts in
/// `log` on ranks other than `except`.
fn watchdog_wait_ms(log: &str, except: Option<u32>) -> Option<u64> {
    log.lines()
        .filter(|l| causes::classify_line(l) == Some(causes::CauseClass::NcclTimeout))
        .filter(|l| except.is_none() || causes::line_rank(l) != except)
        .filter_map(|l| {
            let (_, rest) = l.split_once(" ran for ")?;
            rest.split_once(" milliseconds")?.0.trim().parse::<u64>().ok()
        })
        .max()
}

/// Task ids as srun prints them: `task 3`, `tasks 0-3,5`.
fn tasks_words(tasks: &Tasks) -> String {
    if tasks.count() == 1 { format!("task {tasks}") } else { format!("tasks {tasks}") }
}

/// GPU-seconds as GPU-hours, two decimals.
pub fn gpu_hours(gpu_seconds: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let h = gpu_seconds as f64 / 3600.0;
    (h * 100.0).round() / 100.0
}

/// The "First failure" section's lines (without indentation).
pub fn section(ff: Option<&FirstFailure>, cause: Option<&Cause>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(f) = ff {
        let mut l = String::new();
        match (f.task, &f.node) {
            (Some(t), Some(n)) => {
                let _ = write!(l, "task {t} on {n}");
            }
            (None, Some(n)) => {
                let _ = write!(l, "a task on {n}");
            }
            (Some(t), None) => {
                let _ = write!(l, "task {t}");
            }
            (None, None) => l.push_str("a task"),
        }
        if let Some(s) = &f.step {
            let _ = write!(l, " (step {s})");
        }
        let _ = write!(l, " {}", f.death.words());
        match &f.at {
            Some((at, AtFrom::StepCancel)) => {
                let _ = write!(l, ", at {at} (when Slurm cancelled the step for it)");
            }
            Some((at, AtFrom::StepEnd)) => {
                let _ = write!(l, ", at or before {at} (known only to the step's end)");
            }
            None => {}
        }
        out.push(l);
    }
    if let Some(c) = cause {
        out.push(format!("cause: {} ({})", c.class.meaning(), c.class.id()));
        match c.line_no {
            Some(n) => out.push(format!("  log line {n}: {}", c.line)),
            None => out.push(format!("  {}", c.line)),
        }
        out.push(format!("  fix: {}", c.class.fix()));
    }
    if let Some(f) = ff {
        for c in &f.consequences {
            let mut l = format!(
                "then {} on {} {}: {}",
                tasks_words(&c.tasks),
                c.nodes,
                c.death.words(),
                c.why.words()
            );
            if let (Why::NcclTimeout, Some(w)) = (c.why, f.others_waited_s) {
                let _ = write!(l, " ({})", format_duration(w));
            }
            out.push(l);
        }
        if f.more_consequences > 0 {
            out.push(format!("and {} more task-exit lines in the log", f.more_consequences));
        }
        if let Some(s) = f.gpu_seconds_after {
            let (at, from) = f.at.as_ref().map_or(("", AtFrom::StepEnd), |(a, w)| (a.as_str(), *w));
            let held = format_duration(s / u64::from(f.gpus.unwrap_or(1).max(1)));
            out.push(match from {
                AtFrom::StepCancel => format!(
                    "after it the job held its {} GPUs for {held} more: {:.2} GPU-hours",
                    f.gpus.unwrap_or(0),
                    gpu_hours(s)
                ),
                AtFrom::StepEnd => {
                    let mut l = format!(
                        "the failure's own time is not in the log, only its step's end ({at}): after that the job \
                         held its {} GPUs for {held} more, {:.2} GPU-hours at least",
                        f.gpus.unwrap_or(0),
                        gpu_hours(s)
                    );
                    if let (Some(w), Some(g)) = (f.others_waited_s, f.gpus) {
                        let _ = write!(
                            l,
                            "; before it the others waited {} in NCCL for the dead rank, about {:.2} GPU-hours more \
                             (srun --kill-on-bad-exit=1 ends them at once)",
                            format_duration(w),
                            gpu_hours(w * u64::from(g))
                        );
                    }
                    l
                }
            });
        }
    }
    out
}
