//! A blocking NBD client for tools that move whole volumes: image import
//! and export, changed-block streams. It negotiates fixed newstyle with
//! `NBD_OPT_GO`, structured replies and the `base:allocation` context, over
//! a Unix socket, plain TCP or TLS with a pre-shared key (the server's
//! `--nbd-listen`), and pipelines reads and writes (a window of requests in
//! flight, replies matched by cookie in whatever order they come).
//!
//! Invariants:
//! - Every reply is checked against the request it answers: a READ's chunks
//!   must cover exactly the requested range, once; anything else (unknown
//!   cookie, out-of-range chunk, a non-error chunk type this client does not
//!   know) ends the connection with [`ClientError::Protocol`], never with
//!   wrong data handed to the caller.
//! - A server error on any request is returned as [`ClientError::Server`]
//!   with the request's offset, and no later result is reported as success.

mod endpoint;
mod error;
mod session;

pub use endpoint::{Endpoint, PskCredentials};
pub use error::ClientError;
pub use session::{Allocation, NbdClient, WriteOp};
