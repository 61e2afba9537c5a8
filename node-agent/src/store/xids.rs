//! This boot's Xids, bounded whatever the uptime: one [`XidRecord`] per
//! (Xid, GPU) with its first and last time and a count, found in constant
//! time; Xids the policy ignores are only counted, per Xid number
//! ([`XidBook::ignored`]). A crash-looping job's Xid 43 on every GPU is eight
//! counters, not a list that grows with every crash.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use slurm_formats::pci::PciAddr;

use crate::policy::health::XidSource;

/// The most records kept: (Xid, GPU) pairs, so far more than a node's GPUs
/// times the Xids the policy acts on. A new pair past it replaces the one
/// seen least lately that the caller lets go (never one that needs a drain).
pub const MAX_RECORDS: usize = 256;

/// Every occurrence of one Xid on one GPU this boot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidRecord {
    /// The Xid (or a lost GPU, [`gpu_health::xid::LOST_WITHOUT_XID`]).
    pub xid: u32,
    /// NVML index of the GPU, when known.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Bus id, when known; written in the kernel log's form (`0000:3b:00`).
    #[serde(default, with = "super::bus_form")]
    pub bus: Option<PciAddr>,
    /// Where it was seen first; written `nvml` or `kmsg`.
    #[serde(with = "super::source_form")]
    pub source: XidSource,
    /// Occurrences, each event once however many sources reported it.
    pub count: u64,
    /// Occurrences an admin's `clear` (or a resume by someone else) covered:
    /// the record counts while `count > cleared`.
    #[serde(default)]
    pub cleared: u64,
    /// When the agent first and last took it in (seconds since the epoch).
    #[serde(default)]
    pub first_at: u64,
    /// See `first_at`.
    #[serde(default)]
    pub last_at: u64,
    /// The kernel's times of the first and last kernel-log record of it
    /// (microseconds since boot).
    #[serde(default)]
    pub first_us: Option<u64>,
    /// See `first_us`.
    #[serde(default)]
    pub last_us: Option<u64>,
    /// An NVLink5 Xid decoded from the kernel log's message as needing a GPU
    /// reset, since the last clear ([`gpu_health::nvlink5`]), and what it said.
    #[serde(default)]
    pub fatal: Option<String>,
}

impl XidRecord {
    /// Whether it still counts: occurrences after the last clear.
    pub fn counts(&self) -> bool {
        self.count > self.cleared
    }

    /// Every occurrence so far no longer counts.
    pub fn clear(&mut self) {
        self.cleared = self.count;
        self.fatal = None;
    }
}

/// One occurrence, as [`XidBook::add`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occurrence {
    /// The Xid.
    pub xid: u32,
    /// NVML index, when known.
    pub gpu: Option<u32>,
    /// Bus id, when known.
    pub bus: Option<PciAddr>,
    /// Where it was seen.
    pub source: XidSource,
    /// Kernel time of a kernel-log record.
    pub kmsg_us: Option<u64>,
    /// Seconds since the epoch.
    pub at: u64,
    /// An NVLink5 decoding that needs a GPU reset: what it said.
    pub fatal: Option<String>,
}

/// How a record is found: by bus id where known, else by NVML index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Bus(u32, PciAddr),
    Index(u32, u32),
    Unknown(u32),
}

fn keys(xid: u32, gpu: Option<u32>, bus: Option<PciAddr>) -> (Option<Key>, Key) {
    let by_bus = bus.map(|b| Key::Bus(xid, b));
    let other = gpu.map_or(Key::Unknown(xid), |g| Key::Index(xid, g));
    (by_bus, other)
}

/// This boot's Xid records and ignored-Xid counts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "Stored", into = "Stored")]
pub struct XidBook {
    records: Vec<XidRecord>,
    /// Ignored Xids seen this boot, by Xid number.
    pub ignored: BTreeMap<u32, u64>,
    index: HashMap<Key, usize>,
}

impl PartialEq for XidBook {
    /// The same records and counts (the index follows from the records).
    fn eq(&self, other: &XidBook) -> bool {
        self.records == other.records && self.ignored == other.ignored
    }
}

impl Eq for XidBook {}

/// [`XidBook`] on disk: the records and the counts; the index is rebuilt.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Stored {
    #[serde(default)]
    records: Vec<XidRecord>,
    #[serde(default)]
    ignored: BTreeMap<u32, u64>,
}

impl From<Stored> for XidBook {
    fn from(s: Stored) -> XidBook {
        let mut book = XidBook { ignored: s.ignored, ..XidBook::default() };
        for r in s.records {
            book.insert_record(r);
        }
        book
    }
}

impl From<XidBook> for Stored {
    fn from(b: XidBook) -> Stored {
        Stored { records: b.records, ignored: b.ignored }
    }
}

impl XidBook {
    /// The records, in the order they were first seen.
    pub fn records(&self) -> &[XidRecord] {
        &self.records
    }

    /// How many records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record of (Xid, GPU), found by bus id or NVML index.
    pub fn get(&self, xid: u32, gpu: Option<u32>, bus: Option<PciAddr>) -> Option<&XidRecord> {
        self.find(xid, gpu, bus).and_then(|i| self.records.get(i))
    }

    fn find(&self, xid: u32, gpu: Option<u32>, bus: Option<PciAddr>) -> Option<usize> {
        let (by_bus, other) = keys(xid, gpu, bus);
        by_bus.and_then(|k| self.index.get(&k)).or_else(|| self.index.get(&other)).copied()
    }

    fn reindex(&mut self) {
        self.index.clear();
        for (i, r) in self.records.iter().enumerate() {
            let (by_bus, other) = keys(r.xid, r.gpu, r.bus);
            if let Some(k) = by_bus {
                self.index.insert(k, i);
            }
            self.index.entry(other).or_insert(i);
        }
    }

    /// Adds a record of its own (a merge, a migration): counts add up with
    /// a record of the same (Xid, GPU).
    pub fn insert_record(&mut self, r: XidRecord) {
        match self.find(r.xid, r.gpu, r.bus) {
            Some(i) => {
                let k = &mut self.records[i];
                k.count = k.count.saturating_add(r.count);
                k.cleared = k.cleared.saturating_add(r.cleared);
                k.first_at = match (k.first_at, r.first_at) {
                    (0, b) => b,
                    (a, 0) => a,
                    (a, b) => a.min(b),
                };
                k.last_at = k.last_at.max(r.last_at);
                k.first_us = match (k.first_us, r.first_us) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                k.last_us = k.last_us.max(r.last_us);
                k.gpu = k.gpu.or(r.gpu);
                k.bus = k.bus.or(r.bus);
                if r.fatal.is_some() {
                    k.fatal = r.fatal;
                }
                self.reindex_one(i);
            }
            None => {
                self.records.push(r);
                self.reindex_one(self.records.len() - 1);
            }
        }
    }

    fn reindex_one(&mut self, i: usize) {
        let r = &self.records[i];
        let (by_bus, other) = keys(r.xid, r.gpu, r.bus);
        if let Some(k) = by_bus {
            self.index.insert(k, i);
        }
        self.index.entry(other).or_insert(i);
    }

    /// Takes in one occurrence in constant time (past [`MAX_RECORDS`], a new
    /// (Xid, GPU) first replaces the least lately seen record `evictable` lets go).
    pub fn add(&mut self, o: &Occurrence, evictable: impl Fn(&XidRecord) -> bool) {
        if let Some(i) = self.find(o.xid, o.gpu, o.bus) {
            let r = &mut self.records[i];
            r.count = r.count.saturating_add(1);
            r.last_at = o.at;
            r.last_us = o.kmsg_us.or(r.last_us);
            if r.first_us.is_none() {
                r.first_us = o.kmsg_us;
            }
            let learned = (r.gpu.is_none() && o.gpu.is_some()) || (r.bus.is_none() && o.bus.is_some());
            r.gpu = r.gpu.or(o.gpu);
            r.bus = r.bus.or(o.bus);
            if o.fatal.is_some() {
                r.fatal.clone_from(&o.fatal);
            }
            if learned {
                self.reindex_one(i);
            }
            return;
        }
        if self.records.len() >= MAX_RECORDS {
            let victim = (0..self.records.len())
                .filter(|&i| evictable(&self.records[i]))
                .min_by_key(|&i| self.records[i].last_at);
            if let Some(i) = victim {
                self.records.remove(i);
                self.reindex();
            }
        }
        self.records.push(XidRecord {
            xid: o.xid,
            gpu: o.gpu,
            bus: o.bus,
            source: o.source,
            count: 1,
            cleared: 0,
            first_at: o.at,
            last_at: o.at,
            first_us: o.kmsg_us,
            last_us: o.kmsg_us,
            fatal: o.fatal.clone(),
        });
        self.reindex_one(self.records.len() - 1);
    }

    /// Counts an ignored Xid.
    pub fn ignore(&mut self, xid: u32) {
        let n = self.ignored.entry(xid).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// Every record, to change in place (a clear); the (Xid, GPU) of each stays.
    pub fn records_mut(&mut self) -> impl Iterator<Item = &mut XidRecord> {
        self.records.iter_mut()
    }

    /// Adds everything in `other` (what this process saw since the last save).
    pub fn merge(&mut self, other: &XidBook) {
        for r in &other.records {
            self.insert_record(r.clone());
        }
        for (xid, n) in &other.ignored {
            let mine = self.ignored.entry(*xid).or_insert(0);
            *mine = mine.saturating_add(*n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occ(xid: u32, gpu: Option<u32>, bus: Option<&str>, at: u64) -> Occurrence {
        Occurrence {
            xid,
            gpu,
            bus: bus.and_then(|b| PciAddr::parse(b).ok()),
            source: XidSource::Kmsg,
            kmsg_us: Some(at * 1000),
            at,
            fatal: None,
        }
    }

    #[test]
    fn one_record_per_xid_and_gpu_with_its_times_and_count() {
        let mut b = XidBook::default();
        for t in 1..=100_000 {
            b.add(&occ(79, None, Some("0000:61:00"), t), |_| true);
        }
        b.add(&occ(79, Some(3), Some("0000:61:00"), 100_001), |_| true);
        // The NVML index alone finds the record once it learned both.
        b.add(&occ(79, Some(3), None, 100_002), |_| true);
        b.add(&occ(48, Some(3), None, 7), |_| true);
        assert_eq!(b.len(), 2);
        let r = &b.records()[0];
        assert_eq!((r.count, r.first_at, r.last_at, r.gpu), (100_002, 1, 100_002, Some(3)));
        assert_eq!((r.first_us, r.last_us), (Some(1000), Some(100_002_000)));
        let text = serde_json::to_string(&b).unwrap();
        assert!(text.len() < 1000, "{text}");
        let back: XidBook = serde_json::from_str(&text).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn a_clear_covers_what_was_counted_and_a_new_occurrence_counts_again() {
        let mut b = XidBook::default();
        b.add(&Occurrence { fatal: Some("RLW_REMAP".into()), ..occ(145, Some(1), None, 1) }, |_| true);
        b.records_mut().for_each(XidRecord::clear);
        assert!(!b.records()[0].counts() && b.records()[0].fatal.is_none());
        b.add(&occ(145, Some(1), None, 2), |_| true);
        assert!(b.records()[0].counts());
    }

    #[test]
    fn the_book_is_bounded_and_keeps_what_it_must() {
        let mut b = XidBook::default();
        let max = u32::try_from(MAX_RECORDS).unwrap();
        for x in 0..max * 2 {
            b.add(&occ(1000 + x, Some(0), None, u64::from(x) + 1), |r| r.xid != 1000);
        }
        assert_eq!(b.len(), MAX_RECORDS);
        assert!(b.records().iter().any(|r| r.xid == 1000), "a record the caller keeps stays");
        assert!(b.records().iter().any(|r| r.xid == 1000 + max * 2 - 1));
        for x in 0..100 {
            b.ignore(43 + x % 2);
        }
        assert_eq!(b.ignored.get(&43), Some(&50));
    }

    #[test]
    fn merging_adds_counts() {
        let mut a = XidBook::default();
        a.add(&occ(79, Some(3), None, 1), |_| true);
        a.ignore(43);
        let mut b = XidBook::default();
        b.add(&occ(79, Some(3), None, 5), |_| true);
        b.add(&occ(48, Some(2), None, 6), |_| true);
        b.ignore(43);
        a.merge(&b);
        assert_eq!(a.len(), 2);
        assert_eq!((a.records()[0].count, a.records()[0].last_at), (2, 5));
        assert_eq!(a.ignored.get(&43), Some(&2));
    }
}
