//! What a GPU's faults mean, as pure functions: Xid lines in every kernel-log
//! form (`xid`), NVLink5's Xids 144-150 (`nvlink5`), and the drain reasons the
//! agent writes into Slurm (`reason`), which `spank-gpu why` decodes, and a job's GPU use on a node (`usage`), which
//! the agent writes and `spank-gpu usage`/`autopsy` read.
//! Used by `gpu-node-agent` and by `job-diagnosis`; never by the plugin.

#![forbid(unsafe_code)]

pub mod admin_comment;
pub mod nvlink5;
pub mod reason;
pub mod usage;
pub mod xid;
