//! Generates bindings to the Slurm headers installed on the build machine.
//!
//! The headers come from `$SLURM_INCLUDE_DIR` when it is set, else from the
//! compiler's system include path. The plugin built from these bindings
//! announces that Slurm's `SLURM_VERSION_NUMBER` and so loads only into the
//! same Slurm major.minor: rebuild per Slurm release.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bindgen::callbacks::{EnumVariantValue, ParseCallbacks};

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
    let include = slurm_only(&dir);

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("spank_.*")
        .allowlist_function("slurm_(info|error|debug)")
        // srun's plugin asks where the step's tasks are (local_user_init): the
        // one libslurm call, resolved at load from the srun that loads it.
        .allowlist_function("slurm_job_step_layout_(get|free)")
        // ... and reads srun's own configuration (the `slurm_conf` global, found
        // with dlsym) to know whether it must ask: no RPC.
        .allowlist_type("slurm_conf_t")
        .allowlist_type("spank_.*")
        .allowlist_var("ESPANK_.*|SLURM_SUCCESS|SLURM_ERROR|SLURM_VERSION_NUMBER|SPANK_OPTION_MAXLEN|NO_VAL")
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
    // The release the headers are for, to the build scripts of the crates
    // that depend on this one (`DEP_SLURM_SPANK_VERSION_NUMBER`), for what
    // only some releases read (the plugin's `slurm_spank_init_failure_mode`).
    let text = bindings.to_string();
    let version = text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("pub const SLURM_VERSION_NUMBER: u32 = ")?;
        rest.strip_suffix(';')?.trim().parse::<u32>().ok()
    });
    match version {
        Some(v) => println!("cargo::metadata=version_number={v}"),
        None => println!("cargo::error=the Slurm headers in {} have no SLURM_VERSION_NUMBER", dir.display()),
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        println!("cargo::error=cannot write {}: {e}", out.display());
    }
    job_state_reasons(&dir, &include);
}

/// Collects the variants of one C enum as bindgen parses them.
#[derive(Debug)]
struct EnumVariants {
    enum_name: &'static str,
    found: Arc<Mutex<Vec<(String, i64)>>>,
}

impl ParseCallbacks for EnumVariants {
    fn enum_variant_name(
        &self,
        enum_name: Option<&str>,
        name: &str,
        value: EnumVariantValue,
    ) -> Option<String> {
        if enum_name.is_some_and(|e| e.trim_start_matches("enum ") == self.enum_name) {
            let value = match value {
                EnumVariantValue::Boolean(b) => i64::from(b),
                EnumVariantValue::Signed(v) => v,
                EnumVariantValue::Unsigned(v) => i64::try_from(v).unwrap_or(i64::MAX),
            };
            if let Ok(mut found) = self.found.lock() {
                found.push((name.to_owned(), value));
            }
        }
        None
    }
}

/// `reasons.rs`: every value of `enum job_state_reason` in the installed
/// `slurm/slurm.h`, by name, so a test can check that `spank-gpu why`
/// explains each one (a newer Slurm adds reasons).
/// An include directory holding only `slurm/` of `dir` (a link to it), so that
/// the C library's headers stay the build machine's: `SLURM_INCLUDE_DIR` may
/// be a whole `/usr/include` of another system (a release's Debian root with
/// libc6-dev), whose `stdint.h` would otherwise shadow the host's and pull
/// in `bits/` headers the host's glibc does not have.
fn slurm_only(dir: &Path) -> PathBuf {
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("slurm-include");
    let link = out.join("slurm");
    // Whatever an earlier run left there (a link, or a directory) goes first.
    let _ = std::fs::remove_file(&link).or_else(|_| std::fs::remove_dir_all(&link));
    match std::fs::create_dir_all(&out).and_then(|()| std::os::unix::fs::symlink(dir.join("slurm"), &link)) {
        Ok(()) => out,
        Err(e) => {
            println!(
                "cargo::warning=cannot link {} into {}: {e}; bindgen reads the whole {} (its C library headers too)",
                dir.join("slurm").display(),
                out.display(),
                dir.display()
            );
            dir.to_path_buf()
        }
    }
}

fn job_state_reasons(dir: &Path, include: &Path) {
    let found = Arc::new(Mutex::new(Vec::new()));
    let callbacks = EnumVariants { enum_name: "job_state_reason", found: Arc::clone(&found) };
    let parsed = bindgen::Builder::default()
        .header(dir.join("slurm/slurm.h").display().to_string())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("job_state_reason")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .parse_callbacks(Box::new(callbacks))
        .generate();
    if let Err(e) = parsed {
        println!("cargo::error=bindgen failed on slurm/slurm.h in {}: {e}", dir.display());
        return;
    }
    let found = found.lock().map(|f| f.clone()).unwrap_or_default();
    if found.is_empty() {
        println!("cargo::error=slurm/slurm.h in {} has no enum job_state_reason", dir.display());
        return;
    }
    let mut text = String::from(
        "/// Every value of `enum job_state_reason` in the installed `slurm/slurm.h`: (name, value).\n\
         pub const JOB_STATE_REASONS: &[(&str, i64)] = &[\n",
    );
    for (name, value) in &found {
        let _ = writeln!(text, "    ({name:?}, {value}),");
    }
    text.push_str("];\n");
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("reasons.rs");
    if let Err(e) = std::fs::write(&out, text) {
        println!("cargo::error=cannot write {}: {e}", out.display());
    }
}
