//! Job records whose epilog never ran: collected once Slurm says the job
//! ended, never while it runs, never on a failing or hanging `scontrol`,
//! never for a job a slurmstepd still runs for; DCGM exporter's files
//! rewritten from the records left; the job ended in the tally.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use gpu_node_agent::config::Config;
use gpu_node_agent::usage::gc::{self, Collected, Rules};
use gpu_node_agent::usage::{Collector, Usage};
use task_plan::jobmap::{self, HeldGpu, JobRecord};

fn root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

fn base(name: &str) -> PathBuf {
    let base = std::env::temp_dir().join(format!("agent-gc-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(base.join("run/jobs")).unwrap();
    fs::create_dir_all(base.join("run/hpc-jobs")).unwrap();
    for (d, m) in [("", 0o755), ("run", 0o755), ("run/jobs", 0o700), ("run/hpc-jobs", 0o755)] {
        fs::set_permissions(base.join(d), fs::Permissions::from_mode(m)).unwrap();
    }
    base
}

/// The plugin's record of `job` holding NVML GPUs `gpus`, written `age` ago.
fn record(run: &Path, job: u32, gpus: &[u32], age: Duration) -> SystemTime {
    let gpus = gpus.iter().map(|&nvml| HeldGpu { nvml, mig: None, uuid: String::new() }).collect();
    let r = JobRecord { job, uid: 1000, gpus };
    let path = run.join("jobs").join(job.to_string());
    fs::write(&path, r.to_text()).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let at = SystemTime::now() - age;
    fs::File::options().write(true).open(&path).unwrap().set_modified(at).unwrap();
    at
}

/// DCGM exporter's files as the plugin wrote them for `records`.
fn dcgm_as_plugin(run: &Path) {
    let mut records = Vec::new();
    for e in fs::read_dir(run.join("jobs")).unwrap() {
        records.push(JobRecord::parse(&fs::read_to_string(e.unwrap().path()).unwrap()).unwrap());
    }
    for (name, ids) in jobmap::dcgm_files(&records) {
        fs::write(run.join("hpc-jobs").join(name), jobmap::dcgm_text(&ids)).unwrap();
    }
}

fn dcgm(run: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = fs::read_dir(run.join("hpc-jobs"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), fs::read_to_string(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// A fake `scontrol -o show job ID`: each call logged in `calls`.
fn fake_scontrol(base: &Path) -> PathBuf {
    let line = |job: u32, name: &str, state: &str| {
        format!(
            "JobId={job} JobName={name} UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=1 \
             Nice=0 Account=lab QOS=normal JobState={state} Reason=None Dependency=(null) NodeList=node1"
        )
    };
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> {calls}\n[ \"$1 $2 $3\" = '-o show job' ] || exit 2\ncase \"$4\" in\n\
         101) echo '{l101}' ;;\n\
         102) echo '{l102}' ;;\n\
         103) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n\
         104) echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1 ;;\n\
         105) exec sleep 30 ;;\n\
         106) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n\
         107) echo '{l107}' ;;\n\
         108) echo '{l108}' ;;\n\
         109) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n\
         110) echo '{l110}' ;;\n\
         *) exit 3 ;;\nesac\n",
        calls = base.join("calls").display(),
        l101 = line(101, "train", "COMPLETED"),
        l102 = line(102, "train", "RUNNING"),
        l107 = line(107, "x JobState=COMPLETED", "RUNNING"),
        l108 = line(108, "train", "COMPLETING"),
        l110 = line(110, "x JobState=COMPLETED\nx", "RUNNING"),
    );
    let path = base.join("scontrol");
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn asked(base: &Path) -> Vec<String> {
    let calls = fs::read_to_string(base.join("calls")).unwrap_or_default();
    let mut jobs: Vec<String> =
        calls.lines().filter_map(|l| l.split(' ').nth(3)).map(str::to_owned).collect();
    jobs.sort();
    jobs.dedup();
    jobs
}

/// A root process titled as slurmstepd titles itself for job `job`.
fn fake_stepd(job: u32) -> Child {
    let child = Command::new("bash")
        .args(["-c", &format!("exec -a 'slurmstepd: [{job}.0]' sleep 60")])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let cmdline = format!("/proc/{}/cmdline", child.id());
    while !fs::read(&cmdline).unwrap_or_default().starts_with(b"slurmstepd: [") {
        assert!(Instant::now() < deadline, "the fake slurmstepd never took its title");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

fn config(base: &Path) -> Config {
    Config {
        run_dir: base.join("run"),
        scontrol: fake_scontrol(base),
        scontrol_timeout: Duration::from_secs(1),
        ..Config::default()
    }
}

fn rules() -> Rules {
    Rules { every: Duration::ZERO, per_round: 32, ..Rules::default() }
}

/// One round of the collector: the records handed over, then its end waited for.
fn round(u: &mut Usage) {
    let done = u.collector().unwrap().stats().rounds.load(std::sync::atomic::Ordering::Relaxed);
    u.tick_now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while u.collector().unwrap().stats().rounds.load(std::sync::atomic::Ordering::Relaxed) == done {
        assert!(Instant::now() < deadline, "no round within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The daemon's next look: the collected jobs end in the tally.
    u.tick_now();
}

#[test]
fn records_of_ended_jobs_are_collected_and_no_others() {
    if !root() {
        return; // Run as root in CI: the directories must be root's.
    }
    let base = base("rule");
    let run = base.join("run");
    let hour = Duration::from_secs(3600);
    record(&run, 101, &[0], hour); // COMPLETED
    record(&run, 102, &[0, 1], hour); // RUNNING: an idle salloc, no slurmstepd
    record(&run, 103, &[2], hour); // a slurmstepd runs for it: never asked
    record(&run, 104, &[3], hour); // scontrol fails
    record(&run, 105, &[3], hour); // scontrol hangs
    record(&run, 106, &[4], hour); // slurmctld no longer holds it
    record(&run, 107, &[5], hour); // its name imitates an ended state
    record(&run, 108, &[5], hour); // COMPLETING: an epilog still runs
    record(&run, 109, &[6], Duration::from_secs(60)); // within the grace: never asked
    record(&run, 110, &[5], hour); // its name ends the first line with an ended state
    dcgm_as_plugin(&run);
    let mut stepd = fake_stepd(103);
    let cfg = config(&base);
    let mut u = Usage::new(&cfg, "node1", None);
    u.set_collector(Collector::spawn(&cfg, rules()).unwrap());
    u.tick_now();
    assert_eq!(u.tally.jobs().collect::<Vec<_>>(), vec![101, 102, 103, 104, 105, 106, 107, 108, 109, 110]);
    round(&mut u);

    let left: Vec<String> = {
        let mut v: Vec<String> = fs::read_dir(run.join("jobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(left, ["102", "103", "104", "105", "107", "108", "109", "110"], "101 and 106 collected");
    assert_eq!(
        asked(&base),
        ["101", "102", "104", "105", "106", "107", "108", "110"],
        "not 103 (slurmstepd), not 109 (young)"
    );
    assert_eq!(
        u.tally.jobs().collect::<Vec<_>>(),
        vec![102, 103, 104, 105, 107, 108, 109, 110],
        "ended in the tally"
    );
    assert_eq!(u.collector().unwrap().stats().collected.load(std::sync::atomic::Ordering::Relaxed), 2);
    // DCGM exporter's files from the records left: GPU 0 no longer names 101,
    // GPU 4 (106's alone) gone; root's, 0644.
    let want: Vec<(String, String)> = [
        ("0", "102\n"),
        ("1", "102\n"),
        ("2", "103\n"),
        ("3", "104\n105\n"),
        ("5", "107\n108\n110\n"),
        ("6", "109\n"),
    ]
    .iter()
    .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
    .collect();
    assert_eq!(dcgm(&run), want);
    let m = fs::metadata(run.join("hpc-jobs/0")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o644));
    assert_eq!(fs::metadata(run.join("hpc-jobs")).unwrap().mode() & 0o7777, 0o755);
    assert!(
        fs::read_dir(run.join("hpc-jobs")).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')),
        "no temporary file left"
    );
    // Those kept rest: the next round asks no one again (retry 10 min).
    fs::remove_file(base.join("calls")).unwrap();
    round(&mut u);
    assert!(asked(&base).is_empty(), "{:?}", asked(&base));
    // Its slurmstepd gone, job 103 is asked about (slurmctld no longer holds
    // it) and collected.
    let _ = stepd.kill();
    let _ = stepd.wait();
    round(&mut u);
    assert_eq!(asked(&base), ["103"]);
    assert!(!run.join("jobs/103").exists());
    assert!(!run.join("hpc-jobs/2").exists());
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_held_lock_or_a_new_prolog_keeps_the_record() {
    if !root() {
        return;
    }
    let base = base("lock");
    let run = base.join("run");
    let written = record(&run, 106, &[4], Duration::from_secs(3600));
    dcgm_as_plugin(&run);
    // A prolog or epilog holds the job map's lock past 2 s.
    let lock = fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(run.join("jobs.lock"))
        .unwrap();
    fs::set_permissions(run.join("jobs.lock"), fs::Permissions::from_mode(0o600)).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let cfg = config(&base);
    let mut u = Usage::new(&cfg, "node1", None);
    u.set_collector(Collector::spawn(&cfg, rules()).unwrap());
    let t = Instant::now();
    round(&mut u);
    assert!(t.elapsed() >= Duration::from_secs(2), "it waited for the lock");
    assert!(run.join("jobs/106").exists(), "the lock was not had: kept");
    assert_eq!(u.tally.jobs().collect::<Vec<_>>(), vec![106]);
    // Released: the next round collects it (a lock missed is no rest).
    drop(lock);
    round(&mut u);
    assert!(!run.join("jobs/106").exists());
    assert_eq!(u.tally.jobs().count(), 0);
    assert!(dcgm(&run).is_empty(), "GPU 4's file removed");

    // A record written again since it was found (a new prolog) is kept.
    let written2 = record(&run, 109, &[1], Duration::from_secs(3600));
    let e = gc::collect(&run, 109, written).unwrap_err();
    assert!(e.contains("written again"), "{e}");
    assert!(run.join("jobs/109").exists());
    assert!(matches!(gc::collect(&run, 109, written2).unwrap(), Collected::Removed { dcgm: Ok(()) }));
    assert!(matches!(gc::collect(&run, 109, written2).unwrap(), Collected::Gone));
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_dry_run_removes_nothing() {
    if !root() {
        return;
    }
    let base = base("dry");
    let run = base.join("run");
    record(&run, 101, &[0], Duration::from_secs(3600));
    dcgm_as_plugin(&run);
    let cfg = Config { dry_run: true, ..config(&base) };
    let mut u = Usage::new(&cfg, "node1", None);
    u.set_collector(Collector::spawn(&cfg, rules()).unwrap());
    round(&mut u);
    assert_eq!(asked(&base), ["101"]);
    assert!(run.join("jobs/101").exists());
    assert_eq!(dcgm(&run), [("0".to_owned(), "101\n".to_owned())]);
    fs::remove_dir_all(&base).unwrap();
}
