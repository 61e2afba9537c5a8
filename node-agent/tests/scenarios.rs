//! Fleet scenarios of issues 11 and 12, in-process against a stateful
//! stand-in for slurmctld (`common`). The GPUs are a stand-in too (`Gpus`),
//! or the fake NVML library where the binary runs (`cargo build --workspace`
//! first).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use gpu_health::xid::Action;
use gpu_node_agent::agent::{Agent, Verdict};
use gpu_node_agent::config::Config;
use gpu_node_agent::policy::health::{GpuSample, Remap, XidEvent, XidSource};
use gpu_node_agent::slurm::{Slurm, SlurmErrorKind};
use gpu_node_agent::sources::kmsg::KmsgReader;
use gpu_node_agent::sources::nvml::ProbeError;
use gpu_node_agent::{agent, daemon};

use common::{AGENT, FakeGpus, H100, World, XID79_GPU3, fake_nvml, healthy, healthy_passes, nvml_state};

fn remap_pending() -> Vec<GpuSample> {
    let mut s = healthy(8);
    s[5].remap = Some(Remap { uncorrectable: 1, pending: true, ..Remap::default() });
    s
}

fn xid(x: u32, gpu: u32) -> XidEvent {
    XidEvent { xid: x, gpu: Some(gpu), bus: None, source: XidSource::Nvml, kmsg_us: None, nvlink: None }
}

/// Point 1.
#[test]
fn mig_nodes_are_not_missing_gpus() {
    let w = World::new("mig", &[("m1", "gpu:1g.10gb:28,gpu:2g.20gb:12")]);
    let mut a = Agent::with_gpus(w.cfg("m1"), Box::new(FakeGpus::healthy(8)));
    let r = a.pass(true);
    assert_eq!(r.verdict, Verdict::Healthy, "{:?}", r.faults);
    assert!(r.faults.is_empty(), "{:?}", r.faults);
    assert_eq!(w.node("m1").0, "IDLE");
}

/// Point 2.
#[test]
fn a_drain_always_beats_a_reboot() {
    let w = World::new("drainwins", &[("n1", H100)]);
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus.clone()));
    a.record_xid(xid(79, 3));
    a.pass(true);
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN");
    assert!(reason.starts_with("gpu: xid79 gpu3"), "{reason}");
    assert!(!w.calls().contains("reboot"), "{}", w.calls());

    // A reboot already requested, then a drain-class fault: the reboot is cancelled, the node drained.
    let w = World::new("escalate", &[("n1", H100)]);
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus.clone()));
    a.pass(true);
    assert_eq!(w.node("n1").0, "IDLE+DRAIN+REBOOT_REQUESTED");
    a.record_xid(xid(79, 3));
    a.pass(true);
    let (state, reason) = w.node("n1");
    assert!(state == "IDLE+DRAIN" && reason.starts_with("gpu: xid79 gpu3"), "{state} {reason}");
    assert!(w.calls().contains("cancel_reboot n1"), "{}", w.calls());
}

/// Point 3.
#[test]
fn a_refused_reboot_falls_back_to_a_drain_in_the_same_pass() {
    let w = World::new("noreboot", &[("n1", H100)]);
    w.mode("noreboot");
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus));
    let r = a.pass(true);
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN", "{r:?}");
    assert!(reason.starts_with("gpu: remap-pend gpu5"), "{reason}");
    assert!(r.actions.iter().any(|x| x.contains("reboot refused")), "{:?}", r.actions);
    assert_eq!(a.state.drain.as_ref().unwrap().action, "drain");
}

/// Point 5.
#[test]
fn reboots_have_a_cap() {
    let w = World::new("cap", &[("n1", H100)]);
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus));
    for boot in 1..=3 {
        fs::write(w.dir.join("boot_id"), format!("b{boot}\n")).unwrap();
        // Slurm rebooted the node and resumed it (nextstate=RESUME).
        w.set_node("n1", "IDLE", "");
        a.pass(true);
        let (state, reason) = w.node("n1");
        if boot < 3 {
            assert_eq!(state, "IDLE+DRAIN+REBOOT_REQUESTED", "boot {boot}");
        } else {
            assert_eq!(state, "IDLE+DRAIN", "third time: a drain for a person");
            assert!(reason.ends_with("still there after 2 reboots"), "{reason}");
        }
    }
    assert_eq!(w.calls().matches("reboot ASAP").count(), 2, "{}", w.calls());
    assert_eq!(a.state.reboots.get("remap-pend gpu5"), Some(&2), "recorded in the state");
}

/// Point 8.
#[test]
fn an_admins_reason_is_never_taken_for_the_agents() {
    let w = World::new("admin", &[("n1", H100)]);
    w.set_node("n1", "IDLE+DRAIN", "gpu: RMA ticket 42");
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    a.record_xid(xid(79, 3));
    a.pass(true);
    assert_eq!(w.node("n1").1, "gpu: RMA ticket 42");
    // Healthy, and a reason that reads like the agent's but it has no record of: not resumed.
    let w = World::new("admin2", &[("n1", H100)]);
    w.set_node("n1", "IDLE+DRAIN", "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)");
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    for _ in 0..3 {
        a.pass(true);
    }
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
    assert!(!w.calls().contains("update"), "{}", w.calls());
}

/// Point 9: ten agents see an Xid 79 at the same moment; 20 GPU nodes and 20
/// CPU-only nodes; at most 10% of the GPU nodes may be drained.
#[test]
fn the_fleet_guard_holds_when_every_agent_sees_a_fault_at_once() {
    let names: Vec<String> =
        (1..=20).map(|i| format!("gpu{i:02}")).chain((1..=20).map(|i| format!("cpu{i:02}"))).collect();
    let nodes: Vec<(&str, &str)> =
        names.iter().map(|n| (n.as_str(), if n.starts_with("gpu") { H100 } else { "(null)" })).collect();
    let w = World::new("fleet", &nodes);
    let barrier = Arc::new(Barrier::new(10));
    let mut threads = Vec::new();
    for name in names.iter().take(10) {
        let cfg = Config { max_drained_fraction: 0.1, drain_jitter: Duration::from_secs(2), ..w.cfg(name) };
        let barrier = Arc::clone(&barrier);
        threads.push(std::thread::spawn(move || {
            let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
            a.record_xid(xid(79, 3));
            barrier.wait();
            a.pass(true);
            // And once more: the held-back drains stay held back.
            a.pass(true);
            a.state.suppressed_total
        }));
    }
    let suppressed: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let drained: Vec<String> = names.iter().filter(|n| w.node(n).0.contains("DRAIN")).cloned().collect();
    assert!(!drained.is_empty() && drained.len() <= 2, "drained: {drained:?}\n{}", w.calls());
    assert!(suppressed >= 8, "{suppressed} suppressions");
}

/// Point 10: a healthy node's passes, ignored and warn-only Xids included,
/// make no scontrol call; measured on the daemon loop, in-process.
#[test]
fn a_healthy_node_and_an_xid_storm_make_no_slurmctld_calls() {
    let w = World::new("rpc", &[("n1", H100)]);
    let cfg = Config { poll_interval: Duration::from_millis(20), ..w.cfg("n1") };
    let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
    let (tx, rx) = mpsc::channel();
    for _ in 0..200 {
        for (x, g) in [(43, 0), (45, 1), (13, 2), (94, 3)] {
            tx.send(xid(x, g)).unwrap();
        }
    }
    let passes = healthy_passes(&mut a, &rx, 50, |_, _| {});
    let calls = w.calls();
    assert_eq!(calls.lines().count(), 1, "one `show node` at start (name and GRES), then none:\n{calls}");
    assert!(calls.starts_with("show node n1"), "{calls}");
    // At the default poll_interval (30 s) that is 120 passes an hour and no call after the first.
    println!(
        "measured: {} scontrol call(s) over {passes} healthy passes and 800 ignored/warn Xids",
        calls.lines().count()
    );
}

/// The daemon loop, in-process: an Xid that needs a drain acts at once.
#[test]
fn the_daemon_loop_drains_on_an_xid_at_once() {
    let w = World::new("loop", &[("n1", H100)]);
    let cfg = Config { poll_interval: Duration::from_secs(3600), ..w.cfg("n1") };
    let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
    let (tx, rx) = mpsc::channel();
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let mut passes = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            tx.send(xid(79, 3)).unwrap();
        });
        daemon::serve(
            &mut a,
            &rx,
            &stop,
            || {},
            |_, r| {
                passes += 1;
                if r.verdict == Verdict::Unhealthy || t.elapsed() > Duration::from_secs(20) {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            },
        );
    });
    assert_eq!(passes, 2, "one pass at start, one on the Xid");
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// Point 11.
#[test]
fn a_node_named_by_its_fqdn_is_found_as_slurmd_finds_it() {
    let w = World::new("fqdn", &[("node7", H100)]);
    let slurm = Slurm { scontrol: w.dir.join("scontrol"), timeout: Duration::from_secs(10) };
    let names = agent::node_name_candidates("node7.cluster.example.org");
    assert_eq!(slurm.find_node(&names).unwrap().name, "node7");
    let e = slurm.find_node(&agent::node_name_candidates("node8.cluster.example.org")).unwrap_err();
    assert!(matches!(&e.kind, SlurmErrorKind::UnknownNode(n) if n.len() == 2 && n[0] == "node8"), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("node8 or node8.cluster.example.org") && text.contains("node_name"), "{e}");
}

/// Point 12, in the daemon's terms: the kernel log's lost GPU is a fault.
#[test]
fn a_gpu_lost_without_an_xid_drains() {
    let w = World::new("lost", &[("n1", H100)]);
    let log = w.dir.join("kmsg");
    fs::write(
        &log,
        "3,900,7100000,-;NVRM: The NVIDIA GPU 0000:13:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n",
    )
    .unwrap();
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    a.pass(false);
    for e in KmsgReader::new(&log).poll().unwrap() {
        assert!(a.record_kmsg(&e));
    }
    a.pass(true);
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN");
    assert_eq!(reason, "gpu: lost gpu3 kernel: GPU has fallen off the bus (kmsg)");
}

/// Point 6, with the stand-in: only the agent's own trouble is "cannot tell".
#[test]
fn nvml_trouble_of_the_agent_never_drains() {
    let w = World::new("own", &[("n1", H100)]);
    let gpus = FakeGpus::healthy(8);
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus.clone()));
    for e in [ProbeError::Unavailable("no library".into()), ProbeError::Hung("5 s".into())] {
        gpus.set(Err(e));
        assert_eq!(a.pass(true).verdict, Verdict::Unknown);
    }
    gpus.set(Err(ProbeError::DriverMismatch("LIB_RM_VERSION_MISMATCH".into())));
    assert_eq!(a.pass(true).verdict, Verdict::Unhealthy);
    assert!(w.node("n1").1.starts_with("gpu: driver/library mismatch"), "{:?}", w.node("n1"));
}

/// Point 4, and the bad input of the `clear` command.
#[test]
fn clear_after_a_gpu_reset_and_its_bad_input() {
    let w = World::new("clear", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|_| {}));
    // Never drained: nothing to clear, and nothing written.
    let (code, out) = w.run(&["clear"]);
    assert!(code == 1 && out.contains("has not drained n1"), "{code} {out}");
    assert_eq!(w.state_file(), None);

    w.kmsg(XID79_GPU3);
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        w.node("n1"),
        ("IDLE+DRAIN".into(), "gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)".into())
    );
    let before = w.state_file();
    // Refused: 1; a usage error: 2.
    for (args, want, want_code) in [
        (&["clear", "--gpu", "99"][..], "no GPU 99", 1),
        (&["clear", "--gpu", "x"][..], "needs a GPU number", 2),
        (&["clear", "--bogus"][..], "unexpected argument '--bogus'", 2),
        (&["clear", "3"][..], "unexpected argument '3'", 2),
    ] {
        let (code, out) = w.run(args);
        let line = out.lines().find(|l| l.starts_with("gpu-node-agent: clear:")).unwrap_or_default();
        assert!(code == want_code && line.contains(want), "{args:?}: {code} {out}");
        assert_eq!(w.state_file(), before, "{args:?} changed the state file");
    }
    // The GPU was reset; the admin clears it and resumes the node.
    let (code, out) = w.run(&["clear", "--gpu", "3"]);
    assert!(code == 0 && out.contains("cleared 1 Xid(s) on GPU 3"), "{out}");
    w.set_node("n1", "IDLE", "");
    // A new agent (a restart) replays the kernel log, which still holds the Xid: it does not count.
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(w.node("n1").0, "IDLE");
    let (_, status) = w.run(&["status"]);
    assert!(status.contains("cleared by uid ") && status.contains(": GPU 3 (1 Xids"), "{status}");
    // A new Xid after the clear drains again.
    w.kmsg(&XID79_GPU3.replace("9123456789", "9223456789"));
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// Bad input: a state file of an older version stops every writer, changes nothing.
#[test]
fn a_state_file_of_an_older_version_is_refused() {
    let w = World::new("oldstate", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|_| {}));
    fs::create_dir_all(w.dir.join("state")).unwrap();
    let old = r#"{"boot_id":"b1","xids":[],"drain":{"reason":"gpu: xid79 gpu3 x","action":"drain","needs_reboot":true,"boot_id":"b1","at":1},"pending":null,"clean_checks":0}"#;
    fs::write(w.dir.join("state/state.json"), old).unwrap();
    for args in [&["clear"][..], &["check", "--act"], &["run"]] {
        let (code, out) = w.run(args);
        assert!(
            code != 0 && out.contains("format 1") && out.contains("move it away"),
            "{args:?}: {code} {out}"
        );
        assert_eq!(fs::read_to_string(w.dir.join("state/state.json")).unwrap(), old, "{args:?}");
    }
    assert_eq!(w.calls(), "", "Slurm untouched");
}

/// Point 6, through NVML: a driver/library mismatch, a GPU that needs a reset
/// and one NVML cannot open drain the node, each with a reason naming it.
#[test]
fn nvml_that_says_the_node_is_broken_drains_it() {
    for (edit, want) in [
        (
            Box::new(|s: &mut serde_json::Value| s["init_error"] = "LIB_RM_VERSION_MISMATCH".into())
                as Box<dyn Fn(&mut serde_json::Value)>,
            "gpu: driver/library mismatch",
        ),
        (
            Box::new(|s: &mut serde_json::Value| s["gpus"][1]["error"] = "RESET_REQUIRED".into()),
            "gpu: reset gpu1",
        ),
        (
            Box::new(|s: &mut serde_json::Value| s["gpus"][2]["error"] = "UNKNOWN".into()),
            "gpu: unusable gpu2",
        ),
    ] {
        let w = World::new("broken", &[("n1", H100)]);
        w.config_file("n1", "");
        w.gpus(&nvml_state(edit));
        let (code, out) = w.run(&["check", "--act"]);
        assert_eq!(code, 1, "{want}: {out}");
        assert!(w.node("n1").1.starts_with(want), "{want}: {:?}\n{out}", w.node("n1"));
    }
    // The library missing: the agent's own trouble.
    let w = World::new("nolib", &[("n1", H100)]);
    w.config_file("n1", "");
    let cfg = fs::read_to_string(w.dir.join("config.toml")).unwrap();
    fs::write(
        w.dir.join("config.toml"),
        cfg.replace(&fake_nvml().display().to_string(), "/nonexistent/libnvidia-ml.so.1"),
    )
    .unwrap();
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (3, "IDLE"), "exit 3: cannot tell");
}

/// Point 7: `status` and `check` without `--act` write nothing, not even over
/// a corrupt state file; a later good read clears the load problem.
#[test]
fn status_and_check_change_nothing_on_disk() {
    let w = World::new("readonly", &[("n1", H100)]);
    w.config_file("n1", &format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    w.gpus(&nvml_state(|s| s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 2.into()));
    fs::create_dir_all(w.dir.join("state")).unwrap();
    fs::write(w.dir.join("state/state.json"), "{ corrupt").unwrap();
    for args in [&["status"][..], &["check"]] {
        let (_, out) = w.run(args);
        assert!(out.contains("state file unreadable"), "{args:?}: {out}");
        assert_eq!(fs::read_to_string(w.dir.join("state/state.json")).unwrap(), "{ corrupt", "{args:?}");
        let files: Vec<_> =
            fs::read_dir(w.dir.join("state")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(files.len(), 1, "{args:?} left {files:?}");
        assert!(!w.dir.join("metrics.prom").exists(), "{args:?} wrote metrics");
    }
    assert_eq!(w.node("n1").0, "IDLE");
    assert!(!w.calls().contains("update"));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (_, out) = w.run(&["status"]);
    assert!(!out.contains("state file unreadable"), "a good read clears the problem:\n{out}");
    assert!(out.contains("drained by this agent: \"gpu: ecc-dbe gpu2"), "{out}");
}

/// Issue 12, point 7: `check --act` beside the daemon takes turns through the
/// lock; `check` alone does not wait for it.
#[test]
fn check_act_waits_for_the_writers_lock_and_check_does_not() {
    let w = World::new("lock", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|s| s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 2.into()));
    let store = gpu_node_agent::store::Store::new(&w.dir.join("state"));
    let held = store.lock().unwrap();
    let t = Instant::now();
    let (code, _) = w.run(&["check"]);
    assert_eq!(code, 1);
    assert!(t.elapsed() < Duration::from_secs(10));
    let mut child = Command::new(AGENT)
        .arg("--config")
        .arg(w.dir.join("config.toml"))
        .args(["check", "--act"])
        .env("FAKE_NVML_STATE", w.dir.join("nvml.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "check --act did not wait for the lock");
    assert_eq!(w.node("n1").0, "IDLE", "nothing done while another writer holds the lock");
    drop(held);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// Point 12, `scan-log`: one JSON line with the bus id.
#[test]
fn scan_log_reports_a_gpu_lost_without_an_xid() {
    let text = "[    9.123456] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: 10de:20b0) installed in this system has\n               NVRM: fallen off the bus and is not responding to commands.\n\
                [   20.000001] NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n\
                [   20.000002] NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus.\n";
    let dir = std::env::temp_dir().join(format!("agent-scanlost-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("log"), text).unwrap();
    let out = Command::new(AGENT)
        .args(["--config", "/dev/null", "scan-log"])
        .arg(dir.join("log"))
        .output()
        .unwrap();
    let out = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["event"], "gpu-lost");
    assert_eq!(lines[0]["pci"], "0000:b3:00.0");
    assert_eq!(lines[0]["action"], Action::Drain.name());
    assert!(lines[0]["xid"].is_null());
    assert_eq!(lines[1]["xid"], 79, "the companion line counts once, with its Xid");
    fs::remove_dir_all(&dir).unwrap();
}

/// Issue 25, point 2, the daemon's case: its file goes bad while it runs.
/// The corrupt file is kept aside and the state written again from the
/// daemon's memory (its last good read and what it saw since): nothing is
/// lost, its drain stays its own.
#[test]
fn a_state_file_corrupted_under_the_daemon_is_rewritten_from_its_memory() {
    let w = World::new("corruptdaemon", &[("n1", H100)]);
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    a.record_xid(xid(79, 3));
    a.pass(true);
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
    let file = w.dir.join("state-n1/state.json");
    fs::write(&file, "{\"format\":3,").unwrap();
    let r = a.pass(true);
    assert!(
        r.problems.iter().any(|p| p.contains("written again from this agent's memory")),
        "{:?}",
        r.problems
    );
    let saved: serde_json::Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["drain"]["reason"], "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)", "{saved}");
    assert_eq!(
        (saved["lost"]["history_lost"].clone(), saved["corrupt_total"].clone()),
        (false.into(), 1.into())
    );
    let kept: Vec<_> = fs::read_dir(w.dir.join("state-n1"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("state.json.corrupt-"))
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(w.calls().matches("State=DRAIN").count(), 1, "{}", w.calls());
    let r = a.pass(true);
    assert!(r.problems.is_empty() && r.state_ok, "{:?}", r.problems);
}

/// Issue 22: a node whose Slurm config has GPUs but whose `slurmd -G -v`
/// lists none: `status` says Slurm's GPU order is unknown (and `topology`
/// refuses a table in NVML's order), never silently.
#[test]
fn status_says_when_slurms_gpu_order_is_unknown() {
    let w = World::new("gpuorder", &[("n1", H100)]);
    w.config_file("n1", "slurmd = \"/bin/true\"");
    w.gpus(&nvml_state(|_| {}));
    let (_, out) = w.run(&["status"]);
    let line = out.lines().find(|l| l.starts_with("GPU table order: ")).unwrap_or_default();
    assert!(
        line.contains("UNKNOWN")
            && line.contains("printed no GPU line")
            && line.contains("configures 8 GPU(s)"),
        "{out}"
    );
    let (code, out) = w.run(&["topology", "--write"]);
    assert!(
        code != 0 && out.contains("Slurm's GPU order is unknown") && out.contains("not written"),
        "{code} {out}"
    );
}
