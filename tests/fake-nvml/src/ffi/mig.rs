//! MIG: a GPU's MIG mode and MIG device count, and the MIG device handles
//! (by index, to the parent GPU, whether a handle is one).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use super::{device_handle, mig_handle, mig_index, put, rc, with_gpu, with_mig};

/// # Safety
/// Each out pointer is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| match &gpu.mig {
        None => rc::NOT_SUPPORTED,
        // SAFETY: the caller's pointer contract is ours.
        Some(m) => unsafe {
            let current = put(current_mode, c_uint::from(m.enabled));
            let pending = put(pending_mode, c_uint::from(m.pending.unwrap_or(m.enabled)));
            if current == rc::SUCCESS { pending } else { current }
        },
    })
}

/// # Safety
/// `count` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // NVML: zero when MIG is not supported or not on.
    with_gpu(device, |_, _, gpu| {
        let max = gpu.mig.as_ref().filter(|m| m.enabled).map_or(0, |m| m.max_devices);
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(count, max) }
    })
}

/// # Safety
/// `mig_device` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_gpu(device, |_, gpu_index, gpu| match &gpu.mig {
        None => rc::NOT_SUPPORTED,
        Some(m) if index >= m.max_devices => rc::INVALID_ARGUMENT,
        Some(m) if m.instance(index).is_none() => rc::NOT_FOUND,
        // SAFETY: the caller's pointer contract is ours.
        Some(_) => unsafe { put(mig_device, mig_handle(gpu_index, index)) },
    })
}

/// # Safety
/// `device` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's pointer contract is ours.
    with_mig(mig_device, |gpu, _, _| unsafe { put(device, device_handle(gpu)) })
}

/// # Safety
/// `is_mig_device` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig_device: *mut c_uint,
) -> nvmlReturn_t {
    if mig_index(device).is_some() {
        // SAFETY: the caller's pointer contract is ours.
        return with_mig(device, |_, _, _| unsafe { put(is_mig_device, 1) });
    }
    // SAFETY: the caller's pointer contract is ours.
    with_gpu(device, |_, _, _| unsafe { put(is_mig_device, 0) })
}
