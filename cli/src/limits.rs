//! `why`'s limit numbers: for a job held by an association or QOS limit
//! (`AssocGrpGRES`, `QOSMaxGRESPerUser`, `MaxCpuPerAccount`, ...), the limit,
//! its use and what the job asks, from the read-only commands any user may run,
//! each under `why`'s deadline ([`crate::slurm_cmd::slurm`]):
//!
//! - `squeue -h -j JOBID -O ...`, only where the job's record came as JSON
//!   (24.11 on), whose rows lack `QOS` and `ReqTRES`;
//! - `scontrol show partition -o NAME` for each of the job's partitions (their
//!   `QoS=`, which Slurm applies before the job's own);
//! - `scontrol show assoc_mgr flags=assoc,qos users=USER`: every account
//!   association (the tree), the user's own associations and every QOS.
//!
//! The conclusions are `job_diagnosis::limits`'; this module only runs the
//! commands. Any of them failing costs the numbers, never the rest of `why`.

use job_diagnosis::limits::{self, LimitFinding};
use job_diagnosis::{self as jobinfo, Row, Why};
use serde_json::Value;

use crate::slurm_cmd::slurm;

/// At most this many partitions of a pending job are asked for their QOS.
const MAX_PARTITIONS: usize = 4;

fn missing(rec: &Row, key: &str) -> bool {
    rec.get(key).is_none_or(|v| {
        let v = v.trim();
        v.is_empty() || v == "(null)" || v == "N/A"
    })
}

/// A name that can go into `users=NAME` as it is.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@' | b'$'))
}

/// For `w`'s job (its record `rec`), when it waits for an association or
/// QOS limit: that limit with its numbers, or one line on why they cannot be
/// had; `None` for any other reason (and nothing is run).
pub(crate) fn limit(rec: &Row, w: &Why) -> Option<LimitFinding> {
    w.limit.as_ref()?;
    let mut rec = rec.clone();
    if missing(&rec, "QOS") || (missing(&rec, "ReqTRES") && missing(&rec, "TRES")) {
        if let Ok(text) = slurm("squeue", &["-h", "-j", &w.job_id, "-O", limits::SQUEUE_FORMAT]) {
            for (k, v) in limits::squeue_fields(&text) {
                if missing(&rec, &k) {
                    rec.insert(k, v);
                }
            }
        }
    }
    let partitions: Vec<String> = rec
        .get("Partition")
        .map(|p| p.split(',').map(str::trim).filter(|p| plain_name(p)).map(str::to_owned).collect())
        .unwrap_or_default();
    let partition_qos: Vec<String> = partitions
        .iter()
        .take(MAX_PARTITIONS)
        .filter_map(|p| slurm("scontrol", &["show", "partition", "-o", p]).ok())
        .filter_map(|text| limits::partition_qos(&text))
        .collect();
    let user = rec.get("UserId").map_or("", |u| u.split('(').next().unwrap_or(""));
    let users = format!("users={user}");
    let mut args = vec!["show", "assoc_mgr", "flags=assoc,qos"];
    if plain_name(user) {
        args.push(&users);
    }
    let answer = slurm("scontrol", &args);
    jobinfo::why_limit(&rec, w, answer.as_deref().map_err(String::as_str), &partition_qos)
}

/// `why --json`'s `limit`: `{kind, scope, name, tres, limit, used, requested,
/// unit, exceeded, text}`, or null.
pub(crate) fn limit_json(f: Option<&LimitFinding>) -> Value {
    f.map_or(Value::Null, LimitFinding::json)
}

/// `why --json`'s `limit_note`: why a limit's numbers cannot be had, or null.
pub(crate) fn limit_note(f: Option<&LimitFinding>) -> Value {
    f.and_then(LimitFinding::note).map_or(Value::Null, |n| Value::String(n.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_missing_values() {
        assert!(plain_name("alice") && plain_name("gpu-a100") && !plain_name("a,b") && !plain_name(""));
        let mut r = Row::new();
        r.insert("QOS".into(), "(null)".into());
        assert!(missing(&r, "QOS") && missing(&r, "ReqTRES"));
        assert_eq!(limit_json(None), Value::Null);
        assert_eq!(limit_note(Some(&LimitFinding::Unknown("hidden".into()))), Value::String("hidden".into()));
    }
}
