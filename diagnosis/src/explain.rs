//! The explanations: a reason, an exit code and a job state in words, and
//! who resolves a reason. The reasons themselves (which exist where) are the
//! table in [`super::reasons`].

use super::reasons::{self, FreeText};

/// Who or what ends a pending reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// It resolves with time: resources free up, the begin time comes.
    Time,
    /// The user must act (release a hold, fix a dependency, shrink a request).
    User,
    /// Only an administrator can resolve it (a limit, a drained node, a down partition).
    Admin,
    /// Not a pending reason (the job ran or ended, or Slurm gives none).
    None,
}

impl Remedy {
    /// The word used in `--json` output: `time`, `user`, `admin`, `none`.
    pub fn name(self) -> &'static str {
        match self {
            Remedy::Time => "time",
            Remedy::User => "user",
            Remedy::Admin => "admin",
            Remedy::None => "none",
        }
    }
}

/// A reason in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// What the reason means.
    pub meaning: String,
    /// Who or what resolves it.
    pub remedy: Remedy,
    /// What to do, with `JOBID` standing for the job id.
    pub action: String,
}

fn ex(meaning: &str, remedy: Remedy, action: &str) -> Explanation {
    Explanation { meaning: meaning.to_owned(), remedy, action: action.to_owned() }
}

/// The reason code at the start of a reason as Slurm shows it (underscores
/// or spaces): `ReqNodeNotAvail,_UnavailableNodes:node2` → `ReqNodeNotAvail`,
/// `RaisedSignal:9(Killed)` → `RaisedSignal`.
pub fn reason_code(reason: &str) -> &str {
    let end = reason.find([',', ' ', '(', ':', '_']).unwrap_or(reason.len());
    reason[..end].trim()
}

/// A reason as shown (spaces, not underscores: `Reason` of `scontrol show
/// job`, or `state_description` of its JSON), with the reason's own string
/// when the release gives it apart (`state_reason` of the JSON): its code
/// (the string Slurm prints for the reason) and its words, `None` for a
/// reason this code does not know.
pub fn read_reason(shown: &str, code: Option<&str>) -> (String, Option<Explanation>) {
    let shown = shown.trim();
    if let Some(f) = reasons::free_text(shown) {
        let printed = reasons::by_name(f.reason).map_or("", |r| r.printed);
        if code.is_none_or(|c| c == printed) {
            return (printed.to_owned(), Some(free_text_explanation(f)));
        }
    }
    let code = code.filter(|c| !c.is_empty()).unwrap_or_else(|| reason_code(shown));
    (code.to_owned(), explain_reason(code))
}

/// `RaisedSignal:9(Killed)` (23.02 on: `FAIL_SIGNAL`, written by
/// `src/slurmctld/job_mgr.c` as `RaisedSignal:%d(%s)` with strsignal's name):
/// the signal and its name.
pub fn raised_signal(reason: &str) -> Option<(u32, String)> {
    let rest = reason.trim().strip_prefix("RaisedSignal:")?;
    let (num, name) = rest.split_once('(').unwrap_or((rest, ""));
    Some((num.trim().parse().ok()?, name.trim_end_matches(')').replace('_', " ")))
}

/// Whether a job in `state` (Slurm's word: `PENDING`, `CANCELLED`, ...) can
/// still run or is running: not ended. `EXPEDITING` (25.11: an expedited
/// requeue in progress), `REQUEUED`, the held requeue states and the flags
/// `scontrol` shows instead of the base state (src/common/slurm_protocol_defs.c
/// `job_state_string()`) are not ended.
pub fn is_active_state(state: &str) -> bool {
    matches!(
        state.split_whitespace().next().unwrap_or(""),
        "PENDING"
            | "RUNNING"
            | "SUSPENDED"
            | "COMPLETING"
            | "CONFIGURING"
            | "STAGE_OUT"
            | "EXPEDITING"
            | "RESIZING"
            | "REQUEUED"
            | "REQUEUE_FED"
            | "REQUEUE_HOLD"
            | "SPECIAL_EXIT"
            | "STOPPED"
            | "RESV_DEL_HOLD"
            | "SIGNALING"
            | "POWER_UP_NODE"
    )
}

/// Whether a job in `state` runs (or is about to) rather than waits: `why`
/// has nothing to wait for.
pub fn is_running_state(state: &str) -> bool {
    matches!(
        state.split_whitespace().next().unwrap_or(""),
        "RUNNING" | "COMPLETING" | "CONFIGURING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "POWER_UP_NODE"
    )
}

/// The words of a free text (see [`reasons::FREE_TEXTS`]).
fn free_text_explanation(f: &FreeText) -> Explanation {
    use Remedy::{Time, User};
    const UNIT: &str = "A topology unit is a group of nodes the cluster's topology plugin keeps together \
         (the nodes under one switch for topology/tree, one block for topology/block, one ring segment \
         for topology/ring)";
    let (what, remedy, action) = match f.text {
        "Required nodes lack available resources" => (
            "the nodes the job names (--nodelist) lack free resources in their topology unit",
            Time,
            "wait for them to free up, or drop --nodelist so Slurm can pick nodes of any unit",
        ),
        "Required nodes do not fit topology" => (
            "the nodes the job names (--nodelist) are not in one topology unit, as the request needs",
            User,
            "name nodes of one unit, or drop --nodelist (scontrol show topology lists the units)",
        ),
        "No suitable topology unit found for segment" => (
            "no topology unit can hold one segment (--segment nodes) of the job",
            User,
            "a smaller --segment (it must divide --nodes) fits more units; wait, or resubmit with one",
        ),
        "No suitable topology unit found" => (
            "no topology unit has enough usable nodes for the whole request",
            Time,
            "wait for the nodes of one unit to free up; a request for fewer nodes fits more units, and on a \
             block or ring topology --segment=N lets Slurm spread the job over several units in pieces of N nodes",
        ),
        "Insufficient resources in topology unit" => (
            "the topology unit Slurm picked has too few free CPUs, memory or GPUs on its nodes",
            Time,
            "wait; a smaller request per node (fewer GPUs or CPUs, less --mem) fits sooner",
        ),
        "Weight-based selection could not satisfy request within topology unit" => (
            "within a topology unit, the nodes Slurm prefers by weight do not make up the request",
            Time,
            "wait; if it lasts, ask an admin (node weights and the topology)",
        ),
        "Exceeded maximum node limit during topology allocation" => (
            "placing the job in a topology unit would give it more nodes than its maximum (--nodes=MIN-MAX)",
            User,
            "allow more nodes (a larger MAX in --nodes) or ask for fewer resources per node",
        ),
        "No available nodes in topology" => (
            "no node of the topology is available to the job now (busy, down, drained, or outside the topology)",
            Time,
            "wait; if its nodes are down or drained, ask an admin",
        ),
        _ => return free_words(f),
    };
    Explanation {
        meaning: format!(
            "Slurm's topology plugin cannot place the job: {what} (Slurm says: {}). {UNIT}",
            f.text
        ),
        remedy,
        action: action.to_owned(),
    }
}

/// The words of a free text that is not a topology one.
fn free_words(f: &FreeText) -> Explanation {
    use Remedy::User;
    match f.reason {
        "WAIT_HELD_USER" => ex(
            "the job was requeued and held (scontrol requeuehold, an exit code in RequeueExitHold, or on \
             Slurm 25.11 and newer an expedited requeue whose node epilogs found no fault, so Slurm takes the \
             failure for the job's own)",
            User,
            "find why it failed (spank-gpu autopsy JOBID), then scontrol release JOBID",
        ),
        _ => {
            let printed = reasons::by_name(f.reason).map_or("", |r| r.printed);
            explain_reason(printed).unwrap_or_else(|| ex(f.text, User, "see scontrol show job JOBID"))
        }
    }
}

/// A reason as Slurm prints it (the code only, see [`reason_code`]) in
/// words; `None` for a string this table does not know (a newer Slurm).
pub fn explain_reason(printed: &str) -> Option<Explanation> {
    use Remedy::{Admin, None as Nothing, Time, User};
    let e = match printed {
        "None" => ex(
            "Slurm gives no reason (the job is not pending, or was just submitted)",
            Nothing,
            "wait a few seconds and ask again",
        ),
        "Priority" => ex(
            "a slot is free but other jobs have higher priority: it is not your turn yet",
            Time,
            "wait; it resolves as the jobs ahead of you start and your account's recent usage decays (sprio shows the parts)",
        ),
        "Dependency" => ex(
            "the job waits for the jobs it depends on to finish",
            Time,
            "wait for those jobs (scontrol show job JOBID shows the dependency)",
        ),
        "Resources" => ex(
            "no slot is free now for what the job asks for",
            Time,
            "wait; it resolves as running jobs end. A shorter --time or a smaller request lets backfill start it sooner",
        ),
        "PartitionNodeLimit" => ex(
            "the job asks for more nodes than the partition allows (or the partition's nodes cannot satisfy it)",
            User,
            "resubmit with fewer nodes or to another partition (scontrol show partition)",
        ),
        "PartitionTimeLimit" => ex(
            "the job's --time is above the partition's MaxTime",
            User,
            "lower --time: scontrol update jobid=JOBID TimeLimit=... or resubmit",
        ),
        "PartitionDown" => ex(
            "the partition is down (or its nodes are down)",
            Admin,
            "ask an admin, or resubmit to another partition",
        ),
        "PartitionInactive" => {
            ex("the partition is inactive", Admin, "ask an admin, or resubmit to another partition")
        }
        "JobHeldAdmin" => {
            ex("an administrator holds the job", Admin, "ask an admin why; only they can release it")
        }
        "BeginTime" => ex(
            "the job's --begin time has not come yet",
            Time,
            "wait, or change it: scontrol update jobid=JOBID StartTime=now",
        ),
        "Licenses" => ex("the licenses the job asks for are in use", Time, "wait for them to be free"),
        "AssociationJobLimit" => ex(
            "your association (user/account) has reached its job limit",
            Time,
            "wait for your other jobs to end",
        ),
        "AssociationResourceLimit" => ex(
            "your association (user/account) has reached a resource limit",
            Time,
            "wait for your other jobs to end; if none run, ask an admin",
        ),
        "AssociationTimeLimit" => {
            ex("the job's --time is above your association's limit", User, "lower --time, or ask an admin")
        }
        "Reservation" => ex(
            "the job waits for its reservation to start",
            Time,
            "wait for the reservation (scontrol show reservation)",
        ),
        "ReqNodeNotAvail" => ex(
            "a node the job needs is not available (drained, down or reserved)",
            Admin,
            "see the nodes below; exclude them (--exclude) and resubmit, or ask an admin",
        ),
        "JobHeldUser" => ex("you (or your job's owner) held the job", User, "scontrol release JOBID"),
        "FrontEndDown" => ex("no front end node is available", Admin, "ask an admin"),
        "SchedDefer" => ex(
            "the scheduler deferred the job (immediate allocation not possible)",
            Time,
            "resubmit without --immediate, or wait",
        ),
        "NodeDown" => {
            ex("a node the job needs or ran on is down", Admin, "ask an admin; resubmit excluding the node")
        }
        "BadConstraints" => ex(
            "no node can satisfy the job's constraints (--constraint, --gres, memory, CPUs)",
            User,
            "fix the request (scontrol show job JOBID, sinfo -o '%N %f %G %m %c') and resubmit",
        ),
        "SystemFailure" => {
            ex("Slurm failed (a slurmd or the controller)", Admin, "resubmit; if it repeats, ask an admin")
        }
        "JobLaunchFailure" => ex(
            "Slurm could not launch the job (often: its --output/--error file could not be opened, or its working directory is missing)",
            User,
            "check the output paths and the working directory, then resubmit",
        ),
        "NonZeroExitCode" => {
            ex("the job's program exited with a non-zero status", User, "read the job's output")
        }
        "TimeLimit" => {
            ex("the job reached its --time limit", User, "checkpoint and requeue, or ask for more --time")
        }
        "InactiveLimit" => ex(
            "the job reached the inactivity limit (its srun/salloc went away)",
            User,
            "keep the launching process alive, or use sbatch",
        ),
        "InvalidAccount" => ex(
            "the job's account is invalid or you are not in it",
            User,
            "resubmit with a valid --account (sacctmgr show assoc user=$USER)",
        ),
        "InvalidQOS" => ex(
            "the job's QOS is invalid for you",
            User,
            "resubmit with a valid --qos (sacctmgr show assoc user=$USER format=qos)",
        ),
        "QOSUsageThreshold" => ex("the QOS usage is above its threshold", Admin, "ask an admin"),
        "QOSJobLimit" => ex("the QOS job limit is reached", Time, "wait for other jobs in the QOS to end"),
        "QOSResourceLimit" => ex(
            "a QOS resource limit is reached",
            Time,
            "wait for other jobs in the QOS to end; if none run, ask an admin",
        ),
        "QOSTimeLimit" => {
            ex("the job's --time is above the QOS limit", User, "lower --time or use another QOS")
        }
        "BlockMaxError" | "BlockFreeAction" => {
            ex("a BlueGene block state (not used on this kind of cluster)", Admin, "ask an admin")
        }
        "Cleaning" => {
            ex("the job was requeued and Slurm is still cleaning up its previous run", Time, "wait")
        }
        "Prolog" => ex("the job's prolog is running", Time, "wait; if it lasts, ask an admin"),
        "QOSNotAllowed" => ex(
            "the job's QOS is not allowed in this partition or for you",
            User,
            "resubmit with an allowed --qos",
        ),
        "AccountNotAllowed" => ex(
            "the job's account is not allowed in this partition",
            User,
            "resubmit with an allowed --account or partition",
        ),
        "DependencyNeverSatisfied" => ex(
            "a job this one depends on ended in a way the dependency rules out (for afterok: it failed); this job will never start",
            User,
            "scancel JOBID, fix the failed job and resubmit the chain (or use afterany)",
        ),
        "JobHoldMaxRequeue" => ex(
            "the job was requeued too many times and is held",
            User,
            "find why it fails (spank-gpu autopsy JOBID), then scontrol release JOBID",
        ),
        "JobArrayTaskLimit" => ex(
            "the array's %N limit on running tasks is reached",
            Time,
            "wait, or raise it: scontrol update jobid=JOBID ArrayTaskThrottle=N",
        ),
        "BurstBufferResources" => ex("the burst buffer has no room", Time, "wait"),
        "BurstBufferStageIn" => ex("the burst buffer is staging in data", Time, "wait"),
        "BurstBufferOperation" => ex("a burst buffer operation failed", Admin, "ask an admin"),
        "PowerNotAvail" => ex("not enough power is available", Time, "wait"),
        "PowerReserved" => ex("the power is reserved for other jobs", Time, "wait"),
        "DeadLine" => {
            ex("the job cannot end before its --deadline", User, "change or drop --deadline and resubmit")
        }
        "PartitionConfig" => ex(
            "the partition's configuration rules the request out",
            User,
            "check the partition (scontrol show partition) and resubmit",
        ),
        "AccountingPolicy" => ex(
            "an accounting policy limit holds the job",
            Admin,
            "ask an admin which limit (sacctmgr show assoc user=$USER)",
        ),
        "FedJobLock" => ex("the job waits for the federation to agree on it", Time, "wait"),
        "OutOfMemory" => ex("the job used more memory than it asked for", User, "ask for more --mem"),
        "MaxMemPerLimit" => ex(
            "the job asks for more memory per CPU/node than the partition allows",
            User,
            "lower --mem/--mem-per-cpu or ask for more CPUs",
        ),
        "ReservationDeleted" => ex(
            "the job's reservation was deleted",
            User,
            "resubmit without --reservation or with another one",
        ),
        "RaisedSignal" => ex(
            "the job's program was ended by a signal (Slurm's reason names it: RaisedSignal:9(Killed))",
            User,
            "see what sent it: spank-gpu autopsy JOBID",
        ),
        "ReservationInvalid" => ex(
            "the job's reservation is no longer valid for it (changed, or its nodes or users no longer fit), so Slurm holds the job",
            User,
            "move it to a valid reservation (scontrol update jobid=JOBID ReservationName=NAME releases it), or ask the reservation's admin",
        ),
        "Constraints" => ex(
            "no node satisfies the job's extra constraints (--extra) now; Slurm keeps it pending in case one does later",
            Time,
            "wait, or compare --extra with the nodes' Extra (scontrol show node) and change it: scontrol update jobid=JOBID Extra=...",
        ),
        "MaxPoweredUpNodes" => ex(
            "starting the job would power up more nodes than the cluster's MaxPoweredUpNodes allows (power saving)",
            Time,
            "wait; it resolves as powered-up nodes free up or power down",
        ),
        "MpiPortsBusy" => ex(
            "the nodes picked for the job have no free MPI ports left (MpiParams=ports=, with the step manager)",
            Time,
            "wait for steps of other jobs on those nodes to end; if it lasts, ask an admin",
        ),
        "NvidiaImexChannels" => ex(
            "no NVIDIA IMEX channel is free for the job (switch/nvidia_imex gives each job a channel of its own)",
            Time,
            "wait for jobs that hold IMEX channels to end; if none run, ask an admin",
        ),
        other => return limit_explanation(other),
    };
    Some(e)
}

/// The `Assoc*`, `QOS*` and `Max*PerAccount`/`Max*PerUser` limit family in
/// words. The `*RunMinutes` and `*RunMins*` limits (sacctmgr's
/// `GrpTRESRunMins`, `MaxTRESRunMinsPerAccount`, `MaxTRESRunMinsPerUser`)
/// count the TRES-minutes the running jobs have left (each running job: its
/// TRES times the minutes of its time limit still to run): they resolve as
/// those jobs progress and end. The `Grp*Minutes` ones (`GrpTRESMins`) count
/// past usage, which only decays (PriorityDecayHalfLife) or is reset: they
/// do not resolve by waiting for jobs. (Slurm's resource_limits.html and
/// sacctmgr(1) at each tag.)
fn limit_explanation(printed: &str) -> Option<Explanation> {
    let (scope, rest) = if let Some(r) = printed.strip_prefix("Assoc") {
        ("your association's (user/account)", r)
    } else if let Some(r) = printed.strip_prefix("QOS") {
        ("the QOS's", r)
    } else if printed.starts_with("Max") && (printed.ends_with("PerAccount") || printed.ends_with("PerUser"))
    {
        ("the QOS's", printed)
    } else {
        return None;
    };
    let (kind, rest) = ["Grp", "Max", "Min"].iter().find_map(|k| rest.strip_prefix(k).map(|r| (*k, r)))?;
    // (name in the reason, the resource in words, its unit in "UNIT-minutes")
    const RESOURCES: &[(&str, &str, &str)] = &[
        ("SubmitJobs", "submitted jobs", "job"),
        ("Submit", "submitted jobs", "job"),
        ("Jobs", "running jobs", "job"),
        ("Cpu", "CPUs", "CPU"),
        ("CPU", "CPUs", "CPU"),
        ("Memory", "memory", "memory"),
        ("Mem", "memory", "memory"),
        ("Node", "nodes", "node"),
        ("GRES", "GPUs/generic resources", "GPU (GRES)"),
        ("License", "licenses", "license"),
        ("BB", "burst buffer", "burst-buffer"),
        ("Energy", "energy", "energy"),
        ("Unknown", "a trackable resource", "TRES"),
        ("Billing", "billing units", "billing"),
        ("Wall", "wall time", "wall"),
    ];
    let (what, unit, tail) =
        RESOURCES.iter().find_map(|(k, w, u)| rest.strip_prefix(k).map(|t| (*w, *u, t)))?;
    let per = ["PerJob", "PerNode", "PerUser", "PerAccount"].iter().find(|p| tail.contains(**p)).copied();
    let run = tail.contains("RunMinutes") || tail.contains("RunMins");
    let minutes = !run && tail.contains("Minutes");
    let known_tail = tail.is_empty()
        || tail.contains("Limit")
        || run
        || minutes
        || per.is_some()
        || tail == "NotSatisfied"
        || tail.starts_with("Duration");
    if !known_tail {
        return None;
    }
    let per_words = match per {
        Some("PerJob") => " per job",
        Some("PerNode") => " per node",
        Some("PerUser") => " per user",
        Some("PerAccount") => " per account",
        _ => "",
    };
    if run {
        let whose = match (kind, per) {
            ("Grp", _) => "of your account/QOS",
            (_, Some("PerUser")) => "of your user",
            _ => "of your account",
        };
        return Some(Explanation {
            meaning: format!(
                "{scope} limit on the {unit}-minutes of running jobs{per_words} is reached ({printed}): each running \
                 job {whose} counts its {what} times the minutes of its time limit it has left"
            ),
            remedy: Remedy::Time,
            action: format!(
                "it resolves as those running jobs progress and end; a shorter --time or a smaller request needs \
                 fewer {unit}-minutes and starts sooner"
            ),
        });
    }
    let amount = if minutes { format!("{what} x minutes") } else { what.to_owned() };
    Some(match kind {
        "Grp" if minutes => Explanation {
            meaning: format!(
                "{scope} group limit on {amount} used is reached ({printed}): it counts past usage, not running jobs"
            ),
            remedy: Remedy::Admin,
            action: "this does not resolve by waiting for jobs (the usage only decays or is reset): ask an admin \
                     to raise the limit, or run under another account/QOS"
                .to_owned(),
        },
        "Grp" => Explanation {
            meaning: format!("{scope} group limit on {amount} is reached by running jobs ({printed})"),
            remedy: Remedy::Time,
            action: "it resolves when jobs of your account/QOS end; if none run, ask an admin".to_owned(),
        },
        "Min" => Explanation {
            meaning: format!("the job asks for fewer {amount} than {scope} minimum ({printed})"),
            remedy: Remedy::User,
            action: "ask for more, or use another QOS".to_owned(),
        },
        _ if matches!(per, Some("PerUser" | "PerAccount")) || what.ends_with("jobs") => Explanation {
            meaning: format!("{scope} maximum of {amount}{per_words} is reached ({printed})"),
            remedy: Remedy::Time,
            action: "it resolves when your other jobs end".to_owned(),
        },
        _ => Explanation {
            meaning: format!("the job asks for more than {scope} maximum of {amount}{per_words} ({printed})"),
            remedy: Remedy::User,
            action: "it never starts as submitted: shrink the request (scontrol update jobid=JOBID ...) or ask an admin"
                .to_owned(),
        },
    })
}

// ----- exits and states -------------------------------------------------------------------

/// `ExitCode` signals that are not signals: Slurm stores a launch error or
/// its own marker in the wait status, whose low 7 bits `scontrol`/`sacct`
/// print as the signal. `ESLURMD_IO_ERROR` (4021, slurm/slurm_errno.h 22.05
/// through 26.05) is 53: slurmstepd could not open the job's
/// `--output`/`--error` (src/slurmd/slurmstepd/io.c, mgr.c). `SIG_OOM` (253,
/// src/common/slurm_protocol_defs.h) is 125: a task was killed for its
/// memory (src/slurmctld/job_mgr.c ends the job `OUT_OF_MEMORY`).
const NOT_SIGNALS: &[(u32, &str)] = &[
    (
        53,
        "Slurm could not set up the job's output at launch (ESLURMD_IO_ERROR: its --output/--error could not be opened); the program never ran",
    ),
    (
        125,
        "the kernel killed a task for using more memory than the job's limit (Slurm's out-of-memory marker, SIG_OOM): no program exit status",
    ),
];

/// The program's exit status or the signal that ended it: Slurm's `ExitCode=C:S`.
pub fn exit_in_words(exit_code: &str) -> String {
    let (code, sig) = exit_code.split_once(':').unwrap_or((exit_code, "0"));
    let code: u32 = code.trim().parse().unwrap_or(0);
    let sig: u32 = sig.trim().parse().unwrap_or(0);
    if let Some((_, words)) = NOT_SIGNALS.iter().find(|(s, _)| *s == sig).filter(|_| code == 0) {
        return (*words).to_owned();
    }
    match (code, sig) {
        (0, 0) => "the program exited with status 0 (success)".to_owned(),
        (0, s) if s > 64 => format!("Slurm ended it before or at launch (code {s}; no program exit status)"),
        (c, 0) => format!("the program exited with status {c} (its own error, not a signal)"),
        (_, s) => format!("the program was killed by signal {s} ({})", signal_name(s)),
    }
}

fn signal_name(sig: u32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV: a crash",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "a signal",
    }
}

/// A job's final state (`sacct` State, `CANCELLED by 1000` included) in words.
pub fn state_in_words(state: &str) -> String {
    let word = state.split_whitespace().next().unwrap_or("");
    match word {
        "COMPLETED" => "the job completed: every step exited 0".to_owned(),
        "FAILED" => "the job failed: its program exited non-zero, or Slurm could not launch it".to_owned(),
        "CANCELLED" => match state.strip_prefix("CANCELLED by ") {
            Some(who) if who.bytes().all(|b| b.is_ascii_digit()) => {
                format!("the job was cancelled by uid {who} (scancel, or an admin)")
            }
            Some(who) => format!("the job was cancelled by {who} (scancel, or an admin)"),
            None => "the job was cancelled".to_owned(),
        },
        "TIMEOUT" => "the job reached its --time limit and Slurm killed it".to_owned(),
        "OUT_OF_MEMORY" => {
            "the job used more host memory than it asked for (--mem) and was killed".to_owned()
        }
        "NODE_FAIL" => "a node the job ran on failed; not your code".to_owned(),
        "PREEMPTED" => "a higher-priority job preempted this one".to_owned(),
        "BOOT_FAIL" => "a node failed to boot for the job; not your code".to_owned(),
        "DEADLINE" => "the job reached its --deadline".to_owned(),
        "EXPEDITING" => {
            "the job is being requeued at once (--requeue=expedite after a failure): it will run again"
                .to_owned()
        }
        w if is_active_state(w) => format!("the job has not ended: it is {w}"),
        other => format!("the job ended {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasons::REASONS;

    #[test]
    fn every_printed_reason_has_an_explanation() {
        for r in REASONS {
            let e = explain_reason(r.printed);
            assert!(e.is_some(), "{} ({}) has no explanation", r.name, r.printed);
            assert!(!e.as_ref().is_some_and(|e| e.meaning.is_empty() || e.action.is_empty()), "{}", r.name);
        }
        for f in reasons::FREE_TEXTS {
            let (code, e) = read_reason(f.text.replace('*', "maint").as_str(), None);
            assert!(e.is_some_and(|e| !e.meaning.is_empty()) && !code.is_empty(), "{}", f.text);
        }
        assert_eq!(explain_reason("SomethingNewInSlurm25"), None);
        assert_eq!(explain_reason("AssocGrpFooLimit"), None);
    }

    #[test]
    fn reasons_resolve_by_time_user_or_admin() {
        let by = |p: &str| explain_reason(p).map(|e| e.remedy);
        assert_eq!(by("Resources"), Some(Remedy::Time));
        assert_eq!(by("Priority"), Some(Remedy::Time));
        assert_eq!(by("BeginTime"), Some(Remedy::Time));
        assert_eq!(by("JobHeldUser"), Some(Remedy::User));
        assert_eq!(by("DependencyNeverSatisfied"), Some(Remedy::User));
        assert_eq!(by("QOSGrpCPUMinutesLimit"), Some(Remedy::Admin));
        assert_eq!(by("AssocGrpGRESMinutes"), Some(Remedy::Admin));
        assert_eq!(by("JobHeldAdmin"), Some(Remedy::Admin));
        assert_eq!(by("ReqNodeNotAvail"), Some(Remedy::Admin));
        assert_eq!(by("AssocMaxGRESPerJob"), Some(Remedy::User));
        assert_eq!(by("QOSMaxJobsPerUserLimit"), Some(Remedy::Time));
        let e = explain_reason("QOSGrpCPUMinutesLimit").map(|e| e.action).unwrap_or_default();
        assert!(e.contains("does not resolve by waiting"), "{e}");
        let m = explain_reason("QOSMaxWallDurationPerJobLimit").map(|e| e.meaning).unwrap_or_default();
        assert!(m.contains("wall time") && m.contains("per job"), "{m}");
    }

    #[test]
    fn run_minute_limits_resolve_as_running_jobs_progress() {
        // GrpTRESRunMins and the MaxTRESRunMinsPerAccount/PerUser family (24.05 on):
        // TRES-minutes of running jobs, not a count of CPUs.
        for printed in [
            "AssocGrpGRESRunMinutes",
            "QOSGrpCPURunMinutesLimit",
            "MaxCpuRunMinsPerAccount",
            "MaxGRESRunMinsPerUser",
            "MaxBillingRunMinsPerAccount",
            "MaxUnknownRunMinsPerUser",
        ] {
            let e = explain_reason(printed).expect(printed);
            assert_eq!(e.remedy, Remedy::Time, "{printed}");
            assert!(e.meaning.contains("-minutes of running jobs"), "{printed}: {}", e.meaning);
            assert!(e.action.contains("progress"), "{printed}: {}", e.action);
        }
        let cpu = explain_reason("MaxCpuRunMinsPerAccount").expect("words").meaning;
        assert!(
            cpu.contains("CPU-minutes of running jobs per account") && !cpu.contains("maximum of CPUs"),
            "{cpu}"
        );
        let user = explain_reason("MaxNodeRunMinsPerUser").expect("words").meaning;
        assert!(user.contains("per user") && user.contains("each running job of your user"), "{user}");
        // The plain per-account maximum stays a count.
        let plain = explain_reason("MaxCpuPerAccount").expect("words");
        assert!(plain.meaning.contains("maximum of CPUs per account") && plain.remedy == Remedy::Time);
    }

    #[test]
    fn the_new_reasons_have_their_own_words() {
        let e = |p: &str| explain_reason(p).expect(p);
        assert!(e("RaisedSignal").meaning.contains("signal") && e("RaisedSignal").action.contains("autopsy"));
        assert_eq!(e("ReservationInvalid").remedy, Remedy::User);
        assert!(e("Constraints").meaning.contains("--extra"));
        assert!(e("MaxPoweredUpNodes").meaning.contains("MaxPoweredUpNodes"));
        assert!(e("MpiPortsBusy").meaning.contains("MPI ports"));
        assert!(e("NvidiaImexChannels").meaning.contains("IMEX"));
    }

    #[test]
    fn reasons_read_from_what_slurm_shows() {
        assert_eq!(reason_code("ReqNodeNotAvail,_UnavailableNodes:node2"), "ReqNodeNotAvail");
        assert_eq!(reason_code("RaisedSignal:9(Killed)"), "RaisedSignal");
        assert_eq!(reason_code("Resources"), "Resources");
        let (code, e) = read_reason("No suitable topology unit found", None);
        assert_eq!(code, "Resources");
        assert!(e.is_some_and(|e| e.meaning.contains("topology unit")));
        let (code, _) = read_reason("No suitable topology unit found", Some("Resources"));
        assert_eq!(code, "Resources");
        let (code, e) = read_reason("Reservation maint is invalid", None);
        assert_eq!((code.as_str(), e.map(|e| e.remedy)), ("ReservationInvalid", Some(Remedy::User)));
        let (code, e) = read_reason("job requeued in held state", Some("JobHeldUser"));
        assert!(code == "JobHeldUser" && e.is_some_and(|e| e.meaning.contains("expedited requeue")));
        // The JSON's own code wins over a text that starts like another.
        let (code, _) = read_reason("ReqNodeNotAvail, UnavailableNodes:node2", Some("ReqNodeNotAvail"));
        assert_eq!(code, "ReqNodeNotAvail");
        assert_eq!(raised_signal("RaisedSignal:9(Killed)"), Some((9, "Killed".into())));
        assert_eq!(
            raised_signal("RaisedSignal:11(Segmentation_fault)"),
            Some((11, "Segmentation fault".into()))
        );
        assert_eq!(raised_signal("NonZeroExitCode"), None);
    }

    #[test]
    fn exits_and_states_in_words() {
        assert_eq!(exit_in_words("3:0"), "the program exited with status 3 (its own error, not a signal)");
        assert!(exit_in_words("0:9").contains("signal 9 (SIGKILL)"));
        assert!(
            exit_in_words("0:53").contains("ESLURMD_IO_ERROR") && exit_in_words("0:53").contains("never ran")
        );
        assert!(exit_in_words("0:125").contains("more memory than the job's limit"));
        assert!(!exit_in_words("0:125").contains("before or at launch"));
        assert!(exit_in_words("0:100").contains("before or at launch"));
        assert!(state_in_words("CANCELLED by 1000").contains("uid 1000"));
        assert!(state_in_words("CANCELLED by alice").contains("by alice"));
        assert!(state_in_words("EXPEDITING").contains("will run again"));
        assert!(state_in_words("REQUEUE_HOLD").contains("has not ended"));
        assert!(is_active_state("EXPEDITING") && is_active_state("REQUEUED") && !is_active_state("FAILED"));
        assert!(!is_active_state("OUT_OF_MEMORY") && !is_active_state("NODE_FAIL"));
        assert!(is_running_state("COMPLETING") && !is_running_state("PENDING"));
    }
}
