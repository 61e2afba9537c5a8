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

/// Overrides where the live summaries are read on the job's nodes (the
/// agent's `run_dir/usage`, [`task_plan::jobmap`]'s): for the CLI's tests,
/// which fake `srun`. Only the directory `cat` reads there, as the user.
pub const LIVE_DIR_ENV: &str = "SPANK_GPU_USAGE_DIR";

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
/// - `--quiet`: no informational lines on stderr;
/// - `--job-name`: the step is named in `sacct` and `squeue -s`.
///
/// Slurm 24.11 and later start a step in a job for its user alone.
pub const LIVE_SRUN_OPTIONS: &[&str] =
    &["--overlap", "--cpus-per-task=1", "--kill-on-bad-exit=0", "--quiet", "--job-name=spank-gpu-usage"];

/// How long the live read may take, the step's start included.
pub const LIVE_DEADLINE: Duration = Duration::from_secs(30);

/// The live directory: `$SPANK_GPU_USAGE_DIR`, else the agent's.
pub fn live_dir() -> String {
    std::env::var(LIVE_DIR_ENV)
        .ok()
        .filter(|d| d.starts_with('/'))
        .unwrap_or_else(|| format!("{}/{}", task_plan::jobmap::RUN_DIR, task_plan::jobmap::USAGE_DIR))
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
    let words = job_diagnosis::usage::from_admin_comment(&out.stdout);
    // cat's "No such file or directory" is a node without a live file: the report names it.
    if words.is_empty() && !out.status.success() && !out.stderr.contains("No such file or directory") {
        let line = crate::slurm_cmd::first_line(&out.stderr);
        return Err(if line.is_empty() { format!("srun failed ({})", out.status) } else { line });
    }
    Ok(words)
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} %"))
}

fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{g:.1}")
}

/// The table, one line per node and GPU and per node without a summary.
pub fn table(report: &UsageReport) -> Vec<String> {
    let mut rows: Vec<[String; 7]> = vec![[
        "NODE".into(),
        "GPU".into(),
        "UTIL MEAN".into(),
        "UTIL MAX".into(),
        "MEMORY MAX (GiB)".into(),
        "IDLE".into(),
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
            samples,
        ]);
    }
    if report.gpus.is_empty() && report.unread.is_empty() {
        return Vec::new();
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let mut lines: Vec<String> = rows
        .iter()
        .map(|r| {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect();
    for u in &report.unread {
        lines.push(format!("{:<w$}  -    (no summary)", u.node, w = widths[0]));
    }
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
