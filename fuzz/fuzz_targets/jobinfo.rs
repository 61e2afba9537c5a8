//! What `spank-gpu why`/`autopsy`/`usage` read from Slurm's commands and the
//! job's log: `scontrol show job` records (text and JSON), `sacct`
//! (`--parsable2` and JSON), `sacctmgr show event`, reasons, dependencies,
//! durations, sizes and times; `scontrol show assoc_mgr` (the limits),
//! `scontrol show config` and `sacctmgr show qos` (preemption); the job's log
//! (srun's and slurmstepd's lines, the frameworks' messages); the agents'
//! summaries in an `AdminComment`. None may panic.
#![no_main]
use job_diagnosis::{self as jobinfo, Release};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let release = Release::new(24, 11, 5);
    let mut records = vec![jobinfo::parse_record(text)];
    records.extend(jobinfo::parse_job_record(text));
    records.extend(jobinfo::parse_scontrol_jobs(text).unwrap_or_default());
    for record in &records {
        let _ = jobinfo::why(record, "1", release);
        for value in record.values() {
            let _ = jobinfo::parse_dependencies(value);
            let _ = jobinfo::unavailable_nodes(value);
            let _ = jobinfo::read_reason(value, None);
            let _ = jobinfo::raised_signal(value);
            let _ = jobinfo::decode_agent_reason("node1", value);
            let _ = jobinfo::exit_in_words(value);
            let _ = jobinfo::state_in_words(value);
            if let Some(d) = slurm_formats::units::parse_duration(value) {
                let _ = slurm_formats::units::format_duration(d);
            }
            if let Some(b) = slurm_formats::units::parse_size(value) {
                let _ = slurm_formats::units::format_size(b);
            }
            if let Some(t) = jobinfo::parse_time(value) {
                let _ = jobinfo::format_time(t);
            }
        }
    }
    let mut rows = jobinfo::parse_parsable(text);
    jobinfo::fix_glued_paths(&mut rows, release);
    rows.extend(jobinfo::parse_sacct_jobs(text, release).unwrap_or_default());
    let _ = jobinfo::ended_job(&rows, records.first());
    let _ = jobinfo::parse_events(text, i64::MIN, i64::MAX);
    let _ = jobinfo::classify_oom(text);
    let _ = jobinfo::first_failure::first_failure(&rows, Some(text), text, Some(8));
    let _ = jobinfo::first_failure::read_log(text);
    for line in text.lines() {
        let _ = jobinfo::causes::classify_line(line);
        let _ = jobinfo::causes::line_rank(line);
    }
    let _ = jobinfo::limits::parse_assoc_mgr(text);
    let _ = jobinfo::preemption::parse_config(text);
    let _ = jobinfo::preemption::parse_qos_grace(text, "low");
    let usage = jobinfo::usage::from_admin_comment(text);
    for u in &usage {
        assert_eq!(gpu_health::usage::NodeUsage::parse_word(&u.to_word()).map(|b| b.gpus.len()), Some(u.gpus.len()));
    }
    let _ = jobinfo::ids_from_proc_status(text);
    // The agents' and the CLI's reading of `sacct --delimiter=T -o JobIDRaw,JobID,SystemComment,...`
    // (T fixed here; random per call in the agent and the CLI): a row's id, its site text and
    // the merge never panic, and the site's text survives the merge byte for byte.
    use gpu_health::admin_comment as comment;
    for row in comment::parse_rows(text, "~0123456789abcdef~").unwrap_or_default() {
        let _ = comment::write_id(&row);
        for rules in [comment::Rules::of(None), comment::Rules::of(Some(slurm_formats::release::Release { major: 22, minor: 5 }))] {
            let _ = rules.mangles(&row.admin);
            let _ = rules.stored(&row.admin);
            let _ = comment::plan(rules, &row, "node1", "sgu1;node=node1");
        }
        let merged = comment::merge(&row.admin, "node1", "sgu1;node=node1");
        assert_eq!(comment::site_text(&merged), comment::site_text(&row.admin));
    }
});
