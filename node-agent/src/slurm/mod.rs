//! Talking to Slurm through `scontrol`, every call under one deadline for
//! its exit and its output ([`bounded_command`]: its process group is killed
//! at the deadline, whatever a site's wrapper left running).
//!
//! The parsers of `scontrol show node` output are pure and tested on text.
//! [`release`]: whether the plugin the plugstack files list fits the node's
//! Slurm release (`slurmd -V`).

pub mod release;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bounded_command::{self as command, RunError};
use gpu_health::admin_comment;
use slurm_formats::release::{Release, Version};

/// A failed or slow `scontrol`: never a reason to drain, always one to
/// report the agent unhealthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmError {
    /// The command line, `scontrol show node node1`.
    pub cmd: String,
    /// What went wrong.
    pub kind: SlurmErrorKind,
}

/// What went wrong with one `scontrol` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlurmErrorKind {
    /// It could not be started (or waited for): the OS error.
    Spawn(String),
    /// It gave no answer within the deadline and was killed.
    Timeout(Duration),
    /// It exited unsuccessfully.
    Failed {
        /// The exit status, as the OS prints it.
        status: String,
        /// Its stderr, trimmed.
        stderr: String,
        /// Its stdout, trimmed (scontrol prints some errors there: `Node X not found`).
        stdout: String,
    },
    /// It answered, but Slurm knows no node by any of these names (the
    /// host's names, tried in turn).
    UnknownNode(Vec<String>),
    /// It answered, but Slurm no longer knows the node it knew by this name.
    NodeGone(String),
}

impl SlurmError {
    /// Whether `scontrol` failed and said `text` on stderr or stdout.
    fn said(&self, text: &str) -> bool {
        matches!(&self.kind, SlurmErrorKind::Failed { stderr, stdout, .. } if stderr.contains(text) || stdout.contains(text))
    }
}

impl std::fmt::Display for SlurmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cmd = &self.cmd;
        match &self.kind {
            SlurmErrorKind::Spawn(e) => write!(f, "{cmd}: {e}"),
            SlurmErrorKind::Timeout(t) => write!(f, "{cmd}: no answer within {t:?}"),
            SlurmErrorKind::Failed { status, stderr, stdout } => {
                let said = if stderr.is_empty() { stdout.lines().next().unwrap_or("") } else { stderr };
                write!(f, "{cmd} failed ({status}): {said}")
            }
            SlurmErrorKind::NodeGone(name) => write!(f, "Slurm knows no node {name}"),
            SlurmErrorKind::UnknownNode(names) => write!(
                f,
                "Slurm knows no node named {}; set node_name in the configuration",
                names.join(" or ")
            ),
        }
    }
}

impl std::error::Error for SlurmError {}

pub use slurm_formats::node::{NodeInfo, parse_nodes};

/// `scontrol` under a deadline.
#[derive(Clone, Debug)]
pub struct Slurm {
    /// The program.
    pub scontrol: PathBuf,
    /// Deadline per call.
    pub timeout: Duration,
}

impl Slurm {
    /// Runs `scontrol ARGS` (or whichever program `scontrol` names: the
    /// release check runs `slurmd -V` this way); its stdout on success.
    ///
    /// # Errors
    /// It could not start, ran past the deadline (it is killed), or failed.
    pub(crate) fn run(&self, args: &[&str]) -> Result<String, SlurmError> {
        let err = |kind| SlurmError { cmd: format!("{} {}", self.scontrol.display(), args.join(" ")), kind };
        let out =
            command::run(Command::new(&self.scontrol).args(args), self.timeout).map_err(|e| match e {
                RunError::Spawn(e) => err(SlurmErrorKind::Spawn(e)),
                RunError::Timeout => err(SlurmErrorKind::Timeout(self.timeout)),
            })?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(err(SlurmErrorKind::Failed {
                status: out.status.to_string(),
                stderr: out.stderr.trim().to_owned(),
                stdout: slurm_formats::text::clip(out.stdout.trim(), 2000),
            }))
        }
    }

    /// One node; `Ok(None)` when Slurm has no node of that name.
    ///
    /// # Errors
    /// scontrol failed.
    pub fn node(&self, name: &str) -> Result<Option<NodeInfo>, SlurmError> {
        match self.run(&["show", "node", name]) {
            Ok(out) => Ok(parse_nodes(&out).into_iter().find(|n| n.name == name)),
            Err(e) if e.said(&format!("Node {name} not found")) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The first of `names` that Slurm knows, with its description.
    ///
    /// # Errors
    /// scontrol failed, or knows none of them.
    pub fn find_node(&self, names: &[String]) -> Result<NodeInfo, SlurmError> {
        for name in names {
            if let Some(node) = self.node(name)? {
                return Ok(node);
            }
        }
        Err(SlurmError {
            cmd: format!("{} show node", self.scontrol.display()),
            kind: SlurmErrorKind::UnknownNode(names.to_vec()),
        })
    }

    /// Cancels a reboot the agent asked for (and the drain it came with).
    ///
    /// # Errors
    /// scontrol failed.
    pub fn cancel_reboot(&self, name: &str) -> Result<(), SlurmError> {
        self.run(&["cancel_reboot", name]).map(drop)
    }

    /// Every node of the cluster.
    ///
    /// # Errors
    /// scontrol failed.
    pub fn nodes(&self) -> Result<Vec<NodeInfo>, SlurmError> {
        Ok(parse_nodes(&self.run(&["show", "nodes"])?))
    }

    /// Drains `name` with `reason`.
    ///
    /// # Errors
    /// scontrol failed.
    pub fn drain(&self, name: &str, reason: &str) -> Result<(), SlurmError> {
        self.run(&["update", &format!("NodeName={name}"), "State=DRAIN", &format!("Reason={reason}")])
            .map(drop)
    }

    /// Drains `name` now and has Slurm reboot it once idle, then resume it.
    ///
    /// # Errors
    /// scontrol failed.
    pub fn reboot_asap(&self, name: &str, reason: &str) -> Result<(), SlurmError> {
        self.run(&["reboot", "ASAP", "nextstate=RESUME", &format!("reason={reason}"), name]).map(drop)
    }

    /// Resumes `name`. A node that is no longer drained counts as resumed.
    ///
    /// # Errors
    /// scontrol failed otherwise.
    pub fn resume(&self, name: &str) -> Result<(), SlurmError> {
        match self.run(&["update", &format!("NodeName={name}"), "State=RESUME"]) {
            Ok(_) => Ok(()),
            Err(e) if e.said("Invalid node state specified") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Slurm's accounting (slurmdbd) through `sacct` and `sacctmgr`, under a
/// deadline: where a job's `AdminComment` can still be written once the job
/// has ended (slurmctld refuses any update of a finished job, COMPLETING
/// included: job_mgr.c `update_job`'s `IS_JOB_FINISHED` check, 22.05 to
/// 26.05), and where `sacct` keeps it.
#[derive(Clone, Debug)]
pub struct Accounting {
    /// The `sacct` program.
    pub sacct: PathBuf,
    /// The `sacctmgr` program.
    pub sacctmgr: PathBuf,
    /// Deadline per call.
    pub timeout: Duration,
}

impl Accounting {
    fn run(&self, program: &Path, args: &[&str]) -> Result<String, SlurmError> {
        Slurm { scontrol: program.to_path_buf(), timeout: self.timeout }.run(args)
    }

    /// The job's rows in slurmdbd: `sacct -j JOB -X` with both comments,
    /// delimited by a random token of this call's own so that a comment may
    /// hold anything ([`admin_comment::sacct_args`],
    /// [`admin_comment::parse_rows`]). For the raw id of an array task that
    /// holds the array's id, or of a het job's leader, sacct prints every
    /// task or component: the job's row is the one whose `raw` is `job`.
    /// Empty when slurmdbd has no such job. One slurmdbd RPC.
    ///
    /// # Errors
    /// sacct failed, or printed what does not read.
    pub fn rows(&self, job: u32) -> Result<Vec<admin_comment::Row>, String> {
        let token = admin_comment::new_token();
        let args = admin_comment::sacct_args(&job.to_string(), &token);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.run(&self.sacct, &args).map_err(|e| e.to_string())?;
        admin_comment::parse_rows(&out, &token)
    }

    /// Sets one comment of the job row `id` addresses (`N`, `A_T`, `H+O`:
    /// [`admin_comment::write_id`]) in slurmdbd. One slurmdbd RPC (and its commit).
    ///
    /// # Errors
    /// sacctmgr failed.
    pub fn set_comment(&self, id: &str, field: admin_comment::Field, text: &str) -> Result<(), SlurmError> {
        let (cond, set) = (format!("jobid={id}"), format!("{}={text}", field.name()));
        self.run(&self.sacctmgr, &["-i", "modify", "job", "where", &cond, "set", &set]).map(drop)
    }

    /// The release of `sacctmgr` (`sacctmgr -V`, which asks no daemon): what
    /// it does to a comment depends on it ([`admin_comment::Rules`]).
    ///
    /// # Errors
    /// sacctmgr failed or printed no version.
    pub fn release(&self) -> Result<Release, String> {
        let out = self.run(&self.sacctmgr, &["-V"]).map_err(|e| e.to_string())?;
        Version::parse(&out)
            .map(|v| v.release)
            .ok_or_else(|| format!("{} -V printed no version: {}", self.sacctmgr.display(), out.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_large_answer_does_not_block() {
        // 4 MB on stdout: far more than a pipe holds.
        let slurm = Slurm { scontrol: PathBuf::from("sh"), timeout: Duration::from_secs(20) };
        let t = Instant::now();
        let out = slurm.run(&["-c", "head -c 4000000 /dev/zero | tr '\\\\0' x"]).unwrap();
        assert_eq!(out.len(), 4_000_000);
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_slow_scontrol_is_cut_off() {
        let slurm = Slurm { scontrol: PathBuf::from("sleep"), timeout: Duration::from_millis(100) };
        let t = Instant::now();
        let e = slurm.run(&["5"]).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(e.kind, SlurmErrorKind::Timeout(Duration::from_millis(100)));
        assert_eq!(e.to_string(), "sleep 5: no answer within 100ms");
        let missing =
            Slurm { scontrol: PathBuf::from("/nonexistent/scontrol"), timeout: Duration::from_secs(1) };
        let e = missing.node("x").unwrap_err();
        assert!(matches!(e.kind, SlurmErrorKind::Spawn(_)), "{e:?}");
        assert_eq!(e.cmd, "/nonexistent/scontrol show node x");
    }

    #[test]
    fn a_failed_scontrol_keeps_its_status_and_stderr() {
        let slurm = Slurm { scontrol: PathBuf::from("sh"), timeout: Duration::from_secs(20) };
        let e = slurm.run(&["-c", "echo 'Node x not found' >&2; exit 1"]).unwrap_err();
        assert!(
            matches!(&e.kind, SlurmErrorKind::Failed { stderr, .. } if stderr == "Node x not found"),
            "{e:?}"
        );
        assert!(e.to_string().ends_with("failed (exit status: 1): Node x not found"), "{e}");
        assert!(e.said("not found") && !e.said("Invalid node state"));
    }

    /// scontrol prints "Node X not found" on stdout and exits 1, on every
    /// release (scontrol/info_node.c, 22.05 to 26.05).
    #[test]
    fn an_unknown_node_is_unknown_not_an_scontrol_failure() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("agent-slurm-unknown-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sc = dir.join("scontrol");
        std::fs::write(&sc, "#!/bin/sh\necho \"Node $3 not found\"\nexit 1\n").unwrap();
        std::fs::set_permissions(&sc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let slurm = Slurm { scontrol: sc, timeout: Duration::from_secs(10) };
        assert_eq!(slurm.node("node8"), Ok(None));
        let e = slurm.find_node(&["node8".to_owned(), "node8.example.org".to_owned()]).unwrap_err();
        assert!(matches!(&e.kind, SlurmErrorKind::UnknownNode(n) if n.len() == 2), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
