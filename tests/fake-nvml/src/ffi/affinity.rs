//! CPU and memory affinity: the CPUs and the NUMA node local to each GPU.

use std::ffi::{c_uint, c_ulong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use super::{put, rc, with_gpu};

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
        let nodes: slurm_formats::cpuset::CpuSet = gpu.numa_node.into_iter().collect();
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
