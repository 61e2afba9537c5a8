//! Memory health: ECC error counts, remapped rows, and the field values
//! (`nvmlDeviceGetFieldValues`: the remapped-row fields and the recovery action).

use std::ffi::{c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlFieldValue_t, nvmlReturn_t};

use super::{put, rc, with_gpu};

/// NVML field ids the fake answers (`nvmlDeviceGetFieldValues`), from the
/// same bindings the agent's nvml-wrapper uses.
mod field {
    pub use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as GPU_RECOVERY_ACTION, NVML_FI_DEV_REMAPPED_COR as REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_FAILURE as REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING as REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_UNC as REMAPPED_UNC,
    };
}

const VALUE_TYPE_UNSIGNED_INT: u32 = 1;

/// # Safety
/// `count` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| {
        let counts = match counter_type {
            0 => gpu.ecc.volatile,
            1 => gpu.ecc.aggregate,
            _ => return rc::INVALID_ARGUMENT,
        };
        let value = match error_type {
            0 => counts.corrected,
            1 => counts.uncorrected,
            _ => return rc::INVALID_ARGUMENT,
        };
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(count, value) }
    })
}

/// # Safety
/// Each out pointer is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| {
        let r = gpu.remapped_rows;
        // SAFETY: the caller's pointer contract is ours.
        unsafe {
            let codes = [
                put(corr_rows, r.correctable),
                put(unc_rows, r.uncorrectable),
                put(is_pending, c_uint::from(r.pending)),
                put(failure_occurred, c_uint::from(r.failure)),
            ];
            codes.into_iter().find(|c| *c != rc::SUCCESS).unwrap_or(rc::SUCCESS)
        }
    })
}

fn recovery_action_code(name: &str) -> Option<u32> {
    match name {
        "none" => Some(0),
        "gpu_reset" => Some(1),
        "node_reboot" => Some(2),
        "drain_p2p" => Some(3),
        "drain_and_reset" => Some(4),
        _ => None,
    }
}

/// # Safety
/// `values` holds `count` field values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    let Ok(count) = usize::try_from(count) else { return rc::INVALID_ARGUMENT };
    if values.is_null() {
        return rc::INVALID_ARGUMENT;
    }
    with_gpu(device, |_, _, gpu| {
        // SAFETY: the caller passes `count` values.
        let values = unsafe { std::slice::from_raw_parts_mut(values, count) };
        let r = gpu.remapped_rows;
        for v in values {
            let answer = match v.fieldId {
                field::REMAPPED_COR => Some(r.correctable),
                field::REMAPPED_UNC => Some(r.uncorrectable),
                field::REMAPPED_PENDING => Some(u32::from(r.pending)),
                field::REMAPPED_FAILURE => Some(u32::from(r.failure)),
                field::GPU_RECOVERY_ACTION => gpu.recovery_action.as_deref().and_then(recovery_action_code),
                _ => None,
            };
            match answer {
                Some(x) => {
                    v.nvmlReturn = rc::SUCCESS;
                    v.valueType = VALUE_TYPE_UNSIGNED_INT;
                    v.value.uiVal = x;
                }
                None => v.nvmlReturn = rc::NOT_SUPPORTED,
            }
        }
        rc::SUCCESS
    })
}
