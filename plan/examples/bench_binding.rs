//! Times the two steps of GPU-aware binding on a real node's topology (a Dell
//! XE8640: 224 threads, 8 NUMA nodes, 4 H100):
//!
//! * reading its GPU table, version 3 ([`GpuTable::parse`]), what the plugin
//!   does once per step (the table is made here from the hwloc XML by the
//!   test oracle, `hwloc_xml_oracle::from_hwloc_xml`, as the agent would make
//!   it with hwloc);
//! * planning 8 tasks (2 per GPU) with [`plan`];
//! * what the plugin does in each task's `task_init` under task/affinity with
//!   `--ntasks-per-gpu=2`: reading what Slurm told the task
//!   ([`task_gpus_from_slurm`], [`step_cpus`]) and planning its share of the
//!   node ([`plan_task`]).
//!
//! * the same for 64 tasks on 4 GPUs (task/none, every task sees every GPU),
//!   also in a child just forked, as `task_init` runs, with its page faults.
//!
//! Run in release mode: `cargo run --release -p task-plan --example bench_binding`.
//! Prints the median, the 10th and the 90th percentile of single operations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hwloc_xml_oracle::from_hwloc_xml;
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{
    GpuLocality, SlurmTask, TaskGpus, plan, plan_task, step_cpus, task_gpus_from_slurm,
};
use task_plan::gputable::{GpuEntry, GpuTable};

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

    let (p10, p50, p90) = time(20_000, || plan(&topology, &tasks));
    println!("plan, 8 tasks:  median {p50:.2} µs/op (p10 {p10:.2}, p90 {p90:.2}; 20000 runs)");

    // One task_init: local task 5 of 8, two per GPU (gpu:single:2), task/affinity's
    // 8 cyclic masks of 28 PUs in the environment.
    let table = GpuTable {
        machine: Some(topology.clone()),
        gpus: (0u32..)
            .zip(topology.nvidia_gpus())
            .map(|(i, g)| GpuEntry {
                slurm_index: i,
                minor: Some(i),
                pci_bus_id: g.bus_id,
                uuid: None,
                numa_nodes: g.numa_nodes.clone(),
                cpus: g.cpus.clone(),
                mig_uuids: Vec::new(),
            })
            .collect(),
    };
    let text = table.to_text();
    let (p10, p50, p90) = time(3000, || GpuTable::parse(&text));
    println!(
        "GpuTable::parse, v3, {} bytes: median {p50:.1} µs/op (p10 {p10:.1}, p90 {p90:.1}; 3000 runs)",
        text.len()
    );
    let pus: Vec<u32> = topology.allowed_cpus.iter().collect();
    let masks: Vec<CpuSet> = (0..8).map(|i| pus.iter().skip(i).step_by(8).copied().collect()).collect();
    let hex = |m: &CpuSet| {
        let words = m.to_words(4);
        format!("0x{}", words.iter().rev().map(|w| format!("{w:016X}")).collect::<String>())
    };
    let list: Vec<String> = masks.iter().map(hex).collect();
    let env = |k: &str| match k {
        "CUDA_VISIBLE_DEVICES" | "SLURM_STEP_GPUS" => Some("2".to_owned()),
        "SLURMD_TRES_BIND" => Some("gpu:single:2".to_owned()),
        "SLURM_CPU_BIND_TYPE" => Some("mask_cpu:".to_owned()),
        "SLURM_CPU_BIND_LIST" => Some(list.join(",")),
        _ => None,
    };
    let task = SlurmTask {
        local_id: 5,
        local_tasks: 8,
        step_gpus: Some(vec![0, 1, 2, 3]),
        env: &env,
        own: masks[5].clone(),
        slurm_version: (22 << 16) | (5 << 8),
        devices: task_plan::devices::DeviceView::Unknown,
    };
    let one = || {
        let share = task_gpus_from_slurm(&table, &task).ok()?;
        let (allowed, _) = step_cpus(&task);
        Some(plan_task(&topology, &table, &share, &allowed))
    };
    if let Some(b) = one() {
        println!("  task_init of local task 5: cpus {} numa {:?} {:?}", b.cpus, b.numa_nodes, b.note);
    }
    let (p10, p50, p90) = time(20_000, one);
    println!("task_init's planning: median {p50:.2} µs/op (p10 {p10:.2}, p90 {p90:.2}; 20000 runs)");

    // 64 tasks on the node, each seeing all 4 GPUs (srun --ntasks-per-node=64
    // --gpus-per-node=4 under task/none): planned in a child just forked, as
    // task_init is, where every page the plan writes is a fault.
    let all = "0,1,2,3".to_owned();
    let env64 = |k: &str| match k {
        "CUDA_VISIBLE_DEVICES" | "SLURM_STEP_GPUS" => Some(all.clone()),
        _ => None,
    };
    let task64 = |local_id| SlurmTask {
        local_id,
        local_tasks: 64,
        step_gpus: Some(vec![0, 1, 2, 3]),
        env: &env64,
        own: topology.allowed_cpus.clone(),
        slurm_version: (24 << 16) | (11 << 8),
        devices: task_plan::devices::DeviceView::Unknown,
    };
    let plan64 = |local_id| {
        let task = task64(local_id);
        let share = task_gpus_from_slurm(&table, &task).ok()?;
        let (allowed, _) = step_cpus(&task);
        Some(plan_task(&topology, &table, &share, &allowed))
    };
    if let Some(b) = plan64(37) {
        println!("  local task 37 of 64 on 4 GPUs: cpus {} numa {:?} {:?}", b.cpus, b.numa_nodes, b.note);
    }
    let (calls, bytes) = (ALLOCATIONS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
    black_box(plan64(37));
    println!(
        "  its planning allocates {} times, {} bytes",
        ALLOCATIONS.load(Ordering::Relaxed) - calls,
        BYTES.load(Ordering::Relaxed) - bytes
    );
    let (p10, p50, p90) = time(2000, || plan64(37));
    println!("task_init's planning, 64 tasks: median {p50:.2} µs/op (p10 {p10:.2}, p90 {p90:.2}; 2000 runs)");
    let forked: Vec<(f64, f64)> = (0..200).filter_map(|i| in_child(|| plan64(i % 64))).collect();
    let cpu = forked.iter().map(|(c, _)| *c).collect::<Vec<_>>();
    let faults = forked.iter().map(|(_, f)| *f).collect::<Vec<_>>();
    println!(
        "the same in a child just forked: median {:.1} µs CPU, {:.0} page faults ({} children)",
        median(cpu),
        median(faults),
        forked.len()
    );
    Ok(())
}

/// The system allocator, counting what it is asked for: the allocations of
/// one `task_init`'s planning, each a possible page fault in a forked task.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The calling thread's CPU time in microseconds and its minor page faults.
fn usage() -> (f64, f64) {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    // SAFETY: rusage is plain integers; getrusage writes one into `ru`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru) };
    (ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3, ru.ru_minflt as f64)
}

/// Runs `op` once in a child just forked and returns its CPU time (µs) and page faults.
fn in_child<T>(op: impl Fn() -> T) -> Option<(f64, f64)> {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into `fds`.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: the child only runs `op`, writes to the pipe and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let a = usage();
        black_box(op());
        let b = usage();
        let out = [b.0 - a.0, b.1 - a.1];
        // SAFETY: writes 16 bytes from `out` to the pipe, then exits without unwinding.
        unsafe {
            libc::write(fds[1], out.as_ptr().cast(), 16);
            libc::_exit(0);
        }
    }
    let mut out = [0f64; 2];
    // SAFETY: reads at most 16 bytes into `out`; waits for the child.
    unsafe {
        libc::close(fds[1]);
        libc::read(fds[0], out.as_mut_ptr().cast(), 16);
        libc::close(fds[0]);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    Some((out[0], out[1]))
}
