//! What the plugin does in each SPANK hook, written against the [`Spank`]
//! seam. Hooks are thin: read inputs, call `task-plan`, apply the result.
//!
//! Every hook returns `Result<(), HookError>`; the FFI guard turns that into
//! Slurm's return code. Only a [`HookError::User`] in srun, sbatch or salloc
//! fails anything (the submit); everything else is logged and the job goes on.

use std::fmt;

use slurm_formats::cpuset::CpuSet;
use slurm_formats::hostlist;
use task_plan::binding::{self, Binding, SlurmTask};
use task_plan::gputable::{self, GpuTable, TABLE_FILE};
use task_plan::layout;
use task_plan::netif;
use task_plan::nodeaddr::{self, MasterAddr};
use task_plan::options::{self, AutoRdzv, GpuAffinity, UserOption};
use task_plan::plugstack::{Hook, PluginConfig};
use task_plan::ports::{self, PortRange};
use task_plan::rdzv::{self, Items, Settings, Step, container};
use task_plan::topology::Topology;

use crate::spank::{Context, Item, Level, Node, Spank};

/// Why a hook did not finish its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookError {
    /// The user asked for something invalid. Fails the submit in srun, sbatch
    /// and salloc; only logged anywhere else.
    User(String),
    /// The plugin's own fault. Always logged, never fails anything.
    Internal(String),
    /// The user asked for the task to fail on this problem
    /// (`--auto-rdzv=strict`): fails it before it runs, in slurmstepd.
    FailStep(String),
}

impl fmt::Display for HookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookError::User(m) | HookError::Internal(m) | HookError::FailStep(m) => f.write_str(m),
        }
    }
}

/// What `--gpu-affinity` reads once per step, before the tasks fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTopology {
    /// The node's GPU table.
    pub table: GpuTable,
    /// The machine the binding plans on: the table's machine records, or
    /// what its GPU rows tell (`degraded`).
    pub topology: Topology,
    /// The table is an older agent's (version 1 or 2, no machine records):
    /// each task gets its GPUs' whole local CPUs, not a share of them.
    pub degraded: bool,
    /// The step's GPUs on this node (`SLURM_STEP_GPUS` before the tasks fork;
    /// slurmstepd rewrites it per task when it binds GPUs per task).
    pub step_gpus: Option<Vec<u32>>,
    /// The `--cpu-bind` the user gave srun (`SLURM_CPU_BIND_TYPE` before the
    /// tasks fork; task/affinity sets it in every task whatever the user gave).
    pub user_cpu_bind: Option<String>,
    /// The node's share-out, planned here for what the step's environment
    /// and slurmstepd's CPU mask predict; each task whose own share and step
    /// CPUs are the same takes its CPUs from it instead of planning the
    /// node again ([`binding::plan_slurm_task_with`]).
    pub node_share_out: Option<binding::NodeShareOut>,
    /// Local task 0's binding as planned here, when the plugin will bind it:
    /// its CPU count and the GPUs of its share
    /// ([`binding::TaskShare::visible_share`]), for the `OMP_NUM_THREADS`
    /// set before the fork ([`task_plan::rdzv::PRESET_PER_TASK`]).
    pub first_task: Option<(u32, Option<u32>)>,
    /// Whether a device constraint can be in force for the step's tasks
    /// (task/cgroup with `ConstrainDevices`, or not known): only then does
    /// each task probe its GPUs' device files ([`task_plan::devices`]).
    pub devices_constrainable: bool,
}

/// What `user_init` learns once per step, before the tasks fork, for every
/// task of the step: the FFI module keeps it and hands it to `task_init`.
/// `D` is the node's handle on the GPU device directory ([`Node::DevDir`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepState<D> {
    /// The plugstack line, parsed.
    pub config: PluginConfig,
    /// The GPU table and topology, when `--gpu-affinity` is in force and they
    /// could be read.
    pub topology: Option<StepTopology>,
    /// Why they could not be read (logged once; `--gpu-affinity=verbose`
    /// tells each task).
    pub topology_problem: Option<String>,
    /// The GPU device directory, opened here in the host's mount namespace
    /// for the tasks' device probes, when `--gpu-affinity` is in force and
    /// it could be opened: by `task_init` a container plugin may have moved
    /// the task into a mount namespace whose `/dev` is not the host's.
    pub dev_dir: Option<D>,
    /// A problem to tell the user on the first task's stderr (a taken port).
    pub note: Option<String>,
    /// The first node's NodeHostname/NodeAddr (`master_addr=hostname|addr`).
    pub master_addr: Option<String>,
    /// With `--auto-rdzv=strict`, why this node's tasks must fail before
    /// they run (a taken port): `task_init` fails with it.
    pub fail_step: Option<String>,
    /// With `--auto-rdzv`, the job's values of the names the plugin sets,
    /// before the tasks fork: what a container (pyxis listed before spank_gpu)
    /// changes after it is told apart from the user's ([`container`]).
    pub before_fork: Option<container::Snapshot>,
    /// With `--auto-rdzv`, when pyxis runs the step in a container: what it
    /// was asked (its options as slurmstepd holds them).
    pub pyxis: Option<container::PyxisStep>,
    /// With `pyxis`, slurmstepd's mount namespace here before the fork
    /// (`None`: it could not be read): a task still in it by `task_init`
    /// has pyxis's `task_init` to come ([`container::pyxis_runs_after`]).
    pub mount_ns: Option<container::MountNs>,
    /// With `--auto-rdzv`, when the plugstack line asks for interface
    /// variables or the user for `verbose`: the node's interfaces, what the
    /// plugin may set for NCCL and gloo here, and what its tasks need to
    /// decide.
    pub net: Option<StepNet>,
    /// The options in force for the step, read once here (`None`: Slurm
    /// could not say; each task asks again).
    pub options: Option<StepOptions>,
    /// The step's command line (`S_JOB_ARGV`), read once here.
    pub argv: Option<Vec<String>>,
    /// With `--auto-rdzv`, the variables set here in the job's environment,
    /// before the fork, with their values: those whose value is the same in
    /// every task of the node (`MASTER_ADDR`, `WORLD_SIZE`, ...,
    /// [`task_plan::rdzv::is_step_wide`]), and local task 0's value of those
    /// usually the same ([`task_plan::rdzv::PRESET_PER_TASK`]). Each task
    /// inherits them; its `task_init` plans as before and sets only what
    /// differs ([`rendezvous::set_task_env`]).
    pub preset: Vec<(String, String)>,
}

/// The plugin's options in force for a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOptions {
    /// `--auto-rdzv`, or the admin's default.
    pub auto_rdzv: Option<AutoRdzv>,
    /// `--gpu-affinity`, or the admin's default.
    pub gpu_affinity: Option<GpuAffinity>,
}

/// What `user_init` learns of the node's network for `--auto-rdzv`, once
/// per step before the tasks fork: the interfaces are read here, in
/// slurmstepd (the node's network namespace), never per task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepNet {
    /// The interfaces, the offers, `/etc/nccl.conf`'s value, gloo's host name.
    pub node: task_plan::netif::NodeNet,
    /// The job's user and that user's passwd home, where each task reads
    /// `~/.nccl.conf` as the user; `Err`: why it cannot be known.
    pub home: Result<(u32, String), String>,
}

/// Whether debug builds accept the test-only plugstack keys.
const DEBUG_HOOKS: bool = cfg!(debug_assertions);

/// Parses the plugstack words. Only `slurm_spank_init` reports a bad line
/// (once per process); the other hooks then quietly do nothing.
fn config<S: Spank + Node>(sp: &S, args: &[String], report: bool) -> Option<PluginConfig> {
    match PluginConfig::parse(args, DEBUG_HOOKS) {
        Ok(cfg) => Some(cfg),
        Err(e) => {
            if report {
                sp.log(Level::Error, &format!("{e}; the plugin does nothing until this is fixed"));
            }
            None
        }
    }
}

/// The debug-only way to prove the guard: panics when the plugstack line says so.
fn maybe_panic(cfg: &PluginConfig, hook: Hook) {
    if DEBUG_HOOKS && cfg.panics_in(hook) {
        panic!("debug_panic={hook} requested on the plugstack line");
    }
}

/// `slurm_spank_init_post_opt`: in slurmstepd, with spank_gpu listed before
/// pyxis, asks pyxis to keep the plugin's values through its import
/// ([`rendezvous::keep_through_pyxis`]); nothing in other contexts.
///
/// # Errors
/// [`HookError::Internal`] when Slurm cannot say which options are in force.
pub fn init_post_opt<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    if sp.context() != Context::Remote {
        return Ok(());
    }
    let Some(cfg) = config(sp, args, false) else { return Ok(()) };
    rendezvous::keep_through_pyxis(sp, &cfg)
}

/// `slurm_spank_job_prolog`: as root, before the job's first step on this
/// node, records which of its GPUs the job holds ([`jobmap::prolog`]).
/// Never fails: a failing prolog drains the node.
///
/// # Errors
/// None; the `Result` is the guard's signature.
pub fn job_prolog<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    if sp.context() == Context::JobScript {
        if let Some(cfg) = config(sp, args, false) {
            jobmap::prolog(sp, &cfg);
        }
    }
    Ok(())
}

/// `slurm_spank_job_epilog`: as root, at the job's end on this node, removes
/// its record ([`jobmap::epilog`]). Never fails.
///
/// # Errors
/// None; the `Result` is the guard's signature.
pub fn job_epilog<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    if sp.context() == Context::JobScript {
        if let Some(cfg) = config(sp, args, false) {
            jobmap::epilog(sp, &cfg);
        }
    }
    Ok(())
}

/// `slurm_spank_init`, every context: registers the options, so they show in
/// `--help` and work on `#SBATCH` lines, and checks the plugstack line.
///
/// # Errors
/// [`HookError::Internal`] when Slurm refused an option.
pub fn init<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    let mut failed = Vec::new();
    for option in UserOption::ALL {
        if let Err(e) = sp.register_option(option) {
            failed.push(format!("{option}: {e}"));
        }
    }
    if let Some(cfg) = config(sp, args, true) {
        maybe_panic(&cfg, Hook::Init);
        if sp.context() == Context::Slurmd {
            check_port_range(sp, cfg.port_range);
        }
        lint::at_submit(sp, &cfg)?;
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(HookError::Internal(format!("cannot register options: {}", failed.join("; "))))
    }
}

/// Warns (in the slurmd log, once at slurmd start) when the admin's port
/// range shares ports with the node's ephemeral ports (outgoing connections
/// could take a rendezvous port between its check and its bind), and notes
/// reserved ports inside it.
fn check_port_range<S: Spank + Node>(sp: &S, range: PortRange) {
    let ephemeral = sp.sysctl("net/ipv4/ip_local_port_range").and_then(|t| ports::parse_ephemeral_range(&t));
    if let Some(eph) = ephemeral.filter(|e| e.overlaps(range)) {
        sp.log(
            Level::Error,
            &format!(
                "port_range={range} overlaps this node's ip_local_port_range {eph}: \
                 rendezvous ports can be taken by outgoing connections; move port_range below {}",
                eph.lo
            ),
        );
    }
    // Reserved ports are kept for services that bind them: a step whose
    // derived port is one of them may find it held (the bind check then says so).
    let reserved =
        sp.sysctl("net/ipv4/ip_local_reserved_ports").and_then(|t| ports::parse_reserved_ports(&t));
    for r in reserved.unwrap_or_default().into_iter().filter(|r| r.overlaps(range)) {
        sp.log(
            Level::Info,
            &format!("port_range={range} includes ports reserved for services ({r}); steps given one of them may find it in use"),
        );
    }
}

/// The option callback. In srun, sbatch and salloc a bad argument fails the
/// submit with one line; in slurmstepd the argument is read again where it is
/// used, so nothing happens here. Idempotent: Slurm may call it twice.
///
/// # Errors
/// [`HookError::User`] for a bad argument.
pub fn option_callback(ctx: Context, option: UserOption, arg: Option<&str>) -> Result<(), HookError> {
    if !ctx.is_submit() {
        return Ok(());
    }
    options::validate(option, options::from_slurm(arg)).map_err(|e| HookError::User(e.to_string()))
}
/// `slurm_spank_user_init`, slurmstepd before the tasks are forked: works out
/// once per step what every task needs and returns it as a [`StepState`]
/// (`None` when the plugstack line is unusable; `init` reported it): the parsed
/// plugstack line, then each feature's part ([`affinity::load_for_step`],
/// [`rendezvous::prepare_step`]). Each feature fails alone: its trouble is
/// one log line, and the other feature's part is kept.
///
/// # Errors
/// None today: every feature's failure is logged here (the type stays for the guard).
pub fn user_init<S: Spank + Node>(
    sp: &mut S,
    args: &[String],
) -> Result<Option<StepState<S::DevDir>>, HookError> {
    let Some(config) = config(sp, args, false) else { return Ok(None) };
    maybe_panic(&config, Hook::UserInit);
    let mut state = StepState {
        config,
        topology: None,
        topology_problem: None,
        dev_dir: None,
        note: None,
        master_addr: None,
        fail_step: None,
        before_fork: None,
        pyxis: None,
        mount_ns: None,
        net: None,
        options: None,
        argv: sp.command().ok(),
        preset: Vec::new(),
    };
    state.options = match (
        rendezvous::auto_rdzv(sp, &state.config, None),
        affinity::gpu_affinity(sp, &state.config, None),
    ) {
        (Ok(auto_rdzv), Ok(gpu_affinity)) => Some(StepOptions { auto_rdzv, gpu_affinity }),
        _ => None,
    };
    let auto_rdzv = state.options.and_then(|o| o.auto_rdzv);
    rendezvous::drop_unused_keep_list(sp, &state.config, auto_rdzv);
    if let Err(e) = affinity::load_for_step(sp, &mut state) {
        sp.log(Level::Error, &format!("--gpu-affinity: {e}; tasks keep Slurm's CPU binding"));
        state.topology_problem = Some(e.to_string());
    }
    match rendezvous::prepare_step(sp, &mut state) {
        Ok(step_wide) => state.preset = rendezvous::set_step_wide(sp, step_wide),
        Err(e) => sp.log(
            Level::Error,
            &format!("--auto-rdzv: {e}; no port check for this step, each task plans alone"),
        ),
    }
    Ok(Some(state))
}

pub use rendezvous::local_user_init;

/// The options of `option` in force for this step: the user's option wins
/// over the admin's default (`admin_on`). A bad argument (it can only get here
/// through a hand-made environment) is logged and treated as off.
fn option_in_force<S: Spank, T: Default>(
    sp: &S,
    option: UserOption,
    admin_on: bool,
    parse: fn(Option<&str>) -> Result<Option<T>, options::OptionError>,
) -> Result<Option<T>, HookError> {
    let arg = sp.option_arg(option).map_err(|e| HookError::Internal(format!("reading {option}: {e}")))?;
    match arg {
        None => Ok(admin_on.then(T::default)),
        Some(arg) => parse(options::from_slurm(Some(&arg))).or_else(|e| {
            sp.log(Level::Error, &format!("{e}; ignoring the option"));
            Ok(None)
        }),
    }
}
fn item<S: Spank + Node>(sp: &S, item: Item) -> Result<u32, HookError> {
    sp.item(item).map_err(|e| HookError::Internal(format!("reading {item:?}: {e}")))
}

fn env<S: Spank + Node>(sp: &S, name: &str) -> Option<String> {
    sp.getenv(name).ok().flatten()
}

/// The plugin's own fault from an I/O error.
fn internal(e: std::io::Error) -> HookError {
    HookError::Internal(e.to_string())
}

fn env_u32<S: Spank + Node>(sp: &S, name: &str) -> Option<u32> {
    env(sp, name).and_then(|v| v.trim().parse().ok())
}

/// What the step is: the environment Slurm gives the task, with the SPANK
/// items where it says nothing ([`Step::from_env`], shared with `spank-gpu
/// explain`). Before fork (`in_task == false`) the per-task variables are not
/// set yet and the items stand in for them.
fn read_step<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    in_task: bool,
    argv: Option<&[String]>,
) -> Result<Step, HookError> {
    let items = Items {
        job_id: Some(item(sp, Item::JobId)?),
        step_id: Some(item(sp, Item::StepId)?),
        nnodes: Some(item(sp, Item::NNodes)?),
        node_id: Some(item(sp, Item::NodeId)?),
        ntasks: Some(item(sp, Item::TotalTaskCount)?),
        local_tasks: Some(item(sp, Item::LocalTaskCount)?),
        cpus_per_task: Some(item(sp, Item::StepCpusPerTask)?),
    };
    let lookup = |name: &str| match name {
        "SLURM_STEP_NODELIST" | "SLURM_JOB_NODELIST" if DEBUG_HOOKS && cfg.debug_nodelist.is_some() => {
            cfg.debug_nodelist.clone()
        }
        "SLURM_NODEID" | "SLURM_PROCID" if !in_task => None,
        _ => env(sp, name),
    };
    let mut step = Step::from_env(&lookup, &items).map_err(|e| HookError::Internal(e.to_string()))?;
    step.argv = argv.map_or_else(|| command(sp), <[String]>::to_vec);
    Ok(step)
}

/// The step's command line (`S_JOB_ARGV`): whether it runs an MPI launcher's
/// daemon ([`Step::mpi_daemon`]), and the launcher flags that beat a
/// variable ([`task_plan::launcher`]). Unknown, it is empty: none is seen.
fn command<S: Spank + Node>(sp: &S) -> Vec<String> {
    sp.command().unwrap_or_default()
}

/// The MPI launcher daemon this step runs (its command, `S_JOB_ARGV`, as
/// `user_init` read it when it could), if it runs one ([`task_plan::launcher`]).
fn mpi_daemon<S: Spank + Node>(sp: &S, argv: Option<&[String]>) -> Option<&'static str> {
    let daemon = |argv: &[String]| argv.first().and_then(|argv0| task_plan::launcher::mpi_daemon(argv0));
    argv.map_or_else(|| daemon(&command(sp)), daemon)
}
/// `slurm_spank_task_init`, in each forked task before `exec`: decides the
/// task's binding ([`affinity::plan`]), sets its rendezvous, rank and thread
/// environment ([`rendezvous::set_task_env`]), then binds it
/// ([`affinity::apply`]). `OMP_NUM_THREADS` counts the CPUs the task is bound
/// to, divided by the GPUs of its share ([`affinity::Bound`]); should the
/// binding then fail (or the kernel trim the mask), the variables are planned
/// again for the mask the task has. The binding comes last because moving the task to its CPUs makes
/// each `spank_setenv` after it dearer (Slurm maps and frees a 256 KiB buffer
/// for each: at 64 tasks per node on the lab, two of them took 28 us after the
/// move and 12 us before it). Each feature fails alone, with one log line,
/// and never keeps the other from applying.
///
/// # Errors
/// [`HookError::FailStep`] only: `--auto-rdzv=strict` asked for it.
pub fn task_init<S: Spank + Node>(
    sp: &mut S,
    args: &[String],
    state: Option<&StepState<S::DevDir>>,
) -> Result<(), HookError> {
    let parsed;
    let cfg = match state {
        Some(state) => &state.config,
        None => {
            let Some(cfg) = config(sp, args, false) else { return Ok(()) };
            parsed = cfg;
            &parsed
        }
    };
    maybe_panic(cfg, Hook::TaskInit);
    let pending = affinity::plan(sp, cfg, state);
    let planned = pending.as_ref().map_or(affinity::Bound::No, affinity::Pending::bound);
    // The record an enclosing step left, for a second pass: the first replaces it.
    let record = pending.as_ref().and_then(|_| env(sp, rdzv::RECORD_VAR));
    let set = rendezvous::set_task_env(sp, cfg, state, planned, &rendezvous::Pass::First);
    if let Some(pending) = pending {
        let bound = affinity::apply(sp, cfg, pending);
        if bound != planned && set.is_ok() {
            // OMP_NUM_THREADS and the record count the mask the task has.
            let again = rendezvous::Pass::Again { record };
            let _ = rendezvous::set_task_env(sp, cfg, state, bound, &again);
        }
    }
    match set {
        Err(HookError::FailStep(why)) => Err(HookError::FailStep(why)),
        Err(e) => {
            sp.log(Level::Error, &format!("--auto-rdzv: {e}; nothing set for this task"));
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// A debug build's injected failure of a call to the node (`debug_fail=SEAM`
/// on the plugstack line), for the end-to-end tests of what still works.
fn injected(cfg: &PluginConfig, seam: &str) -> std::io::Result<()> {
    if DEBUG_HOOKS && cfg.fails(seam) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("Invalid argument (debug_fail={seam})"),
        ));
    }
    Ok(())
}

mod affinity;
mod jobmap;
mod lint;
mod rendezvous;

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests;
