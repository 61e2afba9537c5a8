//! What the agent must remember across restarts: the drain it made (to
//! resume only that, and only while the reason is still exactly its own), the
//! Xids seen this boot, and its counters. One JSON file in `state_dir`,
//! replaced atomically.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name inside `state_dir`.
const FILE: &str = "state.json";

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

/// An Xid seen this boot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenXid {
    /// The Xid.
    pub xid: u32,
    /// NVML index of the GPU, when known.
    pub gpu: Option<u32>,
    /// Bus id (normalized), when known.
    pub bus: Option<String>,
    /// `nvml` or `kmsg`.
    pub source: String,
}

/// The persisted state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// The boot these Xids belong to.
    pub boot_id: String,
    /// Xids seen this boot (they stay faults until a reboot).
    pub xids: Vec<SeenXid>,
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
}

/// Reads and writes the state file.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// A store in `dir` (created on first save).
    pub fn new(dir: &Path) -> Store {
        Store { dir: dir.to_owned() }
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The saved state, for the boot `boot_id`: Xids of an earlier boot are
    /// dropped. A missing file is a fresh state; an unreadable one is an error
    /// (the agent then runs without it and says so).
    ///
    /// # Errors
    /// The file exists but cannot be read or parsed.
    pub fn load(&self, boot_id: &str) -> Result<State, String> {
        let path = self.path();
        let mut state: State = match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if state.boot_id != boot_id {
            state.xids.clear();
            state.boot_id = boot_id.to_owned();
        }
        Ok(state)
    }

    /// Writes the state: a temporary file, fsync, rename over the old one.
    ///
    /// # Errors
    /// The directory cannot be created or written (full, read-only, ...).
    pub fn save(&self, state: &State) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", self.path().display());
        fs::create_dir_all(&self.dir).map_err(fail)?;
        let text = serde_json::to_string_pretty(state).map_err(|e| e.to_string())?;
        let tmp = self.dir.join(format!(".{FILE}.tmp"));
        let mut f = fs::File::create(&tmp).map_err(fail)?;
        f.write_all(text.as_bytes()).map_err(fail)?;
        f.sync_all().map_err(fail)?;
        fs::rename(&tmp, self.path()).map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_forgets_xids_of_another_boot() {
        let dir = std::env::temp_dir().join(format!("agent-state-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = Store::new(&dir);
        let mut s = store.load("boot-a").unwrap();
        assert_eq!(s, State { boot_id: "boot-a".into(), ..State::default() });
        s.xids.push(SeenXid { xid: 79, gpu: Some(3), bus: None, source: "nvml".into() });
        s.drain = Some(DrainRecord { reason: "gpu: xid79 gpu3".into(), ..DrainRecord::default() });
        store.save(&s).unwrap();
        assert_eq!(store.load("boot-a").unwrap(), s);
        let after_reboot = store.load("boot-b").unwrap();
        assert!(after_reboot.xids.is_empty());
        assert!(after_reboot.drain.is_some(), "the drain record survives the reboot");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("agent-state-bad-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(FILE), "{ nope").unwrap();
        assert!(Store::new(&dir).load("x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
