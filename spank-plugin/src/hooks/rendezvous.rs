//! `--auto-rdzv` in the hooks: srun's step layout ([`local_user_init`]),
//! the step's checks once before fork ([`prepare_step`]) and each task's
//! environment ([`set_task_env`]). Its failures never remove `--gpu-affinity`.

use super::*;

/// `slurm_spank_local_user_init`, srun only, once the step exists and before
/// it launches: with `--auto-rdzv` in force on a step of several nodes whose
/// task 0 can be on another node than the first ([`layout::layout_question`]:
/// `-m arbitrary`, a heterogeneous allocation, 26.05's topology order),
/// asks slurmctld where the step's tasks are and, when task 0 is not on the
/// step's first node, tells the step the nodes' order of first tasks
/// ([`layout::TASK_ORDER_VAR`]), so that every node follows Slurm's
/// numbering with `MASTER_ADDR` on task 0's node (see [`task_plan::layout`]).
/// One RPC per such step and none for the default layout; when it fails, one
/// line at info level (shown with `srun -v`) and the step keeps node order.
///
/// # Errors
/// [`HookError::Internal`] when Slurm cannot say the step's ids or node count.
pub fn local_user_init<S: Spank + Node>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    let Some(cfg) = config(sp, args, false) else { return Ok(()) };
    // An enclosing step's word (srun inside a task) reaches this step too (srun
    // copied its environment before the hook); its JOB.STEP tag makes the nodes
    // ignore it.
    if auto_rdzv(sp, &cfg, None)?.is_none() || item(sp, Item::NNodes)? < 2 {
        return Ok(());
    }
    let release = slurm_formats::release::Version::from_number(slurm_sys::VERSION_NUMBER).release;
    let dist = sp.process_env("SLURM_DISTRIBUTION");
    let het = sp.process_env("SLURM_HET_SIZE");
    let Some(why) = layout::layout_question(dist.as_deref(), het.as_deref(), release, || sp.srun_topology())
    else {
        return Ok(());
    };
    sp.log(Level::Debug, &format!("--auto-rdzv: asking slurmctld for the step's layout: {why}"));
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

/// `user_init`'s part, once per step before fork: the job's values before
/// any container changes them, the first node's address for
/// `master_addr=hostname|addr` and, on the node that holds `MASTER_ADDR`, a
/// note (or with `strict` the step's failure) when its port cannot be bound,
/// so a conflict is reported to the user instead of a rendezvous timeout.
///
/// # Errors
/// Slurm cannot say what the step is or what options it was given.
pub(super) fn prepare_step<S: Spank + Node>(
    sp: &S,
    state: &mut StepState<S::DevDir>,
) -> Result<Vec<(String, String)>, HookError> {
    let cfg = &state.config;
    let Some(opts) = auto_rdzv(sp, cfg, state.options)? else { return Ok(Vec::new()) };
    let settings = settings(cfg, opts);
    state.net = step_net(sp, cfg, opts.verbose);
    state.before_fork =
        Some(container::Snapshot::take(claimed_names(cfg, &settings), &|name: &str| env(sp, name)));
    state.pyxis = Some(pyxis_step(sp)).filter(|p| p.container);
    if state.pyxis.is_some() {
        state.mount_ns = mount_ns(sp);
    }
    let step = read_step(sp, cfg, false, state.argv.as_deref())?;
    let plan = match rdzv::plan_step(&step, &settings) {
        Ok(plan) => plan,
        Err(e) => {
            sp.log(Level::Error, &format!("--auto-rdzv: {e}; setting nothing for this step"));
            return Ok(Vec::new());
        }
    };
    if cfg.master_addr != MasterAddr::NodeName {
        state.master_addr = find_master_addr(sp, cfg, &plan.master_addr);
    }
    let first_task = state.topology.as_ref().and_then(|t| t.first_task);
    let preset = step_wide_env(sp, cfg, &step, &settings, state.master_addr.clone(), first_task);
    // The node that holds MASTER_ADDR probes the port. Before fork only the
    // component's node index is known; in a het step, also match the name.
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_owned();
    let here = sp.sysctl("kernel/hostname").map(|h| short(h.trim()));
    if step.node_id != step.master_node() || (step.het && here != Some(short(&plan.master_addr))) {
        return Ok(preset);
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
    Ok(preset)
}

/// Every name the plugin may set in a task of the step (its record aside):
/// the computed variables, the plugstack line's defaults, and the interface
/// variables where the line configures them.
fn claimed_names<'a>(cfg: &'a PluginConfig, settings: &'a Settings) -> impl Iterator<Item = &'a str> {
    let names = rdzv::COMPUTED_VARS.iter().copied().filter(|n| *n != rdzv::RECORD_VAR);
    let names = names.chain(settings.env_defaults.iter().map(|(n, _)| n.as_str()));
    let ifaces = netif::configured(&cfg.nccl_socket_net, &cfg.env_defaults);
    names.chain(ifaces.then_some([netif::NCCL_VAR, netif::GLOO_VAR]).into_iter().flatten())
}

/// `PYXIS_CONTAINER_ENV` as the plugin sets it: [`claimed_names`], comma-separated.
fn pyxis_keep_list(cfg: &PluginConfig, opts: AutoRdzv) -> String {
    claimed_names(cfg, &settings(cfg, opts)).collect::<Vec<_>>().join(",")
}

/// Largest plugstack file (or included one) read to tell the plugins' order.
const MAX_PLUGSTACK: usize = 1 << 20;

/// The plugstack files as slurmstepd (root) reads them: root's, no link.
struct NodeStack<'a, S>(&'a S);

impl<S: Node> task_plan::plugstack::StackFiles for NodeStack<'_, S> {
    fn read(&mut self, path: &std::path::Path) -> std::io::Result<String> {
        let path = path.to_str().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        self.0.read_trusted(path, MAX_PLUGSTACK)
    }

    fn names(&mut self, dir: &std::path::Path) -> std::io::Result<Vec<String>> {
        let dir = dir.to_str().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        self.0.dir_names(dir)
    }

    fn exists(&mut self, path: &std::path::Path) -> bool {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return false };
        self.names(dir).is_ok_and(|names| names.iter().any(|n| std::ffi::OsStr::new(n) == name))
    }
}

/// `init_post_opt`'s part in slurmstepd (issue 46): with spank_gpu listed
/// before pyxis, every hook of ours runs before pyxis's, its
/// `init_post_opt` included, which reads `PYXIS_CONTAINER_ENV` from the
/// job's environment as the default of `--container-env` (pyxis's args.c
/// `pyxis_args_check_environment_variables`: only where the user gave no
/// `--container-env`, whose names pyxis then keeps instead); its `task_init`
/// imports the container's environment over the task's except those names
/// (`spank_import_container_env`, no overwrite). So where `--auto-rdzv` is
/// in force, spank_gpu comes first in the plugstack slurmstepd read and the
/// job's environment has no `PYXIS_CONTAINER_ENV` (the user's own, or ours
/// from an enclosing step), the plugin sets it to the names it sets, and
/// pyxis keeps its values. Whether the step runs a container is not known
/// yet (`spank_option_getopt` answers `ESPANK_NOT_AVAIL` here, for pyxis's
/// options as for ours, whose callbacks have run): `user_init` takes the
/// list back where no container runs or the user's `--container-env`
/// replaced it ([`drop_unused_keep_list`]). What cannot be read (the
/// plugstack) sets nothing, one debug line.
///
/// # Errors
/// [`HookError::Internal`] when Slurm cannot say whether `--auto-rdzv` is in force.
pub(super) fn keep_through_pyxis<S: Spank + Node>(sp: &mut S, cfg: &PluginConfig) -> Result<(), HookError> {
    use task_plan::plugstack::{StackOrder, stack_order};
    let Some(opts) = auto_rdzv(sp, cfg, None)? else { return Ok(()) };
    if env(sp, container::PYXIS_ENV.env).is_some() {
        return Ok(());
    }
    let plugstack = match sp.stepd_conf().map(|c| c.plugstack) {
        Ok(Some(path)) => path,
        Ok(None) => return Ok(()),
        Err(e) => {
            sp.log(
                Level::Debug,
                &format!("--auto-rdzv: {e}; cannot tell whether pyxis runs after spank-gpu"),
            );
            return Ok(());
        }
    };
    if stack_order(std::path::Path::new(&plugstack), &mut NodeStack(&*sp)) != StackOrder::SpankGpuFirst {
        return Ok(());
    }
    if let Err(e) = sp.setenv(container::PYXIS_ENV.env, &pyxis_keep_list(cfg, opts), true) {
        sp.log(
            Level::Error,
            &format!(
                "--auto-rdzv: setting {}: {e}; pyxis, which runs after spank_gpu, may replace its values",
                container::PYXIS_ENV.env
            ),
        );
    }
    Ok(())
}

/// In `user_init`, where the options of pyxis can be read: the list
/// [`keep_through_pyxis`] set (or an enclosing step's, the same) is removed
/// from the job's environment where the step runs no pyxis container, or
/// where the user's `--container-env` replaced it in pyxis, so the tasks do
/// not see a list that did nothing. A container step keeps it: its tasks see
/// it, and an `srun` inside them passes it on to their own container steps.
pub(super) fn drop_unused_keep_list<S: Spank + Node>(sp: &mut S, cfg: &PluginConfig, opts: Option<AutoRdzv>) {
    let Some((opts, list)) = opts.zip(env(sp, container::PYXIS_ENV.env)) else { return };
    if list != pyxis_keep_list(cfg, opts) {
        return;
    }
    let own_list = sp.foreign_option(container::PYXIS_ENV).ok().flatten().is_some_and(|v| !v.is_empty());
    if pyxis_step(sp).container && !own_list {
        return;
    }
    if let Err(e) = sp.unsetenv(container::PYXIS_ENV.env) {
        sp.log(Level::Debug, &format!("--auto-rdzv: removing {}: {e}", container::PYXIS_ENV.env));
    }
}

/// The step-wide variables ([`rdzv::is_step_wide`]) a task of this node
/// would set, and local task 0's value of those usually the same in every
/// task ([`rdzv::PRESET_PER_TASK`]), planned here before the fork for the
/// node's first task (`first_task`: its binding, when `--gpu-affinity`
/// binds it): `user_init` sets them in the job's environment once, and the
/// tasks inherit them. A task whose own plan differs (a container changed a
/// value, a heterogeneous step's indices, other CPUs) sets its own in
/// `task_init`.
fn step_wide_env<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    step: &Step,
    settings: &Settings,
    master_addr: Option<String>,
    first_task: Option<(u32, Option<u32>)>,
) -> Vec<(String, String)> {
    let input = rdzv::TaskInput {
        step,
        settings: settings.clone(),
        master_addr: master_addr.map(|addr| (addr, cfg.master_addr.names())),
        local_id: 0,
        global_id: 0,
        mask: first_task
            .map_or(rdzv::Mask::Unknown, |(cpus, share_gpus)| rdzv::Mask::Bound { cpus, share_gpus }),
        // The interface variables are per task: none is step-wide.
        net: None,
    };
    // The step was planned just before (prepare_step); it cannot fail here.
    let Ok(template) = rdzv::task_env(input, &|name: &str| env(sp, name), &mut || Ok(None)) else {
        return Vec::new();
    };
    template
        .plan
        .to_set()
        .filter(|(name, _)| rdzv::is_step_wide(name, settings) || rdzv::PRESET_PER_TASK.contains(name))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// Sets the step-wide variables ([`step_wide_env`]) in the job's
/// environment, before the fork; returns those set. Those Slurm refuses are
/// left to each task (one debug line).
pub(super) fn set_step_wide<S: Spank + Node>(
    sp: &mut S,
    vars: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut set = Vec::with_capacity(vars.len());
    let mut refused = Vec::new();
    for (name, value) in vars {
        match sp.setenv(&name, &value, true) {
            Ok(_) => set.push((name, value)),
            Err(e) => refused.push(format!("{name} ({e})")),
        }
    }
    if !refused.is_empty() {
        let names = refused.join(", ");
        sp.log(
            Level::Debug,
            &format!("--auto-rdzv: Slurm refused to set {names} before the fork; each task sets them"),
        );
    }
    set
}

/// The node's network for the step's tasks, read once here before the
/// fork: with interface variables on the plugstack line, or `verbose`
/// (which says what NCCL and gloo will use). Its interfaces (`getifaddrs`,
/// slurmstepd's network namespace: the node's), what the plugin may set
/// for NCCL and gloo here (one log line for what it cannot), the host's
/// `/etc/nccl.conf` (root's, trusted), and for `verbose` gloo's host name as
/// `/etc/hosts` gives it; the job's user's passwd home for the tasks'
/// `~/.nccl.conf`. Nothing here fails or delays the step: what cannot be
/// read is one log line, and the variables it would decide are not set.
fn step_net<S: Spank + Node>(sp: &S, cfg: &PluginConfig, verbose: bool) -> Option<StepNet> {
    let asked = netif::configured(&cfg.nccl_socket_net, &cfg.env_defaults);
    if !asked && !verbose {
        return None;
    }
    let hostname = sp.sysctl("kernel/hostname").map(|h| h.trim().to_owned()).filter(|h| !h.is_empty());
    let node = hostname.as_deref().map_or("this node", |h| h.split('.').next().unwrap_or(h)).to_owned();
    let ifaces = sp.interfaces().map_err(|e| e.to_string());
    let offers = match &ifaces {
        Ok(i) => netif::node_offers(&cfg.nccl_socket_net, &cfg.env_defaults, i, &node),
        Err(e) => netif::unreadable(&cfg.nccl_socket_net, &cfg.env_defaults, e, &node),
    };
    for line in &offers.log {
        sp.log(Level::Error, &format!("--auto-rdzv: {line}"));
    }
    if let (Err(e), false) = (&ifaces, asked) {
        sp.log(
            Level::Debug,
            &format!(
                "--auto-rdzv: reading the network interfaces: {e}; verbose cannot say what NCCL and gloo use"
            ),
        );
    }
    let held = offers.offers.iter().any(|o| o.held_by_conf);
    let site_conf = match sp.read_trusted(netif::SITE_CONF, netif::MAX_CONF) {
        Ok(text) => Ok(netif::conf_value(&text, netif::NCCL_VAR)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            if held {
                sp.log(
                    Level::Error,
                    &format!(
                        "--auto-rdzv: {e}; whether {} sets {} cannot be told, so neither {} nor {} is set on {node}",
                        netif::SITE_CONF,
                        netif::NCCL_VAR,
                        netif::NCCL_VAR,
                        netif::GLOO_VAR
                    ),
                );
            }
            Err(e.to_string())
        }
    };
    let hosts = match (&hostname, verbose) {
        (Some(h), true) => sp
            .read_trusted(netif::HOSTS_FILE, netif::MAX_HOSTS)
            .map(|text| netif::hosts_addrs(&text, h))
            .map_err(|e| e.to_string()),
        _ => Ok(Vec::new()),
    };
    let home = if held || verbose {
        sp.item(Item::JobUid)
            .map_err(|e| e.to_string())
            .and_then(|uid| sp.user_home(uid).map(|h| (uid, h)).map_err(|e| e.to_string()))
    } else {
        Err("not needed".to_owned())
    };
    Some(StepNet { node: netif::NodeNet { node, ifaces, offers, site_conf, hostname, hosts }, home })
}

/// `~/.nccl.conf`'s `NCCL_SOCKET_IFNAME`, read in the task as the job's
/// user from the passwd home `user_init` found. A file NCCL could not read
/// either (missing, not the user's to read) sets nothing.
fn user_conf<S: Spank + Node>(sp: &S, net: &StepNet) -> netif::ConfRead {
    use std::io::ErrorKind::{NotADirectory, NotFound, PermissionDenied};
    let (uid, home) = net.home.as_ref().map_err(|e| format!("the job's user's home is unknown: {e}"))?;
    let path = format!("{}/{}", home.trim_end_matches('/'), netif::USER_CONF);
    match sp.read_user_file(&path, netif::MAX_CONF, *uid) {
        Ok(text) => Ok(netif::conf_value(&text, netif::NCCL_VAR)),
        Err(e) if matches!(e.kind(), NotFound | PermissionDenied | NotADirectory) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// `task_init`'s part, in each forked task before `exec`: sets the task's
/// rendezvous, rank and thread environment where `--auto-rdzv` is in force.
/// `bound`: whether `--gpu-affinity` bound this task (its mask is its own)
/// and, when to a share of the GPUs it sees, how many GPUs that share has
/// (`OMP_NUM_THREADS` divides by them, nothing else does).
///
/// # Errors
/// [`HookError::FailStep`] with `--auto-rdzv=strict` and a port that cannot
/// be bound; [`HookError::Internal`] when Slurm cannot say what the task is
/// (then nothing is set, and with `verbose` the task is told why).
pub(super) fn set_task_env<S: Spank + Node>(
    sp: &mut S,
    cfg: &PluginConfig,
    state: Option<&StepState<S::DevDir>>,
    bound: affinity::Bound,
    pass: &Pass,
) -> Result<(), HookError> {
    let Some(opts) = auto_rdzv(sp, cfg, state.and_then(|s| s.options))? else { return Ok(()) };
    apply(sp, cfg, state, opts, bound, pass).inspect_err(|e| {
        if *pass == Pass::First && !matches!(e, HookError::FailStep(_)) {
            unset_step_wide(sp, state);
            untold(sp, opts, &e.to_string());
        }
    })
}

/// Which time [`set_task_env`] runs in a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// The task's variables, for the binding planned.
    First,
    /// Again, where the task did not get the binding planned (it failed, or
    /// the kernel trimmed the mask), for the mask it has: what the first pass
    /// set is planned over as a container's change would be (from the values
    /// before the fork), and only what differs is set. `record`: the task's
    /// `SPANK_GPU_SET` before the first pass (an enclosing step's, or none),
    /// which the plan reads instead of the first pass's own. Only the
    /// `verbose` line is said again, with why: a task bound by the plugin
    /// has the mask the kernel trimmed to its cpuset, any other kept its own.
    Again { record: Option<String> },
}

/// A task that gets nothing gets nothing: the values `user_init` set before
/// the fork, where still in place, give way to the job's from before it.
fn unset_step_wide<S: Spank + Node>(sp: &mut S, state: Option<&StepState<S::DevDir>>) {
    let Some(state) = state else { return };
    for (name, mine) in &state.preset {
        if env(sp, name).as_deref() != Some(mine.as_str()) {
            continue;
        }
        let _ = match state.before_fork.as_ref().and_then(|b| b.get(name)) {
            Some(before) => sp.setenv(name, before, true).map(|_| ()),
            None => sp.unsetenv(name),
        };
    }
}

/// With `verbose`, the task's stderr says why nothing was set.
fn untold<S: Spank + Node>(sp: &S, opts: AutoRdzv, why: &str) {
    if opts.verbose {
        sp.task_stderr(&format!("spank-gpu: --auto-rdzv: {why}; nothing set for this step"));
    }
}

fn apply<S: Spank + Node>(
    sp: &mut S,
    cfg: &PluginConfig,
    state: Option<&StepState<S::DevDir>>,
    opts: AutoRdzv,
    bound: affinity::Bound,
    pass: &Pass,
) -> Result<(), HookError> {
    let (bound_cpus, share_gpus) = match bound {
        affinity::Bound::No => (None, None),
        affinity::Bound::Plugin { share_gpus, cpus } => (Some(cpus), share_gpus),
    };
    let step = read_step(sp, cfg, true, state.and_then(|s| s.argv.as_deref()))?;
    let net = state.and_then(|s| s.net.as_ref());
    let mut user_conf_read: Option<netif::ConfRead> = None;
    let local_id = item(sp, Item::TaskId)?;
    // Without the task's mask, OMP_NUM_THREADS counts its share of the node.
    // A task the plugin bound has the CPUs it was bound to: not asked again.
    let own = if bound_cpus.is_some() {
        None
    } else {
        match injected(cfg, "affinity").and_then(|()| sp.affinity()) {
            Ok(own) => Some(own),
            Err(e) => {
                sp.log(
                    Level::Info,
                    &format!("--auto-rdzv: the task's CPU mask cannot be read ({e}); OMP_NUM_THREADS counts its share of the node"),
                );
                None
            }
        }
    };
    // The task sees what user_init set before the fork (`preset`) as the job's values
    // from before it: the task plans as if nothing had been set, and a preset value
    // still in place is the plugin's, not the user's.
    let preset = state.map_or(&[][..], |s| s.preset.as_slice());
    let before_fork = state.and_then(|s| s.before_fork.as_ref());
    // (the value it plans with, whether the preset value is still in place)
    let seen = |name: &str| {
        if let (Pass::Again { record }, rdzv::RECORD_VAR) = (pass, name) {
            return (record.clone(), false);
        }
        let current = env(sp, name);
        match preset.iter().find(|(n, _)| n == name) {
            Some((_, mine)) if current.as_deref() == Some(mine.as_str()) => {
                (before_fork.and_then(|b| b.get(name)).map(str::to_owned), true)
            }
            _ => (current, false),
        }
    };
    // The names the plugin sets (the preset ones among them), read once: the
    // container check, the plan and what is inherited all ask.
    let read: Vec<(&str, Option<String>, bool)> = before_fork
        .map(|b| {
            b.names()
                .map(|n| {
                    let (value, inherited) = seen(n);
                    (n, value, inherited)
                })
                .collect()
        })
        .unwrap_or_default();
    let now = |name: &str| match read.iter().find(|(n, _, _)| *n == name) {
        Some((_, value, _)) => value.clone(),
        None => seen(name).0,
    };
    // What a container changed since user_init (pyxis before spank_gpu): planned against
    // the values from before the fork, so the container's are recomputed, the user's kept.
    let changes = match before_fork {
        Some(before) if read.iter().any(|(n, v, _)| before.get(n) != v.as_deref()) => {
            container::changed(before, &now, &container::Facts::from_env(&now))
        }
        _ => Vec::new(),
    };
    let global_id = env_u32(sp, "SLURM_PROCID").map_or_else(|| item(sp, Item::TaskGlobalId), Ok)?;
    let mask = match (bound_cpus, own) {
        (Some(cpus), _) => rdzv::Mask::Bound { cpus, share_gpus },
        (None, Some(own)) => rdzv::Mask::Own(own),
        (None, None) => rdzv::Mask::Unknown,
    };
    let planned = {
        let lookup = container::before_container(&changes, &now);
        let input = rdzv::TaskInput {
            step: &step,
            settings: settings(cfg, opts),
            master_addr: state.and_then(|s| s.master_addr.clone()).map(|a| (a, cfg.master_addr.names())),
            local_id,
            global_id,
            mask,
            net: net.map(|net| rdzv::NodeOffers { offers: &net.node.offers, site_conf: &net.node.site_conf }),
        };
        let mut read_conf = || match net {
            Some(net) => user_conf_read.get_or_insert_with(|| user_conf(sp, net)).clone(),
            None => Ok(None),
        };
        rdzv::task_env(input, &lookup, &mut read_conf)
    };
    let rdzv::TaskEnv { task, plan: task_plan, ifaces } = match planned {
        Ok(planned) => planned,
        Err(e) => {
            // Logged once per node by user_init; the task is told with verbose.
            if *pass == Pass::First {
                unset_step_wide(sp, state);
                untold(sp, opts, &e.to_string());
            }
            return Ok(());
        }
    };
    if let Some(problem) = ifaces.problem.as_deref().filter(|_| local_id == 0 && *pass == Pass::First) {
        sp.log(Level::Error, &format!("--auto-rdzv: {problem}"));
    }
    // A variable Slurm refuses to set does not keep the others from being set.
    let mut refused = Vec::new();
    // What user_init set, still in place (as read above; nothing has set it since) with the
    // value this task plans: inherited, not set again.
    let inherited = |name: &str, value: &str| {
        preset.iter().any(|(n, v)| n == name && v == value)
            && read.iter().any(|(n, _, still)| *n == name && *still)
    };
    for (name, value) in task_plan.to_set() {
        if inherited(name, value) {
            continue;
        }
        if let Err(e) = sp.setenv(name, value, true) {
            refused.push(format!("{name} ({e})"));
        }
    }
    // A preset value this task does not set (the user's value kept, a launcher's flag):
    // the job's value from before the fork again, unless a container has replaced it.
    for (name, mine) in preset {
        let outcome = task_plan.vars.iter().find(|v| v.name == *name).map(|v| &v.outcome);
        if matches!(outcome, Some(rdzv::Outcome::Set(_))) || env(sp, name).as_deref() != Some(mine.as_str()) {
            continue;
        }
        let restored = match (outcome, before_fork.and_then(|b| b.get(name))) {
            (Some(rdzv::Outcome::Kept(user)), _) => sp.setenv(name, user, true).map(|_| ()),
            (_, Some(before)) => sp.setenv(name, before, true).map(|_| ()),
            (_, None) => sp.unsetenv(name),
        };
        if let Err(e) = restored {
            refused.push(format!("{name} ({e})"));
        }
    }
    // A value of the user's that the container overwrote: the user's again.
    for var in &task_plan.vars {
        if let rdzv::Outcome::Kept(user) = &var.outcome {
            if changes.iter().any(|c| c.name == var.name) {
                if let Err(e) = sp.setenv(&var.name, user, true) {
                    refused.push(format!("{} ({e})", var.name));
                }
            }
        }
    }
    // Another node's values, from an enclosing step: not this node's.
    for name in &ifaces.unset {
        if let Err(e) = sp.unsetenv(name) {
            refused.push(format!("{name} (removing another node's value: {e})"));
        }
    }
    if let Err(e) = sp.setenv(rdzv::RECORD_VAR, &task_plan.record(), true) {
        refused.push(format!("{} ({e})", rdzv::RECORD_VAR));
    }
    if !refused.is_empty() && *pass == Pass::First {
        let why = format!("Slurm refused to set {}", refused.join(", "));
        sp.log(Level::Error, &format!("--auto-rdzv: {why}; the other variables are set"));
        if opts.verbose {
            sp.task_stderr(&format!("spank-gpu: --auto-rdzv: {why}"));
        }
    }
    if *pass != Pass::First {
        // The first pass told the task everything else: only what it has now.
        if opts.verbose {
            let line = task_plan.verbose_line(&task, &node_host(&step));
            let why = if bound_cpus.is_some() {
                "again: the kernel trimmed the mask to the task's cpuset"
            } else {
                "again, for the CPU mask kept"
            };
            sp.task_stderr(&format!("{line} ({why})"));
        }
        return Ok(());
    }

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
            // The task exits 1 right after this; with --kill-on-bad-exit srun
            // ends the step on that exit, and the line still in slurmstepd's
            // I/O path was lost in about 1 run of 6 (22.05 lab). A moment's
            // wait lets slurmstepd forward it first; the step fails anyway.
            sp.pause(std::time::Duration::from_millis(200));
        } else if let Some(note) = state.and_then(|s| s.note.as_deref()) {
            sp.task_stderr(&format!("spank-gpu: error: {note}"));
        }
    }
    if let Some(why) = state.and_then(|s| s.fail_step.clone()) {
        return Err(HookError::FailStep(why));
    }
    // spank_gpu listed before pyxis: pyxis's import comes after this, and may
    // replace what was set here. Say so, once per step in the log, and in verbose.
    let pyxis_after = state
        .and_then(|s| Some((s.pyxis.as_ref()?, s.mount_ns?)))
        .is_some_and(|(pyxis, before)| container::pyxis_runs_after(pyxis, Some(before), mount_ns(sp)));
    let keeps = state.and_then(|s| s.pyxis.as_ref()).map_or(&[][..], |p| &p.keeps[..]);
    // The list keep_through_pyxis set: pyxis keeps our values, nothing to log.
    let kept_by_plugin = pyxis_after && !keeps.is_empty() && keeps.join(",") == pyxis_keep_list(cfg, opts);
    if pyxis_after && task.local_id == 0 && !kept_by_plugin {
        sp.log(Level::Error, &container::pyxis_after_log(step.job_id, &rdzv::step_name(step.step_id)));
    }
    if opts.verbose {
        let host = node_host(&step);
        let mut line = task_plan.verbose_line(&task, &host);
        let replaced = container::replaced_words(&changes);
        if !replaced.is_empty() {
            line.push_str("; ");
            line.push_str(&replaced);
        }
        if let Some(words) = pyxis_after
            .then(|| container::pyxis_after_words(&task_plan.claimed(), keeps, kept_by_plugin))
            .flatten()
        {
            line.push_str("; ");
            line.push_str(&words);
        }
        sp.task_stderr(&line);
        if let Some(net) = net.filter(|_| task.local_id == 0) {
            sp.task_stderr(&network_line(sp, net, &host, &task_plan, &mut user_conf_read));
        }
    }
    Ok(())
}

/// This node's name in the step's node list, for `verbose`.
fn node_host(step: &Step) -> String {
    hostlist::expand(&step.node_list)
        .ok()
        .and_then(|hosts| hosts.into_iter().nth(step.node_id as usize))
        .unwrap_or_else(|| format!("node {}", step.node_id))
}

/// The `verbose` line on what NCCL and gloo will use on this node, with
/// the task's values as set now (once per node, by its first task).
fn network_line<S: Spank + Node>(
    sp: &S,
    net: &StepNet,
    host: &str,
    plan: &rdzv::TaskPlan,
    user_conf_read: &mut Option<netif::ConfRead>,
) -> String {
    let mine = |name: &str| {
        plan.vars.iter().find(|v| v.name == name).and_then(|v| match &v.outcome {
            rdzv::Outcome::Set(why) => Some(why.clone()),
            rdzv::Outcome::Kept(_) | rdzv::Outcome::Left(_) => None,
        })
    };
    let source = |name: &str| netif::Source::of_env(env(sp, name).as_deref(), mine(name).as_deref());
    let nccl_env = source(netif::NCCL_VAR);
    let conf_file = env(sp, netif::CONF_FILE_VAR);
    // NCCL reads ~/.nccl.conf only without a value and without NCCL_CONF_FILE.
    let user = if nccl_env.value.is_none() && conf_file.is_none() {
        user_conf_read.get_or_insert_with(|| user_conf(sp, net)).clone()
    } else {
        Ok(None)
    };
    let nccl = netif::nccl_source(nccl_env, conf_file.as_deref(), &user, &net.node.site_conf);
    let family = netif::Family::from_env(env(sp, netif::FAMILY_VAR).as_deref());
    let mut report = netif::report(&net.node, &nccl, family, &source(netif::GLOO_VAR));
    // Named as the task's own line names the node.
    host.clone_into(&mut report.node);
    report.line()
}

/// What pyxis was asked for this step: its options as slurmstepd's option
/// cache holds them, else the job's variables pyxis reads instead. One that
/// cannot be read counts as not given (one debug line for all).
fn pyxis_step<S: Spank + Node>(sp: &S) -> container::PyxisStep {
    let mut given = Vec::new();
    let mut unread = Vec::new();
    for o in container::PYXIS_OPTIONS {
        match sp.foreign_option(o) {
            Ok(arg) => given.push((o, arg)),
            Err(e) => unread.push(format!("--{}: {e}", o.name)),
        }
    }
    if !unread.is_empty() {
        sp.log(
            Level::Debug,
            &format!("--auto-rdzv: reading pyxis's options: {}; taken as not given", unread.join("; ")),
        );
    }
    let option =
        |o: container::PyxisOption| given.iter().find(|(g, _)| *g == o).and_then(|(_, arg)| arg.clone());
    container::PyxisStep::from_options(&option, &|name: &str| env(sp, name))
}

/// The calling process's mount namespace, `None` (one debug line) when it
/// cannot be read: then whether pyxis runs after spank_gpu cannot be told.
fn mount_ns<S: Spank + Node>(sp: &S) -> Option<container::MountNs> {
    sp.mount_ns()
        .inspect_err(|e| {
            sp.log(
                Level::Debug,
                &format!("--auto-rdzv: reading the mount namespace: {e}; cannot tell whether pyxis runs after spank-gpu"),
            );
        })
        .ok()
}

/// Finds the first node's NodeHostname or NodeAddr (once per step, before
/// fork); says so once when it cannot.
fn find_master_addr<S: Spank + Node>(sp: &S, cfg: &PluginConfig, first: &str) -> Option<String> {
    let path = nodeaddr::slurm_conf_path(cfg.slurm_conf.as_deref(), sp.process_env("SLURM_CONF").as_deref());
    let aliases = env(sp, "SLURM_NODE_ALIASES");
    let mut read = |file: &str| sp.read_trusted(file, nodeaddr::MAX_SLURM_CONF);
    nodeaddr::find(cfg.master_addr, first, &path, aliases.as_deref(), slurm_sys::VERSION_NUMBER, &mut read)
        .inspect_err(|line| sp.log(Level::Error, line))
        .ok()
}

/// Whether `value` of `name` is one the plugin recorded setting in an enclosing step.
fn recorded<S: Spank + Node>(sp: &S, name: &str, value: &str) -> bool {
    env(sp, rdzv::RECORD_VAR).is_some_and(|record| !rdzv::user_set(name, value, Some(&record)))
}

/// `--auto-rdzv` in force for this step: as `user_init` read it (`step`),
/// else asked of Slurm.
pub(super) fn auto_rdzv<S: Spank + Node>(
    sp: &S,
    cfg: &PluginConfig,
    step: Option<StepOptions>,
) -> Result<Option<AutoRdzv>, HookError> {
    match step {
        Some(options) => Ok(options.auto_rdzv),
        None => option_in_force(sp, UserOption::AutoRdzv, cfg.auto_rdzv, options::parse_auto_rdzv),
    }
}

fn settings(cfg: &PluginConfig, opts: AutoRdzv) -> Settings {
    Settings::new(cfg, opts.port, slurm_sys::VERSION_NUMBER)
}
