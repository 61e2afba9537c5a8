//! What the plugin sets for NCCL's and gloo's interfaces on one node, and
//! what NCCL and gloo will use there.
//!
//! Once per step and node ([`node_offers`], from the node's live
//! interfaces): `nccl_socket_net=CIDR[,CIDR]` gives `NCCL_SOCKET_IFNAME` in
//! NCCL's exact form (`=if1,if2`, the running interfaces with an address in
//! it, never loopback, link-local, virtual or without a link) and
//! `GLOO_SOCKET_IFNAME` (the first of them: gloo takes exact names); a site
//! default `NCCL_SOCKET_IFNAME=` (`nccl_socket_ifname=`) is kept only where
//! it matches a running interface by NCCL's own rules, a `GLOO_SOCKET_IFNAME=`
//! only where gloo finds the name. A node without any gets nothing, and one
//! log line says what it has.
//!
//! Per task ([`for_task`]): gaps only. A value the user set is kept (the
//! task plan's rule); the `NCCL_SOCKET_IFNAME` offers and those from
//! `nccl_socket_net` are held back where `NCCL_CONF_FILE` is set or NCCL's
//! configuration files set `NCCL_SOCKET_IFNAME` (NCCL reads the process
//! environment before them, so a value the plugin set would beat them); a
//! value the plugin set in an enclosing step (a batch script's, computed on
//! another node) that it does not set here is removed.
//!
//! What NCCL and gloo will then use ([`report`]): NCCL's choice over the
//! interfaces for the task's value, gloo's for its own (or, unset, the
//! host name as `/etc/hosts` gives it: a loopback address there is gloo's
//! trap), and the `NCCL_DEBUG=INFO` lines that confirm it.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::{
    Cidr, Family, IfList, Interface, NcclChoice, NcclRules, Pick, fabric_vars, gloo_choice, local_only,
};

/// NCCL's interface variable.
pub const NCCL_VAR: &str = "NCCL_SOCKET_IFNAME";
/// gloo's.
pub const GLOO_VAR: &str = "GLOO_SOCKET_IFNAME";
/// The user's NCCL configuration file, read by NCCL instead of `~/.nccl.conf`.
pub const CONF_FILE_VAR: &str = "NCCL_CONF_FILE";
/// NCCL's address family filter.
pub const FAMILY_VAR: &str = "NCCL_SOCKET_FAMILY";
/// The host's NCCL configuration file (read as root's, trusted).
pub const SITE_CONF: &str = "/etc/nccl.conf";
/// The user's, in the user's home directory (read as the user).
pub const USER_CONF: &str = ".nccl.conf";
/// The largest NCCL configuration file read.
pub const MAX_CONF: usize = 64 << 10;
/// Where gloo's host name is looked up first.
pub const HOSTS_FILE: &str = "/etc/hosts";
/// The largest hosts file read.
pub const MAX_HOSTS: usize = 1 << 20;

/// Whether `name` is one of the interface variables.
pub fn is_interface_var(name: &str) -> bool {
    name == NCCL_VAR || name == GLOO_VAR
}

/// Whether the plugstack line asks for interface variables: `nccl_socket_net`,
/// or a site default for either.
pub fn configured(nets: &[Cidr], defaults: &[(String, String)]) -> bool {
    !nets.is_empty() || defaults.iter().any(|(n, _)| is_interface_var(n))
}

/// A variable the plugin offers on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// [`NCCL_VAR`] or [`GLOO_VAR`].
    pub name: &'static str,
    /// Its value here.
    pub value: String,
    /// Why, as the `verbose` line says it.
    pub why: String,
    /// Held back where NCCL's configuration decides the interface
    /// (`NCCL_CONF_FILE`, a `NCCL_SOCKET_IFNAME=` line in a file NCCL reads).
    pub held_by_conf: bool,
}

/// The node's offers for one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offers {
    /// What may be set here, before each task's gaps.
    pub offers: Vec<Offer>,
    /// The interface variables the plugstack line asks for that are not set here.
    pub withheld: Vec<&'static str>,
    /// What to log, once per step on this node.
    pub log: Vec<String>,
    /// The node's interfaces, to tell whether an inherited value works here.
    pub ifaces: Vec<Interface>,
}

fn nets_text(nets: &[Cidr]) -> String {
    nets.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// What the node has, for a log line: every interface but the loopback,
/// with its state when it is not running and its addresses.
fn has_text(ifaces: &[Interface]) -> String {
    let has: Vec<String> = ifaces
        .iter()
        .filter(|i| !i.loopback && i.name != "lo")
        .map(|i| {
            let mut s = i.name.clone();
            if !i.up {
                s.push_str(" (down)");
            } else if !i.running {
                s.push_str(" (no carrier)");
            }
            for a in &i.addrs {
                let _ = write!(s, " {}/{}", a.ip, a.prefix);
            }
            s
        })
        .collect();
    if has.is_empty() { "no interface but the loopback".to_owned() } else { has.join(", ") }
}

/// The node's offers from its interfaces (`node`: its name, for the log).
pub fn node_offers(nets: &[Cidr], defaults: &[(String, String)], ifaces: &[Interface], node: &str) -> Offers {
    let mut out = Offers { ifaces: ifaces.to_vec(), ..Offers::default() };
    if !nets.is_empty() {
        let net = format!("nccl_socket_net={}", nets_text(nets));
        if let Some((nccl, gloo)) = fabric_vars(nets, ifaces) {
            let why = format!("{net} on this node");
            out.offers.push(Offer { name: NCCL_VAR, value: nccl, why: why.clone(), held_by_conf: true });
            out.offers.push(Offer { name: GLOO_VAR, value: gloo, why, held_by_conf: true });
        } else {
            out.withheld.extend([NCCL_VAR, GLOO_VAR]);
            out.log.push(format!(
                "{net}: no running interface of {node} has an address in it ({node} has {}); \
                 NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME not set here: NCCL and gloo choose",
                has_text(ifaces)
            ));
        }
    }
    for (name, value) in defaults {
        if name == NCCL_VAR {
            if super::nccl_choice(Some(value), ifaces, None, NcclRules::Current).bootstrap.is_some() {
                out.offers.push(Offer {
                    name: NCCL_VAR,
                    value: value.clone(),
                    why: "site default".to_owned(),
                    held_by_conf: true,
                });
            } else {
                out.withheld.push(NCCL_VAR);
                out.log.push(format!(
                    "NCCL_SOCKET_IFNAME={value} (the plugstack line's) matches no running interface of \
                     {node} with an address ({node} has {}); not set here: NCCL chooses",
                    has_text(ifaces)
                ));
            }
        } else if name == GLOO_VAR {
            match gloo_choice(value, ifaces) {
                Ok(_) => out.offers.push(Offer {
                    name: GLOO_VAR,
                    value: value.clone(),
                    why: "site default".to_owned(),
                    held_by_conf: false,
                }),
                Err(e) => {
                    out.withheld.push(GLOO_VAR);
                    out.log
                        .push(format!("{e} (the plugstack line's, on {node}); not set here: gloo chooses"));
                }
            }
        }
    }
    out
}

/// The node's offers when its interfaces cannot be read: none, and one log
/// line when the plugstack line asks for any.
pub fn unreadable(nets: &[Cidr], defaults: &[(String, String)], why: &str, node: &str) -> Offers {
    let mut out = Offers::default();
    if !configured(nets, defaults) {
        return out;
    }
    out.withheld.extend([NCCL_VAR, GLOO_VAR]);
    out.log.push(format!(
        "the network interfaces of {node} cannot be read ({why}); NCCL_SOCKET_IFNAME and \
         GLOO_SOCKET_IFNAME not set here: NCCL and gloo choose"
    ));
    out
}

/// A NCCL configuration file's `NCCL_SOCKET_IFNAME`: `Ok(None)` when there is
/// no file or it sets none, `Err` when it cannot be told.
pub type ConfRead = Result<Option<String>, String>;

/// What one node knows for its tasks, worked out once per step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNet {
    /// The node's name, for the lines.
    pub node: String,
    /// Its interfaces (`Err`: why they cannot be read).
    pub ifaces: Result<Vec<Interface>, String>,
    /// What the plugin may set here.
    pub offers: Offers,
    /// [`SITE_CONF`]'s `NCCL_SOCKET_IFNAME`.
    pub site_conf: ConfRead,
    /// The host name gloo looks up (`gethostname()`), when known.
    pub hostname: Option<String>,
    /// What [`HOSTS_FILE`] gives it (`Err`: the file cannot be read).
    pub hosts: Result<Vec<IpAddr>, String>,
}

/// What one task gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskIfaces {
    /// The offers to plan (a user's value is then kept by the task plan).
    pub set: Vec<Offer>,
    /// Names to remove: values the plugin set in an enclosing step that it
    /// does not set here.
    pub unset: Vec<&'static str>,
    /// Why the offers NCCL's configuration holds back are not set.
    pub held: Option<String>,
    /// A detection error to log (once per node).
    pub problem: Option<String>,
}

/// One task's part of the node's offers. `env` answers the task's
/// environment, `record` is the plugin's record from an enclosing step
/// ([`crate::rdzv::RECORD_VAR`]), `site` is [`SITE_CONF`]'s value, and `user`
/// reads `~/.nccl.conf` (only called when it decides).
pub fn for_task(
    offers: &Offers,
    env: &dyn Fn(&str) -> Option<String>,
    record: Option<&str>,
    site: &ConfRead,
    user: &mut dyn FnMut() -> ConfRead,
) -> TaskIfaces {
    let users = |name: &str| env(name).is_some_and(|v| crate::record::user_set(name, &v, record));
    let mut out = TaskIfaces::default();
    if offers.offers.iter().any(|o| o.held_by_conf && !users(o.name)) {
        out.held = if let Some(file) = env(CONF_FILE_VAR) {
            Some(format!("{CONF_FILE_VAR}={file} is set: NCCL reads that file, which spank-gpu does not"))
        } else {
            match site {
                Ok(Some(v)) => Some(format!("{SITE_CONF} sets {NCCL_VAR}={v}")),
                // Logged once by user_init.
                Err(e) => Some(format!("{SITE_CONF} cannot be read ({e})")),
                Ok(None) => match user() {
                    Ok(Some(v)) => Some(format!("~/{USER_CONF} sets {NCCL_VAR}={v}")),
                    Ok(None) => None,
                    Err(e) => {
                        out.problem = Some(format!(
                            "~/{USER_CONF} cannot be read ({e}); {NCCL_VAR} and {GLOO_VAR} not set"
                        ));
                        Some(format!("~/{USER_CONF} cannot be read ({e})"))
                    }
                },
            }
        };
    }
    out.set = offers.offers.iter().filter(|o| !(o.held_by_conf && out.held.is_some())).cloned().collect();
    // A value the plugin set in an enclosing step (its record's hash matches)
    // that it does not set here is removed only where it names no running
    // interface of this node: another node's fabric name. One that works here
    // stays, whoever set it (a user may have exported the same value).
    let works_here = |name: &str, value: &str| {
        let running = |i: &&Interface| i.up && i.running && !i.addrs.is_empty();
        if name == NCCL_VAR {
            IfList::parse(value)
                .is_some_and(|l| offers.ifaces.iter().filter(running).any(|i| l.matches(&i.name)))
        } else {
            value.split(',').any(|n| offers.ifaces.iter().filter(running).any(|i| i.name == n.trim()))
        }
    };
    for name in [NCCL_VAR, GLOO_VAR] {
        let set_here = out.set.iter().any(|o| o.name == name);
        let plugins =
            env(name).is_some_and(|v| !crate::record::user_set(name, &v, record) && !works_here(name, &v));
        if !set_here && plugins {
            out.unset.push(name);
        }
    }
    out
}

/// Where a task's interface variable comes from, as NCCL (or gloo) will
/// read it: the value and who gave it, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The value (`None`: the library's default).
    pub value: Option<String>,
    /// Who gave it, or why none.
    pub from: String,
}

impl Source {
    /// The task's value of a variable: `plugin` is the plugin's reason when
    /// the plugin set it.
    pub fn of_env(value: Option<&str>, plugin: Option<&str>) -> Source {
        match (value, plugin) {
            (Some(v), Some(why)) => {
                Source { value: Some(v.to_owned()), from: format!("set by spank-gpu: {why}") }
            }
            (Some(v), None) => Source { value: Some(v.to_owned()), from: "set by you".to_owned() },
            (None, _) => Source { value: None, from: "unset".to_owned() },
        }
    }
}

/// `NCCL_SOCKET_IFNAME` as NCCL will have it: the environment first, then
/// `NCCL_CONF_FILE` (not read) or `~/.nccl.conf`, then [`SITE_CONF`].
pub fn nccl_source(
    env: Source,
    conf_file: Option<&str>,
    user_conf: &ConfRead,
    site_conf: &ConfRead,
) -> Source {
    if env.value.is_some() {
        return env;
    }
    let site = site_conf.as_ref().ok().cloned().flatten();
    if let Some(file) = conf_file {
        let from = format!("{CONF_FILE_VAR}={file} may set it first (spank-gpu does not read that file)");
        return match site {
            Some(v) => Source { value: Some(v), from: format!("{SITE_CONF}, unless {from}") },
            None => Source { value: None, from },
        };
    }
    if let Ok(Some(v)) = user_conf {
        return Source { value: Some(v.clone()), from: format!("~/{USER_CONF}") };
    }
    if let Some(v) = site {
        return Source { value: Some(v), from: SITE_CONF.to_owned() };
    }
    let unread: Vec<String> = [(format!("~/{USER_CONF}"), user_conf), (SITE_CONF.to_owned(), site_conf)]
        .into_iter()
        .filter_map(|(f, r)| r.as_ref().err().map(|e| format!("{f} cannot be read: {e}")))
        .collect();
    let from = if unread.is_empty() { "unset".to_owned() } else { format!("unset ({})", unread.join("; ")) };
    Source { value: None, from }
}

/// What NCCL and gloo will use on a node, for a task's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The node.
    pub node: String,
    /// NCCL's choice, in words.
    pub nccl: String,
    /// Older NCCL's choice (before 2.28.3), where it differs.
    pub older: Option<String>,
    /// gloo's, in words.
    pub gloo: String,
    /// What will go wrong.
    pub warnings: Vec<String>,
    /// The `NCCL_DEBUG=INFO` lines that confirm NCCL's choice, each with when
    /// NCCL prints it.
    pub confirm: Vec<(String, &'static str)>,
}

fn pick_kind(p: &Pick, ifaces: &[Interface]) -> Option<&'static str> {
    let iface = ifaces.iter().find(|i| i.name == p.name);
    if iface.is_some_and(|i| i.loopback) || p.name == "lo" || p.ip.is_loopback() {
        Some("the loopback")
    } else if local_only(&p.ip) {
        Some("a link-local address")
    } else if iface.is_some_and(Interface::is_virtual) {
        Some("a virtual interface (containers, libvirt, overlays, tunnels)")
    } else {
        None
    }
}

fn choice_words(c: &NcclChoice) -> Option<String> {
    let b = c.bootstrap.as_ref()?;
    let socks: Vec<String> = c.sockets.iter().map(ToString::to_string).collect();
    Some(format!("bootstrap {b}, sockets {}", socks.join(" ")))
}

/// NCCL's address text (`ncclSocketToString`: `ADDR<PORT>`, the port 0
/// when the interface is chosen).
fn nccl_addr(p: &Pick) -> String {
    format!("{}:{}<0>", p.name, p.ip)
}

/// What NCCL (with the task's `NCCL_SOCKET_IFNAME`, `nccl`, and
/// `NCCL_SOCKET_FAMILY`) and gloo (with its `GLOO_SOCKET_IFNAME`, `gloo`)
/// will use on the node.
pub fn report(net: &NodeNet, nccl: &Source, family: Option<Family>, gloo: &Source) -> Report {
    let mut out = Report {
        node: net.node.clone(),
        nccl: String::new(),
        older: None,
        gloo: String::new(),
        warnings: Vec::new(),
        confirm: Vec::new(),
    };
    let given = match &nccl.value {
        Some(v) => format!("{NCCL_VAR}={v}, {}", nccl.from),
        None if nccl.from == "unset" => format!("{NCCL_VAR} unset"),
        None => format!("{NCCL_VAR} {}", nccl.from),
    };
    let ifaces = match &net.ifaces {
        Ok(ifaces) => ifaces,
        Err(e) => {
            out.nccl = format!("unknown: the interfaces cannot be read ({e}); {given}");
            out.gloo = match &gloo.value {
                Some(v) => format!("{GLOO_VAR}={v} ({})", gloo.from),
                None => "unknown".to_owned(),
            };
            return out;
        }
    };
    let now = super::nccl_choice(nccl.value.as_deref(), ifaces, family, NcclRules::Current);
    // NCCL's own rule, where it chose (unset, or a value it ignores).
    let rule = if now.rule.starts_with("NCCL's default") { format!("; {}", now.rule) } else { String::new() };
    match choice_words(&now) {
        Some(words) => out.nccl = format!("{words} ({given}{rule})"),
        None => {
            out.nccl = format!("no interface ({given}{rule})");
            out.warnings.push(format!(
                "NCCL finds no interface on {}: it fails with \"Bootstrap : no socket interface found\"",
                net.node
            ));
        }
    }
    if nccl.value.is_none() {
        let old = super::nccl_choice(None, ifaces, family, NcclRules::Before2283);
        if old.bootstrap != now.bootstrap {
            out.older = Some(choice_words(&old).unwrap_or_else(|| "no interface".to_owned()));
        }
    }
    if let Some(b) = &now.bootstrap {
        if let Some(kind) = pick_kind(b, ifaces) {
            out.warnings.push(format!(
                "NCCL bootstraps over {b}, {kind}: ranks on other nodes cannot reach it; \
                 set {NCCL_VAR} (or ask your admin for nccl_socket_net)"
            ));
        }
        out.confirm.push((format!("NCCL INFO Bootstrap: Using {}", nccl_addr(b)), "always"));
        let socks: Vec<String> =
            now.sockets.iter().enumerate().map(|(n, p)| format!("[{n}]{}", nccl_addr(p))).collect();
        out.confirm.push((
            format!("NCCL INFO NET/Socket : Using {}", socks.join(" ")),
            "when the data goes over sockets, without RDMA",
        ));
        out.confirm.push((format!("NCCL INFO NET/IB : Using [0]... ; OOB {}", nccl_addr(b)), "with IB/RoCE"));
    }
    out.gloo = gloo_words(net, ifaces, gloo, now.bootstrap.as_ref(), &mut out.warnings);
    out
}

/// gloo's choice: `GLOO_SOCKET_IFNAME`'s exact names, else the host name's
/// first address that binds, as `/etc/hosts` gives it.
fn gloo_words(
    net: &NodeNet,
    ifaces: &[Interface],
    gloo: &Source,
    nccl: Option<&Pick>,
    warnings: &mut Vec<String>,
) -> String {
    if let Some(v) = &gloo.value {
        return match gloo_choice(v, ifaces) {
            Ok(picks) => {
                let picks: Vec<String> = picks.iter().map(ToString::to_string).collect();
                format!("{} ({GLOO_VAR}={v}, {})", picks.join(" "), gloo.from)
            }
            Err(e) => {
                warnings.push(format!("gloo fails: {e}"));
                format!("none ({GLOO_VAR}={v}, {})", gloo.from)
            }
        };
    }
    let fix = match nccl.filter(|p| pick_kind(p, ifaces).is_none()) {
        Some(p) => format!("set {GLOO_VAR}={}", p.name),
        None => format!("set {GLOO_VAR} to the fabric's interface"),
    };
    let Some(host) = &net.hostname else {
        return format!("the address of the host name ({GLOO_VAR} unset)");
    };
    let addrs = match &net.hosts {
        Err(e) => {
            return format!("the address of {host} ({GLOO_VAR} unset; {HOSTS_FILE} cannot be read: {e})");
        }
        Ok(a) if a.is_empty() => {
            return format!("the address DNS gives {host} ({GLOO_VAR} unset; {host} is not in {HOSTS_FILE})");
        }
        Ok(a) => a,
    };
    if let Some(lo) = addrs.iter().find(|a| a.is_loopback()) {
        warnings.push(format!(
            "{HOSTS_FILE} maps {host} to {lo}, a loopback address: gloo ({GLOO_VAR} unset) binds it and \
             ranks on other nodes cannot connect; {fix}"
        ));
        return format!("{lo} ({GLOO_VAR} unset: {HOSTS_FILE} gives {host} {lo})");
    }
    let holder = addrs.iter().find_map(|a| {
        ifaces
            .iter()
            .find(|i| i.addrs.iter().any(|x| x.ip == *a))
            .map(|i| Pick { name: i.name.clone(), ip: *a })
    });
    match holder {
        Some(p) => format!("{p} ({GLOO_VAR} unset: {HOSTS_FILE} gives {host} {})", p.ip),
        None => {
            let a = addrs[0];
            warnings.push(format!(
                "{HOSTS_FILE} gives {host} {a}, which no interface here has: gloo ({GLOO_VAR} unset) \
                 falls back to 127.0.0.1 and ranks on other nodes cannot connect; {fix}"
            ));
            format!("127.0.0.1 ({GLOO_VAR} unset: {HOSTS_FILE} gives {host} {a}, not an address here)")
        }
    }
}

impl Report {
    /// The one line `--auto-rdzv=verbose` prints once per node.
    pub fn line(&self) -> String {
        let mut s = format!("spank-gpu: network on {}: NCCL {}; gloo {}", self.node, self.nccl, self.gloo);
        for w in &self.warnings {
            let _ = write!(s, "; WARNING: {w}");
        }
        if let Some((first, _)) = self.confirm.first() {
            let _ = write!(s, "; NCCL_DEBUG=INFO prints \"{first}\"");
        }
        s
    }

    /// The section `spank-gpu explain` prints.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!("network on {} (its live interfaces):", self.node)];
        out.push(format!("  NCCL: {}", self.nccl));
        if let Some(old) = &self.older {
            out.push(format!("  NCCL before 2.28.3: {old}"));
        }
        out.push(format!("  gloo: {}", self.gloo));
        for w in &self.warnings {
            out.push(format!("  warning: {w}"));
        }
        if !self.confirm.is_empty() {
            out.push(
                "  to confirm, run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,BOOTSTRAP; NCCL prints:"
                    .to_owned(),
            );
            for (line, when) in &self.confirm {
                out.push(format!("    {line}   ({when})"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
