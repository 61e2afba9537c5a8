//! Where a Slurm node can be reached, for `master_addr=hostname|addr`.
//!
//! `MASTER_ADDR` is the first node's NodeName by default. Where NodeName does
//! not resolve on the compute nodes (cloud nodes, a separate high-speed
//! network), the admin chooses NodeHostname or NodeAddr instead. They come
//! from, in this order:
//!
//! 1. before Slurm 23.11, `SLURM_NODE_ALIASES` (`name:addr:hostname,...`),
//!    which Slurm set in the job's environment for cloud and dynamic nodes
//!    whose address is known only at run time. 23.11 removed it (RELEASE_NOTES:
//!    "Remove SLURM_NODE_ALIASES env variable. Client code now uses
//!    slurm_addr_t's passed from controller"), and nothing a job or a SPANK
//!    plugin can read took its place: a dynamic node's address (`slurmd -Z`,
//!    `scontrol create node`) or a cloud node's registered one is known to
//!    slurmctld and to Slurm's own RPCs only;
//! 2. the `NodeName=` lines of `slurm.conf` (and the files it includes), where
//!    `NodeName`, `NodeHostname` and `NodeAddr` may be hostlists that are
//!    matched element by element (`NodeName=gpu[01-04] NodeAddr=10.1.0.[1-4]`).
//!    A missing NodeHostname is the NodeName, a missing NodeAddr the
//!    NodeHostname, as in Slurm. Which file: [`slurm_conf_path`].

use slurm_formats::conf::{self, DEFAULT_SLURM_CONF, clean_path};
use slurm_formats::hostlist;

/// Which name the plugin gives as `MASTER_ADDR` (`master_addr=` on the plugstack line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MasterAddr {
    /// The first node's NodeName (default).
    #[default]
    NodeName,
    /// Its NodeHostname.
    Hostname,
    /// Its NodeAddr.
    Addr,
}

impl MasterAddr {
    /// Parses the plugstack value.
    ///
    /// # Errors
    /// Not one of `nodename`, `hostname`, `addr`.
    pub fn parse(value: &str) -> Result<MasterAddr, String> {
        match value {
            "nodename" => Ok(MasterAddr::NodeName),
            "hostname" => Ok(MasterAddr::Hostname),
            "addr" => Ok(MasterAddr::Addr),
            _ => Err(format!("expected nodename, hostname or addr, got '{value}'")),
        }
    }

    /// Which of the node's names `MASTER_ADDR` then is, in Slurm's words.
    pub const fn names(self) -> &'static str {
        match self {
            MasterAddr::NodeName => "NodeName",
            MasterAddr::Hostname => "NodeHostname",
            MasterAddr::Addr => "NodeAddr",
        }
    }

    /// The word as written on the plugstack line.
    pub const fn word(self) -> &'static str {
        match self {
            MasterAddr::NodeName => "nodename",
            MasterAddr::Hostname => "hostname",
            MasterAddr::Addr => "addr",
        }
    }
}

/// A node's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNames {
    /// NodeHostname.
    pub hostname: String,
    /// NodeAddr.
    pub addr: String,
}

impl NodeNames {
    /// The name `which` asks for; `node` for NodeName.
    pub fn pick(&self, node: &str, which: MasterAddr) -> String {
        match which {
            MasterAddr::NodeName => node.to_owned(),
            MasterAddr::Hostname => self.hostname.clone(),
            MasterAddr::Addr => self.addr.clone(),
        }
    }
}

/// The first release without `SLURM_NODE_ALIASES` (23.11).
pub const NODE_ALIASES_GONE_SINCE: u32 = (23 << 16) | (11 << 8);

/// Whether a build for `slurm_version` reads `SLURM_NODE_ALIASES`: before
/// 23.11 Slurm set it; later a value can only be the user's or stale.
pub fn reads_node_aliases(slurm_version: u32) -> bool {
    slurm_version < NODE_ALIASES_GONE_SINCE
}

/// Where `master_addr=hostname|addr` reads slurm.conf: `slurm_conf=` when
/// the admin gave it; else the file slurmd itself read, which slurmd leaves
/// in the environment of the slurmstepd it starts (`slurmd_conf`: slurmd.c
/// sets `SLURM_CONF` to its `-f` file or, on a configless node, to
/// `<SlurmdSpoolDir>/conf-cache/slurm.conf`, the real file behind the
/// `/run/slurm/conf` link, which the plugin does not follow); else
/// [`DEFAULT_SLURM_CONF`]. slurmstepd's own environment is
/// slurmd's (root's), not the job's; a value that is not an absolute path
/// without `.`/`..` parts is not used.
pub fn slurm_conf_path(given: Option<&str>, slurmd_conf: Option<&str>) -> String {
    given
        .map(str::to_owned)
        .or_else(|| slurmd_conf.and_then(|p| clean_path(p.trim()).ok()))
        .unwrap_or_else(|| DEFAULT_SLURM_CONF.to_owned())
}

/// What the slurmd log says when `node` is found nowhere, per release.
pub fn not_found(word: &str, node: &str, conf: &str, slurm_version: u32) -> String {
    if reads_node_aliases(slurm_version) {
        format!("master_addr={word}: {node} is not in SLURM_NODE_ALIASES or {conf}; MASTER_ADDR stays {node}")
    } else {
        format!(
            "master_addr={word}: {node} is not in {conf} (a dynamic or cloud node's address is known \
             only to slurmctld: since Slurm 23.11 jobs get no SLURM_NODE_ALIASES); MASTER_ADDR stays {node}"
        )
    }
}

/// `node` in `SLURM_NODE_ALIASES` (`name:addr:hostname,...`).
pub fn from_aliases(aliases: &str, node: &str) -> Option<NodeNames> {
    aliases.split(',').find_map(|entry| {
        let mut parts = entry.trim().split(':');
        let (name, addr, host) = (parts.next()?, parts.next()?, parts.next()?);
        (name == node && !addr.is_empty()).then(|| NodeNames {
            hostname: if host.is_empty() { addr } else { host }.to_owned(),
            addr: addr.to_owned(),
        })
    })
}

/// The files a `slurm.conf` includes (`Include FILE`), relative to `dir`.
pub fn includes(conf: &str, dir: &str) -> Vec<String> {
    conf::logical_lines(conf)
        .iter()
        .filter_map(|l| conf::include_target(l).map(str::to_owned))
        .filter(|f| !f.contains('*') && !f.contains('%'))
        .map(|f| if f.starts_with('/') { f } else { format!("{}/{f}", dir.trim_end_matches('/')) })
        .collect()
}

/// `node` in the `NodeName=` lines of `conf`.
pub fn from_slurm_conf(conf: &str, node: &str) -> Option<NodeNames> {
    for line in conf::logical_lines(conf) {
        let Some(pairs) = conf::pairs(&line) else { continue };
        let mut names = None;
        let (mut hosts, mut addrs) = (None, None);
        for (key, _, value) in pairs {
            match key.to_ascii_lowercase().as_str() {
                "nodename" => names = Some(value),
                "nodehostname" => hosts = Some(value),
                "nodeaddr" => addrs = Some(value),
                _ => {}
            }
        }
        let Some(names) = names.filter(|n| !n.eq_ignore_ascii_case("default")) else { continue };
        let Ok(names) = hostlist::expand(names) else { continue };
        let Some(i) = names.iter().position(|n| n == node) else { continue };
        let nth = |list: Option<&str>| -> Option<String> {
            let list = hostlist::expand(list?).ok()?;
            // One value for all, or one per node.
            if list.len() == 1 { list.into_iter().next() } else { list.into_iter().nth(i) }
        };
        let hostname = nth(hosts).unwrap_or_else(|| node.to_owned());
        let addr = nth(addrs).unwrap_or_else(|| hostname.clone());
        return Some(NodeNames { hostname, addr });
    }
    None
}

/// Largest slurm.conf (or included file) read for `master_addr=`.
pub const MAX_SLURM_CONF: usize = 16 << 20;

/// The name `which` asks for of the step's first node `first`, found as
/// both the plugin and `spank-gpu explain` find it: in `aliases`
/// (`SLURM_NODE_ALIASES`, before 23.11 only), else in `conf_path` and the
/// files it includes, each read by `read` (the plugin opens them as trusted
/// files, explain as its user).
///
/// # Errors
/// The line to log when the node is in none of them or a file cannot be
/// read: `MASTER_ADDR` then stays `first`.
pub fn find(
    which: MasterAddr,
    first: &str,
    conf_path: &str,
    aliases: Option<&str>,
    slurm_version: u32,
    read: &mut dyn FnMut(&str) -> std::io::Result<String>,
) -> Result<String, String> {
    let word = which.word();
    if let Some(names) =
        aliases.filter(|_| reads_node_aliases(slurm_version)).and_then(|a| from_aliases(a, first))
    {
        return Ok(names.pick(first, which));
    }
    let mut from_conf = || -> std::io::Result<Option<NodeNames>> {
        let conf = read(conf_path)?;
        if let Some(n) = from_slurm_conf(&conf, first) {
            return Ok(Some(n));
        }
        let dir = conf_path.rsplit_once('/').map_or("/", |(d, _)| d);
        for file in includes(&conf, dir) {
            if let Some(n) = from_slurm_conf(&read(&file)?, first) {
                return Ok(Some(n));
            }
        }
        Ok(None)
    };
    match from_conf() {
        Ok(Some(names)) => Ok(names.pick(first, which)),
        Ok(None) => Err(not_found(word, first, conf_path, slurm_version)),
        Err(e) => Err(format!("master_addr={word}: {e}; MASTER_ADDR stays {first}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "\
NodeName=DEFAULT CPUs=64 Gres=gpu:8
NodeName=gpu[01-04] NodeHostname=ib-gpu[01-04] NodeAddr=10.1.0.[1-4] State=UNKNOWN
nodename=login1   # no hostname or address
NodeName=cpu1 NodeAddr=cpu1.example.org
Include nodes.d/extra.conf
";

    #[test]
    fn names_come_from_the_matching_element_of_the_lists() {
        let n = from_slurm_conf(CONF, "gpu03").unwrap();
        assert_eq!(n, NodeNames { hostname: "ib-gpu03".into(), addr: "10.1.0.3".into() });
        assert_eq!(n.pick("gpu03", MasterAddr::NodeName), "gpu03");
        assert_eq!(n.pick("gpu03", MasterAddr::Addr), "10.1.0.3");
        let login = from_slurm_conf(CONF, "login1").unwrap();
        assert_eq!((login.hostname.as_str(), login.addr.as_str()), ("login1", "login1"));
        assert_eq!(from_slurm_conf(CONF, "cpu1").unwrap().addr, "cpu1.example.org");
        assert_eq!(from_slurm_conf(CONF, "gpu09"), None);
        assert_eq!(from_slurm_conf(CONF, "DEFAULT"), None);
    }

    #[test]
    fn aliases_win_for_cloud_nodes() {
        let a = "cloud1:10.9.0.7:ip-10-9-0-7,cloud2:10.9.0.8:";
        assert_eq!(from_aliases(a, "cloud1").unwrap().hostname, "ip-10-9-0-7");
        assert_eq!(
            from_aliases(a, "cloud2").unwrap(),
            NodeNames { hostname: "10.9.0.8".into(), addr: "10.9.0.8".into() }
        );
        assert_eq!(from_aliases(a, "cloud3"), None);
        assert_eq!(from_aliases("garbage", "garbage"), None);
    }

    #[test]
    fn includes_are_listed_relative_to_the_config() {
        assert_eq!(includes(CONF, "/etc/slurm/"), ["/etc/slurm/nodes.d/extra.conf"]);
        assert!(includes("Include /etc/slurm/*.conf\n", "/etc/slurm").is_empty(), "globs are not followed");
    }

    #[test]
    fn slurm_conf_is_the_admins_then_slurmds_then_the_default() {
        let cache = "/var/spool/slurmd/conf-cache/slurm.conf";
        assert_eq!(slurm_conf_path(Some("/etc/x.conf"), Some(cache)), "/etc/x.conf");
        assert_eq!(slurm_conf_path(None, Some(cache)), cache, "configless: slurmd's cached copy");
        assert_eq!(slurm_conf_path(None, None), "/etc/slurm/slurm.conf");
        assert_eq!(slurm_conf_path(None, Some("relative/slurm.conf")), "/etc/slurm/slurm.conf");
        assert_eq!(slurm_conf_path(None, Some("/a/../b")), "/etc/slurm/slurm.conf");
    }

    #[test]
    fn aliases_and_the_message_follow_the_release() {
        let (v22, v24) = ((22 << 16) | (5 << 8), (24 << 16) | (11 << 8));
        assert!(reads_node_aliases(v22) && !reads_node_aliases(v24));
        let m = not_found("addr", "node5", "/etc/slurm/slurm.conf", v22);
        assert_eq!(
            m,
            "master_addr=addr: node5 is not in SLURM_NODE_ALIASES or /etc/slurm/slurm.conf; MASTER_ADDR stays node5"
        );
        let m = not_found("addr", "node5", "/etc/slurm/slurm.conf", v24);
        assert!(m.contains("known only to slurmctld") && !m.contains("not in SLURM_NODE_ALIASES"), "{m}");
        assert!(m.ends_with("MASTER_ADDR stays node5"), "{m}");
    }

    #[test]
    fn the_plugstack_word_parses() {
        assert_eq!(MasterAddr::parse("addr"), Ok(MasterAddr::Addr));
        assert!(MasterAddr::parse("ip").unwrap_err().contains("nodename, hostname or addr"));
    }
}
