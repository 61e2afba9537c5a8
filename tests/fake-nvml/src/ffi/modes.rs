//! Clock event (throttle) reasons and the ECC, persistence and performance modes.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use super::{answer, put, rc, with_gpu};

/// # Safety
/// `reasons` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, reasons, |g| g.links.clock_mask()) }
}

/// The older name of [`nvmlDeviceGetCurrentClocksEventReasons`] (what nvml-wrapper 0.13 calls).
///
/// # Safety
/// `reasons` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device, reasons) }
}

/// # Safety
/// `current` and `pending` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| match gpu.links.ecc_mode.as_deref() {
        Some(mode) => {
            let on = c_uint::from(mode == "enabled");
            // SAFETY: the caller's pointer contract is ours.
            let codes = unsafe { [put(current, on), put(pending, on)] };
            codes.into_iter().find(|c| *c != rc::SUCCESS).unwrap_or(rc::SUCCESS)
        }
        None => rc::NOT_SUPPORTED,
    })
}

/// # Safety
/// `mode` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, mode, |g| g.links.persistence.map(c_uint::from)) }
}

/// # Safety
/// `pstate` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    pstate: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, pstate, |g| g.links.pstate) }
}
