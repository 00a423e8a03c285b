//! Sans-I/O codec for an iSCSI target (RFC 7143): the PDUs of both
//! directions with their digests ([`pdu`], [`decoder`], [`digest`]), the
//! text keys of Login and Text PDUs ([`text`]), operational negotiation
//! ([`negotiation`]), CHAP ([`chap`]) and the target's side of the login
//! phase as a state machine, with SendTargets ([`login`]).
//!
//! The crate turns bytes into typed values and back and decides what a
//! login answers; it never touches a socket or a volume, and takes its
//! randomness (CHAP challenges) and its policy (which targets exist, who
//! must authenticate how) from the caller. Both directions exist for every
//! PDU so that the target (`basalt-frontend-iscsi`) and its test initiator
//! share one definition.
//!
//! Invariants every parser and machine here keeps:
//! - Parsers take `&[u8]`, never panic and never read past the input; the
//!   incremental decoder reports how many more bytes it needs, or one PDU
//!   and the bytes it used (never more than it was given), or an error that
//!   says which Reject to send and whether the connection can skip the PDU.
//!   Length fields are checked against the caller's limits before the bytes
//!   they announce are awaited.
//! - Integers are big-endian on the wire, except the CRC32C digests, which
//!   go least significant byte first (see [`digest`]).
//! - Encoders append to a caller-supplied `Vec<u8>` and leave it untouched
//!   when they refuse; reserved fields are written as zero.
//! - No `unsafe`.

#![forbid(unsafe_code)]

pub mod chap;
pub mod decoder;
pub mod digest;
pub mod login;
pub mod negotiation;
pub mod pdu;
pub mod text;
