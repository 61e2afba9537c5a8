//! [`Handle`]: the [`Spank`] and [`Node`] implementations over a real
//! `spank_t`, for the duration of one hook call, with the C helpers only
//! they use. Part of the FFI module: every `unsafe` block has its `SAFETY`
//! note.

use std::ffi::{CString, c_char, c_int};
use std::io::{self, Write as _};
use std::ptr;
use std::sync::OnceLock;

use slurm_formats::cpuset::CpuSet;
use slurm_sys as sys;
use task_plan::devices::Access;
use task_plan::options::UserOption;
use task_plan::rdzv::container::{MountNs, PyxisOption};

use super::{current_context, foreign_slot, log, opt_cstr, option_slot, plugstack_args};
use crate::spank::{CType, Context, Item, Level, Node, Spank, SpankError};

/// A real SPANK handle, valid for the duration of one hook call.
pub(super) struct Handle {
    pub(super) sp: sys::spank_t,
}

fn spank_error(call: &'static str, code: sys::spank_err_t) -> SpankError {
    // SAFETY: spank_strerror returns a pointer to a static string (or NULL).
    let text = unsafe { opt_cstr(sys::spank_strerror(code)) };
    SpankError { call, code, text: text.unwrap_or_else(|| "unknown error".to_owned()) }
}

impl Spank for Handle {
    fn context(&self) -> Context {
        current_context()
    }

    fn register_option(&mut self, option: UserOption) -> Result<(), SpankError> {
        // SAFETY: `self.sp` is the handle of the running hook; the option
        // struct and its strings live for the rest of the process.
        let rc = unsafe { sys::spank_option_register(self.sp, option_slot(option)) };
        if rc == sys::ESPANK_SUCCESS { Ok(()) } else { Err(spank_error("spank_option_register", rc)) }
    }

    fn option_arg(&self, option: UserOption) -> Result<Option<String>, SpankError> {
        let mut arg: *mut c_char = ptr::null_mut();
        // SAFETY: valid handle, registered option struct, and a valid out pointer.
        let rc = unsafe { sys::spank_option_getopt(self.sp, option_slot(option), &mut arg) };
        match rc {
            sys::ESPANK_SUCCESS => {
                // SAFETY: on success `arg` is NULL or a string owned by Slurm,
                // valid at least until the hook returns; we copy it at once.
                Ok(Some(unsafe { opt_cstr(arg) }.unwrap_or_default()))
            }
            sys::ESPANK_ERROR => Ok(None),
            // slurmstepd's init_post_opt: getopt is not available there, but
            // the callbacks of every option given have run just before.
            sys::ESPANK_NOT_AVAIL if current_context() == Context::Remote => {
                Ok(GIVEN[option_index(option)].get().map(|arg| arg.clone().unwrap_or_default()))
            }
            code => Err(spank_error("spank_option_getopt", code)),
        }
    }

    /// pyxis's option as slurmstepd's option cache holds it. In slurmstepd a
    /// SPANK option of any plugin arrives in the launch request's job options
    /// (`NAME:PLUGIN`, srun's `spank_set_remote_options`), or for a batch
    /// step in the job's environment as `_SLURM_SPANK_OPTION_<plugin>_<option>`,
    /// each character of both names that is not alphanumeric made `_`
    /// (`_opt_env_name`, `_canonical_char`: pyxis's `--container-image` is
    /// `_SLURM_SPANK_OPTION_pyxis_container_image`; srun and sbatch set it
    /// from `spank_init_post_opt`, `_option_setenv`). slurmstepd's
    /// `spank_init` hands either to the plugin's callback and then removes
    /// every such variable from the job's environment
    /// (`spank_stack_post_opt` → `spank_clear_remote_options_env`), before
    /// any `user_init`: `spank_getenv` never sees it there. What stays is the
    /// stack's option cache, and `spank_option_getopt` looks an option up in
    /// it by name alone (`_opt_by_name`), whichever plugin registered it,
    /// answering its argument once its callback took it (`_do_option_cb`
    /// sets `found`). All of this is src/common/plugstack.c in 22.05 and
    /// src/common/spank.c since (the same functions in both). A Slurm that
    /// matched the plugin as well would answer "not given": the plugin then
    /// says nothing, as before. A name not found caches an entry of this
    /// plugin's own, which no other plugin sees.
    fn foreign_option(&self, option: PyxisOption) -> Result<Option<String>, SpankError> {
        let Some(slot) = foreign_slot(option) else { return Ok(None) };
        let mut arg: *mut c_char = ptr::null_mut();
        // SAFETY: valid handle, an option struct that lives for the rest of the
        // process (Slurm copies it when it caches one), and a valid out pointer.
        let rc = unsafe { sys::spank_option_getopt(self.sp, slot, &mut arg) };
        match rc {
            // SAFETY: on success `arg` is NULL or a string owned by Slurm, valid
            // at least until the hook returns; we copy it at once.
            sys::ESPANK_SUCCESS => Ok(Some(unsafe { opt_cstr(arg) }.unwrap_or_default())),
            sys::ESPANK_ERROR => Ok(None),
            code => Err(spank_error("spank_option_getopt", code)),
        }
    }

    fn setenv(&mut self, name: &str, value: &str, overwrite: bool) -> Result<bool, SpankError> {
        let invalid = |_| SpankError {
            call: "spank_setenv",
            code: sys::ESPANK_BAD_ARG,
            text: "NUL in name or value".into(),
        };
        let name = CString::new(name).map_err(invalid)?;
        let value = CString::new(value).map_err(invalid)?;
        // SAFETY: valid handle and NUL-terminated strings that outlive the call;
        // Slurm copies them.
        let rc = unsafe { sys::spank_setenv(self.sp, name.as_ptr(), value.as_ptr(), c_int::from(overwrite)) };
        match rc {
            sys::ESPANK_SUCCESS => Ok(true),
            sys::ESPANK_ENV_EXISTS => Ok(false),
            code => Err(spank_error("spank_setenv", code)),
        }
    }

    fn unsetenv(&mut self, name: &str) -> Result<(), SpankError> {
        let name = CString::new(name).map_err(|_| SpankError {
            call: "spank_unsetenv",
            code: sys::ESPANK_BAD_ARG,
            text: "NUL in name".into(),
        })?;
        // SAFETY: valid handle and a NUL-terminated name that outlives the call.
        let rc = unsafe { sys::spank_unsetenv(self.sp, name.as_ptr()) };
        if rc == sys::ESPANK_SUCCESS { Ok(()) } else { Err(spank_error("spank_unsetenv", rc)) }
    }

    fn srun_env(&mut self, name: &str, value: Option<&str>) -> io::Result<()> {
        if current_context() != Context::Local {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "srun's environment outside srun"));
        }
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "NUL or '=' in an environment name");
        if name.is_empty() || name.contains('=') {
            return Err(invalid());
        }
        let name = CString::new(name).map_err(|_| invalid())?;
        let value = value.map(CString::new).transpose().map_err(|_| invalid())?;
        // SAFETY: NUL-terminated strings that outlive the call; setenv/unsetenv
        // copy them. This runs only in srun's local_user_init, the hook after
        // which srun itself reads `environ` into the step's environment
        // (srun_job.c pre_launch_srun_job); srun's own code changes its
        // environment the same way (setenvf), and no thread of the plugin's
        // reads it meanwhile.
        let rc = unsafe {
            match &value {
                Some(v) => libc::setenv(name.as_ptr(), v.as_ptr(), 1),
                None => libc::unsetenv(name.as_ptr()),
            }
        };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    fn log(&self, level: Level, message: &str) {
        log(level, message);
    }

    fn item(&self, item: Item) -> Result<u32, SpankError> {
        let code = match item {
            Item::JobId => sys::S_JOB_ID,
            Item::StepId => sys::S_JOB_STEPID,
            Item::NNodes => sys::S_JOB_NNODES,
            Item::NodeId => sys::S_JOB_NODEID,
            Item::LocalTaskCount => sys::S_JOB_LOCAL_TASK_COUNT,
            Item::TotalTaskCount => sys::S_JOB_TOTAL_TASK_COUNT,
            Item::StepCpusPerTask => sys::S_STEP_CPUS_PER_TASK,
            Item::TaskId => sys::S_TASK_ID,
            Item::TaskGlobalId => sys::S_TASK_GLOBAL_ID,
            Item::JobUid => sys::S_JOB_UID,
        };
        let check =
            |rc| if rc == sys::ESPANK_SUCCESS { Ok(()) } else { Err(spank_error("spank_get_item", rc)) };
        // The out pointer's type comes from `Item::c_type`, which a unit test
        // checks against spank.h: a smaller type would let Slurm write past it.
        match item.c_type() {
            CType::Int => {
                let mut v: c_int = -1;
                // SAFETY: this item takes an `int *` (Item::c_type); `v` outlives the call.
                check(unsafe { sys::spank_get_item(self.sp, code, &raw mut v) })?;
                u32::try_from(v).map_err(|_| spank_error("spank_get_item", sys::ESPANK_ERROR))
            }
            CType::U32 => {
                let mut v: u32 = 0;
                // SAFETY: this item takes a `uint32_t *` (Item::c_type); `v` outlives the call.
                check(unsafe { sys::spank_get_item(self.sp, code, &raw mut v) })?;
                Ok(v)
            }
            CType::Uid => {
                let mut v: libc::uid_t = libc::uid_t::MAX;
                // SAFETY: this item takes a `uid_t *` (Item::c_type); `v` outlives the call.
                check(unsafe { sys::spank_get_item(self.sp, code, &raw mut v) })?;
                Ok(v)
            }
        }
    }

    fn getenv(&self, name: &str) -> Result<Option<String>, SpankError> {
        let Ok(cname) = CString::new(name) else { return Ok(None) };
        // Most values fit on the stack: in a task just forked, every heap page
        // written is a page fault, and task_init reads a few dozen variables.
        let mut small = [0u8; 512];
        let mut big = Vec::new();
        let mut len = small.len();
        loop {
            let buf: &mut [u8] = if len == small.len() { &mut small } else { big.as_mut_slice() };
            let c_len = c_int::try_from(buf.len()).unwrap_or(c_int::MAX);
            // SAFETY: valid handle, NUL-terminated name, and a buffer of `c_len` bytes
            // that Slurm fills with a NUL-terminated value (truncating when short).
            let rc = unsafe { sys::spank_getenv(self.sp, cname.as_ptr(), buf.as_mut_ptr().cast(), c_len) };
            match rc {
                sys::ESPANK_SUCCESS => {
                    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
                    return Ok(Some(
                        String::from_utf8_lossy(buf.get(..end).unwrap_or_default()).into_owned(),
                    ));
                }
                sys::ESPANK_ENV_NOEXIST => return Ok(None),
                sys::ESPANK_NOSPACE if len < MAX_ENV_VALUE => {
                    len *= 8;
                    big = vec![0u8; len];
                }
                code => return Err(spank_error("spank_getenv", code)),
            }
        }
    }

    fn command(&self) -> Result<Vec<String>, SpankError> {
        let mut argc: c_int = 0;
        let mut argv: *mut *mut c_char = ptr::null_mut();
        // SAFETY: S_JOB_ARGV takes `(int *, char ***)` (spank.h); both out
        // pointers are valid locals that outlive the call. Slurm keeps
        // ownership of the array.
        let rc = unsafe { sys::spank_get_item(self.sp, sys::S_JOB_ARGV, &raw mut argc, &raw mut argv) };
        if rc != sys::ESPANK_SUCCESS {
            return Err(spank_error("spank_get_item", rc));
        }
        // Far more words than any real command line: a bound on what is copied.
        let argc = argc.clamp(0, 4096);
        // SAFETY: on success Slurm's `argv` holds `argc` pointers to
        // NUL-terminated strings (or is NULL), valid for this hook call;
        // plugstack_args copies them at once and checks for NULL.
        Ok(unsafe { plugstack_args(argc, argv) })
    }

    fn step_first_tasks(&self, job_id: u32, step_id: u32) -> Result<Vec<u32>, String> {
        // SAFETY: slurm_step_id_t is plain integers (and, from 24.11, a
        // 64-bit sluid, 0 when unknown): all zero bytes is a valid value.
        let mut id: sys::slurm_step_id_t = unsafe { std::mem::zeroed() };
        id.job_id = job_id;
        id.step_id = step_id;
        id.step_het_comp = sys::NO_VAL;
        // SAFETY: `id` is valid for the call, which copies it; the result is
        // NULL or a layout the caller owns (freed below). The symbol is
        // libslurm's, resolved from the srun that loaded the plugin.
        let layout = unsafe { sys::slurm_job_step_layout_get(&raw mut id) };
        if layout.is_null() {
            let code = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(format!("slurm_job_step_layout_get({job_id}.{step_id}) failed (Slurm error {code})"));
        }
        // SAFETY: a non-NULL layout from slurm_job_step_layout_get, not freed yet.
        let first = unsafe { first_tasks(&*layout) };
        // SAFETY: the layout came from slurm_job_step_layout_get and is freed once.
        unsafe { sys::slurm_job_step_layout_free(layout) };
        first
    }

    fn srun_topology(&self) -> Result<task_plan::layout::TopologyConf, String> {
        let conf = loaded_slurm_conf()?;
        // SAFETY: the strings of a loaded configuration are NULL or NUL-terminated.
        let (path, plugin) = unsafe { (opt_cstr(conf.slurm_conf), opt_cstr(conf.topology_plugin)) };
        let Some(path) = path else { return Err("srun's configuration is not loaded".into()) };
        let yaml = std::path::Path::new(&path).with_file_name("topology.yaml");
        Ok(task_plan::layout::TopologyConf {
            plugin: plugin.unwrap_or_default(),
            no_dist_topo_block: conf.select_type_param & task_plan::layout::SELECT_NO_DIST_TOPO_BLOCK != 0,
            topology_yaml: yaml.exists(),
        })
    }

    fn stepd_conf(&self) -> Result<crate::spank::StepdConf, String> {
        let conf = loaded_slurm_conf()?;
        // SAFETY: the strings of a loaded configuration are NULL or NUL-terminated.
        let (path, task_plugin, cluster, plugstack) = unsafe {
            (
                opt_cstr(conf.slurm_conf),
                opt_cstr(conf.task_plugin),
                opt_cstr(conf.cluster_name),
                opt_cstr(conf.plugstack),
            )
        };
        // Every loaded configuration names its cluster (slurmd sends it with the
        // rest); NULL: nothing is loaded, and a NULL task plugin says nothing.
        if cluster.is_none() {
            return Err("slurmstepd's configuration is not loaded".into());
        }
        Ok(crate::spank::StepdConf { task_plugin, path, plugstack })
    }

    fn task_stderr(&self, line: &str) {
        // In task hooks fd 2 is the task's stderr. A failed write is not worth failing a task for.
        let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
    }

    fn pause(&self, how_long: std::time::Duration) {
        // In the forked task: this thread is the process's only one.
        std::thread::sleep(how_long);
    }
}

/// The plugin's options as slurmstepd's callbacks received them (the user
/// gave them), for `init_post_opt`, where `spank_option_getopt` answers
/// `ESPANK_NOT_AVAIL` (22.05 lab: "Item not available from this callback").
/// Set once per process; a second callback for the same option keeps the first.
static GIVEN: [OnceLock<Option<String>>; UserOption::ALL.len()] =
    [const { OnceLock::new() }; UserOption::ALL.len()];

fn option_index(option: UserOption) -> usize {
    UserOption::ALL.iter().position(|o| *o == option).unwrap_or(0)
}

/// Keeps what slurmstepd's option callback got (see [`GIVEN`]).
pub(super) fn given_in_slurmstepd(option: UserOption, arg: Option<&str>) {
    let _ = GIVEN[option_index(option)].set(arg.map(str::to_owned));
}

impl Node for Handle {
    type DevDir = crate::sysio::DevDir;
    type RunDir = crate::sysio::RunDir;

    fn open_run_dir(&self, path: &str, lock: bool) -> io::Result<crate::sysio::RunDir> {
        crate::sysio::open_run_dir(path, lock)
    }

    fn run_dir_lock_missed(&self, dir: &crate::sysio::RunDir) -> bool {
        dir.lock_missed()
    }

    fn run_dir_names(&self, dir: &crate::sysio::RunDir) -> io::Result<Vec<String>> {
        crate::sysio::run_dir_names(dir)
    }

    fn run_dir_read(&self, dir: &crate::sysio::RunDir, name: &str, max_bytes: usize) -> io::Result<String> {
        crate::sysio::run_dir_read(dir, name, max_bytes)
    }

    fn run_dir_write(&mut self, dir: &crate::sysio::RunDir, name: &str, text: &str) -> io::Result<()> {
        crate::sysio::run_dir_write(dir, name, text)
    }

    fn run_dir_remove(&mut self, dir: &crate::sysio::RunDir, name: &str) -> io::Result<()> {
        crate::sysio::run_dir_remove(dir, name)
    }

    fn probe_port(&self, port: u16) -> io::Result<()> {
        crate::sysio::probe_port(port)
    }

    fn sysctl(&self, key: &'static str) -> Option<String> {
        std::fs::read_to_string(format!("/proc/sys/{key}")).ok()
    }

    fn read_trusted(&self, path: &str, max_bytes: usize) -> io::Result<String> {
        crate::sysio::read_trusted(path, max_bytes)
    }

    fn dir_names(&self, dir: &str) -> io::Result<Vec<String>> {
        Ok(std::fs::read_dir(dir)?.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
    }

    fn process_env(&self, name: &'static str) -> Option<String> {
        // The process environment: slurmstepd keeps the job's apart (spank_getenv).
        std::env::var(name).ok()
    }

    fn device_access(&self, path: &str) -> Access {
        let Ok(c_path) = CString::new(path) else { return Access::Unknown };
        // SAFETY: `c_path` is a NUL-terminated string that outlives the call;
        // access(2) only reads it. R_OK alone: the device cgroup's check runs
        // with the file's mode check (inode_permission), and read is what the
        // mode is least likely to refuse.
        let rc = unsafe { libc::access(c_path.as_ptr(), libc::R_OK) };
        let errno = (rc != 0).then(|| io::Error::last_os_error().raw_os_error().unwrap_or(-1));
        Access::from_errno(errno, false)
    }

    fn open_dev_dir(&self, path: &str) -> io::Result<crate::sysio::DevDir> {
        crate::sysio::open_dev_dir(path)
    }

    fn device_access_at(&self, dir: &crate::sysio::DevDir, name: &str) -> Option<Access> {
        crate::sysio::device_access_at(dir, name)
    }

    fn mount_ns(&self) -> io::Result<MountNs> {
        crate::sysio::mount_ns()
    }

    fn interfaces(&self) -> io::Result<Vec<task_plan::netif::Interface>> {
        crate::sysio::interfaces()
    }

    fn user_home(&self, uid: u32) -> io::Result<String> {
        node_info::home_of(uid)
    }

    fn read_user_file(&self, path: &str, max_bytes: usize, uid: u32) -> io::Result<String> {
        crate::sysio::read_user_file(path, max_bytes, uid)
    }

    fn affinity(&self) -> io::Result<CpuSet> {
        let mut words = vec![0u64; AFFINITY_WORDS];
        let bytes = AFFINITY_WORDS * 8;
        // SAFETY: the buffer holds `bytes` bytes, a multiple of the kernel's
        // word size; sched_getaffinity writes at most that many. A u64 array
        // has the layout of the kernel's unsigned-long mask on 64-bit Linux.
        let rc = unsafe { libc::sched_getaffinity(0, bytes, words.as_mut_ptr().cast::<libc::cpu_set_t>()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("sched_getaffinity: {e}")));
        }
        Ok(CpuSet::from_words(&words))
    }

    fn set_affinity(&mut self, cpus: &CpuSet) -> io::Result<()> {
        let words = cpus.to_words(AFFINITY_WORDS);
        if words.len() > AFFINITY_WORDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {} is beyond the {} CPUs the plugin binds", cpus, AFFINITY_WORDS * 64),
            ));
        }
        // SAFETY: `words` holds AFFINITY_WORDS u64s (checked above); the kernel
        // only reads the mask.
        let rc = unsafe {
            libc::sched_setaffinity(0, AFFINITY_WORDS * 8, words.as_ptr().cast::<libc::cpu_set_t>())
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("sched_setaffinity({cpus}): {e}")));
        }
        Ok(())
    }

    fn prefer_memory(&mut self, nodes: &[u32]) -> io::Result<()> {
        const MPOL_PREFERRED: libc::c_long = 1;
        let Some(&node) = nodes.first() else { return Ok(()) };
        let mask: CpuSet = std::iter::once(node).collect();
        let words = mask.to_words(1);
        let maxnode = libc::c_ulong::try_from(words.len() * 64 + 1).unwrap_or(65);
        // SAFETY: set_mempolicy(mode, nodemask, maxnode) reads `maxnode - 1`
        // bits of the mask, all inside `words`.
        let rc = unsafe { libc::syscall(libc::SYS_set_mempolicy, MPOL_PREFERRED, words.as_ptr(), maxnode) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("set_mempolicy(preferred {node}): {e}")));
        }
        Ok(())
    }
}

/// CPU mask size the plugin reads and writes: 8192 CPUs.
const AFFINITY_WORDS: usize = 128;

/// The longest environment value the plugin reads (a 1 MiB node list is
/// already absurd).
const MAX_ENV_VALUE: usize = 1 << 20;

/// libslurm's `slurm_conf` in this process (srun's, slurmstepd's), read in
/// place.
///
/// # Errors
/// The process has no such symbol.
fn loaded_slurm_conf() -> Result<&'static sys::slurm_conf_t, String> {
    // SAFETY: dlsym only looks a name up; RTLD_DEFAULT searches the
    // process's global scope (srun's or slurmstepd's libslurmfull), and the
    // name is a NUL-terminated literal. NULL: no such symbol in this process.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"slurm_conf".as_ptr()) };
    if sym.is_null() {
        return Err("this process has no slurm_conf".into());
    }
    // SAFETY: libslurm's `slurm_conf` (read_config.c) is a `slurm_conf_t` of
    // the release the plugin was built for: Slurm refuses to load a plugin
    // whose plugin_version is another's. srun fills it when it reads its
    // configuration, before option parsing, and slurmstepd when slurmd hands
    // it over, before any plugin loads; both only read it afterwards, and it
    // lives as long as the process. It is read in place, not copied.
    Ok(unsafe { &*sym.cast::<sys::slurm_conf_t>() })
}

/// The lowest task id of each node of a step's layout (`u32::MAX` for a node
/// with none), in node-index order.
///
/// # Safety
/// `layout` is a layout libslurm filled (slurm.h): `tasks` and `tids` are
/// NULL or hold `node_cnt` entries, and each `tids[i]` is NULL or holds
/// `tasks[i]` ids.
unsafe fn first_tasks(layout: &sys::slurm_step_layout_t) -> Result<Vec<u32>, String> {
    let nodes = layout.node_cnt as usize;
    if nodes == 0 || nodes > MAX_LAYOUT_NODES || layout.tasks.is_null() || layout.tids.is_null() {
        return Err(format!("the step's layout has {nodes} nodes and no task map"));
    }
    // SAFETY: both arrays hold `node_cnt` entries (the caller's contract).
    let (tasks, tids) = unsafe {
        (std::slice::from_raw_parts(layout.tasks, nodes), std::slice::from_raw_parts(layout.tids, nodes))
    };
    Ok(tasks
        .iter()
        .zip(tids)
        .map(|(&count, &ids)| {
            if ids.is_null() || count == 0 {
                return u32::MAX;
            }
            // SAFETY: `tids[i]` holds `tasks[i]` ids (the caller's contract).
            let ids = unsafe { std::slice::from_raw_parts(ids, usize::from(count)) };
            ids.iter().copied().min().unwrap_or(u32::MAX)
        })
        .collect())
}

/// More nodes than any step has: a bound on what is read of a layout.
const MAX_LAYOUT_NODES: usize = 1 << 20;
