//! The doc guards' reader of the docs: where a doc repeats a table the code
//! defines (option words, plugstack keys, the agent's keys, metrics, exported
//! symbols), its test reads the doc's table or list with this and compares it
//! with the code's: a dev-dependency of `task-plan`, `spank-gpu`,
//! `gpu-node-agent` and `slurm-lab` (whose e2e case checks the built plugin's
//! symbols against the doc's list, [`exported_symbols`]). Every path is from
//! the repository root.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_debug_implementations)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One doc file: its path from the repository root, and its lines.
pub struct Doc {
    pub path: String,
    pub lines: Vec<String>,
}

/// A name a doc gives, with the line it is on (1-based).
#[derive(Clone, Debug)]
pub struct Named {
    pub name: String,
    pub line: usize,
}

/// One row of a table: its line and its cells (the `|` between cells split off,
/// `\|` kept inside a cell as `|`).
#[derive(Clone, Debug)]
pub struct Row {
    pub line: usize,
    pub cells: Vec<String>,
}

impl Doc {
    /// Reads `path` (from the repository root).
    pub fn read(path: &str) -> Doc {
        let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
        let text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()));
        Doc { path: path.to_owned(), lines: text.lines().map(str::to_owned).collect() }
    }

    /// The line number (1-based) of the first line equal to `line` once trimmed.
    pub fn line_of(&self, line: &str) -> usize {
        self.lines
            .iter()
            .position(|l| l.trim() == line)
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("{}: no line `{line}` (the doc guard looks for it there)", self.path))
    }

    /// The lines of the section under the heading `heading` (a whole line, as
    /// `## Metrics`), up to the next heading of the same or a higher level:
    /// (line number, text).
    pub fn section(&self, heading: &str) -> Vec<(usize, &str)> {
        let start = self.line_of(heading);
        let level = heading.chars().take_while(|c| *c == '#').count();
        let mut out = Vec::new();
        let mut fenced = false;
        for (i, l) in self.lines.iter().enumerate().skip(start) {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            let hashes = l.chars().take_while(|c| *c == '#').count();
            if !fenced && hashes > 0 && hashes <= level && l[hashes..].starts_with(' ') {
                break;
            }
            out.push((i + 1, l.as_str()));
        }
        out
    }

    /// The rows of the table in the section `heading` whose header row is
    /// `header` (cell by cell); panics naming the doc when there is none.
    pub fn table(&self, heading: &str, header: &[&str]) -> Vec<Row> {
        let lines = self.section(heading);
        let at = lines.iter().position(|(_, l)| cells(l) == header).unwrap_or_else(|| {
            panic!(
                "{}: no table with header {header:?} under `{heading}` (the doc guard reads it)",
                self.path
            )
        });
        // The header, then the `| --- |` line, then the rows up to the first line that is not one.
        lines[at + 2..]
            .iter()
            .take_while(|(_, l)| l.trim_start().starts_with('|'))
            .map(|(n, l)| Row { line: *n, cells: cells(l) })
            .collect()
    }

    /// The paragraph (up to a blank line) that starts at the first line
    /// containing `start`, as one text, and the line it starts on.
    pub fn paragraph(&self, start: &str) -> (usize, String) {
        let i = self
            .lines
            .iter()
            .position(|l| l.contains(start))
            .unwrap_or_else(|| panic!("{}: no line with `{start}` (the doc guard reads it)", self.path));
        let text: Vec<&str> =
            self.lines[i..].iter().take_while(|l| !l.trim().is_empty()).map(String::as_str).collect();
        (i + 1, text.join("\n"))
    }
}

/// The cells of a table line; an empty list for a line that is not one.
pub fn cells(line: &str) -> Vec<String> {
    let line = line.trim();
    let Some(inner) = line.strip_prefix('|').and_then(|l| l.strip_suffix('|')) else { return Vec::new() };
    let mut out = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.iter().map(|c| c.trim().to_owned()).collect()
}

/// The text of each `code span` in `text`, in order.
pub fn code_spans(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Panics, saying where and what, unless the names a doc gives (each once)
/// are exactly the code's: `doc_where` says which table or list
/// (`docs/admin.md, the table under "## Metrics"`), `code_where` where the
/// code's list is (`gpu_node_agent::reports::metrics::METRICS`).
pub fn assert_same(doc_where: &str, doc: &[Named], code_where: &str, code: &[&str]) {
    let mut problems = String::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for n in doc {
        if let Some(first) = seen.insert(&n.name, n.line) {
            let _ = writeln!(problems, "  `{}` is given twice (lines {first} and {})", n.name, n.line);
        }
        if !code.contains(&n.name.as_str()) {
            let _ = writeln!(problems, "  line {}: `{}` is not in {code_where}", n.line, n.name);
        }
    }
    for c in code {
        if !seen.contains_key(c) {
            let _ = writeln!(problems, "  `{c}` (in {code_where}) is missing");
        }
    }
    assert!(problems.is_empty(), "{doc_where} differs from {code_where}:\n{problems}");
}

/// The symbols docs/architecture.md's item `- the exported symbols:` names:
/// those of every build, and those only builds for Slurm `since` (the
/// `in builds for Slurm X.YY and later` the item says) and later export.
#[derive(Debug)]
pub struct ExportedSymbols {
    /// The item's first line (1-based) and its last.
    pub lines: (usize, usize),
    pub always: Vec<Named>,
    pub later: Vec<Named>,
    /// `X.YY`, as the item writes it.
    pub since: String,
}

/// Reads docs/architecture.md's list of the plugin's exported symbols;
/// panics naming the line where the doc does not have the shape read.
pub fn exported_symbols() -> ExportedSymbols {
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
    const LATER: &str = "in builds for Slurm ";
    let split = text.find(LATER).unwrap_or_else(|| {
        panic!("docs/architecture.md:{}: the item does not say `{LATER}X.YY and later`", start + 1)
    });
    let since: String =
        text[split + LATER.len()..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let is_symbol = |span: &str| {
        (span.starts_with("plugin_") || span.starts_with("slurm_spank_"))
            && span.chars().all(|c| c.is_ascii_lowercase() || c == '_')
    };
    let named = |part: &str| -> Vec<Named> {
        code_spans(part)
            .into_iter()
            .filter(|s| is_symbol(s))
            .map(|name| Named { name, line: start + 1 })
            .collect()
    };
    ExportedSymbols {
        lines: (start + 1, end),
        always: named(&text[..split]),
        later: named(&text[split..]),
        since,
    }
}
