//! `why`'s limit numbers on `scontrol show assoc_mgr flags=assoc,qos` as 22.05,
//! 24.11 and 26.05 print it (`fixtures/limits/`, written by its `derive.py`
//! from src/scontrol/info_assoc_mgr.c at each tag): which limit holds a
//! pending job, where it is set (the account, a parent account, the user's
//! association, the QOS, the QOS per user or per account), its value, its use
//! and what the job asks; a QOS limit replacing an association's; and the one
//! line when `PrivateData=usage` hides the numbers or the command fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use job_diagnosis::limits::{Owner, Scope, parse_assoc_mgr, partition_qos};
use job_diagnosis::{
    LimitFinding, REASONS, Release, Row, job_ask, limit_reason, parse_job_record, why, why_limit,
};

const R22_05: &str = include_str!("fixtures/limits/22.05.assoc_mgr");
const R24_11: &str = include_str!("fixtures/limits/24.11.assoc_mgr");
const R26_05: &str = include_str!("fixtures/limits/26.05.assoc_mgr");
const PRIVATE: &str = include_str!("fixtures/limits/private-24.11.assoc_mgr");

fn releases() -> [(&'static str, &'static str); 3] {
    [("22.05", R22_05), ("24.11", R24_11), ("26.05", R26_05)]
}

/// A pending job's record as `why` reads it (text form keys).
fn job(user: &str, account: &str, qos: &str, reason: &str, req: &str, time: &str) -> Row {
    let mut r = Row::new();
    for (k, v) in [
        ("JobId", "77"),
        ("UserId", user),
        ("Account", account),
        ("QOS", qos),
        ("JobState", "PENDING"),
        ("Reason", reason),
        ("Partition", "gpu"),
        ("NumNodes", "1"),
        ("NumTasks", "1"),
        ("ReqTRES", req),
        ("TimeLimit", time),
    ] {
        r.insert(k.into(), v.into());
    }
    r
}

/// The finding for `record` on the answer `text`, the partitions' QOS `pq`.
fn finding(record: &Row, text: &str, pq: &[&str]) -> LimitFinding {
    let w = why(record, "77", Release::new(24, 11, 0));
    let pq: Vec<String> = pq.iter().map(|s| (*s).to_owned()).collect();
    why_limit(record, &w, Ok(text), &pq).expect("a limit reason")
}

fn found(f: LimitFinding) -> job_diagnosis::Limit {
    match f {
        LimitFinding::Found(l) => l,
        LimitFinding::Unknown(why) => panic!("no numbers: {why}"),
    }
}

/// (scope, name, tres, limit, used, requested, exceeded).
type Numbers = (Scope, &'static str, Option<String>, u64, Option<u64>, Option<u64>, bool);

fn numbers(l: &job_diagnosis::Limit) -> Numbers {
    (l.scope.clone(), l.name, l.tres.clone(), l.limit, l.used, l.requested, l.exceeded)
}

fn account(a: &str) -> Scope {
    Scope::Account { account: a.into() }
}

const GPU8: &str = "cpu=8,mem=64G,node=1,billing=8,gres/gpu=8";

#[test]
fn the_answer_reads_on_every_release() {
    for (rel, text) in releases() {
        let m = parse_assoc_mgr(text);
        assert_eq!(m.associations.len(), 9, "{rel}");
        let names: Vec<&str> = m.qos.iter().map(|q| q.name.as_str()).collect();
        let want: &[&str] =
            if rel == "22.05" { &["normal", "gpu", "big"] } else { &["normal", "gpu", "big", "long"] };
        assert_eq!(names, want, "{rel}");
        let lab = m.associations.iter().find(|a| a.account == "lab" && a.user.is_none()).unwrap();
        assert_eq!(
            (lab.parent.as_deref(), lab.parent_id, lab.id),
            (Some("physics"), Some(2), Some(3)),
            "{rel}"
        );
        assert_eq!(lab.limits.tres["GrpTRES"]["gres/gpu"].limit, Some(16));
        assert_eq!(lab.limits.tres["GrpTRES"]["gres/gpu"].used, Some(12));
        assert_eq!(lab.limits.tres["GrpTRES"]["cpu"].limit, None);
        assert_eq!(
            lab.lineage.as_deref(),
            if rel == "22.05" { None } else { Some("/physics/lab/") },
            "{rel}"
        );
        let alice = m.associations.iter().find(|a| a.user.as_deref() == Some("alice")).unwrap();
        assert_eq!((alice.uid, alice.parent.as_deref()), (Some(1001), None));
        assert_eq!(alice.limits.counts["MaxJobs"].limit, Some(10));
        assert_eq!(alice.limits.counts["MaxWallPJ"].limit, Some(2880));
        assert_eq!(alice.limits.tres["MaxTRESPJ"]["gres/gpu"].limit, Some(8));
        let gpu = m.qos.iter().find(|q| q.name == "gpu").unwrap();
        // 22.05 heads a user's entry with the uid alone, 23.02 on with name(uid).
        let u = &gpu.users[0];
        assert_eq!(
            (u.name.as_deref(), u.uid),
            (if rel == "22.05" { None } else { Some("alice") }, Some(1001)),
            "{rel}"
        );
        assert_eq!(u.limits.tres["MaxTRESPU"]["gres/gpu"].limit, Some(8));
        assert_eq!(gpu.accounts[0].0, "lab");
        assert_eq!(gpu.accounts[0].1.tres["MaxTRESPA"]["gres/gpu"].used, Some(20));
        assert_eq!(gpu.limits.tres["MaxTRESPN"]["gres/gpu"].limit, Some(4));
        // 24.05 on: run-minutes per user, with their use.
        if rel != "22.05" {
            let long = m.qos.iter().find(|q| q.name == "long").unwrap();
            assert_eq!(long.users[0].limits.tres["MaxTRESRunMinsPU"]["cpu"].used, Some(92160));
        }
    }
    assert!(
        parse_assoc_mgr("Current Association Manager state\n\nNo associations currently cached in Slurm.\n")
            .associations
            .is_empty()
    );
}

#[test]
fn assoc_grp_gres_on_the_account() {
    for (rel, text) in releases() {
        let r = job("alice(1001)", "lab", "normal", "AssocGrpGRES", GPU8, "02:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            numbers(&l),
            (account("lab"), "GrpTRES", Some("gres/gpu".into()), 16, Some(12), Some(8), true),
            "{rel}"
        );
        assert_eq!(l.unit, "GPUs");
        assert_eq!(
            l.text,
            "the cap of your account lab is GrpTRES gres/gpu=16 (GPUs); 12 in use; this job asks for 8"
        );
    }
}

#[test]
fn assoc_grp_gres_on_a_parent_account() {
    for (rel, text) in releases() {
        let r = job("carol(1003)", "vision", "normal", "AssocGrpGRES", GPU8, "02:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            numbers(&l),
            (account("physics"), "GrpTRES", Some("gres/gpu".into()), 32, Some(28), Some(8), true),
            "{rel}"
        );
        assert!(
            l.text.starts_with("the cap of account physics (above your account vision) is"),
            "{}",
            l.text
        );
    }
}

#[test]
fn qos_max_gres_per_user() {
    for (rel, text) in releases() {
        let r = job("alice(1001)", "lab", "gpu", "QOSMaxGRESPerUser", GPU8, "02:00:00");
        let l = found(finding(&r, text, &[]));
        let scope = Scope::QosUser { qos: "gpu".into(), user: "alice".into() };
        assert_eq!(
            numbers(&l),
            (scope, "MaxTRESPU", Some("gres/gpu".into()), 8, Some(4), Some(8), true),
            "{rel}"
        );
        assert_eq!(
            l.text,
            "the cap of QOS gpu for each user is MaxTRESPU gres/gpu=8 (GPUs); you use 4; this job asks for 8"
        );
    }
    // The partition's QOS comes first: a job in QOS normal on a partition whose QOS is gpu.
    let r = job("alice(1001)", "lab", "normal", "QOSMaxGRESPerUser", GPU8, "02:00:00");
    let l = found(finding(&r, R24_11, &["gpu"]));
    assert_eq!(l.scope, Scope::QosUser { qos: "gpu".into(), user: "alice".into() });
}

#[test]
fn assoc_grp_cpu_limit() {
    for (rel, text) in releases() {
        let r = job(
            "dave(1004)",
            "chem",
            "normal",
            "AssocGrpCpuLimit",
            "cpu=16,mem=32G,node=1,billing=16",
            "1:00:00",
        );
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            numbers(&l),
            (account("chem"), "GrpTRES", Some("cpu".into()), 256, Some(250), Some(16), true),
            "{rel}"
        );
        assert_eq!(l.unit, "CPUs");
    }
}

#[test]
fn assoc_max_jobs_limit() {
    for (rel, text) in releases() {
        let r = job("bob(1002)", "lab", "normal", "AssocMaxJobsLimit", GPU8, "1:00:00");
        let l = found(finding(&r, text, &[]));
        let scope = Scope::User { user: "bob".into(), account: "lab".into(), partition: None };
        assert_eq!(numbers(&l), (scope, "MaxJobs", None, 4, Some(4), Some(1), true), "{rel}");
        assert_eq!(
            l.text,
            "the cap of your association (user bob in account lab) is MaxJobs=4 (running jobs); 4 running; \
             this job would be one more"
        );
    }
}

#[test]
fn a_qos_limit_replaces_the_associations_one() {
    let both = "cpu=8,mem=64G,node=1,billing=8,gres/gpu=8,gres/gpu:a100=8";
    for (rel, text) in releases() {
        // QOS normal sets no GPU limit: lab's gres/gpu cap holds the job.
        let r = job("alice(1001)", "lab", "normal", "AssocGrpGRES", both, "1:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!((l.tres.as_deref(), l.limit, l.used), (Some("gres/gpu"), 16, Some(12)), "{rel}");
        // QOS big sets GrpTRES gres/gpu=64, which replaces lab's gres/gpu=16: what holds
        // the job is lab's cap on a100s, which no QOS sets.
        let r = job("alice(1001)", "lab", "big", "AssocGrpGRES", both, "1:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            numbers(&l),
            (account("lab"), "GrpTRES", Some("gres/gpu:a100".into()), 8, Some(6), Some(8), true),
            "{rel}"
        );
        assert_eq!(l.unit, "a100 GPUs");
        // The QOS's own reason finds the QOS's limit (not over by these numbers).
        let r = job("alice(1001)", "lab", "big", "QOSGrpGRES", both, "1:00:00");
        let l = found(finding(&r, text, &[]));
        let scope = Scope::Qos { qos: "big".into() };
        assert_eq!(
            numbers(&l),
            (scope, "GrpTRES", Some("gres/gpu".into()), 64, Some(20), Some(8), false),
            "{rel}"
        );
        assert!(l.text.ends_with(
            "(by these numbers it fits: the use changed since Slurm last looked, and it may start soon)"
        ));
    }
}

#[test]
fn private_data_usage_hides_the_accounts() {
    let r = job("alice(1001)", "lab", "normal", "AssocGrpGRES", GPU8, "02:00:00");
    let f = finding(&r, PRIVATE, &[]);
    let LimitFinding::Unknown(why) = &f else { panic!("{f:?}") };
    assert!(why.contains("PrivateData=usage") && why.contains("account lab"), "{why}");
    assert_eq!(f.line(), format!("limit: {why}"));
    assert_eq!(f.json(), serde_json::Value::Null);
    assert_eq!(f.note(), Some(why.as_str()));
    // Her own association's limits stay visible, and QOS are never hidden.
    let r = job("alice(1001)", "lab", "normal", "AssocMaxJobsLimit", GPU8, "02:00:00");
    assert_eq!(found(finding(&r, PRIVATE, &[])).limit, 10);
    let r = job("alice(1001)", "lab", "gpu", "QOSMaxGRESPerUser", GPU8, "02:00:00");
    assert_eq!(found(finding(&r, PRIVATE, &[])).used, Some(4));
    // Nothing at all shown.
    let empty = "Current Association Manager state\n\nNo associations currently cached in Slurm.\n\n\nQOS Records\n\n";
    let r = job("alice(1001)", "lab", "normal", "AssocGrpGRES", GPU8, "02:00:00");
    let LimitFinding::Unknown(why) = finding(&r, empty, &[]) else { panic!() };
    assert!(why.contains("no association at all"), "{why}");
}

#[test]
fn the_other_families_give_their_numbers() {
    for (rel, text) in releases() {
        // Per account in the QOS.
        let r = job("alice(1001)", "lab", "gpu", "MaxGRESPerAccount", GPU8, "1:00:00");
        let l = found(finding(&r, text, &[]));
        let scope = Scope::QosAccount { qos: "gpu".into(), account: "lab".into() };
        assert_eq!(
            numbers(&l),
            (scope, "MaxTRESPA", Some("gres/gpu".into()), 24, Some(20), Some(8), true),
            "{rel}"
        );
        // Per node.
        let r = job("alice(1001)", "lab", "gpu", "QOSMaxGRESPerNode", GPU8, "1:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!((l.name, l.limit, l.used, l.requested, l.exceeded), ("MaxTRESPN", 4, None, Some(8), true));
        assert!(
            l.text.contains("(GPUs per node)") && l.text.ends_with("this job asks for 8 per node"),
            "{}",
            l.text
        );
        // Wall time per job: the association's MaxWallPJ in minutes against --time.
        let r = job("alice(1001)", "lab", "normal", "AssocMaxWallDurationPerJobLimit", GPU8, "3-00:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            (l.name, l.limit, l.requested, l.unit.as_str()),
            ("MaxWallPJ", 2880, Some(4320), "minutes")
        );
        // GPU-minutes of past usage: the request is GPUs times --time.
        let r = job("alice(1001)", "lab", "normal", "AssocGrpGRESMinutes", GPU8, "1-00:00:00");
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            (l.scope.clone(), l.name, l.limit, l.used, l.requested, l.unit.as_str()),
            (account("lab"), "GrpTRESMins", 300_000, Some(256_789), Some(8 * 1440), "GPU-minutes")
        );
        assert!(
            l.text.contains("past usage, which only decays") && l.text.contains("(8 x 1440 min of --time)")
        );
    }
    // 24.05 on: the CPU-minutes still to run of a user's running jobs in a QOS.
    for text in [R24_11, R26_05] {
        let r = job(
            "alice(1001)",
            "lab",
            "long",
            "MaxCpuRunMinsPerUser",
            "cpu=64,mem=8G,node=1,billing=64",
            "4:00:00",
        );
        let l = found(finding(&r, text, &[]));
        assert_eq!(
            (l.name, l.limit, l.used, l.requested, l.exceeded),
            ("MaxTRESRunMinsPU", 100_000, Some(92_160), Some(64 * 240), true)
        );
        assert!(l.text.contains("; your running jobs hold 92160;"), "{}", l.text);
    }
}

#[test]
fn a_text_record_of_22_05_gives_its_gres_from_tres_per_job() {
    // The lab's record: TRES= lacks the GPUs (not accounted there), TresPerJob=gres:gpu:8 has them.
    let line = include_str!("fixtures/jobinfo/22.05/resources.scontrol");
    let mut r = parse_job_record(line).unwrap();
    r.insert("Reason".into(), "AssocGrpGRES".into());
    r.insert("UserId".into(), "alice(1001)".into());
    r.insert("Account".into(), "lab".into());
    assert_eq!(job_ask(&r).total("gres/gpu"), Some(8));
    let w = why(&r, "5", Release::new(22, 5, 8));
    assert!(w.limit.is_some() && w.code == "AssocGrpGRES", "{w:?}");
    let l = found(why_limit(&r, &w, Ok(R22_05), &[]).unwrap());
    assert_eq!((l.scope, l.limit, l.used, l.requested), (account("lab"), 16, Some(12), Some(8)));
}

#[test]
fn what_why_says_when_it_cannot_or_need_not() {
    let r = job("alice(1001)", "lab", "normal", "AssocGrpGRES", GPU8, "1:00:00");
    let w = why(&r, "77", Release::new(24, 11, 0));
    let f =
        why_limit(&r, &w, Err("slurm_load_assoc_mgr_info error: Unable to contact slurm controller"), &[]);
    let Some(LimitFinding::Unknown(line)) = f else { panic!("{f:?}") };
    assert!(line.contains("cannot be read") && line.contains("Unable to contact"), "{line}");
    // Not a limit: nothing to look up.
    let mut res = r.clone();
    res.insert("Reason".into(), "Resources".into());
    let w = why(&res, "77", Release::new(24, 11, 0));
    assert!(w.limit.is_none() && why_limit(&res, &w, Ok(R24_11), &[]).is_none());
    // Not pending: neither.
    let mut run = r.clone();
    run.insert("JobState".into(), "RUNNING".into());
    assert!(why(&run, "77", Release::new(24, 11, 0)).limit.is_none());
    // A QOS that is not in the answer.
    let q = job("alice(1001)", "lab", "nosuch", "QOSGrpGRES", GPU8, "1:00:00");
    let LimitFinding::Unknown(line) = finding(&q, R24_11, &[]) else { panic!() };
    assert!(line.contains("QOS nosuch is not in Slurm's answer"), "{line}");
    assert_eq!(
        partition_qos("PartitionName=gpu AllowQos=ALL QoS=gpu MaxTime=1-00:00:00"),
        Some("gpu".into())
    );
}

#[test]
fn json_gives_the_numbers() {
    let r = job("alice(1001)", "lab", "normal", "AssocGrpGRES", GPU8, "02:00:00");
    let f = finding(&r, R24_11, &[]);
    assert_eq!(f.note(), None);
    assert_eq!(
        f.json(),
        serde_json::json!({
            "kind": "account", "scope": "account lab", "name": "GrpTRES", "tres": "gres/gpu",
            "limit": 16, "used": 12, "requested": 8, "unit": "GPUs", "exceeded": true,
            "text": "the cap of your account lab is GrpTRES gres/gpu=16 (GPUs); 12 in use; this job asks for 8"
        })
    );
    assert!(f.line().starts_with("limit: the cap of your account lab"));
}

#[test]
fn every_limit_reason_of_every_release_decodes() {
    // Reasons that start like a limit but name none with numbers.
    const NOT_LIMITS: &[&str] = &[
        "AssociationJobLimit",
        "AssociationResourceLimit",
        "AssociationTimeLimit",
        "QOSUsageThreshold",
        "QOSJobLimit",
        "QOSResourceLimit",
        "QOSTimeLimit",
        "QOSNotAllowed",
        "MaxMemPerLimit",
        "MaxPoweredUpNodes",
    ];
    let mut n = 0;
    for r in REASONS {
        let p = r.printed;
        let limitish = p.starts_with("Assoc") || p.starts_with("QOS") || p.starts_with("Max");
        if !limitish || NOT_LIMITS.contains(&p) {
            assert!(limit_reason(p).is_none(), "{p}");
            continue;
        }
        let d = limit_reason(p).unwrap_or_else(|| panic!("{} ({p}) does not decode", r.name));
        n += 1;
        // The name says whose: the enum's QOS/ASSOC part and its per-user/per-account part.
        let per_user = r.name.contains("PER_USER") || p.contains("PerUser");
        let per_acct = r.name.contains("PER_ACCT") || p.contains("PerAccount");
        // (WAIT_QOS_MAX_BB_MINS_PER_JOB prints as AssocMaxBBMinutesPerJob in every release.)
        let want = if p.starts_with("Assoc") {
            Owner::Assoc
        } else if per_user {
            Owner::QosUser
        } else if per_acct {
            Owner::QosAccount
        } else {
            Owner::Qos
        };
        assert_eq!(d.owner, want, "{} ({p})", r.name);
        let run = r.name.contains("RUN_MIN");
        assert_eq!(d.field.contains("RunMins"), run, "{} ({p}): {}", r.name, d.field);
    }
    assert!(n > 150, "{n}");
}
