//! One line of kernel-log text: its prefix (a `/dev/kmsg` record, a syslog or
//! journal header, a bracketed timestamp, a caller id) and its `NVRM: Xid` body,
//! in the forms listed in the [module docs](super).

use super::XidRecord;
use slurm_formats::pci::PciAddr;

/// The most bytes of an Xid's message text kept in [`XidRecord::message`]
/// (the kernel itself prints at most about 1 KiB per record).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The most bytes of the `name=` field kept in [`XidRecord::process`]
/// (Linux process names are at most 15 bytes).
pub const MAX_PROCESS_BYTES: usize = 64;

/// The longest bracketed timestamp (`[...]`) looked at, in bytes.
const MAX_BRACKET_BYTES: usize = 64;
/// The longest `(PCI:... GPU-I:.. GPU-CI:..)` group looked at, in bytes.
const MAX_PAREN_BYTES: usize = 96;
/// The longest host name accepted in a syslog header.
const MAX_HOST_BYTES: usize = 255;

const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// Parses one line of kernel-log text. Returns `None` for anything that is
/// not an NVIDIA Xid report in one of the forms in the module docs.
///
/// A trailing `\n` or `\r\n` is ignored; a line that starts with whitespace is
/// a kmsg continuation line and never an Xid report.
pub fn parse_line(line: &str) -> Option<XidRecord> {
    let logged = logged(line)?;
    let body = parse_body(logged.body)?;
    Some(body.into_record(logged.time, logged.monotonic_us))
}

/// A line of kernel-log text split into its timestamp and message.
pub(super) struct Logged<'a> {
    pub(super) time: Option<String>,
    pub(super) monotonic_us: Option<u64>,
    pub(super) body: &'a str,
}

/// Splits a line in one of the forms of the module docs. `None` for a kmsg
/// continuation line (it starts with whitespace) and for a kmsg record that
/// user space wrote.
pub(super) fn logged(line: &str) -> Option<Logged<'_>> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.starts_with([' ', '\t']) {
        return None;
    }
    if let Some(record) = kmsg_record(line) {
        // Facility 0 is the kernel; user space cannot write it to /dev/kmsg.
        if record.prio >> 3 != 0 {
            return None;
        }
        let us = record.ts_us;
        let time = format!("{}.{:06}", us / 1_000_000, us % 1_000_000);
        return Some(Logged { time: Some(time), monotonic_us: Some(us), body: record.message });
    }
    Some(text_prefix(line))
}

// ---------------------------------------------------------------------------
// Parsing internals. Everything below works on `&str` with `get`,
// `strip_prefix` and byte scans, so no input can make it index out of range.

/// A `/dev/kmsg` record split into its header fields and message.
struct Kmsg<'a> {
    prio: u32,
    ts_us: u64,
    message: &'a str,
}

/// `prio,seq,ts_us,flag[,more...];message`, or `None` when the line does not
/// have that shape.
fn kmsg_record(line: &str) -> Option<Kmsg<'_>> {
    let (header, message) = line.split_once(';')?;
    let mut fields = header.split(',');
    let prio = digits::<u32>(fields.next()?)?;
    digits::<u64>(fields.next()?)?;
    let ts_us = digits::<u64>(fields.next()?)?;
    if !matches!(fields.next()?, "-" | "c" | "+") {
        return None;
    }
    Some(Kmsg { prio, ts_us, message })
}

/// Every text form: an optional syslog/journal header or `kernel: `, an
/// optional bracketed timestamp and caller id, then the message.
fn text_prefix(line: &str) -> Logged<'_> {
    let mut time = None;
    let mut monotonic_us = None;
    let mut rest = line;
    let header = syslog_header(line);
    if let Some((ts, after)) = header {
        time = Some(ts);
        rest = after;
    } else if let Some(after) = rest.strip_prefix("kernel:") {
        rest = after.trim_start_matches(' ');
    }
    if let Some((inside, after)) = bracket(rest) {
        rest = after.trim_start_matches(' ');
        if let Some(us) = monotonic(inside) {
            monotonic_us = Some(us);
            time = time.or(Some(inside.trim()));
        } else if is_ctime(inside) {
            time = time.or(Some(inside.trim()));
        }
        if let Some((caller, after)) = bracket(rest) {
            if is_caller_id(caller) {
                rest = after.trim_start_matches(' ');
            }
        }
        if header.is_none() && !rest.starts_with("NVRM:") {
            // journalctl -o short-monotonic: `[ 1234.567890] host kernel: `.
            if let Some(after) = host_kernel(rest) {
                rest = after;
            }
        }
    }
    Logged { time: time.map(str::to_owned), monotonic_us, body: rest }
}

/// The fields of `NVRM: Xid (...): NN, ...`.
pub(super) struct Body<'a> {
    bus_id: PciAddr,
    xid: u32,
    pid: Option<u32>,
    process: Option<&'a str>,
    message: &'a str,
}

impl Body<'_> {
    pub(super) fn into_record(self, time: Option<String>, monotonic_us: Option<u64>) -> XidRecord {
        XidRecord {
            time,
            monotonic_us,
            pci_bus_id: self.bus_id,
            xid: self.xid,
            pid: self.pid,
            process: self.process.map(|p| truncate(p, MAX_PROCESS_BYTES).to_owned()),
            message: truncate(self.message, MAX_MESSAGE_BYTES).to_owned(),
        }
    }
}

/// `NVRM: Xid (PCI:0000:3b:00[ GPU-I:05 ...]): 79[, pid=P][, name=N][, message]`.
pub(super) fn parse_body(text: &str) -> Option<Body<'_>> {
    let rest = text.strip_prefix("NVRM: Xid")?.trim_start_matches(' ');
    let rest = rest.strip_prefix('(')?;
    let close = rest.bytes().take(MAX_PAREN_BYTES).position(|b| b == b')')?;
    let inside = rest.get(..close)?;
    let rest = rest.get(close + 1..)?;
    let id = inside.split_whitespace().next()?;
    let bus_id = PciAddr::parse(id.strip_prefix("PCI:").unwrap_or(id)).ok()?;
    let rest = rest.strip_prefix(':')?.trim_start_matches(' ');
    let n = rest.bytes().take_while(u8::is_ascii_digit).count();
    let xid = digits::<u32>(rest.get(..n)?)?;
    let rest = rest.get(n..)?;
    let rest = if let Some(after) = rest.strip_prefix(',') {
        after
    } else if rest.is_empty() || rest.starts_with(' ') {
        rest
    } else {
        return None;
    };
    let mut rest = rest.trim_start_matches(' ');
    let mut pid = None;
    if let Some(after) = rest.strip_prefix("pid=") {
        let (value, after) = field(after);
        pid = digits::<u32>(value);
        rest = after;
    }
    let mut process = None;
    if let Some(after) = rest.strip_prefix("name=") {
        let (value, after) = field(after);
        process = Some(value);
        rest = after;
    }
    Some(Body { bus_id, xid, pid, process, message: rest.trim_end() })
}

/// A `key=` field's value up to the next comma, and the text after the comma
/// and its spaces.
fn field(text: &str) -> (&str, &str) {
    match text.split_once(',') {
        Some((value, after)) => (value.trim(), after.trim_start_matches(' ')),
        None => (text.trim(), ""),
    }
}

/// A syslog or journal header, `TIMESTAMP HOST kernel: `, or a bare
/// `TIMESTAMP ` directly before `NVRM:` (`dmesg --time-format iso`).
/// Returns the timestamp text and what follows the header.
fn syslog_header(line: &str) -> Option<(&str, &str)> {
    let b = line.as_bytes();
    let len = bsd_timestamp(b).or_else(|| full_timestamp(b)).or_else(|| iso_timestamp(b)).or_else(|| {
        // journalctl -o short-unix: seconds.micros since the epoch.
        fraction_number(b, 0, b'.')
    })?;
    let ts = line.get(..len)?;
    let after = line.get(len..)?.strip_prefix(' ')?.trim_start_matches(' ');
    if after.starts_with("NVRM:") {
        return Some((ts, after));
    }
    Some((ts, host_kernel(after)?))
}

/// `HOST kernel: ` → what follows it.
fn host_kernel(text: &str) -> Option<&str> {
    let (host, after) = text.split_once(' ')?;
    if host.is_empty() || host.len() > MAX_HOST_BYTES {
        return None;
    }
    Some(after.strip_prefix("kernel:")?.trim_start_matches(' '))
}

/// `Nov 22 18:29:55`, `Dec  2 11:38:47`, `Nov 22 18:29:55.123456`: its length.
fn bsd_timestamp(b: &[u8]) -> Option<usize> {
    if !MONTHS.iter().any(|m| b.starts_with(m.as_bytes())) || b.get(3) != Some(&b' ') {
        return None;
    }
    let mut i = 4;
    if b.get(i) == Some(&b' ') {
        i += 1;
    }
    let day = count_digits(b, i);
    if !(1..=2).contains(&day) {
        return None;
    }
    i += day;
    if b.get(i) != Some(&b' ') || !pattern_at(b, i + 1, "dd:dd:dd") {
        return None;
    }
    Some(optional_fraction(b, i + 9, b"."))
}

/// `2024-08-19T21:36:23+0200`, `2024-08-19T21:36:23.123456+02:00`,
/// `2024-08-19 21:36:23`, `2024-08-19T21:36:23,123456+02:00`: its length.
fn iso_timestamp(b: &[u8]) -> Option<usize> {
    if !pattern_at(b, 0, "dddd-dd-dd") || !matches!(b.get(10), Some(b'T' | b' ')) {
        return None;
    }
    if !pattern_at(b, 11, "dd:dd:dd") {
        return None;
    }
    let i = optional_fraction(b, 19, b".,");
    Some(match b.get(i) {
        Some(b'Z') => i + 1,
        Some(b'+' | b'-') if pattern_at(b, i + 1, "dd:dd") => i + 6,
        Some(b'+' | b'-') if pattern_at(b, i + 1, "dddd") => i + 5,
        Some(b'+' | b'-') if pattern_at(b, i + 1, "dd") => i + 3,
        _ => i,
    })
}

/// `Mon 2024-08-19 21:36:23 CEST` (journalctl -o short-full): its length.
fn full_timestamp(b: &[u8]) -> Option<usize> {
    if !WEEKDAYS.iter().any(|d| b.starts_with(d.as_bytes())) || b.get(3) != Some(&b' ') {
        return None;
    }
    let rest = b.get(4..)?;
    if !pattern_at(rest, 0, "dddd-dd-dd dd:dd:dd") {
        return None;
    }
    let i = optional_fraction(rest, 19, b".");
    if rest.get(i) != Some(&b' ') {
        return None;
    }
    let zone = rest
        .get(i + 1..)?
        .iter()
        .take(9)
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-'))
        .count();
    if !(1..=8).contains(&zone) {
        return None;
    }
    Some(4 + i + 1 + zone)
}

/// `Fri Jan 29 23:42:34 2021` (`dmesg -T`, one or two spaces before the day).
fn is_ctime(text: &str) -> bool {
    let mut words = text.split_whitespace();
    let ok = |w: Option<&str>, f: &dyn Fn(&str) -> bool| w.is_some_and(f);
    ok(words.next(), &|w| WEEKDAYS.contains(&w))
        && ok(words.next(), &|w| MONTHS.contains(&w))
        && ok(words.next(), &|w| (1..=2).contains(&w.len()) && w.bytes().all(|c| c.is_ascii_digit()))
        && ok(words.next(), &|w| w.len() == 8 && pattern_at(w.as_bytes(), 0, "dd:dd:dd"))
        && ok(words.next(), &|w| w.len() == 4 && w.bytes().all(|c| c.is_ascii_digit()))
        && words.next().is_none()
}

/// `[ 1234.567890]` content → microseconds since boot.
fn monotonic(text: &str) -> Option<u64> {
    let t = text.trim();
    let b = t.as_bytes();
    if fraction_number(b, 0, b'.')? != b.len() {
        return None;
    }
    let (secs, frac) = t.split_once('.')?;
    let mut us = digits::<u64>(secs)?.checked_mul(1_000_000)?;
    let mut scale = 100_000;
    for c in frac.bytes().take(6) {
        us = us.checked_add(u64::from(c.wrapping_sub(b'0')) * scale)?;
        scale /= 10;
    }
    Some(us)
}

/// `[T123]` or `[  C1]`: a printk caller id.
fn is_caller_id(text: &str) -> bool {
    let t = text.trim();
    match t.strip_prefix(['T', 'C']) {
        Some(n) => (1..=10).contains(&n.len()) && n.bytes().all(|c| c.is_ascii_digit()),
        None => false,
    }
}

/// `[inside] rest` → (`inside`, `rest`), for a short `inside` without brackets.
fn bracket(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix('[')?;
    let close = rest.bytes().take(MAX_BRACKET_BYTES + 1).position(|b| b == b']')?;
    let inside = rest.get(..close)?;
    if inside.contains('[') {
        return None;
    }
    Some((inside, rest.get(close + 1..)?))
}

/// `digits SEP digits` starting at `i` (at most 12 and 9 digits): where it ends.
fn fraction_number(b: &[u8], i: usize, sep: u8) -> Option<usize> {
    let whole = count_digits(b, i);
    if !(1..=12).contains(&whole) || b.get(i + whole) != Some(&sep) {
        return None;
    }
    let frac = count_digits(b, i + whole + 1);
    if !(1..=9).contains(&frac) {
        return None;
    }
    Some(i + whole + 1 + frac)
}

/// Skips an optional `SEP digits` (1 to 9 digits, SEP one of `seps`) at `i`.
fn optional_fraction(b: &[u8], i: usize, seps: &[u8]) -> usize {
    match b.get(i) {
        Some(c) if seps.contains(c) => {
            let n = count_digits(b, i + 1);
            if (1..=9).contains(&n) { i + 1 + n } else { i }
        }
        _ => i,
    }
}

/// How many ASCII digits start at `i` (at most 21: more is never valid).
fn count_digits(b: &[u8], i: usize) -> usize {
    b.get(i..).map_or(0, |rest| rest.iter().take(21).take_while(|c| c.is_ascii_digit()).count())
}

/// Whether `b` at `i` matches `pattern`, where `d` is any ASCII digit and
/// every other character stands for itself.
fn pattern_at(b: &[u8], i: usize, pattern: &str) -> bool {
    pattern.bytes().enumerate().all(|(k, p)| match b.get(i + k) {
        Some(c) if p == b'd' => c.is_ascii_digit(),
        Some(&c) => c == p,
        None => false,
    })
}

/// A non-empty run of at most 20 ASCII digits, as a number.
fn digits<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub(super) fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> XidRecord {
        parse_line(line).unwrap_or_else(|| panic!("no Xid in {line:?}"))
    }

    // --- log forms -------------------------------------------------------

    #[test]
    fn kmsg_record() {
        let r = parse(
            "6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.",
        );
        assert_eq!(
            r,
            XidRecord {
                time: Some("5.678901".into()),
                monotonic_us: Some(5_678_901),
                pci_bus_id: "0000:3b:00".parse().unwrap(),
                xid: 79,
                pid: Some(4242),
                process: Some("python3".into()),
                message: "GPU has fallen off the bus.".into(),
            }
        );
    }

    #[test]
    fn kmsg_record_with_caller_field_and_continuation_flag() {
        let r = parse("4,99,1000000,c,caller=T512;NVRM: Xid (PCI:0000:01:00): 48, DBE");
        assert_eq!((r.xid, r.monotonic_us, r.time.as_deref()), (48, Some(1_000_000), Some("1.000000")));
    }

    #[test]
    fn kmsg_continuation_lines_are_not_xids() {
        assert_eq!(parse_line(" SUBSYSTEM=pci"), None);
        assert_eq!(parse_line(" DEVICE=+pci:0000:3b:00.0"), None);
        assert_eq!(parse_line(" NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."), None);
    }

    #[test]
    fn kmsg_from_user_space_facility_is_refused() {
        // 14 = facility 1 (user), level 6: what `echo ... > /dev/kmsg` produces.
        assert_eq!(parse_line("14,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, fake"), None);
    }

    #[test]
    fn kmsg_non_xid_message() {
        assert_eq!(parse_line("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"), None);
    }

    #[test]
    fn dmesg_raw_timestamp() {
        let r = parse("[ 1234.567890] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.");
        assert_eq!(r.time.as_deref(), Some("1234.567890"));
        assert_eq!(r.monotonic_us, Some(1_234_567_890));
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid), ("0000:02:00", 79));
        assert_eq!(r.message, "GPU has fallen off the bus.");
    }

    #[test]
    fn dmesg_with_caller_id() {
        let r = parse("[  219.470994] [  T512] NVRM: Xid (PCI:0000:07:00): 48, DBE");
        assert_eq!((r.xid, r.monotonic_us), (48, Some(219_470_994)));
    }

    #[test]
    fn dmesg_ctime() {
        let r = parse(
            "[Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        );
        assert_eq!(r.time.as_deref(), Some("Fri Apr  5 21:29:39 2024"));
        assert_eq!(r.monotonic_us, None);
        assert_eq!(r.pid, None);
        assert_eq!(r.process.as_deref(), Some("<unknown>"));
        assert_eq!(r.message, "GPU has fallen off the bus.");
    }

    #[test]
    fn dmesg_iso_time_format() {
        let r = parse("2024-08-19T21:36:23,123456+02:00 NVRM: Xid (PCI:0000:23:00): 120, GSP task exception");
        assert_eq!(r.time.as_deref(), Some("2024-08-19T21:36:23,123456+02:00"));
        assert_eq!(r.xid, 120);
    }

    #[test]
    fn syslog_with_kernel_timestamp() {
        let r = parse(
            "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
        );
        assert_eq!(r.time.as_deref(), Some("Dec  2 11:38:47"));
        assert_eq!(r.monotonic_us, Some(219_470_994));
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid), ("0000:07:00", 48));
    }

    #[test]
    fn syslog_without_kernel_timestamp() {
        let r =
            parse("May 13 17:18:47 hyperion kernel: NVRM: Xid (PCI:0000:08:00): 69, Class Error: ChId 003b");
        assert_eq!(r.time.as_deref(), Some("May 13 17:18:47"));
        assert_eq!(r.monotonic_us, None);
        assert_eq!(r.message, "Class Error: ChId 003b");
    }

    #[test]
    fn syslog_from_another_program_is_refused() {
        assert_eq!(
            parse_line("Nov 22 18:29:55 host sshd[77]: Invalid user NVRM: Xid (PCI:0000:01:00): 79, x"),
            None
        );
        assert_eq!(
            parse_line("Nov 22 18:29:55 host sshd[77]: kernel: NVRM: Xid (PCI:0000:01:00): 79, x"),
            None
        );
    }

    #[test]
    fn journalctl_short_precise() {
        let r = parse("Aug 19 21:36:23.123456 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, GSP error");
        assert_eq!(r.time.as_deref(), Some("Aug 19 21:36:23.123456"));
    }

    #[test]
    fn journalctl_short_iso() {
        let r = parse("2024-08-19T21:36:23+0200 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, GSP error");
        assert_eq!(r.time.as_deref(), Some("2024-08-19T21:36:23+0200"));
        let r = parse("2024-08-19T21:36:23.123456+02:00 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!(r.time.as_deref(), Some("2024-08-19T21:36:23.123456+02:00"));
    }

    #[test]
    fn journalctl_short_full() {
        let r = parse("Mon 2024-08-19 21:36:23 CEST fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!(r.time.as_deref(), Some("Mon 2024-08-19 21:36:23 CEST"));
    }

    #[test]
    fn journalctl_short_unix() {
        let r = parse("1724096183.123456 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!(r.time.as_deref(), Some("1724096183.123456"));
        assert_eq!(r.monotonic_us, None);
    }

    #[test]
    fn journalctl_short_monotonic() {
        let r = parse("[ 1234.567890] fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!((r.time.as_deref(), r.monotonic_us), (Some("1234.567890"), Some(1_234_567_890)));
    }

    #[test]
    fn journal_prefix_trimmed() {
        let r = parse("kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c");
        assert_eq!((r.time, r.xid, r.pid), (None, 45, Some(1_818_992)));
    }

    #[test]
    fn bare_message() {
        let r = parse("NVRM: Xid (PCI:0000:01:00): 62, 323f0f30 0000c3d8");
        assert_eq!((r.time, r.monotonic_us, r.xid), (None, None, 62));
        assert_eq!(r.message, "323f0f30 0000c3d8");
    }

    #[test]
    fn old_driver_without_pci_prefix() {
        let r =
            parse("Nov 22 18:29:55 hostname kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b");
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid), ("0000:01:00", 31));
    }

    #[test]
    fn placeholder_bracket_is_skipped() {
        let r = parse("[\u{2026}] NVRM: Xid (0000:03:00): 14, Channel 00000001");
        assert_eq!((r.time, r.xid), (None, 14));
    }

    #[test]
    fn mig_instance_ids_are_dropped() {
        let r =
            parse("NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 94, pid=7194, Contained: CE User Channel");
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid, r.pid), ("0000:01:00", 94, Some(7194)));
    }

    #[test]
    fn trailing_newline_is_ignored() {
        assert_eq!(parse("NVRM: Xid (PCI:0000:01:00): 79, gone.\r\n").message, "gone.");
    }

    #[test]
    fn xid_without_message() {
        let r = parse("NVRM: Xid (PCI:0000:01:00): 79");
        assert_eq!((r.xid, r.message.as_str()), (79, ""));
    }

    // --- pid and name ----------------------------------------------------

    #[test]
    fn pid_and_name_present() {
        let r = parse("NVRM: Xid (PCI:0000:01:00): 31, pid=14292, name=python, Ch 00000030");
        assert_eq!(
            (r.pid, r.process.as_deref(), r.message.as_str()),
            (Some(14292), Some("python"), "Ch 00000030")
        );
    }

    #[test]
    fn pid_without_name() {
        let r = parse("[Fri Jan 29 23:42:34 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=13641, Ch 00000008");
        assert_eq!((r.pid, r.process, r.message.as_str()), (Some(13641), None, "Ch 00000008"));
    }

    #[test]
    fn pid_and_name_absent() {
        let r = parse("[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.");
        assert_eq!((r.pid, r.process), (None, None));
    }

    #[test]
    fn unknown_pid_is_none_and_unknown_name_is_kept() {
        let r = parse("NVRM: Xid (PCI:0000:0a:00): 62, pid='<unknown>', name=<unknown>, 2023b230");
        assert_eq!((r.pid, r.process.as_deref(), r.message.as_str()), (None, Some("<unknown>"), "2023b230"));
    }

    #[test]
    fn pid_too_large_is_none() {
        assert_eq!(parse("NVRM: Xid (PCI:0000:01:00): 31, pid=99999999999, x").pid, None);
    }

    // --- not Xids, garbage, limits ---------------------------------------

    #[test]
    fn other_nvrm_lines_are_not_xids() {
        for line in [
            "[Fri Apr  5 21:29:39 2024] NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462",
            "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.",
            "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00",
            "Nov 22 18:29:55 host kernel: usb 1-1: new high-speed USB device",
            "",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn malformed_xid_lines() {
        for line in [
            "NVRM: Xid",
            "NVRM: Xid (",
            "NVRM: Xid (PCI:0000:01:00",
            "NVRM: Xid (PCI:0000:01:00)",
            "NVRM: Xid (PCI:0000:01:00):",
            "NVRM: Xid (PCI:0000:01:00): x",
            "NVRM: Xid (PCI:0000:01:00): 79x, y",
            "NVRM: Xid (PCI:): 79, y",
            "NVRM: Xid (PCI:zzzz:01:00): 79, y",
            "NVRM: Xid (): 79, y",
            "NVRM: Xid (PCI:0000:01:00): 99999999999, y",
            "6,1,2;NVRM: Xid (PCI:0000:01:00): 79, y",
            "[ 1.2 NVRM: Xid (PCI:0000:01:00): 79, y",
            "Nov 22 18:29:55 host kernel NVRM: Xid (PCI:0000:01:00): 79, y",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn one_megabyte_line_with_an_xid() {
        let mut line = String::from("[ 1.000000] NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=");
        line.push_str(&"\u{e9}".repeat(100));
        line.push_str(", ");
        line.push_str(&"x\u{2026}".repeat(1 << 18));
        assert!(line.len() > 1 << 20);
        let r = parse(&line);
        assert_eq!(r.xid, 79);
        assert!(r.message.len() <= MAX_MESSAGE_BYTES && r.message.len() > MAX_MESSAGE_BYTES - 4);
        assert!(r.process.is_some_and(|p| p.len() == MAX_PROCESS_BYTES));
    }

    #[test]
    fn one_megabyte_garbage_lines() {
        for unit in ["[", "a", " ", "NVRM: Xid (", "6,", "Nov 22 ", "9"] {
            let line = unit.repeat((1 << 20) / unit.len());
            assert_eq!(parse_line(&line), None);
        }
    }
}
