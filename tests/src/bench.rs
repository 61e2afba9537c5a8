//! `slurm-lab bench`: what the plugin costs a launch, measured on the lab.
//! Figures are printed, nothing is asserted: the machines are noisy, so the
//! numbers that matter are ratios of runs made in turn, in one session.
//!
//! For each shape of step (`-n4`, `-n16`, 64 tasks per node, on both nodes,
//! every node's 8 GPUs), `srun ... true` runs in rounds with the plugin
//! loaded and without options, with `--auto-rdzv --gpu-affinity`, and
//! without options again; the variants take turns, in a new random order each
//! round, so noise hits all alike.
//! The figure is the median of the per-round ratios (paired) with its 95%
//! confidence interval ([`median_ci`]); the second run without options is
//! the control: its ratio to the first is the noise of the figure, measured
//! in the same run (an A/A comparison). The per-task cost in
//! slurmstepd is the plugin's own measure (plugstack `timing=on`), from a few
//! more runs whose slurmd log lines are read: `task_init` per task,
//! `user_init` per step. The `-n16` shape also runs with no plugin at all
//! (and with `--compare FILE`, a second build of it), to show what loading
//! the plugin costs. With `--topology XML` the whole set runs again with the
//! GPU table the agent writes from that machine's hwloc topology. With
//! `--against FILE` (any number of times), each other build of the plugin
//! runs with both options as one more variant of every shape's rounds, and
//! its own time per task is read too: builds compare within one run, where
//! runs minutes apart differ by more than their intervals.

use std::path::{Path, PathBuf};
use std::time::Instant;

use slurm_lab::{Lab, built_plugin};

/// One shape of step: srun's task arguments (every GPU of both nodes is
/// added), and its tasks.
struct Shape {
    name: &'static str,
    args: &'static [&'static str],
    tasks: usize,
}

/// The bench's lab advertises this many CPUs per node (task/none binds
/// nothing itself), so 64 tasks fit on a node.
pub const CPUS_PER_NODE: u32 = 64;

const SHAPES: [Shape; 3] = [
    Shape { name: "-N2 -n4", args: &["-N2", "-n4"], tasks: 4 },
    Shape { name: "-N2 -n16", args: &["-N2", "-n16"], tasks: 16 },
    Shape { name: "-N2, 64 tasks per node", args: &["-N2", "--ntasks-per-node=64"], tasks: 128 },
];

const OPTIONS: [&str; 2] = ["--auto-rdzv", "--gpu-affinity"];

/// Runs of each shape with `timing=on`, for the per-task figure.
const TIMED_RUNS: usize = 5;

/// The median (the upper one of an even count); 0 when there is nothing.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A distribution-free 95% confidence interval of the median of `v`: the
/// order statistics whose ranks are 1.96 standard deviations of a binomial
/// count (n/2, n/4) either side of the middle; the whole range when `v` is
/// too short for one.
pub fn median_ci(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let (below, above) = (n / 2.0 - 1.96 * n.sqrt() / 2.0, n / 2.0 + 1.96 * n.sqrt() / 2.0);
    // 1-based ranks, as the textbook rule gives them, clamped to the sample.
    let lo = (1..=v.len()).take_while(|r| *r as f64 <= below).last().unwrap_or(1);
    let hi = (1..=v.len()).find(|r| *r as f64 >= above).unwrap_or(v.len());
    (v[lo - 1], v[hi - 1])
}

/// A plugstack line for `plugin`, or none.
#[derive(Clone)]
struct Variant {
    name: String,
    plugin: Option<PathBuf>,
    options: &'static [&'static str],
}

/// Runs the benchmark on `lab`, whose GPU tables are written.
///
/// # Errors
/// An srun failed, or a file of the lab could not be written.
pub fn launch(
    lab: &Lab,
    runs: usize,
    compare: Option<&Path>,
    against: &[PathBuf],
    gpus: usize,
    label: &str,
) -> Result<(), String> {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
    let plugin = Variant { name: "plugin, no options".into(), plugin: Some(lab.plugin_path()), options: &[] };
    let both =
        Variant { name: format!("plugin, {}", OPTIONS.join(" ")), options: &OPTIONS, ..plugin.clone() };
    println!(
        "srun ... --gpus-per-node={gpus} true, {runs} rounds, variants in turn ({label}; spank_gpu.so {:.1} MB):",
        size(&built_plugin())
    );
    // The control: the first variant again, so its ratio shows the noise.
    let again = Variant { name: "plugin, no options, again (control)".into(), ..plugin.clone() };
    // Other builds, with both options, in the same rounds.
    let mut others = Vec::new();
    for (i, other) in against.iter().enumerate() {
        let copy = lab.dir.join(format!("lib/spank_gpu-against-{i}.so"));
        std::fs::copy(other, &copy).map_err(|e| format!("{}: {e}", other.display()))?;
        let name = format!("{}, {}", other.display(), OPTIONS.join(" "));
        others.push(Variant { name, plugin: Some(copy), options: &OPTIONS });
    }
    for shape in &SHAPES {
        let mut variants = vec![plugin.clone(), both.clone(), again.clone()];
        variants.extend(others.iter().cloned());
        if shape.tasks == 16 {
            variants.push(Variant { name: "no plugin".into(), plugin: None, options: &[] });
            if let Some(other) = compare {
                let copy = lab.dir.join("lib/spank_gpu-compare.so");
                std::fs::copy(other, &copy).map_err(|e| format!("{}: {e}", other.display()))?;
                let name = format!("{} ({:.1} MB), no options", other.display(), size(other));
                variants.push(Variant { name, plugin: Some(copy), options: &[] });
            }
        }
        let times = rounds(lab, shape, gpus, &variants, runs)?;
        let ratios = |v: usize| -> Vec<f64> { times[v].iter().zip(&times[0]).map(|(a, b)| a / b).collect() };
        let per_task = |v: usize| (median(times[v].clone()) - median(times[0].clone())) / shape.tasks as f64;
        println!("  {} ({} tasks):", shape.name, shape.tasks);
        for (v, variant) in variants.iter().enumerate() {
            let m = median(times[v].clone());
            if v == 0 {
                println!("    {:<44} median {m:>7.1} ms", variant.name);
            } else {
                let (lo, hi) = median_ci(ratios(v));
                println!(
                    "    {:<44} median {m:>7.1} ms; paired ratio to the first {:.3} (95% CI {lo:.3}-{hi:.3}); {:+.3} ms per task",
                    variant.name,
                    median(ratios(v)),
                    per_task(v)
                );
            }
        }
        // The plugin's own time, with each option alone too, to show where it goes,
        // and each other build's with both.
        for options in [&OPTIONS[..], &OPTIONS[..1], &OPTIONS[1..], &[]] {
            let variant = Variant { options, ..plugin.clone() };
            let with = if options.is_empty() { "no options".to_owned() } else { options.join(" ") };
            print_timed(&with, timed(lab, shape, gpus, &variant)?);
        }
        for other in &others {
            print_timed(&other.name, timed(lab, shape, gpus, other)?);
        }
    }
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    Ok(())
}

/// One line of a variant's own times in slurmstepd (`what`: its options, or
/// the build and its options).
fn print_timed(what: &str, timings: Option<Timings>) {
    match timings {
        Some(t) => println!(
            "    in slurmstepd, {what}: task_init {:.0} us per task (cpu {:.0} us, {:.0} page faults), user_init {:.0} us per step (cpu {:.0} us); medians of {} and {} hooks",
            median(t.task_wall.clone()),
            median(t.task_cpu.clone()),
            median(t.task_faults.clone()),
            median(t.user_wall.clone()),
            median(t.user_cpu.clone()),
            t.task_wall.len(),
            t.user_wall.len()
        ),
        None => {
            println!("    in slurmstepd, {what}: no timing lines (a plugin older than plugstack timing=on)")
        }
    }
}

/// Writes the plugstack line of `variant` (with `extra` words).
fn use_variant(lab: &Lab, variant: &Variant, extra: &str) -> Result<(), String> {
    let line = variant.plugin.as_ref().map_or(String::new(), |p| {
        format!("required {} topology_dir={}{extra}\n", p.display(), lab.topology_dir().display())
    });
    std::fs::write(lab.dir.join("etc/plugstack.conf"), line).map_err(|e| e.to_string())
}

fn srun(lab: &Lab, shape: &Shape, gpus: usize, variant: &Variant) -> Result<f64, String> {
    let t = Instant::now();
    let mut cmd = lab.command("srun");
    cmd.args(shape.args).arg(format!("--gpus-per-node={gpus}"));
    cmd.args(variant.options);
    let out = cmd.arg("true").output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("srun {}: {}", shape.name, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// Each variant's times over `runs` rounds (after one that warms caches), in
/// a new random order each round ([`round_order`]).
fn rounds(
    lab: &Lab,
    shape: &Shape,
    gpus: usize,
    variants: &[Variant],
    runs: usize,
) -> Result<Vec<Vec<f64>>, String> {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..=runs {
        for v in round_order(variants.len(), &mut seed) {
            use_variant(lab, &variants[v], "")?;
            let ms = srun(lab, shape, gpus, &variants[v])?;
            if round > 0 {
                times[v].push(ms);
            }
        }
    }
    Ok(times)
}

/// The order of `n` variants in one round: a random permutation (xorshift,
/// from `seed`, which it advances). A fixed rotation gives every variant the
/// same neighbour before it, and a step pays for some of the one before it
/// (at 64 tasks per node the control, the first variant again, measured
/// 1.018, 95% CI 1.006-1.033, over 200 rotating rounds); in a random order
/// each variant follows each other alike.
fn round_order(n: usize, seed: &mut u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let j = usize::try_from(*seed % (i as u64 + 1)).unwrap_or(0);
        order.swap(i, j);
    }
    order
}

/// The plugin's own times in slurmstepd, in microseconds, one per hook call.
#[derive(Default)]
struct Timings {
    task_wall: Vec<f64>,
    task_cpu: Vec<f64>,
    task_faults: Vec<f64>,
    user_wall: Vec<f64>,
    user_cpu: Vec<f64>,
}

/// The plugin's own `task_init` and `user_init` times in slurmstepd
/// (`timing=on`) over [`TIMED_RUNS`] steps; `None` when it wrote none (a
/// build before `timing=`, which also refuses the word and so does nothing
/// in those runs).
fn timed(lab: &Lab, shape: &Shape, gpus: usize, variant: &Variant) -> Result<Option<Timings>, String> {
    let logs: Vec<PathBuf> = lab.nodes.iter().map(|n| lab.slurmd_log(n)).collect();
    let marks: Vec<usize> = logs
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| usize::try_from(m.len()).unwrap_or(0)))
        .collect();
    use_variant(lab, variant, " timing=on")?;
    for _ in 0..TIMED_RUNS {
        srun(lab, shape, gpus, variant)?;
    }
    let read = || {
        let mut t = Timings::default();
        for (file, from) in logs.iter().zip(&marks) {
            let bytes = std::fs::read(file).unwrap_or_default();
            let text = String::from_utf8_lossy(bytes.get(*from..).unwrap_or_default()).into_owned();
            for line in text.lines().filter_map(timing_line) {
                let (w, c) = match line.hook {
                    "task_init" => {
                        t.task_faults.extend(line.faults);
                        (&mut t.task_wall, &mut t.task_cpu)
                    }
                    "user_init" => (&mut t.user_wall, &mut t.user_cpu),
                    _ => continue,
                };
                w.push(line.wall);
                c.extend(line.cpu);
            }
        }
        t
    };
    // slurmstepd writes its last lines as the step ends, after srun returns.
    let want = TIMED_RUNS * shape.tasks;
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let mut t = read();
    while t.task_wall.len() < want && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        t = read();
    }
    Ok((!t.task_wall.is_empty() || !t.user_wall.is_empty()).then_some(t))
}

/// One timing line: the hook, its wall-clock and CPU microseconds and its
/// page faults (the last two absent from plugins that did not say them).
#[derive(Debug, PartialEq)]
struct Timing<'a> {
    hook: &'a str,
    wall: f64,
    cpu: Option<f64>,
    faults: Option<f64>,
}

/// `... spank-gpu: timing: task_init 35 us, cpu 30 us, 12 page faults`.
fn timing_line(line: &str) -> Option<Timing<'_>> {
    let rest = &line[line.find("spank-gpu: timing: ")? + "spank-gpu: timing: ".len()..];
    let mut parts = rest.split(", ");
    let mut words = parts.next()?.split_whitespace();
    let hook = words.next()?;
    let wall = words.next()?.parse().ok()?;
    if words.next() != Some("us") || words.next().is_some() {
        return None;
    }
    let mut t = Timing { hook, wall, cpu: None, faults: None };
    for part in parts {
        let w: Vec<&str> = part.split_whitespace().collect();
        match w[..] {
            ["cpu", us, "us"] => t.cpu = Some(us.parse().ok()?),
            [n, "page", "faults"] => t.faults = Some(n.parse().ok()?),
            _ => return None,
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_lines_are_read_from_slurmd_log_lines() {
        let line =
            "[2026-12-02T04:50:01.123] [12.0] spank-gpu: timing: task_init 35 us, cpu 30 us, 12 page faults";
        let want = Timing { hook: "task_init", wall: 35.0, cpu: Some(30.0), faults: Some(12.0) };
        assert_eq!(timing_line(line), Some(want));
        let want = Timing { hook: "user_init", wall: 412.0, cpu: None, faults: None };
        assert_eq!(timing_line("[12.0] spank-gpu: timing: user_init 412 us"), Some(want));
        assert_eq!(timing_line("spank-gpu: timing: user_init 412 us, wall"), None);
        assert_eq!(timing_line("spank-gpu: timing: task_init 3 us, 4 page"), None);
        assert_eq!(timing_line("spank-gpu: timing: task_init lots"), None);
        assert_eq!(timing_line("spank-gpu: gpu-affinity: task 0"), None);
    }

    #[test]
    fn each_round_runs_every_variant_once_and_orders_vary() {
        let mut seed = 1;
        let orders: Vec<Vec<usize>> = (0..200).map(|_| round_order(4, &mut seed)).collect();
        for o in &orders {
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3], "{o:?}");
        }
        // Every variant comes right after every other one in some round.
        for a in 0..4 {
            for b in (0..4).filter(|b| *b != a) {
                assert!(orders.iter().any(|o| o.windows(2).any(|w| w == [a, b])), "{a} never before {b}");
            }
        }
        assert!(orders.iter().any(|o| o[0] != orders[0][0]), "the first variant never changes");
    }

    #[test]
    fn median_confidence_intervals_are_order_statistics() {
        // n = 30: ranks 9 and 21 (1.96 * sqrt(30) / 2 = 5.37 either side of 15).
        let v: Vec<f64> = (1..=30).rev().map(f64::from).collect();
        assert_eq!(median_ci(v), (9.0, 21.0));
        // n = 100: ranks 40 and 60.
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(median_ci(v), (40.0, 60.0));
        // Too few for an interval: the whole range.
        assert_eq!(median_ci(vec![2.0, 1.0]), (1.0, 2.0));
        assert_eq!(median_ci(vec![]), (0.0, 0.0));
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![]), 0.0);
    }
}
