//! The GPU table, version 3 (its machine records), and planning on whatever
//! machine it describes, as the plugin does (this replaces the hwloc XML
//! target: the plugin reads no XML since issue 31).
#![no_main]
use task_plan::binding::{self, GpuLocality, TaskGpus};
use task_plan::gputable::GpuTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(table) = GpuTable::parse(text) else { return };
    assert_eq!(GpuTable::parse(&table.to_text()).ok().as_ref(), Some(&table));
    let (topology, _) = table.topology();
    let rows = table.gpus.iter().map(|g| GpuLocality { numa_nodes: g.numa_nodes.clone(), cpus: g.cpus.clone() });
    let devices = topology.gpus.iter().map(GpuLocality::from);
    let tasks: Vec<TaskGpus> = rows
        .chain(devices)
        .zip(0u32..)
        .map(|(g, i)| TaskGpus { local_id: i, allowed: topology.allowed_cpus.clone(), gpus: vec![g] })
        .collect();
    for (b, task) in binding::plan(&topology, &tasks).iter().zip(&tasks) {
        assert!(b.cpus.is_subset(&task.allowed));
    }
});
