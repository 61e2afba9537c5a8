//! Carrying a [`Decision`] out in Slurm, and recording it.
//!
//! A reboot request is recorded (its count saved) before it is made: a
//! reboot the agent could not count is never asked for, a plain drain is
//! made instead. A dry run says what it would do (`dry run: would drain`,
//! `would reboot`, `would resume`, `would adopt`) and changes nothing.

use gpu_health::xid::Action;

use super::{Agent, Memory, SETTLE_MS, now_unix};
use crate::decide::{self, Decision, Observation};
use crate::policy::{health, rows};
use crate::store::DrainRecord;

impl Agent {
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

    pub(super) fn carry_out(
        &mut self,
        decision: Decision,
        obs: &Observation<'_>,
        slurm_error: &str,
        memory: &mut Memory,
        problems: &mut Vec<String>,
        actions: &mut Vec<String>,
    ) {
        let worst = health::worst(obs.faults);
        if worst.is_some() {
            self.state.clean_checks = rows::next(self.state.clean_checks, false, obs.step);
        }
        if !matches!(decision, Decision::Pending { .. }) {
            self.state.pending = None;
        }
        if !matches!(decision, Decision::Suppress { .. }) {
            self.state.suppressed = None;
        }
        // A drain the fleet guard may undo, unless the class is exempt.
        let guarded = worst.is_some_and(|f| decide::guarded(&self.cfg, &f.class));
        let node = self.node_name.clone();
        let dry = self.cfg.dry_run;
        match decision {
            Decision::LeaveAlone { why, .. } => {
                if worst.is_some() && why.contains("someone else") {
                    actions.push(format!("left alone: {node} is {why}"));
                }
                if why.starts_with("no resume") {
                    problems.push(format!("{why}: {node} stays drained"));
                }
            }
            Decision::Pending { reason } => {
                self.state.pending = Some(reason.clone());
                problems.push(format!("drain pending (Slurm not answering: {slurm_error}): {reason}"));
            }
            Decision::Suppress { reason } => self.suppress(&reason, "", actions),
            Decision::Adopt { reason, .. } if dry => {
                let msg =
                    format!("dry run: would adopt the drain of {node}: its reason is this agent's: {reason}");
                tracing::warn!("{msg}");
                actions.push(msg);
            }
            Decision::Adopt { reason, action, needs_reboot } => {
                tracing::info!(node = %node, reason = %reason, "the node carries this agent's reason: taking the drain back");
                self.record_drain(reason, action, needs_reboot);
            }
            Decision::CountClean => {
                self.state.clean_checks = rows::next(self.state.clean_checks, true, obs.step)
            }
            Decision::Resume if dry => {
                let msg = format!("dry run: would resume {node}");
                tracing::warn!("{msg}");
                actions.push(msg);
            }
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
                self.drain(reason, needs_reboot, guarded && !cancel_reboot, problems, actions);
            }
            Decision::Reboot { reason, key } => {
                // Counted before it is asked for: a reboot the agent cannot
                // count would be asked for again after it.
                *self.state.reboots.entry(key.clone()).or_insert(0) += 1;
                let recorded = if memory.locked { self.store.save(&self.state) } else { Ok(()) };
                if let Err(e) = recorded {
                    if let Some(n) = self.state.reboots.get_mut(&key) {
                        *n = n.saturating_sub(1);
                    }
                    memory.ok = false;
                    tracing::error!(error = %e, "cannot record the reboot request; draining instead");
                    problems.push(format!("state file: {e}; no reboot it cannot count: draining instead"));
                    let reason = health::clip_reason(format!("{reason}{}", decide::NO_REBOOT_COUNT));
                    self.drain(reason, true, guarded, problems, actions);
                    return;
                }
                match self.slurm.reboot_asap(&node, &reason) {
                    Ok(()) => {
                        tracing::warn!(node = %node, action = "reboot", reason = %reason, "node taken out of service");
                        actions.push(format!("reboot: {node} {reason}"));
                        self.state.drains_total += 1;
                        self.record_drain(reason.clone(), Action::Reboot, false);
                        if guarded {
                            self.recount(&reason, actions);
                        }
                    }
                    Err(e) => {
                        if let Some(n) = self.state.reboots.get_mut(&key) {
                            *n = n.saturating_sub(1);
                        }
                        tracing::error!(error = %e, "Slurm refused the reboot; draining instead");
                        actions.push(format!("reboot refused ({e}); draining instead"));
                        self.drain(reason, false, guarded, problems, actions);
                    }
                }
            }
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
                // After a repair: `clear`, then resume; a resume alone is taken as
                // the repair of everything seen up to then.
                tracing::warn!(
                    node = %node,
                    action = "drain",
                    reason = %reason,
                    after_repair = %format!("gpu-node-agent clear [--gpu N], then scontrol update NodeName={node} State=RESUME"),
                    "node taken out of service"
                );
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
        std::thread::sleep(std::time::Duration::from_millis(SETTLE_MS));
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
        self.state.suppressed = Some(reason.to_owned());
        let msg = format!(
            "drain of {} SUPPRESSED by the fleet guard (max_drained_fraction={}){how}: {reason}",
            self.node_name, self.cfg.max_drained_fraction
        );
        tracing::error!("{msg}");
        actions.push(msg);
    }
}
