//! Slurm's read-only commands as `why`, `autopsy`, `usage` and `lint` run
//! them: each under one deadline, its process group killed at it (through
//! `bounded-command`), its first error line kept.

use std::process::Command;
use std::time::Duration;

use bounded_command::RunError;

/// How long one Slurm command may take.
const DEADLINE: Duration = Duration::from_secs(20);

/// The first non-empty line of a command's error output.
pub(crate) fn first_line(s: &str) -> String {
    slurm_formats::text::clip(s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or(""), 200)
}

/// Runs `program` under `deadline`, its process group killed at it; its
/// output whatever its exit status, or why it did not run to its end.
pub(crate) fn run(
    program: &str,
    args: &[String],
    deadline: Duration,
) -> Result<bounded_command::Output, String> {
    bounded_command::run(Command::new(program).args(args), deadline).map_err(|e| match e {
        RunError::Timeout => format!(
            "{program} did not answer within {} s: is the Slurm controller (or slurmdbd) reachable?",
            deadline.as_secs()
        ),
        RunError::Spawn(e) => {
            format!("cannot run {program}: {e} (is the Slurm client installed and on PATH?)")
        }
    })
}

/// How long `why` waits for accounting (`sacct`) where slurmctld's record
/// already answered or accounting only adds to the answer: a stopped or
/// hung slurmdbd makes `sacct` wait for it far longer.
pub(crate) const ACCOUNTING_DEADLINE: Duration = Duration::from_secs(8);

/// Runs a read-only Slurm command under a deadline (so a hung controller
/// cannot hang the user's shell; its process group is killed at it);
/// `Err` holds its first error line.
pub(crate) fn slurm(program: &str, args: &[&str]) -> Result<String, String> {
    slurm_within(program, args, DEADLINE)
}

/// [`slurm`] under `deadline`.
pub(crate) fn slurm_within(program: &str, args: &[&str], deadline: Duration) -> Result<String, String> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = run(program, &args, deadline)?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let line = first_line(&out.stderr);
    Err(if line.is_empty() { format!("{program} failed ({})", out.status) } else { line })
}
