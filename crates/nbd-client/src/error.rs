//! What can go wrong talking to an NBD server.

use basalt_nbd_wire::{NbdError, WireError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the NBD server at {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("TLS with the NBD server failed (wrong identity or key?): {0}")]
    Tls(String),
    #[error("the NBD server refused export {export}: {message}")]
    Refused { export: String, message: String },
    #[error("the NBD server broke the protocol: {0}")]
    Protocol(String),
    #[error("the NBD server answered {error} for {what} at byte {offset}{}", message_suffix(.message))]
    Server {
        what: &'static str,
        offset: u64,
        error: NbdError,
        message: String,
    },
    #[error("export is read-only")]
    ReadOnly,
    #[error("request at byte {offset} (+{len}) is past the export's end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("NBD connection: {0}")]
    Io(#[from] std::io::Error),
}

fn message_suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

impl From<WireError> for ClientError {
    fn from(e: WireError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}
