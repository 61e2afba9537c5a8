//! Issue 15's checks (PCIe link, NVLinks, NVSwitch fabric, clocks, ECC and
//! persistence modes) through the binary, the fake NVML and the stand-in for
//! slurmctld (`common`; `cargo build --workspace` first).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use gpu_node_agent::agent::Agent;
use gpu_node_agent::config::Config;

use common::{FakeGpus, H100, World, edited, healthy, healthy_passes};

// --- issue 15: PCIe link, NVLinks, fabric, clocks, ECC and persistence modes ----------

fn hgx_state(edit: impl Fn(&mut serde_json::Value)) -> String {
    edited(include_str!("../../tests/fake-nvml/states/hgx-h100x8-healthy.json"), edit)
}

/// One row of the table: its policy key, how the fake GPUs show the
/// fault, how many passes it takes, and the reason's first 20 characters.
struct Row {
    key: &'static str,
    before: fn(&mut serde_json::Value),
    fault: fn(&mut serde_json::Value),
    passes: usize,
    reason: &'static str,
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            key: "pcie_degraded",
            before: |_| {},
            fault: |s| s["gpus"][2]["pcie"]["width"] = 8.into(),
            passes: 1,
            reason: "gpu: pcie gpu2 x8/16",
        },
        Row {
            key: "nvlink_down",
            before: |_| {},
            fault: |s| s["gpus"][5]["nvlinks"][3]["state"] = "down".into(),
            passes: 1,
            reason: "gpu: nvlink gpu5 l3 ",
        },
        Row {
            key: "nvlink_errors",
            before: |_| {},
            fault: |s| s["gpus"][5]["nvlinks"][3]["crc_errors"] = 100_000.into(),
            passes: 1,
            reason: "gpu: nvlink-err gpu5",
        },
        Row {
            key: "fabric_failure",
            before: |_| {},
            fault: |s| s["gpus"][0]["fabric"]["status"] = "failure".into(),
            passes: 1,
            reason: "gpu: fabric gpu0 com",
        },
        Row {
            key: "clock_slowdown",
            before: |s| s["gpus"][3]["clock_events"] = serde_json::json!(["hw_thermal_slowdown"]),
            fault: |s| s["gpus"][3]["clock_events"] = serde_json::json!(["hw_thermal_slowdown"]),
            passes: 2,
            reason: "gpu: slowdown gpu3 h",
        },
        Row {
            key: "ecc_disabled",
            before: |_| {},
            fault: |s| s["gpus"][1]["ecc_mode"] = "disabled".into(),
            passes: 1,
            reason: "gpu: ecc-off gpu1 EC",
        },
        Row {
            key: "persistence_disabled",
            before: |_| {},
            fault: |s| s["gpus"][1]["persistence"] = false.into(),
            passes: 1,
            reason: "gpu: persist gpu1 pe",
        },
    ]
}

/// Issue 15: each row of the table, through the fake NVML and nvml-wrapper
/// (the binary, `check --act`), for each action word. Warn and ignore make
/// no Slurm change; drain drains and reboot asks for a reboot, with the
/// reason's class and GPU in `sinfo -R`'s 20 characters. `before` passes
/// (a base for the error rate, the first slowdowns) change nothing.
#[test]
fn every_link_and_mode_check_takes_every_action_word() {
    for row in rows() {
        for word in ["ignore", "warn", "drain", "reboot"] {
            let what = format!("{} = {word}", row.key);
            let w = World::new("hw", &[("n1", H100)]);
            w.config_file("n1", &format!("[policy]\n{} = \"{word}\"", row.key));
            w.gpus(&hgx_state(row.before));
            for pass in 0..row.passes {
                let (code, out) = w.run(&["check", "--act"]);
                assert_eq!(code, 0, "{what}, pass {pass}: {out}");
            }
            w.gpus(&hgx_state(row.fault));
            let (code, out) = w.run(&["check", "--act"]);
            let fault = out.lines().find(|l| l.starts_with("fault: ")).unwrap_or_default();
            assert!(fault.starts_with(&format!("fault: {}", row.reason)), "{what}: {out}");
            assert!(fault.ends_with(&format!("({word})")), "{what}: {fault}");
            let (state, reason) = w.node("n1");
            match word {
                "drain" | "reboot" => {
                    assert_eq!(code, 1, "{what}: {out}");
                    let want = if word == "drain" { "IDLE+DRAIN" } else { "IDLE+DRAIN+REBOOT_REQUESTED" };
                    assert_eq!(state, want, "{what}\n{}", w.calls());
                    assert_eq!(&reason[..20], row.reason, "{what}: {reason}");
                }
                _ => {
                    assert_eq!(code, 0, "{what}: {out}");
                    assert_eq!((state.as_str(), reason.as_str()), ("IDLE", ""), "{what}");
                    let calls = w.calls();
                    assert!(
                        calls.lines().all(|c| c.starts_with("show node")),
                        "{what}: a Slurm change:\n{calls}"
                    );
                }
            }
        }
    }
}

/// Issue 15: the defaults (drain a degraded PCIe link or a down NVLink, warn
/// for the rest), `status`'s table of every check per GPU with "n/s" where a
/// GPU lacks the feature (the fabric's "not supported" state too), and the gauges.
#[test]
fn status_shows_every_check_and_not_supported_and_defaults_apply() {
    let w = World::new("hwstatus", &[("n1", H100)]);
    w.config_file("n1", &format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    w.gpus(&hgx_state(|s| {
        s["gpus"][3]["fabric"]["state"] = "not_supported".into();
        s["gpus"][1]["ecc_mode"] = "disabled".into();
        s["gpus"][4]["nvlinks"] = serde_json::json!([]);
        for key in ["pcie", "clock_events", "ecc_mode", "persistence", "fabric", "pstate"] {
            s["gpus"][4].as_object_mut().unwrap().remove(key);
        }
    }));
    let (code, out) = w.run(&["status"]);
    assert_eq!(code, 0, "warn-only: healthy\n{out}");
    assert!(out.contains("GPU  PCIE            NVLINK     FABRIC"), "{out}");
    let row =
        |g: &str| out.lines().rfind(|l| l.starts_with(&format!("{g:<4} "))).unwrap_or_default().to_owned();
    assert_eq!(
        row("0").split_whitespace().collect::<Vec<_>>(),
        ["0", "gen5/5", "x16/16", "18/18", "up", "completed", "ok", "on", "on"]
    );
    assert_eq!(row("3").split_whitespace().nth(5), Some("n/s"), "{out}");
    assert!(row("1").contains(" OFF "), "{out}");
    assert_eq!(
        row("4").split_whitespace().collect::<Vec<_>>(),
        ["4", "n/s", "n/s", "n/s", "n/s", "n/s", "n/s"]
    );
    assert!(out.contains("n/s: not supported on this GPU, not checked\n"), "{out}");
    assert!(out.contains("ecc-off (warn)"), "{out}");

    w.gpus(&hgx_state(|s| {
        s["gpus"][2]["pcie"]["width"] = 8.into();
        s["gpus"][3]["fabric"]["state"] = "not_supported".into();
    }));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert!(w.node("n1").1.starts_with("gpu: pcie gpu2 x8/16 gen5/5"), "{:?}", w.node("n1"));
    let m = fs::read_to_string(w.dir.join("metrics.prom")).unwrap();
    for want in [
        "gpu_node_agent_gpu_check_ok{node=\"n1\",gpu=\"2\",UUID=\"GPU-5f1c0a02-7d2e-4b1a-9c3e-000000000002\",pci_bus_id=\"00000000:52:00.0\",check=\"pcie\"} 0\n",
        "check=\"pcie\"} 1\n",
        "gpu_node_agent_pcie_link_width{node=\"n1\",gpu=\"2\",",
        "gpu_node_agent_nvlinks_down{node=\"n1\",gpu=\"0\",",
    ] {
        assert!(m.contains(want), "{want}\n{m}");
    }
    let fabric_supported = |gpu: &str| {
        m.lines().any(|l| {
            l.starts_with(&format!("gpu_node_agent_gpu_check_supported{{node=\"n1\",gpu=\"{gpu}\","))
                && l.ends_with("check=\"fabric\"} 1")
        })
    };
    assert!(fabric_supported("0") && !fabric_supported("3"), "the fabric is read, n/s on GPU 3\n{m}");
}

/// Issue 15: the fabric is read from every driver generation: the versioned
/// call with the v2 struct (NVML 12.4) where the driver takes v3 and v2, or v2
/// only, and the unversioned call of older drivers. A wrong fallback reads as `n/s`.
#[test]
fn the_fabric_is_read_whatever_call_the_driver_has() {
    for version in [3, 2, 1] {
        let w = World::new("fabricv", &[("n1", H100)]);
        w.config_file("n1", "");
        w.gpus(&hgx_state(|s| {
            s["fabric_info_version"] = version.into();
            s["gpus"][0]["fabric"]["status"] = "failure".into();
            s["gpus"][1]["fabric"]["state"] = "not_started".into();
        }));
        let (_, out) = w.run(&["status"]);
        let cell = |g: &str| {
            let row = out.lines().rfind(|l| l.starts_with(&format!("{g:<4} "))).unwrap_or_default();
            row.split_whitespace().nth(5).unwrap_or_default().to_owned()
        };
        assert_eq!(
            [cell("0"), cell("1"), cell("2")],
            ["completed+failure", "not_started", "completed"],
            "fabric_info_version {version}\n{out}"
        );
    }
}

/// Issue 15: a fabric that has not registered `fabric_timeout` after boot
/// drains; before that, it is only reported. The state comes from the fake
/// NVML through `nvmlDeviceGetGpuFabricInfoV` (wrapped by `nvml_extra`).
#[test]
fn a_fabric_not_registered_after_the_timeout_drains() {
    let w = World::new("fabric", &[("n1", H100)]);
    w.gpus(&hgx_state(|s| s["gpus"][6]["fabric"]["state"] = "in_progress".into()));
    // This machine has been up for more than a second and less than 30 years.
    w.config_file("n1", "[policy]\nfabric_timeout = 1000000000");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"), "{out}");
    let (_, out) = w.run(&["status"]);
    assert!(out.lines().any(|l| l.starts_with("6 ") && l.contains(" in_progress ")), "{out}");
    w.config_file("n1", "[policy]\nfabric_timeout = \"1s\"");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN", "{out}");
    assert!(reason.starts_with("gpu: fabric gpu6 in_progress past fabric_timeout (1 s)"), "{reason}");
}

/// Issue 15: warn-only findings (ECC mode off, persistence off, a slowdown
/// past 3 checks, growing NVLink errors) make no Slurm call: the daemon loop,
/// in-process, asks Slurm for the node once at start and never again.
#[test]
fn warn_only_link_and_mode_findings_make_no_slurmctld_calls() {
    use gpu_node_agent::policy::checks::{HwSample, NvLink};
    let w = World::new("hwrpc", &[("n1", H100)]);
    let cfg = Config { poll_interval: Duration::from_millis(20), ..w.cfg("n1") };
    let mut samples = healthy(8);
    for s in &mut samples {
        s.hw = HwSample {
            ecc_mode: Some(false),
            persistence: Some(false),
            clock_events: Some(0x80),
            nvlinks: Some(vec![NvLink { link: 0, up: true, ..NvLink::default() }]),
            ..HwSample::default()
        };
    }
    let gpus = FakeGpus(Arc::new(Mutex::new(Ok(samples.clone()))));
    let mut a = Agent::with_gpus(cfg, Box::new(gpus.clone()));
    let (_tx, rx) = mpsc::channel();
    let mut warned = 0;
    let passes = healthy_passes(&mut a, &rx, 50, |pass, r| {
        warned = warned.max(r.faults.len());
        // The NVLink error counters grow by a million every pass.
        let mut next = samples.clone();
        for s in &mut next {
            s.hw.nvlinks =
                Some(vec![NvLink { link: 0, up: true, crc: pass * 1_000_000, ..NvLink::default() }]);
        }
        gpus.set(Ok(next));
    });
    assert_eq!(warned, 8 * 4, "ecc-off, persist, slowdown and nvlink-err on every GPU");
    let calls = w.calls();
    assert_eq!(calls.lines().count(), 1, "one `show node` at start, then none:\n{calls}");
    println!(
        "measured: {} scontrol call(s) over {passes} passes with {warned} warn-only findings",
        calls.lines().count()
    );
}

/// Issue 15: a degraded PCIe link goes through the same rules as an Xid: in a
/// dry run nothing is written; an admin's drain keeps its reason; once the
/// link is back (after a reboot: a PCIe link needs one) the agent resumes.
#[test]
fn a_degraded_pcie_link_follows_the_agents_rules() {
    // The generation is judged against the GPU's own maximum
    // (nvmlDeviceGetGpuMaxPcieLinkGeneration, through nvml-extra), not the
    // lower of the GPU's and the slot's: a gen-5 GPU trained at gen 4 in a gen-4
    // slot is running below what it can do. `status` shows it.
    let w = World::new("pciegpumax", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&hgx_state(|s| {
        s["gpus"][2]["pcie"]["gen"] = 4.into();
        s["gpus"][2]["pcie"]["slot_max_gen"] = 4.into();
    }));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert!(w.node("n1").1.starts_with("gpu: pcie gpu2 gen4/5 x16/16"), "{:?}", w.node("n1"));
    let (_, out) = w.run(&["status"]);
    assert!(out.lines().any(|l| l.starts_with("2 ") && l.contains(" gen4/5 x16/16 ")), "{out}");

    let w = World::new("pcierules", &[("n1", H100)]);
    let x8 = hgx_state(|s| s["gpus"][2]["pcie"]["width"] = 8.into());
    w.gpus(&x8);
    w.config_file("n1", "dry_run = true");
    let (code, out) = w.run(&["check", "--act"]);
    assert!(code == 1 && out.contains("dry run: would drain n1: gpu: pcie gpu2 x8/16"), "{out}");
    assert_eq!(w.node("n1").0, "IDLE");
    assert!(!w.calls().contains("update"), "{}", w.calls());

    w.config_file("n1", "");
    w.set_node("n1", "IDLE+DRAIN", "riser swap, says the admin");
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    assert_eq!(w.node("n1").1, "riser swap, says the admin");
    w.set_node("n1", "IDLE", "");

    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN"));
    w.gpus(&hgx_state(|_| {}));
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE+DRAIN"), "no resume before a reboot");
    fs::write(w.dir.join("boot_id"), "b2\n").unwrap();
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"), "resumed after the reboot: {out}");
}
