//! Quoting outside input in messages: short, one line, printable.

/// `s` cut to at most `max` characters (with `...` when cut) and with control
/// characters escaped, so a hostile or huge value cannot flood a log or a
/// terminal with one message.
pub fn clip(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == max {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_and_escapes() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdef", 3), "abc...");
        assert_eq!(clip("a\nb\x1b", 10), "a\\nb\\u{1b}");
        assert_eq!(clip(&"x".repeat(1 << 20), 80).len(), 83);
    }
}
