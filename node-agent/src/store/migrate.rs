//! Reading a state file of format 2, which listed every Xid seen this boot
//! one by one: the list becomes one record per (Xid, GPU) with its count, and
//! what a clear covered stays cleared.

use serde::Deserialize;
use serde_json::Value;

use super::xids::{XidBook, XidRecord};
use super::{KmsgMark, kmsg_key};
use crate::policy::health::XidSource;

/// One Xid as format 2 wrote it.
#[derive(Deserialize)]
struct SeenXid {
    xid: u32,
    #[serde(default)]
    gpu: Option<u32>,
    #[serde(default, with = "super::bus_form")]
    bus: Option<slurm_formats::pci::PciAddr>,
    #[serde(with = "super::source_form")]
    source: XidSource,
    #[serde(default)]
    kmsg_us: Option<u64>,
    #[serde(default)]
    cleared: bool,
}

/// A clear as format 2 wrote it (the fields the conversion needs).
#[derive(Deserialize)]
struct Clear {
    #[serde(default)]
    gpu: Option<u32>,
    #[serde(default)]
    kmsg_us: Option<u64>,
}

/// Format 2's `xids` list, and its clears, as a book and the mark of the
/// newest kernel-log record taken in.
///
/// # Errors
/// The list or the clears do not read as format 2 wrote them.
pub fn xids_of_format_2(xids: &Value, clears: &Value) -> Result<(XidBook, Option<KmsgMark>), String> {
    let seen: Vec<SeenXid> = Vec::deserialize(xids).map_err(|e| format!("xids: {e}"))?;
    let clears: Vec<Clear> = Vec::deserialize(clears).map_err(|e| format!("clears: {e}"))?;
    let mut book = XidBook::default();
    let mut mark: Option<KmsgMark> = None;
    for s in seen {
        let covered = s.cleared
            || clears.iter().any(|c| {
                (c.gpu.is_none() || c.gpu == s.gpu)
                    && matches!((s.kmsg_us, c.kmsg_us), (Some(at), Some(until)) if at <= until)
            });
        if let (Some(us), XidSource::Kmsg) = (s.kmsg_us, s.source) {
            let key = kmsg_key(s.xid, s.bus);
            match &mut mark {
                Some(m) if m.us > us => {}
                Some(m) if m.us == us => m.keys.push(key),
                _ => mark = Some(KmsgMark { us, keys: vec![key] }),
            }
        }
        book.insert_record(XidRecord {
            xid: s.xid,
            gpu: s.gpu,
            bus: s.bus,
            source: s.source,
            count: 1,
            cleared: u64::from(covered),
            first_at: 0,
            last_at: 0,
            first_us: s.kmsg_us,
            last_us: s.kmsg_us,
            fatal: None,
        });
    }
    Ok((book, mark))
}
