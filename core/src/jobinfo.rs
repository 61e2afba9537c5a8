//! `spank-gpu why` and `spank-gpu autopsy`: why a job is still pending, and
//! why a job died, in words and with the next step.
//!
//! Everything here works on the text that Slurm's read-only commands print
//! (`scontrol show job -o`, `sacct --parsable2`, `sacctmgr -P show event`,
//! `sinfo`, `squeue --start`, `sprio`) and on what the caller found on disk;
//! the command runs those and hands the text in. Nothing here runs a command.
//!
//! The reason table [`REASONS`] lists every `enum job_state_reason` value of
//! Slurm 22.05's `slurm.h` with the string Slurm prints for it (what
//! `job_reason_string()` in `src/common/slurm_protocol_defs.c` returns, read
//! from the installed 22.05.8 `libslurm` through `slurm_job_reason_string`).
//! Two enum values print the same string (`WAIT_PART_DOWN` and
//! `FAIL_DOWN_PARTITION` both print `PartitionDown`) and Slurm 22.05 prints
//! `WAIT_QOS_MAX_BB_MINS_PER_JOB` as `AssocMaxBBMinutesPerJob`: the table
//! keeps Slurm's strings as they are, since those are what users see.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::hostlist;
use crate::reason::Class;
use crate::xid;

/// Every `enum job_state_reason` value of Slurm 22.05, in enum order, with
/// the string Slurm prints for it.
pub const REASONS: &[(&str, &str)] = &[
    ("WAIT_NO_REASON", "None"),
    ("WAIT_PRIORITY", "Priority"),
    ("WAIT_DEPENDENCY", "Dependency"),
    ("WAIT_RESOURCES", "Resources"),
    ("WAIT_PART_NODE_LIMIT", "PartitionNodeLimit"),
    ("WAIT_PART_TIME_LIMIT", "PartitionTimeLimit"),
    ("WAIT_PART_DOWN", "PartitionDown"),
    ("WAIT_PART_INACTIVE", "PartitionInactive"),
    ("WAIT_HELD", "JobHeldAdmin"),
    ("WAIT_TIME", "BeginTime"),
    ("WAIT_LICENSES", "Licenses"),
    ("WAIT_ASSOC_JOB_LIMIT", "AssociationJobLimit"),
    ("WAIT_ASSOC_RESOURCE_LIMIT", "AssociationResourceLimit"),
    ("WAIT_ASSOC_TIME_LIMIT", "AssociationTimeLimit"),
    ("WAIT_RESERVATION", "Reservation"),
    ("WAIT_NODE_NOT_AVAIL", "ReqNodeNotAvail"),
    ("WAIT_HELD_USER", "JobHeldUser"),
    ("WAIT_FRONT_END", "FrontEndDown"),
    ("FAIL_DEFER", "SchedDefer"),
    ("FAIL_DOWN_PARTITION", "PartitionDown"),
    ("FAIL_DOWN_NODE", "NodeDown"),
    ("FAIL_BAD_CONSTRAINTS", "BadConstraints"),
    ("FAIL_SYSTEM", "SystemFailure"),
    ("FAIL_LAUNCH", "JobLaunchFailure"),
    ("FAIL_EXIT_CODE", "NonZeroExitCode"),
    ("FAIL_TIMEOUT", "TimeLimit"),
    ("FAIL_INACTIVE_LIMIT", "InactiveLimit"),
    ("FAIL_ACCOUNT", "InvalidAccount"),
    ("FAIL_QOS", "InvalidQOS"),
    ("WAIT_QOS_THRES", "QOSUsageThreshold"),
    ("WAIT_QOS_JOB_LIMIT", "QOSJobLimit"),
    ("WAIT_QOS_RESOURCE_LIMIT", "QOSResourceLimit"),
    ("WAIT_QOS_TIME_LIMIT", "QOSTimeLimit"),
    ("WAIT_BLOCK_MAX_ERR", "BlockMaxError"),
    ("WAIT_BLOCK_D_ACTION", "BlockFreeAction"),
    ("WAIT_CLEANING", "Cleaning"),
    ("WAIT_PROLOG", "Prolog"),
    ("WAIT_QOS", "QOSNotAllowed"),
    ("WAIT_ACCOUNT", "AccountNotAllowed"),
    ("WAIT_DEP_INVALID", "DependencyNeverSatisfied"),
    ("WAIT_QOS_GRP_CPU", "QOSGrpCpuLimit"),
    ("WAIT_QOS_GRP_CPU_MIN", "QOSGrpCPUMinutesLimit"),
    ("WAIT_QOS_GRP_CPU_RUN_MIN", "QOSGrpCPURunMinutesLimit"),
    ("WAIT_QOS_GRP_JOB", "QOSGrpJobsLimit"),
    ("WAIT_QOS_GRP_MEM", "QOSGrpMemLimit"),
    ("WAIT_QOS_GRP_NODE", "QOSGrpNodeLimit"),
    ("WAIT_QOS_GRP_SUB_JOB", "QOSGrpSubmitJobsLimit"),
    ("WAIT_QOS_GRP_WALL", "QOSGrpWallLimit"),
    ("WAIT_QOS_MAX_CPU_PER_JOB", "QOSMaxCpuPerJobLimit"),
    ("WAIT_QOS_MAX_CPU_MINS_PER_JOB", "QOSMaxCpuMinutesPerJobLimit"),
    ("WAIT_QOS_MAX_NODE_PER_JOB", "QOSMaxNodePerJobLimit"),
    ("WAIT_QOS_MAX_WALL_PER_JOB", "QOSMaxWallDurationPerJobLimit"),
    ("WAIT_QOS_MAX_CPU_PER_USER", "QOSMaxCpuPerUserLimit"),
    ("WAIT_QOS_MAX_JOB_PER_USER", "QOSMaxJobsPerUserLimit"),
    ("WAIT_QOS_MAX_NODE_PER_USER", "QOSMaxNodePerUserLimit"),
    ("WAIT_QOS_MAX_SUB_JOB", "QOSMaxSubmitJobPerUserLimit"),
    ("WAIT_QOS_MIN_CPU", "QOSMinCpuNotSatisfied"),
    ("WAIT_ASSOC_GRP_CPU", "AssocGrpCpuLimit"),
    ("WAIT_ASSOC_GRP_CPU_MIN", "AssocGrpCPUMinutesLimit"),
    ("WAIT_ASSOC_GRP_CPU_RUN_MIN", "AssocGrpCPURunMinutesLimit"),
    ("WAIT_ASSOC_GRP_JOB", "AssocGrpJobsLimit"),
    ("WAIT_ASSOC_GRP_MEM", "AssocGrpMemLimit"),
    ("WAIT_ASSOC_GRP_NODE", "AssocGrpNodeLimit"),
    ("WAIT_ASSOC_GRP_SUB_JOB", "AssocGrpSubmitJobsLimit"),
    ("WAIT_ASSOC_GRP_WALL", "AssocGrpWallLimit"),
    ("WAIT_ASSOC_MAX_JOBS", "AssocMaxJobsLimit"),
    ("WAIT_ASSOC_MAX_CPU_PER_JOB", "AssocMaxCpuPerJobLimit"),
    ("WAIT_ASSOC_MAX_CPU_MINS_PER_JOB", "AssocMaxCpuMinutesPerJobLimit"),
    ("WAIT_ASSOC_MAX_NODE_PER_JOB", "AssocMaxNodePerJobLimit"),
    ("WAIT_ASSOC_MAX_WALL_PER_JOB", "AssocMaxWallDurationPerJobLimit"),
    ("WAIT_ASSOC_MAX_SUB_JOB", "AssocMaxSubmitJobLimit"),
    ("WAIT_MAX_REQUEUE", "JobHoldMaxRequeue"),
    ("WAIT_ARRAY_TASK_LIMIT", "JobArrayTaskLimit"),
    ("WAIT_BURST_BUFFER_RESOURCE", "BurstBufferResources"),
    ("WAIT_BURST_BUFFER_STAGING", "BurstBufferStageIn"),
    ("FAIL_BURST_BUFFER_OP", "BurstBufferOperation"),
    ("WAIT_POWER_NOT_AVAIL", "PowerNotAvail"),
    ("WAIT_POWER_RESERVED", "PowerReserved"),
    ("WAIT_ASSOC_GRP_UNK", "AssocGrpUnknown"),
    ("WAIT_ASSOC_GRP_UNK_MIN", "AssocGrpUnknownMinutes"),
    ("WAIT_ASSOC_GRP_UNK_RUN_MIN", "AssocGrpUnknownRunMinutes"),
    ("WAIT_ASSOC_MAX_UNK_PER_JOB", "AssocMaxUnknownPerJob"),
    ("WAIT_ASSOC_MAX_UNK_PER_NODE", "AssocMaxUnknownPerNode"),
    ("WAIT_ASSOC_MAX_UNK_MINS_PER_JOB", "AssocMaxUnknownMinutesPerJob"),
    ("WAIT_ASSOC_MAX_CPU_PER_NODE", "AssocMaxCpuPerNode"),
    ("WAIT_ASSOC_GRP_MEM_MIN", "AssocGrpMemMinutes"),
    ("WAIT_ASSOC_GRP_MEM_RUN_MIN", "AssocGrpMemRunMinutes"),
    ("WAIT_ASSOC_MAX_MEM_PER_JOB", "AssocMaxMemPerJob"),
    ("WAIT_ASSOC_MAX_MEM_PER_NODE", "AssocMaxMemPerNode"),
    ("WAIT_ASSOC_MAX_MEM_MINS_PER_JOB", "AssocMaxMemMinutesPerJob"),
    ("WAIT_ASSOC_GRP_NODE_MIN", "AssocGrpNodeMinutes"),
    ("WAIT_ASSOC_GRP_NODE_RUN_MIN", "AssocGrpNodeRunMinutes"),
    ("WAIT_ASSOC_MAX_NODE_MINS_PER_JOB", "AssocMaxNodeMinutesPerJob"),
    ("WAIT_ASSOC_GRP_ENERGY", "AssocGrpEnergy"),
    ("WAIT_ASSOC_GRP_ENERGY_MIN", "AssocGrpEnergyMinutes"),
    ("WAIT_ASSOC_GRP_ENERGY_RUN_MIN", "AssocGrpEnergyRunMinutes"),
    ("WAIT_ASSOC_MAX_ENERGY_PER_JOB", "AssocMaxEnergyPerJob"),
    ("WAIT_ASSOC_MAX_ENERGY_PER_NODE", "AssocMaxEnergyPerNode"),
    ("WAIT_ASSOC_MAX_ENERGY_MINS_PER_JOB", "AssocMaxEnergyMinutesPerJob"),
    ("WAIT_ASSOC_GRP_GRES", "AssocGrpGRES"),
    ("WAIT_ASSOC_GRP_GRES_MIN", "AssocGrpGRESMinutes"),
    ("WAIT_ASSOC_GRP_GRES_RUN_MIN", "AssocGrpGRESRunMinutes"),
    ("WAIT_ASSOC_MAX_GRES_PER_JOB", "AssocMaxGRESPerJob"),
    ("WAIT_ASSOC_MAX_GRES_PER_NODE", "AssocMaxGRESPerNode"),
    ("WAIT_ASSOC_MAX_GRES_MINS_PER_JOB", "AssocMaxGRESMinutesPerJob"),
    ("WAIT_ASSOC_GRP_LIC", "AssocGrpLicense"),
    ("WAIT_ASSOC_GRP_LIC_MIN", "AssocGrpLicenseMinutes"),
    ("WAIT_ASSOC_GRP_LIC_RUN_MIN", "AssocGrpLicenseRunMinutes"),
    ("WAIT_ASSOC_MAX_LIC_PER_JOB", "AssocMaxLicensePerJob"),
    ("WAIT_ASSOC_MAX_LIC_MINS_PER_JOB", "AssocMaxLicenseMinutesPerJob"),
    ("WAIT_ASSOC_GRP_BB", "AssocGrpBB"),
    ("WAIT_ASSOC_GRP_BB_MIN", "AssocGrpBBMinutes"),
    ("WAIT_ASSOC_GRP_BB_RUN_MIN", "AssocGrpBBRunMinutes"),
    ("WAIT_ASSOC_MAX_BB_PER_JOB", "AssocMaxBBPerJob"),
    ("WAIT_ASSOC_MAX_BB_PER_NODE", "AssocMaxBBPerNode"),
    ("WAIT_ASSOC_MAX_BB_MINS_PER_JOB", "AssocMaxBBMinutesPerJob"),
    ("WAIT_QOS_GRP_UNK", "QOSGrpUnknown"),
    ("WAIT_QOS_GRP_UNK_MIN", "QOSGrpUnknownMinutes"),
    ("WAIT_QOS_GRP_UNK_RUN_MIN", "QOSGrpUnknownRunMinutes"),
    ("WAIT_QOS_MAX_UNK_PER_JOB", "QOSMaxUnknownPerJob"),
    ("WAIT_QOS_MAX_UNK_PER_NODE", "QOSMaxUnknownPerNode"),
    ("WAIT_QOS_MAX_UNK_PER_USER", "QOSMaxUnknownPerUser"),
    ("WAIT_QOS_MAX_UNK_MINS_PER_JOB", "QOSMaxUnknownMinutesPerJob"),
    ("WAIT_QOS_MIN_UNK", "QOSMinUnknown"),
    ("WAIT_QOS_MAX_CPU_PER_NODE", "QOSMaxCpuPerNode"),
    ("WAIT_QOS_GRP_MEM_MIN", "QOSGrpMemoryMinutes"),
    ("WAIT_QOS_GRP_MEM_RUN_MIN", "QOSGrpMemoryRunMinutes"),
    ("WAIT_QOS_MAX_MEM_MINS_PER_JOB", "QOSMaxMemoryMinutesPerJob"),
    ("WAIT_QOS_MAX_MEM_PER_JOB", "QOSMaxMemoryPerJob"),
    ("WAIT_QOS_MAX_MEM_PER_NODE", "QOSMaxMemoryPerNode"),
    ("WAIT_QOS_MAX_MEM_PER_USER", "QOSMaxMemoryPerUser"),
    ("WAIT_QOS_MIN_MEM", "QOSMinMemory"),
    ("WAIT_QOS_GRP_ENERGY", "QOSGrpEnergy"),
    ("WAIT_QOS_GRP_ENERGY_MIN", "QOSGrpEnergyMinutes"),
    ("WAIT_QOS_GRP_ENERGY_RUN_MIN", "QOSGrpEnergyRunMinutes"),
    ("WAIT_QOS_MAX_ENERGY_PER_JOB", "QOSMaxEnergyPerJob"),
    ("WAIT_QOS_MAX_ENERGY_PER_NODE", "QOSMaxEnergyPerNode"),
    ("WAIT_QOS_MAX_ENERGY_PER_USER", "QOSMaxEnergyPerUser"),
    ("WAIT_QOS_MAX_ENERGY_MINS_PER_JOB", "QOSMaxEnergyMinutesPerJob"),
    ("WAIT_QOS_MIN_ENERGY", "QOSMinEnergy"),
    ("WAIT_QOS_GRP_NODE_MIN", "QOSGrpNodeMinutes"),
    ("WAIT_QOS_GRP_NODE_RUN_MIN", "QOSGrpNodeRunMinutes"),
    ("WAIT_QOS_MAX_NODE_MINS_PER_JOB", "QOSMaxNodeMinutesPerJob"),
    ("WAIT_QOS_MIN_NODE", "QOSMinNode"),
    ("WAIT_QOS_GRP_GRES", "QOSGrpGRES"),
    ("WAIT_QOS_GRP_GRES_MIN", "QOSGrpGRESMinutes"),
    ("WAIT_QOS_GRP_GRES_RUN_MIN", "QOSGrpGRESRunMinutes"),
    ("WAIT_QOS_MAX_GRES_PER_JOB", "QOSMaxGRESPerJob"),
    ("WAIT_QOS_MAX_GRES_PER_NODE", "QOSMaxGRESPerNode"),
    ("WAIT_QOS_MAX_GRES_PER_USER", "QOSMaxGRESPerUser"),
    ("WAIT_QOS_MAX_GRES_MINS_PER_JOB", "QOSMaxGRESMinutesPerJob"),
    ("WAIT_QOS_MIN_GRES", "QOSMinGRES"),
    ("WAIT_QOS_GRP_LIC", "QOSGrpLicense"),
    ("WAIT_QOS_GRP_LIC_MIN", "QOSGrpLicenseMinutes"),
    ("WAIT_QOS_GRP_LIC_RUN_MIN", "QOSGrpLicenseRunMinutes"),
    ("WAIT_QOS_MAX_LIC_PER_JOB", "QOSMaxLicensePerJob"),
    ("WAIT_QOS_MAX_LIC_PER_USER", "QOSMaxLicensePerUser"),
    ("WAIT_QOS_MAX_LIC_MINS_PER_JOB", "QOSMaxLicenseMinutesPerJob"),
    ("WAIT_QOS_MIN_LIC", "QOSMinLicense"),
    ("WAIT_QOS_GRP_BB", "QOSGrpBB"),
    ("WAIT_QOS_GRP_BB_MIN", "QOSGrpBBMinutes"),
    ("WAIT_QOS_GRP_BB_RUN_MIN", "QOSGrpBBRunMinutes"),
    ("WAIT_QOS_MAX_BB_PER_JOB", "QOSMaxBBPerJob"),
    ("WAIT_QOS_MAX_BB_PER_NODE", "QOSMaxBBPerNode"),
    ("WAIT_QOS_MAX_BB_PER_USER", "QOSMaxBBPerUser"),
    ("WAIT_QOS_MAX_BB_MINS_PER_JOB", "AssocMaxBBMinutesPerJob"),
    ("WAIT_QOS_MIN_BB", "QOSMinBB"),
    ("FAIL_DEADLINE", "DeadLine"),
    ("WAIT_QOS_MAX_BB_PER_ACCT", "MaxBBPerAccount"),
    ("WAIT_QOS_MAX_CPU_PER_ACCT", "MaxCpuPerAccount"),
    ("WAIT_QOS_MAX_ENERGY_PER_ACCT", "MaxEnergyPerAccount"),
    ("WAIT_QOS_MAX_GRES_PER_ACCT", "MaxGRESPerAccount"),
    ("WAIT_QOS_MAX_NODE_PER_ACCT", "MaxNodePerAccount"),
    ("WAIT_QOS_MAX_LIC_PER_ACCT", "MaxLicensePerAccount"),
    ("WAIT_QOS_MAX_MEM_PER_ACCT", "MaxMemoryPerAccount"),
    ("WAIT_QOS_MAX_UNK_PER_ACCT", "MaxUnknownPerAccount"),
    ("WAIT_QOS_MAX_JOB_PER_ACCT", "MaxJobsPerAccount"),
    ("WAIT_QOS_MAX_SUB_JOB_PER_ACCT", "MaxSubmitJobsPerAccount"),
    ("WAIT_PART_CONFIG", "PartitionConfig"),
    ("WAIT_ACCOUNT_POLICY", "AccountingPolicy"),
    ("WAIT_FED_JOB_LOCK", "FedJobLock"),
    ("FAIL_OOM", "OutOfMemory"),
    ("WAIT_PN_MEM_LIMIT", "MaxMemPerLimit"),
    ("WAIT_ASSOC_GRP_BILLING", "AssocGrpBilling"),
    ("WAIT_ASSOC_GRP_BILLING_MIN", "AssocGrpBillingMinutes"),
    ("WAIT_ASSOC_GRP_BILLING_RUN_MIN", "AssocGrpBillingRunMinutes"),
    ("WAIT_ASSOC_MAX_BILLING_PER_JOB", "AssocMaxBillingPerJob"),
    ("WAIT_ASSOC_MAX_BILLING_PER_NODE", "AssocMaxBillingPerNode"),
    ("WAIT_ASSOC_MAX_BILLING_MINS_PER_JOB", "AssocMaxBillingMinutesPerJob"),
    ("WAIT_QOS_GRP_BILLING", "QOSGrpBilling"),
    ("WAIT_QOS_GRP_BILLING_MIN", "QOSGrpBillingMinutes"),
    ("WAIT_QOS_GRP_BILLING_RUN_MIN", "QOSGrpBillingRunMinutes"),
    ("WAIT_QOS_MAX_BILLING_PER_JOB", "QOSMaxBillingPerJob"),
    ("WAIT_QOS_MAX_BILLING_PER_NODE", "QOSMaxBillingPerNode"),
    ("WAIT_QOS_MAX_BILLING_PER_USER", "QOSMaxBillingPerUser"),
    ("WAIT_QOS_MAX_BILLING_MINS_PER_JOB", "QOSMaxBillingMinutesPerJob"),
    ("WAIT_QOS_MAX_BILLING_PER_ACCT", "MaxBillingPerAccount"),
    ("WAIT_QOS_MIN_BILLING", "QOSMinBilling"),
    ("WAIT_RESV_DELETED", "ReservationDeleted"),
];

// ----- reasons ------------------------------------------------------------------------

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

/// The reason code at the start of a reason as Slurm shows it:
/// `ReqNodeNotAvail,_UnavailableNodes:node2` → `ReqNodeNotAvail`.
pub fn reason_code(reason: &str) -> &str {
    let end = reason.find([',', ' ', '(']).unwrap_or(reason.len());
    reason[..end].trim()
}

/// The enum names (`WAIT_HELD_USER`) that print as `printed` (`JobHeldUser`).
pub fn enum_names(printed: &str) -> Vec<&'static str> {
    REASONS.iter().filter(|(_, p)| *p == printed).map(|(n, _)| *n).collect()
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
            "Slurm could not launch the job (often: the --output/--error directory does not exist)",
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
        other => return limit_explanation(other),
    };
    Some(e)
}

/// The `Assoc*`, `QOS*` and `Max*PerAccount` limit family in words.
fn limit_explanation(printed: &str) -> Option<Explanation> {
    let (scope, rest) = if let Some(r) = printed.strip_prefix("Assoc") {
        ("your association's (user/account)", r)
    } else if let Some(r) = printed.strip_prefix("QOS") {
        ("the QOS's", r)
    } else if printed.starts_with("Max") && printed.ends_with("PerAccount") {
        ("the QOS's per-account", printed)
    } else {
        return None;
    };
    let (kind, rest) = ["Grp", "Max", "Min"].iter().find_map(|k| rest.strip_prefix(k).map(|r| (*k, r)))?;
    const RESOURCES: &[(&str, &str)] = &[
        ("SubmitJobs", "submitted jobs"),
        ("Submit", "submitted jobs"),
        ("Jobs", "running jobs"),
        ("Cpu", "CPUs"),
        ("CPU", "CPUs"),
        ("Memory", "memory"),
        ("Mem", "memory"),
        ("Node", "nodes"),
        ("GRES", "GPUs/generic resources"),
        ("License", "licenses"),
        ("BB", "burst buffer"),
        ("Energy", "energy"),
        ("Unknown", "a trackable resource"),
        ("Billing", "billing units"),
        ("Wall", "wall time"),
    ];
    let (what, tail) = RESOURCES.iter().find_map(|(k, w)| rest.strip_prefix(k).map(|t| (*w, t)))?;
    let per = ["PerJob", "PerNode", "PerUser", "PerAccount"].iter().find(|p| tail.contains(**p)).copied();
    let minutes = tail.contains("Minutes");
    let run = tail.contains("RunMinutes");
    let known_tail = tail.is_empty()
        || tail.contains("Limit")
        || minutes
        || per.is_some()
        || tail == "NotSatisfied"
        || tail.starts_with("Duration");
    if !known_tail {
        return None;
    }
    let amount = if run {
        format!("{what} x remaining run time of running jobs")
    } else if minutes {
        format!("{what} x minutes")
    } else {
        what.to_owned()
    };
    let per_words = match per {
        Some("PerJob") => " per job",
        Some("PerNode") => " per node",
        Some("PerUser") => " per user",
        Some("PerAccount") => " per account",
        _ => "",
    };
    Some(match kind {
        "Grp" if minutes => Explanation {
            meaning: format!("{scope} group limit on {amount} is reached ({printed})"),
            remedy: Remedy::Admin,
            action: "this does not resolve by waiting: ask an admin to raise the limit, or run under another account/QOS"
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

// ----- parsing Slurm's output -----------------------------------------------------------

/// One `scontrol show job -o` (or `show node -o`) record: `Key=Value` words.
/// A word without `=` belongs to the value before it (values such as
/// `Reason=gpu: xid79 ...` hold spaces).
pub fn parse_record(line: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut last: Option<String> = None;
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b':') =>
            {
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

/// The rows of `--parsable2` output with its header line (`sacct -P`,
/// `sacctmgr -P`), each as header name → value.
pub fn parse_parsable(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else { return Vec::new() };
    let names: Vec<&str> = header.split('|').collect();
    lines
        .map(|l| names.iter().zip(l.split('|')).map(|(k, v)| ((*k).to_owned(), v.to_owned())).collect())
        .collect()
}

/// Seconds in a Slurm duration: `[D-]HH:MM:SS`, `MM:SS`, `MM`, `HH:MM:SS.mmm`;
/// `None` for `UNLIMITED`, `INVALID`, `Partition_Limit` and anything else.
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, s),
    };
    let rest = rest.split('.').next()?;
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    // Saturating: a field of 20 digits must not overflow.
    let hms = |h: u64, m: u64, s: u64| {
        h.saturating_mul(3600).saturating_add(m.saturating_mul(60)).saturating_add(s)
    };
    let secs = match (parts.as_slice(), days > 0) {
        ([m], false) => hms(0, *m, 0),
        ([h], true) => hms(*h, 0, 0),
        ([m, s], false) => hms(0, *m, *s),
        ([h, m], true) => hms(*h, *m, 0),
        ([h, m, s], _) => hms(*h, *m, *s),
        _ => return None,
    };
    Some(days.saturating_mul(86400).saturating_add(secs))
}

/// A duration as Slurm writes it: `[D-]HH:MM:SS`.
pub fn format_duration(secs: u64) -> String {
    let (d, r) = (secs / 86400, secs % 86400);
    let hms = format!("{:02}:{:02}:{:02}", r / 3600, r % 3600 / 60, r % 60);
    if d > 0 { format!("{d}-{hms}") } else { hms }
}

/// Bytes in a Slurm memory size (`100M`, `1.5G`, `2048K`, `4000` = MiB,
/// `100Mn`/`100Mc` of older sacct); `None` when empty or unreadable.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().trim_end_matches(['n', 'c']);
    if s.is_empty() {
        return None;
    }
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, "M"),
    };
    let mult: f64 = match unit {
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v: f64 = num.parse().ok()?;
    if !(v >= 0.0 && v.is_finite()) {
        return None;
    }
    // A non-negative, finite value: the cast saturates at u64::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some((v * mult) as u64)
}

/// A size in words: `300 MiB`.
pub fn format_size(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes >= 10 * 1024 * MIB {
        format!("{} GiB", bytes / (1024 * MIB))
    } else {
        format!("{} MiB", bytes.div_ceil(MIB))
    }
}

/// Seconds since 1970 of a Slurm time `YYYY-MM-DDTHH:MM:SS` taken as UTC
/// (Slurm prints local time; only differences are used).
pub fn parse_time(s: &str) -> Option<i64> {
    let (date, time) = s.trim().split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i64> = time.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else { return None };
    let in_range = (0..=9999).contains(y)
        && (1..=12).contains(m)
        && (1..=31).contains(day)
        && (0..=23).contains(hh)
        && (0..=59).contains(mm)
        && (0..=60).contains(ss);
    if !in_range {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
}

// ----- the agent's drain reasons ---------------------------------------------------------

/// A drain reason written by gpu-node-agent, decoded: `gpu: CLASS [gpuN] DETAIL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentDrain {
    /// The class word: `xid79`, `ecc-dbe`, `remap-pend`, `lost`, ...
    pub class: String,
    /// The GPU's index on the node, when the reason names one.
    pub gpu: Option<u32>,
    /// The Xid, for an `xidNN` class.
    pub xid: Option<u32>,
    /// The rest of the reason.
    pub detail: String,
    /// One sentence for the user.
    pub meaning: String,
}

/// Decodes a drain reason written by the GPU agent on `node` (its grammar is
/// [`crate::reason`]); `None` for any other reason (an admin's own
/// `gpu: RMA ticket 42` included). A trailing `[user@time]` that `scontrol`
/// adds is ignored.
pub fn decode_agent_reason(node: &str, reason: &str) -> Option<AgentDrain> {
    let reason = reason.trim();
    let reason = match reason.rfind(" [") {
        Some(i) if reason.ends_with(']') && reason[i..].contains('@') => &reason[..i],
        _ => reason,
    };
    let parsed = crate::reason::parse(reason)?;
    let which = parsed.gpu.map_or_else(|| "a GPU".to_owned(), |g| format!("GPU {g}"));
    let what = match &parsed.class {
        Class::Xid(x) => format!("{which} on {node} failed with Xid {x} ({})", xid::describe(*x)),
        Class::EccUncorrectable => format!("{which} on {node} has uncorrectable memory (ECC) errors"),
        Class::RemapPending => format!("{which} on {node} needs a reset to remap a bad memory row"),
        Class::RemapFailure => {
            format!("{which} on {node} could not remap a bad memory row and must be replaced")
        }
        Class::Lost => format!("{which} on {node} fell off the bus"),
        Class::Missing => format!("{node} shows fewer GPUs than Slurm expects"),
        Class::ResetRequired => format!("{which} on {node} needs a reset"),
        Class::Unusable => format!("{which} on {node} cannot be used"),
        Class::DriverMismatch => {
            format!("the GPU driver on {node} was upgraded without a reboot; every GPU job there fails")
        }
        Class::RecoveryAction(a) => format!(
            "the driver on {node} asks for recovery ({}) of {which}",
            xid::recovery_action_name(*a).unwrap_or("unknown action")
        ),
        Class::Pcie => format!("the PCIe link of {which} on {node} runs below its speed"),
        Class::NvLinkDown => format!("an NVLink of {which} on {node} is down"),
        Class::NvLinkErrors => format!("an NVLink of {which} on {node} keeps failing"),
        Class::Fabric => format!("{which} on {node} is not in the NVSwitch fabric"),
        Class::Slowdown => format!("{which} on {node} is held back by a hardware slowdown"),
        Class::EccOff => format!("{which} on {node} runs with ECC off"),
        Class::PersistenceOff => format!("{which} on {node} runs without persistence mode"),
        Class::NvmlHang => format!("{which} on {node} stopped answering the driver"),
    };
    Some(AgentDrain {
        class: parsed.class.name(),
        gpu: parsed.gpu,
        xid: match parsed.class {
            Class::Xid(x) => Some(x),
            _ => None,
        },
        detail: parsed.detail.trim().to_owned(),
        meaning: format!("{what}; the GPU agent drained the node, an admin must repair it. Not your code"),
    })
}

// ----- why ------------------------------------------------------------------------------

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

/// What `why` concludes from a job's `scontrol show job -o` record.
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
    /// Its code: `ReqNodeNotAvail`.
    pub code: String,
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
}

/// `why` for the job in `record` (`scontrol show job -o`); `fallback_id` is
/// the id asked for, used when the record has none.
pub fn why(record: &Row, fallback_id: &str) -> Why {
    let get = |k: &str| record.get(k).map_or("", String::as_str);
    let job_id = if get("JobId").is_empty() { fallback_id } else { get("JobId") }.to_owned();
    let state = get("JobState").to_owned();
    let reason = get("Reason").replace('_', " ");
    let code = reason_code(&reason).to_owned();
    let pending = state == "PENDING";
    let (meaning, remedy, action) = match (explain_reason(&code), pending) {
        (Some(e), true) => (e.meaning, e.remedy, e.action.replace("JOBID", &job_id)),
        (None, true) => (
            format!("Slurm's reason '{code}' is not in spank-gpu's table (a newer Slurm?)"),
            Remedy::None,
            format!("see scontrol show job {job_id} and the Slurm documentation for this reason"),
        ),
        (_, false) => (
            format!("the job is not pending: it is {state}"),
            Remedy::None,
            if matches!(state.as_str(), "RUNNING" | "COMPLETING" | "CONFIGURING") {
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
        dependencies: parse_dependencies(get("Dependency")),
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

/// The advice for a job waiting for resources: its `--time` against
/// `past_elapsed` (its user's completed jobs of the same name), and its size.
pub fn why_advice(record: &Row, past_elapsed: &[u64]) -> Vec<String> {
    let get = |k: &str| record.get(k).map_or("", String::as_str);
    let limit = parse_duration(get("TimeLimit"));
    let nodes: u32 = get("NumNodes").split('-').next().unwrap_or("").parse().unwrap_or(0);
    time_advice(limit, past_elapsed).into_iter().chain(split_advice(nodes, limit)).collect()
}

// ----- autopsy -------------------------------------------------------------------------

/// The program's exit status or the signal that ended it: Slurm's `ExitCode=C:S`.
pub fn exit_in_words(exit_code: &str) -> String {
    let (code, sig) = exit_code.split_once(':').unwrap_or((exit_code, "0"));
    let code: u32 = code.trim().parse().unwrap_or(0);
    let sig: u32 = sig.trim().parse().unwrap_or(0);
    match (code, sig) {
        (0, 0) => "the program exited with status 0 (success)".to_owned(),
        (0, s) if s > 64 || s == 53 => {
            format!("Slurm ended it before or at launch (code {s}; no program exit status)")
        }
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
            Some(uid) => format!("the job was cancelled by uid {uid} (scancel, or an admin)"),
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
        "REQUEUED" => "the job was requeued".to_owned(),
        "RUNNING" | "PENDING" | "COMPLETING" | "CONFIGURING" | "SUSPENDED" | "REQUEUE_HOLD" | "RESIZING" => {
            format!("the job has not ended: it is {word}")
        }
        other => format!("the job ended {other}"),
    }
}

/// What a job's log says about memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomKind {
    /// GPU memory: `CUDA out of memory`, `torch.OutOfMemoryError`.
    Gpu,
    /// Host memory: the kernel OOM killer or Slurm's memory limit.
    Host,
}

impl OomKind {
    /// `gpu` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            OomKind::Gpu => "gpu",
            OomKind::Host => "host",
        }
    }
}

/// The kind of out-of-memory a job's log shows, GPU first (a GPU OOM is
/// often followed by a host-side crash message).
pub fn classify_oom(log: &str) -> Option<OomKind> {
    const GPU: &[&str] = &[
        "CUDA out of memory",
        "OutOfMemoryError",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "cudaErrorMemoryAllocation",
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
    ];
    const HOST: &[&str] = &[
        "oom-kill",
        "oom_kill",
        "Out of memory: Killed process",
        "Exceeded job memory limit",
        "exceeded memory limit",
        "MemoryError",
        "std::bad_alloc",
        "Cannot allocate memory",
    ];
    if GPU.iter().any(|p| log.contains(p)) {
        Some(OomKind::Gpu)
    } else if HOST.iter().any(|p| log.contains(p)) {
        Some(OomKind::Host)
    } else {
        None
    }
}

/// A drain, down or fail event of a node, from `sacctmgr show event`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// The node.
    pub node: String,
    /// When it started (`YYYY-MM-DDTHH:MM:SS`).
    pub start: String,
    /// When it ended; empty or `Unknown` while it lasts.
    pub end: String,
    /// The node state (`DRAIN`, `DOWN`, ...).
    pub state: String,
    /// The reason.
    pub reason: String,
    /// The reason decoded, when the GPU agent wrote it.
    pub agent: Option<AgentDrain>,
}

/// The node events of `sacctmgr -P show event format=NodeName,TimeStart,TimeEnd,State,Reason`
/// that overlap `[from, to]` (times as [`parse_time`] reads them).
pub fn parse_events(text: &str, from: i64, to: i64) -> Vec<NodeEvent> {
    parse_parsable(text)
        .into_iter()
        .filter_map(|row| {
            let node = row.get("NodeName").cloned().unwrap_or_default();
            if node.is_empty() {
                return None; // cluster-wide events
            }
            let start = row.get("TimeStart").cloned().unwrap_or_default();
            let end = row.get("TimeEnd").cloned().unwrap_or_default();
            let s = parse_time(&start)?;
            let e = parse_time(&end).unwrap_or(i64::MAX);
            if s > to || e < from {
                return None;
            }
            let reason = row.get("Reason").cloned().unwrap_or_default();
            let agent = decode_agent_reason(&node, &reason);
            Some(NodeEvent {
                state: row.get("State").cloned().unwrap_or_default(),
                node,
                start,
                end,
                reason,
                agent,
            })
        })
        .collect()
}

/// The guide's checkpoint-and-requeue recipe, filled in for a job: the lead
/// time is a tenth of its time limit, between 2 and 10 minutes, and at most half the limit
/// (3 minutes, as the guide has it, when the limit is unknown).
pub fn requeue_recipe(job_name: &str, limit_secs: Option<u64>, srun_line: &str) -> String {
    let lead = limit_secs.map_or(180, |l| (l / 10).clamp(120, 600).min(l / 2).max(1));
    let name = if job_name.is_empty() { "myjob" } else { job_name };
    let mut r = String::new();
    let _ = writeln!(r, "#SBATCH --signal=B:USR1@{lead}   # USR1 to the batch shell {lead} s before the end");
    let _ = writeln!(r, "#SBATCH --requeue                # let Slurm run it again");
    let _ = writeln!(r, "CKPT_DIR=${{SCRATCH:-$HOME}}/ckpt/{name}");
    let _ = writeln!(r, "mkdir -p \"$CKPT_DIR\"");
    let _ = writeln!(r, "on_usr1() {{");
    let _ =
        writeln!(r, "  touch \"$CKPT_DIR/SAVE_AND_EXIT\"   # your training loop checks this file every step");
    let _ = writeln!(r, "  wait \"$SRUN_PID\"                  # let the checkpoint finish");
    let _ = writeln!(r, "  scontrol requeue \"$SLURM_JOB_ID\"");
    let _ = writeln!(r, "  exit 0");
    let _ = writeln!(r, "}}");
    let _ = writeln!(r, "trap on_usr1 USR1");
    let _ = writeln!(r, "{srun_line} --ckpt-dir \"$CKPT_DIR\" &");
    let _ = writeln!(r, "SRUN_PID=$!");
    let _ = writeln!(r, "wait \"$SRUN_PID\"");
    let _ = writeln!(
        r,
        "Why B: the signal goes to the batch shell, whose trap saves and requeues; without B: it goes to the \
         tasks and the trap never runs. Why srun in the background with wait: bash runs a trap only between \
         commands, so with srun in the foreground the trap waits until srun has ended (too late); `wait` \
         returns as soon as the signal arrives. Measure how long a checkpoint takes and set the lead time to \
         twice that."
    );
    r
}

// ----- autopsy: the whole answer ------------------------------------------------------------

/// A row of `sacct -P` or a `scontrol show job -o` record: field → value.
pub type Row = BTreeMap<String, String>;

/// The `sacct` fields `spank-gpu autopsy` asks for, in this order.
pub const SACCT_FIELDS: &str = "JobID,JobName,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,WorkDir";

/// Why [`ended_job`] has no ended job to look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Neither accounting nor Slurm's memory has it (or the site hides it).
    NotFound,
    /// Slurm has it in memory, accounting not yet.
    NotYetAccounted,
    /// It has not ended: its state word (`RUNNING`, `PENDING`, ...).
    NotEnded(String),
}

/// An ended job as accounting (and `scontrol`, while Slurm still has the job)
/// tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedJob {
    /// The job's own `sacct` row, with what slurmdbd did not have yet filled in from `scontrol`.
    pub row: Row,
    /// Its `STATUS:SIGNAL`: the job's own, or for a job that did not complete
    /// with `0:0` on its own row, the first step's that is not `0:0`.
    pub exit_code: String,
    /// Its nodes.
    pub nodes: Vec<String>,
    /// Memory it asked for (bytes).
    pub req_mem: Option<u64>,
    /// The largest `MaxRSS` of its steps (bytes).
    pub max_rss: Option<u64>,
    /// Its `--output` and `--error` paths, while Slurm has the job in memory.
    pub output_paths: Vec<String>,
    /// `scontrol`'s reason, while Slurm has the job in memory.
    pub reason: String,
}

/// The job in `rows` (`sacct -P -o` [`SACCT_FIELDS`]) and `record` (`scontrol show job -o`).
pub fn ended_job(rows: &[Row], record: Option<&Row>) -> Result<EndedJob, Lookup> {
    let rget = |k: &str| record.and_then(|r| r.get(k)).map(String::as_str).unwrap_or("");
    let Some(mut row) = rows.iter().find(|r| r.get("JobID").is_some_and(|j| !j.contains('.'))).cloned()
    else {
        return Err(if record.is_some() { Lookup::NotYetAccounted } else { Lookup::NotFound });
    };
    // Right after a short job, slurmdbd may hold only what the steps sent (a
    // record named "allocation", no time limit, no memory): fill those in
    // from Slurm's memory while it has the job.
    if row.get("Timelimit").is_none_or(String::is_empty) && record.is_some() {
        let mem =
            ["MinMemoryNode", "MinMemoryCPU"].iter().map(|k| rget(k)).find(|m| !m.is_empty()).unwrap_or("");
        for (k, v) in [("JobName", rget("JobName")), ("Timelimit", rget("TimeLimit")), ("ReqMem", mem)] {
            row.insert(k.to_owned(), v.to_owned());
        }
    }
    let get = |k: &str| row.get(k).map(String::as_str).unwrap_or("");
    let word = get("State").split_whitespace().next().unwrap_or("").to_owned();
    if matches!(
        word.as_str(),
        "RUNNING" | "PENDING" | "COMPLETING" | "CONFIGURING" | "SUSPENDED" | "REQUEUED"
    ) {
        return Err(Lookup::NotEnded(word));
    }
    let mut exit_code = get("ExitCode").to_owned();
    if exit_code == "0:0" && word != "COMPLETED" {
        if let Some(step) =
            rows.iter().filter_map(|r| r.get("ExitCode")).find(|e| *e != "0:0" && !e.is_empty())
        {
            exit_code = step.clone();
        }
    }
    let nodes = match get("NodeList") {
        "" | "None assigned" => Vec::new(),
        l => hostlist::expand(l).unwrap_or_default(),
    };
    let mut output_paths: Vec<String> = Vec::new();
    for k in ["StdErr", "StdOut"] {
        let p = rget(k);
        if !p.is_empty() && !output_paths.iter().any(|o| o == p) {
            output_paths.push(p.to_owned());
        }
    }
    Ok(EndedJob {
        exit_code,
        nodes,
        req_mem: parse_size(get("ReqMem")),
        max_rss: rows.iter().filter_map(|r| r.get("MaxRSS").and_then(|m| parse_size(m))).max(),
        output_paths,
        reason: rget("Reason").to_owned(),
        row,
    })
}

impl EndedJob {
    /// A field of its row; empty when absent.
    pub fn get(&self, key: &str) -> &str {
        self.row.get(key).map_or("", String::as_str)
    }

    /// The first word of its state: `CANCELLED` of `CANCELLED by 0`.
    pub fn state_word(&self) -> &str {
        self.get("State").split_whitespace().next().unwrap_or("")
    }

    /// `(status, signal)` of its exit code.
    pub fn exit(&self) -> (Option<u32>, Option<u32>) {
        let (code, sig) = self.exit_code.split_once(':').unwrap_or((&self.exit_code, "0"));
        (code.parse().ok(), sig.parse().ok())
    }

    /// Its run, `[start, end + margin_s]` in [`parse_time`]'s seconds, when it ran.
    pub fn window(&self, margin_s: i64) -> Option<(i64, i64)> {
        let from = parse_time(self.get("Start"))?;
        let to = parse_time(self.get("End")).unwrap_or(from);
        Some((from, to.saturating_add(margin_s)))
    }
}

/// What `autopsy` concludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autopsy {
    /// Host or GPU out-of-memory, when the state, memory or log say so.
    pub oom: Option<OomKind>,
    /// The findings, in the order they are printed.
    pub findings: Vec<String>,
    /// For `TIMEOUT` and `PREEMPTED`: the checkpoint-and-requeue recipe.
    pub recipe: Option<String>,
}

/// The conclusions about `job`, given the output directories found missing,
/// the end of its log (when read) and its nodes' events during the run.
pub fn autopsy(job: &EndedJob, missing_dirs: &[String], log: Option<&str>, events: &[NodeEvent]) -> Autopsy {
    let word = job.state_word();
    let (_, signal) = job.exit();
    let over_mem = matches!((job.max_rss, job.req_mem), (Some(used), Some(asked)) if used >= asked);
    let oom = match (log.and_then(classify_oom), word) {
        (Some(k), _) => Some(k),
        (None, "OUT_OF_MEMORY") => Some(OomKind::Host),
        // Slurm's OverMemoryKill ends the job FAILED 0:9 (Reason JobLaunchFailure) with MaxRSS above --mem.
        (None, _) if signal == Some(9) && over_mem => Some(OomKind::Host),
        _ => None,
    };
    let mut findings = vec![state_in_words(job.get("State"))];
    if word != "COMPLETED" {
        findings.push(exit_in_words(&job.exit_code));
    }
    if !missing_dirs.is_empty() {
        findings.push(format!(
            "Slurm could not open the job's output: the directory {} does not exist, so the job failed at \
             launch with no log. Create it (mkdir -p) and resubmit",
            missing_dirs.join(" and ")
        ));
    } else if oom.is_none()
        && (job.exit_code == "0:53" || (job.reason == "JobLaunchFailure" && signal == Some(0)))
    {
        findings.push(
            "Slurm could not launch the job (often an --output/--error path it cannot open, or a missing \
             working directory)"
                .to_owned(),
        );
    }
    match oom {
        Some(OomKind::Host) => findings.push(format!(
            "host memory ran out: the job asked for {} and its largest step used {}; ask for more --mem \
             (GPU memory is a different limit)",
            job.req_mem.map_or("an unknown amount".to_owned(), format_size),
            job.max_rss.map_or("an unknown amount (MaxRSS not recorded)".to_owned(), format_size)
        )),
        Some(OomKind::Gpu) => findings.push(
            "GPU memory ran out (CUDA out of memory in the log): a smaller batch, activation checkpointing or \
             more GPUs help; --mem does not"
                .to_owned(),
        ),
        None => {}
    }
    for ev in events {
        findings.push(match &ev.agent {
            Some(a) => {
                format!("{} (at {}). Resubmit: Slurm will not place it on that node", a.meaning, ev.start)
            }
            None => format!("node {} went {} at {}: {}", ev.node, ev.state, ev.start, ev.reason),
        });
    }
    let recipe = matches!(word, "TIMEOUT" | "PREEMPTED").then(|| {
        requeue_recipe(
            job.get("JobName"),
            parse_duration(job.get("Timelimit")),
            "srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" python train.py",
        )
    });
    Autopsy { oom, findings, recipe }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded on the local lab (Slurm 22.05.8 with slurmdbd): see the README there.
    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/slurm-jobs/", $name))
        };
    }

    #[test]
    fn every_printed_reason_has_an_explanation() {
        for (name, printed) in REASONS {
            let e = explain_reason(printed);
            assert!(e.is_some(), "{name} ({printed}) has no explanation");
            assert!(!e.as_ref().is_some_and(|e| e.meaning.is_empty() || e.action.is_empty()), "{name}");
        }
        assert_eq!(explain_reason("SomethingNewInSlurm25"), None);
        assert_eq!(explain_reason("AssocGrpFooLimit"), None);
    }

    #[test]
    fn reasons_resolve_by_time_user_or_admin_as_the_guide_says() {
        let by = |p: &str| explain_reason(p).map(|e| e.remedy);
        assert_eq!(by("Resources"), Some(Remedy::Time));
        assert_eq!(by("Priority"), Some(Remedy::Time));
        assert_eq!(by("BeginTime"), Some(Remedy::Time));
        assert_eq!(by("JobHeldUser"), Some(Remedy::User));
        assert_eq!(by("DependencyNeverSatisfied"), Some(Remedy::User));
        assert_eq!(by("AssocGrpGRESRunMinutes"), Some(Remedy::Admin));
        assert_eq!(by("QOSGrpCPUMinutesLimit"), Some(Remedy::Admin));
        assert_eq!(by("JobHeldAdmin"), Some(Remedy::Admin));
        assert_eq!(by("ReqNodeNotAvail"), Some(Remedy::Admin));
        assert_eq!(by("AssocMaxGRESPerJob"), Some(Remedy::User));
        assert_eq!(by("QOSMaxJobsPerUserLimit"), Some(Remedy::Time));
        let e = explain_reason("AssocGrpGRESRunMinutes").map(|e| e.action).unwrap_or_default();
        assert!(e.contains("does not resolve by waiting"), "{e}");
        let m = explain_reason("QOSMaxWallDurationPerJobLimit").map(|e| e.meaning).unwrap_or_default();
        assert!(m.contains("wall time") && m.contains("per job"), "{m}");
    }

    #[test]
    fn printed_strings_map_back_to_enum_names() {
        assert_eq!(enum_names("JobHeldUser"), ["WAIT_HELD_USER"]);
        assert_eq!(enum_names("PartitionDown"), ["WAIT_PART_DOWN", "FAIL_DOWN_PARTITION"]);
        assert_eq!(enum_names("DependencyNeverSatisfied"), ["WAIT_DEP_INVALID"]);
        assert!(enum_names("nope").is_empty());
    }

    #[test]
    fn why_conclusions_from_recorded_records() {
        let held = why(&parse_record(fixture!("held.scontrol")), "1");
        assert!(
            held.pending && held.remedy == Remedy::User && held.action == "scontrol release 1",
            "{held:?}"
        );
        let node = why(&parse_record(fixture!("reqnode.scontrol")), "6");
        assert_eq!(node.reason, "ReqNodeNotAvail, UnavailableNodes:node2");
        assert_eq!(node.code, "ReqNodeNotAvail");
        assert_eq!(node.nodes, ["node2"]);
        let res = why(&parse_record(fixture!("resources.scontrol")), "5");
        assert!(res.wants_advice && res.remedy == Remedy::Time, "{res:?}");
        let dep = why(&parse_record(fixture!("depfail.scontrol")), "3");
        assert_eq!(dep.dependencies.len(), 1);
        let ended = why(&parse_record(fixture!("oom.scontrol")), "8");
        assert!(!ended.pending && ended.action == "spank-gpu autopsy 8", "{ended:?}");
        let mut new = parse_record(fixture!("held.scontrol"));
        new.insert("Reason".into(), "WaitingForTheMoon".into());
        assert!(why(&new, "1").meaning.contains("not in spank-gpu's table"));
        // Advice for a long, wide request whose earlier runs were short.
        let mut big = parse_record(fixture!("resources.scontrol"));
        big.insert("TimeLimit".into(), "1-00:00:00".into());
        big.insert("NumNodes".into(), "8-8".into());
        let advice = why_advice(&big, &[1800, 2000]);
        assert_eq!(advice.len(), 2, "{advice:?}");
    }

    #[test]
    fn held_job_record() {
        let r = parse_record(fixture!("held.scontrol"));
        assert_eq!(r.get("JobState").map(String::as_str), Some("PENDING"));
        assert_eq!(r.get("Reason").map(String::as_str), Some("JobHeldUser"));
        assert_eq!(r.get("JobId").map(String::as_str), Some("1"));
    }

    #[test]
    fn failed_dependency_names_the_job() {
        let r = parse_record(fixture!("depfail.scontrol"));
        assert_eq!(r.get("Reason").map(String::as_str), Some("DependencyNeverSatisfied"));
        let deps = parse_dependencies(r.get("Dependency").map_or("", String::as_str));
        assert_eq!(
            deps,
            [Dependency { kind: "afterok".into(), job: Some("2".into()), state: "failed".into() }]
        );
        assert!(parse_dependencies("(null)").is_empty());
        let two = parse_dependencies("afterok:12_*(unfulfilled),afterany:13+5(unfulfilled)");
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].job.as_deref(), Some("13"));
    }

    #[test]
    fn drained_node_reason_is_decoded() {
        let r = parse_record(fixture!("reqnode.scontrol"));
        let reason = r.get("Reason").cloned().unwrap_or_default();
        assert_eq!(reason_code(&reason), "ReqNodeNotAvail");
        assert_eq!(unavailable_nodes(&reason), ["node2"]);
        // scontrol show node -o: the reason holds spaces and ends with [user@time].
        let node = parse_record(fixture!("node2.scontrol"));
        let reason = node.get("Reason").cloned().unwrap_or_default();
        assert!(reason.starts_with("gpu: xid79 gpu3 GPU has fallen off the bus (kmsg) [root@"), "{reason}");
        let a = decode_agent_reason("node2", &reason).expect("the agent's reason");
        assert_eq!((a.class.as_str(), a.gpu, a.xid), ("xid79", Some(3), Some(79)));
        assert_eq!(a.detail, "GPU has fallen off the bus (kmsg)");
        assert!(a.meaning.starts_with("GPU 3 on node2 failed with Xid 79"), "{}", a.meaning);
        let sinfo = fixture!("node2.sinfo").trim().splitn(3, '|').nth(2).unwrap_or("");
        assert_eq!(decode_agent_reason("node2", sinfo), Some(a));
    }

    #[test]
    fn other_reasons_are_not_the_agents() {
        assert_eq!(decode_agent_reason("n", "gpu: RMA ticket 42"), None);
        // Every class the agent writes is the agent's, the link checks' included.
        let pcie = decode_agent_reason("n", "gpu: pcie gpu2 x8/16 gen5/5: link trained below the GPU's max")
            .expect("a PCIe drain is the agent's");
        assert_eq!((pcie.class.as_str(), pcie.gpu), ("pcie", Some(2)));
        assert!(
            pcie.meaning.starts_with("the PCIe link of GPU 2 on n runs below its speed"),
            "{}",
            pcie.meaning
        );
        assert_eq!(decode_agent_reason("n", "maintenance"), None);
        assert_eq!(decode_agent_reason("n", "gpu:xid79 gpu3"), None);
        let lost = decode_agent_reason("n", "gpu: lost gpu1 NVML: GPU is lost (fallen off the bus)");
        assert_eq!(lost.map(|a| (a.gpu, a.xid)), Some((Some(1), None)));
        let missing = decode_agent_reason("n", "gpu: missing 7/8 GPUs visible, Slurm expects 8");
        assert!(missing.is_some_and(|a| a.gpu.is_none() && a.meaning.contains("fewer GPUs")));
        let rec = decode_agent_reason("n", "gpu: recovery2 gpu0 driver asks for a node reboot");
        assert!(rec.is_some_and(|a| a.meaning.contains("node reboot")));
    }

    #[test]
    fn sacct_rows_and_exit_codes() {
        let rows = parse_parsable(fixture!("exit3.sacct"));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].get("State").map(String::as_str), Some("FAILED"));
        assert_eq!(exit_in_words("3:0"), "the program exited with status 3 (its own error, not a signal)");
        assert!(exit_in_words("0:9").contains("signal 9 (SIGKILL)"));
        assert!(exit_in_words("0:53").contains("before or at launch"));
        assert!(state_in_words("CANCELLED by 1000").contains("uid 1000"));
        let oom = parse_parsable(fixture!("oom.sacct"));
        assert_eq!(oom[0].get("ReqMem").and_then(|m| parse_size(m)), Some(20 * 1024 * 1024));
        assert_eq!(oom[1].get("MaxRSS").and_then(|m| parse_size(m)), Some(621_060 * 1024));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("4000"), Some(4000 * 1024 * 1024));
    }

    #[test]
    fn oom_kinds_from_logs() {
        let slurm = "slurmstepd-node1: error: Exceeded job memory limit\n";
        assert_eq!(classify_oom(slurm), Some(OomKind::Host));
        let torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n";
        assert_eq!(classify_oom(torch), Some(OomKind::Gpu));
        assert_eq!(classify_oom(&format!("{torch}{slurm}")), Some(OomKind::Gpu));
        assert_eq!(classify_oom("all fine\n"), None);
    }

    #[test]
    fn node_events_in_the_window() {
        let text = fixture!("events.sacctmgr");
        let t = |s| parse_time(s).unwrap_or(0);
        let all = parse_events(text, t("2026-11-30T18:59:00"), t("2026-11-30T19:10:00"));
        assert_eq!(all.len(), 2);
        let during = parse_events(text, t("2026-11-30T18:59:25"), t("2026-11-30T18:59:40"));
        assert_eq!(during.len(), 1, "{during:?}");
        assert_eq!(during[0].end, "Unknown");
        assert_eq!(during[0].agent.as_ref().and_then(|a| a.xid), Some(79));
        assert!(parse_events(text, t("2026-11-30T18:00:00"), t("2026-11-30T18:10:00")).is_empty());
    }

    #[test]
    fn times_and_durations() {
        assert_eq!(parse_time("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_time("2000-03-01T00:00:00"), Some(951_868_800));
        assert_eq!(parse_time("2026-11-30T18:59:25"), Some(1_796_065_165));
        assert_eq!(parse_time("Unknown"), None);
        assert_eq!(parse_time("99999999999999-01-01T00:00:00"), None);
        assert_eq!(parse_duration("99999999999999999-99999999999:0:0"), Some(u64::MAX));
        assert_eq!(parse_duration("365-00:00:00"), Some(365 * 86400));
        assert_eq!(parse_duration("00:00:07"), Some(7));
        assert_eq!(parse_duration("10"), Some(600));
        assert_eq!(parse_duration("1-02"), Some(86400 + 7200));
        assert_eq!(parse_duration("UNLIMITED"), None);
        assert_eq!(format_duration(90061), "1-01:01:01");
    }

    #[test]
    fn advice_on_time_and_size() {
        let a = time_advice(Some(24 * 3600), &[1800, 2400, 2000]).unwrap_or_default();
        assert!(a.contains("--time=01:00:00") && a.contains("3 similar jobs"), "{a}");
        assert_eq!(time_advice(Some(3600), &[3000, 3200]), None);
        assert_eq!(time_advice(Some(24 * 3600), &[100]), None);
        assert!(split_advice(8, Some(24 * 3600)).is_some_and(|a| a.contains("4 nodes for 12:00:00")));
        assert_eq!(split_advice(2, Some(24 * 3600)), None);
    }

    fn one(text: &str) -> Option<Row> {
        Some(parse_record(text))
    }

    #[test]
    fn autopsy_of_a_non_zero_exit() {
        let job = ended_job(&parse_parsable(fixture!("exit3.sacct")), None).expect("ended");
        assert_eq!((job.exit(), job.nodes.as_slice()), ((Some(3), Some(0)), ["node1".to_owned()].as_slice()));
        let a = autopsy(&job, &[], Some("Traceback ...\nValueError: bad\n"), &[]);
        assert_eq!(a.oom, None);
        assert_eq!(a.recipe, None);
        assert!(a.findings[1].contains("exited with status 3"), "{:?}", a.findings);
        assert_eq!(a.findings.len(), 2, "{:?}", a.findings);
    }

    #[test]
    fn autopsy_of_an_over_memory_kill() {
        // FAILED 0:9 with Reason=JobLaunchFailure: not a launch failure, a host OOM.
        let rows = parse_parsable(fixture!("oom.sacct"));
        let job = ended_job(&rows, one(fixture!("oom.scontrol")).as_ref()).expect("ended");
        assert_eq!(job.reason, "JobLaunchFailure");
        let a = autopsy(&job, &[], None, &[]);
        assert_eq!(a.oom, Some(OomKind::Host));
        assert!(a.findings.iter().any(|f| f.contains("asked for 20 MiB and its largest step used 607 MiB")));
        assert!(!a.findings.iter().any(|f| f.contains("could not launch the job")), "{:?}", a.findings);
    }

    #[test]
    fn autopsy_of_a_missing_output_directory() {
        let rec = one(fixture!("nodir.scontrol"));
        let rows = parse_parsable(
            "JobID|JobName|State|ExitCode|Start|End|Timelimit|NodeList\n7|wrap|FAILED|0:53|2026-11-30T18:59:41|2026-11-30T18:59:41|UNLIMITED|node1\n",
        );
        let job = ended_job(&rows, rec.as_ref()).expect("ended");
        assert_eq!(job.output_paths, ["/tmp/why16/nodir/7.out"]);
        let a = autopsy(&job, &["/tmp/why16/nodir".to_owned()], None, &[]);
        assert!(a.findings.iter().any(|f| f.contains("the directory /tmp/why16/nodir does not exist")));
        // Without the directory known (Slurm forgot the job): the generic launch failure.
        let a = autopsy(&ended_job(&rows, None).expect("ended"), &[], None, &[]);
        assert!(a.findings.iter().any(|f| f.contains("could not launch the job")), "{:?}", a.findings);
    }

    #[test]
    fn autopsy_of_a_job_on_a_node_the_agent_drained() {
        let job = ended_job(&parse_parsable(fixture!("cancelled.sacct")), None).expect("ended");
        // Its own row says 0:0; the batch step has the signal.
        assert_eq!(job.exit_code, "0:15");
        let (from, to) = job.window(300).expect("ran");
        let events = parse_events(fixture!("events.sacctmgr"), from, to);
        let a = autopsy(&job, &[], None, &events);
        assert!(a.findings[0].contains("cancelled by uid 0"), "{:?}", a.findings);
        assert!(
            a.findings.iter().any(|f| f.starts_with("GPU 3 on node2 failed with Xid 79")),
            "{:?}",
            a.findings
        );
    }

    #[test]
    fn autopsy_lookups() {
        assert_eq!(ended_job(&[], None), Err(Lookup::NotFound));
        assert_eq!(ended_job(&[], one(fixture!("held.scontrol")).as_ref()), Err(Lookup::NotYetAccounted));
        let running = parse_parsable("JobID|State\n5|RUNNING\n5.batch|RUNNING\n");
        assert_eq!(ended_job(&running, None), Err(Lookup::NotEnded("RUNNING".into())));
        // A steps-only record right after the job: filled in from scontrol.
        let early =
            parse_parsable("JobID|JobName|State|ExitCode|Timelimit|ReqMem\n8|allocation|FAILED|0:9||\n");
        let job = ended_job(&early, one(fixture!("oom.scontrol")).as_ref()).expect("ended");
        assert_eq!((job.get("JobName"), job.req_mem), ("wrap", Some(20 * 1024 * 1024)));
        let timeout = parse_parsable("JobID|JobName|State|ExitCode|Timelimit\n9|seg|TIMEOUT|0:0|00:10:00\n");
        let a = autopsy(&ended_job(&timeout, None).expect("ended"), &[], None, &[]);
        assert!(a.recipe.is_some_and(|r| r.contains("@120") && r.contains("ckpt/seg")));
    }

    #[test]
    fn the_recipe_is_filled_in() {
        let r = requeue_recipe("pretrain", Some(3600), "srun python train.py");
        assert!(r.contains("--signal=B:USR1@360"), "{r}");
        assert!(r.contains("--requeue") && r.contains("trap on_usr1 USR1"));
        assert!(
            r.contains("srun python train.py --ckpt-dir \"$CKPT_DIR\" &\nSRUN_PID=$!\nwait \"$SRUN_PID\"")
        );
        assert!(r.contains("ckpt/pretrain") && r.contains("Why B:"));
        assert!(requeue_recipe("", None, "srun x").contains("@180"));
        assert!(requeue_recipe("", Some(60), "srun x").contains("@30"));
        assert!(requeue_recipe("", Some(86400), "srun x").contains("@600"));
    }
}
