//! What the directory of a job's output file is, seen from the submitting
//! user's side: for `batch_lint`'s trap 1, in `spank-gpu lint` and in
//! the plugin at submit time (sbatch runs as the user). Safe Rust, std only.

use std::fs;
use std::path::Path;

use crate::DirState;

/// An I/O error in a few words.
pub fn io_words(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

/// The user's ids, from `/proc/self/status`.
#[derive(Debug)]
pub struct Ids {
    uid: u32,
}

pub fn ids() -> Ids {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .unwrap_or(u32::MAX);
    Ids { uid }
}

/// Whether this process can create entries in a directory (write and
/// search), as the kernel judges it for its effective ids: `faccessat(2)`
/// with `AT_EACCESS`, so ACLs, a read-only mount and capabilities count, not
/// only the mode bits. Spank-gpu lint and sbatch run as the user.
pub fn writable(dir: &Path) -> bool {
    use rustix::fs::{Access, AtFlags, CWD, accessat};
    accessat(CWD, dir, Access::WRITE_OK | Access::EXEC_OK, AtFlags::EACCESS).is_ok()
}

/// The user's name for `%u`: `$USER`, `$LOGNAME`, else `/etc/passwd`'s entry
/// for the user's uid; empty when none says.
pub fn user_name(env: &std::collections::BTreeMap<String, String>, ids: &Ids) -> String {
    if let Some(u) = env.get("USER").or_else(|| env.get("LOGNAME")).filter(|u| !u.is_empty()) {
        return u.clone();
    }
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2].parse::<u32>().ok() == Some(ids.uid)).then(|| f[0].to_owned())
        })
        .unwrap_or_default()
}

/// What a directory is, from here.
pub fn probe(dir: &str) -> DirState {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => return DirState::Dir { writable: writable(Path::new(dir)) },
        Ok(_) => return DirState::NotDir { at: dir.to_owned() },
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return DirState::Unknown(format!("cannot look at it ({})", io_words(&e)));
        }
        Err(_) => {}
    }
    let mut p = Path::new(dir).parent();
    while let Some(a) = p {
        match fs::metadata(a) {
            Ok(m) if m.is_dir() => {
                return DirState::Missing { ancestor: a.display().to_string(), writable: writable(a) };
            }
            Ok(_) => return DirState::NotDir { at: a.display().to_string() },
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return DirState::Unknown(format!("cannot look at {} ({})", a.display(), io_words(&e)));
            }
            Err(_) => p = a.parent(),
        }
    }
    DirState::Unknown("no part of the path exists".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_files_and_missing_parts() {
        let base = std::env::temp_dir().join(format!("spank-gpu-outdirs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(base.join("logs")).unwrap();
        fs::write(base.join("afile"), "x").unwrap();
        let b = base.display().to_string();
        assert_eq!(probe(&format!("{b}/logs")), DirState::Dir { writable: true });
        assert_eq!(probe(&format!("{b}/afile")), DirState::NotDir { at: format!("{b}/afile") });
        assert_eq!(probe(&format!("{b}/afile/x/y")), DirState::NotDir { at: format!("{b}/afile") });
        assert_eq!(
            probe(&format!("{b}/new/deeper")),
            DirState::Missing { ancestor: b.clone(), writable: true }
        );
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn user_names_from_the_environment_else_passwd() {
        let mut env = std::collections::BTreeMap::new();
        assert_eq!(user_name(&env, &Ids { uid: 0 }), "root");
        env.insert("LOGNAME".to_owned(), "ana".to_owned());
        assert_eq!(user_name(&env, &Ids { uid: 0 }), "ana");
        env.insert("USER".to_owned(), "bo".to_owned());
        assert_eq!(user_name(&env, &Ids { uid: 0 }), "bo");
    }

    #[test]
    fn access_is_the_kernels_answer() {
        // / is root's, mode 0755: writable only where this test runs as root.
        let root = ids().uid == 0;
        assert_eq!(writable(Path::new("/")), root);
        assert!(writable(&std::env::temp_dir()));
        assert!(!writable(Path::new("/no/such/dir")));
    }
}
