//! GPU-aware CPU binding: which CPUs each task of a node should run on.
//!
//! A task on the wrong socket for its GPU pays for every host↔GPU copy with a
//! trip across the socket interconnect. [`plan`] narrows each task's CPU
//! affinity to the cores closest to its GPUs, sharing those cores fairly with
//! the other tasks of the node that use the same GPUs' neighbourhood.
//!
//! # Inputs
//!
//! * a [`Topology`] of the node (cores, NUMA nodes), from [`crate::topology`];
//! * per task a [`TaskGpus`]: its node-local id, its current affinity (what
//!   Slurm allowed: `sched_getaffinity` of the task), and the locality of each
//!   GPU it sees ([`GpuLocality`], from the topology or from NVML).
//!
//! # Rules
//!
//! 1. **The wanted CPUs** of a task are the union of its GPUs' local CPU sets,
//!    intersected with its allowed set. A GPU whose CPU set is unknown (empty)
//!    stands for the CPUs of its NUMA nodes. A task with GPUs on several NUMA
//!    domains thus wants all of them.
//! 2. **Whole cores.** CPUs are handed out by core: the SMT siblings of a core
//!    always go to the same task. A core counts as one unit as soon as *one*
//!    of its PUs is wanted, and the unit a task receives is the core's PUs that
//!    the task may use (wanted ∩ allowed). So when Slurm gave the job only one
//!    hardware thread of some cores (a shared node, `--hint=nomultithread`, or
//!    a mask with one PU per core), those half cores are still whole units:
//!    never split between tasks, counted as one core each. CPUs that are in no
//!    core of the topology are units of their own.
//! 3. **Fair, disjoint shares.** Cores are grouped into *regions* by the set of
//!    tasks that want them. Tasks whose GPUs sit in the same NUMA domain(s),
//!    with the same allowed set, want the same cores: together these form one
//!    region, and its cores are split evenly into contiguous blocks in
//!    `local_id` order (2 tasks on a 28-core domain get 14 cores each; with
//!    29 cores the first gets 15). When the wanted sets only overlap (one task
//!    has GPUs on domains A and B, another only on A), each region is split
//!    among the tasks that want it, so the shares stay disjoint: the first task
//!    gets its part of A plus all of B. A region's remainder cores go to the
//!    tasks with the fewest cores overall (counting their even shares of every
//!    region first; ties: lower `local_id`), so remainders even out across
//!    regions.
//! 4. **More tasks than cores.** When a region has fewer cores than tasks,
//!    the first tasks get one core each and every task still without a core
//!    then shares one: the least shared core it wants (ties: the lowest
//!    CPU). So 8 tasks on 2 cores get cores 0,1,0,1,... Sharing is not an
//!    error and carries no note.
//! 5. **Only narrows.** The result is always a non-empty subset of the task's
//!    allowed set (unless that is empty). When the wanted set is empty (the
//!    GPUs are local only to CPUs Slurm did not give the task, the task has no
//!    GPU, or the GPUs' locality is unknown), the task keeps its allowed set
//!    and [`Binding::note`] says why.
//! 6. **GPUs untouched.** Only CPUs are planned; which GPUs a task sees is not
//!    this module's business.
//!
//! Tasks that Slurm already gave disjoint masks (`--cpu-bind=cores` with
//! `--cpus-per-task`) want disjoint cores and are each narrowed on their own.
//!
//! [`Binding::numa_nodes`] are the NUMA nodes with CPUs in the result: the
//! nodes to prefer for the task's memory. They come from the topology's full
//! NUMA list; a caller that binds memory intersects them with the memory
//! nodes the job may use (`Mems_allowed`).
//!
//! The work is bounded by (cores + CPUs) × tasks; planning 8 tasks on a
//! 224-thread node takes microseconds.

use crate::topology::{PciGpu, Topology};
use slurm_formats::cpuset::CpuSet;

/// Where one GPU sits: the CPUs and NUMA nodes closest to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuLocality {
    /// The NUMA nodes (OS numbers) local to the GPU.
    pub numa_nodes: Vec<u32>,
    /// The CPUs local to the GPU; when empty, the CPUs of `numa_nodes` are used.
    pub cpus: CpuSet,
}

impl From<&PciGpu> for GpuLocality {
    fn from(gpu: &PciGpu) -> GpuLocality {
        GpuLocality { numa_nodes: gpu.numa_nodes.clone(), cpus: gpu.cpus.clone() }
    }
}

/// One task of the node, as the plan sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskGpus {
    /// The task's node-local id (`SLURM_LOCALID`): the order in which shares are handed out.
    pub local_id: u32,
    /// The task's current affinity: the CPUs Slurm allowed it.
    pub allowed: CpuSet,
    /// The locality of each GPU the task sees.
    pub gpus: Vec<GpuLocality>,
}

/// The plan for one task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    /// The task's node-local id, as given.
    pub local_id: u32,
    /// The CPUs to bind the task to: a non-empty subset of its allowed set
    /// (empty only when the allowed set is).
    pub cpus: CpuSet,
    /// The NUMA nodes (OS numbers) with CPUs in `cpus`, sorted.
    pub numa_nodes: Vec<u32>,
    /// Why Slurm's mask was kept unchanged; `None` when the task was narrowed.
    pub note: Option<String>,
}

fn numa_list(nodes: &[u32]) -> String {
    if nodes.is_empty() {
        return "none".into();
    }
    nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// What a task with these GPUs (each its NUMA nodes and local CPUs) wants
/// of `allowed`, or why it keeps Slurm's mask.
fn wanted<'a>(
    topology: &Topology,
    gpus: impl Iterator<Item = (&'a [u32], &'a CpuSet)>,
    allowed: &CpuSet,
) -> Result<CpuSet, String> {
    if allowed.is_empty() {
        return Err("Slurm allowed the task no CPUs; nothing to bind".into());
    }
    let mut any = false;
    let mut gpu_cpus = CpuSet::new();
    let mut gpu_numa: Vec<u32> = Vec::new();
    for (numa_nodes, cpus) in gpus {
        any = true;
        gpu_cpus = if cpus.is_empty() {
            gpu_cpus.union(&topology.cpus_of_numa(numa_nodes))
        } else {
            gpu_cpus.union(cpus)
        };
        gpu_numa.extend(numa_nodes);
    }
    if !any {
        return Err("no GPU".into());
    }
    gpu_numa.sort_unstable();
    gpu_numa.dedup();
    if gpu_cpus.is_empty() {
        return Err(format!(
            "the CPUs near its GPUs are unknown (GPU NUMA nodes: {}); kept Slurm's mask {}",
            numa_list(&gpu_numa),
            allowed
        ));
    }
    let want = gpu_cpus.intersection(allowed);
    if want.is_empty() {
        return Err(format!(
            "its GPUs are local to CPUs {gpu_cpus} (NUMA {}) but Slurm allowed only CPUs {}; kept Slurm's mask",
            numa_list(&gpu_numa),
            allowed
        ));
    }
    Ok(want)
}

/// Plans the CPUs of every task of a node; one [`Binding`] per task, in the
/// order given. See the module documentation for the rules.
pub fn plan(topology: &Topology, tasks: &[TaskGpus]) -> Vec<Binding> {
    let mut out: Vec<Binding> = tasks
        .iter()
        .map(|t| Binding {
            local_id: t.local_id,
            cpus: t.allowed.clone(),
            numa_nodes: Vec::new(),
            note: None,
        })
        .collect();

    // Participants: (local_id, task index, class), tasks that want the same CPUs in one class.
    let mut wants: Vec<CpuSet> = Vec::new();
    let mut parts: Vec<(u32, usize, usize)> = Vec::new();
    for (i, (task, binding)) in tasks.iter().zip(out.iter_mut()).enumerate() {
        let gpus = task.gpus.iter().map(|g| (g.numa_nodes.as_slice(), &g.cpus));
        match wanted(topology, gpus, &task.allowed) {
            Ok(want) => {
                let class = wants.iter().position(|w| *w == want).unwrap_or_else(|| {
                    wants.push(want);
                    wants.len() - 1
                });
                parts.push((task.local_id, i, class));
            }
            Err(note) => binding.note = Some(note),
        }
    }
    parts.sort_by_key(|(local_id, i, _)| (*local_id, *i));
    let classes: Vec<usize> = parts.iter().map(|(_, _, k)| *k).collect();
    let shares = share_out::share_out(topology, &wants, &classes);
    for (p, (_, i, class)) in parts.iter().enumerate() {
        let cpus = wants.get(*class).map(|want| shares.cpus(p, want)).unwrap_or_default();
        if let Some(binding) = out.get_mut(*i) {
            // Never empty: every participant got at least one unit that meets its wanted set.
            if !cpus.is_empty() {
                binding.cpus = cpus;
            }
        }
    }
    for binding in &mut out {
        binding.numa_nodes = topology.numa_of_cpus(&binding.cpus);
    }
    out
}

mod share_out;

#[cfg(test)]
mod oracle;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NumaNode;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse(list).unwrap()
    }

    /// Whether two sets share a CPU.
    fn meets(a: &CpuSet, b: &CpuSet) -> bool {
        !a.intersection(b).is_empty()
    }

    /// Two sockets = two NUMA nodes (0 and 8), 4 cores each, 2 PUs per core:
    /// core c has PUs c and c+8.
    fn smt_node() -> Topology {
        Topology {
            numa_nodes: vec![
                NumaNode { os_index: 0, cpus: set("0-3,8-11") },
                NumaNode { os_index: 8, cpus: set("4-7,12-15") },
                NumaNode { os_index: 252, cpus: CpuSet::new() },
            ],
            cores: (0..8).map(|c| [c, c + 8].into_iter().collect()).collect(),
            gpus: Vec::new(),
            allowed_cpus: set("0-15"),
        }
    }

    fn gpu0() -> GpuLocality {
        GpuLocality { numa_nodes: vec![0], cpus: set("0-3,8-11") }
    }
    fn gpu1() -> GpuLocality {
        GpuLocality { numa_nodes: vec![8], cpus: set("4-7,12-15") }
    }

    fn task(local_id: u32, allowed: &str, gpus: Vec<GpuLocality>) -> TaskGpus {
        TaskGpus { local_id, allowed: set(allowed), gpus }
    }

    fn cpus(plan: &[Binding]) -> Vec<String> {
        plan.iter().map(|b| b.cpus.to_string()).collect()
    }

    #[test]
    fn sets_meet_when_they_share_a_cpu() {
        assert_eq!(set("0,63-65,200").iter().collect::<Vec<_>>(), [0, 63, 64, 65, 200]);
        assert!(CpuSet::new().iter().next().is_none());
        assert!(meets(&set("3,70"), &set("70")) && !meets(&set("3"), &set("4")));
        assert!(set("3,70").intersects(&set("70")) && !set("3").intersects(&set("4")));
    }

    #[test]
    fn one_task_per_domain_gets_the_domain() {
        let t = smt_node();
        let p = plan(&t, &[task(0, "0-15", vec![gpu0()]), task(1, "0-15", vec![gpu1()])]);
        assert_eq!(cpus(&p), ["0-3,8-11", "4-7,12-15"]);
        assert_eq!(p.iter().map(|b| b.numa_nodes.clone()).collect::<Vec<_>>(), [vec![0], vec![8]]);
        assert!(p.iter().all(|b| b.note.is_none()));
    }

    #[test]
    fn tasks_sharing_a_domain_split_it_in_whole_cores() {
        let t = smt_node();
        let two = plan(&t, &[task(0, "0-15", vec![gpu0()]), task(1, "0-15", vec![gpu0()])]);
        assert_eq!(cpus(&two), ["0-1,8-9", "2-3,10-11"]);
        let three: Vec<_> = (0..3).map(|i| task(i, "0-15", vec![gpu0()])).collect();
        assert_eq!(cpus(&plan(&t, &three)), ["0-1,8-9", "2,10", "3,11"], "the first gets the extra core");
    }

    #[test]
    fn shares_follow_local_id_not_input_order() {
        let t = smt_node();
        let p = plan(&t, &[task(1, "0-15", vec![gpu0()]), task(0, "0-15", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["2-3,10-11", "0-1,8-9"]);
        assert_eq!(p.iter().map(|b| b.local_id).collect::<Vec<_>>(), [1, 0]);
    }

    #[test]
    fn more_tasks_than_cores_share_round_robin() {
        let t = smt_node();
        let tasks: Vec<_> = (0..10).map(|i| task(i, "0-15", vec![gpu0()])).collect();
        let p = plan(&t, &tasks);
        assert_eq!(
            cpus(&p),
            ["0,8", "1,9", "2,10", "3,11", "0,8", "1,9", "2,10", "3,11", "0,8", "1,9"],
            "each task one whole core, cores shared by at most ceil(10/4) tasks"
        );
        assert!(p.iter().all(|b| b.note.is_none()));
    }

    #[test]
    fn a_task_with_gpus_on_two_domains_gets_both() {
        let t = smt_node();
        let p = plan(&t, &[task(0, "0-15", vec![gpu0(), gpu1()])]);
        assert_eq!(cpus(&p), ["0-15"]);
        assert_eq!(p[0].numa_nodes, [0, 8]);
    }

    #[test]
    fn overlapping_domain_sets_stay_disjoint() {
        let t = smt_node();
        // Task 0 has GPUs on both domains, task 1 only on domain 0.
        let p = plan(&t, &[task(0, "0-15", vec![gpu0(), gpu1()]), task(1, "0-15", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["0-1,4-9,12-15", "2-3,10-11"]);
        // Task 1 may use cores 0-2 only: those 3 are split 1 + 2, the remainder going
        // to task 1, which has fewer cores overall (task 0 also has cores 3-7).
        let p = plan(&t, &[task(0, "0-15", vec![gpu1(), gpu0()]), task(1, "0-2,8-10", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["0,3-8,11-15", "1-2,9-10"]);
    }

    #[test]
    fn partially_allowed_cores_stay_whole_units() {
        let t = smt_node();
        // Cores 0 and 1 with both threads, cores 2 and 3 with one thread each.
        let p = plan(&t, &[task(0, "0-3,8-9", vec![gpu0()]), task(1, "0-3,8-9", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["0-1,8-9", "2-3"]);
        // One PU per core (SMT off by mask): counts are per core, PUs follow.
        let p = plan(&t, &[task(0, "0-7", vec![gpu0()]), task(1, "0-7", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["0-1", "2-3"]);
    }

    #[test]
    fn tasks_with_their_own_masks_are_narrowed_on_their_own() {
        let t = smt_node();
        let p = plan(&t, &[task(0, "0-1,4-5", vec![gpu0()]), task(1, "2-3,6-7", vec![gpu1()])]);
        assert_eq!(cpus(&p), ["0-1", "6-7"]);
    }

    #[test]
    fn no_gpu_no_cpus_and_no_overlap_keep_slurms_mask() {
        let t = smt_node();
        let p = plan(
            &t,
            &[
                task(0, "0-3", vec![]),
                task(1, "", vec![gpu0()]),
                task(2, "4-7", vec![gpu0()]),
                task(3, "4-5", vec![GpuLocality::default()]),
            ],
        );
        assert_eq!(cpus(&p), ["0-3", "", "4-7", "4-5"]);
        assert_eq!(p[0].note.as_deref(), Some("no GPU"));
        assert!(p[1].note.as_deref().unwrap().contains("no CPUs"));
        let note = p[2].note.as_deref().unwrap();
        assert!(note.contains("0-3,8-11") && note.contains("4-7") && note.contains("NUMA 0"), "{note}");
        assert!(p[3].note.as_deref().unwrap().contains("unknown"));
        assert_eq!(p[2].numa_nodes, [8], "NUMA nodes of the kept mask");
    }

    #[test]
    fn gpu_cpus_unknown_falls_back_to_its_numa_nodes() {
        let t = smt_node();
        let g = GpuLocality { numa_nodes: vec![8], cpus: CpuSet::new() };
        let p = plan(&t, &[task(0, "0-15", vec![g])]);
        assert_eq!(cpus(&p), ["4-7,12-15"]);
        assert!(p[0].note.is_none());
    }

    #[test]
    fn cpus_outside_any_core_are_units_of_their_own() {
        let t = Topology { cores: Vec::new(), ..smt_node() };
        let p = plan(&t, &[task(0, "0-15", vec![gpu0()]), task(1, "0-15", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["0-3", "8-11"]);
    }

    #[test]
    fn empty_input_gives_empty_plan() {
        assert!(plan(&smt_node(), &[]).is_empty());
        assert!(plan(&Topology::default(), &[]).is_empty());
        let p = plan(&Topology::default(), &[task(0, "0-3", vec![gpu0()])]);
        assert_eq!(cpus(&p), ["0-3"], "an empty topology still narrows by GPU CPUs");
    }

    /// Invariants over many generated cases: a subset of allowed, never empty,
    /// whole cores within the wanted set, disjoint whenever there are enough cores.
    #[test]
    fn invariants_hold_for_generated_cases() {
        let t = smt_node();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |m: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % m
        };
        for _ in 0..3000 {
            let shared_allowed: CpuSet = (0..16).filter(|_| next(4) != 0).collect();
            let ntasks = 1 + next(6);
            let tasks: Vec<TaskGpus> = (0..ntasks)
                .map(|i| {
                    let gpus = match next(5) {
                        0 => vec![],
                        1 | 2 => vec![gpu0()],
                        3 => vec![gpu1()],
                        _ => vec![gpu0(), gpu1()],
                    };
                    let allowed = if next(3) == 0 {
                        (0..16).filter(|_| next(2) == 0).collect()
                    } else {
                        shared_allowed.clone()
                    };
                    TaskGpus { local_id: u32::try_from(i).unwrap(), allowed, gpus }
                })
                .collect();
            let p = plan(&t, &tasks);
            assert_eq!(p.len(), tasks.len());
            for (b, task) in p.iter().zip(&tasks) {
                assert_eq!(b.local_id, task.local_id);
                assert!(b.cpus.is_subset(&task.allowed), "{b:?} not within {task:?}");
                assert_eq!(b.cpus.is_empty(), task.allowed.is_empty());
                if b.note.is_none() {
                    let near = task.gpus.iter().fold(CpuSet::new(), |a, g| a.union(&g.cpus));
                    assert!(b.cpus.is_subset(&near), "{b:?} outside its GPUs' CPUs");
                    // Whole cores: every PU of a touched core that the task may use is there.
                    for core in &t.cores {
                        if meets(core, &b.cpus) {
                            assert!(core.intersection(&task.allowed).intersection(&near).is_subset(&b.cpus));
                        }
                    }
                } else {
                    assert_eq!(b.cpus, task.allowed);
                }
            }
            // Disjoint when no task had to share: one mask for all, and at least as many
            // allowed cores in each domain as narrowed tasks.
            let narrowed: Vec<&Binding> = p.iter().filter(|b| b.note.is_none()).collect();
            let cores_in =
                |d: &CpuSet| t.cores.iter().filter(|c| meets(c, &d.intersection(&shared_allowed))).count();
            let room = cores_in(&gpu0().cpus).min(cores_in(&gpu1().cpus));
            if tasks.iter().all(|t| t.allowed == shared_allowed) && narrowed.len() <= room {
                for (i, a) in narrowed.iter().enumerate() {
                    for b in narrowed.iter().skip(i + 1) {
                        assert!(a.cpus.intersection(&b.cpus).is_empty(), "{a:?} overlaps {b:?}");
                    }
                }
            }
        }
    }
}

mod slurm;

pub use slurm::*;
