//! Per-job GPU use: which job holds which GPU (the records the plugin's job
//! prolog writes in `run_dir/jobs`), each reading of the sampler
//! ([`crate::sources::nvml::usage`]) added to those jobs' summaries
//! ([`tally`]), each running job's summary on this node in
//! `run_dir/usage/JOBID` (world-readable: `spank-gpu usage` reads it through
//! `srun --overlap`), and, once a job's record is gone (its epilog ran), its
//! final summary merged into the job's `AdminComment` in Slurm's accounting
//! by a thread of its own ([`Reporter`]), so slurmdbd being slow never holds
//! up the health checks. Accounting, not slurmctld: slurmctld refuses to
//! update a job once it is COMPLETING (when the epilog runs), and an
//! `AdminComment` set there reaches slurmdbd only with the job's end record,
//! which is sent before the epilog; `sacctmgr modify job` writes it into the
//! job's record in slurmdbd directly, as `sacct` then shows it.
//!
//! The daemon's loop calls [`Usage::tick`] at every wake-up (at least once a
//! second) and [`Usage::reading`] for each reading; neither blocks.

pub mod report;
pub mod tally;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use task_plan::jobmap::{self, JobRecord};

use crate::config::Config;
use crate::slurm::Accounting;
use crate::sources::nvml::usage::Reading;
use crate::sources::{self, Source};
use crate::store::atomic_file::{self, Options};
use crate::time::now_unix;

pub use report::{Reporter, write_admin_comment};
pub use tally::Tally;

/// Most records read from `run_dir/jobs` (more are ignored, with a warning).
const MAX_RECORDS: usize = 1024;

/// The job records in `dir`: files named by job id, owned by root, not
/// links, parsed; a bad one is skipped (logged at debug).
pub fn read_records(dir: &Path) -> Vec<JobRecord> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(job) = name.to_str().and_then(jobmap::job_of_file) else { continue };
        if out.len() >= MAX_RECORDS {
            tracing::warn!(dir = %dir.display(), "over {MAX_RECORDS} job records: the rest are not summed");
            break;
        }
        match read_record(&e.path()) {
            Ok(r) if r.job == job => out.push(r),
            Ok(_) => tracing::debug!(job, "a job record names another job"),
            Err(why) => tracing::debug!(job, error = %why, "job record skipped"),
        }
    }
    out.sort_by_key(|r| r.job);
    out
}

/// One record: the plugin's root file, read as every root file the agent
/// trusts (no link followed, root's alone, size-capped).
fn read_record(path: &Path) -> Result<JobRecord, String> {
    let bytes =
        slurm_formats::trusted::read_trusted(path, jobmap::MAX_BYTES, &[0]).map_err(|e| e.to_string())?;
    JobRecord::parse(&String::from_utf8_lossy(&bytes))
}

/// The daemon's side: the tally, the records, the live files.
#[derive(Debug)]
pub struct Usage {
    /// The summaries.
    pub tally: Tally,
    run_dir: PathBuf,
    reporter: Option<Reporter>,
    live: BTreeSet<u32>,
    last_reading: Instant,
    interval: Duration,
    warned_stale: bool,
    next_scan: Instant,
}

impl Usage {
    /// Per-job usage for the daemon, or `None` when `usage_interval` is 0.
    /// Starts the sampler and (with `usage_admin_comment`) the reporter.
    pub fn start(
        cfg: &Config,
        node: &str,
        stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Option<(Usage, Receiver<Reading>)> {
        if cfg.usage_interval.is_zero() {
            return None;
        }
        let (tx, rx) = mpsc::sync_channel(4);
        if let Err(e) = crate::sources::nvml::usage::spawn(
            cfg.nvml_library.clone(),
            cfg.usage_interval,
            tx,
            std::sync::Arc::clone(stop),
        ) {
            tracing::error!(error = %e, "cannot start the GPU usage thread: per-job GPU use is off");
            return None;
        }
        let reporter = if cfg.usage_admin_comment && !cfg.dry_run {
            let acct = Accounting {
                sacct: cfg.sacct.clone(),
                sacctmgr: cfg.sacctmgr.clone(),
                timeout: cfg.scontrol_timeout,
            };
            match Reporter::spawn(acct) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the AdminComment thread: summaries stay on the node");
                    None
                }
            }
        } else {
            None
        };
        let usage = Usage::new(cfg, node, reporter);
        Some((usage, rx))
    }

    /// Without threads (tests).
    pub fn new(cfg: &Config, node: &str, reporter: Option<Reporter>) -> Usage {
        let dir = cfg.run_dir.join(jobmap::USAGE_DIR);
        if let Err(e) = fs::create_dir_all(&dir)
            .and_then(|()| fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)))
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the live usage directory: `spank-gpu usage` sees no running job here");
        }
        // Live files of jobs that ended while no agent ran: gone.
        let running: BTreeSet<u32> =
            read_records(&cfg.run_dir.join(jobmap::JOBS_DIR)).iter().map(|r| r.job).collect();
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let job = e.file_name().to_str().and_then(jobmap::job_of_file);
            if job.is_some_and(|j| !running.contains(&j)) {
                let _ = fs::remove_file(e.path());
            }
        }
        let (interval_s, now) = (cfg.usage_interval.as_secs().max(1), Instant::now());
        Usage {
            tally: Tally::new(node, interval_s),
            run_dir: cfg.run_dir.clone(),
            reporter,
            live: BTreeSet::new(),
            last_reading: now,
            interval: cfg.usage_interval,
            warned_stale: false,
            next_scan: now,
        }
    }

    fn records(&self) -> Vec<JobRecord> {
        read_records(&self.run_dir.join(jobmap::JOBS_DIR))
    }

    /// Takes in a reading: adds it to the jobs holding each GPU, rewrites
    /// their live files, ends the jobs whose records are gone.
    pub fn reading(&mut self, reading: &Reading) {
        if let Some(e) = &reading.error {
            if sources::set(Source::NvmlUsage, false) != Some(false) {
                tracing::warn!(error = %e, "GPU usage cannot be read: per-job figures pause (health checks go on)");
            }
            return;
        }
        if sources::set(Source::NvmlUsage, true) == Some(false) || self.warned_stale {
            tracing::info!("GPU usage readings again");
        }
        self.last_reading = Instant::now();
        self.warned_stale = false;
        let records = self.records();
        for job in self.tally.add(reading, &records) {
            tracing::warn!(job, "over {} jobs summed on this node: the oldest dropped", tally::MAX_JOBS);
            self.remove_live(job);
        }
        self.sync(&records, reading.at);
        for r in &records {
            self.write_live(r.job);
        }
    }

    /// At every wake-up: notices jobs that started or ended since the last
    /// look (once a second at most), and a sampler that stopped answering.
    pub fn tick(&mut self) {
        let now = Instant::now();
        if now < self.next_scan {
            return;
        }
        self.next_scan = now + Duration::from_secs(1);
        let records = self.records();
        self.sync(&records, now_unix());
        if !self.warned_stale
            && now.duration_since(self.last_reading) > self.interval * 3 + Duration::from_secs(5)
        {
            self.warned_stale = true;
            sources::set(Source::NvmlUsage, false);
            tracing::warn!(
                "no GPU usage reading for {:.0} s: an NVML call on the usage thread does not return (health checks go on)",
                now.duration_since(self.last_reading).as_secs_f64()
            );
        }
    }

    /// Opens the summaries of new jobs; ends those whose records are gone.
    fn sync(&mut self, records: &[JobRecord], now: u64) {
        let live: BTreeSet<u32> = records.iter().map(|r| r.job).collect();
        for r in records {
            if !self.live.contains(&r.job) {
                self.tally.open(r, now);
                self.write_live(r.job);
            }
        }
        for (job, usage) in self.tally.ended(&live) {
            self.remove_live(job);
            tracing::info!(job, summary = %usage.to_word(), "job ended");
            if let Some(rep) = &self.reporter {
                rep.send(job, usage);
            }
        }
        self.live = live;
    }

    fn live_path(&self, job: u32) -> PathBuf {
        self.run_dir.join(jobmap::USAGE_DIR).join(jobmap::file_name(job))
    }

    fn write_live(&self, job: u32) {
        let Some(u) = self.tally.summary(job) else { return };
        let text = format!("{}\n", u.to_word());
        let path = self.live_path(job);
        if let Err(e) =
            atomic_file::write(&path, text.as_bytes(), Options { mode: Some(0o644), durable: false })
        {
            tracing::debug!(path = %path.display(), error = %e, "cannot write the live summary");
        }
    }

    fn remove_live(&self, job: u32) {
        let _ = fs::remove_file(self.live_path(job));
    }
}
