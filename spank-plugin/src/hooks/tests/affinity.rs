//! `--gpu-affinity`: the table, the binding, MIG, device constraints.

use super::super::fake::FakeSpank;
use super::*;

/// A 2-domain node: CPUs 0-7 with GPUs 0-3, CPUs 8-15 with GPUs 4-7, its
/// table (version 3, with the machine) where the plugin looks for it.
pub(in crate::hooks) fn with_topology(sp: &mut FakeSpank) {
    with_table(sp, true);
}

/// [`with_topology`]'s node; `machine`: false writes an older agent's
/// table (version 2, no machine records) instead.
pub(super) fn with_table(sp: &mut FakeSpank, machine: bool) {
    use slurm_formats::cpuset::CpuSet;
    use task_plan::gputable::GpuEntry;
    let buses = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"];
    let buses2 = ["0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"];
    let (lo, hi) = (CpuSet::parse("0-7").unwrap(), CpuSet::parse("8-15").unwrap());
    let xml =
        task_plan::topology::synthetic_xml(&[(lo.clone(), buses.to_vec()), (hi.clone(), buses2.to_vec())]);
    let machine = machine.then(|| hwloc_xml_oracle::from_hwloc_xml(&xml).unwrap());
    let gpus = (0u32..)
        .zip(buses.iter().chain(&buses2))
        .map(|(i, b)| GpuEntry {
            slurm_index: i,
            minor: Some(i),
            pci_bus_id: b.parse().unwrap(),
            uuid: Some(format!("GPU-{i}")),
            numa_nodes: vec![i / 4],
            cpus: if i < 4 { lo.clone() } else { hi.clone() },
            // GPU 5 is in MIG mode with two MIG devices.
            mig_uuids: if i == 5 { vec![MIG_5A.to_owned(), MIG_5B.to_owned()] } else { Vec::new() },
        })
        .collect();
    // The on-disk contract: the agent's file names in the default directory.
    let dir = gputable::DEFAULT_DIR;
    sp.files.insert(format!("{dir}/gpus.tsv"), GpuTable { gpus, machine }.to_text());
}

fn bound(local: u32, cvd: &str, step_gpus: &str, extra: &[(&str, &str)]) -> FakeSpank {
    let mut sp = FakeSpank::task(0, local, local);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), cvd.into());
    sp.env.insert("SLURM_STEP_GPUS".into(), step_gpus.into());
    for (k, v) in extra {
        sp.env.insert((*k).into(), (*v).into());
    }
    let st_sp = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
    sp
}

#[test]
fn tasks_bind_to_their_gpus_domain_and_split_it() {
    // Two tasks with one GPU each on domain 0 split its 8 cores.
    assert_eq!(bound(0, "0", "0,1", &[]).mask.to_string(), "0-3");
    assert_eq!(bound(1, "1", "0,1", &[]).mask.to_string(), "4-7");
    // GPUs on the other domain.
    assert_eq!(bound(0, "4", "4,5", &[]).mask.to_string(), "8-11");
    // Every task sees all 8 GPUs: local rank 1 of 2 takes GPUs 4-7.
    assert_eq!(bound(1, "0,1,2,3,4,5,6,7", "0,1,2,3,4,5,6,7", &[]).mask.to_string(), "8-15");
    // GPUs given as UUIDs (both local tasks see GPU 5: they split its domain).
    assert_eq!(bound(0, "GPU-5", "5", &[]).mask.to_string(), "8-11");
}

/// Issue 31: the plugin reads only the table (no hwloc XML beside it); an
/// older agent's table (version 2, no machine records) still binds, each
/// task to its GPUs' whole local CPUs, and says so.
#[test]
fn an_older_agents_table_binds_degraded_and_says_so() {
    let mut sp = FakeSpank::task(0, 1, 1);
    with_table(&mut sp, false);
    assert!(!sp.files.keys().any(|f| f.ends_with(".xml")));
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "1".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
    let st = user_init(&mut sp, &[]).unwrap();
    assert!(st.as_ref().and_then(|s| s.topology.as_ref()).is_some_and(|t| t.degraded));
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    // With a v3 table local task 1 gets 4-7 (its half of GPU 1's domain).
    assert_eq!(sp.mask.to_string(), "0-7", "the whole domain, not a share");
    let err = sp.stderr.borrow().join("\n");
    assert!(
        err.contains("NUMA 0 CPUs 0-7 (older agent's GPU table: each task gets its GPUs' whole local CPUs"),
        "{err}"
    );
    let logs = sp.log.borrow().iter().map(|(_, l)| l.clone()).collect::<Vec<_>>().join("\n");
    assert!(logs.contains("no machine records") && logs.contains("topology --write"), "{logs}");
    // The version 3 table of the same node: a share, nothing said.
    let sp = bound(1, "1", "0,1", &[]);
    assert_eq!(sp.mask.to_string(), "4-7");
}

const MIG_5A: &str = "MIG-5a000000-7d2e-4b1a-9c3e-000000000005";
const MIG_5B: &str = "MIG-5b000000-7d2e-4b1a-9c3e-000000000005";

#[test]
fn a_mig_device_binds_to_its_parent_gpus_domain() {
    // Slurm's index of a MIG device (0 here) is not the table's: GPU 0 is on domain 0.
    assert_eq!(bound(0, MIG_5A, "0", &[]).mask.to_string(), "8-11");
    // Both tasks see both MIG devices of GPU 5: local rank 1 takes the second.
    let both = format!("{MIG_5A},{MIG_5B}");
    assert_eq!(bound(1, &both, "0,1", &[]).mask.to_string(), "12-15");
    // One MIG device per task: the peers are unknown, the task has the domain.
    let per_task = [("SLURMD_TRES_BIND", "gpu:per_task:1")];
    assert_eq!(bound(1, MIG_5B, "0", &per_task).mask.to_string(), "8-15");
    // The legacy form names the parent GPU's UUID.
    assert_eq!(bound(0, "MIG-GPU-2/1/0", "0", &[]).mask.to_string(), "0-3");
    // A MIG device the table does not know: nothing bound, and (verbose) the task is told why.
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "MIG-00000000-0000-0000-0000-000000000000".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "0-15");
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("names a MIG device that is not in the GPU table"), "{err}");
    assert!(err.contains("gpu-node-agent topology --write"), "{err}");
}

#[test]
fn omp_threads_count_the_bound_cpus() {
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.options.insert("auto-rdzv", String::new());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
    let st_sp = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "0-3");
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("4"));
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("GPUs 0 (0000:1b:00.0) NUMA 0 CPUs 0-3"), "{err}");
}

/// `--ntasks-per-node=N --gpus-per-node=8 --gpu-affinity --auto-rdzv`: every
/// task sees the node's 8 GPUs and is bound to its share by local rank; its
/// OMP_NUM_THREADS divides its bound CPUs by the GPUs of that share, not by
/// the 8 it sees (which gave 1). Without the binding nothing changes.
fn sees_every_gpu(local: u32, local_tasks: u32, affinity: bool) -> FakeSpank {
    let all = "0,1,2,3,4,5,6,7";
    let mut sp = FakeSpank::task(0, local, local);
    with_topology(&mut sp);
    sp.items.insert("LocalTaskCount", local_tasks);
    sp.items.insert("TotalTaskCount", 2 * local_tasks);
    if affinity {
        sp.options.insert("gpu-affinity", String::new());
    }
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), all.into());
    sp.env.insert("SLURM_STEP_GPUS".into(), all.into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    sp
}

#[test]
fn omp_threads_count_the_share_of_the_gpus_a_task_was_bound_to() {
    // 2 tasks: GPUs 0-3 (CPUs 0-7) and 4-7 (8-15), 8 CPUs / 4 GPUs each.
    for (local, mask) in [(0, "0-7"), (1, "8-15")] {
        let sp = sees_every_gpu(local, 2, true);
        assert_eq!(sp.mask.to_string(), mask, "task {local}");
        assert_eq!(sp.var("OMP_NUM_THREADS"), Some("2"), "task {local}");
        // Several tasks per node: no torchrun variables, the GPUs seen unchanged elsewhere.
        assert_eq!(sp.var("PET_NPROC_PER_NODE"), None, "task {local}");
        assert_eq!(sp.var("LOCAL_WORLD_SIZE"), Some("2"), "task {local}");
        let record = sp.var(rdzv::RECORD_VAR).unwrap();
        assert!(record.split(',').any(|i| i == "gpu_share=4"), "{record}");
        let err = sp.stderr.borrow().join("\n");
        assert!(
            err.contains("OMP_NUM_THREADS=2 (8 bound CPUs / 4 GPUs (this task's share of the 8 it sees))"),
            "{err}"
        );
    }
    // 8 tasks (GPU LOCAL_RANK each): every task uses all of its bound CPUs.
    for local in 0..8 {
        let sp = sees_every_gpu(local, 8, true);
        assert_eq!(sp.mask.len(), 2, "task {local}: {}", sp.mask);
        assert_eq!(sp.var("OMP_NUM_THREADS"), Some("2"), "task {local}");
        let err = sp.stderr.borrow().join("\n");
        assert!(
            err.contains("OMP_NUM_THREADS=2 (2 bound CPUs / 1 GPU (this task's share of the 8 it sees))"),
            "{err}"
        );
    }
    // One task per node (torchrun) has every GPU it sees: one process per GPU.
    let sp = sees_every_gpu(0, 1, true);
    assert_eq!(sp.var("PET_NPROC_PER_NODE"), Some("8"));
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("2"), "16 bound CPUs / 8 GPUs");
    // Not bound by the plugin: the GPUs it sees, as before (4 CPUs per task / 8).
    let sp = sees_every_gpu(1, 2, false);
    assert_eq!(sp.mask.to_string(), "0-15");
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("1"));
    assert!(sp.var(rdzv::RECORD_VAR).is_some_and(|r| !r.contains("gpu_share")));
    // The user's --cpu-bind: Slurm's binding and the old count kept.
    let mut sp = FakeSpank::task(0, 1, 1);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.options.insert("auto-rdzv", String::new());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3,4,5,6,7".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1,2,3,4,5,6,7".into());
    sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "0-15");
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("1"));
}

#[test]
fn user_cpu_bind_wins_unless_forced() {
    assert_eq!(bound(0, "4", "4,5", &[("SLURM_CPU_BIND_TYPE", "cores")]).mask.to_string(), "0-15");
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", "force,mem".into());
    sp.items.insert("LocalTaskCount", 1);

    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "4".into());
    sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores".into());
    let st_sp = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "8-15");
    assert_eq!(sp.mem_nodes, vec![1], "mem prefers the GPU's NUMA node");
}

#[test]
fn no_table_binds_nothing_and_says_so_once() {
    let mut sp = FakeSpank::task(0, 0, 0);
    sp.options.insert("gpu-affinity", String::new());
    let st_sp = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "0-15");
    assert_eq!(sp.errors().len(), 1);
    assert!(sp.errors()[0].contains("no usable GPU table"), "{:?}", sp.errors());
}

/// task/affinity's cyclic default put local task 0 (GPU 0, domain 0) on
/// CPUs 8-15 and task 1 (GPU 1, domain 0) on 0-7, and exported the masks
/// in every task, without any --cpu-bind from the user.
fn affinity_bound(local: u32) -> FakeSpank {
    let mut sp = FakeSpank::task(0, local, local);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.options.insert("auto-rdzv", String::new());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
    let st_sp = user_init(&mut sp, &[]).unwrap();
    // slurmstepd's per-task environment (the step's was read above).
    sp.env.insert("SLURM_STEP_GPUS".into(), local.to_string());
    sp.env.insert("SLURMD_TRES_BIND".into(), "gpu:per_task:1".into());
    sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "mask_cpu:".into());
    sp.env.insert("SLURM_CPU_BIND_LIST".into(), "0xFF00,0x00FF".into());
    sp.mask = slurm_formats::cpuset::CpuSet::parse(if local == 0 { "8-15" } else { "0-7" }).unwrap();
    task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
    sp
}

#[test]
fn task_affinity_masks_are_replaced_by_the_gpus_domain() {
    let (t0, t1) = (affinity_bound(0), affinity_bound(1));
    assert_eq!(t0.mask.to_string(), "0-3", "GPU 0's task moves to GPU 0's domain");
    assert_eq!(t1.mask.to_string(), "4-7");
    assert_eq!(t0.var("OMP_NUM_THREADS"), Some("4"));
    // With --cpu-bind given to srun (seen before fork), Slurm's mask stays.
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores".into());
    let st_sp = user_init(&mut sp, &[]).unwrap();
    sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores,mask_cpu:".into());
    sp.env.insert("SLURM_CPU_BIND_LIST".into(), "0xFF00,0x00FF".into());
    sp.mask = slurm_formats::cpuset::CpuSet::parse("8-15").unwrap();
    task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "8-15");
}

#[test]
fn under_a_device_constraint_the_task_binds_to_the_gpu_its_cgroup_has() {
    use task_plan::devices::Access;
    // `--gpus-per-task=1` on GPUs 0 and 5 under ConstrainDevices (23.11+):
    // both tasks are told local GPU 0; task 1's device cgroup has GPU 5.
    for (local, real, want) in [(0u32, 0u32, "0-7"), (1, 5, "8-15")] {
        let mut sp = FakeSpank::task(0, local, local);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", "verbose".into());
        sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
        let words = args(&["debug_dev_dir=/lab/cdev"]);
        let st = user_init(&mut sp, &words).unwrap();
        for (k, v) in [("SLURM_STEP_GPUS", "0"), ("CUDA_VISIBLE_DEVICES", "0")] {
            sp.env.insert(k.into(), v.into());
        }
        sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1+gres/nic:closest".into());
        for m in 0..8 {
            let access = if m == real { Access::Allowed } else { Access::Denied };
            sp.devices.insert(format!("/lab/cdev/nvidia{m}"), access);
        }
        task_init(&mut sp, &words, st.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), want, "task {local}");
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains(&format!("GPUs {real} (")) && err.contains(") [device cgroup] NUMA"), "{err}");
    }
    // A probe that cannot tell (no such files): the variables are used.
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.env.insert("SLURM_STEP_GPUS".into(), "4,5".into());
    let st = user_init(&mut sp, &[]).unwrap();
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "4".into());
    sp.devices.insert("/dev/nvidia0".into(), Access::Denied);
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "8-11");
}

/// Task `local` of a `--gpus-per-task=1` step on GPUs 0 and 5 under
/// ConstrainDevices (every task is told local GPU 0; from 23.11 gres.conf
/// `Cores=` may give task 0 GPU 5), its device cgroup allowing GPU `real`
/// only, run in pyxis's container: by
/// `task_init` the task is in the container's mount namespace, whose `/dev`
/// holds only its own GPU's file. With `fail`, that seam fails.
fn in_a_container(local: u32, real: u32, fail: &str) -> FakeSpank {
    use task_plan::devices::Access;
    let mut sp = FakeSpank::task(0, local, local);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
    for m in 0..8 {
        let access = if m == real { Access::Allowed } else { Access::Denied };
        sp.devices.insert(format!("/dev/nvidia{m}"), access);
    }
    let mut sp = sp.failing(fail);
    // user_init: slurmstepd, before the fork, in the host's mount namespace.
    let st = user_init(&mut sp, &[]).unwrap();
    // The forked task: Slurm's per-task variables, then pyxis's setns.
    for (k, v) in [("SLURM_STEP_GPUS", "0"), ("CUDA_VISIBLE_DEVICES", "0")] {
        sp.env.insert(k.into(), v.into());
    }
    sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1".into());
    sp.container_devices = Some([(format!("/dev/nvidia{real}"), Access::Allowed)].into());
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    sp
}

#[test]
fn in_a_container_the_device_directory_opened_before_the_fork_says_the_tasks_gpu() {
    for (local, real, want) in [(0u32, 5u32, "8-15"), (1, 0, "0-7")] {
        let sp = in_a_container(local, real, "nothing");
        // A path looked up in the container's /dev cannot tell the other GPUs.
        let by_path = sp.device_access(&task_plan::devices::device_path("/dev", 1));
        assert_eq!(by_path, task_plan::devices::Access::Unknown);
        assert_eq!(sp.mask.to_string(), want, "task {local}: bound to its own GPU's CPUs");
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains(&format!("GPUs {real} (")) && err.contains(") [device cgroup] NUMA"), "{err}");
        assert!(sp.log.borrow().is_empty(), "nothing logged when the directory opens: {:?}", sp.log.borrow());
    }
}

#[test]
fn without_the_device_directory_the_task_probes_by_path() {
    use task_plan::devices::Access;
    // Not in a container: the path probe finds the host's files, and the
    // task still binds to its own GPU (GPU 5, domain 1).
    let mut sp = FakeSpank::task(0, 1, 1);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
    for m in 0..8 {
        sp.devices.insert(format!("/dev/nvidia{m}"), if m == 5 { Access::Allowed } else { Access::Denied });
    }
    let mut sp = sp.failing("open_dev_dir");
    let st = user_init(&mut sp, &[]).unwrap();
    assert_eq!(st.as_ref().and_then(|s| s.dev_dir.as_ref()), None);
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
    sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1".into());
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "8-15");
    // One debug line, in user_init (once per step), never an error.
    let log = sp.log.borrow().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, Level::Debug, "{log:?}");
    assert!(log[0].1.starts_with("--gpu-affinity: opening the device directory: /dev: "), "{log:?}");
    assert!(log[0].1.ends_with("; tasks probe by path"), "{log:?}");

    // In a container the path cannot tell: the variables are used, and
    // task 0 (GPU 5, told local GPU 0) gets GPU 0's CPUs, what the directory
    // opened before the fork avoids. Nothing fails: the step runs.
    let sp = in_a_container(0, 5, "open_dev_dir");
    assert_eq!(sp.mask.to_string(), "0-7");
    assert!(!sp.stderr.borrow().join("\n").contains("[device cgroup]"), "{:?}", sp.stderr.borrow());
    assert!(sp.errors().is_empty(), "{:?}", sp.errors());
}

#[test]
fn the_device_directory_is_opened_once_per_step_with_gpu_affinity_only() {
    let step = |affinity: bool| {
        let mut sp = FakeSpank::task(0, 0, 0);
        with_topology(&mut sp);
        if affinity {
            sp.options.insert("gpu-affinity", String::new());
        }
        user_init(&mut sp, &args(&["debug_dev_dir=/lab/cdev"])).unwrap().unwrap()
    };
    assert_eq!(step(true).dev_dir.as_deref(), Some("/lab/cdev"), "the plugstack line's directory");
    assert_eq!(step(false).dev_dir, None, "nothing to probe without --gpu-affinity");
    // Without a GPU table nothing is bound, and nothing is opened.
    let mut sp = FakeSpank::task(0, 0, 0);
    sp.options.insert("gpu-affinity", String::new());
    assert_eq!(user_init(&mut sp, &[]).unwrap().unwrap().dev_dir, None);
}

/// `user_init` shares the node out once for what the step predicts (every
/// task sees the 8 GPUs, slurmstepd's mask); each task that sees the same
/// takes its CPUs from it, and one that does not (its cgroup gives it other
/// CPUs) plans alone: both get what they get without it.
#[test]
fn the_share_out_planned_before_the_fork_serves_the_tasks_it_fits() {
    // Local task `local` of 16 seeing the 8 GPUs, with `after_fork` for its
    // mask in task_init; `planned`: with user_init's share-out.
    let bind = |local: u32, after_fork: &str, planned: bool| {
        let mut sp = FakeSpank::task(0, local, local);
        with_topology(&mut sp);
        sp.items.insert("LocalTaskCount", 16);
        sp.options.insert("gpu-affinity", String::new());
        let all = "0,1,2,3,4,5,6,7";
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), all.into());
        sp.env.insert("SLURM_STEP_GPUS".into(), all.into());
        let mut st = user_init(&mut sp, &[]).unwrap();
        let topology = st.as_mut().and_then(|s| s.topology.as_mut()).unwrap();
        assert!(topology.node_share_out.is_some(), "user_init planned no share-out");
        if !planned {
            topology.node_share_out = None;
        }
        sp.mask = slurm_formats::cpuset::CpuSet::parse(after_fork).unwrap();
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        sp.mask
    };
    for (local, after_fork) in [(0, "0-15"), (5, "0-15"), (11, "0-15"), (6, "8-15"), (12, "0-7,12-15")] {
        let mask = bind(local, after_fork, true);
        assert_eq!(mask, bind(local, after_fork, false), "task {local} with CPUs {after_fork}");
        if after_fork == "0-15" {
            // GPU (local % 8)'s 2 CPUs, split between its 2 tasks.
            assert_eq!(mask.len(), 1, "task {local}: {mask}");
        }
    }
}

/// With `--gpu-affinity`, the OMP_NUM_THREADS set before the fork is local
/// task 0's, from its binding as user_init plans it (8 tasks, a GPU each: 2
/// CPUs); a task whose binding turns out otherwise (its cgroup gives it CPUs
/// 0-3 only: 1 CPU) sets its own.
#[test]
fn omp_threads_set_before_the_fork_is_task_0s_and_a_task_with_other_cpus_sets_its_own() {
    let run = |local: u32, after_fork: &str| {
        let mut sp = FakeSpank::task(0, local, local);
        with_topology(&mut sp);
        sp.items.insert("LocalTaskCount", 8);
        sp.options.insert("gpu-affinity", String::new());
        sp.options.insert("auto-rdzv", String::new());
        let all = "0,1,2,3,4,5,6,7";
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), all.into());
        sp.env.insert("SLURM_STEP_GPUS".into(), all.into());
        let st = user_init(&mut sp, &[]).unwrap();
        let first = st.as_ref().and_then(|s| s.topology.as_ref()).and_then(|t| t.first_task);
        assert_eq!(first, Some((2, Some(1))), "local task 0: 2 CPUs, a share of 1 GPU");
        let preset = st.as_ref().unwrap().preset.iter().find(|(n, _)| n == "OMP_NUM_THREADS").cloned();
        assert_eq!(preset, Some(("OMP_NUM_THREADS".to_owned(), "2".to_owned())));
        sp.mask = slurm_formats::cpuset::CpuSet::parse(after_fork).unwrap();
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        (sp.mask.to_string(), sp.var("OMP_NUM_THREADS").map(str::to_owned))
    };
    assert_eq!(run(5, "0-15"), ("10-11".to_owned(), Some("2".to_owned())));
    assert_eq!(run(0, "0-3"), ("0".to_owned(), Some("1".to_owned())));
}

/// The device probes are made only where a device constraint can be in
/// force: slurmstepd's TaskPlugin has task/cgroup and the cgroup.conf beside
/// its slurm.conf sets ConstrainDevices (or either cannot be told). Task 1
/// of a `--gpus-per-task=1` step on GPUs 0 and 5, told local GPU 0 (as under
/// ConstrainDevices), its device cgroup allowing GPU 5 only.
#[test]
fn devices_are_probed_only_where_a_constraint_can_be_in_force() {
    use crate::spank::StepdConf;
    use task_plan::devices::Access;
    let run = |task_plugin: Option<&str>, cgroup_conf: Option<&str>, fail: &str| {
        let mut sp = FakeSpank::task(0, 1, 1);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", String::new());
        sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
        for m in 0..8 {
            sp.devices
                .insert(format!("/dev/nvidia{m}"), if m == 5 { Access::Allowed } else { Access::Denied });
        }
        // slurmstepd names its slurm.conf, or not: then slurmd's SLURM_CONF.
        let named = !fail.contains("unnamed");
        sp.process_env.insert("SLURM_CONF", "/var/spool/slurmd/conf-cache/slurm.conf".into());
        sp.stepd_conf = task_plugin.map(|p| StepdConf {
            task_plugin: (p != "NULL").then(|| p.into()),
            path: named.then(|| "/var/spool/slurmd/conf-cache/slurm.conf".into()),
            plugstack: None,
        });
        if let Some(text) = cgroup_conf {
            sp.files.insert("/var/spool/slurmd/conf-cache/cgroup.conf".into(), text.into());
        }
        let mut sp = sp.failing(fail);
        let st = user_init(&mut sp, &[]).unwrap();
        for (k, v) in [("SLURM_STEP_GPUS", "0"), ("CUDA_VISIBLE_DEVICES", "0")] {
            sp.env.insert(k.into(), v.into());
        }
        sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1".into());
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        (sp.probes.get(), sp.mask.to_string())
    };
    let constrained = "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\n";
    // A constraint can be in force: each GPU of the table is probed, and the
    // task is bound to GPU 5's CPUs, as its device cgroup says.
    let probed = (8, "8-15".to_owned());
    assert_eq!(run(Some("task/affinity,task/cgroup"), Some(constrained), "nothing"), probed);
    assert_eq!(run(Some("task/cgroup"), None, "nothing"), probed, "cgroup.conf not found");
    assert_eq!(
        run(Some("task/cgroup"), Some(constrained), "read_trusted:/var/spool/slurmd/conf-cache/cgroup.conf"),
        probed,
        "cgroup.conf unreadable"
    );
    assert_eq!(run(None, None, "nothing"), probed, "slurmstepd's configuration not loaded");
    assert_eq!(run(Some("task/cgroup"), Some(constrained), "stepd_conf"), probed, "no slurm_conf");
    // None can: no probe. (This fake's cgroup refuses GPUs all the same; a
    // real node without a constraint refuses none, and its tasks are bound
    // by Slurm's variables, here local GPU 0's CPUs.)
    let unprobed = (0, "0-7".to_owned());
    assert_eq!(run(Some("task/affinity"), Some(constrained), "nothing"), unprobed);
    assert_eq!(run(Some("task/none"), None, "nothing"), unprobed);
    // No TaskPlugin (NULL): none from 23.11, not known before.
    let null_is_none = slurm_sys::VERSION_NUMBER >= task_plan::devices::NULL_TASK_PLUGIN_IS_NONE_SINCE;
    assert_eq!(
        run(Some("NULL"), None, "nothing"),
        if null_is_none { unprobed.clone() } else { probed.clone() }
    );
    assert_eq!(run(Some("task/cgroup,task/affinity"), Some("ConstrainCores=yes\n"), "nothing"), unprobed);
    assert_eq!(
        run(Some("task/cgroup"), Some("ConstrainCores=yes\n"), "unnamed"),
        unprobed,
        "slurmd's SLURM_CONF"
    );
}

/// The binding is applied after the variables are set (moving the task
/// first makes Slurm's setenv dearer); when it then fails, the task's
/// variables are those of a task the plugin does not bind: `OMP_NUM_THREADS`
/// and the record count the mask it kept (8 tasks seeing 8 GPUs: bound, 2
/// CPUs for a share of 1 GPU; kept, 1 CPU per task over 8 GPUs), and
/// nothing is said twice.
#[test]
fn a_binding_that_fails_after_the_variables_leaves_those_of_the_mask_kept() {
    let run = |bind: bool, fail: &str| {
        let mut sp = FakeSpank::task(0, 5, 5);
        with_topology(&mut sp);
        sp.items.insert("LocalTaskCount", 8);
        if bind {
            sp.options.insert("gpu-affinity", "verbose".into());
        }
        sp.options.insert("auto-rdzv", "verbose".into());
        let all = "0,1,2,3,4,5,6,7";
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), all.into());
        sp.env.insert("SLURM_STEP_GPUS".into(), all.into());
        let mut sp = sp.failing(fail);
        let st = user_init(&mut sp, &[]).unwrap();
        assert_eq!(task_init(&mut sp, &[], st.as_ref()), Ok(()));
        sp
    };
    let (failed, unbound, bound) = (run(true, "set_affinity"), run(false, "nothing"), run(true, "nothing"));
    assert_eq!(bound.var("OMP_NUM_THREADS"), Some("2"));
    assert_eq!(unbound.var("OMP_NUM_THREADS"), Some("1"));
    assert_eq!(failed.mask, unbound.mask, "Slurm's mask kept");
    for name in ["OMP_NUM_THREADS", rdzv::RECORD_VAR, "RANK", "LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE"] {
        assert_eq!(failed.var(name), unbound.var(name), "{name}");
    }
    // verbose: the line for the binding planned, the failure, the line for the mask kept.
    let err = failed.stderr.borrow().clone();
    assert_eq!(err.len(), 3, "{err:?}");
    assert!(err[0].contains("OMP_NUM_THREADS=2 (2 bound CPUs / 1 GPU"), "{err:?}");
    assert!(err[1].contains("sched_setaffinity") && err[1].ends_with("Slurm's binding kept"), "{err:?}");
    assert!(
        err[2].contains("OMP_NUM_THREADS=1 (") && err[2].ends_with("(again, for the CPU mask kept)"),
        "{err:?}"
    );
    assert!(!err[2].contains("replaced"), "{err:?}");
    let logged = |what: &str| failed.log.borrow().iter().filter(|(_, l)| l.starts_with(what)).count();
    assert_eq!((logged("--auto-rdzv"), logged("--gpu-affinity")), (0, 1), "{:?}", failed.log.borrow());
}

/// The kernel keeps only the CPUs of the task's cpuset of a mask it is
/// given, silently: a binding it trimmed (planned CPUs 10-11, cpuset 10) has
/// the variables of the CPUs the task has (1, not 2), said in a second
/// verbose line. And a task under an enclosing step's values (`srun` inside
/// another step's task: its `RANK=0`, its port and its record) keeps this
/// step's values through that second pass.
#[test]
fn a_trimmed_binding_has_the_variables_of_the_cpus_the_task_has() {
    let run = |cpuset: Option<&str>, enclosing: &[(String, String)]| {
        let mut sp = FakeSpank::task(0, 5, 5);
        with_topology(&mut sp);
        sp.items.insert("LocalTaskCount", 8);
        sp.options.insert("gpu-affinity", String::new());
        sp.options.insert("auto-rdzv", "verbose".into());
        let all = "0,1,2,3,4,5,6,7";
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), all.into());
        sp.env.insert("SLURM_STEP_GPUS".into(), all.into());
        for (k, v) in enclosing {
            sp.env.insert(k.clone(), v.clone());
        }
        sp.cpuset = cpuset.map(|c| slurm_formats::cpuset::CpuSet::parse(c).unwrap());
        let st = user_init(&mut sp, &[]).unwrap();
        assert_eq!(task_init(&mut sp, &[], st.as_ref()), Ok(()));
        sp
    };
    let whole = run(None, &[]);
    assert_eq!((whole.mask.to_string(), whole.var("OMP_NUM_THREADS")), ("10-11".to_owned(), Some("2")));
    // An enclosing step's values, as the plugin set them there (its task 0, another port).
    let batch = {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.items.insert("StepId", 3);
        sp.options.insert("auto-rdzv", String::new());
        let st = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        sp.env.clone()
    };
    let enclosing: Vec<(String, String)> =
        ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", rdzv::RECORD_VAR]
            .iter()
            .filter_map(|n| batch.get(*n).map(|v| ((*n).to_owned(), v.clone())))
            .collect();
    assert!(enclosing.iter().any(|(n, _)| n == rdzv::RECORD_VAR), "{batch:?}");
    for enclosing in [&[][..], &enclosing[..]] {
        let trimmed = run(Some("10"), enclosing);
        assert_eq!(trimmed.mask.to_string(), "10");
        assert_eq!(trimmed.var("OMP_NUM_THREADS"), Some("1"), "the CPU the task has, over its share's GPU");
        for name in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"] {
            assert_eq!(trimmed.var(name), whole.var(name), "{name} with {enclosing:?}");
        }
        let record = trimmed.var(rdzv::RECORD_VAR).unwrap_or_default().to_owned();
        assert!(record.contains("RANK:") && record.contains("MASTER_PORT:"), "{record}");
        let err = trimmed.stderr.borrow().clone();
        assert_eq!(err.len(), 2, "{err:?}");
        assert!(err[1].contains("OMP_NUM_THREADS=1 (1 bound CPU / 1 GPU"), "{err:?}");
        assert!(err[1].ends_with("(again: the kernel trimmed the mask to the task's cpuset)"), "{err:?}");
    }
}
