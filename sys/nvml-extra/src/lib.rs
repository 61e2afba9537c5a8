//! The NVML calls that nvml-wrapper 0.13 does not wrap (the GPU fabric state, the
//! GPU's own maximum PCIe generation), behind safe functions
//! (used by `gpu-node-agent`, which forbids `unsafe`). With `slurm-sys`, whose
//! neighbour it is, the only crates with `unsafe` besides the plugin's `ffi`.
//!
//! Each call goes through the library nvml-wrapper loaded (`Nvml::lib`), so a
//! test's fake `libnvidia-ml.so` answers it as it answers every other call.
//! A driver that lacks the symbol gives [`NvmlError::FailedToLoadSymbol`].

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfoV_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
};

/// A GPU's NVSwitch fabric registration, as `nvmlDeviceGetGpuFabricInfo[V]` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFabricInfo {
    /// `NVML_GPU_FABRIC_STATE_*`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// The registration's outcome, an `nvmlReturn_t` (0: success); meaningful once completed.
    pub status: u32,
}

/// The GPU's own maximum PCIe generation (`nvmlDeviceGetGpuMaxPcieLinkGeneration`),
/// not the lower of the GPU's and the slot's that nvml-wrapper's
/// `Device::max_pcie_link_gen` reads.
pub fn gpu_max_pcie_link_generation(device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuMaxPcieLinkGeneration.as_ref())?;
    let mut generation: std::ffi::c_uint = 0;
    // SAFETY: `Device::handle` is unsafe only because the handle must not outlive
    // its `Nvml`; `device` borrows that `Nvml` for this call. The out pointer is a
    // live, writable `unsigned int`, as the call takes.
    nvml_try(unsafe { sym(device.handle(), &raw mut generation) })?;
    Ok(generation)
}

/// `version` word of a versioned NVML struct: its size, and the version in the top byte.
fn version_word<T>(version: u32) -> u32 {
    // The fabric structs are a few dozen bytes; the size fits in 24 bits.
    u32::try_from(size_of::<T>()).unwrap_or(0) | (version << 24)
}

/// The GPU's fabric registration: `nvmlDeviceGetGpuFabricInfoV` with the v2
/// struct (NVML 12.4; later drivers still take it, beside their newer ones),
/// else, where the driver lacks the versioned call or that struct, the
/// unversioned call of older drivers. Outside an NVSwitch system:
/// `NotSupported`, or state 0 (not supported).
pub fn gpu_fabric_info(device: &Device<'_>) -> Result<GpuFabricInfo, NvmlError> {
    let lib = device.nvml().lib();
    // SAFETY: `Device::handle` is unsafe only because the handle must not outlive
    // its `Nvml`; it is used here, while `device` borrows that `Nvml`.
    let handle = unsafe { device.handle() };
    if let Ok(sym) = nvml_sym(lib.nvmlDeviceGetGpuFabricInfoV.as_ref()) {
        // SAFETY: the struct is plain data (integers and a byte array); all-zero is valid.
        let mut v2: nvmlGpuFabricInfo_v2_t = unsafe { std::mem::zeroed() };
        v2.version = version_word::<nvmlGpuFabricInfo_v2_t>(2);
        // SAFETY: `handle` is a live device handle of the library `sym` comes from.
        // The binding's pointer type names the newest struct, but the driver reads
        // `version` first and writes only the v2 struct it names, which `v2` is.
        let rc = unsafe { sym(handle, (&raw mut v2).cast::<nvmlGpuFabricInfoV_t>()) };
        if rc != nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            && rc != nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND
        {
            nvml_try(rc)?;
            return Ok(GpuFabricInfo { state: v2.state, status: v2.status });
        }
    }
    let sym = nvml_sym(lib.nvmlDeviceGetGpuFabricInfo.as_ref())?;
    // SAFETY: plain data, all-zero is valid.
    let mut v1: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live handle of this library and a writable struct of the type the call takes.
    nvml_try(unsafe { sym(handle, &raw mut v1) })?;
    Ok(GpuFabricInfo { state: v1.state, status: v1.status })
}
