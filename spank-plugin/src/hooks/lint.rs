//! `spank-gpu lint`'s checks at submit time, in sbatch (`slurm_spank_init`
//! in the allocator context), where the admin's `lint=` word allows.
//!
//! What the plugin can see there, from Slurm's source (src/common/plugstack.c
//! in 22.05, src/common/spank.c from 23.02 to 26.05, the same in every
//! release): `spank_get_item` gives only the `S_SLURM_VERSION*` items in
//! `S_CTX_ALLOCATOR` (`_valid_in_allocator_context` lists `S_JOB_UID` and
//! `S_JOB_GID`, but only with a job, and sbatch's stack has none: `ESPANK_NOT_AVAIL`);
//! `spank_option_getopt` answers `ESPANK_NOT_AVAIL` in `slurm_spank_init` and
//! `slurm_spank_init_post_opt`; `spank_getenv` answers `ESPANK_NOT_REMOTE`
//! outside slurmstepd; the script is never handed to a plugin. So SPANK shows
//! nothing of the job. The plugin runs inside sbatch, as the user, though:
//! sbatch's own command line (`/proc/self/cmdline`), its environment
//! (`SBATCH_*`, read, never changed) and the script file it names are there
//! to read, and `slurm_spank_init` runs before sbatch reads any of them
//! (src/sbatch/sbatch.c: `spank_init_allocator` comes before
//! `process_options_first_pass`). A script sbatch reads from its standard input
//! cannot be seen (reading it would take it from sbatch). The cluster's facts
//! come from `slurm.conf` (no command is run inside Slurm); QoS and other jobs
//! are not known there, so traps 5 (QoS) and 16 are left to `spank-gpu lint`.

use std::collections::BTreeMap;
use std::io::Read;

use batch_lint::facts::{self, Cluster};
use batch_lint::getopt::{self, ArgWord, Program};
use batch_lint::table::Arg;
use batch_lint::{self as lint, DirState, Facts, Input, Release, Report, Trap, script};
use task_plan::options::UserOption;
use task_plan::plugstack::{LintMode, PluginConfig};

use super::HookError;
use crate::spank::{Context, Level, Spank};

/// The largest `slurm.conf` (or included file) read.
const MAX_CONF: usize = 16 << 20;

/// What the plugin reads of the sbatch process it runs in.
pub trait Submit {
    /// sbatch's command line, `argv[0]` first.
    fn argv(&self) -> Option<Vec<String>>;
    /// sbatch's environment.
    fn env(&self) -> BTreeMap<String, String>;
    /// The directory sbatch runs in.
    fn cwd(&self) -> String;
    /// A regular file, at most `max` bytes, read without taking anything
    /// from sbatch: a pipe, a FIFO, a terminal or a device (`sbatch <(...)`,
    /// `sbatch /dev/stdin`) is left unopened for sbatch to read.
    ///
    /// # Errors
    /// It is not a regular file, cannot be read, or is larger.
    fn read(&self, path: &str, max: usize) -> Result<Vec<u8>, Unread>;
    /// What a directory is, for the user.
    fn dir(&self, path: &str) -> DirState;
    /// The user's name (`%u`).
    fn user(&self, env: &BTreeMap<String, String>) -> String;
}

/// Why a file the hook wanted was not read.
#[derive(Debug)]
pub enum Unread {
    /// Not a regular file (its kind in a word): what sbatch reads from it
    /// must stay there for sbatch.
    NotRegular(&'static str),
    /// It could not be read, or is over the limit.
    Io(std::io::Error),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::NotRegular(kind) => write!(f, "a {kind}, not a regular file"),
            Unread::Io(e) => e.fmt(f),
        }
    }
}

/// The kind of a file that is not regular, in a word.
fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "pipe or FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Reads `path` only when it is a regular file. The type is looked at
/// before anything is opened (`stat(2)` follows `/dev/stdin` and
/// `/dev/fd/N` to the pipe behind them, and reads nothing from it), and the
/// file is then opened with `O_NONBLOCK` and looked at again through its
/// descriptor, so a FIFO put in its place meanwhile neither blocks sbatch
/// nor loses a byte. A regular file reopened through `/dev/stdin` gets an
/// offset of its own: sbatch's is not moved.
fn read_regular(path: &str, max: usize) -> Result<Vec<u8>, Unread> {
    use std::os::unix::fs::OpenOptionsExt;
    let check = |m: &std::fs::Metadata| {
        if m.is_file() { Ok(()) } else { Err(Unread::NotRegular(kind_of(m.file_type()))) }
    };
    check(&std::fs::metadata(path).map_err(Unread::Io)?)?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(Unread::Io)?;
    check(&f.metadata().map_err(Unread::Io)?)?;
    let mut buf = Vec::new();
    f.by_ref().take(max as u64 + 1).read_to_end(&mut buf).map_err(Unread::Io)?;
    if buf.len() > max {
        return Err(Unread::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, "too large")));
    }
    Ok(buf)
}

/// The real sbatch process.
struct Process {
    ids: batch_lint::outdirs::Ids,
}

impl Submit for Process {
    fn argv(&self) -> Option<Vec<String>> {
        let raw = std::fs::read("/proc/self/cmdline").ok()?;
        Some(
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        )
    }

    fn env(&self) -> BTreeMap<String, String> {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect()
    }

    fn cwd(&self) -> String {
        std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default()
    }

    fn read(&self, path: &str, max: usize) -> Result<Vec<u8>, Unread> {
        read_regular(path, max)
    }

    fn dir(&self, path: &str) -> DirState {
        batch_lint::outdirs::probe(path)
    }

    fn user(&self, env: &BTreeMap<String, String>) -> String {
        batch_lint::outdirs::user_name(env, &self.ids)
    }
}

/// `slurm_spank_init` in sbatch: checks the script it submits. The only
/// call from the hooks.
///
/// # Errors
/// [`HookError::User`] with `lint=strict` when a trap makes the job certain to fail.
pub fn at_submit<S: Spank>(sp: &S, cfg: &PluginConfig) -> Result<(), HookError> {
    if sp.context() != Context::Allocator || cfg.lint == LintMode::Off {
        return Ok(());
    }
    run(sp, cfg, &Process { ids: batch_lint::outdirs::ids() })
}

/// The script sbatch will submit: its name and text; `None` when it cannot
/// be seen (standard input, a pipe or FIFO such as `sbatch <(...)` or
/// `sbatch /dev/stdin`, a heterogeneous command line, `--help`) or is not
/// sbatch at all (salloc).
fn script_of<S: Spank, P: Submit>(sp: &S, p: &P, argv: &[String]) -> Option<(String, Vec<u8>, Vec<String>)> {
    let (prog, rest) = argv.split_first()?;
    if prog.rsplit('/').next() != Some("sbatch") {
        return None;
    }
    let words: Vec<ArgWord> = rest.iter().map(|w| ArgWord::known(w)).collect();
    let plugins = our_options();
    let parsed = getopt::parse(Program::Sbatch, slurm_sys::VERSION_NUMBER, &plugins, &words);
    if parsed.stop.is_some() || rest.iter().any(|w| w == ":") {
        return None;
    }
    if parsed.opts.iter().any(|o| matches!(o.name.as_str(), "help" | "usage" | "version")) {
        return None;
    }
    let opts = rest[..parsed.operands].to_vec();
    if let Some(wrap) = parsed.opts.iter().rev().find(|o| o.name == "wrap").and_then(|o| o.value.as_ref()) {
        // As sbatch builds it (`_script_wrap`, src/sbatch/sbatch.c).
        let text = format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{}\n", wrap.text);
        return Some(("--wrap".to_owned(), text.into_bytes(), opts));
    }
    let file = rest.get(parsed.operands)?;
    match p.read(file, script::MAX_BYTES) {
        Ok(bytes) => Some((file.clone(), bytes, opts)),
        Err(why) => {
            // sbatch reads it itself (and says what is wrong with it).
            sp.log(Level::Debug, &format!("lint: {file} not checked: {why}"));
            None
        }
    }
}

fn our_options() -> Vec<(String, Arg)> {
    UserOption::ALL.iter().map(|o| (o.name().to_owned(), Arg::Optional)).collect()
}

/// The cluster as `slurm.conf` tells it: `$SLURM_CONF` (what sbatch reads),
/// else the plugstack's `slurm_conf=`, with the files it includes.
fn cluster<P: Submit>(p: &P, env: &BTreeMap<String, String>, cfg: &PluginConfig) -> Cluster {
    let path = env.get("SLURM_CONF").cloned().unwrap_or_else(|| {
        cfg.slurm_conf.clone().unwrap_or_else(|| slurm_formats::conf::DEFAULT_SLURM_CONF.to_owned())
    });
    let Ok(bytes) = p.read(&path, MAX_CONF) else {
        return Cluster::unknown(&format!("{path} cannot be read here (a configless cluster?)"));
    };
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    let dir = path.rsplit_once('/').map_or("/", |(d, _)| d).to_owned();
    for inc in task_plan::nodeaddr::includes(&text.clone(), &dir) {
        if let Ok(b) = p.read(&inc, MAX_CONF) {
            text.push('\n');
            text.push_str(&String::from_utf8_lossy(&b));
        }
    }
    facts::from_slurm_conf(&text, &path)
}

/// The checks, on what `p` shows.
fn run<S: Spank, P: Submit>(sp: &S, cfg: &PluginConfig, p: &P) -> Result<(), HookError> {
    let Some(argv) = p.argv() else { return Ok(()) };
    let Some((file, bytes, opts)) = script_of(sp, p, &argv) else { return Ok(()) };
    // sbatch itself refuses an unreadable script, with its own words.
    let Ok(script) = script::read(&bytes) else { return Ok(()) };
    let env = p.env();
    let input = Input {
        file: file.clone(),
        args: opts,
        user: p.user(&env),
        env: env.clone(),
        cwd: p.cwd(),
        release: slurm_sys::VERSION_NUMBER,
        plugins: our_options(),
        site_auto_rdzv: cfg.auto_rdzv,
    };
    let report: Report = lint::lint(&script, &input, |needs| Facts {
        release: Release { number: slurm_sys::VERSION_NUMBER, from: "this sbatch".into() },
        cluster: cluster(p, &env, cfg),
        dirs: needs.dirs.iter().map(|d| (d.clone(), p.dir(d))).collect(),
    });
    // What sbatch refuses it says itself (and a site plugin's options are
    // not known here); the traps are what it does not say.
    let shown: Vec<_> = report.findings.iter().filter(|f| f.trap != Trap::Refused).collect();
    let strict = cfg.lint == LintMode::Strict;
    let mut refused = 0;
    for f in &shown {
        let refuse = strict && f.trap.strict();
        refused += usize::from(refuse);
        let level = if refuse { Level::Error } else { Level::Info };
        sp.log(level, &f.one_line(&file));
    }
    if refused > 0 {
        return Err(HookError::User(format!(
            "lint=strict: the job is not submitted: {refused} of the findings above make it certain to fail or never start (spank-gpu lint {file} explains them)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::fake::FakeSpank;

    struct Fake {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        files: BTreeMap<String, String>,
        dirs: BTreeMap<String, DirState>,
    }

    impl Submit for Fake {
        fn argv(&self) -> Option<Vec<String>> {
            Some(self.argv.clone())
        }
        fn env(&self) -> BTreeMap<String, String> {
            self.env.clone()
        }
        fn cwd(&self) -> String {
            "/home/u".into()
        }
        fn read(&self, path: &str, _max: usize) -> Result<Vec<u8>, Unread> {
            if path.starts_with("/dev/fd/") || path == "/dev/stdin" {
                return Err(Unread::NotRegular("pipe or FIFO"));
            }
            self.files
                .get(path)
                .map(|t| t.clone().into_bytes())
                .ok_or_else(|| Unread::Io(std::io::ErrorKind::NotFound.into()))
        }
        fn dir(&self, path: &str) -> DirState {
            self.dirs.get(path).cloned().unwrap_or(DirState::Dir { writable: true })
        }
        fn user(&self, _env: &BTreeMap<String, String>) -> String {
            "u".into()
        }
    }

    #[test]
    fn only_regular_files_are_read_and_a_pipe_keeps_every_byte() {
        use std::io::Read as _;
        use std::os::fd::AsRawFd;
        let base = std::env::temp_dir().join(format!("spank-gpu-lint-hook-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let file = base.join("job.sh");
        std::fs::write(&file, "#!/bin/bash\necho hi\n").unwrap();
        let path = |p: &std::path::Path| p.display().to_string();
        assert_eq!(read_regular(&path(&file), 100).unwrap(), b"#!/bin/bash\necho hi\n");
        assert!(matches!(read_regular(&path(&file), 5), Err(Unread::Io(_))), "over the limit");
        // A FIFO with no writer yet: answered at once, never opened.
        let fifo = base.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        assert!(matches!(read_regular(&path(&fifo), 100), Err(Unread::NotRegular("pipe or FIFO"))));
        assert!(matches!(read_regular("/dev/null", 100), Err(Unread::NotRegular("character device"))));
        assert!(matches!(read_regular(&path(&base), 100), Err(Unread::NotRegular("directory"))));
        // `sbatch <(...)`: /dev/fd/N of a pipe with the script in it.
        let mut child = std::process::Command::new("printf")
            .arg("#!/bin/bash\\necho hi\\n")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        assert!(child.wait().unwrap().success());
        let dev_fd = format!("/dev/fd/{}", out.as_raw_fd());
        assert!(matches!(read_regular(&dev_fd, 100), Err(Unread::NotRegular("pipe or FIFO"))));
        let mut left = String::new();
        out.read_to_string(&mut left).unwrap();
        assert_eq!(left, "#!/bin/bash\necho hi\n", "the pipe lost bytes");
        std::fs::remove_dir_all(&base).unwrap();
    }

    const CONF: &str = "NodeName=node[1-2] CPUs=8 RealMemory=4000 Gres=gpu:h100:8\nPartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE\n";

    fn fake(argv: &str, script: &str) -> Fake {
        let mut files = BTreeMap::new();
        files.insert("/etc/slurm/slurm.conf".to_owned(), CONF.to_owned());
        files.insert("job.sh".to_owned(), script.to_owned());
        Fake {
            argv: argv.split_whitespace().map(str::to_owned).collect(),
            env: BTreeMap::new(),
            files,
            dirs: BTreeMap::new(),
        }
    }

    fn logged(sp: &FakeSpank) -> Vec<(Level, String)> {
        sp.log.borrow().clone()
    }

    const TRAPS_2_3_10: &str = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --time=10\n#SBATCH --array=0-1\n#SBATCH --output=logs/x.out\n#SBATCH --signal=USR1@60\n\
                                trap 'touch stop' USR1\nsrun hostname &\nwait\n";

    #[test]
    fn findings_are_one_line_each_and_the_job_goes_on() {
        let sp = FakeSpank::new(Context::Allocator);
        let p = fake("/usr/bin/sbatch --parsable job.sh", TRAPS_2_3_10);
        assert_eq!(run(&sp, &PluginConfig::default(), &p), Ok(()));
        let log = logged(&sp);
        let ids: Vec<&str> = log.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(log.len(), 3, "{ids:#?}");
        assert!(
            log.iter().all(|(lvl, l)| *lvl == Level::Info && !l.contains('\n') && l.starts_with("job.sh:"))
        );
        assert!(ids[0].starts_with("job.sh:5: --output=logs/x.out names no %a"), "{}", ids[0]);
        assert!(ids[1].starts_with("job.sh:6: --signal=USR1@60 sends USR1 to the job's steps"), "{}", ids[1]);
        assert!(
            ids[2].starts_with("job.sh:8: srun spans 2 nodes without --kill-on-bad-exit=1"),
            "{}",
            ids[2]
        );
    }

    #[test]
    fn strict_refuses_only_the_certain_failures() {
        let cfg = PluginConfig { lint: LintMode::Strict, ..PluginConfig::default() };
        let sp = FakeSpank::new(Context::Allocator);
        assert_eq!(run(&sp, &cfg, &fake("sbatch job.sh", TRAPS_2_3_10)), Ok(()), "traps 2, 3, 10 only warn");
        let sp = FakeSpank::new(Context::Allocator);
        let trap8 = "#!/bin/bash\n#SBATCH --time=10\n#SBATCH --gres=gpu:a100:2\nsrun hostname\n";
        let e = run(&sp, &cfg, &fake("sbatch job.sh", trap8)).unwrap_err();
        assert!(
            matches!(&e, HookError::User(m) if m.starts_with("lint=strict: the job is not submitted")),
            "{e:?}"
        );
        let log = logged(&sp);
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].0, Level::Error);
        assert!(
            log[0].1.contains("no node of this cluster has gpu:a100 (it has gpu:h100:8)"),
            "{}",
            log[0].1
        );
    }

    #[test]
    fn what_cannot_be_seen_is_left_alone() {
        let cfg = PluginConfig::default();
        for argv in [
            "sbatch",
            "sbatch --parsable",
            "sbatch --help job.sh",
            "salloc -N2",
            "sbatch -N1 : -N2 job.sh",
            "sbatch --bogus job.sh",
        ] {
            let sp = FakeSpank::new(Context::Allocator);
            assert_eq!(run(&sp, &cfg, &fake(argv, TRAPS_2_3_10)), Ok(()), "{argv}");
            assert!(logged(&sp).is_empty(), "{argv}: {:?}", logged(&sp));
        }
        // A script sbatch reads from a pipe is sbatch's alone: one debug line.
        for (argv, why) in [
            ("sbatch /dev/fd/63", "/dev/fd/63 not checked: a pipe or FIFO, not a regular file"),
            ("sbatch -N1 /dev/stdin", "/dev/stdin not checked: a pipe or FIFO, not a regular file"),
            ("sbatch missing.sh", "missing.sh not checked: entity not found"),
        ] {
            let sp = FakeSpank::new(Context::Allocator);
            assert_eq!(run(&sp, &cfg, &fake(argv, TRAPS_2_3_10)), Ok(()), "{argv}");
            assert_eq!(logged(&sp), vec![(Level::Debug, format!("lint: {why}"))], "{argv}");
        }
        // Not sbatch's context, or lint=off: nothing is read at all.
        let sp = FakeSpank::new(Context::Local);
        assert_eq!(at_submit(&sp, &cfg), Ok(()));
        let sp = FakeSpank::new(Context::Allocator);
        assert_eq!(at_submit(&sp, &PluginConfig { lint: LintMode::Off, ..cfg }), Ok(()));
        assert!(logged(&sp).is_empty());
    }

    #[test]
    fn wrap_and_command_line_options_are_read() {
        let sp = FakeSpank::new(Context::Allocator);
        let p = fake("sbatch --time=10 --mem=0 --wrap=hostname", "");
        assert_eq!(run(&sp, &PluginConfig::default(), &p), Ok(()));
        let log = logged(&sp);
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(log[0].1.starts_with("--wrap: sbatch's command line: --mem=0 takes all"), "{}", log[0].1);
    }

    #[test]
    fn sbatch_conf_comes_from_its_environment() {
        let sp = FakeSpank::new(Context::Allocator);
        let mut p = fake("sbatch job.sh", "#!/bin/bash\n#SBATCH --gres=gpu:h100:2\nsrun hostname\n");
        p.files.insert("/lab/etc/slurm.conf".into(), CONF.replace("h100", "a100"));
        p.env.insert("SLURM_CONF".into(), "/lab/etc/slurm.conf".into());
        assert_eq!(run(&sp, &PluginConfig::default(), &p), Ok(()));
        let log = logged(&sp);
        assert!(
            log.iter().any(|(_, l)| l.contains("no node of this cluster has gpu:h100 (it has gpu:a100:8)")),
            "{log:?}"
        );
    }
}
