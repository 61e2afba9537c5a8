//! The few things the plugin asks of the node itself (not of Slurm), in safe
//! Rust: whether a port can be bound, and who holds it.

use std::fs;
use std::net::TcpListener;

use gpu_core::ports;

/// Upper bound on the `/proc` entries looked at to name a port's holder.
const MAX_PROC_SCAN: usize = 200_000;

/// Binds (and closes at once) a listener on `port` on all IPv4 addresses.
///
/// # Errors
/// The bind failed; the text has the OS error and, when this user can see it,
/// the process that listens on the port.
pub fn probe_port(port: u16) -> Result<(), String> {
    match TcpListener::bind(("0.0.0.0", port)) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(e) => Err(match holder(port) {
            Some(who) => format!("{e}; held by {who}"),
            None => format!("{e}; holder not visible to this user"),
        }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_names_its_holder() {
        let listener = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let err = probe_port(port).unwrap_err();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(listener);
        assert_eq!(probe_port(port), Ok(()));
    }
}
