//! The few things the plugin asks of the node itself (not of Slurm), in safe
//! Rust: whether a port can be bound, and who holds it; trusted files; the
//! GPU device files through a directory opened before the fork; the mount
//! namespace; the network interfaces; one of the user's files, read as the
//! user.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::fd::OwnedFd;

use std::path::Path;

use task_plan::devices::Access;
use task_plan::ports;
use task_plan::rdzv::container::MountNs;

/// Upper bound on the `/proc` entries looked at to name a port's holder.
const MAX_PROC_SCAN: usize = 200_000;

/// Binds (and closes at once) a listener on `port` on all IPv4 addresses.
///
/// # Errors
/// The bind failed; the text has the OS error and, when this user can see it,
/// the process that listens on the port.
pub fn probe_port(port: u16) -> io::Result<()> {
    match TcpListener::bind(("0.0.0.0", port)) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            match holder(port) {
                Some(who) => format!("{e}; held by {who}"),
                None => format!("{e}; holder not visible to this user"),
            },
        )),
    }
}

/// The process listening on `port`, found through `/proc/net/tcp{,6}` and the
/// socket links in `/proc/PID/fd` (links are read, never followed).
fn holder(port: u16) -> Option<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = fs::read_to_string(table) {
            inodes.extend(ports::listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut seen = 0;
    for proc_entry in fs::read_dir("/proc").ok()?.flatten() {
        let name = proc_entry.file_name();
        let Some(pid) = name.to_str().filter(|s| s.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            seen += 1;
            if seen > MAX_PROC_SCAN {
                return None;
            }
            let Ok(target) = fs::read_link(fd.path()) else { continue };
            if wanted.iter().any(|w| target.as_os_str() == w.as_str()) {
                let comm = fs::read_to_string(proc_entry.path().join("comm")).unwrap_or_default();
                return Some(format!("pid {pid} ({})", comm.trim()));
            }
        }
    }
    None
}

/// Reads a file that must be root's and writable only by root, opened without
/// following a link, in a directory that only root can write. Used for what
/// the plugin reads as root or trusts for every user's tasks.
///
/// # Errors
/// Any of those conditions fails, or the file is larger than `max_bytes`.
pub fn read_trusted(path: &str, max_bytes: usize) -> io::Result<String> {
    let bytes = slurm_formats::trusted::read_trusted(Path::new(path), max_bytes, &[0])?;
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

/// The node's network interfaces, as `getifaddrs(3)` lists them (through
/// `node_info`), grouped by name in its order.
///
/// # Errors
/// `getifaddrs` failed.
pub fn interfaces() -> io::Result<Vec<task_plan::netif::Interface>> {
    use task_plan::netif::{Entry, group};
    let entries =
        node_info::getifaddrs().map_err(|e| io::Error::new(e.kind(), format!("getifaddrs: {e}")))?;
    Ok(group(entries.into_iter().map(|e| Entry::from_flags(e.name, e.flags, e.addr, e.prefix))))
}

/// Reads one of the user's files as the user (`~/.nccl.conf`): refused
/// unless this process's real and effective user is `uid` (a forked task,
/// after slurmstepd gave up root for the job's user), opened with
/// `O_NONBLOCK` (a FIFO never blocks the task) and `O_CLOEXEC`, a regular
/// file of at most `max_bytes`. A link is followed: the process has only the
/// user's rights, and NCCL's own `fopen` follows it too (dotfile managers
/// link `~/.nccl.conf` into a repository). Bytes that are not UTF-8 are
/// replaced.
///
/// # Errors
/// Any of those conditions fails; the text names the path.
pub fn read_user_file(path: &str, max_bytes: usize, uid: u32) -> io::Result<String> {
    use rustix::fs::{FileType, Mode, OFlags, fstat, open};
    use std::io::Read;
    let (real, effective) = (rustix::process::getuid().as_raw(), rustix::process::geteuid().as_raw());
    if real != uid || effective != uid {
        return Err(io::Error::other(format!(
            "{path}: not read: this process runs as uid {real}/{effective}, not the job's user {uid}"
        )));
    }
    let named = |e: rustix::io::Errno| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{path}: {e}"))
    };
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let fd = open(path, flags, Mode::empty()).map_err(named)?;
    let st = fstat(&fd).map_err(named)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{path}: not a regular file")));
    }
    let mut bytes = Vec::new();
    let cap = u64::try_from(max_bytes).unwrap_or(u64::MAX).saturating_add(1);
    fs::File::from(fd).take(cap).read_to_end(&mut bytes)?;
    if bytes.len() > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path}: larger than {max_bytes} bytes"),
        ));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The GPU device directory, opened before the fork ([`open_dev_dir`]):
/// the descriptor and the directory's identity (device and inode) when it
/// was opened. The descriptor is never closed by the plugin (the step state
/// holding it lives as long as slurmstepd; `O_CLOEXEC` closes it at the
/// task's `exec`): where `user_init` ran in a process of its own (24.05+
/// with `SlurmdParameters=contain_spank`: a `clone(CLONE_VM)` child without
/// a shared descriptor table, mgr.c `_run_spank_func`), its number may name
/// another of slurmstepd's files by now, which must neither be closed nor be
/// taken for the directory.
#[derive(Debug)]
pub struct DevDir {
    fd: std::mem::ManuallyDrop<OwnedFd>,
    dev: u64,
    ino: u64,
}

impl DevDir {
    /// Whether the descriptor still names the directory it was opened on.
    fn is_the_same(&self) -> bool {
        rustix::fs::fstat(&*self.fd).is_ok_and(|st| st.st_dev == self.dev && st.st_ino == self.ino)
    }
}

/// Opens the GPU device directory `path` (the plugstack line's, `/dev` by
/// default) for [`device_access_at`]: `O_PATH` (nothing is read, no
/// permission on the directory but search on its parents is needed),
/// `O_DIRECTORY`, and `O_CLOEXEC` so that the user's program never
/// inherits it. slurmstepd opens it in `user_init`, in the host's mount
/// namespace; the tasks it forks inherit the descriptor (slurmstepd closes
/// none between the fork and `task_init`), and a task that a container
/// plugin has moved into another mount namespace still reaches the host's
/// directory through it.
///
/// # Errors
/// Missing, not a directory, or refused; the text names the path.
pub fn open_dev_dir(path: &str) -> io::Result<DevDir> {
    use rustix::fs::{Mode, OFlags, fstat, open};
    let named = |e: rustix::io::Errno| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{path}: {e}"))
    };
    let fd = open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(named)?;
    let st = fstat(&fd).map_err(named)?;
    // dev_t and ino_t are u64 on 64-bit Linux; this fails to build where not.
    Ok(DevDir { fd: std::mem::ManuallyDrop::new(fd), dev: st.st_dev, ino: st.st_ino })
}

/// Whether the calling process may reach the device file `name` in the
/// directory `dir` ([`open_dev_dir`]) as its device cgroup says:
/// `faccessat(2)` with `R_OK` and no flags, `access(2)` relative to the
/// descriptor (the real ids, as `access(2)`; read is what the file's mode is
/// least likely to refuse). The answer is the directory the descriptor was
/// opened on, wherever the process's root, working directory or mount
/// namespace is now. A name, not a path: one with a `/` is not looked up.
/// `None` when the descriptor no longer names that directory (see
/// [`DevDir`]): the caller then looks the file up by path.
pub fn device_access_at(dir: &DevDir, name: &str) -> Option<Access> {
    use rustix::fs::{AtFlags, accessat};
    if !dir.is_the_same() {
        return None;
    }
    if name.is_empty() || name.contains('/') || name == ".." {
        return Some(Access::Unknown);
    }
    let errno = accessat(&*dir.fd, name, rustix::fs::Access::READ_OK, AtFlags::empty()).err();
    Some(Access::from_errno(errno.map(rustix::io::Errno::raw_os_error), false))
}

/// The calling process's mount namespace: the device and inode of
/// `/proc/self/ns/mnt`, which `stat(2)` follows to the namespace's own
/// inode (namespaces(7): two processes are in the same namespace when both
/// match).
///
/// # Errors
/// `/proc` is not mounted, or the kernel refused; the text names the path.
pub fn mount_ns() -> io::Result<MountNs> {
    const PATH: &str = "/proc/self/ns/mnt";
    let st = rustix::fs::stat(PATH).map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{PATH}: {e}"))
    })?;
    // dev_t and ino_t are u64 on 64-bit Linux; this fails to build where not.
    Ok(MountNs { dev: st.st_dev, ino: st.st_ino })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn run_dirs_are_made_root_only_and_files_replaced_whole() {
        let base = std::env::temp_dir().join(format!("sysio-rundir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let path = base.join("spank-gpu/jobs");
        let path = path.to_str().unwrap();
        let root = rustix::process::geteuid().is_root();
        let opened = open_run_dir(path, true);
        if !root {
            // Made by this user, so not root's: refused.
            assert!(opened.is_err());
            let _ = fs::remove_dir_all(&base);
            return;
        }
        let dir = opened.unwrap();
        assert!(dir.locked() && !dir.lock_missed());
        // The records' directory and its files are root's alone.
        assert_eq!(fs::metadata(path).unwrap().mode() & 0o7777, 0o700);
        let lock = fs::symlink_metadata(base.join("spank-gpu/jobs.lock")).unwrap();
        assert!(lock.is_file());
        assert_eq!((lock.uid(), lock.mode() & 0o7777), (0, 0o600));
        run_dir_write(&dir, "42", "one\n").unwrap();
        run_dir_write(&dir, "42", "two\n").unwrap();
        assert_eq!(run_dir_read(&dir, "42", 100).unwrap(), "two\n");
        assert_eq!(fs::metadata(base.join("spank-gpu/jobs/42")).unwrap().mode() & 0o777, 0o600);
        assert_eq!(run_dir_names(&dir).unwrap(), vec!["42".to_owned()]);
        // A second opener waits for the lock, then goes on without it, saying so.
        let t = std::time::Instant::now();
        let second = open_run_dir(path, true).unwrap();
        assert!(t.elapsed() >= LOCK_WAIT, "{:?}", t.elapsed());
        assert!(second.lock_missed() && !second.locked());
        drop((dir, second));
        // Other directories keep their 0755 and 0644 files (DCGM exporter reads them).
        let dcgm_path = base.join("spank-gpu/hpc-jobs");
        let dcgm = open_run_dir(dcgm_path.to_str().unwrap(), false).unwrap();
        run_dir_write(&dcgm, "3", "42\n").unwrap();
        assert_eq!(fs::metadata(&dcgm_path).unwrap().mode() & 0o7777, 0o755);
        assert_eq!(fs::metadata(dcgm_path.join("3")).unwrap().mode() & 0o7777, 0o644);
        let dir = open_run_dir(path, true).unwrap();
        // A link is never followed, read or written through.
        std::os::unix::fs::symlink("/etc/passwd", base.join("spank-gpu/jobs/7")).unwrap();
        assert!(run_dir_read(&dir, "7", 100).is_err());
        assert!(run_dir_write(&dir, "../x", "").is_err());
        run_dir_remove(&dir, "42").unwrap();
        run_dir_remove(&dir, "42").unwrap();
        // A directory on the way that others may write in is refused.
        fs::set_permissions(base.join("spank-gpu"), std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let e = open_run_dir(path, false).unwrap_err();
        assert!(e.to_string().contains("not root's alone"), "{e}");
        std::os::unix::fs::symlink(base.join("spank-gpu"), base.join("link")).unwrap();
        assert!(open_run_dir(base.join("link/jobs").to_str().unwrap(), false).is_err());
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn a_users_lock_on_the_records_directory_holds_up_no_prolog() {
        if !rustix::process::geteuid().is_root() {
            return; // Run as root in CI: the directories must be root's.
        }
        let base = std::env::temp_dir().join(format!("sysio-lock-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let jobs = base.join("spank-gpu/jobs");
        // As an older plugin left it: 0755, so any user could open it.
        fs::create_dir_all(&jobs).unwrap();
        fs::set_permissions(&jobs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        // A user's `flock /run/spank-gpu/jobs sleep 1d`.
        let mut holder = std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "flock"])
            .arg(&jobs)
            .args(["sleep", "30"])
            .spawn()
            .unwrap();
        let user_fd = fs::File::open(&jobs).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // Until the user's flock holds the directory.
        while rustix::fs::flock(&user_fd, rustix::fs::FlockOperation::NonBlockingLockShared).is_ok() {
            let _ = rustix::fs::flock(&user_fd, rustix::fs::FlockOperation::Unlock);
            assert!(std::time::Instant::now() < deadline, "the user's flock never took the directory");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let t = std::time::Instant::now();
        let dir = open_run_dir(jobs.to_str().unwrap(), true).unwrap();
        let waited = t.elapsed();
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(waited < std::time::Duration::from_millis(500), "held up {waited:?}");
        assert!(dir.locked() && !dir.lock_missed());
        // And the user can no longer open the directory to lock it.
        assert_eq!(fs::metadata(&jobs).unwrap().mode() & 0o7777, 0o700);
        drop(dir);
        // A lock file that is a link, or not root's, is refused.
        fs::remove_file(base.join("spank-gpu/jobs.lock")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", base.join("spank-gpu/jobs.lock")).unwrap();
        assert!(open_run_dir(jobs.to_str().unwrap(), true).is_err());
        assert_eq!(fs::metadata("/etc/passwd").unwrap().mode() & 0o7777, 0o644, "nothing changed through it");
        fs::remove_file(base.join("spank-gpu/jobs.lock")).unwrap();
        fs::write(base.join("spank-gpu/jobs.lock"), "").unwrap();
        std::os::unix::fs::chown(base.join("spank-gpu/jobs.lock"), Some(65534), None).unwrap();
        let e = open_run_dir(jobs.to_str().unwrap(), true).unwrap_err();
        assert!(e.to_string().contains("not root's file"), "{e}");
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_device_directory_is_probed_where_it_was_opened() {
        let base = std::env::temp_dir().join(format!("sysio-devdir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let dev = base.join("dev");
        fs::create_dir_all(&dev).unwrap();
        fs::write(dev.join("nvidia0"), "").unwrap();
        let path = dev.to_str().unwrap().to_owned();

        let dir = open_dev_dir(&path).unwrap();
        // The user's program never inherits it.
        let flags = rustix::io::fcntl_getfd(&*dir.fd).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC), "{flags:?}");
        assert_eq!(device_access_at(&dir, "nvidia0"), Some(Access::Allowed));
        assert_eq!(device_access_at(&dir, "nvidia1"), Some(Access::Unknown), "no such file");

        // What a task sees after a container plugin's setns: at the path, a
        // /dev without the GPU (here the directory moved away and another put
        // in its place). The path says nothing; the descriptor still names
        // the directory it was opened on.
        fs::rename(&dev, base.join("host-dev")).unwrap();
        fs::create_dir_all(&dev).unwrap();
        let by_path = rustix::fs::access(dev.join("nvidia0").as_path(), rustix::fs::Access::READ_OK);
        assert_eq!(by_path, Err(rustix::io::Errno::NOENT));
        assert_eq!(device_access_at(&dir, "nvidia0"), Some(Access::Allowed), "the descriptor's directory");
        // Even with the path gone altogether.
        fs::remove_dir(&dev).unwrap();
        assert_eq!(device_access_at(&dir, "nvidia0"), Some(Access::Allowed));

        // Names only: nothing outside the directory is looked up.
        for name in ["", "..", "../host-dev/nvidia0", "/dev/null"] {
            assert_eq!(device_access_at(&dir, name), Some(Access::Unknown), "{name:?}");
        }
        // A missing directory, or a file, is an error naming it.
        let e = open_dev_dir(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().starts_with(&format!("{path}: ")), "{e}");
        let file = base.join("host-dev/nvidia0");
        let e = open_dev_dir(file.to_str().unwrap()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{e}");
        // A descriptor number that names another file now (user_init ran in a
        // process of its own, which closed it): not taken for the directory.
        let other = open_dev_dir(base.to_str().unwrap()).unwrap();
        let stale = DevDir { fd: std::mem::ManuallyDrop::new(rustix::io::dup(&*other.fd).unwrap()), ..dir };
        assert_eq!(device_access_at(&stale, "nvidia0"), None, "another directory behind the number");
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_mount_namespace_is_the_one_proc_names() {
        let ns = mount_ns().unwrap();
        assert_eq!(mount_ns().unwrap(), ns, "the same process, the same namespace");
        let meta = fs::metadata("/proc/self/ns/mnt").unwrap();
        assert_eq!((ns.dev, ns.ino), (meta.dev(), meta.ino()));
        let link = fs::read_link("/proc/self/ns/mnt").unwrap();
        assert_eq!(link.to_str(), Some(format!("mnt:[{}]", ns.ino).as_str()));
    }

    #[test]
    fn trusted_files_must_be_roots_and_not_links() {
        // Tests run as root in CI; as another user every file is refused, which
        // the last assertion covers as well.
        let dir = std::env::temp_dir().join(format!("sysio-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let f = dir.join("t.txt");
        fs::write(&f, "hello").unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let root = fs::metadata(&f).unwrap().uid() == 0;
        assert_eq!(read_trusted(f.to_str().unwrap(), 100).is_ok(), root);
        assert_eq!(
            read_trusted(f.to_str().unwrap(), 2).unwrap_err().kind(),
            io::ErrorKind::InvalidData,
            "too big"
        );
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let e = read_trusted(f.to_str().unwrap(), 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("writable by others"), "{e}");
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let link = dir.join("link.txt");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(read_trusted(link.to_str().unwrap(), 100).is_err(), "links are not followed");
        assert_eq!(read_trusted("/nonexistent/x", 100).unwrap_err().kind(), io::ErrorKind::NotFound);
        // A FIFO is refused at once instead of blocking the open for a writer.
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = read_trusted(fifo.to_str().unwrap(), 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not a regular file"), "{e}");
        if root {
            // A file a user owns, even unwritable by others, is not trusted.
            std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
            assert!(
                read_trusted(f.to_str().unwrap(), 100).unwrap_err().to_string().contains("not owned by root")
            );
            std::os::unix::fs::chown(&f, Some(0), Some(0)).unwrap();
            // Nor a root file in a directory others can write to (it could be swapped).
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
            assert!(
                read_trusted(f.to_str().unwrap(), 100)
                    .unwrap_err()
                    .to_string()
                    .contains("writable only by root")
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_interfaces_include_the_loopback() {
        let all = interfaces().unwrap();
        let lo = all.iter().find(|i| i.name == "lo").unwrap();
        assert!(lo.loopback && lo.up, "{lo:?}");
        assert_eq!(all.iter().filter(|i| i.name == "lo").count(), 1, "one entry per interface");
    }

    #[test]
    fn the_users_file_is_read_as_the_user_without_links_or_blocking() {
        let me = rustix::process::getuid().as_raw();
        let dir = std::env::temp_dir().join(format!("sysio-user-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("nccl.conf");
        fs::write(&f, "NCCL_SOCKET_IFNAME=ib0\n").unwrap();
        let path = f.to_str().unwrap();
        assert_eq!(read_user_file(path, 100, me).unwrap(), "NCCL_SOCKET_IFNAME=ib0\n");
        // Only as the job's user.
        let e = read_user_file(path, 100, me.wrapping_add(1)).unwrap_err();
        assert!(e.to_string().contains("not the job's user"), "{e}");
        // Too large.
        assert_eq!(read_user_file(path, 5, me).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // A link is followed, with the user's rights, as NCCL follows it.
        let link = dir.join("link.conf");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read_user_file(link.to_str().unwrap(), 100, me).unwrap(), "NCCL_SOCKET_IFNAME=ib0\n");
        // A FIFO is refused at once instead of blocking the task.
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = read_user_file(fifo.to_str().unwrap(), 100, me).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let missing = read_user_file(dir.join("none").to_str().unwrap(), 100, me).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_held_port_names_its_holder() {
        let listener = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let err = probe_port(port).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        let err = err.to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(listener);
        // Free again: it binds, unless another process took the ephemeral
        // port in the meantime (seen once in CI); it is never ours any more.
        if let Err(e) = probe_port(port) {
            assert!(!e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
        }
    }
}

/// A root's directory under `/run` the job prolog and epilog write in
/// (`/run/spank-gpu/jobs`, `.../hpc-jobs`), opened by [`open_run_dir`]: every
/// component opened without following a link, made (mode 0755) when
/// missing, and each root's and writable by no one else (but for a root's
/// sticky directory on the way, such as `/tmp`).
///
/// With `lock` (the job records' directory), it is root's alone: mode 0700
/// (set through its descriptor, also on one an older plugin made 0755), its
/// files 0600, since a record names the job's user and GPUs. The prologs
/// and epilogs of one node then take turns under `flock(LOCK_EX)` on a
/// sibling file, `NAME.lock` (`/run/spank-gpu/jobs.lock`), root's, mode
/// 0600, opened without following a link, held until the `RunDir` is
/// dropped. Not on the directory itself: anyone who can open a file can
/// `flock` it, and a user's `flock /run/spank-gpu/jobs sleep 1d` would hold
/// up every prolog of the node; no one but root can open the lock file.
#[derive(Debug)]
pub struct RunDir {
    fd: OwnedFd,
    path: String,
    /// The lock file's descriptor, while it holds the lock.
    lock: Option<OwnedFd>,
    /// Whether the lock was wanted but still held by another after
    /// [`LOCK_WAIT`] (this opener went on without it).
    lock_missed: bool,
    /// The mode its files are written with.
    file_mode: u32,
}

impl RunDir {
    /// Whether the lock was wanted but another held it past [`LOCK_WAIT`]:
    /// this opener goes on without it (a record is still written whole).
    pub fn lock_missed(&self) -> bool {
        self.lock_missed
    }

    /// Whether it holds the lock (the tests' question).
    #[cfg(test)]
    pub fn locked(&self) -> bool {
        self.lock.is_some()
    }
}

/// How long [`open_run_dir`] waits for another prolog's lock before it goes
/// on without (a prolog must never hang: slurmd would drain the node).
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The mode of the job records' directory and its lock file, and of its files.
const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;

/// Opens (making what is missing) the absolute directory `path`; see [`RunDir`].
///
/// # Errors
/// A component is a link, not a directory, not root's, writable by others,
/// or cannot be made or opened; with `lock`, the lock file is a link, not a
/// regular file, or not root's, or cannot be made.
pub fn open_run_dir(path: &str, lock: bool) -> io::Result<RunDir> {
    use rustix::fs::{Mode, OFlags, fchmod, fstat, mkdirat, openat};
    let named = |e: rustix::io::Errno| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{path}: {e}"))
    };
    if !path.starts_with('/') || path.split('/').any(|c| c == ".." || c == ".") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path}: not a clean absolute path"),
        ));
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut fd = rustix::fs::open("/", flags, Mode::empty()).map_err(named)?;
    let mut parent = None;
    let mut last = "";
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        let next = match openat(&fd, comp, flags, Mode::empty()) {
            Ok(f) => f,
            Err(rustix::io::Errno::NOENT) => {
                match mkdirat(&fd, comp, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(named(e)),
                }
                openat(&fd, comp, flags, Mode::empty()).map_err(named)?
            }
            Err(e) => return Err(named(e)),
        };
        let st = fstat(&next).map_err(named)?;
        // Root's, and no one else may write in it (a root's sticky directory
        // such as /tmp may be passed through: what is made in it is checked).
        if st.st_uid != 0 || (st.st_mode & 0o022 != 0 && st.st_mode & 0o1000 == 0) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{path}: {comp} is not root's alone (uid {}, mode {:o})",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            ));
        }
        parent = Some(std::mem::replace(&mut fd, next));
        last = comp;
    }
    let mut dir = RunDir { fd, path: path.to_owned(), lock: None, lock_missed: false, file_mode: 0o644 };
    if lock {
        if fstat(&dir.fd).map_err(named)?.st_mode & 0o7777 != PRIVATE_DIR {
            fchmod(&dir.fd, Mode::from_raw_mode(PRIVATE_DIR)).map_err(named)?;
        }
        dir.file_mode = PRIVATE_FILE;
        let Some(parent) = parent else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{path}: no lock beside /")));
        };
        let file = open_lock_file(&parent, &format!("{last}.lock"), path)?;
        if wait_for_lock(&file).map_err(named)? {
            dir.lock = Some(file);
        } else {
            dir.lock_missed = true;
        }
    }
    Ok(dir)
}

/// Opens (making it) the lock file `name` in `parent`: not through a link, a
/// regular file, root's, mode 0600 (set through its descriptor).
fn open_lock_file(parent: &OwnedFd, name: &str, path: &str) -> io::Result<OwnedFd> {
    use rustix::fs::{FileType, Mode, OFlags, fchmod, fstat, openat};
    let shown = format!("{}/{name}", path.rsplit_once('/').map_or("", |(p, _)| p));
    let named = |e: rustix::io::Errno| io::Error::new(io::Error::from(e).kind(), format!("{shown}: {e}"));
    let fd = openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::from_raw_mode(PRIVATE_FILE),
    )
    .map_err(named)?;
    let st = fstat(&fd).map_err(named)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != 0 {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{shown}: not root's file")));
    }
    if st.st_mode & 0o7777 != PRIVATE_FILE {
        fchmod(&fd, Mode::from_raw_mode(PRIVATE_FILE)).map_err(named)?;
    }
    Ok(fd)
}

/// Takes `flock(LOCK_EX)` on `fd`, trying for [`LOCK_WAIT`]: whether it got it.
fn wait_for_lock(fd: &OwnedFd) -> Result<bool, rustix::io::Errno> {
    use rustix::fs::{FlockOperation, flock};
    let started = std::time::Instant::now();
    loop {
        match flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // Held past the wait (a prolog stuck elsewhere): go on without;
            // the record itself is still written whole.
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

fn plain_name(dir: &RunDir, name: &str) -> io::Result<()> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: bad name '{name}'", dir.path)));
    }
    Ok(())
}

/// The names in a [`RunDir`] (hidden ones left out).
///
/// # Errors
/// It cannot be read.
pub fn run_dir_names(dir: &RunDir) -> io::Result<Vec<String>> {
    let named =
        |e: rustix::io::Errno| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", dir.path));
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir.fd).map_err(named)? {
        let entry = entry.map_err(named)?;
        if let Ok(n) = entry.file_name().to_str() {
            if !n.starts_with('.') {
                names.push(n.to_owned());
            }
        }
    }
    Ok(names)
}

/// A root's regular file in a [`RunDir`], not through a link, at most `max_bytes`.
///
/// # Errors
/// Missing, a link, not a regular file, not root's, too large, unreadable.
pub fn run_dir_read(dir: &RunDir, name: &str, max_bytes: usize) -> io::Result<String> {
    use rustix::fs::{FileType, Mode, OFlags, fstat, openat};
    use std::io::Read;
    plain_name(dir, name)?;
    let named =
        |e: rustix::io::Errno| io::Error::new(io::Error::from(e).kind(), format!("{}/{name}: {e}", dir.path));
    let fd = openat(
        &dir.fd,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(named)?;
    let st = fstat(&fd).map_err(named)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}/{name}: not root's file", dir.path),
        ));
    }
    let mut text = String::new();
    fs::File::from(fd)
        .take(u64::try_from(max_bytes).unwrap_or(u64::MAX))
        .read_to_string(&mut text)
        .map_err(|e| io::Error::new(e.kind(), format!("{}/{name}: {e}", dir.path)))?;
    Ok(text)
}

/// Replaces `name` in a [`RunDir`] with `text` (mode 0644; 0600 in the job
/// records' directory, see [`RunDir`]): written to a new hidden file, its
/// mode set through its descriptor, then renamed over it, so a reader never
/// sees half.
///
/// # Errors
/// It cannot be written (the directory is full, read-only, ...).
pub fn run_dir_write(dir: &RunDir, name: &str, text: &str) -> io::Result<()> {
    use rustix::fs::{AtFlags, Mode, OFlags, openat, renameat, unlinkat};
    use std::io::Write;
    plain_name(dir, name)?;
    let tmp = format!(".{name}.{}", std::process::id());
    let named =
        |e: rustix::io::Errno| io::Error::new(io::Error::from(e).kind(), format!("{}/{name}: {e}", dir.path));
    let _ = unlinkat(&dir.fd, tmp.as_str(), AtFlags::empty());
    let fd = openat(
        &dir.fd,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(named)?;
    let written = rustix::fs::fchmod(&fd, Mode::from_raw_mode(dir.file_mode))
        .map_err(io::Error::from)
        .and_then(|()| fs::File::from(fd).write_all(text.as_bytes()));
    if let Err(e) = written {
        let _ = unlinkat(&dir.fd, tmp.as_str(), AtFlags::empty());
        return Err(io::Error::new(e.kind(), format!("{}/{name}: {e}", dir.path)));
    }
    renameat(&dir.fd, tmp.as_str(), &dir.fd, name).map_err(|e| {
        let _ = unlinkat(&dir.fd, tmp.as_str(), AtFlags::empty());
        named(e)
    })
}

/// Removes `name` from a [`RunDir`]; one that is not there is no error.
///
/// # Errors
/// It cannot be removed.
pub fn run_dir_remove(dir: &RunDir, name: &str) -> io::Result<()> {
    plain_name(dir, name)?;
    match rustix::fs::unlinkat(&dir.fd, name, rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(io::Error::new(io::Error::from(e).kind(), format!("{}/{name}: {e}", dir.path))),
    }
}
