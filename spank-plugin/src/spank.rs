//! The seams between the hooks and the world: [`Spank`], the SPANK calls the
//! plugin makes, and [`Node`], what it asks of the node itself (CPU masks,
//! trusted files, a port probe, the GPU device files).

use std::fmt;
use std::io;

use slurm_formats::cpuset::CpuSet;
use task_plan::devices::Access;
use task_plan::options::UserOption;
use task_plan::rdzv::container::{MountNs, PyxisOption};

/// Where the plugin is running, from `spank_context()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// srun.
    Local,
    /// slurmstepd: the step's tasks.
    Remote,
    /// sbatch or salloc.
    Allocator,
    /// slurmd itself.
    Slurmd,
    /// prolog or epilog.
    JobScript,
    /// Slurm could not tell.
    Unknown,
}

impl Context {
    /// Whether a user error here fails only a submit (srun, sbatch, salloc)
    /// rather than something already running.
    pub fn is_submit(self) -> bool {
        matches!(self, Context::Local | Context::Allocator)
    }
}

/// Severity of a log line. Slurm decides, from its own settings, which it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something is wrong and someone should act.
    Error,
    /// Normal, useful information.
    Info,
    /// What only someone debugging wants (`sbatch -v`, `SlurmdDebug=debug`).
    Debug,
}

impl Level {
    /// The Slurm log level a line of this level is written at in `ctx`.
    ///
    /// In slurmstepd (the remote context, batch step included) Slurm copies
    /// every line at its error level to the job's own stderr once the step's
    /// I/O is set up (slurmstepd mgr.c `_slurmd_job_log_init`: the stderr level
    /// becomes `LOG_LEVEL_ERROR` plus srun's `-v` count, and stderr becomes task
    /// 0's), on every release. The plugin's own trouble must never reach the
    /// job's output as an error, so there its lines go at info level: into the
    /// slurmd log (at `SlurmdDebug=info`, Slurm's default, or above), not into
    /// the job's output unless the user asked Slurm for it (`srun -v`). What a
    /// user should see goes to the task's stderr, through `task_stderr`.
    /// Everywhere else (srun, sbatch, salloc, slurmd) the level is kept.
    pub fn in_context(self, ctx: Context) -> Level {
        if ctx == Context::Remote && self == Level::Error { Level::Info } else { self }
    }
}

/// A SPANK call that failed, with Slurm's error code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpankError {
    /// The SPANK function.
    pub call: &'static str,
    /// Its `spank_err_t` return value.
    pub code: u32,
    /// `spank_strerror()` of the code, where Slurm had one.
    pub text: String,
}

impl fmt::Display for SpankError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}() failed: {} (code {})", self.call, self.text, self.code)
    }
}

impl std::error::Error for SpankError {}

/// A numeric SPANK item (`spank_get_item`) the plugin reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// `S_JOB_ID`.
    JobId,
    /// `S_JOB_STEPID`.
    StepId,
    /// `S_JOB_NNODES`: nodes in the step.
    NNodes,
    /// `S_JOB_NODEID`: this node's index in the step.
    NodeId,
    /// `S_JOB_LOCAL_TASK_COUNT`.
    LocalTaskCount,
    /// `S_JOB_TOTAL_TASK_COUNT`.
    TotalTaskCount,
    /// `S_STEP_CPUS_PER_TASK`.
    StepCpusPerTask,
    /// `S_TASK_ID`: the task's local id (task hooks only).
    TaskId,
    /// `S_TASK_GLOBAL_ID`: the task's rank in the step (task hooks only).
    TaskGlobalId,
    /// `S_JOB_UID`: the job's user, whose passwd home `~/.nccl.conf` is in.
    JobUid,
}

/// The C type an item's out pointer points to, as `spank.h` documents it.
/// Passing a pointer to a smaller type lets Slurm write past it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CType {
    /// `uint32_t *`.
    U32,
    /// `int *`.
    Int,
    /// `uid_t *`.
    Uid,
}

impl CType {
    /// The type as `spank.h` spells it.
    pub const fn c_name(self) -> &'static str {
        match self {
            CType::U32 => "uint32_t",
            CType::Int => "int",
            CType::Uid => "uid_t",
        }
    }
}

impl Item {
    /// Every item the plugin reads.
    pub const ALL: [Item; 10] = [
        Item::JobId,
        Item::StepId,
        Item::NNodes,
        Item::NodeId,
        Item::LocalTaskCount,
        Item::TotalTaskCount,
        Item::StepCpusPerTask,
        Item::TaskId,
        Item::TaskGlobalId,
        Item::JobUid,
    ];

    /// The item's name in `spank.h`.
    pub const fn c_name(self) -> &'static str {
        match self {
            Item::JobId => "S_JOB_ID",
            Item::StepId => "S_JOB_STEPID",
            Item::NNodes => "S_JOB_NNODES",
            Item::NodeId => "S_JOB_NODEID",
            Item::LocalTaskCount => "S_JOB_LOCAL_TASK_COUNT",
            Item::TotalTaskCount => "S_JOB_TOTAL_TASK_COUNT",
            Item::StepCpusPerTask => "S_STEP_CPUS_PER_TASK",
            Item::TaskId => "S_TASK_ID",
            Item::TaskGlobalId => "S_TASK_GLOBAL_ID",
            Item::JobUid => "S_JOB_UID",
        }
    }

    /// The type of the item's out pointer. The FFI module reads every item
    /// through this, and a test checks it against the installed `spank.h`.
    pub const fn c_type(self) -> CType {
        match self {
            Item::TaskId => CType::Int,
            Item::JobUid => CType::Uid,
            _ => CType::U32,
        }
    }
}

/// The SPANK calls the hooks make. The real implementation wraps a `spank_t`
/// handle; tests use a fake.
pub trait Spank {
    /// The context the plugin runs in.
    fn context(&self) -> Context;

    /// Makes `option` known to Slurm (shown in `--help`, accepted on `#SBATCH`
    /// lines). Only valid in `slurm_spank_init`.
    ///
    /// # Errors
    /// Slurm refused the registration.
    fn register_option(&mut self, option: UserOption) -> Result<(), SpankError>;

    /// The argument `option` was given with: `None` when the user did not give
    /// the option, `Some("")` when it was given without `=`.
    ///
    /// # Errors
    /// Slurm could not answer in this context.
    fn option_arg(&self, option: UserOption) -> Result<Option<String>, SpankError>;

    /// The argument another plugin's option was given with, by the option's
    /// name: pyxis's (`--container-image`, `--container-name`,
    /// `--container-env`), in slurmstepd. `None` when the option was not
    /// given, or no plugin of the stack registers it. Such an option does not
    /// reach `user_init` through the job's environment: see the real
    /// implementation for where Slurm puts it.
    ///
    /// # Errors
    /// Slurm could not answer in this context.
    fn foreign_option(&self, option: PyxisOption) -> Result<Option<String>, SpankError>;

    /// Sets `name=value` in the job's (remote) environment. With
    /// `overwrite == false` an existing value is kept and `Ok(false)` returned.
    ///
    /// # Errors
    /// Slurm refused the call (wrong context, bad name).
    fn setenv(&mut self, name: &str, value: &str, overwrite: bool) -> Result<bool, SpankError>;

    /// Removes `name` from the job's (remote) environment (a value the
    /// plugin set in an enclosing step that it does not set in this one).
    ///
    /// # Errors
    /// Slurm refused the call (wrong context, bad name).
    fn unsetenv(&mut self, name: &str) -> Result<(), SpankError>;

    /// srun only (`local_user_init`): sets (`Some`) or removes (`None`)
    /// `name` in srun's own environment, which srun merges into the step's
    /// environment right after the hook (srun_job.c `pre_launch_srun_job`);
    /// `spank_setenv` is refused there (remote context only).
    ///
    /// # Errors
    /// The name or value holds a NUL or `=`, or the C library refused.
    fn srun_env(&mut self, name: &str, value: Option<&str>) -> Result<(), std::io::Error>;

    /// Writes one line to Slurm's log, with the plugin's prefix.
    fn log(&self, level: Level, message: &str);

    /// A numeric item of the job, step or task.
    ///
    /// # Errors
    /// Slurm has no such item in this context.
    fn item(&self, item: Item) -> Result<u32, SpankError>;

    /// A variable of the job's environment (remote context), `None` if unset.
    ///
    /// # Errors
    /// Slurm refused the call.
    fn getenv(&self, name: &str) -> Result<Option<String>, SpankError>;

    /// Writes one line to the task's stderr (task hooks only: the task's
    /// stdio is already in place). Never stdout.
    fn task_stderr(&self, line: &str);

    /// Waits a moment in the task (a task about to fail, so that slurmstepd
    /// forwards what it wrote before srun hears of the exit).
    fn pause(&self, how_long: std::time::Duration);

    /// The step's command line (`S_JOB_ARGV`: in slurmstepd the step's
    /// argv, for the batch step the script); empty when it has none.
    ///
    /// # Errors
    /// Slurm has no such item in this context.
    fn command(&self) -> Result<Vec<String>, SpankError>;

    /// srun only (`local_user_init`): each node's lowest task id in step
    /// `job_id.step_id`, in node-index order (`u32::MAX` for a node with no
    /// task), from slurmctld's layout of the step (`slurm_job_step_layout_get`,
    /// one RPC).
    ///
    /// # Errors
    /// slurmctld did not answer, or the layout is not one.
    fn step_first_tasks(&self, job_id: u32, step_id: u32) -> Result<Vec<u32>, String>;

    /// srun only (`local_user_init`): what srun's own configuration says
    /// about laying tasks out by topology, from libslurm's `slurm_conf`
    /// (read from `slurm.conf` when srun started; no RPC).
    ///
    /// # Errors
    /// The process has no `slurm_conf` (not srun), or it is not loaded yet.
    fn srun_topology(&self) -> Result<task_plan::layout::TopologyConf, String>;

    /// slurmstepd (`user_init`): what its own configuration says, from
    /// libslurm's `slurm_conf` as slurmd handed it over (no file is read).
    ///
    /// # Errors
    /// The process has no `slurm_conf`, or it is not loaded.
    fn stepd_conf(&self) -> Result<StepdConf, String>;
}

/// What slurmstepd's configuration says that the plugin asks about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepdConf {
    /// `TaskPlugin` (`task/affinity,task/cgroup`); `None` for NULL: none
    /// from 23.11, where an unset or `none` one is NULL
    /// ([`task_plan::devices::task_plugin_in_force`]).
    pub task_plugin: Option<String>,
    /// The `slurm.conf` it came from, when it says (configless: slurmd's
    /// cached copy, beside which it keeps `cgroup.conf`).
    pub path: Option<String>,
    /// The plugstack file slurmstepd read (`PlugStackConfig`, else
    /// `plugstack.conf` beside slurm.conf): which plugins run before ours.
    pub plugstack: Option<String>,
}

/// What the hooks ask of the node itself, not of Slurm: CPU masks, memory
/// policy, kernel settings, trusted files, a port probe and the GPU device
/// files.
pub trait Node {
    /// The GPU device directory, opened before the tasks fork
    /// ([`Node::open_dev_dir`]): a descriptor in the real plugin, which the
    /// forked tasks inherit.
    type DevDir: fmt::Debug;

    /// A root's directory the job prolog and epilog write in, opened by
    /// [`Node::open_run_dir`].
    type RunDir: fmt::Debug;

    /// Whether this node can bind a TCP listener on `port` now; on failure, a
    /// description of the holder when it can be found (`pid 123 (python)`).
    ///
    /// # Errors
    /// The port is taken (or cannot be bound); the text says by whom.
    fn probe_port(&self, port: u16) -> Result<(), io::Error>;

    /// A kernel setting under `/proc/sys` (`net/ipv4/ip_local_port_range`).
    /// Only constant keys are passed, never user input.
    fn sysctl(&self, key: &'static str) -> Option<String>;

    /// Reads a root-owned file that only root can write, without following
    /// links (the GPU table, slurm.conf).
    ///
    /// # Errors
    /// Missing, a link, not a regular file, not root's, writable by others,
    /// or larger than `max_bytes`.
    fn read_trusted(&self, path: &str, max_bytes: usize) -> Result<String, io::Error>;

    /// The names in a root's directory (`readdir`), for an `include` of the
    /// plugstack file. Only paths from Slurm's configuration are passed.
    ///
    /// # Errors
    /// It cannot be listed; `NotFound` when it does not exist.
    fn dir_names(&self, dir: &str) -> Result<Vec<String>, io::Error>;

    /// A variable of the calling process's own environment, never the
    /// job's: slurmstepd's, which slurmd gave it (root's: `SLURM_CONF`), or
    /// srun's (`SLURM_DISTRIBUTION`, which srun sets there from `-m` before
    /// `local_user_init`). Only constant names are passed.
    fn process_env(&self, name: &'static str) -> Option<String>;

    /// Opens the root's directory `path` (a constant under `/run`, never user
    /// input), making what is missing, each component root's and not a link;
    /// with `lock`, held exclusively (waiting briefly) until dropped.
    ///
    /// # Errors
    /// A component is a link or not root's alone, or it cannot be made.
    fn open_run_dir(&self, path: &str, lock: bool) -> Result<Self::RunDir, io::Error>;

    /// Whether [`Node::open_run_dir`] wanted the lock but another held it
    /// past the wait, so this opener goes on without it.
    fn run_dir_lock_missed(&self, dir: &Self::RunDir) -> bool;

    /// The names in a run directory (hidden ones left out).
    ///
    /// # Errors
    /// It cannot be read.
    fn run_dir_names(&self, dir: &Self::RunDir) -> Result<Vec<String>, io::Error>;

    /// A root's regular file in a run directory, not through a link.
    ///
    /// # Errors
    /// Missing, not root's, a link, over `max_bytes` or unreadable.
    fn run_dir_read(&self, dir: &Self::RunDir, name: &str, max_bytes: usize) -> Result<String, io::Error>;

    /// Replaces a file of a run directory (mode 0644), never half-written.
    ///
    /// # Errors
    /// It cannot be written.
    fn run_dir_write(&mut self, dir: &Self::RunDir, name: &str, text: &str) -> Result<(), io::Error>;

    /// Removes a file of a run directory; one not there is no error.
    ///
    /// # Errors
    /// It cannot be removed.
    fn run_dir_remove(&mut self, dir: &Self::RunDir, name: &str) -> Result<(), io::Error>;

    /// Whether the calling process (the task) may reach the device file at
    /// `path` as its device cgroup says (`access(2)`: nothing is opened), see
    /// [`task_plan::devices`]. Only paths from the GPU table are passed.
    fn device_access(&self, path: &str) -> Access;

    /// Opens the directory of the GPU device files (`O_PATH | O_DIRECTORY |
    /// O_CLOEXEC`: nothing is read, and the user's program does not inherit
    /// it), once per step in slurmstepd before the tasks fork, while the
    /// process is still in the host's mount namespace. Only the plugstack
    /// line's directory is passed, never the user's.
    ///
    /// # Errors
    /// Missing, not a directory, or the kernel refused.
    fn open_dev_dir(&self, path: &str) -> Result<Self::DevDir, io::Error>;

    /// [`Node::device_access`] for the file `name` in `dir`
    /// (`faccessat(2)` relative to the directory opened before the fork):
    /// the host's device file as the task's device cgroup sees it, whichever
    /// mount namespace the task has entered since (see [`task_plan::devices`]).
    /// Only `nvidia<minor>` names from the GPU table are passed. `None`
    /// when the handle no longer names the directory it was opened on (its
    /// descriptor was another process's: `contain_spank`), so the caller
    /// looks the file up by path instead.
    fn device_access_at(&self, dir: &Self::DevDir, name: &str) -> Option<Access>;

    /// The calling process's mount namespace (`stat(2)` of
    /// `/proc/self/ns/mnt`): slurmstepd's in `user_init`, the task's in
    /// `task_init`, to tell whether a container plugin (pyxis) has moved
    /// the task into its container's since.
    ///
    /// # Errors
    /// `/proc` is not mounted or the kernel refused.
    fn mount_ns(&self) -> Result<MountNs, io::Error>;

    /// The node's network interfaces and their addresses (`getifaddrs(3)`,
    /// in its order), as the calling process's network namespace has them:
    /// slurmstepd's, the node's, in `user_init`.
    ///
    /// # Errors
    /// `getifaddrs` failed.
    fn interfaces(&self) -> Result<Vec<task_plan::netif::Interface>, io::Error>;

    /// The home directory of user `uid` in the passwd database (never
    /// `$HOME`, which the job sets), read once per step in `user_init`.
    ///
    /// # Errors
    /// No such user, or the lookup failed.
    fn user_home(&self, uid: u32) -> Result<String, io::Error>;

    /// Reads one of the user's files as the user: only in a forked task,
    /// where slurmstepd has given up root for the job's user (`uid`; refused
    /// in a process that is not that user's), opened without following a
    /// link and without blocking, a regular file, at most `max_bytes`. Only
    /// `~/.nccl.conf` in the passwd home is passed.
    ///
    /// # Errors
    /// Not running as `uid`, missing, a link, not a regular file, too large,
    /// or not readable by the user.
    fn read_user_file(&self, path: &str, max_bytes: usize, uid: u32) -> Result<String, io::Error>;

    /// The calling process's (the task's) CPU mask.
    ///
    /// # Errors
    /// The kernel refused.
    fn affinity(&self) -> Result<CpuSet, io::Error>;

    /// Binds the calling process (the task) to `cpus`.
    ///
    /// # Errors
    /// The kernel refused.
    fn set_affinity(&mut self, cpus: &CpuSet) -> Result<(), io::Error>;

    /// Prefers memory on the first of `nodes` for the calling process.
    ///
    /// # Errors
    /// The kernel refused.
    fn prefer_memory(&mut self, nodes: &[u32]) -> Result<(), io::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The installed `spank.h`, where `sys`'s build script found it.
    fn spank_h() -> String {
        let dirs: Vec<String> = std::env::var("SLURM_INCLUDE_DIR")
            .map(|d| vec![d])
            .unwrap_or_else(|_| vec!["/usr/include".into(), "/usr/local/include".into()]);
        dirs.iter()
            .find_map(|d| std::fs::read_to_string(format!("{d}/slurm/spank.h")).ok())
            .unwrap_or_else(|| panic!("slurm/spank.h not found in {dirs:?}"))
    }

    /// The out type `spank.h` documents for `item`: the comment after the
    /// enum member, `/* ... (uint32_t *) */`, possibly over several lines.
    fn documented_type(header: &str, item: &str) -> Option<String> {
        let start = header.find(&format!("    {item},"))?;
        let rest = &header[start..];
        let comment = &rest[rest.find("/*")? + 2..rest.find("*/")?];
        // Join continuation lines (` * option is used, ...`) before looking.
        let joined: String =
            comment.lines().map(|l| l.trim().trim_start_matches('*')).collect::<Vec<_>>().join(" ");
        // The first identifier followed by `*`: `(uint32_t *)`, `(int *, char ***)`.
        let words: Vec<&str> = joined.split_whitespace().collect();
        let ty = words.windows(2).find(|w| w[1].starts_with('*')).map(|w| w[0].trim_start_matches('('))?;
        Some(ty.to_owned())
    }

    #[test]
    fn slurmstepd_never_logs_at_error_level() {
        assert_eq!(Level::Error.in_context(Context::Remote), Level::Info);
        assert_eq!(Level::Info.in_context(Context::Remote), Level::Info);
        for ctx in [Context::Local, Context::Allocator, Context::Slurmd, Context::JobScript, Context::Unknown]
        {
            assert_eq!(Level::Error.in_context(ctx), Level::Error, "{ctx:?}");
        }
    }

    #[test]
    fn every_item_is_read_with_the_type_spank_h_documents() {
        let header = spank_h();
        for item in Item::ALL {
            let documented = documented_type(&header, item.c_name())
                .unwrap_or_else(|| panic!("{} is not documented in spank.h", item.c_name()));
            assert_eq!(
                documented,
                item.c_type().c_name(),
                "{}: spank.h says ({documented} *), the plugin reads a {}",
                item.c_name(),
                item.c_type().c_name()
            );
        }
    }

    #[test]
    fn the_audit_parses_multi_line_comments_and_would_catch_a_u16() {
        let header = "    S_STEP_CPUS_PER_TASK,    /* CPUs allocated per task (=1 if --overcommit\n\
                      \x20                             * option is used, uint32_t *)   */\n\
                      \x20   S_JOB_NCPUS,             /* Number of CPUs used by this job (uint16_t *) */\n";
        assert_eq!(documented_type(header, "S_STEP_CPUS_PER_TASK").as_deref(), Some("uint32_t"));
        assert_eq!(documented_type(header, "S_JOB_NCPUS").as_deref(), Some("uint16_t"));
    }
}
