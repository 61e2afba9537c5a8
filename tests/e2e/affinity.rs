//! End-to-end cases of `--gpu-affinity`: each node's GPU table is written by
//! `gpu-node-agent topology --write` from an hwloc XML that splits the
//! machine's real CPUs over two NUMA domains, GPUs 0-3 on the first, 4-7 on
//! the second; node2's `gres.conf` lists its device files out of minor order.

use std::fs;

use slurm_lab::Lab;
use slurm_lab::agents::{cpu_halves, write_topology};

use super::{CaseResult, ok};

/// `srun ARGS` on a node, each task printing `RANK LOCALID CUDA_VISIBLE_DEVICES Cpus_allowed_list OMP`.
fn tasks(lab: &Lab, args: &[&str]) -> Result<Vec<(u32, String, String, String)>, String> {
    let script = "echo \"$SLURM_PROCID $CUDA_VISIBLE_DEVICES $(grep Cpus_allowed_list /proc/self/status | cut -f2) ${OMP_NUM_THREADS:-unset}\"";
    let (so, se) = ok(lab.command("srun").args(args).args(["bash", "-c", script]))?;
    let mut rows: Vec<(u32, String, String, String)> = so
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                (*f.get(1)?).to_owned(),
                (*f.get(2)?).to_owned(),
                (*f.get(3)?).to_owned(),
            ))
        })
        .collect();
    rows.sort();
    if rows.is_empty() {
        return Err(format!("no task output:\n{so}\n{se}"));
    }
    Ok(rows)
}

fn setup(lab: &Lab) -> Result<(String, String, String), String> {
    for node in lab.nodes.clone() {
        write_topology(lab, &node)?;
    }
    let (lo, hi) = cpu_halves()?;
    Ok((lo.to_string(), hi.to_string(), lo.union(&hi).to_string()))
}

pub fn tasks_bind_to_the_cpus_of_their_gpus(lab: &mut Lab) -> CaseResult {
    let (lo, hi, _) = setup(lab)?;
    let table =
        fs::read_to_string(lab.node_topology_dir("node1").join("gpus.tsv")).map_err(|e| e.to_string())?;
    ensure!(table.lines().filter(|l| !l.starts_with('#')).count() == 8, "node1's table:\n{table}");
    let rows = tasks(lab, &["-w", "node1", "-n8", "--gpus-per-task=1", "--gpu-affinity", "--auto-rdzv"])?;
    ensure!(rows.len() == 8, "{rows:?}");
    for (rank, cvd, cpus, omp) in &rows {
        let want = if cvd.parse::<u32>().unwrap_or(99) < 4 { &lo } else { &hi };
        ensure!(cpus == want, "node1 task {rank} with GPU {cvd} bound to {cpus}, expected {want}: {rows:?}");
        let n = gpu_core::cpuset::CpuSet::parse(cpus).map(|c| c.len()).unwrap_or(0);
        ensure!(omp == &n.to_string(), "task {rank}: OMP_NUM_THREADS={omp} for {n} bound CPUs");
    }
    Ok(())
}

pub fn slurm_index_order_is_followed_when_gres_lists_minors_out_of_order(lab: &mut Lab) -> CaseResult {
    let (lo, hi, _) = setup(lab)?;
    // node2's gres.conf lists nvidia4-7 first: Slurm's GPU 0 is minor 4, on the second domain.
    let table =
        fs::read_to_string(lab.node_topology_dir("node2").join("gpus.tsv")).map_err(|e| e.to_string())?;
    let first = table.lines().find(|l| !l.starts_with('#')).unwrap_or_default().to_owned();
    ensure!(first.starts_with("0\t4\t"), "node2's table does not follow Slurm's order:\n{table}");
    let rows = tasks(lab, &["-w", "node2", "-n8", "--gpus-per-task=1", "--gpu-affinity"])?;
    for (rank, cvd, cpus, _) in &rows {
        let want = if cvd.parse::<u32>().unwrap_or(99) < 4 { &hi } else { &lo };
        ensure!(
            cpus == want,
            "node2 task {rank} with Slurm GPU {cvd} bound to {cpus}, expected {want}: {rows:?}"
        );
    }
    Ok(())
}

pub fn tasks_that_see_every_gpu_take_their_share_in_local_rank_order(lab: &mut Lab) -> CaseResult {
    let (lo, hi, _) = setup(lab)?;
    let rows = tasks(lab, &["-w", "node1", "-n2", "--gpus-per-node=8", "--gpu-affinity=verbose"])?;
    let cpus: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    ensure!(cpus == [lo.as_str(), hi.as_str()], "local ranks 0 and 1 bound to {cpus:?}");
    Ok(())
}

pub fn user_cpu_bind_and_a_missing_table_leave_slurms_mask(lab: &mut Lab) -> CaseResult {
    let (lo, _, all) = setup(lab)?;
    let rows = tasks(lab, &["-w", "node1", "-n1", "--gpus-per-task=1", "--gpu-affinity", "--cpu-bind=none"])?;
    ensure!(rows[0].2 == all, "--cpu-bind was not respected: {rows:?}");
    let rows =
        tasks(lab, &["-w", "node1", "-n1", "--gpus-per-task=1", "--gpu-affinity=force", "--cpu-bind=none"])?;
    ensure!(rows[0].2 == lo, "--gpu-affinity=force did not bind: {rows:?}");

    fs::remove_file(lab.node_topology_dir("node1").join("gpus.tsv")).map_err(|e| e.to_string())?;
    let mark = super::LogMark::new(lab);
    let rows = tasks(lab, &["-w", "node1", "-n2", "--gpus-per-task=1", "--gpu-affinity"])?;
    ensure!(rows.iter().all(|r| r.2 == all), "bound without a table: {rows:?}");
    ensure!(mark.wait_for("--gpu-affinity: no usable GPU table").is_some(), "no log line:\n{}", mark.since());
    write_topology(lab, "node1")?;
    Ok(())
}
