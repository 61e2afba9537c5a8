//! Library lifecycle (`nvmlInit*`, `nvmlShutdown`), error strings and the system
//! queries (driver and NVML versions).

use std::ffi::{c_char, c_uint};
use std::path::PathBuf;

use nvml_wrapper_sys::bindings::nvmlReturn_t;

use super::{guard, lib, rc, write_str};
use crate::state::Loader;

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
