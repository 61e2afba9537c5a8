//! Launch patterns production sites use that the first lab did not cover:
//! heterogeneous steps, the batch step, explicit port words.

use std::process::Command;

use slurm_lab::Lab;

use crate::{CaseResult, ok, probe, run_batch};

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

/// `master_addr=addr`: `MASTER_ADDR` is the first node's NodeAddr from
/// slurm.conf on every node (where NodeName does not resolve), and a
/// slurm.conf the plugin cannot read leaves the NodeName with one log line.
pub fn master_addr_word_gives_the_first_nodes_addr(lab: &mut Lab) -> CaseResult {
    let conf = format!("slurm_conf={}", lab.slurm_conf().display());
    let result = (|| {
        lab.set_plugstack_args(&["master_addr=addr", &conf]).map_err(|e| e.to_string())?;
        let (so, _) = ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "printenv", "MASTER_ADDR"]))?;
        let got: Vec<&str> = so.lines().collect();
        ensure!(got == ["10.77.0.11", "10.77.0.11"], "MASTER_ADDR with master_addr=addr: {got:?}");
        let (so, _) =
            ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "printenv", "PET_MASTER_ADDR"]))?;
        ensure!(so.lines().all(|l| l == "10.77.0.11"), "PET_MASTER_ADDR: {so}");

        let mark = crate::LogMark::new(lab);
        lab.set_plugstack_args(&["master_addr=addr", "slurm_conf=/nonexistent/slurm.conf"])
            .map_err(|e| e.to_string())?;
        let (so, _) = ok(lab.command("srun").args(["--auto-rdzv", "-N1", "-n1", "printenv", "MASTER_ADDR"]))?;
        ensure!(so.trim() == "node1", "MASTER_ADDR without a readable slurm.conf: {so}");
        let line = mark.wait_for("master_addr=addr: /nonexistent").unwrap_or_default();
        ensure!(line.contains("MASTER_ADDR stays node1"), "no log line saying why: '{line}'");
        Ok(())
    })();
    let reset = lab.set_plugstack_args(&[]).map_err(|e| e.to_string());
    result.and(reset)
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
