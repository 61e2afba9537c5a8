//! Kernel-log lines (the agent reads /dev/kmsg and admins' log files).
#![no_main]
use gpu_core::xid;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    if let Some(r) = xid::parse_line(&line) {
        assert!(r.message.len() <= xid::MAX_MESSAGE_BYTES);
        let _ = r.pci_bus_id.nvml();
    }
    let _ = gpu_core::pci::PciAddr::parse(&line);
});
