//! Issue 21: the two defects every release had, and the cases of the
//! per-release rules that a lab can show.

use std::time::Duration;

use slurm_lab::Lab;
use slurm_lab::agents::GpuLayout;

use crate::affinity::{setup, tasks, want};
use crate::{CaseResult, LogMark, ok, run_batch};

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

/// Runs `srun ARGS` with every task printing `SLURM_PROCID RANK NODE_RANK
/// MASTER_ADDR host`, then the rendezvous stand-in with the same layout.
/// Checks that `MASTER_ADDR`, `NODE_RANK` 0, `RANK` 0 and Slurm's task 0 are
/// one host (srun's plugin told the step where task 0 is), that `RANK` is
/// `SLURM_PROCID`, and that the ranks meet there; returns the host of
/// `SLURM_PROCID` 0 (which order Slurm used).
fn rank_0_is_on_master_addr(lab: &Lab, env: &[(&str, &str)], args: &[&str]) -> Result<String, String> {
    let show = "echo \"$SLURM_PROCID $RANK $NODE_RANK $MASTER_ADDR $(hostname)\"";
    let mut cmd = lab.command("srun");
    cmd.envs(env.iter().copied()).args(args).args(["--auto-rdzv=verbose", "/bin/bash", "-c", show]);
    let (so, se) = ok(&mut cmd)?;
    let rows: Vec<Vec<&str>> = so.lines().map(|l| l.split_whitespace().collect()).collect();
    ensure!(rows.len() == 2 && rows.iter().all(|r| r.len() == 5), "{args:?}:\n{so}\n{se}");
    let on = |col: usize, val: &str| rows.iter().find(|r| r[col] == val).map(|r| r[4].to_owned());
    let (rank0, node0, procid0) = (on(1, "0"), on(2, "0"), on(0, "0"));
    let master = rows[0][3].to_owned();
    ensure!(
        rank0.as_deref() == Some(master.as_str()) && node0.as_deref() == Some(master.as_str()),
        "{args:?}: MASTER_ADDR={master}, RANK 0 on {rank0:?}, NODE_RANK 0 on {node0:?}:\n{so}"
    );
    ensure!(rows.iter().all(|r| r[0] == r[1]), "{args:?}: RANK is not SLURM_PROCID:\n{so}");
    let procid0 = procid0.ok_or(format!("no SLURM_PROCID 0:\n{so}"))?;
    ensure!(procid0 == master, "{args:?}: Slurm's task 0 on {procid0}, MASTER_ADDR {master}:\n{so}");
    if procid0 != "node1" {
        // Not the step's first node: verbose says why.
        ensure!(
            se.contains(&format!("MASTER_ADDR={master} (node of Slurm's task 0")),
            "{args:?}: verbose does not say MASTER_ADDR is task 0's node:\n{se}"
        );
    }
    let mut cmd = lab.command("srun");
    cmd.envs(env.iter().copied()).args(args).args(["--auto-rdzv", &crate::probe(), "ranks"]);
    let (so, se) = ok(&mut cmd)?;
    let other = if master == "node1" { "node2" } else { "node1" };
    ensure!(
        so.contains(&format!("rank 0 on {master} met [1 {other}] at {master}:")),
        "{args:?}: the ranks did not meet at MASTER_ADDR {master}:\n{so}\n{se}"
    );
    Ok(procid0)
}

/// How many `REQUEST_STEP_LAYOUT` RPCs slurmctld has served (`sdiag`'s
/// statistics by message type; a type not yet seen is not listed).
fn step_layout_rpcs(lab: &Lab) -> Result<u64, String> {
    let (so, _) = ok(lab.command("sdiag").arg("--all"))?;
    let line = so.lines().find(|l| l.trim_start().starts_with("REQUEST_STEP_LAYOUT "));
    let Some(line) = line else { return Ok(0) };
    let count = line.split_once("count:").and_then(|(_, rest)| rest.split_whitespace().next());
    count.and_then(|c| c.parse().ok()).ok_or(format!("sdiag: no count in '{line}'"))
}

/// `-m arbitrary` with `SLURM_HOSTFILE` listing node2 first (every release):
/// Slurm's task 0 is on node2, the node list's first host is node1. srun's
/// plugin tells the step: RANK 0, NODE_RANK 0 and MASTER_ADDR are node2, and
/// the ranks meet there. It asked slurmctld for the layout; five
/// default-layout multi-node steps with `--auto-rdzv` did not (`sdiag`).
pub fn arbitrary_layout_puts_rank_0_on_master_addr(lab: &mut Lab) -> CaseResult {
    let before = step_layout_rpcs(lab)?;
    for _ in 0..5 {
        ok(lab.command("srun").args(["-N2", "--ntasks-per-node=1", "--auto-rdzv", "true"]))?;
    }
    let default_rpcs = step_layout_rpcs(lab)? - before;
    println!("(REQUEST_STEP_LAYOUT for 5 default-layout steps: {default_rpcs})");
    ensure!(default_rpcs == 0, "5 default-layout sruns sent {default_rpcs} REQUEST_STEP_LAYOUT to slurmctld");
    let hostfile = lab.dir.join("out/hostfile-node2-first");
    std::fs::write(&hostfile, "node2\nnode1\n").map_err(|e| e.to_string())?;
    let hostfile = hostfile.display().to_string();
    let before = step_layout_rpcs(lab)?;
    ok(lab.command("srun").env("SLURM_HOSTFILE", &hostfile).args([
        "-n2",
        "-m",
        "arbitrary",
        "--auto-rdzv",
        "true",
    ]))?;
    let arbitrary_rpcs = step_layout_rpcs(lab)? - before;
    ensure!(arbitrary_rpcs == 1, "an -m arbitrary srun sent {arbitrary_rpcs} REQUEST_STEP_LAYOUT, not 1");
    let procid0 =
        rank_0_is_on_master_addr(lab, &[("SLURM_HOSTFILE", &hostfile)], &["-n2", "-m", "arbitrary"])?;
    ensure!(procid0 == "node2", "Slurm put SLURM_PROCID 0 on {procid0}, not the hostfile's first line");
    // srun's word reaches the step through --export=NONE too (a SLURM_ name).
    let args = ["-n2", "-m", "arbitrary", "--export=NONE"];
    let procid0 = rank_0_is_on_master_addr(lab, &[("SLURM_HOSTFILE", &hostfile)], &args)?;
    ensure!(procid0 == "node2", "--export=NONE: Slurm put SLURM_PROCID 0 on {procid0}");
    // `spank-gpu explain` gives the same MASTER_ADDR, for the same reason, as the plugin.
    let explain = slurm_lab::agents::bin("spank-gpu").display().to_string();
    let dir = lab.dir.join("out/explain-arbitrary");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (o, e) = (format!("{}/%t.json", dir.display()), format!("{}/%t.err", dir.display()));
    ok(lab.command("srun").env("SLURM_HOSTFILE", &hostfile).args([
        "-n2",
        "-m",
        "arbitrary",
        "--auto-rdzv=verbose",
        "-o",
        &o,
        "-e",
        &e,
        &explain,
        "explain",
        "--json",
    ]))?;
    for t in 0..2 {
        let json = std::fs::read_to_string(dir.join(format!("{t}.json"))).map_err(|e| e.to_string())?;
        let err = std::fs::read_to_string(dir.join(format!("{t}.err"))).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
        let addr = v["vars"].as_array().into_iter().flatten().find(|x| x["name"] == "MASTER_ADDR");
        let (value, why) = addr.map_or((None, None), |r| (r["value"].as_str(), r["why"].as_str()));
        let want = match (value, why) {
            (Some(val @ "node2"), Some(why)) if why.contains("task 0") => {
                format!(" MASTER_ADDR={val} ({why})")
            }
            _ => return Err(format!("task {t}: explain does not put MASTER_ADDR on task 0's node2: {json}")),
        };
        ensure!(err.contains(&want), "task {t}: the plugin's line lacks '{want}':\n{err}");
    }
    // The default block layout: nothing changes.
    let procid0 = rank_0_is_on_master_addr(lab, &[], &["-N2", "--ntasks-per-node=1"])?;
    ensure!(procid0 == "node1", "block layout: SLURM_PROCID 0 on {procid0}");
    Ok(())
}

/// On a lab with [`reversed_topology`]: `srun -N2 --ntasks-per-node=1`.
/// 26.05 numbers tasks in topology order (task 0 on node2), earlier releases
/// in node order; on every release RANK 0, NODE_RANK 0, MASTER_ADDR and
/// Slurm's task 0 are one host and the ranks meet there. Prints which order
/// Slurm used.
pub fn topology_order_puts_rank_0_on_master_addr(lab: &mut Lab) -> CaseResult {
    let procid0 = rank_0_is_on_master_addr(lab, &[], &["-N2", "--ntasks-per-node=1"])?;
    println!("(Slurm's SLURM_PROCID 0 on {procid0})");
    // The lab shows the layout it is for: 26.05 hands out task ids in topology order
    // (src/common/slurm_step_layout.c `_task_layout_topo`), earlier releases in node order.
    let expected = if lab.slurm_at_least(26, 5) { "node2" } else { "node1" };
    ensure!(procid0 == expected, "Slurm {} put SLURM_PROCID 0 on {procid0}, not {expected}", lab.release());
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

/// `master_addr=addr` without `slurm_conf=`: the plugin reads the slurm.conf
/// slurmd itself read (slurmd's `SLURM_CONF`, which a configless slurmd
/// points at its conf-cache copy), here the lab's, not `/etc/slurm`.
pub fn master_addr_reads_the_slurm_conf_slurmd_read(lab: &mut Lab) -> CaseResult {
    let result = (|| {
        lab.set_plugstack_args(&["master_addr=addr"]).map_err(|e| e.to_string())?;
        let (so, _) = ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "printenv", "MASTER_ADDR"]))?;
        let got: Vec<&str> = so.lines().collect();
        ensure!(got == ["10.77.0.11", "10.77.0.11"], "MASTER_ADDR with master_addr=addr alone: {got:?}");
        Ok(())
    })();
    let reset = lab.set_plugstack_args(&[]).map_err(|e| e.to_string());
    result.and(reset)
}

/// `salloc -N2 --auto-rdzv mpirun -np 4 ...` with the distribution's Open
/// MPI (`openmpi-bin`, needed on the lab's machine): mpirun starts one daemon
/// per node with srun (`srun --external-launcher prted` from Slurm 23.11);
/// the daemons get no per-rank variables, so no MPI rank inherits the
/// node's `RANK`, `LOCAL_RANK` or `PET_*`, while `MASTER_ADDR` reaches them.
/// Not in CASES: the lab's machine lacks Open MPI (see the report).
pub fn mpirun_ranks_inherit_no_per_rank_variables(lab: &mut Lab) -> CaseResult {
    let show = "echo \"$OMPI_COMM_WORLD_RANK ${RANK-unset} ${LOCAL_RANK-unset} ${PET_NODE_RANK-unset} ${MASTER_ADDR-unset} $(hostname)\"";
    let (so, se) = ok(lab.command("salloc").args([
        "-N2",
        "--ntasks-per-node=2",
        "--auto-rdzv",
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "4",
        "bash",
        "-c",
        show,
    ]))?;
    let rows: Vec<Vec<&str>> =
        so.lines().map(|l| l.split_whitespace().collect()).filter(|r: &Vec<&str>| r.len() == 6).collect();
    ensure!(rows.len() == 4, "expected 4 MPI ranks:\n{so}\n{se}");
    for r in &rows {
        ensure!(
            r[1..4] == ["unset", "unset", "unset"],
            "MPI rank {} inherited per-rank variables: {r:?}\n{so}",
            r[0]
        );
        ensure!(r[4] == "node1", "MPI rank {}: MASTER_ADDR={}", r[0], r[4]);
    }
    ensure!(rows.iter().any(|r| r[5] == "node2"), "no rank on node2:\n{so}");
    Ok(())
}
