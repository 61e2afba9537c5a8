//! Slurm hostlist expressions (SLURM_STEP_NODELIST): the three entry points agree.
#![no_main]
use slurm_formats::hostlist;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(expr) = std::str::from_utf8(data) else { return };
    let all = hostlist::expand(expr);
    let first = hostlist::first(expr);
    let count = hostlist::count(expr);
    match all {
        Ok(hosts) => {
            assert_eq!(first.ok().as_ref(), hosts.first());
            assert_eq!(count.ok(), Some(hosts.len()));
            assert!(hosts.len() <= hostlist::MAX_HOSTS);
        }
        Err(_) => assert!(first.is_err() && count.is_err()),
    }
});
