//! Replays the per-task environments real Slurm releases gave GPU steps in the
//! local lab (`tests/fixtures/slurm-env/RELEASE/`, recorded by `slurm-lab record-env`
//! under task/none, task/affinity and task/affinity+cgroup with
//! ConstrainDevices) through the planner the plugin runs in `task_init`, and
//! those derived from Slurm 24.11's and 26.05's source
//! (`tests/fixtures/slurm-env-derived/`, see its README) for what the lab
//! cannot record (gres.conf `Cores=` on other node shapes).
//!
//! Ground truth: `# gpus_openable=` (the GPUs the devices cgroup lets the task
//! open: under ConstrainDevices every variable says a local index) or, where
//! devices are not constrained, the task's global `SLURM_STEP_GPUS`.
//!
//! The node is the lab's: 2 CPUs, one per NUMA domain, and the 8 GPUs
//! interleaved as in the lab's binding cases: even GPUs local to CPU 1, odd
//! ones to CPU 0, so Slurm's cyclic placement (task 0 on CPU 0) is wrong for
//! GPU 0's task.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{self, SlurmTask};
use task_plan::devices::{Access, view};
use task_plan::gputable::GpuTable;
use task_plan::topology::Topology;

const V22_05: u32 = (22 << 16) | (5 << 8) | 8;
const V24_11: u32 = (24 << 16) | (11 << 8) | 5;
const V26_05: u32 = (26 << 16) | (5 << 8) | 5;

/// Each release's fixtures, with the steps there must be at least: those
/// recorded on the lab (`slurm-env/RELEASE`), and those derived from the
/// source for setups the lab cannot record (`slurm-env-derived/RELEASE`).
fn fixtures() -> [(PathBuf, u32, usize); 5] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    [
        (root.join("slurm-env/22.05"), V22_05, 12),
        (root.join("slurm-env/24.11"), V24_11, 12),
        (root.join("slurm-env/26.05"), V26_05, 12),
        (root.join("slurm-env-derived/24.11"), V24_11, 7),
        (root.join("slurm-env-derived/26.05"), V26_05, 7),
    ]
}

fn node() -> (Topology, GpuTable) {
    common::lab_node()
}

struct Task {
    env: BTreeMap<String, String>,
    cpus_allowed: CpuSet,
    truth: Vec<u32>,
    /// What the plugin's device probe finds: the GPUs the device cgroup lets
    /// the task reach (the recorder's `# gpus_openable=`), the others refused.
    probes: Vec<(u32, Access)>,
}

fn list(text: &str) -> Vec<u32> {
    CpuSet::parse(text).map(|s| s.iter().collect()).unwrap_or_default()
}

fn read_task(path: &Path) -> Task {
    let text = fs::read_to_string(path).unwrap();
    let mut env = BTreeMap::new();
    let (mut cpus_allowed, mut openable) = (CpuSet::new(), Vec::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("# cpus_allowed=") {
            cpus_allowed = CpuSet::parse(v).unwrap();
        } else if let Some(v) = line.strip_prefix("# gpus_openable=") {
            openable = list(v);
        } else if let Some((k, v)) = line.split_once('=') {
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    // Devices not constrained: every GPU opens, and SLURM_STEP_GPUS is global.
    let probes = (0u32..8)
        .map(|g| (g, if openable.contains(&g) { Access::Allowed } else { Access::Denied }))
        .collect();
    let truth = if openable.len() == 8 { list(&env["SLURM_STEP_GPUS"]) } else { openable };
    Task { env, cpus_allowed, truth, probes }
}

/// Every recorded step: (setup/pattern, its tasks in local-id order).
fn steps(root: &Path) -> Vec<(String, Vec<Task>)> {
    let mut out = Vec::new();
    for setup in ["none", "affinity", "affinity-cgroup"] {
        let Ok(dir) = fs::read_dir(root.join(setup)) else { continue };
        let mut patterns: Vec<PathBuf> = dir.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        patterns.sort();
        for dir in patterns {
            let mut tasks: Vec<Task> = (0..)
                .map(|i| dir.join(format!("task{i}.env")))
                .take_while(|p| p.exists())
                .map(|p| read_task(&p))
                .collect();
            tasks.sort_by_key(|t| t.env["SLURM_LOCALID"].parse::<u32>().unwrap());
            if !tasks.is_empty() {
                out.push((dir.file_name().unwrap().to_string_lossy().into_owned(), tasks));
            }
        }
    }
    out
}

#[test]
fn every_recorded_task_gets_its_real_gpus_and_their_domain() {
    for (root, version, least) in fixtures() {
        let steps = steps(&root);
        assert!(steps.len() >= least, "{}: {} steps", root.display(), steps.len());
        replay(&steps, version);
    }
}

fn replay(steps: &[(String, Vec<Task>)], version: u32) {
    let (topology, table) = node();
    for (name, tasks) in steps {
        let name = format!("{version:x} {name}");
        // What slurmstepd's environment says before fork: the step's GPUs.
        let mut step_gpus: Vec<u32> = tasks.iter().flat_map(|t| t.truth.clone()).collect();
        step_gpus.sort_unstable();
        step_gpus.dedup();
        let mut planned = Vec::new();
        for t in tasks {
            let lookup = |k: &str| t.env.get(k).cloned();
            let task = SlurmTask {
                local_id: t.env["SLURM_LOCALID"].parse().unwrap(),
                local_tasks: u32::try_from(tasks.len()).unwrap(),
                step_gpus: Some(step_gpus.clone()),
                env: &lookup,
                own: t.cpus_allowed.clone(),
                slurm_version: version,
                devices: view(&t.probes),
            };
            let (share, b) = binding::plan_slurm_task(&topology, &table, &task).unwrap();
            let mine = share.gpus();
            if t.truth.len() == step_gpus.len() {
                // Every task sees every GPU: it takes its share by local rank.
                assert!(
                    mine.iter().all(|g| t.truth.contains(g)),
                    "{name}: task {} got {mine:?}",
                    task.local_id
                );
            } else {
                assert_eq!(mine, t.truth, "{name}: task {} GPUs", task.local_id);
            }
            let (allowed, _) = binding::step_cpus(&task);
            assert_eq!(allowed, CpuSet::parse("0-1").unwrap(), "{name}: the step's CPUs");
            assert_eq!(b.note, None, "{name}");
            let near = mine.iter().fold(CpuSet::new(), |acc, g| acc.union(&table.by_index(*g).unwrap().cpus));
            assert_eq!(b.cpus, near, "{name}: task {} with GPUs {mine:?}", task.local_id);
            planned.push(b.cpus);
        }
        // One GPU per task on different domains: the tasks are apart.
        if name.ends_with("gpus-per-task-1") {
            assert_ne!(planned[0], planned[1], "{name}");
            assert_eq!(planned[0].to_string(), "1", "{name}: GPU 0's task on GPU 0's CPU");
        }
        // Slurm gave task 0 (on CPU 0) GPU 1, close to it: it stays there, task 1 on CPU 1.
        if name.ends_with("gpus-per-task-1-gres-cores") {
            assert_eq!(planned.iter().map(ToString::to_string).collect::<Vec<_>>(), ["0", "1"], "{name}");
        }
    }
}
