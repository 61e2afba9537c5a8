//! The step as Slurm describes it to a task: its environment and SPANK items
//! read into a [`Step`], the task's own [`Task`], the id of the batch step,
//! and the plugin's record as far as reading the step needs it.

use std::fmt;

use slurm_formats::hostlist;
use slurm_formats::step_id::BATCH_STEP;

use crate::record::{RECORD_VAR, recorded_cpus_per_task};

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
    /// What a launcher in the task starts one process per (`PET_NPROC_PER_NODE`).
    pub gpus: Option<u32>,
    /// CPUs of the task's own mask, when it has one (bound by `--gpu-affinity`
    /// or by Slurm per task); `None` when the local tasks share the step's CPUs.
    pub bound_cpus: Option<u32>,
    /// When `--gpu-affinity` bound the task to its share of the GPUs it sees
    /// (every local task sees every GPU and uses its share by local rank,
    /// [`crate::binding::TaskShare::visible_share`]), the GPUs of that share,
    /// fewer than [`Task::gpus`]. Only `OMP_NUM_THREADS` divides by it (the
    /// task runs one process per GPU of its share, on its share's CPUs);
    /// everything else counts the GPUs it sees. `None`: not bound to a share.
    pub share_gpus: Option<u32>,
}

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

    /// The name of `MASTER_ADDR`'s node ([`Step::master_node`]) in the node list.
    ///
    /// # Errors
    /// The node list cannot be read, or is shorter than that index.
    pub fn master_name(&self) -> Result<String, RdzvError> {
        match self.master_node() {
            0 => hostlist::first(&self.node_list).map_err(RdzvError::NodeList),
            n => {
                let nodes = hostlist::expand(&self.node_list).map_err(RdzvError::NodeList)?;
                nodes.get(n as usize).cloned().ok_or(RdzvError::Inconsistent {
                    node_id: n,
                    nnodes: self.nnodes,
                    ntasks: self.ntasks,
                })
            }
        }
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
