//! The `gpu-node-agent` binary from the outside: `scan-log` on real kernel-log
//! samples, a bad configuration (exit 4), and its command line: `--help` and
//! `--version` on stdout with exit 0, a typo or a stray word refused with exit
//! 2 and a line naming it, JSON for a usage error under `--json`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");
const SAMPLES: &str = include_str!("../../health/tests/fixtures/xid-log-samples.jsonl");

/// The value of `"key": ...` in one flat JSON object line, as text.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = line.get(start..)?.trim_start();
    let end = if rest.starts_with('"') {
        rest.get(1..)?.find('"').map(|i| i + 2)?
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    rest.get(..end)
}

#[test]
fn scan_log_finds_every_xid_in_the_samples() {
    // The raw lines, and what each should give.
    let mut raw = String::new();
    let mut expected = Vec::new();
    for line in SAMPLES.lines() {
        let r = field(line, "raw").unwrap();
        let r: String = serde_json::from_str(r).unwrap();
        raw.push_str(&r);
        raw.push('\n');
        let expect = line.split("\"expect\":").nth(1).unwrap();
        let xid = field(expect, "xid").unwrap();
        if xid != "null" {
            let pci: String = serde_json::from_str(field(expect, "pci").unwrap()).unwrap();
            expected.push((xid.parse::<u32>().unwrap(), pci));
        }
    }
    let mut child = Command::new(AGENT)
        .args(["--config", "/dev/null", "scan-log", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(raw.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let got: Vec<(u32, String)> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(v["action"].is_string() && v["message"].is_string(), "{l}");
            (u32::try_from(v["xid"].as_u64().unwrap()).unwrap(), v["pci"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(got, expected);
    assert!(expected.len() >= 15, "the samples hold at least 15 Xids");
    assert!(text.contains("\"xid\":79") && text.contains("\"action\":\"drain\""));
    assert!(text.contains("\"xid\":31") && text.contains("\"action\":\"ignore\""));
}

#[test]
fn a_bad_config_stops_it_with_the_key_and_line() {
    let dir = std::env::temp_dir().join(format!("agent-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, "dry_run = true\n\n[policy]\nremap_pending = \"explode\"\n").unwrap();
    let out = Command::new(AGENT).args(["--config", cfg.to_str().unwrap(), "check"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "bad configuration: {err}");
    assert!(err.contains("line 4") && err.contains("remap_pending") && err.contains("explode"), "{err}");

    std::fs::write(&cfg, "poll_intervall = \"3s\"\n").unwrap();
    let out = Command::new(AGENT).args(["--config", cfg.to_str().unwrap(), "run"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "bad configuration: {err}");
    assert!(err.contains("poll_intervall") && err.contains("line 1"), "{err}");

    let out = Command::new(AGENT).args(["--config", "/nonexistent/config.toml", "check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "an explicit config that is missing is a bad configuration");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `gpu-node-agent ARGS` with a configuration that is never read (a usage
/// error or `--help` comes first): (exit code, stdout, stderr).
fn agent(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(AGENT).args(args).stdin(Stdio::null()).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// The commands `--help` lists.
fn commands() -> Vec<String> {
    let (_, help, _) = agent(&["--help"]);
    let list = help.split("Commands:\n").nth(1).unwrap().split("\n\n").next().unwrap();
    list.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

#[test]
fn help_and_version_go_to_stdout_and_exit_0() {
    let cmds = commands();
    assert_eq!(
        cmds,
        ["run", "check", "status", "clear", "scan-log", "epilog", "topology", "help"],
        "{cmds:?}"
    );
    let mut cases: Vec<Vec<String>> = vec![vec!["--help".into()], vec!["-h".into()], vec!["help".into()]];
    for c in cmds.iter().filter(|c| *c != "help") {
        cases.push(vec![c.clone(), "--help".into()]);
        cases.push(vec![c.clone(), "-h".into()]);
        cases.push(vec!["help".into(), c.clone()]);
        cases.push(vec!["--config".into(), "/nonexistent/config.toml".into(), c.clone(), "--help".into()]);
    }
    for args in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = agent(&args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(out.contains("Usage: gpu-node-agent") && err.is_empty(), "{args:?}: {out}{err}");
    }
    let (_, check, _) = agent(&["check", "--help"]);
    assert!(check.contains("3 cannot tell") && check.contains("4 bad configuration"), "{check}");
    for v in ["--version", "-V"] {
        let (code, out, err) = agent(&[v]);
        assert_eq!(
            (code, out.as_str(), err.as_str()),
            (0, concat!("gpu-node-agent ", env!("CARGO_PKG_VERSION"), "\n"), "")
        );
    }
}

#[test]
fn a_typo_or_a_stray_word_is_a_usage_error_naming_it() {
    for (args, named) in [
        (&["check", "--actt"][..], "'--actt'"),
        (&["--config", "/dev/null", "check", "--actt"], "'--actt'"),
        (&["check", "--act", "now"], "'now'"),
        (&["status", "extra"], "'extra'"),
        (&["status", "--json"], "'--json'"),
        (&["run", "--daemon"], "'--daemon'"),
        (&["clear", "--gpu"], "'--gpu <N>'"),
        (&["clear", "--gpu", "x"], "needs a GPU number"),
        (&["scan-log", "a.log", "b.log"], "'b.log'"),
        (&["topology", "--xml"], "'--xml <FILE>'"),
        (&["topology", "--writ"], "'--writ'"),
        (&["chek"], "'chek'"),
        (&["--verbose", "check"], "'--verbose'"),
        (&["--config"], "'--config <FILE>'"),
    ] {
        let (code, out, err) = agent(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(first.starts_with("gpu-node-agent: ") && first.contains(named), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: stdout {out}");
    }
    // The tip names the option meant.
    let (_, _, err) = agent(&["check", "--actt"]);
    assert!(err.starts_with("gpu-node-agent: check: unexpected argument '--actt'"), "{err}");
    assert!(
        err.contains("'--act'") && err.contains("Usage: gpu-node-agent [--config FILE] check [--act]"),
        "{err}"
    );
    // No command: the help, on stderr, exit 2.
    let (code, out, err) = agent(&[]);
    assert!(code == 2 && out.is_empty() && err.contains("Usage: gpu-node-agent"), "{code} {out}{err}");
}

#[test]
fn a_usage_error_with_json_is_json_too() {
    let (code, out, err) = agent(&["topology", "--json", "--jsno"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.starts_with("gpu-node-agent: topology: unexpected argument '--jsno'"), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["error"].as_str().unwrap().contains("'--jsno'"), "{v}");
    assert!(v["usage"].as_str().unwrap().starts_with("gpu-node-agent [--config FILE] topology"), "{v}");
    assert!(v["tip"].as_str().unwrap().contains("'--json'"), "{v}");
    assert_eq!(v["exit"], 2);
    // Without --json, or for a command without it: text only.
    assert!(agent(&["topology", "--jsno"]).1.is_empty());
}

#[test]
fn config_is_global_before_or_after_the_command() {
    let line = "kernel: NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.\n";
    for args in [
        &["--config", "/dev/null", "scan-log", "-"][..],
        &["scan-log", "--config", "/dev/null", "-"],
        &["scan-log", "-", "--config=/dev/null"],
    ] {
        let mut child =
            Command::new(AGENT).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"xid\":79"), "{args:?}");
    }
    // scan-log of a file it cannot read: failed (1), not a usage error.
    let (code, _, err) = agent(&["--config", "/dev/null", "scan-log", "/nonexistent/kern.log"]);
    assert!(code == 1 && err.contains("/nonexistent/kern.log"), "{code} {err}");
}

/// The agent links the pure crates it runs (`task-plan` for the GPU table and
/// the plugstack line, `gpu-health`, `slurm-formats`) and none of the code only
/// the `spank-gpu` command and sbatch run (`batch-lint`, `job-diagnosis`):
/// code linked from a crate of this workspace brings its source paths along.
#[test]
fn the_agent_links_no_code_only_the_cli_runs() {
    let has = |bytes: &[u8], word: &str| bytes.windows(word.len()).any(|w| w == word.as_bytes());
    let bytes = std::fs::read(AGENT).unwrap();
    for linked in ["plan/src/", "health/src/", "formats/src/", "node-agent/src/"] {
        assert!(has(&bytes, linked), "{AGENT} has no code from {linked} (stripped?)");
    }
    for absent in ["lint/src/", "diagnosis/src/", "spank-plugin/src/"] {
        assert!(!has(&bytes, absent), "{AGENT} contains {absent}");
    }
}
