//! The node's GPU table (a root-owned file the plugin reads every step).
#![no_main]
use task_plan::gputable::GpuTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(table) = GpuTable::parse(text) {
        assert_eq!(GpuTable::parse(&table.to_text()).ok(), Some(table));
    }
});
