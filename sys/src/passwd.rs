//! A user's home directory from the passwd database (`getpwuid_r(3)`), behind
//! one safe function (feature `passwd`): the plugin reads `~/.nccl.conf` from
//! the job's user's entry, never from `$HOME`, and `spank-gpu explain` from
//! its own user's, as NCCL does (`getpwuid(getuid())->pw_dir`).

use std::ffi::{CStr, c_char};
use std::io;
use std::ptr;

/// The home directory of `uid`'s passwd entry.
///
/// # Errors
/// The lookup failed, `uid` has no entry, or its home is not an absolute path.
pub fn home_of(uid: u32) -> io::Result<String> {
    // The entry's strings live in `buf`; grown while the C library says
    // ERANGE, up to a bound far past any real entry.
    let mut len: usize = 1024;
    loop {
        let mut buf = vec![0 as c_char; len];
        // SAFETY: all zero bytes is a valid `passwd` (null pointers, zero ids).
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = ptr::null_mut();
        // SAFETY: `pw`, `buf` (of `len` bytes) and `found` are valid for the
        // call; getpwuid_r writes the entry's strings into `buf` only and
        // sets `found` to `&pw` or null. No static state (reentrant).
        let rc = unsafe { libc::getpwuid_r(uid, &raw mut pw, buf.as_mut_ptr(), len, &raw mut found) };
        if rc == libc::ERANGE && len < 1 << 20 {
            len *= 4;
            continue;
        }
        if rc != 0 {
            let e = io::Error::from_raw_os_error(rc);
            return Err(io::Error::new(e.kind(), format!("getpwuid_r({uid}): {e}")));
        }
        if found.is_null() || pw.pw_dir.is_null() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("uid {uid} has no passwd entry")));
        }
        // SAFETY: a non-null `pw_dir` of a found entry is a NUL-terminated
        // string inside `buf`, which is alive here; it is copied at once.
        let dir = unsafe { CStr::from_ptr(pw.pw_dir) }.to_string_lossy().into_owned();
        if !dir.starts_with('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("uid {uid}'s home '{dir}' is not an absolute path"),
            ));
        }
        return Ok(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_home_is_found_and_an_unknown_uid_is_not() {
        assert_eq!(home_of(0).unwrap(), "/root");
        assert_eq!(home_of(4_000_000_000).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
