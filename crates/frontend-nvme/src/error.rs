//! Why a queue's connection ended other than by the host closing it
//! cleanly. Each is logged once, with the peer address, by the queue's
//! thread.

use basalt_nvme_wire::PduError;
use std::io;

/// A connection that ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The socket failed (reset, timed out, shut down by the server).
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// A malformed PDU; a C2HTermReq was sent before closing.
    #[error("malformed PDU: {0}")]
    Pdu(#[from] PduError),
    /// A PDU that is well formed but not allowed now (a second ICReq, data
    /// for an unknown transfer, ...); a C2HTermReq was sent.
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// The host sent an H2CTermReq.
    #[error("host terminated the connection (FES {fes:#x}, FEI {fei:#x})")]
    HostTerminated { fes: u16, fei: u32 },
    /// The host closed the connection in the middle of a PDU.
    #[error("host closed the connection in the middle of a PDU")]
    Truncated,
}
