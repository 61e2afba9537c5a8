//! The machine form, where the release has it: `scontrol show job
//! --json=v0.0.42` and `sacct --json=v0.0.42` (Slurm 24.11 through 26.05,
//! see [`super::release::Feature::DataParserV0042`]), read into the same
//! rows the text forms give (`scontrol`'s and `sacct`'s field names), so the
//! rest of `why`/`autopsy` does not care which form it came from.
//!
//! The answer is read into typed structs (serde's derive): only the fields
//! used here, each from its own key, unknown keys skipped (other releases'
//! additions), missing ones empty. The leaves ([`values`]) read any JSON
//! value in their place, so a release writing a number where another wrote
//! `{"set", "number"}` reads the same; an answer whose objects and lists are
//! not where v0.0.42 puts them is [`JsonError::Syntax`], and the caller asks
//! for the text form instead.
//!
//! **A job's own words are never fields.** The job's name, comment, command,
//! paths, dependency and reason strings the user can set are JSON strings:
//! each is read whole, as one [`values::Text`], into the field its own key
//! names, and never parsed again. A struct field is filled only from its key
//! at its place in the document (`jobs[].name` is `JobName`, a `name` inside
//! any other object is not; serde would also fill a struct from a list by
//! position, but Slurm writes no list in those places, and a job's words are
//! strings, never lists), so no text inside a value, however much it looks
//! like `JobState=RUNNING` or `"job_state":["RUNNING"]`, can become another
//! field; the rows' keys are the constants written below, not words from
//! the answer. The text reader of 22.05 through 23.11
//! ([`super::scontrol`]) has to find the same by where Slurm's own fields
//! are; here serde_json's string decoding does.
//!
//! The encodings are those of src/plugins/data_parser/v0.0.42/parsers.c
//! (the same in slurm-24-11-5-1 and slurm-26-05-3-1): `JOB_INFO` and `JOB`
//! field lists, `UINT32_NO_VAL`/`UINT64_NO_VAL` as `{"set", "infinite",
//! "number"}`, `TIMESTAMP` as a number of seconds, `PROCESS_EXIT_CODE` as
//! `{"status": [...], "return_code": NO_VAL, "signal": {"id": NO_VAL,
//! "name"}}`, `JOB_STATE` as a list of flag names, `JOB_REASON` as the
//! reason's string. Times in `sacct` rows are left as `@SECONDS` for the
//! caller to put in local time ([`epochs`], [`set_times`]), as the text
//! forms print them.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::Row;
use super::release::{Feature, Release};
use slurm_formats::units::format_duration;

use crate::time::format_time;

mod values;

use values::{NoVal, States, Text};

/// Why a JSON answer cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON, or not the object Slurm prints.
    Syntax(String),
    /// Slurm's own `errors` in the answer.
    Slurm(String),
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonError::Syntax(e) => write!(f, "its --json answer does not read: {e}"),
            JsonError::Slurm(e) => write!(f, "{e}"),
        }
    }
}

/// One of Slurm's `errors` (`OPENAPI_ERROR`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SlurmError {
    description: Text,
    error: Text,
}

/// `scontrol show job --json`: the `OPENAPI_JOB_INFO_RESP` fields read.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct JobInfoAnswer {
    jobs: Option<Vec<JobInfo>>,
    errors: Vec<SlurmError>,
}

/// One `JOB_INFO`: the fields `scontrol_row` shows.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct JobInfo {
    job_id: Text,
    array_job_id: NoVal,
    array_task_id: NoVal,
    array_task_string: Text,
    het_job_id: NoVal,
    het_job_offset: NoVal,
    name: Text,
    user_name: Text,
    user_id: Text,
    account: Text,
    job_state: States,
    state_reason: Text,
    state_description: Text,
    dependency: Text,
    exit_code: ExitCode,
    time_limit: NoVal,
    node_count: NoVal,
    required_nodes: Text,
    excluded_nodes: Text,
    nodes: Text,
    batch_flag: Text,
    memory_per_node: NoVal,
    memory_per_cpu: NoVal,
    standard_output: Text,
    standard_error: Text,
    current_working_directory: Text,
    command: Text,
    failed_node: Text,
    partition: Text,
    admin_comment: Text,
    tres_alloc_str: Text,
    cpus_per_task: NoVal,
}

/// A `PROCESS_EXIT_CODE`: `{"status": [...], "return_code": NO_VAL,
/// "signal": {"id": NO_VAL, "name"}}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ExitCode {
    return_code: NoVal,
    signal: Signal,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Signal {
    id: NoVal,
}

/// `sacct --json`: the `OPENAPI_SLURMDBD_JOBS_RESP` fields read.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctAnswer {
    jobs: Option<Vec<SacctJob>>,
    errors: Vec<SlurmError>,
}

/// One `JOB` of slurmdbd.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctJob {
    job_id: Text,
    array: SacctArray,
    het: SacctHet,
    name: Text,
    user: Text,
    state: SacctState,
    kill_request_user: Text,
    exit_code: ExitCode,
    derived_exit_code: ExitCode,
    time: SacctTime,
    nodes: Text,
    required: SacctRequired,
    working_directory: Text,
    stdout: Text,
    stdout_expanded: Text,
    stderr: Text,
    stderr_expanded: Text,
    steps: Vec<SacctStep>,
    comment: SacctComment,
    tres: SacctTres,
}

/// A slurmdbd job's `comment`: `{"administrator", "job", "system"}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctComment {
    administrator: Text,
}

/// A slurmdbd job's `tres`: `{"allocated": [TRES], "requested": [TRES]}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctTres {
    allocated: Vec<Tres>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctArray {
    job_id: NoVal,
    task_id: NoVal,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctHet {
    job_id: NoVal,
    job_offset: NoVal,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctState {
    current: States,
    reason: Text,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctTime {
    start: NoVal,
    end: NoVal,
    elapsed: NoVal,
    limit: NoVal,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctRequired {
    memory_per_node: NoVal,
    memory_per_cpu: NoVal,
}

/// One `STEP` of a slurmdbd job.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SacctStep {
    step: StepId,
    state: States,
    exit_code: ExitCode,
    time: SacctTime,
    nodes: StepNodes,
    tres: StepTres,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StepId {
    id: Text,
    name: Text,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StepNodes {
    range: Text,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StepTres {
    requested: StepTresRequested,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StepTresRequested {
    max: Vec<Tres>,
}

/// One `TRES` count: `{"type", "name", "id", "count", ...}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Tres {
    r#type: Text,
    name: Text,
    count: NoVal,
}

/// A `TRES` list as `sacct -o AllocTRES` prints it (`cpu=2,mem=20M,gres/gpu=8`):
/// `mem` in MiB, typed ones `TYPE/NAME`, counts below 0 (unset) left out.
fn tres_string(list: &[Tres]) -> String {
    list.iter()
        .filter_map(|t| {
            let n = t.count.number().filter(|n| *n >= 0)?;
            let (kind, name) = (t.r#type.as_str(), t.name.as_str());
            Some(match (kind, name) {
                ("mem", _) => format!("mem={n}M"),
                (_, "") => format!("{kind}={n}"),
                _ => format!("{kind}/{name}={n}"),
            })
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The flags `job_state_string()` (src/common/slurm_protocol_defs.c) shows
/// instead of the base state, in its order. `EXPEDITING` (25.11) has no name
/// in v0.0.42, which shows such a job `REQUEUED`.
const STATE_FLAGS: &[&str] = &[
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "EXPEDITING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
];
const BASE_STATES: &[&str] = &[
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

/// A `JOB_STATE` flag list as `scontrol`/`sacct` print the state.
fn job_state(v: &States) -> String {
    let flags = &v.0;
    let shown = STATE_FLAGS.iter().chain(BASE_STATES).find(|s| flags.iter().any(|f| f == *s));
    shown.map_or_else(|| flags.first().cloned().unwrap_or_default(), |s| (*s).to_owned())
}

/// A `PROCESS_EXIT_CODE` as `STATUS:SIGNAL`.
fn exit_code(v: &ExitCode) -> String {
    let code = v.return_code.number().unwrap_or(0);
    let sig = v.signal.id.number().unwrap_or(0);
    format!("{code}:{sig}")
}

/// Minutes as Slurm's time limit: `1-00:00:00`, `UNLIMITED`, or
/// `unset` when not set.
fn limit(v: NoVal, unset: &str) -> String {
    match v {
        NoVal::Infinite => "UNLIMITED".to_owned(),
        NoVal::Number(m) => format_duration(u64::try_from(m).unwrap_or(0).saturating_mul(60)),
        NoVal::Unset => unset.to_owned(),
    }
}

/// The answer as `T`: a JSON object, with its objects and lists where
/// v0.0.42 has them.
fn parse_answer<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, JsonError> {
    if !text.trim_start().starts_with('{') {
        return Err(JsonError::Syntax("not a JSON object".into()));
    }
    serde_json::from_str(text).map_err(|e| JsonError::Syntax(e.to_string()))
}

/// Slurm's first error in the answer, when it has records of none.
fn slurm_error<T>(jobs: Option<&[T]>, errors: &[SlurmError]) -> Option<JsonError> {
    let first = errors.first()?;
    let text = [first.description.as_str(), first.error.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    jobs.is_none_or(<[T]>::is_empty)
        .then(|| JsonError::Slurm(if text.is_empty() { "Slurm reported an error".into() } else { text }))
}

/// `scontrol show job --json=v0.0.42 JOBID`: one row per job (an array or
/// heterogeneous job gives several), with `scontrol show job -o`'s keys
/// (`JobId`, `JobName`, `UserId`, `JobState`, `Reason`, `Dependency`,
/// `ExitCode`, `TimeLimit`, `NumNodes`, `ReqNodeList`, `NodeList`,
/// `MinMemoryNode`/`MinMemoryCPU`, `StdOut`, `StdErr`, `WorkDir`, `AdminComment`,
/// `AllocTRES`, `CPUs/Task`, ...) and
/// one more, `ReasonCode`: the reason's own string (`Reason` is its
/// description when Slurm has one, underscores for spaces as `scontrol`
/// shows it). No job: no row.
pub fn parse_scontrol_jobs(text: &str) -> Result<Vec<Row>, JsonError> {
    let answer: JobInfoAnswer = parse_answer(text)?;
    if let Some(e) = slurm_error(answer.jobs.as_deref(), &answer.errors) {
        return Err(e);
    }
    Ok(answer.jobs.unwrap_or_default().iter().map(scontrol_row).collect())
}

fn scontrol_row(j: &JobInfo) -> Row {
    let mut r: Row = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        r.insert(k.to_owned(), v);
    };
    put("JobId", j.job_id.0.clone());
    if let Some(a) = j.array_job_id.number().filter(|a| *a != 0) {
        put("ArrayJobId", a.to_string());
        let task = j.array_task_string.or("");
        put(
            "ArrayTaskId",
            if task.is_empty() { j.array_task_id.number().unwrap_or(0).to_string() } else { task },
        );
    }
    if let Some(h) = j.het_job_id.number().filter(|h| *h != 0) {
        put("HetJobId", h.to_string());
        put("HetJobOffset", j.het_job_offset.number().unwrap_or(0).to_string());
    }
    put("JobName", j.name.0.clone());
    put("UserId", format!("{}({})", j.user_name.as_str(), j.user_id.as_str()));
    put("Account", j.account.0.clone());
    put("JobState", job_state(&j.job_state));
    let code = j.state_reason.0.clone();
    let desc = j.state_description.as_str();
    let shown = if desc.trim().is_empty() {
        code.clone()
    } else {
        desc.split_whitespace().collect::<Vec<_>>().join("_")
    };
    put("Reason", shown);
    put("ReasonCode", code);
    put("Dependency", j.dependency.or("(null)"));
    put("ExitCode", exit_code(&j.exit_code));
    put("TimeLimit", limit(j.time_limit, "Partition_Limit"));
    put("NumNodes", j.node_count.number().map_or(String::new(), |n| n.to_string()));
    put("ReqNodeList", j.required_nodes.or("(null)"));
    put("ExcNodeList", j.excluded_nodes.or("(null)"));
    put("NodeList", j.nodes.0.clone());
    put("BatchFlag", j.batch_flag.0.clone());
    for (key, mb) in [("MinMemoryNode", j.memory_per_node), ("MinMemoryCPU", j.memory_per_cpu)] {
        if let Some(mb) = mb.number() {
            put(key, format!("{mb}M"));
        }
    }
    for (key, v) in [
        ("StdOut", &j.standard_output),
        ("StdErr", &j.standard_error),
        ("WorkDir", &j.current_working_directory),
        ("Command", &j.command),
        ("FailedNode", &j.failed_node),
        ("Partition", &j.partition),
        ("AdminComment", &j.admin_comment),
        ("AllocTRES", &j.tres_alloc_str),
    ] {
        put(key, v.0.clone());
    }
    if let Some(n) = j.cpus_per_task.number() {
        put("CPUs/Task", n.to_string());
    }
    r
}

/// `sacct --json=v0.0.42 -j JOBID` on `release`: the rows `sacct -P -o`
/// [`super::sacct_fields`] gives (and the job's `AdminComment` and
/// `AllocTRES`, which `spank-gpu usage` reads), the job's own first, then its steps, with
/// `Start`/`End` as `@SECONDS` (see [`set_times`]). `StdOut`/`StdErr` are
/// the expanded paths, with the `/` that 24.05 through 25.05 leave out
/// between the working directory and a relative path put back.
pub fn parse_sacct_jobs(text: &str, release: Release) -> Result<Vec<Row>, JsonError> {
    let answer: SacctAnswer = parse_answer(text)?;
    if let Some(e) = slurm_error(answer.jobs.as_deref(), &answer.errors) {
        return Err(e);
    }
    let mut rows = Vec::new();
    for j in answer.jobs.unwrap_or_default() {
        rows.push(sacct_job_row(&j, release));
        rows.extend(j.steps.iter().map(sacct_step_row));
    }
    Ok(rows)
}

fn time(v: NoVal) -> String {
    match v.number() {
        Some(t) if t > 0 => format!("@{t}"),
        _ => "Unknown".to_owned(),
    }
}

fn sacct_job_row(j: &SacctJob, release: Release) -> Row {
    let mut r: Row = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        r.insert(k.to_owned(), v);
    };
    let task = j.array.task_id.number();
    let het = j.het.job_offset.number();
    let job_id = match (j.array.job_id.number().filter(|a| *a != 0), task, het) {
        (Some(a), Some(t), _) => format!("{a}_{t}"),
        (_, _, Some(o)) if j.het.job_id.number().is_some_and(|h| h != 0) => {
            format!("{}+{o}", j.het.job_id.number().unwrap_or(0))
        }
        _ => j.job_id.0.clone(),
    };
    put("JobID", job_id);
    put("JobName", j.name.0.clone());
    put("User", j.user.0.clone());
    let state = job_state(&j.state.current);
    let killer = j.kill_request_user.as_str();
    put(
        "State",
        if state == "CANCELLED" && !killer.is_empty() { format!("CANCELLED by {killer}") } else { state },
    );
    put("Reason", j.state.reason.0.clone());
    put("ExitCode", exit_code(&j.exit_code));
    put("DerivedExitCode", exit_code(&j.derived_exit_code));
    put("Start", time(j.time.start));
    put("End", time(j.time.end));
    put("Elapsed", format_duration(u64::try_from(j.time.elapsed.number().unwrap_or(0)).unwrap_or(0)));
    put("Timelimit", limit(j.time.limit, ""));
    put("NodeList", j.nodes.0.clone());
    let mem = match (j.required.memory_per_node.number(), j.required.memory_per_cpu.number()) {
        (Some(n), _) => format!("{n}M"),
        (None, Some(c)) => format!("{c}Mc"),
        _ => String::new(),
    };
    put("ReqMem", mem);
    let work_dir = j.working_directory.as_str();
    for (key, raw, expanded) in
        [("StdOut", &j.stdout, &j.stdout_expanded), ("StdErr", &j.stderr, &j.stderr_expanded)]
    {
        put(key, expanded_path(raw.as_str(), expanded.as_str(), work_dir, release));
    }
    put("WorkDir", work_dir.to_owned());
    put("AdminComment", j.comment.administrator.0.clone());
    put("AllocTRES", tres_string(&j.tres.allocated));
    r
}

fn sacct_step_row(s: &SacctStep) -> Row {
    let mut r: Row = BTreeMap::new();
    r.insert("JobID".into(), s.step.id.0.clone());
    r.insert("JobName".into(), s.step.name.0.clone());
    r.insert("State".into(), job_state(&s.state));
    r.insert("ExitCode".into(), exit_code(&s.exit_code));
    r.insert("Start".into(), time(s.time.start));
    r.insert("End".into(), time(s.time.end));
    r.insert("NodeList".into(), s.nodes.range.0.clone());
    // MaxRSS is the largest memory use among the step's tasks: the `mem`
    // entry of tres/requested/max, in bytes.
    let max = &s.tres.requested.max;
    if let Some(bytes) = max.iter().find(|t| t.r#type.as_str() == "mem").and_then(|t| t.count.number()) {
        r.insert("MaxRSS".into(), format!("{}K", bytes / 1024));
    }
    r
}

/// A job's log path as `sacct --expand-patterns` gives it (`expanded`),
/// with the `/` that `expand_stdio_fields()` of 24.05 through 25.05 drops
/// between the working directory and a relative `raw` path put back.
pub fn expanded_path(raw: &str, expanded: &str, work_dir: &str, release: Release) -> String {
    let relative = !raw.is_empty() && !raw.starts_with('/');
    let glued = release.has(Feature::SacctExpandWithoutSlash)
        && relative
        && !work_dir.is_empty()
        && !work_dir.ends_with('/')
        && expanded.starts_with(work_dir)
        && !expanded[work_dir.len()..].starts_with('/');
    if glued { format!("{work_dir}/{}", &expanded[work_dir.len()..]) } else { expanded.to_owned() }
}

/// The `@SECONDS` times in `rows` (`Start`, `End`), to be put in local time.
pub fn epochs(rows: &[Row]) -> Vec<i64> {
    let mut out: Vec<i64> = rows
        .iter()
        .flat_map(|r| ["Start", "End"].into_iter().filter_map(|k| r.get(k)))
        .filter_map(|v| v.strip_prefix('@')?.parse().ok())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Puts each `@SECONDS` time of `rows` as `local` has it (seconds → Slurm's
/// `YYYY-MM-DDTHH:MM:SS` in local time); one `local` lacks stays as
/// [`format_time`] writes it (UTC).
pub fn set_times(rows: &mut [Row], local: &BTreeMap<i64, String>) {
    for r in rows {
        for k in ["Start", "End"] {
            if let Some(v) = r.get_mut(k) {
                if let Some(t) = v.strip_prefix('@').and_then(|s| s.parse::<i64>().ok()) {
                    *v = local.get(&t).cloned().unwrap_or_else(|| format_time(t));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::{R24_11, R25_11};

    #[test]
    fn states_exits_and_limits() {
        let j = |s: &str| serde_json::from_str::<States>(s).unwrap_or_default();
        assert_eq!(job_state(&j(r#"["PENDING"]"#)), "PENDING");
        assert_eq!(job_state(&j(r#"["RUNNING","COMPLETING"]"#)), "COMPLETING");
        assert_eq!(job_state(&j(r#"["PENDING","REQUEUED"]"#)), "REQUEUED");
        assert_eq!(job_state(&j(r#"["FAILED","LAUNCH_FAILED"]"#)), "FAILED");
        let e = |s: &str| serde_json::from_str::<ExitCode>(s).unwrap_or_default();
        let oom = r#"{"status":["SIGNALED"],"return_code":{"set":false,"infinite":false,"number":0},
                      "signal":{"id":{"set":true,"infinite":false,"number":125},"name":"125"}}"#;
        assert_eq!(exit_code(&e(oom)), "0:125");
        let three = r#"{"status":["ERROR"],"return_code":{"set":true,"infinite":false,"number":3},
                        "signal":{"id":{"set":false,"infinite":false,"number":0},"name":""}}"#;
        assert_eq!(exit_code(&e(three)), "3:0");
        let n = |s: &str| serde_json::from_str::<NoVal>(s).unwrap_or_default();
        assert_eq!(limit(n(r#"{"set":true,"infinite":false,"number":1440}"#), ""), "1-00:00:00");
        assert_eq!(limit(n(r#"{"set":false,"infinite":true,"number":0}"#), ""), "UNLIMITED");
    }

    #[test]
    fn errors_and_junk() {
        assert!(matches!(parse_scontrol_jobs("not json"), Err(JsonError::Syntax(_))));
        assert!(matches!(parse_scontrol_jobs("[1]"), Err(JsonError::Syntax(_))));
        assert_eq!(parse_scontrol_jobs(r#"{"jobs":[],"errors":[]}"#), Ok(Vec::new()));
        let e = r#"{"jobs":[],"errors":[{"description":"","error":"Invalid job id specified","error_number":2017}]}"#;
        assert_eq!(parse_scontrol_jobs(e), Err(JsonError::Slurm("Invalid job id specified".into())));
        assert_eq!(parse_sacct_jobs(r#"{"jobs":[]}"#, R24_11), Ok(Vec::new()));
    }

    #[test]
    fn a_jobs_own_words_are_never_fields() {
        // A name and a comment that spell fields, in text and in JSON (Slurm
        // escapes their quotes), and a `name` at another level.
        let doc = r#"{"jobs":[{"job_id":4,"name":"JobState=RUNNING Reason=None \",\"job_state\":[\"RUNNING\"],\"x\":\"",
            "comment":"\"},{\"job_id\":5,\"name\":\"second\"","job_state":["PENDING"],"state_reason":"JobHeldUser",
            "exit_code":{"name":"evil","signal":{"id":2,"name":"job_state"}},"command":"/bin/x --state_reason=None"}],
            "errors":[]}"#;
        let rows = parse_scontrol_jobs(doc).unwrap_or_default();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = &rows[0];
        assert_eq!(r["JobName"], r#"JobState=RUNNING Reason=None ","job_state":["RUNNING"],"x":""#);
        assert_eq!(
            (r["JobId"].as_str(), r["JobState"].as_str(), r["Reason"].as_str()),
            ("4", "PENDING", "JobHeldUser")
        );
        assert_eq!(r["ExitCode"], "0:2");
        assert_eq!(r["Command"], "/bin/x --state_reason=None");
        assert!(!r.contains_key("comment") && !r.values().any(|v| v == "second" || v == "evil"), "{r:?}");
    }

    #[test]
    fn an_answer_not_shaped_as_v0_0_42_is_not_read() {
        // Objects and lists where Slurm has them, or the text form is asked.
        for doc in [r#"{"jobs":{}}"#, r#"{"jobs":[1]}"#, r#"{"jobs":[{"steps":{}}]}"#, "[]", " "] {
            assert!(matches!(parse_sacct_jobs(doc, R24_11), Err(JsonError::Syntax(_))), "{doc}");
        }
        // Leaves of another type read as none; unknown keys are skipped.
        let doc = r#"{"jobs":[{"job_id":"9","name":{"a":1},"batch_flag":true,"node_count":{"set":true,"number":2.5},
            "time_limit":30,"new_in_27":{"x":[1]},"array_job_id":7,"array_task_id":{"set":true,"number":3}}]}"#;
        let r = &parse_scontrol_jobs(doc).unwrap_or_default()[0];
        assert_eq!((r["JobId"].as_str(), r["JobName"].as_str(), r["BatchFlag"].as_str()), ("9", "", "1"));
        assert_eq!((r["NumNodes"].as_str(), r["TimeLimit"].as_str()), ("", "00:30:00"));
        assert_eq!((r["ArrayJobId"].as_str(), r["ArrayTaskId"].as_str()), ("7", "3"));
    }

    #[test]
    fn admin_comment_tres_and_cpus_per_task() {
        let doc = r#"{"jobs":[{"job_id":5,"job_state":["RUNNING"],"admin_comment":"JS1:x sgu1;node=a",
            "tres_alloc_str":"cpu=16,mem=64G,node=2,billing=16,gres/gpu=16",
            "cpus_per_task":{"set":true,"infinite":false,"number":8}}]}"#;
        let r = &parse_scontrol_jobs(doc).unwrap_or_default()[0];
        assert_eq!(r["AdminComment"], "JS1:x sgu1;node=a");
        assert_eq!(
            (r["AllocTRES"].as_str(), r["CPUs/Task"].as_str()),
            ("cpu=16,mem=64G,node=2,billing=16,gres/gpu=16", "8")
        );
        let doc = r#"{"jobs":[{"job_id":5,"comment":{"administrator":"sgu1;node=a","job":"","system":""},
            "tres":{"allocated":[{"type":"cpu","name":"","id":1,"count":16},{"type":"mem","name":"","id":2,"count":20},
            {"type":"energy","name":"","id":3,"count":-2},{"type":"gres","name":"gpu","id":1001,"count":16}],"requested":[]}}]}"#;
        let r = &parse_sacct_jobs(doc, R24_11).unwrap_or_default()[0];
        assert_eq!(r["AdminComment"], "sgu1;node=a");
        assert_eq!(r["AllocTRES"], "cpu=16,mem=20M,gres/gpu=16");
    }

    #[test]
    fn relative_logs_get_their_slash_back_where_slurm_drops_it() {
        let r = Release::new(24, 11, 5);
        assert_eq!(expanded_path("%x-%j.out", "/home/uwrap-5.out", "/home/u", r), "/home/u/wrap-5.out");
        assert_eq!(expanded_path("/home/u2/x.out", "/home/u2/x.out", "/home/u", r), "/home/u2/x.out");
        assert_eq!(expanded_path("o.out", "/home/u/o.out", "/home/u", R25_11), "/home/u/o.out");
        assert_eq!(expanded_path("", "", "/home/u", r), "");
    }

    #[test]
    fn times_are_put_in_local_time() {
        let mut rows =
            vec![Row::from([("Start".to_owned(), "@100".to_owned()), ("End".into(), "Unknown".into())])];
        assert_eq!(epochs(&rows), [100]);
        set_times(&mut rows, &BTreeMap::from([(100, "1970-01-01T01:01:40".to_owned())]));
        assert_eq!(rows[0]["Start"], "1970-01-01T01:01:40");
        let mut utc = vec![Row::from([("End".to_owned(), "@100".to_owned())])];
        set_times(&mut utc, &BTreeMap::new());
        assert_eq!(utc[0]["End"], "1970-01-01T00:01:40");
    }
}
