//! The multi-line [`Scanner`]: a GPU lost without an Xid number, in every
//! form its message takes, and an Xid 79 with its companion line counted once
//! (see the [module docs](super)).

use super::logline::{MAX_MESSAGE_BYTES, logged, parse_body, truncate};
use super::{Event, LostRecord};
use slurm_formats::pci::{self, PciAddr};

/// How many lines a multi-line message or an Xid 79's companion line may
/// follow its first line.
const FOLLOW_LINES: u8 = 3;

/// Reads kernel-log text line by line and reports Xids and lost GPUs (see
/// the module docs): a multi-line "fallen off the bus" message counts once,
/// and so does an Xid 79 with its companion line.
#[derive(Clone, Debug, Default)]
pub struct Scanner {
    /// A probe-time message waiting for its "fallen off the bus" line.
    pending: Option<(LostRecord, u8)>,
    /// The bus of the last Xid 79, and how many more lines its companion may come in.
    last_79: Option<(PciAddr, u8)>,
}

impl Scanner {
    /// A scanner with nothing pending.
    pub fn new() -> Scanner {
        Scanner::default()
    }

    /// Takes one line; returns the events it completes.
    pub fn push(&mut self, line: &str) -> Vec<Event> {
        let line = line.trim_end_matches(['\n', '\r']);
        let mut out = Vec::new();
        if let Some((mut lost, left)) = self.pending.take() {
            // The rest of a probe-time message: dmesg indents it, syslog and
            // journald give each line its own header.
            let rest =
                if line.starts_with([' ', '\t']) { Some(line.trim()) } else { logged(line).map(|l| l.body) };
            match rest {
                Some(text) if text.starts_with("NVRM:") && text.contains("fallen off the bus") => {
                    lost.message =
                        truncate(&format!("{} {text}", lost.message), MAX_MESSAGE_BYTES).to_owned();
                    out.push(Event::Lost(lost));
                    return out;
                }
                Some(text) if text.starts_with("NVRM:") && left > 1 => {
                    lost.message =
                        truncate(&format!("{} {text}", lost.message), MAX_MESSAGE_BYTES).to_owned();
                    self.pending = Some((lost, left - 1));
                    return out;
                }
                _ => {}
            }
        }
        self.last_79 = self.last_79.take().and_then(|(bus, left)| (left > 1).then(|| (bus, left - 1)));
        let Some(logged) = logged(line) else { return out };
        if let Some(body) = parse_body(logged.body) {
            let record = body.into_record(logged.time, logged.monotonic_us);
            if record.xid == 79 {
                self.last_79 = Some((record.pci_bus_id, FOLLOW_LINES + 1));
            }
            out.push(Event::Xid(record));
            return out;
        }
        let body = logged.body;
        if let Some(rest) = body.strip_prefix("NVRM: The NVIDIA GPU ") {
            let Some(bus) = bus_token(rest) else { return out };
            let text = body.replace("\\x0a", " ");
            let lost = LostRecord {
                time: logged.time,
                monotonic_us: logged.monotonic_us,
                pci_bus_id: bus,
                message: truncate(&text, MAX_MESSAGE_BYTES).to_owned(),
            };
            if text.contains("fallen off the bus") {
                out.push(Event::Lost(lost));
            } else {
                self.pending = Some((lost, FOLLOW_LINES));
            }
        } else if let Some(rest) = body.strip_prefix("NVRM: GPU ") {
            let Some(bus) = bus_token(rest) else { return out };
            if !body.contains("has fallen off the bus") {
                return out;
            }
            let companion = self.last_79.as_ref().is_some_and(|(b, _)| *b == bus);
            if !companion {
                out.push(Event::Lost(LostRecord {
                    time: logged.time,
                    monotonic_us: logged.monotonic_us,
                    pci_bus_id: bus,
                    message: truncate(body, MAX_MESSAGE_BYTES).to_owned(),
                }));
            }
        }
        out
    }
}

/// A bus id at the start of `text` (`0000:b3:00.0`, up to a space, `:` + space
/// or an escaped newline), when [`PciAddr::parse`] reads it.
fn bus_token(text: &str) -> Option<PciAddr> {
    let end = text.find([' ', '\\']).unwrap_or(text.len()).min(pci::MAX_TEXT_BYTES + 1);
    let token = text.get(..end)?.trim_end_matches(':');
    PciAddr::parse(token).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Vec<Event> {
        let mut s = Scanner::new();
        text.lines().flat_map(|l| s.push(l)).collect()
    }

    fn lost_bus(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Lost(l) => Some(l.pci_bus_id.to_string()),
                Event::Xid(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_gpu_lost_at_probe_time_is_one_event_in_every_form() {
        let forms = [
            // dmesg: one record, its lines indented.
            "[    9.123456] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: 10de:20b0) installed in this system has\n               NVRM: fallen off the bus and is not responding to commands.",
            // syslog: one header per line.
            "Nov 22 18:29:55 gpu7 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0\nNov 22 18:29:55 gpu7 kernel: NVRM: (PCI ID: 10de:20b0) installed in this system has\nNov 22 18:29:55 gpu7 kernel: NVRM: fallen off the bus and is not responding to commands.",
            // /dev/kmsg: one record, the newlines escaped.
            "3,812,9123456,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:20b0) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
        ];
        for text in forms {
            let events = scan(text);
            assert_eq!(lost_bus(&events), ["0000:b3:00.0"], "{text}");
            assert_eq!(events.len(), 1, "{text}");
        }
        let Event::Lost(l) = &scan(forms[2])[0] else { panic!() };
        assert_eq!(l.monotonic_us, Some(9_123_456));
        assert!(l.message.contains("not responding to commands"), "{}", l.message);
    }

    #[test]
    fn the_companion_line_of_an_xid_79_counts_once() {
        let text = "[ 5.000001] NVRM: Xid (PCI:0000:b3:00): 79, pid=1, name=x, GPU has fallen off the bus.\n\
                    [ 5.000002] NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.\n\
                    [ 5.000003] NVRM: GPU at PCI:0000:b3:00: GPU-1234";
        let events = scan(text);
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(matches!(&events[0], Event::Xid(r) if r.xid == 79));
        // Alone (or after an Xid on another GPU), the companion line is a lost GPU.
        let alone = scan(
            "[ 5.000001] NVRM: Xid (PCI:0000:1b:00): 79, x\n[ 5.000002] NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.",
        );
        assert_eq!(lost_bus(&alone), ["0000:b3:00.0"]);
    }

    #[test]
    fn other_nvrm_lines_are_not_lost_gpus() {
        for text in [
            "NVRM: The NVIDIA GPU 0000:b3:00.0\nsomething else entirely\nNVRM: fallen off the bus and is not responding to commands.",
            "NVRM: GPU 0000:b3:00.0: RmInitAdapter failed!",
            "NVRM: The NVIDIA GPU zzzz is fine",
            "14,1,2,-;NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.",
        ] {
            assert!(lost_bus(&scan(text)).is_empty(), "{text}");
        }
    }
}
