//! What the agent must remember across restarts: the drain it made (to
//! resume only that, and only while the reason is still exactly its own), the
//! Xids seen this boot, the admin's clears, the reboots it asked for, and its
//! counters. One JSON file in `state_dir`, replaced atomically.
//!
//! Readers (`status`, `check`) only read it. Writers (the daemon's passes,
//! `check --act`, `clear`) hold [`Store::lock`], an exclusive `flock` on
//! `state_dir/lock`, from their read to their write, so two of them never
//! interleave; they write a temporary file of a unique name, fsync it, rename
//! it over the old one and fsync the directory.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use gpu_core::pci::PciAddr;
use serde::{Deserialize, Serialize};

use crate::atomic_file::{self, Options};
use crate::health::XidSource;

/// File name inside `state_dir`.
const FILE: &str = "state.json";
/// The lock file inside `state_dir`.
const LOCK: &str = "lock";
/// The format this agent reads and writes; a file of another format is refused.
pub const FORMAT: u32 = 2;

/// A drain (or reboot request) the agent made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// The reason exactly as written to Slurm.
    pub reason: String,
    /// `drain` or `reboot`.
    pub action: String,
    /// Only a reboot clears the fault: resume only after one.
    pub needs_reboot: bool,
    /// The boot the drain was made in.
    pub boot_id: String,
    /// Seconds since the epoch.
    pub at: u64,
}

/// An Xid (or a lost GPU, `xid` 0) seen this boot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenXid {
    /// The Xid.
    pub xid: u32,
    /// NVML index of the GPU, when known.
    pub gpu: Option<u32>,
    /// Bus id, when known; written in the kernel log's form (`0000:3b:00`).
    #[serde(default, with = "bus_form")]
    pub bus: Option<PciAddr>,
    /// Where it was seen first; written `nvml` or `kmsg`.
    #[serde(with = "source_form")]
    pub source: XidSource,
    /// The kernel's time of a kernel-log record (microseconds since boot).
    #[serde(default)]
    pub kmsg_us: Option<u64>,
    /// An admin cleared it (`gpu-node-agent clear`): it no longer counts.
    #[serde(default)]
    pub cleared: bool,
}

/// [`SeenXid::bus`] on disk: a string in the kernel log's form, as the
/// agent has always written it; one that does not read as a PCI address
/// loads as no bus.
mod bus_form {
    use gpu_core::pci::PciAddr;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(bus: &Option<PciAddr>, s: S) -> Result<S::Ok, S::Error> {
        bus.map(PciAddr::kernel).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PciAddr>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.and_then(|t| PciAddr::parse(&t).ok()))
    }
}

/// [`SeenXid::source`] on disk: `nvml` or `kmsg`, as the agent has always
/// written it. Any other word reads as `nvml`, as the agent has always taken it.
mod source_form {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::health::XidSource;

    pub fn serialize<S: Serializer>(source: &XidSource, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(source.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<XidSource, D::Error> {
        let word = String::deserialize(d)?;
        Ok(if word == XidSource::Kmsg.name() { XidSource::Kmsg } else { XidSource::Nvml })
    }
}

impl SeenXid {
    /// Whether `other` is the same event (as far as the two can tell).
    pub fn same_event(&self, other: &SeenXid) -> bool {
        self.xid == other.xid
            && self.source == other.source
            && self.kmsg_us == other.kmsg_us
            && ((self.gpu.is_some() && self.gpu == other.gpu)
                || (self.bus.is_some() && self.bus == other.bus))
    }
}

/// An admin's `gpu-node-agent clear`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearRecord {
    /// Seconds since the epoch.
    pub at: u64,
    /// Who ran it.
    pub uid: u32,
    /// The GPU (NVML index) it was for; `None`: every GPU.
    pub gpu: Option<u32>,
    /// Kernel-log records up to this kernel time (microseconds since boot)
    /// came before the clear and never count again.
    pub kmsg_us: Option<u64>,
    /// How many Xids it cleared.
    pub xids: usize,
}

impl ClearRecord {
    /// Whether this clear covers a GPU's event.
    pub fn covers(&self, gpu: Option<u32>) -> bool {
        self.gpu.is_none() || self.gpu == gpu
    }
}

/// The persisted state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// The file's format ([`FORMAT`]); a file without it is format 1.
    pub format: u32,
    /// The boot these Xids belong to.
    pub boot_id: String,
    /// Xids seen this boot (they stay faults until a reboot or a clear).
    pub xids: Vec<SeenXid>,
    /// The admin's clears this boot.
    pub clears: Vec<ClearRecord>,
    /// Reboots the agent asked for, per fault (`remap-pend gpu5`), across boots.
    pub reboots: BTreeMap<String, u32>,
    /// The agent's drain in force, if any.
    pub drain: Option<DrainRecord>,
    /// A drain decided but not yet accepted by Slurm (scontrol failed).
    pub pending: Option<String>,
    /// Consecutive checks without a fault since the drain.
    pub clean_checks: u32,
    /// Drains made, ever.
    pub drains_total: u64,
    /// Drains held back by the fleet guard, ever.
    pub suppressed_total: u64,
    /// Resumes made, ever.
    pub resumes_total: u64,
    /// What the PCIe/NVLink/clock checks saw at the last check, this boot.
    pub history: crate::checks::History,
}

impl Default for State {
    fn default() -> Self {
        State {
            format: FORMAT,
            boot_id: String::new(),
            xids: Vec::new(),
            clears: Vec::new(),
            reboots: BTreeMap::new(),
            drain: None,
            pending: None,
            clean_checks: 0,
            drains_total: 0,
            suppressed_total: 0,
            resumes_total: 0,
            history: crate::checks::History::default(),
        }
    }
}

impl State {
    /// Whether a seen Xid still counts: not cleared, and not a kernel-log
    /// record from before a clear that covers its GPU.
    pub fn counts(&self, x: &SeenXid, gpu: Option<u32>) -> bool {
        !x.cleared
            && !self.clears.iter().any(|c| {
                c.covers(gpu) && matches!((x.kmsg_us, c.kmsg_us), (Some(at), Some(upto)) if at <= upto)
            })
    }

    /// Adds an Xid unless the same event is known.
    pub fn add_xid(&mut self, x: SeenXid) {
        if !self.xids.iter().any(|k| k.same_event(&x)) {
            self.xids.push(x);
        }
    }

    /// Starts a new boot: this boot's Xids and clears are forgotten.
    pub fn new_boot(&mut self, boot_id: &str) {
        if self.boot_id != boot_id {
            self.xids.clear();
            self.clears.clear();
            self.history = crate::checks::History::default();
            boot_id.clone_into(&mut self.boot_id);
        }
    }
}

/// Why the state file cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    /// It cannot be read or parsed.
    Unreadable(String),
    /// It was written by another version of the agent.
    Format(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Unreadable(e) | LoadError::Format(e) => f.write_str(e),
        }
    }
}

/// Reads and writes the state file.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
}

/// Held while a writer reads, decides and writes; released when dropped.
#[derive(Debug)]
pub struct Lock {
    _file: fs::File,
}

impl Store {
    /// A store in `dir` (created by the first writer).
    pub fn new(dir: &Path) -> Store {
        Store { dir: dir.to_owned() }
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Takes the writers' lock, waiting for another writer to finish.
    ///
    /// # Errors
    /// The directory or the lock file cannot be created, or flock fails.
    pub fn lock(&self) -> Result<Lock, String> {
        let path = self.dir.join(LOCK);
        let fail = |e: std::io::Error| format!("{}: {e}", path.display());
        fs::create_dir_all(&self.dir).map_err(fail)?;
        let file =
            fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(fail)?;
        fs4::FileExt::lock(&file).map_err(fail)?;
        Ok(Lock { _file: file })
    }

    /// The saved state, for the boot `boot_id`: Xids and clears of an earlier
    /// boot are dropped. A missing file is a fresh state. Reading changes
    /// nothing on disk.
    ///
    /// # Errors
    /// The file exists but cannot be read or parsed, or is of another format.
    pub fn load(&self, boot_id: &str) -> Result<State, LoadError> {
        let path = self.path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(State { boot_id: boot_id.to_owned(), ..State::default() });
            }
            Err(e) => return Err(LoadError::Unreadable(format!("{}: {e}", path.display()))),
        };
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| LoadError::Unreadable(format!("{}: {e}", path.display())))?;
        let format = value.get("format").and_then(serde_json::Value::as_u64).unwrap_or(1);
        if format != u64::from(FORMAT) {
            return Err(LoadError::Format(format!(
                "{}: written by another version of gpu-node-agent (format {format}, this one reads {FORMAT}); \
                 move it away and restart the agent (drains it recorded are then left to you)",
                path.display()
            )));
        }
        let mut state: State = serde_json::from_value(value)
            .map_err(|e| LoadError::Unreadable(format!("{}: {e}", path.display())))?;
        state.new_boot(boot_id);
        Ok(state)
    }

    /// Writes the state: a temporary file of a unique name, fsync, rename
    /// over the old one, fsync the directory.
    ///
    /// # Errors
    /// The directory cannot be created or written (full, read-only, ...).
    pub fn save(&self, state: &State) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", self.path().display());
        fs::create_dir_all(&self.dir).map_err(fail)?;
        let text = serde_json::to_string_pretty(state).map_err(|e| e.to_string())?;
        atomic_file::write(&self.path(), text.as_bytes(), Options { mode: None, durable: true }).map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("agent-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn xid(x: u32, us: Option<u64>) -> SeenXid {
        SeenXid { xid: x, gpu: Some(3), bus: None, source: XidSource::Kmsg, kmsg_us: us, cleared: false }
    }

    #[test]
    fn round_trips_and_forgets_xids_of_another_boot() {
        let dir = tmp("roundtrip");
        let store = Store::new(&dir);
        let mut s = store.load("boot-a").unwrap();
        assert_eq!(s, State { boot_id: "boot-a".into(), ..State::default() });
        assert!(!dir.exists(), "reading creates nothing");
        s.xids.push(xid(79, Some(5)));
        s.clears.push(ClearRecord { uid: 0, ..ClearRecord::default() });
        s.reboots.insert("remap-pend gpu5".into(), 1);
        s.drain = Some(DrainRecord { reason: "gpu: xid79 gpu3".into(), ..DrainRecord::default() });
        store.save(&s).unwrap();
        assert_eq!(store.load("boot-a").unwrap(), s);
        let after_reboot = store.load("boot-b").unwrap();
        assert!(after_reboot.xids.is_empty() && after_reboot.clears.is_empty());
        assert!(after_reboot.drain.is_some(), "the drain record survives the reboot");
        assert_eq!(after_reboot.reboots.get("remap-pend gpu5"), Some(&1), "reboot counts survive it too");
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(leftovers, [std::ffi::OsString::from(FILE)], "no temporary file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_state_file_written_before_the_typed_fields_still_loads() {
        let dir = tmp("old");
        fs::create_dir_all(&dir).unwrap();
        // As the agent wrote it when `source` and `bus` were plain strings.
        let old = r#"{"format":2,"boot_id":"b1","xids":[
            {"xid":79,"gpu":null,"bus":"0000:61:00","source":"kmsg","kmsg_us":5000000,"cleared":false},
            {"xid":48,"gpu":3,"bus":null,"source":"nvml"},
            {"xid":13,"gpu":4,"bus":"not a bus","source":"something else"}]}"#;
        fs::write(dir.join(FILE), old).unwrap();
        let store = Store::new(&dir);
        let s = store.load("b1").unwrap();
        let got: Vec<_> =
            s.xids.iter().map(|x| (x.xid, x.gpu, x.bus.map(PciAddr::kernel), x.source)).collect();
        assert_eq!(
            got,
            [
                (79, None, Some("0000:61:00".to_owned()), XidSource::Kmsg),
                (48, Some(3), None, XidSource::Nvml),
                (13, Some(4), None, XidSource::Nvml),
            ]
        );
        // Written back in the same words.
        store.save(&s).unwrap();
        let text = fs::read_to_string(dir.join(FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let words: Vec<_> =
            (0..3).map(|i| (v["xids"][i]["bus"].clone(), v["xids"][i]["source"].clone())).collect();
        assert_eq!(
            words,
            [
                ("0000:61:00".into(), "kmsg".into()),
                (serde_json::Value::Null, "nvml".into()),
                (serde_json::Value::Null, "nvml".into())
            ],
            "{text}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_an_error_and_stays_as_it_is() {
        let dir = tmp("bad");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(FILE), "{ nope").unwrap();
        assert!(matches!(Store::new(&dir).load("x"), Err(LoadError::Unreadable(_))));
        assert_eq!(fs::read_to_string(dir.join(FILE)).unwrap(), "{ nope");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_of_an_older_version_is_refused_with_what_to_do() {
        let dir = tmp("old");
        fs::create_dir_all(&dir).unwrap();
        let old = r#"{"boot_id":"b","xids":[],"drain":null,"pending":null,"clean_checks":0}"#;
        fs::write(dir.join(FILE), old).unwrap();
        let e = Store::new(&dir).load("b").unwrap_err();
        assert!(matches!(e, LoadError::Format(_)), "{e}");
        assert!(e.to_string().contains("format 1") && e.to_string().contains("move it away"), "{e}");
        assert_eq!(fs::read_to_string(dir.join(FILE)).unwrap(), old);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn clears_hide_earlier_kernel_log_records_and_cleared_events() {
        let mut s = State::default();
        s.clears.push(ClearRecord { gpu: Some(3), kmsg_us: Some(100), ..ClearRecord::default() });
        assert!(!s.counts(&xid(79, Some(100)), Some(3)), "logged before the clear");
        assert!(s.counts(&xid(79, Some(101)), Some(3)), "logged after the clear");
        assert!(s.counts(&xid(79, Some(50)), Some(2)), "another GPU");
        assert!(!s.counts(&SeenXid { cleared: true, ..xid(79, None) }, Some(3)));
        assert!(s.counts(&xid(79, None), Some(3)), "an NVML event after the clear");
    }

    #[test]
    fn writers_take_turns() {
        let dir = tmp("lock");
        let store = Store::new(&dir);
        let held = store.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dir2 = dir.clone();
        let t = std::thread::spawn(move || {
            let _second = Store::new(&dir2).lock().unwrap();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "a second writer got in");
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
