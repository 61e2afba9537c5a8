//! Replays what Slurm tells each task of a step, and checks the CPUs the
//! plugin's planner gives every task.
//!
//! The node is AWS g4dn.metal (`fixtures/topologies/mpibind_g4dnmetal.xml`):
//! 2 sockets × 24 cores × 2 threads (socket 0: CPUs 0-23,48-71; socket 1:
//! 24-47,72-95) and 8 T4 GPUs, Slurm indices 0-3 on socket 0 and 4-7 on
//! socket 1. The whole node is allocated, `TaskPlugin=task/affinity,task/cgroup`.
//!
//! Each task's environment is derived from Slurm's code (the places are named
//! in the section comment of `task_plan::binding`, "From what Slurm tells a
//! task"):
//! - `SLURMD_TRES_BIND` is what srun's launch.c makes of the options
//!   (`--gpus-per-task=N` → `gpu:per_task:N`, `--ntasks-per-gpu=N` →
//!   `gpu:single:N`), exported by `exec_task`.
//! - `SLURM_STEP_GPUS`/`CUDA_VISIBLE_DEVICES` per task: `gres_g_task_set_env`
//!   → `common_gres_set_env`, with global indices, or with local indices when
//!   `ConstrainDevices=yes` (`gres_use_local_device_index`).
//! - `SLURM_CPU_BIND_TYPE/LIST`: task/affinity's cyclic auto binding
//!   (`lllp_distribution`, `_task_layout_lllp_cyclic`): task i on socket i % 2,
//!   whatever its GPU (the defect this replaces), written as hex masks by
//!   `setup_env`.
//!
//! What must come out: every task on its GPU's socket, the socket's 24 cores
//! split evenly (whole cores) between the tasks there, and no CPU in two tasks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hwloc_xml_oracle::from_hwloc_xml;
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{self, SlurmTask, TaskShare};
use task_plan::devices::DeviceView;
use task_plan::gputable::{GpuEntry, GpuTable};
use task_plan::topology::Topology;

const G4DN: &str = include_str!("fixtures/topologies/mpibind_g4dnmetal.xml");
const V22_05: u32 = (22 << 16) | (5 << 8) | 8;
const V24_11: u32 = (24 << 16) | (11 << 8) | 7;

fn node() -> (Topology, GpuTable) {
    let t = from_hwloc_xml(G4DN).unwrap();
    let gpus = (0u32..8)
        .map(|i| {
            let g = t.gpu_by_os_name(&format!("nvml{i}")).unwrap();
            GpuEntry {
                slurm_index: i,
                minor: Some(i),
                pci_bus_id: g.bus_id,
                uuid: Some(format!("GPU-{i:08}")),
                numa_nodes: g.numa_nodes.clone(),
                cpus: g.cpus.clone(),
                mig_uuids: Vec::new(),
            }
        })
        .collect();
    (t, GpuTable { gpus, machine: None })
}

/// Hex mask as slurmstepd writes it.
fn hex(set: &CpuSet) -> String {
    let words = set.to_words(2);
    format!("0x{:016X}{:016X}", words[1], words[0])
}

/// task/affinity's cyclic masks: task i gets `cores` cores on socket i % 2,
/// filling each socket from its first core.
fn cyclic_masks(tasks: usize, cores: u32) -> Vec<CpuSet> {
    let mut next = [0u32, 24u32];
    (0..tasks)
        .map(|i| {
            let s = i % 2;
            let mut m = CpuSet::new();
            for c in next[s]..next[s] + cores {
                m.insert(c);
                m.insert(c + 48);
            }
            next[s] += cores;
            m
        })
        .collect()
}

struct Step {
    tres_bind: Option<String>,
    /// Each task's (SLURM_STEP_GPUS, CUDA_VISIBLE_DEVICES).
    gpus: Vec<(String, String)>,
    masks: Vec<CpuSet>,
    /// Under ConstrainDevices, each task's GPUs as its device cgroup has them
    /// (what the plugin's probe finds).
    devices: Option<Vec<Vec<u32>>>,
}

/// Whether gres.conf gives the GPUs' cores (`Cores=`, or AutoDetect): from
/// 23.11 Slurm's per_task choice prefers GPUs close to the task's CPUs only
/// then (`_get_closest_usable_gres`); without, every GPU is as close.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cores {
    Given,
    Missing,
}

fn list(v: impl IntoIterator<Item = u32>) -> String {
    v.into_iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
}

/// `--gpus-per-task=1 -n8 -c12`: task i's GPU, as Slurm chooses it.
fn real_gpu(version: u32, cores: Cores, i: u32) -> u32 {
    if version >= binding::PER_TASK_AFFINITY_SINCE && cores == Cores::Given {
        // 23.11+: each task takes the free GPU closest to its CPUs
        // (cyclic: even tasks on socket 0 get 0,1,2,3; odd ones 4,5,6,7).
        if i % 2 == 0 { i / 2 } else { 4 + i / 2 }
    } else {
        // 22.05, or no GPU closer than another: the free ones in order.
        i
    }
}

fn gpus_per_task(version: u32, constrain: bool, cores: Cores) -> Step {
    let real: Vec<u32> = (0u32..8).map(|i| real_gpu(version, cores, i)).collect();
    let gpus = real
        .iter()
        .map(|g| {
            if constrain {
                // Local indices: every task is told local GPU 0 (23.11+: and the
                // step's first GPU in SLURM_STEP_GPUS, global).
                ("0".to_owned(), "0".to_owned())
            } else {
                (g.to_string(), g.to_string())
            }
        })
        .collect();
    let devices = constrain.then(|| real.iter().map(|g| vec![*g]).collect());
    let tres =
        if version >= binding::PER_TASK_AFFINITY_SINCE { "gres/gpu:per_task:1" } else { "gpu:per_task:1" };
    Step { tres_bind: Some(tres.into()), gpus, masks: cyclic_masks(8, 6), devices }
}

/// `--gpus-per-node=8 -n2 -c48`: no GPU binding, each task sees all 8.
fn gpus_per_node() -> Step {
    let all = (list(0..8), list(0..8));
    Step { tres_bind: None, gpus: vec![all.clone(), all], masks: cyclic_masks(2, 24), devices: None }
}

/// `--ntasks-per-gpu=2 -n16 -c3`: `gpu:single:2`; task i's usable GPUs are the 4
/// on its socket, and it takes number (i / 2) % 4 of them
/// (`_filter_usable_gres`): tasks 0 and 8 share GPU 0, 1 and 9 GPU 4, ...
/// `SLURM_STEP_GPUS` is global with or without `ConstrainDevices`, and
/// `CUDA_VISIBLE_DEVICES` is the position among the step's GPUs, which for a
/// whole-node step is the same number: one environment covers both.
fn ntasks_per_gpu() -> Step {
    let gpus = (0u32..16)
        .map(|i| {
            let g = (i % 2) * 4 + (i / 2) % 4;
            (g.to_string(), g.to_string())
        })
        .collect();
    Step { tres_bind: Some("gpu:single:2".into()), gpus, masks: cyclic_masks(16, 3), devices: None }
}

/// Plans every task of the step as the plugin does in each task.
fn replay(step: &Step, version: u32) -> Vec<(Vec<u32>, String)> {
    let (topology, table) = node();
    let masks: Vec<String> = step.masks.iter().map(hex).collect();
    let n = step.gpus.len();
    (0..n)
        .map(|i| {
            let mut env: BTreeMap<&str, String> = BTreeMap::new();
            env.insert("SLURM_STEP_GPUS", step.gpus[i].0.clone());
            env.insert("CUDA_VISIBLE_DEVICES", step.gpus[i].1.clone());
            env.insert("SLURM_CPU_BIND_TYPE", "cores,mask_cpu:".into());
            env.insert("SLURM_CPU_BIND_LIST", masks.join(","));
            if let Some(b) = &step.tres_bind {
                env.insert("SLURMD_TRES_BIND", b.clone());
            }
            let lookup = |k: &str| env.get(k).cloned();
            let task = SlurmTask {
                local_id: u32::try_from(i).unwrap(),
                local_tasks: u32::try_from(n).unwrap(),
                step_gpus: Some((0..8).collect()),
                env: &lookup,
                own: step.masks[i].clone(),
                slurm_version: version,
                devices: step
                    .devices
                    .as_ref()
                    .map_or(DeviceView::Unknown, |d| DeviceView::Constrained(d[i].clone())),
            };
            let (_, slurm_bound) = binding::step_cpus(&task);
            assert!(slurm_bound, "task/affinity bound task {i}");
            let (share, b): (TaskShare, _) = binding::plan_slurm_task(&topology, &table, &task).unwrap();
            (share.gpus(), b.cpus.to_string())
        })
        .collect()
}

fn socket_of(g: u32) -> CpuSet {
    CpuSet::parse(if g < 4 { "0-23,48-71" } else { "24-47,72-95" }).unwrap()
}

/// Every task on its GPUs' socket, `cores` cores each, no CPU twice.
fn check(got: &[(Vec<u32>, String)], cores: usize) {
    let mut seen = CpuSet::new();
    for (i, (gpus, cpus)) in got.iter().enumerate() {
        let cpus = CpuSet::parse(cpus).unwrap();
        for g in gpus {
            assert!(cpus.is_subset(&socket_of(*g)), "task {i} (GPU {g}) bound to {cpus}");
        }
        assert_eq!(cpus.len(), cores * 2, "task {i}: {cpus}");
        assert!(cpus.intersection(&seen).is_empty(), "task {i}: {cpus} overlaps another task");
        seen = seen.union(&cpus);
    }
}

#[test]
fn gpus_per_task_22_05_and_24_11_with_and_without_constrain_devices() {
    for version in [V22_05, V24_11] {
        for constrain in [false, true] {
            for cores in [Cores::Given, Cores::Missing] {
                let step = gpus_per_task(version, constrain, cores);
                let got = replay(&step, version);
                // Each task's GPU is the one Slurm gave it: what it was told
                // (global indices), or what its device cgroup has.
                for (i, (gpus, _)) in got.iter().enumerate() {
                    let want = real_gpu(version, cores, u32::try_from(i).unwrap());
                    assert_eq!(gpus, &vec![want], "v{version:x} {constrain} {cores:?} task {i}");
                }
                // 4 tasks per socket share its 24 cores: 6 each.
                check(&got, 6);
            }
        }
    }
    // 22.05, ConstrainDevices: the real GPUs are blocks in local-id order.
    let got = replay(&gpus_per_task(V22_05, true, Cores::Given), V22_05);
    assert_eq!(got[0].1, "0-5,48-53");
    assert_eq!(got[1].1, "6-11,54-59");
    assert_eq!(got[4].1, "24-29,72-77");
    // 24.11 with Cores=, ConstrainDevices: task 1 (CPUs on socket 1) took GPU 4.
    let got = replay(&gpus_per_task(V24_11, true, Cores::Given), V24_11);
    assert_eq!(got[1], (vec![4], "24-29,72-77".to_owned()));
    // Without Cores= task 1 took GPU 1, on socket 0: it moves there.
    let got = replay(&gpus_per_task(V24_11, true, Cores::Missing), V24_11);
    assert_eq!(got[1], (vec![1], "6-11,54-59".to_owned()));
}

#[test]
fn without_a_device_probe_24_11_local_indices_are_not_guessed() {
    // ConstrainDevices, and the device cgroup could not be read: task 0 is
    // taken at its word, the others keep Slurm's mask (each says why).
    let (topology, table) = node();
    let step = gpus_per_task(V24_11, true, Cores::Missing);
    let masks: Vec<String> = step.masks.iter().map(hex).collect();
    for i in 0u32..2 {
        let env: BTreeMap<&str, String> = [
            ("SLURM_STEP_GPUS", "0".to_owned()),
            ("CUDA_VISIBLE_DEVICES", "0".to_owned()),
            ("SLURM_CPU_BIND_TYPE", "cores,mask_cpu:".to_owned()),
            ("SLURM_CPU_BIND_LIST", masks.join(",")),
            ("SLURMD_TRES_BIND", "gres/gpu:per_task:1+gres/nic:closest".to_owned()),
        ]
        .into_iter()
        .collect();
        let lookup = |k: &str| env.get(k).cloned();
        let task = SlurmTask {
            local_id: i,
            local_tasks: 8,
            step_gpus: Some((0..8).collect()),
            env: &lookup,
            own: step.masks[i as usize].clone(),
            slurm_version: V24_11,
            devices: DeviceView::Unknown,
        };
        let got = binding::plan_slurm_task(&topology, &table, &task);
        if i == 0 {
            assert_eq!(got.unwrap().0.gpus(), [0]);
        } else {
            let why = got.unwrap_err();
            assert!(why.contains("its device cgroup could not be read") && why.contains("Cores="), "{why}");
        }
    }
}

/// `--ntasks-per-gpu=2 -n16 -c3` on 23.11+ under ConstrainDevices: every task
/// is told `CUDA_VISIBLE_DEVICES=0` and the step's first GPU (gres.c
/// `_get_usable_gres`, `single:` with local indices); the device cgroup has
/// the real one (`_get_single_usable_gres`).
fn ntasks_per_gpu_24_11_constrained(cores: Cores) -> (Step, Vec<u32>) {
    let real: Vec<u32> = (0u32..16)
        .map(|i| if cores == Cores::Given { (i % 2) * 4 + (i / 2) % 4 } else { (i / 2) % 8 })
        .collect();
    let gpus = (0..16).map(|_| ("0".to_owned(), "0".to_owned())).collect();
    let devices = Some(real.iter().map(|g| vec![*g]).collect());
    (Step { tres_bind: Some("gres/gpu:single:2".into()), gpus, masks: cyclic_masks(16, 3), devices }, real)
}

#[test]
fn ntasks_per_gpu_24_11_under_constrain_devices_binds_each_task_to_its_own_gpu() {
    // With Cores=, Slurm's choice is the rule the plugin knows: the whole node
    // is planned, two tasks per GPU splitting its cores.
    let (step, real) = ntasks_per_gpu_24_11_constrained(Cores::Given);
    let got = replay(&step, V24_11);
    check(&got, 3);
    assert_eq!(got.iter().map(|(g, _)| g[0]).collect::<Vec<_>>(), real);
    // Without, tasks 0 and 1 share GPU 0 while task 1's CPUs are on socket 1:
    // every task ends on its GPU's socket; those Slurm placed there keep
    // Slurm's mask (task 0: cores 0-2), never moved off their GPU's socket.
    let (step, real) = ntasks_per_gpu_24_11_constrained(Cores::Missing);
    let got = replay(&step, V24_11);
    for (i, (gpus, cpus)) in got.iter().enumerate() {
        assert_eq!(gpus, &vec![real[i]], "task {i}");
        let cpus = CpuSet::parse(cpus).unwrap();
        assert!(cpus.is_subset(&socket_of(real[i])), "task {i} (GPU {}) bound to {cpus}", real[i]);
    }
    assert_eq!(got[1], (vec![0], "0-5,48-53".to_owned()), "task 1 moves to GPU 0's socket");
}

#[test]
fn a_task_slurm_placed_by_its_shared_gpu_keeps_slurms_mask() {
    // --ntasks-per-gpu=1 -n2 -c48, ConstrainDevices: task 0 (socket 0) has
    // GPU 1, which the plugin's rule would not have chosen (it takes GPU 0).
    // It cannot see who else uses GPU 1, and Slurm's mask is on GPU 1's
    // socket: kept, and the note says so.
    let (topology, table) = node();
    let masks = cyclic_masks(2, 24);
    let hexes: Vec<String> = masks.iter().map(hex).collect();
    let env: BTreeMap<&str, String> = [
        ("SLURM_STEP_GPUS", "0".to_owned()),
        ("CUDA_VISIBLE_DEVICES", "0".to_owned()),
        ("SLURM_CPU_BIND_TYPE", "mask_cpu:".to_owned()),
        ("SLURM_CPU_BIND_LIST", hexes.join(",")),
        ("SLURMD_TRES_BIND", "gres/gpu:single:1".to_owned()),
    ]
    .into_iter()
    .collect();
    let lookup = |k: &str| env.get(k).cloned();
    let task = SlurmTask {
        local_id: 0,
        local_tasks: 2,
        step_gpus: Some((0..8).collect()),
        env: &lookup,
        own: masks[0].clone(),
        slurm_version: V24_11,
        devices: DeviceView::Constrained(vec![1]),
    };
    let (share, b) = binding::plan_slurm_task(&topology, &table, &task).unwrap();
    assert_eq!(share.gpus(), [1]);
    assert!(!share.peers_known);
    assert_eq!(b.cpus, masks[0]);
    assert!(b.note.as_deref().is_some_and(|n| n.contains("Slurm already bound it")), "{b:?}");
    // On the other socket, it moves to GPU 1's part of socket 0.
    let task = SlurmTask { own: masks[1].clone(), local_id: 1, ..task };
    let (_, b) = binding::plan_slurm_task(&topology, &table, &task).unwrap();
    assert_eq!((b.cpus.to_string(), b.note), ("6-11,54-59".to_owned(), None));
}

#[test]
fn gpus_per_node_two_tasks_split_the_gpus_by_local_rank() {
    for version in [V22_05, V24_11] {
        let got = replay(&gpus_per_node(), version);
        assert_eq!(got[0], (vec![0, 1, 2, 3], "0-23,48-71".to_owned()));
        assert_eq!(got[1], (vec![4, 5, 6, 7], "24-47,72-95".to_owned()));
    }
}

#[test]
fn ntasks_per_gpu_two_tasks_share_each_gpu_and_its_cores() {
    let got = replay(&ntasks_per_gpu(), V22_05);
    // 8 tasks per socket, 3 cores each; the two tasks of a GPU split its 6.
    check(&got, 3);
    assert_eq!(got[0], (vec![0], "0-2,48-50".to_owned()));
    assert_eq!(got[8], (vec![0], "3-5,51-53".to_owned()));
    assert_eq!(got[1], (vec![4], "24-26,72-74".to_owned()));
}
