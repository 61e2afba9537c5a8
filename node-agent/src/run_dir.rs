//! The agent's run directory (`run_dir`, `/run/spank-gpu` by default): the
//! Epilog gate's socket, the plugin's job records (`jobs/`), the live
//! per-job summaries (`usage/`). The agent runs as root and acts there by
//! path (binds a socket, removes and renames files), so the directory must
//! be root's alone, as the plugin requires of the same directories
//! (`spank-plugin/src/sysio.rs`, `open_run_dir`): every component from `/`
//! opened without following a link (`O_NOFOLLOW`), owned by root and
//! writable by no one else (a root's sticky directory such as `/tmp` may be
//! passed through); what is missing is made, its mode set through the
//! descriptor (`fchmod`), never by path. Once every component is root's
//! alone, no one else can swap one for a link, so a path below it names what
//! was checked.
//!
//! A directory that fails the check is refused: the caller logs it and turns
//! off what needs it (the gate, per-job use), never repairs another owner's
//! directory.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, fchmod, fchown, fstat, mkdirat, openat, renameat, unlinkat};
use rustix::io::Errno;

/// The mode the agent gives the run directory when it makes it.
pub const MODE: u32 = 0o755;

/// A checked directory: its descriptor (`O_DIRECTORY`, opened component by
/// component without following links) and the path it was opened by.
#[derive(Debug)]
pub struct RunDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl RunDir {
    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsFd for RunDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn errno(path: &Path, e: Errno) -> String {
    format!("{}: {}", path.display(), io::Error::from(e))
}

/// Whether a directory's status is root's alone: owned by root, writable by
/// no one else, but for a root's sticky directory (`/tmp`) on the way.
fn roots_alone(st: &rustix::fs::Stat, on_the_way: bool) -> bool {
    let lax = st.st_mode & 0o022 != 0;
    let sticky = st.st_mode & 0o1000 != 0;
    st.st_uid == 0 && (!lax || (on_the_way && sticky))
}

/// Opens the run directory `run_dir` (an absolute path), making what is
/// missing (mode [`MODE`]); see the module's comment.
///
/// # Errors
/// Not a clean absolute path; a component is a link, not a directory, not
/// root's, writable by others, or cannot be made or opened. The text names
/// the path and what is wrong.
pub fn open(run_dir: &Path) -> Result<RunDir, String> {
    let comps: Vec<&std::ffi::OsStr> = run_dir
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(Some(n)),
            Component::RootDir => Ok(None),
            _ => Err(format!("{}: not a clean absolute path", run_dir.display())),
        })
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    if !run_dir.is_absolute() {
        return Err(format!("{}: not a clean absolute path", run_dir.display()));
    }
    let mut fd = rustix::fs::open("/", dir_flags(), Mode::empty()).map_err(|e| errno(Path::new("/"), e))?;
    let mut at = PathBuf::from("/");
    for (i, comp) in comps.iter().enumerate() {
        at.push(comp);
        let (next, st) = open_or_make(&fd, comp, &at, MODE)?;
        if !roots_alone(&st, i + 1 < comps.len()) {
            return Err(not_roots(&at, &st));
        }
        fd = next;
    }
    Ok(RunDir { fd, path: run_dir.to_path_buf() })
}

fn not_roots(path: &Path, st: &rustix::fs::Stat) -> String {
    format!(
        "{}: not root's alone (owner uid {}, mode {:o}): refused",
        path.display(),
        st.st_uid,
        st.st_mode & 0o7777
    )
}

/// Opens the directory `name` in `parent`, not through a link, making it
/// when missing (its mode `mode`, set through its descriptor); with its
/// status.
fn open_or_make(
    parent: &impl AsFd,
    name: &std::ffi::OsStr,
    path: &Path,
    mode: u32,
) -> Result<(OwnedFd, rustix::fs::Stat), String> {
    let fd = match openat(parent, name, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            let made = match mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(errno(path, e)),
            };
            let fd = openat(parent, name, dir_flags(), Mode::empty()).map_err(|e| errno(path, e))?;
            if made {
                fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| errno(path, e))?;
            }
            fd
        }
        Err(Errno::LOOP | Errno::NOTDIR) => {
            return Err(format!("{}: a link or not a directory (not followed)", path.display()));
        }
        Err(e) => return Err(errno(path, e)),
    };
    let st = fstat(&fd).map_err(|e| errno(path, e))?;
    Ok((fd, st))
}

/// Opens the directory `name` of `dir` (`usage`), making it when missing,
/// with `mode` set through its descriptor (a root's directory made before
/// with another mode is corrected; one that is not root's is refused).
///
/// # Errors
/// A bad name, a link, not a directory, not root's, or it cannot be made,
/// opened or changed.
pub fn sub_dir(dir: &RunDir, name: &str, mode: u32) -> Result<RunDir, String> {
    let path = dir.path.join(name);
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!("{}: bad name", path.display()));
    }
    let (fd, st) = open_or_make(dir, name.as_ref(), &path, mode)?;
    if st.st_uid != 0 {
        return Err(not_roots(&path, &st));
    }
    if st.st_mode & 0o7777 != mode {
        fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| errno(&path, e))?;
    }
    Ok(RunDir { fd, path })
}

/// Replaces the file `name` of `dir` with `bytes`, owned by `uid` (and
/// root's group) with mode `mode`: written to a new hidden file opened
/// without following links, its owner and mode set through its descriptor,
/// then renamed over the old one, so a reader never sees half and never
/// sees it with another owner or mode.
///
/// # Errors
/// A bad name, or the file cannot be written, changed or renamed; no
/// temporary file is left.
pub fn write_file(dir: &RunDir, name: &str, bytes: &[u8], uid: u32, mode: u32) -> Result<(), String> {
    let path = dir.path.join(name);
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!("{}: bad name", path.display()));
    }
    let tmp = format!(".{name}.{}", std::process::id());
    let _ = unlinkat(dir, tmp.as_str(), AtFlags::empty());
    let fd = openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| errno(&path, e))?;
    let done = (|| -> Result<(), String> {
        let owner = rustix::fs::Uid::from_raw(uid);
        fchown(&fd, Some(owner), Some(rustix::fs::Gid::ROOT)).map_err(|e| errno(&path, e))?;
        fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| errno(&path, e))?;
        File::from(fd).write_all(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        renameat(dir, tmp.as_str(), dir, name).map_err(|e| errno(&path, e))
    })();
    if done.is_err() {
        let _ = unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    done
}

/// Removes the file `name` of `dir`; one not there is no error.
///
/// # Errors
/// A bad name, or it cannot be removed.
pub fn remove_file(dir: &RunDir, name: &str) -> Result<(), String> {
    let path = dir.path.join(name);
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!("{}: bad name", path.display()));
    }
    match unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(errno(&path, e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn base(name: &str) -> PathBuf {
        let b = std::env::temp_dir().join(format!("run-dir-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&b);
        fs::create_dir_all(&b).unwrap();
        fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
        b
    }

    #[test]
    fn made_root_only_and_lax_or_linked_ones_refused() {
        if !rustix::process::geteuid().is_root() {
            // Made by this user, so not root's: refused.
            assert!(open(&base("user").join("x")).is_err());
            return;
        }
        let b = base("root");
        let run = b.join("spank-gpu");
        let dir = open(&run).unwrap();
        assert_eq!(dir.path(), run);
        assert_eq!(fs::metadata(&run).unwrap().mode() & 0o7777, MODE);
        let usage = sub_dir(&dir, "usage", 0o711).unwrap();
        assert_eq!(fs::metadata(run.join("usage")).unwrap().mode() & 0o7777, 0o711);
        // An older agent's 0755 is corrected through the descriptor.
        fs::set_permissions(run.join("usage"), fs::Permissions::from_mode(0o777)).unwrap();
        sub_dir(&dir, "usage", 0o711).unwrap();
        assert_eq!(fs::metadata(run.join("usage")).unwrap().mode() & 0o7777, 0o711);
        // A file for the job's user: theirs, 0400, written whole.
        write_file(&usage, "42", b"one\n", 65534, 0o400).unwrap();
        write_file(&usage, "42", b"two\n", 65534, 0o400).unwrap();
        let m = fs::metadata(run.join("usage/42")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 0, 0o400));
        assert_eq!(fs::read_to_string(run.join("usage/42")).unwrap(), "two\n");
        assert_eq!(fs::read_dir(run.join("usage")).unwrap().count(), 1, "no temporary file left");
        assert!(write_file(&usage, "../x", b"", 0, 0o600).is_err());
        remove_file(&usage, "42").unwrap();
        remove_file(&usage, "42").unwrap();

        // A user's directory on the way (or at the end), or a lax one: refused.
        fs::set_permissions(&run, fs::Permissions::from_mode(0o777)).unwrap();
        let e = open(&run).unwrap_err();
        assert!(e.contains("not root's alone"), "{e}");
        fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&run, Some(65534), None).unwrap();
        assert!(open(&run).unwrap_err().contains("owner uid 65534"));
        assert!(open(&run.join("sub")).is_err(), "nothing made under it");
        assert!(!run.join("sub").exists());
        std::os::unix::fs::chown(&run, Some(0), None).unwrap();
        std::os::unix::fs::chown(run.join("usage"), Some(65534), None).unwrap();
        assert!(sub_dir(&dir, "usage", 0o711).is_err(), "a user's usage directory");
        // A link is never followed, at the end or on the way.
        std::os::unix::fs::symlink(&run, b.join("link")).unwrap();
        assert!(open(&b.join("link")).unwrap_err().contains("not followed"));
        assert!(open(&b.join("link/usage")).is_err());
        assert!(open(Path::new("relative/run")).is_err());
        assert!(open(&run.join("../spank-gpu")).is_err());
        fs::remove_dir_all(&b).unwrap();
    }
}
