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
//! on a node, runs in that root (commands with `chroot`, each node's slurmd
//! after `pivot_root` into it, which Apptainer needs), the lab's work
//! directory and the build tree mounted inside at their own paths, so paths
//! mean the same inside and out. munged and MariaDB are the host's.
//!
//! Here: the [`Lab`] and its bring-up; [`setup`] what a lab is made of
//! ([`LabConfig`], [`TaskSetup`]), `conf` its configuration files, `daemons`
//! its daemons and namespaces, `commands` the Slurm commands and jobs run
//! against it, `cleanup` the state file and teardown, `process` small process
//! helpers; [`release`] the Debian roots of other Slurm releases, [`agents`]
//! the node agents and their fake NVML, [`record`] and [`record_jobs`] the
//! recorders of fixtures; [`containers`] pyxis, enroot and their images.

pub mod agents;
mod apptainer;
mod cleanup;
mod commands;
mod conf;
pub mod containers;
mod daemons;
mod process;
pub mod record;
pub mod record_jobs;
pub mod release;
pub mod setup;

pub use cleanup::cleanup_recorded;
pub use process::timed_out_note;
pub use release::{RELEASES, Release, Root};
pub use setup::{LabConfig, TaskSetup, real_cpu_layout};

use cleanup::*;
use process::*;

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
/// The bridge of the nodes' second network, the "fabric" (issue 30): node N
/// is `10.78.0.1N` on an interface named differently on each node
/// ([`Lab::fabric_interface`]); the controller is not on it.
const FABRIC_BRIDGE: &str = "sglab1";
/// The fabric's network, for `nccl_socket_net=`.
pub const FABRIC_NET: &str = "10.78.0.0/24";
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
        if cfg.containers.is_some() && !cfg.release.runs_containers() {
            return err(format!(
                "pyxis and enroot run on the host's Slurm and on a root with enroot's tools; Slurm {}'s has none",
                cfg.release
            ));
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
            // Each node's /run/spank-gpu (the job records, DCGM exporter's
            // files, the agent's live summaries), root's 0755 as on a node.
            let run = self.node_run_dir(node);
            fs::create_dir_all(&run)?;
            fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
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

    /// Fake GPUs per node.
    pub fn gpus_per_node(&self) -> u32 {
        self.cfg.gpus_per_node
    }

    /// CPUs each node advertises to Slurm.
    pub fn cpus_per_node(&self) -> u32 {
        self.node_cpus.0
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

    /// Where a node's `/run/spank-gpu` really is, as the host sees it (each
    /// node sees its own there).
    pub fn node_run_dir(&self, node: &str) -> PathBuf {
        self.dir.join(format!("nodes/{node}/run-spank-gpu"))
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
}
