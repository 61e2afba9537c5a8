//! Times the two steps of GPU-aware binding on a real node's topology (a Dell
//! XE8640: 224 threads, 8 NUMA nodes, 4 H100):
//!
//! * reading its hwloc XML ([`from_hwloc_xml`]), done once per node and cached;
//! * planning 8 tasks (2 per GPU) with [`plan`], done at every task launch.
//!
//! Run in release mode: `cargo run --release -p gpu-core --example bench_binding`.
//! Prints the median, the 10th and the 90th percentile of single operations.

use std::error::Error;
use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_core::binding::{GpuLocality, TaskGpus, plan};
use gpu_core::topology::from_hwloc_xml;

const FIXTURE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/topologies/fluxcore_ipa20_dell-xe8640-4xH100.xml");

/// Runs `op` `iterations` times (after a tenth as many warm-up runs) and
/// returns the 10th, 50th and 90th percentile of one run, in microseconds.
fn time<T>(iterations: usize, mut op: impl FnMut() -> T) -> (f64, f64, f64) {
    for _ in 0..iterations / 10 {
        black_box(op());
    }
    let mut samples: Vec<Duration> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            black_box(op());
            start.elapsed()
        })
        .collect();
    samples.sort_unstable();
    let at = |q: usize| samples.get(samples.len() * q / 100).map_or(0.0, |d| d.as_secs_f64() * 1e6);
    (at(10), at(50), at(90))
}

fn main() -> Result<(), Box<dyn Error>> {
    let xml = std::fs::read_to_string(FIXTURE)?;
    let topology = from_hwloc_xml(&xml)?;
    let nvidia: Vec<GpuLocality> = topology.nvidia_gpus().map(GpuLocality::from).collect();
    if nvidia.is_empty() {
        return Err("the fixture has no NVIDIA GPU".into());
    }
    let tasks: Vec<TaskGpus> = (0u32..8)
        .zip(nvidia.iter().flat_map(|g| [g, g]))
        .map(|(local_id, gpu)| TaskGpus {
            local_id,
            allowed: topology.allowed_cpus.clone(),
            gpus: vec![gpu.clone()],
        })
        .collect();

    println!(
        "topology: {} bytes of XML, {} PUs in {} cores, {} NUMA nodes, {} NVIDIA GPUs",
        xml.len(),
        topology.allowed_cpus.len(),
        topology.cores.len(),
        topology.numa_nodes.len(),
        nvidia.len()
    );
    for binding in plan(&topology, &tasks) {
        println!("  task {}: cpus {} numa {:?}", binding.local_id, binding.cpus, binding.numa_nodes);
    }

    let (p10, p50, p90) = time(300, || from_hwloc_xml(&xml));
    println!("from_hwloc_xml: median {p50:.1} µs/op (p10 {p10:.1}, p90 {p90:.1}; 300 runs)");
    let (p10, p50, p90) = time(20_000, || plan(&topology, &tasks));
    println!("plan, 8 tasks:  median {p50:.2} µs/op (p10 {p10:.2}, p90 {p90:.2}; 20000 runs)");
    Ok(())
}
