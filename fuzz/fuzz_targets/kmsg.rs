//! Kernel-log lines (the agent reads /dev/kmsg and admins' log files).
#![no_main]
use gpu_health::xid;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    if let Some(r) = xid::parse_line(&line) {
        assert!(r.message.len() <= xid::MAX_MESSAGE_BYTES);
        let _ = r.pci_bus_id.nvml();
        // NVLink5 Xids (144-150): the message decoded, whatever it says.
        if let Some(d) = gpu_health::nvlink5::decode(r.xid, &r.message) {
            assert!(d.sub_code <= 0x3f);
            let _ = d.describe();
        }
    }
    let _ = gpu_health::nvlink5::decode(144 + u32::from(data.first().copied().unwrap_or(0) % 7), &line);
    let _ = slurm_formats::pci::PciAddr::parse(&line);
});
