//! From what the GPUs report to faults, actions and drain reasons. Pure.
//!
//! A drain reason is `gpu: CLASS gpuN DETAIL`: the fixed prefix, then the
//! class and GPU within the first 20 characters (what `sinfo -R` shows), then
//! the details. Examples:
//!
//! ```text
//! gpu: xid79 gpu3 GPU has fallen off the bus (nvml)
//! gpu: ecc-dbe gpu2 2 volatile uncorrectable ECC errors
//! gpu: remap-fail gpu5 row remap failed: replace GPU
//! gpu: missing 7/8 GPUs visible, Slurm expects 8
//! ```

use std::fmt;

use gpu_core::xid::{self, Action};

use crate::config::{Policy, REASON_PREFIX};

/// Longest reason the agent writes (Slurm keeps more, `sinfo -R` shows 20).
const MAX_REASON: usize = 120;

/// What NVML said about one GPU in one poll.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// NVML index.
    pub index: u32,
    /// `GPU-...`, when readable.
    pub uuid: Option<String>,
    /// `00000000:1B:00.0`, when readable.
    pub bus_id: Option<String>,
    /// `/dev/nvidiaN` minor.
    pub minor: Option<u32>,
    /// Volatile uncorrectable ECC errors (`None`: not supported or unreadable).
    pub ecc_uncorrectable: Option<u64>,
    /// Remapped rows, when supported.
    pub remap: Option<Remap>,
    /// The driver's recovery action field (0 = none), when supported.
    pub recovery_action: Option<u32>,
    /// NVML says the GPU is lost.
    pub lost: bool,
}

/// Row-remapping state of a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remap {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remap waits for a GPU reset.
    pub pending: bool,
    /// A remap failed.
    pub failure: bool,
}

/// Where an Xid was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XidSource {
    /// An NVML event set.
    Nvml,
    /// The kernel log.
    Kmsg,
}

impl XidSource {
    /// Short name for reasons and logs.
    pub fn name(self) -> &'static str {
        match self {
            XidSource::Nvml => "nvml",
            XidSource::Kmsg => "kmsg",
        }
    }
}

/// An Xid seen this boot, attributed to a GPU where possible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidEvent {
    /// The Xid.
    pub xid: u32,
    /// The GPU's NVML index, when known.
    pub gpu: Option<u32>,
    /// The GPU's bus id as `xid::normalize_pci` writes it, when known.
    pub bus: Option<String>,
    /// Where it was seen first.
    pub source: XidSource,
}

/// The kind of a fault; its name starts the drain reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// An Xid.
    Xid(u32),
    /// Volatile uncorrectable (double-bit) ECC errors.
    EccUncorrectable,
    /// Row remap pending.
    RemapPending,
    /// Row remap failure.
    RemapFailure,
    /// GPU lost.
    Lost,
    /// Fewer GPUs than expected.
    Missing,
    /// The driver's recovery action asks for something.
    RecoveryAction(u32),
}

impl Class {
    /// The class as written in reasons: `xid79`, `ecc-dbe`, ...
    pub fn name(&self) -> String {
        match self {
            Class::Xid(x) => format!("xid{x}"),
            Class::EccUncorrectable => "ecc-dbe".to_owned(),
            Class::RemapPending => "remap-pend".to_owned(),
            Class::RemapFailure => "remap-fail".to_owned(),
            Class::Lost => "lost".to_owned(),
            Class::Missing => "missing".to_owned(),
            Class::RecoveryAction(a) => format!("recovery{a}"),
        }
    }

    /// Whether only a reboot (or a hardware swap) clears it: such a drain is
    /// resumed only after the node rebooted.
    pub fn needs_reboot(&self) -> bool {
        !matches!(self, Class::RemapPending)
    }
}

/// One thing wrong with the node's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What kind.
    pub class: Class,
    /// Which GPU (NVML index), when known.
    pub gpu: Option<u32>,
    /// What the policy says to do.
    pub action: Action,
    /// Human details.
    pub detail: String,
}

impl Fault {
    /// The drain reason for this fault (see the module docs).
    pub fn reason(&self) -> String {
        let gpu = self.gpu.map(|g| format!(" gpu{g}")).unwrap_or_default();
        let mut r = format!("{REASON_PREFIX}{}{gpu} {}", self.class.name(), self.detail);
        // Slurm stores the reason as given; keep it one short, printable line.
        r.retain(|c| !c.is_control());
        if r.len() > MAX_REASON {
            let mut end = MAX_REASON;
            while !r.is_char_boundary(end) {
                end -= 1;
            }
            r.truncate(end);
        }
        r
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.reason(), self.action)
    }
}

/// The faults in one set of samples and this boot's Xids, most severe first.
pub fn evaluate(
    samples: &[GpuSample],
    xids: &[XidEvent],
    expected: Option<u32>,
    policy: &Policy,
) -> Vec<Fault> {
    let mut faults = Vec::new();
    let mut push = |class: Class, gpu: Option<u32>, action: Action, detail: String| {
        faults.push(Fault { class, gpu, action, detail });
    };
    for s in samples {
        let g = Some(s.index);
        if s.lost {
            push(Class::Lost, g, policy.gpu_lost, "NVML: GPU is lost (fallen off the bus)".to_owned());
            continue;
        }
        if let Some(n) = s.ecc_uncorrectable.filter(|n| *n > 0) {
            push(
                Class::EccUncorrectable,
                g,
                policy.ecc_uncorrectable,
                format!("{n} volatile uncorrectable ECC errors"),
            );
        }
        if let Some(r) = s.remap {
            if r.failure {
                push(
                    Class::RemapFailure,
                    g,
                    policy.remap_failure,
                    "row remap failed: replace GPU".to_owned(),
                );
            } else if r.pending {
                push(
                    Class::RemapPending,
                    g,
                    policy.remap_pending,
                    format!("row remap pending ({} uncorrectable): reset needed", r.uncorrectable),
                );
            }
        }
        if let Some(a) = s.recovery_action.filter(|a| *a != 0) {
            let what = match a {
                1 => "GPU reset",
                2 => "node reboot",
                3 => "drain peer-to-peer",
                4 => "drain and reset",
                _ => "unknown action",
            };
            push(Class::RecoveryAction(a), g, policy.recovery_action, format!("driver asks for {what}"));
        }
    }
    if let Some(want) = expected {
        let seen = u32::try_from(samples.len()).unwrap_or(u32::MAX);
        if seen < want {
            push(
                Class::Missing,
                None,
                policy.gpu_missing,
                format!("{seen}/{want} GPUs visible, Slurm expects {want}"),
            );
        }
    }
    let mut seen_xids: Vec<(u32, Option<u32>)> = Vec::new();
    for e in xids {
        if seen_xids.contains(&(e.xid, e.gpu)) {
            continue;
        }
        seen_xids.push((e.xid, e.gpu));
        let detail = format!("{} ({})", xid::describe(e.xid), e.source.name());
        push(Class::Xid(e.xid), e.gpu, policy.xid_action(e.xid), detail);
    }
    faults.sort_by_key(|f| std::cmp::Reverse(f.action));
    faults
}

/// The most severe fault that asks for a node action (drain or reboot).
pub fn worst(faults: &[Fault]) -> Option<&Fault> {
    faults.first().filter(|f| f.action >= Action::Drain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(n: u32) -> Vec<GpuSample> {
        (0..n)
            .map(|i| GpuSample {
                index: i,
                ecc_uncorrectable: Some(0),
                remap: Some(Remap::default()),
                recovery_action: Some(0),
                ..GpuSample::default()
            })
            .collect()
    }

    fn xid(x: u32, gpu: u32) -> XidEvent {
        XidEvent { xid: x, gpu: Some(gpu), bus: None, source: XidSource::Nvml }
    }

    #[test]
    fn healthy_gpus_have_no_faults() {
        assert!(evaluate(&healthy(8), &[], Some(8), &Policy::default()).is_empty());
    }

    #[test]
    fn xid79_drains_with_a_reason_sinfo_can_show() {
        let f = evaluate(&healthy(8), &[xid(79, 3)], Some(8), &Policy::default());
        let w = worst(&f).unwrap();
        assert_eq!(w.action, Action::Drain);
        let reason = w.reason();
        assert_eq!(reason, "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)");
        // Class and GPU within the 20 characters sinfo -R shows.
        assert!(reason[..20].contains("xid79 gpu3"));
    }

    #[test]
    fn application_xids_never_drain() {
        for x in [13, 31, 43, 45] {
            let f = evaluate(&healthy(8), &[xid(x, 0)], Some(8), &Policy::default());
            assert!(worst(&f).is_none(), "Xid {x}: {f:?}");
        }
    }

    #[test]
    fn ecc_remap_lost_and_missing() {
        let mut s = healthy(8);
        s[2].ecc_uncorrectable = Some(2);
        let f = evaluate(&s, &[], Some(8), &Policy::default());
        assert_eq!(worst(&f).unwrap().reason(), "gpu: ecc-dbe gpu2 2 volatile uncorrectable ECC errors");

        let mut s = healthy(8);
        s[5].remap = Some(Remap { uncorrectable: 1, pending: true, ..Remap::default() });
        let f = evaluate(&s, &[], Some(8), &Policy::default());
        assert_eq!(worst(&f).unwrap().action, Action::Reboot);
        assert!(worst(&f).unwrap().reason().starts_with("gpu: remap-pend gpu5"));
        assert!(!worst(&f).unwrap().class.needs_reboot());

        let mut s = healthy(8);
        s[5].remap = Some(Remap { pending: true, failure: true, ..Remap::default() });
        let f = evaluate(&s, &[], Some(8), &Policy::default());
        assert_eq!(worst(&f).unwrap().class, Class::RemapFailure);

        let mut s = healthy(8);
        s[1].lost = true;
        let f = evaluate(&s, &[], Some(8), &Policy::default());
        assert_eq!(worst(&f).unwrap().class, Class::Lost);

        let f = evaluate(&healthy(7), &[], Some(8), &Policy::default());
        assert_eq!(worst(&f).unwrap().reason(), "gpu: missing 7/8 GPUs visible, Slurm expects 8");
    }

    #[test]
    fn the_same_xid_twice_is_one_fault_and_severity_orders() {
        let f = evaluate(&healthy(8), &[xid(31, 0), xid(79, 3), xid(79, 3)], None, &Policy::default());
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].class, Class::Xid(79));
    }

    #[test]
    fn policy_overrides_apply() {
        let mut p = Policy::default();
        p.xid.insert(79, Action::Warn);
        let f = evaluate(&healthy(8), &[xid(79, 3)], None, &p);
        assert!(worst(&f).is_none());
    }

    #[test]
    fn reasons_stay_short_and_printable() {
        let f =
            Fault { class: Class::Xid(1), gpu: Some(0), action: Action::Drain, detail: "é\n".repeat(200) };
        let r = f.reason();
        assert!(r.len() <= MAX_REASON && !r.contains('\n'), "{r}");
    }
}
