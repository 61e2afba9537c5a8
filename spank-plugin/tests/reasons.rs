//! Every pending/failure reason of the installed Slurm has an explanation in
//! `spank-gpu why`/`autopsy`: the enum comes from the installed `slurm/slurm.h`
//! through bindgen (`slurm-sys`), so building against a newer Slurm makes
//! this test name each reason that is still missing.

use gpu_core::jobinfo::{REASONS, explain_reason};

#[test]
fn every_reason_in_the_installed_header_is_explained() {
    let mut missing = Vec::new();
    for &(name, value) in slurm_sys::JOB_STATE_REASONS {
        let entry = REASONS.iter().position(|(n, _)| *n == name);
        match entry {
            None => missing.push(format!("{name} = {value}: not in gpu_core::jobinfo::REASONS")),
            Some(i) => {
                if i64::try_from(i).ok() != Some(value) {
                    missing.push(format!("{name} is {value} in slurm.h but at {i} in REASONS (reorder it)"));
                }
                let printed = REASONS[i].1;
                if explain_reason(printed).is_none() {
                    missing.push(format!("{name} (printed '{printed}') has no explanation"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "reasons of the installed Slurm without an explanation:\n{}",
        missing.join("\n")
    );
    assert_eq!(
        REASONS.len(),
        slurm_sys::JOB_STATE_REASONS.len(),
        "REASONS lists reasons slurm.h does not have"
    );
}
