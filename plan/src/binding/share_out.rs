//! The share-out behind [`plan`](super::plan) and
//! [`plan_task`](super::plan_task): the node's units (cores, and CPUs in no
//! core) split among the participants that want them, by the rules of the
//! module documentation (regions, even splits, remainders to the least
//! loaded, leftover tasks on the least shared unit).
//!
//! It runs once in every task's `task_init`, in a process just forked from
//! slurmstepd, where each heap page written costs a page fault: so
//! participants that want the same CPUs form one *class* (the tasks that
//! share a GPU), a unit's wanters are found class by class, and memory is
//! allocated per region and per participant, never per unit and wanter.

use crate::topology::Topology;
use slurm_formats::cpuset::CpuSet;

/// How the units were shared out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Shares {
    /// The units' CPUs, unit after unit (each unit's in increasing order).
    pus: Vec<u32>,
    /// Each unit's range in `pus`, units in order of their lowest CPU.
    units: Vec<(usize, usize)>,
    /// For each participant, the units it received.
    assigned: Vec<Vec<usize>>,
}

impl Shares {
    /// Participant `p`'s CPUs: the CPUs of its units that it wants.
    pub(super) fn cpus(&self, p: usize, want: &CpuSet) -> CpuSet {
        let mut cpus = CpuSet::new();
        for &u in self.assigned.get(p).map_or(&[][..], Vec::as_slice) {
            let (start, end) = self.units.get(u).copied().unwrap_or_default();
            for &c in self.pus.get(start..end).unwrap_or_default() {
                if want.contains(c) {
                    cpus.insert(c);
                }
            }
        }
        cpus
    }
}

/// Shares out the node's units. `wants[k]` is what class `k` wants;
/// `parts[p]` is the class of participant `p`, participants in local-id order.
/// Every class has a participant (both callers make a class for one).
pub(super) fn share_out(topology: &Topology, wants: &[CpuSet], parts: &[usize]) -> Shares {
    let universe = wants.iter().fold(CpuSet::new(), |acc, w| acc.union(w));

    // Units: the topology's cores that hold a wanted CPU (each PU in at most one
    // unit, even if a hand-made topology repeats it), then lone CPUs.
    let mut covered = CpuSet::new();
    let mut pus: Vec<u32> = Vec::new();
    let mut units: Vec<(usize, usize)> = Vec::new();
    for core in topology.cores.iter().filter(|core| core.intersects(&universe)) {
        let start = pus.len();
        for c in core.iter() {
            if !covered.contains(c) {
                covered.insert(c);
                pus.push(c);
            }
        }
        if pus.len() > start {
            units.push((start, pus.len()));
        }
    }
    for c in universe.iter() {
        if !covered.contains(c) {
            units.push((pus.len(), pus.len() + 1));
            pus.push(c);
        }
    }
    units.sort_by_key(|(start, _)| pus.get(*start).copied());

    // Regions: units grouped by the classes that want them, in CPU order.
    let mut regions: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    let mut region_of_unit: Vec<usize> = Vec::with_capacity(units.len());
    let mut key: Vec<usize> = Vec::new();
    for (u, (start, end)) in units.iter().enumerate() {
        let unit = pus.get(*start..*end).unwrap_or_default();
        key.clear();
        key.extend(
            wants.iter().enumerate().filter(|(_, w)| unit.iter().any(|c| w.contains(*c))).map(|(k, _)| k),
        );
        let r = regions.iter().position(|(classes, _)| *classes == key).unwrap_or_else(|| {
            regions.push((key.clone(), Vec::new()));
            regions.len() - 1
        });
        if let Some((_, list)) = regions.get_mut(r) {
            list.push(u);
        }
        region_of_unit.push(r);
    }
    // A region's wanters: the participants of its classes, in local-id order.
    let wanters = |classes: &[usize]| -> Vec<usize> {
        parts.iter().enumerate().filter(|(_, k)| classes.contains(k)).map(|(p, _)| p).collect()
    };

    // Even split of each region. Every region's base shares are counted first, then
    // each remainder unit goes to the participant with the fewest units overall.
    let mut loads: Vec<usize> = vec![0; parts.len()];
    let region_wanters: Vec<Vec<usize>> = regions.iter().map(|(classes, _)| wanters(classes)).collect();
    for (who, (_, region_units)) in region_wanters.iter().zip(&regions) {
        let base = region_units.len().checked_div(who.len()).unwrap_or(0);
        for p in who {
            if let Some(l) = loads.get_mut(*p) {
                *l += base;
            }
        }
    }
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); parts.len()];
    let mut holders: Vec<usize> = vec![0; units.len()];
    for (who, (_, region_units)) in region_wanters.iter().zip(&regions) {
        let (n, k) = (who.len(), region_units.len());
        if n == 0 {
            continue;
        }
        let (base, extra) = (k / n, k % n);
        let mut by_load: Vec<usize> = (0..n).collect();
        by_load.sort_by_key(|j| (who.get(*j).and_then(|p| loads.get(*p)).copied().unwrap_or(0), *j));
        let mut lucky = vec![false; n];
        for j in by_load.into_iter().take(extra) {
            if let Some(l) = lucky.get_mut(j) {
                *l = true;
            }
        }
        let mut next = region_units.iter();
        for (p, bonus) in who.iter().zip(lucky) {
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

    // Participants left without a unit share the least shared one they want.
    for (p, list) in assigned.iter_mut().enumerate() {
        if !list.is_empty() {
            continue;
        }
        let class = parts.get(p);
        let pick = region_of_unit
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                regions.get(**r).is_some_and(|(classes, _)| class.is_some_and(|k| classes.contains(k)))
            })
            .map(|(u, _)| u)
            .min_by_key(|u| (holders.get(*u).copied().unwrap_or(0), *u));
        if let Some(u) = pick {
            list.push(u);
            if let Some(h) = holders.get_mut(u) {
                *h += 1;
            }
        }
    }
    Shares { pus, units, assigned }
}
