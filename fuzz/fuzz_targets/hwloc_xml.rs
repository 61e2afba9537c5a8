//! The hwloc XML cache, and planning on whatever it describes.
#![no_main]
use gpu_core::binding::{self, GpuLocality, TaskGpus};
use gpu_core::topology;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(xml) = std::str::from_utf8(data) else { return };
    let Ok(t) = topology::from_hwloc_xml(xml) else { return };
    let tasks: Vec<TaskGpus> = t
        .gpus
        .iter()
        .zip(0u32..)
        .map(|(g, i)| TaskGpus {
            local_id: i,
            allowed: t.allowed_cpus.clone(),
            gpus: vec![GpuLocality { numa_nodes: g.numa_nodes.clone(), cpus: g.cpus.clone() }],
        })
        .collect();
    for (b, task) in binding::plan(&t, &tasks).iter().zip(&tasks) {
        assert!(b.cpus.is_subset(&task.allowed));
    }
});
