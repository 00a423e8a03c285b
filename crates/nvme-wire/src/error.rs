//! The crate's two error types: [`PduError`] for the NVMe/TCP PDU decoder
//! (every variant knows the fatal error status a controller answers with in
//! a C2HTermReq), and [`WireError`] for NVMe commands and data structures.
//!
//! Invariant: an error never borrows the input, so it can outlive the
//! receive buffer; what the peer must be told is derivable from the error
//! alone ([`PduError::fes`], [`PduError::fei`]).

use crate::pdu::Fes;

/// Why received bytes are not a valid NVMe/TCP PDU for this connection.
///
/// Offsets (`fei`) are byte offsets from the start of the PDU, as the
/// transport specification wants them in the Fatal Error Information field
/// of a termination request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The PDU type is undefined, or not one this side of the connection may
    /// receive (for example an R2T sent to a controller).
    #[error("unexpected PDU type {pdu_type:#04x}")]
    UnexpectedPduType { pdu_type: u8 },
    /// HLEN is not the fixed header length of the PDU type.
    #[error("PDU type {pdu_type:#04x}: header length {hlen}, expected {expected}")]
    BadHeaderLength {
        pdu_type: u8,
        hlen: u8,
        expected: u8,
    },
    /// The flags contradict the negotiated digests or each other.
    #[error("PDU type {pdu_type:#04x}: flags {flags:#04x}: {reason}")]
    BadFlags {
        pdu_type: u8,
        flags: u8,
        reason: &'static str,
    },
    /// PDO does not point at a valid, aligned data offset.
    #[error("PDU type {pdu_type:#04x}: data offset {pdo}: {reason}")]
    BadDataOffset {
        pdu_type: u8,
        pdo: u8,
        reason: &'static str,
    },
    /// PLEN is inconsistent with the header (shorter than it, or not the
    /// fixed length of the type, or not matching a data length field).
    #[error("PDU type {pdu_type:#04x}: PDU length {plen}: {reason}")]
    BadPduLength {
        pdu_type: u8,
        plen: u32,
        reason: &'static str,
    },
    /// PLEN exceeds the limit the receiver set.
    #[error("PDU type {pdu_type:#04x}: PDU length {plen} exceeds the limit of {limit}")]
    PduTooLarge { pdu_type: u8, plen: u32, limit: u32 },
    /// A field of the PDU-specific header holds a value the specification
    /// does not allow (for example HPDA above 31 or PFV other than 0).
    #[error("PDU type {pdu_type:#04x}: field at byte {offset}: {reason}")]
    BadField {
        pdu_type: u8,
        offset: u32,
        reason: &'static str,
    },
    /// The header digest does not match the header.
    #[error("PDU type {pdu_type:#04x}: header digest {received:#010x}, computed {computed:#010x}")]
    HeaderDigest {
        pdu_type: u8,
        received: u32,
        computed: u32,
    },
    /// The data digest does not match the data. This is not fatal for the
    /// connection: the PDU occupies `consumed` bytes and the command
    /// `command_id` should be completed with a transient transport error.
    #[error("PDU type {pdu_type:#04x}: data digest {received:#010x}, computed {computed:#010x} (command {command_id})")]
    DataDigest {
        pdu_type: u8,
        command_id: u16,
        consumed: usize,
        received: u32,
        computed: u32,
    },
}

impl PduError {
    /// The Fatal Error Status to send in a termination request, or `None`
    /// when the error is not fatal for the connection ([`PduError::DataDigest`]).
    pub fn fes(&self) -> Option<Fes> {
        Some(match self {
            PduError::UnexpectedPduType { .. }
            | PduError::BadHeaderLength { .. }
            | PduError::BadFlags { .. }
            | PduError::BadDataOffset { .. }
            | PduError::BadPduLength { .. }
            | PduError::BadField { .. } => Fes::InvalidHeaderField,
            PduError::PduTooLarge { .. } => Fes::DataTransferLimitExceeded,
            PduError::HeaderDigest { .. } => Fes::HeaderDigestError,
            PduError::DataDigest { .. } => return None,
        })
    }

    /// The Fatal Error Information that goes with [`PduError::fes`]: the
    /// byte offset of the offending field for an invalid header field, the
    /// received header digest for a header digest error, 0 otherwise.
    pub fn fei(&self) -> u32 {
        match self {
            PduError::UnexpectedPduType { .. } => 0,
            PduError::BadFlags { .. } => 1,
            PduError::BadHeaderLength { .. } => 2,
            PduError::BadDataOffset { .. } => 3,
            PduError::BadPduLength { .. } => 4,
            PduError::BadField { offset, .. } => *offset,
            PduError::HeaderDigest { received, .. } => *received,
            PduError::PduTooLarge { .. } | PduError::DataDigest { .. } => 0,
        }
    }

    /// True when the connection must be terminated.
    pub fn is_fatal(&self) -> bool {
        self.fes().is_some()
    }

    /// The PDU type byte of the offending PDU.
    pub fn pdu_type(&self) -> u8 {
        match self {
            PduError::UnexpectedPduType { pdu_type }
            | PduError::BadHeaderLength { pdu_type, .. }
            | PduError::BadFlags { pdu_type, .. }
            | PduError::BadDataOffset { pdu_type, .. }
            | PduError::BadPduLength { pdu_type, .. }
            | PduError::PduTooLarge { pdu_type, .. }
            | PduError::BadField { pdu_type, .. }
            | PduError::HeaderDigest { pdu_type, .. }
            | PduError::DataDigest { pdu_type, .. } => *pdu_type,
        }
    }
}

/// Why bytes are not a valid NVMe command or data structure, or why a value
/// cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input is shorter than the structure.
    #[error("{what} needs {needed} bytes, got {got}")]
    TooShort {
        what: &'static str,
        needed: usize,
        got: usize,
    },
    /// A field holds a value that is not allowed; `offset` is the byte
    /// offset of the field inside the structure.
    #[error("{what}: field at byte {offset}: {reason}")]
    BadField {
        what: &'static str,
        offset: usize,
        reason: &'static str,
    },
    /// A value does not fit the wire format (a string too long or not
    /// ASCII, too many list entries, ...). Nothing was written.
    #[error("{what} cannot be encoded: {reason}")]
    DoesNotFit {
        what: &'static str,
        reason: &'static str,
    },
}
