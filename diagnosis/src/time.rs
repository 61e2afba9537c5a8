//! Slurm's times (`YYYY-MM-DDTHH:MM:SS`, which Slurm's commands print in the
//! local time of the host they run on), through `jiff`.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;

/// How Slurm's commands print a time.
const SLURM_TIME: &str = "%Y-%m-%dT%H:%M:%S";

/// Seconds since 1970 of a Slurm time `YYYY-MM-DDTHH:MM:SS` taken as UTC
/// (Slurm prints local time; only differences are used).
pub fn parse_time(s: &str) -> Option<i64> {
    let at = DateTime::strptime(SLURM_TIME, s.trim()).ok()?;
    Some(at.to_zoned(TimeZone::UTC).ok()?.timestamp().as_second())
}

/// A time as Slurm writes it, `YYYY-MM-DDTHH:MM:SS`, of `secs` since 1970
/// taken as the same clock [`parse_time`] reads (the inverse of it); a time
/// past year 9999 as `@SECS`.
pub fn format_time(secs: i64) -> String {
    Timestamp::from_second(secs)
        .map_or_else(|_| format!("@{secs}"), |t| t.to_zoned(TimeZone::UTC).strftime(SLURM_TIME).to_string())
}

/// `secs` since 1970 in this host's local time (`$TZ`, else
/// `/etc/localtime`), as Slurm's commands print times here; `None` when the
/// zone cannot be read or the time is out of range.
pub fn local_time(secs: i64) -> Option<String> {
    let zone = TimeZone::try_system().ok()?;
    Some(Timestamp::from_second(secs).ok()?.to_zoned(zone).strftime(SLURM_TIME).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_time("2000-03-01T00:00:00"), Some(951_868_800));
        assert_eq!(parse_time("2026-11-30T18:59:25"), Some(1_796_065_165));
        assert_eq!(parse_time(" 2026-11-30T18:59:25\n"), Some(1_796_065_165));
        for bad in ["Unknown", "99999999999999-01-01T00:00:00", "2026-13-01T00:00:00", "2026-11-30", ""] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        for t in [0, 951_868_800, 1_796_065_165, 4_102_444_799, 68_169_600] {
            assert_eq!(parse_time(&format_time(t)), Some(t), "{t}");
        }
        assert_eq!(format_time(1_796_065_165), "2026-11-30T18:59:25");
        assert_eq!(format_time(i64::MAX), format!("@{}", i64::MAX));
    }

    #[test]
    fn local_times_follow_tz() {
        // The zone comes from the process's TZ; UTC is in every zone database
        // jiff reads, and where none can be read the answer is None, not a guess.
        if let Some(t) = local_time(1_796_065_165) {
            assert_eq!(parse_time(&t).map(|s| (s - 1_796_065_165) % 900), Some(0), "{t}");
        }
    }
}
