//! `spank-gpu`'s command line from the outside: `--help` and `--version` on
//! stdout with exit 0 for every command, a typo or a stray word refused with
//! exit 2 and a first line naming it, JSON for a usage error under `--json`,
//! `lint -` reading standard input; and no XML parser in it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

const SPANK_GPU: &str = env!("CARGO_BIN_EXE_spank-gpu");

/// `spank-gpu ARGS` with `stdin` on its standard input, asking no cluster
/// (an empty PATH): (exit code, stdout, stderr).
fn sg_in(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(SPANK_GPU)
        .args(args)
        .env("PATH", "/nonexistent")
        .env_remove("SLURM_CONF")
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn sg(args: &[&str]) -> (i32, String, String) {
    sg_in(args, b"")
}

/// The commands `--help` lists.
fn commands() -> Vec<String> {
    let (_, help, _) = sg(&["--help"]);
    let list = help.split("Commands:\n").nth(1).unwrap().split("\n\n").next().unwrap();
    list.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

#[test]
fn help_and_version_go_to_stdout_and_exit_0() {
    let cmds = commands();
    assert_eq!(cmds, ["explain", "why", "autopsy", "usage", "lint", "help"], "{cmds:?}");
    let mut cases: Vec<Vec<String>> = vec![vec!["--help".into()], vec!["-h".into()], vec!["help".into()]];
    for c in cmds.iter().filter(|c| *c != "help") {
        cases.push(vec![c.clone(), "--help".into()]);
        cases.push(vec![c.clone(), "-h".into()]);
        cases.push(vec!["help".into(), c.clone()]);
    }
    // --help wins over the rest of the line.
    cases.push(vec!["lint".into(), "job.sh".into(), "--no-cluster".into(), "--help".into()]);
    for args in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = sg(&args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(out.contains("Usage: spank-gpu") && err.is_empty(), "{args:?}: {out}{err}");
    }
    // What packaging/test-install.sh looks for.
    assert!(sg(&["--help"]).1.contains("spank-gpu explain"));
    let (_, lint, _) = sg(&["lint", "--help"]);
    assert!(lint.contains("- reads it from standard input") && lint.contains("Exit status"), "{lint}");
    for v in ["--version", "-V"] {
        let (code, out, err) = sg(&[v]);
        assert_eq!(
            (code, out.as_str(), err.as_str()),
            (0, concat!("spank-gpu ", env!("CARGO_PKG_VERSION"), "\n"), "")
        );
    }
}

#[test]
fn a_typo_or_a_stray_word_is_a_usage_error_naming_it() {
    for (args, named) in [
        (&["lint", "--jsno", "x"][..], "'--jsno'"),
        (&["lint", "x", "--no-clustr"], "'--no-clustr'"),
        (&["lint", "a.sh", "b.sh"], "'b.sh'"),
        (&["lint", "a.sh", "--", "--time=5", "b.sh"], "'a.sh' before --"),
        (&["lint", "--", "--time=5"], "no script after the sbatch options"),
        (&["lint"], "<SCRIPT>"),
        (&["lint", "--release", "x", "a.sh"], "'x' for '--release <X.Y>'"),
        (&["why", "1", "2"], "'2'"),
        (&["why", "1", "--jsn"], "'--jsn'"),
        (&["why"], "the following required arguments were not provided"),
        (&["autopsy", "1", "2"], "'2'"),
        (&["autopsy", "1", "--log"], "'--log <FILE>'"),
        (&["usage"], "the following required arguments were not provided"),
        (&["usage", "1", "--jsno"], "'--jsno'"),
        (&["explain", "extra"], "'extra'"),
        (&["explain", "--env"], "'--env <FILE>'"),
        (&["explian"], "'explian'"),
        (&["--json"], "'--json'"),
    ] {
        let (code, out, err) = sg(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(first.starts_with("spank-gpu: ") && first.contains(named), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: stdout {out}");
    }
    let (_, _, err) = sg(&["lint", "--jsno", "x"]);
    assert!(err.starts_with("spank-gpu: lint: unexpected argument '--jsno'"), "{err}");
    assert!(err.contains("'--json'") && err.contains("Usage: spank-gpu lint"), "{err}");
    // No command: the help, on stderr, exit 2.
    let (code, out, err) = sg(&[]);
    assert!(code == 2 && out.is_empty() && err.contains("Usage: spank-gpu explain"), "{code} {out}{err}");
}

#[test]
fn a_usage_error_with_json_is_json_too() {
    for (args, named, usage) in [
        (&["lint", "--json", "--jsno", "x"][..], "'--jsno'", "spank-gpu lint "),
        (&["lint", "x", "--json", "--jsno"], "'--jsno'", "spank-gpu lint "),
        (&["lint", "--json", "--", "--time=5"], "no script after the sbatch options", "spank-gpu lint "),
        (&["why", "1", "2", "--json"], "'2'", "spank-gpu why JOBID"),
        (&["autopsy", "--json"], "<JOBID>", "spank-gpu autopsy JOBID"),
        (&["usage", "1", "2", "--json"], "'2'", "spank-gpu usage JOBID"),
        (&["explain", "--json", "--bogus"], "'--bogus'", "spank-gpu explain "),
    ] {
        let (code, out, err) = sg(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.starts_with("spank-gpu: "), "{args:?}: {err}");
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
        assert!(v["error"].as_str().unwrap().contains(named), "{args:?}: {v}");
        assert!(v["usage"].as_str().unwrap().starts_with(usage), "{args:?}: {v}");
        assert_eq!(v["exit"], 2, "{args:?}");
        assert!(v["tip"].is_null() || v["tip"].is_string(), "{args:?}: {v}");
    }
    // --json after -- is sbatch's, not lint's.
    let (code, out, _) = sg(&["lint", "--", "--json"]);
    assert!(code == 2 && out.is_empty(), "{code} {out}");
}

#[test]
fn lint_dash_reads_the_script_from_stdin() {
    let script = b"#!/bin/bash\n#SBATCH --output=%x/o.out\n#SBATCH --gpus-per-node=1\nsrun hostname\n";
    let (code, out, err) = sg_in(&["lint", "--no-cluster", "-"], script);
    if slurm_sys::VERSION_NUMBER < batch_lint::CREATES_OUTPUT_DIR_SINCE {
        assert_eq!(code, 1, "{out}{err}");
        // sbatch names a job read from its standard input "sbatch": %x is that.
        assert!(out.starts_with("<stdin>:2: --output=%x/o.out: "), "{out}");
        assert!(out.contains("/sbatch does not exist"), "{out}");
    } else {
        // From 23.02 slurmstepd creates the missing directory: no finding.
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.starts_with("<stdin>: no trap found"), "{out}");
    }
    // The same after --, with sbatch options; and as JSON.
    let (code, out, err) = sg_in(&["lint", "--json", "--no-cluster", "--", "--output=x.out", "-"], script);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["file"].as_str(), v["exit"].as_u64()), (Some("<stdin>"), Some(0)), "{v}");
    // Nothing on stdin: the script is empty.
    let (code, _, err) = sg_in(&["lint", "-"], b"");
    assert!(code == 2 && err.starts_with("spank-gpu: <stdin>: the file is empty"), "{code} {err}");
}

#[test]
fn explain_and_why_fail_with_1_not_the_usage_status() {
    let (code, _, err) = sg(&["explain", "--env", "/nonexistent/env"]);
    assert!(code == 1 && err.starts_with("spank-gpu: /nonexistent/env"), "{code} {err}");
    let (code, _, err) = sg(&["why", "12;rm"]);
    assert!(code == 1 && err.contains("is not a job id"), "{code} {err}");
    let (code, _, err) = sg(&["usage", "12;rm"]);
    assert!(code == 1 && err.contains("is not a job id"), "{code} {err}");
}

/// Issue 31: `spank-gpu explain` reads only the GPU table; no XML parser is
/// linked into it (the hwloc XML walker is a dev-dependency, a test oracle).
/// The plugin's own check is `spank-plugin/tests/contents.rs`.
#[test]
fn the_cli_contains_clap_and_no_xml_parser() {
    let has = |bytes: &[u8], word: &[u8]| bytes.windows(word.len()).any(|w| w == word);
    let bytes = std::fs::read(SPANK_GPU).unwrap();
    // The words are found where they are: the plugin's check for clap is sound.
    assert!(has(&bytes, b"clap_builder"));
    for word in [&b"roxmltree"[..], b"from_hwloc_xml", b"topology.xml"] {
        assert!(!has(&bytes, word), "{SPANK_GPU} contains {}", String::from_utf8_lossy(word));
    }
}
