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
    let by_topology = gpu_core::release::Version::from_number(slurm_sys::VERSION_NUMBER).release
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

/// A 2-domain node: CPUs 0-7 with GPUs 0-3, CPUs 8-15 with GPUs 4-7, its
/// table (version 3, with the machine) where the plugin looks for it.
pub(super) fn with_topology(sp: &mut FakeSpank) {
    with_table(sp, true);
}

/// [`with_topology`]'s node; `machine`: false writes an older agent's
/// table (version 2, no machine records) instead.
pub(super) fn with_table(sp: &mut FakeSpank, machine: bool) {
    use gpu_core::cpuset::CpuSet;
    use gpu_core::gputable::GpuEntry;
    let buses = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"];
    let buses2 = ["0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"];
    let (lo, hi) = (CpuSet::parse("0-7").unwrap(), CpuSet::parse("8-15").unwrap());
    let xml =
        gpu_core::topology::synthetic_xml(&[(lo.clone(), buses.to_vec()), (hi.clone(), buses2.to_vec())]);
    let machine = machine.then(|| hwloc_xml_oracle::from_hwloc_xml(&xml).unwrap());
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
    sp.files.insert(format!("{dir}/gpus.tsv"), GpuTable { gpus, machine }.to_text());
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

/// Issue 31: the plugin reads only the table (no hwloc XML beside it); an
/// older agent's table (version 2, no machine records) still binds, each
/// task to its GPUs' whole local CPUs, and says so.
#[test]
fn an_older_agents_table_binds_degraded_and_says_so() {
    let mut sp = FakeSpank::task(0, 1, 1);
    with_table(&mut sp, false);
    assert!(!sp.files.keys().any(|f| f.ends_with(".xml")));
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "1".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1".into());
    let st = user_init(&mut sp, &[]).unwrap();
    assert!(st.as_ref().and_then(|s| s.topology.as_ref()).is_some_and(|t| t.degraded));
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    // With a v3 table local task 1 gets 4-7 (its half of GPU 1's domain).
    assert_eq!(sp.mask.to_string(), "0-7", "the whole domain, not a share");
    let err = sp.stderr.borrow().join("\n");
    assert!(
        err.contains("NUMA 0 CPUs 0-7 (older agent's GPU table: each task gets its GPUs' whole local CPUs"),
        "{err}"
    );
    let logs = sp.log.borrow().iter().map(|(_, l)| l.clone()).collect::<Vec<_>>().join("\n");
    assert!(logs.contains("no machine records") && logs.contains("topology --write"), "{logs}");
    // The version 3 table of the same node: a share, nothing said.
    let sp = bound(1, "1", "0,1", &[]);
    assert_eq!(sp.mask.to_string(), "4-7");
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

/// `--ntasks-per-node=N --gpus-per-node=8 --gpu-affinity --auto-rdzv`: every
/// task sees the node's 8 GPUs and is bound to its share by local rank; its
/// OMP_NUM_THREADS divides its bound CPUs by the GPUs of that share, not by
/// the 8 it sees (which gave 1). Without the binding nothing changes.
fn sees_every_gpu(local: u32, local_tasks: u32, affinity: bool) -> FakeSpank {
    let all = "0,1,2,3,4,5,6,7";
    let mut sp = FakeSpank::task(0, local, local);
    with_topology(&mut sp);
    sp.items.insert("LocalTaskCount", local_tasks);
    sp.items.insert("TotalTaskCount", 2 * local_tasks);
    if affinity {
        sp.options.insert("gpu-affinity", String::new());
    }
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), all.into());
    sp.env.insert("SLURM_STEP_GPUS".into(), all.into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    sp
}

#[test]
fn omp_threads_count_the_share_of_the_gpus_a_task_was_bound_to() {
    // 2 tasks: GPUs 0-3 (CPUs 0-7) and 4-7 (8-15), 8 CPUs / 4 GPUs each.
    for (local, mask) in [(0, "0-7"), (1, "8-15")] {
        let sp = sees_every_gpu(local, 2, true);
        assert_eq!(sp.mask.to_string(), mask, "task {local}");
        assert_eq!(sp.var("OMP_NUM_THREADS"), Some("2"), "task {local}");
        // Several tasks per node: no torchrun variables, the GPUs seen unchanged elsewhere.
        assert_eq!(sp.var("PET_NPROC_PER_NODE"), None, "task {local}");
        assert_eq!(sp.var("LOCAL_WORLD_SIZE"), Some("2"), "task {local}");
        let record = sp.var(rdzv::RECORD_VAR).unwrap();
        assert!(record.split(',').any(|i| i == "gpu_share=4"), "{record}");
        let err = sp.stderr.borrow().join("\n");
        assert!(
            err.contains("OMP_NUM_THREADS=2 (8 bound CPUs / 4 GPUs (this task's share of the 8 it sees))"),
            "{err}"
        );
    }
    // 8 tasks (GPU LOCAL_RANK each): every task uses all of its bound CPUs.
    for local in 0..8 {
        let sp = sees_every_gpu(local, 8, true);
        assert_eq!(sp.mask.len(), 2, "task {local}: {}", sp.mask);
        assert_eq!(sp.var("OMP_NUM_THREADS"), Some("2"), "task {local}");
        let err = sp.stderr.borrow().join("\n");
        assert!(
            err.contains("OMP_NUM_THREADS=2 (2 bound CPUs / 1 GPU (this task's share of the 8 it sees))"),
            "{err}"
        );
    }
    // One task per node (torchrun) has every GPU it sees: one process per GPU.
    let sp = sees_every_gpu(0, 1, true);
    assert_eq!(sp.var("PET_NPROC_PER_NODE"), Some("8"));
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("2"), "16 bound CPUs / 8 GPUs");
    // Not bound by the plugin: the GPUs it sees, as before (4 CPUs per task / 8).
    let sp = sees_every_gpu(1, 2, false);
    assert_eq!(sp.mask.to_string(), "0-15");
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("1"));
    assert!(sp.var(rdzv::RECORD_VAR).is_some_and(|r| !r.contains("gpu_share")));
    // The user's --cpu-bind: Slurm's binding and the old count kept.
    let mut sp = FakeSpank::task(0, 1, 1);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.options.insert("auto-rdzv", String::new());
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3,4,5,6,7".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,1,2,3,4,5,6,7".into());
    sp.env.insert("SLURM_CPU_BIND_TYPE".into(), "cores".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "0-15");
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("1"));
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
fn under_a_device_constraint_the_task_binds_to_the_gpu_its_cgroup_has() {
    use gpu_core::devices::Access;
    // `--gpus-per-task=1` on GPUs 0 and 5 under ConstrainDevices (23.11+):
    // both tasks are told local GPU 0; task 1's device cgroup has GPU 5.
    for (local, real, want) in [(0u32, 0u32, "0-7"), (1, 5, "8-15")] {
        let mut sp = FakeSpank::task(0, local, local);
        with_topology(&mut sp);
        sp.options.insert("gpu-affinity", "verbose".into());
        sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
        let words = args(&["debug_dev_dir=/lab/cdev"]);
        let st = user_init(&mut sp, &words).unwrap();
        for (k, v) in [("SLURM_STEP_GPUS", "0"), ("CUDA_VISIBLE_DEVICES", "0")] {
            sp.env.insert(k.into(), v.into());
        }
        sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1+gres/nic:closest".into());
        for m in 0..8 {
            let access = if m == real { Access::Allowed } else { Access::Denied };
            sp.devices.insert(format!("/lab/cdev/nvidia{m}"), access);
        }
        task_init(&mut sp, &words, st.as_ref()).unwrap();
        assert_eq!(sp.mask.to_string(), want, "task {local}");
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains(&format!("GPUs {real} (")) && err.contains(") [device cgroup] NUMA"), "{err}");
    }
    // A probe that cannot tell (no such files): the variables are used.
    let mut sp = FakeSpank::task(0, 0, 0);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.env.insert("SLURM_STEP_GPUS".into(), "4,5".into());
    let st = user_init(&mut sp, &[]).unwrap();
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "4".into());
    sp.devices.insert("/dev/nvidia0".into(), Access::Denied);
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "8-11");
}

/// Task `local` of a `--gpus-per-task=1` step on GPUs 0 and 5 under
/// ConstrainDevices (every task is told local GPU 0; from 23.11 gres.conf
/// `Cores=` may give task 0 GPU 5), its device cgroup allowing GPU `real`
/// only, run in pyxis's container: by
/// `task_init` the task is in the container's mount namespace, whose `/dev`
/// holds only its own GPU's file. With `fail`, that seam fails.
fn in_a_container(local: u32, real: u32, fail: &str) -> FakeSpank {
    use gpu_core::devices::Access;
    let mut sp = FakeSpank::task(0, local, local);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", "verbose".into());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
    for m in 0..8 {
        let access = if m == real { Access::Allowed } else { Access::Denied };
        sp.devices.insert(format!("/dev/nvidia{m}"), access);
    }
    let mut sp = sp.failing(fail);
    // user_init: slurmstepd, before the fork, in the host's mount namespace.
    let st = user_init(&mut sp, &[]).unwrap();
    // The forked task: Slurm's per-task variables, then pyxis's setns.
    for (k, v) in [("SLURM_STEP_GPUS", "0"), ("CUDA_VISIBLE_DEVICES", "0")] {
        sp.env.insert(k.into(), v.into());
    }
    sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1".into());
    sp.container_devices = Some([(format!("/dev/nvidia{real}"), Access::Allowed)].into());
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    sp
}

#[test]
fn in_a_container_the_device_directory_opened_before_the_fork_says_the_tasks_gpu() {
    for (local, real, want) in [(0u32, 5u32, "8-15"), (1, 0, "0-7")] {
        let sp = in_a_container(local, real, "nothing");
        // A path looked up in the container's /dev cannot tell the other GPUs.
        let by_path = sp.device_access(&gpu_core::devices::device_path("/dev", 1));
        assert_eq!(by_path, gpu_core::devices::Access::Unknown);
        assert_eq!(sp.mask.to_string(), want, "task {local}: bound to its own GPU's CPUs");
        let err = sp.stderr.borrow().join("\n");
        assert!(err.contains(&format!("GPUs {real} (")) && err.contains(") [device cgroup] NUMA"), "{err}");
        assert!(sp.log.borrow().is_empty(), "nothing logged when the directory opens: {:?}", sp.log.borrow());
    }
}

#[test]
fn without_the_device_directory_the_task_probes_by_path() {
    use gpu_core::devices::Access;
    // Not in a container: the path probe finds the host's files, and the
    // task still binds to its own GPU (GPU 5, domain 1).
    let mut sp = FakeSpank::task(0, 1, 1);
    with_topology(&mut sp);
    sp.options.insert("gpu-affinity", String::new());
    sp.env.insert("SLURM_STEP_GPUS".into(), "0,5".into());
    for m in 0..8 {
        sp.devices.insert(format!("/dev/nvidia{m}"), if m == 5 { Access::Allowed } else { Access::Denied });
    }
    let mut sp = sp.failing("open_dev_dir");
    let st = user_init(&mut sp, &[]).unwrap();
    assert_eq!(st.as_ref().and_then(|s| s.dev_dir.as_ref()), None);
    sp.env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
    sp.env.insert("SLURMD_TRES_BIND".into(), "gres/gpu:per_task:1".into());
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.mask.to_string(), "8-15");
    // One debug line, in user_init (once per step), never an error.
    let log = sp.log.borrow().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, Level::Debug, "{log:?}");
    assert!(log[0].1.starts_with("--gpu-affinity: opening the device directory: /dev: "), "{log:?}");
    assert!(log[0].1.ends_with("; tasks probe by path"), "{log:?}");

    // In a container the path cannot tell: the variables are used, and
    // task 0 (GPU 5, told local GPU 0) gets GPU 0's CPUs, what the directory
    // opened before the fork avoids. Nothing fails: the step runs.
    let sp = in_a_container(0, 5, "open_dev_dir");
    assert_eq!(sp.mask.to_string(), "0-7");
    assert!(!sp.stderr.borrow().join("\n").contains("[device cgroup]"), "{:?}", sp.stderr.borrow());
    assert!(sp.errors().is_empty(), "{:?}", sp.errors());
}

#[test]
fn the_device_directory_is_opened_once_per_step_with_gpu_affinity_only() {
    let step = |affinity: bool| {
        let mut sp = FakeSpank::task(0, 0, 0);
        with_topology(&mut sp);
        if affinity {
            sp.options.insert("gpu-affinity", String::new());
        }
        user_init(&mut sp, &args(&["debug_dev_dir=/lab/cdev"])).unwrap().unwrap()
    };
    assert_eq!(step(true).dev_dir.as_deref(), Some("/lab/cdev"), "the plugstack line's directory");
    assert_eq!(step(false).dev_dir, None, "nothing to probe without --gpu-affinity");
    // Without a GPU table nothing is bound, and nothing is opened.
    let mut sp = FakeSpank::task(0, 0, 0);
    sp.options.insert("gpu-affinity", String::new());
    assert_eq!(user_init(&mut sp, &[]).unwrap().unwrap().dev_dir, None);
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

/// pyxis listed before spank_gpu: between user_init and task_init pyxis copies
/// a PyTorch image's environment (with enroot's hook on) over the task's and
/// sets RANK=SLURM_PROCID. The plugin recomputes those values, names who set
/// them, and gives back the user's own export the import overwrote.
#[test]
fn values_a_container_set_after_the_fork_are_recomputed_and_named() {
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    for (k, v) in [("SLURM_JOB_ID", "77"), ("SLURM_NTASKS", "4"), ("SLURM_STEP_NUM_TASKS", "4")] {
        sp.env.insert(k.into(), v.into());
    }
    sp.env.insert("SLURM_STEP_NUM_NODES".into(), "2".into());
    // The user's own export, before the fork.
    sp.env.insert("OMP_NUM_THREADS".into(), "6".into());
    let st = user_init(&mut sp, &[]).unwrap();
    // A plain run of the same task: the plugin's own values.
    let mut plain = FakeSpank::task(0, 1, 1);
    plain.options.insert("auto-rdzv", String::new());
    task_init(&mut plain, &[], None).unwrap();
    let mine = plain.var("MASTER_PORT").unwrap().to_owned();
    assert_ne!(mine, "61077");
    // pyxis's import and remap.
    sp.env.insert("SLURM_PROCID".into(), "1".into());
    sp.env.insert("SLURM_LOCALID".into(), "1".into());
    for (k, v) in [
        ("PYTORCH_VERSION", "2.5.0"),
        ("MASTER_ADDR", "node1"),
        ("MASTER_PORT", "61077"),
        ("WORLD_SIZE", "4"),
        ("OMP_NUM_THREADS", "1"),
        ("RANK", "1"),
        ("LOCAL_RANK", "1"),
    ] {
        sp.env.insert(k.into(), v.into());
    }
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert_eq!(sp.var("MASTER_PORT"), Some(mine.as_str()));
    assert_eq!(sp.var("OMP_NUM_THREADS"), Some("6"), "the user's export wins again");
    assert_eq!(sp.var("RANK"), Some("1"));
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains(&format!("MASTER_PORT={mine} (job 77 step 0")), "{err}");
    assert!(err.contains("replaced MASTER_PORT=61077 (enroot's PyTorch hook)"), "{err}");
    // The hook's MASTER_ADDR is the value user_init set before the fork: nothing was replaced.
    assert!(!err.contains("replaced MASTER_ADDR"), "{err}");
    assert!(err.contains("RANK=1 (pyxis for a PyTorch image)"), "{err}");
    assert!(err.contains("OMP_NUM_THREADS=6 (set by you"), "{err}");
    assert!(!err.contains("MASTER_PORT=61077 (set by you"), "{err}");

    // Without a snapshot (the plugin before pyxis, or no container) nothing is replaced.
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert!(!sp.stderr.borrow().join("\n").contains("replaced"));
}

/// Task `local` (global `local`) on node 1 with `--auto-rdzv=verbose`, given
/// pyxis's options (`pyxis`), through user_init and task_init; `between`
/// runs between the two (pyxis's task_init, when pyxis is listed first).
fn with_pyxis(local: u32, pyxis: &[(&'static str, &str)], between: impl FnOnce(&mut FakeSpank)) -> FakeSpank {
    let mut sp = FakeSpank::task(0, local, local);
    sp.options.insert("auto-rdzv", "verbose".into());
    for (name, value) in pyxis {
        sp.foreign_options.insert(name, (*value).to_owned());
    }
    let st = user_init(&mut sp, &[]).unwrap();
    between(&mut sp);
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    sp
}

/// The variables the plugin sets for task `local` without pyxis.
fn plain_values(local: u32) -> Vec<(String, String)> {
    values(&with_pyxis(local, &[], |_| {}))
}

/// The task's environment after task_init, pyxis's own variables aside.
fn values(sp: &FakeSpank) -> Vec<(String, String)> {
    sp.env.iter().filter(|(k, _)| !k.starts_with("PYXIS_")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

const IMAGE: (&str, &str) = ("container-image", "nvcr.io#nvidia/pytorch:24.05-py3");

#[test]
fn spank_gpu_before_pyxis_says_the_container_may_replace_its_values() {
    for local in [0, 1] {
        let sp = with_pyxis(local, &[IMAGE], |_| {});
        assert_eq!(values(&sp), plain_values(local), "task {local}: what is set does not change");
        let err = sp.stderr.borrow().clone();
        // The task's line, and the first task's network line.
        assert_eq!(err.len(), if local == 0 { 2 } else { 1 }, "{err:?}");
        assert!(err[1..].iter().all(|l| l.starts_with("spank-gpu: network on node1: ")), "{err:?}");
        assert!(
            err[0].starts_with(&format!(
                "spank-gpu: task {local} (node1 local {local}): set MASTER_ADDR=node1"
            ))
        );
        assert!(
            err[0].contains(
                "; pyxis runs after spank-gpu here (plugstack.conf lists spank_gpu first): inside the container, \
                 the container's value replaces any of MASTER_ADDR MASTER_PORT RANK"
            ),
            "{err:?}"
        );
        assert!(
            err[0].contains("for a PyTorch image pyxis sets RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID")
        );
        assert!(err[0].contains("or pass --container-env=MASTER_ADDR,MASTER_PORT,RANK,"), "{err:?}");
        // One line per step and node, from its first task, at the plugin's warning level.
        let log = sp.log.borrow().clone();
        if local == 0 {
            assert_eq!(log.len(), 1, "{log:?}");
            assert_eq!(log[0].0, Level::Error);
            assert!(log[0].1.starts_with(
                "--auto-rdzv: step 77.0 runs in a pyxis container and pyxis runs after spank_gpu"
            ));
        } else {
            assert!(log.is_empty(), "{log:?}");
        }
    }
    // pyxis's variables stand for its options; --container-env's names are kept by pyxis.
    let mut sp = FakeSpank::task(0, 1, 1);
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.env.insert("PYXIS_CONTAINER_NAME".into(), "mine".into());
    sp.env.insert("PYXIS_CONTAINER_ENV".into(), "MASTER_ADDR,MASTER_PORT".into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("replaces any of RANK WORLD_SIZE"), "{err}");
    assert!(err.contains("--container-env=MASTER_ADDR,MASTER_PORT,RANK,WORLD_SIZE,"), "{err}");
}

#[test]
fn pyxis_before_spank_gpu_moves_the_task_and_nothing_more_is_said() {
    use super::fake::CONTAINER_MOUNT_NS;
    for local in [0, 1] {
        // pyxis's task_init first: setns into the container's mount namespace.
        let sp = with_pyxis(local, &[IMAGE], |sp| sp.mount_ns = CONTAINER_MOUNT_NS);
        assert_eq!(values(&sp), plain_values(local), "task {local}");
        let err = sp.stderr.borrow().join("\n");
        assert!(!err.contains("pyxis runs after"), "{err}");
        assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    }
}

#[test]
fn without_a_pyxis_container_the_mount_namespace_is_not_read() {
    for local in [0, 1] {
        let mut sp = FakeSpank::task(0, local, local);
        sp.options.insert("auto-rdzv", "verbose".into());
        // Options of pyxis's that start no container.
        sp.foreign_options.insert("container-env", "MASTER_PORT".into());
        sp.foreign_options.insert("container-mounts", "/data:/data".into());
        let mut sp = sp.failing("mount_ns");
        let st = user_init(&mut sp, &[]).unwrap();
        assert_eq!(st.as_ref().map(|s| (s.pyxis.is_none(), s.mount_ns)), Some((true, None)));
        task_init(&mut sp, &[], st.as_ref()).unwrap();
        assert_eq!(values(&sp), plain_values(local));
        assert!(!sp.stderr.borrow().join("\n").contains("pyxis"), "{:?}", sp.stderr.borrow());
        assert!(sp.log.borrow().is_empty(), "never read, nothing logged: {:?}", sp.log.borrow());
    }
}

#[test]
fn an_unreadable_mount_namespace_cannot_tell_and_says_nothing() {
    // Unreadable in user_init (then not read again), or in the task only.
    for in_task_only in [false, true] {
        let sp = if in_task_only {
            with_pyxis(0, &[IMAGE], |sp| {
                sp.fail.insert("mount_ns".into());
            })
        } else {
            let mut sp = FakeSpank::task(0, 0, 0).failing("mount_ns");
            sp.options.insert("auto-rdzv", "verbose".into());
            sp.foreign_options.insert(IMAGE.0, IMAGE.1.into());
            let st = user_init(&mut sp, &[]).unwrap();
            assert_eq!(st.as_ref().map(|s| (s.pyxis.is_some(), s.mount_ns)), Some((true, None)));
            task_init(&mut sp, &[], st.as_ref()).unwrap();
            sp
        };
        assert_eq!(values(&sp), plain_values(0), "in the task only: {in_task_only}");
        assert!(!sp.stderr.borrow().join("\n").contains("pyxis"), "{:?}", sp.stderr.borrow());
        assert!(sp.errors().is_empty(), "{:?}", sp.log.borrow());
        let log = sp.log.borrow().clone();
        assert_eq!(log.len(), 1, "one debug line: {log:?}");
        assert_eq!(log[0].0, Level::Debug);
        assert!(log[0].1.contains("cannot tell whether pyxis runs after spank-gpu"), "{log:?}");
    }
    // pyxis's option unreadable: not given, one debug line.
    let mut sp = FakeSpank::task(0, 0, 0).failing("foreign_option:container-image");
    sp.options.insert("auto-rdzv", "verbose".into());
    sp.foreign_options.insert(IMAGE.0, IMAGE.1.into());
    let st = user_init(&mut sp, &[]).unwrap();
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert!(!sp.stderr.borrow().join("\n").contains("pyxis runs after"));
    let log = sp.log.borrow().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, Level::Debug);
    assert!(log[0].1.starts_with("--auto-rdzv: reading pyxis's options: --container-image: "), "{log:?}");
}

/// A task of the 2-node step with `--auto-rdzv=verbose` on a node with these
/// interfaces, named `host`.
fn on_node(node: u32, local: u32, host: &str, ifaces: &[&str]) -> FakeSpank {
    let mut sp = FakeSpank::task(node, local, node * 2 + local);
    sp.interfaces = super::fake::fake_node(ifaces);
    sp.sysctls.insert("kernel/hostname", format!("{host}\n"));
    sp.options.insert("auto-rdzv", "verbose".into());
    sp
}

/// node1: the management NIC first, the RoCE port, Docker's bridge, a port that is down.
const NODE1: [&str; 5] = [
    "lo URL 127.0.0.1/8",
    "eth0 UR 10.0.0.1/24",
    "ens1f0np0 UR 10.100.3.1/16",
    "docker0 UR 172.17.0.1/16",
    "ens1f1np1 U 10.100.9.1/16",
];
/// node2 names its two fabric ports otherwise.
const NODE2: [&str; 4] =
    ["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.2/24", "enp65s0 UR 10.100.4.2/16", "enp66s0 UR 10.100.5.2/16"];
/// A node off the fabric.
const OFF: [&str; 2] = ["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.3/24"];

const NET: &str = "nccl_socket_net=10.100.0.0/16";

fn run_task(sp: &mut FakeSpank, words: &[&str]) {
    let args = args(words);
    let st = user_init(sp, &args).unwrap();
    task_init(sp, &args, st.as_ref()).unwrap();
}

#[test]
fn nccl_socket_net_sets_each_nodes_own_names() {
    use gpu_core::netif::{GLOO_VAR, NCCL_VAR};
    let mut sp = on_node(0, 0, "node1", &NODE1);
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (Some("=ens1f0np0"), Some("ens1f0np0")));
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    let err = sp.stderr.borrow().clone();
    assert!(
        err[0].contains(
            " NCCL_SOCKET_IFNAME==ens1f0np0 (nccl_socket_net=10.100.0.0/16 on this node) \
             GLOO_SOCKET_IFNAME=ens1f0np0 (nccl_socket_net=10.100.0.0/16 on this node)"
        ),
        "{err:?}"
    );
    let record = sp.var(rdzv::RECORD_VAR).unwrap();
    assert!(record.contains("NCCL_SOCKET_IFNAME:") && record.contains("GLOO_SOCKET_IFNAME:"), "{record}");
    // node2's own names; a node off the fabric gets neither, and one log line.
    let mut sp = on_node(1, 0, "node2", &NODE2);
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (Some("=enp65s0,enp66s0"), Some("enp65s0")));
    let mut sp = on_node(1, 1, "node2", &OFF);
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (None, None));
    assert_eq!(sp.var("MASTER_ADDR"), Some("node1"), "the rest is set");
    assert_eq!(
        sp.errors(),
        ["--auto-rdzv: nccl_socket_net=10.100.0.0/16: no running interface of node2 has an address in it \
          (node2 has eth0 10.0.0.3/24); NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME not set here: NCCL and gloo \
          choose"]
    );
    // Never a transport choice of its own.
    for name in ["NCCL_COMM_ID", "NCCL_IB_HCA", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_SOCKET_FAMILY"] {
        assert_eq!(sp.var(name), None, "{name}");
    }
}

#[test]
fn the_users_values_and_nccls_files_win() {
    use gpu_core::netif::{GLOO_VAR, NCCL_VAR};
    // The user's NCCL_SOCKET_IFNAME is kept; gloo's gap is still filled.
    let mut sp = on_node(0, 0, "node1", &NODE1);
    sp.env.insert(NCCL_VAR.into(), "eth0".into());
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (Some("eth0"), Some("ens1f0np0")));
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("kept NCCL_SOCKET_IFNAME=eth0 (set by you; mine: =ens1f0np0)"), "{err}");
    assert!(err.contains(
        "NCCL bootstrap eth0:10.0.0.1, sockets eth0:10.0.0.1 (NCCL_SOCKET_IFNAME=eth0, set by you)"
    ));
    // NCCL_CONF_FILE, /etc/nccl.conf or ~/.nccl.conf decide: neither is set.
    let mut sp = on_node(0, 1, "node1", &NODE1);
    sp.env.insert("NCCL_CONF_FILE".into(), "/home/u/nccl.conf".into());
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (None, None));
    assert!(sp.user_reads.borrow().is_empty(), "NCCL does not read ~/.nccl.conf then");
    let mut sp = on_node(0, 0, "node1", &NODE1);
    sp.files.insert("/etc/nccl.conf".into(), "NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=eth0\n".into());
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (None, None));
    let err = sp.stderr.borrow().join("\n");
    assert!(err.contains("(NCCL_SOCKET_IFNAME=eth0, /etc/nccl.conf)"), "{err}");
    let mut sp = on_node(0, 0, "node1", &NODE1);
    sp.user_files.insert("/home/u/.nccl.conf".into(), "NCCL_SOCKET_IFNAME==ens1f0np0\n".into());
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (None, None));
    // Read once, from the job's user's passwd home (not $HOME), by the task.
    assert_eq!(*sp.user_reads.borrow(), ["/home/u/.nccl.conf"]);
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    let mut sp = on_node(0, 0, "node1", &NODE1);
    sp.env.insert("HOME".into(), "/tmp/evil".into());
    run_task(&mut sp, &[NET]);
    assert_eq!(*sp.user_reads.borrow(), ["/home/u/.nccl.conf"], "never $HOME");
    assert_eq!(sp.var(NCCL_VAR), Some("=ens1f0np0"), "no ~/.nccl.conf: set");
}

#[test]
fn a_site_interface_name_is_set_only_where_the_node_has_it() {
    use gpu_core::netif::NCCL_VAR;
    let ib = ["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.1/24", "ib0 UR 10.100.3.1/16"];
    let mut sp = on_node(0, 0, "node1", &ib);
    run_task(&mut sp, &["nccl_socket_ifname=ib0"]);
    assert_eq!(sp.var(NCCL_VAR), Some("ib0"));
    assert!(sp.stderr.borrow()[0].contains(" NCCL_SOCKET_IFNAME=ib0 (site default)"));
    for local in [0, 1] {
        let mut sp = on_node(1, local, "node2", &NODE2);
        run_task(&mut sp, &["nccl_socket_ifname=ib0", "NCCL_DEBUG=WARN"]);
        assert_eq!(sp.var(NCCL_VAR), None);
        assert_eq!(sp.var("NCCL_DEBUG"), Some("WARN"), "other site defaults apply");
        let errors = sp.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "--auto-rdzv: NCCL_SOCKET_IFNAME=ib0 (the plugstack line's) matches no running interface of node2"
            ),
            "{errors:?}"
        );
    }
}

#[test]
fn a_value_another_nodes_step_set_is_removed() {
    use gpu_core::netif::{GLOO_VAR, NCCL_VAR};
    // The batch step ran on node1 and set node1's names; its srun step's task runs off the fabric.
    let mut batch = on_node(0, 0, "node1", &NODE1);
    run_task(&mut batch, &[NET]);
    let mut sp = on_node(1, 0, "node2", &OFF);
    for name in [NCCL_VAR, GLOO_VAR, rdzv::RECORD_VAR] {
        sp.env.insert(name.into(), batch.var(name).unwrap().into());
    }
    run_task(&mut sp, &[NET]);
    assert_eq!((sp.var(NCCL_VAR), sp.var(GLOO_VAR)), (None, None));
    // node2 on the fabric: its own names.
    let mut sp = on_node(1, 0, "node2", &NODE2);
    for name in [NCCL_VAR, GLOO_VAR, rdzv::RECORD_VAR] {
        sp.env.insert(name.into(), batch.var(name).unwrap().into());
    }
    run_task(&mut sp, &[NET]);
    assert_eq!(sp.var(NCCL_VAR), Some("=enp65s0,enp66s0"));
}

#[test]
fn verbose_says_once_per_node_what_nccl_and_gloo_use() {
    let mut sp = on_node(0, 0, "node1", &NODE1);
    sp.files.insert("/etc/hosts".into(), "127.0.0.1 localhost\n127.0.1.1 node1.cluster node1\n".into());
    sp.sysctls.insert("kernel/hostname", "node1.cluster\n".into());
    run_task(&mut sp, &[]);
    let err = sp.stderr.borrow().clone();
    assert_eq!(err.len(), 2, "{err:?}");
    assert_eq!(
        err[1],
        "spank-gpu: network on node1: NCCL bootstrap eth0:10.0.0.1, sockets eth0:10.0.0.1 ens1f0np0:10.100.3.1 \
         (NCCL_SOCKET_IFNAME unset; NCCL's default: the first interface that is not docker*, lo or virbr*); \
         gloo 127.0.1.1 (GLOO_SOCKET_IFNAME unset: /etc/hosts gives node1.cluster 127.0.1.1); WARNING: \
         /etc/hosts maps node1.cluster to 127.0.1.1, a loopback address: gloo (GLOO_SOCKET_IFNAME unset) binds it \
         and ranks on other nodes cannot connect; set GLOO_SOCKET_IFNAME=eth0; NCCL_DEBUG=INFO prints \
         \"NCCL INFO Bootstrap: Using eth0:10.0.0.1<0>\""
    );
    // With nccl_socket_net, what it set.
    let mut sp = on_node(0, 0, "node1", &NODE1);
    run_task(&mut sp, &[NET]);
    let line = sp.stderr.borrow()[1].clone();
    assert!(
        line.starts_with(
            "spank-gpu: network on node1: NCCL bootstrap ens1f0np0:10.100.3.1, sockets ens1f0np0:10.100.3.1 \
             (NCCL_SOCKET_IFNAME==ens1f0np0, set by spank-gpu: nccl_socket_net=10.100.0.0/16 on this node); \
             gloo ens1f0np0:10.100.3.1 (GLOO_SOCKET_IFNAME=ens1f0np0, set by spank-gpu:"
        ),
        "{line}"
    );
    // The node's other tasks: their own line only. Without verbose: nothing read.
    let mut sp = on_node(0, 1, "node1", &NODE1);
    run_task(&mut sp, &[]);
    assert_eq!(sp.stderr.borrow().len(), 1);
    let mut sp = on_node(0, 0, "node1", &NODE1);
    sp.options.insert("auto-rdzv", String::new());
    let mut sp = sp.failing("interfaces");
    run_task(&mut sp, &[]);
    assert!(sp.log.borrow().is_empty() && sp.stderr.borrow().is_empty(), "not asked: not read");
}

/// user_init sets the step-wide variables once, before the fork; each task
/// inherits them and sets only its own (RANK, LOCAL_RANK, OMP_NUM_THREADS,
/// the record): here a task in which Slurm would refuse MASTER_ADDR and
/// WORLD_SIZE still has them, and nothing was refused. A user's export is
/// never set before the fork, and stays the user's.
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
    for name in ["MASTER_PORT", "RANK", "LOCAL_RANK", "OMP_NUM_THREADS", rdzv::RECORD_VAR] {
        assert!(!preset.contains(&name), "{name} in {preset:?}");
    }
    assert_eq!(sp.var("WORLD_SIZE"), Some("4"), "in the job's environment before the fork");
    let mut sp = sp.failing("setenv:MASTER_ADDR").failing("setenv:WORLD_SIZE");
    task_init(&mut sp, &[], st.as_ref()).unwrap();
    assert!(sp.log.borrow().is_empty(), "{:?}", sp.log.borrow());
    for (name, want) in
        [("MASTER_ADDR", "node1"), ("WORLD_SIZE", "4"), ("RANK", "1"), ("MASTER_PORT", "4242")]
    {
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
