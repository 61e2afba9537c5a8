//! The agent's log, as admins expect it.
//!
//! - `RUST_LOG` chooses what is logged (tracing-subscriber's `EnvFilter`
//!   syntax, `RUST_LOG=debug`, `RUST_LOG=gpu_node_agent=debug`); the default
//!   is `info`. A bad `RUST_LOG` is ignored rather than fatal.
//! - Under systemd (`JOURNAL_STREAM` names the very pipe stderr is), each
//!   line starts with its syslog priority, `<3>` error, `<4>` warning, `<6>`
//!   info, `<7>` debug, as sd-daemon(3) describes, and carries no timestamp
//!   (the journal has its own): `journalctl -p warning -u gpu-node-agent`
//!   then shows exactly the warnings and errors. Elsewhere lines start with
//!   an RFC 3339 time.
//! - A warning or error repeated word for word is logged the first time, then
//!   at most once an hour, with how many times it came in between.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How long a repeated warning or error stays quiet after it was logged.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(3600);
/// Distinct messages remembered for [`REPEAT_WINDOW`]; past it the oldest go.
const MAX_REMEMBERED: usize = 512;

/// Sets up the process's logging to stderr (see the module's documentation).
pub fn init() {
    let journal = journal_stream_matches(std::env::var("JOURNAL_STREAM").ok().as_deref(), stderr_identity());
    let filter = EnvFilter::builder().with_default_directive(LevelFilter::INFO.into()).from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(LineFormat::new(journal, REPEAT_WINDOW))
        .init();
}

/// The device and inode of this process's stderr (`fstat(2)`).
fn stderr_identity() -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let m = std::fs::File::from(fd).metadata().ok()?;
    Some((m.dev(), m.ino()))
}

/// Whether `JOURNAL_STREAM` (`DEVICE:INODE`, decimal, as systemd sets it for
/// a service whose stderr goes to the journal) names the stderr we have: a
/// child whose stderr was redirected inherits the variable but not the stream.
pub fn journal_stream_matches(var: Option<&str>, stderr: Option<(u64, u64)>) -> bool {
    let Some((dev, ino)) = var.and_then(|v| v.trim().split_once(':')) else { return false };
    match (dev.parse::<u64>(), ino.parse::<u64>(), stderr) {
        (Ok(d), Ok(i), Some(have)) => (d, i) == have,
        _ => false,
    }
}

/// The syslog priority of a level (`<N>` prefixes of sd-daemon(3)).
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Remembers recent messages: each is let through the first time and then at
/// most once per window, with the number held back in between.
#[derive(Debug)]
pub struct Throttle {
    window: Duration,
    seen: HashMap<String, (Instant, u64)>,
}

impl Throttle {
    /// A throttle that lets a message through once per `window`.
    pub fn new(window: Duration) -> Throttle {
        Throttle { window, seen: HashMap::new() }
    }

    /// Whether to log `message` now. `Some(n)`: log it, saying it came `n`
    /// more times since it was last logged; `None`: hold it back.
    pub fn admit(&mut self, message: &str, now: Instant) -> Option<u64> {
        if let Some((last, held)) = self.seen.get_mut(message) {
            if now.saturating_duration_since(*last) < self.window {
                *held += 1;
                return None;
            }
            let n = *held;
            *last = now;
            *held = 0;
            return Some(n);
        }
        if self.seen.len() >= MAX_REMEMBERED {
            let window = self.window;
            self.seen.retain(|_, (last, _)| now.saturating_duration_since(*last) < window);
            if self.seen.len() >= MAX_REMEMBERED {
                let oldest = self.seen.iter().min_by_key(|(_, (last, _))| *last).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.seen.remove(&k);
                }
            }
        }
        self.seen.insert(message.to_owned(), (now, 0));
        Some(0)
    }
}

/// One log line per event: a priority prefix (journal) or a time, the level,
/// the message and its fields; repeated warnings and errors throttled.
#[derive(Debug)]
pub struct LineFormat {
    journal: bool,
    inner: Format<Full, ()>,
    throttle: Mutex<Throttle>,
}

impl LineFormat {
    /// A format for the journal (`journal`) or a plain stream, throttling
    /// repeats within `window`.
    pub fn new(journal: bool, window: Duration) -> LineFormat {
        let inner = tracing_subscriber::fmt::format().without_time().with_target(false).with_ansi(false);
        LineFormat { journal, inner, throttle: Mutex::new(Throttle::new(window)) }
    }
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut body = String::new();
        self.inner.format_event(ctx, Writer::new(&mut body), event)?;
        let body = body.trim();
        let level = *event.metadata().level();
        let mut repeats = 0;
        if level <= Level::WARN {
            let mut throttle = self.throttle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match throttle.admit(body, Instant::now()) {
                Some(n) => repeats = n,
                None => return Ok(()),
            }
        }
        let body = if repeats > 0 {
            format!("{body} (repeated {repeats} more times since it was last logged)")
        } else {
            body.to_owned()
        };
        if self.journal {
            // Every line of a multi-line message is a journal entry of its own.
            let prefix = format!("<{}>", priority(level));
            for line in body.lines() {
                writeln!(writer, "{prefix}{line}")?;
            }
            Ok(())
        } else {
            SystemTime.format_time(&mut writer)?;
            writeln!(writer, " {body}")
        }
    }
}

/// A subscriber like [`init`]'s, writing to `make_writer`, for tests.
#[cfg(test)]
fn test_subscriber<W>(journal: bool, window: Duration, make_writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_max_level(LevelFilter::INFO)
        .with_writer(make_writer)
        .with_ansi(false)
        .event_format(LineFormat::new(journal, window))
        .finish()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn journal_stream_must_name_stderr_itself() {
        assert!(journal_stream_matches(Some("8:12345"), Some((8, 12345))));
        assert!(!journal_stream_matches(Some("8:12345"), Some((8, 12346))), "stderr redirected elsewhere");
        assert!(!journal_stream_matches(None, Some((8, 12345))));
        assert!(!journal_stream_matches(Some("garbage"), Some((8, 12345))));
        assert!(!journal_stream_matches(Some("8:x"), Some((8, 12345))));
        assert!(!journal_stream_matches(Some("8:12345"), None));
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::TRACE), 7);
    }

    #[test]
    fn a_repeat_is_held_back_for_the_window_then_logged_with_its_count() {
        let mut t = Throttle::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        assert_eq!(t.admit("scontrol failed", t0), Some(0));
        for m in 1..=119 {
            assert_eq!(t.admit("scontrol failed", t0 + Duration::from_secs(30 * m)), None);
        }
        assert_eq!(t.admit("another error", t0 + Duration::from_secs(60)), Some(0), "other messages pass");
        assert_eq!(t.admit("scontrol failed", t0 + Duration::from_secs(3600)), Some(119));
        assert_eq!(t.admit("scontrol failed", t0 + Duration::from_secs(3601)), None);
        assert_eq!(t.admit("scontrol failed", t0 + Duration::from_secs(7200)), Some(1));
    }

    #[test]
    fn the_throttle_remembers_a_bounded_number_of_messages() {
        let mut t = Throttle::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        for i in 0..MAX_REMEMBERED + 10 {
            assert_eq!(t.admit(&format!("error {i}"), t0), Some(0));
        }
        assert!(t.seen.len() <= MAX_REMEMBERED);
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(journal: bool, body: impl FnOnce()) -> String {
        let buf = Buffer::default();
        let out = buf.clone();
        let subscriber = test_subscriber(journal, Duration::from_secs(3600), move || out.clone());
        tracing::subscriber::with_default(subscriber, body);
        let bytes = buf.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn journal_lines_carry_priorities_and_repeats_are_logged_once() {
        let text = logged(true, || {
            tracing::info!(node = "node1", "gpu-node-agent started");
            for _ in 0..5 {
                tracing::error!(problem = "Slurm: scontrol failed", "agent unhealthy");
            }
            tracing::warn!("NVML Xid events unavailable\nsecond line");
            tracing::debug!("not shown at the default level");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            vec![
                "<6>INFO gpu-node-agent started node=\"node1\"",
                "<3>ERROR agent unhealthy problem=\"Slurm: scontrol failed\"",
                "<4>WARN NVML Xid events unavailable",
                "<4>second line",
            ],
            "{text}"
        );
    }

    #[test]
    fn plain_lines_start_with_the_time() {
        let text = logged(false, || tracing::warn!(error = "x", "cannot write metrics"));
        let line = text.lines().next().unwrap_or_default();
        assert!(line.starts_with("20") && line.contains('T'), "{line}");
        assert!(line.ends_with(" WARN cannot write metrics error=\"x\""), "{line}");
    }
}
