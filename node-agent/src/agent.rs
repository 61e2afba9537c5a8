//! One check of the node, and carrying out what [`crate::decide`] says.
//!
//! A pass samples the GPUs (NVML, under a deadline), adds this boot's Xids
//! (NVML events and the kernel log, one event seen by both counted once; what
//! an admin cleared no longer counts), evaluates the policy, and asks
//! [`decide`] what to do; the rules are there. With `act`, it takes the state
//! dir's lock, re-reads the state file, carries the decision out in Slurm and
//! writes the state back. Without `act` it changes nothing anywhere.
//!
//! The agent's own trouble (NVML missing or hanging, scontrol failing or
//! slow, the state file unwritable) makes it report itself unhealthy and never
//! drains.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpu_core::pci::PciAddr;
use gpu_core::xid::{self, Action, Event};

use crate::checks;
use crate::config::Config;
use crate::decide::{self, Decision, Fleet, Node, Observation};
use crate::health::{self, Fault, GpuSample, XidEvent, XidSource};
use crate::nvml::{Probe, ProbeError};
use crate::slurm::{NodeInfo, Slurm, SlurmError, SlurmErrorKind};
use crate::state::{ClearRecord, DrainRecord, LoadError, SeenXid, State, Store};

/// How long an Xid seen through one source hides the same Xid from the other.
const DEDUP_WINDOW: Duration = Duration::from_secs(30);

/// How long after its drain an agent re-counts the fleet. Over a second, so a
/// drain it cannot see yet carries a later reason time than its own.
const SETTLE: Duration = Duration::from_millis(1100);

/// An Xid seen lately: Xid, GPU, bus, source, when.
type Recent = (u32, Option<u32>, Option<PciAddr>, XidSource, Instant);

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
    /// The node as Slurm described it, when it was asked and answered.
    pub node: Option<NodeInfo>,
}

/// Where the GPU samples come from: NVML (a [`Probe`]), or a stand-in in tests.
pub trait Gpus: Send + std::fmt::Debug {
    /// Samples every GPU.
    ///
    /// # Errors
    /// NVML is unavailable, hanging, or says the driver does not match.
    fn sample(&mut self) -> Result<Vec<GpuSample>, ProbeError>;
}

impl Gpus for Probe {
    fn sample(&mut self) -> Result<Vec<GpuSample>, ProbeError> {
        Probe::sample(self)
    }
}

/// The agent's long-lived parts.
#[derive(Debug)]
pub struct Agent {
    /// Settings.
    pub cfg: Config,
    /// This node's Slurm name (once Slurm confirmed it, the name it knows).
    pub node_name: String,
    /// The names to try: `node_name`, or the host's short then full name, as slurmd does.
    names: Vec<String>,
    /// Whether Slurm confirmed the node name (and told the expected GPUs).
    resolved: bool,
    slurm: Slurm,
    gpus: Box<dyn Gpus>,
    store: Store,
    /// The state, as of the last read plus what this process saw since.
    pub state: State,
    /// Xids recorded since the last save.
    fresh: Vec<SeenXid>,
    /// Recently seen Xids, for cross-source de-duplication.
    recent: Vec<Recent>,
    /// Bus id → NVML index, from the last samples.
    bus_index: Vec<(PciAddr, u32)>,
    /// Why the state file could not be used at the last read.
    load_error: Option<LoadError>,
    warned: Vec<String>,
    /// GPUs Slurm expects here, once known.
    expected: Option<u32>,
}

/// The current boot's id.
pub fn boot_id(cfg: &Config) -> String {
    std::fs::read_to_string(&cfg.boot_id_path).map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// This host's name, as a default Slurm node name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// The Slurm node names to try for host `host`: its short name, then the
/// full one (`node7`, `node7.cluster.example.org`), in slurmd's order
/// (`gethostname_short` first, then the full name).
pub fn node_name_candidates(host: &str) -> Vec<String> {
    let short = host.split('.').next().unwrap_or(host).to_owned();
    let mut names = vec![short];
    if host != names[0] {
        names.push(host.to_owned());
    }
    names
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Time since boot (`/proc/uptime`), for the fabric's `fabric_timeout`.
fn uptime() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Duration::try_from_secs_f64(secs).ok()
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `2026-11-30T18:04:22Z` for seconds since the epoch.
pub fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A random duration in `[0, max)`.
fn jitter(max: Duration) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(RandomState::new().hash_one(Instant::now()) % nanos)
}

impl Agent {
    /// Sets the agent up: NVML worker, state, Slurm access. Touches nothing.
    pub fn new(cfg: Config) -> Agent {
        let probe = Probe::start(cfg.nvml_library.clone(), cfg.nvml_timeout);
        Agent::with_gpus(cfg, Box::new(probe))
    }

    /// The same, with GPU samples from `gpus`.
    pub fn with_gpus(cfg: Config, gpus: Box<dyn Gpus>) -> Agent {
        let names = match &cfg.node_name {
            Some(n) => vec![n.clone()],
            None => node_name_candidates(&host_name()),
        };
        let slurm = Slurm { scontrol: cfg.scontrol.clone(), timeout: cfg.scontrol_timeout };
        let store = Store::new(&cfg.state_dir);
        let boot = boot_id(&cfg);
        let (state, load_error) = match store.load(&boot) {
            Ok(s) => (s, None),
            Err(e) => {
                tracing::error!(error = %e, "cannot use the state file");
                (State { boot_id: boot, ..State::default() }, Some(e))
            }
        };
        Agent {
            expected: cfg.expected_gpus,
            resolved: cfg.node_name.is_some() && cfg.expected_gpus.is_some(),
            node_name: names[0].clone(),
            names,
            cfg,
            slurm,
            gpus,
            store,
            state,
            fresh: Vec::new(),
            recent: Vec::new(),
            bus_index: Vec::new(),
            load_error,
            warned: Vec::new(),
        }
    }

    /// Why the state file could not be used at the last read, if so.
    pub fn load_error(&self) -> Option<&LoadError> {
        self.load_error.as_ref()
    }

    /// Takes in an Xid (or a lost GPU) from NVML or the kernel log. Returns
    /// whether it is new (not the same event seen through the other source
    /// lately) and may need the node out of service, so worth a pass now.
    pub fn record_xid(&mut self, mut event: XidEvent) -> bool {
        if event.gpu.is_none() {
            if let Some(bus) = &event.bus {
                event.gpu = self.bus_index.iter().find(|(b, _)| b == bus).map(|(_, i)| *i);
            }
        }
        let now = Instant::now();
        self.recent.retain(|(.., at)| now.duration_since(*at) < DEDUP_WINDOW);
        // The same Xid on the same GPU through the other source: one event.
        let same = |(x, g, b, source, _): &Recent| {
            *x == event.xid
                && *source != event.source
                && ((g.is_some() && *g == event.gpu) || (b.is_some() && *b == event.bus))
        };
        if self.recent.iter().any(same) {
            return false;
        }
        self.recent.push((event.xid, event.gpu, event.bus, event.source, now));
        let action = if event.xid == xid::LOST_WITHOUT_XID {
            self.cfg.policy.gpu_lost
        } else {
            self.cfg.policy.xid_action(event.xid)
        };
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
            source: event.source,
            kmsg_us: event.kmsg_us,
            cleared: false,
        };
        self.state.add_xid(seen.clone());
        self.fresh.push(seen);
        action >= Action::Drain
    }

    /// Takes in a kernel-log event.
    pub fn record_kmsg(&mut self, e: &Event) -> bool {
        self.record_xid(XidEvent::from_kmsg(e))
    }

    /// Bus id → NVML index, from a sample of the GPUs.
    fn learn_buses(&mut self, samples: &[GpuSample]) {
        self.bus_index = samples.iter().filter_map(|s| Some((s.bus_id?, s.index))).collect();
    }

    fn gpu_of(&self, x: &SeenXid) -> Option<u32> {
        x.gpu.or_else(|| {
            let bus = x.bus.as_ref()?;
            self.bus_index.iter().find(|(b, _)| b == bus).map(|(_, i)| *i)
        })
    }

    fn xid_events(&self) -> Vec<XidEvent> {
        self.state
            .xids
            .iter()
            .filter(|s| self.state.counts(s, self.gpu_of(s)))
            .map(|s| XidEvent {
                xid: s.xid,
                gpu: self.gpu_of(s),
                bus: s.bus,
                source: s.source,
                kmsg_us: s.kmsg_us,
            })
            .collect()
    }

    /// Reads the state file again and adds what this process saw since the
    /// last save: the file is the truth (a `clear` or a `check --act` may
    /// have written it).
    fn reload(&mut self, boot: &str) {
        match self.store.load(boot) {
            Ok(mut s) => {
                for x in &self.fresh {
                    s.add_xid(x.clone());
                }
                self.state = s;
                self.load_error = None;
            }
            Err(e) => {
                self.state.new_boot(boot);
                self.load_error = Some(e);
            }
        }
    }

    /// Asks Slurm for this node; on the first success, learns the name Slurm
    /// knows it by and the GPUs it configures.
    fn ask_node(&mut self) -> Result<NodeInfo, SlurmError> {
        let node = if self.resolved {
            self.slurm.node(&self.node_name)?.ok_or_else(|| SlurmError {
                cmd: format!("{} show node {}", self.slurm.scontrol.display(), self.node_name),
                kind: SlurmErrorKind::NodeGone(self.node_name.clone()),
            })?
        } else {
            let node = self.slurm.find_node(&self.names)?;
            if node.name != self.node_name {
                tracing::info!(node = %node.name, host = %self.node_name, "Slurm knows this node by its short name");
            }
            node.name.clone_into(&mut self.node_name);
            if self.cfg.expected_gpus.is_none() {
                self.expected = node.gres_gpus;
            }
            self.resolved = true;
            node
        };
        Ok(node)
    }

    /// One check. With `act`, drains or resumes as the rules allow; without,
    /// changes nothing on disk or in Slurm.
    pub fn pass(&mut self, act: bool) -> Report {
        let mut problems = Vec::new();
        let mut actions = Vec::new();
        let lock = if act {
            match self.store.lock() {
                Ok(l) => Some(l),
                Err(e) => {
                    problems.push(format!("state file: {e}"));
                    None
                }
            }
        } else {
            None
        };
        let boot = boot_id(&self.cfg);
        if boot != self.state.boot_id {
            tracing::info!(old = %self.state.boot_id, new = %boot, "new boot");
            self.recent.clear();
        }
        self.reload(&boot);
        if let Some(e) = &self.load_error {
            problems.push(format!("state file unreadable: {e}"));
        }
        let mut faults = Vec::new();
        let (samples, can_tell) = match self.gpus.sample() {
            Ok(s) => (s, true),
            Err(ProbeError::DriverMismatch(e)) => {
                tracing::error!(error = %e, "NVML: driver/library version mismatch");
                faults.push(health::driver_mismatch(&self.cfg.policy));
                (Vec::new(), true)
            }
            Err(e) => {
                problems.push(e.to_string());
                if matches!(e, ProbeError::Hung(_)) {
                    tracing::error!(error = %e, "NVML is not answering");
                }
                (Vec::new(), false)
            }
        };
        if can_tell && !samples.is_empty() {
            self.learn_buses(&samples);
        }
        let mut node: Option<Result<NodeInfo, SlurmError>> = None;
        if !self.resolved {
            let asked = self.ask_node();
            if let Err(e) = &asked {
                problems.push(format!("Slurm: {e}"));
            }
            node = Some(asked);
        }
        let expected = if can_tell && faults.is_empty() { self.expected } else { None };
        faults.extend(health::evaluate(&samples, &self.xid_events(), expected, &self.cfg.policy));
        if can_tell && !samples.is_empty() {
            let now = checks::Now { unix_ms: now_unix_ms(), uptime: uptime() };
            let (found, history) = checks::evaluate(&samples, &self.state.history, now, &self.cfg.policy);
            faults.extend(found);
            self.state.history = history;
        }
        health::sort(&mut faults);
        for f in faults.iter().filter(|f| f.action == Action::Warn) {
            let r = f.reason();
            if !self.warned.contains(&r) {
                tracing::warn!(fault = %r, "GPU warning (the node stays in service)");
                self.warned.push(r);
            }
        }
        let worst = health::worst(&faults).cloned();
        let format_error = matches!(self.load_error, Some(LoadError::Format(_)));
        if act && !format_error {
            let obs = Observation { faults: &faults, can_tell };
            self.act(&obs, &mut node, &mut problems, &mut actions);
            if can_tell {
                let keys: Vec<String> = faults.iter().map(Fault::key).collect();
                self.state.reboots.retain(|k, _| keys.contains(k));
            }
            if lock.is_some() {
                match self.store.save(&self.state) {
                    Ok(()) => self.fresh.clear(),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot save the state file");
                        problems.push(format!("state file: {e}"));
                    }
                }
            }
        }
        drop(lock);
        let verdict = if worst.is_some() {
            Verdict::Unhealthy
        } else if !can_tell {
            Verdict::Unknown
        } else {
            Verdict::Healthy
        };
        Report { samples, faults, problems, actions, verdict, node: node.and_then(Result::ok) }
    }

    /// Asks [`decide`] until it has a decision, then carries it out.
    fn act(
        &mut self,
        obs: &Observation<'_>,
        node: &mut Option<Result<NodeInfo, SlurmError>>,
        problems: &mut Vec<String>,
        actions: &mut Vec<String>,
    ) {
        let mut fleet = Fleet::NotCounted;
        for _ in 0..4 {
            let unreachable;
            let view = match node.as_ref() {
                None => Node::NotAsked,
                Some(Ok(n)) => Node::Known(n),
                Some(Err(e)) => {
                    unreachable = e.to_string();
                    Node::Unreachable(&unreachable)
                }
            };
            let decision = decide::decide(obs, view, fleet, &self.state, &self.cfg);
            match decision {
                Decision::AskNode => *node = Some(self.ask_node()),
                Decision::CountFleet => {
                    // Agents that see a fault at the same moment spread out
                    // before they count, so each sees the others' drains.
                    std::thread::sleep(jitter(self.cfg.drain_jitter));
                    match self.slurm.nodes() {
                        Ok(nodes) => fleet = Fleet::count(&self.node_name, &nodes),
                        Err(e) => {
                            let reason = health::worst(obs.faults).map(Fault::reason).unwrap_or_default();
                            problems
                                .push(format!("drain pending (cannot count drained nodes: {e}): {reason}"));
                            self.state.pending = Some(reason);
                            return;
                        }
                    }
                }
                other => {
                    let error = match node.as_ref() {
                        Some(Err(e)) => e.to_string(),
                        _ => String::new(),
                    };
                    self.carry_out(other, obs, &error, problems, actions);
                    return;
                }
            }
        }
    }

    fn record_drain(&mut self, reason: String, action: Action, needs_reboot: bool) {
        self.state.drain = Some(DrainRecord {
            reason,
            action: action.name().to_owned(),
            needs_reboot,
            boot_id: self.state.boot_id.clone(),
            at: now_unix(),
        });
        self.state.pending = None;
    }

    fn carry_out(
        &mut self,
        decision: Decision,
        obs: &Observation<'_>,
        slurm_error: &str,
        problems: &mut Vec<String>,
        actions: &mut Vec<String>,
    ) {
        let faulty = health::worst(obs.faults).is_some();
        if faulty {
            self.state.clean_checks = 0;
        }
        if !matches!(decision, Decision::Pending { .. }) {
            self.state.pending = None;
        }
        let node = self.node_name.clone();
        let dry = self.cfg.dry_run;
        match decision {
            Decision::LeaveAlone { why, forget } => {
                if forget {
                    tracing::info!(node = %node, "{why}");
                    self.state.drain = None;
                }
                if faulty && why.contains("someone else") {
                    actions.push(format!("left alone: {node} is {why}"));
                }
            }
            Decision::Pending { reason } => {
                self.state.pending = Some(reason.clone());
                problems.push(format!("drain pending (Slurm not answering: {slurm_error}): {reason}"));
            }
            Decision::Suppress { reason } => self.suppress(&reason, "", actions),
            Decision::Adopt { reason, action, needs_reboot } => {
                tracing::info!(node = %node, reason = %reason, "the node carries this agent's reason: taking the drain back");
                self.record_drain(reason, action, needs_reboot);
            }
            Decision::CountClean => self.state.clean_checks += 1,
            Decision::Resume if dry => actions.push(format!("dry run: would resume {node}")),
            Decision::Resume => match self.slurm.resume(&node) {
                Ok(()) => {
                    tracing::warn!(node = %node, "fault gone; node resumed");
                    actions.push(format!("resume: {node}"));
                    self.state.drain = None;
                    self.state.clean_checks = 0;
                    self.state.resumes_total += 1;
                }
                Err(e) => problems.push(format!("resume failed: {e}")),
            },
            Decision::Drain { ref reason, .. } | Decision::Reboot { ref reason, .. } if dry => {
                let what = if matches!(decision, Decision::Reboot { .. }) { "reboot" } else { "drain" };
                let msg = format!("dry run: would {what} {node}: {reason}");
                tracing::warn!("{msg}");
                actions.push(msg);
            }
            Decision::Drain { reason, needs_reboot, cancel_reboot } => {
                if cancel_reboot {
                    if let Err(e) = self.slurm.cancel_reboot(&node) {
                        problems.push(format!("drain pending (cannot cancel the reboot: {e}): {reason}"));
                        self.state.pending = Some(reason);
                        return;
                    }
                    tracing::warn!(node = %node, "reboot request cancelled: a fault needs a person");
                }
                self.drain(reason, needs_reboot, !cancel_reboot, problems, actions);
            }
            Decision::Reboot { reason, key } => match self.slurm.reboot_asap(&node, &reason) {
                Ok(()) => {
                    tracing::warn!(node = %node, action = "reboot", reason = %reason, "node taken out of service");
                    actions.push(format!("reboot: {node} {reason}"));
                    *self.state.reboots.entry(key).or_insert(0) += 1;
                    self.state.drains_total += 1;
                    self.record_drain(reason.clone(), Action::Reboot, false);
                    self.recount(&reason, actions);
                }
                Err(e) => {
                    tracing::error!(error = %e, "Slurm refused the reboot; draining instead");
                    actions.push(format!("reboot refused ({e}); draining instead"));
                    self.drain(reason, false, true, problems, actions);
                }
            },
            Decision::AskNode | Decision::CountFleet => {}
        }
    }

    fn drain(
        &mut self,
        reason: String,
        needs_reboot: bool,
        recount: bool,
        problems: &mut Vec<String>,
        actions: &mut Vec<String>,
    ) {
        let node = self.node_name.clone();
        match self.slurm.drain(&node, &reason) {
            Ok(()) => {
                tracing::warn!(node = %node, action = "drain", reason = %reason, "node taken out of service");
                actions.push(format!("drain: {node} {reason}"));
                self.state.drains_total += 1;
                self.record_drain(reason.clone(), Action::Drain, needs_reboot);
                if recount {
                    self.recount(&reason, actions);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "drain failed; will retry");
                self.state.pending = Some(reason.clone());
                problems.push(format!("drain pending (scontrol failed: {e}): {reason}"));
            }
        }
    }

    /// With the fleet guard on: after a drain, re-counts; a node past the
    /// limit in the tie-break order undoes its drain.
    fn recount(&mut self, reason: &str, actions: &mut Vec<String>) {
        if !decide::guard_on(&self.cfg) {
            return;
        }
        std::thread::sleep(SETTLE);
        let Ok(nodes) = self.slurm.nodes() else { return };
        if decide::keep_after_drain(&self.node_name, &nodes, self.cfg.max_drained_fraction) {
            return;
        }
        let node = self.node_name.clone();
        let rebooting = self.state.drain.as_ref().is_some_and(|d| d.action == Action::Reboot.name());
        let undone = if rebooting { self.slurm.cancel_reboot(&node) } else { self.slurm.resume(&node) };
        if let Err(e) = undone {
            tracing::error!(error = %e, "cannot undo the drain the fleet guard holds back");
            return;
        }
        self.state.drain = None;
        self.state.drains_total = self.state.drains_total.saturating_sub(1);
        self.suppress(reason, " (other nodes drained first; drain undone)", actions);
    }

    fn suppress(&mut self, reason: &str, how: &str, actions: &mut Vec<String>) {
        self.state.suppressed_total += 1;
        let msg = format!(
            "drain of {} SUPPRESSED by the fleet guard (max_drained_fraction={}){how}: {reason}",
            self.node_name, self.cfg.max_drained_fraction
        );
        tracing::error!("{msg}");
        actions.push(msg);
    }

    /// `gpu-node-agent clear [--gpu N]`: after a GPU reset, the Xids seen so
    /// far (on GPU `gpu`, or every GPU) never count again; the agent's drain
    /// may then be resumed without a reboot. Returns what was done, in words.
    ///
    /// # Errors
    /// The state file cannot be used, the agent never drained this node, or
    /// there is no GPU `gpu`. Nothing is changed then.
    pub fn clear(&mut self, gpu: Option<u32>) -> Result<String, String> {
        let _lock = self.store.lock()?;
        let boot = boot_id(&self.cfg);
        self.reload(&boot);
        if let Some(e) = &self.load_error {
            return Err(format!("{e}; nothing changed"));
        }
        if self.state.drain.is_none() {
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
        let upto = self.state.xids.iter().filter_map(|x| x.kmsg_us).max();
        let mut n = 0;
        let covered: Vec<bool> =
            self.state.xids.iter().map(|x| gpu.is_none() || self.gpu_of(x) == gpu).collect();
        for (x, covered) in self.state.xids.iter_mut().zip(covered) {
            if covered && !x.cleared {
                x.cleared = true;
                n += 1;
            }
        }
        let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
        self.state.clears.push(ClearRecord { at: now_unix(), uid, gpu, kmsg_us: upto, xids: n });
        if let Some(d) = self.state.drain.as_mut() {
            d.needs_reboot = false;
        }
        self.state.clean_checks = 0;
        self.state.pending = None;
        let suffix = gpu.map(|g| format!(" gpu{g}"));
        self.state.reboots.retain(|k, _| suffix.as_ref().is_some_and(|s| !k.ends_with(s.as_str())));
        self.store.save(&self.state)?;
        self.fresh.clear();
        let which = gpu.map_or_else(|| "every GPU".to_owned(), |g| format!("GPU {g}"));
        Ok(format!(
            "cleared {n} Xid(s) on {which} of {node}; new Xids still count. Resume the node: scontrol update NodeName={node} State=RESUME",
            node = self.node_name
        ))
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
        let bus = PciAddr::parse("00000000:61:00.0").ok();
        let nvml = XidEvent { xid: 79, gpu: Some(3), bus, source: XidSource::Nvml, kmsg_us: None };
        assert!(agent.record_xid(nvml));
        let line = "6,1,5000000,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.";
        let record = Event::Xid(xid::parse_line(line).unwrap());
        assert!(!agent.record_kmsg(&record), "the kernel log's copy of the same Xid is not new");
        let other = Event::Xid(xid::parse_line(&line.replace("): 79,", "): 48,")).unwrap());
        assert!(agent.record_kmsg(&other));
        assert_eq!(agent.state.xids.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fqdn_host_tries_the_short_name_then_the_full_one() {
        assert_eq!(node_name_candidates("node7.cluster.example.org"), ["node7", "node7.cluster.example.org"]);
        assert_eq!(node_name_candidates("node7"), ["node7"]);
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_795_996_800 + 3_661), "2026-11-30T01:01:01Z");
        assert!(jitter(Duration::from_millis(10)) < Duration::from_millis(10));
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
