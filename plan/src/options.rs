//! The user-facing options the plugin registers with Slurm.
//!
//! Both take an optional comma-separated list of words, so they work the same
//! on the command line (`srun --auto-rdzv=verbose`) and on `#SBATCH` lines.
//! These parsers run in srun/sbatch/salloc, where a bad word fails only the
//! submit, and again in slurmstepd, where a bad word must never fail the step.

use std::fmt;

/// An option the plugin adds to srun, sbatch and salloc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UserOption {
    /// `--auto-rdzv[=WORDS]`: rendezvous, rank and thread environment.
    AutoRdzv,
    /// `--gpu-affinity[=WORDS]`: bind tasks to the cores closest to their GPUs.
    GpuAffinity,
}

impl UserOption {
    /// Every option, in registration order.
    pub const ALL: [UserOption; 2] = [UserOption::AutoRdzv, UserOption::GpuAffinity];

    /// The long option name, without the leading dashes.
    pub const fn name(self) -> &'static str {
        match self {
            UserOption::AutoRdzv => "auto-rdzv",
            UserOption::GpuAffinity => "gpu-affinity",
        }
    }

    /// The one-word argument description shown by `--help`.
    pub const fn arginfo(self) -> &'static str {
        match self {
            UserOption::AutoRdzv => "off|verbose|port=N|strict",
            UserOption::GpuAffinity => "off|verbose|force|mem",
        }
    }

    /// The usage line shown by `srun --help`, `sbatch --help` and `salloc --help`.
    pub const fn usage(self) -> &'static str {
        match self {
            UserOption::AutoRdzv => {
                "Set MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE, OMP_NUM_THREADS per task \
                 (spank-gpu). Words: off, verbose, port=N, strict."
            }
            UserOption::GpuAffinity => {
                "Bind each task to the CPU cores closest to its GPUs (spank-gpu). \
                 Words: off, verbose, force, mem."
            }
        }
    }

    /// The value Slurm hands back to the option callback to say which option fired.
    pub const fn val(self) -> i32 {
        match self {
            UserOption::AutoRdzv => 1,
            UserOption::GpuAffinity => 2,
        }
    }

    /// The option whose [`val`](Self::val) is `val`.
    pub fn from_val(val: i32) -> Option<UserOption> {
        UserOption::ALL.into_iter().find(|o| o.val() == val)
    }
}

impl fmt::Display for UserOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--{}", self.name())
    }
}

/// A word of an option argument that could not be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionError {
    /// The option the argument was given to.
    pub option: UserOption,
    /// The whole argument as the user wrote it.
    pub arg: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={}: {} (valid words: {})",
            self.option,
            slurm_formats::text::clip(&self.arg, 80),
            slurm_formats::text::clip(&self.reason, 160),
            self.option.arginfo().replace('|', ", ")
        )
    }
}

impl std::error::Error for OptionError {}

/// What `--auto-rdzv` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoRdzv {
    /// `verbose`: one line per task on stderr saying what was set and kept.
    pub verbose: bool,
    /// `port=N`: the rendezvous port, instead of a derived one.
    pub port: Option<u16>,
    /// `strict`: a `MASTER_PORT` that cannot be bound on `MASTER_ADDR`'s node
    /// fails the step there, before its tasks start, instead of only telling
    /// rank 0 (the other ranks would wait on whatever holds the port).
    pub strict: bool,
}

/// What `--gpu-affinity` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuAffinity {
    /// `verbose`: one line per task on stderr with its GPUs, NUMA node and CPUs.
    pub verbose: bool,
    /// `force`: bind even when the user gave `--cpu-bind`.
    pub force: bool,
    /// `mem`: also prefer memory on the GPUs' NUMA nodes.
    pub mem: bool,
}

/// The option argument as Slurm hands it over, cleaned of a Slurm quirk.
///
/// XXX: sbatch passes an option given without `=` to the job's steps as the
/// environment value `(null)` (from printf of a NULL string), and the inner
/// srun hands that text back as the argument. It means "no argument".
pub fn from_slurm(arg: Option<&str>) -> Option<&str> {
    arg.filter(|a| *a != "(null)")
}

/// Splits an option argument into words. `None` and `""` (the option given
/// without `=`) are both an empty list.
fn words(arg: Option<&str>) -> impl Iterator<Item = &str> {
    arg.unwrap_or("").split(',').map(str::trim).filter(|w| !w.is_empty())
}

/// Parses the argument of `--auto-rdzv`. `Ok(None)` means `off`.
///
/// # Errors
/// An unknown word, a bad port, or `off` combined with other words.
pub fn parse_auto_rdzv(arg: Option<&str>) -> Result<Option<AutoRdzv>, OptionError> {
    let err = |reason: String| OptionError {
        option: UserOption::AutoRdzv,
        arg: arg.unwrap_or("").to_owned(),
        reason,
    };
    let mut out = AutoRdzv::default();
    let mut off = false;
    let mut others = false;
    for word in words(arg) {
        match word {
            "off" => off = true,
            "verbose" => {
                out.verbose = true;
                others = true;
            }
            "strict" => {
                out.strict = true;
                others = true;
            }
            _ => {
                let Some(value) = word.strip_prefix("port=") else {
                    return Err(err(format!("unknown word '{word}'")));
                };
                let port =
                    value.parse::<u16>().ok().filter(|p| *p >= 1024).ok_or_else(|| {
                        err(format!("'{word}': the port must be a number from 1024 to 65535"))
                    })?;
                out.port = Some(port);
                others = true;
            }
        }
    }
    if off && others {
        return Err(err("'off' cannot be combined with other words".to_owned()));
    }
    Ok((!off).then_some(out))
}

/// Parses the argument of `--gpu-affinity`. `Ok(None)` means `off`.
///
/// # Errors
/// An unknown word, or `off` combined with other words.
pub fn parse_gpu_affinity(arg: Option<&str>) -> Result<Option<GpuAffinity>, OptionError> {
    let err = |reason: String| OptionError {
        option: UserOption::GpuAffinity,
        arg: arg.unwrap_or("").to_owned(),
        reason,
    };
    let mut out = GpuAffinity::default();
    let mut off = false;
    for word in words(arg) {
        match word {
            "off" => off = true,
            "verbose" => out.verbose = true,
            "force" => out.force = true,
            "mem" => out.mem = true,
            _ => return Err(err(format!("unknown word '{word}'"))),
        }
    }
    if off && out != GpuAffinity::default() {
        return Err(err("'off' cannot be combined with other words".to_owned()));
    }
    Ok((!off).then_some(out))
}

/// Checks an option argument without keeping the result: what the option
/// callback does in srun, sbatch and salloc.
///
/// # Errors
/// As [`parse_auto_rdzv`] and [`parse_gpu_affinity`].
pub fn validate(option: UserOption, arg: Option<&str>) -> Result<(), OptionError> {
    match option {
        UserOption::AutoRdzv => parse_auto_rdzv(arg).map(drop),
        UserOption::GpuAffinity => parse_gpu_affinity(arg).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_option_is_on_with_defaults() {
        assert_eq!(parse_auto_rdzv(None), Ok(Some(AutoRdzv::default())));
        assert_eq!(parse_auto_rdzv(Some("")), Ok(Some(AutoRdzv::default())));
        assert_eq!(parse_gpu_affinity(Some("")), Ok(Some(GpuAffinity::default())));
    }

    #[test]
    fn slurms_null_text_means_no_argument() {
        assert_eq!(from_slurm(Some("(null)")), None);
        assert_eq!(from_slurm(Some("verbose")), Some("verbose"));
        assert_eq!(from_slurm(None), None);
    }

    #[test]
    fn off_turns_it_off() {
        assert_eq!(parse_auto_rdzv(Some("off")), Ok(None));
        assert_eq!(parse_gpu_affinity(Some("off")), Ok(None));
    }

    #[test]
    fn words_combine() {
        assert_eq!(
            parse_auto_rdzv(Some("verbose,port=29400")),
            Ok(Some(AutoRdzv { verbose: true, port: Some(29400), strict: false }))
        );
        assert_eq!(
            parse_auto_rdzv(Some("strict,port=29400")),
            Ok(Some(AutoRdzv { verbose: false, port: Some(29400), strict: true }))
        );
        assert_eq!(
            parse_gpu_affinity(Some("verbose, force,mem")),
            Ok(Some(GpuAffinity { verbose: true, force: true, mem: true }))
        );
    }

    #[test]
    fn unknown_word_names_the_word_and_the_valid_ones() {
        let e = parse_auto_rdzv(Some("verbose,bogus")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--auto-rdzv=verbose,bogus: unknown word 'bogus' (valid words: off, verbose, port=N, strict)"
        );
        let e = parse_gpu_affinity(Some("closest")).unwrap_err();
        assert!(e.to_string().contains("unknown word 'closest'"), "{e}");
    }

    #[test]
    fn huge_and_hostile_arguments_give_a_short_message() {
        let huge = format!("verbose,{}", "x".repeat(1 << 20));
        let e = parse_auto_rdzv(Some(&huge)).unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
        let e = parse_gpu_affinity(Some("mem,\x1b[2J")).unwrap_err().to_string();
        assert!(!e.contains('\x1b'), "{e:?}");
    }

    #[test]
    fn bad_ports_are_rejected() {
        for arg in ["port=", "port=abc", "port=80", "port=65536", "port=-1", "port=1e4"] {
            assert!(parse_auto_rdzv(Some(arg)).is_err(), "{arg} accepted");
        }
        assert!(parse_auto_rdzv(Some("port=1024")).is_ok());
        assert!(parse_auto_rdzv(Some("port=65535")).is_ok());
    }

    #[test]
    fn off_with_other_words_is_an_error() {
        assert!(parse_auto_rdzv(Some("off,verbose")).is_err());
        assert!(parse_gpu_affinity(Some("force,off")).is_err());
    }

    #[test]
    fn vals_round_trip() {
        for o in UserOption::ALL {
            assert_eq!(UserOption::from_val(o.val()), Some(o));
        }
        assert_eq!(UserOption::from_val(0), None);
    }

    #[test]
    fn help_texts_fit_slurm_limits() {
        for o in UserOption::ALL {
            // SPANK_OPTION_MAXLEN is 75 for the name.
            assert!(o.name().len() < 75);
            assert!(!o.usage().contains('\0') && !o.arginfo().contains('\0'));
        }
    }
}
