//! Containers (issue 29): `srun --container-image=IMG --auto-rdzv` through
//! pyxis and enroot (built from `../shared/third-party`, see
//! `slurm_lab::containers`), with spank_gpu before or after pyxis in
//! `plugstack.conf`, enroot's `50-slurm-pytorch.sh` hook on or off, and a
//! plain or a "PyTorch" image (one whose environment has `PYTORCH_VERSION`).
//!
//! These cases run on a lab of their own (task/none, with containers); where
//! the third-party tarballs are absent they are reported as not run, by name.
//! Every job runs as root, so each command carries `ENROOT_ALLOW_SUPERUSER=y`
//! (pyxis reads it from the job's environment).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

use slurm_lab::Lab;
use slurm_lab::agents::write_topology;
use slurm_lab::containers::Order;

use super::{CaseResult, ok, run_batch};

/// Prints one JSON line per task: host, the rendezvous variables, PET_*, its CPUs.
pub(crate) const SHOW: &str = r#"import json, os
env = {k: v for k, v in os.environ.items()
       if k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "OMP_NUM_THREADS",
                "SLURM_PROCID", "PYTORCH_VERSION") or k.startswith("PET_")}
cpus = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Cpus_allowed_list")][0]
print("TASK " + json.dumps({"host": os.uname()[1], "env": env, "cpus": cpus}), flush=True)
"#;

/// A TCP rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT until every other
/// rank of its own step has connected (a rank of another step counts as a failure);
/// the others connect and send `STEP RANK`. Rank 0 holds its port 3 s after, so
/// concurrent steps overlap.
pub(crate) const MEET: &str = r#"import os, socket, sys, time
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
step = os.environ["SLURM_JOB_ID"] + "." + os.environ["SLURM_STEP_ID"]
if rank == 0:
    s = socket.socket()
    try:
        s.bind(("", port))
    except OSError as e:
        sys.exit("rank 0 of %s: bind %d: %s" % (step, port, e))
    s.listen(16)
    s.settimeout(60)
    got = []
    while len(got) < world - 1:
        c, _ = s.accept()
        who, r = c.recv(64).decode().split()
        c.close()
        if who != step:
            sys.exit("rank 0 of %s on port %d: rank %s of step %s came" % (step, port, r, who))
        got.append(int(r))
    print("MET %s port=%d ranks=%s" % (step, port, sorted(got + [0])), flush=True)
    time.sleep(3)
else:
    for _ in range(300):
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("rank %d of %s: no rank 0 at %s:%d" % (rank, step, addr, port))
    c.send(("%s %d" % (step, rank)).encode())
    c.close()
"#;

/// One task's view.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) host: String,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cpus: String,
}

impl Seen {
    pub(crate) fn get(&self, k: &str) -> &str {
        self.env.get(k).map_or("-", String::as_str)
    }
}

pub(crate) fn parse_tasks(stdout: &str) -> Vec<Seen> {
    let mut tasks: Vec<Seen> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("TASK "))
        .filter_map(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        .map(|v| Seen {
            host: v["host"].as_str().unwrap_or("").to_owned(),
            env: v["env"]
                .as_object()
                .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned())).collect())
                .unwrap_or_default(),
            cpus: v["cpus"].as_str().unwrap_or("").to_owned(),
        })
        .collect();
    tasks.sort_by_key(|t| t.get("SLURM_PROCID").parse::<u32>().unwrap_or(u32::MAX));
    tasks
}

/// The plugin's own port from task 0's verbose line: `MASTER_PORT=N (why)` when it
/// set it, `MASTER_PORT=V (set by ...; mine: N)` when it kept another.
pub(crate) fn plugins_port(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.contains("spank-gpu: task 0 "))?;
    let part = line.split(" MASTER_PORT=").nth(1)?;
    let head = part.split(')').next().unwrap_or("");
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    let port = match head.split("mine: ").nth(1) {
        Some(mine) => digits(mine),
        None => digits(part),
    };
    (!port.is_empty()).then_some(port)
}

/// What the verbose line of task 0 says about a name: `set`, `kept(WHO)`, or `-`.
pub(crate) fn verdict(stderr: &str, name: &str) -> String {
    let Some(line) = stderr.lines().find(|l| l.contains("spank-gpu: task 0 ")) else { return "-".to_owned() };
    let (set, kept) = line.split_once("; kept ").unwrap_or((line, ""));
    let key = format!(" {name}=");
    if set.contains(&key) {
        return "set".to_owned();
    }
    if let Some(rest) = format!(" {kept}").split(&key).nth(1) {
        let who = rest.split('(').nth(1).and_then(|r| r.split([';', ')']).next()).unwrap_or("?");
        return format!("kept({})", who.trim());
    }
    "-".to_owned()
}

/// `srun` with containers: root's superuser flag in the job's environment.
fn srun(lab: &Lab) -> Command {
    let mut cmd = lab.command("srun");
    cmd.env("ENROOT_ALLOW_SUPERUSER", "y");
    cmd
}

/// One row of the table: what both shapes of step saw in one combination.
struct Row {
    order: Order,
    hook: bool,
    pytorch: bool,
    /// `-N1 -n2 -c3 --gpus-per-task=1`: ranks on one node, OMP_NUM_THREADS (the plugin's: 3).
    one_node: Vec<Seen>,
    one_node_err: String,
    /// `-N2 --ntasks-per-node=1 --gpus-per-task=4 --gpu-affinity`: PET_*, the binding.
    two_nodes: Vec<Seen>,
    two_nodes_err: String,
}

impl Row {
    /// What is wrong in what the tasks saw, against the plugin's values.
    fn faults(&self) -> Vec<String> {
        let mut f = Vec::new();
        for (shape, tasks, stderr, n) in [
            ("-N1 -n2", &self.one_node, &self.one_node_err, 2),
            ("-N2 -n2", &self.two_nodes, &self.two_nodes_err, 2),
        ] {
            if tasks.len() != n {
                f.push(format!("{shape}: {} tasks answered", tasks.len()));
                continue;
            }
            let port = plugins_port(stderr);
            for (i, t) in tasks.iter().enumerate() {
                let want_port = port.as_deref().unwrap_or("?");
                if t.get("MASTER_PORT") != want_port {
                    f.push(format!(
                        "{shape} task {i}: MASTER_PORT={} (the plugin's: {want_port})",
                        t.get("MASTER_PORT")
                    ));
                }
                if t.get("RANK") != i.to_string() || t.get("WORLD_SIZE") != "2" {
                    f.push(format!(
                        "{shape} task {i}: RANK={} WORLD_SIZE={}",
                        t.get("RANK"),
                        t.get("WORLD_SIZE")
                    ));
                }
                if t.get("MASTER_ADDR") != tasks[0].host {
                    f.push(format!("{shape} task {i}: MASTER_ADDR={}", t.get("MASTER_ADDR")));
                }
            }
            for name in ["MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK", "OMP_NUM_THREADS"] {
                let v = verdict(stderr, name);
                if v.contains("set by you") {
                    f.push(format!("{shape}: verbose says {name} {v}"));
                }
            }
        }
        for (i, t) in self.one_node.iter().enumerate() {
            if t.get("LOCAL_RANK") != i.to_string() {
                f.push(format!("-N1 -n2 task {i}: LOCAL_RANK={}", t.get("LOCAL_RANK")));
            }
            if t.get("OMP_NUM_THREADS") != "3" {
                f.push(format!(
                    "-N1 -n2 task {i}: OMP_NUM_THREADS={} (the plugin's: 3)",
                    t.get("OMP_NUM_THREADS")
                ));
            }
        }
        // node1's GPUs 0-3 are CPU 0's, node2's (gres.conf lists minors 4-7 first) CPU 1's.
        for (i, t) in self.two_nodes.iter().enumerate() {
            if t.get("PET_NNODES") != "2" || t.get("PET_NODE_RANK") != i.to_string() {
                f.push(format!(
                    "-N2 task {i}: PET_NNODES={} PET_NODE_RANK={}",
                    t.get("PET_NNODES"),
                    t.get("PET_NODE_RANK")
                ));
            }
            let want = if t.host == "node1" { "0" } else { "1" };
            if t.cpus != want {
                f.push(format!("-N2 task {i} on {}: CPUs {} (its GPUs' CPU: {want})", t.host, t.cpus));
            }
        }
        f
    }

    fn line(&self) -> String {
        let a = |i: usize| self.one_node.get(i);
        let b = |i: usize| self.two_nodes.get(i);
        let both = |f: &dyn Fn(&Seen) -> String, v: &[Seen]| v.iter().map(f).collect::<Vec<_>>().join(",");
        let port = plugins_port(&self.one_node_err).unwrap_or_else(|| "?".to_owned());
        format!(
            "{:<9} {:<4} {:<7} | {:<6} {:>5}/{:<5} {:>2} {:<5} {:<5} {:<5} | {:<10} {:<5} {:<7} | {:<14} {:<14} | {}",
            self.order.name(),
            if self.hook { "on" } else { "off" },
            if self.pytorch { "pytorch" } else { "plain" },
            a(0).map_or("-", |t| t.get("MASTER_ADDR")),
            a(0).map_or("-", |t| t.get("MASTER_PORT")),
            port,
            a(0).map_or("-", |t| t.get("WORLD_SIZE")),
            both(&|t| t.get("RANK").to_owned(), &self.one_node),
            both(&|t| t.get("LOCAL_RANK").to_owned(), &self.one_node),
            both(&|t| t.get("OMP_NUM_THREADS").to_owned(), &self.one_node),
            b(0).map_or("-".to_owned(), |t| format!(
                "{}:{}",
                t.get("PET_MASTER_ADDR"),
                t.get("PET_MASTER_PORT")
            )),
            both(&|t| t.get("PET_NODE_RANK").to_owned(), &self.two_nodes),
            both(&|t| t.cpus.clone(), &self.two_nodes),
            format!("PORT {}", verdict(&self.one_node_err, "MASTER_PORT")),
            format!("RANK {}", verdict(&self.one_node_err, "RANK")),
            if self.faults().is_empty() {
                "ok".to_owned()
            } else {
                format!("{} faults", self.faults().len())
            },
        )
    }
}

const HEADER: &str = "order     hook image   | ADDR   PORT/plugin's WS RANK  LRANK OMP   | PET_MASTER PET_N cpus    | verbose PORT   verbose RANK   | verdict";

fn observe(lab: &mut Lab, order: Order, hook: bool, pytorch: bool) -> Result<Row, String> {
    lab.set_container_order(order, &[]).map_err(|e| e.to_string())?;
    lab.set_pytorch_hook(hook).map_err(|e| e.to_string())?;
    let c = lab.containers().ok_or("the lab has no containers")?;
    let image = if pytorch { &c.tools.images.pytorch } else { &c.tools.images.plain };
    let image = format!("--container-image={}", image.display());
    let (so, se) = ok(srun(lab).args([
        "-N1",
        "-n2",
        "-c3",
        "--gpus-per-task=1",
        "--auto-rdzv=verbose",
        &image,
        "python3",
        "-c",
        SHOW,
    ]))?;
    let (so2, se2) = ok(srun(lab).args([
        "-N2",
        "--ntasks-per-node=1",
        "--gpus-per-task=4",
        "--auto-rdzv=verbose",
        "--gpu-affinity=verbose",
        &image,
        "python3",
        "-c",
        SHOW,
    ]))?;
    Ok(Row {
        order,
        hook,
        pytorch,
        one_node: parse_tasks(&so),
        one_node_err: se,
        two_nodes: parse_tasks(&so2),
        two_nodes_err: se2,
    })
}

fn topology(lab: &Lab) -> CaseResult {
    for node in lab.nodes.clone() {
        write_topology(lab, &node)?;
    }
    Ok(())
}

/// Every combination of plugstack order x hook x image: the table of what the
/// process saw, and each combination's faults against the plugin's values.
/// In both orders every combination gets the plugin's values: with pyxis
/// first (the order the package installs) the plugin replans after pyxis's
/// import; with spank_gpu first (issue 46) its `PYXIS_CONTAINER_ENV` makes
/// pyxis keep them, and verbose says so.
pub fn container_env_in_every_combination(lab: &mut Lab) -> CaseResult {
    topology(lab)?;
    let mut table = format!("\n{HEADER}\n");
    let mut faults = Vec::new();
    for order in Order::ALL {
        for hook in [false, true] {
            for pytorch in [false, true] {
                let row = observe(lab, order, hook, pytorch)?;
                let _ = writeln!(table, "{}", row.line());
                // spank_gpu before pyxis: verbose says pyxis runs after it, and (issue 46) that
                // its PYXIS_CONTAINER_ENV keeps the plugin's values through pyxis's import;
                // with pyxis first it says neither.
                let warned = "pyxis runs after spank-gpu here (plugstack.conf lists spank_gpu first)";
                let kept = format!(
                    "{warned}: spank-gpu set PYXIS_CONTAINER_ENV, so pyxis's import keeps its values"
                );
                let said_in = |text: &str| {
                    if order == Order::GpuFirst { text.contains(&kept) } else { !text.contains(warned) }
                };
                if !(said_in(&row.one_node_err) && said_in(&row.two_nodes_err)) {
                    faults.push(format!(
                        "{}: verbose does not say what pyxis does after it ({}):\n{}",
                        row.line(),
                        if order == Order::GpuFirst {
                            "it keeps the values"
                        } else {
                            "nothing: it runs first"
                        },
                        row.one_node_err
                    ));
                }
                // Who set what the plugin replaced, in its verbose line (pyxis first).
                let said = &row.one_node_err;
                if order == Order::PyxisFirst
                    && pytorch
                    && !said.contains(" RANK=0 (pyxis for a PyTorch image)")
                {
                    faults.push(format!("{}: verbose does not name pyxis's RANK:\n{said}", row.line()));
                }
                // The hook's MASTER_ADDR is the one user_init already set before the fork
                // (the first node): no replacement. Its MASTER_PORT differs from the plugin's.
                if order == Order::PyxisFirst
                    && pytorch
                    && hook
                    && !(said.contains("(enroot's PyTorch hook)")
                        && said.contains("replaced MASTER_PORT=61")
                        && !said.contains("replaced MASTER_ADDR="))
                {
                    faults.push(format!("{}: verbose does not name the hook's values:\n{said}", row.line()));
                }
                for f in row.faults() {
                    faults.push(format!(
                        "{} hook {} {}: {f}",
                        order.name(),
                        if hook { "on" } else { "off" },
                        if pytorch { "pytorch" } else { "plain" }
                    ));
                }
                if std::env::var_os("SLURM_LAB_CONTAINER_VERBOSE").is_some() {
                    let _ = writeln!(
                        table,
                        "    {}\n    {}",
                        row.one_node_err.trim().replace('\n', "\n    "),
                        row.two_nodes_err.trim().replace('\n', "\n    ")
                    );
                }
            }
        }
    }
    println!("{table}");
    if faults.is_empty() {
        Ok(())
    } else {
        Err(format!("the tasks did not get the plugin's values:\n{}", faults.join("\n")))
    }
}

/// The sbatch script of two concurrent 2-task steps on one node, each a TCP rendezvous.
fn two_steps_script(lab: &Lab) -> Result<String, String> {
    let c = lab.containers().ok_or("the lab has no containers")?;
    let image = c.tools.images.pytorch.display().to_string();
    let py = MEET.replace('\'', "'\\''");
    Ok(format!(
        "#!/bin/bash\n#SBATCH -N1\n#SBATCH -n4\n#SBATCH -w node1\nexport ENROOT_ALLOW_SUPERUSER=y\n\
         srun -n2 --exact --auto-rdzv=verbose --container-image={image} python3 -c '{py}' &\n\
         srun -n2 --exact --auto-rdzv=verbose --container-image={image} python3 -c '{py}' &\n\
         wait\n"
    ))
}

/// Two concurrent steps of one job on one node, with the PyTorch image and the
/// hook on (the hook gives every step of a job one port): in both plugstack
/// orders, distinct ports and both rendezvous meet.
pub fn container_concurrent_steps_get_distinct_ports(lab: &mut Lab) -> CaseResult {
    lab.set_pytorch_hook(true).map_err(|e| e.to_string())?;
    let mut report = String::new();
    let mut faults = Vec::new();
    for order in Order::ALL {
        lab.set_container_order(order, &[]).map_err(|e| e.to_string())?;
        let script = two_steps_script(lab)?;
        let out = run_batch(lab, &script);
        let text = out.as_ref().map_or_else(|e| e.clone(), Clone::clone);
        let met: Vec<&str> = text.lines().filter(|l| l.starts_with("MET ")).collect();
        let ports: Vec<&str> =
            met.iter().filter_map(|l| l.split("port=").nth(1)?.split_whitespace().next()).collect();
        let _ = writeln!(report, "{}: {} rendezvous met, ports {ports:?}", order.name(), met.len());
        // In both orders (spank_gpu first: its PYXIS_CONTAINER_ENV, issue 46).
        if out.is_err() || met.len() != 2 || ports.first() == ports.get(1) {
            faults.push(format!("{}: {}", order.name(), text.trim()));
        }
    }
    lab.set_pytorch_hook(false).map_err(|e| e.to_string())?;
    println!("{report}");
    if faults.is_empty() { Ok(()) } else { Err(faults.join("\n")) }
}

/// A 2-node, 4-task rendezvous through the PyTorch image with the hook on meets
/// on the plugin's port in both plugstack orders.
pub fn container_two_node_rendezvous_on_the_plugins_port(lab: &mut Lab) -> CaseResult {
    lab.set_pytorch_hook(true).map_err(|e| e.to_string())?;
    let image = lab.containers().ok_or("no containers")?.tools.images.pytorch.display().to_string();
    let mut faults = Vec::new();
    for order in Order::ALL {
        lab.set_container_order(order, &[]).map_err(|e| e.to_string())?;
        let out = output_of(srun(lab).args([
            "-N2",
            "--ntasks-per-node=2",
            "--auto-rdzv=verbose",
            &format!("--container-image={image}"),
            "python3",
            "-c",
            MEET,
        ]));
        let (so, se) = match out {
            Ok(x) => x,
            Err(e) => {
                faults.push(format!("{}: {e}", order.name()));
                continue;
            }
        };
        let port = plugins_port(&se);
        let met = so.lines().find(|l| l.starts_with("MET ")).unwrap_or("");
        println!("{}: {met} (the plugin's port: {})", order.name(), port.as_deref().unwrap_or("?"));
        let on_plugins_port =
            port.is_some() && met.contains(&format!("port={} ", port.as_deref().unwrap_or("")));
        if !on_plugins_port {
            faults.push(format!("{}: met '{met}', the plugin's port {port:?}\n{se}", order.name()));
        }
    }
    lab.set_pytorch_hook(false).map_err(|e| e.to_string())?;
    if faults.is_empty() { Ok(()) } else { Err(faults.join("\n")) }
}

fn output_of(cmd: &mut Command) -> Result<(String, String), String> {
    ok(cmd)
}

/// `--container-env=MASTER_PORT` with the user's own exported MASTER_PORT: the
/// user's port wins in both orders (hook on, PyTorch image), and verbose says so.
pub fn container_user_port_wins_with_container_env(lab: &mut Lab) -> CaseResult {
    lab.set_pytorch_hook(true).map_err(|e| e.to_string())?;
    let image = lab.containers().ok_or("no containers")?.tools.images.pytorch.display().to_string();
    let mut faults = Vec::new();
    for order in Order::ALL {
        lab.set_container_order(order, &[]).map_err(|e| e.to_string())?;
        let (so, se) = ok(srun(lab).env("MASTER_PORT", "23456").args([
            "-N1",
            "-n2",
            "--auto-rdzv=verbose",
            "--container-env=MASTER_PORT",
            &format!("--container-image={image}"),
            "python3",
            "-c",
            SHOW,
        ]))?;
        let tasks = parse_tasks(&so);
        let ports: Vec<&str> = tasks.iter().map(|t| t.get("MASTER_PORT")).collect();
        let said = verdict(&se, "MASTER_PORT");
        println!("{}: MASTER_PORT {ports:?}, verbose: {said}", order.name());
        if ports != ["23456", "23456"] || !said.contains("set by you") {
            faults.push(format!("{}: ports {ports:?}, verbose {said}\n{se}", order.name()));
        }
    }
    lab.set_pytorch_hook(false).map_err(|e| e.to_string())?;
    if faults.is_empty() { Ok(()) } else { Err(faults.join("\n")) }
}

/// `#SBATCH --container-image` with `#SBATCH --auto-rdzv`: pyxis runs the
/// batch script itself in the PyTorch image (hook on); in both plugstack
/// orders the script sees the plugin's `MASTER_ADDR` and the port the job's
/// first srun gets, not the hook's.
pub fn container_batch_step_in_the_image(lab: &mut Lab) -> CaseResult {
    lab.set_pytorch_hook(true).map_err(|e| e.to_string())?;
    let image = lab.containers().ok_or("no containers")?.tools.images.pytorch.display().to_string();
    let py = SHOW.replace('\'', "'\\''");
    let script = format!(
        "#!/bin/bash\n#SBATCH -N1\n#SBATCH -n2\n#SBATCH -c3\n#SBATCH -w node1\n#SBATCH --auto-rdzv=verbose\n\
         #SBATCH --container-image={image}\npython3 -c '{py}'\n"
    );
    let mut faults = Vec::new();
    for order in Order::ALL {
        lab.set_container_order(order, &[]).map_err(|e| e.to_string())?;
        let job =
            lab.sbatch(&script, &["--export=ALL,ENROOT_ALLOW_SUPERUSER=y"]).map_err(|e| e.to_string())?;
        let state = lab.wait_job(job, std::time::Duration::from_secs(90)).map_err(|e| e.to_string())?;
        let out = lab.job_output(job);
        let task = parse_tasks(&out).into_iter().next();
        let port = plugins_port(&out);
        let seen = task.as_ref().map_or("-".to_owned(), |t| {
            format!(
                "MASTER_ADDR={} MASTER_PORT={} OMP_NUM_THREADS={} WORLD_SIZE={}",
                t.get("MASTER_ADDR"),
                t.get("MASTER_PORT"),
                t.get("OMP_NUM_THREADS"),
                t.get("WORLD_SIZE")
            )
        });
        println!("{}: job {job} {state}: {seen} (the plugin's port: {port:?})", order.name());
        let right = state == "COMPLETED"
            && task.as_ref().is_some_and(|t| {
                t.get("MASTER_ADDR") == "node1"
                    && port.as_deref() == Some(t.get("MASTER_PORT"))
                    && !t.get("MASTER_PORT").starts_with("61")
                    && t.get("OMP_NUM_THREADS") != "1"
            });
        if !right {
            faults.push(format!(
                "{}: job {job} {state}: {seen}, the plugin's port {port:?}\n{out}",
                order.name()
            ));
        }
    }
    lab.set_pytorch_hook(false).map_err(|e| e.to_string())?;
    if faults.is_empty() { Ok(()) } else { Err(faults.join("\n")) }
}

/// `--gpu-affinity` under ConstrainDevices with pyxis first: pyxis's
/// `task_init` has moved the task into the container's mount namespace, where
/// the device files are not (the lab's are under its own directory, which the
/// container's `/tmp` hides, as `ENROOT_RESTRICT_DEV` hides a real node's
/// other GPUs); the plugin asks through the device directory it opened before
/// the fork. Two tasks of `--gpus-per-task=4` on node1, whose GPUs 0-3 are
/// CPU 0's and 4-7 CPU 1's, each see `CUDA_VISIBLE_DEVICES=0,1,2,3`; only the
/// device cgroup says that task 1 has GPUs 4-7. With `debug_fail=open_dev_dir`
/// the plugin has only the path, and the case shows what that gets.
pub fn container_gpu_affinity_under_constrain_devices(lab: &mut Lab) -> CaseResult {
    topology(lab)?;
    let image = lab.containers().ok_or("no containers")?.tools.images.plain.display().to_string();
    let image = format!("--container-image={image}");
    let shape =
        ["-N1", "-w", "node1", "-n2", "--gpus-per-task=4", "--gpu-affinity=verbose", "--auto-rdzv", &image];
    let cpus = |lab: &Lab| -> Result<(Vec<String>, String), String> {
        let (so, se) = ok(srun(lab).args(shape).args(["python3", "-c", SHOW]))?;
        let mut tasks = parse_tasks(&so);
        tasks.sort_by_key(|t| t.get("RANK").parse::<u32>().unwrap_or(u32::MAX));
        Ok((tasks.iter().map(|t| t.cpus.clone()).collect(), se))
    };
    lab.set_container_order(Order::PyxisFirst, &[]).map_err(|e| e.to_string())?;
    let (got, se) = cpus(lab)?;
    lab.set_container_order(Order::PyxisFirst, &["debug_fail=open_dev_dir"]).map_err(|e| e.to_string())?;
    let by_path = cpus(lab);
    lab.set_container_order(Order::PyxisFirst, &[]).map_err(|e| e.to_string())?;
    println!(
        "through the device directory: CPUs {got:?}; by path only: {:?}",
        by_path.as_ref().map(|x| &x.0)
    );
    if std::env::var_os("SLURM_LAB_CONTAINER_VERBOSE").is_some() {
        println!("{se}\n{}", by_path.as_ref().map_or_else(Clone::clone, |x| x.1.clone()));
    }
    // The GPUs each task's verbose line names (Slurm's own binding on this 2-CPU
    // lab is CPU 0 and CPU 1 as well, so the CPUs alone cannot tell).
    let names = |text: &str, task: u32, first_gpu: u32| {
        text.lines().any(|l| {
            l.contains(&format!("gpu-affinity: task {task} (local {task}): GPUs {first_gpu} ("))
                && l.contains("[device cgroup]")
        })
    };
    ensure!(
        got == ["0", "1"] && names(&se, 0, 0) && names(&se, 1, 4),
        "tasks 0 and 1 (GPUs 0-3, 4-7 by their device cgroups) bound to CPUs {got:?}, want [\"0\", \"1\"], \
         with the GPUs named from the device cgroup:\n{se}"
    );
    // From 23.11 Slurm's variables no longer say which GPUs task 1 has: by path (inside
    // the container) the plugin cannot tell, which is what the directory is for.
    if lab.slurm_at_least(23, 11) {
        let (_, by_path) = by_path?;
        ensure!(
            !names(&by_path, 1, 4),
            "with debug_fail=open_dev_dir task 1 still found its GPUs through the device cgroup: \
             the case no longer shows the directory matters:\n{by_path}"
        );
    }
    Ok(())
}

/// `spank-gpu explain` on what a task in a container really has (PyTorch
/// image, hook on): inside the container (the binary mounted in with
/// `--container-mounts`) and from the task's environment written to a file
/// (`explain --env`, on the host). In both orders both show the plugin's
/// port as set by spank-gpu (spank_gpu first: through its
/// `PYXIS_CONTAINER_ENV`); with spank_gpu first and the user's own
/// `--container-env=HOME`, which replaces that list, the hook's port, with
/// the hook, never the user, named as who set it.
pub fn container_explain_tells_who_set_each_value(lab: &mut Lab) -> CaseResult {
    lab.set_pytorch_hook(true).map_err(|e| e.to_string())?;
    let result = explain_in_both_orders(lab);
    lab.set_pytorch_hook(false).map_err(|e| e.to_string())?;
    result
}

fn explain_in_both_orders(lab: &mut Lab) -> CaseResult {
    let image = lab.containers().ok_or("no containers")?.tools.images.pytorch.display().to_string();
    let explain = slurm_lab::profile_dir().join("spank-gpu");
    let mounts = format!("--container-mounts={}:/usr/local/bin/spank-gpu:ro", explain.display());
    let image = format!("--container-image={image}");
    let shape = ["-N1", "-n1", "-c3", "--gpus-per-task=1", "--auto-rdzv=verbose", &image];
    for (order, own_list) in
        [(Order::PyxisFirst, None), (Order::GpuFirst, None), (Order::GpuFirst, Some("--container-env=HOME"))]
    {
        lab.set_container_order(order, &[]).map_err(|e| e.to_string())?;
        let shape: Vec<&str> = shape.iter().copied().chain(own_list).collect();
        // Inside the container.
        let (inside, se) = ok(srun(lab).args(&shape).arg(&mounts).args(["spank-gpu", "explain"]))?;
        let port = plugins_port(&se).ok_or_else(|| format!("no verbose port:\n{se}"))?;
        // From the task's environment, written to a file and read on the host.
        let file = lab.dir.join(format!("out/container-env-{}.txt", order.name().replace(',', "-")));
        let err_file = file.with_extension("err");
        ok(srun(lab)
            .args(&shape)
            .arg(format!("--output={}", file.display()))
            .arg(format!("--error={}", err_file.display()))
            .arg("env"))?;
        let se2 = std::fs::read_to_string(&err_file).unwrap_or_default();
        let port2 = plugins_port(&se2).ok_or_else(|| format!("no verbose port:\n{se2}"))?;
        let (from_file, _) = ok(std::process::Command::new(&explain).arg("explain").arg("--env").arg(&file))?;
        let line = |text: &str, name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(&format!("{name}=")))
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        for (where_, text, port) in [("inside", &inside, &port), ("--env", &from_file, &port2)] {
            let p = line(text, "MASTER_PORT");
            println!("{} {where_}: {p}", order.name());
            let right = match own_list {
                None => p.starts_with(&format!("MASTER_PORT={port}  (job ")),
                // The hook's port, and the hook named as who set it.
                Some(_) => {
                    p.starts_with("MASTER_PORT=61")
                        && p.contains("(set by enroot's PyTorch hook after spank-gpu")
                }
            };
            ensure!(
                right,
                "{} {own_list:?} {where_}: '{p}' (the plugin's port {port}):\n{text}",
                order.name()
            );
            ensure!(
                !text.contains("did not set anything"),
                "{} {where_}: explain sees no record:\n{text}",
                order.name()
            );
        }
    }
    Ok(())
}
