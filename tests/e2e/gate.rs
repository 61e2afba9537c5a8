//! The Epilog health gate on a cluster of its own (three nodes; slurm.conf's
//! `Epilog=` runs `gpu-node-agent epilog`; from 25.11
//! `SlurmctldParameters=enable_expedited_requeue`): a 2-node job loses a GPU
//! on node2 (an Xid 79 the agent there drains for), its tasks fail, and the
//! Epilogs run: node2's fails (the agent found it unhealthy), node3's agent
//! is hung (SIGSTOP: its Epilog ends with 0 at the gate's deadline) and node1
//! has no agent (0). From 25.11 the job, submitted with
//! `--requeue=expedite`, is requeued at once and runs again on node1 and
//! node3; before 25.11 an Epilog failure does nothing to the job (job_mgr.c
//! `batch_requeue_fini` has no expedited path), which ends FAILED. On every
//! release node2 keeps the agent's reason: Slurm's "Epilog error" drain does
//! not replace a reason already set (node_mgr.c `_drain_node`).

use std::time::{Duration, Instant};

use slurm_lab::agents;
use slurm_lab::{Lab, LabConfig, built_plugin};

use super::{job_field, ok, start_limited, wait_until};

/// The case: its own lab, started and torn down here.
pub fn the_epilog_gate_requeues_the_job_off_a_bad_node() -> Result<String, String> {
    let probe = LabConfig::default();
    let expedite = probe.release.number() >= (25, 11);
    // Beside the agent's binary, which every node (and a release's root) sees.
    let agent = agents::bin("gpu-node-agent");
    let script = agent.with_file_name(format!("gate-epilog-{}.sh", std::process::id()));
    // Slurm runs the Epilog with no PATH and an empty environment: absolute paths.
    std::fs::write(&script, format!("#!/bin/sh\nexec {} epilog --timeout 3s\n", agent.display()))
        .map_err(|e| e.to_string())?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let mut extra = vec![format!("Epilog={}", script.display()), "PrologEpilogTimeout=60".to_owned()];
    if expedite {
        extra.push("SlurmctldParameters=enable_expedited_requeue".to_owned());
    }
    let cfg = LabConfig { nodes: 3, plugin: Some(built_plugin()), extra_conf: extra, ..LabConfig::default() };
    let mut lab = start_limited(cfg).map_err(|e| format!("the gate's cluster did not start: {e}"))?;
    let result = run(&mut lab, expedite);
    let _ = std::fs::remove_file(&script);
    result
}

fn run(lab: &mut Lab, expedite: bool) -> Result<String, String> {
    for node in ["node2", "node3"] {
        agents::write_topology(lab, node)?;
    }
    let a2 = agents::start_agent(lab, "node2")?;
    agents::start_agent(lab, "node3")?;
    // The first run lands on node2 and node3 (node1 kept out until it started).
    ok(lab.command("scontrol").args([
        "update",
        "nodename=node1",
        "state=drain",
        "reason=held for the test",
    ]))?;
    let flag = lab.dir.join("out/fail-now");
    let script = format!(
        "#!/bin/bash\n\
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" = 0 ]; then\n\
           srun -N2 --ntasks-per-node=1 bash -c 'while [ ! -e {f} ]; do sleep 0.2; done; exit 1'\n\
           exit 1\n\
         fi\n\
         sleep 300\n",
        f = flag.display()
    );
    let requeue = if expedite { "--requeue=expedite" } else { "--requeue" };
    let job = lab.sbatch(&script, &["-N2", "--gres=gpu:1", requeue]).map_err(|e| e.to_string())?;
    wait_until("the job running", Duration::from_secs(30), || {
        Ok(job_field(lab, job, "JobState") == "RUNNING")
    })?;
    ensure!(
        job_field(lab, job, "NodeList") == "node[2-3]",
        "first run on {}",
        job_field(lab, job, "NodeList")
    );
    ok(lab.command("scontrol").args(["update", "nodename=node1", "state=resume"]))?;
    // node2 loses a GPU: its agent drains it with its reason; node3's agent hangs.
    agents::add_event(&a2, 3, 79)?;
    agents::wait_for(lab, "node2", Duration::from_secs(20), |s, _| agents::drained(s))?;
    let pid3 = lab.daemon_pid("agent-node3").ok_or("no agent on node3")?;
    ok(lab.command("kill").args(["-STOP", &pid3.to_string()]))?;
    std::fs::write(&flag, "").map_err(|e| e.to_string())?;
    let t = Instant::now();
    let outcome = if expedite {
        // Requeued at once (no requeue delay) and running again without node2.
        wait_until("the job running again without node2", Duration::from_secs(60), || {
            Ok(job_field(lab, job, "JobState") == "RUNNING" && job_field(lab, job, "Restarts") == "1")
        })?;
        let nodes = job_field(lab, job, "NodeList");
        ensure!(nodes == "node[1,3]", "the requeued job runs on {nodes}");
        format!("requeued and running on {nodes} {:.0} s after the failure", t.elapsed().as_secs_f64())
    } else {
        let end = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        ensure!(end == "FAILED", "job {job} ended {end}");
        format!("{end} (no expedited requeue before 25.11)")
    };
    let _ = lab.command("kill").args(["-CONT", &pid3.to_string()]).status();
    let (state2, reason2) = agents::node_info(lab, "node2");
    ensure!(reason2.starts_with("gpu: xid79 gpu3"), "node2 ({state2}) has reason '{reason2}'");
    let log2 = std::fs::read_to_string(lab.slurmd_log("node2")).unwrap_or_default();
    ensure!(
        log2.contains("node unhealthy (gpu: xid79 gpu3"),
        "node2's Epilog did not fail for the agent:\n{log2}"
    );
    for node in ["node1", "node3"] {
        let (state, reason) = agents::node_info(lab, node);
        ensure!(!agents::drained(&state), "{node} drained ({reason}): its Epilog failed");
    }
    let _ = lab.command("scancel").arg(job.to_string()).status();
    Ok(outcome)
}
