//! Apptainer (issue 29): `srun --auto-rdzv apptainer exec IMG.sif ...` on the
//! lab whose root carries Apptainer (Debian sid's, Slurm 26.05; see
//! `slurm_lab::apptainer`). The jobs run as root, so each `apptainer exec`
//! carries `--no-privs` (this machine's root lacks `CAP_SYS_RESOURCE`).
//!
//! By default Apptainer passes the task's environment and CPU mask into the
//! container, so the plugin's values hold there with no glue. `--cleanenv` and
//! `--containall` pass only `APPTAINERENV_*`: when apptainer is the step's own
//! command, the plugin sets its names with that prefix too
//! (`task_plan::apptainer`); inside a wrapper script it cannot see the flag.

use std::fmt::Write as _;
use std::process::Command;

use slurm_lab::Lab;
use slurm_lab::agents::write_topology;

use super::containers::{MEET, SHOW, Seen, parse_tasks, plugins_port, verdict};
use super::{CaseResult, ok};

/// The TCP rendezvous of the container cases, without `SLURM_*` (which
/// `--cleanenv` drops): one step at a time runs it here.
fn meet() -> String {
    let old = r#"os.environ["SLURM_JOB_ID"] + "." + os.environ["SLURM_STEP_ID"]"#;
    assert!(MEET.contains(old), "MEET changed: update apptainer::meet");
    MEET.replace(old, r#""apptainer""#)
}

/// `srun ARGS apptainer exec --no-privs [MODE] SIF PROGRAM...`.
fn srun_apptainer(lab: &Lab, srun_args: &[&str], mode: &[&str], sif: &str, program: &[&str]) -> Command {
    let mut cmd = lab.command("srun");
    cmd.args(srun_args).args(["apptainer", "exec", "--no-privs"]).args(mode).arg(sif).args(program);
    cmd
}

fn by_rank(mut tasks: Vec<Seen>) -> Vec<Seen> {
    tasks.sort_by_key(|t| t.get("RANK").parse::<u32>().unwrap_or(u32::MAX));
    tasks
}

/// A 2-node, 4-task rendezvous meets on the plugin's port through
/// `apptainer exec` with the environment as it is, with `--cleanenv` and with
/// `--containall`.
pub fn apptainer_rendezvous_meets_with_no_glue(lab: &mut Lab) -> CaseResult {
    let sif = lab.apptainer_image().map_err(|e| e.to_string())?.display().to_string();
    let meet = meet();
    let mut report = String::new();
    let mut faults = Vec::new();
    for mode in [&[][..], &["--cleanenv"], &["--containall"]] {
        let name = mode.first().copied().unwrap_or("(default)");
        let cmd = &mut srun_apptainer(
            lab,
            &["-N2", "--ntasks-per-node=2", "--auto-rdzv=verbose"],
            mode,
            &sif,
            &["python3", "-c", &meet],
        );
        match ok(cmd) {
            Ok((so, se)) => {
                let port = plugins_port(&se);
                let met = so.lines().find(|l| l.starts_with("MET ")).unwrap_or("");
                let _ = writeln!(report, "{name}: {met} (the plugin's port: {port:?})");
                let want = format!("port={} ranks=[0, 1, 2, 3]", port.as_deref().unwrap_or("?"));
                if !met.contains(&want) {
                    faults.push(format!("{name}: met '{met}', want '{want}'\n{se}"));
                }
            }
            Err(e) => faults.push(format!("{name}: {e}")),
        }
    }
    println!("{report}");
    if faults.is_empty() { Ok(()) } else { Err(faults.join("\n")) }
}

/// Under `--cleanenv` each task sees the plugin's values (and not Slurm's
/// own variables, which shows the environment was cleaned), is bound to its
/// GPUs' CPUs, and a user's own exported `MASTER_PORT` still wins; inside a
/// wrapper script the plugin cannot see the flag, and nothing reaches the
/// container (what docs/users.md says to add there).
pub fn apptainer_cleanenv_gets_the_plugins_values_and_the_binding(lab: &mut Lab) -> CaseResult {
    for node in lab.nodes.clone() {
        write_topology(lab, &node)?;
    }
    let sif = lab.apptainer_image().map_err(|e| e.to_string())?.display().to_string();
    let shape =
        ["-N2", "--ntasks-per-node=1", "--gpus-per-task=4", "--auto-rdzv=verbose", "--gpu-affinity=verbose"];
    let (so, se) = ok(&mut srun_apptainer(lab, &shape, &["--cleanenv"], &sif, &["python3", "-c", SHOW]))?;
    let tasks = by_rank(parse_tasks(&so));
    let port = plugins_port(&se).ok_or_else(|| format!("no verbose line with the plugin's port:\n{se}"))?;
    ensure!(tasks.len() == 2, "2 tasks should answer:\n{so}\n{se}");
    for t in &tasks {
        println!(
            "--cleanenv {}: MASTER_ADDR={} MASTER_PORT={} (the plugin's {port}) RANK={} WORLD_SIZE={} \
             PET_NODE_RANK={} SLURM_PROCID={} CPUs {}",
            t.host,
            t.get("MASTER_ADDR"),
            t.get("MASTER_PORT"),
            t.get("RANK"),
            t.get("WORLD_SIZE"),
            t.get("PET_NODE_RANK"),
            t.get("SLURM_PROCID"),
            t.cpus
        );
    }
    ensure!(
        se.contains("through apptainer --cleanenv as APPTAINERENV_*: MASTER_ADDR MASTER_PORT"),
        "verbose does not say the names went through APPTAINERENV_*:\n{se}"
    );
    for (i, t) in tasks.iter().enumerate() {
        let want_cpus = if t.host == "node1" { "0" } else { "1" };
        ensure!(
            t.get("MASTER_ADDR") == "node1"
                && t.get("MASTER_PORT") == port
                && t.get("RANK") == i.to_string()
                && t.get("WORLD_SIZE") == "2"
                && t.get("PET_NNODES") == "2"
                && t.get("PET_NODE_RANK") == i.to_string()
                && t.get("SLURM_PROCID") == "-"
                && t.cpus == want_cpus,
            "task {i} on {} saw {:?} on CPUs {} (want the plugin's port {port}, no SLURM_PROCID, CPUs {want_cpus}):\n{se}",
            t.host,
            t.env,
            t.cpus
        );
    }
    // The user's own port, exported before srun, wins inside too.
    let (so, se) = ok(srun_apptainer(
        lab,
        &["-N1", "-n2", "--auto-rdzv=verbose"],
        &["-e"],
        &sif,
        &["python3", "-c", SHOW],
    )
    .env("MASTER_PORT", "23456"))?;
    let ports: Vec<String> = parse_tasks(&so).iter().map(|t| t.get("MASTER_PORT").to_owned()).collect();
    println!("-e with the user's MASTER_PORT=23456: {ports:?}, verbose: {}", verdict(&se, "MASTER_PORT"));
    ensure!(
        ports == ["23456", "23456"] && verdict(&se, "MASTER_PORT").contains("set by you"),
        "the user's MASTER_PORT under -e: {ports:?}, verbose {}:\n{se}",
        verdict(&se, "MASTER_PORT")
    );
    // Through a wrapper script the flag is not seen: nothing reaches the container.
    let show = lab.dir.join("apptainer/show.py");
    std::fs::write(&show, SHOW).map_err(|e| e.to_string())?;
    let script = format!("apptainer exec --no-privs --cleanenv {sif} python3 {}", show.display());
    let (so, se) = ok(lab.command("srun").args(["-N1", "-n1", "--auto-rdzv", "bash", "-c", &script]))?;
    let tasks = parse_tasks(&so);
    println!(
        "--cleanenv in a wrapper script: MASTER_PORT={}",
        tasks.first().map_or("(no task)", |t| t.get("MASTER_PORT"))
    );
    ensure!(
        tasks.len() == 1 && tasks[0].get("MASTER_PORT") == "-" && tasks[0].get("MASTER_ADDR") == "-",
        "apptainer --cleanenv in a wrapper script: the task saw {:?} (docs/users.md says nothing reaches it)\n{se}",
        tasks.first().map(|t| &t.env)
    );
    Ok(())
}
