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
use gpu_core::nodeaddr::{self, MasterAddr, NodeNames};
use gpu_core::options::{self, AutoRdzv, GpuAffinity, UserOption};
use gpu_core::plugstack::{Hook, PluginConfig};
use gpu_core::ports::{self, PortRange};
use gpu_core::rdzv::{self, Items, Settings, Step, Task};
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
    /// A problem to tell the user on the first task's stderr (a taken port).
    pub note: Option<String>,
    /// The first node's NodeHostname/NodeAddr (`master_addr=hostname|addr`).
    pub master_addr: Option<String>,
    /// With `--auto-rdzv=strict`, why this node's tasks must fail before
    /// they run (a taken port): `task_init` fails with it.
    pub fail_step: Option<String>,
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
    let topology = if gpu_affinity(sp, &cfg)?.is_some() { load_topology(sp, &cfg) } else { None };
    let mut state = StepState { config: cfg, topology, note: None, master_addr: None, fail_step: None };
    let cfg = &state.config;
    let Some(opts) = auto_rdzv(sp, cfg)? else { return Ok(Some(state)) };
    let step = read_step(sp, cfg, false)?;
    let settings = settings(cfg, opts);
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
    if step.node_id != 0 || (step.het && here != Some(short(&plan.master_addr))) {
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

/// Largest slurm.conf (or included file) read for `master_addr=`.
const MAX_SLURM_CONF: usize = 16 << 20;

/// Finds the first node's NodeHostname or NodeAddr (once per step, before
/// fork); says so once when it cannot.
fn find_master_addr<S: Spank + Node>(sp: &S, cfg: &PluginConfig, first: &str) -> Option<String> {
    let from_conf = || -> Result<Option<NodeNames>, std::io::Error> {
        let path = cfg.slurm_conf.as_str();
        let conf = sp.read_trusted(path, MAX_SLURM_CONF)?;
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
    let found = match env(sp, "SLURM_NODE_ALIASES").and_then(|a| nodeaddr::from_aliases(&a, first)) {
        Some(n) => Ok(Some(n)),
        None => from_conf(),
    };
    let word = cfg.master_addr.word();
    match found {
        Ok(Some(names)) => return Some(names.pick(first, cfg.master_addr)),
        Ok(None) => sp.log(
            Level::Error,
            &format!(
                "master_addr={word}: {first} is not in SLURM_NODE_ALIASES or {}; MASTER_ADDR stays {first}",
                cfg.slurm_conf
            ),
        ),
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
    Settings::new(cfg, opts.port)
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
    Step::from_env(&lookup, &items).map_err(|e| HookError::Internal(e.to_string()))
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
    let topology = state.and_then(|s| s.topology.as_ref());
    let bound_by_plugin = match gpu_affinity(sp, cfg)? {
        Some(opts) => bind_task(sp, opts, topology)?,
        None => false,
    };
    let Some(opts) = auto_rdzv(sp, cfg)? else { return Ok(()) };
    let mut step = read_step(sp, cfg, true)?;
    // A launcher flag on the command line beats a variable; unknown, none is seen.
    step.argv = sp.job_argv().unwrap_or_default();
    let settings = settings(cfg, opts);
    // An unusable step was reported once, by user_init.
    let Ok(mut plan) = rdzv::plan_step(&step, &settings) else { return Ok(()) };
    if let Some(addr) = state.and_then(|s| s.master_addr.clone()) {
        let which = if cfg.master_addr == MasterAddr::Addr { "NodeAddr" } else { "NodeHostname" };
        plan = plan.with_master_addr(addr, which);
    }
    let local_id = item(sp, Item::TaskId)?;
    let own = sp.affinity().map_err(internal)?;
    let (task, task_plan) = {
        let lookup = |name: &str| env(sp, name);
        let slurm_task = SlurmTask {
            local_id,
            local_tasks: step.local_tasks,
            step_gpus: None,
            env: &lookup,
            own: own.clone(),
            slurm_version: slurm_sys::VERSION_NUMBER,
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
    sp.setenv(rdzv::RECORD_VAR, &task_plan.record(), true)
        .map_err(|e| HookError::Internal(format!("setting {}: {e}", rdzv::RECORD_VAR)))?;

    if task.local_id == 0 {
        for warning in &task_plan.warnings {
            sp.task_stderr(&format!("spank-gpu: warning: {warning}"));
        }
        if let Some(note) = state.and_then(|s| s.note.as_deref()) {
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
        sp.task_stderr(&task_plan.verbose_line(&task, &host));
    }
    Ok(())
}

// ----- --gpu-affinity -------------------------------------------------------------------

/// `--gpu-affinity` in force for this step.
fn gpu_affinity<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Result<Option<GpuAffinity>, HookError> {
    option_in_force(sp, UserOption::GpuAffinity, cfg.gpu_affinity, options::parse_gpu_affinity)
}

/// Reads the node's GPU table and hwloc XML once per step (before fork), for
/// the tasks to bind with. Without them, nothing is bound and one line says why.
fn load_topology<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Option<StepTopology> {
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
    loaded
        .map_err(|e| {
            sp.log(
                Level::Error,
                &format!("--gpu-affinity: no usable GPU table ({e}; is gpu-node-agent running?); tasks keep Slurm's CPU binding"),
            );
        })
        .ok()
}

/// Binds this task (in `task_init`) to the CPUs closest to its GPUs. Returns
/// whether the plugin bound it.
fn bind_task<S: Spank + Node>(
    sp: &mut S,
    opts: GpuAffinity,
    topology: Option<&StepTopology>,
) -> Result<bool, HookError> {
    let Some(p) = plan_binding(sp, opts, topology)? else { return Ok(false) };
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
    topology: Option<&StepTopology>,
) -> Result<Option<PlannedBinding>, HookError> {
    let Some(topo) = topology else { return Ok(None) };
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
    };
    let share = match binding::task_gpus_from_slurm(&topo.table, &task) {
        Ok(share) => share,
        Err(why) => {
            say(&format!("{why}: Slurm's binding kept"));
            return Ok(None);
        }
    };
    // The step's CPUs on the node: Slurm's per-task masks (task/affinity binds
    // every task, cyclic by default, whatever its GPU) are replaced.
    let (allowed, _) = binding::step_cpus(&task);
    let planned = binding::plan_task(&topo.topology, &topo.table, &share, &allowed);
    let gpus: Vec<String> = share
        .gpus()
        .iter()
        .map(|i| match topo.table.by_index(*i) {
            Some(g) => format!("{i} ({})", g.pci_bus_id),
            None => format!("{i} (not in the GPU table)"),
        })
        .collect();
    Ok(Some(PlannedBinding { rank, local_id, own, gpus: gpus.join(", "), binding: planned }))
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake SPANK handle: a few maps, a log and the task's stderr.

    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use std::io;

    use super::*;
    use crate::spank::SpankError;
    use gpu_core::cpuset::CpuSet;

    #[derive(Debug)]
    pub struct FakeSpank {
        pub context: Context,
        pub registered: Vec<UserOption>,
        pub refuse_register: bool,
        pub options: BTreeMap<&'static str, String>,
        pub items: BTreeMap<&'static str, u32>,
        pub env: BTreeMap<String, String>,
        pub log: RefCell<Vec<(Level, String)>>,
        pub stderr: RefCell<Vec<String>>,
        pub port_taken: Option<String>,
        pub sysctls: BTreeMap<&'static str, String>,
        pub files: BTreeMap<String, String>,
        pub mask: CpuSet,
        pub mem_nodes: Vec<u32>,
        pub argv: Vec<String>,
    }

    impl FakeSpank {
        pub fn new(context: Context) -> FakeSpank {
            FakeSpank {
                context,
                registered: Vec::new(),
                refuse_register: false,
                options: BTreeMap::new(),
                items: BTreeMap::new(),
                env: BTreeMap::new(),
                log: RefCell::new(Vec::new()),
                stderr: RefCell::new(Vec::new()),
                port_taken: None,
                sysctls: BTreeMap::new(),
                files: BTreeMap::new(),
                mask: CpuSet::parse("0-15").unwrap_or_default(),
                mem_nodes: Vec::new(),
                argv: Vec::new(),
            }
        }

        /// Task `global` (local `local`) of a 2-node, 4-task step of job 77 on node `node`.
        pub fn task(node: u32, local: u32, global: u32) -> FakeSpank {
            let mut sp = FakeSpank::new(Context::Remote);
            for (k, v) in [
                ("JobId", 77),
                ("StepId", 0),
                ("NNodes", 2),
                ("NodeId", node),
                ("LocalTaskCount", 2),
                ("TotalTaskCount", 4),
                ("StepCpusPerTask", 4),
                ("TaskId", local),
                ("TaskGlobalId", global),
            ] {
                sp.items.insert(k, v);
            }
            sp.env.insert("SLURM_STEP_NODELIST".into(), "node[1-2]".into());
            sp.env.insert("CUDA_VISIBLE_DEVICES".into(), local.to_string());
            sp
        }

        pub fn errors(&self) -> Vec<String> {
            self.log.borrow().iter().filter(|(l, _)| *l == Level::Error).map(|(_, m)| m.clone()).collect()
        }

        pub fn var(&self, name: &str) -> Option<&str> {
            self.env.get(name).map(String::as_str)
        }
    }

    impl Spank for FakeSpank {
        fn context(&self) -> Context {
            self.context
        }

        fn register_option(&mut self, option: UserOption) -> Result<(), SpankError> {
            if self.refuse_register {
                return Err(SpankError {
                    call: "spank_option_register",
                    code: 3001,
                    text: "Invalid argument".into(),
                });
            }
            self.registered.push(option);
            Ok(())
        }

        fn option_arg(&self, option: UserOption) -> Result<Option<String>, SpankError> {
            Ok(self.options.get(option.name()).cloned())
        }

        fn setenv(&mut self, name: &str, value: &str, overwrite: bool) -> Result<bool, SpankError> {
            if !overwrite && self.env.contains_key(name) {
                return Ok(false);
            }
            self.env.insert(name.to_owned(), value.to_owned());
            Ok(true)
        }

        fn log(&self, level: Level, message: &str) {
            self.log.borrow_mut().push((level, message.to_owned()));
        }

        fn item(&self, item: Item) -> Result<u32, SpankError> {
            let key = format!("{item:?}");
            self.items.get(key.as_str()).copied().ok_or(SpankError {
                call: "spank_get_item",
                code: 3001,
                text: "Invalid argument".into(),
            })
        }

        fn getenv(&self, name: &str) -> Result<Option<String>, SpankError> {
            Ok(self.env.get(name).cloned())
        }

        fn task_stderr(&self, line: &str) {
            self.stderr.borrow_mut().push(line.to_owned());
        }

        fn job_argv(&self) -> Result<Vec<String>, SpankError> {
            Ok(self.argv.clone())
        }
    }

    impl Node for FakeSpank {
        fn probe_port(&self, _port: u16) -> io::Result<()> {
            self.port_taken.clone().map_or(Ok(()), |who| Err(io::Error::new(io::ErrorKind::AddrInUse, who)))
        }

        fn sysctl(&self, key: &'static str) -> Option<String> {
            self.sysctls.get(key).cloned()
        }

        fn read_trusted(&self, path: &str, _max_bytes: usize) -> io::Result<String> {
            self.files.get(path).cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{path}: No such file or directory"))
            })
        }

        fn affinity(&self) -> io::Result<CpuSet> {
            Ok(self.mask.clone())
        }

        fn set_affinity(&mut self, cpus: &CpuSet) -> io::Result<()> {
            self.mask = cpus.clone();
            Ok(())
        }

        fn prefer_memory(&mut self, nodes: &[u32]) -> io::Result<()> {
            self.mem_nodes = nodes.to_vec();
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSpank;
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn init_registers_every_option_in_every_context() {
        for ctx in [Context::Local, Context::Allocator, Context::Remote, Context::Slurmd] {
            let mut sp = FakeSpank::new(ctx);
            assert_eq!(init(&mut sp, &[]), Ok(()));
            assert_eq!(sp.registered, UserOption::ALL);
        }
    }

    #[test]
    fn init_reports_a_bad_plugstack_line_once_and_still_registers() {
        let mut sp = FakeSpank::new(Context::Remote);
        assert_eq!(init(&mut sp, &args(&["bogus=1"])), Ok(()));
        assert_eq!(sp.registered, UserOption::ALL, "options must stay known so #SBATCH lines still parse");
        let errors = sp.errors();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("'bogus=1': unknown key 'bogus'"), "{errors:?}");
    }

    #[test]
    fn slurmd_warns_when_the_port_range_meets_ephemeral_ports() {
        let mut sp = FakeSpank::new(Context::Slurmd);
        sp.sysctls.insert("net/ipv4/ip_local_port_range", "32768\t60999\n".into());
        init(&mut sp, &[]).unwrap();
        assert!(sp.errors().is_empty(), "default range is clear: {:?}", sp.errors());
        init(&mut sp, &args(&["port_range=30000-40000"])).unwrap();
        assert_eq!(sp.errors().len(), 1);
        assert!(sp.errors()[0].contains("overlaps this node's ip_local_port_range 32768-60999"));

        // Reserved ports inside the range: a note, not an error.
        let mut sp = FakeSpank::new(Context::Slurmd);
        sp.sysctls.insert("net/ipv4/ip_local_reserved_ports", "22000,40000-40010\n".into());
        init(&mut sp, &[]).unwrap();
        assert!(sp.errors().is_empty());
        assert!(
            sp.log
                .borrow()
                .iter()
                .any(|(_, m)| m.contains("includes ports reserved for services (22000-22000)"))
        );

        // Only slurmd checks (once per node, not in every srun).
        let mut sp = FakeSpank::new(Context::Local);
        sp.sysctls.insert("net/ipv4/ip_local_port_range", "1024 65000".into());
        init(&mut sp, &[]).unwrap();
        assert!(sp.errors().is_empty());
    }

    #[test]
    fn refused_registration_is_an_internal_error() {
        let mut sp = FakeSpank::new(Context::Local);
        sp.refuse_register = true;
        assert!(matches!(init(&mut sp, &[]), Err(HookError::Internal(_))));
    }

    #[test]
    fn callback_rejects_bad_words_only_at_submit() {
        for ctx in [Context::Local, Context::Allocator] {
            let r = option_callback(ctx, UserOption::AutoRdzv, Some("bogus"));
            assert!(matches!(r, Err(HookError::User(m)) if m.contains("'bogus'")));
        }
        assert_eq!(option_callback(Context::Remote, UserOption::AutoRdzv, Some("bogus")), Ok(()));
    }

    #[test]
    fn callback_is_idempotent() {
        for arg in [None, Some(""), None, Some("verbose"), Some("(null)")] {
            assert_eq!(option_callback(Context::Local, UserOption::GpuAffinity, arg), Ok(()));
        }
    }

    #[test]
    fn task_init_sets_nothing_unless_auto_rdzv_is_on() {
        let mut sp = FakeSpank::task(0, 0, 0);
        task_init(&mut sp, &[], None).unwrap();
        assert_eq!(sp.var("MASTER_ADDR"), None, "off by default");

        sp.options.insert("auto-rdzv", String::new());
        task_init(&mut sp, &[], None).unwrap();
        assert_eq!(sp.var("MASTER_ADDR"), Some("node1"));
        assert!(sp.var(rdzv::RECORD_VAR).is_some());
    }

    #[test]
    fn task_init_sets_ranks_from_items() {
        let mut sp = FakeSpank::task(1, 1, 3);
        sp.options.insert("auto-rdzv", String::new());
        task_init(&mut sp, &[], None).unwrap();
        for (name, want) in [
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("NODE_RANK", "1"),
            ("OMP_NUM_THREADS", "4"),
        ] {
            assert_eq!(sp.var(name), Some(want), "{name}");
        }
        let port: u16 = sp.var("MASTER_PORT").unwrap().parse().unwrap();
        assert!((20000..=29999).contains(&port));
        assert!(sp.stderr.borrow().is_empty(), "not verbose");
    }

    #[test]
    fn admin_default_applies_unless_the_user_says_off() {
        let mut sp = FakeSpank::task(0, 0, 0);
        task_init(&mut sp, &args(&["auto_rdzv=on", "NCCL_DEBUG=WARN"]), None).unwrap();
        assert_eq!(sp.var("NCCL_DEBUG"), Some("WARN"));

        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", "off".into());
        task_init(&mut sp, &args(&["auto_rdzv=on"]), None).unwrap();
        assert_eq!(sp.var("MASTER_ADDR"), None);
    }

    #[test]
    fn bad_option_in_remote_context_is_logged_and_off() {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", "bogus".into());
        assert_eq!(task_init(&mut sp, &[], None), Ok(()));
        assert_eq!(sp.var("MASTER_ADDR"), None);
        assert_eq!(sp.errors().len(), 1);
    }

    #[test]
    fn bad_plugstack_line_makes_task_init_do_nothing_quietly() {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", String::new());
        assert_eq!(task_init(&mut sp, &args(&["auto_rdzv=maybe"]), None), Ok(()));
        assert_eq!(sp.var("MASTER_ADDR"), None);
        assert!(sp.errors().is_empty());
    }

    #[test]
    fn garbage_node_list_sets_nothing_and_logs_once() {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", String::new());
        sp.env.insert("SLURM_STEP_NODELIST".into(), "node[9-1".into());
        let st_sp = user_init(&mut sp, &[]);
        assert!(st_sp.is_ok());
        let st_sp = st_sp.unwrap();
        assert_eq!(task_init(&mut sp, &[], st_sp.as_ref()), Ok(()));
        assert_eq!(sp.var("MASTER_ADDR"), None);
        assert_eq!(sp.errors().len(), 1, "{:?}", sp.errors());
    }

    #[test]
    fn a_taken_port_is_reported_on_the_first_tasks_stderr() {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", String::new());
        sp.port_taken = Some("Address in use; held by pid 42 (python)".into());
        let st_sp = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        let err = sp.stderr.borrow().join("\n");
        let port = sp.var("MASTER_PORT").unwrap();
        assert!(err.contains(&format!("MASTER_PORT {port} cannot be bound on node1")), "{err}");
        assert!(err.contains("pid 42 (python)") && err.contains("--auto-rdzv=port=N"), "{err}");

        // Nodes other than the first do not probe.
        let mut other = FakeSpank::task(1, 0, 2);
        other.options.insert("auto-rdzv", String::new());
        other.port_taken = Some("x".into());
        let st_other = user_init(&mut other, &[]).unwrap();
        assert!(st_other.is_some_and(|st| st.note.is_none()));
    }

    #[test]
    fn a_taken_port_names_kill_on_bad_exit_and_strict_fails_the_step() {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", String::new());
        sp.port_taken = Some("held by pid 42 (python)".into());
        let st = user_init(&mut sp, &[]).unwrap().unwrap();
        assert!(st.note.as_deref().is_some_and(|n| n.contains("--kill-on-bad-exit=1")), "{:?}", st.note);
        assert_eq!(st.fail_step, None, "only when asked");

        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", "strict".into());
        sp.port_taken = Some("held by pid 42 (python)".into());
        let st = user_init(&mut sp, &[]).unwrap().unwrap();
        let fail = st.fail_step.as_deref().unwrap_or_default();
        assert!(fail.contains("pid 42 (python)") && fail.ends_with("(--auto-rdzv=strict)"), "{fail}");
        // Every task on the node fails, after the first one's stderr says why.
        let e = task_init(&mut sp, &[], Some(&st)).unwrap_err();
        assert!(matches!(&e, HookError::FailStep(m) if m.contains("exit 1")), "{e:?}");
        assert!(sp.stderr.borrow().iter().any(|l| l.contains("--kill-on-bad-exit=1")));
        // A free port fails nothing.
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("auto-rdzv", "strict".into());
        assert_eq!(user_init(&mut sp, &[]).unwrap().unwrap().fail_step, None);
    }

    #[test]
    fn the_launchers_get_the_point_unless_the_command_line_gives_one() {
        // One task per node: a torchrun launch.
        let one_per_node = || {
            let mut sp = FakeSpank::task(1, 0, 1);
            sp.items.insert("LocalTaskCount", 1);
            sp.items.insert("TotalTaskCount", 2);
            sp.env.insert("SLURM_STEP_NUM_TASKS".into(), "2".into());
            sp.env.insert("SLURM_STEP_TASKS_PER_NODE".into(), "1(x2)".into());
            sp.options.insert("auto-rdzv", String::new());
            sp
        };
        let mut sp = one_per_node();
        sp.argv = vec!["torchrun".into(), "--rdzv-backend=c10d".into(), "train.py".into()];
        task_init(&mut sp, &[], None).unwrap();
        let port = sp.var("MASTER_PORT").unwrap().to_owned();
        assert_eq!(sp.var("PET_RDZV_ENDPOINT"), Some(format!("node1:{port}").as_str()));
        assert_eq!(sp.var("PET_RDZV_ID"), Some("77.0"));
        assert_eq!(sp.var("JAX_COORDINATOR_PORT"), Some(port.as_str()));

        let mut sp = one_per_node();
        sp.argv = vec!["torchrun".into(), "--master_port=29577".into(), "train.py".into()];
        sp.options.insert("auto-rdzv", "verbose".into());
        task_init(&mut sp, &[], None).unwrap();
        assert_eq!(sp.var("PET_RDZV_ENDPOINT"), None, "the user's --master_port wins");
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains("not set PET_RDZV_ENDPOINT (your --master_port wins)"), "{err}");
    }

    #[test]
    fn verbose_prints_one_line_per_task() {
        let mut sp = FakeSpank::task(0, 1, 1);
        sp.options.insert("auto-rdzv", "verbose".into());
        sp.env.insert("MASTER_PORT".into(), "29500".into());
        task_init(&mut sp, &[], None).unwrap();
        let lines = sp.stderr.borrow().clone();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("spank-gpu: task 1 (node1 local 1): set MASTER_ADDR=node1"),
            "{lines:?}"
        );
        assert!(lines[0].contains("kept MASTER_PORT=29500"), "{lines:?}");
        assert_eq!(sp.var("MASTER_PORT"), Some("29500"));
    }

    /// A 2-domain node: CPUs 0-7 with GPUs 0-3, CPUs 8-15 with GPUs 4-7,
    /// its table and XML where the plugin looks for them.
    fn with_topology(sp: &mut FakeSpank) {
        use gpu_core::cpuset::CpuSet;
        use gpu_core::gputable::GpuEntry;
        let buses = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"];
        let buses2 = ["0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"];
        let (lo, hi) = (CpuSet::parse("0-7").unwrap(), CpuSet::parse("8-15").unwrap());
        let xml = topology::synthetic_xml(&[(lo.clone(), buses.to_vec()), (hi.clone(), buses2.to_vec())]);
        let gpus = (0u32..)
            .zip(buses.iter().chain(&buses2))
            .map(|(i, b)| GpuEntry {
                slurm_index: i,
                minor: Some(i),
                pci_bus_id: b.parse().unwrap(),
                uuid: Some(format!("GPU-{i}")),
                numa_nodes: vec![i / 4],
                cpus: if i < 4 { lo.clone() } else { hi.clone() },
                // GPU 5 is in MIG mode with two MIG devices.
                mig_uuids: if i == 5 { vec![MIG_5A.to_owned(), MIG_5B.to_owned()] } else { Vec::new() },
            })
            .collect();
        // The on-disk contract: the agent's file names in the default directory.
        let dir = gputable::DEFAULT_DIR;
        sp.files.insert(format!("{dir}/gpus.tsv"), GpuTable { gpus }.to_text());
        sp.files.insert(format!("{dir}/topology.xml"), xml);
    }

    fn bound(local: u32, cvd: &str, step_gpus: &str, extra: &[(&str, &str)]) -> FakeSpank {
        let mut sp = FakeSpank::task(0, local, local);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", String::new());
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), cvd.into());
        sp.env.insert("SLURM_STEP_GPUS".into(), step_gpus.into());
        for (k, v) in extra {
            sp.env.insert((*k).into(), (*v).into());
        }
        let st_sp = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        sp
    }

    #[test]
    fn tasks_bind_to_their_gpus_domain_and_split_it() {
        // Two tasks with one GPU each on domain 0 split its 8 cores.
        assert_eq!(bound(0, "0", "0,1", &[]).mask.to_string(), "0-3");
        assert_eq!(bound(1, "1", "0,1", &[]).mask.to_string(), "4-7");
        // GPUs on the other domain.
        assert_eq!(bound(0, "4", "4,5", &[]).mask.to_string(), "8-11");
        // Every task sees all 8 GPUs: local rank 1 of 2 takes GPUs 4-7.
        assert_eq!(bound(1, "0,1,2,3,4,5,6,7", "0,1,2,3,4,5,6,7", &[]).mask.to_string(), "8-15");
        // GPUs given as UUIDs (both local tasks see GPU 5: they split its domain).
        assert_eq!(bound(0, "GPU-5", "5", &[]).mask.to_string(), "8-11");
    }

    const MIG_5A: &str = "MIG-5a000000-7d2e-4b1a-9c3e-000000000005";
    const MIG_5B: &str = "MIG-5b000000-7d2e-4b1a-9c3e-000000000005";

    #[test]
    fn a_mig_device_binds_to_its_parent_gpus_domain() {
        // Slurm's index of a MIG device (0 here) is not the table's: GPU 0 is on domain 0.
        assert_eq!(bound(0, MIG_5A, "0", &[]).mask.to_string(), "8-11");
        // Both tasks see both MIG devices of GPU 5: local rank 1 takes the second.
        let both = format!("{MIG_5A},{MIG_5B}");
        assert_eq!(bound(1, &both, "0,1", &[]).mask.to_string(), "12-15");
        // One MIG device per task: the peers are unknown, the task has the domain.
        let per_task = [("SLURMD_TRES_BIND", "gpu:per_task:1")];
        assert_eq!(bound(1, MIG_5B, "0", &per_task).mask.to_string(), "8-15");
        // The legacy form names the parent GPU's UUID.
        assert_eq!(bound(0, "MIG-GPU-2/1/0", "0", &[]).mask.to_string(), "0-3");
        // A MIG device the table does not know: nothing bound, and (verbose) the task is told why.
        let mut sp = FakeSpank::task(0, 0, 0);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", "verbose".into());
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "MIG-00000000-0000-0000-0000-000000000000".into());
        sp.env.insert("SLURM_STEP_GPUS".into(), "0".into());
        let st = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), "0-15");
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains("names a MIG device that is not in the GPU table"), "{err}");
        assert!(err.contains("gpu-node-agent topology --write"), "{err}");
    }

    #[test]
    fn omp_threads_count_the_bound_cpus() {
        let mut sp = FakeSpank::task(0, 0, 0);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", "verbose".into());
        sp.options.insert("auto-rdzv", String::new());
        sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
        let st_sp = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), "0-3");
        assert_eq!(sp.var("OMP_NUM_THREADS"), Some("4"));
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains("GPUs 0 (0000:1b:00.0) NUMA 0 CPUs 0-3"), "{err}");
    }

    #[test]
    fn user_cpu_bind_wins_unless_forced() {
        assert_eq!(bound(0, "4", "4,5", &[("SLURM_CPU_BIND_TYPE", "cores")]).mask.to_string(), "0-15");
        let mut sp = FakeSpank::task(0, 0, 0);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", "force,mem".into());
        sp.items.insert("LocalTaskCount", 1);

        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "4".into());
        sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores".into());
        let st_sp = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), "8-15");
        assert_eq!(sp.mem_nodes, vec![1], "mem prefers the GPU's NUMA node");
    }

    #[test]
    fn no_table_binds_nothing_and_says_so_once() {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("gpu-affinity", String::new());
        let st_sp = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), "0-15");
        assert_eq!(sp.errors().len(), 1);
        assert!(sp.errors()[0].contains("no usable GPU table"), "{:?}", sp.errors());
    }

    /// task/affinity's cyclic default put local task 0 (GPU 0, domain 0) on
    /// CPUs 8-15 and task 1 (GPU 1, domain 0) on 0-7, and exported the masks
    /// in every task, without any --cpu-bind from the user.
    fn affinity_bound(local: u32) -> FakeSpank {
        let mut sp = FakeSpank::task(0, local, local);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", String::new());
        sp.options.insert("auto-rdzv", String::new());
        sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
        let st_sp = user_init(&mut sp, &[]).unwrap();
        // slurmstepd's per-task environment (the step's was read above).
        sp.env.insert("SLURM_STEP_GPUS".into(), local.to_string());
        sp.env.insert("SLURMD_TRES_BIND".into(), "gpu:per_task:1".into());
        sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "mask_cpu:".into());
        sp.env.insert("SLURM_CPU_BIND_LIST".into(), "0xFF00,0x00FF".into());
        sp.mask = gpu_core::cpuset::CpuSet::parse(if local == 0 { "8-15" } else { "0-7" }).unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        sp
    }

    #[test]
    fn task_affinity_masks_are_replaced_by_the_gpus_domain() {
        let (t0, t1) = (affinity_bound(0), affinity_bound(1));
        assert_eq!(t0.mask.to_string(), "0-3", "GPU 0's task moves to GPU 0's domain");
        assert_eq!(t1.mask.to_string(), "4-7");
        assert_eq!(t0.var("OMP_NUM_THREADS"), Some("4"));
        // With --cpu-bind given to srun (seen before fork), Slurm's mask stays.
        let mut sp = FakeSpank::task(0, 0, 0);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", String::new());
        sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores".into());
        let st_sp = user_init(&mut sp, &[]).unwrap();
        sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores,mask_cpu:".into());
        sp.env.insert("SLURM_CPU_BIND_LIST".into(), "0xFF00,0x00FF".into());
        sp.mask = gpu_core::cpuset::CpuSet::parse("8-15").unwrap();
        task_init(&mut sp, &[], st_sp.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), "8-15");
    }

    #[test]
    fn master_addr_can_be_the_first_nodes_addr_or_hostname() {
        let words = args(&["master_addr=addr", "slurm_conf=/etc/slurm/slurm.conf"]);
        let conf = "NodeName=node[1-2] NodeHostname=h[1-2] NodeAddr=10.0.0.[1-2]\n";
        let run = |words: &[String], setup: &dyn Fn(&mut FakeSpank)| {
            let mut sp = FakeSpank::task(1, 0, 2);
            sp.options.insert("auto-rdzv", String::new());
            setup(&mut sp);
            let st_sp = user_init(&mut sp, words).unwrap();
            task_init(&mut sp, words, st_sp.as_ref()).unwrap();
            sp
        };
        let sp = run(&words, &|sp| {
            sp.files.insert("/etc/slurm/slurm.conf".into(), conf.into());
        });
        assert_eq!(sp.var("MASTER_ADDR"), Some("10.0.0.1"), "every node, not only the first");
        // Through an included file, and as the NodeHostname.
        let host = args(&["master_addr=hostname", "slurm_conf=/etc/slurm/slurm.conf"]);
        let sp = run(&host, &|sp| {
            sp.files.insert("/etc/slurm/slurm.conf".into(), "Include nodes.conf\n".into());
            sp.files.insert("/etc/slurm/nodes.conf".into(), conf.into());
        });
        assert_eq!(sp.var("MASTER_ADDR"), Some("h1"));
        // Cloud nodes: SLURM_NODE_ALIASES first.
        let sp = run(&words, &|sp| {
            sp.env.insert("SLURM_NODE_ALIASES".into(), "node1:10.9.9.9:ip-10-9-9-9".into());
        });
        assert_eq!(sp.var("MASTER_ADDR"), Some("10.9.9.9"));
        // Not found: the NodeName, and one line saying why.
        let sp = run(&words, &|_| {});
        assert_eq!(sp.var("MASTER_ADDR"), Some("node1"));
        let errors = sp.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("master_addr=addr: /etc/slurm/slurm.conf:"), "{errors:?}");
        assert!(errors[0].ends_with("MASTER_ADDR stays node1"), "{errors:?}");
    }

    #[test]
    fn het_tasks_get_step_wide_ranks_from_their_environment() {
        // Component 1 of `srun -n1 A : -n2 B`: the items are the component's.
        let mut sp = FakeSpank::task(0, 1, 1);
        sp.options.insert("auto-rdzv", String::new());
        for (k, v) in [("JobId", 78), ("NNodes", 1), ("TotalTaskCount", 2), ("LocalTaskCount", 2)] {
            sp.items.insert(k, v);
        }
        for (k, v) in [
            ("SLURM_JOB_ID", "77"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_NUM_TASKS", "3"),
            ("SLURM_STEP_NUM_NODES", "2"),
        ] {
            sp.env.insert(k.into(), v.into());
        }
        task_init(&mut sp, &[], None).unwrap();
        assert_eq!(sp.var("RANK"), Some("2"));
        assert_eq!(sp.var("WORLD_SIZE"), Some("3"));
        assert_eq!(sp.var("NODE_RANK"), Some("1"));
        assert_eq!(sp.var("MASTER_ADDR"), Some("node1"));
        let mut leader = FakeSpank::task(0, 0, 0);
        leader.options.insert("auto-rdzv", String::new());
        leader.env.insert("SLURM_STEP_NUM_TASKS".into(), "3".into());
        leader.env.insert("SLURM_JOB_ID".into(), "77".into());
        task_init(&mut leader, &[], None).unwrap();
        assert_eq!(leader.var("MASTER_PORT"), sp.var("MASTER_PORT"), "one port for all components");
    }

    #[test]
    #[should_panic(expected = "debug_panic=task_init")]
    fn debug_panic_fires_in_debug_builds() {
        let mut sp = FakeSpank::task(0, 0, 0);
        let _ = task_init(&mut sp, &args(&["debug_panic=task_init"]), None);
    }
}
