//! The job prolog and epilog: the job's record and DCGM exporter's files,
//! and that no fault of theirs fails the prolog.

use super::super::fake::FakeSpank;
use super::*;
use std::collections::BTreeMap;
use task_plan::jobmap::JobRecord;

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

const TABLE: &str = "# spank-gpu gpu table v2\n\
    0\t0\t0000:1b:00.0\tGPU-00000000-0000-0000-0000-000000000000\t0\t0-7\t-\n\
    1\t1\t0000:2b:00.0\tGPU-00000000-0000-0000-0000-000000000001\t0\t0-7\t-\n\
    2\t2\t0000:3b:00.0\tGPU-00000000-0000-0000-0000-000000000002\t1\t8-15\t-\n\
    3\t3\t0000:4b:00.0\tGPU-00000000-0000-0000-0000-000000000003\t1\t8-15\t-\n";

/// The same node with GPU 3 in MIG mode.
fn mig_table() -> String {
    TABLE.replace(
        "000000000003\t1\t8-15\t-\n",
        "000000000003\t1\t8-15\tMIG-aaaaaaaa-0000-0000-0000-000000000030,MIG-aaaaaaaa-0000-0000-0000-000000000031\n",
    )
}

const JOBS: &str = "/run/spank-gpu/jobs";
const DCGM: &str = "/run/spank-gpu/hpc-jobs";

fn prolog_of(job: u32, gpus: &str) -> FakeSpank {
    let mut sp = FakeSpank::new(Context::JobScript);
    sp.files.insert(format!("{}/gpus.tsv", task_plan::gputable::DEFAULT_DIR), TABLE.into());
    sp.items.insert("JobId", job);
    sp.items.insert("JobUid", 1000 + job);
    sp.process_env.insert("SLURM_JOB_GPUS", gpus.into());
    sp.process_env.insert("CUDA_VISIBLE_DEVICES", gpus.into());
    sp
}

/// Runs job `job`'s prolog on the node's files `files`; returns them after.
fn run_prolog(
    files: &BTreeMap<String, String>,
    job: u32,
    gpus: &str,
) -> (BTreeMap<String, String>, FakeSpank) {
    let mut sp = prolog_of(job, gpus);
    sp.files.extend(files.clone());
    assert_eq!(job_prolog(&mut sp, &[]), Ok(()));
    (sp.files.clone(), sp)
}

fn run_epilog(files: &BTreeMap<String, String>, job: u32) -> BTreeMap<String, String> {
    let mut sp = FakeSpank::new(Context::JobScript);
    sp.items.insert("JobId", job);
    sp.files.extend(files.clone());
    assert_eq!(job_epilog(&mut sp, &[]), Ok(()));
    sp.files
}

fn dcgm(files: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let prefix = format!("{DCGM}/");
    files.iter().filter_map(|(k, v)| k.strip_prefix(&prefix).map(|n| (n.to_owned(), v.clone()))).collect()
}

#[test]
fn a_job_on_all_gpus_is_recorded_and_forgotten() {
    let (files, sp) = run_prolog(&BTreeMap::new(), 42, "0,1,2,3");
    assert!(sp.errors().is_empty(), "{:?}", sp.errors());
    let record = JobRecord::parse(&files[&format!("{JOBS}/42")]).unwrap();
    assert_eq!((record.job, record.uid), (42, 1042));
    assert_eq!(record.gpus.iter().map(|g| g.nvml).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    let want: Vec<(String, String)> = (0..4).map(|g| (g.to_string(), "42\n".to_owned())).collect();
    assert_eq!(dcgm(&files), want);
    let after = run_epilog(&files, 42);
    assert!(!after.contains_key(&format!("{JOBS}/42")));
    assert!(dcgm(&after).is_empty(), "{after:?}");
}

#[test]
fn two_jobs_on_one_node_and_a_shared_gpu() {
    let (files, _) = run_prolog(&BTreeMap::new(), 7, "0,1");
    let (files, _) = run_prolog(&files, 8, "1,2");
    assert_eq!(
        dcgm(&files),
        vec![("0".into(), "7\n".into()), ("1".into(), "7\n8\n".into()), ("2".into(), "8\n".into())]
    );
    let files = run_epilog(&files, 7);
    assert_eq!(dcgm(&files), vec![("1".into(), "8\n".into()), ("2".into(), "8\n".into())]);
}

#[test]
fn mig_devices_named_by_uuid_get_their_own_file() {
    let mut sp = prolog_of(9, "3");
    sp.files.insert(format!("{}/gpus.tsv", task_plan::gputable::DEFAULT_DIR), mig_table());
    sp.process_env.insert("CUDA_VISIBLE_DEVICES", "MIG-aaaaaaaa-0000-0000-0000-000000000031".into());
    job_prolog(&mut sp, &[]).unwrap();
    assert_eq!(dcgm(&sp.files), vec![("3.1".into(), "9\n".into())]);
    // Slurm's indices alone on a MIG node (no AutoDetect=nvml): nothing
    // mapped rather than the wrong GPU, and one line says why.
    let mut sp = prolog_of(10, "3");
    sp.files.insert(format!("{}/gpus.tsv", task_plan::gputable::DEFAULT_DIR), mig_table());
    job_prolog(&mut sp, &[]).unwrap();
    assert!(dcgm(&sp.files).is_empty());
    assert!(
        sp.log.borrow().iter().any(|(_, m)| m.contains("a MIG node: no MIG UUID")),
        "{:?}",
        sp.log.borrow()
    );
}

#[test]
fn a_job_without_gpus_here_writes_nothing() {
    let mut sp = prolog_of(5, "");
    job_prolog(&mut sp, &[]).unwrap();
    assert!(!sp.files.keys().any(|k| k.starts_with("/run/")), "{:?}", sp.files);
}

#[test]
fn job_map_off_writes_nothing() {
    let mut sp = prolog_of(5, "0");
    job_prolog(&mut sp, &args(&["job_map=off"])).unwrap();
    assert!(!sp.files.keys().any(|k| k.starts_with("/run/")));
}

/// Every seam of the prolog and epilog failing: the hook still returns 0
/// (a failing prolog drains the node), with one line saying what was lost.
#[test]
fn no_fault_fails_the_prolog_or_the_epilog() {
    let seams = [
        "read_trusted",
        "open_run_dir",
        "run_dir_names",
        "run_dir_read",
        "run_dir_write",
        "run_dir_remove",
        "item",
    ];
    // The seams that, failing, lose the record: one line each.
    let lose_prolog = ["read_trusted", "open_run_dir", "run_dir_names", "run_dir_write"];
    let lose_epilog = ["open_run_dir", "run_dir_names", "run_dir_remove"];
    for seam in seams {
        let mut sp = prolog_of(42, "0,1").failing(seam);
        assert_eq!(job_prolog(&mut sp, &[]), Ok(()), "{seam}");
        assert!(sp.errors().is_empty(), "{seam}: {:?}", sp.errors());
        if lose_prolog.contains(&seam) {
            assert_eq!(sp.log.borrow().len(), 1, "{seam}: one line: {:?}", sp.log.borrow());
        }
        let (files, _) = run_prolog(&BTreeMap::new(), 42, "0,1");
        let mut sp = FakeSpank::new(Context::JobScript).failing(seam);
        sp.items.insert("JobId", 42);
        sp.files.extend(files);
        assert_eq!(job_epilog(&mut sp, &[]), Ok(()), "{seam}");
        assert!(sp.errors().is_empty(), "{seam}: {:?}", sp.errors());
        if lose_epilog.contains(&seam) {
            assert_eq!(sp.log.borrow().len(), 1, "{seam}: one line: {:?}", sp.log.borrow());
        }
    }
    // Without a job id from Slurm, the prolog's environment has it.
    let mut sp = prolog_of(42, "0").failing("item");
    sp.process_env.insert("SLURM_JOB_ID", "42".into());
    job_prolog(&mut sp, &[]).unwrap();
    assert!(sp.files.contains_key(&format!("{JOBS}/42")));
}

#[test]
fn other_contexts_write_nothing() {
    for ctx in [Context::Remote, Context::Local, Context::Slurmd, Context::Allocator] {
        let mut sp = prolog_of(42, "0");
        sp.context = ctx;
        job_prolog(&mut sp, &[]).unwrap();
        assert!(!sp.files.keys().any(|k| k.starts_with("/run/")), "{ctx:?}");
    }
}

#[test]
fn gpus_the_table_does_not_know_are_named_and_left_out() {
    let (files, sp) = run_prolog(&BTreeMap::new(), 42, "1,9");
    assert_eq!(dcgm(&files), vec![("1".into(), "42\n".into())]);
    assert!(sp.log.borrow().iter().any(|(_, m)| m.contains("GPUs 9 are not in")), "{:?}", sp.log.borrow());
}

/// The job map's lock still held after the wait (only another root prolog or
/// epilog can hold it: users cannot open the lock file): the prolog and the
/// epilog go on without it, each saying so in one line of slurmd's log.
#[test]
fn a_lock_held_past_the_wait_is_said_once_and_the_job_still_mapped() {
    let mut sp = prolog_of(42, "0,1").failing(&format!("lock:{JOBS}"));
    assert_eq!(job_prolog(&mut sp, &[]), Ok(()));
    let said: Vec<String> =
        sp.log.borrow().iter().filter(|(_, m)| m.contains("jobs.lock")).map(|(_, m)| m.clone()).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("job 42") && said[0].contains("after 2 s"), "{}", said[0]);
    assert!(sp.log.borrow().iter().any(|(l, m)| *l == Level::Error && m.contains("jobs.lock")));
    assert!(sp.files.contains_key(&format!("{JOBS}/42")), "the record is still written");
    assert_eq!(dcgm(&sp.files).len(), 2);

    let mut sp2 = FakeSpank::new(Context::JobScript).failing(&format!("lock:{JOBS}"));
    sp2.items.insert("JobId", 42);
    sp2.files.extend(sp.files.clone());
    assert_eq!(job_epilog(&mut sp2, &[]), Ok(()));
    assert_eq!(sp2.log.borrow().iter().filter(|(_, m)| m.contains("jobs.lock")).count(), 1);
    assert!(!sp2.files.contains_key(&format!("{JOBS}/42")));
    // With the lock, nothing is said.
    let (_, sp3) = run_prolog(&BTreeMap::new(), 43, "2");
    assert!(!sp3.log.borrow().iter().any(|(_, m)| m.contains("jobs.lock")));
}
