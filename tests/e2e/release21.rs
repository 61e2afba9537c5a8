//! Issue 21: the two defects every release had, and the cases of the
//! per-release rules that a lab can show.

use std::time::Duration;

use slurm_lab::Lab;
use slurm_lab::agents::GpuLayout;

use crate::affinity::{setup, tasks, want};
use crate::{CaseResult, LogMark, run_batch};

/// `sbatch -N1 --auto-rdzv` (and `-N2`) without `-n`: slurmstepd's batch step
/// has 0 tasks; the batch shell still gets `MASTER_ADDR` and `MASTER_PORT`,
/// the port its first step gets, and nothing of the plugin's is in the output.
pub fn a_batch_job_without_ntasks_gets_addr_and_port(lab: &mut Lab) -> CaseResult {
    for nodes in ["1", "2"] {
        let script = format!(
            "#!/bin/bash\n#SBATCH -N{nodes}\n#SBATCH --auto-rdzv\n\
             echo \"batch MASTER_ADDR=${{MASTER_ADDR-unset}} MASTER_PORT=${{MASTER_PORT-unset}} RANK=${{RANK-unset}}\"\n\
             srun -N{nodes} --ntasks-per-node=1 bash -c 'echo \"step $SLURM_PROCID MASTER_PORT=$MASTER_PORT\"'\n"
        );
        let out = run_batch(lab, &script)?;
        let batch = out.lines().find(|l| l.starts_with("batch ")).unwrap_or_default();
        ensure!(batch.starts_with("batch MASTER_ADDR=node1 MASTER_PORT=2"), "-N{nodes}: {batch}\n{out}");
        ensure!(batch.ends_with(" RANK=unset"), "-N{nodes}: the batch shell got a rank: {batch}");
        let port = batch.split("MASTER_PORT=").nth(1).and_then(|r| r.split(' ').next()).unwrap_or_default();
        let steps = out.lines().filter(|l| l.starts_with("step ")).count();
        ensure!(steps == nodes.parse::<usize>().unwrap_or(0), "-N{nodes}: {steps} step lines:\n{out}");
        ensure!(
            out.lines()
                .filter(|l| l.starts_with("step "))
                .all(|l| l.ends_with(&format!("MASTER_PORT={port}"))),
            "-N{nodes}: the first step did not get the announced port {port}:\n{out}"
        );
        ensure!(!out.contains("spank-gpu"), "-N{nodes}: the plugin wrote into the job's output:\n{out}");
    }
    Ok(())
}

/// The plugin's own trouble (here a node list it cannot read, through the
/// debug build's `debug_nodelist`) never reaches the job's output as an
/// error: one line per node in the slurmd log; with `verbose`, one line per
/// task on its stderr saying what was not done.
pub fn the_plugins_trouble_is_never_an_error_in_the_job_output(lab: &mut Lab) -> CaseResult {
    lab.set_plugstack_args(&["debug_nodelist=node[9-1"]).map_err(|e| e.to_string())?;
    let result = (|| {
        let needle = "spank-gpu: --auto-rdzv: cannot find MASTER_ADDR: bad hostlist 'node[9-1'";
        for word in ["", "=verbose"] {
            let mark = LogMark::new(lab);
            let script = format!(
                "#!/bin/bash\n#SBATCH -N2\n#SBATCH --auto-rdzv{word}\n\
                 echo \"batch ${{MASTER_ADDR:-unset}}\"\nsrun -N2 --ntasks-per-node=1 bash -c 'echo \"step ${{MASTER_ADDR:-unset}}\"'\n"
            );
            let out = run_batch(lab, &script)?;
            ensure!(out.matches("unset").count() == 3, "something was set from a garbage node list:\n{out}");
            ensure!(!out.contains("error"), "an error in the job's output ({word}):\n{out}");
            let told = out
                .lines()
                .filter(|l| l.starts_with("spank-gpu: --auto-rdzv: cannot find MASTER_ADDR"))
                .count();
            let want = if word.is_empty() { 0 } else { 3 };
            ensure!(
                told == want,
                "--auto-rdzv{word}: {told} lines in the job's output, expected {want}:\n{out}"
            );
            ensure!(mark.wait_for(needle).is_some(), "no slurmd log line:\n{}", mark.since());
            std::thread::sleep(Duration::from_millis(300));
            let logged = mark.since().lines().filter(|l| l.contains(needle)).count();
            // The batch step's slurmstepd and the step's two.
            ensure!(logged == 3, "{logged} log lines for 3 slurmstepds:\n{}", mark.since());
        }
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

/// `--gpu-affinity=force` beats an explicit `--cpu-bind=map_cpu:` or
/// `mask_cpu:` list: each task runs on its GPU's CPU. Without `force` the
/// user's binding stays (under task/affinity: each task on the other GPU's CPU).
pub fn force_beats_an_explicit_cpu_bind_list(lab: &mut Lab) -> CaseResult {
    let layout = GpuLayout::Interleaved;
    setup(lab, layout)?;
    if lab.cpus_per_node() < 2 {
        return Err(format!("needs 2 CPUs per node, the lab has {}", lab.cpus_per_node()));
    }
    for bind in ["--cpu-bind=map_cpu:0,1", "--cpu-bind=mask_cpu:0x1,0x2"] {
        let args = ["-n2", "--gpus-per-task=1", bind];
        let rows = tasks(lab, "node1", &[&args[..], &["--gpu-affinity=force,verbose"]].concat())?;
        ensure!(rows.len() == 2, "{bind}: {rows:?}");
        for task in &rows {
            let want = want(layout, task)?;
            ensure!(
                task.cpus == want,
                "{bind} --gpu-affinity=force: task {} (GPU {:?}) on CPUs {}, its GPU's are {want}: {rows:?}",
                task.rank,
                task.minors,
                task.cpus
            );
        }
        if lab.task_setup().binds() {
            let rows = tasks(lab, "node1", &[&args[..], &["--gpu-affinity"]].concat())?;
            let cpus: Vec<&str> = rows.iter().map(|t| t.cpus.as_str()).collect();
            ensure!(cpus == ["0", "1"], "{bind} without force: Slurm's binding was not kept: {rows:?}");
        }
    }
    Ok(())
}
