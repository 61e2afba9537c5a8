//! Taking Xids in, in constant time each whatever the uptime: a kernel-log
//! record already taken in (a restart's replay, `check`) is known by the
//! state's mark; the same event through NVML and the kernel log is paired
//! per (Xid, GPU); an ignored Xid is only counted. Also what un-counts them:
//! an admin's `clear`, and a node someone else took over through Slurm.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use gpu_health::nvlink5;
use gpu_health::xid::{self, Action, Event};
use slurm_formats::pci::PciAddr;

use super::{Agent, Fresh, now_unix};
use crate::policy::health::{XidEvent, XidSeen, XidSource};
use crate::store::{ClearRecord, Occurrence, XidRecord, kmsg_key};

/// How long an Xid seen through one source hides the same Xid from the other.
const DEDUP_WINDOW: Duration = Duration::from_secs(30);
/// Past this many (Xid, GPU) pairs, the expired ones are dropped.
const MAX_RECENT: usize = 1024;

/// A GPU, for pairing one event's two sightings: its bus id where known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum PairKey {
    Bus(PciAddr),
    Index(u32),
    Unknown,
}

/// The sightings of one (Xid, GPU) through one source not yet matched by
/// the other source.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pair {
    source: XidSource,
    unmatched: u32,
    at: Instant,
}

impl Agent {
    fn gpu_of_bus(&self, bus: &PciAddr) -> Option<u32> {
        self.bus_index.iter().find(|(b, _)| b == bus).map(|(_, i)| *i)
    }

    fn bus_of_gpu(&self, gpu: u32) -> Option<PciAddr> {
        self.bus_index.iter().find(|(_, i)| *i == gpu).map(|(b, _)| *b)
    }

    /// A record's GPU: its NVML index, or its bus id's.
    pub(super) fn gpu_of(&self, x: &XidRecord) -> Option<u32> {
        x.gpu.or_else(|| self.gpu_of_bus(x.bus.as_ref()?))
    }

    /// Whether `event` is the other source's sighting of an event already
    /// taken in (within [`DEDUP_WINDOW`]).
    fn paired(&mut self, event: &XidEvent) -> bool {
        let key = match (event.bus, event.gpu) {
            (Some(b), _) => PairKey::Bus(b),
            (None, Some(g)) => PairKey::Index(g),
            (None, None) => PairKey::Unknown,
        };
        let now = Instant::now();
        if self.recent.len() > MAX_RECENT {
            self.recent.retain(|_, p| now.duration_since(p.at) < DEDUP_WINDOW);
        }
        let entry = self.recent.entry((event.xid, key)).or_insert(Pair {
            source: event.source,
            unmatched: 0,
            at: now,
        });
        let live = now.duration_since(entry.at) < DEDUP_WINDOW;
        if live && entry.source != event.source && entry.unmatched > 0 {
            entry.unmatched -= 1;
            return true;
        }
        if !live || entry.source != event.source {
            *entry = Pair { source: event.source, unmatched: 0, at: now };
        }
        entry.unmatched = entry.unmatched.saturating_add(1);
        entry.at = now;
        false
    }

    /// Takes in an Xid (or a lost GPU) from NVML or the kernel log. Returns
    /// whether it is new (not a kernel-log record taken in before, nor the
    /// same event seen through the other source lately) and may need the
    /// node out of service, so worth a pass now.
    pub fn record_xid(&mut self, mut event: XidEvent) -> bool {
        if event.gpu.is_none() {
            event.gpu = event.bus.as_ref().and_then(|b| self.gpu_of_bus(b));
        }
        if event.bus.is_none() {
            event.bus = event.gpu.and_then(|g| self.bus_of_gpu(g));
        }
        if let (XidSource::Kmsg, Some(us)) = (event.source, event.kmsg_us) {
            let key = kmsg_key(event.xid, event.bus);
            if !self.state.take_kmsg(us, &key) {
                return false;
            }
            self.fresh.mark = self.state.kmsg_mark.clone();
        }
        let action = event.action(&self.cfg.policy);
        let fatal = event
            .nvlink
            .as_ref()
            .filter(|d| d.verdict == nvlink5::Verdict::Reset)
            .map(nvlink5::Decoded::describe);
        if self.paired(&event) {
            // Only the kernel log's message tells a fatal NVLink5 Xid: it
            // may come second, and then decides.
            if let Some(what) = fatal.filter(|_| action >= Action::Drain) {
                let mark = XidRecord {
                    xid: event.xid,
                    gpu: event.gpu,
                    bus: event.bus,
                    source: event.source,
                    count: 0,
                    cleared: 0,
                    first_at: 0,
                    last_at: now_unix(),
                    first_us: event.kmsg_us,
                    last_us: event.kmsg_us,
                    fatal: Some(what),
                };
                self.state.xids.insert_record(mark.clone());
                self.fresh.book.insert_record(mark);
                return true;
            }
            return false;
        }
        let gpu = event.gpu.map_or_else(|| "?".to_owned(), |g| g.to_string());
        if action == Action::Ignore {
            self.state.xids.ignore(event.xid);
            self.fresh.book.ignore(event.xid);
            if self.ignored_logged.insert(event.xid) {
                tracing::info!(
                    xid = event.xid,
                    gpu,
                    source = event.source.name(),
                    "Xid (application error, ignored; from now on only counted: gpu_node_agent_xid_ignored_total)"
                );
            } else {
                tracing::debug!(xid = event.xid, gpu, source = event.source.name(), "Xid (ignored)");
            }
            return false;
        }
        let detail = fatal.as_deref().map(|f| format!(" ({f})")).unwrap_or_default();
        tracing::warn!(xid = event.xid, gpu, source = event.source.name(), action = %action, "Xid: {}{detail}", xid::describe(event.xid));
        let o = Occurrence {
            xid: event.xid,
            gpu: event.gpu,
            bus: event.bus,
            source: event.source,
            kmsg_us: event.kmsg_us,
            at: now_unix(),
            fatal,
        };
        let policy = &self.cfg.policy;
        // Past the bound, a record the policy would not drain for goes first.
        let evictable = |r: &XidRecord| r.fatal.is_none() && policy.xid_action(r.xid) < Action::Drain;
        self.state.xids.add(&o, evictable);
        self.fresh.book.add(&o, |_| true);
        action >= Action::Drain
    }

    /// Takes in a kernel-log event.
    pub fn record_kmsg(&mut self, e: &Event) -> bool {
        self.record_xid(XidEvent::from_kmsg(e))
    }

    /// This boot's Xids that still count, for [`crate::policy::health::evaluate`].
    pub(super) fn xid_seen(&self) -> Vec<XidSeen> {
        self.state
            .xids
            .records()
            .iter()
            .filter(|r| r.counts())
            .map(|r| XidSeen { xid: r.xid, gpu: self.gpu_of(r), source: r.source, fatal: r.fatal.clone() })
            .collect()
    }

    /// The node is someone else's now (resumed through Slurm, or drained for
    /// another reason): the agent forgets its drain, and the Xids it knew up
    /// to its last save no longer count, as after `gpu-node-agent clear`.
    /// What it took in since still counts. A dry run only says so.
    pub(super) fn taken_over(&mut self, why: &str, actions: &mut Vec<String>) {
        let fresh = std::mem::take(&mut self.fresh);
        let mut n = 0;
        for r in self.state.xids.records_mut() {
            let since = fresh.book.get(r.xid, r.gpu, r.bus).map_or(0, |f| f.count);
            let known = r.count.saturating_sub(since);
            if r.cleared < known {
                r.cleared = known;
                n += 1;
            }
            if since == 0 {
                r.fatal = None;
            }
        }
        self.fresh = fresh;
        if n > 0 {
            self.state.push_clear(ClearRecord {
                at: now_unix(),
                uid: 0,
                gpu: None,
                kmsg_us: self.state.kmsg_mark.as_ref().map(|m| m.us),
                xids: n,
                by: Some("the node was taken over through Slurm".to_owned()),
            });
        }
        self.state.drain = None;
        self.state.clean_checks = 0;
        let node = &self.node_name;
        let msg = format!(
            "{why}: {n} Xid record(s) seen so far on {node} no longer count, as after `gpu-node-agent clear`; new ones still do"
        );
        if self.cfg.dry_run {
            let msg = format!("dry run: would forget this agent's drain record: {msg}");
            tracing::warn!("{msg}");
            actions.push(msg);
        } else {
            tracing::info!(node = %node, "{msg}");
        }
    }

    /// `gpu-node-agent clear [--gpu N]`: after a GPU reset, the Xids seen so
    /// far (on GPU `gpu`, or every GPU) never count again; the agent's drain
    /// may then be resumed without a reboot. After a corrupt state file was
    /// kept aside, it also lets the agent ask for reboots again. Returns what
    /// was done, in words.
    ///
    /// # Errors
    /// The state file cannot be used, the agent never drained this node (and
    /// lost no state file), or there is no GPU `gpu`. Nothing is changed then.
    pub fn clear(&mut self, gpu: Option<u32>) -> Result<String, String> {
        let _lock = self.store.lock()?;
        let boot = super::boot_id(&self.cfg);
        self.reload(&boot);
        if let Some(e) = &self.load_error {
            return Err(format!("{e}; nothing changed"));
        }
        if self.state.drain.is_none() && self.state.lost.is_none() {
            return Err(format!(
                "this agent has not drained {} (nothing of its own to clear); a drain by someone else is theirs to resume",
                self.node_name
            ));
        }
        match self.gpus.sample() {
            Ok(samples) => {
                self.learn_buses(&samples);
                if let Some(g) = gpu {
                    if !samples.iter().any(|s| s.index == g) {
                        return Err(format!(
                            "there is no GPU {g} here (NVML sees GPUs 0-{}); nothing changed",
                            samples.len().saturating_sub(1)
                        ));
                    }
                }
            }
            Err(e) if gpu.is_some() => return Err(format!("cannot check --gpu: {e}; nothing changed")),
            Err(_) => {}
        }
        let covered: Vec<bool> =
            self.state.xids.records().iter().map(|x| gpu.is_none() || self.gpu_of(x) == gpu).collect();
        let mut n = 0;
        for (x, covered) in self.state.xids.records_mut().zip(covered) {
            if covered && x.counts() {
                n += 1;
            }
            if covered {
                x.clear();
            }
        }
        let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
        let kmsg_us = self.state.kmsg_mark.as_ref().map(|m| m.us);
        self.state.push_clear(ClearRecord { at: now_unix(), uid, gpu, kmsg_us, xids: n, by: None });
        if let Some(d) = self.state.drain.as_mut() {
            d.needs_reboot = false;
        }
        let lost = self.state.lost.take();
        self.state.clean_checks = 0;
        self.state.pending = None;
        let suffix = gpu.map(|g| format!(" gpu{g}"));
        self.state.reboots.retain(|k, _| suffix.as_ref().is_some_and(|s| !k.ends_with(s.as_str())));
        self.store.save(&self.state)?;
        self.fresh = Fresh::default();
        let which = gpu.map_or_else(|| "every GPU".to_owned(), |g| format!("GPU {g}"));
        let lost = lost
            .map(|l| {
                format!(
                    " The state file lost at {} ({}) is behind you: reboots may be asked for again.",
                    crate::time::utc(l.at),
                    l.kept_as
                )
            })
            .unwrap_or_default();
        Ok(format!(
            "cleared {n} Xid(s) on {which} of {node}; new Xids still count.{lost} Resume the node: scontrol update NodeName={node} State=RESUME",
            node = self.node_name
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::policy::health::{XidEvent, XidSource};
    use gpu_health::xid::{self, Event};

    fn agent(name: &str) -> (Agent, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("agent-xids-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = Config {
            nvml_library: "/nonexistent/libnvidia-ml.so".into(),
            state_dir: dir.join("state"),
            boot_id_path: dir.join("boot_id"),
            ..Config::default()
        };
        (Agent::new(cfg), dir)
    }

    #[test]
    fn one_xid_seen_by_nvml_and_the_kernel_log_counts_once() {
        let (mut agent, dir) = agent("dedup");
        let bus = PciAddr::parse("00000000:61:00.0").ok();
        let nvml =
            XidEvent { xid: 79, gpu: Some(3), bus, source: XidSource::Nvml, kmsg_us: None, nvlink: None };
        assert!(agent.record_xid(nvml.clone()));
        let line = "6,1,5000000,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.";
        let record = Event::Xid(xid::parse_line(line).unwrap());
        assert!(!agent.record_kmsg(&record), "the kernel log's copy of the same Xid is not new");
        assert!(!agent.record_kmsg(&record), "nor is a replay of it");
        let other = Event::Xid(xid::parse_line(&line.replace("): 79,", "): 48,")).unwrap());
        assert!(agent.record_kmsg(&other));
        // A second occurrence through NVML is a new event.
        assert!(agent.record_xid(nvml));
        let counts: Vec<(u32, u64)> = agent.state.xids.records().iter().map(|r| (r.xid, r.count)).collect();
        assert_eq!(counts, [(79, 2), (48, 1)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fatal_nvlink5_xid_decides_even_when_nvml_reported_it_first() {
        let (mut agent, dir) = agent("nvlink5");
        let bus = PciAddr::parse("00000000:61:00.0").ok();
        let nvml =
            XidEvent { xid: 145, gpu: Some(3), bus, source: XidSource::Nvml, kmsg_us: None, nvlink: None };
        assert!(!agent.record_xid(nvml), "NVML's event carries no message: warn");
        let line = "6,9,7000000,-;NVRM: Xid (PCI:0000:61:00): 145, RLW_REMAP Fatal XC0 i0 Link 01 (0x00000004 0x00000080 0x00000000 0x00000000)";
        assert!(
            agent.record_kmsg(&Event::Xid(xid::parse_line(line).unwrap())),
            "the kernel log's message says reset"
        );
        let r = &agent.state.xids.records()[0];
        assert_eq!(r.count, 1, "one event");
        assert!(r.fatal.as_deref().is_some_and(|f| f.starts_with("RLW_REMAP status 0x00000080")), "{r:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ignored_xids_are_only_counted() {
        let (mut agent, dir) = agent("ignored");
        for t in 0..1000u64 {
            let line =
                format!("6,{t},{},-;NVRM: Xid (PCI:0000:61:00): 43, pid=1, name=x, Ch 00000008", 1000 + t);
            assert!(!agent.record_kmsg(&Event::Xid(xid::parse_line(&line).unwrap())));
        }
        assert!(agent.state.xids.is_empty());
        assert_eq!(agent.state.xids.ignored.get(&43), Some(&1000));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
