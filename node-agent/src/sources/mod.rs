//! What the agent reads of the node: NVML ([`nvml`], every GPU under a
//! deadline, and the Xid event thread), the kernel log ([`kmsg`]), the
//! machine's topology through hwloc ([`machine`]) and its network interfaces
//! ([`network`], diagnostics only); and here, which of the sources work right
//! now, for the metrics (`gpu_node_agent_source_up`) and for the one warning
//! an admin gets when a source stops.
//!
//! Each source's thread records its own state here; the metrics read it.
//! Process-wide on purpose: one agent per process, and no source has to be
//! threaded through the daemon loop to be seen.

pub mod kmsg;
pub mod machine;
pub mod network;
pub mod nvml;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// A source of what the agent knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// NVML's Xid event set (the daemon's event thread).
    NvmlEvents,
    /// The kernel log follower (`kmsg_path`).
    Kmsg,
    /// NVML's GPU counters, sampled every pass.
    Nvml,
    /// NVML's utilization, memory and processes, sampled every `usage_interval`.
    NvmlUsage,
}

impl Source {
    /// Every source, in the metrics' order.
    pub const ALL: [Source; 4] = [Source::NvmlEvents, Source::Kmsg, Source::Nvml, Source::NvmlUsage];

    /// The `source` label.
    pub fn name(self) -> &'static str {
        match self {
            Source::NvmlEvents => "nvml_events",
            Source::Kmsg => "kmsg",
            Source::Nvml => "nvml",
            Source::NvmlUsage => "nvml_usage",
        }
    }

    fn slot(self) -> &'static AtomicU8 {
        static SLOTS: [AtomicU8; 4] =
            [AtomicU8::new(UNKNOWN), AtomicU8::new(UNKNOWN), AtomicU8::new(UNKNOWN), AtomicU8::new(UNKNOWN)];
        match self {
            Source::NvmlEvents => &SLOTS[0],
            Source::Kmsg => &SLOTS[1],
            Source::Nvml => &SLOTS[2],
            Source::NvmlUsage => &SLOTS[3],
        }
    }
}

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// Records whether `source` works. Returns its previous state (`None`: not
/// known before), so the caller can log transitions only.
pub fn set(source: Source, up: bool) -> Option<bool> {
    match source.slot().swap(if up { UP } else { DOWN }, Ordering::SeqCst) {
        UP => Some(true),
        DOWN => Some(false),
        _ => None,
    }
}

/// Whether `source` works; `None` when it is not running in this process
/// (one-pass commands, a kernel log turned off).
pub fn get(source: Source) -> Option<bool> {
    match source.slot().load(Ordering::SeqCst) {
        UP => Some(true),
        DOWN => Some(false),
        _ => None,
    }
}

static DRIVER: OnceLock<String> = OnceLock::new();

/// Records the NVIDIA driver version NVML reported (the first one sticks).
pub fn set_driver_version(version: &str) {
    let _ = DRIVER.set(version.to_owned());
}

/// The NVIDIA driver version, once NVML was loaded.
pub fn driver_version() -> Option<&'static str> {
    DRIVER.get().map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_are_reported() {
        // Kmsg only: other tests may touch the other slots.
        let _ = set(Source::Kmsg, true);
        assert_eq!(get(Source::Kmsg), Some(true));
        assert_eq!(set(Source::Kmsg, false), Some(true));
        assert_eq!(set(Source::Kmsg, false), Some(false));
        assert_eq!(get(Source::Kmsg), Some(false));
        assert_eq!(Source::ALL.map(Source::name), ["nvml_events", "kmsg", "nvml", "nvml_usage"]);
    }
}
