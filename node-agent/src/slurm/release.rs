//! Whether the spank-gpu plugin Slurm is told to load can load into the
//! node's Slurm: a plugin built for another release never vanishes silently.
//!
//! Slurm loads a SPANK plugin only into the major.minor it was built for
//! (`slurm_formats::release`). An `optional` plugin of another release is left out
//! with one info-level line (from 25.11.1; an error line before), and jobs
//! run without it; a `required` one keeps slurmd from starting. So the agent
//! reads what Slurm reads and says what it finds, in `status` and the
//! metrics:
//!
//! - the plugstack file (`plugstack_conf`, default `/etc/slurm/plugstack.conf`)
//!   and the files it includes, as Slurm reads them (`task_plan::plugstack::
//!   StackLine`; an include relative to the including file's directory; its
//!   glob in the file name only), for lines loading `spank_gpu.so`;
//! - each such plugin's `plugin_version`, read from the file without loading
//!   it (`slurm_formats::elf`); a relative path is looked up in `scontrol show
//!   config`'s `PluginDir`, else in the distributions' default plugin
//!   directories, as Slurm looks it up in its `PluginDir`;
//! - the node's release from `slurmd -V` (the `slurmd` key).
//!
//! Every file is read as [`read_trusted`] reads: without following a link,
//! a regular file owned by root (or the agent's own user) and writable by no
//! one else, in a directory of which the same holds, size-capped. The agent
//! runs as root; a file anyone else could write or swap says nothing about
//! what Slurm runs.
//!
//! The daemon checks again every [`RECHECK`] ([`cached`]) and logs each
//! change; `status` checks once.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use slurm_formats::elf;
use slurm_formats::release::{self, Version, spank_loads};
use task_plan::plugstack::{PLUGIN_FILE, StackEvent, StackFiles, StackLine, walk_stack};

use crate::config::Config;
use crate::slurm::Slurm;

/// How long the daemon keeps a check before making it again.
pub const RECHECK: Duration = Duration::from_secs(300);
/// Largest plugstack file read.
const MAX_CONF_BYTES: usize = 1 << 20;
/// Largest plugin file read (the stripped plugin is about 2 MB, with debug info 25).
const MAX_PLUGIN_BYTES: usize = 256 << 20;

/// A plugstack line that loads `spank_gpu.so`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The file the line is in.
    pub file: PathBuf,
    /// Its line number, from 1.
    pub line: usize,
    /// `required` (else `optional`).
    pub required: bool,
    /// The plugin's path as written.
    pub path: String,
    /// Its place among the plugin lines Slurm reads (spank_gpu's and pyxis's), from 0.
    pub seq: usize,
    /// The plugin's arguments, as Slurm passes them.
    pub args: Vec<String>,
}

/// One listed plugin, and what its file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The line.
    pub listed: Listed,
    /// The file Slurm would load (a relative path looked up).
    pub file: Option<PathBuf>,
    /// Its `plugin_version`, or why it cannot be read.
    pub version: Result<u32, String>,
}

/// What the agent found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseCheck {
    /// The plugstack file read first.
    pub plugstack: PathBuf,
    /// Every line loading the plugin, in Slurm's order.
    pub plugins: Vec<Found>,
    /// Files that could not be read, and invalid lines naming the plugin
    /// (Slurm ignores them), in words.
    pub problems: Vec<String>,
    /// The node's Slurm, from `slurmd -V`, or why it is not known.
    pub slurmd: Result<Version, String>,
    /// The lines loading pyxis (`spank_pyxis.so`), in Slurm's order.
    pub pyxis: Vec<Listed>,
}

/// How one listed plugin fits the node's Slurm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Built for slurmd's release: Slurm loads it.
    Loads,
    /// Built for another release: Slurm does not load it.
    OtherRelease,
    /// The plugin or slurmd's release cannot be read.
    CannotTell,
    /// No plugstack line loads the plugin.
    NotListed,
}

impl Fit {
    /// The metric's value.
    pub fn code(self) -> u8 {
        match self {
            Fit::Loads => 0,
            Fit::OtherRelease => 1,
            Fit::CannotTell => 2,
            Fit::NotListed => 3,
        }
    }
}

impl Found {
    /// How this plugin fits `slurmd`.
    pub fn fit(&self, slurmd: &Result<Version, String>) -> Fit {
        match (&self.version, slurmd.as_ref().ok().and_then(|v| v.number())) {
            (Ok(p), Some(s)) if spank_loads(*p, s) => Fit::Loads,
            (Ok(_), Some(_)) => Fit::OtherRelease,
            _ => Fit::CannotTell,
        }
    }

    /// The release the plugin was built for.
    pub fn built_for(&self) -> Option<Version> {
        self.version.as_ref().ok().map(|v| Version::from_number(*v))
    }
}

impl ReleaseCheck {
    /// The worst fit over the listed plugins (`NotListed` when there is none).
    pub fn fit(&self) -> Fit {
        let fits = self.plugins.iter().map(|p| p.fit(&self.slurmd));
        fits.max_by_key(|f| match f {
            Fit::Loads => 0,
            Fit::CannotTell => 1,
            Fit::OtherRelease => 2,
            Fit::NotListed => 3,
        })
        .unwrap_or(Fit::NotListed)
    }

    /// A warning when spank_gpu is listed before pyxis: SPANK calls each hook
    /// of every plugin in file order, so pyxis's `task_init` then copies the
    /// container's environment over what spank_gpu set (pyxis's
    /// `spank_import_container_env`), except the names of `--container-env`
    /// or `PYXIS_CONTAINER_ENV`, which the plugin sets to its own names where
    /// the user gave neither (its `init_post_opt`, issue 46); and for PyTorch
    /// images pyxis sets `RANK` and `LOCAL_RANK` from Slurm's, after anything
    /// spank_gpu can do.
    pub fn order_warning(&self) -> Option<String> {
        let gpu = self.plugins.iter().map(|p| &p.listed).min_by_key(|l| l.seq)?;
        let pyxis = self.pyxis.iter().min_by_key(|l| l.seq)?;
        (gpu.seq < pyxis.seq).then(|| {
            format!(
                "WARNING: {} ({}:{}) is listed before pyxis ({}:{}): in containers the plugin sets \
                 PYXIS_CONTAINER_ENV so that pyxis keeps --auto-rdzv's values, but a user's own \
                 --container-env or PYXIS_CONTAINER_ENV replaces that list (the container's values then \
                 win for the other names: enroot's PyTorch hook's one MASTER_PORT per job, \
                 OMP_NUM_THREADS=1), and pyxis sets RANK=SLURM_PROCID for PyTorch images; list pyxis \
                 first (the package's plugstack.conf.d/spank-gpu.conf sorts after pyxis.conf)",
                gpu.path,
                gpu.file.display(),
                gpu.line,
                pyxis.file.display(),
                pyxis.line
            )
        })
    }

    /// The package to install for slurmd's release.
    pub fn package(&self) -> Option<String> {
        let r = self.slurmd.as_ref().ok()?.release;
        Some(release::deb_package(env!("CARGO_PKG_VERSION"), r))
    }
}

/// Reads the plugstack files and the plugins they list, and asks `slurmd -V`.
pub fn check(cfg: &Config) -> ReleaseCheck {
    let mut listed = Vec::new();
    let mut pyxis = Vec::new();
    let mut problems = Vec::new();
    read_stack(&cfg.plugstack_conf, &mut listed, &mut pyxis, &mut problems);
    let slurm_of = |program: &Path| Slurm { scontrol: program.to_path_buf(), timeout: cfg.scontrol_timeout };
    let mut plugin_dirs: Option<Vec<String>> = None;
    let plugins = listed
        .into_iter()
        .map(|l| {
            let file = if l.path.starts_with('/') {
                Some(PathBuf::from(&l.path))
            } else {
                let dirs = plugin_dirs.get_or_insert_with(|| search_dirs(&slurm_of(&cfg.scontrol)));
                dirs.iter().map(|d| Path::new(d).join(&l.path)).find(|f| f.exists())
            };
            let version = match &file {
                Some(f) => read_trusted(f, MAX_PLUGIN_BYTES)
                    .map_err(|e| e.to_string())
                    .and_then(|b| elf::plugin_version(&b).map_err(|e| format!("{}: {e}", f.display()))),
                None => Err(format!(
                    "{} is in none of Slurm's plugin directories ({})",
                    l.path,
                    plugin_dirs.as_deref().unwrap_or_default().join(", ")
                )),
            };
            Found { listed: l, file, version }
        })
        .collect();
    let slurmd = slurm_of(&cfg.slurmd).run(&["-V"]).map_err(|e| e.to_string()).and_then(|out| {
        Version::parse(&out)
            .ok_or_else(|| format!("{} -V printed no version: {}", cfg.slurmd.display(), out.trim()))
    });
    ReleaseCheck { plugstack: cfg.plugstack_conf.clone(), plugins, problems, slurmd, pyxis }
}

/// Where Slurm looks for a plugin named without a directory: `PluginDir`
/// from `scontrol show config`, else the distributions' defaults.
fn search_dirs(scontrol: &Slurm) -> Vec<String> {
    if let Some(dirs) =
        scontrol.run(&["show", "config"]).ok().and_then(|t| release::plugin_dirs_from_show_config(&t))
    {
        return dirs;
    }
    let triplet = release::multiarch_triplet().unwrap_or("x86_64-linux-gnu");
    release::default_plugin_dirs(triplet).into_iter().map(|(_, d)| d).collect()
}

/// The plugstack files as the agent reads them: root's or its own, no link
/// followed, size-capped ([`read_trusted`]).
struct TrustedFiles;

impl StackFiles for TrustedFiles {
    fn read(&mut self, path: &Path) -> io::Result<String> {
        read_trusted(path, MAX_CONF_BYTES).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    fn names(&mut self, dir: &Path) -> io::Result<Vec<String>> {
        Ok(fs::read_dir(dir)?.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
    }

    fn exists(&mut self, path: &Path) -> bool {
        path.exists()
    }
}

/// Follows the plugstack file and its includes (`walk_stack`), collecting
/// spank_gpu's lines and pyxis's, and the problems met on the way.
fn read_stack(root: &Path, spank_gpu: &mut Vec<Listed>, pyxis: &mut Vec<Listed>, problems: &mut Vec<String>) {
    walk_stack(root, &mut TrustedFiles, &mut |event| {
        match event {
            StackEvent::Plugin { file, line, entry } if entry.is_spank_gpu() || entry.is_pyxis() => {
                let seq = spank_gpu.len() + pyxis.len();
                let into = if entry.is_pyxis() { &mut *pyxis } else { &mut *spank_gpu };
                if let StackLine::Plugin { required, path, args } = entry {
                    into.push(Listed { file: file.to_path_buf(), line, required, path, seq, args });
                }
            }
            StackEvent::Plugin { .. } => {}
            StackEvent::Ignored { file, line, text, why } if text.contains(PLUGIN_FILE) => {
                problems.push(format!(
                    "{}:{line}: Slurm ignores this line ({why}), so it does not load the plugin",
                    file.display()
                ))
            }
            StackEvent::Ignored { .. } => {}
            StackEvent::Problem(why) => problems.push(why),
        }
        true
    });
}

/// The agent's own user, whose files it trusts as much as root's.
fn own_uid() -> u32 {
    fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0)
}

/// Reads a file that only root (or the agent's own user) can have written:
/// opened without following a link, a regular file, it and its directory
/// owned by root or that user and writable by no one else, at most
/// `max_bytes`.
///
/// # Errors
/// Any of those conditions fails (the error says which, with the path).
pub fn read_trusted(path: &Path, max_bytes: usize) -> io::Result<Vec<u8>> {
    let owners = [0, own_uid()];
    slurm_formats::trusted::read_trusted(path, max_bytes, if owners[1] == 0 { &owners[..1] } else { &owners })
}

/// What `status` prints: one line per listed plugin (or one saying none is
/// listed), then the problems met on the way.
pub fn status_text(c: &ReleaseCheck) -> String {
    let mut out = String::new();
    if c.plugins.is_empty() {
        let _ = writeln!(
            out,
            "plugin: no {PLUGIN_FILE} line in {} or the files it includes: Slurm does not load spank-gpu",
            c.plugstack.display()
        );
    }
    for p in &c.plugins {
        let l = &p.listed;
        let kind = if l.required { "required" } else { "optional" };
        let head = format!("plugin: {} ({kind}, {}:{})", l.path, l.file.display(), l.line);
        let line = match (p.fit(&c.slurmd), p.built_for(), &c.slurmd) {
            (Fit::Loads, Some(b), Ok(s)) => {
                format!("{head}: built for Slurm {}, slurmd is {s}: ok", b.release)
            }
            (Fit::OtherRelease, Some(b), Ok(s)) => format!(
                "{head}: built for Slurm {} (plugin_version {b}), but slurmd is {s}: MISMATCH, Slurm does not load it ({}); {}",
                b.release,
                if l.required {
                    "it is required: slurmd does not start"
                } else {
                    "jobs run without --auto-rdzv and --gpu-affinity"
                },
                release::install_advice(env!("CARGO_PKG_VERSION"), s.release)
            ),
            (_, _, _) => match (&p.version, &c.slurmd) {
                (Err(e), _) => format!("{head}: cannot tell whether Slurm loads it: {e}"),
                (Ok(v), Err(e)) => format!(
                    "{head}: built for Slurm {}; cannot tell whether slurmd loads it: {e}",
                    Version::from_number(*v).release
                ),
                (Ok(_), Ok(_)) => format!("{head}: cannot tell"),
            },
        };
        out.push_str(&line);
        out.push('\n');
    }
    if let Some(w) = c.order_warning() {
        let _ = writeln!(out, "plugin: {w}");
    }
    for p in &c.problems {
        let _ = writeln!(out, "plugin: {p}");
    }
    out
}

/// The metric, in node_exporter's textfile format: one row per listed
/// plugin (one with `plugin=""` when none is).
pub fn metrics_text(node: &str, c: &ReleaseCheck) -> String {
    let label = crate::exposition::label_value;
    let slurmd = c.slurmd.as_ref().map(|v| v.release.to_string()).unwrap_or_default();
    let mut m = String::from(
        "# HELP gpu_node_agent_plugin_release Whether Slurm loads the spank-gpu plugin plugstack.conf lists: \
         0 built for slurmd's release; 1 built for another (plugin_release), Slurm does not load it: install the \
         package in install=; 2 cannot tell (plugin unreadable, slurmd -V failed); 3 no spank_gpu.so line\n\
         # TYPE gpu_node_agent_plugin_release gauge\n",
    );
    let mut row = |plugin: &str, built: String, fit: Fit| {
        let install = if fit == Fit::OtherRelease { c.package().unwrap_or_default() } else { String::new() };
        let _ = writeln!(
            m,
            "gpu_node_agent_plugin_release{{node=\"{}\",plugin=\"{}\",plugin_release=\"{built}\",\
             slurmd_release=\"{slurmd}\",install=\"{}\"}} {}",
            label(node),
            label(plugin),
            label(&install),
            fit.code()
        );
    };
    if c.plugins.is_empty() {
        row("", String::new(), Fit::NotListed);
    }
    for p in &c.plugins {
        let built = p.built_for().map(|v| v.release.to_string()).unwrap_or_default();
        let shown = p.file.as_ref().map_or_else(|| p.listed.path.clone(), |f| f.display().to_string());
        row(&shown, built, p.fit(&c.slurmd));
    }
    m
}

/// The daemon's check: made again after [`RECHECK`]; each change of what it
/// finds is logged (an error for a plugin Slurm does not load).
pub fn cached(cfg: &Config) -> ReleaseCheck {
    static LAST: Mutex<Option<(Instant, ReleaseCheck)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((at, c)) = last.as_ref() {
        if at.elapsed() < RECHECK && c.plugstack == cfg.plugstack_conf {
            return c.clone();
        }
    }
    let c = check(cfg);
    if last.as_ref().is_none_or(|(_, old)| status_text(old) != status_text(&c)) {
        log(&c);
    }
    *last = Some((Instant::now(), c.clone()));
    c
}

/// Logs what a check found, at the level it deserves.
fn log(c: &ReleaseCheck) {
    let text = status_text(c);
    for line in text.lines() {
        match c.fit() {
            _ if line.starts_with("plugin: WARNING") => tracing::warn!("{line}"),
            Fit::OtherRelease => tracing::error!("{line}"),
            Fit::CannotTell | Fit::NotListed => tracing::warn!("{line}"),
            Fit::Loads => tracing::info!("{line}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(path: &str, required: bool, version: Result<u32, String>) -> Found {
        Found {
            listed: Listed {
                file: PathBuf::from("/etc/slurm/plugstack.conf.d/spank-gpu.conf"),
                line: 10,
                required,
                path: path.to_owned(),
                seq: 0,
                args: vec![],
            },
            file: Some(PathBuf::from(path)),
            version,
        }
    }

    fn checked(plugins: Vec<Found>, slurmd: Result<Version, String>) -> ReleaseCheck {
        ReleaseCheck {
            plugstack: PathBuf::from("/etc/slurm/plugstack.conf"),
            plugins,
            problems: vec![],
            slurmd,
            pyxis: vec![],
        }
    }

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    #[test]
    fn a_plugin_of_another_release_is_loud_and_names_the_package() {
        let c =
            checked(vec![found("/usr/lib/x/spank_gpu.so", false, Ok(0x16_0508))], Ok(v("slurm-wlm 26.05.5")));
        assert_eq!(c.fit(), Fit::OtherRelease);
        let text = status_text(&c);
        assert!(
            text.contains("built for Slurm 22.05 (plugin_version 22.05.8), but slurmd is 26.05.5: MISMATCH"),
            "{text}"
        );
        assert!(text.contains("jobs run without --auto-rdzv and --gpu-affinity"), "{text}");
        let pkg = format!("install spank-gpu_{}-1+slurm26.05 (.deb)", env!("CARGO_PKG_VERSION"));
        assert!(text.contains(&pkg), "{text}");
        let m = metrics_text("node1", &c);
        assert!(
            m.contains(&format!(
                "gpu_node_agent_plugin_release{{node=\"node1\",plugin=\"/usr/lib/x/spank_gpu.so\",plugin_release=\"22.05\",\
                 slurmd_release=\"26.05\",install=\"spank-gpu_{}-1+slurm26.05\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{m}"
        );
        let required = checked(vec![found("/x/spank_gpu.so", true, Ok(0x16_0508))], Ok(v("slurm 24.11.5")));
        assert!(status_text(&required).contains("it is required: slurmd does not start"));
    }

    #[test]
    fn a_matching_plugin_is_ok_whatever_its_micro_release() {
        let c = checked(vec![found("/x/spank_gpu.so", false, Ok(0x18_0b01))], Ok(v("slurm 24.11.5")));
        assert_eq!(c.fit(), Fit::Loads);
        assert!(
            status_text(&c).ends_with(": built for Slurm 24.11, slurmd is 24.11.5: ok\n"),
            "{}",
            status_text(&c)
        );
        assert!(metrics_text("n", &c).contains("install=\"\"} 0\n"));
    }

    #[test]
    fn what_cannot_be_read_is_said_and_counted_as_such() {
        let c = checked(
            vec![found("/x/spank_gpu.so", false, Err("/x/spank_gpu.so: not an ELF file".into()))],
            Ok(v("slurm 24.11.5")),
        );
        assert_eq!(c.fit(), Fit::CannotTell);
        assert!(
            status_text(&c).contains("cannot tell whether Slurm loads it: /x/spank_gpu.so: not an ELF file")
        );
        let c = checked(
            vec![found("/x/spank_gpu.so", false, Ok(0x16_0508))],
            Err("slurmd -V: No such file".into()),
        );
        assert_eq!(c.fit(), Fit::CannotTell);
        assert!(
            status_text(&c).contains("built for Slurm 22.05; cannot tell whether slurmd loads it: slurmd -V")
        );
        assert!(metrics_text("n", &c).contains("slurmd_release=\"\",install=\"\"} 2\n"));
        let none = checked(vec![], Ok(v("slurm 24.11.5")));
        assert_eq!(none.fit(), Fit::NotListed);
        assert!(status_text(&none).contains("no spank_gpu.so line in /etc/slurm/plugstack.conf"));
        assert!(
            metrics_text("n", &none)
                .contains("plugin=\"\",plugin_release=\"\",slurmd_release=\"24.11\",install=\"\"} 3\n")
        );
        // The worst of two lines counts.
        let two = checked(
            vec![
                found("/a/spank_gpu.so", false, Ok(0x18_0b05)),
                found("/b/spank_gpu.so", false, Ok(0x16_0508)),
            ],
            Ok(v("slurm 24.11.5")),
        );
        assert_eq!(two.fit(), Fit::OtherRelease);
    }

    fn tree(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("agent-release-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("plugstack.conf.d")).unwrap();
        d
    }

    #[test]
    fn the_stack_is_followed_as_slurm_follows_it() {
        let d = tree("stack");
        fs::write(
            d.join("plugstack.conf"),
            "# site plugins\nrequired /opt/other.so\ninclude plugstack.conf.d/*.conf\ninclude /nonexistent/*.conf\n",
        )
        .unwrap();
        fs::write(d.join("plugstack.conf.d/b.conf"), "optional /b/spank_gpu.so auto_rdzv=on\n").unwrap();
        fs::write(
            d.join("plugstack.conf.d/a.conf"),
            "\noptinal /typo/spank_gpu.so\nrequired /a/spank_gpu.so\n",
        )
        .unwrap();
        fs::write(d.join("plugstack.conf.d/c.conf.dpkg-old"), "optional /old/spank_gpu.so\n").unwrap();
        let (mut listed, mut problems) = (Vec::new(), Vec::new());
        read_stack(&d.join("plugstack.conf"), &mut listed, &mut Vec::new(), &mut problems);
        let paths: Vec<(&str, bool, usize)> =
            listed.iter().map(|l| (l.path.as_str(), l.required, l.line)).collect();
        assert_eq!(paths, vec![("/a/spank_gpu.so", true, 3), ("/b/spank_gpu.so", false, 1)]);
        assert_eq!((listed[0].args.len(), listed[1].args.as_slice()), (0, &["auto_rdzv=on".to_owned()][..]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("a.conf:2: Slurm ignores this line ('optinal'"), "{problems:?}");
        let _ = fs::remove_dir_all(&d);
    }

    /// pyxis's `pyxis.conf` and the package's `spank-gpu.conf` in one include
    /// glob: pyxis first, as glob(3) sorts them, is quiet; the other order warns.
    #[test]
    fn spank_gpu_before_pyxis_is_warned_in_status() {
        let d = tree("pyxis");
        fs::write(d.join("plugstack.conf"), "include plugstack.conf.d/*.conf\n").unwrap();
        fs::write(d.join("plugstack.conf.d/pyxis.conf"), "required /usr/lib/slurm/spank_pyxis.so\n").unwrap();
        fs::write(d.join("plugstack.conf.d/spank-gpu.conf"), "optional /x/spank_gpu.so\n").unwrap();
        let read = |d: &Path| {
            let (mut listed, mut pyxis, mut problems) = (Vec::new(), Vec::new(), Vec::new());
            read_stack(&d.join("plugstack.conf"), &mut listed, &mut pyxis, &mut problems);
            let plugins =
                listed.into_iter().map(|l| Found { file: None, version: Ok(0x16_0508), listed: l }).collect();
            ReleaseCheck { pyxis, ..checked(plugins, Ok(v("slurm 22.05.8"))) }
        };
        let good = read(&d);
        assert_eq!((good.plugins.len(), good.pyxis.len()), (1, 1));
        assert_eq!(good.order_warning(), None);
        assert!(!status_text(&good).contains("WARNING"), "{}", status_text(&good));
        // The admin's own line for spank_gpu in plugstack.conf, before the include.
        fs::write(d.join("plugstack.conf"), "optional /y/spank_gpu.so\ninclude plugstack.conf.d/*.conf\n")
            .unwrap();
        let bad = read(&d);
        let text = status_text(&bad);
        assert!(
            text.contains("plugin: WARNING: /y/spank_gpu.so (")
                && text.contains("plugstack.conf:1) is listed before pyxis ("),
            "{text}"
        );
        assert!(text.contains("pyxis.conf:1): in containers") && text.contains("list pyxis first"), "{text}");
        // No pyxis: nothing to say.
        fs::remove_file(d.join("plugstack.conf.d/pyxis.conf")).unwrap();
        assert_eq!(read(&d).order_warning(), None);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn links_and_files_others_can_write_are_not_read() {
        let d = tree("trust");
        let real = d.join("plugstack.conf.real");
        fs::write(&real, "optional /x/spank_gpu.so\n").unwrap();
        std::os::unix::fs::symlink(&real, d.join("plugstack.conf")).unwrap();
        let e = read_trusted(&d.join("plugstack.conf"), 100).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link (not followed"), "{e}");
        assert!(read_trusted(&real, 100).is_ok());
        assert_eq!(read_trusted(&real, 3).unwrap_err().kind(), io::ErrorKind::InvalidData);
        fs::set_permissions(&real, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let e = read_trusted(&real, 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let (mut listed, mut problems) = (Vec::new(), Vec::new());
        read_stack(&d.join("plugstack.conf"), &mut listed, &mut Vec::new(), &mut problems);
        assert!(listed.is_empty() && problems[0].contains("symbolic link"), "{problems:?}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn includes_resolve_like_glob3() {
        let d = tree("glob");
        fs::write(d.join("plugstack.conf.d/10-x.conf"), "").unwrap();
        fs::write(d.join("plugstack.conf.d/.hidden.conf"), "").unwrap();
        fs::write(d.join("one.conf"), "").unwrap();
        let names = |p: &str| -> Vec<String> {
            task_plan::plugstack::include_files(&d, p, &mut TrustedFiles)
                .unwrap()
                .iter()
                .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names("plugstack.conf.d/*.conf"), vec!["10-x.conf"]);
        assert_eq!(names("one.conf"), vec!["one.conf"]);
        assert!(names("missing.conf").is_empty());
        assert!(names("nodir/*.conf").is_empty());
        assert!(
            task_plan::plugstack::include_files(&d, "*/x.conf", &mut TrustedFiles)
                .unwrap_err()
                .contains("directory name")
        );
        let _ = fs::remove_dir_all(&d);
    }
}
