//! What `spank-gpu why`/`autopsy` read from Slurm's commands: `scontrol show
//! job -o` records, `--parsable2` tables, `sacctmgr show event`, reasons,
//! dependencies, durations, sizes and times. None may panic.
#![no_main]
use gpu_core::jobinfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let record = jobinfo::parse_record(text);
    for value in record.values() {
        let _ = jobinfo::parse_dependencies(value);
        let _ = jobinfo::unavailable_nodes(value);
        let _ = jobinfo::explain_reason(jobinfo::reason_code(value));
        let _ = jobinfo::decode_agent_reason("node1", value);
        let _ = jobinfo::exit_in_words(value);
        let _ = jobinfo::state_in_words(value);
        if let Some(d) = jobinfo::parse_duration(value) {
            let _ = jobinfo::format_duration(d);
        }
        if let Some(b) = jobinfo::parse_size(value) {
            let _ = jobinfo::format_size(b);
        }
        let _ = jobinfo::parse_time(value);
    }
    let _ = jobinfo::parse_parsable(text);
    let _ = jobinfo::parse_events(text, i64::MIN, i64::MAX);
    let _ = jobinfo::classify_oom(text);
});
