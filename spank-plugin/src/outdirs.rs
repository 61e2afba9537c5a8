//! What the directory of a job's output file is, seen from the submitting
//! user's side: for `gpu_core::lint`'s trap 1, in `spank-gpu lint` and in
//! the plugin at submit time (sbatch runs as the user). Safe Rust, std only.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use gpu_core::lint::DirState;

/// An I/O error in a few words.
pub fn io_words(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

/// The user's ids, from `/proc/self/status`.
pub struct Ids {
    uid: u32,
    gids: Vec<u32>,
}

pub fn ids() -> Ids {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.split_whitespace().filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default()
    };
    let uid = field("Uid:").get(1).copied().unwrap_or(u32::MAX);
    let mut gids = field("Groups:");
    gids.extend(field("Gid:").get(1));
    Ids { uid, gids }
}

/// Whether the user can create entries in a directory (write and search).
pub fn writable(m: &fs::Metadata, ids: &Ids) -> bool {
    if ids.uid == 0 {
        return true;
    }
    let mode = m.mode();
    let bits = if m.uid() == ids.uid {
        mode >> 6
    } else if ids.gids.contains(&m.gid()) {
        mode >> 3
    } else {
        mode
    };
    bits & 0o3 == 0o3
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
pub fn probe(dir: &str, ids: &Ids) -> DirState {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => return DirState::Dir { writable: writable(&m, ids) },
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
                return DirState::Missing { ancestor: a.display().to_string(), writable: writable(&m, ids) };
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
        let ids = ids();
        let b = base.display().to_string();
        assert_eq!(probe(&format!("{b}/logs"), &ids), DirState::Dir { writable: true });
        assert_eq!(probe(&format!("{b}/afile"), &ids), DirState::NotDir { at: format!("{b}/afile") });
        assert_eq!(probe(&format!("{b}/afile/x/y"), &ids), DirState::NotDir { at: format!("{b}/afile") });
        assert_eq!(
            probe(&format!("{b}/new/deeper"), &ids),
            DirState::Missing { ancestor: b.clone(), writable: true }
        );
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn user_names_from_the_environment_else_passwd() {
        let mut env = std::collections::BTreeMap::new();
        assert_eq!(user_name(&env, &Ids { uid: 0, gids: vec![] }), "root");
        env.insert("LOGNAME".to_owned(), "ana".to_owned());
        assert_eq!(user_name(&env, &Ids { uid: 0, gids: vec![] }), "ana");
        env.insert("USER".to_owned(), "bo".to_owned());
        assert_eq!(user_name(&env, &Ids { uid: 0, gids: vec![] }), "bo");
    }

    #[test]
    fn mode_bits_decide_writability_for_others() {
        let ids = Ids { uid: 4242, gids: vec![4242] };
        let m = fs::metadata("/").unwrap();
        // / is root's, mode 0755: not writable for uid 4242.
        assert!(!writable(&m, &ids));
        assert!(writable(&m, &Ids { uid: 0, gids: vec![] }));
    }
}
