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

/// A physical line without its comment: from the first `#` that follows an
/// even number of `\\` (`\\#` is a `#`, `\\\\#` a `\\` and a comment).
fn cut_comment(line: &str) -> &str {
    let mut backslashes = 0;
    for (i, c) in line.char_indices() {
        match c {
            '#' if backslashes % 2 == 0 => return &line[..i],
            '\\' => backslashes += 1,
            _ => backslashes = 0,
        }
    }
    line
}

/// A physical line (its comment already cut) that Slurm continues with the
/// next: one ending, trailing spaces aside, in an odd number of `\\`; the
/// line without the last of them (the others are escapes).
fn continued(line: &str) -> Option<&str> {
    let trimmed = line.trim_end();
    let backslashes = trimmed.len() - trimmed.trim_end_matches('\\').len();
    (backslashes % 2 == 1).then(|| &trimmed[..trimmed.len() - 1])
}

/// Escapes resolved: each `\\` dropped and the character after it kept.
fn unescape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
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

/// The logical lines of a configuration file, as `_get_next_line` makes
/// them: each physical line's comment cut, a line ending in an odd number of
/// `\\` joined with the next (without that `\\`), then escapes resolved.
pub fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut joined = String::new();
    for line in text.lines() {
        let line = cut_comment(line);
        match continued(line) {
            Some(head) => joined.push_str(head),
            None => {
                joined.push_str(line);
                out.push(unescape(&joined));
                joined.clear();
            }
        }
    }
    if !joined.is_empty() {
        out.push(unescape(&joined));
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
        // An even run of backslashes before # is escapes, and the # a comment; a
        // backslash inside a comment continues nothing; \\\\ is one backslash.
        assert_eq!(
            logical_lines("A=x\\\\#c\nB=1 # note \\\nC=2\nD=a\\\\b \\ \nE=3"),
            ["A=x\\", "B=1 ", "C=2", "D=a\\b E=3"]
        );
    }
}
