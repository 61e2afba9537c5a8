//! Where a job's steps ran, from Slurm's step records: the nodes of a job
//! on which no step ever ran (`spank-gpu usage`'s `no-step` finding).
//!
//! A batch script runs on the job's first node only (its step, `J.batch`,
//! runs on the batch host); the other nodes run only what a step starts
//! there (`srun`, or `mpirun` through srun). A multi-node job whose script
//! runs `python train.py` with no srun holds the other nodes' GPUs and never
//! touches them. The records:
//!
//! - `sacct -j JOB -n -P -o JobIDRaw,JobID,NodeList,JobName` ([`SACCT_FIELDS`]):
//!   every step accounting has, finished or running. `JobIDRaw` of a step is
//!   `RAW.STEP`, `STEP` being `batch`, `extern`, `interactive`, `TDB` (pending)
//!   or the step's number, `+COMP` after it for a het step's component
//!   (src/sacct/print.c `PRINT_JOBIDRAW` and src/common/log.c
//!   `log_build_step_id_str`, the same in slurm-22-05-8-1, slurm-24-11-5-1 and
//!   slurm-26-05-3-1); the step's `NodeList` is its nodes (the batch step's is
//!   the batch host), its `JobName` the step's name. The name, the user's
//!   text, comes last, so a `|` in it splits nothing that is read; a line
//!   a newline in a name starts is read only where it is a row of this job,
//!   and then adds a step: a name can hide the finding from its own job's
//!   report, never add one.
//! - `squeue -h -s -j JOB -o "%i %N %j"` ([`SQUEUE_FORMAT`]): the steps
//!   running now, from slurmctld (what accounting may not have yet); `%i` is
//!   `RAW.STEP`, or `A_T.STEP` for an array task (src/squeue/print.c
//!   `_print_step_id`, the same in those releases).
//!
//! Neither the extern step (on every node under `PrologFlags=Contain`, no
//! work of the user's) nor the step `spank-gpu usage` starts to read a
//! running job ([`USAGE_STEP_NAME`]) counts as work. Pure: nothing here runs
//! a command. Bounded: node lists are expanded once each, distinct lists
//! only, and at most [`MAX_EXPANDED`] hosts in all.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use slurm_formats::hostlist;

/// `sacct -o` for the step records ([`from_sacct`]).
pub const SACCT_FIELDS: &str = "JobIDRaw,JobID,NodeList,JobName";
/// `squeue -s -o` for the running steps ([`from_squeue`]).
pub const SQUEUE_FORMAT: &str = "%i %N %j";
/// The name of the step `spank-gpu usage` starts in a running job.
pub const USAGE_STEP_NAME: &str = "spank-gpu-usage";
/// The most hosts the step records' node lists are expanded to, all
/// together; past it, where steps ran is not told.
pub const MAX_EXPANDED: usize = 2_000_000;

/// One step of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The step's part of its id: `batch`, `extern`, `interactive`, `0`, `3+1`.
    pub id: String,
    /// Its nodes, a hostlist expression as Slurm prints it.
    pub nodes: String,
    /// Its name (`batch`, `extern`, the program's, `spank-gpu-usage`).
    pub name: String,
}

impl Step {
    /// Whether the step is work of the job's: not the extern step, not a
    /// pending one, not `spank-gpu usage`'s own read.
    pub fn is_work(&self) -> bool {
        let kind = self.id.split('+').next().unwrap_or("");
        !matches!(kind, "extern" | "TDB") && self.name.trim() != USAGE_STEP_NAME
    }

    /// Whether it is the batch step.
    pub fn is_batch(&self) -> bool {
        self.id == "batch"
    }
}

/// What the step records say about the job's nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepNodes {
    /// Told: the job's nodes on which no step ran (in the job's order), and
    /// whether the job has a batch step (a batch script ran on its first node).
    Known {
        /// The nodes no step ran on.
        idle: Vec<String>,
        /// A batch step was seen.
        batch: bool,
    },
    /// Not told, and why.
    Unknown(String),
}

/// The steps of a job in `sacct -n -P -o` [`SACCT_FIELDS`]: those of the
/// job whose raw id is `raw` (Slurm's own id, when the caller knows it), else
/// of the job whose `JobID` or `JobIDRaw` is `asked` (`N`, `A_T`, `H+O`).
/// An array's or a het job's other parts are not this job's.
///
/// # Errors
/// Accounting has no row of the job (not yet, or a wrong id).
pub fn from_sacct(text: &str, raw: Option<&str>, asked: &str) -> Result<Vec<Step>, String> {
    let rows = || text.lines().filter_map(|l| sacct_fields(l.trim_end_matches('\r')));
    let job_rows = || rows().filter(|(r, ..)| !r.contains('.'));
    let found = match raw.filter(|r| !r.is_empty()) {
        Some(raw) => job_rows().find(|(r, ..)| *r == raw),
        None => {
            job_rows().find(|(_, id, ..)| *id == asked).or_else(|| job_rows().find(|(r, ..)| *r == asked))
        }
    };
    let Some((raw, ..)) = found else {
        return Err(format!("accounting has no record of job {} yet", raw.unwrap_or(asked)));
    };
    Ok(rows()
        .filter_map(|(r, _, nodes, name)| {
            let (job, step) = r.split_once('.')?;
            (job == raw).then(|| Step { id: step.to_owned(), nodes: nodes.to_owned(), name: name.to_owned() })
        })
        .collect())
}

/// `JobIDRaw`, `JobID`, `NodeList` and `JobName` of one line; `None` for a
/// line that is not a row (a newline in a name makes one).
fn sacct_fields(line: &str) -> Option<(&str, &str, &str, &str)> {
    let mut f = line.splitn(4, '|');
    let raw = f.next()?.trim();
    let id = f.next()?.trim();
    let nodes = f.next()?.trim();
    let name = f.next()?;
    let job = raw.split('.').next().unwrap_or("");
    (!job.is_empty() && job.bytes().all(|b| b.is_ascii_digit())).then_some((raw, id, nodes, name))
}

/// The running steps of the job whose steps `squeue -s` prints as
/// `PREFIX.STEP` (`RAW`, or `A_T` for an array task), from `squeue -h -s
/// -o` [`SQUEUE_FORMAT`]; other jobs' steps (an array's other tasks) are
/// left out.
pub fn from_squeue(text: &str, prefix: &str) -> Vec<Step> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim_start().splitn(3, char::is_whitespace);
            let id = f.next()?;
            let nodes = f.next()?.trim();
            let name = f.next().unwrap_or("").trim();
            let step = id.strip_prefix(prefix)?.strip_prefix('.')?;
            (!step.is_empty() && !nodes.is_empty()).then(|| Step {
                id: step.to_owned(),
                nodes: nodes.to_owned(),
                name: name.to_owned(),
            })
        })
        .collect()
}

/// `job_nodes` on which none of `steps` that is work ran, in their order.
///
/// # Errors
/// A step's node list does not read (it might name any node), or the lists
/// hold more than [`MAX_EXPANDED`] hosts in all.
pub fn idle_nodes(job_nodes: &[String], steps: &[Step]) -> Result<Vec<String>, String> {
    let mut left: HashSet<&str> = job_nodes.iter().map(String::as_str).collect();
    let lists: BTreeSet<&str> = steps.iter().filter(|s| s.is_work()).map(|s| s.nodes.trim()).collect();
    let mut budget = MAX_EXPANDED;
    for list in lists {
        if left.is_empty() {
            break;
        }
        if matches!(list, "" | "None assigned" | "(null)") {
            continue;
        }
        let hosts = hostlist::expand(list)
            .map_err(|e| format!("a step's node list does not read ({}: {})", e.input, e.reason))?;
        budget = budget
            .checked_sub(hosts.len())
            .ok_or_else(|| format!("the job's steps name more than {MAX_EXPANDED} nodes in all"))?;
        for h in &hosts {
            left.remove(h.as_str());
        }
    }
    Ok(job_nodes.iter().filter(|n| left.contains(n.as_str())).cloned().collect())
}

/// For an ended job: what its step records in accounting say.
pub fn ended(job_nodes: &[String], sacct: Result<Vec<Step>, String>) -> StepNodes {
    match sacct {
        Ok(steps) => known(job_nodes, &steps),
        Err(e) => StepNodes::Unknown(e),
    }
}

/// For a running job: its steps in accounting (finished and running) and
/// those running now (`squeue`). Without accounting, the running steps tell
/// only that every node has one; a node without one may have had a step
/// that ended, so then nothing is told.
pub fn running(
    job_nodes: &[String],
    sacct: Result<Vec<Step>, String>,
    squeue: Result<Vec<Step>, String>,
) -> StepNodes {
    match (sacct, squeue) {
        (Ok(mut steps), now) => {
            steps.extend(now.unwrap_or_default());
            known(job_nodes, &steps)
        }
        (Err(e), Ok(now)) => match known(job_nodes, &now) {
            StepNodes::Known { idle, batch } if idle.is_empty() => StepNodes::Known { idle, batch },
            StepNodes::Known { .. } => {
                StepNodes::Unknown(format!("{e} (steps that ended are known only there)"))
            }
            unknown => unknown,
        },
        (Err(e), Err(q)) => StepNodes::Unknown(format!("{e}; squeue: {q}")),
    }
}

fn known(job_nodes: &[String], steps: &[Step]) -> StepNodes {
    match idle_nodes(job_nodes, steps) {
        Ok(idle) => StepNodes::Known { idle, batch: steps.iter().any(Step::is_batch) },
        Err(e) => StepNodes::Unknown(e),
    }
}

/// Host names as one hostlist expression, as Slurm writes them
/// (`sc[2-8]`, `gpu[01-03,07],login1`): sorted, duplicates dropped, numbers
/// kept at their width (`n[01-10]`, `n[9-10]`).
pub fn compress(nodes: &[String]) -> String {
    // (prefix, width) -> numbers; width 0: numbers written without padding.
    let split = |n: &str| -> Option<(String, String)> {
        let digits = n.bytes().rev().take_while(u8::is_ascii_digit).count();
        (digits > 0 && digits <= 19)
            .then(|| (n[..n.len() - digits].to_owned(), n[n.len() - digits..].to_owned()))
    };
    let padded = |d: &str| d.len() > 1 && d.starts_with('0');
    let widths: HashSet<(String, usize)> =
        nodes.iter().filter_map(|n| split(n)).filter(|(_, d)| padded(d)).map(|(p, d)| (p, d.len())).collect();
    let mut groups: BTreeMap<(String, usize), BTreeSet<u64>> = BTreeMap::new();
    let mut plain: BTreeSet<&str> = BTreeSet::new();
    for n in nodes {
        match split(n).and_then(|(p, d)| Some((p, d.parse::<u64>().ok()?, d))) {
            Some((p, num, d)) => {
                let width = if padded(&d) || widths.contains(&(p.clone(), d.len())) { d.len() } else { 0 };
                groups.entry((p, width)).or_default().insert(num);
            }
            None => {
                plain.insert(n);
            }
        }
    }
    let mut items: Vec<String> = Vec::new();
    for ((prefix, width), nums) in groups {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for n in nums {
            match ranges.last_mut() {
                Some((_, hi)) if hi.checked_add(1) == Some(n) => *hi = n,
                _ => ranges.push((n, n)),
            }
        }
        let num = |n: u64| format!("{n:0width$}");
        let parts: Vec<String> = ranges
            .iter()
            .map(|&(lo, hi)| if lo == hi { num(lo) } else { format!("{}-{}", num(lo), num(hi)) })
            .collect();
        items.push(match (ranges.as_slice(), parts.as_slice()) {
            ([(lo, hi)], [one]) if lo == hi => format!("{prefix}{one}"),
            _ => format!("{prefix}[{}]", parts.join(",")),
        });
    }
    items.extend(plain.into_iter().map(str::to_owned));
    items.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        hostlist::expand(expr).unwrap_or_default()
    }

    fn known_idle(s: &StepNodes) -> Option<&[String]> {
        match s {
            StepNodes::Known { idle, .. } => Some(idle),
            StepNodes::Unknown(_) => None,
        }
    }

    /// An 8-node job whose batch script ran no srun, as 24.11's `sacct -n -P
    /// -o JobIDRaw,JobID,NodeList,JobName` prints it: the job, its batch step
    /// on the batch host, its extern step on every node.
    const NO_SRUN: &str = "\
4242|4242|sc[1-8]|train
4242.batch|4242.batch|sc1|batch
4242.extern|4242.extern|sc[1-8]|extern
";

    #[test]
    fn a_batch_script_without_srun_leaves_every_node_but_the_first_idle() {
        let nodes = names("sc[1-8]");
        let steps = from_sacct(NO_SRUN, None, "4242").unwrap_or_default();
        assert_eq!(steps.len(), 2);
        let s = ended(&nodes, Ok(steps));
        assert_eq!(s, StepNodes::Known { idle: names("sc[2-8]"), batch: true });
        assert_eq!(compress(known_idle(&s).unwrap_or_default()), "sc[2-8]");
        // usage's own read of the running job starts a step on every node: not work.
        let read = format!("{NO_SRUN}4242.0|4242.0|sc[1-8]|{USAGE_STEP_NAME}\n");
        let s = ended(&nodes, from_sacct(&read, Some("4242"), "4242"));
        assert_eq!(known_idle(&s).map(<[String]>::len), Some(7));
        // A step on every node: none idle (a het step's component too).
        let srun = format!("{NO_SRUN}4242.0|4242.0|sc[1-4]|python\n4242.1+1|4242.1+1|sc[5-8]|python|x\n");
        let steps = from_sacct(&srun, None, "4242").unwrap_or_default();
        assert_eq!(steps[3].name, "python|x", "the name, last, keeps its |");
        assert_eq!(ended(&nodes, Ok(steps)), StepNodes::Known { idle: vec![], batch: true });
    }

    #[test]
    fn an_array_tasks_steps_are_its_own() {
        // sacct -j 100 of an array: task 100_1 holds raw id 101, task 100_2 the array's own 100.
        let text = "\
101|100_1|sc[1-2]|t
101.batch|100_1.batch|sc1|batch
101.0|100_1.0|sc[1-2]|python
100|100_2|sc[3-4]|t
100.batch|100_2.batch|sc3|batch
";
        let t1 = from_sacct(text, None, "100_1").unwrap_or_default();
        assert_eq!(ended(&names("sc[1-2]"), Ok(t1)), StepNodes::Known { idle: vec![], batch: true });
        let t2 = from_sacct(text, Some("100"), "100_2").unwrap_or_default();
        assert_eq!(t2.len(), 1);
        assert_eq!(
            ended(&names("sc[3-4]"), Ok(t2)),
            StepNodes::Known { idle: vec!["sc4".into()], batch: true }
        );
        // Asked by the array's id alone: the row whose raw id it is.
        assert_eq!(from_sacct(text, None, "100").unwrap_or_default().len(), 1);
        // squeue prints an array task's steps as A_T.STEP.
        let q = "100_1.0 sc[1-2] python\n100_2.batch sc3 batch\n100_1.extern sc[1-2] extern\n";
        let steps = from_squeue(q, "100_1");
        assert_eq!(steps.len(), 2);
        assert_eq!((steps[0].id.as_str(), steps[0].nodes.as_str()), ("0", "sc[1-2]"));
        assert!(!steps[1].is_work());
    }

    #[test]
    fn a_running_job_without_accounting_is_told_only_when_every_node_runs_a_step() {
        let nodes = names("sc[1-3]");
        let down = || Err::<Vec<Step>, _>("sacct: error: Problem talking to the database".to_owned());
        let q = |t: &str| Ok(from_squeue(t, "7"));
        // Only the batch step runs now: a step may have ended on sc2 and sc3.
        let s = running(&nodes, down(), q("7.batch sc1 batch\n7.extern sc[1-3] extern\n"));
        assert!(matches!(&s, StepNodes::Unknown(e) if e.contains("Problem talking")), "{s:?}");
        // A step runs on every node now: nothing idle, whatever accounting says.
        let s = running(&nodes, down(), q("7.batch sc1 batch\n7.0 sc[1-3] python\n"));
        assert_eq!(s, StepNodes::Known { idle: vec![], batch: true });
        // Accounting lagging behind slurmctld: the step squeue has counts.
        let lag = from_sacct("7|7|sc[1-3]|j\n7.batch|7.batch|sc1|batch\n", None, "7");
        assert_eq!(known_idle(&running(&nodes, lag.clone(), q("7.0 sc[2-3] python\n"))), Some(&[][..]));
        assert_eq!(known_idle(&running(&nodes, lag, Err("x".into()))).map(<[String]>::len), Some(2));
        // No record in accounting yet.
        let none = from_sacct("", Some("7"), "7");
        assert_eq!(none, Err("accounting has no record of job 7 yet".to_owned()));
        assert!(matches!(running(&nodes, none, Err("y".into())), StepNodes::Unknown(_)));
    }

    #[test]
    fn what_cannot_be_read_tells_nothing() {
        let nodes = names("sc[1-2]");
        let bad = "9|9|sc[1-2]|j\n9.0|9.0|sc[1-|x\n";
        assert!(matches!(ended(&nodes, from_sacct(bad, None, "9")), StepNodes::Unknown(_)));
        // Lines that are not rows (a newline in a step's name) are skipped.
        let odd = "9|9|sc[1-2]|j\n9.0|9.0|sc[1-2]|a\nb|c|d|e\n\n";
        assert_eq!(known_idle(&ended(&nodes, from_sacct(odd, None, "9"))), Some(&[][..]));
        // A pending step ran nowhere.
        let pending = "9|9|sc[1-2]|j\n9.TDB|9.TDB|None assigned|x\n";
        assert_eq!(
            ended(&nodes, from_sacct(pending, None, "9")),
            StepNodes::Known { idle: nodes, batch: false }
        );
    }

    #[test]
    fn ten_thousand_nodes_and_a_hundred_thousand_steps_stay_bounded() {
        let nodes = names("n[00001-10000]");
        let mut text = String::from("5|5|n[00001-10000]|big\n5.batch|5.batch|n00001|batch\n");
        for i in 0..100_000u32 {
            // Each step on one node of the first half.
            text.push_str(&format!("5.{i}|5.{i}|n{:05}|python\n", i % 5000 + 1));
        }
        let t = std::time::Instant::now();
        let s = ended(&nodes, from_sacct(&text, None, "5"));
        let idle = known_idle(&s).unwrap_or_default();
        assert_eq!(idle.len(), 5000);
        assert_eq!(compress(idle), "n[05001-10000]");
        assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());
        // Steps naming more nodes than the bound, in distinct lists: not told.
        let mut many = String::from("6|6|n[00001-10000]|big\n");
        for i in 0..300u32 {
            many.push_str(&format!("6.{i}|6.{i}|n[00002-10000],m{i}|python\n"));
        }
        assert!(matches!(ended(&nodes, from_sacct(&many, None, "6")), StepNodes::Unknown(_)));
    }

    #[test]
    fn compress_writes_what_expand_reads() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(compress(&v(&["sc2", "sc3", "sc4", "sc8"])), "sc[2-4,8]");
        assert_eq!(compress(&v(&["gpu01", "gpu10", "gpu09", "login", "gpu01"])), "gpu[01,09-10],login");
        assert_eq!(compress(&v(&["n9", "n10"])), "n[9-10]");
        assert_eq!(compress(&v(&["node2"])), "node2");
        assert_eq!(compress(&[]), "");
        for expr in ["sc[2-8]", "gpu[001-120],cpu[1-3,7]", "a1b[3-4]", "rack1-n[01-12],rack2-n[01-04]"] {
            let hosts = names(expr);
            let mut back = names(&compress(&hosts));
            back.sort();
            let mut want = hosts.clone();
            want.sort();
            assert_eq!(back, want, "{expr}");
        }
    }
}
