//! Transmission phase: request headers, simple replies and structured reply
//! chunks, plus the NBD error codes.
//!
//! A request is a fixed 28-byte header; a WRITE is followed by `length` bytes
//! of data that this module does not touch, so a server can receive them
//! straight into its own (aligned) buffers. Likewise
//! [`encode_offset_data_header`] writes only the header of an OFFSET_DATA
//! chunk so the data can be sent from the buffer it was read into.

use crate::reader::{be_u16, be_u32, be_u64, fixed, human_text, truncate_text, wire_len, Reader};
use crate::{
    BlockStatusFlags, CommandFlags, ReplyFlags, WireError, MAX_CHUNK_PAYLOAD, REQUEST_MAGIC,
    SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};

/// Length of a request header.
pub const REQUEST_LEN: usize = 28;
/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Length of an OFFSET_DATA chunk before its data: header plus offset.
pub const OFFSET_DATA_HEADER_LEN: usize = CHUNK_HEADER_LEN + 8;
/// Most data one OFFSET_DATA chunk can carry (its length field is 32 bits
/// and includes the 8-byte offset).
pub const MAX_OFFSET_DATA_LEN: u32 = u32::MAX - 8;
/// Most descriptors the protocol wants in one BLOCK_STATUS chunk (2^20).
pub const MAX_BLOCK_STATUS_DESCRIPTORS: usize = 1 << 20;

/// Structured reply chunk types (`NBD_REPLY_TYPE_*`).
pub mod chunk_type {
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    /// Bit set in every error chunk type.
    pub const ERROR_BIT: u16 = 1 << 15;
    pub const ERROR: u16 = ERROR_BIT | 1;
    pub const ERROR_OFFSET: u16 = ERROR_BIT | 2;
}

/// Request types (`NBD_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// `NBD_CMD_READ` (0).
    Read,
    /// `NBD_CMD_WRITE` (1); followed by `length` bytes of data.
    Write,
    /// `NBD_CMD_DISC` (2); no reply.
    Disc,
    /// `NBD_CMD_FLUSH` (3).
    Flush,
    /// `NBD_CMD_TRIM` (4).
    Trim,
    /// `NBD_CMD_CACHE` (5).
    Cache,
    /// `NBD_CMD_WRITE_ZEROES` (6).
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS` (7).
    BlockStatus,
    /// Any other type, kept so the server can answer `NBD_EINVAL`.
    Unknown(u16),
}

impl Command {
    /// The canonical value for a wire code.
    pub fn from_code(code: u16) -> Command {
        match code {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            5 => Command::Cache,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    /// The wire code.
    pub fn code(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::Cache => 5,
            Command::WriteZeroes => 6,
            Command::BlockStatus => 7,
            Command::Unknown(code) => code,
        }
    }
}

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags; unknown bits are kept.
    pub flags: CommandFlags,
    /// The request type.
    pub command: Command,
    /// Opaque value echoed in the reply (the protocol's "cookie"/"handle").
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Byte length of the affected range (and of a WRITE's data).
    pub length: u32,
}

impl Request {
    /// Bytes of data that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }

    /// End of the affected range, or `None` if `offset + length` overflows.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.length))
    }
}

/// Parses a request header. A WRITE's data is not consumed: it follows in the
/// next [`Request::payload_len`] bytes.
pub fn parse_request(buf: &[u8]) -> Result<(Request, usize), WireError> {
    let head: [u8; REQUEST_LEN] = fixed(buf)?;
    let magic = be_u32(&head, 0);
    if magic != REQUEST_MAGIC {
        return Err(WireError::BadMagic {
            what: "request",
            found: u64::from(magic),
        });
    }
    Ok((
        Request {
            flags: CommandFlags::from_bits(be_u16(&head, 4)),
            command: Command::from_code(be_u16(&head, 6)),
            cookie: be_u64(&head, 8),
            offset: be_u64(&head, 16),
            length: be_u32(&head, 24),
        },
        REQUEST_LEN,
    ))
}

/// Appends a request header (client side); a WRITE's data must follow.
pub fn encode_request(request: &Request, out: &mut Vec<u8>) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&request.flags.bits().to_be_bytes());
    out.extend_from_slice(&request.command.code().to_be_bytes());
    out.extend_from_slice(&request.cookie.to_be_bytes());
    out.extend_from_slice(&request.offset.to_be_bytes());
    out.extend_from_slice(&request.length.to_be_bytes());
}

/// NBD error values carried in replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum NbdError {
    /// `NBD_EPERM` (1).
    #[error("operation not permitted (NBD_EPERM)")]
    Perm,
    /// `NBD_EIO` (5).
    #[error("input/output error (NBD_EIO)")]
    Io,
    /// `NBD_ENOMEM` (12).
    #[error("cannot allocate memory (NBD_ENOMEM)")]
    NoMem,
    /// `NBD_EINVAL` (22).
    #[error("invalid argument (NBD_EINVAL)")]
    Invalid,
    /// `NBD_ENOSPC` (28).
    #[error("no space left on device (NBD_ENOSPC)")]
    NoSpace,
    /// `NBD_EOVERFLOW` (75).
    #[error("value too large (NBD_EOVERFLOW)")]
    Overflow,
    /// `NBD_ENOTSUP` (95).
    #[error("operation not supported (NBD_ENOTSUP)")]
    NotSupported,
    /// `NBD_ESHUTDOWN` (108).
    #[error("server is shutting down (NBD_ESHUTDOWN)")]
    Shutdown,
    /// A nonzero value the protocol does not define; clients treat it as
    /// `NBD_EINVAL`. [`NbdError::from_code`] never produces this for a
    /// defined value.
    #[error("unknown NBD error {0}")]
    Unknown(u32),
}

impl NbdError {
    /// The error for a wire value; `None` for 0 (success).
    pub fn from_code(code: u32) -> Option<NbdError> {
        Some(match code {
            0 => return None,
            1 => NbdError::Perm,
            5 => NbdError::Io,
            12 => NbdError::NoMem,
            22 => NbdError::Invalid,
            28 => NbdError::NoSpace,
            75 => NbdError::Overflow,
            95 => NbdError::NotSupported,
            108 => NbdError::Shutdown,
            other => NbdError::Unknown(other),
        })
    }

    /// The wire value (never 0 except for `Unknown(0)`, which is invalid).
    pub fn code(self) -> u32 {
        match self {
            NbdError::Perm => 1,
            NbdError::Io => 5,
            NbdError::NoMem => 12,
            NbdError::Invalid => 22,
            NbdError::NoSpace => 28,
            NbdError::Overflow => 75,
            NbdError::NotSupported => 95,
            NbdError::Shutdown => 108,
            NbdError::Unknown(code) => code,
        }
    }
}

/// A simple reply header; for a successful READ without structured replies
/// the data follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// The request's cookie.
    pub cookie: u64,
    /// `None` for success.
    pub error: Option<NbdError>,
}

/// Appends a simple reply header.
pub fn encode_simple_reply(cookie: u64, error: Option<NbdError>, out: &mut Vec<u8>) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.map_or(0, NbdError::code).to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Parses a simple reply header (client side). Read data, if any, follows;
/// only the client knows its length.
pub fn parse_simple_reply(buf: &[u8]) -> Result<(SimpleReply, usize), WireError> {
    let head: [u8; SIMPLE_REPLY_LEN] = fixed(buf)?;
    let magic = be_u32(&head, 0);
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(WireError::BadMagic {
            what: "simple reply",
            found: u64::from(magic),
        });
    }
    Ok((
        SimpleReply {
            error: NbdError::from_code(be_u32(&head, 4)),
            cookie: be_u64(&head, 8),
        },
        SIMPLE_REPLY_LEN,
    ))
}

/// Which kind of reply starts the input (client side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// A simple reply ([`parse_simple_reply`]).
    Simple,
    /// A structured reply chunk ([`parse_chunk`]).
    Structured,
}

/// Looks at the magic of the next reply.
pub fn peek_reply_kind(buf: &[u8]) -> Result<ReplyKind, WireError> {
    let magic = u32::from_be_bytes(fixed::<4>(buf)?);
    match magic {
        SIMPLE_REPLY_MAGIC => Ok(ReplyKind::Simple),
        STRUCTURED_REPLY_MAGIC => Ok(ReplyKind::Structured),
        other => Err(WireError::BadMagic {
            what: "reply",
            found: u64::from(other),
        }),
    }
}

/// One `base:allocation` (or other context) block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockDescriptor {
    /// Length of the extent in bytes; nonzero.
    pub length: u32,
    /// Status flags, as defined by the metadata context.
    pub status: BlockStatusFlags,
}

/// Header of a structured reply chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: ReplyFlags,
    pub chunk_type: u16,
    pub cookie: u64,
    pub length: u32,
}

/// Payload of a structured reply chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkPayload<'a> {
    /// `NBD_REPLY_TYPE_NONE`: no payload; must carry the DONE flag.
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA`: data read at `offset`.
    OffsetData { offset: u64, data: &'a [u8] },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`: `length` bytes at `offset` read as zeros.
    OffsetHole { offset: u64, length: u32 },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`: consecutive extents for one context.
    BlockStatus {
        context_id: u32,
        descriptors: Vec<BlockDescriptor>,
    },
    /// `NBD_REPLY_TYPE_ERROR` with a message for humans.
    Error { error: NbdError, message: String },
    /// `NBD_REPLY_TYPE_ERROR_OFFSET`: error at `offset`.
    ErrorOffset {
        error: NbdError,
        message: String,
        offset: u64,
    },
    /// An error chunk type (bit 15 set) this crate does not know; the reply
    /// counts as failed.
    UnknownError {
        chunk_type: u16,
        error: NbdError,
        message: String,
    },
    /// A non-error chunk type this crate does not know; a client must hang up.
    Unknown { chunk_type: u16, payload: &'a [u8] },
}

impl ChunkPayload<'_> {
    /// The chunk type on the wire.
    pub fn chunk_type(&self) -> u16 {
        match self {
            ChunkPayload::None => chunk_type::NONE,
            ChunkPayload::OffsetData { .. } => chunk_type::OFFSET_DATA,
            ChunkPayload::OffsetHole { .. } => chunk_type::OFFSET_HOLE,
            ChunkPayload::BlockStatus { .. } => chunk_type::BLOCK_STATUS,
            ChunkPayload::Error { .. } => chunk_type::ERROR,
            ChunkPayload::ErrorOffset { .. } => chunk_type::ERROR_OFFSET,
            ChunkPayload::UnknownError { chunk_type, .. }
            | ChunkPayload::Unknown { chunk_type, .. } => *chunk_type,
        }
    }
}

/// A structured reply chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyChunk<'a> {
    pub flags: ReplyFlags,
    pub cookie: u64,
    pub payload: ChunkPayload<'a>,
}

/// Parses a structured reply chunk header and checks its length against
/// [`MAX_CHUNK_PAYLOAD`].
pub fn parse_chunk_header(buf: &[u8]) -> Result<(ChunkHeader, usize), WireError> {
    let head: [u8; CHUNK_HEADER_LEN] = fixed(buf)?;
    let magic = be_u32(&head, 0);
    if magic != STRUCTURED_REPLY_MAGIC {
        return Err(WireError::BadMagic {
            what: "structured reply",
            found: u64::from(magic),
        });
    }
    let header = ChunkHeader {
        flags: ReplyFlags::from_bits(be_u16(&head, 4)),
        chunk_type: be_u16(&head, 6),
        cookie: be_u64(&head, 8),
        length: be_u32(&head, 16),
    };
    if usize::try_from(header.length).unwrap_or(usize::MAX) > MAX_CHUNK_PAYLOAD {
        return Err(WireError::TooLarge {
            what: "structured reply chunk",
            length: u64::from(header.length),
            limit: MAX_CHUNK_PAYLOAD as u64,
        });
    }
    Ok((header, CHUNK_HEADER_LEN))
}

/// Parses a whole structured reply chunk (client side). OFFSET_DATA data is
/// borrowed from `buf`.
pub fn parse_chunk(buf: &[u8]) -> Result<(ReplyChunk<'_>, usize), WireError> {
    let (header, _) = parse_chunk_header(buf)?;
    // parse_chunk_header bounded the length, so this cannot overflow.
    let total = CHUNK_HEADER_LEN + header.length as usize;
    let payload = buf
        .get(CHUNK_HEADER_LEN..total)
        .ok_or(WireError::Incomplete(total))?;
    let payload = decode_chunk_payload(header.chunk_type, payload)?;
    if matches!(payload, ChunkPayload::None) && !header.flags.contains(ReplyFlags::DONE) {
        return Err(WireError::Malformed {
            what: "NONE chunk",
            reason: "the DONE flag must be set",
        });
    }
    Ok((
        ReplyChunk {
            flags: header.flags,
            cookie: header.cookie,
            payload,
        },
        total,
    ))
}

fn decode_chunk_payload(kind: u16, payload: &[u8]) -> Result<ChunkPayload<'_>, WireError> {
    let mut r = Reader::new(payload, "structured reply chunk");
    let decoded = match kind {
        chunk_type::NONE => ChunkPayload::None,
        chunk_type::OFFSET_DATA => {
            let offset = r.u64()?;
            let data = r.rest();
            if data.is_empty() {
                return Err(WireError::Malformed {
                    what: "OFFSET_DATA chunk",
                    reason: "no data",
                });
            }
            ChunkPayload::OffsetData { offset, data }
        }
        chunk_type::OFFSET_HOLE => {
            let offset = r.u64()?;
            let length = r.u32()?;
            if length == 0 {
                return Err(WireError::Malformed {
                    what: "OFFSET_HOLE chunk",
                    reason: "zero hole size",
                });
            }
            ChunkPayload::OffsetHole { offset, length }
        }
        chunk_type::BLOCK_STATUS => {
            let context_id = r.u32()?;
            if r.remaining() == 0 || !r.remaining().is_multiple_of(8) {
                return Err(WireError::Malformed {
                    what: "BLOCK_STATUS chunk",
                    reason: "length is not 4 plus a positive multiple of 8",
                });
            }
            // The descriptors are present in `payload`, so this allocation is
            // bounded by input actually received.
            let mut descriptors = Vec::with_capacity(r.remaining() / 8);
            while r.remaining() > 0 {
                let length = r.u32()?;
                let status = BlockStatusFlags::from_bits(r.u32()?);
                if length == 0 {
                    return Err(WireError::Malformed {
                        what: "BLOCK_STATUS chunk",
                        reason: "zero-length descriptor",
                    });
                }
                descriptors.push(BlockDescriptor { length, status });
            }
            ChunkPayload::BlockStatus {
                context_id,
                descriptors,
            }
        }
        kind if kind & chunk_type::ERROR_BIT != 0 => {
            let error = NbdError::from_code(r.u32()?).ok_or(WireError::Malformed {
                what: "error chunk",
                reason: "error value is zero",
            })?;
            let message_len = usize::from(r.u16()?);
            let message = human_text(r.bytes(message_len)?);
            match kind {
                chunk_type::ERROR => ChunkPayload::Error { error, message },
                chunk_type::ERROR_OFFSET => ChunkPayload::ErrorOffset {
                    error,
                    message,
                    offset: r.u64()?,
                },
                // Unknown error chunks may carry fields after the message.
                other => {
                    r.rest();
                    ChunkPayload::UnknownError {
                        chunk_type: other,
                        error,
                        message,
                    }
                }
            }
        }
        other => ChunkPayload::Unknown {
            chunk_type: other,
            payload: r.rest(),
        },
    };
    r.finish()?;
    Ok(decoded)
}

fn put_chunk_header(out: &mut Vec<u8>, flags: ReplyFlags, kind: u16, cookie: u64, length: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
}

/// Appends a NONE chunk with the DONE flag: "the reply is complete".
pub fn encode_none_chunk(cookie: u64, out: &mut Vec<u8>) {
    put_chunk_header(out, ReplyFlags::DONE, chunk_type::NONE, cookie, 0);
}

/// Appends the header of an OFFSET_DATA chunk carrying `data_len` bytes; the
/// caller sends exactly that many bytes of data right after it.
pub fn encode_offset_data_header(
    cookie: u64,
    flags: ReplyFlags,
    offset: u64,
    data_len: u32,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if data_len == 0 || data_len > MAX_OFFSET_DATA_LEN {
        return Err(WireError::Malformed {
            what: "OFFSET_DATA chunk",
            reason: "data length must be between 1 and 2^32 - 9 bytes",
        });
    }
    put_chunk_header(out, flags, chunk_type::OFFSET_DATA, cookie, data_len + 8);
    out.extend_from_slice(&offset.to_be_bytes());
    Ok(())
}

/// Appends an OFFSET_HOLE chunk.
pub fn encode_offset_hole_chunk(
    cookie: u64,
    flags: ReplyFlags,
    offset: u64,
    length: u32,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if length == 0 {
        return Err(WireError::Malformed {
            what: "OFFSET_HOLE chunk",
            reason: "zero hole size",
        });
    }
    put_chunk_header(out, flags, chunk_type::OFFSET_HOLE, cookie, 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    Ok(())
}

/// Appends a BLOCK_STATUS chunk for one metadata context.
pub fn encode_block_status_chunk(
    cookie: u64,
    flags: ReplyFlags,
    context_id: u32,
    descriptors: &[BlockDescriptor],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if descriptors.is_empty() || descriptors.iter().any(|d| d.length == 0) {
        return Err(WireError::Malformed {
            what: "BLOCK_STATUS chunk",
            reason: "needs at least one descriptor, each of nonzero length",
        });
    }
    let length = wire_len(
        descriptors.len().saturating_mul(8).saturating_add(4),
        MAX_CHUNK_PAYLOAD,
        "BLOCK_STATUS chunk",
    )?;
    put_chunk_header(out, flags, chunk_type::BLOCK_STATUS, cookie, length);
    out.extend_from_slice(&context_id.to_be_bytes());
    for d in descriptors {
        out.extend_from_slice(&d.length.to_be_bytes());
        out.extend_from_slice(&d.status.bits().to_be_bytes());
    }
    Ok(())
}

/// Appends an ERROR chunk, or an ERROR_OFFSET chunk when `offset` is given.
/// The message is truncated to the protocol's string limit.
pub fn encode_error_chunk(
    cookie: u64,
    flags: ReplyFlags,
    error: NbdError,
    message: &str,
    offset: Option<u64>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    encode_error_like(
        cookie,
        flags,
        match offset {
            Some(_) => chunk_type::ERROR_OFFSET,
            None => chunk_type::ERROR,
        },
        error,
        message,
        offset,
        out,
    )
}

fn encode_error_like(
    cookie: u64,
    flags: ReplyFlags,
    kind: u16,
    error: NbdError,
    message: &str,
    offset: Option<u64>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if error.code() == 0 {
        return Err(WireError::Malformed {
            what: "error chunk",
            reason: "error value is zero",
        });
    }
    let message = truncate_text(message);
    // truncate_text bounds the message by MAX_STRING_LEN (4096), so both
    // conversions below are lossless.
    let message_len = message.len() as u16;
    let length = 6 + message.len() as u32 + if offset.is_some() { 8 } else { 0 };
    put_chunk_header(out, flags, kind, cookie, length);
    out.extend_from_slice(&error.code().to_be_bytes());
    out.extend_from_slice(&message_len.to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    if let Some(offset) = offset {
        out.extend_from_slice(&offset.to_be_bytes());
    }
    Ok(())
}

/// Appends any structured reply chunk, data included.
pub fn encode_chunk(chunk: &ReplyChunk<'_>, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    let result = encode_chunk_inner(chunk, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_chunk_inner(chunk: &ReplyChunk<'_>, out: &mut Vec<u8>) -> Result<(), WireError> {
    let ReplyChunk {
        flags,
        cookie,
        payload,
    } = chunk;
    let (flags, cookie) = (*flags, *cookie);
    match payload {
        ChunkPayload::None => {
            if !flags.contains(ReplyFlags::DONE) {
                return Err(WireError::Malformed {
                    what: "NONE chunk",
                    reason: "the DONE flag must be set",
                });
            }
            put_chunk_header(out, flags, chunk_type::NONE, cookie, 0);
        }
        ChunkPayload::OffsetData { offset, data } => {
            let data_len = wire_len(data.len(), MAX_CHUNK_PAYLOAD - 8, "OFFSET_DATA chunk")?;
            encode_offset_data_header(cookie, flags, *offset, data_len, out)?;
            out.extend_from_slice(data);
        }
        ChunkPayload::OffsetHole { offset, length } => {
            encode_offset_hole_chunk(cookie, flags, *offset, *length, out)?
        }
        ChunkPayload::BlockStatus {
            context_id,
            descriptors,
        } => encode_block_status_chunk(cookie, flags, *context_id, descriptors, out)?,
        ChunkPayload::Error { error, message } => {
            encode_error_chunk(cookie, flags, *error, message, None, out)?
        }
        ChunkPayload::ErrorOffset {
            error,
            message,
            offset,
        } => encode_error_chunk(cookie, flags, *error, message, Some(*offset), out)?,
        ChunkPayload::UnknownError {
            chunk_type: kind,
            error,
            message,
        } => {
            if kind & chunk_type::ERROR_BIT == 0
                || matches!(*kind, chunk_type::ERROR | chunk_type::ERROR_OFFSET)
            {
                return Err(WireError::Malformed {
                    what: "unknown error chunk",
                    reason: "type is not an unknown error type",
                });
            }
            encode_error_like(cookie, flags, *kind, *error, message, None, out)?
        }
        ChunkPayload::Unknown {
            chunk_type: kind,
            payload,
        } => {
            if kind & chunk_type::ERROR_BIT != 0
                || matches!(
                    *kind,
                    chunk_type::NONE
                        | chunk_type::OFFSET_DATA
                        | chunk_type::OFFSET_HOLE
                        | chunk_type::BLOCK_STATUS
                )
            {
                return Err(WireError::Malformed {
                    what: "unknown chunk",
                    reason: "type belongs to a known or error chunk type",
                });
            }
            let length = wire_len(payload.len(), MAX_CHUNK_PAYLOAD, "structured reply chunk")?;
            put_chunk_header(out, flags, *kind, cookie, length);
            out.extend_from_slice(payload);
        }
    }
    Ok(())
}
