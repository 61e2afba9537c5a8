//! The numbers of the limit a pending job waits for: `why` names a reason
//! such as `AssocGrpGRES` or `QOSMaxGRESPerUser`; this finds the limit it
//! stands for, where it is set, how much of it is in use and what the job
//! asks ("the cap of your account lab is GrpTRES gres/gpu=16 (GPUs); 12 in
//! use; this job asks for 8").
//!
//! The numbers come from `scontrol show assoc_mgr flags=assoc,qos`, which any
//! user may run: the controller's associations and QOS with each limit and its
//! use, `limit(used)`, `N` for no limit (src/scontrol/info_assoc_mgr.c,
//! read by [`parse_assoc_mgr`]). What each release prints:
//!
//! - every release: `GrpTRES`, `GrpTRESMins` (used in TRES-minutes of past
//!   usage), `GrpTRESRunMins` (TRES-minutes still to run of the running
//!   jobs) with use; `MaxTRESPJ`/`MaxTRESPN`/`MaxTRESMinsPJ` limits alone;
//!   `MaxJobs=` and `MaxSubmitJobs=` empty when unlimited; memory in MB; a
//!   QOS's per-user and per-account limits and their use only in its `User
//!   Limits`/`Account Limits` entries;
//! - 22.05: `Lft=`, and a `User Limits` entry headed by the uid alone;
//! - 23.02: `name(uid)` heads it, `Comment=` ends an association;
//! - 23.11: `Lineage=/physics/lab/0-alice/` instead of `Lft=`;
//! - 24.05: `MaxTRESRunMinsPA`/`MaxTRESRunMinsPU` in those entries;
//! - 26.05: a QOS's `Priority=` a number always (`NONE` before).
//!
//! Where slurm.conf has `PrivateData=usage`, a user who is neither an
//! operator nor the account's coordinator sees only their own user
//! associations, not their account's or its parents' (`assoc_mgr_info_get_pack_msg()`,
//! src/common/assoc_mgr.c); QOS are never filtered. The answer then says so.
//!
//! How Slurm applies them (`acct_policy_job_runnable_post_select()`,
//! src/slurmctld/acct_policy.c): the partition's QOS, then the job's (the
//! order flips with the job QOS's `OverPartQOS` flag, which assoc_mgr does not
//! print); a limit either QOS sets replaces the associations' limit of the
//! same kind on the same TRES; the association's `Grp*` limits are checked at
//! the job's association and up the account tree to root; its `Max*` limits
//! at the job's association (slurmdbd copies them down from the parents).
//! A reason names the kind of TRES (`GRES`, `License`, `BB`, `Unknown`) but
//! not which: the one is taken that is over its limit with this job's
//! request added, of those the job asks for.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Value, json};
use slurm_formats::units::{parse_duration, parse_size};

use super::Row;

// ----- the answer of `scontrol show assoc_mgr` ------------------------------------------

/// A limit and its use as assoc_mgr prints them: `16(12)`, `N(40)`, `8`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amount {
    /// The limit; `None`: no limit (`N`, or an empty value).
    pub limit: Option<u64>,
    /// The use, where the line prints it (minutes for `GrpWall` and the `*Mins` lines).
    pub used: Option<u64>,
}

/// The limits of an association, a QOS, or one user's or account's entry of a QOS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The single-number limits (`GrpJobs`, `GrpSubmitJobs`, `GrpWall`, `MaxJobs`,
    /// `MaxSubmitJobs`, `MaxWallPJ`, `MaxJobsPU`, `MaxSubmitJobsPA`, ...) by name.
    pub counts: BTreeMap<String, Amount>,
    /// The TRES lines (`GrpTRES`, `GrpTRESMins`, `MaxTRESPJ`, `MaxTRESPU`, ...):
    /// name → TRES (`gres/gpu`) → amount.
    pub tres: BTreeMap<String, BTreeMap<String, Amount>>,
}

impl Limits {
    fn tres_amount(&self, field: &str, tres: &str) -> Option<Amount> {
        self.tres.get(field).and_then(|m| m.get(tres)).copied()
    }
}

/// One association of assoc_mgr's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Association {
    /// `ClusterName`.
    pub cluster: String,
    /// `Account`.
    pub account: String,
    /// `UserName`'s name: `None` for an account's own association.
    pub user: Option<String>,
    /// `UserName`'s uid.
    pub uid: Option<u32>,
    /// `Partition`, for a user association of one partition.
    pub partition: Option<String>,
    /// `ID`.
    pub id: Option<u32>,
    /// `ParentAccount`'s name (an account association's; empty for a user's,
    /// whose parent is its account's association).
    pub parent: Option<String>,
    /// `ParentAccount`'s association id.
    pub parent_id: Option<u32>,
    /// `Lineage` (23.11 on): `/physics/lab/0-alice/`.
    pub lineage: Option<String>,
    /// The limits and their use.
    pub limits: Limits,
}

/// One user's entry of a QOS's `User Limits`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QosUser {
    /// The user's name (23.02 on).
    pub name: Option<String>,
    /// The uid.
    pub uid: Option<u32>,
    /// `MaxJobsPU`, `MaxSubmitJobsPU`, `MaxTRESPU`, `MaxTRESRunMinsPU` with this user's use.
    pub limits: Limits,
}

/// One QOS of assoc_mgr's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qos {
    /// Its name.
    pub name: String,
    /// Its id.
    pub id: Option<u32>,
    /// Its own limits (`Grp*`, `MaxTRESPJ`, `MaxTRESPN`, `MinTRESPJ`, ...).
    pub limits: Limits,
    /// `Account Limits`: account → `MaxJobsPA`, `MaxTRESPA`, ... with that account's use.
    pub accounts: Vec<(String, Limits)>,
    /// `User Limits`.
    pub users: Vec<QosUser>,
}

/// `scontrol show assoc_mgr flags=assoc,qos`, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AssocMgr {
    /// The associations the answer shows (with `PrivateData=usage`: the user's own).
    pub associations: Vec<Association>,
    /// The QOS.
    pub qos: Vec<Qos>,
}

/// The TRES lines of assoc_mgr's answer.
const TRES_LINES: &[&str] = &[
    "GrpTRES",
    "GrpTRESMins",
    "GrpTRESRunMins",
    "MaxTRESPJ",
    "MaxTRESPN",
    "MaxTRESMinsPJ",
    "MinTRESPJ",
    "MaxTRESPA",
    "MaxTRESPU",
    "MaxTRESRunMinsPA",
    "MaxTRESRunMinsPU",
];

/// The single-number limits of assoc_mgr's answer.
const COUNT_FIELDS: &[&str] = &[
    "GrpJobs",
    "GrpJobsAccrue",
    "GrpSubmitJobs",
    "GrpWall",
    "MaxJobs",
    "MaxJobsAccrue",
    "MaxSubmitJobs",
    "MaxWallPJ",
    "MaxJobsPA",
    "MaxJobsAccruePA",
    "MaxSubmitJobsPA",
    "MaxJobsPU",
    "MaxJobsAccruePU",
    "MaxSubmitJobsPU",
];

/// `16(12)`, `N(40)`, `N(1234.56)`, `8`, `N`, ``.
fn amount(value: &str) -> Amount {
    let (limit, used) = match value.split_once('(') {
        Some((l, u)) => (l, Some(u.trim_end_matches(')'))),
        None => (value, None),
    };
    let number = |s: &str| -> Option<u64> {
        let whole = s.split('.').next().unwrap_or("");
        whole.parse().ok()
    };
    Amount { limit: number(limit), used: used.and_then(number) }
}

/// `cpu=N(40),mem=N(0),gres/gpu=16(12)`.
fn tres_amounts(value: &str) -> BTreeMap<String, Amount> {
    value
        .split(',')
        .filter_map(|p| p.split_once('='))
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, v)| (name.to_owned(), amount(v)))
        .collect()
}

/// `alice(1001)` → (`alice`, 1001); `1001` → (None, 1001); `root(1)`.
fn name_and_id(value: &str) -> (Option<String>, Option<u32>) {
    match value.rsplit_once('(') {
        Some((name, id)) => {
            (Some(name.to_owned()).filter(|n| !n.is_empty()), id.trim_end_matches(')').parse().ok())
        }
        None if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => (None, value.parse().ok()),
        None => (Some(value.to_owned()).filter(|n| !n.is_empty()), None),
    }
}

/// A limit word into `limits`; `false` when the key is not a limit.
fn limit_word(limits: &mut Limits, key: &str, value: &str) -> bool {
    if TRES_LINES.contains(&key) {
        limits.tres.insert(key.to_owned(), tres_amounts(value));
    } else if COUNT_FIELDS.contains(&key) {
        limits.counts.insert(key.to_owned(), amount(value));
    } else {
        return false;
    }
    true
}

/// Where the reader is in a QOS.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QosPart {
    Own,
    Accounts,
    Users,
}

/// Reads `scontrol show assoc_mgr flags=assoc,qos` (the multi-line form of
/// every release, 22.05 through 26.05). Lines it does not know are skipped;
/// it never fails: an answer with no association (`No associations currently
/// cached in Slurm.`, or all hidden) reads as none.
pub fn parse_assoc_mgr(text: &str) -> AssocMgr {
    let mut mgr = AssocMgr::default();
    #[derive(PartialEq)]
    enum At {
        Nothing,
        Assoc,
        Qos(QosPart),
    }
    let mut at = At::Nothing;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            // A record or a heading starts at the margin.
            if let Some(rest) = t.strip_prefix("ClusterName=") {
                let mut a = Association::default();
                for (i, word) in t.split_whitespace().enumerate() {
                    let Some((key, value)) = word.split_once('=') else { continue };
                    match key {
                        "ClusterName" if i == 0 => {
                            a.cluster = rest.split_whitespace().next().unwrap_or("").into()
                        }
                        "Account" => a.account = value.to_owned(),
                        "UserName" => (a.user, a.uid) = name_and_id(value),
                        "Partition" => a.partition = Some(value.to_owned()).filter(|p| !p.is_empty()),
                        "ID" => a.id = value.parse().ok(),
                        _ => {}
                    }
                }
                mgr.associations.push(a);
                at = At::Assoc;
            } else if let Some(rest) = t.strip_prefix("QOS=") {
                let (name, id) = name_and_id(rest);
                mgr.qos.push(Qos { name: name.unwrap_or_default(), id, ..Qos::default() });
                at = At::Qos(QosPart::Own);
            } else {
                at = At::Nothing;
            }
            continue;
        }
        match at {
            At::Nothing => {}
            At::Assoc => {
                let Some(a) = mgr.associations.last_mut() else { continue };
                if t.starts_with("Comment=") {
                    // An admin's text, to the end of the line: never read as limits.
                    continue;
                }
                for word in t.split_whitespace() {
                    let Some((key, value)) = word.split_once('=') else { continue };
                    if limit_word(&mut a.limits, key, value) {
                        continue;
                    }
                    match key {
                        "ParentAccount" => (a.parent, a.parent_id) = name_and_id(value),
                        "Lineage" => a.lineage = Some(value.to_owned()),
                        _ => {}
                    }
                }
            }
            At::Qos(part) => {
                let Some(q) = mgr.qos.last_mut() else { continue };
                match t {
                    "Account Limits" => at = At::Qos(QosPart::Accounts),
                    "User Limits" => at = At::Qos(QosPart::Users),
                    "No Accounts" | "No Users" => {}
                    _ if !t.contains('=') => match part {
                        QosPart::Accounts => q.accounts.push((t.to_owned(), Limits::default())),
                        QosPart::Users => {
                            let (name, uid) = name_and_id(t);
                            q.users.push(QosUser { name, uid, limits: Limits::default() });
                        }
                        QosPart::Own => {}
                    },
                    _ => {
                        let limits = match part {
                            QosPart::Own => Some(&mut q.limits),
                            QosPart::Accounts => q.accounts.last_mut().map(|(_, l)| l),
                            QosPart::Users => q.users.last_mut().map(|u| &mut u.limits),
                        };
                        if let Some(limits) = limits {
                            for word in t.split_whitespace() {
                                if let Some((key, value)) = word.split_once('=') {
                                    limit_word(limits, key, value);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    mgr
}

/// The QOS of a partition, from `scontrol show partition -o NAME` (`QoS=gpuq`);
/// `None` for `QoS=N/A` or none.
pub fn partition_qos(text: &str) -> Option<String> {
    text.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .find(|(k, _)| *k == "QoS")
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty() && v != "N/A" && v != "(null)")
}

/// `squeue -h -j JOBID -O` with this format gives what a job record read as
/// JSON lacks for the limits (24.11 on: v0.0.42's rows have no `QOS` or
/// `ReqTRES`): [`squeue_fields`] reads it. `tres-alloc` prints a pending
/// job's requested TRES (src/squeue/print.c `_print_job_tres_alloc()`);
/// width 0 prints each value whole, `|` after each.
pub const SQUEUE_FORMAT: &str =
    "QOS:0|,tres-alloc:0|,tres-per-job:0|,tres-per-node:0|,tres-per-task:0|,NumTasks:0|";

/// `squeue -h -j JOBID -O` [`SQUEUE_FORMAT`]'s answer as record fields
/// (`QOS`, `ReqTRES`, `TresPerJob`, `TresPerNode`, `TresPerTask`, `NumTasks`),
/// `N/A` and `(null)` left out.
pub fn squeue_fields(text: &str) -> Row {
    const KEYS: [&str; 6] = ["QOS", "ReqTRES", "TresPerJob", "TresPerNode", "TresPerTask", "NumTasks"];
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    KEYS.iter()
        .zip(line.split('|'))
        .map(|(k, v)| ((*k).to_owned(), v.trim().to_owned()))
        .filter(|(_, v)| !v.is_empty() && v != "N/A" && v != "(null)")
        .collect()
}

// ----- the reason -----------------------------------------------------------------------

/// Whose limit a reason names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The job's association or one above it (`Assoc*`).
    Assoc,
    /// The QOS (`QOSGrp*`, `QOSMax*PerJob`, `QOSMin*`).
    Qos,
    /// The QOS, for each user (`QOSMax*PerUser`, `Max*RunMinsPerUser`).
    QosUser,
    /// The QOS, for each account (`Max*PerAccount`).
    QosAccount,
}

/// The kind of TRES a reason names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TresKind {
    /// `cpu`.
    Cpu,
    /// `mem` (MB).
    Mem,
    /// `node`.
    Node,
    /// `energy`.
    Energy,
    /// `billing`.
    Billing,
    /// Any `gres/*` (the reason does not say which).
    Gres,
    /// Any `license/*`.
    License,
    /// Any `bb/*`.
    BurstBuffer,
    /// Any other TRES (`fs/disk`, `vmem`, `pages`, ...: Slurm's `Unknown`).
    Other,
}

impl TresKind {
    /// Whether `tres` (`gres/gpu:a100`) is of this kind.
    pub fn holds(self, tres: &str) -> bool {
        match self {
            TresKind::Cpu => tres == "cpu",
            TresKind::Mem => tres == "mem",
            TresKind::Node => tres == "node",
            TresKind::Energy => tres == "energy",
            TresKind::Billing => tres == "billing",
            TresKind::Gres => tres.starts_with("gres/"),
            TresKind::License => tres.starts_with("license/"),
            TresKind::BurstBuffer => tres.starts_with("bb/"),
            TresKind::Other => {
                !["cpu", "mem", "node", "energy", "billing"].contains(&tres)
                    && !["gres/", "license/", "bb/"].iter().any(|p| tres.starts_with(p))
            }
        }
    }

    /// The one TRES of this kind, where there is one.
    fn single(self) -> Option<&'static str> {
        match self {
            TresKind::Cpu => Some("cpu"),
            TresKind::Mem => Some("mem"),
            TresKind::Node => Some("node"),
            TresKind::Energy => Some("energy"),
            TresKind::Billing => Some("billing"),
            _ => None,
        }
    }
}

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A TRES of this kind.
    Tres(TresKind),
    /// Running jobs.
    Jobs,
    /// Submitted jobs (pending ones included).
    SubmitJobs,
    /// Wall time in minutes.
    Wall,
}

/// The limit a pending reason stands for: whose, which assoc_mgr field, of what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitReason {
    /// Whose limit.
    pub owner: Owner,
    /// The field of assoc_mgr's answer that holds it: `GrpTRES`, `MaxTRESPU`, `MaxJobs`, ...
    pub field: &'static str,
    /// What it counts.
    pub resource: Resource,
}

/// The limit a reason as Slurm prints it names (`AssocGrpGRES` → the
/// association's `GrpTRES` on a `gres/*`), for the `Assoc*`, `QOS*` and
/// `Max*PerAccount`/`Max*PerUser` limit reasons of every release (the
/// RunMins per account/user ones from 24.05); `None` for any other reason.
pub fn limit_reason(code: &str) -> Option<LimitReason> {
    let (owner, rest) = if let Some(r) = code.strip_prefix("Assoc") {
        (Owner::Assoc, r)
    } else if let Some(r) = code.strip_prefix("QOS") {
        (Owner::Qos, r)
    } else if code.starts_with("Max") && (code.ends_with("PerAccount") || code.ends_with("PerUser")) {
        (Owner::Qos, code)
    } else {
        return None;
    };
    let (kind, rest) = ["Grp", "Max", "Min"].iter().find_map(|k| rest.strip_prefix(k).map(|r| (*k, r)))?;
    const RESOURCES: &[(&str, Resource)] = &[
        ("SubmitJobs", Resource::SubmitJobs),
        ("SubmitJob", Resource::SubmitJobs),
        ("Jobs", Resource::Jobs),
        ("Cpu", Resource::Tres(TresKind::Cpu)),
        ("CPU", Resource::Tres(TresKind::Cpu)),
        ("Memory", Resource::Tres(TresKind::Mem)),
        ("Mem", Resource::Tres(TresKind::Mem)),
        ("Node", Resource::Tres(TresKind::Node)),
        ("GRES", Resource::Tres(TresKind::Gres)),
        ("License", Resource::Tres(TresKind::License)),
        ("BB", Resource::Tres(TresKind::BurstBuffer)),
        ("Energy", Resource::Tres(TresKind::Energy)),
        ("Unknown", Resource::Tres(TresKind::Other)),
        ("Billing", Resource::Tres(TresKind::Billing)),
        ("Wall", Resource::Wall),
    ];
    let (resource, tail) = RESOURCES.iter().find_map(|(k, r)| rest.strip_prefix(k).map(|t| (*r, t)))?;
    let run = tail.contains("RunMinutes") || tail.contains("RunMins");
    let minutes = !run && tail.contains("Minutes");
    let per_user = tail.contains("PerUser");
    let per_account = tail.contains("PerAccount");
    let per_job = tail.contains("PerJob");
    let per_node = tail.contains("PerNode");
    let known = tail.is_empty()
        || tail.contains("Limit")
        || run
        || minutes
        || per_user
        || per_account
        || per_job
        || per_node
        || tail == "NotSatisfied";
    if !known {
        return None;
    }
    let owner = match owner {
        Owner::Qos if per_user => Owner::QosUser,
        Owner::Qos if per_account => Owner::QosAccount,
        o => o,
    };
    let field = match (kind, resource) {
        ("Grp", Resource::Jobs) => "GrpJobs",
        ("Grp", Resource::SubmitJobs) => "GrpSubmitJobs",
        ("Grp", Resource::Wall) => "GrpWall",
        ("Grp", _) if run => "GrpTRESRunMins",
        ("Grp", _) if minutes => "GrpTRESMins",
        ("Grp", _) => "GrpTRES",
        ("Max", Resource::Wall) => "MaxWallPJ",
        ("Max", Resource::Jobs) => match owner {
            Owner::QosUser => "MaxJobsPU",
            Owner::QosAccount => "MaxJobsPA",
            _ => "MaxJobs",
        },
        ("Max", Resource::SubmitJobs) => match owner {
            Owner::QosUser => "MaxSubmitJobsPU",
            Owner::QosAccount => "MaxSubmitJobsPA",
            _ => "MaxSubmitJobs",
        },
        ("Max", _) => match owner {
            Owner::QosUser if run => "MaxTRESRunMinsPU",
            Owner::QosAccount if run => "MaxTRESRunMinsPA",
            Owner::QosUser => "MaxTRESPU",
            Owner::QosAccount => "MaxTRESPA",
            _ if minutes => "MaxTRESMinsPJ",
            _ if per_node => "MaxTRESPN",
            _ => "MaxTRESPJ",
        },
        ("Min", Resource::Tres(_)) if owner == Owner::Qos => "MinTRESPJ",
        _ => return None,
    };
    Some(LimitReason { owner, field, resource })
}

/// The QOS field that, where a QOS sets it, replaces an association's `field`.
fn qos_counterpart(field: &str) -> &str {
    match field {
        "MaxJobs" => "MaxJobsPU",
        "MaxSubmitJobs" => "MaxSubmitJobsPU",
        other => other,
    }
}

// ----- the job's request ----------------------------------------------------------------

/// What a pending job is and asks, from its record (`scontrol show job`, text
/// or JSON, with [`squeue_fields`] added where the JSON lacks them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobAsk {
    /// Its user's name.
    pub user: String,
    /// Its user's uid.
    pub uid: Option<u32>,
    /// Its account.
    pub account: String,
    /// Its partitions (a pending job may name several).
    pub partitions: Vec<String>,
    /// Its QOS.
    pub qos: String,
    /// The TRES it asks for in all (`ReqTRES`, 22.05's `TRES` of a pending job,
    /// with GRES from `TresPerJob`/`TresPerNode`/`TresPerTask` where those lack
    /// them), in Slurm's order; memory in MB.
    pub tres: Vec<(String, u64)>,
    /// TRES per node, where `TresPerNode` gives it.
    pub per_node: BTreeMap<String, u64>,
    /// Its node count (the least it asks).
    pub nodes: u64,
    /// Its time limit in minutes, when it has one.
    pub minutes: Option<u64>,
}

impl JobAsk {
    /// How much of `tres` the job asks for in all.
    pub fn total(&self, tres: &str) -> Option<u64> {
        self.tres.iter().find(|(t, _)| t == tres).map(|(_, n)| *n)
    }

    /// How much of `tres` it asks for on one node.
    pub fn on_one_node(&self, tres: &str) -> Option<u64> {
        if tres == "node" {
            return Some(1);
        }
        self.per_node.get(tres).copied().or_else(|| self.total(tres).map(|n| n.div_ceil(self.nodes.max(1))))
    }
}

fn null(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v == "(null)" || v == "N/A"
}

/// A TRES count as Slurm prints it: `8`, memory and burst buffer with a unit (`64G`) → MB.
fn tres_count(name: &str, value: &str) -> Option<u64> {
    if let Ok(n) = value.parse::<u64>() {
        return Some(n);
    }
    if name == "mem" || name.starts_with("bb/") || value.ends_with(['K', 'M', 'G', 'T']) {
        return parse_size(value).map(|b| b / (1024 * 1024));
    }
    None
}

/// `cpu=16,mem=64G,node=1,billing=16,gres/gpu=8`.
fn tres_list(value: &str) -> Vec<(String, u64)> {
    value
        .split(',')
        .filter_map(|p| p.split_once('='))
        .filter_map(|(k, v)| Some((k.trim().to_owned(), tres_count(k.trim(), v.trim())?)))
        .collect()
}

/// `gres/gpu:8`, `gres:gpu:a100:2`, `gres/gpu:a100:2,gres/shard:1` → (`gres/gpu`, 8),
/// (`gres/gpu:a100`, 2) and (`gres/gpu`, 2), ...
fn gres_counts(value: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for item in value.split(',') {
        let Some(rest) = item.trim().strip_prefix("gres/").or_else(|| item.trim().strip_prefix("gres:"))
        else {
            continue;
        };
        let parts: Vec<&str> = rest.split([':', '=']).collect();
        let Some((count, names)) = parts.split_last() else { continue };
        let Ok(count) = count.parse::<u64>() else { continue };
        match names {
            [name] => out.push((format!("gres/{name}"), count)),
            [name, kind] => {
                out.push((format!("gres/{name}:{kind}"), count));
                out.push((format!("gres/{name}"), count));
            }
            _ => {}
        }
    }
    out
}

/// The job of `record`, as the limits need it.
pub fn job_ask(record: &Row) -> JobAsk {
    let get = |k: &str| record.get(k).map_or("", String::as_str);
    let (user, uid) = match get("UserId").split_once('(') {
        Some((name, id)) => (name.to_owned(), id.trim_end_matches(')').parse().ok()),
        None => (get("UserId").to_owned(), None),
    };
    let first_number =
        |k: &str| -> u64 { get(k).split(['-', ',']).next().and_then(|n| n.trim().parse().ok()).unwrap_or(0) };
    let nodes = first_number("NumNodes").max(1);
    let tasks = first_number("NumTasks").max(1);
    // ReqTRES (23.02 on); 22.05's TRES is the request until the job is allocated.
    let req = ["ReqTRES", "TRES", "AllocTRES"].iter().map(|k| get(k)).find(|v| !null(v)).unwrap_or("");
    let mut tres = tres_list(req);
    let mut per_node = BTreeMap::new();
    let mut extra: Vec<(String, u64)> = Vec::new();
    for (key, factor) in [("TresPerJob", 1), ("TresPerNode", nodes), ("TresPerTask", tasks)] {
        for (name, n) in gres_counts(get(key)) {
            if key == "TresPerNode" {
                per_node.insert(name.clone(), n);
            }
            match extra.iter_mut().find(|(t, _)| *t == name) {
                Some((_, total)) => *total = total.saturating_add(n.saturating_mul(factor)),
                None => extra.push((name, n.saturating_mul(factor))),
            }
        }
    }
    for (name, n) in extra {
        if !tres.iter().any(|(t, _)| *t == name) {
            tres.push((name, n));
        }
    }
    JobAsk {
        user,
        uid,
        account: get("Account").to_owned(),
        partitions: get("Partition").split(',').filter(|p| !null(p)).map(str::to_owned).collect(),
        qos: get("QOS").to_owned(),
        tres,
        per_node,
        nodes,
        minutes: parse_duration(get("TimeLimit")).map(|s| s.div_ceil(60)),
    }
}

// ----- the finding ----------------------------------------------------------------------

/// Where a limit is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// An account's own association: the job's account or one above it.
    Account {
        /// The account.
        account: String,
    },
    /// The job's user association.
    User {
        /// The user.
        user: String,
        /// Its account.
        account: String,
        /// Its partition, for a partition's association.
        partition: Option<String>,
    },
    /// A QOS as a whole.
    Qos {
        /// The QOS.
        qos: String,
    },
    /// A QOS, for each user.
    QosUser {
        /// The QOS.
        qos: String,
        /// The job's user.
        user: String,
    },
    /// A QOS, for each account.
    QosAccount {
        /// The QOS.
        qos: String,
        /// The job's account.
        account: String,
    },
}

impl Scope {
    /// `account`, `user`, `qos`, `qos_user`, `qos_account` (`--json`'s `kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Scope::Account { .. } => "account",
            Scope::User { .. } => "user",
            Scope::Qos { .. } => "qos",
            Scope::QosUser { .. } => "qos_user",
            Scope::QosAccount { .. } => "qos_account",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Account { account } => write!(f, "account {account}"),
            Scope::User { user, account, partition: None } => write!(f, "user {user} in account {account}"),
            Scope::User { user, account, partition: Some(p) } => {
                write!(f, "user {user} in account {account}, partition {p}")
            }
            Scope::Qos { qos } => write!(f, "QOS {qos}"),
            Scope::QosUser { qos, user } => write!(f, "QOS {qos} per user ({user})"),
            Scope::QosAccount { qos, account } => write!(f, "QOS {qos} per account ({account})"),
        }
    }
}

/// The limit that holds a job, with its numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Where it is set.
    pub scope: Scope,
    /// Its name as sacctmgr and assoc_mgr call it: `GrpTRES`, `MaxTRESPU`, `MaxJobs`, ...
    pub name: &'static str,
    /// The TRES (`gres/gpu`), for a TRES limit.
    pub tres: Option<String>,
    /// The limit.
    pub limit: u64,
    /// The use, where Slurm prints it (not for the per-job and per-node maxima).
    pub used: Option<u64>,
    /// What this job asks against it: the TRES in all (per node for `MaxTRESPN`),
    /// TRES times its time limit in minutes for the `*Mins` limits, 1 for the job
    /// limits, its time limit in minutes for the wall limits; `None` when its
    /// record does not say.
    pub requested: Option<u64>,
    /// The unit: `GPUs`, `CPUs`, `MB`, `GPU-minutes`, `jobs`, `minutes`, ...
    pub unit: String,
    /// Whether these numbers hold the job (use plus request over the limit, or
    /// the request alone over a per-job limit); `false`: the use changed since
    /// Slurm's last look, and the job may start at its next.
    pub exceeded: bool,
    /// The whole in one sentence.
    pub text: String,
}

/// What `why` can say of a limit reason's numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitFinding {
    /// The limit, found.
    Found(Limit),
    /// Why the numbers cannot be had, in one line.
    Unknown(String),
}

impl LimitFinding {
    /// The line `why` prints.
    pub fn line(&self) -> String {
        match self {
            LimitFinding::Found(l) => format!("limit: {}", l.text),
            LimitFinding::Unknown(why) => format!("limit: {why}"),
        }
    }

    /// `--json`'s `limit`: `{kind, scope, name, tres, limit, used, requested,
    /// unit, exceeded, text}`, or null when the numbers cannot be had.
    pub fn json(&self) -> Value {
        match self {
            LimitFinding::Found(l) => json!({
                "kind": l.scope.kind(),
                "scope": l.scope.to_string(),
                "name": l.name,
                "tres": l.tres,
                "limit": l.limit,
                "used": l.used,
                "requested": l.requested,
                "unit": l.unit,
                "exceeded": l.exceeded,
                "text": l.text,
            }),
            LimitFinding::Unknown(_) => Value::Null,
        }
    }

    /// `--json`'s `limit_note`: why the numbers cannot be had, or `None`.
    pub fn note(&self) -> Option<&str> {
        match self {
            LimitFinding::Found(_) => None,
            LimitFinding::Unknown(why) => Some(why),
        }
    }
}

/// A TRES in words, singular and plural: `gres/gpu` → GPU/GPUs, `mem` → MB/MB.
fn tres_words(tres: &str) -> (String, String) {
    let (one, many) = match tres {
        "cpu" => ("CPU".to_owned(), "CPUs".to_owned()),
        "mem" => ("MB".to_owned(), "MB".to_owned()),
        "node" => ("node".to_owned(), "nodes".to_owned()),
        "energy" => ("joule".to_owned(), "joules".to_owned()),
        "billing" => ("billing unit".to_owned(), "billing units".to_owned()),
        _ => {
            if let Some(g) = tres.strip_prefix("gres/") {
                let (name, kind) = g.split_once(':').map_or((g, None), |(n, k)| (n, Some(k)));
                let base = if name == "gpu" { "GPU".to_owned() } else { name.to_owned() };
                let one = kind.map_or(base.clone(), |k| format!("{k} {base}"));
                (one.clone(), if name == "gpu" { format!("{one}s") } else { one })
            } else if let Some(l) = tres.strip_prefix("license/") {
                (format!("{l} license"), format!("{l} licenses"))
            } else if tres.starts_with("bb/") {
                ("burst-buffer MB".to_owned(), "burst-buffer MB".to_owned())
            } else {
                (tres.to_owned(), tres.to_owned())
            }
        }
    };
    (one, many)
}

/// How a field weighs a request and its use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// Use plus the request against the limit (`GrpTRES`, `MaxTRESPU`, `GrpJobs`, ...).
    InUse,
    /// The request alone (`MaxTRESPJ`, `MaxWallPJ`, ...).
    PerJob,
    /// The request on one node (`MaxTRESPN`).
    PerNode,
    /// The request below the minimum (`MinTRESPJ`).
    Minimum,
    /// Past usage, which only decays (`GrpTRESMins`, `GrpWall`).
    Past,
    /// The minutes still to run of the running jobs (`*RunMins*`).
    Running,
    /// Jobs in the queue, the pending one among them (`*SubmitJobs*`).
    Queued,
}

fn measure(field: &str) -> Measure {
    match field {
        "MaxTRESPJ" | "MaxTRESMinsPJ" | "MaxWallPJ" => Measure::PerJob,
        "MaxTRESPN" => Measure::PerNode,
        "MinTRESPJ" => Measure::Minimum,
        "GrpTRESMins" | "GrpWall" => Measure::Past,
        "GrpTRESRunMins" | "MaxTRESRunMinsPU" | "MaxTRESRunMinsPA" => Measure::Running,
        "GrpSubmitJobs" | "MaxSubmitJobs" | "MaxSubmitJobsPU" | "MaxSubmitJobsPA" => Measure::Queued,
        _ => Measure::InUse,
    }
}

fn in_minutes(field: &str) -> bool {
    field.contains("Mins")
}

/// One limit where it is set, judged against the job.
fn judge(
    reason: &LimitReason,
    job: &JobAsk,
    scope: &Scope,
    tres: Option<&str>,
    amount: Amount,
) -> Option<Limit> {
    let limit = amount.limit?;
    let field = reason.field;
    let m = measure(field);
    let requested = match (tres, reason.resource) {
        (Some(t), _) if m == Measure::PerNode => job.on_one_node(t),
        (Some(t), _) if in_minutes(field) => job.total(t).and_then(|n| Some(n.saturating_mul(job.minutes?))),
        (Some(t), _) => job.total(t),
        (None, Resource::Wall) => job.minutes,
        (None, _) => Some(1),
    };
    let used = amount.used;
    let u = used.unwrap_or(0);
    let exceeded = match m {
        Measure::InUse | Measure::Running => requested.is_some_and(|r| u.saturating_add(r) > limit),
        Measure::PerJob | Measure::PerNode => requested.is_some_and(|r| r > limit),
        Measure::Minimum => requested.is_some_and(|r| r < limit),
        Measure::Past => u >= limit || requested.is_some_and(|r| r > limit || u.saturating_add(r) > limit),
        Measure::Queued => u >= limit,
    };
    let unit = match (tres, reason.resource) {
        (Some(t), _) if in_minutes(field) => format!("{}-minutes", tres_words(t).0),
        (Some(t), _) => tres_words(t).1,
        (None, Resource::Jobs) => "running jobs".to_owned(),
        (None, Resource::SubmitJobs) => "submitted jobs".to_owned(),
        (None, _) => "minutes".to_owned(),
    };
    let whose = match scope {
        Scope::Account { account } if *account == job.account => format!("your account {account}"),
        Scope::Account { account } => format!("account {account} (above your account {})", job.account),
        Scope::User { .. } => format!("your association ({scope})"),
        Scope::Qos { qos } => format!("QOS {qos}"),
        Scope::QosUser { qos, .. } => format!("QOS {qos} for each user"),
        Scope::QosAccount { qos, .. } => format!("QOS {qos} for each account"),
    };
    let setting = tres.map_or(format!("{field}={limit}"), |t| format!("{field} {t}={limit}"));
    let cap = if m == Measure::Minimum { "minimum" } else { "cap" };
    let per = match m {
        Measure::PerJob if reason.resource != Resource::Wall => " per job",
        Measure::PerNode => " per node",
        _ => "",
    };
    let mut text = format!("the {cap} of {whose} is {setting} ({unit}{per})");
    let (you, your) = match scope {
        Scope::QosUser { .. } => ("you use", "your"),
        Scope::QosAccount { .. } => ("your account uses", "your account's"),
        _ => ("", ""),
    };
    if let Some(used) = used {
        let part = match (m, reason.resource) {
            (Measure::Past, Resource::Wall) => format!("{used} used by past jobs"),
            (Measure::Past, _) => format!("{used} used so far (past usage, which only decays)"),
            (Measure::Running, _) if you.is_empty() => format!("running jobs hold {used}"),
            (Measure::Running, _) => format!("{your} running jobs hold {used}"),
            (Measure::Queued, _) => format!("{used} submitted, this one included"),
            (_, Resource::Jobs) if you.is_empty() => format!("{used} running"),
            (_, Resource::Jobs) => format!("{} {used}", you.replace("use", "run")),
            _ if you.is_empty() => format!("{used} in use"),
            _ => format!("{you} {used}"),
        };
        text.push_str("; ");
        text.push_str(&part);
    }
    match (requested, reason.resource, m) {
        (_, _, Measure::Queued) => {}
        (Some(_), Resource::Jobs, _) => text.push_str("; this job would be one more"),
        (Some(r), _, _) if in_minutes(field) => {
            let per_min = tres.and_then(|t| job.total(t)).unwrap_or(0);
            let mins = job.minutes.unwrap_or(0);
            text.push_str(&format!("; this job asks for {r} ({per_min} x {mins} min of --time)"));
        }
        (Some(r), _, Measure::PerNode) => text.push_str(&format!("; this job asks for {r} per node")),
        (Some(r), Resource::Wall, _) => text.push_str(&format!("; this job asks for {r} (its --time)")),
        (Some(r), _, _) => text.push_str(&format!("; this job asks for {r}")),
        (None, _, _) => text.push_str("; what this job asks is not in its record"),
    }
    if !exceeded && requested.is_some() {
        text.push_str(
            " (by these numbers it fits: the use changed since Slurm last looked, and it may start soon)",
        );
    }
    Some(Limit {
        scope: scope.clone(),
        name: field,
        tres: tres.map(str::to_owned),
        limit,
        used,
        requested,
        unit,
        exceeded,
        text,
    })
}

/// The TRES to look at for a reason: the one of its kind, else those of its
/// kind the job asks for, else (its record does not say) those with a limit.
fn candidates(kind: TresKind, job: &JobAsk, limits: &Limits, field: &str) -> Vec<String> {
    if let Some(one) = kind.single() {
        return vec![one.to_owned()];
    }
    let asked: Vec<String> = job.tres.iter().filter(|(t, _)| kind.holds(t)).map(|(t, _)| t.clone()).collect();
    if !asked.is_empty() {
        return asked;
    }
    limits
        .tres
        .get(field)
        .map(|m| {
            m.iter().filter(|(t, a)| kind.holds(t) && a.limit.is_some()).map(|(t, _)| t.clone()).collect()
        })
        .unwrap_or_default()
}

/// Looks through `levels` in order: the first limit the job is over, else
/// the first set.
struct Search<'a> {
    reason: &'a LimitReason,
    job: &'a JobAsk,
    first: Option<Limit>,
}

impl Search<'_> {
    /// `Some` when this level holds the job.
    fn level(
        &mut self,
        scope: &Scope,
        limits: &Limits,
        skip: &dyn Fn(Option<&str>) -> bool,
    ) -> Option<Limit> {
        let field = self.reason.field;
        let found: Vec<Limit> = match self.reason.resource {
            Resource::Tres(kind) => candidates(kind, self.job, limits, field)
                .iter()
                .filter(|t| !skip(Some(t)))
                .filter_map(|t| judge(self.reason, self.job, scope, Some(t), limits.tres_amount(field, t)?))
                .collect(),
            _ if skip(None) => Vec::new(),
            _ => limits
                .counts
                .get(field)
                .and_then(|a| judge(self.reason, self.job, scope, None, *a))
                .into_iter()
                .collect(),
        };
        for l in found {
            if l.exceeded {
                return Some(l);
            }
            if self.first.is_none() {
                self.first = Some(l);
            }
        }
        None
    }
}

/// What a limit is called in words, for the lines that say it was not found.
fn reason_words(reason: &LimitReason) -> String {
    match reason.resource {
        Resource::Tres(kind) => {
            let what = match kind {
                TresKind::Gres => "gres/*".to_owned(),
                TresKind::License => "license/*".to_owned(),
                TresKind::BurstBuffer => "bb/*".to_owned(),
                TresKind::Other => "a TRES".to_owned(),
                k => k.single().unwrap_or("").to_owned(),
            };
            format!("{} on {what}", reason.field)
        }
        _ => reason.field.to_owned(),
    }
}

/// The QOS a job's limits come from, in Slurm's order: its partitions' QOS,
/// then its own (a job QOS with `OverPartQOS` comes first in Slurm; assoc_mgr
/// does not print the flag).
fn job_qos<'a>(mgr: &'a AssocMgr, job: &JobAsk, partition_qos: &[String]) -> (Vec<&'a Qos>, Vec<String>) {
    let mut names: Vec<String> = partition_qos.to_vec();
    if !job.qos.is_empty() && !names.contains(&job.qos) {
        names.push(job.qos.clone());
    }
    let found = names.iter().filter_map(|n| mgr.qos.iter().find(|q| q.name == *n)).collect();
    let missing = names.iter().filter(|n| !mgr.qos.iter().any(|q| q.name == **n)).cloned().collect();
    (found, missing)
}

fn same_user(u: &QosUser, job: &JobAsk) -> bool {
    match (u.uid, job.uid) {
        (Some(a), Some(b)) => a == b,
        _ => u.name.as_deref() == Some(job.user.as_str()),
    }
}

/// The limit that holds `job` for `reason`, from assoc_mgr's answer `mgr`;
/// `partition_qos`: the QOS of the job's partitions (`scontrol show
/// partition`'s `QoS=`), which Slurm applies before the job's own.
pub fn find_limit(
    reason: &LimitReason,
    job: &JobAsk,
    mgr: &AssocMgr,
    partition_qos: &[String],
) -> LimitFinding {
    let (qoses, missing_qos) = job_qos(mgr, job, partition_qos);
    let mut search = Search { reason, job, first: None };
    let not_found = |what: String| {
        LimitFinding::Unknown(format!(
            "no {} that holds this job is in Slurm's answer ({what}); it may have changed since Slurm's last look \
             (scontrol show assoc_mgr flags=assoc,qos)",
            reason_words(reason)
        ))
    };
    match reason.owner {
        Owner::Assoc => {
            // A limit a QOS of the job sets replaces the associations' one.
            let qos_field = qos_counterpart(reason.field);
            let qos_sets = |tres: Option<&str>| {
                qoses.iter().any(|q| {
                    let limits = std::iter::once(&q.limits)
                        .chain(q.users.iter().filter(|u| same_user(u, job)).map(|u| &u.limits).take(1));
                    limits.into_iter().any(|l| match tres {
                        Some(t) => l.tres_amount(qos_field, t).is_some_and(|a| a.limit.is_some()),
                        None => l.counts.get(qos_field).is_some_and(|a| a.limit.is_some()),
                    })
                })
            };
            let mine = |a: &&Association| {
                a.account == job.account
                    && match (a.uid, job.uid) {
                        (Some(x), Some(y)) => x == y,
                        _ => a.user.as_deref() == Some(job.user.as_str()),
                    }
            };
            let assoc = mgr
                .associations
                .iter()
                .filter(mine)
                .find(|a| a.partition.as_ref().is_some_and(|p| job.partitions.contains(p)))
                .or_else(|| mgr.associations.iter().filter(mine).find(|a| a.partition.is_none()));
            let Some(assoc) = assoc else {
                return LimitFinding::Unknown(if mgr.associations.is_empty() {
                    "Slurm's answer shows no association at all (the site hides them, or does not enforce \
                     association limits); ask an admin for the numbers"
                        .to_owned()
                } else {
                    format!(
                        "your association (user {} in account {}) is not in Slurm's answer; ask an admin for the numbers",
                        job.user, job.account
                    )
                });
            };
            let scope = Scope::User {
                user: job.user.clone(),
                account: assoc.account.clone(),
                partition: assoc.partition.clone(),
            };
            if let Some(l) = search.level(&scope, &assoc.limits, &qos_sets) {
                return LimitFinding::Found(l);
            }
            if !reason.field.starts_with("Grp") {
                // The Max* limits hold at the job's association only (slurmdbd
                // copies a parent's down to it).
                return match search.first {
                    Some(l) => LimitFinding::Found(l),
                    None => {
                        not_found(format!("your association, user {} in account {}", job.user, job.account))
                    }
                };
            }
            // Up the tree: the account's association, then each parent to root.
            let mut next = mgr.associations.iter().find(|a| a.user.is_none() && a.account == assoc.account);
            let mut hidden = next.is_none().then(|| assoc.account.clone());
            let mut steps = 0;
            while let Some(a) = next {
                steps += 1;
                if steps > 64 {
                    break;
                }
                let scope = Scope::Account { account: a.account.clone() };
                if let Some(l) = search.level(&scope, &a.limits, &qos_sets) {
                    return LimitFinding::Found(l);
                }
                let Some(parent) = a.parent.as_deref() else { break };
                next = mgr
                    .associations
                    .iter()
                    .find(|p| p.user.is_none() && a.parent_id.is_some() && p.id == a.parent_id)
                    .or_else(|| mgr.associations.iter().find(|p| p.user.is_none() && p.account == parent));
                if next.is_none() {
                    hidden = Some(parent.to_owned());
                }
            }
            match (search.first, hidden) {
                (_, Some(account)) => LimitFinding::Unknown(format!(
                    "the numbers are hidden from you: Slurm shows you only your own associations (PrivateData=usage), \
                     and the limit is on account {account} or above it; an admin or the account's coordinator can see it"
                )),
                (Some(l), None) => LimitFinding::Found(l),
                (None, None) => not_found(format!("your account {} and the accounts above it", job.account)),
            }
        }
        Owner::Qos | Owner::QosUser | Owner::QosAccount => {
            if qoses.is_empty() {
                return LimitFinding::Unknown(format!(
                    "QOS {} is not in Slurm's answer; ask an admin for the numbers",
                    missing_qos.join(", ")
                ));
            }
            let mut looked = Vec::new();
            for q in &qoses {
                let entry = match reason.owner {
                    Owner::QosUser => {
                        q.users.iter().find(|u| same_user(u, job)).map(|u| {
                            (Scope::QosUser { qos: q.name.clone(), user: job.user.clone() }, &u.limits)
                        })
                    }
                    Owner::QosAccount => q.accounts.iter().find(|(a, _)| *a == job.account).map(|(_, l)| {
                        (Scope::QosAccount { qos: q.name.clone(), account: job.account.clone() }, l)
                    }),
                    _ => Some((Scope::Qos { qos: q.name.clone() }, &q.limits)),
                };
                let Some((scope, limits)) = entry else {
                    looked.push(format!(
                        "QOS {} has no entry for your {}",
                        q.name,
                        match reason.owner {
                            Owner::QosUser => "user",
                            _ => "account",
                        }
                    ));
                    continue;
                };
                looked.push(format!("QOS {}", q.name));
                if let Some(l) = search.level(&scope, limits, &|_| false) {
                    return LimitFinding::Found(l);
                }
            }
            match search.first {
                Some(l) => LimitFinding::Found(l),
                None => not_found(looked.join("; ")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_printed() {
        assert_eq!(amount("16(12)"), Amount { limit: Some(16), used: Some(12) });
        assert_eq!(amount("N(40)"), Amount { limit: None, used: Some(40) });
        assert_eq!(amount("N(1234567.89)"), Amount { limit: None, used: Some(1_234_567) });
        assert_eq!(amount("8"), Amount { limit: Some(8), used: None });
        assert_eq!(amount(""), Amount::default());
        assert_eq!(name_and_id("alice(1001)"), (Some("alice".into()), Some(1001)));
        assert_eq!(name_and_id("1001"), (None, Some(1001)));
        assert_eq!(name_and_id(""), (None, None));
    }

    #[test]
    fn reasons_decode_to_their_field() {
        let f = |c: &str| limit_reason(c).map(|r| (r.owner, r.field));
        assert_eq!(f("AssocGrpGRES"), Some((Owner::Assoc, "GrpTRES")));
        assert_eq!(f("AssocGrpCpuLimit"), Some((Owner::Assoc, "GrpTRES")));
        assert_eq!(f("AssocGrpCPUMinutesLimit"), Some((Owner::Assoc, "GrpTRESMins")));
        assert_eq!(f("AssocGrpGRESRunMinutes"), Some((Owner::Assoc, "GrpTRESRunMins")));
        assert_eq!(f("AssocMaxJobsLimit"), Some((Owner::Assoc, "MaxJobs")));
        assert_eq!(f("AssocMaxSubmitJobLimit"), Some((Owner::Assoc, "MaxSubmitJobs")));
        assert_eq!(f("AssocMaxGRESPerNode"), Some((Owner::Assoc, "MaxTRESPN")));
        assert_eq!(f("AssocMaxCpuMinutesPerJobLimit"), Some((Owner::Assoc, "MaxTRESMinsPJ")));
        assert_eq!(f("AssocMaxWallDurationPerJobLimit"), Some((Owner::Assoc, "MaxWallPJ")));
        assert_eq!(f("QOSMaxGRESPerUser"), Some((Owner::QosUser, "MaxTRESPU")));
        assert_eq!(f("QOSMaxJobsPerUserLimit"), Some((Owner::QosUser, "MaxJobsPU")));
        assert_eq!(f("QOSMaxSubmitJobPerUserLimit"), Some((Owner::QosUser, "MaxSubmitJobsPU")));
        assert_eq!(f("MaxGRESPerAccount"), Some((Owner::QosAccount, "MaxTRESPA")));
        assert_eq!(f("MaxJobsPerAccount"), Some((Owner::QosAccount, "MaxJobsPA")));
        assert_eq!(f("MaxCpuRunMinsPerUser"), Some((Owner::QosUser, "MaxTRESRunMinsPU")));
        assert_eq!(f("MaxGRESRunMinsPerAccount"), Some((Owner::QosAccount, "MaxTRESRunMinsPA")));
        assert_eq!(f("QOSGrpMemoryMinutes"), Some((Owner::Qos, "GrpTRESMins")));
        assert_eq!(f("QOSMinCpuNotSatisfied"), Some((Owner::Qos, "MinTRESPJ")));
        assert_eq!(f("QOSGrpWallLimit"), Some((Owner::Qos, "GrpWall")));
        for other in [
            "AssociationJobLimit",
            "QOSJobLimit",
            "QOSResourceLimit",
            "QOSUsageThreshold",
            "QOSNotAllowed",
            "MaxMemPerLimit",
            "MaxPoweredUpNodes",
            "Resources",
        ] {
            assert_eq!(limit_reason(other), None, "{other}");
        }
        assert_eq!(limit_reason("AssocGrpGRES").map(|r| r.resource), Some(Resource::Tres(TresKind::Gres)));
    }

    #[test]
    fn requests_read_from_the_record() {
        let mut r = Row::new();
        for (k, v) in [
            ("UserId", "alice(1001)"),
            ("Account", "lab"),
            ("Partition", "gpu,cpu"),
            ("QOS", "normal"),
            ("ReqTRES", "cpu=16,mem=64G,node=2,billing=16,gres/gpu=8"),
            ("TresPerNode", "gres/gpu:a100:4"),
            ("NumNodes", "2-2"),
            ("TimeLimit", "1-00:00:00"),
        ] {
            r.insert(k.into(), v.into());
        }
        let j = job_ask(&r);
        assert_eq!((j.user.as_str(), j.uid, j.account.as_str()), ("alice", Some(1001), "lab"));
        assert_eq!(j.partitions, ["gpu", "cpu"]);
        assert_eq!(j.total("mem"), Some(65536));
        assert_eq!(j.total("gres/gpu"), Some(8));
        assert_eq!(j.total("gres/gpu:a100"), Some(8));
        assert_eq!(j.on_one_node("gres/gpu:a100"), Some(4));
        assert_eq!(j.on_one_node("cpu"), Some(8));
        assert_eq!(j.minutes, Some(1440));
        // 22.05: TRES= of a pending job, GRES only in TresPerJob.
        let mut old = Row::new();
        old.insert("TRES".into(), "cpu=1,mem=100M,node=1,billing=1".into());
        old.insert("TresPerJob".into(), "gres:gpu:8".into());
        let j = job_ask(&old);
        assert_eq!((j.total("mem"), j.total("gres/gpu")), (Some(100), Some(8)));
        assert_eq!(
            squeue_fields("normal|cpu=4,mem=8G,node=1,billing=4,gres/gpu=2|N/A|gres/gpu:2|N/A|1|\n")
                .into_iter()
                .collect::<Vec<_>>(),
            [
                ("NumTasks".to_owned(), "1".to_owned()),
                ("QOS".to_owned(), "normal".to_owned()),
                ("ReqTRES".to_owned(), "cpu=4,mem=8G,node=1,billing=4,gres/gpu=2".to_owned()),
                ("TresPerNode".to_owned(), "gres/gpu:2".to_owned()),
            ]
        );
        assert_eq!(
            partition_qos("PartitionName=gpu AllowQos=ALL QoS=gpuq DefaultTime=NONE"),
            Some("gpuq".into())
        );
        assert_eq!(partition_qos("PartitionName=gpu AllowQos=ALL QoS=N/A"), None);
    }
}
