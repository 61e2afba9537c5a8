//! Slurm's configuration files as its parser (`parse_config.c`) reads them:
//! one tokenizer for every reader here (`slurm.conf`'s node lines for
//! `master_addr=`, its settings for lint, `cgroup.conf`'s `ConstrainDevices`):
//! lines continued by a final `\`, comments from `#` (`\#` a `#`),
//! `Key=Value` pairs with spaces allowed around `=`, values quoted or up to the
//! next space, `include FILE`; where slurm.conf is when nothing says
//! otherwise; and the paths a root process may be pointed at.

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

/// A line of a Slurm configuration file without its comment: from the first
/// `#` not written `\#` (which stands for `#`).
pub fn strip_comment(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        if c == '#' {
            if out.ends_with('\\') {
                out.pop();
            } else {
                break;
            }
        }
        out.push(c);
    }
    out
}

/// The `Key=Value` pairs of a line as Slurm's `keyvalue_pattern` reads them
/// (`Key [-*+/]?= Value`): key, whether an operator came before `=`, value.
/// `None` when anything else is on the line.
pub fn pairs(line: &str) -> Option<Vec<(&str, bool, &str)>> {
    let mut out = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let key_end =
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')).unwrap_or(rest.len());
        let key = rest.get(..key_end).filter(|k| !k.is_empty())?;
        let after_key = rest.get(key_end..).unwrap_or_default().trim_start();
        let (operator, after_op) = match after_key.strip_prefix(['-', '*', '+', '/']) {
            Some(r) => (true, r),
            None => (false, after_key),
        };
        let r = after_op.strip_prefix('=')?.trim_start();
        let (value, after) = match r.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (quoted.get(..end)?, quoted.get(end + 1..).unwrap_or_default())
            }
            None => {
                let end = r.find(char::is_whitespace).unwrap_or(r.len());
                (r.get(..end).filter(|v| !v.is_empty())?, r.get(end..).unwrap_or_default())
            }
        };
        if !(after.is_empty() || after.starts_with(char::is_whitespace)) {
            return None;
        }
        out.push((key, operator, value));
        rest = after.trim_start();
    }
    Some(out)
}

/// The logical lines of a configuration file: a line ending in `\` continued
/// by the next (as one line, the `\` and the line break dropped), each line's
/// comment removed ([`strip_comment`]).
pub fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut joined = String::new();
    for line in text.lines() {
        match line.strip_suffix('\\') {
            Some(head) => joined.push_str(head),
            None => {
                joined.push_str(line);
                out.push(strip_comment(&joined));
                joined.clear();
            }
        }
    }
    if !joined.is_empty() {
        out.push(strip_comment(&joined));
    }
    out
}

/// The file an `include FILE` line names (`include` in any case), as written.
pub fn include_target(line: &str) -> Option<&str> {
    let line = line.trim();
    let (key, rest) = line.split_once(char::is_whitespace)?;
    key.eq_ignore_ascii_case("include").then(|| rest.trim()).filter(|f| !f.is_empty())
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

    #[test]
    fn lines_read_as_slurm_reads_them() {
        let text = "NodeName=n[1-2] \\\n  NodeAddr=a,b # the nodes\nPartitionName=p Nodes=ALL\\#x\n# only a comment\ninclude /etc/slurm/more.conf\n";
        let lines = logical_lines(text);
        assert_eq!(lines[0], "NodeName=n[1-2]   NodeAddr=a,b ");
        assert_eq!(lines[1], "PartitionName=p Nodes=ALL#x");
        assert_eq!(lines[2], "");
        assert_eq!(include_target(&lines[3]), Some("/etc/slurm/more.conf"));
        assert_eq!(include_target("Include"), None);
        assert_eq!(pairs(&lines[0]), Some(vec![("NodeName", false, "n[1-2]"), ("NodeAddr", false, "a,b")]));
        assert_eq!(pairs("Key = \"a b\"  Other+=1"), Some(vec![("Key", false, "a b"), ("Other", true, "1")]));
        assert_eq!(pairs("not pairs"), None);
    }
}
