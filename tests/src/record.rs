//! Records the per-task environments real Slurm gives GPU steps, under each
//! [`TaskSetup`] and on each Slurm release the lab runs, as plain-text
//! fixtures for replay tests of the plugin's decisions
//! (`tests/fixtures/slurm-env/RELEASE/SETUP/PATTERN`, see its README).
//!
//! The lab runs WITHOUT the plugin, so what is recorded is Slurm's alone: each
//! task prints its environment (only the variables Slurm sets for GPUs and
//! binding) and the `Cpus_allowed_list` it starts with, which is the mask the
//! plugin's `task_init` finds (task/affinity binds in `task_g_pre_launch`,
//! before the SPANK `task_init` hook runs in the same forked process).

use std::fs;
use std::path::{Path, PathBuf};

use std::time::Duration;

use crate::{Lab, LabConfig, Release, TaskSetup};

/// One launch pattern: a directory name and the `srun` words, all on `node1`.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    /// The fixture directory's name.
    pub name: &'static str,
    /// The words after `srun -N1 -w node1` (or `sbatch -N1 -w node1`).
    pub args: &'static [&'static str],
    /// A batch job: what its batch step (the script) finds, not an srun step's tasks.
    pub batch: bool,
}

impl Pattern {
    const fn step(name: &'static str, args: &'static [&'static str]) -> Pattern {
        Pattern { name, args, batch: false }
    }
}

/// The recorded launch patterns.
pub const PATTERNS: &[Pattern] = &[
    Pattern::step("gpus-per-task-1", &["-n2", "--gpus-per-task=1"]),
    Pattern::step("gpus-per-node-8", &["-n2", "--gpus-per-node=8"]),
    Pattern::step("ntasks-per-gpu-2", &["-n2", "--ntasks-per-gpu=2", "--gpus=1"]),
    // Refused on 2-CPU nodes (also with --overcommit): recorded where the node has 4 CPUs or more.
    Pattern::step("ntasks-per-gpu-2-gpus-2", &["-n4", "--ntasks-per-gpu=2", "--gpus=2"]),
    Pattern::step("gpus-per-task-1-cpu-bind-cores", &["-n2", "--gpus-per-task=1", "--cpu-bind=cores"]),
    // The simplest shape users write: `sbatch -N1 --gres=gpu:8 job.sh`, no -n.
    Pattern { name: "batch-gres-gpu-8", args: &["--gres=gpu:8"], batch: true },
];

/// The variables kept: Slurm's own, and the GPU lists it sets.
pub fn kept(key: &str) -> bool {
    key.starts_with("SLURM_")
        || key.starts_with("SLURMD_")
        || matches!(key, "CUDA_VISIBLE_DEVICES" | "GPU_DEVICE_ORDINAL" | "ROCR_VISIBLE_DEVICES")
}

/// What each task runs: its environment, then as comment lines its CPU mask
/// and the fake GPUs (device minors) it may open. Opening a fake GPU fails
/// with ENXIO ("No such device or address": no driver) when the devices
/// cgroup allows it and with EPERM when ConstrainDevices denies it.
fn task_script(lab: &Lab, gpus: u32) -> String {
    format!(
        "env; echo \"# cpus_allowed=$(grep Cpus_allowed_list /proc/self/status | cut -f2)\"; \
         o=; for n in $(seq 0 {last}); do (exec 3<{cdev}/nvidia$n) 2>&1 | grep -q \"not permitted\" || o=$o${{o:+,}}$n; done; \
         echo \"# gpus_openable=$o\"",
        last = gpus.saturating_sub(1),
        cdev = lab.dir.join("cdev").display(),
    )
}

/// Where the fixtures live in the source tree.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/slurm-env")
}

/// The batch pattern: the job's script prints what the batch step finds.
fn record_batch(lab: &Lab, pattern: &Pattern, pdir: &Path) -> Result<PathBuf, String> {
    let lab_dir = lab.dir.display().to_string();
    let script = format!("#!/bin/bash\n{}\n", task_script(lab, lab.gpus_per_node()));
    let args: Vec<&str> = ["-N1", "-w", "node1"].iter().chain(pattern.args).copied().collect();
    let command = format!("sbatch {} job.sh\n{}", args.join(" "), script.replace(&lab_dir, "$LAB"));
    fs::write(pdir.join("command"), command).map_err(|e| e.to_string())?;
    let job = lab.sbatch(&script, &args).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    if state != "COMPLETED" {
        return Err(format!("batch pattern {}: job {job} {state}: {}", pattern.name, lab.job_output(job)));
    }
    let mut lines: Vec<String> = lab
        .job_output(job)
        .lines()
        .filter(|l| l.starts_with("# ") || l.split_once('=').is_some_and(|(k, _)| kept(k)))
        .map(|l| l.replace(&lab_dir, "$LAB"))
        .collect();
    lines.sort_by_key(|l| (l.starts_with('#'), l.clone()));
    fs::write(pdir.join("batch.env"), lines.join("\n") + "\n").map_err(|e| e.to_string())?;
    Ok(pdir.to_path_buf())
}

/// Words of Slurm's refusal that mean "too many tasks for the node's CPUs".
const TOO_MANY_TASKS: &str = "Requested node configuration is not available";

/// Runs one pattern on a started lab and writes `DIR/PATTERN/taskN.env` and
/// `DIR/PATTERN/command`. When Slurm refuses the task count for the node's
/// CPUs, it writes `DIR/PATTERN/refused` with Slurm's message instead.
///
/// # Errors
/// srun failed otherwise (with its stderr) or a file could not be written.
pub fn record_pattern(lab: &Lab, pattern: &Pattern, dir: &Path) -> Result<PathBuf, String> {
    let args: Vec<&str> = ["-N1", "-w", "node1", "-l"].iter().chain(pattern.args).copied().collect();
    let pdir = dir.join(pattern.name);
    let _ = fs::remove_dir_all(&pdir);
    fs::create_dir_all(&pdir).map_err(|e| format!("{}: {e}", pdir.display()))?;
    if pattern.batch {
        return record_batch(lab, pattern, &pdir);
    }
    let lab_dir = lab.dir.display().to_string();
    let script = task_script(lab, lab.gpus_per_node());
    let words = args.iter().filter(|a| **a != "-l").copied().collect::<Vec<_>>().join(" ");
    let command = format!("srun {words} bash -c '{}'\n", script.replace(&lab_dir, "$LAB"));
    fs::write(pdir.join("command"), command).map_err(|e| e.to_string())?;
    let (success, stdout, stderr) = srun(lab, &args, &script)?;
    if !success && stderr.contains(TOO_MANY_TASKS) {
        let text = format!("refused on nodes with {} CPUs: {}\n", lab.cpus_per_node(), stderr.trim());
        fs::write(pdir.join("refused"), text).map_err(|e| e.to_string())?;
        return Ok(pdir);
    }
    if !success {
        return Err(format!("srun {} failed: {}", args.join(" "), stderr.trim()));
    }
    let mut tasks: std::collections::BTreeMap<u32, Vec<String>> = std::collections::BTreeMap::new();
    for line in stdout.lines() {
        let Some((label, rest)) = line.split_once(": ") else { continue };
        let Ok(task) = label.trim().parse::<u32>() else { continue };
        let keep = rest.starts_with("# ") || rest.split_once('=').is_some_and(|(k, _)| kept(k));
        if keep {
            tasks.entry(task).or_default().push(rest.replace(&lab_dir, "$LAB"));
        }
    }
    for (task, mut lines) in tasks {
        lines.sort_by_key(|l| (l.starts_with('#'), l.clone()));
        let text = lines.join("\n") + "\n";
        fs::write(pdir.join(format!("task{task}.env")), text).map_err(|e| e.to_string())?;
    }
    Ok(pdir)
}

fn srun(lab: &Lab, args: &[&str], script: &str) -> Result<(bool, String, String), String> {
    let mut cmd = lab.command("srun");
    cmd.args(args);
    let out = cmd.args(["bash", "-c", script]).output().map_err(|e| format!("srun: {e}"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Brings up a lab without the plugin under `setup`, records every pattern
/// into `DIR/SETUP/`, with the lab's `slurm.conf`, `gres.conf` and
/// `cgroup.conf` (its work directory written as `$LAB`), and tears it down.
///
/// # Errors
/// The lab did not start or a pattern failed.
pub fn record_setup(setup: TaskSetup, release: Release, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let cfg = LabConfig { task_setup: setup, release, ..LabConfig::default() };
    let lab = Lab::start(cfg).map_err(|e| e.to_string())?;
    let sdir = dir.join(setup.name());
    let _ = fs::remove_dir_all(&sdir);
    fs::create_dir_all(&sdir).map_err(|e| format!("{}: {e}", sdir.display()))?;
    let lab_dir = lab.dir.display().to_string();
    for name in ["slurm.conf", "gres.conf", "cgroup.conf"] {
        if let Ok(text) = fs::read_to_string(lab.dir.join("etc").join(name)) {
            fs::write(sdir.join(name), text.replace(&lab_dir, "$LAB")).map_err(|e| e.to_string())?;
        }
    }
    let mut written = Vec::new();
    for pattern in PATTERNS {
        written.push(record_pattern(&lab, pattern, &sdir)?);
    }
    Ok(written)
}
