//! Telling systemd how the daemon is doing (`Type=notify`, `WatchdogSec=`).
//!
//! The daemon says `READY=1` once its first pass is done and the GPU table is
//! written (or given up on), so `Before=slurmd.service` really keeps slurmd
//! waiting for the table; `WATCHDOG=1` from its main loop, often enough for
//! `WATCHDOG_USEC`; `STOPPING=1` on its way out. Without `NOTIFY_SOCKET` (not
//! under systemd) all of it does nothing.
//!
//! The messages are the `sd-notify` crate's [`NotifyState`]s: one datagram,
//! the states' `KEY=VALUE` lines joined by newlines (as libsystemd's callers
//! write them; `sd_notify::notify` ends the last with one too, which systemd
//! reads the same). Two parts stay here, because the crate (0.4) does them differently
//! from sd_notify(3) and from what this daemon did before:
//!
//! - the socket: `sd_notify::notify` connects to `NOTIFY_SOCKET` as a path,
//!   so an abstract socket (`@name`, which libsystemd accepts) would not be
//!   reached; [`Notifier`] takes both, and reads the variable once;
//! - the watchdog: `sd_notify::watchdog_enabled` wants `WATCHDOG_PID` set,
//!   and takes `WATCHDOG_USEC=0` as enabled; sd_watchdog_enabled(3) takes an
//!   unset `WATCHDOG_PID` as "this process" and 0 as off ([`watchdog_interval`]).
//!
//! Nothing here unsets `NOTIFY_SOCKET` or `WATCHDOG_*` (the crate's
//! `unset_env`): the daemon is threaded, and its children (`scontrol`,
//! `slurmd -G`) ignore the variables.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use sd_notify::NotifyState;

/// Where notifications go.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    target: Target,
}

#[derive(Debug)]
enum Target {
    Path(PathBuf),
    Abstract(SocketAddr),
}

impl Notifier {
    /// A notifier for a `NOTIFY_SOCKET` value: an absolute path, or `@name`
    /// for the abstract namespace.
    ///
    /// # Errors
    /// An empty or relative value, or no socket could be made.
    pub fn connect(value: &str) -> io::Result<Notifier> {
        let target = if let Some(name) = value.strip_prefix('@') {
            Target::Abstract(SocketAddr::from_abstract_name(name.as_bytes())?)
        } else if value.starts_with('/') {
            Target::Path(PathBuf::from(value))
        } else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("NOTIFY_SOCKET={value:?}")));
        };
        Ok(Notifier { socket: UnixDatagram::unbound()?, target })
    }

    /// Sends one notification of `states` (`READY=1`, `WATCHDOG=1`,
    /// `STATUS=...`): a line per state.
    ///
    /// # Errors
    /// The datagram could not be sent.
    pub fn notify(&self, states: &[NotifyState<'_>]) -> io::Result<()> {
        let message = message(states);
        let sent = match &self.target {
            Target::Path(p) => self.socket.send_to(message.as_bytes(), p)?,
            Target::Abstract(a) => self.socket.send_to_addr(message.as_bytes(), a)?,
        };
        if sent == message.len() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::WriteZero, "short notification datagram"))
        }
    }
}

/// The datagram for `states`: their `KEY=VALUE` lines, joined by newlines.
pub fn message(states: &[NotifyState<'_>]) -> String {
    states.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

/// The watchdog's interval from `WATCHDOG_USEC`, when it is meant for this
/// process (`WATCHDOG_PID` unset or `own_pid`).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// The daemon's side of the service protocol, driven from its main loop.
#[derive(Debug)]
pub struct Service {
    notifier: Option<Notifier>,
    watchdog: Option<Duration>,
    table_done: Arc<AtomicBool>,
    passed: bool,
    ready: bool,
    last_ping: Option<Instant>,
}

impl Service {
    /// From the environment systemd gives a service. `table_done` turns true
    /// when the GPU table is written or given up on.
    pub fn from_env(table_done: Arc<AtomicBool>) -> Service {
        let notifier = std::env::var("NOTIFY_SOCKET").ok().and_then(|v| match Notifier::connect(&v) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(error = %e, "cannot talk to systemd (NOTIFY_SOCKET); it will not learn that the agent is ready");
                None
            }
        });
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Service::new(notifier, watchdog, table_done)
    }

    /// A service talking through `notifier`, pinging a watchdog of `watchdog`.
    pub fn new(
        notifier: Option<Notifier>,
        watchdog: Option<Duration>,
        table_done: Arc<AtomicBool>,
    ) -> Service {
        Service { notifier, watchdog, table_done, passed: false, ready: false, last_ping: None }
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Some(n) = &self.notifier {
            if let Err(e) = n.notify(states) {
                tracing::warn!(error = %e, state = %message(states), "cannot notify systemd");
            }
        }
    }

    /// A pass is done.
    pub fn passed(&mut self) {
        self.passed = true;
        self.tick();
    }

    /// Called at every turn of the main loop (at least once a second):
    /// `READY=1` once due, and a watchdog ping every third of its interval.
    pub fn tick(&mut self) {
        if !self.ready && self.passed && self.table_done.load(Ordering::SeqCst) {
            self.ready = true;
            self.send(&[NotifyState::Ready, NotifyState::Status("watching the GPUs")]);
        }
        if let Some(interval) = self.watchdog {
            if self.last_ping.is_none_or(|t| t.elapsed() >= interval / 3) {
                self.last_ping = Some(Instant::now());
                self.send(&[NotifyState::Watchdog]);
            }
        }
    }

    /// The daemon is on its way out.
    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    /// Whether `READY=1` was sent (or would have been, without systemd).
    pub fn is_ready(&self) -> bool {
        self.ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(sock: &UnixDatagram) -> Vec<String> {
        sock.set_nonblocking(true).unwrap_or_default();
        let mut buf = [0u8; 512];
        let mut out = Vec::new();
        while let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned());
        }
        out
    }

    /// A socket listening in a fresh directory, and a notifier for it.
    fn listening(name: &str) -> io::Result<(PathBuf, UnixDatagram, Notifier)> {
        let dir = std::env::temp_dir().join(format!("sdnotify-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path)?;
        let notifier = Notifier::connect(&path.display().to_string())?;
        Ok((dir, sock, notifier))
    }

    #[test]
    fn notifies_a_socket_by_path_and_in_the_abstract_namespace() -> io::Result<()> {
        let (dir, sock, notifier) = listening("path")?;
        notifier.notify(&[NotifyState::Ready])?;
        assert_eq!(received(&sock), vec!["READY=1"]);

        let name = format!("gpu-node-agent-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let abstract_sock = UnixDatagram::bind_addr(&addr)?;
        Notifier::connect(&format!("@{name}"))?.notify(&[NotifyState::Watchdog])?;
        assert_eq!(received(&abstract_sock), vec!["WATCHDOG=1"]);

        assert!(Notifier::connect("relative/path").is_err());
        assert!(Notifier::connect("").is_err());
        std::fs::remove_dir_all(&dir)
    }

    #[test]
    fn the_watchdog_is_only_ours_when_its_pid_is() {
        assert_eq!(watchdog_interval(Some("30000000"), None, 7), Some(Duration::from_secs(30)));
        assert_eq!(watchdog_interval(Some("30000000"), Some("7"), 7), Some(Duration::from_secs(30)));
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None, "meant for another process");
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn ready_waits_for_the_first_pass_and_the_table() -> io::Result<()> {
        let (dir, sock, notifier) = listening("service")?;
        let table = Arc::new(AtomicBool::new(false));
        let mut svc = Service::new(Some(notifier), Some(Duration::from_secs(60)), Arc::clone(&table));
        svc.tick();
        assert_eq!(received(&sock), vec!["WATCHDOG=1"], "pings start at once; not ready yet");
        svc.passed();
        assert!(received(&sock).is_empty(), "the table is not written yet; no ping due");
        table.store(true, Ordering::SeqCst);
        svc.tick();
        assert_eq!(received(&sock), vec!["READY=1\nSTATUS=watching the GPUs"]);
        svc.tick();
        svc.passed();
        assert!(received(&sock).is_empty(), "READY is sent once");
        assert!(svc.is_ready());
        svc.stopping();
        assert_eq!(received(&sock), vec!["STOPPING=1"]);
        std::fs::remove_dir_all(&dir)
    }
}
