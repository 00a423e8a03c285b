//! The changed-block stream of `basalt volume export-diff` and `import-diff`
//! (the role `rbd export-diff` files play for Ceph): a header naming the
//! snapshot it starts from and the point it leads to, then the changed
//! ranges as data or zeros, then an end record. Pure: bytes in, records out
//! and back.
//!
//! Layout: the 16-byte magic `basalt-diff v1\n\0`, then records, each
//! `tag: u8 | body length: u32 | body | crc32c(tag, length, body): u32`
//! (integers big-endian):
//! - `f` from (once, optional): the `VOLUME@SNAPSHOT` the diff starts from;
//! - `t` to (once): `VOLUME@SNAPSHOT` or `VOLUME` it leads to;
//! - `s` size (once): the size of `to` in bytes;
//! - `w` data: offset u64, then the bytes (at most [`MAX_DATA`]);
//! - `z` zeros: offset u64, length u64;
//! - `e` end: the number of records before it (u64).
//!
//! Invariants of a stream [`DiffParser`] accepts: the header records come
//! first (`t` and `s` required), ranges come in increasing order without
//! overlap and end within `size`, every record's CRC matches, and nothing
//! follows the end record, whose count matches. A truncated or damaged
//! stream is an error before or at the first bad record, so a consumer that
//! checks a whole file first applies nothing from a bad one.

/// The first bytes of every stream.
pub const DIFF_MAGIC: &[u8; 16] = b"basalt-diff v1\n\0";
/// Most bytes in one data record.
pub const MAX_DATA: usize = 4 << 20;
/// Longest name in a `from` or `to` record.
const MAX_NAME: usize = 256;

/// One record of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffRecord {
    From(String),
    To(String),
    Size(u64),
    Data { offset: u64, data: Vec<u8> },
    Zero { offset: u64, len: u64 },
    End { records: u64 },
}

/// What is wrong with a stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffStreamError {
    /// More bytes are needed (the total the current record needs).
    #[error("truncated diff stream: it ends inside a record")]
    Incomplete(usize),
    #[error("not a basalt diff stream (bad magic)")]
    BadMagic,
    #[error("damaged diff stream: record {index} fails its checksum")]
    Checksum { index: u64 },
    #[error("invalid diff stream: record {index}: {reason}")]
    Invalid { index: u64, reason: String },
}

/// Appends the stream's magic.
pub fn encode_magic(out: &mut Vec<u8>) {
    out.extend_from_slice(DIFF_MAGIC);
}

/// Appends one record. Names and data beyond the limits are the caller's
/// bug; they are refused by the parser, so they are refused here too.
pub fn encode_record(record: &DiffRecord, out: &mut Vec<u8>) -> Result<(), DiffStreamError> {
    let invalid = |reason: &str| DiffStreamError::Invalid {
        index: 0,
        reason: reason.to_string(),
    };
    let (tag, body): (u8, Vec<u8>) = match record {
        DiffRecord::From(name) | DiffRecord::To(name) => {
            if name.is_empty() || name.len() > MAX_NAME {
                return Err(invalid("name length out of range"));
            }
            let tag = if matches!(record, DiffRecord::From(_)) {
                b'f'
            } else {
                b't'
            };
            (tag, name.as_bytes().to_vec())
        }
        DiffRecord::Size(size) => (b's', size.to_be_bytes().to_vec()),
        DiffRecord::Data { offset, data } => {
            if data.is_empty() || data.len() > MAX_DATA {
                return Err(invalid("data record length out of range"));
            }
            let mut body = Vec::with_capacity(8 + data.len());
            body.extend_from_slice(&offset.to_be_bytes());
            body.extend_from_slice(data);
            (b'w', body)
        }
        DiffRecord::Zero { offset, len } => {
            let mut body = offset.to_be_bytes().to_vec();
            body.extend_from_slice(&len.to_be_bytes());
            (b'z', body)
        }
        DiffRecord::End { records } => (b'e', records.to_be_bytes().to_vec()),
    };
    let start = out.len();
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// Where a parser is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Magic,
    Header,
    Ranges,
    Ended,
}

/// Checks a stream record by record.
#[derive(Debug, Clone)]
pub struct DiffParser {
    phase: Phase,
    records: u64,
    from: Option<String>,
    to: Option<String>,
    size: Option<u64>,
    /// End of the last range.
    next_offset: u64,
}

impl Default for DiffParser {
    fn default() -> Self {
        DiffParser::new()
    }
}

impl DiffParser {
    pub fn new() -> DiffParser {
        DiffParser {
            phase: Phase::Magic,
            records: 0,
            from: None,
            to: None,
            size: None,
            next_offset: 0,
        }
    }

    pub fn from(&self) -> Option<&str> {
        self.from.as_deref()
    }
    pub fn to(&self) -> Option<&str> {
        self.to.as_deref()
    }
    pub fn size(&self) -> Option<u64> {
        self.size
    }
    /// The end record was read.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Ended
    }

    /// Parses the next item at the start of `buf`: the magic first (then
    /// `Ok((None, 16))`), then one record at a time. `Incomplete(n)`: `n`
    /// bytes are needed.
    pub fn next(&mut self, buf: &[u8]) -> Result<(Option<DiffRecord>, usize), DiffStreamError> {
        let index = self.records;
        let invalid = |reason: String| DiffStreamError::Invalid { index, reason };
        match self.phase {
            Phase::Magic => {
                let head = buf
                    .get(..DIFF_MAGIC.len())
                    .ok_or(DiffStreamError::Incomplete(DIFF_MAGIC.len()))?;
                if head != DIFF_MAGIC {
                    return Err(DiffStreamError::BadMagic);
                }
                self.phase = Phase::Header;
                return Ok((None, DIFF_MAGIC.len()));
            }
            Phase::Ended => return Err(invalid("data after the end record".into())),
            Phase::Header | Phase::Ranges => {}
        }
        let head = buf.get(..5).ok_or(DiffStreamError::Incomplete(5))?;
        let tag = head[0];
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_DATA + 8 {
            return Err(invalid(format!("a record of {len} bytes")));
        }
        let total = 5 + len + 4;
        let whole = buf.get(..total).ok_or(DiffStreamError::Incomplete(total))?;
        let (record, crc) = whole.split_at(5 + len);
        let expected = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(record) != expected {
            return Err(DiffStreamError::Checksum { index });
        }
        let body = &record[5..];
        let u64_at = |at: usize| -> Result<u64, DiffStreamError> {
            body.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| invalid(format!("record '{}' too short", tag as char)))
        };
        let exact = |n: usize| -> Result<(), DiffStreamError> {
            if body.len() == n {
                Ok(())
            } else {
                Err(invalid(format!(
                    "record '{}' has {} bytes, not {n}",
                    tag as char,
                    body.len()
                )))
            }
        };
        let parsed = match tag {
            b'f' | b't' => {
                if self.phase != Phase::Header {
                    return Err(invalid("a name after the ranges began".into()));
                }
                let name = std::str::from_utf8(body)
                    .ok()
                    .filter(|n| !n.is_empty() && n.len() <= MAX_NAME)
                    .ok_or_else(|| invalid("a name that is not short UTF-8".into()))?
                    .to_string();
                let slot = if tag == b'f' {
                    &mut self.from
                } else {
                    &mut self.to
                };
                if slot.is_some() {
                    return Err(invalid(format!("a second '{}' record", tag as char)));
                }
                *slot = Some(name.clone());
                if tag == b'f' {
                    DiffRecord::From(name)
                } else {
                    DiffRecord::To(name)
                }
            }
            b's' => {
                exact(8)?;
                if self.phase != Phase::Header || self.size.is_some() {
                    return Err(invalid("a misplaced size record".into()));
                }
                let size = u64_at(0)?;
                self.size = Some(size);
                DiffRecord::Size(size)
            }
            b'w' | b'z' | b'e' => {
                if self.phase == Phase::Header {
                    if self.to.is_none() || self.size.is_none() {
                        return Err(invalid("ranges before the to and size records".into()));
                    }
                    self.phase = Phase::Ranges;
                }
                let size = self.size.unwrap_or(0);
                let range = |offset: u64, n: u64| -> Result<(), DiffStreamError> {
                    if n == 0
                        || offset < self.next_offset
                        || offset.checked_add(n).is_none_or(|e| e > size)
                    {
                        return Err(invalid(format!(
                            "range at {offset} (+{n}) overlaps the previous one or passes the size {size}"
                        )));
                    }
                    Ok(())
                };
                match tag {
                    b'w' => {
                        let offset = u64_at(0)?;
                        let data = &body[8..];
                        range(offset, data.len() as u64)?;
                        self.next_offset = offset + data.len() as u64;
                        DiffRecord::Data {
                            offset,
                            data: data.to_vec(),
                        }
                    }
                    b'z' => {
                        exact(16)?;
                        let (offset, n) = (u64_at(0)?, u64_at(8)?);
                        range(offset, n)?;
                        self.next_offset = offset + n;
                        DiffRecord::Zero { offset, len: n }
                    }
                    _ => {
                        exact(8)?;
                        let records = u64_at(0)?;
                        if records != index {
                            return Err(invalid(format!(
                                "the end record counts {records} records, the stream had {index}"
                            )));
                        }
                        self.phase = Phase::Ended;
                        DiffRecord::End { records }
                    }
                }
            }
            other => return Err(invalid(format!("unknown record type {other:#04x}"))),
        };
        self.records += 1;
        Ok((Some(parsed), total))
    }
}

#[cfg(test)]
mod diff_tests {
    use super::*;

    fn stream(records: &[DiffRecord]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_magic(&mut out);
        for r in records {
            encode_record(r, &mut out).unwrap();
        }
        out
    }

    fn parse_all(buf: &[u8]) -> Result<Vec<DiffRecord>, DiffStreamError> {
        let mut p = DiffParser::new();
        let mut at = 0;
        let mut out = Vec::new();
        while !p.is_finished() {
            let (r, used) = p.next(&buf[at..])?;
            out.extend(r);
            at += used;
        }
        if at != buf.len() {
            p.next(&buf[at..])?;
        }
        Ok(out)
    }

    fn good() -> Vec<DiffRecord> {
        vec![
            DiffRecord::From("v@s1".into()),
            DiffRecord::To("v@s2".into()),
            DiffRecord::Size(1 << 20),
            DiffRecord::Data {
                offset: 4096,
                data: vec![7; 8192],
            },
            DiffRecord::Zero {
                offset: 65536,
                len: 4096,
            },
            DiffRecord::End { records: 5 },
        ]
    }

    #[test]
    fn a_stream_round_trips() {
        assert_eq!(parse_all(&stream(&good())).unwrap(), good());
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_caught() {
        let bytes = stream(&good());
        for cut in 0..bytes.len() {
            let e = parse_all(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(e, DiffStreamError::Incomplete(_)),
                "cut {cut}: {e}"
            );
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(parse_all(&bad).is_err(), "flipped byte {at} accepted");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(parse_all(&extra).is_err());
    }

    #[test]
    fn out_of_order_ranges_and_missing_headers_are_refused() {
        let mut r = good();
        r.swap(3, 4);
        let e = parse_all(&stream(&r)).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");
        let r = vec![
            DiffRecord::To("v".into()),
            DiffRecord::Data {
                offset: 0,
                data: vec![1],
            },
        ];
        let e = parse_all(&stream(&r)).unwrap_err().to_string();
        assert!(e.contains("before the to and size"), "{e}");
        let r = vec![
            DiffRecord::To("v".into()),
            DiffRecord::Size(10),
            DiffRecord::Zero { offset: 8, len: 4 },
        ];
        let e = parse_all(&stream(&r)).unwrap_err().to_string();
        assert!(e.contains("passes the size"), "{e}");
    }
}
