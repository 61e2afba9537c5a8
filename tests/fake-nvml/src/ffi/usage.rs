//! Usage, for the per-job sampler: utilization, memory, power, the energy
//! counter, the SM clock and the compute processes, on GPU handles and
//! (memory, processes) on MIG device handles. Each call can be failed
//! (`fail`) or hung (`hang_calls_ms`) on its own; a MIG device takes its
//! GPU's for a call it does not name.

use std::ffi::{c_uint, c_ulonglong};
use std::time::Duration;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_v2_t, nvmlReturn_t, nvmlUtilization_t,
};

use super::{guard, lib, mig_index, put, rc, with_gpu, with_mig};
use crate::state::{Gpu, MigInstance, Process};

const ARGUMENT_VERSION_MISMATCH: u32 = 25;

/// `NVML_VALUE_NOT_AVAILABLE` (as an unsigned long long and as an unsigned int).
const NOT_AVAILABLE: u64 = u64::MAX;
const NO_INSTANCE: u32 = u32::MAX;

/// The device a handle names: a GPU or one of its MIG devices.
enum Dev<'a> {
    Gpu(&'a Gpu),
    Mig(&'a Gpu, u32, &'a MigInstance),
}

impl Dev<'_> {
    /// The error `call` is set to fail with (the MIG device's, else its GPU's).
    fn fail(&self, call: &str) -> Option<u32> {
        match self {
            Dev::Gpu(g) => g.faults.fail_code(call),
            Dev::Mig(g, _, m) => m.faults.fail_code(call).or_else(|| g.faults.fail_code(call)),
        }
    }
}

/// How long `call` on `device` hangs before anything else (0 when the handle
/// is bad or the library not initialized; the call then says so itself).
fn call_hang(device: nvmlDevice_t, call: &str) -> u64 {
    let mut lib = lib();
    let Ok(state) = lib.state() else { return 0 };
    let hang = match mig_index(device) {
        Some((gpu, index)) => state.gpus.get(gpu).and_then(|g| {
            let own = g.mig.as_ref().and_then(|m| m.instance(index)).and_then(|m| m.faults.hang(call));
            own.or_else(|| g.faults.hang(call))
        }),
        None => super::device_index(device).and_then(|i| state.gpus.get(i)).and_then(|g| g.faults.hang(call)),
    };
    hang.unwrap_or(0)
}

/// Runs a usage call: its own hang, then what [`with_gpu`] / [`with_mig`]
/// do (the GPU's `hang_ms`, `lost`, `error`), then its injected failure, then `f`.
fn usage_call(
    device: nvmlDevice_t,
    call: &'static str,
    f: impl FnOnce(&Dev<'_>) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let hang = guard(|| {
        let ms = call_hang(device, call);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
        rc::SUCCESS
    });
    if hang != rc::SUCCESS {
        return hang;
    }
    let answer = |dev: Dev<'_>| match dev.fail(call) {
        Some(code) if code != rc::SUCCESS => code,
        _ => f(&dev),
    };
    if let Some((_, index)) = mig_index(device) {
        with_mig(device, |_, g, m| answer(Dev::Mig(g, index, m)))
    } else {
        with_gpu(device, |_, _, g| answer(Dev::Gpu(g)))
    }
}

/// The memory of a device: (total, used).
fn memory(dev: &Dev<'_>) -> (u64, u64) {
    match dev {
        Dev::Gpu(g) => (g.usage.memory_total, g.usage.memory_used),
        Dev::Mig(_, _, m) => (m.memory_total, m.memory_used),
    }
}

/// # Safety
/// `utilization` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    usage_call(device, "utilization", |dev| match dev {
        // NVML has no utilization on a MIG device nor on a GPU in MIG mode.
        Dev::Mig(..) => rc::NOT_SUPPORTED,
        Dev::Gpu(g) if g.mig.as_ref().is_some_and(|m| m.enabled) => rc::NOT_SUPPORTED,
        Dev::Gpu(g) => {
            let u = g.usage.utilization;
            // SAFETY: the caller's pointer contract is ours.
            unsafe { put(utilization, nvmlUtilization_t { gpu: u.gpu, memory: u.memory }) }
        }
    })
}

/// # Safety
/// `memory` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    usage_call(device, "memory", |dev| {
        let (total, used) = self::memory(dev);
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(memory, nvmlMemory_t { total, free: total.saturating_sub(used), used }) }
    })
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
fn memory_v2_version() -> u32 {
    u32::try_from(size_of::<nvmlMemory_v2_t>()).unwrap_or(u32::MAX) | (2 << 24)
}

/// # Safety
/// `memory` is NULL or valid for reads and writes of a `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    usage_call(device, "memory", |dev| {
        if memory.is_null() {
            return rc::INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL and valid for reads, per the contract.
        let version = unsafe { (*memory).version };
        if version != memory_v2_version() {
            return ARGUMENT_VERSION_MISMATCH;
        }
        let (total, used) = self::memory(dev);
        let info = nvmlMemory_v2_t { version, total, reserved: 0, free: total.saturating_sub(used), used };
        // SAFETY: the caller's pointer contract is ours.
        unsafe { put(memory, info) }
    })
}

/// # Safety
/// `power` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> nvmlReturn_t {
    usage_call(device, "power", |dev| match dev {
        Dev::Mig(..) => rc::NOT_SUPPORTED,
        // SAFETY: the caller's pointer contract is ours.
        Dev::Gpu(g) => unsafe { put(power, g.usage.power_usage_mw) },
    })
}

/// The GPU's energy counter: millijoules since the driver was loaded
/// (`total_energy_mj`; absent: `NOT_SUPPORTED`, as before Volta). NVML
/// documents it "for this GPU": a MIG device has none of its own
/// (`NOT_SUPPORTED`), while its parent GPU's handle answers the whole GPU's
/// counter in MIG mode too, as power does.
///
/// # Safety
/// `energy` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    usage_call(device, "energy", |dev| match dev {
        Dev::Mig(..) => rc::NOT_SUPPORTED,
        Dev::Gpu(g) => match g.usage.total_energy_mj {
            // SAFETY: the caller's pointer contract is ours.
            Some(mj) => unsafe { put(energy, mj) },
            None => rc::NOT_SUPPORTED,
        },
    })
}

/// `NVML_CLOCK_GRAPHICS` and `NVML_CLOCK_SM` answer `sm_clock_mhz` (the two
/// are one clock on data-center GPUs); `MEM` and `VIDEO` are not supported.
///
/// # Safety
/// `clock` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    usage_call(device, "clock", |dev| match (dev, clock_type) {
        (_, 4..) => rc::INVALID_ARGUMENT,
        (Dev::Mig(..), _) | (_, 2 | 3) => rc::NOT_SUPPORTED,
        // SAFETY: the caller's pointer contract is ours.
        (Dev::Gpu(g), _) => unsafe { put(clock, g.usage.sm_clock_mhz) },
    })
}

/// A process as `nvmlProcessInfo_t` on `dev`'s handle.
fn process_info(dev: &Dev<'_>, p: &Process) -> nvmlProcessInfo_v2_t {
    let (gi, ci) = match dev {
        Dev::Gpu(_) => (NO_INSTANCE, NO_INSTANCE),
        Dev::Mig(_, index, _) => (*index, 0),
    };
    nvmlProcessInfo_v2_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory.unwrap_or(NOT_AVAILABLE),
        gpuInstanceId: p.gpu_instance_id.unwrap_or(gi),
        computeInstanceId: p.compute_instance_id.unwrap_or(ci),
    }
}

/// NVML's two-call protocol: `*count` below the number of processes (0 with
/// NULL `infos` included) answers `INSUFFICIENT_SIZE` and the number needed;
/// otherwise the processes are written and `*count` set to their number.
///
/// # Safety
/// `count` is NULL or valid for reads and writes; `infos` is NULL or valid for
/// `*count` writes.
unsafe fn running_processes(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    usage_call(device, "processes", |dev| {
        if count.is_null() {
            return rc::INVALID_ARGUMENT;
        }
        let processes = match dev {
            Dev::Gpu(g) => &g.usage.processes,
            Dev::Mig(_, _, m) => &m.processes,
        };
        let Ok(needed) = c_uint::try_from(processes.len()) else { return rc::UNKNOWN };
        // SAFETY: non-NULL and valid for reads and writes, per the contract.
        let room = unsafe { *count };
        if room < needed {
            // SAFETY: as above.
            unsafe { *count = needed };
            return rc::INSUFFICIENT_SIZE;
        }
        if needed > 0 && infos.is_null() {
            return rc::INVALID_ARGUMENT;
        }
        for (i, p) in processes.iter().enumerate() {
            // SAFETY: `infos` holds `room >= needed > i` entries, per the contract.
            unsafe { infos.add(i).write(process_info(dev, p)) };
        }
        // SAFETY: as above.
        unsafe { *count = needed };
        rc::SUCCESS
    })
}

/// What nvml-wrapper 0.13's `running_compute_processes` calls.
///
/// # Safety
/// As [`running_processes`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { running_processes(device, info_count, infos) }
}

/// The same struct as `_v3` (`running_compute_processes_v2`).
///
/// # Safety
/// As [`running_processes`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { running_processes(device, info_count, infos) }
}
