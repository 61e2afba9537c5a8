//! `slurm_spank_job_prolog` / `slurm_spank_job_epilog`: which job holds
//! which GPU on this node ([`task_plan::jobmap`]), for the agent's per-job
//! usage and DCGM exporter's job labels.
//!
//! Root, once per job and node (slurmd runs the plugin's prolog in a
//! process of its own before the job's first step there, or at allocation
//! with `PrologFlags=Alloc`; the epilog at the job's end). The prolog writes
//! the job's record in `/run/spank-gpu/jobs/JOBID`; the epilog removes it;
//! each then rewrites DCGM exporter's mapping files
//! (`/run/spank-gpu/hpc-jobs/GPU`, one job id per line) from all the
//! records, under the job map's lock (`/run/spank-gpu/jobs.lock`, which
//! only root can open, so no user can hold it), so two jobs starting at once
//! on a shared GPU both stay named. The records are root's alone (the
//! directory 0700, each 0600): a record names the job's user and GPUs.
//!
//! Nothing here ever fails the prolog (a failing prolog drains the node):
//! a missing GPU table, an unwritable or full directory, a link where a
//! directory should be, each is one line in slurmd's log. The paths are
//! constants; the job's id and user come from Slurm, the GPUs from the
//! prolog's `SLURM_JOB_GPUS`/`CUDA_VISIBLE_DEVICES` (slurmd's, not the
//! user's), matched against the GPU table; nothing the user controls names
//! a file.

use task_plan::gputable::{self, GpuTable, TABLE_FILE};
use task_plan::jobmap::{self, JobRecord};
use task_plan::plugstack::PluginConfig;

use crate::spank::{Item, Level, Node, Spank};

/// Where the records and the DCGM files are (in the lab, each node's own
/// directory is mounted there).
fn run_path(sub: &str) -> String {
    format!("{}/{sub}", jobmap::RUN_DIR)
}

fn job_id<S: Spank + Node>(sp: &S) -> Option<u32> {
    sp.item(Item::JobId).ok().or_else(|| sp.process_env("SLURM_JOB_ID")?.trim().parse().ok())
}

/// The prolog: the job's record, then the DCGM files.
pub fn prolog<S: Spank + Node>(sp: &mut S, cfg: &PluginConfig) {
    if !cfg.job_map {
        return;
    }
    let Some(job) = job_id(sp) else {
        sp.log(Level::Info, "job map: the prolog has no job id; nothing written");
        return;
    };
    let uid = sp.item(Item::JobUid).ok().or_else(|| sp.process_env("SLURM_JOB_UID")?.trim().parse().ok());
    let job_gpus = sp.process_env("SLURM_JOB_GPUS");
    let visible = sp.process_env("CUDA_VISIBLE_DEVICES");
    if job_gpus.as_deref().is_none_or(str::is_empty) && visible.as_deref().is_none_or(str::is_empty) {
        return; // No GPU of this node is the job's.
    }
    let table_path = format!("{}/{TABLE_FILE}", cfg.topology_dir.trim_end_matches('/'));
    let table = match sp
        .read_trusted(&table_path, gputable::MAX_BYTES)
        .map_err(|e| e.to_string())
        .and_then(|t| GpuTable::parse(&t).map_err(|e| format!("{table_path}: {e}")))
    {
        Ok(t) => t,
        Err(e) => {
            sp.log(Level::Info, &format!("job map: job {job}: no GPU table ({e}); its GPUs are not mapped"));
            return;
        }
    };
    let (gpus, unknown) = jobmap::held_gpus(&table, job_gpus.as_deref(), visible.as_deref());
    if !unknown.is_empty() {
        sp.log(
            Level::Info,
            &format!("job map: job {job}: GPUs {} are not in {table_path}; left out", unknown.join(",")),
        );
    }
    if gpus.is_empty() {
        return;
    }
    let record = JobRecord { job, uid: uid.unwrap_or(u32::MAX), gpus };
    let done = (|| -> Result<(), String> {
        let jobs = open_jobs(sp, job)?;
        sp.run_dir_write(&jobs, &jobmap::file_name(job), &record.to_text()).map_err(|e| e.to_string())?;
        refresh_dcgm(sp, &jobs)
    })();
    if let Err(e) = done {
        sp.log(Level::Info, &format!("job map: job {job}: {e}; its GPU use is not summed here"));
    }
}

/// The epilog: the job's record removed, then the DCGM files.
pub fn epilog<S: Spank + Node>(sp: &mut S, cfg: &PluginConfig) {
    if !cfg.job_map {
        return;
    }
    let Some(job) = job_id(sp) else { return };
    let done = (|| -> Result<(), String> {
        let jobs = open_jobs(sp, job)?;
        sp.run_dir_remove(&jobs, &jobmap::file_name(job)).map_err(|e| e.to_string())?;
        refresh_dcgm(sp, &jobs)
    })();
    if let Err(e) = done {
        sp.log(Level::Info, &format!("job map: job {job}'s end: {e}"));
    }
}

/// The job records' directory, locked: held past the wait (a prolog or
/// epilog stuck with it: only root can open the lock file), this one goes on
/// without the lock and says so once.
fn open_jobs<S: Spank + Node>(sp: &S, job: u32) -> Result<S::RunDir, String> {
    let path = run_path(jobmap::JOBS_DIR);
    let jobs = sp.open_run_dir(&path, true).map_err(|e| e.to_string())?;
    if sp.run_dir_lock_missed(&jobs) {
        sp.log(
            Level::Error,
            &format!(
                "job map: job {job}: {path}.lock is still held by another prolog or epilog after 2 s; \
                 going on without it (DCGM exporter's files may miss a job starting or ending now)"
            ),
        );
    }
    Ok(jobs)
}

/// Rewrites DCGM exporter's mapping files from every record (the jobs
/// map's lock held): a GPU's file names the jobs holding it; a file
/// no job needs is removed (only names the format writes).
fn refresh_dcgm<S: Spank + Node>(sp: &mut S, jobs: &S::RunDir) -> Result<(), String> {
    let mut records = Vec::new();
    for name in sp.run_dir_names(jobs).map_err(|e| e.to_string())? {
        if jobmap::job_of_file(&name).is_none() {
            continue;
        }
        if let Ok(r) = sp
            .run_dir_read(jobs, &name, jobmap::MAX_BYTES)
            .map_err(|e| e.to_string())
            .and_then(|t| JobRecord::parse(&t))
        {
            records.push(r);
        }
    }
    let want = jobmap::dcgm_files(&records);
    let dcgm = sp.open_run_dir(&run_path(jobmap::DCGM_DIR), false).map_err(|e| e.to_string())?;
    for name in sp.run_dir_names(&dcgm).map_err(|e| e.to_string())? {
        if jobmap::is_dcgm_name(&name) && !want.contains_key(&name) {
            sp.run_dir_remove(&dcgm, &name).map_err(|e| e.to_string())?;
        }
    }
    for (name, ids) in &want {
        let text = jobmap::dcgm_text(ids);
        if sp.run_dir_read(&dcgm, name, 4096).ok().as_deref() != Some(text.as_str()) {
            sp.run_dir_write(&dcgm, name, &text).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
