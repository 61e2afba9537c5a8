//! The user's own `--cpu-bind` lists as task/affinity applies them, and what
//! `--gpu-affinity=force` makes of them.
//!
//! task/affinity keeps an explicit `map_cpu:`/`mask_cpu:` list as srun sent
//! it (dist_tasks.c `lllp_distribution`), `setup_env` exports it as
//! `SLURM_CPU_BIND_TYPE=map_cpu:` and `SLURM_CPU_BIND_LIST=0,1`, and local task
//! `i` is bound to entry `i mod len` (affinity.c `get_cpuset`). "The step's
//! CPUs" that `force` re-plans over are the union of those entries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hwloc_xml_oracle::from_hwloc_xml;
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{self, SlurmTask};
use task_plan::gputable::{GpuEntry, GpuTable};
use task_plan::topology::{Topology, synthetic_xml};

const V22_05: u32 = (22 << 16) | (5 << 8) | 8;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn step_cpus(pairs: &[(&str, &str)], local_id: u32, local_tasks: u32, own: &str) -> (CpuSet, bool) {
    let env = env(pairs);
    let lookup = |k: &str| env.get(k).cloned();
    let task = SlurmTask {
        local_id,
        local_tasks,
        step_gpus: None,
        env: &lookup,
        own: set(own),
        slurm_version: V22_05,
        devices: task_plan::devices::DeviceView::Unknown,
    };
    binding::step_cpus(&task)
}

#[test]
fn map_cpu_lists_are_the_tasks_masks() {
    let map = [("SLURM_CPU_BIND_TYPE", "map_cpu:"), ("SLURM_CPU_BIND_LIST", "0,1")];
    assert_eq!(step_cpus(&map, 0, 2, "0"), (set("0-1"), true));
    assert_eq!(step_cpus(&map, 1, 2, "1"), (set("0-1"), true));
    // Hex ids, as get_cpuset reads them.
    let hex = [("SLURM_CPU_BIND_TYPE", "map_cpu:"), ("SLURM_CPU_BIND_LIST", "0x2,0xa")];
    assert_eq!(step_cpus(&hex, 1, 2, "10"), (set("2,10"), true));
    // More tasks than entries: the list wraps (task 2 has entry 0).
    assert_eq!(step_cpus(&map, 2, 3, "0"), (set("0-1"), true));
    // A task whose mask is not its entry (task/none: nobody applied the list)
    // keeps its own mask as the step's CPUs.
    assert_eq!(step_cpus(&map, 0, 2, "0-7"), (set("0-7"), false));
    // mask_cpu lists wrap too.
    let mask = [("SLURM_CPU_BIND_TYPE", "mask_cpu:"), ("SLURM_CPU_BIND_LIST", "0x3")];
    assert_eq!(step_cpus(&mask, 1, 2, "0-1"), (set("0-1"), false));
}

#[test]
fn bindings_that_depend_on_the_allocation_are_not_read() {
    for kind in ["map_ldom:", "mask_ldom:", "rank", "rank_ldom", "none", ""] {
        let pairs = [("SLURM_CPU_BIND_TYPE", kind), ("SLURM_CPU_BIND_LIST", "0,1")];
        assert!(binding::slurm_task_masks(&|k: &str| env(&pairs).get(k).cloned()).is_none(), "{kind}");
        assert_eq!(step_cpus(&pairs, 0, 2, "0"), (set("0"), false), "{kind}");
    }
    // Garbage ids are not a list.
    let bad = [("SLURM_CPU_BIND_TYPE", "map_cpu:"), ("SLURM_CPU_BIND_LIST", "0,x")];
    assert_eq!(step_cpus(&bad, 0, 2, "0"), (set("0"), false));
    let huge = [("SLURM_CPU_BIND_TYPE", "map_cpu:"), ("SLURM_CPU_BIND_LIST", "0,99999999")];
    assert_eq!(step_cpus(&huge, 0, 2, "0"), (set("0"), false));
}

/// The lab's interleaved 2-CPU node: GPU 1 on CPU 0, GPU 0 on CPU 1.
fn interleaved() -> (Topology, GpuTable) {
    let buses = ["0000:1b:00.0", "0000:43:00.0"];
    let xml = synthetic_xml(&[(set("0"), vec![buses[1]]), (set("1"), vec![buses[0]])]);
    let topology = from_hwloc_xml(&xml).unwrap();
    let gpus = (0u32..2)
        .map(|i| GpuEntry {
            slurm_index: i,
            minor: Some(i),
            pci_bus_id: buses[i as usize].parse().unwrap(),
            uuid: Some(format!("GPU-{i}")),
            numa_nodes: vec![1 - i],
            cpus: set(if i == 0 { "1" } else { "0" }),
            mig_uuids: Vec::new(),
        })
        .collect();
    (topology, GpuTable { gpus, machine: None })
}

#[test]
fn force_binds_map_cpu_tasks_to_their_gpus_cpus() {
    // srun -N1 -n2 --gpus-per-task=1 --cpu-bind=map_cpu:0,1 --gpu-affinity=force:
    // task 0 (GPU 0) was put on CPU 0, GPU 1's; task 1 the other way round.
    let (topology, table) = interleaved();
    for (local, want) in [(0u32, "1"), (1, "0")] {
        let env = env(&[
            ("SLURM_CPU_BIND_TYPE", "map_cpu:"),
            ("SLURM_CPU_BIND_LIST", "0,1"),
            ("SLURMD_TRES_BIND", "gpu:per_task:1"),
            ("SLURM_STEP_GPUS", &local.to_string()),
            ("CUDA_VISIBLE_DEVICES", &local.to_string()),
        ]);
        let lookup = |k: &str| env.get(k).cloned();
        let task = SlurmTask {
            local_id: local,
            local_tasks: 2,
            step_gpus: Some(vec![0, 1]),
            env: &lookup,
            own: set(&local.to_string()),
            slurm_version: V22_05,
            devices: task_plan::devices::DeviceView::Unknown,
        };
        let share = binding::task_gpus_from_slurm(&table, &task).unwrap();
        assert_eq!(share.gpus(), [local]);
        let (allowed, _) = binding::step_cpus(&task);
        let b = binding::plan_task(&topology, &table, &share, &allowed);
        assert_eq!((b.cpus.to_string(), b.note), (want.to_owned(), None), "task {local}");
    }
}
