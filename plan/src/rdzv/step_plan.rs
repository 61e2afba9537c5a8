//! The step's plan: the values every task of the step shares (`MASTER_ADDR`,
//! the port and where it came from), from the admin's and the user's
//! [`Settings`].

use crate::ports::{DEFAULT_PORT_RANGE, PortRange, derive_port, last_reserved_port};

use super::step::{RdzvError, Step};

/// The admin's and the user's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `port_range=` from the plugstack line.
    pub port_range: PortRange,
    /// `--auto-rdzv=port=N`.
    pub port: Option<u16>,
    /// Environment defaults from the plugstack line (`TORCH_NCCL_ASYNC_ERROR_HANDLING=1`, ...).
    /// [`Settings::new`] leaves the interface variables out: they are
    /// `iface_vars`, per node.
    pub env_defaults: Vec<(String, String)>,
    /// `NCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME` for this task on this
    /// node, with why: name, value, why ([`crate::netif::for_task`]).
    pub iface_vars: Vec<(String, String, String)>,
    /// `resv_ports=on`: use the last port Slurm reserved for the step.
    pub resv_ports: bool,
    /// `SLURM_VERSION_NUMBER` of the Slurm the plugin was built for (the one
    /// it runs in): the warnings' advice differs by release. 0 when unknown
    /// (the advice for 22.05).
    pub slurm_version: u32,
}

impl Settings {
    /// The settings of a step: the admin's plugstack line, the user's
    /// `--auto-rdzv=port=N` and the Slurm release. The interface variables'
    /// site defaults are not among `env_defaults`: each node checks them
    /// against its interfaces, and each task against NCCL's files
    /// ([`crate::netif::node_offers`], [`Settings::with_interfaces`]).
    pub fn new(cfg: &crate::plugstack::PluginConfig, port: Option<u16>, slurm_version: u32) -> Settings {
        Settings {
            port_range: cfg.port_range,
            port,
            env_defaults: cfg
                .env_defaults
                .iter()
                .filter(|(n, _)| !crate::netif::is_interface_var(n))
                .cloned()
                .collect(),
            iface_vars: Vec::new(),
            resv_ports: cfg.resv_ports,
            slurm_version,
        }
    }

    /// The settings with this task's interface variables.
    #[must_use]
    pub fn with_interfaces(mut self, task: &crate::netif::TaskIfaces) -> Settings {
        self.iface_vars =
            task.set.iter().map(|o| (o.name.to_owned(), o.value.clone(), o.why.clone())).collect();
        self
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            port_range: DEFAULT_PORT_RANGE,
            port: None,
            env_defaults: Vec::new(),
            iface_vars: Vec::new(),
            resv_ports: false,
            slurm_version: 0,
        }
    }
}

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
    let master_addr = step.master_name()?;
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
