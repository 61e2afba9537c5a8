//! The built plugin announces the release of the headers it was built
//! against, and `slurm_formats::elf` reads it from the file as Slurm's `dlsym`
//! would find it: the number `gpu-node-agent status` compares with the
//! node's `slurmd -V`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use slurm_formats::release::{Version, spank_loads};

/// `target/<profile>/libspank_gpu.so`, built beside this test.
fn built_plugin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    dir.join("libspank_gpu.so")
}

#[test]
fn the_built_plugin_announces_its_headers_release() {
    let path = built_plugin();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (cargo test does not link the cdylib: cargo build -p spank-gpu first, as tests/run does)", path.display())
    });
    let version =
        slurm_formats::elf::plugin_version(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(version, slurm_sys::VERSION_NUMBER, "{}", Version::from_number(version));
    assert!(spank_loads(version, slurm_sys::VERSION_NUMBER));
    let other = slurm_sys::VERSION_NUMBER ^ 0x0000_0100;
    let (built, into) = (Version::from_number(version), Version::from_number(other));
    assert!(!spank_loads(version, other), "a plugin of {built} loads into {into}");
    // The same file stripped as the packages ship it: `.dynsym` stays.
    let stripped = std::env::temp_dir().join(format!("spank_gpu-stripped-{}.so", std::process::id()));
    let status = std::process::Command::new("objcopy")
        .arg("--strip-all")
        .arg(&path)
        .arg(&stripped)
        .status()
        .unwrap_or_else(|e| panic!("cannot run objcopy (binutils, which tests/run installs): {e}"));
    assert!(status.success(), "objcopy --strip-all {}", path.display());
    let read = std::fs::read(&stripped).map(|b| slurm_formats::elf::plugin_version(&b));
    let _ = std::fs::remove_file(&stripped);
    assert_eq!(read.ok(), Some(Ok(slurm_sys::VERSION_NUMBER)));
}

#[allow(dead_code)]
#[path = "../src/exports.rs"]
mod exports;

/// What the built library exports (its defined dynamic symbols) is exactly
/// `src/exports.rs`'s list for the release it was built for: the list
/// docs/architecture.md is checked against, and the e2e case checks the
/// installed plugin with.
#[test]
fn the_built_plugin_exports_exactly_the_listed_symbols() {
    let path = built_plugin();
    assert!(path.is_file(), "{} missing (cargo build -p spank-gpu first, as tests/run does)", path.display());
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm (binutils, which tests/run installs): {e}"));
    assert!(out.status.success(), "nm -D {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().next()).collect();
    names.sort_unstable();
    let (major, minor) = exports::SINCE;
    let from = (slurm_sys::VERSION_NUMBER >> 8) >= ((major << 8) | minor);
    let want = exports::expected(from);
    assert_eq!(
        names,
        want,
        "{} (built for Slurm {}) vs src/exports.rs",
        path.display(),
        Version::from_number(slurm_sys::VERSION_NUMBER)
    );
}

#[test]
fn other_elf_files_are_told_apart() {
    // A program has dynamic symbols but no plugin_version.
    let exe = std::fs::read(std::env::current_exe().expect("the test's own path")).expect("readable");
    let e = slurm_formats::elf::plugin_version(&exe).unwrap_err();
    assert_eq!(e.kind, slurm_formats::elf::ElfErrorKind::NoSymbol, "{e}");
    let e = slurm_formats::elf::plugin_version(b"\x7fELF\x02\x01\x01").unwrap_err();
    assert_eq!(e.kind, slurm_formats::elf::ElfErrorKind::NotElf, "{e}");
}
