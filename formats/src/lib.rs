//! Slurm's and the kernel's text formats, read the way they read them.
//!
//! Every program of the project reads these: hostlist expressions, Slurm's
//! durations and sizes, the kernel's CPU lists, PCI bus ids, Slurm's release
//! numbers, `scontrol show node`'s records, a plugin file's `plugin_version`, and files only root (or the
//! agent's user) can have written. Plain data in, plain data out; the one
//! piece of I/O is [`trusted::read_trusted`].

#![forbid(unsafe_code)]

pub mod conf;
pub mod cpuset;
#[cfg(feature = "elf")]
pub mod elf;
pub mod hostlist;
pub mod node;
pub mod pci;
pub mod release;
pub mod step_id;
pub mod text;
pub mod trusted;
pub mod units;
