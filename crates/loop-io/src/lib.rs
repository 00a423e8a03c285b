//! What every frontend's connections on Basalt's event loops
//! (`basalt_reactor`) share, whatever their protocol:
//! - [`BlockIo`]: the block I/O of a connection's requests on a
//!   single-node volume, run on the loop's own ring (and on the offload
//!   pool for what may block), handed back to the frontend as each request
//!   finishes;
//! - [`BufferPool`]: 4 KiB-aligned payload buffers, reused per size class,
//!   so the store does O_DIRECT straight into and out of them;
//! - [`ReplyQueue`]: encoded reply headers and read data (never copied)
//!   waiting to be sent with non-blocking vectored writes.
//!
//! The protocols stay in their frontends: parsing, validation, reply
//! encoding, and which requests to start when.

mod block_io;
mod bufpool;
mod replies;

pub use block_io::{
    BlockIo, Command, Finished, Outcome, Work, FRONTEND_TAGS, MAX_SLOTS, PIECE_BITS,
};
pub use bufpool::{BufferPool, RETAINED_BYTES};
pub use replies::ReplyQueue;
