//! What every frontend's connections on Basalt's event loops
//! (`basalt_reactor`) share, whatever their protocol:
//! - [`BlockIo`]: the block I/O of a connection's requests on a
//!   single-node volume, run on the loop's own ring (and on the offload
//!   pool for what may block), handed back to the frontend as each request
//!   finishes;
//! - [`BufferPool`]: 4 KiB-aligned payload buffers, reused per size class,
//!   so the store does O_DIRECT straight into and out of them;
//! - [`ReplyQueue`]: encoded reply headers and read data (never copied)
//!   waiting to be sent with non-blocking vectored writes;
//! - [`arm_poll`]: socket readiness on the loop's ring.
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

use basalt_reactor::Io;
use io_uring::{opcode, types};
use std::os::fd::RawFd;

/// Arms a one-shot readiness poll (`libc::POLLIN`, `POLLOUT`) of socket
/// `fd` on the loop's ring; it completes with `tag` when the socket is
/// ready, hung up or failed. The loop waits for it like for disk I/O
/// (a connection with a poll armed is not finished). Keep the socket open
/// while the poll is armed, or the completion may belong to whatever
/// reuses the descriptor number.
pub fn arm_poll(io: &mut Io<'_>, fd: RawFd, events: libc::c_short, tag: u32) {
    let entry = opcode::PollAdd::new(types::Fd(fd), events as u32).build();
    // SAFETY: a poll entry refers to no memory of the caller, only to a
    // descriptor number, so nothing can be written or read after free.
    unsafe { io.push_wait(entry, tag) };
}
