//! The drain reasons of `gpu-node-agent`: one grammar, written by the agent,
//! recognised by the agent (whose drain is whose) and by `spank-gpu why` and
//! `autopsy` (what a drain means for a user).
//!
//! A reason is `gpu: CLASS gpuN DETAIL`: the fixed prefix, then the class
//! and GPU within the first 20 characters (what `sinfo -R` shows), then the
//! details (`gpu: xid79 gpu3 GPU has fallen off the bus (nvml)`,
//! `gpu: missing 7/8 GPUs visible, Slurm expects 8`). The prefix alone does
//! not make a reason the agent's: `gpu: RMA ticket 42` is an admin's.

/// The prefix of every drain reason the agent writes.
pub const PREFIX: &str = "gpu: ";

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
    /// NVML says the GPU needs a reset.
    ResetRequired,
    /// NVML cannot open the GPU.
    Unusable,
    /// The NVML library does not match the loaded driver (upgraded without a
    /// reboot): every GPU job fails.
    DriverMismatch,
    /// The PCIe link trained below the GPU's maximum.
    Pcie,
    /// An NVLink is down.
    NvLinkDown,
    /// NVLink error counters grow too fast.
    NvLinkErrors,
    /// The NVSwitch fabric registration failed or never completed.
    Fabric,
    /// A hardware slowdown (or power brake) in consecutive checks.
    Slowdown,
    /// ECC mode off.
    EccOff,
    /// Persistence mode off.
    PersistenceOff,
    /// NVML calls on the GPU stopped returning (past `nvml_timeout`, for
    /// `nvml_hang_polls` polls in a row).
    NvmlHang,
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
            Class::ResetRequired => "reset".to_owned(),
            Class::Unusable => "unusable".to_owned(),
            Class::DriverMismatch => "driver/library".to_owned(),
            Class::Pcie => "pcie".to_owned(),
            Class::NvLinkDown => "nvlink".to_owned(),
            Class::NvLinkErrors => "nvlink-err".to_owned(),
            Class::Fabric => "fabric".to_owned(),
            Class::Slowdown => "slowdown".to_owned(),
            Class::EccOff => "ecc-off".to_owned(),
            Class::PersistenceOff => "persist".to_owned(),
            Class::NvmlHang => "hung".to_owned(),
        }
    }

    /// The class a reason's first word names (`xid79`, `ecc-dbe`, ...).
    pub fn parse(word: &str) -> Option<Class> {
        let numbered = |prefix: &str| {
            word.strip_prefix(prefix)
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u32>().ok())
        };
        if let Some(x) = numbered("xid") {
            return Some(Class::Xid(x));
        }
        if let Some(a) = numbered("recovery") {
            return Some(Class::RecoveryAction(a));
        }
        Class::NAMED.iter().find(|c| c.name() == word).cloned()
    }

    /// Every class without a number.
    pub const NAMED: [Class; 16] = [
        Class::EccUncorrectable,
        Class::RemapPending,
        Class::RemapFailure,
        Class::Lost,
        Class::Missing,
        Class::ResetRequired,
        Class::Unusable,
        Class::DriverMismatch,
        Class::Pcie,
        Class::NvLinkDown,
        Class::NvLinkErrors,
        Class::Fabric,
        Class::Slowdown,
        Class::EccOff,
        Class::PersistenceOff,
        Class::NvmlHang,
    ];

    /// Whether only a reboot (or a hardware swap) clears it: such a drain is
    /// resumed only after the node rebooted. A link that comes back up, a
    /// fabric that registers, persistence mode turned on clear without one;
    /// a PCIe link, error rates and slowdowns can look clean on an idle
    /// drained node, so they wait for a reboot.
    pub fn needs_reboot(&self) -> bool {
        !matches!(self, Class::RemapPending | Class::NvLinkDown | Class::Fabric | Class::PersistenceOff)
    }
}

/// A drain reason in the agent's grammar, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentReason<'a> {
    /// Its class.
    pub class: Class,
    /// The GPU it names, when it names one.
    pub gpu: Option<u32>,
    /// The details after the class and GPU.
    pub detail: &'a str,
}

/// `reason` read in the agent's exact grammar: the prefix, a class name, an
/// optional `gpuN`, and non-empty details; `None` for anything else.
pub fn parse(reason: &str) -> Option<AgentReason<'_>> {
    let rest = reason.strip_prefix(PREFIX)?;
    let mut words = rest.splitn(2, ' ');
    let class = Class::parse(words.next()?)?;
    let after = words.next().filter(|d| !d.is_empty())?;
    let (first, more) = after.split_once(' ').unwrap_or((after, ""));
    let gpu = first.strip_prefix("gpu").filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match gpu {
        Some(_) if more.is_empty() => None,
        Some(n) => Some(AgentReason { class, gpu: n.parse().ok(), detail: more }),
        None => Some(AgentReason { class, gpu: None, detail: after }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_name_reads_back() {
        let mut all: Vec<Class> = Class::NAMED.to_vec();
        all.extend([Class::Xid(79), Class::RecoveryAction(2)]);
        for c in all {
            assert_eq!(Class::parse(&c.name()), Some(c.clone()), "{}", c.name());
            let written = format!("{PREFIX}{} gpu3 some detail", c.name());
            let r = parse(&written).unwrap_or_else(|| panic!("{written}"));
            assert_eq!((r.class, r.gpu, r.detail), (c, Some(3), "some detail"));
        }
    }

    #[test]
    fn only_the_exact_grammar_is_the_agents() {
        assert_eq!(parse("gpu: missing 7/8 GPUs visible").map(|r| r.detail), Some("7/8 GPUs visible"));
        for other in [
            "gpu: RMA ticket 42",
            "gpu:xid79 gpu3 x",
            "gpu: xid79",
            "gpu: xid79 gpu3",
            "gpu: xid gpu3 x",
            "maintenance",
            "",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
