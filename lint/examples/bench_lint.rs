//! Times `spank-gpu lint`'s checks on a 300-line batch script: a long
//! training script with setup, a preemption trap, loops and 60 `srun` steps,
//! against recorded cluster answers (`tests/fixtures/lint/cluster/gpu`).
//!
//! * reading the script ([`script::read`]: sbatch's `#SBATCH` view and the shell's);
//! * building the job and its steps ([`Job::new`]);
//! * the checks ([`check`]);
//! * all three, as `spank-gpu lint` and the plugin at submit time do them.
//!
//! The cluster's answers are parsed once; `spank-gpu lint` asks each command
//! at most once, and those take what the controller takes (not timed here).
//!
//! Run in release mode: `cargo run --release -p batch-lint --example bench_lint`.
//! Prints the median, the 10th and the 90th percentile of single runs.

use std::error::Error;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use batch_lint::facts::{self, Cluster};
use batch_lint::{DirState, Facts, Input, Job, Release, check, needs, script};

const CLUSTER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lint/cluster/gpu");

fn time<T>(iterations: usize, mut op: impl FnMut() -> T) -> (f64, f64, f64) {
    for _ in 0..iterations / 10 {
        black_box(op());
    }
    let mut samples: Vec<Duration> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            black_box(op());
            start.elapsed()
        })
        .collect();
    samples.sort_unstable();
    let at = |q: usize| samples.get(samples.len() * q / 100).map_or(0.0, |d| d.as_secs_f64() * 1e6);
    (at(10), at(50), at(90))
}

/// A 300-line script: directives, environment setup, a trap, loops of steps.
fn script_300() -> String {
    let mut s = String::from(
        "#!/bin/bash\n#SBATCH --job-name=bench\n#SBATCH --partition=gpu-h100\n#SBATCH --nodes=4\n\
         #SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-task=1\n#SBATCH --cpus-per-task=12\n\
         #SBATCH --time=12:00:00\n#SBATCH --signal=B:USR1@300\n#SBATCH --requeue\n\
         #SBATCH --output=/scratch/%u/logs/%x-%j.out\n\nset -euo pipefail\n\
         CKPT=/scratch/$USER/ckpt/$SLURM_JOB_NAME\nmkdir -p \"$CKPT\"\n\
         on_usr1() {\n  touch \"$CKPT/SAVE\"\n  wait \"$SRUN_PID\"\n  scontrol requeue \"$SLURM_JOB_ID\"\n  exit 0\n}\n\
         trap on_usr1 USR1\n",
    );
    let mut n = 0;
    while s.lines().count() < 293 {
        n += 1;
        let _ = writeln!(s, "# stage {n}: preprocess shard {n}");
        let _ = writeln!(s, "SHARD_{n}=/data/shard-{n:03}");
        let _ = writeln!(s, "for f in \"$SHARD_{n}\"/*.jsonl; do echo \"$f\"; done > list-{n}.txt");
        let _ = writeln!(
            s,
            "srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" --kill-on-bad-exit=1 python prep.py --in \"$SHARD_{n}\" --list list-{n}.txt"
        );
    }
    let mut pad = 0;
    while s.lines().count() < 297 {
        pad += 1;
        let _ = writeln!(s, "echo \"stage done: $(date -Is) {pad}\"");
    }
    s.push_str("srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" --kill-on-bad-exit=1 python train.py --ckpt \"$CKPT\" &\nSRUN_PID=$!\nwait \"$SRUN_PID\"\n");
    s
}

fn main() -> Result<(), Box<dyn Error>> {
    let text = script_300();
    let read = |f: &str| std::fs::read_to_string(format!("{CLUSTER}/{f}"));
    let cluster = Cluster {
        from: "recorded".into(),
        partitions: Ok(facts::parse_sinfo(&read("sinfo.txt")?)),
        config: Ok(facts::parse_config(&read("config.txt")?)),
        qos: Ok(facts::parse_qos(&read("qos.txt")?)),
        jobs: Ok(facts::parse_job_qos(&read("squeue.txt")?)),
    };
    let input = Input {
        file: "bench.sh".into(),
        cwd: "/scratch/u/run".into(),
        user: "u".into(),
        release: (22 << 16) | (5 << 8) | 8,
        ..Input::default()
    };
    let s = script::read(text.as_bytes())?;
    let job = Job::new(&s, &input);
    let facts = Facts {
        release: Release { number: input.release, from: "bench".into() },
        cluster,
        dirs: needs(&job).dirs.into_iter().map(|d| (d, DirState::Dir { writable: true })).collect(),
    };
    let report = check(&job, &facts);
    println!(
        "script: {} lines, {} bytes, {} commands, {} srun steps; {} finding(s), {} note(s)",
        s.lines,
        s.bytes,
        s.shell.commands.len(),
        job.sruns.len(),
        report.findings.len(),
        report.notes.len()
    );
    for f in &report.findings {
        println!("  {}", f.one_line("bench.sh"));
    }
    println!("{:<42} {:>10} {:>10} {:>10}", "operation (one run)", "p10 us", "median us", "p90 us");
    let row = |name: &str, (p10, p50, p90): (f64, f64, f64)| {
        println!("{name:<42} {p10:>10.1} {p50:>10.1} {p90:>10.1}")
    };
    row("read the script (sbatch's and the shell's view)", time(2000, || script::read(text.as_bytes())));
    row("build the job and its steps", time(2000, || Job::new(&s, &input).sruns.len()));
    row("check every trap", time(2000, || check(&job, &facts).findings.len()));
    row(
        "all three",
        time(2000, || {
            let s = script::read(text.as_bytes()).map(|s| {
                let j = Job::new(&s, &input);
                check(&j, &facts).findings.len()
            });
            s.unwrap_or(0)
        }),
    );
    Ok(())
}
