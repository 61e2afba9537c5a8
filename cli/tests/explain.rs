//! `spank-gpu explain --env FILE` on task environments recorded from a real
//! Slurm 22.05 (`tests/fixtures/slurm-env/22.05/`), and derived from 24.11's source
//! (`tests/fixtures/slurm-env-derived/`), shows the binding decision the
//! plugin makes for that task.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use slurm_formats::cpuset::CpuSet;
use task_plan::gputable::{GpuEntry, GpuTable};
use task_plan::topology::synthetic_xml;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/slurm-env").join(rel)
}

/// The lab's node with its GPUs interleaved: even GPUs local to CPU 1, odd to CPU 0.
fn topology_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spank-gpu-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bus: Vec<String> = (0..8).map(|i| format!("0000:{:02x}:00.0", 0x10 + i)).collect();
    let odd: Vec<&str> = bus.iter().skip(1).step_by(2).map(String::as_str).collect();
    let even: Vec<&str> = bus.iter().step_by(2).map(String::as_str).collect();
    let (cpu0, cpu1) = (CpuSet::parse("0").unwrap(), CpuSet::parse("1").unwrap());
    let xml = synthetic_xml(&[(cpu0.clone(), odd), (cpu1.clone(), even)]);
    let machine = Some(hwloc_xml_oracle::from_hwloc_xml(&xml).unwrap());
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
    std::fs::write(dir.join("gpus.tsv"), GpuTable { gpus, machine }.to_text()).unwrap();
    dir
}

fn explain(env_file: &Path, dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_spank-gpu"))
        .args(["explain", "--env"])
        .arg(env_file)
        .args(["--args", &format!("topology_dir={}", dir.display())])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn explain_shows_the_binding_decision_for_recorded_tasks() {
    let dir = topology_dir();
    // task/affinity bound task 0 (GPU 0) to CPU 0 and task 1 (GPU 1) to CPU 1: swapped.
    let t0 = explain(&fixture("22.05/affinity/gpus-per-task-1/task0.env"), &dir);
    assert!(t0.contains("--gpu-affinity: GPUs [0] -> CPUs 1 (NUMA [1])"), "{t0}");
    let t1 = explain(&fixture("22.05/affinity/gpus-per-task-1/task1.env"), &dir);
    assert!(t1.contains("--gpu-affinity: GPUs [1] -> CPUs 0 (NUMA [0])"), "{t1}");
    // Every task sees the 8 GPUs: local rank 1 takes 4-7, on both CPUs here.
    let c1 = explain(&fixture("22.05/affinity-cgroup/gpus-per-node-8/task1.env"), &dir);
    assert!(c1.contains("--gpu-affinity: GPUs [4, 5, 6, 7] -> CPUs 0-1"), "{c1}");
    // ConstrainDevices with --gpus-per-task: the environment names GPU 0 for
    // task 1, which has GPU 1, as its device cgroup says (`# gpus_openable=`).
    let file = fixture("22.05/affinity-cgroup/gpus-per-task-1/task1.env");
    let c = explain(&file, &dir);
    assert!(c.contains("--gpu-affinity: GPUs [1] -> CPUs 0 (NUMA [0])"), "{c}");
    // Without the device cgroup's answer, explain says it cannot tell instead of guessing.
    let text = std::fs::read_to_string(&file).unwrap();
    let bare = dir.join("task1-without-devices.env");
    let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("# gpus_openable=")).collect();
    std::fs::write(&bare, kept.join("\n")).unwrap();
    let c = explain(&bare, &dir);
    assert!(c.contains("nothing to decide (slurmstepd told this task the step's first GPU"), "{c}");
    // 24.11 with gres.conf Cores= (derived): task 0, told local GPU 0, has GPU 1,
    // close to the CPU Slurm bound it to; it stays there.
    let derived = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../tests/fixtures/slurm-env-derived/24.11/affinity-cgroup/gpus-per-task-1-gres-cores/task0.env",
    );
    let c = explain(&derived, &dir);
    assert!(c.contains("--gpu-affinity: GPUs [1] -> CPUs 0 (NUMA [0])"), "{c}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The step's command after `--` is read as the plugin reads `S_JOB_ARGV`:
/// a launcher flag leaves the endpoint unset, an MPI daemon gets no ranks.
#[test]
fn explain_reads_the_steps_command_after_the_double_dash() {
    let dir = std::env::temp_dir().join(format!("spank-gpu-explain-argv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env_file = dir.join("task1.env");
    std::fs::write(
        &env_file,
        "SLURM_JOB_ID=40\nSLURM_STEP_ID=0\nSLURM_STEP_NODELIST=node[1-2]\nSLURM_STEP_NUM_NODES=2\n\
         SLURM_STEP_NUM_TASKS=2\nSLURM_STEP_TASKS_PER_NODE=1(x2)\nSLURM_NODEID=1\nSLURM_PROCID=1\n\
         SLURM_LOCALID=0\n",
    )
    .unwrap();
    let run = |command: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_spank-gpu"))
            .args(["explain", "--env"])
            .arg(&env_file)
            .args(["--args", ""])
            .args(command)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = run(&[]);
    assert!(plain.contains("\n  PET_RDZV_ENDPOINT=node1:"), "{plain}");
    let flagged = run(&["--", "torchrun", "--master-port", "29577", "train.py"]);
    assert!(
        flagged.contains("PET_RDZV_ENDPOINT not set  (the command gives --master-port, which wins"),
        "{flagged}"
    );
    assert!(flagged.contains("\n  RANK=1\n"), "{flagged}");
    let daemon = run(&["--", "/usr/bin/prted", "--prtemca", "ess", "slurm"]);
    assert!(daemon.contains("\n  MASTER_ADDR=node1"), "{daemon}");
    for name in ["RANK", "LOCAL_RANK", "PET_NODE_RANK", "PET_RDZV_ENDPOINT", "JAX_COORDINATOR_PORT"] {
        assert!(!daemon.contains(&format!("\n  {name}")), "{name}: {daemon}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A task the plugin bound to its share of the GPUs it sees
/// (`--ntasks-per-node=8 --gpus-per-node=8 --gpu-affinity --auto-rdzv`,
/// local rank 3 on GPU 3's 2 CPUs): the record says the share, and explain
/// divides as the plugin did. Without it, by the GPUs the task sees.
#[test]
fn explain_divides_omp_threads_by_the_share_the_plugin_recorded() {
    let dir = std::env::temp_dir().join(format!("spank-gpu-explain-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let task = "SLURM_JOB_ID=41\nSLURM_STEP_ID=0\nSLURM_STEP_NODELIST=node1\nSLURM_STEP_NUM_NODES=1\n\
         SLURM_STEP_NUM_TASKS=8\nSLURM_STEP_TASKS_PER_NODE=8\nSLURM_NODEID=0\nSLURM_PROCID=3\n\
         SLURM_LOCALID=3\nSLURM_CPUS_PER_TASK=2\nCUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\n\
         SLURM_STEP_GPUS=0,1,2,3,4,5,6,7\n# cpus_allowed=6-7\n";
    let omp = |record: &str| {
        let env_file = dir.join("task3.env");
        std::fs::write(&env_file, format!("{task}{record}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_spank-gpu"))
            .args(["explain", "--json", "--env"])
            .arg(&env_file)
            .args(["--args", ""])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let var = v["vars"].as_array().unwrap().iter().find(|x| x["name"] == "OMP_NUM_THREADS").cloned();
        let var = var.unwrap();
        (var["value"].as_str().unwrap().to_owned(), var["why"].as_str().unwrap().to_owned())
    };
    let (value, why) = omp("SPANK_GPU_SET=cpus_per_task=2,gpu_share=1\n");
    assert_eq!(
        (value.as_str(), why.as_str()),
        ("2", "2 bound CPUs / 1 GPU (this task's share of the 8 it sees)")
    );
    // The plugin did not bind it to a share (no --gpu-affinity), or did not run.
    let (value, why) = omp("SPANK_GPU_SET=cpus_per_task=2\n");
    assert_eq!((value.as_str(), why.as_str()), ("1", "2 CPUs per task / 8 GPUs"));
    // (Without a record the task's CPUs per task are not known: 1.)
    let (value, why) = omp("");
    assert_eq!((value.as_str(), why.as_str()), ("1", "1 CPU per task / 8 GPUs"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// This machine's interfaces, as the plugin and explain read them.
fn live_interfaces() -> Vec<task_plan::netif::Interface> {
    use task_plan::netif::{Entry, group};
    let entries = node_info::getifaddrs().unwrap();
    group(entries.into_iter().map(|e| Entry::from_flags(e.name, e.flags, e.addr, e.prefix)))
}

#[test]
fn explain_says_what_nccl_and_gloo_use_on_this_node() {
    let dir = topology_dir();
    let net = "nccl_socket_net=0.0.0.0/0,::/0";
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_spank-gpu"));
        cmd.args(["explain", "--env"]).arg(fixture("22.05/affinity/gpus-per-task-1/task0.env"));
        cmd.args(["--args", &format!("topology_dir={} {net}", dir.display())]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(false);
    assert!(text.contains("\nnetwork on "), "{text}");
    assert!(text.contains("\n  NCCL: ") && text.contains("\n  gloo: "), "{text}");
    // Every running interface with an address but the loopback, link-local and virtual ones.
    let ifaces = live_interfaces();
    let nets = task_plan::netif::parse_nets("0.0.0.0/0,::/0").unwrap();
    let site_conf = Path::new("/etc/nccl.conf").exists();
    match task_plan::netif::fabric_vars(&nets, &ifaces) {
        Some((nccl, gloo)) if !site_conf => {
            let why = "(nccl_socket_net=0.0.0.0/0,::/0 on this node)";
            assert!(text.contains(&format!("  NCCL_SOCKET_IFNAME={nccl}  {why}")), "{text}");
            assert!(text.contains(&format!("  GLOO_SOCKET_IFNAME={gloo}  {why}")), "{text}");
            assert!(text.contains(&format!("    NCCL INFO Bootstrap: Using {gloo}:")), "{text}");
        }
        Some(_) => {}
        None => {
            assert!(text.contains("  note: nccl_socket_net=0.0.0.0/0,::/0: no running interface"), "{text}")
        }
    }
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    assert!(v["network"]["nccl"].is_string() && v["network"]["gloo"].is_string(), "{v}");
    assert!(v["network"]["nccl_debug_lines"].is_array(), "{v}");
}
