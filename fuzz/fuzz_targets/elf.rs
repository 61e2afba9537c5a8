//! A shared object's bytes, read for its plugin_version (gpu-node-agent reads
//! the plugin file the plugstack files name).
#![no_main]
use slurm_formats::elf::{exported_u32, plugin_version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = plugin_version(data);
    if let Err(e) = exported_u32(data, "plugin_type") {
        let _ = e.to_string();
    }
});
