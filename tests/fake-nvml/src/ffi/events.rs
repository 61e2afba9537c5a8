//! Events: the supported event types, event sets, registering for and waiting on
//! Xid critical-error events.

use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlReturn_t};

use super::{EventSet, Lib, device_handle, device_index, guard, lib, put, rc, with_gpu};

const XID_CRITICAL_ERROR: u64 = 0x8;
const SET_BASE: usize = 0xE7E7_0000;
/// How often a waiting `nvmlEventSetWait` looks at the state file again.
const EVENT_POLL: Duration = Duration::from_millis(20);

// ----- events -----------------------------------------------------------------------

/// # Safety
/// `types` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, |state, _, _| {
        let supported = if state.events_supported { XID_CRITICAL_ERROR } else { 0 };
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(types, supported) }
    })
}

/// # Safety
/// `set` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        let mut lib = lib();
        if let Err(code) = lib.state() {
            return code;
        }
        let key = SET_BASE + lib.next_set;
        lib.next_set += 1;
        lib.sets.insert(key, EventSet::default());
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(set, key as nvmlEventSet_t) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    // A system without events (`"events_supported": false`) answers as real NVML does there.
    let code =
        with_gpu(device, |state, _, _| if state.events_supported { rc::SUCCESS } else { rc::NOT_SUPPORTED });
    if code != rc::SUCCESS {
        return code;
    }
    if types & !XID_CRITICAL_ERROR != 0 {
        return rc::NOT_SUPPORTED;
    }
    guard(|| {
        let (Some(index), mut lib) = (device_index(device), lib()) else { return rc::INVALID_ARGUMENT };
        match lib.sets.get_mut(&(set as usize)) {
            Some(s) => {
                *s.gpus.entry(index).or_insert(0) |= types;
                rc::SUCCESS
            }
            None => rc::INVALID_ARGUMENT,
        }
    })
}

/// The next event for `set`, advancing its cursor past everything looked at.
fn next_event(lib: &mut Lib, set: usize) -> Result<Option<(usize, u64)>, nvmlReturn_t> {
    let events = lib.state()?.events.clone();
    let Some(s) = lib.sets.get_mut(&set) else { return Err(rc::INVALID_ARGUMENT) };
    // A rewritten, shorter file starts over at its end.
    s.cursor = s.cursor.min(events.len());
    while let Some(ev) = events.get(s.cursor) {
        s.cursor += 1;
        let gpu = ev.gpu as usize;
        if s.gpus.get(&gpu).is_some_and(|mask| mask & XID_CRITICAL_ERROR != 0) {
            return Ok(Some((gpu, ev.xid)));
        }
    }
    Ok(None)
}

/// # Safety
/// `data` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            match next_event(&mut lib(), set as usize) {
                Err(code) => return code,
                Ok(Some((gpu, xid))) => {
                    let event = nvmlEventData_t {
                        device: device_handle(gpu),
                        eventType: XID_CRITICAL_ERROR,
                        eventData: xid,
                        gpuInstanceId: u32::MAX,
                        computeInstanceId: u32::MAX,
                    };
                    // SAFETY: the caller's pointer contract is ours.
                    return unsafe { put(data, event) };
                }
                Ok(None) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return rc::TIMEOUT;
            }
            std::thread::sleep(EVENT_POLL.min(deadline - now));
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| if lib().sets.remove(&(set as usize)).is_some() { rc::SUCCESS } else { rc::INVALID_ARGUMENT })
}
