//! NVIDIA Xid reports in kernel-log text, and the default Xid policy.
//!
//! The NVIDIA driver reports GPU errors as kernel messages of the form
//!
//! ```text
//! NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
//! ```
//!
//! [`parse_line`] finds them in every form an admin meets, and [`default_action`]
//! says what the node agent does about each Xid by default.
//!
//! # Log forms
//!
//! | form | example prefix before `NVRM: Xid` | `time` | `monotonic_us` |
//! | --- | --- | --- | --- |
//! | `/dev/kmsg` record | `6,1234,5678901,-;` | `"5.678901"` (seconds since boot, as `dmesg` prints them) | `5678901` |
//! | `dmesg` | `[ 1234.567890] ` | `"1234.567890"` | `1234567890` |
//! | `dmesg -T` | `[Fri Jan 29 23:42:34 2021] ` | `"Fri Jan 29 23:42:34 2021"` | none |
//! | syslog, journalctl (short) | `Nov 22 18:29:55 host kernel: ` | `"Nov 22 18:29:55"` | none |
//! | the same with the kernel's timestamp | `Nov 22 18:29:55 host kernel: [ 966.503025] ` | `"Nov 22 18:29:55"` | `966503025` |
//! | journalctl `-o short-precise` | `Nov 22 18:29:55.123456 host kernel: ` | `"Nov 22 18:29:55.123456"` | none |
//! | journalctl `-o short-iso[-precise]`, rsyslog RFC 3339 | `2024-08-19T21:36:23+0200 host kernel: ` | `"2024-08-19T21:36:23+0200"` | none |
//! | journalctl `-o short-full` | `Mon 2024-08-19 21:36:23 CEST host kernel: ` | `"Mon 2024-08-19 21:36:23 CEST"` | none |
//! | journalctl `-o short-unix` | `1724096183.123456 host kernel: ` | `"1724096183.123456"` | none |
//! | journalctl `-o short-monotonic` | `[ 1234.567890] host kernel: ` | `"1234.567890"` | `1234567890` |
//! | `dmesg --time-format iso` | `2024-08-19T21:36:23,123456+02:00 ` | that text | none |
//! | journal line with its header cut off | `kernel: ` | none | none |
//! | the bare message | (nothing) | none | none |
//!
//! A `[...]` prefix that is not a timestamp (documentation writes `[…]`) is
//! skipped, and so is a `[T123]` caller id (`CONFIG_PRINTK_CALLER`) after the
//! timestamp. `time` is the timestamp text exactly as written, except for kmsg,
//! whose raw microseconds are written as `dmesg` would show them.
//! `monotonic_us` is filled only where the line carries the kernel's own time
//! since boot, so one event seen both through NVML and the kernel log can be
//! de-duplicated by (bus id, Xid, time).
//!
//! The Xid itself is recognized in every shape the driver has printed:
//! `Xid (PCI:0000:3b:00): 79, ...`, the pre-2015 `Xid (0000:3b:00): 79, ...`
//! without `PCI:`, and MIG's `Xid (PCI:0000:3b:00 GPU-I:05 GPU-CI:02): 94, ...`
//! (the instance ids are not kept). `pid=` and `name=` are optional and
//! independent; `pid='<unknown>'` gives no pid, and `name=<unknown>` is kept as
//! written.
//!
//! # What is not an Xid report
//!
//! Other `NVRM:` lines (`NVRM: GPU at PCI:...`, `NVRM: Rate limiting ...`,
//! `... critical error 79.`), kmsg continuation lines (they start with a
//! space: ` SUBSYSTEM=pci`), and any line whose prefix is not one of the forms
//! above. The strictness is deliberate: a syslog line is accepted only with
//! the `kernel:` tag, so text that other programs log (an ssh user name, a
//! job's output) cannot pass for an Xid. A kmsg record is accepted only with
//! facility 0 (kernel): the kernel stamps everything user space writes to
//! `/dev/kmsg` with a non-zero facility. A local user can still forge a
//! `kernel:` line in syslog with `logger -t kernel`, so decisions that drain
//! nodes should come from `/dev/kmsg` or NVML, not from syslog files.
//!
//! The input is untrusted: parsing never panics, never indexes out of range,
//! keeps at most [`MAX_MESSAGE_BYTES`] of the message and [`MAX_PROCESS_BYTES`]
//! of the process name, and does work linear in the line's length.
//!
//! # Default policy
//!
//! From NVIDIA's Xid catalog ([`CATALOG`]: the "Catalog" sheet of
//! docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as published
//! on 2025-10-29), DCGM's health rules and what other health agents do (the
//! project's field research, §3.1): never drain for application errors, drain
//! for what NVIDIA's immediate resolution says needs a GPU reset (`RESET_GPU`)
//! or a reboot (`RESTART_BM`), and leave memory Xids to NVML's remapped-rows
//! state, which is the driver's structured verdict. Any Xid not listed is
//! [`Action::Warn`].
//!
//! | Xid | meaning | action | why |
//! | --- | --- | --- | --- |
//! | 13 | graphics engine exception | ignore | application error (NVIDIA: restart the app) |
//! | 31 | GPU memory page fault | ignore | application error (illegal address in the job) |
//! | 43 | GPU stopped processing (channel reset) | ignore | application error; the channel is reset, the GPU is fine |
//! | 45 | preemptive cleanup, due to previous errors | ignore | follows another Xid, whose own action applies |
//! | 46 | GPU stopped processing | drain | NVIDIA: reset the GPU |
//! | 48 | double-bit ECC error | drain | DCGM fails it; needs a reboot, RMA if it comes back |
//! | 62 | internal micro-controller halt | drain | NVIDIA: reset the GPU |
//! | 63 | ECC page retirement or row remap recorded | warn | acted on through NVML's remapped-rows state |
//! | 64 | ECC page retirement or row remap failure | drain | DCGM fails it; RMA candidate, a reboot does not fix it |
//! | 68 | video decoder (NVDEC) exception | warn | usually the application; the sources disagree |
//! | 74 | NVLink error | drain | DCGM fails it; needs the link inspected |
//! | 79 | GPU has fallen off the bus | drain | only a reboot brings the GPU back |
//! | 92 | high single-bit ECC error rate | warn | corrected errors; a trend to watch |
//! | 94 | contained ECC error | warn | the job was killed, the GPU is usable; NVML row remap state decides the reset |
//! | 95 | uncontained ECC error | drain | NVIDIA: reset the GPU |
//! | 109 | context switch timeout | drain | NVIDIA: reset the GPU |
//! | 119 | GSP RPC timeout | drain | GSP errors rarely clear without a reboot |
//! | 120 | GSP error | drain | as 119 |
//! | 136 | NVLink link training failed | drain | NVIDIA: reset the GPU |
//! | 140 | unrecovered ECC error | drain | DCGM fails it; reset the GPU |
//! | 143 | GPU initialization error | drain | NVIDIA: reset the GPU |
//! | 144 | NVLink SAW error | warn | NVLink5: drain when the kernel log's message (unit, error status, sub-code) decodes as an event NVIDIA's catalog resolves with a GPU reset ([`crate::nvlink5`]); an NVML event carries no message |
//! | 145 | NVLink RLW error | warn | NVLink5, as 144 |
//! | 146 | NVLink TLW error | warn | NVLink5, as 144 |
//! | 147 | NVLink TREX error | warn | NVLink5, as 144 |
//! | 148 | NVLink NVLPW error | warn | NVLink5, as 144 |
//! | 149 | NVLink NETIR error | warn | NVLink5, as 144 (the link-down reason is the sub-code) |
//! | 150 | NVLink MSE error | warn | NVLink5, as 144 |
//! | 154 | GPU recovery action changed | warn | informational; read NVML's recovery action |
//! | 155 | NVLink software-defined error | drain | NVIDIA: reset the GPU |
//! | 156 | resource retirement event | drain | NVIDIA: reset the GPU |
//! | 158 | GPU fatal timeout | drain | NVIDIA: reset the GPU |
//! | 167 | PCIe fatal timeout | warn | the catalog gives no resolution yet |
//! | 169 | internal micro-controller halt (SEC2) | warn | the catalog gives no resolution yet |
//! | other | | warn | unknown: report, never drain |
//!
//! # A GPU lost without an Xid number
//!
//! A GPU that is off the bus when the driver probes it gets no Xid, only
//!
//! ```text
//! NVRM: The NVIDIA GPU 0000:b3:00.0
//! NVRM: (PCI ID: 10de:20b0) installed in this system has
//! NVRM: fallen off the bus and is not responding to commands.
//! ```
//!
//! one record in `/dev/kmsg` (newlines escaped as `\x0a`), several lines in
//! `dmesg` and syslog. An Xid 79 is followed by the companion line
//! `NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.`. A [`Scanner`], fed
//! the log line by line, reports both as [`Event::Lost`], except a companion
//! line right after an Xid 79 on the same GPU: that is the same event.
//!
//! # NVML's recovery action
//!
//! The driver's own verdict per GPU (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`),
//! named by [`recovery_action_name`]: 0 none, 1 GPU reset, 2 node reboot,
//! 3 drain peer-to-peer traffic, 4 drain and reset, 5 recover the IMEX domain,
//! 6 bus reset, 7 system reboot (NVML's change log adds 5 in r590 and 6-7 in
//! r615).

use std::fmt;

use crate::pci::{self, PciAddr};

/// The most bytes of an Xid's message text kept in [`XidRecord::message`]
/// (the kernel itself prints at most about 1 KiB per record).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The most bytes of the `name=` field kept in [`XidRecord::process`]
/// (Linux process names are at most 15 bytes).
pub const MAX_PROCESS_BYTES: usize = 64;

/// The longest bracketed timestamp (`[...]`) looked at, in bytes.
const MAX_BRACKET_BYTES: usize = 64;
/// The longest `(PCI:... GPU-I:.. GPU-CI:..)` group looked at, in bytes.
const MAX_PAREN_BYTES: usize = 96;
/// The longest host name accepted in a syslog header.
const MAX_HOST_BYTES: usize = 255;

const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// One Xid report from the kernel log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidRecord {
    /// The line's timestamp as written (see the module docs for each form);
    /// for a kmsg record its microseconds since boot as `dmesg` shows them
    /// (`5678901` → `"5.678901"`). `None` when the line has no timestamp.
    pub time: Option<String>,
    /// The kernel's time since boot in microseconds, for kmsg records and for
    /// lines carrying a `[ 1234.567890]` kernel timestamp; `None` otherwise.
    pub monotonic_us: Option<u64>,
    /// The GPU's bus id, written in the log without a function
    /// (`PCI:0000:3b:00`): it prints as `0000:3b:00` and equals NVML's
    /// `00000000:3B:00.0`.
    pub pci_bus_id: PciAddr,
    /// The Xid number.
    pub xid: u32,
    /// The `pid=` field when it is a number (`pid='<unknown>'` gives `None`).
    pub pid: Option<u32>,
    /// The `name=` field as written (`<unknown>` included), at most
    /// [`MAX_PROCESS_BYTES`].
    pub process: Option<String>,
    /// The text after `NN, ` and after the `pid=` and `name=` fields when they
    /// are there, trailing whitespace removed, at most [`MAX_MESSAGE_BYTES`].
    pub message: String,
}

/// Parses one line of kernel-log text. Returns `None` for anything that is
/// not an NVIDIA Xid report in one of the forms in the module docs.
///
/// A trailing `\n` or `\r\n` is ignored; a line that starts with whitespace is
/// a kmsg continuation line and never an Xid report.
pub fn parse_line(line: &str) -> Option<XidRecord> {
    let logged = logged(line)?;
    let body = parse_body(logged.body)?;
    Some(body.into_record(logged.time, logged.monotonic_us))
}

/// The catalog the default policy and the meanings follow: NVIDIA's Xid
/// catalog, "Catalog" sheet, as published on this date.
pub const CATALOG: &str =
    "NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), 2025-10-29";

/// The number the agent gives a GPU the driver reports fallen off the bus
/// without an Xid number ([`Event::Lost`]). NVIDIA numbers Xids from 1.
pub const LOST_WITHOUT_XID: u32 = 0;

/// What NVML's recovery action `code` asks for, in words (see the module
/// docs); `None` for a code this table does not know.
pub fn recovery_action_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "none",
        1 => "GPU reset",
        2 => "node reboot",
        3 => "drain peer-to-peer traffic",
        4 => "drain and reset",
        5 => "recover the IMEX domain",
        6 => "bus reset",
        7 => "system reboot",
        _ => return None,
    })
}

/// A GPU the driver reports fallen off the bus without an Xid number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostRecord {
    /// The line's timestamp, as in [`XidRecord::time`].
    pub time: Option<String>,
    /// The kernel's time since boot, as in [`XidRecord::monotonic_us`].
    pub monotonic_us: Option<u64>,
    /// The bus id, written with a function (`0000:b3:00.0`, and prints so).
    pub pci_bus_id: PciAddr,
    /// The message, its lines joined with spaces, at most [`MAX_MESSAGE_BYTES`].
    pub message: String,
}

/// One GPU event in kernel-log text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An Xid report.
    Xid(XidRecord),
    /// A GPU fallen off the bus, without an Xid number.
    Lost(LostRecord),
}

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

/// A line of kernel-log text split into its timestamp and message.
struct Logged<'a> {
    time: Option<String>,
    monotonic_us: Option<u64>,
    body: &'a str,
}

/// Splits a line in one of the forms of the module docs. `None` for a kmsg
/// continuation line (it starts with whitespace) and for a kmsg record that
/// user space wrote.
fn logged(line: &str) -> Option<Logged<'_>> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.starts_with([' ', '\t']) {
        return None;
    }
    if let Some(record) = kmsg_record(line) {
        // Facility 0 is the kernel; user space cannot write it to /dev/kmsg.
        if record.prio >> 3 != 0 {
            return None;
        }
        let us = record.ts_us;
        let time = format!("{}.{:06}", us / 1_000_000, us % 1_000_000);
        return Some(Logged { time: Some(time), monotonic_us: Some(us), body: record.message });
    }
    Some(text_prefix(line))
}

/// What the node agent does about an Xid. Ordered by severity, so the most
/// severe of several is their `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Not a node problem (an application error): no node action, at most
    /// counted and logged at info level.
    Ignore,
    /// Logged as a warning and reported, but the node stays in service.
    Warn,
    /// Drain the node so no new jobs land on it; an admin (or a GPU reset)
    /// brings it back.
    Drain,
    /// Drain the node and ask Slurm to reboot it once it is idle
    /// (`scontrol reboot ASAP nextstate=RESUME`): for faults a reboot clears,
    /// such as pending row remaps. No Xid has it by default (a node whose GPU
    /// is still bad after the reboot would be resumed and drained again);
    /// drained hardware faults wait for a reboot before the agent resumes them.
    Reboot,
}

impl Action {
    /// Every action, least severe first.
    pub const ALL: [Action; 4] = [Action::Ignore, Action::Warn, Action::Drain, Action::Reboot];

    /// The action's name in configuration and logs: `ignore`, `warn`,
    /// `drain` or `reboot`.
    pub const fn name(self) -> &'static str {
        match self {
            Action::Ignore => "ignore",
            Action::Warn => "warn",
            Action::Drain => "drain",
            Action::Reboot => "reboot",
        }
    }

    /// The action with this [`name`](Action::name), exactly as written
    /// (lowercase, no spaces); `None` for anything else.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The default action for every Xid the policy names, in Xid order (the table
/// in the module docs gives the reasons). Xids not listed get
/// [`Action::Warn`].
pub const DEFAULT_POLICY: &[(u32, Action)] = &[
    (13, Action::Ignore),
    (31, Action::Ignore),
    (43, Action::Ignore),
    (45, Action::Ignore),
    (46, Action::Drain),
    (48, Action::Drain),
    (62, Action::Drain),
    (63, Action::Warn),
    (64, Action::Drain),
    (68, Action::Warn),
    (74, Action::Drain),
    (79, Action::Drain),
    (92, Action::Warn),
    (94, Action::Warn),
    (95, Action::Drain),
    (109, Action::Drain),
    (119, Action::Drain),
    (120, Action::Drain),
    (136, Action::Drain),
    (140, Action::Drain),
    (143, Action::Drain),
    (144, Action::Warn),
    (145, Action::Warn),
    (146, Action::Warn),
    (147, Action::Warn),
    (148, Action::Warn),
    (149, Action::Warn),
    (150, Action::Warn),
    (154, Action::Warn),
    (155, Action::Drain),
    (156, Action::Drain),
    (158, Action::Drain),
    (167, Action::Warn),
    (169, Action::Warn),
];

/// The default action for `xid`: its entry in [`DEFAULT_POLICY`], or
/// [`Action::Warn`] for an Xid the policy does not name.
pub fn default_action(xid: u32) -> Action {
    DEFAULT_POLICY.iter().find(|(x, _)| *x == xid).map_or(Action::Warn, |&(_, action)| action)
}

const MEANINGS: &[(u32, &str)] = &[
    (13, "graphics engine exception"),
    (31, "GPU memory page fault"),
    (32, "invalid or corrupted push buffer stream"),
    (43, "GPU stopped processing (channel reset)"),
    (45, "preemptive cleanup, due to previous errors"),
    (46, "GPU stopped processing"),
    (48, "double-bit ECC error"),
    (61, "internal micro-controller breakpoint/warning"),
    (62, "internal micro-controller halt"),
    (63, "ECC page retirement or row remap recorded"),
    (64, "ECC page retirement or row remap failure"),
    (68, "video decoder (NVDEC) exception"),
    (69, "graphics engine class error"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (109, "context switch timeout"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (136, "NVLink link training failed"),
    (140, "unrecovered ECC error"),
    (143, "GPU initialization error"),
    (144, "NVLink SAW error"),
    (145, "NVLink RLW error"),
    (146, "NVLink TLW error"),
    (147, "NVLink TREX error"),
    (148, "NVLink NVLPW error"),
    (149, "NVLink NETIR error"),
    (150, "NVLink MSE error"),
    (154, "GPU recovery action changed"),
    (155, "NVLink software-defined error"),
    (156, "resource retirement event"),
    (158, "GPU fatal timeout"),
    (167, "PCIe fatal timeout"),
    (169, "internal micro-controller halt (SEC2)"),
];

/// A short meaning of `xid` for logs and drain reasons, such as
/// `"GPU has fallen off the bus"` for 79; `"unknown Xid"` when not known.
pub fn describe(xid: u32) -> &'static str {
    if xid == LOST_WITHOUT_XID {
        return "GPU has fallen off the bus (no Xid number)";
    }
    MEANINGS.iter().find(|(x, _)| *x == xid).map_or("unknown Xid", |&(_, meaning)| meaning)
}

// ---------------------------------------------------------------------------
// Parsing internals. Everything below works on `&str` with `get`,
// `strip_prefix` and byte scans, so no input can make it index out of range.

/// A `/dev/kmsg` record split into its header fields and message.
struct Kmsg<'a> {
    prio: u32,
    ts_us: u64,
    message: &'a str,
}

/// `prio,seq,ts_us,flag[,more...];message`, or `None` when the line does not
/// have that shape.
fn kmsg_record(line: &str) -> Option<Kmsg<'_>> {
    let (header, message) = line.split_once(';')?;
    let mut fields = header.split(',');
    let prio = digits::<u32>(fields.next()?)?;
    digits::<u64>(fields.next()?)?;
    let ts_us = digits::<u64>(fields.next()?)?;
    if !matches!(fields.next()?, "-" | "c" | "+") {
        return None;
    }
    Some(Kmsg { prio, ts_us, message })
}

/// Every text form: an optional syslog/journal header or `kernel: `, an
/// optional bracketed timestamp and caller id, then the message.
fn text_prefix(line: &str) -> Logged<'_> {
    let mut time = None;
    let mut monotonic_us = None;
    let mut rest = line;
    let header = syslog_header(line);
    if let Some((ts, after)) = header {
        time = Some(ts);
        rest = after;
    } else if let Some(after) = rest.strip_prefix("kernel:") {
        rest = after.trim_start_matches(' ');
    }
    if let Some((inside, after)) = bracket(rest) {
        rest = after.trim_start_matches(' ');
        if let Some(us) = monotonic(inside) {
            monotonic_us = Some(us);
            time = time.or(Some(inside.trim()));
        } else if is_ctime(inside) {
            time = time.or(Some(inside.trim()));
        }
        if let Some((caller, after)) = bracket(rest) {
            if is_caller_id(caller) {
                rest = after.trim_start_matches(' ');
            }
        }
        if header.is_none() && !rest.starts_with("NVRM:") {
            // journalctl -o short-monotonic: `[ 1234.567890] host kernel: `.
            if let Some(after) = host_kernel(rest) {
                rest = after;
            }
        }
    }
    Logged { time: time.map(str::to_owned), monotonic_us, body: rest }
}

/// The fields of `NVRM: Xid (...): NN, ...`.
struct Body<'a> {
    bus_id: PciAddr,
    xid: u32,
    pid: Option<u32>,
    process: Option<&'a str>,
    message: &'a str,
}

impl Body<'_> {
    fn into_record(self, time: Option<String>, monotonic_us: Option<u64>) -> XidRecord {
        XidRecord {
            time,
            monotonic_us,
            pci_bus_id: self.bus_id,
            xid: self.xid,
            pid: self.pid,
            process: self.process.map(|p| truncate(p, MAX_PROCESS_BYTES).to_owned()),
            message: truncate(self.message, MAX_MESSAGE_BYTES).to_owned(),
        }
    }
}

/// `NVRM: Xid (PCI:0000:3b:00[ GPU-I:05 ...]): 79[, pid=P][, name=N][, message]`.
fn parse_body(text: &str) -> Option<Body<'_>> {
    let rest = text.strip_prefix("NVRM: Xid")?.trim_start_matches(' ');
    let rest = rest.strip_prefix('(')?;
    let close = rest.bytes().take(MAX_PAREN_BYTES).position(|b| b == b')')?;
    let inside = rest.get(..close)?;
    let rest = rest.get(close + 1..)?;
    let id = inside.split_whitespace().next()?;
    let bus_id = PciAddr::parse(id.strip_prefix("PCI:").unwrap_or(id)).ok()?;
    let rest = rest.strip_prefix(':')?.trim_start_matches(' ');
    let n = rest.bytes().take_while(u8::is_ascii_digit).count();
    let xid = digits::<u32>(rest.get(..n)?)?;
    let rest = rest.get(n..)?;
    let rest = if let Some(after) = rest.strip_prefix(',') {
        after
    } else if rest.is_empty() || rest.starts_with(' ') {
        rest
    } else {
        return None;
    };
    let mut rest = rest.trim_start_matches(' ');
    let mut pid = None;
    if let Some(after) = rest.strip_prefix("pid=") {
        let (value, after) = field(after);
        pid = digits::<u32>(value);
        rest = after;
    }
    let mut process = None;
    if let Some(after) = rest.strip_prefix("name=") {
        let (value, after) = field(after);
        process = Some(value);
        rest = after;
    }
    Some(Body { bus_id, xid, pid, process, message: rest.trim_end() })
}

/// A `key=` field's value up to the next comma, and the text after the comma
/// and its spaces.
fn field(text: &str) -> (&str, &str) {
    match text.split_once(',') {
        Some((value, after)) => (value.trim(), after.trim_start_matches(' ')),
        None => (text.trim(), ""),
    }
}

/// A syslog or journal header, `TIMESTAMP HOST kernel: `, or a bare
/// `TIMESTAMP ` directly before `NVRM:` (`dmesg --time-format iso`).
/// Returns the timestamp text and what follows the header.
fn syslog_header(line: &str) -> Option<(&str, &str)> {
    let b = line.as_bytes();
    let len = bsd_timestamp(b).or_else(|| full_timestamp(b)).or_else(|| iso_timestamp(b)).or_else(|| {
        // journalctl -o short-unix: seconds.micros since the epoch.
        fraction_number(b, 0, b'.')
    })?;
    let ts = line.get(..len)?;
    let after = line.get(len..)?.strip_prefix(' ')?.trim_start_matches(' ');
    if after.starts_with("NVRM:") {
        return Some((ts, after));
    }
    Some((ts, host_kernel(after)?))
}

/// `HOST kernel: ` → what follows it.
fn host_kernel(text: &str) -> Option<&str> {
    let (host, after) = text.split_once(' ')?;
    if host.is_empty() || host.len() > MAX_HOST_BYTES {
        return None;
    }
    Some(after.strip_prefix("kernel:")?.trim_start_matches(' '))
}

/// `Nov 22 18:29:55`, `Dec  2 11:38:47`, `Nov 22 18:29:55.123456`: its length.
fn bsd_timestamp(b: &[u8]) -> Option<usize> {
    if !MONTHS.iter().any(|m| b.starts_with(m.as_bytes())) || b.get(3) != Some(&b' ') {
        return None;
    }
    let mut i = 4;
    if b.get(i) == Some(&b' ') {
        i += 1;
    }
    let day = count_digits(b, i);
    if !(1..=2).contains(&day) {
        return None;
    }
    i += day;
    if b.get(i) != Some(&b' ') || !pattern_at(b, i + 1, "dd:dd:dd") {
        return None;
    }
    Some(optional_fraction(b, i + 9, b"."))
}

/// `2024-08-19T21:36:23+0200`, `2024-08-19T21:36:23.123456+02:00`,
/// `2024-08-19 21:36:23`, `2024-08-19T21:36:23,123456+02:00`: its length.
fn iso_timestamp(b: &[u8]) -> Option<usize> {
    if !pattern_at(b, 0, "dddd-dd-dd") || !matches!(b.get(10), Some(b'T' | b' ')) {
        return None;
    }
    if !pattern_at(b, 11, "dd:dd:dd") {
        return None;
    }
    let i = optional_fraction(b, 19, b".,");
    Some(match b.get(i) {
        Some(b'Z') => i + 1,
        Some(b'+' | b'-') if pattern_at(b, i + 1, "dd:dd") => i + 6,
        Some(b'+' | b'-') if pattern_at(b, i + 1, "dddd") => i + 5,
        Some(b'+' | b'-') if pattern_at(b, i + 1, "dd") => i + 3,
        _ => i,
    })
}

/// `Mon 2024-08-19 21:36:23 CEST` (journalctl -o short-full): its length.
fn full_timestamp(b: &[u8]) -> Option<usize> {
    if !WEEKDAYS.iter().any(|d| b.starts_with(d.as_bytes())) || b.get(3) != Some(&b' ') {
        return None;
    }
    let rest = b.get(4..)?;
    if !pattern_at(rest, 0, "dddd-dd-dd dd:dd:dd") {
        return None;
    }
    let i = optional_fraction(rest, 19, b".");
    if rest.get(i) != Some(&b' ') {
        return None;
    }
    let zone = rest
        .get(i + 1..)?
        .iter()
        .take(9)
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-'))
        .count();
    if !(1..=8).contains(&zone) {
        return None;
    }
    Some(4 + i + 1 + zone)
}

/// `Fri Jan 29 23:42:34 2021` (`dmesg -T`, one or two spaces before the day).
fn is_ctime(text: &str) -> bool {
    let mut words = text.split_whitespace();
    let ok = |w: Option<&str>, f: &dyn Fn(&str) -> bool| w.is_some_and(f);
    ok(words.next(), &|w| WEEKDAYS.contains(&w))
        && ok(words.next(), &|w| MONTHS.contains(&w))
        && ok(words.next(), &|w| (1..=2).contains(&w.len()) && w.bytes().all(|c| c.is_ascii_digit()))
        && ok(words.next(), &|w| w.len() == 8 && pattern_at(w.as_bytes(), 0, "dd:dd:dd"))
        && ok(words.next(), &|w| w.len() == 4 && w.bytes().all(|c| c.is_ascii_digit()))
        && words.next().is_none()
}

/// `[ 1234.567890]` content → microseconds since boot.
fn monotonic(text: &str) -> Option<u64> {
    let t = text.trim();
    let b = t.as_bytes();
    if fraction_number(b, 0, b'.')? != b.len() {
        return None;
    }
    let (secs, frac) = t.split_once('.')?;
    let mut us = digits::<u64>(secs)?.checked_mul(1_000_000)?;
    let mut scale = 100_000;
    for c in frac.bytes().take(6) {
        us = us.checked_add(u64::from(c.wrapping_sub(b'0')) * scale)?;
        scale /= 10;
    }
    Some(us)
}

/// `[T123]` or `[  C1]`: a printk caller id.
fn is_caller_id(text: &str) -> bool {
    let t = text.trim();
    match t.strip_prefix(['T', 'C']) {
        Some(n) => (1..=10).contains(&n.len()) && n.bytes().all(|c| c.is_ascii_digit()),
        None => false,
    }
}

/// `[inside] rest` → (`inside`, `rest`), for a short `inside` without brackets.
fn bracket(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix('[')?;
    let close = rest.bytes().take(MAX_BRACKET_BYTES + 1).position(|b| b == b']')?;
    let inside = rest.get(..close)?;
    if inside.contains('[') {
        return None;
    }
    Some((inside, rest.get(close + 1..)?))
}

/// `digits SEP digits` starting at `i` (at most 12 and 9 digits): where it ends.
fn fraction_number(b: &[u8], i: usize, sep: u8) -> Option<usize> {
    let whole = count_digits(b, i);
    if !(1..=12).contains(&whole) || b.get(i + whole) != Some(&sep) {
        return None;
    }
    let frac = count_digits(b, i + whole + 1);
    if !(1..=9).contains(&frac) {
        return None;
    }
    Some(i + whole + 1 + frac)
}

/// Skips an optional `SEP digits` (1 to 9 digits, SEP one of `seps`) at `i`.
fn optional_fraction(b: &[u8], i: usize, seps: &[u8]) -> usize {
    match b.get(i) {
        Some(c) if seps.contains(c) => {
            let n = count_digits(b, i + 1);
            if (1..=9).contains(&n) { i + 1 + n } else { i }
        }
        _ => i,
    }
}

/// How many ASCII digits start at `i` (at most 21: more is never valid).
fn count_digits(b: &[u8], i: usize) -> usize {
    b.get(i..).map_or(0, |rest| rest.iter().take(21).take_while(|c| c.is_ascii_digit()).count())
}

/// Whether `b` at `i` matches `pattern`, where `d` is any ASCII digit and
/// every other character stands for itself.
fn pattern_at(b: &[u8], i: usize, pattern: &str) -> bool {
    pattern.bytes().enumerate().all(|(k, p)| match b.get(i + k) {
        Some(c) if p == b'd' => c.is_ascii_digit(),
        Some(&c) => c == p,
        None => false,
    })
}

/// A non-empty run of at most 20 ASCII digits, as a number.
fn digits<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The comparable form the agent keys Xids by (the old `normalize_pci`).
    fn normalize_pci(id: &str) -> Option<String> {
        PciAddr::parse(id).ok().map(PciAddr::kernel)
    }

    fn parse(line: &str) -> XidRecord {
        parse_line(line).unwrap_or_else(|| panic!("no Xid in {line:?}"))
    }

    // --- log forms -------------------------------------------------------

    #[test]
    fn kmsg_record() {
        let r = parse(
            "6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.",
        );
        assert_eq!(
            r,
            XidRecord {
                time: Some("5.678901".into()),
                monotonic_us: Some(5_678_901),
                pci_bus_id: "0000:3b:00".parse().unwrap(),
                xid: 79,
                pid: Some(4242),
                process: Some("python3".into()),
                message: "GPU has fallen off the bus.".into(),
            }
        );
    }

    #[test]
    fn kmsg_record_with_caller_field_and_continuation_flag() {
        let r = parse("4,99,1000000,c,caller=T512;NVRM: Xid (PCI:0000:01:00): 48, DBE");
        assert_eq!((r.xid, r.monotonic_us, r.time.as_deref()), (48, Some(1_000_000), Some("1.000000")));
    }

    #[test]
    fn kmsg_continuation_lines_are_not_xids() {
        assert_eq!(parse_line(" SUBSYSTEM=pci"), None);
        assert_eq!(parse_line(" DEVICE=+pci:0000:3b:00.0"), None);
        assert_eq!(parse_line(" NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."), None);
    }

    #[test]
    fn kmsg_from_user_space_facility_is_refused() {
        // 14 = facility 1 (user), level 6: what `echo ... > /dev/kmsg` produces.
        assert_eq!(parse_line("14,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, fake"), None);
    }

    #[test]
    fn kmsg_non_xid_message() {
        assert_eq!(parse_line("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"), None);
    }

    #[test]
    fn dmesg_raw_timestamp() {
        let r = parse("[ 1234.567890] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.");
        assert_eq!(r.time.as_deref(), Some("1234.567890"));
        assert_eq!(r.monotonic_us, Some(1_234_567_890));
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid), ("0000:02:00", 79));
        assert_eq!(r.message, "GPU has fallen off the bus.");
    }

    #[test]
    fn dmesg_with_caller_id() {
        let r = parse("[  219.470994] [  T512] NVRM: Xid (PCI:0000:07:00): 48, DBE");
        assert_eq!((r.xid, r.monotonic_us), (48, Some(219_470_994)));
    }

    #[test]
    fn dmesg_ctime() {
        let r = parse(
            "[Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        );
        assert_eq!(r.time.as_deref(), Some("Fri Apr  5 21:29:39 2024"));
        assert_eq!(r.monotonic_us, None);
        assert_eq!(r.pid, None);
        assert_eq!(r.process.as_deref(), Some("<unknown>"));
        assert_eq!(r.message, "GPU has fallen off the bus.");
    }

    #[test]
    fn dmesg_iso_time_format() {
        let r = parse("2024-08-19T21:36:23,123456+02:00 NVRM: Xid (PCI:0000:23:00): 120, GSP task exception");
        assert_eq!(r.time.as_deref(), Some("2024-08-19T21:36:23,123456+02:00"));
        assert_eq!(r.xid, 120);
    }

    #[test]
    fn syslog_with_kernel_timestamp() {
        let r = parse(
            "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
        );
        assert_eq!(r.time.as_deref(), Some("Dec  2 11:38:47"));
        assert_eq!(r.monotonic_us, Some(219_470_994));
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid), ("0000:07:00", 48));
    }

    #[test]
    fn syslog_without_kernel_timestamp() {
        let r =
            parse("May 13 17:18:47 hyperion kernel: NVRM: Xid (PCI:0000:08:00): 69, Class Error: ChId 003b");
        assert_eq!(r.time.as_deref(), Some("May 13 17:18:47"));
        assert_eq!(r.monotonic_us, None);
        assert_eq!(r.message, "Class Error: ChId 003b");
    }

    #[test]
    fn syslog_from_another_program_is_refused() {
        assert_eq!(
            parse_line("Nov 22 18:29:55 host sshd[77]: Invalid user NVRM: Xid (PCI:0000:01:00): 79, x"),
            None
        );
        assert_eq!(
            parse_line("Nov 22 18:29:55 host sshd[77]: kernel: NVRM: Xid (PCI:0000:01:00): 79, x"),
            None
        );
    }

    #[test]
    fn journalctl_short_precise() {
        let r = parse("Aug 19 21:36:23.123456 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, GSP error");
        assert_eq!(r.time.as_deref(), Some("Aug 19 21:36:23.123456"));
    }

    #[test]
    fn journalctl_short_iso() {
        let r = parse("2024-08-19T21:36:23+0200 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, GSP error");
        assert_eq!(r.time.as_deref(), Some("2024-08-19T21:36:23+0200"));
        let r = parse("2024-08-19T21:36:23.123456+02:00 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!(r.time.as_deref(), Some("2024-08-19T21:36:23.123456+02:00"));
    }

    #[test]
    fn journalctl_short_full() {
        let r = parse("Mon 2024-08-19 21:36:23 CEST fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!(r.time.as_deref(), Some("Mon 2024-08-19 21:36:23 CEST"));
    }

    #[test]
    fn journalctl_short_unix() {
        let r = parse("1724096183.123456 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!(r.time.as_deref(), Some("1724096183.123456"));
        assert_eq!(r.monotonic_us, None);
    }

    #[test]
    fn journalctl_short_monotonic() {
        let r = parse("[ 1234.567890] fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, x");
        assert_eq!((r.time.as_deref(), r.monotonic_us), (Some("1234.567890"), Some(1_234_567_890)));
    }

    #[test]
    fn journal_prefix_trimmed() {
        let r = parse("kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c");
        assert_eq!((r.time, r.xid, r.pid), (None, 45, Some(1_818_992)));
    }

    #[test]
    fn bare_message() {
        let r = parse("NVRM: Xid (PCI:0000:01:00): 62, 323f0f30 0000c3d8");
        assert_eq!((r.time, r.monotonic_us, r.xid), (None, None, 62));
        assert_eq!(r.message, "323f0f30 0000c3d8");
    }

    #[test]
    fn old_driver_without_pci_prefix() {
        let r =
            parse("Nov 22 18:29:55 hostname kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b");
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid), ("0000:01:00", 31));
    }

    #[test]
    fn placeholder_bracket_is_skipped() {
        let r = parse("[\u{2026}] NVRM: Xid (0000:03:00): 14, Channel 00000001");
        assert_eq!((r.time, r.xid), (None, 14));
    }

    #[test]
    fn mig_instance_ids_are_dropped() {
        let r =
            parse("NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 94, pid=7194, Contained: CE User Channel");
        assert_eq!((r.pci_bus_id.to_string().as_str(), r.xid, r.pid), ("0000:01:00", 94, Some(7194)));
    }

    #[test]
    fn trailing_newline_is_ignored() {
        assert_eq!(parse("NVRM: Xid (PCI:0000:01:00): 79, gone.\r\n").message, "gone.");
    }

    #[test]
    fn xid_without_message() {
        let r = parse("NVRM: Xid (PCI:0000:01:00): 79");
        assert_eq!((r.xid, r.message.as_str()), (79, ""));
    }

    // --- pid and name ----------------------------------------------------

    #[test]
    fn pid_and_name_present() {
        let r = parse("NVRM: Xid (PCI:0000:01:00): 31, pid=14292, name=python, Ch 00000030");
        assert_eq!(
            (r.pid, r.process.as_deref(), r.message.as_str()),
            (Some(14292), Some("python"), "Ch 00000030")
        );
    }

    #[test]
    fn pid_without_name() {
        let r = parse("[Fri Jan 29 23:42:34 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=13641, Ch 00000008");
        assert_eq!((r.pid, r.process, r.message.as_str()), (Some(13641), None, "Ch 00000008"));
    }

    #[test]
    fn pid_and_name_absent() {
        let r = parse("[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.");
        assert_eq!((r.pid, r.process), (None, None));
    }

    #[test]
    fn unknown_pid_is_none_and_unknown_name_is_kept() {
        let r = parse("NVRM: Xid (PCI:0000:0a:00): 62, pid='<unknown>', name=<unknown>, 2023b230");
        assert_eq!((r.pid, r.process.as_deref(), r.message.as_str()), (None, Some("<unknown>"), "2023b230"));
    }

    #[test]
    fn pid_too_large_is_none() {
        assert_eq!(parse("NVRM: Xid (PCI:0000:01:00): 31, pid=99999999999, x").pid, None);
    }

    // --- not Xids, garbage, limits ---------------------------------------

    #[test]
    fn other_nvrm_lines_are_not_xids() {
        for line in [
            "[Fri Apr  5 21:29:39 2024] NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462",
            "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.",
            "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00",
            "Nov 22 18:29:55 host kernel: usb 1-1: new high-speed USB device",
            "",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn malformed_xid_lines() {
        for line in [
            "NVRM: Xid",
            "NVRM: Xid (",
            "NVRM: Xid (PCI:0000:01:00",
            "NVRM: Xid (PCI:0000:01:00)",
            "NVRM: Xid (PCI:0000:01:00):",
            "NVRM: Xid (PCI:0000:01:00): x",
            "NVRM: Xid (PCI:0000:01:00): 79x, y",
            "NVRM: Xid (PCI:): 79, y",
            "NVRM: Xid (PCI:zzzz:01:00): 79, y",
            "NVRM: Xid (): 79, y",
            "NVRM: Xid (PCI:0000:01:00): 99999999999, y",
            "6,1,2;NVRM: Xid (PCI:0000:01:00): 79, y",
            "[ 1.2 NVRM: Xid (PCI:0000:01:00): 79, y",
            "Nov 22 18:29:55 host kernel NVRM: Xid (PCI:0000:01:00): 79, y",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let alphabet: Vec<char> =
            "NVRM: Xid(PCI)0123456789abcdef,;[]-.:= \u{e9}\u{2026}\tTkernlpidname".chars().collect();
        let mut scanner = Scanner::new();
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = usize::try_from(seed % 80).unwrap_or(0);
            let mut s = String::from(
                ["", "NVRM: Xid (", "6,1,2,-;", "[ 1.", "NVRM: The NVIDIA GPU 0000:1", "NVRM: GPU 0000:0"]
                    [usize::try_from(seed % 6).unwrap_or(0)],
            );
            for k in 0..len {
                let idx = usize::try_from((seed >> (k % 48)) % alphabet.len() as u64).unwrap_or(0);
                s.push(alphabet[idx]);
            }
            let _ = parse_line(&s);
            let _ = normalize_pci(&s);
            for e in scanner.push(&s) {
                if let Event::Lost(l) = e {
                    assert!(
                        l.message.len() <= MAX_MESSAGE_BYTES
                            && normalize_pci(&l.pci_bus_id.to_string()).is_some()
                    );
                }
            }
        }
        for s in ["[", "]", "(", ";", ",", "\u{2026}", "[\u{2026}", "NVRM: Xid (\u{e9}", "Nov", "2024-"] {
            let _ = parse_line(s);
        }
    }

    #[test]
    fn one_megabyte_line_with_an_xid() {
        let mut line = String::from("[ 1.000000] NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=");
        line.push_str(&"\u{e9}".repeat(100));
        line.push_str(", ");
        line.push_str(&"x\u{2026}".repeat(1 << 18));
        assert!(line.len() > 1 << 20);
        let r = parse(&line);
        assert_eq!(r.xid, 79);
        assert!(r.message.len() <= MAX_MESSAGE_BYTES && r.message.len() > MAX_MESSAGE_BYTES - 4);
        assert!(r.process.is_some_and(|p| p.len() == MAX_PROCESS_BYTES));
    }

    #[test]
    fn one_megabyte_garbage_lines() {
        for unit in ["[", "a", " ", "NVRM: Xid (", "6,", "Nov 22 ", "9"] {
            let line = unit.repeat((1 << 20) / unit.len());
            assert_eq!(parse_line(&line), None);
        }
    }

    // --- normalize_pci ---------------------------------------------------

    #[test]
    fn pci_ids_from_log_and_nvml_agree() {
        let want = Some("0000:3b:00".to_owned());
        for id in
            ["0000:3b:00", "PCI:0000:3b:00", "00000000:3B:00.0", "0000:3B:00.0", "3b:00.0", " 0000:3b:00 "]
        {
            assert_eq!(normalize_pci(id), want, "{id}");
        }
        assert_eq!(normalize_pci("0019:01:00").as_deref(), Some("0019:01:00"));
        assert_eq!(normalize_pci("00000019:01:00.0").as_deref(), Some("0019:01:00"));
        assert_eq!(normalize_pci("10000:01:00.0").as_deref(), Some("10000:01:00"));
    }

    #[test]
    fn bad_pci_ids() {
        for id in [
            "",
            "3b",
            "0000:3b:00:00",
            "0000:3b:20",
            "0000:3b:00.8",
            "000000000:3b:00",
            "0000:3bb:00",
            "g:3b:00",
            "0000:3b:00.",
            "0000:3b:00.0".repeat(5).as_str(),
        ] {
            assert_eq!(normalize_pci(id), None, "{id}");
        }
    }

    // --- policy ----------------------------------------------------------

    #[test]
    fn application_errors_are_ignored() {
        for xid in [13, 31, 43, 45] {
            assert_eq!(default_action(xid), Action::Ignore, "Xid {xid}");
        }
    }

    #[test]
    fn hardware_errors_drain() {
        for xid in [46, 62, 64, 74, 95, 140] {
            assert_eq!(default_action(xid), Action::Drain, "Xid {xid}");
        }
    }

    #[test]
    fn errors_that_need_a_reboot_drain_and_wait_for_it() {
        for xid in [48, 79, 119, 120] {
            assert_eq!(default_action(xid), Action::Drain, "Xid {xid}");
        }
    }

    #[test]
    fn memory_xids_warn() {
        for xid in [63, 92, 94] {
            assert_eq!(default_action(xid), Action::Warn, "Xid {xid}");
        }
    }

    #[test]
    fn unknown_xid_warns() {
        assert_eq!(default_action(4242), Action::Warn);
        assert_eq!(describe(4242), "unknown Xid");
    }

    #[test]
    fn descriptions() {
        assert_eq!(describe(79), "GPU has fallen off the bus");
        for &(xid, _) in DEFAULT_POLICY {
            assert_ne!(describe(xid), "unknown Xid", "Xid {xid} has an action but no meaning");
        }
    }

    #[test]
    fn action_names_round_trip() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.name()), Some(a));
            assert_eq!(a.to_string(), a.name());
        }
        assert_eq!(Action::parse("Drain"), None);
        assert_eq!(Action::parse(""), None);
        assert!(
            Action::Ignore < Action::Warn && Action::Warn < Action::Drain && Action::Drain < Action::Reboot
        );
    }

    #[test]
    fn reset_class_xids_of_the_catalog_drain_and_new_ones_are_named() {
        // NVIDIA's immediate resolution RESET_GPU (catalog of 2025-10-29).
        for xid in [109, 136, 143, 155, 156, 158] {
            assert_eq!(default_action(xid), Action::Drain, "Xid {xid}");
        }
        assert_eq!(describe(167), "PCIe fatal timeout");
        assert_eq!(describe(169), "internal micro-controller halt (SEC2)");
        assert!(CATALOG.contains("2025-10-29"));
    }

    #[test]
    fn recovery_actions_are_named_as_nvml_names_them() {
        assert_eq!(recovery_action_name(1), Some("GPU reset"));
        assert_eq!(recovery_action_name(2), Some("node reboot"));
        for code in 0..=7 {
            assert!(recovery_action_name(code).is_some(), "{code}");
        }
        assert_eq!(recovery_action_name(8), None);
    }

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

    #[test]
    fn policy_table_is_sorted_and_unique() {
        assert!(DEFAULT_POLICY.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(MEANINGS.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn module_doc_table_matches_the_policy() {
        let mut rows = 0;
        for line in include_str!("xid.rs").lines() {
            let Some(row) = line.strip_prefix("//! | ") else { continue };
            let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
            let Ok(xid) = cells[0].parse::<u32>() else { continue };
            if cells.len() < 4 {
                continue;
            }
            assert_eq!(cells[1], describe(xid), "doc meaning of Xid {xid}");
            assert_eq!(Action::parse(cells[2]), Some(default_action(xid)), "doc action of Xid {xid}");
            rows += 1;
        }
        assert_eq!(rows, DEFAULT_POLICY.len());
    }
}
