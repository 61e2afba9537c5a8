//! What the built `spank_gpu.so` links, read from the file itself: the crates
//! of the code slurmstepd and sbatch run (`task-plan`, `batch-lint`,
//! `slurm-formats`), and none of the code only the `spank-gpu` command runs
//! (`job-diagnosis`: why and autopsy) or only the agent runs (`gpu-health`),
//! no command-line parser (clap) and no XML parser (the hwloc XML walker is a
//! test oracle). Code linked from a crate of this workspace brings its source
//! paths along (panic locations, line tables): `lint/src/...` is there exactly
//! when `batch-lint`'s code is. `cargo test` does not build the cdylib:
//! `cargo build -p spank-gpu` first (`tests/run` does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

/// `target/<profile>/libspank_gpu.so`.
fn built_plugin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps").join("libspank_gpu.so")
}

fn has(bytes: &[u8], word: &str) -> bool {
    bytes.windows(word.len()).any(|w| w == word.as_bytes())
}

#[test]
fn the_plugin_links_only_what_slurm_processes_run() {
    let path = built_plugin();
    let so = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (cargo test does not build the cdylib: cargo build -p spank-gpu)", path.display())
    });
    for linked in ["plan/src/", "lint/src/", "formats/src/", "spank-plugin/src/"] {
        assert!(
            has(&so, linked),
            "{} has no code from {linked} (stripped? build it with debug info)",
            path.display()
        );
    }
    for absent in [
        "diagnosis/src/",
        "health/src/",
        "clap_builder",
        "clap_lex",
        "roxmltree",
        "from_hwloc_xml",
        "topology.xml",
    ] {
        assert!(!has(&so, absent), "{} contains {absent}", path.display());
    }
}
