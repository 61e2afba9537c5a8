//! One check of the node, and carrying out what [`crate::decide`] says.
//!
//! A pass samples the GPUs (NVML, each GPU under its own deadline), adds
//! this boot's Xids (NVML events and the kernel log, one event seen by both
//! counted once; what an admin cleared no longer counts), evaluates the
//! policy, and asks [`decide`] what to do; the rules are there. With `act`,
//! it takes the state dir's lock, re-reads the state file, carries the
//! decision out in Slurm and writes the state back. Without `act`, or with
//! `dry_run`, it changes nothing anywhere: no Slurm call that changes a
//! node, no write in `state_dir`.
//!
//! The agent's own trouble (NVML missing or hanging, scontrol failing or
//! slow, the state file unusable) makes it report itself unhealthy and never
//! drains. Without a usable state file (no lock, a file it cannot read or
//! write) it acts only where no memory is needed: a plain drain at most,
//! never a reboot, a resume or an adoption. A corrupt file is kept aside
//! and what it held is never acted on (see [`crate::store`]).
//!
//! Submodules: [`xids`] (taking Xids in, `clear`, a resume by someone else)
//! and [`carry`] (carrying a decision out in Slurm).

mod carry;
mod xids;

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use slurm_formats::pci::PciAddr;

use crate::config::Config;
use crate::decide::{self, Decision, Fleet, Node, Observation};
use crate::policy::checks;
use crate::policy::health::{self, Fault, GpuSample, Hang};
use crate::policy::rows::{self, Step};
use crate::slurm::{NodeInfo, Slurm, SlurmError, SlurmErrorKind};
use crate::sources::nvml::{Probe, ProbeError};
use crate::store::{HangRecord, KmsgMark, LoadError, LostHistory, State, Store, XidBook};

/// How long after its drain an agent re-counts the fleet, in milliseconds.
/// Over a second, so a drain it cannot see yet carries a later reason time
/// than its own.
const SETTLE_MS: u64 = 1100;

/// The verdict of a pass; `check` and `status` exit with [`Verdict::exit_code`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No fault that needs the node out of service.
    Healthy,
    /// A fault that needs the node drained (or rebooted).
    Unhealthy,
    /// The agent cannot tell (NVML missing or hanging).
    Unknown,
}

impl Verdict {
    /// The exit status of `check` and `status` (docs/admin.md, "Exit
    /// statuses"): 0 healthy, 1 needs draining, 3 cannot tell. 2 is the
    /// command line's usage error and 4 a bad configuration, never a verdict.
    pub const fn exit_code(self) -> u8 {
        match self {
            Verdict::Healthy => 0,
            Verdict::Unhealthy => 1,
            Verdict::Unknown => 3,
        }
    }
}

/// Why a pass runs: on the poll clock, or asked for between polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The daemon's poll, or a `check` (by hand, or as Slurm's
    /// HealthCheckProgram): the "in a row" counters move on
    /// ([`crate::policy::rows`]).
    Poll,
    /// At once for an Xid that may need the node out of service: the
    /// counters hold.
    Xid,
    /// The Epilog gate asked (`gpu-node-agent epilog`): the counters hold,
    /// and a drain is made without `drain_jitter`'s wait. That wait spreads
    /// the fleet's agents when one fault hits many nodes at the same poll;
    /// an Epilog is waiting on this pass (within its deadline), and the
    /// fleet guard holds without the wait: each guarded drain is re-counted
    /// [`SETTLE_MS`] after it, and a node past the limit in the tie-break
    /// order undoes its own drain ([`decide::keep_after_drain`]), so the
    /// nodes of one job whose Epilogs ask at once never stay drained past
    /// `max_drained_fraction`.
    Gate,
    /// The poll, due while the Epilog gate asked: the counters move on (it
    /// is the poll), and a drain is made without the wait (an Epilog waits).
    PollForGate,
}

impl Trigger {
    /// What the pass may do to the "in a row" counters.
    pub const fn step(self) -> Step {
        match self {
            Trigger::Poll | Trigger::PollForGate => Step::Advance,
            Trigger::Xid | Trigger::Gate => Step::Hold,
        }
    }

    /// Whether an Epilog waits on the pass: no `drain_jitter` then.
    pub const fn epilog_waits(self) -> bool {
        matches!(self, Trigger::Gate | Trigger::PollForGate)
    }
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
    /// Whether the agent could keep its state this pass (lock, read, write).
    pub state_ok: bool,
    /// The reboot cap is reached ([`decide::reboot_cap_reached`]).
    pub reboot_cap: bool,
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

/// What this process took in since its last save, added to the file's state
/// at every read (a `clear` or a `check --act` may have written it).
#[derive(Clone, Debug, Default)]
struct Fresh {
    book: XidBook,
    /// The newest kernel-log record taken in.
    mark: Option<KmsgMark>,
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
    /// Xids taken in since the last save.
    fresh: Fresh,
    /// Recent Xids per (Xid, GPU), to count one event seen by both sources once.
    recent: HashMap<(u32, xids::PairKey), xids::Pair>,
    /// Bus id → NVML index, from the last samples.
    bus_index: Vec<(PciAddr, u32)>,
    /// Why the state file could not be used at the last read.
    load_error: Option<LoadError>,
    warned: Vec<String>,
    /// Ignored Xids already logged once at info level.
    ignored_logged: BTreeSet<u32>,
    /// GPUs Slurm expects here, once known.
    expected: Option<u32>,
    /// Whether `state` comes from a good read of the file (or of no file)
    /// in this process.
    trusted: bool,
    /// Why the pass under way runs.
    trigger: Trigger,
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

/// A random duration in `[0, max)`.
pub(crate) fn jitter(max: Duration) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(RandomState::new().hash_one(Instant::now()) % nanos)
}

/// How one pass may use the state file.
#[derive(Clone, Copy, Debug)]
struct Memory {
    /// The writers' lock is held (this pass writes `state_dir`).
    locked: bool,
    /// The state is usable: read (or kept aside and started over) and, so
    /// far, written.
    ok: bool,
}

impl Agent {
    /// Sets the agent up: NVML probe, state, Slurm access. Touches nothing.
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
                // A corrupt file held history (clears, what was handled): the
                // kernel log up to here is that history, never counted again.
                let kmsg_mark = match (&e, &cfg.kmsg_path) {
                    (LoadError::Corrupt(_), Some(path)) => {
                        crate::sources::kmsg::newest(path).unwrap_or_else(|e| {
                            tracing::warn!(path = %path.display(), error = %e, "cannot read the kernel log");
                            None
                        })
                    }
                    _ => None,
                };
                (State { boot_id: boot, kmsg_mark, ..State::default() }, Some(e))
            }
        };
        let trusted = load_error.is_none();
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
            fresh: Fresh::default(),
            recent: HashMap::new(),
            bus_index: Vec::new(),
            load_error,
            warned: Vec::new(),
            ignored_logged: BTreeSet::new(),
            trusted,
            trigger: Trigger::Poll,
        }
    }

    /// Why the state file could not be used at the last read, if so.
    pub fn load_error(&self) -> Option<&LoadError> {
        self.load_error.as_ref()
    }

    /// Bus id → NVML index, from a sample of the GPUs.
    fn learn_buses(&mut self, samples: &[GpuSample]) {
        self.bus_index = samples.iter().filter_map(|s| Some((s.bus_id?, s.index))).collect();
    }

    /// Reads the state file again and adds what this process saw since the
    /// last save: the file is the truth (a `clear` or a `check --act` may
    /// have written it). A dry run keeps what only it tracks (the checks'
    /// history, hangs) from its own memory: it never writes the file.
    fn reload(&mut self, boot: &str) {
        match self.store.load(boot) {
            Ok(mut s) => {
                s.xids.merge(&self.fresh.book);
                if let Some(m) = &self.fresh.mark {
                    s.merge_mark(m);
                }
                if self.cfg.dry_run && s.boot_id == self.state.boot_id {
                    s.history = std::mem::take(&mut self.state.history);
                    s.hangs = std::mem::take(&mut self.state.hangs);
                }
                self.state = s;
                self.load_error = None;
                self.trusted = true;
            }
            Err(e) => {
                self.state.new_boot(boot);
                self.load_error = Some(e);
            }
        }
    }

    /// A corrupt state file, under the writers' lock: kept aside, and the
    /// state in memory written in its place. That is this process's last
    /// good read and what it saw since, when it had one (the daemon, whose
    /// file went bad while it ran): nothing is lost. Otherwise what the file
    /// held is gone: the state starts over from the kernel log's position
    /// when the agent started ([`Agent::with_gpus`]; older records are
    /// history it no longer has and never count), and reboot counts are
    /// unknown, so no reboot is asked for until the next boot or an admin's
    /// `clear`. Returns whether the state could be written.
    fn start_over(&mut self, error: &str, problems: &mut Vec<String>) -> bool {
        let now = now_unix();
        let kept = match self.store.set_aside(now) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "the state file is corrupt and cannot be kept aside");
                problems.push(format!("state file corrupt ({error}) and cannot be kept aside: {e}"));
                return false;
            }
        };
        let history_lost = !self.trusted;
        self.state.corrupt_total += 1;
        self.state.lost = Some(LostHistory {
            at: now,
            kept_as: kept.display().to_string(),
            error: error.to_owned(),
            history_lost,
        });
        self.load_error = None;
        let msg = if history_lost {
            format!(
                "state file was corrupt ({error}); kept as {}. Its Xids, clears and reboot counts are lost: only Xids after the agent \
                 started count, and no reboot is asked for until the next boot or `gpu-node-agent clear`",
                kept.display()
            )
        } else {
            format!(
                "state file was corrupt ({error}); kept as {}, and written again from this agent's memory (its last good read and what it saw since)",
                kept.display()
            )
        };
        tracing::error!("{msg}");
        problems.push(msg);
        match self.store.save(&self.state) {
            Ok(()) => {
                self.fresh = Fresh::default();
                self.trusted = true;
                true
            }
            Err(e) => {
                problems.push(format!("state file: {e}"));
                false
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

    /// The hung GPUs' hang records: a GPU hangs one more poll (on the poll
    /// clock only), or no longer.
    fn count_hangs(&mut self, samples: &mut [GpuSample], problems: &mut Vec<String>) {
        let now = now_unix();
        let step = self.trigger.step();
        for s in samples.iter_mut() {
            let key = s.index.to_string();
            match &mut s.hang {
                Some(h) => {
                    let rec = self
                        .state
                        .hangs
                        .entry(key)
                        .or_insert(HangRecord { since: now.saturating_sub(h.secs), polls: 0 });
                    rec.polls = rows::next(rec.polls, true, step);
                    *h = Hang { secs: now.saturating_sub(rec.since).max(h.secs), polls: rec.polls };
                    problems.push(format!(
                        "NVML hung on GPU {}: it has not answered for {} s ({} of nvml_hang_polls = {} polls)",
                        s.index, h.secs, h.polls, self.cfg.policy.nvml_hang_polls
                    ));
                }
                None => {
                    self.state.hangs.remove(&key);
                }
            }
        }
    }

    /// The faults of the samples and of this boot's Xids that still count.
    fn faults(&self, base: &[Fault]) -> Vec<Fault> {
        let mut faults = base.to_vec();
        faults.extend(health::evaluate(&[], &self.xid_seen(), None, &self.cfg.policy));
        health::sort(&mut faults);
        faults
    }

    /// One check on the poll clock. With `act`, drains or resumes as the
    /// rules allow; without, changes nothing on disk or in Slurm. `dry_run`
    /// acts only in words.
    pub fn pass(&mut self, act: bool) -> Report {
        self.pass_on(act, Trigger::Poll)
    }

    /// [`Agent::pass`], run for `trigger`.
    pub fn pass_on(&mut self, act: bool, trigger: Trigger) -> Report {
        self.trigger = trigger;
        let mut problems = Vec::new();
        let mut actions = Vec::new();
        let writer = act && !self.cfg.dry_run;
        let mut memory = Memory { locked: false, ok: true };
        let lock = if writer {
            match self.store.lock() {
                Ok(l) => Some(l),
                Err(e) => {
                    problems.push(format!(
                        "state file: {e}; without it no reboot, resume or adoption, drains only"
                    ));
                    memory.ok = false;
                    None
                }
            }
        } else {
            None
        };
        memory.locked = lock.is_some();
        let boot = boot_id(&self.cfg);
        if boot != self.state.boot_id {
            tracing::info!(old = %self.state.boot_id, new = %boot, "new boot");
            self.recent.clear();
        }
        self.reload(&boot);
        match self.load_error.clone() {
            None => {}
            Some(LoadError::Corrupt(e)) if memory.locked => memory.ok = self.start_over(&e, &mut problems),
            Some(e) => {
                let then = if matches!(e, LoadError::Corrupt(_)) && !writer {
                    " (corrupt: the next acting pass keeps it aside)"
                } else {
                    ""
                };
                problems.push(format!("state file unreadable: {e}{then}"));
                memory.ok = false;
            }
        }
        let mut base = Vec::new();
        let (mut samples, mut can_tell) = match self.gpus.sample() {
            Ok(s) => (s, true),
            Err(ProbeError::DriverMismatch(e)) => {
                tracing::error!(error = %e, "NVML: driver/library version mismatch");
                base.push(health::driver_mismatch(&self.cfg.policy));
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
        let answered_at_all = can_tell && base.is_empty();
        if can_tell {
            self.count_hangs(&mut samples, &mut problems);
            can_tell = samples.iter().all(|s| s.hang.is_none());
        }
        let answered: Vec<GpuSample> = samples.iter().filter(|s| s.hang.is_none()).cloned().collect();
        self.learn_buses(&answered);
        let mut node = None;
        if !self.resolved {
            let asked = self.ask_node();
            if let Err(e) = &asked {
                problems.push(format!("Slurm: {e}"));
            }
            node = Some(asked);
        }
        let expected = if answered_at_all { self.expected } else { None };
        base.extend(health::evaluate(&samples, &[], expected, &self.cfg.policy));
        if !answered.is_empty() {
            let now = checks::Now { unix_ms: now_unix_ms(), uptime: uptime(), step: trigger.step() };
            let (found, history) = checks::evaluate(&answered, &self.state.history, now, &self.cfg.policy);
            base.extend(found);
            self.state.history = history;
        }
        let mut faults = self.faults(&base);
        for f in faults.iter().filter(|f| f.action == gpu_health::xid::Action::Warn) {
            let r = f.reason();
            if !self.warned.contains(&r) {
                tracing::warn!(fault = %r, "GPU warning (the node stays in service)");
                self.warned.push(r);
            }
        }
        let format_error = matches!(self.load_error, Some(LoadError::Format(_)));
        if act && !format_error {
            faults = self.act(&base, can_tell, &mut memory, &mut node, &mut problems, &mut actions);
            if can_tell {
                let keys: Vec<String> = faults.iter().map(Fault::key).collect();
                self.state.reboots.retain(|k, _| keys.contains(k));
            }
            if memory.locked && self.load_error.is_none() {
                match self.store.save(&self.state) {
                    Ok(()) => self.fresh = Fresh::default(),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot save the state file");
                        problems.push(format!("state file: {e}"));
                        memory.ok = false;
                    }
                }
            }
        }
        drop(lock);
        let verdict = if health::worst(&faults).is_some() {
            Verdict::Unhealthy
        } else if !can_tell {
            Verdict::Unknown
        } else {
            Verdict::Healthy
        };
        let state_ok = memory.ok && self.load_error.is_none();
        let reboot_cap = decide::reboot_cap_reached(&faults, &self.state, state_ok, &self.cfg);
        Report {
            samples,
            faults,
            problems,
            actions,
            verdict,
            node: node.and_then(Result::ok),
            state_ok,
            reboot_cap,
        }
    }

    /// Asks [`decide`] until it has a decision, then carries it out; a node
    /// someone else took over first clears what the agent knew. Returns the
    /// faults the decision was made on.
    fn act(
        &mut self,
        base: &[Fault],
        can_tell: bool,
        memory: &mut Memory,
        node: &mut Option<Result<NodeInfo, SlurmError>>,
        problems: &mut Vec<String>,
        actions: &mut Vec<String>,
    ) -> Vec<Fault> {
        let mut fleet = Fleet::NotCounted;
        let mut faults = self.faults(base);
        for _ in 0..5 {
            let unreachable;
            let view = match node.as_ref() {
                None => Node::NotAsked,
                Some(Ok(n)) => Node::Known(n),
                Some(Err(e)) => {
                    unreachable = e.to_string();
                    Node::Unreachable(&unreachable)
                }
            };
            let obs = Observation { faults: &faults, can_tell, memory: memory.ok, step: self.trigger.step() };
            let decision = decide::decide(&obs, view, fleet, &self.state, &self.cfg);
            match decision {
                Decision::AskNode => *node = Some(self.ask_node()),
                Decision::CountFleet => {
                    // Agents that see a fault at the same moment spread out
                    // before they count, so each sees the others' drains;
                    // not while an Epilog waits (see [`Trigger::Gate`]).
                    if !self.trigger.epilog_waits() {
                        std::thread::sleep(jitter(self.cfg.drain_jitter));
                    }
                    match self.slurm.nodes() {
                        Ok(nodes) => fleet = Fleet::count(&self.node_name, &nodes),
                        Err(e) => {
                            let reason = health::worst(&faults).map(Fault::reason).unwrap_or_default();
                            problems
                                .push(format!("drain pending (cannot count drained nodes: {e}): {reason}"));
                            self.state.pending = Some(reason);
                            return faults;
                        }
                    }
                }
                Decision::LeaveAlone { why, forget: true } => {
                    self.taken_over(&why, actions);
                    faults = self.faults(base);
                }
                other => {
                    let error = match node.as_ref() {
                        Some(Err(e)) => e.to_string(),
                        _ => String::new(),
                    };
                    let obs = Observation {
                        faults: &faults,
                        can_tell,
                        memory: memory.ok,
                        step: self.trigger.step(),
                    };
                    self.carry_out(other, &obs, &error, memory, problems, actions);
                    return faults;
                }
            }
        }
        faults
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fqdn_host_tries_the_short_name_then_the_full_one() {
        assert_eq!(node_name_candidates("node7.cluster.example.org"), ["node7", "node7.cluster.example.org"]);
        assert_eq!(node_name_candidates("node7"), ["node7"]);
    }

    #[test]
    fn jitter_is_below_its_bound() {
        assert!(jitter(Duration::from_millis(10)) < Duration::from_millis(10));
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
