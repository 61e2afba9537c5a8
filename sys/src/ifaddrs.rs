//! The node's network interfaces and their addresses, as `getifaddrs(3)`
//! lists them, behind one safe function (feature `ifaddrs`, used by
//! `gpu-node-agent`, which forbids `unsafe`).
//!
//! Each entry is copied out of the C list before the list is freed; nothing
//! here keeps a pointer.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `IFF_UP`: the interface is administratively up.
pub const IFF_UP: u32 = 0x1;
/// `IFF_LOOPBACK`.
pub const IFF_LOOPBACK: u32 = 0x8;
/// `IFF_RUNNING`: the link has a carrier (`RFC 2863` operational state up).
pub const IFF_RUNNING: u32 = 0x40;

/// One entry of `getifaddrs()`'s list: an interface, and one of its
/// addresses (`None` for the `AF_PACKET` entry every interface has, and for
/// other families).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// `ifa_name`.
    pub name: String,
    /// `ifa_flags` (`IFF_*`).
    pub flags: u32,
    /// `ifa_addr` when it is `AF_INET` or `AF_INET6`.
    pub addr: Option<IpAddr>,
    /// The netmask's length in bits (its set bits), when there is one.
    pub prefix: Option<u8>,
}

/// `getifaddrs()`: every entry, in the list's order (on Linux: each
/// interface's `AF_PACKET` entry, then the IPv4 addresses, then IPv6).
///
/// # Errors
/// `getifaddrs()` failed (`errno`).
pub fn getifaddrs() -> io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a live, writable pointer; on success getifaddrs sets
    // it to a list that is freed below, once, with freeifaddrs.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is `head` or an `ifa_next` of the list getifaddrs
        // returned, not yet freed.
        let entry = unsafe { &*at };
        let name = if entry.ifa_name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null `ifa_name` is a NUL-terminated string that
            // lives as long as the list.
            unsafe { CStr::from_ptr(entry.ifa_name) }.to_string_lossy().into_owned()
        };
        // SAFETY: `ifa_addr` is null or a socket address of the list.
        let addr = unsafe { ip_of(entry.ifa_addr) };
        let prefix = match addr {
            // SAFETY: `ifa_netmask` is null or a socket address of the list,
            // of the address's family (glibc sets the family; some libcs
            // leave it 0, so the address's decides).
            Some(a) => unsafe { mask_bits(entry.ifa_netmask, a.is_ipv4()) },
            None => None,
        };
        out.push(IfAddr { name, flags: entry.ifa_flags, addr, prefix });
        at = entry.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference
    // into the list outlives this call (every field was copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IPv4 or IPv6 address a socket address holds.
///
/// # Safety
/// `sa` is null or points to a socket address whose `sa_family` says how
/// long it is (`sockaddr_in` for `AF_INET`, `sockaddr_in6` for `AF_INET6`).
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null, and every socket address starts with its family.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says it is a `sockaddr_in`; read unaligned,
            // the list's buffer promises no alignment of the larger struct.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, a `sockaddr_in6`.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// A netmask's length: its set bits.
///
/// # Safety
/// `sa` is null or points to a `sockaddr_in` (`v4`) or `sockaddr_in6`.
unsafe fn mask_bits(sa: *const libc::sockaddr, v4: bool) -> Option<u8> {
    if sa.is_null() {
        return None;
    }
    let bits = if v4 {
        // SAFETY: the caller's promise: a `sockaddr_in`.
        let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
        sin.sin_addr.s_addr.count_ones()
    } else {
        // SAFETY: the caller's promise: a `sockaddr_in6`.
        let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
        sin6.sin6_addr.s6_addr.iter().map(|b| b.count_ones()).sum()
    };
    // At most 128.
    u8::try_from(bits).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Linux machine (and network namespace) has `lo`, with its flags.
    #[test]
    fn lists_the_loopback() {
        let all = getifaddrs().unwrap_or_default();
        let lo: Vec<&IfAddr> = all.iter().filter(|e| e.name == "lo").collect();
        assert!(!lo.is_empty(), "{all:?}");
        assert!(lo.iter().all(|e| e.flags & IFF_LOOPBACK != 0), "{lo:?}");
        if let Some(v4) = lo.iter().find(|e| e.addr == Some(IpAddr::V4(Ipv4Addr::LOCALHOST))) {
            assert_eq!(v4.prefix, Some(8), "{v4:?}");
        }
    }
}
