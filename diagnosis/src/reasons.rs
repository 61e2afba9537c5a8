//! The reason table: every `enum job_state_reason` value of Slurm 22.05
//! through 26.05, by enum name, with the string Slurm prints for it and the
//! releases it exists in. The words for each printed string are in
//! [`super::explain`]; a new Slurm release is new rows here (and words there
//! for a string never seen before), which `cli/tests/reasons.rs`
//! checks against the headers the build uses and
//! `diagnosis/tests/fixtures/jobinfo/reasons/` against every release's source.
//!
//! Facts, per release tag of Slurm's git (`slurm-22-05-8-1`, `23-02`,
//! `23-11`, `24-05`, `slurm-24-11-5-1`, `25-05`, `25-11`, `slurm-26-05-3-1`):
//! the enum in `slurm/slurm.h` and the strings of `job_reason_string()` in
//! `src/common/slurm_protocol_defs.c` (through 23.11) or of `jsra[]` /
//! `job_state_reason_string()` in `src/common/job_state_reason.c` (24.05 on).
//! The enum's order changed (slot 17 is `WAIT_FRONT_END` in 22.05 and
//! `WAIT_NVIDIA_IMEX_CHANNELS` in 26.05), so nothing here depends on a
//! position. `DEFUNCT_*` values and `REASON_END` are not reasons and are left
//! out. Two names print the same string (`WAIT_PART_DOWN` and
//! `FAIL_DOWN_PARTITION` both `PartitionDown`), and every release prints
//! `WAIT_QOS_MAX_BB_MINS_PER_JOB` as `AssocMaxBBMinutesPerJob`: the table
//! keeps Slurm's strings as they are, since those are what users see.

use super::release::{R22_05, R23_02, R23_02_3, R23_11, R24_05, R24_11, R25_11, R26_05, Release};

/// One `enum job_state_reason` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reason {
    /// Its name in `slurm.h`: `WAIT_HELD_USER`.
    pub name: &'static str,
    /// What Slurm prints for it: `JobHeldUser`.
    pub printed: &'static str,
    /// The first release that has it (22.05: 22.05 or older).
    pub since: Release,
    /// The last release series that has it; `None`: still in the newest one read.
    pub until: Option<Release>,
}

impl Reason {
    /// Whether `release` has this reason.
    pub fn exists_in(&self, release: Release) -> bool {
        release.within(self.since, self.until)
    }
}

const fn r(name: &'static str, printed: &'static str, since: Release, until: Option<Release>) -> Reason {
    Reason { name, printed, since, until }
}

/// Every reason of 22.05 through 26.05: 22.05's in its enum order, then the
/// newer ones in the order they came.
pub const REASONS: &[Reason] = &[
    r("WAIT_NO_REASON", "None", R22_05, None),
    r("WAIT_PRIORITY", "Priority", R22_05, None),
    r("WAIT_DEPENDENCY", "Dependency", R22_05, None),
    r("WAIT_RESOURCES", "Resources", R22_05, None),
    r("WAIT_PART_NODE_LIMIT", "PartitionNodeLimit", R22_05, None),
    r("WAIT_PART_TIME_LIMIT", "PartitionTimeLimit", R22_05, None),
    r("WAIT_PART_DOWN", "PartitionDown", R22_05, None),
    r("WAIT_PART_INACTIVE", "PartitionInactive", R22_05, None),
    r("WAIT_HELD", "JobHeldAdmin", R22_05, None),
    r("WAIT_TIME", "BeginTime", R22_05, None),
    r("WAIT_LICENSES", "Licenses", R22_05, None),
    r("WAIT_ASSOC_JOB_LIMIT", "AssociationJobLimit", R22_05, None),
    r("WAIT_ASSOC_RESOURCE_LIMIT", "AssociationResourceLimit", R22_05, None),
    r("WAIT_ASSOC_TIME_LIMIT", "AssociationTimeLimit", R22_05, None),
    r("WAIT_RESERVATION", "Reservation", R22_05, None),
    r("WAIT_NODE_NOT_AVAIL", "ReqNodeNotAvail", R22_05, None),
    r("WAIT_HELD_USER", "JobHeldUser", R22_05, None),
    r("WAIT_FRONT_END", "FrontEndDown", R22_05, Some(R24_11)),
    r("FAIL_DEFER", "SchedDefer", R22_05, None),
    r("FAIL_DOWN_PARTITION", "PartitionDown", R22_05, None),
    r("FAIL_DOWN_NODE", "NodeDown", R22_05, None),
    r("FAIL_BAD_CONSTRAINTS", "BadConstraints", R22_05, None),
    r("FAIL_SYSTEM", "SystemFailure", R22_05, None),
    r("FAIL_LAUNCH", "JobLaunchFailure", R22_05, None),
    r("FAIL_EXIT_CODE", "NonZeroExitCode", R22_05, None),
    r("FAIL_TIMEOUT", "TimeLimit", R22_05, None),
    r("FAIL_INACTIVE_LIMIT", "InactiveLimit", R22_05, None),
    r("FAIL_ACCOUNT", "InvalidAccount", R22_05, None),
    r("FAIL_QOS", "InvalidQOS", R22_05, None),
    r("WAIT_QOS_THRES", "QOSUsageThreshold", R22_05, None),
    r("WAIT_QOS_JOB_LIMIT", "QOSJobLimit", R22_05, None),
    r("WAIT_QOS_RESOURCE_LIMIT", "QOSResourceLimit", R22_05, None),
    r("WAIT_QOS_TIME_LIMIT", "QOSTimeLimit", R22_05, None),
    r("WAIT_BLOCK_MAX_ERR", "BlockMaxError", R22_05, Some(R22_05)),
    r("WAIT_BLOCK_D_ACTION", "BlockFreeAction", R22_05, Some(R22_05)),
    r("WAIT_CLEANING", "Cleaning", R22_05, None),
    r("WAIT_PROLOG", "Prolog", R22_05, None),
    r("WAIT_QOS", "QOSNotAllowed", R22_05, None),
    r("WAIT_ACCOUNT", "AccountNotAllowed", R22_05, None),
    r("WAIT_DEP_INVALID", "DependencyNeverSatisfied", R22_05, None),
    r("WAIT_QOS_GRP_CPU", "QOSGrpCpuLimit", R22_05, None),
    r("WAIT_QOS_GRP_CPU_MIN", "QOSGrpCPUMinutesLimit", R22_05, None),
    r("WAIT_QOS_GRP_CPU_RUN_MIN", "QOSGrpCPURunMinutesLimit", R22_05, None),
    r("WAIT_QOS_GRP_JOB", "QOSGrpJobsLimit", R22_05, None),
    r("WAIT_QOS_GRP_MEM", "QOSGrpMemLimit", R22_05, None),
    r("WAIT_QOS_GRP_NODE", "QOSGrpNodeLimit", R22_05, None),
    r("WAIT_QOS_GRP_SUB_JOB", "QOSGrpSubmitJobsLimit", R22_05, None),
    r("WAIT_QOS_GRP_WALL", "QOSGrpWallLimit", R22_05, None),
    r("WAIT_QOS_MAX_CPU_PER_JOB", "QOSMaxCpuPerJobLimit", R22_05, None),
    r("WAIT_QOS_MAX_CPU_MINS_PER_JOB", "QOSMaxCpuMinutesPerJobLimit", R22_05, None),
    r("WAIT_QOS_MAX_NODE_PER_JOB", "QOSMaxNodePerJobLimit", R22_05, None),
    r("WAIT_QOS_MAX_WALL_PER_JOB", "QOSMaxWallDurationPerJobLimit", R22_05, None),
    r("WAIT_QOS_MAX_CPU_PER_USER", "QOSMaxCpuPerUserLimit", R22_05, None),
    r("WAIT_QOS_MAX_JOB_PER_USER", "QOSMaxJobsPerUserLimit", R22_05, None),
    r("WAIT_QOS_MAX_NODE_PER_USER", "QOSMaxNodePerUserLimit", R22_05, None),
    r("WAIT_QOS_MAX_SUB_JOB", "QOSMaxSubmitJobPerUserLimit", R22_05, None),
    r("WAIT_QOS_MIN_CPU", "QOSMinCpuNotSatisfied", R22_05, None),
    r("WAIT_ASSOC_GRP_CPU", "AssocGrpCpuLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_CPU_MIN", "AssocGrpCPUMinutesLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_CPU_RUN_MIN", "AssocGrpCPURunMinutesLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_JOB", "AssocGrpJobsLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_MEM", "AssocGrpMemLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_NODE", "AssocGrpNodeLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_SUB_JOB", "AssocGrpSubmitJobsLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_WALL", "AssocGrpWallLimit", R22_05, None),
    r("WAIT_ASSOC_MAX_JOBS", "AssocMaxJobsLimit", R22_05, None),
    r("WAIT_ASSOC_MAX_CPU_PER_JOB", "AssocMaxCpuPerJobLimit", R22_05, None),
    r("WAIT_ASSOC_MAX_CPU_MINS_PER_JOB", "AssocMaxCpuMinutesPerJobLimit", R22_05, None),
    r("WAIT_ASSOC_MAX_NODE_PER_JOB", "AssocMaxNodePerJobLimit", R22_05, None),
    r("WAIT_ASSOC_MAX_WALL_PER_JOB", "AssocMaxWallDurationPerJobLimit", R22_05, None),
    r("WAIT_ASSOC_MAX_SUB_JOB", "AssocMaxSubmitJobLimit", R22_05, None),
    r("WAIT_MAX_REQUEUE", "JobHoldMaxRequeue", R22_05, None),
    r("WAIT_ARRAY_TASK_LIMIT", "JobArrayTaskLimit", R22_05, None),
    r("WAIT_BURST_BUFFER_RESOURCE", "BurstBufferResources", R22_05, None),
    r("WAIT_BURST_BUFFER_STAGING", "BurstBufferStageIn", R22_05, None),
    r("FAIL_BURST_BUFFER_OP", "BurstBufferOperation", R22_05, None),
    r("WAIT_POWER_NOT_AVAIL", "PowerNotAvail", R22_05, Some(R23_11)),
    r("WAIT_POWER_RESERVED", "PowerReserved", R22_05, Some(R23_11)),
    r("WAIT_ASSOC_GRP_UNK", "AssocGrpUnknown", R22_05, None),
    r("WAIT_ASSOC_GRP_UNK_MIN", "AssocGrpUnknownMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_UNK_RUN_MIN", "AssocGrpUnknownRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_UNK_PER_JOB", "AssocMaxUnknownPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_UNK_PER_NODE", "AssocMaxUnknownPerNode", R22_05, None),
    r("WAIT_ASSOC_MAX_UNK_MINS_PER_JOB", "AssocMaxUnknownMinutesPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_CPU_PER_NODE", "AssocMaxCpuPerNode", R22_05, None),
    r("WAIT_ASSOC_GRP_MEM_MIN", "AssocGrpMemMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_MEM_RUN_MIN", "AssocGrpMemRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_MEM_PER_JOB", "AssocMaxMemPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_MEM_PER_NODE", "AssocMaxMemPerNode", R22_05, None),
    r("WAIT_ASSOC_MAX_MEM_MINS_PER_JOB", "AssocMaxMemMinutesPerJob", R22_05, None),
    r("WAIT_ASSOC_GRP_NODE_MIN", "AssocGrpNodeMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_NODE_RUN_MIN", "AssocGrpNodeRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_NODE_MINS_PER_JOB", "AssocMaxNodeMinutesPerJob", R22_05, None),
    r("WAIT_ASSOC_GRP_ENERGY", "AssocGrpEnergy", R22_05, None),
    r("WAIT_ASSOC_GRP_ENERGY_MIN", "AssocGrpEnergyMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_ENERGY_RUN_MIN", "AssocGrpEnergyRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_ENERGY_PER_JOB", "AssocMaxEnergyPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_ENERGY_PER_NODE", "AssocMaxEnergyPerNode", R22_05, None),
    r("WAIT_ASSOC_MAX_ENERGY_MINS_PER_JOB", "AssocMaxEnergyMinutesPerJob", R22_05, None),
    r("WAIT_ASSOC_GRP_GRES", "AssocGrpGRES", R22_05, None),
    r("WAIT_ASSOC_GRP_GRES_MIN", "AssocGrpGRESMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_GRES_RUN_MIN", "AssocGrpGRESRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_GRES_PER_JOB", "AssocMaxGRESPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_GRES_PER_NODE", "AssocMaxGRESPerNode", R22_05, None),
    r("WAIT_ASSOC_MAX_GRES_MINS_PER_JOB", "AssocMaxGRESMinutesPerJob", R22_05, None),
    r("WAIT_ASSOC_GRP_LIC", "AssocGrpLicense", R22_05, None),
    r("WAIT_ASSOC_GRP_LIC_MIN", "AssocGrpLicenseMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_LIC_RUN_MIN", "AssocGrpLicenseRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_LIC_PER_JOB", "AssocMaxLicensePerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_LIC_MINS_PER_JOB", "AssocMaxLicenseMinutesPerJob", R22_05, None),
    r("WAIT_ASSOC_GRP_BB", "AssocGrpBB", R22_05, None),
    r("WAIT_ASSOC_GRP_BB_MIN", "AssocGrpBBMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_BB_RUN_MIN", "AssocGrpBBRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_BB_PER_JOB", "AssocMaxBBPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_BB_PER_NODE", "AssocMaxBBPerNode", R22_05, None),
    r("WAIT_ASSOC_MAX_BB_MINS_PER_JOB", "AssocMaxBBMinutesPerJob", R22_05, None),
    r("WAIT_QOS_GRP_UNK", "QOSGrpUnknown", R22_05, None),
    r("WAIT_QOS_GRP_UNK_MIN", "QOSGrpUnknownMinutes", R22_05, None),
    r("WAIT_QOS_GRP_UNK_RUN_MIN", "QOSGrpUnknownRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_UNK_PER_JOB", "QOSMaxUnknownPerJob", R22_05, None),
    r("WAIT_QOS_MAX_UNK_PER_NODE", "QOSMaxUnknownPerNode", R22_05, None),
    r("WAIT_QOS_MAX_UNK_PER_USER", "QOSMaxUnknownPerUser", R22_05, None),
    r("WAIT_QOS_MAX_UNK_MINS_PER_JOB", "QOSMaxUnknownMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MIN_UNK", "QOSMinUnknown", R22_05, None),
    r("WAIT_QOS_MAX_CPU_PER_NODE", "QOSMaxCpuPerNode", R22_05, None),
    r("WAIT_QOS_GRP_MEM_MIN", "QOSGrpMemoryMinutes", R22_05, None),
    r("WAIT_QOS_GRP_MEM_RUN_MIN", "QOSGrpMemoryRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_MEM_MINS_PER_JOB", "QOSMaxMemoryMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MAX_MEM_PER_JOB", "QOSMaxMemoryPerJob", R22_05, None),
    r("WAIT_QOS_MAX_MEM_PER_NODE", "QOSMaxMemoryPerNode", R22_05, None),
    r("WAIT_QOS_MAX_MEM_PER_USER", "QOSMaxMemoryPerUser", R22_05, None),
    r("WAIT_QOS_MIN_MEM", "QOSMinMemory", R22_05, None),
    r("WAIT_QOS_GRP_ENERGY", "QOSGrpEnergy", R22_05, None),
    r("WAIT_QOS_GRP_ENERGY_MIN", "QOSGrpEnergyMinutes", R22_05, None),
    r("WAIT_QOS_GRP_ENERGY_RUN_MIN", "QOSGrpEnergyRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_ENERGY_PER_JOB", "QOSMaxEnergyPerJob", R22_05, None),
    r("WAIT_QOS_MAX_ENERGY_PER_NODE", "QOSMaxEnergyPerNode", R22_05, None),
    r("WAIT_QOS_MAX_ENERGY_PER_USER", "QOSMaxEnergyPerUser", R22_05, None),
    r("WAIT_QOS_MAX_ENERGY_MINS_PER_JOB", "QOSMaxEnergyMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MIN_ENERGY", "QOSMinEnergy", R22_05, None),
    r("WAIT_QOS_GRP_NODE_MIN", "QOSGrpNodeMinutes", R22_05, None),
    r("WAIT_QOS_GRP_NODE_RUN_MIN", "QOSGrpNodeRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_NODE_MINS_PER_JOB", "QOSMaxNodeMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MIN_NODE", "QOSMinNode", R22_05, None),
    r("WAIT_QOS_GRP_GRES", "QOSGrpGRES", R22_05, None),
    r("WAIT_QOS_GRP_GRES_MIN", "QOSGrpGRESMinutes", R22_05, None),
    r("WAIT_QOS_GRP_GRES_RUN_MIN", "QOSGrpGRESRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_GRES_PER_JOB", "QOSMaxGRESPerJob", R22_05, None),
    r("WAIT_QOS_MAX_GRES_PER_NODE", "QOSMaxGRESPerNode", R22_05, None),
    r("WAIT_QOS_MAX_GRES_PER_USER", "QOSMaxGRESPerUser", R22_05, None),
    r("WAIT_QOS_MAX_GRES_MINS_PER_JOB", "QOSMaxGRESMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MIN_GRES", "QOSMinGRES", R22_05, None),
    r("WAIT_QOS_GRP_LIC", "QOSGrpLicense", R22_05, None),
    r("WAIT_QOS_GRP_LIC_MIN", "QOSGrpLicenseMinutes", R22_05, None),
    r("WAIT_QOS_GRP_LIC_RUN_MIN", "QOSGrpLicenseRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_LIC_PER_JOB", "QOSMaxLicensePerJob", R22_05, None),
    r("WAIT_QOS_MAX_LIC_PER_USER", "QOSMaxLicensePerUser", R22_05, None),
    r("WAIT_QOS_MAX_LIC_MINS_PER_JOB", "QOSMaxLicenseMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MIN_LIC", "QOSMinLicense", R22_05, None),
    r("WAIT_QOS_GRP_BB", "QOSGrpBB", R22_05, None),
    r("WAIT_QOS_GRP_BB_MIN", "QOSGrpBBMinutes", R22_05, None),
    r("WAIT_QOS_GRP_BB_RUN_MIN", "QOSGrpBBRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_BB_PER_JOB", "QOSMaxBBPerJob", R22_05, None),
    r("WAIT_QOS_MAX_BB_PER_NODE", "QOSMaxBBPerNode", R22_05, None),
    r("WAIT_QOS_MAX_BB_PER_USER", "QOSMaxBBPerUser", R22_05, None),
    r("WAIT_QOS_MAX_BB_MINS_PER_JOB", "AssocMaxBBMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MIN_BB", "QOSMinBB", R22_05, None),
    r("FAIL_DEADLINE", "DeadLine", R22_05, None),
    r("WAIT_QOS_MAX_BB_PER_ACCT", "MaxBBPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_CPU_PER_ACCT", "MaxCpuPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_ENERGY_PER_ACCT", "MaxEnergyPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_GRES_PER_ACCT", "MaxGRESPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_NODE_PER_ACCT", "MaxNodePerAccount", R22_05, None),
    r("WAIT_QOS_MAX_LIC_PER_ACCT", "MaxLicensePerAccount", R22_05, None),
    r("WAIT_QOS_MAX_MEM_PER_ACCT", "MaxMemoryPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_UNK_PER_ACCT", "MaxUnknownPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_JOB_PER_ACCT", "MaxJobsPerAccount", R22_05, None),
    r("WAIT_QOS_MAX_SUB_JOB_PER_ACCT", "MaxSubmitJobsPerAccount", R22_05, None),
    r("WAIT_PART_CONFIG", "PartitionConfig", R22_05, None),
    r("WAIT_ACCOUNT_POLICY", "AccountingPolicy", R22_05, None),
    r("WAIT_FED_JOB_LOCK", "FedJobLock", R22_05, None),
    r("FAIL_OOM", "OutOfMemory", R22_05, None),
    r("WAIT_PN_MEM_LIMIT", "MaxMemPerLimit", R22_05, None),
    r("WAIT_ASSOC_GRP_BILLING", "AssocGrpBilling", R22_05, None),
    r("WAIT_ASSOC_GRP_BILLING_MIN", "AssocGrpBillingMinutes", R22_05, None),
    r("WAIT_ASSOC_GRP_BILLING_RUN_MIN", "AssocGrpBillingRunMinutes", R22_05, None),
    r("WAIT_ASSOC_MAX_BILLING_PER_JOB", "AssocMaxBillingPerJob", R22_05, None),
    r("WAIT_ASSOC_MAX_BILLING_PER_NODE", "AssocMaxBillingPerNode", R22_05, None),
    r("WAIT_ASSOC_MAX_BILLING_MINS_PER_JOB", "AssocMaxBillingMinutesPerJob", R22_05, None),
    r("WAIT_QOS_GRP_BILLING", "QOSGrpBilling", R22_05, None),
    r("WAIT_QOS_GRP_BILLING_MIN", "QOSGrpBillingMinutes", R22_05, None),
    r("WAIT_QOS_GRP_BILLING_RUN_MIN", "QOSGrpBillingRunMinutes", R22_05, None),
    r("WAIT_QOS_MAX_BILLING_PER_JOB", "QOSMaxBillingPerJob", R22_05, None),
    r("WAIT_QOS_MAX_BILLING_PER_NODE", "QOSMaxBillingPerNode", R22_05, None),
    r("WAIT_QOS_MAX_BILLING_PER_USER", "QOSMaxBillingPerUser", R22_05, None),
    r("WAIT_QOS_MAX_BILLING_MINS_PER_JOB", "QOSMaxBillingMinutesPerJob", R22_05, None),
    r("WAIT_QOS_MAX_BILLING_PER_ACCT", "MaxBillingPerAccount", R22_05, None),
    r("WAIT_QOS_MIN_BILLING", "QOSMinBilling", R22_05, None),
    r("WAIT_RESV_DELETED", "ReservationDeleted", R22_05, None),
    r("FAIL_SIGNAL", "RaisedSignal", R23_02, None),
    r("WAIT_RESV_INVALID", "ReservationInvalid", R23_02_3, None),
    r("FAIL_CONSTRAINTS", "Constraints", R23_11, None),
    r("WAIT_QOS_MAX_BB_RUN_MINS_PER_ACCT", "MaxBBRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_BILLING_RUN_MINS_PER_ACCT", "MaxBillingRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_CPU_RUN_MINS_PER_ACCT", "MaxCpuRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_ENERGY_RUN_MINS_PER_ACCT", "MaxEnergyRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_GRES_RUN_MINS_PER_ACCT", "MaxGRESRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_NODE_RUN_MINS_PER_ACCT", "MaxNodeRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_LIC_RUN_MINS_PER_ACCT", "MaxLicenseRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_MEM_RUN_MINS_PER_ACCT", "MaxMemoryRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_UNK_RUN_MINS_PER_ACCT", "MaxUnknownRunMinsPerAccount", R24_05, None),
    r("WAIT_QOS_MAX_BB_RUN_MINS_PER_USER", "MaxBBRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_BILLING_RUN_MINS_PER_USER", "MaxBillingRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_CPU_RUN_MINS_PER_USER", "MaxCpuRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_ENERGY_RUN_MINS_PER_USER", "MaxEnergyRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_GRES_RUN_MINS_PER_USER", "MaxGRESRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_NODE_RUN_MINS_PER_USER", "MaxNodeRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_LIC_RUN_MINS_PER_USER", "MaxLicenseRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_MEM_RUN_MINS_PER_USER", "MaxMemoryRunMinsPerUser", R24_05, None),
    r("WAIT_QOS_MAX_UNK_RUN_MINS_PER_USER", "MaxUnknownRunMinsPerUser", R24_05, None),
    r("WAIT_MAX_POWERED_NODES", "MaxPoweredUpNodes", R24_05, None),
    r("WAIT_MPI_PORTS_BUSY", "MpiPortsBusy", R24_05, None),
    r("WAIT_NVIDIA_IMEX_CHANNELS", "NvidiaImexChannels", R25_11, None),
];

/// The reasons of `release`.
pub fn reasons_in(release: Release) -> impl Iterator<Item = &'static Reason> {
    REASONS.iter().filter(move |r| r.exists_in(release))
}

/// The enum names (`WAIT_HELD_USER`) that `release` prints as `printed`
/// (`JobHeldUser`).
pub fn enum_names(printed: &str, release: Release) -> Vec<&'static str> {
    reasons_in(release).filter(|r| r.printed == printed).map(|r| r.name).collect()
}

/// The reason called `name` in `slurm.h`, in any release.
pub fn by_name(name: &str) -> Option<&'static Reason> {
    REASONS.iter().find(|r| r.name == name)
}

/// Text Slurm puts in `Reason=` instead of a reason's string (the job's
/// `state_desc`), and the reason it stands for. A `*` matches any word
/// (a reservation's name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeText {
    /// The text with spaces, `*` for a name: `Reservation * is invalid`.
    pub text: &'static str,
    /// The reason the job has meanwhile: `WAIT_RESV_INVALID`.
    pub reason: &'static str,
    /// The first release that writes it.
    pub since: Release,
    /// Where Slurm writes it (for the words).
    pub topology: bool,
}

const fn t(text: &'static str, reason: &'static str, since: Release, topology: bool) -> FreeText {
    FreeText { text, reason, since, topology }
}

/// The free texts `why` knows. The topology ones are the `ESLURM_TOPO_*`
/// messages of `src/common/slurm_errno.c` (slurm-26-05-0-1 on), which
/// `src/slurmctld/node_scheduler.c` puts in a pending job's `state_desc`
/// with the reason `WAIT_RESOURCES` when a topology plugin (tree, block,
/// ring, torus3d) cannot place it; the others come from
/// `src/slurmctld/reservation.c` (`_validate_job_resv()`, `Reservation %s is
/// invalid`, 23.02.3 on, and `Reservation %s was deleted`) and
/// `src/slurmctld/job_mgr.c` (`job requeued in held state`).
pub const FREE_TEXTS: &[FreeText] = &[
    t("Required nodes lack available resources", "WAIT_RESOURCES", R26_05, true),
    t("Required nodes do not fit topology", "WAIT_RESOURCES", R26_05, true),
    t("No suitable topology unit found for segment", "WAIT_RESOURCES", R26_05, true),
    t("No suitable topology unit found", "WAIT_RESOURCES", R26_05, true),
    t("Insufficient resources in topology unit", "WAIT_RESOURCES", R26_05, true),
    t(
        "Weight-based selection could not satisfy request within topology unit",
        "WAIT_RESOURCES",
        R26_05,
        true,
    ),
    t("Exceeded maximum node limit during topology allocation", "WAIT_RESOURCES", R26_05, true),
    t("No available nodes in topology", "WAIT_RESOURCES", R26_05, true),
    t("Reservation * is invalid", "WAIT_RESV_INVALID", R23_02_3, false),
    t("Reservation * was deleted", "WAIT_RESV_DELETED", R22_05, false),
    t("job requeued in held state", "WAIT_HELD_USER", R22_05, false),
];

impl FreeText {
    /// Whether `reason` (spaces, not underscores) is this text; a `*` stands
    /// for one or more words (a name with underscores reads as several).
    pub fn matches(&self, reason: &str) -> bool {
        fn here(pattern: &[&str], words: &[&str]) -> bool {
            match (pattern.split_first(), words.split_first()) {
                (None, None) => true,
                (Some((&"*", rest)), Some((_, more))) => here(rest, more) || here(pattern, more),
                (Some((p, rest)), Some((w, more))) => p == w && here(rest, more),
                _ => false,
            }
        }
        let pattern: Vec<&str> = self.text.split(' ').collect();
        let words: Vec<&str> = reason.split_whitespace().collect();
        words.len() <= 64 && here(&pattern, &words)
    }
}

/// The free text `reason` is (spaces, not underscores), when `why` knows it.
pub fn free_text(reason: &str) -> Option<&'static FreeText> {
    FREE_TEXTS.iter().find(|f| f.matches(reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::R25_05;

    #[test]
    fn names_are_unique_and_ranges_sane() {
        for (i, a) in REASONS.iter().enumerate() {
            assert!(!REASONS[i + 1..].iter().any(|b| b.name == a.name), "{} twice", a.name);
            assert!(!a.name.starts_with("DEFUNCT") && a.name != "REASON_END", "{}", a.name);
            assert!(a.until.is_none_or(|u| u.series() >= a.since.series()), "{}", a.name);
            assert!(!a.printed.is_empty() && !a.printed.contains([' ', '_', ':']), "{}", a.name);
        }
        for f in FREE_TEXTS {
            assert!(by_name(f.reason).is_some_and(|r| f.since >= r.since), "{}", f.text);
        }
    }

    #[test]
    fn each_release_has_its_own_reasons() {
        let r = |a, b, c| Release::new(a, b, c);
        // Counted in each tag's slurm.h, without DEFUNCT_* and REASON_END.
        let count = |rel| reasons_in(rel).count();
        assert_eq!(count(r(22, 5, 8)), 199);
        assert_eq!((count(r(23, 2, 2)), count(r(23, 2, 8)), count(r(23, 11, 11))), (198, 199, 200));
        assert_eq!((count(R24_05), count(R24_11), count(R25_05)), (218, 218, 217));
        assert_eq!((count(R25_11), count(r(26, 5, 5))), (218, 218));
        assert!(by_name("WAIT_FRONT_END").is_some_and(|x| x.exists_in(r(24, 11, 5)) && !x.exists_in(R25_05)));
        assert!(
            by_name("WAIT_RESV_INVALID").is_some_and(|x| !x.exists_in(r(23, 2, 2)) && x.exists_in(R23_02_3))
        );
        assert!(
            by_name("WAIT_BLOCK_MAX_ERR").is_some_and(|x| x.exists_in(r(22, 5, 11)) && !x.exists_in(R23_02))
        );
        assert_eq!(enum_names("PartitionDown", R26_05), ["WAIT_PART_DOWN", "FAIL_DOWN_PARTITION"]);
        assert_eq!(enum_names("NvidiaImexChannels", R24_11), Vec::<&str>::new());
        assert_eq!(enum_names("NvidiaImexChannels", R25_11), ["WAIT_NVIDIA_IMEX_CHANNELS"]);
        assert_eq!(enum_names("FrontEndDown", R26_05), Vec::<&str>::new());
        assert_eq!(enum_names("RaisedSignal", R23_11), ["FAIL_SIGNAL"]);
    }

    #[test]
    fn free_texts_match_whole_words() {
        assert_eq!(free_text("No suitable topology unit found").map(|f| f.reason), Some("WAIT_RESOURCES"));
        let seg = free_text("No suitable topology unit found for segment").map(|f| f.text);
        assert_eq!(seg, Some("No suitable topology unit found for segment"));
        assert_eq!(free_text("Reservation maint is invalid").map(|f| f.reason), Some("WAIT_RESV_INVALID"));
        assert_eq!(free_text("Reservation is invalid"), None);
        let long = free_text("Reservation maint 2026 06 is invalid").map(|f| f.reason);
        assert_eq!(long, Some("WAIT_RESV_INVALID"));
        assert_eq!(free_text("Reservation maint was deleted").map(|f| f.reason), Some("WAIT_RESV_DELETED"));
        assert_eq!(free_text("No suitable topology"), None);
        assert_eq!(free_text("Resources"), None);
    }
}
