//! A job's GPU use on one node, as the agent sums it up and `spank-gpu usage`
//! and `autopsy` read it: one grammar, written by the agent (its live file on
//! the node, and the job's `AdminComment` at the job's end), read by the CLI.
//!
//! One node's summary is one word (no spaces, no `|`, which `sacct
//! --parsable2` separates fields with), so several nodes' summaries and a
//! site's own text share one `AdminComment`:
//!
//! ```text
//! sgu1;node=gpu07;t=10;from=1733412000;to=1733412030;idle=0;g=0:GPU-5f1c…:95.0:99:40960:81559:0:3:1:e14000;g=4:GPU-…:0.0:0:0:81559:3:3:0:e2100
//! ```
//!
//! * `t` the sampling interval in seconds; `from`/`to` the first and last
//!   sample (Unix seconds); `idle` the longest run, in seconds, in which
//!   every GPU of the job on this node was idle;
//! * one `g=` per GPU (or MIG device): `INDEX[.MIG]:UUID:MEAN:MAX:MEM:TOTAL:IDLE:SAMPLES:PROCS[:shared][:eJOULES]`:
//!   NVML's index (and the MIG device's index in its GPU), the UUID, the
//!   utilization's mean (one decimal) and maximum in percent (`-` where NVML
//!   does not report it: MIG devices), the most memory used and the memory
//!   (MiB), the samples at 0 % (or, without a utilization, with no process),
//!   the samples, the most compute processes seen at once; `shared` when
//!   another job held the GPU too (a shard): the figures are the GPU's, not
//!   the job's alone; `e` and the energy the GPU used while the job held it,
//!   in joules, from NVML's energy counter (none where NVML has no counter:
//!   GPUs before Volta, MIG devices, whose counter is the whole GPU's).
//!
//! Unknown keys are skipped, and so are unknown fields after `PROCS`, so a
//! newer agent's words still read. The energy came later within version 1
//! (older agents' words have none: it reads as unknown) rather than as a
//! `sgu2`, which every older CLI would skip whole: `shared` stays the tenth
//! field, the one older CLIs look at, and `e…` comes after it.

use std::fmt::Write as _;

/// The word every summary starts with (`sgu`: spank-gpu usage, version 1).
pub const TAG: &str = "sgu1";

/// One GPU (or MIG device) of a job on one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuUsage {
    /// NVML's index of the GPU.
    pub gpu: u32,
    /// The MIG device's index in its GPU, for a MIG device.
    pub mig: Option<u32>,
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// Mean utilization in percent, `None` where NVML does not report it.
    pub util_mean: Option<f64>,
    /// Highest utilization in percent.
    pub util_max: Option<u32>,
    /// Most memory used, in bytes (kept in MiB).
    pub mem_max_bytes: u64,
    /// The GPU's (or MIG device's) memory, in bytes (kept in MiB).
    pub mem_total_bytes: u64,
    /// Samples at 0 % utilization (without a utilization: with no process).
    pub idle_samples: u64,
    /// Samples taken.
    pub samples: u64,
    /// Most compute processes seen at once.
    pub procs_max: u32,
    /// Another job held the GPU at the same time.
    pub shared: bool,
    /// Energy the GPU used while the job held it, in joules (the whole
    /// GPU's where `shared`); `None`: unknown (no energy counter, or fewer
    /// than two readings of it).
    pub energy_j: Option<u64>,
}

impl GpuUsage {
    /// The share of samples that were idle (0 with no sample).
    pub fn idle_fraction(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { ratio(self.idle_samples, self.samples) }
    }

    /// Never seen busy: no utilization above 0 and no process.
    pub fn never_used(&self) -> bool {
        self.samples > 0 && self.util_max.unwrap_or(0) == 0 && self.procs_max == 0
    }

    /// `3`, or `3.1` for a MIG device.
    pub fn label(&self) -> String {
        match self.mig {
            Some(m) => format!("{}.{m}", self.gpu),
            None => self.gpu.to_string(),
        }
    }
}

/// One node's summary of a job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeUsage {
    /// The node's Slurm name.
    pub node: String,
    /// Seconds between samples.
    pub interval_s: u64,
    /// First sample, Unix seconds.
    pub from: u64,
    /// Last sample, Unix seconds.
    pub to: u64,
    /// Longest run in which every GPU of the job here was idle, in seconds.
    pub longest_idle_s: u64,
    /// The job's GPUs here, by index.
    pub gpus: Vec<GpuUsage>,
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b as f64
}

const MIB: u64 = 1 << 20;

/// A node name as it may appear in a summary: what Slurm allows in a node
/// name, without the grammar's separators.
fn clean_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn clean_uuid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 96 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/'))
}

impl NodeUsage {
    /// The summary as one word (see the module docs). A node name or UUID
    /// outside the grammar is written as `?`.
    pub fn to_word(&self) -> String {
        let node = if clean_name(&self.node) { self.node.as_str() } else { "?" };
        let mut w = format!(
            "{TAG};node={node};t={};from={};to={};idle={}",
            self.interval_s, self.from, self.to, self.longest_idle_s
        );
        for g in &self.gpus {
            let uuid = if clean_uuid(&g.uuid) { g.uuid.as_str() } else { "?" };
            let mean = g.util_mean.map_or_else(|| "-".to_owned(), |m| format!("{m:.1}"));
            let max = g.util_max.map_or_else(|| "-".to_owned(), |m| m.to_string());
            let _ = write!(
                w,
                ";g={}:{uuid}:{mean}:{max}:{}:{}:{}:{}:{}",
                g.label(),
                g.mem_max_bytes.div_ceil(MIB),
                g.mem_total_bytes / MIB,
                g.idle_samples,
                g.samples,
                g.procs_max
            );
            if g.shared {
                w.push_str(":shared");
            }
            if let Some(j) = g.energy_j {
                let _ = write!(w, ":e{j}");
            }
        }
        w
    }

    /// The same without the GPUs' UUIDs (`-`): about 35 bytes per GPU, for
    /// a job on so many nodes that every node's UUIDs would not fit.
    pub fn without_uuids(&self) -> NodeUsage {
        let mut u = self.clone();
        for g in &mut u.gpus {
            g.uuid = "-".to_owned();
        }
        u
    }

    /// Reads one word; `None` when it is not a summary.
    pub fn parse_word(word: &str) -> Option<NodeUsage> {
        let mut parts = word.split(';');
        if parts.next()? != TAG {
            return None;
        }
        let mut u = NodeUsage::default();
        for part in parts {
            let (key, value) = part.split_once('=')?;
            match key {
                "node" => u.node = value.to_owned(),
                "t" => u.interval_s = value.parse().ok()?,
                "from" => u.from = value.parse().ok()?,
                "to" => u.to = value.parse().ok()?,
                "idle" => u.longest_idle_s = value.parse().ok()?,
                "g" => u.gpus.push(parse_gpu(value)?),
                _ => {}
            }
        }
        (!u.node.is_empty()).then_some(u)
    }
}

fn parse_gpu(value: &str) -> Option<GpuUsage> {
    let f: Vec<&str> = value.split(':').collect();
    if f.len() < 9 {
        return None;
    }
    let (gpu, mig) = match f[0].split_once('.') {
        Some((g, m)) => (g.parse().ok()?, Some(m.parse().ok()?)),
        None => (f[0].parse().ok()?, None),
    };
    let opt_f = |s: &str| {
        if s == "-" { Some(None) } else { s.parse::<f64>().ok().filter(|v| v.is_finite()).map(Some) }
    };
    let opt_u = |s: &str| if s == "-" { Some(None) } else { s.parse::<u32>().ok().map(Some) };
    // Slurm 22.05's sacctmgr lowercases what it stores (`strip_quotes(...,
    // 1)`): NVML's prefixes come back.
    let uuid = match f[1].get(..4) {
        Some("gpu-") => format!("GPU-{}", &f[1][4..]),
        Some("mig-") => format!("MIG-{}", &f[1][4..]),
        _ => f[1].to_owned(),
    };
    Some(GpuUsage {
        gpu,
        mig,
        uuid,
        util_mean: opt_f(f[2])?,
        util_max: opt_u(f[3])?,
        mem_max_bytes: f[4].parse::<u64>().ok()?.saturating_mul(MIB),
        mem_total_bytes: f[5].parse::<u64>().ok()?.saturating_mul(MIB),
        idle_samples: f[6].parse().ok()?,
        samples: f[7].parse().ok()?,
        procs_max: f[8].parse().ok()?,
        shared: f[9..].contains(&"shared"),
        energy_j: f[9..].iter().find_map(|x| x.strip_prefix('e')?.parse().ok()),
    })
}

/// Every summary in a text (an `AdminComment`, a live file, several
/// nodes' lines), in order; the rest of the text is skipped.
pub fn parse_all(text: &str) -> Vec<NodeUsage> {
    text.split_whitespace().filter_map(NodeUsage::parse_word).collect()
}

/// Whether `text` holds `word`, whatever the case: Slurm 22.05's sacctmgr
/// stores an `AdminComment` lowercased (sacctmgr/common.c `strip_quotes`
/// with `make_lower`; 24.11 and later keep it as given).
pub fn holds(text: &str, word: &str) -> bool {
    text.split_whitespace().any(|w| w.eq_ignore_ascii_case(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeUsage {
        NodeUsage {
            node: "gpu07".into(),
            interval_s: 10,
            from: 1_733_412_000,
            to: 1_733_412_030,
            longest_idle_s: 0,
            gpus: vec![
                GpuUsage {
                    gpu: 0,
                    mig: None,
                    uuid: "GPU-5f1c0a04-7d2e-4b1a-9c3e-000000000004".into(),
                    util_mean: Some(95.0),
                    util_max: Some(99),
                    mem_max_bytes: 40960 * MIB,
                    mem_total_bytes: 81559 * MIB,
                    idle_samples: 0,
                    samples: 3,
                    procs_max: 1,
                    shared: false,
                    energy_j: Some(2_520_000),
                },
                GpuUsage {
                    gpu: 2,
                    mig: Some(1),
                    uuid: "MIG-0c6e5b3a-1111-2222-3333-444455556666".into(),
                    util_mean: None,
                    util_max: None,
                    mem_max_bytes: 0,
                    mem_total_bytes: 9728 * MIB,
                    idle_samples: 3,
                    samples: 3,
                    procs_max: 0,
                    shared: true,
                    energy_j: None,
                },
            ],
        }
    }

    #[test]
    fn a_summary_reads_back_as_written() {
        let u = sample();
        let w = u.to_word();
        assert!(!w.contains(' ') && !w.contains('|'), "{w}");
        assert_eq!(NodeUsage::parse_word(&w), Some(u));
    }

    #[test]
    fn energy_is_an_extra_field_that_older_words_and_readers_do_without() {
        let mut u = sample();
        u.gpus[1].energy_j = Some(7);
        let w = u.to_word();
        assert!(w.contains(":1:e2520000;g=2.1:") && w.ends_with(":0:shared:e7"), "{w}");
        // An older agent's word (no energy) reads, its energy unknown.
        let old = "sgu1;node=gpu07;t=10;from=1;to=2;idle=0;g=0:GPU-a:95.0:99:1:2:0:3:1;g=1:GPU-b:1.0:5:1:2:0:3:1:shared";
        let back = NodeUsage::parse_word(old).unwrap_or_default();
        assert_eq!(
            back.gpus.iter().map(|g| (g.energy_j, g.shared)).collect::<Vec<_>>(),
            [(None, false), (None, true)]
        );
        // What an older CLI reads of a new word: nine fields at least, and
        // `shared` as the tenth (it reads nothing past it).
        for g in w.split(';').filter_map(|p| p.strip_prefix("g=")) {
            let f: Vec<&str> = g.split(':').collect();
            assert!(f.len() >= 9, "{g}");
            assert_eq!(f.get(9) == Some(&"shared"), g.contains(":shared"), "{g}");
        }
        // A newer agent's extra field is skipped, in any place after PROCS.
        let newer = "sgu1;node=a;g=0:GPU-a:95.0:99:1:2:0:3:1:z9:e12:shared";
        let g = &NodeUsage::parse_word(newer).unwrap_or_default().gpus[0];
        assert_eq!((g.energy_j, g.shared), (Some(12), true));
        // A malformed energy is unknown, the rest kept.
        let bad = NodeUsage::parse_word("sgu1;node=a;g=0:GPU-a:95.0:99:1:2:0:3:1:e-5").unwrap_or_default();
        assert_eq!((bad.gpus.len(), bad.gpus[0].energy_j), (1, None));
        // 22.05's lowercased store reads the same.
        assert_eq!(NodeUsage::parse_word(&w.to_ascii_lowercase()).map(|b| b.gpus[1].energy_j), Some(Some(7)));
    }

    #[test]
    fn memory_rounds_up_to_a_mib_so_a_used_gpu_never_reads_as_zero() {
        let mut u = sample();
        u.gpus[0].mem_max_bytes = 1;
        let back = NodeUsage::parse_word(&u.to_word()).unwrap_or_default();
        assert_eq!(back.gpus[0].mem_max_bytes, MIB);
    }

    #[test]
    fn words_outside_the_grammar_are_not_summaries() {
        for w in ["", "sgu1", "sgu1;node=", "sgu2;node=a", "JS1:abc", "sgu1;node=a;g=0:x", "sgu1;node=a;t=x"]
        {
            assert_eq!(NodeUsage::parse_word(w), None, "{w}");
        }
        // A key of a newer agent is skipped.
        assert!(NodeUsage::parse_word("sgu1;node=a;new=1").is_some());
    }

    #[test]
    fn names_outside_the_grammar_are_not_written() {
        let mut u = sample();
        u.node = "a;g=9".into();
        u.gpus[0].uuid = "GPU:1 2".into();
        let w = u.to_word();
        let back = NodeUsage::parse_word(&w).unwrap_or_default();
        assert_eq!(back.node, "?");
        assert_eq!(back.gpus.len(), 2);
        assert_eq!(back.gpus[0].uuid, "?");
    }

    #[test]
    fn merge_replaces_only_this_nodes_summary() {
        let a = sample().to_word();
        let mut b = sample();
        b.node = "gpu08".into();
        let b = b.to_word();
        let text = format!("JS1:site-words {a} {b}");
        let mut a2 = sample();
        a2.gpus[0].samples = 9;
        let merged = crate::admin_comment::merge(&text, "gpu07", &a2.to_word());
        let all = parse_all(&merged);
        assert!(merged.starts_with("JS1:site-words "));
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].node, "gpu08");
        assert_eq!(all[1].gpus[0].samples, 9);
        assert_eq!(crate::admin_comment::merge("", "gpu07", &a), a);
    }

    #[test]
    fn without_uuids_a_gpu_takes_about_35_bytes() {
        let u = sample().without_uuids();
        let w = u.to_word();
        // GPU 0 takes 41 bytes, 9 of them its energy (2.5 MJ: 700 W for an hour).
        assert!(w.len() < 150, "{w}");
        assert_eq!(NodeUsage::parse_word(&w).map(|b| b.gpus[0].uuid.clone()), Some("-".to_owned()));
    }

    #[test]
    fn what_22_05_s_sacctmgr_stored_lowercased_reads_back() {
        let w = sample().to_word();
        let stored = format!("js1:site {}", w.to_ascii_lowercase());
        assert!(holds(&stored, &w));
        let back = parse_all(&stored);
        assert_eq!(back[0].gpus[0].uuid, sample().gpus[0].uuid);
        assert_eq!(back[0].gpus[1].uuid, sample().gpus[1].uuid);
        let mut upper = sample();
        upper.node = "GPU07".into();
        let merged = crate::admin_comment::merge(&stored, "GPU07", &upper.to_word());
        assert_eq!(parse_all(&merged).len(), 1, "{merged}");
    }

    #[test]
    fn findings_inputs() {
        let u = sample();
        assert!(!u.gpus[0].never_used());
        assert!(u.gpus[1].never_used());
        assert!((u.gpus[1].idle_fraction() - 1.0).abs() < 1e-9);
        assert_eq!(u.gpus[1].label(), "2.1");
    }
}
