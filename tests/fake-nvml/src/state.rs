//! The state file that drives the fake NVML, and its reloading.
//!
//! The format is fixed (tests, the demo and outside checks write it); see
//! `tests/fake-nvml/README.md`. Unknown keys are ignored and every key has a
//! default, so a state file names only what a test cares about.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use slurm_formats::cpuset::CpuSet;
use slurm_formats::pci::PciAddr;

/// The whole state file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct State {
    /// What `nvmlSystemGetDriverVersion` returns.
    pub driver_version: String,
    /// `null`, or an NVML error name (`"DRIVER_NOT_LOADED"`) for `nvmlInit` to return.
    pub init_error: Option<String>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<Gpu>,
    /// Xid critical-error events, delivered in order to every event set
    /// registered for the event's GPU.
    pub events: Vec<Event>,
    /// `false`: the system has no NVML events, as on some VMs and old
    /// drivers: registering for them fails with `NOT_SUPPORTED`.
    pub events_supported: bool,
    /// The newest fabric-info struct `nvmlDeviceGetGpuFabricInfoV` accepts, as
    /// drivers differ: 3 (the newest), 2 (NVML 12.4, R550), or 1 (older: the
    /// versioned call answers `FUNCTION_NOT_FOUND`, only the unversioned one works).
    pub fabric_info_version: u32,
}

impl Default for State {
    fn default() -> Self {
        State {
            driver_version: String::new(),
            init_error: None,
            gpus: Vec::new(),
            events: Vec::new(),
            events_supported: true,
            fabric_info_version: 3,
        }
    }
}

/// One GPU.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct Gpu {
    /// `GPU-xxxxxxxx-...`.
    pub uuid: String,
    /// `00000000:1B:00.0` (domain:bus:device.function).
    pub pci_bus_id: String,
    /// The `/dev/nvidiaN` minor number.
    pub minor: u32,
    /// Product name.
    pub name: String,
    /// ECC error counters.
    pub ecc: Ecc,
    /// Row-remapping state.
    pub remapped_rows: RemappedRows,
    /// Fallen off the bus: every call on this GPU returns `GPU_IS_LOST`.
    pub lost: bool,
    /// An NVML error name (`RESET_REQUIRED`, `UNKNOWN`, ...) that every call
    /// on this GPU returns, opening it included; `None`: none.
    pub error: Option<String>,
    /// CPUs local to the GPU, as a list (`0-55`).
    pub cpu_affinity: String,
    /// The GPU's NUMA node, `null` when it has none.
    pub numa_node: Option<u32>,
    /// Every call on this GPU first sleeps this long.
    pub hang_ms: u64,
    /// The driver's recovery-action field (`none`, `gpu_reset`, `node_reboot`,
    /// `drain_p2p`, `drain_and_reset`); absent: the field is not supported.
    pub recovery_action: Option<String>,
    /// PCIe link, NVLinks, fabric, clock events, ECC and persistence modes
    /// (issue 15); each absent key is "not supported".
    #[serde(flatten)]
    pub links: LinkKeys,
    /// MIG mode and MIG devices; absent: the GPU does not support MIG.
    pub mig: Option<Mig>,
    /// What the per-job usage sampler reads: utilization, memory, power, SM
    /// clock and compute processes.
    #[serde(flatten)]
    pub usage: Usage,
    /// Per-call failures and hangs of the usage calls.
    #[serde(flatten)]
    pub faults: Faults,
}

impl Default for Gpu {
    fn default() -> Self {
        Gpu {
            uuid: String::new(),
            pci_bus_id: String::new(),
            minor: 0,
            name: "NVIDIA H100 80GB HBM3".to_owned(),
            ecc: Ecc::default(),
            remapped_rows: RemappedRows::default(),
            lost: false,
            error: None,
            cpu_affinity: String::new(),
            numa_node: None,
            hang_ms: 0,
            recovery_action: None,
            links: LinkKeys::default(),
            mig: None,
            usage: Usage::default(),
            faults: Faults::default(),
        }
    }
}

/// The default `memory_total` of a GPU: 80 GiB, an H100's.
pub const GPU_MEMORY_DEFAULT: u64 = 80 << 30;

/// The default `memory_total` of a MIG device: 10 GiB, about a 1g.10gb's.
pub const MIG_MEMORY_DEFAULT: u64 = 10 << 30;

/// A GPU's usage: what `nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetMemoryInfo[_v2]`,
/// `nvmlDeviceGetPowerUsage`, `nvmlDeviceGetTotalEnergyConsumption`, `nvmlDeviceGetClockInfo` and
/// `nvmlDeviceGetComputeRunningProcesses_v2/_v3` answer.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Usage {
    /// Utilization over the last sample period, percent.
    pub utilization: Utilization,
    /// Framebuffer memory, bytes.
    pub memory_total: u64,
    /// Allocated framebuffer memory, bytes (at most `memory_total`).
    pub memory_used: u64,
    /// Power draw, milliwatts.
    pub power_usage_mw: u32,
    /// SM (and graphics) clock, MHz.
    pub sm_clock_mhz: u32,
    /// Energy used since the driver was loaded, millijoules
    /// (`nvmlDeviceGetTotalEnergyConsumption`); `None` (absent): not
    /// supported, as on GPUs older than Volta.
    pub total_energy_mj: Option<u64>,
    /// Processes with a compute context on the GPU.
    pub processes: Vec<Process>,
}

impl Default for Usage {
    fn default() -> Self {
        Usage {
            utilization: Utilization::default(),
            memory_total: GPU_MEMORY_DEFAULT,
            memory_used: 0,
            power_usage_mw: 0,
            sm_clock_mhz: 0,
            total_energy_mj: None,
            processes: Vec::new(),
        }
    }
}

/// `nvmlUtilization_t`, percent.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Utilization {
    /// Time a kernel ran.
    pub gpu: u32,
    /// Time device memory was read or written.
    pub memory: u32,
}

/// One compute process (`nvmlProcessInfo_t`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Process {
    /// Its process id.
    pub pid: u32,
    /// The GPU memory it holds, bytes; `None` (`null` or absent): NVML
    /// cannot tell (`NVML_VALUE_NOT_AVAILABLE`).
    pub used_memory: Option<u64>,
    /// Its GPU instance; `None`: the default of the handle asked (none on a
    /// GPU, the MIG device index on a MIG device).
    pub gpu_instance_id: Option<u32>,
    /// Its compute instance; `None`: none on a GPU, 0 on a MIG device.
    pub compute_instance_id: Option<u32>,
}

/// The usage calls a test can fail or hang one by one (`fail` and
/// `hang_calls_ms` keys).
pub const USAGE_CALLS: &[&str] = &["utilization", "memory", "processes", "power", "clock", "energy"];

/// Per-call faults of the usage calls, by [`USAGE_CALLS`] name.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Faults {
    /// Call name → the NVML error name (from [`NVML_ERRORS`]) it returns.
    pub fail: BTreeMap<String, String>,
    /// Call name → how long it sleeps first, milliseconds (on top of `hang_ms`).
    pub hang_calls_ms: BTreeMap<String, u64>,
}

impl Faults {
    /// The error `call` is set to fail with: `Some(0)` for `SUCCESS` (which
    /// overrides a parent's failure), `None` when not set.
    pub fn fail_code(&self, call: &str) -> Option<u32> {
        let name = self.fail.get(call)?;
        Some(NVML_ERRORS.iter().find(|(n, _)| n == name).map_or(999, |(_, c)| *c))
    }

    /// How long `call` hangs, when set.
    pub fn hang(&self, call: &str) -> Option<u64> {
        self.hang_calls_ms.get(call).copied()
    }

    fn check(&self) -> Result<(), String> {
        let known = || USAGE_CALLS.join(", ");
        for (call, name) in &self.fail {
            if !USAGE_CALLS.contains(&call.as_str()) {
                return Err(format!("fail: unknown call '{call}' (known: {})", known()));
            }
            if !NVML_ERRORS.iter().any(|(n, _)| n == name) {
                return Err(format!("fail: {call}: unknown NVML error '{name}'"));
            }
        }
        for call in self.hang_calls_ms.keys() {
            if !USAGE_CALLS.contains(&call.as_str()) {
                return Err(format!("hang_calls_ms: unknown call '{call}' (known: {})", known()));
            }
        }
        Ok(())
    }
}

/// NVML return codes (`nvmlReturn_t`) by the names the state file uses (without
/// the `NVML_ERROR_` prefix).
pub const NVML_ERRORS: &[(&str, u32)] = &[
    ("SUCCESS", 0),
    ("UNINITIALIZED", 1),
    ("INVALID_ARGUMENT", 2),
    ("NOT_SUPPORTED", 3),
    ("NO_PERMISSION", 4),
    ("ALREADY_INITIALIZED", 5),
    ("NOT_FOUND", 6),
    ("INSUFFICIENT_SIZE", 7),
    ("INSUFFICIENT_POWER", 8),
    ("DRIVER_NOT_LOADED", 9),
    ("TIMEOUT", 10),
    ("IRQ_ISSUE", 11),
    ("LIBRARY_NOT_FOUND", 12),
    ("FUNCTION_NOT_FOUND", 13),
    ("CORRUPTED_INFOROM", 14),
    ("GPU_IS_LOST", 15),
    ("RESET_REQUIRED", 16),
    ("OPERATING_SYSTEM", 17),
    ("LIB_RM_VERSION_MISMATCH", 18),
    ("IN_USE", 19),
    ("MEMORY", 20),
    ("NO_DATA", 21),
    ("INSUFFICIENT_RESOURCES", 23),
    ("ARGUMENT_VERSION_MISMATCH", 25),
    ("DEPRECATED", 26),
    ("NOT_READY", 27),
    ("GPU_NOT_FOUND", 28),
    ("INVALID_STATE", 29),
    ("UNKNOWN", 999),
];

impl Usage {
    fn check(&self) -> Result<(), String> {
        let u = self.utilization;
        if u.gpu > 100 || u.memory > 100 {
            return Err(format!("utilization: gpu {} / memory {} is over 100", u.gpu, u.memory));
        }
        check_memory(self.memory_used, self.memory_total)
    }
}

fn check_memory(used: u64, total: u64) -> Result<(), String> {
    if used > total {
        return Err(format!("memory_used {used} is over memory_total {total}"));
    }
    Ok(())
}

/// Most MIG device slots a fake GPU may have (`max_devices`); MIG handles
/// are numbered within this many per GPU.
pub const MIG_SLOTS: u32 = 256;

/// A GPU's MIG state (`nvmlDeviceGetMigMode` and the MIG device handles).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct Mig {
    /// MIG mode now. MIG devices exist only while it is on.
    pub enabled: bool,
    /// MIG mode after the next GPU reset; `None`: the same as `enabled`.
    pub pending: Option<bool>,
    /// `nvmlDeviceGetMaxMigDeviceCount` while MIG is on (7 on A100 and H100).
    pub max_devices: u32,
    /// The MIG devices.
    pub instances: Vec<MigInstance>,
}

impl Default for Mig {
    fn default() -> Self {
        Mig { enabled: false, pending: None, max_devices: 7, instances: Vec::new() }
    }
}

/// One MIG device (a compute instance).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct MigInstance {
    /// `MIG-<uuid>`, what `nvmlDeviceGetUUID` returns for its handle.
    pub uuid: String,
    /// Its MIG device index (`nvmlDeviceGetMigDeviceHandleByIndex`); by
    /// default its place in `instances`. Indices may have gaps, as on a GPU
    /// whose instances were made and destroyed in another order.
    pub index: Option<u32>,
    /// Its memory, bytes (`nvmlDeviceGetMemoryInfo[_v2]` on its handle).
    pub memory_total: u64,
    /// Its allocated memory, bytes.
    pub memory_used: u64,
    /// Its compute processes.
    pub processes: Vec<Process>,
    /// Per-call failures and hangs on its handle; a call it does not name
    /// takes its GPU's.
    #[serde(flatten)]
    pub faults: Faults,
}

impl Default for MigInstance {
    fn default() -> Self {
        MigInstance {
            uuid: String::new(),
            index: None,
            memory_total: MIG_MEMORY_DEFAULT,
            memory_used: 0,
            processes: Vec::new(),
            faults: Faults::default(),
        }
    }
}

impl Mig {
    /// The MIG device at MIG device index `index`, while MIG is on.
    pub fn instance(&self, index: u32) -> Option<&MigInstance> {
        if !self.enabled {
            return None;
        }
        self.instances.iter().zip(0u32..).find(|(m, i)| m.index.unwrap_or(*i) == index).map(|(m, _)| m)
    }

    fn check(&self) -> Result<(), String> {
        if self.max_devices > MIG_SLOTS {
            return Err(format!("max_devices {} is over {MIG_SLOTS}", self.max_devices));
        }
        let mut seen: Vec<u32> = Vec::new();
        for (m, i) in self.instances.iter().zip(0u32..) {
            let index = m.index.unwrap_or(i);
            if !m.uuid.starts_with("MIG-") || m.uuid.starts_with("MIG-GPU-") {
                return Err(format!("MIG device {index}: uuid '{}' is not MIG-<uuid>", m.uuid));
            }
            if index >= self.max_devices {
                return Err(format!(
                    "MIG device index {index} is not below max_devices {}",
                    self.max_devices
                ));
            }
            if seen.contains(&index) {
                return Err(format!("MIG device index {index} appears twice"));
            }
            seen.push(index);
            check_memory(m.memory_used, m.memory_total)
                .and_then(|()| m.faults.check())
                .map_err(|e| format!("MIG device {index}: {e}"))?;
        }
        Ok(())
    }
}

/// Volatile (since driver load) and aggregate (lifetime) ECC counters.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Ecc {
    /// Since the driver was loaded.
    pub volatile: EccCounts,
    /// Over the GPU's lifetime.
    pub aggregate: EccCounts,
}

/// One pair of ECC counters.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct EccCounts {
    /// Corrected (single-bit) errors.
    pub corrected: u64,
    /// Uncorrected (double-bit) errors.
    pub uncorrected: u64,
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remap waits for the next GPU reset.
    pub pending: bool,
    /// A remap failed: the GPU needs replacing.
    pub failure: bool,
}

/// One Xid event.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct Event {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// The Xid code.
    pub xid: u64,
}

/// The keys of issue 15's checks. Absent means "not supported", as on a
/// real GPU that lacks the feature.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct LinkKeys {
    /// The PCIe link.
    pub pcie: Option<Pcie>,
    /// The NVLinks, by link number; an empty list means no NVLink.
    pub nvlinks: Option<Vec<NvLink>>,
    /// The NVSwitch fabric registration (`nvmlDeviceGetGpuFabricInfo`).
    pub fabric: Option<Fabric>,
    /// Active clock event (throttle) reasons: `gpu_idle`, `applications_clocks_setting`,
    /// `sw_power_cap`, `hw_slowdown`, `sync_boost`, `sw_thermal_slowdown`,
    /// `hw_thermal_slowdown`, `hw_power_brake`, `display_clock_setting`.
    pub clock_events: Option<Vec<String>>,
    /// `enabled` or `disabled` (`nvmlDeviceGetEccMode`, current and pending).
    pub ecc_mode: Option<String>,
    /// Persistence mode.
    pub persistence: Option<bool>,
    /// The performance state (0 = P0, busy; 8 = P8, idle).
    pub pstate: Option<u32>,
}

/// A PCIe link: what the GPU can do and what it trained at.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Pcie {
    /// The GPU's maximum generation (`nvmlDeviceGetGpuMaxPcieLinkGeneration`,
    /// `nvmlDeviceGetPcieLinkMaxSpeed`).
    pub max_gen: u32,
    /// The maximum width.
    pub max_width: u32,
    /// The current generation.
    pub r#gen: u32,
    /// The current width.
    pub width: u32,
    /// The slot's limit where it is below the GPU's (`nvmlDeviceGetMaxPcieLinkGeneration`
    /// answers the lower of the two); absent: the GPU's.
    pub slot_max_gen: Option<u32>,
    /// The same for the width (`nvmlDeviceGetMaxPcieLinkWidth`).
    pub slot_max_width: Option<u32>,
}

/// One NVLink.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct NvLink {
    /// `up` or `down`.
    pub state: String,
    /// `NVML_NVLINK_ERROR_DL_CRC_FLIT` (the data CRC counter reads 0).
    pub crc_errors: u64,
    /// `NVML_NVLINK_ERROR_DL_REPLAY`.
    pub replay_errors: u64,
    /// `NVML_NVLINK_ERROR_DL_RECOVERY`.
    pub recovery_errors: u64,
}

impl Default for NvLink {
    fn default() -> Self {
        NvLink { state: "up".to_owned(), crc_errors: 0, replay_errors: 0, recovery_errors: 0 }
    }
}

/// The GPU's fabric registration.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Fabric {
    /// `not_supported`, `not_started`, `in_progress`, `completed`.
    pub state: String,
    /// `success` or `failure` (meaningful once `completed`).
    pub status: String,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric { state: "completed".to_owned(), status: "success".to_owned() }
    }
}

/// Clock event reason names and their NVML bits.
pub const CLOCK_EVENTS: &[(&str, u64)] = &[
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clock_setting", 0x100),
];

/// NVML's fabric states, by the names the state file uses.
pub const FABRIC_STATES: &[(&str, u8)] =
    &[("not_supported", 0), ("not_started", 1), ("in_progress", 2), ("completed", 3)];

impl LinkKeys {
    /// The clock events as NVML's bitmask, `None` when not supported.
    pub fn clock_mask(&self) -> Option<u64> {
        let names = self.clock_events.as_ref()?;
        Some(
            names.iter().filter_map(|n| CLOCK_EVENTS.iter().find(|(k, _)| k == n)).fold(0, |m, (_, b)| m | b),
        )
    }

    /// Checks the words of the keys.
    ///
    /// # Errors
    /// A word that is not one of the documented ones, named.
    pub fn check(&self) -> Result<(), String> {
        for n in self.clock_events.iter().flatten() {
            if !CLOCK_EVENTS.iter().any(|(k, _)| k == n) {
                let known: Vec<&str> = CLOCK_EVENTS.iter().map(|(k, _)| *k).collect();
                return Err(format!("clock_events: unknown '{n}' (known: {})", known.join(", ")));
            }
        }
        for l in self.nvlinks.iter().flatten() {
            if l.state != "up" && l.state != "down" {
                return Err(format!("nvlinks: state '{}' is not up or down", l.state));
            }
        }
        if let Some(f) = &self.fabric {
            if !FABRIC_STATES.iter().any(|(k, _)| *k == f.state) {
                return Err(format!("fabric: unknown state '{}'", f.state));
            }
            if f.status != "success" && f.status != "failure" {
                return Err(format!("fabric: status '{}' is not success or failure", f.status));
            }
        }
        if let Some(m) = &self.ecc_mode {
            if m != "enabled" && m != "disabled" {
                return Err(format!("ecc_mode: '{m}' is not enabled or disabled"));
            }
        }
        Ok(())
    }
}

impl Gpu {
    /// The CPUs local to this GPU.
    ///
    /// # Errors
    /// `cpu_affinity` is not a CPU list.
    pub fn cpus(&self) -> Result<CpuSet, String> {
        CpuSet::parse(&self.cpu_affinity).map_err(|e| format!("gpu {}: {e}", self.uuid))
    }
}

impl State {
    /// Parses and checks a state file's text.
    ///
    /// # Errors
    /// Malformed JSON, a wrong type, or a bad CPU list; the message names where.
    pub fn parse(text: &str) -> Result<State, String> {
        let mut state: State = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if state.driver_version.is_empty() {
            state.driver_version = "580.95.05".to_owned();
        }
        for gpu in &state.gpus {
            gpu.cpus()?;
            gpu.links.check().map_err(|e| format!("gpu {}: {e}", gpu.uuid))?;
            gpu.usage.check().map_err(|e| format!("gpu {}: {e}", gpu.uuid))?;
            gpu.faults.check().map_err(|e| format!("gpu {}: {e}", gpu.uuid))?;
            if let Some(mig) = &gpu.mig {
                mig.check().map_err(|e| format!("gpu {}: {e}", gpu.uuid))?;
            }
        }
        Ok(state)
    }

    /// The NVML index of the GPU with this UUID.
    pub fn index_by_uuid(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }

    /// The NVML index of the GPU with this PCI bus id. Accepts the short
    /// (`1B:00.0`), 4-digit-domain (`0000:1B:00.0`) and 8-digit-domain forms,
    /// any case, as NVML does.
    pub fn index_by_pci(&self, bus_id: &str) -> Option<usize> {
        let want = PciAddr::parse_with_function(bus_id).ok()?;
        self.gpus.iter().position(|g| g.pci_addr().is_some_and(|a| a.same_function(want)))
    }
}

impl Gpu {
    /// The GPU's `pci_bus_id` as an address, when it reads as one with a function.
    pub fn pci_addr(&self) -> Option<PciAddr> {
        PciAddr::parse_with_function(&self.pci_bus_id).ok()
    }
}

/// Reads the state file and reads it again whenever it changes.
#[derive(Debug)]
pub struct Loader {
    path: PathBuf,
    stamp: Option<(u64, u64, i64, i64, u64)>,
    state: State,
}

fn stamp(path: &Path) -> Option<(u64, u64, i64, i64, u64)> {
    let m = fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

impl Loader {
    /// Loads the file for the first time.
    ///
    /// # Errors
    /// The file cannot be read or parsed; the message names the file.
    pub fn open(path: &Path) -> Result<Loader, String> {
        let stamp = stamp(path);
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let state = State::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Loader { path: path.to_owned(), stamp, state })
    }

    /// The state as last read, without looking at the file.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The current state, re-read first if the file changed (new inode, size or
    /// modification time). A file that became unreadable or malformed keeps
    /// the last good state and returns the error once.
    pub fn current(&mut self) -> (&State, Option<String>) {
        let now = stamp(&self.path);
        let mut error = None;
        if now != self.stamp {
            self.stamp = now;
            match fs::read_to_string(&self.path).map_err(|e| e.to_string()).and_then(|t| State::parse(&t)) {
                Ok(state) => self.state = state,
                Err(e) => error = Some(format!("{}: {e}; keeping the previous state", self.path.display())),
            }
        }
        (&self.state, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
      "driver_version": "580.95.05",
      "init_error": null,
      "gpus": [
        { "uuid": "GPU-00000000-0000-0000-0000-000000000000",
          "pci_bus_id": "00000000:1B:00.0", "minor": 0, "name": "NVIDIA H100 80GB HBM3",
          "ecc": { "volatile":  { "corrected": 0, "uncorrected": 0 },
                   "aggregate": { "corrected": 0, "uncorrected": 0 } },
          "remapped_rows": { "correctable": 0, "uncorrectable": 0, "pending": false, "failure": false },
          "lost": false, "cpu_affinity": "0-55", "numa_node": 0, "hang_ms": 0 } ],
      "events": [ { "gpu": 3, "xid": 79 } ]
    }"#;

    #[test]
    fn parses_the_documented_example() {
        let s = State::parse(EXAMPLE).unwrap();
        assert_eq!(s.gpus.len(), 1);
        assert_eq!(s.gpus[0].cpus().unwrap().len(), 56);
        assert_eq!(s.gpus[0].numa_node, Some(0));
        assert_eq!(s.events, vec![Event { gpu: 3, xid: 79 }]);
    }

    #[test]
    fn unknown_keys_are_ignored_and_missing_ones_default() {
        let s = State::parse(r#"{"gpus": [{"uuid": "GPU-1", "future_key": 1}], "also": true}"#).unwrap();
        assert_eq!(s.driver_version, "580.95.05");
        assert_eq!(s.gpus[0].remapped_rows, RemappedRows::default());
        assert!(s.events.is_empty());
        assert!(s.events_supported, "events are supported unless the file says otherwise");
        assert!(!State::parse(r#"{"events_supported": false}"#).unwrap().events_supported);
    }

    #[test]
    fn mig_instances_are_found_by_index_while_mig_is_on() {
        let s = State::parse(
            r#"{"gpus": [
              {"uuid": "GPU-a"},
              {"uuid": "GPU-b", "mig": {"enabled": true, "instances": [
                  {"uuid": "MIG-1"}, {"uuid": "MIG-2", "index": 4}]}},
              {"uuid": "GPU-c", "mig": {"enabled": false, "instances": [{"uuid": "MIG-3"}]}}]}"#,
        )
        .unwrap();
        assert_eq!(s.gpus[0].mig, None, "absent: MIG not supported");
        let mig = s.gpus[1].mig.as_ref().unwrap();
        assert_eq!(mig.max_devices, 7);
        assert_eq!(mig.instance(0).map(|m| m.uuid.as_str()), Some("MIG-1"));
        assert_eq!(mig.instance(1), None, "a gap");
        assert_eq!(mig.instance(4).map(|m| m.uuid.as_str()), Some("MIG-2"));
        assert_eq!(s.gpus[2].mig.as_ref().unwrap().instance(0), None, "MIG off: no devices");
    }

    #[test]
    fn bad_mig_devices_are_refused() {
        for bad in [
            r#"{"instances": [{"uuid": "GPU-1"}]}"#,
            r#"{"instances": [{"uuid": "MIG-GPU-a/1/0"}]}"#,
            r#"{"instances": [{"uuid": "MIG-1"}, {"uuid": "MIG-2", "index": 0}]}"#,
            r#"{"instances": [{"uuid": "MIG-1", "index": 7}]}"#,
            r#"{"max_devices": 300}"#,
        ] {
            let e = State::parse(&format!(r#"{{"gpus": [{{"uuid": "GPU-x", "mig": {bad}}}]}}"#)).unwrap_err();
            assert!(e.starts_with("gpu GPU-x: "), "{bad}: {e}");
        }
    }

    #[test]
    fn usage_keys_parse_and_default() {
        let s = State::parse(
            r#"{"gpus": [
              {"uuid": "GPU-a"},
              {"uuid": "GPU-b", "utilization": {"gpu": 87, "memory": 40},
               "memory_total": 1000, "memory_used": 600, "power_usage_mw": 350000, "sm_clock_mhz": 1980,
               "total_energy_mj": 18446744073709551615,
               "processes": [{"pid": 41, "used_memory": 500}, {"pid": 42, "used_memory": null}],
               "fail": {"utilization": "UNKNOWN", "processes": "GPU_IS_LOST"},
               "hang_calls_ms": {"memory": 60000},
               "mig": {"enabled": true, "instances": [
                 {"uuid": "MIG-1", "memory_used": 7, "processes": [{"pid": 9, "used_memory": 7}],
                  "fail": {"memory": "SUCCESS"}}]}}]}"#,
        )
        .unwrap();
        let a = &s.gpus[0];
        assert_eq!(a.usage, Usage::default(), "absent: defaults");
        assert_eq!((a.usage.memory_total, a.usage.memory_used), (85_899_345_920, 0));
        assert_eq!(a.faults, Faults::default());
        let b = &s.gpus[1];
        assert_eq!(b.usage.utilization, Utilization { gpu: 87, memory: 40 });
        assert_eq!((b.usage.memory_total, b.usage.memory_used), (1000, 600));
        assert_eq!((b.usage.power_usage_mw, b.usage.sm_clock_mhz), (350_000, 1980));
        assert_eq!(a.usage.total_energy_mj, None, "absent: not supported");
        assert_eq!(b.usage.total_energy_mj, Some(u64::MAX), "the whole u64 range");
        assert_eq!(b.usage.processes[0], Process { pid: 41, used_memory: Some(500), ..Process::default() });
        assert_eq!(b.usage.processes[1].used_memory, None);
        assert_eq!(b.faults.fail_code("utilization"), Some(999));
        assert_eq!(b.faults.fail_code("processes"), Some(15));
        assert_eq!(b.faults.fail_code("memory"), None);
        assert_eq!(b.faults.hang("memory"), Some(60_000));
        assert_eq!(b.faults.hang("power"), None);
        let m = b.mig.as_ref().unwrap().instance(0).unwrap();
        assert_eq!((m.memory_total, m.memory_used), (10 << 30, 7));
        assert_eq!(m.processes.len(), 1);
        assert_eq!(m.faults.fail_code("memory"), Some(0), "SUCCESS overrides the GPU's");
    }

    #[test]
    fn bad_usage_keys_are_refused() {
        for (bad, says) in [
            (r#""utilization": {"gpu": 101}"#, "utilization"),
            (r#""utilization": {"memory": 150}"#, "utilization"),
            (r#""memory_total": 10, "memory_used": 11"#, "memory_used 11 is over memory_total 10"),
            (r#""memory_used": 85899345921"#, "memory_used"),
            (r#""fail": {"utilisation": "UNKNOWN"}"#, "fail: unknown call 'utilisation'"),
            (r#""fail": {"memory": "NVML_ERROR_UNKNOWN"}"#, "unknown NVML error 'NVML_ERROR_UNKNOWN'"),
            (r#""hang_calls_ms": {"health": 5}"#, "hang_calls_ms: unknown call 'health'"),
            (r#""fail": {"energy": "LOST"}"#, "fail: energy: unknown NVML error 'LOST'"),
            (
                r#""mig": {"instances": [{"uuid": "MIG-1", "memory_total": 1, "memory_used": 2}]}"#,
                "MIG device 0",
            ),
            (r#""mig": {"instances": [{"uuid": "MIG-1", "fail": {"power": "LOST"}}]}"#, "MIG device 0: fail"),
        ] {
            let e = State::parse(&format!(r#"{{"gpus": [{{"uuid": "GPU-x", {bad}}}]}}"#)).unwrap_err();
            assert!(e.starts_with("gpu GPU-x: ") && e.contains(says), "{bad}: {e}");
        }
        assert!(State::parse(r#"{"gpus": [{"utilization": {"gpu": -1}}]}"#).is_err());
        assert!(State::parse(r#"{"gpus": [{"processes": [{"pid": "x"}]}]}"#).is_err());
    }

    #[test]
    fn malformed_files_say_where() {
        let e = State::parse("{\"gpus\": [ {\"minor\": \"zero\"} ]}").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        assert!(State::parse(r#"{"gpus": [{"cpu_affinity": "3-1"}]}"#).is_err());
        assert!(State::parse("not json").is_err());
    }

    #[test]
    fn bus_ids_match_in_every_form() {
        let s =
            State::parse(r#"{"gpus": [{"pci_bus_id": "00000000:1B:00.0"}, {"pci_bus_id": "0000:9a:00.0"}]}"#)
                .unwrap();
        assert_eq!(s.index_by_pci("1b:00.0"), Some(0));
        assert_eq!(s.index_by_pci("0000:1B:00.0"), Some(0));
        assert_eq!(s.index_by_pci("00000000:9A:00.0"), Some(1));
        assert_eq!(s.index_by_pci("00000000:9A:00.1"), None);
        assert_eq!(s.index_by_pci("garbage"), None);
    }

    #[test]
    fn loader_rereads_changes_and_keeps_the_last_good_state() {
        let dir = std::env::temp_dir().join(format!("fake-nvml-loader-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        fs::write(&path, r#"{"gpus": [{"uuid": "GPU-a"}]}"#).unwrap();
        let mut loader = Loader::open(&path).unwrap();
        assert_eq!(loader.current().0.gpus.len(), 1);

        let tmp = dir.join("state.json.tmp");
        fs::write(&tmp, r#"{"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]}"#).unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert_eq!(loader.current().0.gpus.len(), 2);

        fs::write(&tmp, "{ broken").unwrap();
        fs::rename(&tmp, &path).unwrap();
        let (state, error) = loader.current();
        assert_eq!(state.gpus.len(), 2);
        assert!(error.is_some());
        assert!(loader.current().1.is_none(), "the error is reported once");
        fs::remove_dir_all(&dir).unwrap();
    }
}
