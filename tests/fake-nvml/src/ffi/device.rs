//! Device enumeration and identity: the GPU count, the handle lookups (by index,
//! UUID, PCI bus id), and each GPU's index, UUID, name, minor number and PCI info.

use std::ffi::{CStr, c_char, c_uint};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlPciInfo_t, nvmlReturn_t};

use super::{device_handle, guard, lib, mig_index, put, rc, with_gpu, with_mig, write_str};
use crate::state::State;

/// Reads a C string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn arg_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated, per the contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// # Safety
/// `count` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| match lib().state() {
        // SAFETY: the caller's pointer contract is ours.
        Ok(state) => unsafe { put(count, c_uint::try_from(state.gpus.len()).unwrap_or(c_uint::MAX)) },
        Err(code) => code,
    })
}

// ----- handles ----------------------------------------------------------------------

/// Looks a GPU up with `find` and writes its handle, honouring `lost` and `hang_ms`.
fn lookup(device: *mut nvmlDevice_t, find: impl FnOnce(&State) -> Option<usize>) -> nvmlReturn_t {
    guard(|| {
        let found = match lib().state() {
            Ok(state) => find(state).ok_or(rc::NOT_FOUND),
            Err(code) => Err(code),
        };
        match found {
            Err(code) => code,
            Ok(index) => {
                let handle = device_handle(index);
                // SAFETY: `device` is the caller's out pointer.
                with_gpu(handle, |_, _, _| unsafe { put(device, handle) })
            }
        }
    })
}

/// # Safety
/// `device` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let index = index as usize;
    let found = lookup(device, |s| (index < s.gpus.len()).then_some(index));
    if found == rc::NOT_FOUND { rc::INVALID_ARGUMENT } else { found }
}

/// # Safety
/// `uuid` is a C string; `device` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller passes a C string.
    let Some(uuid) = (unsafe { arg_str(uuid) }) else { return rc::INVALID_ARGUMENT };
    lookup(device, |s| s.index_by_uuid(uuid))
}

/// # Safety
/// `bus_id` is a C string; `device` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller passes a C string.
    let Some(bus_id) = (unsafe { arg_str(bus_id) }) else { return rc::INVALID_ARGUMENT };
    lookup(device, |s| s.index_by_pci(bus_id))
}

// ----- device queries ---------------------------------------------------------------

/// # Safety
/// `index` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's pointer contract is ours.
    with_gpu(device, |_, i, _| unsafe { put(index, c_uint::try_from(i).unwrap_or(c_uint::MAX)) })
}

/// # Safety
/// `uuid` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    if mig_index(device).is_some() {
        // SAFETY: the caller's buffer contract is ours.
        return with_mig(device, |_, _, m| unsafe { write_str(uuid, length, &m.uuid) });
    }
    // SAFETY: the caller's buffer contract is ours.
    with_gpu(device, |_, _, gpu| unsafe { write_str(uuid, length, &gpu.uuid) })
}

/// # Safety
/// `name` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's buffer contract is ours.
    with_gpu(device, |_, _, gpu| unsafe { write_str(name, length, &gpu.name) })
}

/// # Safety
/// `minor` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's pointer contract is ours.
    with_gpu(device, |_, _, gpu| unsafe { put(minor, gpu.minor) })
}

fn fill_c_chars(dst: &mut [c_char], text: &str) {
    for (d, s) in dst.iter_mut().zip(text.bytes().chain(std::iter::repeat(0))) {
        *d = s as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
}

/// # Safety
/// `pci` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| {
        let Some(addr) = gpu.pci_addr() else { return rc::UNKNOWN };
        let id = addr.nvml();
        // SAFETY: nvmlPciInfo_t is plain old data; all-zero is a valid value.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        fill_c_chars(&mut info.busId, &id);
        fill_c_chars(&mut info.busIdLegacy, &id[4..]);
        info.domain = addr.domain();
        info.bus = u32::from(addr.bus());
        info.device = u32::from(addr.device());
        info.pciDeviceId = 0x2330_10de;
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(pci, info) }
    })
}
