//! What a GPU's faults mean, as pure functions: Xid lines in every kernel-log
//! form (`xid`), NVLink5's Xids 144-150 (`nvlink5`), and the drain reasons the
//! agent writes into Slurm (`reason`), which `spank-gpu why` decodes; a job's
//! GPU use on a node (`usage`, summed as it runs by `tally`), which the agent
//! writes into the job's accounting record (`admin_comment`) and `spank-gpu
//! usage`/`autopsy` read.
//! Used by `gpu-node-agent` and by `job-diagnosis`; never by the plugin.

#![forbid(unsafe_code)]

pub mod admin_comment;
pub mod nvlink5;
pub mod reason;
pub mod tally;
pub mod usage;
pub mod xid;
