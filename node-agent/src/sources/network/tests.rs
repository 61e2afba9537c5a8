use std::collections::BTreeMap;
use std::fs;
use std::net::IpAddr;
use std::path::Path;

use task_plan::netif::parse_nets;

use super::*;

fn iface(spec: &str) -> Interface {
    task_plan::netif::fixture(spec)
}

/// A stand-in node: its interfaces, sysfs's answers per interface, and the
/// calls that fail (`interfaces`, `speed:IF`, `numa_node:IF`, `rdma:IF`).
#[derive(Default)]
struct FakeNode {
    ifaces: Vec<Interface>,
    speed: BTreeMap<String, u32>,
    numa: BTreeMap<String, u32>,
    rdma: BTreeMap<String, Vec<String>>,
    failing: Vec<String>,
}

impl FakeNode {
    fn new(specs: &[&str]) -> FakeNode {
        FakeNode { ifaces: specs.iter().map(|s| iface(s)).collect(), ..FakeNode::default() }
    }

    fn sys(mut self, name: &str, speed: Option<u32>, numa: Option<u32>, rdma: &[&str]) -> FakeNode {
        if let Some(s) = speed {
            self.speed.insert(name.to_owned(), s);
        }
        if let Some(n) = numa {
            self.numa.insert(name.to_owned(), n);
        }
        self.rdma.insert(name.to_owned(), rdma.iter().map(|r| (*r).to_owned()).collect());
        self
    }

    fn failing(mut self, call: &str) -> FakeNode {
        self.failing.push(call.to_owned());
        self
    }

    fn fails(&self, call: &str) -> io::Result<()> {
        if self.failing.iter().any(|f| f == call) {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{call}: denied by the test")))
        } else {
            Ok(())
        }
    }
}

impl NodeNet for FakeNode {
    fn interfaces(&self) -> io::Result<Vec<Interface>> {
        self.fails("interfaces")?;
        Ok(self.ifaces.clone())
    }

    fn speed(&self, name: &str) -> io::Result<Option<u32>> {
        self.fails(&format!("speed:{name}"))?;
        Ok(self.speed.get(name).copied())
    }

    fn numa_node(&self, name: &str) -> io::Result<Option<u32>> {
        self.fails(&format!("numa_node:{name}"))?;
        Ok(self.numa.get(name).copied())
    }

    fn rdma_devices(&self, name: &str) -> io::Result<Vec<String>> {
        self.fails(&format!("rdma:{name}"))?;
        Ok(self.rdma.get(name).cloned().unwrap_or_default())
    }
}

/// node1: the management NIC made first, IPoIB on the fabric, Docker's
/// bridge without carrier, a second IB port down that has a fabric address.
fn node1() -> FakeNode {
    FakeNode::new(&[
        "lo URL 127.0.0.1/8 ::1/128",
        "eth0 UR 10.0.0.5/24 fe80::5/64",
        "ib0 UR 10.1.0.7/16 fe80::7/64",
        "docker0 U 172.17.0.1/16",
        "ib1 - 10.1.0.8/16",
    ])
    .sys("eth0", Some(1000), Some(0), &[])
    .sys("ib0", Some(200_000), Some(1), &["mlx5_0"])
    .sys("ib1", None, Some(1), &["mlx5_1"])
}

/// node2: other names, a RoCE NIC on the same fabric, the management NIC first.
fn node2() -> FakeNode {
    FakeNode::new(&[
        "lo URL 127.0.0.1/8",
        "eno1 UR 10.0.0.6/24",
        "ens1f0np0 UR 10.1.3.5/16",
        "ens2f0 UR 192.168.50.6/24",
    ])
    .sys("eno1", Some(25_000), None, &[])
    .sys("ens1f0np0", Some(400_000), Some(1), &["mlx5_2"])
}

fn nets(v: &str) -> Fabric {
    Fabric::Nets(parse_nets(v).unwrap())
}

fn status(node: &FakeNode, fabric: Fabric) -> String {
    status_text(&gather(node, fabric))
}

#[test]
fn status_lists_every_interface_and_where_the_fabric_is() {
    let text = status(&node1(), nets("10.1.0.0/16"));
    println!("{text}");
    let want = "\
network: interfaces (getifaddrs; speed, RDMA device and NUMA node from /sys/class/net):
  IF       STATE       SPEED     RDMA    NUMA  ADDRESSES
  lo       running     -         -       -     127.0.0.1/8 ::1/128
  eth0     running     1 Gb/s    -       0     10.0.0.5/24 fe80::5/64
  ib0      running     200 Gb/s  mlx5_0  1     10.1.0.7/16 fe80::7/64
  docker0  no-carrier  -         -       -     172.17.0.1/16
  ib1      down        -         mlx5_1  1     10.1.0.8/16
network: nccl_socket_net=10.1.0.0/16: on ib0 (10.1.0.7/16)
network: nccl_socket_net=10.1.0.0/16: ib1 has 10.1.0.8/16 but is left out: down
network: NCCL's own choice here (NCCL_SOCKET_IFNAME unset): bootstrap ib0:10.1.0.7, sockets ib0:10.1.0.7 (NCCL's default: an ib* interface first)
network: NCCL before 2.28.3 would take: bootstrap ib0:10.1.0.7, sockets ib0:10.1.0.7 ib1:10.1.0.8 (NCCL's default: an ib* interface first)
";
    assert_eq!(text, want);
}

/// The trap: names differ per node, and NCCL takes the management NIC made first.
#[test]
fn the_management_nic_trap_shows_on_a_node_with_other_names() {
    let text = status(&node2(), nets("10.1.0.0/16"));
    println!("{text}");
    assert!(text.contains("  ens1f0np0  running  400 Gb/s  mlx5_2  1     10.1.3.5/16\n"), "{text}");
    assert!(text.contains("network: nccl_socket_net=10.1.0.0/16: on ens1f0np0 (10.1.3.5/16)\n"), "{text}");
    assert!(
        text.contains(
            "network: NCCL's own choice here (NCCL_SOCKET_IFNAME unset): bootstrap eno1:10.0.0.6, \
             sockets eno1:10.0.0.6 ens1f0np0:10.1.3.5 ens2f0:192.168.50.6 \
             (NCCL's default: the first interface that is not docker*, lo or virbr*)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "network: NOTE: NCCL's own choice, eno1, is not on nccl_socket_net=10.1.0.0/16: without \
             NCCL_SOCKET_IFNAME, NCCL bootstraps (and sends socket traffic) over eno1, not over ens1f0np0\n"
        ),
        "{text}"
    );
    // Same rules before 2.28.3 here: no second line.
    assert!(!text.contains("before 2.28.3"), "{text}");
}

#[test]
fn a_node_without_the_fabric_says_so_with_what_it_has() {
    let node =
        FakeNode::new(&["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.7/24", "docker0 UR 10.1.0.1/16", "eth1 U"]);
    let text = status(&node, nets("10.1.0.0/16,10.2.0.0/16"));
    println!("{text}");
    assert!(
        text.contains(
            "network: nccl_socket_net=10.1.0.0/16,10.2.0.0/16: NOT on this node: no running interface has an \
             address in it (this node has: eth0 (10.0.0.7/24), docker0 (10.1.0.1/16), eth1 (-, no-carrier))\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "network: nccl_socket_net=10.1.0.0/16,10.2.0.0/16: docker0 has 10.1.0.1/16 but is left out: \
             a virtual interface"
        ),
        "{text}"
    );
    assert!(
        text.contains("NOTE: NCCL's own choice, eth0, is not on nccl_socket_net=10.1.0.0/16,10.2.0.0/16: without NCCL_SOCKET_IFNAME, NCCL bootstraps (and sends socket traffic) over eth0\n"),
        "{text}"
    );
    let m = metrics_text(
        "n",
        fabric_nets(&nets("10.1.0.0/16,10.2.0.0/16")),
        &node.interfaces().map_err(|e| e.to_string()),
    );
    assert!(m.contains("gpu_node_agent_fabric_interfaces{node=\"n\",net=\"10.1.0.0/16\"} 0\n"), "{m}");
    assert!(m.contains("gpu_node_agent_fabric_interfaces{node=\"n\",net=\"10.2.0.0/16\"} 0\n"), "{m}");
}

fn fabric_nets(f: &Fabric) -> &[Cidr] {
    f.nets().unwrap()
}

#[test]
fn an_ipv6_only_fabric_is_found() {
    let node = FakeNode::new(&["lo URL ::1/128", "eth0 UR fd00:1::5/64 fe80::5/64", "eth1 UR fd00:2::5/64"]);
    let text = status(&node, nets("fd00:2::/64"));
    println!("{text}");
    assert!(text.contains("network: nccl_socket_net=fd00:2::/64: on eth1 (fd00:2::5/64)\n"), "{text}");
    assert!(text.contains("bootstrap eth0:fd00:1::5, sockets eth0:fd00:1::5 eth1:fd00:2::5"), "{text}");
    assert!(text.contains("NOTE: NCCL's own choice, eth0, is not on nccl_socket_net=fd00:2::/64"), "{text}");
    let m = metrics_text("n", fabric_nets(&nets("fd00:2::/64")), &Ok(node.ifaces.clone()));
    assert!(m.ends_with("gpu_node_agent_fabric_interfaces{node=\"n\",net=\"fd00:2::/64\"} 1\n"), "{m}");
}

#[test]
fn what_cannot_be_read_is_one_line_and_the_rest_still_shows() {
    let node = node1().failing("speed:ib0").failing("rdma:ib1").failing("numa_node:eth0");
    let text = status(&node, nets("10.1.0.0/16"));
    println!("{text}");
    assert!(text.contains("  ib0      running     -       mlx5_0  1     10.1.0.7/16"), "{text}");
    assert!(text.contains("network: nccl_socket_net=10.1.0.0/16: on ib0 (10.1.0.7/16)\n"), "{text}");
    let unread: Vec<&str> = text.lines().filter(|l| l.starts_with("network: could not read: ")).collect();
    assert_eq!(
        unread,
        ["network: could not read: eth0 numa_node: numa_node:eth0: denied by the test; \
          ib0 speed: speed:ib0: denied by the test; ib1 RDMA device: rdma:ib1: denied by the test"],
        "{text}"
    );
    // No interfaces at all: the plugstack's value is still shown, unchecked.
    let text = status(&node1().failing("interfaces"), nets("10.1.0.0/16"));
    assert_eq!(
        text,
        "network: cannot list the interfaces (getifaddrs: interfaces: denied by the test): no table, no NCCL prediction\n\
         network: nccl_socket_net=10.1.0.0/16: not checked\n"
    );
    let m = node_metrics("n", &nets("10.1.0.0/16"), &node1().failing("interfaces"));
    assert!(m.starts_with("# HELP gpu_node_agent_fabric_interfaces ") && !m.contains("{node="), "{m}");
}

#[test]
fn without_nccl_socket_net_no_metric_and_a_short_note() {
    assert_eq!(node_metrics("n", &Fabric::Unset, &node1()), "");
    assert_eq!(node_metrics("n", &Fabric::NoPlugin, &node1().failing("interfaces")), "");
    let text = status(&node2(), Fabric::Unset);
    assert!(text.contains("network: nccl_socket_net is not set on the spank_gpu line\n"), "{text}");
    assert!(!text.contains("NOTE"), "{text}");
    assert!(text.contains("network: NCCL's own choice here"), "{text}");
    let text = status(&node2(), Fabric::NoPlugin);
    assert!(!text.contains("nccl_socket_net"), "{text}");
    let m = node_metrics("n", &nets("10.1.0.0/16"), &node1());
    assert!(m.ends_with("gpu_node_agent_fabric_interfaces{node=\"n\",net=\"10.1.0.0/16\"} 1\n"), "{m}");
}

fn check_with_args(args: &[&str]) -> ReleaseCheck {
    use crate::slurm::release::{Found, Listed};
    let listed = Listed {
        file: "/etc/slurm/plugstack.conf.d/spank-gpu.conf".into(),
        line: 2,
        required: false,
        path: "/x/spank_gpu.so".into(),
        seq: 0,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
    };
    ReleaseCheck {
        plugstack: "/etc/slurm/plugstack.conf".into(),
        plugins: vec![Found { listed, file: None, version: Ok(0x16_0508) }],
        problems: vec![],
        slurmd: Err("not asked".into()),
        pyxis: vec![],
    }
}

#[test]
fn the_fabric_comes_from_the_spank_gpu_line() {
    let f = Fabric::of(&check_with_args(&["auto_rdzv=on", "nccl_socket_net=10.1.0.0/16"]));
    assert_eq!(f, nets("10.1.0.0/16"));
    assert_eq!(Fabric::of(&check_with_args(&["auto_rdzv=on"])), Fabric::Unset);
    let Fabric::BadLine(e) = Fabric::of(&check_with_args(&["nccl_socket_net=10.1.2.0/16"])) else {
        panic!("a bad line")
    };
    assert!(e.starts_with("/etc/slurm/plugstack.conf.d/spank-gpu.conf:2: plugstack.conf argument"), "{e}");
    let text = status(&node2(), Fabric::BadLine(e));
    assert!(
        text.contains("network: nccl_socket_net not read: the spank_gpu line does not parse, so the plugin does nothing ("),
        "{text}"
    );
    let none = ReleaseCheck { plugins: vec![], ..check_with_args(&[]) };
    assert_eq!(Fabric::of(&none), Fabric::NoPlugin);
}

#[test]
fn getifaddrs_entries_become_interfaces_in_first_seen_order() {
    use node_info::{IFF_LOOPBACK, IFF_RUNNING, IFF_UP, IfAddr};
    let e = |name: &str, flags: u32, addr: Option<&str>, prefix: Option<u8>| IfAddr {
        name: name.to_owned(),
        flags,
        addr: addr.map(|a| a.parse::<IpAddr>().unwrap()),
        prefix,
    };
    let ur = IFF_UP | IFF_RUNNING;
    let list = from_entries(vec![
        e("lo", ur | IFF_LOOPBACK, None, None),
        e("eth0", ur, None, None),
        e("ib0", IFF_UP, None, None),
        e("lo", ur | IFF_LOOPBACK, Some("127.0.0.1"), Some(8)),
        e("eth0", ur, Some("10.0.0.5"), Some(24)),
        e("eth0", ur, Some("fe80::5"), Some(64)),
        e("ib0", IFF_UP, Some("fd00::7"), None),
    ]);
    let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["lo", "eth0", "ib0"]);
    assert_eq!(list[0], iface("lo URL 127.0.0.1/8"));
    assert_eq!(list[1], iface("eth0 UR 10.0.0.5/24 fe80::5/64"));
    assert_eq!(list[2], iface("ib0 U fd00::7/128"));
}

/// The real reader over a sysfs tree in a temporary directory.
#[test]
fn sysfs_is_read_under_its_root() {
    let root = std::env::temp_dir().join(format!("agent-network-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let net = root.join("class/net");
    let put = |path: &str, text: &str| {
        let p = net.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    };
    put("ib0/speed", "200000\n");
    put("ib0/device/numa_node", "1\n");
    fs::create_dir_all(net.join("ib0/device/infiniband/mlx5_0")).unwrap();
    put("eth0/speed", "-1\n");
    put("eth0/device/numa_node", "-1\n");
    fs::create_dir_all(net.join("docker0")).unwrap();
    // A speed that is there but cannot be read (a directory here).
    fs::create_dir_all(net.join("bad0/speed")).unwrap();
    let sys = System { sysfs: root.clone() };
    assert_eq!(sys.speed("ib0").unwrap(), Some(200_000));
    assert_eq!(sys.numa_node("ib0").unwrap(), Some(1));
    assert_eq!(sys.rdma_devices("ib0").unwrap(), ["mlx5_0"]);
    assert_eq!(sys.speed("eth0").unwrap(), None);
    assert_eq!(sys.numa_node("eth0").unwrap(), None);
    assert!(sys.rdma_devices("eth0").unwrap().is_empty());
    assert_eq!((sys.speed("docker0").unwrap(), sys.numa_node("docker0").unwrap()), (None, None));
    assert!(sys.rdma_devices("docker0").unwrap().is_empty());
    let e = sys.speed("bad0").unwrap_err().to_string();
    assert!(e.contains("class/net/bad0/speed: "), "{e}");
    // Not a path component: never looked up.
    for name in ["..", "a/b", ""] {
        assert_eq!(sys.speed(name).unwrap(), None, "{name}");
    }
    assert!(Path::new(&root).exists());
    let _ = fs::remove_dir_all(&root);
}

/// This machine's own interfaces through the real seam: at least `lo`.
#[test]
fn the_real_node_lists_its_loopback() {
    let n = gather(&System::default(), Fabric::Unset);
    let list = n.ifaces.unwrap();
    assert!(list.iter().any(|i| i.iface.name == "lo" && i.iface.loopback), "{list:?}");
}
