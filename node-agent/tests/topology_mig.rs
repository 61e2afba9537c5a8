//! `gpu-node-agent topology` on a node in MIG mode: the table it writes lists
//! each GPU's MIG devices, so a task given a MIG device binds like its parent
//! GPU. NVML is the fake library (build the workspace first: `cargo build
//! --workspace`) with the ready state `h100x8-mig.json` (GPU 0 and GPU 5 in
//! MIG mode, the others with MIG off); the topology is a synthetic XML with
//! the same bus ids, GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use slurm_formats::cpuset::CpuSet;
use task_plan::gputable::GpuTable;

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");
const MIG: &str = include_str!("../../tests/fake-nvml/states/h100x8-mig.json");
const HEALTHY: &str = include_str!("../../tests/fake-nvml/states/h100x8-healthy.json");
const NUMA0: &str = "0-55,112-167";
const NUMA1: &str = "56-111,168-223";

struct Run {
    dir: PathBuf,
    stdout: String,
    stderr: String,
}

/// Runs `gpu-node-agent topology --xml XML ARGS` with `state` as the fake
/// NVML's state, in a fresh directory (the table goes to `DIR/topology`).
fn topology(name: &str, state: &str, args: &[&str]) -> Run {
    let dir = std::env::temp_dir().join(format!("agent-topology-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let lib = Path::new(AGENT).with_file_name("libfake_nvml.so");
    assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
    fs::write(dir.join("nvml.json"), state).unwrap();
    let nvml: serde_json::Value = serde_json::from_str(state).unwrap();
    let bus = |i: usize| nvml["gpus"][i]["pci_bus_id"].as_str().unwrap().to_owned();
    let buses: Vec<String> = (0..8).map(bus).collect();
    let refs: Vec<&str> = buses.iter().map(String::as_str).collect();
    let xml = task_plan::topology::synthetic_xml(&[
        (CpuSet::parse(NUMA0).unwrap(), refs[..4].to_vec()),
        (CpuSet::parse(NUMA1).unwrap(), refs[4..].to_vec()),
    ]);
    fs::write(dir.join("node.xml"), xml).unwrap();
    let d = dir.display();
    let config = format!(
        "node_name = \"node1\"\nnvml_library = \"{}\"\nkmsg_path = \"\"\nstate_dir = \"{d}/state\"\n\
         topology_dir = \"{d}/topology\"\nslurmd = \"/bin/false\"\n",
        lib.display()
    );
    fs::write(dir.join("config.toml"), config).unwrap();
    let xml_path = dir.join("node.xml");
    let out = Command::new(AGENT)
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("topology")
        .arg("--xml")
        .arg(&xml_path)
        .args(args)
        .env("FAKE_NVML_STATE", dir.join("nvml.json"))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "topology failed:\n{stdout}\n{stderr}");
    Run { dir, stdout, stderr }
}

fn mig_uuid(gpu: u32, index: u32) -> String {
    let nvml: serde_json::Value = serde_json::from_str(MIG).unwrap();
    let instances = nvml["gpus"][gpu as usize]["mig"]["instances"].as_array().unwrap();
    let found =
        instances.iter().zip(0u64..).find(|(m, i)| m["index"].as_u64().unwrap_or(*i) == u64::from(index));
    found.unwrap().0["uuid"].as_str().unwrap().to_owned()
}

#[test]
fn the_written_table_lists_each_gpus_mig_devices() {
    let run = topology("mig", MIG, &["--write"]);
    let text = fs::read_to_string(run.dir.join("topology/gpus.tsv")).unwrap();
    assert!(text.starts_with("# spank-gpu gpu table v3\n"), "{text}");
    let table = GpuTable::parse(&text).unwrap();
    assert_eq!(table.gpus.len(), 8);
    // Version 3 carries the machine, as hwloc read the XML: no XML is written beside it.
    let machine = table.machine.as_ref().expect("the machine records");
    assert_eq!(machine.numa_nodes.len(), 2);
    assert_eq!((machine.cores.len(), machine.allowed_cpus.to_string()), (224, "0-223".to_owned()));
    assert_eq!(machine.nvidia_gpus().count(), 8);
    assert!(!run.dir.join("topology/topology.xml").exists());
    // In MIG device index order; GPU 5's indices are 0 and 3.
    assert_eq!(table.gpus[0].mig_uuids, (0..3).map(|i| mig_uuid(0, i)).collect::<Vec<_>>());
    assert_eq!(table.gpus[5].mig_uuids, vec![mig_uuid(5, 0), mig_uuid(5, 3)]);
    // MIG off or not in MIG mode: none, and no note about it.
    for i in [1, 2, 3, 4, 6, 7] {
        assert!(table.gpus[i].mig_uuids.is_empty(), "GPU {i}: {:?}", table.gpus[i].mig_uuids);
    }
    assert!(!run.stderr.contains("MIG"), "{}", run.stderr);
    // What the plugin does with a task's CUDA_VISIBLE_DEVICES: the parent GPU, its domain.
    let parent = table.by_uuid(&mig_uuid(5, 3)).unwrap();
    assert_eq!((parent.slurm_index, parent.cpus.to_string()), (5, NUMA1.to_owned()));
    assert_eq!(table.by_uuid(&mig_uuid(0, 1)).unwrap().cpus.to_string(), NUMA0);
    // The table printed is the table written.
    assert_eq!(run.stdout, text);
    let _ = fs::remove_dir_all(&run.dir);
}

#[test]
fn json_output_has_the_mig_devices_too() {
    let run = topology("mig-json", MIG, &["--json"]);
    let rows: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(rows[5]["mig"], serde_json::json!([mig_uuid(5, 0), mig_uuid(5, 3)]));
    assert_eq!(rows[1]["mig"], serde_json::json!([]));
    let _ = fs::remove_dir_all(&run.dir);
}

#[test]
fn gpus_without_mig_support_have_none_and_no_error() {
    let run = topology("no-mig", HEALTHY, &["--write"]);
    assert!(!run.stderr.contains("removed"), "{}", run.stderr);
    // An older agent's hwloc XML beside the table is removed at the next write.
    fs::write(run.dir.join("topology/topology.xml"), "<topology/>").unwrap();
    let again = Command::new(AGENT)
        .arg("--config")
        .arg(run.dir.join("config.toml"))
        .args(["topology", "--write", "--xml"])
        .arg(run.dir.join("node.xml"))
        .env("FAKE_NVML_STATE", run.dir.join("nvml.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        again.status.success() && stderr.contains("removed") && stderr.contains("topology.xml"),
        "{stderr}"
    );
    assert!(!run.dir.join("topology/topology.xml").exists());
    let table = GpuTable::parse(&fs::read_to_string(run.dir.join("topology/gpus.tsv")).unwrap()).unwrap();
    assert_eq!(table.gpus.len(), 8);
    assert!(table.gpus.iter().all(|g| g.mig_uuids.is_empty()));
    assert!(!run.stderr.contains("MIG"), "{}", run.stderr);
    let _ = fs::remove_dir_all(&run.dir);
}
