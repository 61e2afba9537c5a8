//! Tasks on MIG devices bind to their parent GPU's domain, through the path
//! the plugin takes in each task (`task_gpus_from_slurm`, then `plan_task`).
//!
//! The node is a Dell XE8640 (`fixtures/topologies/fluxcore_ipa20_dell-xe8640-4xH100.xml`):
//! 4 H100s, each alone on a NUMA domain of 14 cores (GPU 0: NUMA 3, 1: NUMA 1,
//! 2: NUMA 7, 3: NUMA 5). GPU 0 has three MIG devices and GPU 3 two.
//!
//! What Slurm gives a task on MIG (gpu/nvml with `AutoDetect=nvml`, drivers
//! 470.42 and later): every MIG device is a GRES of its own, so
//! `SLURM_STEP_GPUS`/`SLURM_JOB_GPUS` count MIG devices (not the physical GPUs
//! the table indexes), and `CUDA_VISIBLE_DEVICES` holds the devices' UUIDs
//! (`MIG-<uuid>`; `common_gres_set_env` writes a device's unique id when it
//! has one).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hwloc_xml_oracle::from_hwloc_xml;
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{self, SlurmTask};
use task_plan::gputable::{GpuTable, HEADER_V2};
use task_plan::topology::Topology;

const XE8640: &str = include_str!("fixtures/topologies/fluxcore_ipa20_dell-xe8640-4xH100.xml");
const V24_11: u32 = (24 << 16) | (11 << 8) | 7;

fn mig(gpu: u32, n: u32) -> String {
    format!("MIG-{gpu:08x}-{n:04x}-5e6f-8a7b-0c1d2e3f4a5b")
}

/// The node and its table, as the agent writes it and the plugin reads it.
fn node() -> (Topology, GpuTable) {
    let t = from_hwloc_xml(XE8640).unwrap();
    let mut text = format!("{HEADER_V2}\n");
    for (g, i) in t.nvidia_gpus().zip(0u32..) {
        let numa: Vec<String> = g.numa_nodes.iter().map(u32::to_string).collect();
        let migs: Vec<String> = match i {
            0 => (0..3).map(|n| mig(0, n)).collect(),
            3 => (0..2).map(|n| mig(3, n)).collect(),
            _ => vec!["-".to_owned()],
        };
        let (bus, numa, cpus, migs) = (g.bus_id.hwloc(), numa.join(","), &g.cpus, migs.join(","));
        text.push_str(&format!("{i}\t{i}\t{bus}\tGPU-{i:08}\t{numa}\t{cpus}\t{migs}\n"));
    }
    let rows = GpuTable::parse(&text).unwrap();
    // Version 3: the rows and the machine, read back as the plugin reads them.
    let table = GpuTable::parse(&GpuTable { machine: Some(t), ..rows }.to_text()).unwrap();
    (table.topology().0.into_owned(), table)
}

fn domain(numa: u32) -> CpuSet {
    let (t, _) = node();
    t.numa_nodes.iter().find(|n| n.os_index == numa).unwrap().cpus.clone()
}

/// Plans local task `local_id` of `local_tasks` with this environment, under
/// task/none (every task may use the whole node).
fn plan(
    table: &GpuTable,
    local_id: u32,
    local_tasks: u32,
    env: &[(&str, &str)],
) -> Result<(Vec<u32>, CpuSet), String> {
    let (topology, _) = node();
    let env: BTreeMap<&str, String> = env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let lookup = |k: &str| env.get(k).cloned();
    let all = CpuSet::parse("0-223").unwrap();
    // As the plugin reads it before the tasks fork: Slurm's numbers, here MIG GRES indices.
    let step_gpus = env.get("SLURM_STEP_GPUS").and_then(|s| binding::gpu_indices(s, table));
    let task = SlurmTask {
        local_id,
        local_tasks,
        step_gpus,
        env: &lookup,
        own: all,
        slurm_version: V24_11,
        devices: task_plan::devices::DeviceView::Unknown,
    };
    let share = binding::task_gpus_from_slurm(table, &task)?;
    let (allowed, _) = binding::step_cpus(&task);
    let b = binding::plan_task(&topology, table, &share, &allowed);
    assert_eq!(b.note, None, "task {local_id}");
    Ok((share.gpus(), b.cpus))
}

#[test]
fn a_new_style_mig_uuid_binds_to_its_parent_gpus_domain() {
    let (_, table) = node();
    // The second MIG device of GPU 3 (NUMA 5). Slurm's index of the MIG
    // device (4, or 0 for the first) names no GPU of the table, or another one.
    for step in ["4", "0"] {
        let cvd = mig(3, 1);
        let env =
            [("CUDA_VISIBLE_DEVICES", cvd.as_str()), ("SLURM_STEP_GPUS", step), ("SLURM_JOB_GPUS", step)];
        let (gpus, cpus) = plan(&table, 0, 1, &env).unwrap();
        assert_eq!(gpus, vec![3], "SLURM_STEP_GPUS={step}");
        assert_eq!(cpus, domain(5), "SLURM_STEP_GPUS={step}");
    }
}

#[test]
fn tasks_sharing_the_mig_devices_of_one_gpu_split_its_domain() {
    let (_, table) = node();
    // `--gres=gpu:1g.10gb:2 -n2`: no per-task binding, both tasks see both
    // devices (on GPU 0, NUMA 3) and take one each by local rank.
    let cvd = format!("{},{}", mig(0, 0), mig(0, 2));
    let env = [("CUDA_VISIBLE_DEVICES", cvd.as_str()), ("SLURM_STEP_GPUS", "0,2")];
    let a = plan(&table, 0, 2, &env).unwrap();
    let b = plan(&table, 1, 2, &env).unwrap();
    assert_eq!((a.0.clone(), b.0.clone()), (vec![0], vec![0]));
    assert!(a.1.intersection(&b.1).is_empty(), "{} and {} overlap", a.1, b.1);
    assert_eq!(a.1.len(), 14, "7 cores each: {}", a.1);
    assert_eq!(a.1.union(&b.1), domain(3));
}

#[test]
fn per_task_mig_devices_bind_each_task_to_its_parent() {
    let (_, table) = node();
    // `--gpus-per-task=1 -n2`, with and without ConstrainDevices (then
    // SLURM_STEP_GPUS is local and every task is told 0).
    for constrain in [false, true] {
        for (i, (cvd, global, numa, gpu)) in
            [(mig(0, 2), "2", 3, 0), (mig(3, 0), "3", 5, 3)].iter().enumerate()
        {
            let step = if constrain { "0" } else { global };
            let env = [
                ("CUDA_VISIBLE_DEVICES", cvd.as_str()),
                ("SLURM_STEP_GPUS", step),
                ("SLURMD_TRES_BIND", "gpu:per_task:1"),
            ];
            let (gpus, cpus) = plan(&table, u32::try_from(i).unwrap(), 2, &env).unwrap();
            assert_eq!(gpus, vec![*gpu], "task {i}, constrain {constrain}");
            assert_eq!(cpus, domain(*numa), "task {i}, constrain {constrain}");
        }
    }
}

#[test]
fn the_legacy_mig_form_still_binds_and_a_stale_table_says_so() {
    let (_, table) = node();
    let (gpus, cpus) = plan(&table, 0, 1, &[("CUDA_VISIBLE_DEVICES", "MIG-GPU-00000002/1/0")]).unwrap();
    assert_eq!((gpus, cpus), (vec![2], domain(7)));
    // A MIG device made after the table was written.
    let cvd = mig(1, 0);
    let e = plan(&table, 0, 1, &[("CUDA_VISIBLE_DEVICES", cvd.as_str())]).unwrap_err();
    assert!(e.contains("MIG device") && e.contains("gpu-node-agent topology --write"), "{e}");
    // A version 1 table has no MIG devices: new-style UUIDs are not found.
    let v2 = GpuTable { machine: None, ..table.clone() }.to_text();
    let v1 = v2.replace("table v2", "table v1").replace("\tmig\n", "\n");
    let v1: String = v1
        .lines()
        .map(|l| if l.starts_with('#') { l.to_owned() } else { l.rsplit_once('\t').unwrap().0.to_owned() })
        .map(|l| l + "\n")
        .collect();
    let old = GpuTable::parse(&v1).unwrap();
    assert!(old.gpus.iter().all(|g| g.mig_uuids.is_empty()));
    let cvd = mig(3, 1);
    assert!(plan(&old, 0, 1, &[("CUDA_VISIBLE_DEVICES", cvd.as_str())]).is_err());
}
