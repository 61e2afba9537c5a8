//! What one task gets: [`task_env`], the single computation behind both the
//! plugin's `task_init` and `spank-gpu explain`. Each gathers the inputs
//! its own way (SPANK items and seams; a task's environment and files) and
//! applies or prints the result; neither assembles a plan of its own.

use slurm_formats::cpuset::CpuSet;

use super::{RECORD_VAR, RdzvError, Settings, Step, Task, TaskPlan, count_gpus, plan_step, plan_task};
use crate::binding::{self, SlurmTask};
use crate::devices::DeviceView;
use crate::netif::{self, ConfRead, Offers, TaskIfaces};

/// What the task's CPU mask tells the plan (`OMP_NUM_THREADS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mask {
    /// `--gpu-affinity` bound it to `cpus` CPUs, and, where it bound it to a
    /// share of the GPUs it sees, to a share of `share_gpus` GPUs.
    Bound { cpus: u32, share_gpus: Option<u32> },
    /// The mask it has from Slurm (or its user): its own only where Slurm
    /// bound each local task to its own part of the step's CPUs.
    Own(CpuSet),
    /// Unknown: the task counts its share of the node's CPUs.
    Unknown,
}

/// The node's interface offers for the step (`nccl_socket_net`, `verbose`),
/// worked out once per node ([`netif::node_offers`]).
#[derive(Clone, Copy, Debug)]
pub struct NodeOffers<'a> {
    pub offers: &'a Offers,
    /// `/etc/nccl.conf`'s `NCCL_SOCKET_IFNAME`.
    pub site_conf: &'a ConfRead,
}

/// One task's inputs, as its caller read them.
#[derive(Clone, Debug)]
pub struct TaskInput<'a> {
    pub step: &'a Step,
    /// The plugstack line's settings and the step's port word; the interface
    /// variables are added here.
    pub settings: Settings,
    /// The first node's `NodeAddr` or `NodeHostname` (`master_addr=`), with
    /// which of them it is; `None`: the node name.
    pub master_addr: Option<(String, &'static str)>,
    /// `SLURM_LOCALID`.
    pub local_id: u32,
    /// `SLURM_PROCID`.
    pub global_id: u32,
    pub mask: Mask,
    /// The node's offers, where the plugstack line or `verbose` asked.
    pub net: Option<NodeOffers<'a>>,
}

/// What the task gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEnv {
    /// The task as planned.
    pub task: Task,
    /// Its variables, each with why, and its record.
    pub plan: TaskPlan,
    /// Its interface variables: those to remove, the problem to log.
    pub ifaces: TaskIfaces,
}

/// Plans one task. `env` answers the task's environment as the plan must see
/// it (the plugin: from before any container changed it); `user_conf` reads
/// `~/.nccl.conf` when the interface offers need it.
///
/// # Errors
/// The step cannot be planned (its node list, its port range).
pub fn task_env(
    input: TaskInput<'_>,
    env: &dyn Fn(&str) -> Option<String>,
    user_conf: &mut dyn FnMut() -> ConfRead,
) -> Result<TaskEnv, RdzvError> {
    let TaskInput { step, mut settings, master_addr, local_id, global_id, mask, net } = input;
    let mut plan = plan_step(step, &settings)?;
    if let Some((addr, which)) = master_addr {
        plan = plan.with_master_addr(addr, which);
    }
    let ifaces = net.map(|net| {
        let record = env(RECORD_VAR);
        netif::for_task(net.offers, env, record.as_deref(), net.site_conf, user_conf)
    });
    if let Some(ifaces) = &ifaces {
        settings = settings.with_interfaces(ifaces);
    }
    let (bound_cpus, share_gpus) = match mask {
        Mask::Bound { cpus, share_gpus } => (Some(cpus), share_gpus),
        Mask::Own(own) => {
            let cpus = u32::try_from(own.len()).unwrap_or(u32::MAX);
            let slurm_task = SlurmTask {
                local_id,
                local_tasks: step.local_tasks,
                step_gpus: None,
                env,
                own,
                slurm_version: settings.slurm_version,
                devices: DeviceView::Unknown,
            };
            (binding::step_cpus(&slurm_task).1.then_some(cpus), None)
        }
        Mask::Unknown => (None, None),
    };
    let task = Task {
        local_id,
        global_id,
        gpus: count_gpus(env("CUDA_VISIBLE_DEVICES").as_deref()),
        bound_cpus,
        share_gpus,
    };
    let plan = plan_task(step, &plan, &settings, &task, env);
    Ok(TaskEnv { task, plan, ifaces: ifaces.unwrap_or_default() })
}
