//! The one way the agent replaces a file that others read (the GPU table and
//! its XML, the state file, the metrics file): a temporary file of a unique
//! name in the same directory, renamed over the old one. A reader sees the old
//! file or the new one, never half of either, and two writers never share a
//! temporary file.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How [`write`] writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The file's mode (`0o644`); `None`: what the umask gives.
    pub mode: Option<u32>,
    /// fsync the file before the rename and the directory after it, so the
    /// new file survives a crash. Off for a file rewritten every pass that
    /// matters only while the agent runs (the metrics).
    pub durable: bool,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `bytes`. The directory must exist. On an error the
/// old file is as it was and no temporary file is left.
///
/// # Errors
/// The temporary file cannot be created, written, synced or renamed.
pub fn write(path: &Path, bytes: &[u8], options: Options) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        if let Some(mode) = options.mode {
            f.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        if options.durable {
            f.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        if options.durable {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("agent-atomic-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_the_file_with_its_mode_and_leaves_nothing_else() {
        let dir = tmpdir("replace");
        let p = dir.join("gpus.tsv");
        fs::write(&p, "old").unwrap();
        for durable in [true, false] {
            write(&p, b"new", Options { mode: Some(0o640), durable }).unwrap();
            assert_eq!(fs::read_to_string(&p).unwrap(), "new");
            assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
        }
        let names: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from("gpus.tsv")], "no temporary file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file() {
        let dir = tmpdir("fail");
        let p = dir.join("state.json");
        fs::write(&p, "old").unwrap();
        // A directory in the way of the rename.
        let blocked = dir.join("sub");
        fs::create_dir_all(blocked.join("x")).unwrap();
        assert!(write(&blocked, b"new", Options::default()).is_err());
        assert!(write(&dir.join("missing/state.json"), b"new", Options::default()).is_err());
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        let mut names: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        names.sort();
        assert_eq!(names, [std::ffi::OsString::from("state.json"), "sub".into()]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
