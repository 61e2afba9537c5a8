//! The admin's plugstack.conf words, and its lines as Slurm reads them.
#![no_main]
use task_plan::plugstack::{PluginConfig, StackLine, glob_match};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for line in text.lines() {
        if let Ok(Some(StackLine::Plugin { path, .. })) = StackLine::parse(line) {
            assert!(!path.is_empty() && !path.contains([' ', '\t', '\n']));
        }
    }
    if let Some((pattern, name)) = text.split_once('\n') {
        let _ = glob_match(pattern, name);
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    for debug in [false, true] {
        if let Ok(cfg) = PluginConfig::parse(&words, debug) {
            assert!(cfg.topology_dir.starts_with('/'));
            assert!(cfg.port_range.lo >= 1024 && cfg.port_range.lo <= cfg.port_range.hi);
        } else if let Err(e) = PluginConfig::parse(&words, debug) {
            let _ = e.to_string();
        }
    }
});
