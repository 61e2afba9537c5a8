//! Generates bindings to the Slurm headers installed on the build machine.
//!
//! The headers come from `$SLURM_INCLUDE_DIR` when it is set, else from the
//! compiler's system include path. The plugin built from these bindings
//! announces that Slurm's `SLURM_VERSION_NUMBER` and so loads only into the
//! same Slurm major.minor: rebuild per Slurm release.

use std::env;
use std::path::{Path, PathBuf};

const HEADER: &str = "slurm/spank.h";
const SYSTEM_DIRS: &[&str] = &["/usr/include", "/usr/local/include"];

fn main() {
    println!("cargo::rerun-if-changed=wrapper.h");
    println!("cargo::rerun-if-env-changed=SLURM_INCLUDE_DIR");

    let include_dir = env::var_os("SLURM_INCLUDE_DIR").map(PathBuf::from);
    let found = match &include_dir {
        Some(dir) => dir.join(HEADER).is_file().then(|| dir.clone()),
        None => SYSTEM_DIRS.iter().map(Path::new).find(|d| d.join(HEADER).is_file()).map(Path::to_path_buf),
    };
    let Some(dir) = found else {
        let place = match &include_dir {
            Some(dir) => format!("in SLURM_INCLUDE_DIR={}", dir.display()),
            None => format!("in {}", SYSTEM_DIRS.join(" or ")),
        };
        println!(
            "cargo::error=Slurm headers not found ({HEADER} {place}): install libslurm-dev \
             (Debian/Ubuntu) or slurm-devel (RPM), or set SLURM_INCLUDE_DIR to the directory holding slurm/"
        );
        return;
    };
    println!("cargo::rerun-if-changed={}", dir.join("slurm").display());

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{}", dir.display()))
        .allowlist_function("spank_.*")
        .allowlist_function("slurm_(info|error)")
        .allowlist_type("spank_.*")
        .allowlist_var("ESPANK_.*|SLURM_SUCCESS|SLURM_ERROR|SLURM_VERSION_NUMBER|SPANK_OPTION_MAXLEN")
        .allowlist_var("S_CTX_.*|S_JOB_.*|S_TASK_.*|S_SLURM_.*|S_STEP_.*")
        // C enums stay integer constants: a value from a newer Slurm must never
        // become an invalid Rust enum.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate();
    let bindings = match bindings {
        Ok(b) => b,
        Err(e) => {
            println!("cargo::error=bindgen failed on the Slurm headers in {}: {e}", dir.display());
            return;
        }
    };
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        println!("cargo::error=cannot write {}: {e}", out.display());
    }
}
