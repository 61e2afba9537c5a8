//! The node's network interfaces, for `status` and one metric: diagnostics
//! only, never a drain.
//!
//! `status` lists each interface (name, state, addresses, link speed, the
//! RDMA device behind it, its NUMA node), says what NCCL would pick here by
//! its own rules (`task_plan::netif::nccl_choice`, `NCCL_SOCKET_IFNAME`
//! unset), and, when the plugstack line of spank_gpu sets
//! `nccl_socket_net=CIDR[,CIDR]`, which interfaces carry an address in that
//! network (`task_plan::netif::on_nets`, the rule the plugin will use), or that
//! none does. The metric `gpu_node_agent_fabric_interfaces{net}` counts them,
//! written only when `nccl_socket_net` is set.
//!
//! The node is read through [`NodeNet`]: [`System`] asks `getifaddrs(3)`
//! (through `node_info`: this crate forbids `unsafe`) and sysfs
//! under a root directory; tests give a stand-in whose every call can fail.
//! What cannot be read is said in one line, and the rest is still shown.
//! Everything else here is plain functions of plain data.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;

use task_plan::netif::{self, Cidr, Interface, NcclChoice, NcclRules};
use task_plan::plugstack::PluginConfig;

use crate::slurm::release::ReleaseCheck;

/// What the agent asks of the node about its network.
pub trait NodeNet {
    /// The interfaces, their flags and addresses, in `getifaddrs()` order.
    ///
    /// # Errors
    /// The list cannot be read.
    fn interfaces(&self) -> io::Result<Vec<Interface>>;
    /// The link speed in Mb/s; `None` where the kernel gives none (`-1`, a
    /// link that is down or virtual, no such file).
    ///
    /// # Errors
    /// The file is there but cannot be read.
    fn speed(&self, name: &str) -> io::Result<Option<u32>>;
    /// The NUMA node of the interface's device; `None` for `-1` or no device.
    ///
    /// # Errors
    /// The file is there but cannot be read.
    fn numa_node(&self, name: &str) -> io::Result<Option<u32>>;
    /// The RDMA devices behind the interface (`mlx5_0`), sorted; empty for
    /// plain Ethernet and virtual interfaces.
    ///
    /// # Errors
    /// The directory is there but cannot be read.
    fn rdma_devices(&self, name: &str) -> io::Result<Vec<String>>;
}

/// The node itself: `getifaddrs()` and `SYSFS/class/net/IF/...`.
#[derive(Clone, Debug)]
pub struct System {
    /// Where sysfs is mounted (`/sys`).
    pub sysfs: PathBuf,
}

impl Default for System {
    fn default() -> Self {
        System { sysfs: PathBuf::from("/sys") }
    }
}

/// Interfaces as `getifaddrs()` lists them: one entry per address (and one
/// without, `AF_PACKET`, per interface), grouped by name in the order the
/// names first appear ([`netif::group`]).
pub fn from_entries(entries: Vec<node_info::IfAddr>) -> Vec<Interface> {
    netif::group(entries.into_iter().map(|e| netif::Entry::from_flags(e.name, e.flags, e.addr, e.prefix)))
}

impl System {
    /// `SYSFS/class/net/NAME/REST`; `None` for a name that is not one path
    /// component (the kernel allows no `/`, and `.`/`..` are not interfaces).
    fn path(&self, name: &str, rest: &str) -> Option<PathBuf> {
        let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
        plain.then(|| self.sysfs.join("class/net").join(name).join(rest))
    }

    /// A small sysfs file's number; `None` when the kernel gives none: no
    /// file, `EINVAL` (the speed of a link that is down or virtual), a
    /// negative number.
    fn number(&self, name: &str, rest: &str) -> io::Result<Option<u32>> {
        let Some(path) = self.path(name, rest) else { return Ok(None) };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(text.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())),
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::EINVAL) => {
                Ok(None)
            }
            Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
}

impl NodeNet for System {
    fn interfaces(&self) -> io::Result<Vec<Interface>> {
        node_info::getifaddrs().map(from_entries)
    }

    fn speed(&self, name: &str) -> io::Result<Option<u32>> {
        self.number(name, "speed")
    }

    fn numa_node(&self, name: &str) -> io::Result<Option<u32>> {
        self.number(name, "device/numa_node")
    }

    fn rdma_devices(&self, name: &str) -> io::Result<Vec<String>> {
        let Some(dir) = self.path(name, "device/infiniband") else { return Ok(Vec::new()) };
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        };
        let mut names: Vec<String> =
            entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        Ok(names)
    }
}

/// One interface and what sysfs says of it (`None`: not known, or not read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetIf {
    /// Its name, flags and addresses.
    pub iface: Interface,
    /// Link speed, Mb/s.
    pub speed: Option<u32>,
    /// Its device's NUMA node.
    pub numa: Option<u32>,
    /// The RDMA devices behind it.
    pub rdma: Vec<String>,
}

/// What the plugstack line says of the fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fabric {
    /// No `spank_gpu.so` line (the plugin lines of `status` say why).
    NoPlugin,
    /// The line's arguments do not parse: the plugin does nothing.
    BadLine(String),
    /// No `nccl_socket_net=` on the line.
    Unset,
    /// `nccl_socket_net=`'s networks.
    Nets(Vec<Cidr>),
}

impl Fabric {
    /// From the first `spank_gpu.so` line the plugstack files list (parsed
    /// as the plugin parses it: a debug build's test keys only in a debug
    /// agent, the two being built together).
    pub fn of(check: &ReleaseCheck) -> Fabric {
        let Some(first) = check.plugins.iter().map(|p| &p.listed).min_by_key(|l| l.seq) else {
            return Fabric::NoPlugin;
        };
        match PluginConfig::parse(&first.args, cfg!(debug_assertions)) {
            Ok(c) if c.nccl_socket_net.is_empty() => Fabric::Unset,
            Ok(c) => Fabric::Nets(c.nccl_socket_net),
            Err(e) => Fabric::BadLine(format!("{}:{}: {e}", first.file.display(), first.line)),
        }
    }

    /// The networks, when set.
    pub fn nets(&self) -> Option<&[Cidr]> {
        match self {
            Fabric::Nets(n) => Some(n),
            _ => None,
        }
    }
}

/// What `status` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// The interfaces, or why they could not be listed.
    pub ifaces: Result<Vec<NetIf>, String>,
    /// What could not be read of them, in words (`ib0 speed: ...`).
    pub unread: Vec<String>,
    /// The plugstack line's `nccl_socket_net`.
    pub fabric: Fabric,
}

/// Reads the interfaces and what sysfs says of each; a call that fails
/// leaves its field unknown and is named in [`Network::unread`].
pub fn gather(node: &dyn NodeNet, fabric: Fabric) -> Network {
    let mut unread = Vec::new();
    let ifaces = node.interfaces().map_err(|e| format!("getifaddrs: {e}")).map(|list| {
        list.into_iter()
            .map(|iface| {
                let name = iface.name.as_str();
                let speed = known(&mut unread, name, "speed", node.speed(name));
                let numa = known(&mut unread, name, "numa_node", node.numa_node(name));
                let rdma = known(&mut unread, name, "RDMA device", node.rdma_devices(name));
                NetIf { speed, numa, rdma, iface }
            })
            .collect()
    });
    Network { ifaces, unread, fabric }
}

/// A value read, or the default with the failure noted.
fn known<T: Default>(unread: &mut Vec<String>, name: &str, what: &str, r: io::Result<T>) -> T {
    r.unwrap_or_else(|e| {
        unread.push(format!("{name} {what}: {e}"));
        T::default()
    })
}

/// A state in words: `running`, `no-carrier` (up, no link) or `down`.
fn state(i: &Interface) -> &'static str {
    match (i.up, i.running) {
        (true, true) => "running",
        (true, false) => "no-carrier",
        (false, _) => "down",
    }
}

/// A link speed as people say it: `200 Gb/s`, `100 Mb/s`.
fn speed_text(mbps: Option<u32>) -> String {
    match mbps {
        None => "-".to_owned(),
        Some(m) if m >= 1000 && m % 1000 == 0 => format!("{} Gb/s", m / 1000),
        Some(m) => format!("{m} Mb/s"),
    }
}

fn addrs_text(i: &Interface) -> String {
    if i.addrs.is_empty() {
        return "-".to_owned();
    }
    i.addrs.iter().map(|a| format!("{}/{}", a.ip, a.prefix)).collect::<Vec<_>>().join(" ")
}

/// The interface table, one row per interface.
pub fn table(ifaces: &[NetIf]) -> String {
    let rows: Vec<[String; 6]> = ifaces
        .iter()
        .map(|n| {
            [
                n.iface.name.clone(),
                state(&n.iface).to_owned(),
                speed_text(n.speed),
                if n.rdma.is_empty() { "-".to_owned() } else { n.rdma.join(",") },
                n.numa.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                addrs_text(&n.iface),
            ]
        })
        .collect();
    let head = ["IF", "STATE", "SPEED", "RDMA", "NUMA", "ADDRESSES"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(head.map(str::to_owned)).chain(rows) {
        let mut line = String::from("  ");
        for (c, w) in r.iter().zip(width).take(5) {
            let _ = write!(line, "{c:<w$}  ");
        }
        line.push_str(&r[5]);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn nets_text(nets: &[Cidr]) -> String {
    nets.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Why an interface with an address in the networks is not one the plugin
/// would use, or `None` when it is.
fn left_out(i: &Interface) -> Option<&'static str> {
    if i.loopback || i.name == "lo" {
        Some("loopback")
    } else if i.is_virtual() {
        Some("a virtual interface (containers, libvirt, overlays, tunnels)")
    } else if !i.up {
        Some("down")
    } else if !i.running {
        Some("no carrier")
    } else {
        None
    }
}

/// What `nccl_socket_net` finds on this node: the interfaces with an
/// address in it (the plugin's rule, [`netif::on_nets`]) and those left out
/// with why; or that none has one, with what the node has.
pub fn fabric_lines(nets: &[Cidr], ifaces: &[Interface]) -> Vec<String> {
    let name = format!("nccl_socket_net={}", nets_text(nets));
    let inside = |i: &Interface| -> Vec<String> {
        i.addrs
            .iter()
            .filter(|a| nets.iter().any(|n| n.contains(&a.ip)))
            .map(|a| format!("{}/{}", a.ip, a.prefix))
            .collect()
    };
    let found = netif::on_nets(nets, ifaces);
    let mut out = Vec::new();
    if found.is_empty() {
        let has: Vec<String> = ifaces
            .iter()
            .filter(|i| !i.loopback && i.name != "lo")
            .map(|i| {
                let st = if i.up && i.running { String::new() } else { format!(", {}", state(i)) };
                format!("{} ({}{st})", i.name, addrs_text(i))
            })
            .collect();
        out.push(format!(
            "{name}: NOT on this node: no running interface has an address in it (this node has: {})",
            if has.is_empty() { "no interface but the loopback".to_owned() } else { has.join(", ") }
        ));
    } else {
        let on: Vec<String> = found.iter().map(|i| format!("{} ({})", i.name, inside(i).join(" "))).collect();
        out.push(format!("{name}: on {}", on.join(", ")));
    }
    for i in ifaces.iter().filter(|i| !found.iter().any(|f| f.name == i.name)) {
        let addrs = inside(i);
        if addrs.is_empty() {
            continue;
        }
        let why = left_out(i).unwrap_or("its address is link-local");
        out.push(format!("{name}: {} has {} but is left out: {why}", i.name, addrs.join(" ")));
    }
    out
}

fn choice_text(c: &NcclChoice) -> String {
    match &c.bootstrap {
        None => format!("no interface ({}): NCCL fails to start", c.rule),
        Some(b) => {
            let socks: Vec<String> = c.sockets.iter().map(ToString::to_string).collect();
            format!("bootstrap {b}, sockets {} ({})", socks.join(" "), c.rule)
        }
    }
}

/// What NCCL picks here by its own rules, `NCCL_SOCKET_IFNAME` unset (and
/// by the rules before 2.28.3 when they differ), and, with
/// `nccl_socket_net`, whether its bootstrap is on that network.
pub fn nccl_lines(ifaces: &[Interface], nets: Option<&[Cidr]>) -> Vec<String> {
    let now = netif::nccl_choice(None, ifaces, None, NcclRules::Current);
    let old = netif::nccl_choice(None, ifaces, None, NcclRules::Before2283);
    let mut out = vec![format!("NCCL's own choice here (NCCL_SOCKET_IFNAME unset): {}", choice_text(&now))];
    if old != now {
        out.push(format!("NCCL before 2.28.3 would take: {}", choice_text(&old)));
    }
    if let (Some(nets), Some(b)) = (nets, &now.bootstrap) {
        let fabric = netif::on_nets(nets, ifaces);
        if !fabric.iter().any(|i| i.name == b.name) {
            let use_them: Vec<&str> = fabric.iter().map(|i| i.name.as_str()).collect();
            out.push(format!(
                "NOTE: NCCL's own choice, {}, is not on nccl_socket_net={}: without NCCL_SOCKET_IFNAME, \
                 NCCL bootstraps (and sends socket traffic) over {}{}",
                b.name,
                nets_text(nets),
                b.name,
                if use_them.is_empty() {
                    String::new()
                } else {
                    format!(", not over {}", use_them.join(", "))
                }
            ));
        }
    }
    out
}

/// The network block of `status`: every line starts with `network:`, the
/// interface table indented below its heading.
pub fn status_text(n: &Network) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut table_text = None;
    let nets = n.fabric.nets();
    match &n.fabric {
        Fabric::NoPlugin | Fabric::Nets(_) => {}
        Fabric::Unset => lines.push("nccl_socket_net is not set on the spank_gpu line".to_owned()),
        Fabric::BadLine(e) => {
            lines.push(format!(
                "nccl_socket_net not read: the spank_gpu line does not parse, so the plugin does nothing ({e})"
            ));
        }
    }
    match &n.ifaces {
        Err(e) => {
            lines.push(format!("cannot list the interfaces ({e}): no table, no NCCL prediction"));
            if let Some(nets) = nets {
                lines.push(format!("nccl_socket_net={}: not checked", nets_text(nets)));
            }
        }
        Ok(list) => {
            table_text = Some(table(list));
            let ifaces: Vec<Interface> = list.iter().map(|i| i.iface.clone()).collect();
            if let Some(nets) = nets {
                lines.extend(fabric_lines(nets, &ifaces));
            }
            lines.extend(nccl_lines(&ifaces, nets));
        }
    }
    if !n.unread.is_empty() {
        lines.push(format!("could not read: {}", n.unread.join("; ")));
    }
    let mut out = String::new();
    if let Some(t) = table_text {
        out.push_str(
            "network: interfaces (getifaddrs; speed, RDMA device and NUMA node from /sys/class/net):\n",
        );
        out.push_str(&t);
    }
    for l in lines {
        let _ = writeln!(out, "network: {l}");
    }
    out
}

/// The metric `gpu_node_agent_fabric_interfaces{net}`: per network of
/// `nccl_socket_net`, the interfaces the plugin's rule finds on it (0 when
/// none); written only when `nccl_socket_net` is set, and with no row when
/// the interfaces cannot be listed.
pub fn metrics_text(node: &str, nets: &[Cidr], ifaces: &Result<Vec<Interface>, String>) -> String {
    if nets.is_empty() {
        return String::new();
    }
    let label = crate::exposition::label_value;
    let mut m = String::from(
        "# HELP gpu_node_agent_fabric_interfaces Running interfaces (not loopback or virtual) with an \
         address in the network net of the plugstack line's nccl_socket_net; 0: the fabric is not on this node\n\
         # TYPE gpu_node_agent_fabric_interfaces gauge\n",
    );
    if let Ok(ifaces) = ifaces {
        for net in nets {
            let n = netif::on_nets(std::slice::from_ref(net), ifaces).len();
            let _ =
                writeln!(m, "gpu_node_agent_fabric_interfaces{{node=\"{}\",net=\"{net}\"}} {n}", label(node));
        }
    }
    m
}

/// The daemon's metric, read from the node (only when `nccl_socket_net` is set).
pub fn node_metrics(node_name: &str, fabric: &Fabric, node: &dyn NodeNet) -> String {
    let Some(nets) = fabric.nets() else { return String::new() };
    let ifaces = node.interfaces().map_err(|e| e.to_string());
    if let Err(e) = &ifaces {
        tracing::warn!(error = %e, "cannot list the network interfaces");
    }
    metrics_text(node_name, nets, &ifaces)
}

#[cfg(test)]
mod tests;
