//! `batch_lint` against a script per trap, the guide's own scripts, and
//! recorded cluster answers (`fixtures/lint/cluster/`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use batch_lint::facts::{self, Cluster};
use batch_lint::table::Arg;
use batch_lint::values::Limit;
use batch_lint::{self as lint, DirState, Facts, Input, Needs, Release, Report, Trap, script};

const R2205: u32 = (22 << 16) | (5 << 8) | 8;
const R2302: u32 = (23 << 16) | (2 << 8) | 7;
const R2311: u32 = (23 << 16) | (11 << 8) | 11;
const R2411: u32 = (24 << 16) | (11 << 8) | 5;

fn fixture(rel: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lint").join(rel);
    fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn text(rel: &str) -> String {
    String::from_utf8(fixture(rel)).unwrap()
}

/// The recorded answers of cluster `name` (a directory of `fixtures/lint/cluster`).
fn cluster(name: &str) -> Cluster {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lint/cluster").join(name);
    let read = |f: &str| fs::read_to_string(dir.join(f)).map_err(|e| format!("{f} not recorded ({e})"));
    Cluster {
        from: format!("{name} (recorded)"),
        partitions: read("sinfo.txt").map(|t| facts::parse_sinfo(&t)),
        config: read("config.txt").map(|t| facts::parse_config(&t)),
        qos: read("qos.txt").map(|t| facts::parse_qos(&t)),
        jobs: read("squeue.txt").map(|t| facts::parse_job_qos(&t)),
    }
}

/// The file system the tests' jobs see.
fn dir_state(dir: &str) -> DirState {
    match dir {
        "/scratch/u/missing" => DirState::Missing { ancestor: "/scratch/u".into(), writable: true },
        "/readonly/logs" => DirState::Missing { ancestor: "/readonly".into(), writable: false },
        "/scratch/u/run/afile" => DirState::NotDir { at: "/scratch/u/run/afile".into() },
        d if d.starts_with("/scratch/u") => DirState::Dir { writable: true },
        d => panic!("the test did not expect a question about {d}"),
    }
}

fn input(file: &str, release: u32) -> Input {
    Input {
        file: file.to_owned(),
        cwd: "/scratch/u/run".into(),
        user: "u".into(),
        release,
        plugins: vec![("auto-rdzv".into(), Arg::Optional), ("gpu-affinity".into(), Arg::Optional)],
        ..Input::default()
    }
}

fn run_with(bytes: &[u8], input: &Input, cluster: Cluster) -> (Report, Needs) {
    let s = script::read(bytes).expect("readable");
    let mut asked = Needs::default();
    let report = lint::lint(&s, input, |n| {
        asked = n.clone();
        Facts {
            release: Release { number: input.release, from: "the test".into() },
            cluster,
            dirs: n.dirs.iter().map(|d| (d.clone(), dir_state(d))).collect::<BTreeMap<_, _>>(),
        }
    });
    (report, asked)
}

fn run(rel: &str, release: u32) -> Report {
    run_with(&fixture(rel), &input(rel, release), cluster("gpu")).0
}

fn traps(r: &Report) -> Vec<Trap> {
    let mut t: Vec<Trap> = r.findings.iter().map(|f| f.trap).collect();
    t.dedup();
    t
}

#[track_caller]
fn only(rel: &str, release: u32, want: &[Trap]) -> Report {
    let r = run(rel, release);
    let lines: Vec<String> = r.findings.iter().map(|f| f.one_line(rel)).collect();
    assert_eq!(traps(&r), want, "{rel}:\n{}\nnotes: {:?}", lines.join("\n"), r.notes);
    r
}

#[test]
fn the_guides_patterns_fixed_as_it_fixes_them_have_no_finding() {
    for rel in ["guide/pattern-a.sh", "guide/pattern-b.sh"] {
        for release in [R2205, R2311, R2411] {
            only(rel, release, &[]);
        }
    }
    // The preemption pattern relies on USR1 at preemption: the cluster sends it
    // (PreemptParameters=send_user_signal, 23.02 on) with 5 minutes of grace.
    for release in [R2302, R2311, R2411] {
        only("guide/preemption.sh", release, &[]);
    }
    // 22.05 has no PreemptParameters: there only SlurmctldParameters=preempt_send_user_signal sends it.
    let r = only("guide/preemption.sh", R2205, &[Trap::PreemptSignal]);
    assert!(
        r.findings[0].what.contains("SlurmctldParameters=preempt_send_user_signal is not set on Slurm 22.05")
    );
}

#[test]
fn pattern_b_as_printed_gets_the_guides_own_fixes() {
    let r =
        only("guide/pattern-b-as-printed.sh", R2205, &[Trap::Refused, Trap::SrunCpus, Trap::KillOnBadExit]);
    assert!(r.findings[0].what.contains("sbatch refuses the script"), "{:?}", r.findings[0]);
    // From 23.11 srun inherits --cpus-per-task again.
    only("guide/pattern-b-as-printed.sh", R2311, &[Trap::Refused, Trap::KillOnBadExit]);
}

#[test]
fn the_guides_array_script_gets_only_the_srun_cpus_trap_on_22_05() {
    only("guide/array.sh", R2205, &[Trap::SrunCpus]);
    only("guide/array.sh", R2411, &[]);
}

#[test]
fn trap_1_output_dir_per_release() {
    let r = only("traps/01-output-dir.sh", R2205, &[Trap::OutputDir]);
    let f = &r.findings[0];
    assert_eq!(f.line(), Some(4));
    assert!(
        f.what.contains("/scratch/u/missing does not exist") && f.what.contains("no log and no message"),
        "{}",
        f.what
    );
    assert_eq!(f.fix, "create it before submitting: mkdir -p /scratch/u/missing");
    // 23.02 and later create it (the parent is writable).
    only("traps/01-output-dir.sh", R2302, &[]);
    only("traps/01-output-dir.sh", R2411, &[]);
    // ... but not under a directory the user cannot write, nor through a file.
    for release in [R2205, R2411] {
        only("traps/01-output-dir-readonly.sh", release, &[Trap::OutputDir]);
        only("traps/01-output-dir-file.sh", release, &[Trap::OutputDir]);
    }
    let r = run("traps/01-output-dir-readonly.sh", R2411);
    assert!(
        r.findings[0].what.contains("cannot create it: /readonly is not writable"),
        "{}",
        r.findings[0].what
    );
}

#[test]
fn an_output_directory_known_only_at_run_time_is_a_note() {
    let s = b"#!/bin/bash\n#SBATCH --gpus-per-node=1\n#SBATCH --output=logs/%j/out.txt\nsrun python x\n";
    let (r, asked) = run_with(s, &input("x", R2205), cluster("gpu"));
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert!(asked.dirs.is_empty(), "{:?}", asked.dirs);
    assert!(
        r.notes.iter().any(|n| n.trap == Trap::OutputDir && n.text.contains("known only when the job runs")),
        "{:?}",
        r.notes
    );
}

#[test]
fn trap_2_array_output() {
    let r = only("traps/02-array-output.sh", R2205, &[Trap::ArrayOutput]);
    assert!(r.findings[0].fix.contains("%A_%a"));
}

#[test]
fn trap_3_signal_not_batch() {
    let r = only("traps/03-signal-not-batch.sh", R2205, &[Trap::SignalNotBatch]);
    assert_eq!(r.findings[0].fix, "--signal=B:USR1@180");
    assert!(r.findings[0].what.contains("the USR1 trap of line 11 never fires"), "{}", r.findings[0].what);
}

#[test]
fn trap_4_srun_foreground_and_background_without_wait() {
    let r = only("traps/04-srun-foreground.sh", R2205, &[Trap::SrunForeground]);
    assert_eq!(r.findings[0].line(), Some(7));
    only("traps/04-srun-background-no-wait.sh", R2205, &[Trap::SrunForeground]);
}

#[test]
fn trap_5_requeue_and_preemption() {
    let r = only("traps/05-requeue-trap-never-requeues.sh", R2205, &[Trap::Preemption]);
    assert_eq!(r.findings[0].line(), Some(10));
    let r = only("traps/05-preemptible-qos.sh", R2205, &[Trap::Preemption]);
    assert!(
        r.findings[0].what.contains("QoS low can be preempted by high (PreemptMode=REQUEUE)"),
        "{}",
        r.findings[0].what
    );
}

/// The `gpu` cluster with its `scontrol show config` changed by `edit`.
fn gpu_with(edit: impl FnOnce(&mut facts::Config)) -> Cluster {
    let mut c = cluster("gpu");
    if let Ok(cfg) = c.config.as_mut() {
        edit(cfg);
    }
    c
}

#[test]
fn trap_18_the_signal_at_preemption_per_cluster_and_release() {
    // The cluster sends it, but QoS low's GraceTime (300 s) is shorter than the 600 s lead time.
    let r = only("traps/18-preempt-signal.sh", R2411, &[Trap::PreemptSignal]);
    let f = &r.findings[0];
    assert_eq!(f.line(), Some(4));
    assert!(
        f.what.contains("--signal=B:USR1@600 comes at preemption on this cluster, but QoS low (preemptible by high) gives only 300 s (GraceTime) before SIGTERM, and SIGKILL 30 s later"),
        "{}",
        f.what
    );
    assert!(f.fix.contains("GraceTime of at least 600 s on QoS low"), "{}", f.fix);
    // No send_user_signal: the USR1 trap never runs at preemption; SIGTERM does.
    let s = fixture("guide/preemption.sh");
    let off = gpu_with(|c| c.preempt_params.clear());
    let (r, _) = run_with(&s, &input("x", R2411), off.clone());
    assert_eq!(traps(&r), vec![Trap::PreemptSignal]);
    let f = &r.findings[0];
    assert!(
        f.what.contains("comes 180 s before the time limit, not at preemption")
            && f.what.contains("PreemptParameters=send_user_signal is not set on Slurm 24.11")
            && f.what.contains("the batch shell SIGTERM 300 s later (QoS low's GraceTime)")
            && f.what.contains("the USR1 trap never runs"),
        "{}",
        f.what
    );
    assert!(f.fix.starts_with("save a checkpoint when the program gets SIGTERM (within 300 s)"), "{}", f.fix);
    // 22.05's spelling, read on every release.
    let old = gpu_with(|c| {
        c.preempt_params.clear();
        c.slurmctld_params = "enable_configless,preempt_send_user_signal".into();
    });
    for release in [R2205, R2411] {
        let (r, _) = run_with(&s, &input("x", release), old.clone());
        assert!(r.findings.is_empty(), "{release:x}: {:?}", r.findings);
    }
    // No grace time at all: the signal comes with SIGTERM.
    let mut none = cluster("gpu");
    if let Ok(q) = none.qos.as_mut() {
        q.iter_mut().for_each(|q| q.grace_s = Some(0));
    }
    let (r, _) = run_with(&s, &input("x", R2411), none);
    assert!(r.findings[0].what.contains("has no GraceTime: SIGTERM comes with it"), "{:?}", r.findings);
    // Without B: the signal goes to the steps, still per the same rules (trap 3 says the rest).
    let nob = String::from_utf8(s.clone()).unwrap().replace("B:USR1@180", "USR1@180");
    let (r, _) = run_with(nob.as_bytes(), &input("x", R2411), off);
    assert_eq!(traps(&r), vec![Trap::SignalNotBatch, Trap::PreemptSignal], "{:?}", r.findings);
    // A recorded answer without the GraceTime column: a note, not a guess.
    let mut old_qos = cluster("gpu");
    old_qos.qos = Ok(facts::parse_qos("normal||cluster\nhigh|low|cluster\nlow||cluster\n"));
    let (r, _) = run_with(&s, &input("x", R2411), old_qos);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert!(
        r.notes.iter().any(|n| n.trap == Trap::PreemptSignal && n.text.contains("GraceTime is not known"))
    );
    // A QoS nobody preempts, or a suspending preemption: nothing to say.
    let suspend = gpu_with(|c| c.preempt_mode = "SUSPEND,GANG".into());
    let (r, _) = run_with(&s, &input("x", R2411), suspend);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

#[test]
fn trap_6_one_gpu_per_task_for_a_launcher() {
    let r = only("traps/06-launcher-gpus.sh", R2205, &[Trap::LauncherGpus]);
    assert!(
        r.findings[0].what.contains("torchrun starts 8 processes on each node"),
        "{}",
        r.findings[0].what
    );
}

#[test]
fn trap_7_gpus_two_ways() {
    let r = only("traps/07-gpus-two-ways.sh", R2205, &[Trap::GpusTwoWays]);
    assert_eq!(r.findings[0].line(), Some(3));
}

#[test]
fn trap_8_gres_types_suggest_the_clusters_names() {
    let r = only("traps/08-gres-type.sh", R2205, &[Trap::GresType]);
    assert!(r.findings[0].what.contains("it has gpu:a100:4, gpu:h100:8"), "{}", r.findings[0].what);
    let r = only("traps/08-gres-type-partition.sh", R2205, &[Trap::GresType]);
    assert!(
        r.findings[0].what.contains("partition gpu-h100 has no gpu:a100 (its nodes have gpu:h100:8)"),
        "{}",
        r.findings[0].what
    );
}

#[test]
fn trap_9_srun_cpus_per_release() {
    let r = only("traps/09-srun-cpus.sh", R2205, &[Trap::SrunCpus]);
    assert!(r.findings[0].what.contains("on Slurm 22.05"), "{}", r.findings[0].what);
    only("traps/09-srun-cpus.sh", R2302, &[Trap::SrunCpus]);
    only("traps/09-srun-cpus.sh", R2311, &[]);
    only("traps/09-srun-cpus.sh", R2411, &[]);
    // An exported SRUN_CPUS_PER_TASK is the other fix.
    let fixed = text("traps/09-srun-cpus.sh")
        .replace("srun python", "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\nsrun python");
    let (r, _) = run_with(fixed.as_bytes(), &input("x.sh", R2205), cluster("gpu"));
    assert!(traps(&r).is_empty(), "{:?}", r.findings);
}

#[test]
fn many_sruns_with_one_trap_give_one_finding() {
    let mut text = String::from("#!/bin/bash\n#SBATCH -N 2\n#SBATCH -c 8\n#SBATCH --gpus-per-node=1\n");
    for i in 0..9 {
        text.push_str(&format!("srun python step{i}.py\n"));
    }
    let (r, _) = run_with(text.as_bytes(), &input("x", R2205), cluster("gpu"));
    assert_eq!(traps(&r), vec![Trap::SrunCpus, Trap::KillOnBadExit], "{:?}", r.findings);
    assert_eq!(r.findings.len(), 2);
    assert!(
        r.findings[0].what.ends_with("(also the srun lines 6, 7, 8, 9, 10 and 3 more)"),
        "{}",
        r.findings[0].what
    );
    assert_eq!(r.findings[0].line(), Some(5));
}

#[test]
fn trap_10_kill_on_bad_exit_asks_the_cluster() {
    only("traps/10-kill-on-bad-exit.sh", R2205, &[Trap::KillOnBadExit]);
    let mut c = cluster("gpu");
    if let Ok(cfg) = c.config.as_mut() {
        cfg.kill_on_bad_exit = true;
    }
    let (r, _) = run_with(&fixture("traps/10-kill-on-bad-exit.sh"), &input("x", R2205), c);
    assert!(r.findings.is_empty(), "KillOnBadExit=1 in slurm.conf: {:?}", r.findings);
}

#[test]
fn trap_11_fixed_port_and_auto_rdzv() {
    let r = only("traps/11-fixed-port.sh", R2205, &[Trap::FixedPort]);
    assert!(r.findings[0].what.contains("collide"));
    let mut i = input("x", R2205);
    i.site_auto_rdzv = true;
    let (r, _) = run_with(&fixture("traps/11-fixed-port.sh"), &i, cluster("gpu"));
    assert!(r.findings[0].what.contains("--auto-rdzv keeps a port you set"), "{}", r.findings[0].what);
}

#[test]
fn trap_17_interface_values_nccl_and_gloo_misread() {
    let r = only("traps/17-socket-ifname.sh", R2205, &[Trap::SocketIfname]);
    assert_eq!(r.findings.len(), 2);
    assert_eq!(r.findings[0].line(), Some(4));
    assert!(r.findings[0].what.contains("excludes interfaces but not lo"), "{}", r.findings[0].what);
    assert_eq!(r.findings[0].fix, "exclude lo too: NCCL_SOCKET_IFNAME=^docker0,lo");
    assert_eq!(r.findings[1].line(), Some(5));
    assert!(r.findings[1].what.contains("gloo takes exact names only"), "{}", r.findings[1].what);
}

#[test]
fn trap_12_time_at_the_partitions_maximum() {
    only("traps/12-time-at-max.sh", R2205, &[Trap::TimeAtMax]);
    let r = only("traps/12-no-time-default-is-max.sh", R2205, &[Trap::TimeAtMax]);
    assert!(
        r.findings[0].what.contains("partition gpu-a100's 2-00:00:00, which is its maximum"),
        "{}",
        r.findings[0].what
    );
}

#[test]
fn trap_13_requests_no_node_satisfies() {
    let r = only("traps/13-unsatisfiable.sh", R2205, &[Trap::Unsatisfiable]);
    assert!(r.findings[0].what.contains("256 CPUs"), "{}", r.findings[0].what);
    only("traps/13-too-many-gpus.sh", R2205, &[Trap::Unsatisfiable]);
}

#[test]
fn trap_14_mem_zero() {
    only("traps/14-mem-zero.sh", R2205, &[Trap::MemZero]);
}

#[test]
fn trap_15_late_directive() {
    let r = only("traps/15-late-directive.sh", R2205, &[Trap::IgnoredDirective]);
    assert_eq!(r.findings[0].line(), Some(4));
    assert_eq!(r.findings[0].fix, "move it above line 3, with the other #SBATCH lines");
}

#[test]
fn trap_16_afterok_on_preemptible_jobs() {
    let (r, asked) = run_with(&fixture("traps/16-afterok.sh"), &input("x", R2205), cluster("gpu"));
    assert_eq!(asked.jobs, vec!["1234".to_owned()]);
    assert_eq!(traps(&r), vec![Trap::AfterOk]);
    assert!(r.findings[0].fix.starts_with("afterany:1234"));
    only("traps/16-afterok-self-chain.sh", R2205, &[Trap::AfterOk]);
}

#[test]
fn strict_refuses_only_the_certain_failures() {
    let strict: Vec<u8> = Trap::ALL.iter().filter(|t| t.strict()).filter_map(|t| t.number()).collect();
    assert_eq!(strict, vec![8, 13]);
    // A job that runs, only without the late line's option; a directory as
    // this host sees it, not as the compute node will.
    assert!(run("traps/15-late-directive.sh", R2205).strict().is_empty());
    assert!(run("traps/01-output-dir-readonly.sh", R2205).strict().is_empty());
    assert_eq!(run("traps/08-gres-type.sh", R2205).strict().len(), 1);
    assert!(run("traps/10-kill-on-bad-exit.sh", R2205).strict().is_empty());
}

#[test]
fn without_a_cluster_the_dependent_traps_are_notes_not_guesses() {
    let s = fixture("traps/10-kill-on-bad-exit.sh");
    let (r, _) = run_with(&s, &input("x", R2205), Cluster::unknown("no cluster to ask: sinfo not found"));
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    let notes: Vec<&str> = r.notes.iter().map(|n| n.text.as_str()).collect();
    assert!(
        notes.iter().any(|n| n.contains("KillOnBadExit of the cluster is not known (no cluster to ask")),
        "{notes:?}"
    );
    assert!(notes.iter().any(|n| n.contains("partitions are not known")), "{notes:?}");
    let (r, _) = run_with(&fixture("traps/08-gres-type.sh"), &input("x", R2205), Cluster::unknown("none"));
    assert!(r.findings.is_empty());
}

#[test]
fn unresolvable_shell_is_reported_as_unknown() {
    let s = b"#!/bin/bash\n#SBATCH -N 2\nSRUN_ARGS=$(cat args)\nsrun $SRUN_ARGS python x.py\nsrun -N \"$(cat nodes)\" python y.py\n";
    let (r, _) = run_with(s, &input("x", R2205), cluster("gpu"));
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    let notes: Vec<&str> = r.notes.iter().map(|n| n.text.as_str()).collect();
    assert!(
        notes.iter().any(|n| n.starts_with("line 4: srun's options after a word lint cannot resolve")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.starts_with("line 5: how many nodes srun spans is not known")),
        "{notes:?}"
    );
}

#[test]
fn command_line_and_environment_options_count_as_sbatch_counts_them() {
    let s = b"#!/bin/bash\n#SBATCH --gpus-per-node=1\n#SBATCH --output=logs/%x-%j.out\nsrun python x\n";
    let mut i = input("x", R2205);
    i.args = vec!["--array=0-9".into()];
    let (r, _) = run_with(s, &i, cluster("gpu"));
    assert!(traps(&r).is_empty(), "%j differs per array task: {:?}", r.findings);
    i.args.clear();
    i.env.insert("SBATCH_ARRAY_INX".into(), "0-9".into());
    i.env.insert("SBATCH_OUTPUT".into(), "logs/all.out".into());
    let (r, _) = run_with(s, &i, cluster("gpu"));
    assert_eq!(traps(&r), vec![Trap::ArrayOutput]);
    assert_eq!(r.findings[0].place("x"), "x: SBATCH_OUTPUT (environment)");
}

#[test]
fn garbage_directives_are_findings_not_panics() {
    let s = b"#!/bin/bash\n#SBATCH --bogus-option=1\n#SBATCH \xff\xfe garbage\n#SBATCH --job-name='unclosed\n#SBATCH : x\n#SBATCH -N\n";
    let (r, _) = run_with(s, &input("x", R2205), cluster("gpu"));
    assert!(r.findings.len() >= 4, "{:?}", r.findings);
    assert!(r.findings.iter().all(|f| f.trap == Trap::Refused), "{:?}", r.findings);
    for f in &r.findings {
        assert!(!f.one_line("x").contains('\n'), "{f:?}");
    }
}

#[test]
fn bad_files_get_one_clear_error() {
    assert_eq!(
        script::read(b"").unwrap_err().to_string(),
        "the file is empty (sbatch: \"Batch script is empty!\")"
    );
    let bin: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    assert!(script::read(&bin).unwrap_err().to_string().starts_with("not a script: a NUL byte at offset 0"));
    // A megabyte of script reads and checks.
    let mut big = b"#!/bin/bash\n#SBATCH --gpus-per-node=1\n".to_vec();
    while big.len() < 1 << 20 {
        big.extend_from_slice(b"echo step; srun --cpus-per-task=1 python x.py --arg \"$HOME\" # comment\n");
    }
    let (r, _) = run_with(&big, &input("big", R2205), cluster("gpu"));
    assert!(r.findings.is_empty(), "{:?}", r.findings.first());
}

#[test]
fn the_lab_as_recorded() {
    let c = cluster("lab-22.05");
    let version = facts::parse_version(&text("cluster/lab-22.05/version.txt"));
    assert_eq!(version, Some(R2205), "Debian prints 'slurm-wlm 22.05.8'");
    let parts = c.partitions.as_ref().unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(
        (parts[0].name.as_str(), parts[0].default, parts[0].max_time),
        ("debug", true, Limit::Infinite)
    );
    assert_eq!(parts[0].nodes[0].count, 2);
    assert_eq!(parts[0].nodes[0].gres_count("gpu", Some("h100")), 8);
    let cfg = c.config.as_ref().unwrap();
    assert!(!cfg.kill_on_bad_exit);
    assert_eq!(cfg.preempt_type, "preempt/none");
    let s = b"#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:a100:2\nsrun hostname\n";
    let (r, _) = run_with(s, &input("x", R2205), c);
    assert_eq!(traps(&r), vec![Trap::TimeAtMax, Trap::GresType, Trap::KillOnBadExit]);
    assert!(r.findings.iter().any(|f| f.what.contains("it has gpu:h100:8")), "{:?}", r.findings);
    assert!(r.findings[0].what.contains("partition debug has no limit"), "{}", r.findings[0].what);
}

#[test]
fn slurm_conf_and_sinfo_give_the_same_lab() {
    // The lab's slurm.conf lines (tests/src/lib.rs) against what its sinfo printed.
    let conf = "NodeName=node1 NodeHostname=node1 NodeAddr=10.77.0.11 CPUs=8 RealMemory=4000 Gres=gpu:h100:8 State=UNKNOWN\n\
                NodeName=node2 NodeHostname=node2 NodeAddr=10.77.0.12 CPUs=8 RealMemory=4000 Gres=gpu:h100:8 State=UNKNOWN\n\
                PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
    let from_conf = facts::from_slurm_conf(conf, "slurm.conf").partitions.unwrap();
    assert_eq!(from_conf, cluster("lab-22.05").partitions.unwrap());
}

/// The trap numbers a doc names after "only for traps" (`8 and 13`, `1, 8 and 13`).
fn strict_traps_in(doc: &str) -> Vec<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = text.replace('\n', " ");
    text.match_indices("only for traps ")
        .map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let words = rest.split([':', '.', ';']).next().unwrap_or("");
            words
                .split([',', ' '])
                .take_while(|w| w.is_empty() || *w == "and" || w.parse::<u8>().is_ok())
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .collect()
}

#[test]
fn the_docs_name_the_strict_traps_the_code_refuses() {
    let strict: Vec<u8> = Trap::ALL.iter().filter(|t| t.strict()).filter_map(|t| t.number()).collect();
    for doc in ["docs/users.md", "docs/admin.md"] {
        let named = strict_traps_in(doc);
        assert!(!named.is_empty(), "{doc} no longer says \"only for traps ...\" for lint=strict");
        for list in named {
            assert_eq!(list, strict, "{doc}: lint=strict's traps in the doc vs Trap::strict()");
        }
    }
}

/// The trap-19 findings and notes of `text` (a script), on 24.11.
fn one_node(text: &str) -> (Vec<lint::Finding>, Vec<String>) {
    let (r, _) = run_with(text.as_bytes(), &input("x.sh", R2411), cluster("gpu"));
    let f = r.findings.into_iter().filter(|f| f.trap == Trap::OneNodeOnly).collect();
    let n = r.notes.into_iter().filter(|n| n.trap == Trap::OneNodeOnly).map(|n| n.text).collect();
    (f, n)
}

#[test]
fn trap_19_a_multi_node_job_that_runs_on_one_node() {
    assert_eq!(Trap::OneNodeOnly.number(), Some(19));
    assert_eq!(Trap::OneNodeOnly.id(), "multi-node-no-launcher");
    for release in [R2205, R2411] {
        let r = only("traps/19-multi-node-python.sh", release, &[Trap::OneNodeOnly]);
        let f = &r.findings[0];
        assert_eq!(f.line(), Some(8));
        assert_eq!(
            f.what,
            "--nodes=4, but no srun, mpirun or other launcher starts anything on the other nodes: the batch script runs on the first node only, so python train.py runs there alone, leaving the other 3 nodes (24 GPUs) idle for the whole job"
        );
        assert!(f.fix.starts_with("start it on every node with srun, as the guide's two patterns do: one torchrun per node (srun --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" --nproc-per-node=8 ...)"), "{}", f.fix);
        let r = only("traps/19-multi-node-torchrun.sh", release, &[Trap::OneNodeOnly]);
        let f = &r.findings[0];
        assert_eq!(f.line(), Some(9));
        assert_eq!(
            f.what,
            "--nodes=2, and torchrun --nnodes=2 runs without srun: the batch script runs on the first node only, and torchrun starts processes only on the node it runs on, so they wait for the other nodes' torchrun, which never starts, until the rendezvous times out, leaving the other node (8 GPUs) idle"
        );
        assert!(f.fix.contains("Pattern A): srun --ntasks-per-node=1 --kill-on-bad-exit=1 torchrun --nnodes=\"$SLURM_NNODES\""), "{}", f.fix);
    }
    // The fixes: srun in a function that is called; ssh over the job's nodes.
    only("traps/19-ok-srun-in-function.sh", R2411, &[]);
    only("traps/19-ok-ssh-loop.sh", R2411, &[]);
    // A script it cannot see into: a note, never a finding.
    let r = only("traps/19-ok-calls-script.sh", R2411, &[]);
    assert!(
        r.notes.iter().any(|n| n.trap == Trap::OneNodeOnly
            && n.text == "--nodes=2 and no srun, mpirun or other launcher in the script: whether line 7 (./launch.sh configs/7b.yaml) starts one on the other nodes is not known"),
        "{:?}",
        r.notes
    );
}

#[test]
fn trap_19_what_reaches_the_other_nodes_and_what_cannot_be_told() {
    let head = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n";
    let quiet = [
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" train.py\n",
        "exec srun --kill-on-bad-exit=1 python train.py\n",
        "timeout 23h srun --kill-on-bad-exit=1 python train.py\n",
        "mpirun -np 16 python train.py\n",
        "mpiexec -n 16 ./a.out\n",
        "pdsh -w \"$SLURM_JOB_NODELIST\" python train.py\n",
        "clush -w \"$SLURM_JOB_NODELIST\" python train.py\n",
        "deepspeed --hostfile=hosts.txt --launcher=slurm train.py\n",
        "bash -c 'srun --kill-on-bad-exit=1 python train.py'\n",
    ];
    for body in quiet {
        let (f, n) = one_node(&format!("{head}{body}"));
        assert!(f.is_empty() && n.is_empty(), "{body}: {f:?} {n:?}");
    }
    // Commands lint cannot see into: a note at most.
    for body in [
        "bash run.sh\n",
        "source env.sh\nlaunch_training train.py\n",
        "python prep.py\neval \"$LAUNCH\"\n",
        "python prep.py\n$LAUNCHER python train.py\n",
        "accelerate launch train.py\n",
    ] {
        let (f, _) = one_node(&format!("{head}{body}"));
        assert!(f.is_empty(), "{body}: {f:?}");
    }
    let (_, n) = one_node(&format!("{head}accelerate launch train.py\n"));
    assert!(n[0].contains("its configuration decides which machines it uses"), "{n:?}");
    // One node, or a node count that the tasks cap at 1: nothing.
    for text in [
        "#!/bin/bash\n#SBATCH --gpus-per-node=8\npython train.py\n",
        "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --gres=gpu:8\ntorchrun --nproc-per-node=8 train.py\n",
        "#!/bin/bash\n#SBATCH -N 2\n#SBATCH -n 1\npython train.py\n",
        "#!/bin/bash\n#SBATCH --ntasks=8\npython train.py\n",
    ] {
        let (f, n) = one_node(text);
        assert!(f.is_empty() && n.is_empty(), "{text}: {f:?} {n:?}");
    }
    // The shapes of a multi-node request.
    let what = |text: &str| one_node(text).0.first().map(|f| f.what.clone()).unwrap_or_default();
    let w = what("#!/bin/bash\n#SBATCH --nodes=2-4\n#SBATCH --gres=gpu:h100:8\npython train.py\n");
    assert!(w.contains("leaving the other 1 or more nodes (8 GPUs) idle"), "{w}");
    let w = what("#!/bin/bash\n#SBATCH -N 1-2\npython train.py\n");
    assert!(
        w.starts_with("--nodes=1-2, but") && w.contains("leaving any other node it gets (up to 1) idle"),
        "{w}"
    );
    let w = what(
        "#!/bin/bash\n#SBATCH --ntasks=16\n#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-task=1\npython train.py\n",
    );
    assert!(
        w.starts_with("--ntasks=16 with --ntasks-per-node=8 (2 nodes), but") && w.contains("(8 GPUs)"),
        "{w}"
    );
    let (i, _) = (input("x.sh", R2411), ());
    let mut i = i;
    i.args = vec!["-N".into(), "3".into()];
    let (r, _) = run_with(b"#!/bin/bash\n#SBATCH --gpus-per-node=4\npython -m torch.distributed.run --nproc-per-node=4 train.py\n", &i, cluster("gpu"));
    let f: Vec<_> = r.findings.iter().filter(|f| f.trap == Trap::OneNodeOnly).collect();
    assert!(
        f[0].what.contains("python -m torch.distributed.run starts processes only on the node it runs on")
            && f[0].what.contains("the other 2 nodes (8 GPUs)"),
        "{:?}",
        f
    );
    // torchrun with an elastic range whose low end is above 1, from Slurm's own variable.
    let w =
        what("#!/bin/bash\n#SBATCH -N 4\ntorchrun --nnodes=\"$SLURM_NNODES\" --nproc-per-node=8 train.py\n");
    assert!(w.starts_with("--nodes=4, and torchrun --nnodes=4 runs without srun"), "{w}");
    let w = what("#!/bin/bash\n#SBATCH -N 4\ntorchrun --nnodes=2:4 train.py\n");
    assert!(w.contains("torchrun --nnodes=2:4 runs without srun"), "{w}");
    // A heterogeneous job: the batch script runs in its first component only.
    let w = what(
        "#!/bin/bash\n#SBATCH -N1 --gpus-per-node=8\n#SBATCH hetjob\n#SBATCH -N1 --gpus-per-node=8\npython train.py\n",
    );
    assert!(
        w.starts_with("a heterogeneous job of 2 components, but")
            && w.contains("leaving the nodes of its other components idle"),
        "{w}"
    );
}
