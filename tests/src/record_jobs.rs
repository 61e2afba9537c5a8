//! Records what Slurm's read-only commands print about real pending and
//! ended jobs, on the lab with accounting, as fixtures for `spank-gpu why`
//! and `autopsy`'s parsers (`diagnosis/tests/fixtures/jobinfo/recorded/RELEASE/`,
//! replayed by `diagnosis/tests/jobinfo_recorded.rs`).
//!
//! Each job is one the e2e suite asks about: held (its command line full of
//! `Key=Value` words), behind a failed `afterok`, pending for resources, held
//! off a node the agent drained, with an output directory that does not exist,
//! killed by the memory limit, exited 3, cancelled. For each, the text forms
//! (`scontrol show job -o`, `sacct -P`) and, where the release has them, the
//! machine forms `spank-gpu` reads (`scontrol --json=v0.0.42 show job`,
//! `sacct --json=v0.0.42`, 24.11+) and `sacct`'s `StdOut`/`StdErr` (24.05+,
//! with `--expand-patterns`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Lab, LabConfig, Release, field};

/// The `sacct` fields every release has, as the 22.05 fixtures were recorded.
pub const SACCT_FIELDS: &str = "JobID,JobName,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,WorkDir";

/// The agent's drain reason the fixtures carry.
const AGENT_REASON: &str = "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)";

/// Where the fixtures live in the source tree.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diagnosis/tests/fixtures/jobinfo/recorded")
}

struct Recorder<'a> {
    lab: &'a Lab,
    dir: PathBuf,
    written: Vec<PathBuf>,
}

impl Recorder<'_> {
    /// Runs a Slurm command; its stdout, with the lab's directory as `$LAB`.
    fn capture(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = self.lab.command(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).replace(&self.lab.dir.display().to_string(), "$LAB"))
    }

    fn write(&mut self, name: &str, text: &str) -> Result<(), String> {
        let path = self.dir.join(name);
        fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        self.written.push(path);
        Ok(())
    }

    fn job_text(&mut self, name: &str, job: u32) -> Result<(), String> {
        let id = job.to_string();
        let text = self.capture("scontrol", &["show", "job", "-o", &id])?;
        self.write(&format!("{name}.scontrol"), &text)?;
        if self.lab.slurm_at_least(24, 11) {
            let json = self.capture("scontrol", &["--json=v0.0.42", "show", "job", &id])?;
            self.write(&format!("{name}.scontrol.json"), &json)?;
        }
        Ok(())
    }

    fn job_accounting(&mut self, name: &str, job: u32) -> Result<(), String> {
        let id = job.to_string();
        let text = self.capture("sacct", &["-j", &id, "-P", "-o", SACCT_FIELDS])?;
        self.write(&format!("{name}.sacct"), &text)?;
        if self.lab.slurm_at_least(24, 5) {
            let fields = format!("{SACCT_FIELDS},StdOut,StdErr");
            let text = self.capture("sacct", &["-j", &id, "-P", "--expand-patterns", "-o", &fields])?;
            self.write(&format!("{name}.sacct-std"), &text)?;
        }
        if self.lab.slurm_at_least(24, 11) {
            let json = self.capture("sacct", &["--json=v0.0.42", "-j", &id])?;
            self.write(&format!("{name}.sacct.json"), &json)?;
        }
        Ok(())
    }
}

fn sbatch(lab: &Lab, args: &[&str], script: &str) -> Result<u32, String> {
    lab.sbatch(&format!("#!/bin/bash\n{script}\n"), args).map_err(|e| e.to_string())
}

fn job_field(lab: &Lab, job: u32, key: &str) -> String {
    let out = lab.command("scontrol").args(["show", "job", "-o", &job.to_string()]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    field(&text, key).unwrap_or_default()
}

fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let t = Instant::now();
    while !done() {
        if t.elapsed() > timeout {
            return Err(format!("{what} after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

fn wait_pending(lab: &Lab, job: u32, reason: &str) -> Result<(), String> {
    wait(&format!("job {job} not pending for {reason}"), Duration::from_secs(30), || {
        job_field(lab, job, "JobState") == "PENDING" && job_field(lab, job, "Reason").starts_with(reason)
    })
}

fn wait_running(lab: &Lab, job: u32) -> Result<(), String> {
    wait(&format!("job {job} not running"), Duration::from_secs(30), || {
        job_field(lab, job, "JobState") == "RUNNING"
    })
}

/// Waits until slurmdbd has the ended job's own record (it has a time limit).
fn wait_accounted(lab: &Lab, job: u32) -> Result<(), String> {
    wait(&format!("sacct has no record of job {job}"), Duration::from_secs(30), || {
        let args = ["-n", "-X", "-P", "-j", &job.to_string(), "-o", "State,Timelimit"];
        let out = lab.command("sacct").args(args).output();
        let line = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default();
        let (s, limit) = line.split_once('|').unwrap_or((&line, ""));
        !s.is_empty() && !limit.is_empty() && !matches!(s, "PENDING" | "RUNNING" | "COMPLETING")
    })
}

fn ended(lab: &Lab, job: u32) -> Result<(), String> {
    lab.wait_job(job, Duration::from_secs(90)).map_err(|e| e.to_string())?;
    wait_accounted(lab, job)
}

/// Brings up a lab with accounting on `release`, records every job into
/// `DIR/`, and tears it down. Returns the files written.
///
/// # Errors
/// The lab did not start, or a job did not reach the state it is recorded in.
pub fn record_jobs(release: Release, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let cfg = LabConfig { release, accounting: true, ..LabConfig::default() };
    let lab = Lab::start(cfg).map_err(|e| e.to_string())?;
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut r = Recorder { lab: &lab, dir: dir.to_path_buf(), written: Vec::new() };

    // Held, with words that look like fields in its command line (SubmitLine= from 25.11).
    // Key=Value words in its name, comment, output path and command line.
    let out = format!("--output={}/out/Reason=None-%j.out", lab.dir.display());
    let wrap = [
        "--parsable",
        "--hold",
        "--job-name=JobState=RUNNING",
        "--comment=JobState=RUNNING Reason=None",
        out.as_str(),
        "--wrap",
        "echo JobState=RUNNING Reason=None",
    ];
    let held: u32 = r.capture("sbatch", &wrap)?.trim().parse().map_err(|e| format!("sbatch --hold: {e}"))?;
    wait_pending(&lab, held, "JobHeld")?;
    r.job_text("held-keyvalue", held)?;

    // Behind a failed afterok.
    let failed = sbatch(&lab, &[], "false")?;
    ended(&lab, failed)?;
    let dep = sbatch(&lab, &[&format!("--dependency=afterok:{failed}")], "true")?;
    wait_pending(&lab, dep, "DependencyNeverSatisfied")?;
    r.job_text("depfail", dep)?;

    // Pending for resources behind a running job.
    let running = sbatch(&lab, &["-w", "node2", "--gpus=8", "--time=5"], "sleep 300")?;
    wait_running(&lab, running)?;
    let behind = sbatch(&lab, &["-w", "node2", "--gpus=8", "--time=5"], "true")?;
    wait_pending(&lab, behind, "Resources")?;
    r.job_text("resources", behind)?;

    // A node the agent drained, and a job that needs it.
    let drain = ["update", "nodename=node2", "state=drain", &format!("reason={AGENT_REASON}")];
    r.capture("scontrol", &drain)?;
    let _ = lab.command("scancel").args(["--signal=KILL", &running.to_string()]).status();
    ended(&lab, running)?;
    r.job_accounting("cancelled", running)?;
    let reqnode = sbatch(&lab, &["-w", "node2"], "true")?;
    wait_pending(&lab, reqnode, "ReqNodeNotAvail")?;
    r.job_text("reqnode", reqnode)?;
    let node = r.capture("scontrol", &["show", "node", "-o", "node2"])?;
    r.write("node2.scontrol", &node)?;
    let sinfo = r.capture("sinfo", &["-h", "-N", "-n", "node2", "-o", "%N|%T|%E"])?;
    r.write("node2.sinfo", &sinfo)?;
    wait("no drain event in slurmdbd", Duration::from_secs(30), || {
        r.capture("sacctmgr", &["-n", "-P", "show", "event", "nodes=node2", "format=Reason"])
            .is_ok_and(|t| t.contains("gpu: xid79"))
    })?;
    let events = r.capture(
        "sacctmgr",
        &["-P", "show", "event", "nodes=node2", "format=NodeName,TimeStart,TimeEnd,State,Reason"],
    )?;
    r.write("events.sacctmgr", &events)?;
    for job in [reqnode, behind] {
        let _ = lab.command("scancel").arg(job.to_string()).status();
    }
    r.capture("scontrol", &["update", "nodename=node2", "state=resume"])?;

    // An output directory that does not exist (22.05 fails the job; 23.02+ makes the directory).
    let nodir = format!("--output={}/out/missing-dir/%j.out", lab.dir.display());
    let job = sbatch(&lab, &[nodir.as_str(), "-w", "node1"], "echo hello")?;
    ended(&lab, job)?;
    r.job_text("nodir", job)?;
    r.job_accounting("nodir", job)?;

    // The memory limit: jobacct_gather's OverMemoryKill.
    let job = sbatch(&lab, &["--mem=20M"], "perl -e '$x = \"a\" x (300*1024*1024); sleep 5'")?;
    ended(&lab, job)?;
    r.job_text("oom", job)?;
    r.job_accounting("oom", job)?;

    // A plain non-zero exit.
    let job = sbatch(&lab, &[], "exit 3")?;
    ended(&lab, job)?;
    r.job_accounting("exit3", job)?;

    let _ = lab.command("scancel").arg(held.to_string()).status();
    let version = r.capture("sinfo", &["--version"])?;
    r.write("VERSION", &version)?;
    Ok(r.written)
}
