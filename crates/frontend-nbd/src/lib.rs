//! Basalt's NBD frontend: serves volumes to NBD clients (the Linux kernel's
//! `nbd` driver, qemu, libnbd tools, fio) over a Unix socket, TCP with TLS
//! and pre-shared keys (module `tls`), or plain TCP.
//!
//! Shape: [`NbdServer::start`] binds a listener and runs one acceptor thread;
//! every accepted connection gets an OS thread for the fixed newstyle
//! handshake (module `handshake`). Then the connection moves to one of the
//! server's event loops (module `evented`, on `basalt_reactor`), which
//! receives, executes and answers its requests with no thread hand-off (a
//! replicated volume's go to its primary in batches that complete through
//! the loop's mailbox); with [`ServerLimits::event_loops`] 0 the handshake
//! thread and
//! [`ServerLimits::lanes_per_connection`] - 1 more ("lanes") take turns at
//! the socket (module `transmission`), each executing a batch of pipelined
//! requests with one `VolumeHandle::submit` call. Both paths share
//! validation, commands and reply encoding (module `requests`).
//!
//! Invariants:
//! - Every request that was read gets exactly one complete reply (simple, or
//!   structured chunks ending with the DONE flag), except `NBD_CMD_DISC`;
//!   replies are sent only after the operation finished, so FUA and FLUSH
//!   replies imply durability.
//! - Input from the network never panics a thread and never makes it allocate
//!   more than the protocol's limits (option payloads, 32 MiB payloads).
//! - [`NbdServer::shutdown`] returns only after every thread it started has
//!   ended and every connection on its event loops has been dropped.

mod error;
mod evented;
mod handshake;
mod requests;
mod server;
mod socket;
mod stream;
mod tls;
mod transmission;

pub(crate) use error::{ConnectionError, HandshakeError};
pub use evented::{MAX_IN_FLIGHT_REQUESTS, MAX_QUEUED_REPLY_BYTES};
pub use handshake::{BASE_ALLOCATION_ID, BASE_TRANSMISSION_FLAGS, MAX_OPTIONS};
pub use requests::SPARSE_READ_MIN;
pub use server::{
    default_event_loops, Disconnector, Listen, NbdServer, ServerLimits,
    DEFAULT_LANES_PER_CONNECTION, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
};
pub use stream::Peer;
pub use tls::{PskKey, PskKeys, TlsPsk};
pub use transmission::{
    MAX_BATCH_BYTES, MAX_BATCH_REQUESTS, MAX_DISCARDED_WRITE, RECV_BUFFER_BYTES,
};

use basalt_volume::VolumeHandle;

/// Which exports a client may list and open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every export: a local user the Unix socket's permissions admitted, a
    /// plain TCP listener (`--nbd-insecure`), or a cluster-wide TLS key.
    All,
    /// The exports of one tenant (a project's TLS key).
    Tenant(String),
}

/// The volumes a server offers, looked up by export (volume) name.
///
/// Implementations must be cheap enough to call once per handshake option:
/// `open` is called for every INFO/GO/EXPORT_NAME and meta context option.
/// An export outside the client's [`Scope`] must look exactly like one that
/// does not exist.
pub trait Exports: Send + Sync + 'static {
    /// Names of every export `scope` may see, for `NBD_OPT_LIST`.
    fn list(&self, scope: &Scope) -> Vec<String>;
    /// Opens an export for I/O; `None` if there is no such export in
    /// `scope`.
    fn open(&self, scope: &Scope, name: &str) -> Option<VolumeHandle>;
    /// Optional human-readable description (`NBD_INFO_DESCRIPTION`).
    fn describe(&self, name: &str) -> Option<String> {
        let _ = name;
        None
    }
}

/// Smallest request size and alignment the server advertises. Requests that
/// are not aligned to it are still served (the store does read-modify-write)
/// so that clients which never asked for block sizes keep working.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Size from which requests avoid read-modify-write in the store.
pub const PREFERRED_BLOCK_SIZE: u32 = 4096;
/// Largest READ/WRITE payload accepted (2^25 bytes, which the protocol says
/// must never be treated as a denial of service).
pub const MAX_PAYLOAD: u32 = basalt_nbd_wire::MAX_PAYLOAD;
