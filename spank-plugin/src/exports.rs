//! The names of the symbols the plugin exports (`ffi` defines them), as
//! one list for the checks: the built library's dynamic symbols
//! (`tests/plugin_version.rs`, and the e2e case `plugin_exports_only_its_symbols`,
//! which includes this file by path) and docs/architecture.md's list
//! (`tests/exports.rs`) are compared with it. Nothing here is exported.

/// Exported by every build, sorted: `plugin_name`, `plugin_type` and
/// `plugin_version`, which Slurm's plugin loader reads, and the seven SPANK hooks.
pub const ALWAYS: &[&str] = &[
    "plugin_name",
    "plugin_type",
    "plugin_version",
    "slurm_spank_init",
    "slurm_spank_init_post_opt",
    "slurm_spank_job_epilog",
    "slurm_spank_job_prolog",
    "slurm_spank_local_user_init",
    "slurm_spank_task_init",
    "slurm_spank_user_init",
];

/// Exported as well by builds for Slurm [`SINCE`] and later
/// (`cfg(spank_init_failure_mode)`, see build.rs).
pub const FROM_25_05: &[&str] = &["slurm_spank_init_failure_mode"];

/// The release (major, minor) from which [`FROM_25_05`] is exported.
pub const SINCE: (u32, u32) = (25, 5);

/// What a build exports, sorted: `from_25_05` when it was built for Slurm
/// [`SINCE`] or later.
pub fn expected(from_25_05: bool) -> Vec<&'static str> {
    let mut names = ALWAYS.to_vec();
    if from_25_05 {
        names.extend_from_slice(FROM_25_05);
    }
    names.sort_unstable();
    names
}
