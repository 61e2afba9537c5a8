use std::collections::HashMap;

use super::*;
use slurm_formats::hostlist;

fn step(nnodes: u32, ntasks: u32, node_id: u32, local_tasks: u32) -> Step {
    Step {
        job_id: 1234,
        step_id: 0,
        node_list: "node[1-2]".to_owned(),
        nnodes,
        node_id,
        ntasks,
        local_tasks,
        cpus_per_task: 4,
        ..Step::default()
    }
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> =
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |k| map.get(k).cloned()
}

fn value<'a>(plan: &'a TaskPlan, name: &str) -> Option<&'a str> {
    plan.vars.iter().find(|v| v.name == name).map(|v| v.value.as_str())
}

#[test]
fn the_record_keeps_the_steps_cpus_per_task_for_explain() {
    let mut s = step(1, 1, 0, 1);
    s.cpus_per_task = 1;
    s.cpus_on_node = Some(2);
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let record = plan_task(&s, &plan, &Settings::default(), &Task::default(), &env(&[])).record();
    assert!(record.ends_with(",cpus_per_task=1"), "{record}");
    let task_env = env(&[
        ("SLURM_JOB_ID", "3"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NODELIST", "node1"),
        ("SLURM_NODEID", "0"),
        ("SLURM_CPUS_ON_NODE", "2"),
        (RECORD_VAR, record.as_str()),
    ]);
    assert_eq!(Step::from_env(&task_env, &Items::default()).unwrap().cpus_per_task, 1);
    // Without the record, the step's CPUs here shared by its tasks.
    let bare = env(&[
        ("SLURM_JOB_ID", "3"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NODELIST", "node1"),
        ("SLURM_NODEID", "0"),
        ("SLURM_CPUS_ON_NODE", "2"),
    ]);
    assert_eq!(Step::from_env(&bare, &Items::default()).unwrap().cpus_per_task, 2);
}

#[test]
fn computed_vars_are_exactly_what_plan_task_sets() {
    let mut seen: Vec<String> = vec![RECORD_VAR.to_owned()];
    for (nnodes, ntasks) in [(2, 2), (2, 4), (1, 1)] {
        let s = step(nnodes, ntasks, 0, ntasks / nnodes);
        let plan = plan_step(&s, &Settings::default()).unwrap();
        let task = Task { gpus: Some(2), ..Task::default() };
        let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
        seen.extend(t.vars.into_iter().map(|v| v.name));
    }
    seen.sort();
    seen.dedup();
    let mut listed: Vec<String> = COMPUTED_VARS.iter().map(|s| (*s).to_owned()).collect();
    listed.sort();
    assert_eq!(seen, listed);
}

#[test]
fn tasks_per_node_expands_repeats() {
    assert_eq!(parse_tasks_per_node("2(x3),1", 100), Some(vec![2, 2, 2, 1]));
    assert_eq!(parse_tasks_per_node("4", 100), Some(vec![4]));
    assert_eq!(parse_tasks_per_node("2(x3", 100), None);
    assert_eq!(parse_tasks_per_node("1(x1000000000)", 100), None);
}

#[test]
fn gpu_lists_count() {
    assert_eq!(count_gpus(Some("0,1,2")), Some(3));
    assert_eq!(count_gpus(Some("GPU-aaaa,GPU-bbbb")), Some(2));
    assert_eq!(count_gpus(Some("")), Some(0));
    assert_eq!(count_gpus(None), None);
}

#[test]
fn uneven_layout_gets_right_ranks() {
    // --ntasks=3 -N2: node1 has 2 tasks, node2 has 1.
    let s = step(2, 3, 1, 1);
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    assert_eq!(plan.master_addr, "node1");
    assert!(!plan.torchrun_layout);
    let task = Task { local_id: 0, global_id: 2, gpus: Some(1), bound_cpus: None, share_gpus: None };
    let t = plan_task(&s, &plan, &settings, &task, &env(&[]));
    assert_eq!(value(&t, "RANK"), Some("2"));
    assert_eq!(value(&t, "WORLD_SIZE"), Some("3"));
    assert_eq!(value(&t, "LOCAL_RANK"), Some("0"));
    assert_eq!(value(&t, "LOCAL_WORLD_SIZE"), Some("1"));
    assert_eq!(value(&t, "NODE_RANK"), Some("1"));
    assert_eq!(value(&t, "OMP_NUM_THREADS"), Some("4"));
    assert_eq!(value(&t, "PET_NNODES"), None);
}

#[test]
fn one_task_per_node_sets_torchrun_defaults() {
    let s = step(2, 2, 0, 1);
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    let task = Task { local_id: 0, global_id: 0, gpus: Some(8), bound_cpus: None, share_gpus: None };
    let mut s8 = s.clone();
    s8.cpus_per_task = 8;
    let t = plan_task(&s8, &plan, &settings, &task, &env(&[]));
    assert_eq!(value(&t, "PET_NNODES"), Some("2"));
    assert_eq!(value(&t, "PET_NODE_RANK"), Some("0"));
    assert_eq!(value(&t, "PET_MASTER_ADDR"), Some("node1"));
    assert_eq!(value(&t, "PET_NPROC_PER_NODE"), Some("8"));
    assert_eq!(value(&t, "OMP_NUM_THREADS"), Some("1"));
}

#[test]
fn launchers_get_the_same_point_and_a_users_flag_wins() {
    let mut s = step(2, 2, 1, 1);
    s.step_id = 3;
    s.argv = vec!["torchrun".into(), "--rdzv-backend=c10d".into(), "train.py".into()];
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    let task = Task { local_id: 0, global_id: 1, ..Task::default() };
    let t = plan_task(&s, &plan, &settings, &task, &env(&[]));
    let endpoint = format!("node1:{}", plan.master_port);
    assert_eq!(value(&t, "PET_RDZV_ENDPOINT"), Some(endpoint.as_str()));
    assert_eq!(value(&t, "PET_RDZV_ID"), Some("1234.3"));
    assert_eq!(value(&t, "JAX_COORDINATOR_ADDRESS"), Some(endpoint.as_str()));
    assert_eq!(value(&t, "JAX_COORDINATOR_PORT"), Some(plan.master_port.to_string().as_str()));
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);

    // The user's MASTER_PORT is the point every launcher gets.
    let t = plan_task(&s, &plan, &settings, &task, &env(&[("MASTER_PORT", "29577")]));
    assert_eq!(value(&t, "PET_RDZV_ENDPOINT"), Some("node1:29577"));
    assert!(t.to_set().any(|(n, v)| n == "JAX_COORDINATOR_ADDRESS" && v == "node1:29577"));
    // A variable the user exported is kept like any other.
    let t = plan_task(&s, &plan, &settings, &task, &env(&[("JAX_COORDINATOR_PORT", "1234")]));
    let jax = t.vars.iter().find(|v| v.name == "JAX_COORDINATOR_PORT").unwrap();
    assert_eq!(jax.outcome, Outcome::Kept("1234".to_owned()));

    // A flag on the command line wins: the endpoint is left unset, and said so.
    s.argv = vec!["torchrun".into(), "--master-port".into(), "29577".into(), "train.py".into()];
    let t = plan_task(&s, &plan, &settings, &task, &env(&[]));
    let ep = t.vars.iter().find(|v| v.name == "PET_RDZV_ENDPOINT").unwrap();
    assert_eq!(ep.outcome, Outcome::Left("--master-port"));
    assert!(!t.to_set().any(|(n, _)| n == "PET_RDZV_ENDPOINT"));
    assert!(!t.record().contains("PET_RDZV_ENDPOINT"), "only what was set is recorded");
    let line = t.verbose_line(&task, "node2");
    assert!(line.ends_with("; not set PET_RDZV_ENDPOINT (your --master-port wins)"), "{line}");

    // Several tasks per node: the tasks are the workers, no torchrun variables.
    let s4 = step(2, 4, 0, 2);
    let plan4 = plan_step(&s4, &settings).unwrap();
    let t = plan_task(&s4, &plan4, &settings, &Task::default(), &env(&[]));
    assert_eq!(value(&t, "PET_RDZV_ENDPOINT"), None);
    assert!(value(&t, "JAX_COORDINATOR_ADDRESS").is_some());
    // The batch script gets none of them.
    let batch = Step { step_id: BATCH_STEP, ..s4 };
    let t = plan_task(&batch, &plan4, &settings, &Task::default(), &env(&[]));
    assert_eq!(value(&t, "JAX_COORDINATOR_ADDRESS"), None);
}

#[test]
fn omp_threads_divide_cpus_by_gpus() {
    let s = step(1, 1, 0, 1);
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    let omp = |gpus, bound| {
        let task = Task { local_id: 0, global_id: 0, gpus, bound_cpus: bound, share_gpus: None };
        value(&plan_task(&s, &plan, &settings, &task, &env(&[])), "OMP_NUM_THREADS").map(str::to_owned)
    };
    assert_eq!(omp(Some(1), None).as_deref(), Some("4"));
    assert_eq!(omp(Some(3), None).as_deref(), Some("1"));
    assert_eq!(omp(Some(8), None).as_deref(), Some("1"), "at least 1");
    assert_eq!(omp(None, None).as_deref(), Some("4"), "no GPU: all CPUs");
    assert_eq!(omp(Some(2), Some(14)).as_deref(), Some("7"), "bound CPUs count");
}

/// `--ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=12 --gpu-affinity`:
/// every task sees all 8 GPUs and is bound to its share (GPU LOCAL_RANK's 12
/// CPUs), so its threads are those 12, not 12 / 8.
#[test]
fn omp_threads_divide_by_the_gpus_of_the_share_the_task_was_bound_to() {
    let mut s = step(1, 8, 0, 8);
    s.cpus_per_task = 12;
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    let bound = Task { local_id: 3, global_id: 3, gpus: Some(8), bound_cpus: Some(12), share_gpus: Some(1) };
    let t = plan_task(&s, &plan, &settings, &bound, &env(&[]));
    let omp = t.vars.iter().find(|v| v.name == "OMP_NUM_THREADS").unwrap();
    assert_eq!(omp.value, "12");
    assert_eq!(
        omp.outcome,
        Outcome::Set("12 bound CPUs / 1 GPU (this task's share of the 8 it sees)".into())
    );
    // The record keeps the share, for `spank-gpu explain` in the task.
    assert_eq!(t.gpu_share, Some(1));
    assert_eq!(recorded_gpu_share(&t.record()), Some(1));
    assert_eq!(recorded_cpus_per_task(&t.record()), Some(12));
    // Not bound to a share (no --gpu-affinity, the user's --cpu-bind): the GPUs it sees.
    let unbound = Task { share_gpus: None, ..bound.clone() };
    let t = plan_task(&s, &plan, &settings, &unbound, &env(&[]));
    assert_eq!(value(&t, "OMP_NUM_THREADS"), Some("1"));
    assert_eq!(recorded_gpu_share(&t.record()), None);
    // 2 GPUs of the 8: their CPUs split between them.
    let two = Task { share_gpus: Some(2), ..bound.clone() };
    let t = plan_task(&s, &plan, &settings, &two, &env(&[]));
    let omp = t.vars.iter().find(|v| v.name == "OMP_NUM_THREADS").unwrap();
    assert_eq!(omp.value, "6");
    assert_eq!(
        omp.outcome,
        Outcome::Set("12 bound CPUs / 2 GPUs (this task's share of the 8 it sees)".into())
    );
    // A "share" that is not a part of what the task sees changes nothing.
    for share in [Some(0), Some(8), Some(9)] {
        let t = plan_task(&s, &plan, &settings, &Task { share_gpus: share, ..bound.clone() }, &env(&[]));
        assert_eq!(value(&t, "OMP_NUM_THREADS"), Some("1"), "{share:?}");
        assert_eq!(t.gpu_share, None, "{share:?}");
    }
    // The user's export is still kept.
    let t = plan_task(&s, &plan, &settings, &bound, &env(&[("OMP_NUM_THREADS", "3")]));
    let omp = t.vars.iter().find(|v| v.name == "OMP_NUM_THREADS").unwrap();
    assert_eq!(omp.outcome, Outcome::Kept("3".into()));

    // Only OMP_NUM_THREADS: one task per node (torchrun) still starts one
    // process per GPU it sees.
    let s1 = Step { cpus_per_task: 96, ..step(2, 2, 0, 1) };
    let plan1 = plan_step(&s1, &settings).unwrap();
    assert!(plan1.torchrun_layout);
    let task = Task { local_id: 0, global_id: 0, gpus: Some(8), bound_cpus: Some(48), share_gpus: Some(4) };
    let t = plan_task(&s1, &plan1, &settings, &task, &env(&[]));
    assert_eq!(value(&t, "PET_NPROC_PER_NODE"), Some("8"));
    assert_eq!(value(&t, "OMP_NUM_THREADS"), Some("12"));
    // ... and the lone task's GPU warning reads the GPUs it sees.
    let mut lone = step(1, 1, 0, 1);
    lone.job_gpus_on_node = Some(8);
    let plan_lone = plan_step(&lone, &settings).unwrap();
    let task = Task { gpus: Some(8), share_gpus: Some(1), bound_cpus: Some(12), ..Task::default() };
    assert!(plan_task(&lone, &plan_lone, &settings, &task, &env(&[])).warnings.is_empty());
}

#[test]
fn user_values_are_kept_and_plugin_values_recomputed() {
    let s = step(2, 4, 0, 2);
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    let task = Task { local_id: 1, global_id: 1, gpus: Some(1), bound_cpus: None, share_gpus: None };

    // The user exported MASTER_PORT: kept.
    let t = plan_task(&s, &plan, &settings, &task, &env(&[("MASTER_PORT", "29500")]));
    let port = t.vars.iter().find(|v| v.name == "MASTER_PORT").unwrap();
    assert_eq!(port.outcome, Outcome::Kept("29500".to_owned()));
    assert!(!t.to_set().any(|(n, _)| n == "MASTER_PORT"));

    // Values the plugin set in the batch step (recorded) are recomputed for the new step.
    let batch = plan_task(&s, &plan, &settings, &Task::default(), &env(&[]));
    let record = batch.record();
    let inherited: Vec<(&str, &str)> =
        batch.to_set().chain(std::iter::once((RECORD_VAR, record.as_str()))).collect();
    let t = plan_task(&s, &plan, &settings, &task, &env(&inherited));
    assert_eq!(t.to_set().find(|(n, _)| *n == "RANK"), Some(("RANK", "1")));

    // ... unless the user changed one after the plugin set it.
    let mut changed = inherited.clone();
    changed.retain(|(n, _)| *n != "OMP_NUM_THREADS");
    changed.push(("OMP_NUM_THREADS", "16"));
    let t = plan_task(&s, &plan, &settings, &task, &env(&changed));
    let omp = t.vars.iter().find(|v| v.name == "OMP_NUM_THREADS").unwrap();
    assert_eq!(omp.outcome, Outcome::Kept("16".to_owned()));
}

#[test]
fn port_order_is_option_then_reserved_then_derived() {
    let mut s = step(2, 2, 0, 1);
    let mut settings = Settings::default();
    assert_eq!(plan_step(&s, &settings).unwrap().port_source, PortSource::Derived);
    // Reserved ports are opt-in.
    s.resv_ports = Some("12000-12002".to_owned());
    assert_eq!(plan_step(&s, &settings).unwrap().port_source, PortSource::Derived);
    settings.resv_ports = true;
    // The last reserved port: mpi/cray_shasta gives the first to PMI.
    let p = plan_step(&s, &settings).unwrap();
    assert_eq!((p.master_port, p.port_source), (12002, PortSource::Reserved));
    s.resv_ports = Some("12000,12005".to_owned());
    assert_eq!(plan_step(&s, &settings).unwrap().master_port, 12005);
    // A het step's components have reserved ports of their own: derived.
    s.het = true;
    assert_eq!(plan_step(&s, &settings).unwrap().port_source, PortSource::Derived);
    settings.port = Some(31000);
    let p = plan_step(&s, &settings).unwrap();
    assert_eq!((p.master_port, p.port_source), (31000, PortSource::Option));
}

#[test]
fn an_explicit_port_word_beats_an_inherited_master_port() {
    let s = step(2, 2, 0, 1);
    let settings = Settings { port: Some(23456), ..Settings::default() };
    let plan = plan_step(&s, &settings).unwrap();
    let inherited = env(&[("MASTER_PORT", "12345"), ("PET_MASTER_PORT", "12345")]);
    let t = plan_task(&s, &plan, &settings, &Task::default(), &inherited);
    assert_eq!(t.to_set().find(|(n, _)| *n == "MASTER_PORT"), Some(("MASTER_PORT", "23456")));
    assert_eq!(t.to_set().find(|(n, _)| *n == "PET_MASTER_PORT"), Some(("PET_MASTER_PORT", "23456")));
    // Without the word, the user's export is kept.
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let t = plan_task(&s, &plan, &Settings::default(), &Task::default(), &inherited);
    assert!(!t.to_set().any(|(n, _)| n == "MASTER_PORT"));
}

/// The environment of task `procid` in a het step `srun -n1 A : -n2 B` on
/// node[1-2] (component 1 on node2), job 500+1 with leader 500.
fn het_env(procid: &'static str, nodeid: &'static str) -> impl Fn(&str) -> Option<String> {
    let pairs = vec![
        ("SLURM_JOB_ID", "500"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NODELIST", "node[1-2]"),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_STEP_NUM_TASKS", "3"),
        ("SLURM_STEP_TASKS_PER_NODE", "1,2"),
        ("SLURM_NODEID", nodeid),
        ("SLURM_PROCID", procid),
        ("SLURM_STEP_RESV_PORTS", "12000-12001"),
    ];
    env(&pairs)
}

#[test]
fn het_steps_take_the_whole_step_from_the_environment() {
    // Component 1's items: its own job id, 1 node, 2 tasks, node 0.
    let items = Items {
        job_id: Some(501),
        step_id: Some(0),
        nnodes: Some(1),
        node_id: Some(0),
        ntasks: Some(2),
        local_tasks: Some(2),
        cpus_per_task: Some(1),
    };
    let s = Step::from_env(&het_env("2", "1"), &items).unwrap();
    assert_eq!((s.job_id, s.ntasks, s.nnodes, s.node_id, s.het), (500, 3, 2, 1, true));
    let leader = Items { job_id: Some(500), nnodes: Some(1), ntasks: Some(1), local_tasks: Some(1), ..items };
    let s0 = Step::from_env(&het_env("0", "0"), &leader).unwrap();
    let (p, p0) =
        (plan_step(&s, &Settings::default()).unwrap(), plan_step(&s0, &Settings::default()).unwrap());
    assert_eq!((p.master_addr.as_str(), p.master_port), (p0.master_addr.as_str(), p0.master_port));
    assert_eq!(p.port_source, PortSource::Derived, "components' reserved ports differ");
    let t = plan_task(
        &s,
        &p,
        &Settings::default(),
        &Task { global_id: 2, local_id: 1, ..Task::default() },
        &env(&[]),
    );
    assert_eq!(value(&t, "WORLD_SIZE"), Some("3"));
    assert_eq!(value(&t, "NODE_RANK"), Some("1"));
    // An ordinary step: items and environment agree.
    let plain = Items { job_id: Some(500), nnodes: Some(2), ntasks: Some(3), ..items };
    assert!(!Step::from_env(&het_env("2", "1"), &plain).unwrap().het);
}

/// Task `procid` of `srun -N2 --ntasks-per-node=N` on node `nodeid`,
/// local `localid`, as Slurm describes it.
fn two_node_env(
    procid: &str,
    nodeid: &str,
    localid: &str,
    per_node: &str,
) -> impl Fn(&str) -> Option<String> + use<> {
    let pairs: Vec<(String, String)> = [
        ("SLURM_JOB_ID", "40"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NODELIST", "node[1-2]"),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_STEP_NUM_TASKS", &(2 * per_node.parse::<u32>().unwrap()).to_string()),
        ("SLURM_STEP_TASKS_PER_NODE", &format!("{per_node}(x2)")),
        ("SLURM_NODEID", nodeid),
        ("SLURM_PROCID", procid),
        ("SLURM_LOCALID", localid),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[test]
fn ranks_follow_node_order_when_slurm_numbers_tasks_otherwise() {
    // 26.05 with topology/tree and node2's switch first: task 0 on node2.
    // Node 0 (node1, MASTER_ADDR) has SLURM_PROCID 1: it is RANK 0.
    for (procid, nodeid, want) in [("1", "0", "0"), ("0", "1", "1")] {
        let e = two_node_env(procid, nodeid, "0", "1");
        let s = Step::from_env(&e, &Items::default()).unwrap();
        let plan = plan_step(&s, &Settings::default()).unwrap();
        let task = Task { local_id: 0, global_id: procid.parse().unwrap(), ..Task::default() };
        let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
        assert_eq!(plan.master_addr, "node1");
        assert_eq!(value(&t, "RANK"), Some(want), "SLURM_PROCID {procid}");
        assert_eq!(value(&t, "NODE_RANK"), Some(nodeid));
        assert_eq!(value(&t, "PET_NODE_RANK"), Some(nodeid));
        let rank = t.vars.iter().find(|v| v.name == "RANK").unwrap();
        let why = format!("Slurm numbered this task SLURM_PROCID={procid}");
        assert!(matches!(&rank.outcome, Outcome::Set(w) if w.contains(&why)), "{rank:?}");
        assert!(t.verbose_line(&task, "node1").contains(&format!("RANK={want} (in node order")));
        // JAX numbers its processes by SLURM_PROCID: told where that is not RANK.
        let jax = t.warnings.iter().any(|w| w.starts_with(&format!("RANK={want} but SLURM_PROCID={procid}")));
        assert_eq!(jax, want != procid, "{:?}", t.warnings);
    }
    // Cyclic over 2 nodes, 2 tasks each: node 0 has SLURM_PROCIDs 0 and 2.
    let e = two_node_env("2", "0", "1", "2");
    let s = Step::from_env(&e, &Items::default()).unwrap();
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let task = Task { local_id: 1, global_id: 2, ..Task::default() };
    assert_eq!(value(&plan_task(&s, &plan, &Settings::default(), &task, &env(&[])), "RANK"), Some("1"));
    // Block order: RANK is SLURM_PROCID, with no reason given.
    let e = two_node_env("3", "1", "1", "2");
    let s = Step::from_env(&e, &Items::default()).unwrap();
    let task = Task { local_id: 1, global_id: 3, ..Task::default() };
    let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
    let rank = t.vars.iter().find(|v| v.name == "RANK").unwrap();
    assert_eq!((rank.value.as_str(), &rank.outcome), ("3", &Outcome::Set(String::new())));
    // Without the layout (or one that is not this step's) SLURM_PROCID stays.
    let mut s = Step::from_env(&two_node_env("1", "0", "0", "1"), &Items::default()).unwrap();
    s.tasks_per_node = None;
    let task = Task { local_id: 0, global_id: 1, ..Task::default() };
    assert_eq!(value(&plan_task(&s, &plan, &Settings::default(), &task, &env(&[])), "RANK"), Some("1"));
    // Two het components on one node: SLURM_GTIDS has this component's tasks only.
    let mut s = Step::from_env(&two_node_env("1", "0", "0", "1"), &Items::default()).unwrap();
    s.tasks_per_node = Some(vec![2]);
    s.nnodes = 1;
    s.local_tasks = 2;
    s.local_gtids = Some(1);
    assert_eq!(s.node_order_rank(0), None);
}

/// [`two_node_env`] with srun's word that task 0 is on node 1 (node2).
fn with_task_order(e: impl Fn(&str) -> Option<String>, order: &str) -> impl Fn(&str) -> Option<String> {
    let order = order.to_owned();
    move |k| if k == crate::layout::TASK_ORDER_VAR { Some(order.clone()) } else { e(k) }
}

#[test]
fn with_srun_s_layout_ranks_are_slurm_s_and_master_addr_is_task_0_s_node() {
    // 26.05 with topology/tree and node2's switch first: task 0 on node2,
    // and srun's plugin said so (job 40, step 0, node 1 first).
    for (procid, nodeid, node_rank) in [("1", "0", "1"), ("0", "1", "0")] {
        let e = with_task_order(two_node_env(procid, nodeid, "0", "1"), "40.0:1,0");
        let s = Step::from_env(&e, &Items::default()).unwrap();
        assert_eq!(s.task_order, Some(vec![1, 0]));
        let plan = plan_step(&s, &Settings::default()).unwrap();
        assert_eq!(plan.master_addr, "node2", "task 0's node");
        assert!(plan.master_addr_why.contains("task 0"), "{}", plan.master_addr_why);
        let task = Task { local_id: 0, global_id: procid.parse().unwrap(), ..Task::default() };
        let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
        assert_eq!(value(&t, "RANK"), Some(procid), "RANK is SLURM_PROCID");
        assert_eq!(value(&t, "NODE_RANK"), Some(node_rank));
        assert_eq!(value(&t, "PET_NODE_RANK"), Some(node_rank));
        assert_eq!(value(&t, "JAX_COORDINATOR_ADDRESS").map(|a| a.starts_with("node2:")), Some(true));
        assert!(t.warnings.iter().all(|w| !w.contains("SLURM_PROCID")), "{:?}", t.warnings);
    }
    // Another step's word (an enclosing step's, inherited) is not this step's.
    let e = with_task_order(two_node_env("1", "0", "0", "1"), "40.3:1,0");
    let s = Step::from_env(&e, &Items::default()).unwrap();
    assert_eq!(s.task_order, None);
    assert_eq!(plan_step(&s, &Settings::default()).unwrap().master_addr, "node1");
    // A het step keeps node order: its node indices are per component.
    let e = with_task_order(two_node_env("1", "0", "0", "1"), "40.0:1,0");
    let items = Items { nnodes: Some(1), ntasks: Some(1), ..Items::default() };
    assert_eq!(Step::from_env(&e, &items).unwrap().task_order, None);
}

#[test]
fn the_batch_step_sets_only_what_every_step_shares() {
    let batch = env(&[
        ("SLURM_JOB_ID", "77"),
        ("SLURM_JOB_NODELIST", "node[3-4]"),
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURM_TASKS_PER_NODE", "4(x2)"),
    ]);
    let s = Step::from_env(&batch, &Items { step_id: Some(BATCH_STEP), ..Items::default() }).unwrap();
    assert!(s.is_batch());
    let plan = plan_step(&s, &Settings::default()).unwrap();
    assert_eq!(plan.master_addr, "node3", "the job's first node, not the batch host");
    let step0 = Step { step_id: 0, ..s.clone() };
    assert_eq!(plan.master_port, plan_step(&step0, &Settings::default()).unwrap().master_port);
    let settings =
        Settings { env_defaults: vec![("NCCL_DEBUG".into(), "WARN".into())], ..Settings::default() };
    let t = plan_task(&s, &plan, &settings, &Task::default(), &env(&[]));
    let names: Vec<&str> = t.vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["MASTER_ADDR", "MASTER_PORT", "NCCL_DEBUG"]);
    assert!(t.warnings.is_empty());
    // With reserved ports the steps' port is Slurm's: the batch script cannot know it.
    let settings = Settings { resv_ports: true, ..settings };
    let t = plan_task(&s, &plan, &settings, &Task::default(), &env(&[]));
    assert!(!t.vars.iter().any(|v| v.name == "MASTER_PORT"), "{:?}", t.vars);
    assert_eq!(step_name(BATCH_STEP), "batch");
}

#[test]
fn a_batch_step_without_a_task_count_still_gets_its_addr_and_port() {
    // `sbatch -N1 --wrap ...` without -n: slurmstepd's batch step has 0
    // tasks (the job's num_tasks) and no SLURM_NTASKS.
    let batch = env(&[("SLURM_JOB_ID", "91"), ("SLURM_JOB_NODELIST", "node1"), ("SLURM_NNODES", "1")]);
    let items = Items {
        step_id: Some(BATCH_STEP),
        ntasks: Some(0),
        nnodes: Some(1),
        node_id: Some(0),
        ..Items::default()
    };
    let s = Step::from_env(&batch, &items).unwrap();
    assert_eq!((s.ntasks, s.nnodes), (0, 1));
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let t = plan_task(&s, &plan, &Settings::default(), &Task::default(), &env(&[]));
    let names: Vec<&str> = t.vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["MASTER_ADDR", "MASTER_PORT"]);
    assert_eq!(value(&t, "MASTER_ADDR"), Some("node1"));
    // An ordinary step with no task is still refused.
    let step0 = Step { step_id: 0, ..s };
    assert_eq!(
        plan_step(&step0, &Settings::default()).unwrap_err(),
        RdzvError::Inconsistent { node_id: 0, nnodes: 1, ntasks: 0 }
    );
}

#[test]
fn an_mpi_launchers_daemons_get_no_per_rank_variables() {
    // mpirun's `srun --external-launcher prted` on 2 nodes: one task per node.
    let mut s = step(2, 2, 1, 1);
    s.argv = ["/usr/bin/prted", "--prtemca", "ess", "slurm"].map(str::to_owned).to_vec();
    assert_eq!(s.mpi_daemon(), Some("prted"));
    let plan = plan_step(&s, &Settings::default()).unwrap();
    assert!(!plan.torchrun_layout);
    let settings =
        Settings { env_defaults: vec![("NCCL_DEBUG".into(), "WARN".into())], ..Settings::default() };
    let task = Task { local_id: 0, global_id: 1, gpus: Some(8), bound_cpus: None, share_gpus: None };
    let t = plan_task(&s, &plan, &settings, &task, &env(&[]));
    let names: Vec<&str> = t.vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["MASTER_ADDR", "MASTER_PORT", "NCCL_DEBUG"]);
    assert!(t.warnings.is_empty());
    // The same step with another command is an ordinary one.
    s.argv = ["python", "prted"].map(str::to_owned).to_vec();
    assert_eq!(s.mpi_daemon(), None);
    let plan = plan_step(&s, &Settings::default()).unwrap();
    assert!(plan_task(&s, &plan, &settings, &task, &env(&[])).vars.iter().any(|v| v.name == "RANK"));
}

#[test]
fn unbound_tasks_share_the_steps_cpus_on_the_node() {
    // --exclusive without -c: 1 CPU per task, 64 CPUs on the node, 2 tasks.
    let mut s = step(1, 2, 0, 2);
    s.cpus_per_task = 1;
    s.cpus_on_node = Some(64);
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let task = Task { gpus: Some(4), ..Task::default() };
    let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
    assert_eq!(value(&t, "OMP_NUM_THREADS"), Some("8"));
    // A task with its own mask counts it.
    let task = Task { gpus: Some(1), bound_cpus: Some(6), ..Task::default() };
    assert_eq!(
        value(&plan_task(&s, &plan, &Settings::default(), &task, &env(&[])), "OMP_NUM_THREADS"),
        Some("6")
    );
}

#[test]
fn a_huge_node_list_is_handled_in_bounded_time() {
    let mut s = step(2, 2, 0, 1);
    s.node_list = format!("node[{}", "1,".repeat(500_000));
    let t = std::time::Instant::now();
    let e = plan_step(&s, &Settings::default()).unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
    assert!(matches!(e, RdzvError::NodeList(_)), "{e:?}");
    assert!(e.to_string().len() < 1000, "{} bytes", e.to_string().len());
    // A valid but long list still gives its first host at once.
    s.node_list = (0..60_000).map(|i| format!("n{i}")).collect::<Vec<_>>().join(",");
    assert_eq!(plan_step(&s, &Settings::default()).unwrap().master_addr, "n0");
}

#[test]
fn a_step_without_its_variables_is_an_error_of_its_kind() {
    let none = |_: &str| None;
    let e = Step::from_env(&none, &Items::default()).unwrap_err();
    assert_eq!(e, RdzvError::Missing("SLURM_STEP_NODELIST"));
    assert_eq!(e.to_string(), "SLURM_STEP_NODELIST is not set: run this inside a job step");
    let bad_id = |k: &str| (k == "SLURM_STEP_ID").then(|| "x".to_owned());
    assert_eq!(Step::from_env(&bad_id, &Items::default()).unwrap_err(), RdzvError::BadStepId);
}

#[test]
fn bad_node_list_is_an_error() {
    let mut s = step(2, 2, 0, 1);
    s.node_list = "node[3-1]".to_owned();
    let e = plan_step(&s, &Settings::default()).unwrap_err();
    assert!(
        matches!(&e, RdzvError::NodeList(h) if h.kind == hostlist::HostlistErrorKind::Backwards),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "cannot find MASTER_ADDR: bad hostlist 'node[3-1]': in 'node[3-1]': range '3-1' runs backwards"
    );
    s.node_list = "node[1-2]".to_owned();
    s.node_id = 5;
    let e = plan_step(&s, &Settings::default()).unwrap_err();
    assert_eq!(e, RdzvError::Inconsistent { node_id: 5, nnodes: 2, ntasks: 2 });
    assert_eq!(e.to_string(), "inconsistent step: node 5 of 2 nodes, 2 tasks");
}

#[test]
fn admin_defaults_apply_only_where_unset() {
    let s = step(1, 1, 0, 1);
    let settings = Settings {
        env_defaults: vec![
            ("NCCL_SOCKET_IFNAME".to_owned(), "ib0".to_owned()),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING".to_owned(), "1".to_owned()),
        ],
        ..Settings::default()
    };
    let plan = plan_step(&s, &settings).unwrap();
    let t = plan_task(&s, &plan, &settings, &Task::default(), &env(&[("NCCL_SOCKET_IFNAME", "eth9")]));
    let set: Vec<_> = t.to_set().collect();
    assert!(set.contains(&("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")));
    assert!(!set.iter().any(|(n, _)| *n == "NCCL_SOCKET_IFNAME"));
}

#[test]
fn interface_defaults_come_per_node_not_from_the_line() {
    let cfg = crate::plugstack::PluginConfig::parse(
        &["nccl_socket_ifname=ib", "GLOO_SOCKET_IFNAME=ib0", "NCCL_DEBUG=WARN"],
        false,
    )
    .unwrap();
    let settings = Settings::new(&cfg, None, 0);
    assert_eq!(settings.env_defaults, [("NCCL_DEBUG".to_owned(), "WARN".to_owned())]);
    assert!(settings.iface_vars.is_empty());
    // The node's offers, as a task gets them: planned with their reason, the user's kept.
    let task_ifaces = crate::netif::TaskIfaces {
        set: vec![crate::netif::Offer {
            name: crate::netif::NCCL_VAR,
            value: "=enp65s0".into(),
            why: "nccl_socket_net=10.1.0.0/16 on this node".into(),
            held_by_conf: true,
        }],
        ..crate::netif::TaskIfaces::default()
    };
    let settings = settings.with_interfaces(&task_ifaces);
    let s = step(1, 1, 0, 1);
    let plan = plan_step(&s, &settings).unwrap();
    let t = plan_task(&s, &plan, &settings, &Task::default(), &env(&[]));
    let var = t.vars.iter().find(|v| v.name == "NCCL_SOCKET_IFNAME").unwrap();
    assert_eq!(var.value, "=enp65s0");
    assert_eq!(var.outcome, Outcome::Set("nccl_socket_net=10.1.0.0/16 on this node".into()));
    let t = plan_task(&s, &plan, &settings, &Task::default(), &env(&[("NCCL_SOCKET_IFNAME", "eth9")]));
    let var = t.vars.iter().find(|v| v.name == "NCCL_SOCKET_IFNAME").unwrap();
    assert_eq!(var.outcome, Outcome::Kept("eth9".into()));
}

#[test]
fn warns_about_the_user_guide_traps() {
    let mut s = step(1, 1, 0, 1);
    s.cpus_per_task = 1;
    s.job_cpus_per_task = Some(8);
    s.job_gpus_on_node = Some(8);
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let task = Task { local_id: 0, global_id: 0, gpus: Some(1), bound_cpus: None, share_gpus: None };
    let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
    assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
    assert!(t.warnings[0].contains("--cpus-per-task"));
    assert!(t.warnings[1].contains("--gpus-per-node=8"));
    // The fix per release: 22.05-23.02 read SRUN_CPUS_PER_TASK, 23.11+ SLURM_CPUS_PER_TASK.
    for (version, srun_var) in
        [((22 << 16) | (5 << 8), true), ((23 << 16) | (2 << 8), true), ((24 << 16) | (11 << 8), false)]
    {
        let settings = Settings { slurm_version: version, ..Settings::default() };
        let w = &plan_task(&s, &plan, &settings, &task, &env(&[])).warnings[0];
        assert!(w.contains("run srun --cpus-per-task=$SLURM_CPUS_PER_TASK"), "{w}");
        assert_eq!(w.contains("SRUN_CPUS_PER_TASK"), srun_var, "{version:x}: {w}");
        assert_eq!(w.contains("since Slurm 23.11"), !srun_var, "{version:x}: {w}");
    }

    s.cpus_per_task = 8;
    let task = Task { gpus: Some(8), ..task };
    assert!(plan_task(&s, &plan, &Settings::default(), &task, &env(&[])).warnings.is_empty());
}

#[test]
fn verbose_line_says_what_was_set_and_kept() {
    let s = step(2, 4, 0, 2);
    let settings = Settings::default();
    let plan = plan_step(&s, &settings).unwrap();
    let task = Task { local_id: 1, global_id: 1, gpus: Some(1), bound_cpus: None, share_gpus: None };
    let t = plan_task(&s, &plan, &settings, &task, &env(&[("MASTER_PORT", "29500")]));
    let line = t.verbose_line(&task, "node1");
    assert!(line.starts_with("spank-gpu: task 1 (node1 local 1): set MASTER_ADDR=node1"), "{line}");
    assert!(line.contains("kept MASTER_PORT=29500 (set by you"), "{line}");
    let claimed = t.claimed();
    assert_eq!(&claimed[..2], ["MASTER_ADDR", "MASTER_PORT"], "set and kept: {claimed:?}");
    assert!(claimed.contains(&"RANK") && claimed.contains(&"OMP_NUM_THREADS"), "{claimed:?}");
}

#[test]
fn apptainer_cleanenv_gets_each_name_again_with_its_prefix() {
    let mut s = step(2, 4, 0, 2);
    s.argv = ["apptainer", "exec", "--nv", "--cleanenv", "img.sif", "python", "train.py"]
        .iter()
        .map(|w| (*w).to_owned())
        .collect();
    let plan = plan_step(&s, &Settings::default()).unwrap();
    let task = Task { gpus: Some(1), ..Task::default() };
    // The user's own port is kept, and passed as theirs; their own prefixed rank too.
    let user = env(&[("MASTER_PORT", "23456"), ("APPTAINERENV_RANK", "7")]);
    let t = plan_task(&s, &plan, &Settings::default(), &task, &user);
    assert_eq!(value(&t, "APPTAINERENV_MASTER_ADDR"), value(&t, "MASTER_ADDR"));
    assert_eq!(value(&t, "APPTAINERENV_MASTER_PORT"), Some("23456"));
    assert_eq!(value(&t, "APPTAINERENV_WORLD_SIZE"), Some("4"));
    assert_eq!(value(&t, "APPTAINERENV_OMP_NUM_THREADS"), value(&t, "OMP_NUM_THREADS"));
    let set: Vec<&str> = t.to_set().map(|(n, _)| n).collect();
    assert!(set.contains(&"APPTAINERENV_MASTER_PORT") && !set.contains(&"MASTER_PORT"), "{set:?}");
    assert!(!set.contains(&"APPTAINERENV_RANK"), "the user's APPTAINERENV_RANK is theirs: {set:?}");
    let line = t.verbose_line(&task, "node1");
    assert!(
        line.contains("; through apptainer --cleanenv as APPTAINERENV_*: MASTER_ADDR MASTER_PORT"),
        "{line}"
    );
    assert!(!line.contains(" APPTAINERENV_MASTER_ADDR="), "{line}");
    let claimed = t.claimed();
    assert!(claimed.contains(&"MASTER_PORT"), "the user's, kept: {claimed:?}");
    assert!(!claimed.iter().any(|n| n.starts_with("APPTAINERENV_")), "{claimed:?}");
    // Without --cleanenv the environment passes as it is: no copies.
    s.argv.retain(|w| w != "--cleanenv");
    let t = plan_task(&s, &plan, &Settings::default(), &task, &env(&[]));
    assert!(t.vars.iter().all(|v| !v.name.starts_with("APPTAINERENV_")));
}

#[test]
fn step_wide_vars_are_planned_alike_in_every_task_of_a_node() {
    let mut settings = Settings::default();
    settings.env_defaults.push(("NCCL_DEBUG".to_owned(), "WARN".to_owned()));
    let envs = [
        env(&[]),
        env(&[("MASTER_PORT", "4242")]),
        env(&[("NCCL_DEBUG", "INFO"), ("MASTER_ADDR", "login1")]),
    ];
    for (nnodes, ntasks, local_tasks) in [(2, 4, 2), (2, 16, 8), (1, 1, 1), (2, 2, 1), (3, 7, 3)] {
        for node_id in 0..nnodes {
            let s = step(nnodes, ntasks, node_id, local_tasks);
            let plan = plan_step(&s, &settings).unwrap();
            for e in &envs {
                let task = |local_id: u32, gpus: u32, bound: Option<u32>| Task {
                    local_id,
                    global_id: node_id * local_tasks + local_id,
                    gpus: Some(gpus),
                    bound_cpus: bound,
                    share_gpus: None,
                };
                let first = plan_task(&s, &plan, &settings, &task(0, 8, None), e);
                for other in [task(1, 1, Some(3)), task(local_tasks - 1, 2, None)] {
                    let t = plan_task(&s, &plan, &settings, &other, e);
                    for v in first.vars.iter().filter(|v| is_step_wide(&v.name, &settings)) {
                        assert_eq!(t.vars.iter().find(|w| w.name == v.name), Some(v), "{s:?} {other:?}");
                    }
                }
                let wide = first.vars.iter().filter(|v| is_step_wide(&v.name, &settings)).count();
                assert!(wide >= 4, "{wide} step-wide variables in {first:?}");
            }
        }
    }
    // The per-task names are computed ones, and none of them is step-wide.
    for name in PER_TASK_VARS {
        assert!(COMPUTED_VARS.contains(name), "{name}");
    }
    for name in ["RANK", "LOCAL_RANK", "OMP_NUM_THREADS", "PET_NPROC_PER_NODE", RECORD_VAR] {
        assert!(!is_step_wide(name, &settings), "{name}");
    }
}
