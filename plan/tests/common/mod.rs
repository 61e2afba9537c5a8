//! The lab's node, as the replay tests of recorded and derived task
//! environments see it: 2 CPUs, one per NUMA domain, and 8 GPUs interleaved
//! (even GPUs local to CPU 1, odd ones to CPU 0), so Slurm's cyclic placement
//! (task 0 on CPU 0) is wrong for GPU 0's task.

#![allow(clippy::unwrap_used, dead_code)]

use hwloc_xml_oracle::from_hwloc_xml;
use slurm_formats::cpuset::CpuSet;
use task_plan::gputable::{GpuEntry, GpuTable};
use task_plan::topology::{Topology, synthetic_xml};

/// The node's topology and its GPU table.
pub fn lab_node() -> (Topology, GpuTable) {
    let bus: Vec<String> = (0..8).map(|i| format!("0000:{:02x}:00.0", 0x10 + i)).collect();
    let odd: Vec<&str> = bus.iter().skip(1).step_by(2).map(String::as_str).collect();
    let even: Vec<&str> = bus.iter().step_by(2).map(String::as_str).collect();
    let (cpu0, cpu1) = (CpuSet::parse("0").unwrap(), CpuSet::parse("1").unwrap());
    let topology = from_hwloc_xml(&synthetic_xml(&[(cpu0.clone(), odd), (cpu1.clone(), even)])).unwrap();
    let gpus = (0u32..8)
        .map(|i| GpuEntry {
            slurm_index: i,
            minor: Some(i),
            pci_bus_id: bus[i as usize].parse().unwrap(),
            uuid: None,
            numa_nodes: vec![(i + 1) % 2],
            cpus: if i % 2 == 0 { cpu1.clone() } else { cpu0.clone() },
            mig_uuids: Vec::new(),
        })
        .collect();
    (topology, GpuTable { gpus, machine: None })
}
