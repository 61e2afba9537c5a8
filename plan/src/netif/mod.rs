//! Network interfaces as NCCL and gloo choose them: NCCL's own rules for
//! `NCCL_SOCKET_IFNAME` (and for its absence), gloo's `GLOO_SOCKET_IFNAME`,
//! and the admin's `nccl_socket_net=CIDR[,CIDR]` (the fabric named by its
//! network, not by a name that differs from node to node).
//!
//! The rules are NCCL 2.30's `ncclFindInterfaces` / `ncclOsFindInterfaces`
//! (src/misc/socket.cc, src/os/linux.cc) and `matchIfList` (src/misc/utils.cc),
//! and gloo's `lookupAddrForIface` (gloo/transport/tcp/device.cc), as
//! `../shared/reference/nccl-interfaces.md` records them:
//!
//! - an entry is kept when it has an IPv4 or IPv6 address (not `::1`), is
//!   running (`IFF_RUNNING`, from NCCL 2.28.3; before, any address counted),
//!   matches the list and was not taken already; entries come in
//!   `getifaddrs()` order, all IPv4 addresses first, then IPv6;
//! - a list is comma-separated; a leading `^` excludes, then a leading `=`
//!   makes every entry exact; otherwise an entry is a name prefix; a value of
//!   one character or less is ignored;
//! - unset: `ib*` first, else anything but `docker*`, `lo*`, `virbr*`
//!   (`virbr` from 2.28.3), else `docker*`, else `lo*`, else `virbr*`;
//! - gloo takes one exact name (or a comma list of exact names), no `^`,
//!   `=` or prefix, and no running check.
//!
//! Pure: the interfaces come in as data ([`Interface`]).

use std::fmt;
use std::net::IpAddr;

/// One address of an interface, as `getifaddrs()` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length (from the netmask).
    pub prefix: u8,
}

/// A network interface of the node (or of the task's network namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Its name (`ib0`, `ens1f0np0`).
    pub name: String,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_RUNNING` (carrier).
    pub running: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
    /// Its addresses, in `getifaddrs()` order.
    pub addrs: Vec<Address>,
}

impl Interface {
    /// Whether the name is one of the virtual kinds a fabric never is:
    /// containers' bridges and pairs, libvirt, CNI overlays, tunnels.
    pub fn is_virtual(&self) -> bool {
        const VIRTUAL: [&str; 14] = [
            "docker",
            "veth",
            "virbr",
            "br-",
            "cni",
            "cilium",
            "lxc",
            "flannel",
            "pod-id-link",
            "tun",
            "tap",
            "vxlan",
            "kube",
            "podman",
        ];
        VIRTUAL.iter().any(|p| self.name.starts_with(p))
    }

    /// Whether this interface may ever be chosen by the plugin: running, not
    /// loopback, not virtual.
    pub fn eligible(&self) -> bool {
        self.up && self.running && !self.loopback && !self.is_virtual() && self.name != "lo"
    }
}

/// One entry of `getifaddrs()`'s list, as plain data: an interface's name
/// and flags, and one of its addresses (`None` for the `AF_PACKET` entry
/// every interface has).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `ifa_name`.
    pub name: String,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_RUNNING`.
    pub running: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
    /// An IPv4 or IPv6 address.
    pub addr: Option<IpAddr>,
    /// Its netmask's length.
    pub prefix: Option<u8>,
}

/// Linux's `IFF_UP`, `IFF_LOOPBACK` and `IFF_RUNNING` (`<net/if.h>`), as
/// `getifaddrs()` gives them in `ifa_flags`.
pub const IFF_UP: u32 = 0x1;
/// See [`IFF_UP`].
pub const IFF_LOOPBACK: u32 = 0x8;
/// See [`IFF_UP`].
pub const IFF_RUNNING: u32 = 0x40;

impl Entry {
    /// An entry from `getifaddrs()`'s raw fields (`ifa_flags` as given).
    pub fn from_flags(name: String, flags: u32, addr: Option<IpAddr>, prefix: Option<u8>) -> Entry {
        Entry {
            name,
            up: flags & IFF_UP != 0,
            running: flags & IFF_RUNNING != 0,
            loopback: flags & IFF_LOOPBACK != 0,
            addr,
            prefix,
        }
    }
}

/// An interface from a compact spec, for test fixtures (here and in the
/// agent's): `name FLAGS addr/len ...`, flags from `U` (up), `R` (running),
/// `L` (loopback); an address without a length is a host address, and a
/// word that is not an address is left out.
#[doc(hidden)]
pub fn fixture(spec: &str) -> Interface {
    let mut words = spec.split_whitespace();
    let name = words.next().unwrap_or_default().to_owned();
    let flags = words.next().unwrap_or_default();
    let addrs = words
        .filter_map(|w| {
            let (ip, len) = w.split_once('/').unwrap_or((w, if w.contains(':') { "128" } else { "32" }));
            Some(Address { ip: ip.parse().ok()?, prefix: len.parse().ok()? })
        })
        .collect();
    Interface {
        name,
        up: flags.contains('U'),
        running: flags.contains('R'),
        loopback: flags.contains('L'),
        addrs,
    }
}

/// Interfaces from `getifaddrs()`'s entries: grouped by name in the order
/// the names first appear (NCCL's order), each address in list order; an
/// address without a netmask gets its family's full length.
pub fn group(entries: impl IntoIterator<Item = Entry>) -> Vec<Interface> {
    let mut out: Vec<Interface> = Vec::new();
    for e in entries {
        let at = match out.iter().position(|i| i.name == e.name) {
            Some(at) => at,
            None => {
                out.push(Interface {
                    name: e.name.clone(),
                    up: false,
                    running: false,
                    loopback: false,
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        let i = &mut out[at];
        i.up |= e.up;
        i.running |= e.running;
        i.loopback |= e.loopback;
        if let Some(ip) = e.addr {
            let full = if ip.is_ipv4() { 32 } else { 128 };
            i.addrs.push(Address { ip, prefix: e.prefix.unwrap_or(full) });
        }
    }
    out
}

/// Whether an address is loopback or link-local (never a fabric address).
pub fn local_only(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_loopback() || (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// An address family filter (`NCCL_SOCKET_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `AF_INET`.
    V4,
    /// `AF_INET6`.
    V6,
}

impl Family {
    /// `NCCL_SOCKET_FAMILY`'s value; NCCL ignores any other.
    pub fn from_env(v: Option<&str>) -> Option<Family> {
        match v {
            Some("AF_INET") => Some(Family::V4),
            Some("AF_INET6") => Some(Family::V6),
            _ => None,
        }
    }

    fn admits(self, ip: &IpAddr) -> bool {
        matches!((self, ip), (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_)))
    }
}

/// Which NCCL release's rules (they changed in 2.28.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclRules {
    /// 2.28.3 and later: `IFF_RUNNING` checked, `virbr*` held back.
    Current,
    /// Before 2.28.3.
    Before2283,
}

/// An `NCCL_SOCKET_IFNAME` value, parsed as NCCL parses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfList {
    /// `^`: the entries are excluded.
    pub exclude: bool,
    /// `=`: the entries are exact names, not prefixes.
    pub exact: bool,
    /// The entries (a `:port` tail dropped, as NCCL does for names).
    pub names: Vec<String>,
}

impl IfList {
    /// Parses a value; `None` when NCCL ignores it (one character or less).
    pub fn parse(value: &str) -> Option<IfList> {
        if value.len() <= 1 {
            return None;
        }
        let (exclude, rest) = match value.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, value),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let names = rest
            .split(',')
            .map(|e| e.split(':').next().unwrap_or(""))
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        Some(IfList { exclude, exact, names })
    }

    /// Whether a name is in the list (before `^` is applied).
    fn listed(&self, name: &str) -> bool {
        self.names.iter().any(|e| if self.exact { name == e } else { name.starts_with(e.as_str()) })
    }

    /// Whether NCCL keeps an interface of this name.
    pub fn matches(&self, name: &str) -> bool {
        self.listed(name) != self.exclude
    }

    /// Whether `lo` passes this list (an exclude list that does not name it).
    pub fn admits_loopback(&self) -> bool {
        self.matches("lo")
    }
}

impl fmt::Display for IfList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        f.write_str(&self.names.join(","))
    }
}

/// One interface NCCL would use, with the address it would bind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// The interface.
    pub name: String,
    /// Its address NCCL takes (the first of its family order).
    pub ip: IpAddr,
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.ip)
    }
}

/// NCCL's `ncclOsFindInterfaces`: the interfaces `keep` admits, at most
/// `max`, IPv4 addresses first (by interface order), then IPv6, each name once.
fn find<F: Fn(&str) -> bool>(
    ifaces: &[Interface],
    keep: F,
    family: Option<Family>,
    rules: NcclRules,
    max: usize,
) -> Vec<Pick> {
    let mut out: Vec<Pick> = Vec::new();
    for want_v4 in [true, false] {
        for i in ifaces {
            if rules == NcclRules::Current && !i.running {
                continue;
            }
            for a in &i.addrs {
                let v4 = a.ip.is_ipv4();
                if v4 != want_v4 || family.is_some_and(|f| !f.admits(&a.ip)) {
                    continue;
                }
                if matches!(a.ip, IpAddr::V6(v6) if v6.is_loopback()) {
                    continue;
                }
                if !keep(&i.name) || out.iter().any(|p| p.name == i.name) {
                    continue;
                }
                if out.len() < max {
                    out.push(Pick { name: i.name.clone(), ip: a.ip });
                }
            }
        }
    }
    out
}

/// What NCCL will use on this node: the bootstrap interface (one) and the
/// socket transport's interfaces (up to 16), and by which rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclChoice {
    /// `Bootstrap: Using IF:ADDR`; `None`: NCCL finds none and fails.
    pub bootstrap: Option<Pick>,
    /// `NET/Socket : Using [0]IF:ADDR ...`.
    pub sockets: Vec<Pick>,
    /// The rule that chose, in words.
    pub rule: String,
}

/// A rule on an interface's name.
type NameRule<'a> = dyn Fn(&str) -> bool + 'a;

/// The most interfaces NCCL's socket transport takes (`MAX_IFS`).
pub const MAX_IFS: usize = 16;

/// NCCL's choice for a value of `NCCL_SOCKET_IFNAME` (`None`: unset or
/// ignored), over the node's interfaces.
pub fn nccl_choice(
    ifname: Option<&str>,
    ifaces: &[Interface],
    family: Option<Family>,
    rules: NcclRules,
) -> NcclChoice {
    let pick = |keep: &dyn Fn(&str) -> bool, max| find(ifaces, keep, family, rules, max);
    if let Some(list) = ifname.and_then(IfList::parse) {
        let keep = |n: &str| list.matches(n);
        return NcclChoice {
            bootstrap: pick(&keep, 1).into_iter().next(),
            sockets: pick(&keep, MAX_IFS),
            rule: format!("NCCL_SOCKET_IFNAME={list}"),
        };
    }
    let held_back = |n: &str| {
        n.starts_with("docker")
            || n.starts_with("lo")
            || (rules == NcclRules::Current && n.starts_with("virbr"))
    };
    let classes: [(&str, &NameRule<'_>); 5] = [
        ("an ib* interface first", &|n: &str| n.starts_with("ib")),
        ("the first interface that is not docker*, lo or virbr*", &|n: &str| !held_back(n)),
        ("docker* (nothing else)", &|n: &str| n.starts_with("docker")),
        ("lo (nothing else)", &|n: &str| n.starts_with("lo")),
        ("virbr* (nothing else)", &|n: &str| n.starts_with("virbr")),
    ];
    for (rule, keep) in classes {
        let sockets = pick(keep, MAX_IFS);
        if let Some(first) = sockets.first().cloned() {
            return NcclChoice { bootstrap: Some(first), sockets, rule: format!("NCCL's default: {rule}") };
        }
    }
    NcclChoice { bootstrap: None, sockets: Vec::new(), rule: "NCCL's default: no interface".into() }
}

/// An IPv4 or IPv6 network, `ADDR/LEN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// The network's address (host bits cleared).
    pub net: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl Cidr {
    /// Parses `10.1.0.0/16` or `fd00::/64`; host bits set are refused (a
    /// typo for another network).
    ///
    /// # Errors
    /// Not `ADDR/LEN`, a length past the family's, or host bits set.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, len) = s.split_once('/').ok_or_else(|| format!("'{s}' is not ADDR/LEN"))?;
        let ip: IpAddr = addr.parse().map_err(|_| format!("'{addr}' is not an IP address"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len: u8 =
            len.parse().ok().filter(|l| *l <= max).ok_or_else(|| format!("'/{len}': 0 to {max}"))?;
        let c = Cidr { net: ip, len };
        if c.masked(&ip) != ip {
            return Err(format!("'{s}' has host bits set (the network is {}/{len})", c.masked(&ip)));
        }
        Ok(c)
    }

    fn masked(&self, ip: &IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(*v4);
                let mask = if self.len == 0 { 0 } else { u32::MAX << (32 - u32::from(self.len)) };
                IpAddr::V4((bits & mask).into())
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(*v6);
                let mask = if self.len == 0 { 0 } else { u128::MAX << (128 - u32::from(self.len)) };
                IpAddr::V6((bits & mask).into())
            }
        }
    }

    /// Whether `ip` is inside the network.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        ip.is_ipv4() == self.net.is_ipv4() && self.masked(ip) == self.net
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

/// Parses `nccl_socket_net=`'s value: one or more comma-separated CIDRs.
///
/// # Errors
/// An empty list or a bad CIDR.
pub fn parse_nets(value: &str) -> Result<Vec<Cidr>, String> {
    let nets: Vec<Cidr> = value.split(',').map(|c| Cidr::parse(c.trim())).collect::<Result<_, _>>()?;
    if nets.is_empty() {
        return Err("no network given".into());
    }
    Ok(nets)
}

/// The node's interfaces on the admin's networks: running, not loopback or
/// virtual, with an address inside one of `nets` that is not link-local,
/// in interface order.
pub fn on_nets<'a>(nets: &[Cidr], ifaces: &'a [Interface]) -> Vec<&'a Interface> {
    ifaces
        .iter()
        .filter(|i| i.eligible())
        .filter(|i| i.addrs.iter().any(|a| !local_only(&a.ip) && nets.iter().any(|n| n.contains(&a.ip))))
        .collect()
}

/// What the plugin sets for the fabric on this node: `NCCL_SOCKET_IFNAME`
/// in NCCL's exact form (`=if1,if2`) and `GLOO_SOCKET_IFNAME` (the first
/// name: gloo takes exact names only). `None` when this node has none.
pub fn fabric_vars(nets: &[Cidr], ifaces: &[Interface]) -> Option<(String, String)> {
    let found = on_nets(nets, ifaces);
    let first = found.first()?;
    let names: Vec<&str> = found.iter().map(|i| i.name.as_str()).collect();
    Some((format!("={}", names.join(",")), first.name.clone()))
}

/// Why an admin's `nccl_socket_ifname=` value is refused at parse time:
/// NCCL ignores it (one character), or it is an exclude list that lets `lo`
/// through (NCCL then binds the loopback first).
pub fn check_ifname_value(value: &str) -> Result<(), String> {
    let Some(list) = IfList::parse(value) else {
        return Err(format!("'{value}': NCCL ignores a value of one character or less"));
    };
    if list.names.is_empty() {
        return Err(format!("'{value}' names no interface"));
    }
    if list.exclude && list.admits_loopback() {
        return Err(format!(
            "'{value}' excludes some interfaces but not lo: NCCL would then bind the loopback first; add lo (^{}{},lo)",
            if list.exact { "=" } else { "" },
            list.names.join(",")
        ));
    }
    Ok(())
}

/// Whether a `NAME=VALUE` file as NCCL reads it (`setEnvFile`: a line
/// starting with `#` is a comment, the name ends at the first `=`, nothing
/// trimmed) sets `name`.
pub fn conf_sets(text: &str, name: &str) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_once('=')).any(|(k, _)| k == name)
}

/// The value a `NAME=VALUE` file as NCCL reads it gives `name`: the first
/// line that sets it (NCCL applies each line with `setenv(name, value, 0)`,
/// so a later line never replaces an earlier one), `None` when none does.
pub fn conf_value(text: &str, name: &str) -> Option<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// The addresses `/etc/hosts` gives `host` (its canonical name or an alias,
/// compared without case, as the C library's `files` source does), in file
/// order; empty when the file does not name it.
pub fn hosts_addrs(text: &str, host: &str) -> Vec<IpAddr> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let ip: IpAddr = words.next()?.parse().ok()?;
            words.any(|n| n.eq_ignore_ascii_case(host)).then_some(ip)
        })
        .collect()
}

/// gloo's interface for `GLOO_SOCKET_IFNAME` (exact names, comma-separated,
/// its first address), or why gloo fails on it: NCCL syntax, or a name this
/// node does not have (`Unable to find address for: X`).
///
/// # Errors
/// The value gloo cannot use on this node, in words.
pub fn gloo_choice(value: &str, ifaces: &[Interface]) -> Result<Vec<Pick>, String> {
    let mut out = Vec::new();
    for name in value.split(',') {
        if name.starts_with('^') || name.starts_with('=') {
            return Err(format!(
                "GLOO_SOCKET_IFNAME={value}: gloo takes exact names, not NCCL's ^ or = syntax"
            ));
        }
        let i = ifaces.iter().find(|i| i.name == name);
        let Some(a) = i.and_then(|i| i.addrs.first()) else {
            return Err(format!(
                "GLOO_SOCKET_IFNAME={value}: this node has no interface {name} with an address (gloo: Unable to find address for: {name})"
            ));
        };
        out.push(Pick { name: name.to_owned(), ip: a.ip });
    }
    Ok(out)
}

/// Whether a lint-time value of `NCCL_SOCKET_IFNAME` is a trap: an exclude
/// list that lets `lo` through. `None` when it is fine.
pub fn ifname_trap(value: &str) -> Option<String> {
    let list = IfList::parse(value)?;
    (list.exclude && list.admits_loopback()).then(|| {
        format!("NCCL_SOCKET_IFNAME={value} excludes interfaces but not lo: NCCL then bootstraps over the loopback and ranks on other nodes never connect")
    })
}

/// Whether a lint-time value of `GLOO_SOCKET_IFNAME` uses NCCL's syntax,
/// which gloo reads as a name. `None` when it does not.
pub fn gloo_trap(value: &str) -> Option<String> {
    (value.starts_with('^') || value.starts_with('=') || value.contains(",^")).then(|| {
        format!("GLOO_SOCKET_IFNAME={value} is NCCL's syntax: gloo takes exact names only (Unable to find address for: {value})")
    })
}

mod node;

pub use node::{
    CONF_FILE_VAR, ConfRead, FAMILY_VAR, GLOO_VAR, HOSTS_FILE, MAX_CONF, MAX_HOSTS, NCCL_VAR, NodeNet, Offer,
    Offers, Report, SITE_CONF, Source, TaskIfaces, USER_CONF, configured, for_task, is_interface_var,
    nccl_source, node_offers, report, unreadable,
};

#[cfg(test)]
mod tests;
