//! `spank-gpu lint SCRIPT [--json]`: the shell around `batch_lint`. It
//! reads the script (`-`: standard input), asks the cluster what the checks
//! need (each read-only command at most once, under `why`'s deadline, through
//! [`super::slurm_cmd::slurm`]), looks at the output directories, and prints the
//! findings in words or as JSON. Exit status: 0 clean, 1 findings, 2 the
//! script could not be read (or a usage error). Its own options are clap's
//! ([`LintArgs`]); the sbatch options after `--` are read by lint's sbatch
//! parser (`batch_lint::getopt`), as sbatch reads them.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;

use batch_lint::facts::{self, Cluster};
use batch_lint::table::Arg;
use batch_lint::{self as lint, Facts, Input, Needs, Origin, Release, Report, Trap, script};
use serde_json::{Value, json};
use task_plan::options::UserOption;
use task_plan::plugstack::PluginConfig;

use super::slurm_cmd::slurm;
use batch_lint::outdirs;

/// The `--json` schema version; bumped on any incompatible change.
const SCHEMA: u32 = 1;

/// What `--help` shows as the usage.
const USAGE: &str = "spank-gpu lint [--json] [--no-cluster] [--release X.Y] SCRIPT|-
       spank-gpu lint [--json] [--no-cluster] [--release X.Y] -- [SBATCH OPTIONS] SCRIPT|-";

/// The name findings carry for a script read from standard input.
pub const STDIN_NAME: &str = "<stdin>";

/// A batch script's traps, before it costs GPU-hours
///
/// The traps of a batch script (docs/users.md, "Checking a script before
/// submitting it"), read as sbatch reads it: #SBATCH lines, SBATCH_* variables,
/// the sbatch options after --, and the srun lines inside. Asks the cluster
/// (sinfo, scontrol, sacctmgr, squeue; read-only) unless --no-cluster.
/// SCRIPT - reads the script from standard input (named <stdin> in the findings).
///
/// Exit status: 0 no finding, 1 findings, 2 the script could not be read or a
/// usage error (with --json, also one JSON object on stdout).
#[derive(clap::Args, Debug)]
#[command(override_usage = USAGE, verbatim_doc_comment)]
pub struct LintArgs {
    /// One JSON object on stdout (its keys: docs/users.md)
    #[arg(long)]
    pub json: bool,
    /// Ask the cluster nothing; the release is the one spank-gpu was built for
    #[arg(long)]
    no_cluster: bool,
    /// Check for this Slurm release (22.05, 24.11.5) instead of the cluster's
    #[arg(long, value_name = "X.Y", value_parser = parse_release)]
    release: Option<u32>,
    /// The batch script; - reads it from standard input
    #[arg(value_name = "SCRIPT", required_unless_present = "sbatch")]
    script: Option<String>,
    /// After --: sbatch's options, then the script (or -) and its arguments, as sbatch reads them
    #[arg(last = true, value_name = "SBATCH ARGS")]
    sbatch: Vec<String>,
}

fn parse_release(v: &str) -> Result<u32, String> {
    facts::parse_version(v).ok_or_else(|| "expected a release like 22.05 or 24.11.5".to_owned())
}

/// How `lint` ends: its exit status.
#[derive(Debug)]
pub enum Outcome {
    /// No finding.
    Clean,
    /// At least one finding.
    Findings,
}

struct Args {
    json: bool,
    no_cluster: bool,
    release: Option<u32>,
    sbatch_args: Vec<String>,
    script: String,
    /// `--wrap=CMD` among the sbatch options, without a script.
    wrap: Option<String>,
}

/// Why `lint` did not lint (exit status 2).
#[derive(Debug)]
pub enum Failure {
    /// The command line, in words for a usage error.
    Usage(String),
    /// The script could not be read, in one line.
    Script(String),
}

/// The options clap read, and the script among the sbatch options after `--`.
fn parse_args(a: LintArgs) -> Result<Args, String> {
    let mut out = Args {
        json: a.json,
        no_cluster: a.no_cluster,
        release: a.release,
        sbatch_args: Vec::new(),
        script: a.script.unwrap_or_default(),
        wrap: None,
    };
    if a.sbatch.is_empty() {
        return Ok(out);
    }
    if !out.script.is_empty() {
        return Err(format!(
            "'{}' before -- and sbatch options after it: the script comes last, after the sbatch options \
             (spank-gpu lint -- OPTIONS SCRIPT)",
            slurm_formats::text::clip(&out.script, 80)
        ));
    }
    let rest = a.sbatch;
    // The script is sbatch's first operand: the word after its options.
    let words: Vec<_> = rest.iter().map(|w| batch_lint::getopt::ArgWord::known(w)).collect();
    let release = out.release.unwrap_or(slurm_sys::VERSION_NUMBER);
    let plugins = our_options();
    let p = batch_lint::getopt::parse(batch_lint::getopt::Program::Sbatch, release, &plugins, &words);
    out.sbatch_args = rest[..p.operands.min(rest.len())].to_vec();
    out.wrap = p.opts.iter().rev().find(|o| o.name == "wrap").and_then(|o| o.value.clone()).map(|v| v.text);
    match rest.get(p.operands) {
        Some(script) => out.script = script.clone(),
        None if out.wrap.is_some() => out.script = "--wrap".to_owned(),
        None => return Err("no script after the sbatch options".to_owned()),
    }
    Ok(out)
}

/// The plugin's own options, which sbatch knows where the plugin is installed.
fn our_options() -> Vec<(String, Arg)> {
    UserOption::ALL.iter().map(|o| (o.name().to_owned(), Arg::Optional)).collect()
}

/// Reads the script, at most [`script::MAX_BYTES`] + 1 bytes; `-` is standard input.
fn read_script(path: &str) -> Result<Vec<u8>, String> {
    if path == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .lock()
            .take(script::MAX_BYTES as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| format!("{STDIN_NAME}: {}", io_words(&e)))?;
        return Ok(buf);
    }
    let meta = fs::metadata(path).map_err(|e| format!("{path}: {}", io_words(&e)))?;
    if meta.is_dir() {
        return Err(format!("{path}: is a directory, not a batch script"));
    }
    let f = fs::File::open(path).map_err(|e| format!("{path}: {}", io_words(&e)))?;
    let mut buf = Vec::new();
    f.take(script::MAX_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{path}: {}", io_words(&e)))?;
    Ok(buf)
}

fn io_words(e: &std::io::Error) -> String {
    outdirs::io_words(e)
}

/// SPANK plugins' options from `sbatch --help` ("Options provided by plugins:").
fn plugin_options() -> Vec<(String, Arg)> {
    let Ok(help) = slurm("sbatch", &["--help"]) else { return Vec::new() };
    let mut in_plugins = false;
    let mut out = Vec::new();
    for line in help.lines() {
        if line.trim_start().starts_with("Options provided by plugins") {
            in_plugins = true;
            continue;
        }
        if !in_plugins {
            continue;
        }
        let Some(word) = line.split_whitespace().next().and_then(|w| w.strip_prefix("--")) else {
            if !line.trim().is_empty() && !line.starts_with(' ') {
                in_plugins = false;
            }
            continue;
        };
        let (name, arg) = match word.split_once(['=', '[']) {
            Some((n, _)) => (n, Arg::Optional),
            None => (word, Arg::None),
        };
        out.push((name.to_owned(), arg));
    }
    out
}

/// The release, asked once: `scontrol --version`, else what this build was made for.
fn release(args: &Args) -> (Release, Option<String>) {
    let skip = args.no_cluster.then(|| "not asked (--no-cluster)".to_owned());
    if let Some(n) = args.release {
        return (Release { number: n, from: "--release".into() }, skip);
    }
    let built =
        Release { number: slurm_sys::VERSION_NUMBER, from: "the Slurm spank-gpu was built for".into() };
    if skip.is_some() {
        return (built, skip);
    }
    match slurm("scontrol", facts::VERSION_ARGS) {
        Ok(text) => match facts::parse_version(&text) {
            Some(n) => (Release { number: n, from: "scontrol --version".into() }, None),
            None => (built, None),
        },
        Err(e) => (built, Some(format!("no cluster to ask: {e}"))),
    }
}

/// Asks the cluster what `needs` says, each command once. When the
/// controller does not answer `sinfo`, nothing else is asked of it.
fn ask(needs: &Needs, skip: Option<&str>) -> Cluster {
    if let Some(why) = skip {
        return Cluster::unknown(why);
    }
    let mut c = Cluster::unknown("not needed");
    c.from = "sinfo, scontrol, sacctmgr, squeue".into();
    let mut down: Option<String> = None;
    if needs.partitions {
        c.partitions = slurm("sinfo", facts::SINFO_ARGS)
            .map(|t| facts::parse_sinfo(&t))
            .map_err(|e| format!("sinfo: {e}"));
        if let Err(e) = &c.partitions {
            down = Some(e.clone());
        }
    }
    let unless_down = |f: &dyn Fn() -> Result<String, String>| match &down {
        Some(e) => Err(format!("not asked, the controller did not answer ({e})")),
        None => f(),
    };
    if needs.config {
        c.config = unless_down(&|| {
            slurm("scontrol", facts::CONFIG_ARGS).map_err(|e| format!("scontrol show config: {e}"))
        })
        .map(|t| facts::parse_config(&t));
    }
    if needs.qos {
        c.qos = unless_down(&|| {
            slurm("sacctmgr", facts::QOS_ARGS).map_err(|e| format!("sacctmgr show qos: {e}"))
        })
        .map(|t| facts::parse_qos(&t));
    }
    if !needs.jobs.is_empty() {
        let args = facts::squeue_args(&needs.jobs);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        c.jobs = unless_down(&|| slurm("squeue", &args).map_err(|e| format!("squeue: {e}")))
            .map(|t| facts::parse_job_qos(&t));
    }
    c
}

fn where_json(f: &lint::Finding) -> (Value, &'static str, Value) {
    match &f.at {
        Origin::Line(n) => (json!(n), "line", Value::Null),
        Origin::Env(v) => (Value::Null, "env", json!(v)),
        Origin::CommandLine => (Value::Null, "command_line", Value::Null),
    }
}

/// What lint learned of the cluster (`null` for what it does not know).
fn cluster_json(c: &Cluster) -> Value {
    use batch_lint::values::{Gres, Limit};
    let gres = |g: &[Gres]| -> Vec<Value> {
        g.iter().map(|g| json!({"name": g.name, "type": g.kind, "count": g.count})).collect()
    };
    let limit = |l: Limit| match l {
        Limit::Secs(s) => json!(s),
        Limit::Infinite => Value::Null,
    };
    let partitions = c.partitions.as_ref().ok().map(|parts| {
        parts
            .iter()
            .map(|p| {
                json!({
                    "name": p.name, "default": p.default,
                    "max_time_s": limit(p.max_time), "default_time_s": p.default_time.map(limit),
                    "nodes": p.nodes.iter().map(|n| json!({
                        "count": n.count, "cpus": n.cpus, "memory_mb": n.memory_mib, "gres": gres(&n.gres)
                    })).collect::<Vec<_>>(),
                })
            })
            .collect::<Vec<_>>()
    });
    let config = c.config.as_ref().ok().map(|k| {
        json!({"kill_on_bad_exit": k.kill_on_bad_exit, "preempt_type": k.preempt_type, "preempt_mode": k.preempt_mode})
    });
    let qos = c.qos.as_ref().ok().map(|q| {
        q.iter().map(|q| json!({"name": q.name, "preempts": q.preempts, "mode": q.mode})).collect::<Vec<_>>()
    });
    json!({"asked": c.partitions.is_ok(), "from": c.from, "partitions": partitions, "config": config, "qos": qos})
}

fn print_json(file: &str, r: &Report, release: &Release, cluster: &Cluster) {
    let findings: Vec<Value> = r
        .findings
        .iter()
        .map(|f| {
            let (line, source, variable) = where_json(f);
            json!({
                "trap": f.trap.number(), "id": f.trap.id(), "line": line, "source": source, "variable": variable,
                "where": f.place(file), "what": f.what, "fix": f.fix, "strict": f.trap.strict(),
            })
        })
        .collect();
    let notes: Vec<Value> =
        r.notes.iter().map(|n| json!({"trap": n.trap.number(), "id": n.trap.id(), "why": n.text})).collect();
    let v = json!({
        "schema": SCHEMA,
        "file": file,
        "release": {"version": facts::release_words(release.number), "number": release.number, "from": release.from},
        "cluster": cluster_json(cluster),
        "findings": findings,
        "not_checked": notes,
        "exit": u8::from(!r.findings.is_empty()),
    });
    println!("{v}");
}

fn print_text(file: &str, r: &Report, release: &Release) {
    for f in &r.findings {
        println!("{}: {}", f.place(file), f.what);
        println!("  fix: {}", f.fix);
    }
    let rel = format!("Slurm {} ({})", facts::release_words(release.number), release.from);
    if r.findings.is_empty() {
        println!("{file}: no trap found, checked for {rel}");
    } else {
        let mut traps: Vec<String> =
            r.findings.iter().filter_map(|f| f.trap.number()).map(|n| n.to_string()).collect();
        traps.dedup();
        let refused = r.findings.iter().any(|f| f.trap == Trap::Refused);
        let mut kinds = if traps.is_empty() { String::new() } else { format!("trap {}", traps.join(", ")) };
        if refused {
            kinds = if kinds.is_empty() {
                "sbatch refuses it".into()
            } else {
                format!("{kinds}; sbatch refuses it")
            };
        }
        println!("{file}: {} finding(s) ({kinds}), checked for {rel}", r.findings.len());
    }
    // One line per reason, with the traps it kept from being checked.
    let mut grouped: Vec<(&str, Vec<String>)> = Vec::new();
    for n in &r.notes {
        let t = n.trap.number().map_or_else(|| n.trap.id().to_owned(), |x| x.to_string());
        match grouped.iter_mut().find(|(text, _)| *text == n.text) {
            Some((_, traps)) => traps.push(t),
            None => grouped.push((&n.text, vec![t])),
        }
    }
    for (text, traps) in grouped {
        let which = if traps.len() == 1 { "trap" } else { "traps" };
        println!("  not checked ({which} {}): {text}", traps.join(", "));
    }
}

/// `spank-gpu lint ...`.
///
/// # Errors
/// A usage error or an unreadable script, in one line (exit status 2).
pub fn lint(a: LintArgs) -> Result<Outcome, Failure> {
    let args = parse_args(a).map_err(Failure::Usage)?;
    let from_stdin = args.script == "-";
    let file = if from_stdin { STDIN_NAME.to_owned() } else { args.script.clone() };
    let fail = |e: String| {
        if args.json {
            println!("{}", json!({"schema": SCHEMA, "file": file, "error": e}));
        }
        e
    };
    let bytes = match (&args.wrap, file.as_str()) {
        // As sbatch builds it (`_script_wrap`, src/sbatch/sbatch.c).
        (Some(cmd), "--wrap") => {
            format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cmd}\n").into_bytes()
        }
        _ => read_script(&args.script).map_err(|e| Failure::Script(fail(e)))?,
    };
    let script = script::read(&bytes).map_err(|e| Failure::Script(fail(format!("{file}: {e}"))))?;
    let (release, skip) = release(&args);
    let words = crate::plugstack_words().unwrap_or_default();
    let site = PluginConfig::parse(&words, false).unwrap_or_default();
    let mut input = Input {
        // sbatch names a job read from its standard input "sbatch" (sbatch(1), --job-name).
        file: if from_stdin { "sbatch".to_owned() } else { file.clone() },
        args: args.sbatch_args.clone(),
        env: std::env::vars().collect::<BTreeMap<_, _>>(),
        cwd: std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        user: String::new(),
        release: release.number,
        plugins: our_options(),
        site_auto_rdzv: site.auto_rdzv,
    };
    let ids = outdirs::ids();
    input.user = outdirs::user_name(&input.env, &ids);
    // An option sbatch does not know may be a site plugin's: ask sbatch once.
    let unknown_option =
        lint::Job::new(&script, &input).refused.iter().any(|r| r.message.contains("unrecognized option"));
    if skip.is_none() && unknown_option {
        input.plugins.extend(plugin_options());
    }
    let mut cluster = None;
    let report = lint::lint(&script, &input, |needs| {
        let c = ask(needs, skip.as_deref());
        let dirs = needs.dirs.iter().map(|d| (d.clone(), outdirs::probe(d))).collect();
        cluster = Some(c.clone());
        Facts { release: release.clone(), cluster: c, dirs }
    });
    let cluster = cluster.unwrap_or_else(|| Cluster::unknown("not asked"));
    if args.json {
        print_json(&file, &report, &release, &cluster);
    } else {
        print_text(&file, &report, &release);
    }
    Ok(if report.findings.is_empty() { Outcome::Clean } else { Outcome::Findings })
}
