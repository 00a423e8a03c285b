//! Why a connection ended other than by the initiator logging out or
//! closing it cleanly. Each is logged once, with the peer address.

use basalt_iscsi_wire::decoder::PduError;
use std::io;

/// A connection that ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The socket failed (reset, timed out, shut down by the server).
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// A PDU that cannot be delimited or trusted (header digest, length).
    #[error("malformed PDU: {0}")]
    Pdu(#[from] PduError),
    /// A PDU that is well formed but not allowed now; a Reject was sent.
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// The login failed (the Login Response said why).
    #[error("login failed: status {0:#06x}")]
    Login(u16),
    /// The initiator closed the connection in the middle of a PDU.
    #[error("initiator closed the connection in the middle of a PDU")]
    Truncated,
}
