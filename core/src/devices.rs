//! Which GPUs a task really has, from what its device cgroup lets it reach.
//!
//! Under `ConstrainDevices=yes` Slurm's variables name a task's GPUs by local
//! index (`CUDA_VISIBLE_DEVICES=0` in every task of `--gpus-per-task=1`), and
//! from 23.11 which GPU each task gets depends on gres.conf `Cores=`
//! (`_get_gres_per_task` and `_get_closest_usable_gres`, src/interfaces/gres.c),
//! which the node's GPU table does not hold; with `--ntasks-per-gpu` 23.11+
//! tells every task `CUDA_VISIBLE_DEVICES=0` and the step's first GPU in
//! `SLURM_STEP_GPUS` (`_get_usable_gres`, `single:` with local indices). The
//! task's device cgroup is the truth: on every release it is in force before
//! the SPANK `task_init` hook runs (slurmstepd mgr.c `_fork_all_tasks`: the
//! parent applies task/cgroup's per-task device constraint, 22.05 in
//! `task_p_post_set_affinity`, 23.11+ in `task_p_pre_launch_priv`, before it
//! lets the forked task go on to `exec_task`, where `task_init` runs).
//!
//! The plugin asks the kernel whether the task may reach each GPU's device
//! file (`access(2)`: the device cgroup check, v1's `devices.list` and v2's
//! eBPF program alike, is part of the permission check, so no device is
//! opened and no driver is called). A refusal with `EPERM` is the device
//! cgroup's; any other failure (no such file, a permission the file's mode
//! denies) says nothing. [`constrained_gpus`] then gives the task's GPUs when
//! a constraint is visibly in force, and nothing otherwise: where nothing
//! constrains devices Slurm's variables use global indices and are right.

/// Where the GPU device files are (`/dev/nvidia<minor>`).
pub const DEFAULT_DEV_DIR: &str = "/dev";

/// `EPERM` on Linux (every architecture): what the device cgroup answers.
pub const EPERM: i32 = 1;
/// `ENXIO`: a device file with no driver behind it (the lab's fake GPUs),
/// reached through the device cgroup.
pub const ENXIO: i32 = 6;
/// `ENODEV`: the same, from some drivers.
pub const ENODEV: i32 = 19;

/// The device file of the GPU with this minor number.
pub fn device_path(dir: &str, minor: u32) -> String {
    format!("{}/nvidia{minor}", dir.trim_end_matches('/'))
}

/// What a probe of one GPU's device file found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The device cgroup lets the task reach it.
    Allowed,
    /// The device cgroup refuses it (`EPERM`).
    Denied,
    /// The probe could not tell (no such file, the file's mode, ...).
    Unknown,
}

impl Access {
    /// From the outcome of `access(2)` (`opened == false`) or of `open(2)`
    /// (`opened == true`): `None` for success, else the `errno`. An `open` of
    /// a device file without a driver fails after the device cgroup let it
    /// through (`ENXIO`, `ENODEV`): allowed.
    pub fn from_errno(errno: Option<i32>, opened: bool) -> Access {
        match errno {
            None => Access::Allowed,
            Some(EPERM) => Access::Denied,
            Some(ENXIO | ENODEV) if opened => Access::Allowed,
            Some(_) => Access::Unknown,
        }
    }
}

/// The task's GPUs (Slurm indices) when its device cgroup visibly constrains
/// it: every probed GPU answered and at least one was refused. `None` when
/// nothing is refused (no constraint, or the task has every GPU of the node:
/// the variables then say it) or when any probe could not tell.
pub fn constrained_gpus(probes: &[(u32, Access)]) -> Option<Vec<u32>> {
    if probes.iter().any(|(_, a)| *a == Access::Unknown) || !probes.iter().any(|(_, a)| *a == Access::Denied)
    {
        return None;
    }
    let mut mine: Vec<u32> = probes.iter().filter(|(_, a)| *a == Access::Allowed).map(|(g, _)| *g).collect();
    mine.sort_unstable();
    mine.dedup();
    Some(mine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::{Allowed, Denied, Unknown};

    #[test]
    fn errno_means_what_the_device_cgroup_said() {
        assert_eq!(Access::from_errno(None, false), Allowed);
        assert_eq!(Access::from_errno(Some(EPERM), false), Denied);
        assert_eq!(Access::from_errno(Some(EPERM), true), Denied);
        assert_eq!(Access::from_errno(Some(ENXIO), true), Allowed, "open of a driverless node");
        assert_eq!(Access::from_errno(Some(ENXIO), false), Unknown);
        assert_eq!(Access::from_errno(Some(2), true), Unknown, "ENOENT");
        assert_eq!(Access::from_errno(Some(13), false), Unknown, "EACCES: the file's mode");
    }

    #[test]
    fn only_a_visible_constraint_names_the_tasks_gpus() {
        assert_eq!(constrained_gpus(&[(0, Denied), (1, Allowed), (2, Denied)]), Some(vec![1]));
        assert_eq!(constrained_gpus(&[(3, Allowed), (0, Allowed), (1, Denied)]), Some(vec![0, 3]));
        assert_eq!(constrained_gpus(&[(0, Denied), (1, Denied)]), Some(vec![]), "a step without GPUs here");
        assert_eq!(constrained_gpus(&[(0, Allowed), (1, Allowed)]), None, "nothing refused");
        assert_eq!(constrained_gpus(&[(0, Denied), (1, Unknown)]), None, "a probe that could not tell");
        assert_eq!(constrained_gpus(&[]), None);
    }

    #[test]
    fn device_files_are_nvidia_minor() {
        assert_eq!(device_path("/dev", 3), "/dev/nvidia3");
        assert_eq!(device_path("/tmp/lab/cdev/", 0), "/tmp/lab/cdev/nvidia0");
    }
}
