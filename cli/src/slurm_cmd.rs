//! Slurm's read-only commands as `why`, `autopsy`, `usage` and `lint` run
//! them: each under one deadline, its process group killed at it (through
//! `bounded-command`), its first error line kept.

use std::process::Command;
use std::time::Duration;

use bounded_command::RunError;

/// How long one Slurm command may take.
const DEADLINE: Duration = Duration::from_secs(20);

/// The first non-empty line of a command's error output.
fn first_line(s: &str) -> String {
    slurm_formats::text::clip(s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or(""), 200)
}

/// Runs a read-only Slurm command under a deadline (so a hung controller
/// cannot hang the user's shell; its process group is killed at it);
/// `Err` holds its first error line.
pub(crate) fn slurm(program: &str, args: &[&str]) -> Result<String, String> {
    let out = match bounded_command::run(Command::new(program).args(args), DEADLINE) {
        Ok(out) => out,
        Err(RunError::Timeout) => {
            return Err(format!(
                "{program} did not answer within {} s: is the Slurm controller (or slurmdbd) reachable?",
                DEADLINE.as_secs()
            ));
        }
        Err(RunError::Spawn(e)) => {
            return Err(format!("cannot run {program}: {e} (is the Slurm client installed and on PATH?)"));
        }
    };
    if out.status.success() {
        return Ok(out.stdout);
    }
    let line = first_line(&out.stderr);
    Err(if line.is_empty() { format!("{program} failed ({})", out.status) } else { line })
}
