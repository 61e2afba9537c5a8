//! `spank-gpu explain`: what `--auto-rdzv` sets for one task and why, from
//! the task's environment, through the plugin's own plan
//! ([`rdzv::task_env`]). [`explain`] turns the inputs `main` gathered (the
//! task's variables, the plugstack line, the node's network, the task's CPU
//! mask, the `--gpu-affinity` decision) into an [`Explanation`], which
//! `--json` writes through serde and [`Explanation::lines`] prints.

use std::collections::BTreeMap;

use serde::Serialize;
use slurm_formats::cpuset::CpuSet;
use slurm_formats::hostlist;
use task_plan::binding::Binding;
use task_plan::netif;
use task_plan::plugstack::PluginConfig;
use task_plan::rdzv::{self, Items, Outcome, Settings, Step};

/// What `explain` reads, gathered by the caller.
#[derive(Debug)]
pub struct Inputs {
    /// The task's environment.
    pub env: BTreeMap<String, String>,
    /// The plugstack line.
    pub cfg: PluginConfig,
    /// The step's command line.
    pub argv: Vec<String>,
    /// The task's CPU mask, when known.
    pub own: Option<CpuSet>,
    /// The node's network, as the plugin's `user_init` reads it.
    pub net: netif::NodeNet,
    /// `~/.nccl.conf`'s `NCCL_SOCKET_IFNAME`.
    pub user_conf: netif::ConfRead,
    /// What `--gpu-affinity` decides for the task (its GPUs, the binding, and
    /// whether the node's GPU table is an older agent's), or why nothing.
    pub affinity: Result<(Vec<u32>, Binding, bool), String>,
    /// With `master_addr=hostname|addr`: the first node's name it asks for,
    /// or the line the plugin logs when it cannot find it.
    pub master_addr: Option<Result<String, String>>,
    /// The Slurm release explain was built for.
    pub slurm_version: u32,
}

/// What one task gets, as `explain` says it (`--json`: this object).
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// Whether the plugin set up this task (its record is there).
    pub plugin_active: bool,
    pub job_id: u32,
    /// `0`, `batch`, ...
    pub step: String,
    pub node_list: String,
    pub nodes: Vec<String>,
    pub node_id: u32,
    pub task: TaskIds,
    pub vars: Vec<VarLine>,
    pub warnings: Vec<String>,
    pub gpu_affinity: Affinity,
    pub network: Network,
    /// Tasks in the step (the text's first line).
    #[serde(skip)]
    pub ntasks: u32,
    /// Whether the task has Slurm's `--cpu-bind` (the text's hint).
    #[serde(skip)]
    pub cpu_bind_given: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskIds {
    pub rank: u32,
    pub local_rank: u32,
}

/// One variable the plugin plans.
#[derive(Clone, Debug, Serialize)]
pub struct VarLine {
    pub name: String,
    /// The plugin's value.
    pub value: String,
    /// `set`, `would_set` (the plugin is not active in this task), `kept`
    /// (someone else's value stays), `left` (a launcher flag wins).
    pub outcome: &'static str,
    /// Why the plugin's value, who set the kept one, or the flag.
    pub why: String,
    /// The task's value now.
    pub current: Option<String>,
    /// A kept value that enroot's PyTorch hook or pyxis put there after the
    /// plugin (pyxis listed after spank_gpu; their formula matched), not the user.
    #[serde(skip)]
    pub after_plugin: bool,
}

/// The `--gpu-affinity` decision.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Affinity {
    Decided {
        gpus: Vec<u32>,
        cpus: String,
        numa_nodes: Vec<u32>,
        kept_because: Option<String>,
        older_table: bool,
    },
    Undecided {
        undecided: String,
    },
}

/// What NCCL and gloo will use on the node.
#[derive(Clone, Debug, Serialize)]
pub struct Network {
    pub node: String,
    pub nccl: String,
    pub nccl_before_2_28_3: Option<String>,
    pub gloo: String,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    pub nccl_debug_lines: Vec<String>,
    /// The report's lines, as printed.
    #[serde(skip)]
    pub lines: Vec<String>,
}

/// Explains one task from its inputs.
///
/// # Errors
/// The task's environment does not describe a step, or the step cannot be planned.
pub fn explain(inputs: &Inputs) -> Result<Explanation, String> {
    let env = &inputs.env;
    let lookup = |name: &str| env.get(name).cloned();
    let num = |key: &str| env.get(key).and_then(|v| v.trim().parse::<u32>().ok());
    let mut step = Step::from_env(&lookup, &Items::default()).map_err(|e| e.to_string())?;
    step.argv.clone_from(&inputs.argv);
    // What the task's environment does not say, from the plugin's record:
    // the CPUs it bound the task to (and the share of the GPUs, which
    // OMP_NUM_THREADS divides by), and the step's --auto-rdzv=port=N.
    // Without a record nothing says the task was bound.
    let record = env.get(rdzv::RECORD_VAR).map(String::as_str);
    let share_gpus = record.and_then(rdzv::recorded_gpu_share);
    let mask = match (record.and_then(rdzv::recorded_bound_cpus), &inputs.own, share_gpus) {
        (Some(cpus), _, share_gpus) => rdzv::Mask::Bound { cpus, share_gpus },
        // An older plugin's record: a share, without the CPUs.
        (None, Some(own), Some(share)) => {
            rdzv::Mask::Bound { cpus: u32::try_from(own.len()).unwrap_or(u32::MAX), share_gpus: Some(share) }
        }
        (None, Some(own), None) => rdzv::Mask::Own(own.clone()),
        (None, None, _) => rdzv::Mask::Unknown,
    };
    let input = rdzv::TaskInput {
        step: &step,
        settings: Settings::new(&inputs.cfg, record.and_then(rdzv::recorded_port_word), inputs.slurm_version),
        master_addr: inputs
            .master_addr
            .clone()
            .and_then(Result::ok)
            .map(|addr| (addr, inputs.cfg.master_addr.names())),
        local_id: num("SLURM_LOCALID").unwrap_or(0),
        global_id: num("SLURM_PROCID").unwrap_or(0),
        mask,
        net: Some(rdzv::NodeOffers { offers: &inputs.net.offers, site_conf: &inputs.net.site_conf }),
    };
    let planned =
        rdzv::task_env(input, &lookup, &mut || inputs.user_conf.clone()).map_err(|e| e.to_string())?;
    let (task, plan) = (&planned.task, &planned.plan);
    let active = env.contains_key(rdzv::RECORD_VAR);
    // A value kept as the user's that enroot's PyTorch hook's or pyxis's
    // formula gives: pyxis ran after spank-gpu and put it there (with pyxis
    // first the plugin replaces such values), not the user.
    let facts = rdzv::container::Facts::from_env(&lookup);
    let vars = plan
        .vars
        .iter()
        .map(|v| {
            let (outcome, why, after_plugin) = match &v.outcome {
                Outcome::Set(why) => (if active { "set" } else { "would_set" }, why.clone(), false),
                Outcome::Kept(user) => match facts.setter(&v.name, user) {
                    rdzv::container::Setter::Container => ("kept", "set by the user".to_owned(), false),
                    by => ("kept", by.words().to_owned(), true),
                },
                Outcome::Left(flag) => ("left", (*flag).to_owned(), false),
            };
            VarLine {
                name: v.name.clone(),
                value: v.value.clone(),
                outcome,
                why,
                current: env.get(&v.name).cloned(),
                after_plugin,
            }
        })
        .collect();
    Ok(Explanation {
        plugin_active: active,
        job_id: step.job_id,
        step: rdzv::step_name(step.step_id),
        nodes: hostlist::expand(&step.node_list).map_err(|e| e.to_string())?,
        node_list: step.node_list.clone(),
        node_id: step.node_id,
        task: TaskIds { rank: task.global_id, local_rank: task.local_id },
        vars,
        warnings: plan.warnings.clone(),
        gpu_affinity: match &inputs.affinity {
            Ok((gpus, b, degraded)) => Affinity::Decided {
                gpus: gpus.clone(),
                cpus: b.cpus.to_string(),
                numa_nodes: b.numa_nodes.clone(),
                kept_because: b.note.clone(),
                older_table: *degraded,
            },
            Err(why) => Affinity::Undecided { undecided: why.clone() },
        },
        network: network(inputs, &planned, active),
        ntasks: step.ntasks,
        cpu_bind_given: env.get("SLURM_CPU_BIND_TYPE").is_some_and(|b| !b.is_empty()),
    })
}

/// What NCCL and gloo will use here, with the task's values (the plugin's
/// reason where it set them), or without the plugin in this task, with the
/// values it would set.
fn network(inputs: &Inputs, planned: &rdzv::TaskEnv, active: bool) -> Network {
    let env = &inputs.env;
    let source = |name: &str| {
        let mine = planned.plan.vars.iter().find(|v| v.name == name).and_then(|v| match &v.outcome {
            Outcome::Set(why) => Some((v.value.as_str(), why.as_str())),
            Outcome::Kept(_) | Outcome::Left(_) => None,
        });
        match mine {
            Some((_, why)) if active => netif::Source::of_env(env.get(name).map(String::as_str), Some(why)),
            Some((value, why)) => netif::Source {
                value: Some(value.to_owned()),
                from: format!("which spank-gpu would set: {why}"),
            },
            None => netif::Source::of_env(env.get(name).map(String::as_str), None),
        }
    };
    let conf_file = env.get(netif::CONF_FILE_VAR).map(String::as_str);
    let nccl =
        netif::nccl_source(source(netif::NCCL_VAR), conf_file, &inputs.user_conf, &inputs.net.site_conf);
    let family = netif::Family::from_env(env.get(netif::FAMILY_VAR).map(String::as_str));
    let report = netif::report(&inputs.net, &nccl, family, &source(netif::GLOO_VAR));
    let mut notes: Vec<String> = inputs.master_addr.clone().and_then(Result::err).into_iter().collect();
    notes.extend(inputs.net.offers.log.iter().cloned());
    notes.extend(
        planned
            .ifaces
            .held
            .iter()
            .map(|why| format!("NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME not set: {why}")),
    );
    notes.extend(planned.ifaces.problem.clone());
    Network {
        lines: report.lines(),
        node: report.node,
        nccl: report.nccl,
        nccl_before_2_28_3: report.older,
        gloo: report.gloo,
        warnings: report.warnings,
        notes,
        nccl_debug_lines: report.confirm.into_iter().map(|(line, _)| line).collect(),
    }
}

impl Explanation {
    /// The text `explain` prints.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "job {} step {}: {} task(s) on {} node(s) [{}], this is rank {} (node {}, local {})",
            self.job_id,
            self.step,
            self.ntasks,
            self.nodes.len(),
            self.node_list,
            self.task.rank,
            self.node_id,
            self.task.local_rank
        )];
        if !self.plugin_active {
            out.push("spank-gpu did not set anything in this task (no --auto-rdzv); it would set:".into());
        }
        for v in &self.vars {
            let current = v.current.as_deref().unwrap_or_default();
            out.push(match v.outcome {
                "set" | "would_set" => {
                    let why = if v.why.is_empty() { String::new() } else { format!("  ({})", v.why) };
                    // What the task has, when the plugin set it (it knows --auto-rdzv=port=N
                    // and the CPUs --gpu-affinity bound; this command may not).
                    let shown = v.current.as_deref().filter(|_| self.plugin_active).unwrap_or(&v.value);
                    format!("  {}={shown}{why}", v.name)
                }
                "kept" if v.after_plugin => format!(
                    "  {}={current}  (set by {} after spank-gpu: pyxis runs after spank-gpu on this cluster; \
                     spank-gpu would use {})",
                    v.name, v.why, v.value
                ),
                "kept" => {
                    format!("  {}={current}  (kept: set by you; spank-gpu would use {})", v.name, v.value)
                }
                _ => format!(
                    "  {} not set  (the command gives {}, which wins; it would be {})",
                    v.name, v.why, v.value
                ),
            });
        }
        out.extend(self.warnings.iter().map(|w| format!("warning: {w}")));
        out.push(match &self.gpu_affinity {
            Affinity::Decided { gpus, cpus, numa_nodes, kept_because: None, older_table: true } => format!(
                "--gpu-affinity: GPUs {gpus:?} -> CPUs {cpus} (NUMA {numa_nodes:?}), the GPUs' whole local CPUs: \
                 the node's GPU table is an older agent's, without the machine (`gpu-node-agent topology --write` \
                 rewrites it)"
            ),
            Affinity::Decided { gpus, cpus, numa_nodes, kept_because: None, .. } => format!(
                "--gpu-affinity: GPUs {gpus:?} -> CPUs {cpus} (NUMA {numa_nodes:?}), the GPUs' share of the step's CPUs"
            ),
            Affinity::Decided { gpus, kept_because: Some(note), .. } => {
                format!("--gpu-affinity: GPUs {gpus:?}: {note}; Slurm's mask kept")
            }
            Affinity::Undecided { undecided } => format!("--gpu-affinity: nothing to decide ({undecided})"),
        });
        if self.cpu_bind_given {
            out.push(
                "  (if you gave srun --cpu-bind, the plugin keeps Slurm's binding unless --gpu-affinity=force)".into(),
            );
        }
        out.extend(self.network.lines.iter().cloned());
        out.extend(self.network.notes.iter().map(|n| format!("  note: {n}")));
        out
    }
}
