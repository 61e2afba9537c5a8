//! The agent's side of the job map: the run directory it refuses, the live
//! summaries only the job's user (and root) reads, and the records it sums when there
//! are more than it can (the newest, and no job taken as ended for it).
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gpu_node_agent::config::Config;
use gpu_node_agent::usage::{Usage, scan_records, tally};
use task_plan::jobmap::{HeldGpu, JobRecord};

fn root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

fn run_dir(name: &str) -> PathBuf {
    let base = std::env::temp_dir().join(format!("agent-jobmap-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(base.join("run/jobs")).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(base.join("run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(base.join("run/jobs"), fs::Permissions::from_mode(0o700)).unwrap();
    base.join("run")
}

/// The plugin's record of `job` for user `uid`, written `age` ago.
fn record(run: &Path, job: u32, uid: u32, age: Duration) {
    let r = JobRecord { job, uid, gpus: vec![HeldGpu { nvml: 0, mig: None, uuid: String::new() }] };
    let path = run.join("jobs").join(job.to_string());
    fs::write(&path, r.to_text()).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let f = fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

fn config(run: &Path) -> Config {
    Config { run_dir: run.to_path_buf(), ..Config::default() }
}

#[test]
fn live_summaries_are_the_job_users_alone() {
    if !root() {
        return; // Run as root in CI: the directories must be root's.
    }
    let run = run_dir("live");
    record(&run, 42, 65534, Duration::ZERO);
    let mut u = Usage::new(&config(&run), "node1", None);
    u.tick();
    let usage = fs::metadata(run.join("usage")).unwrap();
    assert_eq!((usage.uid(), usage.mode() & 0o7777), (0, 0o711), "users open their file, list nothing");
    // Root's, never the user's (who could make it writable and fill /run);
    // the user reads it through an ACL (the group bits show its mask).
    let live = fs::metadata(run.join("usage/42")).unwrap();
    assert_eq!((live.uid(), live.gid(), live.mode() & 0o7777), (0, 0, 0o440));
    let read = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(run.join("usage/42"))
        .output()
        .unwrap();
    assert!(read.status.success() && read.stdout.starts_with(b"sgu1;"), "{read:?}");
    let other = std::process::Command::new("setpriv")
        .args(["--reuid=65533", "--regid=65533", "--clear-groups", "cat"])
        .arg(run.join("usage/42"))
        .output()
        .unwrap();
    assert!(!other.status.success(), "another user reads nothing");
    // The record gone (the epilog ran): the job ends, its live file goes.
    fs::remove_file(run.join("jobs/42")).unwrap();
    u.tick_now();
    assert!(!run.join("usage/42").exists());
    assert_eq!(u.tally.jobs().count(), 0);
    fs::remove_dir_all(run.parent().unwrap()).unwrap();
}

#[test]
fn a_users_run_directory_turns_per_job_use_off() {
    if !root() {
        return;
    }
    let run = run_dir("user");
    std::os::unix::fs::chown(&run, Some(65534), None).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    assert!(Usage::start(&config(&run), "node1", &stop).is_none());
    // Nothing was made in it, nor a live file written by path.
    let u = Usage::new(&config(&run), "node1", None);
    drop(u);
    assert!(!run.join("usage").exists());
    fs::remove_dir_all(run.parent().unwrap()).unwrap();
}

#[test]
fn over_the_cap_the_newest_are_summed_and_no_live_job_is_ended() {
    if !root() {
        return;
    }
    let run = run_dir("cap");
    let cap = tally::MAX_JOBS;
    let n = u32::try_from(cap).unwrap() + 40;
    // Job 1 is the newest, job n the oldest (ids say nothing of age here).
    for job in 1..=n {
        record(&run, job, 1000, Duration::from_secs(u64::from(job) * 60));
    }
    let scan = scan_records(&run.join("jobs"));
    assert!(scan.complete);
    assert_eq!(scan.named.len(), usize::try_from(n).unwrap());
    let kept: Vec<u32> = scan.kept.iter().map(|r| r.job).collect();
    assert_eq!(
        kept,
        (1..=u32::try_from(cap).unwrap()).collect::<Vec<_>>(),
        "the newest, by the prolog's write"
    );
    let mut u = Usage::new(&config(&run), "node1", None);
    u.tick();
    assert_eq!(u.tally.jobs().count(), cap);
    // A record left out by the cap is not a job that ended; one gone is.
    fs::remove_file(run.join("jobs/1")).unwrap();
    u.tick_now();
    assert!(!u.tally.jobs().any(|j| j == 1), "its record is gone: ended");
    assert_eq!(u.tally.jobs().count(), cap, "the next newest taken up");
    for _ in 0..3 {
        u.tick_now();
        assert_eq!(u.tally.jobs().count(), cap, "no churn");
    }
    fs::remove_dir_all(run.parent().unwrap()).unwrap();
}
