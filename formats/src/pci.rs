//! PCI addresses in every form the project meets, as one value.
//!
//! - hwloc and the GPU table: `0000:1b:00.0` (domain of at least four
//!   lowercase hex digits, bus, device, function);
//! - NVML: `00000000:1B:00.0` (eight-digit domain, uppercase);
//! - the kernel log: `0000:1b:00` (no function; a GPU is function 0), with or
//!   without a `PCI:` prefix;
//! - `lspci`: `1b:00.0` (no domain: domain 0).
//!
//! [`PciAddr::parse`] reads them all; [`PciAddr::hwloc`], [`PciAddr::nvml`]
//! and [`PciAddr::kernel`] print each form. Two addresses are equal when they
//! name the same device (domain, bus, device): the kernel log's `0000:1b:00`
//! equals NVML's `00000000:1B:00.0`. Where the function matters (two
//! functions of one device), compare [`PciAddr::function`] as well.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

/// The longest text [`PciAddr::parse`] looks at, in bytes (after trimming).
pub const MAX_TEXT_BYTES: usize = 32;

/// A PCI address: domain, bus, device and, when the text gave one, function.
#[derive(Clone, Copy, Debug)]
pub struct PciAddr {
    domain: u32,
    bus: u8,
    device: u8,
    function: Option<u8>,
}

/// Why a text is not a PCI address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PciAddrErrorKind {
    /// Empty, or longer than [`MAX_TEXT_BYTES`].
    Length,
    /// Not two or three `:`-separated parts (`bus:device[.function]` with an
    /// optional domain in front), or a `.` with nothing after it.
    Shape,
    /// A part that is not hex digits, or has too many of them (domain 8, bus
    /// and device 2, function 1).
    Digits,
    /// A device above `0x1f` or a function above 7.
    Range,
    /// No function where the caller needs one ([`PciAddr::parse_with_function`]).
    NoFunction,
}

/// A text that is not a PCI address, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciAddrError {
    /// What is wrong with it.
    pub kind: PciAddrErrorKind,
    /// The text, at most [`MAX_TEXT_BYTES`] bytes of it.
    pub text: String,
}

impl fmt::Display for PciAddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.kind {
            PciAddrErrorKind::Length => "empty or too long",
            PciAddrErrorKind::Shape => "not [domain:]bus:device[.function]",
            PciAddrErrorKind::Digits => "a part is not hex digits of the right length",
            PciAddrErrorKind::Range => "device above 0x1f or function above 7",
            PciAddrErrorKind::NoFunction => "no function number (.0)",
        };
        write!(f, "'{}' is not a PCI bus id: {why}; write it as 0000:1b:00.0", self.text)
    }
}

impl std::error::Error for PciAddrError {}

impl PciAddr {
    /// Reads any of the forms in the module docs; surrounding whitespace and a
    /// `PCI:` prefix are ignored, hex digits may be of either case.
    ///
    /// # Errors
    /// A [`PciAddrError`] whose kind says what is wrong.
    ///
    /// ```
    /// use slurm_formats::pci::PciAddr;
    /// let nvml = PciAddr::parse("00000000:1B:00.0").unwrap();
    /// assert_eq!(nvml, PciAddr::parse("0000:1b:00").unwrap());
    /// assert_eq!(nvml.hwloc(), "0000:1b:00.0");
    /// ```
    pub fn parse(text: &str) -> Result<PciAddr, PciAddrError> {
        let s = text.trim();
        let fail = |kind| {
            let end = (0..=MAX_TEXT_BYTES.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
            PciAddrError { kind, text: s[..end].to_owned() }
        };
        if s.is_empty() || s.len() > MAX_TEXT_BYTES {
            return Err(fail(PciAddrErrorKind::Length));
        }
        let s = s.strip_prefix("PCI:").unwrap_or(s);
        let mut parts = s.split(':');
        let (domain, bus, devfn) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(d), Some(b), Some(f), None) => (d, b, f),
            (Some(b), Some(f), None, None) => ("0", b, f),
            _ => return Err(fail(PciAddrErrorKind::Shape)),
        };
        let (dev, func) = match devfn.split_once('.') {
            Some((dev, func)) => (dev, Some(func)),
            None => (devfn, None),
        };
        let hex = |s: &str, max_digits: usize| -> Result<u32, PciAddrError> {
            if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(fail(PciAddrErrorKind::Digits));
            }
            u32::from_str_radix(s, 16).map_err(|_| fail(PciAddrErrorKind::Digits))
        };
        let domain = hex(domain, 8)?;
        let bus = hex(bus, 2)?;
        let device = hex(dev, 2)?;
        let function = func.map(|f| hex(f, 1)).transpose()?;
        if device > 0x1f || function.is_some_and(|f| f > 7) {
            return Err(fail(PciAddrErrorKind::Range));
        }
        let byte = |v: u32| u8::try_from(v).map_err(|_| fail(PciAddrErrorKind::Range));
        Ok(PciAddr {
            domain,
            bus: byte(bus)?,
            device: byte(device)?,
            function: function.map(byte).transpose()?,
        })
    }

    /// Like [`PciAddr::parse`], but the text must name a function (hwloc's
    /// and NVML's forms, `lspci`'s), as a PCI device of hwloc's does.
    ///
    /// # Errors
    /// As [`PciAddr::parse`], and [`PciAddrErrorKind::NoFunction`] for the
    /// kernel's `0000:1b:00`.
    pub fn parse_with_function(text: &str) -> Result<PciAddr, PciAddrError> {
        let addr = PciAddr::parse(text)?;
        if addr.function.is_none() {
            let s = text.trim();
            return Err(PciAddrError {
                kind: PciAddrErrorKind::NoFunction,
                text: s.get(..MAX_TEXT_BYTES).unwrap_or(s).to_owned(),
            });
        }
        Ok(addr)
    }

    /// The PCI domain (segment).
    pub fn domain(self) -> u32 {
        self.domain
    }

    /// The bus number.
    pub fn bus(self) -> u8 {
        self.bus
    }

    /// The device number (0 to `0x1f`).
    pub fn device(self) -> u8 {
        self.device
    }

    /// The function number, when the text gave one (the kernel log's form has none).
    pub fn function(self) -> Option<u8> {
        self.function
    }

    /// Whether the two name the same device and, where both texts gave one,
    /// the same function (a missing function matches only function 0).
    pub fn same_function(self, other: PciAddr) -> bool {
        self == other && self.function.unwrap_or(0) == other.function.unwrap_or(0)
    }

    /// hwloc's form, `0000:1b:00.0` (function 0 when the text gave none).
    pub fn hwloc(self) -> String {
        let PciAddr { domain, bus, device, function } = self;
        format!("{domain:04x}:{bus:02x}:{device:02x}.{:x}", function.unwrap_or(0))
    }

    /// NVML's form, `00000000:1B:00.0` (function 0 when the text gave none).
    pub fn nvml(self) -> String {
        let PciAddr { domain, bus, device, function } = self;
        format!("{domain:08X}:{bus:02X}:{device:02X}.{:X}", function.unwrap_or(0))
    }

    /// The kernel log's form, `0000:1b:00`: no function.
    pub fn kernel(self) -> String {
        let PciAddr { domain, bus, device, .. } = self;
        format!("{domain:04x}:{bus:02x}:{device:02x}")
    }

    fn key(self) -> (u32, u8, u8) {
        (self.domain, self.bus, self.device)
    }
}

/// hwloc's form when the text gave a function, the kernel's when it did not:
/// the form it was read in, normalized.
impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.function {
            Some(_) => f.write_str(&self.hwloc()),
            None => f.write_str(&self.kernel()),
        }
    }
}

impl std::str::FromStr for PciAddr {
    type Err = PciAddrError;

    fn from_str(s: &str) -> Result<PciAddr, PciAddrError> {
        PciAddr::parse(s)
    }
}

/// Equal when domain, bus and device are: the function is not compared.
impl PartialEq for PciAddr {
    fn eq(&self, other: &PciAddr) -> bool {
        self.key() == other.key()
    }
}

impl Eq for PciAddr {}

impl Hash for PciAddr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// By domain, bus and device, as [`PartialEq`].
impl Ord for PciAddr {
    fn cmp(&self, other: &PciAddr) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for PciAddr {
    fn partial_cmp(&self, other: &PciAddr) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> PciAddr {
        PciAddr::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn kind(text: &str) -> PciAddrErrorKind {
        PciAddr::parse(text).unwrap_err().kind
    }

    #[test]
    fn every_form_reads_and_prints() {
        for text in
            ["0000:1b:00.0", "00000000:1B:00.0", "0000:1b:00", "PCI:0000:1b:00", "1b:00.0", " 0000:1B:00.0\n"]
        {
            let a = p(text);
            assert_eq!((a.domain(), a.bus(), a.device()), (0, 0x1b, 0), "{text:?}");
            assert_eq!(a.hwloc(), "0000:1b:00.0", "{text:?}");
            assert_eq!(a.nvml(), "00000000:1B:00.0", "{text:?}");
            assert_eq!(a.kernel(), "0000:1b:00", "{text:?}");
        }
    }

    #[test]
    fn the_kernel_form_has_no_function() {
        let a = p("0000:3b:00");
        assert_eq!(a.function(), None);
        assert_eq!(a.to_string(), "0000:3b:00");
        assert_eq!(p("0000:3b:00.1").function(), Some(1));
        assert_eq!(p("0000:3b:00.1").to_string(), "0000:3b:00.1");
        assert_eq!(
            PciAddr::parse_with_function("0000:3b:00").unwrap_err().kind,
            PciAddrErrorKind::NoFunction
        );
        assert_eq!(PciAddr::parse_with_function("0000:3b:00.0").unwrap().function(), Some(0));
    }

    #[test]
    fn domain_zero_by_default_and_wide_domains() {
        assert_eq!(p("3b:00.0").domain(), 0);
        assert_eq!(p("3b:00").domain(), 0);
        assert_eq!(p("00000019:01:00.0").hwloc(), "0019:01:00.0");
        assert_eq!(p("0019:01:00").nvml(), "00000019:01:00.0");
        assert_eq!(p("10000:01:00.1").hwloc(), "10000:01:00.1");
        assert_eq!(p("10000:01:00.1").kernel(), "10000:01:00");
        assert_eq!(p("ffffffff:ff:1f.7").nvml(), "FFFFFFFF:FF:1F.7");
    }

    #[test]
    fn case_does_not_matter() {
        assert_eq!(p("0000:AB:1F.7").hwloc(), "0000:ab:1f.7");
        assert_eq!(p("0000:ab:1f.7").nvml(), "00000000:AB:1F.7");
        assert_eq!(p("0000:Ab:1f"), p("0000:aB:1F.0"));
    }

    #[test]
    fn equal_by_device() {
        assert_eq!(p("0000:1b:00"), p("00000000:1B:00.0"));
        assert_eq!(p("0000:1b:00.0"), p("0000:1b:00.1"), "the function is not compared");
        assert!(!p("0000:1b:00.0").same_function(p("0000:1b:00.1")));
        assert!(p("0000:1b:00").same_function(p("0000:1b:00.0")));
        assert_ne!(p("0000:1b:00"), p("0000:1b:01"));
        assert_ne!(p("0000:1b:00"), p("0000:1c:00"));
        assert_ne!(p("0000:1b:00"), p("0001:1b:00"));
        let mut v = [p("0001:00:00.0"), p("0000:1b:00"), p("0000:02:00.0")];
        v.sort();
        assert_eq!(
            v.iter().map(|a| a.hwloc()).collect::<Vec<_>>(),
            ["0000:02:00.0", "0000:1b:00.0", "0001:00:00.0"]
        );
        let set: std::collections::HashSet<PciAddr> = [p("0000:1b:00"), p("00000000:1B:00.0")].into();
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn errors_have_a_kind() {
        use PciAddrErrorKind::*;
        for (text, want) in [
            ("", Length),
            ("  ", Length),
            ("0000:3b:00.0".repeat(5).as_str(), Length),
            ("3b", Shape),
            ("1b.0", Shape),
            ("a:b:c:d.0", Shape),
            ("0000:3b:00:00", Shape),
            ("0000:3b:00.", Digits),
            ("0000:1b:00.0.0", Digits),
            ("000000000:3b:00", Digits),
            ("0000:3bb:00", Digits),
            ("g:3b:00", Digits),
            ("0000:1g:00.0", Digits),
            ("0000:+1:00.0", Digits),
            ("PCI:", Shape),
            ("0000:3b:20", Range),
            ("0000:1b:20.0", Range),
            ("0000:3b:00.8", Range),
        ] {
            assert_eq!(kind(text), want, "{text:?}");
        }
        let e = PciAddr::parse("zz:00.0").unwrap_err();
        assert!(e.to_string().starts_with("'zz:00.0' is not a PCI bus id"), "{e}");
    }
}
