//! A real Slurm cluster on one machine, for the project's end-to-end tests and demo.
//!
//! [`Lab::start`] brings up, as root on Debian 12: munge (reused when one
//! already answers), slurmctld on the host, and one slurmd per node, each in
//! its own network + UTS + mount namespace (hostname `nodeN`, address
//! `10.77.0.1N` on a private bridge, a lab `/etc/hosts` bind-mounted inside),
//! with fake GPUs as character devices (`c 195 N`) listed in `gres.conf`, and
//! the freshly built plugin installed by atomic rename and listed in
//! `plugstack.conf`. It returns once every node is exactly `idle`.
//!
//! Teardown ([`Lab::stop`], also run on drop, so a failing test still cleans
//! up) ends only what this lab started, by PID: the daemons it spawned and
//! every process left inside its network namespaces; then it deletes the
//! namespaces, links and work directory. What it creates is recorded in
//! [`STATE_FILE`] as it goes, so a lab killed half-way is cleaned up by the
//! next start or by `slurm-lab down`.
//!
//! Namespaces are entered with `nsenter --net`, not `ip netns exec`, which
//! remounts `/sys` and hides `/sys/fs/cgroup` from slurmd.
//!
//! The lab runs the host's Slurm, or another release from a Debian root
//! ([`release`]): then every Slurm daemon and command, and every program run
//! on a node, runs in that root with `chroot`, the lab's work directory and
//! the build tree mounted inside at their own paths, so paths mean the same
//! inside and out. munged and MariaDB are the host's.

pub mod agents;
pub mod record;
pub mod record_jobs;
pub mod release;

pub use release::{RELEASES, Release, Root};

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Where a running lab records what it created, for cleanup after a crash.
pub const STATE_FILE: &str = "/run/slurm-lab/state";
/// Name prefix of every network object the lab creates.
const PREFIX: &str = "sglab";
/// The bridge joining the host (the controller) and the nodes.
const BRIDGE: &str = "sglab0";
/// The controller's address on the bridge; node N is `10.77.0.1N`.
const CTLD_ADDR: &str = "10.77.0.1";
/// The TCP port of the lab's MariaDB (on 127.0.0.1), away from a system one's 3306.
pub const MARIADB_PORT: u16 = 3317;
/// The port slurmdbd listens on.
const SLURMDBD_PORT: u16 = 6819;
/// Major number of NVIDIA GPU device files.
const NVIDIA_MAJOR: u32 = 195;
/// Where the cgroup v1 hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// An error bringing the lab up or using it, with what to do about it.
#[derive(Debug)]
pub struct LabError(pub String);

impl std::fmt::Display for LabError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LabError {}

impl From<io::Error> for LabError {
    fn from(e: io::Error) -> Self {
        LabError(e.to_string())
    }
}

/// Result of lab operations.
pub type Result<T> = std::result::Result<T, LabError>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(LabError(msg.into()))
}

/// The task plugin setup of the nodes, as production sites run them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskSetup {
    /// `TaskPlugin=task/none`, `ProctrackType=proctrack/linuxproc`: Slurm binds
    /// nothing; nodes may advertise more CPUs than the machine has.
    #[default]
    None,
    /// `TaskPlugin=task/affinity`: Slurm binds every task itself (cyclic by
    /// default) and exports `SLURM_CPU_BIND_*`. Nodes advertise the machine's
    /// real CPUs and layout (as `slurmd -C` reports them): task/affinity
    /// fails to bind when `CPUs=` differs from the hardware.
    Affinity,
    /// `TaskPlugin=task/affinity,task/cgroup`, `ProctrackType=proctrack/cgroup`
    /// and a `cgroup.conf` with `CgroupPlugin=cgroup/v1`, `ConstrainCores=yes`,
    /// `ConstrainDevices=yes`. Nodes advertise the real CPUs, as for
    /// [`TaskSetup::Affinity`]. The slurmds make `slurm_NODE` cgroups (Debian's
    /// Slurm is built with `MULTIPLE_SLURMD`, so 22.05's `CgroupPrepend` is
    /// `/slurm_%n`) in every v1 controller; teardown removes them.
    AffinityCgroup,
}

impl TaskSetup {
    /// Every setup, in the order the e2e suite runs them.
    pub const ALL: [TaskSetup; 3] = [TaskSetup::None, TaskSetup::Affinity, TaskSetup::AffinityCgroup];

    /// Short name, for directories and filters: `none`, `affinity`, `affinity-cgroup`.
    pub fn name(self) -> &'static str {
        match self {
            TaskSetup::None => "none",
            TaskSetup::Affinity => "affinity",
            TaskSetup::AffinityCgroup => "affinity-cgroup",
        }
    }

    /// The setup with this [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<TaskSetup> {
        TaskSetup::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The `slurm.conf` lines that differ between the setups.
    pub fn slurm_conf_lines(self) -> &'static [&'static str] {
        match self {
            TaskSetup::None => &["TaskPlugin=task/none", "ProctrackType=proctrack/linuxproc"],
            TaskSetup::Affinity => &["TaskPlugin=task/affinity", "ProctrackType=proctrack/linuxproc"],
            TaskSetup::AffinityCgroup => {
                &["TaskPlugin=task/affinity,task/cgroup", "ProctrackType=proctrack/cgroup"]
            }
        }
    }

    /// The `cgroup.conf` the lab writes, if any.
    pub fn cgroup_conf(self) -> Option<&'static str> {
        match self {
            TaskSetup::AffinityCgroup => Some(
                "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\nConstrainDevices=yes\n",
            ),
            _ => None,
        }
    }

    /// Whether the nodes advertise the machine's real CPUs (Slurm binds tasks).
    pub fn binds(self) -> bool {
        self != TaskSetup::None
    }
}

impl std::fmt::Display for TaskSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The machine's CPU layout as `slurmd -C` reports it: the words of a
/// `NodeName=` line from `CPUs=` to `ThreadsPerCore=`, which slurmd accepts.
///
/// # Errors
/// `slurmd -C` failed or printed no `CPUs=`.
pub fn real_cpu_layout() -> Result<(u32, String)> {
    let out = run(Command::new("slurmd").arg("-C"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("NodeName=")).unwrap_or_default();
    let keep = ["CPUs=", "Boards=", "SocketsPerBoard=", "CoresPerSocket=", "ThreadsPerCore="];
    let words: Vec<&str> =
        line.split_whitespace().filter(|w| keep.iter().any(|k| w.starts_with(k))).collect();
    let cpus = field(line, "CPUs").and_then(|c| c.parse().ok());
    match cpus {
        Some(n) if words.len() == keep.len() => Ok((n, words.join(" "))),
        _ => err(format!("slurmd -C printed no CPU layout ('{}'); is slurmd installed?", line.trim())),
    }
}

/// What to bring up.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// Number of slurmd nodes (`node1`..`nodeN`), at most 9.
    pub nodes: usize,
    /// Fake GPUs per node.
    pub gpus_per_node: u32,
    /// CPUs each node advertises under [`TaskSetup::None`]
    /// (`SlurmdParameters=config_overrides` lets a node claim more than the
    /// machine has). The other setups advertise the machine's real CPUs.
    pub cpus_per_node: u32,
    /// The task plugin setup.
    pub task_setup: TaskSetup,
    /// The plugin to install; `None` runs the cluster without it.
    pub plugin: Option<PathBuf>,
    /// Words after the plugin path on the plugstack line.
    pub plugstack_args: Vec<String>,
    /// Parent of the lab's work directory.
    pub base_dir: PathBuf,
    /// Extra `slurm.conf` lines.
    pub extra_conf: Vec<String>,
    /// Run every slurmstepd under valgrind, logging to `log/valgrind-PID.log`.
    pub valgrind_stepd: bool,
    /// `gres.conf` lines for one node instead of the default
    /// (`File=<lab>/cdev/nvidia[0-7]`), with `{dir}` standing for the lab's
    /// work directory: `("node2", "File={dir}/cdev/nvidia[4-7]\nFile=...")`.
    pub node_gres: Vec<(String, String)>,
    /// Job accounting: a MariaDB of the lab's own (datadir in the work
    /// directory, port [`MARIADB_PORT`]) and slurmdbd, started before
    /// slurmctld, with the cluster, an account and root registered;
    /// `AccountingStorageType=accounting_storage/slurmdbd`,
    /// `JobAcctGatherType=jobacct_gather/linux` (with `OverMemoryKill`),
    /// memory as a consumable resource (`CR_Core_Memory`, `DefMemPerCPU=100`)
    /// and `PrivateData=jobs`. Off by default: it adds seconds to the start.
    pub accounting: bool,
    /// The Slurm release to run: the host's, or one from a Debian root.
    /// Defaults to `$SLURM_LAB_SLURM` (see [`Release::from_env`]).
    pub release: Release,
    /// A `topology.conf` to write next to `slurm.conf` (with a
    /// `TopologyPlugin=` line in [`LabConfig::extra_conf`]).
    pub topology_conf: Option<String>,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            nodes: 2,
            gpus_per_node: 8,
            cpus_per_node: 8,
            task_setup: TaskSetup::None,
            plugin: None,
            plugstack_args: Vec::new(),
            base_dir: std::env::temp_dir(),
            extra_conf: Vec::new(),
            node_gres: Vec::new(),
            valgrind_stepd: false,
            accounting: false,
            release: Release::from_env().unwrap_or(RELEASES[0]),
            topology_conf: None,
        }
    }
}

/// A spawned daemon.
#[derive(Debug)]
struct Daemon {
    name: String,
    child: Child,
}

/// A running cluster. Dropping it tears everything down.
#[derive(Debug)]
pub struct Lab {
    /// The work directory: configs, logs, state, fake devices, job output.
    pub dir: PathBuf,
    /// Node names, `node1`..`nodeN`.
    pub nodes: Vec<String>,
    cfg: LabConfig,
    /// CPUs each node advertises, and the `CPUs=... ThreadsPerCore=N` words of its NodeName line.
    node_cpus: (u32, String),
    /// The cgroups the slurmds make (recorded for teardown).
    cgroups: Vec<PathBuf>,
    /// The Debian root the Slurm release runs from; `None` for the host's Slurm.
    root: Option<Root>,
    daemons: Vec<Daemon>,
    keep_dir: bool,
    stopped: bool,
    /// The longest one [`Lab::command`] may run (set by [`Lab::limit_commands`]).
    command_limit: Option<Duration>,
}

// ----- small process helpers ------------------------------------------------------------

/// Runs a command to completion, failing on a non-zero exit with its stderr.
fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| LabError(format!("{cmd:?}: {e}")))?;
    if !out.status.success() {
        return err(format!(
            "{cmd:?} failed ({}{}): {}",
            out.status,
            timed_out_note(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// Words for an exit status that `timeout(1)` gives a command it ended
/// ([`Lab::limit_commands`]), empty for any other.
pub fn timed_out_note(status: std::process::ExitStatus) -> &'static str {
    match status.code() {
        Some(124 | 137) => {
            ", which is how timeout(1) reports a command it ended: past the lab's command limit"
        }
        _ => "",
    }
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args)).map(drop)
}

/// The start time of a process (field 22 of `/proc/PID/stat`), which tells a
/// live process from a later one that reused its PID.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn alive(pid: u32, started: u64) -> bool {
    start_time(pid) == Some(started)
}

fn kill(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) takes plain integers and has no memory effects here.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Waits until `f` returns true or `timeout` passes.
fn wait_until(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    wait_every(Duration::from_millis(50), timeout, f)
}

/// [`wait_until`], asking every `interval`.
fn wait_every(interval: Duration, timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(interval);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
        || Path::new("/usr/sbin").join(tool).is_file()
        || Path::new("/sbin").join(tool).is_file()
}

fn hostname() -> Result<String> {
    let out = run(&mut Command::new("hostname"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

// ----- the state file -----------------------------------------------------------------

/// Appends one record to the state file: `pid PID START NAME`, `netns NAME`,
/// `link NAME`, `cgroup PATH`, `mount PATH` or `dir PATH`.
fn record(line: &str) -> Result<()> {
    let mut f = fs::OpenOptions::new().append(true).create(true).open(STATE_FILE)?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// Ends everything a lab recorded in the state file, by PID and by the names
/// it created, then removes the file. Safe to call when there is none.
pub fn cleanup_recorded() -> Result<()> {
    let Ok(text) = fs::read_to_string(STATE_FILE) else { return Ok(()) };
    let mut pids = Vec::new();
    let mut netns = Vec::new();
    let mut links = Vec::new();
    let mut dirs = Vec::new();
    let mut cgroups = Vec::new();
    let mut mounts = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["owner", pid, start] | ["pid", pid, start, ..] => {
                if let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) {
                    if words[0] == "owner" {
                        if pid != std::process::id() && alive(pid, start) {
                            return err(format!(
                                "another slurm-lab (pid {pid}) is running; stop it first (state in {STATE_FILE})"
                            ));
                        }
                    } else {
                        pids.push((pid, start));
                    }
                }
            }
            ["netns", name] if name.starts_with(PREFIX) => netns.push((*name).to_owned()),
            ["link", name] if name.starts_with(PREFIX) => links.push((*name).to_owned()),
            ["dir", path] => dirs.push(PathBuf::from(path)),
            ["mount", path] => mounts.push(PathBuf::from(path)),
            ["cgroup", path] if is_lab_cgroup(Path::new(path)) => cgroups.push(PathBuf::from(path)),
            _ => {}
        }
    }
    // Daemons first, politely, newest first (slurmds before slurmctld before munged).
    for &(pid, start) in pids.iter().rev() {
        if alive(pid, start) {
            kill(pid, libc::SIGTERM);
        }
    }
    let _ = wait_until(Duration::from_secs(10), || pids.iter().all(|&(p, s)| !alive(p, s)));
    for &(pid, start) in &pids {
        if alive(pid, start) {
            kill(pid, libc::SIGKILL);
        }
    }
    // Then whatever is left inside the nodes: slurmstepds and job processes.
    for name in &netns {
        kill_netns_processes(name);
        let _ = Command::new("ip").args(["netns", "delete", name]).stderr(Stdio::null()).status();
    }
    for name in &links {
        let _ = Command::new("ip").args(["link", "delete", name]).stderr(Stdio::null()).status();
    }
    // The slurmds' cgroups, once the processes in them are gone.
    let _ = wait_until(Duration::from_secs(10), || {
        cgroups.iter().filter(|c| c.exists()).all(|c| remove_cgroup(c).is_ok())
    });
    // The root's mounts, newest first, once nothing runs in the root.
    for mount in mounts.iter().rev() {
        if let Err(e) = release::unmount(mount) {
            eprintln!("slurm-lab: teardown: {e}");
        }
    }
    for dir in dirs {
        let _ = fs::remove_dir_all(dir);
    }
    fs::remove_file(STATE_FILE)?;
    Ok(())
}

/// Whether `path` is a cgroup the lab may have made: `/sys/fs/cgroup/CONTROLLER/slurm_NODE`.
fn is_lab_cgroup(path: &Path) -> bool {
    path.parent().and_then(Path::parent) == Some(Path::new(CGROUP_ROOT))
        && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("slurm_node"))
}

/// Removes a cgroup v1 directory and the cgroups below it, deepest first
/// (a cgroup is removed with rmdir once no process is in it).
fn remove_cgroup(path: &Path) -> io::Result<()> {
    for entry in fs::read_dir(path)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path())?;
        }
    }
    match fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The cgroup v1 hierarchies mounted under [`CGROUP_ROOT`] (`cpuset`, `devices`, ...).
fn cgroup_v1_controllers() -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup")).then(|| PathBuf::from(f.get(1).copied().unwrap_or_default()))
        })
        .filter(|p| p.parent() == Some(Path::new(CGROUP_ROOT)))
        .collect()
}

/// SIGKILLs every process whose network namespace is the named one. Found by
/// comparing namespace inodes under `/proc`, never by process name.
fn kill_netns_processes(name: &str) {
    let Ok(ns) = fs::metadata(format!("/run/netns/{name}")) else { return };
    let target = (ns.dev(), ns.ino());
    for _ in 0..20 {
        let mut found = 0;
        if let Ok(entries) = fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if let Ok(m) = fs::metadata(entry.path().join("ns/net")) {
                    if (m.dev(), m.ino()) == target {
                        kill(pid, libc::SIGKILL);
                        found += 1;
                    }
                }
            }
        }
        if found == 0 {
            return;
        }
        sleep(Duration::from_millis(100));
    }
}

// ----- the lab ------------------------------------------------------------------------

impl Lab {
    /// Brings the cluster up and waits until every node is exactly `idle`.
    ///
    /// # Errors
    /// Not root, a missing tool (with the package to install), or a daemon
    /// that did not come up (with the tail of its log). Whatever was started
    /// is torn down before the error is returned.
    pub fn start(cfg: LabConfig) -> Result<Lab> {
        if !is_root() {
            return err("the Slurm lab needs root (namespaces, mknod, daemons); run it with sudo or as root");
        }
        let root = Root::path_of(cfg.release);
        let slurm_tools =
            ["slurmctld", "slurmd", "slurmstepd", "srun", "sbatch", "sinfo", "scontrol", "squeue", "scancel"];
        let missing: Vec<&str> = slurm_tools.into_iter().filter(|t| root.is_none() && !which(t)).collect();
        if !missing.is_empty() {
            return err(format!(
                "missing tools: {} (apt-get install slurmctld slurmd slurm-client, or run tests/run, which installs them)",
                missing.join(", ")
            ));
        }
        let missing: Vec<&str> = ["munged", "munge", "unmunge", "ip", "nsenter", "unshare", "setpriv"]
            .into_iter()
            .filter(|t| !which(t))
            .collect();
        if !missing.is_empty() {
            return err(format!(
                "missing tools: {} (apt-get install munge iproute2 util-linux, \
                 or run tests/run, which installs them)",
                missing.join(", ")
            ));
        }
        let accounting_tools =
            ["mariadbd", "mariadb-install-db", "mariadb", "mariadb-admin", "slurmdbd", "sacct", "sacctmgr"];
        let in_root = |t: &str| root.is_some() && ["slurmdbd", "sacct", "sacctmgr"].contains(&t);
        let missing: Vec<&str> =
            accounting_tools.into_iter().filter(|t| cfg.accounting && !in_root(t) && !which(t)).collect();
        if !missing.is_empty() {
            return err(format!(
                "missing tools for accounting: {} (apt-get install --no-install-recommends mariadb-server slurmdbd, \
                 or run tests/run, which installs them)",
                missing.join(", ")
            ));
        }
        if cfg.nodes == 0 || cfg.nodes > 9 {
            return err("the lab supports 1 to 9 nodes");
        }
        if cfg.valgrind_stepd && !cfg.release.is_host() {
            return err("slurmstepd under valgrind runs on the host's Slurm only");
        }
        cleanup_recorded()?;
        let root = Root::ensure(cfg.release)?;
        fs::create_dir_all("/run/slurm-lab")?;
        let me = std::process::id();
        record(&format!("owner {me} {}", start_time(me).unwrap_or(0)))?;

        let dir = cfg.base_dir.join(format!("slurm-lab.{me}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        record(&format!("dir {}", dir.display()))?;

        let node_cpus = if cfg.task_setup.binds() {
            real_cpu_layout()?
        } else {
            (cfg.cpus_per_node, format!("CPUs={}", cfg.cpus_per_node))
        };
        let mut lab = Lab {
            dir,
            nodes: (1..=cfg.nodes).map(|i| format!("node{i}")).collect(),
            cfg,
            node_cpus,
            cgroups: Vec::new(),
            root,
            daemons: Vec::new(),
            keep_dir: false,
            stopped: false,
            command_limit: None,
        };
        // On any error, `lab` is dropped here and tears down what was started.
        lab.bring_up()?;
        Ok(lab)
    }

    fn bring_up(&mut self) -> Result<()> {
        for sub in ["etc", "log", "state", "run", "cdev", "lib", "out", "bin", "topology"] {
            fs::create_dir_all(self.dir.join(sub))?;
        }
        for node in &self.nodes {
            fs::create_dir_all(self.node_topology_dir(node))?;
            // Each node's TmpFS: the nodes share one file system, and mpi/pmix makes
            // its client directory there by job and step alone (22.05 refused the
            // second node's: `Cannot create directory "/tmp/spmix_appdir_0_1.0": File exists`).
            let tmp = self.dir.join(format!("nodes/{node}/tmp"));
            fs::create_dir_all(&tmp)?;
            fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
        }
        self.make_devices()?;
        if let Some(plugin) = self.cfg.plugin.clone() {
            self.install_plugin(&plugin)?;
        }
        self.write_configs()?;
        self.record_cgroups()?;
        self.ensure_munge()?;
        self.mount_root()?;
        self.make_network()?;
        if self.cfg.accounting {
            self.start_accounting()?;
        }
        self.start_daemons()?;
        self.wait_idle(Duration::from_secs(30))
    }

    /// The task plugin setup the lab runs.
    pub fn task_setup(&self) -> TaskSetup {
        self.cfg.task_setup
    }

    /// The Slurm release the lab runs.
    pub fn release(&self) -> Release {
        self.cfg.release
    }

    /// Whether the lab's Slurm is at least `major.minor`, for expectations
    /// that hold from one release on.
    pub fn slurm_at_least(&self, major: u32, minor: u32) -> bool {
        self.cfg.release.number() >= (major, minor)
    }

    /// The Debian root the lab's Slurm runs from; `None` for the host's.
    pub fn root(&self) -> Option<&Root> {
        self.root.as_ref()
    }

    /// Mounts what the root needs (see [`Root::mount`]) and writes
    /// `bin/in-root`, which runs a command in the root, in the caller's
    /// directory, with the caller's environment.
    fn mount_root(&self) -> Result<()> {
        let Some(root) = &self.root else { return Ok(()) };
        let build = profile_dir();
        let extra = extra_mounts();
        let mut dirs = vec![(self.dir.as_path(), false), (build.as_path(), true)];
        dirs.extend(extra.iter().map(|d| (d.as_path(), true)));
        root.mount(&dirs, &|l| record(l))?;
        // The controller and the clients in the root resolve the host and the
        // nodes as on the host (srun and slurmctld look up the host's name).
        let hosts = root.inside(Path::new("/etc/hosts"));
        record(&format!("mount {}", hosts.display()))?;
        run(Command::new("mount").arg("--bind").arg(self.dir.join("etc/hosts")).arg(&hosts))?;
        let wrapper = self.dir.join("bin/in-root");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n# Runs a command in the Slurm {} root, in the caller's directory.\n\
                 dir=$(pwd)\nexec chroot {} /bin/sh -c 'cd \"$1\" 2>/dev/null || cd /; shift; exec \"$@\"' in-root \"$dir\" \"$@\"\n",
                root.release,
                root.path.display()
            ),
        )?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// Fake GPUs per node.
    pub fn gpus_per_node(&self) -> u32 {
        self.cfg.gpus_per_node
    }

    /// CPUs each node advertises to Slurm.
    pub fn cpus_per_node(&self) -> u32 {
        self.node_cpus.0
    }

    /// Records the `slurm_NODE` cgroup of every node in every v1 hierarchy for
    /// teardown, except any that exists already (not the lab's to remove).
    fn record_cgroups(&mut self) -> Result<()> {
        if self.cfg.task_setup != TaskSetup::AffinityCgroup {
            return Ok(());
        }
        let controllers = cgroup_v1_controllers();
        if !controllers.iter().any(|c| c.ends_with("cpuset"))
            || !controllers.iter().any(|c| c.ends_with("devices"))
        {
            return err(format!(
                "task/cgroup needs the cgroup v1 cpuset and devices controllers mounted under {CGROUP_ROOT}; \
                 found {controllers:?}"
            ));
        }
        for controller in controllers {
            for node in &self.nodes {
                let path = controller.join(format!("slurm_{node}"));
                if path.exists() {
                    continue;
                }
                record(&format!("cgroup {}", path.display()))?;
                self.cgroups.push(path);
            }
        }
        Ok(())
    }

    /// The lab's `slurm.conf`; every Slurm command run here must see it.
    pub fn slurm_conf(&self) -> PathBuf {
        self.dir.join("etc/slurm.conf")
    }

    /// The path the plugin is installed at.
    pub fn plugin_path(&self) -> PathBuf {
        self.dir.join("lib/spank_gpu.so")
    }

    /// The directory every node sees as its GPU-table directory (each node has
    /// its own behind it, see [`Lab::node_topology_dir`]).
    pub fn topology_dir(&self) -> PathBuf {
        self.dir.join("topology")
    }

    /// Where a node's GPU-table directory really is, as the host sees it.
    pub fn node_topology_dir(&self, node: &str) -> PathBuf {
        self.dir.join(format!("nodes/{node}/topology"))
    }

    /// The slurmd log of a node (slurmstepd logs there too).
    pub fn slurmd_log(&self, node: &str) -> PathBuf {
        self.dir.join(format!("log/slurmd-{node}.log"))
    }

    /// The controller's log.
    pub fn slurmctld_log(&self) -> PathBuf {
        self.dir.join("log/slurmctld.log")
    }

    /// Keeps the work directory (logs, configs) after teardown, for a look at a failure.
    pub fn keep_dir_on_stop(&mut self) {
        self.keep_dir = true;
    }

    fn make_devices(&self) -> Result<()> {
        for minor in 0..self.cfg.gpus_per_node {
            let path = self.dir.join(format!("cdev/nvidia{minor}"));
            run(Command::new("mknod")
                .arg("-m")
                .arg("0666")
                .arg(&path)
                .arg("c")
                .arg(NVIDIA_MAJOR.to_string())
                .arg(minor.to_string()))?;
        }
        Ok(())
    }

    /// Copies `plugin` into the lab and renames it into place, so no Slurm
    /// process ever maps a half-written file.
    ///
    /// # Errors
    /// The plugin file cannot be read or written.
    pub fn install_plugin(&self, plugin: &Path) -> Result<()> {
        if !plugin.is_file() {
            return err(format!(
                "plugin {} not found; build it first (cargo build -p spank-gpu)",
                plugin.display()
            ));
        }
        let tmp = self.dir.join("lib/.spank_gpu.so.tmp");
        fs::copy(plugin, &tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, self.plugin_path())?;
        Ok(())
    }

    /// Rewrites `plugstack.conf` (atomically) with these words after the plugin
    /// path. srun, sbatch and every new step read it afresh; slurmd only at start.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn set_plugstack_args(&self, args: &[&str]) -> Result<()> {
        // Every node sees its own GPU table at <lab>/topology.
        let topology = if args.iter().any(|a| a.starts_with("topology_dir=")) {
            String::new()
        } else {
            format!(" topology_dir={}", self.topology_dir().display())
        };
        // The lab's GPUs are device files in <lab>/cdev, not /dev: the debug build's
        // `debug_dev_dir` points the plugin's device-cgroup probe there (an installed
        // release build has no such key, and the lab gives it none).
        let installed = std::env::var_os("SLURM_LAB_INSTALLED").is_some();
        let dev_dir = if installed || args.iter().any(|a| a.starts_with("debug_dev_dir=")) {
            String::new()
        } else {
            format!(" debug_dev_dir={}", self.dir.join("cdev").display())
        };
        let line = if self.cfg.plugin.is_some() {
            format!("required {} {}{topology}{dev_dir}\n", self.plugin_path().display(), args.join(" "))
        } else {
            String::new()
        };
        self.write_atomic("etc/plugstack.conf", &line)
    }

    fn write_atomic(&self, rel: &str, text: &str) -> Result<()> {
        let path = self.dir.join(rel);
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text)?;
        fs::rename(&tmp, &path)?;
        Ok(())
    }

    fn node_addr(index: usize) -> String {
        format!("10.77.0.1{}", index + 1)
    }

    fn write_configs(&self) -> Result<()> {
        let d = self.dir.display();
        let host = hostname()?;
        let mut conf = format!(
            "ClusterName=lab
SlurmctldHost={host}({CTLD_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={d}/state/ctld
SlurmdSpoolDir={d}/state/slurmd-%n
TmpFS={d}/nodes/%n/tmp
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=verbose
MailProg=/bin/true
SelectType=select/cons_tres
GresTypes=gpu
ReturnToService=2
MpiDefault=none
MpiParams=ports=30000-30999
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1
SlurmdParameters=config_overrides
PlugStackConfig={d}/etc/plugstack.conf
RebootProgram={d}/bin/reboot
ResumeTimeout=30
"
        );
        // A reboot that only records that it was asked for.
        let reboot = self.dir.join("bin/reboot");
        fs::write(&reboot, format!("#!/bin/sh\necho \"$(hostname) $*\" >> {d}/log/reboots\n"))?;
        fs::set_permissions(&reboot, fs::Permissions::from_mode(0o755))?;
        if self.cfg.accounting {
            let _ = write!(
                conf,
                "SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={SLURMDBD_PORT}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
PrivateData=jobs
"
            );
        } else {
            conf.push_str(
                "SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
",
            );
        }
        for line in self.cfg.task_setup.slurm_conf_lines() {
            conf.push_str(line);
            conf.push('\n');
        }
        if let Some(cgroup) = self.cfg.task_setup.cgroup_conf() {
            fs::write(self.dir.join("etc/cgroup.conf"), cgroup)?;
        }
        if let Some(topology) = &self.cfg.topology_conf {
            fs::write(self.dir.join("etc/topology.conf"), topology)?;
        }
        for line in &self.cfg.extra_conf {
            conf.push_str(line);
            conf.push('\n');
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = writeln!(
                conf,
                "NodeName={node} NodeHostname={node} NodeAddr={} {} RealMemory=4000 Gres=gpu:h100:{} State=UNKNOWN",
                Self::node_addr(i),
                self.node_cpus.1,
                self.cfg.gpus_per_node
            );
        }
        conf.push_str("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
        fs::write(self.slurm_conf(), conf)?;

        let last = self.cfg.gpus_per_node.saturating_sub(1);
        let mut gres = String::new();
        for node in &self.nodes {
            let custom = self
                .cfg
                .node_gres
                .iter()
                .find(|(n, _)| n == node)
                .map(|(_, g)| g.replace("{dir}", &d.to_string()));
            let files = custom.unwrap_or_else(|| format!("File={d}/cdev/nvidia[0-{last}]"));
            for line in files.lines() {
                let _ = writeln!(gres, "NodeName={node} Name=gpu Type=h100 {line}");
            }
        }
        fs::write(self.dir.join("etc/gres.conf"), gres)?;

        let mut hosts = format!("127.0.0.1 localhost\n{CTLD_ADDR} {host}\n");
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = writeln!(hosts, "{} {node}", Self::node_addr(i));
        }
        fs::write(self.dir.join("etc/hosts"), hosts)?;

        let args: Vec<&str> = self.cfg.plugstack_args.iter().map(String::as_str).collect();
        self.set_plugstack_args(&args)
    }

    /// The lab's MariaDB socket.
    fn mariadb_socket(&self) -> PathBuf {
        self.dir.join("mysql/sock")
    }

    /// MariaDB (own datadir, owned by the mysql user, which also owns the pid
    /// file's directory) and slurmdbd, then the cluster, an account and root
    /// registered with sacctmgr. slurmctld starts after this.
    fn start_accounting(&mut self) -> Result<()> {
        let db = self.dir.join("mysql");
        fs::create_dir_all(&db)?;
        run(Command::new("chown").args(["mysql:mysql"]).arg(&db))?;
        let datadir = format!("--datadir={}", db.join("data").display());
        run(Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=mysql",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ])
            .arg(&datadir))?;
        let log = fs::File::create(self.dir.join("log/mariadb.stdout"))?;
        let mut cmd = Command::new("mariadbd");
        cmd.args(["--no-defaults", "--user=mysql", "--bind-address=127.0.0.1", "--skip-name-resolve"])
            .arg(&datadir)
            .arg(format!("--socket={}", self.mariadb_socket().display()))
            .arg(format!("--pid-file={}", db.join("mariadbd.pid").display()))
            .arg(format!("--port={MARIADB_PORT}"))
            .args(["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M", "--skip-log-bin"]);
        self.spawn("mariadbd", cmd, log)?;
        let socket = format!("--socket={}", self.mariadb_socket().display());
        let answers = || {
            Command::new("mariadb-admin")
                .args(["--no-defaults", &socket, "-u", "root", "ping"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !wait_until(Duration::from_secs(30), answers) {
            return err(format!(
                "MariaDB did not answer on {}:\n{}",
                self.mariadb_socket().display(),
                tail(&self.dir.join("log/mariadb.stdout"), 15)
            ));
        }
        run(Command::new("mariadb").args(["--no-defaults", &socket, "-u", "root", "-e"]).arg(
            // slurmdbd 24.11+ on MariaDB 11.8 dies at its first start unless the database exists.
            "CREATE DATABASE IF NOT EXISTS slurm_acct_db; \
             CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'lab'; \
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';",
        ))?;

        let d = self.dir.display();
        let conf = self.dir.join("etc/slurmdbd.conf");
        fs::write(
            &conf,
            format!(
                "AuthType=auth/munge\nDbdHost=localhost\nDbdPort={SLURMDBD_PORT}\nSlurmUser=root\n\
                 LogFile={d}/log/slurmdbd.log\nPidFile={d}/run/slurmdbd.pid\nDebugLevel=info\n\
                 StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={MARIADB_PORT}\n\
                 StorageUser=slurm\nStoragePass=lab\nStorageLoc=slurm_acct_db\nPrivateData=jobs\n"
            ),
        )?;
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o600))?;
        let log = fs::File::create(self.dir.join("log/slurmdbd.stdout"))?;
        let mut cmd = self.daemon_command("slurmdbd");
        cmd.arg("-D");
        self.spawn("slurmdbd", cmd, log)?;
        let mut last = String::new();
        let up = wait_until(Duration::from_secs(60), || {
            match run(self.command("sacctmgr").args(["-n", "-P", "show", "cluster"])) {
                Ok(_) => true,
                Err(e) => {
                    last = e.0;
                    false
                }
            }
        });
        if !up {
            return err(format!(
                "slurmdbd did not answer: {last}\n--- slurmdbd log ---\n{}",
                tail(&self.dir.join("log/slurmdbd.log"), 15)
            ));
        }
        for args in [
            vec!["add", "cluster", "lab"],
            vec!["add", "account", "lab", "Description=lab", "Organization=lab"],
            vec!["add", "user", "root", "Account=lab"],
        ] {
            run(self.command("sacctmgr").arg("-i").args(&args))?;
        }
        Ok(())
    }

    fn munge_answers() -> bool {
        let Ok(mut munge) =
            Command::new("munge").arg("-n").stdout(Stdio::piped()).stderr(Stdio::null()).spawn()
        else {
            return false;
        };
        let Some(cred) = munge.stdout.take() else { return false };
        let ok = Command::new("unmunge")
            .stdin(cred)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        munge.wait().is_ok_and(|s| s.success()) && ok
    }

    fn ensure_munge(&mut self) -> Result<()> {
        if Self::munge_answers() {
            return Ok(());
        }
        if !Path::new("/etc/munge/munge.key").exists() {
            run(Command::new("mungekey").args(["--create", "--keyfile=/etc/munge/munge.key"]))?;
            run(Command::new("chown").args(["munge:munge", "/etc/munge/munge.key"]))?;
        }
        run(Command::new("install").args(["-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"]))?;
        let log = fs::File::create(self.dir.join("log/munged.log"))?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=munge", "--regid=munge", "--init-groups", "munged", "--foreground"]);
        self.spawn("munged", cmd, log)?;
        if !wait_until(Duration::from_secs(10), Self::munge_answers) {
            return err(format!("munged did not answer; see {}", self.dir.join("log/munged.log").display()));
        }
        Ok(())
    }

    fn make_network(&self) -> Result<()> {
        record(&format!("link {BRIDGE}"))?;
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{CTLD_ADDR}/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for (i, node) in self.nodes.iter().enumerate() {
            let ns = format!("{PREFIX}-{node}");
            let veth = format!("{PREFIX}-v{}", i + 1);
            record(&format!("netns {ns}"))?;
            record(&format!("link {veth}"))?;
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["link", "set", &veth, "master", BRIDGE, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", Self::node_addr(i)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn spawn(&mut self, name: &str, mut cmd: Command, log: fs::File) -> Result<()> {
        let child = cmd
            .env("SLURM_CONF", self.slurm_conf())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| LabError(format!("cannot start {name}: {e}")))?;
        let pid = child.id();
        record(&format!("pid {pid} {} {name}", start_time(pid).unwrap_or(0)))?;
        self.daemons.push(Daemon { name: name.to_owned(), child });
        Ok(())
    }

    fn start_daemons(&mut self) -> Result<()> {
        let out = fs::File::create(self.dir.join("log/slurmctld.stdout"))?;
        let mut ctld = self.daemon_command("slurmctld");
        ctld.args(["-D", "-c", "-i"]);
        self.spawn("slurmctld", ctld, out)?;
        for node in self.nodes.clone() {
            let out = fs::File::create(self.dir.join(format!("log/slurmd-{node}.stdout")))?;
            // Each node sees its own <lab>/topology (the GPU table the plugin
            // reads), its own hosts file and its own hostname; with valgrind,
            // its own slurmstepd too.
            let stepd = if self.cfg.valgrind_stepd { self.valgrind_stepd()? } else { String::new() };
            let hosts = self.dir.join("etc/hosts");
            let own = self.node_topology_dir(&node);
            let shared = self.topology_dir();
            let mut script = format!("mount --bind {} /etc/hosts && ", hosts.display());
            let _ = write!(script, "mount --bind {} {} && ", own.display(), shared.display());
            let exec = match &self.root {
                None => "exec slurmd -D".to_owned(),
                Some(root) => {
                    // The root sees the node's own files too.
                    let _ = write!(
                        script,
                        "mount --bind {} {} && mount --bind {} {} && ",
                        hosts.display(),
                        root.inside(Path::new("/etc/hosts")).display(),
                        own.display(),
                        root.inside(&shared).display()
                    );
                    format!("exec chroot {} slurmd -D", root.path.display())
                }
            };
            let _ = write!(script, "{stepd}hostname {node} && {exec}");
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net=/run/netns/{PREFIX}-{node}")).args([
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ]);
            self.spawn(&format!("slurmd-{node}"), cmd, out)?;
        }
        Ok(())
    }

    /// A wrapper that runs the real slurmstepd under valgrind, and the mount
    /// command (for a node's private mount namespace) that puts it where
    /// slurmd executes slurmstepd from.
    fn valgrind_stepd(&self) -> Result<String> {
        let real = fs::canonicalize("/usr/sbin/slurmstepd")?;
        let copy = self.dir.join("bin/slurmstepd.real");
        if !copy.exists() {
            fs::copy(&real, &copy)?;
        }
        let wrapper = self.dir.join("bin/slurmstepd-valgrind");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec valgrind --quiet --num-callers=30 --log-file={}/log/valgrind-%p.log {} \"$@\"\n",
                self.dir.display(),
                copy.display()
            ),
        )?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
        Ok(format!("mount --bind {} {} && ", wrapper.display(), real.display()))
    }

    /// Waits until every node is exactly `idle`.
    ///
    /// # Errors
    /// The deadline passed; the message has each node's state and the tail of the logs.
    pub fn wait_idle(&mut self, timeout: Duration) -> Result<()> {
        let mut last = String::new();
        let ok = wait_until(timeout, || {
            if let Some(dead) = self.dead_daemon() {
                last = format!("{dead} exited");
                return true;
            }
            last = self.node_states().map(|s| format!("{s:?}")).unwrap_or_else(|e| e.0);
            self.nodes.iter().all(|n| self.node_state(n).is_ok_and(|s| s == "idle"))
        });
        if ok && !last.contains("exited") {
            return Ok(());
        }
        let node = &self.nodes[0];
        err(format!(
            "nodes not idle after {timeout:?}: {last}\n--- slurmctld log ---\n{}\n--- slurmd log ---\n{}\n\
             --- slurmd stdout ---\n{}",
            tail(&self.slurmctld_log(), 15),
            tail(&self.slurmd_log(node), 15),
            tail(&self.dir.join(format!("log/slurmd-{node}.stdout")), 10)
        ))
    }

    /// The first spawned daemon that has exited, if any.
    fn dead_daemon(&mut self) -> Option<String> {
        self.daemons
            .iter_mut()
            .filter(|d| d.name.starts_with("slurm") || d.name == "munged")
            .find_map(|d| (!matches!(d.child.try_wait(), Ok(None))).then(|| d.name.clone()))
    }

    /// Whether every daemon the lab started is still running.
    pub fn daemons_alive(&mut self) -> bool {
        self.dead_daemon().is_none()
    }

    /// The PID of a node's slurmd.
    pub fn slurmd_pid(&self, node: &str) -> Option<u32> {
        self.daemons.iter().find(|d| d.name == format!("slurmd-{node}")).map(|d| d.child.id())
    }

    /// Starts a long-running program inside a node (its network, hostname and
    /// hosts file), logging to `log/NAME.log`. It is stopped by [`Lab::stop`]
    /// or [`Lab::stop_daemon`].
    ///
    /// # Errors
    /// The node is unknown or the program cannot start.
    pub fn spawn_on(
        &mut self,
        node: &str,
        name: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        let mut cmd = self.command_on(node, program)?;
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let log = fs::File::create(self.dir.join(format!("log/{name}.log")))?;
        self.spawn(name, cmd, log)
    }

    /// Stops one program started with [`Lab::spawn_on`] (SIGTERM, then SIGKILL).
    pub fn stop_daemon(&mut self, name: &str) {
        if let Some(pos) = self.daemons.iter().position(|d| d.name == name) {
            let mut d = self.daemons.remove(pos);
            kill(d.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(d.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                sleep(Duration::from_millis(20));
            }
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }

    /// The PID of a program started with [`Lab::spawn_on`].
    pub fn daemon_pid(&self, name: &str) -> Option<u32> {
        self.daemons.iter().find(|d| d.name == name).map(|d| d.child.id())
    }

    /// A command with the lab's `SLURM_CONF`, run in the lab's Slurm root
    /// when it has one (through `bin/in-root`), and ended (TERM, then KILL
    /// 10 s later, to its whole process group) past the limit
    /// [`Lab::limit_commands`] set: a test waits on a cluster that went wrong
    /// for that long, not forever.
    pub fn command(&self, program: &str) -> Command {
        let Some(limit) = self.command_limit else { return self.daemon_command(program) };
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=10").arg(limit.as_secs().max(1).to_string());
        if self.root.is_some() {
            cmd.arg(self.dir.join("bin/in-root"));
        }
        cmd.arg(program);
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd
    }

    /// [`Lab::command`] without a time limit: for daemons and interactive shells.
    pub fn daemon_command(&self, program: &str) -> Command {
        let mut cmd = match &self.root {
            None => Command::new(program),
            Some(_) => {
                let mut c = Command::new(self.dir.join("bin/in-root"));
                c.arg(program);
                c
            }
        };
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd
    }

    /// From now on, every [`Lab::command`] is ended after `limit`; its exit
    /// status is then 124 (TERM) or 137 (KILL), as `timeout(1)` reports it.
    pub fn limit_commands(&mut self, limit: Duration) {
        self.command_limit = Some(limit);
    }

    /// A command run inside a node (its network, hostname and hosts file).
    ///
    /// # Errors
    /// The node is not part of the lab.
    pub fn command_on(&self, node: &str, program: &str) -> Result<Command> {
        let Some(pid) = self.slurmd_pid(node) else { return err(format!("no node {node}")) };
        let mut cmd = Command::new("nsenter");
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd.args(["-t", &pid.to_string(), "-n", "-u", "-m"]);
        if self.root.is_some() {
            cmd.arg(self.dir.join("bin/in-root"));
        }
        cmd.arg(program);
        Ok(cmd)
    }

    /// Long state of each node as `sinfo` shows it (`idle`, `drained`, ...).
    ///
    /// # Errors
    /// sinfo failed.
    pub fn node_states(&self) -> Result<Vec<(String, String)>> {
        let out = run(self.command("sinfo").args(["-h", "-N", "-o", "%N %T"]))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(n, s)| (n.to_owned(), s.trim().to_owned())))
            .collect())
    }

    /// Long state of one node.
    ///
    /// # Errors
    /// sinfo failed or does not list the node.
    pub fn node_state(&self, node: &str) -> Result<String> {
        self.node_states()?
            .into_iter()
            .find(|(n, _)| n == node)
            .map(|(_, s)| s)
            .ok_or_else(|| LabError(format!("sinfo does not list {node}")))
    }

    /// Submits a batch script (`#SBATCH` lines included); output goes to
    /// `out/JOBID.out` in the lab. Returns the job id.
    ///
    /// # Errors
    /// sbatch refused the job; the error has its stderr.
    pub fn sbatch(&self, script: &str, extra_args: &[&str]) -> Result<u32> {
        let out_pattern = self.dir.join("out/%j.out");
        let mut child = self
            .command("sbatch")
            .arg("--parsable")
            .arg(format!("--output={}", out_pattern.display()))
            .args(extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return err(format!("sbatch failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| LabError(format!("sbatch printed no job id: {text}")))
    }

    /// Waits for a job to end and returns its final state (`COMPLETED`, `FAILED`, ...).
    ///
    /// # Errors
    /// The job did not end in time.
    ///
    /// A job still `COMPLETING` at the deadline has ended and waits for its
    /// nodes' epilog answer; when a terminate request or its answer is lost,
    /// slurmctld resends it once the job has been completing for
    /// KillWait + 2 x MessageTimeout (50 s here), at its job purge of every
    /// 60 s (`_list_find_job_old`, job_mgr.c). Such a job gets that long
    /// (2 minutes) again, with one line saying so: a Slurm hiccup it recovers
    /// from is no failure of the case, a job that never finishes is.
    pub fn wait_job(&self, job: u32, timeout: Duration) -> Result<String> {
        let state_now = || {
            run(self.command("scontrol").args(["show", "job", "-o", &job.to_string()]))
                .map(|out| field(&String::from_utf8_lossy(&out.stdout), "JobState").unwrap_or_default())
                .unwrap_or_default()
        };
        let ended = |s: &str| !matches!(s, "" | "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING");
        let mut state = String::new();
        // Each ask is an RPC to slurmctld: 4 a second, not 20, so that a
        // loaded 2-core machine's controller is not kept busy answering them.
        let every = Duration::from_millis(250);
        let mut done = wait_every(every, timeout, || {
            state = state_now();
            ended(&state)
        });
        let mut waited = timeout;
        if !done && state == "COMPLETING" {
            let resend = Duration::from_secs(120);
            println!(
                "(job {job} still COMPLETING after {timeout:?}: waiting {resend:?} more for Slurm's resend)"
            );
            done = wait_every(every, resend, || {
                state = state_now();
                ended(&state)
            });
            waited += resend;
            if done {
                println!("(job {job} ended {state} after the wait)");
            }
        }
        if done {
            Ok(state)
        } else {
            err(format!("job {job} still {state} after {waited:?}\n{}", self.job_report(job)))
        }
    }

    /// What the lab knows of a job that did not end: Slurm's record of it, the
    /// log lines that name it, and the processes left on the nodes. Short enough
    /// to read in a CI excerpt.
    pub fn job_report(&self, job: u32) -> String {
        let record = run(self.command("scontrol").args(["show", "job", "-o", &job.to_string()]))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| e.0);
        let keep = ["JobState", "Reason", "NodeList", "BatchHost", "RunTime", "EndTime", "ExitCode"];
        let record: Vec<&str> = record
            .split_whitespace()
            .filter(|w| keep.iter().any(|k| w.starts_with(&format!("{k}="))))
            .collect();
        let mut out = format!("--- job {job}: {} ---\n", record.join(" "));
        let needles = [
            format!("JobId={job} "),
            format!("job {job} "),
            format!("StepId={job}."),
            format!("job{job}"),
            format!("{job}.batch"),
            format!("{job}.extern"),
        ];
        let mut logs: Vec<PathBuf> = self.nodes.iter().map(|n| self.slurmd_log(n)).collect();
        logs.push(self.slurmctld_log());
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> =
                text.lines().filter(|l| needles.iter().any(|n| l.contains(n.as_str()))).collect();
            let name = log.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let _ = writeln!(out, "--- {name}: {} lines name it, the last 12 ---", lines.len());
            for l in &lines[lines.len().saturating_sub(12)..] {
                let _ = writeln!(out, "{l}");
            }
        }
        let ps = Command::new("ps")
            .args(["-eo", "pid,ppid,stat,wchan:20,etimes,args", "--sort=pid"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // Every slurmstepd and what runs under it: a job that does not end has one left.
        let rows: Vec<(u32, u32, &str)> = ps
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?, l))
            })
            .collect();
        let parent: std::collections::HashMap<u32, u32> = rows.iter().map(|&(p, pp, _)| (p, pp)).collect();
        let is_stepd: std::collections::HashSet<u32> =
            rows.iter().filter(|r| r.2.contains("slurmstepd")).map(|r| r.0).collect();
        let under_stepd = |mut pid: u32| {
            for _ in 0..64 {
                if is_stepd.contains(&pid) {
                    return true;
                }
                match parent.get(&pid) {
                    Some(&pp) if pp > 1 => pid = pp,
                    _ => return false,
                }
            }
            false
        };
        let steps: Vec<&str> = rows.iter().filter(|r| under_stepd(r.0)).map(|r| r.2).collect();
        let _ = writeln!(out, "--- slurmstepd and its processes ({}) ---", steps.len());
        for l in steps.iter().take(25) {
            let _ = writeln!(out, "{l}");
        }
        out
    }

    /// The output file of a batch job.
    pub fn job_output(&self, job: u32) -> String {
        fs::read_to_string(self.dir.join(format!("out/{job}.out"))).unwrap_or_default()
    }

    /// Tears the lab down: see the crate docs. Idempotent.
    ///
    /// # Errors
    /// Something could not be removed; everything else was still tried.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        // Cancel jobs while the controller still runs, so steps end cleanly.
        if self.dead_daemon().is_none() {
            let _ = self.command("scancel").args(["--quiet", "--partition=debug"]).status();
        }
        for daemon in self.daemons.iter_mut().rev() {
            kill(daemon.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(daemon.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                sleep(Duration::from_millis(50));
            }
            if matches!(daemon.child.try_wait(), Ok(None)) {
                let _ = daemon.child.kill();
                let _ = daemon.child.wait();
            }
        }
        self.daemons.clear();
        if self.keep_dir {
            // Forget the directory so cleanup leaves it.
            let text = fs::read_to_string(STATE_FILE).unwrap_or_default();
            let kept: String =
                text.lines().filter(|l| !l.starts_with("dir ")).map(|l| format!("{l}\n")).collect();
            fs::write(STATE_FILE, kept)?;
        }
        cleanup_recorded()
    }

    /// What is left behind by this lab after [`stop`](Self::stop): namespaces,
    /// links, device files or daemons. Empty when teardown was complete.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        if let Ok(entries) = fs::read_dir("/run/netns") {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(PREFIX) {
                    left.push(format!("netns {name}"));
                }
            }
        }
        if Path::new("/sys/class/net").join(BRIDGE).exists() {
            left.push(format!("link {BRIDGE}"));
        }
        if !self.keep_dir && self.dir.join("cdev").exists() {
            left.push(format!("devices in {}", self.dir.join("cdev").display()));
        }
        for cgroup in &self.cgroups {
            if cgroup.exists() {
                left.push(format!("cgroup {}", cgroup.display()));
            }
        }
        if Path::new(STATE_FILE).exists() {
            left.push(STATE_FILE.to_owned());
        }
        if let Some(root) = &self.root {
            if release::mounted_below(&root.path) {
                left.push(format!("mounts in {}", root.path.display()));
            }
        }
        left
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("slurm-lab: teardown: {e}");
        }
    }
}

/// The value of `Key=` in `scontrol show ... -o` output.
pub fn field(text: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    text.split_whitespace().find_map(|w| w.strip_prefix(&prefix)).map(str::to_owned)
}

/// The last `n` lines of a file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `$SLURM_LAB_MOUNTS`: more host directories (`:`-separated) a lab on a
/// Debian root mounts read-only at their own paths, for what its jobs run
/// (the framework suite's virtualenv and job scripts). The host's lab needs
/// none: its nodes see the host's files.
pub fn extra_mounts() -> Vec<PathBuf> {
    std::env::var("SLURM_LAB_MOUNTS")
        .unwrap_or_default()
        .split(':')
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The cargo profile directory (`target/debug`) of the running executable,
/// where `cargo build` put the workspace's binaries and libraries.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/e2e-HASH or target/<profile>/slurm-lab
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Where `cargo build` put the plugin. `SPANK_GPU_PLUGIN` overrides it (to
/// test an installed package).
pub fn built_plugin() -> PathBuf {
    std::env::var_os("SPANK_GPU_PLUGIN").map_or_else(|| profile_dir().join("libspank_gpu.so"), PathBuf::from)
}

/// The slurm.conf line and topology.conf of a topology whose first switch
/// (or block) holds node2: `"tree"` or `"block"` (23.11+). For a lab of its
/// own: `LabConfig { extra_conf: vec![line], topology_conf: Some(conf), .. }`
/// (`slurm-lab shell --topology KIND`). 26.05 numbers a job's tasks in
/// that order, so Slurm's task 0 is on node2.
pub fn reversed_topology(kind: &str) -> (String, String) {
    let conf = match kind {
        "block" => "BlockName=b0 Nodes=node2\nBlockName=b1 Nodes=node1\n",
        _ => "SwitchName=s0 Nodes=node2\nSwitchName=s1 Nodes=node1\nSwitchName=top Switches=s[0-1]\n",
    };
    (format!("TopologyPlugin=topology/{kind}"), conf.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_reads_scontrol_words() {
        let text = "JobId=5 JobName=x JobState=COMPLETED Reason=None";
        assert_eq!(field(text, "JobState").as_deref(), Some("COMPLETED"));
        assert_eq!(field(text, "Nope"), None);
    }

    #[test]
    fn start_time_of_self_is_known_and_stable() {
        let me = std::process::id();
        let t = start_time(me);
        assert!(t.is_some());
        assert_eq!(t, start_time(me));
        assert!(alive(me, t.unwrap_or(0)));
    }
}
