//! What NVML said about one GPU in one poll: the readings the agent's
//! checks ([`crate::policy::health`], [`crate::policy::checks`]) judge, as plain data.

use slurm_formats::pci::PciAddr;

/// What NVML said about one GPU in one poll.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// NVML index.
    pub index: u32,
    /// `GPU-...`, when readable.
    pub uuid: Option<String>,
    /// The bus id (NVML writes `00000000:1B:00.0`), when readable.
    pub bus_id: Option<PciAddr>,
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
    /// NVML says the GPU needs a reset (`RESET_REQUIRED`).
    pub reset_required: bool,
    /// NVML cannot open the GPU: the error, in words.
    pub open_error: Option<String>,
    /// PCIe link, NVLinks, fabric, clocks, ECC and persistence modes.
    pub hw: HwSample,
    /// NVML calls on this GPU have not returned within `nvml_timeout`: the
    /// rest of the sample is empty (not known), and the hang is judged by
    /// `nvml_hang` once it has lasted `nvml_hang_polls` polls.
    pub hang: Option<Hang>,
}

/// A GPU whose NVML calls hang.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hang {
    /// How long it has hung, in seconds.
    pub secs: u64,
    /// Polls in a row it has hung (this one included).
    pub polls: u32,
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

/// What NVML said about a GPU's links and modes; `None`: not supported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HwSample {
    /// The PCIe link.
    pub pcie: Option<Pcie>,
    /// The performance state (0 = P0, busy).
    pub pstate: Option<u32>,
    /// The NVLinks NVML reports (never empty: no NVLink is `None`).
    pub nvlinks: Option<Vec<NvLink>>,
    /// The NVSwitch fabric registration; `None`: the driver does not support the call.
    pub fabric: Option<Fabric>,
    /// The clock event (throttle) reasons bitmask.
    pub clock_events: Option<u64>,
    /// ECC mode currently enabled.
    pub ecc_mode: Option<bool>,
    /// Persistence mode enabled.
    pub persistence: Option<bool>,
}

/// A PCIe link: as trained, and the most it can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pcie {
    /// Current generation.
    pub r#gen: u32,
    /// Current width (lanes).
    pub width: u32,
    /// The GPU's maximum generation.
    pub max_gen: u32,
    /// The maximum width.
    pub max_width: u32,
}

/// One NVLink.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvLink {
    /// Link number.
    pub link: u32,
    /// Active.
    pub up: bool,
    /// CRC (flit and data) errors.
    pub crc: u64,
    /// Replay errors.
    pub replay: u64,
    /// Recovery errors.
    pub recovery: u64,
}

impl NvLink {
    /// Its errors of every kind, added up.
    pub(crate) fn errors(&self) -> u64 {
        self.crc.saturating_add(self.replay).saturating_add(self.recovery)
    }
}

/// NVML's fabric registration states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricState {
    /// Not an NVSwitch system.
    NotSupported,
    /// Registration not started (fabric manager not running yet).
    NotStarted,
    /// Registration under way.
    InProgress,
    /// Registration done; see the status.
    Completed,
}

impl FabricState {
    /// The state as NVML's documentation names it.
    pub fn name(self) -> &'static str {
        match self {
            FabricState::NotSupported => "not_supported",
            FabricState::NotStarted => "not_started",
            FabricState::InProgress => "in_progress",
            FabricState::Completed => "completed",
        }
    }
}

/// A GPU's fabric registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fabric {
    /// The state.
    pub state: FabricState,
    /// Completed with an error status.
    pub failed: bool,
}
