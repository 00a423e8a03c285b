//! The transmission phase of one connection on an event loop
//! (`basalt_reactor`): for a volume on this node's store, requests are
//! received, staged, sent to the disk, completed and answered on the one
//! loop thread that owns the connection, with no thread hand-off.
//!
//! The cycle, driven by completions:
//! 1. *Receive*: when the socket is readable (a poll on the loop's ring),
//!    take what the kernel has without blocking, parse every complete
//!    request, and receive WRITE payloads into pooled aligned buffers (a
//!    payload that is still arriving waits for the next readiness).
//! 2. *Execute* (`execute.rs`), each request on its own, through the
//!    connection's `basalt_loop_io::BlockIo`: an aligned READ or WRITE is
//!    staged and its device pieces go to the loop's ring, straight into
//!    and out of the request's buffer; everything that may block (FLUSH,
//!    TRIM, WRITE_ZEROES, BLOCK_STATUS, unaligned requests, writes that
//!    need a commit first, the commit a FUA write may need) runs on the
//!    reactor's offload pool and comes back as a message.
//! 3. *Reply* (`basalt_loop_io::ReplyQueue`): when a request finishes, its
//!    reply is encoded and queued with the read data (not copied); after
//!    each round of completions, everything queued is sent with
//!    non-blocking vectored writes; what the socket does not take waits
//!    for writability.
//!
//! Invariants:
//! - Each request gets exactly one complete reply (except DISC), sent only
//!   after its operation (and, for FUA, the commit) finished; requests in
//!   flight together complete in any order, which NBD allows.
//! - The connection is dropped only when nothing is in flight: no piece on
//!   the ring, no job on the pool, no poll armed (`finished`), because the
//!   kernel and the workers write into its buffers until then.
//! - Memory is bounded: at most [`MAX_IN_FLIGHT_REQUESTS`] requests in
//!   flight and [`MAX_QUEUED_REPLY_BYTES`] of replies queued; beyond that
//!   the connection stops receiving until they drain (TCP pushes back).
//! - A broken stream (bad magic, truncated request, oversize WRITE) or a
//!   failed send shuts the socket down; requests in flight finish, their
//!   replies are dropped.

mod execute;

use crate::handshake::Negotiated;
use crate::requests::{admit, encode_replies, Entry, Outcome, Segment};
use crate::socket::RecvBuffer;
use crate::stream::{Peer, Stream};
use crate::transmission::{
    SessionEnd, MAX_BATCH_BYTES, MAX_BATCH_REQUESTS, MAX_DISCARDED_WRITE, RECV_BUFFER_BYTES,
};
use crate::{ConnectionError, MAX_PAYLOAD};
use basalt_loop_io::{BlockIo, BufferPool, Completion, ReplyQueue, SocketPolls, MAX_SLOTS};
use basalt_nbd_wire::{parse_request, Command, NbdError, Request, WireError};
use basalt_reactor::{Connection, Io, Payload};
use basalt_store::AlignedBuf;
use basalt_volume::VolumeHandle;
use execute::Token;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// Requests of one connection in flight at most; more wait in the socket.
pub const MAX_IN_FLIGHT_REQUESTS: usize = MAX_SLOTS;
/// Encoded replies and read data queued for sending at most before the
/// connection stops receiving.
pub const MAX_QUEUED_REPLY_BYTES: usize = 128 << 20;

/// How the connection ends, reported once when it is dropped.
pub(crate) type OnEnd = Box<dyn FnOnce(Result<SessionEnd, ConnectionError>) + Send>;

/// A WRITE whose payload is still arriving.
struct Incoming {
    request: Request,
    buf: AlignedBuf,
    have: usize,
}

pub(crate) struct EventedConnection {
    stream: Stream,
    fd: RawFd,
    peer: Peer,
    negotiated: Negotiated,
    block_io: BlockIo<Token, Outcome>,
    recv: RecvBuffer,
    pool: BufferPool,
    incoming: Option<Incoming>,
    /// Bytes of an oversize WRITE's payload still to drop.
    discarding: usize,
    forming: Vec<Entry>,
    forming_bytes: u64,
    replies: ReplyQueue,
    polls: SocketPolls,
    /// Still receiving requests (false after DISC, EOF, an error or stop).
    reading: bool,
    /// The socket is shut down or failed: nothing more is sent.
    dead: bool,
    end: Option<Result<SessionEnd, ConnectionError>>,
    on_end: Option<OnEnd>,
    scratch_encoded: Vec<u8>,
    scratch_segments: Vec<Segment>,
}

impl EventedConnection {
    /// A connection after its handshake, on any volume: one of this node's
    /// store, or a replicated one (served through its primary).
    pub(crate) fn new(
        stream: Stream,
        peer: Peer,
        negotiated: Negotiated,
        on_end: OnEnd,
    ) -> io::Result<EventedConnection> {
        let mut block_io = BlockIo::new(VolumeHandle::clone(&negotiated.handle));
        stream.set_nonblocking(true)?;
        let fd = stream.as_raw_fd();
        let replies = block_io.reply_queue(fd);
        Ok(EventedConnection {
            fd,
            stream,
            peer,
            block_io,
            negotiated,
            recv: RecvBuffer::new(RECV_BUFFER_BYTES),
            pool: BufferPool::new(),
            incoming: None,
            discarding: 0,
            forming: Vec::new(),
            forming_bytes: 0,
            replies,
            polls: SocketPolls::new(fd),
            reading: true,
            dead: false,
            end: None,
            on_end: Some(on_end),
            scratch_encoded: Vec::new(),
            scratch_segments: Vec::new(),
        })
    }

    /// Records how the connection ends (the first report wins); an error
    /// or a stop shuts the socket down, which also completes any poll.
    fn end_with(&mut self, outcome: Result<SessionEnd, ConnectionError>, kill: bool) {
        self.reading = false;
        if kill && !self.dead {
            self.dead = true;
            self.polls.close();
            let _ = self.stream.shutdown(Shutdown::Both);
            self.replies.clear(&mut self.pool);
        }
        if self.end.is_none() {
            self.end = Some(outcome);
        }
    }

    fn throttled(&self) -> bool {
        self.block_io.in_flight() + self.forming.len() >= MAX_IN_FLIGHT_REQUESTS
            || self.replies.queued_bytes() >= MAX_QUEUED_REPLY_BYTES
    }

    // ------------------------------------------------------------ receive

    /// Receives and parses what the socket has, dispatching requests.
    fn pump(&mut self, io: &mut Io<'_>) {
        if let Err(err) = self.receive(io) {
            self.end_with(Err(err), true);
        }
        self.dispatch_forming(io);
    }

    fn receive(&mut self, io: &mut Io<'_>) -> Result<(), ConnectionError> {
        while self.reading && !self.dead {
            if self.throttled() {
                // Resumed when a request completes or replies drain.
                return Ok(());
            }
            if let Some(mut incoming) = self.incoming.take() {
                if !self.fill_incoming(&mut incoming)? {
                    self.incoming = Some(incoming);
                    self.polls.arm_readable(io);
                    return Ok(());
                }
                self.push(incoming.request, Some(incoming.buf));
                continue;
            }
            if self.discarding > 0 {
                let have = self.discarding.min(self.recv.data().len());
                self.recv.consume(have);
                self.discarding -= have;
                if self.discarding > 0 && !self.fill(io)? {
                    return Ok(());
                }
                continue;
            }
            if self.forming.len() >= MAX_BATCH_REQUESTS || self.forming_bytes >= MAX_BATCH_BYTES {
                self.dispatch_forming(io);
                continue;
            }
            match parse_request(self.recv.data()) {
                Ok((request, used)) => {
                    self.recv.consume(used);
                    self.accept(request)?;
                }
                Err(WireError::Incomplete(_)) => {
                    if !self.fill(io)? {
                        return Ok(());
                    }
                }
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
    }

    /// Tops the receive buffer up; false when the socket has nothing now
    /// (a poll is armed) or the stream ended.
    fn fill(&mut self, io: &mut Io<'_>) -> Result<bool, ConnectionError> {
        if !self.recv.has_room() {
            return Err(ConnectionError::Io(io::Error::other(
                "receive buffer full of an unparsable request",
            )));
        }
        match self.recv.fill_nonblocking(&self.stream)? {
            Some(0) => {
                let end = if self.recv.is_empty() && self.discarding == 0 {
                    Ok(SessionEnd::ClientClosed)
                } else {
                    Err(ConnectionError::Truncated)
                };
                self.end_with(end, false);
                Ok(false)
            }
            Some(_) => Ok(true),
            None => {
                self.polls.arm_readable(io);
                Ok(false)
            }
        }
    }

    /// Moves buffered and then socket bytes into a WRITE's payload; true
    /// once it is complete.
    fn fill_incoming(&mut self, incoming: &mut Incoming) -> Result<bool, ConnectionError> {
        let len = incoming.buf.len();
        let buffered = self.recv.data();
        let take = (len - incoming.have).min(buffered.len());
        incoming.buf[incoming.have..incoming.have + take].copy_from_slice(&buffered[..take]);
        self.recv.consume(take);
        incoming.have += take;
        while incoming.have < len {
            let tail = &mut incoming.buf[incoming.have..];
            // SAFETY: `tail` is a valid writable buffer of `tail.len()` bytes
            // and `self.fd` the open socket.
            let n = unsafe {
                libc::recv(
                    self.fd,
                    tail.as_mut_ptr().cast(),
                    tail.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                incoming.have += n as usize;
                continue;
            }
            if n == 0 {
                return Err(ConnectionError::Truncated);
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok(false),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err.into()),
            }
        }
        Ok(true)
    }

    /// Takes one parsed request.
    fn accept(&mut self, request: Request) -> Result<(), ConnectionError> {
        match request.command {
            // Anything the client sent after DISC is ignored: it must not
            // send any.
            Command::Disc => self.end_with(Ok(SessionEnd::Disconnect), false),
            Command::Write if request.length > MAX_PAYLOAD => {
                if request.length > MAX_DISCARDED_WRITE {
                    return Err(ConnectionError::OversizeWrite(request.length));
                }
                self.discarding = request.length as usize;
                self.forming.push(Entry {
                    request,
                    payload: None,
                    outcome: Outcome::failed(
                        NbdError::Invalid,
                        "WRITE longer than the maximum payload of 32 MiB",
                    ),
                });
            }
            Command::Write => {
                let buf = self.pool.take(request.length as usize);
                self.incoming = Some(Incoming {
                    request,
                    buf,
                    have: 0,
                });
            }
            _ => self.push(request, None),
        }
        Ok(())
    }

    /// Validates a request and adds it to those received; READs get
    /// their buffer here.
    fn push(&mut self, request: Request, payload: Option<AlignedBuf>) {
        let entry = admit(&self.negotiated, &mut self.pool, request, payload);
        if let Some(buf) = &entry.payload {
            self.forming_bytes += buf.len() as u64;
        }
        self.forming.push(entry);
    }

    /// After a round of callbacks: receive again if the connection stopped
    /// receiving only for lack of room (throttled) and now has some.
    /// Never called from inside `pump`, so completions that happen
    /// synchronously cannot recurse into receiving.
    fn resume(&mut self, io: &mut Io<'_>) {
        if self.reading && !self.dead && !self.polls.waiting_readable() && !self.throttled() {
            self.pump(io);
        }
    }

    // -------------------------------------------------------------- reply

    /// Encodes a finished request's reply and queues it, with its read
    /// data (not copied).
    fn queue_reply(&mut self, entry: Entry) {
        if self.dead {
            if let Some(buf) = entry.payload {
                self.pool.give(buf);
            }
            return;
        }
        let mut encoded = std::mem::take(&mut self.scratch_encoded);
        let mut segments = std::mem::take(&mut self.scratch_segments);
        encoded.clear();
        segments.clear();
        encode_replies(
            std::slice::from_ref(&entry),
            &self.negotiated,
            &mut encoded,
            &mut segments,
        );
        let pieces = segments
            .iter()
            .filter(|s| matches!(s, Segment::Data(..)))
            .count();
        // One piece of data (a READ): the buffer moves into the queue.
        // Several (a READ with holes): they share it.
        let mut owned = entry.payload;
        let shared = if pieces > 1 {
            owned.take().map(Arc::new)
        } else {
            None
        };
        for segment in segments.drain(..) {
            match segment {
                Segment::Encoded(range) => {
                    self.replies.push_encoded(encoded.get(range).unwrap_or(&[]));
                }
                Segment::Data(_, range) if range.is_empty() => {}
                Segment::Data(_, range) => {
                    if let Some(buf) = &shared {
                        self.replies.push_shared(Arc::clone(buf), range);
                    } else if let Some(buf) = owned.take() {
                        self.replies.push_owned(buf, range);
                    }
                }
            }
        }
        // A buffer no reply refers to (a WRITE's payload) goes back now.
        if let Some(buf) = owned {
            self.pool.give(buf);
        }
        self.scratch_encoded = encoded;
        self.scratch_segments = segments;
    }

    /// Sends queued replies until the socket takes no more (then waits for
    /// it to be writable).
    fn send(&mut self, io: &mut Io<'_>) {
        if self.dead || self.replies.is_empty() {
            return;
        }
        match self.replies.send(self.fd, &mut self.pool) {
            Ok(true) => {}
            Ok(false) => self.polls.arm_writable(io),
            Err(e) => self.end_with(Err(e.into()), true),
        }
    }
}

impl Connection for EventedConnection {
    fn start(&mut self, io: &mut Io<'_>) {
        self.pump(io);
    }

    /// After the loop's round of completions: send every reply queued
    /// during it at once, then receive again if there is room.
    fn flush(&mut self, io: &mut Io<'_>) {
        self.send(io);
        self.resume(io);
        // A replicated volume's requests of this round leave as one batch.
        self.block_io.submit_started(io);
    }

    fn completed(&mut self, io: &mut Io<'_>, tag: u32, result: i32) {
        match self.polls.classify(tag, result) {
            Completion::Readable(Err(err)) if !self.dead => self.end_with(Err(err.into()), true),
            Completion::Readable(_) => self.pump(io),
            Completion::Writable => self.send(io),
            Completion::BlockIo => {
                self.block_io.completed(io, tag, result);
                self.take_finished();
            }
            Completion::Unknown => {
                tracing::error!(peer = %self.peer, tag, "completion of an unknown ring entry")
            }
        }
    }

    fn delivered(&mut self, io: &mut Io<'_>, payload: Payload) {
        match self.block_io.delivered(io, payload) {
            None => self.take_finished(),
            Some(_) => {
                // Not one of this connection's deliveries (its jobs catch
                // their own panics): the stream cannot be trusted.
                tracing::error!(peer = %self.peer, "unexpected message for an NBD connection; closing it");
                self.end_with(
                    Err(ConnectionError::Io(io::Error::other("request job failed"))),
                    true,
                );
            }
        }
    }

    fn retry(&mut self, io: &mut Io<'_>) {
        self.block_io.retry(io);
        self.take_finished();
    }

    fn stop(&mut self, io: &mut Io<'_>) {
        self.end_with(Ok(SessionEnd::ClientClosed), true);
        self.block_io.cancel_throttled(io);
        self.take_finished();
    }

    fn finished(&self) -> bool {
        let drained = self.dead || self.replies.is_empty();
        !self.reading
            && self.block_io.in_flight() == 0
            && self.forming.is_empty()
            && drained
            && !self.polls.armed()
    }
}

impl Drop for EventedConnection {
    fn drop(&mut self) {
        if let Some(on_end) = self.on_end.take() {
            on_end(self.end.take().unwrap_or(Ok(SessionEnd::ClientClosed)));
        }
    }
}
