//! Why a connection ended before its client asked it to. Each is logged once,
//! with the peer address, by the connection's thread.

use basalt_nbd_wire::WireError;
use std::io;

/// A handshake that could not continue; the socket is closed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The socket failed or the client went away mid-handshake.
    #[error("socket error during handshake: {0}")]
    Io(#[from] io::Error),
    /// The client closed the connection between two messages.
    #[error("client closed the connection during the handshake")]
    ClosedByClient,
    /// Bytes that can never be a valid handshake message (bad magic, an
    /// option longer than the limit).
    #[error("protocol violation during handshake: {0}")]
    Protocol(#[from] WireError),
    /// The client set client flags this server does not know, which the
    /// protocol requires closing the connection for.
    #[error("client set unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
    /// `NBD_OPT_EXPORT_NAME` named an export that does not exist or is not
    /// a valid name; that option cannot be answered with an error.
    #[error("NBD_OPT_EXPORT_NAME for unknown export {0:?}")]
    UnknownExport(String),
    /// `NBD_OPT_EXPORT_NAME` before TLS on a listener that requires it
    /// (that option cannot be answered with an error).
    #[error("NBD_OPT_EXPORT_NAME before TLS on a listener that requires TLS")]
    TlsRequired,
    /// The TLS handshake failed (unknown identity, wrong key, no common
    /// cipher, or the socket).
    #[error("TLS handshake failed: {0}")]
    Tls(io::Error),
    /// The client kept sending options without ever choosing an export.
    #[error("client sent more than {0} options without entering transmission")]
    TooManyOptions(usize),
}

/// A transmission phase that ended without `NBD_CMD_DISC` or a clean EOF.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The socket failed (reset, shut down by the server, ...).
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// A request header with a bad magic: the stream cannot be resynchronised.
    #[error("protocol violation: {0}")]
    Protocol(#[from] WireError),
    /// The client closed the connection in the middle of a request.
    #[error("client closed the connection in the middle of a request")]
    Truncated,
    /// A WRITE so large that reading and discarding its payload would itself
    /// be a denial of service.
    #[error("WRITE of {0} bytes is far beyond the maximum payload")]
    OversizeWrite(u32),
}
