//! The NVML C functions the project calls, answered from the state file.
//!
//! Device handles are not pointers to anything: a handle is `DEVICE_BASE + index`,
//! a MIG device's handle `MIG_BASE + gpu * MIG_SLOTS + mig index`, and event
//! sets are `SET_BASE + n`. NVML's users never dereference them.
//!
//! Each submodule holds the exported functions of one NVML API area:
//! [`system`] (init, shutdown, error strings, versions), [`device`] (count, handles,
//! index, UUID, name, minor number, PCI info), [`health`] (ECC counts, remapped rows,
//! field values), [`affinity`] (CPU and memory affinity, NUMA node), [`events`] (event
//! sets, Xid events), [`links`] (PCIe, NVLink, fabric), [`modes`] (clock event reasons,
//! ECC, persistence and performance modes), [`mig`] (MIG mode and MIG handles) and
//! [`usage`] (utilization, memory, power, clock, compute processes). This
//! module holds what they share: the library state, the panic guard, the handle
//! encodings and the out-pointer helpers.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::state::{Gpu, Loader, MIG_SLOTS, MigInstance, State};

mod affinity;
mod device;
mod events;
mod health;
mod links;
mod mig;
mod modes;
mod system;
mod usage;

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

    pub use crate::state::NVML_ERRORS as NAMES;
}

const DEVICE_BASE: usize = 0xF00D_0000;

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
