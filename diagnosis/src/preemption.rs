//! What a preempted job was sent, as this cluster does it (`autopsy` of a
//! `PREEMPTED` job).
//!
//! From Slurm's source, the same logic on 22.05 through 26.05
//! (`_job_check_grace_internal` and `slurm_job_preempt`, src/slurmctld/preempt.c
//! up to 24.05, src/interfaces/preempt.c from 24.11; `send_job_warn_signal`,
//! src/slurmctld/job_mgr.c; slurm.conf.5 `GraceTime` and `PreemptParameters`):
//!
//! - the grace time is the QoS's `GraceTime` under `PreemptType=preempt/qos`,
//!   the partition's under `preempt/partition_prio` (`preempt_p_get_grace_time`);
//! - with a grace time, the job's end is set to now + GraceTime and at once
//!   its `--signal` goes out (to the batch shell with `B:`, else to its steps),
//!   whatever the signal's `@N` lead time, if the cluster sends the user signal
//!   on preemption and the job has one; otherwise its tasks get SIGCONT and
//!   SIGTERM. At the new end, Slurm cancels or requeues it: SIGCONT and SIGTERM
//!   to the tasks and the batch shell, SIGKILL `KillWait` seconds later;
//! - with no grace time (0, the default), it is cancelled or requeued at once
//!   (SIGTERM, SIGKILL after `KillWait`), the user signal, where the cluster
//!   sends it, only at that same moment;
//! - the user signal on preemption is `SlurmctldParameters=preempt_send_user_signal`
//!   on 22.05 (`_preempt_jobs`, src/slurmctld/node_scheduler.c); from 23.02
//!   also `PreemptParameters=send_user_signal` (either is read, as substrings,
//!   case-insensitively, as Slurm's `xstrcasestr` does).

use slurm_formats::units::parse_duration;

use super::release::Release;

/// What `scontrol show config` says about preemption.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreemptConfig {
    /// `PreemptType` (`preempt/qos`, `preempt/partition_prio`, `preempt/none`).
    pub preempt_type: String,
    /// `PreemptMode` (`REQUEUE`, `CANCEL`, `SUSPEND,GANG`, `OFF`).
    pub preempt_mode: String,
    /// `PreemptParameters` (23.02 on), empty when `(null)`.
    pub preempt_params: String,
    /// `SlurmctldParameters`, empty when `(null)`.
    pub slurmctld_params: String,
    /// `KillWait` in seconds (30 when not said, Slurm's default).
    pub kill_wait_s: u64,
}

/// `scontrol show config`'s `Key = value` lines, the preemption settings read.
pub fn parse_config(text: &str) -> PreemptConfig {
    let mut c = PreemptConfig { kill_wait_s: 30, ..PreemptConfig::default() };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        let v = v.trim();
        let v = if v == "(null)" { "" } else { v };
        match k.trim() {
            "PreemptType" => c.preempt_type = v.to_owned(),
            "PreemptMode" => c.preempt_mode = v.to_owned(),
            "PreemptParameters" => c.preempt_params = v.to_owned(),
            "SlurmctldParameters" => c.slurmctld_params = v.to_owned(),
            "KillWait" => {
                if let Some(n) = v.split_whitespace().next().and_then(|n| n.parse().ok()) {
                    c.kill_wait_s = n;
                }
            }
            _ => {}
        }
    }
    if c.preempt_type.is_empty() {
        c.preempt_type = "preempt/none".into();
    }
    c
}

impl PreemptConfig {
    /// Whether the job's `--signal` goes out at preemption on `release`.
    pub fn sends_user_signal(&self, release: Release) -> bool {
        let has = |hay: &str, needle: &str| hay.to_ascii_lowercase().contains(needle);
        has(&self.slurmctld_params, "preempt_send_user_signal")
            || (release.series() >= (23, 2) && has(&self.preempt_params, "send_user_signal"))
    }

    /// The setting that turns it on, on `release`.
    pub fn user_signal_setting(release: Release) -> &'static str {
        if release.series() >= (23, 2) {
            "PreemptParameters=send_user_signal"
        } else {
            "SlurmctldParameters=preempt_send_user_signal"
        }
    }
}

/// A QoS's `GraceTime` (seconds) and `PreemptMode` from `sacctmgr -n -P show
/// qos NAME format=Name,GraceTime,Preempt,PreemptMode`.
pub fn parse_qos_grace(text: &str, name: &str) -> Option<(u64, String)> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split('|').collect();
        (f.first().map(|n| n.trim()) == Some(name))
            .then(|| Some((parse_duration(f.get(1)?.trim())?, f.get(3).map_or("", |m| m.trim()).to_owned())))
            .flatten()
    })
}

/// A partition's `GraceTime` (seconds) and `PreemptMode` from `scontrol show
/// partition -o NAME`.
pub fn parse_partition_grace(text: &str) -> Option<(u64, String)> {
    let line = text.lines().find(|l| l.trim_start().starts_with("PartitionName="))?;
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).map(str::to_owned);
    Some((field("GraceTime=")?.parse().ok()?, field("PreemptMode=").unwrap_or_default()))
}

/// What a preempted job got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    /// The preempt mode in force for it (`REQUEUE`, `CANCEL`).
    pub mode: String,
    /// Its grace time in seconds, when known.
    pub grace_s: Option<u64>,
    /// Whose grace time: `QoS low`, `partition gpu`.
    pub grace_of: String,
    /// Whether the cluster sends the job's `--signal` at preemption.
    pub user_signal: bool,
    /// `KillWait`, seconds.
    pub kill_wait_s: u64,
    /// The words, one finding per line.
    pub lines: Vec<String>,
}

/// What the job got at preemption on this cluster: `config` (`scontrol show
/// config`), the job's QoS or partition (`grace_of`, with its grace time and
/// preempt mode when they could be read), on `release`.
pub fn preemption(
    config: &PreemptConfig,
    grace_of: &str,
    grace: Option<(u64, String)>,
    release: Release,
) -> Preemption {
    let user_signal = config.sends_user_signal(release);
    let setting = PreemptConfig::user_signal_setting(release);
    let (grace_s, own_mode) = match grace {
        Some((g, m)) => (Some(g), m),
        None => (None, String::new()),
    };
    let mode = if own_mode.is_empty() || own_mode.eq_ignore_ascii_case("cluster") {
        config.preempt_mode.clone()
    } else {
        own_mode.to_ascii_uppercase()
    };
    let kw = config.kill_wait_s;
    let mut lines = Vec::new();
    let grace_words = grace_s.map_or_else(|| "not known".to_owned(), |g| format!("{g} s"));
    lines.push(format!(
        "preemption on this cluster: PreemptType={}, PreemptMode={mode}, GraceTime of {grace_of} {grace_words}, \
         KillWait {kw} s, the user signal at preemption {} ({setting})",
        config.preempt_type,
        if user_signal { "on" } else { "off" }
    ));
    lines.push(match (grace_s, user_signal) {
        (Some(g), true) if g > 0 => format!(
            "what it got: at once its --signal (to the batch shell with B:, else to its steps' tasks), \
             whatever the signal's @ lead time, or SIGTERM to its tasks if it had no --signal; {g} s later \
             SIGTERM to the tasks and the batch shell, and SIGKILL {kw} s after that. A USR1 trap had {g} s \
             to save a checkpoint"
        ),
        (Some(g), false) if g > 0 => format!(
            "what it got: at once SIGCONT and SIGTERM to its tasks, not its --signal ({setting} is not set, so a \
             USR1 trap never fired at preemption); {g} s later SIGTERM to the tasks and the batch shell, and \
             SIGKILL {kw} s after that. To save on preemption here, have the program write a checkpoint when it \
             gets SIGTERM (Python: signal.signal(signal.SIGTERM, handler)) within {g} s, or ask the admins for \
             {setting}"
        ),
        (Some(_), true) => format!(
            "what it got: no grace time (GraceTime 0): its --signal at the moment Slurm ended it, with SIGTERM, \
             and SIGKILL {kw} s later: at most {kw} s to save, too little for most checkpoints. Save checkpoints \
             as it runs, and ask the admins for a GraceTime on {grace_of}"
        ),
        (Some(_), false) => format!(
            "what it got: no grace time (GraceTime 0) and no user signal ({setting} is not set): SIGTERM at once \
             and SIGKILL {kw} s later; a USR1 trap never fired. Only checkpoints saved as it ran survive"
        ),
        (None, true) => format!(
            "what it got: its --signal at preemption (or SIGTERM to its tasks without one), then after {grace_of}'s \
             GraceTime SIGTERM and SIGKILL {kw} s later"
        ),
        (None, false) => format!(
            "what it got: SIGTERM to its tasks at preemption, not its --signal ({setting} is not set: a USR1 trap \
             never fired), and SIGKILL {kw} s after {grace_of}'s GraceTime ended"
        ),
    });
    let word = mode.split(',').find(|m| !m.eq_ignore_ascii_case("GANG")).unwrap_or("").to_ascii_uppercase();
    match word.as_str() {
        "REQUEUE" => lines.push(
            "Slurm requeued it (PreemptMode=REQUEUE): it runs again from the top of its script, so it must \
             resume from its latest checkpoint"
                .to_owned(),
        ),
        "CANCEL" => lines.push(
            "Slurm cancelled it (PreemptMode=CANCEL): resubmit it (with --requeue and the recipe below, a \
             requeue from the USR1 trap keeps it in the queue)"
                .to_owned(),
        ),
        _ => {}
    }
    Preemption { mode, grace_s, grace_of: grace_of.to_owned(), user_signal, kill_wait_s: kw, lines }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::{R22_05, R24_11};

    const CONFIG_2411: &str = "KillWait                = 30 sec\nPreemptMode             = REQUEUE\n\
        PreemptParameters       = send_user_signal\nPreemptType             = preempt/qos\n\
        SlurmctldParameters     = (null)\n";

    #[test]
    fn the_user_signal_per_release() {
        let c = parse_config(CONFIG_2411);
        assert_eq!((c.kill_wait_s, c.preempt_type.as_str()), (30, "preempt/qos"));
        assert!(c.sends_user_signal(R24_11));
        // 22.05 has no PreemptParameters: only SlurmctldParameters counts.
        assert!(!c.sends_user_signal(R22_05));
        let old = parse_config("SlurmctldParameters = enable_configless,preempt_send_user_signal\n");
        assert!(old.sends_user_signal(R22_05) && old.sends_user_signal(R24_11));
        assert!(!parse_config("PreemptParameters = (null)\n").sends_user_signal(R24_11));
        assert_eq!(parse_config("").preempt_type, "preempt/none");
    }

    #[test]
    fn grace_times() {
        assert_eq!(parse_qos_grace("low|00:02:00||cluster\n", "low"), Some((120, "cluster".into())));
        assert_eq!(parse_qos_grace("low|00:02:00||cluster\n", "high"), None);
        let part =
            "PartitionName=gpu AllowGroups=ALL Default=YES GraceTime=300 Hidden=NO PreemptMode=CANCEL\n";
        assert_eq!(parse_partition_grace(part), Some((300, "CANCEL".into())));
    }

    #[test]
    fn what_a_preempted_job_got() {
        let c = parse_config(CONFIG_2411);
        let p = preemption(&c, "QoS low", Some((120, "cluster".into())), R24_11);
        assert_eq!((p.mode.as_str(), p.grace_s, p.user_signal), ("REQUEUE", Some(120), true));
        assert!(p.lines[1].contains("A USR1 trap had 120 s"), "{:?}", p.lines);
        assert!(p.lines[2].contains("requeued"), "{:?}", p.lines);
        // The same on 22.05: no user signal, SIGTERM to the tasks.
        let p = preemption(&c, "QoS low", Some((120, "cancel".into())), R22_05);
        assert!(!p.user_signal);
        assert!(
            p.lines[1].contains("SlurmctldParameters=preempt_send_user_signal is not set"),
            "{:?}",
            p.lines
        );
        assert!(p.lines[2].contains("cancelled"), "{:?}", p.lines);
        // No grace time.
        let p = preemption(&c, "QoS low", Some((0, String::new())), R24_11);
        assert!(p.lines[1].contains("at most 30 s to save"), "{:?}", p.lines);
    }
}
