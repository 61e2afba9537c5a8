//! The plugin's record of what it set, in the task's environment
//! (`SPANK_GPU_SET`): which variables it computes, one item per variable it
//! set (the name and a short hash of its value), the step's CPUs per task,
//! the task's GPU share, the CPUs it was bound to and the step's port word:
//! what `spank-gpu explain` in the task cannot read elsewhere; and whether a value a task inherits was the user's
//! or the plugin's own, set for an enclosing step.

/// The variable in which the plugin records what it set.
pub const RECORD_VAR: &str = "SPANK_GPU_SET";

/// The record's item that keeps the step's CPUs per task.
pub(crate) const RECORD_CPUS_PER_TASK: &str = "cpus_per_task=";

/// The step's CPUs per task kept in a record of [`RECORD_VAR`].
pub fn recorded_cpus_per_task(record: &str) -> Option<u32> {
    record.split(',').find_map(|item| item.strip_prefix(RECORD_CPUS_PER_TASK)?.parse().ok())
}

/// The record's item that says `--gpu-affinity` bound the task to a share
/// of the GPUs it sees, and how many GPUs that share has ([`Task::share_gpus`]).
pub(crate) const RECORD_GPU_SHARE: &str = "gpu_share=";

/// The GPUs of the share the plugin bound the task to, kept in a record of
/// [`RECORD_VAR`] (`None`: the plugin did not bind it to a share).
pub fn recorded_gpu_share(record: &str) -> Option<u32> {
    record.split(',').find_map(|item| item.strip_prefix(RECORD_GPU_SHARE)?.parse().ok()).filter(|n| *n > 0)
}

/// The record's item that keeps the CPUs of the task's own mask, as the
/// plan counted them ([`Task::bound_cpus`](crate::rdzv::Task::bound_cpus)).
pub(crate) const RECORD_BOUND_CPUS: &str = "bound_cpus=";

/// The CPUs of the task's own mask as the plugin counted them, kept in a
/// record of [`RECORD_VAR`] (`None`: the task shared the step's CPUs, or an
/// older plugin wrote the record).
pub fn recorded_bound_cpus(record: &str) -> Option<u32> {
    record.split(',').find_map(|item| item.strip_prefix(RECORD_BOUND_CPUS)?.parse().ok()).filter(|n| *n > 0)
}

/// The record's item that keeps the step's `--auto-rdzv=port=N`.
pub(crate) const RECORD_PORT_WORD: &str = "port_word=";

/// The step's `--auto-rdzv=port=N`, kept in a record of [`RECORD_VAR`]:
/// the task's environment does not say it.
pub fn recorded_port_word(record: &str) -> Option<u16> {
    record.split(',').find_map(|item| item.strip_prefix(RECORD_PORT_WORD)?.parse().ok())
}

/// Every variable the plugin computes per task (`rdzv::plan_task` and
/// [`RECORD_VAR`]): none can be a site default. A test (`rdzv/tests.rs`)
/// checks this list against what `plan_task` sets.
pub const COMPUTED_VARS: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NPROC_PER_NODE",
    "OMP_NUM_THREADS",
    // The launchers' names for the same rendezvous point (crate::launcher::VARS).
    "PET_RDZV_ENDPOINT",
    "PET_RDZV_ID",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_PORT",
    RECORD_VAR,
];

/// The record's item for `name` set to `value`.
pub fn record_item(name: &str, value: &str) -> String {
    format!("{name}:{:04x}", short_hash(value))
}

/// A 16-bit FNV-1a hash, for the record of what the plugin set.
fn short_hash(value: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in value.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    // Fold to 16 bits; the truncation is the point.
    #[allow(clippy::cast_possible_truncation)]
    let folded = ((h >> 16) ^ (h & 0xffff)) as u16;
    folded
}

/// Whether `current` (the task's value of `name`) was set by the user, given
/// the plugin's record from an enclosing step.
pub fn user_set(name: &str, current: &str, record: Option<&str>) -> bool {
    let Some(record) = record else { return true };
    let mine = record.split(',').find_map(|item| {
        let (n, h) = item.split_once(':')?;
        (n == name).then(|| u16::from_str_radix(h, 16).ok()).flatten()
    });
    mine != Some(short_hash(current))
}
