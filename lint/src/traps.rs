//! The traps in the script itself and in its `srun` lines: one small
//! function per trap. The traps about what the cluster can give are in
//! [`super::resources`].

use super::facts::{Config, release_line};
use super::getopt::{ArgWord, Stop};
use super::job::{Job, Launch, Origin, Setting, VarValue};
use super::script::{IgnoredWhy, SLURM_MAX_SCRIPT};
use super::values::{self, Signal};
use super::{Cx, Facts, Report, SRUN_INHERITS_CPUS_SINCE, Trap};
use slurm_formats::text::clip;

/// An option as the user wrote it: `--signal=USR1@180`, `--exclusive`.
pub(crate) fn shown(s: &Setting) -> String {
    match &s.value {
        Some(v) => format!("--{}={}", s.name, clip(&v.text, 80)),
        None => format!("--{}", s.name),
    }
}

/// Signals a trap can catch that Slurm sends before the end (not the shell's own pseudo-signals).
fn real_signal(s: &str) -> bool {
    !matches!(s, "EXIT" | "ERR" | "DEBUG" | "RETURN" | "KILL" | "STOP")
}

// ----- the whole script -------------------------------------------------------------

pub(crate) fn script_traps(job: &Job, facts: &Facts, out: &mut Report) {
    refused(job, facts, out);
    ignored_directives(job, out);
    let assigns = literal_assigns(job);
    fixed_port(job, &assigns, out);
    socket_ifname(&assigns, out);
    srun_foreground(job, out);
}

/// What sbatch refuses outright: no `#!`, DOS line breaks, a directive it
/// cannot read, an option it does not know, a script over `max_script_size`.
fn refused(job: &Job, facts: &Facts, out: &mut Report) {
    let s = job.script;
    if !s.shebang {
        out.find(
            Trap::Refused,
            Origin::Line(1),
            "the first line is not #! and an interpreter: sbatch refuses the script (\"This does not look like a batch script\")".into(),
            "make the first line #!/bin/bash".into(),
        );
    }
    if let Some(line) = s.dos_line {
        out.find(
            Trap::Refused,
            Origin::Line(line),
            "DOS line breaks (\\r\\n): sbatch refuses the script".into(),
            "convert it: dos2unix FILE (or sed -i 's/\\r$//' FILE)".into(),
        );
    }
    for (line, why) in &s.bad_directives {
        out.find(
            Trap::Refused,
            Origin::Line(*line),
            format!("sbatch cannot read this #SBATCH line ({why}) and stops with an error"),
            "close the quote or remove the stray ':' (or write # SBATCH to disable the line)".into(),
        );
    }
    for r in &job.refused {
        out.find(
            Trap::Refused,
            r.origin.clone(),
            format!("sbatch refuses this: {}", clip(&r.message, 160)),
            "check the option's spelling in man sbatch (a site plugin's option needs that plugin)".into(),
        );
    }
    let max = facts.cluster.config.as_ref().ok().and_then(|c| c.max_script_size).unwrap_or(SLURM_MAX_SCRIPT);
    if s.bytes > max {
        out.find(
            Trap::Refused,
            Origin::Line(1),
            format!(
                "the script is {} bytes; the controller refuses scripts over {max} bytes (max_script_size)",
                s.bytes
            ),
            "keep data out of the script: read it from a file the job opens".into(),
        );
    }
}

/// 15: `#SBATCH` lines sbatch never reads.
fn ignored_directives(job: &Job, out: &mut Report) {
    for ig in &job.script.ignored {
        let (what, fix) = match ig.why {
            IgnoredWhy::AfterCommand(first) => (
                format!(
                    "'{}' comes after the first command (line {first}): sbatch ignores it, silently",
                    ig.text
                ),
                format!("move it above line {first}, with the other #SBATCH lines"),
            ),
            IgnoredWhy::Indented => (
                format!("'{}' does not start in the first column: sbatch ignores it, silently", ig.text),
                "remove the leading spaces".to_owned(),
            ),
        };
        out.find(Trap::IgnoredDirective, Origin::Line(ig.line), what, fix);
    }
}

/// Whether `--auto-rdzv` is on for the job (option, or the site's default).
fn auto_rdzv(job: &Job) -> bool {
    let off = |s: &Setting| s.value.as_ref().is_some_and(|v| v.text.split(',').any(|w| w == "off"));
    let given =
        job.main().get("auto-rdzv").or_else(|| job.sruns.iter().find_map(|s| s.opts.get("auto-rdzv")));
    match given {
        Some(s) => !off(s),
        None => job.input.site_auto_rdzv,
    }
}

/// A port number written as a constant.
fn constant_port(text: &str) -> Option<u32> {
    let t = text.trim();
    (!t.is_empty() && t.len() <= 5 && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse().ok()).flatten()
}

/// 11: a fixed `MASTER_PORT` (an assignment, or a launcher's port flag).
/// The script's assignments with a literal value, `(line, name, value)`:
/// `NAME=VALUE cmd`, `NAME=VALUE`, and `export`/`declare`/`typeset`/`readonly NAME=VALUE`.
fn literal_assigns(job: &Job) -> Vec<(usize, String, String)> {
    let mut all = Vec::new();
    for c in &job.script.shell.commands {
        let decl = matches!(c.name().as_deref(), Some("export" | "declare" | "typeset" | "readonly"));
        all.extend(c.assigns.iter().filter_map(|(n, w)| w.literal().map(|v| (c.line, n.clone(), v))));
        if decl {
            for w in &c.words[1..] {
                if let Some((n, v)) = super::shell::assignment(w) {
                    if let Some(v) = v.literal() {
                        all.push((c.line, n, v));
                    }
                }
            }
        }
    }
    all
}

/// 17: `NCCL_SOCKET_IFNAME` or `GLOO_SOCKET_IFNAME` set to what NCCL or gloo misreads.
fn socket_ifname(assigns: &[(usize, String, String)], out: &mut Report) {
    for (line, name, value) in assigns {
        let (what, fix) = match name.as_str() {
            "NCCL_SOCKET_IFNAME" => match task_plan::netif::ifname_trap(value) {
                Some(what) => (what, format!("exclude lo too: NCCL_SOCKET_IFNAME={value},lo")),
                None => continue,
            },
            "GLOO_SOCKET_IFNAME" => match task_plan::netif::gloo_trap(value) {
                Some(what) => {
                    (what, "name the interface itself: GLOO_SOCKET_IFNAME=ib0 (one exact name)".to_owned())
                }
                None => continue,
            },
            _ => continue,
        };
        out.find(Trap::SocketIfname, Origin::Line(*line), what, fix);
    }
}

fn fixed_port(job: &Job, assigns: &[(usize, String, String)], out: &mut Report) {
    let rdzv = auto_rdzv(job);
    let say = |out: &mut Report, line: usize, what: String| {
        let (what, fix) = if rdzv {
            (
                format!(
                    "{what}: --auto-rdzv keeps a port you set, so every job of yours on a node uses this one and they collide"
                ),
                "remove it: --auto-rdzv derives a distinct port per job and step".to_owned(),
            )
        } else {
            (
                format!("{what}: two jobs on the same node collide on it (\"address already in use\")"),
                "derive it from the job (MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))), or use --auto-rdzv"
                    .to_owned(),
            )
        };
        out.find(Trap::FixedPort, Origin::Line(line), what, fix);
    };
    for (line, n, v) in assigns {
        if n == "MASTER_PORT" {
            if let Some(p) = constant_port(v) {
                say(out, *line, format!("MASTER_PORT={p} is a constant"));
            }
        }
    }
    for s in &job.sruns {
        let words: Vec<&str> = s.program.iter().map(|w| w.text.as_str()).collect();
        for (i, w) in words.iter().enumerate() {
            let (flag, value) = match w.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (*w, words.get(i + 1).copied()),
            };
            let port = match flag {
                "--master-port" | "--master_port" => value.and_then(constant_port),
                "--rdzv-endpoint" | "--rdzv_endpoint" => {
                    value.and_then(|v| v.rsplit_once(':')).and_then(|(_, p)| constant_port(p))
                }
                _ => None,
            };
            if let Some(p) = port {
                say(out, s.line, format!("{flag} with the constant port {p}"));
            }
        }
    }
}

/// 4: a signal trap while `srun` runs in the foreground (bash runs the trap
/// only when the foreground command ends); `srun &` with no `wait` after it.
fn srun_foreground(job: &Job, out: &mut Report) {
    let trap = job
        .traps
        .iter()
        .filter(|t| t.acts() && !t.in_function && t.signals.iter().any(|s| real_signal(s)))
        .min_by_key(|t| t.line);
    let handlers: Vec<&str> = job.traps.iter().map(|t| t.handler.as_str()).collect();
    let waits: Vec<usize> = job
        .script
        .shell
        .commands
        .iter()
        .filter(|c| c.name().as_deref() == Some("wait"))
        .map(|c| c.line)
        .collect();
    let mut foreground: Vec<usize> = Vec::new();
    for s in &job.sruns {
        if s.function.as_deref().is_some_and(|f| handlers.contains(&f)) {
            continue;
        }
        if s.background {
            if !waits.iter().any(|w| *w > s.line) && s.function.is_none() {
                out.find(
                    Trap::SrunForeground,
                    Origin::Line(s.line),
                    "srun runs in the background and nothing waits for it: the script ends at once, and Slurm ends the job and kills the step".into(),
                    "wait for it: SRUN_PID=$! on the next line, then wait \"$SRUN_PID\"".into(),
                );
            }
            continue;
        }
        if trap.is_some_and(|t| t.line < s.line) {
            foreground.push(s.line);
        }
    }
    // One finding, at the last foreground srun (usually the long one).
    let (Some(t), Some(&last)) = (trap, foreground.last()) else { return };
    let sig = t.signals.iter().find(|s| real_signal(s)).cloned().unwrap_or_default();
    let others = match foreground.len() - 1 {
        0 => String::new(),
        1 => format!(" (so does the srun of line {})", foreground[0]),
        n => format!(" (so do {n} other srun lines after line {})", t.line),
    };
    out.find(
        Trap::SrunForeground,
        Origin::Line(last),
        format!(
            "srun runs in the foreground: bash runs the {sig} trap of line {} only after srun exits, too late to save a checkpoint{others}",
            t.line
        ),
        "run it in the background and wait: srun ... & SRUN_PID=$!; wait \"$SRUN_PID\"".into(),
    );
}

// ----- one job component -----------------------------------------------------------

pub(crate) fn component_traps(cx: &Cx, out: &mut Report) {
    array_output(cx, out);
    signal_not_batch(cx, out);
    preemption(cx, out);
    preempt_signal(cx, out);
    gpus_two_ways(cx, out);
    mem_zero(cx, out);
    afterok(cx, out);
}

/// 2: array tasks that write the same log.
fn array_output(cx: &Cx, out: &mut Report) {
    let Some(array) = cx.req.get("array") else { return };
    for opt in ["output", "error"] {
        let Some(s) = cx.req.get(opt) else { continue };
        let Some(v) = s.value.as_ref() else { continue };
        if !v.known {
            out.note(Trap::ArrayOutput, format!("{} holds shell lint cannot resolve; not checked", shown(s)));
            continue;
        }
        if v.text.starts_with("/dev/") {
            continue;
        }
        let f = values::pattern_fields(&v.text);
        let has = |c: char| f.contains(&c);
        if !has('a') && !has('j') && !has('J') {
            out.find(
                Trap::ArrayOutput,
                s.origin.clone(),
                format!("{} names no %a (or %j) in an array job ({}): every task writes the same file and they overwrite each other", shown(s), shown(array)),
                format!("put %A_%a in the name: --{opt}=...%x-%A_%a.out"),
            );
        } else if has('a') && !has('A') && !has('j') && !has('J') {
            out.find(
                Trap::ArrayOutput,
                s.origin.clone(),
                format!(
                    "{} has %a but no %A: the next submission of this array overwrites these logs",
                    shown(s)
                ),
                format!("add the array's job id: --{opt}=...%x-%A_%a.out"),
            );
        }
    }
}

/// The signal option in force, read.
fn signal(cx: &Cx, out: &mut Report) -> Option<(Signal, Setting)> {
    let s = cx.req.get("signal")?;
    let v = s.value.as_ref()?;
    if !v.known {
        out.note(Trap::SignalNotBatch, format!("{} holds shell lint cannot resolve; not checked", shown(s)));
        return None;
    }
    values::parse_signal(&v.text).map(|sig| (sig, s.clone()))
}

/// 3: `--signal` without `B:` while the batch shell traps that signal.
fn signal_not_batch(cx: &Cx, out: &mut Report) {
    let Some((sig, s)) = signal(cx, out) else { return };
    if sig.batch {
        return;
    }
    let Some(t) = cx.job.traps.iter().find(|t| t.acts() && t.signals.contains(&sig.name)) else { return };
    out.find(
        Trap::SignalNotBatch,
        s.origin.clone(),
        format!(
            "{} sends {} to the job's steps, not to the batch shell: the {} trap of line {} never fires",
            shown(&s),
            sig.name,
            sig.name,
            t.line
        ),
        format!("--signal=B:{}@{}", sig.name, sig.secs),
    );
}

/// Whether the script speaks of a checkpoint anywhere in its commands.
fn mentions_checkpoint(job: &Job) -> bool {
    job.script.shell.commands.iter().any(|c| {
        c.words.iter().chain(c.assigns.iter().map(|(_, w)| w)).any(|w| {
            let t = w.raw().to_ascii_lowercase();
            t.contains("ckpt") || t.contains("checkpoint") || t.contains("resume")
        }) || c.assigns.iter().any(|(n, _)| n.to_ascii_lowercase().contains("ckpt"))
    })
}

/// 5: preemption or a requeue that loses the work.
fn preemption(cx: &Cx, out: &mut Report) {
    let job = cx.job;
    let requeue = cx.req.last(&["requeue", "no-requeue"]).filter(|s| s.name == "requeue");
    let handlers: Vec<_> =
        job.traps.iter().filter(|t| t.acts() && t.signals.iter().any(|s| real_signal(s))).collect();
    if let Some(r) = requeue {
        for t in handlers.iter().filter(|t| !t.requeues()) {
            out.find(
                Trap::Preemption,
                Origin::Line(t.line),
                format!(
                    "the job has {} but the {} trap ({}) never requeues it: at the time limit it ends, and the work after the last checkpoint is not resumed",
                    shown(r),
                    t.signals.join("/"),
                    clip(&t.handler, 40)
                ),
                "end the handler with scontrol requeue \"$SLURM_JOB_ID\" (after the checkpoint is written)".into(),
            );
        }
    }
    let Some(q) = cx.req.get("qos") else { return };
    let Some(name) = q.value.as_ref().and_then(|v| v.get()) else { return };
    match cx.facts.cluster.preemptible(name) {
        Err(why) => {
            out.note(Trap::Preemption, format!("whether QoS {name} can be preempted is not known ({why})"))
        }
        Ok(None) => {
            let by = cx.facts.cluster.listed_by(name);
            let kind = cx.facts.cluster.config.as_ref().map(|c| c.preempt_type.clone()).unwrap_or_default();
            if !by.is_empty() && !kind.ends_with("qos") {
                out.note(
                    Trap::Preemption,
                    format!("QoS {name} is in the Preempt list of {}, but PreemptType is {kind}: QoS do not preempt here", by.join(", ")),
                );
            }
        }
        Ok(Some((by, mode))) => {
            let warned = signal(cx, &mut Report::default()).is_some_and(|(s, _)| s.batch);
            if !warned && !mentions_checkpoint(job) {
                out.find(
                    Trap::Preemption,
                    q.origin.clone(),
                    format!(
                        "QoS {name} can be preempted by {} (PreemptMode={mode}), and the script has no --signal=B:... and no checkpoint: preemption loses all the work since the start",
                        by.join(", ")
                    ),
                    "save checkpoints, add --signal=B:USR1@180 with a trap that saves and requeues (spank-gpu autopsy prints the recipe)".into(),
                );
            }
        }
    }
}

/// 18: a `--signal` with a QoS that can be preempted: whether the signal
/// comes at preemption on this cluster, and its lead time against the QoS's
/// `GraceTime`. From Slurm's preemption (`_job_check_grace_internal`,
/// src/slurmctld/preempt.c to 24.05, src/interfaces/preempt.c from 24.11; the
/// same on 22.05 through 26.05): with a grace time, the job's `--signal` goes
/// out at once, whatever its `@N`, only where the cluster sends the user
/// signal at preemption; else its tasks get SIGTERM at once. SIGTERM to the
/// tasks and the batch shell follows the grace time, SIGKILL `KillWait` later.
/// With no grace time the job is ended at once (the user signal, if sent, at
/// that same moment). `PreemptMode=SUSPEND` stops the job instead: nothing to say.
fn preempt_signal(cx: &Cx, out: &mut Report) {
    let Some((sig, s)) = signal(cx, &mut Report::default()) else { return };
    let Some(name) = cx.req.value("qos").and_then(|v| v.get()) else { return };
    let Ok(Some((by, mode))) = cx.facts.cluster.preemptible(name) else { return };
    if mode.to_ascii_uppercase().contains("SUSPEND") {
        return;
    }
    let Ok(config) = cx.facts.cluster.config.as_ref() else { return };
    let release = cx.facts.release.number;
    let setting = Config::user_signal_setting(release);
    let kw = config.kill_wait_s;
    let grace = cx.facts.cluster.qos_grace(name);
    let (after, within) = match &grace {
        Ok(Some(g)) => (format!("{g} s later (QoS {name}'s GraceTime)"), format!("{g} s")),
        _ => (format!("at the end of QoS {name}'s GraceTime"), "the QoS's GraceTime".to_owned()),
    };
    let by = by.join(", ");
    let n = sig.secs;
    if !config.sends_user_signal(release) {
        out.find(
            Trap::PreemptSignal,
            s.origin.clone(),
            format!(
                "{} comes {n} s before the time limit, not at preemption: QoS {name} can be preempted by {by}, and this cluster does not send the --signal then ({setting} is not set on Slurm {}). Preempted, the job's tasks get SIGTERM at once, the batch shell SIGTERM {after} and SIGKILL {kw} s after that, and the {} trap never runs",
                shown(&s),
                release_line(release),
                sig.name
            ),
            format!(
                "save a checkpoint when the program gets SIGTERM (within {within}), or ask the admins for {setting}"
            ),
        );
        return;
    }
    match grace {
        Ok(Some(g)) if g < n => out.find(
            Trap::PreemptSignal,
            s.origin.clone(),
            if g == 0 {
                format!(
                    "{} comes at preemption on this cluster, but QoS {name} (preemptible by {by}) has no GraceTime: SIGTERM comes with it and SIGKILL {kw} s later, not the {n} s the signal's lead time plans for",
                    shown(&s)
                )
            } else {
                format!(
                    "{} comes at preemption on this cluster, but QoS {name} (preemptible by {by}) gives only {g} s (GraceTime) before SIGTERM, and SIGKILL {kw} s later, not the {n} s the signal's lead time plans for",
                    shown(&s)
                )
            },
            format!(
                "make the checkpoint fit in {g} s (+{kw} s), or ask the admins for a GraceTime of at least {n} s on QoS {name}"
            ),
        ),
        Ok(Some(_)) => {}
        Ok(None) => out.note(
            Trap::PreemptSignal,
            format!("QoS {name}'s GraceTime is not known (sacctmgr did not give it): the {n} s lead time is not checked"),
        ),
        Err(why) => out.note(Trap::PreemptSignal, format!("QoS {name}'s GraceTime is not known ({why})")),
    }
}

/// 7: GPUs asked for in more than one way.
fn gpus_two_ways(cx: &Cx, out: &mut Report) {
    let mut ways: Vec<&Setting> = ["gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket"]
        .iter()
        .filter_map(|n| cx.req.get(n))
        .collect();
    if let Some(g) = cx.req.get("gres") {
        if g.value.as_ref().is_some_and(|v| values::parse_gres_list(&v.text).iter().any(|x| x.name == "gpu"))
        {
            ways.push(g);
        }
    }
    if ways.len() < 2 {
        return;
    }
    let order = |s: &Setting| match s.origin {
        Origin::Line(n) => (0, n),
        Origin::Env(_) => (1, 0),
        Origin::CommandLine => (2, 0),
    };
    ways.sort_by_key(|s| order(s));
    let all: Vec<String> = ways.iter().map(|s| shown(s)).collect();
    out.find(
        Trap::GpusTwoWays,
        ways[1].origin.clone(),
        format!("GPUs are asked for {} ways ({}): Slurm refuses some mixes and adds up others, so the job gets other GPUs than you think", ways.len(), all.join(", ")),
        "keep one: --gpus-per-node=N for one launcher per node, --gpus-per-task=1 for one rank per GPU".into(),
    );
}

/// 14: `--mem=0` without `--exclusive`.
fn mem_zero(cx: &Cx, out: &mut Report) {
    let Some(m) = cx.req.get("mem") else { return };
    if m.value.as_ref().and_then(|v| v.get()).and_then(values::parse_mem_mib) != Some(0)
        || cx.req.has("exclusive")
    {
        return;
    }
    out.find(
        Trap::MemZero,
        m.origin.clone(),
        "--mem=0 takes all of each node's memory but not the node: it waits for nodes with no memory in use, then keeps every other job off them, and you are charged for less than you block".into(),
        "add --exclusive (the whole node is yours), or ask for the memory you need (--mem=500G)".into(),
    );
}

/// 16: `afterok` on a job that can be preempted (its QoS) or that this
/// script chains on itself while it expects to be cut short.
fn afterok(cx: &Cx, out: &mut Report) {
    let job = cx.job;
    if let Some(d) = cx.req.get("dependency") {
        match d.value.as_ref().and_then(|v| v.get()) {
            None => {
                out.note(Trap::AfterOk, format!("{} holds shell lint cannot resolve; not checked", shown(d)))
            }
            Some(text) => {
                for (kind, jobs) in values::parse_dependency(text) {
                    if kind != "afterok" {
                        continue;
                    }
                    for j in jobs {
                        let qos = match &cx.facts.cluster.jobs {
                            Ok(map) => map.get(&j).cloned(),
                            Err(why) => {
                                out.note(Trap::AfterOk, format!("job {j}'s QoS is not known ({why})"));
                                continue;
                            }
                        };
                        let Some(qos) = qos else { continue };
                        if let Ok(Some((by, _))) = cx.facts.cluster.preemptible(&qos) {
                            out.find(
                                Trap::AfterOk,
                                d.origin.clone(),
                                format!(
                                    "afterok:{j} waits for job {j} to succeed, but its QoS {qos} can be preempted by {}: preempted, it ends PREEMPTED and this job never starts (DependencyNeverSatisfied)",
                                    by.join(", ")
                                ),
                                format!("afterany:{j} starts it however {j} ended; the job must then resume from the latest checkpoint"),
                            );
                        }
                    }
                }
            }
        }
    }
    if cx.component != 0 {
        return;
    }
    // The script submits the next segment after itself.
    let own_qos = cx.req.value("qos").and_then(|v| v.get()).map(str::to_owned);
    let preemptible =
        own_qos.as_deref().is_some_and(|q| matches!(cx.facts.cluster.preemptible(q), Ok(Some(_))));
    let cut_short = job.traps.iter().any(|t| t.acts() && t.signals.iter().any(|s| real_signal(s)));
    for sb in &job.sbatches {
        let Some(dep) = sb.opts.value("dependency") else { continue };
        let t = dep.text.to_ascii_lowercase();
        if !(t.contains("afterok") && (t.contains("slurm_job_id") || t.contains("slurm_jobid"))) {
            continue;
        }
        if !(preemptible || cut_short) {
            continue;
        }
        let why = if preemptible {
            format!("this job's QoS {} can be preempted", own_qos.as_deref().unwrap_or(""))
        } else {
            "this job expects to be cut short (it traps a signal)".to_owned()
        };
        out.find(
            Trap::AfterOk,
            Origin::Line(sb.line),
            format!("the next job waits with afterok on this one, but {why}: ending PREEMPTED or TIMEOUT is not OK, and the chain stops (DependencyNeverSatisfied)"),
            "use --dependency=afterany:$SLURM_JOB_ID, and make the next segment resume from the latest checkpoint".into(),
        );
    }
}

// ----- the steps --------------------------------------------------------------------

pub(crate) fn step_traps(job: &Job, facts: &Facts, out: &mut Report) {
    for s in &job.sruns {
        if let Some(Stop::Unknown { word }) = &s.stop {
            out.note(
                Trap::KillOnBadExit,
                format!(
                    "line {}: srun's options after a word lint cannot resolve (word {}) are not read; traps 6, 9 and 10 are not checked there",
                    s.line,
                    word + 1
                ),
            );
            continue;
        }
        launcher_gpus(job, s, out);
        srun_cpus(job, facts, s, out);
        kill_on_bad_exit(job, facts, s, out);
    }
    for t in [Trap::SrunCpus, Trap::KillOnBadExit] {
        merge(out, t);
    }
}

/// Keeps one finding of `trap` (the same words for every srun line): the
/// first, naming the other lines.
fn merge(out: &mut Report, trap: Trap) {
    let lines: Vec<usize> =
        out.findings.iter().filter(|f| f.trap == trap).filter_map(super::Finding::line).collect();
    if lines.len() < 2 {
        return;
    }
    let mut seen = false;
    out.findings.retain(|f| {
        let keep = f.trap != trap || !seen;
        seen |= f.trap == trap;
        keep
    });
    let shown: Vec<String> = lines[1..].iter().take(5).map(ToString::to_string).collect();
    let more = match lines.len() - 1 - shown.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    if let Some(f) = out.findings.iter_mut().find(|f| f.trap == trap) {
        f.what = format!("{} (also the srun lines {}{more})", f.what, shown.join(", "));
    }
}

/// An option of the step, else what it inherits from the job through the
/// batch environment (`inherit`: whether srun reads the job's value).
fn step_value(job: &Job, s: &Launch, name: &str, inherit: bool) -> Option<(String, bool)> {
    if let Some(v) = s.opts.value(name) {
        return Some((v.text.clone(), v.known));
    }
    if inherit {
        if let Some(v) = job.main().value(name) {
            return Some((v.text.clone(), v.known));
        }
    }
    None
}

/// The number in a value, when known.
fn known_count(v: Option<(String, bool)>) -> Option<Option<u64>> {
    v.map(|(t, known)| if known { values::parse_count(&t) } else { None })
}

/// Tasks per node of a step, when it can be told.
fn tasks_per_node(job: &Job, s: &Launch) -> Option<u64> {
    if let Some(Some(n)) = known_count(step_value(job, s, "ntasks-per-node", true)) {
        return Some(n);
    }
    let ntasks = known_count(step_value(job, s, "ntasks", true)).flatten()?;
    let nodes = step_nodes(job, s)?;
    (ntasks == nodes).then_some(1)
}

/// The nodes a step spans, when they can be told.
fn step_nodes(job: &Job, s: &Launch) -> Option<u64> {
    if let Some(n) = known_count(s.opts.value("nodes").map(|v| (v.text.clone(), v.known))) {
        return n;
    }
    let job_nodes = match job.main().value("nodes") {
        Some(v) if v.known => values::parse_count(&v.text)?,
        Some(_) => return None,
        // With --ntasks and no --nodes, Slurm chooses how many nodes.
        None if job.main().has("ntasks") => return None,
        None => 1,
    };
    match known_count(s.opts.value("ntasks").map(|v| (v.text.clone(), v.known))) {
        Some(Some(n)) => Some(n.min(job_nodes)),
        Some(None) => None,
        None => Some(job_nodes),
    }
}

/// The value of the last of `flags` in `words` (`--flag=V` or `--flag V`).
pub(crate) fn flag_value<'a>(words: &[&'a str], flags: &[&str]) -> Option<&'a str> {
    let mut found = None;
    for (i, w) in words.iter().enumerate() {
        let (f, v) = match w.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (*w, words.get(i + 1).copied()),
        };
        if flags.contains(&f) {
            found = v;
        }
    }
    found
}

/// How many processes a launcher starts per node, from its flags; `None`
/// when it is not a launcher, `Some(None)` when its count is not written.
pub(crate) fn launcher(program: &[ArgWord]) -> Option<(String, Option<u64>)> {
    let words: Vec<&str> = program.iter().map(|w| w.text.as_str()).collect();
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_owned();
    let first = base(words.first()?);
    let (name, flags): (String, &[&str]) = match first.as_str() {
        "torchrun" => ("torchrun".into(), &["--nproc-per-node", "--nproc_per_node"]),
        "deepspeed" => ("deepspeed".into(), &["--num_gpus", "--num-gpus"]),
        "accelerate" if words.get(1) == Some(&"launch") => {
            ("accelerate launch".into(), &["--num_processes", "--num-processes"])
        }
        p if p.starts_with("python") => {
            let m = words.iter().position(|w| *w == "-m")?;
            match words.get(m + 1).copied() {
                Some("torch.distributed.run" | "torch.distributed.launch") => {
                    ("python -m torch.distributed.run".into(), &["--nproc-per-node", "--nproc_per_node"])
                }
                _ => return None,
            }
        }
        _ => return None,
    };
    Some((name, flag_value(&words, flags).and_then(|v| v.parse().ok())))
}

/// 6: one GPU per task for a launcher that starts a process per GPU.
fn launcher_gpus(job: &Job, s: &Launch, out: &mut Report) {
    let Some((name, procs)) = launcher(&s.program) else { return };
    let Some(Some(gpt)) = known_count(step_value(job, s, "gpus-per-task", true)) else { return };
    if tasks_per_node(job, s) != Some(1) {
        return;
    }
    let many = match procs {
        Some(p) if p > gpt => format!("{name} starts {p} processes on each node"),
        Some(_) => return,
        None => format!("{name} starts a process per GPU it sees"),
    };
    out.find(
        Trap::LauncherGpus,
        Origin::Line(s.line),
        format!(
            "--gpus-per-task={gpt} with one task per node: {many}, but the task sees {gpt} GPU(s) (CUDA_VISIBLE_DEVICES), so torch.cuda.device_count() is {gpt}"
        ),
        "ask for the node's GPUs for the one task: --gpus-per-node=N (and no --gpus-per-task)".into(),
    );
}

/// 9: srun without `--cpus-per-task` in a job that sets it, where srun does not inherit it.
fn srun_cpus(job: &Job, facts: &Facts, s: &Launch, out: &mut Report) {
    let Some(jc) = job.main().get("cpus-per-task") else { return };
    if s.opts.has("cpus-per-task") {
        return;
    }
    let release = facts.release.number;
    if release >= SRUN_INHERITS_CPUS_SINCE {
        return;
    }
    let n = match jc.value.as_ref().and_then(|v| v.get()).and_then(values::parse_count) {
        Some(n) if n > 1 => n,
        Some(_) => return,
        None => {
            out.note(Trap::SrunCpus, format!("{} holds shell lint cannot resolve; not checked", shown(jc)));
            return;
        }
    };
    match job.env_for(s, "SRUN_CPUS_PER_TASK") {
        VarValue::Unset => {}
        VarValue::Known(_) => return,
        VarValue::Unknown => {
            out.note(
                Trap::SrunCpus,
                format!("line {}: whether SRUN_CPUS_PER_TASK is set there is not known; not checked", s.line),
            );
            return;
        }
    }
    out.find(
        Trap::SrunCpus,
        Origin::Line(s.line),
        format!(
            "on Slurm {} ({}) srun does not inherit --cpus-per-task={n}: this step gets 1 CPU per task, and data loaders and OpenMP crawl on one core",
            release_line(release),
            facts.release.from
        ),
        "srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" ... (or export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK once)".into(),
    );
}

/// 10: a multi-node srun that lets the other ranks run on after one dies.
fn kill_on_bad_exit(job: &Job, facts: &Facts, s: &Launch, out: &mut Report) {
    if s.opts.has("kill-on-bad-exit") {
        return;
    }
    let nodes = match step_nodes(job, s) {
        Some(n) if n > 1 => n,
        Some(_) => return,
        None => {
            out.note(
                Trap::KillOnBadExit,
                format!("line {}: how many nodes srun spans is not known; not checked", s.line),
            );
            return;
        }
    };
    match job.env_for(s, "SLURM_KILL_BAD_EXIT") {
        VarValue::Known(v) if v.trim() != "0" => return,
        VarValue::Unknown => {
            out.note(
                Trap::KillOnBadExit,
                format!("line {}: whether SLURM_KILL_BAD_EXIT is set there is not known", s.line),
            );
            return;
        }
        _ => {}
    }
    match &facts.cluster.config {
        Ok(c) if c.kill_on_bad_exit => {}
        Ok(_) => out.find(
            Trap::KillOnBadExit,
            Origin::Line(s.line),
            format!(
                "srun spans {nodes} nodes without --kill-on-bad-exit=1 and the cluster has no KillOnBadExit=1: when one rank dies the others wait in NCCL until its timeout (up to 30 minutes), burning every GPU of the job"
            ),
            "srun --kill-on-bad-exit=1 ...".into(),
        ),
        Err(why) => out.note(Trap::KillOnBadExit, format!("KillOnBadExit of the cluster is not known ({why})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_and_their_counts() {
        let w = |s: &str| s.split_whitespace().map(ArgWord::known).collect::<Vec<_>>();
        assert_eq!(launcher(&w("torchrun --nproc-per-node=8 train.py")), Some(("torchrun".into(), Some(8))));
        assert_eq!(
            launcher(&w("python -m torch.distributed.run --nproc_per_node 4 x")),
            Some(("python -m torch.distributed.run".into(), Some(4)))
        );
        assert_eq!(launcher(&w("accelerate launch x.py")), Some(("accelerate launch".into(), None)));
        assert_eq!(launcher(&w("python train.py")), None);
    }

    #[test]
    fn ports() {
        assert_eq!(constant_port("29500"), Some(29500));
        assert_eq!(constant_port("$((20000 + SLURM_JOB_ID % 20000))"), None);
        assert_eq!(constant_port("123456"), None);
    }
}
