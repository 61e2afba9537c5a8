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
//! denies) says nothing. [`view`] then gives the task's GPUs when a
//! constraint is visibly in force ([`DeviceView::Constrained`]), or says that
//! nothing constrains devices ([`DeviceView::Free`]: Slurm's variables use
//! global indices and are right), or that it cannot tell.
//!
//! The files are looked up in a directory opened before the fork: slurmstepd
//! opens the device directory once per step in `user_init` (`O_PATH`, kept
//! across the fork, closed at `exec`), and each task asks `faccessat(2)`
//! relative to it. By `task_init` a container plugin listed before spank_gpu
//! may have moved the task into another mount namespace: pyxis's
//! `slurm_spank_task_init` `setns`es it into the enroot container's
//! (pyxis_slurmstepd.c), whose `/dev` holds only the task's own GPUs, or
//! where the directory does not exist. A path looked up there says nothing
//! about the other GPUs (no such file: [`Access::Unknown`]); the descriptor
//! still names the host's directory, and the kernel still applies the
//! task's device cgroup to what is found in it. Only where the directory
//! could not be opened is the path looked up in the task.

/// Where the GPU device files are (`/dev/nvidia<minor>`).
pub const DEFAULT_DEV_DIR: &str = "/dev";

/// `EPERM` on Linux (every architecture): what the device cgroup answers.
pub const EPERM: i32 = 1;
/// `ENXIO`: a device file with no driver behind it (the lab's fake GPUs),
/// reached through the device cgroup.
pub const ENXIO: i32 = 6;
/// `ENODEV`: the same, from some drivers.
pub const ENODEV: i32 = 19;

/// The name of the device file of the GPU with this minor number, in the
/// device directory (`nvidia<minor>`).
pub fn device_name(minor: u32) -> String {
    format!("nvidia{minor}")
}

/// The device file of the GPU with this minor number.
pub fn device_path(dir: &str, minor: u32) -> String {
    format!("{}/{}", dir.trim_end_matches('/'), device_name(minor))
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

/// What the task's device cgroup says about its GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceView {
    /// A constraint is in force: these are the task's GPUs (Slurm indices),
    /// the only ones it may reach.
    Constrained(Vec<u32>),
    /// Every GPU of the node is reachable: nothing constrains devices (or the
    /// task has them all), so Slurm's variables use global indices and say
    /// the task's GPUs.
    Free,
    /// A probe could not tell (or none was made).
    #[default]
    Unknown,
}

impl DeviceView {
    /// The task's GPUs under a constraint.
    pub fn constrained(&self) -> Option<&[u32]> {
        match self {
            DeviceView::Constrained(g) => Some(g),
            _ => None,
        }
    }
}

/// What one probe per GPU of the table found: [`DeviceView::Constrained`]
/// when every probe answered and at least one GPU was refused,
/// [`DeviceView::Free`] when every one answered and none was refused, else
/// [`DeviceView::Unknown`].
pub fn view(probes: &[(u32, Access)]) -> DeviceView {
    if probes.is_empty() || probes.iter().any(|(_, a)| *a == Access::Unknown) {
        return DeviceView::Unknown;
    }
    if !probes.iter().any(|(_, a)| *a == Access::Denied) {
        return DeviceView::Free;
    }
    let mut mine: Vec<u32> = probes.iter().filter(|(_, a)| *a == Access::Allowed).map(|(g, _)| *g).collect();
    mine.sort_unstable();
    mine.dedup();
    DeviceView::Constrained(mine)
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
        use DeviceView::{Constrained, Free};
        assert_eq!(view(&[(0, Denied), (1, Allowed), (2, Denied)]), Constrained(vec![1]));
        assert_eq!(view(&[(3, Allowed), (0, Allowed), (1, Denied)]), Constrained(vec![0, 3]));
        assert_eq!(view(&[(0, Denied), (1, Denied)]), Constrained(vec![]), "a step without GPUs here");
        assert_eq!(view(&[(0, Allowed), (1, Allowed)]), Free, "nothing refused");
        assert_eq!(view(&[(0, Denied), (1, Unknown)]), DeviceView::Unknown, "a probe that could not tell");
        assert_eq!(view(&[]), DeviceView::Unknown);
        assert_eq!(Constrained(vec![2]).constrained(), Some(&[2][..]));
        assert_eq!(Free.constrained(), None);
    }

    #[test]
    fn device_files_are_nvidia_minor() {
        assert_eq!(device_path("/dev", 3), "/dev/nvidia3");
        assert_eq!(device_path("/tmp/lab/cdev/", 0), "/tmp/lab/cdev/nvidia0");
        assert_eq!(device_name(7), "nvidia7");
    }
}
