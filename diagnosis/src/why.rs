//! `spank-gpu why`: what a pending job waits for, from its record (text or
//! JSON, read into the same row), in words, with who resolves it.

use super::Row;
use super::agent::AgentDrain;
use super::explain::{self, Remedy};
use super::limits::{self, LimitFinding, LimitReason};
use super::reasons;
use super::release::Release;
use super::scontrol::{Dependency, parse_dependencies, unavailable_nodes};
use slurm_formats::hostlist;
use slurm_formats::units::{format_duration, parse_duration};

/// A node a pending job needs, and why it is out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeOut {
    /// The node.
    pub node: String,
    /// Its state as `sinfo` prints it (`drained`, `down`, ...).
    pub state: String,
    /// The drain/down reason as Slurm has it.
    pub reason: String,
    /// The reason decoded, when the GPU agent wrote it.
    pub agent: Option<AgentDrain>,
}

/// What `why` concludes from a job's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why {
    /// The job id as Slurm has it.
    pub job_id: String,
    /// `JobState`.
    pub state: String,
    /// Whether the job is pending (else the rest says so).
    pub pending: bool,
    /// The reason as shown, `_` back to spaces: `ReqNodeNotAvail, UnavailableNodes:node2`.
    pub reason: String,
    /// Its code, the string Slurm prints for the reason: `ReqNodeNotAvail`
    /// (`Resources` for a topology plugin's rejection, whose text replaces it).
    pub code: String,
    /// The `slurm.h` names of this release that print as the code.
    pub reason_enum: Vec<&'static str>,
    /// The reason in words.
    pub meaning: String,
    /// Who or what resolves it.
    pub remedy: Remedy,
    /// What to do, for this job.
    pub action: String,
    /// The nodes to look up (`sinfo`): those Slurm names unavailable, or the
    /// requested ones for `ReqNodeNotAvail`.
    pub nodes: Vec<String>,
    /// The job's dependencies.
    pub dependencies: Vec<Dependency>,
    /// Whether advice on the request's size and time applies (waiting for `Resources`/`Priority`).
    pub wants_advice: bool,
    /// For a pending job held by an association or QOS limit (`AssocGrpGRES`,
    /// `QOSMaxGRESPerUser`, `MaxCpuPerAccount`, ...): which limit, whose
    /// numbers [`why_limit`] finds in `scontrol show assoc_mgr`.
    pub limit: Option<LimitReason>,
}

/// What became of a job another job depends on: its state and exit code as
/// Slurm's controller has them while it holds the job, else as accounting
/// has them (which lags behind the controller: right after a job ends, or
/// while slurmdbd is down, accounting may still say `PENDING`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DependencyJob {
    /// Its state (`FAILED`, `CANCELLED by 0`, `PENDING`).
    pub state: String,
    /// Its `STATUS:SIGNAL`.
    pub exit_code: String,
}

impl DependencyJob {
    /// Whether it has ended: a state that is not one a job is in before its end.
    pub fn ended(&self) -> bool {
        !self.state.trim().is_empty() && !explain::is_active_state(&self.state)
    }

    /// In words after `job J `: `ended FAILED (exit code 1:0)`, or `is still
    /// PENDING` (never "ended" with a state that is not an end).
    pub fn words(&self) -> String {
        if self.ended() {
            format!("ended {} (exit code {})", self.state, self.exit_code)
        } else if self.state.trim().is_empty() {
            "is in a state Slurm did not name".to_owned()
        } else {
            format!("is still {}", self.state)
        }
    }
}

/// `why` for the job in `record` (`scontrol show job`, text or JSON) on
/// `release`; `fallback_id` is the id asked for, used when the record has none.
pub fn why(record: &Row, fallback_id: &str, release: Release) -> Why {
    let get = |k: &str| record.get(k).map_or("", String::as_str);
    let job_id = if get("JobId").is_empty() { fallback_id } else { get("JobId") }.to_owned();
    let state = get("JobState").to_owned();
    let reason = get("Reason").replace('_', " ");
    let (code, words) = explain::read_reason(&reason, record.get("ReasonCode").map(String::as_str));
    let pending = state == "PENDING";
    let (meaning, remedy, action) = match (words, pending) {
        (Some(e), true) => (e.meaning, e.remedy, e.action.replace("JOBID", &job_id)),
        (None, true) => (
            format!("Slurm's reason '{reason}' is not in spank-gpu's table (Slurm {release})"),
            Remedy::None,
            format!("see scontrol show job {job_id} and the Slurm documentation for this reason"),
        ),
        (_, false) if state == "EXPEDITING" || state == "REQUEUED" => (
            format!(
                "the job is not pending: it is {state}, being requeued after its run ended, and will be \
                 scheduled again"
            ),
            Remedy::Time,
            format!("wait for it to start again; spank-gpu autopsy {job_id} says why its last run ended"),
        ),
        (_, false) => (
            format!("the job is not pending: it is {state}"),
            Remedy::None,
            if explain::is_running_state(&state) {
                "nothing to wait for".to_owned()
            } else {
                format!("spank-gpu autopsy {job_id}")
            },
        ),
    };
    let mut nodes = unavailable_nodes(&reason);
    if nodes.is_empty() && code == "ReqNodeNotAvail" {
        nodes = hostlist::expand(get("ReqNodeList")).unwrap_or_default();
    }
    Why {
        wants_advice: pending && matches!(code.as_str(), "Resources" | "Priority"),
        limit: if pending { limits::limit_reason(&code) } else { None },
        dependencies: parse_dependencies(get("Dependency")),
        reason_enum: reasons::enum_names(&code, release),
        job_id,
        state,
        pending,
        reason,
        code,
        meaning,
        remedy,
        action,
        nodes,
    }
}

/// The numbers of the limit that holds `w`'s job (`w.limit`), from
/// `assoc_mgr`: `scontrol show assoc_mgr flags=assoc,qos`'s answer, or its
/// error; `partition_qos`: the QOS of the job's partitions (see
/// [`limits::partition_qos`]). `record` is the job's record, with
/// [`limits::squeue_fields`] added where it came as JSON (24.11 on: no `QOS`
/// or `ReqTRES`). `None` when the job does not wait for a limit; else the
/// limit with its numbers, or one line on why they cannot be had.
pub fn why_limit(
    record: &Row,
    w: &Why,
    assoc_mgr: Result<&str, &str>,
    partition_qos: &[String],
) -> Option<LimitFinding> {
    let reason = w.limit.as_ref()?;
    Some(match assoc_mgr {
        Ok(text) => limits::find_limit(
            reason,
            &limits::job_ask(record),
            &limits::parse_assoc_mgr(text),
            partition_qos,
        ),
        Err(e) => LimitFinding::Unknown(format!(
            "its numbers cannot be read (scontrol show assoc_mgr: {}); sacctmgr show assoc user=$USER shows \
             the limits without their use",
            slurm_formats::text::clip(e, 200)
        )),
    })
}

/// The advice for a job waiting for resources: its `--time` against
/// `past_elapsed` (its user's completed jobs of the same name), and its size.
pub fn why_advice(record: &Row, past_elapsed: &[u64]) -> Vec<String> {
    let get = |k: &str| record.get(k).map_or("", String::as_str);
    let limit = parse_duration(get("TimeLimit"));
    let nodes: u32 = get("NumNodes").split('-').next().unwrap_or("").parse().unwrap_or(0);
    time_advice(limit, past_elapsed).into_iter().chain(split_advice(nodes, limit)).collect()
}

/// Advice on `--time`: when similar past jobs (same name, same user, ended
/// `COMPLETED`) all ran far shorter than this job's limit, ask for less and
/// backfill can start it sooner.
pub fn time_advice(limit_secs: Option<u64>, past_elapsed: &[u64]) -> Option<String> {
    let limit = limit_secs?;
    if past_elapsed.len() < 2 {
        return None;
    }
    let longest = *past_elapsed.iter().max()?;
    let suggest = (longest.saturating_mul(3) / 2).max(60).div_ceil(60) * 60;
    (limit >= 3600 && longest.saturating_mul(4) <= limit).then(|| {
        format!(
            "your --time is {}, but your {} similar jobs finished within {}: ask for about --time={} and backfill can start this job sooner",
            format_duration(limit),
            past_elapsed.len(),
            format_duration(longest),
            format_duration(suggest)
        )
    })
}

/// Advice on the size of a request that waits for resources: half the nodes
/// for half the time, twice, fits backfill holes sooner.
pub fn split_advice(nodes: u32, limit_secs: Option<u64>) -> Option<String> {
    let limit = limit_secs?;
    (nodes >= 4 && limit >= 12 * 3600).then(|| {
        format!(
            "a request for {nodes} nodes for {} waits for a big hole; {} nodes for {} (twice, with a checkpoint) is picked up by backfill sooner",
            format_duration(limit),
            nodes / 2,
            format_duration(limit / 2)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse_scontrol_jobs;
    use crate::release::{R22_05, R24_11, R25_11, R26_05};
    use crate::scontrol::parse_job_record;

    macro_rules! fixture {
        ($release:literal, $name:literal) => {
            include_str!(concat!("../tests/fixtures/jobinfo/", $release, "/", $name))
        };
    }

    fn text(line: &str) -> Row {
        parse_job_record(line).unwrap_or_default()
    }

    #[test]
    fn a_dependency_ends_only_in_an_end_state() {
        let dep = |state: &str, exit: &str| DependencyJob { state: state.into(), exit_code: exit.into() };
        assert_eq!(dep("FAILED", "1:0").words(), "ended FAILED (exit code 1:0)");
        assert_eq!(dep("CANCELLED by 0", "0:15").words(), "ended CANCELLED by 0 (exit code 0:15)");
        for s in ["PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "CONFIGURING", "COMPLETING", "REQUEUE_HOLD"]
        {
            let d = dep(s, "0:0");
            assert!(!d.ended(), "{s}");
            assert_eq!(d.words(), format!("is still {s}"));
        }
        assert!(!dep("", "").ended());
    }

    fn json(answer: &str) -> Row {
        parse_scontrol_jobs(answer).ok().and_then(|r| r.into_iter().next()).unwrap_or_default()
    }

    #[test]
    fn why_conclusions_from_recorded_records() {
        let held = why(&text(fixture!("22.05", "held.scontrol")), "1", R22_05);
        assert!(
            held.pending && held.remedy == Remedy::User && held.action == "scontrol release 1",
            "{held:?}"
        );
        assert_eq!(held.reason_enum, ["WAIT_HELD_USER"]);
        let node = why(&text(fixture!("22.05", "reqnode.scontrol")), "6", R22_05);
        assert_eq!(node.reason, "ReqNodeNotAvail, UnavailableNodes:node2");
        assert_eq!(node.code, "ReqNodeNotAvail");
        assert_eq!(node.nodes, ["node2"]);
        let res = why(&text(fixture!("22.05", "resources.scontrol")), "5", R22_05);
        assert!(res.wants_advice && res.remedy == Remedy::Time, "{res:?}");
        let dep = why(&text(fixture!("22.05", "depfail.scontrol")), "3", R22_05);
        assert_eq!(dep.dependencies.len(), 1);
        let ended = why(&text(fixture!("22.05", "oom.scontrol")), "8", R22_05);
        assert!(!ended.pending && ended.action == "spank-gpu autopsy 8", "{ended:?}");
        let mut new = text(fixture!("22.05", "held.scontrol"));
        new.insert("Reason".into(), "WaitingForTheMoon".into());
        let w = why(&new, "1", R22_05);
        assert!(w.meaning.contains("not in spank-gpu's table (Slurm 22.05.0)"), "{}", w.meaning);
        assert!(w.reason_enum.is_empty());
        // Advice for a long, wide request whose earlier runs were short.
        let mut big = text(fixture!("22.05", "resources.scontrol"));
        big.insert("TimeLimit".into(), "1-00:00:00".into());
        big.insert("NumNodes".into(), "8-8".into());
        let advice = why_advice(&big, &[1800, 2000]);
        assert_eq!(advice.len(), 2, "{advice:?}");
    }

    #[test]
    fn a_held_job_whose_command_line_imitates_fields_is_held() {
        // 24.11 and 26.05, JSON: the command line is a value, never fields.
        for (answer, release) in [
            (fixture!("24.11", "held-keyvalue.scontrol.json"), R24_11),
            (fixture!("26.05", "held-keyvalue.scontrol.json"), R26_05),
        ] {
            let w = why(&json(answer), "41", release);
            assert!(w.pending && w.code == "JobHeldUser" && w.remedy == Remedy::User, "{w:?}");
            assert_eq!(w.reason_enum, ["WAIT_HELD_USER"]);
        }
        // 25.11's text form with SubmitLine=, should JSON not be there.
        let line = fixture!("26.05", "held-keyvalue.scontrol");
        let w = why(&text(line), "41", R25_11);
        assert!(w.pending && w.code == "JobHeldUser", "{w:?}");
    }

    #[test]
    fn topology_rejects_are_explained_not_read_as_no() {
        let r = json(fixture!("26.05", "topology.scontrol.json"));
        assert_eq!(r["Reason"], "No_suitable_topology_unit_found");
        let w = why(&r, "52", R26_05);
        assert_eq!((w.code.as_str(), w.reason_enum.as_slice()), ("Resources", &["WAIT_RESOURCES"][..]));
        assert!(w.meaning.contains("topology unit") && w.meaning.contains("one switch"), "{}", w.meaning);
        assert!(w.action.contains("--segment"), "{}", w.action);
        assert_eq!(w.remedy, Remedy::Time);
        // The same as text.
        let mut t = text(fixture!("22.05", "resources.scontrol"));
        t.insert("Reason".into(), "No_suitable_topology_unit_found_for_segment".into());
        let w = why(&t, "5", R26_05);
        assert!(w.code == "Resources" && w.remedy == Remedy::User && w.action.contains("smaller --segment"));
    }

    #[test]
    fn json_and_text_agree_on_the_same_job() {
        let j = json(fixture!("24.11", "resources.scontrol.json"));
        let w = why(&j, "44", R24_11);
        assert!(w.pending && w.code == "Resources" && w.wants_advice, "{w:?}");
        assert_eq!(j["TimeLimit"], "00:05:00");
        assert_eq!(j["NumNodes"], "1");
        let dep = why(&json(fixture!("24.11", "depfail.scontrol.json")), "43", R24_11);
        assert_eq!(dep.code, "DependencyNeverSatisfied");
        assert_eq!(dep.dependencies[0].job.as_deref(), Some("42"));
        let node = why(&json(fixture!("24.11", "reqnode.scontrol.json")), "45", R24_11);
        assert_eq!(
            (node.code.as_str(), node.nodes.as_slice()),
            ("ReqNodeNotAvail", &["node2".to_owned()][..])
        );
    }

    #[test]
    fn requeued_and_expediting_jobs_will_run_again() {
        let mut r = text(fixture!("22.05", "held.scontrol"));
        r.insert("JobState".into(), "EXPEDITING".into());
        let w = why(&r, "1", R25_11);
        assert!(!w.pending && w.remedy == Remedy::Time && w.action.contains("start again"), "{w:?}");
        r.insert("JobState".into(), "RUNNING".into());
        assert_eq!(why(&r, "1", R25_11).action, "nothing to wait for");
    }
}
