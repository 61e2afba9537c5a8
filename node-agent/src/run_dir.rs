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

use rustix::fs::{
    AtFlags, Mode, OFlags, XattrFlags, fchmod, fchown, fsetxattr, fstat, mkdirat, openat, renameat, unlinkat,
};
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

/// The extended attribute holding a file's POSIX access ACL.
const ACL_XATTR: &str = "system.posix_acl_access";
/// The kernel's binary ACL format's version (`POSIX_ACL_XATTR_VERSION`,
/// include/uapi/linux/posix_acl_xattr.h).
const ACL_VERSION: u32 = 2;
/// Entry tags (include/uapi/linux/posix_acl.h).
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
/// The id of an entry that names no one (`ACL_UNDEFINED_ID`).
const ACL_NO_ID: u32 = u32::MAX;
/// Read permission in an entry.
const ACL_READ: u16 = 4;

/// The access ACL `user::r--, user:UID:r--, group::---, mask::r--,
/// other::---` in the kernel's binary format: a little-endian `u32`
/// version, then entries sorted by tag, each `{u16 tag, u16 perm, u32 id}`.
pub fn read_acl(uid: u32) -> [u8; 44] {
    let entries: [(u16, u16, u32); 5] = [
        (ACL_USER_OBJ, ACL_READ, ACL_NO_ID),
        (ACL_USER, ACL_READ, uid),
        (ACL_GROUP_OBJ, 0, ACL_NO_ID),
        (ACL_MASK, ACL_READ, ACL_NO_ID),
        (ACL_OTHER, 0, ACL_NO_ID),
    ];
    let mut out = [0u8; 44];
    out[..4].copy_from_slice(&ACL_VERSION.to_le_bytes());
    for (e, (tag, perm, id)) in out[4..].chunks_exact_mut(8).zip(entries) {
        e[..2].copy_from_slice(&tag.to_le_bytes());
        e[2..4].copy_from_slice(&perm.to_le_bytes());
        e[4..].copy_from_slice(&id.to_le_bytes());
    }
    out
}

/// What [`write_file`] could grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granted {
    /// As asked: root's file, and the reader's ACL when one was asked for.
    AsAsked,
    /// The file system has no POSIX ACLs: root's file, readable by root only.
    RootOnly,
}

/// Replaces the file `name` of `dir` with `bytes`: root's (user and group),
/// mode `mode`, and with `reader` readable by that user too through a
/// POSIX access ACL ([`read_acl`]; the mode's group bits then show the
/// ACL's mask, `r`). Written to a new hidden file opened without following
/// links, its bytes, owner, mode and ACL set through its descriptor, then
/// renamed over the old one, so a reader never sees half and never sees it
/// with another owner, mode or ACL. The file is never the reader's: a user
/// who owned it could make it writable and fill the file system.
///
/// # Errors
/// A bad name, or the file cannot be written, changed or renamed; no
/// temporary file is left. A file system without ACLs is no error: the
/// file is root's alone ([`Granted::RootOnly`]).
pub fn write_file(
    dir: &RunDir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    reader: Option<u32>,
) -> Result<Granted, String> {
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
    let done = (|| -> Result<Granted, String> {
        fchown(&fd, Some(rustix::fs::Uid::ROOT), Some(rustix::fs::Gid::ROOT)).map_err(|e| errno(&path, e))?;
        let mut file = File::from(fd);
        file.write_all(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        fchmod(&file, Mode::from_raw_mode(mode)).map_err(|e| errno(&path, e))?;
        let granted = match reader {
            None => Granted::AsAsked,
            Some(uid) => match fsetxattr(&file, ACL_XATTR, &read_acl(uid), XattrFlags::empty()) {
                Ok(()) => Granted::AsAsked,
                Err(Errno::OPNOTSUPP) => Granted::RootOnly,
                Err(e) => return Err(errno(&path, e)),
            },
        };
        renameat(dir, tmp.as_str(), dir, name).map_err(|e| errno(&path, e))?;
        Ok(granted)
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
        // A file for the job's user: root's, read by the user through an
        // ACL, written whole.
        assert_eq!(write_file(&usage, "42", b"one\n", 0o400, Some(65534)), Ok(Granted::AsAsked));
        assert_eq!(write_file(&usage, "42", b"two\n", 0o400, Some(65534)), Ok(Granted::AsAsked));
        let file = run.join("usage/42");
        let m = fs::metadata(&file).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, 0o440), "the group bits: the ACL's mask");
        assert_eq!(fs::read_to_string(&file).unwrap(), "two\n");
        assert_eq!(fs::read_dir(run.join("usage")).unwrap().count(), 1, "no temporary file left");
        let mut acl = [0u8; 64];
        let n = rustix::fs::getxattr(&file, ACL_XATTR, &mut acl).unwrap();
        assert_eq!(&acl[..n], &read_acl(65534)[..]);
        if let Ok(out) = std::process::Command::new("getfacl").args(["-n", "-c"]).arg(&file).output() {
            let text = String::from_utf8_lossy(&out.stdout);
            for entry in ["user::r--", "user:65534:r--", "group::---", "mask::r--", "other::---"] {
                assert!(text.lines().any(|l| l == entry), "{entry} in {text}");
            }
        }
        // The user reads it, cannot make it writable or write it; another
        // user cannot read it.
        let as_user = |uid: &str, cmd: &str| {
            std::process::Command::new("setpriv")
                .args([&format!("--reuid={uid}"), "--regid=65534", "--clear-groups", "sh", "-c", cmd])
                .arg("sh")
                .arg(&file)
                .output()
                .unwrap()
        };
        let read = as_user("65534", "cat \"$1\"");
        assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
        assert_eq!(read.stdout, b"two\n");
        assert!(!as_user("65534", "chmod u+w \"$1\"").status.success(), "not the user's to chmod");
        assert!(!as_user("65534", "echo x >> \"$1\"").status.success(), "not writable");
        assert!(!as_user("65534", "setfacl -m u:65534:rw \"$1\"").status.success());
        assert!(!as_user("65533", "cat \"$1\"").status.success(), "another user");
        assert_eq!(fs::read_to_string(&file).unwrap(), "two\n");
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o7777, 0o440);
        // Root's alone when no reader is named: no ACL.
        assert_eq!(write_file(&usage, "43", b"x\n", 0o400, None), Ok(Granted::AsAsked));
        assert_eq!(fs::metadata(run.join("usage/43")).unwrap().mode() & 0o7777, 0o400);
        assert!(rustix::fs::getxattr(run.join("usage/43"), ACL_XATTR, &mut acl).is_err());
        assert!(!as_user("65534", "cat \"$1/../43\"").status.success());
        remove_file(&usage, "43").unwrap();
        assert!(write_file(&usage, "../x", b"", 0o600, None).is_err());
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

    #[test]
    fn the_readers_acl_in_the_kernels_format() {
        let want: Vec<u8> = [
            &2u32.to_le_bytes()[..],
            &[1, 0, 4, 0, 0xff, 0xff, 0xff, 0xff],
            &[2, 0, 4, 0, 0xe8, 0x03, 0, 0],
            &[4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            &[0x10, 0, 4, 0, 0xff, 0xff, 0xff, 0xff],
            &[0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
        ]
        .concat();
        assert_eq!(read_acl(1000).to_vec(), want);
    }

    /// A file system without POSIX ACLs (ramfs, mounted where the test may
    /// mount): the file is written, root's alone, 0400, never the user's.
    #[test]
    fn without_acls_the_file_is_roots_alone() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let b = base("noacl");
        let mnt = b.join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "ramfs", "none"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("ramfs cannot be mounted here: the test of a file system without ACLs is skipped");
            fs::remove_dir_all(&b).unwrap();
            return;
        }
        fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
        // Nothing between the mount and the unmount panics.
        let got = open(&mnt.join("spank-gpu"))
            .and_then(|run| sub_dir(&run, "usage", 0o711))
            .and_then(|usage| write_file(&usage, "42", b"one\n", 0o400, Some(65534)));
        let file = mnt.join("spank-gpu/usage/42");
        let m = fs::metadata(&file).map(|m| (m.uid(), m.gid(), m.mode() & 0o7777));
        let text = fs::read_to_string(&file);
        let entries = fs::read_dir(mnt.join("spank-gpu/usage")).map(Iterator::count);
        let _ = std::process::Command::new("umount").arg(&mnt).status();
        assert_eq!(got, Ok(Granted::RootOnly));
        assert_eq!(m.unwrap(), (0, 0, 0o400));
        assert_eq!(text.unwrap(), "one\n");
        assert_eq!(entries.unwrap(), 1, "no temporary file left");
        fs::remove_dir_all(&b).unwrap();
    }
}
