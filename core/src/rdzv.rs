//! `--auto-rdzv`: the rendezvous, rank and thread environment of one task.
//!
//! Inputs are plain values (the plugin reads them from SPANK items, `spank-gpu
//! explain` from a task's `SLURM_*` environment); the output is the list of
//! variables to set, each with the reason, and the ones kept because the user
//! set them. Nothing here reads the environment itself.
//!
//! ## The port
//! In this order: `--auto-rdzv=port=N` (an explicit word beats anything
//! inherited); the user's `MASTER_PORT`; with `resv_ports=on` on the plugstack
//! line, the last port Slurm reserved for the step (`SLURM_STEP_RESV_PORTS`,
//! with `MpiParams=ports=`: mpi/cray_shasta hands the first one to PMI as
//! `PMI_CONTROL_PORT`, and Slurm reserves one more than the tasks per node),
//! except in heterogeneous steps, whose components have ports of their own;
//! else the step's derived port (see [`crate::ports`]). Reserved ports are
//! opt-in: with `MpiParams=ports=` Slurm 22.05 reserves ports for steps that
//! did not ask (an srun in a batch script), so the port would change with the
//! site's MPI setup, and the batch script could not announce it.
//!
//! ## "Set by the user"
//! A value already in the task's environment is kept, except when it is one
//! this plugin set in an enclosing step (a batch script's values reach the
//! `srun` steps inside it). The plugin records what it set, as names and short
//! value hashes, in [`RECORD_VAR`]; a variable whose value still matches the
//! record is recomputed for the new step, one the user changed is kept.

use std::fmt;

use crate::hostlist;
use crate::ports::{DEFAULT_PORT_RANGE, PortRange, derive_port, last_reserved_port};

/// The variable in which the plugin records what it set.
pub const RECORD_VAR: &str = "SPANK_GPU_SET";

/// The record's item that keeps the step's CPUs per task.
const RECORD_CPUS_PER_TASK: &str = "cpus_per_task=";

/// The step's CPUs per task kept in a record of [`RECORD_VAR`].
pub fn recorded_cpus_per_task(record: &str) -> Option<u32> {
    record.split(',').find_map(|item| item.strip_prefix(RECORD_CPUS_PER_TASK)?.parse().ok())
}

/// Every variable the plugin computes per task ([`plan_task`] and
/// [`RECORD_VAR`]): none can be a site default. A test checks this list
/// against what `plan_task` sets.
pub const COMPUTED_VARS: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NPROC_PER_NODE",
    "OMP_NUM_THREADS",
    // The launchers' names for the same rendezvous point (crate::launcher::VARS).
    "PET_RDZV_ENDPOINT",
    "PET_RDZV_ID",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_PORT",
    RECORD_VAR,
];

/// `SLURM_TASKS_PER_NODE` / `SLURM_STEP_TASKS_PER_NODE` (`2(x3),1`) as one
/// count per node. At most `max_nodes` entries are produced.
pub fn parse_tasks_per_node(text: &str, max_nodes: usize) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for item in text.trim().split(',') {
        let (count, times) = match item.split_once("(x") {
            Some((c, rest)) => (c, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (item, 1),
        };
        let count: u32 = count.trim().parse().ok()?;
        if out.len() + times > max_nodes {
            return None;
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Some(out)
}

/// Number of GPUs in a `CUDA_VISIBLE_DEVICES`-style list (indices or UUIDs).
/// `None` for an unset value; 0 for an empty one or `NoDevFiles`.
pub fn count_gpus(list: Option<&str>) -> Option<u32> {
    let list = list?.trim();
    if list.is_empty() || list == "NoDevFiles" || list == "-1" {
        return Some(0);
    }
    u32::try_from(list.split(',').filter(|s| !s.trim().is_empty()).count()).ok()
}

/// What the step is, as Slurm sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Job id.
    pub job_id: u32,
    /// Step id (the batch step is 0xfffffffb).
    pub step_id: u32,
    /// A heterogeneous step (`srun A : B`): the counts, ids and node list are
    /// the whole step's; Slurm's reserved ports are per component, so unused.
    pub het: bool,
    /// The step's node list expression (`SLURM_STEP_NODELIST`).
    pub node_list: String,
    /// Nodes in the step.
    pub nnodes: u32,
    /// This node's index in the step, 0-based.
    pub node_id: u32,
    /// Tasks in the step.
    pub ntasks: u32,
    /// Tasks of the step on this node.
    pub local_tasks: u32,
    /// CPUs Slurm gave each task of the step.
    pub cpus_per_task: u32,
    /// `SLURM_STEP_RESV_PORTS`, when Slurm reserved ports.
    pub resv_ports: Option<String>,
    /// The job's CPUs per task (`SLURM_CPUS_PER_TASK` from sbatch), for the
    /// "srun did not inherit --cpus-per-task" warning.
    pub job_cpus_per_task: Option<u32>,
    /// GPUs the job has on this node (`SLURM_JOB_GPUS`/`SLURM_GPUS_ON_NODE`),
    /// for the "one task per node sees one GPU" warning.
    pub job_gpus_on_node: Option<u32>,
    /// CPUs the step has on this node (`SLURM_CPUS_ON_NODE`): what unbound
    /// tasks share.
    pub cpus_on_node: Option<u32>,
    /// The step's tasks on each node, in node-index order
    /// (`SLURM_STEP_TASKS_PER_NODE`), for ranks in node order (see
    /// [`crate::layout`]).
    pub tasks_per_node: Option<Vec<u32>>,
    /// The entries of `SLURM_GTIDS`: the tasks of this step (of this
    /// component, in a heterogeneous step) on this node.
    pub local_gtids: Option<u32>,
    /// The step's node indices in the order of their first task, when srun's
    /// plugin said Slurm's task 0 is not on node 0 ([`crate::layout::TASK_ORDER_VAR`]):
    /// then `RANK` is `SLURM_PROCID` and `MASTER_ADDR` task 0's node.
    pub task_order: Option<Vec<u32>>,
    /// The step's command line (`S_JOB_ARGV` in the plugin; `explain`'s own
    /// or the one it is given), set by the caller: whether the step runs an
    /// MPI launcher's daemons ([`Step::mpi_daemon`]), and the launcher flags
    /// that beat a variable (see [`crate::launcher`]). Empty when unknown.
    pub argv: Vec<String>,
}

/// What the SPANK items say about the step; `None` where there is no item
/// (`spank-gpu explain` has none and reads only the environment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Items {
    /// `S_JOB_ID`.
    pub job_id: Option<u32>,
    /// `S_JOB_STEPID`.
    pub step_id: Option<u32>,
    /// `S_JOB_NNODES` (per het component).
    pub nnodes: Option<u32>,
    /// `S_JOB_NODEID` (per het component).
    pub node_id: Option<u32>,
    /// `S_JOB_TOTAL_TASK_COUNT` (per het component).
    pub ntasks: Option<u32>,
    /// `S_JOB_LOCAL_TASK_COUNT`.
    pub local_tasks: Option<u32>,
    /// `S_STEP_CPUS_PER_TASK`.
    pub cpus_per_task: Option<u32>,
}

/// One task of the step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Task {
    /// Rank on this node (`SLURM_LOCALID`).
    pub local_id: u32,
    /// Slurm's number of the task in the step (`SLURM_PROCID`). `RANK` is
    /// the task's place in node order, which differs from it when Slurm laid
    /// the tasks out in another order (see [`crate::layout`]).
    pub global_id: u32,
    /// GPUs the task sees (`CUDA_VISIBLE_DEVICES`); `None` when it has none set.
    pub gpus: Option<u32>,
    /// CPUs of the task's own mask, when it has one (bound by `--gpu-affinity`
    /// or by Slurm per task); `None` when the local tasks share the step's CPUs.
    pub bound_cpus: Option<u32>,
}

/// The admin's and the user's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `port_range=` from the plugstack line.
    pub port_range: PortRange,
    /// `--auto-rdzv=port=N`.
    pub port: Option<u16>,
    /// Environment defaults from the plugstack line (`NCCL_SOCKET_IFNAME=ib0`, ...).
    pub env_defaults: Vec<(String, String)>,
    /// `resv_ports=on`: use the last port Slurm reserved for the step.
    pub resv_ports: bool,
    /// `SLURM_VERSION_NUMBER` of the Slurm the plugin was built for (the one
    /// it runs in): the warnings' advice differs by release. 0 when unknown
    /// (the advice for 22.05).
    pub slurm_version: u32,
}

impl Settings {
    /// The settings of a step: the admin's plugstack line, the user's
    /// `--auto-rdzv=port=N` and the Slurm release.
    pub fn new(cfg: &crate::plugstack::PluginConfig, port: Option<u16>, slurm_version: u32) -> Settings {
        Settings {
            port_range: cfg.port_range,
            port,
            env_defaults: cfg.env_defaults.clone(),
            resv_ports: cfg.resv_ports,
            slurm_version,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            port_range: DEFAULT_PORT_RANGE,
            port: None,
            env_defaults: Vec::new(),
            resv_ports: false,
            slurm_version: 0,
        }
    }
}

/// Slurm's step id of a batch script.
pub const BATCH_STEP: u32 = 0xffff_fffb;

impl Step {
    /// The step as Slurm describes it to a task: the environment slurmstepd
    /// sets before `task_init` (Slurm's env.c `setup_env` and
    /// `env_array_for_step`), with the SPANK items where a variable is missing.
    ///
    /// In a heterogeneous step the environment is the whole step's
    /// (`SLURM_JOB_ID` is the leader's, `SLURM_PROCID`, `SLURM_NODEID`,
    /// `SLURM_STEP_NUM_TASKS/NODES` and `SLURM_STEP_NODELIST` span every
    /// component) while the items are per component, so the environment wins.
    /// The batch step describes the whole job (see [`Step::is_batch`]).
    ///
    /// # Errors
    /// The node list or this node's index is missing.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>, items: &Items) -> Result<Step, RdzvError> {
        let num = |key: &str| env(key).and_then(|v| v.trim().parse::<u32>().ok());
        let step_id = items.step_id.or_else(|| match env("SLURM_STEP_ID").as_deref().map(str::trim) {
            None | Some("batch") => Some(BATCH_STEP),
            Some(s) => s.parse().ok(),
        });
        let step_id = step_id.ok_or(RdzvError::BadStepId)?;
        let missing = RdzvError::Missing;
        let node_list = env("SLURM_STEP_NODELIST")
            .filter(|_| step_id != BATCH_STEP)
            .or_else(|| env("SLURM_JOB_NODELIST"))
            .ok_or_else(|| missing("SLURM_STEP_NODELIST"))?;
        let node_id = num("SLURM_NODEID").or(items.node_id).ok_or_else(|| missing("SLURM_NODEID"))?;
        let nnodes =
            num("SLURM_STEP_NUM_NODES").or_else(|| num("SLURM_NNODES")).or(items.nnodes).unwrap_or(1);
        let ntasks =
            num("SLURM_STEP_NUM_TASKS").or_else(|| num("SLURM_NTASKS")).or(items.ntasks).unwrap_or(1);
        let local_tasks = items.local_tasks.unwrap_or_else(|| {
            env("SLURM_STEP_TASKS_PER_NODE")
                .or_else(|| env("SLURM_TASKS_PER_NODE"))
                .and_then(|t| parse_tasks_per_node(&t, 1 << 20))
                .and_then(|v| v.get(node_id as usize).copied())
                .unwrap_or(1)
        });
        let cpus_on_node = num("SLURM_CPUS_ON_NODE");
        // The item, else what the plugin recorded in this task (`spank-gpu
        // explain` in a task the plugin set up), else the step's CPUs here
        // shared by its tasks.
        let cpus_per_task = items
            .cpus_per_task
            .or_else(|| env(RECORD_VAR).as_deref().and_then(recorded_cpus_per_task))
            .or_else(|| cpus_on_node.map(|c| c / local_tasks.max(1)))
            .unwrap_or(1)
            .max(1);
        let job_id = num("SLURM_JOB_ID").or(items.job_id).ok_or_else(|| missing("SLURM_JOB_ID"))?;
        let het = items.ntasks.is_some_and(|n| n != ntasks) || items.nnodes.is_some_and(|n| n != nnodes);
        // srun's word on where task 0 is, for this very step; a het step's node
        // indices are per component, so it keeps node order.
        let task_order = env(crate::layout::TASK_ORDER_VAR)
            .filter(|_| !het && step_id != BATCH_STEP)
            .and_then(|t| crate::layout::parse_task_order(&t, job_id, step_id, nnodes));
        Ok(Step {
            job_id,
            step_id,
            het,
            node_list,
            nnodes,
            node_id,
            ntasks,
            local_tasks,
            cpus_per_task,
            resv_ports: env("SLURM_STEP_RESV_PORTS"),
            job_cpus_per_task: num("SLURM_CPUS_PER_TASK"),
            job_gpus_on_node: count_gpus(env("SLURM_JOB_GPUS").as_deref()),
            cpus_on_node,
            tasks_per_node: env("SLURM_STEP_TASKS_PER_NODE")
                .filter(|_| step_id != BATCH_STEP)
                .and_then(|t| parse_tasks_per_node(&t, nnodes as usize)),
            local_gtids: env("SLURM_GTIDS").as_deref().and_then(crate::layout::count_gtids),
            task_order,
            argv: Vec::new(),
        })
    }

    /// The index of `MASTER_ADDR`'s node: task 0's when srun said where it
    /// is, else the step's first node.
    pub fn master_node(&self) -> u32 {
        self.task_order.as_deref().and_then(|o| o.first().copied()).unwrap_or(0)
    }

    /// This node's `NODE_RANK`: its place in the order of first tasks when
    /// srun gave it, else its index.
    pub fn node_rank(&self) -> u32 {
        self.task_order
            .as_deref()
            .and_then(|o| o.iter().position(|n| *n == self.node_id))
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(self.node_id)
    }

    /// The rank of local task `local_id` in node order, when the step's
    /// layout says it ([`crate::layout::node_order_rank`]).
    pub fn node_order_rank(&self, local_id: u32) -> Option<u32> {
        let counts = self.tasks_per_node.as_deref()?;
        let rank = crate::layout::node_order_rank(
            counts,
            self.node_id,
            self.nnodes,
            self.ntasks,
            local_id,
            self.local_tasks,
        );
        // SLURM_GTIDS counts this process's step alone: it tells two het
        // components on one node apart where the local count cannot (explain).
        rank.filter(|_| self.local_gtids.is_none_or(|g| g == self.local_tasks))
    }

    /// Whether this is the batch script's step, where only what every task of
    /// every step shares is set (`MASTER_ADDR`, step 0's `MASTER_PORT`, site
    /// defaults), never per-task ranks: a `srun torchrun --node_rank=$NODE_RANK`
    /// expanded by the batch shell would make every node rank 0.
    pub fn is_batch(&self) -> bool {
        self.step_id == BATCH_STEP
    }

    /// Whether this step's tasks get no per-rank variables: the batch step,
    /// and an MPI launcher's daemons, whose every rank would inherit the
    /// daemon's (the node's) `RANK`, `LOCAL_RANK` and `PET_*`.
    pub fn shared_only(&self) -> bool {
        self.is_batch() || self.mpi_daemon().is_some()
    }

    /// The MPI launcher daemon the step runs (`mpirun`'s `srun prted`, see
    /// [`crate::launcher`]), whose ranks inherit what the daemon gets: its
    /// command's first word.
    pub fn mpi_daemon(&self) -> Option<&'static str> {
        self.argv.first().and_then(|argv0| crate::launcher::mpi_daemon(argv0))
    }
}

/// A step the plugin cannot compute values for, by kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdzvError {
    /// `SLURM_STEP_ID` is set but is not a step id.
    BadStepId,
    /// This variable is not set: not inside a job step.
    Missing(&'static str),
    /// The node list is not a hostlist, so it has no first node.
    NodeList(hostlist::HostlistError),
    /// The counts contradict each other.
    Inconsistent {
        /// This node's index.
        node_id: u32,
        /// Nodes in the step.
        nnodes: u32,
        /// Tasks in the step.
        ntasks: u32,
    },
}

impl fmt::Display for RdzvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdzvError::BadStepId => f.write_str("SLURM_STEP_ID is not a step id"),
            RdzvError::Missing(what) => write!(f, "{what} is not set: run this inside a job step"),
            RdzvError::NodeList(e) => write!(f, "cannot find MASTER_ADDR: {e}"),
            RdzvError::Inconsistent { node_id, nnodes, ntasks } => {
                write!(f, "inconsistent step: node {node_id} of {nnodes} nodes, {ntasks} tasks")
            }
        }
    }
}

impl std::error::Error for RdzvError {}

/// Where the port came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortSource {
    /// `--auto-rdzv=port=N`.
    Option,
    /// `SLURM_STEP_RESV_PORTS`.
    Reserved,
    /// Derived from the job and step ids.
    Derived,
}

/// The values every task of the step shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepPlan {
    /// First host of the step's node list (or its NodeHostname/NodeAddr,
    /// see [`StepPlan::with_master_addr`]).
    pub master_addr: String,
    /// Why that address.
    pub master_addr_why: String,
    /// The port, before any user `MASTER_PORT`.
    pub master_port: u16,
    /// Why that port.
    pub port_source: PortSource,
    /// One task per node: set torchrun's `PET_*` defaults.
    pub torchrun_layout: bool,
}

impl StepPlan {
    /// The plan with `MASTER_ADDR` given as another name of the first node
    /// (`master_addr=hostname|addr`, see [`crate::nodeaddr`]).
    #[must_use]
    pub fn with_master_addr(self, addr: String, which: &str) -> StepPlan {
        let why = format!("{} of the {}", which, self.master_addr_why);
        StepPlan { master_addr: addr, master_addr_why: why, ..self }
    }
}

/// Computes the shared values of a step.
///
/// # Errors
/// The node list is not a valid hostlist, or the counts are inconsistent.
pub fn plan_step(step: &Step, settings: &Settings) -> Result<StepPlan, RdzvError> {
    let master_addr = match step.master_node() {
        0 => hostlist::first(&step.node_list).map_err(RdzvError::NodeList)?,
        n => {
            let nodes = hostlist::expand(&step.node_list).map_err(RdzvError::NodeList)?;
            nodes.get(n as usize).cloned().ok_or(RdzvError::Inconsistent {
                node_id: n,
                nnodes: step.nnodes,
                ntasks: step.ntasks,
            })?
        }
    };
    // The batch step of a job submitted without `-n` has no task count
    // (slurmstepd's batch step takes the job's `num_tasks`, 0 when not
    // given, slurmstepd_job.c `batch_stepd_step_rec_create`), and needs none:
    // it gets no ranks.
    if step.nnodes == 0 || (step.ntasks == 0 && !step.is_batch()) || step.node_id >= step.nnodes {
        return Err(RdzvError::Inconsistent {
            node_id: step.node_id,
            nnodes: step.nnodes,
            ntasks: step.ntasks,
        });
    }
    // The batch step announces step 0's port, the one its first srun gets.
    let step_id = if step.is_batch() { 0 } else { step.step_id };
    let (master_port, port_source) = if let Some(p) = settings.port {
        (p, PortSource::Option)
    } else if let Some(p) =
        step.resv_ports.as_deref().filter(|_| settings.resv_ports && !step.het).and_then(last_reserved_port)
    {
        (p, PortSource::Reserved)
    } else {
        (derive_port(settings.port_range, step.job_id, step_id), PortSource::Derived)
    };
    let master_addr_why = if step.is_batch() {
        "first node of the job"
    } else if step.master_node() != 0 {
        "node of Slurm's task 0 (srun's layout of the step; not its first node)"
    } else {
        "first node of the step"
    }
    .to_owned();
    Ok(StepPlan {
        master_addr,
        master_addr_why,
        master_port,
        port_source,
        torchrun_layout: step.ntasks == step.nnodes && !step.shared_only(),
    })
}

/// Why a variable has the value it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Set by the plugin; the text says from what.
    Set(String),
    /// Already set by the user to this value; left alone.
    Kept(String),
    /// Not set: the step's command line gives this flag, which the variable
    /// would override or double (see [`crate::launcher`]).
    Left(&'static str),
}

/// One variable of a task's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Var {
    /// Its name.
    pub name: String,
    /// The value the plugin computed.
    pub value: String,
    /// Set or kept, and why.
    pub outcome: Outcome,
}

/// A task's whole plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskPlan {
    /// Every variable, in a stable order.
    pub vars: Vec<Var>,
    /// Warnings about the launch (shown once per node).
    pub warnings: Vec<String>,
    /// The step's CPUs per task as Slurm's item says (kept in the record: a
    /// task's environment does not say it, see [`Step::from_env`]).
    pub cpus_per_task: u32,
}

impl TaskPlan {
    /// The variables to set, with their values.
    pub fn to_set(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars
            .iter()
            .filter(|v| matches!(v.outcome, Outcome::Set(_)))
            .map(|v| (v.name.as_str(), v.value.as_str()))
    }

    /// The value of [`RECORD_VAR`] after this plan is applied.
    pub fn record(&self) -> String {
        let mut items: Vec<String> =
            self.to_set().map(|(n, v)| format!("{n}:{:04x}", short_hash(v))).collect();
        items.push(format!("{RECORD_CPUS_PER_TASK}{}", self.cpus_per_task));
        items.join(",")
    }

    /// The one line `--auto-rdzv=verbose` prints for a task.
    pub fn verbose_line(&self, task: &Task, host: &str) -> String {
        let set: Vec<String> = self
            .vars
            .iter()
            .filter_map(|v| match &v.outcome {
                Outcome::Set(why) if why.is_empty() => Some(format!("{}={}", v.name, v.value)),
                Outcome::Set(why) => Some(format!("{}={} ({why})", v.name, v.value)),
                Outcome::Kept(_) | Outcome::Left(_) => None,
            })
            .collect();
        let kept: Vec<String> = self
            .vars
            .iter()
            .filter_map(|v| match &v.outcome {
                Outcome::Kept(user) => Some(format!("{}={user} (set by you; mine: {})", v.name, v.value)),
                Outcome::Set(_) | Outcome::Left(_) => None,
            })
            .collect();
        let left: Vec<String> = self
            .vars
            .iter()
            .filter_map(|v| match &v.outcome {
                Outcome::Left(flag) => Some(format!("{} (your {flag} wins)", v.name)),
                Outcome::Set(_) | Outcome::Kept(_) => None,
            })
            .collect();
        let mut line = format!(
            "spank-gpu: task {} ({host} local {}): set {}",
            task.global_id,
            task.local_id,
            set.join(" ")
        );
        if !kept.is_empty() {
            line.push_str("; kept ");
            line.push_str(&kept.join(" "));
        }
        if !left.is_empty() {
            line.push_str("; not set ");
            line.push_str(&left.join(" "));
        }
        line
    }
}

/// A 16-bit FNV-1a hash, for the record of what the plugin set.
fn short_hash(value: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in value.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    // Fold to 16 bits; the truncation is the point.
    #[allow(clippy::cast_possible_truncation)]
    let folded = ((h >> 16) ^ (h & 0xffff)) as u16;
    folded
}

/// Whether `current` (the task's value of `name`) was set by the user, given
/// the plugin's record from an enclosing step.
pub fn user_set(name: &str, current: &str, record: Option<&str>) -> bool {
    let Some(record) = record else { return true };
    let mine = record.split(',').find_map(|item| {
        let (n, h) = item.split_once(':')?;
        (n == name).then(|| u16::from_str_radix(h, 16).ok()).flatten()
    });
    mine != Some(short_hash(current))
}

/// Computes one task's variables. `env` answers the task's current environment.
pub fn plan_task(
    step: &Step,
    plan: &StepPlan,
    settings: &Settings,
    task: &Task,
    env: &dyn Fn(&str) -> Option<String>,
) -> TaskPlan {
    let record = env(RECORD_VAR);
    let mut out = TaskPlan { cpus_per_task: step.cpus_per_task, ..TaskPlan::default() };
    // `explicit`: a plugin word the user gave for this step beats any value
    // already in the environment.
    let mut add = |name: &str, value: String, why: String, explicit: bool| {
        let outcome = outcome_of(env, record.as_deref(), name, why, explicit);
        out.vars.push(Var { name: name.to_owned(), value, outcome });
    };
    let explicit_port = plan.port_source == PortSource::Option;

    let port_why = match plan.port_source {
        PortSource::Option => "from --auto-rdzv=port".to_owned(),
        PortSource::Reserved => "last port Slurm reserved for this step".to_owned(),
        PortSource::Derived if step.is_batch() => {
            format!("job {} step 0 in {}: what the job's first srun gets", step.job_id, settings.port_range)
        }
        PortSource::Derived => {
            format!("job {} step {} in {}", step.job_id, step_name(step.step_id), settings.port_range)
        }
    };
    add("MASTER_ADDR", plan.master_addr.clone(), plan.master_addr_why.clone(), false);
    // With reserved ports, the batch script cannot know the port its steps get.
    if !(step.is_batch() && settings.resv_ports && !explicit_port) {
        add("MASTER_PORT", plan.master_port.to_string(), port_why, explicit_port);
    }
    if !step.shared_only() {
        let in_node_order = step.task_order.is_none().then(|| step.node_order_rank(task.local_id)).flatten();
        let (rank, rank_why) = match in_node_order {
            Some(rank) if rank != task.global_id => (
                rank,
                format!(
                    "in node order, so that rank 0 is on MASTER_ADDR's node; Slurm numbered this task \
                     SLURM_PROCID={}",
                    task.global_id
                ),
            ),
            Some(rank) => (rank, String::new()),
            None => (task.global_id, String::new()),
        };
        add("RANK", rank.to_string(), rank_why, false);
        add("WORLD_SIZE", step.ntasks.to_string(), String::new(), false);
        add("LOCAL_RANK", task.local_id.to_string(), String::new(), false);
        add("LOCAL_WORLD_SIZE", step.local_tasks.to_string(), String::new(), false);
        let node_rank_why = if step.task_order.is_some() {
            "this node's place in the order of first tasks (srun's layout of the step)".to_owned()
        } else {
            String::new()
        };
        add("NODE_RANK", step.node_rank().to_string(), node_rank_why, false);
        if plan.torchrun_layout {
            add("PET_NNODES", step.nnodes.to_string(), String::new(), false);
            add("PET_NODE_RANK", step.node_rank().to_string(), String::new(), false);
            add("PET_MASTER_ADDR", plan.master_addr.clone(), String::new(), false);
            add("PET_MASTER_PORT", plan.master_port.to_string(), String::new(), explicit_port);
            if let Some(gpus) = task.gpus.filter(|g| *g > 0) {
                add("PET_NPROC_PER_NODE", gpus.to_string(), "GPUs of the task".to_owned(), false);
            }
        }
        let (threads, why) = omp_threads(step, task);
        add("OMP_NUM_THREADS", threads.to_string(), why, false);
    }
    for (name, value) in &settings.env_defaults {
        add(name, value.clone(), "site default".to_owned(), false);
    }
    if step.shared_only() {
        return out;
    }
    add_launcher_vars(&mut out, step, plan, task, env, record.as_deref());

    if let Some(job_cpt) = step.job_cpus_per_task.filter(|c| *c > 1 && step.cpus_per_task == 1) {
        out.warnings.push(cpus_per_task_warning(job_cpt, settings.slurm_version));
    }
    if let (1, Some(1), Some(job_gpus)) = (step.local_tasks, task.gpus, step.job_gpus_on_node) {
        if job_gpus > 1 {
            out.warnings.push(format!(
                "the only task on this node sees 1 GPU but the job has {job_gpus} here \
                 (--gpus-per-task=1 with one task per node, as with torchrun): \
                 use --gpus-per-node={job_gpus} for the step"
            ));
        }
    }
    out
}

/// Set, or kept when the user set it (see "Set by the user" above); an
/// `explicit` plugin word beats any value already in the environment.
fn outcome_of(
    env: &dyn Fn(&str) -> Option<String>,
    record: Option<&str>,
    name: &str,
    why: String,
    explicit: bool,
) -> Outcome {
    match env(name) {
        Some(current) if !explicit && user_set(name, &current, record) => Outcome::Kept(current),
        _ => Outcome::Set(why),
    }
}

/// The launchers' variables ([`crate::launcher`]) for the rendezvous point
/// the task will see: `MASTER_ADDR` and `MASTER_PORT` as planned, or as the
/// user kept them, and the task's `RANK` (in node order) for JAX's warning.
fn add_launcher_vars(
    out: &mut TaskPlan,
    step: &Step,
    plan: &StepPlan,
    task: &Task,
    env: &dyn Fn(&str) -> Option<String>,
    record: Option<&str>,
) {
    let seen = |name: &str| {
        out.vars.iter().find(|v| v.name == name).map(|v| match &v.outcome {
            Outcome::Kept(user) => user.clone(),
            Outcome::Set(_) | Outcome::Left(_) => v.value.clone(),
        })
    };
    let addr = seen("MASTER_ADDR").unwrap_or_else(|| plan.master_addr.clone());
    let port = seen("MASTER_PORT").unwrap_or_else(|| plan.master_port.to_string());
    let rank = seen("RANK").and_then(|r| r.parse().ok()).unwrap_or(task.global_id);
    let point = crate::launcher::Point {
        addr: &addr,
        port: &port,
        job_id: step.job_id,
        step_id: step.step_id,
        launcher_layout: plan.torchrun_layout,
    };
    let explicit = plan.port_source == PortSource::Option;
    for v in crate::launcher::plan(&point, &step.argv) {
        let outcome = match v.given {
            Some(flag) => Outcome::Left(flag),
            None => outcome_of(env, record, v.name, v.why.to_owned(), explicit),
        };
        out.vars.push(Var { name: v.name.to_owned(), value: v.value, outcome });
    }
    out.warnings.extend(crate::launcher::jax_rank_warning(rank, task.global_id));
}

/// The release from which srun reads `SLURM_CPUS_PER_TASK` again, and no
/// longer `SRUN_CPUS_PER_TASK` (23.11: NEWS "Replace SRUN_CPUS_PER_TASK with
/// SLURM_CPUS_PER_TASK and get back the previous behavior before Slurm
/// 22.05", src/srun/opt.c's environment table). From 22.05 to 23.02 srun read
/// only `SRUN_CPUS_PER_TASK` (22.05 RELEASE_NOTES).
pub const SRUN_READS_SLURM_CPUS_PER_TASK_SINCE: u32 = (23 << 16) | (11 << 8);

/// The warning for a step with 1 CPU per task in a job that asked for
/// `job_cpt`, with the history and the fix of the release.
fn cpus_per_task_warning(job_cpt: u32, slurm_version: u32) -> String {
    if slurm_version >= SRUN_READS_SLURM_CPUS_PER_TASK_SINCE {
        format!(
            "this step has 1 CPU per task but the job asked for {job_cpt} (srun inherits \
             --cpus-per-task through SLURM_CPUS_PER_TASK since Slurm 23.11, so an option or variable \
             of this srun asked for fewer): run srun --cpus-per-task=$SLURM_CPUS_PER_TASK"
        )
    } else {
        format!(
            "this step has 1 CPU per task but the job asked for {job_cpt} (srun does not inherit \
             --cpus-per-task from Slurm 22.05 to 23.02): run srun --cpus-per-task=$SLURM_CPUS_PER_TASK, \
             or export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK in the batch script"
        )
    }
}

/// `OMP_NUM_THREADS`: the CPUs the task may use, divided by its GPUs (one
/// process per GPU). A task with a mask of its own counts that mask; tasks
/// that share the step's CPUs get an even share of the step's CPUs on the
/// node (so `--exclusive` or `--cpus-per-gpu` without `-c` is not 1).
fn omp_threads(step: &Step, task: &Task) -> (u32, String) {
    let plural = |n: u32, one: &str, many: &str| if n == 1 { one.to_owned() } else { many.to_owned() };
    let (cpus, what) = match (task.bound_cpus, step.cpus_on_node) {
        (Some(n), _) => (n, plural(n, "bound CPU", "bound CPUs")),
        (None, Some(on_node)) if on_node / step.local_tasks.max(1) > step.cpus_per_task => {
            let share = on_node / step.local_tasks.max(1);
            (share, format!("of the step's {on_node} CPUs here, {share} per task"))
        }
        (None, _) => (step.cpus_per_task, plural(step.cpus_per_task, "CPU per task", "CPUs per task")),
    };
    let what = if what.starts_with("of the") { what } else { format!("{cpus} {what}") };
    match task.gpus {
        Some(g) if g > 0 => ((cpus / g).max(1), format!("{what} / {g} GPU{}", if g == 1 { "" } else { "s" })),
        _ => (cpus.max(1), format!("{what}, no GPU")),
    }
}

/// A step id as Slurm prints it.
pub fn step_name(step_id: u32) -> String {
    match step_id {
        BATCH_STEP => "batch".to_owned(),
        0xffff_fffc => "extern".to_owned(),
        0xffff_fffa => "interactive".to_owned(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests;
