//! A real framework end to end: JAX's CPU wheels from PyPI (the smallest of
//! the framework suite's, `tests/run frameworks`), installed by `tests/run`
//! into a cached virtualenv per release (`LIGHT=1 tests/frameworks/venv.sh
//! RELEASE [ROOT]`), mounted into a release's root with `SLURM_LAB_MOUNTS`.

use std::path::PathBuf;

use slurm_lab::Lab;

use crate::{CaseResult, run_batch};

/// The job and its check, the framework suite's own files.
const JAX_JOB: &str = include_str!("../frameworks/jobs/jax_init.py");
const AGREE: &str = include_str!("../frameworks/jobs/agree.py");

/// The light venv of the lab's release: `$SLURM_LAB_JAX_VENV`, else where
/// `tests/frameworks/venv.sh` puts it.
fn jax_venv(lab: &Lab) -> Result<PathBuf, String> {
    let venv = std::env::var_os("SLURM_LAB_JAX_VENV").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(format!("/var/cache/slurm-lab/venvs/{}-light", lab.release().version))
    });
    let root = lab.root().map(|r| r.inside(&venv)).unwrap_or_else(|| venv.clone());
    if !venv.join("bin/python").exists() || (lab.root().is_some() && !root.join("bin/python").exists()) {
        return Err(format!(
            "no JAX virtualenv at {} (in the lab's root too: SLURM_LAB_MOUNTS={0}): \
             run LIGHT=1 tests/frameworks/venv.sh {} [ROOT] as tests/run does",
            venv.display(),
            lab.release().version
        ));
    }
    Ok(venv)
}

/// `jax.distributed.initialize()` with no arguments in two concurrent steps of
/// one job: JAX alone derives one coordinator port per job (`61440 + job_id %
/// 4096`) and the steps cross-talk; with `--auto-rdzv` each step's
/// `JAX_COORDINATOR_ADDRESS` is its own `MASTER_ADDR:MASTER_PORT`, and every
/// process of each step agrees on the world (2) and its index.
pub fn jax_distributed_initialize_in_two_concurrent_steps(lab: &mut Lab) -> CaseResult {
    let venv = jax_venv(lab)?;
    let dir = lab.dir.join("out/jax");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("jax_init.py"), JAX_JOB).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("agree.py"), AGREE).map_err(|e| e.to_string())?;
    let (py, d) = (venv.join("bin/python"), dir.display());
    let script = format!(
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2\n#SBATCH --auto-rdzv\n\
         export PYTHONPATH={d} PYTHONDONTWRITEBYTECODE=1 EXPECT_WORLD=2\n\
         for s in a b; do srun -N2 -n2 --overlap bash -c 'echo \"$SLURM_STEP_ID $JAX_COORDINATOR_ADDRESS\"; \
         exec timeout 80 {py} {d}/jax_init.py' & done\nwait\n",
        py = py.display()
    );
    let out = run_batch(lab, &script)?;
    let oks: Vec<&str> = out.lines().filter(|l| l.starts_with("ok jax ")).collect();
    ensure!(oks.len() == 2, "want one ok line per step:\n{out}");
    ensure!(oks.iter().all(|l| l.contains("world 2, ranks 0-1 agree")), "{out}");
    ensure!(!out.contains("FAIL"), "{out}");
    // Each step's coordinator is its own, at rank 0's host.
    let mut points: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, p)| p))
        .filter(|p| p.starts_with("node1:"))
        .collect();
    points.sort_unstable();
    points.dedup();
    ensure!(points.len() == 2, "the two steps did not get two coordinators at node1: {points:?}\n{out}");
    Ok(())
}
