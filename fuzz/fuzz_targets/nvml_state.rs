//! The fake NVML's JSON state file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(state) = fake_nvml::state::State::parse(text) {
        for g in &state.gpus {
            let _ = state.index_by_pci(&g.pci_bus_id);
            let _ = state.index_by_uuid(&g.uuid);
        }
    }
});
