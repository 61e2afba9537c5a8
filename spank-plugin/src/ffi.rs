//! The plugin's whole C boundary, and the only place with `unsafe`.
//!
//! - The symbols Slurm's plugin loader looks up: `plugin_name`, `plugin_type`
//!   (NUL-terminated arrays, used by address), `plugin_version`, and in
//!   builds for Slurm 25.05 and later `slurm_spank_init_failure_mode`.
//!   Every exported name is listed in [`crate::exports`]: add one there when
//!   adding one here (the built library is checked against that list).
//! - One `extern "C"` function per SPANK hook the plugin uses, and the option
//!   callback. Each goes through [`guard`]: `catch_unwind` plus the mapping of
//!   [`HookError`] to Slurm's return code, so no panic ever reaches C and the
//!   plugin's own faults fail nothing.
//! - [`Handle`], the [`Spank`] implementation over a real `spank_t`.
//!
//! The `spank_*` and `slurm_*` functions are resolved from the host process at
//! load time; nothing here links libslurm.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{CStr, CString, c_char, c_int};
use std::io::{self, Write as _};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Once, OnceLock};

use gpu_core::options::UserOption;
use slurm_sys as sys;

use crate::hooks::{self, HookError, StepState};
use crate::spank::{CType, Context, Item, Level, Node, Spank, SpankError};
use gpu_core::cpuset::CpuSet;
use gpu_core::devices::Access;
use gpu_core::rdzv::container::{MountNs, PYXIS_OPTIONS, PyxisOption};

/// Prefix of every log line the plugin writes.
const LOG_PREFIX: &str = "spank-gpu: ";

// ----- Symbols Slurm's plugin loader reads -------------------------------------------

/// The plugin's name. Slurm reads it by address as a C string, and uses it in
/// the environment key that carries options from sbatch to the job's steps.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static plugin_name: [u8; 10] = *b"spank_gpu\0";

/// Always "spank" for a SPANK plugin.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 6] = *b"spank\0";

/// The Slurm release the plugin was built against. Slurm loads a plugin only
/// into the same major.minor.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static plugin_version: u32 = sys::VERSION_NUMBER;

/// How Slurm 25.05 and later treat a `required` plugin whose
/// `slurm_spank_init` fails (spank.h; src/common/spank.c `_do_call_stack`
/// returns this instead of the hook's code): `ESPANK_JOB_FAILURE` fails the
/// job, where the default (`ESPANK_NODE_FAILURE`) drains the node and may
/// requeue the job. The plugin's own faults never fail `init` (the guard
/// fails open), so this only matters for what the guard cannot catch; a
/// node must never be drained for this plugin. Exported only by builds for
/// 25.05 and later (`cfg(spank_init_failure_mode)`, see build.rs).
#[cfg(spank_init_failure_mode)]
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static slurm_spank_init_failure_mode: c_int = JOB_FAILURE;

/// `ESPANK_JOB_FAILURE` as the `int` spank.h declares the symbol to be.
#[cfg(spank_init_failure_mode)]
const JOB_FAILURE: c_int = {
    let code = sys::ESPANK_JOB_FAILURE;
    assert!(code <= c_int::MAX as sys::slurm_err_t, "ESPANK_JOB_FAILURE does not fit an int");
    #[allow(clippy::cast_possible_wrap)]
    let as_int = code as c_int;
    as_int
};

// ----- Hooks -------------------------------------------------------------------------

/// Defines one exported SPANK hook that runs `$f(&mut Handle, &args)` under the guard.
macro_rules! export_hook {
    ($symbol:ident, $name:literal, $f:expr) => {
        #[doc = concat!("`", stringify!($symbol), "`, called by Slurm.")]
        ///
        /// # Safety
        /// Called by Slurm with its SPANK handle and the plugstack arguments:
        /// `av` holds `ac` NUL-terminated strings, or is NULL when `ac == 0`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $symbol(sp: sys::spank_t, ac: c_int, av: *mut *mut c_char) -> c_int {
            let start = (std::time::Instant::now(), thread_usage());
            let timed = Cell::new(false);
            let rc = guard($name, || {
                // SAFETY: Slurm passes `ac` valid C strings in `av` for the
                // duration of this call (the contract of every SPANK hook).
                let args = unsafe { plugstack_args(ac, av) };
                timed.set(gpu_core::plugstack::timing_on(&args));
                let mut handle = Handle { sp };
                $f(&mut handle, &args)
            });
            if timed.get() {
                log_timing($name, start);
            }
            rc
        }
    };
}

/// `timing=on`: one line in slurmd's log (slurmstepd only; srun's would reach
/// the user's terminal) with the hook's time, measured around the guard: the
/// wall-clock time and the CPU time of the calling thread (what the plugin
/// itself cost, without the time other processes had the CPU).
fn log_timing(hook: &'static str, (wall, cpu): (std::time::Instant, Option<ThreadUsage>)) {
    let _ = guard("timing", || {
        if current_context() == Context::Remote {
            let wall = wall.elapsed().as_micros();
            let used = cpu.zip(thread_usage()).map(|(a, b)| {
                let us = b.cpu.saturating_sub(a.cpu).as_micros();
                format!(", cpu {us} us, {} page faults", b.minor_faults.saturating_sub(a.minor_faults))
            });
            log(Level::Info, &format!("timing: {hook} {wall} us{}", used.unwrap_or_default()));
        }
        Ok(())
    });
}

/// What the calling thread has used so far.
#[derive(Clone, Copy)]
struct ThreadUsage {
    /// CPU time, user and system.
    cpu: std::time::Duration,
    /// Minor page faults: in a task forked from slurmstepd, mostly the
    /// copies of the pages it shares with slurmstepd that it writes to.
    minor_faults: u64,
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: getrusage's
/// counts only whole ticks) and page faults (`getrusage(RUSAGE_THREAD)`),
/// `None` if they cannot be read.
fn thread_usage() -> Option<ThreadUsage> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    let cpu = std::time::Duration::new(u64::try_from(ts.tv_sec).ok()?, u32::try_from(ts.tv_nsec).ok()?);
    // SAFETY: rusage is plain integers: all zero bytes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into `ru`, which outlives the call.
    let rc2 = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru) };
    let minor_faults = u64::try_from(ru.ru_minflt).ok()?;
    (rc == 0 && rc2 == 0).then_some(ThreadUsage { cpu, minor_faults })
}

export_hook!(slurm_spank_init, "init", hooks::init);
export_hook!(slurm_spank_user_init, "user_init", |h: &mut Handle, args: &[String]| {
    // slurmstepd runs one step, so "once per process" is "once per step"; the
    // forked tasks inherit the state.
    if let Some(state) = hooks::user_init(h, args)? {
        let _ = STEP_STATE.set(state);
    }
    Ok(())
});
export_hook!(slurm_spank_local_user_init, "local_user_init", hooks::local_user_init);
export_hook!(slurm_spank_task_init, "task_init", |h: &mut Handle, args: &[String]| {
    let state = STEP_STATE.get();
    if state.and_then(|s| s.options).is_some_and(|o| o.auto_rdzv.is_some() || o.gpu_affinity.is_some()) {
        fresh_pages_for_large_blocks();
    }
    hooks::task_init(h, args, state)
});

/// In the task (a process just forked from slurmstepd, about to `exec`),
/// where an option is in force: blocks of 128 KiB and more are mapped fresh
/// again, as glibc does until a process frees such a block. slurmstepd has,
/// so glibc serves each of Slurm's `spank_setenv` buffers (a 256 KiB
/// `calloc`, env.c `setenvf`) from its heap and clears it: up to 64 pages
/// written, each a page fault and often a copy of slurmstepd's page, per call
/// and per task. A fresh mapping is zero already and only its first page is
/// written. Only this process's allocator changes, for the moments before it
/// `exec`s; slurmstepd's is untouched.
fn fresh_pages_for_large_blocks() {
    #[cfg(target_env = "gnu")]
    {
        // glibc's default threshold (malloc.c DEFAULT_MMAP_THRESHOLD_MIN).
        const MMAP_THRESHOLD: c_int = 128 * 1024;
        // SAFETY: mallopt only sets a parameter of glibc's allocator, under its
        // own lock; this process has one thread (forked from slurmstepd), and
        // nothing of the plugin's holds memory whose placement matters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
}

/// The callback of every option the plugin registers: Slurm calls it when the
/// user gives the option (in srun/sbatch/salloc, and again in slurmstepd).
unsafe extern "C" fn option_callback(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    guard("option", || {
        let Some(option) = UserOption::from_val(val) else {
            return Err(HookError::Internal(format!("callback for unknown option value {val}")));
        };
        // SAFETY: Slurm passes NULL or a NUL-terminated string valid for this call.
        let arg = unsafe { opt_cstr(optarg) };
        hooks::option_callback(current_context(), option, arg.as_deref())
    })
}

// ----- The guard ---------------------------------------------------------------------

thread_local! {
    /// Where the panic hook leaves the message and location of a panic, for
    /// the guard to log as one line.
    static LAST_PANIC: Cell<Option<String>> = const { Cell::new(None) };
}

/// Replaces the default panic hook, which would print to the stderr of srun or
/// slurmstepd, by one that records the panic for [`guard`] to log. Each cdylib
/// has its own copy of std, so this touches no other plugin's hook.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        panic::set_hook(Box::new(|info| {
            let message = match info.location() {
                Some(loc) => {
                    format!("panicked at {}:{}: {}", loc.file(), loc.line(), payload_text(info.payload()))
                }
                None => format!("panicked: {}", payload_text(info.payload())),
            };
            LAST_PANIC.with(|slot| slot.set(Some(message)));
        }));
    });
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

/// Runs one hook or callback and turns its outcome into Slurm's return code.
///
/// - `Ok` → 0.
/// - A user error → logged; -1 in srun/sbatch/salloc (the submit fails with
///   the message), 0 elsewhere (a running step is never failed for it).
/// - An internal error or a panic → logged as one line; 0 (fail open).
/// - A task the user asked to fail (`--auto-rdzv=strict` on a taken port) →
///   logged; -1 (with a `required` plugin, slurmstepd ends the task with
///   exit code 1 before it runs the user's program).
fn guard(hook: &str, f: impl FnOnce() -> Result<(), HookError>) -> c_int {
    install_panic_hook();
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    let ctx = current_context();
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(HookError::FailStep(message))) => {
            log(Level::Error, &message);
            -1
        }
        Ok(Err(HookError::User(message))) => {
            log(Level::Error, &message);
            if ctx.is_submit() { -1 } else { 0 }
        }
        Ok(Err(HookError::Internal(message))) => {
            log(Level::Error, &format!("{hook}: {message}; continuing without spank-gpu for this hook"));
            0
        }
        Err(payload) => {
            let message = LAST_PANIC
                .with(Cell::take)
                .unwrap_or_else(|| format!("panicked: {}", payload_text(payload.as_ref())));
            log(
                Level::Error,
                &format!("{hook}: internal error ({message}); continuing without spank-gpu for this hook"),
            );
            0
        }
    }
}

// ----- Logging -----------------------------------------------------------------------

/// Writes one line to Slurm's log (the slurmd log for slurmd and slurmstepd,
/// stderr for srun/sbatch/salloc, at Slurm's own verbosity rules), at the
/// level [`Level::in_context`] gives: never at error level in slurmstepd,
/// which would copy it into the job's output.
fn log(level: Level, message: &str) {
    let line = format!("{LOG_PREFIX}{message}").replace('\0', "\\0");
    let Ok(line) = CString::new(line) else { return };
    let fmt = c"%s".as_ptr();
    // SAFETY: the format is the literal "%s" and the one vararg is a valid,
    // NUL-terminated C string that outlives the call. The functions are
    // provided by the Slurm process that loaded the plugin.
    unsafe {
        match level.in_context(current_context()) {
            Level::Error => sys::slurm_error(fmt, line.as_ptr()),
            Level::Info => sys::slurm_info(fmt, line.as_ptr()),
            Level::Debug => sys::slurm_debug(fmt, line.as_ptr()),
        }
    }
}

fn current_context() -> Context {
    // SAFETY: spank_context() takes no arguments and only reads Slurm's state.
    let ctx = unsafe { sys::spank_context() };
    match ctx {
        sys::S_CTX_LOCAL => Context::Local,
        sys::S_CTX_REMOTE => Context::Remote,
        sys::S_CTX_ALLOCATOR => Context::Allocator,
        sys::S_CTX_SLURMD => Context::Slurmd,
        sys::S_CTX_JOB_SCRIPT => Context::JobScript,
        _ => Context::Unknown,
    }
}

// ----- Options -----------------------------------------------------------------------

/// The `struct spank_option`s Slurm keeps pointers to, one per [`UserOption`],
/// with the C strings they point into. Built once per process and never freed.
struct OptionTable {
    slots: Vec<UnsafeCell<sys::spank_option>>,
    _strings: Vec<CString>,
}

// SAFETY: the table is written only while it is built inside `OnceLock`;
// afterwards only Slurm reads the structs, through the pointers we give it.
// The plugin starts no threads, and Slurm calls hooks one at a time.
unsafe impl Sync for OptionTable {}

// SAFETY: the raw pointers point into the table's own `CString`s, which move
// with it; nothing in it is tied to the thread that built it.
unsafe impl Send for OptionTable {}

/// One `struct spank_option`: name, arginfo, usage, `has_arg`, `val`, callback.
type OptionEntry<'a> = (&'a str, &'a str, &'a str, c_int, c_int, sys::spank_opt_cb_f);

impl OptionTable {
    fn new<'a>(entries: impl Iterator<Item = OptionEntry<'a>>) -> OptionTable {
        let mut strings = Vec::new();
        let mut cstr = |s: &str| {
            let c = CString::new(s).unwrap_or_default();
            // The heap buffer does not move when the CString moves into the Vec.
            let p = c.as_ptr().cast_mut();
            strings.push(c);
            p
        };
        let slots = entries
            .map(|(name, arginfo, usage, has_arg, val, cb)| {
                UnsafeCell::new(sys::spank_option {
                    name: cstr(name),
                    arginfo: cstr(arginfo),
                    usage: cstr(usage),
                    has_arg,
                    val,
                    cb,
                })
            })
            .collect();
        OptionTable { slots, _strings: strings }
    }
}

fn option_table() -> &'static OptionTable {
    static TABLE: OnceLock<OptionTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        OptionTable::new(UserOption::ALL.iter().map(|o| {
            // has_arg 2, an optional argument: `--auto-rdzv` or `--auto-rdzv=WORDS`.
            (o.name(), o.arginfo(), o.usage(), 2, o.val(), Some(option_callback as _))
        }))
    })
}

fn option_slot(option: UserOption) -> *mut sys::spank_option {
    let index = UserOption::ALL.iter().position(|o| *o == option).unwrap_or(0);
    option_table().slots[index].get()
}

/// pyxis's options, by name only, for [`Handle::foreign_option`]: never
/// registered, no callback (an argument each, as pyxis registers them).
fn foreign_slot(option: PyxisOption) -> Option<*mut sys::spank_option> {
    static TABLE: OnceLock<OptionTable> = OnceLock::new();
    let table =
        TABLE.get_or_init(|| OptionTable::new(PYXIS_OPTIONS.iter().map(|o| (o.name, "", "", 1, 0, None))));
    let index = PYXIS_OPTIONS.iter().position(|o| *o == option)?;
    Some(table.slots[index].get())
}

// ----- The handle --------------------------------------------------------------------

/// A real SPANK handle, valid for the duration of one hook call.
struct Handle {
    sp: sys::spank_t,
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

    fn srun_topology(&self) -> Result<gpu_core::layout::TopologyConf, String> {
        let conf = loaded_slurm_conf()?;
        // SAFETY: the strings of a loaded configuration are NULL or NUL-terminated.
        let (path, plugin) = unsafe { (opt_cstr(conf.slurm_conf), opt_cstr(conf.topology_plugin)) };
        let Some(path) = path else { return Err("srun's configuration is not loaded".into()) };
        let yaml = std::path::Path::new(&path).with_file_name("topology.yaml");
        Ok(gpu_core::layout::TopologyConf {
            plugin: plugin.unwrap_or_default(),
            no_dist_topo_block: conf.select_type_param & gpu_core::layout::SELECT_NO_DIST_TOPO_BLOCK != 0,
            topology_yaml: yaml.exists(),
        })
    }

    fn stepd_conf(&self) -> Result<crate::spank::StepdConf, String> {
        let conf = loaded_slurm_conf()?;
        // SAFETY: the strings of a loaded configuration are NULL or NUL-terminated.
        let (path, plugin) = unsafe { (opt_cstr(conf.slurm_conf), opt_cstr(conf.task_plugin)) };
        // A loaded configuration names its task plugin (slurmd sends it with
        // the rest); NULL: nothing is loaded, and nothing can be said.
        let task_plugin = plugin.ok_or("slurmstepd's configuration names no TaskPlugin")?;
        Ok(crate::spank::StepdConf { task_plugin, path })
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

impl Node for Handle {
    type DevDir = crate::sysio::DevDir;

    fn probe_port(&self, port: u16) -> io::Result<()> {
        crate::sysio::probe_port(port)
    }

    fn sysctl(&self, key: &'static str) -> Option<String> {
        std::fs::read_to_string(format!("/proc/sys/{key}")).ok()
    }

    fn read_trusted(&self, path: &str, max_bytes: usize) -> io::Result<String> {
        crate::sysio::read_trusted(path, max_bytes)
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

    fn interfaces(&self) -> io::Result<Vec<gpu_core::netif::Interface>> {
        crate::sysio::interfaces()
    }

    fn user_home(&self, uid: u32) -> io::Result<String> {
        slurm_sys::passwd::home_of(uid)
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

/// What `user_init` learned about the step, for its tasks: set once per
/// process (slurmstepd runs one step) and inherited by the forked tasks,
/// the device directory's descriptor included.
static STEP_STATE: OnceLock<StepState<crate::sysio::DevDir>> = OnceLock::new();

/// The longest environment value the plugin reads (a 1 MiB node list is
/// already absurd).
const MAX_ENV_VALUE: usize = 1 << 20;

// ----- C string helpers --------------------------------------------------------------

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

/// Copies a C string that may be NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for this call.
unsafe fn opt_cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated, per this function's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Copies an argv from Slurm: a hook's plugstack arguments, or the step's
/// command line (`S_JOB_ARGV`).
///
/// # Safety
/// `av` is NULL, or holds `ac` pointers that are each NULL or a NUL-terminated
/// string, all valid for this call.
unsafe fn plugstack_args(ac: c_int, av: *mut *mut c_char) -> Vec<String> {
    let Ok(len) = usize::try_from(ac) else { return Vec::new() };
    if av.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: per this function's contract `av` points to `len` pointers.
    let argv = unsafe { std::slice::from_raw_parts(av, len) };
    argv.iter()
        // SAFETY: each entry is NULL or a valid C string, per the contract.
        .filter_map(|p| unsafe { opt_cstr(*p) })
        .collect()
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
