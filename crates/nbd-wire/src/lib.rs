//! Sans-I/O codec for the Network Block Device protocol as described in the
//! NBD project's `doc/proto.md`: the fixed newstyle handshake and the
//! transmission phase (simple and structured replies).
//!
//! The crate only turns bytes into typed values and back; it never touches a
//! socket. Both directions are covered so that a server (Basalt's NBD
//! frontend) and a client (its tests, the fuzz target) share one definition of
//! every message.
//!
//! Invariants every parser and encoder here keeps:
//! - Parsers take `&[u8]` and return `Ok((value, consumed))`, or
//!   [`WireError::Incomplete`] carrying the total number of bytes the message
//!   needs, or another [`WireError`] when the bytes can never form a valid
//!   message. They never panic, whatever the input.
//! - No parser allocates memory sized by a length field before the bytes that
//!   length announces are present in the input, and every length field is
//!   checked against a limit ([`MAX_OPTION_PAYLOAD`], [`MAX_STRING_LEN`],
//!   [`MAX_OPTION_REPLY_PAYLOAD`], [`MAX_CHUNK_PAYLOAD`]) first, so a hostile
//!   peer cannot make the caller buffer gigabytes either.
//! - Encoders append to a `Vec<u8>`. Those with variable-length fields return
//!   `Result` and reject (leaving the output untouched) any field that the
//!   matching parser would reject, so `parse(encode(x)) == x` for every value
//!   they accept. The only exception is human-readable text (error messages
//!   and export descriptions), which is truncated at a character boundary to
//!   [`MAX_STRING_LEN`] bytes instead, because losing the tail of a message
//!   is better than losing the reply.
//! - Integers are big-endian on the wire, as the protocol requires.

mod error;
mod flags;
pub mod handshake;
mod reader;
pub mod transmission;

pub use error::WireError;
pub use flags::{
    BlockStatusFlags, ClientFlags, CommandFlags, HandshakeFlags, ReplyFlags, TransmissionFlags,
};
pub use handshake::{
    encode_client_flags, encode_export_name_reply, encode_option, encode_option_reply,
    encode_server_greeting, parse_client_flags, parse_export_name_reply, parse_option,
    parse_option_frame, parse_option_reply, parse_server_greeting, ClientOption, ErrorReply,
    InfoReply, InfoRequest, InfoType, MetaContextRequest, OptionFrame, OptionReply,
    OptionReplyHeader,
};
pub use transmission::{
    encode_block_status_chunk, encode_chunk, encode_error_chunk, encode_none_chunk,
    encode_offset_data_header, encode_offset_hole_chunk, encode_request, encode_simple_reply,
    parse_chunk, parse_chunk_header, parse_request, parse_simple_reply, peek_reply_kind,
    BlockDescriptor, ChunkHeader, ChunkPayload, Command, NbdError, ReplyChunk, ReplyKind, Request,
    SimpleReply,
};

/// The TLS 1.2 pre-shared-key cipher suites (OpenSSL names) Basalt's NBD
/// server offers and its client asks for, forward-secret ones first; what
/// GnuTLS clients (qemu, libnbd) negotiate with a PSK.
pub const TLS_PSK_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
DHE-PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256";

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second magic of the newstyle greeting, and the magic that
/// starts every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic that starts every fixed newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic that starts every transmission request (`NBD_REQUEST_MAGIC`).
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply (`NBD_SIMPLE_REPLY_MAGIC`).
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk (`NBD_STRUCTURED_REPLY_MAGIC`).
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Longest string (export name, query, context name, message) the protocol
/// allows, in bytes.
pub const MAX_STRING_LEN: usize = 4096;
/// Largest option payload a client may send; larger options are refused at
/// the framing level because no option this crate knows needs more.
pub const MAX_OPTION_PAYLOAD: usize = 64 * 1024;
/// Largest option reply payload accepted by [`parse_option_reply`].
pub const MAX_OPTION_REPLY_PAYLOAD: usize = 64 * 1024;
/// The largest READ/WRITE payload the protocol treats as never being a denial
/// of service (2^25 bytes); Basalt's frontend advertises it as its maximum.
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Largest structured reply chunk payload accepted by [`parse_chunk`]: a full
/// [`MAX_PAYLOAD`] of data plus the OFFSET_DATA chunk's 8-byte offset.
pub const MAX_CHUNK_PAYLOAD: usize = MAX_PAYLOAD as usize + 8;
/// The metadata context for allocation status defined by the protocol.
pub const BASE_ALLOCATION: &str = "base:allocation";
