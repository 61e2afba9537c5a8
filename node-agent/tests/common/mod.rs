//! What the agent's integration tests share: a stateful stand-in for
//! slurmctld (a fake `scontrol` that keeps each node's state, GRES, reason
//! and reason time in a file and logs every call) and the binary run with the
//! fake NVML (`cargo build --workspace` first).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use gpu_node_agent::agent::{Agent, Gpus, Report, Verdict};
use gpu_node_agent::config::Config;
use gpu_node_agent::daemon;
use gpu_node_agent::policy::health::{GpuSample, Remap, XidEvent};
use gpu_node_agent::sources::nvml::ProbeError;

pub const AGENT: &str = env!("CARGO_BIN_EXE_gpu-node-agent");

/// Each node is `nodes/NAME`: `STATE|GRES|REASON|TIME`. `mode`: `ok`,
/// `fail` (every call fails), `noreboot` (no RebootProgram). An unknown node
/// is `Node X not found` on stdout, exit 1, as scontrol says it on every
/// release (scontrol/info_node.c).
pub const FAKE_SCONTROL: &str = r#"#!/bin/sh
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
    else echo "Node $3 not found"; exit 1; fi ;;
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

/// `gpu-node-agent --config DIR/config.toml ARGS`, its fake NVML reading
/// `DIR/nvml.json`: the command the daemon tests run in a directory of their own.
pub fn agent_in(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(AGENT);
    c.arg("--config").arg(dir.join("config.toml")).args(args).env("FAKE_NVML_STATE", dir.join("nvml.json"));
    c
}

pub struct World {
    pub dir: PathBuf,
}

impl World {
    pub fn new(name: &str, nodes: &[(&str, &str)]) -> World {
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

    pub fn cfg(&self, node: &str) -> Config {
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

    pub fn node(&self, n: &str) -> (String, String) {
        let line = fs::read_to_string(self.dir.join("nodes").join(n)).unwrap();
        let f: Vec<&str> = line.trim_end().split('|').collect();
        (f[0].to_owned(), f[2].to_owned())
    }

    pub fn set_node(&self, n: &str, state: &str, reason: &str) {
        let line = fs::read_to_string(self.dir.join("nodes").join(n)).unwrap();
        let gres = line.split('|').nth(1).unwrap().to_owned();
        fs::write(self.dir.join("nodes").join(n), format!("{state}|{gres}|{reason}|2026-01-01T00:00:00\n"))
            .unwrap();
    }

    pub fn calls(&self) -> String {
        fs::read_to_string(self.dir.join("calls")).unwrap()
    }

    pub fn mode(&self, m: &str) {
        fs::write(self.dir.join("mode"), m).unwrap();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

pub const H100: &str = "gpu:h100:8(S:0-1)";

// --- the binary, with the fake NVML ------------------------------------------------

pub fn fake_nvml() -> PathBuf {
    let lib = Path::new(AGENT).with_file_name("libfake_nvml.so");
    assert!(lib.is_file(), "{} missing: run `cargo build --workspace` first", lib.display());
    lib
}

pub fn nvml_state(edit: impl Fn(&mut serde_json::Value)) -> String {
    edited(include_str!("../../../tests/fake-nvml/states/h100x8-healthy.json"), edit)
}

/// A ready state of the fake NVML, edited.
pub fn edited(ready: &str, edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut s: serde_json::Value = serde_json::from_str(ready).unwrap();
    edit(&mut s);
    s.to_string()
}

impl World {
    pub fn config_file(&self, node: &str, extra: &str) -> PathBuf {
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

    pub fn gpus(&self, state: &str) {
        fs::write(self.dir.join("nvml.json.tmp"), state).unwrap();
        fs::rename(self.dir.join("nvml.json.tmp"), self.dir.join("nvml.json")).unwrap();
    }

    pub fn run(&self, args: &[&str]) -> (i32, String) {
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

    pub fn kmsg(&self, line: &str) {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().append(true).create(true).open(self.dir.join("kmsg")).unwrap();
        writeln!(f, "{line}").unwrap();
    }

    pub fn state_file(&self) -> Option<Vec<u8>> {
        fs::read(self.dir.join("state/state.json")).ok()
    }
}

pub const XID79_GPU3: &str =
    "6,2001,9123456789,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.";

// --- in-process: GPUs a test sets, the daemon loop -----------------------------------

/// GPU samples a test can change while an agent runs.
#[derive(Clone, Debug)]
pub struct FakeGpus(pub Arc<Mutex<Result<Vec<GpuSample>, ProbeError>>>);

impl FakeGpus {
    pub fn healthy(n: u32) -> FakeGpus {
        FakeGpus(Arc::new(Mutex::new(Ok(healthy(n)))))
    }

    pub fn set(&self, s: Result<Vec<GpuSample>, ProbeError>) {
        *self.0.lock().unwrap() = s;
    }
}

impl Gpus for FakeGpus {
    fn sample(&mut self) -> Result<Vec<GpuSample>, ProbeError> {
        self.0.lock().unwrap().clone()
    }
}

pub fn healthy(n: u32) -> Vec<GpuSample> {
    (0..n)
        .map(|i| GpuSample {
            index: i,
            bus_id: slurm_formats::pci::PciAddr::parse(&format!("00000000:{:02X}:00.0", 0x10 + i)).ok(),
            ecc_uncorrectable: Some(0),
            remap: Some(Remap::default()),
            recovery_action: Some(0),
            ..GpuSample::default()
        })
        .collect()
}

/// Runs the daemon loop in-process for `n` passes, each healthy, calling
/// `each` with the pass's number and report; returns `n`.
pub fn healthy_passes(
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
