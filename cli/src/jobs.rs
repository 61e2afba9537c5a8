//! `spank-gpu why JOBID`, `spank-gpu autopsy JOBID` and `spank-gpu usage
//! JOBID`: the shell around `job_diagnosis`. It runs Slurm's read-only
//! commands as the user (`scontrol show`, `squeue`, `sprio`, `sinfo`,
//! `sacct`, `sacctmgr show`; for `usage` of a running job, `srun --overlap`
//! reading the agent's live files: [`super::gpu_use`]), each with a
//! deadline, and prints the answer in words or as JSON.
//!
//! The Slurm release decides the forms read: `scontrol --version` (the
//! installed client), else the release this was built for. Where the release
//! has data_parser v0.0.42 (24.11 through 26.05), the job's record and its
//! accounting are read as JSON (`scontrol show job --json=v0.0.42`,
//! `sacct --json=v0.0.42`), else as text, read so that the job's own text
//! (its name, command line, paths) is never taken for Slurm's fields.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use job_diagnosis::steps::{self, StepNodes};
use job_diagnosis::usage::{self as gpu_usage, JobFacts, Source, UsageReport};
use job_diagnosis::{
    self as jobinfo, AgentDrain, Blocker, Lookup, NodeEvent, NodeOut, OomKind, PathCheck, Release, Remedy,
    Row,
};
use serde_json::{Value, json};
use slurm_formats::text::printable;

use super::gpu_use;
pub(crate) use super::slurm_cmd::slurm;
use super::slurm_cmd::{ACCOUNTING_DEADLINE, slurm_within};

/// Prints one line of an answer in words, with [`printable`]'s escapes: a
/// job's name, paths, log lines and step ids are its user's text, and must
/// not reach the reader's terminal as escape sequences (an OSC 52 writes the
/// clipboard) or bidi controls (which reorder what is shown).
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{}", printable(&format!($($arg)*)))
    };
}

/// A `--json` answer on one line. serde_json escapes the C0 controls; the
/// rest of [`slurm_formats::text::is_unsafe`] (DEL, C1, bidi controls) is
/// written `\uXXXX` too, which JSON reads back as the same text.
fn json_line(v: &Value) -> String {
    let text = v.to_string();
    if !text.chars().any(slurm_formats::text::is_unsafe) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if slurm_formats::text::is_unsafe(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// How far around a job's run node events are searched.
const EVENT_MARGIN_S: i64 = 300;
/// How much of a job's log is read (its end).
const LOG_TAIL: u64 = 256 * 1024;
/// The `--json` schema version; bumped on any incompatible change.
const SCHEMA: u32 = 1;

/// The Slurm release whose commands answer: `scontrol --version`'s, else
/// the one this was built for (see `Release::pick`).
fn release() -> Release {
    let installed = slurm("scontrol", &["--version"]).ok().and_then(|t| Release::from_version_output(&t));
    Release::pick(installed, Release::from_version_number(slurm_sys::VERSION_NUMBER))
}

/// `scontrol show job JOBID` (JSON where the release has it, else `-o`): the
/// job's record, or `None` when Slurm no longer (or never) had it in memory.
/// Where the JSON form fails (a site without the data_parser plugin), the
/// text form answers: it is read so that the job's own text is never a field.
fn scontrol_job(job: &str, release: Release) -> Result<Option<Row>, String> {
    let json = release.json_parser().map(|parser| {
        slurm("scontrol", &[&format!("--json={parser}"), "show", "job", job]).and_then(|text| {
            jobinfo::parse_scontrol_jobs(&text).map_err(|e| match e {
                jobinfo::JsonError::Slurm(m) => m,
                e => e.to_string(),
            })
        })
    });
    let records = match json {
        Some(Ok(records)) => Ok(records),
        Some(Err(e)) if e.contains("Invalid job id") => Ok(Vec::new()),
        _ => slurm("scontrol", &["show", "job", "-o", job]).and_then(|text| {
            // An array or heterogeneous job prints one line per part.
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    jobinfo::parse_job_record(l).map_err(|e| {
                        format!(
                            "Slurm's record of job {job} cannot be read safely: {e} (text of the job's own, such as \
                             its name, command line or paths, imitates Slurm's fields); see scontrol show job {job}"
                        )
                    })
                })
                .collect()
        }),
    };
    match records {
        Ok(records) => {
            // Take the record of the id asked for, else the first.
            let pick =
                records.iter().position(|r| r.get("JobId").map(String::as_str) == Some(job)).unwrap_or(0);
            Ok(records.into_iter().nth(pick))
        }
        Err(e) if e.contains("Invalid job id") => Ok(None),
        Err(e) if e.starts_with("Slurm's record") => Err(e),
        Err(e) => Err(format!("scontrol show job {job}: {e}")),
    }
}

fn not_found(job: &str) -> String {
    format!(
        "job {job} not found: a wrong id, a job that left Slurm's memory (try spank-gpu autopsy {job}), \
         or another user's job on a site that hides them"
    )
}

fn check_job_id(job: &str) -> Result<(), String> {
    let ok = !job.is_empty()
        && job.len() < 40
        && job.bytes().all(|b| b.is_ascii_digit() || b == b'_' || b == b'+')
        && job.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{}' is not a job id (give a number like 4242 or 4242_7)",
            slurm_formats::text::clip(job, 40)
        ))
    }
}

fn agent_json(a: Option<&AgentDrain>) -> Value {
    a.map_or(
        Value::Null,
        |a| json!({"class": a.class, "gpu": a.gpu, "xid": a.xid, "detail": a.detail, "meaning": a.meaning}),
    )
}

/// The nodes' state and reason, from `sinfo -N`.
fn nodes_out(nodes: &[String]) -> Vec<NodeOut> {
    if nodes.is_empty() {
        return Vec::new();
    }
    let list = nodes.join(",");
    let Ok(text) = slurm("sinfo", &["-h", "-N", "-n", &list, "-o", "%N|%T|%E"]) else { return Vec::new() };
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, '|');
        let (Some(node), Some(state), reason) = (f.next(), f.next(), f.next().unwrap_or("")) else {
            continue;
        };
        if seen.iter().any(|n| n == node) {
            continue;
        }
        seen.push(node.to_owned());
        let reason = if reason == "none" { String::new() } else { reason.to_owned() };
        out.push(NodeOut {
            node: node.to_owned(),
            state: state.to_owned(),
            agent: jobinfo::decode_agent_reason(node, &reason),
            reason,
        });
    }
    out
}

// ----- why ------------------------------------------------------------------------------

pub fn why(job: &str, as_json: bool) -> Result<(), String> {
    check_job_id(job)?;
    let release = release();
    let rec = scontrol_job(job, release)?.ok_or_else(|| not_found(job))?;
    let get = |k: &str| rec.get(k).map(String::as_str).unwrap_or("");
    let w = jobinfo::why(&rec, job, release);
    let job_id = w.job_id.as_str();
    let (state, reason, code, pending) = (&w.state, &w.reason, &w.code, w.pending);
    let (meaning, remedy, action) = (&w.meaning, w.remedy, &w.action);

    // Dependencies, with what became of each job waited for, when Slurm says it failed.
    type Outcome = Result<Option<jobinfo::DependencyJob>, String>;
    let deps: Vec<(&jobinfo::Dependency, Outcome)> = w
        .dependencies
        .iter()
        .map(|d| {
            let outcome = match d.job.as_deref() {
                Some(j) if d.state != "unfulfilled" => dependency_job(j, release),
                _ => Ok(None),
            };
            (d, outcome)
        })
        .collect();
    let start = if pending {
        slurm("squeue", &["-h", "-j", job_id, "--start", "-o", "%S"])
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty() && s != "N/A")
    } else {
        None
    };
    let priority = if pending { sprio(job_id) } else { None };
    let nodes = nodes_out(&w.nodes);
    // The numbers of the limit the reason names (runs nothing for other reasons).
    let limit = super::limits::limit(&rec, &w);
    let advice = if w.wants_advice {
        let past = similar_elapsed(get("UserId").split('(').next().unwrap_or(""), get("JobName"));
        jobinfo::why_advice(&rec, &past)
    } else {
        Vec::new()
    };

    if as_json {
        let v = json!({
            "schema": SCHEMA,
            "slurm": release.to_string(),
            "job_id": job_id,
            "name": get("JobName"),
            "state": state,
            "reason": reason,
            "reason_code": code,
            "reason_enum": w.reason_enum,
            "meaning": meaning,
            "resolves_by": remedy.name(),
            "action": action,
            "expected_start": start,
            "priority": priority.as_ref().map(|p| json!(p)),
            "nodes": nodes.iter().map(|n| json!({
                "node": n.node, "state": n.state, "reason": n.reason, "agent": agent_json(n.agent.as_ref())
            })).collect::<Vec<_>>(),
            "dependencies": deps.iter().map(|(d, outcome)| json!({
                "type": d.kind, "job": d.job, "state": d.state,
                "job_state": outcome.as_ref().ok().and_then(Option::as_ref).map(|o| format!("{} (exit code {})", o.state, o.exit_code))
            })).collect::<Vec<_>>(),
            "advice": advice,
            "limit": super::limits::limit_json(limit.as_ref()),
            "limit_note": super::limits::limit_note(limit.as_ref()),
        });
        println!("{}", json_line(&v));
        return Ok(());
    }

    if !pending {
        if remedy == Remedy::Time {
            say!("job {job_id} ({}) is {state}, not pending: {meaning}", get("JobName"));
            say!("  {action}");
            return Ok(());
        }
        say!("job {job_id} ({}) is {state}, not pending; nothing to wait for", get("JobName"));
        if !jobinfo::is_running_state(state) {
            say!("  why it ended: spank-gpu autopsy {job_id}");
        }
        return Ok(());
    }
    say!("job {job_id} ({}) is PENDING: {reason}", get("JobName"));
    say!("  {meaning}");
    let who = match remedy {
        Remedy::Time => "resolves with time",
        Remedy::User => "needs you",
        Remedy::Admin => "needs an admin",
        Remedy::None => "",
    };
    if who.is_empty() {
        say!("  next: {action}");
    } else {
        say!("  {who}: {action}");
    }
    if let Some(l) = &limit {
        say!("  {}", l.line());
    }
    for (d, outcome) in &deps {
        if let Some(j) = &d.job {
            match (d.state.as_str(), outcome) {
                ("unfulfilled", _) => say!("  waits for job {j} ({}: not done yet)", d.kind),
                (s, Ok(Some(o))) if o.ended() => say!(
                    "  dependency {}:{j} is {s}: job {j} {}, so this job will never start",
                    d.kind,
                    o.words()
                ),
                (s, Ok(Some(o))) => say!("  dependency {}:{j} is {s}: job {j} {}", d.kind, o.words()),
                (s, Err(e)) => {
                    say!("  dependency {}:{j} is {s}: how job {j} ended is not known: {e}", d.kind)
                }
                (s, Ok(None)) => say!("  dependency {}:{j} is {s}", d.kind),
            }
        }
    }
    for n in &nodes {
        match &n.agent {
            Some(a) => say!("  node {} is {}: {} (reason: {})", n.node, n.state, a.meaning, n.reason),
            None if n.reason.is_empty() => say!("  node {} is {}", n.node, n.state),
            None => say!("  node {} is {}: {}", n.node, n.state, n.reason),
        }
    }
    if let Some(s) = &start {
        say!("  expected start (squeue --start): {s}");
    }
    if let Some(p) = &priority {
        let parts: Vec<String> = p.iter().map(|(k, v)| format!("{k} {v}")).collect();
        say!("  priority (sprio): {}", parts.join(", "));
    }
    for a in &advice {
        say!("  advice: {a}");
    }
    Ok(())
}

/// `sprio` for one job: component → value; `None` when the site has no
/// multifactor priority or sprio cannot say.
fn sprio(job: &str) -> Option<BTreeMap<String, String>> {
    let text = slurm("sprio", &["-h", "-j", job, "-o", "%Y|%A|%F|%J|%P|%Q|%N"]).ok()?;
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let names = ["total", "age", "fairshare", "jobsize", "partition", "qos", "nice"];
    let map: BTreeMap<String, String> =
        names.iter().zip(line.split('|')).map(|(k, v)| ((*k).to_owned(), v.trim().to_owned())).collect();
    (map.len() == names.len()).then_some(map)
}

/// What became of a job another depends on: Slurm's controller's record
/// while it holds the job (accounting lags behind it: asked first, it said
/// `PENDING` of a job that had failed), else accounting's, asked under
/// [`ACCOUNTING_DEADLINE`] so that a stopped slurmdbd costs seconds. `Ok(None)`:
/// neither knows the job; `Err`: accounting did not answer, in words.
fn dependency_job(job: &str, release: Release) -> Result<Option<jobinfo::DependencyJob>, String> {
    let of = |r: &Row, state: &str, exit: &str| jobinfo::DependencyJob {
        state: r.get(state).cloned().unwrap_or_default(),
        exit_code: r.get(exit).cloned().unwrap_or_default(),
    };
    if let Some(rec) = scontrol_job(job, release).ok().flatten() {
        return Ok(Some(of(&rec, "JobState", "ExitCode")));
    }
    let args = ["-j", job, "-X", "-P", "-o", "JobID,State,ExitCode"];
    let text = slurm_within("sacct", &args, ACCOUNTING_DEADLINE)
        .map_err(|e| format!("accounting did not answer ({e})"))?;
    Ok(jobinfo::parse_parsable(&text).first().map(|r| of(r, "State", "ExitCode")))
}

/// Elapsed seconds of the user's completed jobs of this name in the last 30 days.
fn similar_elapsed(user: &str, name: &str) -> Vec<u64> {
    if user.is_empty() || name.is_empty() {
        return Vec::new();
    }
    let args =
        ["-n", "-P", "-X", "-u", user, "--name", name, "-S", "now-30days", "-s", "CD", "-o", "Elapsed"];
    slurm_within("sacct", &args, ACCOUNTING_DEADLINE)
        .map(|t| t.lines().filter_map(slurm_formats::units::parse_duration).collect())
        .unwrap_or_default()
}

// ----- autopsy --------------------------------------------------------------------------

fn accounting_error(e: &str) -> String {
    format!("cannot read the job's accounting ({e}): is slurmdbd running? Ask an admin if this lasts")
}

pub fn autopsy(job: &str, as_json: bool, log: Option<&Path>) -> Result<(), String> {
    check_job_id(job)?;
    let release = release();
    let rows = sacct_job(job, release)?;
    let rec = scontrol_job(job, release).ok().flatten();
    let mut ended = jobinfo::ended_job(&rows, rec.as_ref()).map_err(|e| match e {
        Lookup::NotFound => format!(
            "job {job} not found in accounting: a wrong id, a job older than the site keeps, or another \
             user's job on a site that hides them"
        ),
        Lookup::NotYetAccounted => {
            format!("job {job} is in Slurm's memory but not in accounting yet: wait a minute and ask again")
        }
        Lookup::NotEnded(word) if jobinfo::is_running_state(&word) || word == "SUSPENDED" => {
            format!("job {job} has not ended: it is {word} (its GPU use so far: spank-gpu usage {job})")
        }
        Lookup::NotEnded(word) => {
            format!("job {job} has not ended: it is {word} (for a pending job: spank-gpu why {job})")
        }
    })?;
    if ended.gpus.is_none() && ended.steps.iter().any(|s| s.get("State").is_some_and(|st| st != "COMPLETED"))
    {
        // The GPUs it held, for the GPU-hours after a first failure (the text
        // form of accounting does not carry its TRES).
        ended.gpus = slurm("sacct", &["-j", job, "-X", "-n", "-P", "-o", "AllocTRES"])
            .ok()
            .and_then(|t| t.lines().find_map(gpu_usage::tres_gpus));
    }
    let ended = ended;
    let get = |k: &str| ended.get(k);
    let job_id = get("JobID");

    // Launch failures: --output/--error paths that cannot be created or written.
    // As root, the job's user's view of its paths (root may write anywhere).
    let as_root = rustix::process::geteuid().is_root();
    let user =
        rec.as_ref().and_then(|r| r.get("UserId")).map_or(get("User"), |u| u.split('(').next().unwrap_or(""));
    let job_user = if as_root { job_user_ids(user, rec.as_ref()) } else { None };
    let ids = if as_root {
        job_user.clone()
    } else {
        fs::read_to_string("/proc/self/status").ok().and_then(|t| jobinfo::ids_from_proc_status(&t))
    };
    let checks: Vec<PathCheck> = ended.output_paths.iter().map(|p| check_path(p, ids.as_ref())).collect();
    let mut missing_dirs: Vec<String> = Vec::new();
    for c in checks.iter().filter(|c| !c.missing.is_empty()) {
        if let Some(d) = Path::new(&c.path).parent().map(|d| d.display().to_string()) {
            if !missing_dirs.contains(&d) {
                missing_dirs.push(d);
            }
        }
    }
    // Hardware: drains and downs of its nodes during its run (and a margin after).
    let hardware: Vec<NodeEvent> = match ended.window(EVENT_MARGIN_S) {
        Some((from, to)) if !ended.nodes.is_empty() => node_events(&ended.nodes, get("Start"), from, to)?,
        _ => Vec::new(),
    };
    // The log, for GPU vs host OOM.
    let log_path = log
        .map(Path::to_path_buf)
        .or_else(|| ended.output_paths.iter().find(|p| Path::new(p).is_file()).map(Into::into));
    // As root: the job's user's file only (a file named with --log may be root's own copy).
    let owners: Option<Vec<u32>> = as_root.then(|| {
        let mut o: Vec<u32> = job_user.iter().map(|(uid, _)| *uid).collect();
        if log.is_some() {
            o.push(0);
        }
        o
    });
    let (log_text, log_refused) = match log_path.as_deref().map(|p| read_tail(p, owners.as_deref())) {
        Some(Ok(t)) => (Some(t), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let mut found = jobinfo::autopsy(&ended, &checks, log_text.as_deref(), &hardware, release);
    // A log not read says why, in one line, and the rest goes on without it.
    found.findings.extend(log_refused);
    if ended.state_word() == "PREEMPTED" {
        found.set_preemption(preemption(job, release));
    }
    // GPU use, from the AdminComment the nodes' agents wrote at the job's end
    // (nothing for a job without GPUs).
    let gpus = ended_usage(job, release, rec.as_ref(), Some(&ended.row));
    let gpu_lines: Vec<String> = if gpus.no_gpus() {
        Vec::new()
    } else {
        gpus.findings.iter().map(gpu_usage::Finding::line).collect()
    };

    if as_json {
        let (status, signal) = ended.exit();
        let v = json!({
            "schema": SCHEMA,
            "slurm": release.to_string(),
            "job_id": job_id,
            "name": get("JobName"),
            "user": get("User"),
            "state": get("State"),
            "exit_code": ended.exit_code,
            "exit": {"status": status, "signal": signal},
            "start": get("Start"),
            "end": get("End"),
            "elapsed": get("Elapsed"),
            "time_limit": get("Timelimit"),
            "nodes": ended.nodes,
            "memory": {"requested_bytes": ended.req_mem, "max_rss_bytes": ended.max_rss},
            "oom": found.oom.map(OomKind::name),
            "missing_dirs": missing_dirs,
            "hardware": hardware.iter().map(|e| json!({
                "node": e.node, "start": e.start, "end": e.end, "state": e.state, "reason": e.reason,
                "agent": agent_json(e.agent.as_ref())
            })).collect::<Vec<_>>(),
            "log": log_path.as_ref().map(|p| p.display().to_string()),
            "findings": found.findings.iter().chain(&gpu_lines).collect::<Vec<_>>(),
            "recipe": found.recipe,
            "gpus": gpu_use::gpus_json(&gpus),
            "first_failure": found.first_failure.as_ref().map(first_failure_json),
            "cause": found.cause.as_ref().map(|c| json!({
                "class": c.class.id(), "line": c.line, "meaning": c.class.meaning(), "fix": c.class.fix()
            })),
            "preemption": found.preemption.as_ref().map(|p| json!({
                "mode": p.mode, "grace_time_s": p.grace_s, "grace_of": p.grace_of,
                "user_signal": p.user_signal, "kill_wait_s": p.kill_wait_s
            })),
        });
        println!("{}", json_line(&v));
        return Ok(());
    }
    say!(
        "job {job_id} ({}) {}, exit code {}, ran {} of {} on {}",
        get("JobName"),
        get("State"),
        ended.exit_code,
        get("Elapsed"),
        get("Timelimit"),
        if ended.nodes.is_empty() { "no node".to_owned() } else { ended.nodes.join(",") }
    );
    for f in &found.findings {
        say!("  {f}");
    }
    let first = jobinfo::first_failure::section(found.first_failure.as_ref(), found.cause.as_ref());
    if !first.is_empty() {
        say!("  {}", if found.first_failure.is_some() { "First failure:" } else { "Cause (from the log):" });
        for line in first {
            say!("    {line}");
        }
    }
    if !gpus.no_gpus() {
        say!("  GPU use (the agents' summaries in the job's {}):", gpu_use::kept_in_words(&gpus));
        for line in gpu_use::table(&gpus) {
            say!("    {line}");
        }
        for f in &gpus.findings {
            for line in gpu_use::finding_lines(f) {
                say!("    {line}");
            }
        }
    }
    if let Some(r) = &found.recipe {
        say!("  checkpoint and requeue before the end, in the batch script:");
        for line in r.lines() {
            say!("    {line}");
        }
    }
    if log_path.is_none() && ended.state_word() != "COMPLETED" {
        say!("  (the job's log is not known or not readable here; pass --log FILE to have it read)");
    }
    Ok(())
}

/// `autopsy --json`'s `first_failure`.
fn first_failure_json(f: &jobinfo::FirstFailure) -> Value {
    let (status, signal) = f.death.codes();
    json!({
        "node": f.node,
        "task": f.task,
        "step": f.step,
        "exit_code": status,
        "signal": signal,
        "how": f.death.words(),
        "at": f.at.as_ref().map(|(t, _)| t),
        "at_from": f.at.as_ref().map(|(_, w)| w.id()),
        "gpu_hours_after": f.gpu_seconds_after.map(jobinfo::first_failure::gpu_hours),
        "others_waited_s": f.others_waited_s,
        "consequences": f.consequences.iter().map(|c| {
            let (status, signal) = c.death.codes();
            json!({
                "nodes": hosts_json(&c.nodes), "node_list": c.nodes, "tasks": c.tasks.ids(JSON_TASKS),
                "task_list": c.tasks.to_string(), "task_count": c.tasks.count(),
                "exit_code": status, "signal": signal, "why": c.why.id()
            })
        }).collect::<Vec<_>>(),
        "more_consequences": f.more_consequences,
    })
}

/// The most task ids and hosts `--json` lists of one consequence (`task_list`
/// and `node_list` say them all, as srun printed them).
const JSON_TASKS: usize = 1024;
const JSON_HOSTS: usize = 64;

/// A hostlist from a job's log as names: all of them up to [`JSON_HOSTS`],
/// else its first (not expanded).
fn hosts_json(list: &str) -> Vec<String> {
    use slurm_formats::hostlist;
    match hostlist::count(list) {
        Ok(n) if n <= JSON_HOSTS => hostlist::expand(list).unwrap_or_default(),
        _ => hostlist::first(list).into_iter().collect(),
    }
}

/// What a preempted job was sent on this cluster: `scontrol show config`
/// (PreemptType, PreemptMode, PreemptParameters, SlurmctldParameters,
/// KillWait), the job's QoS and partition (`sacct -X -o QOS,Partition`), and
/// their grace time (`sacctmgr show qos` under preempt/qos, `scontrol show
/// partition` under preempt/partition_prio). What cannot be read is said so.
fn preemption(job: &str, release: Release) -> jobinfo::Preemption {
    use jobinfo::preemption as pre;
    let config = match slurm("scontrol", &["show", "config"]) {
        Ok(t) => pre::parse_config(&t),
        Err(e) => {
            return jobinfo::Preemption {
                mode: String::new(),
                grace_s: None,
                grace_of: String::new(),
                user_signal: false,
                kill_wait_s: 0,
                lines: vec![format!(
                    "what it was sent at preemption is not known: the cluster's settings could not be read \
                     (scontrol show config: {e})"
                )],
            };
        }
    };
    let which = slurm("sacct", &["-j", job, "-X", "-n", "-P", "-o", "QOS,Partition"]).unwrap_or_default();
    let line = which.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let (qos, partition) = line.split_once('|').unwrap_or((line, ""));
    let (qos, partition) = (qos.trim(), partition.trim().split(',').next().unwrap_or(""));
    if config.preempt_type.ends_with("partition_prio") && !partition.is_empty() {
        let grace = slurm("scontrol", &["show", "partition", "-o", partition])
            .ok()
            .and_then(|t| pre::parse_partition_grace(&t));
        return pre::preemption(&config, &format!("partition {partition}"), grace, release);
    }
    let grace = (!qos.is_empty())
        .then(|| {
            slurm("sacctmgr", &["-n", "-P", "show", "qos", qos, "format=Name,GraceTime,Preempt,PreemptMode"])
                .ok()
                .and_then(|t| pre::parse_qos_grace(&t, qos))
        })
        .flatten();
    let of = if qos.is_empty() { "its QoS".to_owned() } else { format!("QoS {qos}") };
    pre::preemption(&config, &of, grace, release)
}

// ----- usage ----------------------------------------------------------------------------

/// `spank-gpu usage JOBID`: a running job's GPU use from its nodes' live
/// files; an ended (or completing) job's from its `AdminComment`.
pub fn usage(job: &str, as_json: bool) -> Result<(), String> {
    check_job_id(job)?;
    let release = release();
    let rec = scontrol_job(job, release);
    let (facts, report) = match rec.as_ref().ok().and_then(Option::as_ref) {
        Some(r) => {
            let mut facts = JobFacts::from_record(r, release);
            let word = facts.state_word().to_owned();
            if facts.running() {
                facts.steps = Some(running_steps(job, &facts, r));
                // Slurm's own id: an array task's live file is named by it.
                let id = if facts.job_id.is_empty() { job } else { facts.job_id.as_str() };
                let read = gpu_use::live_read(id, facts.nodes.len());
                let (words, error) = match read {
                    Ok(w) => (w, None),
                    Err(e) => (Vec::new(), Some(e)),
                };
                let report = gpu_usage::report(&facts, Source::Live, &words, error.as_deref());
                (facts, report)
            } else if jobinfo::is_active_state(&word) && !matches!(word.as_str(), "COMPLETING" | "STAGE_OUT")
            {
                return Err(format!(
                    "job {job} has not started: it is {word}, so no GPU was used yet (spank-gpu why {job})"
                ));
            } else {
                let report = ended_usage(job, release, Some(r), None);
                (facts, report)
            }
        }
        None => {
            let rows = sacct_job(job, release).map_err(|e| match &rec {
                Err(r) => format!("{r}; {e}"),
                Ok(_) => e,
            })?;
            let ended = jobinfo::ended_job(&rows, None).map_err(|e| match e {
                Lookup::NotFound | Lookup::NotYetAccounted => format!(
                    "job {job} not found in Slurm's memory or in accounting: a wrong id, a job older than the \
                     site keeps, or another user's job on a site that hides them"
                ),
                Lookup::NotEnded(word) => format!(
                    "job {job} is {word} in accounting but Slurm's controller does not answer for it: ask again"
                ),
            })?;
            let report = ended_usage(job, release, None, Some(&ended.row));
            (JobFacts::from_sacct(&ended.row, release), report)
        }
    };
    if as_json {
        let v = json!({
            "schema": SCHEMA,
            "slurm": release.to_string(),
            "job": facts.job_id,
            "state": facts.state,
            "nodes": facts.nodes,
            "source": report.source.name(),
            "kept_in": report.kept_in,
            "gpus": gpu_use::gpus_json(&report),
            "unread": report.unread,
            "findings": report.findings,
        });
        println!("{}", json_line(&v));
        return Ok(());
    }
    let from = match report.source {
        Source::Live => "live, from its nodes",
        Source::AdminComment => &format!("from its {}", gpu_use::kept_in_words(&report)),
    };
    say!(
        "job {} {}, on {}: GPU use ({from})",
        facts.job_id,
        facts.state,
        if facts.nodes.is_empty() { "no node".to_owned() } else { facts.nodes.join(",") }
    );
    let table = gpu_use::table(&report);
    for line in &table {
        say!("  {line}");
    }
    if report.findings.is_empty() {
        say!("  no finding: its GPUs were used");
    }
    for f in &report.findings {
        for line in gpu_use::finding_lines(f) {
            say!("  {line}");
        }
    }
    Ok(())
}

/// An ended job's GPU use, from its accounting record: slurmctld's copy of
/// the `AdminComment` while it still has the job and a site put summaries
/// there (`rec`), else the job's row in accounting, both comments
/// ([`gpu_use::ended_summaries`]: the agents write the `SystemComment`
/// where `sacctmgr` would change the site's text in the `AdminComment`).
/// `row` is the job's row of `sacct --json`, when the caller has it (its
/// `AllocTRES` gives the GPUs).
fn ended_usage(job: &str, release: Release, rec: Option<&Row>, row: Option<&Row>) -> UsageReport {
    let mut facts = match (rec, row) {
        (Some(r), _) => JobFacts::from_record(r, release),
        (None, Some(r)) => JobFacts::from_sacct(r, release),
        (None, None) => JobFacts::default(),
    };
    // The agents write into the job's row in slurmdbd (slurmctld refuses
    // updates once a job is COMPLETING): both of its comments, read together
    // (a node's summary may be in either). Where accounting does not answer,
    // slurmctld's copy of the AdminComment (or the `sacct --json` row the
    // caller has) holds summaries only where a site put them there.
    let (args, token) = gpu_use::ended_query(job);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (words, kept_in, note) = match slurm("sacct", &args) {
        Ok(out) => {
            let e = gpu_use::ended_summaries(&out, &token, job);
            (e.words, e.from.iter().map(|f| (*f).to_owned()).collect(), e.note)
        }
        Err(e) => {
            let in_record = [rec, row]
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("AdminComment"))
                .map(|t| gpu_usage::from_admin_comment(t))
                .find(|w| !w.is_empty());
            match in_record {
                Some(words) => (words, vec!["AdminComment".to_owned()], None),
                None => (Vec::new(), Vec::new(), Some(format!("accounting: {e}"))),
            }
        }
    };
    let raw = rec.and_then(|r| r.get("JobId")).map(String::as_str);
    facts.steps = Some(steps::ended(&facts.nodes, step_records(job, raw)));
    if facts.gpus.is_none() {
        // The job's own row: `sacct -j A` lists every task of array A.
        let args = ["-j", job, "-X", "--parsable2", "--noheader", "-o", "JobID,AllocTRES"];
        let tres = slurm("sacct", &args).unwrap_or_default();
        let rows: Vec<(&str, &str)> = tres.lines().filter_map(|l| l.split_once('|')).collect();
        let own = rows.iter().find(|(id, _)| *id == job).or_else(|| rows.first());
        facts.gpus = own.and_then(|(_, t)| gpu_usage::tres_gpus(t));
    }
    let mut report = gpu_usage::report(&facts, Source::AdminComment, &words, None);
    report.kept_in = kept_in;
    if let (Some(note), true) = (note, words.is_empty()) {
        if let Some(f) = report.findings.iter_mut().find(|f| f.id == "not-recorded") {
            f.what = format!("{} ({note})", f.what);
        }
    }
    report
}

/// The steps of job `asked` in accounting (`raw`: Slurm's own id of it,
/// where its record gave it), finished and running ([`steps::from_sacct`]).
fn step_records(asked: &str, raw: Option<&str>) -> Result<Vec<steps::Step>, String> {
    let args = ["-j", asked, "-n", "-P", "-o", steps::SACCT_FIELDS];
    slurm_within("sacct", &args, ACCOUNTING_DEADLINE)
        .map_err(|e| format!("accounting: {e}"))
        .and_then(|text| steps::from_sacct(&text, raw, asked))
}

/// Where a running job's steps ran: its step records in accounting, and
/// the steps slurmctld runs now (`squeue -s`: what accounting may not have
/// yet). `rec` is the job's record (its raw id, and `ArrayJobId`/`ArrayTaskId`,
/// by which squeue names an array task's steps).
fn running_steps(asked: &str, facts: &JobFacts, rec: &Row) -> StepNodes {
    let raw = rec.get("JobId").map(String::as_str).filter(|r| !r.is_empty());
    let prefix = match (rec.get("ArrayJobId"), rec.get("ArrayTaskId")) {
        (Some(a), Some(t)) if !a.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => format!("{a}_{t}"),
        _ => raw.unwrap_or(asked).to_owned(),
    };
    let squeue = slurm("squeue", &["-h", "-s", "-j", &prefix, "-o", steps::SQUEUE_FORMAT])
        .map(|text| steps::from_squeue(&text, &prefix))
        .map_err(|e| format!("squeue: {e}"));
    steps::running(&facts.nodes, step_records(asked, raw), squeue)
}

/// `sacctmgr show event` for these nodes from the job's start (`start`, as
/// sacct printed it) until now, kept when they overlap `[from, to]`, and the
/// drains set in that window that `scontrol show node` shows.
fn node_events(nodes: &[String], start: &str, from: i64, to: i64) -> Result<Vec<NodeEvent>, String> {
    let nodes_arg = format!("nodes={}", nodes.join(","));
    let start_arg = format!("start={start}");
    let text = slurm(
        "sacctmgr",
        &["-P", "show", "event", &nodes_arg, &start_arg, "format=NodeName,TimeStart,TimeEnd,State,Reason"],
    )
    .map_err(|e| accounting_error(&e))?;
    let events = jobinfo::parse_events(&text, from, to);
    // A drain of a moment ago may not have reached slurmdbd yet: the nodes'
    // own records have it (a node slurmctld no longer knows adds nothing).
    let now = slurm("scontrol", &["show", "node", "-o", &nodes.join(",")])
        .map(|text| jobinfo::events_from_nodes(&text, from, to))
        .unwrap_or_default();
    Ok(jobinfo::merge_events(events, now))
}

/// The end of the job's log at `path`, at most [`LOG_TAIL`] bytes; `Err`
/// says in words why it was not read. It is opened without blocking (a FIFO
/// or a device in its place would hang the read) and must be a regular file.
/// Run as root (`owners` is `Some`), the path is the user's: it is opened
/// without following a link in its last part and read only when the file
/// belongs to one of `owners` (the job's user; an empty list when that user
/// is not known here), so a user cannot have root read another file for them.
fn read_tail(path: &Path, owners: Option<&[u32]>) -> Result<String, String> {
    use std::fs::OpenOptions;
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let shown = path.display();
    // As root, the path is first opened O_PATH: that opens no device, FIFO or
    // socket (no driver's open runs, nothing blocks), whatever a link in the
    // path's directories was swapped for; only a regular file of the job's
    // user found there is then opened for reading, through that very inode.
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if owners.is_some() {
        flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    }
    // (O_PATH takes no access mode; read(true) is what OpenOptions asks for.)
    let opened = OpenOptions::new().read(true).custom_flags(flags).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            format!("the log {shown} is a symbolic link: not followed as root, not read")
        } else {
            format!("the log {shown} cannot be read: {e}")
        }
    })?;
    let m = opened.metadata().map_err(|e| format!("the log {shown} cannot be read: {e}"))?;
    let t = m.file_type();
    if t.is_symlink() {
        // O_PATH | O_NOFOLLOW opens the link itself.
        return Err(format!("the log {shown} is a symbolic link: not followed as root, not read"));
    }
    if !t.is_file() {
        let kind = if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(format!("the log {shown} is {kind}, not a regular file: not read"));
    }
    match owners {
        Some([]) => {
            return Err(format!(
                "the log {shown} is not read as root: the job's user is not known on this host"
            ));
        }
        Some(owners) if !owners.contains(&m.uid()) => {
            let whose = if owners.len() > 1 || owners[0] != 0 {
                format!("not to the job's user (uid {})", owners[0])
            } else {
                "not to root or the job's user".to_owned()
            };
            return Err(format!("the log {shown} belongs to uid {}, {whose}: not read as root", m.uid()));
        }
        _ => {}
    }
    let mut f = if owners.is_some() {
        // The same inode, now for reading (the magic link names the O_PATH descriptor).
        let fd = std::os::fd::AsRawFd::as_raw_fd(&opened);
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| format!("the log {shown} cannot be read: {e}"))?
    } else {
        opened
    };
    let len = m.len();
    f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL))).map_err(|e| format!("the log {shown}: {e}"))?;
    let mut buf = Vec::new();
    f.take(LOG_TAIL).read_to_end(&mut buf).map_err(|e| format!("the log {shown} cannot be read: {e}"))?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The job's user as `(uid, groups)`, for judging its log paths and owner
/// when run as root: the uid from Slurm's record (`UserId=name(uid)`), else
/// `id -u USER`; the groups from `id -G USER`, else the record's `GroupId`.
fn job_user_ids(user: &str, rec: Option<&Row>) -> Option<(u32, Vec<u32>)> {
    let in_parens = |v: &str| v.rsplit_once('(')?.1.strip_suffix(')')?.parse::<u32>().ok();
    let field = |k: &str| rec.and_then(|r| r.get(k)).and_then(|v| in_parens(v));
    let name_ok = !user.is_empty()
        && !user.starts_with('-')
        && user.len() <= 64
        && user.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-@$".contains(&b));
    let id = |flag: &str| -> Option<Vec<u32>> {
        if !name_ok {
            return None;
        }
        let args = [flag.to_owned(), "--".to_owned(), user.to_owned()];
        let out = super::slurm_cmd::run("id", &args, std::time::Duration::from_secs(5)).ok()?;
        let ids: Vec<u32> = out.stdout.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        (out.status.success() && !ids.is_empty()).then_some(ids)
    };
    let uid = field("UserId").or_else(|| id("-u")?.first().copied())?;
    let gids = id("-G").or_else(|| field("GroupId").map(|g| vec![g])).unwrap_or_default();
    Some((uid, gids))
}

/// The job's accounting rows: `sacct --json` where the release has it (its
/// times put in local time, as the text form prints them), else `sacct -P`
/// with the fields of `jobinfo::sacct_fields` (and `--expand-patterns` where
/// `sacct` knows the log paths).
fn sacct_job(job: &str, release: Release) -> Result<Vec<Row>, String> {
    if let Some(parser) = release.json_parser() {
        let arg = format!("--json={parser}");
        let json = slurm("sacct", &[&arg, "-j", job])
            .and_then(|text| jobinfo::parse_sacct_jobs(&text, release).map_err(|e| e.to_string()));
        // Else (no data_parser plugin, an answer that does not read) the text form.
        if let Ok(mut rows) = json {
            let local = local_times(&jobinfo::json::epochs(&rows));
            jobinfo::json::set_times(&mut rows, &local);
            return Ok(rows);
        }
    }
    let fields = jobinfo::sacct_fields(release);
    let mut args = vec!["-j", job, "-P", "-o", &fields];
    if release.has(jobinfo::Feature::SacctStdPaths) {
        args.push("--expand-patterns");
    }
    let text = slurm("sacct", &args).map_err(|e| accounting_error(&e))?;
    let mut rows = jobinfo::parse_parsable(&text);
    jobinfo::fix_glued_paths(&mut rows, release);
    Ok(rows)
}

/// Seconds since 1970 in this host's local time, as Slurm's commands print
/// times (`YYYY-MM-DDTHH:MM:SS`); empty when the zone cannot be read (the
/// times are then written in UTC).
fn local_times(epochs: &[i64]) -> BTreeMap<i64, String> {
    epochs.iter().filter_map(|&e| Some((e, jobinfo::local_time(e)?))).collect()
}

/// What this host says about a log path, for the user who asks: the
/// directories on the way that do not exist, and what would stop Slurm
/// creating or writing it.
fn check_path(path: &str, ids: Option<&(u32, Vec<u32>)>) -> PathCheck {
    let file = Path::new(path);
    let mut check = PathCheck { path: path.to_owned(), ..PathCheck::default() };
    let mut dir = file.parent();
    while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
        match fs::metadata(d) {
            Ok(m) if m.is_dir() => {
                if let Some((uid, gids)) = ids {
                    // Writing an existing log needs the file's write bit; else creating in `d`.
                    let existing =
                        fs::metadata(file).ok().filter(|f| f.is_file() && check.missing.is_empty());
                    let (target, mode, owner, group) = match &existing {
                        Some(f) => (path.to_owned(), f.mode() | 0o111, f.uid(), f.gid()),
                        None => (d.display().to_string(), m.mode(), m.uid(), m.gid()),
                    };
                    if !jobinfo::may_write(mode, owner, group, *uid, gids) {
                        check.blocker = Some(Blocker::NotWritable(target));
                    }
                }
                break;
            }
            Ok(_) => {
                check.blocker = Some(Blocker::NotADirectory(d.display().to_string()));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                check.missing.insert(0, d.display().to_string());
                dir = d.parent();
            }
            Err(_) => {
                // Not even visible to this user (a parent it cannot search).
                check.blocker = Some(Blocker::NotWritable(d.display().to_string()));
                break;
            }
        }
    }
    check
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use std::os::unix::fs::{chown, symlink};

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("spank-gpu-log-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn as_root_only_the_job_users_regular_file_is_read() {
        let d = dir("root");
        let log = d.join("job.out");
        fs::write(&log, "srun: error: node1: task 0: Exited with exit code 1\n").unwrap();
        let mine = fs::metadata(&log).unwrap().uid();
        assert!(read_tail(&log, Some(&[mine])).unwrap().contains("exit code 1"));
        // Another user's file, or a user not known here.
        let e = read_tail(&log, Some(&[mine + 4242])).unwrap_err();
        assert!(
            e.contains(&format!("belongs to uid {mine}, not to the job's user (uid {})", mine + 4242)),
            "{e}"
        );
        assert!(read_tail(&log, Some(&[])).unwrap_err().contains("user is not known"));
        // A link to a file root can read: not followed as root, followed for a user.
        let link = d.join("link.out");
        symlink("/etc/passwd", &link).unwrap();
        let e = read_tail(&link, Some(&[0])).unwrap_err();
        assert!(e.contains("is a symbolic link: not followed as root"), "{e}");
        assert!(read_tail(&link, None).is_ok());
        // A FIFO with no writer: answered at once, not read.
        let fifo = d.join("fifo.out");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(read_tail(&f, Some(&[0]))).unwrap());
        let e = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("blocked on the FIFO").unwrap_err();
        assert!(e.contains("is a FIFO, not a regular file"), "{e}");
        let e = read_tail(Path::new("/dev/null"), None).unwrap_err();
        assert!(e.contains("is a device"), "{e}");
        assert!(read_tail(&d, Some(&[0])).unwrap_err().contains("is a directory"));
        // Run as root here (CI): a file chowned to another uid is refused for the job's user.
        if rustix::process::geteuid().is_root() {
            chown(&log, Some(4242), None).unwrap();
            assert!(read_tail(&log, Some(&[4242])).is_ok());
            assert!(read_tail(&log, Some(&[1000])).is_err());
        }
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn only_the_end_of_a_big_log_is_read() {
        let d = dir("big");
        let log = d.join("big.out");
        let mut text = "x".repeat(1 << 20);
        text.push_str("\nthe end\n");
        fs::write(&log, &text).unwrap();
        let t = read_tail(&log, None).unwrap();
        assert_eq!(t.len() as u64, LOG_TAIL);
        assert!(t.ends_with("the end\n"));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn json_answers_escape_what_terminals_obey() {
        let v = json!({"name": "a\u{1b}]52;c;AA==\u{7}b\u{202e}c\u{9b}d\u{7f}"});
        let line = json_line(&v);
        assert!(!line.chars().any(slurm_formats::text::is_unsafe), "{line}");
        assert_eq!(line, r#"{"name":"a\u001b]52;c;AA==\u0007b\u202ec\u009bd\u007f"}"#);
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap(), v);
    }
}
