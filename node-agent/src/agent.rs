//! One check of the node, and what to do about it.
//!
//! A pass samples the GPUs (NVML, under a deadline), adds this boot's Xids
//! (NVML events and the kernel log, one event seen by both counted once),
//! evaluates the policy and, when acting, drains or resumes the node in Slurm
//! under these rules:
//!
//! - never drain a node someone else took out of service, never overwrite a
//!   reason the agent did not write;
//! - never drain past the fleet guard (`max_drained_fraction` of the cluster's
//!   nodes drained by the agent); a held-back drain is logged loudly and counted;
//! - resume only the agent's own drain, only while the node's reason is still
//!   exactly the one written, after `resume_after` clean checks and, for faults
//!   only a reboot clears, after the node rebooted;
//! - the agent's own trouble (NVML missing or hanging, scontrol failing or
//!   slow, the state file unwritable) makes it report itself unhealthy and
//!   never drains.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpu_core::xid::{self, Action, XidRecord};

use crate::config::Config;
use crate::health::{self, Fault, GpuSample, XidEvent, XidSource};
use crate::nvml::{Probe, ProbeError};
use crate::slurm::{NodeInfo, Slurm, SlurmError};
use crate::state::{DrainRecord, SeenXid, State, Store};

/// How long an Xid seen through one source hides the same Xid from the other.
const DEDUP_WINDOW: Duration = Duration::from_secs(30);

/// The verdict of a pass, as `check` exits with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No fault that needs the node out of service.
    Healthy = 0,
    /// A fault that needs the node drained (or rebooted).
    Unhealthy = 1,
    /// The agent cannot tell (NVML missing or hanging).
    Unknown = 2,
}

/// What one pass found and did.
#[derive(Clone, Debug)]
pub struct Report {
    /// The GPUs as sampled (empty when NVML could not answer).
    pub samples: Vec<GpuSample>,
    /// The faults, most severe first.
    pub faults: Vec<Fault>,
    /// The agent's own problems this pass.
    pub problems: Vec<String>,
    /// What was done (or would be, in dry-run).
    pub actions: Vec<String>,
    /// The verdict.
    pub verdict: Verdict,
    /// The node as Slurm described it, when it answered.
    pub node: Option<NodeInfo>,
}

/// The agent's long-lived parts.
#[derive(Debug)]
pub struct Agent {
    /// Settings.
    pub cfg: Config,
    /// This node's Slurm name.
    pub node_name: String,
    slurm: Slurm,
    probe: Probe,
    store: Store,
    /// The persisted state.
    pub state: State,
    /// Recently seen Xids, for cross-source de-duplication.
    recent: Vec<(u32, Option<u32>, Option<String>, Instant)>,
    /// Bus id → NVML index, from the last samples.
    bus_index: Vec<(String, u32)>,
    /// Problems that persist outside a pass (state file trouble).
    store_problem: Option<String>,
    warned: Vec<String>,
    /// GPUs Slurm expects here, once known.
    expected: Option<u32>,
}

/// The most nodes agents may hold drained: `max(1, floor(fraction * nodes))`.
pub fn fleet_limit(nodes: usize, fraction: f64) -> usize {
    // Node counts are far below 2^52: the conversions are exact.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let limit = (fraction * nodes as f64 + 1e-9).floor() as usize;
    limit.max(1)
}

/// The current boot's id.
pub fn boot_id(cfg: &Config) -> String {
    std::fs::read_to_string(&cfg.boot_id_path).map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// This host's name, as a default Slurm node name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_default()
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Agent {
    /// Sets the agent up: NVML worker, state, Slurm access. Touches nothing.
    pub fn new(cfg: Config) -> Agent {
        let node_name = cfg.node_name.clone().unwrap_or_else(host_name);
        let slurm = Slurm { scontrol: cfg.scontrol.clone(), timeout: cfg.scontrol_timeout };
        let probe = Probe::start(cfg.nvml_library.clone(), cfg.nvml_timeout);
        let store = Store::new(&cfg.state_dir);
        let boot = boot_id(&cfg);
        let (state, store_problem) = match store.load(&boot) {
            Ok(s) => (s, None),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the state file; starting without it");
                (State { boot_id: boot, ..State::default() }, Some(format!("state file unreadable: {e}")))
            }
        };
        Agent {
            expected: cfg.expected_gpus,
            cfg,
            node_name,
            slurm,
            probe,
            store,
            state,
            recent: Vec::new(),
            bus_index: Vec::new(),
            store_problem,
            warned: Vec::new(),
        }
    }

    /// Takes in an Xid from NVML or the kernel log. Returns whether it is new
    /// (not the same Xid on the same GPU seen through the other source lately).
    pub fn record_xid(&mut self, mut event: XidEvent) -> bool {
        if event.gpu.is_none() {
            if let Some(bus) = &event.bus {
                event.gpu = self.bus_index.iter().find(|(b, _)| b == bus).map(|(_, i)| *i);
            }
        }
        let now = Instant::now();
        self.recent.retain(|(.., at)| now.duration_since(*at) < DEDUP_WINDOW);
        let same = |(x, g, b, _): &(u32, Option<u32>, Option<String>, Instant)| {
            *x == event.xid && ((g.is_some() && *g == event.gpu) || (b.is_some() && *b == event.bus))
        };
        if self.recent.iter().any(same) {
            return false;
        }
        self.recent.push((event.xid, event.gpu, event.bus.clone(), now));
        let action = self.cfg.policy.xid_action(event.xid);
        let gpu = event.gpu.map_or_else(|| "?".to_owned(), |g| g.to_string());
        match action {
            Action::Ignore => tracing::info!(
                xid = event.xid,
                gpu,
                source = event.source.name(),
                "Xid (application error, ignored)"
            ),
            _ => {
                tracing::warn!(xid = event.xid, gpu, source = event.source.name(), action = %action, "Xid: {}", xid::describe(event.xid))
            }
        }
        let seen = SeenXid {
            xid: event.xid,
            gpu: event.gpu,
            bus: event.bus,
            source: event.source.name().to_owned(),
        };
        if !self.state.xids.contains(&seen) {
            self.state.xids.push(seen);
        }
        true
    }

    /// Takes in a kernel-log record.
    pub fn record_kmsg(&mut self, r: &XidRecord) -> bool {
        let bus = xid::normalize_pci(&r.pci_bus_id);
        self.record_xid(XidEvent { xid: r.xid, gpu: None, bus, source: XidSource::Kmsg })
    }

    fn xid_events(&self) -> Vec<XidEvent> {
        self.state
            .xids
            .iter()
            .map(|s| XidEvent {
                xid: s.xid,
                gpu: s.gpu.or_else(|| {
                    let bus = s.bus.as_ref()?;
                    self.bus_index.iter().find(|(b, _)| b == bus).map(|(_, i)| *i)
                }),
                bus: s.bus.clone(),
                source: if s.source == "kmsg" { XidSource::Kmsg } else { XidSource::Nvml },
            })
            .collect()
    }

    /// One check. With `act`, drains or resumes as the rules allow.
    pub fn pass(&mut self, act: bool) -> Report {
        let boot = boot_id(&self.cfg);
        if boot != self.state.boot_id {
            // A new boot: this boot's Xids start over (a running agent sees this
            // only when the boot id source changes under it, as in tests).
            tracing::info!(old = %self.state.boot_id, new = %boot, "new boot");
            self.state.xids.clear();
            self.recent.clear();
            self.state.boot_id = boot;
        }
        let mut problems: Vec<String> = self.store_problem.iter().cloned().collect();
        let mut actions = Vec::new();
        let (samples, nvml_ok) = match self.probe.sample() {
            Ok(s) => (s, true),
            Err(e) => {
                problems.push(e.to_string());
                if matches!(e, ProbeError::Hung(_)) {
                    tracing::error!(error = %e, "NVML is not answering");
                }
                (Vec::new(), false)
            }
        };
        if nvml_ok {
            self.bus_index = samples
                .iter()
                .filter_map(|s| Some((xid::normalize_pci(s.bus_id.as_deref()?)?, s.index)))
                .collect();
        }
        let node = match self.slurm.node(&self.node_name) {
            Ok(n) => Some(n),
            Err(e) => {
                problems.push(format!("Slurm: {e}"));
                None
            }
        };
        if self.expected.is_none() {
            self.expected = node.as_ref().and_then(|n| n.gres_gpus);
        }
        let expected = if nvml_ok { self.expected } else { None };
        let faults = health::evaluate(&samples, &self.xid_events(), expected, &self.cfg.policy);
        for f in faults.iter().filter(|f| f.action == Action::Warn) {
            let r = f.reason();
            if !self.warned.contains(&r) {
                tracing::warn!(fault = %r, "GPU warning (the node stays in service)");
                self.warned.push(r);
            }
        }
        let worst = health::worst(&faults).cloned();
        if act {
            match &worst {
                Some(fault) => self.on_fault(fault, node.as_ref(), &mut problems, &mut actions),
                None if nvml_ok => self.on_clean(node.as_ref(), &mut problems, &mut actions),
                None => {}
            }
        }
        if let Err(e) = self.store.save(&self.state) {
            tracing::error!(error = %e, "cannot save the state file");
            problems.push(format!("state file: {e}"));
        }
        let verdict = if worst.is_some() {
            Verdict::Unhealthy
        } else if !nvml_ok {
            Verdict::Unknown
        } else {
            Verdict::Healthy
        };
        Report { samples, faults, problems, actions, verdict, node }
    }

    fn on_fault(
        &mut self,
        fault: &Fault,
        node: Option<&NodeInfo>,
        problems: &mut Vec<String>,
        actions: &mut Vec<String>,
    ) {
        self.state.clean_checks = 0;
        let reason = fault.reason();
        let Some(node) = node else {
            self.state.pending = Some(reason.clone());
            problems.push(format!("drain pending (Slurm not answering): {reason}"));
            return;
        };
        if node.out_of_service() {
            if self.state.drain.is_some() || !node.reason_is_ours() {
                if !node.reason_is_ours() {
                    actions.push(format!(
                        "left alone: {} is already out of service ({}) by someone else",
                        self.node_name,
                        node.reason.as_deref().unwrap_or("no reason")
                    ));
                }
                self.state.pending = None;
                return;
            }
            // Ours, but our record was lost: take it back.
            self.state.drain = Some(DrainRecord {
                reason: node.reason.clone().unwrap_or_default(),
                action: fault.action.name().to_owned(),
                needs_reboot: fault.class.needs_reboot(),
                boot_id: self.state.boot_id.clone(),
                at: now_unix(),
            });
            self.state.pending = None;
            return;
        }
        match self.fleet_allows() {
            Ok(true) => {}
            Ok(false) => {
                self.state.suppressed_total += 1;
                self.state.pending = None;
                let msg = format!(
                    "drain of {} SUPPRESSED by the fleet guard (max_drained_fraction={}): {reason}",
                    self.node_name, self.cfg.max_drained_fraction
                );
                tracing::error!("{msg}");
                actions.push(msg);
                return;
            }
            Err(e) => {
                self.state.pending = Some(reason.clone());
                problems.push(format!("drain pending (cannot count drained nodes: {e}): {reason}"));
                return;
            }
        }
        if self.cfg.dry_run {
            let msg = format!("dry run: would {} {}: {reason}", fault.action, self.node_name);
            tracing::warn!("{msg}");
            actions.push(msg);
            return;
        }
        let result = if fault.action == Action::Reboot {
            self.slurm.reboot_asap(&self.node_name, &reason)
        } else {
            self.slurm.drain(&self.node_name, &reason)
        };
        match result {
            Ok(()) => {
                tracing::warn!(node = %self.node_name, action = %fault.action, reason = %reason, "node taken out of service");
                actions.push(format!("{}: {} {reason}", fault.action, self.node_name));
                self.state.drain = Some(DrainRecord {
                    reason,
                    action: fault.action.name().to_owned(),
                    needs_reboot: fault.class.needs_reboot(),
                    boot_id: self.state.boot_id.clone(),
                    at: now_unix(),
                });
                self.state.pending = None;
                self.state.drains_total += 1;
            }
            Err(e) => {
                tracing::error!(error = %e, "drain failed; will retry");
                self.state.pending = Some(reason.clone());
                problems.push(format!("drain pending (scontrol failed: {e}): {reason}"));
            }
        }
    }

    /// Whether one more agent drain stays within the fleet guard: at most
    /// `max(1, floor(max_drained_fraction * nodes))` nodes drained by agents,
    /// so a small cluster can still lose its one bad node.
    fn fleet_allows(&self) -> Result<bool, SlurmError> {
        let nodes = self.slurm.nodes()?;
        let drained = nodes.iter().filter(|n| n.name != self.node_name && n.drained_by_agent()).count();
        Ok(drained < fleet_limit(nodes.len(), self.cfg.max_drained_fraction))
    }

    fn on_clean(&mut self, node: Option<&NodeInfo>, problems: &mut Vec<String>, actions: &mut Vec<String>) {
        self.state.pending = None;
        let Some(drain) = self.state.drain.clone() else { return };
        self.state.clean_checks += 1;
        let Some(node) = node else { return };
        if !node.out_of_service() {
            tracing::info!(node = %self.node_name, "the node is back in service (resumed by Slurm or an admin); forgetting the drain");
            self.state.drain = None;
            return;
        }
        if node.reason.as_deref() != Some(drain.reason.as_str()) {
            tracing::info!(
                node = %self.node_name,
                reason = node.reason.as_deref().unwrap_or(""),
                "the drain reason was changed by someone else; leaving the node to them"
            );
            self.state.drain = None;
            return;
        }
        if !self.cfg.auto_resume || self.state.clean_checks < self.cfg.resume_after {
            return;
        }
        if drain.needs_reboot && drain.boot_id == self.state.boot_id {
            return;
        }
        if self.cfg.dry_run {
            actions.push(format!("dry run: would resume {}", self.node_name));
            return;
        }
        match self.slurm.resume(&self.node_name) {
            Ok(()) => {
                tracing::warn!(node = %self.node_name, "fault gone; node resumed");
                actions.push(format!("resume: {}", self.node_name));
                self.state.drain = None;
                self.state.clean_checks = 0;
                self.state.resumes_total += 1;
            }
            Err(e) => problems.push(format!("resume failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_xid_seen_by_nvml_and_the_kernel_log_counts_once() {
        let dir = std::env::temp_dir().join(format!("agent-dedup-{}", std::process::id()));
        let cfg = Config {
            nvml_library: "/nonexistent/libnvidia-ml.so".into(),
            state_dir: dir.join("state"),
            boot_id_path: dir.join("boot_id"),
            ..Config::default()
        };
        let mut agent = Agent::new(cfg);
        let bus = xid::normalize_pci("00000000:61:00.0");
        let nvml = XidEvent { xid: 79, gpu: Some(3), bus: bus.clone(), source: XidSource::Nvml };
        assert!(agent.record_xid(nvml));
        let line = "6,1,5000000,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.";
        let record = xid::parse_line(line).unwrap();
        assert!(!agent.record_kmsg(&record), "the kernel log's copy of the same Xid is not new");
        let other = xid::parse_line(&line.replace("): 79,", "): 48,")).unwrap();
        assert!(agent.record_kmsg(&other));
        assert_eq!(agent.state.xids.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn fleet_limit_allows_at_least_one_node() {
        assert_eq!(fleet_limit(2, 0.1), 1);
        assert_eq!(fleet_limit(2, 0.5), 1);
        assert_eq!(fleet_limit(100, 0.1), 10);
        assert_eq!(fleet_limit(10, 0.3), 3);
        assert_eq!(fleet_limit(0, 0.1), 1);
    }
}
