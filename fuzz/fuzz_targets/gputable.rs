//! The node's GPU table (a root-owned file the plugin reads every step), and
//! the job records the plugin's prolog writes for the agent (read back by the
//! agent and the prolog).
#![no_main]
use task_plan::gputable::GpuTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(table) = GpuTable::parse(text) {
        assert_eq!(GpuTable::parse(&table.to_text()).ok(), Some(table.clone()));
        let (held, _) = task_plan::jobmap::held_gpus(&table, Some("0,1,2"), Some("MIG-x,GPU-y"));
        let _ = task_plan::jobmap::dcgm_files(&[task_plan::jobmap::JobRecord { job: 1, uid: 0, gpus: held }]);
    }
    if let Ok(record) = task_plan::jobmap::JobRecord::parse(text) {
        assert_eq!(task_plan::jobmap::JobRecord::parse(&record.to_text()).map(|r| r.gpus.len()), Ok(record.gpus.len()));
    }
});
