//! Running another program (the agent's `scontrol` and `slurmd -G`, the
//! `spank-gpu` command's `scontrol`, `sacct` and `sinfo`) under one deadline
//! for its exit and its output together. Not for the plugin: it starts threads.
//!
//! The program runs in a process group of its own. At the deadline the
//! whole group is killed, not only the program: a site's wrapper around
//! `scontrol` (auditing, `sudo`, a logger) that left a child behind would
//! otherwise keep the pipes open and the caller waiting. A program that has
//! exited is given [`LINGER`] for whatever it left behind to close its
//! output; then that group is killed too. Its output is read as it comes, so
//! what was written before the end is never lost. A process that left the
//! group (`setsid`) and still holds the pipes only keeps its reader thread
//! waiting, never the caller.

#![forbid(unsafe_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long the output may stay open after the program exited.
pub const LINGER: Duration = Duration::from_millis(500);
/// How long to wait for the output to close once the group is killed.
const AFTER_KILL: Duration = Duration::from_millis(200);
/// How often the program's exit is looked at.
const TICK: Duration = Duration::from_millis(5);

/// What a program did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// How it exited.
    pub status: ExitStatus,
    /// Its standard output (invalid UTF-8 replaced).
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Why there is no [`Output`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunError {
    /// It could not be started (or waited for): the OS error.
    Spawn(String),
    /// It had not exited at the deadline; its process group was killed.
    Timeout,
}

/// A chunk of one of the two pipes, or its end.
enum Chunk {
    Data(bool, Vec<u8>),
    End(bool),
}

fn reader(mut pipe: impl Read + Send + 'static, err: bool, tx: mpsc::Sender<Chunk>) -> std::io::Result<()> {
    std::thread::Builder::new().name("cmd-output".to_owned()).spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(Chunk::Data(err, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Chunk::End(err));
    })?;
    Ok(())
}

/// Kills process group `pgid` (the program and everything it started that
/// stayed in its group) with `kill -9 -- -PGID`; if `kill` cannot run, the
/// program alone.
fn kill_group(child: &mut Child) {
    let pgid = child.id();
    let killed = Command::new("kill")
        .args(["-9", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !killed.is_ok_and(|s| s.success()) {
        let _ = child.kill();
    }
}

/// Runs `cmd` (stdin from /dev/null) until it exits and its output closes,
/// or until `timeout` (see the module docs).
///
/// # Errors
/// It cannot be started, or is still running at the deadline.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Output, RunError> {
    let deadline = Instant::now() + timeout;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| RunError::Spawn(e.to_string()))?;
    let (tx, rx) = mpsc::channel();
    let mut open = [false, false];
    if let Some(p) = child.stdout.take() {
        open[0] = reader(p, false, tx.clone()).is_ok();
    }
    if let Some(p) = child.stderr.take() {
        open[1] = reader(p, true, tx).is_ok();
    }
    let mut text = [Vec::new(), Vec::new()];
    let mut take = |rx: &Receiver<Chunk>, wait: Duration, open: &mut [bool; 2]| match rx.recv_timeout(wait) {
        Ok(Chunk::Data(err, bytes)) => text[usize::from(err)].extend_from_slice(&bytes),
        Ok(Chunk::End(err)) => open[usize::from(err)] = false,
        Err(RecvTimeoutError::Disconnected) => *open = [false, false],
        Err(RecvTimeoutError::Timeout) => {}
    };
    let mut exited: Option<(ExitStatus, Instant)> = None;
    loop {
        if exited.is_none() {
            match child.try_wait() {
                Ok(Some(status)) => exited = Some((status, Instant::now())),
                Ok(None) => {}
                Err(e) => {
                    kill_group(&mut child);
                    let _ = child.wait();
                    return Err(RunError::Spawn(e.to_string()));
                }
            }
        }
        let now = Instant::now();
        match exited {
            Some(_) if open == [false, false] => break,
            Some((_, at)) if now >= deadline.min(at + LINGER) => {
                // What it left behind still holds the output.
                kill_group(&mut child);
                let until = Instant::now() + AFTER_KILL;
                while open != [false, false] && Instant::now() < until {
                    take(&rx, until.saturating_duration_since(Instant::now()), &mut open);
                }
                break;
            }
            None if now >= deadline => {
                kill_group(&mut child);
                let _ = child.wait();
                return Err(RunError::Timeout);
            }
            _ => {}
        }
        if open == [false, false] {
            std::thread::sleep(TICK);
        } else {
            take(&rx, TICK, &mut open);
        }
    }
    // Take what is already there without waiting.
    while let Ok(c) = rx.try_recv() {
        if let Chunk::Data(err, bytes) = c {
            text[usize::from(err)].extend_from_slice(&bytes);
        }
    }
    let status = exited.map(|(s, _)| s).ok_or_else(|| RunError::Spawn("no exit status".to_owned()))?;
    let [out, err] = text;
    Ok(Output {
        status,
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    fn alive(pid: &str) -> bool {
        std::path::Path::new(&format!("/proc/{}", pid.trim())).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
                .unwrap_or_default()
                .contains(") Z ")
    }

    #[test]
    fn output_and_status_come_back() {
        let o = run(&mut sh("echo out; echo err >&2; exit 3"), Duration::from_secs(10)).unwrap();
        assert_eq!((o.stdout.as_str(), o.stderr.as_str(), o.status.code()), ("out\n", "err\n", Some(3)));
        // More than a pipe holds.
        let o = run(&mut sh("head -c 4000000 /dev/zero | tr '\\0' x"), Duration::from_secs(20)).unwrap();
        assert_eq!(o.stdout.len(), 4_000_000);
        assert!(matches!(
            run(&mut Command::new("/nonexistent/x"), Duration::from_secs(1)),
            Err(RunError::Spawn(_))
        ));
    }

    #[test]
    fn a_child_left_behind_holding_the_output_neither_delays_the_answer_nor_outlives_it() {
        let dir = std::env::temp_dir().join(format!("agent-cmd-left-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid = dir.join("pid");
        let t = Instant::now();
        let o = run(
            &mut sh(&format!("sleep 30 & echo $! > {}; echo NodeName=n1", pid.display())),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(3), "waited {:?} for a child left behind", t.elapsed());
        assert_eq!((o.stdout.as_str(), o.status.success()), ("NodeName=n1\n", true));
        let left = std::fs::read_to_string(&pid).unwrap();
        let t = Instant::now();
        while alive(&left) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(&left), "the child left behind was not killed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn at_the_deadline_the_whole_group_is_killed() {
        let dir = std::env::temp_dir().join(format!("agent-cmd-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid = dir.join("pid");
        let t = Instant::now();
        let e = run(
            &mut sh(&format!("sleep 30 & echo $! > {}; sleep 30", pid.display())),
            Duration::from_millis(500),
        )
        .unwrap_err();
        assert_eq!(e, RunError::Timeout);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let child = std::fs::read_to_string(&pid).unwrap();
        let t = Instant::now();
        while alive(&child) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(&child), "a child of the timed-out program lives on");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
