//! The network interface variables for NCCL and gloo.

use super::super::fake::FakeSpank;
use super::*;

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
    use task_plan::netif::{GLOO_VAR, NCCL_VAR};
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
    use task_plan::netif::{GLOO_VAR, NCCL_VAR};
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
    use task_plan::netif::NCCL_VAR;
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
    use task_plan::netif::{GLOO_VAR, NCCL_VAR};
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
