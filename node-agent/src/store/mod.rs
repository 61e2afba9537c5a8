//! What the agent must remember across restarts: the drain it made (to
//! resume only that, and only while the reason is still exactly its own), the
//! Xids seen this boot (one record per Xid and GPU, [`xids`]), the admin's
//! clears, the reboots it asked for, and its counters. One JSON file in
//! `state_dir`, replaced atomically, bounded whatever the uptime.
//!
//! Readers (`status`, `check`) only read it. Writers (the daemon's passes,
//! `check --act`, `clear`) hold [`Store::lock`], an exclusive `flock` on
//! `state_dir/lock`, from their read to their write, so two of them never
//! interleave; they write a temporary file of a unique name, fsync it, rename
//! it over the old one and fsync the directory ([`atomic_file`]).
//!
//! A file that does not parse is corrupt: a writer keeps it aside as
//! `state.json.corrupt-<time>` ([`Store::set_aside`]) and starts over with
//! [`State::lost`] set, so that nothing it no longer knows is acted on. A
//! file of format 2 (every Xid listed) is read and converted; any other
//! format stops every writer.

pub mod atomic_file;
pub mod migrate;
pub mod xids;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use atomic_file::Options;
pub use xids::{Occurrence, XidBook, XidRecord};

/// File name inside `state_dir`.
const FILE: &str = "state.json";
/// The lock file inside `state_dir`.
const LOCK: &str = "lock";
/// The format this agent writes; it also reads format 2, and refuses others.
pub const FORMAT: u32 = 3;
/// The clears kept (the newest): enough for `status` to show a boot's.
pub const MAX_CLEARS: usize = 32;

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

/// An admin's `gpu-node-agent clear`, or a resume through Slurm by someone
/// else (uid `None`), which counts as one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearRecord {
    /// Seconds since the epoch.
    pub at: u64,
    /// Who ran it.
    pub uid: u32,
    /// The GPU (NVML index) it was for; `None`: every GPU.
    pub gpu: Option<u32>,
    /// The newest kernel-log record it covered (microseconds since boot).
    pub kmsg_us: Option<u64>,
    /// How many Xid records it cleared.
    pub xids: usize,
    /// What made it, when not the `clear` command (`resumed through Slurm`).
    #[serde(default)]
    pub by: Option<String>,
}

/// The most records at one kernel time a [`KmsgMark`] keeps.
const MAX_MARK_KEYS: usize = 64;

/// The newest kernel-log record taken in: its kernel time (microseconds
/// since boot) and the records at that very time ([`kmsg_key`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsgMark {
    /// Kernel time.
    pub us: u64,
    /// The records taken in at that time.
    pub keys: Vec<String>,
}

/// A kernel-log record's identity within its kernel time: `79/0000:61:00`.
pub fn kmsg_key(xid: u32, bus: Option<slurm_formats::pci::PciAddr>) -> String {
    format!("{xid}/{}", bus.map(slurm_formats::pci::PciAddr::kernel).unwrap_or_default())
}

/// A GPU whose NVML calls have not returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HangRecord {
    /// When the hang was first seen (seconds since the epoch).
    pub since: u64,
    /// Polls in a row it has hung.
    pub polls: u32,
}

/// The state file was corrupt and is kept aside.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostHistory {
    /// When it was found (seconds since the epoch).
    pub at: u64,
    /// Where the corrupt file is kept.
    pub kept_as: String,
    /// Why it did not read.
    pub error: String,
    /// What it held is gone (no good copy in memory): its Xids, clears and
    /// reboot counts.
    #[serde(default)]
    pub history_lost: bool,
}

/// The persisted state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// The file's format ([`FORMAT`]); a file without it is format 1.
    pub format: u32,
    /// The boot these Xids belong to.
    pub boot_id: String,
    /// This boot's Xids: one record per (Xid, GPU), and the ignored ones counted.
    pub xids: XidBook,
    /// The newest kernel-log record taken in this boot: a replay of the
    /// kernel log (a restart, `check`) takes in only what is newer, in
    /// constant time per record.
    pub kmsg_mark: Option<KmsgMark>,
    /// The admin's clears this boot, the newest [`MAX_CLEARS`].
    pub clears: Vec<ClearRecord>,
    /// Reboots the agent asked for, per fault (`remap-pend gpu5`), across boots.
    pub reboots: BTreeMap<String, u32>,
    /// The agent's drain in force, if any.
    pub drain: Option<DrainRecord>,
    /// A drain decided but not yet accepted by Slurm (scontrol failed).
    pub pending: Option<String>,
    /// A drain the fleet guard holds back now (its reason).
    pub suppressed: Option<String>,
    /// Consecutive checks without a fault since the drain.
    pub clean_checks: u32,
    /// Drains made, ever.
    pub drains_total: u64,
    /// Drains held back by the fleet guard, ever.
    pub suppressed_total: u64,
    /// Resumes made, ever.
    pub resumes_total: u64,
    /// What the PCIe/NVLink/clock checks saw at the last check, this boot.
    pub history: crate::policy::checks::History,
    /// GPUs whose NVML calls hang, by NVML index (as text), this boot.
    pub hangs: BTreeMap<String, HangRecord>,
    /// Set when a corrupt file was kept aside this boot. When its history
    /// is lost (its Xids, clears and reboot counts), no reboot is asked for
    /// until the next boot or an admin's `clear`.
    pub lost: Option<LostHistory>,
    /// Corrupt state files kept aside, ever.
    pub corrupt_total: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            format: FORMAT,
            boot_id: String::new(),
            xids: XidBook::default(),
            kmsg_mark: None,
            clears: Vec::new(),
            reboots: BTreeMap::new(),
            drain: None,
            pending: None,
            suppressed: None,
            clean_checks: 0,
            drains_total: 0,
            suppressed_total: 0,
            resumes_total: 0,
            history: crate::policy::checks::History::default(),
            hangs: BTreeMap::new(),
            lost: None,
            corrupt_total: 0,
        }
    }
}

impl State {
    /// Starts a new boot: this boot's Xids, clears, hangs and check history
    /// are forgotten, and so is a lost file's history (its Xids were this
    /// boot's).
    pub fn new_boot(&mut self, boot_id: &str) {
        if self.boot_id != boot_id {
            self.xids = XidBook::default();
            self.kmsg_mark = None;
            self.clears.clear();
            self.history = crate::policy::checks::History::default();
            self.hangs.clear();
            self.lost = None;
            boot_id.clone_into(&mut self.boot_id);
        }
    }

    /// Whether a kernel-log record (its kernel time and [`kmsg_key`]) is new
    /// this boot, noting it as taken in: what is older than the mark, or at
    /// its time and among its keys, was taken in before.
    pub fn take_kmsg(&mut self, us: u64, key: &str) -> bool {
        match &mut self.kmsg_mark {
            Some(m) if us < m.us => false,
            Some(m) if us == m.us => {
                if m.keys.iter().any(|k| k == key) {
                    return false;
                }
                if m.keys.len() < MAX_MARK_KEYS {
                    m.keys.push(key.to_owned());
                }
                true
            }
            _ => {
                self.kmsg_mark = Some(KmsgMark { us, keys: vec![key.to_owned()] });
                true
            }
        }
    }

    /// Takes in another writer's (or this process's unsaved) mark: the newer
    /// one, and at the same time both's records.
    pub fn merge_mark(&mut self, other: &KmsgMark) {
        match &mut self.kmsg_mark {
            Some(m) if m.us > other.us => {}
            Some(m) if m.us == other.us => {
                for k in &other.keys {
                    if !m.keys.contains(k) && m.keys.len() < MAX_MARK_KEYS {
                        m.keys.push(k.clone());
                    }
                }
            }
            _ => self.kmsg_mark = Some(other.clone()),
        }
    }

    /// Whether the history of a corrupt file was lost this boot.
    pub fn history_lost(&self) -> bool {
        self.lost.as_ref().is_some_and(|l| l.history_lost)
    }

    /// Records a clear, keeping the newest [`MAX_CLEARS`].
    pub fn push_clear(&mut self, c: ClearRecord) {
        self.clears.push(c);
        let extra = self.clears.len().saturating_sub(MAX_CLEARS);
        self.clears.drain(..extra);
    }
}

/// Why the state file cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    /// It cannot be read (permissions, an I/O error, a directory in its place).
    Unreadable(String),
    /// It was read but does not parse: a writer keeps it aside and starts over.
    Corrupt(String),
    /// It was written by another version of the agent.
    Format(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Unreadable(e) | LoadError::Corrupt(e) | LoadError::Format(e) => f.write_str(e),
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

/// `2026-11-30T18-04-22Z` for seconds since the epoch: a time for a file name.
fn stamp(secs: u64) -> String {
    crate::time::utc(secs).replace(':', "-")
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
    /// The file exists but cannot be read, does not parse, or is of a format
    /// this agent does not read.
    pub fn load(&self, boot_id: &str) -> Result<State, LoadError> {
        let path = self.path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(State { boot_id: boot_id.to_owned(), ..State::default() });
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(LoadError::Corrupt(format!("{}: {e}", path.display())));
            }
            Err(e) => return Err(LoadError::Unreadable(format!("{}: {e}", path.display()))),
        };
        let corrupt = |e: String| LoadError::Corrupt(format!("{}: {e}", path.display()));
        let mut value: serde_json::Value = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        let format = value.get("format").and_then(serde_json::Value::as_u64).unwrap_or(1);
        if format == 2 {
            let empty = serde_json::Value::Array(Vec::new());
            let (book, mark) = migrate::xids_of_format_2(
                value.get("xids").unwrap_or(&empty),
                value.get("clears").unwrap_or(&empty),
            )
            .map_err(corrupt)?;
            let book = serde_json::to_value(&book).map_err(|e| corrupt(e.to_string()))?;
            if let Some(map) = value.as_object_mut() {
                map.insert("xids".to_owned(), book);
                map.insert(
                    "kmsg_mark".to_owned(),
                    serde_json::to_value(&mark).map_err(|e| corrupt(e.to_string()))?,
                );
                map.insert("format".to_owned(), serde_json::json!(FORMAT));
            }
        } else if format != u64::from(FORMAT) {
            return Err(LoadError::Format(format!(
                "{}: written by another version of gpu-node-agent (format {format}, this one reads 2 and {FORMAT}); \
                 move it away and restart the agent (drains it recorded are then left to you)",
                path.display()
            )));
        }
        let mut state: State = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
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

    /// Keeps a corrupt state file aside as `state.json.corrupt-<time>` (a
    /// writer does this, under the lock); returns where it went.
    ///
    /// # Errors
    /// The rename fails.
    pub fn set_aside(&self, now: u64) -> Result<PathBuf, String> {
        let mut to = self.dir.join(format!("{FILE}.corrupt-{}", stamp(now)));
        let mut n = 1;
        while to.exists() {
            n += 1;
            to = self.dir.join(format!("{FILE}.corrupt-{}.{n}", stamp(now)));
        }
        fs::rename(self.path(), &to)
            .map_err(|e| format!("{} -> {}: {e}", self.path().display(), to.display()))?;
        Ok(to)
    }
}

/// [`XidRecord::bus`] on disk: a string in the kernel log's form, as the
/// agent has always written it; one that does not read as a PCI address
/// loads as no bus.
mod bus_form {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use slurm_formats::pci::PciAddr;

    pub fn serialize<S: Serializer>(bus: &Option<PciAddr>, s: S) -> Result<S::Ok, S::Error> {
        bus.map(PciAddr::kernel).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PciAddr>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.and_then(|t| PciAddr::parse(&t).ok()))
    }
}

/// [`XidRecord::source`] on disk: `nvml` or `kmsg`, as the agent has always
/// written it. Any other word reads as `nvml`, as the agent has always taken it.
mod source_form {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::policy::health::XidSource;

    pub fn serialize<S: Serializer>(source: &XidSource, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(source.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<XidSource, D::Error> {
        let word = String::deserialize(d)?;
        Ok(if word == XidSource::Kmsg.name() { XidSource::Kmsg } else { XidSource::Nvml })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::health::XidSource;
    use slurm_formats::pci::PciAddr;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("agent-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn occ(x: u32, us: u64) -> Occurrence {
        Occurrence {
            xid: x,
            gpu: Some(3),
            bus: None,
            source: XidSource::Kmsg,
            kmsg_us: Some(us),
            at: 1,
            fatal: None,
        }
    }

    #[test]
    fn round_trips_and_forgets_xids_of_another_boot() {
        let dir = tmp("roundtrip");
        let store = Store::new(&dir);
        let mut s = store.load("boot-a").unwrap();
        assert_eq!(s, State { boot_id: "boot-a".into(), ..State::default() });
        assert!(!dir.exists(), "reading creates nothing");
        s.xids.add(&occ(79, 5), |_| true);
        s.xids.ignore(43);
        assert!(s.take_kmsg(5, "79/0000:61:00"));
        s.push_clear(ClearRecord { uid: 0, ..ClearRecord::default() });
        s.reboots.insert("remap-pend gpu5".into(), 1);
        s.drain = Some(DrainRecord { reason: "gpu: xid79 gpu3".into(), ..DrainRecord::default() });
        s.hangs.insert("2".into(), HangRecord { since: 9, polls: 2 });
        store.save(&s).unwrap();
        assert_eq!(store.load("boot-a").unwrap(), s);
        let after_reboot = store.load("boot-b").unwrap();
        assert!(
            after_reboot.xids.is_empty() && after_reboot.clears.is_empty() && after_reboot.hangs.is_empty()
        );
        assert!(after_reboot.xids.ignored.is_empty() && after_reboot.kmsg_mark.is_none());
        assert!(after_reboot.drain.is_some(), "the drain record survives the reboot");
        assert_eq!(after_reboot.reboots.get("remap-pend gpu5"), Some(&1), "reboot counts survive it too");
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(leftovers, [std::ffi::OsString::from(FILE)], "no temporary file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_format_2_file_is_converted_and_keeps_what_was_cleared() {
        let dir = tmp("old");
        fs::create_dir_all(&dir).unwrap();
        // As format 2 wrote it: every Xid listed, `source` and `bus` as plain strings.
        let old = r#"{"format":2,"boot_id":"b1","xids":[
            {"xid":79,"gpu":null,"bus":"0000:61:00","source":"kmsg","kmsg_us":5000000,"cleared":false},
            {"xid":79,"gpu":null,"bus":"0000:61:00","source":"kmsg","kmsg_us":6000000,"cleared":false},
            {"xid":48,"gpu":3,"bus":null,"source":"nvml"},
            {"xid":13,"gpu":4,"bus":"not a bus","source":"something else","cleared":true}],
            "clears":[{"at":1,"uid":0,"gpu":null,"kmsg_us":5500000,"xids":1}],
            "reboots":{"remap-pend gpu5":1}}"#;
        fs::write(dir.join(FILE), old).unwrap();
        let store = Store::new(&dir);
        let s = store.load("b1").unwrap();
        let got: Vec<_> = s
            .xids
            .records()
            .iter()
            .map(|x| (x.xid, x.gpu, x.bus.map(PciAddr::kernel), x.source, x.count, x.cleared))
            .collect();
        assert_eq!(
            got,
            [
                (79, None, Some("0000:61:00".to_owned()), XidSource::Kmsg, 2, 1),
                (48, Some(3), None, XidSource::Nvml, 1, 0),
                (13, Some(4), None, XidSource::Nvml, 1, 1),
            ]
        );
        assert_eq!(s.format, FORMAT);
        assert_eq!(s.kmsg_mark, Some(KmsgMark { us: 6_000_000, keys: vec!["79/0000:61:00".to_owned()] }));
        assert_eq!(s.reboots.get("remap-pend gpu5"), Some(&1));
        // Written back as format 3, in the same words.
        store.save(&s).unwrap();
        let text = fs::read_to_string(dir.join(FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], 3);
        assert_eq!(
            (v["xids"]["records"][0]["bus"].clone(), v["xids"]["records"][0]["source"].clone()),
            ("0000:61:00".into(), "kmsg".into())
        );
        assert_eq!(store.load("b1").unwrap(), s);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_an_error_stays_as_it_is_and_can_be_kept_aside() {
        let dir = tmp("bad");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(FILE), "{ nope").unwrap();
        let store = Store::new(&dir);
        assert!(matches!(store.load("x"), Err(LoadError::Corrupt(_))));
        assert_eq!(fs::read_to_string(dir.join(FILE)).unwrap(), "{ nope");
        let kept = store.set_aside(1_795_996_800).unwrap();
        assert_eq!(kept.file_name().unwrap(), "state.json.corrupt-2026-11-30T00-00-00Z");
        assert_eq!(fs::read_to_string(&kept).unwrap(), "{ nope");
        fs::write(dir.join(FILE), "{ nope again").unwrap();
        let second = store.set_aside(1_795_996_800).unwrap();
        assert_ne!(second, kept, "an older kept file is never replaced");
        assert!(store.load("x").unwrap().xids.is_empty(), "no file: a fresh state");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_of_another_version_is_refused_with_what_to_do() {
        let dir = tmp("format1");
        fs::create_dir_all(&dir).unwrap();
        for (old, which) in [
            (r#"{"boot_id":"b","xids":[],"drain":null,"pending":null,"clean_checks":0}"#, "format 1"),
            (r#"{"format":4,"boot_id":"b"}"#, "format 4"),
        ] {
            fs::write(dir.join(FILE), old).unwrap();
            let e = Store::new(&dir).load("b").unwrap_err();
            assert!(matches!(e, LoadError::Format(_)), "{e}");
            assert!(e.to_string().contains(which) && e.to_string().contains("move it away"), "{e}");
            assert_eq!(fs::read_to_string(dir.join(FILE)).unwrap(), old);
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_kernel_log_record_is_taken_in_once_and_records_at_the_same_time_each_once() {
        let mut s = State::default();
        assert!(s.take_kmsg(100, "79/0000:61:00"));
        assert!(s.take_kmsg(100, "79/0000:62:00"), "another GPU at the same microsecond");
        assert!(!s.take_kmsg(100, "79/0000:61:00"));
        assert!(!s.take_kmsg(99, "48/0000:61:00"), "older than the mark: a replay");
        assert!(s.take_kmsg(101, "79/0000:61:00"));
        assert_eq!(s.kmsg_mark.as_ref().map(|m| m.keys.len()), Some(1));
    }

    #[test]
    fn clears_are_bounded() {
        let mut s = State::default();
        for at in 0..100 {
            s.push_clear(ClearRecord { at, ..ClearRecord::default() });
        }
        assert_eq!(s.clears.len(), MAX_CLEARS);
        assert_eq!(s.clears[0].at, 100 - MAX_CLEARS as u64);
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
