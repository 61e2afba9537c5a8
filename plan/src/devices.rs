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

use slurm_formats::conf;

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

/// Where nothing can constrain a task's devices, its probes would only
/// find every GPU reachable ([`DeviceView::Free`]): `false` when slurmstepd's
/// `TaskPlugin` has no task/cgroup (only task/cgroup applies a device
/// constraint, `task_cgroup_devices.c` on every release), or when the
/// `cgroup.conf` beside the node's `slurm.conf` is read and does not set
/// `ConstrainDevices` true (off by default on every release, `cgroup.c`'s
/// `ConstrainDevices` `S_P_BOOLEAN`). `true` (probe) whenever either cannot
/// be told: the plugin is not known ([`task_plugin_in_force`]), or
/// task/cgroup is in force and the file could not be read, includes
/// another, or says something about `ConstrainDevices` this parser does not
/// read as Slurm's would.
///
/// slurmd reads `cgroup.conf` when it starts and at `scontrol reconfigure`
/// and hands slurmstepd that copy; a file edited since is what the node
/// will use at its next reconfigure.
pub fn constraint_possible(task_plugin: Option<&str>, cgroup_conf: Option<&str>) -> bool {
    let Some(plugins) = task_plugin else { return true };
    task_cgroup(plugins) && cgroup_conf.is_none_or(|text| constrain_devices(text).unwrap_or(true))
}

/// From this release an unset `TaskPlugin`, or one naming `none`, is NULL in
/// the loaded configuration (read_config.c `_validate_and_set_defaults`
/// frees it, 23.11); before, an unset one is `task/none`.
pub const NULL_TASK_PLUGIN_IS_NONE_SINCE: u32 = (23 << 16) | (11 << 8);

/// The `TaskPlugin` in force, from slurmstepd's loaded configuration
/// (`loaded`: its `task_plugin`, `None` for NULL): `Some("")` for none,
/// `None` when it cannot be told (NULL before 23.11).
pub fn task_plugin_in_force(loaded: Option<&str>, slurm_version: u32) -> Option<&str> {
    match loaded {
        Some(plugins) => Some(plugins),
        None if slurm_version >= NULL_TASK_PLUGIN_IS_NONE_SINCE => Some(""),
        None => None,
    }
}

/// Whether a `TaskPlugin` value has task/cgroup, tested as Slurm tests it
/// before telling tasks local GPU indices (gres.c `gres_use_local_device_index`:
/// the word `cgroup` anywhere in it).
pub fn task_cgroup(task_plugin: &str) -> bool {
    task_plugin.contains("cgroup")
}

/// The name of Slurm's cgroup configuration, beside `slurm.conf`.
pub const CGROUP_CONF: &str = "cgroup.conf";

/// The most of `cgroup.conf` the plugin reads (a real one is a few hundred bytes).
pub const MAX_CGROUP_CONF: usize = 64 * 1024;

/// `ConstrainDevices` as Slurm's parser reads `cgroup.conf` (parse_config.c):
/// `Key=Value` pairs, spaces allowed around `=`, values in `"` or up to the
/// next space, keys in any case, `#` to the end of the line a comment (`\#`
/// a `#`), the last value given wins, `yes`/`up`/`true`/`1` and
/// `no`/`down`/`false`/`0` in any case (parse_value.c `s_p_handle_boolean`).
/// `Some(false)` when it is not given (the default); `None` when the file
/// includes another, when a line naming `ConstrainDevices` is not pairs as
/// above or gives it with an operator (`+=`), or when the value is not a
/// boolean (slurmd refuses such a file, so it is not what the node runs with).
pub fn constrain_devices(text: &str) -> Option<bool> {
    let mut value = Some(false);
    for line in conf::logical_lines(text) {
        let first = line.trim_start();
        if first.get(..7).is_some_and(|w| w.eq_ignore_ascii_case("include")) {
            return None;
        }
        let named = line.to_ascii_lowercase().contains("constraindevices");
        let Some(pairs) = conf::pairs(&line) else {
            if named {
                return None;
            }
            continue;
        };
        for (key, operator, v) in pairs {
            if !key.eq_ignore_ascii_case("ConstrainDevices") {
                continue;
            }
            if operator {
                return None;
            }
            value = if ["yes", "up", "true", "1"].iter().any(|t| v.eq_ignore_ascii_case(t)) {
                Some(true)
            } else if ["no", "down", "false", "0"].iter().any(|f| v.eq_ignore_ascii_case(f)) {
                Some(false)
            } else {
                None
            };
        }
    }
    value
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
    fn only_task_cgroup_with_constrain_devices_can_constrain_a_tasks_gpus() {
        let yes = "CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainDevices=yes\n";
        let no = "CgroupPlugin=autodetect\nConstrainCores=yes  # devices left alone\n";
        // No task/cgroup: nothing constrains devices, whatever cgroup.conf says.
        assert!(!constraint_possible(Some("task/affinity"), Some(yes)));
        assert!(!constraint_possible(Some("task/none"), None));
        assert!(!constraint_possible(Some(""), None), "none (NULL from 23.11)");
        // task/cgroup: as cgroup.conf says; unread, it can.
        assert!(constraint_possible(Some("task/affinity,task/cgroup"), Some(yes)));
        assert!(constraint_possible(Some("task/cgroup"), Some("constraindevices=True")));
        assert!(constraint_possible(Some("cgroup,affinity"), Some(yes)), "Slurm's own test: the word");
        assert!(!constraint_possible(Some("task/cgroup, task/affinity"), Some(no)));
        assert!(!constraint_possible(Some("task/cgroup"), Some("ConstrainDevices=no")));
        assert!(constraint_possible(Some("task/cgroup"), None), "cgroup.conf not read");
        assert!(constraint_possible(None, Some(no)), "the task plugin not known");
        // What the parser cannot be sure of: probe.
        assert!(constraint_possible(Some("task/cgroup"), Some("Include /etc/slurm/cgroup.d/gpu.conf\n")));
        assert!(constraint_possible(Some("task/cgroup"), Some("ConstrainDevices=maybe")));
    }

    #[test]
    fn a_null_task_plugin_is_none_from_23_11() {
        let v = |major: u32, minor: u32| (major << 16) | (minor << 8);
        assert_eq!(task_plugin_in_force(None, v(24, 11)), Some(""));
        assert_eq!(task_plugin_in_force(None, v(23, 11)), Some(""));
        assert_eq!(task_plugin_in_force(None, v(22, 5)), None, "not loaded: cannot tell");
        assert_eq!(task_plugin_in_force(Some("task/affinity"), v(22, 5)), Some("task/affinity"));
    }

    #[test]
    fn constrain_devices_reads_as_slurms_parser() {
        assert_eq!(constrain_devices(""), Some(false), "off by default");
        assert_eq!(constrain_devices("ConstrainDevices=yes"), Some(true));
        assert_eq!(
            constrain_devices("ConstrainCores=yes ConstrainDevices=1 ConstrainRAMSpace=no"),
            Some(true)
        );
        assert_eq!(constrain_devices("#ConstrainDevices=yes\nConstrainCores=yes"), Some(false), "a comment");
        assert_eq!(
            constrain_devices("ConstrainDevices=yes\nConstrainDevices=NO"),
            Some(false),
            "the last wins"
        );
        assert_eq!(constrain_devices("CONSTRAINDEVICES=\"yes\""), Some(true));
        assert_eq!(constrain_devices("ConstrainDevices=Up"), Some(true));
        // Spaces around `=`, as keyvalue_pattern allows.
        assert_eq!(constrain_devices("ConstrainDevices = yes"), Some(true));
        assert_eq!(constrain_devices("  ConstrainCores=yes ConstrainDevices =yes # GPUs"), Some(true));
        assert_eq!(constrain_devices("ConstrainDevices= \"true\""), Some(true));
        // `\#` is a `#`, not a comment: what follows it is read.
        assert_eq!(constrain_devices("CgroupMountpoint=/sys/fs/cg\\#1 ConstrainDevices=yes"), Some(true));
        // What Slurm's parser would read otherwise or refuse: cannot tell.
        assert_eq!(constrain_devices("ConstrainDevices=on"), None, "slurmd refuses it");
        assert_eq!(constrain_devices("ConstrainDevices+=yes"), None);
        assert_eq!(constrain_devices("ConstrainDevices yes"), None);
        assert_eq!(constrain_devices("ConstrainDevices=\"yes"), None);
        assert_eq!(constrain_devices("include gpu.conf"), None);
        assert_eq!(constrain_devices("  Include gpu.conf"), None);
        // A line of another key that is not pairs says nothing of devices.
        assert_eq!(constrain_devices("ConstrainCores yes\nConstrainDevices=no"), Some(false));
    }

    #[test]
    fn device_files_are_nvidia_minor() {
        assert_eq!(device_path("/dev", 3), "/dev/nvidia3");
        assert_eq!(device_path("/tmp/lab/cdev/", 0), "/tmp/lab/cdev/nvidia0");
        assert_eq!(device_name(7), "nvidia7");
    }
}
