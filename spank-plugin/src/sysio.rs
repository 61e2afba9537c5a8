//! The few things the plugin asks of the node itself (not of Slurm), in safe
//! Rust: whether a port can be bound, and who holds it.

use std::fs;
use std::io;
use std::net::TcpListener;

use std::path::Path;

use gpu_core::ports;

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
    let bytes = gpu_core::trusted::read_trusted(Path::new(path), max_bytes, &[0])?;
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

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
    fn a_held_port_names_its_holder() {
        let listener = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let err = probe_port(port).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        let err = err.to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(listener);
        assert!(probe_port(port).is_ok());
    }
}
