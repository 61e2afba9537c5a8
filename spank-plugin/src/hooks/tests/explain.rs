//! The plugin and `spank-gpu explain` share one task plan
//! ([`task_plan::rdzv::task_env`]); this property test checks that they agree
//! over generated step shapes. Each case builds one task of a step as
//! slurmstepd describes it (SPANK items and the task's `SLURM_*`
//! environment, its CPU mask, its GPUs, the user's exports and command, the
//! plugstack line, `--auto-rdzv` and `--gpu-affinity` words), runs the
//! plugin's `user_init` and `task_init` on the fake handle, then runs
//! explain's own code on the environment the task is left with, as
//! `srun spank-gpu explain` in that task would. Every variable explain says
//! was set must have that value in the task, every kept one the user's, and
//! explain's "set" must be exactly what the plugin's record names.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use spank_gpu_cli::explain::{self, Explanation};
use task_plan::netif;
use task_plan::plugstack::PluginConfig;

use super::with_topology;
use crate::hooks::fake::FakeSpank;
use crate::hooks::*;

/// CPUs of the fake node (`with_topology`'s: 2 NUMA nodes of 8).
const NODE_CPUS: u32 = 16;

/// How the step's tasks see GPUs.
#[derive(Clone, Copy, Debug)]
enum Gpus {
    /// No GPUs.
    None,
    /// One each (`--gpus-per-task=1`): the local task's index.
    PerTask,
    /// All 8 of the node, every task (`--gres=gpu:8`).
    All,
}

/// The step's command lines.
const COMMANDS: &[&[&str]] = &[
    &["python", "train.py"],
    &["torchrun", "--nproc-per-node=4", "train.py"],
    &["torchrun", "train.py"],
    &["accelerate", "launch", "--main_process_port", "29555", "train.py"],
    &["bash", "-c", "python train.py"],
    &["prted", "--daemonize"],
];

/// What a user may have exported before srun.
const EXPORTS: &[(&str, &str)] = &[
    ("MASTER_PORT", "12345"),
    ("OMP_NUM_THREADS", "3"),
    ("MASTER_ADDR", "login-vip"),
    ("NCCL_SOCKET_IFNAME", "eth0"),
    ("WORLD_SIZE", "2"),
];

/// `--auto-rdzv` words.
const WORDS: &[&str] = &["", "port=23456", "verbose", "strict"];

/// Plugstack lines.
const PLUGSTACK: &[&[&str]] = &[
    &[],
    &["port_range=30000-30999"],
    &["nccl_socket_net=10.0.0.0/24"],
    &["TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "NCCL_DEBUG=WARN"],
    &["master_addr=addr", "slurm_conf=/etc/slurm/slurm.conf"],
    &["master_addr=hostname", "slurm_conf=/etc/slurm/slurm.conf"],
];

/// A slurm.conf that names the fake nodes' addresses and host names.
const SLURM_CONF: &str = "ClusterName=lab\nNodeName=node[1-3] NodeHostname=host[1-3] NodeAddr=10.0.0.[1-3] \
                          CPUs=16 Gres=gpu:8\n";

/// One generated task of one step.
#[derive(Clone, Debug)]
struct Shape {
    /// Tasks of the step per node (1 to 3 nodes).
    tasks_per_node: Vec<u32>,
    /// The node this task is on, and its local id (each taken modulo).
    node: u32,
    local: u32,
    cpus_per_task: u32,
    gpus: Gpus,
    /// The batch step (`sbatch -N.. job.sh`), `with_ntasks`: with `-n`.
    batch: Option<bool>,
    command: usize,
    exports: Vec<bool>,
    words: usize,
    plugstack: usize,
    /// Slurm bound each local task to its own CPUs (`--cpu-bind=cores`).
    slurm_bound: bool,
    gpu_affinity: bool,
}

fn shapes() -> impl Strategy<Value = Shape> {
    (
        prop::collection::vec(1u32..=4, 1..=3),
        (0u32..3, 0u32..4, 1u32..=4),
        prop_oneof![Just(Gpus::None), Just(Gpus::PerTask), Just(Gpus::All)],
        prop_oneof![3 => Just(None), 1 => Just(Some(false)), 1 => Just(Some(true))],
        (0..COMMANDS.len(), prop::collection::vec(any::<bool>(), EXPORTS.len())),
        (0..WORDS.len(), 0..PLUGSTACK.len(), any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(
                tasks_per_node,
                (node, local, cpus_per_task),
                gpus,
                batch,
                (command, exports),
                (words, plugstack, slurm_bound, gpu_affinity),
            )| {
                let node = node % u32::try_from(tasks_per_node.len()).unwrap_or(1);
                let local = local % tasks_per_node[node as usize];
                Shape {
                    tasks_per_node,
                    node,
                    local,
                    cpus_per_task,
                    gpus,
                    batch,
                    command,
                    exports,
                    words,
                    plugstack,
                    slurm_bound,
                    gpu_affinity,
                }
            },
        )
}

/// A hex CPU mask as Slurm writes it in `SLURM_CPU_BIND_LIST`.
fn hex_mask(first: u32, count: u32) -> String {
    format!("0x{:X}", ((1u64 << count) - 1) << first)
}

/// The task as slurmstepd hands it to the plugin.
fn task(shape: &Shape) -> FakeSpank {
    let mut sp = FakeSpank::new(Context::Remote);
    let nnodes = u32::try_from(shape.tasks_per_node.len()).unwrap_or(1);
    let node_list = if nnodes == 1 { "node1".to_owned() } else { format!("node[1-{nnodes}]") };
    let (node, local) = if shape.batch.is_some() { (0, 0) } else { (shape.node, shape.local) };
    let here = shape.tasks_per_node[node as usize];
    let ntasks: u32 = shape.tasks_per_node.iter().sum();
    let global = shape.tasks_per_node[..node as usize].iter().sum::<u32>() + local;
    let cpt = shape.cpus_per_task;
    let per_node = shape.tasks_per_node.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let mut env: Vec<(&str, String)> = vec![
        ("SLURM_JOB_ID", "4242".into()),
        ("SLURM_JOB_NODELIST", node_list.clone()),
        ("SLURM_NNODES", nnodes.to_string()),
        ("SLURM_NODEID", node.to_string()),
        ("SLURM_LOCALID", local.to_string()),
        ("SLURM_PROCID", global.to_string()),
        ("SLURM_CPUS_ON_NODE", (here * cpt).to_string()),
        ("SLURM_TASKS_PER_NODE", per_node.clone()),
    ];
    let (step_id, items_ntasks, local_tasks) = match shape.batch {
        // The batch step: one task on the first node; the job's task count
        // only with -n (slurmstepd's batch step takes the job's num_tasks).
        Some(with_ntasks) => {
            if with_ntasks {
                env.push(("SLURM_NTASKS", ntasks.to_string()));
            }
            (rdzv::BATCH_STEP, if with_ntasks { ntasks } else { 0 }, 1)
        }
        None => {
            env.extend([
                ("SLURM_STEP_ID", "0".to_owned()),
                ("SLURM_STEP_NODELIST", node_list),
                ("SLURM_STEP_NUM_NODES", nnodes.to_string()),
                ("SLURM_STEP_NUM_TASKS", ntasks.to_string()),
                ("SLURM_STEP_TASKS_PER_NODE", per_node),
                ("SLURM_NTASKS", ntasks.to_string()),
            ]);
            (0, ntasks, here)
        }
    };
    for (k, v) in [
        ("JobId", 4242),
        ("StepId", step_id),
        ("NNodes", nnodes),
        ("NodeId", node),
        ("LocalTaskCount", local_tasks),
        ("TotalTaskCount", items_ntasks),
        ("StepCpusPerTask", cpt),
        ("TaskId", local),
        ("TaskGlobalId", global),
        ("JobUid", 1000),
    ] {
        sp.items.insert(k, v);
    }
    let step_gpus = match shape.gpus {
        Gpus::None => None,
        Gpus::PerTask => Some((0..here).map(|g| g.to_string()).collect::<Vec<_>>().join(",")),
        Gpus::All => Some("0,1,2,3,4,5,6,7".to_owned()),
    };
    if let Some(gpus) = &step_gpus {
        env.push(("SLURM_STEP_GPUS", gpus.clone()));
        env.push(("SLURM_JOB_GPUS", gpus.clone()));
        let cvd = if matches!(shape.gpus, Gpus::PerTask) { local.to_string() } else { gpus.clone() };
        env.push(("CUDA_VISIBLE_DEVICES", cvd));
    }
    // The step's CPUs: the first `here * cpt` of the node, each task its own
    // `cpt` of them where Slurm bound it.
    let step_cpus = (here * cpt).min(NODE_CPUS);
    sp.mask = CpuSet::parse(&format!("0-{}", step_cpus - 1)).unwrap_or_default();
    if shape.slurm_bound && shape.batch.is_none() && (local + 1) * cpt <= NODE_CPUS {
        let masks: Vec<String> = (0..here).map(|t| hex_mask(t * cpt, cpt)).collect();
        env.push(("SLURM_CPU_BIND_TYPE", "mask_cpu:".into()));
        env.push(("SLURM_CPU_BIND_LIST", masks.join(",")));
        sp.mask = CpuSet::parse(&format!("{}-{}", local * cpt, (local + 1) * cpt - 1)).unwrap_or_default();
    }
    for (k, v) in env {
        sp.env.insert(k.to_owned(), v);
    }
    for ((name, value), on) in EXPORTS.iter().zip(&shape.exports) {
        if *on {
            sp.env.insert((*name).to_owned(), (*value).to_owned());
        }
    }
    sp.command = COMMANDS[shape.command].iter().map(|w| (*w).to_owned()).collect();
    sp.options.insert("auto-rdzv", WORDS[shape.words].to_owned());
    if shape.gpu_affinity {
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", String::new());
    }
    sp.files.insert("/etc/slurm/slurm.conf".into(), SLURM_CONF.into());
    sp
}

fn plugstack(shape: &Shape) -> Vec<String> {
    PLUGSTACK[shape.plugstack].iter().map(|w| (*w).to_owned()).collect()
}

/// `spank-gpu explain` in the task the hooks left, reading what the plugin
/// read: the same node (interfaces, files), the same plugstack line.
fn explain_task(sp: &FakeSpank, words: &[String]) -> Result<Explanation, String> {
    let cfg = PluginConfig::parse(words, true).map_err(|e| e.to_string())?;
    let node = "this node".to_owned();
    let ifaces = sp.interfaces.clone();
    let offers = netif::node_offers(&cfg.nccl_socket_net, &cfg.env_defaults, &ifaces, &node);
    let net = netif::NodeNet {
        node,
        ifaces: Ok(ifaces),
        offers,
        site_conf: Ok(None),
        hostname: None,
        hosts: Ok(Vec::new()),
    };
    let lookup = |name: &str| sp.env.get(name).cloned();
    let step = rdzv::Step::from_env(&lookup, &rdzv::Items::default()).map_err(|e| e.to_string())?;
    let master_addr = (cfg.master_addr != MasterAddr::NodeName).then(|| {
        let first = step.master_name().map_err(|e| e.to_string())?;
        let mut read = |file: &str| {
            sp.files.get(file).cloned().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
        };
        let path = cfg.slurm_conf.clone().unwrap_or_default();
        nodeaddr::find(cfg.master_addr, &first, &path, None, slurm_sys::VERSION_NUMBER, &mut read)
    });
    let inputs = explain::Inputs {
        env: sp.env.clone(),
        cfg,
        argv: sp.command.clone(),
        own: Some(sp.mask.clone()),
        net,
        user_conf: Ok(None),
        affinity: Err("not asked".into()),
        master_addr,
        slurm_version: slurm_sys::VERSION_NUMBER,
    };
    explain::explain(&inputs)
}

/// The names the plugin's record says it set.
fn recorded_names(record: &str) -> BTreeSet<String> {
    record
        .split(',')
        .filter(|item| !item.contains('='))
        .filter_map(|item| item.split_once(':').map(|(n, _)| n.to_owned()))
        .collect()
}

fn check(shape: &Shape) -> Result<(), TestCaseError> {
    let words = plugstack(shape);
    let mut sp = task(shape);
    let before: BTreeMap<String, String> = sp.env.clone();
    let st = user_init(&mut sp, &words).map_err(|e| TestCaseError::fail(format!("user_init: {e}")))?;
    task_init(&mut sp, &words, st.as_ref()).map_err(|e| TestCaseError::fail(format!("task_init: {e}")))?;
    prop_assert!(sp.errors().is_empty(), "the plugin logged errors: {:?}", sp.errors());
    let record = sp.env.get(rdzv::RECORD_VAR).cloned();
    prop_assert!(record.is_some(), "the plugin set nothing: {:?}", sp.log.borrow());
    let record = record.unwrap_or_default();
    let explained = explain_task(&sp, &words).map_err(|e| TestCaseError::fail(format!("explain: {e}")))?;
    prop_assert!(explained.plugin_active);
    let mut said_set = BTreeSet::new();
    for v in &explained.vars {
        let now = sp.env.get(&v.name);
        match v.outcome {
            "set" => {
                prop_assert_eq!(
                    now,
                    Some(&v.value),
                    "{} as explain plans it ({}), in the task",
                    v.name,
                    v.why
                );
                said_set.insert(v.name.clone());
            }
            "kept" => {
                prop_assert!(before.contains_key(&v.name), "{} kept, but nobody had set it", v.name);
                prop_assert_eq!(now, before.get(&v.name), "{} kept: the user's value stays", v.name);
            }
            "left" => prop_assert_eq!(now, before.get(&v.name), "{} left to {}", v.name, v.why),
            other => prop_assert!(false, "{}: outcome {other} in a task the plugin set up", v.name),
        }
    }
    let mut recorded = recorded_names(&record);
    recorded.remove(rdzv::RECORD_VAR);
    prop_assert_eq!(said_set, recorded, "explain's set variables against the plugin's record {}", record);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn explain_says_what_the_plugin_set(shape in shapes()) {
        check(&shape)?;
    }
}
