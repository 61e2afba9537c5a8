//! End-to-end cases of `gpu-node-agent`: one agent per namespaced node, each
//! with its own fake NVML state file, kernel-log file and boot id.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use slurm_lab::Lab;
use slurm_lab::agents::{
    AgentFiles, add_event, bin, drained, healthy_state, node_info, reset, restart_agent, run_agent,
    start_agent, start_agent_edited, wait_for,
};

use super::{CaseResult, ok, output, text, wait_until};

/// The longest a case waits for an agent's passes (it polls every 500 ms).
const PASS_LIMIT: Duration = Duration::from_secs(20);

/// Runs `case` with cleanup after it, whatever it returned.
fn with_reset(lab: &mut Lab, case: impl FnOnce(&mut Lab) -> CaseResult) -> CaseResult {
    let result = case(lab);
    let cleanup = reset(lab);
    result.and(cleanup)
}

pub fn xid79_through_nvml_drains_only_that_node(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let a1 = start_agent(lab, "node1")?;
        let a2 = start_agent(lab, "node2")?;
        a1.wait_passes(1, PASS_LIMIT)?;
        a2.wait_passes(1, PASS_LIMIT)?;
        add_event(&a2, 3, 79)?;
        let took = wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        let (_, reason) = node_info(lab, "node2");
        ensure!(reason == "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)", "reason: {reason}");
        let (sinfo, _) = ok(lab.command("sinfo").args(["-R", "-h", "-n", "node2"]))?;
        ensure!(sinfo.starts_with("gpu: xid79 gpu3"), "sinfo -R shows: {sinfo}");
        let (s1, _) = node_info(lab, "node1");
        ensure!(s1 == "IDLE", "node1 touched: {s1}");
        println!("    (Xid 79 injected → node2 drained in {:.0} ms)", took.as_secs_f64() * 1000.0);
        Ok(())
    })
}

pub fn xid79_in_the_kernel_log_drains(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let a2 = start_agent(lab, "node2")?;
        a2.wait_passes(1, PASS_LIMIT)?;
        a2.append_kmsg("6,2001,9123456789,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        let (_, reason) = node_info(lab, "node2");
        ensure!(reason == "gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)", "reason: {reason}");
        Ok(())
    })
}

pub fn application_xids_never_drain(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let a2 = start_agent(lab, "node2")?;
        a2.wait_passes(1, PASS_LIMIT)?;
        for xid in [13, 31, 43] {
            add_event(&a2, 0, xid)?;
        }
        a2.append_kmsg("6,2002,9223456789,-;NVRM: Xid (PCI:0000:1b:00): 13, Graphics Exception")?;
        // Seen (logged as ignored), then looked at in two more passes: still in service.
        wait_until("the agent ignoring the application Xids", PASS_LIMIT, || {
            Ok(a2.log(lab, "node2").matches("application error, ignored").count() >= 3)
        })?;
        a2.wait_passes(2, PASS_LIMIT)?;
        let (state, reason) = node_info(lab, "node2");
        ensure!(state == "IDLE", "node2 {state} ({reason}) after application Xids");
        Ok(())
    })
}

fn faulty_state(edit: impl Fn(&mut Value)) -> Value {
    let mut s = healthy_state();
    edit(&mut s);
    s
}

pub fn ecc_and_remap_faults_drain_or_request_a_reboot(lab: &mut Lab) -> CaseResult {
    // Volatile uncorrectable ECC → drain.
    with_reset(lab, |lab| {
        let a2 = start_agent(lab, "node2")?;
        a2.set_state(&faulty_state(|s| s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = json!(2)))?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        let (_, reason) = node_info(lab, "node2");
        ensure!(reason.starts_with("gpu: ecc-dbe gpu2"), "reason: {reason}");
        Ok(())
    })?;
    // Remap failure → drain.
    with_reset(lab, |lab| {
        let a2 = start_agent(lab, "node2")?;
        a2.set_state(&faulty_state(|s| s["gpus"][5]["remapped_rows"]["failure"] = json!(true)))?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        let (_, reason) = node_info(lab, "node2");
        ensure!(reason.starts_with("gpu: remap-fail gpu5"), "reason: {reason}");
        Ok(())
    })?;
    // Remap pending → reboot when idle (the lab's RebootProgram records it).
    with_reset(lab, |lab| {
        let a2 = start_agent(lab, "node2")?;
        a2.set_state(&faulty_state(|s| {
            s["gpus"][5]["remapped_rows"]["pending"] = json!(true);
            s["gpus"][5]["remapped_rows"]["uncorrectable"] = json!(1);
        }))?;
        let reboots = lab.dir.join("log/reboots");
        let t = Instant::now();
        while !fs::read_to_string(&reboots).unwrap_or_default().contains("node2") {
            ensure!(
                t.elapsed() < Duration::from_secs(30),
                "no reboot requested; agent log:\n{}",
                a2.log(lab, "node2")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = a2.log(lab, "node2");
        ensure!(log.contains("gpu: remap-pend gpu5"), "agent log:\n{log}");
        Ok(())
    })
}

pub fn admin_drains_are_left_alone_and_own_drains_resumed(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        ok(lab.command("scontrol").args([
            "update",
            "NodeName=node1",
            "State=DRAIN",
            "Reason=maintenance by admin",
        ]))?;
        let a1 = start_agent(lab, "node1")?;
        let a2 = start_agent(lab, "node2")?;
        a1.set_state(&faulty_state(|s| s["gpus"][0]["ecc"]["volatile"]["uncorrected"] = json!(1)))?;
        add_event(&a2, 3, 79)?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        wait_until("node1's agent leaving the admin's drain alone", PASS_LIMIT, || {
            Ok(a1.log(lab, "node1").contains("by someone else"))
        })?;
        a1.wait_passes(1, PASS_LIMIT)?;
        let (_, r1) = node_info(lab, "node1");
        ensure!(r1 == "maintenance by admin", "node1's reason overwritten: {r1}");

        // The fault clears, but a hardware fault needs a reboot first.
        a2.set_state(&healthy_state())?;
        a1.set_state(&healthy_state())?;
        // More clean passes than resume_after (2): still drained without a reboot.
        a2.wait_passes(4, PASS_LIMIT)?;
        let (s2, _) = node_info(lab, "node2");
        ensure!(drained(&s2), "node2 resumed before a reboot: {s2}");
        // Simulated reboot: a new boot id. After 2 clean checks the agent resumes its own drain.
        a2.set_boot("boot-2")?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| !drained(s))?;
        let (s1, r1) = node_info(lab, "node1");
        ensure!(drained(&s1) && r1 == "maintenance by admin", "node1 changed: {s1} {r1}");
        Ok(())
    })
}

/// Issue 11, scenario 9: every agent sees a fault at the same moment; the
/// fleet guard (2 GPU nodes at 0.5: one drain) holds, the loser of the
/// tie-break (reason time, then node name) undoes its drain, and it stays so.
pub fn the_fleet_guard_holds_when_agents_see_faults_at_once(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let half = [("max_drained_fraction = 1.0", "max_drained_fraction = 0.5")];
        let a1 = start_agent_edited(lab, "node1", &half)?;
        let a2 = start_agent_edited(lab, "node2", &half)?;
        a1.wait_passes(1, PASS_LIMIT)?;
        a2.wait_passes(1, PASS_LIMIT)?;
        let ecc = faulty_state(|s| s["gpus"][0]["ecc"]["volatile"]["uncorrected"] = json!(1));
        a1.set_state(&ecc)?;
        a2.set_state(&ecc)?;
        // Jitter (up to 1 s), the drain, the re-count 1.1 s later, a possible undo: the
        // loser says it was suppressed; then both agents look again and nothing moves.
        wait_until("one agent suppressed by the fleet guard", Duration::from_secs(20), || {
            Ok((a1.log(lab, "node1") + &a2.log(lab, "node2")).contains("SUPPRESSED by the fleet guard"))
        })?;
        a1.wait_passes(3, PASS_LIMIT)?;
        a2.wait_passes(3, PASS_LIMIT)?;
        let states = [node_info(lab, "node1").0, node_info(lab, "node2").0];
        let n = states.iter().filter(|s| drained(s)).count();
        ensure!(n == 1, "drained: {states:?}");
        a1.wait_passes(3, PASS_LIMIT)?;
        a2.wait_passes(3, PASS_LIMIT)?;
        let later = [node_info(lab, "node1").0, node_info(lab, "node2").0];
        ensure!(later == states, "the fleet changed: {states:?} -> {later:?}");
        let metrics = fs::read_to_string(a1.path("metrics.prom")).unwrap_or_default()
            + &fs::read_to_string(a2.path("metrics.prom")).unwrap_or_default();
        ensure!(
            metrics
                .lines()
                .any(|l| l.starts_with("gpu_node_agent_drains_suppressed_total") && !l.ends_with(" 0")),
            "metrics:\n{metrics}"
        );
        Ok(())
    })
}

/// Issue 11, scenario 2: a pending row remap on one GPU and an Xid 79 on
/// another, seen in one pass: the node is drained for a person, no reboot is
/// asked for.
pub fn a_drain_beats_a_reboot(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let files = AgentFiles::new(lab, "node2")?;
        files.config(lab, "node2", &bin("libfake_nvml.so"))?;
        files.set_state(&faulty_state(|s| {
            s["gpus"][5]["remapped_rows"]["pending"] = json!(true);
            s["gpus"][5]["remapped_rows"]["uncorrectable"] = json!(1);
        }))?;
        files.append_kmsg(XID79_GPU3)?;
        let (code, out) = run_agent(lab, "node2", &files, &["check", "--act"])?;
        ensure!(code == 1, "check --act: exit {code}\n{out}");
        let (state, reason) = node_info(lab, "node2");
        ensure!(drained(&state) && !state.contains("REBOOT"), "node2 {state} ({reason})");
        ensure!(reason == "gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)", "reason: {reason}");
        // A reboot request would have shown in the state above (scontrol reboot sets
        // REBOOT_REQUESTED at once); the lab's RebootProgram log agrees.
        let reboots = fs::read_to_string(lab.dir.join("log/reboots")).unwrap_or_default();
        ensure!(!reboots.contains("node2"), "a reboot was asked for: {reboots}");
        Ok(())
    })
}

const XID79_GPU3: &str =
    "6,2001,9123456789,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";

/// Issue 11, scenario 4: after a GPU reset the admin runs `clear` and resumes
/// the node; the old Xid never counts again, not even after a restart of the
/// agent that replays the kernel log; a new Xid drains again.
pub fn clear_after_a_gpu_reset(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let a2 = start_agent(lab, "node2")?;
        a2.wait_passes(1, PASS_LIMIT)?;
        a2.append_kmsg(XID79_GPU3)?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        let (code, out) = run_agent(lab, "node2", &a2, &["clear", "--gpu", "99"])?;
        ensure!(code != 0 && out.contains("no GPU 99"), "clear --gpu 99: exit {code}\n{out}");
        let (code, out) = run_agent(lab, "node2", &a2, &["clear", "--gpu", "3"])?;
        ensure!(code == 0 && out.contains("cleared 1 Xid(s) on GPU 3"), "clear: exit {code}\n{out}");
        // The admin resumes it (unless the agent, free of the Xid, already did).
        let _ = lab.command("scontrol").args(["update", "NodeName=node2", "State=RESUME"]).output();
        a2.wait_passes(3, PASS_LIMIT)?;
        let (state, reason) = node_info(lab, "node2");
        ensure!(state == "IDLE", "drained again after the clear: {state} ({reason})");
        restart_agent(lab, "node2", &a2)?;
        // The restarted agent replays the kernel log in its first passes.
        a2.wait_passes(3, PASS_LIMIT)?;
        let (state, reason) = node_info(lab, "node2");
        ensure!(
            state == "IDLE",
            "drained again after a restart: {state} ({reason})\n{}",
            a2.log(lab, "node2")
        );
        let (_, status) = run_agent(lab, "node2", &a2, &["status"])?;
        ensure!(status.contains("cleared by uid 0 at "), "status:\n{status}");
        a2.append_kmsg(&XID79_GPU3.replace("9123456789", "9323456789"))?;
        wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        Ok(())
    })
}

pub fn hanging_or_missing_nvml_never_drains(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let files = AgentFiles::new(lab, "node2")?;
        let agent = bin("gpu-node-agent").display().to_string();
        let state = files.path("nvml.json").display().to_string();
        let run = |lab: &Lab, cfg: &Path, cmd: &str| -> Result<(i32, String), String> {
            let mut c: Command = lab.command_on("node2", &agent).map_err(|e| e.to_string())?;
            c.args(["--config", &cfg.display().to_string()]).args(cmd.split_whitespace());
            let out = output(c.env("FAKE_NVML_STATE", &state))?;
            let (so, se) = text(&out);
            Ok((out.status.code().unwrap_or(-1), format!("{so}{se}")))
        };
        // Hanging: every call on GPU 0 takes 5 s, the deadline is 1 s.
        files.set_state(&faulty_state(|s| s["gpus"][0]["hang_ms"] = json!(5000)))?;
        let cfg = files.config(lab, "node2", &bin("libfake_nvml.so"))?;
        let text_cfg = fs::read_to_string(&cfg)
            .map_err(|e| e.to_string())?
            .replace("nvml_timeout = \"2s\"", "nvml_timeout = \"1s\"");
        fs::write(&cfg, text_cfg).map_err(|e| e.to_string())?;
        let (code, out) = run(lab, &cfg, "check")?;
        ensure!(code == 3 && out.contains("NVML hung"), "check with a hanging NVML: exit {code}\n{out}");
        // Missing library.
        let cfg = files.config(lab, "node2", Path::new("/nonexistent/libnvidia-ml.so.1"))?;
        let (code, out) = run(lab, &cfg, "check")?;
        ensure!(code == 3 && out.contains("NVML unavailable"), "check without NVML: exit {code}\n{out}");
        let (code, out) = run(lab, &cfg, "status")?;
        ensure!(
            code == 3 && out.contains("agent problem: NVML unavailable"),
            "status without NVML: exit {code}\n{out}"
        );
        // And --act with no NVML drains nothing.
        let (code, _) = run(lab, &cfg, "check --act")?;
        let (state, _) = node_info(lab, "node2");
        ensure!(state == "IDLE", "node2 {state} after check --act without NVML (exit {code})");
        Ok(())
    })
}

/// Issue 15: on an HGX H100 node (every link check answered), a healthy
/// node stays in service; a PCIe link trained at x8 drains it with the reason
/// in `sinfo -R`.
pub fn a_degraded_pcie_link_drains(lab: &mut Lab) -> CaseResult {
    with_reset(lab, |lab| {
        let hgx: Value = serde_json::from_str(include_str!("../fake-nvml/states/hgx-h100x8-healthy.json"))
            .map_err(|e| e.to_string())?;
        let a2 = start_agent(lab, "node2")?;
        a2.set_state(&hgx)?;
        a2.wait_passes(2, PASS_LIMIT)?;
        let (state, reason) = node_info(lab, "node2");
        ensure!(state == "IDLE", "healthy HGX state: node2 {state} ({reason})");
        let mut degraded = hgx.clone();
        degraded["gpus"][2]["pcie"]["width"] = json!(8);
        a2.set_state(&degraded)?;
        let took = wait_for(lab, "node2", Duration::from_secs(15), |s, _| drained(s))?;
        let (_, reason) = node_info(lab, "node2");
        ensure!(reason.starts_with("gpu: pcie gpu2 x8/16 gen5/5"), "reason: {reason}");
        let (sinfo, _) = ok(lab.command("sinfo").args(["-R", "-h", "-n", "node2"]))?;
        ensure!(sinfo.starts_with("gpu: pcie gpu2 x8/16"), "sinfo -R shows: {sinfo}");
        println!("    (PCIe x8/16 on GPU 2 → node2 drained in {:.0} ms)", took.as_secs_f64() * 1000.0);
        Ok(())
    })
}

/// Slurm's GPU index comes from `slurmd -G` even where slurm.conf says
/// `SlurmdDebug=error` (whether `-G` prints at that level differs by release:
/// slurmd.c `_print_gres`; the agent runs `slurmd -G -v`): on node2, whose
/// gres.conf lists minors 4-7 before 0-3, index 0 is minor 4.
pub fn the_gpu_index_comes_from_slurmd_with_slurmd_debug_error(lab: &mut Lab) -> CaseResult {
    let quiet = lab.dir.join("etc-quiet");
    fs::create_dir_all(&quiet).map_err(|e| e.to_string())?;
    for name in ["slurm.conf", "gres.conf", "plugstack.conf", "cgroup.conf"] {
        let Ok(text) = fs::read_to_string(lab.dir.join("etc").join(name)) else { continue };
        let text = text.replace("SlurmdDebug=verbose", "SlurmdDebug=error");
        fs::write(quiet.join(name), text).map_err(|e| e.to_string())?;
    }
    let conf = quiet.join("slurm.conf");
    let table = slurm_lab::agents::write_topology_with_conf(lab, "node2", &conf)?;
    let gpus =
        fs::read_to_string(lab.node_topology_dir("node2").join("gpus.tsv")).map_err(|e| e.to_string())?;
    // The table's rows: slurm_index, minor, ...
    let first: Vec<&str> = gpus
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .find(|l| l.split('\t').next() == Some("0"))
        .map(|l| l.split('\t').collect())
        .unwrap_or_default();
    ensure!(first.get(1) == Some(&"4"), "Slurm index 0 is not minor 4 on node2:\n{gpus}\n{table}");
    // Put the ordinary table back for the cases that follow.
    slurm_lab::agents::write_topology(lab, "node2")?;
    Ok(())
}
