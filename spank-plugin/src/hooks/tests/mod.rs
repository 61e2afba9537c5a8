//! The hooks against the fake SPANK handle: options, the rendezvous and
//! ranks, srun's layout, the batch step; the binding, containers and
//! network interfaces in the submodules.

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
        sp.log.borrow().iter().any(|(_, m)| m.contains("includes ports reserved for services (22000-22000)"))
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
    // ... on the task's stderr, which the user reads (the hook's own failure goes to the slurmd log).
    assert!(
        sp.stderr
            .borrow()
            .iter()
            .any(|l| l.contains("(--auto-rdzv=strict)") && l.contains("--kill-on-bad-exit=1")),
        "{:?}",
        sp.stderr.borrow()
    );
    // ... and it waits a moment before failing, so that the line reaches srun first.
    assert_eq!(sp.paused.get(), std::time::Duration::from_millis(200));
    // A free port fails nothing.
    let mut sp = FakeSpank::task(0, 0, 0);
    sp.options.insert("auto-rdzv", "strict".into());
    assert_eq!(user_init(&mut sp, &[]).unwrap().unwrap().fail_step, None);
}

/// srun for step 77.0 on 2 nodes, with `--auto-rdzv`, `-m arbitrary` and
/// each node's first task.
fn srun_with_layout(first: Result<Vec<u32>, String>) -> FakeSpank {
    let mut sp = FakeSpank::new(Context::Local);
    for (k, v) in [("JobId", 77), ("StepId", 0), ("NNodes", 2)] {
        sp.items.insert(k, v);
    }
    sp.options.insert("auto-rdzv", String::new());
    sp.process_env.insert("SLURM_DISTRIBUTION", "arbitrary".into());
    sp.layout = first;
    sp
}

/// How many of the plugin's log lines contain `needle`.
fn said(sp: &FakeSpank, needle: &str) -> usize {
    sp.log.borrow().iter().filter(|(_, l)| l.contains(needle)).count()
}

#[test]
fn srun_asks_for_the_layout_only_where_task_0_can_be_elsewhere() {
    let srun = |dist: Option<&str>, het: bool, plugin: &str| {
        let mut sp = srun_with_layout(Ok(vec![2, 0]));
        sp.process_env.remove("SLURM_DISTRIBUTION");
        if let Some(d) = dist {
            sp.process_env.insert("SLURM_DISTRIBUTION", d.into());
        }
        if het {
            sp.process_env.insert("SLURM_HET_SIZE", "2".into());
        }
        sp.topology.plugin = plugin.into();
        local_user_init(&mut sp, &[]).unwrap();
        sp
    };
    // The default, block and cyclic layouts under a flat topology: no RPC on any release.
    for dist in [None, Some("block"), Some("cyclic"), Some("plane")] {
        let sp = srun(dist, false, "topology/flat");
        assert_eq!(sp.layout_asked.get(), 0, "{dist:?}");
        assert_eq!(sp.var(layout::TASK_ORDER_VAR), None);
    }
    // -m arbitrary (SLURM_HOSTFILE) and heterogeneous allocations: one RPC.
    for (dist, het) in [(Some("arbitrary"), false), (None, true)] {
        let sp = srun(dist, het, "topology/flat");
        assert_eq!(sp.layout_asked.get(), 1, "{dist:?} {het}");
        assert_eq!(sp.var(layout::TASK_ORDER_VAR), Some("77.0:1,0"));
        assert_eq!(said(&sp, "asking slurmctld for the step's layout"), 1);
    }
    // A tree topology: an RPC only on the releases that lay tasks out by it,
    // and only for block layouts.
    let by_topology = slurm_formats::release::Version::from_number(slurm_sys::VERSION_NUMBER).release
        >= layout::TOPOLOGY_LAYOUT_SINCE;
    assert_eq!(srun(None, false, "topology/tree").layout_asked.get(), u32::from(by_topology));
    assert_eq!(srun(Some("cyclic"), false, "topology/tree").layout_asked.get(), 0);
    // srun's settings cannot be read: ask where topology could matter.
    let mut sp = srun_with_layout(Ok(vec![2, 0])).failing("srun_topology");
    sp.process_env.remove("SLURM_DISTRIBUTION");
    local_user_init(&mut sp, &[]).unwrap();
    assert_eq!(sp.layout_asked.get(), u32::from(by_topology));
}

#[test]
fn srun_tells_the_step_where_task_0_is_only_when_it_is_not_the_first_node() {
    // 26.05's topology order (or -m arbitrary): task 0 on node 1.
    let mut sp = srun_with_layout(Ok(vec![2, 0]));
    local_user_init(&mut sp, &[]).unwrap();
    assert_eq!(sp.var(layout::TASK_ORDER_VAR), Some("77.0:1,0"));
    // Block order, or any layout with task 0 on node 0: nothing to say.
    for first in [vec![0, 2], vec![0, 2, 1]] {
        let mut sp = srun_with_layout(Ok(first));
        local_user_init(&mut sp, &[]).unwrap();
        assert_eq!(sp.var(layout::TASK_ORDER_VAR), None);
    }
    // slurmctld did not answer: one line at info level, node order.
    let mut sp = srun_with_layout(Err("slurm_job_step_layout_get(77.0) failed (Slurm error 2017)".into()));
    local_user_init(&mut sp, &[]).unwrap();
    assert_eq!(sp.var(layout::TASK_ORDER_VAR), None);
    assert!(sp.errors().is_empty());
    assert_eq!(said(&sp, "ranks follow node order"), 1, "{:?}", sp.log.borrow());
    // Without --auto-rdzv, or on one node, no RPC is made.
    let mut sp = srun_with_layout(Ok(vec![2, 0]));
    sp.options.clear();
    local_user_init(&mut sp, &[]).unwrap();
    assert_eq!(sp.var(layout::TASK_ORDER_VAR), None);
    let mut sp = srun_with_layout(Ok(vec![2, 0]));
    sp.items.insert("NNodes", 1);
    local_user_init(&mut sp, &[]).unwrap();
    assert_eq!(sp.var(layout::TASK_ORDER_VAR), None);
}

#[test]
fn with_srun_s_word_task_0_s_node_is_master_addr_and_probes_the_port() {
    // Step 77.0, task 0 on node 1 (node2): node 1's task 0 is RANK 0.
    let task = |node, local, global| {
        let mut sp = FakeSpank::task(node, local, global);
        sp.options.insert("auto-rdzv", String::new());
        sp.env.insert(layout::TASK_ORDER_VAR.into(), "77.0:1,0".into());
        sp.port_taken = Some("held by pid 42 (python)".into());
        sp
    };
    let mut first = task(1, 0, 0);
    let st = user_init(&mut first, &[]).unwrap();
    assert!(st.as_ref().is_some_and(|st| st.note.as_deref().is_some_and(|n| n.contains("on node2"))));
    task_init(&mut first, &[], st.as_ref()).unwrap();
    for (name, want) in [("MASTER_ADDR", "node2"), ("RANK", "0"), ("NODE_RANK", "0")] {
        assert_eq!(first.var(name), Some(want), "{name}");
    }
    // Node 0 does not probe, and its tasks follow Slurm's numbering too.
    let mut other = task(0, 1, 3);
    let st = user_init(&mut other, &[]).unwrap();
    assert!(st.as_ref().is_some_and(|st| st.note.is_none()));
    task_init(&mut other, &[], st.as_ref()).unwrap();
    for (name, want) in [("MASTER_ADDR", "node2"), ("RANK", "3"), ("NODE_RANK", "1")] {
        assert_eq!(other.var(name), Some(want), "{name}");
    }
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
    sp.command = vec!["torchrun".into(), "--rdzv-backend=c10d".into(), "train.py".into()];
    task_init(&mut sp, &[], None).unwrap();
    let port = sp.var("MASTER_PORT").unwrap().to_owned();
    assert_eq!(sp.var("PET_RDZV_ENDPOINT"), Some(format!("node1:{port}").as_str()));
    assert_eq!(sp.var("PET_RDZV_ID"), Some("77.0"));
    assert_eq!(sp.var("JAX_COORDINATOR_PORT"), Some(port.as_str()));

    let mut sp = one_per_node();
    sp.command = vec!["torchrun".into(), "--master_port=29577".into(), "train.py".into()];
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
    assert!(lines[0].starts_with("spank-gpu: task 1 (node1 local 1): set MASTER_ADDR=node1"), "{lines:?}");
    assert!(lines[0].contains("kept MASTER_PORT=29500"), "{lines:?}");
    assert_eq!(sp.var("MASTER_PORT"), Some("29500"));
}

#[test]
fn an_mpi_launchers_daemons_get_no_ranks_and_no_binding() {
    // mpirun's `srun --external-launcher prted` under #SBATCH --auto-rdzv --gpu-affinity.
    let mut sp = FakeSpank::task(1, 0, 1);
    with_topology(&mut sp);
    sp.command = ["/usr/bin/prted", "--prtemca", "ess", "slurm"].map(str::to_owned).to_vec();
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3,4,5,6,7".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.var("MASTER_ADDR"), Some("node1"));
    assert!(sp.var("MASTER_PORT").is_some());
    for name in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "PET_NODE_RANK", "OMP_NUM_THREADS"] {
        assert_eq!(sp.var(name), None, "{name}");
    }
    assert_eq!(sp.mask.to_string(), "0-15", "not bound");
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("prted is an MPI launcher's daemon: not bound"), "{err}");
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
    // Cloud nodes before 23.11: SLURM_NODE_ALIASES first; from 23.11 Slurm
    // sets none, and one in the job's environment is not Slurm's.
    let sp = run(&words, &|sp| {
        sp.env.insert("SLURM_NODE_ALIASES".into(), "node1:10.9.9.9:ip-10-9-9-9".into());
        sp.files.insert("/etc/slurm/slurm.conf".into(), conf.into());
    });
    let want = if nodeaddr::reads_node_aliases(slurm_sys::VERSION_NUMBER) { "10.9.9.9" } else { "10.0.0.1" };
    assert_eq!(sp.var("MASTER_ADDR"), Some(want));
    // Configless: without slurm_conf=, the file slurmd read (its SLURM_CONF,
    // the conf-cache copy), not /etc/slurm/slurm.conf.
    let cache = "/var/spool/slurmd/conf-cache/slurm.conf";
    let sp = run(&args(&["master_addr=addr"]), &|sp| {
        sp.process_env.insert("SLURM_CONF", cache.into());
        sp.files.insert(cache.into(), conf.into());
        sp.env.insert("SLURM_CONF".into(), "/home/user/evil.conf".into());
    });
    assert_eq!(sp.var("MASTER_ADDR"), Some("10.0.0.1"));
    assert!(sp.errors().is_empty(), "{:?}", sp.errors());
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

/// The batch step of `sbatch -N1 --auto-rdzv --wrap ...` (no `-n`): 0 tasks.
fn batch_without_ntasks(auto_rdzv: &str) -> FakeSpank {
    let mut sp = FakeSpank::new(Context::Remote);
    for (k, v) in [
        ("JobId", 91),
        ("StepId", rdzv::BATCH_STEP),
        ("NNodes", 1),
        ("NodeId", 0),
        ("LocalTaskCount", 1),
        ("TotalTaskCount", 0),
        ("StepCpusPerTask", 1),
        ("TaskId", 0),
        ("TaskGlobalId", 0),
    ] {
        sp.items.insert(k, v);
    }
    for (k, v) in [("SLURM_JOB_NODELIST", "node1"), ("SLURM_NNODES", "1"), ("SLURM_NODEID", "0")] {
        sp.env.insert(k.into(), v.into());
    }
    sp.options.insert("auto-rdzv", auto_rdzv.into());
    sp
}

#[test]
fn a_batch_step_without_ntasks_gets_master_addr_and_port() {
    let mut sp = batch_without_ntasks("");
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.var("MASTER_ADDR"), Some("node1"));
    let port: u16 = sp.var("MASTER_PORT").unwrap().parse().unwrap();
    assert!((20000..=29999).contains(&port));
    assert_eq!(sp.var("RANK"), None);
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    assert!(sp.stderr.borrow().is_empty(), "{:?}", sp.stderr.borrow());
}

#[test]
fn the_plugins_own_trouble_is_on_stderr_only_with_verbose() {
    // A step the plugin cannot plan: one log line per node, nothing on
    // the task's stderr unless verbose, and then one line per task.
    for (word, lines) in [("", 0), ("verbose", 1)] {
        let mut sp = batch_without_ntasks(word);
        sp.env.insert("SLURM_JOB_NODELIST".into(), "node[9-1".into());
        let st = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        assert_eq!(sp.var("MASTER_ADDR"), None);
        assert_eq!(sp.errors().len(), 1, "{:?}", sp.errors());
        let err = sp.stderr.borrow().clone();
        assert_eq!(err.len(), lines, "{word}: {err:?}");
        if lines == 1 {
            assert!(err[0].starts_with("spank-gpu: --auto-rdzv: cannot find MASTER_ADDR"), "{err:?}");
            assert!(err[0].ends_with("nothing set for this step"), "{err:?}");
            assert!(!err[0].contains("error"), "{err:?}");
        }
    }
    // No GPU table: the same for --gpu-affinity.
    for (word, lines) in [("", 0), ("verbose", 1)] {
        let mut sp = FakeSpank::task(0, 0, 0);
        sp.options.insert("gpu-affinity", word.into());
        let st = user_init(&mut sp, &[]).unwrap();
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        assert_eq!(sp.errors().len(), 1);
        let err = sp.stderr.borrow().clone();
        assert_eq!(err.len(), lines, "{word}: {err:?}");
        if lines == 1 {
            assert!(err[0].starts_with("spank-gpu: gpu-affinity: no usable GPU table ("), "{err:?}");
            assert!(err[0].ends_with("Slurm's binding kept"), "{err:?}");
        }
    }
}

#[test]
#[should_panic(expected = "debug_panic=task_init")]
fn debug_panic_fires_in_debug_builds() {
    let mut sp = FakeSpank::task(0, 0, 0);
    let _ = task_init(&mut sp, &args(&["debug_panic=task_init"]), None);
}

/// user_init sets the step-wide variables once, before the fork, and local
/// task 0's OMP_NUM_THREADS; each task inherits them and sets only its own
/// (RANK, LOCAL_RANK, the record, and OMP_NUM_THREADS where it differs):
/// here a task in which Slurm would refuse MASTER_ADDR, WORLD_SIZE and
/// OMP_NUM_THREADS still has them, and nothing was refused. A user's export
/// is never set before the fork, and stays the user's.
#[test]
fn step_wide_values_are_set_once_before_the_fork() {
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", String::new());
    sp.env.insert("MASTER_PORT".into(), "4242".into());
    let st = user_init(&mut sp, &[]).unwrap();
    let preset: Vec<&str> = st.as_ref().unwrap().preset.iter().map(|(n, _)| n.as_str()).collect();
    for name in ["MASTER_ADDR", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "JAX_COORDINATOR_ADDRESS"] {
        assert!(preset.contains(&name), "{name} in {preset:?}");
    }
    assert!(preset.contains(&"OMP_NUM_THREADS"), "local task 0's, in {preset:?}");
    for name in ["MASTER_PORT", "RANK", "LOCAL_RANK", rdzv::RECORD_VAR] {
        assert!(!preset.contains(&name), "{name} in {preset:?}");
    }
    assert_eq!(sp.var("WORLD_SIZE"), Some("4"), "in the job's environment before the fork");
    let mut sp =
        sp.failing("setenv:MASTER_ADDR").failing("setenv:WORLD_SIZE").failing("setenv:OMP_NUM_THREADS");
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    for (name, want) in [
        ("MASTER_ADDR", "node1"),
        ("WORLD_SIZE", "4"),
        ("RANK", "1"),
        ("MASTER_PORT", "4242"),
        ("OMP_NUM_THREADS", "4"),
    ] {
        assert_eq!(sp.var(name), Some(want), "{name}");
    }
    // The record names what the plugin set, inherited or not, and not the user's port.
    let record = sp.var(rdzv::RECORD_VAR).unwrap().to_owned();
    assert!(record.contains("MASTER_ADDR:") && record.contains("WORLD_SIZE:"), "{record}");
    assert!(!record.contains("MASTER_PORT:"), "{record}");

    // A task that gets nothing (Slurm cannot say its id) does not keep them either.
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", String::new());
    let st = user_init(&mut sp, &[]).unwrap();
    let mut sp = sp.failing("item:TaskId");
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    for name in ["MASTER_ADDR", "WORLD_SIZE", "NODE_RANK"] {
        assert_eq!(sp.var(name), None, "{name}");
    }
}

mod affinity;
mod containers;
mod explain;
mod jobmap;
mod netif;
mod seams;

pub(super) use affinity::with_topology;
