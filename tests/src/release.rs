//! The Slurm releases the lab runs, and the Debian roots that hold them.
//!
//! The host's own Slurm (Debian 12's 22.05) runs as it is installed. Newer
//! releases come from the Slurm packages of newer Debian suites, installed
//! into a root made with `debootstrap --variant=minbase` from the same
//! archive the host's `apt-get` uses: 24.11 from Debian 13 (trixie), 26.05
//! from Debian sid. A root is cached outside the checkout
//! ([`ROOTS_DIR`], or `$SLURM_LAB_ROOTS`) and made again when it is missing,
//! was made with another package list, is older than [`MAX_AGE`] (sid moves),
//! or no longer holds the release it is for. It is made in a temporary
//! directory and renamed into place, so a reader never sees half a root.
//!
//! The lab runs the root's daemons and commands with `chroot`; [`Root::mount`]
//! gives the root what they need from the host (`/proc`, `/sys` with the
//! cgroup hierarchies, `/dev`, munged's socket, the lab's work directory and
//! the build tree at their own paths). Every mount is recorded in the lab's
//! state file and undone at teardown.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::{LabError, Result, err, run};

/// Where the roots are cached unless `$SLURM_LAB_ROOTS` says otherwise.
pub const ROOTS_DIR: &str = "/var/cache/slurm-lab/roots";
/// A root older than this is made again (a suite such as sid moves on).
pub const MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);
/// The file in a root that records how it was made.
const STAMP: &str = ".slurm-lab-root";

/// What a root holds beyond `minbase`: the Slurm daemons and clients, the
/// headers the plugin is built against, what the project's own programs
/// link (hwloc and udev for the agent; slurmd pulls hwloc in anyway), the
/// release's own Open MPI (`mpirun` launches its daemons through Slurm),
/// Python with venv and certificates (the framework suite's virtualenvs), and
/// a C++ compiler with Python's headers (DeepSpeed's CPU backend builds its
/// shared-memory op when `init_distributed()` runs; without them the framework
/// suite's DeepSpeed case dies on `c++: not found`, then `Python.h: No such
/// file or directory`, measured in the 24.11 and 26.05 roots).
pub const PACKAGES: &[&str] = &[
    "slurmd",
    "slurmctld",
    "slurm-client",
    "slurmdbd",
    "munge",
    "libslurm-dev",
    "libhwloc15",
    "libudev1",
    "procps",
    "openmpi-bin",
    "python3",
    "python3-venv",
    "ca-certificates",
    "g++",
    "python3-dev",
];

/// What one suite's root holds beyond [`PACKAGES`]: sid's carries Apptainer
/// (issue 29; Debian 12 and 13 have none), with `squashfs-tools` to build its
/// SIF images in the root, and what enroot needs at run time (`jq`,
/// `parallel`, `zstd`, `pigz`, `squashfs-tools`), so pyxis runs on 26.05 too.
pub fn extra_packages(suite: &str) -> &'static [&'static str] {
    match suite {
        "sid" => &["apptainer", "squashfs-tools", "jq", "parallel", "zstd", "pigz"],
        _ => &[],
    }
}

/// Everything a root of `suite` holds beyond minbase.
fn packages(suite: &str) -> Vec<&'static str> {
    PACKAGES.iter().chain(extra_packages(suite)).copied().collect()
}

/// One Slurm release the lab can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// `major.minor`, as users name it: `24.11`.
    pub version: &'static str,
    /// The Debian suite whose Slurm packages are this release; `None` for the host's own.
    pub suite: Option<&'static str>,
    /// The distribution, in words, for messages and docs.
    pub distribution: &'static str,
}

/// Every release the lab, CI and the packages cover, oldest first. The first
/// is the host's own Slurm.
pub const RELEASES: [Release; 3] = [
    Release { version: "22.05", suite: None, distribution: "Debian 12 (bookworm), the host" },
    Release { version: "24.11", suite: Some("trixie"), distribution: "Debian 13 (trixie)" },
    Release { version: "26.05", suite: Some("sid"), distribution: "Debian sid" },
];

impl Release {
    /// The release named `22.05`, `24.11` or `26.05`.
    pub fn named(version: &str) -> Option<Release> {
        RELEASES.into_iter().find(|r| r.version == version)
    }

    /// The release the lab runs: `$SLURM_LAB_SLURM` when set (one of
    /// [`RELEASES`]), else the host's.
    ///
    /// # Errors
    /// `$SLURM_LAB_SLURM` names no known release.
    pub fn from_env() -> Result<Release> {
        match std::env::var("SLURM_LAB_SLURM") {
            Err(_) => Ok(RELEASES[0]),
            Ok(v) if v.is_empty() || v == "host" => Ok(RELEASES[0]),
            Ok(v) => Release::named(&v).ok_or_else(|| {
                LabError(format!("SLURM_LAB_SLURM={v}: not a release the lab runs (22.05, 24.11, 26.05)"))
            }),
        }
    }

    /// Whether this is the host's own Slurm (no root).
    pub fn is_host(self) -> bool {
        self.suite.is_none()
    }

    /// Whether this release's nodes have Apptainer (their root carries it).
    pub fn has_apptainer(self) -> bool {
        self.suite.is_some_and(|s| extra_packages(s).contains(&"apptainer"))
    }

    /// Whether this release's nodes run pyxis and enroot: the host's, and a
    /// root that carries enroot's run-time tools ([`extra_packages`]).
    pub fn runs_containers(self) -> bool {
        self.suite.is_none_or(|s| extra_packages(s).contains(&"jq"))
    }

    /// `(major, minor)`: `(24, 11)`.
    pub fn number(self) -> (u32, u32) {
        parse_version(self.version).unwrap_or((0, 0))
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.version)
    }
}

/// `(major, minor)` of `24.11`, `24.11.5` or `slurm-wlm 24.11.5` (what `slurmd -V` prints).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let word = text.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let mut parts = word.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A Debian root holding one release's Slurm.
#[derive(Clone, Debug)]
pub struct Root {
    /// The release it holds.
    pub release: Release,
    /// Its directory.
    pub path: PathBuf,
}

fn roots_dir() -> PathBuf {
    std::env::var_os("SLURM_LAB_ROOTS").map_or_else(|| PathBuf::from(ROOTS_DIR), PathBuf::from)
}

/// What the stamp of a root of `suite` made now ([`packages`]) starts with.
fn stamp_packages(suite: &str) -> String {
    format!("packages {}\n", packages(suite).join(","))
}

impl Root {
    /// Where the root of `release` lives (made or not). `None` for the host's release.
    pub fn path_of(release: Release) -> Option<PathBuf> {
        release.suite.map(|s| roots_dir().join(s))
    }

    /// Why the root at `path` must be made again, or `None` when it is good.
    fn stale(release: Release, path: &Path) -> Option<String> {
        let stamp = match fs::read_to_string(path.join(STAMP)) {
            Ok(s) => s,
            Err(_) => return Some("not made yet".to_owned()),
        };
        if !stamp.starts_with(&stamp_packages(release.suite.unwrap_or_default())) {
            return Some("made with another package list".to_owned());
        }
        let age = fs::metadata(path.join(STAMP))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or(Duration::MAX);
        if age > MAX_AGE {
            return Some(format!("{} days old", age.as_secs() / 86_400));
        }
        match slurmd_version(path) {
            Ok(v) if parse_version(&v) == Some(release.number()) => None,
            Ok(v) => Some(format!("holds {v}, not {release}")),
            Err(e) => Some(e.0),
        }
    }

    /// The root of `release`, made (or made again) when it is missing or stale.
    /// `None` for the host's release.
    ///
    /// # Errors
    /// debootstrap failed, or the suite no longer carries this release
    /// (the message says what it carries).
    pub fn ensure(release: Release) -> Result<Option<Root>> {
        let Some(path) = Root::path_of(release) else { return Ok(None) };
        let Some(suite) = release.suite else { return Ok(None) };
        match Root::stale(release, &path) {
            None => return Ok(Some(Root { release, path })),
            Some(why) => eprintln!("slurm-lab: making the Slurm {release} root ({why}): {}", path.display()),
        }
        if mounted_below(&path) {
            return err(format!(
                "{} has mounts below it (a lab still running, or killed: run `slurm-lab down`); not remaking it",
                path.display()
            ));
        }
        let parent = roots_dir();
        fs::create_dir_all(&parent)?;
        let tmp = parent.join(format!(".{suite}.{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let started = Instant::now();
        debootstrap(suite, &packages(suite), &tmp)?;
        let version = slurmd_version(&tmp)?;
        if parse_version(&version) != Some(release.number()) {
            let _ = fs::remove_dir_all(&tmp);
            return err(format!(
                "Debian {suite} now carries {version}, not Slurm {release}: the lab's release table \
                 (tests/src/release.rs) needs a suite that has {release}"
            ));
        }
        // Services never start inside the root (its packages' postinsts already ran).
        fs::write(tmp.join("usr/sbin/policy-rc.d"), "#!/bin/sh\nexit 101\n")?;
        fs::write(tmp.join(STAMP), format!("{}slurmd {version}\n", stamp_packages(suite)))?;
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::rename(&tmp, &path)?;
        eprintln!(
            "slurm-lab: Slurm {release} root made in {:.0} s ({version})",
            started.elapsed().as_secs_f64()
        );
        Ok(Some(Root { release, path }))
    }

    /// The root's Slurm headers, for `SLURM_INCLUDE_DIR`.
    pub fn include_dir(&self) -> PathBuf {
        self.path.join("usr/include")
    }

    /// `path` as the root sees it from the host: `ROOT/path`.
    pub fn inside(&self, path: &Path) -> PathBuf {
        self.path.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Gives the root what the lab's daemons and commands need from the host,
    /// recording each mount (through `record`) before it is made:
    /// `/proc`, `/sys` and `/dev` (recursive, slave, so nothing propagates
    /// back), munged's socket directory, and each of `dirs` at its own path
    /// (`read_only` ones read-only).
    ///
    /// # Errors
    /// A mount failed.
    pub fn mount(&self, dirs: &[(&Path, bool)], record: &dyn Fn(&str) -> Result<()>) -> Result<()> {
        let mut binds: Vec<(PathBuf, bool)> = vec![
            (PathBuf::from("/proc"), false),
            (PathBuf::from("/sys"), false),
            (PathBuf::from("/dev"), false),
            (PathBuf::from("/run/munge"), false),
        ];
        binds.extend(dirs.iter().map(|(d, ro)| (d.to_path_buf(), *ro)));
        // Each node mounts its own hosts file over the root's.
        let hosts = self.inside(Path::new("/etc/hosts"));
        if !hosts.exists() {
            fs::write(&hosts, "127.0.0.1 localhost\n")?;
        }
        for (source, read_only) in binds {
            let target = self.inside(&source);
            fs::create_dir_all(&target)?;
            record(&format!("mount {}", target.display()))?;
            run(Command::new("mount").arg("--rbind").arg(&source).arg(&target))?;
            run(Command::new("mount").arg("--make-rslave").arg(&target))?;
            if read_only {
                run(Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&target))?;
            }
        }
        Ok(())
    }
}

/// Makes a Debian root of `suite` in `dir` with `debootstrap --variant=minbase`,
/// from the archive the host's apt uses, with `packages` on top; removes `dir`
/// when it fails. For the release roots and the lab's container image.
///
/// # Errors
/// debootstrap is missing or failed (the tail of its log in the message).
pub fn debootstrap(suite: &str, packages: &[&str], dir: &Path) -> Result<()> {
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase");
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(suite).arg(dir).args(host_mirror());
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        LabError(format!(
            "debootstrap: {e} (apt-get install debootstrap, or run tests/run, which installs it)"
        ))
    })?;
    if !out.status.success() {
        let _ = fs::remove_dir_all(dir);
        let log = String::from_utf8_lossy(&out.stdout);
        let tail: Vec<&str> = log.lines().rev().take(8).collect();
        return err(format!(
            "debootstrap {suite} failed ({}):\n{}\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// `slurmd -V` of a root: `slurm-wlm 24.11.5`.
///
/// # Errors
/// The root has no working slurmd.
pub fn slurmd_version(root: &Path) -> Result<String> {
    let out = Command::new("chroot")
        .arg(root)
        .args(["slurmd", "-V"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError(format!("chroot {}: {e}", root.display())))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || text.is_empty() {
        return err(format!("no working slurmd in {}", root.display()));
    }
    Ok(text)
}

/// The Debian mirror the host's apt uses (its first `deb` source), so the
/// roots come from the same archive; empty to leave debootstrap's default.
fn host_mirror() -> Vec<String> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else { continue };
        if let Some(uri) = first_debian_uri(&text) {
            return vec![uri];
        }
    }
    Vec::new()
}

/// The first archive URI of a sources file (one-line `deb URI suite` or
/// deb822 `URIs:`), skipping the security archive, which has no sid.
fn first_debian_uri(text: &str) -> Option<String> {
    text.lines().map(str::trim).filter(|l| !l.starts_with('#')).find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let uri = match words.as_slice() {
            ["URIs:", uri, ..] => Some(*uri),
            ["deb", rest @ ..] => rest.iter().find(|w| w.contains("://")).copied(),
            _ => None,
        }?;
        (uri.ends_with("/debian") || uri.ends_with("/debian/")).then(|| uri.to_owned())
    })
}

/// Whether anything is mounted at or below `path`.
pub fn mounted_below(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).any(|m| Path::new(m).starts_with(path))
}

/// Undoes one recorded mount (recursively, lazily: the processes that used it are gone).
pub fn unmount(target: &Path) -> io::Result<()> {
    if !mounted_below(target) {
        return Ok(());
    }
    let status =
        Command::new("umount").args(["--recursive", "--lazy"]).arg(target).stderr(Stdio::null()).status()?;
    if status.success() { Ok(()) } else { Err(io::Error::other(format!("umount {}", target.display()))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_from_names_and_slurmd() {
        assert_eq!(parse_version("24.11"), Some((24, 11)));
        assert_eq!(parse_version("slurm-wlm 26.05.5"), Some((26, 5)));
        assert_eq!(parse_version("slurm 22.05.8"), Some((22, 5)));
        assert_eq!(parse_version("slurm-wlm"), None);
    }

    #[test]
    fn every_release_is_named_once_and_the_host_first() {
        assert!(RELEASES[0].is_host());
        assert!(RELEASES[1..].iter().all(|r| !r.is_host()));
        for r in RELEASES {
            assert_eq!(Release::named(r.version), Some(r));
            assert_eq!(parse_version(r.version), Some(r.number()));
        }
        assert_eq!(Release::named("23.02"), None);
    }

    #[test]
    fn the_mirror_is_read_from_both_source_formats() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n\
                      Types: deb\nURIs: http://mirror.example/debian-security\n";
        assert_eq!(first_debian_uri(deb822).as_deref(), Some("http://mirror.example/debian"));
        let one_line = "# a comment\ndeb [arch=amd64] http://mirror.example/debian bookworm main\n";
        assert_eq!(first_debian_uri(one_line).as_deref(), Some("http://mirror.example/debian"));
        assert_eq!(
            first_debian_uri("deb http://mirror.example/debian-security bookworm-security main"),
            None
        );
        assert_eq!(first_debian_uri(""), None);
    }
}
