//! The NVML calls that nvml-wrapper 0.13 does not wrap (the GPU fabric state, the
//! GPU's own maximum PCIe generation), behind safe functions
//! (feature `nvml`, used by `gpu-node-agent`, which forbids `unsafe`).
//!
//! Each call goes through the library nvml-wrapper loaded (`Nvml::lib`), so a
//! test's fake `libnvidia-ml.so` answers it as it answers every other call.
//! A driver that lacks the symbol gives [`NvmlError::FailedToLoadSymbol`].

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
    nvmlReturn_enum_NVML_SUCCESS,
};

/// A GPU's NVSwitch fabric registration, as `nvmlDeviceGetGpuFabricInfo[V]` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFabricInfo {
    /// `NVML_GPU_FABRIC_STATE_*`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// The registration's outcome, an `nvmlReturn_t` (0: success); meaningful once completed.
    pub status: u32,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` bits, from the versioned call only.
    pub health_mask: Option<u32>,
}

impl GpuFabricInfo {
    /// Registration completed with an error status.
    pub fn failed(&self) -> bool {
        self.state == 3 && self.status != nvmlReturn_enum_NVML_SUCCESS
    }
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

/// The versioned call did not take this struct: try an older one.
fn retry(rc: u32) -> bool {
    rc == nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        || rc == nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND
}

/// The GPU's fabric registration: `nvmlDeviceGetGpuFabricInfoV` with the newest
/// struct the driver accepts (v3, then v2 of NVML 12.4), else, where the driver
/// lacks the versioned call, the unversioned one of older drivers. Outside an
/// NVSwitch system: `NotSupported`, or state 0 (not supported).
pub fn gpu_fabric_info(device: &Device<'_>) -> Result<GpuFabricInfo, NvmlError> {
    let lib = device.nvml().lib();
    // SAFETY: `Device::handle` is unsafe only because the handle must not outlive
    // its `Nvml`; it is used here, while `device` borrows that `Nvml`.
    let handle = unsafe { device.handle() };
    if let Ok(sym) = nvml_sym(lib.nvmlDeviceGetGpuFabricInfoV.as_ref()) {
        // v3 is v2 with `healthSummary` appended; ask for v3 first.
        // SAFETY: the struct is plain data (integers and a byte array); all-zero is valid.
        let mut v3: nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
        v3.version = version_word::<nvmlGpuFabricInfo_v3_t>(3);
        // SAFETY: `handle` is a live device handle of the library `sym` comes from;
        // `v3` is a writable struct of the size and version its `version` word names.
        let rc = unsafe { sym(handle, &raw mut v3) };
        if !retry(rc) {
            nvml_try(rc)?;
            return Ok(GpuFabricInfo {
                state: v3.state,
                status: v3.status,
                health_mask: Some(v3.healthMask),
            });
        }
        // SAFETY: as above.
        let mut v2: nvmlGpuFabricInfo_v2_t = unsafe { std::mem::zeroed() };
        v2.version = version_word::<nvmlGpuFabricInfo_v2_t>(2);
        // SAFETY: as above, for a v2 struct: the driver reads `version` before it
        // writes, and writes only the struct that version names.
        let rc = unsafe { sym(handle, (&raw mut v2).cast::<nvmlGpuFabricInfo_v3_t>()) };
        if !retry(rc) {
            nvml_try(rc)?;
            return Ok(GpuFabricInfo {
                state: v2.state,
                status: v2.status,
                health_mask: Some(v2.healthMask),
            });
        }
    }
    let sym = nvml_sym(lib.nvmlDeviceGetGpuFabricInfo.as_ref())?;
    // SAFETY: plain data, all-zero is valid.
    let mut v1: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live handle of this library and a writable struct of the type the call takes.
    nvml_try(unsafe { sym(handle, &raw mut v1) })?;
    Ok(GpuFabricInfo { state: v1.state, status: v1.status, health_mask: None })
}
