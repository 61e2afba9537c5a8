//! `spank_gpu.so`: a SPANK plugin loaded by srun, sbatch, salloc, slurmd and
//! slurmstepd through `plugstack.conf`.
//!
//! Layout:
//! - [`ffi`] is the only module with `unsafe`: the symbols Slurm looks up, the
//!   option table, the one guard every hook and callback goes through, and the
//!   [`Spank`](spank::Spank) implementation over a real SPANK handle; the
//!   names it exports are listed in [`exports`], for the tests.
//! - [`spank`] is the narrow seam: the few SPANK calls the hooks use.
//! - [`hooks`] is what the plugin does in each hook, generic over that seam and
//!   tested with a fake. Decisions are made by the pure `task-plan` crate.
//! - `hooks::lint` runs `spank-gpu lint`'s checks in sbatch at submit time
//!   (`lint=` on the plugstack line), through the `batch-lint` crate.
//!
//! Rules that hold everywhere in this crate: no panic crosses `extern "C"`, no
//! threads, no poisoning locks, no change to the process's own environment, nothing printed to
//! stdout or stderr (all output goes through Slurm's log), and the plugin's own
//! faults never fail a job: they are logged and the hook returns success.

#![deny(unsafe_code)]

pub mod exports;
// The FFI module refers to symbols that only a Slurm process provides, so unit
// test binaries (which are not loaded by Slurm) are built without it.
#[cfg(not(test))]
#[allow(unsafe_code)]
mod ffi;
pub mod hooks;
pub mod spank;
mod sysio;
