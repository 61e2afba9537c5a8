//! `slurm-lab`: the local Slurm cluster by hand.
//!
//! ```text
//! slurm-lab demo     bring the cluster up with the plugin, run the demo job, tear down
//! slurm-lab shell    bring it up and open a shell with SLURM_CONF set; exit the shell to tear down
//! slurm-lab down     clean up after a lab that was killed (by the PIDs and names it recorded)
//! ```
//! Run as root. The plugin comes from the build tree (`cargo build`) or `$SPANK_GPU_PLUGIN`.

use std::process::{Command, ExitCode};
use std::time::Duration;

use slurm_lab::{Lab, LabConfig, built_plugin, cleanup_recorded};

const USAGE: &str = "usage: slurm-lab demo | shell | down";

fn main() -> ExitCode {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let result = match arg.as_str() {
        "demo" => demo(),
        "shell" => shell(),
        "down" => cleanup_recorded().map_err(|e| e.to_string()),
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
/// `#SBATCH` line and no launch glue in the script.
const DEMO_JOB: &str = r#"#!/bin/bash
#SBATCH --job-name=spank-gpu-demo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH --auto-rdzv
srun -l bash -c 'echo "$(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SPANK_GPU_AUTO_RDZV=${SPANK_GPU_AUTO_RDZV:-unset}"' | sort
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
    println!("\n$ sbatch demo.sh\n{DEMO_JOB}");
    let job = lab.sbatch(DEMO_JOB, &[]).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    println!("job {job}: {state}\n--- output ---\n{}", lab.job_output(job));
    drop(lab);
    eprintln!("slurm-lab: torn down");
    if state == "COMPLETED" { Ok(()) } else { Err(format!("demo job ended {state}")) }
}
