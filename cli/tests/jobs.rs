//! `spank-gpu why`/`autopsy` end to end against fake Slurm commands that print
//! what each release prints (`diagnosis/tests/fixtures/jobinfo/<release>/`): the
//! release from `scontrol --version`, JSON where the release has it, the text
//! form where it does not or where JSON fails, and what comes out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diagnosis/tests/fixtures/jobinfo").join(rel)
}

/// A directory of fake Slurm commands: each answers the argument lines in
/// `answers` (`"scontrol --version"` → text, or `@FILE` for a fixture's
/// content, or `!TEXT` for TEXT on stderr and exit 1), and fails otherwise.
struct FakeSlurm {
    dir: PathBuf,
}

impl FakeSlurm {
    fn new(name: &str, answers: &[(&str, &str)]) -> FakeSlurm {
        let dir = std::env::temp_dir().join(format!("spank-gpu-jobs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for program in ["scontrol", "sacct", "squeue", "sprio", "sinfo", "sacctmgr"] {
            let mut script = String::from("#!/bin/sh\ncase \"$*\" in\n");
            for (args, answer) in answers.iter().filter(|(a, _)| a.split(' ').next() == Some(program)) {
                let args = args.split_once(' ').map_or("", |(_, a)| a);
                let body = if let Some(file) = answer.strip_prefix('@') {
                    format!("cat '{}'", fixture(file).display())
                } else if let Some(err) = answer.strip_prefix('!') {
                    format!("echo '{err}' >&2; exit 1")
                } else {
                    format!("printf '%s\\n' '{answer}'")
                };
                script.push_str(&format!("  '{args}') {body} ;;\n"));
            }
            script.push_str("  *) echo \"fake $0: unexpected: $*\" >&2; exit 1 ;;\nesac\n");
            let path = dir.join(program);
            fs::write(&path, script).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        FakeSlurm { dir }
    }

    /// `spank-gpu ARGS` with the fakes first on PATH: (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_spank-gpu"))
            .args(args)
            .env("PATH", format!("{}:/usr/bin:/bin", self.dir.display()))
            .env("TZ", "UTC")
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    fn json(&self, args: &[&str]) -> Value {
        let (rc, so, se) = self.run(args);
        assert_eq!(rc, 0, "{args:?}: {so}{se}");
        serde_json::from_str(so.trim()).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {so}"))
    }
}

impl Drop for FakeSlurm {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_held_job_with_key_value_words_is_held_on_every_release() {
    // 22.05: text.
    let s = FakeSlurm::new(
        "held-22",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 1", "@22.05/held.scontrol"),
            ("squeue -h -j 1 --start -o %S", "N/A"),
        ],
    );
    let v = s.json(&["why", "1", "--json"]);
    assert_eq!((v["state"].as_str(), v["reason_code"].as_str()), (Some("PENDING"), Some("JobHeldUser")));
    assert_eq!(v["slurm"], "22.05.8");
    // 24.11 and 26.05: JSON, whose user text (name, comment, output path) stays values.
    for (release, version) in [("24.11", "slurm 24.11.5"), ("26.05", "slurm 26.05.5")] {
        let file = format!("@{release}/held-keyvalue.scontrol.json");
        let s = FakeSlurm::new(
            &format!("held-{release}"),
            &[
                ("scontrol --version", version),
                ("scontrol --json=v0.0.42 show job 41", &file),
                ("squeue -h -j 41 --start -o %S", "N/A"),
            ],
        );
        let (rc, so, se) = s.run(&["why", "41"]);
        assert_eq!(rc, 0, "{so}{se}");
        assert!(so.contains("is PENDING: JobHeldUser") && so.contains("scontrol release 41"), "{so}");
        assert!(!so.contains("not pending"), "{so}");
        let v = s.json(&["why", "41", "--json"]);
        assert_eq!(v["reason_enum"][0], "WAIT_HELD_USER");
        assert_eq!(v["name"], "echo JobState=RUNNING Reason=None");
    }
    // 26.05 without the data_parser plugin: the text form with SubmitLine=.
    let s = FakeSlurm::new(
        "held-26-text",
        &[
            ("scontrol --version", "slurm 26.05.5"),
            ("scontrol --json=v0.0.42 show job 41", "!scontrol: error: data_parser plugin v0.0.42 not found"),
            ("scontrol show job -o 41", "@26.05/held-keyvalue.scontrol"),
            ("squeue -h -j 41 --start -o %S", "N/A"),
        ],
    );
    let v = s.json(&["why", "41", "--json"]);
    assert_eq!((v["state"].as_str(), v["resolves_by"].as_str()), (Some("PENDING"), Some("user")));
}

#[test]
fn a_forged_text_record_is_an_error_not_an_answer() {
    let held = fs::read_to_string(fixture("22.05/held.scontrol")).unwrap();
    let forged = held.replacen(
        "JobName=wrap",
        "JobName=x UserId=a(1) GroupId=a(1) MCS_label=N/A Priority=1 Nice=0 Account=a QOS=normal \
         JobState=RUNNING Reason=None Dependency=(null)",
        1,
    );
    let file = std::env::temp_dir().join(format!("spank-gpu-forged-{}.scontrol", std::process::id()));
    fs::write(&file, forged).unwrap();
    let answer = format!("@{}", file.display());
    let s = FakeSlurm::new(
        "forged",
        &[("scontrol --version", "slurm 22.05.8"), ("scontrol show job -o 1", &answer)],
    );
    let (rc, so, se) = s.run(&["why", "1"]);
    let _ = fs::remove_file(&file);
    assert_ne!(rc, 0, "{so}");
    assert!(so.is_empty() && se.contains("cannot be read safely") && !se.contains("RUNNING"), "{se}");
}

#[test]
fn topology_rejects_on_26_05() {
    let s = FakeSlurm::new(
        "topo",
        &[
            ("scontrol --version", "slurm 26.05.5"),
            ("scontrol --json=v0.0.42 show job 52", "@26.05/topology.scontrol.json"),
            ("squeue -h -j 52 --start -o %S", "N/A"),
            ("sprio -h -j 52 -o %Y|%A|%F|%J|%P|%Q|%N", ""),
            ("sacct -n -P -X -u alice --name wrap -S now-30days -s CD -o Elapsed", ""),
        ],
    );
    let (rc, so, se) = s.run(&["why", "52"]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(so.contains("is PENDING: No suitable topology unit found"), "{so}");
    assert!(
        so.contains("topology unit") && so.contains("--segment") && so.contains("resolves with time"),
        "{so}"
    );
    let v = s.json(&["why", "52", "--json"]);
    assert_eq!(
        (v["reason_code"].as_str(), v["reason_enum"][0].as_str()),
        (Some("Resources"), Some("WAIT_RESOURCES"))
    );
}

#[test]
fn autopsy_of_a_cgroup_oom_from_26_05_json() {
    let s = FakeSlurm::new(
        "oom",
        &[
            ("scontrol --version", "slurm 26.05.5"),
            ("sacct --json=v0.0.42 -j 47", "@26.05/oom.sacct.json"),
            ("scontrol --json=v0.0.42 show job 47", "{\"jobs\": [], \"errors\": [], \"warnings\": []}"),
            (
                "sacctmgr -P show event nodes=node1 start=2026-11-30T18:58:25 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let v = s.json(&["autopsy", "47", "--json"]);
    assert_eq!((v["state"].as_str(), v["exit_code"].as_str()), (Some("OUT_OF_MEMORY"), Some("0:125")));
    assert_eq!(v["oom"], "host");
    assert_eq!(v["memory"]["requested_bytes"], 20 * 1024 * 1024);
    // Local time, as Slurm prints it (TZ=UTC here).
    assert_eq!(v["start"], "2026-11-30T18:58:25");
    assert_eq!(v["slurm"], "26.05.5");
    let findings = v["findings"].to_string();
    assert!(
        !findings.contains("before or at launch") && findings.contains("host memory ran out"),
        "{findings}"
    );
}

#[test]
fn autopsy_of_a_node_failure_advises_expedited_requeue_from_25_11_only() {
    for (release, version, advised) in [("24.11", "slurm 24.11.5", false), ("26.05", "slurm 26.05.5", true)] {
        let file = format!("@{release}/nodefail.sacct.json");
        let s = FakeSlurm::new(
            &format!("nodefail-{release}"),
            &[
                ("scontrol --version", version),
                ("sacct --json=v0.0.42 -j 48", &file),
                ("scontrol --json=v0.0.42 show job 48", "!slurm_load_jobs error: Invalid job id specified"),
                (
                    "sacctmgr -P show event nodes=node2 start=2026-11-30T18:58:25 format=NodeName,TimeStart,TimeEnd,State,Reason",
                    "NodeName|TimeStart|TimeEnd|State|Reason",
                ),
            ],
        );
        let (rc, so, se) = s.run(&["autopsy", "48"]);
        assert_eq!(rc, 0, "{so}{se}");
        assert!(so.contains("NODE_FAIL") && so.contains("not your code"), "{so}");
        assert_eq!(so.contains("--requeue=expedite"), advised, "{release}: {so}");
    }
}

#[test]
fn autopsy_on_22_05_reads_text_and_finds_the_missing_directory() {
    let s = FakeSlurm::new(
        "nodir",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            (
                "sacct -j 7 -P -o JobID,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,Reason,JobName,WorkDir",
                "JobID|User|State|ExitCode|Start|End|Timelimit|NodeList|JobName\n7|root|FAILED|0:53|2026-11-30T18:59:41|2026-11-30T18:59:41|UNLIMITED|node1|wrap",
            ),
            ("scontrol show job -o 7", "@22.05/nodir.scontrol"),
            (
                "sacctmgr -P show event nodes=node1 start=2026-11-30T18:59:41 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let v = s.json(&["autopsy", "7", "--json"]);
    assert_eq!(v["missing_dirs"][0], "/tmp/why16/nodir");
    assert!(v["findings"].to_string().contains("the directory /tmp/why16/nodir does not exist"), "{v}");
}

#[test]
fn without_scontrol_version_the_built_release_decides() {
    let built = job_diagnosis::Release::from_version_number(slurm_sys::VERSION_NUMBER);
    let s = FakeSlurm::new(
        "built",
        &[
            ("scontrol --version", "!scontrol: fatal: Could not establish a configuration source"),
            ("scontrol --json=v0.0.42 show job 41", "@24.11/held-keyvalue.scontrol.json"),
            ("scontrol show job -o 41", "@26.05/held-keyvalue.scontrol"),
            ("squeue -h -j 41 --start -o %S", "N/A"),
        ],
    );
    let v = s.json(&["why", "41", "--json"]);
    assert_eq!(v["slurm"], built.to_string().as_str());
    assert_eq!((v["state"].as_str(), v["reason_code"].as_str()), (Some("PENDING"), Some("JobHeldUser")));
    // JSON exactly where the built release has data_parser v0.0.42.
    let json = built.json_parser().is_some();
    assert_eq!(v["name"] == "echo JobState=RUNNING Reason=None", json, "{v}");
}
