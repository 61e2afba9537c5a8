//! Reading a file only a trusted owner can have written, for the plugin
//! (what it reads as root or trusts for every user's task) and the agent (the
//! plugstack and the plugin it checks): the one piece of file I/O both
//! binaries share, so the rules are written once.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Reads `path`, at most `max_bytes`: opened without following a link (and
/// without blocking on a FIFO), a regular file, and it and its directory
/// owned by one of `owners` and writable by no one else.
///
/// # Errors
/// Any of those conditions fails; the error says which, with the path
/// (`InvalidInput` for a link or a file that is not regular,
/// `PermissionDenied` for an owner or mode, `InvalidData` for the size).
pub fn read_trusted(path: &Path, max_bytes: usize, owners: &[u32]) -> io::Result<Vec<u8>> {
    let shown = path.display();
    let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{shown}: {e}"));
    let who = owners
        .iter()
        .map(|u| if *u == 0 { "root".to_owned() } else { format!("uid {u}") })
        .collect::<Vec<_>>()
        .join(" or ");
    let trusted = |m: &fs::Metadata| owners.contains(&m.uid()) && m.mode() & 0o022 == 0;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dm =
        fs::symlink_metadata(dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if !dm.is_dir() || !trusted(&dm) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: not a directory owned by {who} and writable only by {who}", dir.display()),
        ));
    }
    // O_NONBLOCK: opening a FIFO or a device someone left in the directory
    // must not block; its type is refused just below.
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{shown} is a symbolic link (not followed: name the file itself)"),
                )
            } else {
                with_path(e)
            }
        })?;
    let m = file.metadata().map_err(with_path)?;
    if !m.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{shown}: not a regular file")));
    }
    if !trusted(&m) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{shown}: not owned by {who}, or writable by others (owner uid {}, mode {:o})",
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    if m.len() > max_bytes as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{shown}: {} bytes, over the {max_bytes}-byte limit", m.len()),
        ));
    }
    let mut bytes = Vec::new();
    file.by_ref().take(max_bytes as u64 + 1).read_to_end(&mut bytes).map_err(with_path)?;
    Ok(bytes)
}
