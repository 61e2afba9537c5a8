//! From what Slurm tells a task to its binding.
//!
//! Slurm describes a task's GPUs and CPUs differently by version and by
//! configuration (what slurmstepd's `exec_task` does before `task_init`,
//! Slurm 22.05 src/slurmd/slurmstepd/task.c):
//!
//! - `setup_env` (src/common/env.c) sets `SLURM_CPU_BIND_TYPE/LIST` from the
//!   step's bind type *after* task/affinity's `lllp_distribution`
//!   (src/plugins/task/affinity/dist_tasks.c) changed it: with task/affinity
//!   every task is bound and the list holds one `mask_cpu` mask per local task,
//!   whether or not the user gave `--cpu-bind`. So whether the user asked for a
//!   binding is read before the tasks fork (the step's environment from srun),
//!   not here.
//! - `gres_g_task_set_env` then rewrites `SLURM_STEP_GPUS` (Slurm indices) and
//!   `CUDA_VISIBLE_DEVICES` per task when the step has a GPU binding
//!   (`--gpus-per-task` implies `gpu:per_task:N`, `--ntasks-per-gpu` implies
//!   `gpu:single:N`; srun's launch.c), visible in `SLURMD_TRES_BIND`. Under
//!   task/cgroup with `ConstrainDevices=yes` `CUDA_VISIBLE_DEVICES` holds local
//!   indices (positions in the step's GPUs; `gres_use_local_device_index`).
//! - With `per_task:N` *and* local indices, every task is told the step's first
//!   N GPUs (`_get_usable_gres` sets bits 0..N-1; the device cgroup does the
//!   real binding), so the task's real GPUs are recomputed: in 22.05 task i
//!   has the i-th block of N (`_filter_gres_per_task`, src/common/gres.c); from
//!   23.11 on (commit "Prefer gres with cpu affinity in gres binding per_task")
//!   each task in local-id order first takes free GPUs close to its CPUs as
//!   Slurm knows them (gres.conf `Cores=`, or AutoDetect), then any free ones
//!   (`_get_gres_per_task`, `_get_closest_usable_gres`, src/interfaces/gres.c).
//! - Under a device constraint the task's device cgroup is the truth
//!   ([`crate::devices`]): the plugin probes it in `task_init` and passes the
//!   task's GPUs as [`SlurmTask::devices`]. Where no probe could tell, the
//!   22.05 rule above is followed; the 23.11+ choice depends on gres.conf
//!   `Cores=`, which the GPU table does not hold, so it is not guessed.

use crate::devices::DeviceView;
use crate::gputable::GpuTable;
use crate::topology::Topology;
use slurm_formats::cpuset::CpuSet;

use super::Binding;

/// The Slurm release from which `per_task` GPU binding prefers GPUs close to
/// the task's CPUs (23.11).
pub const PER_TASK_AFFINITY_SINCE: u32 = (23 << 16) | (11 << 8);

/// What Slurm says about one task and its step on this node.
pub struct SlurmTask<'a> {
    /// `SLURM_LOCALID`.
    pub local_id: u32,
    /// Tasks of the step on this node.
    pub local_tasks: u32,
    /// The step's GPUs on this node (Slurm indices), from the step's
    /// `SLURM_STEP_GPUS` before the tasks fork; `None` when unknown.
    pub step_gpus: Option<Vec<u32>>,
    /// The task's environment as Slurm set it.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The task's CPU mask now (what Slurm bound it to, if it did).
    pub own: CpuSet,
    /// `SLURM_VERSION_NUMBER` of the Slurm that launched the task.
    pub slurm_version: u32,
    /// What the task's device cgroup says about its GPUs ([`crate::devices::view`]).
    pub devices: DeviceView,
}

impl std::fmt::Debug for SlurmTask<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmTask")
            .field("local_id", &self.local_id)
            .field("local_tasks", &self.local_tasks)
            .field("step_gpus", &self.step_gpus)
            .field("own", &self.own)
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

/// A hex CPU mask as Slurm writes them in `SLURM_CPU_BIND_LIST` (`0x3`, `0xF0`).
pub fn parse_hex_mask(text: &str) -> Option<CpuSet> {
    let hex = text.trim().trim_start_matches("0x").trim_start_matches("0X");
    if hex.is_empty() || hex.len() > 4096 {
        return None;
    }
    let mut set = CpuSet::new();
    for (i, c) in (0u32..).zip(hex.chars().rev()) {
        let nibble = c.to_digit(16)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                set.insert(i * 4 + bit);
            }
        }
    }
    Some(set)
}

/// One CPU id of a `map_cpu` list, decimal or `0x` hex (affinity.c `get_cpuset`).
fn parse_map_cpu(text: &str) -> Option<CpuSet> {
    let t = text.trim();
    let cpu = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => t.parse().ok()?,
    };
    // Beyond any kernel's CPU mask: not a CPU id.
    (cpu < 1 << 16).then(|| std::iter::once(cpu).collect())
}

/// The CPU masks task/affinity gave the local tasks, from
/// `SLURM_CPU_BIND_TYPE`/`SLURM_CPU_BIND_LIST` (env.c `setup_env`):
///
/// - `mask_cpu:` with hex masks: what task/affinity makes of its automatic
///   binding and of `--cpu-bind=threads|cores|sockets|ldoms`, and the user's
///   own `--cpu-bind=mask_cpu:`;
/// - `map_cpu:` with one CPU id per task (decimal or `0x` hex): the user's
///   `--cpu-bind=map_cpu:`, which task/affinity keeps as given (dist_tasks.c
///   `lllp_distribution`: an explicit map or mask is validated, not rewritten;
///   srun has already expanded `N*count`).
///
/// Local task `i` has entry `i mod len` (affinity.c `get_cpuset` wraps the
/// task id into the list); see [`task_mask`]. `None` for every other binding
/// (`none`, `rank`, `rank_ldom`, `map_ldom`, `mask_ldom`), whose CPUs depend
/// on what Slurm allocated.
pub fn slurm_task_masks(env: &dyn Fn(&str) -> Option<String>) -> Option<Vec<CpuSet>> {
    let kind = env("SLURM_CPU_BIND_TYPE")?;
    let parse: fn(&str) -> Option<CpuSet> = if kind.contains("mask_cpu") {
        parse_hex_mask
    } else if kind.contains("map_cpu") {
        parse_map_cpu
    } else {
        return None;
    };
    let list = env("SLURM_CPU_BIND_LIST")?;
    let masks: Option<Vec<CpuSet>> = list.split(',').filter(|s| !s.trim().is_empty()).map(parse).collect();
    masks.filter(|m| !m.is_empty())
}

/// Local task `local_id`'s entry of [`slurm_task_masks`]: the list wraps.
pub fn task_mask(masks: &[CpuSet], local_id: u32) -> Option<&CpuSet> {
    masks.get((local_id as usize).checked_rem(masks.len())?)
}

/// The CPUs the step may use on this node, and whether Slurm bound each task
/// to its own part of them: the union of Slurm's per-task masks when this
/// task has its mask from that list, else the task's own mask (task/none,
/// task/cgroup alone: every local task has the same).
pub fn step_cpus(task: &SlurmTask<'_>) -> (CpuSet, bool) {
    match slurm_task_masks(task.env) {
        Some(masks) if task_mask(&masks, task.local_id) == Some(&task.own) => {
            let union = masks.iter().fold(CpuSet::new(), |acc, m| acc.union(m));
            let distinct = masks.iter().any(|m| *m != task.own);
            (union, distinct)
        }
        _ => (task.own.clone(), false),
    }
}

/// Indices of a `CUDA_VISIBLE_DEVICES`-style list: numbers as given, UUIDs
/// through the table (`GPU-...` its own; a MIG device, `MIG-<uuid>` or the
/// legacy `MIG-GPU-<uuid>/<gi>/<ci>`, its parent GPU's). `None` when an entry
/// is neither.
pub fn gpu_indices(list: &str, table: &GpuTable) -> Option<Vec<u32>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().ok().or_else(|| table.by_uuid(s).map(|g| g.slurm_index)))
        .collect()
}

/// The GPU binding Slurm applied per task, from `SLURMD_TRES_BIND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TresBind {
    /// `gpu:per_task:N` (`--gpus-per-task=N`).
    PerTask(usize),
    /// `gpu:single:N` (`--ntasks-per-gpu=N`): N tasks per GPU, GPUs close to the task's CPUs.
    Single(usize),
    /// Another binding (`closest`, `map_gpu`, `mask_gpu`): the peers' GPUs are not derived.
    Other,
}

/// The GPU part of a `SLURMD_TRES_BIND` value: `gpu:per_task:1` (22.05),
/// `gres/gpu:per_task:1` (23.11+), which 23.11+ joins with the other TRES'
/// bindings by `+` (`gres/gpu:per_task:1+gres/nic:closest`, gres.c
/// `_parse_accel_bind_type`); `None` without one.
pub fn gpu_tres_bind(bind: &str) -> Option<&str> {
    bind.split('+')
        .map(str::trim)
        .find_map(|b| b.strip_prefix("gres/gpu:").or_else(|| b.strip_prefix("gpu:")))
}

fn tres_bind(env: &dyn Fn(&str) -> Option<String>) -> Option<TresBind> {
    let bind = env("SLURMD_TRES_BIND")?;
    let gpu = gpu_tres_bind(&bind)?;
    let gpu = gpu.strip_prefix("verbose,").unwrap_or(gpu);
    let count =
        |rest: &str| rest.split([',', ';', ' ']).next()?.trim().parse::<usize>().ok().filter(|n| *n > 0);
    Some(if let Some(rest) = gpu.strip_prefix("per_task:") {
        count(rest).map_or(TresBind::Other, TresBind::PerTask)
    } else if let Some(rest) = gpu.strip_prefix("single:") {
        count(rest).map_or(TresBind::Other, TresBind::Single)
    } else {
        TresBind::Other
    })
}

/// The step GPUs close to `cpus` (by the table), in index order; all of them
/// when none is (as Slurm does when no GPU has affinity to the task).
fn close_to(table: &GpuTable, gpus: &[u32], cpus: &CpuSet) -> Vec<u32> {
    gpus.iter()
        .copied()
        .filter(|g| table.by_index(*g).is_some_and(|e| !e.cpus.intersection(cpus).is_empty()))
        .collect()
}

/// Every local task's GPUs under Slurm's per-task binding, computed as Slurm
/// does (see the section comment); `None` when they cannot be derived.
fn peers_by_rule(
    table: &GpuTable,
    task: &SlurmTask<'_>,
    step: &[u32],
    bind: TresBind,
) -> Option<Vec<Vec<u32>>> {
    let tasks = task.local_tasks.max(1) as usize;
    let masks = slurm_task_masks(task.env);
    match bind {
        TresBind::PerTask(n) if task.slurm_version < PER_TASK_AFFINITY_SINCE || masks.is_none() => {
            Some((0..tasks).map(|i| step.iter().skip(i * n).take(n).copied().collect()).collect())
        }
        TresBind::PerTask(n) => {
            let masks = masks?;
            let mut free: Vec<u32> = step.to_vec();
            let mut out = Vec::new();
            for i in 0..tasks {
                let cpus =
                    u32::try_from(i).ok().and_then(|i| task_mask(&masks, i)).cloned().unwrap_or_default();
                let mut taken: Vec<u32> = close_to(table, &free, &cpus).into_iter().take(n).collect();
                let more: Vec<u32> = free.iter().copied().filter(|g| !taken.contains(g)).collect();
                taken.extend(more.into_iter().take(n - taken.len().min(n)));
                free.retain(|g| !taken.contains(g));
                out.push(taken);
            }
            Some(out)
        }
        TresBind::Single(n) => {
            let masks = masks?;
            (0..tasks)
                .map(|i| {
                    let usable = close_to(table, step, task_mask(&masks, u32::try_from(i).ok()?)?);
                    let usable = if usable.is_empty() { step.to_vec() } else { usable };
                    let pick = (i / n) % usable.len().max(1);
                    Some(vec![*usable.get(pick)?])
                })
                .collect()
        }
        TresBind::Other => None,
    }
}

/// This task's GPUs and how the local tasks share the step's GPUs, from what
/// Slurm told the task and, under a device constraint, what its device
/// cgroup shows ([`SlurmTask::devices`]).
///
/// # Errors
/// The task has no GPU, or Slurm's values do not name GPUs of the step, or
/// (23.11+, no device probe) they are local indices that do not say which.
pub fn task_gpus_from_slurm(table: &GpuTable, task: &SlurmTask<'_>) -> Result<TaskShare, String> {
    let env = task.env;
    let visible_text = env("CUDA_VISIBLE_DEVICES").or_else(|| env("GPU_DEVICE_ORDINAL")).unwrap_or_default();
    let entries: Vec<&str> = visible_text.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let mig = entries.iter().any(|e| crate::gputable::is_mig(e));
    if mig {
        // MIG devices are named by UUID, which local indices never replace.
        let parents = gpu_indices(&visible_text, table).ok_or_else(|| {
            format!(
                "CUDA_VISIBLE_DEVICES={visible_text} names a MIG device that is not in the GPU table; \
                 rewrite the table after changing MIG devices (gpu-node-agent topology --write)"
            )
        })?;
        return Ok(mig_share(task, &parents));
    }
    let told = env("SLURM_STEP_GPUS").and_then(|s| gpu_indices(&s, table)).unwrap_or_default();
    let real = task.devices.constrained();
    let visible = match (real, gpu_indices(&visible_text, table)) {
        (Some([]), _) => {
            return Err("no GPU (its device cgroup lets it reach none of the node's GPUs)".into());
        }
        (Some(real), _) => real.to_vec(),
        (None, Some(v)) if !v.is_empty() => v,
        (None, Some(_)) => return Err("no GPU".into()),
        (None, None) => {
            return Err(format!(
                "CUDA_VISIBLE_DEVICES={visible_text} names a GPU that is not in the GPU table"
            ));
        }
    };
    let mut step: Vec<u32> = match &task.step_gpus {
        Some(s) if !s.is_empty() => s.clone(),
        _ => env("SLURM_JOB_GPUS")
            .and_then(|s| gpu_indices(&s, table))
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| if told.is_empty() { visible.clone() } else { told.clone() }),
    };
    if real.is_some() {
        // The cgroup's GPUs are the step's, whatever the variables said before fork.
        step.extend(&visible);
    }
    step.sort_unstable();
    step.dedup();
    let uuids = visible_text.split(',').any(|s| s.trim().parse::<u32>().is_err());
    let in_step = |l: &[u32]| !l.is_empty() && l.iter().all(|g| step.contains(g));
    let bind = tres_bind(env);
    let peers = bind.and_then(|b| peers_by_rule(table, task, &step, b));
    let me = task.local_id as usize;
    // Under per_task with local indices (ConstrainDevices) every task is told
    // the step's first GPUs; in 22.05 its real ones follow Slurm's block rule.
    // Where the device cgroup shows no constraint, the indices are global.
    let first_n = |n: usize| {
        task.devices == DeviceView::Unknown
            && told == step.iter().take(n).copied().collect::<Vec<_>>()
            && visible == (0..u32::try_from(n).unwrap_or(0)).collect::<Vec<_>>()
    };
    let mut mine: Vec<u32> = match (bind, peers.as_ref().and_then(|p| p.get(me))) {
        _ if real.is_some() => visible.clone(),
        (Some(TresBind::PerTask(n)), _)
            if !uuids && me > 0 && first_n(n) && task.slurm_version >= PER_TASK_AFFINITY_SINCE =>
        {
            return Err(format!(
                "Slurm told this task CUDA_VISIBLE_DEVICES={visible_text} (local indices under \
                 ConstrainDevices, the same in every task) and its device cgroup could not be read; \
                 since 23.11 which GPU each task has depends on gres.conf Cores="
            ));
        }
        (Some(TresBind::PerTask(n)), Some(rule)) if !uuids && me > 0 && first_n(n) => rule.clone(),
        _ if uuids => visible.clone(),
        _ if in_step(&told) => told.clone(),
        _ if in_step(&visible) => visible.clone(),
        _ => visible.iter().filter_map(|p| step.get(*p as usize).copied()).collect(),
    };
    mine.sort_unstable();
    if mine.is_empty() {
        return Err(format!("the task's GPUs ({visible_text}) are not among the step's"));
    }
    let tasks = task.local_tasks.max(1);
    let sees_all = mine == step;
    let (all, peers_known): (Vec<Vec<u32>>, bool) = if sees_all {
        // Every task sees every GPU: they share them by local rank.
        let all = crate::gputable::task_gpus(&step, &step, task.local_id, tasks)
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        (all, true)
    } else {
        match peers {
            // Slurm's rule reproduces what this task has: trust it for the peers.
            Some(mut p) if p.get(me).is_some_and(|r| sorted(r) == mine) => {
                p.iter_mut().for_each(|r| r.sort_unstable());
                (p, true)
            }
            // Peers unknown: each is taken to have GPUs of its own.
            _ => {
                let all = vec![Vec::new(); tasks as usize]
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| if i == me { mine.clone() } else { v })
                    .collect();
                (all, false)
            }
        }
    };
    let part = all.get(me).map(Vec::len).filter(|_| sees_all);
    let mut share = TaskShare::new(step, &all, task.local_id);
    share.peers_known = peers_known;
    share.visible_share = part.and_then(|n| part_of(n, mine.len()));
    Ok(share)
}

/// `n` of the `seen` devices a task sees, when that is a part of them (not
/// none, not all).
fn part_of(n: usize, seen: usize) -> Option<u32> {
    (n > 0 && n < seen).then(|| u32::try_from(n).ok()).flatten()
}

/// "Never make Slurm's binding worse": Slurm's mask is kept when this task
/// may share its GPUs with tasks it cannot see (`--ntasks-per-gpu`, `closest`,
/// `map_gpu`: [`TaskShare::peers_known`] is false and the binding is not
/// `per_task`), Slurm bound the tasks one by one (task/affinity, disjoint
/// masks) and this task's mask is already on CPUs close to its GPUs. Planned
/// alone, such a task would take its GPUs' whole part of their domain, the
/// same CPUs as every other task on those GPUs; Slurm's mask is local and
/// apart from theirs. Under `per_task` each task has GPUs of its own, their
/// parts are disjoint, and the plan only moves a task within its GPUs'
/// domain. The text says why the mask is kept.
pub fn slurm_already_close(table: &GpuTable, share: &TaskShare, task: &SlurmTask<'_>) -> Option<String> {
    let per_task = matches!(tres_bind(task.env), Some(TresBind::PerTask(_)));
    if share.peers_known || per_task || task.own.is_empty() || !step_cpus(task).1 {
        return None;
    }
    let mut near = CpuSet::new();
    for g in share.gpus() {
        let cpus = table.by_index(g).map(|e| e.cpus.clone()).filter(|c| !c.is_empty())?;
        near = near.union(&cpus);
    }
    task.own
        .is_subset(&near)
        .then(|| format!("Slurm already bound it to CPUs {} close to its GPUs", task.own))
}

/// A task's GPUs and CPUs from what Slurm told it: [`task_gpus_from_slurm`],
/// then Slurm's mask where [`slurm_already_close`] keeps it, else
/// [`plan_task`] over the step's CPUs ([`step_cpus`]). The plugin's
/// `task_init` and `spank-gpu explain` both decide through this.
///
/// # Errors
/// As [`task_gpus_from_slurm`]: the task's GPUs cannot be told.
pub fn plan_slurm_task(
    topology: &Topology,
    table: &GpuTable,
    task: &SlurmTask<'_>,
) -> Result<(TaskShare, Binding), String> {
    plan_slurm_task_with(topology, table, task, None)
}

/// [`plan_slurm_task`], with the node's share-out planned before the fork
/// ([`node_share_out`]): used when it fits this task, else the task's own.
///
/// # Errors
/// As [`plan_slurm_task`].
pub fn plan_slurm_task_with(
    topology: &Topology,
    table: &GpuTable,
    task: &SlurmTask<'_>,
    node: Option<&NodeShareOut>,
) -> Result<(TaskShare, Binding), String> {
    let share = task_gpus_from_slurm(table, task)?;
    if let Some(note) = slurm_already_close(table, &share, task) {
        let kept = Binding {
            local_id: task.local_id,
            cpus: task.own.clone(),
            numa_nodes: topology.numa_of_cpus(&task.own),
            note: Some(note),
        };
        return Ok((share, kept));
    }
    let (allowed, _) = step_cpus(task);
    let planned = match node.filter(|n| n.fits(&share, &allowed)) {
        Some(node) => node.task(topology, &share),
        None => plan_task(topology, table, &share, &allowed),
    };
    Ok((share, planned))
}

/// The node's share-out for the step's tasks, planned once before they fork
/// from what the step's environment says there (`template`: local task 0,
/// with slurmstepd's CPU mask): a task whose share and step CPUs turn out
/// the same uses it ([`plan_slurm_task_with`]). `None` when the template's
/// GPUs cannot be told.
pub fn node_share_out(
    topology: &Topology,
    table: &GpuTable,
    template: &SlurmTask<'_>,
) -> Option<NodeShareOut> {
    let share = task_gpus_from_slurm(table, template).ok()?;
    let (allowed, _) = step_cpus(template);
    Some(NodeShareOut::new(topology, table, &share.step_gpus, &share.sharers, &allowed))
}

/// The share of a task whose `CUDA_VISIBLE_DEVICES` names MIG devices,
/// `parents` being the table index of each entry's parent GPU, in order.
///
/// A MIG device binds like its parent GPU. Slurm's GPU indices
/// (`SLURM_STEP_GPUS`, `SLURM_JOB_GPUS`) then count MIG devices, not the
/// table's GPUs, so the step is taken to be the parents of what this task
/// sees. Without a per-task GPU binding every task sees every device of the
/// step, and local task `i` takes the `i`-th even share of the devices (the
/// `set_device(LOCAL_RANK)` convention), so the tasks on one parent split its
/// domain. With one (`--gpus-per-task`, `--ntasks-per-gpu`) the peers' devices
/// are unknown and this task has its parents' domains.
fn mig_share(task: &SlurmTask<'_>, parents: &[u32]) -> TaskShare {
    let step = sorted_unique(parents);
    let tasks = task.local_tasks.max(1);
    let bound = tres_bind(task.env).is_some();
    let mut part = None;
    let all: Vec<Vec<u32>> = if !bound {
        let positions: Vec<u32> = (0..u32::try_from(parents.len()).unwrap_or(u32::MAX)).collect();
        let shares = crate::gputable::task_gpus(&positions, &positions, task.local_id, tasks);
        part = shares.get(task.local_id as usize).and_then(|s| part_of(s.as_ref()?.len(), parents.len()));
        shares
            .into_iter()
            .map(|share| {
                let mine: Vec<u32> = share
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| parents.get(*p as usize).copied())
                    .collect();
                sorted_unique(&mine)
            })
            .collect()
    } else {
        (0..tasks).map(|i| if i == task.local_id { step.clone() } else { Vec::new() }).collect()
    };
    let mut share = TaskShare::new(step, &all, task.local_id);
    share.peers_known = !bound;
    share.visible_share = part;
    share
}

fn sorted_unique(v: &[u32]) -> Vec<u32> {
    let mut v = sorted(v);
    v.dedup();
    v
}

fn sorted(v: &[u32]) -> Vec<u32> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

/// A task's GPUs and how it shares them with the other local tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskShare {
    /// The step's GPUs on this node, in index order.
    pub step_gpus: Vec<u32>,
    /// For every step GPU, how many local tasks use it (parallel to `step_gpus`).
    pub sharers: Vec<u32>,
    /// This task's GPUs, each with its place among the tasks that use it
    /// (in local-id order).
    pub mine: Vec<(u32, u32)>,
    /// Whether the other local tasks' GPUs are known (every task sees every
    /// GPU, or Slurm's rule reproduces this task's), so that the plan covers
    /// the whole node; when not, each task is taken to have GPUs of its own.
    pub peers_known: bool,
    /// When the task sees more devices than its share holds (every local
    /// task sees every GPU, or MIG device, of the step and takes the
    /// `i`-th even share by local rank, the `set_device(LOCAL_RANK)`
    /// convention), how many of the devices it sees (entries of
    /// `CUDA_VISIBLE_DEVICES`, MIG devices counted one by one) its share
    /// holds; `None` when it uses all it sees. A task bound to its share has
    /// one process per device of the share, not per device it sees
    /// (`OMP_NUM_THREADS`, [`crate::rdzv::Task::share_gpus`]).
    pub visible_share: Option<u32>,
}

impl TaskShare {
    /// From every local task's GPUs (`all[i]` for local task `i`).
    pub fn new(step_gpus: Vec<u32>, all: &[Vec<u32>], local_id: u32) -> TaskShare {
        let users = |g: u32, below: usize| all.iter().take(below).filter(|t| t.contains(&g)).count();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let sharers = step_gpus.iter().map(|g| count(users(*g, all.len()).max(1))).collect();
        let me = local_id as usize;
        let mine =
            all.get(me).map(|m| m.iter().map(|g| (*g, count(users(*g, me)))).collect()).unwrap_or_default();
        TaskShare { step_gpus, sharers, mine, peers_known: true, visible_share: None }
    }

    /// This task's GPUs.
    pub fn gpus(&self) -> Vec<u32> {
        self.mine.iter().map(|(g, _)| *g).collect()
    }
}

/// Plans this task's CPUs from its share: every step GPU gets an even part of
/// its domain's step CPUs (in index order), and tasks sharing a GPU split
/// its part in local-id order. Each task computes the same plan for the whole
/// node from its own view, so the tasks' CPUs are disjoint without talking.
/// The node's tasks are the step GPUs' sharers; those of one GPU want the
/// same CPUs, so they are one class of the share-out
/// ([`super::share_out`]), and only this task's CPUs are put together
/// ([`NodeShareOut`]: the node's part, the same in every task).
pub fn plan_task(topology: &Topology, table: &GpuTable, share: &TaskShare, allowed: &CpuSet) -> Binding {
    NodeShareOut::new(topology, table, &share.step_gpus, &share.sharers, allowed).task(topology, share)
}

/// The part of [`plan_task`] that every task of a node computes alike: the
/// node's CPUs shared out among the sharers of the step's GPUs. It depends
/// only on the step's GPUs, their sharers and the CPUs the step may use here,
/// so it can be planned once, before the tasks fork, for the inputs the step
/// predicts; a task whose own inputs are the same ([`NodeShareOut::fits`])
/// takes its CPUs from it ([`NodeShareOut::task`]) and gets exactly what
/// [`plan_task`] would give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeShareOut {
    step_gpus: Vec<u32>,
    sharers: Vec<u32>,
    allowed: CpuSet,
    /// For each step GPU, in order: the class its sharers form and the first
    /// of their participants, or why the GPU cannot be planned.
    gpus: Vec<Result<(usize, usize), String>>,
    /// What each class wants.
    wants: Vec<CpuSet>,
    shares: super::share_out::Shares,
}

impl NodeShareOut {
    /// Shares the node out for these step GPUs (Slurm indices, in index
    /// order), the number of local tasks using each, and the step's CPUs here.
    pub fn new(
        topology: &Topology,
        table: &GpuTable,
        step_gpus: &[u32],
        sharers: &[u32],
        allowed: &CpuSet,
    ) -> Self {
        let mut gpus = Vec::with_capacity(step_gpus.len());
        let mut wants: Vec<CpuSet> = Vec::new();
        let mut parts: Vec<usize> = Vec::new();
        for (g, t) in step_gpus.iter().zip(sharers) {
            let gpu = table.by_index(*g).map(|e| (e.numa_nodes.as_slice(), &e.cpus)).into_iter();
            match super::wanted(topology, gpu, allowed) {
                Ok(want) => {
                    gpus.push(Ok((wants.len(), parts.len())));
                    parts.extend(std::iter::repeat_n(wants.len(), *t as usize));
                    wants.push(want);
                }
                Err(note) => gpus.push(Err(note)),
            }
        }
        let shares = super::share_out::share_out(topology, &wants, &parts);
        NodeShareOut {
            step_gpus: step_gpus.to_vec(),
            sharers: sharers.to_vec(),
            allowed: allowed.clone(),
            gpus,
            wants,
            shares,
        }
    }

    /// Whether this was planned for a task with this share of the step's GPUs
    /// and these step CPUs.
    pub fn fits(&self, share: &TaskShare, allowed: &CpuSet) -> bool {
        self.step_gpus == share.step_gpus && self.sharers == share.sharers && self.allowed == *allowed
    }

    /// The CPUs of the task with `share` (one that [`fits`](Self::fits)):
    /// those of its places among its GPUs' sharers. A GPU of its own that
    /// cannot be planned (the first, in index order) keeps the task's CPUs
    /// with that reason.
    pub fn task(&self, topology: &Topology, share: &TaskShare) -> Binding {
        let kept = |note: String| Binding {
            local_id: 0,
            cpus: self.allowed.clone(),
            numa_nodes: Vec::new(),
            note: Some(note),
        };
        let mut cpus = CpuSet::new();
        let mut any = false;
        let places = self.step_gpus.iter().zip(&self.sharers).zip(&self.gpus);
        for ((g, t), planned) in places {
            let mine = (0..*t).filter(|part| share.mine.contains(&(*g, *part)));
            match planned {
                Err(note) if mine.clone().next().is_some() => return kept(note.clone()),
                Err(_) => {}
                Ok((class, first)) => {
                    for part in mine {
                        any = true;
                        let want = self.wants.get(*class).unwrap_or(&self.allowed);
                        let got = self.shares.cpus(first + part as usize, want);
                        // Never empty; if it were, the participant keeps what it was allowed, as in `plan`.
                        cpus = cpus.union(if got.is_empty() { &self.allowed } else { &got });
                    }
                }
            }
        }
        if !any {
            return kept("its GPUs are not in the GPU table".into());
        }
        let numa_nodes = topology.numa_of_cpus(&cpus);
        Binding { local_id: 0, cpus, numa_nodes, note: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gputable::GpuEntry;

    /// 8 GPUs, 0-3 on CPUs 0-7 and 4-7 on CPUs 8-15; GPU 5 has two MIG devices.
    fn table() -> GpuTable {
        let gpus = (0u32..8)
            .map(|i| GpuEntry {
                slurm_index: i,
                minor: Some(i),
                pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + i).parse().unwrap(),
                uuid: Some(format!("GPU-{i}")),
                numa_nodes: vec![i / 4],
                cpus: CpuSet::parse(if i < 4 { "0-7" } else { "8-15" }).unwrap(),
                mig_uuids: if i == 5 { vec![MIG_A.to_owned(), MIG_B.to_owned()] } else { Vec::new() },
            })
            .collect();
        GpuTable { gpus, machine: None }
    }

    const MIG_A: &str = "MIG-5a000000-0000-0000-0000-000000000005";
    const MIG_B: &str = "MIG-5b000000-0000-0000-0000-000000000005";

    /// Local task `local_id` of `local_tasks` under task/none with this environment.
    fn share(local_id: u32, local_tasks: u32, env: &[(&str, &str)]) -> TaskShare {
        let env: Vec<(String, String)> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let task = SlurmTask {
            local_id,
            local_tasks,
            step_gpus: None,
            env: &lookup,
            own: CpuSet::parse("0-15").unwrap(),
            slurm_version: PER_TASK_AFFINITY_SINCE,
            devices: DeviceView::Unknown,
        };
        task_gpus_from_slurm(&table(), &task).unwrap()
    }

    #[test]
    fn a_task_that_sees_every_gpu_has_its_share_of_them() {
        let all = "0,1,2,3,4,5,6,7";
        let env = [("CUDA_VISIBLE_DEVICES", all), ("SLURM_STEP_GPUS", all)];
        // --ntasks-per-node=8 --gpus-per-node=8: GPU LOCAL_RANK each.
        for local in 0..8 {
            let s = share(local, 8, &env);
            assert_eq!((s.gpus(), s.visible_share), (vec![local], Some(1)), "task {local} of 8");
        }
        // 2 tasks: 4 GPUs each; 16 tasks on 8 GPUs: 1 GPU each.
        let s = share(1, 2, &env);
        assert_eq!((s.gpus(), s.visible_share), (vec![4, 5, 6, 7], Some(4)));
        assert_eq!(share(11, 16, &env).visible_share, Some(1));
        // One task uses every GPU it sees: no share.
        assert_eq!(share(0, 1, &env).visible_share, None);
        // A GPU of its own (--gpus-per-task=1): all it sees.
        let own =
            [("CUDA_VISIBLE_DEVICES", "3"), ("SLURM_STEP_GPUS", "3"), ("SLURMD_TRES_BIND", "gpu:per_task:1")];
        assert_eq!(share(1, 2, &own).visible_share, None);
    }

    /// The share-out planned before the fork serves a task only when the
    /// task's own inputs are the same; otherwise the task plans alone, and
    /// gets what it would get without it.
    #[test]
    fn a_node_share_out_is_used_only_where_it_fits() {
        let all = "0,1,2,3,4,5,6,7";
        let env: Vec<(String, String)> = [("CUDA_VISIBLE_DEVICES", all), ("SLURM_STEP_GPUS", all)]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let topology = table().topology().0.into_owned();
        let task = |local_id, own: &str| SlurmTask {
            local_id,
            local_tasks: 16,
            step_gpus: None,
            env: &lookup,
            own: CpuSet::parse(own).unwrap(),
            slurm_version: PER_TASK_AFFINITY_SINCE,
            devices: DeviceView::Unknown,
        };
        let node = node_share_out(&topology, &table(), &task(0, "0-15")).unwrap();
        for local_id in 0..16 {
            let t = task(local_id, "0-15");
            let alone = plan_slurm_task(&topology, &table(), &t).unwrap();
            let share = task_gpus_from_slurm(&table(), &t).unwrap();
            assert!(node.fits(&share, &CpuSet::parse("0-15").unwrap()));
            assert_eq!(plan_slurm_task_with(&topology, &table(), &t, Some(&node)).unwrap(), alone);
        }
        // Another mask (a cgroup that gives the step only the other socket's
        // CPUs): planned alone, so Slurm's mask is kept with the reason, where
        // the node's share-out would have bound the task to CPUs it may not use.
        let t = task(3, "8-15");
        let share = task_gpus_from_slurm(&table(), &t).unwrap();
        assert!(!node.fits(&share, &CpuSet::parse("8-15").unwrap()));
        let with = plan_slurm_task_with(&topology, &table(), &t, Some(&node)).unwrap();
        assert_eq!(with, plan_slurm_task(&topology, &table(), &t).unwrap());
        assert!(with.1.note.is_some(), "{with:?}");
        assert_eq!(node.task(&topology, &share).cpus, CpuSet::parse("0-7").unwrap());
        // Other sharers (8 tasks, not 16): planned alone.
        let eight = SlurmTask { local_tasks: 8, ..task(3, "0-15") };
        let share = task_gpus_from_slurm(&table(), &eight).unwrap();
        assert!(!node.fits(&share, &CpuSet::parse("0-15").unwrap()));
        let with = plan_slurm_task_with(&topology, &table(), &eight, Some(&node)).unwrap();
        assert_eq!(with, plan_slurm_task(&topology, &table(), &eight).unwrap());
    }

    #[test]
    fn mig_devices_are_counted_one_by_one() {
        // Both tasks see both MIG devices of GPU 5: one device each (one parent GPU).
        let both = format!("{MIG_A},{MIG_B}");
        let env = [("CUDA_VISIBLE_DEVICES", both.as_str()), ("SLURM_STEP_GPUS", "0,1")];
        let s = share(1, 2, &env);
        assert_eq!((s.gpus(), s.visible_share), (vec![5], Some(1)));
        // One task on both: it uses both, though they are one GPU of the table.
        assert_eq!(share(0, 1, &env).visible_share, None);
        // A device per task: all it sees.
        let own = [
            ("CUDA_VISIBLE_DEVICES", MIG_B),
            ("SLURM_STEP_GPUS", "1"),
            ("SLURMD_TRES_BIND", "gpu:per_task:1"),
        ];
        assert_eq!(share(1, 2, &own).visible_share, None);
    }
}
