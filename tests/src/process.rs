//! Small process helpers.

use crate::*;

/// Runs a command to completion, failing on a non-zero exit with its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| LabError(format!("{cmd:?}: {e}")))?;
    if !out.status.success() {
        return err(format!(
            "{cmd:?} failed ({}{}): {}",
            out.status,
            timed_out_note(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// Words for an exit status that `timeout(1)` gives a command it ended
/// ([`Lab::limit_commands`]), empty for any other.
pub fn timed_out_note(status: std::process::ExitStatus) -> &'static str {
    match status.code() {
        Some(124 | 137) => {
            ", which is how timeout(1) reports a command it ended: past the lab's command limit"
        }
        _ => "",
    }
}

pub(crate) fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args)).map(drop)
}

/// The start time of a process (field 22 of `/proc/PID/stat`), which tells a
/// live process from a later one that reused its PID.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(crate) fn alive(pid: u32, started: u64) -> bool {
    start_time(pid) == Some(started)
}

pub(crate) fn kill(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) takes plain integers and has no memory effects here.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Waits until `f` returns true or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    wait_every(Duration::from_millis(50), timeout, f)
}

/// [`wait_until`], asking every `interval`.
pub(crate) fn wait_every(interval: Duration, timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(interval);
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub(crate) fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
        || Path::new("/usr/sbin").join(tool).is_file()
        || Path::new("/sbin").join(tool).is_file()
}

pub(crate) fn hostname() -> Result<String> {
    let out = run(&mut Command::new("hostname"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self_is_known_and_stable() {
        let me = std::process::id();
        let t = start_time(me);
        assert!(t.is_some());
        assert_eq!(t, start_time(me));
        assert!(alive(me, t.unwrap_or(0)));
    }
}
