//! `slurm-lab`: the local Slurm cluster by hand.
//!
//! ```text
//! slurm-lab demo     bring the cluster up with the plugin, run the demo job, tear down
//! slurm-lab shell    bring it up and open a shell with SLURM_CONF set; exit the shell to tear down
//! slurm-lab down     clean up after a lab that was killed (by the PIDs and names it recorded)
//! slurm-lab bench    launch overhead of the plugin: srun of 16 tasks with and without it
//! ```
//! Run as root. The plugin comes from the build tree (`cargo build`) or `$SPANK_GPU_PLUGIN`.

use std::process::{Command, ExitCode};
use std::time::Duration;

use slurm_lab::{Lab, LabConfig, built_plugin, cleanup_recorded};

const USAGE: &str = "usage: slurm-lab demo | shell | down | bench [RUNS]";

fn main() -> ExitCode {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let result = match arg.as_str() {
        "demo" => demo(),
        "shell" => shell(),
        "down" => cleanup_recorded().map_err(|e| e.to_string()),
        "bench" => bench(std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(31)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slurm-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn start() -> Result<Lab, String> {
    let cfg = LabConfig { plugin: Some(built_plugin()), ..LabConfig::default() };
    eprintln!("slurm-lab: starting munge, slurmctld and {} namespaced slurmd nodes ...", cfg.nodes);
    let lab = Lab::start(cfg).map_err(|e| e.to_string())?;
    eprintln!("slurm-lab: up in {}; all nodes idle", lab.dir.display());
    Ok(lab)
}

fn shell() -> Result<(), String> {
    let lab = start()?;
    eprintln!(
        "slurm-lab: SLURM_CONF={} — try `sinfo`, `srun -N2 hostname`; exit to tear down",
        lab.slurm_conf().display()
    );
    let status =
        lab.command("bash").stdin(std::process::Stdio::inherit()).status().map_err(|e| e.to_string())?;
    drop(lab);
    if status.success() { Ok(()) } else { Err(format!("shell exited with {status}")) }
}

/// The demo job: two nodes, two tasks per node, the plugin's option on an
/// `#SBATCH` line and no launch glue in the script. `PROBE` is replaced by the
/// path of `rdzv-probe`, a stand-in for `python train.py` that reads only
/// MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE and meets over TCP.
const DEMO_JOB: &str = r#"#!/bin/bash
#SBATCH --job-name=spank-gpu-demo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=2
#SBATCH --auto-rdzv
srun --cpus-per-task=2 -l bash -c 'echo "$(hostname) RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE MASTER=$MASTER_ADDR:$MASTER_PORT CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES OMP_NUM_THREADS=$OMP_NUM_THREADS"' | sort
srun --cpus-per-task=2 PROBE ranks
"#;

fn demo() -> Result<(), String> {
    let lab = start()?;
    let show = |title: &str, cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| e.to_string())?;
        println!(
            "\n$ {title}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    show("sinfo", lab.command("sinfo").arg("-N"))?;
    let help = lab.command("srun").arg("--help").output().map_err(|e| e.to_string())?;
    let help = String::from_utf8_lossy(&help.stdout);
    let plugin_part = help.split("Options provided by plugins:").nth(1).unwrap_or("(missing!)");
    println!("\n$ srun --help   (the plugin's part)\nOptions provided by plugins:{}", plugin_part.trim_end());
    let probe = std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("rdzv-probe");
    let script = DEMO_JOB.replace("PROBE", &probe.display().to_string());
    println!("\n$ sbatch demo.sh\n{script}");
    let job = lab.sbatch(&script, &[]).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    println!("job {job}: {state}\n--- output ---\n{}", lab.job_output(job));
    drop(lab);
    eprintln!("slurm-lab: torn down");
    if state == "COMPLETED" { Ok(()) } else { Err(format!("demo job ended {state}")) }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Launch overhead: `srun -N2 -n16 true` with the plugin (and `--auto-rdzv`)
/// and with an empty plugstack, interleaved in one run so machine noise hits
/// both alike. Prints the medians, their ratio and the added time per task.
fn bench(runs: usize) -> Result<(), String> {
    const TASKS: usize = 16;
    let lab = start()?;
    let time = |args: &[&str]| -> Result<f64, String> {
        let t = std::time::Instant::now();
        let out = lab.command("srun").args(args).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("srun failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let n = format!("-n{TASKS}");
    for i in 0..runs + 1 {
        lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
        let a = time(&["--auto-rdzv", "-N2", &n, "true"])?;
        std::fs::write(lab.dir.join("etc/plugstack.conf"), "").map_err(|e| e.to_string())?;
        let b = time(&["-N2", &n, "true"])?;
        if i > 0 {
            // The first pair warms caches.
            with.push(a);
            without.push(b);
        }
    }
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    let (mw, mo) = (median(with), median(without));
    println!("srun -N2 -n{TASKS} true, {runs} interleaved runs each:");
    println!("  with spank_gpu.so and --auto-rdzv: median {mw:.1} ms");
    println!("  without the plugin:                median {mo:.1} ms");
    println!("  ratio {:.3}; added per task {:.3} ms", mw / mo, (mw - mo) / TASKS as f64);
    Ok(())
}
