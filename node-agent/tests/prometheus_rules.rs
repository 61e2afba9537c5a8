//! The Prometheus rules the package ships
//! (`packaging/prometheus/gpu-node-agent.rules.yml`), tested with Prometheus's
//! own `promtool` (the `prometheus` package) on series the agent itself writes.
//!
//! Each scenario runs real agent passes in-process (the agent library against
//! the stand-in `scontrol` of `common` and GPUs a test sets: healthy, an Xid 79
//! drain, a reboot request, the reboot cap, the fleet guard, NVML missing or
//! hung, Slurm not answering) and renders their metrics with the agent's own
//! writer; those lines become a `promtool test rules` file's `input_series`
//! (with the `instance` and `job` labels a scrape adds, and node_exporter's
//! `node_textfile_mtime_seconds` for the file), held constant over the test's
//! time, timestamps moved to its start. What each scenario must fire (and
//! that every other alert stays quiet) is written here; the expected
//! annotations are the rule file's own templates, filled in by a small
//! renderer that knows only `{{ $labels.NAME }}` and
//! `{{ $value | humanizeDuration }}`, so promtool checks that Prometheus
//! renders them alike (a label an alert does not have would not match).
//!
//! The generated file is kept in `$CARGO_TARGET_TMPDIR/prometheus-rules/` for
//! running promtool by hand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpu_node_agent::agent::{Agent, Report};
use gpu_node_agent::config::Config;
use gpu_node_agent::policy::health::{Hang, Remap, XidEvent, XidSource};
use gpu_node_agent::reports::metrics::{self, METRICS};
use gpu_node_agent::slurm::release::{self, Found, Listed, ReleaseCheck};
use gpu_node_agent::sources::nvml::ProbeError;
use slurm_formats::release::Version;

use common::{FakeGpus, H100, World, healthy};
use md_tables::{Doc, Named, assert_same, code_spans};

/// The shipped rules.
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/prometheus/gpu-node-agent.rules.yml");
/// The scrape and evaluation interval of the tests, in seconds.
const STEP: u64 = 60;
/// The agent's file as node_exporter 1.5 (Debian 12) names it in
/// `node_textfile_mtime_seconds{file}`: its full path (older releases: the
/// file name alone; the rule matches both).
const TEXTFILE: &str = "/var/lib/prometheus/node-exporter/gpu_node_agent.prom";
/// The metrics of node_exporter's the rules use (the lab's e2e case
/// `prometheus_alerts_fire_on_a_real_drain` finds them in a real node_exporter's output).
const NODE_EXPORTER_METRICS: &[&str] = &["node_textfile_mtime_seconds"];
/// The plugin's path on the plugstack line.
const PLUGIN: &str = "/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gpu.so";

// ----- the rule file ---------------------------------------------------------------

/// One rule as the file writes it.
#[derive(Debug, Default)]
struct Rule {
    name: String,
    record: bool,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// A YAML scalar as the rule file writes them: plain, `'...'` (with `''`),
/// or a `>-` block (its lines folded with spaces). `rest` is what follows.
fn scalar(value: &str, rest: &mut std::iter::Peekable<std::slice::Iter<'_, &str>>, indent: usize) -> String {
    if value == ">-" {
        let mut parts = Vec::new();
        while let Some(l) = rest.peek() {
            let t = l.trim_start();
            if t.is_empty() || l.len() - t.len() <= indent {
                break;
            }
            parts.push(t.trim_end());
            rest.next();
        }
        assert!(!parts.is_empty(), "an empty >- block in {RULES}");
        return parts.join(" ");
    }
    if let Some(q) = value.strip_prefix('\'') {
        let inner = q.strip_suffix('\'').unwrap_or_else(|| panic!("{RULES}: unclosed '...': {value}"));
        return inner.replace("''", "'");
    }
    assert!(
        !value.starts_with(['"', '|', '>', '{', '[']),
        "{RULES}: write {value} plain, as '...' or as a >- block (the test reads only those)"
    );
    value.to_owned()
}

/// The rules of the file, in its order.
fn rules() -> Vec<Rule> {
    let text = fs::read_to_string(RULES).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut it = lines.iter().peekable();
    let mut out: Vec<Rule> = Vec::new();
    let mut current = false;
    let mut section = String::new();
    while let Some(line) = it.next() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some(n) = t.strip_prefix("- alert: ") {
            out.push(Rule { name: n.to_owned(), ..Rule::default() });
            (current, section) = (true, String::new());
            continue;
        }
        if let Some(n) = t.strip_prefix("- record: ") {
            out.push(Rule { name: n.to_owned(), record: true, ..Rule::default() });
            (current, section) = (true, String::new());
            continue;
        }
        if t.starts_with("- ") || t == "groups:" || t == "rules:" {
            current = false;
            continue;
        }
        let (Some(rule), true) = (out.last_mut(), current) else { continue };
        let (key, value) = t.split_once(':').unwrap_or_else(|| panic!("{RULES}: no key in {line}"));
        let value = value.trim();
        match key {
            "labels" | "annotations" if value.is_empty() => section = key.to_owned(),
            "expr" => {
                rule.expr = scalar(value, &mut it, indent);
                section.clear();
            }
            "for" => section.clear(),
            _ if section == "labels" => {
                rule.labels.insert(key.to_owned(), scalar(value, &mut it, indent));
            }
            _ if section == "annotations" => {
                rule.annotations.insert(key.to_owned(), scalar(value, &mut it, indent));
            }
            _ => panic!("{RULES}: unexpected key {key} in {}", rule.name),
        }
    }
    assert!(out.len() >= 10, "{RULES}: read only {} rules", out.len());
    out
}

/// The metric names an expression names, outside its strings, and the
/// label names in each `metric{...}` selector.
fn names_in(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '{' {
            // A selector's label names: `name=`, `name!=`, `name=~`.
            let mut j = i + 1;
            let mut labels = Vec::new();
            while j < chars.len() && chars[j] != '}' {
                let start = j;
                while j < chars.len() && word(chars[j]) {
                    j += 1;
                }
                labels.push(chars[start..j].iter().collect::<String>());
                while j < chars.len() && chars[j] != '"' {
                    j += 1;
                }
                j += 1;
                while j < chars.len() && chars[j] != '"' {
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
                j += 1;
                while j < chars.len() && (chars[j] == ',' || chars[j] == ' ') {
                    j += 1;
                }
            }
            if let Some(last) = out.last_mut() {
                last.1 = labels;
            }
            i = j + 1;
        } else if word(c) && !c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && word(chars[i]) {
                i += 1;
            }
            let w: String = chars[start..i].iter().collect();
            if w.starts_with("gpu_node_agent_") || w.starts_with("node_") || w.contains(':') {
                out.push((w, Vec::new()));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Every metric a rule names is one the agent writes (`METRICS`, which a unit
/// test holds to the file it writes), with labels it has; node_exporter's are
/// the ones listed; a recorded name is recorded in the file.
#[test]
fn every_metric_a_rule_names_is_one_the_agent_writes() {
    let rules = rules();
    let recorded: Vec<&str> = rules.iter().filter(|r| r.record).map(|r| r.name.as_str()).collect();
    let mut problems = Vec::new();
    let mut used = 0;
    for r in &rules {
        let names = names_in(&r.expr);
        assert!(!names.is_empty(), "{}: no metric in {}", r.name, r.expr);
        for (name, labels) in names {
            used += 1;
            if let Some(m) = METRICS.iter().find(|m| m.name == name) {
                for l in labels.iter().filter(|l| *l != "node" && !m.labels.contains(&l.as_str())) {
                    problems
                        .push(format!("{}: {name} has no label {l} (it has node, {:?})", r.name, m.labels));
                }
            } else if !NODE_EXPORTER_METRICS.contains(&name.as_str()) && !recorded.contains(&name.as_str()) {
                problems
                    .push(format!("{}: {name} is not a metric the agent writes (metrics::METRICS)", r.name));
            }
        }
    }
    assert!(problems.is_empty(), "{RULES}:\n{}", problems.join("\n"));
    assert!(used >= rules.len());
}

/// docs/admin.md's table of the shipped alerts names each alert of the file,
/// and only those.
#[test]
fn admin_md_lists_every_alert() {
    let doc = Doc::read("docs/admin.md");
    let rows = doc.table("### Alerts", &["alert", "fires when", "who acts, and how"]);
    let named: Vec<Named> =
        rows.iter().map(|r| Named { name: code_spans(&r.cells[0]).concat(), line: r.line }).collect();
    let rules = rules();
    let alerts: Vec<&str> = rules.iter().filter(|r| !r.record).map(|r| r.name.as_str()).collect();
    assert_same("docs/admin.md, the table under `### Alerts`", &named, RULES, &alerts);
}

// ----- series from the agent --------------------------------------------------------

/// One series of a scenario.
#[derive(Clone, Debug)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
    /// The value over the test: `first` at time 0, `step` more per sample.
    first: f64,
    step: f64,
}

impl Series {
    fn label(&self, k: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    fn selector(&self) -> String {
        let l: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        format!("{}{{{}}}", self.name, l.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A label list of the text format (`a="x",b="y"`), unescaped.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((k, after)) = rest.split_once("=\"") {
        let mut v = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => v.push('\n'),
                    Some((_, c)) => v.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => v.push(c),
            }
        }
        out.push((k.trim_start_matches(',').to_owned(), v));
        rest = &after[end..];
    }
    out
}

/// One node's file, as the agent wrote it after a pass, as series: each value
/// held for the test; timestamps moved so that the pass is at time 0, the
/// last pass's advancing with the scrapes. With `fresh`, node_exporter's
/// mtime of the file advances too (the agent keeps writing it); else it
/// stays at 0.
fn series_of(node: &str, text: &str, fresh: bool) -> Vec<Series> {
    let instance = format!("{node}:9100");
    let mut rows: Vec<Series> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = head.split_once('{').unwrap();
            let mut labels = parse_labels(labels.strip_suffix('}').unwrap());
            labels.push(("instance".into(), instance.clone()));
            labels.push(("job".into(), "node".into()));
            Series { name: name.to_owned(), labels, first: value.parse().unwrap(), step: 0.0 }
        })
        .collect();
    let pass = rows.iter().find(|s| s.name == "gpu_node_agent_last_pass_timestamp_seconds").unwrap().first;
    for s in &mut rows {
        if s.name.ends_with("_timestamp_seconds") {
            s.first = (s.first - pass).round() + 0.0;
        }
        if s.name == "gpu_node_agent_last_pass_timestamp_seconds" {
            s.step = STEP as f64;
        }
    }
    rows.push(Series {
        name: "node_textfile_mtime_seconds".into(),
        labels: vec![
            ("file".into(), TEXTFILE.into()),
            ("instance".into(), instance),
            ("job".into(), "node".into()),
        ],
        first: 0.0,
        step: if fresh { STEP as f64 } else { 0.0 },
    });
    rows
}

/// The plugin check the agent makes, with the plugin built for `built`
/// (a Slurm version number, or why it is unreadable) and slurmd 22.05.8.
fn plugin(built: Result<u32, String>) -> ReleaseCheck {
    ReleaseCheck {
        plugstack: "/etc/slurm/plugstack.conf".into(),
        plugins: vec![Found {
            listed: Listed {
                file: "/etc/slurm/plugstack.conf.d/spank-gpu.conf".into(),
                line: 1,
                required: false,
                path: PLUGIN.into(),
                seq: 0,
                args: vec![],
            },
            file: Some(PLUGIN.into()),
            version: built,
        }],
        problems: vec![],
        slurmd: Ok(Version::from_number(SLURM_22_05)),
        pyxis: vec![],
    }
}

const SLURM_22_05: u32 = (22 << 16) | (5 << 8) | 8;
const SLURM_24_11: u32 = (24 << 16) | (11 << 8) | 5;

/// One node of a scenario: the agent's file after its last pass.
struct Node {
    name: &'static str,
    text: String,
    fresh: bool,
}

/// The file the daemon writes: [`metrics::render_with`] (with the GPU
/// table's state), then the plugin's release.
fn file_of(name: &str, a: &Agent, r: &Report, table_ok: bool, plugin: &ReleaseCheck) -> String {
    metrics::render_with(name, r, &a.state, Some(table_ok)) + &release::metrics_text(name, plugin)
}

fn xid79(gpu: u32) -> XidEvent {
    XidEvent { xid: 79, gpu: Some(gpu), bus: None, source: XidSource::Nvml, kmsg_us: None, nvlink: None }
}

fn remap_pending() -> Vec<gpu_node_agent::policy::health::GpuSample> {
    let mut s = healthy(8);
    s[5].remap = Some(Remap { uncorrectable: 1, pending: true, ..Remap::default() });
    s
}

/// A healthy node's file (`table_ok`, the plugin check as given).
fn healthy_node(name: &'static str, table_ok: bool, plugin: &ReleaseCheck, fresh: bool) -> Node {
    let w = World::new(&format!("prom-{name}"), &[(name, H100)]);
    let mut a = Agent::with_gpus(w.cfg(name), Box::new(FakeGpus::healthy(8)));
    let r = a.pass(true);
    Node { name, text: file_of(name, &a, &r, table_ok, plugin), fresh }
}

/// A node drained for an Xid 79 on GPU 3.
fn drained_node(name: &'static str) -> Node {
    let w = World::new(&format!("prom-{name}"), &[(name, H100)]);
    let mut a = Agent::with_gpus(w.cfg(name), Box::new(FakeGpus::healthy(8)));
    a.record_xid(xid79(3));
    let r = a.pass(true);
    assert!(w.node(name).0.contains("DRAIN"), "{:?}", r.actions);
    Node { name, text: file_of(name, &a, &r, true, &plugin(Ok(SLURM_22_05))), fresh: true }
}

/// A node whose agent asked Slurm for a reboot (a pending row remap).
fn rebooting_node(name: &'static str) -> Node {
    let w = World::new(&format!("prom-{name}"), &[(name, H100)]);
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg(name), Box::new(gpus));
    let r = a.pass(true);
    assert_eq!(w.node(name).0, "IDLE+DRAIN+REBOOT_REQUESTED");
    Node { name, text: file_of(name, &a, &r, true, &plugin(Ok(SLURM_22_05))), fresh: true }
}

/// A node whose pending row remap survived two reboots: drained for a person.
fn capped_node(name: &'static str) -> Node {
    let w = World::new(&format!("prom-{name}"), &[(name, H100)]);
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg(name), Box::new(gpus));
    let mut last = None;
    for boot in 1..=3 {
        fs::write(w.dir.join("boot_id"), format!("b{boot}\n")).unwrap();
        w.set_node(name, "IDLE", "");
        last = Some(a.pass(true));
    }
    let r = last.unwrap();
    assert!(w.node(name).1.ends_with("still there after 2 reboots"), "{:?}", w.node(name));
    assert!(r.reboot_cap);
    Node { name, text: file_of(name, &a, &r, true, &plugin(Ok(SLURM_22_05))), fresh: true }
}

/// A node with an Xid 79 whose drain the fleet guard holds back: two GPU
/// nodes, the other drained by its agent, at most half may be.
fn suppressed_node(name: &'static str) -> Node {
    let w = World::new(&format!("prom-{name}"), &[(name, H100), ("other", H100)]);
    w.set_node("other", "IDLE+DRAIN", "gpu: xid79 gpu1 GPU has fallen off the bus (nvml)");
    let cfg = Config { max_drained_fraction: 0.5, drain_jitter: Duration::ZERO, ..w.cfg(name) };
    let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
    a.record_xid(xid79(3));
    let r = a.pass(true);
    assert_eq!(w.node(name).0, "IDLE", "{:?}", r.actions);
    assert!(a.state.suppressed.is_some());
    Node { name, text: file_of(name, &a, &r, true, &plugin(Ok(SLURM_22_05))), fresh: true }
}

// ----- what must fire -----------------------------------------------------------------

/// How an alert's `$value` comes from its series.
#[derive(Clone, Copy, Debug)]
enum Value {
    /// The series' value.
    Sample,
    /// The evaluation time minus the series' value (`time() - ...`).
    Age,
}

/// An alert that must fire: on the series of `metric` of `node` whose labels
/// include `filter`.
#[derive(Clone, Debug)]
struct Expect {
    alert: &'static str,
    node: &'static str,
    metric: &'static str,
    filter: Vec<(&'static str, &'static str)>,
    value: Value,
}

fn expect(alert: &'static str, node: &'static str, metric: &'static str, value: Value) -> Expect {
    Expect { alert, node, metric, filter: vec![], value }
}

impl Expect {
    fn with(mut self, k: &'static str, v: &'static str) -> Expect {
        self.filter.push((k, v));
        self
    }
}

/// One promtool test group.
struct Scenario {
    name: &'static str,
    nodes: Vec<Node>,
    /// At each time (seconds): the alerts that fire; every other alert of the file must not.
    evals: Vec<(u64, Vec<Expect>)>,
    /// Recording rules: at a time, the expression and its samples (labels, value).
    records: Vec<Record>,
}

/// A recording rule's samples at a time: (time, expression, [(labels, value)]).
type Record = (u64, &'static str, Vec<(&'static str, f64)>);

/// Prometheus's `humanizeDuration` for whole seconds (template.go).
fn humanize_duration(v: f64) -> String {
    assert!(v >= 1.0 && v.fract() == 0.0, "humanizeDuration of {v}: only whole seconds here");
    #[allow(clippy::cast_possible_truncation)]
    let d = v as i64;
    let (s, m, h, days) = (d % 60, d / 60 % 60, d / 3600 % 24, d / 86400);
    if days != 0 {
        format!("{days}d {h}h {m}m {s}s")
    } else if h != 0 {
        format!("{h}h {m}m {s}s")
    } else if m != 0 {
        format!("{m}m {s}s")
    } else {
        format!("{d}s")
    }
}

/// An annotation template filled in as Prometheus does, for the two forms
/// the rule file uses.
fn render(template: &str, labels: &BTreeMap<String, String>, value: f64, alert: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some((before, after)) = rest.split_once("{{") {
        out.push_str(before);
        let (inner, next) = after.split_once("}}").unwrap_or_else(|| panic!("{alert}: unclosed {{{{"));
        let inner = inner.trim();
        if let Some(l) = inner.strip_prefix("$labels.") {
            let v = labels
                .get(l)
                .unwrap_or_else(|| panic!("{alert}: its template names $labels.{l}, it has {labels:?}"));
            out.push_str(v);
        } else if inner == "$value | humanizeDuration" {
            out.push_str(&humanize_duration(value));
        } else {
            panic!(
                "{alert}: the test renders only {{{{ $labels.NAME }}}} and {{{{ $value | humanizeDuration }}}}, not {{{{ {inner} }}}}"
            );
        }
        rest = next;
    }
    out.push_str(rest);
    out
}

fn yaml(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

/// The promtool test file of the scenarios.
fn test_file(rules: &[Rule], scenarios: &[Scenario]) -> String {
    let mut y = String::new();
    let _ = writeln!(y, "# Generated by node-agent/tests/prometheus_rules.rs: do not edit.");
    let _ = writeln!(y, "rule_files:\n  - {}\nevaluation_interval: {STEP}s\ntests:", yaml(RULES));
    for sc in scenarios {
        let series: Vec<(&str, Series)> = sc
            .nodes
            .iter()
            .flat_map(|n| series_of(n.name, &n.text, n.fresh).into_iter().map(|s| (n.name, s)))
            .collect();
        let end = sc.evals.iter().map(|e| e.0).chain(sc.records.iter().map(|r| r.0)).max().unwrap_or(0);
        let samples = end / STEP + 2;
        let _ = writeln!(y, "  - name: {}\n    interval: {STEP}s\n    input_series:", yaml(sc.name));
        for (_, s) in &series {
            let _ = writeln!(
                y,
                "      - series: {}\n        values: '{}+{}x{samples}'",
                yaml(&s.selector()),
                s.first,
                s.step
            );
        }
        let _ = writeln!(y, "    alert_rule_test:");
        for (at, want) in &sc.evals {
            for rule in rules.iter().filter(|r| !r.record) {
                let _ = writeln!(y, "      - eval_time: {at}s\n        alertname: {}", rule.name);
                let mine: Vec<&Expect> = want.iter().filter(|e| e.alert == rule.name).collect();
                if mine.is_empty() {
                    let _ = writeln!(y, "        exp_alerts: []");
                    continue;
                }
                let _ = writeln!(y, "        exp_alerts:");
                for e in mine {
                    let found: Vec<&Series> = series
                        .iter()
                        .filter(|(n, s)| {
                            *n == e.node
                                && s.name == e.metric
                                && e.filter.iter().all(|(k, v)| s.label(k) == Some(v))
                        })
                        .map(|(_, s)| s)
                        .collect();
                    assert_eq!(found.len(), 1, "{}: {e:?} matches {found:?}", sc.name);
                    let s = found[0];
                    #[allow(clippy::cast_precision_loss)]
                    let now = s.first + s.step * (*at / STEP) as f64;
                    let value = match e.value {
                        Value::Sample => now,
                        #[allow(clippy::cast_precision_loss)]
                        Value::Age => *at as f64 - now,
                    };
                    // Prometheus drops a label whose value is empty.
                    let mut labels: BTreeMap<String, String> =
                        s.labels.iter().filter(|(_, v)| !v.is_empty()).cloned().collect();
                    labels.extend(rule.labels.clone());
                    let _ = writeln!(y, "          - exp_labels:");
                    for (k, v) in &labels {
                        let _ = writeln!(y, "              {k}: {}", yaml(v));
                    }
                    let _ = writeln!(y, "            exp_annotations:");
                    for (k, t) in &rule.annotations {
                        let _ = writeln!(
                            y,
                            "              {k}: {}",
                            yaml(&render(t, &labels, value, &rule.name))
                        );
                    }
                }
            }
        }
        if !sc.records.is_empty() {
            let _ = writeln!(y, "    promql_expr_test:");
            for (at, expr, samples) in &sc.records {
                let _ = writeln!(
                    y,
                    "      - expr: {}\n        eval_time: {at}s\n        exp_samples:",
                    yaml(expr)
                );
                for (labels, value) in samples {
                    let _ = writeln!(y, "          - labels: {}\n            value: {value}", yaml(labels));
                }
            }
        }
    }
    y
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().unwrap_or_else(|e| {
        panic!("promtool {args:?}: {e}: install Debian's prometheus package (apt-get install prometheus), as tests/run does")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {}: {}\n{text}", args.join(" "), out.status);
    text
}

const MIN: u64 = 60;
const DAY: u64 = 86_400;

/// `promtool check rules` on the shipped file, and `promtool test rules` on
/// the scenarios: each alert fires where it must, with its labels and its
/// annotations as written, and every other stays quiet.
#[test]
fn promtool_checks_the_rules_and_each_alert_fires_on_the_agents_own_series() {
    let said = promtool(&["check", "rules", RULES]);
    println!("{}", said.trim());
    let rules = rules();
    let ok = plugin(Ok(SLURM_22_05));
    use Value::{Age, Sample};
    let up = "gpu_node_agent_up";
    let scenarios = vec![
        Scenario {
            name: "a healthy node fires nothing",
            nodes: vec![healthy_node("node1", true, &ok, true)],
            evals: vec![(40 * MIN, vec![]), (DAY + MIN, vec![])],
            records: vec![],
        },
        Scenario {
            name: "an Xid 79 drain: after 5 minutes, and after a day",
            nodes: vec![drained_node("node2")],
            evals: vec![
                (4 * MIN, vec![]),
                (
                    40 * MIN,
                    vec![expect(
                        "GpuNodeDrainedByAgent",
                        "node2",
                        "gpu_node_agent_drain_timestamp_seconds",
                        Age,
                    )],
                ),
                (
                    DAY + MIN,
                    vec![
                        expect(
                            "GpuNodeDrainedByAgent",
                            "node2",
                            "gpu_node_agent_drain_timestamp_seconds",
                            Age,
                        ),
                        expect(
                            "GpuNodeOutOfServiceForADay",
                            "node2",
                            "gpu_node_agent_drain_timestamp_seconds",
                            Age,
                        ),
                    ],
                ),
            ],
            records: vec![],
        },
        Scenario {
            name: "a reboot the agent asked for is no alert, unless it takes a day",
            nodes: vec![rebooting_node("node3")],
            evals: vec![
                (40 * MIN, vec![]),
                (
                    DAY + MIN,
                    vec![
                        expect(
                            "GpuNodeOutOfServiceForADay",
                            "node3",
                            "gpu_node_agent_drain_timestamp_seconds",
                            Age,
                        )
                        .with("action", "reboot"),
                    ],
                ),
            ],
            records: vec![],
        },
        Scenario {
            name: "the reboot cap",
            nodes: vec![capped_node("node4")],
            evals: vec![(
                40 * MIN,
                vec![
                    expect("GpuNodeDrainedByAgent", "node4", "gpu_node_agent_drain_timestamp_seconds", Age),
                    expect("GpuNodeRebootCapReached", "node4", "gpu_node_agent_reboot_cap_reached", Sample),
                ],
            )],
            records: vec![],
        },
        Scenario {
            name: "the fleet guard holds a drain back",
            nodes: vec![suppressed_node("node5")],
            evals: vec![(
                40 * MIN,
                vec![expect("GpuNodeDrainSuppressed", "node5", "gpu_node_agent_drain_suppressed", Sample)],
            )],
            records: vec![],
        },
        Scenario {
            name: "NVML missing: the agent cannot check",
            nodes: vec![{
                let w = World::new("prom-node6", &[("node6", H100)]);
                let gpus = FakeGpus::healthy(8);
                gpus.set(Err(ProbeError::Unavailable("libnvidia-ml.so.1: cannot open".into())));
                let mut a = Agent::with_gpus(w.cfg("node6"), Box::new(gpus));
                let r = a.pass(true);
                Node { name: "node6", text: file_of("node6", &a, &r, true, &ok), fresh: true }
            }],
            evals: vec![
                (2 * MIN, vec![]),
                (40 * MIN, vec![expect("GpuNodeAgentUnhealthy", "node6", up, Sample)]),
            ],
            records: vec![],
        },
        Scenario {
            name: "Slurm does not answer: the drain waits",
            nodes: vec![{
                let w = World::new("prom-node7", &[("node7", H100)]);
                let mut a = Agent::with_gpus(w.cfg("node7"), Box::new(FakeGpus::healthy(8)));
                a.pass(true);
                w.mode("fail");
                a.record_xid(xid79(3));
                let r = a.pass(true);
                assert!(a.state.pending.is_some(), "{:?}", r.actions);
                Node { name: "node7", text: file_of("node7", &a, &r, true, &ok), fresh: true }
            }],
            evals: vec![(
                40 * MIN,
                vec![
                    expect("GpuNodeAgentUnhealthy", "node7", up, Sample),
                    expect("GpuNodeDrainPending", "node7", "gpu_node_agent_drain_pending", Sample),
                ],
            )],
            records: vec![],
        },
        Scenario {
            name: "GPU 2's NVML calls hang",
            nodes: vec![{
                let w = World::new("prom-node8", &[("node8", H100)]);
                let gpus = FakeGpus::healthy(8);
                let mut s = healthy(8);
                s[2].hang = Some(Hang { secs: 600, polls: 1 });
                gpus.set(Ok(s));
                let mut a = Agent::with_gpus(w.cfg("node8"), Box::new(gpus));
                let r = a.pass(true);
                Node { name: "node8", text: file_of("node8", &a, &r, true, &ok), fresh: true }
            }],
            evals: vec![(
                40 * MIN,
                vec![
                    expect("GpuNvmlHang", "node8", "gpu_node_agent_gpu_nvml_hang_seconds", Sample)
                        .with("gpu", "2"),
                    expect("GpuNodeAgentUnhealthy", "node8", up, Sample),
                ],
            )],
            records: vec![],
        },
        Scenario {
            name: "no GPU table in Slurm's order",
            nodes: vec![healthy_node("node9", false, &ok, true)],
            evals: vec![(
                40 * MIN,
                vec![expect("GpuNodeGpuTableNotWritten", "node9", "gpu_node_agent_gpu_table_ok", Sample)],
            )],
            records: vec![],
        },
        Scenario {
            name: "a plugin built for Slurm 24.11 on a 22.05 node",
            nodes: vec![healthy_node("node10", true, &plugin(Ok(SLURM_24_11)), true)],
            evals: vec![(
                40 * MIN,
                vec![expect("SpankGpuPluginOtherRelease", "node10", "gpu_node_agent_plugin_release", Sample)],
            )],
            records: vec![],
        },
        Scenario {
            name: "an unreadable plugin",
            nodes: vec![healthy_node("node11", true, &plugin(Err("Permission denied".into())), true)],
            evals: vec![(
                40 * MIN,
                vec![expect("SpankGpuPluginCannotTell", "node11", "gpu_node_agent_plugin_release", Sample)],
            )],
            records: vec![],
        },
        Scenario {
            name: "the agent stopped writing its file",
            nodes: vec![healthy_node("node12", true, &ok, false)],
            evals: vec![
                (4 * MIN, vec![]),
                (
                    40 * MIN,
                    vec![expect("GpuNodeAgentMetricsStale", "node12", "node_textfile_mtime_seconds", Age)],
                ),
            ],
            records: vec![],
        },
        Scenario {
            name: "the fleet: drained GPU nodes counted",
            nodes: vec![
                healthy_node("gpu01", true, &ok, true),
                drained_node("gpu02"),
                rebooting_node("gpu03"),
                suppressed_node("gpu04"),
            ],
            evals: vec![],
            records: vec![
                (
                    10 * MIN,
                    "job:gpu_node_agent_drained:sum",
                    vec![("job:gpu_node_agent_drained:sum{job=\"node\"}", 2.0)],
                ),
                (
                    10 * MIN,
                    "job:gpu_node_agent_drained:ratio",
                    vec![("job:gpu_node_agent_drained:ratio{job=\"node\"}", 0.5)],
                ),
            ],
        },
    ];
    // Each alert and each record of the file is tested somewhere.
    for r in &rules {
        let tested = scenarios.iter().any(|s| {
            s.evals.iter().any(|(_, e)| e.iter().any(|e| e.alert == r.name))
                || s.records.iter().any(|(_, expr, _)| *expr == r.name)
        });
        assert!(tested, "{}: no scenario fires or evaluates it", r.name);
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prometheus-rules");
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gpu-node-agent.test.yml");
    fs::write(&file, test_file(&rules, &scenarios)).unwrap();
    let said = promtool(&["test", "rules", path_str(&file)]);
    println!("{} ({})", said.trim(), file.display());
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}
