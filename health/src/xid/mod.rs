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

mod logline;
mod policy;
mod scanner;

pub use logline::{MAX_MESSAGE_BYTES, MAX_PROCESS_BYTES, parse_line};
pub use policy::{
    Action, CATALOG, DEFAULT_POLICY, LOST_WITHOUT_XID, default_action, describe, recovery_action_name,
};
pub use scanner::Scanner;

use slurm_formats::pci::PciAddr;

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

// What spans the submodules: garbage fed to both `parse_line` and the
// `Scanner`, and the bus ids the records carry.
#[cfg(test)]
mod tests {
    use super::*;

    /// The comparable form the agent keys Xids by (the old `normalize_pci`).
    fn normalize_pci(id: &str) -> Option<String> {
        PciAddr::parse(id).ok().map(PciAddr::kernel)
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
}
