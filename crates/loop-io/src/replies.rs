//! The replies of one event-loop connection waiting to be sent: encoded
//! reply headers, and read data straight from the requests' buffers (never
//! copied), sent with non-blocking vectored writes.
//!
//! Invariants:
//! - Bytes leave in the order they were queued; a reply's pieces are
//!   queued together, so replies never interleave.
//! - `queued_bytes` is the number of bytes not yet sent.
//! - A read buffer goes back to the connection's pool once its last
//!   queued piece is sent (or the queue is cleared).

use crate::bufpool::BufferPool;
use crate::gate::ReplyGate;
use basalt_store::AlignedBuf;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::Arc;

/// iovecs per `sendmsg` at most.
const SEND_IOVECS: usize = 64;

/// A piece of the reply stream.
enum Outgoing {
    /// The next `n` bytes of `encoded`.
    Encoded(usize),
    /// Read data.
    Data(DataBuf, Range<usize>),
}

/// A read buffer in the queue: the reply's own, or shared by the data
/// chunks of a reply with holes.
enum DataBuf {
    Owned(AlignedBuf),
    Shared(Arc<AlignedBuf>),
}

impl DataBuf {
    fn bytes(&self) -> &[u8] {
        match self {
            DataBuf::Owned(buf) => buf,
            DataBuf::Shared(buf) => buf,
        }
    }
}

#[derive(Default)]
pub struct ReplyQueue {
    encoded: VecDeque<u8>,
    outgoing: VecDeque<Outgoing>,
    /// Bytes of the front piece already sent (a `Data` piece only: a sent
    /// part of an `Encoded` piece is dropped from `encoded` at once).
    front_sent: usize,
    queued_bytes: usize,
    /// Shared with the threads that may send replies directly
    /// (`gate.rs`): the loop sends under its lock, their remainder first.
    gate: Option<Arc<ReplyGate>>,
}

impl ReplyQueue {
    /// A queue whose socket `gate` also lets other threads send on.
    pub fn gated(gate: Arc<ReplyGate>) -> ReplyQueue {
        ReplyQueue {
            gate: Some(gate),
            ..ReplyQueue::default()
        }
    }

    /// Nothing to send: nothing queued, and no direct send's remainder.
    pub fn is_empty(&self) -> bool {
        self.outgoing.is_empty() && self.gate.as_ref().is_none_or(|g| g.lock().carry.is_empty())
    }

    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    pub fn push_encoded(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.queued_bytes += bytes.len();
        self.encoded.extend(bytes);
        match self.outgoing.back_mut() {
            // Adjacent encoded pieces (replies without data) merge.
            Some(Outgoing::Encoded(n)) => *n += bytes.len(),
            _ => self.outgoing.push_back(Outgoing::Encoded(bytes.len())),
        }
    }

    pub fn push_owned(&mut self, buf: AlignedBuf, range: Range<usize>) {
        self.push_data(DataBuf::Owned(buf), range);
    }

    pub fn push_shared(&mut self, buf: Arc<AlignedBuf>, range: Range<usize>) {
        self.push_data(DataBuf::Shared(buf), range);
    }

    fn push_data(&mut self, buf: DataBuf, range: Range<usize>) {
        self.queued_bytes += range.len();
        self.outgoing.push_back(Outgoing::Data(buf, range));
    }

    /// Drops everything queued (the socket is gone).
    pub fn clear(&mut self, pool: &mut BufferPool) {
        if let Some(gate) = &self.gate {
            gate.close();
        }
        self.encoded.clear();
        for out in self.outgoing.drain(..) {
            if let Outgoing::Data(buf, _) = out {
                give_back(buf, pool);
            }
        }
        self.front_sent = 0;
        self.queued_bytes = 0;
    }

    /// Sends until the queue is empty (`Ok(true)`) or the socket takes no
    /// more (`Ok(false)`: wait for it to be writable).
    pub fn send(&mut self, fd: RawFd, pool: &mut BufferPool) -> io::Result<bool> {
        let gate = self.gate.clone();
        let mut gated = gate.as_ref().map(|g| g.lock());
        if let Some(st) = gated.as_mut() {
            // The rest of a direct send: the middle of a reply, so first.
            while !st.carry.is_empty() {
                match send_vectored(fd, &[IoSlice::new(&st.carry)]) {
                    Ok(0) => return Ok(false),
                    Ok(n) => drop(st.carry.drain(..n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let done = self.send_queued(fd, pool);
        if let Some(st) = gated.as_mut() {
            st.loop_mid_reply = !self.outgoing.is_empty();
        }
        done
    }

    fn send_queued(&mut self, fd: RawFd, pool: &mut BufferPool) -> io::Result<bool> {
        while !self.outgoing.is_empty() {
            let sent = {
                let (first, second) = self.encoded.as_slices();
                let mut encoded_at = 0usize;
                let mut slices = [IoSlice::new(&[]); SEND_IOVECS];
                let mut count = 0usize;
                for (k, out) in self.outgoing.iter().enumerate() {
                    if count + 2 > SEND_IOVECS {
                        break;
                    }
                    match out {
                        Outgoing::Encoded(n) => {
                            let (a, b) = (encoded_at, encoded_at + n);
                            encoded_at += n;
                            // The range may straddle the deque's two halves.
                            if a < first.len() {
                                slices[count] = IoSlice::new(&first[a..b.min(first.len())]);
                                count += 1;
                            }
                            if b > first.len() {
                                let a2 = a.max(first.len()) - first.len();
                                slices[count] = IoSlice::new(&second[a2..b - first.len()]);
                                count += 1;
                            }
                        }
                        Outgoing::Data(buf, range) => {
                            let skip = if k == 0 { self.front_sent } else { 0 };
                            slices[count] =
                                IoSlice::new(&buf.bytes()[range.start + skip..range.end]);
                            count += 1;
                        }
                    }
                }
                send_vectored(fd, &slices[..count])
            };
            match sent {
                Ok(n) => self.advance(n, pool),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Drops `n` sent bytes from the front of the queue.
    fn advance(&mut self, mut n: usize, pool: &mut BufferPool) {
        self.queued_bytes = self.queued_bytes.saturating_sub(n);
        while n > 0 {
            match self.outgoing.front_mut() {
                None => return,
                Some(Outgoing::Encoded(len)) => {
                    let take = n.min(*len);
                    self.encoded.drain(..take);
                    *len -= take;
                    n -= take;
                    if *len == 0 {
                        self.outgoing.pop_front();
                    }
                }
                Some(Outgoing::Data(_, range)) => {
                    let left = range.len() - self.front_sent;
                    if n < left {
                        self.front_sent += n;
                        return;
                    }
                    n -= left;
                    self.front_sent = 0;
                    if let Some(Outgoing::Data(buf, _)) = self.outgoing.pop_front() {
                        give_back(buf, pool);
                    }
                }
            }
        }
    }
}

/// Returns a read buffer to the pool once no queued piece refers to it.
fn give_back(buf: DataBuf, pool: &mut BufferPool) {
    match buf {
        DataBuf::Owned(buf) => pool.give(buf),
        DataBuf::Shared(buf) => {
            if let Ok(buf) = Arc::try_unwrap(buf) {
                pool.give(buf);
            }
        }
    }
}

/// One non-blocking `sendmsg` of `slices`.
pub(crate) fn send_vectored(fd: RawFd, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid; the iovecs point into live slices
    // (IoSlice is ABI-compatible with iovec) for the duration of the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = slices.as_ptr().cast_mut().cast();
    msg.msg_iovlen = slices.len() as _;
    // SAFETY: `msg` describes valid buffers; `fd` is the open socket.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn data(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.copy_from_slice(bytes);
        buf
    }

    #[test]
    fn pieces_leave_in_order_across_partial_sends() {
        let (a, mut b) = UnixStream::pair().expect("socket pair");
        // A small send buffer forces partial sends.
        let mut pool = BufferPool::new();
        let mut queue = ReplyQueue::default();
        let mut expected = Vec::new();
        for i in 0..200u32 {
            let head = i.to_be_bytes();
            queue.push_encoded(&head);
            expected.extend_from_slice(&head);
            let body: Vec<u8> = (0..(i as usize * 97 % 9000))
                .map(|k| (k + i as usize) as u8)
                .collect();
            if i % 2 == 0 {
                queue.push_shared(Arc::new(data(&body)), 0..body.len());
            } else {
                queue.push_owned(data(&body), 0..body.len());
            }
            expected.extend_from_slice(&body);
        }
        assert_eq!(queue.queued_bytes(), expected.len());
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).expect("read");
            got
        });
        while !queue.send(a.as_raw_fd(), &mut pool).expect("send") {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(queue.queued_bytes(), 0);
        assert!(queue.is_empty());
        drop(a);
        let got = reader.join().expect("reader");
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes arrive in order");
    }
}
