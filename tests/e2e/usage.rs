//! Per-job GPU use on the lab with accounting: the plugin's job prolog maps
//! the job to its GPUs (`/run/spank-gpu/jobs`, DCGM exporter's `hpc-jobs`),
//! the real agent samples the fake NVML every second and sums per job, and
//! `spank-gpu usage`/`autopsy` read it back: live through `srun --overlap`
//! while the job runs, from the job's `AdminComment` after.

use std::fs;
use std::time::Duration;

use serde_json::{Value, json};
use slurm_lab::Lab;
use slurm_lab::agents::{self, AgentFiles};

use super::{CaseResult, job_field, output, text, wait_until};

fn spank_gpu(lab: &Lab, args: &[&str]) -> Result<(i32, String, String), String> {
    let out = output(lab.command(&agents::bin("spank-gpu").display().to_string()).args(args))?;
    let (so, se) = text(&out);
    Ok((out.status.code().unwrap_or(-1), so, se))
}

fn json_of(lab: &Lab, cmd: &str, job: u32) -> Result<Value, String> {
    let (rc, so, se) = spank_gpu(lab, &[cmd, &job.to_string(), "--json"])?;
    ensure!(rc == 0, "spank-gpu {cmd} {job} --json exited {rc}:\n{so}{se}");
    serde_json::from_str(so.trim()).map_err(|e| format!("spank-gpu {cmd} --json: not JSON ({e}):\n{so}{se}"))
}

/// The fake NVML of `node`: GPU `g` at `util(g)` percent, with one process
/// and memory in use where it is busy.
fn set_use(files: &AgentFiles, util: impl Fn(usize) -> u32) -> CaseResult {
    files.set_state(&use_state(util, |_| None))
}

/// That state, each GPU's energy counter at `energy_mj(g)` (none: the call
/// is not supported there).
fn use_state(util: impl Fn(usize) -> u32, energy_mj: impl Fn(usize) -> Option<u64>) -> Value {
    let mut state = agents::healthy_state();
    for g in 0..8 {
        let u = util(g);
        state["gpus"][g]["utilization"] = json!({"gpu": u, "memory": u / 2});
        if u > 0 {
            state["gpus"][g]["memory_used"] = json!(40u64 << 30);
            state["gpus"][g]["processes"] = json!([{"pid": 4000 + g, "used_memory": 40u64 << 30}]);
        }
        if let Some(mj) = energy_mj(g) {
            state["gpus"][g]["total_energy_mj"] = json!(mj);
        }
    }
    state
}

/// DCGM exporter's mapping files of `node`: (file name, contents).
fn mapping(lab: &Lab, node: &str) -> Vec<(String, String)> {
    let dir = lab.node_run_dir(node).join("hpc-jobs");
    let mut out: Vec<(String, String)> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    (!name.starts_with('.')).then(|| (name, fs::read_to_string(e.path()).unwrap_or_default()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The job's `AdminComment` in accounting (where the agents write it once the
/// job has ended) holds a summary from each of `nodes`.
fn wait_admin_comment(lab: &Lab, job: u32, nodes: usize) -> CaseResult {
    wait_until(&format!("job {job}'s AdminComment with {nodes} summaries"), Duration::from_secs(30), || {
        let id = job.to_string();
        let out = output(lab.command("sacct").args(["-j", &id, "-X", "-n", "-P", "-o", "AdminComment"]))?;
        Ok(text(&out).0.matches("sgu1;").count() == nodes)
    })
}

/// The agent's log line for a summary it could not write to accounting.
const NOT_KEPT: &str = "the job's GPU use is kept only in this log";

fn gpus_of(v: &Value) -> Vec<Value> {
    v["gpus"].as_array().cloned().unwrap_or_default()
}

fn util_mean(g: &Value) -> f64 {
    g["util_mean"].as_f64().unwrap_or(-1.0)
}

/// `sbatch -N1 --gres=gpu:8` with no `-n`, GPUs 0-3 at 95 % and 4-7 idle:
/// while it runs, DCGM exporter's files name it for all 8 GPUs, the metrics
/// carry its `job` label and `spank-gpu usage` reads the node live; after,
/// the files are gone and `autopsy`/`usage` report 8 GPUs, 0-3 near 95 %,
/// 4-7 at 0, and that 4 were never used. Energy: each GPU's counter moves
/// once during the job, by 100 (g + 1) J (under the agent's 5 kW
/// misreading bound at one reading a second), and each GPU's
/// `energy_joules` is that step; GPU 5's energy call fails and GPU 6 has no counter: unknown
/// (null), their other figures kept.
pub fn usage_of_a_job_that_uses_half_its_gpus(lab: &mut Lab) -> CaseResult {
    agents::write_topology(lab, "node2")?;
    let files = agents::start_agent(lab, "node2")?;
    let util = |g: usize| if g < 4 { 95 } else { 0 };
    let base = |g: usize| u64::try_from(g).unwrap_or(0) * 7_000_000 + 1_000_000_000;
    let energy = |step: u64| {
        move |g: usize| (g != 6).then(|| base(g) + step * (u64::try_from(g).unwrap_or(0) + 1) * 100_000)
    };
    let with_fail = |mut state: Value| {
        state["gpus"][5]["fail"] = json!({"energy": "UNKNOWN"});
        state
    };
    files.set_state(&with_fail(use_state(util, energy(0))))?;
    let job = lab
        .sbatch("#!/bin/bash\nsleep 30\n", &["-N1", "-w", "node2", "--gres=gpu:8", "--job-name=half-idle"])
        .map_err(|e| e.to_string())?;
    let result = (|| {
        wait_until("the job running", Duration::from_secs(20), || {
            Ok(job_field(lab, job, "JobState") == "RUNNING")
        })?;
        let want: Vec<(String, String)> = (0..8).map(|g| (g.to_string(), format!("{job}\n"))).collect();
        wait_until("DCGM exporter's files naming the job", Duration::from_secs(10), || {
            Ok(mapping(lab, "node2") == want)
        })?;
        let label = format!("gpu_node_agent_job_gpu_utilization{{node=\"node2\",job=\"{job}\",gpu=\"0\"");
        wait_until("the job's metrics", Duration::from_secs(10), || {
            let m = fs::read_to_string(files.path("metrics.prom")).unwrap_or_default();
            Ok(m.lines().any(|l| l.starts_with(&label) && l.ends_with(" 95")))
        })?;
        // Live, from the node, as the job runs: once the node's summary has a few samples.
        let samples = |v: &Value| gpus_of(v).first().and_then(|g| g["samples"].as_u64()).unwrap_or(0);
        let mut live = Value::Null;
        wait_until("a live summary with 3 samples", Duration::from_secs(20), || {
            live = json_of(lab, "usage", job)?;
            Ok(samples(&live) >= 3)
        })?;
        ensure!(live["state"] == "RUNNING", "usage while running: {live}");
        let g = gpus_of(&live);
        ensure!(g.len() == 8, "live: {live}");
        ensure!(util_mean(&g[0]) > 90.0 && util_mean(&g[7]) == 0.0, "live: {live}");
        // Every counter steps once, with samples on both sides of the step.
        files.set_state(&with_fail(use_state(util, energy(1))))?;
        let before = samples(&live);
        wait_until("samples after the energy step", Duration::from_secs(20), || {
            live = json_of(lab, "usage", job)?;
            Ok(samples(&live) >= before + 2)
        })?;
        let end = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        ensure!(end == "COMPLETED", "job {job} ended {end}");
        wait_until("DCGM exporter's files gone", Duration::from_secs(10), || {
            Ok(mapping(lab, "node2").is_empty())
        })?;
        let live = lab.node_run_dir("node2").join(format!("usage/{job}"));
        wait_until("the live summary gone", Duration::from_secs(5), || Ok(!live.exists()))?;
        wait_admin_comment(lab, job, 1)?;
        // The agent read its write back, twice (on 22.05 sacctmgr stores it lowercased):
        // read, write, read back, read again after a short wait.
        let kept = |l: &str| {
            l.contains("GPU use kept") && l.contains(&format!("job={job} ")) && l.contains("calls=4")
        };
        wait_until("the agent's word that it kept the summary", Duration::from_secs(10), || {
            Ok(files.log(lab, "node2").lines().any(kept))
        })?;
        let log = files.log(lab, "node2");
        ensure!(!log.contains(NOT_KEPT), "the agent's log:\n{log}");
        for cmd in ["autopsy", "usage"] {
            let v = json_of(lab, cmd, job)?;
            let g = gpus_of(&v);
            ensure!(g.len() == 8, "{cmd}: 8 GPUs: {v}");
            for (i, gpu) in g.iter().enumerate() {
                ensure!(gpu["node"] == "node2" && gpu["gpu"] == i, "{cmd}: GPU {i}: {gpu}");
                let m = util_mean(gpu);
                let ok = if i < 4 { (90.0..=95.0).contains(&m) } else { m == 0.0 };
                ensure!(ok, "{cmd}: GPU {i} util_mean {m}: {v}");
                ensure!(gpu["samples"].as_u64().unwrap_or(0) >= 20, "{cmd}: GPU {i} samples: {gpu}");
            }
            let findings = v["findings"].to_string();
            ensure!(findings.contains("4 of 8 GPUs"), "{cmd}: no finding on the 4 unused GPUs: {v}");
            for (i, gpu) in g.iter().enumerate() {
                let e = &gpu["energy_joules"];
                let want = (i != 5 && i != 6).then_some(100.0 * (i as f64 + 1.0));
                let got = e.as_f64();
                ensure!(
                    got.map(|j| j.round()) == want,
                    "{cmd}: GPU {i} energy_joules {e}, expected {want:?}: {v}"
                );
            }
        }
        let (rc, so, se) = spank_gpu(lab, &["autopsy", &job.to_string()])?;
        ensure!(rc == 0 && so.contains("4 of 8 GPUs"), "autopsy text:\n{so}{se}");
        let (rc, so, se) = spank_gpu(lab, &["usage", &job.to_string()])?;
        ensure!(rc == 0 && so.contains("ENERGY") && so.contains("(6 of 8 GPUs"), "usage text:\n{so}{se}");
        Ok(())
    })();
    let _ = lab.command("scancel").arg(job.to_string()).status();
    lab.stop_daemon("agent-node2");
    result
}

/// Two jobs of 2 GPUs on one node at once, and a job whose two steps use
/// different GPUs: each GPU's figures go to the job that held it (each GPU
/// of the fake runs at its own utilization, 10 * index + 5).
pub fn usage_is_attributed_per_job_and_step(lab: &mut Lab) -> CaseResult {
    agents::write_topology(lab, "node2")?;
    let files = agents::start_agent(lab, "node2")?;
    let util = |g: usize| u32::try_from(10 * g + 5).unwrap_or(0);
    set_use(&files, util)?;
    let a =
        lab.sbatch("#!/bin/bash\nsleep 8\n", &["-w", "node2", "--gres=gpu:2"]).map_err(|e| e.to_string())?;
    let b =
        lab.sbatch("#!/bin/bash\nsleep 8\n", &["-w", "node2", "--gres=gpu:2"]).map_err(|e| e.to_string())?;
    // Two steps of 2 GPUs each, at once, inside a 4-GPU job.
    let steps = "#!/bin/bash\n\
        srun -n1 --exact --gres=gpu:2 sleep 6 &\n\
        srun -n1 --exact --gres=gpu:2 sleep 6 &\n\
        wait\n";
    let c = lab.sbatch(steps, &["-w", "node2", "-n2", "--gres=gpu:4"]).map_err(|e| e.to_string())?;
    let result = (|| {
        let mut held: Vec<u64> = Vec::new();
        for (job, n) in [(a, 2), (b, 2), (c, 4)] {
            let end = lab.wait_job(job, Duration::from_secs(90)).map_err(|e| e.to_string())?;
            ensure!(end == "COMPLETED", "job {job} ended {end}:\n{}", lab.job_output(job));
            wait_admin_comment(lab, job, 1)?;
            let v = json_of(lab, "usage", job)?;
            let g = gpus_of(&v);
            ensure!(g.len() == n, "job {job}: {n} GPUs: {v}");
            for gpu in &g {
                let i = gpu["gpu"].as_u64().unwrap_or(99);
                let want = f64::from(util(usize::try_from(i).unwrap_or(0)));
                let close = (util_mean(gpu) - want).abs() <= 0.01;
                ensure!(close, "job {job}: GPU {i} is another's: {v}");
                ensure!(gpu["samples"].as_u64().unwrap_or(0) >= 2, "job {job}: GPU {i}: {gpu}");
                held.push(i);
            }
        }
        // The two 2-GPU jobs ran side by side: their GPUs are apart.
        ensure!(held[0..2].iter().all(|g| !held[2..4].contains(g)), "jobs {a} and {b} share GPUs: {held:?}");
        Ok(())
    })();
    for j in [a, b, c] {
        let _ = lab.command("scancel").arg(j.to_string()).status();
    }
    lab.stop_daemon("agent-node2");
    result
}

/// A 2-task array job on node2 and a 2-component het job (one component on
/// node2, one on node1: Slurm refuses components that name the same node),
/// 1 GPU per task or component, all at once: each keeps its own node summary
/// in accounting, under the id `sacct` gives it (`A_0`, `A_1`, `H+0`, `H+1`;
/// a plain `A` or `H` would select every task or component), with its own
/// GPU's figures.
pub fn usage_of_each_array_task_and_het_component(lab: &mut Lab) -> CaseResult {
    let util = |g: usize| u32::try_from(10 * g + 5).unwrap_or(0);
    let mut started = Vec::new();
    for node in ["node1", "node2"] {
        agents::write_topology(lab, node)?;
        let files = agents::start_agent(lab, node)?;
        set_use(&files, util)?;
        started.push((node, files));
    }
    let array = lab
        .sbatch("#!/bin/bash\nsleep 6\n", &["--array=0-1", "-w", "node2", "--gres=gpu:1"])
        .map_err(|e| e.to_string())?;
    // The batch step runs in component 0 only: a step in both maps both.
    let het = lab
        .sbatch(
            "#!/bin/bash\nsrun --het-group=0,1 sleep 6\n",
            &["-w", "node2", "--gres=gpu:1", ":", "-w", "node1", "--gres=gpu:1"],
        )
        .map_err(|e| e.to_string())?;
    let result = (|| {
        for job in [array, het] {
            wait_until(&format!("job {job} to end"), Duration::from_secs(90), || {
                let out = output(lab.command("squeue").args(["-h", "-j", &job.to_string()]))?;
                Ok(text(&out).0.trim().is_empty())
            })?;
        }
        let mut held: Vec<(String, u64)> = Vec::new();
        let ids = [format!("{array}_0"), format!("{array}_1"), format!("{het}+0"), format!("{het}+1")];
        for id in &ids {
            let mut v = Value::Null;
            wait_until(&format!("{id}'s summary in accounting"), Duration::from_secs(30), || {
                let (rc, so, _) = spank_gpu(lab, &["usage", id, "--json"])?;
                v = serde_json::from_str(so.trim()).unwrap_or(Value::Null);
                Ok(rc == 0 && gpus_of(&v).len() == 1)
            })?;
            let gpu = &gpus_of(&v)[0];
            let i = gpu["gpu"].as_u64().unwrap_or(99);
            let want = f64::from(util(usize::try_from(i).unwrap_or(0)));
            let close = (util_mean(gpu) - want).abs() <= 0.01;
            ensure!(close, "{id}: GPU {i} is another's: {v}");
            held.push((gpu["node"].as_str().unwrap_or("?").to_owned(), i));
        }
        let mut apart = held.clone();
        apart.sort_unstable();
        apart.dedup();
        ensure!(apart.len() == 4, "{ids:?} share GPUs: {held:?}");
        // Each agent logs its write once it has read it back twice (a moment after
        // `usage` can see it).
        let logs = || -> String { started.iter().map(|(node, files)| files.log(lab, node)).collect() };
        wait_until("the agents' word that they wrote each id", Duration::from_secs(10), || {
            Ok(ids.iter().all(|id| logs().contains(&format!("id={id} "))))
        })?;
        let logs = logs();
        ensure!(!logs.contains(NOT_KEPT), "the agents' logs:\n{logs}");
        Ok(())
    })();
    for job in [array, het] {
        let _ = lab.command("scancel").arg(job.to_string()).status();
    }
    for (node, _) in &started {
        lab.stop_daemon(&format!("agent-{node}"));
    }
    result
}

/// The site's own `AdminComment`, set through slurmctld while a 2-node job
/// runs, is byte for byte what Slurm alone keeps for the same text (a job
/// with no GPU, which no agent writes) once both nodes' agents kept their
/// summaries, and `usage` finds both summaries where the agents put them:
/// - quotes and a backslash (besides upper case, `|` and a newline), which
///   `sacctmgr` rewrites on every release: the AdminComment is left alone and
///   the summaries are in the SystemComment;
/// - upper case, `|` and a newline: from 23.02 `sacctmgr` writes them back as
///   they are, so the summaries follow the site's text in the AdminComment;
///   22.05 lowercases, so there too the SystemComment.
pub fn usage_keeps_the_sites_admin_comment(lab: &mut Lab) -> CaseResult {
    let texts = ["JS1:Site \"q\" C:\\tmp|x\nline two", "JS1:Site|x\nLine Two"];
    agents::write_topology(lab, "node1")?;
    agents::write_topology(lab, "node2")?;
    let a1 = agents::start_agent(lab, "node1")?;
    let a2 = agents::start_agent(lab, "node2")?;
    let mut jobs = Vec::new();
    for _ in texts {
        let args = ["-N2", "-w", "node[1-2]", "--ntasks-per-node=1", "--gres=gpu:1"];
        let job = lab.sbatch("#!/bin/bash\nsrun sleep 8\n", &args).map_err(|e| e.to_string())?;
        let control =
            lab.sbatch("#!/bin/bash\nsleep 8\n", &["-N1", "-w", "node1"]).map_err(|e| e.to_string())?;
        jobs.push((job, control));
    }
    let result = (|| {
        for (&(job, control), site) in jobs.iter().zip(texts) {
            for j in [job, control] {
                wait_until(&format!("job {j} running"), Duration::from_secs(30), || {
                    Ok(job_field(lab, j, "JobState") == "RUNNING")
                })?;
                let set = format!("AdminComment={site}");
                super::ok(lab.command("scontrol").args(["update", &format!("JobId={j}"), &set]))?;
            }
        }
        for &(job, control) in &jobs {
            for j in [job, control] {
                let end = lab.wait_job(j, Duration::from_secs(60)).map_err(|e| e.to_string())?;
                ensure!(end == "COMPLETED", "job {j} ended {end}:\n{}", lab.job_output(j));
            }
        }
        // Raw, as sacct prints it: the comment is the last field, newline and all.
        let comment = |j: u32| -> Result<String, String> {
            let args = ["-j", &j.to_string(), "-X", "-n", "-P", "-o", "AdminComment"];
            let out = output(lab.command("sacct").args(args))?;
            Ok(text(&out).0.trim_end_matches('\n').to_owned())
        };
        for &(job, control) in &jobs {
            let mut v = Value::Null;
            wait_until(&format!("job {job}'s two summaries"), Duration::from_secs(40), || {
                let (rc, so, _) = spank_gpu(lab, &["usage", &job.to_string(), "--json"])?;
                v = serde_json::from_str(so.trim()).unwrap_or(Value::Null);
                Ok(rc == 0 && gpus_of(&v).len() == 2)
            })?;
            let mut nodes: Vec<String> =
                gpus_of(&v).iter().filter_map(|g| g["node"].as_str().map(str::to_owned)).collect();
            nodes.sort_unstable();
            ensure!(nodes == ["node1", "node2"], "{v}");
            for (files, node) in [(&a1, "node1"), (&a2, "node2")] {
                wait_until(&format!("{node}'s agent done with job {job}"), Duration::from_secs(20), || {
                    let log = files.log(lab, node);
                    Ok(log.lines().any(|l| l.contains(&format!("job={job} ")) && l.contains("GPU use kept")))
                })?;
            }
            let (kept, alone) = (comment(job)?, comment(control)?);
            println!(
                "    (Slurm keeps the site's text as {alone:?}; after the agents: {kept:?}; {})",
                v["kept_in"]
            );
            let in_admin =
                kept.strip_prefix(alone.as_str()).is_some_and(|rest| rest.matches(" sgu1;").count() == 2);
            let (want, field) = if kept == alone {
                (serde_json::json!(["SystemComment"]), "SystemComment")
            } else {
                (serde_json::json!(["AdminComment"]), "AdminComment")
            };
            ensure!(
                kept == alone || in_admin,
                "the site's AdminComment changed: Slurm alone keeps {alone:?}, after the agents {kept:?}"
            );
            ensure!(v["kept_in"] == want, "usage does not say the summaries are in the {field}: {v}");
            // Where each release's sacctmgr writes the text back unchanged, the AdminComment.
            let round_trips =
                !alone.contains(['"', '\\']) && (lab.slurm_at_least(23, 2) || alone == alone.to_lowercase());
            ensure!(in_admin == round_trips, "{field} used for {alone:?} on {}", lab.release());
        }
        Ok(())
    })();
    for &(job, control) in &jobs {
        for j in [job, control] {
            let _ = lab.command("scancel").arg(j.to_string()).status();
        }
    }
    lab.stop_daemon("agent-node1");
    lab.stop_daemon("agent-node2");
    result
}

/// A user who locks what they can of the job map (`flock` on the run
/// directory, the records' directory, the lock file: as `nobody`) holds up no
/// job: the prolog takes its own root-only lock file, so it neither waits nor
/// logs that a lock was still held, and the job is mapped as usual.
pub fn a_users_lock_on_the_job_map_holds_up_no_job(lab: &mut Lab) -> CaseResult {
    use std::io::Read;
    // The records' directory and lock file exist once a first job was mapped.
    super::ok(lab.command("srun").args(["-w", "node2", "--gres=gpu:1", "true"]))?;
    let mut held = Vec::new();
    let mut holders = Vec::new();
    for path in ["/run/spank-gpu", "/run/spank-gpu/jobs", "/run/spank-gpu/jobs.lock"] {
        // In node2's namespaces, as a user there would: flock says "held" once it holds
        // the lock, and exits at once when it cannot open or lock the file.
        let mut child = lab
            .command_on("node2", "setpriv")
            .map_err(|e| e.to_string())?
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "flock", "-w", "0", path])
            .args(["sh", "-c", "echo held; exec sleep 60"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut said = [0u8; 5];
        let n = child.stdout.take().map_or(0, |mut o| o.read(&mut said).unwrap_or(0));
        if said[..n].starts_with(b"held") {
            held.push(path);
        }
        holders.push(child);
    }
    let mark = super::LogMark::new(lab);
    let t = std::time::Instant::now();
    let result = (|| {
        let (so, _) = super::ok(lab.command("srun").args([
            "-w",
            "node2",
            "--gres=gpu:2",
            "bash",
            "-c",
            "cat /run/spank-gpu/hpc-jobs/* 2>/dev/null | sort -u | tr '\\n' ' '; echo",
        ]))?;
        let took = t.elapsed();
        println!("    (nobody held {held:?}; a 2-GPU step took {:.2} s)", took.as_secs_f64());
        // What any user can do on a real node (the run directory is 0755); never the
        // records' directory (0700) or the lock file (0600).
        ensure!(held == ["/run/spank-gpu"], "nobody held {held:?}");
        ensure!(!so.trim().is_empty(), "the job was not mapped in DCGM exporter's files: '{so}'");
        ensure!(!mark.since().contains("is still held"), "the prolog waited:\n{}", mark.since());
        ensure!(
            took < Duration::from_secs(2),
            "the step took {took:?} (the prolog waits 2 s for a held lock)"
        );
        Ok(())
    })();
    for mut h in holders {
        let _ = h.kill();
        let _ = h.wait();
    }
    result
}

/// The finding of `usage --json` with this id, if any.
fn finding<'a>(v: &'a Value, id: &str) -> Option<&'a Value> {
    v["findings"].as_array()?.iter().find(|f| f["id"] == id)
}

/// A 3-node job whose batch script starts no step (`python train.py` with no
/// srun: here `sleep`): `usage` names node2 and node3 as nodes no step ran on,
/// live and after its end, and sends no one to check their agents (the
/// agents there are fine: no prolog ran, so they never saw the job; the step
/// `usage` itself starts to read a running job does not count as work). A
/// 3-node job with a step on every node gets no such finding.
pub fn usage_names_the_nodes_no_step_ran_on(lab: &mut Lab) -> CaseResult {
    let mut agents = Vec::new();
    for node in ["node1", "node2", "node3"] {
        agents::write_topology(lab, node)?;
        agents.push(agents::start_agent(lab, node)?);
    }
    let idle = lab
        .sbatch("#!/bin/bash\nsleep 20\n", &["-N3", "--gres=gpu:2", "--job-name=one-node-only"])
        .map_err(|e| e.to_string())?;
    let busy =
        lab.sbatch("#!/bin/bash\nsrun sleep 6\n", &["-N3", "--gres=gpu:1"]).map_err(|e| e.to_string())?;
    let names_the_idle_nodes = |v: &Value, when: &str| -> CaseResult {
        let f = finding(v, "no-step").ok_or_else(|| format!("{when}: no no-step finding: {v}"))?;
        let what = f["what"].as_str().unwrap_or("");
        ensure!(
            (what.contains("node[2-3]") || (what.contains("node2") && what.contains("node3")))
                && !what.contains("node1"),
            "{when}: the finding names other nodes: {f}"
        );
        ensure!(f["fix"].as_str().unwrap_or("").contains("srun"), "{when}: {f}");
        ensure!(
            !v.to_string().contains("systemctl status gpu-node-agent"),
            "{when}: sends the admin to the agents: {v}"
        );
        Ok(())
    };
    let result = (|| {
        wait_until("the job running", Duration::from_secs(30), || {
            Ok(job_field(lab, idle, "JobState") == "RUNNING")
        })?;
        let mut live = Value::Null;
        wait_until("a live summary from node1", Duration::from_secs(20), || {
            live = json_of(lab, "usage", idle)?;
            Ok(gpus_of(&live).iter().any(|g| g["node"] == "node1"))
        })?;
        names_the_idle_nodes(&live, "live")?;
        for job in [idle, busy] {
            let end = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            ensure!(end == "COMPLETED", "job {job} ended {end}:\n{}", lab.job_output(job));
        }
        let mut ended = Value::Null;
        wait_until("node1's summary in accounting", Duration::from_secs(30), || {
            ended = json_of(lab, "usage", idle)?;
            Ok(ended["state"] == "COMPLETED" && gpus_of(&ended).iter().any(|g| g["node"] == "node1"))
        })?;
        names_the_idle_nodes(&ended, "after the end")?;
        let mut all = Value::Null;
        wait_until("the busy job's three summaries", Duration::from_secs(30), || {
            all = json_of(lab, "usage", busy)?;
            Ok(gpus_of(&all).len() == 3)
        })?;
        ensure!(finding(&all, "no-step").is_none(), "a step ran on every node: {all}");
        Ok(())
    })();
    for job in [idle, busy] {
        let _ = lab.command("scancel").arg(job.to_string()).status();
    }
    for node in ["node1", "node2", "node3"] {
        lab.stop_daemon(&format!("agent-{node}"));
    }
    result
}
