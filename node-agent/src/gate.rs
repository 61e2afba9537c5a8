//! The Epilog health gate: `gpu-node-agent epilog`, run from slurm.conf's
//! `Epilog=` at each job's end, asks the running daemon over a local socket
//! for one health pass now; the daemon drains with its own reason first, then
//! answers. The command exits 1 only when the node is unhealthy, so Slurm
//! fails the Epilog there: a job asking for an expedited requeue
//! (25.11 and later) is requeued at once on other nodes, and `sinfo -R`
//! keeps the agent's reason (Slurm's "Epilog error" does not replace a drain
//! reason already set). It never fails an Epilog for anything else: no
//! daemon, a slow one, its own trouble, a bad configuration: 0 and one line.
//!
//! The socket is `run_dir/agent.sock`, mode 0600 in a directory checked
//! root's alone ([`crate::run_dir::open`]); the daemon answers only root,
//! and the command believes only a daemon running as root (`SO_PEERCRED`
//! on each end). One request per connection, one line each way:
//! `check JOBID` → `healthy`, `unhealthy REASON` or `unknown WHY`.
//!
//! Time: the command waits [`DEFAULT_DEADLINE`] (10 s) in all. The daemon
//! serves each connection on its own thread (a bounded number) under one
//! deadline for all of it, [`CONNECTION_DEADLINE`], the request itself
//! within [`REQUEST_DEADLINE`]: a slow or silent client holds up no other.
//! A request is answered by the first pass that starts after it reached the
//! daemon's loop, never by one already under way: requests taken in before
//! a pass starts share it (jobs ending together cost one pass), and those
//! that come while it runs share the next, at once after it. A pass the gate
//! asked for holds the "in a row" counters
//! ([`crate::policy::rows`]) and drains without `drain_jitter`'s wait
//! ([`crate::agent::Trigger::Gate`]).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender, SyncSender};
use std::thread;
use std::time::{Duration, Instant};

use crate::agent::{Report, Verdict};

/// The socket's name in `run_dir`.
pub const SOCKET: &str = "agent.sock";
/// How long `epilog` waits for the daemon's answer by default: well under
/// Slurm's epilog limits (`PrologEpilogTimeout`, 26.05's `EpilogTimeout`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);
/// Longest request line read.
const MAX_LINE: usize = 256;

/// One question from `epilog` to the daemon's loop.
#[derive(Debug)]
pub struct Request {
    /// The job whose Epilog asks, for the log.
    pub job: Option<u32>,
    /// Where the answer goes.
    pub reply: SyncSender<Answer>,
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// No fault that needs the node out of service.
    Healthy,
    /// The node needs draining (and the daemon has drained it, or tried):
    /// the first fault's reason.
    Unhealthy(String),
    /// The daemon cannot tell (NVML missing or hanging): never a failed Epilog.
    Unknown(String),
}

impl Answer {
    /// The answer after a pass; `drained`: the agent holds a drain of the
    /// node now. Unhealthy only then: a drain the fleet guard holds back, or
    /// one Slurm did not take, must not come in through the Epilog's
    /// "Epilog error" drain instead.
    pub fn of(report: &Report, drained: bool) -> Answer {
        let reason = || {
            report.faults.first().map_or_else(|| "a fault".to_owned(), crate::policy::health::Fault::reason)
        };
        match report.verdict {
            Verdict::Healthy => Answer::Healthy,
            Verdict::Unhealthy if drained => Answer::Unhealthy(reason()),
            Verdict::Unhealthy => {
                Answer::Unknown(format!("unhealthy ({}), but the agent's drain is not in force", reason()))
            }
            Verdict::Unknown => Answer::Unknown(report.problems.first().cloned().unwrap_or_default()),
        }
    }

    /// The reply line (without its newline).
    pub fn line(&self) -> String {
        let one = |s: &str| s.replace(['\n', '\r'], " ");
        match self {
            Answer::Healthy => "healthy".to_owned(),
            Answer::Unhealthy(r) => format!("unhealthy {}", one(r)),
            Answer::Unknown(w) => format!("unknown {}", one(w)),
        }
    }

    /// Reads a reply line; anything else is unknown.
    pub fn parse(line: &str) -> Answer {
        let line = line.trim_end();
        match line.split_once(' ').unwrap_or((line, "")) {
            ("healthy", _) => Answer::Healthy,
            ("unhealthy", r) => Answer::Unhealthy(r.to_owned()),
            ("unknown", w) => Answer::Unknown(w.to_owned()),
            _ => Answer::Unknown(format!("unexpected answer '{}'", slurm_formats::text::clip(line, 80))),
        }
    }
}

/// The socket's path.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join(SOCKET)
}

/// How long the daemon gives one connection, from its accept to its answer
/// written (the request read, the pass, the answer): under the command's
/// [`DEFAULT_DEADLINE`], so that the command hears why, not nothing.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(8);
/// How long a client has to send its request, within the connection's
/// deadline: a client that connects and says nothing holds its thread no
/// longer, and never holds up another client.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(1);
/// Connections served at once, each on a thread of its own.
const MAX_SERVED: usize = 16;
/// Connections accepted and waiting for a thread; past that one is told
/// `unknown busy` at once.
const MAX_WAITING: usize = 64;
/// How often the accept loop looks for connections.
const ACCEPT_LOOK: Duration = Duration::from_millis(20);

/// Listens on `run_dir/agent.sock` and hands each request to the daemon's
/// loop through `tx` (its one channel, [`crate::daemon::Wake`]), until `stop` is set. `run_dir` is checked root's alone
/// first ([`crate::run_dir::open`]). The accept loop never reads: each
/// connection is served on a thread of its own (at most [`MAX_SERVED`] at
/// once, the others waiting their turn) under one deadline
/// ([`CONNECTION_DEADLINE`]), so a slow or silent client delays no other.
///
/// # Errors
/// The directory fails its check, or the socket cannot be made.
pub fn listen<W: From<Request> + Send + 'static>(
    run_dir: &Path,
    tx: Sender<W>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let dir = crate::run_dir::open(run_dir).map_err(std::io::Error::other)?;
    let path = socket_path(dir.path());
    crate::run_dir::remove_file(&dir, SOCKET).map_err(std::io::Error::other)?;
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    thread::Builder::new().name("epilog-gate".to_owned()).spawn(move || {
        accept_loop(&listener, &tx, &stop);
        let _ = crate::run_dir::remove_file(&dir, SOCKET);
    })?;
    Ok(())
}

/// Accepts connections and starts their threads, within [`MAX_SERVED`].
fn accept_loop<W: From<Request> + Send + 'static>(
    listener: &UnixListener,
    tx: &Sender<W>,
    stop: &AtomicBool,
) {
    let served = Arc::new(AtomicUsize::new(0));
    let mut queue: VecDeque<(UnixStream, Instant)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        loop {
            match listener.accept() {
                Ok((stream, _)) if queue.len() < MAX_WAITING => queue.push_back((stream, Instant::now())),
                Ok((stream, _)) => refuse(&stream, "busy"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "epilog gate: accept failed");
                    thread::sleep(Duration::from_millis(500));
                    break;
                }
            }
        }
        while served.load(Ordering::Acquire) < MAX_SERVED {
            let Some((stream, accepted)) = queue.pop_front() else { break };
            if accepted.elapsed() >= CONNECTION_DEADLINE {
                refuse(&stream, "busy");
                continue;
            }
            start(stream, accepted, tx.clone(), &served);
        }
        thread::sleep(ACCEPT_LOOK);
    }
}

/// Serves one connection on a thread of its own, counted in `served`.
fn start<W: From<Request> + Send + 'static>(
    stream: UnixStream,
    accepted: Instant,
    tx: Sender<W>,
    served: &Arc<AtomicUsize>,
) {
    served.fetch_add(1, Ordering::AcqRel);
    let count = Arc::clone(served);
    let fallback = stream.try_clone();
    let spawned = thread::Builder::new().name("epilog-gate-conn".to_owned()).spawn(move || {
        if let Err(e) = answer(&stream, accepted + CONNECTION_DEADLINE, &tx) {
            tracing::warn!(error = %e, "epilog gate: a request failed");
        }
        count.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(e) = spawned {
        served.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(error = %e, "epilog gate: cannot start a thread");
        if let Ok(s) = fallback {
            refuse(&s, "busy");
        }
    }
}

/// Answers `unknown WHY` without waiting, and closes.
fn refuse(stream: &UnixStream, why: &str) {
    let _ = stream.set_nonblocking(true);
    let mut out = stream;
    let _ = writeln!(out, "{}", Answer::Unknown(why.to_owned()).line());
}

/// The time left before `deadline`, or a timeout error once it has passed.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the connection's deadline passed"));
    }
    Ok(left)
}

/// Reads the request line (at most [`MAX_LINE`] bytes) by `deadline`,
/// however the client sends it.
fn read_request(stream: &UnixStream, deadline: Instant) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut chunk = [0_u8; 64];
    let mut reader = stream;
    while !line.contains(&b'\n') && line.len() < MAX_LINE {
        reader.set_read_timeout(Some(left(deadline)?))?;
        match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no request in time"));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Serves one connection by `deadline`: root only, one line in, one out.
fn answer<W: From<Request>>(stream: &UnixStream, deadline: Instant, tx: &Sender<W>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut out = stream;
    let uid = rustix::net::sockopt::socket_peercred(stream)
        .map(|c| c.uid.as_raw())
        .map_err(std::io::Error::from)?;
    let reply = |out: &mut &UnixStream, a: &Answer| -> std::io::Result<()> {
        out.set_write_timeout(Some(left(deadline)?))?;
        writeln!(out, "{}", a.line())
    };
    if uid != 0 {
        return reply(&mut out, &Answer::Unknown(format!("refused: uid {uid} is not root")));
    }
    let line = read_request(stream, deadline.min(Instant::now() + REQUEST_DEADLINE))?;
    let job = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["check"] => None,
        ["check", j] => j.parse().ok(),
        _ => return reply(&mut out, &Answer::Unknown("bad request".to_owned())),
    };
    let (tell, answered) = mpsc::sync_channel(1);
    if tx.send(Request { job, reply: tell }.into()).is_err() {
        return reply(&mut out, &Answer::Unknown("the daemon is stopping".to_owned()));
    }
    let a = answered
        .recv_timeout(left(deadline)?)
        .unwrap_or_else(|_| Answer::Unknown("no pass within the deadline".to_owned()));
    reply(&mut out, &a)
}

/// The daemon's side, after a pass: every request in `waiting` (all taken
/// in before the pass started) gets the pass's answer (`drained`: the agent holds a drain of the node now).
pub fn answer_all(waiting: &mut Vec<Request>, report: &Report, drained: bool) {
    if waiting.is_empty() {
        return;
    }
    let a = Answer::of(report, drained);
    for r in waiting.drain(..) {
        tracing::info!(job = ?r.job, answer = %a.line(), "epilog gate");
        let _ = r.reply.send(a.clone());
    }
}

/// `gpu-node-agent epilog`: asks the daemon, within `deadline`; the exit
/// status (1 only for an unhealthy node) and the one line to log.
pub fn ask(run_dir: &Path, job: Option<u32>, deadline: Duration) -> (u8, String) {
    ask_server_of(run_dir, job, deadline, 0)
}

/// [`ask`], trusting only a server running as `uid` (root's 0 but in tests).
fn ask_server_of(run_dir: &Path, job: Option<u32>, deadline: Duration, uid: u32) -> (u8, String) {
    let started = Instant::now();
    let until = started + deadline;
    let result = (|| -> std::io::Result<Answer> {
        let mut s = UnixStream::connect(socket_path(run_dir))?;
        // The socket's owner is whoever bound it: an answer is taken only
        // from the agent itself, root (SO_PEERCRED: the server's
        // credentials when it listened).
        let server = rustix::net::sockopt::socket_peercred(&s).map_err(std::io::Error::from)?.uid.as_raw();
        if server != uid {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("the socket's server runs as uid {server}, not root: not trusted"),
            ));
        }
        s.set_write_timeout(Some(left(until)?))?;
        let request = job.map_or_else(|| "check".to_owned(), |j| format!("check {j}"));
        writeln!(s, "{request}")?;
        let mut reply = Vec::new();
        let mut chunk = [0_u8; 256];
        while !reply.contains(&b'\n') && reply.len() < 4096 {
            s.set_read_timeout(Some(left(until)?))?;
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let line = String::from_utf8_lossy(&reply);
        Ok(Answer::parse(line.lines().next().unwrap_or_default()))
    })();
    let took = started.elapsed().as_millis();
    match result {
        Ok(Answer::Unhealthy(r)) => (
            1,
            format!(
                "gpu-node-agent epilog: node unhealthy ({r}), drained by the agent; failing the Epilog ({took} ms)"
            ),
        ),
        Ok(Answer::Healthy) => (0, format!("gpu-node-agent epilog: healthy ({took} ms)")),
        Ok(Answer::Unknown(w)) => {
            (0, format!("gpu-node-agent epilog: the agent cannot tell ({w}); Epilog not failed ({took} ms)"))
        }
        Err(e) => (
            0,
            format!("gpu-node-agent epilog: no answer from the agent ({e}); Epilog not failed ({took} ms)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_back() {
        for a in [
            Answer::Healthy,
            Answer::Unhealthy("gpu: xid79 gpu3 lost".into()),
            Answer::Unknown("NVML hung".into()),
        ] {
            assert_eq!(Answer::parse(&a.line()), a);
        }
        assert!(matches!(Answer::parse("garbage"), Answer::Unknown(_)));
        assert_eq!(Answer::Unhealthy("a\nb".into()).line(), "unhealthy a b");
    }

    #[test]
    fn no_daemon_never_fails_the_epilog() {
        let dir = std::env::temp_dir().join(format!("gate-none-{}", std::process::id()));
        let (code, line) = ask(&dir, Some(7), Duration::from_millis(200));
        assert_eq!(code, 0, "{line}");
        assert!(line.contains("no answer from the agent"), "{line}");
    }

    /// A daemon stand-in: listens in a fresh directory and answers every
    /// request with `a` at once.
    fn serving(name: &str, a: Answer) -> (PathBuf, Arc<AtomicBool>) {
        let dir = std::env::temp_dir().join(format!("gate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Request>();
        listen(&dir, tx, Arc::clone(&stop)).unwrap_or_else(|e| panic!("{e}"));
        thread::spawn(move || {
            for r in rx {
                let _ = r.reply.send(a.clone());
            }
        });
        (dir, stop)
    }

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    #[test]
    fn a_server_of_another_uid_is_never_trusted() {
        let (dir, stop) = serving("uid", Answer::Unhealthy("gpu: xid79 gpu3 x".into()));
        let (code, line) = ask_server_of(&dir, Some(7), Duration::from_secs(2), me());
        assert_eq!(code, 1, "{line}");
        // The same server, were root another uid: never believed, never failing.
        let (code, line) = ask_server_of(&dir, Some(7), Duration::from_secs(2), me().wrapping_add(1));
        assert_eq!(code, 0, "{line}");
        assert!(line.contains("not trusted"), "{line}");
        stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_silent_client_holds_up_no_other() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let (dir, stop) = serving("silent", Answer::Healthy);
        let silent: Vec<UnixStream> = (0..3)
            .map(|_| UnixStream::connect(socket_path(&dir)).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let t = Instant::now();
        let (code, line) = ask(&dir, Some(8), Duration::from_secs(5));
        let took = t.elapsed();
        assert_eq!(code, 0, "{line}");
        assert!(line.contains("healthy"), "{line}");
        assert!(took < Duration::from_millis(500), "held up by silent clients: {took:?}");
        // Each silent client is let go at the request's deadline.
        for mut s in silent {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap_or_else(|e| panic!("{e}"));
            let mut buf = [0_u8; 16];
            assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
        }
        assert!(t.elapsed() < REQUEST_DEADLINE + Duration::from_millis(500), "{:?}", t.elapsed());
        stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_deadline_for_the_whole_request_however_slowly_it_comes() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let (dir, stop) = serving("dribble", Answer::Healthy);
        let s = UnixStream::connect(socket_path(&dir)).unwrap_or_else(|e| panic!("{e}"));
        let t = Instant::now();
        let mut w = s.try_clone().unwrap_or_else(|e| panic!("{e}"));
        // One byte every 300 ms, never a whole line: cut off at the request's
        // deadline, not 2 s after the last byte.
        let writer = thread::spawn(move || {
            for b in b"check 1234567890" {
                if w.write_all(&[*b]).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(300));
            }
        });
        let mut r = &s;
        r.set_read_timeout(Some(Duration::from_secs(10))).unwrap_or_else(|e| panic!("{e}"));
        let mut buf = [0_u8; 16];
        let _ = r.read(&mut buf);
        let closed = t.elapsed();
        let _ = writer.join();
        assert!(closed < REQUEST_DEADLINE + Duration::from_millis(500), "{closed:?}");
        stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_request_waiting_when_a_pass_ends_gets_its_answer() {
        let report = Report {
            samples: Vec::new(),
            faults: Vec::new(),
            problems: Vec::new(),
            actions: Vec::new(),
            verdict: Verdict::Healthy,
            node: None,
            state_ok: true,
            reboot_cap: false,
        };
        let mut waiting = Vec::new();
        let mut answers = Vec::new();
        for job in 1..=3 {
            let (reply, rx) = mpsc::sync_channel(1);
            waiting.push(Request { job: Some(job), reply });
            answers.push(rx);
        }
        answer_all(&mut waiting, &report, false);
        assert!(waiting.is_empty());
        for rx in answers {
            assert_eq!(rx.try_recv().ok(), Some(Answer::Healthy));
        }
    }

    #[test]
    fn a_daemon_that_answers_late_never_fails_the_epilog() {
        let dir = std::env::temp_dir().join(format!("gate-slow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Request>();
        listen(&dir, tx, Arc::clone(&stop)).unwrap_or_else(|e| panic!("{e}"));
        // The loop never takes the request in: the command gives up at its deadline.
        let t = Instant::now();
        let (code, line) = ask(&dir, Some(7), Duration::from_millis(300));
        assert_eq!(code, 0, "{line}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        drop(rx);
        stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
