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

/// One node as `scontrol show node` describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `NodeName`.
    pub name: String,
    /// `State`, e.g. `IDLE+DRAIN`, `MIXED`, `DOWN+NOT_RESPONDING`.
    pub state: String,
    /// `Reason` without Slurm's ` [user@time]` suffix.
    pub reason: Option<String>,
    /// When the reason was set, from that suffix (`2026-11-29T17:14:37`).
    pub reason_time: Option<String>,
    /// Physical GPUs in `Gres=` (`gpu[:type]:N`); MIG slices are not GPUs.
    pub gres_gpus: Option<u32>,
    /// MIG slices in `Gres=` (`gpu:1g.10gb:28`).
    pub gres_mig: u32,
}

impl NodeInfo {
    /// Whether the node is drained, draining, down or failing: someone took
    /// it out of service.
    pub fn out_of_service(&self) -> bool {
        self.state
            .split('+')
            .any(|f| matches!(f, "DRAIN" | "DRAINED" | "DRAINING" | "DOWN" | "FAIL" | "FAILING"))
    }

    /// Whether the node is drained or draining (by anyone): what the fleet guard counts.
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|f| matches!(f, "DRAIN" | "DRAINED" | "DRAINING" | "FAIL" | "FAILING"))
    }

    /// Whether Slurm configures GPUs (or MIG slices) on the node.
    pub fn has_gpus(&self) -> bool {
        self.gres_gpus.is_some_and(|n| n > 0) || self.gres_mig > 0
    }

    /// Whether a reboot the agent asked for is still waiting.
    pub fn reboot_requested(&self) -> bool {
        self.state.split('+').any(|f| f.starts_with("REBOOT"))
    }
}

/// Parses `scontrol show node` output (one or many nodes, one field per
/// `Key=value` word, `Reason=` running to the end of its line).
pub fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Reason=") {
            let (reason, time) = match rest.rfind(" [") {
                Some(i) if rest.ends_with(']') => {
                    let stamp = rest.get(i + 2..rest.len() - 1).unwrap_or("");
                    (&rest[..i], stamp.split_once('@').map(|(_, t)| t.to_owned()))
                }
                _ => (rest, None),
            };
            if let Some(node) = nodes.last_mut() {
                node.reason = Some(reason.to_owned());
                node.reason_time = time;
            }
            continue;
        }
        for word in line.split_whitespace() {
            if let Some(name) = word.strip_prefix("NodeName=") {
                nodes.push(NodeInfo { name: name.to_owned(), ..NodeInfo::default() });
            } else if let Some(node) = nodes.last_mut() {
                if let Some(state) = word.strip_prefix("State=") {
                    state.clone_into(&mut node.state);
                } else if let Some(gres) = word.strip_prefix("Gres=") {
                    (node.gres_gpus, node.gres_mig) = gres_gpu_count(gres);
                }
            }
        }
    }
    nodes
}

/// Whether a GRES type names a MIG slice (`1g.10gb`, `a100_3g.20gb`,
/// `1g.10gb+me`): NVIDIA's profile names are `<slices>g.<memory>gb`.
fn is_mig_type(ty: &str) -> bool {
    let profile = ty.rsplit('_').next().unwrap_or(ty);
    let Some((slices, rest)) = profile.split_once("g.") else { return false };
    let mem = rest.split('+').next().unwrap_or(rest);
    !slices.is_empty()
        && slices.bytes().all(|b| b.is_ascii_digit())
        && mem.strip_suffix("gb").is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
}

/// Physical GPUs and MIG slices in a `Gres=` value: `gpu:h100:8`,
/// `gpu:8(S:0-1)`, `gpu:a:4,gpu:b:4`, `gpu:1g.10gb:28,gpu:2g.20gb:12`.
fn gres_gpu_count(gres: &str) -> (Option<u32>, u32) {
    let (mut gpus, mut mig) = (None, 0u32);
    for item in gres.split(',') {
        let item = item.split('(').next().unwrap_or(item);
        let parts: Vec<&str> = item.split(':').collect();
        if parts.first() != Some(&"gpu") {
            continue;
        }
        let n = parts.last().and_then(|n| n.parse::<u32>().ok());
        let ty = match parts.len() {
            3 => Some(parts[1]),
            2 if n.is_none() => Some(parts[1]),
            _ => None,
        };
        let n = n.unwrap_or(1);
        if ty.is_some_and(is_mig_type) {
            mig = mig.saturating_add(n);
        } else {
            gpus = Some(gpus.unwrap_or(0u32).saturating_add(n));
        }
    }
    (gpus, mig)
}

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

    const SHOW: &str = "NodeName=node1 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.14
   Gres=gpu:h100:8
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug

NodeName=node2 Arch=x86_64 CoresPerSocket=1
   Gres=gpu:h100:8(S:0)
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Reason=gpu: xid79 gpu3 GPU has fallen off the bus (nvml) [root@2026-11-29T17:14:37]

NodeName=node3 Arch=x86_64
   State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1
   Reason=bad dimm, ticket 4411 [alice@2026-11-29T10:00:00]
";

    #[test]
    fn parses_nodes_states_and_reasons() {
        let nodes = parse_nodes(SHOW);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].state, "IDLE");
        assert_eq!(nodes[0].gres_gpus, Some(8));
        assert!(!nodes[0].out_of_service());
        assert_eq!(nodes[1].reason.as_deref(), Some("gpu: xid79 gpu3 GPU has fallen off the bus (nvml)"));
        assert_eq!(nodes[1].reason_time.as_deref(), Some("2026-11-29T17:14:37"));
        assert!(nodes[1].drained() && nodes[1].has_gpus());
        assert_eq!(nodes[2].reason.as_deref(), Some("bad dimm, ticket 4411"));
        assert!(nodes[2].out_of_service() && nodes[2].drained() && !nodes[2].has_gpus());
    }

    #[test]
    fn counts_gpus_in_gres() {
        assert_eq!(gres_gpu_count("gpu:h100:8"), (Some(8), 0));
        assert_eq!(gres_gpu_count("gpu:8(S:0-1)"), (Some(8), 0));
        assert_eq!(gres_gpu_count("gpu:a100:4,gpu:h100:4"), (Some(8), 0));
        assert_eq!(gres_gpu_count("gpu:h100"), (Some(1), 0));
        assert_eq!(gres_gpu_count("(null)"), (None, 0));
    }

    #[test]
    fn mig_slices_are_not_gpus() {
        assert_eq!(gres_gpu_count("gpu:1g.10gb:28,gpu:2g.20gb:12"), (None, 40));
        assert_eq!(gres_gpu_count("gpu:a100_3g.40gb:2(S:0),gpu:a100:6"), (Some(6), 2));
        assert_eq!(gres_gpu_count("gpu:1g.10gb+me:7"), (None, 7));
        let n = &parse_nodes("NodeName=m1\n   Gres=gpu:1g.10gb:28,gpu:2g.20gb:12\n   State=IDLE\n")[0];
        assert!(n.has_gpus() && n.gres_gpus.is_none());
    }

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
