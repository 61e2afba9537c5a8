//! Times as the agent writes them (records, `status`, the names of files
//! kept aside): UTC to the second, through `jiff`.

/// `2026-11-30T18:04:22Z` for seconds since the epoch; a count of seconds
/// past jiff's range (year 9999, only from a damaged state file) is written
/// as it is, `@SECS`.
pub fn utc(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| format!("@{secs}"), |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// Seconds since the epoch now.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_795_996_800 + 3_661), "2026-11-30T01:01:01Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(u64::MAX), format!("@{}", u64::MAX));
    }
}
