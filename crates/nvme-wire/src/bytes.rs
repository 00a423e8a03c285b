//! Little-endian field access and fixed-width string fields shared by every
//! parser and encoder. Reads outside the buffer yield zero and writes
//! outside it are dropped, so no caller can panic on a bad offset; callers
//! check lengths before they read or write.

use crate::WireError;

pub(crate) fn u8_at(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = at.checked_add(N).and_then(|end| b.get(at..end)) {
        out.copy_from_slice(src);
    }
    out
}

pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(array(b, at))
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(array(b, at))
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(array(b, at))
}

pub(crate) fn bytes_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    array(b, at)
}

pub(crate) fn put(b: &mut [u8], at: usize, src: &[u8]) {
    if let Some(dst) = at.checked_add(src.len()).and_then(|end| b.get_mut(at..end)) {
        dst.copy_from_slice(src);
    }
}

pub(crate) fn put8(b: &mut [u8], at: usize, v: u8) {
    if let Some(dst) = b.get_mut(at) {
        *dst = v;
    }
}

pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    put(b, at, &v.to_le_bytes());
}

pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    put(b, at, &v.to_le_bytes());
}

pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    put(b, at, &v.to_le_bytes());
}

pub(crate) fn put128(b: &mut [u8], at: usize, v: u128) {
    put(b, at, &v.to_le_bytes());
}

/// Longest NVMe Qualified Name, in bytes, without its terminating NUL.
pub const NQN_MAX_LEN: usize = 223;

/// Checks a left-justified, space-padded ASCII field (serial number, model
/// number, firmware revision, transport address ...): printable ASCII only,
/// at most `width` bytes.
pub(crate) fn check_ascii(s: &str, width: usize, what: &'static str) -> Result<(), WireError> {
    if s.len() > width {
        return Err(WireError::DoesNotFit {
            what,
            reason: "longer than its field",
        });
    }
    if !s.bytes().all(|c| (0x20..=0x7e).contains(&c)) {
        return Err(WireError::DoesNotFit {
            what,
            reason: "not printable ASCII",
        });
    }
    Ok(())
}

/// Writes a checked ASCII string left-justified into `width` bytes, padded
/// with spaces.
pub(crate) fn put_ascii(b: &mut [u8], at: usize, width: usize, s: &str) {
    for i in 0..width {
        put8(b, at + i, s.as_bytes().get(i).copied().unwrap_or(b' '));
    }
}

/// Checks an NVMe Qualified Name for encoding: at most [`NQN_MAX_LEN`]
/// bytes, no NUL.
pub(crate) fn check_nqn(s: &str, what: &'static str) -> Result<(), WireError> {
    if s.len() > NQN_MAX_LEN {
        return Err(WireError::DoesNotFit {
            what,
            reason: "longer than 223 bytes",
        });
    }
    if s.as_bytes().contains(&0) {
        return Err(WireError::DoesNotFit {
            what,
            reason: "contains a NUL byte",
        });
    }
    Ok(())
}

/// Writes a checked string NUL-padded into `width` bytes.
pub(crate) fn put_nul_padded(b: &mut [u8], at: usize, width: usize, s: &str) {
    for i in 0..width {
        put8(b, at + i, s.as_bytes().get(i).copied().unwrap_or(0));
    }
}

/// Reads a NUL-terminated UTF-8 string of at most `max` bytes from a
/// `width`-byte field starting at `at`.
pub(crate) fn nul_terminated(
    b: &[u8],
    at: usize,
    width: usize,
    max: usize,
    what: &'static str,
) -> Result<String, WireError> {
    let field =
        at.checked_add(width)
            .and_then(|end| b.get(at..end))
            .ok_or(WireError::TooShort {
                what,
                needed: at.saturating_add(width),
                got: b.len(),
            })?;
    let len = field
        .iter()
        .position(|&c| c == 0)
        .ok_or(WireError::BadField {
            what,
            offset: at,
            reason: "string is not NUL-terminated",
        })?;
    if len > max {
        return Err(WireError::BadField {
            what,
            offset: at,
            reason: "string is too long",
        });
    }
    let text = field.get(..len).unwrap_or(&[]);
    std::str::from_utf8(text)
        .map(str::to_owned)
        .map_err(|_| WireError::BadField {
            what,
            offset: at,
            reason: "string is not UTF-8",
        })
}

/// Reads a space- or NUL-padded ASCII field, trimming the padding.
pub(crate) fn padded_ascii(b: &[u8], at: usize, width: usize) -> String {
    let field = at
        .checked_add(width)
        .and_then(|end| b.get(at..end))
        .unwrap_or(&[]);
    let end = field
        .iter()
        .rposition(|&c| c != b' ' && c != 0)
        .map_or(0, |p| p + 1);
    String::from_utf8_lossy(field.get(..end).unwrap_or(&[])).into_owned()
}
