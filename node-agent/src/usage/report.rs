//! The ended jobs' summaries, merged into each job's `AdminComment` in
//! Slurm's accounting by a thread of its own ([`Reporter`]), so slurmdbd
//! being slow never holds up the health checks.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;
use std::time::Duration;

use gpu_health::usage::{NodeUsage, merge};

use crate::slurm::Accounting;

/// Tries of the read, merge, update and read back of an `AdminComment`, when
/// another node's agent wrote between the read and the update.
const REPORT_TRIES: u32 = 4;
/// The longest `AdminComment` written (slurmdbd's column holds 64 KiB).
const MAX_COMMENT: usize = 60_000;
/// Ended jobs waiting for their `AdminComment` (more are dropped, logged).
const REPORT_QUEUE: usize = 256;
/// An ended job's summary for [`Reporter`].
#[derive(Debug)]
struct Ended {
    job: u32,
    usage: NodeUsage,
}

/// The thread that merges ended jobs' summaries into their `AdminComment`.
#[derive(Debug)]
pub struct Reporter {
    tx: SyncSender<Ended>,
}

impl Reporter {
    /// Starts it.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn spawn(acct: Accounting) -> std::io::Result<Reporter> {
        let (tx, rx) = mpsc::sync_channel::<Ended>(REPORT_QUEUE);
        thread::Builder::new().name("usage-report".to_owned()).spawn(move || report_loop(&acct, &rx))?;
        Ok(Reporter { tx })
    }

    pub(crate) fn send(&self, job: u32, usage: NodeUsage) {
        match self.tx.try_send(Ended { job, usage }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::warn!(
                    job,
                    "too many ended jobs waiting for slurmctld: this job's GPU use is not kept"
                );
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn report_loop(acct: &Accounting, rx: &Receiver<Ended>) {
    while let Ok(e) = rx.recv() {
        match write_admin_comment(acct, e.job, &e.usage) {
            Ok(calls) => tracing::info!(job = e.job, calls, "GPU use kept in the job's AdminComment"),
            Err(why) => {
                tracing::warn!(job = e.job, error = %why, "cannot keep the job's GPU use in its AdminComment")
            }
        }
    }
}

/// Reads the job's `AdminComment` from slurmdbd, puts this node's summary in
/// it (keeping the other nodes' and the site's words), writes it and reads
/// it back; again, after a short random wait, while another node's write
/// replaced ours (or slurmdbd has no record of the job yet). Returns the
/// slurmdbd calls it took.
///
/// # Errors
/// sacct or sacctmgr failed, or the summary did not stay.
pub fn write_admin_comment(acct: &Accounting, job: u32, usage: &NodeUsage) -> Result<u32, String> {
    let full = usage.to_word();
    let short = usage.without_uuids().to_word();
    let mut calls = 0;
    let mut current = None;
    for attempt in 0..REPORT_TRIES {
        let text = match current.take() {
            Some(t) => t,
            None => {
                calls += 1;
                match acct.admin_comment(job).map_err(|e| e.to_string())? {
                    Some(t) => t,
                    None => {
                        thread::sleep(Duration::from_millis(500 * u64::from(attempt + 1)));
                        continue;
                    }
                }
            }
        };
        // slurmdbd keeps at most 64 KiB of it (a TEXT column): a large job's
        // nodes leave their UUIDs out (about 340 bytes for 8 GPUs), and one
        // that still does not fit is not kept.
        let mut word = &full;
        let mut merged = merge(&text, &usage.node, word);
        if merged.len() > MAX_COMMENT {
            word = &short;
            merged = merge(&text, &usage.node, word);
        }
        if merged.len() > MAX_COMMENT {
            return Err(format!(
                "the AdminComment would pass {MAX_COMMENT} bytes (a job on this many nodes)"
            ));
        }
        calls += 1;
        acct.set_admin_comment(job, &merged).map_err(|e| e.to_string())?;
        calls += 1;
        let back = acct.admin_comment(job).map_err(|e| e.to_string())?.unwrap_or_default();
        if gpu_health::usage::holds(&back, word) {
            return Ok(calls);
        }
        current = Some(back);
        thread::sleep(
            Duration::from_millis(100 + 150 * u64::from(attempt))
                + crate::agent::jitter(Duration::from_millis(300)),
        );
    }
    Err(format!(
        "slurmdbd has no record of the job, or another writer kept replacing it ({REPORT_TRIES} tries)"
    ))
}
