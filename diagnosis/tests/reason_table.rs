//! The reason table against every release's own source: `fixtures/jobinfo/reasons/<tag>.txt`
//! holds each `enum job_state_reason` value of `slurm/slurm.h` at that tag with
//! the string Slurm prints for it (written by `reasons/extract.py`). For each
//! release, the reasons the table says it has are exactly those, by name, with
//! the same strings, and each has words.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use job_diagnosis::{Release, explain_reason, reasons_in};

fn release_of(tag: &str) -> Release {
    // slurm-24-11-5-1 → 24.11.5
    let parts: Vec<u8> = tag.split('-').skip(1).take(3).filter_map(|p| p.parse().ok()).collect();
    match parts.as_slice() {
        [a, b, c] => Release::new(*a, *b, *c),
        _ => panic!("{tag} is not a release tag"),
    }
}

#[test]
fn every_release_has_exactly_its_own_reasons() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobinfo/reasons");
    let mut tags: Vec<String> = fs::read_dir(&dir)
        .expect("the reasons fixtures")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".txt").map(str::to_owned))
        .collect();
    tags.sort();
    assert_eq!(tags.len(), 8, "{tags:?}");
    for tag in &tags {
        let release = release_of(tag);
        let text = fs::read_to_string(dir.join(format!("{tag}.txt"))).expect("read");
        let source: BTreeSet<(String, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split(' ');
                Some((f.next()?.to_owned(), f.nth(1)?.to_owned()))
            })
            .filter(|(n, _)| !n.starts_with("DEFUNCT") && n != "REASON_END")
            .collect();
        let table: BTreeSet<(String, String)> =
            reasons_in(release).map(|r| (r.name.to_owned(), r.printed.to_owned())).collect();
        let missing: Vec<_> = source.difference(&table).collect();
        let extra: Vec<_> = table.difference(&source).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{tag}: not in the table {missing:?}; not in Slurm {extra:?}"
        );
        for (name, printed) in &source {
            assert!(explain_reason(printed).is_some(), "{tag}: {name} ({printed}) has no words");
        }
    }
}
