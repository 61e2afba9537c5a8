//! Fleet scenarios of issue 11, in-process against a stateful stand-in for
//! slurmctld: a fake `scontrol` that keeps each node's state, GRES, reason and
//! reason time in a file and logs every call. The GPUs are a stand-in too
//! (`Gpus`), or the fake NVML library where the binary runs
//! (`cargo build --workspace` first).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use gpu_core::xid::Action;
use gpu_node_agent::agent::{Agent, Gpus, Report, Verdict};
use gpu_node_agent::config::Config;
use gpu_node_agent::health::{GpuSample, Remap, XidEvent, XidSource};
use gpu_node_agent::kmsg::KmsgReader;
use gpu_node_agent::nvml::ProbeError;
use gpu_node_agent::slurm::{Slurm, SlurmErrorKind};
use gpu_node_agent::{agent, daemon};

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");

/// Each node is `nodes/NAME`: `STATE|GRES|REASON|TIME`. `mode`: `ok`,
/// `fail` (every call fails), `noreboot` (no RebootProgram).
const FAKE_SCONTROL: &str = r#"#!/bin/sh
D=$(dirname "$0")
echo "$*" >> "$D/calls"
mode=$(cat "$D/mode")
if [ "$mode" = fail ]; then echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1; fi
show() {
  IFS='|' read -r st gres reason time < "$D/nodes/$1"
  echo "NodeName=$1 Arch=x86_64 CoresPerSocket=1"
  echo "   Gres=$gres"
  echo "   State=$st ThreadsPerCore=1"
  [ -n "$reason" ] && echo "   Reason=$reason [root@$time]"
  echo
}
put() {
  IFS='|' read -r st gres reason time < "$D/nodes/$1"
  printf '%s|%s|%s|%s\n' "$2" "$gres" "$3" "$(date +%Y-%m-%dT%H:%M:%S)" > "$D/nodes/.$1.$$"
  mv "$D/nodes/.$1.$$" "$D/nodes/$1"
}
case "$1" in
  show)
    if [ "$2" = nodes ]; then
      for f in "$D"/nodes/*; do show "$(basename "$f")"; done
    elif [ -f "$D/nodes/$3" ]; then show "$3"
    else echo "Node $3 not found" >&2; exit 1; fi ;;
  update)
    node=${2#NodeName=}
    case "$3" in
      State=DRAIN) put "$node" IDLE+DRAIN "${4#Reason=}" ;;
      State=RESUME) put "$node" IDLE "" ;;
    esac ;;
  cancel_reboot) put "$2" IDLE "" ;;
  reboot)
    if [ "$mode" = noreboot ]; then echo "scontrol: error: RebootProgram isn't defined" >&2; exit 1; fi
    for a in "$@"; do case "$a" in reason=*) reason=${a#reason=} ;; esac; node=$a; done
    put "$node" IDLE+DRAIN+REBOOT_REQUESTED "$reason" ;;
esac
"#;

struct World {
    dir: PathBuf,
}

impl World {
    fn new(name: &str, nodes: &[(&str, &str)]) -> World {
        let dir = std::env::temp_dir().join(format!("agent-scenario-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("nodes")).unwrap();
        let sc = dir.join("scontrol");
        fs::write(&sc, FAKE_SCONTROL).unwrap();
        fs::set_permissions(&sc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        for (n, gres) in nodes {
            fs::write(dir.join("nodes").join(n), format!("IDLE|{gres}||\n")).unwrap();
        }
        fs::write(dir.join("calls"), "").unwrap();
        fs::write(dir.join("mode"), "ok").unwrap();
        fs::write(dir.join("boot_id"), "b1\n").unwrap();
        World { dir }
    }

    fn cfg(&self, node: &str) -> Config {
        Config {
            node_name: Some(node.to_owned()),
            nvml_library: "/nonexistent/libnvidia-ml.so.1".into(),
            kmsg_path: None,
            state_dir: self.dir.join(format!("state-{node}")),
            scontrol: self.dir.join("scontrol"),
            scontrol_timeout: Duration::from_secs(10),
            boot_id_path: self.dir.join("boot_id"),
            max_drained_fraction: 1.0,
            drain_jitter: Duration::ZERO,
            resume_after: 1,
            ..Config::default()
        }
    }

    fn node(&self, n: &str) -> (String, String) {
        let line = fs::read_to_string(self.dir.join("nodes").join(n)).unwrap();
        let f: Vec<&str> = line.trim_end().split('|').collect();
        (f[0].to_owned(), f[2].to_owned())
    }

    fn set_node(&self, n: &str, state: &str, reason: &str) {
        let line = fs::read_to_string(self.dir.join("nodes").join(n)).unwrap();
        let gres = line.split('|').nth(1).unwrap().to_owned();
        fs::write(self.dir.join("nodes").join(n), format!("{state}|{gres}|{reason}|2026-01-01T00:00:00\n"))
            .unwrap();
    }

    fn calls(&self) -> String {
        fs::read_to_string(self.dir.join("calls")).unwrap()
    }

    fn mode(&self, m: &str) {
        fs::write(self.dir.join("mode"), m).unwrap();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// GPU samples a test can change while an agent runs.
#[derive(Clone, Debug)]
struct FakeGpus(Arc<Mutex<Result<Vec<GpuSample>, ProbeError>>>);

impl FakeGpus {
    fn healthy(n: u32) -> FakeGpus {
        FakeGpus(Arc::new(Mutex::new(Ok(healthy(n)))))
    }

    fn set(&self, s: Result<Vec<GpuSample>, ProbeError>) {
        *self.0.lock().unwrap() = s;
    }
}

impl Gpus for FakeGpus {
    fn sample(&mut self) -> Result<Vec<GpuSample>, ProbeError> {
        self.0.lock().unwrap().clone()
    }
}

fn healthy(n: u32) -> Vec<GpuSample> {
    (0..n)
        .map(|i| GpuSample {
            index: i,
            bus_id: gpu_core::pci::PciAddr::parse(&format!("00000000:{:02X}:00.0", 0x10 + i)).ok(),
            ecc_uncorrectable: Some(0),
            remap: Some(Remap::default()),
            recovery_action: Some(0),
            ..GpuSample::default()
        })
        .collect()
}

fn remap_pending() -> Vec<GpuSample> {
    let mut s = healthy(8);
    s[5].remap = Some(Remap { uncorrectable: 1, pending: true, ..Remap::default() });
    s
}

fn xid(x: u32, gpu: u32) -> XidEvent {
    XidEvent { xid: x, gpu: Some(gpu), bus: None, source: XidSource::Nvml, kmsg_us: None, nvlink: None }
}

const H100: &str = "gpu:h100:8(S:0-1)";

/// Point 1.
#[test]
fn mig_nodes_are_not_missing_gpus() {
    let w = World::new("mig", &[("m1", "gpu:1g.10gb:28,gpu:2g.20gb:12")]);
    let mut a = Agent::with_gpus(w.cfg("m1"), Box::new(FakeGpus::healthy(8)));
    let r = a.pass(true);
    assert_eq!(r.verdict, Verdict::Healthy, "{:?}", r.faults);
    assert!(r.faults.is_empty(), "{:?}", r.faults);
    assert_eq!(w.node("m1").0, "IDLE");
}

/// Point 2.
#[test]
fn a_drain_always_beats_a_reboot() {
    let w = World::new("drainwins", &[("n1", H100)]);
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus.clone()));
    a.record_xid(xid(79, 3));
    a.pass(true);
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN");
    assert!(reason.starts_with("gpu: xid79 gpu3"), "{reason}");
    assert!(!w.calls().contains("reboot"), "{}", w.calls());

    // A reboot already requested, then a drain-class fault: the reboot is cancelled, the node drained.
    let w = World::new("escalate", &[("n1", H100)]);
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus.clone()));
    a.pass(true);
    assert_eq!(w.node("n1").0, "IDLE+DRAIN+REBOOT_REQUESTED");
    a.record_xid(xid(79, 3));
    a.pass(true);
    let (state, reason) = w.node("n1");
    assert!(state == "IDLE+DRAIN" && reason.starts_with("gpu: xid79 gpu3"), "{state} {reason}");
    assert!(w.calls().contains("cancel_reboot n1"), "{}", w.calls());
}

/// Point 3.
#[test]
fn a_refused_reboot_falls_back_to_a_drain_in_the_same_pass() {
    let w = World::new("noreboot", &[("n1", H100)]);
    w.mode("noreboot");
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus));
    let r = a.pass(true);
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN", "{r:?}");
    assert!(reason.starts_with("gpu: remap-pend gpu5"), "{reason}");
    assert!(r.actions.iter().any(|x| x.contains("reboot refused")), "{:?}", r.actions);
    assert_eq!(a.state.drain.as_ref().unwrap().action, "drain");
}

/// Point 5.
#[test]
fn reboots_have_a_cap() {
    let w = World::new("cap", &[("n1", H100)]);
    let gpus = FakeGpus::healthy(8);
    gpus.set(Ok(remap_pending()));
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus));
    for boot in 1..=3 {
        fs::write(w.dir.join("boot_id"), format!("b{boot}\n")).unwrap();
        // Slurm rebooted the node and resumed it (nextstate=RESUME).
        w.set_node("n1", "IDLE", "");
        a.pass(true);
        let (state, reason) = w.node("n1");
        if boot < 3 {
            assert_eq!(state, "IDLE+DRAIN+REBOOT_REQUESTED", "boot {boot}");
        } else {
            assert_eq!(state, "IDLE+DRAIN", "third time: a drain for a person");
            assert!(reason.ends_with("still there after 2 reboots"), "{reason}");
        }
    }
    assert_eq!(w.calls().matches("reboot ASAP").count(), 2, "{}", w.calls());
    assert_eq!(a.state.reboots.get("remap-pend gpu5"), Some(&2), "recorded in the state");
}

/// Point 8.
#[test]
fn an_admins_reason_is_never_taken_for_the_agents() {
    let w = World::new("admin", &[("n1", H100)]);
    w.set_node("n1", "IDLE+DRAIN", "gpu: RMA ticket 42");
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    a.record_xid(xid(79, 3));
    a.pass(true);
    assert_eq!(w.node("n1").1, "gpu: RMA ticket 42");
    // Healthy, and a reason that reads like the agent's but it has no record of: not resumed.
    let w = World::new("admin2", &[("n1", H100)]);
    w.set_node("n1", "IDLE+DRAIN", "gpu: xid79 gpu3 GPU has fallen off the bus (nvml)");
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    for _ in 0..3 {
        a.pass(true);
    }
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
    assert!(!w.calls().contains("update"), "{}", w.calls());
}

/// Point 9: ten agents see an Xid 79 at the same moment; 20 GPU nodes and 20
/// CPU-only nodes; at most 10% of the GPU nodes may be drained.
#[test]
fn the_fleet_guard_holds_when_every_agent_sees_a_fault_at_once() {
    let names: Vec<String> =
        (1..=20).map(|i| format!("gpu{i:02}")).chain((1..=20).map(|i| format!("cpu{i:02}"))).collect();
    let nodes: Vec<(&str, &str)> =
        names.iter().map(|n| (n.as_str(), if n.starts_with("gpu") { H100 } else { "(null)" })).collect();
    let w = World::new("fleet", &nodes);
    let barrier = Arc::new(Barrier::new(10));
    let mut threads = Vec::new();
    for name in names.iter().take(10) {
        let cfg = Config { max_drained_fraction: 0.1, drain_jitter: Duration::from_secs(2), ..w.cfg(name) };
        let barrier = Arc::clone(&barrier);
        threads.push(std::thread::spawn(move || {
            let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
            a.record_xid(xid(79, 3));
            barrier.wait();
            a.pass(true);
            // And once more: the held-back drains stay held back.
            a.pass(true);
            a.state.suppressed_total
        }));
    }
    let suppressed: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let drained: Vec<String> = names.iter().filter(|n| w.node(n).0.contains("DRAIN")).cloned().collect();
    assert!(!drained.is_empty() && drained.len() <= 2, "drained: {drained:?}\n{}", w.calls());
    assert!(suppressed >= 8, "{suppressed} suppressions");
}

/// Point 10: a healthy node's passes, ignored and warn-only Xids included,
/// make no scontrol call; measured on the daemon loop, in-process.
#[test]
fn a_healthy_node_and_an_xid_storm_make_no_slurmctld_calls() {
    let w = World::new("rpc", &[("n1", H100)]);
    let cfg = Config { poll_interval: Duration::from_millis(20), ..w.cfg("n1") };
    let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
    let (tx, rx) = mpsc::channel();
    for _ in 0..200 {
        for (x, g) in [(43, 0), (45, 1), (13, 2), (94, 3)] {
            tx.send(xid(x, g)).unwrap();
        }
    }
    let passes = healthy_passes(&mut a, &rx, 50, |_, _| {});
    let calls = w.calls();
    assert_eq!(calls.lines().count(), 1, "one `show node` at start (name and GRES), then none:\n{calls}");
    assert!(calls.starts_with("show node n1"), "{calls}");
    // At the default poll_interval (30 s) that is 120 passes an hour and no call after the first.
    println!(
        "measured: {} scontrol call(s) over {passes} healthy passes and 800 ignored/warn Xids",
        calls.lines().count()
    );
}

/// Runs the daemon loop in-process for `n` passes, each healthy, calling
/// `each` with the pass's number and report; returns `n`.
fn healthy_passes(
    a: &mut Agent,
    rx: &mpsc::Receiver<XidEvent>,
    n: u64,
    mut each: impl FnMut(u64, &Report),
) -> u64 {
    let stop = AtomicBool::new(false);
    let mut passes = 0;
    daemon::serve(
        a,
        rx,
        &stop,
        || {},
        |_, r| {
            passes += 1;
            assert_eq!(r.verdict, Verdict::Healthy);
            each(passes, r);
            if passes == n {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        },
    );
    passes
}

/// The daemon loop, in-process: an Xid that needs a drain acts at once.
#[test]
fn the_daemon_loop_drains_on_an_xid_at_once() {
    let w = World::new("loop", &[("n1", H100)]);
    let cfg = Config { poll_interval: Duration::from_secs(3600), ..w.cfg("n1") };
    let mut a = Agent::with_gpus(cfg, Box::new(FakeGpus::healthy(8)));
    let (tx, rx) = mpsc::channel();
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let mut passes = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            tx.send(xid(79, 3)).unwrap();
        });
        daemon::serve(
            &mut a,
            &rx,
            &stop,
            || {},
            |_, r| {
                passes += 1;
                if r.verdict == Verdict::Unhealthy || t.elapsed() > Duration::from_secs(20) {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            },
        );
    });
    assert_eq!(passes, 2, "one pass at start, one on the Xid");
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// Point 11.
#[test]
fn a_node_named_by_its_fqdn_is_found_as_slurmd_finds_it() {
    let w = World::new("fqdn", &[("node7", H100)]);
    let slurm = Slurm { scontrol: w.dir.join("scontrol"), timeout: Duration::from_secs(10) };
    let names = agent::node_name_candidates("node7.cluster.example.org");
    assert_eq!(slurm.find_node(&names).unwrap().name, "node7");
    let e = slurm.find_node(&agent::node_name_candidates("node8.cluster.example.org")).unwrap_err();
    assert!(matches!(&e.kind, SlurmErrorKind::UnknownNode(n) if n.len() == 2 && n[0] == "node8"), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("node8 or node8.cluster.example.org") && text.contains("node_name"), "{e}");
}

/// Point 12, in the daemon's terms: the kernel log's lost GPU is a fault.
#[test]
fn a_gpu_lost_without_an_xid_drains() {
    let w = World::new("lost", &[("n1", H100)]);
    let log = w.dir.join("kmsg");
    fs::write(
        &log,
        "3,900,7100000,-;NVRM: The NVIDIA GPU 0000:13:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n",
    )
    .unwrap();
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(FakeGpus::healthy(8)));
    a.pass(false);
    for e in KmsgReader::new(&log).poll().unwrap() {
        assert!(a.record_kmsg(&e));
    }
    a.pass(true);
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN");
    assert_eq!(reason, "gpu: lost gpu3 kernel: GPU has fallen off the bus (kmsg)");
}

/// Point 6, with the stand-in: only the agent's own trouble is "cannot tell".
#[test]
fn nvml_trouble_of_the_agent_never_drains() {
    let w = World::new("own", &[("n1", H100)]);
    let gpus = FakeGpus::healthy(8);
    let mut a = Agent::with_gpus(w.cfg("n1"), Box::new(gpus.clone()));
    for e in [ProbeError::Unavailable("no library".into()), ProbeError::Hung("5 s".into())] {
        gpus.set(Err(e));
        assert_eq!(a.pass(true).verdict, Verdict::Unknown);
    }
    gpus.set(Err(ProbeError::DriverMismatch("LIB_RM_VERSION_MISMATCH".into())));
    assert_eq!(a.pass(true).verdict, Verdict::Unhealthy);
    assert!(w.node("n1").1.starts_with("gpu: driver/library mismatch"), "{:?}", w.node("n1"));
}

// --- the binary, with the fake NVML ------------------------------------------------

fn fake_nvml() -> PathBuf {
    let lib = Path::new(AGENT).with_file_name("libfake_nvml.so");
    assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
    lib
}

fn nvml_state(edit: impl Fn(&mut serde_json::Value)) -> String {
    edited(include_str!("../../tests/fake-nvml/states/h100x8-healthy.json"), edit)
}

/// A ready state of the fake NVML, edited.
fn edited(ready: &str, edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut s: serde_json::Value = serde_json::from_str(ready).unwrap();
    edit(&mut s);
    s.to_string()
}

impl World {
    fn config_file(&self, node: &str, extra: &str) -> PathBuf {
        let d = self.dir.display();
        let text = format!(
            "node_name = \"{node}\"\nnvml_library = \"{}\"\nkmsg_path = \"{d}/kmsg\"\nstate_dir = \"{d}/state\"\n\
             scontrol = \"{d}/scontrol\"\nnvml_timeout = \"2s\"\nboot_id_path = \"{d}/boot_id\"\n\
             max_drained_fraction = 1.0\nresume_after = 1\n{extra}\n",
            fake_nvml().display()
        );
        let path = self.dir.join("config.toml");
        fs::write(&path, text).unwrap();
        if !self.dir.join("kmsg").exists() {
            fs::write(self.dir.join("kmsg"), "").unwrap();
        }
        path
    }

    fn gpus(&self, state: &str) {
        fs::write(self.dir.join("nvml.json.tmp"), state).unwrap();
        fs::rename(self.dir.join("nvml.json.tmp"), self.dir.join("nvml.json")).unwrap();
    }

    fn run(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(AGENT)
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .args(args)
            .env("FAKE_NVML_STATE", self.dir.join("nvml.json"))
            .output()
            .unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code().unwrap_or(-1), text)
    }

    fn kmsg(&self, line: &str) {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().append(true).create(true).open(self.dir.join("kmsg")).unwrap();
        writeln!(f, "{line}").unwrap();
    }

    fn state_file(&self) -> Option<Vec<u8>> {
        fs::read(self.dir.join("state/state.json")).ok()
    }
}

const XID79_GPU3: &str =
    "6,2001,9123456789,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.";

/// Point 4, and the bad input of the `clear` command.
#[test]
fn clear_after_a_gpu_reset_and_its_bad_input() {
    let w = World::new("clear", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|_| {}));
    // Never drained: nothing to clear, and nothing written.
    let (code, out) = w.run(&["clear"]);
    assert!(code == 1 && out.contains("has not drained n1"), "{code} {out}");
    assert_eq!(w.state_file(), None);

    w.kmsg(XID79_GPU3);
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        w.node("n1"),
        ("IDLE+DRAIN".into(), "gpu: xid79 gpu3 GPU has fallen off the bus (kmsg)".into())
    );
    let before = w.state_file();
    for (args, want) in [
        (&["clear", "--gpu", "99"][..], "no GPU 99"),
        (&["clear", "--gpu", "x"][..], "needs a GPU number"),
        (&["clear", "--bogus"][..], "usage"),
    ] {
        let (code, out) = w.run(args);
        let line = out.lines().find(|l| l.starts_with("gpu-node-agent: clear:")).unwrap_or_default();
        assert!(code != 0 && line.contains(want), "{args:?}: {code} {out}");
        assert_eq!(w.state_file(), before, "{args:?} changed the state file");
    }
    // The GPU was reset; the admin clears it and resumes the node.
    let (code, out) = w.run(&["clear", "--gpu", "3"]);
    assert!(code == 0 && out.contains("cleared 1 Xid(s) on GPU 3"), "{out}");
    w.set_node("n1", "IDLE", "");
    // A new agent (a restart) replays the kernel log, which still holds the Xid: it does not count.
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(w.node("n1").0, "IDLE");
    let (_, status) = w.run(&["status"]);
    assert!(status.contains("cleared by uid ") && status.contains(": GPU 3 (1 Xids"), "{status}");
    // A new Xid after the clear drains again.
    w.kmsg(&XID79_GPU3.replace("9123456789", "9223456789"));
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// Bad input: a state file of an older version stops every writer, changes nothing.
#[test]
fn a_state_file_of_an_older_version_is_refused() {
    let w = World::new("oldstate", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|_| {}));
    fs::create_dir_all(w.dir.join("state")).unwrap();
    let old = r#"{"boot_id":"b1","xids":[],"drain":{"reason":"gpu: xid79 gpu3 x","action":"drain","needs_reboot":true,"boot_id":"b1","at":1},"pending":null,"clean_checks":0}"#;
    fs::write(w.dir.join("state/state.json"), old).unwrap();
    for args in [&["clear"][..], &["check", "--act"], &["run"]] {
        let (code, out) = w.run(args);
        assert!(
            code != 0 && out.contains("format 1") && out.contains("move it away"),
            "{args:?}: {code} {out}"
        );
        assert_eq!(fs::read_to_string(w.dir.join("state/state.json")).unwrap(), old, "{args:?}");
    }
    assert_eq!(w.calls(), "", "Slurm untouched");
}

/// Point 6, through NVML: a driver/library mismatch, a GPU that needs a reset
/// and one NVML cannot open drain the node, each with a reason naming it.
#[test]
fn nvml_that_says_the_node_is_broken_drains_it() {
    for (edit, want) in [
        (
            Box::new(|s: &mut serde_json::Value| s["init_error"] = "LIB_RM_VERSION_MISMATCH".into())
                as Box<dyn Fn(&mut serde_json::Value)>,
            "gpu: driver/library mismatch",
        ),
        (
            Box::new(|s: &mut serde_json::Value| s["gpus"][1]["error"] = "RESET_REQUIRED".into()),
            "gpu: reset gpu1",
        ),
        (
            Box::new(|s: &mut serde_json::Value| s["gpus"][2]["error"] = "UNKNOWN".into()),
            "gpu: unusable gpu2",
        ),
    ] {
        let w = World::new("broken", &[("n1", H100)]);
        w.config_file("n1", "");
        w.gpus(&nvml_state(edit));
        let (code, out) = w.run(&["check", "--act"]);
        assert_eq!(code, 1, "{want}: {out}");
        assert!(w.node("n1").1.starts_with(want), "{want}: {:?}\n{out}", w.node("n1"));
    }
    // The library missing: the agent's own trouble.
    let w = World::new("nolib", &[("n1", H100)]);
    w.config_file("n1", "");
    let cfg = fs::read_to_string(w.dir.join("config.toml")).unwrap();
    fs::write(
        w.dir.join("config.toml"),
        cfg.replace(&fake_nvml().display().to_string(), "/nonexistent/libnvidia-ml.so.1"),
    )
    .unwrap();
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (2, "IDLE"));
}

/// Point 7: `status` and `check` without `--act` write nothing, not even over
/// a corrupt state file; a later good read clears the load problem.
#[test]
fn status_and_check_change_nothing_on_disk() {
    let w = World::new("readonly", &[("n1", H100)]);
    w.config_file("n1", &format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    w.gpus(&nvml_state(|s| s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 2.into()));
    fs::create_dir_all(w.dir.join("state")).unwrap();
    fs::write(w.dir.join("state/state.json"), "{ corrupt").unwrap();
    for args in [&["status"][..], &["check"]] {
        let (_, out) = w.run(args);
        assert!(out.contains("state file unreadable"), "{args:?}: {out}");
        assert_eq!(fs::read_to_string(w.dir.join("state/state.json")).unwrap(), "{ corrupt", "{args:?}");
        let files: Vec<_> =
            fs::read_dir(w.dir.join("state")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(files.len(), 1, "{args:?} left {files:?}");
        assert!(!w.dir.join("metrics.prom").exists(), "{args:?} wrote metrics");
    }
    assert_eq!(w.node("n1").0, "IDLE");
    assert!(!w.calls().contains("update"));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (_, out) = w.run(&["status"]);
    assert!(!out.contains("state file unreadable"), "a good read clears the problem:\n{out}");
    assert!(out.contains("drained by this agent: \"gpu: ecc-dbe gpu2"), "{out}");
}

/// Issue 12, point 7: `check --act` beside the daemon takes turns through the
/// lock; `check` alone does not wait for it.
#[test]
fn check_act_waits_for_the_writers_lock_and_check_does_not() {
    let w = World::new("lock", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&nvml_state(|s| s["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 2.into()));
    let store = gpu_node_agent::state::Store::new(&w.dir.join("state"));
    let held = store.lock().unwrap();
    let t = Instant::now();
    let (code, _) = w.run(&["check"]);
    assert_eq!(code, 1);
    assert!(t.elapsed() < Duration::from_secs(10));
    let mut child = Command::new(AGENT)
        .arg("--config")
        .arg(w.dir.join("config.toml"))
        .args(["check", "--act"])
        .env("FAKE_NVML_STATE", w.dir.join("nvml.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "check --act did not wait for the lock");
    assert_eq!(w.node("n1").0, "IDLE", "nothing done while another writer holds the lock");
    drop(held);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(w.node("n1").0, "IDLE+DRAIN");
}

/// Point 12, `scan-log`: one JSON line with the bus id.
#[test]
fn scan_log_reports_a_gpu_lost_without_an_xid() {
    let text = "[    9.123456] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: 10de:20b0) installed in this system has\n               NVRM: fallen off the bus and is not responding to commands.\n\
                [   20.000001] NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n\
                [   20.000002] NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus.\n";
    let dir = std::env::temp_dir().join(format!("agent-scanlost-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("log"), text).unwrap();
    let out = Command::new(AGENT)
        .args(["--config", "/dev/null", "scan-log"])
        .arg(dir.join("log"))
        .output()
        .unwrap();
    let out = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["event"], "gpu-lost");
    assert_eq!(lines[0]["pci"], "0000:b3:00.0");
    assert_eq!(lines[0]["action"], Action::Drain.name());
    assert!(lines[0]["xid"].is_null());
    assert_eq!(lines[1]["xid"], 79, "the companion line counts once, with its Xid");
    fs::remove_dir_all(&dir).unwrap();
}

// --- issue 15: PCIe link, NVLinks, fabric, clocks, ECC and persistence modes ----------

fn hgx_state(edit: impl Fn(&mut serde_json::Value)) -> String {
    edited(include_str!("../../tests/fake-nvml/states/hgx-h100x8-healthy.json"), edit)
}

/// One row of the issue's table: its policy key, how the fake GPUs show the
/// fault, how many passes it takes, and the reason's first 20 characters.
struct Row {
    key: &'static str,
    before: fn(&mut serde_json::Value),
    fault: fn(&mut serde_json::Value),
    passes: usize,
    reason: &'static str,
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            key: "pcie_degraded",
            before: |_| {},
            fault: |s| s["gpus"][2]["pcie"]["width"] = 8.into(),
            passes: 1,
            reason: "gpu: pcie gpu2 x8/16",
        },
        Row {
            key: "nvlink_down",
            before: |_| {},
            fault: |s| s["gpus"][5]["nvlinks"][3]["state"] = "down".into(),
            passes: 1,
            reason: "gpu: nvlink gpu5 l3 ",
        },
        Row {
            key: "nvlink_errors",
            before: |_| {},
            fault: |s| s["gpus"][5]["nvlinks"][3]["crc_errors"] = 100_000.into(),
            passes: 1,
            reason: "gpu: nvlink-err gpu5",
        },
        Row {
            key: "fabric_failure",
            before: |_| {},
            fault: |s| s["gpus"][0]["fabric"]["status"] = "failure".into(),
            passes: 1,
            reason: "gpu: fabric gpu0 com",
        },
        Row {
            key: "clock_slowdown",
            before: |s| s["gpus"][3]["clock_events"] = serde_json::json!(["hw_thermal_slowdown"]),
            fault: |s| s["gpus"][3]["clock_events"] = serde_json::json!(["hw_thermal_slowdown"]),
            passes: 2,
            reason: "gpu: slowdown gpu3 h",
        },
        Row {
            key: "ecc_disabled",
            before: |_| {},
            fault: |s| s["gpus"][1]["ecc_mode"] = "disabled".into(),
            passes: 1,
            reason: "gpu: ecc-off gpu1 EC",
        },
        Row {
            key: "persistence_disabled",
            before: |_| {},
            fault: |s| s["gpus"][1]["persistence"] = false.into(),
            passes: 1,
            reason: "gpu: persist gpu1 pe",
        },
    ]
}

/// Issue 15: each row of the table, through the fake NVML and nvml-wrapper
/// (the binary, `check --act`), for each action word. Warn and ignore make
/// no Slurm change; drain drains and reboot asks for a reboot, with the
/// reason's class and GPU in `sinfo -R`'s 20 characters. `before` passes
/// (a base for the error rate, the first slowdowns) change nothing.
#[test]
fn every_link_and_mode_check_takes_every_action_word() {
    for row in rows() {
        for word in ["ignore", "warn", "drain", "reboot"] {
            let what = format!("{} = {word}", row.key);
            let w = World::new("hw", &[("n1", H100)]);
            w.config_file("n1", &format!("[policy]\n{} = \"{word}\"", row.key));
            w.gpus(&hgx_state(row.before));
            for pass in 0..row.passes {
                let (code, out) = w.run(&["check", "--act"]);
                assert_eq!(code, 0, "{what}, pass {pass}: {out}");
            }
            w.gpus(&hgx_state(row.fault));
            let (code, out) = w.run(&["check", "--act"]);
            let fault = out.lines().find(|l| l.starts_with("fault: ")).unwrap_or_default();
            assert!(fault.starts_with(&format!("fault: {}", row.reason)), "{what}: {out}");
            assert!(fault.ends_with(&format!("({word})")), "{what}: {fault}");
            let (state, reason) = w.node("n1");
            match word {
                "drain" | "reboot" => {
                    assert_eq!(code, 1, "{what}: {out}");
                    let want = if word == "drain" { "IDLE+DRAIN" } else { "IDLE+DRAIN+REBOOT_REQUESTED" };
                    assert_eq!(state, want, "{what}\n{}", w.calls());
                    assert_eq!(&reason[..20], row.reason, "{what}: {reason}");
                }
                _ => {
                    assert_eq!(code, 0, "{what}: {out}");
                    assert_eq!((state.as_str(), reason.as_str()), ("IDLE", ""), "{what}");
                    let calls = w.calls();
                    assert!(
                        calls.lines().all(|c| c.starts_with("show node")),
                        "{what}: a Slurm change:\n{calls}"
                    );
                }
            }
        }
    }
}

/// Issue 15: the defaults (drain a degraded PCIe link or a down NVLink, warn
/// for the rest), `status`'s table of every check per GPU with "n/s" where a
/// GPU lacks the feature (the fabric's "not supported" state too), and the gauges.
#[test]
fn status_shows_every_check_and_not_supported_and_defaults_apply() {
    let w = World::new("hwstatus", &[("n1", H100)]);
    w.config_file("n1", &format!("metrics_textfile = \"{}/metrics.prom\"", w.dir.display()));
    w.gpus(&hgx_state(|s| {
        s["gpus"][3]["fabric"]["state"] = "not_supported".into();
        s["gpus"][1]["ecc_mode"] = "disabled".into();
        s["gpus"][4]["nvlinks"] = serde_json::json!([]);
        for key in ["pcie", "clock_events", "ecc_mode", "persistence", "fabric", "pstate"] {
            s["gpus"][4].as_object_mut().unwrap().remove(key);
        }
    }));
    let (code, out) = w.run(&["status"]);
    assert_eq!(code, 0, "warn-only: healthy\n{out}");
    assert!(out.contains("GPU  PCIE            NVLINK     FABRIC"), "{out}");
    let row =
        |g: &str| out.lines().rfind(|l| l.starts_with(&format!("{g:<4} "))).unwrap_or_default().to_owned();
    assert_eq!(
        row("0").split_whitespace().collect::<Vec<_>>(),
        ["0", "gen5/5", "x16/16", "18/18", "up", "completed", "ok", "on", "on"]
    );
    assert_eq!(row("3").split_whitespace().nth(5), Some("n/s"), "{out}");
    assert!(row("1").contains(" OFF "), "{out}");
    assert_eq!(
        row("4").split_whitespace().collect::<Vec<_>>(),
        ["4", "n/s", "n/s", "n/s", "n/s", "n/s", "n/s"]
    );
    assert!(out.contains("n/s: not supported on this GPU, not checked\n"), "{out}");
    assert!(out.contains("ecc-off (warn)"), "{out}");

    w.gpus(&hgx_state(|s| {
        s["gpus"][2]["pcie"]["width"] = 8.into();
        s["gpus"][3]["fabric"]["state"] = "not_supported".into();
    }));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert!(w.node("n1").1.starts_with("gpu: pcie gpu2 x8/16 gen5/5"), "{:?}", w.node("n1"));
    let m = fs::read_to_string(w.dir.join("metrics.prom")).unwrap();
    for want in [
        "gpu_node_agent_gpu_check_ok{node=\"n1\",gpu=\"2\",UUID=\"GPU-5f1c0a02-7d2e-4b1a-9c3e-000000000002\",pci_bus_id=\"00000000:52:00.0\",check=\"pcie\"} 0\n",
        "check=\"pcie\"} 1\n",
        "gpu_node_agent_pcie_link_width{node=\"n1\",gpu=\"2\",",
        "gpu_node_agent_nvlinks_down{node=\"n1\",gpu=\"0\",",
    ] {
        assert!(m.contains(want), "{want}\n{m}");
    }
    let fabric_supported = |gpu: &str| {
        m.lines().any(|l| {
            l.starts_with(&format!("gpu_node_agent_gpu_check_supported{{node=\"n1\",gpu=\"{gpu}\","))
                && l.ends_with("check=\"fabric\"} 1")
        })
    };
    assert!(fabric_supported("0") && !fabric_supported("3"), "the fabric is read, n/s on GPU 3\n{m}");
}

/// Issue 15: the fabric is read from every driver generation: the versioned
/// call with the v2 struct (NVML 12.4) where the driver takes v3 and v2, or v2
/// only, and the unversioned call of older drivers. A wrong fallback reads as `n/s`.
#[test]
fn the_fabric_is_read_whatever_call_the_driver_has() {
    for version in [3, 2, 1] {
        let w = World::new("fabricv", &[("n1", H100)]);
        w.config_file("n1", "");
        w.gpus(&hgx_state(|s| {
            s["fabric_info_version"] = version.into();
            s["gpus"][0]["fabric"]["status"] = "failure".into();
            s["gpus"][1]["fabric"]["state"] = "not_started".into();
        }));
        let (_, out) = w.run(&["status"]);
        let cell = |g: &str| {
            let row = out.lines().rfind(|l| l.starts_with(&format!("{g:<4} "))).unwrap_or_default();
            row.split_whitespace().nth(5).unwrap_or_default().to_owned()
        };
        assert_eq!(
            [cell("0"), cell("1"), cell("2")],
            ["completed+failure", "not_started", "completed"],
            "fabric_info_version {version}\n{out}"
        );
    }
}

/// Issue 15: a fabric that has not registered `fabric_timeout` after boot
/// drains; before that, it is only reported. The state comes from the fake
/// NVML through `nvmlDeviceGetGpuFabricInfoV` (wrapped by `slurm_sys::nvml`).
#[test]
fn a_fabric_not_registered_after_the_timeout_drains() {
    let w = World::new("fabric", &[("n1", H100)]);
    w.gpus(&hgx_state(|s| s["gpus"][6]["fabric"]["state"] = "in_progress".into()));
    // This machine has been up for more than a second and less than 30 years.
    w.config_file("n1", "[policy]\nfabric_timeout = 1000000000");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"), "{out}");
    let (_, out) = w.run(&["status"]);
    assert!(out.lines().any(|l| l.starts_with("6 ") && l.contains(" in_progress ")), "{out}");
    w.config_file("n1", "[policy]\nfabric_timeout = \"1s\"");
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    let (state, reason) = w.node("n1");
    assert_eq!(state, "IDLE+DRAIN", "{out}");
    assert!(reason.starts_with("gpu: fabric gpu6 in_progress past fabric_timeout (1 s)"), "{reason}");
}

/// Issue 15: warn-only findings (ECC mode off, persistence off, a slowdown
/// past 3 checks, growing NVLink errors) make no Slurm call: the daemon loop,
/// in-process, asks Slurm for the node once at start and never again.
#[test]
fn warn_only_link_and_mode_findings_make_no_slurmctld_calls() {
    use gpu_node_agent::checks::{HwSample, NvLink};
    let w = World::new("hwrpc", &[("n1", H100)]);
    let cfg = Config { poll_interval: Duration::from_millis(20), ..w.cfg("n1") };
    let mut samples = healthy(8);
    for s in &mut samples {
        s.hw = HwSample {
            ecc_mode: Some(false),
            persistence: Some(false),
            clock_events: Some(0x80),
            nvlinks: Some(vec![NvLink { link: 0, up: true, ..NvLink::default() }]),
            ..HwSample::default()
        };
    }
    let gpus = FakeGpus(Arc::new(Mutex::new(Ok(samples.clone()))));
    let mut a = Agent::with_gpus(cfg, Box::new(gpus.clone()));
    let (_tx, rx) = mpsc::channel();
    let mut warned = 0;
    let passes = healthy_passes(&mut a, &rx, 50, |pass, r| {
        warned = warned.max(r.faults.len());
        // The NVLink error counters grow by a million every pass.
        let mut next = samples.clone();
        for s in &mut next {
            s.hw.nvlinks =
                Some(vec![NvLink { link: 0, up: true, crc: pass * 1_000_000, ..NvLink::default() }]);
        }
        gpus.set(Ok(next));
    });
    assert_eq!(warned, 8 * 4, "ecc-off, persist, slowdown and nvlink-err on every GPU");
    let calls = w.calls();
    assert_eq!(calls.lines().count(), 1, "one `show node` at start, then none:\n{calls}");
    println!(
        "measured: {} scontrol call(s) over {passes} passes with {warned} warn-only findings",
        calls.lines().count()
    );
}

/// Issue 15: a degraded PCIe link goes through the same rules as an Xid: in a
/// dry run nothing is written; an admin's drain keeps its reason; once the
/// link is back (after a reboot: a PCIe link needs one) the agent resumes.
#[test]
fn a_degraded_pcie_link_follows_the_agents_rules() {
    // The generation is judged against the GPU's own maximum
    // (nvmlDeviceGetGpuMaxPcieLinkGeneration, through slurm_sys::nvml), not the
    // lower of the GPU's and the slot's: a gen-5 GPU trained at gen 4 in a gen-4
    // slot is running below what it can do. `status` shows it.
    let w = World::new("pciegpumax", &[("n1", H100)]);
    w.config_file("n1", "");
    w.gpus(&hgx_state(|s| {
        s["gpus"][2]["pcie"]["gen"] = 4.into();
        s["gpus"][2]["pcie"]["slot_max_gen"] = 4.into();
    }));
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!(code, 1, "{out}");
    assert!(w.node("n1").1.starts_with("gpu: pcie gpu2 gen4/5 x16/16"), "{:?}", w.node("n1"));
    let (_, out) = w.run(&["status"]);
    assert!(out.lines().any(|l| l.starts_with("2 ") && l.contains(" gen4/5 x16/16 ")), "{out}");

    let w = World::new("pcierules", &[("n1", H100)]);
    let x8 = hgx_state(|s| s["gpus"][2]["pcie"]["width"] = 8.into());
    w.gpus(&x8);
    w.config_file("n1", "dry_run = true");
    let (code, out) = w.run(&["check", "--act"]);
    assert!(code == 1 && out.contains("dry run: would drain n1: gpu: pcie gpu2 x8/16"), "{out}");
    assert_eq!(w.node("n1").0, "IDLE");
    assert!(!w.calls().contains("update"), "{}", w.calls());

    w.config_file("n1", "");
    w.set_node("n1", "IDLE+DRAIN", "riser swap, says the admin");
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!(code, 1);
    assert_eq!(w.node("n1").1, "riser swap, says the admin");
    w.set_node("n1", "IDLE", "");

    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (1, "IDLE+DRAIN"));
    w.gpus(&hgx_state(|_| {}));
    let (code, _) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE+DRAIN"), "no resume before a reboot");
    fs::write(w.dir.join("boot_id"), "b2\n").unwrap();
    let (code, out) = w.run(&["check", "--act"]);
    assert_eq!((code, w.node("n1").0.as_str()), (0, "IDLE"), "resumed after the reboot: {out}");
}
