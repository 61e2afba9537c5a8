//! Link flags of the plugin, and what depends on the Slurm release it is
//! built for.
//!
//! `-z nodelete`: Slurm `dlclose`s plugins; Rust's thread-local destructors
//! and std's runtime state must never be unmapped under a live process.
//!
//! `cfg(spank_init_failure_mode)`: the headers are Slurm 25.05 or later,
//! whose `spank.h` declares `slurm_spank_init_failure_mode` (commit
//! ef535530f2, src/common/spank.c `_do_call_stack`); the plugin then exports
//! it. The release comes from `slurm-sys`'s build script
//! (`DEP_SLURM_SPANK_VERSION_NUMBER`).

/// `SLURM_VERSION_NUMBER` of 25.05.0.
const INIT_FAILURE_MODE_SINCE: u32 = (25 << 16) | (5 << 8);

fn main() {
    println!("cargo::rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo::rustc-check-cfg=cfg(spank_init_failure_mode)");
    println!("cargo::rerun-if-env-changed=DEP_SLURM_SPANK_VERSION_NUMBER");
    let version = std::env::var("DEP_SLURM_SPANK_VERSION_NUMBER").ok().and_then(|v| v.parse::<u32>().ok());
    if version.is_some_and(|v| v >= INIT_FAILURE_MODE_SINCE) {
        println!("cargo::rustc-cfg=spank_init_failure_mode");
    }
}
