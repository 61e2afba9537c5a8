//! `--auto-rdzv`: ranks that meet with no glue, distinct ports for concurrent
//! steps and jobs, the user's and the admin's values kept, `explain` and
//! `verbose`, a taken port named, and the launch traps warned about.

use std::process::Command;
use std::time::Duration;

use slurm_lab::Lab;

use super::{CaseResult, LogMark, hold_port, ok, output, probe, run_batch, text, wait_until};

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
        // On node1 by name: which node a one-task step gets is the scheduler's choice
        // (26.05.5 gave node2 where earlier releases gave node1).
        let (so, _) = ok(lab.command("srun").env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0").args([
            "-w",
            "node1",
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

    // Each task's JSON to a file of its own: srun cuts a labelled output line at 1024 bytes.
    let dir = lab.dir.join("out/explain-json");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let o = format!("{}/%t.json", dir.display());
    ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "-o", &o, &explain, "explain", "--json"]))?;
    let line = std::fs::read_to_string(dir.join("1.json")).map_err(|e| format!("no rank 1 output: {e}"))?;
    let line = line.trim();
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("explain --json is not JSON ({e}):\n{line}"))?;
    ensure!(v["plugin_active"] == true, "explain --json: plugin_active is not true:\n{line}");
    ensure!(v["nodes"] == serde_json::json!(["node1", "node2"]), "explain --json: nodes:\n{line}");
    for (name, value) in [("RANK", "1"), ("MASTER_ADDR", "node1")] {
        let set = v["vars"].as_array().is_some_and(|vars| {
            vars.iter().any(|x| x["name"] == name && x["value"] == value && x["outcome"] == "set")
        });
        ensure!(set, "explain --json lacks {name}={value} set:\n{line}");
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
    let mut holder = hold_port(lab, "node1", 24555, 8000)?;
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
        // One line per node (each slurmstepd), not one per task: both nodes' lines, then no more.
        let count = || mark.since().lines().filter(|l| l.contains(needle)).count();
        wait_until("both slurmstepds' log lines", Duration::from_secs(5), || Ok(count() >= 2))?;
        let count = count();
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

/// `srun A : B`: the SPANK items are per component, the ranks must not be.
pub fn het_step_ranks_meet_across_components(lab: &mut Lab) -> CaseResult {
    let p = probe();
    let (so, se) = ok(lab.command("srun").args([
        "--auto-rdzv",
        "-N1",
        "-n1",
        "-w",
        "node1",
        &p,
        "ranks",
        ":",
        "--auto-rdzv",
        "-N1",
        "-n2",
        "-w",
        "node2",
        &p,
        "ranks",
    ]))?;
    ensure!(
        so.contains("rank 0 on node1 met [1 node2, 2 node2] at node1:"),
        "the het step's 3 ranks did not meet at one MASTER_ADDR:MASTER_PORT:\nstdout: {so}\nstderr: {se}"
    );
    Ok(())
}

/// The batch shell gets only what every step shares: no ranks.
pub fn batch_step_gets_no_ranks(lab: &mut Lab) -> CaseResult {
    let script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --auto-rdzv\n\
                  echo batch RANK=${RANK-unset} NODE_RANK=${NODE_RANK-unset} WORLD_SIZE=${WORLD_SIZE-unset} \
                  MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT\n\
                  srun -N2 bash -c 'echo step NODE_RANK=$NODE_RANK MASTER_PORT=$MASTER_PORT'\n";
    let out = run_batch(lab, script)?;
    let batch = out.lines().find(|l| l.starts_with("batch ")).unwrap_or_default();
    ensure!(
        batch.contains("RANK=unset NODE_RANK=unset WORLD_SIZE=unset MASTER_ADDR=node1 MASTER_PORT="),
        "the batch step: {batch}\n{out}"
    );
    let port = batch.rsplit("MASTER_PORT=").next().unwrap_or_default().trim().to_owned();
    for rank in 0..2 {
        let want = format!("step NODE_RANK={rank} MASTER_PORT={port}");
        ensure!(
            out.lines().any(|l| l.trim() == want),
            "missing '{want}' (step 0 gets the announced port):\n{out}"
        );
    }
    Ok(())
}

/// `--auto-rdzv=port=N` beats a `MASTER_PORT` inherited from the environment.
pub fn an_explicit_port_word_beats_an_inherited_port(lab: &mut Lab) -> CaseResult {
    let mut cmd: Command = lab.command("srun");
    cmd.env("MASTER_PORT", "12345").args(["--auto-rdzv=port=23456", "-n1", "printenv", "MASTER_PORT"]);
    let (so, _) = ok(&mut cmd)?;
    ensure!(so.trim() == "23456", "MASTER_PORT with --auto-rdzv=port=23456 and an inherited 12345: {so}");
    let mut cmd: Command = lab.command("srun");
    cmd.env("MASTER_PORT", "12345").args(["--auto-rdzv", "-n1", "printenv", "MASTER_PORT"]);
    let (so, _) = ok(&mut cmd)?;
    ensure!(so.trim() == "12345", "without a port word the user's MASTER_PORT stays: {so}");
    Ok(())
}

/// With `MpiParams=ports=` and `srun --resv-ports`, `MASTER_PORT` is the last
/// reserved port (mpi/cray_shasta hands the first to PMI) when the admin says
/// `resv_ports=on`, and the derived port otherwise.
pub fn reserved_ports_give_the_last_one(lab: &mut Lab) -> CaseResult {
    let run = |lab: &Lab| -> Result<(String, String), String> {
        let (so, _) = ok(lab.command("srun").args([
            "--auto-rdzv",
            "--resv-ports=3",
            "-n1",
            "bash",
            "-c",
            "echo $SLURM_STEP_RESV_PORTS $MASTER_PORT",
        ]))?;
        match so.split_whitespace().collect::<Vec<_>>().as_slice() {
            [resv, port] => Ok(((*resv).to_owned(), (*port).to_owned())),
            _ => Err(format!("expected SLURM_STEP_RESV_PORTS and MASTER_PORT, got: {so}")),
        }
    };
    let (resv, port) = run(lab)?;
    let first = |r: &str| r.split([',', '-']).next().unwrap_or_default().to_owned();
    ensure!(
        port.parse::<u16>().is_ok_and(|p| (20000..30000).contains(&p)),
        "default: derived port, got {port} ({resv})"
    );
    let result = (|| {
        lab.set_plugstack_args(&["resv_ports=on"]).map_err(|e| e.to_string())?;
        let (resv, port) = run(lab)?;
        let last = resv.rsplit([',', '-']).next().unwrap_or_default();
        ensure!(last == port, "resv_ports=on: MASTER_PORT {port} is not the last of {resv}");
        ensure!(first(&resv) != port, "MASTER_PORT took the first reserved port: {resv}");
        Ok(())
    })();
    let reset = lab.set_plugstack_args(&[]).map_err(|e| e.to_string());
    result.and(reset)
}

/// `spank-gpu explain --json`, run in the task the plugin set up, says what
/// the plugin's verbose line says (every variable it set, with the value and
/// the reason) and gives the same warnings, for several launch patterns.
pub fn explain_agrees_with_the_plugin(lab: &mut Lab) -> CaseResult {
    let explain = slurm_lab::agents::bin("spank-gpu").display().to_string();
    let patterns: [(&str, &str, &str); 5] = [
        ("two-nodes", "#SBATCH -N2 -n4", "-N2 -n4"),
        // One task per node: torchrun's PET_* and PET_RDZV_ENDPOINT/ID too.
        ("one-per-node", "#SBATCH -N2 -n2", "-N2 -n2"),
        ("uneven", "#SBATCH -N2 -n3", "-N2 -n3"),
        // The job asked for 2 CPUs per task; srun before 23.11 does not inherit them (a warning).
        ("cpus-not-inherited", "#SBATCH -N1 -n1 -c2", "-n1"),
        // One task per node sees 1 of the job's 8 GPUs (a warning).
        ("one-gpu-per-node", "#SBATCH -n1 -c4 --gres=gpu:4", "-n1 -c4 --gpus-per-task=1"),
    ];
    for (name, sbatch, srun) in patterns {
        let out = lab.dir.join(format!("out/explain-{name}"));
        std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
        let script = format!(
            "#!/bin/bash\n{sbatch}\nsrun --auto-rdzv=verbose {srun} -o {d}/%t.json -e {d}/%t.err {explain} explain --json\n",
            d = out.display()
        );
        run_batch(lab, &script)?;
        let tasks = std::fs::read_dir(&out)
            .map_err(|e| e.to_string())?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"));
        let mut seen = 0;
        for entry in tasks {
            seen += 1;
            let json = std::fs::read_to_string(entry.path()).map_err(|e| e.to_string())?;
            let err = std::fs::read_to_string(entry.path().with_extension("err")).unwrap_or_default();
            let v: serde_json::Value =
                serde_json::from_str(&json).map_err(|e| format!("{name}: explain --json: {e}: {json}"))?;
            let rank = v["task"]["rank"].as_u64().unwrap_or(u64::MAX);
            let line = err
                .lines()
                .find(|l| l.starts_with(&format!("spank-gpu: task {rank} ")))
                .ok_or(format!("{name}: no verbose line for rank {rank}:\n{err}"))?;
            for var in v["vars"].as_array().into_iter().flatten().filter(|x| x["outcome"] == "set") {
                let (n, val, why) = (var["name"].as_str(), var["value"].as_str(), var["why"].as_str());
                let want = match (n, val, why) {
                    (Some(n), Some(val), Some("")) => format!(" {n}={val}"),
                    (Some(n), Some(val), Some(why)) => format!(" {n}={val} ({why})"),
                    _ => return Err(format!("{name}: odd var {var}")),
                };
                ensure!(
                    line.contains(&want),
                    "{name}: the plugin's line lacks '{want}' that explain gives:\n{line}"
                );
            }
            let plugin_warnings: Vec<&str> =
                err.lines().filter_map(|l| l.strip_prefix("spank-gpu: warning: ")).collect();
            let explain_warnings: Vec<&str> = v["warnings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_str)
                .collect();
            if v["task"]["local_rank"] == 0 {
                ensure!(
                    plugin_warnings == explain_warnings,
                    "{name}: rank {rank}: the plugin warned {plugin_warnings:?}, explain {explain_warnings:?}"
                );
            }
        }
        ensure!(seen > 0, "{name}: no task output in {}", out.display());
        // srun inherits --cpus-per-task again from 23.11 (it reads SLURM_CPUS_PER_TASK, no
        // longer SRUN_CPUS_PER_TASK: NEWS of 23.11.0, src/srun/opt.c), so there is no trap there.
        let trap =
            name == "one-gpu-per-node" || (name == "cpus-not-inherited" && !lab.slurm_at_least(23, 11));
        if trap {
            let all = std::fs::read_to_string(out.join("0.err")).unwrap_or_default();
            ensure!(all.contains("spank-gpu: warning: "), "{name}: the trap was not warned about:\n{all}");
        }
    }
    Ok(())
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
