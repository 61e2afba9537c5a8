//! What the plugin does in each SPANK hook, written against the [`Spank`]
//! seam. Hooks are thin: read inputs, call `gpu-core`, apply the result.
//!
//! Every hook returns `Result<(), HookError>`; the FFI guard turns that into
//! Slurm's return code. Only a [`HookError::User`] in srun, sbatch or salloc
//! fails anything (the submit); everything else is logged and the job goes on.

use std::fmt;

use gpu_core::binding::{self, Binding, SlurmTask};
use gpu_core::cpuset::CpuSet;
use gpu_core::gputable::{self, GpuTable, TABLE_FILE, XML_FILE};
use gpu_core::hostlist;
use gpu_core::layout;
use gpu_core::nodeaddr::{self, MasterAddr, NodeNames};
use gpu_core::options::{self, AutoRdzv, GpuAffinity, UserOption};
use gpu_core::plugstack::{Hook, PluginConfig};
use gpu_core::ports::{self, PortRange};
use gpu_core::rdzv::{self, Items, Settings, Step, Task, container};
use gpu_core::topology;
use gpu_core::topology::Topology;

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
    /// The node's hwloc topology.
    pub topology: Topology,
    /// The step's GPUs on this node (`SLURM_STEP_GPUS` before the tasks fork;
    /// slurmstepd rewrites it per task when it binds GPUs per task).
    pub step_gpus: Option<Vec<u32>>,
    /// The `--cpu-bind` the user gave srun (`SLURM_CPU_BIND_TYPE` before the
    /// tasks fork; task/affinity sets it in every task whatever the user gave).
    pub user_cpu_bind: Option<String>,
}

/// What `user_init` learns once per step, before the tasks fork, for every
/// task of the step: the FFI module keeps it and hands it to `task_init`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepState {
    /// The plugstack line, parsed.
    pub config: PluginConfig,
    /// The GPU table and topology, when `--gpu-affinity` is in force and they
    /// could be read.
    pub topology: Option<StepTopology>,
    /// Why they could not be read (logged once; `--gpu-affinity=verbose`
    /// tells each task).
    pub topology_problem: Option<String>,
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
        crate::lint_hook::at_submit(sp, &cfg)?;
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
/// plugstack line; with `--gpu-affinity` in force, the GPU table and topology;
/// with `--auto-rdzv` and `master_addr=hostname|addr`, the first node's
/// address; and, on the node that holds `MASTER_ADDR`, a note when the step's
/// port cannot be bound, so a conflict is reported to the user instead of a
/// rendezvous timeout.
///
/// # Errors
/// [`HookError::Internal`] when Slurm cannot say what the step is or what
/// options it was given.
pub fn user_init<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<Option<StepState>, HookError> {
    let Some(cfg) = config(sp, args, false) else { return Ok(None) };
    maybe_panic(&cfg, Hook::UserInit);
    let (topology, topology_problem) = match gpu_affinity(sp, &cfg)? {
        Some(_) => match load_topology(sp, &cfg) {
            Ok(t) => (Some(t), None),
            Err(why) => (None, Some(why)),
        },
        None => (None, None),
    };
    let mut state = StepState {
        config: cfg,
        topology,
        topology_problem,
        note: None,
        master_addr: None,
        fail_step: None,
        before_fork: None,
    };
    let cfg = &state.config;
    let Some(opts) = auto_rdzv(sp, cfg)? else { return Ok(Some(state)) };
    let settings = settings(cfg, opts);
    let names = rdzv::COMPUTED_VARS.iter().copied().filter(|n| *n != rdzv::RECORD_VAR);
    let names = names.chain(settings.env_defaults.iter().map(|(n, _)| n.as_str()));
    state.before_fork = Some(container::Snapshot::take(names, &|name: &str| env(sp, name)));
    let step = read_step(sp, cfg, false)?;
    let plan = match rdzv::plan_step(&step, &settings) {
        Ok(plan) => plan,
        Err(e) => {
            sp.log(Level::Error, &format!("--auto-rdzv: {e}; setting nothing for this step"));
            return Ok(Some(state));
        }
    };
    if cfg.master_addr != MasterAddr::NodeName {
        state.master_addr = find_master_addr(sp, cfg, &plan.master_addr);
    }
    // The node that holds MASTER_ADDR probes the port. Before fork only the
    // component's node index is known; in a het step, also match the name.
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_owned();
    let here = sp.sysctl("kernel/hostname").map(|h| short(h.trim()));
    if step.node_id != step.master_node() || (step.het && here != Some(short(&plan.master_addr))) {
        return Ok(Some(state));
    }
    let port = match env(sp, "MASTER_PORT") {
        // A user's port, not one the plugin set in an enclosing step; an explicit word wins.
        Some(p) if settings.port.is_none() && !recorded(sp, "MASTER_PORT", &p) => {
            p.trim().parse().unwrap_or(plan.master_port)
        }
        _ => plan.master_port,
    };
    if let Err(holder) = sp.probe_port(port) {
        let taken = format!(
            "MASTER_PORT {port} cannot be bound on {} ({holder}): the rendezvous will fail. \
             Choose a free port with --auto-rdzv=port=N (or export MASTER_PORT), or ask your \
             admin to move port_range away from ports in use",
            plan.master_addr
        );
        if opts.strict {
            state.fail_step = Some(format!("{taken}; this node's tasks exit 1 (--auto-rdzv=strict)"));
        }
        state.note = Some(format!(
            "{taken}. Only this task is told: run srun with --kill-on-bad-exit=1 so that the \
             step ends when it fails, and --auto-rdzv=strict to make it fail before it runs"
        ));
    }
    Ok(Some(state))
}

/// `slurm_spank_local_user_init`, srun only, once the step exists and before
/// it launches: with `--auto-rdzv` in force on a step of several nodes, asks
/// slurmctld where the step's tasks are and, when Slurm's task 0 is not on
/// the step's first node (26.05's topology order, `-m arbitrary`), tells the
/// step the nodes' order of first tasks ([`layout::TASK_ORDER_VAR`]), so that
/// every node follows Slurm's numbering with `MASTER_ADDR` on task 0's node
/// (see [`gpu_core::layout`]). One RPC per such step; when it fails, one line
/// at info level (shown with `srun -v`) and the step keeps node order.
///
/// # Errors
/// [`HookError::Internal`] when Slurm cannot say the step's ids or node count.
pub fn local_user_init<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    let Some(cfg) = config(sp, args, false) else { return Ok(()) };
    // An enclosing step's word (srun inside a task) reaches this step too (srun
    // copied its environment before the hook); its JOB.STEP tag makes the nodes
    // ignore it.
    if auto_rdzv(sp, &cfg)?.is_none() || item(sp, Item::NNodes)? < 2 {
        return Ok(());
    }
    let (job_id, step_id) = (item(sp, Item::JobId)?, item(sp, Item::StepId)?);
    match sp.step_first_tasks(job_id, step_id) {
        Ok(first) => {
            if let Some(order) = layout::task_order(&first) {
                let value = layout::format_task_order(job_id, step_id, &order);
                if value.len() > layout::MAX_TASK_ORDER {
                    sp.log(
                        Level::Info,
                        &format!(
                            "--auto-rdzv: the order of this step's {} nodes takes {} bytes, over {}; \
                             ranks follow node order",
                            first.len(),
                            value.len(),
                            layout::MAX_TASK_ORDER
                        ),
                    );
                } else {
                    sp.srun_env(layout::TASK_ORDER_VAR, Some(&value)).map_err(internal)?;
                }
            }
        }
        Err(e) => sp.log(
            Level::Info,
            &format!("--auto-rdzv: {e}; ranks follow node order, as if task 0 were on the first node"),
        ),
    }
    Ok(())
}

/// Largest slurm.conf (or included file) read for `master_addr=`.
const MAX_SLURM_CONF: usize = 16 << 20;

/// Finds the first node's NodeHostname or NodeAddr (once per step, before
/// fork); says so once when it cannot.
fn find_master_addr<S: Spank + Node>(sp: &S, cfg: &PluginConfig, first: &str) -> Option<String> {
    let path = nodeaddr::slurm_conf_path(cfg.slurm_conf.as_deref(), sp.stepd_env("SLURM_CONF").as_deref());
    let from_conf = || -> Result<Option<NodeNames>, std::io::Error> {
        let conf = sp.read_trusted(&path, MAX_SLURM_CONF)?;
        if let Some(n) = nodeaddr::from_slurm_conf(&conf, first) {
            return Ok(Some(n));
        }
        let dir = path.rsplit_once('/').map_or("/", |(d, _)| d);
        for file in nodeaddr::includes(&conf, dir) {
            let text = sp.read_trusted(&file, MAX_SLURM_CONF)?;
            if let Some(n) = nodeaddr::from_slurm_conf(&text, first) {
                return Ok(Some(n));
            }
        }
        Ok(None)
    };
    let version = slurm_sys::VERSION_NUMBER;
    let aliases = env(sp, "SLURM_NODE_ALIASES").filter(|_| nodeaddr::reads_node_aliases(version));
    let found = match aliases.and_then(|a| nodeaddr::from_aliases(&a, first)) {
        Some(n) => Ok(Some(n)),
        None => from_conf(),
    };
    let word = cfg.master_addr.word();
    match found {
        Ok(Some(names)) => return Some(names.pick(first, cfg.master_addr)),
        Ok(None) => sp.log(Level::Error, &nodeaddr::not_found(word, first, &path, version)),
        Err(e) => sp.log(Level::Error, &format!("master_addr={word}: {e}; MASTER_ADDR stays {first}")),
    }
    None
}

/// Whether `value` of `name` is one the plugin recorded setting in an enclosing step.
fn recorded<S: Spank + Node>(sp: &S, name: &str, value: &str) -> bool {
    env(sp, rdzv::RECORD_VAR).is_some_and(|record| !rdzv::user_set(name, value, Some(&record)))
}

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

/// `--auto-rdzv` in force for this step.
fn auto_rdzv<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Result<Option<AutoRdzv>, HookError> {
    option_in_force(sp, UserOption::AutoRdzv, cfg.auto_rdzv, options::parse_auto_rdzv)
}

fn settings(cfg: &PluginConfig, opts: AutoRdzv) -> Settings {
    Settings::new(cfg, opts.port, slurm_sys::VERSION_NUMBER)
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
fn read_step<S: Spank + Node>(sp: &S, cfg: &PluginConfig, in_task: bool) -> Result<Step, HookError> {
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
    step.argv = command(sp);
    Ok(step)
}

/// The step's command line (`S_JOB_ARGV`): whether it runs an MPI launcher's
/// daemon ([`Step::mpi_daemon`]), and the launcher flags that beat a
/// variable ([`gpu_core::launcher`]). Unknown, it is empty: none is seen.
fn command<S: Spank + Node>(sp: &S) -> Vec<String> {
    sp.command().unwrap_or_default()
}

/// The MPI launcher daemon this step runs (its command, `S_JOB_ARGV`), if
/// it runs one ([`gpu_core::launcher`]).
fn mpi_daemon<S: Spank + Node>(sp: &S) -> Option<&'static str> {
    command(sp).first().and_then(|argv0| gpu_core::launcher::mpi_daemon(argv0))
}

/// `slurm_spank_task_init`, in each forked task before `exec`: sets the
/// task's rendezvous, rank and thread environment.
///
/// # Errors
/// [`HookError::Internal`] when Slurm refuses to answer or to set a variable.
pub fn task_init<S: Spank + Node>(
    sp: &mut S,
    args: &[String],
    state: Option<&StepState>,
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
    // Bind first: OMP_NUM_THREADS counts the CPUs the task ends up with.
    let bound_by_plugin = match (gpu_affinity(sp, cfg)?, mpi_daemon(sp)) {
        // An MPI launcher's daemon: the ranks it starts would inherit its mask.
        (Some(opts), Some(daemon)) => {
            if opts.verbose {
                sp.task_stderr(&format!(
                    "spank-gpu: gpu-affinity: {daemon} is an MPI launcher's daemon: not bound (its ranks would inherit the mask)"
                ));
            }
            false
        }
        (Some(opts), None) => bind_task(sp, opts, state)?,
        (None, _) => false,
    };
    let Some(opts) = auto_rdzv(sp, cfg)? else { return Ok(()) };
    // The plugin's own trouble: one line in the slurmd log (the guard's, or
    // user_init's once per node), and with verbose one on the task's stderr.
    let untold = |sp: &S, why: &str| {
        if opts.verbose {
            sp.task_stderr(&format!("spank-gpu: --auto-rdzv: {why}; nothing set for this step"));
        }
    };
    let step = read_step(sp, cfg, true).inspect_err(|e| untold(sp, &e.to_string()))?;
    let settings = settings(cfg, opts);
    let mut plan = match rdzv::plan_step(&step, &settings) {
        Ok(plan) => plan,
        Err(e) => {
            untold(sp, &e.to_string());
            return Ok(());
        }
    };
    if let Some(addr) = state.and_then(|s| s.master_addr.clone()) {
        let which = if cfg.master_addr == MasterAddr::Addr { "NodeAddr" } else { "NodeHostname" };
        plan = plan.with_master_addr(addr, which);
    }
    let local_id = item(sp, Item::TaskId)?;
    let own = sp.affinity().map_err(internal)?;
    // What a container changed since user_init (pyxis before spank_gpu): planned against
    // the values from before the fork, so the container's are recomputed, the user's kept.
    let now = |name: &str| env(sp, name);
    let changes = match state.and_then(|s| s.before_fork.as_ref()) {
        Some(before) => container::changed(before, &now, &container::Facts::from_env(&now)),
        None => Vec::new(),
    };
    let (task, task_plan) = {
        let lookup = container::before_container(&changes, &now);
        let slurm_task = SlurmTask {
            local_id,
            local_tasks: step.local_tasks,
            step_gpus: None,
            env: &lookup,
            own: own.clone(),
            slurm_version: slurm_sys::VERSION_NUMBER,
            devices: gpu_core::devices::DeviceView::Unknown,
        };
        let has_own_mask = bound_by_plugin || binding::step_cpus(&slurm_task).1;
        let task = Task {
            local_id,
            global_id: env_u32(sp, "SLURM_PROCID").map_or_else(|| item(sp, Item::TaskGlobalId), Ok)?,
            gpus: rdzv::count_gpus(env(sp, "CUDA_VISIBLE_DEVICES").as_deref()),
            bound_cpus: has_own_mask.then(|| u32::try_from(own.len()).unwrap_or(u32::MAX)),
        };
        let task_plan = rdzv::plan_task(&step, &plan, &settings, &task, &lookup);
        (task, task_plan)
    };
    for (name, value) in task_plan.to_set() {
        sp.setenv(name, value, true).map_err(|e| HookError::Internal(format!("setting {name}: {e}")))?;
    }
    // A value of the user's that the container overwrote: the user's again.
    for var in &task_plan.vars {
        if let rdzv::Outcome::Kept(user) = &var.outcome {
            if changes.iter().any(|c| c.name == var.name) {
                sp.setenv(&var.name, user, true)
                    .map_err(|e| HookError::Internal(format!("setting {}: {e}", var.name)))?;
            }
        }
    }
    sp.setenv(rdzv::RECORD_VAR, &task_plan.record(), true)
        .map_err(|e| HookError::Internal(format!("setting {}: {e}", rdzv::RECORD_VAR)))?;

    if task.local_id == 0 {
        for warning in &task_plan.warnings {
            sp.task_stderr(&format!("spank-gpu: warning: {warning}"));
        }
        // The user reads the task's stderr, not the slurmd log where the hook's
        // own failure goes: with strict, say there what fails the step.
        if let Some(why) = state.and_then(|s| s.fail_step.as_deref()) {
            sp.task_stderr(&format!(
                "spank-gpu: error: {why}; with srun --kill-on-bad-exit=1 the whole step ends now"
            ));
        } else if let Some(note) = state.and_then(|s| s.note.as_deref()) {
            sp.task_stderr(&format!("spank-gpu: error: {note}"));
        }
    }
    if let Some(why) = state.and_then(|s| s.fail_step.clone()) {
        return Err(HookError::FailStep(why));
    }
    if opts.verbose {
        let host = hostlist::expand(&step.node_list)
            .ok()
            .and_then(|hosts| hosts.into_iter().nth(step.node_id as usize))
            .unwrap_or_else(|| format!("node {}", step.node_id));
        let mut line = task_plan.verbose_line(&task, &host);
        let replaced = container::replaced_words(&changes);
        if !replaced.is_empty() {
            line.push_str("; ");
            line.push_str(&replaced);
        }
        sp.task_stderr(&line);
    }
    Ok(())
}

// ----- --gpu-affinity -------------------------------------------------------------------

/// `--gpu-affinity` in force for this step.
fn gpu_affinity<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Result<Option<GpuAffinity>, HookError> {
    option_in_force(sp, UserOption::GpuAffinity, cfg.gpu_affinity, options::parse_gpu_affinity)
}

/// Reads the node's GPU table and hwloc XML once per step (before fork), for
/// the tasks to bind with. Without them, nothing is bound and one line says
/// why (returned too, for `verbose`).
fn load_topology<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Result<StepTopology, String> {
    let dir = cfg.topology_dir.trim_end_matches('/');
    let loaded = (|| -> Result<StepTopology, String> {
        let (table_path, xml_path) = (format!("{dir}/{TABLE_FILE}"), format!("{dir}/{XML_FILE}"));
        let table_text = sp.read_trusted(&table_path, gputable::MAX_BYTES).map_err(|e| e.to_string())?;
        let table = GpuTable::parse(&table_text).map_err(|e| format!("{table_path}: {e}"))?;
        let xml = sp.read_trusted(&xml_path, topology::MAX_XML_BYTES).map_err(|e| e.to_string())?;
        let topology = topology::from_hwloc_xml(&xml).map_err(|e| format!("{xml_path}: {e}"))?;
        let step_gpus = env(sp, "SLURM_STEP_GPUS").and_then(|s| binding::gpu_indices(&s, &table));
        let user_cpu_bind = env(sp, "SLURM_CPU_BIND_TYPE").filter(|b| !b.is_empty());
        Ok(StepTopology { table, topology, step_gpus, user_cpu_bind })
    })();
    loaded.map_err(|e| {
        let why = format!("no usable GPU table ({e}; is gpu-node-agent running?)");
        sp.log(Level::Error, &format!("--gpu-affinity: {why}; tasks keep Slurm's CPU binding"));
        why
    })
}

/// Binds this task (in `task_init`) to the CPUs closest to its GPUs. Returns
/// whether the plugin bound it.
fn bind_task<S: Spank + Node>(
    sp: &mut S,
    opts: GpuAffinity,
    state: Option<&StepState>,
) -> Result<bool, HookError> {
    let Some(p) = plan_binding(sp, opts, state)? else { return Ok(false) };
    let say = |sp: &S, text: String| {
        if opts.verbose {
            sp.task_stderr(&format!(
                "spank-gpu: gpu-affinity: task {} (local {}): {text}",
                p.rank, p.local_id
            ));
        }
    };
    if let Some(note) = &p.binding.note {
        sp.log(Level::Info, &format!("--gpu-affinity: task {}: {note}; Slurm's mask {} kept", p.rank, p.own));
        say(sp, format!("GPUs {}: {note}; Slurm's mask {} kept", p.gpus, p.own));
        return Ok(false);
    }
    if p.binding.cpus != p.own {
        sp.set_affinity(&p.binding.cpus).map_err(internal)?;
    }
    if opts.mem {
        if let Err(e) = sp.prefer_memory(&p.binding.numa_nodes) {
            sp.log(Level::Info, &format!("--gpu-affinity=mem: {e}"));
        }
    }
    let numa: Vec<String> = p.binding.numa_nodes.iter().map(u32::to_string).collect();
    say(sp, format!("GPUs {} NUMA {} CPUs {}", p.gpus, numa.join(","), p.binding.cpus));
    Ok(true)
}

/// The GPU device files' directory of the step's plugstack line.
fn cfg_dev_dir(state: Option<&StepState>) -> &str {
    state.map_or(gpu_core::devices::DEFAULT_DEV_DIR, |s| s.config.dev_dir())
}

/// The task's GPUs as its device cgroup shows them, when a device constraint
/// is in force ([`gpu_core::devices`]): one `access(2)` per GPU of the table,
/// in the forked task, where slurmstepd has already applied the task's
/// device constraint (before `task_init` on every release). Where nothing is
/// refused, or a probe cannot tell, the variables are used.
fn probe_devices<S: Spank + Node>(sp: &S, table: &GpuTable, dir: &str) -> gpu_core::devices::DeviceView {
    let probes: Vec<(u32, gpu_core::devices::Access)> = table
        .gpus
        .iter()
        .map(|g| match g.minor {
            Some(minor) => (g.slurm_index, sp.device_access(&gpu_core::devices::device_path(dir, minor))),
            None => (g.slurm_index, gpu_core::devices::Access::Unknown),
        })
        .collect();
    gpu_core::devices::view(&probes)
}

/// A task's binding, decided but not applied.
struct PlannedBinding {
    rank: u32,
    local_id: u32,
    /// The task's mask before binding.
    own: CpuSet,
    /// The task's GPUs as the verbose line names them.
    gpus: String,
    binding: Binding,
}

/// Decides this task's binding from the step's table (borrowed, not copied:
/// this runs once per task on the launch path) and what Slurm told the task.
/// `None` when the task keeps Slurm's mask for a reason already told (no
/// table, the user's `--cpu-bind`, no GPU).
fn plan_binding<S: Spank + Node>(
    sp: &S,
    opts: GpuAffinity,
    state: Option<&StepState>,
) -> Result<Option<PlannedBinding>, HookError> {
    let Some(topo) = state.and_then(|s| s.topology.as_ref()) else {
        if let Some(why) = state.and_then(|s| s.topology_problem.as_deref()).filter(|_| opts.verbose) {
            sp.task_stderr(&format!("spank-gpu: gpu-affinity: {why}: Slurm's binding kept"));
        }
        return Ok(None);
    };
    let local_id = item(sp, Item::TaskId)?;
    let rank = env_u32(sp, "SLURM_PROCID").map_or_else(|| item(sp, Item::TaskGlobalId), Ok)?;
    let local_tasks = item(sp, Item::LocalTaskCount)?;
    let say = |text: &str| {
        if opts.verbose {
            sp.task_stderr(&format!("spank-gpu: gpu-affinity: task {rank} (local {local_id}): {text}"));
        }
    };
    if let Some(bind) = topo.user_cpu_bind.as_deref().filter(|_| !opts.force) {
        say(&format!("--cpu-bind={bind} given: Slurm's binding kept (--gpu-affinity=force overrides)"));
        return Ok(None);
    }
    let own = sp.affinity().map_err(internal)?;
    let lookup = |name: &str| env(sp, name);
    let task = SlurmTask {
        local_id,
        local_tasks,
        step_gpus: topo.step_gpus.clone(),
        env: &lookup,
        own: own.clone(),
        slurm_version: slurm_sys::VERSION_NUMBER,
        devices: probe_devices(sp, &topo.table, cfg_dev_dir(state)),
    };
    // The step's CPUs on the node: Slurm's per-task masks (task/affinity binds
    // every task, cyclic by default, whatever its GPU) are replaced, unless
    // Slurm's is already close to the task's GPUs and the plan cannot see
    // the tasks that share them.
    let (share, planned) = match binding::plan_slurm_task(&topo.topology, &topo.table, &task) {
        Ok(decided) => decided,
        Err(why) => {
            say(&format!("{why}: Slurm's binding kept"));
            return Ok(None);
        }
    };
    let gpus: Vec<String> = share
        .gpus()
        .iter()
        .map(|i| match topo.table.by_index(*i) {
            Some(g) => format!("{i} ({})", g.pci_bus_id),
            None => format!("{i} (not in the GPU table)"),
        })
        .collect();
    // Where the GPUs came from, when it was not Slurm's variables.
    let from = if task.devices.constrained().is_some() { " [device cgroup]" } else { "" };
    let gpus = format!("{}{from}", gpus.join(", "));
    Ok(Some(PlannedBinding { rank, local_id, own, gpus, binding: planned }))
}

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests;
