//! Apptainer (and Singularity) as the step's own command, and what its
//! `--cleanenv` does to the plugin's variables (issue 29).
//!
//! `srun --auto-rdzv apptainer exec IMG.sif python train.py` needs nothing
//! more: Apptainer passes the host's environment into the container by default
//! (the task's, with the plugin's variables) and the task's CPU mask, so the
//! rendezvous and the binding hold inside it. `--cleanenv` (`-e`) and
//! `--containall` (`-C`, which implies it), `--compat` (which implies
//! `--containall`) and OCI mode (`--oci`, which behaves as `--compat`), or
//! their variables (`APPTAINER_CLEANENV`, `APPTAINER_CONTAINALL`,
//! `APPTAINER_COMPAT`, `APPTAINER_OCI`; `SINGULARITY_*` for `singularity`),
//! pass only what the image sets and `APPTAINERENV_NAME`
//! variables, as `NAME` (`SINGULARITYENV_NAME` for `singularity`, which both
//! Apptainer's compatibility command and SingularityCE read). A user who asked
//! for `--auto-rdzv` and a clean environment still wants the rendezvous: when
//! the step's command (`S_JOB_ARGV`) is such an `apptainer exec|run`, the
//! plugin also sets each of its names with the prefix, to the value the task
//! would have seen (its own, or the user's where the user's was kept). A
//! prefixed name the user set is theirs, and an `--env NAME=...` on
//! Apptainer's command line beats the prefixed variable in Apptainer itself.
//!
//! Only the step's own command is read: an `apptainer exec --cleanenv` inside
//! a wrapper script is not seen (the plugin cannot read the script's
//! commands), and nothing is set for it; docs/users.md gives the one flag to
//! add there. The flags are read up to the image, the first word that is not
//! a flag or a flag's value; a flag not listed in [`VALUE_FLAGS`] that takes
//! a separate value makes the reading stop early, which only sets less.

/// The runtimes, by command name, and the prefix each reads under `--cleanenv`.
pub const RUNTIMES: &[(&str, &str)] = &[("apptainer", "APPTAINERENV_"), ("singularity", "SINGULARITYENV_")];

/// The subcommands that start the image's program with the task's environment.
const ACTIONS: &[&str] = &["exec", "run", "shell", "test"];

/// The action flags (Apptainer 1.4, `apptainer exec --help`) that take a
/// separate value (`--bind SRC`): the value is not the image.
pub const VALUE_FLAGS: &[&str] = &[
    "-B",
    "--bind",
    "--add-caps",
    "--drop-caps",
    "--app",
    "--apply-cgroups",
    "--authfile",
    "--blkio-weight",
    "--blkio-weight-device",
    "--cdi",
    "--cpu-shares",
    "--cpus",
    "--cpuset-cpus",
    "--cpuset-mems",
    "--device",
    "--dns",
    "--docker-host",
    "--env",
    "--env-file",
    "--fusemount",
    "-H",
    "--home",
    "--hostname",
    "--library",
    "--memory",
    "--memory-reservation",
    "--memory-swap",
    "--mount",
    "--network",
    "--network-args",
    "--no-mount",
    "-o",
    "--overlay",
    "--pem-path",
    "--pids-limit",
    "--pwd",
    "-S",
    "--scratch",
    "--security",
    "-W",
    "--workdir",
];

/// The global flags (before the subcommand) that take a separate value.
const GLOBAL_VALUE_FLAGS: &[&str] = &["-c", "--config"];

/// Single-letter action flags that take no value and may be written
/// together (`-eC`): a cluster made only of these is read letter by letter.
const SHORT_SWITCHES: &str = "eCcipuwf";

/// An Apptainer command that passes only prefixed variables into its container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanEnv {
    /// `apptainer` or `singularity`.
    pub runtime: &'static str,
    /// `APPTAINERENV_` or `SINGULARITYENV_`.
    pub prefix: &'static str,
    /// What asked for the clean environment, for `verbose`: `--cleanenv`,
    /// `-C`, `APPTAINER_CONTAINALL`, ...
    pub by: String,
}

/// Whether a flag word (`--cleanenv`, `-e`, `-eC`, `--containall=true`)
/// asks for a clean environment.
fn cleans(word: &str) -> bool {
    let (name, value) = word.split_once('=').unwrap_or((word, "true"));
    let on = !matches!(value, "0" | "f" | "F" | "false" | "FALSE" | "False");
    match name {
        "--cleanenv" | "--containall" | "--compat" | "--oci" | "-e" | "-C" => on,
        _ => {
            let letters = name.strip_prefix('-').filter(|l| !l.starts_with('-') && l.len() > 1);
            letters.is_some_and(|l| {
                l.chars().all(|c| SHORT_SWITCHES.contains(c)) && (l.contains('e') || l.contains('C'))
            })
        }
    }
}

/// Whether a variable's value turns a switch on, as Apptainer reads it
/// (Go's `strconv.ParseBool`, and a bare `1`).
fn truthy(value: &str) -> bool {
    matches!(value.trim(), "1" | "t" | "T" | "true" | "TRUE" | "True" | "yes")
}

/// The clean environment the step's command asks for, if its command is
/// `apptainer|singularity [global flags] exec|run|shell|test [flags] IMAGE ...`
/// with `--cleanenv`/`--containall` before the image, or with
/// `APPTAINER_CLEANENV`/`APPTAINER_CONTAINALL` (`SINGULARITY_...`) set in
/// the task's environment (`env`).
pub fn clean_env(argv: &[String], env: &dyn Fn(&str) -> Option<String>) -> Option<CleanEnv> {
    let name = argv.first()?.trim().rsplit('/').next().unwrap_or_default();
    let &(runtime, prefix) = RUNTIMES.iter().find(|(r, _)| *r == name)?;
    let mut words = argv.iter().skip(1).map(String::as_str);
    // Global flags, up to the subcommand.
    let action = loop {
        let word = words.next()?;
        if !word.starts_with('-') {
            break word;
        }
        if GLOBAL_VALUE_FLAGS.contains(&word) {
            words.next()?;
        }
    };
    if !ACTIONS.contains(&action) {
        return None;
    }
    let found = |by: String| Some(CleanEnv { runtime, prefix, by });
    while let Some(word) = words.next() {
        if !word.starts_with('-') || word == "-" {
            break;
        }
        if word == "--" {
            break;
        }
        if cleans(word) {
            return found(word.to_owned());
        }
        if VALUE_FLAGS.contains(&word) {
            words.next();
        }
    }
    let upper = runtime.to_ascii_uppercase();
    ["CLEANENV", "CONTAINALL", "COMPAT", "OCI"]
        .iter()
        .map(|flag| format!("{upper}_{flag}"))
        .find(|var| env(var).is_some_and(|v| truthy(&v)))
        .and_then(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &str) -> Vec<String> {
        words.split_whitespace().map(str::to_owned).collect()
    }

    fn none(_: &str) -> Option<String> {
        None
    }

    fn by(words: &str) -> Option<String> {
        clean_env(&argv(words), &none).map(|c| format!("{} {} {}", c.runtime, c.prefix, c.by))
    }

    #[test]
    fn cleanenv_and_containall_before_the_image_count() {
        assert_eq!(
            by("apptainer exec --cleanenv img.sif python train.py").as_deref(),
            Some("apptainer APPTAINERENV_ --cleanenv")
        );
        assert_eq!(by("/usr/bin/apptainer run -C img.sif").as_deref(), Some("apptainer APPTAINERENV_ -C"));
        assert_eq!(
            by("singularity exec --nv -e img.sif python").as_deref(),
            Some("singularity SINGULARITYENV_ -e")
        );
        assert_eq!(by("apptainer exec -eC img.sif python").as_deref(), Some("apptainer APPTAINERENV_ -eC"));
        assert_eq!(
            by("apptainer -q exec --containall=true img.sif x").as_deref(),
            Some("apptainer APPTAINERENV_ --containall=true")
        );
        assert_eq!(
            by("apptainer --config /etc/a.conf exec -B /data:/data --nv --cleanenv img.sif x").as_deref(),
            Some("apptainer APPTAINERENV_ --cleanenv")
        );
    }

    #[test]
    fn the_default_and_flags_after_the_image_pass_the_environment_as_it_is() {
        // The host's environment passes by default: nothing to do.
        assert_eq!(by("apptainer exec img.sif python train.py"), None);
        // After the image, a flag is the program's.
        assert_eq!(by("apptainer exec img.sif python -e train.py"), None);
        assert_eq!(by("apptainer exec --bind /x img.sif prog --cleanenv"), None);
        // A value flag's value is not the image.
        assert_eq!(
            by("apptainer exec --env -e --cleanenv img.sif x").as_deref(),
            Some("apptainer APPTAINERENV_ --cleanenv")
        );
        assert_eq!(by("apptainer exec --cleanenv=false img.sif x"), None);
        assert_eq!(by("apptainer exec --cleanenv=F img.sif x"), None);
        // --compat implies --containall; OCI mode is taken as clean too (a copy
        // where the environment passes anyway carries the same value).
        assert_eq!(by("apptainer run --compat img.sif").as_deref(), Some("apptainer APPTAINERENV_ --compat"));
        assert_eq!(by("apptainer exec --oci docker://x y").as_deref(), Some("apptainer APPTAINERENV_ --oci"));
        // Not an action, or not Apptainer.
        assert_eq!(by("apptainer build --cleanenv x.sif dir"), None);
        assert_eq!(by("python -e apptainer"), None);
        assert_eq!(by("bash run.sh"), None);
        assert_eq!(by("apptainer"), None);
        assert_eq!(by("apptainer --quiet"), None);
        // A cluster with a letter that is not a switch is not read as one.
        assert_eq!(by("apptainer exec -ex img.sif"), None);
    }

    #[test]
    fn the_runtimes_own_variables_ask_for_it_too() {
        let env = |n: &str| (n == "APPTAINER_CONTAINALL").then(|| "true".to_owned());
        let c = clean_env(&argv("apptainer exec img.sif x"), &env).unwrap();
        assert_eq!((c.prefix, c.by.as_str()), ("APPTAINERENV_", "APPTAINER_CONTAINALL"));
        let off = |n: &str| (n == "APPTAINER_CLEANENV").then(|| "false".to_owned());
        assert_eq!(clean_env(&argv("apptainer exec img.sif x"), &off), None);
        // singularity reads SINGULARITY_*, not APPTAINER_*.
        assert_eq!(clean_env(&argv("singularity exec img.sif x"), &env), None);
    }
}
