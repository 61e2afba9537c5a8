//! The per-job sampler's energy readings from the fake NVML, through
//! nvml-wrapper as the agent loads it, summed per job by the tally: a GPU
//! whose energy call fails or that has no counter loses its energy alone,
//! a MIG device has none (NVML's counter is the whole GPU's).
//!
//! NVML's state is per process and `FAKE_NVML_STATE` is read at `nvmlInit`,
//! so the body runs in a child process of this test binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_node_agent::sources::nvml::usage::{Reading, read_all};
use gpu_node_agent::usage::tally::Tally;
use nvml_wrapper::Nvml;
use task_plan::jobmap::{HeldGpu, JobRecord};

const CHILD_ENV: &str = "GPU_NODE_AGENT_ENERGY_CHILD";

/// The fake NVML, built beside the agent (`cargo build --workspace`).
fn fake_nvml() -> PathBuf {
    let lib = Path::new(env!("CARGO_BIN_EXE_gpu-node-agent")).with_file_name("libfake_nvml.so");
    assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
    lib
}

/// The 8×H100 MIG state (GPU 0 in MIG mode with MIG devices 0-2) with these
/// energy counters (mJ) on GPUs 0-2, GPU 2's energy call failing, GPU 3
/// and on without a counter (before Volta).
fn state(counters: [u64; 3]) -> String {
    let ready = include_str!("../../tests/fake-nvml/states/h100x8-mig.json");
    let mut s: serde_json::Value = serde_json::from_str(ready).unwrap();
    for (g, mj) in counters.iter().enumerate() {
        s["gpus"][g]["total_energy_mj"] = (*mj).into();
        s["gpus"][g]["utilization"] = serde_json::json!({"gpu": 50, "memory": 10});
    }
    s["gpus"][2]["fail"] = serde_json::json!({"energy": "UNKNOWN"});
    s.to_string()
}

fn write_state(path: &Path, json: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, json).unwrap();
    fs::rename(&tmp, path).unwrap();
}

fn energy_of(r: &Reading, gpu: u32, mig: Option<u32>) -> Option<u64> {
    r.devices.iter().find(|d| d.gpu == gpu && d.mig == mig).and_then(|d| d.energy_mj)
}

fn held(nvml: u32, mig: Option<u32>) -> HeldGpu {
    HeldGpu { nvml, mig, uuid: String::new() }
}

fn child(path: &Path) {
    let nvml = Nvml::builder().lib_path(fake_nvml().as_os_str()).init().unwrap();
    let first = read_all(&nvml);
    assert_eq!(first.error, None);
    assert_eq!(energy_of(&first, 0, None), Some(1_000_000), "a GPU in MIG mode: the whole GPU's counter");
    assert_eq!(energy_of(&first, 0, Some(1)), None, "a MIG device has no counter");
    assert_eq!(energy_of(&first, 1, None), Some(2_000_000));
    assert_eq!(energy_of(&first, 2, None), None, "its energy call fails");
    assert_eq!(energy_of(&first, 3, None), None, "no counter");
    let gpu2 = first.devices.iter().find(|d| d.gpu == 2).unwrap();
    assert_eq!((gpu2.util, gpu2.power_mw.is_some(), gpu2.mem_used.is_some()), (Some(50), true, true));

    // A job on GPUs 1-3 and one on a MIG device of GPU 0, two readings 10 s
    // apart, GPU 1 at 300 W between them.
    let jobs = [
        JobRecord { job: 7, uid: 1000, gpus: vec![held(1, None), held(2, None), held(3, None)] },
        JobRecord { job: 8, uid: 1000, gpus: vec![held(0, Some(1))] },
    ];
    let mut tally = Tally::new("node1", 10);
    tally.add(&Reading { at: 100, ..first }, &jobs);
    write_state(path, &state([4_000_000, 5_000_000, 9]));
    tally.add(&Reading { at: 110, ..read_all(&nvml) }, &jobs);
    let energies = |job| tally.summary(job).unwrap().gpus.iter().map(|g| g.energy_j).collect::<Vec<_>>();
    assert_eq!(energies(7), [Some(3_000), None, None]);
    assert_eq!(energies(8), [None]);
    let word = tally.summary(7).unwrap().to_word();
    assert!(word.contains(":e3000") && word.matches(":e").count() == 1, "{word}");
}

#[test]
fn the_sampler_reads_each_gpus_energy_and_the_tally_sums_it_per_job() {
    let name = "the_sampler_reads_each_gpus_energy_and_the_tally_sums_it_per_job";
    if std::env::var(CHILD_ENV).is_ok() {
        child(Path::new(&std::env::var("FAKE_NVML_STATE").unwrap()));
        return;
    }
    let dir = std::env::temp_dir().join(format!("agent-energy-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    write_state(&path, &state([1_000_000, 2_000_000, 3]));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("FAKE_NVML_STATE", &path)
        .output()
        .unwrap();
    let _ = fs::remove_dir_all(&dir);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}
