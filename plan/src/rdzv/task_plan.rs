//! The task's plan: each variable with its value and why (set, kept because
//! the user set it, or left to a launcher flag), the warnings, the `verbose`
//! line and the record of what the plugin set.

use slurm_formats::step_id::step_name;

use super::step::{Step, Task};
use super::step_plan::{PortSource, Settings, StepPlan};
use crate::record::{
    COMPUTED_VARS, RECORD_BOUND_CPUS, RECORD_CPUS_PER_TASK, RECORD_GPU_SHARE, RECORD_PORT_WORD, RECORD_VAR,
    record_item, user_set,
};

/// The computed variables whose value can differ between the tasks of one
/// node: its ranks, its GPUs (`PET_NPROC_PER_NODE`), its CPUs
/// (`OMP_NUM_THREADS`) and the record of all of them. Every other one of
/// [`COMPUTED_VARS`] is step-wide ([`is_step_wide`]): the plugin sets it once
/// per step, before the tasks fork, and each task then sets only what
/// differs. A test checks that every task of a node plans the step-wide ones
/// alike.
pub const PER_TASK_VARS: &[&str] =
    &["RANK", "LOCAL_RANK", "PET_NPROC_PER_NODE", "OMP_NUM_THREADS", RECORD_VAR];

/// The per-task variables whose value is usually the same in every task of
/// a node (the CPUs of a task, divided by its GPUs, are most often every
/// task's): the plugin sets local task 0's value once per step, before the
/// tasks fork, with the step-wide ones, and a task whose own value differs
/// sets it, as for any value it did not inherit.
pub const PRESET_PER_TASK: &[&str] = &["OMP_NUM_THREADS"];

/// Whether `name` has the same planned value in every task of a node: one
/// of [`COMPUTED_VARS`] not in [`PER_TASK_VARS`], or a site default.
pub fn is_step_wide(name: &str, settings: &Settings) -> bool {
    (COMPUTED_VARS.contains(&name) && !PER_TASK_VARS.contains(&name))
        || settings.env_defaults.iter().any(|(n, _)| n == name)
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
    /// The GPUs of the share `--gpu-affinity` bound the task to, when
    /// `OMP_NUM_THREADS` divides by them ([`Task::share_gpus`]); kept in the
    /// record, so that `spank-gpu explain` in the task divides as the plugin did.
    pub gpu_share: Option<u32>,
    /// The CPUs of the task's own mask ([`Task::bound_cpus`]), kept in the
    /// record: the mask alone does not say whether the plugin bound it.
    pub bound_cpus: Option<u32>,
    /// The step's `--auto-rdzv=port=N` ([`Settings::port`]), kept in the record.
    pub port_word: Option<u16>,
}

impl TaskPlan {
    /// The variables to set, with their values.
    pub fn to_set(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars
            .iter()
            .filter(|v| matches!(v.outcome, Outcome::Set(_)))
            .map(|v| (v.name.as_str(), v.value.as_str()))
    }

    /// The names the `verbose` line gives a value for: those the plugin set
    /// and those it kept as the user's, not the copies under a runtime's
    /// `--cleanenv` prefix nor the names left to a launcher's flag.
    pub fn claimed(&self) -> Vec<&str> {
        self.vars
            .iter()
            .filter(|v| {
                matches!(v.outcome, Outcome::Set(_) | Outcome::Kept(_)) && !is_clean_env_copy(&v.name)
            })
            .map(|v| v.name.as_str())
            .collect()
    }

    /// The value of [`RECORD_VAR`] after this plan is applied.
    pub fn record(&self) -> String {
        let mut items: Vec<String> = self.to_set().map(|(n, v)| record_item(n, v)).collect();
        items.push(format!("{RECORD_CPUS_PER_TASK}{}", self.cpus_per_task));
        if let Some(share) = self.gpu_share {
            items.push(format!("{RECORD_GPU_SHARE}{share}"));
        }
        if let Some(cpus) = self.bound_cpus {
            items.push(format!("{RECORD_BOUND_CPUS}{cpus}"));
        }
        if let Some(port) = self.port_word {
            items.push(format!("{RECORD_PORT_WORD}{port}"));
        }
        items.join(",")
    }

    /// The one line `--auto-rdzv=verbose` prints for a task.
    pub fn verbose_line(&self, task: &Task, host: &str) -> String {
        let (copies, vars): (Vec<&Var>, Vec<&Var>) = self
            .vars
            .iter()
            .partition(|v| is_clean_env_copy(&v.name) && matches!(v.outcome, Outcome::Set(_)));
        let set: Vec<String> = vars
            .iter()
            .filter_map(|v| match &v.outcome {
                Outcome::Set(why) if why.is_empty() => Some(format!("{}={}", v.name, v.value)),
                Outcome::Set(why) => Some(format!("{}={} ({why})", v.name, v.value)),
                Outcome::Kept(_) | Outcome::Left(_) => None,
            })
            .collect();
        let kept: Vec<String> = vars
            .iter()
            .filter_map(|v| match &v.outcome {
                Outcome::Kept(user) => Some(format!("{}={user} (set by you; mine: {})", v.name, v.value)),
                Outcome::Set(_) | Outcome::Left(_) => None,
            })
            .collect();
        let left: Vec<String> = vars
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
        if let Some(first) = copies.first() {
            // One prefix per step; the names without it.
            let prefix = crate::apptainer::RUNTIMES
                .iter()
                .map(|(_, p)| *p)
                .find(|p| first.name.starts_with(p))
                .unwrap_or_default();
            let names: Vec<&str> = copies.iter().map(|v| v.name.trim_start_matches(prefix)).collect();
            let why = match &first.outcome {
                Outcome::Set(why) => why.as_str(),
                Outcome::Kept(_) | Outcome::Left(_) => "",
            };
            line.push_str(&format!("; through {why} as {prefix}*: {}", names.join(" ")));
        }
        line
    }
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
    let mut out = TaskPlan {
        cpus_per_task: step.cpus_per_task,
        bound_cpus: task.bound_cpus,
        port_word: settings.port,
        ..TaskPlan::default()
    };
    if !step.shared_only() {
        out.gpu_share = gpu_share(task).map(|(share, _)| share);
    }
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
    for (name, value, why) in &settings.iface_vars {
        add(name, value.clone(), why.clone(), false);
    }
    if step.shared_only() {
        return out;
    }
    add_launcher_vars(&mut out, step, plan, task, env, record.as_deref());
    add_clean_env_vars(&mut out, step, env, record.as_deref());

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

/// Set, or kept when the user set it (see "Set by the user" in the module docs); an
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

/// Under `apptainer exec --cleanenv` as the step's command ([`crate::apptainer`]),
/// each name again with the runtime's prefix, so that it reaches the
/// container: the plugin's value, or the user's where theirs was kept. A
/// prefixed name the user set is kept like any other.
fn add_clean_env_vars(
    out: &mut TaskPlan,
    step: &Step,
    env: &dyn Fn(&str) -> Option<String>,
    record: Option<&str>,
) {
    let Some(clean) = crate::apptainer::clean_env(&step.argv, env) else { return };
    let why = format!("{} {}", clean.runtime, clean.by);
    let passed: Vec<(String, String)> = out
        .vars
        .iter()
        .filter_map(|v| match &v.outcome {
            Outcome::Set(_) => Some((v.name.clone(), v.value.clone())),
            Outcome::Kept(user) => Some((v.name.clone(), user.clone())),
            Outcome::Left(_) => None,
        })
        .collect();
    for (name, value) in passed {
        let prefixed = format!("{}{name}", clean.prefix);
        let outcome = outcome_of(env, record, &prefixed, why.clone(), false);
        out.vars.push(Var { name: prefixed, value, outcome });
    }
}

/// Whether a name is a copy of another under a runtime's `--cleanenv` prefix.
fn is_clean_env_copy(name: &str) -> bool {
    crate::apptainer::RUNTIMES.iter().any(|(_, prefix)| name.starts_with(prefix))
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

/// The share of the GPUs it sees that `--gpu-affinity` bound the task to, as
/// (its GPUs, the GPUs the task sees), when it is a part of them
/// ([`Task::share_gpus`]).
fn gpu_share(task: &Task) -> Option<(u32, u32)> {
    match (task.share_gpus, task.gpus) {
        (Some(share), Some(seen)) if share > 0 && share < seen => Some((share, seen)),
        _ => None,
    }
}

/// `OMP_NUM_THREADS`: the CPUs the task may use, divided by its GPUs (one
/// process per GPU). A task with a mask of its own counts that mask; tasks
/// that share the step's CPUs get an even share of the step's CPUs on the
/// node (so `--exclusive` or `--cpus-per-gpu` without `-c` is not 1). A task
/// that `--gpu-affinity` bound to its share of the GPUs it sees (every task
/// sees every GPU, each uses its share by local rank) divides by the GPUs of
/// that share: its CPUs are theirs.
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
    let gpus = |g: u32| format!("{g} GPU{}", if g == 1 { "" } else { "s" });
    if let Some((share, seen)) = gpu_share(task) {
        let why = format!("{what} / {} (this task's share of the {seen} it sees)", gpus(share));
        return ((cpus / share).max(1), why);
    }
    match task.gpus {
        Some(g) if g > 0 => ((cpus / g).max(1), format!("{what} / {}", gpus(g))),
        _ => (cpus.max(1), format!("{what}, no GPU")),
    }
}
