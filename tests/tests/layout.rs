//! The workspace's layout, checked from its sources (issue 43):
//!
//! - no library crate has more than 10,000 lines of non-test code;
//! - no `#[path]` attribute reaches a file outside its own package;
//! - no two modules of a crate use each other, directly or around a cycle.
//!
//! Modules are read from the files (`src/a.rs`, `src/a/mod.rs`, `src/a/b.rs`),
//! and a module uses another where its non-test code names it by a path:
//! `crate::a::b`, `super::b`, `self::b` (also inside `use crate::{a, b::c}`).
//! A use between two modules counts at the level where their paths part: in
//! `crate::a::x` naming `crate::b::y`, `a` uses `b`; in `crate::a::x` naming
//! `crate::a::y`, `x` uses `y` (inside `a`). Test code (from a file's first
//! `#[cfg(test)]` on, and `tests.rs` files) is left out: a test may use any
//! module it checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The packages of the workspace: (directory, has a library), from the root
/// manifest's `members`.
fn packages() -> Vec<(PathBuf, bool)> {
    let root = fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let members = root.split("members = [").nth(1).and_then(|s| s.split(']').next()).expect("members");
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| {
            let dir = workspace().join(m);
            let lib = dir.join("src/lib.rs").is_file();
            (dir, lib)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target" && n != "fixtures") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's text before its first `#[cfg(test)]` line ("" for `tests.rs` and
/// files under a `tests/` module directory of `src`).
fn non_test(src: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap_or(path);
    if rel.file_name().is_some_and(|n| n == "tests.rs") || rel.components().any(|c| c.as_os_str() == "tests")
    {
        return String::new();
    }
    let text = fs::read_to_string(path).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A file's module path under `src/`: `src/a/b.rs` and `src/a/b/mod.rs` are
/// `["a", "b"]`; `lib.rs` and `main.rs` are the root.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_owned());
    }
    parts
}

/// The paths a text names from `crate::`, `super::` and `self::`, each as
/// its segments (the start word kept), `use` groups expanded one level.
fn named_paths(text: &str) -> Vec<Vec<String>> {
    let code: String =
        text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start).map(|i| i + from) {
            from = at + start.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':')
            {
                continue;
            }
            let mut prefix = vec![start.trim_end_matches("::").to_owned()];
            let mut rest = &code[at + start.len()..];
            // super::super::x
            while let Some(r) = rest.strip_prefix("super::") {
                prefix.push("super".to_owned());
                rest = r;
            }
            let mut segments = prefix.clone();
            loop {
                let word: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if word.is_empty() {
                    break;
                }
                segments.push(word.clone());
                rest = &rest[word.len()..];
                match rest.strip_prefix("::") {
                    Some(r) => rest = r,
                    None => break,
                }
            }
            if let Some(group) = rest.strip_prefix('{') {
                let body: String = group.chars().take_while(|c| *c != '}').collect();
                for item in body.split(',') {
                    let item: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|w| w.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
                        .take_while(|w: &String| !w.is_empty())
                        .collect();
                    let mut path = segments.clone();
                    path.extend(item);
                    out.push(path);
                }
            } else {
                out.push(segments);
            }
        }
    }
    out
}

/// The module a named path leads to, from the module `here` (a file's
/// module path), as the longest prefix that is a module of the crate.
fn resolve(here: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let (mut base, rest): (Vec<String>, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (here.to_vec(), &path[1..]),
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            (here[..here.len().checked_sub(ups)?].to_vec(), &path[ups..])
        }
        _ => return None,
    };
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.clone());
        if !modules.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// The groups of modules that use each other around a cycle (the strongly
/// connected components of more than one module), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flatten()).collect();
    let reaches = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reaches(n))).collect();
    let mut groups: BTreeSet<Vec<String>> = BTreeSet::new();
    for n in &nodes {
        let group: Vec<String> = nodes
            .iter()
            .filter(|m| reach[*n].contains(**m) && reach[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups.into_iter().collect()
}

/// Each crate's module cycles: "crate: a -> b -> a (inside x)".
fn module_cycles(package: &Path) -> Vec<String> {
    let src = package.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(&src, f)).collect();
    // (parent module, from child, to child)
    let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in &files {
        let here = module_path(&src, f);
        for path in named_paths(&non_test(&src, f)) {
            let Some(target) = resolve(&here, &path, &modules) else { continue };
            let common = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common < here.len() && common < target.len() {
                edges
                    .entry(here[..common].to_vec())
                    .or_default()
                    .entry(here[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
    }
    let name = package.file_name().unwrap().to_string_lossy().into_owned();
    edges
        .iter()
        .flat_map(|(parent, level)| {
            let inside =
                if parent.is_empty() { String::new() } else { format!(" (inside {})", parent.join("::")) };
            let name = name.clone();
            cycles(level).into_iter().map(move |group| {
                let uses: Vec<String> = group
                    .iter()
                    .flat_map(|a| {
                        level[a].iter().filter(|b| group.contains(b)).map(move |b| format!("{a} -> {b}"))
                    })
                    .collect();
                format!("{name}{inside}: {}", uses.join(", "))
            })
        })
        .collect()
}

#[test]
fn no_module_cycle_within_a_crate() {
    let found: Vec<String> = packages().iter().flat_map(|(dir, _)| module_cycles(dir)).collect();
    assert!(found.is_empty(), "modules that use each other around a cycle:\n{}", found.join("\n"));
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]
    .into();
    assert_eq!(cycles(&edges), vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]);
    let mut acyclic = edges.clone();
    acyclic.remove("c");
    assert!(cycles(&acyclic).is_empty());
    let here = vec!["a".to_owned(), "x".to_owned()];
    let modules: BTreeSet<Vec<String>> =
        [vec![], vec!["a".into()], vec!["a".into(), "x".into()], vec!["b".into()]].into();
    let paths = named_paths("use crate::{b::Thing, a::x::f};\nlet v = super::super::b::g();\n");
    let resolved: Vec<_> = paths.iter().filter_map(|p| resolve(&here, p, &modules)).collect();
    assert_eq!(
        resolved,
        vec![vec!["b".to_owned()], vec!["a".to_owned(), "x".to_owned()], vec!["b".to_owned()]]
    );
}

#[test]
fn no_library_crate_over_10k_lines_of_non_test_code() {
    let mut over = Vec::new();
    for (dir, lib) in packages() {
        if !lib {
            continue;
        }
        let mut files = Vec::new();
        let src = dir.join("src");
        rust_files(&src, &mut files);
        let lines: usize = files.iter().map(|f| non_test(&src, f).lines().count()).sum();
        if lines > 10_000 {
            over.push(format!("{}: {lines} lines", dir.display()));
        }
    }
    assert!(over.is_empty(), "library crates over 10,000 lines of non-test code:\n{}", over.join("\n"));
}

#[test]
fn no_path_attribute_leaves_its_package() {
    let mut out = Vec::new();
    for (dir, _) in packages() {
        let mut files = Vec::new();
        for sub in ["src", "tests", "e2e", "examples", "benches"] {
            rust_files(&dir.join(sub), &mut files);
        }
        let dir = dir.canonicalize().unwrap();
        for f in files {
            let text = fs::read_to_string(&f).unwrap();
            for (n, line) in text.lines().enumerate() {
                let Some(rest) = line.trim_start().strip_prefix("#[path = \"") else { continue };
                let target = rest.split('"').next().unwrap_or("");
                let resolved = f.parent().unwrap().join(target);
                let inside = resolved.canonicalize().is_ok_and(|p| p.starts_with(&dir));
                if !inside {
                    out.push(format!("{}:{}: #[path = \"{target}\"]", f.display(), n + 1));
                }
            }
        }
    }
    assert!(out.is_empty(), "#[path] includes of another package's files:\n{}", out.join("\n"));
}
