//! What the cluster says, for the traps that depend on it: the commands lint
//! asks (read-only, each at most once) and parsers of their answers, and the
//! same facts from `slurm.conf` for the plugin at submit time, which runs no
//! command.

use std::collections::BTreeMap;

use super::values::{self, Gres, Limit};
use slurm_formats::units::parse_duration;
use slurm_formats::{conf, hostlist};

/// A fact, or why it is not known (no cluster to ask, the command failed).
pub type Fact<T> = Result<T, String>;

/// `sinfo` arguments: partitions (hidden ones too), one line per group of
/// identical nodes: name (`*` marks the default), MaxTime, DefaultTime, node
/// count, CPUs, memory (MB), GRES.
pub const SINFO_ARGS: &[&str] = &["-h", "-a", "-e", "-o", "%P|%l|%L|%D|%c|%m|%G"];
/// `scontrol` arguments for the configuration (`KillOnBadExit`, `PreemptType`, ...).
pub const CONFIG_ARGS: &[&str] = &["show", "config"];
/// `sacctmgr` arguments for every QoS, whom it preempts, and its preemption grace time.
pub const QOS_ARGS: &[&str] = &["-n", "-P", "show", "qos", "format=Name,Preempt,PreemptMode,GraceTime"];
/// `scontrol` arguments for the client's release.
pub const VERSION_ARGS: &[&str] = &["--version"];

/// `squeue` arguments for the QoS of the jobs a job depends on.
pub fn squeue_args(jobs: &[String]) -> Vec<String> {
    vec!["-h".into(), "-j".into(), jobs.join(","), "-o".into(), "%i|%q".into()]
}

/// A group of identical nodes in a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes {
    /// How many.
    pub count: u64,
    /// CPUs of each.
    pub cpus: u64,
    /// Memory of each, MiB.
    pub memory_mib: u64,
    /// GRES of each.
    pub gres: Vec<Gres>,
}

impl Nodes {
    /// How many of GRES `name` (of type `kind`, if given) a node has.
    pub fn gres_count(&self, name: &str, kind: Option<&str>) -> u64 {
        self.gres
            .iter()
            .filter(|g| g.name == name && (kind.is_none() || g.kind.as_deref() == kind))
            .map(|g| g.count)
            .sum()
    }
}

/// A partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Its name.
    pub name: String,
    /// Whether jobs that name none go here.
    pub default: bool,
    /// MaxTime.
    pub max_time: Limit,
    /// DefaultTime, when set.
    pub default_time: Option<Limit>,
    /// Its nodes, by shape.
    pub nodes: Vec<Nodes>,
}

impl Partition {
    /// The time limit of a job that gives no `--time`.
    pub fn job_default_time(&self) -> Limit {
        self.default_time.unwrap_or(self.max_time)
    }
}

/// The configuration lint reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `KillOnBadExit=1`.
    pub kill_on_bad_exit: bool,
    /// `PreemptType` (`preempt/none`, `preempt/qos`, `preempt/partition_prio`).
    pub preempt_type: String,
    /// `PreemptMode` (`OFF`, `REQUEUE`, `CANCEL`, ...).
    pub preempt_mode: String,
    /// `max_script_size=` of `SchedulerParameters`, when set.
    pub max_script_size: Option<usize>,
    /// `PreemptParameters` (23.02 on; empty when unset).
    pub preempt_params: String,
    /// `SlurmctldParameters` (empty when unset).
    pub slurmctld_params: String,
    /// `KillWait`, seconds (Slurm's default 30 when not said).
    pub kill_wait_s: u64,
}

/// The release from which `PreemptParameters=send_user_signal` exists; 22.05
/// reads only `SlurmctldParameters=preempt_send_user_signal` (`_preempt_jobs`,
/// src/slurmctld/node_scheduler.c at slurm-22-05-8-1 and slurm-23-02-7-1).
pub const PREEMPT_PARAMS_SINCE: u32 = (23 << 16) | (2 << 8);

impl Config {
    /// Whether slurmctld sends a job's `--signal` when it preempts it, on
    /// `release` (`preempt_send_user_signal`, read as Slurm reads it: a
    /// case-insensitive substring of the parameters).
    pub fn sends_user_signal(&self, release: u32) -> bool {
        let has = |hay: &str, needle: &str| hay.to_ascii_lowercase().contains(needle);
        has(&self.slurmctld_params, "preempt_send_user_signal")
            || (release >= PREEMPT_PARAMS_SINCE && has(&self.preempt_params, "send_user_signal"))
    }

    /// The setting that makes it so on `release`.
    pub fn user_signal_setting(release: u32) -> &'static str {
        if release >= PREEMPT_PARAMS_SINCE {
            "PreemptParameters=send_user_signal"
        } else {
            "SlurmctldParameters=preempt_send_user_signal"
        }
    }
}

/// A QoS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Qos {
    /// Its name.
    pub name: String,
    /// The QoS it may preempt.
    pub preempts: Vec<String>,
    /// Its PreemptMode (`cluster`: the configuration's).
    pub mode: String,
    /// Its `GraceTime` in seconds, when `sacctmgr` gave it.
    pub grace_s: Option<u64>,
}

/// What the cluster says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    /// Where the facts came from, for messages (`sinfo`, `/etc/slurm/slurm.conf`).
    pub from: String,
    /// The partitions.
    pub partitions: Fact<Vec<Partition>>,
    /// The configuration.
    pub config: Fact<Config>,
    /// Every QoS.
    pub qos: Fact<Vec<Qos>>,
    /// The QoS of the jobs this one depends on (job id → QoS).
    pub jobs: Fact<BTreeMap<String, String>>,
}

impl Cluster {
    /// No cluster to ask: every fact unknown for `why`.
    pub fn unknown(why: &str) -> Cluster {
        Cluster {
            from: String::new(),
            partitions: Err(why.to_owned()),
            config: Err(why.to_owned()),
            qos: Err(why.to_owned()),
            jobs: Err(why.to_owned()),
        }
    }

    /// The partition a job goes to: the one named (the first of a list), else the default.
    pub fn partition<'p>(parts: &'p [Partition], named: Option<&str>) -> Option<&'p Partition> {
        match named.and_then(|n| n.split(',').next()) {
            Some(n) => parts.iter().find(|p| p.name == n),
            None => parts.iter().find(|p| p.default),
        }
    }

    /// The QoS whose `Preempt` list names QoS `name` (whatever `PreemptType` is).
    pub fn listed_by(&self, name: &str) -> Vec<String> {
        self.qos
            .as_ref()
            .map(|qos| {
                qos.iter().filter(|q| q.preempts.iter().any(|p| p == name)).map(|q| q.name.clone()).collect()
            })
            .unwrap_or_default()
    }

    /// Whether QoS `name` can be preempted, with by which QoS and the mode;
    /// `Err` when the facts cannot say.
    pub fn preemptible(&self, name: &str) -> Fact<Option<(Vec<String>, String)>> {
        let config = self.config.as_ref().map_err(Clone::clone)?;
        if !config.preempt_type.ends_with("qos") {
            return Ok(None);
        }
        let qos = self.qos.as_ref().map_err(Clone::clone)?;
        let by: Vec<String> =
            qos.iter().filter(|q| q.preempts.iter().any(|p| p == name)).map(|q| q.name.clone()).collect();
        let own = qos.iter().find(|q| q.name == name);
        let mode = match own.map(|q| q.mode.as_str()) {
            Some(m) if !m.is_empty() && !m.eq_ignore_ascii_case("cluster") => m.to_owned(),
            _ => config.preempt_mode.clone(),
        };
        if by.is_empty() || mode.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        Ok(Some((by, mode)))
    }

    /// QoS `name`'s preemption grace time in seconds; `Ok(None)` when the
    /// answer did not hold it (an older recording without the column).
    pub fn qos_grace(&self, name: &str) -> Fact<Option<u64>> {
        let qos = self.qos.as_ref().map_err(Clone::clone)?;
        Ok(qos.iter().find(|q| q.name == name).and_then(|q| q.grace_s))
    }
}

/// `scontrol --version`'s `slurm 22.05.8` as `SLURM_VERSION_NUMBER`.
pub fn parse_version(text: &str) -> Option<u32> {
    let v = text.split_whitespace().find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))?;
    let mut it = v.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    let (major, minor) = (it.next()??, it.next()??);
    let micro = it.next().flatten().unwrap_or(0);
    (major < 256 && minor < 256 && micro < 256).then_some((major << 16) | (minor << 8) | micro)
}

/// A release as people write it: `22.05.8`.
pub fn release_words(release: u32) -> String {
    format!("{}.{:02}.{}", release >> 16, (release >> 8) & 0xff, release & 0xff)
}

/// The release line only: `22.05`.
pub fn release_line(release: u32) -> String {
    format!("{}.{:02}", release >> 16, (release >> 8) & 0xff)
}

/// `sinfo` with [`SINFO_ARGS`]: the partitions.
pub fn parse_sinfo(text: &str) -> Vec<Partition> {
    let mut parts: Vec<Partition> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('|').collect();
        let [name, max, default, count, cpus, mem, gres] = f.as_slice() else { continue };
        let (name, is_default) = match name.trim().strip_suffix('*') {
            Some(n) => (n, true),
            None => (name.trim(), false),
        };
        if name.is_empty() {
            continue;
        }
        let nodes = Nodes {
            count: values::parse_count(count).unwrap_or(0),
            cpus: values::parse_count(cpus.trim_end_matches('+')).unwrap_or(0),
            memory_mib: values::parse_count(mem.trim_end_matches('+')).unwrap_or(0),
            gres: values::parse_gres_list(gres),
        };
        let max_time = values::parse_limit(max).unwrap_or(Limit::Infinite);
        let default_time = values::parse_limit(default);
        match parts.iter_mut().find(|p| p.name == name) {
            Some(p) => p.nodes.push(nodes),
            None => parts.push(Partition {
                name: name.to_owned(),
                default: is_default,
                max_time,
                default_time,
                nodes: vec![nodes],
            }),
        }
    }
    parts
}

fn max_script_size(sched: &str) -> Option<usize> {
    sched.split(',').find_map(|p| p.trim().strip_prefix("max_script_size=")).and_then(|v| v.parse().ok())
}

/// `scontrol show config`: the settings lint reads.
pub fn parse_config(text: &str) -> Config {
    let mut c = Config {
        preempt_type: "preempt/none".into(),
        preempt_mode: "OFF".into(),
        kill_wait_s: 30,
        ..Config::default()
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        let v = v.trim();
        match k.trim() {
            "PreemptParameters" if v != "(null)" => c.preempt_params = v.to_owned(),
            "SlurmctldParameters" if v != "(null)" => c.slurmctld_params = v.to_owned(),
            // `KillWait                = 30 sec`
            "KillWait" => {
                c.kill_wait_s = v.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(30)
            }
            "KillOnBadExit" => c.kill_on_bad_exit = v == "1",
            // 22.05 prints `preempt/none` for no preemption; 24.11 and 26.05 print `(null)`.
            "PreemptType" if v == "(null)" || v.is_empty() => c.preempt_type = "preempt/none".into(),
            "PreemptType" => c.preempt_type = v.to_owned(),
            "PreemptMode" => c.preempt_mode = v.to_owned(),
            "SchedulerParameters" => c.max_script_size = max_script_size(v),
            _ => {}
        }
    }
    c
}

/// `sacctmgr` with [`QOS_ARGS`]: every QoS.
pub fn parse_qos(text: &str) -> Vec<Qos> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('|');
            let name = f.next()?.trim();
            if name.is_empty() {
                return None;
            }
            let preempts = f
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let mode = f.next().unwrap_or("").trim().to_owned();
            // `00:05:00`, `1-00:00:00`; empty or absent: not known.
            let grace_s = f.next().and_then(|g| parse_duration(g.trim()));
            Some(Qos { name: name.to_owned(), preempts, mode, grace_s })
        })
        .collect()
}

/// `squeue` with [`squeue_args`]: job id → QoS.
pub fn parse_job_qos(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('|').map(|(j, q)| (j.trim().to_owned(), q.trim().to_owned())))
        .filter(|(j, _)| !j.is_empty())
        .collect()
}

/// `slurm.conf` (with its included files appended) as the facts sbatch's
/// controller would give: partitions with their nodes, and the settings.
/// QoS live in accounting, which a file cannot tell.
pub fn from_slurm_conf(text: &str, from: &str) -> Cluster {
    let mut node_default: BTreeMap<String, String> = BTreeMap::new();
    let mut part_default: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes: Vec<(Vec<String>, Nodes)> = Vec::new();
    let mut parts: Vec<(BTreeMap<String, String>, String)> = Vec::new();
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    for line in conf::logical_lines(text) {
        let Some(pairs) = conf::pairs(&line) else { continue };
        let kv: BTreeMap<String, String> =
            pairs.into_iter().map(|(k, _, v)| (k.to_ascii_lowercase(), v.to_owned())).collect();
        if let Some(name) = kv.get("nodename").cloned() {
            if name.eq_ignore_ascii_case("default") {
                node_default.extend(kv);
                continue;
            }
            let mut all = node_default.clone();
            all.extend(kv);
            let get = |k: &str| all.get(k).and_then(|v| values::parse_count(v));
            let cpus = get("cpus").or_else(|| get("procs")).unwrap_or_else(|| {
                let boards = get("boards").unwrap_or(1);
                let sockets = get("socketsperboard").or_else(|| get("sockets")).unwrap_or(1);
                sockets * boards * get("corespersocket").unwrap_or(1) * get("threadspercore").unwrap_or(1)
            });
            let names = hostlist::expand(&name).unwrap_or_else(|_| vec![name.clone()]);
            let shape = Nodes {
                count: names.len() as u64,
                cpus,
                memory_mib: get("realmemory").unwrap_or(1),
                gres: all.get("gres").map(|g| values::parse_gres_list(g)).unwrap_or_default(),
            };
            nodes.push((names, shape));
        } else if let Some(name) = kv.get("partitionname").cloned() {
            if name.eq_ignore_ascii_case("default") {
                part_default.extend(kv);
                continue;
            }
            let mut all = part_default.clone();
            all.extend(kv);
            parts.push((all, name));
        } else {
            for (k, v) in kv {
                settings.insert(k, v);
            }
        }
    }
    let partitions = parts
        .into_iter()
        .map(|(kv, name)| {
            let list = kv.get("nodes").cloned().unwrap_or_default();
            let members: Vec<String> = if list.eq_ignore_ascii_case("all") {
                nodes.iter().flat_map(|(n, _)| n.clone()).collect()
            } else {
                list.split(',').flat_map(|l| hostlist::expand(l).unwrap_or_default()).collect()
            };
            let mut shapes: Vec<Nodes> = Vec::new();
            for (names, shape) in &nodes {
                let n = names.iter().filter(|x| members.contains(x)).count() as u64;
                if n == 0 {
                    continue;
                }
                match shapes.iter_mut().find(|s| {
                    s.cpus == shape.cpus && s.memory_mib == shape.memory_mib && s.gres == shape.gres
                }) {
                    Some(s) => s.count += n,
                    None => shapes.push(Nodes { count: n, ..shape.clone() }),
                }
            }
            Partition {
                name,
                default: kv.get("default").is_some_and(|d| d.eq_ignore_ascii_case("yes")),
                max_time: kv.get("maxtime").and_then(|t| values::parse_limit(t)).unwrap_or(Limit::Infinite),
                default_time: kv.get("defaulttime").and_then(|t| values::parse_limit(t)),
                nodes: shapes,
            }
        })
        .collect();
    let config = Config {
        kill_on_bad_exit: settings.get("killonbadexit").is_some_and(|v| v == "1"),
        preempt_type: settings.get("preempttype").cloned().unwrap_or_else(|| "preempt/none".into()),
        preempt_mode: settings.get("preemptmode").cloned().unwrap_or_else(|| "OFF".into()),
        max_script_size: settings.get("schedulerparameters").and_then(|s| max_script_size(s)),
        preempt_params: settings.get("preemptparameters").cloned().unwrap_or_default(),
        slurmctld_params: settings.get("slurmctldparameters").cloned().unwrap_or_default(),
        kill_wait_s: settings.get("killwait").and_then(|v| v.trim().parse().ok()).unwrap_or(30),
    };
    Cluster {
        from: from.to_owned(),
        partitions: Ok(partitions),
        config: Ok(config),
        qos: Err("QoS are kept in accounting, not in slurm.conf".to_owned()),
        jobs: Err("other jobs are not known at submit time".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("slurm 22.05.8\n"), Some((22 << 16) | (5 << 8) | 8));
        assert_eq!(parse_version("slurm 24.11.5"), Some((24 << 16) | (11 << 8) | 5));
        assert_eq!(parse_version("slurm 23.11.0-0rc1"), Some((23 << 16) | (11 << 8)));
        assert_eq!(parse_version("garbage"), None);
        assert_eq!(release_words((22 << 16) | (5 << 8) | 8), "22.05.8");
    }

    #[test]
    fn sinfo_partitions() {
        let p = parse_sinfo(
            "gpu*|2-00:00:00|n/a|4|96|1000000|gpu:h100:8(S:0-1)\ngpu*|2-00:00:00|n/a|2|64|500000|gpu:a100:4\ncpu|infinite|1:00:00|10|32|128000|(null)\n",
        );
        assert_eq!(p.len(), 2);
        assert!(p[0].default && !p[1].default);
        assert_eq!(p[0].max_time, Limit::Secs(2 * 86400));
        assert_eq!(p[0].default_time, None);
        assert_eq!(p[0].job_default_time(), Limit::Secs(2 * 86400));
        assert_eq!(p[0].nodes.len(), 2);
        assert_eq!(p[0].nodes[0].gres_count("gpu", Some("h100")), 8);
        assert_eq!(p[1].max_time, Limit::Infinite);
        assert_eq!(p[1].default_time, Some(Limit::Secs(3600)));
    }

    #[test]
    fn config_and_qos_and_preemption() {
        let config = parse_config(
            "KillOnBadExit           = 0\nPreemptType             = preempt/qos\nPreemptMode             = REQUEUE\nSchedulerParameters     = bf_interval=1,max_script_size=8388608\n",
        );
        assert_eq!(config.preempt_type, "preempt/qos");
        // No preemption, as 24.11 and 26.05 print it (measured on their labs).
        assert_eq!(parse_config("PreemptType             = (null)\n").preempt_type, "preempt/none");
        assert_eq!(config.max_script_size, Some(8 << 20));
        let qos = parse_qos("normal||cluster\nhigh|low,scavenger|cluster\nlow||\nscavenger||off\n");
        let c = Cluster { config: Ok(config.clone()), qos: Ok(qos), ..Cluster::unknown("x") };
        assert_eq!(c.preemptible("low"), Ok(Some((vec!["high".to_owned()], "REQUEUE".to_owned()))));
        assert_eq!(c.preemptible("scavenger"), Ok(None), "its own mode is off");
        assert_eq!(c.preemptible("normal"), Ok(None));
        let none =
            Cluster { config: Ok(Config { preempt_type: "preempt/none".into(), ..config }), ..c.clone() };
        assert_eq!(none.preemptible("low"), Ok(None));
        assert!(Cluster::unknown("no cluster").preemptible("low").is_err());
    }

    #[test]
    fn the_user_signal_at_preemption_and_grace_times() {
        let r2205 = (22 << 16) | (5 << 8);
        let r2411 = (24 << 16) | (11 << 8);
        let c = parse_config(
            "KillWait                = 45 sec\nPreemptParameters       = send_user_signal\nSlurmctldParameters     = (null)\n",
        );
        assert_eq!((c.kill_wait_s, c.slurmctld_params.as_str()), (45, ""));
        assert!(c.sends_user_signal(r2411));
        assert!(!c.sends_user_signal(r2205), "22.05 has no PreemptParameters");
        let old = parse_config("SlurmctldParameters = enable_configless,PREEMPT_SEND_USER_SIGNAL\n");
        assert!(old.sends_user_signal(r2205) && old.sends_user_signal(r2411));
        assert_eq!(old.kill_wait_s, 30, "Slurm's default");
        let qos = parse_qos("low||cluster|00:05:00\nlong||cluster|1-00:00:00\nold||cluster\n");
        assert_eq!(qos.iter().map(|q| q.grace_s).collect::<Vec<_>>(), [Some(300), Some(86400), None]);
        let c = from_slurm_conf("PreemptParameters=send_user_signal\nKillWait=60\n", "slurm.conf")
            .config
            .unwrap();
        assert!(c.sends_user_signal(r2411));
        assert_eq!(c.kill_wait_s, 60);
    }

    #[test]
    fn slurm_conf_gives_the_same_facts() {
        let conf = "NodeName=DEFAULT RealMemory=4000\nNodeName=node[1-2] CPUs=8 Gres=gpu:h100:8 State=UNKNOWN\n\
                    NodeName=big Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=9000 Gres=gpu:a100:4\n\
                    PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n\
                    PartitionName=short Nodes=node[1-2] MaxTime=1:00:00 DefaultTime=10\nKillOnBadExit=1\n";
        let c = from_slurm_conf(conf, "/etc/slurm/slurm.conf");
        let parts = c.partitions.unwrap();
        assert_eq!(parts[0].name, "debug");
        assert!(parts[0].default);
        assert_eq!(parts[0].nodes.len(), 2);
        assert_eq!(parts[0].nodes[0].count, 2);
        assert_eq!(parts[0].nodes[1].cpus, 16);
        assert_eq!(parts[0].nodes[1].memory_mib, 9000);
        assert_eq!(
            parts[1].nodes,
            vec![Nodes { count: 2, cpus: 8, memory_mib: 4000, gres: values::parse_gres_list("gpu:h100:8") }]
        );
        assert_eq!(parts[1].max_time, Limit::Secs(3600));
        assert!(c.config.unwrap().kill_on_bad_exit);
        assert!(c.qos.is_err());
    }
}
