//! The user's option arguments (--auto-rdzv=..., --gpu-affinity=...).
#![no_main]
use task_plan::options;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(arg) = std::str::from_utf8(data) else { return };
    let arg = options::from_slurm(Some(arg));
    let a = options::parse_auto_rdzv(arg);
    let g = options::parse_gpu_affinity(arg);
    for o in options::UserOption::ALL {
        let _ = options::validate(o, arg).map_err(|e| e.to_string());
    }
    if let Ok(Some(a)) = a {
        assert!(a.port.is_none_or(|p| p >= 1024));
    }
    let _ = g;
});
