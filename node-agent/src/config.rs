//! The agent's configuration: `/etc/gpu-node-agent/config.toml` (or `--config`).
//!
//! Every key has a default that makes a sound production setup, so an empty
//! file (or none at all) is a valid configuration. An unknown key or a bad
//! value stops the agent with the key and the line named.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_health::nvlink5;
use gpu_health::reason::Class;
use gpu_health::xid::{self, Action};
use serde::Deserialize;

/// Where the agent looks for its configuration without `--config`.
pub const DEFAULT_PATH: &str = "/etc/gpu-node-agent/config.toml";

/// The plugstack file unless `plugstack_conf` says otherwise (Debian's and
/// SchedMD's packages both use `/etc/slurm` as Slurm's configuration directory).
pub const DEFAULT_PLUGSTACK: &str = "/etc/slurm/plugstack.conf";

/// The prefix of every drain reason the agent writes. The prefix alone does
/// not make a reason the agent's: see `health::is_agent_reason` and the rules
/// in `decide`.
pub const REASON_PREFIX: &str = gpu_health::reason::PREFIX;

/// The agent's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The Slurm node this agent watches (default: the host name).
    pub node_name: Option<String>,
    /// The NVML library to load (the fake one in tests).
    pub nvml_library: PathBuf,
    /// Deadline of every NVML call.
    pub nvml_timeout: Duration,
    /// The kernel log to follow; `None` disables it.
    pub kmsg_path: Option<PathBuf>,
    /// Where the agent keeps what it drained, across restarts.
    pub state_dir: PathBuf,
    /// Interval between polls of the GPU counters.
    pub poll_interval: Duration,
    /// Decide and log, but never touch Slurm.
    pub dry_run: bool,
    /// Resume nodes the agent drained once the fault is gone.
    pub auto_resume: bool,
    /// Consecutive clean checks before a resume.
    pub resume_after: u32,
    /// Never drain past this fraction of the cluster's GPU nodes drained by
    /// this agent (reasons in its grammar).
    pub max_drained_fraction: f64,
    /// Fault classes the fleet guard never holds back (`lost`, `xid79`, `xid95`).
    pub fleet_guard_exempt: Vec<Class>,
    /// Reboots the agent requests for the same fault before it drains for a person.
    pub max_reboots: u32,
    /// A random wait of up to this long before a drain that the fleet guard
    /// counts, so agents that see a fault at the same moment do not drain at once.
    pub drain_jitter: Duration,
    /// node_exporter textfile to write metrics to; `None` disables it.
    pub metrics_textfile: Option<PathBuf>,
    /// GPUs this node must have; `None`: ask Slurm (the node's `Gres=gpu:...:N`).
    pub expected_gpus: Option<u32>,
    /// The `scontrol` program.
    pub scontrol: PathBuf,
    /// Deadline of every `scontrol`/`sinfo` call.
    pub scontrol_timeout: Duration,
    /// Changes when the node reboots.
    pub boot_id_path: PathBuf,
    /// Where `topology --write` (and the daemon at start) puts the GPU table
    /// (version 3, with the machine) for the plugin.
    pub topology_dir: PathBuf,
    /// Have hwloc read the topology from this XML file instead of discovering it.
    pub topology_xml: Option<PathBuf>,
    /// The `slurmd` program, asked (`slurmd -G`) for Slurm's GPU order and
    /// (`slurmd -V`) for the release the plugin must be built for.
    pub slurmd: PathBuf,
    /// The plugstack file Slurm reads (its `PlugStackConfig`), followed with
    /// its includes to the plugin whose release is checked (`release.rs`).
    pub plugstack_conf: PathBuf,
    /// How often each GPU's use is sampled for the jobs that hold it
    /// (utilization, memory, processes); zero turns per-job usage off.
    pub usage_interval: Duration,
    /// Write each job's GPU-use summary into its `AdminComment` in Slurm's
    /// accounting at its end (`sacct` and `sacctmgr`: slurmdbd, not slurmctld).
    pub usage_admin_comment: bool,
    /// The `sacct` program.
    pub sacct: PathBuf,
    /// The `sacctmgr` program.
    pub sacctmgr: PathBuf,
    /// Where the plugin's job prolog writes which job holds which GPU
    /// (`jobs/`, DCGM exporter's `hpc-jobs/`) and the agent its live
    /// summaries (`usage/`).
    pub run_dir: PathBuf,
    /// What to do about each kind of fault.
    pub policy: Policy,
}

/// What the agent does about each kind of fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Per Xid; Xids not listed follow [`xid::default_action`].
    pub xid: BTreeMap<u32, Action>,
    /// Volatile uncorrectable ECC errors.
    pub ecc_uncorrectable: Action,
    /// A row remap waits for a GPU reset.
    pub remap_pending: Action,
    /// A row remap failed: the GPU needs replacing.
    pub remap_failure: Action,
    /// NVML says a GPU is lost (fallen off the bus).
    pub gpu_lost: Action,
    /// Fewer GPUs than Slurm expects on this node.
    pub gpu_missing: Action,
    /// The driver's recovery-action field asks for a reset or a drain.
    pub recovery_action: Action,
    /// The driver's recovery-action field asks for a node reboot.
    pub recovery_reboot: Action,
    /// A PCIe link trained below the GPU's maximum generation or width.
    pub pcie_degraded: Action,
    /// An NVLink down on a GPU with NVLinks.
    pub nvlink_down: Action,
    /// NVLink CRC/replay/recovery errors growing faster than `nvlink_errors_per_minute`.
    pub nvlink_errors: Action,
    /// Errors per minute on one link above which `nvlink_errors` applies.
    pub nvlink_errors_per_minute: u64,
    /// The NVSwitch fabric failed, or is not registered `fabric_timeout` after boot.
    pub fabric_failure: Action,
    /// How long after boot the fabric may take to register.
    pub fabric_timeout: Duration,
    /// Hardware slowdown, hardware thermal slowdown or power brake in 3 checks in a row.
    pub clock_slowdown: Action,
    /// ECC mode off on a GPU that supports it.
    pub ecc_disabled: Action,
    /// Persistence mode off.
    pub persistence_disabled: Action,
    /// NVML calls on a GPU that have not returned for `nvml_hang_polls` polls.
    pub nvml_hang: Action,
    /// Polls in a row a GPU's NVML calls may hang before `nvml_hang` applies.
    pub nvml_hang_polls: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            xid: BTreeMap::new(),
            ecc_uncorrectable: Action::Drain,
            remap_pending: Action::Reboot,
            remap_failure: Action::Drain,
            gpu_lost: Action::Drain,
            gpu_missing: Action::Drain,
            recovery_action: Action::Drain,
            recovery_reboot: Action::Reboot,
            pcie_degraded: Action::Drain,
            nvlink_down: Action::Drain,
            nvlink_errors: Action::Warn,
            nvlink_errors_per_minute: 60,
            fabric_failure: Action::Drain,
            fabric_timeout: Duration::from_secs(600),
            clock_slowdown: Action::Warn,
            ecc_disabled: Action::Warn,
            persistence_disabled: Action::Warn,
            nvml_hang: Action::Drain,
            nvml_hang_polls: 3,
        }
    }
}

impl Policy {
    /// The action for an Xid.
    pub fn xid_action(&self, code: u32) -> Action {
        self.xid.get(&code).copied().unwrap_or_else(|| xid::default_action(code))
    }

    /// The action for an Xid with what its message decoded to (the NVLink5
    /// Xids, [`gpu_health::nvlink5`]): a GPU reset drains, unless the admin
    /// set an action for the Xid, which always wins.
    pub fn xid_action_decoded(&self, code: u32, decoded: Option<nvlink5::Verdict>) -> Action {
        match (self.xid.get(&code), decoded) {
            (Some(a), _) => *a,
            (None, Some(nvlink5::Verdict::Reset)) => Action::Drain,
            (None, _) => xid::default_action(code),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: None,
            nvml_library: PathBuf::from("libnvidia-ml.so.1"),
            nvml_timeout: Duration::from_secs(5),
            kmsg_path: Some(PathBuf::from("/dev/kmsg")),
            state_dir: PathBuf::from("/var/lib/gpu-node-agent"),
            poll_interval: Duration::from_secs(30),
            dry_run: false,
            auto_resume: true,
            resume_after: 3,
            max_drained_fraction: 0.1,
            fleet_guard_exempt: Vec::new(),
            max_reboots: 2,
            drain_jitter: Duration::from_secs(5),
            metrics_textfile: None,
            expected_gpus: None,
            scontrol: PathBuf::from("scontrol"),
            scontrol_timeout: Duration::from_secs(10),
            boot_id_path: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            topology_dir: PathBuf::from(task_plan::gputable::DEFAULT_DIR),
            topology_xml: None,
            slurmd: PathBuf::from("slurmd"),
            plugstack_conf: PathBuf::from(DEFAULT_PLUGSTACK),
            usage_interval: Duration::from_secs(10),
            usage_admin_comment: true,
            sacct: PathBuf::from("sacct"),
            sacctmgr: PathBuf::from("sacctmgr"),
            run_dir: PathBuf::from(task_plan::jobmap::RUN_DIR),
            policy: Policy::default(),
        }
    }
}

/// A configuration that cannot be used, with where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// What is wrong.
    pub kind: ConfigErrorKind,
    /// What is wrong and where, in words.
    pub message: String,
}

/// What is wrong with a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// The file cannot be read.
    Read(std::io::ErrorKind),
    /// Not TOML, an unknown key, or a value of the wrong type (as the TOML reader says).
    Toml,
    /// This key has a value of the right type that the agent cannot use.
    BadValue {
        /// The key.
        key: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The file as written: every key optional, no unknown key allowed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node_name: Option<String>,
    nvml_library: Option<PathBuf>,
    nvml_timeout: Option<RawDuration>,
    kmsg_path: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    poll_interval: Option<RawDuration>,
    dry_run: Option<bool>,
    auto_resume: Option<bool>,
    resume_after: Option<u32>,
    max_drained_fraction: Option<f64>,
    fleet_guard_exempt: Option<Vec<String>>,
    max_reboots: Option<u32>,
    drain_jitter: Option<RawDuration>,
    metrics_textfile: Option<PathBuf>,
    expected_gpus: Option<u32>,
    scontrol: Option<PathBuf>,
    scontrol_timeout: Option<RawDuration>,
    boot_id_path: Option<PathBuf>,
    topology_dir: Option<PathBuf>,
    topology_xml: Option<PathBuf>,
    slurmd: Option<PathBuf>,
    plugstack_conf: Option<PathBuf>,
    usage_interval: Option<RawDuration>,
    usage_admin_comment: Option<bool>,
    sacct: Option<PathBuf>,
    sacctmgr: Option<PathBuf>,
    run_dir: Option<PathBuf>,
    policy: Option<RawPolicy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    xid: Option<BTreeMap<String, String>>,
    ecc_uncorrectable: Option<String>,
    remap_pending: Option<String>,
    remap_failure: Option<String>,
    gpu_lost: Option<String>,
    gpu_missing: Option<String>,
    recovery_action: Option<String>,
    recovery_reboot: Option<String>,
    pcie_degraded: Option<String>,
    nvlink_down: Option<String>,
    nvlink_errors: Option<String>,
    nvlink_errors_per_minute: Option<u64>,
    fabric_failure: Option<String>,
    fabric_timeout: Option<RawDuration>,
    clock_slowdown: Option<String>,
    ecc_disabled: Option<String>,
    persistence_disabled: Option<String>,
    nvml_hang: Option<String>,
    nvml_hang_polls: Option<u32>,
}

/// `"30s"`, `"500ms"`, `"2m"`, or a number of seconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawDuration {
    Seconds(u64),
    Text(String),
}

/// Parses `500ms`, `30s`, `2m`, `1h`.
///
/// # Errors
/// Anything else.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{text}' is not a duration (like 500ms, 30s, 2m)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("'{text}': unknown unit '{unit}' (use ms, s, m or h)")),
    };
    Ok(d)
}

/// The line of `key = ` in the file, for messages about values.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines().position(|l| {
        let l = l.trim_start().trim_start_matches('"');
        l.strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().trim_start_matches('"').trim_start().starts_with('='))
    })
}

impl Config {
    /// Reads and checks a configuration file. A missing file at the default
    /// path gives the defaults; a missing file named explicitly is an error.
    ///
    /// # Errors
    /// The file cannot be read, is not TOML, has an unknown key or a bad value.
    pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text)
                .map_err(|e| ConfigError { message: format!("{}: {e}", path.display()), kind: e.kind }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Config::default()),
            Err(e) => Err(ConfigError {
                kind: ConfigErrorKind::Read(e.kind()),
                message: format!("{}: {e}", path.display()),
            }),
        }
    }

    /// Parses the text of a configuration file.
    ///
    /// # Errors
    /// Not TOML, an unknown key (named with its line), or a bad value.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError {
            kind: ConfigErrorKind::Toml,
            message: e.to_string().trim_end().to_owned(),
        })?;
        let bad = |key: &str, why: String| {
            let at = line_of(text, key).map(|n| format!("line {}: ", n + 1)).unwrap_or_default();
            ConfigError {
                kind: ConfigErrorKind::BadValue { key: key.to_owned() },
                message: format!("{at}{key}: {why}"),
            }
        };
        let any_dur =
            |key: &str, raw: Option<RawDuration>, default: Duration| -> Result<Duration, ConfigError> {
                match raw {
                    None => Ok(default),
                    Some(RawDuration::Seconds(s)) => Ok(Duration::from_secs(s)),
                    Some(RawDuration::Text(t)) => parse_duration(&t).map_err(|e| bad(key, e)),
                }
            };
        let dur = |key: &str, raw: Option<RawDuration>, default: Duration| -> Result<Duration, ConfigError> {
            let d = any_dur(key, raw, default)?;
            if d.is_zero() {
                return Err(bad(key, "must be more than zero".to_owned()));
            }
            Ok(d)
        };
        let opt_path = |p: Option<PathBuf>, default: Option<PathBuf>| match p {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p),
            None => default,
        };
        let d = Config::default();
        let fraction = raw.max_drained_fraction.unwrap_or(d.max_drained_fraction);
        if !(0.0..=1.0).contains(&fraction) {
            return Err(bad("max_drained_fraction", format!("{fraction} is not between 0 and 1")));
        }
        if raw.resume_after == Some(0) {
            return Err(bad("resume_after", "must be at least 1".to_owned()));
        }
        if raw.node_name.as_deref().is_some_and(|n| n.is_empty() || n.contains(char::is_whitespace)) {
            return Err(bad("node_name", "must be a Slurm node name without spaces".to_owned()));
        }
        let mut exempt = Vec::new();
        for word in raw.fleet_guard_exempt.unwrap_or_default() {
            let class = Class::parse(&word).ok_or_else(|| {
                bad(
                    "fleet_guard_exempt",
                    format!("'{word}' is not a fault class of the agent's reasons (lost, xid79, xid95, ...)"),
                )
            })?;
            exempt.push(class);
        }
        Ok(Config {
            node_name: raw.node_name,
            nvml_library: raw.nvml_library.unwrap_or(d.nvml_library),
            nvml_timeout: dur("nvml_timeout", raw.nvml_timeout, d.nvml_timeout)?,
            kmsg_path: opt_path(raw.kmsg_path, d.kmsg_path),
            state_dir: raw.state_dir.unwrap_or(d.state_dir),
            poll_interval: dur("poll_interval", raw.poll_interval, d.poll_interval)?,
            dry_run: raw.dry_run.unwrap_or(d.dry_run),
            auto_resume: raw.auto_resume.unwrap_or(d.auto_resume),
            resume_after: raw.resume_after.unwrap_or(d.resume_after),
            max_drained_fraction: fraction,
            fleet_guard_exempt: exempt,
            max_reboots: raw.max_reboots.unwrap_or(d.max_reboots),
            drain_jitter: any_dur("drain_jitter", raw.drain_jitter, d.drain_jitter)?,
            metrics_textfile: opt_path(raw.metrics_textfile, None),
            expected_gpus: raw.expected_gpus,
            scontrol: raw.scontrol.unwrap_or(d.scontrol),
            scontrol_timeout: dur("scontrol_timeout", raw.scontrol_timeout, d.scontrol_timeout)?,
            boot_id_path: raw.boot_id_path.unwrap_or(d.boot_id_path),
            topology_dir: raw.topology_dir.unwrap_or(d.topology_dir),
            topology_xml: opt_path(raw.topology_xml, None),
            slurmd: raw.slurmd.unwrap_or(d.slurmd),
            plugstack_conf: raw.plugstack_conf.unwrap_or(d.plugstack_conf),
            usage_interval: any_dur("usage_interval", raw.usage_interval, d.usage_interval)?,
            usage_admin_comment: raw.usage_admin_comment.unwrap_or(d.usage_admin_comment),
            sacct: raw.sacct.unwrap_or(d.sacct),
            sacctmgr: raw.sacctmgr.unwrap_or(d.sacctmgr),
            run_dir: raw.run_dir.unwrap_or(d.run_dir),
            policy: parse_policy(raw.policy.unwrap_or_default(), &bad, &dur)?,
        })
    }
}

/// Reads a duration key with its default.
type DurationKey<'a> = &'a dyn Fn(&str, Option<RawDuration>, Duration) -> Result<Duration, ConfigError>;

fn parse_policy(
    raw: RawPolicy,
    bad: &dyn Fn(&str, String) -> ConfigError,
    dur: DurationKey<'_>,
) -> Result<Policy, ConfigError> {
    let action = |key: &str, value: Option<String>, default: Action| -> Result<Action, ConfigError> {
        match value {
            None => Ok(default),
            Some(v) => Action::parse(&v)
                .ok_or_else(|| bad(key, format!("'{v}' is not an action (ignore, warn, drain, reboot)"))),
        }
    };
    let d = Policy::default();
    let mut xid = BTreeMap::new();
    for (code, value) in raw.xid.unwrap_or_default() {
        let n: u32 = code.parse().map_err(|_| bad(&code, "Xid keys are numbers".to_owned()))?;
        xid.insert(n, action(&code, Some(value), Action::Warn)?);
    }
    Ok(Policy {
        xid,
        ecc_uncorrectable: action("ecc_uncorrectable", raw.ecc_uncorrectable, d.ecc_uncorrectable)?,
        remap_pending: action("remap_pending", raw.remap_pending, d.remap_pending)?,
        remap_failure: action("remap_failure", raw.remap_failure, d.remap_failure)?,
        gpu_lost: action("gpu_lost", raw.gpu_lost, d.gpu_lost)?,
        gpu_missing: action("gpu_missing", raw.gpu_missing, d.gpu_missing)?,
        recovery_action: action("recovery_action", raw.recovery_action, d.recovery_action)?,
        recovery_reboot: action("recovery_reboot", raw.recovery_reboot, d.recovery_reboot)?,
        pcie_degraded: action("pcie_degraded", raw.pcie_degraded, d.pcie_degraded)?,
        nvlink_down: action("nvlink_down", raw.nvlink_down, d.nvlink_down)?,
        nvlink_errors: action("nvlink_errors", raw.nvlink_errors, d.nvlink_errors)?,
        nvlink_errors_per_minute: raw.nvlink_errors_per_minute.unwrap_or(d.nvlink_errors_per_minute),
        fabric_failure: action("fabric_failure", raw.fabric_failure, d.fabric_failure)?,
        fabric_timeout: dur("fabric_timeout", raw.fabric_timeout, d.fabric_timeout)?,
        clock_slowdown: action("clock_slowdown", raw.clock_slowdown, d.clock_slowdown)?,
        ecc_disabled: action("ecc_disabled", raw.ecc_disabled, d.ecc_disabled)?,
        persistence_disabled: action(
            "persistence_disabled",
            raw.persistence_disabled,
            d.persistence_disabled,
        )?,
        nvml_hang: action("nvml_hang", raw.nvml_hang, d.nvml_hang)?,
        nvml_hang_polls: match raw.nvml_hang_polls {
            Some(0) => return Err(bad("nvml_hang_polls", "must be at least 1".to_owned())),
            Some(n) => n,
            None => d.nvml_hang_polls,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../packaging/config.toml");
        let cfg = Config::parse(text).unwrap();
        assert_eq!(cfg.poll_interval, Duration::from_secs(30));
    }

    #[test]
    fn keys_parse() {
        let cfg = Config::parse(
            r#"
node_name = "node2"
nvml_library = "/opt/fake/libfake_nvml.so"
kmsg_path = ""
poll_interval = "500ms"
nvml_timeout = 2
dry_run = true
max_drained_fraction = 0.5
max_reboots = 0
drain_jitter = 0
metrics_textfile = "/tmp/m.prom"
[policy]
remap_pending = "drain"
[policy.xid]
"13" = "drain"
"79" = "reboot"
"#,
        )
        .unwrap();
        assert_eq!(cfg.node_name.as_deref(), Some("node2"));
        assert_eq!(cfg.kmsg_path, None);
        assert_eq!(cfg.poll_interval, Duration::from_millis(500));
        assert_eq!(cfg.nvml_timeout, Duration::from_secs(2));
        assert!(cfg.dry_run);
        assert_eq!((cfg.max_reboots, cfg.drain_jitter), (0, Duration::ZERO));
        assert_eq!(cfg.policy.remap_pending, Action::Drain);
        assert_eq!(cfg.policy.xid_action(13), Action::Drain);
        assert_eq!(cfg.policy.xid_action(79), Action::Reboot);
        assert_eq!(cfg.policy.xid_action(31), Action::Ignore);
        assert!(cfg.fleet_guard_exempt.is_empty());
        let cfg = Config::parse(
            "fleet_guard_exempt = [\"lost\", \"xid79\", \"xid95\"]\n[policy]\nnvml_hang = \"warn\"\nnvml_hang_polls = 5\n",
        )
        .unwrap();
        assert_eq!(cfg.fleet_guard_exempt, [Class::Lost, Class::Xid(79), Class::Xid(95)]);
        assert_eq!((cfg.policy.nvml_hang, cfg.policy.nvml_hang_polls), (Action::Warn, 5));
        let d = Policy::default();
        assert_eq!((d.nvml_hang, d.nvml_hang_polls), (Action::Drain, 3));
        assert_eq!(d.xid_action_decoded(145, Some(nvlink5::Verdict::Reset)), Action::Drain);
        assert_eq!(d.xid_action_decoded(145, Some(nvlink5::Verdict::Benign)), Action::Warn);
        assert_eq!(d.xid_action_decoded(145, None), Action::Warn);
    }

    #[test]
    fn a_missing_file_is_an_error_only_when_named() {
        let path = Path::new("/nonexistent/gpu-node-agent/config.toml");
        assert_eq!(Config::load(path, false).unwrap(), Config::default());
        let e = Config::load(path, true).unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::Read(std::io::ErrorKind::NotFound));
        assert!(e.message.starts_with("/nonexistent/gpu-node-agent/config.toml: "), "{e}");
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let e = Config::parse("dry_run = true\npoll_intervall = \"3s\"\n").unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::Toml);
        assert!(e.message.contains("line 2") && e.message.contains("poll_intervall"), "{e}");
        let e = Config::parse("[policy]\nbogus = \"drain\"\n").unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::Toml);
        assert!(e.message.contains("line 2") && e.message.contains("bogus"), "{e}");
    }

    #[test]
    fn bad_values_are_named_with_their_line() {
        for (text, key) in [
            ("\n\npoll_interval = \"3 parsecs\"", "poll_interval"),
            ("max_drained_fraction = 1.5", "max_drained_fraction"),
            ("resume_after = 0", "resume_after"),
            ("[policy]\nremap_pending = \"explode\"", "remap_pending"),
            ("[policy.xid]\n\"x79\" = \"drain\"", "x79"),
            ("poll_interval = \"0s\"", "poll_interval"),
            ("node_name = \"a b\"", "node_name"),
            ("dry_run = \"yes\"", "dry_run"),
            ("max_reboots = -1", "max_reboots"),
            ("drain_jitter = \"soon\"", "drain_jitter"),
            ("fleet_guard_exempt = [\"lost\", \"bogus\"]", "fleet_guard_exempt"),
            ("[policy]\nnvml_hang_polls = 0", "nvml_hang_polls"),
            ("[policy]\nnvml_hang = \"panic\"", "nvml_hang"),
        ] {
            let e = Config::parse(text).unwrap_err();
            // A value of the wrong type is the TOML reader's error; one it reads
            // but the agent cannot use is ours.
            let want = if matches!(key, "dry_run" | "max_reboots") {
                ConfigErrorKind::Toml
            } else {
                ConfigErrorKind::BadValue { key: key.to_owned() }
            };
            assert_eq!(e.kind, want, "{text:?} -> {e}");
            assert!(e.message.contains(key) && e.message.contains("line"), "{text:?} -> {e}");
        }
    }

    #[test]
    fn the_link_and_mode_checks_take_every_action_word() {
        let d = Policy::default();
        assert_eq!(
            (d.pcie_degraded, d.nvlink_down, d.nvlink_errors, d.fabric_failure),
            (Action::Drain, Action::Drain, Action::Warn, Action::Drain)
        );
        assert_eq!(
            (d.clock_slowdown, d.ecc_disabled, d.persistence_disabled),
            (Action::Warn, Action::Warn, Action::Warn)
        );
        for word in ["ignore", "warn", "drain", "reboot"] {
            let text = [
                "pcie_degraded",
                "nvlink_down",
                "nvlink_errors",
                "fabric_failure",
                "clock_slowdown",
                "ecc_disabled",
                "persistence_disabled",
            ]
            .map(|k| format!("{k} = \"{word}\"\n"))
            .concat();
            let p = Config::parse(&format!(
                "[policy]\n{text}nvlink_errors_per_minute = 5\nfabric_timeout = \"2m\"\n"
            ))
            .unwrap()
            .policy;
            let want = Action::parse(word).unwrap();
            for got in [
                p.pcie_degraded,
                p.nvlink_down,
                p.nvlink_errors,
                p.fabric_failure,
                p.clock_slowdown,
                p.ecc_disabled,
                p.persistence_disabled,
            ] {
                assert_eq!(got, want, "{word}");
            }
            assert_eq!((p.nvlink_errors_per_minute, p.fabric_timeout), (5, Duration::from_secs(120)));
        }
        let e = Config::parse("[policy]\n\npcie_degraded = \"drian\"\n").unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::BadValue { key: "pcie_degraded".to_owned() });
        assert!(e.message.contains("line 3") && e.message.contains("pcie_degraded"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("").is_err());
    }
}
