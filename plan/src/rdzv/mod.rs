//! `--auto-rdzv`: the rendezvous, rank and thread environment of one task.
//!
//! Inputs are plain values (the plugin reads them from SPANK items, `spank-gpu
//! explain` from a task's `SLURM_*` environment); the output is the list of
//! variables to set, each with the reason, and the ones kept because the user
//! set them. Nothing here reads the environment itself.
//!
//! ## The port
//! In this order: `--auto-rdzv=port=N` (an explicit word beats anything
//! inherited); the user's `MASTER_PORT`; with `resv_ports=on` on the plugstack
//! line, the last port Slurm reserved for the step (`SLURM_STEP_RESV_PORTS`,
//! with `MpiParams=ports=`: mpi/cray_shasta hands the first one to PMI as
//! `PMI_CONTROL_PORT`, and Slurm reserves one more than the tasks per node),
//! except in heterogeneous steps, whose components have ports of their own;
//! else the step's derived port (see [`crate::ports`]). Reserved ports are
//! opt-in: with `MpiParams=ports=` Slurm 22.05 reserves ports for steps that
//! did not ask (an srun in a batch script), so the port would change with the
//! site's MPI setup, and the batch script could not announce it.
//!
//! ## "Set by the user"
//! A value already in the task's environment is kept, except when it is one
//! this plugin set in an enclosing step (a batch script's values reach the
//! `srun` steps inside it). The plugin records what it set, as names and short
//! value hashes, in [`RECORD_VAR`]; a variable whose value still matches the
//! record is recomputed for the new step, one the user changed is kept.
//!
//! ## Containers
//! A value a container runtime put in the task's environment after the tasks
//! forked (pyxis listed before spank_gpu: the image's environment, enroot's
//! PyTorch hook, pyxis's `RANK` for PyTorch images) is not the user's: see
//! [`container`].

pub mod container;
mod step;
mod step_plan;
mod task_env;
mod task_plan;

pub use crate::record::{
    COMPUTED_VARS, RECORD_VAR, recorded_bound_cpus, recorded_cpus_per_task, recorded_gpu_share,
    recorded_port_word, user_set,
};
pub use slurm_formats::step_id::{BATCH_STEP, step_name};
pub use step::{Items, RdzvError, Step, Task, count_gpus, parse_tasks_per_node};
pub use step_plan::{PortSource, Settings, StepPlan, plan_step};
pub use task_env::{Mask, NodeOffers, TaskEnv, TaskInput, task_env};
pub use task_plan::{
    Outcome, PER_TASK_VARS, PRESET_PER_TASK, SRUN_READS_SLURM_CPUS_PER_TASK_SINCE, TaskPlan, Var,
    is_step_wide, plan_task,
};

#[cfg(test)]
mod tests;
