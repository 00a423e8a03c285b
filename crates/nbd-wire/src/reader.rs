//! Bounds-checked big-endian reading and writing helpers shared by the
//! parsers and encoders. A [`Reader`] walks a payload whose full length is
//! already known to be present, so running short inside it means the message
//! is malformed, not incomplete.

use crate::{WireError, MAX_STRING_LEN};

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if len > self.buf.len() {
            return Err(WireError::Malformed {
                what: self.what,
                reason: "field extends past the end of the payload",
            });
        }
        let (head, tail) = self.buf.split_at(len);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A string prefixed by a 32-bit length.
    pub(crate) fn string_u32(&mut self, what: &'static str) -> Result<String, WireError> {
        let len = self.u32()?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > MAX_STRING_LEN {
            return Err(WireError::StringTooLong {
                what,
                length: len,
                limit: MAX_STRING_LEN,
            });
        }
        let bytes = self.bytes(len)?;
        protocol_string(bytes, what)
    }

    /// Fails unless the whole payload was consumed.
    pub(crate) fn finish(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed {
                what: self.what,
                reason: "trailing bytes after the last field",
            })
        }
    }
}

/// Checks the protocol's string rules: UTF-8, no NUL, at most
/// [`MAX_STRING_LEN`] bytes.
pub(crate) fn protocol_string(bytes: &[u8], what: &'static str) -> Result<String, WireError> {
    if bytes.len() > MAX_STRING_LEN {
        return Err(WireError::StringTooLong {
            what,
            length: bytes.len(),
            limit: MAX_STRING_LEN,
        });
    }
    if bytes.contains(&0) {
        return Err(WireError::BadString { what });
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(WireError::BadString { what }),
    }
}

/// Human-readable text (messages, descriptions): lossy UTF-8 is good enough
/// for display, so a sloppy peer's message is shown rather than rejected.
pub(crate) fn human_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Validates a name-like string before encoding it.
pub(crate) fn check_name(s: &str, what: &'static str) -> Result<(), WireError> {
    if s.len() > MAX_STRING_LEN {
        return Err(WireError::StringTooLong {
            what,
            length: s.len(),
            limit: MAX_STRING_LEN,
        });
    }
    if s.as_bytes().contains(&0) {
        return Err(WireError::BadString { what });
    }
    Ok(())
}

/// Cuts human-readable text to [`MAX_STRING_LEN`] bytes on a character
/// boundary.
pub(crate) fn truncate_text(s: &str) -> &str {
    if s.len() <= MAX_STRING_LEN {
        return s;
    }
    let mut end = MAX_STRING_LEN;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// Reads a fixed-size prefix of `buf`, or reports how much is needed.
pub(crate) fn fixed<const N: usize>(buf: &[u8]) -> Result<[u8; N], WireError> {
    match buf.get(..N) {
        Some(head) => {
            let mut out = [0u8; N];
            out.copy_from_slice(head);
            Ok(out)
        }
        None => Err(WireError::Incomplete(N)),
    }
}

pub(crate) fn be_u16(bytes: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(src) = bytes.get(at..at + 2) {
        a.copy_from_slice(src);
    }
    u16::from_be_bytes(a)
}

pub(crate) fn be_u32(bytes: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(src) = bytes.get(at..at + 4) {
        a.copy_from_slice(src);
    }
    u32::from_be_bytes(a)
}

pub(crate) fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(src) = bytes.get(at..at + 8) {
        a.copy_from_slice(src);
    }
    u64::from_be_bytes(a)
}

/// Length of a variable field as the u32 the wire carries, or `TooLarge`.
pub(crate) fn wire_len(len: usize, limit: usize, what: &'static str) -> Result<u32, WireError> {
    if len > limit {
        return Err(WireError::TooLarge {
            what,
            length: len as u64,
            limit: limit as u64,
        });
    }
    u32::try_from(len).map_err(|_| WireError::TooLarge {
        what,
        length: len as u64,
        limit: u32::MAX as u64,
    })
}
