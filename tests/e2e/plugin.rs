//! The plugin in every Slurm context: the symbols it exports, its options in
//! every `--help`, options from `#SBATCH` lines, bad options and plugstack
//! arguments, and panics and hook errors contained.

use std::process::Command;
use std::time::Duration;

use slurm_lab::Lab;

use super::{CaseResult, LogMark, all_idle, ok, output, run_batch, text, wait_until};

/// What a plugin built for this release exports, as docs/architecture.md lists
/// it (the plugin's own tests hold that list equal to its `src/exports.rs`):
/// from 25.05, also `slurm_spank_init_failure_mode` (spank.h, Slurm commit
/// ef535530f2), so a `required` plugin whose init fails fails the job instead of
/// draining the node.
fn expected_exports(lab: &Lab) -> Result<Vec<String>, String> {
    let doc = md_tables::exported_symbols();
    let (major, minor) = doc
        .since
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| format!("docs/architecture.md: 'in builds for Slurm {}': not a release", doc.since))?;
    let mut names: Vec<String> = doc.always.into_iter().map(|n| n.name).collect();
    if lab.slurm_at_least(major, minor) {
        names.extend(doc.later.into_iter().map(|n| n.name));
    }
    names.sort_unstable();
    Ok(names)
}

pub fn plugin_exports_only_its_symbols(lab: &mut Lab) -> CaseResult {
    let so = lab.plugin_path();
    let (syms, _) = ok(Command::new("nm").args(["-D", "--defined-only", "--format=posix"]).arg(&so))?;
    let mut names: Vec<&str> = syms.lines().filter_map(|l| l.split_whitespace().next()).collect();
    names.sort_unstable();
    let expected = expected_exports(lab)?;
    ensure!(names == expected, "exported symbols {names:?}, expected {expected:?} (Slurm {})", lab.release());
    ensure!(!names.iter().any(|n| *n == "init" || *n == "fini"), "exports init/fini");
    // Nothing in the plugin can start a thread or a process: it imports none
    // of the calls that do. (`syscall` is imported for set_mempolicy only.)
    let (undefined, _) = ok(Command::new("nm").args(["-D", "--undefined-only", "--format=posix"]).arg(&so))?;
    for call in ["pthread_create", "clone", "clone3", "fork", "vfork", "posix_spawn", "execve", "system"] {
        ensure!(
            !undefined.lines().any(|l| l.split_whitespace().next() == Some(call)),
            "the plugin imports {call}"
        );
    }

    let (dynamic, _) = ok(Command::new("readelf").arg("-d").arg(&so))?;
    ensure!(dynamic.contains("NODELETE"), "not linked with -z nodelete:\n{dynamic}");
    ensure!(!dynamic.contains("libslurm"), "links libslurm:\n{dynamic}");

    // plugin_name must be the bytes "spank_gpu\0" at the symbol's address.
    let (rodata, _) = ok(Command::new("strings").arg(&so))?;
    ensure!(rodata.lines().any(|l| l == "spank_gpu"), "plugin_name string missing");
    Ok(())
}

pub fn options_in_every_help(lab: &mut Lab) -> CaseResult {
    for tool in ["srun", "sbatch", "salloc"] {
        let (help, _) = ok(lab.command(tool).arg("--help"))?;
        let plugins = help.split("Options provided by plugins:").nth(1);
        ensure!(plugins.is_some(), "{tool} --help has no plugin section:\n{help}");
        for option in ["--auto-rdzv=off|verbose|port=N", "--gpu-affinity=off|verbose|force|mem"] {
            ensure!(help.contains(option), "{tool} --help lacks {option}");
        }
    }
    Ok(())
}

/// Prints `<where> <host> <MASTER_ADDR or unset>`: the plugin sets
/// MASTER_ADDR only with --auto-rdzv in force.
const MARKER_JOB: &str = r#"#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --auto-rdzv
echo "batch $(hostname) ${MASTER_ADDR:-unset}"
srun bash -c 'echo "step $(hostname) ${MASTER_ADDR:-unset}"'
"#;

pub fn sbatch_option_reaches_batch_step_and_inner_sruns(lab: &mut Lab) -> CaseResult {
    let job = lab.sbatch(MARKER_JOB, &[]).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let out = lab.job_output(job);
    ensure!(state == "COMPLETED", "job {job} ended {state}:\n{out}");
    ensure!(out.contains("batch node1 node1"), "batch step lacks MASTER_ADDR:\n{out}");
    let steps: Vec<&str> = out.lines().filter(|l| l.starts_with("step ")).collect();
    ensure!(steps.len() == 4, "expected 4 step tasks:\n{out}");
    ensure!(steps.iter().all(|l| l.ends_with(" node1")), "a step task lacks MASTER_ADDR:\n{out}");
    ensure!(steps.iter().any(|l| l.contains("node2")), "no task ran on node2:\n{out}");

    // The control: without the option nothing is set (so the marker proves the option travelled).
    let plain = MARKER_JOB.replace("#SBATCH --auto-rdzv\n", "");
    let job = lab.sbatch(&plain, &[]).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let out = lab.job_output(job);
    ensure!(state == "COMPLETED", "control job ended {state}:\n{out}");
    ensure!(
        !out.contains(" 1\n") && out.matches("unset").count() == 5,
        "marker set without the option:\n{out}"
    );
    Ok(())
}

pub fn bad_option_fails_only_the_submit(lab: &mut Lab) -> CaseResult {
    let out = output(lab.command("srun").args(["--auto-rdzv=bogus", "true"]))?;
    let (_, err) = text(&out);
    ensure!(!out.status.success(), "srun --auto-rdzv=bogus succeeded");
    ensure!(err.contains("spank-gpu: --auto-rdzv=bogus: unknown word 'bogus'"), "unclear message:\n{err}");

    let out = output(lab.command("sbatch").args(["--auto-rdzv=bogus", "--wrap=true"]))?;
    let (so, err) = text(&out);
    ensure!(!out.status.success(), "sbatch --auto-rdzv=bogus was accepted: {so}");
    ensure!(err.contains("unknown word 'bogus'"), "unclear message:\n{err}");
    all_idle(lab)
}

pub fn forced_panics_in_remote_hooks_are_contained(lab: &mut Lab) -> CaseResult {
    lab.set_plugstack_args(&["debug_panic=user_init+task_init"]).map_err(|e| e.to_string())?;
    let result = (|| {
        let mark = LogMark::new(lab);
        let pids: Vec<_> = lab.nodes.iter().map(|n| lab.slurmd_pid(n)).collect();
        let (so, _) = ok(lab.command("srun").args([
            "-N2",
            "-n2",
            "--auto-rdzv",
            "bash",
            "-c",
            "echo \"ran $(hostname) ${MASTER_ADDR:-unset}\"",
        ]))?;
        // task_init panicked before it could set anything: the hook ran, the task still did.
        ensure!(so.matches("unset").count() == 2, "tasks did not all run past the panic:\n{so}");
        for hook in ["task_init", "user_init"] {
            let line = mark.wait_for(&format!("spank-gpu: {hook}: internal error (panicked at"));
            ensure!(line.is_some(), "no panic line for {hook} in the logs:\n{}", mark.since());
        }
        let job = lab.sbatch("#!/bin/bash\nsrun true\necho done\n", &[]).map_err(|e| e.to_string())?;
        let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        ensure!(state == "COMPLETED", "batch job with panicking hooks ended {state}");
        let now: Vec<_> = lab.nodes.iter().map(|n| lab.slurmd_pid(n)).collect();
        ensure!(pids == now, "slurmd restarted");
        all_idle(lab)
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

pub fn bad_plugstack_argument_is_logged_and_jobs_run(lab: &mut Lab) -> CaseResult {
    for (args, expect) in [
        (["bogus=1"], "plugstack.conf argument 'bogus=1': unknown key 'bogus'"),
        (["auto_rdzv=maybe"], "plugstack.conf argument 'auto_rdzv=maybe': expected on or off"),
    ] {
        lab.set_plugstack_args(&args).map_err(|e| e.to_string())?;
        let result = (|| {
            let mark = LogMark::new(lab);
            let (so, se) = ok(lab.command("srun").args(["-N2", "--auto-rdzv", "hostname"]))?;
            ensure!(so.contains("node1") && so.contains("node2"), "srun output: {so}");
            ensure!(se.contains(expect), "srun does not say what is wrong:\n{se}");
            let line = mark.wait_for(expect);
            ensure!(line.is_some(), "slurmd log lacks '{expect}':\n{}", mark.since());
            // Stays out of the way: even with --auto-rdzv, nothing is set.
            let job = lab
                .sbatch("#!/bin/bash\n#SBATCH --auto-rdzv\necho \"v=${MASTER_ADDR:-unset}\"\n", &[])
                .map_err(|e| e.to_string())?;
            let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            let out = lab.job_output(job);
            ensure!(state == "COMPLETED" && out.contains("v=unset"), "job {job} {state}:\n{out}");
            all_idle(lab)
        })();
        lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
        result?;
    }
    Ok(())
}

/// For each hook the plugin implements, a fault inside it (a forced panic) in
/// every context it runs in: srun (local + the step's slurmstepd), sbatch
/// (allocator + the batch step), salloc (allocator). None may fail a job or
/// drain a node. Then the user errors: they fail the submit, and only it.
pub fn hook_error_matrix(lab: &mut Lab) -> CaseResult {
    let mut table = vec![
        "| hook | command | exit | job | nodes | logged |".to_owned(),
        "|---|---|---|---|---|---|".to_owned(),
    ];
    for hook in ["init", "user_init", "task_init"] {
        lab.set_plugstack_args(&[&format!("debug_panic={hook}")]).map_err(|e| e.to_string())?;
        let result = (|| -> CaseResult {
            let needle = format!("spank-gpu: {hook}: internal error (panicked at");
            // srun: local init, and the step's remote hooks.
            let mark = LogMark::new(lab);
            let out = output(lab.command("srun").args(["-N2", "-n2", "--auto-rdzv", "true"]))?;
            let (_, se) = text(&out);
            let logged = se.contains(&needle) || mark.wait_for(&needle).is_some();
            all_idle(lab)?;
            table.push(format!(
                "| {hook} | srun -N2 -n2 | {} | - | idle | {logged} |",
                out.status.code().unwrap_or(-1)
            ));
            ensure!(out.status.success() && logged, "srun with a panic in {hook}: {}\n{se}", out.status);
            // sbatch: allocator init, and the batch step's remote hooks.
            let mark = LogMark::new(lab);
            let job = lab
                .sbatch("#!/bin/bash\n#SBATCH --auto-rdzv\nsrun true\n", &[])
                .map_err(|e| e.to_string())?;
            let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            let logged = lab.job_output(job).contains(&needle) || mark.wait_for(&needle).is_some();
            all_idle(lab)?;
            table.push(format!("| {hook} | sbatch | 0 | {state} | idle | {logged} |"));
            ensure!(state == "COMPLETED" && logged, "sbatch with a panic in {hook}: {state}");
            // salloc: allocator init.
            let out = output(lab.command("salloc").args(["-N1", "--auto-rdzv", "true"]))?;
            all_idle(lab)?;
            table.push(format!(
                "| {hook} | salloc -N1 true | {} | - | idle | - |",
                out.status.code().unwrap_or(-1)
            ));
            ensure!(out.status.success(), "salloc with a panic in {hook}: {}", text(&out).1);
            Ok(())
        })();
        lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
        result?;
    }
    // User errors: the submit fails, no job is created, nothing else changes.
    let before = ok(lab.command("squeue").args(["-h", "-t", "all", "-o", "%i"]))?.0.lines().count();
    for (cmd, args) in [
        ("srun", vec!["--auto-rdzv=bogus", "true"]),
        ("sbatch", vec!["--gpu-affinity=closest", "--wrap=true"]),
        ("salloc", vec!["--auto-rdzv=port=80", "true"]),
    ] {
        let out = output(lab.command(cmd).args(&args))?;
        let (_, se) = text(&out);
        table.push(format!(
            "| option callback | {cmd} {} | {} | none | idle | user error |",
            args.join(" "),
            out.status.code().unwrap_or(-1)
        ));
        ensure!(
            !out.status.success() && se.contains("spank-gpu: --"),
            "{cmd} {args:?} was not refused clearly:\n{se}"
        );
    }
    let after = ok(lab.command("squeue").args(["-h", "-t", "all", "-o", "%i"]))?.0.lines().count();
    ensure!(before == after, "a refused submit created a job ({before} -> {after})");
    all_idle(lab)?;
    println!("{}", table.join("\n"));
    Ok(())
}

/// A binding that fails in the task (`sched_setaffinity` refusing, made to
/// with the debug build's `debug_fail=set_affinity`) leaves `--auto-rdzv`
/// whole: every task of a 2-node step still gets its rank and rendezvous,
/// the step exits 0, the slurmd log has the one line and, with `verbose`,
/// the task's stderr says the binding was kept.
pub fn a_failed_binding_leaves_the_rendezvous_whole(lab: &mut Lab) -> CaseResult {
    // A table whose binding differs from Slurm's mask (GPU 0's half of the CPUs).
    super::affinity::setup(lab, slurm_lab::agents::GpuLayout::Interleaved)?;
    lab.set_plugstack_args(&["debug_fail=set_affinity"]).map_err(|e| e.to_string())?;
    let result = (|| -> CaseResult {
        let mark = LogMark::new(lab);
        let out = output(lab.command("srun").args([
            "-N2",
            "-n4",
            "--gpus-per-task=1",
            "--auto-rdzv",
            "--gpu-affinity=verbose",
            "-l",
            "bash",
            "-c",
            "echo \"vars RANK=$RANK WORLD_SIZE=$WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT\"",
        ]))?;
        let (so, se) = text(&out);
        ensure!(out.status.success(), "the step failed ({}):\n{so}{se}", out.status);
        let mut ranks: Vec<String> = so
            .lines()
            .filter_map(|l| l.split_once("vars ").map(|(_, v)| v.to_owned()))
            .filter(|v| !v.contains("RANK= ") && !v.contains("MASTER_ADDR= ") && !v.ends_with("MASTER_PORT="))
            .filter_map(|v| v.split_whitespace().next().map(str::to_owned))
            .collect();
        ranks.sort();
        ensure!(
            ranks == ["RANK=0", "RANK=1", "RANK=2", "RANK=3"],
            "not every task got its rendezvous:\n{so}{se}"
        );
        ensure!(so.contains("WORLD_SIZE=4 MASTER_ADDR=node1 MASTER_PORT="), "{so}");
        let told = se
            .lines()
            .filter(|l| l.contains("spank-gpu: gpu-affinity:") && l.contains("Slurm's binding kept"))
            .count();
        ensure!(told == 4, "{told} of 4 tasks were told the binding failed:\n{se}");
        let line = mark.wait_for("--gpu-affinity: binding to CPUs");
        ensure!(
            line.as_deref()
                .is_some_and(|l| l.contains("debug_fail=set_affinity")
                    && l.contains("this task keeps Slurm's binding")),
            "no log line for the failed binding:\n{}",
            mark.since()
        );
        println!("  logged: {}", line.unwrap_or_default().trim());
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    for node in lab.nodes.clone() {
        let _ = std::fs::remove_file(lab.node_topology_dir(&node).join("gpus.tsv"));
    }
    result
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
            let logged = || mark.since().lines().filter(|l| l.contains(needle)).count();
            wait_until("the three slurmstepds' log lines", Duration::from_secs(5), || Ok(logged() >= 3))?;
            let logged = logged();
            // The batch step's slurmstepd and the step's two.
            ensure!(logged == 3, "{logged} log lines for 3 slurmstepds:\n{}", mark.since());
        }
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

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
