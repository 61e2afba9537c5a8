//! Records whose epilog never ran, as pure rules: which records are old
//! enough to ask about, which jobs a slurmstepd still runs for (its process
//! title), and what `scontrol -o show job`'s answer says of a job, read so
//! that no text of the job's own can fake an end. The agent's collector
//! (gpu-node-agent's `usage::gc`) does the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

/// The job states after which no process of the job runs anywhere
/// (`job_state_string()` at slurm-22-05-8-1, slurm-24-11-5-1,
/// slurm-26-05-3-1; a state with a flag set prints the flag instead:
/// `COMPLETING`, `REQUEUED`, `STAGE_OUT`, ..., none of which is here).
pub const ENDED: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
];

/// What scontrol says of a job it does not hold (`ESLURM_INVALID_JOB_ID`
/// in src/common/slurm_errno.c, printed by `slurm_perror()` on stderr).
pub const INVALID_JOB: &str = "Invalid job id specified";

/// The records older than `grace` at `now`, each with its write time: a
/// record written in the future (a clock set back) is not old.
pub fn old_records(
    named: &BTreeMap<u32, SystemTime>,
    now: SystemTime,
    grace: Duration,
) -> Vec<(u32, SystemTime)> {
    named
        .iter()
        .filter(|(_, at)| now.duration_since(**at).is_ok_and(|age| age >= grace))
        .map(|(j, at)| (*j, *at))
        .collect()
}

/// Which old records to ask Slurm about now: those of jobs no slurmstepd
/// runs for (`stepd`) and not resting after an earlier answer (`resting`),
/// the oldest first (then by job id), at most `max`.
pub fn candidates(
    old: &[(u32, SystemTime)],
    stepd: &BTreeSet<u32>,
    resting: &BTreeSet<u32>,
    max: usize,
) -> Vec<(u32, SystemTime)> {
    let mut out: Vec<(u32, SystemTime)> =
        old.iter().filter(|(j, _)| !stepd.contains(j) && !resting.contains(j)).copied().collect();
    out.sort_by_key(|(j, at)| (*at, *j));
    out.truncate(max);
    out
}

/// The job a process's command line names when it is a slurmstepd's title
/// (`slurmstepd: [JOBID.STEP]`, `[JOBID]` without a step, 26.05's
/// `[JOBID:namespace]`), else `None`.
pub fn stepd_job(cmdline: &[u8]) -> Option<u32> {
    let rest = cmdline.strip_prefix(b"slurmstepd: [")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if !(1..=10).contains(&digits) || !matches!(rest.get(digits), Some(b'.' | b']' | b':')) {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// The real user id on the `Uid:` line of `/proc/PID/status`.
pub fn status_real_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// What Slurm says of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It has ended: why, in words.
    Ended(String),
    /// It has not (its state).
    Alive(String),
    /// The answer says neither (an error, a timeout, a record that does
    /// not read): why.
    Unknown(String),
}

/// The `JobState` of job `job` in `scontrol -o show job` output, read so
/// that no text of a job's own (its name, comment, command, work
/// directory: printed before and after `JobState`) is ever taken for it.
/// With `-o` scontrol ends each record with one newline, but a job's text
/// may hold newlines too, so where several records follow one another
/// nothing tells where one ends: only an answer of exactly one line (the
/// final newline aside) is read. That line begins with `JobId=JOB` and
/// `JobState=` begins exactly one of its words (Slurm prints it once for
/// every job; a second is the job's own text). Anything else is not read.
///
/// Several records come for a job whose id is an array's (every task of
/// the array) or a heterogeneous job's leader (every component):
/// `pack_one_job` in src/slurmctld/job_mgr.c (slurm-24-11-5-1). Those are
/// not read either: such a record is kept, never collected by mistake.
///
/// # Errors
/// Not exactly one line, or it is not job `job`'s; `JobState` missing,
/// repeated or not a state's name.
pub fn job_state(job: u32, out: &str) -> Result<&str, String> {
    let line = out.strip_suffix('\n').unwrap_or(out);
    if line.trim().is_empty() {
        return Err(format!("no record of job {job} in scontrol's answer"));
    }
    if line.contains('\n') {
        return Err(format!(
            "{} lines in scontrol's answer for job {job}: an array's or a heterogeneous job's records, or a job's own text with a newline",
            line.split('\n').count()
        ));
    }
    if line.split(' ').next() != Some(format!("JobId={job}").as_str()) {
        return Err(format!("scontrol's answer is not job {job}'s record"));
    }
    let states: Vec<&str> = line.split_whitespace().filter_map(|w| w.strip_prefix("JobState=")).collect();
    match states.as_slice() {
        [s] if !s.is_empty() && s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') => Ok(s),
        [s] => Err(format!("JobState '{}' is not a state", slurm_formats::text::clip(s, 40))),
        _ => Err(format!(
            "{} JobState words in job {job}'s record (the job's own text holds one)",
            states.len()
        )),
    }
}
