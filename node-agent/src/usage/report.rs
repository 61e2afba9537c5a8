//! The ended jobs' summaries, merged into each job's record in Slurm's
//! accounting (its `AdminComment`, else its `SystemComment`, else only
//! this log: [`gpu_health::admin_comment`]) by a thread of its own
//! ([`Reporter`]), so slurmdbd being slow never holds up the health checks.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;
use std::time::Duration;

use gpu_health::admin_comment::{self, Field, Mangle, Plan, Row, Rules};
use gpu_health::usage::NodeUsage;

use crate::slurm::Accounting;

/// Tries of the read, merge, update and read back of an `AdminComment`, when
/// another node's agent wrote between the read and the update.
const REPORT_TRIES: u32 = 4;
/// The longest `AdminComment` written (slurmdbd's column holds 64 KiB).
const MAX_COMMENT: usize = 60_000;
/// Ended jobs waiting for their `AdminComment` (more are dropped, logged).
const REPORT_QUEUE: usize = 256;
/// The least wait before the second read-back (as much again at random):
/// a writer that read before this write has written by then.
const SETTLE: Duration = Duration::from_millis(300);
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
                    "too many ended jobs waiting to be written to slurmdbd (through sacct and sacctmgr): this job's GPU use is not kept"
                );
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn report_loop(acct: &Accounting, rx: &Receiver<Ended>) {
    let mut rules: Option<Rules> = None;
    while let Ok(e) = rx.recv() {
        let r = *rules.get_or_insert_with(|| match acct.release() {
            Ok(r) => Rules::of(Some(r)),
            Err(why) => {
                tracing::warn!(error = %why, "cannot tell sacctmgr's release: comments are written only where no release changes them");
                Rules::of(None)
            }
        });
        if r == Rules::of(None) {
            rules = None;
        }
        match write_admin_comment(acct, r, e.job, &e.usage) {
            Ok(k) => tracing::info!(
                job = e.job,
                id = %k.id,
                field = k.field.name(),
                calls = k.calls,
                why = k.why.map_or("", Mangle::words),
                "GPU use kept in the job's accounting record"
            ),
            Err(why) => tracing::warn!(
                job = e.job,
                error = %why,
                summary = %e.usage.to_word(),
                "the job's GPU use is kept only in this log"
            ),
        }
    }
}

/// Where a summary was kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The job's id as sacctmgr addressed it: `N`, `A_T` or `H+O`.
    pub id: String,
    /// The comment written.
    pub field: Field,
    /// Why not the `AdminComment`, when the `SystemComment`.
    pub why: Option<Mangle>,
    /// The slurmdbd calls it took.
    pub calls: u32,
}

/// The row of job `job` (its raw id) among what `sacct -j JOB` printed;
/// `None` when slurmdbd has none yet.
fn find_row(acct: &Accounting, job: u32) -> Result<Option<Row>, String> {
    let mut rows: Vec<Row> = acct.rows(job)?.into_iter().filter(|r| r.raw == job).collect();
    match rows.len() {
        0 | 1 => Ok(rows.pop()),
        n => Err(format!("slurmdbd has {n} rows for job {job}")),
    }
}

/// Where the summary goes in `row` ([`admin_comment::plan`]), without the
/// GPUs' UUIDs when the text would pass [`MAX_COMMENT`] bytes (slurmdbd
/// keeps at most 64 KiB: about 340 bytes for 8 GPUs with them).
fn plan_sized(
    rules: Rules,
    row: &Row,
    usage: &NodeUsage,
) -> Result<(Field, String, Option<Mangle>, String), String> {
    for word in [usage.to_word(), usage.without_uuids().to_word()] {
        match admin_comment::plan(rules, row, &usage.node, &word) {
            Plan::Keep(why) => return Err(why),
            Plan::Write { field, text, why } if text.len() <= MAX_COMMENT => {
                return Ok((field, text, why, word));
            }
            Plan::Write { .. } => {}
        }
    }
    Err(format!("the comment would pass {MAX_COMMENT} bytes (a job on this many nodes)"))
}

/// Keeps this node's summary of job `job` (its raw id) in the job's record
/// in slurmdbd, keeping the site's text and the other nodes' summaries:
/// reads the job's row (found by its raw id: [`find_row`]), plans where the
/// summary goes ([`admin_comment::plan`]), writes that one row (addressed
/// as sacct names it: [`admin_comment::write_id`]), reads it back, and
/// again after a short random wait; whenever the summary or the site's text
/// is not as written (another node's agent or the site's own writer came
/// between), plans again from what was read. One read and one write are as
/// near as slurmdbd allows to a compare-and-set: a writer that reads before
/// this write and writes after the last read-back still replaces it.
///
/// # Errors
/// sacct or sacctmgr failed, no comment can take the summary without
/// harming other text, or the summary did not stay.
pub fn write_admin_comment(
    acct: &Accounting,
    rules: Rules,
    job: u32,
    usage: &NodeUsage,
) -> Result<Kept, String> {
    let mut calls = 0;
    let mut current: Option<Row> = None;
    for attempt in 0..REPORT_TRIES {
        let row = match current.take() {
            Some(r) => r,
            None => {
                calls += 1;
                match find_row(acct, job)? {
                    Some(r) => r,
                    None => {
                        thread::sleep(Duration::from_millis(500 * u64::from(attempt + 1)));
                        continue;
                    }
                }
            }
        };
        let id = admin_comment::write_id(&row)?;
        let (field, text, why, word) = plan_sized(rules, &row, usage)?;
        calls += 1;
        acct.set_comment(&id, field, &text).map_err(|e| e.to_string())?;
        calls += 1;
        let mut back = find_row(acct, job)?;
        if back.as_ref().is_some_and(|b| admin_comment::landed(b, field, &text, &word)) {
            thread::sleep(SETTLE + crate::agent::jitter(SETTLE));
            calls += 1;
            back = find_row(acct, job)?;
            if back.as_ref().is_some_and(|b| admin_comment::landed(b, field, &text, &word)) {
                return Ok(Kept { id, field, why, calls });
            }
        }
        current = back;
        thread::sleep(
            Duration::from_millis(100 + 150 * u64::from(attempt))
                + crate::agent::jitter(Duration::from_millis(300)),
        );
    }
    Err(format!(
        "slurmdbd has no record of the job, or another writer kept replacing it ({REPORT_TRIES} tries, {calls} calls)"
    ))
}
