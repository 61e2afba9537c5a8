//! `--auto-rdzv`: ranks that meet with no glue, distinct ports for concurrent
//! steps and jobs, the user's and the admin's values kept, `explain` and
//! `verbose`, a taken port named, and the launch traps warned about.

use std::time::Duration;

use slurm_lab::Lab;

use super::{CaseResult, LogMark, ok, output, probe, run_batch, text};

pub fn ranks_meet_across_nodes_with_no_glue(lab: &mut Lab) -> CaseResult {
    let script = format!(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --auto-rdzv\nsrun {} ranks\n",
        probe()
    );
    let out = run_batch(lab, &script)?;
    ensure!(
        out.contains("rank 0 on node1 met [1 node1, 2 node2, 3 node2] at node1:"),
        "rank 0 did not meet all:\n{out}"
    );
    for r in 1..4 {
        ensure!(out.contains(&format!("rank {r} on ")), "rank {r} missing:\n{out}");
    }
    Ok(())
}

pub fn torchrun_style_launch_reads_pet_defaults(lab: &mut Lab) -> CaseResult {
    let script = format!(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n\
         #SBATCH --auto-rdzv\nsrun {} torchrun\nsrun printenv PET_NPROC_PER_NODE\n",
        probe()
    );
    let out = run_batch(lab, &script)?;
    ensure!(
        out.contains("node 0 on node1 met [1 node2] at node1:"),
        "torchrun-style rendezvous failed:\n{out}"
    );
    ensure!(
        out.matches("\n8\n").count() + usize::from(out.starts_with("8\n")) >= 1,
        "PET_NPROC_PER_NODE:\n{out}"
    );
    Ok(())
}

fn port_of(line: &str) -> Option<u16> {
    line.rsplit(':').next()?.trim().parse().ok()
}

pub fn concurrent_steps_and_jobs_get_distinct_ports(lab: &mut Lab) -> CaseResult {
    // Two steps of one job at once.
    let p = probe();
    let script = format!(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --auto-rdzv\n\
         srun -N2 -n2 --exact {p} ranks 1500 &\nsrun -N2 -n2 --exact {p} ranks 1500 &\nwait\n"
    );
    let out = run_batch(lab, &script)?;
    let ports: Vec<u16> = out.lines().filter(|l| l.starts_with("rank 0 ")).filter_map(port_of).collect();
    ensure!(ports.len() == 2 && ports[0] != ports[1], "two steps, ports {ports:?}:\n{out}");

    // Two jobs on the same node at once.
    let script = format!(
        "#!/bin/bash\n#SBATCH --nodelist=node1\n#SBATCH --ntasks=2\n#SBATCH --auto-rdzv\nsrun {p} ranks 2000\n"
    );
    let a = lab.sbatch(&script, &[]).map_err(|e| e.to_string())?;
    let b = lab.sbatch(&script, &[]).map_err(|e| e.to_string())?;
    let mut ports = Vec::new();
    for job in [a, b] {
        let state = lab.wait_job(job, Duration::from_secs(90)).map_err(|e| e.to_string())?;
        let out = lab.job_output(job);
        ensure!(state == "COMPLETED", "job {job} ended {state}:\n{out}");
        ports.extend(out.lines().filter(|l| l.starts_with("rank 0 ")).filter_map(port_of));
    }
    ensure!(ports.len() == 2 && ports[0] != ports[1], "two jobs on node1, ports {ports:?}");
    Ok(())
}

pub fn user_port_is_kept_and_threads_follow_cpus_per_gpu(lab: &mut Lab) -> CaseResult {
    let (so, _) = ok(lab.command("srun").env("MASTER_PORT", "23999").args([
        "--auto-rdzv",
        "-n1",
        "printenv",
        "MASTER_PORT",
    ]))?;
    ensure!(so.trim() == "23999", "user's MASTER_PORT not kept: {so}");
    let (so, _) = ok(lab.command("srun").args([
        "--auto-rdzv",
        "-n1",
        "-c",
        "4",
        "--gpus-per-task=1",
        "printenv",
        "OMP_NUM_THREADS",
    ]))?;
    ensure!(so.trim() == "4", "-c 4 --gpus-per-task=1 gave OMP_NUM_THREADS={so}");
    let (so, _) = ok(lab.command("srun").args([
        "--auto-rdzv",
        "-N1",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "-c",
        "8",
        "printenv",
        "OMP_NUM_THREADS",
    ]))?;
    ensure!(so.trim() == "1", "-c 8 with 8 GPUs gave OMP_NUM_THREADS={so}");
    Ok(())
}

pub fn uneven_layout_gets_right_ranks(lab: &mut Lab) -> CaseResult {
    let (so, _) = ok(lab.command("srun").args([
        "--auto-rdzv",
        "-n3",
        "-N2",
        "bash",
        "-c",
        "echo $(hostname) $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK",
    ]))?;
    let mut lines: Vec<&str> = so.lines().collect();
    lines.sort_unstable();
    ensure!(
        lines == ["node1 0 3 0 2 0", "node1 1 3 1 2 0", "node2 2 3 0 1 1"],
        "ranks for -n3 -N2: {lines:?}"
    );
    Ok(())
}

pub fn admin_defaults_apply_where_the_user_set_nothing(lab: &mut Lab) -> CaseResult {
    lab.set_plugstack_args(&["auto_rdzv=on", "nccl_socket_ifname=eth0", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"])
        .map_err(|e| e.to_string())?;
    let result = (|| {
        let (so, _) = ok(lab.command("srun").env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0").args([
            "-n1",
            "bash",
            "-c",
            "echo $MASTER_ADDR $NCCL_SOCKET_IFNAME $TORCH_NCCL_ASYNC_ERROR_HANDLING",
        ]))?;
        ensure!(so.trim() == "node1 eth0 0", "admin default on, user value kept: got '{}'", so.trim());
        let (so, _) = ok(lab.command("srun").args([
            "--auto-rdzv=off",
            "-n1",
            "bash",
            "-c",
            "echo ${MASTER_ADDR:-unset}",
        ]))?;
        ensure!(so.trim() == "unset", "--auto-rdzv=off did not win over the admin default");
        // A user's value longer than the plugin's first read buffer (512 bytes; a
        // SLURM_CPU_BIND_LIST of 64 tasks on a big node is longer): read whole, kept.
        let long = "x".repeat(1500);
        let (so, se) = ok(lab.command("srun").env("TORCH_NCCL_ASYNC_ERROR_HANDLING", &long).args([
            "--auto-rdzv=verbose",
            "-n1",
            "bash",
            "-c",
            "echo $TORCH_NCCL_ASYNC_ERROR_HANDLING",
        ]))?;
        ensure!(so.trim() == long, "a 1500-byte user value not kept: {} bytes", so.trim().len());
        ensure!(
            se.contains(&format!("TORCH_NCCL_ASYNC_ERROR_HANDLING={long} (set by you")),
            "verbose does not name the whole 1500-byte value as the user's:\n{}",
            se.chars().take(600).collect::<String>()
        );
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

pub fn explain_shows_what_the_plugin_set(lab: &mut Lab) -> CaseResult {
    let explain = slurm_lab::agents::bin("spank-gpu").display().to_string();

    let (so, _) =
        ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "-l", &explain, "explain", "--json"]))?;
    let line = so.lines().find(|l| l.starts_with("1: ")).ok_or(format!("no rank 1 output:\n{so}"))?;
    for want in [
        "\"plugin_active\":true",
        "\"nodes\":[\"node1\",\"node2\"]",
        "{\"name\":\"RANK\",\"value\":\"1\",\"outcome\":\"set\"",
        "{\"name\":\"MASTER_ADDR\",\"value\":\"node1\",\"outcome\":\"set\"",
    ] {
        ensure!(line.contains(want), "explain --json lacks {want}:\n{line}");
    }
    let (so, _) = ok(lab.command("srun").env("MASTER_PORT", "23997").args([
        "--auto-rdzv",
        "-n1",
        &explain,
        "explain",
    ]))?;
    ensure!(so.contains("MASTER_PORT=23997  (kept: set by you"), "explain text:\n{so}");
    Ok(())
}

pub fn verbose_says_what_was_set_and_kept(lab: &mut Lab) -> CaseResult {
    let (_, se) = ok(lab.command("srun").env("MASTER_PORT", "23998").args([
        "--auto-rdzv=verbose",
        "-N2",
        "-n2",
        "true",
    ]))?;
    let lines: Vec<&str> = se.lines().filter(|l| l.starts_with("spank-gpu: task ")).collect();
    ensure!(lines.len() == 2, "expected one verbose line per task:\n{se}");
    ensure!(
        lines.iter().all(|l| l.contains("MASTER_ADDR=node1") && l.contains("kept MASTER_PORT=23998")),
        "{se}"
    );
    Ok(())
}

pub fn a_taken_port_is_named_on_stderr(lab: &mut Lab) -> CaseResult {
    let mut holder = lab
        .command_on("node1", &probe())
        .map_err(|e| e.to_string())?
        .args(["hold", "24555", "8000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let out = output(lab.command("srun").args(["--auto-rdzv=port=24555", "-w", "node1", "-n1", "true"]));
    let _ = holder.kill();
    let _ = holder.wait();
    let (_, se) = text(&out?);
    ensure!(
        se.contains("spank-gpu: error: MASTER_PORT 24555 cannot be bound on node1"),
        "no port line:\n{se}"
    );
    ensure!(se.contains("rdzv-probe"), "holder not named:\n{se}");
    Ok(())
}

pub fn garbage_node_list_sets_nothing_and_the_job_runs(lab: &mut Lab) -> CaseResult {
    lab.set_plugstack_args(&["debug_nodelist=node[9-1"]).map_err(|e| e.to_string())?;
    let result = (|| {
        let mark = LogMark::new(lab);
        let (so, _) = ok(lab.command("srun").args([
            "--auto-rdzv",
            "-N2",
            "-n2",
            "bash",
            "-c",
            "echo ${MASTER_ADDR:-unset}",
        ]))?;
        ensure!(so.matches("unset").count() == 2, "something was set from a garbage node list:\n{so}");
        let needle = "spank-gpu: --auto-rdzv: cannot find MASTER_ADDR: bad hostlist 'node[9-1'";
        ensure!(mark.wait_for(needle).is_some(), "no log line:\n{}", mark.since());
        // One line per node (each slurmstepd), not one per task.
        std::thread::sleep(Duration::from_millis(300));
        let count = mark.since().lines().filter(|l| l.contains(needle)).count();
        ensure!(count <= 2, "{count} log lines for 2 nodes:\n{}", mark.since());
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

pub fn launch_traps_get_one_warning_with_the_fix(lab: &mut Lab) -> CaseResult {
    let script = "#!/bin/bash\n#SBATCH -n1\n#SBATCH -c4\n#SBATCH --gres=gpu:4\n#SBATCH --auto-rdzv\n\
                  srun -n1 true\nsrun -n1 -c4 --gpus-per-task=1 true\nsrun -n1 -c4 true\n";
    let out = run_batch(lab, script)?;
    let cpu = out.matches("this step has 1 CPU per task but the job asked for 4").count();
    let gpu = out.matches("the only task on this node sees 1 GPU but the job has 4 here").count();
    ensure!(gpu == 1 && out.contains("--gpus-per-node=4"), "expected one GPU warning with the fix:\n{out}");
    if lab.slurm_at_least(23, 11) {
        // srun inherits the job's --cpus-per-task again from 23.11 (it reads
        // SLURM_CPUS_PER_TASK: NEWS of 23.11.0, src/srun/opt.c): no trap, no warning.
        ensure!(cpu == 0, "warned about a trap Slurm {} does not have:\n{out}", lab.release());
    } else {
        ensure!(
            cpu == 1 && out.contains("srun --cpus-per-task=$SLURM_CPUS_PER_TASK"),
            "expected one CPU warning:\n{out}"
        );
    }
    Ok(())
}
