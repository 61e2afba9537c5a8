//! `spank-gpu why` and `spank-gpu autopsy` on the lab with accounting
//! (MariaDB + slurmdbd): real pending and dead jobs, asked about as the user
//! would, through the installed commands.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use job_diagnosis::{Feature, Release};
use serde_json::Value;
use slurm_lab::Lab;
use slurm_lab::agents;

use super::{CaseResult, output, text};

fn spank_gpu() -> String {
    agents::bin("spank-gpu").display().to_string()
}

/// `spank-gpu ARGS` as root with the lab's SLURM_CONF: (exit code, stdout, stderr).
fn run(lab: &Lab, args: &[&str]) -> Result<(i32, String, String), String> {
    let out = output(lab.command(&spank_gpu()).args(args))?;
    let (so, se) = text(&out);
    Ok((out.status.code().unwrap_or(-1), so, se))
}

/// `spank-gpu ARGS` as the user `nobody`.
fn run_as_nobody(lab: &Lab, args: &[&str]) -> Result<(i32, String, String), String> {
    let out = output(
        lab.command("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", &spank_gpu()])
            .args(args),
    )?;
    let (so, se) = text(&out);
    Ok((out.status.code().unwrap_or(-1), so, se))
}

/// Text and JSON of one command that must succeed.
fn both(lab: &Lab, cmd: &str, job: u32) -> Result<(String, Value), String> {
    let id = job.to_string();
    let (rc, so, se) = run(lab, &[cmd, &id])?;
    ensure!(rc == 0, "spank-gpu {cmd} {job} exited {rc}:\n{so}{se}");
    let (rc, js, se) = run(lab, &[cmd, &id, "--json"])?;
    ensure!(rc == 0, "spank-gpu {cmd} {job} --json exited {rc}:\n{js}{se}");
    let v: Value = serde_json::from_str(js.trim()).map_err(|e| format!("not JSON ({e}):\n{js}"))?;
    Ok((so, v))
}

/// The lab's Slurm release, from its `scontrol --version`.
fn lab_release(lab: &Lab) -> Result<Release, String> {
    let (so, se) = super::ok(lab.command("scontrol").arg("--version"))?;
    Release::from_version_output(&so).ok_or_else(|| format!("scontrol --version said: {so}{se}"))
}

fn sbatch(lab: &Lab, args: &[&str], script: &str) -> Result<u32, String> {
    lab.sbatch(&format!("#!/bin/bash\n{script}\n"), args).map_err(|e| e.to_string())
}

fn state(lab: &Lab, job: u32) -> (String, String) {
    let out = lab.command("scontrol").args(["show", "job", "-o", &job.to_string()]).output();
    let t = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    (slurm_lab::field(&t, "JobState").unwrap_or_default(), slurm_lab::field(&t, "Reason").unwrap_or_default())
}

/// Waits until the job is PENDING with a reason that starts with `reason`.
fn wait_reason(lab: &Lab, job: u32, reason: &str) -> CaseResult {
    let t = Instant::now();
    loop {
        let (s, r) = state(lab, job);
        if s == "PENDING" && r.starts_with(reason) {
            return Ok(());
        }
        ensure!(t.elapsed() < Duration::from_secs(20), "job {job} is {s} ({r}), not pending for {reason}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until accounting has the job's end (sacct lags the controller a little).
fn wait_accounted(lab: &Lab, job: u32) -> CaseResult {
    let t = Instant::now();
    loop {
        let args = ["-n", "-X", "-P", "-j", &job.to_string(), "-o", "State,Timelimit"];
        let out = lab.command("sacct").args(args).output();
        let line = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default();
        let (s, limit) = line.split_once('|').unwrap_or((&line, ""));
        // The job's own record has arrived (not only its steps'): it has a time limit.
        if !s.is_empty() && !limit.is_empty() && !matches!(s, "PENDING" | "RUNNING" | "COMPLETING") {
            return Ok(());
        }
        ensure!(t.elapsed() < Duration::from_secs(30), "sacct has job {job} as '{s}'");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn end(lab: &Lab, job: u32, want: &str) -> CaseResult {
    let s = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    ensure!(s == want, "job {job} ended {s}, expected {want}:\n{}", lab.job_output(job));
    wait_accounted(lab, job)
}

/// `autopsy_timeout`'s job is the slowest (a 1-minute limit, checked every
/// 30 s by slurmctld): the runner starts it as that case's fixture before
/// the lab's cases, so it times out while the others run; no other case
/// uses it.
static TIMEOUT_JOB: Mutex<Option<u32>> = Mutex::new(None);

/// `autopsy_timeout`'s fixture: submits its job.
pub fn start_timeout_job(lab: &Lab) -> CaseResult {
    let id = sbatch(lab, &["--time=1", "-w", "node1", "--job-name=train-segment"], "sleep 300")?;
    *TIMEOUT_JOB.lock().map_err(|e| e.to_string())? = Some(id);
    Ok(())
}

// ----- why ------------------------------------------------------------------------------

pub fn why_held_job(lab: &mut Lab) -> CaseResult {
    // Key=Value words of the user's own in its record: in Comment= on every
    // release, and in SubmitLine= (the whole command line) from 25.11.
    let job = sbatch(lab, &["--hold", "--comment=JobState=RUNNING Reason=None"], "true")?;
    wait_reason(lab, job, "JobHeldUser")?;
    let (so, v) = both(lab, "why", job)?;
    let _ = lab.command("scancel").arg(job.to_string()).status();
    ensure!(
        so.contains("is PENDING: JobHeldUser") && so.contains(&format!("scontrol release {job}")),
        "{so}"
    );
    ensure!(!so.contains("not pending"), "the user's words were read as fields:\n{so}");
    ensure!(
        v["state"] == "PENDING" && v["reason_code"] == "JobHeldUser" && v["resolves_by"] == "user",
        "{v}"
    );
    ensure!(v["reason_enum"][0] == "WAIT_HELD_USER", "{v}");
    ensure!(v["slurm"] == lab_release(lab)?.to_string().as_str(), "{v}");
    Ok(())
}

pub fn why_failed_afterok_dependency(lab: &mut Lab) -> CaseResult {
    let first = sbatch(lab, &[], "exit 3")?;
    let next = sbatch(lab, &[&format!("--dependency=afterok:{first}")], "true")?;
    wait_reason(lab, next, "DependencyNeverSatisfied")?;
    let (so, v) = both(lab, "why", next)?;
    let _ = lab.command("scancel").arg(next.to_string()).status();
    ensure!(so.contains("will never start"), "{so}");
    ensure!(
        so.contains(&format!("job {first} ended FAILED (exit code 3:0)")),
        "does not name the failed job:\n{so}"
    );
    ensure!(v["dependencies"][0]["job"] == first.to_string().as_str(), "{v}");
    ensure!(v["dependencies"][0]["state"] == "failed", "{v}");
    Ok(())
}

pub fn why_job_needs_a_node_the_agent_drained(lab: &mut Lab) -> CaseResult {
    // The agent's reason grammar, as gpu-node-agent writes it.
    let reason = "reason=gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)";
    let drain = ["update", "nodename=node2", "state=drain", reason];
    super::ok(lab.command("scontrol").args(drain))?;
    let result = (|| {
        let job = sbatch(lab, &["-w", "node2"], "true")?;
        wait_reason(lab, job, "ReqNodeNotAvail")?;
        let (so, v) = both(lab, "why", job)?;
        let _ = lab.command("scancel").arg(job.to_string()).status();
        ensure!(
            so.contains("GPU 3 on node2 failed with Xid 79") && so.contains("an admin must repair it"),
            "{so}"
        );
        ensure!(v["resolves_by"] == "admin", "{v}");
        ensure!(v["nodes"][0]["node"] == "node2" && v["nodes"][0]["agent"]["xid"] == 79, "{v}");
        ensure!(v["nodes"][0]["agent"]["gpu"] == 3, "{v}");
        Ok(())
    })();
    let _ = lab.command("scontrol").args(["update", "nodename=node2", "state=resume"]).status();
    result
}

pub fn why_job_pending_for_resources_behind_a_running_one(lab: &mut Lab) -> CaseResult {
    let running = sbatch(lab, &["-w", "node2", "--gpus=8", "--time=5"], "sleep 120")?;
    let result = (|| {
        let t = Instant::now();
        while state(lab, running).0 != "RUNNING" {
            ensure!(t.elapsed() < Duration::from_secs(20), "job {running} did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
        let job = sbatch(lab, &["-w", "node2", "--gpus=8", "--time=5"], "true")?;
        wait_reason(lab, job, "Resources")?;
        // The scheduler sets the expected start on its next pass.
        let t = Instant::now();
        loop {
            let out =
                output(lab.command("squeue").args(["-h", "-j", &job.to_string(), "--start", "-o", "%S"]))?;
            let start = text(&out).0;
            if !matches!(start.trim(), "" | "N/A") {
                break;
            }
            ensure!(t.elapsed() < Duration::from_secs(20), "squeue --start has no time for job {job}");
            std::thread::sleep(Duration::from_millis(300));
        }
        let (so, v) = both(lab, "why", job)?;
        let _ = lab.command("scancel").arg(job.to_string()).status();
        ensure!(so.contains("is PENDING: Resources") && so.contains("resolves with time"), "{so}");
        ensure!(so.contains("expected start (squeue --start)"), "no expected start:\n{so}");
        ensure!(v["resolves_by"] == "time" && v["expected_start"].is_string(), "{v}");
        if lab.slurm_at_least(23, 11) {
            // PriorityType's default is priority/multifactor from 23.11 (CHANGELOG/slurm-23.11.md):
            // sprio has the job's factors, and why shows them.
            ensure!(v["priority"]["total"].is_string(), "no priority factors on {}: {v}", lab.release());
        } else {
            // 22.05's default is priority/basic: sprio has nothing to say, and why says nothing.
            ensure!(v["priority"].is_null(), "{v}");
        }
        Ok(())
    })();
    let _ = lab.command("scancel").arg(running.to_string()).status();
    result
}

// ----- autopsy --------------------------------------------------------------------------

pub fn autopsy_non_zero_exit(lab: &mut Lab) -> CaseResult {
    let job = sbatch(lab, &[], "echo working; exit 7")?;
    end(lab, job, "FAILED")?;
    let (so, v) = both(lab, "autopsy", job)?;
    ensure!(so.contains("exited with status 7 (its own error, not a signal)"), "{so}");
    ensure!(v["exit"]["status"] == 7 && v["exit"]["signal"] == 0 && v["state"] == "FAILED", "{v}");
    ensure!(v["hardware"].as_array().is_some_and(Vec::is_empty) && v["oom"].is_null(), "{v}");
    Ok(())
}

/// An `--output` directory that does not exist fails the job at launch
/// (`FAILED`, `0:53`, no log) before Slurm 23.02; from 23.02 slurmstepd
/// creates it and the job completes. A path through a file fails the job at
/// launch on every release.
pub fn autopsy_missing_output_directory(lab: &mut Lab) -> CaseResult {
    let release = lab_release(lab)?;
    let missing = lab.dir.join("no-such-dir");
    let out = format!("--output={}/%j.out", missing.display());
    // lab.sbatch passes its own --output first; this later one wins.
    let job = sbatch(lab, &[&out], "echo never")?;
    let dir = missing.display().to_string();
    if release.has(Feature::CreatesOutputDirs) {
        end(lab, job, "COMPLETED")?;
        let log = missing.join(format!("{job}.out"));
        let written = std::fs::read_to_string(&log).unwrap_or_default();
        ensure!(written.contains("never"), "Slurm {release} did not create {}: {written:?}", log.display());
        let (so, v) = both(lab, "autopsy", job)?;
        ensure!(v["state"] == "COMPLETED" && v["exit_code"] == "0:0", "{v}");
        ensure!(v["missing_dirs"].as_array().is_some_and(Vec::is_empty), "{v}");
        ensure!(!so.contains("does not exist"), "{so}");
    } else {
        end(lab, job, "FAILED")?;
        let (so, v) = both(lab, "autopsy", job)?;
        ensure!(so.contains(&format!("the directory {dir} does not exist")), "{so}");
        ensure!(v["missing_dirs"][0] == dir.as_str() && v["exit_code"] == "0:53", "{v}");
    }
    // A path that cannot be written on any release: its directory is a file.
    let file = lab.dir.join("a-file");
    std::fs::write(&file, "not a directory\n").map_err(|e| format!("{}: {e}", file.display()))?;
    let job = sbatch(lab, &[&format!("--output={}/%j.out", file.display())], "echo never")?;
    end(lab, job, "FAILED")?;
    let (so, v) = both(lab, "autopsy", job)?;
    ensure!(v["exit_code"] == "0:53", "{v}");
    ensure!(so.contains(&format!("{} is a file, not a directory", file.display())), "{so}");
    ensure!(so.contains("ESLURMD_IO_ERROR") && !so.contains("before or at launch"), "{so}");
    Ok(())
}

/// How many of node2's events in slurmdbd carry the agent's Xid 79 reason.
fn xid79_events(lab: &Lab) -> Result<usize, String> {
    let out =
        output(lab.command("sacctmgr").args(["-n", "-P", "show", "event", "nodes=node2", "format=Reason"]))?;
    Ok(text(&out).0.lines().filter(|l| l.contains("gpu: xid79")).count())
}

pub fn autopsy_job_whose_node_the_agent_drained(lab: &mut Lab) -> CaseResult {
    let job = sbatch(lab, &["-w", "node2", "--gpus=1"], "sleep 300")?;
    let result = (|| {
        let t = Instant::now();
        while state(lab, job).0 != "RUNNING" {
            ensure!(t.elapsed() < Duration::from_secs(20), "job {job} did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
        // The real agent on node2, its fake NVML reports Xid 79 on GPU 3: it drains node2.
        let before = xid79_events(lab)?;
        let files = agents::start_agent(lab, "node2")?;
        files.wait_passes(1, Duration::from_secs(20))?;
        agents::add_event(&files, 3, 79)?;
        agents::wait_for(lab, "node2", Duration::from_secs(20), |s, _| agents::drained(s))?;
        // The job dies with its GPU.
        super::ok(lab.command("scancel").args(["--signal=KILL", &job.to_string()]))?;
        let s = lab.wait_job(job, Duration::from_secs(30)).map_err(|e| e.to_string())?;
        ensure!(s == "CANCELLED" || s == "FAILED", "job {job} ended {s}");
        wait_accounted(lab, job)?;
        let names_the_drain = |when: &str| -> CaseResult {
            let (so, v) = both(lab, "autopsy", job)?;
            ensure!(
                so.contains("GPU 3 on node2 failed with Xid 79") && so.contains("Not your code"),
                "{when}:\n{so}"
            );
            let hw = v["hardware"].as_array().cloned().unwrap_or_default();
            ensure!(hw.iter().any(|e| e["node"] == "node2" && e["agent"]["xid"] == 79), "{when}: {v}");
            Ok(())
        };
        // At once: the node's drain event reaches slurmdbd on its own, on 22.05 when
        // the drain is asked for, on 24.11 and 26.05 (measured) only once the node is
        // DRAINED, that is after the job ended; until then node2's record has it.
        let in_dbd = xid79_events(lab)? > before;
        println!("(autopsy_job_whose_node_the_agent_drained: drain event in slurmdbd at once: {in_dbd})");
        names_the_drain(if in_dbd { "event in slurmdbd" } else { "event not yet in slurmdbd" })?;
        // And once slurmdbd has this drain's event (earlier cases drained node2 too).
        let t = Instant::now();
        loop {
            if xid79_events(lab)? > before {
                break;
            }
            ensure!(t.elapsed() < Duration::from_secs(30), "no drain event for node2 in slurmdbd");
            std::thread::sleep(Duration::from_millis(300));
        }
        names_the_drain("event in slurmdbd")?;
        Ok(())
    })();
    let _ = lab.command("scancel").arg(job.to_string()).status();
    // Not agents::reset: it waits for every node to be idle, and node1 runs the timeout job.
    lab.stop_daemon("agent-node2");
    let _ = lab.command("scontrol").args(["update", "nodename=node2", "state=resume"]).status();
    agents::wait_for(lab, "node2", Duration::from_secs(30), |s, _| s == "IDLE")?;
    result
}

pub fn autopsy_host_oom(lab: &mut Lab) -> CaseResult {
    // 300 MiB in a job that asked for 20 MiB. jobacct_gather's OverMemoryKill
    // ends it FAILED 0:9 with MaxRSS above --mem; a cgroup memory limit
    // (ConstrainRAMSpace) ends it OUT_OF_MEMORY 0:125 (Slurm's SIG_OOM), its
    // MaxRSS held at the limit.
    let job = sbatch(lab, &["--mem=20M"], "perl -e '$x = \"a\" x (300*1024*1024); sleep 5'")?;
    let s = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    ensure!(s == "FAILED" || s == "OUT_OF_MEMORY", "job {job} ended {s}:\n{}", lab.job_output(job));
    wait_accounted(lab, job)?;
    let (so, v) = both(lab, "autopsy", job)?;
    ensure!(so.contains("host memory ran out: the job asked for 20 MiB"), "{so}");
    ensure!(v["oom"] == "host" && v["memory"]["requested_bytes"] == 20 * 1024 * 1024, "{v}");
    if s == "OUT_OF_MEMORY" {
        ensure!(v["exit_code"] == "0:125" && !so.contains("before or at launch"), "{so}\n{v}");
    } else {
        let rss = v["memory"]["max_rss_bytes"].as_u64().unwrap_or(0);
        ensure!(rss > 20 * 1024 * 1024, "MaxRSS {rss} not above --mem: {v}");
    }
    Ok(())
}

pub fn autopsy_tells_gpu_oom_from_the_log(lab: &mut Lab) -> CaseResult {
    // The job's own log (Slurm's path) says CUDA out of memory.
    let msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
    let job = sbatch(lab, &[], &format!("echo '{msg}' >&2; exit 1"))?;
    end(lab, job, "FAILED")?;
    let (so, v) = both(lab, "autopsy", job)?;
    ensure!(v["oom"] == "gpu" && so.contains("GPU memory ran out"), "{so}\n{v}");
    // A log Slurm does not know, named with --log.
    let log = lab.dir.join("out/own.err");
    let job = sbatch(lab, &[], &format!("echo '{msg}' > {}; exit 1", log.display()))?;
    end(lab, job, "FAILED")?;
    let (_, v) = both(lab, "autopsy", job)?;
    ensure!(v["oom"].is_null(), "OOM without the log: {v}");
    let (rc, js, se) =
        run(lab, &["autopsy", &job.to_string(), "--json", "--log", &log.display().to_string()])?;
    ensure!(rc == 0, "autopsy --log exited {rc}: {se}");
    let v: Value = serde_json::from_str(js.trim()).map_err(|e| e.to_string())?;
    ensure!(v["oom"] == "gpu" && v["log"] == log.display().to_string().as_str(), "{v}");
    Ok(())
}

pub fn autopsy_timeout(lab: &mut Lab) -> CaseResult {
    let job = TIMEOUT_JOB.lock().map_err(|e| e.to_string())?.ok_or("its fixture's job was not submitted")?;
    let s = lab.wait_job(job, Duration::from_secs(150)).map_err(|e| e.to_string())?;
    ensure!(s == "TIMEOUT", "job {job} ended {s}");
    wait_accounted(lab, job)?;
    let (so, v) = both(lab, "autopsy", job)?;
    ensure!(so.contains("reached its --time limit"), "{so}");
    // The recipe, filled in: the job's name and a lead time of half its 1-minute limit.
    let recipe = v["recipe"].as_str().unwrap_or("");
    ensure!(recipe.contains("#SBATCH --signal=B:USR1@30") && recipe.contains("#SBATCH --requeue"), "{v}");
    ensure!(
        recipe.contains("ckpt/train-segment") && recipe.contains("&\nSRUN_PID=$!\nwait \"$SRUN_PID\""),
        "{v}"
    );
    ensure!(so.contains("Why B:"), "{so}");
    Ok(())
}

// ----- errors and the JSON contract ----------------------------------------------------

/// The `--json` keys documented in docs/users.md.
const WHY_KEYS: &[&str] = &[
    "schema",
    "slurm",
    "job_id",
    "name",
    "state",
    "reason",
    "reason_code",
    "reason_enum",
    "meaning",
    "resolves_by",
    "action",
    "expected_start",
    "priority",
    "nodes",
    "dependencies",
    "advice",
    "limit",
    "limit_note",
];
const AUTOPSY_KEYS: &[&str] = &[
    "schema",
    "slurm",
    "job_id",
    "name",
    "user",
    "state",
    "exit_code",
    "exit",
    "start",
    "end",
    "elapsed",
    "time_limit",
    "nodes",
    "memory",
    "oom",
    "missing_dirs",
    "hardware",
    "gpus",
    "first_failure",
    "cause",
    "preemption",
    "log",
    "findings",
    "recipe",
];

pub fn json_is_the_documented_schema(lab: &mut Lab) -> CaseResult {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/users.md"))
        .map_err(|e| e.to_string())?;
    let held = sbatch(lab, &["--hold"], "true")?;
    wait_reason(lab, held, "JobHeldUser")?;
    let (_, why) = both(lab, "why", held)?;
    let _ = lab.command("scancel").arg(held.to_string()).status();
    let done = sbatch(lab, &[], "true")?;
    end(lab, done, "COMPLETED")?;
    let (_, autopsy) = both(lab, "autopsy", done)?;
    for (v, keys) in [(&why, WHY_KEYS), (&autopsy, AUTOPSY_KEYS)] {
        let mut got: Vec<&str> =
            v.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        let mut want = keys.to_vec();
        got.sort_unstable();
        want.sort_unstable();
        ensure!(got == want, "--json keys {got:?}, documented {want:?}");
        ensure!(v["schema"] == 1, "{v}");
        for k in keys {
            ensure!(docs.contains(&format!("`{k}`")), "docs/users.md does not document `{k}`");
        }
    }
    Ok(())
}

pub fn errors_are_one_line_and_fail(lab: &mut Lab) -> CaseResult {
    let one_line = |what: &str, (rc, so, se): (i32, String, String), needle: &str| -> CaseResult {
        ensure!(rc != 0, "{what}: exit 0:\n{so}{se}");
        ensure!(so.is_empty() && se.lines().count() == 1, "{what}: not one line:\n{so}{se}");
        ensure!(se.starts_with("spank-gpu: ") && se.contains(needle), "{what}: {se}");
        ensure!(!se.contains("panicked") && !se.contains("RUST_BACKTRACE"), "{what}: {se}");
        Ok(())
    };
    one_line("why unknown", run(lab, &["why", "999999"])?, "job 999999 not found")?;
    one_line("autopsy unknown", run(lab, &["autopsy", "999999"])?, "job 999999 not found in accounting")?;
    one_line("why garbage", run(lab, &["why", "12;rm"])?, "is not a job id")?;
    // PrivateData=jobs: nobody cannot see root's jobs, pending or ended.
    let held = sbatch(lab, &["--hold"], "true")?;
    wait_reason(lab, held, "JobHeldUser")?;
    let done = sbatch(lab, &[], "true")?;
    end(lab, done, "COMPLETED")?;
    let r = run_as_nobody(lab, &["why", &held.to_string()])?;
    let _ = lab.command("scancel").arg(held.to_string()).status();
    one_line("why hidden", r, "another user's job on a site that hides them")?;
    one_line("autopsy hidden", run_as_nobody(lab, &["autopsy", &done.to_string()])?, "hides them")?;
    // Accounting down: slurmdbd stopped (the last thing this lab does).
    lab.stop_daemon("slurmdbd");
    one_line("autopsy without slurmdbd", run(lab, &["autopsy", &done.to_string()])?, "is slurmdbd running?")?;
    Ok(())
}

/// slurmdbd stopped (it stays so: this runs after `errors_are_one_line_and_fail`):
/// `why` on a job whose dependency failed names the failed job's real end
/// from slurmctld's record, within seconds, instead of waiting on accounting
/// or calling a job that slurmctld still holds "ended PENDING".
pub fn why_a_failed_dependency_without_slurmdbd(lab: &mut Lab) -> CaseResult {
    lab.stop_daemon("slurmdbd");
    let first = sbatch(lab, &[], "exit 3")?;
    let next = sbatch(lab, &[&format!("--dependency=afterok:{first}")], "true")?;
    wait_reason(lab, next, "DependencyNeverSatisfied")?;
    let t = Instant::now();
    let answer = both(lab, "why", next);
    let took = t.elapsed();
    let _ = lab.command("scancel").arg(next.to_string()).status();
    let (so, v) = answer?;
    println!("    (why without slurmdbd answered in {:.1} s)", took.as_secs_f64());
    ensure!(took < Duration::from_secs(20), "why took {took:?} without slurmdbd:\n{so}");
    ensure!(
        so.contains(&format!("job {first} ended FAILED (exit code 3:0)")),
        "does not name the failed job's end:\n{so}"
    );
    ensure!(!so.contains("ended PENDING") && !so.contains("ended RUNNING"), "{so}");
    ensure!(v["dependencies"][0]["state"] == "failed", "{v}");
    Ok(())
}

// ----- issue 45: the first failure and its cause; the limit's numbers ----------------

/// The message rank 3 prints for each class: the line of the class's fixture
/// log (real texts from the frameworks' sources, diagnosis/src/causes.rs) that
/// autopsy's classifier puts in that class.
fn cause_messages() -> Result<Vec<(job_diagnosis::CauseClass, String)>, String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../diagnosis/tests/fixtures/first-failure");
    let mut out = Vec::new();
    for class in job_diagnosis::causes::CLASSES {
        if class == job_diagnosis::CauseClass::Xid {
            continue; // a GPU's fault: the agent's drain, case autopsy_job_whose_node_the_agent_drained
        }
        let log = std::fs::read_to_string(format!("{dir}/{}.log", class.id())).map_err(|e| e.to_string())?;
        let line = log
            .lines()
            .find(|l| job_diagnosis::causes::classify_line(l) == Some(class))
            .ok_or_else(|| format!("no {} line in its fixture", class.id()))?;
        // Without the fixture's own rank prefix: srun --label adds the real one.
        let text = line.trim_start_matches(|c: char| c.is_ascii_digit() || c == ':' || c == ' ');
        out.push((class, text.to_owned()));
    }
    Ok(out)
}

/// A 2-node job of 4 tasks (rank 3 on node2) under `srun --kill-on-bad-exit=1
/// --label`: rank 3 prints each cause's real message and exits 1 while the
/// others block; autopsy names node2, task 3, exit 1 and the class, and the
/// others' deaths as its consequences.
pub fn autopsy_names_the_first_failure_and_its_cause(lab: &mut Lab) -> CaseResult {
    let mut jobs = Vec::new();
    for (class, text) in cause_messages()? {
        let quoted = text.replace('\'', "'\\''");
        let script = format!(
            "srun --kill-on-bad-exit=1 --label bash -c 'if [ \"$SLURM_PROCID\" = 3 ]; then sleep 1; echo '\\''{quoted}'\\'' >&2; exit 1; fi; sleep 300'"
        );
        let job = sbatch(
            lab,
            &["-N2", "-w", "node[1-2]", "-n4", "--ntasks-per-node=2", "--gpus-per-task=1", "--job-name=ff"],
            &script,
        )?;
        jobs.push((class, job));
    }
    for (class, job) in jobs {
        end(lab, job, "FAILED")?;
        let (so, v) = both(lab, "autopsy", job)?;
        let ff = &v["first_failure"];
        ensure!(
            ff["node"] == "node2" && ff["task"] == 3 && ff["exit_code"] == 1,
            "{}: job {job}'s first failure: {ff}\n{so}",
            class.id()
        );
        ensure!(v["cause"]["class"] == class.id(), "{}: job {job}'s cause: {}\n{so}", class.id(), v["cause"]);
        let others = ff["consequences"].as_array().cloned().unwrap_or_default();
        ensure!(
            !others.is_empty()
                && others.iter().all(|c| c["why"] == "kill-on-bad-exit" || c["why"] == "sigterm"),
            "{}: the others' deaths: {}",
            class.id(),
            ff["consequences"]
        );
        ensure!(so.contains("First failure"), "{}: text:\n{so}", class.id());
    }
    Ok(())
}

/// A job pending on its account's GPU cap: `why` prints the cap, the use and
/// what the job asks.
pub fn why_gives_the_numbers_of_a_gpu_limit(lab: &mut Lab) -> CaseResult {
    let mgr = |args: &[&str]| super::ok(lab.command("sacctmgr").arg("-i").args(args)).map(drop);
    mgr(&["add", "account", "capped", "Description=lab", "Organization=lab"])?;
    mgr(&["add", "user", "root", "account=capped"])?;
    mgr(&["modify", "account", "capped", "set", "GrpTRES=gres/gpu=2"])?;
    let result = (|| {
        let a = sbatch(lab, &["-A", "capped", "--gres=gpu:2", "-w", "node2"], "sleep 120")?;
        let b = sbatch(lab, &["-A", "capped", "--gres=gpu:1", "-w", "node2"], "sleep 1")?;
        let t = Instant::now();
        while state(lab, a).0 != "RUNNING" {
            ensure!(t.elapsed() < Duration::from_secs(20), "job {a} did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
        let out = wait_reason(lab, b, "AssocGrpGRES");
        let got = out.and_then(|()| both(lab, "why", b));
        for j in [a, b] {
            let _ = lab.command("scancel").arg(j.to_string()).status();
        }
        let (so, v) = got?;
        ensure!(
            so.contains("gres/gpu=2") && so.contains("2 in use") && so.contains("asks for 1"),
            "why:\n{so}"
        );
        let l = &v["limit"];
        ensure!(l["tres"] == "gres/gpu" && l["limit"] == 2 && l["used"] == 2 && l["requested"] == 1, "{v}");
        Ok(())
    })();
    let _ = mgr(&["delete", "user", "root", "account=capped"]);
    let _ = mgr(&["delete", "account", "capped"]);
    result
}
