//! The agent under faults of its own world: scontrol failing, hanging or slow
//! (or a wrapper around it leaving a child behind), an unwritable state dir,
//! NVML going bad mid-run (one GPU hanging), SIGTERM during a drain, the
//! per-job usage calls failing or hanging while a job runs.
//! Slurm is a fake `scontrol` (a shell script keeping one node's state in
//! files); NVML is the fake library (build the workspace first:
//! `cargo build --workspace`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::AGENT;

/// `update`, `reboot` and `show` calls are appended to `calls`; `mode`
/// (`ok`, `fail`, `hang`, `slow`, `leftover`) says how the next calls
/// behave. `leftover` is a site's wrapper that leaves a child behind holding
/// scontrol's output (its pid in `leftover.pids`), then answers.
const FAKE_SCONTROL: &str = r#"#!/bin/sh
D=$(dirname "$0")
echo "$*" >> "$D/calls"
case "$(cat "$D/mode")" in
  fail) echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1 ;;
  hang) sleep 60 ;;
  slow) sleep 3 ;;
  leftover) sleep 60 & echo $! >> "$D/leftover.pids" ;;
esac
show_node() {
  echo "NodeName=$1 Arch=x86_64"
  echo "   Gres=gpu:h100:8"
  echo "   State=$(cat "$D/state.$1")"
  [ -s "$D/reason.$1" ] && echo "   Reason=$(cat "$D/reason.$1") [root@2026-11-29T00:00:00]"
  echo
}
case "$1 $2" in
  "show node") show_node "$3" ;;
  "show nodes") for n in node1 node2 node3 node4; do show_node $n; done ;;
  update*)
    node=${2#NodeName=}
    case "$3" in
      State=DRAIN) echo IDLE+DRAIN > "$D/state.$node"; echo "${4#Reason=}" > "$D/reason.$node" ;;
      State=RESUME) echo IDLE > "$D/state.$node"; : > "$D/reason.$node" ;;
    esac ;;
  reboot*)
    for a in "$@"; do case "$a" in reason=*) reason=${a#reason=} ;; esac; node=$a; done
    echo IDLE+DRAIN+REBOOT_REQUESTED > "$D/state.$node"; echo "$reason" > "$D/reason.$node" ;;
esac
"#;

struct World {
    dir: PathBuf,
}

impl World {
    fn new(name: &str) -> World {
        let dir = std::env::temp_dir().join(format!("agent-faults-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let sc = dir.join("scontrol");
        fs::write(&sc, FAKE_SCONTROL).unwrap();
        fs::set_permissions(&sc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        for n in ["node1", "node2", "node3", "node4"] {
            fs::write(dir.join(format!("state.{n}")), "IDLE\n").unwrap();
            fs::write(dir.join(format!("reason.{n}")), "").unwrap();
        }
        fs::write(dir.join("calls"), "").unwrap();
        let w = World { dir };
        w.mode("ok");
        w.gpus(&healthy());
        w.config("");
        w
    }

    fn mode(&self, m: &str) {
        fs::write(self.dir.join("mode"), m).unwrap();
    }

    fn gpus(&self, state: &serde_json::Value) {
        let tmp = self.dir.join("nvml.json.tmp");
        fs::write(&tmp, state.to_string()).unwrap();
        fs::rename(&tmp, self.dir.join("nvml.json")).unwrap();
    }

    fn config(&self, extra: &str) -> PathBuf {
        let lib = Path::new(AGENT).with_file_name("libfake_nvml.so");
        assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
        let d = self.dir.display();
        let text = format!(
            "node_name = \"node2\"\nnvml_library = \"{}\"\nkmsg_path = \"\"\nstate_dir = \"{d}/state\"\n\
             scontrol = \"{d}/scontrol\"\nscontrol_timeout = \"1s\"\nnvml_timeout = \"1s\"\npoll_interval = \"300ms\"\n\
             boot_id_path = \"{d}/boot_id\"\nmax_drained_fraction = 1.0\n{extra}\n",
            lib.display()
        );
        fs::write(self.dir.join("boot_id"), "b1\n").unwrap();
        let path = self.dir.join("config.toml");
        fs::write(&path, text).unwrap();
        path
    }

    fn agent(&self, args: &[&str]) -> Command {
        common::agent_in(&self.dir, args)
    }

    fn run(&self, args: &[&str]) -> (i32, String) {
        let out: Output = self.agent(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }

    /// `gpu-node-agent run`, given time to start.
    fn daemon(&self) -> std::process::Child {
        let child = self
            .agent(&["run"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        child
    }

    fn calls(&self) -> String {
        fs::read_to_string(self.dir.join("calls")).unwrap()
    }

    fn node_state(&self) -> String {
        fs::read_to_string(self.dir.join("state.node2")).unwrap().trim().to_owned()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn healthy() -> serde_json::Value {
    serde_json::from_str(include_str!("../../tests/fake-nvml/states/h100x8-healthy.json")).unwrap()
}

fn ecc_fault() -> serde_json::Value {
    let mut s = healthy();
    s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 3.into();
    s
}

#[test]
fn a_failing_or_hanging_scontrol_never_drains_and_the_drain_is_kept_pending() {
    let w = World::new("scontrol");
    w.gpus(&ecc_fault());
    w.mode("fail");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "a fault was found: {out}");
    assert!(out.contains("drain pending") && out.contains("gpu: ecc-dbe gpu2"), "{out}");
    assert_eq!(w.node_state(), "IDLE");

    w.mode("hang");
    let t = Instant::now();
    let (code, out) = w.run(&["check", "--act"]);
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the agent waited {:?} on a hanging scontrol",
        t.elapsed()
    );
    assert_eq!(code, 1);
    assert!(out.contains("no answer within"), "{out}");
    let (_, status) = w.run(&["status"]);
    assert!(status.contains("drain pending: gpu: ecc-dbe gpu2"), "the decision is not lost:\n{status}");

    // Slurm answers again: the pending drain is made.
    w.mode("ok");
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    assert_eq!(w.node_state(), "IDLE+DRAIN");
    let (_, status) = w.run(&["status"]);
    assert!(!status.contains("drain pending"), "{status}");
}

#[test]
fn an_unwritable_state_dir_is_reported_and_changes_no_decision() {
    let w = World::new("statedir");
    fs::write(w.dir.join("not-a-dir"), "").unwrap();
    // The state dir is under a regular file: every save fails (as on a full or read-only disk).
    let d = w.dir.display();
    let cfg = fs::read_to_string(w.dir.join("config.toml")).unwrap();
    let cfg =
        cfg.replace(&format!("state_dir = \"{d}/state\""), &format!("state_dir = \"{d}/not-a-dir/state\""));
    fs::write(w.dir.join("config.toml"), cfg).unwrap();

    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("problem: state file"), "{out}");
    w.gpus(&ecc_fault());
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(w.node_state(), "IDLE+DRAIN", "the drain is still made");
}

#[test]
fn nvml_going_bad_mid_run_is_told_apart_from_a_bad_gpu() {
    let w = World::new("nvml");
    // Long enough that the hang itself is never judged here (see the next test).
    w.config("[policy]\nnvml_hang_polls = 1000");
    let daemon = w.daemon();
    // Every call on GPU 0 now hangs past the deadline: the agent's trouble, not the GPU's.
    let mut hung = healthy();
    hung["gpus"][0]["hang_ms"] = 4000.into();
    w.gpus(&hung);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(w.node_state(), "IDLE", "drained for a hanging NVML");
    // A GPU falls off the bus: that is a fault.
    let mut lost = healthy();
    lost["gpus"][5]["lost"] = true.into();
    w.gpus(&lost);
    let t = Instant::now();
    while w.node_state() != "IDLE+DRAIN" && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let out = daemon.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(w.node_state(), "IDLE+DRAIN", "lost GPU not drained; log:\n{log}");
    assert!(fs::read_to_string(w.dir.join("reason.node2")).unwrap().starts_with("gpu: lost gpu5"));
    assert!(log.contains("NVML hung on GPU 0: it has not answered for "), "{log}");
    assert!(out.status.success(), "SIGTERM should end the daemon cleanly");
}

/// Issue 25, policy: one GPU whose NVML calls hang no longer hides the other
/// seven (they are still sampled, each under its own deadline), and a hang
/// that outlasts `nvml_hang_polls` polls drains (`nvml_hang`, default drain),
/// its age in `gpu_node_agent_gpu_nvml_hang_seconds`. Before, every pass was
/// "NVML hung": the node was never drained, the other GPUs never checked.
#[test]
fn one_hung_gpu_hides_no_other_and_drains_after_nvml_hang_polls() {
    let wait_for_drain = |w: &World, secs: u64| {
        let t = Instant::now();
        while w.node_state() != "IDLE+DRAIN" && t.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(100));
        }
        t.elapsed()
    };
    // GPU 0 hangs for good; GPU 5 falls off the bus.
    let w = World::new("hungothers");
    let mut s = healthy();
    s["gpus"][0]["hang_ms"] = 600_000.into();
    s["gpus"][5]["lost"] = true.into();
    w.gpus(&s);
    let daemon = w.daemon();
    let took = wait_for_drain(&w, 20);
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let out = daemon.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let reason = fs::read_to_string(w.dir.join("reason.node2")).unwrap();
    assert!(
        reason.starts_with("gpu: lost gpu5"),
        "GPU 5 not judged beside a hung GPU 0 ({took:?}): {reason:?}\n{log}"
    );
    println!("measured: GPU 5 drained {took:?} after the daemon started, GPU 0 hung throughout");

    // GPU 0 alone hangs: after 3 polls (the default), a drain for it.
    let w = World::new("hungdrain");
    w.config(&format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    let mut s = healthy();
    s["gpus"][0]["hang_ms"] = 600_000.into();
    w.gpus(&s);
    let daemon = w.daemon();
    let took = wait_for_drain(&w, 30);
    let metrics = fs::read_to_string(w.dir.join("metrics.prom")).unwrap_or_default();
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let out = daemon.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let reason = fs::read_to_string(w.dir.join("reason.node2")).unwrap();
    assert!(
        reason.starts_with("gpu: hung gpu0 NVML calls have not returned for "),
        "{took:?}: {reason:?}\n{log}"
    );
    assert!(reason.contains("(3 polls)"), "{reason}");
    let age = |gpu: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!("gpu_node_agent_gpu_nvml_hang_seconds{{node=\"node2\",gpu=\"{gpu}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert!(age("0").is_some_and(|a| a >= 1) && age("1") == Some(0), "{metrics}");
    println!("measured: a GPU hung for 3 polls drained {took:?} after the daemon started");
}

/// Issue 25, point 1: without a usable state dir (here a path under a
/// regular file, as for a full or read-only `/var`) the agent cannot count
/// its reboots, so it asks for none: a GPU whose row remap stays pending got
/// a reboot request at every boot before (5 over 5 boots with
/// `max_reboots = 2`). Now a plain drain, and the agent says it is unhealthy.
#[test]
fn without_a_usable_state_it_never_reboots_and_says_so() {
    let w = World::new("noreboots");
    fs::write(w.dir.join("not-a-dir"), "").unwrap();
    let d = w.dir.display();
    w.config(&format!("metrics_textfile = \"{d}/metrics.prom\""));
    let cfg = fs::read_to_string(w.dir.join("config.toml")).unwrap();
    let cfg =
        cfg.replace(&format!("state_dir = \"{d}/state\""), &format!("state_dir = \"{d}/not-a-dir/state\""));
    fs::write(w.dir.join("config.toml"), cfg).unwrap();
    w.gpus(
        &serde_json::from_str(include_str!("../../tests/fake-nvml/states/h100x8-remap-pending-gpu5.json"))
            .unwrap(),
    );
    for boot in 1..=5 {
        fs::write(w.dir.join("boot_id"), format!("b{boot}\n")).unwrap();
        // What Slurm does after a reboot it was asked for (nextstate=RESUME).
        fs::write(w.dir.join("state.node2"), "IDLE\n").unwrap();
        fs::write(w.dir.join("reason.node2"), "").unwrap();
        let (code, out) = w.run(&["check", "--act"]);
        assert_eq!(code, 1, "boot {boot}: {out}");
        assert!(out.contains("problem: state file") && out.contains("no reboot"), "boot {boot}: {out}");
        assert_eq!(w.node_state(), "IDLE+DRAIN", "boot {boot}: {out}");
        let reason = fs::read_to_string(w.dir.join("reason.node2")).unwrap();
        assert!(
            reason.starts_with("gpu: remap-pend gpu5") && reason.contains("no reboot"),
            "boot {boot}: {reason}"
        );
        let metrics = fs::read_to_string(w.dir.join("metrics.prom")).unwrap();
        assert!(metrics.contains("gpu_node_agent_state_ok{node=\"node2\"} 0\n"), "{metrics}");
        assert!(metrics.contains("gpu_node_agent_up{node=\"node2\"} 0\n"), "{metrics}");
    }
    assert_eq!(w.calls().matches("reboot ASAP").count(), 0, "{}", w.calls());
}

/// Issue 25, point 4: `scontrol_timeout` bounds the whole call. A site's
/// wrapper that leaves a child behind holding scontrol's output kept every
/// call waiting for that child (61-80 s a pass with `scontrol_timeout =
/// "2s"`); now the call ends half a second after scontrol, and the child is
/// killed with its process group.
#[test]
fn a_wrapper_leaving_a_child_behind_does_not_stretch_a_pass() {
    let w = World::new("leftover");
    w.gpus(&ecc_fault());
    w.mode("leftover");
    let t = Instant::now();
    let (code, out) = w.run(&["check", "--act"]);
    let took = t.elapsed();
    assert_eq!(code, 1, "{out}");
    assert_eq!(w.node_state(), "IDLE+DRAIN", "{out}");
    assert!(took < Duration::from_secs(8), "one pass took {took:?} with scontrol_timeout = 1s");
    let pids = fs::read_to_string(w.dir.join("leftover.pids")).unwrap();
    let calls = pids.lines().count();
    assert!(calls >= 2, "{pids}");
    let alive =
        |pid: &str| fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| !st.contains(") Z "));
    let t = Instant::now();
    while pids.lines().any(alive) && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<&str> = pids.lines().filter(|p| alive(p)).collect();
    assert!(left.is_empty(), "children of the wrapper outlived their call: {left:?}");
    println!("measured: a pass with {calls} scontrol calls through a leaving wrapper took {took:?}");
}

#[test]
fn sigterm_during_a_drain_loses_no_decision() {
    let w = World::new("sigterm");
    let daemon = w.daemon();
    w.mode("slow");
    w.gpus(&ecc_fault());
    // Wait until the drain's scontrol update is running, then SIGTERM the agent.
    let t = Instant::now();
    while !w.calls().contains("State=DRAIN") && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let out = daemon.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    w.mode("ok");
    // Either the drain went through and is recorded, or it is pending: a
    // restarted agent ends with the node drained exactly once.
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    assert_eq!(w.node_state(), "IDLE+DRAIN");
    let (_, status) = w.run(&["status"]);
    assert!(status.contains("drained by this agent: \"gpu: ecc-dbe gpu2"), "{status}");
    let drains = w.calls().matches("State=DRAIN").count();
    assert!(drains <= 2, "{drains} drain calls:\n{}", w.calls());
}

/// slurmdbd's jobs for `sacct -j J -X -n -P --delimiter=T -o JobIDRaw,JobID,SystemComment,JobIDRaw,AdminComment,JobIDRaw` and
/// `sacctmgr -i modify job where jobid=J set AdminComment=TEXT`: job `J` is
/// known while `job.J` holds its `AdminComment`; every call is logged in `acct.calls`.
const FAKE_SACCT: &str = r#"#!/bin/sh
D=$(dirname "$0")
echo "sacct $*" >> "$D/acct.calls"
T='|'
for a; do case "$a" in --delimiter=*) T=${a#--delimiter=} ;; esac; done
[ -f "$D/job.$2" ] && printf '%s%s%s%s%s%s%s%s%s%s\n' "$2" "$T" "$2" "$T" "$T" "$2" "$T" "$(cat "$D/job.$2")" "$T" "$2"
exit 0
"#;
const FAKE_SACCTMGR: &str = r#"#!/bin/sh
D=$(dirname "$0")
echo "sacctmgr $*" >> "$D/acct.calls"
[ "$1" = -V ] && echo "slurm 24.11.5" && exit 0
job=${5#jobid=}
printf '%s' "${7#AdminComment=}" > "$D/job.$job"
"#;

/// Writes job `job`'s record as the plugin's job prolog does, holding GPUs `gpus`.
fn start_job(w: &World, job: u32, gpus: &[u32]) {
    let dir = w.dir.join("run/jobs");
    fs::create_dir_all(&dir).unwrap();
    let mut text = format!("# spank-gpu job v1\njob {job}\nuid 1000\n");
    for g in gpus {
        text.push_str(&format!("gpu {g} - GPU-5f1c0a0{g}-7d2e-4b1a-9c3e-00000000000{g}\n"));
    }
    fs::write(dir.join(job.to_string()), text).unwrap();
    fs::write(w.dir.join(format!("job.{job}")), "").unwrap();
}

fn wait(what: &str, secs: u64, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(secs), "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 44: a job holding GPUs 0-3 (0-1 busy) is summed while it runs (the
/// live file, the job metrics) and its summary lands in its AdminComment at
/// its end, a site's words kept; then the usage calls fail, and then hang:
/// a GPU falling off the bus is still drained within the same time as with
/// no usage sampling at all, and the job's summary still lands.
#[test]
fn usage_calls_failing_or_hanging_never_delay_a_drain() {
    let w = World::new("usage");
    let run = w.dir.join("run");
    for (name, text) in [("sacct", FAKE_SACCT), ("sacctmgr", FAKE_SACCTMGR)] {
        fs::write(w.dir.join(name), text).unwrap();
        fs::set_permissions(w.dir.join(name), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let d = w.dir.display();
    w.config(&format!(
        "run_dir = \"{}\"\nusage_interval = \"200ms\"\nmetrics_textfile = \"{d}/metrics.prom\"\n\
         sacct = \"{d}/sacct\"\nsacctmgr = \"{d}/sacctmgr\"",
        run.display(),
    ));
    let mut busy = healthy();
    for g in 0..2 {
        busy["gpus"][g]["utilization"] = serde_json::json!({"gpu": 90, "memory": 40});
        busy["gpus"][g]["processes"] = serde_json::json!([{"pid": 100 + g, "used_memory": 1_000_000}]);
    }
    w.gpus(&busy);
    let daemon = w.daemon();
    start_job(&w, 42, &[0, 1, 2, 3]);
    fs::write(w.dir.join("job.42"), "JS1:site-words").unwrap();
    let live = run.join("usage/42");
    wait("the live summary", 10, || fs::read_to_string(&live).is_ok_and(|t| t.contains(":90.0:90:")));
    wait("the job's metrics", 10, || {
        fs::read_to_string(w.dir.join("metrics.prom")).is_ok_and(|m| {
            m.contains("gpu_node_agent_job_gpu_utilization{node=\"node2\",job=\"42\",gpu=\"0\"")
        })
    });
    // The job ends (its epilog removes the record): its word lands beside the site's.
    fs::remove_file(run.join("jobs/42")).unwrap();
    let landed = || fs::read_to_string(w.dir.join("job.42")).is_ok_and(|c| c.contains("sgu1;node=node2"));
    if !(0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        landed()
    }) {
        let _ = Command::new("kill").arg(daemon.id().to_string()).status();
        let out = daemon.wait_with_output().unwrap();
        let calls = fs::read_to_string(w.dir.join("acct.calls")).unwrap_or_default();
        panic!("no AdminComment: {calls}\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let comment = fs::read_to_string(w.dir.join("job.42")).unwrap();
    assert!(comment.starts_with("JS1:site-words sgu1;node=node2;"), "{comment}");
    let summary = gpu_health::usage::parse_all(&comment);
    assert_eq!(summary[0].gpus.len(), 4, "{comment}");
    assert_eq!(summary[0].gpus[0].util_max, Some(90));
    assert!(summary[0].gpus[3].never_used(), "{comment}");
    assert!(!live.exists(), "the live file outlived the job");
    wait("the job's metrics gone", 10, || {
        fs::read_to_string(w.dir.join("metrics.prom")).is_ok_and(|m| !m.contains("job=\"42\""))
    });

    // Each usage call failing, then all of them hanging (the health calls answer).
    let mut bad = busy.clone();
    for g in 0..8 {
        bad["gpus"][g]["fail"] = serde_json::json!({"utilization": "UNKNOWN", "memory": "UNKNOWN", "processes": "UNKNOWN", "power": "UNKNOWN", "clock": "UNKNOWN"});
    }
    w.gpus(&bad);
    start_job(&w, 43, &[0]);
    std::thread::sleep(Duration::from_millis(600));
    let mut hung = busy.clone();
    for g in 0..8 {
        hung["gpus"][g]["hang_calls_ms"] = serde_json::json!({"utilization": 60000, "processes": 60000});
    }
    w.gpus(&hung);
    std::thread::sleep(Duration::from_millis(600));
    let mut lost = hung.clone();
    lost["gpus"][5]["lost"] = true.into();
    w.gpus(&lost);
    let t = Instant::now();
    wait("the drain", 10, || w.node_state() == "IDLE+DRAIN");
    let drained_in = t.elapsed();
    // A lost GPU is seen at the next pass (300 ms); the usage thread's hang adds nothing.
    assert!(drained_in < Duration::from_millis(1500), "drained after {drained_in:?}");
    // The job still ends with a summary (what was read before the hang).
    fs::remove_file(run.join("jobs/43")).unwrap();
    wait("job 43's AdminComment", 10, || {
        fs::read_to_string(w.dir.join("job.43")).is_ok_and(|c| c.contains("sgu1;"))
    });
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let out = daemon.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(fs::read_to_string(w.dir.join("reason.node2")).unwrap().starts_with("gpu: lost gpu5"), "{log}");
    assert!(out.status.success(), "{log}");
    // Per node and job: one read, one write, two read-backs; slurmctld is never asked.
    let acct = fs::read_to_string(w.dir.join("acct.calls")).unwrap();
    assert_eq!(acct.lines().filter(|l| l.contains("jobid=42") || l.contains("-j 42 ")).count(), 4, "{acct}");
    assert!(!w.calls().contains("job"), "{}", w.calls());
}

fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Issue 44: 64 jobs summed at once (8 GPUs each, so every GPU shared) keep
/// the agent within its memory budget (the unit's comment: 10-30 MiB), and
/// each job's live file is written.
#[test]
fn sixty_four_jobs_summed_at_once_stay_within_the_memory_budget() {
    let w = World::new("usage-rss");
    let run = w.dir.join("run");
    w.config(&format!(
        "run_dir = \"{}\"\nusage_interval = \"100ms\"\nusage_admin_comment = false",
        run.display()
    ));
    let daemon = w.daemon();
    std::thread::sleep(Duration::from_secs(1));
    let before = rss_kib(daemon.id());
    for job in 1..=64 {
        start_job(&w, job, &[0, 1, 2, 3, 4, 5, 6, 7]);
    }
    wait("64 live summaries", 20, || fs::read_dir(run.join("usage")).is_ok_and(|d| d.count() == 64));
    std::thread::sleep(Duration::from_secs(3));
    let after = rss_kib(daemon.id());
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let out = daemon.wait_with_output().unwrap();
    println!("agent RSS: {before} KiB idle, {after} KiB with 64 jobs summed");
    assert!(after < 30 * 1024, "RSS {after} KiB with 64 jobs:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(after.saturating_sub(before) < 2 * 1024, "64 jobs cost {} KiB", after - before);
    let live = fs::read_to_string(run.join("usage/64")).unwrap_or_default();
    assert!(live.contains(";g=7:") && live.contains(":shared"), "{live}");
}

/// Issue 45: `gpu-node-agent epilog` against the daemon: 0 on a healthy node;
/// 1 once a fault is found, the node drained first with the agent's own
/// reason; 0 with no daemon, a stopped (hung) one within its deadline, and
/// a bad configuration.
#[test]
fn the_epilog_gate_fails_only_for_an_unhealthy_node() {
    let w = World::new("gate");
    let run = w.dir.join("run");
    let cfg = w.config(&format!("run_dir = \"{}\"\nusage_interval = \"0\"", run.display()));
    let text =
        fs::read_to_string(&cfg).unwrap().replace("poll_interval = \"300ms\"", "poll_interval = \"30s\"");
    fs::write(&cfg, text).unwrap();
    let epilog = |timeout: &str| {
        let out = w.agent(&["epilog", "--timeout", timeout]).env("SLURM_JOB_ID", "77").output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // No daemon.
    let (code, line) = epilog("2s");
    assert_eq!(code, 0, "{line}");
    assert!(line.contains("no answer from the agent"), "{line}");
    let daemon = w.daemon();
    let (code, line) = epilog("5s");
    assert_eq!((code, w.node_state().as_str()), (0, "IDLE"), "{line}");
    // An uncorrectable ECC error, seen by the pass the epilog asks for (the poll is 30 s).
    w.gpus(&ecc_fault());
    let t = Instant::now();
    let (code, line) = epilog("5s");
    assert_eq!(code, 1, "{line}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(w.node_state(), "IDLE+DRAIN", "{line}");
    let reason = fs::read_to_string(w.dir.join("reason.node2")).unwrap();
    assert!(reason.starts_with("gpu: ecc-dbe gpu2") && line.contains(reason.trim()), "{reason} / {line}");
    // A hung daemon: the epilog gives up at its deadline, and does not fail.
    let _ = Command::new("kill").args(["-STOP", &daemon.id().to_string()]).status();
    let t = Instant::now();
    let (code, line) = epilog("1s");
    let waited = t.elapsed();
    let _ = Command::new("kill").args(["-CONT", &daemon.id().to_string()]).status();
    assert_eq!(code, 0, "{line}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let _ = daemon.wait_with_output();
    // A bad configuration never fails the Epilog.
    fs::write(w.dir.join("config.toml"), "bogus = 1\n").unwrap();
    let (code, line) = epilog("1s");
    assert_eq!(code, 0, "{line}");
    assert!(line.contains("bad configuration"), "{line}");
}
