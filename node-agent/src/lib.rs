//! `gpu-node-agent`: finds bad GPUs in seconds and drains the node in Slurm,
//! safely.
//!
//! The pure parts (Xid parsing and the default Xid policy) live in `gpu-health`.
//! This crate is grouped by role:
//!
//! - [`sources`]: what the agent reads of the node (NVML, the kernel log, hwloc,
//!   network interfaces) and which of those sources work;
//! - [`policy`]: what the readings mean, pure (samples → faults → reasons);
//! - [`decide`]: the rules, one pure function of the observation, the node, the
//!   fleet, the state and the configuration;
//! - [`agent`]: one pass that carries the decisions out, and [`daemon`], the loop;
//! - [`gate`]: the Epilog health gate (`gpu-node-agent epilog` asks the daemon);
//! - [`slurm`]: `scontrol` under a deadline (the `bounded-command` crate) and
//!   whether the plugin fits the node's Slurm release ([`slurm::release`]);
//! - [`run_dir`]: the run directory, checked root's alone before anything is made in it;
//! - [`store`]: `state.json`, what the agent remembers across restarts;
//! - [`reports`]: metrics, the log, systemd's notify protocol, the GPU table for
//!   the plugin;
//! - [`usage`]: per-job GPU use (which job holds which GPU, the running
//!   summaries, the live files and the job's `AdminComment` at its end);
//! - [`config`], [`time`] and [`exposition`] (Prometheus's label values).
//!
//! `src/main.rs` is the command line over it.

#![forbid(unsafe_code)]

pub mod agent;
pub mod config;
pub mod daemon;
pub mod decide;
pub mod exposition;
pub mod gate;
pub mod policy;
pub mod reports;
pub mod run_dir;
pub mod slurm;
pub mod sources;
pub mod store;
pub mod time;
pub mod usage;
