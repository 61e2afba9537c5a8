//! TCP ports for rendezvous: the admin's range, the derived port of a step,
//! and the kernel's own port settings it must stay clear of.
//!
//! The derived port (see [`derive_port`]):
//!
//! ```text
//! port = LO + 16 * (job_id mod blocks) + ((step_id + het_component) mod 16)
//! blocks = (HI - LO + 1) / 16
//! ```
//!
//! Every node of a step computes the same port with no communication; steps of
//! one job whose ids differ mod 16 (any 16 concurrent steps) get different
//! ports; jobs whose ids differ mod `blocks` (625 with the default range, so any
//! two jobs submitted fewer than 625 ids apart) never share a port.

use std::fmt;

/// The admin's port range when the plugstack line names none. Below Linux's
/// default ephemeral range (32768-60999), so outgoing connections never take it.
pub const DEFAULT_PORT_RANGE: PortRange = PortRange { lo: 20000, hi: 29999 };
/// Consecutive ports per job in the derived-port scheme.
const STEP_BLOCK: u32 = 16;

/// An inclusive range of TCP ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port.
    pub hi: u16,
}

impl PortRange {
    /// Parses `LO-HI` with 1024 <= LO <= HI <= 65535.
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(text: &str) -> Result<PortRange, String> {
        let (lo, hi) = text.split_once('-').ok_or_else(|| format!("expected LO-HI, got '{text}'"))?;
        let port = |s: &str| s.parse::<u16>().map_err(|_| format!("'{s}' is not a port number"));
        let (lo, hi) = (port(lo)?, port(hi)?);
        if lo < 1024 {
            return Err(format!("{lo} is a privileged port; use 1024 or above"));
        }
        if lo > hi {
            return Err(format!("{lo}-{hi} runs backwards"));
        }
        Ok(PortRange { lo, hi })
    }

    /// Number of ports.
    pub fn len(self) -> u32 {
        u32::from(self.hi) - u32::from(self.lo) + 1
    }

    /// Whether the range is empty (never, for a parsed range).
    pub fn is_empty(self) -> bool {
        self.hi < self.lo
    }

    /// Whether the two ranges share a port.
    pub fn overlaps(self, other: PortRange) -> bool {
        self.lo <= other.hi && other.lo <= self.hi
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

/// The derived port of a step (see the module docs). Every component of a
/// heterogeneous step has the leader's job id and the same step id, so they
/// share it.
pub fn derive_port(range: PortRange, job_id: u32, step_id: u32) -> u16 {
    let size = range.len();
    let block = STEP_BLOCK.min(size);
    let blocks = size / block;
    let offset = block * (job_id % blocks) + step_id % block;
    // offset < size <= 65536 - lo, so the sum fits in u16.
    u16::try_from(u32::from(range.lo) + offset).unwrap_or(range.hi)
}

/// The last port of `SLURM_STEP_RESV_PORTS` (`12000-12003` or `12000,12005`): the first may be taken by the
/// MPI plugin (mpi/cray_shasta exports it as `PMI_CONTROL_PORT`).
pub fn last_reserved_port(text: &str) -> Option<u16> {
    let last = text.trim().rsplit([',', '-']).next()?;
    last.trim().parse().ok().filter(|p| *p > 0)
}

/// Linux's `ip_local_port_range` file (`32768\t60999`).
pub fn parse_ephemeral_range(text: &str) -> Option<PortRange> {
    let mut it = text.split_whitespace().map(|s| s.parse::<u16>().ok());
    let (lo, hi) = (it.next()??, it.next()??);
    (lo <= hi).then_some(PortRange { lo, hi })
}

/// Linux's `ip_local_reserved_ports` file (`8080,9000-9100`); empty is none.
pub fn parse_reserved_ports(text: &str) -> Option<Vec<PortRange>> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let (lo, hi) = (lo.trim().parse::<u16>().ok()?, hi.trim().parse::<u16>().ok()?);
        out.push(PortRange { lo, hi });
    }
    Some(out)
}

/// The socket inodes listening on `port` in the text of `/proc/net/tcp` or
/// `/proc/net/tcp6` (state `0A`), to find which process holds a port.
pub fn listening_inodes(proc_net_tcp: &str, port: u16) -> Vec<u64> {
    let want = format!("{port:04X}");
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            (local_port == want && *f.get(3)? == "0A").then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_listener_of_a_port() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:5BA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:5BA0 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_inodes(text, 23456), vec![4242]);
        assert_eq!(listening_inodes(text, 22), vec![99]);
        assert!(listening_inodes(text, 80).is_empty());
        assert!(listening_inodes("garbage\n1 2 3", 80).is_empty());
    }

    #[test]
    fn port_ranges_parse_strictly() {
        assert_eq!(PortRange::parse("20000-29999"), Ok(PortRange { lo: 20000, hi: 29999 }));
        for bad in ["", "20000", "3-2", "80-100", "20000-70000", "a-b", "2000-1999"] {
            assert!(PortRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn derived_ports_stay_in_range_and_separate_steps_and_jobs() {
        let r = DEFAULT_PORT_RANGE;
        let p = derive_port(r, 1234, 0);
        assert!((r.lo..=r.hi).contains(&p));
        // Concurrent steps of one job.
        let steps: std::collections::HashSet<u16> = (0..16).map(|s| derive_port(r, 1234, s)).collect();
        assert_eq!(steps.len(), 16);
        // Jobs close in id.
        let jobs: std::collections::HashSet<u16> = (1000..1625).map(|j| derive_port(r, j, 0)).collect();
        assert_eq!(jobs.len(), 625);
        // The batch step and extreme ids stay in range.
        for (j, s) in [(u32::MAX, u32::MAX), (0, 0xffff_fffb), (7, 3)] {
            assert!((r.lo..=r.hi).contains(&derive_port(r, j, s)));
        }
        // A tiny range still works.
        let tiny = PortRange { lo: 40000, hi: 40002 };
        assert!((40000..=40002).contains(&derive_port(tiny, 99, 5)));
    }

    #[test]
    fn default_range_avoids_linux_ephemeral_ports() {
        let eph = parse_ephemeral_range("32768\t60999\n").unwrap();
        assert!(!DEFAULT_PORT_RANGE.overlaps(eph));
        assert!(PortRange { lo: 30000, hi: 40000 }.overlaps(eph));
        assert_eq!(parse_reserved_ports("\n"), Some(vec![]));
        assert_eq!(
            parse_reserved_ports("8080,9000-9100"),
            Some(vec![PortRange { lo: 8080, hi: 8080 }, PortRange { lo: 9000, hi: 9100 }])
        );
    }

    #[test]
    fn reserved_ports_take_the_last() {
        assert_eq!(last_reserved_port("12000-12003"), Some(12003));
        assert_eq!(last_reserved_port("12005,12007"), Some(12007));
        assert_eq!(last_reserved_port("12005"), Some(12005));
        assert_eq!(last_reserved_port("junk"), None);
    }
}
