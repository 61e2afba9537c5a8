//! Slurm's units in text: durations (`[D-]HH:MM:SS`) and memory sizes
//! (`100M`), read and written as Slurm does.

/// Seconds in a Slurm duration: `[D-]HH:MM:SS`, `MM:SS`, `MM`, `HH:MM:SS.mmm`;
/// `None` for `UNLIMITED`, `INVALID`, `Partition_Limit` and anything else.
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, s),
    };
    let rest = rest.split('.').next()?;
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    // Saturating: a field of 20 digits must not overflow.
    let hms = |h: u64, m: u64, s: u64| {
        h.saturating_mul(3600).saturating_add(m.saturating_mul(60)).saturating_add(s)
    };
    let secs = match (parts.as_slice(), days > 0) {
        ([m], false) => hms(0, *m, 0),
        ([h], true) => hms(*h, 0, 0),
        ([m, s], false) => hms(0, *m, *s),
        ([h, m], true) => hms(*h, *m, 0),
        ([h, m, s], _) => hms(*h, *m, *s),
        _ => return None,
    };
    Some(days.saturating_mul(86400).saturating_add(secs))
}

/// A duration as Slurm writes it: `[D-]HH:MM:SS`.
pub fn format_duration(secs: u64) -> String {
    let (d, r) = (secs / 86400, secs % 86400);
    let hms = format!("{:02}:{:02}:{:02}", r / 3600, r % 3600 / 60, r % 60);
    if d > 0 { format!("{d}-{hms}") } else { hms }
}

/// Bytes in a Slurm memory size (`100M`, `1.5G`, `2048K`, `4000` = MiB,
/// `100Mn`/`100Mc` of older sacct); `None` when empty or unreadable.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().trim_end_matches(['n', 'c']);
    if s.is_empty() {
        return None;
    }
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, "M"),
    };
    let mult: f64 = match unit {
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v: f64 = num.parse().ok()?;
    if !(v >= 0.0 && v.is_finite()) {
        return None;
    }
    // A non-negative, finite value: the cast saturates at u64::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some((v * mult) as u64)
}

/// A size in words: `300 MiB`.
pub fn format_size(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes >= 10 * 1024 * MIB {
        format!("{} GiB", bytes / (1024 * MIB))
    } else {
        format!("{} MiB", bytes.div_ceil(MIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("99999999999999999-99999999999:0:0"), Some(u64::MAX));
        assert_eq!(parse_duration("365-00:00:00"), Some(365 * 86400));
        assert_eq!(parse_duration("00:00:07"), Some(7));
        assert_eq!(parse_duration("10"), Some(600));
        assert_eq!(parse_duration("1-02"), Some(86400 + 7200));
        assert_eq!(parse_duration("UNLIMITED"), None);
        assert_eq!(format_duration(90061), "1-01:01:01");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20M"), Some(20 * 1024 * 1024));
        assert_eq!(parse_size("621060K"), Some(621_060 * 1024));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("4000"), Some(4000 * 1024 * 1024));
        assert_eq!(parse_size("100Mc"), Some(100 * 1024 * 1024));
        assert_eq!(format_size(300 * 1024 * 1024), "300 MiB");
    }
}
