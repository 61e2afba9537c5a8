//! What a lab is made of: the task plugin setup and [`LabConfig`].

use crate::*;

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
    /// pyxis and enroot on every node (host's Slurm only), see [`crate::containers`].
    pub containers: Option<crate::containers::ContainerConfig>,
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
            containers: None,
        }
    }
}
