//! `scontrol show job -o` records as text (the only form 22.05 through 24.05
//! offer `why`), read so that no value a user controls is ever read as a
//! field.
//!
//! A record is `Key=Value` words joined by spaces, in an order fixed by
//! `_sprint_job_info()` (src/scontrol/info_job.c; `slurm_sprint_job_info()`
//! in src/api/job_info.c through 24.05). Some values are the user's own text
//! and may hold spaces and `Key=Value` words of their own: the job name, the
//! command, `SubmitLine=` (25.11 on: the whole command line), the paths, the
//! comments. [`JOB_KEYS`] lists every key of 22.05 through 26.05 in that
//! order, which values are user text, and which keys every release always
//! prints. The reader ([`parse_job_record`]):
//!
//! 1. takes a word `K=V` as a new field only when `K` comes after the
//!    current field in the print order (a record never goes back), so text
//!    after `JobState=` (`SubmitLine=sbatch --wrap "echo JobState=RUNNING"`)
//!    can never set `JobState`;
//! 2. ends a user-text value only at a key that can follow it: one between
//!    it and the next key that is always printed, that key included;
//! 3. fails ([`RecordError`]) when a key that is always printed is missing,
//!    when a key that cannot follow the current value appears where a value
//!    never holds spaces, or when a key that ends a user-text value appears
//!    twice (so where that text ends is not known).
//!
//! With the order and the always-printed keys right, a record that reads
//! without error reads as Slurm wrote it: user text that imitates Slurm's
//! fields either stays inside its value or makes one of the checks fail.
//! A key a newer Slurm adds (not in [`JOB_KEYS`]) is read after a value that
//! never holds spaces and is absorbed into user text; the guarantee holds
//! for the keys listed.

use std::collections::BTreeMap;
use std::fmt;

use super::Row;
use slurm_formats::hostlist;

/// A key of `scontrol show job`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// `JobState`.
    pub name: &'static str,
    /// Its value is the user's text (may hold spaces and `Key=Value` words).
    pub text: bool,
    /// Every release 22.05 through 26.05 prints it for every job.
    pub always: bool,
}

const fn safe(name: &'static str) -> Key {
    Key { name, text: false, always: false }
}
const fn always(name: &'static str) -> Key {
    Key { name, text: false, always: true }
}
const fn text(name: &'static str) -> Key {
    Key { name, text: true, always: false }
}
const fn text_always(name: &'static str) -> Key {
    Key { name, text: true, always: true }
}

/// Every key `scontrol show job -o` prints in 22.05 through 26.05, in print
/// order (the union of the releases' orders, which agree), from
/// `_sprint_job_info()`/`slurm_sprint_job_info()` at slurm-22-05-8-1,
/// slurm-23-02-8-1, slurm-23-11-11-1, slurm-24-05-8-1, slurm-24-11-5-1,
/// slurm-25-11-7-1 and slurm-26-05-3-1. `Nodes`..`GRES` repeat, once per
/// node set, with `--details`.
pub const JOB_KEYS: &[Key] = &[
    always("JobId"),
    safe("ArrayJobId"),
    safe("ArrayTaskId"),
    safe("ArrayTaskThrottle"),
    safe("HetJobId"),
    safe("HetJobOffset"),
    text_always("JobName"),
    safe("SLUID"),
    safe("HetJobIdSet"),
    always("UserId"),
    always("GroupId"),
    always("MCS_label"),
    always("Priority"),
    always("Nice"),
    always("Account"),
    always("QOS"),
    text("WCKey"),
    always("JobState"),
    always("Reason"),
    safe("FailedNode"),
    always("Dependency"),
    always("Requeue"),
    always("Restarts"),
    always("BatchFlag"),
    always("Reboot"),
    always("ExitCode"),
    safe("DerivedExitCode"),
    always("RunTime"),
    always("TimeLimit"),
    always("TimeMin"),
    always("SubmitTime"),
    always("EligibleTime"),
    always("AccrueTime"),
    safe("ResizeTime"),
    always("StartTime"),
    always("EndTime"),
    always("Deadline"),
    safe("CronJob"),
    text("CrontabSpec"),
    safe("PreemptEligibleTime"),
    safe("PreemptTime"),
    always("SuspendTime"),
    always("SecsPreSuspend"),
    always("LastSchedEval"),
    always("Scheduler"),
    always("Partition"),
    always("AllocNode:Sid"),
    always("ReqNodeList"),
    always("ExcNodeList"),
    always("NodeList"),
    safe("SchedNodeList"),
    text("BatchFeatures"),
    safe("BatchHost"),
    safe("StepMgrEnabled"),
    safe("FedOrigin"),
    safe("FedViableSiblings"),
    safe("FedActiveSiblings"),
    always("NumNodes"),
    always("NumCPUs"),
    always("NumTasks"),
    always("CPUs/Task"),
    always("ReqB:S:C:T"),
    safe("TRES"),
    safe("ReqTRES"),
    safe("AllocTRES"),
    always("Socks/Node"),
    always("NtasksPerN:B:S:C"),
    safe("CoreSpec"),
    safe("ThreadSpec"),
    safe("JOB_GRES"),
    safe("Nodes"),
    safe("CPU_IDs"),
    safe("Mem"),
    safe("GRES"),
    always("MinCPUsNode"),
    safe("MinMemoryNode"),
    safe("MinMemoryCPU"),
    safe("MinMemoryTRES"),
    always("MinTmpDiskNode"),
    safe("MemUpdate"),
    text_always("Features"),
    always("DelayBoot"),
    text("ClusterFeatures"),
    text("Prefer"),
    safe("Reservation"),
    always("OverSubscribe"),
    safe("Exclusive"),
    always("Contiguous"),
    always("Licenses"),
    safe("LicensesAlloc"),
    text_always("Network"),
    text_always("Command"),
    text("SubmitLine"),
    text_always("WorkDir"),
    text("AdminComment"),
    text("SystemComment"),
    text("Comment"),
    text("Extra"),
    text("StdErr"),
    text("StdIn"),
    text("StdOut"),
    safe("SegmentSize"),
    safe("SpreadSegments"),
    safe("ConsolidateSegments"),
    safe("Switches"),
    text("BurstBuffer"),
    text("BurstBufferState"),
    safe("cur_freq"),
    safe("CPU_min_freq"),
    safe("CPU_max_freq"),
    safe("Governor"),
    safe("Power"),
    safe("GresAllowTaskSharing"),
    safe("GresEnforceBind"),
    safe("GresOneTaskPerSharing"),
    safe("KillOInInvalidDependent"),
    safe("KillOnInvalidDependent"),
    safe("SpreadJob"),
    safe("ExpeditedRequeue"),
    safe("OOMKillStep"),
    safe("CpusPerTres"),
    safe("MemPerTres"),
    safe("TresBind"),
    safe("TresFreq"),
    safe("TresPerJob"),
    safe("TresPerNode"),
    safe("TresPerSocket"),
    safe("TresPerTask"),
    text("MailUser"),
    safe("MailType"),
    safe("NtasksPerTRES"),
    text("ContainerType"),
    text("Container"),
    text("ContainerID"),
    text("SELinuxContext"),
    safe("ResvPorts"),
];

/// The keys that repeat once per node set with `--details`.
const REPEATED: (&str, &str) = ("Nodes", "GRES");

/// Why a job record cannot be read safely.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// A key every release prints is missing (or was swallowed by user text).
    Missing(&'static str),
    /// A key appears where it cannot follow (after a value that never holds
    /// spaces): user text imitates Slurm's fields, or the record is cut.
    OutOfOrder(String),
    /// A key that ends a user-text value appears more than once, so where
    /// that text ends is not known.
    Ambiguous(String),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Missing(k) => write!(f, "it has no {k}= field"),
            RecordError::OutOfOrder(k) => write!(f, "{k}= appears out of Slurm's order"),
            RecordError::Ambiguous(k) => {
                write!(f, "{k}= appears more than once, so where the job's own text ends is not known")
            }
        }
    }
}

fn index_of(key: &str) -> Option<usize> {
    JOB_KEYS.iter().position(|k| k.name == key)
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b':' || b == b'_')
}

/// The keys that may follow the user-text key at `i`: every key after it up
/// to the first one that is always printed, that one included.
fn successors(i: usize) -> &'static [Key] {
    let after = &JOB_KEYS[i + 1..];
    let end = after.iter().position(|k| k.always).map_or(after.len(), |p| p + 1);
    &after[..end]
}

/// The field being read.
struct Current {
    key: String,
    /// Its place in [`JOB_KEYS`], `None` for a key this code does not know.
    at: Option<usize>,
}

/// One `scontrol show job -o` line, read as the module says. The values are
/// Slurm's, `Reason` with its underscores.
pub fn parse_job_record(line: &str) -> Result<Row, RecordError> {
    let repeated = (index_of(REPEATED.0), index_of(REPEATED.1));
    let in_repeated = |i: usize| matches!(repeated, (Some(a), Some(b)) if (a..=b).contains(&i));
    let mut row: Row = BTreeMap::new();
    let mut cur: Option<Current> = None;
    // The furthest known key read so far.
    let mut pos: Option<usize> = None;
    // Which user-text fields were read, for the ambiguity check.
    let mut texts: Vec<usize> = Vec::new();
    for word in line.split_whitespace() {
        let kv = word.split_once('=').filter(|(k, _)| valid_key(k));
        let starts = match (kv, &cur) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some((k, _)), Some(c)) => {
                let c_text = c.at.is_none_or(|i| JOB_KEYS[i].text);
                match index_of(k) {
                    // A key this code does not know: a field after a plain value.
                    None => !c_text,
                    Some(j) if pos.is_some_and(|p| j <= p && !(in_repeated(j) && in_repeated(p))) => {
                        if !c_text {
                            return Err(RecordError::OutOfOrder(k.to_owned()));
                        }
                        false
                    }
                    Some(_) => match c.at {
                        Some(i) if JOB_KEYS[i].text => successors(i).iter().any(|s| s.name == k),
                        _ => true,
                    },
                }
            }
        };
        if starts {
            let (k, v) = kv.unwrap_or((word, ""));
            let at = index_of(k);
            if let Some(j) = at {
                pos = Some(pos.map_or(j, |p| p.max(j)));
                if JOB_KEYS[j].text {
                    texts.push(j);
                }
            }
            row.insert(k.to_owned(), v.to_owned());
            cur = Some(Current { key: k.to_owned(), at });
        } else if let Some(v) = cur.as_ref().and_then(|c| row.get_mut(&c.key)) {
            v.push(' ');
            v.push_str(word);
        }
    }
    if let Some(k) = JOB_KEYS.iter().find(|k| k.always && !row.contains_key(k.name)) {
        return Err(RecordError::Missing(k.name));
    }
    // A key that ends user text must end it in one place only.
    for &i in &texts {
        for s in successors(i) {
            let prefix = format!("{}=", s.name);
            if line.split_whitespace().filter(|w| w.starts_with(&prefix)).count() > 1 {
                return Err(RecordError::Ambiguous(s.name.to_owned()));
            }
        }
    }
    Ok(row)
}

/// One `Key=Value` record of another kind (`scontrol show node -o`): a word
/// without `=` belongs to the value before it (values such as `Reason=gpu:
/// xid79 ...` hold spaces). Job records are read with [`parse_job_record`].
pub fn parse_record(line: &str) -> Row {
    let mut out: Row = BTreeMap::new();
    let mut last: Option<String> = None;
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some((k, v)) if valid_key(k) => {
                out.insert(k.to_owned(), v.to_owned());
                last = Some(k.to_owned());
            }
            _ => {
                if let Some(v) = last.as_ref().and_then(|k| out.get_mut(k)) {
                    v.push(' ');
                    v.push_str(word);
                }
            }
        }
    }
    out
}

/// One dependency of a job: `afterok:12(failed)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dependency {
    /// `afterok`, `afterany`, `afternotok`, `after`, `singleton`, ...
    pub kind: String,
    /// The job it waits for (none for `singleton`).
    pub job: Option<String>,
    /// Slurm's word for it: `unfulfilled`, `failed`, ...
    pub state: String,
}

/// The `Dependency=` value of `scontrol show job`: `afterok:12(failed),afterany:13(unfulfilled)`.
pub fn parse_dependencies(value: &str) -> Vec<Dependency> {
    if matches!(value.trim(), "" | "(null)") {
        return Vec::new();
    }
    value
        .split([',', '?'])
        .filter(|s| !s.is_empty())
        .filter_map(|item| {
            let (body, state) = match item.split_once('(') {
                Some((b, s)) => (b, s.trim_end_matches(')')),
                None => (item, ""),
            };
            let mut parts = body.split(':');
            let kind = parts.next()?.to_owned();
            let job = parts.next().map(|j| j.split('+').next().unwrap_or(j).to_owned());
            Some(Dependency { kind, job, state: state.to_owned() })
        })
        .collect()
}

/// The nodes named after `UnavailableNodes:` in a reason (a host list).
pub fn unavailable_nodes(reason: &str) -> Vec<String> {
    let Some(i) = reason.find("UnavailableNodes:") else { return Vec::new() };
    let list = reason[i + "UnavailableNodes:".len()..].split([' ', ')']).next().unwrap_or("");
    hostlist::expand(list.trim_end_matches(',')).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../tests/fixtures/jobinfo/22.05/", $name))
        };
    }

    const HELD: &str = fixture!("held.scontrol");

    #[test]
    fn keys_are_listed_once_and_end_text_at_an_always_printed_key() {
        for (i, k) in JOB_KEYS.iter().enumerate() {
            assert!(!JOB_KEYS[i + 1..].iter().any(|o| o.name == k.name), "{} twice", k.name);
        }
        let names = |i: usize| successors(i).iter().map(|k| k.name).collect::<Vec<_>>();
        assert_eq!(names(index_of("JobName").unwrap_or(0)), ["SLUID", "HetJobIdSet", "UserId"]);
        assert_eq!(names(index_of("Command").unwrap_or(0)), ["SubmitLine", "WorkDir"]);
        assert_eq!(names(index_of("SubmitLine").unwrap_or(0)), ["WorkDir"]);
        assert_eq!(names(index_of("WCKey").unwrap_or(0)), ["JobState"]);
    }

    #[test]
    fn recorded_records_read() {
        for line in [HELD, fixture!("depfail.scontrol"), fixture!("nodir.scontrol"), fixture!("oom.scontrol")]
        {
            let r = parse_job_record(line.trim()).map_err(|e| e.to_string());
            assert!(r.is_ok(), "{r:?}\n{line}");
        }
        let r = parse_job_record(HELD).unwrap_or_default();
        assert_eq!(r.get("JobState").map(String::as_str), Some("PENDING"));
        assert_eq!(r.get("Reason").map(String::as_str), Some("JobHeldUser"));
        assert_eq!(r.get("Power").map(String::as_str), Some(""));
        let res = parse_job_record(fixture!("resources.scontrol")).unwrap_or_default();
        assert_eq!(res.get("TresPerJob").map(String::as_str), Some("gres:gpu:8"));
    }

    fn edit(line: &str, key: &str, value: &str) -> String {
        line.split_whitespace()
            .map(|w| if w.starts_with(&format!("{key}=")) { format!("{key}={value}") } else { w.to_owned() })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The same held job as Slurm 25.11 prints it, with its command line.
    fn with_submit_line(submit: &str) -> String {
        HELD.trim().replace(" WorkDir=", &format!(" SubmitLine={submit} WorkDir="))
    }

    #[test]
    fn user_text_after_the_state_never_sets_it() {
        let line = with_submit_line("sbatch --hold --wrap echo JobState=RUNNING Reason=None");
        let r = parse_job_record(&line).map_err(|e| e.to_string());
        let r = r.unwrap_or_default();
        assert_eq!(r.get("JobState").map(String::as_str), Some("PENDING"));
        assert_eq!(r.get("Reason").map(String::as_str), Some("JobHeldUser"));
        assert_eq!(
            r.get("SubmitLine").map(String::as_str),
            Some("sbatch --hold --wrap echo JobState=RUNNING Reason=None")
        );
        // A path or a comment with Key=Value words: the same.
        let comment = HELD.trim().replace(" StdErr=", " Comment=x JobState=RUNNING ExitCode=0:9 StdErr=");
        let c = parse_job_record(&comment).unwrap_or_default();
        assert_eq!((c["JobState"].as_str(), c["ExitCode"].as_str()), ("PENDING", "0:0"));
        assert_eq!(c.get("Comment").map(String::as_str), Some("x JobState=RUNNING ExitCode=0:9"));
        let out =
            parse_job_record(&edit(HELD, "StdOut", "/tmp/a b/JobState=RUNNING.out")).unwrap_or_default();
        assert_eq!(out["StdOut"], "/tmp/a b/JobState=RUNNING.out");
        assert_eq!(out["JobState"], "PENDING");
    }

    #[test]
    fn a_job_name_with_fields_stays_a_name_or_fails() {
        // Words that are not what follows a name stay in the name.
        let named = edit(HELD, "JobName", "train JobState=RUNNING Reason=None");
        let r = parse_job_record(&named).unwrap_or_default();
        assert_eq!(r["JobName"], "train JobState=RUNNING Reason=None");
        assert_eq!((r["JobState"].as_str(), r["Reason"].as_str()), ("PENDING", "JobHeldUser"));
        // A name that imitates what follows it: never read as the fields.
        let fake = "x UserId=a(1) GroupId=a(1) MCS_label=N/A Priority=1 Nice=0 Account=a QOS=normal \
                    JobState=RUNNING Reason=None Dependency=(null)";
        let r = parse_job_record(&edit(HELD, "JobName", fake));
        assert!(matches!(r, Err(RecordError::OutOfOrder(_) | RecordError::Ambiguous(_))), "{r:?}");
        // Imitating the record up to a user-text field that swallows the rest.
        let full = HELD.trim().split(" Features=").next().unwrap_or("");
        let forged = format!("{} Features=", full.replacen("JobState=PENDING", "JobState=RUNNING", 1));
        let forged = forged.split_once(" JobName=wrap ").map_or(String::new(), |(_, rest)| rest.to_owned());
        let r = parse_job_record(&edit(HELD, "JobName", &format!("x {forged}")));
        assert!(matches!(r, Err(RecordError::Ambiguous(ref k)) if k == "UserId"), "{r:?}");
        // A WCKey (printed with TrackWCKey) cannot either.
        let wckey = HELD.trim().replace(" JobState=", " WCKey=w JobState=RUNNING Reason=None JobState=");
        assert!(parse_job_record(&wckey).is_err());
    }

    #[test]
    fn cut_or_reordered_records_fail() {
        assert_eq!(parse_job_record(""), Err(RecordError::Missing("JobId")));
        let cut = HELD.split(" Requeue=").next().unwrap_or("");
        assert_eq!(parse_job_record(cut), Err(RecordError::Missing("Requeue")));
        let back = HELD.trim().replace(" Requeue=1", " Requeue=1 UserId=root(0)");
        assert_eq!(parse_job_record(&back), Err(RecordError::OutOfOrder("UserId".into())));
        // An unknown key after a plain value is a field of its own (a newer Slurm).
        let newer = HELD.trim().replace(" Requeue=1", " Requeue=1 Brand=New");
        assert_eq!(
            parse_job_record(&newer).unwrap_or_default().get("Brand").map(String::as_str),
            Some("New")
        );
        // The per-node lines of --details repeat.
        let details = HELD.trim().replace(
            " MinCPUsNode=",
            " JOB_GRES=gpu:2 Nodes=node1 CPU_IDs=0 Mem=100 GRES=gpu:1 Nodes=node2 CPU_IDs=0 Mem=100 GRES=gpu:1 MinCPUsNode=",
        );
        assert_eq!(
            parse_job_record(&details).unwrap_or_default().get("Nodes").map(String::as_str),
            Some("node2")
        );
    }

    #[test]
    fn node_records_keep_spaces() {
        let node = parse_record(fixture!("node2.scontrol"));
        let reason = node.get("Reason").cloned().unwrap_or_default();
        assert!(reason.starts_with("gpu: xid79 gpu3 GPU has fallen off the bus (kmsg) [root@"), "{reason}");
    }

    #[test]
    fn dependencies_and_unavailable_nodes() {
        let r = parse_job_record(fixture!("depfail.scontrol")).unwrap_or_default();
        let deps = parse_dependencies(r.get("Dependency").map_or("", String::as_str));
        assert_eq!(
            deps,
            [Dependency { kind: "afterok".into(), job: Some("2".into()), state: "failed".into() }]
        );
        assert!(parse_dependencies("(null)").is_empty());
        let two = parse_dependencies("afterok:12_*(unfulfilled),afterany:13+5(unfulfilled)");
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].job.as_deref(), Some("13"));
        assert_eq!(unavailable_nodes("ReqNodeNotAvail, UnavailableNodes:node[2-3]"), ["node2", "node3"]);
        assert!(unavailable_nodes("Resources").is_empty());
    }
}
