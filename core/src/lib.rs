//! Pure logic of the spank-gpu project.
//!
//! Everything here is plain data in, plain data out: no Slurm handle, no NVML,
//! no hwloc, no I/O and no `unsafe`. The SPANK plugin and the node agent are
//! thin shells that read their inputs, call into this crate and apply the
//! result, so this is where the behaviour lives and where it is tested.

#![forbid(unsafe_code)]

pub mod apptainer;
pub mod binding;
pub mod cpuset;
pub mod devices;
#[cfg(feature = "elf")]
pub mod elf;
pub mod gputable;
pub mod hostlist;
pub mod jobinfo;
pub mod launcher;
pub mod layout;
pub mod lint;
pub mod netif;
pub mod nodeaddr;
pub mod nvlink5;
pub mod options;
pub mod pci;
pub mod plugstack;
pub mod ports;
pub mod rdzv;
pub mod reason;
pub mod release;
pub mod text;
pub mod topology;
pub mod trusted;
pub mod xid;
