//! Handshake phase of the fixed newstyle negotiation: the server greeting, the
//! client flags, the options the client sends (framed by `IHAVEOPT`, option
//! code and length), the server's option replies, and the old
//! `NBD_OPT_EXPORT_NAME` reply.
//!
//! Options are parsed in two steps because the two kinds of failure need
//! different handling by a server: [`parse_option_frame`] fails only when the
//! stream itself is broken (bad magic, oversize length), after which the
//! connection cannot continue; [`OptionFrame::decode`] fails when a complete,
//! correctly framed option carries a bad payload, which a server answers with
//! `NBD_REP_ERR_INVALID` and then carries on.

use crate::reader::{
    be_u16, be_u32, be_u64, check_name, fixed, human_text, protocol_string, truncate_text,
    wire_len, Reader,
};
use crate::{
    ClientFlags, HandshakeFlags, TransmissionFlags, WireError, IHAVEOPT, MAX_OPTION_PAYLOAD,
    MAX_OPTION_REPLY_PAYLOAD, MAX_STRING_LEN, NBD_MAGIC, OPTION_REPLY_MAGIC,
};

/// Option codes (`NBD_OPT_*`).
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    /// Withdrawn `PEEK_EXPORT` extension; treated as unknown.
    pub const PEEK_EXPORT: u32 = 4;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
    /// Experimental `EXTENDED_HEADERS` extension; treated as unknown.
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types (`NBD_REP_*`); error types have bit 31 set.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const ERROR_BIT: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = ERROR_BIT | 1;
    pub const ERR_POLICY: u32 = ERROR_BIT | 2;
    pub const ERR_INVALID: u32 = ERROR_BIT | 3;
    pub const ERR_PLATFORM: u32 = ERROR_BIT | 4;
    pub const ERR_TLS_REQD: u32 = ERROR_BIT | 5;
    pub const ERR_UNKNOWN: u32 = ERROR_BIT | 6;
    pub const ERR_SHUTDOWN: u32 = ERROR_BIT | 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERROR_BIT | 8;
    pub const ERR_TOO_BIG: u32 = ERROR_BIT | 9;
    pub const ERR_EXT_HEADER_REQD: u32 = ERROR_BIT | 10;
}

/// Information types of `NBD_REP_INFO` (`NBD_INFO_*`).
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Length of the server greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Length of the client flags field.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Length of an option header: `IHAVEOPT`, option, payload length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of an option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Length of the `NBD_OPT_EXPORT_NAME` reply without the zero padding.
pub const EXPORT_NAME_REPLY_LEN: usize = 10;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless NO_ZEROES.
pub const EXPORT_NAME_REPLY_ZEROES: usize = 124;

/// Appends the newstyle greeting the server sends on connect.
pub fn encode_server_greeting(flags: HandshakeFlags, out: &mut Vec<u8>) {
    out.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
}

/// Parses the server greeting (client side).
pub fn parse_server_greeting(buf: &[u8]) -> Result<(HandshakeFlags, usize), WireError> {
    let head: [u8; GREETING_LEN] = fixed(buf)?;
    let magic = be_u64(&head, 0);
    if magic != NBD_MAGIC {
        return Err(WireError::BadMagic {
            what: "NBDMAGIC",
            found: magic,
        });
    }
    let magic = be_u64(&head, 8);
    if magic != IHAVEOPT {
        // Oldstyle servers send cliserv_magic here; this crate speaks newstyle only.
        return Err(WireError::BadMagic {
            what: "IHAVEOPT greeting",
            found: magic,
        });
    }
    Ok((HandshakeFlags::from_bits(be_u16(&head, 16)), GREETING_LEN))
}

/// Appends the client flags (client side).
pub fn encode_client_flags(flags: ClientFlags, out: &mut Vec<u8>) {
    out.extend_from_slice(&flags.bits().to_be_bytes());
}

/// Parses the client flags. Unknown bits are kept; the server must check
/// [`ClientFlags::unknown_bits`] and drop the connection if any is set.
pub fn parse_client_flags(buf: &[u8]) -> Result<(ClientFlags, usize), WireError> {
    let head: [u8; CLIENT_FLAGS_LEN] = fixed(buf)?;
    Ok((
        ClientFlags::from_bits(u32::from_be_bytes(head)),
        CLIENT_FLAGS_LEN,
    ))
}

/// One option as framed on the wire, payload not yet interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionFrame<'a> {
    /// The option code (`NBD_OPT_*`), echoed in every reply.
    pub option: u32,
    /// The option data, at most [`MAX_OPTION_PAYLOAD`] bytes.
    pub payload: &'a [u8],
}

/// Parses an option header and makes sure its payload is present.
///
/// The length is checked against [`MAX_OPTION_PAYLOAD`] before asking for
/// more input, so a hostile length never makes the caller buffer it.
pub fn parse_option_frame(buf: &[u8]) -> Result<(OptionFrame<'_>, usize), WireError> {
    let head: [u8; OPTION_HEADER_LEN] = fixed(buf)?;
    let magic = be_u64(&head, 0);
    if magic != IHAVEOPT {
        return Err(WireError::BadMagic {
            what: "option (IHAVEOPT)",
            found: magic,
        });
    }
    let option = be_u32(&head, 8);
    let length = be_u32(&head, 12);
    let length = usize::try_from(length).unwrap_or(usize::MAX);
    if length > MAX_OPTION_PAYLOAD {
        return Err(WireError::TooLarge {
            what: "option payload",
            length: length as u64,
            limit: MAX_OPTION_PAYLOAD as u64,
        });
    }
    let total = OPTION_HEADER_LEN + length;
    match buf.get(OPTION_HEADER_LEN..total) {
        Some(payload) => Ok((OptionFrame { option, payload }, total)),
        None => Err(WireError::Incomplete(total)),
    }
}

/// Parses a whole option: framing and payload. A payload error here is
/// recoverable for a server (see the module documentation); use
/// [`parse_option_frame`] and [`OptionFrame::decode`] to tell them apart.
pub fn parse_option(buf: &[u8]) -> Result<(ClientOption, usize), WireError> {
    let (frame, consumed) = parse_option_frame(buf)?;
    Ok((frame.decode()?, consumed))
}

/// Information a client may ask for with `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InfoType {
    /// `NBD_INFO_EXPORT`: size and transmission flags (always sent).
    Export,
    /// `NBD_INFO_NAME`: the canonical export name.
    Name,
    /// `NBD_INFO_DESCRIPTION`: a human-readable description.
    Description,
    /// `NBD_INFO_BLOCK_SIZE`: size constraints.
    BlockSize,
    /// A type this crate does not know; servers ignore it.
    Unknown(u16),
}

impl InfoType {
    /// The canonical value for a wire code.
    pub fn from_code(code: u16) -> InfoType {
        match code {
            info::EXPORT => InfoType::Export,
            info::NAME => InfoType::Name,
            info::DESCRIPTION => InfoType::Description,
            info::BLOCK_SIZE => InfoType::BlockSize,
            other => InfoType::Unknown(other),
        }
    }

    /// The wire code.
    pub fn code(self) -> u16 {
        match self {
            InfoType::Export => info::EXPORT,
            InfoType::Name => info::NAME,
            InfoType::Description => info::DESCRIPTION,
            InfoType::BlockSize => info::BLOCK_SIZE,
            InfoType::Unknown(code) => code,
        }
    }
}

/// Payload of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name; empty means the default export.
    pub export: String,
    /// Information the client asks for, in the order sent.
    pub requests: Vec<InfoType>,
}

/// Payload of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export: String,
    /// Queries such as `base:allocation` or `base:`.
    pub queries: Vec<String>,
}

/// An option sent by the client during the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`: pick an export and enter transmission; the
    /// server cannot answer with an error, only close.
    ExportName(String),
    /// `NBD_OPT_ABORT`: soft disconnect. Any payload is ignored, as the
    /// protocol asks.
    Abort,
    /// `NBD_OPT_LIST`: list exports (no payload allowed).
    List,
    /// `NBD_OPT_STARTTLS` (no payload allowed).
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY` (no payload allowed).
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaContextRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaContextRequest),
    /// Any other option, kept so the server can answer `NBD_REP_ERR_UNSUP`.
    Unknown { option: u32, payload: Vec<u8> },
}

impl ClientOption {
    /// The option code on the wire.
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => opt::EXPORT_NAME,
            ClientOption::Abort => opt::ABORT,
            ClientOption::List => opt::LIST,
            ClientOption::StartTls => opt::STARTTLS,
            ClientOption::Info(_) => opt::INFO,
            ClientOption::Go(_) => opt::GO,
            ClientOption::StructuredReply => opt::STRUCTURED_REPLY,
            ClientOption::ListMetaContext(_) => opt::LIST_META_CONTEXT,
            ClientOption::SetMetaContext(_) => opt::SET_META_CONTEXT,
            ClientOption::Unknown { option, .. } => *option,
        }
    }
}

fn known_option(code: u32) -> bool {
    matches!(
        code,
        opt::EXPORT_NAME
            | opt::ABORT
            | opt::LIST
            | opt::STARTTLS
            | opt::INFO
            | opt::GO
            | opt::STRUCTURED_REPLY
            | opt::LIST_META_CONTEXT
            | opt::SET_META_CONTEXT
    )
}

impl OptionFrame<'_> {
    /// Interprets the payload according to the option code.
    pub fn decode(&self) -> Result<ClientOption, WireError> {
        let payload = self.payload;
        match self.option {
            opt::EXPORT_NAME => Ok(ClientOption::ExportName(protocol_string(
                payload,
                "export name",
            )?)),
            opt::ABORT => Ok(ClientOption::Abort),
            opt::LIST => no_payload(payload, "NBD_OPT_LIST").map(|()| ClientOption::List),
            opt::STARTTLS => {
                no_payload(payload, "NBD_OPT_STARTTLS").map(|()| ClientOption::StartTls)
            }
            opt::STRUCTURED_REPLY => no_payload(payload, "NBD_OPT_STRUCTURED_REPLY")
                .map(|()| ClientOption::StructuredReply),
            opt::INFO => decode_info_request(payload, "NBD_OPT_INFO").map(ClientOption::Info),
            opt::GO => decode_info_request(payload, "NBD_OPT_GO").map(ClientOption::Go),
            opt::LIST_META_CONTEXT => decode_meta_context(payload, "NBD_OPT_LIST_META_CONTEXT")
                .map(ClientOption::ListMetaContext),
            opt::SET_META_CONTEXT => decode_meta_context(payload, "NBD_OPT_SET_META_CONTEXT")
                .map(ClientOption::SetMetaContext),
            option => Ok(ClientOption::Unknown {
                option,
                payload: payload.to_vec(),
            }),
        }
    }
}

fn no_payload(payload: &[u8], what: &'static str) -> Result<(), WireError> {
    if payload.is_empty() {
        Ok(())
    } else {
        Err(WireError::Malformed {
            what,
            reason: "this option takes no data",
        })
    }
}

fn decode_info_request(payload: &[u8], what: &'static str) -> Result<InfoRequest, WireError> {
    let mut r = Reader::new(payload, what);
    let export = r.string_u32("export name")?;
    let count = r.u16()?;
    let mut requests = Vec::new();
    for _ in 0..count {
        requests.push(InfoType::from_code(r.u16()?));
    }
    r.finish()?;
    Ok(InfoRequest { export, requests })
}

fn decode_meta_context(
    payload: &[u8],
    what: &'static str,
) -> Result<MetaContextRequest, WireError> {
    let mut r = Reader::new(payload, what);
    let export = r.string_u32("export name")?;
    let count = r.u32()?;
    // Each query needs at least its 4-byte length; checking up front rejects
    // absurd counts without looping over them.
    if u64::from(count) * 4 > r.remaining() as u64 {
        return Err(WireError::Malformed {
            what,
            reason: "query count exceeds the payload",
        });
    }
    let mut queries = Vec::new();
    for _ in 0..count {
        queries.push(r.string_u32("metadata context query")?);
    }
    r.finish()?;
    Ok(MetaContextRequest { export, queries })
}

/// Appends an option header and payload (client side).
pub fn encode_option(option: &ClientOption, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    let result = encode_option_inner(option, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_option_inner(option: &ClientOption, out: &mut Vec<u8>) -> Result<(), WireError> {
    if let ClientOption::Unknown { option: code, .. } = option {
        if known_option(*code) {
            return Err(WireError::Malformed {
                what: "unknown option",
                reason: "code belongs to a known option",
            });
        }
    }
    let start = out.len();
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.code().to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // length, patched below
    match option {
        ClientOption::ExportName(name) => {
            check_name(name, "export name")?;
            out.extend_from_slice(name.as_bytes());
        }
        ClientOption::Abort
        | ClientOption::List
        | ClientOption::StartTls
        | ClientOption::StructuredReply => {}
        ClientOption::Info(req) | ClientOption::Go(req) => {
            put_string_u32(out, &req.export, "export name")?;
            let count = u16::try_from(req.requests.len()).map_err(|_| WireError::TooLarge {
                what: "information request list",
                length: req.requests.len() as u64,
                limit: u16::MAX as u64,
            })?;
            out.extend_from_slice(&count.to_be_bytes());
            for info in &req.requests {
                out.extend_from_slice(&info.code().to_be_bytes());
            }
        }
        ClientOption::ListMetaContext(req) | ClientOption::SetMetaContext(req) => {
            put_string_u32(out, &req.export, "export name")?;
            let count = u32::try_from(req.queries.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&count.to_be_bytes());
            for query in &req.queries {
                put_string_u32(out, query, "metadata context query")?;
            }
        }
        ClientOption::Unknown { payload, .. } => out.extend_from_slice(payload),
    }
    let len = wire_len(
        out.len() - start - OPTION_HEADER_LEN,
        MAX_OPTION_PAYLOAD,
        "option payload",
    )?;
    patch_u32(out, start + 12, len);
    Ok(())
}

fn put_string_u32(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), WireError> {
    check_name(s, what)?;
    // check_name bounds the length by MAX_STRING_LEN, so it fits in u32.
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn patch_u32(out: &mut [u8], at: usize, value: u32) {
    if let Some(dst) = out.get_mut(at..at + 4) {
        dst.copy_from_slice(&value.to_be_bytes());
    }
}

/// The `NBD_REP_ERR_*` error replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorReply {
    /// `NBD_REP_ERR_UNSUP`: option unknown to this server.
    Unsupported,
    /// `NBD_REP_ERR_POLICY`: known but forbidden by policy.
    Policy,
    /// `NBD_REP_ERR_INVALID`: syntactically or semantically invalid.
    Invalid,
    /// `NBD_REP_ERR_PLATFORM`: not available on this platform.
    Platform,
    /// `NBD_REP_ERR_TLS_REQD`: TLS must be negotiated first.
    TlsRequired,
    /// `NBD_REP_ERR_UNKNOWN`: the export does not exist.
    UnknownExport,
    /// `NBD_REP_ERR_SHUTDOWN`: the server is shutting down.
    Shutdown,
    /// `NBD_REP_ERR_BLOCK_SIZE_REQD`: the client must ask for block sizes.
    BlockSizeRequired,
    /// `NBD_REP_ERR_TOO_BIG`: request or reply too large.
    TooBig,
    /// `NBD_REP_ERR_EXT_HEADER_REQD` (extended headers extension).
    ExtHeaderRequired,
    /// Another error reply type; bit 31 is always set when encoded.
    Other(u32),
}

impl ErrorReply {
    /// The canonical value for a reply type with bit 31 set, or `None` for
    /// a non-error reply type.
    pub fn from_code(code: u32) -> Option<ErrorReply> {
        if code & rep::ERROR_BIT == 0 {
            return None;
        }
        Some(match code {
            rep::ERR_UNSUP => ErrorReply::Unsupported,
            rep::ERR_POLICY => ErrorReply::Policy,
            rep::ERR_INVALID => ErrorReply::Invalid,
            rep::ERR_PLATFORM => ErrorReply::Platform,
            rep::ERR_TLS_REQD => ErrorReply::TlsRequired,
            rep::ERR_UNKNOWN => ErrorReply::UnknownExport,
            rep::ERR_SHUTDOWN => ErrorReply::Shutdown,
            rep::ERR_BLOCK_SIZE_REQD => ErrorReply::BlockSizeRequired,
            rep::ERR_TOO_BIG => ErrorReply::TooBig,
            rep::ERR_EXT_HEADER_REQD => ErrorReply::ExtHeaderRequired,
            other => ErrorReply::Other(other),
        })
    }

    /// The reply type on the wire.
    pub fn code(self) -> u32 {
        match self {
            ErrorReply::Unsupported => rep::ERR_UNSUP,
            ErrorReply::Policy => rep::ERR_POLICY,
            ErrorReply::Invalid => rep::ERR_INVALID,
            ErrorReply::Platform => rep::ERR_PLATFORM,
            ErrorReply::TlsRequired => rep::ERR_TLS_REQD,
            ErrorReply::UnknownExport => rep::ERR_UNKNOWN,
            ErrorReply::Shutdown => rep::ERR_SHUTDOWN,
            ErrorReply::BlockSizeRequired => rep::ERR_BLOCK_SIZE_REQD,
            ErrorReply::TooBig => rep::ERR_TOO_BIG,
            ErrorReply::ExtHeaderRequired => rep::ERR_EXT_HEADER_REQD,
            ErrorReply::Other(code) => code | rep::ERROR_BIT,
        }
    }
}

/// Payload of an `NBD_REP_INFO` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    /// `NBD_INFO_EXPORT`: size in bytes and transmission flags.
    Export { size: u64, flags: TransmissionFlags },
    /// `NBD_INFO_NAME`: canonical export name.
    Name(String),
    /// `NBD_INFO_DESCRIPTION`: human-readable text (truncated when encoded).
    Description(String),
    /// `NBD_INFO_BLOCK_SIZE`: size constraints in bytes.
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    /// An information type this crate does not know.
    Unknown { info_type: u16, payload: Vec<u8> },
}

/// A reply the server sends to an option (fixed newstyle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionReply {
    /// `NBD_REP_ACK`.
    Ack,
    /// `NBD_REP_SERVER`: one export of a `NBD_OPT_LIST` answer, with optional
    /// human-readable details (truncated when encoded).
    Server { name: String, description: String },
    /// `NBD_REP_INFO`.
    Info(InfoReply),
    /// `NBD_REP_META_CONTEXT`.
    MetaContext { context_id: u32, name: String },
    /// Any `NBD_REP_ERR_*`, with an optional message for humans (truncated
    /// when encoded).
    Error { error: ErrorReply, message: String },
    /// A non-error reply type this crate does not know.
    Unknown { reply_type: u32, payload: Vec<u8> },
}

impl OptionReply {
    /// The reply type on the wire.
    pub fn reply_type(&self) -> u32 {
        match self {
            OptionReply::Ack => rep::ACK,
            OptionReply::Server { .. } => rep::SERVER,
            OptionReply::Info(_) => rep::INFO,
            OptionReply::MetaContext { .. } => rep::META_CONTEXT,
            OptionReply::Error { error, .. } => error.code(),
            OptionReply::Unknown { reply_type, .. } => *reply_type,
        }
    }

    /// Shorthand for an error reply.
    pub fn error(error: ErrorReply, message: impl Into<String>) -> OptionReply {
        OptionReply::Error {
            error,
            message: message.into(),
        }
    }
}

/// Header of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option being answered.
    pub option: u32,
    /// The reply type (`NBD_REP_*`).
    pub reply_type: u32,
    /// Payload length.
    pub length: u32,
}

/// Appends an option reply (server side).
pub fn encode_option_reply(
    option: u32,
    reply: &OptionReply,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let start = out.len();
    let result = encode_option_reply_inner(option, reply, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_option_reply_inner(
    option: u32,
    reply: &OptionReply,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if let OptionReply::Unknown { reply_type, .. } = reply {
        if matches!(
            *reply_type,
            rep::ACK | rep::SERVER | rep::INFO | rep::META_CONTEXT
        ) || reply_type & rep::ERROR_BIT != 0
        {
            return Err(WireError::Malformed {
                what: "unknown option reply",
                reason: "reply type belongs to a known or error reply",
            });
        }
    }
    let start = out.len();
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.reply_type().to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // length, patched below
    match reply {
        OptionReply::Ack => {}
        OptionReply::Server { name, description } => {
            put_string_u32(out, name, "export name")?;
            out.extend_from_slice(truncate_text(description).as_bytes());
        }
        OptionReply::Info(info) => encode_info_reply(info, out)?,
        OptionReply::MetaContext { context_id, name } => {
            check_name(name, "metadata context name")?;
            out.extend_from_slice(&context_id.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        OptionReply::Error { message, .. } => {
            out.extend_from_slice(truncate_text(message).as_bytes());
        }
        OptionReply::Unknown { payload, .. } => out.extend_from_slice(payload),
    }
    let len = wire_len(
        out.len() - start - OPTION_REPLY_HEADER_LEN,
        MAX_OPTION_REPLY_PAYLOAD,
        "option reply payload",
    )?;
    patch_u32(out, start + 16, len);
    Ok(())
}

fn encode_info_reply(info: &InfoReply, out: &mut Vec<u8>) -> Result<(), WireError> {
    match info {
        InfoReply::Export { size, flags } => {
            out.extend_from_slice(&info::EXPORT.to_be_bytes());
            out.extend_from_slice(&size.to_be_bytes());
            out.extend_from_slice(&flags.bits().to_be_bytes());
        }
        InfoReply::Name(name) => {
            check_name(name, "export name")?;
            out.extend_from_slice(&info::NAME.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        InfoReply::Description(text) => {
            out.extend_from_slice(&info::DESCRIPTION.to_be_bytes());
            out.extend_from_slice(truncate_text(text).as_bytes());
        }
        InfoReply::BlockSize {
            minimum,
            preferred,
            maximum,
        } => {
            out.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
            out.extend_from_slice(&minimum.to_be_bytes());
            out.extend_from_slice(&preferred.to_be_bytes());
            out.extend_from_slice(&maximum.to_be_bytes());
        }
        InfoReply::Unknown { info_type, payload } => {
            if *info_type <= info::BLOCK_SIZE {
                return Err(WireError::Malformed {
                    what: "unknown information reply",
                    reason: "type belongs to a known information type",
                });
            }
            out.extend_from_slice(&info_type.to_be_bytes());
            out.extend_from_slice(payload);
        }
    }
    Ok(())
}

/// Parses an option reply (client side): the option it answers and the reply.
pub fn parse_option_reply(buf: &[u8]) -> Result<((u32, OptionReply), usize), WireError> {
    let head: [u8; OPTION_REPLY_HEADER_LEN] = fixed(buf)?;
    let magic = be_u64(&head, 0);
    if magic != OPTION_REPLY_MAGIC {
        return Err(WireError::BadMagic {
            what: "option reply",
            found: magic,
        });
    }
    let header = OptionReplyHeader {
        option: be_u32(&head, 8),
        reply_type: be_u32(&head, 12),
        length: be_u32(&head, 16),
    };
    let length = usize::try_from(header.length).unwrap_or(usize::MAX);
    if length > MAX_OPTION_REPLY_PAYLOAD {
        return Err(WireError::TooLarge {
            what: "option reply payload",
            length: length as u64,
            limit: MAX_OPTION_REPLY_PAYLOAD as u64,
        });
    }
    let total = OPTION_REPLY_HEADER_LEN + length;
    let payload = buf
        .get(OPTION_REPLY_HEADER_LEN..total)
        .ok_or(WireError::Incomplete(total))?;
    let reply = decode_option_reply(header.reply_type, payload)?;
    Ok(((header.option, reply), total))
}

fn decode_option_reply(reply_type: u32, payload: &[u8]) -> Result<OptionReply, WireError> {
    if let Some(error) = ErrorReply::from_code(reply_type) {
        return Ok(OptionReply::Error {
            error,
            message: human_text(payload),
        });
    }
    let mut r = Reader::new(payload, "option reply");
    let reply = match reply_type {
        rep::ACK => OptionReply::Ack,
        rep::SERVER => {
            let name = r.string_u32("export name")?;
            OptionReply::Server {
                name,
                description: human_text(r.rest()),
            }
        }
        rep::INFO => {
            let info_type = r.u16()?;
            OptionReply::Info(match info_type {
                info::EXPORT => InfoReply::Export {
                    size: r.u64()?,
                    flags: TransmissionFlags::from_bits(r.u16()?),
                },
                info::NAME => InfoReply::Name(protocol_string(r.rest(), "export name")?),
                info::DESCRIPTION => InfoReply::Description(human_text(r.rest())),
                info::BLOCK_SIZE => InfoReply::BlockSize {
                    minimum: r.u32()?,
                    preferred: r.u32()?,
                    maximum: r.u32()?,
                },
                other => InfoReply::Unknown {
                    info_type: other,
                    payload: r.rest().to_vec(),
                },
            })
        }
        rep::META_CONTEXT => {
            let context_id = r.u32()?;
            let name = protocol_string(r.rest(), "metadata context name")?;
            OptionReply::MetaContext { context_id, name }
        }
        other => OptionReply::Unknown {
            reply_type: other,
            payload: r.rest().to_vec(),
        },
    };
    r.finish()?;
    Ok(reply)
}

/// Appends the reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags and,
/// unless the client negotiated `NBD_FLAG_C_NO_ZEROES`, 124 zero bytes.
pub fn encode_export_name_reply(
    size: u64,
    flags: TransmissionFlags,
    no_zeroes: bool,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; EXPORT_NAME_REPLY_ZEROES]);
    }
}

/// Parses the reply to `NBD_OPT_EXPORT_NAME` (client side). The reserved
/// padding is skipped without being checked.
pub fn parse_export_name_reply(
    buf: &[u8],
    no_zeroes: bool,
) -> Result<((u64, TransmissionFlags), usize), WireError> {
    let head: [u8; EXPORT_NAME_REPLY_LEN] = fixed(buf)?;
    let total = if no_zeroes {
        EXPORT_NAME_REPLY_LEN
    } else {
        EXPORT_NAME_REPLY_LEN + EXPORT_NAME_REPLY_ZEROES
    };
    if buf.len() < total {
        return Err(WireError::Incomplete(total));
    }
    Ok((
        (
            be_u64(&head, 0),
            TransmissionFlags::from_bits(be_u16(&head, 8)),
        ),
        total,
    ))
}

// Export names are at most MAX_STRING_LEN bytes, so an INFO/GO payload always
// fits the option payload limit; keep that true if either limit changes.
const _: () = assert!(4 + MAX_STRING_LEN + 2 + 2 * 64 <= MAX_OPTION_PAYLOAD);
