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
//! The socket is `run_dir/agent.sock`, mode 0600 in a root-only directory,
//! and the daemon answers only root (`SO_PEERCRED`). One request per
//! connection, one line each way: `check JOBID` → `healthy`,
//! `unhealthy REASON` or `unknown WHY`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread;
use std::time::{Duration, Instant};

use crate::agent::{Report, Verdict};

/// The socket's name in `run_dir`.
pub const SOCKET: &str = "agent.sock";
/// How long `epilog` waits for the daemon's answer by default: well under
/// Slurm's epilog limits (`PrologEpilogTimeout`, 26.05's `EpilogTimeout`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);
/// Longest request line read.
const MAX_LINE: u64 = 256;

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

/// Listens on `run_dir/agent.sock` and hands each request to the daemon's
/// loop through `tx`, until `stop` is set.
///
/// # Errors
/// The socket cannot be made.
pub fn listen(run_dir: &Path, tx: Sender<Request>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    std::fs::create_dir_all(run_dir)?;
    let path = socket_path(run_dir);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    thread::Builder::new().name("epilog-gate".to_owned()).spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(stream, &tx) {
                        tracing::warn!(error = %e, "epilog gate: a request failed");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "epilog gate: accept failed");
                    thread::sleep(Duration::from_millis(500));
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    })?;
    Ok(())
}

/// Serves one connection: root only, one line in, one out.
fn answer(stream: UnixStream, tx: &Sender<Request>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let uid = rustix::net::sockopt::socket_peercred(&stream)
        .map(|c| c.uid.as_raw())
        .map_err(std::io::Error::from)?;
    let mut out = stream.try_clone()?;
    if uid != 0 {
        writeln!(out, "{}", Answer::Unknown(format!("refused: uid {uid} is not root")).line())?;
        return Ok(());
    }
    let mut line = String::new();
    BufReader::new(std::io::Read::take(&stream, MAX_LINE)).read_line(&mut line)?;
    let job = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["check"] => None,
        ["check", j] => j.parse().ok(),
        _ => {
            writeln!(out, "{}", Answer::Unknown("bad request".to_owned()).line())?;
            return Ok(());
        }
    };
    let (reply, answered) = mpsc::sync_channel(1);
    if tx.send(Request { job, reply }).is_err() {
        writeln!(out, "{}", Answer::Unknown("the daemon is stopping".to_owned()).line())?;
        return Ok(());
    }
    let a = answered
        .recv_timeout(DEFAULT_DEADLINE)
        .unwrap_or_else(|_| Answer::Unknown("no pass within the deadline".to_owned()));
    writeln!(out, "{}", a.line())
}

/// The daemon's side of a request, in its loop: `pass` runs one pass now
/// (with `act`: the drain is made before the answer) and says whether the
/// agent then holds a drain of the node.
pub fn serve_requests(requests: &Receiver<Request>, mut pass: impl FnMut() -> (Report, bool)) {
    let waiting: Vec<Request> = requests.try_iter().collect();
    if waiting.is_empty() {
        return;
    }
    let (report, drained) = pass();
    let a = Answer::of(&report, drained);
    for r in waiting {
        tracing::info!(job = ?r.job, answer = %a.line(), "epilog gate");
        let _ = r.reply.send(a.clone());
    }
}

/// `gpu-node-agent epilog`: asks the daemon, within `deadline`; the exit
/// status (1 only for an unhealthy node) and the one line to log.
pub fn ask(run_dir: &Path, job: Option<u32>, deadline: Duration) -> (u8, String) {
    let started = Instant::now();
    let result = (|| -> std::io::Result<Answer> {
        let mut s = UnixStream::connect(socket_path(run_dir))?;
        s.set_write_timeout(Some(deadline))?;
        s.set_read_timeout(Some(deadline))?;
        let request = job.map_or_else(|| "check".to_owned(), |j| format!("check {j}"));
        writeln!(s, "{request}")?;
        let mut line = String::new();
        BufReader::new(std::io::Read::take(&s, 4096)).read_line(&mut line)?;
        Ok(Answer::parse(&line))
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
            (0, format!("gpu-node-agent epilog: the agent cannot tell ({w}); Epilog not failed"))
        }
        Err(e) => (0, format!("gpu-node-agent epilog: no answer from the agent ({e}); Epilog not failed")),
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

    #[test]
    fn a_daemon_that_answers_late_never_fails_the_epilog() {
        let dir = std::env::temp_dir().join(format!("gate-slow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
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
