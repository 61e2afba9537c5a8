//! What a task gets: the plugin's decisions, as pure functions.
//!
//! The rendezvous values (`rdzv`, with `layout`, `launcher`, `ports`,
//! `nodeaddr`, `apptainer`), the CPU binding (`binding`, from the GPU table
//! `gputable` and the machine's `topology`, the GPUs a device cgroup lets a
//! task reach in `devices`), the interfaces NCCL and gloo use (`netif`), the
//! user's options (`options`) and the admin's plugstack line (`plugstack`).
//! `task_init` in slurmstepd and `spank-gpu explain` call the same functions;
//! the agent writes the GPU table and reads the plugstack line. Which job
//! holds which GPU (`jobmap`) is written by the plugin's job prolog and read
//! by the agent.
//!
//! Plain data in, plain data out: no Slurm handle, no NVML, no hwloc, no I/O
//! and no `unsafe`.

#![forbid(unsafe_code)]

pub mod apptainer;
pub mod binding;
pub mod devices;
pub mod gputable;
pub mod jobmap;
pub mod launcher;
pub mod layout;
pub mod netif;
pub mod nodeaddr;
pub mod options;
pub mod plugstack;
pub mod ports;
pub mod rdzv;
pub mod record;
pub mod topology;
