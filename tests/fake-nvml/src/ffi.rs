//! The NVML C functions the project calls, answered from the state file.
//!
//! Device handles are not pointers to anything: a handle is `DEVICE_BASE + index`,
//! a MIG device's handle `MIG_BASE + gpu * MIG_SLOTS + mig index`, and event
//! sets are `SET_BASE + n`. NVML's users never dereference them.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_ulonglong};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t, nvmlPciInfo_t, nvmlReturn_t,
};

use crate::state::{Gpu, Loader, MIG_SLOTS, MigInstance, State};

/// NVML return codes (`nvmlReturn_t`), by the names the state file uses.
mod rc {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const TIMEOUT: u32 = 10;
    pub const GPU_IS_LOST: u32 = 15;
    pub const UNKNOWN: u32 = 999;

    pub const NAMES: &[(&str, u32)] = &[
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
}

/// NVML field ids the fake answers (`nvmlDeviceGetFieldValues`), from the
/// same bindings the agent's nvml-wrapper uses.
mod field {
    pub use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as GPU_RECOVERY_ACTION, NVML_FI_DEV_REMAPPED_COR as REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_FAILURE as REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING as REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_UNC as REMAPPED_UNC,
    };
}

const XID_CRITICAL_ERROR: u64 = 0x8;
const VALUE_TYPE_UNSIGNED_INT: u32 = 1;
const DEVICE_BASE: usize = 0xF00D_0000;
const SET_BASE: usize = 0xE7E7_0000;
/// How often a waiting `nvmlEventSetWait` looks at the state file again.
const EVENT_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Default)]
struct EventSet {
    /// Index of the next entry of `events` to look at.
    cursor: usize,
    /// NVML index → registered event mask.
    gpus: BTreeMap<usize, u64>,
}

#[derive(Debug)]
struct Lib {
    init_count: u32,
    loader: Option<Loader>,
    sets: BTreeMap<usize, EventSet>,
    next_set: usize,
}

static LIB: Mutex<Lib> = Mutex::new(Lib { init_count: 0, loader: None, sets: BTreeMap::new(), next_set: 0 });

fn lib() -> MutexGuard<'static, Lib> {
    LIB.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lib {
    /// The current state, or `UNINITIALIZED`.
    fn state(&mut self) -> Result<&State, nvmlReturn_t> {
        if self.init_count == 0 {
            return Err(rc::UNINITIALIZED);
        }
        let loader = self.loader.as_mut().ok_or(rc::UNINITIALIZED)?;
        let (state, error) = loader.current();
        if let Some(e) = error {
            eprintln!("fake-nvml: {e}");
        }
        Ok(state)
    }
}

/// Runs an exported function's body, turning a panic into `UNKNOWN` (a panic
/// must not unwind into C).
fn guard(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("fake-nvml: internal error (panic)");
        rc::UNKNOWN
    })
}

fn device_index(device: nvmlDevice_t) -> Option<usize> {
    (device as usize).checked_sub(DEVICE_BASE)
}

fn device_handle(index: usize) -> nvmlDevice_t {
    (DEVICE_BASE + index) as nvmlDevice_t
}

/// Runs `f` on one GPU the way NVML would: `UNINITIALIZED` before init,
/// `INVALID_ARGUMENT` for a bad handle, the GPU's `hang_ms` first, then
/// `GPU_IS_LOST` for a lost GPU, then the GPU's `error`.
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&State, usize, &Gpu) -> nvmlReturn_t) -> nvmlReturn_t {
    guard(|| {
        let Some(index) = device_index(device) else { return rc::INVALID_ARGUMENT };
        let hang = {
            let mut lib = lib();
            let state = match lib.state() {
                Ok(s) => s,
                Err(code) => return code,
            };
            match state.gpus.get(index) {
                Some(gpu) => gpu.hang_ms,
                None => return rc::INVALID_ARGUMENT,
            }
        };
        if hang > 0 {
            std::thread::sleep(Duration::from_millis(hang));
        }
        let mut lib = lib();
        let state = match lib.state() {
            Ok(s) => s,
            Err(code) => return code,
        };
        match state.gpus.get(index) {
            None => rc::INVALID_ARGUMENT,
            Some(gpu) if gpu.lost => rc::GPU_IS_LOST,
            Some(Gpu { error: Some(name), .. }) => {
                rc::NAMES.iter().find(|(n, _)| n == name).map_or(rc::UNKNOWN, |(_, code)| *code)
            }
            Some(gpu) => f(state, index, gpu),
        }
    })
}

/// Copies `text` and a NUL into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes of writes.
unsafe fn write_str(buf: *mut c_char, len: c_uint, text: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return rc::INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len as usize {
        return rc::INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` holds at least `len >= bytes.len() + 1` bytes, per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    rc::SUCCESS
}

/// Writes `value` through an out pointer.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return rc::INVALID_ARGUMENT;
    }
    // SAFETY: non-NULL and valid for writes, per the contract.
    unsafe { out.write(value) };
    rc::SUCCESS
}

/// Writes a bitmask into a caller's array of `len` unsigned longs.
///
/// # Safety
/// `out` is NULL or valid for `len` writes.
unsafe fn put_mask(out: *mut c_ulong, len: c_uint, words: &[u64]) -> nvmlReturn_t {
    if out.is_null() || len == 0 {
        return rc::INVALID_ARGUMENT;
    }
    for i in 0..len as usize {
        // SAFETY: `i < len`, per the contract. c_ulong is 64 bits on Linux x86_64/aarch64.
        unsafe { out.add(i).write(words.get(i).copied().unwrap_or(0) as c_ulong) };
    }
    rc::SUCCESS
}

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

// ----- init -------------------------------------------------------------------------

fn init() -> nvmlReturn_t {
    guard(|| {
        let mut lib = lib();
        if lib.init_count > 0 {
            lib.init_count += 1;
            return rc::SUCCESS;
        }
        let Some(path) = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from) else {
            eprintln!("fake-nvml: FAKE_NVML_STATE is not set: name the JSON state file to serve");
            return rc::UNKNOWN;
        };
        let loader = match Loader::open(&path) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("fake-nvml: cannot load the state file: {e}");
                return rc::UNKNOWN;
            }
        };
        if let Some(name) = loader.state().init_error.clone() {
            return match rc::NAMES.iter().find(|(n, _)| *n == name) {
                Some((_, code)) => *code,
                None => {
                    eprintln!("fake-nvml: {}: unknown init_error '{name}'", path.display());
                    rc::UNKNOWN
                }
            };
        }
        lib.loader = Some(loader);
        lib.init_count = 1;
        rc::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let mut lib = lib();
        if lib.init_count == 0 {
            return rc::UNINITIALIZED;
        }
        lib.init_count -= 1;
        if lib.init_count == 0 {
            lib.loader = None;
            lib.sets.clear();
        }
        rc::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    match result {
        rc::SUCCESS => c"Success",
        rc::UNINITIALIZED => c"Uninitialized",
        rc::INVALID_ARGUMENT => c"Invalid Argument",
        rc::NOT_SUPPORTED => c"Not Supported",
        rc::NOT_FOUND => c"Not Found",
        rc::INSUFFICIENT_SIZE => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        rc::TIMEOUT => c"Timeout",
        rc::GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    }
    .as_ptr()
}

// ----- system -----------------------------------------------------------------------

/// # Safety
/// `version` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| match lib().state() {
        // SAFETY: the caller's buffer contract is ours.
        Ok(state) => unsafe { write_str(version, length, &state.driver_version) },
        Err(code) => code,
    })
}

/// # Safety
/// `version` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| match lib().state() {
        // SAFETY: the caller's buffer contract is ours.
        Ok(state) => unsafe { write_str(version, length, &format!("13.{}", state.driver_version)) },
        Err(code) => code,
    })
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

/// # Safety
/// `cpu_set` is valid for `size` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: nvmlDevice_t,
    size: c_uint,
    cpu_set: *mut c_ulong,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| match gpu.cpus() {
        // SAFETY: the caller's array contract is ours.
        Ok(cpus) => unsafe { put_mask(cpu_set, size, &cpus.to_words(0)) },
        Err(_) => rc::UNKNOWN,
    })
}

/// # Safety
/// `cpu_set` is valid for `size` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: nvmlDevice_t,
    size: c_uint,
    cpu_set: *mut c_ulong,
    _scope: c_uint,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCpuAffinity(device, size, cpu_set) }
}

/// # Safety
/// `node_set` is valid for `size` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: nvmlDevice_t,
    size: c_uint,
    node_set: *mut c_ulong,
    _scope: c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| {
        let nodes: gpu_core::cpuset::CpuSet = gpu.numa_node.into_iter().collect();
        // SAFETY: the caller's array contract is ours.
        unsafe { put_mask(node_set, size, &nodes.to_words(0)) }
    })
}

/// # Safety
/// `node` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, node: *mut c_uint) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| match gpu.numa_node {
        // SAFETY: the caller's pointer contract is ours.
        Some(n) => unsafe { put(node, n) },
        None => rc::NOT_SUPPORTED,
    })
}

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

// ----- PCIe, NVLink, fabric, clock events, ECC and persistence modes (issue 15) -----

/// Answers one number about a GPU from its link keys; `None` is `NOT_SUPPORTED`.
///
/// # Safety
/// `out` is NULL or valid for a write.
unsafe fn answer<T>(device: nvmlDevice_t, out: *mut T, f: impl FnOnce(&Gpu) -> Option<T>) -> nvmlReturn_t {
    with_gpu(device, |_, _, gpu| match f(gpu) {
        // SAFETY: the caller's pointer contract is ours.
        Some(v) => unsafe { put(out, v) },
        None => rc::NOT_SUPPORTED,
    })
}

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

// ----- MIG --------------------------------------------------------------------------

/// MIG device handles: `MIG_BASE + gpu * MIG_SLOTS + mig index`, below
/// `DEVICE_BASE`, so a GPU function given one answers `INVALID_ARGUMENT`.
const MIG_BASE: usize = 0xA160_0000;

/// The GPU's NVML index and the MIG device index of a MIG handle.
fn mig_index(device: nvmlDevice_t) -> Option<(usize, u32)> {
    let slots = MIG_SLOTS as usize;
    let offset = (device as usize).checked_sub(MIG_BASE).filter(|_| (device as usize) < DEVICE_BASE)?;
    Some((offset / slots, u32::try_from(offset % slots).ok()?))
}

fn mig_handle(gpu: usize, index: u32) -> nvmlDevice_t {
    (MIG_BASE + gpu * MIG_SLOTS as usize + index as usize) as nvmlDevice_t
}

/// Runs `f` on a MIG device as [`with_gpu`] runs on its parent (the parent's
/// `hang_ms`, `lost` and `error` apply); `INVALID_ARGUMENT` for a handle that
/// is not a MIG device's or whose device is gone (MIG off, instance removed).
fn with_mig(device: nvmlDevice_t, f: impl FnOnce(usize, &Gpu, &MigInstance) -> nvmlReturn_t) -> nvmlReturn_t {
    let Some((gpu, index)) = mig_index(device) else { return rc::INVALID_ARGUMENT };
    with_gpu(device_handle(gpu), |_, i, g| match g.mig.as_ref().and_then(|m| m.instance(index)) {
        Some(m) => f(i, g, m),
        None => rc::INVALID_ARGUMENT,
    })
}

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
