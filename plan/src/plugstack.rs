//! The admin's arguments on the plugin's `plugstack.conf` line.
//!
//! ```text
//! required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gpu.so auto_rdzv=on gpu_affinity=off
//! ```
//!
//! Every word is `key=value`. Lower-case keys are settings (listed in
//! [`KEYS`]); an UPPER-CASE key is a site default for that environment
//! variable (`NCCL_SOCKET_IFNAME=ib0`, `TORCH_NCCL_ASYNC_ERROR_HANDLING=1`),
//! set in every task with `--auto-rdzv` active where the user set nothing.
//! Parsing is strict: an unknown key, a repeated key
//! or a bad value is an error naming the word, and the plugin then stays out of
//! the way for that process (it logs the error once and does nothing else), so a
//! typo on the plugstack line can never fail or change jobs silently.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::nodeaddr::MasterAddr;
use crate::ports::{DEFAULT_PORT_RANGE, PortRange};

/// A SPANK hook the plugin implements, as named in Slurm's API without the
/// `slurm_spank_` prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `slurm_spank_init`: every context.
    Init,
    /// `slurm_spank_user_init`: slurmstepd, before tasks are forked.
    UserInit,
    /// `slurm_spank_task_init`: slurmstepd, in each forked task before exec.
    TaskInit,
}

impl Hook {
    /// Every hook the plugin implements.
    pub const ALL: [Hook; 3] = [Hook::Init, Hook::UserInit, Hook::TaskInit];

    /// The hook's name in logs and on the plugstack line.
    pub const fn name(self) -> &'static str {
        match self {
            Hook::Init => "init",
            Hook::UserInit => "user_init",
            Hook::TaskInit => "task_init",
        }
    }

    fn from_name(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.name() == name)
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The plugin's configuration from its plugstack line. `Default` is what an
/// empty line gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    /// `auto_rdzv=on|off` (default off): whether `--auto-rdzv` is on for jobs
    /// that do not give the option.
    pub auto_rdzv: bool,
    /// `gpu_affinity=on|off` (default off): whether `--gpu-affinity` is on for
    /// jobs that do not give the option.
    pub gpu_affinity: bool,
    /// `port_range=LO-HI` (default 20000-29999): where derived `MASTER_PORT`s fall.
    pub port_range: PortRange,
    /// `topology_dir=DIR` (default [`crate::gputable::DEFAULT_DIR`]): where
    /// `gpu-node-agent` writes the GPU table `--gpu-affinity` uses.
    pub topology_dir: String,
    /// `job_map=on|off`: the job prolog writes which job holds which GPU (for
    /// the agent's per-job usage and DCGM exporter's job labels); on by default.
    pub job_map: bool,
    /// Site defaults for environment variables, in plugstack order
    /// (`nccl_socket_ifname=X` is `NCCL_SOCKET_IFNAME=X`).
    pub env_defaults: Vec<(String, String)>,
    /// `nccl_socket_net=CIDR[,CIDR]` (default none): the fabric named by its
    /// network ([`crate::netif::parse_nets`]). On each node, the running
    /// interfaces with an address in it become `NCCL_SOCKET_IFNAME` (exact
    /// names) and the first `GLOO_SOCKET_IFNAME`, where the task has neither
    /// ([`crate::netif::node_offers`]). Not with a site default for either.
    pub nccl_socket_net: Vec<crate::netif::Cidr>,
    /// `master_addr=nodename|hostname|addr` (default nodename): which name of
    /// the first node `MASTER_ADDR` is.
    pub master_addr: MasterAddr,
    /// `resv_ports=on|off` (default off): use the last port Slurm reserved for
    /// the step (`MpiParams=ports=`) as `MASTER_PORT`.
    pub resv_ports: bool,
    /// `slurm_conf=FILE`: where NodeHostname and NodeAddr are read for
    /// `master_addr=hostname|addr`; `None` when not given (then the file
    /// slurmd read, see [`crate::nodeaddr::slurm_conf_path`]).
    pub slurm_conf: Option<String>,
    /// `lint=warn|off|strict` (default warn): what sbatch does with the traps
    /// `spank-gpu lint` finds in a batch script at submit time.
    pub lint: LintMode,
    /// `timing=on|off` (default off): slurmstepd logs, at info level in
    /// slurmd's log, how long each of the plugin's hooks took there
    /// (`spank-gpu: timing: task_init 38 us`), for an admin who wants to
    /// know what the plugin costs a launch.
    pub timing: bool,
    /// `debug_panic=HOOK[+HOOK...]`, accepted only by debug builds: panic inside
    /// these hooks, to prove that the guard keeps the step alive.
    pub debug_panic: Vec<Hook>,
    /// `debug_nodelist=EXPR`, accepted only by debug builds: use this as the
    /// step's node list, to test what a garbage list does.
    pub debug_nodelist: Option<String>,
    /// `debug_dev_dir=DIR`, accepted only by debug builds: where the GPU
    /// device files `nvidia<minor>` are, instead of
    /// [`crate::devices::DEFAULT_DEV_DIR`] (the lab's fake GPUs).
    pub debug_dev_dir: Option<String>,
    /// `debug_fail=SEAM[+SEAM...]`, accepted only by debug builds: the named
    /// calls to the node fail (`set_affinity`, `prefer_memory`, `affinity`), so
    /// an end-to-end test shows what still works when one does.
    pub debug_fail: Vec<String>,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            auto_rdzv: false,
            gpu_affinity: false,
            port_range: DEFAULT_PORT_RANGE,
            topology_dir: crate::gputable::DEFAULT_DIR.to_owned(),
            job_map: true,
            env_defaults: Vec::new(),
            nccl_socket_net: Vec::new(),
            master_addr: MasterAddr::NodeName,
            resv_ports: false,
            slurm_conf: None,
            lint: LintMode::Warn,
            timing: false,
            debug_panic: Vec::new(),
            debug_nodelist: None,
            debug_dev_dir: None,
            debug_fail: Vec::new(),
        }
    }
}

/// `lint=`: what the plugin does at submit time with a batch script's traps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LintMode {
    /// Prints each finding on sbatch's stderr, one line each; the job is queued.
    #[default]
    Warn,
    /// Checks nothing.
    Off,
    /// As `warn`, and refuses the submit for the traps that make a job certain
    /// to fail or never start (`batch_lint::Trap::strict`).
    Strict,
}

impl LintMode {
    fn parse(value: &str) -> Result<LintMode, String> {
        match value {
            "warn" => Ok(LintMode::Warn),
            "off" => Ok(LintMode::Off),
            "strict" => Ok(LintMode::Strict),
            _ => Err(format!("expected warn, off or strict, got '{value}'")),
        }
    }
}

/// Whether `key` is an environment-variable name written in upper case.
fn is_env_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// A plugstack word that could not be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgError {
    /// The word as written on the plugstack line.
    pub word: String,
    /// What is wrong with it, in words.
    pub reason: String,
    /// What is wrong with it.
    pub kind: ArgErrorKind,
}

/// What is wrong with a plugstack word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgErrorKind {
    /// Not `key=value`.
    NotKeyValue,
    /// A key this build does not know.
    UnknownKey,
    /// A key (or environment variable) given a second time.
    Repeated,
    /// A known key with a value it does not take.
    BadValue,
    /// An environment default for a variable the plugin computes per task.
    Computed,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugstack.conf argument '{}': {}",
            slurm_formats::text::clip(&self.word, 80),
            slurm_formats::text::clip(&self.reason, 240)
        )
    }
}

impl std::error::Error for ArgError {}

/// The keys a release build accepts, for error messages and docs.
pub const KEYS: &[&str] = &[
    "auto_rdzv",
    "gpu_affinity",
    "port_range",
    "topology_dir",
    "nccl_socket_ifname",
    "nccl_socket_net",
    "master_addr",
    "slurm_conf",
    "resv_ports",
    "lint",
    "timing",
    "job_map",
];

/// Whether the plugstack words turn `timing` on, read apart from the rest
/// (so the hook's own timing does not parse the whole line twice): the
/// same words [`PluginConfig::parse`] accepts for it.
pub fn timing_on<S: AsRef<str>>(words: &[S]) -> bool {
    words.iter().any(|w| w.as_ref().strip_prefix("timing=").is_some_and(|v| on_off(v) == Ok(true)))
}

fn on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" | "yes" | "1" => Ok(true),
        "off" | "no" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got '{value}'")),
    }
}

impl PluginConfig {
    /// Parses the plugstack words. `debug_hooks` says whether this build
    /// accepts the test-only `debug_panic` key.
    ///
    /// # Errors
    /// The first word that is not `key=value`, names an unknown key, repeats
    /// a key or has a bad value.
    pub fn parse<S: AsRef<str>>(words: &[S], debug_hooks: bool) -> Result<PluginConfig, ArgError> {
        let mut cfg = PluginConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for word in words {
            let word = word.as_ref();
            let err = |kind, reason: String| ArgError { word: word.to_owned(), reason, kind };
            let bad = |reason: String| err(ArgErrorKind::BadValue, reason);
            let Some((key, value)) = word.split_once('=') else {
                return Err(err(ArgErrorKind::NotKeyValue, "expected key=value".to_owned()));
            };
            if seen.contains(&key) {
                return Err(err(ArgErrorKind::Repeated, format!("'{key}' is given more than once")));
            }
            match key {
                "auto_rdzv" => cfg.auto_rdzv = on_off(value).map_err(bad)?,
                "gpu_affinity" => cfg.gpu_affinity = on_off(value).map_err(bad)?,
                "resv_ports" => cfg.resv_ports = on_off(value).map_err(bad)?,
                "port_range" => cfg.port_range = PortRange::parse(value).map_err(bad)?,
                "topology_dir" => cfg.topology_dir = slurm_formats::conf::clean_path(value).map_err(bad)?,
                "slurm_conf" => cfg.slurm_conf = Some(slurm_formats::conf::clean_path(value).map_err(bad)?),
                "master_addr" => cfg.master_addr = MasterAddr::parse(value).map_err(bad)?,
                "lint" => cfg.lint = LintMode::parse(value).map_err(bad)?,
                "timing" => cfg.timing = on_off(value).map_err(bad)?,
                "job_map" => cfg.job_map = on_off(value).map_err(bad)?,
                "nccl_socket_ifname" => {
                    if value.is_empty() {
                        return Err(bad("needs an interface name (or leave the word out)".to_owned()));
                    }
                    crate::netif::check_ifname_value(value).map_err(bad)?;
                    if !cfg.nccl_socket_net.is_empty() {
                        return Err(err(
                            ArgErrorKind::Repeated,
                            both_interface_sources("NCCL_SOCKET_IFNAME"),
                        ));
                    }
                    if cfg.env_defaults.iter().any(|(n, _)| n == "NCCL_SOCKET_IFNAME") {
                        return Err(err(
                            ArgErrorKind::Repeated,
                            "NCCL_SOCKET_IFNAME is given more than once".to_owned(),
                        ));
                    }
                    cfg.env_defaults.push(("NCCL_SOCKET_IFNAME".to_owned(), value.to_owned()));
                }
                "nccl_socket_net" => {
                    if value.is_empty() {
                        return Err(bad("needs a network, CIDR[,CIDR] (or leave the word out)".to_owned()));
                    }
                    cfg.nccl_socket_net = crate::netif::parse_nets(value).map_err(bad)?;
                    if let Some((n, _)) =
                        cfg.env_defaults.iter().find(|(n, _)| crate::netif::is_interface_var(n))
                    {
                        return Err(err(ArgErrorKind::Repeated, both_interface_sources(n)));
                    }
                }
                "debug_nodelist" if debug_hooks => cfg.debug_nodelist = Some(value.to_owned()),
                "debug_dev_dir" if debug_hooks => cfg.debug_dev_dir = Some(value.to_owned()),
                "debug_fail" if debug_hooks => {
                    for seam in value.split('+') {
                        if !DEBUG_SEAMS.contains(&seam) {
                            return Err(bad(format!(
                                "unknown seam '{seam}' (seams: {})",
                                DEBUG_SEAMS.join(", ")
                            )));
                        }
                        cfg.debug_fail.push(seam.to_owned());
                    }
                }
                _ if is_env_name(key) => {
                    if crate::record::COMPUTED_VARS.contains(&key) {
                        return Err(err(
                            ArgErrorKind::Computed,
                            format!("{key} is computed per task and cannot be a site default"),
                        ));
                    }
                    if cfg.env_defaults.iter().any(|(n, _)| n == key) {
                        return Err(err(ArgErrorKind::Repeated, format!("{key} is given more than once")));
                    }
                    if crate::netif::is_interface_var(key) && !cfg.nccl_socket_net.is_empty() {
                        return Err(err(ArgErrorKind::Repeated, both_interface_sources(key)));
                    }
                    check_interface_default(key, value).map_err(bad)?;
                    cfg.env_defaults.push((key.to_owned(), value.to_owned()));
                }
                "debug_panic" if debug_hooks => {
                    for name in value.split('+') {
                        let hook = Hook::from_name(name).ok_or_else(|| {
                            let all: Vec<_> = Hook::ALL.iter().map(|h| h.name()).collect();
                            bad(format!("unknown hook '{name}' (hooks: {})", all.join(", ")))
                        })?;
                        cfg.debug_panic.push(hook);
                    }
                }
                _ => {
                    return Err(err(
                        ArgErrorKind::UnknownKey,
                        format!(
                            "unknown key '{key}' (known keys: {}; UPPER_CASE keys set environment defaults)",
                            KEYS.join(", ")
                        ),
                    ));
                }
            }
            seen.push(key);
        }
        Ok(cfg)
    }

    /// Where the GPU device files are (`debug_dev_dir=` in debug builds, else `/dev`).
    pub fn dev_dir(&self) -> &str {
        self.debug_dev_dir.as_deref().unwrap_or(crate::devices::DEFAULT_DEV_DIR)
    }

    /// Whether a debug build was told to make the call `seam` fail.
    pub fn fails(&self, seam: &str) -> bool {
        self.debug_fail.iter().any(|s| s == seam)
    }

    /// Whether a debug build was told to panic in `hook`.
    pub fn panics_in(&self, hook: Hook) -> bool {
        self.debug_panic.contains(&hook)
    }
}

/// The calls `debug_fail=` can make fail.
pub const DEBUG_SEAMS: [&str; 4] = ["set_affinity", "prefer_memory", "affinity", "open_dev_dir"];

/// One line of `plugstack.conf` (or a file it includes), read as Slurm reads
/// it (`src/common/spank.c`, `_plugin_stack_parse_line`, the same from 22.05
/// to 26.05): everything from `#` is a comment, words are split on blanks,
/// the first is `required`, `optional` or `include`, the second the plugin's
/// path (searched in `PluginDir` when relative) or the include's glob(3)
/// pattern (relative to the including file's directory), and the rest are the
/// plugin's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StackLine {
    /// `required PATH ARGS...` or `optional PATH ARGS...`.
    Plugin {
        /// `required`: Slurm fails (slurmd does not start, the job does not
        /// run) when the plugin does not load.
        required: bool,
        /// As written.
        path: String,
        /// The words after the path.
        args: Vec<String>,
    },
    /// `include PATTERN`.
    Include(String),
}

impl StackLine {
    /// The line's meaning; `Ok(None)` for a blank or comment line.
    ///
    /// # Errors
    /// A first word Slurm does not know, or no second word: Slurm logs
    /// `Invalid line. Ignoring.` and goes on with the next line.
    pub fn parse(line: &str) -> Result<Option<StackLine>, String> {
        let text = line.split('#').next().unwrap_or("");
        // Slurm's separators are " \t\n" only: a `\r` (a file edited on Windows) stays in
        // the word, and Slurm then finds no such plugin.
        let mut words = text.split([' ', '\t', '\n']).filter(|w| !w.is_empty());
        let Some(first) = words.next() else { return Ok(None) };
        let required = match first {
            "required" => true,
            "optional" => false,
            "include" => {
                let pattern = words.next().ok_or("include without a pattern")?;
                return Ok(Some(StackLine::Include(pattern.to_owned())));
            }
            other => return Err(format!("'{other}' is not required, optional or include")),
        };
        let path = words.next().ok_or_else(|| format!("{first} without a plugin"))?.to_owned();
        Ok(Some(StackLine::Plugin { required, path, args: words.map(str::to_owned).collect() }))
    }

    /// Whether this line loads spank-gpu's plugin: a path whose file name is
    /// `spank_gpu.so` (as packaged) or `libspank_gpu.so` (as cargo builds it).
    pub fn is_spank_gpu(&self) -> bool {
        let StackLine::Plugin { path, .. } = self else { return false };
        let name = path.rsplit('/').next().unwrap_or_default();
        name == PLUGIN_FILE || name.strip_prefix("lib") == Some(PLUGIN_FILE)
    }

    /// Whether this line loads pyxis (`spank_pyxis.so`), whose `task_init`
    /// copies a container's environment over the task's: spank_gpu must come
    /// after it (see `crate::rdzv::container`).
    pub fn is_pyxis(&self) -> bool {
        let StackLine::Plugin { path, .. } = self else { return false };
        path.rsplit('/').next() == Some(PYXIS_FILE)
    }
}

/// How deep a walk of the plugstack files follows `include`s.
pub const MAX_INCLUDE_DEPTH: usize = 8;

/// The files a walk of the plugstack reads, through whoever walks it: the
/// agent reads as root (files root or it owns, no link followed, size-capped),
/// `spank-gpu explain` as the user.
pub trait StackFiles {
    /// A plugstack file's text (invalid UTF-8 replaced).
    ///
    /// # Errors
    /// It cannot be read (the error names the path); `NotFound` when it does
    /// not exist.
    fn read(&mut self, path: &Path) -> io::Result<String>;
    /// The names in a directory, for an include's glob pattern.
    ///
    /// # Errors
    /// It cannot be listed; `NotFound` when it does not exist.
    fn names(&mut self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether a file exists (an include without glob characters).
    fn exists(&mut self, path: &Path) -> bool;
}

/// What a walk of the plugstack meets, in Slurm's order.
#[derive(Debug)]
pub enum StackEvent<'a> {
    /// A plugin's line: the file and line (1-based) it is on.
    Plugin {
        /// The file.
        file: &'a Path,
        /// Its line, 1-based.
        line: usize,
        /// The line read: always a [`StackLine::Plugin`].
        entry: StackLine,
    },
    /// A line Slurm ignores (`Invalid line`): the file, the line, its text and why.
    Ignored {
        /// The file.
        file: &'a Path,
        /// Its line, 1-based.
        line: usize,
        /// The line's text.
        text: &'a str,
        /// Why Slurm ignores it.
        why: String,
    },
    /// Something the walk could not follow, in words (a file that cannot be
    /// read, an include nested too deep or that cannot be listed).
    Problem(String),
}

/// Walks `plugstack.conf` (`root`) and the files it includes, as Slurm reads
/// them (spank.c `_spank_stack_process_line`): lines as `fgets` cuts them (a
/// `\r` before the `\n` stays in the line), an include's pattern relative to
/// the including file's directory, its matches in glob(3)'s sorted order, at
/// most [`MAX_INCLUDE_DEPTH`] deep. A missing `root` is a problem (Slurm reads
/// it as empty). `visit` says whether to go on.
pub fn walk_stack(root: &Path, files: &mut dyn StackFiles, visit: &mut dyn FnMut(StackEvent<'_>) -> bool) {
    walk_file(root, 0, files, visit);
}

fn walk_file(
    path: &Path,
    depth: usize,
    files: &mut dyn StackFiles,
    visit: &mut dyn FnMut(StackEvent<'_>) -> bool,
) -> bool {
    let text = match files.read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound && depth == 0 => {
            return visit(StackEvent::Problem(format!("{} does not exist", path.display())));
        }
        Err(e) => return visit(StackEvent::Problem(format!("cannot read {e}"))),
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    for (n, line) in text.split('\n').enumerate() {
        let go_on = match StackLine::parse(line) {
            Ok(Some(StackLine::Include(_))) if depth + 1 > MAX_INCLUDE_DEPTH => {
                visit(StackEvent::Problem(format!(
                    "{}:{}: includes nested past {MAX_INCLUDE_DEPTH}: not followed",
                    path.display(),
                    n + 1
                )))
            }
            Ok(Some(StackLine::Include(pattern))) => match include_files(dir, &pattern, files) {
                Ok(found) => found.iter().all(|f| walk_file(f, depth + 1, files, visit)),
                Err(why) => visit(StackEvent::Problem(format!(
                    "{}:{}: include {pattern}: {why}",
                    path.display(),
                    n + 1
                ))),
            },
            Ok(Some(entry)) => visit(StackEvent::Plugin { file: path, line: n + 1, entry }),
            Ok(None) => true,
            Err(why) => visit(StackEvent::Ignored { file: path, line: n + 1, text: line, why }),
        };
        if !go_on {
            return false;
        }
    }
    true
}

/// Which of spank_gpu and pyxis a plugstack loads first, by their first lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackOrder {
    /// spank_gpu, then pyxis: every SPANK hook of spank_gpu runs before pyxis's.
    SpankGpuFirst,
    /// pyxis, then spank_gpu (the package's order).
    PyxisFirst,
    /// Not both are listed (or the files could not be read far enough to tell).
    NotBoth,
}

/// Which of spank_gpu and pyxis the plugstack `root` (and its includes,
/// [`walk_stack`]) loads first.
pub fn stack_order(root: &Path, files: &mut dyn StackFiles) -> StackOrder {
    let (mut gpu, mut pyxis, mut seq) = (None, None, 0usize);
    walk_stack(root, files, &mut |event| {
        if let StackEvent::Plugin { entry, .. } = event {
            if entry.is_spank_gpu() {
                gpu.get_or_insert(seq);
            } else if entry.is_pyxis() {
                pyxis.get_or_insert(seq);
            }
            seq += 1;
        }
        gpu.is_none() || pyxis.is_none()
    });
    match (gpu, pyxis) {
        (Some(g), Some(p)) if g < p => StackOrder::SpankGpuFirst,
        (Some(_), Some(_)) => StackOrder::PyxisFirst,
        _ => StackOrder::NotBoth,
    }
}

/// The files an include pattern names, sorted as glob(3) sorts them. The
/// pattern may have glob characters in its file name only.
pub fn include_files(dir: &Path, pattern: &str, files: &mut dyn StackFiles) -> Result<Vec<PathBuf>, String> {
    let full = if pattern.starts_with('/') { PathBuf::from(pattern) } else { dir.join(pattern) };
    let name = full.file_name().and_then(|n| n.to_str()).ok_or("no file name")?.to_owned();
    let parent = full.parent().unwrap_or(Path::new("/"));
    let globby = |s: &str| s.contains(['*', '?', '[']);
    if globby(&parent.to_string_lossy()) {
        return Err("glob characters in a directory name are not followed".to_owned());
    }
    if !globby(&name) {
        return Ok(if files.exists(&full) { vec![full] } else { Vec::new() });
    }
    let names = match files.names(parent) {
        Ok(names) => names,
        // glob(3) finds nothing in a missing directory.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", parent.display())),
    };
    let mut found: Vec<PathBuf> =
        names.into_iter().filter(|n| glob_match(&name, n)).map(|n| parent.join(n)).collect();
    found.sort();
    Ok(found)
}

/// The plugin's file name, as packaged.
pub const PLUGIN_FILE: &str = "spank_gpu.so";
/// pyxis's plugin file name.
pub const PYXIS_FILE: &str = "spank_pyxis.so";

/// Whether a file name matches one component of a glob(3) pattern: `*` any
/// run of characters, `?` any one, `[...]` one of a set (`[!...]` none of
/// it, `a-z` a range), `\x` the character `x`; a name starting with `.`
/// only matches a pattern that starts with `.`, as glob(3) does.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Backtracking over the last `*`: linear in practice, never recursive.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => class(&p, pi, n[ni]),
            Some('\\') if pi + 1 < p.len() => (p[pi + 1] == n[ni]).then_some(pi + 2),
            Some(&c) => (c == n[ni]).then_some(pi + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                ni += 1;
            }
            (None, Some((sp, sn))) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the bracket expression starting at `p[start]`:
/// the index after it when `c` is in the set. An unclosed `[` is a plain
/// character, as in glob(3).
fn class(p: &[char], start: usize, c: char) -> Option<usize> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let mut found = false;
    let mut first = true;
    loop {
        match p.get(i) {
            None => return (c == '[').then_some(start + 1),
            Some(']') if !first => break,
            Some(&lo) => {
                if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&hi| hi != ']') {
                    found |= (lo..=p[i + 2]).contains(&c);
                    i += 3;
                } else {
                    found |= lo == c;
                    i += 1;
                }
            }
        }
        first = false;
    }
    (found != negate).then_some(i + 1)
}

/// Why `nccl_socket_net` and a site default for `name` are refused together.
fn both_interface_sources(name: &str) -> String {
    format!(
        "{name} is given twice: nccl_socket_net sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on each \
         node from its interfaces; give the network or the name, not both"
    )
}

/// An interface variable's site default, read as NCCL or gloo will read it:
/// refused where they would misread it ([`crate::netif`]).
fn check_interface_default(name: &str, value: &str) -> Result<(), String> {
    if name == "NCCL_SOCKET_IFNAME" {
        crate::netif::check_ifname_value(value)
    } else if name == "GLOO_SOCKET_IFNAME" {
        crate::netif::gloo_trap(value).map_or(Ok(()), Err)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plugstack files in memory, and a file that cannot be read.
    struct Mem(Vec<(&'static str, &'static str)>);

    impl StackFiles for Mem {
        fn read(&mut self, path: &Path) -> io::Result<String> {
            if path == Path::new("/etc/slurm/denied.conf") {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "/etc/slurm/denied.conf: denied",
                ));
            }
            let found = self.0.iter().find(|(p, _)| Path::new(p) == path);
            found.map(|(_, t)| (*t).to_owned()).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }

        fn names(&mut self, dir: &Path) -> io::Result<Vec<String>> {
            let names: Vec<String> = self
                .0
                .iter()
                .filter_map(|(p, _)| Path::new(p).strip_prefix(dir).ok()?.to_str().map(str::to_owned))
                .filter(|n| !n.contains('/'))
                .collect();
            if names.is_empty() { Err(io::Error::from(io::ErrorKind::NotFound)) } else { Ok(names) }
        }

        fn exists(&mut self, path: &Path) -> bool {
            path == Path::new("/etc/slurm/denied.conf") || self.0.iter().any(|(p, _)| Path::new(p) == path)
        }
    }

    fn walked(files: Vec<(&'static str, &'static str)>) -> Vec<String> {
        let mut out = Vec::new();
        walk_stack(Path::new("/etc/slurm/plugstack.conf"), &mut Mem(files), &mut |event| {
            out.push(match event {
                StackEvent::Plugin { file, line, entry: StackLine::Plugin { path, .. } } => {
                    format!("{}:{line} {path}", file.display())
                }
                StackEvent::Plugin { .. } => "include?".to_owned(),
                StackEvent::Ignored { file, line, text, .. } => {
                    format!("{}:{line} ignored {text}", file.display())
                }
                StackEvent::Problem(why) => why,
            });
            true
        });
        out
    }

    #[test]
    fn the_stack_is_walked_as_slurm_reads_it() {
        let out = walked(vec![
            (
                "/etc/slurm/plugstack.conf",
                "optional a.so\ninclude plugstack.conf.d/*.conf\nbogus x\ninclude denied.conf\n",
            ),
            ("/etc/slurm/plugstack.conf.d/20-gpu.conf", "required spank_gpu.so\r\n"),
            ("/etc/slurm/plugstack.conf.d/10-pyxis.conf", "required spank_pyxis.so\n"),
            ("/etc/slurm/plugstack.conf.d/.hidden.conf", "required hidden.so\n"),
        ]);
        assert_eq!(
            out,
            [
                "/etc/slurm/plugstack.conf:1 a.so",
                "/etc/slurm/plugstack.conf.d/10-pyxis.conf:1 spank_pyxis.so",
                // fgets keeps the \r: Slurm looks for a file `spank_gpu.so\r`.
                "/etc/slurm/plugstack.conf.d/20-gpu.conf:1 spank_gpu.so\r",
                "/etc/slurm/plugstack.conf:3 ignored bogus x",
                "cannot read /etc/slurm/denied.conf: denied",
            ]
        );
        assert_eq!(walked(vec![]), ["/etc/slurm/plugstack.conf does not exist"]);
        // An include of itself stops at the depth limit, said once.
        let out = walked(vec![("/etc/slurm/plugstack.conf", "include plugstack.conf\n")]);
        assert_eq!(
            out,
            [format!("/etc/slurm/plugstack.conf:1: includes nested past {MAX_INCLUDE_DEPTH}: not followed")]
        );
        let out = walked(vec![("/etc/slurm/plugstack.conf", "include */x.conf\n")]);
        assert!(out[0].ends_with("glob characters in a directory name are not followed"), "{out:?}");
    }

    #[test]
    fn which_of_spank_gpu_and_pyxis_comes_first() {
        let order = |files: Vec<(&'static str, &'static str)>| {
            stack_order(Path::new("/etc/slurm/plugstack.conf"), &mut Mem(files))
        };
        let root = ("/etc/slurm/plugstack.conf", "optional a.so\ninclude plugstack.conf.d/*.conf\n");
        let pyxis = ("/etc/slurm/plugstack.conf.d/10-pyxis.conf", "required spank_pyxis.so\n");
        assert_eq!(
            order(vec![root, pyxis, ("/etc/slurm/plugstack.conf.d/20-gpu.conf", "optional spank_gpu.so\n")]),
            StackOrder::PyxisFirst
        );
        // A site file that sorts first.
        assert_eq!(
            order(vec![
                root,
                pyxis,
                ("/etc/slurm/plugstack.conf.d/00-gpu.conf", "optional /x/spank_gpu.so a=1\n")
            ]),
            StackOrder::SpankGpuFirst
        );
        assert_eq!(order(vec![root, pyxis]), StackOrder::NotBoth);
        // What cannot be read tells nothing.
        assert_eq!(order(vec![]), StackOrder::NotBoth);
    }

    #[test]
    fn stack_lines_as_slurm_reads_them() {
        let plugin = |required, path: &str, args: &[&str]| {
            Some(StackLine::Plugin {
                required,
                path: path.to_owned(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
            })
        };
        assert_eq!(StackLine::parse("  # a comment"), Ok(None));
        assert_eq!(StackLine::parse(""), Ok(None));
        assert_eq!(
            StackLine::parse("optional\t/usr/lib/x/spank_gpu.so auto_rdzv=on # on for all\n"),
            Ok(plugin(false, "/usr/lib/x/spank_gpu.so", &["auto_rdzv=on"]))
        );
        assert_eq!(StackLine::parse("required spank_gpu.so"), Ok(plugin(true, "spank_gpu.so", &[])));
        assert_eq!(
            StackLine::parse("include /etc/slurm/plugstack.conf.d/*.conf"),
            Ok(Some(StackLine::Include("/etc/slurm/plugstack.conf.d/*.conf".to_owned())))
        );
        assert!(StackLine::parse("optinal /x/spank_gpu.so").unwrap_err().contains("'optinal'"));
        assert!(StackLine::parse("required").is_err());
        assert!(StackLine::parse("include").is_err());
        let spank_gpu = |l: &str| StackLine::parse(l).ok().flatten().is_some_and(|s| s.is_spank_gpu());
        assert!(spank_gpu("optional /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gpu.so"));
        assert!(spank_gpu("required spank_gpu.so"));
        assert!(spank_gpu("optional /src/target/release/libspank_gpu.so"));
        assert!(!spank_gpu("optional /usr/lib/slurm/spank_gpu.so.old"));
        assert!(!spank_gpu("optional /usr/lib/slurm/my_spank_gpu.so"));
        assert!(!spank_gpu("include /etc/spank_gpu.so"));
        // A file edited on Windows: Slurm keeps the `\r` in the path and loads nothing.
        assert!(!spank_gpu("optional /x/spank_gpu.so\r"));
    }

    #[test]
    fn globs_as_glob3_matches_a_file_name() {
        for (pattern, name, want) in [
            ("*.conf", "spank-gpu.conf", true),
            ("*.conf", "spank-gpu.conf.dpkg-old", false),
            ("*.conf", ".hidden.conf", false),
            (".*.conf", ".hidden.conf", true),
            ("*", "x", true),
            ("*gpu*", "spank-gpu.conf", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("?.conf", "a.conf", true),
            ("?.conf", "ab.conf", false),
            ("[0-9]*.conf", "10-gpu.conf", true),
            ("[0-9]*.conf", "gpu.conf", false),
            ("[!0-9]*.conf", "gpu.conf", true),
            ("[]x].conf", "].conf", true),
            ("[abc", "[abc", true),
            ("\\*.conf", "*.conf", true),
            ("\\*.conf", "a.conf", false),
            ("plugstack.conf", "plugstack.conf", true),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob_match(pattern, name), want, "{pattern} vs {name}");
        }
    }

    /// The kind of error parsing `words` (in a release build) gives.
    #[track_caller]
    fn kind(words: &[&str]) -> ArgErrorKind {
        PluginConfig::parse(words, false).unwrap_err().kind
    }

    #[test]
    fn empty_line_gives_defaults() {
        let none: [&str; 0] = [];
        assert_eq!(PluginConfig::parse(&none, false), Ok(PluginConfig::default()));
    }

    #[test]
    fn known_keys_parse() {
        let cfg = PluginConfig::parse(&["auto_rdzv=on", "gpu_affinity=off"], false).unwrap();
        assert!(cfg.auto_rdzv);
        assert!(!cfg.gpu_affinity);
    }

    #[test]
    fn unknown_key_is_named_with_the_known_ones() {
        let e = PluginConfig::parse(&["auto_rdzv=on", "bogus=1"], false).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::UnknownKey);
        assert_eq!(
            e.to_string(),
            "plugstack.conf argument 'bogus=1': unknown key 'bogus' (known keys: auto_rdzv, gpu_affinity, \
             port_range, topology_dir, nccl_socket_ifname, nccl_socket_net, master_addr, slurm_conf, resv_ports, \
             lint, timing, job_map; \
             UPPER_CASE keys set environment defaults)"
        );
    }

    #[test]
    fn lint_modes() {
        assert_eq!(PluginConfig::default().lint, LintMode::Warn);
        assert_eq!(PluginConfig::parse(&["lint=strict"], false).unwrap().lint, LintMode::Strict);
        assert_eq!(PluginConfig::parse(&["lint=off"], false).unwrap().lint, LintMode::Off);
        let e = PluginConfig::parse(&["lint=loud"], false).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::BadValue);
        assert_eq!(e.reason, "expected warn, off or strict, got 'loud'");
    }

    #[test]
    fn master_addr_and_slurm_conf() {
        let cfg = PluginConfig::parse(&["master_addr=addr", "slurm_conf=/run/slurm/conf/slurm.conf"], false)
            .unwrap();
        assert_eq!(cfg.master_addr, MasterAddr::Addr);
        assert_eq!(cfg.slurm_conf.as_deref(), Some("/run/slurm/conf/slurm.conf"));
        assert_eq!(PluginConfig::default().slurm_conf, None);
        let e = PluginConfig::parse(&["master_addr=ip"], false).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::BadValue);
        assert_eq!(e.reason, "expected nodename, hostname or addr, got 'ip'");
        let e = PluginConfig::parse(&["slurm_conf=etc/slurm.conf"], false).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::BadValue);
        assert_eq!(e.reason, "must be an absolute path without . or .. components");
    }

    #[test]
    fn nccl_socket_ifname_is_one_variable_and_never_empty() {
        for words in [
            ["NCCL_SOCKET_IFNAME=ib0", "nccl_socket_ifname=ib1"],
            ["nccl_socket_ifname=ib1", "NCCL_SOCKET_IFNAME=ib0"],
        ] {
            let e = PluginConfig::parse(&words, false).unwrap_err();
            assert_eq!(e.kind, ArgErrorKind::Repeated, "{words:?}");
            assert_eq!(e.reason, "NCCL_SOCKET_IFNAME is given more than once", "{words:?}");
        }
        let e = PluginConfig::parse(&["nccl_socket_ifname="], false).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::BadValue);
        assert_eq!(e.reason, "needs an interface name (or leave the word out)");
    }

    #[test]
    fn interface_values_nccl_or_gloo_would_misread_are_refused() {
        for word in ["nccl_socket_ifname=e", "nccl_socket_ifname=^docker0", "NCCL_SOCKET_IFNAME=^docker0"] {
            assert_eq!(kind(&[word]), ArgErrorKind::BadValue, "{word}");
        }
        let e = PluginConfig::parse(&["nccl_socket_ifname=^docker0"], false).unwrap_err();
        assert!(e.reason.contains("but not lo"), "{}", e.reason);
        assert_eq!(kind(&["GLOO_SOCKET_IFNAME=^lo,docker"]), ArgErrorKind::BadValue);
        for ok in ["nccl_socket_ifname=^docker0,lo", "nccl_socket_ifname==ib0", "GLOO_SOCKET_IFNAME=ib0"] {
            assert!(PluginConfig::parse(&[ok], false).is_ok(), "{ok}");
        }
    }

    #[test]
    fn nccl_socket_net_is_one_or_more_networks() {
        assert_eq!(PluginConfig::default().nccl_socket_net, vec![]);
        let cfg = PluginConfig::parse(&["nccl_socket_net=10.1.0.0/16,fd00:1::/64"], false).unwrap();
        let nets: Vec<String> = cfg.nccl_socket_net.iter().map(ToString::to_string).collect();
        assert_eq!(nets, ["10.1.0.0/16", "fd00:1::/64"]);
        // It is no site default: each node works its values out.
        assert_eq!(cfg.env_defaults, vec![]);
        for (word, why) in [
            ("nccl_socket_net=", "needs a network, CIDR[,CIDR] (or leave the word out)"),
            ("nccl_socket_net=10.1.0.0", "'10.1.0.0' is not ADDR/LEN"),
            ("nccl_socket_net=10.1.2.0/16", "'10.1.2.0/16' has host bits set (the network is 10.1.0.0/16)"),
            ("nccl_socket_net=10.1.0.0/33", "'/33': 0 to 32"),
            ("nccl_socket_net=ib0", "'ib0' is not ADDR/LEN"),
            ("nccl_socket_net=10.1.0.0/16,", "'' is not ADDR/LEN"),
        ] {
            let e = PluginConfig::parse(&[word], false).unwrap_err();
            assert_eq!((e.kind, e.reason.as_str()), (ArgErrorKind::BadValue, why), "{word}");
        }
        assert_eq!(
            kind(&["nccl_socket_net=10.1.0.0/16", "nccl_socket_net=10.2.0.0/16"]),
            ArgErrorKind::Repeated
        );
        // The network, or a name: not both, in either order.
        for words in [
            ["nccl_socket_net=10.1.0.0/16", "nccl_socket_ifname=ib0"],
            ["NCCL_SOCKET_IFNAME=ib0", "nccl_socket_net=10.1.0.0/16"],
            ["nccl_socket_net=10.1.0.0/16", "GLOO_SOCKET_IFNAME=ib0"],
            ["GLOO_SOCKET_IFNAME=ib0", "nccl_socket_net=10.1.0.0/16"],
        ] {
            let e = PluginConfig::parse(&words, false).unwrap_err();
            assert_eq!(e.kind, ArgErrorKind::Repeated, "{words:?}");
            assert!(e.reason.contains("is given twice: nccl_socket_net sets"), "{words:?}: {}", e.reason);
            assert_eq!(e.word, words[1], "the second word is named");
        }
        // Other site defaults go with it.
        assert!(PluginConfig::parse(&["nccl_socket_net=10.1.0.0/16", "NCCL_DEBUG=WARN"], false).is_ok());
    }

    #[test]
    fn bad_values_and_shapes_are_errors() {
        for word in ["auto_rdzv=maybe", "auto_rdzv=", "gpu_affinity=ON "] {
            assert_eq!(kind(&[word]), ArgErrorKind::BadValue, "{word}");
        }
        assert_eq!(kind(&["auto_rdzv"]), ArgErrorKind::NotKeyValue);
        assert_eq!(kind(&["=on"]), ArgErrorKind::UnknownKey);
    }

    #[test]
    fn port_range_and_env_defaults() {
        let cfg = PluginConfig::parse(
            &["port_range=40000-40999", "nccl_socket_ifname=ib0", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"],
            false,
        )
        .unwrap();
        assert_eq!(cfg.port_range, PortRange { lo: 40000, hi: 40999 });
        assert_eq!(
            cfg.env_defaults,
            vec![
                ("NCCL_SOCKET_IFNAME".to_owned(), "ib0".to_owned()),
                ("TORCH_NCCL_ASYNC_ERROR_HANDLING".to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(PluginConfig::parse(&["NCCL_DEBUG="], false).unwrap().env_defaults[0].1, "");
    }

    #[test]
    fn bad_port_ranges_and_env_defaults_are_errors() {
        for (word, want) in [
            ("port_range=80-90", ArgErrorKind::BadValue),
            ("port_range=30000", ArgErrorKind::BadValue),
            ("MASTER_PORT=1", ArgErrorKind::Computed),
            ("RANK=0", ArgErrorKind::Computed),
            ("Nccl_X=1", ArgErrorKind::UnknownKey),
            ("nccl_socket_ifname=", ArgErrorKind::BadValue),
        ] {
            assert_eq!(kind(&[word]), want, "{word}");
        }
        assert_eq!(kind(&["NCCL_DEBUG=INFO", "NCCL_DEBUG=WARN"]), ArgErrorKind::Repeated);
    }

    #[test]
    fn a_huge_word_gives_a_short_message() {
        let word = format!("auto_rdzv={}", "y".repeat(1 << 20));
        let e = PluginConfig::parse(&[word], false).unwrap_err().to_string();
        assert!(e.len() < 600, "{} bytes", e.len());
    }

    #[test]
    fn repeated_key_is_an_error() {
        let e = PluginConfig::parse(&["auto_rdzv=on", "auto_rdzv=off"], false).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::Repeated);
        assert!(e.reason.contains("more than once"), "{e}");
    }

    #[test]
    fn debug_panic_only_in_debug_builds() {
        assert_eq!(kind(&["debug_panic=task_init"]), ArgErrorKind::UnknownKey);
        let cfg = PluginConfig::parse(&["debug_panic=task_init+user_init"], true).unwrap();
        assert!(cfg.panics_in(Hook::TaskInit) && cfg.panics_in(Hook::UserInit));
        assert!(!cfg.panics_in(Hook::Init));
        assert_eq!(
            PluginConfig::parse(&["debug_panic=nope"], true).unwrap_err().kind,
            ArgErrorKind::BadValue
        );
    }

    #[test]
    fn timing_is_off_unless_turned_on() {
        assert!(!PluginConfig::parse::<&str>(&[], false).unwrap().timing);
        assert!(PluginConfig::parse(&["timing=on"], false).unwrap().timing);
        assert_eq!(kind(&["timing=maybe"]), ArgErrorKind::BadValue);
        for (words, on) in [
            (&["timing=on"][..], true),
            (&["auto_rdzv=on", "timing=yes"][..], true),
            (&["timing=off"][..], false),
            (&["timing=maybe"][..], false),
            (&["xtiming=on"][..], false),
            (&[][..], false),
        ] {
            assert_eq!(timing_on(words), on, "{words:?}");
        }
    }

    #[test]
    fn debug_dev_dir_only_in_debug_builds() {
        assert_eq!(kind(&["debug_dev_dir=/tmp/cdev"]), ArgErrorKind::UnknownKey);
        assert_eq!(PluginConfig::default().dev_dir(), "/dev");
        let cfg = PluginConfig::parse(&["debug_dev_dir=/tmp/cdev"], true).unwrap();
        assert_eq!(cfg.dev_dir(), "/tmp/cdev");
    }

    #[test]
    fn debug_fail_only_in_debug_builds() {
        assert_eq!(kind(&["debug_fail=set_affinity"]), ArgErrorKind::UnknownKey);
        let cfg = PluginConfig::parse(&["debug_fail=set_affinity+affinity"], true).unwrap();
        assert!(cfg.fails("set_affinity") && cfg.fails("affinity") && !cfg.fails("prefer_memory"));
        let e = PluginConfig::parse(&["debug_fail=setenv"], true).unwrap_err();
        assert_eq!(e.kind, ArgErrorKind::BadValue);
        assert!(e.reason.contains("seams: set_affinity, prefer_memory, affinity"), "{}", e.reason);
    }
}
