//! Interconnect: the PCIe link (current and maximum generation and width), the
//! NVLinks (state, error counters) and the NVSwitch fabric registration.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use super::{answer, put, rc, with_gpu};
use crate::state::Gpu;

/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, value, |g| g.links.pcie.map(|p| p.r#gen)) }
}

/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, value, |g| g.links.pcie.map(|p| p.width)) }
}

/// The lower of the GPU's and the slot's maximum generation.
///
/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe {
        answer(device, value, |g| g.links.pcie.map(|p| p.slot_max_gen.unwrap_or(p.max_gen).min(p.max_gen)))
    }
}

/// The lower of the GPU's and the slot's maximum width.
///
/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe {
        answer(device, value, |g| {
            g.links.pcie.map(|p| p.slot_max_width.unwrap_or(p.max_width).min(p.max_width))
        })
    }
}

/// The GPU's own maximum generation.
///
/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, value, |g| g.links.pcie.map(|p| p.max_gen)) }
}

/// The GPU's maximum link speed: `NVML_PCIE_LINK_MAX_SPEED_*MBPS`, whose
/// codes 1-6 are the generations 1-6.
///
/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieLinkMaxSpeed(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { answer(device, value, |g| g.links.pcie.map(|p| p.max_gen).filter(|g| (1..=6).contains(g))) }
}

/// The link's entry: `NOT_SUPPORTED` without NVLink, `INVALID_ARGUMENT` past the last link.
fn nvlink(gpu: &Gpu, link: c_uint) -> Result<&crate::state::NvLink, nvmlReturn_t> {
    match gpu.links.nvlinks.as_deref() {
        None | Some([]) => Err(rc::NOT_SUPPORTED),
        Some(links) => links.get(link as usize).ok_or(rc::INVALID_ARGUMENT),
    }
}

/// # Safety
/// `active` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    active: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| match nvlink(gpu, link) {
        // SAFETY: the caller's pointer contract is ours.
        Ok(l) => unsafe { put(active, c_uint::from(l.state == "up")) },
        Err(code) => code,
    })
}

/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: c_uint,
    value: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| {
        let l = match nvlink(gpu, link) {
            Ok(l) => l,
            Err(code) => return code,
        };
        let v = match counter {
            0 => l.replay_errors,
            1 => l.recovery_errors,
            2 => l.crc_errors,
            3 | 4 => 0,
            _ => return rc::INVALID_ARGUMENT,
        };
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(value, v) }
    })
}

/// The fabric keys as NVML's (state, status).
fn fabric(gpu: &Gpu) -> Option<(u8, nvmlReturn_t)> {
    let f = gpu.links.fabric.as_ref()?;
    let state = crate::state::FABRIC_STATES.iter().find(|(k, _)| *k == f.state).map_or(0, |(_, v)| *v);
    Some((state, if f.status == "failure" { rc::UNKNOWN } else { rc::SUCCESS }))
}

/// # Safety
/// `info` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    info: *mut nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| {
        let Some((state, status)) = fabric(gpu) else { return rc::NOT_SUPPORTED };
        let value = nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t {
            clusterUuid: [0; 16],
            status,
            cliqueId: 0,
            state,
        };
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(info, value) }
    })
}

/// Versioned: `version` names the struct the caller passed (v2 or v3).
///
/// # Safety
/// `info` is valid for a write of the struct its `version` names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    info: *mut nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v3_t,
) -> nvmlReturn_t {
    use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t};
    const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    const FUNCTION_NOT_FOUND: u32 = 13;
    let version_of = |size: usize, v: u32| u32::try_from(size).unwrap_or(0) | (v << 24);
    let v2 = version_of(std::mem::size_of::<nvmlGpuFabricInfo_v2_t>(), 2);
    let v3 = version_of(std::mem::size_of::<nvmlGpuFabricInfo_v3_t>(), 3);
    if info.is_null() {
        return rc::INVALID_ARGUMENT;
    }
    // SAFETY: non-NULL; every version starts with the `version` word.
    let version = unsafe { info.cast::<c_uint>().read() };
    let size = if version == v3 {
        std::mem::size_of::<nvmlGpuFabricInfo_v3_t>()
    } else if version == v2 {
        std::mem::size_of::<nvmlGpuFabricInfo_v2_t>()
    } else {
        return ARGUMENT_VERSION_MISMATCH;
    };
    with_gpu(device, |state, _, gpu| {
        match state.fabric_info_version {
            0 | 1 => return FUNCTION_NOT_FOUND,
            2 if version == v3 => return ARGUMENT_VERSION_MISMATCH,
            _ => {}
        }
        let Some((state, status)) = fabric(gpu) else { return rc::NOT_SUPPORTED };
        let value = nvmlGpuFabricInfo_v3_t {
            version,
            clusterUuid: [0; 16],
            status,
            cliqueId: 0,
            state,
            healthMask: 0,
            healthSummary: 0,
        };
        // SAFETY: the caller's struct holds `size` bytes, as its version says; v2 is
        // v3's prefix (the same fields in the same order, `healthSummary` appended).
        unsafe { std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), info.cast::<u8>(), size) };
        rc::SUCCESS
    })
}
