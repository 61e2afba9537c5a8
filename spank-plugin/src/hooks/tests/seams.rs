//! Every seam × feature: with one call to Slurm or the node failing, what a
//! task of a 2-node step still gets. `--auto-rdzv` and `--gpu-affinity` each
//! fail alone: the hook returns success (the step runs), the failing feature
//! says so in one log line (and, with `verbose`, on the task's stderr), and
//! the other applies in full.

use super::super::fake::FakeSpank;
use super::with_topology;
use super::*;

/// Which features are asked for.
#[derive(Clone, Copy, Debug)]
struct Features {
    rdzv: bool,
    bind: bool,
}

const COMBOS: [Features; 3] = [
    Features { rdzv: true, bind: false },
    Features { rdzv: false, bind: true },
    Features { rdzv: true, bind: true },
];

/// One failing seam: whether each feature still applies, and the words of
/// the failing feature's log line.
struct Row {
    seam: &'static str,
    rdzv_ok: bool,
    bind_ok: bool,
    says: &'static str,
}

const fn row(seam: &'static str, rdzv_ok: bool, bind_ok: bool, says: &'static str) -> Row {
    Row { seam, rdzv_ok, bind_ok, says }
}

const ROWS: &[Row] = &[
    row("set_affinity", true, false, "sched_setaffinity: Invalid argument"),
    row("affinity", true, false, "reading the task's CPU mask"),
    row("prefer_memory", true, true, "set_mempolicy"),
    row("item:TaskId", false, false, "reading TaskId"),
    row("item:TaskGlobalId", false, false, "reading TaskGlobalId"),
    row("item:LocalTaskCount", false, false, "reading LocalTaskCount"),
    row("item:JobId", false, true, "reading JobId"),
    row("item:NNodes", false, true, "reading NNodes"),
    row("item:StepCpusPerTask", false, true, "reading StepCpusPerTask"),
    row("option_arg:auto-rdzv", false, true, "reading --auto-rdzv"),
    row("option_arg:gpu-affinity", true, false, "reading --gpu-affinity"),
    row("getenv:SLURM_STEP_NODELIST", false, true, "SLURM_STEP_NODELIST"),
    row("read_trusted", true, false, "no usable GPU table"),
    row("setenv:RANK", true, true, "Slurm refused to set RANK"),
    row("setenv", false, true, "Slurm refused to set"),
    row("probe_port", true, true, "cannot be bound"),
    row("command", true, true, ""),
    // The device directory not opened before the fork: each task probes by path.
    row("open_dev_dir", true, true, "opening the device directory"),
    // The descriptor no longer names the directory (contain_spank): the path
    // probe, silently.
    row("device_access_at", true, true, ""),
    // In a pyxis container (these rows only): whether pyxis runs after
    // spank_gpu cannot be told, so nothing is said of it.
    row("mount_ns", true, true, "cannot tell whether pyxis runs after"),
    row("foreign_option", true, true, "reading pyxis's options"),
    // The node's network, read before the fork for verbose (and the
    // interface variables, `interface_seams_set_nothing_and_fail_nothing`):
    // one debug line, and verbose says what it cannot tell.
    row("interfaces", true, true, "reading the network interfaces"),
    // The job's user's home, and ~/.nccl.conf read as the user: verbose's
    // prediction says it could not read the file.
    row("user_home", true, true, ""),
    row("read_user_file", true, true, ""),
    // Only a value another node's step set is removed: none here.
    row("unsetenv", true, true, ""),
];

/// The seams whose failure, where the feature still applies, is one debug
/// line of that feature.
const DEBUG_LINE_SEAMS: [&str; 3] = ["mount_ns", "foreign_option", "interfaces"];

/// The seams asked only of a step in a pyxis container; their rows run in one.
const PYXIS_SEAMS: [&str; 2] = ["mount_ns", "foreign_option"];

/// Task 0 (local 0) on node 1 of the 2-node, 4-task step, GPU 0 of GPUs 0
/// and 1, both options with `verbose` (and `mem`) where asked for.
fn task(f: Features, seam: &str) -> (FakeSpank, Result<(), HookError>) {
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
    if f.rdzv {
        sp.options.insert("auto-rdzv", "verbose".into());
    }
    if f.bind {
        sp.options.insert("gpu-affinity", "verbose,mem".into());
    }
    if PYXIS_SEAMS.contains(&seam) {
        sp.foreign_options.insert("container-image", "nvcr.io#nvidia/pytorch:24.05-py3".into());
    }
    let mut sp = sp.failing(seam);
    let state = user_init(&mut sp, &[]).expect("user_init never fails");
    let r = task_init(&mut sp, &[], state.as_ref());
    (sp, r)
}

fn logged(sp: &FakeSpank, prefix: &str) -> Vec<String> {
    sp.log.borrow().iter().map(|(_, l)| l.clone()).filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn without_a_failing_seam_both_features_apply() {
    let (sp, r) = task(COMBOS[2], "nothing");
    assert_eq!(r, Ok(()));
    assert_eq!(sp.mask.to_string(), "0-3");
    assert_eq!(sp.mem_nodes, vec![0]);
    for (name, want) in
        [("RANK", "0"), ("MASTER_ADDR", "node1"), ("WORLD_SIZE", "4"), ("OMP_NUM_THREADS", "4")]
    {
        assert_eq!(sp.var(name), Some(want), "{name}");
    }
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
}

#[test]
fn each_feature_fails_alone_whatever_seam_fails() {
    for r in ROWS {
        for f in COMBOS {
            let (sp, result) = task(f, r.seam);
            let at = format!("{} with {f:?}", r.seam);
            let log = sp.log.borrow().clone();
            let err = sp.stderr.borrow().clone();
            // The step runs: no failure reaches Slurm.
            assert_eq!(result, Ok(()), "{at}");
            // --auto-rdzv: everything, or (its failure) nothing.
            let rdzv_set = f.rdzv && r.rdzv_ok;
            assert_eq!(sp.var("MASTER_ADDR").is_some(), rdzv_set, "{at}: MASTER_ADDR; log {log:?}");
            assert_eq!(sp.var("MASTER_PORT").is_some(), rdzv_set, "{at}: MASTER_PORT");
            assert_eq!(sp.var("WORLD_SIZE").is_some(), rdzv_set, "{at}: WORLD_SIZE");
            let rank = if r.seam == "setenv:RANK" { false } else { rdzv_set };
            assert_eq!(sp.var("RANK").is_some(), rank, "{at}: RANK");
            // --gpu-affinity: bound to GPU 0's half of domain 0, or Slurm's mask kept.
            let bound = f.bind && r.bind_ok;
            let mask = sp.mask.to_string();
            assert_eq!(mask, if bound { "0-3" } else { "0-15" }, "{at}: mask; log {log:?}");
            if rdzv_set && bound {
                assert_eq!(sp.var("OMP_NUM_THREADS"), Some("4"), "{at}: the bound mask's CPUs per GPU");
            }
            // The failing feature's one line in the log, naming it and the failure.
            if !r.says.is_empty() && ((f.rdzv && !r.rdzv_ok) || (f.bind && !r.bind_ok)) {
                let feature = if f.rdzv && !r.rdzv_ok { "--auto-rdzv" } else { "--gpu-affinity" };
                let lines = logged(&sp, feature);
                // One line per hook that met it: user_init's (once per node)
                // and task_init's (this task), never more.
                assert!((1..=2).contains(&lines.len()), "{at}: one {feature} line per hook, got {log:?}");
                assert!(lines.iter().all(|l| l.contains(r.says)), "{at}: {lines:?}");
                if lines.len() == 2 {
                    assert_ne!(lines[0], lines[1], "{at}: the same line twice");
                }
            }
            // A feature that applies logs nothing of its own (an injected
            // trouble it works around aside).
            if f.bind && r.bind_ok && !matches!(r.seam, "prefer_memory" | "open_dev_dir") {
                assert!(logged(&sp, "--gpu-affinity").is_empty(), "{at}: {log:?}");
            }
            if f.bind && r.seam == "open_dev_dir" {
                let lines = logged(&sp, "--gpu-affinity");
                assert!(lines.len() == 1 && lines[0].contains(r.says), "{at}: one line, {log:?}");
                assert!(sp.log.borrow().iter().all(|(l, _)| *l == Level::Debug), "{at}: {log:?}");
            }
            if f.rdzv && r.rdzv_ok && !matches!(r.seam, "setenv:RANK" | "affinity") {
                if DEBUG_LINE_SEAMS.contains(&r.seam) {
                    // One debug line, and the task is told nothing of pyxis.
                    let lines = logged(&sp, "--auto-rdzv");
                    assert!(lines.len() == 1 && lines[0].contains(r.says), "{at}: one line, {log:?}");
                    assert!(sp.log.borrow().iter().all(|(l, _)| *l == Level::Debug), "{at}: {log:?}");
                    assert!(!err.iter().any(|l| l.contains("pyxis")), "{at}: {err:?}");
                } else {
                    assert!(logged(&sp, "--auto-rdzv").is_empty(), "{at}: {log:?}");
                }
            }
            // verbose: the task is told of its own feature's failure (not
            // where the option itself, and so its `verbose`, cannot be read).
            let told = !r.seam.starts_with("option_arg:");
            if f.bind && !r.bind_ok && told {
                assert!(err.iter().any(|l| l.starts_with("spank-gpu: gpu-affinity:")), "{at}: {err:?}");
            }
            if f.rdzv && !r.rdzv_ok && told {
                assert!(err.iter().any(|l| l.starts_with("spank-gpu: --auto-rdzv:")), "{at}: {err:?}");
            }
            assert!(err.iter().all(|l| l.starts_with("spank-gpu: ")), "{at}: {err:?}");
        }
    }
}

#[test]
fn interface_seams_set_nothing_and_fail_nothing() {
    use task_plan::netif::{GLOO_VAR, NCCL_VAR};
    let fabric = super::fake::fake_node(&["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.1/24", "ib0 UR 10.1.0.7/16"]);
    for (seam, sets, says) in [
        ("nothing", true, ""),
        ("interfaces", false, "the network interfaces of node1 cannot be read (getifaddrs: Invalid argument"),
        ("read_trusted:/etc/nccl.conf", false, "/etc/nccl.conf: Invalid argument (os error 22); whether"),
        ("user_home", false, "~/.nccl.conf cannot be read (the job's user's home is unknown"),
        ("item:JobUid", false, "~/.nccl.conf cannot be read (the job's user's home is unknown"),
        ("read_user_file", false, "~/.nccl.conf cannot be read (/home/u/.nccl.conf: Permission denied"),
        ("setenv:NCCL_SOCKET_IFNAME", false, "Slurm refused to set NCCL_SOCKET_IFNAME"),
    ] {
        for local in [0, 1] {
            let mut sp = FakeSpank::task(0, local, local);
            sp.interfaces = fabric.clone();
            sp.sysctls.insert("kernel/hostname", "node1\n".into());
            sp.options.insert("auto-rdzv", "verbose".into());
            let mut sp = sp.failing(seam);
            let args = vec!["nccl_socket_net=10.1.0.0/16".to_owned()];
            let state = user_init(&mut sp, &args).expect("user_init never fails");
            let r = task_init(&mut sp, &args, state.as_ref());
            let at = format!("{seam}, task {local}");
            let log = sp.log.borrow().clone();
            assert_eq!(r, Ok(()), "{at}");
            assert_eq!(sp.var("MASTER_ADDR"), Some("node1"), "{at}: the rendezvous is whole");
            assert_eq!(sp.var(NCCL_VAR), sets.then_some("=ib0"), "{at}; log {log:?}");
            if seam != "setenv:NCCL_SOCKET_IFNAME" {
                assert_eq!(sp.var(GLOO_VAR), sets.then_some("ib0"), "{at}");
            }
            // One line per node: user_init's, or the first task's.
            let lines: Vec<&String> = log.iter().map(|(_, l)| l).filter(|l| l.contains(says)).collect();
            let per_node = seam.starts_with("setenv")
                || local == 0
                || seam == "interfaces"
                || seam.starts_with("read_trusted");
            if !says.is_empty() {
                assert_eq!(lines.len(), usize::from(per_node), "{at}: {log:?}");
            }
            if sets {
                assert!(log.is_empty(), "{at}: {log:?}");
            }
            // verbose says what NCCL and gloo use all the same.
            let err = sp.stderr.borrow().join("\n");
            assert_eq!(err.contains("spank-gpu: network on node1: NCCL "), local == 0, "{at}: {err}");
        }
    }
}

#[test]
fn strict_still_fails_the_task_when_the_binding_failed() {
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
    sp.options.insert("auto-rdzv", "strict".into());
    sp.options.insert("gpu-affinity", String::new());
    sp.port_taken = Some("pid 4242 (python)".into());
    let mut sp = sp.failing("set_affinity");
    let state = user_init(&mut sp, &[]).unwrap();
    let r = task_init(&mut sp, &[], state.as_ref());
    assert!(matches!(r, Err(HookError::FailStep(_))), "{r:?}");
    assert_eq!(sp.var("MASTER_ADDR"), Some("node1"), "the variables are set before the step fails");
}

#[test]
fn srun_keeps_node_order_when_the_layout_rpc_or_its_variable_fails() {
    for seam in ["step_first_tasks", "srun_env"] {
        let mut sp = FakeSpank::new(Context::Local);
        for (k, v) in [("JobId", 77), ("StepId", 0), ("NNodes", 2)] {
            sp.items.insert(k, v);
        }
        sp.options.insert("auto-rdzv", String::new());
        sp.process_env.insert("SLURM_DISTRIBUTION", "arbitrary".into());
        sp.layout = Ok(vec![2, 0]);
        let mut sp = sp.failing(seam);
        let r = local_user_init(&mut sp, &[]);
        // The RPC's failure is logged here; the variable's goes to the guard
        // (one line, success to srun). Either way the step launches in node order.
        match seam {
            "srun_env" => assert!(matches!(&r, Err(HookError::Internal(m)) if m.contains("setenv")), "{r:?}"),
            _ => {
                assert_eq!(r, Ok(()));
                assert!(
                    logged(&sp, "--auto-rdzv: slurm_job_step_layout_get").len() == 1,
                    "{:?}",
                    sp.log.borrow()
                );
            }
        }
        assert_eq!(sp.var(task_plan::layout::TASK_ORDER_VAR), None, "{seam}");
    }
}
