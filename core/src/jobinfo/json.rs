//! The machine form, where the release has it: `scontrol show job
//! --json=v0.0.42` and `sacct --json=v0.0.42` (Slurm 24.11 through 26.05,
//! see [`super::release::Feature::DataParserV0042`]), read into the same
//! rows the text forms give (`scontrol`'s and `sacct`'s field names), so the
//! rest of `why`/`autopsy` does not care which form it came from. No value a
//! user controls can be taken for a field here: JSON says where each ends.
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

use serde_json::Value;

use super::Row;
use super::parse::format_duration;
use super::release::{Feature, Release};

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

/// A `*_NO_VAL` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NoVal {
    Unset,
    Infinite,
    Number(i64),
}

fn no_val(v: &Value) -> NoVal {
    if let Some(n) = v.as_i64() {
        return NoVal::Number(n);
    }
    if v.get("infinite").and_then(Value::as_bool) == Some(true) {
        return NoVal::Infinite;
    }
    match (v.get("set").and_then(Value::as_bool), v.get("number").and_then(Value::as_i64)) {
        (Some(true), Some(n)) => NoVal::Number(n),
        _ => NoVal::Unset,
    }
}

fn number(v: &Value) -> Option<i64> {
    match no_val(v) {
        NoVal::Number(n) => Some(n),
        _ => None,
    }
}

fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('/').fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn string(v: &Value, path: &str) -> String {
    match at(v, path) {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => if *b { "1" } else { "0" }.to_owned(),
        _ => String::new(),
    }
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
fn job_state(v: &Value) -> String {
    let flags: Vec<&str> =
        v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let shown = STATE_FLAGS.iter().chain(BASE_STATES).find(|s| flags.contains(s));
    shown.map_or_else(|| flags.first().map_or(String::new(), |s| (*s).to_owned()), |s| (*s).to_owned())
}

/// A `PROCESS_EXIT_CODE` as `STATUS:SIGNAL`.
fn exit_code(v: &Value) -> String {
    let code = number(at(v, "return_code")).unwrap_or(0);
    let sig = number(at(v, "signal/id")).unwrap_or(0);
    format!("{code}:{sig}")
}

/// Minutes as Slurm's time limit: `1-00:00:00`, `UNLIMITED`, or
/// `unset` when not set.
fn limit(v: &Value, unset: &str) -> String {
    match no_val(v) {
        NoVal::Infinite => "UNLIMITED".to_owned(),
        NoVal::Number(m) => format_duration(u64::try_from(m).unwrap_or(0).saturating_mul(60)),
        NoVal::Unset => unset.to_owned(),
    }
}

fn parse_object(text: &str) -> Result<Value, JsonError> {
    let v: Value = serde_json::from_str(text).map_err(|e| JsonError::Syntax(e.to_string()))?;
    if !v.is_object() {
        return Err(JsonError::Syntax("not an object".into()));
    }
    Ok(v)
}

/// Slurm's first error in the answer, when it has records of none.
fn slurm_error(v: &Value, list: &str) -> Option<JsonError> {
    let empty = v.get(list).and_then(Value::as_array).is_none_or(Vec::is_empty);
    let first = v.get("errors").and_then(Value::as_array).and_then(|e| e.first())?;
    let text = [string(first, "description"), string(first, "error")]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    empty.then(|| JsonError::Slurm(if text.is_empty() { "Slurm reported an error".into() } else { text }))
}

/// `scontrol show job --json=v0.0.42 JOBID`: one row per job (an array or
/// heterogeneous job gives several), with `scontrol show job -o`'s keys
/// (`JobId`, `JobName`, `UserId`, `JobState`, `Reason`, `Dependency`,
/// `ExitCode`, `TimeLimit`, `NumNodes`, `ReqNodeList`, `NodeList`,
/// `MinMemoryNode`/`MinMemoryCPU`, `StdOut`, `StdErr`, `WorkDir`, ...) and
/// one more, `ReasonCode`: the reason's own string (`Reason` is its
/// description when Slurm has one, underscores for spaces as `scontrol`
/// shows it). No job: no row.
pub fn parse_scontrol_jobs(text: &str) -> Result<Vec<Row>, JsonError> {
    let v = parse_object(text)?;
    if let Some(e) = slurm_error(&v, "jobs") {
        return Err(e);
    }
    let jobs = v.get("jobs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    Ok(jobs.iter().map(scontrol_row).collect())
}

fn scontrol_row(j: &Value) -> Row {
    let mut r: Row = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        r.insert(k.to_owned(), v);
    };
    put("JobId", string(j, "job_id"));
    if let Some(a) = number(at(j, "array_job_id")).filter(|a| *a != 0) {
        put("ArrayJobId", a.to_string());
        let task = string(j, "array_task_string");
        put(
            "ArrayTaskId",
            if task.is_empty() { number(at(j, "array_task_id")).unwrap_or(0).to_string() } else { task },
        );
    }
    if let Some(h) = number(at(j, "het_job_id")).filter(|h| *h != 0) {
        put("HetJobId", h.to_string());
        put("HetJobOffset", number(at(j, "het_job_offset")).unwrap_or(0).to_string());
    }
    put("JobName", string(j, "name"));
    put("UserId", format!("{}({})", string(j, "user_name"), string(j, "user_id")));
    put("Account", string(j, "account"));
    put("JobState", job_state(at(j, "job_state")));
    let code = string(j, "state_reason");
    let desc = string(j, "state_description");
    let shown = if desc.trim().is_empty() {
        code.clone()
    } else {
        desc.split_whitespace().collect::<Vec<_>>().join("_")
    };
    put("Reason", shown);
    put("ReasonCode", code);
    let dep = string(j, "dependency");
    put("Dependency", if dep.is_empty() { "(null)".into() } else { dep });
    put("ExitCode", exit_code(at(j, "exit_code")));
    put("TimeLimit", limit(at(j, "time_limit"), "Partition_Limit"));
    put("NumNodes", number(at(j, "node_count")).map_or(String::new(), |n| n.to_string()));
    for (key, path) in [("ReqNodeList", "required_nodes"), ("ExcNodeList", "excluded_nodes")] {
        let v = string(j, path);
        put(key, if v.is_empty() { "(null)".into() } else { v });
    }
    put("NodeList", string(j, "nodes"));
    put("BatchFlag", string(j, "batch_flag"));
    for (key, path) in [("MinMemoryNode", "memory_per_node"), ("MinMemoryCPU", "memory_per_cpu")] {
        if let Some(mb) = number(at(j, path)) {
            put(key, format!("{mb}M"));
        }
    }
    for (key, path) in [
        ("StdOut", "standard_output"),
        ("StdErr", "standard_error"),
        ("WorkDir", "current_working_directory"),
        ("Command", "command"),
        ("FailedNode", "failed_node"),
        ("Partition", "partition"),
    ] {
        put(key, string(j, path));
    }
    r
}

/// `sacct --json=v0.0.42 -j JOBID` on `release`: the rows `sacct -P -o`
/// [`super::sacct_fields`] gives, the job's own first, then its steps, with
/// `Start`/`End` as `@SECONDS` (see [`set_times`]). `StdOut`/`StdErr` are
/// the expanded paths, with the `/` that 24.05 through 25.05 leave out
/// between the working directory and a relative path put back.
pub fn parse_sacct_jobs(text: &str, release: Release) -> Result<Vec<Row>, JsonError> {
    let v = parse_object(text)?;
    if let Some(e) = slurm_error(&v, "jobs") {
        return Err(e);
    }
    let mut rows = Vec::new();
    for j in v.get("jobs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
        rows.push(sacct_job_row(j, release));
        for s in at(j, "steps").as_array().map_or(&[][..], Vec::as_slice) {
            rows.push(sacct_step_row(s));
        }
    }
    Ok(rows)
}

fn time(v: &Value) -> String {
    match number(v) {
        Some(t) if t > 0 => format!("@{t}"),
        _ => "Unknown".to_owned(),
    }
}

fn sacct_job_row(j: &Value, release: Release) -> Row {
    let mut r: Row = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        r.insert(k.to_owned(), v);
    };
    let id = string(j, "job_id");
    let task = number(at(j, "array/task_id"));
    let het = number(at(j, "het/job_offset"));
    let job_id = match (number(at(j, "array/job_id")).filter(|a| *a != 0), task, het) {
        (Some(a), Some(t), _) => format!("{a}_{t}"),
        (_, _, Some(o)) if number(at(j, "het/job_id")).is_some_and(|h| h != 0) => {
            format!("{}+{o}", string(j, "het/job_id"))
        }
        _ => id,
    };
    put("JobID", job_id);
    put("JobName", string(j, "name"));
    put("User", string(j, "user"));
    let state = job_state(at(j, "state/current"));
    let killer = string(j, "kill_request_user");
    put(
        "State",
        if state == "CANCELLED" && !killer.is_empty() { format!("CANCELLED by {killer}") } else { state },
    );
    put("Reason", string(j, "state/reason"));
    put("ExitCode", exit_code(at(j, "exit_code")));
    put("DerivedExitCode", exit_code(at(j, "derived_exit_code")));
    put("Start", time(at(j, "time/start")));
    put("End", time(at(j, "time/end")));
    put("Elapsed", format_duration(u64::try_from(number(at(j, "time/elapsed")).unwrap_or(0)).unwrap_or(0)));
    put("Timelimit", limit(at(j, "time/limit"), ""));
    put("NodeList", string(j, "nodes"));
    let mem = match (number(at(j, "required/memory_per_node")), number(at(j, "required/memory_per_cpu"))) {
        (Some(n), _) => format!("{n}M"),
        (None, Some(c)) => format!("{c}Mc"),
        _ => String::new(),
    };
    put("ReqMem", mem);
    let work_dir = string(j, "working_directory");
    for (key, raw, expanded) in
        [("StdOut", "stdout", "stdout_expanded"), ("StdErr", "stderr", "stderr_expanded")]
    {
        put(key, expanded_path(&string(j, raw), &string(j, expanded), &work_dir, release));
    }
    put("WorkDir", work_dir);
    r
}

fn sacct_step_row(s: &Value) -> Row {
    let mut r: Row = BTreeMap::new();
    r.insert("JobID".into(), string(s, "step/id"));
    r.insert("JobName".into(), string(s, "step/name"));
    r.insert("State".into(), job_state(at(s, "state")));
    r.insert("ExitCode".into(), exit_code(at(s, "exit_code")));
    r.insert("Start".into(), time(at(s, "time/start")));
    r.insert("End".into(), time(at(s, "time/end")));
    r.insert("NodeList".into(), string(s, "nodes/range"));
    // MaxRSS is the largest memory use among the step's tasks: the `mem`
    // entry of tres/requested/max, in bytes.
    let max = at(s, "tres/requested/max").as_array().map_or(&[][..], Vec::as_slice);
    if let Some(bytes) = max.iter().find(|t| string(t, "type") == "mem").and_then(|t| number(at(t, "count")))
    {
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
/// [`super::parse::format_time`] writes it (UTC).
pub fn set_times(rows: &mut [Row], local: &BTreeMap<i64, String>) {
    for r in rows {
        for k in ["Start", "End"] {
            if let Some(v) = r.get_mut(k) {
                if let Some(t) = v.strip_prefix('@').and_then(|s| s.parse::<i64>().ok()) {
                    *v = local.get(&t).cloned().unwrap_or_else(|| super::parse::format_time(t));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobinfo::release::{R24_11, R25_11};

    #[test]
    fn no_vals_states_and_exits() {
        let j = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
        assert_eq!(no_val(&j(r#"{"set":true,"infinite":false,"number":5}"#)), NoVal::Number(5));
        assert_eq!(no_val(&j(r#"{"set":false,"infinite":true,"number":0}"#)), NoVal::Infinite);
        assert_eq!(no_val(&j(r#"{"set":false,"infinite":false,"number":0}"#)), NoVal::Unset);
        assert_eq!(no_val(&j("7")), NoVal::Number(7));
        assert_eq!(job_state(&j(r#"["PENDING"]"#)), "PENDING");
        assert_eq!(job_state(&j(r#"["RUNNING","COMPLETING"]"#)), "COMPLETING");
        assert_eq!(job_state(&j(r#"["PENDING","REQUEUED"]"#)), "REQUEUED");
        assert_eq!(job_state(&j(r#"["FAILED","LAUNCH_FAILED"]"#)), "FAILED");
        let oom = r#"{"status":["SIGNALED"],"return_code":{"set":false,"infinite":false,"number":0},
                      "signal":{"id":{"set":true,"infinite":false,"number":125},"name":"125"}}"#;
        assert_eq!(exit_code(&j(oom)), "0:125");
        let three = r#"{"status":["ERROR"],"return_code":{"set":true,"infinite":false,"number":3},
                        "signal":{"id":{"set":false,"infinite":false,"number":0},"name":""}}"#;
        assert_eq!(exit_code(&j(three)), "3:0");
        assert_eq!(limit(&j(r#"{"set":true,"infinite":false,"number":1440}"#), ""), "1-00:00:00");
        assert_eq!(limit(&j(r#"{"set":false,"infinite":true,"number":0}"#), ""), "UNLIMITED");
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
