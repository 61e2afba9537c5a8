//! `slurm-lab`: the local Slurm cluster by hand.
//!
//! ```text
//! slurm-lab demo     bring the cluster up with the plugin (and accounting), run the demo job,
//!                    drain a node through the agent, ask spank-gpu why/autopsy, tear down
//! slurm-lab root RELEASE  make (or check) the Debian root of a Slurm release (24.11, 26.05)
//!                    and print its path
//! slurm-lab shell [SETUP] [--accounting] [--topology tree|block]  bring it up (task setup
//!                    none, affinity or affinity-cgroup; with MariaDB + slurmdbd; with a topology
//!                    plugin whose first switch or block holds node2) and open a shell with
//!                    SLURM_CONF set; exit the shell to tear down; `--containers`: with pyxis
//!                    and enroot (built from ../shared/third-party, cached) after spank_gpu
//!                    in plugstack.conf, and the images' paths in $LAB_PLAIN_IMAGE and
//!                    $LAB_PYTORCH_IMAGE
//! slurm-lab down     clean up after a lab that was killed (by the PIDs and names it recorded)
//! slurm-lab bench [RUNS] [--compare PLUGIN] [--against PLUGIN]... [--topology XML] | bench --script FILE
//!                    launch cost of the plugin (see bench.rs): srun -n4, -n16 and 64 tasks per
//!                    node, with --auto-rdzv --gpu-affinity against without (paired ratios with
//!                    95% intervals, and without against without: the noise), the
//!                    plugin's own time per task in slurmstepd, and for -n16 no plugin (and a
//!                    second plugin file, e.g. the unstripped build); --against (repeatable):
//!                    each other build with both options in the same rounds of every shape, and
//!                    its own time per task; with --topology, all again with the GPU tables the
//!                    agent makes from that machine's hwloc XML;
//!                    with --script, only `bash FILE` in that lab (LAB_DIR, SLURM_CONF set)
//! slurm-lab bench-agent [RUNS]  fault injected → drain visible in sinfo; idle agent RSS and CPU
//! slurm-lab record-jobs [DIR]  record scontrol/sacct/sacctmgr (text and JSON) on real pending and
//!                    ended jobs, with accounting, into DIR/RELEASE (default diagnosis/tests/fixtures/jobinfo/recorded)
//! slurm-lab record-env [DIR] [SETUP...]  record Slurm's per-task environments (no plugin) under
//!                    each task setup (none, affinity, affinity-cgroup) into DIR
//!                    (default tests/fixtures/slurm-env/RELEASE)
//! ```
//! `--slurm RELEASE` (anywhere; or `$SLURM_LAB_SLURM`) runs the cluster on that Slurm
//! release (22.05 is the host's; 24.11 and 26.05 run from their Debian roots): build the
//! workspace against that release's headers first (tests/run does).
//! Run as root. The plugin comes from the build tree (`cargo build`) or `$SPANK_GPU_PLUGIN`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod bench;

use slurm_lab::agents;
use slurm_lab::{Lab, LabConfig, Release, Root, TaskSetup, built_plugin, cleanup_recorded, record};

const USAGE: &str = "usage: slurm-lab [--slurm RELEASE] demo | shell [SETUP] [--accounting] [--topology tree|block] [--containers] | down | root RELEASE | \
                     bench [RUNS] [--compare PLUGIN] [--against PLUGIN]... [--topology XML] | bench --script FILE | bench-agent [RUNS] | record-env [DIR] [SETUP...] | record-jobs [DIR]";

/// The release named by `--slurm X.Y` in the arguments (removed from them),
/// else `$SLURM_LAB_SLURM`, else the host's.
fn take_release(args: &mut Vec<String>) -> Result<Release, String> {
    let Some(i) = args.iter().position(|a| a == "--slurm" || a.starts_with("--slurm=")) else {
        return Release::from_env().map_err(|e| e.to_string());
    };
    let word = args.remove(i);
    let value = match word.strip_prefix("--slurm=") {
        Some(v) => v.to_owned(),
        None if i < args.len() => args.remove(i),
        None => return Err("--slurm needs a release (22.05, 24.11, 26.05)".to_owned()),
    };
    Release::named(&value)
        .ok_or_else(|| format!("--slurm {value}: not a release the lab runs (22.05, 24.11, 26.05)"))
}

/// The release every lab of this run uses (set once in `main`).
static RELEASE: std::sync::OnceLock<Release> = std::sync::OnceLock::new();

fn release() -> Release {
    RELEASE.get().copied().unwrap_or(slurm_lab::RELEASES[0])
}

fn main() -> ExitCode {
    let mut all: Vec<String> = std::env::args().skip(1).collect();
    match take_release(&mut all) {
        Ok(r) => {
            let _ = RELEASE.set(r);
        }
        Err(e) => {
            eprintln!("slurm-lab: {e}");
            return ExitCode::from(2);
        }
    }
    let arg = all.first().cloned().unwrap_or_default();
    let rest: Vec<String> = all.iter().skip(1).cloned().collect();
    let result = match arg.as_str() {
        "demo" => demo(),
        "root" => make_root(rest.first().map(String::as_str)),
        "shell" => {
            let (mut topology, mut setup, mut accounting, mut bad) = (None, None, false, None);
            let mut containers = false;
            let mut words = rest.iter();
            while let Some(w) = words.next() {
                match w.as_str() {
                    "--accounting" => accounting = true,
                    "--containers" => containers = true,
                    "--topology" => match words.next().map(String::as_str) {
                        Some(k @ ("tree" | "block")) => topology = Some(k.to_owned()),
                        other => bad = Some(format!("--topology {}: tree or block", other.unwrap_or(""))),
                    },
                    name => match TaskSetup::from_name(name) {
                        Some(s) if setup.is_none() => setup = Some(s),
                        _ => {
                            bad = Some(format!("{name}: not a task setup (none, affinity, affinity-cgroup)"))
                        }
                    },
                }
            }
            match bad {
                Some(e) => Err(e),
                None => shell(setup.unwrap_or(TaskSetup::None), accounting, topology, containers),
            }
        }
        "down" => cleanup_recorded().map_err(|e| e.to_string()),
        "bench-agent" => bench_agent(rest.first().and_then(|n| n.parse().ok()).unwrap_or(21)),
        "record-env" => record_env(rest.clone()),
        "record-jobs" => record_jobs(rest.first().map(PathBuf::from)),
        "bench" => {
            let args = rest.clone();
            let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
            let runs = args.first().and_then(|n| n.parse().ok()).unwrap_or(30);
            let path = |flag| value(flag).map(PathBuf::from);
            let against: Vec<PathBuf> =
                args.windows(2).filter(|w| w[0] == "--against").map(|w| PathBuf::from(&w[1])).collect();
            if args.iter().filter(|a| *a == "--against").count() != against.len() {
                eprintln!("slurm-lab: --against needs a plugin file");
                return ExitCode::from(2);
            }
            bench(runs, path("--compare"), &against, path("--topology"), path("--script"))
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slurm-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `root RELEASE`: makes the release's Debian root when missing or stale and prints its path.
fn make_root(version: Option<&str>) -> Result<(), String> {
    let version = version.ok_or("root needs a release (24.11, 26.05)")?;
    let release = Release::named(version).ok_or_else(|| format!("{version}: not a release the lab runs"))?;
    match Root::ensure(release).map_err(|e| e.to_string())? {
        Some(root) => println!("{}", root.path.display()),
        None => println!("/"),
    }
    Ok(())
}

fn start_with(task_setup: TaskSetup, accounting: bool) -> Result<Lab, String> {
    start_lab(task_setup, accounting, None, false)
}

fn start_lab(
    task_setup: TaskSetup,
    accounting: bool,
    topology: Option<String>,
    containers: bool,
) -> Result<Lab, String> {
    let (extra_conf, topology_conf) = match topology.as_deref() {
        Some(kind) => {
            let (line, conf) = slurm_lab::reversed_topology(kind);
            (vec![line], Some(conf))
        }
        None => (Vec::new(), None),
    };
    let cfg = LabConfig {
        plugin: Some(built_plugin()),
        task_setup,
        accounting,
        release: release(),
        extra_conf,
        topology_conf,
        ..LabConfig::default()
    };
    let cfg = if containers {
        let tools = slurm_lab::containers::Tools::ensure().map_err(|e| e.to_string())?.ok_or(
            "--containers: ../shared/third-party (or $SLURM_LAB_THIRD_PARTY) holds no pyxis and enroot",
        )?;
        let tools = tools.for_release(release()).map_err(|e| e.to_string())?;
        let c = slurm_lab::containers::ContainerConfig {
            tools,
            order: slurm_lab::containers::Order::GpuFirst,
            pytorch_hook: false,
        };
        LabConfig { containers: Some(c), ..cfg }
    } else {
        cfg
    };
    let dbd = if accounting { "MariaDB, slurmdbd, " } else { "" };
    eprintln!(
        "slurm-lab: starting munge, {dbd}slurmctld and {} namespaced slurmd nodes (Slurm {}, {}) ...",
        cfg.nodes, cfg.release, cfg.release.distribution
    );
    let lab = Lab::start(cfg).map_err(|e| e.to_string())?;
    eprintln!("slurm-lab: up in {}; all nodes idle", lab.dir.display());
    Ok(lab)
}

fn shell(
    setup: TaskSetup,
    accounting: bool,
    topology: Option<String>,
    containers: bool,
) -> Result<(), String> {
    let lab = start_lab(setup, accounting, topology, containers)?;
    eprintln!(
        "slurm-lab: SLURM_CONF={} — try `sinfo`, `srun -N2 hostname`; exit to tear down",
        lab.slurm_conf().display()
    );
    let mut bash = lab.daemon_command("bash");
    if let Some(c) = lab.containers() {
        bash.env("LAB_PLAIN_IMAGE", &c.tools.images.plain)
            .env("LAB_PYTORCH_IMAGE", &c.tools.images.pytorch)
            .env("LAB_ENROOT_ETC", lab.enroot_etc())
            .env("ENROOT_ALLOW_SUPERUSER", "y");
    }
    let status = bash.stdin(std::process::Stdio::inherit()).status().map_err(|e| e.to_string())?;
    drop(lab);
    if status.success() { Ok(()) } else { Err(format!("shell exited with {status}")) }
}

/// The demo job: two nodes, two tasks per node, the plugin's option on an
/// `#SBATCH` line and no launch glue in the script. `PROBE` is replaced by the
/// path of `rdzv-probe`, a stand-in for `python train.py` that reads only
/// MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE and meets over TCP.
const DEMO_JOB: &str = r#"#!/bin/bash
#SBATCH --job-name=spank-gpu-demo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=2
#SBATCH --auto-rdzv
#SBATCH --gpu-affinity=verbose
srun --cpus-per-task=2 -l bash -c 'echo "$(hostname) RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE MASTER=$MASTER_ADDR:$MASTER_PORT CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES CPUs=$(grep Cpus_allowed_list /proc/self/status | cut -f2) OMP_NUM_THREADS=$OMP_NUM_THREADS"'
srun --cpus-per-task=2 PROBE ranks
"#;

fn demo() -> Result<(), String> {
    // With accounting, for `spank-gpu why` and `spank-gpu autopsy` in part 3.
    let mut lab = start_with(TaskSetup::None, true)?;
    let show = |lab: &Lab, title: &str, program: &str, args: &[&str]| -> Result<(), String> {
        let out = lab.command(program).args(args).output().map_err(|e| e.to_string())?;
        println!(
            "\n$ {title}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    // First the release the demo runs on.
    let version = lab.command("sinfo").arg("--version").output().map_err(|e| e.to_string())?;
    println!("$ sinfo --version\n{}", String::from_utf8_lossy(&version.stdout).trim_end());
    show(&lab, "sinfo -N", "sinfo", &["-N"])?;
    let help = lab.command("srun").arg("--help").output().map_err(|e| e.to_string())?;
    let help = String::from_utf8_lossy(&help.stdout);
    let plugin_part = help.split("Options provided by plugins:").nth(1).unwrap_or("(missing!)");
    println!("\n$ srun --help   (the plugin's part)\nOptions provided by plugins:{}", plugin_part.trim_end());

    println!("\n== 1. The GPU table (gpu-node-agent topology --write, on each node) ==");
    for node in lab.nodes.clone() {
        agents::write_topology(&lab, &node)?;
        let table =
            std::fs::read_to_string(lab.node_topology_dir(&node).join("gpus.tsv")).unwrap_or_default();
        println!("\n{node}: {}", table.trim_end());
    }

    println!("\n== 2. A 2-node job: ranks meet with no launch glue; each task bound near its GPU ==");
    let probe = slurm_lab::profile_dir().join("rdzv-probe");
    let script = DEMO_JOB.replace("PROBE", &probe.display().to_string());
    println!("\n$ sbatch demo.sh\n{script}");
    let job = lab.sbatch(&script, &[]).map_err(|e| e.to_string())?;
    let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let mut out: Vec<String> = lab.job_output(job).lines().map(str::to_owned).collect();
    out.sort();
    println!("job {job}: {state}\n--- output (sorted) ---\n{}", out.join("\n"));
    if state != "COMPLETED" {
        return Err(format!("demo job ended {state}"));
    }

    println!("\n== 3. A bad GPU: Xid 79 on node2's GPU 3, the agent drains node2 ==");
    let train = lab
        .sbatch("#!/bin/bash\n#SBATCH --job-name=train\nsleep 300\n", &["-w", "node2", "--gpus=1"])
        .map_err(|e| e.to_string())?;
    println!("(job {train} runs on node2)");
    let _a1 = agents::start_agent(&mut lab, "node1")?;
    let a2 = agents::start_agent(&mut lab, "node2")?;
    std::thread::sleep(Duration::from_millis(1500));
    agents::add_event(&a2, 3, 79)?;
    let took = agents::wait_for(&lab, "node2", Duration::from_secs(20), |s, _| agents::drained(s))?;
    println!("(drained {:.0} ms after the Xid)", took.as_secs_f64() * 1000.0);
    show(&lab, "sinfo -R", "sinfo", &["-R"])?;

    // A job that needs node2 now waits; the one that ran there dies with its GPU.
    let next = lab
        .sbatch("#!/bin/bash\n#SBATCH --job-name=eval\ntrue\n", &["-w", "node2"])
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_secs(2));
    let spank_gpu = agents::bin("spank-gpu").display().to_string();
    show(&lab, &format!("spank-gpu why {next}"), &spank_gpu, &["why", &next.to_string()])?;
    let _ = lab.command("scancel").arg(next.to_string()).status();
    let _ = lab.command("scancel").args(["--signal=KILL", &train.to_string()]).status();
    lab.wait_job(train, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    wait_accounted(&lab, train);
    show(&lab, &format!("spank-gpu autopsy {train}"), &spank_gpu, &["autopsy", &train.to_string()])?;
    let status = lab
        .command_on("node2", &agents::bin("gpu-node-agent").display().to_string())
        .map_err(|e| e.to_string())?
        .args(["--config", &a2.path("config.toml").display().to_string(), "status"])
        .env("FAKE_NVML_STATE", a2.path("nvml.json"))
        .output()
        .map_err(|e| e.to_string())?;
    println!("\n$ gpu-node-agent status   (on node2)\n{}", String::from_utf8_lossy(&status.stdout));

    println!("== 4. Recovery: the GPU is replaced and the node rebooted; the agent resumes its own drain ==");
    a2.set_state(&agents::healthy_state())?;
    a2.set_boot("demo-boot-2")?;
    agents::wait_for(&lab, "node2", Duration::from_secs(20), |s, _| !agents::drained(s))?;
    lab.wait_idle(Duration::from_secs(20)).map_err(|e| e.to_string())?;
    show(&lab, "sinfo -N", "sinfo", &["-N"])?;

    agents::reset(&mut lab)?;
    drop(lab);
    eprintln!("slurm-lab: torn down");
    Ok(())
}

/// Waits (up to 30 s) until slurmdbd has an ended job's own record.
fn wait_accounted(lab: &Lab, job: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let args = ["-n", "-X", "-P", "-j", &job.to_string(), "-o", "Timelimit"];
        let out = lab.command("sacct").args(args).output();
        if out.is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).trim().is_empty()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `record-jobs [DIR]`: the job fixtures of `why`/`autopsy`, into `DIR/RELEASE/`.
fn record_jobs(dir: Option<PathBuf>) -> Result<(), String> {
    let dir = dir.unwrap_or_else(slurm_lab::record_jobs::default_dir).join(release().version);
    eprintln!("slurm-lab: recording jobs on Slurm {} into {}", release(), dir.display());
    for written in slurm_lab::record_jobs::record_jobs(release(), &dir)? {
        eprintln!("  {}", written.display());
    }
    Ok(())
}

/// `record-env [DIR] [SETUP...]`: one lab per task setup, each pattern of
/// [`record::PATTERNS`] recorded into `DIR/SETUP/PATTERN/`.
fn record_env(args: Vec<String>) -> Result<(), String> {
    let mut dir = record::default_dir().join(release().version);
    let mut setups = Vec::new();
    for arg in args {
        match TaskSetup::from_name(&arg) {
            Some(s) => setups.push(s),
            None if setups.is_empty() => dir = arg.into(),
            None => return Err(format!("unknown task setup '{arg}' (none, affinity, affinity-cgroup)")),
        }
    }
    if setups.is_empty() {
        setups = TaskSetup::ALL.to_vec();
    }
    for setup in setups {
        eprintln!("slurm-lab: recording under {setup} into {}", dir.join(setup.name()).display());
        for written in record::record_setup(setup, release(), &dir)? {
            eprintln!("  {}", written.display());
        }
    }
    Ok(())
}

/// `slurm-lab bench`: [`bench::launch`] on a lab of 64-CPU nodes with the
/// lab's GPU tables, then, with `--topology XML`, with the tables the agent
/// makes from that machine's topology. With `--script FILE`, only `bash FILE`
/// in that lab (through the release's root under `--slurm X.Y`, where the
/// file must be in the lab, the build or `SLURM_LAB_MOUNTS`).
fn bench(
    runs: usize,
    compare: Option<PathBuf>,
    against: &[PathBuf],
    topology: Option<PathBuf>,
    script: Option<PathBuf>,
) -> Result<(), String> {
    if script.is_some() && (compare.is_some() || topology.is_some() || !against.is_empty()) {
        return Err(
            "--script runs instead of the benchmark: no --compare, --against or --topology with it".into()
        );
    }
    // A build that is not there fails now, not once the lab is up.
    if let Some(missing) = compare.iter().chain(against).find(|p| !p.is_file()) {
        return Err(format!("{}: no such plugin file", missing.display()));
    }
    let cfg = LabConfig {
        plugin: Some(built_plugin()),
        release: release(),
        cpus_per_node: bench::CPUS_PER_NODE,
        ..LabConfig::default()
    };
    let lab = Lab::start(cfg).map_err(|e| e.to_string())?;
    for node in lab.nodes.clone() {
        agents::write_topology(&lab, &node)?;
    }
    if let Some(script) = script {
        // A profile or a timing of one's own, in the bench's lab: LAB_DIR is its directory.
        let status = lab
            .command("bash")
            .arg(&script)
            .env("LAB_DIR", &lab.dir)
            .stdin(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        return if status.success() { Ok(()) } else { Err(format!("{}: {status}", script.display())) };
    }
    bench::launch(&lab, runs, compare.as_deref(), against, 8, "the lab's GPU table")?;
    let Some(xml_path) = topology else { return Ok(()) };
    let xml = std::fs::read_to_string(&xml_path).map_err(|e| format!("{}: {e}", xml_path.display()))?;
    let mut gpus = 0;
    for node in lab.nodes.clone() {
        gpus = agents::write_topology_from_xml(&lab, &node, &xml)?;
    }
    let name = xml_path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    bench::launch(&lab, runs, None, against, gpus, &format!("the GPU table of {name}"))
}

fn sinfo_state(lab: &Lab, node: &str) -> String {
    lab.command("sinfo")
        .args(["-h", "-n", node, "-o", "%T"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Jiffies of user + system time of a process.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// The agent's numbers: how fast an injected Xid shows as a drain in sinfo
/// (median of `runs`), and an idle agent's memory and CPU over a minute.
/// CPU time, in ns, of the agent's `nvml-usage` thread (`/proc/PID/task/TID/schedstat`).
fn usage_thread_cpu_ns(pid: u32) -> Option<u64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "nvml-usage" {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            return stat.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// The `count:N` of every RPC type in `sdiag`'s or `sacctmgr show stats`'
/// "by message type" section.
fn rpc_counts(text: &str) -> std::collections::BTreeMap<String, u64> {
    text.split("by message type")
        .nth(1)
        .unwrap_or("")
        .split("by user")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|l| {
            let name = l.split_whitespace().next()?.to_owned();
            let n = l.split("count:").nth(1)?.split_whitespace().next()?.parse::<u64>().ok()?;
            Some((name, n))
        })
        .collect()
}

type Counts = std::collections::BTreeMap<String, u64>;

/// RPCs to slurmctld (`sdiag`) and slurmdbd (`sacctmgr show stats`) so far, by type.
fn rpcs(lab: &Lab) -> Result<(Counts, Counts), String> {
    let out = |cmd: &mut std::process::Command| -> Result<String, String> {
        let o = cmd.output().map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    };
    Ok((
        rpc_counts(&out(lab.command("sdiag").arg("--all"))?),
        rpc_counts(&out(lab.command("sacctmgr").args(["show", "stats"]))?),
    ))
}

/// `after - before` per type, and its total.
fn rpc_diff(before: &Counts, after: &Counts) -> (u64, Counts) {
    let d: Counts = after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect();
    (d.values().sum(), d)
}

/// Per-job usage's cost: the agent's CPU per reading (8 GPUs, one job holding
/// them, against the same agent with usage off), and the RPCs one job costs
/// slurmctld and slurmdbd with the agent summing it, against usage off.
fn bench_usage(lab: &mut Lab) -> Result<(), String> {
    agents::write_topology(lab, "node2")?;
    let secs = 30;
    let edits = [("poll_interval = \"500ms\"", "poll_interval = \"30s\"")];
    agents::start_agent_edited(lab, "node2", &edits)?;
    // A job holding all 8 GPUs, as the plugin's prolog records it.
    let jobs = lab.node_run_dir("node2").join("jobs");
    std::fs::create_dir_all(&jobs).map_err(|e| e.to_string())?;
    let mut rec = String::from("# spank-gpu job v1\njob 999999\nuid 0\n");
    for g in 0..8 {
        rec.push_str(&format!("gpu {g} - -\n"));
    }
    std::fs::write(jobs.join("999999"), rec).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_secs(3));
    let pid = lab.daemon_pid("agent-node2").ok_or("no agent pid")?;
    let (n0, t0) = (usage_thread_cpu_ns(pid).ok_or("no nvml-usage thread")?, std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let n1 = usage_thread_cpu_ns(pid).ok_or("no nvml-usage thread")?;
    let readings = t0.elapsed().as_secs_f64(); // one a second
    let _ = std::fs::remove_file(jobs.join("999999"));
    lab.stop_daemon("agent-node2");
    #[allow(clippy::cast_precision_loss)]
    let per_reading_us = (n1 - n0) as f64 / readings / 1000.0;
    println!("per-job usage, 8 GPUs of the fake NVML read every second for one job, {secs} s:");
    println!("  the usage thread's CPU (schedstat): {per_reading_us:.0} us per reading");
    let mut per_job = Vec::new();
    for line in ["usage_interval = \"0\"", "usage_interval = \"1s\""] {
        agents::start_agent_edited(lab, "node2", &[("usage_interval = \"1s\"", line)])?;
        std::thread::sleep(Duration::from_secs(2));
        let (c0, d0) = rpcs(lab)?;
        let job = lab
            .sbatch("#!/bin/bash\nsleep 4\n", &["-w", "node2", "--gres=gpu:8"])
            .map_err(|e| e.to_string())?;
        lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        // The agent's summary reaches accounting within seconds of the epilog.
        std::thread::sleep(Duration::from_secs(8));
        let (c1, d1) = rpcs(lab)?;
        per_job.push((rpc_diff(&c0, &c1), rpc_diff(&d0, &d1)));
        lab.stop_daemon("agent-node2");
    }
    println!(
        "one 4 s job on 8 GPUs, RPCs while it ran and ended (sdiag, sacctmgr show stats; each count includes the one sdiag/stats call):"
    );
    for (name, (ctld, dbd)) in ["usage off", "usage on"].iter().zip(&per_job) {
        println!("  {name}: slurmctld {}, slurmdbd {}", ctld.0, dbd.0);
        println!("    slurmctld by type: {:?}", ctld.1);
        println!("    slurmdbd by type: {:?}", dbd.1);
    }
    Ok(())
}

fn bench_agent(runs: usize) -> Result<(), String> {
    let mut lab = start_with(TaskSetup::None, true)?;
    // The drain, with per-job usage off, on, and on with its NVML calls hanging
    // (the health calls answer): the usage thread must not delay it.
    let hang = |state: &mut serde_json::Value| {
        for g in 0..8 {
            state["gpus"][g]["hang_calls_ms"] =
                serde_json::json!({"utilization": 600_000, "processes": 600_000});
        }
    };
    let configs: [(&str, &str, bool); 3] = [
        ("per-job usage off", "usage_interval = \"0\"", false),
        ("per-job usage on (1 s)", "usage_interval = \"1s\"", false),
        ("per-job usage on, its NVML calls hanging", "usage_interval = \"1s\"", true),
    ];
    println!("fault injected (Xid 79 through NVML) -> drain visible in sinfo, {runs} runs each:");
    for (name, line, hanging) in configs {
        let a2 = agents::start_agent_edited(&mut lab, "node2", &[("usage_interval = \"1s\"", line)])?;
        let healthy = || {
            let mut s = agents::healthy_state();
            if hanging {
                hang(&mut s);
            }
            s
        };
        a2.set_state(&healthy())?;
        std::thread::sleep(Duration::from_millis(2500));
        let mut took = Vec::new();
        for i in 0..runs {
            let t = std::time::Instant::now();
            agents::add_event(&a2, 3, 79)?;
            while !sinfo_state(&lab, "node2").contains("drain") {
                if t.elapsed() > Duration::from_secs(20) {
                    let log = a2.log(&lab, "node2");
                    return Err(format!("{name}, run {i}: no drain after 20 s; agent log:\n{log}"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            took.push(t.elapsed().as_secs_f64() * 1000.0);
            // Clear: healthy GPUs, a "reboot", and the agent resumes its own drain.
            a2.set_state(&healthy())?;
            a2.set_boot(&format!("boot-bench-{name}-{i}"))?;
            agents::wait_for(&lab, "node2", Duration::from_secs(20), |s, _| !agents::drained(s))?;
            lab.wait_idle(Duration::from_secs(20)).map_err(|e| e.to_string())?;
        }
        let mut sorted = took.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "  {name}: median {:.0} ms, min {:.0} ms, max {:.0} ms",
            bench::median(took),
            sorted.first().copied().unwrap_or(0.0),
            sorted.last().copied().unwrap_or(0.0)
        );
        lab.stop_daemon("agent-node2");
    }
    bench_usage(&mut lab)?;

    // An idle agent with the production poll interval.
    agents::reset(&mut lab)?;
    let a1 = agents::start_agent_edited(
        &mut lab,
        "node1",
        &[("poll_interval = \"500ms\"", "poll_interval = \"30s\"")],
    )?;
    std::thread::sleep(Duration::from_secs(3));
    let pid = lab.daemon_pid("agent-node1").ok_or("no agent pid")?;
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let (c0, t0) = (cpu_ticks(pid).ok_or("no /proc stat")?, std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(60));
    let (c1, secs) = (cpu_ticks(pid).ok_or("no /proc stat")?, t0.elapsed().as_secs_f64());
    #[allow(clippy::cast_precision_loss)]
    let cpu = (c1 - c0) as f64 / ticks_per_s / secs * 100.0;
    println!("idle agent (poll 30 s, NVML event wait and kernel-log follow running) over {secs:.0} s:");
    println!(
        "  CPU {cpu:.2}% of a core; RSS {} KiB (peak {} KiB)",
        status_kib(pid, "VmRSS:").unwrap_or(0),
        status_kib(pid, "VmHWM:").unwrap_or(0)
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap_or("?").trim().to_owned();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().to_ascii_lowercase();
    let vendor: Vec<&str> = ["opencl", "pocl", "llvm", "libcuda", "/hwloc/hwloc_"]
        .into_iter()
        .filter(|f| maps.contains(f))
        .collect();
    println!("  {threads} threads; mapped of hwloc's vendor plugins, OpenCL, LLVM, libcuda: {vendor:?}");

    // The GPU table as the daemon's child makes it (without writing it here).
    let agent = agents::bin("gpu-node-agent").display().to_string();
    let mut took = Vec::new();
    for _ in 0..11 {
        let t = std::time::Instant::now();
        let out = lab
            .command_on("node1", &agent)
            .map_err(|e| e.to_string())?
            .args(["--config", &a1.path("config.toml").display().to_string(), "topology"])
            .env("FAKE_NVML_STATE", a1.path("nvml.json"))
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("topology failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("gpu-node-agent topology (hwloc without its vendor components, fake NVML), 11 runs:");
    println!("  median {:.1} ms", bench::median(took));
    agents::reset(&mut lab)?;
    Ok(())
}
