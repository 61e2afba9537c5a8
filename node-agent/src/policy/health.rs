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
//! gpu: driver/library mismatch: driver upgraded without a reboot; reboot
//! gpu: pcie gpu2 x8/16 gen5/5: link trained below the GPU's max; reseat or replace
//! ```
//!
//! The PCIe, NVLink, fabric, clock and mode checks are in [`crate::policy::checks`];
//! their faults are these same [`Fault`]s.
//!
//! [`is_agent_reason`] checks that grammar; a reason with the prefix alone
//! (`gpu: RMA ticket 42`) is not the agent's.

use std::fmt;

use gpu_health::nvlink5;
use gpu_health::xid::{self, Action};
use slurm_formats::pci::PciAddr;

use crate::config::{Policy, REASON_PREFIX};
pub use crate::policy::sample::{GpuSample, Hang, Remap};

/// Longest reason the agent writes (Slurm keeps more, `sinfo -R` shows 20).
const MAX_REASON: usize = 120;

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
    /// The GPU's bus id, when known.
    pub bus: Option<PciAddr>,
    /// Where it was seen first.
    pub source: XidSource,
    /// The kernel's time of the record (microseconds since boot), for one
    /// from the kernel log that carries it.
    pub kmsg_us: Option<u64>,
    /// An NVLink5 Xid (144-150) decoded from the kernel log's message
    /// ([`gpu_health::nvlink5`]); NVML's events carry no message.
    pub nvlink: Option<nvlink5::Decoded>,
}

/// An Xid seen this boot that still counts, as [`evaluate`] judges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidSeen {
    /// The Xid.
    pub xid: u32,
    /// The GPU's NVML index, when known.
    pub gpu: Option<u32>,
    /// Where it was seen first.
    pub source: XidSource,
    /// An NVLink5 occurrence decoded as needing a GPU reset: what it said.
    pub fatal: Option<String>,
}

impl XidEvent {
    /// A kernel-log event as the agent takes it in: a lost GPU is
    /// [`xid::LOST_WITHOUT_XID`]; the bus id is known, the NVML index not yet.
    pub fn from_kmsg(e: &xid::Event) -> XidEvent {
        let (code, bus, us, nvlink) = match e {
            xid::Event::Xid(r) => (r.xid, r.pci_bus_id, r.monotonic_us, nvlink5::decode(r.xid, &r.message)),
            xid::Event::Lost(l) => (xid::LOST_WITHOUT_XID, l.pci_bus_id, l.monotonic_us, None),
        };
        XidEvent { xid: code, gpu: None, bus: Some(bus), source: XidSource::Kmsg, kmsg_us: us, nvlink }
    }

    /// An NVML Xid event: the Xid as NVML gives it (one above `u32::MAX`
    /// becomes `u32::MAX`), and the device's index and bus id when readable.
    pub fn from_nvml(xid: u64, gpu: Option<u32>, bus: Option<PciAddr>) -> XidEvent {
        XidEvent {
            xid: u32::try_from(xid).unwrap_or(u32::MAX),
            gpu,
            bus,
            source: XidSource::Nvml,
            kmsg_us: None,
            nvlink: None,
        }
    }

    /// What the policy does about it: a decoded NVLink5 verdict decides
    /// unless the admin set an action for the Xid.
    pub fn action(&self, policy: &Policy) -> Action {
        if self.xid == xid::LOST_WITHOUT_XID {
            return policy.gpu_lost;
        }
        policy.xid_action_decoded(self.xid, self.nvlink.as_ref().map(|d| d.verdict))
    }
}

pub use gpu_health::reason::Class;

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
        self.reason_with("")
    }

    /// The same fault's key for counting reboots: class and GPU (`remap-pend gpu5`).
    pub fn key(&self) -> String {
        let gpu = self.gpu.map(|g| format!(" gpu{g}")).unwrap_or_default();
        format!("{}{gpu}", self.class.name())
    }

    /// The drain reason with `more` added to the details.
    pub fn reason_with(&self, more: &str) -> String {
        clip_reason(format!("{REASON_PREFIX}{} {}{more}", self.key(), self.detail))
    }
}

/// A reason as the agent writes it: one printable line of at most
/// [`MAX_REASON`] bytes (Slurm stores the reason as given).
pub fn clip_reason(mut r: String) -> String {
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

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.reason(), self.action)
    }
}

/// The faults in one set of samples and this boot's Xids, most severe first.
pub fn evaluate(
    samples: &[GpuSample],
    xids: &[XidSeen],
    expected: Option<u32>,
    policy: &Policy,
) -> Vec<Fault> {
    let mut faults = Vec::new();
    let mut push = |class: Class, gpu: Option<u32>, action: Action, detail: String| {
        faults.push(Fault { class, gpu, action, detail });
    };
    for s in samples {
        let g = Some(s.index);
        if let Some(h) = s.hang {
            if h.polls >= policy.nvml_hang_polls {
                push(
                    Class::NvmlHang,
                    g,
                    policy.nvml_hang,
                    format!("NVML calls have not returned for {} s ({} polls)", h.secs, h.polls),
                );
            }
            continue;
        }
        if s.lost {
            push(Class::Lost, g, policy.gpu_lost, "NVML: GPU is lost (fallen off the bus)".to_owned());
            continue;
        }
        if s.reset_required {
            push(
                Class::ResetRequired,
                g,
                policy.gpu_lost,
                "NVML: GPU needs a reset (reset it, then gpu-node-agent clear)".to_owned(),
            );
            continue;
        }
        if let Some(e) = &s.open_error {
            push(Class::Unusable, g, policy.gpu_lost, format!("NVML cannot open the GPU: {e}"));
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
            // NVIDIA's recovery actions (gpu_health::xid::recovery_action_name):
            // 2 asks for a reboot, the others for a person (a reset, a drain).
            let (action, detail) = match (a, xid::recovery_action_name(a)) {
                (1, _) => (
                    policy.recovery_action,
                    "driver asks for a GPU reset: reset it, then gpu-node-agent clear".to_owned(),
                ),
                (2, _) => (policy.recovery_reboot, "driver asks for a node reboot".to_owned()),
                (_, Some(what)) => (policy.recovery_action, format!("driver asks to {what}")),
                (_, None) => (
                    policy.recovery_action,
                    format!("driver asks for recovery action {a} (unknown to this agent)"),
                ),
            };
            push(Class::RecoveryAction(a), g, action, detail);
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
        if e.xid == xid::LOST_WITHOUT_XID {
            let detail = format!("kernel: GPU has fallen off the bus ({})", e.source.name());
            push(Class::Lost, e.gpu, policy.gpu_lost, detail);
            continue;
        }
        let (action, detail) = match &e.fatal {
            Some(what) => (
                policy.xid_action_decoded(e.xid, Some(nvlink5::Verdict::Reset)),
                format!("{} {what} ({})", xid::describe(e.xid), e.source.name()),
            ),
            None => (policy.xid_action(e.xid), format!("{} ({})", xid::describe(e.xid), e.source.name())),
        };
        push(Class::Xid(e.xid), e.gpu, action, detail);
    }
    sort(&mut faults);
    faults
}

/// Orders faults most severe first (see [`worst`]).
pub fn sort(faults: &mut [Fault]) {
    faults.sort_by_key(|f| std::cmp::Reverse(severity(f.action)));
}

/// The fault for an NVML library that does not match the loaded driver.
pub fn driver_mismatch(policy: &Policy) -> Fault {
    Fault {
        class: Class::DriverMismatch,
        gpu: None,
        action: policy.gpu_lost,
        detail: "mismatch: driver upgraded without a reboot; reboot".to_owned(),
    }
}

/// Severity for the node: a drain (a person looks) beats a reboot that puts
/// the node back in service by itself.
fn severity(a: Action) -> u8 {
    match a {
        Action::Ignore => 0,
        Action::Warn => 1,
        Action::Reboot => 2,
        Action::Drain => 3,
    }
}

/// The most severe fault that asks for a node action: a drain if any, else a
/// reboot.
pub fn worst(faults: &[Fault]) -> Option<&Fault> {
    faults.first().filter(|f| f.action >= Action::Drain)
}

/// Whether `reason` has the exact grammar of the agent's reasons: the prefix,
/// a class name, an optional `gpuN`, and details.
pub fn is_agent_reason(reason: &str) -> bool {
    gpu_health::reason::parse(reason).is_some()
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

    fn xid(x: u32, gpu: u32) -> XidSeen {
        XidSeen { xid: x, gpu: Some(gpu), source: XidSource::Nvml, fatal: None }
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
    fn a_drain_beats_a_reboot() {
        let mut s = healthy(8);
        s[5].remap = Some(Remap { uncorrectable: 1, pending: true, ..Remap::default() });
        let f = evaluate(&s, &[xid(79, 3)], Some(8), &Policy::default());
        assert_eq!(worst(&f).unwrap().class, Class::Xid(79));
        assert_eq!(f[1].action, Action::Reboot);
    }

    #[test]
    fn nvml_lost_reset_unopenable_and_kernel_lost_are_faults() {
        let mut s = healthy(8);
        s[1].reset_required = true;
        s[2].open_error = Some("Unknown Error".to_owned());
        let lost = XidSeen { xid: xid::LOST_WITHOUT_XID, ..xid(0, 4) };
        let f = evaluate(&s, &[lost], Some(8), &Policy::default());
        let reasons: Vec<String> = f.iter().map(Fault::reason).collect();
        assert!(
            reasons.iter().any(|r| r.starts_with("gpu: reset gpu1 NVML: GPU needs a reset")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|r| r.starts_with("gpu: unusable gpu2 NVML cannot open the GPU")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|r| r == "gpu: lost gpu4 kernel: GPU has fallen off the bus (nvml)"),
            "{reasons:?}"
        );
        assert!(f.iter().all(|f| f.action == Action::Drain));
        let m = driver_mismatch(&Policy::default());
        assert!(m.reason().starts_with("gpu: driver/library mismatch"), "{}", m.reason());
    }

    #[test]
    fn recovery_actions_map_as_nvidia_says() {
        let with = |a: u32| {
            let mut s = healthy(1);
            s[0].recovery_action = Some(a);
            evaluate(&s, &[], Some(1), &Policy::default()).remove(0)
        };
        let reset = with(1);
        assert_eq!(reset.action, Action::Drain);
        assert!(reset.reason().contains("reset"), "{}", reset.reason());
        assert_eq!(with(2).action, Action::Reboot);
        for a in [3, 4, 5, 6, 7] {
            let f = with(a);
            assert_eq!(f.action, Action::Drain, "{a}");
            assert!(!f.reason().contains("unknown"), "{a}: {}", f.reason());
        }
        assert!(with(9).reason().contains("unknown"));
    }

    #[test]
    fn only_the_exact_grammar_is_the_agents() {
        for r in [
            "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)",
            "gpu: missing 7/8 GPUs visible, Slurm expects 8",
            "gpu: remap-pend gpu5 row remap pending (1 uncorrectable): reset needed",
            "gpu: driver/library mismatch: driver upgraded without a reboot; reboot",
        ] {
            assert!(is_agent_reason(r), "{r}");
        }
        for r in [
            "gpu: RMA ticket 42",
            "gpu: xid79",
            "gpu: xid gpu3 x",
            "gpu:xid79 gpu3 x",
            "GPU: xid79 gpu3 x",
            "gpu: lost gpu3",
            "",
        ] {
            assert!(!is_agent_reason(r), "{r}");
        }
    }

    #[test]
    fn a_hung_gpu_is_judged_after_nvml_hang_polls_and_the_others_still_are() {
        let mut s = healthy(8);
        s[0] = GpuSample { index: 0, hang: Some(Hang { secs: 10, polls: 2 }), ..GpuSample::default() };
        s[5].lost = true;
        let p = Policy::default();
        let f = evaluate(&s, &[], Some(8), &p);
        assert_eq!(f.len(), 1, "before nvml_hang_polls only GPU 5's fault: {f:?}");
        assert_eq!(worst(&f).unwrap().reason(), "gpu: lost gpu5 NVML: GPU is lost (fallen off the bus)");
        s[0].hang = Some(Hang { secs: 95, polls: 3 });
        let f = evaluate(&s[..1], &[], Some(1), &p);
        let w = worst(&f).unwrap();
        assert_eq!(w.reason(), "gpu: hung gpu0 NVML calls have not returned for 95 s (3 polls)");
        assert_eq!(w.action, Action::Drain);
        let warn = Policy { nvml_hang: Action::Warn, nvml_hang_polls: 10, ..Policy::default() };
        assert!(evaluate(&s[..1], &[], Some(1), &warn).is_empty());
    }

    #[test]
    fn a_fatal_nvlink5_xid_drains_and_a_benign_one_warns() {
        let line = |status: &str| {
            format!(
                "6,2001,9123456789,-;NVRM: Xid (PCI:0000:61:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02 (0x00000004 {status} 0x00000000 0x00000000)"
            )
        };
        let p = Policy::default();
        let fatal = XidEvent::from_kmsg(&xid::Event::Xid(xid::parse_line(&line("0x00000040")).unwrap()));
        assert_eq!(fatal.nvlink.as_ref().map(|d| d.verdict), Some(nvlink5::Verdict::Reset));
        assert_eq!(fatal.action(&p), Action::Drain);
        let benign = XidEvent::from_kmsg(&xid::Event::Xid(xid::parse_line(&line("0x00000001")).unwrap()));
        assert_eq!(benign.action(&p), Action::Warn);
        // An admin's action for the Xid wins over the decoding.
        let mut own = Policy::default();
        own.xid.insert(145, Action::Warn);
        assert_eq!(fatal.action(&own), Action::Warn);
        let seen = XidSeen { fatal: fatal.nvlink.as_ref().map(nvlink5::Decoded::describe), ..xid(145, 2) };
        let f = evaluate(&healthy(8), &[seen], Some(8), &p);
        let w = worst(&f).unwrap();
        assert!(
            w.reason().starts_with("gpu: xid145 gpu2 NVLink RLW error RLW_REMAP status 0x00000040 link 2"),
            "{}",
            w.reason()
        );
        assert!(w.reason()[..20].contains("xid145 gpu2"));
    }

    #[test]
    fn reasons_stay_short_and_printable() {
        let f =
            Fault { class: Class::Xid(1), gpu: Some(0), action: Action::Drain, detail: "é\n".repeat(200) };
        let r = f.reason();
        assert!(r.len() <= MAX_REASON && !r.contains('\n'), "{r}");
    }
}
