use super::*;

fn iface(spec: &str) -> Interface {
    crate::netif::fixture(spec)
}

fn node(specs: &[&str]) -> Vec<Interface> {
    specs.iter().map(|s| iface(s)).collect()
}

/// A GPU node as sites have them: loopback, a management NIC first, a RoCE
/// fabric NIC, a storage NIC, Docker's bridge (no carrier), a down port.
fn roce_node() -> Vec<Interface> {
    node(&[
        "lo URL 127.0.0.1/8 ::1/128",
        "eno1 UR 10.0.0.5/24 fe80::1/64",
        "ens1f0np0 UR 10.100.3.5/16 fd00:100::5/64",
        "ens2f0 UR 192.168.50.5/24",
        "docker0 U 172.17.0.1/16",
        "ens3f1 U 10.100.9.5/16",
    ])
}

fn boot(c: &NcclChoice) -> String {
    c.bootstrap.as_ref().map_or("none".into(), ToString::to_string)
}

#[test]
fn unset_nccl_takes_ib_first_else_the_first_interface_not_held_back() {
    let c = nccl_choice(None, &roce_node(), None, NcclRules::Current);
    // The trap of the field guide: the management NIC, made first, wins.
    assert_eq!(boot(&c), "eno1:10.0.0.5");
    assert_eq!(c.rule, "NCCL's default: the first interface that is not docker*, lo or virbr*");
    let names: Vec<&str> = c.sockets.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["eno1", "ens1f0np0", "ens2f0"], "running only, docker0 and lo held back");
    let mut ib = roce_node();
    ib.push(iface("ib0 UR 10.200.0.5/16"));
    let c = nccl_choice(None, &ib, None, NcclRules::Current);
    assert_eq!(boot(&c), "ib0:10.200.0.5");
    assert_eq!(c.rule, "NCCL's default: an ib* interface first");
}

#[test]
fn before_2_28_3_a_down_interface_and_virbr_count() {
    let n = node(&["lo URL 127.0.0.1/8", "virbr0 U 192.168.122.1/24", "eth0 U 10.0.0.5/24"]);
    assert_eq!(boot(&nccl_choice(None, &n, None, NcclRules::Before2283)), "virbr0:192.168.122.1");
    // From 2.28.3 neither is running: only lo is left.
    assert_eq!(boot(&nccl_choice(None, &n, None, NcclRules::Current)), "lo:127.0.0.1");
}

#[test]
fn every_ipv4_address_comes_before_any_ipv6_one() {
    let n = node(&["lo URL 127.0.0.1/8", "eth0 UR fd00::5/64", "eth1 UR 10.0.0.5/24"]);
    let c = nccl_choice(None, &n, None, NcclRules::Current);
    assert_eq!(boot(&c), "eth1:10.0.0.5");
    assert_eq!(c.sockets.len(), 2);
    assert_eq!(c.sockets[1].to_string(), "eth0:fd00::5");
    let v6 = nccl_choice(None, &n, Family::from_env(Some("AF_INET6")), NcclRules::Current);
    assert_eq!(boot(&v6), "eth0:fd00::5");
    assert_eq!(Family::from_env(Some("inet6")), None, "NCCL ignores other words");
}

#[test]
fn nccl_socket_ifname_is_a_prefix_list_unless_exact_or_excluding() {
    let n = node(&[
        "lo URL 127.0.0.1/8",
        "eth0 UR 10.0.0.5/24",
        "eth10 UR 10.10.0.5/24",
        "bond0 UR 10.1.0.5/24",
        "bond0.2093 UR 10.2.0.5/24",
    ]);
    let names = |v: &str| -> Vec<String> {
        nccl_choice(Some(v), &n, None, NcclRules::Current).sockets.into_iter().map(|p| p.name).collect()
    };
    assert_eq!(names("eth1"), ["eth10"], "a prefix");
    assert!(names("=eth1").is_empty(), "exact");
    assert_eq!(names("bond0"), ["bond0", "bond0.2093"], "bond0 catches its VLAN");
    assert_eq!(names("=bond0"), ["bond0"]);
    assert_eq!(names("^bond0.2093,lo"), ["eth0", "eth10", "bond0"]);
    // ^docker0 without lo: lo is no longer held back, and it comes first.
    assert_eq!(boot(&nccl_choice(Some("^docker0"), &n, None, NcclRules::Current)), "lo:127.0.0.1");
    // One character is ignored: NCCL's default.
    assert_eq!(
        nccl_choice(Some("e"), &n, None, NcclRules::Current).rule.split(':').next(),
        Some("NCCL's default")
    );
    assert!(
        nccl_choice(Some("ib"), &n, None, NcclRules::Current).bootstrap.is_none(),
        "no match: NCCL fails"
    );
    assert_eq!(IfList::parse("^=docker0:1,lo").map(|l| l.to_string()), Some("^=docker0,lo".into()));
}

#[test]
fn cidrs_parse_strictly_and_contain_their_addresses() {
    let c = Cidr::parse("10.100.0.0/16").unwrap();
    assert!(c.contains(&"10.100.255.1".parse().unwrap()));
    assert!(!c.contains(&"10.101.0.1".parse().unwrap()));
    assert!(!c.contains(&"fd00::1".parse().unwrap()));
    let v6 = Cidr::parse("fd00:100::/64").unwrap();
    assert!(v6.contains(&"fd00:100::5".parse().unwrap()));
    assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(&"1.2.3.4".parse().unwrap()));
    for bad in ["10.100.0.0", "10.100.0.1/16", "10.100.0.0/33", "ib0/16", "10.0.0.0/x", "fd00::1/64"] {
        assert!(Cidr::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(
        Cidr::parse("10.100.3.0/16").unwrap_err(),
        "'10.100.3.0/16' has host bits set (the network is 10.100.0.0/16)"
    );
    assert_eq!(parse_nets("10.100.0.0/16, fd00:100::/64").unwrap().len(), 2);
    assert!(parse_nets("10.100.0.0/16,").is_err());
}

#[test]
fn the_fabric_by_network_gives_each_node_its_own_names() {
    let nets = parse_nets("10.100.0.0/16").unwrap();
    // node1: the RoCE NIC; its down second port is not taken.
    assert_eq!(fabric_vars(&nets, &roce_node()), Some(("=ens1f0np0".into(), "ens1f0np0".into())));
    // node2 names its fabric differently, and has two ports on it.
    let node2 = node(&[
        "lo URL 127.0.0.1/8",
        "enp65s0 UR 10.100.4.6/16",
        "enp66s0 UR 10.100.5.6/16",
        "eno1 UR 10.0.0.6/24",
    ]);
    assert_eq!(fabric_vars(&nets, &node2), Some(("=enp65s0,enp66s0".into(), "enp65s0".into())));
    // node3 has no fabric: nothing.
    assert_eq!(fabric_vars(&nets, &node(&["lo URL 127.0.0.1/8", "eno1 UR 10.0.0.7/24"])), None);
    // Never a virtual, loopback, link-local or down interface, even inside the network.
    let all = Cidr::parse("0.0.0.0/0").unwrap();
    let tricky = node(&[
        "lo URL 127.0.0.1/8",
        "docker0 UR 172.17.0.1/16",
        "veth12ab UR 10.100.7.1/16",
        "eth9 UR 169.254.3.1/16",
        "eth8 U 10.100.8.1/16",
    ]);
    assert_eq!(fabric_vars(&[all], &tricky), None);
}

#[test]
fn admin_values_nccl_would_misread_are_refused() {
    assert!(check_ifname_value("ib0").is_ok());
    assert!(check_ifname_value("^docker0,lo").is_ok());
    assert!(check_ifname_value("=ens1f0np0,enp65s0").is_ok());
    assert!(check_ifname_value("e").unwrap_err().contains("one character"));
    assert!(check_ifname_value("^docker0").unwrap_err().contains("but not lo"));
    assert!(check_ifname_value("^=docker0").unwrap_err().contains("(^=docker0,lo)"));
    assert!(check_ifname_value("^,").is_err());
}

#[test]
fn nccl_conf_files_are_read_as_nccl_reads_them() {
    assert!(conf_sets("NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=eth0\n", "NCCL_SOCKET_IFNAME"));
    assert!(!conf_sets("#NCCL_SOCKET_IFNAME=eth0\n", "NCCL_SOCKET_IFNAME"));
    assert!(!conf_sets(" NCCL_SOCKET_IFNAME=eth0\n", "NCCL_SOCKET_IFNAME"), "no trimming");
    assert!(!conf_sets("NCCL_SOCKET_IFNAME_X=1\n", "NCCL_SOCKET_IFNAME"));
}

#[test]
fn gloo_takes_exact_names_only() {
    let n = roce_node();
    assert_eq!(gloo_choice("ens1f0np0", &n).unwrap()[0].to_string(), "ens1f0np0:10.100.3.5");
    assert!(gloo_choice("^lo,docker", &n).unwrap_err().contains("not NCCL's ^ or = syntax"));
    assert!(gloo_choice("ens1", &n).unwrap_err().contains("Unable to find address for: ens1"));
    assert!(gloo_trap("^lo,docker").is_some());
    assert!(gloo_trap("eth0").is_none());
    assert!(ifname_trap("^docker0").is_some());
    assert!(ifname_trap("^docker0,lo").is_none());
    assert!(ifname_trap("eth0").is_none());
}
