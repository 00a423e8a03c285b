//! The send side of an event-loop connection's socket, shared with the
//! threads that complete its requests, so that a short reply (a write's
//! acknowledgement) can leave from the thread that learnt the write
//! succeeded — a peer reader that brought a replicated write's last
//! acknowledgement — instead of after the loop wakes up to send it. The
//! loop still hears of the request (through its mailbox) and frees it, but
//! off the client's path. (Lanes did the same with `WriteAck`; on a loop it
//! saves the one wake-up a replicated write's reply would otherwise wait
//! for.)
//!
//! Invariants:
//! - Replies never interleave on the socket: the loop sends under the
//!   gate's lock, and a direct send happens only while the loop has
//!   nothing partly sent (`loop_mid_reply`) and no earlier direct send's
//!   remainder waits (`carry`).
//! - A direct send's remainder (the socket took part of it) is sent by the
//!   loop before anything of its own ([`crate::ReplyQueue::send`]).
//! - Once closed (the connection is dead), nothing is sent through it.

use parking_lot::Mutex;
use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::sync::Arc;

/// Longest reply a direct send takes, in bytes (an NBD structured reply
/// chunk without data is 20, a simple reply 16).
pub const EARLY_REPLY_MAX: usize = 32;

/// A request's reply as it will be sent if the request succeeds, encoded
/// in advance (no allocation).
#[derive(Clone, Copy)]
pub struct EarlyReply {
    bytes: [u8; EARLY_REPLY_MAX],
    len: u8,
}

impl EarlyReply {
    /// `None` if `bytes` is longer than [`EARLY_REPLY_MAX`].
    pub fn new(bytes: &[u8]) -> Option<EarlyReply> {
        let mut reply = EarlyReply {
            bytes: [0; EARLY_REPLY_MAX],
            len: u8::try_from(bytes.len()).ok()?,
        };
        reply.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(reply)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

pub struct ReplyGate {
    fd: RawFd,
    state: Mutex<GateState>,
}

#[derive(Default)]
pub(crate) struct GateState {
    /// The loop's last send left part of its queue unsent.
    pub(crate) loop_mid_reply: bool,
    /// What a direct send could not send, for the loop to send first.
    pub(crate) carry: Vec<u8>,
    closed: bool,
}

impl ReplyGate {
    /// The gate of socket `fd`, which must stay open as long as the gate
    /// is not closed.
    pub fn new(fd: RawFd) -> Arc<ReplyGate> {
        Arc::new(ReplyGate {
            fd,
            state: Mutex::new(GateState::default()),
        })
    }

    /// Sends `replies` (whole replies) to the client now, from the calling
    /// thread, if the socket is free. Returns whether the replies are the
    /// client's: sent, or partly sent with the rest left for the loop to
    /// send first. `false`: nothing was sent; the loop must send them.
    pub fn send_now(&self, replies: &[u8]) -> bool {
        let mut st = self.state.lock();
        if st.closed || st.loop_mid_reply || !st.carry.is_empty() {
            return false;
        }
        let mut sent = 0;
        while sent < replies.len() {
            match crate::replies::send_vectored(self.fd, &[IoSlice::new(&replies[sent..])]) {
                // (A stream socket takes at least a byte or says why not.)
                Ok(0) => break,
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Full, or failing (the loop finds out on its own send).
                Err(_) => break,
            }
            if sent > 0 && sent < replies.len() {
                // The socket is full: the loop sends the rest when it can.
                st.carry.extend_from_slice(&replies[sent..]);
                return true;
            }
        }
        sent == replies.len()
    }

    /// No more direct sends (the connection is dead or its socket shut).
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        st.carry.clear();
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, GateState> {
        self.state.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BufferPool, ReplyQueue};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socket pair");
        a.set_nonblocking(true).expect("non-blocking");
        (a, b)
    }

    #[test]
    fn a_direct_send_goes_out_when_the_loop_has_nothing_partly_sent() {
        let (a, mut b) = pair();
        let gate = ReplyGate::new(a.as_raw_fd());
        let reply = EarlyReply::new(b"0123456789abcdef").expect("short reply");
        assert!(gate.send_now(reply.bytes()));
        let mut got = [0u8; 16];
        b.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"0123456789abcdef");
        gate.close();
        assert!(!gate.send_now(b"late"), "a closed gate sends nothing");
        assert!(EarlyReply::new(&[0u8; EARLY_REPLY_MAX + 1]).is_none());
    }

    /// Replies never interleave: while the loop's queue is partly sent a
    /// direct send is refused, and a direct send's remainder leaves before
    /// anything the loop queued later.
    #[test]
    fn replies_never_interleave_with_the_loops() {
        let (a, mut b) = pair();
        let gate = ReplyGate::new(a.as_raw_fd());
        let mut queue = ReplyQueue::gated(Arc::clone(&gate));
        let mut pool = BufferPool::new();
        // Fill the socket through the loop until it takes no more.
        let big = vec![1u8; 1 << 20];
        queue.push_encoded(&big);
        assert!(!queue.send(a.as_raw_fd(), &mut pool).expect("send"));
        assert!(!gate.send_now(b"direct"), "the loop is mid-reply");
        // Drain the socket; the loop finishes its reply.
        let mut got = vec![0u8; big.len()];
        let reader = std::thread::spawn(move || {
            b.read_exact(&mut got).expect("read");
            (b, got)
        });
        while !queue.send(a.as_raw_fd(), &mut pool).expect("send") {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (mut b, got) = reader.join().expect("reader");
        assert!(got.iter().all(|&x| x == 1));
        // Now a direct send goes; one too big for the socket leaves a
        // remainder the loop sends before its own next reply.
        let direct: Vec<u8> = (0..(1 << 20)).map(|k| (k % 251) as u8 + 2).collect();
        assert!(gate.send_now(&direct));
        assert!(!queue.is_empty(), "the remainder is the loop's to send");
        queue.push_encoded(b"after");
        let expected_len = direct.len() + 5;
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; expected_len];
            b.read_exact(&mut got).expect("read");
            got
        });
        while !queue.send(a.as_raw_fd(), &mut pool).expect("send") {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let got = reader.join().expect("reader");
        assert!(got[..direct.len()] == direct[..], "the direct reply whole");
        assert_eq!(&got[direct.len()..], b"after");
    }
}
