//! End-to-end cases of `--gpu-affinity`, under every task plugin setup: each
//! node's GPU table is written by `gpu-node-agent topology --write` from an
//! hwloc XML that splits the machine's real CPUs over two NUMA domains, with
//! the GPUs placed as a [`GpuLayout`] says (in order, or interleaved so that
//! Slurm's own cyclic binding is wrong for GPU 0's task); node2's `gres.conf`
//! lists its device files out of minor order. Under task/affinity the nodes
//! have the machine's real CPUs (2 here), so the task counts follow
//! [`Lab::cpus_per_node`].

use std::fs;

use slurm_formats::cpuset::CpuSet;
use slurm_lab::agents::{GpuLayout, cpu_halves, write_topology_with};
use slurm_lab::{Lab, TaskSetup};

use super::{CaseResult, ok};

/// One task's view: rank, CUDA_VISIBLE_DEVICES, Cpus_allowed_list,
/// OMP_NUM_THREADS, and the device minors of the GPUs it really has.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Task {
    pub(crate) rank: u32,
    pub(crate) cvd: String,
    pub(crate) cpus: String,
    pub(crate) omp: String,
    pub(crate) minors: Vec<u32>,
}

/// The device minor of Slurm's GPU `index` on `node` (node2's gres.conf lists minors 4-7 first).
fn minor(node: &str, index: u32) -> u32 {
    if node == "node2" { (index + 4) % 8 } else { index }
}

/// `srun -w NODE ARGS` with each task printing what [`Task`] holds. The GPUs
/// a task really has are its CUDA_VISIBLE_DEVICES, except under
/// `ConstrainDevices`, where Slurm renumbers them from 0 for each task: there
/// they are the fake devices the task may open (EPERM for the others).
pub(crate) fn tasks(lab: &Lab, node: &str, args: &[&str]) -> Result<Vec<Task>, String> {
    let script = format!(
        "o=; for n in 0 1 2 3 4 5 6 7; do (exec 3<{}/cdev/nvidia$n) 2>&1 | grep -q 'not permitted' || o=$o${{o:+,}}$n; done; \
         echo \"$SLURM_PROCID $CUDA_VISIBLE_DEVICES $(grep Cpus_allowed_list /proc/self/status | cut -f2) ${{OMP_NUM_THREADS:-unset}} $o\"",
        lab.dir.display()
    );
    let (so, se) = ok(lab.command("srun").args(["-w", node]).args(args).args(["bash", "-c", &script]))?;
    let constrained = lab.task_setup() == TaskSetup::AffinityCgroup;
    let list = |s: &str| -> Vec<u32> { s.split(',').filter_map(|x| x.parse().ok()).collect() };
    let mut rows: Vec<Task> = so
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let cvd = (*f.get(1)?).to_owned();
            let minors = if constrained {
                list(f.get(4)?)
            } else {
                list(&cvd).into_iter().map(|i| minor(node, i)).collect()
            };
            Some(Task {
                rank: f.first()?.parse().ok()?,
                cvd,
                cpus: (*f.get(2)?).to_owned(),
                omp: (*f.get(3)?).to_owned(),
                minors,
            })
        })
        .collect();
    rows.sort();
    if rows.is_empty() {
        return Err(format!("no task output:\n{so}\n{se}"));
    }
    Ok(rows)
}

/// Writes every node's table with `layout`; returns the two halves and all CPUs.
pub(crate) fn setup(lab: &Lab, layout: GpuLayout) -> Result<(String, String, String), String> {
    for node in lab.nodes.clone() {
        write_topology_with(lab, &node, layout)?;
    }
    let (lo, hi) = cpu_halves()?;
    Ok((lo.to_string(), hi.to_string(), lo.union(&hi).to_string()))
}

/// The CPUs local to a task's one GPU under `layout`.
pub(crate) fn want(layout: GpuLayout, task: &Task) -> Result<String, String> {
    match task.minors.as_slice() {
        [m] => layout.cpus(*m).map(|c| c.to_string()),
        other => Err(format!("task {} has GPUs {other:?}, expected one: {task:?}", task.rank)),
    }
}

/// Tasks per node for a one-GPU-per-task step: 8, or fewer where the node has fewer CPUs.
fn per_node(lab: &Lab) -> String {
    format!("-n{}", lab.cpus_per_node().min(8))
}

pub fn tasks_bind_to_the_cpus_of_their_gpus(lab: &mut Lab) -> CaseResult {
    let layout = GpuLayout::Interleaved;
    setup(lab, layout)?;
    let table =
        fs::read_to_string(lab.node_topology_dir("node1").join("gpus.tsv")).map_err(|e| e.to_string())?;
    // GPU rows (a table v3 also has machine records, `@...`, which the agent made with hwloc).
    let gpu_rows = table.lines().filter(|l| l.starts_with(|c: char| c.is_ascii_digit())).count();
    ensure!(gpu_rows == 8, "node1's table:\n{table}");
    ensure!(
        table.starts_with("# spank-gpu gpu table v3\n") && table.contains("\n@cores\t"),
        "node1's table is not a version 3 table with the machine:\n{table}"
    );
    let n = per_node(lab);
    let rows = tasks(lab, "node1", &[&n, "--gpus-per-task=1", "--gpu-affinity", "--auto-rdzv"])?;
    ensure!(rows.len() == lab.cpus_per_node().min(8) as usize, "{rows:?}");
    for task in &rows {
        let want = want(layout, task)?;
        ensure!(
            task.cpus == want,
            "node1 task {} with GPU {:?} (CUDA_VISIBLE_DEVICES={}) bound to {}, expected {want}: {rows:?}",
            task.rank,
            task.minors,
            task.cvd,
            task.cpus
        );
        let n = CpuSet::parse(&task.cpus).map(|c| c.len()).unwrap_or(0);
        ensure!(
            task.omp == n.to_string(),
            "task {}: OMP_NUM_THREADS={} for {n} bound CPUs",
            task.rank,
            task.omp
        );
    }
    Ok(())
}

pub fn slurm_index_order_is_followed_when_gres_lists_minors_out_of_order(lab: &mut Lab) -> CaseResult {
    let layout = GpuLayout::Blocks;
    setup(lab, layout)?;
    // node2's gres.conf lists nvidia4-7 first: Slurm's GPU 0 is minor 4, on the second domain.
    let table =
        fs::read_to_string(lab.node_topology_dir("node2").join("gpus.tsv")).map_err(|e| e.to_string())?;
    let first = table.lines().find(|l| !l.starts_with('#')).unwrap_or_default().to_owned();
    ensure!(first.starts_with("0\t4\t"), "node2's table does not follow Slurm's order:\n{table}");
    let n = per_node(lab);
    let rows = tasks(lab, "node2", &[&n, "--gpus-per-task=1", "--gpu-affinity"])?;
    for task in &rows {
        let want = want(layout, task)?;
        ensure!(
            task.cpus == want,
            "node2 task {} with Slurm GPU {} (minor {:?}) bound to {}, expected {want}: {rows:?}",
            task.rank,
            task.cvd,
            task.minors,
            task.cpus
        );
    }
    Ok(())
}

pub fn tasks_that_see_every_gpu_take_their_share_in_local_rank_order(lab: &mut Lab) -> CaseResult {
    let (lo, hi, _) = setup(lab, GpuLayout::Blocks)?;
    let rows = tasks(lab, "node1", &["-n2", "--gpus-per-node=8", "--gpu-affinity=verbose", "--auto-rdzv"])?;
    let cpus: Vec<&str> = rows.iter().map(|r| r.cpus.as_str()).collect();
    ensure!(cpus == [lo.as_str(), hi.as_str()], "local ranks 0 and 1 bound to {cpus:?}");
    // OMP_NUM_THREADS divides each task's bound CPUs by the 4 GPUs of its share, not
    // by the 8 it sees.
    for r in &rows {
        println!("local rank {}: CPUs {} OMP_NUM_THREADS={}", r.rank, r.cpus, r.omp);
        let n = CpuSet::parse(&r.cpus).map(|c| c.len()).unwrap_or(0);
        let want = (n / 4).max(1).to_string();
        ensure!(
            r.omp == want,
            "task {} bound to {} ({n} CPUs, a share of 4 GPUs): OMP_NUM_THREADS={}, want {want}",
            r.rank,
            r.cpus,
            r.omp
        );
    }
    Ok(())
}

pub fn user_cpu_bind_and_a_missing_table_leave_slurms_mask(lab: &mut Lab) -> CaseResult {
    let layout = GpuLayout::Interleaved;
    let (_, _, all) = setup(lab, layout)?;
    // One task with every CPU of the node, so Slurm's mask under --cpu-bind=none
    // is all of them: task/affinity in 22.05 binds a step that has part of the
    // node to the step's CPUs even with --cpu-bind=none (`-n1 --exclusive
    // --cpu-bind=none` gets `mask_cpu:0x1`).
    let c = format!("-c{}", lab.cpus_per_node());
    let one = ["-n1", &c, "--gpus-per-task=1", "--cpu-bind=none"];
    let rows = tasks(lab, "node1", &[&one[..], &["--gpu-affinity"]].concat())?;
    ensure!(rows[0].cpus == all, "--cpu-bind was not respected: {rows:?}");
    let rows = tasks(lab, "node1", &[&one[..], &["--gpu-affinity=force"]].concat())?;
    let gpu0 = want(layout, &rows[0])?;
    ensure!(rows[0].cpus == gpu0, "--gpu-affinity=force did not bind to {gpu0}: {rows:?}");

    // Without a table every task keeps the mask Slurm gave it (the same step without the option).
    fs::remove_file(lab.node_topology_dir("node1").join("gpus.tsv")).map_err(|e| e.to_string())?;
    let slurms: Vec<String> =
        tasks(lab, "node1", &["-n2", "--gpus-per-task=1"])?.into_iter().map(|t| t.cpus).collect();
    if lab.task_setup() == TaskSetup::None {
        ensure!(slurms.iter().all(|c| *c == all), "task/none bound tasks: {slurms:?}");
    }
    let mark = super::LogMark::new(lab);
    let rows = tasks(lab, "node1", &["-n2", "--gpus-per-task=1", "--gpu-affinity"])?;
    let cpus: Vec<String> = rows.iter().map(|t| t.cpus.clone()).collect();
    ensure!(cpus == slurms, "bound without a table: {cpus:?}, Slurm's masks {slurms:?}");
    ensure!(mark.wait_for("--gpu-affinity: no usable GPU table").is_some(), "no log line:\n{}", mark.since());
    write_topology_with(lab, "node1", layout)?;
    Ok(())
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

/// Under `ConstrainDevices` each task's GPUs are the ones its device cgroup
/// lets it reach (the probe, pointed at the lab's fake devices with the
/// debug build's `debug_dev_dir`), and it binds to their CPUs; verbose says
/// `[device cgroup]`. Where nothing constrains devices the probe finds no
/// constraint and the variables are used.
pub fn the_device_cgroup_names_each_tasks_gpus(lab: &mut Lab) -> CaseResult {
    let layout = GpuLayout::Interleaved;
    setup(lab, layout)?;
    let dev_dir = format!("debug_dev_dir={}", lab.dir.join("cdev").display());
    lab.set_plugstack_args(&[&dev_dir]).map_err(|e| e.to_string())?;
    let result = (|| {
        let constrained = lab.task_setup() == slurm_lab::TaskSetup::AffinityCgroup;
        for args in [&["-n2", "--gpus-per-task=1"][..], &["-n2", "--ntasks-per-gpu=2", "--gpus=1"][..]] {
            let mut cmd = lab.command("srun");
            cmd.args(["-w", "node1"]).args(args).args(["--gpu-affinity=verbose", "true"]);
            let (_, se) = ok(&mut cmd)?;
            let lines: Vec<&str> =
                se.lines().filter(|l| l.starts_with("spank-gpu: gpu-affinity: task ")).collect();
            ensure!(lines.len() == 2, "{args:?}: expected 2 verbose lines:\n{se}");
            let said = lines.iter().filter(|l| l.contains("[device cgroup]")).count();
            // --ntasks-per-gpu=2 --gpus=1: both tasks have the step's only GPU, every
            // other one is refused: a constraint, seen as such.
            let expected = if constrained { 2 } else { 0 };
            ensure!(
                said == expected,
                "{args:?}: {said} tasks took their GPUs from the device cgroup, expected {expected}:\n{se}"
            );
            let rows = tasks(lab, "node1", &[args, &["--gpu-affinity"]].concat())?;
            for task in &rows {
                let want = want(layout, task)?;
                ensure!(
                    task.cpus == want,
                    "{args:?}: task {} (GPU {:?}) on {}, expected {want}: {rows:?}",
                    task.rank,
                    task.minors,
                    task.cpus
                );
            }
        }
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}
