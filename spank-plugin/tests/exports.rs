//! docs/architecture.md names the symbols the plugin exports and counts
//! them; both stay equal to `src/exports.rs`'s list, which the built library
//! is checked against (tests/plugin_version.rs, and the e2e case
//! `plugin_exports_only_its_symbols`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../src/exports.rs"]
mod exports;
#[path = "../../core/tests/markdown/mod.rs"]
mod markdown;

use markdown::{Doc, Named, assert_same, code_spans};

const NUMBERS: [&str; 13] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
];

/// A symbol's name as the docs write it (not `slurm_spank_*`, `cfg(...)`, `DEP_...`).
fn is_symbol(span: &str) -> bool {
    (span.starts_with("plugin_") || span.starts_with("slurm_spank_"))
        && span.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

fn since() -> String {
    let (major, minor) = exports::SINCE;
    format!("{major}.{minor:02}")
}

#[test]
fn architecture_md_names_every_exported_symbol() {
    let doc = Doc::read("docs/architecture.md");
    let start = doc
        .lines
        .iter()
        .position(|l| l.trim_start().starts_with("- the exported symbols:"))
        .expect("docs/architecture.md: no `- the exported symbols:` item (the doc guard reads it)");
    // The item and its continuation lines (indented deeper than its `- `).
    let indent = doc.lines[start].find('-').unwrap_or(0) + 2;
    let end = start
        + 1
        + doc.lines[start + 1..]
            .iter()
            .take_while(|l| {
                l.len() > indent && l[..indent].trim().is_empty() && !l[indent..].starts_with(' ')
            })
            .count();
    let text = doc.lines[start..end].join("\n");
    let later = format!("in builds for Slurm {} and later", since());
    let split = text.find(&later).unwrap_or_else(|| {
        panic!(
            "docs/architecture.md:{}: the item does not say `{later}` before the symbols only those have",
            start + 1
        )
    });
    let named = |part: &str| -> Vec<Named> {
        code_spans(part)
            .into_iter()
            .filter(|s| is_symbol(s))
            .map(|name| Named { name, line: start + 1 })
            .collect()
    };
    let at = format!("docs/architecture.md:{}-{end}, the exported symbols", start + 1);
    assert_same(&format!("{at} (every build)"), &named(&text[..split]), "exports::ALWAYS", exports::ALWAYS);
    assert_same(
        &format!("{at} ({later})"),
        &named(&text[split..]),
        "exports::FROM_25_05",
        exports::FROM_25_05,
    );
}

#[test]
fn architecture_md_counts_the_exported_symbols() {
    let doc = Doc::read("docs/architecture.md");
    let (line, text) = doc.paragraph("exports only the symbols listed above (");
    let text = text.replace('\n', " ");
    let counts = text.split("exports only the symbols listed above (").nth(1).unwrap_or("");
    let counts: Vec<&str> = counts.split([';', ')']).take(2).map(str::trim).collect();
    let (always, all) = (exports::ALWAYS.len(), exports::ALWAYS.len() + exports::FROM_25_05.len());
    let want = [NUMBERS[always].to_owned(), format!("{} for {}+", NUMBERS[all], since())];
    assert_eq!(
        counts,
        want,
        "docs/architecture.md:{line}: the count of exported symbols, vs src/exports.rs ({always} in every build, {all} for {}+)",
        since()
    );
}
