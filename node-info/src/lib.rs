//! What the node's C library says, in safe Rust through `nix`: its network
//! interfaces and their addresses (`getifaddrs(3)`), and a user's home
//! directory from the passwd database (`getpwuid_r(3)`). Used by the plugin
//! (`nccl_socket_net`, `~/.nccl.conf` of the job's user, never `$HOME`), by
//! `spank-gpu explain` and by the agent's `status`. No Slurm in here: none of
//! it is rebuilt for a Slurm release.

#![forbid(unsafe_code)]

use std::io;
use std::net::IpAddr;

use nix::ifaddrs::InterfaceAddress;
use nix::sys::socket::SockaddrStorage;
use nix::unistd::{Uid, User};

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
    let list = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    Ok(list.map(|entry| entry_of(&entry)).collect())
}

fn entry_of(entry: &InterfaceAddress) -> IfAddr {
    let addr = entry.address.as_ref().and_then(ip_of);
    let prefix = addr.and_then(|a| entry.netmask.as_ref().and_then(|m| mask_bits(m, a.is_ipv4())));
    // The flags are a C int of bits; the cast keeps every bit.
    #[allow(clippy::cast_sign_loss)]
    let flags = entry.flags.bits() as u32;
    IfAddr { name: entry.interface_name.clone(), flags, addr, prefix }
}

/// The IPv4 or IPv6 address a socket address holds.
fn ip_of(sa: &SockaddrStorage) -> Option<IpAddr> {
    if let Some(v4) = sa.as_sockaddr_in() {
        return Some(IpAddr::V4(v4.ip()));
    }
    sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
}

/// A netmask's length: its set bits (at most 128). glibc gives the mask its
/// address's family; a mask of another family has no length here.
fn mask_bits(sa: &SockaddrStorage, v4: bool) -> Option<u8> {
    let bits = if v4 {
        sa.as_sockaddr_in()?.ip().to_bits().count_ones()
    } else {
        sa.as_sockaddr_in6()?.ip().to_bits().count_ones()
    };
    u8::try_from(bits).ok()
}

/// The home directory of `uid`'s passwd entry.
///
/// # Errors
/// The lookup failed, `uid` has no entry, or its home is not an absolute path.
pub fn home_of(uid: u32) -> io::Result<String> {
    let user = User::from_uid(Uid::from_raw(uid))
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("getpwuid_r({uid}): {e}")))?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("uid {uid} has no passwd entry")))?;
    let dir = user.dir.to_string_lossy().into_owned();
    if !dir.starts_with('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("uid {uid}'s home '{dir}' is not an absolute path"),
        ));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Every Linux machine (and network namespace) has `lo`, with its flags.
    #[test]
    fn lists_the_loopback() {
        let all = getifaddrs().unwrap_or_default();
        let lo: Vec<&IfAddr> = all.iter().filter(|e| e.name == "lo").collect();
        assert!(!lo.is_empty(), "{all:?}");
        assert!(lo.iter().all(|e| e.flags & IFF_LOOPBACK != 0 && e.flags & IFF_UP != 0), "{lo:?}");
        let v4 = lo.iter().find(|e| e.addr == Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(v4.map(|e| e.prefix), Some(Some(8)), "{lo:?}");
    }

    #[test]
    fn roots_home_is_found_and_an_unknown_uid_is_not() {
        assert_eq!(home_of(0).unwrap(), "/root");
        assert_eq!(home_of(4_000_000_000).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
