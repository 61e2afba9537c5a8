//! The agent's TOML configuration.
#![no_main]
use gpu_node_agent::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::parse(text) {
        Ok(c) => assert!((0.0..=1.0).contains(&c.max_drained_fraction) && c.resume_after >= 1),
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
