//! Replays the per-task environments Slurm 25.05-26.05 gives GPU steps under
//! `task/affinity,task/cgroup` with `CgroupPlugin=cgroup/v2` and
//! `ConstrainDevices=yes` through the planner the plugin runs in `task_init`.
//!
//! cgroup/v2 cannot run on the lab's cgroup v1 hybrid machines, so these
//! environments are derived from Slurm's source, not recorded
//! (`tests/fixtures/slurm-env/derived-cgroup-v2/`, every value's origin in its
//! `SOURCES.md`), in the recorded files' format.
//!
//! Ground truth: `# gpus_openable=`, the GPUs the task-level eBPF device
//! program lets the task open. It is in place before `task_init`: slurmstepd
//! attaches it in `task_g_pre_launch_priv`, before it lets the task go on to
//! `exec_task` (mgr.c `_fork_all_tasks`).
//!
//! The node is the lab's, as in `slurm_recorded.rs`: 2 CPUs, one per NUMA
//! domain, the 8 GPUs interleaved (even GPUs local to CPU 1, odd ones to
//! CPU 0), and a `gres.conf` without `Cores=`, so Slurm's cyclic placement
//! (task 0 on CPU 0) is wrong for GPU 0's task and Slurm picks per-task GPUs
//! first free first.

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

/// The releases the fixtures hold for (`SLURM_VERSION_NUMBER`): cgroup/v1 is
/// deprecated from 25.05 on, and the derived values are the same through 26.05.
const RELEASES: [(&str, u32); 3] =
    [("25.05", (25 << 16) | (5 << 8)), ("25.11", (25 << 16) | (11 << 8)), ("26.05", (26 << 16) | (5 << 8))];

const PATTERNS: [&str; 3] = ["gpus-per-task-1", "gpus-per-node-8", "ntasks-per-gpu-2"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/slurm-env/derived-cgroup-v2")
}

fn node() -> (Topology, GpuTable) {
    common::lab_node()
}

struct Task {
    env: BTreeMap<String, String>,
    cpus_allowed: CpuSet,
    openable: Vec<u32>,
}

impl Task {
    fn local_id(&self) -> u32 {
        self.env["SLURM_LOCALID"].parse().unwrap()
    }
}

fn list(text: &str) -> Vec<u32> {
    CpuSet::parse(text).map(|s| s.iter().collect()).unwrap_or_default()
}

fn read_task(path: &Path) -> Task {
    let text = fs::read_to_string(path).unwrap();
    let mut env = BTreeMap::new();
    let (mut cpus_allowed, mut openable) = (None, None);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("# cpus_allowed=") {
            cpus_allowed = Some(CpuSet::parse(v).unwrap());
        } else if let Some(v) = line.strip_prefix("# gpus_openable=") {
            openable = Some(list(v));
        } else {
            let (k, v) =
                line.split_once('=').unwrap_or_else(|| panic!("{}: bad line {line:?}", path.display()));
            assert!(env.insert(k.to_owned(), v.to_owned()).is_none(), "{}: {k} twice", path.display());
        }
    }
    let name = path.display();
    Task {
        env,
        cpus_allowed: cpus_allowed.unwrap_or_else(|| panic!("{name}: no # cpus_allowed=")),
        openable: openable.unwrap_or_else(|| panic!("{name}: no # gpus_openable=")),
    }
}

/// A pattern's tasks, in local-id order.
fn tasks(pattern: &str) -> Vec<Task> {
    let dir = fixtures().join(pattern);
    let mut tasks: Vec<Task> = (0..)
        .map(|i| dir.join(format!("task{i}.env")))
        .take_while(|p| p.exists())
        .map(|p| read_task(&p))
        .collect();
    tasks.sort_by_key(Task::local_id);
    assert_eq!(tasks.len(), 2, "{pattern}: tasks");
    tasks
}

/// What the plugin's `task_init` decides for every task of a pattern, on one
/// release: each task's GPUs and CPUs, checked against the truth.
fn replay(pattern: &str) {
    let (topology, table) = node();
    let tasks = tasks(pattern);
    // What slurmstepd's environment says before fork: every GPU of the step
    // (gres_g_step_set_env), which the tasks' devices cover here.
    let mut step_gpus: Vec<u32> = tasks.iter().flat_map(|t| t.openable.clone()).collect();
    step_gpus.sort_unstable();
    step_gpus.dedup();
    for (release, version) in RELEASES {
        let mut shares = Vec::new();
        for t in &tasks {
            let lookup = |k: &str| t.env.get(k).cloned();
            let task = SlurmTask {
                local_id: t.local_id(),
                local_tasks: u32::try_from(tasks.len()).unwrap(),
                step_gpus: Some(step_gpus.clone()),
                env: &lookup,
                own: t.cpus_allowed.clone(),
                slurm_version: version,
                // What the task's probe of /dev/nvidia<minor> finds under the eBPF device program.
                devices: view(&probes(&t.openable)),
            };
            let at = format!("{release} {pattern}: task {}", task.local_id);
            let (share, b) =
                binding::plan_slurm_task(&topology, &table, &task).unwrap_or_else(|e| panic!("{at}: {e}"));
            let mine = share.gpus();
            if t.openable.len() == step_gpus.len() && step_gpus.len() > 1 {
                // Every task may open every step GPU: it takes its share by local rank.
                assert!(
                    !mine.is_empty() && mine.iter().all(|g| t.openable.contains(g)),
                    "{at}: got {mine:?}"
                );
            } else {
                assert_eq!(mine, t.openable, "{at}: its GPUs are the ones it can open");
            }
            let (allowed, _) = binding::step_cpus(&task);
            assert_eq!(allowed, CpuSet::parse("0-1").unwrap(), "{at}: the step's CPUs");
            assert_eq!(b.note, None, "{at}");
            let near = mine.iter().fold(CpuSet::new(), |acc, g| acc.union(&table.by_index(*g).unwrap().cpus));
            assert_eq!(b.cpus, near, "{at}: the CPUs of its GPUs {mine:?}");
            shares.push(mine);
        }
        // Tasks that share every GPU split them: disjoint shares covering the step.
        if tasks.iter().all(|t| t.openable.len() == step_gpus.len()) && step_gpus.len() >= tasks.len() {
            let mut all: Vec<u32> = shares.concat();
            all.sort_unstable();
            assert_eq!(all, step_gpus, "{release} {pattern}: the shares {shares:?}");
        }
    }
}

#[test]
fn gpus_per_task_1_each_task_gets_its_own_gpu_and_its_domain() {
    replay("gpus-per-task-1");
}

#[test]
fn gpus_per_node_8_tasks_split_the_gpus_and_take_their_domains() {
    replay("gpus-per-node-8");
}

#[test]
fn ntasks_per_gpu_2_both_tasks_go_to_the_one_gpus_domain() {
    replay("ntasks-per-gpu-2");
}

/// The derived fact issue 21 is about, locked: under ConstrainDevices every
/// variable of every `--gpus-per-task=1` task says GPU 0, while task 1 can
/// open only GPU 1.
#[test]
fn per_task_variables_say_gpu_0_while_the_devices_say_otherwise() {
    let tasks = tasks("gpus-per-task-1");
    for t in &tasks {
        for var in ["CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "SLURM_STEP_GPUS"] {
            assert_eq!(t.env[var], "0", "task {}: {var}", t.local_id());
        }
        assert_eq!(t.env["SLURMD_TRES_BIND"], "gres/gpu:per_task:1");
    }
    let openable: Vec<Vec<u32>> = tasks.iter().map(|t| t.openable.clone()).collect();
    assert_eq!(openable, [vec![0], vec![1]]);
    let cpus: Vec<String> = tasks.iter().map(|t| t.cpus_allowed.to_string()).collect();
    assert_eq!(cpus, ["0", "1"], "task/affinity's cyclic masks");
}

/// Every variable in the fixtures has its source written down, and every
/// pattern is there with its command.
#[test]
fn every_value_has_a_source() {
    let sources = fs::read_to_string(fixtures().join("SOURCES.md")).unwrap();
    for pattern in PATTERNS {
        assert!(fixtures().join(pattern).join("command").is_file(), "{pattern}: no command");
        assert!(sources.contains(&format!("`{pattern}`")), "SOURCES.md does not name {pattern}");
        for t in tasks(pattern) {
            for key in t.env.keys() {
                assert!(
                    sources.contains(&format!("`{key}`")),
                    "SOURCES.md does not say where {pattern}'s {key} comes from"
                );
            }
        }
    }
    for line in ["`# gpus_openable=`", "`# cpus_allowed=`", "CgroupPlugin=cgroup/v2"] {
        assert!(sources.contains(line), "SOURCES.md does not explain {line}");
    }
    let conf = fs::read_to_string(fixtures().join("cgroup.conf")).unwrap();
    for line in ["CgroupPlugin=cgroup/v2", "ConstrainCores=yes", "ConstrainDevices=yes"] {
        assert!(conf.lines().any(|l| l == line), "cgroup.conf lacks {line}");
    }
}

/// The probes of the 8 GPUs for a task that may open `openable`.
fn probes(openable: &[u32]) -> Vec<(u32, Access)> {
    (0u32..8).map(|g| (g, if openable.contains(&g) { Access::Allowed } else { Access::Denied })).collect()
}
