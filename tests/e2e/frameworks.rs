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
/// `tests/frameworks/venv.sh` puts it (in `$VENVS`, default
/// `/var/cache/slurm-lab/venvs`).
fn jax_venv(lab: &Lab) -> Result<PathBuf, String> {
    let venv = std::env::var_os("SLURM_LAB_JAX_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let venvs = std::env::var_os("VENVS").unwrap_or_else(|| "/var/cache/slurm-lab/venvs".into());
        PathBuf::from(venvs).join(format!("{}-light", lab.release().version))
    });
    let root = lab.root().map(|r| r.inside(&venv)).unwrap_or_else(|| venv.clone());
    if !venv.join("bin/python").exists() || (lab.root().is_some() && !root.join("bin/python").exists()) {
        return Err(format!(
            "no JAX virtualenv at {} (in the lab's root too: SLURM_LAB_MOUNTS={0}): \
             run LIGHT=1 tests/frameworks/venv.sh {} [ROOT] as tests/run does (same $VENVS)",
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

/// A taken port: the note names `--kill-on-bad-exit=1`; with
/// `--auto-rdzv=strict` the first node's tasks exit 1 before they run, so
/// with `--kill-on-bad-exit=1` the whole step ends at once instead of leaving
/// the other ranks waiting on whatever holds the port until the time limit.
pub fn a_taken_port_fails_the_step_with_strict(lab: &mut Lab) -> CaseResult {
    let mut holder = crate::hold_port(lab, "node1", 24556, 60000)?;
    let run = |words: &str| {
        let started = std::time::Instant::now();
        let out = crate::output(lab.command("srun").args([
            "--kill-on-bad-exit=1",
            &format!("--auto-rdzv=port=24556{words}"),
            "-N2",
            "-n2",
            "-t1",
            "bash",
            "-c",
            "sleep 10; echo slept",
        ]));
        (out, started.elapsed())
    };
    let (plain, plain_took) = run("");
    let (strict, strict_took) = run(",strict");
    let _ = holder.kill();
    let _ = holder.wait();
    let (plain, strict) = (crate::text(&plain?), strict?);
    ensure!(
        plain.1.contains("--kill-on-bad-exit=1"),
        "the note does not name --kill-on-bad-exit=1:\n{}",
        plain.1
    );
    ensure!(
        plain.0.matches("slept").count() == 2,
        "without strict the step runs ({plain_took:?}):\n{plain:?}"
    );
    let (so, se) = crate::text(&strict);
    ensure!(!so.contains("slept"), "with strict a task ran ({strict_took:?}):\n{so}\n{se}");
    ensure!(
        strict_took < std::time::Duration::from_secs(8),
        "with strict the step took {strict_took:?}:\n{se}"
    );
    ensure!(!strict.status.success(), "with strict srun succeeded ({strict_took:?}):\n{so}\n{se}");
    ensure!(se.contains("(--auto-rdzv=strict)"), "no strict line on srun's stderr:\n{se}");
    Ok(())
}

/// On a lab with [`slurm_lab::reversed_topology`] (26.05 numbers tasks
/// in topology order: Slurm's task 0 on node2): `jax.distributed.initialize()`
/// with no arguments takes its process id from `SLURM_PROCID`, so its process
/// 0 is on node2, and the plugin's `JAX_COORDINATOR_ADDRESS` must be there
/// (srun's plugin tells the step where task 0 is). It meets on every
/// release, and so does the `process_id=int(os.environ["RANK"])` form (RANK
/// is SLURM_PROCID).
pub fn jax_on_a_topology_ordered_layout(lab: &mut Lab) -> CaseResult {
    let venv = jax_venv(lab)?;
    let dir = lab.dir.join("out/jax-topology");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("jax_init.py"), JAX_JOB).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("agree.py"), AGREE).map_err(|e| e.to_string())?;
    let (py, d) = (venv.join("bin/python"), dir.display());
    // srun making its own allocation, the shape placement.rs's rank cases use: 26.05 lays
    // the tasks of such a job out in topology order.
    let run = |from_rank: bool| -> Result<String, String> {
        let body = format!(
            "export PYTHONPATH={d} PYTHONDONTWRITEBYTECODE=1 EXPECT_WORLD=2 JAX_INIT_TIMEOUT=15{id}; \
             echo \"task $SLURM_PROCID RANK $RANK on $(hostname)\"; exec timeout 40 {py} {d}/jax_init.py",
            id = if from_rank { " JAX_ID_FROM_RANK=1" } else { "" },
            py = py.display()
        );
        let out = crate::output(lab.command("srun").args([
            "-N2",
            "--ntasks-per-node=1",
            "-t2",
            "--auto-rdzv",
            "bash",
            "-c",
            &body,
        ]))?;
        let (so, se) = crate::text(&out);
        Ok(format!("{so}{se}"))
    };
    let meets =
        |out: &str| out.lines().any(|l| l.starts_with("ok jax ") && l.contains("world 2, ranks 0-1 agree"));
    for from_rank in [false, true] {
        let out = run(from_rank)?;
        let form = if from_rank { "process_id=RANK" } else { "no arguments" };
        ensure!(
            meets(&out) && !out.contains("FAIL"),
            "Slurm {}: JAX with {form} did not meet:\n{out}",
            lab.release()
        );
    }
    Ok(())
}
