//! Slurm's units in text: durations (`[D-]HH:MM:SS`), memory sizes (`100M`)
//! and times (`YYYY-MM-DDTHH:MM:SS`), read and written as Slurm does.

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

/// Seconds since 1970 of a Slurm time `YYYY-MM-DDTHH:MM:SS` taken as UTC
/// (Slurm prints local time; only differences are used).
pub fn parse_time(s: &str) -> Option<i64> {
    let (date, time) = s.trim().split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i64> = time.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else { return None };
    let in_range = (0..=9999).contains(y)
        && (1..=12).contains(m)
        && (1..=31).contains(day)
        && (0..=23).contains(hh)
        && (0..=59).contains(mm)
        && (0..=60).contains(ss);
    if !in_range {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
}

/// A time as Slurm writes it, `YYYY-MM-DDTHH:MM:SS`, of `secs` since 1970
/// taken as the same clock [`parse_time`] reads (the inverse of it).
pub fn format_time(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations() {
        assert_eq!(parse_time("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_time("2000-03-01T00:00:00"), Some(951_868_800));
        assert_eq!(parse_time("2026-11-30T18:59:25"), Some(1_796_065_165));
        assert_eq!(parse_time("Unknown"), None);
        assert_eq!(parse_time("99999999999999-01-01T00:00:00"), None);
        for t in [0, 951_868_800, 1_796_065_165, 4_102_444_799, 68_169_600] {
            assert_eq!(parse_time(&format_time(t)), Some(t), "{t}");
        }
        assert_eq!(format_time(1_796_065_165), "2026-11-30T18:59:25");
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
