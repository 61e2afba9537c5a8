//! Every pending/failure reason of the Slurm this is built against has an
//! explanation in `spank-gpu why`/`autopsy`: the enum comes from that
//! release's `slurm/slurm.h` through bindgen (`slurm-sys`), the release from
//! its `SLURM_VERSION_NUMBER`. The table is keyed by enum name (positions
//! differ between releases), and says which releases have each reason: for
//! this one, the header's reasons and the table's must be the same. Run it
//! against each release's headers (`SLURM_INCLUDE_DIR=... CARGO_TARGET_DIR=...`).

use std::collections::BTreeSet;

use job_diagnosis::{REASONS, Release, explain_reason, reasons_in};

#[test]
fn every_reason_in_the_headers_is_in_the_table_and_explained() {
    let release = Release::from_version_number(slurm_sys::VERSION_NUMBER);
    let mut problems = Vec::new();
    let header: BTreeSet<&str> = slurm_sys::JOB_STATE_REASONS
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| !n.starts_with("DEFUNCT") && *n != "REASON_END")
        .collect();
    for &name in &header {
        match REASONS.iter().find(|r| r.name == name) {
            None => problems.push(format!("{name}: not in job_diagnosis::REASONS")),
            Some(r) if !r.exists_in(release) => problems.push(format!(
                "{name}: REASONS says it exists in {}..{}, not in {release}",
                r.since,
                r.until.map_or("now".to_owned(), |u| format!("{}.{:02}", u.major, u.minor))
            )),
            Some(r) if explain_reason(r.printed).is_none() => {
                problems.push(format!("{name} (printed '{}') has no explanation", r.printed));
            }
            Some(_) => {}
        }
    }
    for r in reasons_in(release) {
        if !header.contains(r.name) {
            problems.push(format!("{}: REASONS says {release} has it, its slurm.h does not", r.name));
        }
    }
    assert!(
        problems.is_empty(),
        "the reason table against Slurm {release}'s slurm.h:\n{}",
        problems.join("\n")
    );
    assert!(header.len() > 150, "only {} reasons in slurm.h?", header.len());
}
