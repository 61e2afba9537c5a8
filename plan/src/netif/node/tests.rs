use super::*;
use crate::netif::parse_nets;

fn iface(spec: &str) -> Interface {
    crate::netif::fixture(spec)
}

fn node(specs: &[&str]) -> Vec<Interface> {
    specs.iter().map(|s| iface(s)).collect()
}

/// node1: the management NIC first, the RoCE fabric port, Docker's bridge,
/// the fabric's second port down.
fn node1() -> Vec<Interface> {
    node(&[
        "lo URL 127.0.0.1/8 ::1/128",
        "eth0 UR 10.0.0.5/24",
        "ens1f0np0 UR 10.100.3.5/16",
        "docker0 UR 172.17.0.1/16",
        "ens1f1np1 U 10.100.9.5/16",
    ])
}

/// node2 names its fabric ports otherwise, and has two on it.
fn node2() -> Vec<Interface> {
    node(&[
        "lo URL 127.0.0.1/8",
        "eth0 UR 10.0.0.6/24",
        "enp65s0 UR 10.100.4.6/16",
        "enp66s0 UR 10.100.5.6/16",
    ])
}

/// node3 is not on the fabric.
fn node3() -> Vec<Interface> {
    node(&["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.7/24", "docker0 U 172.17.0.1/16"])
}

/// node4 has IPoIB.
fn node4() -> Vec<Interface> {
    node(&["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.8/24", "ib0 UR 10.100.6.8/16"])
}

fn fabric() -> Vec<Cidr> {
    parse_nets("10.100.0.0/16").unwrap()
}

fn values(o: &Offers) -> Vec<(&str, &str)> {
    o.offers.iter().map(|o| (o.name, o.value.as_str())).collect()
}

fn site(v: &str) -> Vec<(String, String)> {
    v.split_whitespace()
        .map(|w| {
            let (n, v) = w.split_once('=').unwrap();
            (n.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn the_fabric_by_network_gives_each_node_its_own_names_or_nothing() {
    let o = node_offers(&fabric(), &[], &node1(), "node1");
    assert_eq!(values(&o), [(NCCL_VAR, "=ens1f0np0"), (GLOO_VAR, "ens1f0np0")]);
    assert!(o.offers.iter().all(|o| o.why == "nccl_socket_net=10.100.0.0/16 on this node" && o.held_by_conf));
    assert!(o.log.is_empty() && o.withheld.is_empty());
    let o = node_offers(&fabric(), &[], &node2(), "node2");
    assert_eq!(values(&o), [(NCCL_VAR, "=enp65s0,enp66s0"), (GLOO_VAR, "enp65s0")]);
    // Not on the fabric: nothing, and one line saying what the node has.
    let o = node_offers(&fabric(), &[], &node3(), "node3");
    assert!(o.offers.is_empty());
    assert_eq!(o.withheld, [NCCL_VAR, GLOO_VAR]);
    assert_eq!(
        o.log,
        ["nccl_socket_net=10.100.0.0/16: no running interface of node3 has an address in it (node3 has \
          eth0 10.0.0.7/24, docker0 (no carrier) 172.17.0.1/16); NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME \
          not set here: NCCL and gloo choose"]
    );
    // Only the loopback: said so.
    let o = node_offers(&fabric(), &[], &node(&["lo URL 127.0.0.1/8"]), "n");
    assert!(o.log[0].contains("(n has no interface but the loopback)"), "{:?}", o.log);
}

#[test]
fn a_site_default_is_kept_only_where_it_matches_by_the_libraries_rules() {
    // A prefix that only some nodes have.
    let d = site("NCCL_SOCKET_IFNAME=ib");
    let o = node_offers(&[], &d, &node4(), "node4");
    assert_eq!(values(&o), [(NCCL_VAR, "ib")]);
    assert_eq!(o.offers[0].why, "site default");
    let o = node_offers(&[], &d, &node1(), "node1");
    assert!(o.offers.is_empty());
    assert_eq!(o.withheld, [NCCL_VAR]);
    assert_eq!(o.log.len(), 1);
    assert!(
        o.log[0].starts_with(
            "NCCL_SOCKET_IFNAME=ib (the plugstack line's) matches no running interface of node1 with an \
             address (node1 has eth0 10.0.0.5/24, ens1f0np0 10.100.3.5/16"
        ),
        "{:?}",
        o.log
    );
    assert!(o.log[0].ends_with("; not set here: NCCL chooses"), "{:?}", o.log);
    // Exact names, and a name only on a port that is down.
    assert!(node_offers(&[], &site("NCCL_SOCKET_IFNAME==ens1f0np0"), &node1(), "n").withheld.is_empty());
    assert_eq!(node_offers(&[], &site("NCCL_SOCKET_IFNAME==ens1f1np1"), &node1(), "n").withheld, [NCCL_VAR]);
    // An exclude list matches whatever is left.
    assert!(node_offers(&[], &site("NCCL_SOCKET_IFNAME=^docker,lo"), &node3(), "n").withheld.is_empty());
    // gloo: one exact name with an address.
    let d = site("GLOO_SOCKET_IFNAME=ib0");
    let o = node_offers(&[], &d, &node4(), "node4");
    assert_eq!(values(&o), [(GLOO_VAR, "ib0")]);
    assert!(!o.offers[0].held_by_conf, "NCCL's files do not decide gloo's interface");
    let o = node_offers(&[], &d, &node2(), "node2");
    assert_eq!(o.withheld, [GLOO_VAR]);
    assert!(o.log[0].contains("Unable to find address for: ib0"), "{:?}", o.log);
    assert!(o.log[0].ends_with("(the plugstack line's, on node2); not set here: gloo chooses"));
    // Other site defaults are not the plugin's business here.
    let o = node_offers(&[], &site("NCCL_DEBUG=INFO"), &node1(), "n");
    assert!(o.offers.is_empty() && o.withheld.is_empty() && o.log.is_empty(), "{o:?}");
}

#[test]
fn interfaces_that_cannot_be_read_set_nothing() {
    let o = unreadable(&fabric(), &[], "getifaddrs: Invalid argument", "node1");
    assert!(o.offers.is_empty());
    assert_eq!(o.withheld, [NCCL_VAR, GLOO_VAR]);
    assert_eq!(
        o.log,
        [
            "the network interfaces of node1 cannot be read (getifaddrs: Invalid argument); NCCL_SOCKET_IFNAME \
          and GLOO_SOCKET_IFNAME not set here: NCCL and gloo choose"
        ]
    );
    // Nothing asked for, nothing said.
    assert_eq!(unreadable(&[], &site("NCCL_DEBUG=INFO"), "x", "n"), Offers::default());
    assert!(configured(&[], &site("GLOO_SOCKET_IFNAME=ib0")));
    assert!(!configured(&[], &site("NCCL_DEBUG=INFO")));
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn names(t: &TaskIfaces) -> Vec<&str> {
    t.set.iter().map(|o| o.name).collect()
}

#[test]
fn tasks_get_only_the_gaps_nccls_files_leave() {
    let offers = node_offers(&fabric(), &[], &node1(), "node1");
    let none: ConfRead = Ok(None);
    let mut reads = 0;
    // Nothing set anywhere: both, after ~/.nccl.conf was read once.
    let t = for_task(&offers, &env(&[]), None, &none, &mut || {
        reads += 1;
        Ok(None)
    });
    assert_eq!((names(&t), reads), (vec![NCCL_VAR, GLOO_VAR], 1));
    assert_eq!((t.held.as_deref(), t.problem.as_deref()), (None, None));
    // The user set both: they are offered (the plan keeps the user's) and no file is read.
    let user = env(&[(NCCL_VAR, "eth0"), (GLOO_VAR, "eth0")]);
    let t = for_task(&offers, &user, None, &none, &mut || panic!("~/.nccl.conf read for nothing"));
    assert_eq!(names(&t), [NCCL_VAR, GLOO_VAR]);
    assert!(t.unset.is_empty(), "the user's values stay");
    // NCCL_CONF_FILE, /etc/nccl.conf or ~/.nccl.conf decide NCCL's interface: neither is set.
    let by_file = env(&[(CONF_FILE_VAR, "/home/u/my.conf")]);
    let t = for_task(&offers, &by_file, None, &none, &mut || panic!("NCCL does not read ~/.nccl.conf then"));
    assert!(t.set.is_empty());
    assert_eq!(
        t.held.as_deref(),
        Some("NCCL_CONF_FILE=/home/u/my.conf is set: NCCL reads that file, which spank-gpu does not")
    );
    let t = for_task(&offers, &env(&[]), None, &Ok(Some("eth0".into())), &mut || panic!("not needed"));
    assert_eq!((t.set.len(), t.held.as_deref()), (0, Some("/etc/nccl.conf sets NCCL_SOCKET_IFNAME=eth0")));
    let t = for_task(&offers, &env(&[]), None, &none, &mut || Ok(Some("=eth0".into())));
    assert_eq!((t.set.len(), t.held.as_deref()), (0, Some("~/.nccl.conf sets NCCL_SOCKET_IFNAME==eth0")));
    // What cannot be read sets nothing: ~/.nccl.conf's trouble is the task's to log.
    let t = for_task(&offers, &env(&[]), None, &none, &mut || Err("a link: not followed".into()));
    assert!(t.set.is_empty());
    assert_eq!(
        t.problem.as_deref(),
        Some(
            "~/.nccl.conf cannot be read (a link: not followed); NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME not set"
        )
    );
    let t =
        for_task(&offers, &env(&[]), None, &Err("not owned by root".into()), &mut || panic!("not needed"));
    assert!(t.set.is_empty() && t.problem.is_none(), "user_init logged it");
    // A site GLOO_SOCKET_IFNAME is gloo's: NCCL's files do not hold it back.
    let offers = node_offers(&[], &site("GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib"), &node4(), "node4");
    let t = for_task(&offers, &by_file, None, &none, &mut || Ok(None));
    assert_eq!(names(&t), [GLOO_VAR]);
}

#[test]
fn a_value_the_plugin_set_on_another_node_is_removed_where_it_sets_none() {
    // The batch step ran on node1 and set its names; the srun step's task on node3 inherits them.
    let on1 = node_offers(&fabric(), &[], &node1(), "node1");
    let plan = |o: &Offers| {
        let set: Vec<String> =
            o.offers.iter().map(|o| crate::record::record_item(o.name, &o.value)).collect();
        set.join(",")
    };
    let record = plan(&on1);
    let inherited = env(&[(NCCL_VAR, "=ens1f0np0"), (GLOO_VAR, "ens1f0np0")]);
    let on3 = node_offers(&fabric(), &[], &node3(), "node3");
    let t = for_task(&on3, &inherited, Some(&record), &Ok(None), &mut || Ok(None));
    assert!(t.set.is_empty());
    assert_eq!(t.unset, [NCCL_VAR, GLOO_VAR]);
    // On node2 they are replaced by node2's own.
    let on2 = node_offers(&fabric(), &[], &node2(), "node2");
    let t = for_task(&on2, &inherited, Some(&record), &Ok(None), &mut || Ok(None));
    assert_eq!((names(&t), t.unset.len()), (vec![NCCL_VAR, GLOO_VAR], 0));
    // A value the user changed since is the user's: kept.
    let changed = env(&[(NCCL_VAR, "=eth0"), (GLOO_VAR, "ens1f0np0")]);
    let t = for_task(&on3, &changed, Some(&record), &Ok(None), &mut || Ok(None));
    assert_eq!(t.unset, [GLOO_VAR]);
    // A recorded value that names a running interface here stays (a user may have
    // exported the very same value): only another node's name is removed.
    let works = env(&[(NCCL_VAR, "=eth0"), (GLOO_VAR, "eth0")]);
    let record =
        [crate::record::record_item(NCCL_VAR, "=eth0"), crate::record::record_item(GLOO_VAR, "eth0")]
            .join(",");
    let t = for_task(&on3, &works, Some(&record), &Ok(None), &mut || Ok(None));
    assert!(t.unset.is_empty(), "{:?}", t.unset);
}

#[test]
fn nccl_reads_the_environment_then_its_files() {
    let none: ConfRead = Ok(None);
    let plugin = Source::of_env(Some("=ib0"), Some("site default"));
    assert_eq!(plugin.from, "set by spank-gpu: site default");
    let s = nccl_source(plugin.clone(), Some("/x"), &Ok(Some("eth1".into())), &none);
    assert_eq!(s, plugin, "the environment first");
    let unset = Source::of_env(None, None);
    let s = nccl_source(unset.clone(), None, &Ok(Some("eth1".into())), &Ok(Some("eth2".into())));
    assert_eq!((s.value.as_deref(), s.from.as_str()), (Some("eth1"), "~/.nccl.conf"));
    let s = nccl_source(unset.clone(), None, &none, &Ok(Some("eth2".into())));
    assert_eq!((s.value.as_deref(), s.from.as_str()), (Some("eth2"), "/etc/nccl.conf"));
    let s = nccl_source(unset.clone(), Some("/x"), &Ok(Some("eth1".into())), &Ok(Some("eth2".into())));
    assert_eq!(s.value.as_deref(), Some("eth2"));
    assert_eq!(
        s.from,
        "/etc/nccl.conf, unless NCCL_CONF_FILE=/x may set it first (spank-gpu does not read that file)"
    );
    let s = nccl_source(unset.clone(), None, &Err("a link".into()), &none);
    assert_eq!((s.value, s.from.as_str()), (None, "unset (~/.nccl.conf cannot be read: a link)"));
    assert_eq!(nccl_source(unset, None, &none, &none).from, "unset");
}

fn net(ifaces: Vec<Interface>, hosts: &str) -> NodeNet {
    NodeNet {
        node: "node1".into(),
        ifaces: Ok(ifaces),
        offers: Offers::default(),
        site_conf: Ok(None),
        hostname: Some("node1".into()),
        hosts: Ok(crate::netif::hosts_addrs(hosts, "node1")),
    }
}

#[test]
fn the_report_says_what_nccl_and_gloo_use_and_how_to_confirm_it() {
    let why = "nccl_socket_net=10.100.0.0/16 on this node";
    let n = net(node1(), "127.0.0.1 localhost\n10.0.0.5 node1.cluster node1\n");
    let nccl = Source::of_env(Some("=ens1f0np0"), Some(why));
    let gloo = Source::of_env(Some("ens1f0np0"), Some(why));
    let r = report(&n, &nccl, None, &gloo);
    assert_eq!(
        r.line(),
        "spank-gpu: network on node1: NCCL bootstrap ens1f0np0:10.100.3.5, sockets ens1f0np0:10.100.3.5 \
         (NCCL_SOCKET_IFNAME==ens1f0np0, set by spank-gpu: nccl_socket_net=10.100.0.0/16 on this node); \
         gloo ens1f0np0:10.100.3.5 (GLOO_SOCKET_IFNAME=ens1f0np0, set by spank-gpu: nccl_socket_net=10.100.0.0/16 \
         on this node); NCCL_DEBUG=INFO prints \"NCCL INFO Bootstrap: Using ens1f0np0:10.100.3.5<0>\""
    );
    let lines = r.lines();
    assert_eq!(lines[0], "network on node1 (its live interfaces):");
    assert!(lines.contains(&"    NCCL INFO Bootstrap: Using ens1f0np0:10.100.3.5<0>   (always)".to_owned()));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("    NCCL INFO NET/Socket : Using [0]ens1f0np0:10.100.3.5<0>   ("))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("    NCCL INFO NET/IB : Using [0]... ; OOB ens1f0np0:10.100.3.5<0>"))
    );

    // Nothing set: NCCL's own choice, the management NIC made first; gloo by the host name.
    let unset = Source::of_env(None, None);
    let r = report(&n, &unset, None, &unset);
    assert_eq!(
        r.nccl,
        "bootstrap eth0:10.0.0.5, sockets eth0:10.0.0.5 ens1f0np0:10.100.3.5 (NCCL_SOCKET_IFNAME unset; \
         NCCL's default: the first interface that is not docker*, lo or virbr*)"
    );
    assert_eq!(r.gloo, "eth0:10.0.0.5 (GLOO_SOCKET_IFNAME unset: /etc/hosts gives node1 10.0.0.5)");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // Before 2.28.3 the port that is down counted: the same bootstrap, so not repeated.
    assert_eq!(r.older, None);

    // Debian's 127.0.1.1: gloo's loopback trap is flagged, with the fix.
    let debian = net(node1(), "127.0.0.1 localhost\n127.0.1.1 node1.cluster node1\n");
    let r = report(&debian, &unset, None, &unset);
    assert_eq!(r.gloo, "127.0.1.1 (GLOO_SOCKET_IFNAME unset: /etc/hosts gives node1 127.0.1.1)");
    assert_eq!(
        r.warnings,
        [
            "/etc/hosts maps node1 to 127.0.1.1, a loopback address: gloo (GLOO_SOCKET_IFNAME unset) binds it and \
          ranks on other nodes cannot connect; set GLOO_SOCKET_IFNAME=eth0"
        ]
    );
    assert!(r.line().contains("; WARNING: /etc/hosts maps node1 to 127.0.1.1"), "{}", r.line());
    // With GLOO_SOCKET_IFNAME set, the host name does not matter.
    assert!(report(&debian, &unset, None, &Source::of_env(Some("eth0"), None)).warnings.is_empty());

    // A value NCCL finds nothing for, gloo given NCCL's syntax.
    let r = report(&n, &Source::of_env(Some("ib"), None), None, &Source::of_env(Some("^lo"), None));
    assert_eq!(r.nccl, "no interface (NCCL_SOCKET_IFNAME=ib, set by you)");
    assert!(r.confirm.is_empty());
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(r.warnings[0].contains("\"Bootstrap : no socket interface found\""));
    assert!(r.warnings[1].starts_with("gloo fails: GLOO_SOCKET_IFNAME=^lo: gloo takes exact names"));

    // NCCL's exclude list without lo: the loopback, flagged.
    let r = report(&n, &Source::of_env(Some("^docker0"), None), None, &unset);
    assert!(r.warnings[0].starts_with("NCCL bootstraps over lo:127.0.0.1, the loopback"), "{:?}", r.warnings);

    // An address no interface has: gloo's fallback.
    let elsewhere = net(node2(), "10.9.9.9 node1\n");
    let r = report(&elsewhere, &unset, None, &unset);
    assert!(r.gloo.starts_with("127.0.0.1 (GLOO_SOCKET_IFNAME unset"), "{}", r.gloo);
    assert!(r.warnings[0].contains("falls back to 127.0.0.1"), "{:?}", r.warnings);
    // Not in /etc/hosts, or no hosts file: DNS decides.
    let dns = net(node2(), "");
    assert!(report(&dns, &unset, None, &unset).gloo.contains("node1 is not in /etc/hosts"));

    // IPoIB: NCCL's ib-first rule; and the older rules' choice where it differs.
    let r = report(&net(node4(), ""), &unset, None, &unset);
    assert!(r.nccl.starts_with("bootstrap ib0:10.100.6.8, sockets ib0:10.100.6.8 ("), "{}", r.nccl);
    let virbr = node(&["lo URL 127.0.0.1/8", "virbr0 U 192.168.122.1/24", "eth0 UR 10.0.0.5/24"]);
    let r = report(&net(virbr, ""), &unset, None, &unset);
    assert_eq!(
        r.older.as_deref(),
        Some("bootstrap virbr0:192.168.122.1, sockets virbr0:192.168.122.1 eth0:10.0.0.5")
    );

    // Interfaces that cannot be read: NCCL's choice unknown.
    let blind = NodeNet { ifaces: Err("getifaddrs: EINVAL".into()), ..net(node1(), "") };
    let r = report(&blind, &unset, None, &unset);
    assert_eq!(
        r.nccl,
        "unknown: the interfaces cannot be read (getifaddrs: EINVAL); NCCL_SOCKET_IFNAME unset"
    );
    assert_eq!(r.gloo, "unknown");
}

#[test]
fn conf_files_and_hosts_files_read_as_their_readers_do() {
    use crate::netif::{conf_value, hosts_addrs};
    let text = "# NCCL_SOCKET_IFNAME=x\nNCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=ib0\nNCCL_SOCKET_IFNAME=eth0\n";
    assert_eq!(
        conf_value(text, NCCL_VAR).as_deref(),
        Some("ib0"),
        "the first line wins (setenv, no overwrite)"
    );
    assert_eq!(conf_value(" NCCL_SOCKET_IFNAME=ib0", NCCL_VAR), None, "no trimming");
    let hosts = "127.0.0.1 localhost\n127.0.1.1\tNode1.cluster node1 # Debian\n::1 localhost ip6-localhost\n#10.0.0.1 node1\n";
    let lo: IpAddr = "127.0.1.1".parse().unwrap();
    assert_eq!(hosts_addrs(hosts, "node1"), [lo]);
    assert_eq!(hosts_addrs(hosts, "NODE1.cluster"), [lo], "names compare without case");
    assert!(hosts_addrs(hosts, "node2").is_empty());
}

#[test]
fn getifaddrs_entries_group_by_interface_in_their_order() {
    use crate::netif::{Entry, group};
    let e = |name: &str, running: bool, addr: Option<&str>, prefix: Option<u8>| Entry {
        name: name.into(),
        up: true,
        running,
        loopback: name == "lo",
        addr: addr.map(|a| a.parse().unwrap()),
        prefix,
    };
    let got = group([
        e("lo", true, None, None),
        e("eth0", true, None, None),
        e("lo", true, Some("127.0.0.1"), Some(8)),
        e("eth0", true, Some("10.0.0.5"), Some(24)),
        e("eth0", true, Some("fd00::5"), None),
    ]);
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].name.as_str(), got[0].loopback), ("lo", true));
    assert_eq!(got[1].addrs.iter().map(|a| a.prefix).collect::<Vec<_>>(), [24, 128]);
}
