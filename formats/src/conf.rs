//! Slurm's configuration files: where slurm.conf is when nothing says
//! otherwise, and the paths a root process may be pointed at.

/// Where Slurm's commands and daemons read slurm.conf when neither
/// `$SLURM_CONF` nor a configless setup says otherwise (and where
/// `master_addr=hostname|addr` reads the node lines when neither
/// `slurm_conf=` nor slurmd says otherwise).
pub const DEFAULT_SLURM_CONF: &str = "/etc/slurm/slurm.conf";

/// An absolute path without `.` or `..` components or control characters.
pub fn clean_path(value: &str) -> Result<String, String> {
    let clean = value.starts_with('/')
        && !value.split('/').any(|c| c == ".." || c == ".")
        && !value.contains(char::is_control);
    if clean {
        Ok(value.to_owned())
    } else {
        Err("must be an absolute path without . or .. components".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_are_absolute_without_dots() {
        assert_eq!(clean_path("/etc/slurm/slurm.conf"), Ok("/etc/slurm/slurm.conf".to_owned()));
        for bad in ["etc/slurm.conf", "/etc/../root", "/etc/./x", "/a\nb", ""] {
            assert!(clean_path(&bad.replace("\\n", "\n")).is_err(), "{bad}");
        }
    }
}
