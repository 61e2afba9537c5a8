//! The rules, as one pure function: what one pass does about what it saw.
//!
//! [`decide`] takes what the GPUs showed ([`Observation`]), the node as
//! Slurm describes it ([`Node`]), the fleet's drained GPU nodes ([`Fleet`]),
//! the agent's own record ([`State`]) and the settings, and returns one
//! [`Decision`]. [`crate::agent::Agent`] only carries decisions out. When a
//! decision needs the node or the fleet and the caller has not asked Slurm
//! yet, it says so ([`Decision::AskNode`], [`Decision::CountFleet`]): a
//! healthy node's pass asks Slurm nothing.
//!
//! | # | when | decision |
//! | --- | --- | --- |
//! | 1 | no fault needs the node out of service, and the agent holds no drain | leave alone, ask Slurm nothing |
//! | 2 | a drain-class fault and a reboot-class fault | drain (a person looks): a drain always beats a reboot that returns the node to service |
//! | 3 | a reboot-class fault the agent already rebooted for `max_reboots` times, or cannot count its reboots (its state file unusable, or lost this boot) | drain for a person, no reboot |
//! | 4 | a fault, Slurm not answering | drain pending, retried every pass |
//! | 5 | a fault, the node out of service with a reason that is not exactly the agent's record | leave alone (someone else's); forget a stale record |
//! | 5b | a fault, the agent's record, the node back in service | forget the record (someone resumed it, or Slurm after the agent's reboot; the agent clears the Xids it knew, as `clear` does), then decide again |
//! | 6 | a fault, the node out of service with the agent's recorded reason | leave alone; but a drain-class fault over the agent's own reboot request cancels the reboot and drains |
//! | 7 | a fault, no record, the node out of service with exactly the reason the agent would write now | adopt the drain (the record was lost); not without a usable state file |
//! | 8 | a fault, the node in service, the fleet guard on (`max_drained_fraction` < 1), the fault's class not in `fleet_guard_exempt`, and not counted yet | count the fleet |
//! | 9 | a fault, the node in service, GPU nodes other than this one drained by the agents (a reason in their grammar) ≥ `max(1, floor(fraction × GPU nodes))` | suppress (log, count, `gpu_node_agent_drain_suppressed 1`) |
//! | 10 | a fault, the node in service, room in the fleet | drain, or reboot for a reboot-class fault (if Slurm refuses the reboot: drain in the same pass) |
//! | 11 | no fault, the agent's drain, NVML cannot answer | leave alone (cannot tell) |
//! | 12 | no fault, the agent's drain, the node back in service, or its reason changed | forget the drain: the node is someone else's now (the agent then clears the Xids it knew, as `clear` does) |
//! | 13 | no fault, the agent's drain still exactly in place | count a clean check (a check on the poll clock: see [`crate::policy::rows`]); resume after `resume_after` of them (with `auto_resume`), and for faults only a reboot clears only after a reboot or an admin's `clear`; never without a usable state file |
//!
//! After a drain with the fleet guard on, [`keep_after_drain`] re-counts with
//! a deterministic order (reason time, then node name): a node past the limit
//! undoes its drain.

use gpu_health::xid::Action;

use crate::config::Config;
use crate::policy::health::{self, Class, Fault};
use crate::policy::rows::{self, Step};
use crate::slurm::NodeInfo;
use crate::store::State;

/// What the GPUs showed this pass.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    /// The faults, after the admin's clears (most severe first).
    pub faults: &'a [Fault],
    /// NVML answered for every GPU (else only the other GPUs' and the
    /// kernel log's faults are known).
    pub can_tell: bool,
    /// The agent can keep its state: the writers' lock is held and the state
    /// file read (and, for the actions that need it, written). Without it
    /// the agent neither reboots nor resumes nor adopts: a plain drain at most.
    pub memory: bool,
    /// Whether this check is on the poll clock: only then does a clean
    /// check count toward `resume_after` ([`crate::policy::rows`]).
    pub step: Step,
}

/// The node as Slurm describes it, as far as asked.
#[derive(Clone, Copy, Debug)]
pub enum Node<'a> {
    /// Not asked yet this pass.
    NotAsked,
    /// Asked; Slurm did not answer (the error).
    Unreachable(&'a str),
    /// Slurm's description.
    Known(&'a NodeInfo),
}

/// The fleet's drained GPU nodes, as far as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fleet {
    /// Not counted yet this pass.
    NotCounted,
    /// Counted from `scontrol show nodes`.
    Counted {
        /// Nodes with GPUs in their `Gres=`.
        gpu_nodes: usize,
        /// Of those, the ones other than this one drained by the agents: a
        /// reason in their grammar (`gpu_health::reason`). A rolling maintenance's
        /// drains do not count.
        drained_others: usize,
    },
}

/// Whether a node is out of service by an agent: drained, its reason in the
/// agents' grammar.
pub fn drained_by_agent(n: &NodeInfo) -> bool {
    n.drained() && n.reason.as_deref().is_some_and(health::is_agent_reason)
}

impl Fleet {
    /// Counts the fleet for node `me`.
    pub fn count(me: &str, nodes: &[NodeInfo]) -> Fleet {
        let gpu: Vec<&NodeInfo> = nodes.iter().filter(|n| n.has_gpus()).collect();
        Fleet::Counted {
            gpu_nodes: gpu.len(),
            drained_others: gpu.iter().filter(|n| n.name != me && drained_by_agent(n)).count(),
        }
    }
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing; why. With `forget`, the agent's record is stale: drop it.
    LeaveAlone {
        /// Why, for the log.
        why: String,
        /// Drop the agent's drain record.
        forget: bool,
    },
    /// Ask Slurm for the node, then decide again.
    AskNode,
    /// Count the fleet, then decide again.
    CountFleet,
    /// Drain the node with this reason.
    Drain {
        /// The reason to write.
        reason: String,
        /// Only a reboot (or an admin's clear) clears the fault.
        needs_reboot: bool,
        /// Cancel the agent's own reboot request first.
        cancel_reboot: bool,
    },
    /// Ask Slurm to reboot the node when idle and resume it; if Slurm
    /// refuses, drain with the same reason.
    Reboot {
        /// The reason to write.
        reason: String,
        /// The fault's key, for counting reboots.
        key: String,
    },
    /// Hold the drain back: the fleet guard.
    Suppress {
        /// The reason that was not written.
        reason: String,
    },
    /// The node is out of service with exactly the reason the agent would
    /// write: record it as the agent's.
    Adopt {
        /// The reason.
        reason: String,
        /// `drain` or `reboot`.
        action: Action,
        /// As in [`Decision::Drain`].
        needs_reboot: bool,
    },
    /// Slurm did not answer: keep the drain pending.
    Pending {
        /// The reason to write when it answers.
        reason: String,
    },
    /// No fault; the agent's drain stays: one more clean check.
    CountClean,
    /// No fault for long enough: resume the agent's drain.
    Resume,
}

fn leave(why: &str) -> Decision {
    Decision::LeaveAlone { why: why.to_owned(), forget: false }
}

fn forget(why: &str) -> Decision {
    Decision::LeaveAlone { why: why.to_owned(), forget: true }
}

/// The most nodes that may be drained: `max(1, floor(fraction * gpu_nodes))`.
pub fn fleet_limit(gpu_nodes: usize, fraction: f64) -> usize {
    // Node counts are far below 2^52: the conversions are exact.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let limit = (fraction * gpu_nodes as f64 + 1e-9).floor() as usize;
    limit.max(1)
}

/// Whether the fleet guard is on (a fraction below 1 can hold a drain back).
pub fn guard_on(cfg: &Config) -> bool {
    cfg.max_drained_fraction < 1.0
}

/// Whether the fleet guard may hold back a drain for a fault of `class`: not
/// for a class the admin exempted (`fleet_guard_exempt`).
pub fn guarded(cfg: &Config, class: &Class) -> bool {
    guard_on(cfg) && !cfg.fleet_guard_exempt.contains(class)
}

/// After this node drained: whether it keeps the drain. The GPU nodes the
/// agents drained in order of their reason's time, then name; the first
/// `fleet_limit` keep theirs.
pub fn keep_after_drain(me: &str, nodes: &[NodeInfo], fraction: f64) -> bool {
    let gpu_nodes = nodes.iter().filter(|n| n.has_gpus()).count();
    let mut drained: Vec<(&str, &str)> = nodes
        .iter()
        .filter(|n| n.has_gpus() && drained_by_agent(n))
        .map(|n| (n.reason_time.as_deref().unwrap_or(""), n.name.as_str()))
        .collect();
    drained.sort_unstable();
    drained.iter().position(|(_, name)| *name == me).is_none_or(|i| i < fleet_limit(gpu_nodes, fraction))
}

/// The node action the faults ask for.
struct Want {
    action: Action,
    reason: String,
    key: String,
    needs_reboot: bool,
    class: Class,
}

/// What a reboot-class fault's drain says when the agent cannot count its
/// reboots.
pub const NO_REBOOT_COUNT: &str = "; no reboot: the agent cannot count its reboots";

fn wanted(faults: &[Fault], state: &State, memory: bool, cfg: &Config) -> Option<Want> {
    let f = health::worst(faults)?;
    let key = f.key();
    let class = f.class.clone();
    if f.action == Action::Reboot {
        if !memory || state.history_lost() {
            let reason = f.reason_with(NO_REBOOT_COUNT);
            return Some(Want { action: Action::Drain, reason, key, needs_reboot: true, class });
        }
        let done = state.reboots.get(&key).copied().unwrap_or(0);
        if done < cfg.max_reboots {
            return Some(Want {
                action: Action::Reboot,
                reason: f.reason(),
                key,
                needs_reboot: false,
                class,
            });
        }
        let reason = if done == 0 {
            f.reason()
        } else {
            f.reason_with(&format!("; still there after {done} reboots"))
        };
        return Some(Want { action: Action::Drain, reason, key, needs_reboot: true, class });
    }
    let needs_reboot = f.class.needs_reboot();
    Some(Want { action: Action::Drain, reason: f.reason(), key, needs_reboot, class })
}

/// Whether the reboot cap is reached: the worst fault asks for a reboot and
/// the agent already asked for `max_reboots` of them for it (at least one),
/// so it drains the node for a person instead (rule 3). `false` with
/// `max_reboots = 0` (every such fault is a plain drain then) and when the
/// agent cannot count its reboots (its state file unusable or lost).
pub fn reboot_cap_reached(faults: &[Fault], state: &State, memory: bool, cfg: &Config) -> bool {
    let Some(f) = health::worst(faults) else { return false };
    let done = state.reboots.get(&f.key()).copied().unwrap_or(0);
    f.action == Action::Reboot
        && memory
        && !state.history_lost()
        && cfg.max_reboots > 0
        && done >= cfg.max_reboots
}

/// The rules (see the module docs).
pub fn decide(obs: &Observation<'_>, node: Node<'_>, fleet: Fleet, state: &State, cfg: &Config) -> Decision {
    match wanted(obs.faults, state, obs.memory, cfg) {
        Some(want) => on_fault(want, obs, node, fleet, state, cfg),
        None => on_clean(obs, node, state, cfg),
    }
}

fn on_fault(
    want: Want,
    obs: &Observation<'_>,
    node: Node<'_>,
    fleet: Fleet,
    state: &State,
    cfg: &Config,
) -> Decision {
    let n = match node {
        Node::NotAsked => return Decision::AskNode,
        Node::Unreachable(_) => return Decision::Pending { reason: want.reason },
        Node::Known(n) => n,
    };
    if state.drain.is_some() && !n.out_of_service() {
        return forget(
            "the node is back in service (resumed through Slurm, or by Slurm after the reboot the agent asked for)",
        );
    }
    let ours = state.drain.as_ref().filter(|d| n.reason.as_deref() == Some(d.reason.as_str()));
    if n.out_of_service() {
        if let Some(d) = ours {
            if d.action == Action::Reboot.name() && want.action == Action::Drain {
                return Decision::Drain {
                    reason: want.reason,
                    needs_reboot: want.needs_reboot,
                    cancel_reboot: true,
                };
            }
            return leave("already out of service by this agent");
        }
        if state.drain.is_none()
            && obs.memory
            && n.reason.as_deref() == Some(want.reason.as_str())
            && health::is_agent_reason(&want.reason)
        {
            return Decision::Adopt {
                reason: want.reason,
                action: want.action,
                needs_reboot: want.needs_reboot,
            };
        }
        let why = format!(
            "already out of service ({}) by someone else",
            n.reason.as_deref().unwrap_or("no reason")
        );
        return Decision::LeaveAlone { why, forget: state.drain.is_some() };
    }
    if guarded(cfg, &want.class) {
        match fleet {
            Fleet::NotCounted => return Decision::CountFleet,
            Fleet::Counted { gpu_nodes, drained_others } => {
                if drained_others >= fleet_limit(gpu_nodes, cfg.max_drained_fraction) {
                    return Decision::Suppress { reason: want.reason };
                }
            }
        }
    }
    if want.action == Action::Reboot {
        return Decision::Reboot { reason: want.reason, key: want.key };
    }
    Decision::Drain { reason: want.reason, needs_reboot: want.needs_reboot, cancel_reboot: false }
}

fn on_clean(obs: &Observation<'_>, node: Node<'_>, state: &State, cfg: &Config) -> Decision {
    let Some(d) = &state.drain else {
        return leave(if obs.can_tell { "healthy" } else { "cannot tell (NVML not answering)" });
    };
    if !obs.can_tell {
        return leave("cannot tell (NVML not answering)");
    }
    let n = match node {
        Node::NotAsked => return Decision::AskNode,
        Node::Unreachable(_) => return leave("Slurm not answering"),
        Node::Known(n) => n,
    };
    if !n.out_of_service() {
        return forget("the node is back in service (resumed by Slurm or an admin); forgetting the drain");
    }
    if n.reason.as_deref() != Some(d.reason.as_str()) {
        return forget("the drain reason was changed by someone else; leaving the node to them");
    }
    if !cfg.auto_resume || rows::next(state.clean_checks, true, obs.step) < cfg.resume_after {
        return Decision::CountClean;
    }
    if d.needs_reboot && d.boot_id == state.boot_id {
        return Decision::CountClean;
    }
    if !obs.memory {
        return leave("no resume: the agent cannot keep its state file");
    }
    Decision::Resume
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::health::Class;
    use crate::store::DrainRecord;

    fn fault(class: Class, gpu: u32, action: Action) -> Fault {
        Fault { class, gpu: Some(gpu), action, detail: "detail".to_owned() }
    }

    fn xid79() -> Fault {
        fault(Class::Xid(79), 3, Action::Drain)
    }

    fn remap() -> Fault {
        fault(Class::RemapPending, 5, Action::Reboot)
    }

    fn node(state: &str, reason: Option<&str>) -> NodeInfo {
        NodeInfo {
            name: "n1".into(),
            state: state.into(),
            reason: reason.map(str::to_owned),
            reason_time: None,
            gres_gpus: Some(8),
            gres_mig: 0,
        }
    }

    fn drained_by_us(reason: &str, action: Action, needs_reboot: bool) -> State {
        State {
            boot_id: "b1".into(),
            drain: Some(DrainRecord {
                reason: reason.into(),
                action: action.name().into(),
                needs_reboot,
                boot_id: "b1".into(),
                at: 1,
            }),
            ..State::default()
        }
    }

    fn cfg() -> Config {
        Config { max_drained_fraction: 1.0, ..Config::default() }
    }

    fn run(faults: &[Fault], node: Node<'_>, fleet: Fleet, state: &State, cfg: &Config) -> Decision {
        decide(
            &Observation { faults, can_tell: true, memory: true, step: Step::Advance },
            node,
            fleet,
            state,
            cfg,
        )
    }

    fn sorted(mut f: Vec<Fault>) -> Vec<Fault> {
        f.sort_by_key(|f| {
            std::cmp::Reverse(u8::from(f.action == Action::Drain) * 2 + u8::from(f.action == Action::Reboot))
        });
        f
    }

    fn drain(reason: &str) -> Decision {
        Decision::Drain { reason: reason.into(), needs_reboot: true, cancel_reboot: false }
    }

    #[test]
    fn rule_1_healthy_or_warn_only_asks_slurm_nothing() {
        let state = State::default();
        let warn = [fault(Class::Xid(43), 0, Action::Ignore), fault(Class::Xid(94), 1, Action::Warn)];
        for faults in [&[][..], &warn[..]] {
            let d = run(faults, Node::NotAsked, Fleet::NotCounted, &state, &cfg());
            assert!(matches!(d, Decision::LeaveAlone { forget: false, .. }), "{d:?}");
        }
        let d = decide(
            &Observation { faults: &[], can_tell: false, memory: true, step: Step::Advance },
            Node::NotAsked,
            Fleet::NotCounted,
            &state,
            &cfg(),
        );
        assert!(matches!(d, Decision::LeaveAlone { ref why, .. } if why.contains("cannot tell")), "{d:?}");
    }

    #[test]
    fn rule_2_a_drain_beats_a_reboot() {
        let faults = sorted(vec![remap(), xid79()]);
        let n = node("IDLE", None);
        let d = run(&faults, Node::Known(&n), Fleet::NotCounted, &State::default(), &cfg());
        assert_eq!(d, drain(&xid79().reason()));
    }

    #[test]
    fn rule_3_the_reboot_cap() {
        let n = node("IDLE", None);
        let mut state = State::default();
        state.reboots.insert("remap-pend gpu5".into(), 1);
        let d = run(&[remap()], Node::Known(&n), Fleet::NotCounted, &state, &cfg());
        assert_eq!(d, Decision::Reboot { reason: remap().reason(), key: "remap-pend gpu5".into() });
        state.reboots.insert("remap-pend gpu5".into(), 2);
        let d = run(&[remap()], Node::Known(&n), Fleet::NotCounted, &state, &cfg());
        let Decision::Drain { reason, cancel_reboot: false, .. } = d else { panic!("{d:?}") };
        assert!(reason.ends_with("; still there after 2 reboots"), "{reason}");
        let never = Config { max_reboots: 0, ..cfg() };
        let d = run(&[remap()], Node::Known(&n), Fleet::NotCounted, &State::default(), &never);
        assert_eq!(d, drain(&remap().reason()));
    }

    /// `gpu_node_agent_reboot_cap_reached`: only at the cap, only for a
    /// reboot-class worst fault, never with `max_reboots = 0` or without a
    /// usable state file.
    #[test]
    fn the_reboot_cap_is_told_apart() {
        let mut state = State::default();
        let cap = |faults: &[Fault], state: &State, memory: bool, cfg: &Config| {
            reboot_cap_reached(faults, state, memory, cfg)
        };
        assert!(!cap(&[remap()], &state, true, &cfg()), "no reboot asked for yet");
        state.reboots.insert("remap-pend gpu5".into(), 1);
        assert!(!cap(&[remap()], &state, true, &cfg()), "one of two");
        state.reboots.insert("remap-pend gpu5".into(), 2);
        assert!(cap(&[remap()], &state, true, &cfg()), "two of two");
        assert!(!cap(&[remap()], &state, false, &cfg()), "no state file: cannot count");
        assert!(!cap(&[], &state, true, &cfg()), "the fault is gone");
        assert!(!cap(&sorted(vec![remap(), xid79()]), &state, true, &cfg()), "a drain beats it");
        assert!(!cap(&[remap()], &state, true, &Config { max_reboots: 0, ..cfg() }), "never reboot");
    }

    #[test]
    fn rule_4_slurm_not_answering_keeps_the_drain_pending() {
        let d = run(&[xid79()], Node::Unreachable("timeout"), Fleet::NotCounted, &State::default(), &cfg());
        assert_eq!(d, Decision::Pending { reason: xid79().reason() });
        let d = run(&[xid79()], Node::NotAsked, Fleet::NotCounted, &State::default(), &cfg());
        assert_eq!(d, Decision::AskNode);
    }

    #[test]
    fn rule_5_someone_elses_reason_is_never_taken() {
        for reason in ["maintenance by admin", "gpu: RMA ticket 42", "gpu: xid79 gpu3 detail, says the admin"]
        {
            let n = node("IDLE+DRAIN", Some(reason));
            let d = run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &State::default(), &cfg());
            assert!(
                matches!(d, Decision::LeaveAlone { ref why, forget: false } if why.contains("someone else")),
                "{reason}: {d:?}"
            );
            // With a stale record of another reason: the record is dropped.
            let state = drained_by_us("gpu: ecc-dbe gpu2 detail", Action::Drain, true);
            let d = run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &state, &cfg());
            assert!(matches!(d, Decision::LeaveAlone { forget: true, .. }), "{d:?}");
        }
        let down = node("DOWN+NOT_RESPONDING", Some("Not responding"));
        let d = run(&[xid79()], Node::Known(&down), Fleet::NotCounted, &State::default(), &cfg());
        assert!(matches!(d, Decision::LeaveAlone { .. }), "{d:?}");
    }

    #[test]
    fn rule_5b_a_node_resumed_through_slurm_is_someone_elses() {
        let r = xid79().reason();
        let state = drained_by_us(&r, Action::Drain, true);
        let back = node("IDLE", None);
        let d = run(&[xid79()], Node::Known(&back), Fleet::NotCounted, &state, &cfg());
        assert!(
            matches!(d, Decision::LeaveAlone { forget: true, ref why } if why.contains("back in service")),
            "{d:?}"
        );
        // Without the record, the fault drains again.
        assert_eq!(
            run(&[xid79()], Node::Known(&back), Fleet::NotCounted, &State::default(), &cfg()),
            drain(&r)
        );
    }

    #[test]
    fn rule_6_own_drain_stays_and_a_drain_replaces_own_reboot() {
        let r = xid79().reason();
        let n = node("IDLE+DRAIN", Some(&r));
        let d = run(
            &[xid79()],
            Node::Known(&n),
            Fleet::NotCounted,
            &drained_by_us(&r, Action::Drain, true),
            &cfg(),
        );
        assert!(matches!(d, Decision::LeaveAlone { forget: false, .. }), "{d:?}");
        let rr = remap().reason();
        let n = node("IDLE+DRAIN+REBOOT_REQUESTED", Some(&rr));
        let state = drained_by_us(&rr, Action::Reboot, false);
        let faults = sorted(vec![remap(), xid79()]);
        let d = run(&faults, Node::Known(&n), Fleet::NotCounted, &state, &cfg());
        assert_eq!(d, Decision::Drain { reason: r, needs_reboot: true, cancel_reboot: true });
        let d = run(&[remap()], Node::Known(&n), Fleet::NotCounted, &state, &cfg());
        assert!(matches!(d, Decision::LeaveAlone { forget: false, .. }), "{d:?}");
    }

    #[test]
    fn rule_7_adopt_only_the_exact_reason_with_no_record() {
        let r = xid79().reason();
        let n = node("IDLE+DRAIN", Some(&r));
        let d = run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &State::default(), &cfg());
        assert_eq!(d, Decision::Adopt { reason: r, action: Action::Drain, needs_reboot: true });
        // A reason in the agent's grammar, but not what it would write now.
        let n = node("IDLE+DRAIN", Some("gpu: xid48 gpu1 double-bit ECC error (nvml)"));
        let d = run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &State::default(), &cfg());
        assert!(matches!(d, Decision::LeaveAlone { .. }), "{d:?}");
    }

    #[test]
    fn rules_8_to_10_the_fleet_guard() {
        let on = Config { max_drained_fraction: 0.1, ..Config::default() };
        let n = node("IDLE", None);
        let st = State::default();
        assert_eq!(run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &st, &on), Decision::CountFleet);
        let full = Fleet::Counted { gpu_nodes: 20, drained_others: 2 };
        assert_eq!(
            run(&[xid79()], Node::Known(&n), full, &st, &on),
            Decision::Suppress { reason: xid79().reason() }
        );
        let room = Fleet::Counted { gpu_nodes: 20, drained_others: 1 };
        assert_eq!(run(&[xid79()], Node::Known(&n), room, &st, &on), drain(&xid79().reason()));
        assert!(matches!(run(&[remap()], Node::Known(&n), room, &st, &on), Decision::Reboot { .. }));
        // The guard off: no count at all.
        assert_eq!(
            run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &st, &cfg()),
            drain(&xid79().reason())
        );
    }

    #[test]
    fn link_and_mode_faults_follow_the_same_rules() {
        let warn = [
            fault(Class::EccOff, 1, Action::Warn),
            fault(Class::Slowdown, 3, Action::Warn),
            fault(Class::NvLinkErrors, 5, Action::Warn),
            fault(Class::PersistenceOff, 0, Action::Ignore),
        ];
        let d = run(&warn, Node::NotAsked, Fleet::NotCounted, &State::default(), &cfg());
        assert!(
            matches!(d, Decision::LeaveAlone { forget: false, .. }),
            "warn-only asks Slurm nothing: {d:?}"
        );
        // One fault, a node as Slurm describes it, the fleet guard off unless `c` says.
        let one = |f: &Fault, n: &NodeInfo, fleet: Fleet, c: &Config| {
            run(std::slice::from_ref(f), Node::Known(n), fleet, &State::default(), c)
        };
        let pcie = fault(Class::Pcie, 2, Action::Drain);
        let idle = node("IDLE", None);
        let d = one(&pcie, &idle, Fleet::NotCounted, &cfg());
        assert_eq!(d, drain(&pcie.reason()), "a PCIe link resumes only after a reboot");
        let down = fault(Class::NvLinkDown, 5, Action::Drain);
        let d = one(&down, &idle, Fleet::NotCounted, &cfg());
        assert_eq!(d, Decision::Drain { reason: down.reason(), needs_reboot: false, cancel_reboot: false });
        let admins = node("IDLE+DRAIN", Some("bad riser, says the admin"));
        let d = one(&pcie, &admins, Fleet::NotCounted, &cfg());
        assert!(matches!(d, Decision::LeaveAlone { ref why, .. } if why.contains("someone else")), "{d:?}");
        let guard = Config { max_drained_fraction: 0.1, ..Config::default() };
        let full = Fleet::Counted { gpu_nodes: 20, drained_others: 2 };
        assert_eq!(one(&pcie, &idle, full, &guard), Decision::Suppress { reason: pcie.reason() });
        let reboot = fault(Class::Fabric, 0, Action::Reboot);
        let d = one(&reboot, &idle, Fleet::NotCounted, &cfg());
        assert_eq!(d, Decision::Reboot { reason: reboot.reason(), key: "fabric gpu0".into() });
    }

    #[test]
    fn the_fleet_counts_gpu_nodes_and_the_agents_drains_only() {
        let mut nodes: Vec<NodeInfo> = (0..40)
            .map(|i| NodeInfo {
                name: format!("n{i:02}"),
                state: "IDLE".into(),
                gres_gpus: (i < 20).then_some(8),
                ..NodeInfo::default()
            })
            .collect();
        nodes[3].state = "IDLE+DRAIN".into();
        nodes[3].reason = Some("gpu: xid79 gpu3 GPU has fallen off the bus (nvml)".into());
        nodes[30].state = "IDLE+DRAIN".into();
        nodes[30].reason = Some("gpu: lost gpu0 NVML: GPU is lost (fallen off the bus)".into());
        // A rolling maintenance: drains that are not the agents'.
        for (i, why) in [(4, "kernel upgrade"), (5, "gpu: RMA ticket 42"), (6, "")] {
            nodes[i].state = "IDLE+DRAIN".into();
            nodes[i].reason = (!why.is_empty()).then(|| why.to_owned());
        }
        assert_eq!(Fleet::count("n05", &nodes), Fleet::Counted { gpu_nodes: 20, drained_others: 1 });
        assert_eq!(Fleet::count("n03", &nodes), Fleet::Counted { gpu_nodes: 20, drained_others: 0 });
        assert_eq!(fleet_limit(20, 0.1), 2);
        assert_eq!(fleet_limit(2, 0.1), 1);
        assert_eq!(fleet_limit(100, 0.1), 10);
        assert_eq!(fleet_limit(0, 0.1), 1);
    }

    #[test]
    fn after_draining_the_losers_of_the_tie_break_undo() {
        let mut nodes: Vec<NodeInfo> = (0..4)
            .map(|i| NodeInfo { name: format!("n{i}"), gres_gpus: Some(8), ..NodeInfo::default() })
            .collect();
        for (i, t) in [(3, "2026-01-01T00:00:05"), (1, "2026-01-01T00:00:06"), (2, "2026-01-01T00:00:06")] {
            nodes[i].state = "IDLE+DRAIN".into();
            nodes[i].reason = Some("gpu: ecc-dbe gpu1 2 volatile uncorrectable ECC errors".into());
            nodes[i].reason_time = Some(t.into());
        }
        // An admin's drain, earlier than all: not the agents', it takes no place.
        let mut admin = NodeInfo { name: "a0".into(), gres_gpus: Some(8), ..NodeInfo::default() };
        admin.state = "IDLE+DRAIN".into();
        admin.reason = Some("maintenance".into());
        admin.reason_time = Some("2026-01-01T00:00:01".into());
        nodes.push(admin);
        nodes.push(NodeInfo { name: "a1".into(), gres_gpus: Some(8), ..NodeInfo::default() });
        // 6 GPU nodes at 0.5: 3 may stay drained, and the admin's earlier drain takes no place.
        assert!(keep_after_drain("n2", &nodes, 0.5));
        // 4 GPU nodes at 0.5: 2: n3 (earliest), then n1 (same second as n2, name first).
        let nodes: Vec<NodeInfo> = nodes.into_iter().filter(|n| !n.name.starts_with('a')).collect();
        assert!(keep_after_drain("n3", &nodes, 0.5));
        assert!(keep_after_drain("n1", &nodes, 0.5));
        assert!(!keep_after_drain("n2", &nodes, 0.5));
        assert!(keep_after_drain("n0", &nodes, 0.5), "not drained: nothing to undo");
    }

    #[test]
    fn without_a_usable_state_a_plain_drain_at_most() {
        let n = node("IDLE", None);
        let blind = |faults: &[Fault], node: Node<'_>, state: &State| {
            decide(
                &Observation { faults, can_tell: true, memory: false, step: Step::Advance },
                node,
                Fleet::NotCounted,
                state,
                &cfg(),
            )
        };
        // Rule 3: no reboot it could not count.
        let d = blind(&[remap()], Node::Known(&n), &State::default());
        let Decision::Drain { reason, needs_reboot: true, cancel_reboot: false } = d else { panic!("{d:?}") };
        assert!(reason.starts_with("gpu: remap-pend gpu5") && reason.ends_with(NO_REBOOT_COUNT), "{reason}");
        // The same after a lost state file, with a usable one again.
        let lost = State {
            lost: Some(crate::store::LostHistory { history_lost: true, ..Default::default() }),
            ..State::default()
        };
        let d = run(&[remap()], Node::Known(&n), Fleet::NotCounted, &lost, &cfg());
        assert!(
            matches!(d, Decision::Drain { ref reason, .. } if reason.ends_with(NO_REBOOT_COUNT)),
            "{d:?}"
        );
        // A drain is still made.
        assert_eq!(blind(&[xid79()], Node::Known(&n), &State::default()), drain(&xid79().reason()));
        // No adoption: it could not record it.
        let r = xid79().reason();
        let ours = node("IDLE+DRAIN", Some(&r));
        assert!(matches!(
            blind(&[xid79()], Node::Known(&ours), &State::default()),
            Decision::LeaveAlone { .. }
        ));
        // No resume.
        let mut state = drained_by_us(&r, Action::Drain, false);
        state.clean_checks = 5;
        let d = blind(&[], Node::Known(&ours), &state);
        assert!(
            matches!(d, Decision::LeaveAlone { ref why, forget: false } if why.contains("no resume")),
            "{d:?}"
        );
        assert_eq!(run(&[], Node::Known(&ours), Fleet::NotCounted, &state, &cfg()), Decision::Resume);
    }

    #[test]
    fn an_admin_may_exempt_the_fatal_classes_from_the_fleet_guard() {
        let on = Config {
            max_drained_fraction: 0.1,
            fleet_guard_exempt: vec![Class::Lost, Class::Xid(79), Class::Xid(95)],
            ..Config::default()
        };
        let n = node("IDLE", None);
        let full = Fleet::Counted { gpu_nodes: 20, drained_others: 2 };
        let st = State::default();
        assert_eq!(run(&[xid79()], Node::Known(&n), Fleet::NotCounted, &st, &on), drain(&xid79().reason()));
        assert_eq!(run(&[xid79()], Node::Known(&n), full, &st, &on), drain(&xid79().reason()));
        let lost = fault(Class::Lost, 1, Action::Drain);
        assert!(matches!(run(&[lost], Node::Known(&n), full, &st, &on), Decision::Drain { .. }));
        let ecc = fault(Class::EccUncorrectable, 2, Action::Drain);
        assert_eq!(
            run(std::slice::from_ref(&ecc), Node::Known(&n), Fleet::NotCounted, &st, &on),
            Decision::CountFleet
        );
        assert_eq!(
            run(std::slice::from_ref(&ecc), Node::Known(&n), full, &st, &on),
            Decision::Suppress { reason: ecc.reason() }
        );
        assert!(guarded(&on, &Class::Xid(48)) && !guarded(&on, &Class::Xid(95)));
    }

    #[test]
    fn rules_11_to_13_resume_only_own_drain_when_clean() {
        let r = xid79().reason();
        let ours = node("IDLE+DRAIN", Some(&r));
        let mut state = drained_by_us(&r, Action::Drain, true);
        let c = Config { resume_after: 2, ..cfg() };
        let blind = decide(
            &Observation { faults: &[], can_tell: false, memory: true, step: Step::Advance },
            Node::Known(&ours),
            Fleet::NotCounted,
            &state,
            &c,
        );
        assert!(matches!(blind, Decision::LeaveAlone { forget: false, .. }), "{blind:?}");
        assert_eq!(run(&[], Node::NotAsked, Fleet::NotCounted, &state, &c), Decision::AskNode);
        let back = node("IDLE", None);
        assert!(matches!(
            run(&[], Node::Known(&back), Fleet::NotCounted, &state, &c),
            Decision::LeaveAlone { forget: true, .. }
        ));
        let changed = node("IDLE+DRAIN", Some("taken over by admin"));
        assert!(matches!(
            run(&[], Node::Known(&changed), Fleet::NotCounted, &state, &c),
            Decision::LeaveAlone { forget: true, .. }
        ));
        assert_eq!(run(&[], Node::Known(&ours), Fleet::NotCounted, &state, &c), Decision::CountClean);
        state.clean_checks = 1;
        // Enough clean checks, but an Xid needs a reboot first.
        assert_eq!(run(&[], Node::Known(&ours), Fleet::NotCounted, &state, &c), Decision::CountClean);
        state.boot_id = "b2".into();
        assert_eq!(run(&[], Node::Known(&ours), Fleet::NotCounted, &state, &c), Decision::Resume);
        let off = Config { auto_resume: false, ..c.clone() };
        assert_eq!(run(&[], Node::Known(&ours), Fleet::NotCounted, &state, &off), Decision::CountClean);
        // A fault a reset clears (or a clear by the admin): no reboot needed.
        let mut reset = drained_by_us(&r, Action::Drain, false);
        reset.clean_checks = 1;
        assert_eq!(run(&[], Node::Known(&ours), Fleet::NotCounted, &reset, &c), Decision::Resume);
        // A clean check off the poll clock (the Epilog gate's) never resumes:
        // the count is the poll's.
        let held = Observation { faults: &[], can_tell: true, memory: true, step: Step::Hold };
        assert_eq!(decide(&held, Node::Known(&ours), Fleet::NotCounted, &reset, &c), Decision::CountClean);
    }
}
