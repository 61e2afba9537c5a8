//! Where a doc repeats a table that the agent defines, the two stay equal:
//! the configuration keys (docs/admin.md's tables and packaging/config.toml's
//! commented defaults) against the keys the configuration reader takes (its
//! own unknown-key message lists them), and the metrics (docs/admin.md's
//! table and README's list, with their labels and types) against
//! `metrics::METRICS`, which a unit test holds to what the writer writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_node_agent::config::Config;
use gpu_node_agent::reports::metrics::METRICS;
use md_tables::{Doc, Named, assert_same, code_spans};

/// The keys the configuration reader takes at the top level and in
/// `[policy]`, as its own unknown-key message lists them (serde's, from the
/// file's structs: the reader's real list).
fn reader_keys(section: &str) -> Vec<String> {
    let text = format!("{section}zz_not_a_key = 1\n");
    let e = Config::parse(&text).unwrap_err().to_string();
    let list = e.split("expected one of ").nth(1).unwrap_or_else(|| panic!("no key list in {e:?}"));
    let keys: Vec<String> = code_spans(list.lines().next().unwrap_or(""));
    assert!(keys.len() >= 10, "{e}: the reader of its list is broken");
    keys
}

fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

#[test]
fn admin_md_lists_every_configuration_key() {
    let doc = Doc::read("docs/admin.md");
    let heading = "## The agent's configuration";
    let first_cell = |header: &[&str]| -> Vec<Named> {
        doc.table(heading, header)
            .into_iter()
            .map(|r| Named { name: code_spans(&r.cells[0]).concat(), line: r.line })
            .collect()
    };
    // The sections are keys too: `policy` at the top, `xid` in it.
    let (policy_line, _) = doc.paragraph("`[policy]` says what to do");
    let (xid_line, _) = doc.paragraph("`[policy.xid]` overrides");
    let mut top = first_cell(&["key", "default", "meaning"]);
    top.push(Named { name: "policy".to_owned(), line: policy_line });
    assert_same(
        &format!("docs/admin.md, the key table under `{heading}` (and `[policy]`)"),
        &top,
        "the configuration reader's top-level keys (its unknown-key message)",
        &strs(&reader_keys("")),
    );
    let mut policy = first_cell(&["key", "default", "fault"]);
    policy.push(Named { name: "xid".to_owned(), line: xid_line });
    assert_same(
        &format!("docs/admin.md, the `[policy]` table under `{heading}` (and `[policy.xid]`)"),
        &policy,
        "the configuration reader's [policy] keys (its unknown-key message)",
        &strs(&reader_keys("[policy]\n")),
    );
}

/// A configuration key as written (not an Xid's `"94"`, not prose).
fn is_key(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

/// packaging/config.toml's commented `# key = value` lines, by section
/// (`""`, `policy`, `policy.xid`), and the sections themselves as keys.
fn shipped_keys() -> (Vec<Named>, Vec<Named>) {
    let doc = Doc::read("packaging/config.toml");
    let (mut top, mut policy) = (Vec::new(), Vec::new());
    let mut section = "";
    for (i, line) in doc.lines.iter().enumerate() {
        let n = i + 1;
        match line.trim() {
            "[policy]" => {
                section = "policy";
                top.push(Named { name: "policy".to_owned(), line: n });
            }
            "[policy.xid]" => {
                section = "policy.xid";
                policy.push(Named { name: "xid".to_owned(), line: n });
            }
            l => {
                let Some((key, _)) = l.strip_prefix("# ").and_then(|l| l.split_once(" = ")) else { continue };
                if !is_key(key) {
                    continue;
                }
                let named = Named { name: key.to_owned(), line: n };
                match section {
                    "" => top.push(named),
                    "policy" => policy.push(named),
                    _ => {}
                }
            }
        }
    }
    (top, policy)
}

#[test]
fn the_shipped_config_lists_every_key_with_its_default() {
    let (top, policy) = shipped_keys();
    assert_same(
        "packaging/config.toml, the commented keys before [policy]",
        &top,
        "the configuration reader's top-level keys (its unknown-key message)",
        &strs(&reader_keys("")),
    );
    assert_same(
        "packaging/config.toml, the commented keys of [policy]",
        &policy,
        "the configuration reader's [policy] keys (its unknown-key message)",
        &strs(&reader_keys("[policy]\n")),
    );
    // "the values shown are the defaults, except where a line says e.g.": with
    // those lines uncommented, the file is the defaults.
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/config.toml")).unwrap();
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(kv) if !l.contains("# e.g.") && kv.split_once(" = ").is_some_and(|(k, _)| is_key(k)) => {
                format!("{kv}\n")
            }
            _ => format!("{l}\n"),
        })
        .collect();
    let cfg =
        Config::parse(&uncommented).unwrap_or_else(|e| panic!("packaging/config.toml uncommented: {e}"));
    assert_eq!(
        cfg,
        Config::default(),
        "packaging/config.toml's commented values (the e.g. lines aside) are not the defaults"
    );
}

/// A metric as the docs write it: `name{label,label}`, or `name`.
fn metric_of(span: &str) -> Option<String> {
    span.starts_with("gpu_node_agent_").then(|| span.to_owned())
}

/// The code's metrics as the docs write them.
fn code_metrics() -> Vec<String> {
    METRICS
        .iter()
        .map(|m| {
            if m.labels.is_empty() {
                m.name.to_owned()
            } else {
                format!("{}{{{}}}", m.name, m.labels.join(","))
            }
        })
        .collect()
}

#[test]
fn admin_md_lists_every_metric_with_its_labels_and_type() {
    let doc = Doc::read("docs/admin.md");
    let rows = doc.table("## Metrics", &["metric", "type", "meaning"]);
    let mut named = Vec::new();
    for r in &rows {
        for span in code_spans(&r.cells[0]) {
            let Some(m) = metric_of(&span) else { continue };
            let name = m.split('{').next().unwrap_or("");
            if let Some(code) = METRICS.iter().find(|c| c.name == name) {
                assert_eq!(r.cells[1], code.kind, "docs/admin.md:{}: the type of {name}", r.line);
            }
            named.push(Named { name: m, line: r.line });
        }
    }
    assert_same(
        "docs/admin.md, the table under `## Metrics` (metric{labels besides node})",
        &named,
        "gpu_node_agent::reports::metrics::METRICS",
        &strs(&code_metrics()),
    );
}

#[test]
fn readmes_metrics_list_names_every_metric_with_its_labels() {
    let doc = Doc::read("README.md");
    let (line, text) = doc.paragraph("**Metrics**");
    let list = &text[text.find("**Metrics**").unwrap_or(0)..];
    let named: Vec<Named> =
        code_spans(list).iter().filter_map(|s| metric_of(s)).map(|name| Named { name, line }).collect();
    assert_same(
        &format!("README.md:{line}, the list after **Metrics** (metric{{labels besides node}})"),
        &named,
        "gpu_node_agent::reports::metrics::METRICS",
        &strs(&code_metrics()),
    );
}
