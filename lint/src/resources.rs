//! The traps about what the cluster can give a job component: its output
//! directories (1), GRES names (8), time limits (12) and sizes (13).

use super::facts::{Cluster, Partition, release_line};
use super::job::{Origin, Setting};
use super::traps::shown;
use super::values::{self, Gres, Limit};
use super::{CREATES_OUTPUT_DIR_SINCE, Cx, DirState, Report, Trap, output_dirs};

pub(crate) fn check(cx: &Cx, out: &mut Report) {
    output_dir(cx, out);
    let parts = match &cx.facts.cluster.partitions {
        Ok(p) => p,
        Err(why) => {
            let why = format!("the cluster's partitions are not known ({why})");
            for t in [Trap::GresType, Trap::TimeAtMax, Trap::Unsatisfiable] {
                out.note(t, why.clone());
            }
            return;
        }
    };
    let named = cx.req.get("partition");
    let name = match named.and_then(|s| s.value.as_ref()) {
        Some(v) if !v.known => {
            out.note(
                Trap::Unsatisfiable,
                format!("--partition={} holds shell lint cannot resolve; partition checks skipped", v.text),
            );
            None
        }
        Some(v) => Some(v.text.clone()),
        None => None,
    };
    let partition = Cluster::partition(parts, name.as_deref());
    if let (Some(n), None, Some(s)) = (name.as_deref(), partition, named) {
        let have: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        out.find(
            Trap::Unsatisfiable,
            s.origin.clone(),
            format!(
                "there is no partition {n} on this cluster (it has {}): sbatch refuses the job",
                have.join(", ")
            ),
            format!("--partition={}", have.first().copied().unwrap_or("NAME")),
        );
    }
    gres_type(cx, parts, partition, out);
    if named.is_some() && name.is_none() {
        return;
    }
    let Some(p) = partition else {
        if name.is_none() {
            out.note(Trap::TimeAtMax, "the cluster has no default partition; time limits not checked".into());
        }
        return;
    };
    time_at_max(cx, p, out);
    unsatisfiable(cx, p, out);
}

/// 1: an output directory the job cannot write, per release.
fn output_dir(cx: &Cx, out: &mut Report) {
    let release = cx.facts.release.number;
    let creates = release >= CREATES_OUTPUT_DIR_SINCE;
    for (dir, opt, pattern) in output_dirs(cx.job, cx.req) {
        let Some(s) = cx.req.get(opt) else { continue };
        let shown_opt = if opt == "chdir" { shown(s) } else { format!("--{opt}={pattern}") };
        let Some(dir) = dir else {
            out.note(
                Trap::OutputDir,
                format!("{shown_opt}: its directory is known only when the job runs (%j, %N, a variable, or %u with no user name); not checked"),
            );
            continue;
        };
        let Some(state) = cx.facts.dirs.get(&dir) else { continue };
        let line = cx.facts.release.from.clone();
        let rel = release_line(release);
        let (what, fix) = match state {
            DirState::Dir { writable: true } => continue,
            DirState::Dir { writable: false } => (
                format!("{shown_opt}: you cannot write in {dir}: the job fails at launch with no log"),
                format!(
                    "write the logs somewhere you own, or fix the directory's permissions (ls -ld {dir})"
                ),
            ),
            DirState::NotDir { at } => (
                format!("{shown_opt}: {at} is a file, not a directory: the job fails at launch with no log"),
                format!("move the file away or choose another directory than {dir}"),
            ),
            DirState::Missing { ancestor, writable } if creates && *writable => {
                let _ = ancestor;
                continue;
            }
            DirState::Missing { ancestor, .. } if creates => (
                format!(
                    "{shown_opt}: {dir} does not exist and Slurm {rel} ({line}) cannot create it: {ancestor} is not writable for you; the job fails at launch with no log"
                ),
                format!("create it before submitting: mkdir -p {dir}"),
            ),
            DirState::Missing { .. } => (
                format!(
                    "{shown_opt}: {dir} does not exist; Slurm {rel} ({line}) does not create it, and the job fails at launch with no log and no message"
                ),
                format!("create it before submitting: mkdir -p {dir}"),
            ),
            DirState::Unknown(why) => {
                out.note(Trap::OutputDir, format!("{dir}: {why}; not checked"));
                continue;
            }
        };
        if opt == "chdir" {
            out.find(
                Trap::OutputDir,
                s.origin.clone(),
                what.replace("no log", "no log, and the script never runs"),
                fix,
            );
        } else {
            out.find(Trap::OutputDir, s.origin.clone(), what, fix);
        }
    }
}

/// The GRES a component asks for, with the option each comes from.
fn requested_gres(cx: &Cx) -> Vec<(Gres, Setting)> {
    let mut v = Vec::new();
    if let Some(s) = cx.req.get("gres") {
        if let Some(val) = s.value.as_ref().and_then(|x| x.get()) {
            for g in values::parse_gres_list(val) {
                v.push((g, s.clone()));
            }
        }
    }
    for name in ["gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket"] {
        let Some(s) = cx.req.get(name) else { continue };
        if let Some((kind, count)) = s.value.as_ref().and_then(|x| x.get()).and_then(values::parse_gpus) {
            v.push((Gres { name: "gpu".into(), kind, count }, s.clone()));
        }
    }
    v
}

/// The cluster's `name[:type]` words for a GRES name, sorted.
fn offered(parts: &[&Partition], name: &str) -> Vec<String> {
    let mut v: Vec<String> = parts
        .iter()
        .flat_map(|p| &p.nodes)
        .flat_map(|n| &n.gres)
        .filter(|g| g.name == name)
        .map(|g| match &g.kind {
            Some(k) => format!("{}:{k}:{}", g.name, g.count),
            None => format!("{}:{}", g.name, g.count),
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// 8: a GRES name or type the cluster (or the partition) does not have.
fn gres_type(cx: &Cx, parts: &[Partition], partition: Option<&Partition>, out: &mut Report) {
    let all: Vec<&Partition> = parts.iter().collect();
    for (g, s) in requested_gres(cx) {
        let anywhere = offered(&all, &g.name);
        let has = |p: &[&Partition]| {
            p.iter().flat_map(|p| &p.nodes).any(|n| n.gres_count(&g.name, g.kind.as_deref()) > 0)
        };
        let want = match &g.kind {
            Some(k) => format!("{}:{k}", g.name),
            None => g.name.clone(),
        };
        if anywhere.is_empty() {
            let names: Vec<String> = {
                let mut n: Vec<String> = parts
                    .iter()
                    .flat_map(|p| &p.nodes)
                    .flat_map(|n| &n.gres)
                    .map(|g| g.name.clone())
                    .collect();
                n.sort();
                n.dedup();
                n
            };
            out.find(
                Trap::GresType,
                s.origin.clone(),
                format!(
                    "{}: no node of this cluster has a GRES named {} (it has {}): sbatch refuses the job or it never starts",
                    shown(&s),
                    g.name,
                    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                ),
                "ask for a GRES the cluster has (sinfo -o %G lists them)".into(),
            );
            continue;
        }
        if !has(&all) {
            let types: Vec<&str> = anywhere.iter().map(String::as_str).collect();
            let example =
                anywhere.first().map(|a| a.rsplit_once(':').map_or(a.as_str(), |(t, _)| t)).unwrap_or("gpu");
            out.find(
                Trap::GresType,
                s.origin.clone(),
                format!(
                    "{}: no node of this cluster has {want} (it has {}): sbatch refuses the job (\"Requested node configuration is not available\") or it never starts",
                    shown(&s),
                    types.join(", ")
                ),
                format!("use the cluster's name for it: --gres={example}:{}", g.count),
            );
            continue;
        }
        if let Some(p) = partition {
            if !has(&[p]) {
                let here = offered(&[p], &g.name);
                out.find(
                    Trap::GresType,
                    s.origin.clone(),
                    format!(
                        "{}: partition {} has no {want} (its nodes have {}): the job is refused or never starts there",
                        shown(&s),
                        p.name,
                        if here.is_empty() { "none".to_owned() } else { here.join(", ") }
                    ),
                    "choose a partition whose nodes have it (sinfo -o \"%P %G\"), or the type this partition has".into(),
                );
            }
        }
    }
}

/// 12: a time limit at the partition's maximum (given, or by default).
fn time_at_max(cx: &Cx, p: &Partition, out: &mut Report) {
    let max = p.max_time;
    match cx.req.get("time") {
        Some(s) => {
            let Some(v) = s.value.as_ref().and_then(|v| v.get()) else {
                out.note(
                    Trap::TimeAtMax,
                    format!("{} holds shell lint cannot resolve; not checked", shown(s)),
                );
                return;
            };
            let Some(t) = values::parse_limit(v) else { return };
            if t == max {
                out.find(
                    Trap::TimeAtMax,
                    s.origin.clone(),
                    format!(
                        "{} is partition {}'s MaxTime: backfill can only start the job where that much time is free, so it waits longer than a job that asks for what it needs",
                        shown(s),
                        p.name
                    ),
                    "write the time the job really needs (with a margin), and checkpoint if it may need more".into(),
                );
            } else if t > max {
                out.find(
                    Trap::Unsatisfiable,
                    s.origin.clone(),
                    format!(
                        "{} is more than partition {}'s MaxTime {}: the job pends forever (PartitionTimeLimit)",
                        shown(s),
                        p.name,
                        max.words()
                    ),
                    format!("--time={} at most", max.words()),
                );
            }
        }
        None => {
            let d = p.job_default_time();
            if d != max {
                return;
            }
            let what = if d == Limit::Infinite {
                format!(
                    "no --time, and partition {} has no limit: the job may run forever, and backfill can never start it early",
                    p.name
                )
            } else {
                format!(
                    "no --time: the job gets partition {}'s {}, which is its maximum, so backfill starts it only where that much time is free",
                    p.name,
                    d.words()
                )
            };
            let at = cx.job.script.directives.first().map_or(Origin::Line(1), |d| Origin::Line(d.line));
            out.find(Trap::TimeAtMax, at, what, "add #SBATCH --time=HH:MM:SS with what the job needs".into());
        }
    }
}

/// A count option of the component, when given and known.
fn count(cx: &Cx, name: &str) -> Option<Option<u64>> {
    cx.req.value(name).map(|v| v.get().and_then(values::parse_count))
}

/// 13: a request no node of the partition can satisfy.
fn unsatisfiable(cx: &Cx, p: &Partition, out: &mut Report) {
    let unknown = |out: &mut Report, what: &str| {
        out.note(
            Trap::Unsatisfiable,
            format!("{what} holds shell lint cannot resolve; the sizes are not checked"),
        );
    };
    let mut need_of = |name: &str| -> Option<u64> {
        match count(cx, name) {
            Some(Some(n)) => Some(n),
            Some(None) => {
                unknown(out, &format!("--{name}"));
                None
            }
            None => None,
        }
    };
    let cpt = need_of("cpus-per-task").unwrap_or(1);
    let nodes = need_of("nodes");
    let ntasks = need_of("ntasks");
    let tpn = need_of("ntasks-per-node").or_else(|| match (ntasks, nodes) {
        (Some(t), Some(n)) if n > 0 => Some(t.div_ceil(n)),
        _ => None,
    });
    let tasks_here = tpn.unwrap_or(1);
    // GPUs on one node.
    let gpus_of = |name: &str| cx.req.value(name).and_then(|v| v.get()).and_then(values::parse_gpus);
    let mut gpus: Option<(Option<String>, u64)> = gpus_of("gpus-per-node");
    if gpus.is_none() {
        if let Some((k, n)) = gpus_of("gpus-per-task") {
            gpus = Some((k, n.saturating_mul(tasks_here)));
        }
    }
    if gpus.is_none() {
        gpus = cx
            .req
            .value("gres")
            .and_then(|v| v.get())
            .and_then(|t| values::parse_gres_list(t).into_iter().find(|g| g.name == "gpu"))
            .map(|g| (g.kind, g.count));
    }
    let cpus = cpt.saturating_mul(tasks_here).max(
        gpus.as_ref().map_or(0, |(_, n)| n.saturating_mul(count(cx, "cpus-per-gpu").flatten().unwrap_or(0))),
    );
    let mem = cx.req.value("mem").and_then(|v| v.get()).and_then(values::parse_mem_mib).or_else(|| {
        let per_cpu = cx.req.value("mem-per-cpu").and_then(|v| v.get()).and_then(values::parse_mem_mib)?;
        Some(per_cpu.saturating_mul(cpus))
    });
    let fits = |n: &super::facts::Nodes| {
        n.cpus >= cpus
            && mem.is_none_or(|m| m == 0 || n.memory_mib >= m)
            && gpus.as_ref().is_none_or(|(k, c)| n.gres_count("gpu", k.as_deref()) >= *c)
    };
    let fitting: u64 = p.nodes.iter().filter(|n| fits(n)).map(|n| n.count).sum();
    let biggest = p
        .nodes
        .iter()
        .map(|n| {
            let g = n.gres_count("gpu", gpus.as_ref().and_then(|(k, _)| k.as_deref()));
            format!("{} CPUs, {} MB, {} GPUs", n.cpus, n.memory_mib, g)
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut want = vec![format!("{cpus} CPUs")];
    if let Some(m) = mem.filter(|m| *m > 0) {
        want.push(format!("{m} MB"));
    }
    if let Some((_, g)) = &gpus {
        want.push(format!("{g} GPUs"));
    }
    let at = cx
        .req
        .last(&[
            "cpus-per-task",
            "ntasks-per-node",
            "mem",
            "mem-per-cpu",
            "gpus-per-node",
            "gpus-per-task",
            "gres",
            "nodes",
        ])
        .map_or(Origin::Line(1), |s| s.origin.clone());
    if fitting == 0 && !p.nodes.is_empty() {
        if gpus.as_ref().is_some_and(|(k, _)| k.is_some())
            && !p.nodes.iter().any(|n| n.gres_count("gpu", gpus.as_ref().and_then(|(k, _)| k.as_deref())) > 0)
        {
            return; // a type the partition lacks: trap 8 says so
        }
        out.find(
            Trap::Unsatisfiable,
            at,
            format!(
                "each node must give {} ({} task(s) x {cpt} CPUs): no node of partition {} has that (its nodes: {biggest}); the job pends forever",
                want.join(", "),
                tasks_here,
                p.name
            ),
            "ask for what one node has (fewer tasks per node, CPUs or GPUs per node), and more nodes".into(),
        );
        return;
    }
    if let Some(n) = nodes {
        if n > fitting {
            let s = cx.req.get("nodes").map_or(Origin::Line(1), |s| s.origin.clone());
            out.find(
                Trap::Unsatisfiable,
                s,
                format!("--nodes={n}, but partition {} has only {fitting} node(s) that can give {} each: the job pends forever", p.name, want.join(", ")),
                format!("--nodes={fitting} at most, or a partition with more such nodes"),
            );
        }
    }
}
