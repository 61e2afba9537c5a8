//! What the plugin does in each SPANK hook, written against the [`Spank`]
//! seam. Hooks are thin: read inputs, call `gpu-core`, apply the result.
//!
//! Every hook returns `Result<(), HookError>`; the FFI guard turns that into
//! Slurm's return code. Only a [`HookError::User`] in srun, sbatch or salloc
//! fails anything (the submit); everything else is logged and the job goes on.

use std::fmt;

use gpu_core::options::{self, UserOption};
use gpu_core::plugstack::{Hook, PluginConfig};

use crate::spank::{Context, Level, Spank};

/// The environment variable set in every task of a step with `--auto-rdzv`
/// active, so a task (and a test) can tell the plugin was on.
pub const AUTO_RDZV_MARKER: &str = "SPANK_GPU_AUTO_RDZV";

/// Why a hook did not finish its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookError {
    /// The user asked for something invalid. Fails the submit in srun, sbatch
    /// and salloc; only logged anywhere else.
    User(String),
    /// The plugin's own fault. Always logged, never fails anything.
    Internal(String),
}

impl fmt::Display for HookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookError::User(m) | HookError::Internal(m) => f.write_str(m),
        }
    }
}

/// Whether debug builds accept the test-only plugstack keys.
const DEBUG_HOOKS: bool = cfg!(debug_assertions);

/// Parses the plugstack words. Only `slurm_spank_init` reports a bad line
/// (once per process); the other hooks then quietly do nothing.
fn config<S: Spank>(sp: &S, args: &[String], report: bool) -> Option<PluginConfig> {
    match PluginConfig::parse(args, DEBUG_HOOKS) {
        Ok(cfg) => Some(cfg),
        Err(e) => {
            if report {
                sp.log(Level::Error, &format!("{e}; the plugin does nothing until this is fixed"));
            }
            None
        }
    }
}

/// The debug-only way to prove the guard: panics when the plugstack line says so.
fn maybe_panic(cfg: &PluginConfig, hook: Hook) {
    if DEBUG_HOOKS && cfg.panics_in(hook) {
        panic!("debug_panic={hook} requested on the plugstack line");
    }
}

/// `slurm_spank_init`, every context: registers the options, so they show in
/// `--help` and work on `#SBATCH` lines, and checks the plugstack line.
///
/// # Errors
/// [`HookError::Internal`] when Slurm refused an option.
pub fn init<S: Spank>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    let mut failed = Vec::new();
    for option in UserOption::ALL {
        if let Err(e) = sp.register_option(option) {
            failed.push(format!("{option}: {e}"));
        }
    }
    if let Some(cfg) = config(sp, args, true) {
        maybe_panic(&cfg, Hook::Init);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(HookError::Internal(format!("cannot register options: {}", failed.join("; "))))
    }
}

/// The option callback. In srun, sbatch and salloc a bad argument fails the
/// submit with one line; in slurmstepd the argument is read again where it is
/// used, so nothing happens here. Idempotent: Slurm may call it twice.
///
/// # Errors
/// [`HookError::User`] for a bad argument.
pub fn option_callback(ctx: Context, option: UserOption, arg: Option<&str>) -> Result<(), HookError> {
    if !ctx.is_submit() {
        return Ok(());
    }
    options::validate(option, options::from_slurm(arg)).map_err(|e| HookError::User(e.to_string()))
}

/// `slurm_spank_user_init`, slurmstepd before the tasks are forked.
///
/// # Errors
/// None yet.
pub fn user_init<S: Spank>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    if let Some(cfg) = config(sp, args, false) {
        maybe_panic(&cfg, Hook::UserInit);
    }
    Ok(())
}

/// Whether `--auto-rdzv` is active for this step: the user's option wins over
/// the admin's default. A bad argument (it can only get here by a hand-made
/// environment) is logged and treated as off.
fn auto_rdzv_active<S: Spank>(sp: &S, cfg: &PluginConfig) -> Result<bool, HookError> {
    let arg = sp
        .option_arg(UserOption::AutoRdzv)
        .map_err(|e| HookError::Internal(format!("reading --auto-rdzv: {e}")))?;
    match arg {
        None => Ok(cfg.auto_rdzv),
        Some(arg) => match options::parse_auto_rdzv(options::from_slurm(Some(&arg))) {
            Ok(parsed) => Ok(parsed.is_some()),
            Err(e) => {
                sp.log(Level::Error, &format!("{e}; ignoring the option"));
                Ok(false)
            }
        },
    }
}

/// `slurm_spank_task_init`, in each forked task before `exec`.
///
/// # Errors
/// [`HookError::Internal`] when Slurm refuses to read the option or set the
/// environment.
pub fn task_init<S: Spank>(sp: &mut S, args: &[String]) -> Result<(), HookError> {
    let Some(cfg) = config(sp, args, false) else {
        return Ok(());
    };
    maybe_panic(&cfg, Hook::TaskInit);
    if auto_rdzv_active(sp, &cfg)? {
        sp.setenv(AUTO_RDZV_MARKER, "1", true)
            .map_err(|e| HookError::Internal(format!("setting {AUTO_RDZV_MARKER}: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake SPANK handle: a few maps and a log.

    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;
    use crate::spank::SpankError;

    #[derive(Debug)]
    pub struct FakeSpank {
        pub context: Context,
        pub registered: Vec<UserOption>,
        pub refuse_register: bool,
        pub options: BTreeMap<&'static str, String>,
        pub env: BTreeMap<String, String>,
        pub log: RefCell<Vec<(Level, String)>>,
    }

    impl FakeSpank {
        pub fn new(context: Context) -> FakeSpank {
            FakeSpank {
                context,
                registered: Vec::new(),
                refuse_register: false,
                options: BTreeMap::new(),
                env: BTreeMap::new(),
                log: RefCell::new(Vec::new()),
            }
        }

        pub fn errors(&self) -> Vec<String> {
            self.log.borrow().iter().filter(|(l, _)| *l == Level::Error).map(|(_, m)| m.clone()).collect()
        }
    }

    impl Spank for FakeSpank {
        fn context(&self) -> Context {
            self.context
        }

        fn register_option(&mut self, option: UserOption) -> Result<(), SpankError> {
            if self.refuse_register {
                return Err(SpankError {
                    call: "spank_option_register",
                    code: 3001,
                    text: "Invalid argument".into(),
                });
            }
            self.registered.push(option);
            Ok(())
        }

        fn option_arg(&self, option: UserOption) -> Result<Option<String>, SpankError> {
            Ok(self.options.get(option.name()).cloned())
        }

        fn setenv(&mut self, name: &str, value: &str, overwrite: bool) -> Result<bool, SpankError> {
            if !overwrite && self.env.contains_key(name) {
                return Ok(false);
            }
            self.env.insert(name.to_owned(), value.to_owned());
            Ok(true)
        }

        fn log(&self, level: Level, message: &str) {
            self.log.borrow_mut().push((level, message.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSpank;
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn init_registers_every_option_in_every_context() {
        for ctx in [Context::Local, Context::Allocator, Context::Remote, Context::Slurmd] {
            let mut sp = FakeSpank::new(ctx);
            assert_eq!(init(&mut sp, &[]), Ok(()));
            assert_eq!(sp.registered, UserOption::ALL);
        }
    }

    #[test]
    fn init_reports_a_bad_plugstack_line_once_and_still_registers() {
        let mut sp = FakeSpank::new(Context::Remote);
        assert_eq!(init(&mut sp, &args(&["bogus=1"])), Ok(()));
        assert_eq!(sp.registered, UserOption::ALL, "options must stay known so #SBATCH lines still parse");
        let errors = sp.errors();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("'bogus=1': unknown key 'bogus'"), "{errors:?}");
    }

    #[test]
    fn refused_registration_is_an_internal_error() {
        let mut sp = FakeSpank::new(Context::Local);
        sp.refuse_register = true;
        assert!(matches!(init(&mut sp, &[]), Err(HookError::Internal(_))));
    }

    #[test]
    fn callback_rejects_bad_words_only_at_submit() {
        for ctx in [Context::Local, Context::Allocator] {
            let r = option_callback(ctx, UserOption::AutoRdzv, Some("bogus"));
            assert!(matches!(r, Err(HookError::User(m)) if m.contains("'bogus'")));
        }
        assert_eq!(option_callback(Context::Remote, UserOption::AutoRdzv, Some("bogus")), Ok(()));
    }

    #[test]
    fn callback_is_idempotent() {
        for arg in [None, Some(""), None, Some("verbose"), Some("(null)")] {
            assert_eq!(option_callback(Context::Local, UserOption::GpuAffinity, arg), Ok(()));
        }
    }

    #[test]
    fn task_init_marks_tasks_only_when_auto_rdzv_is_on() {
        let mut sp = FakeSpank::new(Context::Remote);
        task_init(&mut sp, &[]).unwrap();
        assert!(sp.env.is_empty(), "off by default");

        sp.options.insert("auto-rdzv", String::new());
        task_init(&mut sp, &[]).unwrap();
        assert_eq!(sp.env.get(AUTO_RDZV_MARKER).map(String::as_str), Some("1"));
    }

    #[test]
    fn admin_default_applies_unless_the_user_says_off() {
        let mut sp = FakeSpank::new(Context::Remote);
        task_init(&mut sp, &args(&["auto_rdzv=on"])).unwrap();
        assert!(sp.env.contains_key(AUTO_RDZV_MARKER));

        let mut sp = FakeSpank::new(Context::Remote);
        sp.options.insert("auto-rdzv", "off".into());
        task_init(&mut sp, &args(&["auto_rdzv=on"])).unwrap();
        assert!(sp.env.is_empty());
    }

    #[test]
    fn bad_option_in_remote_context_is_logged_and_off() {
        let mut sp = FakeSpank::new(Context::Remote);
        sp.options.insert("auto-rdzv", "bogus".into());
        assert_eq!(task_init(&mut sp, &[]), Ok(()));
        assert!(sp.env.is_empty());
        assert_eq!(sp.errors().len(), 1);
    }

    #[test]
    fn bad_plugstack_line_makes_task_init_do_nothing_quietly() {
        let mut sp = FakeSpank::new(Context::Remote);
        sp.options.insert("auto-rdzv", String::new());
        assert_eq!(task_init(&mut sp, &args(&["auto_rdzv=maybe"])), Ok(()));
        assert!(sp.env.is_empty());
        assert!(sp.errors().is_empty());
    }

    #[test]
    #[should_panic(expected = "debug_panic=task_init")]
    fn debug_panic_fires_in_debug_builds() {
        let mut sp = FakeSpank::new(Context::Remote);
        let _ = task_init(&mut sp, &args(&["debug_panic=task_init"]));
    }
}
