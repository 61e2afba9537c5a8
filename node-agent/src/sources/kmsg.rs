//! Following the kernel log for Xid reports.
//!
//! `/dev/kmsg` gives every record since boot to a new reader, then new ones as
//! they come; the agent reads it non-blocking and polls. A regular file (tests,
//! or a log an admin points it at) is read from the start, then followed
//! through truncation and rotation (a new inode or a shorter file is read
//! again from its start). Records already seen are skipped by identity, so a
//! re-read never counts an Xid twice. Lines go through a [`Scanner`], which
//! also reports GPUs lost without an Xid number.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread;
use std::time::Duration;

use gpu_health::xid::{self, Event, Scanner};

use crate::policy::health::XidEvent;
use crate::sources::{self, Source};
use crate::store::{KmsgMark, kmsg_key};

/// Identities remembered to skip re-read records.
const MAX_SEEN: usize = 100_000;
/// Longest record kept; longer input is cut (kmsg records are at most 8 KiB).
const MAX_LINE: usize = 64 * 1024;

/// Reads Xid records from a kernel-log source.
#[derive(Debug)]
pub struct KmsgReader {
    path: PathBuf,
    file: Option<File>,
    inode: Option<(u64, u64)>,
    offset: u64,
    partial: Vec<u8>,
    seen: HashSet<String>,
    scanner: Scanner,
    /// Block in `read` instead of polling (a character device such as
    /// `/dev/kmsg`, followed by a thread that may wait there).
    blocking: bool,
}

impl KmsgReader {
    /// A reader of `path`; nothing is opened yet.
    pub fn new(path: &Path) -> KmsgReader {
        KmsgReader {
            path: path.to_owned(),
            file: None,
            inode: None,
            offset: 0,
            partial: Vec::new(),
            seen: HashSet::new(),
            scanner: Scanner::new(),
            blocking: false,
        }
    }

    /// A reader that waits in `read` for new records when `path` is a
    /// character device (`/dev/kmsg`): no polling while nothing happens.
    pub fn waiting(path: &Path) -> KmsgReader {
        let mut r = KmsgReader::new(path);
        r.blocking = std::fs::metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_char_device()
        });
        r
    }

    fn open(&mut self) -> io::Result<()> {
        // O_NONBLOCK: /dev/kmsg answers EAGAIN at the end instead of waiting.
        let flags = if self.blocking { 0 } else { libc::O_NONBLOCK };
        let file = OpenOptions::new().read(true).custom_flags(flags).open(&self.path)?;
        let m = file.metadata()?;
        self.inode = Some((m.dev(), m.ino()));
        self.file = Some(file);
        self.offset = 0;
        self.partial.clear();
        Ok(())
    }

    /// Whether a regular file was truncated or replaced since it was opened.
    fn rotated(&self) -> bool {
        let Ok(m) = std::fs::metadata(&self.path) else { return false };
        if !m.is_file() {
            return false;
        }
        Some((m.dev(), m.ino())) != self.inode || m.len() < self.offset
    }

    /// Every new Xid (or lost GPU) available now, without waiting.
    ///
    /// # Errors
    /// The source cannot be opened or read.
    pub fn poll(&mut self) -> io::Result<Vec<Event>> {
        if self.file.is_none() || self.rotated() {
            self.open()?;
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        while let Some(file) = self.file.as_mut() {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.offset += n as u64;
                    self.take_lines(buf.get(..n).unwrap_or_default(), &mut out);
                    if self.blocking {
                        // The next read would wait: hand over what we have.
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // /dev/kmsg: records were overwritten before we read them; go on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn take_lines(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        for chunk in bytes.split_inclusive(|b| *b == b'\n') {
            if self.partial.len() < MAX_LINE {
                let room = MAX_LINE - self.partial.len();
                self.partial.extend_from_slice(chunk.get(..chunk.len().min(room)).unwrap_or_default());
            }
            if chunk.ends_with(b"\n") {
                let line = String::from_utf8_lossy(&self.partial).trim_end().to_owned();
                self.partial.clear();
                for event in self.scanner.push(&line) {
                    if self.first_sighting(&line, &event) {
                        out.push(event);
                    }
                }
            }
        }
    }

    /// Records with the kernel's time are identified by (time, bus, Xid);
    /// others by their text.
    fn first_sighting(&mut self, line: &str, e: &Event) -> bool {
        let (us, bus, what) = match e {
            Event::Xid(r) => (r.monotonic_us, &r.pci_bus_id, r.xid),
            Event::Lost(l) => (l.monotonic_us, &l.pci_bus_id, xid::LOST_WITHOUT_XID),
        };
        let id = match us {
            Some(t) => format!("{t}/{bus}/{what}"),
            None => format!("{line}/{what}"),
        };
        if self.seen.len() >= MAX_SEEN {
            self.seen.clear();
        }
        self.seen.insert(id)
    }
}

/// The newest Xid (or lost-GPU) record in the kernel log now, as a mark:
/// after a state file is lost, what the log holds up to here is history the
/// agent no longer has (see [`crate::store::State::take_kmsg`]).
///
/// # Errors
/// The log cannot be opened or read.
pub fn newest(path: &Path) -> io::Result<Option<KmsgMark>> {
    let mut mark: Option<KmsgMark> = None;
    for e in KmsgReader::new(path).poll()? {
        let x = XidEvent::from_kmsg(&e);
        let Some(us) = x.kmsg_us else { continue };
        let key = kmsg_key(x.xid, x.bus);
        match &mut mark {
            Some(m) if m.us > us => {}
            Some(m) if m.us == us => m.keys.push(key),
            _ => mark = Some(KmsgMark { us, keys: vec![key] }),
        }
    }
    Ok(mark)
}

/// Follows `path` on a thread and sends each new Xid as an event, until
/// `stop` is set: waiting in `read` on `/dev/kmsg`, polling a regular file
/// every `interval`.
pub fn follow(
    path: PathBuf,
    interval: Duration,
    tx: Sender<XidEvent>,
    stop: Arc<AtomicBool>,
) -> io::Result<()> {
    thread::Builder::new().name("kmsg".to_owned()).spawn(move || {
        let mut reader = KmsgReader::waiting(&path);
        while !stop.load(Ordering::Relaxed) {
            match reader.poll() {
                Ok(records) => {
                    if sources::set(Source::Kmsg, true) == Some(false) {
                        tracing::info!(path = %path.display(), "reading the kernel log again");
                    }
                    for e in &records {
                        if tx.send(XidEvent::from_kmsg(e)).is_err() {
                            return;
                        }
                    }
                    if reader.blocking {
                        continue;
                    }
                }
                Err(e) => {
                    if sources::set(Source::Kmsg, false) != Some(false) {
                        tracing::warn!(
                            path = %path.display(),
                            error = %e,
                            "cannot read the kernel log: Xids are now seen only through NVML events \
                             (when available), and ECC, remapped rows and lost GPUs are still checked \
                             every poll_interval; retrying"
                        );
                    }
                    reader.file = None;
                }
            }
            thread::sleep(interval);
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kmsg-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const XID79: &str =
        "6,1001,5000000,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.\n";
    const XID13: &str = "4,1002,6000000,-;NVRM: Xid (PCI:0000:1b:00): 13, Graphics Exception\n";

    fn xids(events: Vec<Event>) -> Vec<u32> {
        events.iter().map(|e| XidEvent::from_kmsg(e).xid).collect()
    }

    #[test]
    fn reads_from_the_start_then_follows_appends() {
        let d = tmpdir("follow");
        let p = d.join("kmsg");
        std::fs::write(&p, format!("6,1,1,-;hello\n{XID79}")).unwrap();
        let mut r = KmsgReader::new(&p);
        let got = xids(r.poll().unwrap());
        assert_eq!(got, [79]);
        assert!(r.poll().unwrap().is_empty());

        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(XID13.as_bytes()).unwrap();
        assert_eq!(xids(r.poll().unwrap()), [13]);
    }

    #[test]
    fn a_line_split_across_reads_is_joined() {
        let d = tmpdir("split");
        let p = d.join("kmsg");
        let (a, b) = XID79.split_at(30);
        std::fs::write(&p, a).unwrap();
        let mut r = KmsgReader::new(&p);
        assert!(r.poll().unwrap().is_empty());
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b.as_bytes()).unwrap();
        assert_eq!(r.poll().unwrap().len(), 1);
    }

    #[test]
    fn truncation_and_rotation_are_followed_without_double_counting() {
        let d = tmpdir("rotate");
        let p = d.join("kmsg");
        std::fs::write(&p, XID79).unwrap();
        let mut r = KmsgReader::new(&p);
        assert_eq!(r.poll().unwrap().len(), 1);

        // Truncated, then the same record and a new one written again.
        std::fs::write(&p, "").unwrap();
        assert!(r.poll().unwrap().is_empty());
        std::fs::write(&p, format!("{XID79}{XID13}")).unwrap();
        assert_eq!(xids(r.poll().unwrap()), [13], "79 was seen already");

        // Rotated: a new file under the same name.
        std::fs::rename(&p, d.join("kmsg.1")).unwrap();
        std::fs::write(&p, "6,1003,7000000,-;NVRM: Xid (PCI:0000:61:00): 48, DBE\n").unwrap();
        assert_eq!(xids(r.poll().unwrap()), [48]);
    }

    #[test]
    fn a_gpu_lost_without_an_xid_is_an_event_once() {
        let d = tmpdir("lost");
        let p = d.join("kmsg");
        let lost = "3,900,7100000,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:20b0) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n";
        std::fs::write(
            &p,
            format!("{XID79}6,1002,5000001,-;NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.\n{lost}"),
        )
        .unwrap();
        let mut r = KmsgReader::new(&p);
        let got: Vec<XidEvent> = r.poll().unwrap().iter().map(XidEvent::from_kmsg).collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].xid, 79, "the companion line of the Xid 79 is the same event");
        assert_eq!(
            (got[1].xid, got[1].bus.map(slurm_formats::pci::PciAddr::kernel), got[1].kmsg_us),
            (xid::LOST_WITHOUT_XID, Some("0000:b3:00".to_owned()), Some(7_100_000))
        );
        std::fs::write(&p, format!("{XID79}{lost}")).unwrap();
        assert!(r.poll().unwrap().is_empty(), "a re-read counts nothing twice");
    }

    #[test]
    fn a_missing_source_is_an_error_not_a_panic() {
        let mut r = KmsgReader::new(Path::new("/nonexistent/kmsg"));
        assert!(r.poll().is_err());
    }
}
