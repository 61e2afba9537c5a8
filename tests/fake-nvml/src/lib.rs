//! A fake `libnvidia-ml.so` for machines without GPUs.
//!
//! Build it (`cargo build -p fake-nvml`) and point NVML users at
//! `target/debug/libfake_nvml.so`: nvml-wrapper loads it through its own
//! loading path (`Nvml::builder().lib_path(...)`), so the code under test is
//! the production code, differing only in the library path. What the fake
//! GPUs report comes from the JSON file named by `$FAKE_NVML_STATE`, re-read
//! whenever it changes so a test can inject a fault into a running program.
//! The format is in this crate's README.
//!
//! [`state`] is the file format and its reloading (plain Rust, tested
//! directly); `ffi` is the C ABI of each NVML function the project calls,
//! the only place with `unsafe`.

pub mod state;

#[allow(unsafe_code)]
mod ffi;
