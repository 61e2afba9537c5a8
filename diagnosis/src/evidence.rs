//! What `autopsy` reads besides the job's own record: its log (GPU or host
//! out-of-memory), its nodes' events during the run, and what the caller
//! found about its log paths on disk.

use super::agent::{AgentDrain, decode_agent_reason};
use super::parse::parse_parsable_with;
use super::scontrol::parse_record;
use crate::time::parse_time;

/// What a job's log says about memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomKind {
    /// GPU memory: `CUDA out of memory`, `torch.OutOfMemoryError`.
    Gpu,
    /// Host memory: the kernel OOM killer or Slurm's memory limit.
    Host,
}

impl OomKind {
    /// `gpu` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            OomKind::Gpu => "gpu",
            OomKind::Host => "host",
        }
    }
}

/// The kind of out-of-memory a job's log shows, GPU first (a GPU OOM is
/// often followed by a host-side crash message).
pub fn classify_oom(log: &str) -> Option<OomKind> {
    const GPU: &[&str] = &[
        "CUDA out of memory",
        "OutOfMemoryError",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "cudaErrorMemoryAllocation",
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
    ];
    const HOST: &[&str] = &[
        "oom-kill",
        "oom_kill",
        "Out of memory: Killed process",
        "Exceeded job memory limit",
        "exceeded memory limit",
        "MemoryError",
        "std::bad_alloc",
        "Cannot allocate memory",
    ];
    if GPU.iter().any(|p| log.contains(p)) {
        Some(OomKind::Gpu)
    } else if HOST.iter().any(|p| log.contains(p)) {
        Some(OomKind::Host)
    } else {
        None
    }
}

/// A drain, down or fail event of a node, from `sacctmgr show event`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// The node.
    pub node: String,
    /// When it started (`YYYY-MM-DDTHH:MM:SS`).
    pub start: String,
    /// When it ended; empty or `Unknown` while it lasts.
    pub end: String,
    /// The node state (`DRAIN`, `DOWN`, ...).
    pub state: String,
    /// The reason.
    pub reason: String,
    /// The reason decoded, when the GPU agent wrote it.
    pub agent: Option<AgentDrain>,
}

/// The node events of `sacctmgr -P show event format=NodeName,TimeStart,TimeEnd,State,Reason`
/// that overlap `[from, to]` (times as [`parse_time`] reads them).
pub fn parse_events(text: &str, from: i64, to: i64) -> Vec<NodeEvent> {
    parse_parsable_with(text, &["Reason"])
        .into_iter()
        .filter_map(|row| {
            let node = row.get("NodeName").cloned().unwrap_or_default();
            if node.is_empty() {
                return None; // cluster-wide events
            }
            let start = row.get("TimeStart").cloned().unwrap_or_default();
            let end = row.get("TimeEnd").cloned().unwrap_or_default();
            let s = parse_time(&start)?;
            let e = parse_time(&end).unwrap_or(i64::MAX);
            if s > to || e < from {
                return None;
            }
            let reason = row.get("Reason").cloned().unwrap_or_default();
            let agent = decode_agent_reason(&node, &reason);
            Some(NodeEvent {
                state: row.get("State").cloned().unwrap_or_default(),
                node,
                start,
                end,
                reason,
                agent,
            })
        })
        .collect()
}

/// The drains that `scontrol show node -o` shows now, as events, kept when
/// their reason was set within `[from, to]`.
///
/// slurmctld sends a node's state change to slurmdbd through its agent queue,
/// so `sacctmgr show event` can lack a drain that happened seconds ago; the
/// node's own record has it at once, as `Reason=TEXT [USER@TIME]`. The end
/// of such an event is unknown (`Unknown`): the node is still drained.
pub fn events_from_nodes(text: &str, from: i64, to: i64) -> Vec<NodeEvent> {
    text.lines()
        .filter(|l| l.trim_start().starts_with("NodeName="))
        .filter_map(|line| {
            let row = parse_record(line);
            let node = row.get("NodeName")?.clone();
            let full = row.get("Reason")?.trim();
            // The stamp Slurm appends: ` [root@2026-12-01T10:22:24]`.
            let (reason, stamp) = full.strip_suffix(']')?.rsplit_once(" [")?;
            let time = stamp.split_once('@')?.1;
            let at = parse_time(time)?;
            if at < from || at > to {
                return None;
            }
            Some(NodeEvent {
                state: row.get("State").cloned().unwrap_or_default(),
                agent: decode_agent_reason(&node, reason),
                node,
                start: time.to_owned(),
                end: "Unknown".to_owned(),
                reason: reason.to_owned(),
            })
        })
        .collect()
}

/// `events` with those of `now` (from [`events_from_nodes`]) that it lacks:
/// one node's drain with the same reason is one event.
pub fn merge_events(mut events: Vec<NodeEvent>, now: Vec<NodeEvent>) -> Vec<NodeEvent> {
    for e in now {
        if !events.iter().any(|k| k.node == e.node && k.reason == e.reason) {
            events.push(e);
        }
    }
    events
}

/// What the caller found on disk (on the host it runs on, as the user who
/// asks) about one of a job's `--output`/`--error` paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathCheck {
    /// The path.
    pub path: String,
    /// The directories on the way to it that do not exist, outermost first.
    pub missing: Vec<String>,
    /// What stops the path from being created or written, when something does.
    pub blocker: Option<Blocker>,
}

/// What stops a log path from being created or written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// A part of the path is a file, not a directory.
    NotADirectory(String),
    /// The directory to create the file (or the missing directories) in is
    /// not writable by the user.
    NotWritable(String),
}

/// Whether a user may create entries in a directory with this `mode`,
/// `owner` and `group` (or write a file with them): the user's `uid` and
/// groups (`gids`, the primary one included). Root always may.
pub fn may_write(mode: u32, owner: u32, group: u32, uid: u32, gids: &[u32]) -> bool {
    let bits = if uid == 0 {
        return true;
    } else if uid == owner {
        mode >> 6
    } else if gids.contains(&group) {
        mode >> 3
    } else {
        mode
    };
    // A directory needs write and search; a file, write (its x bit is then
    // irrelevant, and the caller checks files with a mode that has it).
    bits & 0o3 == 0o3
}

/// The effective uid and the groups (primary first) in `/proc/self/status`.
pub fn ids_from_proc_status(text: &str) -> Option<(u32, Vec<u32>)> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
    let uid = field("Uid:")?.nth(1)?.parse().ok()?;
    let mut gids: Vec<u32> = vec![field("Gid:")?.nth(1)?.parse().ok()?];
    gids.extend(field("Groups:").into_iter().flatten().filter_map(|g| g.parse::<u32>().ok()));
    Some((uid, gids))
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../tests/fixtures/jobinfo/22.05/", $name))
        };
    }

    #[test]
    fn oom_kinds_from_logs() {
        let slurm = "slurmstepd-node1: error: Exceeded job memory limit\n";
        assert_eq!(classify_oom(slurm), Some(OomKind::Host));
        let cgroup = "slurmstepd: error: Detected 1 oom_kill event in StepId=9.batch. Some of the step tasks have been OOM Killed.\n";
        assert_eq!(classify_oom(cgroup), Some(OomKind::Host));
        let torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n";
        assert_eq!(classify_oom(torch), Some(OomKind::Gpu));
        assert_eq!(classify_oom(&format!("{torch}{slurm}")), Some(OomKind::Gpu));
        assert_eq!(classify_oom("all fine\n"), None);
    }

    #[test]
    fn a_drain_not_yet_in_accounting_comes_from_the_node_record() {
        // Recorded on each release seconds after the agent drained node2: its
        // record has the drain (`Reason=... [root@TIME]`, the last field on
        // all three); sacctmgr had it too, there, but may lag.
        macro_rules! recorded {
            ($rel:literal, $name:literal) => {
                include_str!(concat!("../tests/fixtures/jobinfo/recorded/", $rel, "/", $name))
            };
        }
        let releases = [
            (
                "22.05",
                recorded!("22.05", "node2.scontrol"),
                recorded!("22.05", "events.sacctmgr"),
                "2026-12-01T10:21:16",
            ),
            (
                "24.11",
                recorded!("24.11", "node2.scontrol"),
                recorded!("24.11", "events.sacctmgr"),
                "2026-12-01T10:22:24",
            ),
            (
                "26.05",
                recorded!("26.05", "node2.scontrol"),
                recorded!("26.05", "events.sacctmgr"),
                "2026-12-01T10:22:34",
            ),
        ];
        for (rel, node, events, stamp) in releases {
            let at = parse_time(stamp).unwrap_or(0);
            let (from, to) = (at - 30, at + 30);
            let now = events_from_nodes(node, from, to);
            assert_eq!(now.len(), 1, "{rel}: {now:?}");
            assert_eq!((now[0].node.as_str(), now[0].start.as_str()), ("node2", stamp), "{rel}");
            assert_eq!(now[0].reason, "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)", "{rel}");
            assert_eq!(now[0].agent.as_ref().and_then(|a| a.xid), Some(79), "{rel}");
            assert!(now[0].state.contains("DRAIN"), "{rel}: {}", now[0].state);
            // A drain set before the job started is not the job's.
            assert!(events_from_nodes(node, at + 300, at + 900).is_empty(), "{rel}");
            // The same drain in accounting and in the record counts once.
            let dbd = parse_events(events, from, to);
            let drains = |v: &[NodeEvent]| v.iter().filter(|e| e.agent.is_some()).count();
            assert_eq!(drains(&dbd), 1, "{rel}");
            assert_eq!(drains(&merge_events(dbd.clone(), now.clone())), 1, "{rel}");
            assert_eq!(drains(&merge_events(Vec::new(), now)), 1, "{rel}");
        }
        // No reason, or one without Slurm's stamp: nothing.
        assert!(events_from_nodes("NodeName=node1 State=IDLE Reason=None\n", 0, i64::MAX).is_empty());
        assert!(events_from_nodes("NodeName=node1 State=DRAIN Reason=maintenance\n", 0, i64::MAX).is_empty());
    }

    #[test]
    fn node_events_in_the_window() {
        let text = fixture!("events.sacctmgr");
        let t = |s| parse_time(s).unwrap_or(0);
        let all = parse_events(text, t("2026-11-30T18:59:00"), t("2026-11-30T19:10:00"));
        assert_eq!(all.len(), 2);
        let during = parse_events(text, t("2026-11-30T18:59:25"), t("2026-11-30T18:59:40"));
        assert_eq!(during.len(), 1, "{during:?}");
        assert_eq!(during[0].end, "Unknown");
        assert_eq!(during[0].agent.as_ref().and_then(|a| a.xid), Some(79));
        assert!(parse_events(text, t("2026-11-30T18:00:00"), t("2026-11-30T18:10:00")).is_empty());
    }

    #[test]
    fn ids_from_proc() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1001\t1001\nGid:\t100\t100\t100\t100\nGroups:\t27 100 \n";
        assert_eq!(ids_from_proc_status(status), Some((1001, vec![100, 27, 100])));
        assert_eq!(ids_from_proc_status("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\n"), Some((0, vec![0])));
        assert_eq!(ids_from_proc_status("Name: x"), None);
    }

    #[test]
    fn who_may_write() {
        assert!(may_write(0o755, 1000, 1000, 1000, &[1000]));
        assert!(!may_write(0o755, 0, 0, 1000, &[1000]));
        assert!(may_write(0o775, 0, 50, 1000, &[1000, 50]));
        assert!(!may_write(0o555, 1000, 1000, 1000, &[1000]));
        assert!(may_write(0o1777, 0, 0, 1000, &[1000]));
        assert!(may_write(0o500, 5, 5, 0, &[0]));
    }
}
