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
//! - [`Handle`] (`handle.rs`), the [`Spank`] and [`Node`] implementations
//!   over a real `spank_t`.
//!
//! The `spank_*` and `slurm_*` functions are resolved from the host process at
//! load time; nothing here links libslurm.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Once, OnceLock};

use slurm_sys as sys;
use task_plan::options::UserOption;

use crate::hooks::{self, HookError, StepState};
use crate::spank::{Context, Level};
use task_plan::rdzv::container::{PYXIS_OPTIONS, PyxisOption};

/// Prefix of every log line the plugin writes.
mod handle;
use handle::Handle;

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
                timed.set(task_plan::plugstack::timing_on(&args));
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
export_hook!(slurm_spank_init_post_opt, "init_post_opt", hooks::init_post_opt);
export_hook!(slurm_spank_job_prolog, "job_prolog", hooks::job_prolog);
export_hook!(slurm_spank_job_epilog, "job_epilog", hooks::job_epilog);
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
        let ctx = current_context();
        if ctx == Context::Remote {
            handle::given_in_slurmstepd(option, arg.as_deref());
        }
        hooks::option_callback(ctx, option, arg.as_deref())
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

/// What `user_init` learned about the step, for its tasks: set once per
/// process (slurmstepd runs one step) and inherited by the forked tasks,
/// the device directory's descriptor included.
static STEP_STATE: OnceLock<StepState<crate::sysio::DevDir>> = OnceLock::new();

// ----- C string helpers --------------------------------------------------------------

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
