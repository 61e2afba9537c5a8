//! `gpu-node-agent`: finds bad GPUs in seconds and drains the node in Slurm,
//! safely.
//!
//! The pure parts (Xid parsing and the default Xid policy) live in `gpu-health`;
//! this crate has the policy's evaluation ([`health`], and [`checks`] for
//! PCIe, NVLink, fabric, clocks, ECC and persistence modes), the NVML ([`nvml`]) and
//! kernel-log ([`kmsg`]) sources, Slurm access ([`slurm`], through
//! [`command`]: a program under one deadline, its process group killed at it), the persisted
//! state ([`state`]), metrics ([`metrics`]), the GPU table for the plugin
//! ([`topo`]), the configuration ([`config`]), the rules as one pure function
//! ([`decide`]), a pass that carries them out ([`agent`]) and the daemon loop
//! ([`daemon`]), whether the plugin Slurm is told to load fits the node's
//! Slurm release ([`release`]), and the node's network interfaces against the
//! plugstack line's `nccl_socket_net` ([`network`], diagnostics only).
//! `src/main.rs` is the command line over it.

#![forbid(unsafe_code)]

pub mod agent;
pub mod atomic_file;
pub mod checks;
pub mod command;
pub mod config;
pub mod daemon;
pub mod decide;
pub mod health;
pub mod kmsg;
pub mod logging;
pub mod machine;
pub mod metrics;
pub mod network;
pub mod nvml;
pub mod release;
pub mod sample;
pub mod sdnotify;
pub mod slurm;
pub mod sources;
pub mod state;
pub mod time;
pub mod topo;
