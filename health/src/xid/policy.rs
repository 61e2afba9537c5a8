//! What the node agent does about each Xid by default, the Xids' meanings, and
//! NVML's recovery actions by name (the tables and their reasons are in the
//! [module docs](super)).

use std::fmt;

/// The catalog the default policy and the meanings follow: NVIDIA's Xid
/// catalog, "Catalog" sheet, as published on this date.
pub const CATALOG: &str =
    "NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), 2025-10-29";

/// The number the agent gives a GPU the driver reports fallen off the bus
/// without an Xid number ([`Event::Lost`](super::Event::Lost)). NVIDIA numbers Xids from 1.
pub const LOST_WITHOUT_XID: u32 = 0;

/// What NVML's recovery action `code` asks for, in words (see the module
/// docs); `None` for a code this table does not know.
pub fn recovery_action_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "none",
        1 => "GPU reset",
        2 => "node reboot",
        3 => "drain peer-to-peer traffic",
        4 => "drain and reset",
        5 => "recover the IMEX domain",
        6 => "bus reset",
        7 => "system reboot",
        _ => return None,
    })
}

/// What the node agent does about an Xid. Ordered by severity, so the most
/// severe of several is their `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Not a node problem (an application error): no node action, at most
    /// counted and logged at info level.
    Ignore,
    /// Logged as a warning and reported, but the node stays in service.
    Warn,
    /// Drain the node so no new jobs land on it; an admin (or a GPU reset)
    /// brings it back.
    Drain,
    /// Drain the node and ask Slurm to reboot it once it is idle
    /// (`scontrol reboot ASAP nextstate=RESUME`): for faults a reboot clears,
    /// such as pending row remaps. No Xid has it by default (a node whose GPU
    /// is still bad after the reboot would be resumed and drained again);
    /// drained hardware faults wait for a reboot before the agent resumes them.
    Reboot,
}

impl Action {
    /// Every action, least severe first.
    pub const ALL: [Action; 4] = [Action::Ignore, Action::Warn, Action::Drain, Action::Reboot];

    /// The action's name in configuration and logs: `ignore`, `warn`,
    /// `drain` or `reboot`.
    pub const fn name(self) -> &'static str {
        match self {
            Action::Ignore => "ignore",
            Action::Warn => "warn",
            Action::Drain => "drain",
            Action::Reboot => "reboot",
        }
    }

    /// The action with this [`name`](Action::name), exactly as written
    /// (lowercase, no spaces); `None` for anything else.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The default action for every Xid the policy names, in Xid order (the table
/// in the module docs gives the reasons). Xids not listed get
/// [`Action::Warn`].
pub const DEFAULT_POLICY: &[(u32, Action)] = &[
    (13, Action::Ignore),
    (31, Action::Ignore),
    (43, Action::Ignore),
    (45, Action::Ignore),
    (46, Action::Drain),
    (48, Action::Drain),
    (62, Action::Drain),
    (63, Action::Warn),
    (64, Action::Drain),
    (68, Action::Warn),
    (74, Action::Drain),
    (79, Action::Drain),
    (92, Action::Warn),
    (94, Action::Warn),
    (95, Action::Drain),
    (109, Action::Drain),
    (119, Action::Drain),
    (120, Action::Drain),
    (136, Action::Drain),
    (140, Action::Drain),
    (143, Action::Drain),
    (144, Action::Warn),
    (145, Action::Warn),
    (146, Action::Warn),
    (147, Action::Warn),
    (148, Action::Warn),
    (149, Action::Warn),
    (150, Action::Warn),
    (154, Action::Warn),
    (155, Action::Drain),
    (156, Action::Drain),
    (158, Action::Drain),
    (167, Action::Warn),
    (169, Action::Warn),
];

/// The default action for `xid`: its entry in [`DEFAULT_POLICY`], or
/// [`Action::Warn`] for an Xid the policy does not name.
pub fn default_action(xid: u32) -> Action {
    DEFAULT_POLICY.iter().find(|(x, _)| *x == xid).map_or(Action::Warn, |&(_, action)| action)
}

const MEANINGS: &[(u32, &str)] = &[
    (13, "graphics engine exception"),
    (31, "GPU memory page fault"),
    (32, "invalid or corrupted push buffer stream"),
    (43, "GPU stopped processing (channel reset)"),
    (45, "preemptive cleanup, due to previous errors"),
    (46, "GPU stopped processing"),
    (48, "double-bit ECC error"),
    (61, "internal micro-controller breakpoint/warning"),
    (62, "internal micro-controller halt"),
    (63, "ECC page retirement or row remap recorded"),
    (64, "ECC page retirement or row remap failure"),
    (68, "video decoder (NVDEC) exception"),
    (69, "graphics engine class error"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (109, "context switch timeout"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (136, "NVLink link training failed"),
    (140, "unrecovered ECC error"),
    (143, "GPU initialization error"),
    (144, "NVLink SAW error"),
    (145, "NVLink RLW error"),
    (146, "NVLink TLW error"),
    (147, "NVLink TREX error"),
    (148, "NVLink NVLPW error"),
    (149, "NVLink NETIR error"),
    (150, "NVLink MSE error"),
    (154, "GPU recovery action changed"),
    (155, "NVLink software-defined error"),
    (156, "resource retirement event"),
    (158, "GPU fatal timeout"),
    (167, "PCIe fatal timeout"),
    (169, "internal micro-controller halt (SEC2)"),
];

/// A short meaning of `xid` for logs and drain reasons, such as
/// `"GPU has fallen off the bus"` for 79; `"unknown Xid"` when not known.
pub fn describe(xid: u32) -> &'static str {
    if xid == LOST_WITHOUT_XID {
        return "GPU has fallen off the bus (no Xid number)";
    }
    MEANINGS.iter().find(|(x, _)| *x == xid).map_or("unknown Xid", |&(_, meaning)| meaning)
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- policy ----------------------------------------------------------

    #[test]
    fn application_errors_are_ignored() {
        for xid in [13, 31, 43, 45] {
            assert_eq!(default_action(xid), Action::Ignore, "Xid {xid}");
        }
    }

    #[test]
    fn hardware_errors_drain() {
        for xid in [46, 62, 64, 74, 95, 140] {
            assert_eq!(default_action(xid), Action::Drain, "Xid {xid}");
        }
    }

    #[test]
    fn errors_that_need_a_reboot_drain_and_wait_for_it() {
        for xid in [48, 79, 119, 120] {
            assert_eq!(default_action(xid), Action::Drain, "Xid {xid}");
        }
    }

    #[test]
    fn memory_xids_warn() {
        for xid in [63, 92, 94] {
            assert_eq!(default_action(xid), Action::Warn, "Xid {xid}");
        }
    }

    #[test]
    fn unknown_xid_warns() {
        assert_eq!(default_action(4242), Action::Warn);
        assert_eq!(describe(4242), "unknown Xid");
    }

    #[test]
    fn descriptions() {
        assert_eq!(describe(79), "GPU has fallen off the bus");
        for &(xid, _) in DEFAULT_POLICY {
            assert_ne!(describe(xid), "unknown Xid", "Xid {xid} has an action but no meaning");
        }
    }

    #[test]
    fn action_names_round_trip() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.name()), Some(a));
            assert_eq!(a.to_string(), a.name());
        }
        assert_eq!(Action::parse("Drain"), None);
        assert_eq!(Action::parse(""), None);
        assert!(
            Action::Ignore < Action::Warn && Action::Warn < Action::Drain && Action::Drain < Action::Reboot
        );
    }

    #[test]
    fn reset_class_xids_of_the_catalog_drain_and_new_ones_are_named() {
        // NVIDIA's immediate resolution RESET_GPU (catalog of 2025-10-29).
        for xid in [109, 136, 143, 155, 156, 158] {
            assert_eq!(default_action(xid), Action::Drain, "Xid {xid}");
        }
        assert_eq!(describe(167), "PCIe fatal timeout");
        assert_eq!(describe(169), "internal micro-controller halt (SEC2)");
        assert!(CATALOG.contains("2025-10-29"));
    }

    #[test]
    fn recovery_actions_are_named_as_nvml_names_them() {
        assert_eq!(recovery_action_name(1), Some("GPU reset"));
        assert_eq!(recovery_action_name(2), Some("node reboot"));
        for code in 0..=7 {
            assert!(recovery_action_name(code).is_some(), "{code}");
        }
        assert_eq!(recovery_action_name(8), None);
    }

    #[test]
    fn policy_table_is_sorted_and_unique() {
        assert!(DEFAULT_POLICY.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(MEANINGS.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn module_doc_table_matches_the_policy() {
        let mut rows = 0;
        for line in include_str!("mod.rs").lines() {
            let Some(row) = line.strip_prefix("//! | ") else { continue };
            let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
            let Ok(xid) = cells[0].parse::<u32>() else { continue };
            if cells.len() < 4 {
                continue;
            }
            assert_eq!(cells[1], describe(xid), "doc meaning of Xid {xid}");
            assert_eq!(Action::parse(cells[2]), Some(default_action(xid)), "doc action of Xid {xid}");
            rows += 1;
        }
        assert_eq!(rows, DEFAULT_POLICY.len());
    }
}
