//! The share-out as it was written before it ran class by class
//! ([`super::share_out`]): the oracle the new code is compared with, on
//! generated nodes and on every real topology of the fixtures.

use std::collections::HashMap;

use super::slurm::TaskShare;
use super::{Binding, GpuLocality, TaskGpus, numa_list};
use crate::gputable::GpuTable;
use crate::topology::Topology;
use slurm_formats::cpuset::CpuSet;

/// The CPUs of a set in increasing order, skipping empty words and bits fast
/// (`CpuSet::iter` tests all 64 bits of every word).
fn members(set: &CpuSet) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, word) in (0u32..).zip(set.to_words(0)) {
        let mut bits = word;
        while bits != 0 {
            out.push(w.saturating_mul(64).saturating_add(bits.trailing_zeros()));
            bits &= bits - 1;
        }
    }
    out
}

/// What a task wants, or why it keeps Slurm's mask.
fn wanted(topology: &Topology, task: &TaskGpus) -> Result<CpuSet, String> {
    if task.allowed.is_empty() {
        return Err("Slurm allowed the task no CPUs; nothing to bind".into());
    }
    if task.gpus.is_empty() {
        return Err("no GPU".into());
    }
    let mut gpu_cpus = CpuSet::new();
    let mut gpu_numa: Vec<u32> = Vec::new();
    for gpu in &task.gpus {
        let cpus =
            if gpu.cpus.is_empty() { topology.cpus_of_numa(&gpu.numa_nodes) } else { gpu.cpus.clone() };
        gpu_cpus = gpu_cpus.union(&cpus);
        gpu_numa.extend(&gpu.numa_nodes);
    }
    gpu_numa.sort_unstable();
    gpu_numa.dedup();
    if gpu_cpus.is_empty() {
        return Err(format!(
            "the CPUs near its GPUs are unknown (GPU NUMA nodes: {}); kept Slurm's mask {}",
            numa_list(&gpu_numa),
            task.allowed
        ));
    }
    let want = gpu_cpus.intersection(&task.allowed);
    if want.is_empty() {
        return Err(format!(
            "its GPUs are local to CPUs {gpu_cpus} (NUMA {}) but Slurm allowed only CPUs {}; kept Slurm's mask",
            numa_list(&gpu_numa),
            task.allowed
        ));
    }
    Ok(want)
}

/// Plans the CPUs of every task of a node; one [`Binding`] per task, in the
/// order given. See the module documentation for the rules.
pub(super) fn plan_before(topology: &Topology, tasks: &[TaskGpus]) -> Vec<Binding> {
    let mut out: Vec<Binding> = tasks
        .iter()
        .map(|t| Binding {
            local_id: t.local_id,
            cpus: t.allowed.clone(),
            numa_nodes: Vec::new(),
            note: None,
        })
        .collect();

    // Participants: (task index, wanted CPUs), in local_id order.
    let mut parts: Vec<(usize, CpuSet)> = Vec::new();
    for (i, (task, binding)) in tasks.iter().zip(out.iter_mut()).enumerate() {
        match wanted(topology, task) {
            Ok(want) => parts.push((i, want)),
            Err(note) => binding.note = Some(note),
        }
    }
    parts.sort_by_key(|(i, _)| (tasks.get(*i).map_or(0, |t| t.local_id), *i));

    // Units: the topology's cores that hold a wanted CPU (each PU in at most one
    // unit, even if a hand-made topology repeats it), then lone CPUs.
    let universe = parts.iter().fold(CpuSet::new(), |acc, (_, w)| acc.union(w));
    let mut covered = CpuSet::new();
    let mut units: Vec<Vec<u32>> = Vec::new();
    for core in &topology.cores {
        let pus = members(core);
        if pus.iter().any(|c| universe.contains(*c)) {
            let fresh: Vec<u32> = pus.into_iter().filter(|c| !covered.contains(*c)).collect();
            fresh.iter().for_each(|c| covered.insert(*c));
            if !fresh.is_empty() {
                units.push(fresh);
            }
        }
    }
    units.extend(members(&universe).into_iter().filter(|c| !covered.contains(*c)).map(|c| vec![c]));
    units.sort_by_key(|u| u.first().copied());

    // Regions: units grouped by the participants that want them, in CPU order.
    let mut wanted_units: Vec<Vec<usize>> = vec![Vec::new(); parts.len()];
    let mut region_of: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut regions: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        let wanters: Vec<usize> = parts
            .iter()
            .enumerate()
            .filter(|(_, (_, w))| unit.iter().any(|c| w.contains(*c)))
            .map(|(p, _)| p)
            .collect();
        for p in &wanters {
            if let Some(list) = wanted_units.get_mut(*p) {
                list.push(u);
            }
        }
        let r = *region_of.entry(wanters.clone()).or_insert_with(|| {
            regions.push((wanters, Vec::new()));
            regions.len() - 1
        });
        if let Some((_, list)) = regions.get_mut(r) {
            list.push(u);
        }
    }

    // Even split of each region. Every region's base shares are counted first, then
    // each remainder core goes to the task with the fewest cores overall.
    let mut loads: Vec<usize> = vec![0; parts.len()];
    for (wanters, region_units) in &regions {
        let base = region_units.len().checked_div(wanters.len()).unwrap_or(0);
        for p in wanters {
            if let Some(l) = loads.get_mut(*p) {
                *l += base;
            }
        }
    }
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); parts.len()];
    let mut holders: Vec<usize> = vec![0; units.len()];
    for (wanters, region_units) in &regions {
        let (n, k) = (wanters.len(), region_units.len());
        if n == 0 {
            continue;
        }
        let (base, extra) = (k / n, k % n);
        let mut by_load: Vec<usize> = (0..n).collect();
        by_load.sort_by_key(|j| (wanters.get(*j).and_then(|p| loads.get(*p)).copied().unwrap_or(0), *j));
        let lucky: Vec<usize> = by_load.into_iter().take(extra).collect();
        let mut next = region_units.iter();
        for (j, p) in wanters.iter().enumerate() {
            let bonus = lucky.contains(&j);
            if let (true, Some(l)) = (bonus, loads.get_mut(*p)) {
                *l += 1;
            }
            for u in next.by_ref().take(base + usize::from(bonus)) {
                if let (Some(list), Some(h)) = (assigned.get_mut(*p), holders.get_mut(*u)) {
                    list.push(*u);
                    *h += 1;
                }
            }
        }
    }

    // Tasks left without a core share the least shared one they want.
    for (p, list) in assigned.iter_mut().enumerate() {
        if !list.is_empty() {
            continue;
        }
        let pick = wanted_units
            .get(p)
            .and_then(|ws| ws.iter().copied().min_by_key(|u| (holders.get(*u).copied().unwrap_or(0), *u)));
        if let Some(u) = pick {
            list.push(u);
            if let Some(h) = holders.get_mut(u) {
                *h += 1;
            }
        }
    }

    for ((task_index, want), list) in parts.iter().zip(&assigned) {
        let cpus: CpuSet = list
            .iter()
            .filter_map(|u| units.get(*u))
            .flatten()
            .copied()
            .filter(|c| want.contains(*c))
            .collect();
        if let Some(binding) = out.get_mut(*task_index) {
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

pub(super) fn plan_task_before(
    topology: &Topology,
    table: &GpuTable,
    share: &TaskShare,
    allowed: &CpuSet,
) -> Binding {
    let mut virtual_tasks = Vec::new();
    let mut mine_ids = Vec::new();
    for (g, t) in share.step_gpus.iter().zip(&share.sharers) {
        let locality: Vec<GpuLocality> = table
            .by_index(*g)
            .map(|e| GpuLocality { numa_nodes: e.numa_nodes.clone(), cpus: e.cpus.clone() })
            .into_iter()
            .collect();
        for part in 0..*t {
            let id = u32::try_from(virtual_tasks.len()).unwrap_or(u32::MAX);
            if share.mine.contains(&(*g, part)) {
                mine_ids.push(id);
            }
            virtual_tasks.push(TaskGpus { local_id: id, allowed: allowed.clone(), gpus: locality.clone() });
        }
    }
    let plans = plan_before(topology, &virtual_tasks);
    let mine: Vec<&Binding> = plans.iter().filter(|b| mine_ids.contains(&b.local_id)).collect();
    if let Some(note) = mine.iter().find_map(|b| b.note.clone()) {
        return Binding { local_id: 0, cpus: allowed.clone(), numa_nodes: Vec::new(), note: Some(note) };
    }
    if mine.is_empty() {
        return Binding {
            local_id: 0,
            cpus: allowed.clone(),
            numa_nodes: Vec::new(),
            note: Some("its GPUs are not in the GPU table".into()),
        };
    }
    let cpus = mine.iter().fold(CpuSet::new(), |acc, b| acc.union(&b.cpus));
    let mut numa_nodes: Vec<u32> = mine.iter().flat_map(|b| b.numa_nodes.iter().copied()).collect();
    numa_nodes.sort_unstable();
    numa_nodes.dedup();
    Binding { local_id: 0, cpus, numa_nodes, note: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::{NodeShareOut, TaskShare, plan, plan_task};
    use crate::gputable::GpuEntry;
    use crate::topology::NumaNode;

    /// A small xorshift generator: the same cases on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u32) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            u32::try_from(self.0 % u64::from(n.max(1))).unwrap_or(0)
        }
        fn set(&mut self, of: &CpuSet, keep_in: u32) -> CpuSet {
            of.iter().filter(|_| self.below(keep_in) != 0).collect()
        }
    }

    /// A node of `sockets` NUMA nodes of `cores` cores with `smt` PUs each
    /// (core c's PUs: c, c + all cores, ...), a NUMA node without CPUs, and
    /// sometimes a PU in no core or a core that repeats a PU.
    fn node(rng: &mut Rng) -> Topology {
        let (sockets, cores, smt) = (1 + rng.below(4), 1 + rng.below(12), 1 + rng.below(2));
        let total = sockets * cores;
        let pu = |core: u32, t: u32| core + t * total;
        let mut numa_nodes: Vec<NumaNode> = (0..sockets)
            .map(|s| NumaNode {
                os_index: s,
                cpus: (s * cores..(s + 1) * cores).flat_map(|c| (0..smt).map(move |t| pu(c, t))).collect(),
            })
            .collect();
        numa_nodes.push(NumaNode { os_index: 250, cpus: CpuSet::new() });
        let mut core_sets: Vec<CpuSet> = (0..total).map(|c| (0..smt).map(|t| pu(c, t)).collect()).collect();
        let mut allowed: CpuSet = core_sets.iter().fold(CpuSet::new(), |a, c| a.union(c));
        match rng.below(4) {
            0 => {
                // A lone PU, in no core.
                allowed.insert(total * smt + 3);
                if let Some(n) = numa_nodes.first_mut() {
                    n.cpus.insert(total * smt + 3);
                }
            }
            1 if total > 1 => core_sets.push(core_sets[0].clone()),
            _ => {}
        }
        core_sets.sort_by_key(|c| c.iter().next());
        Topology { numa_nodes, cores: core_sets, gpus: Vec::new(), allowed_cpus: allowed }
    }

    /// A GPU's locality on `t`: a NUMA node's CPUs, a part of them, only its
    /// NUMA node (CPUs to be found), or nothing known.
    fn gpu(rng: &mut Rng, t: &Topology) -> GpuLocality {
        let numa = rng.below(u32::try_from(t.numa_nodes.len()).unwrap_or(1));
        let cpus = t.numa_nodes.get(numa as usize).map(|n| n.cpus.clone()).unwrap_or_default();
        let os = t.numa_nodes.get(numa as usize).map_or(0, |n| n.os_index);
        match rng.below(6) {
            0 => GpuLocality { numa_nodes: vec![os], cpus: CpuSet::new() },
            1 => GpuLocality { numa_nodes: Vec::new(), cpus: CpuSet::new() },
            2 => GpuLocality { numa_nodes: vec![os], cpus: rng.set(&cpus, 2) },
            _ => GpuLocality { numa_nodes: vec![os], cpus },
        }
    }

    fn allowed(rng: &mut Rng, t: &Topology) -> CpuSet {
        match rng.below(5) {
            0 => rng.set(&t.allowed_cpus, 3),
            1 => rng.set(&t.allowed_cpus, 8).intersection(&rng.set(&t.allowed_cpus, 2)),
            _ => t.allowed_cpus.clone(),
        }
    }

    #[test]
    fn plan_gives_what_it_gave_before_on_generated_nodes() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..3000 {
            let t = node(&mut rng);
            let gpus: Vec<GpuLocality> = (0..1 + rng.below(8)).map(|_| gpu(&mut rng, &t)).collect();
            let shared = allowed(&mut rng, &t);
            let tasks: Vec<TaskGpus> = (0..1 + rng.below(40))
                .map(|i| TaskGpus {
                    local_id: if rng.below(5) == 0 { 40 - i } else { i },
                    allowed: if rng.below(4) == 0 { allowed(&mut rng, &t) } else { shared.clone() },
                    gpus: (0..rng.below(3))
                        .filter_map(|_| gpus.get(rng.below(u32::try_from(gpus.len()).unwrap_or(1)) as usize))
                        .cloned()
                        .collect(),
                })
                .collect();
            assert_eq!(plan(&t, &tasks), plan_before(&t, &tasks), "case {case}: {t:?} {tasks:?}");
        }
    }

    /// The table of `t`'s GPUs, Slurm indices in order.
    fn table(gpus: &[GpuLocality]) -> GpuTable {
        let gpus = (0u32..)
            .zip(gpus)
            .map(|(i, g)| GpuEntry {
                slurm_index: i,
                minor: Some(i),
                pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + i).parse().unwrap(),
                uuid: None,
                numa_nodes: g.numa_nodes.clone(),
                cpus: g.cpus.clone(),
                mig_uuids: Vec::new(),
            })
            .collect();
        GpuTable { gpus, machine: None }
    }

    /// Every local task's plan, through [`plan_task`] and the code before,
    /// for `tasks` tasks sharing `step` (the sharing Slurm's variables give);
    /// and through the node's share-out planned once, from the first task's
    /// share, as `user_init` plans it before the fork ([`NodeShareOut`]).
    fn compare_tasks(
        t: &Topology,
        table: &GpuTable,
        step: &[u32],
        all: &[Vec<u32>],
        allowed: &CpuSet,
        what: &str,
    ) {
        let first = TaskShare::new(step.to_vec(), all, 0);
        let node = NodeShareOut::new(t, table, &first.step_gpus, &first.sharers, allowed);
        for me in 0..all.len() {
            let share = TaskShare::new(step.to_vec(), all, u32::try_from(me).unwrap_or(0));
            let before = plan_task_before(t, table, &share, allowed);
            assert_eq!(
                plan_task(t, table, &share, allowed),
                before,
                "{what}: task {me} of {}, {share:?}",
                all.len()
            );
            assert!(node.fits(&share, allowed), "{what}: task {me}: the node's share-out does not fit");
            assert_eq!(
                node.task(t, &share),
                before,
                "{what}: task {me} of {}, from the node's share-out",
                all.len()
            );
        }
    }

    #[test]
    fn plan_task_gives_what_it_gave_before_on_generated_nodes() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for case in 0..600 {
            let t = node(&mut rng);
            let gpus: Vec<GpuLocality> = (0..1 + rng.below(8)).map(|_| gpu(&mut rng, &t)).collect();
            let table = table(&gpus);
            let n = u32::try_from(gpus.len()).unwrap_or(1);
            // The step's GPUs, one maybe not in the table.
            let mut step: Vec<u32> = (0..n).filter(|_| rng.below(4) != 0).collect();
            if rng.below(6) == 0 {
                step.push(n + 2);
            }
            if step.is_empty() {
                step.push(0);
            }
            let tasks = 1 + rng.below(20) as usize;
            let all: Vec<Vec<u32>> = match rng.below(3) {
                // Every task sees every GPU: shares by local rank.
                0 => crate::gputable::task_gpus(&step, &step, 0, u32::try_from(tasks).unwrap_or(1))
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect(),
                // A GPU each, round robin (--ntasks-per-gpu).
                1 => (0..tasks).map(|i| vec![step[i % step.len()]]).collect(),
                // Random subsets.
                _ => {
                    (0..tasks).map(|_| step.iter().copied().filter(|_| rng.below(3) == 0).collect()).collect()
                }
            };
            let allowed = allowed(&mut rng, &t);
            compare_tasks(&t, &table, &step, &all, &allowed, &format!("case {case}"));
        }
    }

    #[test]
    fn plan_task_gives_what_it_gave_before_on_real_topologies() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/topologies");
        let mut compared = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let Ok(xml) = std::fs::read_to_string(&path) else { continue };
            let Ok(machine) = hwloc_xml_oracle::from_hwloc_xml(&xml) else { continue };
            // The oracle's types are the dev-dependency's: through the table's text, as the plugin reads it.
            let gpus: Vec<task_plan::gputable::GpuEntry> = (0u32..)
                .zip(machine.gpus.iter().take(8))
                .map(|(i, g)| task_plan::gputable::GpuEntry {
                    slurm_index: i,
                    minor: Some(i),
                    pci_bus_id: g.bus_id,
                    uuid: None,
                    numa_nodes: g.numa_nodes.clone(),
                    cpus: g.cpus.clone(),
                    mig_uuids: Vec::new(),
                })
                .collect();
            if gpus.is_empty() {
                continue;
            }
            let text = task_plan::gputable::GpuTable { gpus, machine: Some(machine) }.to_text();
            let table = GpuTable::parse(&text).unwrap();
            let t = table.topology().0.into_owned();
            let step: Vec<u32> = (0..u32::try_from(table.gpus.len()).unwrap_or(0)).collect();
            for tasks in [1u32, 2, 3, 7, 8, 16, 64] {
                let all: Vec<Vec<u32>> = crate::gputable::task_gpus(&step, &step, 0, tasks)
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect();
                compare_tasks(&t, &table, &step, &all, &t.allowed_cpus, &path.display().to_string());
                compared += all.len();
            }
        }
        assert!(compared > 1000, "only {compared} cases compared");
    }
}
