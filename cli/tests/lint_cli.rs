//! `spank-gpu lint` as a user runs it: exit statuses, bad input, `--json`,
//! and the cluster's answers from fake `scontrol`/`sinfo`/`sacctmgr`/`squeue`
//! that print recorded outputs (lint/tests/fixtures/lint/cluster/gpu) and log
//! each call, to check that each is asked at most once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../lint/tests/fixtures/lint")
}

struct Env {
    dir: PathBuf,
}

impl Env {
    /// A directory with fake Slurm commands answering as cluster `gpu`.
    fn new(name: &str) -> Env {
        let dir = std::env::temp_dir().join(format!("spank-gpu-lint-cli-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("bin")).unwrap();
        let c = fixtures().join("cluster/gpu");
        let log = dir.join("calls.log");
        let fake = |cmd: &str, body: &str| {
            let p = dir.join("bin").join(cmd);
            fs::write(&p, format!("#!/bin/sh\necho \"{cmd} $*\" >> {}\n{body}\n", log.display())).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        };
        let cat = |f: &str| format!("cat {}", c.join(f).display());
        fake(
            "scontrol",
            &format!(
                "case \"$1\" in --version) {} ;; show) {} ;; *) exit 1 ;; esac",
                cat("version.txt"),
                cat("config.txt")
            ),
        );
        fake("sinfo", &cat("sinfo.txt"));
        fake("sacctmgr", &cat("qos.txt"));
        fake("squeue", &cat("squeue.txt"));
        fake("sbatch", "echo 'Options provided by plugins:'; echo '      --site-opt[=x]   a site plugin'");
        Env { dir }
    }

    fn lint(&self, args: &[&str]) -> Output {
        let path =
            format!("{}:{}", self.dir.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        Command::new(env!("CARGO_BIN_EXE_spank-gpu"))
            .arg("lint")
            .args(args)
            .env("PATH", path)
            .env("USER", "u")
            .env_remove("SLURM_CONF")
            .current_dir(fixtures())
            .output()
            .unwrap()
    }

    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn file(&self, name: &str, bytes: &[u8]) -> String {
        let p = self.dir.join(name);
        fs::write(&p, bytes).unwrap();
        p.display().to_string()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn findings_exit_1_with_the_line_and_the_fix_and_ask_each_command_once() {
    let e = Env::new("findings");
    let o = e.lint(&["traps/10-kill-on-bad-exit.sh"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.starts_with("traps/10-kill-on-bad-exit.sh:5: srun spans 4 nodes without --kill-on-bad-exit=1"),
        "{out}"
    );
    assert!(out.contains("\n  fix: srun --kill-on-bad-exit=1 ...\n"), "{out}");
    assert!(out.contains("checked for Slurm 24.11.5 (scontrol --version)"), "{out}");
    let calls = e.calls();
    assert_eq!(
        calls,
        vec!["scontrol --version", "sinfo -h -a -e -o %P|%l|%L|%D|%c|%m|%G", "scontrol show config"],
        "{calls:?}"
    );
}

#[test]
fn the_guides_pattern_b_is_clean_and_exits_0() {
    let e = Env::new("clean");
    let o = e.lint(&["guide/pattern-b.sh"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert_eq!(
        out.lines().next(),
        Some("guide/pattern-b.sh: no trap found, checked for Slurm 24.11.5 (scontrol --version)")
    );
}

#[test]
fn qos_and_dependencies_are_asked_only_when_the_script_needs_them() {
    let e = Env::new("qos");
    let o = e.lint(&["traps/16-afterok.sh"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("afterok:1234 waits for job 1234 to succeed, but its QoS low can be preempted by high"),
        "{out}"
    );
    let calls = e.calls();
    assert!(
        calls.contains(&"sacctmgr -n -P show qos format=Name,Preempt,PreemptMode,GraceTime".to_owned()),
        "{calls:?}"
    );
    assert!(calls.contains(&"squeue -h -j 1234 -o %i|%q".to_owned()), "{calls:?}");
    for c in &calls {
        assert_eq!(calls.iter().filter(|x| *x == c).count(), 1, "{c} asked twice: {calls:?}");
    }
}

#[test]
fn sbatch_options_after_double_dash_and_the_environment() {
    let e = Env::new("args");
    let o = e.lint(&["--", "--array=0-9", "--output=same.out", "guide/pattern-b.sh"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.starts_with("guide/pattern-b.sh: sbatch's command line: --output=same.out names no %a"),
        "{out}"
    );
    let o = e.lint(&["--", "--time=10", "--mem=0", "--wrap=srun hostname"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.starts_with("--wrap: sbatch's command line: --mem=0 takes all"), "{out}");
    // A site plugin's option is looked up in sbatch --help before it is called unknown.
    let s = e.file(
        "site.sh",
        b"#!/bin/bash\n#SBATCH --site-opt=1\n#SBATCH --gpus-per-node=1\nsrun --kill-on-bad-exit=1 hostname\n",
    );
    let o = e.lint(&[&s]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
}

#[test]
fn json_follows_its_schema() {
    let e = Env::new("json");
    let o = e.lint(&["--json", "traps/03-signal-not-batch.sh"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], 1);
    assert_eq!(v["release"]["version"], "24.11.5");
    assert_eq!(v["release"]["from"], "scontrol --version");
    assert_eq!(v["cluster"]["asked"], true);
    assert_eq!(v["cluster"]["partitions"][0]["name"], "gpu-h100");
    assert_eq!(v["cluster"]["partitions"][0]["max_time_s"], 3 * 86400);
    assert_eq!(
        v["cluster"]["partitions"][0]["nodes"][0]["gres"][0],
        serde_json::json!({"name": "gpu", "type": "h100", "count": 8})
    );
    assert_eq!(v["cluster"]["config"]["kill_on_bad_exit"], false);
    assert_eq!(v["cluster"]["qos"], serde_json::Value::Null, "not needed, not asked");
    assert_eq!(v["exit"], 1);
    let f = &v["findings"][0];
    assert_eq!(f["trap"], 3);
    assert_eq!(f["id"], "signal-not-batch");
    assert_eq!(f["line"], 3);
    assert_eq!(f["source"], "line");
    assert_eq!(f["where"], "traps/03-signal-not-batch.sh:3");
    assert_eq!(f["fix"], "--signal=B:USR1@180");
    assert_eq!(f["strict"], false);
    assert!(v["not_checked"].as_array().unwrap().is_empty(), "{v}");
}

#[test]
fn no_cluster_gives_notes_not_guesses() {
    let e = Env::new("nocluster");
    let o = e.lint(&["--no-cluster", "--release", "22.05", "traps/10-kill-on-bad-exit.sh"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("checked for Slurm 22.05.0 (--release)"), "{out}");
    assert!(
        out.contains(
            "not checked (traps 8, 12, 13): the cluster's partitions are not known (not asked (--no-cluster))"
        ),
        "{out}"
    );
    assert!(e.calls().is_empty(), "{:?}", e.calls());
}

#[test]
fn bad_input_gets_one_clear_line() {
    let e = Env::new("bad");
    let big = {
        let mut b = b"#!/bin/bash\n#SBATCH --gpus-per-node=1\n".to_vec();
        while b.len() < 1 << 20 {
            b.extend_from_slice(
                b"srun --kill-on-bad-exit=1 python step.py --data \"$HOME/data\"   # one of many steps\n",
            );
        }
        b
    };
    let cases: Vec<(String, i32, &str)> = vec![
        (e.file("empty.sh", b""), 2, "the file is empty"),
        (
            e.file("binary.sh", &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0]),
            2,
            "not a script: a NUL byte at offset 7",
        ),
        (e.dir.join("missing.sh").display().to_string(), 2, "no such file"),
        (e.dir.display().to_string(), 2, "is a directory"),
        (e.file("spaces.sh", b"  \n\n\t\n"), 2, "only whitespace"),
    ];
    for (path, code, words) in &cases {
        let o = e.lint(&[path]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(*code), "{path}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{path}: {err}");
        assert!(err.starts_with("spank-gpu: ") && err.contains(words), "{path}: {err}");
    }
    let o = e.lint(&[&e.file("big.sh", &big)]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let garbage = e.file("garbage.sh", b"#!/bin/bash\n#SBATCH --nodes=two --\xff\xfe\n#SBATCH \"unclosed\n#SBATCH :::\n#SBATCH --gpus-per-node=1\nsrun hostname\n");
    let o = e.lint(&[&garbage]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains(":3: sbatch cannot read this #SBATCH line (Unmatched `\"`)"), "{out}");
    assert!(out.contains(":4: sbatch cannot read this #SBATCH line (Unexpected `:`)"), "{out}");
    assert!(err.is_empty(), "{err}");
    let o = e.lint(&["--bogus"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_fixture_path_is_readable() {
    assert!(Path::new(&fixtures()).join("guide/pattern-a.sh").is_file());
}
