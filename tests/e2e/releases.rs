//! Cases about what Slurm changed between releases, each with the Slurm
//! commit behind it, run on every release's lab: where the outcome differs,
//! the case asks the lab's release (`Lab::slurm_at_least`).

use std::fs;
use std::time::Duration;

use slurm_lab::Lab;

use super::{CaseResult, run_batch};

/// An `#SBATCH --auto-rdzv=port=A` and an explicit `srun --auto-rdzv=port=B`
/// inside the job: the step gets B, srun's own word, on every release.
/// Measured on 22.05 as on the newer ones; from 24.05 slurmstepd also skips
/// an option srun already gave instead of applying the job's environment's
/// after it (Slurm b3527b1882, "Skip environment remote spank option callback
/// if already called").
pub fn srun_option_against_an_sbatch_option(lab: &mut Lab) -> CaseResult {
    let script = "#!/bin/bash\n#SBATCH -N1 -n1\n#SBATCH --auto-rdzv=port=21111\n\
                  srun -n1 --auto-rdzv=port=22222 bash -c 'echo \"port $MASTER_PORT\"'\n";
    let out = run_batch(lab, script)?;
    ensure!(
        out.lines().any(|l| l == "port 22222"),
        "Slurm {}: srun's port=22222 lost:\n{out}",
        lab.release()
    );
    Ok(())
}

/// `sbatch --export=NONE` with `#SBATCH --auto-rdzv`: the steps inside still
/// have the option (their tasks get `RANK`, which only the option sets; the
/// batch step has none to pass on). Measured on 22.05 as on the newer ones;
/// from 23.11 Slurm forwards the SPANK options' variables explicitly under
/// `--export=NONE` (42e23f9a2d, "Forward SPANK options environment variables
/// when --export=[NIL|NONE]").
pub fn sbatch_options_and_export_none(lab: &mut Lab) -> CaseResult {
    let script = "#!/bin/bash\n#SBATCH -N1 -n1\n#SBATCH --export=NONE\n#SBATCH --auto-rdzv\n\
                  srun -n1 /bin/sh -c 'echo \"step ${RANK:-unset}\"'\n";
    let out = run_batch(lab, script)?;
    ensure!(out.lines().any(|l| l == "step 0"), "Slurm {}: the step lost the option:\n{out}", lab.release());
    Ok(())
}

/// Slurm's GPU index comes from `slurmd -G` even where slurm.conf says
/// `SlurmdDebug=error` (whether `-G` prints at that level differs by release:
/// slurmd.c `_print_gres`; the agent runs `slurmd -G -v`): on node2, whose
/// gres.conf lists minors 4-7 before 0-3, index 0 is minor 4.
pub fn the_gpu_index_comes_from_slurmd_with_slurmd_debug_error(lab: &mut Lab) -> CaseResult {
    let quiet = lab.dir.join("etc-quiet");
    fs::create_dir_all(&quiet).map_err(|e| e.to_string())?;
    for name in ["slurm.conf", "gres.conf", "plugstack.conf", "cgroup.conf"] {
        let Ok(text) = fs::read_to_string(lab.dir.join("etc").join(name)) else { continue };
        let text = text.replace("SlurmdDebug=verbose", "SlurmdDebug=error");
        fs::write(quiet.join(name), text).map_err(|e| e.to_string())?;
    }
    let conf = quiet.join("slurm.conf");
    let table = slurm_lab::agents::write_topology_with_conf(lab, "node2", &conf)?;
    let gpus =
        fs::read_to_string(lab.node_topology_dir("node2").join("gpus.tsv")).map_err(|e| e.to_string())?;
    // The table's rows: slurm_index, minor, ...
    let first: Vec<&str> = gpus
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .find(|l| l.split('\t').next() == Some("0"))
        .map(|l| l.split('\t').collect())
        .unwrap_or_default();
    ensure!(first.get(1) == Some(&"4"), "Slurm index 0 is not minor 4 on node2:\n{gpus}\n{table}");
    // Put the ordinary table back for the cases that follow.
    slurm_lab::agents::write_topology(lab, "node2")?;
    std::thread::sleep(Duration::from_millis(10));
    Ok(())
}
