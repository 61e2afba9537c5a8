//! The `gpu-node-agent` binary from the outside: `scan-log` on real kernel-log
//! samples, and a bad configuration.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");
const SAMPLES: &str = include_str!("../../core/tests/fixtures/xid-log-samples.jsonl");

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
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("line 4") && err.contains("remap_pending") && err.contains("explode"), "{err}");

    std::fs::write(&cfg, "poll_intervall = \"3s\"\n").unwrap();
    let out = Command::new(AGENT).args(["--config", cfg.to_str().unwrap(), "run"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("poll_intervall") && err.contains("line 1"), "{err}");

    let out = Command::new(AGENT).args(["--config", "/nonexistent/config.toml", "check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "an explicit config that is missing is an error");
    std::fs::remove_dir_all(&dir).unwrap();
}
