//! Job records whose epilog never ran (slurmd killed or restarted while the
//! job ended, an epilog killed at its timeout): collected, so that they no
//! longer name dead jobs in DCGM exporter's mapping files and in the tally.
//!
//! The rule:
//!
//! 1. A record is a candidate when its file is older than [`Rules::grace`]
//!    (its modification time: the prolog's write) and no root process of
//!    the job runs here: `slurmstepd` sets its title to `slurmstepd:
//!    [JOBID.STEP]` (`[JOBID.STEP stepmgr]` for a step manager, and on
//!    26.05 the namespace holder's `[JOBID:namespace]`):
//!    `_set_job_log_prefix()` in src/slurmd/slurmstepd/slurmstepd.c and
//!    `setproctitle()` in src/common/setproctitle.c, the same at
//!    slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1. No slurmstepd
//!    alone does not prove the job left: an idle `salloc` under
//!    `PrologFlags=Alloc` without `Contain` has none, nor has a job between
//!    two steps.
//! 2. Slurm decides: `scontrol -o show job JOBID` ([`read_show_job`]). Only
//!    "Invalid job id specified" (slurmctld no longer holds the job, which
//!    it keeps `MinJobAge` after its end) or a `JobState` that has ended
//!    ([`ENDED`]) counts; `COMPLETING` (an epilog still runs somewhere), any
//!    live state, any error or timeout keep the record, asked again after
//!    [`Rules::retry`].
//! 3. An ended job's record is removed under the job map's lock
//!    (`run_dir/jobs.lock`, as the plugin's prologs and epilogs take it:
//!    spank-plugin/src/sysio.rs), unless it was written again since it was
//!    found (a new prolog), and DCGM exporter's files are rewritten from the
//!    records left. The daemon's next scan then ends the job in the tally
//!    as an epilog would have, its summary reported.
//!
//! The daemon's loop only hands over, once per [`Rules::every`], the jobs
//! whose records are older than the grace ([`Collector::tick`]); a thread
//! of its own reads `/proc` (a process's `cmdline` can block while its
//! memory map is locked), asks `scontrol` and removes, at most
//! [`Rules::per_round`] jobs per round, the oldest records first.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags, fchmod, flock, fstat, openat};
use rustix::io::Errno;
pub use task_plan::jobmap::stale::{ENDED, Verdict, candidates, old_records, status_real_uid, stepd_job};
use task_plan::jobmap::stale::{INVALID_JOB, job_state};
use task_plan::jobmap::{self, JobRecord};

use crate::config::Config;
use crate::run_dir::{self, RunDir};
use crate::slurm::{Slurm, SlurmError, SlurmErrorKind};

/// How long another prolog or epilog may hold the job map's lock before
/// the collection is left for a later round (the plugin waits as long).
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// The job records' directory's mode, and DCGM exporter's directory's and
/// files' (the plugin's: spank-plugin/src/sysio.rs, `open_run_dir`).
const JOBS_DIR_MODE: u32 = 0o700;
const DCGM_DIR_MODE: u32 = 0o755;
const DCGM_FILE_MODE: u32 = 0o644;
/// Most of a process's command line read (the title is shorter).
const CMDLINE_HEAD: u64 = 64;
/// Most records read to rewrite DCGM exporter's files.
const MAX_RECORDS: usize = 65_536;
/// Rounds the thread may miss in a row before it is said to be stuck.
const MISSED_WARN: u32 = 10;

/// When and how much the collector does.
#[derive(Clone, Debug)]
pub struct Rules {
    /// A record younger than this is never a candidate.
    pub grace: Duration,
    /// How often the daemon hands over the old records (one round).
    pub every: Duration,
    /// How long a job Slurm says is alive, or that could not be asked
    /// about, rests before it is asked again.
    pub retry: Duration,
    /// Most `scontrol` calls per round.
    pub per_round: usize,
    /// Where the processes are (`/proc`).
    pub proc_dir: PathBuf,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            grace: Duration::from_secs(600),
            every: Duration::from_secs(60),
            retry: Duration::from_secs(600),
            per_round: 4,
            proc_dir: PathBuf::from("/proc"),
        }
    }
}

/// Reads `scontrol -o show job JOB`'s answer ([`Verdict`]).
pub fn read_show_job(job: u32, answer: &Result<String, SlurmError>) -> Verdict {
    match answer {
        Err(SlurmError { kind: SlurmErrorKind::Failed { stderr, .. }, .. })
            if stderr.contains(INVALID_JOB) =>
        {
            Verdict::Ended(format!("slurmctld no longer holds the job ({INVALID_JOB})"))
        }
        Err(e) => Verdict::Unknown(e.to_string()),
        Ok(out) => match job_state(job, out) {
            Ok(state) if ENDED.contains(&state) => Verdict::Ended(format!("its state is {state}")),
            Ok(state) => Verdict::Alive(state.to_owned()),
            Err(why) => Verdict::Unknown(why),
        },
    }
}

/// What the thread did, counted (read by tests and metrics).
#[derive(Debug, Default)]
pub struct Stats {
    /// Rounds done.
    pub rounds: AtomicU64,
    /// Jobs Slurm was asked about.
    pub asked: AtomicU64,
    /// Records removed.
    pub collected: AtomicU64,
}

/// The daemon's side of the collector: hands the old records to its thread.
#[derive(Debug)]
pub struct Collector {
    tx: SyncSender<Vec<(u32, SystemTime)>>,
    grace: Duration,
    every: Duration,
    next: Instant,
    missed: u32,
    stats: Arc<Stats>,
}

/// The thread's side.
struct Worker {
    slurm: Slurm,
    run_dir: PathBuf,
    dry_run: bool,
    rules: Rules,
    stats: Arc<Stats>,
}

impl Collector {
    /// Starts the thread: `scontrol` and its deadline, the run directory
    /// and `dry_run` (nothing removed, what would be is logged) from `cfg`.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn spawn(cfg: &Config, rules: Rules) -> io::Result<Collector> {
        let (tx, rx) = mpsc::sync_channel(1);
        let stats = Arc::new(Stats::default());
        let collector = Collector {
            tx,
            grace: rules.grace,
            every: rules.every,
            next: Instant::now(),
            missed: 0,
            stats: Arc::clone(&stats),
        };
        let worker = Worker {
            slurm: Slurm { scontrol: cfg.scontrol.clone(), timeout: cfg.scontrol_timeout },
            run_dir: cfg.run_dir.clone(),
            dry_run: cfg.dry_run,
            rules,
            stats,
        };
        thread::Builder::new().name("job-records-gc".to_owned()).spawn(move || worker.run(&rx))?;
        Ok(collector)
    }

    /// What the thread did.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// From the daemon's loop, with every record's write time: once per
    /// [`Rules::every`], hands the old ones to the thread (never waits: a
    /// thread still busy with the last round skips this one).
    pub fn tick(&mut self, now: Instant, named: &BTreeMap<u32, SystemTime>) {
        if now < self.next {
            return;
        }
        self.next = now + self.every;
        match self.tx.try_send(old_records(named, SystemTime::now(), self.grace)) {
            Ok(()) => self.missed = 0,
            Err(TrySendError::Full(_)) => {
                self.missed += 1;
                if self.missed == MISSED_WARN {
                    tracing::warn!(
                        "the job-record collector has not finished a round in {MISSED_WARN} tries (a process's /proc entry or scontrol does not answer)"
                    );
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

impl Worker {
    fn run(&self, rx: &Receiver<Vec<(u32, SystemTime)>>) {
        let mut resting: BTreeMap<u32, Instant> = BTreeMap::new();
        while let Ok(old) = rx.recv() {
            let now = Instant::now();
            let still: BTreeSet<u32> = old.iter().map(|(j, _)| *j).collect();
            resting.retain(|j, until| *until > now && still.contains(j));
            if !old.is_empty() {
                let stepd = stepd_jobs(&self.rules.proc_dir);
                let rest: BTreeSet<u32> = resting.keys().copied().collect();
                for (job, written) in candidates(&old, &stepd, &rest, self.rules.per_round) {
                    if let Some(wait) = self.settle(job, written) {
                        resting.insert(job, Instant::now() + wait);
                    }
                }
            }
            self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks Slurm about job `job` and collects its record when it has
    /// ended; how long the job rests when the record stays.
    fn settle(&self, job: u32, written: SystemTime) -> Option<Duration> {
        // The batch was listed a while ago: a record the epilog (or a round
        // before) removed since, or a new prolog rewrote, needs no question.
        let path = self.run_dir.join(jobmap::JOBS_DIR).join(jobmap::file_name(job));
        if fs::symlink_metadata(&path).and_then(|m| m.modified()).ok() != Some(written) {
            return None;
        }
        self.stats.asked.fetch_add(1, Ordering::Relaxed);
        let answer = self.slurm.run(&["-o", "show", "job", &job.to_string()]);
        let why = match read_show_job(job, &answer) {
            Verdict::Ended(why) => why,
            Verdict::Alive(state) => {
                tracing::debug!(job, state, "an old job record whose job is still alive: kept");
                return Some(self.rules.retry);
            }
            Verdict::Unknown(why) => {
                tracing::debug!(job, error = %why, "an old job record, its job's state unknown: kept, asked again later");
                return Some(self.rules.retry);
            }
        };
        if self.dry_run {
            tracing::info!(job, why, "dry run: would collect the job's record (its epilog never removed it)");
            return Some(self.rules.retry);
        }
        match collect(&self.run_dir, job, written) {
            Ok(Collected::Removed { dcgm }) => {
                self.stats.collected.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    job,
                    why,
                    "job record collected: the job has ended, its epilog never removed the record"
                );
                if let Err(e) = dcgm {
                    tracing::warn!(job, error = %e, "DCGM exporter's job files not rewritten; the next prolog or epilog rewrites them");
                }
                None
            }
            Ok(Collected::Gone) => None,
            Err(e) => {
                tracing::info!(job, error = %e, "job record not collected now: tried again next round");
                None
            }
        }
    }
}

/// The jobs a root process titled as a slurmstepd ([`stepd_job`]) runs
/// for, from `proc_dir` (`/proc`); an entry that cannot be read is none.
pub fn stepd_jobs(proc_dir: &Path) -> BTreeSet<u32> {
    let mut jobs = BTreeSet::new();
    let Ok(entries) = fs::read_dir(proc_dir) else { return jobs };
    for e in entries.flatten() {
        if !e.file_name().to_str().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let dir = e.path();
        let mut head = Vec::new();
        if File::open(dir.join("cmdline")).and_then(|f| f.take(CMDLINE_HEAD).read_to_end(&mut head)).is_err()
        {
            continue;
        }
        let Some(job) = stepd_job(&head) else { continue };
        let mut status = String::new();
        let read = File::open(dir.join("status")).and_then(|f| f.take(8192).read_to_string(&mut status));
        if read.is_ok() && status_real_uid(&status) == Some(0) {
            jobs.insert(job);
        }
    }
    jobs
}

/// What [`collect`] did.
#[derive(Debug)]
pub enum Collected {
    /// The record was removed; whether DCGM exporter's files were rewritten.
    Removed {
        /// The rewrite's outcome.
        dcgm: Result<(), String>,
    },
    /// It was gone already (the epilog ran after all).
    Gone,
}

/// Removes job `job`'s record under the job map's lock, unless it is no
/// longer the one written at `written` (a new prolog wrote it), and
/// rewrites DCGM exporter's files from the records left.
///
/// # Errors
/// The run directory is refused, the lock is not had within 2 s, the record
/// was written again, or it cannot be removed.
pub fn collect(run: &Path, job: u32, written: SystemTime) -> Result<Collected, String> {
    let dir = run_dir::open(run)?;
    let _lock = lock_jobs(&dir)?;
    let jobs = run_dir::sub_dir(&dir, jobmap::JOBS_DIR, JOBS_DIR_MODE)?;
    let name = jobmap::file_name(job);
    match fs::symlink_metadata(jobs.path().join(&name)).and_then(|m| m.modified()) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Collected::Gone),
        Err(e) => return Err(format!("{}/{name}: {e}", jobs.path().display())),
        Ok(at) if at != written => return Err("the record was written again since it was found".to_owned()),
        Ok(_) => {}
    }
    run_dir::remove_file(&jobs, &name)?;
    Ok(Collected::Removed { dcgm: refresh_dcgm(&dir, &jobs) })
}

/// Takes the job map's lock (`jobs.lock` beside the records' directory,
/// as the plugin does: root's, mode 0600, not through a link), waiting at
/// most [`LOCK_WAIT`]; held until the descriptor is dropped.
fn lock_jobs(dir: &RunDir) -> Result<OwnedFd, String> {
    let name = format!("{}.lock", jobmap::JOBS_DIR);
    let path = dir.path().join(&name);
    let named = |e: Errno| format!("{}: {}", path.display(), io::Error::from(e));
    let fd = openat(
        dir,
        name.as_str(),
        OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(named)?;
    let st = fstat(&fd).map_err(named)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != 0 {
        return Err(format!("{}: not root's file", path.display()));
    }
    if st.st_mode & 0o7777 != 0o600 {
        fchmod(&fd, Mode::from_raw_mode(0o600)).map_err(named)?;
    }
    let started = Instant::now();
    loop {
        match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(fd),
            Err(Errno::WOULDBLOCK) if started.elapsed() < LOCK_WAIT => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(Errno::WOULDBLOCK) => {
                return Err(format!("{} is held by a prolog or epilog past {LOCK_WAIT:?}", path.display()));
            }
            Err(e) => return Err(named(e)),
        }
    }
}

/// Every record in `jobs` (read as [`super::scan_records`] reads them, up
/// to [`MAX_RECORDS`] names).
fn all_records(jobs: &Path) -> Vec<JobRecord> {
    let Ok(entries) = fs::read_dir(jobs) else { return Vec::new() };
    entries
        .flatten()
        .take(MAX_RECORDS)
        .filter_map(|e| {
            let job = e.file_name().to_str().and_then(jobmap::job_of_file)?;
            super::read_record(&e.path()).ok().filter(|r| r.job == job)
        })
        .collect()
}

/// Rewrites DCGM exporter's files (`run_dir/hpc-jobs`) from the records in
/// `jobs`, the lock held, as the plugin's prolog and epilog do: a GPU's file
/// names the jobs holding it; a file no job needs is removed (only names the
/// format writes); root's, mode 0644.
fn refresh_dcgm(dir: &RunDir, jobs: &RunDir) -> Result<(), String> {
    let want = jobmap::dcgm_files(&all_records(jobs.path()));
    let dcgm = run_dir::sub_dir(dir, jobmap::DCGM_DIR, DCGM_DIR_MODE)?;
    let names = fs::read_dir(dcgm.path()).map_err(|e| format!("{}: {e}", dcgm.path().display()))?;
    for e in names.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
        if jobmap::is_dcgm_name(&name) && !want.contains_key(&name) {
            run_dir::remove_file(&dcgm, &name)?;
        }
    }
    for (name, ids) in &want {
        let text = jobmap::dcgm_text(ids);
        let now = slurm_formats::trusted::read_trusted(&dcgm.path().join(name), 4096, &[0]).ok();
        if now.as_deref() != Some(text.as_bytes()) {
            run_dir::write_file(&dcgm, name, text.as_bytes(), DCGM_FILE_MODE, None)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u64 = 1_800_000_000;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn only_records_past_the_grace_without_a_slurmstepd_are_candidates_oldest_first() {
        let grace = Duration::from_secs(600);
        let named: BTreeMap<u32, SystemTime> = [
            (10, at(AT - 3600)),
            (11, at(AT - 599)), // within the grace
            (12, at(AT - 600)), // just past it
            (13, at(AT + 60)),  // written "in the future": a clock set back
            (14, at(AT - 7200)),
            (15, at(AT - 7200)),
            (16, at(AT - 90_000)),
        ]
        .into_iter()
        .collect();
        let old = old_records(&named, at(AT), grace);
        assert_eq!(old.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![10, 12, 14, 15, 16]);
        let stepd: BTreeSet<u32> = [16, 99].into_iter().collect();
        let resting: BTreeSet<u32> = [15].into_iter().collect();
        let c = candidates(&old, &stepd, &resting, 10);
        assert_eq!(c.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![14, 10, 12], "oldest first");
        assert_eq!(candidates(&old, &BTreeSet::new(), &BTreeSet::new(), 2).len(), 2, "bounded");
        assert_eq!(
            candidates(&old, &BTreeSet::new(), &BTreeSet::new(), 2)
                .iter()
                .map(|(j, _)| *j)
                .collect::<Vec<_>>(),
            vec![16, 14]
        );
    }

    #[test]
    fn thousands_of_records_are_bounded_and_sorted() {
        let named: BTreeMap<u32, SystemTime> =
            (1..=20_000).map(|j| (j, at(AT - 100_000 + u64::from(j)))).collect();
        let old = old_records(&named, at(AT), Duration::from_secs(600));
        let c = candidates(&old, &BTreeSet::new(), &BTreeSet::new(), 4);
        assert_eq!(c.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn slurmstepd_titles_name_their_job_and_nothing_else_does() {
        assert_eq!(stepd_job(b"slurmstepd: [4242.0]\0\0"), Some(4242));
        assert_eq!(stepd_job(b"slurmstepd: [4242.batch]                 "), Some(4242));
        assert_eq!(stepd_job(b"slurmstepd: [4242.extern]"), Some(4242));
        assert_eq!(stepd_job(b"slurmstepd: [4242.interactive]"), Some(4242));
        assert_eq!(stepd_job(b"slurmstepd: [4242.3 stepmgr]"), Some(4242));
        assert_eq!(stepd_job(b"slurmstepd: [4242:namespace]"), Some(4242));
        assert_eq!(stepd_job(b"slurmstepd: [4242]"), Some(4242));
        // Another job whose id begins the same, other programs, no job.
        assert_eq!(stepd_job(b"slurmstepd: [42420.0]"), Some(42420));
        assert_eq!(stepd_job(b"/usr/sbin/slurmstepd\0spank\0"), None);
        assert_eq!(stepd_job(b"slurmstepd: [x.0]"), None);
        assert_eq!(stepd_job(b"slurmstepd: [4242"), None);
        assert_eq!(stepd_job(b"slurmstepd: [4242x]"), None);
        assert_eq!(stepd_job(b"slurmstepd: [99999999999.0]"), None, "no job id has 11 digits");
        assert_eq!(stepd_job(b"python slurmstepd: [4242.0]"), None);
        assert_eq!(stepd_job(b""), None);
    }

    #[test]
    fn the_real_uid_is_read_from_status() {
        assert_eq!(status_real_uid("Name:\tslurmstepd\nUid:\t0\t0\t0\t0\nGid:\t0\n"), Some(0));
        assert_eq!(status_real_uid("Uid:\t1000\t0\t0\t0\n"), Some(1000), "setuid: the real user");
        assert_eq!(status_real_uid("Name:\tx\n"), None);
    }

    fn line(job: u32, name: &str, state: &str) -> String {
        format!(
            "JobId={job} JobName={name} UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=1 Nice=0 \
             Account=lab QOS=normal JobState={state} Reason=None Dependency=(null) Requeue=1 Restarts=0 \
             BatchFlag=1 Reboot=0 ExitCode=0:0 NodeList=node1 Comment=none\n"
        )
    }

    fn failed(stderr: &str) -> Result<String, SlurmError> {
        Err(SlurmError {
            cmd: "scontrol -o show job 7".to_owned(),
            kind: SlurmErrorKind::Failed {
                status: "exit status: 1".to_owned(),
                stderr: stderr.to_owned(),
                stdout: String::new(),
            },
        })
    }

    #[test]
    fn only_an_unknown_job_or_an_ended_state_is_an_end() {
        let v = |out: String| read_show_job(7, &Ok(out));
        for s in ENDED {
            assert!(matches!(v(line(7, "train", s)), Verdict::Ended(_)), "{s}");
        }
        for s in [
            "RUNNING",
            "PENDING",
            "SUSPENDED",
            "COMPLETING",
            "CONFIGURING",
            "REQUEUED",
            "REQUEUE_HOLD",
            "STAGE_OUT",
            "SIGNALING",
            "EXPEDITING",
            "RESIZING",
            "SOMETHING_NEW",
        ] {
            assert_eq!(v(line(7, "train", s)), Verdict::Alive(s.to_owned()), "{s}");
        }
        assert!(matches!(
            read_show_job(7, &failed("slurm_load_jobs error: Invalid job id specified")),
            Verdict::Ended(_)
        ));
        assert!(matches!(
            read_show_job(7, &failed("slurm_load_jobs error: Socket timed out on send/recv operation")),
            Verdict::Unknown(_)
        ));
        let timeout = Err(SlurmError {
            cmd: "scontrol".to_owned(),
            kind: SlurmErrorKind::Timeout(Duration::from_secs(10)),
        });
        assert!(matches!(read_show_job(7, &timeout), Verdict::Unknown(_)));
        assert!(matches!(v(String::new()), Verdict::Unknown(_)));
    }

    #[test]
    fn a_jobs_own_text_never_reads_as_its_state() {
        let v = |out: String| read_show_job(7, &Ok(out));
        // A name (or comment) that imitates a state: two JobState words.
        assert!(matches!(v(line(7, "x JobState=COMPLETED", "RUNNING")), Verdict::Unknown(_)));
        assert!(matches!(v(line(7, "x\tJobState=COMPLETED", "RUNNING")), Verdict::Unknown(_)));
        // A name holding a newline and a record of its own: two lines of job 7.
        assert!(matches!(v(line(7, "x\nJobId=7 JobState=COMPLETED", "RUNNING")), Verdict::Unknown(_)));
        // A name that ends the first line with a state of its own: the real
        // state is on the next line, which begins with ` UserId=`.
        assert!(matches!(v(line(7, "x JobState=COMPLETED\n", "RUNNING")), Verdict::Unknown(_)));
        assert!(matches!(v(line(7, "x JobState=COMPLETED\nanything", "RUNNING")), Verdict::Unknown(_)));
        // ... or that makes the rest a record of another job.
        assert!(matches!(
            v(line(7, "x JobState=COMPLETED\nJobId=8 JobName=y", "RUNNING")),
            Verdict::Unknown(_)
        ));
        // A comment (after JobState) that adds lines of its own.
        assert!(matches!(
            v(line(7, "a", "RUNNING").replace("Comment=none", "Comment=x\nJobId=7 JobState=COMPLETED")),
            Verdict::Unknown(_)
        ));
        // One line, the final newline or none: read.
        assert_eq!(v(line(7, "a", "RUNNING").trim_end().to_owned()), Verdict::Alive("RUNNING".to_owned()));
        assert!(
            matches!(v(format!("{}\n", line(7, "a", "RUNNING"))), Verdict::Unknown(_)),
            "an empty second line"
        );
        // An array's records (asked by the id the array's tasks share) or a
        // het job's components (asked by the leader's id): several lines,
        // not read; the record is kept.
        let out =
            format!("{}{}{}", line(6, "a", "RUNNING"), line(7, "a", "COMPLETED"), line(70, "a", "RUNNING"));
        assert!(matches!(v(out), Verdict::Unknown(_)));
        let out = format!("{}{}", line(7, "a", "COMPLETED"), line(8, "a", "COMPLETED"));
        assert!(matches!(v(out), Verdict::Unknown(_)));
        assert!(matches!(v(line(6, "a", "COMPLETED")), Verdict::Unknown(_)), "another job's record");
        assert!(matches!(v("\n".to_owned()), Verdict::Unknown(_)));
        assert!(matches!(v(line(7, "a", "running")), Verdict::Unknown(_)));
    }
}
