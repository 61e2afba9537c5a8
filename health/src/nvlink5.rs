//! NVLink5 Xids (144-150, GB200 and B200): which ones need a GPU reset.
//!
//! The driver prints one Xid number per NVLink5 unit class and puts the rest
//! in the message:
//!
//! ```text
//! NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x02500011 0x00000000 0x00000000 0x00000000)
//! ```
//!
//! The unit's mnemonic, the driver's severity word, the cross-containment
//! domain, the injection flag, the link, then hex words: the first is the
//! interrupt info (`intrinfo`), the second the unit's error status. The
//! **sub-code** is `intrinfo` bits 20-25 (`(intrinfo >> 20) & 0x3f`), as
//! leptonai/gpud decodes it; the unit itself is in `intrinfo`'s low bits
//! (7 bits in the catalog's newer encoding, 10 in the older one), so the
//! mnemonic's spelling never matters.
//!
//! Whether an event needs the GPU reset comes from NVIDIA's Xid catalog
//! ("NVLink5" rows of the catalog workbook, [`crate::xid::CATALOG`]): per
//! unit and error-status bit (per value for the units whose status is a
//! value), and for `NETIR_LINK_EVT` per sub-code (the link-down reason). A
//! row whose resolution is `RESET_GPU` is [`Verdict::Reset`]; `IGNORE` and
//! `XID_154_EVAL` (the driver's recovery action, which the agent reads from
//! NVML anyway) are [`Verdict::Benign`]. Every catalog row marked fatal
//! resolves `RESET_GPU`, except two `NETIR_LINK_EVT` sub-codes (0x26, 0x28)
//! the catalog says to ignore. An event the catalog does not list is
//! [`Verdict::Unknown`]: the agent then keeps the Xid's default (warn).
//!
//! Pure and total: any message (the input is untrusted kernel-log text) gives
//! a decoding or `None`, never a panic.

/// What NVIDIA's catalog says about one NVLink5 event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The catalog's resolution is a GPU reset: the GPU is not usable until then.
    Reset,
    /// Ignore, or evaluate the recovery action (Xid 154): the GPU stays usable.
    Benign,
    /// Not in the catalog (a unit, status or sub-code it does not list).
    Unknown,
}

/// An NVLink5 Xid's message, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The Xid (144-150).
    pub xid: u32,
    /// The unit, as the catalog names it (from `intrinfo`); `None` for a unit it does not know.
    pub unit: Option<&'static str>,
    /// `intrinfo` bits 20-25.
    pub sub_code: u32,
    /// The first hex word.
    pub intrinfo: u32,
    /// The second hex word: the unit's error status.
    pub status: u32,
    /// The link, when the message names one.
    pub link: Option<u32>,
    /// The driver's own word (`Fatal`, `Nonfatal`), as printed.
    pub severity: Option<String>,
    /// The catalog's verdict.
    pub verdict: Verdict,
}

impl Decoded {
    /// A short description for logs and drain reasons:
    /// `RLW_REMAP status 0x00000040 link 3: GPU reset needed`.
    pub fn describe(&self) -> String {
        let unit = self.unit.unwrap_or("unknown unit");
        let sub =
            if self.sub_code != 0 { format!(" sub-code 0x{:02x}", self.sub_code) } else { String::new() };
        let link = self.link.map(|l| format!(" link {l}")).unwrap_or_default();
        let what = match self.verdict {
            Verdict::Reset => "GPU reset needed",
            Verdict::Benign => "benign",
            Verdict::Unknown => "not in NVIDIA's catalog",
        };
        format!("{unit} status 0x{:08x}{sub}{link}: {what}", self.status)
    }
}

/// The NVLink5 Xids.
pub const XIDS: std::ops::RangeInclusive<u32> = 144..=150;

/// A unit: its Xid, the catalog's name, its code in `intrinfo`'s low 7 bits
/// (newer encoding) and low 10 bits (older encoding), and whether its error
/// status is a value (compared whole) rather than a set of bits.
struct Unit {
    xid: u32,
    name: &'static str,
    v2: u32,
    v1: u32,
    valued: bool,
}

const fn unit(xid: u32, name: &'static str, v2: u32, v1: u32) -> Unit {
    Unit { xid, name, v2, v1, valued: false }
}

const fn valued(xid: u32, name: &'static str, v2: u32, v1: u32) -> Unit {
    Unit { xid, name, v2, v1, valued: true }
}

/// The units of the catalog's NVLink5 rows.
const UNITS: &[Unit] = &[
    unit(144, "SAW_MVB", 0x01, 0x021),
    unit(145, "RLW_CTRL", 0x03, 0x062),
    unit(145, "RLW_REMAP", 0x04, 0x082),
    unit(145, "RLW_RSPCOL", 0x05, 0x0a2),
    unit(145, "RLW_RXPIPE", 0x06, 0x0c2),
    unit(145, "RLW_SRC_TRACK", 0x07, 0x0e2),
    unit(145, "RLW_TAGSTATE", 0x08, 0x102),
    unit(146, "TLW_CTRL", 0x09, 0x123),
    unit(146, "TLW_RX_PIPE0", 0x0a, 0x143),
    unit(146, "TLW_RX_PIPE1", 0x0b, 0x143),
    unit(146, "TLW_TX_PIPE0", 0x0c, 0x163),
    unit(146, "TLW_TX_PIPE1", 0x0d, 0x163),
    unit(147, "TREX", 0x0e, 0x184),
    unit(148, "NVLPW", 0x0f, 0x005),
    valued(149, "NETIR_INT", 0x18, 0x006),
    valued(149, "NETIR_BER_EVENT", 0x13, 0x226),
    valued(149, "NETIR_LINK_EVT", 0x11, 0x1c6),
    valued(149, "NETIR_MFDE_EVENT", 0x14, 0x246),
    valued(150, "MSE_WATCHDOG", 0x00, 0x000),
];

/// Error-status bits (or values, for a valued unit) and whether the catalog
/// resolves them with a GPU reset.
const STATUS: &[(&str, u32, bool)] = &[
    ("SAW_MVB", 0x01, false),
    ("SAW_MVB", 0x02, true),
    ("SAW_MVB", 0x04, false),
    ("SAW_MVB", 0x08, false),
    ("SAW_MVB", 0x10, true),
    ("SAW_MVB", 0x20, false),
    ("RLW_CTRL", 0x8000_0000, false),
    ("RLW_REMAP", 0x01, false),
    ("RLW_REMAP", 0x02, false),
    ("RLW_REMAP", 0x04, false),
    ("RLW_REMAP", 0x08, false),
    ("RLW_REMAP", 0x10, false),
    ("RLW_REMAP", 0x20, false),
    ("RLW_REMAP", 0x40, true),
    ("RLW_REMAP", 0x80, true),
    ("RLW_REMAP", 0x100, false),
    ("RLW_REMAP", 0x200, false),
    ("RLW_REMAP", 0x8000_0000, false),
    ("RLW_RSPCOL", 0x01, false),
    ("RLW_RSPCOL", 0x02, true),
    ("RLW_RSPCOL", 0x8000_0000, false),
    ("RLW_RXPIPE", 0x01, false),
    ("RLW_RXPIPE", 0x02, false),
    ("RLW_RXPIPE", 0x04, false),
    ("RLW_RXPIPE", 0x08, false),
    ("RLW_RXPIPE", 0x8000_0000, false),
    ("RLW_SRC_TRACK", 0x01, true),
    ("RLW_SRC_TRACK", 0x02, false),
    ("RLW_SRC_TRACK", 0x04, false),
    ("RLW_SRC_TRACK", 0x08, false),
    ("RLW_SRC_TRACK", 0x10, true),
    ("RLW_SRC_TRACK", 0x20, true),
    ("RLW_SRC_TRACK", 0x8000_0000, false),
    ("RLW_TAGSTATE", 0x01, false),
    ("RLW_TAGSTATE", 0x02, true),
    ("RLW_TAGSTATE", 0x1_0000, false),
    ("RLW_TAGSTATE", 0x2_0000, true),
    ("RLW_TAGSTATE", 0x10_0000, true),
    ("RLW_TAGSTATE", 0x8000_0000, false),
    ("TLW_CTRL", 0x01, false),
    ("TLW_CTRL", 0x02, false),
    ("TLW_CTRL", 0x04, true),
    ("TLW_CTRL", 0x8000_0000, false),
    ("TLW_RX_PIPE0", 0x01, false),
    ("TLW_RX_PIPE0", 0x02, false),
    ("TLW_RX_PIPE0", 0x04, true),
    ("TLW_RX_PIPE0", 0x8000_0000, false),
    ("TLW_RX_PIPE1", 0x01, false),
    ("TLW_RX_PIPE1", 0x02, false),
    ("TLW_RX_PIPE1", 0x04, true),
    ("TLW_RX_PIPE1", 0x8000_0000, false),
    ("TLW_TX_PIPE0", 0x01, false),
    ("TLW_TX_PIPE0", 0x02, false),
    ("TLW_TX_PIPE0", 0x04, true),
    ("TLW_TX_PIPE0", 0x8000_0000, false),
    ("TLW_TX_PIPE1", 0x01, false),
    ("TLW_TX_PIPE1", 0x02, false),
    ("TLW_TX_PIPE1", 0x04, true),
    ("TLW_TX_PIPE1", 0x8000_0000, false),
    ("TREX", 0x01, false),
    ("TREX", 0x8000_0000, false),
    ("NVLPW", 0x8000_0000, false),
    ("NETIR_INT", 0x00, true),
    ("NETIR_BER_EVENT", 0x00, false),
    ("NETIR_BER_EVENT", 0x01, false),
    ("NETIR_BER_EVENT", 0x02, false),
    ("NETIR_BER_EVENT", 0x03, false),
    ("NETIR_LINK_EVT", 0x00, true),
    ("NETIR_MFDE_EVENT", 0x01, true),
    ("NETIR_MFDE_EVENT", 0x03, false),
    ("NETIR_MFDE_EVENT", 0x04, true),
    ("NETIR_MFDE_EVENT", 0x05, true),
    ("NETIR_MFDE_EVENT", 0x07, true),
    ("MSE_WATCHDOG", 0x00, true),
];

/// `NETIR_LINK_EVT`'s sub-codes (the link-down reason) and whether the
/// catalog resolves them with a GPU reset. Every other unit's rows have
/// sub-code 0.
const LINK_DOWN: &[(u32, bool)] = &[
    (0x00, true),
    (0x01, true),
    (0x02, true),
    (0x04, true),
    (0x0a, true),
    (0x0f, true),
    (0x10, true),
    (0x11, true),
    (0x12, true),
    (0x15, true),
    (0x16, true),
    (0x20, true),
    (0x21, true),
    (0x22, true),
    (0x23, true),
    (0x24, true),
    (0x25, true),
    (0x26, false),
    (0x28, false),
    (0x2a, true),
    (0x2b, true),
];

/// `intrinfo` bits 20-25.
pub fn sub_code(intrinfo: u32) -> u32 {
    (intrinfo >> 20) & 0x3f
}

/// The unit of an event of `xid`: by the newer 7-bit code first, then the
/// older 10-bit one.
fn unit_of(xid: u32, intrinfo: u32) -> Option<&'static Unit> {
    let of = |xid: u32| UNITS.iter().filter(move |u| u.xid == xid);
    of(xid).find(|u| intrinfo & 0x7f == u.v2).or_else(|| of(xid).find(|u| intrinfo & 0x3ff == u.v1))
}

fn verdict(unit: &Unit, sub: u32, status: u32) -> Verdict {
    let rows = || STATUS.iter().filter(|(name, ..)| *name == unit.name);
    let resolve = |reset: bool| if reset { Verdict::Reset } else { Verdict::Benign };
    if unit.name == "NETIR_LINK_EVT" {
        if status != 0 {
            return Verdict::Unknown;
        }
        return LINK_DOWN.iter().find(|(s, _)| *s == sub).map_or(Verdict::Unknown, |&(_, r)| resolve(r));
    }
    if sub != 0 {
        return Verdict::Unknown;
    }
    if let Some(&(_, _, reset)) = rows().find(|(_, s, _)| *s == status) {
        return resolve(reset);
    }
    if unit.valued || status == 0 {
        return Verdict::Unknown;
    }
    // Several status bits at once: any bit that needs a reset decides; with
    // none, every bit must be known to call it benign.
    let bits = (0..32).map(|b| 1u32 << b).filter(|b| status & b != 0);
    let mut known = true;
    for bit in bits {
        match rows().find(|(_, s, _)| *s == bit) {
            Some((_, _, true)) => return Verdict::Reset,
            Some(_) => {}
            None => known = false,
        }
    }
    if known { Verdict::Benign } else { Verdict::Unknown }
}

/// A `0x...` hex word.
fn hex(word: &str) -> Option<u32> {
    let digits = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X"))?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// Decodes the message of an NVLink5 Xid ([`XIDS`]), the text after `NNN, `
/// as [`crate::xid::XidRecord::message`] keeps it. `None` for another Xid or
/// a message without the hex words.
pub fn decode(xid: u32, message: &str) -> Option<Decoded> {
    if !XIDS.contains(&xid) {
        return None;
    }
    let open = message.find('(')?;
    let close = open + message.get(open..)?.find(')')?;
    let mut words = message.get(open + 1..close)?.split_whitespace();
    let intrinfo = hex(words.next()?)?;
    let status = hex(words.next()?)?;
    let head: Vec<&str> = message.get(..open)?.split_whitespace().collect();
    let severity = head
        .iter()
        .find(|w| w.eq_ignore_ascii_case("fatal") || w.eq_ignore_ascii_case("nonfatal"))
        .map(|w| (*w).to_owned());
    let link = head
        .iter()
        .position(|w| *w == "Link")
        .and_then(|i| head.get(i + 1))
        .and_then(|n| n.parse::<u32>().ok());
    let sub = sub_code(intrinfo);
    let unit = unit_of(xid, intrinfo);
    Some(Decoded {
        xid,
        unit: unit.map(|u| u.name),
        sub_code: sub,
        intrinfo,
        status,
        link,
        severity,
        verdict: unit.map_or(Verdict::Unknown, |u| verdict(u, sub, status)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(xid: u32, unit: &str, word: &str, intrinfo: u32, status: u32) -> Decoded {
        let m =
            format!("{unit} {word} XC0 i0 Link 03 (0x{intrinfo:08x} 0x{status:08x} 0x00000000 0x00000000)");
        decode(xid, &m).unwrap_or_else(|| panic!("{m}"))
    }

    #[test]
    fn the_catalogs_fatal_rows_need_a_reset_and_the_others_do_not() {
        for (xid, unit, intrinfo, status, want) in [
            (144, "SAW_MVB", 0x01, 0x02, Verdict::Reset),
            (144, "SAW_MVB", 0x01, 0x01, Verdict::Benign),
            (145, "RLW_REMAP", 0x04, 0x40, Verdict::Reset),
            (145, "RLW_REMAP", 0x04, 0x01, Verdict::Benign),
            (145, "RLW_SRC_TRACK", 0x07, 0x01, Verdict::Reset),
            (145, "RLW_TAGSTATE", 0x08, 0x2_0000, Verdict::Reset),
            (145, "RLW_RXPIPE", 0x06, 0x04, Verdict::Benign),
            (146, "TLW_TX_PIPE1", 0x0d, 0x04, Verdict::Reset),
            (147, "TREX", 0x0e, 0x01, Verdict::Benign),
            (148, "NVLPW", 0x0f, 0x8000_0000, Verdict::Benign),
            (149, "NETIR_INT", 0x18, 0, Verdict::Reset),
            (149, "NETIR_BER_EVENT", 0x13, 1, Verdict::Benign),
            (149, "NETIR_MFDE_EVENT", 0x14, 3, Verdict::Benign),
            (149, "NETIR_MFDE_EVENT", 0x14, 7, Verdict::Reset),
            (150, "MSE_WATCHDOG", 0, 0, Verdict::Reset),
        ] {
            let d = line(xid, unit, "Fatal", intrinfo, status);
            assert_eq!((d.unit, d.verdict), (Some(unit), want), "{xid} {unit} 0x{status:x}");
        }
    }

    #[test]
    fn the_sub_code_is_intrinfo_bits_20_to_25_and_decides_a_link_down() {
        assert_eq!(sub_code(0x0250_0011), 0x25);
        assert_eq!(sub_code(0xfc0f_ffff), 0);
        let d = line(149, "NETIR_LINK_EVT", "Fatal", 0x0250_0011, 0);
        assert_eq!((d.unit, d.sub_code, d.verdict), (Some("NETIR_LINK_EVT"), 0x25, Verdict::Reset));
        // Sub-codes the catalog says to ignore, and one it does not list.
        assert_eq!(line(149, "NETIR_LINK_EVT", "Fatal", 0x0260_0011, 0).verdict, Verdict::Benign);
        assert_eq!(line(149, "NETIR_LINK_EVT", "Fatal", 0x0280_0011, 0).verdict, Verdict::Benign);
        assert_eq!(line(149, "NETIR_LINK_EVT", "Fatal", 0x0300_0011, 0).verdict, Verdict::Unknown);
        // Another unit with a sub-code: not in the catalog.
        assert_eq!(line(144, "SAW_MVB", "Fatal", 0x0010_0001, 0x02).verdict, Verdict::Unknown);
    }

    #[test]
    fn the_unit_comes_from_intrinfo_in_either_encoding_not_from_its_spelling() {
        // The older 10-bit encoding of RLW_REMAP, printed under another name.
        let d = line(145, "RLW_REMAP_SOMETHING", "Nonfatal", 0x082, 0x80);
        assert_eq!((d.unit, d.verdict), (Some("RLW_REMAP"), Verdict::Reset));
        // The same code under another Xid is not that unit.
        assert_eq!(line(149, "X", "Fatal", 0x04, 0x40).unit, None);
        assert_eq!(line(149, "X", "Fatal", 0x04, 0x40).verdict, Verdict::Unknown);
    }

    #[test]
    fn several_status_bits_and_the_drivers_own_word() {
        // 0x41: a benign bit and a reset bit.
        assert_eq!(line(145, "RLW_REMAP", "Nonfatal", 0x04, 0x41).verdict, Verdict::Reset);
        assert_eq!(line(145, "RLW_REMAP", "Nonfatal", 0x04, 0x101).verdict, Verdict::Benign);
        assert_eq!(line(145, "RLW_REMAP", "Nonfatal", 0x04, 0x1001).verdict, Verdict::Unknown);
        // A valued status is compared whole.
        assert_eq!(line(149, "NETIR_MFDE_EVENT", "Fatal", 0x14, 6).verdict, Verdict::Unknown);
        let d = line(144, "SAW_MVB", "Nonfatal", 0x01, 0x10);
        assert_eq!((d.severity.as_deref(), d.link), (Some("Nonfatal"), Some(3)));
        assert_eq!(d.describe(), "SAW_MVB status 0x00000010 link 3: GPU reset needed");
    }

    #[test]
    fn other_xids_and_bad_messages_decode_to_nothing() {
        assert_eq!(decode(79, "SAW_MVB Fatal (0x1 0x2)"), None);
        for m in [
            "",
            "SAW_MVB Fatal",
            "SAW_MVB (0x1)",
            "(0x1 zz)",
            "(0x123456789 0x1)",
            ") (",
            "(0x",
            "é (0x1 0x2",
        ] {
            assert_eq!(decode(144, m), None, "{m}");
        }
        assert_eq!(decode(144, "(0x1 0x2)").map(|d| d.verdict), Some(Verdict::Reset));
        assert_eq!(decode(144, "x (0x1 0x2").map(|d| d.verdict), None, "no closing parenthesis");
    }
}
