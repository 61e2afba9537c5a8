//! `--gpu-affinity` in the hooks: the step's GPU table and topology read, and
//! the GPU device directory opened, once before fork ([`load_for_step`]), and
//! each task bound to the CPUs closest to its GPUs ([`bind`]). Its failures
//! are its own: logged here, never returned to the hook, so `--auto-rdzv`
//! still applies.

use super::*;

/// `user_init`'s part: with `--gpu-affinity` in force, the GPU table and
/// topology into `state` (or, when they cannot be read, why, logged once),
/// and the GPU device directory opened for the tasks' probes
/// ([`open_dev_dir`]).
///
/// # Errors
/// Slurm cannot say whether the option was given.
pub(super) fn load_for_step<S: Spank + Node>(
    sp: &S,
    state: &mut StepState<S::DevDir>,
) -> Result<(), HookError> {
    let Some(opts) = gpu_affinity(sp, &state.config, state.options)? else { return Ok(()) };
    match load_topology(sp, &state.config) {
        Ok(mut t) => {
            let binds =
                (t.user_cpu_bind.is_none() || opts.force) && mpi_daemon(sp, state.argv.as_deref()).is_none();
            (t.node_share_out, t.first_task) = plan_node(sp, &state.config, &t, binds);
            t.devices_constrainable = devices_constrainable(sp, &state.config);
            state.topology = Some(t);
            state.dev_dir = open_dev_dir(sp, &state.config);
        }
        Err(why) => state.topology_problem = Some(why),
    }
    Ok(())
}

/// Whether a device constraint can be in force for this step's tasks
/// ([`task_plan::devices::constraint_possible`]), from slurmstepd's
/// `TaskPlugin` and, with task/cgroup, the `cgroup.conf` beside its
/// `slurm.conf`. Where none can, the tasks make no device probes: each would
/// find every GPU reachable. Whatever cannot be read counts as "it can", and
/// the tasks probe as before; nothing is logged.
fn devices_constrainable<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> bool {
    let Ok(conf) = sp.stepd_conf() else { return true };
    let read_cgroup_conf = || {
        let slurm_conf = conf.path.clone().unwrap_or_else(|| {
            task_plan::nodeaddr::slurm_conf_path(
                cfg.slurm_conf.as_deref(),
                sp.process_env("SLURM_CONF").as_deref(),
            )
        });
        let path = std::path::Path::new(&slurm_conf).with_file_name(task_plan::devices::CGROUP_CONF);
        sp.read_trusted(&path.to_string_lossy(), task_plan::devices::MAX_CGROUP_CONF).ok()
    };
    let plugins =
        task_plan::devices::task_plugin_in_force(conf.task_plugin.as_deref(), slurm_sys::VERSION_NUMBER);
    let cgroup_conf = plugins.filter(|p| task_plan::devices::task_cgroup(p)).and_then(|_| read_cgroup_conf());
    task_plan::devices::constraint_possible(plugins, cgroup_conf.as_deref())
}

/// Opens the GPU device directory once per step, here in slurmstepd before
/// the tasks fork, for [`probe_devices`] in each task. Here the process is
/// still in the host's mount namespace; by `task_init` a container plugin
/// listed before spank_gpu may have moved the task into the container's
/// (pyxis's `slurm_spank_task_init` `setns`es it, pyxis_slurmstepd.c), whose
/// `/dev` holds only the task's GPUs or is not there at all. The task
/// inherits the descriptor and asks relative to it. Nothing is logged when it
/// opens; when it cannot, one debug line, and the tasks probe by path.
fn open_dev_dir<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Option<S::DevDir> {
    match injected(cfg, "open_dev_dir").and_then(|()| sp.open_dev_dir(cfg.dev_dir())) {
        Ok(opened) => Some(opened),
        Err(e) => {
            let line = format!("--gpu-affinity: opening the device directory: {e}; tasks probe by path");
            sp.log(Level::Debug, &line);
            None
        }
    }
}

/// What the plugin does to a task's mask, for `--auto-rdzv`'s
/// `OMP_NUM_THREADS` ([`rendezvous::set_task_env`](super::rendezvous::set_task_env)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bound {
    /// The plugin does not bind it (`--gpu-affinity` off, the user's
    /// `--cpu-bind`, Slurm's mask kept, a failure): it has the mask it had.
    No,
    /// The plugin binds it to CPUs of its own: those of its GPUs' part of
    /// their domains. `share_gpus`: when it sees more GPUs than it is bound
    /// for (every local task sees every GPU and takes its share by local
    /// rank), the GPUs of that share
    /// ([`task_plan::binding::TaskShare::visible_share`]). `cpus`: how many
    /// CPUs it is bound to.
    Plugin { share_gpus: Option<u32>, cpus: u32 },
}

/// A task's binding, decided in `task_init` ([`plan`]) and applied at its
/// end ([`apply`]).
pub(super) struct Pending {
    opts: GpuAffinity,
    planned: PlannedBinding,
}

impl Pending {
    /// What the task will have once the binding is applied.
    pub(super) fn bound(&self) -> Bound {
        let cpus = u32::try_from(self.planned.binding.cpus.len()).unwrap_or(u32::MAX);
        Bound::Plugin { share_gpus: self.planned.share_gpus, cpus }
    }
}

/// `task_init`'s first part: decides this task's binding where
/// `--gpu-affinity` is in force. `None`: the task keeps the mask it has,
/// for a reason told here (one log line for a failure, and one stderr line
/// with `verbose`).
pub(super) fn plan<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    state: Option<&StepState<S::DevDir>>,
) -> Option<Pending> {
    let opts = match gpu_affinity(sp, cfg, state.and_then(|s| s.options)) {
        Ok(Some(opts)) => opts,
        Ok(None) => return None,
        Err(e) => {
            sp.log(Level::Error, &format!("--gpu-affinity: {e}; this task keeps Slurm's binding"));
            return None;
        }
    };
    // An MPI launcher's daemon: the ranks it starts would inherit its mask.
    if let Some(daemon) = mpi_daemon(sp, state.and_then(|s| s.argv.as_deref())) {
        if opts.verbose {
            sp.task_stderr(&format!(
                "spank-gpu: gpu-affinity: {daemon} is an MPI launcher's daemon: not bound (its ranks would inherit the mask)"
            ));
        }
        return None;
    }
    match plan_task_binding(sp, cfg, opts, state) {
        Ok(planned) => planned.map(|planned| Pending { opts, planned }),
        Err(e) => {
            failed(sp, opts, &e);
            None
        }
    }
}

/// One log line for a binding that failed, and one stderr line with `verbose`.
fn failed<S: Spank + Node>(sp: &S, opts: GpuAffinity, e: &HookError) {
    sp.log(Level::Error, &format!("--gpu-affinity: {e}; this task keeps Slurm's binding"));
    if opts.verbose {
        sp.task_stderr(&format!("spank-gpu: gpu-affinity: {e}; Slurm's binding kept"));
    }
}

/// What a table without machine records (an older agent's) costs the binding.
pub(super) const DEGRADED: &str = "each task gets its GPUs' whole local CPUs, not a share of them";

/// `--gpu-affinity` in force for this step: as `user_init` read it
/// (`step`), else asked of Slurm.
pub(super) fn gpu_affinity<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    step: Option<StepOptions>,
) -> Result<Option<GpuAffinity>, HookError> {
    match step {
        Some(options) => Ok(options.gpu_affinity),
        None => option_in_force(sp, UserOption::GpuAffinity, cfg.gpu_affinity, options::parse_gpu_affinity),
    }
}

/// Reads the node's GPU table once per step (before fork), for the tasks to
/// bind with: the GPUs and, in a version 3 table, the machine (no other file:
/// the plugin has no XML parser). A table of an older agent (version 1 or 2)
/// binds from its GPU rows alone, degraded ([`task_plan::gputable`]), and one
/// line says so. Without a table, nothing is bound and one line says why
/// (returned too, for `verbose`).
fn load_topology<S: Spank + Node>(sp: &S, cfg: &PluginConfig) -> Result<StepTopology, String> {
    let dir = cfg.topology_dir.trim_end_matches('/');
    let loaded = (|| -> Result<StepTopology, String> {
        let table_path = format!("{dir}/{TABLE_FILE}");
        let table_text = sp.read_trusted(&table_path, gputable::MAX_BYTES).map_err(|e| e.to_string())?;
        let table = GpuTable::parse(&table_text).map_err(|e| format!("{table_path}: {e}"))?;
        let (topology, degraded) = table.topology();
        let topology = topology.into_owned();
        if degraded {
            sp.log(
                Level::Info,
                &format!(
                    "--gpu-affinity: {table_path} is an older agent's table (no machine records): {DEGRADED}; \
                     `gpu-node-agent topology --write` rewrites it"
                ),
            );
        }
        let step_gpus = env(sp, "SLURM_STEP_GPUS").and_then(|s| binding::gpu_indices(&s, &table));
        let user_cpu_bind = env(sp, "SLURM_CPU_BIND_TYPE").filter(|b| !b.is_empty());
        Ok(StepTopology {
            table,
            topology,
            degraded,
            step_gpus,
            user_cpu_bind,
            node_share_out: None,
            first_task: None,
            devices_constrainable: true,
        })
    })();
    loaded.map_err(|e| {
        let why = format!("no usable GPU table ({e}; is gpu-node-agent running?)");
        sp.log(Level::Error, &format!("--gpu-affinity: {why}; tasks keep Slurm's CPU binding"));
        why
    })
}

/// The node's share-out for the tasks, planned once here before they fork
/// ([`binding::node_share_out`]) as local task 0 would see the step: the
/// step's environment, and slurmstepd's CPU mask for the task's (what the
/// tasks have under task/none, and under task/affinity or task/cgroup on a
/// whole node). A task that sees otherwise plans alone, as without it. With
/// it, where the plugin `binds` the tasks, local task 0's binding
/// ([`StepTopology::first_task`]). Nothing is logged: without them each task
/// plans the node itself, and sets its own `OMP_NUM_THREADS`.
fn plan_node<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    topo: &StepTopology,
    binds: bool,
) -> (Option<binding::NodeShareOut>, Option<(u32, Option<u32>)>) {
    let Ok(own) = injected(cfg, "affinity").and_then(|()| sp.affinity()) else { return (None, None) };
    let Ok(local_tasks) = sp.item(Item::LocalTaskCount) else { return (None, None) };
    let lookup = |name: &str| env(sp, name);
    let template = SlurmTask {
        local_id: 0,
        local_tasks,
        step_gpus: topo.step_gpus.clone(),
        env: &lookup,
        own,
        slurm_version: slurm_sys::VERSION_NUMBER,
        devices: task_plan::devices::DeviceView::Unknown,
    };
    let node = binding::node_share_out(&topo.topology, &topo.table, &template);
    let first = binds
        .then(|| binding::plan_slurm_task_with(&topo.topology, &topo.table, &template, node.as_ref()).ok())
        .flatten()
        .filter(|(_, b)| b.note.is_none())
        .map(|(share, b)| (u32::try_from(b.cpus.len()).unwrap_or(u32::MAX), share.visible_share));
    (node, first)
}

/// Decides this task's binding to the CPUs closest to its GPUs: `None` when
/// it keeps Slurm's mask (told here).
fn plan_task_binding<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    opts: GpuAffinity,
    state: Option<&StepState<S::DevDir>>,
) -> Result<Option<PlannedBinding>, HookError> {
    let Some(p) = plan_binding(sp, cfg, opts, state)? else { return Ok(None) };
    if let Some(note) = &p.binding.note {
        sp.log(Level::Info, &format!("--gpu-affinity: task {}: {note}; Slurm's mask {} kept", p.rank, p.own));
        if opts.verbose {
            p.say(sp, &format!("GPUs {}: {note}; Slurm's mask {} kept", p.gpus, p.own));
        }
        return Ok(None);
    }
    Ok(Some(p))
}

/// `task_init`'s last part: binds the task as [`plan`] decided, prefers its
/// GPUs' memory with `mem`, and says so with `verbose`. Returns what the task
/// has: [`Bound::No`] when the binding failed (one log line, and one stderr
/// line with `verbose`), and the CPUs it has where the kernel trimmed the
/// mask (`sched_setaffinity` keeps only those of the task's cpuset that are
/// online, silently).
pub(super) fn apply<S: Spank + Node>(sp: &mut S, cfg: &PluginConfig, pending: Pending) -> Bound {
    let planned = pending.bound();
    let Pending { opts, planned: mut p } = pending;
    let mut bound = planned;
    if p.binding.cpus != p.own {
        let set = injected(cfg, "set_affinity").and_then(|()| sp.set_affinity(&p.binding.cpus));
        if let Err(e) = set {
            failed(sp, opts, &HookError::Internal(format!("binding to CPUs {}: {e}", p.binding.cpus)));
            return Bound::No;
        }
        if let Some(has) = sp.affinity().ok().filter(|has| *has != p.binding.cpus) {
            let cpus = u32::try_from(has.len()).unwrap_or(u32::MAX);
            bound = Bound::Plugin { share_gpus: p.share_gpus, cpus };
            p.binding.cpus = has;
        }
    }
    if opts.mem {
        let preferred = injected(cfg, "prefer_memory").and_then(|()| sp.prefer_memory(&p.binding.numa_nodes));
        if let Err(e) = preferred {
            sp.log(Level::Info, &format!("--gpu-affinity=mem: {e}"));
        }
    }
    if opts.verbose {
        let numa: Vec<String> = p.binding.numa_nodes.iter().map(u32::to_string).collect();
        let older =
            if p.degraded { format!(" (older agent's GPU table: {DEGRADED})") } else { String::new() };
        p.say(sp, &format!("GPUs {} NUMA {} CPUs {}{older}", p.gpus, numa.join(","), p.binding.cpus));
    }
    bound
}

/// The task's GPUs as its device cgroup shows them, when a device constraint
/// is in force ([`task_plan::devices`]): one `access(2)` per GPU of the table,
/// in the forked task, where slurmstepd has already applied the task's
/// device constraint (before `task_init` on every release). Where nothing is
/// refused, or a probe cannot tell, the variables are used.
///
/// Each file is looked up in `opened`, the device directory `user_init`
/// opened before the fork ([`open_dev_dir`]), not by path: by now the task
/// may be in a container's mount namespace (pyxis listed first), whose
/// `/dev` would not show the GPUs the cgroup refuses. Only without it (not
/// opened, no step state, or a descriptor that no longer names the
/// directory) is `{dir}/nvidia<minor>` looked up in the task.
fn probe_devices<S: Spank + Node>(
    sp: &S,
    table: &GpuTable,
    dir: &str,
    opened: Option<&S::DevDir>,
) -> task_plan::devices::DeviceView {
    use task_plan::devices::{self, Access};
    let probe = |minor: u32| {
        opened
            .and_then(|opened| sp.device_access_at(opened, &devices::device_name(minor)))
            .unwrap_or_else(|| sp.device_access(&devices::device_path(dir, minor)))
    };
    let probes: Vec<(u32, Access)> =
        table.gpus.iter().map(|g| (g.slurm_index, g.minor.map_or(Access::Unknown, probe))).collect();
    devices::view(&probes)
}

/// A task's binding, decided but not applied.
struct PlannedBinding {
    rank: u32,
    local_id: u32,
    /// The task's mask before binding.
    own: CpuSet,
    /// The task's GPUs as the verbose line names them (empty without `verbose`).
    gpus: String,
    /// The GPUs of its share, when it is a part of those it sees
    /// ([`task_plan::binding::TaskShare::visible_share`]).
    share_gpus: Option<u32>,
    binding: Binding,
    /// Planned on an older agent's table, from its GPU rows alone.
    degraded: bool,
}

impl PlannedBinding {
    /// One line on the task's stderr (for `verbose`: the callers check it).
    fn say<S: Spank>(&self, sp: &S, text: &str) {
        sp.task_stderr(&format!(
            "spank-gpu: gpu-affinity: task {} (local {}): {text}",
            self.rank, self.local_id
        ));
    }
}

/// Decides this task's binding from the step's table (borrowed, not copied:
/// this runs once per task on the launch path) and what Slurm told the task.
/// `None` when the task keeps Slurm's mask for a reason already told (no
/// table, the user's `--cpu-bind`, no GPU).
fn plan_binding<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    opts: GpuAffinity,
    state: Option<&StepState<S::DevDir>>,
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
    let own = injected(cfg, "affinity")
        .and_then(|()| sp.affinity())
        .map_err(|e| HookError::Internal(format!("reading the task's CPU mask: {e}")))?;
    let lookup = |name: &str| env(sp, name);
    let task = SlurmTask {
        local_id,
        local_tasks,
        step_gpus: topo.step_gpus.clone(),
        env: &lookup,
        own: own.clone(),
        slurm_version: slurm_sys::VERSION_NUMBER,
        devices: if topo.devices_constrainable {
            probe_devices(sp, &topo.table, cfg.dev_dir(), state.and_then(|s| s.dev_dir.as_ref()))
        } else {
            task_plan::devices::DeviceView::Free
        },
    };
    // The step's CPUs on the node: Slurm's per-task masks (task/affinity binds
    // every task, cyclic by default, whatever its GPU) are replaced, unless
    // Slurm's is already close to the task's GPUs and the plan cannot see
    // the tasks that share them.
    let (share, planned) =
        match binding::plan_slurm_task_with(&topo.topology, &topo.table, &task, topo.node_share_out.as_ref())
        {
            Ok(decided) => decided,
            Err(why) => {
                say(&format!("{why}: Slurm's binding kept"));
                return Ok(None);
            }
        };
    // The verbose line's words, only for it: this runs in every task.
    let gpus = if opts.verbose {
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
        format!("{}{from}", gpus.join(", "))
    } else {
        String::new()
    };
    Ok(Some(PlannedBinding {
        rank,
        local_id,
        own,
        gpus,
        share_gpus: share.visible_share,
        binding: planned,
        degraded: topo.degraded,
    }))
}
