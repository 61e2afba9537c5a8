//! Quoting outside input in messages and on terminals: short, one line,
//! printable, and as a shell word.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as it is: the C0 controls (ESC
/// starts the terminal's escape sequences: OSC 52 writes the clipboard), DEL,
/// the C1 controls (U+009B is a CSI of its own on some terminals), and
/// Unicode's bidirectional controls, which reorder what is shown (U+202A-202E
/// embeddings and overrides, U+2066-2069 isolates, U+200E/200F marks, U+061C
/// the Arabic letter mark).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// Pushes `c`, escaped visibly when [`is_unsafe`]: `\n`, `\t`, `\u{1b}`, `\u{202e}`.
fn push_escaped(out: &mut String, c: char) {
    if is_unsafe(c) {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// `s` with every [`is_unsafe`] character escaped visibly (`\u{1b}`,
/// `\u{202e}`, `\n`): what a line of text from a job (its log, name, step
/// id, paths) becomes before it is written to a terminal. Borrowed when
/// there is nothing to escape.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

/// `s` cut to at most `max` characters (with `...` when cut) and with
/// [`is_unsafe`] characters escaped, so a hostile or huge value cannot flood
/// a log or a terminal with one message.
pub fn clip(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == max {
            out.push_str("...");
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// `s` as one shell word that the shell reads back as `s`: as it is when it
/// holds only characters no shell treats specially (letters, digits,
/// `._+-/@%:=,`, not starting with `-`, `=` or `~`), else in single quotes,
/// each `'` written `'\''`. Characters [`is_unsafe`] are replaced with `_`
/// first: a word meant to be read on a terminal and pasted must not hold them.
pub fn shell_word(s: &str) -> String {
    let s: String = s.chars().map(|c| if is_unsafe(c) { '_' } else { c }).collect();
    let plain = !s.is_empty()
        && !s.starts_with(['-', '=', '~'])
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._+-/@%:=,".contains(c));
    if plain { s } else { format!("'{}'", s.replace('\'', "'\\''")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_and_escapes() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdef", 3), "abc...");
        assert_eq!(clip("a\nb\x1b", 10), "a\\nb\\u{1b}");
        assert_eq!(clip("a\u{202e}b", 10), "a\\u{202e}b");
        assert_eq!(clip(&"x".repeat(1 << 20), 80).len(), 83);
    }

    #[test]
    fn printable_escapes_controls_and_bidi_only() {
        assert!(matches!(printable("node1 (step 42.0) ünïcode"), Cow::Borrowed(_)));
        // OSC 52: the clipboard write an admin's terminal would obey.
        assert_eq!(printable("\x1b]52;c;ZWNobyBwd25lZA==\x07"), "\\u{1b}]52;c;ZWNobyBwd25lZA==\\u{7}");
        assert_eq!(printable("a\tb\rc\u{7f}d\u{9b}e"), "a\\tb\\rc\\u{7f}d\\u{9b}e");
        for c in ['\u{202a}', '\u{202e}', '\u{2066}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{061c}'] {
            let s = format!("x{c}y");
            assert_eq!(printable(&s), format!("x\\u{{{:x}}}y", u32::from(c)), "{:x}", u32::from(c));
        }
        // Neighbours of the bidi controls are text.
        assert_eq!(printable("\u{2029}\u{2065}\u{200d}"), "\u{2029}\u{2065}\u{200d}");
    }

    #[test]
    fn shell_words_read_back_as_themselves() {
        assert_eq!(shell_word("train-v2.1"), "train-v2.1");
        assert_eq!(shell_word("my job"), "'my job'");
        assert_eq!(shell_word("x'; rm -rf ~; echo '"), "'x'\\''; rm -rf ~; echo '\\'''");
        assert_eq!(shell_word("$(reboot)"), "'$(reboot)'");
        assert_eq!(shell_word("-n"), "'-n'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a\nb\x1bc"), "a_b_c");
        // The shell reads each back as it was.
        for name in ["it's", "a b", "$HOME `id` \\ \"", "*", "~root", "x;y&z|w>v<u(t)s{r}q"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_word(name)))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            assert_eq!(out.ok().as_deref(), Some(name), "{name}");
        }
    }
}
