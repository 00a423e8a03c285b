//! Sans-I/O codec for an NVMe over TCP target: the NVMe/TCP transport PDUs
//! (NVMe/TCP Transport Specification 1.0), NVMe submission and completion
//! queue entries with typed views of the admin, NVM I/O and Fabrics
//! commands (NVMe Base Specification 1.4/2.0, NVMe over Fabrics 1.1), and
//! the data structures a controller returns (Identify, log pages,
//! discovery log, controller properties), and the in-band authentication
//! (DH-HMAC-CHAP) messages.
//!
//! The crate only turns bytes into typed values and back; it never touches
//! a socket or a volume. Both directions exist for every PDU so that a
//! target and its tests (acting as host) share one definition.
//!
//! Invariants every parser and encoder here keeps:
//! - Integers are little-endian on the wire, as NVMe requires.
//! - Parsers take `&[u8]`, never panic and never read past the input; the
//!   PDU decoder ([`decode_pdu`]) reports how many more bytes it needs,
//!   or one PDU and the bytes it used (never more than it was given), or
//!   a [`PduError`] carrying the fatal error status and information for
//!   a C2HTermReq. Length fields are checked against caller-given limits
//!   before the bytes they announce are awaited.
//! - Encoders append to a caller-supplied `Vec<u8>` (no allocation per PDU
//!   when it is reused) or return fixed-size arrays. Encoders that can
//!   fail validate first and leave the output untouched on error, so
//!   `decode(encode(x)) == x` for every value they accept.
//! - Reserved bytes are written as zero; padding is zero.
//! - No `unsafe`.

#![forbid(unsafe_code)]

pub mod auth;
mod bytes;
pub mod command;
pub mod completion;
pub mod decoder;
pub mod digest;
mod error;
pub mod fabrics;
pub mod identify;
pub mod log_page;
pub mod pdu;
pub mod properties;
pub mod sqe;

pub use bytes::NQN_MAX_LEN;
pub use command::{parse_command, AdminCommand, Command, IoCommand, QueueType};
pub use completion::{Cqe, Status, CQE_LEN};
pub use decoder::{decode_pdu, term_req_error_data, Decoded, DecoderConfig};
pub use digest::{DataDigest, Digests};
pub use error::{PduError, WireError};
pub use fabrics::{ConnectData, FabricsCommand};
pub use pdu::{
    C2HData, C2HDataHeader, CapsuleCmd, CapsuleResp, Direction, Fes, H2CData, IcReq, IcResp,
    Negotiated, Pdu, PduType, TermReq, R2T,
};
pub use sqe::{SglDescriptor, SglKind, Sqe, SQE_LEN};
