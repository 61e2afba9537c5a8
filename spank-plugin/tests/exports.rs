//! docs/architecture.md names the symbols the plugin exports and counts
//! them; both stay equal to `src/exports.rs`'s list, which the built library
//! is checked against (tests/plugin_version.rs, and the e2e case
//! `plugin_exports_only_its_symbols`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../src/exports.rs"]
mod exports;

use md_tables::{Doc, assert_same, exported_symbols};

const NUMBERS: [&str; 13] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
];

fn since() -> String {
    let (major, minor) = exports::SINCE;
    format!("{major}.{minor:02}")
}

#[test]
fn architecture_md_names_every_exported_symbol() {
    let doc = exported_symbols();
    let at = format!("docs/architecture.md:{}-{}, the exported symbols", doc.lines.0, doc.lines.1);
    assert_eq!(doc.since, since(), "{at}: `in builds for Slurm X.YY and later`, vs exports::SINCE");
    assert_same(&format!("{at} (every build)"), &doc.always, "exports::ALWAYS", exports::ALWAYS);
    let later = format!("{at} (in builds for Slurm {} and later)", doc.since);
    assert_same(&later, &doc.later, "exports::FROM_25_05", exports::FROM_25_05);
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
