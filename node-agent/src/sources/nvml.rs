//! NVML, through nvml-wrapper, with a deadline on every GPU.
//!
//! NVML calls can hang rather than fail (a stuck driver, a GPU in a bad
//! state). [`Probe`] samples each GPU under its own deadline on worker
//! threads, so one hung GPU never hides the others; a GPU past its deadline
//! is a sample that says so ([`crate::policy::health::Hang`]), and the policy's
//! `nvml_hang` judges it after `nvml_hang_polls` polls. NVML itself not
//! answering (loading, counting the GPUs) is the agent's own trouble: it
//! reports itself unhealthy and never drains for it. Xid events come from a
//! thread of their own that waits on an NVML event set.

mod probe;
pub mod usage;

pub use probe::Probe;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use slurm_formats::pci::PciAddr;

use crate::policy::checks::{Fabric, FabricState, HwSample, NvLink, Pcie};
use crate::policy::health::{GpuSample, Remap, XidEvent};
use crate::sources::{self, Source};

/// NVML field ids (nvml.h, as nvml-wrapper exports them): remapped rows and
/// the driver's recovery action.
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as FI_GPU_RECOVERY_ACTION,
    NVML_FI_DEV_REMAPPED_COR as FI_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE as FI_REMAPPED_FAILURE,
    NVML_FI_DEV_REMAPPED_PENDING as FI_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC as FI_REMAPPED_UNC,
};

/// Why there are no samples: the agent's own trouble, never the GPUs'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// NVML cannot be loaded or initialised (no driver, no library, ...).
    Unavailable(String),
    /// An NVML call has not returned within the deadline.
    Hung(String),
    /// The NVML library does not match the loaded driver
    /// (`LIB_RM_VERSION_MISMATCH`): the node's fault, not the agent's.
    DriverMismatch(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Unavailable(e) => write!(f, "NVML unavailable: {e}"),
            ProbeError::Hung(e) => write!(f, "NVML hung: {e}"),
            ProbeError::DriverMismatch(e) => write!(f, "NVML: driver/library mismatch: {e}"),
        }
    }
}

pub(crate) fn load(lib: &Path) -> Result<Nvml, NvmlError> {
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

/// Samples GPU `index` (its handle first: a lost GPU, one that needs a
/// reset or cannot be opened is a sample saying so).
pub(crate) fn sample_index(nvml: &Nvml, index: u32) -> GpuSample {
    match nvml.device_by_index(index) {
        Ok(device) => sample_one(index, &device),
        Err(NvmlError::GpuLost) => GpuSample { index, lost: true, ..GpuSample::default() },
        Err(NvmlError::ResetRequired) => GpuSample { index, reset_required: true, ..GpuSample::default() },
        Err(e) => {
            tracing::warn!(gpu = index, error = %e, "cannot open GPU");
            GpuSample { index, open_error: Some(e.to_string()), ..GpuSample::default() }
        }
    }
}

/// The value, or `None` for an unsupported or failed query; notes a lost
/// GPU (`lost.0`) and one that needs a reset (`lost.1`).
fn ok<T>(lost: &mut (bool, bool), r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::GpuLost) => {
            lost.0 = true;
            None
        }
        Err(NvmlError::ResetRequired) => {
            lost.1 = true;
            None
        }
        Err(_) => None,
    }
}

fn sample_one(index: u32, d: &Device<'_>) -> GpuSample {
    let mut lost = (false, false);
    let uuid = ok(&mut lost, d.uuid());
    let bus_id = ok(&mut lost, d.pci_info()).and_then(|p| PciAddr::parse(&p.bus_id).ok());
    let minor = ok(&mut lost, d.minor_number());
    let ecc_uncorrectable = ok(&mut lost, d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile));
    let ids = [
        FieldId(FI_REMAPPED_COR),
        FieldId(FI_REMAPPED_UNC),
        FieldId(FI_REMAPPED_PENDING),
        FieldId(FI_REMAPPED_FAILURE),
        FieldId(FI_GPU_RECOVERY_ACTION),
    ];
    let fields: Vec<Option<u64>> = ok(&mut lost, d.field_values_for(&ids))
        .map(|v| {
            v.into_iter()
                .map(|s| match s.ok()?.value.ok()? {
                    SampleValue::U32(x) => Some(u64::from(x)),
                    SampleValue::U64(x) => Some(x),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).copied().flatten();
    let small = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let remap = match (field(0), field(1), field(2), field(3)) {
        (Some(c), Some(u), Some(p), Some(f)) => {
            Some(Remap { correctable: small(c), uncorrectable: small(u), pending: p != 0, failure: f != 0 })
        }
        _ => None,
    };
    let hw = sample_hw(d, &mut lost);
    GpuSample {
        index,
        uuid,
        bus_id,
        minor,
        ecc_uncorrectable,
        remap,
        recovery_action: field(4).map(small),
        lost: lost.0,
        reset_required: lost.1,
        open_error: None,
        hw,
        hang: None,
    }
}

/// NVML's most NVLinks per GPU (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;

/// The PCIe link, NVLinks, clock events, ECC and persistence modes of a GPU;
/// what NVML does not support stays `None` (not checked).
///
/// The fabric state (`nvmlDeviceGetGpuFabricInfo[V]`) and the GPU's maximum
/// PCIe generation, which nvml-wrapper 0.13 lacks, come from `nvml_extra`
/// (this crate forbids `unsafe`). A driver with neither fabric call reads as
/// not supported.
fn sample_hw(d: &Device<'_>, lost: &mut (bool, bool)) -> HwSample {
    // The GPU's own maximum generation, not the slot's (a GPU in a slot of a
    // lower generation then reads as degraded, as it is); where the driver lacks
    // that call, the lower of the two. NVML has only the lower of the two widths.
    let gpu_max_gen = ok(lost, nvml_extra::gpu_max_pcie_link_generation(d));
    let pcie = match (
        ok(lost, d.current_pcie_link_gen()),
        ok(lost, d.current_pcie_link_width()),
        gpu_max_gen.or_else(|| ok(lost, d.max_pcie_link_gen())),
        ok(lost, d.max_pcie_link_width()),
    ) {
        (Some(r#gen), Some(width), Some(max_gen), Some(max_width)) => {
            Some(Pcie { r#gen, width, max_gen, max_width })
        }
        _ => None,
    };
    let pstate = ok(lost, d.performance_state()).map(|p| p.as_c());
    let mut nvlinks = Vec::new();
    for link in 0..MAX_NVLINKS {
        let l = d.link_wrapper_for(link);
        // A link NVML does not report (NOT_SUPPORTED, INVALID_ARGUMENT) is not there.
        let Some(up) = ok(lost, l.is_active()) else { continue };
        let count = |c: ErrorCounter| l.error_counter(c).unwrap_or(0);
        let (crc, replay, recovery) = if up {
            (
                count(ErrorCounter::DlCrcFlit).saturating_add(count(ErrorCounter::DlCrcData)),
                count(ErrorCounter::DlReplay),
                count(ErrorCounter::DlRecovery),
            )
        } else {
            (0, 0, 0)
        };
        nvlinks.push(NvLink { link, up, crc, replay, recovery });
    }
    HwSample {
        pcie,
        pstate,
        nvlinks: (!nvlinks.is_empty()).then_some(nvlinks),
        fabric: ok(lost, nvml_extra::gpu_fabric_info(d)).map(|f| Fabric {
            // NVML_GPU_FABRIC_STATE_*; 0 and anything newer: not supported.
            state: match f.state {
                1 => FabricState::NotStarted,
                2 => FabricState::InProgress,
                3 => FabricState::Completed,
                _ => FabricState::NotSupported,
            },
            // Not NVML_SUCCESS; the rule looks at it only once completed.
            failed: f.status != 0,
        }),
        clock_events: ok(lost, d.current_throttle_reasons()).map(|r| r.bits()),
        ecc_mode: ok(lost, d.is_ecc_enabled()).map(|e| e.currently_enabled),
        persistence: ok(lost, d.is_in_persistent_mode()),
    }
}

/// The first wait before watching NVML events again after a failure; it
/// doubles up to [`EVENT_RETRY_MAX`] while the failure lasts.
const EVENT_RETRY_MIN: Duration = Duration::from_secs(2);
/// The longest wait between tries (every try initialises NVML).
const EVENT_RETRY_MAX: Duration = Duration::from_secs(300);

/// Waits on an NVML event set for Xid critical errors on every GPU and sends
/// them to `tx`, until `stop` is set. (Re)initialises NVML as needed. When the
/// events cannot be had (NVML says `NOT_SUPPORTED` on some VMs and old
/// drivers), one warning says what still works, `source_up{source="nvml_events"}`
/// turns 0, and it tries again, less and less often.
pub fn watch_events(lib: PathBuf, tx: Sender<XidEvent>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    thread::Builder::new().name("nvml-events".to_owned()).spawn(move || {
        let mut retry = EVENT_RETRY_MIN;
        while !stop.load(Ordering::Relaxed) {
            let armed = AtomicBool::new(false);
            let result = watch_once(&lib, &tx, &stop, &armed);
            if armed.load(Ordering::Relaxed) {
                retry = EVENT_RETRY_MIN;
            }
            if let Err(e) = result {
                if sources::set(Source::NvmlEvents, false) != Some(false) {
                    tracing::warn!(
                        error = %e,
                        "NVML Xid events unavailable: Xids are now seen only in the kernel log (kmsg_path), \
                         and ECC, remapped rows and lost GPUs are still checked every poll_interval; retrying"
                    );
                } else {
                    tracing::debug!(error = %e, retry = ?retry, "NVML Xid events still unavailable");
                }
                sleep_unless(&stop, retry);
                retry = (retry * 2).min(EVENT_RETRY_MAX);
            }
        }
    })?;
    Ok(())
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
    }
}

fn watch_once(
    lib: &Path,
    tx: &Sender<XidEvent>,
    stop: &AtomicBool,
    armed: &AtomicBool,
) -> Result<(), NvmlError> {
    let nvml = load(lib)?;
    let mut set = nvml.create_event_set()?;
    for i in 0..nvml.device_count()? {
        let Ok(device) = nvml.device_by_index(i) else { continue };
        set = device.register_events(EventTypes::CRITICAL_XID_ERROR, set).map_err(|e| e.error)?;
    }
    armed.store(true, Ordering::Relaxed);
    if sources::set(Source::NvmlEvents, true) == Some(false) {
        tracing::info!("NVML Xid events available again");
    }
    while !stop.load(Ordering::Relaxed) {
        match set.wait(500) {
            Ok(ev) => {
                let Some(XidError::Value(xid)) = ev.event_data else { continue };
                let gpu = ev.device.index().ok();
                let bus = ev.device.pci_info().ok().and_then(|p| PciAddr::parse(&p.bus_id).ok());
                let event = XidEvent::from_nvml(xid, gpu, bus);
                if tx.send(event).is_err() {
                    return Ok(());
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
