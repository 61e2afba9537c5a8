//! `spank-gpu usage` and `autopsy`'s "GPU use": whether a job used the GPUs
//! it was given, from the agent's per-node summaries
//! ([`gpu_health::usage::NodeUsage`]: each GPU's utilization, memory, idle
//! samples and energy, sampled every 10 s) and the job's facts from Slurm's record
//! ([`JobFacts`]): a table per node and GPU ([`GpuRow`]) and the findings in
//! words, each with its fix ([`Finding`]).
//!
//! The summaries come from the nodes' live files while the job runs
//! ([`Source::Live`]) or from the job's `AdminComment`, where each node's
//! agent writes its summary at the job's end ([`Source::AdminComment`]);
//! the caller reads them. Pure: nothing here runs a command.
//!
//! The findings, in the order they are reported:
//!
//! - `no-step`: nodes of the job on which no step ever ran, from Slurm's
//!   step records ([`JobFacts::steps`], read by [`super::steps`]): a batch
//!   script that starts its work without srun runs on the first node only,
//!   and the others' GPUs are held and never touched. Their GPUs belong to
//!   this finding, not to `never-used`; a node whose GPUs were used is never
//!   named (work started there some other way);
//! - `not-recorded`: no summary at all, and why it can be (`no-gpus`: the
//!   job has none);
//! - `not-sampled`: nodes of the job without a summary on which a step ran
//!   (or where that is not known);
//! - `early`: a running job with too few samples to judge yet;
//! - `never-used`: GPUs allocated and never busy (a launcher that starts
//!   fewer processes than the GPUs it was given);
//! - `low-util`: the used GPUs busy less than [`LOW_UTIL_PCT`] % on average
//!   (with 1 CPU per task: the data-loader trap, worded per release);
//! - `idle-stretch`: every GPU of a node idle for [`LONG_IDLE_S`] or more at
//!   a stretch (a dead rank and a hung collective);
//! - `memory-full`: a GPU's memory at [`MEM_NEAR_FULL`] of its size or above;
//! - `shared`: a GPU another job held too (its figures are the GPU's).

use std::collections::{HashMap, HashSet};

use serde::Serialize;

pub use gpu_health::usage::{GpuUsage, NodeUsage};
use slurm_formats::hostlist;
use slurm_formats::units::parse_duration;

use super::Row;
use super::explain::is_running_state;
use super::release::{Feature, Release};
use super::steps::{self, StepNodes};

/// Below this mean utilization (percent) of the GPUs a job used, `low-util`.
pub const LOW_UTIL_PCT: f64 = 30.0;
/// A stretch in which every GPU of a node was idle this long (seconds) or
/// longer is `idle-stretch`.
pub const LONG_IDLE_S: u64 = 600;
/// A GPU whose most memory used reached this share of its memory is
/// `memory-full`.
pub const MEM_NEAR_FULL: f64 = 0.95;
/// A running job's GPUs are judged (`never-used`, `low-util`) once one of
/// them has this many samples (a minute at the agent's default interval).
pub const MIN_SAMPLES: u64 = 6;
/// The agent's default sampling interval (`usage_interval`), in seconds.
pub const DEFAULT_INTERVAL_S: u64 = 10;

/// Every finding's `id`, in the order they are reported (docs/users.md's
/// table of findings lists the same).
pub const FINDINGS: &[&str] = &[
    "no-step",
    "not-recorded",
    "no-gpus",
    "not-sampled",
    "early",
    "never-used",
    "low-util",
    "idle-stretch",
    "memory-full",
    "shared",
];

/// Where the summaries were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The nodes' live files (`/run/spank-gpu/usage/JOBID`), the job running.
    Live,
    /// The job's `AdminComment`, written by each node's agent at the job's end.
    AdminComment,
}

impl Source {
    /// `live` or `admin_comment`, as `--json` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Source::Live => "live",
            Source::AdminComment => "admin_comment",
        }
    }
}

/// What the report needs to know about the job, from `scontrol show job`
/// ([`JobFacts::from_record`]) or `sacct` ([`JobFacts::from_sacct`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFacts {
    /// The job's id as Slurm's record has it.
    pub job_id: String,
    /// Its state (`RUNNING`, `COMPLETED`, `CANCELLED by 1000`, ...).
    pub state: String,
    /// Its nodes.
    pub nodes: Vec<String>,
    /// GPUs allocated (`gres/gpu` of its TRES, all nodes together); `Some(0)`
    /// when the TRES are known and hold no GPU.
    pub gpus: Option<u32>,
    /// Its CPUs per task (`scontrol`'s `CPUs/Task`; `sacct` does not know).
    pub cpus_per_task: Option<u32>,
    /// How long it has run (or ran), in seconds.
    pub elapsed_s: Option<u64>,
    /// The Slurm release.
    pub release: Option<Release>,
    /// Where its steps ran, from Slurm's step records; `None` when not asked.
    pub steps: Option<StepNodes>,
}

impl JobFacts {
    /// From a `scontrol show job` record (text or JSON: `JobId`, `JobState`,
    /// `NodeList`, `CPUs/Task`, `AllocTRES` (`TRES` on 22.05), `RunTime`).
    pub fn from_record(rec: &Row, release: Release) -> JobFacts {
        let get = |k: &str| rec.get(k).map_or("", String::as_str);
        let tres = if rec.contains_key("AllocTRES") { get("AllocTRES") } else { get("TRES") };
        JobFacts {
            job_id: get("JobId").to_owned(),
            state: get("JobState").to_owned(),
            nodes: node_list(get("NodeList")),
            gpus: tres_gpus(tres),
            cpus_per_task: get("CPUs/Task").parse().ok().filter(|n| *n > 0),
            elapsed_s: parse_duration(get("RunTime")),
            release: Some(release),
            steps: None,
        }
    }

    /// From `sacct`'s row of the job (`JobID`, `State`, `NodeList`,
    /// `Elapsed`, and `AllocTRES` where asked for).
    pub fn from_sacct(row: &Row, release: Release) -> JobFacts {
        let get = |k: &str| row.get(k).map_or("", String::as_str);
        JobFacts {
            job_id: get("JobID").to_owned(),
            state: get("State").to_owned(),
            nodes: node_list(get("NodeList")),
            gpus: tres_gpus(get("AllocTRES")),
            cpus_per_task: None,
            elapsed_s: parse_duration(get("Elapsed")),
            release: Some(release),
            steps: None,
        }
    }

    /// The first word of its state.
    pub fn state_word(&self) -> &str {
        self.state.split_whitespace().next().unwrap_or("")
    }

    /// Whether its tasks may still be running (live files are read).
    pub fn running(&self) -> bool {
        let w = self.state_word();
        w == "SUSPENDED" || (is_running_state(w) && !matches!(w, "COMPLETING" | "STAGE_OUT"))
    }
}

fn node_list(list: &str) -> Vec<String> {
    match list.trim() {
        "" | "None assigned" | "(null)" => Vec::new(),
        l => hostlist::expand(l).unwrap_or_default(),
    }
}

/// The GPUs in a TRES string (`cpu=8,mem=64G,node=2,billing=8,gres/gpu=16`):
/// `gres/gpu`, else the sum of the typed `gres/gpu:TYPE`; `Some(0)` for
/// TRES without GPUs; `None` when there are none (`(null)`, empty).
pub fn tres_gpus(tres: &str) -> Option<u32> {
    let tres = tres.trim();
    if tres.is_empty() || tres == "(null)" {
        return None;
    }
    let pairs: Vec<(&str, &str)> = tres.split(',').filter_map(|p| p.split_once('=')).collect();
    if pairs.is_empty() {
        return None;
    }
    let count = |v: &str| v.trim().parse::<u32>().ok();
    if let Some((_, v)) = pairs.iter().find(|(k, _)| *k == "gres/gpu") {
        return count(v);
    }
    Some(pairs.iter().filter(|(k, _)| k.starts_with("gres/gpu:")).filter_map(|(_, v)| count(v)).sum())
}

/// The summaries in a job's `AdminComment` (the site's own words skipped).
pub fn from_admin_comment(text: &str) -> Vec<NodeUsage> {
    gpu_health::usage::parse_all(text)
}

/// One GPU (or MIG device) of the job on one node, as `--json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuRow {
    /// The node.
    pub node: String,
    /// NVML's index of the GPU.
    pub gpu: u32,
    /// The MIG device's index in its GPU, or null.
    pub mig: Option<u32>,
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// Mean utilization in percent; null where NVML does not report it (MIG).
    pub util_mean: Option<f64>,
    /// Highest utilization in percent; null as `util_mean`.
    pub util_max: Option<u32>,
    /// Most memory used, in bytes.
    pub mem_max_bytes: u64,
    /// The GPU's (or MIG device's) memory, in bytes.
    pub mem_total_bytes: u64,
    /// The share of samples it was idle (0 to 1).
    pub idle_fraction: f64,
    /// Samples taken.
    pub samples: u64,
    /// Most compute processes seen at once.
    pub procs_max: u32,
    /// Another job held it too: the figures are the GPU's.
    pub shared: bool,
    /// Energy the GPU used while the job held it, in joules, from NVML's
    /// energy counter (the whole GPU's where `shared`); null where unknown:
    /// a MIG device, a GPU before Volta, an older agent, a job shorter than
    /// two samples.
    pub energy_joules: Option<u64>,
}

impl GpuRow {
    fn new(node: &str, g: &GpuUsage) -> GpuRow {
        GpuRow {
            node: node.to_owned(),
            gpu: g.gpu,
            mig: g.mig,
            uuid: g.uuid.clone(),
            util_mean: g.util_mean,
            util_max: g.util_max,
            mem_max_bytes: g.mem_max_bytes,
            mem_total_bytes: g.mem_total_bytes,
            idle_fraction: (g.idle_fraction() * 1000.0).round() / 1000.0,
            samples: g.samples,
            procs_max: g.procs_max,
            shared: g.shared,
            energy_joules: g.energy_j,
        }
    }

    /// `3`, or `3.1` for a MIG device.
    pub fn label(&self) -> String {
        match self.mig {
            Some(m) => format!("{}.{m}", self.gpu),
            None => self.gpu.to_string(),
        }
    }
}

/// One finding: what was seen, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Its name (`never-used`, `low-util`, ...: see the module docs).
    pub id: &'static str,
    /// What was seen.
    pub what: String,
    /// What to do about it.
    pub fix: String,
}

impl Finding {
    fn new(id: &'static str, what: String, fix: impl Into<String>) -> Finding {
        debug_assert!(FINDINGS.contains(&id), "{id} is not in FINDINGS");
        Finding { id, what, fix: fix.into() }
    }

    /// One line: what, then the fix.
    pub fn line(&self) -> String {
        if self.fix.is_empty() { self.what.clone() } else { format!("{}. {}", self.what, self.fix) }
    }
}

/// A node of the job without a summary, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unread {
    /// The node.
    pub node: String,
    /// Why it has none.
    pub why: String,
}

/// The report: the table and the findings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageReport {
    /// Where the summaries were read.
    pub source: Source,
    /// One row per node and GPU, in the job's node order.
    pub gpus: Vec<GpuRow>,
    /// The job's nodes without a summary.
    pub unread: Vec<Unread>,
    /// The findings, in order.
    pub findings: Vec<Finding>,
    /// For an ended job: the accounting fields the summaries were in
    /// (`AdminComment`, `SystemComment`: the agents write the second where
    /// `sacctmgr` would change the site's text in the first).
    pub kept_in: Vec<String>,
}

/// The energy of a job's GPUs, all nodes together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnergyTotal {
    /// The sum of the rows' energy, in joules.
    pub joules: u64,
    /// Rows with an energy.
    pub gpus: usize,
    /// Rows in all.
    pub of: usize,
    /// Some rows with an energy were shared: their whole GPU's is in the sum.
    pub shared: bool,
}

impl UsageReport {
    /// The energy of the rows that have one; `None` when none has.
    pub fn energy_total(&self) -> Option<EnergyTotal> {
        let known: Vec<&GpuRow> = self.gpus.iter().filter(|g| g.energy_joules.is_some()).collect();
        if known.is_empty() {
            return None;
        }
        Some(EnergyTotal {
            joules: known.iter().filter_map(|g| g.energy_joules).fold(0, u64::saturating_add),
            gpus: known.len(),
            of: self.gpus.len(),
            shared: known.iter().any(|g| g.shared),
        })
    }

    /// Whether no GPU was sampled and the job had none to sample: a job
    /// without GPUs (autopsy says nothing about GPU use then).
    pub fn no_gpus(&self) -> bool {
        self.gpus.is_empty() && self.findings.iter().all(|f| f.id == "no-gpus")
    }
}

/// `3 min`, `41 min`, `2 h 05 min`.
fn minutes(secs: u64) -> String {
    let m = secs.div_ceil(60);
    if m >= 60 { format!("{} h {:02} min", m / 60, m % 60) } else { format!("{m} min") }
}

fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{g:.1} GiB")
}

#[allow(clippy::cast_precision_loss)]
fn share(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// `gpu07 GPU 3`, `gpu07 GPU 2.1`.
fn where_is(node: &str, g: &GpuUsage) -> String {
    format!("{node} GPU {}", g.label())
}

/// GPUs grouped by node: `gpu07 GPUs 4, 5, 6 and 7; gpu08 GPU 0`.
fn by_node(gpus: &[(&str, &GpuUsage)]) -> String {
    let mut nodes: Vec<(&str, Vec<String>)> = Vec::new();
    for (n, g) in gpus {
        match nodes.iter_mut().find(|(m, _)| m == n) {
            Some((_, labels)) => labels.push(g.label()),
            None => nodes.push((n, vec![g.label()])),
        }
    }
    let parts: Vec<String> = nodes
        .iter()
        .map(|(n, labels)| format!("{n} GPU{} {}", if labels.len() > 1 { "s" } else { "" }, list(labels)))
        .collect();
    parts.join("; ")
}

/// Lists names: `a`, `a and b`, `a, b and c`.
fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The report for `job`, from the summaries read from `source`
/// (`nodes`, any order; nodes not of the job are kept too), with
/// `read_error` when reading failed outright (srun could not run on the
/// job's nodes): then nothing was read, and the finding says so.
pub fn report(job: &JobFacts, source: Source, nodes: &[NodeUsage], read_error: Option<&str>) -> UsageReport {
    // The job's node order, then any other node a summary names.
    let mut ordered: Vec<&NodeUsage> = Vec::new();
    for n in &job.nodes {
        ordered.extend(nodes.iter().filter(|u| &u.node == n).take(1));
    }
    for u in nodes {
        if !ordered.iter().any(|o| o.node == u.node) {
            ordered.push(u);
        }
    }
    let gpus: Vec<GpuRow> =
        ordered.iter().flat_map(|u| u.gpus.iter().map(|g| GpuRow::new(&u.node, g))).collect();
    let idle = no_step_nodes(job, &ordered);
    let is_idle: HashSet<&str> = idle.iter().map(String::as_str).collect();
    let unread_why = match source {
        Source::Live => {
            "no live file: the agent there does not sample this job (not running, an older agent, \
             usage_interval = 0), or the job started less than a sample ago"
        }
        Source::AdminComment => "no summary in the job's accounting record (AdminComment or SystemComment)",
    };
    let unread: Vec<Unread> = if read_error.is_some() || ordered.is_empty() {
        Vec::new()
    } else {
        job.nodes
            .iter()
            .filter(|n| !ordered.iter().any(|u| &u.node == *n))
            .map(|n| Unread {
                node: n.clone(),
                why: if is_idle.contains(n.as_str()) { NO_STEP_WHY } else { unread_why }.to_owned(),
            })
            .collect()
    };
    let mut findings: Vec<Finding> = no_step(job, &idle, &ordered).into_iter().collect();
    if ordered.iter().all(|u| u.gpus.is_empty()) {
        findings.insert(0, nothing_recorded(job, source, read_error));
        return UsageReport { source, gpus, unread, findings, kept_in: Vec::new() };
    }
    let unsampled: Vec<String> =
        unread.iter().filter(|u| !is_idle.contains(u.node.as_str())).map(|u| u.node.clone()).collect();
    if !unsampled.is_empty() {
        let fix = match &job.steps {
            Some(StepNodes::Unknown(e)) => format!(
                "the figures are the other nodes' only; a node on which no step ran has none (where the \
                 job's steps ran is not known: {e}); where one ran, an admin can check the agent there \
                 (systemctl status gpu-node-agent)"
            ),
            _ => "the figures are the other nodes' only; an admin can check the agent there \
                  (systemctl status gpu-node-agent)"
                .to_owned(),
        };
        findings.push(Finding::new(
            "not-sampled",
            format!("no summary from {}: {unread_why}", list(&unsampled)),
            fix,
        ));
    }
    // The GPUs of nodes no step ran on are the no-step finding's.
    let ordered: Vec<&NodeUsage> =
        ordered.into_iter().filter(|u| !is_idle.contains(u.node.as_str())).collect();
    let most_samples = ordered.iter().flat_map(|u| &u.gpus).map(|g| g.samples).max().unwrap_or(0);
    let early = source == Source::Live && most_samples < MIN_SAMPLES;
    if early {
        findings.push(Finding::new(
            "early",
            format!("only {most_samples} sample(s) so far: too early to judge the GPUs' use"),
            "ask again in a minute",
        ));
    } else {
        findings.extend(never_used(job, &ordered));
        findings.extend(low_util(job, &ordered));
    }
    findings.extend(idle_stretch(job, &ordered));
    findings.extend(memory_full(&ordered));
    findings.extend(shared(&ordered));
    UsageReport { source, gpus, unread, findings, kept_in: Vec::new() }
}

/// Why a node no step ran on has no summary.
const NO_STEP_WHY: &str =
    "no step ran there: the agent samples a job on a node once a step of it starts there";

/// The job's nodes on which no step ran ([`JobFacts::steps`]) and whose
/// GPUs, where sampled, were never used; none for a job without GPUs.
fn no_step_nodes(job: &JobFacts, nodes: &[&NodeUsage]) -> Vec<String> {
    let Some(StepNodes::Known { idle, .. }) = &job.steps else {
        return Vec::new();
    };
    if job.gpus == Some(0) {
        return Vec::new();
    }
    let used: HashSet<&str> = nodes
        .iter()
        .filter(|u| u.gpus.iter().any(|g| g.samples > 0 && !g.never_used()))
        .map(|u| u.node.as_str())
        .collect();
    idle.iter().filter(|n| !used.contains(n.as_str())).cloned().collect()
}

/// The GPUs on `idle`: each node's in its summary, else the job's GPUs
/// shared evenly among its nodes; `None` when a node's are not known.
fn gpus_on(job: &JobFacts, idle: &[String], nodes: &[&NodeUsage]) -> Option<u64> {
    let per_node = match (job.gpus, u32::try_from(job.nodes.len()).ok()) {
        (Some(g), Some(n)) if n > 0 && g % n == 0 => Some(u64::from(g / n)),
        _ => None,
    };
    let mut sampled: HashMap<&str, u64> = HashMap::new();
    for u in nodes.iter().filter(|u| !u.gpus.is_empty()) {
        sampled.entry(u.node.as_str()).or_insert(u.gpus.len() as u64);
    }
    idle.iter().try_fold(0u64, |sum, n| Some(sum + sampled.get(n.as_str()).copied().or(per_node)?))
}

/// `no-step`: nodes of the job on which no step ran, their GPUs and
/// GPU-hours, and the fix.
fn no_step(job: &JobFacts, idle: &[String], nodes: &[&NodeUsage]) -> Option<Finding> {
    if idle.is_empty() {
        return None;
    }
    let batch = matches!(job.steps, Some(StepNodes::Known { batch: true, .. }));
    let running = job.running();
    let hosts = steps::compress(idle);
    let of = format!("{} of the job's {} nodes", idle.len(), job.nodes.len().max(idle.len()));
    let held = match (gpus_on(job, idle, nodes), job.elapsed_s.filter(|s| *s > 0)) {
        (Some(g), Some(s)) => {
            #[allow(clippy::cast_precision_loss)]
            let hours = g as f64 * s as f64 / 3600.0;
            let (gpus, were, have) = if g == 1 {
                ("1 GPU".to_owned(), "was", "has")
            } else {
                (format!("{g} GPUs"), "were", "have")
            };
            if running {
                format!(
                    "their {gpus} {have} been held for {} and not used ({hours:.1} GPU-hours so far)",
                    minutes(s)
                )
            } else {
                format!("their {gpus} {were} held for {} and never used ({hours:.1} GPU-hours)", minutes(s))
            }
        }
        (Some(g), None) => {
            let (gpus, are, were) =
                if g == 1 { ("1 GPU".to_owned(), "is", "was") } else { (format!("{g} GPUs"), "are", "were") };
            if running {
                format!("their {gpus} {are} held and not used")
            } else {
                format!("their {gpus} {were} held and never used")
            }
        }
        (None, _) if running => "their GPUs are held and not used".to_owned(),
        (None, _) => "their GPUs were held and never used".to_owned(),
    };
    let what = if running {
        format!("no step has run on {hosts} ({of}) so far: {held}")
    } else {
        format!("no step ran on {hosts} ({of}): {held}")
    };
    let why = if batch {
        "the batch script runs on the first node only"
    } else {
        "a job's nodes run only what a step (srun) starts there"
    };
    Some(Finding::new(
        "no-step",
        what,
        format!(
            "{why}: start the work on every node with srun (Pattern A, one launcher per node: srun \
             --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=GPUS_PER_NODE ...; \
             Pattern B, one task per GPU: srun --ntasks-per-node=GPUS_PER_NODE --gpus-per-task=1 python \
             train.py), or ask for one node (#SBATCH --nodes=1); spank-gpu lint SCRIPT finds this before you \
             submit (multi-node-no-launcher)"
        ),
    ))
}

/// `not-recorded` (or `no-gpus`): why there is no summary.
fn nothing_recorded(job: &JobFacts, source: Source, read_error: Option<&str>) -> Finding {
    if let Some(e) = read_error {
        return Finding::new(
            "not-recorded",
            format!("the job's nodes could not be read: {e}"),
            "ask again; after the job ends, its GPU use is in its AdminComment (spank-gpu usage JOBID)",
        );
    }
    if job.gpus == Some(0) {
        return Finding::new("no-gpus", "the job has no GPUs: nothing to sample".to_owned(), "");
    }
    if let Some(s) = job.elapsed_s.filter(|s| *s < DEFAULT_INTERVAL_S) {
        let verb = if source == Source::Live { "has run" } else { "ran" };
        return Finding::new(
            "not-recorded",
            format!(
                "no GPU use recorded: the job {verb} {s} s, less than the agent's first sample \
                 (every {DEFAULT_INTERVAL_S} s by default)"
            ),
            if source == Source::Live { "ask again in a minute" } else { "" },
        );
    }
    let what = match source {
        Source::Live => {
            "no GPU use recorded: none of the job's nodes has a live file, so no agent samples this job \
             there (the agent is not running, is older than per-job sampling, or the site turned it off \
             with usage_interval = 0)"
        }
        Source::AdminComment => {
            "no GPU use recorded: no node wrote its summary into the job's accounting record \
             (AdminComment or SystemComment: no agent samples on its nodes, the site turned it off with \
             usage_interval = 0 or usage_admin_comment = false, the job ended before the first sample, it \
             ended a moment ago and the agents have not written yet, or accounting could not take it and \
             the agents kept it in their log)"
        }
    };
    let fix = match source {
        Source::Live => "ask your admins whether gpu-node-agent samples per-job GPU use on these nodes",
        Source::AdminComment => {
            "for a job that ended a moment ago, ask again in a minute; otherwise ask your admins whether \
             gpu-node-agent records per-job GPU use (a summary it could not write is in its log on each \
             node: journalctl -u gpu-node-agent | grep 'job=JOBID')"
        }
    };
    Finding::new("not-recorded", what.to_owned(), fix)
}

/// `never-used`: GPUs given to the job that were never busy.
fn never_used(job: &JobFacts, nodes: &[&NodeUsage]) -> Option<Finding> {
    let all: Vec<(&str, &GpuUsage)> =
        nodes.iter().flat_map(|u| u.gpus.iter().map(move |g| (u.node.as_str(), g))).collect();
    let idle: Vec<(&str, &GpuUsage)> = all.iter().filter(|(_, g)| g.never_used()).copied().collect();
    if idle.is_empty() {
        return None;
    }
    let used = all.iter().filter(|(_, g)| g.samples > 0 && !g.never_used()).count();
    let so_far = if job.running() { " so far" } else { "" };
    let total = all.len();
    let shown = by_node(&idle);
    if used == 0 {
        return Some(Finding::new(
            "never-used",
            format!(
                "none of the job's {total} GPUs was ever used{so_far}: your program ran on the CPU ({shown})"
            ),
            "check that it finds the GPUs: in a task, echo $CUDA_VISIBLE_DEVICES and python -c 'import torch; \
             print(torch.cuda.is_available(), torch.cuda.device_count())' (or nvidia-smi); if it does not need \
             them, do not ask for GPUs",
        ));
    }
    Some(Finding::new(
        "never-used",
        format!("{} of {total} GPUs never used{so_far}: your program uses {used} ({shown} idle)", idle.len()),
        "the processes your program starts do not match the GPUs the job has: compare --gpus-per-task / \
         --gpus-per-node with torchrun --nproc-per-node (or your launcher's process count), and check what \
         each task sees (echo $CUDA_VISIBLE_DEVICES, nvidia-smi, torch.cuda.device_count()); or ask only \
         for the GPUs you use",
    ))
}

/// `low-util`: the GPUs the job used, busy less than [`LOW_UTIL_PCT`] % on average.
fn low_util(job: &JobFacts, nodes: &[&NodeUsage]) -> Option<Finding> {
    let means: Vec<f64> = nodes
        .iter()
        .flat_map(|u| &u.gpus)
        .filter(|g| !g.never_used() && g.samples > 0)
        .filter_map(|g| g.util_mean)
        .collect();
    if means.is_empty() {
        return None;
    }
    #[allow(clippy::cast_precision_loss)]
    let mean = means.iter().sum::<f64>() / means.len() as f64;
    if mean >= LOW_UTIL_PCT {
        return None;
    }
    let what = format!(
        "low GPU utilization: the GPUs it used were busy {mean:.0} % of the time on average (below {LOW_UTIL_PCT:.0} %)"
    );
    let inherits = job.release.map(|r| r.has(Feature::SrunReadsSlurmCpusPerTask));
    let release = job.release.map_or_else(String::new, |r| format!("{}.{:02}", r.major, r.minor));
    let fix = match (job.cpus_per_task, inherits) {
        (Some(1), Some(false)) => format!(
            "the job has 1 CPU per task, so its data loaders (DataLoader workers) and preprocessing run on one \
             core and the GPUs wait: ask for more (#SBATCH --cpus-per-task=N) and give them to the step: on \
             Slurm {release} srun does not inherit --cpus-per-task (22.05 to 23.02 read only \
             SRUN_CPUS_PER_TASK), so run srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\", or export \
             SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK in the batch script"
        ),
        (Some(1), _) => "the job has 1 CPU per task, so its data loaders (DataLoader workers) and preprocessing \
             run on one core and the GPUs wait: ask for more (#SBATCH --cpus-per-task=N); srun inherits it \
             through SLURM_CPUS_PER_TASK since Slurm 23.11 (an srun --cpus-per-task of its own still wins), \
             and set num_workers to use them"
            .to_owned(),
        (Some(n), Some(false)) => format!(
            "the job asked for {n} CPUs per task, but on Slurm {release} srun does not inherit --cpus-per-task \
             (22.05 to 23.02 read only SRUN_CPUS_PER_TASK): a step started without it has 1 CPU per task and \
             its data loaders run on one core. Run srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\", or export \
             SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK in the batch script"
        ),
        _ => "the GPUs wait on something else: input (more DataLoader workers, which need CPUs: \
             --cpus-per-task, given to srun too), small batches, or CPU work between steps; a step with 1 CPU \
             per task runs its data loaders on one core. Profile a few steps (torch.profiler, nsys)"
            .to_owned(),
    };
    Some(Finding::new("low-util", what, fix))
}

/// `idle-stretch`: a node whose GPUs were all idle [`LONG_IDLE_S`] or longer
/// at a stretch, while some of them did work.
fn idle_stretch(job: &JobFacts, nodes: &[&NodeUsage]) -> Option<Finding> {
    let long: Vec<&&NodeUsage> = nodes
        .iter()
        .filter(|u| {
            u.longest_idle_s >= LONG_IDLE_S && u.gpus.iter().any(|g| !g.never_used() && g.samples > 0)
        })
        .collect();
    let worst = long.iter().map(|u| u.longest_idle_s).max()?;
    let names: Vec<String> = long.iter().map(|u| u.node.clone()).collect();
    let running = if job.running() { ", while the job runs" } else { "" };
    Some(Finding::new(
        "idle-stretch",
        format!(
            "every GPU on {} was idle for {} at a stretch{running}: a rank may have died or hung, and the others \
             wait in a collective (or a long phase without GPU work: checkpointing, evaluation on the CPU)",
            list(&names),
            minutes(worst)
        ),
        "run the step with srun --kill-on-bad-exit=1, so one dead rank ends it, and give collectives a \
         timeout (torch.distributed.init_process_group(timeout=...), with NCCL's async error handling), so a \
         hung one fails instead of waiting",
    ))
}

/// `memory-full`: GPUs whose memory reached [`MEM_NEAR_FULL`] of its size.
fn memory_full(nodes: &[&NodeUsage]) -> Option<Finding> {
    let full: Vec<String> = nodes
        .iter()
        .flat_map(|u| u.gpus.iter().map(move |g| (u.node.as_str(), g)))
        .filter(|(_, g)| g.mem_total_bytes > 0 && share(g.mem_max_bytes, g.mem_total_bytes) >= MEM_NEAR_FULL)
        .map(|(n, g)| {
            format!(
                "{} ({} of {}, {:.0} %)",
                where_is(n, g),
                gib(g.mem_max_bytes),
                gib(g.mem_total_bytes),
                share(g.mem_max_bytes, g.mem_total_bytes) * 100.0
            )
        })
        .collect();
    if full.is_empty() {
        return None;
    }
    Some(Finding::new(
        "memory-full",
        format!("GPU memory near its limit on {}: out-of-memory risk", list(&full)),
        "a smaller batch, activation checkpointing or more GPUs; PyTorch's caching allocator keeps freed memory \
         reserved, so torch.cuda.max_memory_allocated() tells what the tensors needed",
    ))
}

/// `shared`: GPUs another job held too.
fn shared(nodes: &[&NodeUsage]) -> Option<Finding> {
    let shared: Vec<(&str, &GpuUsage)> = nodes
        .iter()
        .flat_map(|u| u.gpus.iter().filter(|g| g.shared).map(move |g| (u.node.as_str(), g)))
        .collect();
    if shared.is_empty() {
        return None;
    }
    Some(Finding::new(
        "shared",
        format!(
            "{} shared with another job (a shard): the figures are the GPU's, not this job's alone",
            by_node(&shared)
        ),
        "",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::{R22_05, R23_02, R23_11, R26_05};

    const MIB: u64 = 1 << 20;

    fn gpu(index: u32, mean: f64, idle: u64, samples: u64) -> GpuUsage {
        let busy = mean > 0.0;
        GpuUsage {
            gpu: index,
            mig: None,
            uuid: format!("GPU-{index:08}"),
            util_mean: Some(mean),
            util_max: Some(if busy { 99 } else { 0 }),
            mem_max_bytes: if busy { 40_000 * MIB } else { 0 },
            mem_total_bytes: 81_559 * MIB,
            idle_samples: idle,
            samples,
            procs_max: u32::from(busy),
            shared: false,
            energy_j: None,
        }
    }

    fn node(name: &str, gpus: Vec<GpuUsage>) -> NodeUsage {
        NodeUsage { node: name.into(), interval_s: 10, from: 1000, to: 4600, longest_idle_s: 0, gpus }
    }

    fn job(state: &str, nodes: &[&str], release: Release) -> JobFacts {
        JobFacts {
            job_id: "42".into(),
            state: state.into(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            gpus: Some(8),
            cpus_per_task: Some(8),
            elapsed_s: Some(3600),
            release: Some(release),
            steps: None,
        }
    }

    fn ids(r: &UsageReport) -> Vec<&'static str> {
        r.findings.iter().map(|f| f.id).collect()
    }

    fn busy_node(name: &str) -> NodeUsage {
        node(name, (0..4).map(|i| gpu(i, 90.0, 2, 360)).collect())
    }

    #[test]
    fn a_busy_job_has_no_finding() {
        let r = report(
            &job("COMPLETED", &["a", "b"], R26_05),
            Source::AdminComment,
            &[busy_node("b"), busy_node("a")],
            None,
        );
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert_eq!(r.gpus.len(), 8);
        // The job's node order.
        assert_eq!((r.gpus[0].node.as_str(), r.gpus[4].node.as_str()), ("a", "b"));
        assert!((r.gpus[0].idle_fraction - 0.006).abs() < 1e-9, "{:?}", r.gpus[0]);
        assert!(r.unread.is_empty());
    }

    #[test]
    fn gpus_never_used_say_how_many_the_program_uses() {
        let mut u = busy_node("a");
        u.gpus.extend((4..8).map(|i| gpu(i, 0.0, 360, 360)));
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[u], None);
        assert_eq!(ids(&r), ["never-used"]);
        let f = &r.findings[0];
        assert!(
            f.what.starts_with("4 of 8 GPUs never used: your program uses 4 (a GPUs 4, 5, 6 and 7 idle)"),
            "{f:?}"
        );
        assert!(f.fix.contains("--gpus-per-task") && f.fix.contains("torchrun --nproc-per-node"), "{f:?}");
        assert!(f.fix.contains("CUDA_VISIBLE_DEVICES") && f.fix.contains("nvidia-smi"), "{f:?}");
        // None used at all: the program ran on the CPU.
        let none = node("a", (0..2).map(|i| gpu(i, 0.0, 360, 360)).collect());
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[none], None);
        assert!(r.findings[0].what.starts_with("none of the job's 2 GPUs was ever used"), "{:?}", r.findings);
        // Neither the low-use finding nor the idle stretch for GPUs never used.
        assert_eq!(ids(&r), ["never-used"]);
    }

    #[test]
    fn a_gpu_with_a_process_but_no_utilization_was_used() {
        let mut g = gpu(0, 0.0, 360, 360);
        g.procs_max = 1;
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[node("a", vec![g])], None);
        assert!(!ids(&r).contains(&"never-used"), "{:?}", r.findings);
        assert!(ids(&r).contains(&"low-util"), "{:?}", r.findings);
    }

    #[test]
    fn low_utilization_with_one_cpu_per_task_is_the_data_loader_trap_per_release() {
        let slow = || node("a", (0..2).map(|i| gpu(i, 12.0, 100, 360)).collect());
        let mut j = job("COMPLETED", &["a"], R22_05);
        j.cpus_per_task = Some(1);
        let r = report(&j, Source::AdminComment, &[slow()], None);
        assert_eq!(ids(&r), ["low-util"]);
        let f = &r.findings[0];
        assert!(f.what.contains("busy 12 % of the time"), "{f:?}");
        assert!(
            f.fix.contains("1 CPU per task") && f.fix.contains("Slurm 22.05 srun does not inherit"),
            "{f:?}"
        );
        assert!(f.fix.contains("SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"), "{f:?}");
        // 23.11 on: srun inherits it again.
        j.release = Some(R23_11);
        let f = &report(&j, Source::AdminComment, &[slow()], None).findings[0];
        assert!(f.fix.contains("since Slurm 23.11") && !f.fix.contains("does not inherit"), "{f:?}");
        // 8 CPUs per task asked on 23.02: the step may still have had 1.
        j.release = Some(R23_02);
        j.cpus_per_task = Some(8);
        let f = &report(&j, Source::AdminComment, &[slow()], None).findings[0];
        assert!(f.fix.contains("asked for 8 CPUs per task, but on Slurm 23.02"), "{f:?}");
        // And on 26.05 the general causes.
        j.release = Some(R26_05);
        let f = &report(&j, Source::AdminComment, &[slow()], None).findings[0];
        assert!(f.fix.contains("Profile") && !f.fix.contains("SRUN_CPUS_PER_TASK"), "{f:?}");
        // MIG devices report no utilization: no finding from them.
        let mut mig = gpu(0, 0.0, 0, 360);
        (mig.mig, mig.util_mean, mig.util_max, mig.procs_max) = (Some(1), None, None, 1);
        let r = report(&j, Source::AdminComment, &[node("a", vec![mig])], None);
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert_eq!((r.gpus[0].label(), r.gpus[0].util_mean), ("0.1".to_owned(), None));
    }

    #[test]
    fn a_long_idle_stretch_is_a_hung_collective() {
        let mut u = busy_node("a");
        u.longest_idle_s = 41 * 60;
        let r = report(&job("RUNNING", &["a"], R26_05), Source::Live, &[u.clone()], None);
        assert_eq!(ids(&r), ["idle-stretch"]);
        let f = &r.findings[0];
        assert!(f.what.contains("idle for 41 min at a stretch, while the job runs"), "{f:?}");
        assert!(f.fix.contains("--kill-on-bad-exit=1") && f.fix.contains("timeout"), "{f:?}");
        // Under ten minutes: nothing.
        u.longest_idle_s = LONG_IDLE_S - 1;
        assert!(report(&job("RUNNING", &["a"], R26_05), Source::Live, &[u], None).findings.is_empty());
        assert_eq!(minutes(7500), "2 h 05 min");
    }

    #[test]
    fn memory_near_its_limit_is_an_oom_risk() {
        let mut u = busy_node("a");
        u.gpus[2].mem_max_bytes = 80_000 * MIB;
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[u.clone()], None);
        assert_eq!(ids(&r), ["memory-full"]);
        assert!(r.findings[0].what.contains("a GPU 2 (78.1 GiB of 79.6 GiB, 98 %)"), "{:?}", r.findings);
        u.gpus[2].mem_max_bytes = 70_000 * MIB;
        assert!(
            report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[u], None).findings.is_empty()
        );
    }

    #[test]
    fn shared_gpus_are_the_gpus_figures() {
        let mut u = busy_node("a");
        u.gpus[1].shared = true;
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[u], None);
        assert_eq!(ids(&r), ["shared"]);
        assert!(r.findings[0].what.starts_with("a GPU 1 shared with another job"), "{:?}", r.findings);
        assert!(r.gpus[1].shared);
    }

    #[test]
    fn nothing_recorded_says_why() {
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[], None);
        assert_eq!(ids(&r), ["not-recorded"]);
        assert!(
            r.findings[0].what.contains("AdminComment") && r.findings[0].what.contains("usage_interval = 0")
        );
        assert!(r.gpus.is_empty() && r.unread.is_empty() && !r.no_gpus());
        let r = report(&job("RUNNING", &["a", "b"], R26_05), Source::Live, &[], None);
        assert!(r.findings[0].what.contains("none of the job's nodes has a live file"), "{:?}", r.findings);
        // Ended before the first sample.
        let mut j = job("COMPLETED", &["a"], R26_05);
        j.elapsed_s = Some(4);
        let r = report(&j, Source::AdminComment, &[], None);
        assert!(
            r.findings[0].what.contains("ran 4 s, less than the agent's first sample"),
            "{:?}",
            r.findings
        );
        // No GPUs at all.
        j.gpus = Some(0);
        let r = report(&j, Source::AdminComment, &[], None);
        assert_eq!(ids(&r), ["no-gpus"]);
        assert!(r.no_gpus());
        // srun could not run.
        let r = report(
            &job("RUNNING", &["a"], R26_05),
            Source::Live,
            &[],
            Some("srun: error: Unable to create step"),
        );
        assert!(r.findings[0].what.contains("could not be read: srun: error"), "{:?}", r.findings);
        // A summary with no GPU in it is nothing recorded too.
        let r = report(&job("COMPLETED", &["a"], R26_05), Source::AdminComment, &[node("a", vec![])], None);
        assert_eq!(ids(&r), ["not-recorded"]);
    }

    #[test]
    fn a_node_without_a_summary_is_named() {
        let r = report(&job("RUNNING", &["a", "b"], R26_05), Source::Live, &[busy_node("a")], None);
        assert_eq!(ids(&r), ["not-sampled"]);
        assert_eq!(r.unread.len(), 1);
        assert_eq!(r.unread[0].node, "b");
        assert!(r.findings[0].what.starts_with("no summary from b: no live file"), "{:?}", r.findings);
    }

    #[test]
    fn a_running_job_is_judged_after_a_minute() {
        let u = node("a", (0..2).map(|i| gpu(i, 0.0, 2, 2)).collect());
        let r = report(&job("RUNNING", &["a"], R26_05), Source::Live, &[u], None);
        assert_eq!(ids(&r), ["early"]);
        let u = node("a", vec![gpu(0, 80.0, 0, 60), gpu(1, 0.0, 60, 60)]);
        let r = report(&job("RUNNING", &["a"], R26_05), Source::Live, &[u], None);
        assert!(r.findings[0].what.starts_with("1 of 2 GPUs never used so far"), "{:?}", r.findings);
    }

    #[test]
    fn facts_from_the_records() {
        assert_eq!(tres_gpus("cpu=16,mem=64G,node=2,billing=16,gres/gpu=16,gres/gpu:h100=16"), Some(16));
        assert_eq!(tres_gpus("cpu=1,mem=20M,node=1,billing=1"), Some(0));
        assert_eq!(tres_gpus("cpu=2,gres/gpu:a100=2,gres/gpu:1g.10gb=3"), Some(5));
        assert_eq!((tres_gpus("(null)"), tres_gpus("")), (None, None));
        let rec =
            crate::scontrol::parse_job_record(include_str!("../tests/fixtures/jobinfo/22.05/oom.scontrol"))
                .unwrap_or_default();
        let f = JobFacts::from_record(&rec, R22_05);
        assert_eq!((f.job_id.as_str(), f.state.as_str()), ("8", "FAILED"));
        assert_eq!(
            (f.nodes.as_slice(), f.gpus, f.cpus_per_task, f.elapsed_s),
            (&["node1".to_owned()][..], Some(0), Some(1), Some(1))
        );
        assert!(!f.running());
        let row: Row = [
            ("JobID", "9"),
            ("State", "CANCELLED by 0"),
            ("NodeList", "gpu[01-02]"),
            ("Elapsed", "01:00:00"),
            ("AllocTRES", "gres/gpu=16"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let f = JobFacts::from_sacct(&row, R26_05);
        assert_eq!(
            (f.nodes.len(), f.gpus, f.elapsed_s, f.state_word()),
            (2, Some(16), Some(3600), "CANCELLED")
        );
        let running = JobFacts { state: "RUNNING".into(), ..JobFacts::default() };
        assert!(running.running());
        assert!(!JobFacts { state: "COMPLETING".into(), ..JobFacts::default() }.running());
        // A text record whose AdminComment holds two nodes' words among the site's own.
        let (a, b) = (busy_node("gpu01").to_word(), busy_node("gpu02").to_word());
        let line = include_str!("../tests/fixtures/jobinfo/22.05/oom.scontrol").replacen(
            "WorkDir=/work/wt-why16 ",
            &format!("WorkDir=/work/wt-why16 AdminComment=JS1:site words {a} {b} "),
            1,
        );
        let rec = crate::scontrol::parse_job_record(&line).unwrap_or_default();
        let words = from_admin_comment(rec.get("AdminComment").map_or("", String::as_str));
        assert_eq!(words.iter().map(|u| u.node.as_str()).collect::<Vec<_>>(), ["gpu01", "gpu02"]);
        assert_eq!(rec.get("StdErr").map(String::as_str), Some("/tmp/slurm-lab.15986/out/8.out"));
        // Site text around the summaries.
        let text = format!("JS1:abc {} site-note", busy_node("a").to_word());
        assert_eq!(from_admin_comment(&text).len(), 1);
    }

    #[test]
    fn each_row_has_its_energy_in_json_and_the_report_their_total() {
        let mut a = busy_node("a");
        for (g, j) in a.gpus.iter_mut().zip([Some(1_000_000), Some(2_000_000), None, Some(500)]) {
            g.energy_j = j;
        }
        let r =
            report(&job("COMPLETED", &["a", "b"], R26_05), Source::AdminComment, &[a, busy_node("b")], None);
        let v = serde_json::to_value(&r.gpus).unwrap_or_default();
        assert_eq!(v[0]["energy_joules"], 1_000_000);
        assert!(v[2]["energy_joules"].is_null() && v[4]["energy_joules"].is_null(), "unknown: null");
        let total = r.energy_total();
        assert_eq!(total, Some(EnergyTotal { joules: 3_000_500, gpus: 3, of: 8, shared: false }));
        // No energy anywhere (older agents, MIG devices): no total.
        let r = report(&job("COMPLETED", &["b"], R26_05), Source::AdminComment, &[busy_node("b")], None);
        assert_eq!(r.energy_total(), None);
        // The word to the row.
        let mut c = busy_node("c");
        c.gpus[0].energy_j = Some(42);
        c.gpus[0].shared = true;
        let back = from_admin_comment(&format!("site {}", c.to_word()));
        let r = report(&job("COMPLETED", &["c"], R26_05), Source::AdminComment, &back, None);
        assert_eq!((r.gpus[0].energy_joules, r.gpus[1].energy_joules), (Some(42), None));
        assert!(r.energy_total().is_some_and(|t| t.shared && t.joules == 42));
    }

    /// An 8-node job (`sc1`..`sc8`) of 8 GPUs per node that ran 2 h.
    fn eight_nodes(state: &str, steps: Option<StepNodes>) -> JobFacts {
        let nodes: Vec<String> = (1..=8).map(|i| format!("sc{i}")).collect();
        JobFacts { nodes, gpus: Some(64), elapsed_s: Some(7200), steps, ..job(state, &[], R26_05) }
    }

    fn idle(nodes: &[&str]) -> Option<StepNodes> {
        Some(StepNodes::Known { idle: nodes.iter().map(|n| (*n).to_owned()).collect(), batch: true })
    }

    const SC2_8: [&str; 7] = ["sc2", "sc3", "sc4", "sc5", "sc6", "sc7", "sc8"];

    fn busy8(name: &str) -> NodeUsage {
        node(name, (0..8).map(|i| gpu(i, 90.0, 2, 720)).collect())
    }

    #[test]
    fn nodes_no_step_ran_on_are_named_with_their_gpus_and_gpu_hours() {
        // Ended, the summaries from node 1 only (no prolog ran elsewhere).
        let j = eight_nodes("COMPLETED", idle(&SC2_8));
        let r = report(&j, Source::AdminComment, &[busy8("sc1")], None);
        assert_eq!(ids(&r), ["no-step"], "{:?}", r.findings);
        let f = &r.findings[0];
        assert_eq!(
            f.what,
            "no step ran on sc[2-8] (7 of the job's 8 nodes): their 56 GPUs were held for 2 h 00 min and never \
             used (112.0 GPU-hours)"
        );
        assert!(f.fix.starts_with(
            "the batch script runs on the first node only: start the work on every node with srun"
        ));
        assert!(
            f.fix.contains("torchrun --nnodes=$SLURM_NNODES") && f.fix.contains("multi-node-no-launcher")
        );
        // The nodes are not sent to an admin: their agents never saw the job.
        assert!(!format!("{r:?}").contains("systemctl"), "{r:?}");
        assert_eq!(r.unread.len(), 7);
        assert!(r.unread[0].why.starts_with("no step ran there"), "{:?}", r.unread);
        // Running: so far, live.
        let j = eight_nodes("RUNNING", idle(&SC2_8));
        let r = report(&j, Source::Live, &[busy8("sc1")], None);
        assert_eq!(ids(&r), ["no-step"], "{:?}", r.findings);
        assert!(
            r.findings[0].what.starts_with("no step has run on sc[2-8] (7 of the job's 8 nodes) so far: their 56 GPUs have been held for 2 h 00 min and not used (112.0 GPU-hours so far)"),
            "{:?}",
            r.findings
        );
        // Without the step records, the same summaries are the old not-sampled.
        let r = report(&eight_nodes("COMPLETED", None), Source::AdminComment, &[busy8("sc1")], None);
        assert_eq!(ids(&r), ["not-sampled"]);
        // Records that could not be read say so, and send no one away wrongly.
        let j = eight_nodes("RUNNING", Some(StepNodes::Unknown("sacct: error: no database".into())));
        let r = report(&j, Source::Live, &[busy8("sc1")], None);
        assert_eq!(ids(&r), ["not-sampled"]);
        assert!(r.findings[0].fix.contains("where the job's steps ran is not known: sacct: error"), "{r:?}");
    }

    #[test]
    fn a_job_with_a_step_on_every_node_has_no_such_finding() {
        let j = eight_nodes("COMPLETED", idle(&[]));
        let all: Vec<NodeUsage> = (1..=8).map(|i| busy8(&format!("sc{i}"))).collect();
        assert!(report(&j, Source::AdminComment, &all, None).findings.is_empty());
        // A step on every node, node 8's agent silent: that one is the agent's.
        let r = report(&j, Source::AdminComment, &all[..7], None);
        assert_eq!(ids(&r), ["not-sampled"]);
        assert!(r.findings[0].fix.contains("systemctl status gpu-node-agent"));
    }

    #[test]
    fn with_prolog_at_allocation_the_idle_nodes_gpus_are_no_steps_not_never_used() {
        // PrologFlags=Alloc (or usage's own read): every node sampled, nodes 2-8 idle.
        let mut summaries = vec![busy8("sc1")];
        summaries.extend(SC2_8.iter().map(|n| node(n, (0..8).map(|i| gpu(i, 0.0, 720, 720)).collect())));
        let r = report(&eight_nodes("COMPLETED", idle(&SC2_8)), Source::AdminComment, &summaries, None);
        assert_eq!(ids(&r), ["no-step"], "{:?}", r.findings);
        assert!(r.findings[0].what.contains("their 56 GPUs"), "{:?}", r.findings);
        assert_eq!(r.gpus.len(), 64);
        // A node without a step whose GPUs were used (work started some other way) is not named;
        // never-used stays for nodes where steps ran.
        summaries[1] = busy8("sc2");
        summaries[0].gpus[7] = gpu(7, 0.0, 720, 720);
        let r = report(&eight_nodes("COMPLETED", idle(&SC2_8)), Source::AdminComment, &summaries, None);
        assert_eq!(ids(&r), ["no-step", "never-used"], "{:?}", r.findings);
        assert!(r.findings[0].what.starts_with("no step ran on sc[3-8] (6 of"), "{:?}", r.findings);
        assert!(r.findings[1].what.starts_with("1 of 16 GPUs never used"), "{:?}", r.findings);
    }

    #[test]
    fn no_step_without_summaries_or_an_even_share_of_gpus() {
        // Nothing sampled anywhere: not-recorded first, and the idle nodes still named.
        let r = report(&eight_nodes("COMPLETED", idle(&SC2_8)), Source::AdminComment, &[], None);
        assert_eq!(ids(&r), ["not-recorded", "no-step"], "{:?}", r.findings);
        // 12 GPUs on 8 nodes: each node's count is not known, so no number.
        let mut j = eight_nodes("COMPLETED", idle(&["sc8"]));
        j.gpus = Some(12);
        let r = report(&j, Source::AdminComment, &[busy8("sc1")], None);
        assert!(
            r.findings[0].what.ends_with("(1 of the job's 8 nodes): their GPUs were held and never used"),
            "{:?}",
            r.findings
        );
        // A job without GPUs: nothing about GPUs.
        j.gpus = Some(0);
        assert!(report(&j, Source::AdminComment, &[], None).no_gpus());
        // An allocation with no batch step (salloc): no batch script to blame.
        let j = eight_nodes("RUNNING", Some(StepNodes::Known { idle: vec!["sc2".into()], batch: false }));
        let r = report(&j, Source::Live, &[busy8("sc1")], None);
        assert!(
            r.findings[0].fix.starts_with("a job's nodes run only what a step (srun) starts there"),
            "{:?}",
            r.findings
        );
        assert!(r.findings[0].what.contains("their 8 GPUs have been held"), "{:?}", r.findings);
    }

    #[test]
    fn ten_thousand_idle_nodes_are_one_hostlist() {
        let nodes: Vec<String> = (1..=10_000).map(|i| format!("sc{i}")).collect();
        let idle = Some(StepNodes::Known { idle: nodes[1..].to_vec(), batch: true });
        let j = JobFacts {
            nodes,
            gpus: Some(80_000),
            elapsed_s: Some(3600),
            steps: idle,
            ..job("COMPLETED", &[], R26_05)
        };
        let t = std::time::Instant::now();
        let r = report(&j, Source::AdminComment, &[busy8("sc1")], None);
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
        assert_eq!(ids(&r), ["no-step"]);
        assert!(
            r.findings[0]
                .what
                .starts_with("no step ran on sc[2-10000] (9999 of the job's 10000 nodes): their 79992 GPUs"),
            "{:?}",
            r.findings
        );
    }
}
