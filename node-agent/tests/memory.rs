//! Issue 25: the agent's memory at fleet scale, through the binary, the fake
//! NVML and the stand-in for slurmctld (`common`; `cargo build --workspace`
//! first). A corrupt state file, an Xid history of weeks, a dry run, a node
//! resumed through Slurm, NVLink5 Xids, the fleet guard among maintenance.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::time::Instant;

use common::{H100, World, XID79_GPU3, nvml_state};

/// A kernel-log record of Xid `xid` on GPU 3 (bus 61) at kernel time `us`, with `message`.
fn kmsg_line(us: u64, xid: u32, message: &str) -> String {
    format!("6,{us},{us},-;NVRM: Xid (PCI:0000:61:00): {xid}, {message}")
}

fn metric(w: &World, line_start: &str) -> Option<String> {
    let text = fs::read_to_string(w.dir.join("metrics.prom")).ok()?;
    text.lines().find(|l| l.starts_with(line_start)).map(str::to_owned)
}

fn corrupt_files(w: &World) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(w.dir.join("state"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("state.json.corrupt-"))
        .collect();
    names.sort();
    names
}

/// Point 2: a corrupt `state.json` was thrown away and overwritten, the
/// kernel log replayed from boot, and an Xid the admin had cleared drained
/// the repaired node again. Now the file is kept aside as
/// `state.json.corrupt-<time>`, `status`, the log and a metric say so, only
/// Xids after the kernel log's position then count, and no reboot is asked
/// for (the reboot counts went with the file).
#[test]
fn a_corrupt_state_file_is_kept_aside_and_its_history_not_acted_on() {
    let w = World::new("corrupt", &[("n1", H100)]);
    w.config_file("n1", &format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    w.gpus(&nvml_state(|_| {}));
    w.kmsg(XID79_GPU3);
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN"), "{out}");
    let (code, out) = w.run(&["clear", "--gpu", "3"]);
    assert_eq!(code, 0, "{out}");
    w.set_node("n1", "IDLE", "");
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"));

    fs::write(w.dir.join("state/state.json"), "{\"format\":3,\"xids\":{\"rec").unwrap();
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 0, "the cleared Xid of before does not count:\n{out}");
    assert_eq!(w.node("n1").0, "IDLE", "the repaired node was drained again:\n{out}");
    assert!(out.contains("state file was corrupt") && out.contains("kept as"), "{out}");
    let kept = corrupt_files(&w);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        fs::read_to_string(w.dir.join("state").join(&kept[0])).unwrap(),
        "{\"format\":3,\"xids\":{\"rec"
    );
    assert_eq!(
        metric(&w, "gpu_node_agent_state_lost{").as_deref(),
        Some("gpu_node_agent_state_lost{node=\"n1\"} 1")
    );
    let (_, status) = w.run(&["status"]);
    assert!(status.contains("its history is LOST") && status.contains(&kept[0]), "{status}");
    // A later run reads the new file: still nothing from before counts.
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"), "{out}");
    // An Xid after the loss counts.
    w.kmsg(&XID79_GPU3.replace("9123456789", "9223456789"));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN"), "{out}");
}

/// Point 2, the reboot counts: a reboot was asked for; after the reboot the
/// state file is corrupt. The count went with it, so the agent does not ask
/// again (before: the count started over and a reboot followed): a drain for
/// a person.
#[test]
fn after_a_lost_state_file_no_reboot_is_asked_for() {
    let w = World::new("corruptreboot", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(include_str!("../../tests/fake-nvml/states/h100x8-remap-pending-gpu5.json"));
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN+REBOOT_REQUESTED"));
    fs::write(w.dir.join("boot_id"), "b2\n").unwrap();
    w.set_node("n1", "IDLE", "");
    fs::write(w.dir.join("state/state.json"), "not json").unwrap();
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN", "{out}\n{}", w.calls());
    assert!(reason.starts_with("gpu: remap-pend gpu5") && reason.contains("no reboot"), "{reason}");
    assert_eq!(w.calls().matches("reboot ASAP").count(), 1, "{}", w.calls());
    // The admin's clear lets the agent ask for reboots again.
    let (code, out) = w.run(&["clear"]);
    assert!(code == 0 && out.contains("reboots may be asked for again"), "{out}");
}

/// Point 3: every Xid was stored until the next boot, ignored ones too, and
/// each new one was compared with the whole list (30,000 Xid 43s: a 4.5 MB
/// `state.json` and 2.8 s a pass). Now ignored Xids are counted, one record
/// per (Xid, GPU) keeps the rest, and a restart's replay of the kernel log
/// takes in nothing twice.
#[test]
fn the_xid_history_is_bounded_and_a_replay_counts_nothing_twice() {
    let w = World::new("history", &[("n1", H100)]);
    w.config_file("n1", &format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    w.gpus(&nvml_state(|_| {}));
    let mut log = String::new();
    for i in 0..20_000u64 {
        let (xid, msg) = if i % 1000 == 999 {
            (94, "pid=1, name=x, Contained")
        } else {
            (43, "pid=7, name=python, Ch 00000008")
        };
        log.push_str(&kmsg_line(1_000_000 + i, xid, msg));
        log.push('\n');
    }
    fs::write(w.dir.join("kmsg"), log).unwrap();
    for run in 0..2 {
        let t = Instant::now();
        let (code, out) = w.run(&["check", "--act"]);
        let took = t.elapsed();
        assert_eq!(code, 0, "warn and ignored Xids only:\n{out}");
        let size = fs::metadata(w.dir.join("state/state.json")).unwrap().len();
        assert!(size < 16 * 1024, "run {run}: state.json is {size} bytes");
        let ignored = metric(&w, "gpu_node_agent_xid_ignored_total{node=\"n1\",xid=\"43\"}");
        assert_eq!(
            ignored.as_deref(),
            Some("gpu_node_agent_xid_ignored_total{node=\"n1\",xid=\"43\"} 19980"),
            "run {run}"
        );
        let events = metric(&w, "gpu_node_agent_xid_events_total{node=\"n1\",xid=\"94\"}");
        assert_eq!(
            events.as_deref(),
            Some("gpu_node_agent_xid_events_total{node=\"n1\",xid=\"94\"} 20"),
            "run {run}"
        );
        println!("measured: run {run} over 20,000 Xid lines took {took:?}, state.json {size} bytes");
    }
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(w.dir.join("state/state.json")).unwrap()).unwrap();
    assert_eq!(v["xids"]["records"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["xids"]["records"][0]["count"], 20);
}

/// Point 5: a dry run adopted a drain carrying its own reason, forgot
/// drains, counted clean checks and replaced a corrupt file, all in
/// `state.json`, which the acting agent then trusted. Now it writes nothing
/// in `state_dir` and says `would adopt`, `would forget`.
#[test]
fn a_dry_run_writes_nothing_the_acting_agent_reads() {
    let w = World::new("dryrun", &[("n1", H100)]);
    w.gpus(&nvml_state(|_| {}));
    w.kmsg(XID79_GPU3);
    let reason = "gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)";
    w.set_node("n1", "IDLE+DRAIN", reason);
    w.config_file("n1", "dry_run = true");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("dry run: would adopt the drain of n1"), "{out}");
    assert!(
        !w.dir.join("state").exists(),
        "a dry run wrote in state_dir: {:?}",
        fs::read_dir(w.dir.join("state")).map(|d| d.count())
    );

    // A real drain record, then the node resumed by someone else.
    w.config_file("n1", "");
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    let before = w.state_file().unwrap();
    w.set_node("n1", "IDLE", "");
    w.config_file("n1", "dry_run = true");
    let (_, out) = w.run(&["check", "--act"]);
    assert!(out.contains("dry run: would forget"), "{out}");
    assert!(out.contains("dry run: would drain n1") || out.contains("healthy"), "{out}");
    assert_eq!(w.state_file().unwrap(), before, "a dry run changed state.json");
    // A corrupt file is left as it is, with nothing beside it.
    fs::write(w.dir.join("state/state.json"), "{ corrupt").unwrap();
    let (_, out) = w.run(&["check", "--act"]);
    assert!(out.contains("state file unreadable"), "{out}");
    assert_eq!(fs::read_to_string(w.dir.join("state/state.json")).unwrap(), "{ corrupt");
    assert!(corrupt_files(&w).is_empty());
    assert!(!w.calls().lines().any(|c| c.starts_with("update") && c.contains("RESUME")), "{}", w.calls());
}

/// Point 6: after a GPU reset, an operator resumes the node through Slurm
/// (as every runbook does) without `gpu-node-agent clear`. The agent drained
/// it again at the next pass for the Xid already handled. A resume by
/// someone else now clears what the agent knew up to then; a new Xid still
/// counts, and `status` says what happened.
#[test]
fn a_node_resumed_through_slurm_is_not_drained_again_for_the_same_xid() {
    let w = World::new("resumed", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|_| {}));
    w.kmsg(XID79_GPU3);
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN"));
    w.set_node("n1", "IDLE", "");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(w.node("n1").0, "IDLE", "drained again for the Xid already handled:\n{}", w.calls());
    let (_, status) = w.run(&["status"]);
    assert!(status.contains("cleared the node was taken over through Slurm at "), "{status}");
    // And the same with the daemon's own memory: a restart changes nothing.
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"));
    w.kmsg(&XID79_GPU3.replace("9123456789", "9223456789"));
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN"), "a new Xid counts");
}

/// Policy: NVLink5 Xids 144-150 (GB200/B200) were all warn-only; their
/// message's unit, error status and sub-code (intrinfo bits 20-25) tell a
/// fatal one from a benign one, as NVIDIA's catalog says.
#[test]
fn a_fatal_nvlink5_xid_drains_and_a_benign_one_does_not() {
    let w = World::new("nvlink5", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|_| {}));
    w.kmsg(&kmsg_line(
        5_000_000,
        149,
        "NETIR_BER_EVENT Nonfatal XC0 i0 Link 04 (0x00000013 0x00000001 0x00000000 0x00000000)",
    ));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"), "{out}");
    assert!(out.contains("fault: gpu: xid149 gpu3") && out.contains("(warn)"), "{out}");
    w.kmsg(&kmsg_line(
        6_000_000,
        149,
        "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x02500011 0x00000000 0x00000000 0x00000000)",
    ));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN");
    assert!(
        reason.starts_with(
            "gpu: xid149 gpu3 NVLink NETIR error NETIR_LINK_EVT status 0x00000000 sub-code 0x25 link 8"
        ),
        "{reason}"
    );
}

/// Policy: the fleet guard counted every drained GPU node, so a rolling
/// maintenance that drained 10 % of the fleet held back every GPU drain.
/// It counts the agents' own drains now; an admin may exempt the fatal
/// classes; a drain it holds back shows in `gpu_node_agent_drain_suppressed`.
#[test]
fn the_fleet_guard_counts_the_agents_drains_and_lets_exempt_classes_through() {
    let names: Vec<String> = (1..=20).map(|i| format!("n{i:02}")).collect();
    let nodes: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), H100)).collect();
    let w = World::new("guard", &nodes);
    let guard = |w: &World, extra: &str| {
        w.config_file(
            "n01",
            &format!("drain_jitter = 0\nmetrics_textfile = \"{}/metrics.prom\"\n{extra}", w.dir.display()),
        );
        let cfg = fs::read_to_string(w.dir.join("config.toml")).unwrap();
        fs::write(
            w.dir.join("config.toml"),
            cfg.replace("max_drained_fraction = 1.0", "max_drained_fraction = 0.1"),
        )
        .unwrap();
    };
    // A rolling maintenance: 3 of 20 drained, more than the limit of 2.
    for n in ["n10", "n11", "n12"] {
        w.set_node(n, "IDLE+DRAIN", "kernel upgrade, ticket 77");
    }
    guard(&w, "");
    w.gpus(&nvml_state(|s| s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 2.into()));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(w.node("n01").0, "IDLE+DRAIN", "held back by the maintenance's drains:\n{out}");
    w.set_node("n01", "IDLE", "");
    fs::remove_dir_all(w.dir.join("state")).unwrap();

    // Two nodes drained by agents: the limit is reached; an ECC drain is held back.
    for n in ["n13", "n14"] {
        w.set_node(n, "IDLE+DRAIN", "gpu: xid79 gpu1 GPU has fallen off the bus (nvml)");
    }
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n01").0.as_str()), (1, "IDLE"), "{out}");
    assert!(out.contains("SUPPRESSED by the fleet guard"), "{out}");
    let m = metric(&w, "gpu_node_agent_drain_suppressed{");
    assert_eq!(
        m.as_deref(),
        Some("gpu_node_agent_drain_suppressed{node=\"n01\",class=\"ecc-dbe\"} 1"),
        "{out}"
    );
    // A GPU off the bus with `fleet_guard_exempt`: drained whatever the count.
    guard(&w, "fleet_guard_exempt = [\"lost\", \"xid79\", \"xid95\"]");
    w.gpus(&nvml_state(|s| s["gpus"][5]["lost"] = true.into()));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (state, reason) = w.node("n01");
    assert!(state == "IDLE+DRAIN" && reason.starts_with("gpu: lost gpu5"), "{state} {reason}\n{out}");
    let m = metric(&w, "gpu_node_agent_drain_suppressed{");
    assert_eq!(m.as_deref(), Some("gpu_node_agent_drain_suppressed{node=\"n01\",class=\"\"} 0"));
}
