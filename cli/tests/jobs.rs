//! `spank-gpu why`/`autopsy`/`usage` end to end against fake Slurm commands that print
//! what each release prints (`diagnosis/tests/fixtures/jobinfo/<release>/`): the
//! release from `scontrol --version`, JSON where the release has it, the text
//! form where it does not or where JSON fails, and what comes out. `usage` of a
//! running job reads through a fake `srun` that runs `cat` once per fake node, each
//! node's files under a directory of its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use job_diagnosis::usage::{FINDINGS, GpuUsage, NodeUsage};
use md_tables::{Doc, Named, assert_same, code_spans};
use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diagnosis/tests/fixtures/jobinfo").join(rel)
}

/// A directory of fake Slurm commands: each answers the argument lines in
/// `answers` (`"scontrol --version"` → text, or `@FILE` for a fixture's
/// content, or `!TEXT` for TEXT on stderr and exit 1, or `$COMMANDS` run as
/// they are), and fails otherwise.
struct FakeSlurm {
    dir: PathBuf,
    env: Vec<(String, String)>,
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
                } else if let Some(shell) = answer.strip_prefix('$') {
                    shell.to_owned()
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
        FakeSlurm { dir, env: Vec::new() }
    }

    /// A fake `srun` that logs its arguments (`srun.log`) and runs `cat`
    /// on each of `nodes` as it would run there: the last argument (the
    /// path) read under `nodes/NODE/`, each task's lines labelled as
    /// `--label` does (`0: `). `files`: (node, path, content).
    fn with_srun(self, nodes: &[&str], files: &[(&str, &str, &str)]) -> FakeSlurm {
        let root = self.dir.join("nodes");
        for n in nodes {
            fs::create_dir_all(root.join(n)).unwrap();
        }
        for (node, path, content) in files {
            let file = root.join(node).join(path.trim_start_matches('/'));
            fs::create_dir_all(file.parent().unwrap()).unwrap();
            fs::write(file, content).unwrap();
        }
        let script = format!(
            "#!/bin/sh\necho \"$*\" >> '{log}'\nfor a; do last=$a; done\nrc=0\ni=0\nfor node in {nodes}; do\n  \
             f=\"{root}/$node$last\"\n  \
             if [ -r \"$f\" ]; then sed \"s/^/$i: /\" \"$f\"; else echo \"$i: cat: $last: absent\" >&2; rc=1; fi\n  \
             i=$((i+1))\ndone\nexit $rc\n",
            log = self.dir.join("srun.log").display(),
            root = root.display(),
            nodes = nodes.join(" "),
        );
        let path = self.dir.join("srun");
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        self
    }

    fn srun_log(&self) -> String {
        fs::read_to_string(self.dir.join("srun.log")).unwrap_or_default()
    }

    /// `spank-gpu ARGS` with the fakes first on PATH: (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_spank-gpu"))
            .args(args)
            .env("PATH", format!("{}:/usr/bin:/bin", self.dir.display()))
            .env("TZ", "UTC")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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

// ----- usage ------------------------------------------------------------------------------

const MIB: u64 = 1 << 20;

/// A node's summary: GPUs 0..`gpus`, the first `busy` of them at `util` %.
fn word(node: &str, gpus: u32, busy: u32, util: f64) -> String {
    NodeUsage {
        node: node.into(),
        interval_s: 10,
        from: 1_796_000_000,
        to: 1_796_003_600,
        longest_idle_s: 0,
        gpus: (0..gpus)
            .map(|i| {
                let on = i < busy;
                GpuUsage {
                    gpu: i,
                    mig: None,
                    uuid: format!("GPU-0000000{i}-{node}"),
                    util_mean: Some(if on { util } else { 0.0 }),
                    util_max: Some(if on { 99 } else { 0 }),
                    mem_max_bytes: if on { 30_000 * MIB } else { 0 },
                    mem_total_bytes: 81_559 * MIB,
                    idle_samples: if on { 3 } else { 360 },
                    samples: 360,
                    procs_max: u32::from(on),
                    shared: false,
                    energy_j: None,
                }
            })
            .collect(),
    }
    .to_word()
}

/// 22.05's text record of a job on gpu01 and gpu02 with 8 GPUs, 1 CPU per task.
fn gpu_record(job: &str, state: &str, admin_comment: Option<&str>) -> PathBuf {
    let base = fs::read_to_string(fixture("22.05/oom.scontrol")).unwrap();
    let mut rec = base
        .replacen("JobId=8 ", &format!("JobId={job} "), 1)
        .replacen("JobState=FAILED Reason=JobLaunchFailure", &format!("JobState={state} Reason=None"), 1)
        .replacen("RunTime=00:00:01", "RunTime=01:00:00", 1)
        .replacen(
            "NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1",
            "NodeList=gpu[01-02] BatchHost=gpu01 NumNodes=2 NumCPUs=2 NumTasks=2",
            1,
        )
        .replacen("TRES=cpu=1,mem=20M,node=1,billing=1", "TRES=cpu=2,mem=20M,node=2,billing=2,gres/gpu=8", 1);
    if let Some(c) = admin_comment {
        rec =
            rec.replacen("WorkDir=/work/wt-why16 ", &format!("WorkDir=/work/wt-why16 AdminComment={c} "), 1);
    }
    let file = std::env::temp_dir().join(format!("spank-gpu-usage-{job}-{}.scontrol", std::process::id()));
    fs::write(&file, rec).unwrap();
    file
}

fn ids(v: &Value) -> Vec<String> {
    v["findings"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn usage_of_a_running_job_reads_each_node_through_srun() {
    let rec = gpu_record("5", "RUNNING", None);
    let answer = format!("@{}", rec.display());
    let s = FakeSlurm::new(
        "usage-live",
        &[("scontrol --version", "slurm 22.05.8"), ("scontrol show job -o 5", &answer)],
    )
    .with_srun(
        &["gpu01", "gpu02"],
        &[
            ("gpu01", "/run/spank-gpu/usage/5", &format!("{}\n", word("gpu01", 4, 2, 85.0))),
            ("gpu02", "/run/spank-gpu/usage/5", &format!("{}\n", word("gpu02", 4, 4, 85.0))),
        ],
    );
    let v = s.json(&["usage", "5", "--json"]);
    assert_eq!(
        (v["job"].as_str(), v["state"].as_str(), v["source"].as_str()),
        (Some("5"), Some("RUNNING"), Some("live"))
    );
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8, "{v}");
    let g = &v["gpus"][0];
    assert_eq!(
        (g["node"].as_str(), g["gpu"].as_u64(), g["mig"].is_null()),
        (Some("gpu01"), Some(0), true),
        "{g}"
    );
    assert_eq!(
        (g["util_mean"].as_f64(), g["util_max"].as_u64(), g["samples"].as_u64()),
        (Some(85.0), Some(99), Some(360))
    );
    assert_eq!(g["mem_max_bytes"], 30_000 * MIB);
    assert_eq!(g["uuid"], "GPU-00000000-gpu01");
    assert_eq!(ids(&v), ["never-used"], "{v}");
    assert!(
        v["findings"][0]["what"]
            .as_str()
            .unwrap()
            .starts_with("2 of 8 GPUs never used so far: your program uses 6"),
        "{v}"
    );
    // One task per node of the job, sharing the job's resources, each task's lines labelled.
    let log = s.srun_log();
    for arg in [
        "--jobid=5 ",
        "--nodes=2 ",
        "--ntasks=2 ",
        "--ntasks-per-node=1 ",
        "--overlap ",
        "--label ",
        " /bin/cat /run/spank-gpu/usage/5",
    ] {
        assert!(log.contains(arg), "{arg}: {log}");
    }
    // The text: the table, then the findings with their fixes.
    let (rc, so, se) = s.run(&["usage", "5"]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(so.starts_with("job 5 RUNNING, on gpu01,gpu02: GPU use (live, from its nodes)"), "{so}");
    assert!(so.contains("NODE   GPU  UTIL MEAN  UTIL MAX  MEMORY MAX (GiB)"), "{so}");
    assert!(
        so.contains("gpu02  3    85.0 %     99 %      29.3 of 79.6") && so.contains("fix: the processes"),
        "{so}"
    );
    let _ = fs::remove_file(rec);
}

#[test]
fn usage_names_a_node_without_a_live_file() {
    let rec = gpu_record("6", "RUNNING", None);
    let answer = format!("@{}", rec.display());
    let s = FakeSlurm::new(
        "usage-missing",
        &[("scontrol --version", "slurm 22.05.8"), ("scontrol show job -o 6", &answer)],
    )
    .with_srun(&["gpu01", "gpu02"], &[("gpu01", "/run/spank-gpu/usage/6", &word("gpu01", 4, 4, 90.0))]);
    let v = s.json(&["usage", "6", "--json"]);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(v["unread"][0]["node"], "gpu02");
    assert!(v["unread"][0]["why"].as_str().unwrap().contains("no live file"), "{v}");
    assert_eq!(ids(&v), ["not-sampled"], "{v}");
    // The default directory, without the override.
    assert!(s.srun_log().contains("/bin/cat /run/spank-gpu/usage/6"), "{}", s.srun_log());
    let (rc, so, _) = s.run(&["usage", "6"]);
    assert_eq!(rc, 0);
    assert!(
        so.contains("gpu02  -    (no summary)") && so.contains("no summary from gpu02: no live file"),
        "{so}"
    );
    // No node has one: nothing recorded, and why.
    let none = FakeSlurm::new(
        "usage-none-live",
        &[("scontrol --version", "slurm 22.05.8"), ("scontrol show job -o 6", &answer)],
    )
    .with_srun(&["gpu01", "gpu02"], &[]);
    let v = none.json(&["usage", "6", "--json"]);
    assert_eq!(
        (ids(&v), v["gpus"].as_array().map(Vec::len)),
        (vec!["not-recorded".to_owned()], Some(0)),
        "{v}"
    );
    assert!(
        v["findings"][0]["what"].as_str().unwrap().contains("none of the job's nodes has a live file"),
        "{v}"
    );
    let _ = fs::remove_file(rec);
}

/// The fake `sacct` line for an ended job's comments (`gpu_use::ended_query`):
/// whatever delimiter the call gives, each `@T@` in `rows` printed as it.
fn comments_sacct(job: &str, rows: &str) -> (String, String) {
    (
        format!(
            "sacct -j {job} -X -n -P --delimiter='*' -o JobIDRaw,JobID,SystemComment,JobIDRaw,AdminComment,JobIDRaw"
        ),
        format!(
            "$for a; do case \"$a\" in --delimiter=*) T=${{a#--delimiter=}} ;; esac; done; printf '%s\\n' '{rows}' | sed \"s/@T@/$T/g\""
        ),
    )
}

/// Where the site's AdminComment would not come back unchanged through
/// sacctmgr (upper case on 22.05), the agents write the SystemComment:
/// `usage` reads both, says where the summaries were, and leaves the site's
/// text alone; with none anywhere, it says where else to look.
#[test]
fn usage_of_an_ended_job_says_where_its_summaries_were() {
    let (w1, w2) = (word("gpu01", 2, 2, 80.0), word("gpu02", 2, 2, 80.0));
    // The task's raw id is its own (65); sacct frames each comment with it.
    let (fields, rows) =
        comments_sacct("62_3", &format!("65@T@62_3@T@{w1} {w2}@T@65@T@JS1:Site \"q\"|65|\nsecond line@T@65"));
    let record = "!slurm_load_jobs error: Invalid job id specified";
    let sacct = "sacct -j 62_3 -P -o JobID,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,Reason,JobName,WorkDir";
    let row = "JobID|User|State|ExitCode|DerivedExitCode|Start|End|Elapsed|Timelimit|NodeList|ReqMem|MaxRSS|Reason|JobName|WorkDir\n62_3|alice|COMPLETED|0:0|0:0|2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00|02:00:00|gpu[01-02]|20M||None|train|/home/alice";
    let tres = (
        "sacct -j 62_3 -X --parsable2 --noheader -o JobID,AllocTRES",
        "62_3|cpu=2,mem=20M,node=2,billing=2,gres/gpu=4",
    );
    let s = FakeSlurm::new(
        "usage-system-comment",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 62_3", record),
            (sacct, row),
            (&fields, &rows),
            tres,
        ],
    );
    let v = s.json(&["usage", "62_3", "--json"]);
    assert_eq!(v["kept_in"], serde_json::json!(["SystemComment"]), "{v}");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 4, "{v}");
    let (rc, so, se) = s.run(&["usage", "62_3"]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(so.lines().next().unwrap().ends_with("GPU use (from its SystemComment)"), "{so}");
    // No summary anywhere: the not-recorded finding says the agents' logs have it.
    let (_, empty) = comments_sacct("62_3", "65@T@62_3@T@@T@65@T@JS1:Site@T@65");
    let s = FakeSlurm::new(
        "usage-no-summary",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 62_3", record),
            (sacct, row),
            (&fields, &empty),
            tres,
        ],
    );
    let v = s.json(&["usage", "62_3", "--json"]);
    assert_eq!(ids(&v), ["not-recorded"], "{v}");
    assert!(v["findings"][0]["fix"].as_str().unwrap().contains("journalctl -u gpu-node-agent"), "{v}");
    assert!(
        v["findings"][0]["what"]
            .as_str()
            .unwrap()
            .contains("no summary in job 62_3's AdminComment or SystemComment"),
        "{v}"
    );
}

#[test]
fn usage_and_autopsy_of_an_ended_job_read_its_admin_comment() {
    // Slurm forgot the job: accounting's text (22.05), the AdminComment with two
    // nodes' words among the site's own (a | in it too).
    let comment =
        format!("JS1:site|words {} {} JS1:more", word("gpu01", 4, 2, 20.0), word("gpu02", 4, 4, 20.0));
    let (fields, rows) = comments_sacct("61", &format!("61@T@61@T@@T@61@T@{comment}@T@61"));
    let s = FakeSlurm::new(
        "usage-ended",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 61", "!slurm_load_jobs error: Invalid job id specified"),
            (
                "sacct -j 61 -P -o JobID,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,Reason,JobName,WorkDir",
                "JobID|User|State|ExitCode|DerivedExitCode|Start|End|Elapsed|Timelimit|NodeList|ReqMem|MaxRSS|Reason|JobName|WorkDir\n61|alice|COMPLETED|0:0|0:0|2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00|02:00:00|gpu[01-02]|20M||None|train|/home/alice",
            ),
            (&fields, &rows),
            (
                "sacct -j 61 -X --parsable2 --noheader -o JobID,AllocTRES",
                "61|cpu=2,mem=20M,node=2,billing=2,gres/gpu=8",
            ),
            (
                "sacctmgr -P show event nodes=gpu01,gpu02 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let v = s.json(&["usage", "61", "--json"]);
    assert_eq!(
        (v["state"].as_str(), v["source"].as_str()),
        (Some("COMPLETED"), Some("admin_comment")),
        "{v}"
    );
    assert_eq!(v["kept_in"], serde_json::json!(["AdminComment"]), "{v}");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8, "{v}");
    assert_eq!(ids(&v), ["never-used", "low-util"], "{v}");
    assert!(
        v["findings"][0]["what"].as_str().unwrap().starts_with("2 of 8 GPUs never used: your program uses 6"),
        "{v}"
    );
    // sacct does not know CPUs per task: the general causes.
    assert!(v["findings"][1]["fix"].as_str().unwrap().contains("--cpus-per-task"), "{v}");
    // autopsy: the same rows, and the findings as lines.
    let a = s.json(&["autopsy", "61", "--json"]);
    assert_eq!(a["gpus"], v["gpus"]);
    let findings = a["findings"].to_string();
    assert!(
        findings.contains("2 of 8 GPUs never used") && findings.contains("low GPU utilization"),
        "{findings}"
    );
    let (rc, so, se) = s.run(&["autopsy", "61"]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(so.contains("  GPU use (the agents' summaries in the job's AdminComment):\n    NODE"), "{so}");
}

#[test]
fn usage_of_an_ended_job_slurm_still_has_reads_its_record() {
    // 26.05: the record as JSON, its AdminComment written by both nodes.
    let mut doc: Value =
        serde_json::from_str(&fs::read_to_string(fixture("26.05/held-keyvalue.scontrol.json")).unwrap())
            .unwrap();
    let j = &mut doc["jobs"][0];
    j["job_id"] = 62.into();
    j["job_state"] = serde_json::json!(["COMPLETED"]);
    j["state_reason"] = "None".into();
    j["nodes"] = "gpu[01-02]".into();
    j["tres_alloc_str"] = "cpu=2,mem=20M,node=2,billing=2,gres/gpu=8".into();
    j["cpus_per_task"] = serde_json::json!({"set": true, "infinite": false, "number": 1});
    j["admin_comment"] = format!("JS1:x {} {}", word("gpu01", 4, 4, 10.0), word("gpu02", 4, 4, 10.0)).into();
    let file = std::env::temp_dir().join(format!("spank-gpu-usage-62-{}.json", std::process::id()));
    fs::write(&file, doc.to_string()).unwrap();
    let answer = format!("@{}", file.display());
    let s = FakeSlurm::new(
        "usage-record",
        &[("scontrol --version", "slurm 26.05.5"), ("scontrol --json=v0.0.42 show job 62", &answer)],
    );
    let v = s.json(&["usage", "62", "--json"]);
    assert_eq!(ids(&v), ["low-util"], "{v}");
    // 1 CPU per task on 26.05: srun inherits --cpus-per-task again.
    let fix = v["findings"][0]["fix"].as_str().unwrap();
    assert!(fix.contains("1 CPU per task") && fix.contains("since Slurm 23.11"), "{fix}");
    let _ = fs::remove_file(file);
}

#[test]
fn usage_of_an_ended_job_with_nothing_recorded_says_why() {
    let rec = gpu_record("63", "COMPLETED", Some("JS1:site-only"));
    let answer = format!("@{}", rec.display());
    let s = FakeSlurm::new(
        "usage-nothing",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 63", &answer),
            (
                "sacct -j 63 -P -o JobID,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,Reason,JobName,WorkDir",
                "JobID|User|State|ExitCode|Start|End|Elapsed|Timelimit|NodeList|JobName\n63|alice|COMPLETED|0:0|2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00|02:00:00|gpu[01-02]|train",
            ),
            (
                "sacctmgr -P show event nodes=gpu01,gpu02 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let v = s.json(&["usage", "63", "--json"]);
    assert_eq!(
        (ids(&v), v["gpus"].as_array().map(Vec::len)),
        (vec!["not-recorded".to_owned()], Some(0)),
        "{v}"
    );
    assert!(v["findings"][0]["what"].as_str().unwrap().contains("AdminComment"), "{v}");
    let a = s.json(&["autopsy", "63", "--json"]);
    assert_eq!(a["gpus"], serde_json::json!([]));
    assert!(a["findings"].to_string().contains("no GPU use recorded"), "{a}");
    // A pending job has used nothing yet.
    let held = FakeSlurm::new(
        "usage-pending",
        &[("scontrol --version", "slurm 22.05.8"), ("scontrol show job -o 1", "@22.05/held.scontrol")],
    );
    let (rc, _, se) = held.run(&["usage", "1"]);
    assert!(rc == 1 && se.contains("has not started: it is PENDING"), "{rc} {se}");
    let _ = fs::remove_file(rec);
}

/// The keys a users.md key/value table names (each code span of the first
/// column), from the table whose header follows the line `after`.
fn doc_keys(doc: &Doc, after: &str) -> Vec<Named> {
    let start = doc.line_of(after);
    let rows = doc.lines[start..]
        .iter()
        .enumerate()
        .skip_while(|(_, l)| md_tables::cells(l) != ["key", "value"])
        .skip(2)
        .take_while(|(_, l)| l.trim_start().starts_with('|'));
    rows.flat_map(|(i, l)| {
        let first = md_tables::cells(l).into_iter().next().unwrap_or_default();
        code_spans(&first).into_iter().map(move |name| Named { name, line: start + i + 1 })
    })
    .collect()
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

#[test]
fn the_json_keys_and_findings_are_the_documented_ones() {
    let doc = Doc::read("docs/users.md");
    // The findings.
    let rows = doc.table("### The findings", &["finding", "what it says", "the fix"]);
    let named: Vec<Named> = rows
        .iter()
        .map(|r| Named { name: code_spans(&r.cells[0]).first().cloned().unwrap_or_default(), line: r.line })
        .collect();
    assert_same("docs/users.md, the table under `### The findings`", &named, "usage::FINDINGS", FINDINGS);
    // usage --json and autopsy --json, as they come out.
    let rec = gpu_record("7", "RUNNING", None);
    let answer = format!("@{}", rec.display());
    let s = FakeSlurm::new(
        "usage-keys",
        &[("scontrol --version", "slurm 22.05.8"), ("scontrol show job -o 7", &answer)],
    )
    .with_srun(&["gpu01", "gpu02"], &[("gpu01", "/run/spank-gpu/usage/7", &word("gpu01", 2, 1, 50.0))]);
    let v = s.json(&["usage", "7", "--json"]);
    let _ = fs::remove_file(rec);
    assert_same(
        "docs/users.md, `usage --json`'s table",
        &doc_keys(&doc, "### `usage --json`"),
        "usage --json",
        &keys(&v),
    );
    let gpus =
        doc_keys(&doc, "### `usage --json`").iter().find(|n| n.name == "gpus").map(|n| n.line).unwrap();
    let cell = md_tables::cells(&doc.lines[gpus - 1])[1].clone();
    let listed: Vec<Named> = cell
        .split_once("[{")
        .and_then(|(_, r)| r.split_once("}]"))
        .map(|(l, _)| l.split(", ").map(|k| Named { name: k.to_owned(), line: gpus }).collect())
        .unwrap_or_default();
    assert_same(
        "docs/users.md, `usage --json`'s `gpus`",
        &listed,
        "usage --json's gpus",
        &keys(&v["gpus"][0]),
    );
    let unread: Vec<&str> = keys(&v["unread"][0]);
    assert_eq!(unread, ["node", "why"]);
    let finding: Vec<&str> = keys(&v["findings"][0]);
    assert_eq!(finding, ["fix", "id", "what"]);
    let s = FakeSlurm::new(
        "autopsy-keys",
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
    let a = s.json(&["autopsy", "47", "--json"]);
    assert_same(
        "docs/users.md, `autopsy --json`'s table",
        &doc_keys(&doc, "`autopsy --json`:"),
        "autopsy --json",
        &keys(&a),
    );
}

// ----- autopsy: the first failure, its cause, preemption ------------------------------------

/// 22.05's `sacct -P -o` arguments for `job` (`job_diagnosis::sacct_fields`).
fn sacct_text_args(job: &str) -> String {
    format!("sacct -j {job} -P -o {}", job_diagnosis::sacct_fields(job_diagnosis::Release::new(22, 5, 8)))
}

#[test]
fn autopsy_names_the_first_failure_its_cause_and_the_others_deaths() {
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diagnosis/tests/fixtures/first-failure/cuda-illegal-address.log")
        .display()
        .to_string();
    let sacct = sacct_text_args("4242");
    let s = FakeSlurm::new(
        "first-failure",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            (&sacct, "@../first-failure/steps.sacct"),
            ("scontrol show job -o 4242", "!slurm_load_jobs error: Invalid job id specified"),
            (
                "sacctmgr -P show event nodes=node1,node2 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let v = s.json(&["autopsy", "4242", "--json", "--log", &log]);
    let f = &v["first_failure"];
    assert_eq!(
        (
            f["node"].as_str(),
            f["task"].as_u64(),
            f["step"].as_str(),
            f["exit_code"].as_u64(),
            f["signal"].as_u64()
        ),
        (Some("node2"), Some(3), Some("4242.0"), Some(1), None),
        "{v}"
    );
    assert_eq!((f["at"].as_str(), f["at_from"].as_str()), (Some("2026-11-30T19:00:05"), Some("step_cancel")));
    assert_eq!(f["gpu_hours_after"].as_f64(), Some(0.01));
    assert_eq!(f["consequences"][0]["why"], "kill-on-bad-exit");
    assert_eq!(f["consequences"][0]["tasks"], serde_json::json!([0, 1]));
    assert_eq!(f["consequences"][0]["signal"], 15);
    let c = &v["cause"];
    assert_eq!(c["class"], "cuda-illegal-address");
    assert!(c["line"].as_str().unwrap().contains("CUDA error: an illegal memory access was encountered"));
    assert!(c["fix"].as_str().unwrap().contains("CUDA_LAUNCH_BLOCKING=1"), "{c}");
    assert_eq!(v["preemption"], Value::Null);
    let (rc, so, se) = s.run(&["autopsy", "4242", "--log", &log]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(
        so.contains(
            "  First failure:\n    task 3 on node2 (step 4242.0) exited with status 1, at 2026-11-30T19:00:05"
        ),
        "{so}"
    );
    assert!(so.contains("    then tasks 0-1 on node1 killed by signal 15 (Terminated)"), "{so}");
}

#[test]
fn autopsy_of_a_preempted_job_says_what_this_cluster_sent() {
    let sacct = sacct_text_args("4244");
    let rows = "JobID|User|State|ExitCode|Start|End|Elapsed|Timelimit|NodeList|JobName\n\
                4244|alice|PREEMPTED|0:0|2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00|04:00:00|node1|train";
    let config = "KillWait                = 30 sec\nPreemptMode             = REQUEUE\nPreemptType             = preempt/qos\nSlurmctldParameters     = preempt_send_user_signal";
    let s = FakeSlurm::new(
        "preempted",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            (&sacct, rows),
            ("scontrol show job -o 4244", "!slurm_load_jobs error: Invalid job id specified"),
            (
                "sacctmgr -P show event nodes=node1 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
            ("scontrol show config", config),
            ("sacct -j 4244 -X -n -P -o QOS,Partition", "low|gpu"),
            (
                "sacctmgr -n -P show qos low format=Name,GraceTime,Preempt,PreemptMode",
                "low|00:02:00||cluster",
            ),
        ],
    );
    let v = s.json(&["autopsy", "4244", "--json"]);
    assert_eq!(
        v["preemption"],
        serde_json::json!({"mode": "REQUEUE", "grace_time_s": 120, "grace_of": "QoS low", "user_signal": true, "kill_wait_s": 30}),
        "{v}"
    );
    let findings = v["findings"].to_string();
    assert!(findings.contains("A USR1 trap had 120 s to save a checkpoint"), "{findings}");
    assert!(findings.contains("Slurm requeued it (PreemptMode=REQUEUE)"), "{findings}");
    assert!(v["recipe"].as_str().is_some_and(|r| r.contains("--signal=B:USR1@")));
}

// ----- why: a failed dependency while accounting lags or hangs -------------------------------

/// 22.05's record of job 3, pending on `afterok:2(failed)`.
fn depfail() -> String {
    fs::read_to_string(fixture("22.05/depfail.scontrol")).unwrap().trim_end().to_owned()
}

/// The same record as job 2's, in `state` with `exit`.
fn job2(state: &str, exit: &str) -> String {
    depfail()
        .replace("JobId=3 ", "JobId=2 ")
        .replace(
            "JobState=PENDING Reason=DependencyNeverSatisfied Dependency=afterok:2(failed)",
            &format!("JobState={state} Reason=NonZeroExitCode Dependency=(null)"),
        )
        .replace("ExitCode=0:0", &format!("ExitCode={exit}"))
}

/// `why 3` with job 2 as `scontrol` (`job2`) and `sacct` (`sacct`) answer: (stdout, seconds taken).
fn why_3(name: &str, job2: &str, sacct: &str) -> (String, f64) {
    let depfail = depfail();
    let s = FakeSlurm::new(
        name,
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 3", &depfail),
            ("scontrol show job -o 2", job2),
            ("sacct -j 2 -X -P -o JobID,State,ExitCode", sacct),
            ("squeue -h -j 3 --start -o %S", "N/A"),
        ],
    );
    let t = std::time::Instant::now();
    let (rc, so, se) = s.run(&["why", "3"]);
    assert_eq!(rc, 0, "{so}{se}");
    (so, t.elapsed().as_secs_f64())
}

#[test]
fn why_takes_a_failed_dependency_from_slurmctld_before_accounting() {
    // slurmdbd stopped: sacct hangs. slurmctld still holds job 2: its state, at once.
    let (so, secs) = why_3("dep-hang", &job2("FAILED", "1:0"), "$sleep 60");
    assert!(
        so.contains(
            "dependency afterok:2 is failed: job 2 ended FAILED (exit code 1:0), so this job will never start"
        ),
        "{so}"
    );
    assert!(secs < 5.0, "{secs} s");
    // Accounting lagging behind (still PENDING there): slurmctld's word is taken.
    let (so, _) = why_3("dep-lag", &job2("FAILED", "1:0"), "JobID|State|ExitCode\n2|PENDING|0:0");
    assert!(so.contains("job 2 ended FAILED (exit code 1:0)"), "{so}");
    assert!(!so.contains("ended PENDING"), "{so}");
}

#[test]
fn why_never_says_ended_of_a_job_that_has_not() {
    let gone = "!slurm_load_jobs error: Invalid job id specified";
    // Only accounting knows job 2, and it says PENDING: still pending, not "ended PENDING".
    let (so, _) = why_3("dep-pending", gone, "JobID|State|ExitCode\n2|PENDING|0:0");
    assert!(so.contains("dependency afterok:2 is failed: job 2 is still PENDING"), "{so}");
    let line = so.lines().find(|l| l.contains("dependency afterok:2")).unwrap();
    assert!(!line.contains("ended") && !line.contains("never start"), "{so}");
    let (so, _) = why_3("dep-requeued", &job2("REQUEUED", "0:0"), "$sleep 60");
    assert!(so.contains("job 2 is still REQUEUED"), "{so}");
}

#[test]
fn why_answers_within_seconds_when_slurmdbd_does_not() {
    let gone = "!slurm_load_jobs error: Invalid job id specified";
    let (so, secs) = why_3("dep-nodbd", gone, "$sleep 60");
    assert!(
        so.contains("dependency afterok:2 is failed: how job 2 ended is not known: accounting did not answer (sacct did not answer within 8 s"),
        "{so}"
    );
    assert!(secs < 15.0, "{secs} s");
}

// ----- autopsy: the job's own text on a terminal ----------------------------------------------

#[test]
fn autopsy_escapes_the_jobs_text_and_quotes_its_name_in_the_recipe() {
    let dir = std::env::temp_dir().join(format!("spank-gpu-escapes-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let log = dir.join("job.out");
    fs::write(
        &log,
        "srun: error: node1: task 0: Exited with exit code 1\n\
         srun: Terminating StepId=4250.0\x1b[2J\n\
         [rank0]: CUDA error: an illegal memory access was encountered \x1b]52;c;AA==\x07 \u{202e}gnp.exe\n",
    )
    .unwrap();
    let rows = "JobID|User|State|ExitCode|Start|End|Elapsed|Timelimit|NodeList|JobName\n\
                4250|alice|TIMEOUT|0:0|2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00|01:00:00|node1|\x1b]52;c;ZWNobyBo\x07\u{202e}name";
    let sacct = sacct_text_args("4250");
    let s = FakeSlurm::new(
        "escapes",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            (&sacct, rows),
            ("scontrol show job -o 4250", "!slurm_load_jobs error: Invalid job id specified"),
            (
                "sacctmgr -P show event nodes=node1 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let log = log.display().to_string();
    let (rc, so, se) = s.run(&["autopsy", "4250", "--log", &log]);
    assert_eq!(rc, 0, "{so}{se}");
    let raw = |t: &str| t.chars().any(|c| c != '\n' && slurm_formats::text::is_unsafe(c));
    assert!(!raw(&so), "{so:?}");
    // The name, the step id and the log line, escaped where they are shown.
    assert!(so.contains("job 4250 (\\u{1b}]52;c;ZWNobyBo\\u{7}\\u{202e}name) TIMEOUT"), "{so}");
    assert!(so.contains("(step 4250.0\\u{1b}[2J)"), "{so}");
    assert!(so.contains("encountered \\u{1b}]52;c;AA==\\u{7} \\u{202e}gnp.exe"), "{so}");
    // The recipe's name: one quoted shell word, controls replaced.
    assert!(so.contains("    CKPT_DIR=${SCRATCH:-$HOME}/ckpt/'_]52;c;ZWNobyBo__name'\n"), "{so}");
    // JSON: every such character written \uXXXX, the text the same once read.
    let (rc, so, _) = s.run(&["autopsy", "4250", "--json", "--log", &log]);
    assert_eq!(rc, 0);
    assert!(!so.trim_end().chars().any(slurm_formats::text::is_unsafe), "{so:?}");
    let v: Value = serde_json::from_str(so.trim()).unwrap();
    assert_eq!(v["name"], "\x1b]52;c;ZWNobyBo\x07\u{202e}name");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn autopsy_goes_on_without_a_log_that_is_a_fifo() {
    let dir = std::env::temp_dir().join(format!("spank-gpu-fifo-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("job.out");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let sacct = sacct_text_args("4242");
    let s = FakeSlurm::new(
        "fifo",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            (&sacct, "@../first-failure/steps.sacct"),
            ("scontrol show job -o 4242", "!slurm_load_jobs error: Invalid job id specified"),
            (
                "sacctmgr -P show event nodes=node1,node2 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    // No writer ever opens the FIFO: a blocking open would hang here (timeout's 124).
    let out = Command::new("timeout")
        .args(["20", env!("CARGO_BIN_EXE_spank-gpu"), "autopsy", "4242", "--log"])
        .arg(&fifo)
        .env("PATH", format!("{}:/usr/bin:/bin", s.dir.display()))
        .env("TZ", "UTC")
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(so.matches("is a FIFO, not a regular file: not read").count(), 1, "{so}");
    assert!(so.contains("First failure:"), "{so}");
    let _ = fs::remove_dir_all(&dir);
}

/// `sacct -n -P -o JobIDRaw,JobID,NodeList,JobName` of job `job`: its step records.
fn steps_args(job: &str) -> String {
    format!("sacct -j {job} -n -P -o JobIDRaw,JobID,NodeList,JobName")
}

/// A 2-node job whose batch script starts no srun: its batch step ran on
/// gpu01 only, so gpu02's agent never saw it. `usage` names gpu02 as a node
/// no step ran on (usage's own read and the extern step are not work), and
/// sends no one to check its agent; with a step on both nodes, gpu02 without
/// a summary is the agent's again; without accounting, nothing is named.
#[test]
fn usage_of_a_running_job_names_the_nodes_no_step_ran_on() {
    let rec = gpu_record("8", "RUNNING", None);
    let answer = format!("@{}", rec.display());
    let sacct = "8|8|gpu[01-02]|train\n8.extern|8.extern|gpu[01-02]|extern\n8.batch|8.batch|gpu01|batch\n8.0|8.0|gpu[01-02]|spank-gpu-usage";
    let squeue = ("squeue -h -s -j 8 -o %i %N %j", "8.batch gpu01 batch\n8.extern gpu[01-02] extern");
    let live = |name: &str, sacct: &str| {
        FakeSlurm::new(
            name,
            &[
                ("scontrol --version", "slurm 22.05.8"),
                ("scontrol show job -o 8", &answer),
                (&steps_args("8"), sacct),
                squeue,
            ],
        )
        .with_srun(&["gpu01", "gpu02"], &[("gpu01", "/run/spank-gpu/usage/8", &word("gpu01", 4, 4, 90.0))])
    };
    let s = live("usage-no-step", sacct);
    let v = s.json(&["usage", "8", "--json"]);
    assert_eq!(ids(&v), ["no-step"], "{v}");
    assert_eq!(
        v["findings"][0]["what"],
        "no step has run on gpu02 (1 of the job's 2 nodes) so far: their 4 GPUs have been held for 1 h 00 min \
         and not used (4.0 GPU-hours so far)"
    );
    assert!(
        v["findings"][0]["fix"].as_str().unwrap().starts_with("the batch script runs on the first node only")
    );
    assert!(v["unread"][0]["why"].as_str().unwrap().starts_with("no step ran there"), "{v}");
    let (rc, so, se) = s.run(&["usage", "8"]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(so.contains("gpu02  -    (no step ran there)") && !so.contains("systemctl"), "{so}");
    // A step on both nodes: gpu02's missing summary is its agent's.
    let s = live("usage-step-everywhere", &format!("{sacct}\n8.1|8.1|gpu[01-02]|python"));
    let v = s.json(&["usage", "8", "--json"]);
    assert_eq!(ids(&v), ["not-sampled"], "{v}");
    assert!(v["findings"][0]["fix"].as_str().unwrap().contains("systemctl status gpu-node-agent"), "{v}");
    // Accounting down: a step may have ended on gpu02, so nothing is named, and the finding says why.
    let s = live("usage-no-accounting", "!sacct: error: Problem talking to the database: Connection refused");
    let v = s.json(&["usage", "8", "--json"]);
    assert_eq!(ids(&v), ["not-sampled"], "{v}");
    let fix = v["findings"][0]["fix"].as_str().unwrap();
    assert!(
        fix.contains("where the job's steps ran is not known: accounting: sacct: error: Problem talking"),
        "{fix}"
    );
    let _ = fs::remove_file(rec);
}

#[test]
fn usage_and_autopsy_of_an_ended_job_name_the_nodes_no_step_ran_on() {
    let comments =
        comments_sacct("61", &format!("61@T@61@T@@T@61@T@JS1:site {}@T@61", word("gpu01", 4, 4, 90.0)));
    let s = FakeSlurm::new(
        "usage-ended-no-step",
        &[
            ("scontrol --version", "slurm 22.05.8"),
            ("scontrol show job -o 61", "!slurm_load_jobs error: Invalid job id specified"),
            (
                "sacct -j 61 -P -o JobID,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,ReqMem,MaxRSS,Reason,JobName,WorkDir",
                "JobID|User|State|ExitCode|DerivedExitCode|Start|End|Elapsed|Timelimit|NodeList|ReqMem|MaxRSS|Reason|JobName|WorkDir\n61|alice|COMPLETED|0:0|0:0|2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00|02:00:00|gpu[01-02]|20M||None|train|/home/alice\n61.batch|||COMPLETED|0:0||2026-11-30T18:00:00|2026-11-30T19:00:00|01:00:00||gpu01|||batch|",
            ),
            (&comments.0, &comments.1),
            (
                "sacct -j 61 -X --parsable2 --noheader -o JobID,AllocTRES",
                "61|cpu=2,mem=20M,node=2,billing=2,gres/gpu=8",
            ),
            (
                &steps_args("61"),
                "61|61|gpu[01-02]|train|x\n61.batch|61.batch|gpu01|batch\n61.extern|61.extern|gpu[01-02]|extern",
            ),
            (
                "sacctmgr -P show event nodes=gpu01,gpu02 start=2026-11-30T18:00:00 format=NodeName,TimeStart,TimeEnd,State,Reason",
                "NodeName|TimeStart|TimeEnd|State|Reason",
            ),
        ],
    );
    let what = "no step ran on gpu02 (1 of the job's 2 nodes): their 4 GPUs were held for 1 h 00 min and never used \
                (4.0 GPU-hours)";
    let v = s.json(&["usage", "61", "--json"]);
    assert_eq!(ids(&v), ["no-step"], "{v}");
    assert_eq!(v["findings"][0]["what"], what);
    let a = s.json(&["autopsy", "61", "--json"]);
    assert!(a["findings"].to_string().contains(what), "{a}");
    let (rc, so, se) = s.run(&["autopsy", "61"]);
    assert_eq!(rc, 0, "{so}{se}");
    assert!(
        so.contains(&format!("    {what}\n      fix: the batch script runs on the first node only")),
        "{so}"
    );
    assert!(!so.contains("systemctl"), "{so}");
}
