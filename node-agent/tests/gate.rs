//! The Epilog gate (`gpu-node-agent epilog`) against the daemon, the binary
//! with the fake NVML and a fake `scontrol`: jobs ending together, a client
//! that connects and says nothing, a drain under the fleet guard (with its
//! `drain_jitter`), a hung GPU. The answer time is measured and printed.
//! Build the workspace first (`cargo build --workspace`: the fake NVML).
//! In-process, the daemon's loop: which pass answers a request, and a loop
//! whose event threads are gone sleeping, not spinning.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gpu_node_agent::agent::{Agent, Gpus, Verdict};
use gpu_node_agent::config::Config;
use gpu_node_agent::daemon::{self, Wake};
use gpu_node_agent::gate::{Answer, Request};
use gpu_node_agent::policy::health::GpuSample;
use gpu_node_agent::sources::nvml::ProbeError;

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");

/// The Epilog's own deadline: slurm.conf's epilog limits are far above it,
/// and the gate's answer, the drain included, must come well inside it.
const EPILOG_TIMEOUT: &str = "10s";
/// What "well inside" means here: the pass, a guarded drain's re-count
/// (1.1 s) and process start-up on a loaded CI machine.
const ANSWERED_WITHIN: Duration = Duration::from_secs(4);

struct World {
    dir: PathBuf,
}

impl World {
    /// A node (`node2`) polled every 30 s: every pass but the first is the gate's.
    fn new(name: &str, extra: &str) -> World {
        let dir = std::env::temp_dir().join(format!("agent-gate-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let sc = dir.join("scontrol");
        // The fake scontrol the agent's tests share: four GPU nodes.
        fs::write(&sc, common::FAKE_SCONTROL).unwrap();
        fs::set_permissions(&sc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        fs::create_dir_all(dir.join("nodes")).unwrap();
        for n in ["node1", "node2", "node3", "node4"] {
            fs::write(dir.join("nodes").join(n), "IDLE|gpu:h100:8||\n").unwrap();
        }
        fs::write(dir.join("calls"), "").unwrap();
        fs::write(dir.join("mode"), "ok").unwrap();
        fs::write(dir.join("boot_id"), "b1\n").unwrap();
        let lib = Path::new(AGENT).with_file_name("libfake_nvml.so");
        assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
        let d = dir.display();
        let text = format!(
            "node_name = \"node2\"\nnvml_library = \"{}\"\nkmsg_path = \"\"\nstate_dir = \"{d}/state\"\n\
             run_dir = \"{d}/run\"\nusage_interval = \"0\"\nscontrol = \"{d}/scontrol\"\nscontrol_timeout = \"2s\"\n\
             nvml_timeout = \"1s\"\npoll_interval = \"30s\"\nboot_id_path = \"{d}/boot_id\"\n{extra}\n",
            lib.display()
        );
        fs::write(dir.join("config.toml"), text).unwrap();
        let w = World { dir };
        w.gpus(&healthy());
        w
    }

    fn gpus(&self, state: &serde_json::Value) {
        let tmp = self.dir.join("nvml.json.tmp");
        fs::write(&tmp, state.to_string()).unwrap();
        fs::rename(&tmp, self.dir.join("nvml.json")).unwrap();
    }

    fn agent(&self, args: &[&str]) -> Command {
        common::agent_in(&self.dir, args)
    }

    /// `gpu-node-agent run`, once its socket is there.
    fn daemon(&self) -> Child {
        let child = self
            .agent(&["run"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !self.socket().exists() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run/agent.sock")
    }

    /// `epilog` for `jobs` at once: each one's exit status, line and time.
    fn epilogs(&self, jobs: &[u32]) -> Vec<(i32, String, Duration)> {
        let t = Instant::now();
        let children: Vec<Child> = jobs
            .iter()
            .map(|j| {
                self.agent(&["epilog", "--timeout", EPILOG_TIMEOUT])
                    .env("SLURM_JOB_ID", j.to_string())
                    .stderr(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        children
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().unwrap();
                let line = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                (out.status.code().unwrap_or(-1), line.trim().to_owned(), t.elapsed())
            })
            .collect()
    }

    fn node_state(&self) -> String {
        let line = fs::read_to_string(self.dir.join("nodes/node2")).unwrap();
        line.split('|').next().unwrap_or("").to_owned()
    }

    fn stop(&self, daemon: Child) -> String {
        let _ = Command::new("kill").arg(daemon.id().to_string()).status();
        String::from_utf8_lossy(&daemon.wait_with_output().unwrap().stderr).into_owned()
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

fn root() -> bool {
    // The daemon answers root only, and the command trusts a root daemon only.
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Three jobs end at once while a client holds a connection and says
/// nothing; the fault then needs a drain under the fleet guard, whose
/// `drain_jitter` is 5 s (the default). Every Epilog is answered well inside
/// its 10 s: the silent client holds up no one, the three share the pass,
/// and the gate's drain does not wait the jitter.
#[test]
fn three_epilogs_at_once_beside_a_silent_client_are_answered_in_time() {
    if !root() {
        eprintln!("skipped: the gate answers root only");
        return;
    }
    let w = World::new("three", "max_drained_fraction = 0.5\ndrain_jitter = \"5s\"");
    let daemon = w.daemon();
    let silent = UnixStream::connect(w.socket()).unwrap();
    let healthy_round = w.epilogs(&[101, 102, 103]);
    drop(silent);
    let mut s = healthy();
    s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 3.into();
    w.gpus(&s);
    let silent = UnixStream::connect(w.socket()).unwrap();
    let fault_round = w.epilogs(&[201, 202, 203]);
    drop(silent);
    let calls = fs::read_to_string(w.dir.join("calls")).unwrap();
    let log = w.stop(daemon);
    for (code, line, took) in &healthy_round {
        println!("measured: healthy node, 3 at once + 1 silent: {took:?}: {line}");
        assert_eq!(*code, 0, "{line}\n{log}");
        assert!(line.contains("healthy"), "{line}\n{log}");
        assert!(*took < ANSWERED_WITHIN, "{took:?}: {line}\n{log}");
    }
    for (code, line, took) in &fault_round {
        println!("measured: a guarded drain, 3 at once + 1 silent: {took:?}: {line}");
        assert_eq!(*code, 1, "{line}\n{log}");
        assert!(line.contains("gpu: ecc-dbe gpu2"), "{line}");
        assert!(*took < ANSWERED_WITHIN, "{took:?}: {line}\n{log}");
    }
    assert_eq!(w.node_state(), "IDLE+DRAIN");
    assert_eq!(calls.matches("State=DRAIN").count(), 1, "{calls}");
}

/// A GPU whose NVML calls hang (a stall) is judged after `nvml_hang_polls`
/// (3) polls. Epilogs between two polls report it and never add to the
/// count: three rounds of three jobs ending together, nine requests within
/// one poll interval, leave the node in service and every Epilog passing.
#[test]
fn epilogs_between_polls_never_add_to_a_hang_count() {
    if !root() {
        eprintln!("skipped: the gate answers root only");
        return;
    }
    let w = World::new("hang", "max_drained_fraction = 1.0");
    let mut s = healthy();
    s["gpus"][0]["hang_ms"] = 600_000.into();
    w.gpus(&s);
    let daemon = w.daemon();
    let mut answers = Vec::new();
    for round in 0..3 {
        answers.extend(w.epilogs(&[300 + round * 10, 301 + round * 10, 302 + round * 10]));
    }
    let state = fs::read_to_string(w.dir.join("state/state.json")).unwrap_or_default();
    let log = w.stop(daemon);
    for (code, line, took) in &answers {
        println!("measured: a hung GPU, 3 at once: {took:?}: {line}");
        assert_eq!(*code, 0, "{line}\n{log}");
        assert!(line.contains("cannot tell") && line.contains("NVML hung on GPU 0"), "{line}");
        assert!(*took < ANSWERED_WITHIN, "{took:?}: {line}\n{log}");
    }
    assert_eq!(w.node_state(), "IDLE", "drained by Epilog passes:\n{log}");
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["hangs"]["0"]["polls"], 1, "only the daemon's first poll counts: {state}");
}

// --- in-process: the daemon's loop ----------------------------------------------------

/// GPUs read at the start of each sample, which then takes `hold`: what a
/// test changes while a pass runs is not in that pass. Each sample's start
/// is told on `started`.
#[derive(Debug)]
struct SlowGpus {
    gpus: common::FakeGpus,
    hold: Duration,
    started: mpsc::Sender<()>,
}

impl Gpus for SlowGpus {
    fn sample(&mut self) -> Result<Vec<GpuSample>, ProbeError> {
        let read = self.gpus.0.lock().unwrap().clone();
        let _ = self.started.send(());
        std::thread::sleep(self.hold);
        read
    }
}

/// Sets `stop` when dropped, a failed assertion included: the loop ends.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn request(job: u32) -> (Wake, mpsc::Receiver<Answer>) {
    let (reply, rx) = mpsc::sync_channel(1);
    (Wake::Gate(Request { job: Some(job), reply }), rx)
}

/// A job's Epilog asks while a pass runs whose GPU reads were taken before
/// the job ended: it is answered by the next pass, not that one, and the
/// fault that came meanwhile fails it. Five Epilogs asking during one pass
/// share the next pass.
#[test]
fn a_request_during_a_pass_is_answered_by_the_next_pass() {
    let w = common::World::new("gate-late", &[("n1", common::H100)]);
    let cfg = Config { poll_interval: Duration::from_secs(3600), ..w.cfg("n1") };
    let gpus = common::FakeGpus::healthy(8);
    let (started_tx, started) = mpsc::channel();
    let slow = SlowGpus { gpus: gpus.clone(), hold: Duration::from_millis(400), started: started_tx };
    let mut a = Agent::with_gpus(cfg, Box::new(slow));
    let (tx, rx) = mpsc::channel::<Wake>();
    let (pass_tx, passes) = mpsc::channel();
    let stop = &AtomicBool::new(false);
    let a = &mut a;
    let wait = Duration::from_secs(10);
    std::thread::scope(|s| {
        s.spawn(move || {
            daemon::serve_gated(a, &rx, stop, || {}, |_, r| pass_tx.send(r.verdict).unwrap());
        });
        let _stop = StopOnDrop(stop);
        // The first pass, the poll at start.
        started.recv_timeout(wait).unwrap();
        assert_eq!(passes.recv_timeout(wait).unwrap(), Verdict::Healthy);
        // Job 1's Epilog asks; while its pass runs the GPU fails and five more
        // Epilogs ask.
        let (r, first) = request(1);
        tx.send(r).unwrap();
        started.recv_timeout(wait).unwrap();
        let mut fault = common::healthy(8);
        fault[2].ecc_uncorrectable = Some(3);
        gpus.set(Ok(fault));
        let later: Vec<_> = (2..=6)
            .map(|j| {
                let (r, answer) = request(j);
                tx.send(r).unwrap();
                answer
            })
            .collect();
        assert_eq!(first.recv_timeout(wait).unwrap(), Answer::Healthy, "job 1: the pass it asked for");
        for (j, answer) in later.iter().enumerate() {
            let a = answer.recv_timeout(wait).unwrap();
            assert!(
                matches!(&a, Answer::Unhealthy(r) if r.contains("gpu2")),
                "job {}: answered from a pass that started before it asked: {a:?}",
                j + 2
            );
        }
    });
    let verdicts: Vec<Verdict> = passes.try_iter().collect();
    // After the poll: job 1's pass, and one pass for the five.
    assert_eq!(verdicts, [Verdict::Healthy, Verdict::Unhealthy], "passes after the poll");
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// CPU time this thread has run, from the kernel's scheduler statistics.
fn thread_cpu() -> Duration {
    let text = fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(text.split_whitespace().next().unwrap().parse().unwrap())
}

/// The event threads and the gate gone (every sender dropped): the loop
/// sleeps until the next poll or its one-second watchdog wake-up, it does
/// not spin on the closed channel.
#[test]
fn a_loop_whose_event_threads_are_gone_sleeps() {
    let w = common::World::new("gate-gone", &[("n1", common::H100)]);
    let cfg = Config { poll_interval: Duration::from_secs(3600), ..w.cfg("n1") };
    let mut a = Agent::with_gpus(cfg, Box::new(common::FakeGpus::healthy(8)));
    let (tx, rx) = mpsc::channel::<Wake>();
    drop(tx);
    let stop = AtomicBool::new(false);
    let mut ticks: Vec<(Instant, Duration)> = Vec::new();
    daemon::serve_gated(
        &mut a,
        &rx,
        &stop,
        || {
            ticks.push((Instant::now(), thread_cpu()));
            if ticks.len() > 2 && ticks[1].0.elapsed() >= Duration::from_millis(1500) {
                stop.store(true, Ordering::Relaxed);
            }
        },
        |_, _| {},
    );
    // From the tick after the first pass to the last.
    let (t0, c0) = ticks[1];
    let (t1, c1) = *ticks.last().unwrap();
    let cpu = c1.saturating_sub(c0);
    println!(
        "measured: the loop, its channel closed: {} wake-ups, {cpu:?} CPU in {:?}",
        ticks.len() - 2,
        t1 - t0
    );
    assert!(t1 - t0 >= Duration::from_secs(1));
    assert!(ticks.len() <= 5, "{} wake-ups", ticks.len());
    assert!(cpu < Duration::from_millis(100), "spinning: {cpu:?} CPU in {:?}", t1 - t0);
}
