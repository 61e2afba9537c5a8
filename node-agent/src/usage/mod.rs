//! Per-job GPU use: which job holds which GPU (the records the plugin's job
//! prolog writes in `run_dir/jobs`), each reading of the sampler
//! ([`crate::sources::nvml::usage`]) added to those jobs' summaries
//! ([`tally`]), each running job's summary on this node in
//! `run_dir/usage/JOBID` (root's, mode 0440, readable by the job's user
//! through a POSIX ACL, in a directory of mode 0711: `spank-gpu usage`
//! reads it by name through `srun --overlap`, as the job's user; no one
//! lists the directory or reads another's; on a file system without ACLs
//! root's alone, 0400), and, once a job's record is gone (its epilog ran), its
//! final summary merged into the job's `AdminComment` in Slurm's accounting
//! by a thread of its own ([`Reporter`]), so slurmdbd being slow never holds
//! up the health checks. Accounting, not slurmctld: slurmctld refuses to
//! update a job once it is COMPLETING (when the epilog runs), and an
//! `AdminComment` set there reaches slurmdbd only with the job's end record,
//! which is sent before the epilog; `sacctmgr modify job` writes it into the
//! job's record in slurmdbd directly, as `sacct` then shows it.
//!
//! A record whose epilog never ran (slurmd killed while the job ended, an
//! epilog killed) is collected once Slurm says the job ended ([`gc`]: a
//! thread of its own), and the job then ends here as after an epilog.
//!
//! The daemon's loop calls [`Usage::tick`] at every wake-up (at least once a
//! second) and [`Usage::reading`] for each reading; neither blocks.

pub mod gc;
pub mod report;
pub use gpu_health::tally;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime};

use task_plan::jobmap::{self, JobRecord};

use crate::config::Config;
use crate::run_dir::{self, RunDir};
use crate::slurm::Accounting;
use crate::sources::nvml::usage::Reading;
use crate::sources::{self, Source};
use crate::time::now_unix;

pub use gc::Collector;
pub use report::{Reporter, write_admin_comment};
pub use tally::Tally;

/// Most names looked at in `run_dir/jobs` in one scan.
const MAX_SCAN: usize = 65_536;
/// Most records summed: the tally's own cap, so that no job is ever dropped
/// from it and taken up again every reading.
const MAX_KEPT: usize = tally::MAX_JOBS;
/// The live summaries' directory's mode: users open their own file by
/// name, no one lists the directory.
const USAGE_DIR_MODE: u32 = 0o711;
/// A live summary's mode: root's; the job's user reads it through an ACL
/// (the group bits then show the ACL's mask: 0440).
const LIVE_MODE: u32 = 0o400;

/// What a scan of `run_dir/jobs` found.
///
/// The rule, when there are more records than the agent sums: the names
/// are read up to [`MAX_SCAN`]; the records kept are the [`MAX_KEPT`]
/// newest (the file's modification time, the prolog's write; then the
/// higher job id), the same on every scan; a job is taken as ended only
/// when its record is gone from a scan that saw every name, never because
/// it was left past a cap.
#[derive(Debug, Default)]
pub struct Records {
    /// The records summed, by job id.
    pub kept: Vec<JobRecord>,
    /// Every job with a record file (kept or not), with the file's
    /// modification time (the prolog's write).
    pub named: BTreeMap<u32, SystemTime>,
    /// Whether the scan saw every name in the directory.
    pub complete: bool,
}

/// Scans the job records in `dir`: files named by job id, owned by root,
/// not links, parsed; a bad one is skipped (logged at debug). See [`Records`].
pub fn scan_records(dir: &Path) -> Records {
    let Ok(entries) = fs::read_dir(dir) else { return Records { complete: true, ..Records::default() } };
    let mut found: Vec<(std::time::SystemTime, u32, PathBuf)> = Vec::new();
    let mut complete = true;
    for (n, e) in entries.flatten().enumerate() {
        if n >= MAX_SCAN {
            complete = false;
            break;
        }
        let Some(job) = e.file_name().to_str().and_then(jobmap::job_of_file) else { continue };
        // The entry's own time (lstat: a link is not followed; it is refused below).
        let at = e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
        found.push((at, job, e.path()));
    }
    let named: BTreeMap<u32, SystemTime> = found.iter().map(|(at, j, _)| (*j, *at)).collect();
    if found.len() > MAX_KEPT {
        tracing::warn!(dir = %dir.display(), records = found.len(), "over {MAX_KEPT} job records: the newest are summed, the others wait");
    }
    found.sort_by_key(|(at, job, _)| std::cmp::Reverse((*at, *job)));
    let mut kept = Vec::new();
    for (_, job, path) in found.into_iter().take(MAX_KEPT) {
        match read_record(&path) {
            Ok(r) if r.job == job => kept.push(r),
            Ok(_) => tracing::debug!(job, "a job record names another job"),
            Err(why) => tracing::debug!(job, error = %why, "job record skipped"),
        }
    }
    kept.sort_by_key(|r| r.job);
    Records { kept, named, complete }
}

/// The job records in `dir` that are summed ([`scan_records`]).
pub fn read_records(dir: &Path) -> Vec<JobRecord> {
    scan_records(dir).kept
}

/// One record: the plugin's root file, read as every root file the agent
/// trusts (no link followed, root's alone, size-capped).
pub(crate) fn read_record(path: &Path) -> Result<JobRecord, String> {
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
    /// `run_dir/usage`, checked; `None`: no live files.
    usage_dir: Option<RunDir>,
    reporter: Option<Reporter>,
    /// The jobs summed, with their users (the live files' readers).
    live: BTreeMap<u32, u32>,
    last_reading: Instant,
    interval: Duration,
    warned_stale: bool,
    /// Whether the run directory's lack of POSIX ACLs was logged.
    warned_no_acl: bool,
    next_scan: Instant,
    /// The collector of records whose epilog never ran.
    gc: Option<Collector>,
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
        if let Err(e) = run_dir::open(&cfg.run_dir) {
            tracing::error!(error = %e, "the run directory is refused: per-job GPU use is off");
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
        let mut usage = Usage::new(cfg, node, reporter);
        match Collector::spawn(cfg, gc::Rules::default()) {
            Ok(gc) => usage.set_collector(gc),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the job-record collector: records whose epilog never ran stay");
            }
        }
        Some((usage, rx))
    }

    /// Without threads (tests).
    pub fn new(cfg: &Config, node: &str, reporter: Option<Reporter>) -> Usage {
        let usage_dir =
            run_dir::open(&cfg.run_dir).and_then(|d| run_dir::sub_dir(&d, jobmap::USAGE_DIR, USAGE_DIR_MODE));
        let usage_dir = match usage_dir {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(error = %e, "no live usage directory: `spank-gpu usage` sees no running job here");
                None
            }
        };
        // Live files of jobs that ended while no agent ran: gone.
        if let Some(dir) = &usage_dir {
            let running = scan_records(&cfg.run_dir.join(jobmap::JOBS_DIR)).named;
            for e in fs::read_dir(dir.path()).into_iter().flatten().flatten() {
                let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
                if jobmap::job_of_file(&name).is_some_and(|j| !running.contains_key(&j)) {
                    let _ = run_dir::remove_file(dir, &name);
                }
            }
        }
        let (interval_s, now) = (cfg.usage_interval.as_secs().max(1), Instant::now());
        Usage {
            tally: Tally::new(node, interval_s),
            run_dir: cfg.run_dir.clone(),
            usage_dir,
            reporter,
            live: BTreeMap::new(),
            last_reading: now,
            interval: cfg.usage_interval,
            warned_stale: false,
            warned_no_acl: false,
            next_scan: now,
            gc: None,
        }
    }

    /// Collects the records of jobs whose epilog never ran with `gc`
    /// ([`Usage::start`] starts one with [`gc::Rules::default`]).
    pub fn set_collector(&mut self, gc: Collector) {
        self.gc = Some(gc);
    }

    /// The collector of records whose epilog never ran, when one runs.
    pub fn collector(&self) -> Option<&Collector> {
        self.gc.as_ref()
    }

    fn records(&self) -> Records {
        scan_records(&self.run_dir.join(jobmap::JOBS_DIR))
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
        for (job, usage) in self.tally.add(reading, &records.kept) {
            if records.named.contains_key(&job) {
                tracing::warn!(
                    job,
                    "over {} jobs summed on this node: the earliest begun reported now as if it had ended",
                    tally::MAX_JOBS
                );
            }
            self.end(job, usage);
        }
        self.sync(&records, reading.at);
        for r in &records.kept {
            self.write_live(r.job);
        }
    }

    /// Looks at the records now, whenever the last look was.
    pub fn tick_now(&mut self) {
        self.next_scan = Instant::now();
        self.tick();
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
        if let Some(gc) = &mut self.gc {
            gc.tick(now, &records.named);
        }
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

    /// Opens the summaries of new jobs; ends those whose records are gone
    /// (from a scan that saw every name: see [`Records`]).
    fn sync(&mut self, records: &Records, now: u64) {
        // Ended first: a full tally has room for the jobs that follow.
        let still: BTreeSet<u32> = if records.complete {
            records.named.keys().copied().collect()
        } else {
            self.tally.jobs().collect()
        };
        for (job, usage) in self.tally.ended(&still) {
            self.end(job, usage);
        }
        for r in &records.kept {
            if !self.live.contains_key(&r.job) {
                self.tally.open(r, now);
                self.live.insert(r.job, r.uid);
                self.write_live(r.job);
            }
        }
        self.live = records.kept.iter().map(|r| (r.job, r.uid)).collect();
    }

    /// Ends job `job` here: its live file removed, its final summary
    /// logged and handed to the reporter.
    fn end(&self, job: u32, usage: gpu_health::usage::NodeUsage) {
        self.remove_live(job);
        tracing::info!(job, summary = %usage.to_word(), "job ended");
        if let Some(rep) = &self.reporter {
            rep.send(job, usage);
        }
    }

    /// Writes job `job`'s live summary: root's file, mode 0400, readable by
    /// the job's user through an ACL, all set before it takes the name (a
    /// record without a user: root's alone). Never the user's own file: its
    /// owner could make it writable and fill `/run`.
    fn write_live(&mut self, job: u32) {
        let (Some(dir), Some(u)) = (&self.usage_dir, self.tally.summary(job)) else { return };
        let reader = self.live.get(&job).copied().filter(|u| *u != u32::MAX && *u != 0);
        let text = format!("{}\n", u.to_word());
        match run_dir::write_file(dir, &jobmap::file_name(job), text.as_bytes(), LIVE_MODE, reader) {
            Ok(run_dir::Granted::AsAsked) => {}
            Ok(run_dir::Granted::RootOnly) => {
                if !self.warned_no_acl {
                    self.warned_no_acl = true;
                    tracing::warn!(
                        dir = %dir.path().display(),
                        "live summaries readable by root only: run_dir's file system has no POSIX ACLs; spank-gpu usage cannot read running jobs here"
                    );
                }
            }
            Err(e) => tracing::debug!(job, error = %e, "cannot write the live summary"),
        }
    }

    fn remove_live(&self, job: u32) {
        if let Some(dir) = &self.usage_dir {
            let _ = run_dir::remove_file(dir, &jobmap::file_name(job));
        }
    }
}
