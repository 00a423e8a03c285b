//! What every frontend's connections on Basalt's event loops
//! (`basalt_reactor`) share, whatever their protocol:
//! - [`BlockIo`]: the block I/O of a connection's requests on a
//!   single-node volume, run on the loop's own ring (and on the offload
//!   pool for what may block), handed back to the frontend as each request
//!   finishes;
//! - [`BufferPool`]: 4 KiB-aligned payload buffers, reused per size class,
//!   so the store does O_DIRECT straight into and out of them;
//! - [`RecvBuffer`]: the bytes a connection received and has not decoded;
//! - [`ReplyQueue`]: encoded reply headers and read data (never copied)
//!   waiting to be sent with non-blocking vectored writes;
//! - [`SocketPolls`]: socket readiness on the loop's ring;
//! - [`listener`]: the TCP frontends' acceptor loop and the registry of
//!   their live connections, from their first thread to wherever they end.
//!
//! The protocols stay in their frontends: parsing, validation, reply
//! encoding, and which requests to start when.

mod block_io;
mod bufpool;
mod gate;
pub mod listener;
mod recv;
mod replies;

pub use block_io::{
    BlockIo, Command, Finished, Outcome, Work, FRONTEND_TAGS, MAX_SLOTS, PIECE_BITS,
};
pub use bufpool::{BufferPool, RETAINED_BYTES};
pub use gate::{EarlyReply, ReplyGate, EARLY_REPLY_MAX};
pub use recv::{Fill, RecvBuffer};
pub use replies::ReplyQueue;

use basalt_reactor::Io;
use io_uring::{opcode, types};
use std::os::fd::RawFd;

/// The readiness polls of one connection's socket on its loop's ring: at
/// most one for readability and one for writability armed at a time, with
/// tags of the frontend range. A connection with a poll armed is not
/// finished: the loop waits for it like for disk I/O.
pub struct SocketPolls {
    fd: RawFd,
    readable: bool,
    writable: bool,
    /// The socket is shut down: nothing more is armed.
    closed: bool,
}

/// What a ring completion of a connection is.
pub enum Completion {
    /// The socket is readable, hung up, or failed (`Err`: the poll failed).
    Readable(Result<(), std::io::Error>),
    /// The socket can take more.
    Writable,
    /// One of the connection's [`BlockIo`] entries.
    BlockIo,
    /// Nothing this connection submitted.
    Unknown,
}

const TAG_READABLE: u32 = 0x7FFF_FFFF;
const TAG_WRITABLE: u32 = 0x7FFF_FFFE;

impl SocketPolls {
    /// Polls of socket `fd`, which must stay open while any is armed (or
    /// the completion may belong to whatever reuses the number).
    pub fn new(fd: RawFd) -> SocketPolls {
        SocketPolls {
            fd,
            readable: false,
            writable: false,
            closed: false,
        }
    }

    /// The connection shut its socket down: arming does nothing from now
    /// on (polls already armed complete, as the shutdown wakes them).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Waits for the socket to be readable (if not waiting already).
    pub fn arm_readable(&mut self, io: &mut Io<'_>) {
        if !self.readable && !self.closed {
            self.arm(io, libc::POLLIN, TAG_READABLE);
            self.readable = true;
        }
    }

    /// Waits for the socket to be writable (if not waiting already).
    pub fn arm_writable(&mut self, io: &mut Io<'_>) {
        if !self.writable && !self.closed {
            self.arm(io, libc::POLLOUT, TAG_WRITABLE);
            self.writable = true;
        }
    }

    pub fn waiting_readable(&self) -> bool {
        self.readable
    }

    /// Any poll armed.
    pub fn armed(&self) -> bool {
        self.readable || self.writable
    }

    /// Sorts a completion of the connection (disarming a poll that
    /// completed).
    pub fn classify(&mut self, tag: u32, result: i32) -> Completion {
        match tag {
            TAG_READABLE => {
                self.readable = false;
                Completion::Readable(if result < 0 {
                    Err(std::io::Error::from_raw_os_error(-result))
                } else {
                    Ok(())
                })
            }
            TAG_WRITABLE => {
                self.writable = false;
                Completion::Writable
            }
            _ if tag < FRONTEND_TAGS => Completion::BlockIo,
            _ => Completion::Unknown,
        }
    }

    fn arm(&self, io: &mut Io<'_>, events: libc::c_short, tag: u32) {
        let entry = opcode::PollAdd::new(types::Fd(self.fd), events as u32).build();
        // SAFETY: a poll entry refers to no memory of the caller, only to a
        // descriptor number, so nothing can be written or read after free.
        unsafe { io.push_wait(entry, tag) };
    }
}
