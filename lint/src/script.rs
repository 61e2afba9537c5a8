//! A batch script read as sbatch reads it (`_get_script_buffer` and
//! `_opt_batch_script` in `src/sbatch/`, `get_argument` in `src/sbatch/opt.c`):
//! the checks sbatch makes before anything else, the `#SBATCH` lines up to the
//! first command split into words, the `#SBATCH` lines sbatch never reads, and
//! the shell's view of the whole script ([`super::shell`]).

use std::fmt;

use super::shell::{self, Shell};

/// The largest script read. Slurm's controller takes 4 MiB unless
/// `SchedulerParameters=max_script_size=` says more.
pub const MAX_BYTES: usize = 16 << 20;

/// Slurm's default `max_script_size` (`_test_job_desc_fields`, src/slurmctld/job_mgr.c).
pub const SLURM_MAX_SCRIPT: usize = 4 << 20;

/// Why a file cannot be read as a batch script at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// Zero bytes.
    Empty,
    /// Only whitespace.
    Whitespace,
    /// A NUL byte: a binary file (sbatch: "The Slurm controller does not allow
    /// scripts that contain a NULL character").
    Binary {
        /// The offset of the first NUL.
        offset: usize,
    },
    /// Larger than [`MAX_BYTES`].
    TooLarge {
        /// Its size.
        bytes: usize,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Empty => f.write_str("the file is empty (sbatch: \"Batch script is empty!\")"),
            ReadError::Whitespace => f.write_str(
                "the file holds only whitespace (sbatch: \"Batch script contains only whitespace!\")",
            ),
            ReadError::Binary { offset } => write!(
                f,
                "not a script: a NUL byte at offset {offset} (a binary file? sbatch refuses scripts with NUL characters)"
            ),
            ReadError::TooLarge { bytes } => write!(
                f,
                "{bytes} bytes is more than the {} MiB lint reads (Slurm refuses scripts over {} MiB unless \
                 SchedulerParameters=max_script_size= allows more)",
                MAX_BYTES >> 20,
                SLURM_MAX_SCRIPT >> 20
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// One `#SBATCH` line sbatch reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    /// Its line (1-based).
    pub line: usize,
    /// Its words as sbatch splits them (quotes and escapes removed, `#` comments cut).
    pub words: Vec<String>,
    /// The heterogeneous job component it belongs to (`#SBATCH hetjob` separates them).
    pub component: usize,
}

/// A `#SBATCH` line sbatch does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    /// Its line.
    pub line: usize,
    /// The line, as written (clipped).
    pub text: String,
    /// Why sbatch skips it.
    pub why: IgnoredWhy,
}

/// Why sbatch skips a `#SBATCH` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IgnoredWhy {
    /// It comes after the first command (at this line).
    AfterCommand(usize),
    /// It does not start in the first column.
    Indented,
}

/// A batch script as sbatch and the shell read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Script {
    /// The text (invalid UTF-8 replaced).
    pub text: String,
    /// Its size in bytes.
    pub bytes: usize,
    /// Its number of lines.
    pub lines: usize,
    /// Whether the first line starts with `#!` (sbatch refuses it otherwise).
    pub shebang: bool,
    /// The first line with a DOS line break (`\r\n`; sbatch refuses it).
    pub dos_line: Option<usize>,
    /// The `#SBATCH` lines sbatch reads.
    pub directives: Vec<Directive>,
    /// `#SBATCH` lines sbatch refuses outright (a fatal error of `get_argument`).
    pub bad_directives: Vec<(usize, String)>,
    /// `#SBATCH` lines sbatch skips.
    pub ignored: Vec<Ignored>,
    /// The first command's line (where sbatch stops reading directives).
    pub first_command: Option<usize>,
    /// The shell's view.
    pub shell: Shell,
}

/// Splits the text after `#SBATCH` into words as `get_argument` does:
/// whitespace separates, quotes group, a backslash escapes, an unquoted `#`
/// starts a comment. `Err` is sbatch's fatal error for the line.
pub fn directive_words(body: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        if first == ':' {
            return Err("Unexpected `:`".to_owned());
        }
        let mut word = String::new();
        let mut any = false;
        let mut quote: Option<char> = None;
        let mut escape = false;
        while let Some(&c) = chars.peek() {
            if quote.is_none() && c.is_whitespace() && !escape {
                break;
            }
            chars.next();
            if escape {
                escape = false;
            } else if c == '\\' {
                escape = true;
                continue;
            } else if let Some(q) = quote {
                if c == q {
                    quote = None;
                    continue;
                }
            } else if c == '"' || c == '\'' {
                quote = Some(c);
                any = true;
                continue;
            } else if c == '#' {
                // The rest of the line is a comment.
                if any || !word.is_empty() {
                    words.push(word);
                }
                return Ok(words);
            }
            word.push(c);
            any = true;
        }
        if let Some(q) = quote {
            return Err(format!("Unmatched `{q}`"));
        }
        if !any && word.is_empty() {
            break;
        }
        words.push(word);
    }
    Ok(words)
}

/// Whether a line is a command for sbatch: its first non-space character is not `#`.
fn is_command(line: &str) -> bool {
    line.chars().find(|c| !c.is_whitespace()).is_some_and(|c| c != '#')
}

/// `#SBATCH` or the old `#SLURM`, in the first column: the text after it.
fn magic(line: &str) -> Option<&str> {
    line.strip_prefix("#SBATCH").or_else(|| line.strip_prefix("#SLURM"))
}

/// Reads a script.
///
/// # Errors
/// Empty, only whitespace, a NUL byte, or too large.
pub fn read(bytes: &[u8]) -> Result<Script, ReadError> {
    if bytes.len() > MAX_BYTES {
        return Err(ReadError::TooLarge { bytes: bytes.len() });
    }
    if bytes.is_empty() {
        return Err(ReadError::Empty);
    }
    if let Some(offset) = bytes.iter().position(|b| *b == 0) {
        return Err(ReadError::Binary { offset });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ReadError::Whitespace);
    }
    let text = String::from_utf8_lossy(bytes).into_owned();
    let shell = shell::read(&text);
    let mut s = Script {
        bytes: bytes.len(),
        lines: text.lines().count(),
        shebang: bytes.starts_with(b"#!"),
        dos_line: None,
        directives: Vec::new(),
        bad_directives: Vec::new(),
        ignored: Vec::new(),
        first_command: None,
        shell,
        text: String::new(),
    };
    let mut component = 0;
    for (n, raw) in text.split('\n').enumerate() {
        let line = n + 1;
        if raw.ends_with('\r') && s.dos_line.is_none() {
            s.dos_line = Some(line);
        }
        let in_heredoc = s.shell.heredocs.iter().any(|(a, b)| (*a..=*b).contains(&line));
        if let Some(first) = s.first_command {
            if magic(raw).is_some() && !in_heredoc {
                s.ignored.push(Ignored {
                    line,
                    text: slurm_formats::text::clip(raw.trim_end(), 120),
                    why: IgnoredWhy::AfterCommand(first),
                });
            }
            continue;
        }
        let Some(body) = magic(raw) else {
            if is_command(raw) {
                s.first_command = Some(line);
            } else if magic(raw.trim_start()).is_some() {
                s.ignored.push(Ignored {
                    line,
                    text: slurm_formats::text::clip(raw.trim(), 120),
                    why: IgnoredWhy::Indented,
                });
            }
            continue;
        };
        let trimmed = body.trim_start();
        let sep = |w: &str| {
            trimmed.get(..w.len()).is_some_and(|head| head.eq_ignore_ascii_case(w))
                && trimmed[w.len()..].chars().next().is_none_or(char::is_whitespace)
        };
        let body = match ["hetjob", "packjob"].into_iter().find(|w| sep(w)) {
            Some(w) => {
                component += 1;
                &trimmed[w.len()..]
            }
            None => body,
        };
        match directive_words(body.trim_end_matches('\r')) {
            Ok(words) if words.is_empty() => {}
            Ok(words) => s.directives.push(Directive { line, words, component }),
            Err(e) => s.bad_directives.push((line, e)),
        }
    }
    s.text = text;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_as_get_argument_splits_them() {
        assert_eq!(
            directive_words(" --job-name=\"a b\" -N 2 # comment").unwrap(),
            vec!["--job-name=a b", "-N", "2"]
        );
        assert_eq!(directive_words(" --output=a\\ b").unwrap(), vec!["--output=a b"]);
        assert_eq!(directive_words(" --x='unterminated").unwrap_err(), "Unmatched `'`");
        assert_eq!(directive_words(" : x").unwrap_err(), "Unexpected `:`");
        assert_eq!(directive_words(" --a=#b").unwrap(), vec!["--a="]);
        assert_eq!(directive_words("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn directives_stop_at_the_first_command() {
        let s = read(b"#!/bin/bash\n#SBATCH -N 2\n\n  # a comment\n #SBATCH --indented\n#SBATCH --time=1\nset -e\n#SBATCH --mem=0\n")
            .unwrap();
        assert_eq!(s.directives.len(), 2);
        assert_eq!(s.directives[1].words, vec!["--time=1"]);
        assert_eq!(s.first_command, Some(7));
        assert_eq!(s.ignored.len(), 2);
        assert_eq!(s.ignored[0].why, IgnoredWhy::Indented);
        assert_eq!(
            s.ignored[1],
            Ignored { line: 8, text: "#SBATCH --mem=0".into(), why: IgnoredWhy::AfterCommand(7) }
        );
        assert!(s.shebang);
    }

    #[test]
    fn directives_inside_a_heredoc_are_not_late() {
        let s = read(b"#!/bin/bash\ncat > next.sh <<EOF\n#!/bin/bash\n#SBATCH -N1\nEOF\nsbatch next.sh\n")
            .unwrap();
        assert!(s.ignored.is_empty(), "{:?}", s.ignored);
    }

    #[test]
    fn multibyte_text_after_sbatch_is_read_not_cut() {
        // Found by fuzz/lint_script: `#SBATCH` then a 2-byte character across byte 6.
        let s = read(b"#!/bin/bash\n#SBATCH\xe5\xd2\xd2\x98pus-per-task=1\nsrun x\n").unwrap();
        assert_eq!(s.directives.len(), 1);
    }

    #[test]
    fn hetjob_components() {
        let s = read(b"#!/bin/sh\n#SBATCH -N1\n#SBATCH hetjob\n#SBATCH -N2\n#SBATCH packjob -N3\n").unwrap();
        assert_eq!(s.directives.iter().map(|d| d.component).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(s.directives[2].words, vec!["-N3"]);
    }

    #[test]
    fn what_sbatch_refuses_before_reading() {
        assert_eq!(read(b""), Err(ReadError::Empty));
        assert_eq!(read(b" \n\t\n"), Err(ReadError::Whitespace));
        assert_eq!(read(b"#!/bin/sh\n\x00\x01"), Err(ReadError::Binary { offset: 10 }));
        let s = read(b"echo hi\r\n").unwrap();
        assert!(!s.shebang);
        assert_eq!(s.dos_line, Some(1));
        assert!(read(&vec![b'#'; MAX_BYTES + 1]).is_err());
    }
}
