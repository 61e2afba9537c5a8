//! The GPU use of a job (`spank-gpu usage`, `autopsy`'s "GPU use"): the
//! live read on a running job's nodes, and the report as text and JSON
//! (the report itself is [`job_diagnosis::usage`]'s).
//!
//! While a job runs, the agent on each of its nodes keeps that node's
//! summary in `/run/spank-gpu/usage/JOBID` (one word, world-readable).
//! A login node has no agent, so the file is read where it is: one task per
//! node of the job, as the user, through `srun --jobid=JOBID --overlap`
//! ([`live_srun_args`]), under a deadline.

use std::time::Duration;

use job_diagnosis::usage::{Finding, NodeUsage, UsageReport};
use serde_json::{Value, json};

/// srun's options for the live read, besides `--jobid`, the node and task
/// counts and one task per node ([`live_srun_args`]):
///
/// - `--overlap`: the step shares what the job's other steps hold. Since
///   21.08 it overlaps CPUs, memory and GRES alike on every release we run
///   (slurm_opt.c's `overlap_force`; stepmgr skips the other steps' use), so
///   the step starts beside them; without `--gres` it keeps the job's GPUs
///   (`_copy_job_tres_to_step`), which `--gres=none` would take away under
///   ConstrainDevices;
/// - `--cpus-per-task=1`: the least a task needs, whatever the job or the
///   environment (`SLURM_CPUS_PER_TASK`, `SRUN_CPUS_PER_TASK`) asks;
/// - `--kill-on-bad-exit=0`: a node without the file (cat exits 1) does not
///   end the read on the others;
/// - `--label`: each task's lines, stdout and stderr, start with its task
///   number (`0: `), srun's own lines do not: a complaint of cat's, in any
///   language, is told from srun's by its label ([`live_outcome`]);
/// - `--quiet`: no informational lines on stderr;
/// - `--job-name`: the step is named in `sacct` and `squeue -s`.
///
/// Slurm 24.11 and later start a step in a job for its user alone.
pub const LIVE_SRUN_OPTIONS: &[&str] = &[
    "--overlap",
    "--cpus-per-task=1",
    "--kill-on-bad-exit=0",
    "--label",
    "--quiet",
    "--job-name=spank-gpu-usage",
];

/// How long the live read may take, the step's start included.
pub const LIVE_DEADLINE: Duration = Duration::from_secs(30);

/// The live directory on the job's nodes: the agent's `run_dir/usage`.
pub fn live_dir() -> String {
    format!("{}/{}", task_plan::jobmap::RUN_DIR, task_plan::jobmap::USAGE_DIR)
}

/// srun's arguments that read `job`'s live file on each of its `nodes` nodes.
pub fn live_srun_args(job: &str, nodes: usize) -> Vec<String> {
    let mut args = vec![
        format!("--jobid={job}"),
        format!("--nodes={nodes}"),
        format!("--ntasks={nodes}"),
        "--ntasks-per-node=1".to_owned(),
    ];
    args.extend(LIVE_SRUN_OPTIONS.iter().map(|o| (*o).to_owned()));
    args.push("/bin/cat".to_owned());
    args.push(format!("{}/{job}", live_dir().trim_end_matches('/')));
    args
}

/// The summaries on the job's nodes (a node without the file gives none),
/// or why nothing could be read (srun failed or timed out).
pub fn live_read(job: &str, nodes: usize) -> Result<Vec<NodeUsage>, String> {
    if nodes == 0 {
        return Err("Slurm's record of the job names no node".to_owned());
    }
    let out = crate::slurm_cmd::run("srun", &live_srun_args(job, nodes), LIVE_DEADLINE)?;
    live_outcome(&out.stdout, &out.stderr, out.status.success(), &out.status.to_string())
}

/// Whether a line is a task's under `srun --label` (`0: `, ` 12: `).
fn labelled(line: &str) -> bool {
    let t = line.trim_start();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && t[digits..].starts_with(": ")
}

/// What the live read's srun answered: the summaries its tasks printed;
/// when none, an error only when srun itself failed (it failed and no task
/// said anything: a task's complaint, labelled, is a node without a live
/// file, which the report names), whatever the language of the messages.
///
/// # Errors
/// srun failed before any task ran.
pub fn live_outcome(
    stdout: &str,
    stderr: &str,
    success: bool,
    status: &str,
) -> Result<Vec<NodeUsage>, String> {
    let words = job_diagnosis::usage::from_admin_comment(stdout);
    let tasks_ran = stdout.lines().chain(stderr.lines()).any(labelled);
    if words.is_empty() && !success && !tasks_ran {
        let line = crate::slurm_cmd::first_line(stderr);
        return Err(if line.is_empty() { format!("srun failed ({status})") } else { line });
    }
    Ok(words)
}

/// `sacct` arguments for an ended job's summaries, and the delimiter they
/// give sacct for [`ended_summaries`]: both comments, framed by the row's
/// raw id and split at a random delimiter of this call's own, so that no
/// comment can shift the fields ([`gpu_health::admin_comment::parse_rows`]).
pub fn ended_query(job: &str) -> (Vec<String>, String) {
    let token = gpu_health::admin_comment::new_token();
    (gpu_health::admin_comment::sacct_args(job, &token), token)
}

/// An ended job's summaries from `sacct` [`ended_query`],
/// and where they were.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ended {
    /// The summaries, one per node (the `AdminComment`'s first).
    pub words: Vec<NodeUsage>,
    /// `AdminComment`, `SystemComment`, or both, where summaries were.
    pub from: Vec<&'static str>,
    /// Why there is none, when there is none.
    pub note: Option<String>,
}

/// The row of `job` (as the user named it: `N`, `A_T`, `H+O`) in what
/// sacct printed: the one of that `JobID`, else of that raw id.
fn ended_row<'a>(
    rows: &'a [gpu_health::admin_comment::Row],
    job: &str,
) -> Option<&'a gpu_health::admin_comment::Row> {
    rows.iter().find(|r| r.job_id == job).or_else(|| rows.iter().find(|r| r.raw.to_string() == job))
}

/// The summaries of `job` in sacct's answer: the agents write the
/// `AdminComment`, or the `SystemComment` where sacctmgr would have
/// changed the site's text there (the agent's log says which and why).
pub fn ended_summaries(sacct: &str, token: &str, job: &str) -> Ended {
    use gpu_health::admin_comment::{Field, parse_rows};
    let rows = match parse_rows(sacct, token) {
        Ok(rows) => rows,
        Err(e) => return Ended { note: Some(e), ..Ended::default() },
    };
    let Some(row) = ended_row(&rows, job) else {
        return Ended { note: Some(format!("accounting has no row for job {job}")), ..Ended::default() };
    };
    let mut out = Ended::default();
    for field in [Field::Admin, Field::System] {
        for w in job_diagnosis::usage::from_admin_comment(field.of(row)) {
            if !out.words.iter().any(|u| u.node.eq_ignore_ascii_case(&w.node)) {
                if !out.from.contains(&field.name()) {
                    out.from.push(field.name());
                }
                out.words.push(w);
            }
        }
    }
    if out.words.is_empty() {
        out.note = Some(format!(
            "no summary in job {}'s AdminComment or SystemComment: the agents keep a summary they could not \
             write there in their log (journalctl -u gpu-node-agent | grep 'job={}')",
            row.job_id, row.raw
        ));
    }
    out
}

/// Where an ended job's summaries were, in words: `AdminComment`,
/// `SystemComment`, or both.
pub fn kept_in_words(report: &UsageReport) -> String {
    match report.kept_in.as_slice() {
        [one] => one.clone(),
        [] => "AdminComment".to_owned(),
        many => many.join(" and "),
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} %"))
}

fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{g:.1}")
}

/// Energy for a person: `420 J`, `850 kJ` under a kWh, `2.31 kWh`; `-`
/// when unknown.
fn energy(joules: Option<u64>) -> String {
    const KWH: u64 = 3_600_000;
    match joules {
        None => "-".to_owned(),
        Some(j) if j < 1000 => format!("{j} J"),
        Some(j) if j < KWH => format!("{} kJ", (j + 500) / 1000),
        #[allow(clippy::cast_precision_loss)]
        Some(j) => format!("{:.2} kWh", j as f64 / KWH as f64),
    }
}

/// The job's energy, all GPUs together, in a line; `None` when no GPU has one.
fn energy_line(report: &UsageReport) -> Option<String> {
    let t = report.energy_total()?;
    let mut notes = Vec::new();
    if t.gpus < t.of {
        notes.push(format!("{} of {} GPUs; the others have no energy counter", t.gpus, t.of));
    }
    if t.shared {
        notes.push("a shared GPU counts whole".to_owned());
    }
    let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
    Some(format!("energy, all GPUs: {}{notes}", energy(Some(t.joules))))
}

/// The table, one line per node and GPU and per node without a summary,
/// then the job's energy, all GPUs together.
pub fn table(report: &UsageReport) -> Vec<String> {
    let mut rows: Vec<[String; 8]> = vec![[
        "NODE".into(),
        "GPU".into(),
        "UTIL MEAN".into(),
        "UTIL MAX".into(),
        "MEMORY MAX (GiB)".into(),
        "IDLE".into(),
        "ENERGY".into(),
        "SAMPLES".into(),
    ]];
    for g in &report.gpus {
        let samples = if g.shared { format!("{} (shared)", g.samples) } else { g.samples.to_string() };
        rows.push([
            g.node.clone(),
            g.label(),
            pct(g.util_mean),
            g.util_max.map_or_else(|| "-".to_owned(), |m| format!("{m} %")),
            format!("{} of {}", gib(g.mem_max_bytes), gib(g.mem_total_bytes)),
            format!("{:.0} %", g.idle_fraction * 100.0),
            energy(g.energy_joules),
            samples,
        ]);
    }
    if report.gpus.is_empty() && report.unread.is_empty() {
        return Vec::new();
    }
    let widths: Vec<usize> = (0..8).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let mut lines: Vec<String> = rows
        .iter()
        .map(|r| {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect();
    for u in &report.unread {
        let why = if u.why.starts_with("no step ran") { "no step ran there" } else { "no summary" };
        lines.push(format!("{:<w$}  -    ({why})", u.node, w = widths[0]));
    }
    lines.extend(energy_line(report));
    lines
}

/// A finding as text: what, then the fix on a line of its own.
pub fn finding_lines(f: &Finding) -> Vec<String> {
    let mut out = vec![f.what.clone()];
    if !f.fix.is_empty() {
        out.push(format!("  fix: {}", f.fix));
    }
    out
}

/// The GPU rows as `--json` writes them (`usage` and `autopsy` alike).
pub fn gpus_json(report: &UsageReport) -> Value {
    serde_json::to_value(&report.gpus).unwrap_or_else(|_| json!([]))
}

#[cfg(test)]
mod tests {
    use job_diagnosis::usage::{GpuRow, Source};

    use super::*;

    fn row(gpu: u32, energy_joules: Option<u64>, shared: bool) -> GpuRow {
        GpuRow {
            node: "gpu01".into(),
            gpu,
            mig: None,
            uuid: format!("GPU-{gpu}"),
            util_mean: Some(90.0),
            util_max: Some(99),
            mem_max_bytes: 1 << 30,
            mem_total_bytes: 80 << 30,
            idle_fraction: 0.0,
            samples: 360,
            procs_max: 1,
            shared,
            energy_joules,
        }
    }

    fn report(gpus: Vec<GpuRow>) -> UsageReport {
        UsageReport {
            source: Source::AdminComment,
            gpus,
            unread: Vec::new(),
            findings: Vec::new(),
            kept_in: Vec::new(),
        }
    }

    #[test]
    fn energy_reads_in_the_unit_that_fits() {
        assert_eq!(energy(None), "-");
        assert_eq!(energy(Some(420)), "420 J");
        assert_eq!(energy(Some(849_600)), "850 kJ");
        assert_eq!(energy(Some(3_599_400)), "3599 kJ");
        assert_eq!(energy(Some(8_316_000)), "2.31 kWh");
    }

    #[test]
    fn the_table_has_an_energy_column_and_the_jobs_total() {
        let lines = table(&report(vec![row(0, Some(2_520_000), false), row(1, Some(2_520_000), false)]));
        assert!(lines[0].contains("IDLE  ENERGY   SAMPLES"), "{lines:#?}");
        assert!(lines[1].contains("2520 kJ") && lines[1].ends_with("360"), "{lines:#?}");
        assert_eq!(lines.last().map(String::as_str), Some("energy, all GPUs: 1.40 kWh"), "{lines:#?}");
        // Some GPUs without a counter, one shared.
        let lines = table(&report(vec![row(0, Some(500), true), row(1, None, false)]));
        assert!(lines[2].contains("  -  "), "{lines:#?}");
        assert_eq!(
            lines.last().map(String::as_str),
            Some(
                "energy, all GPUs: 500 J (1 of 2 GPUs; the others have no energy counter; a shared GPU counts whole)"
            )
        );
        // No energy anywhere: no total line.
        let lines = table(&report(vec![row(0, None, false)]));
        assert_eq!(lines.len(), 2, "{lines:#?}");
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    const W: &str = "sgu1;node=gpu01;t=10;from=1;to=31;idle=0;g=0:GPU-5f1c:95.0:99:100:81559:0:3:1";

    #[test]
    fn the_live_read_is_judged_by_labels_not_by_words() {
        // A node without the file, in any language: the task said so, labelled.
        let out = format!("0: {W}\n");
        assert_eq!(
            live_outcome(&out, "1: cat: /run/x: Datei nicht gefunden\n", false, "1").unwrap().len(),
            1
        );
        assert_eq!(live_outcome("", "1: cat: /run/x: absent\n 12: cat: x\n", false, "1").unwrap(), vec![]);
        // srun's own failure: no task ran.
        let e = live_outcome(
            "",
            "srun: error: Unable to create step for job 5: Job/step already completing\n",
            false,
            "1",
        )
        .unwrap_err();
        assert!(e.contains("Unable to create step"), "{e}");
        assert_eq!(
            live_outcome("", "", false, "exit status: 1").unwrap_err(),
            "srun failed (exit status: 1)"
        );
        assert!(!labelled("srun: error: x") && labelled("3: x") && labelled("  3: x") && !labelled("3:x"));
    }

    #[test]
    fn an_ended_jobs_summaries_are_found_in_either_comment() {
        let w2 = W.replace("gpu01", "gpu02");
        // sacct -j 100 of an array whose task 1 holds the array's id: both tasks' rows.
        let (args, t) = ended_query("100");
        assert!(args.contains(&format!("--delimiter={t}")), "{args:?}");
        let out = format!(
            "101{t}100_0{t}{t}101{t}Site|101|x\nmore {W}{t}101\n100{t}100_1{t}{w2}{t}100{t}Site \"q\"{t}100\n"
        );
        let t0 = ended_summaries(&out, &t, "100_0");
        assert_eq!((t0.words.len(), t0.from.as_slice()), (1, &["AdminComment"][..]));
        let t1 = ended_summaries(&out, &t, "100_1");
        assert_eq!((t1.words[0].node.as_str(), t1.from.as_slice()), ("gpu02", &["SystemComment"][..]));
        assert_eq!(ended_summaries(&out, &t, "100").words[0].node, "gpu02");
        let none = ended_summaries(&format!("7{t}7{t}{t}7{t}site{t}7\n"), &t, "7");
        assert!(none.words.is_empty() && none.note.unwrap().contains("grep 'job=7'"));
        assert!(ended_summaries("", &t, "7").note.unwrap().contains("no row for job 7"));
        // A comment holding the delimiter: refused, nothing read from it.
        let forged = ended_summaries(&format!("7{t}7{t}{t}7{t}a{t}{W}{t}7\n"), &t, "7");
        assert!(forged.words.is_empty() && forged.note.unwrap().contains("not rows framed"));
    }
}
