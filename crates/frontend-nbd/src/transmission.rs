//! The transmission phase of one connection: requests in, replies out.
//!
//! Job: turn the byte stream of requests into volume operations and their
//! outcomes back into replies, with as few syscalls and store submissions as
//! the client's pipelining allows. A connection is served by one or more
//! *lanes* (threads); each lane runs the whole cycle for its own batch, so
//! no request ever changes thread:
//!
//! 1. *Gather* (holding the connection's intake, i.e. its receiving side):
//!    parse every complete request already received (blocking only when
//!    nothing is pending), receiving WRITE payloads into pooled aligned
//!    buffers, then top the receive buffer up without blocking and parse
//!    again, until the kernel has nothing more or the batch is full. Then
//!    hand the intake to the next lane, which gathers the following batch
//!    while this one waits for the disk. A lane whose batch is a single
//!    request with nothing else in flight (a queue-depth-1 client) keeps the
//!    intake instead: waking another thread per request costs more latency
//!    than overlap could win.
//! 2. *Execute*: consecutive READs and WRITEs go to the store in one
//!    `VolumeHandle::submit` call; FLUSH, TRIM, WRITE_ZEROES, BLOCK_STATUS
//!    and CACHE run in arrival order between those groups of their batch.
//!    Across lanes, batches run concurrently, which NBD allows: requests in
//!    flight together have no order, and a FLUSH covers the writes that
//!    were *replied to* before it was sent — those finished before it.
//! 3. *Reply*: encode every reply of the batch into one buffer and send it,
//!    with the read data straight from the read buffers, in one `writev`
//!    under the connection's send lock (replies of different batches never
//!    interleave). A batch of WRITEs only, on a volume whose writes complete
//!    on another thread (a replicated volume), is acknowledged by that
//!    thread instead, as soon as the last write succeeded: its success
//!    replies are encoded up front and sent, if the socket has nothing
//!    queued, without waking this lane first (see `EarlyReplies`).
//!
//! Invariants:
//! - Each request gets exactly one complete reply (except DISC), sent only
//!   after its operation finished; FUA becomes `fua = true` on the store call.
//! - With structured replies a READ is never answered with a simple reply,
//!   and every structured reply ends with a chunk carrying the DONE flag.
//! - Request validation (flags, range, size) happens before anything touches
//!   the store; an invalid request costs one error reply, and the connection
//!   stays usable. Only a bad request magic, a truncated request or an absurd
//!   WRITE length ends it, because the stream cannot be followed after those.
//! - Memory per connection is bounded: at most [`MAX_BATCH_REQUESTS`]
//!   requests and about [`MAX_BATCH_BYTES`] of payload per batch and lane,
//!   buffers recycled through each lane's pool.
//! - The connection ends once every lane has finished its batch: after DISC
//!   or EOF no lane gathers again, and every request already read is
//!   answered first. A broken stream shuts the socket down so that no lane
//!   stays blocked.

use crate::handshake::Negotiated;
use crate::requests::{admit, data_outcome, encode_replies, run_command, Entry, Outcome, Segment};
use crate::socket::{send_if_idle, write_all_vectored, RecvBuffer};
use crate::stream::{Peer, Stream};
use crate::{ConnectionError, MAX_PAYLOAD};
use basalt_loop_io::BufferPool;
use basalt_nbd_wire::{
    encode_simple_reply, parse_request, Command, CommandFlags, NbdError, Request, WireError,
};
use basalt_store::AlignedBuf;
use basalt_volume::{DataOp, WriteAck};
use parking_lot::{Mutex, MutexGuard};
use std::io::{self, Read};
use std::net::Shutdown;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Size of the buffer requests are received into. Large enough that one
/// `recv` picks up dozens of pipelined small writes.
pub const RECV_BUFFER_BYTES: usize = 256 * 1024;
/// Most requests executed as one batch.
pub const MAX_BATCH_REQUESTS: usize = 256;
/// Payload bytes (reads plus writes) after which a batch stops growing.
pub const MAX_BATCH_BYTES: u64 = 64 << 20;
/// WRITEs longer than [`MAX_PAYLOAD`] are refused with `NBD_EINVAL` after
/// their payload is read and discarded, up to this length; longer ones end
/// the connection, since reading gigabytes to stay in sync is itself the
/// denial of service the limit exists to prevent.
pub const MAX_DISCARDED_WRITE: u32 = 128 << 20;

/// How a transmission phase ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client sent `NBD_CMD_DISC` (soft disconnect).
    Disconnect,
    /// The client closed the connection between two requests.
    ClientClosed,
}

enum Gathered {
    /// Execute the batch, then continue.
    Batch,
    /// DISC received: execute the batch, reply, close.
    Disconnect,
    /// The client closed its side: execute the batch, reply, close.
    Eof,
}

/// The receiving side of a connection, held by one lane at a time.
struct Intake {
    stream: Stream,
    recv: RecvBuffer,
    /// Set by the lane that saw the request stream end (DISC, EOF or a
    /// broken stream); every other lane stops when it next takes the intake.
    ended: bool,
}

/// One connection in the transmission phase, shared by its lanes.
struct Connection {
    peer: Peer,
    negotiated: Negotiated,
    intake: Mutex<Intake>,
    /// The sending side: a lane sends a whole batch's replies under it
    /// (shared with the batch's [`EarlyReplies`], which outlive the lane's
    /// borrow of the connection).
    replies: Arc<Mutex<Stream>>,
    /// A handle to shut the socket down without waiting for either side.
    control: Stream,
    /// Lanes between gathering a batch and finishing its replies.
    executing: AtomicUsize,
    /// How the connection ended, as seen by the first lane that saw it.
    end: Mutex<Option<Result<SessionEnd, ConnectionError>>>,
}

/// The success replies of a batch of WRITEs, sent by whichever thread
/// completes the batch's last write ([`WriteAck`]), so the client's
/// acknowledgement does not wait for this lane to be woken. They are sent
/// only if the socket has nothing queued (a non-blocking send that the
/// kernel takes whole), so a client that stops reading can never block the
/// completing thread, which may be serving other volumes; otherwise the
/// lane sends the batch's replies as usual.
///
/// Invariant: `outcome` is `Some` exactly when the replies were sent (or the
/// socket failed while sending them); the lane then sends nothing for the
/// batch. It is set before the submission returns to the lane.
struct EarlyReplies {
    socket: Arc<Mutex<Stream>>,
    encoded: Vec<u8>,
    outcome: Mutex<Option<io::Result<()>>>,
}

impl WriteAck for EarlyReplies {
    fn acknowledge(&self) {
        let socket = self.socket.lock();
        let sent = send_if_idle(&socket, &self.encoded);
        *self.outcome.lock() = sent;
    }
}

/// One lane of a connection: gathers a batch (holding the intake), executes
/// it and sends its replies, then competes for the intake again.
struct Lane<'c> {
    conn: &'c Connection,
    pool: BufferPool,
    batch: Vec<Entry>,
    batch_bytes: u64,
    encoded: Vec<u8>,
    segments: Vec<Segment>,
}

/// Serves requests until the client disconnects or the stream breaks, with
/// `lanes` threads (the calling one included) sharing the connection.
pub fn serve(
    stream: Stream,
    peer: Peer,
    negotiated: Negotiated,
    lanes: usize,
) -> Result<SessionEnd, ConnectionError> {
    let replies = stream.try_clone()?;
    let control = stream.try_clone()?;
    let conn = Connection {
        peer,
        negotiated,
        intake: Mutex::new(Intake {
            stream,
            recv: RecvBuffer::new(RECV_BUFFER_BYTES),
            ended: false,
        }),
        replies: Arc::new(Mutex::new(replies)),
        control,
        executing: AtomicUsize::new(0),
        end: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for n in 1..lanes.max(1) {
            let spawned = std::thread::Builder::new()
                .name(format!("nbd-lane-{n}"))
                .spawn_scoped(scope, || Lane::new(&conn).run());
            if let Err(err) = spawned {
                // Fewer lanes only cost overlap, never correctness.
                tracing::warn!(%peer, "cannot start an NBD lane thread: {err}");
                break;
            }
        }
        Lane::new(&conn).run();
    });
    conn.end
        .into_inner()
        .unwrap_or(Ok(SessionEnd::ClientClosed))
}

impl Connection {
    /// Records how the connection ended (the first report wins) and, for an
    /// error, shuts the socket down so lanes blocked in `recv` or `send`
    /// return at once.
    fn finish(&self, outcome: Result<SessionEnd, ConnectionError>) {
        if outcome.is_err() {
            let _ = self.control.shutdown(Shutdown::Both);
        }
        let mut end = self.end.lock();
        if end.is_none() {
            *end = Some(outcome);
        }
    }
}

impl<'c> Lane<'c> {
    fn new(conn: &'c Connection) -> Lane<'c> {
        Lane {
            conn,
            pool: BufferPool::new(),
            batch: Vec::with_capacity(MAX_BATCH_REQUESTS),
            batch_bytes: 0,
            encoded: Vec::with_capacity(64 * 1024),
            segments: Vec::with_capacity(2 * MAX_BATCH_REQUESTS),
        }
    }

    fn run(mut self) {
        let conn = self.conn;
        // The intake, when this lane kept it from its previous batch.
        let mut kept: Option<MutexGuard<'_, Intake>> = None;
        loop {
            let mut intake = kept.take().unwrap_or_else(|| conn.intake.lock());
            if intake.ended {
                return;
            }
            let gathered = match self.gather(&mut intake) {
                Ok(gathered) => gathered,
                Err(err) => {
                    intake.ended = true;
                    drop(intake);
                    conn.finish(Err(err));
                    return;
                }
            };
            let last = match gathered {
                Gathered::Batch => None,
                Gathered::Disconnect => Some(Ok(SessionEnd::Disconnect)),
                Gathered::Eof if intake.recv.is_empty() => Some(Ok(SessionEnd::ClientClosed)),
                Gathered::Eof => Some(Err(ConnectionError::Truncated)),
            };
            intake.ended = last.is_some();
            tracing::trace!(peer = %conn.peer, requests = self.batch.len(),
                payload_bytes = self.batch_bytes, "NBD batch");
            // Hand the intake to another lane so it gathers the next batch
            // while this one waits for the disk — unless nothing else is in
            // flight and this batch is a single request (a client at queue
            // depth 1): then this lane keeps the intake for its next batch
            // too, because waking another thread per request would only add
            // latency.
            let busy = conn.executing.fetch_add(1, Ordering::AcqRel);
            let keep = busy == 0 && self.batch.len() == 1 && last.is_none();
            let held = if keep {
                Some(intake)
            } else {
                drop(intake);
                None
            };
            let early = self.execute();
            let sent = match early.and_then(|early| early.outcome.lock().take()) {
                Some(sent) => sent.map_err(ConnectionError::from),
                None => self.send_replies(),
            };
            conn.executing.fetch_sub(1, Ordering::AcqRel);
            self.recycle();
            if let Err(err) = sent {
                drop(held);
                // Shut the socket down first: another lane may be blocked
                // in recv while holding the intake.
                conn.finish(Err(err));
                conn.intake.lock().ended = true;
                return;
            }
            if let Some(outcome) = last {
                conn.finish(outcome);
                return;
            }
            kept = held;
        }
    }

    fn batch_full(&self) -> bool {
        self.batch.len() >= MAX_BATCH_REQUESTS || self.batch_bytes >= MAX_BATCH_BYTES
    }

    // ------------------------------------------------------------- gather

    fn gather(&mut self, intake: &mut Intake) -> Result<Gathered, ConnectionError> {
        loop {
            while !self.batch_full() {
                let request = match parse_request(intake.recv.data()) {
                    Ok((request, used)) => {
                        intake.recv.consume(used);
                        request
                    }
                    Err(WireError::Incomplete(_)) => break,
                    Err(err) => return Err(err.into()),
                };
                match request.command {
                    // Anything the client sent after DISC is ignored: it
                    // must not send any.
                    Command::Disc => return Ok(Gathered::Disconnect),
                    Command::Write => self.receive_write(intake, request)?,
                    _ => self.push(request, None),
                }
            }
            if self.batch_full() {
                return Ok(Gathered::Batch);
            }
            if self.batch.is_empty() {
                // Nothing to do until the client sends more: block.
                if intake.recv.fill(&mut intake.stream)? == 0 {
                    return Ok(Gathered::Eof);
                }
            } else {
                // Pick up requests that arrived meanwhile, but never wait:
                // the pending ones must not be delayed.
                match intake.recv.fill_nonblocking(&intake.stream)? {
                    Some(0) => return Ok(Gathered::Eof),
                    Some(_) => {}
                    None => return Ok(Gathered::Batch),
                }
            }
        }
    }

    /// Receives a WRITE's payload: what is already buffered is copied into an
    /// aligned buffer, the rest is read from the socket straight into it.
    fn receive_write(
        &mut self,
        intake: &mut Intake,
        request: Request,
    ) -> Result<(), ConnectionError> {
        if request.length > MAX_PAYLOAD {
            if request.length > MAX_DISCARDED_WRITE {
                return Err(ConnectionError::OversizeWrite(request.length));
            }
            self.discard(intake, request.length as usize)?;
            self.batch.push(Entry {
                request,
                payload: None,
                outcome: Outcome::failed(
                    NbdError::Invalid,
                    "WRITE longer than the maximum payload of 32 MiB",
                ),
            });
            return Ok(());
        }
        let len = request.length as usize;
        let mut buf = self.pool.take(len);
        let buffered = intake.recv.data();
        let have = len.min(buffered.len());
        let (head, tail) = buf.split_at_mut(have);
        head.copy_from_slice(buffered.get(..have).unwrap_or(&[]));
        intake.recv.consume(have);
        if !tail.is_empty() {
            read_payload(&mut intake.stream, tail)?;
        }
        self.push(request, Some(buf));
        Ok(())
    }

    /// Reads and drops `len` bytes of an oversize WRITE's payload.
    fn discard(&mut self, intake: &mut Intake, mut len: usize) -> Result<(), ConnectionError> {
        let have = len.min(intake.recv.data().len());
        intake.recv.consume(have);
        len -= have;
        let mut sink = self.pool.take(len.min(1 << 20));
        while len > 0 {
            let n = len.min(sink.len());
            read_payload(&mut intake.stream, sink.get_mut(..n).unwrap_or(&mut []))?;
            len -= n;
        }
        self.pool.give(sink);
        Ok(())
    }

    /// Validates a request and queues it; READs get their buffer here.
    fn push(&mut self, request: Request, payload: Option<AlignedBuf>) {
        let entry = admit(&self.conn.negotiated, &mut self.pool, request, payload);
        if let Some(buf) = &entry.payload {
            self.batch_bytes += buf.len() as u64;
        }
        self.batch.push(entry);
    }

    // ------------------------------------------------------------ execute

    /// Runs the batch; returns its early replies if it had them (then they
    /// may have been sent already).
    fn execute(&mut self) -> Option<Arc<EarlyReplies>> {
        if let Some(early) = self.early_replies() {
            let ack: Arc<dyn WriteAck> = early.clone();
            self.submit_data(0..self.batch.len(), Some(&ack));
            return Some(early);
        }
        let mut group_start = 0;
        for i in 0..self.batch.len() {
            let is_command = self.batch.get(i).is_some_and(|e| {
                matches!(e.outcome, Outcome::Pending)
                    && !matches!(e.request.command, Command::Read | Command::Write)
            });
            if is_command {
                self.submit_data(group_start..i, None);
                self.execute_command(i);
                group_start = i + 1;
            }
        }
        self.submit_data(group_start..self.batch.len(), None);
        None
    }

    /// The success replies of a batch of valid WRITEs only, encoded, when
    /// the volume completes writes on other threads; `None` otherwise.
    fn early_replies(&self) -> Option<Arc<EarlyReplies>> {
        let all_writes = self.batch.iter().all(|e| {
            matches!(e.outcome, Outcome::Pending)
                && e.request.command == Command::Write
                && e.payload.is_some()
        });
        if !all_writes
            || self.batch.is_empty()
            || !self.conn.negotiated.handle.acknowledges_writes()
        {
            return None;
        }
        let mut encoded = Vec::with_capacity(16 * self.batch.len());
        for entry in &self.batch {
            encode_simple_reply(entry.request.cookie, None, &mut encoded);
        }
        Some(Arc::new(EarlyReplies {
            socket: self.conn.replies.clone(),
            encoded,
            outcome: Mutex::new(None),
        }))
    }

    /// Submits every pending READ/WRITE of `range` in one store call (with
    /// `ack`, the range is the whole batch and every op a WRITE).
    fn submit_data(&mut self, range: Range<usize>, ack: Option<&Arc<dyn WriteAck>>) {
        let handle = &self.conn.negotiated.handle;
        let structured = self.conn.negotiated.structured;
        let Some(entries) = self.batch.get_mut(range) else {
            return;
        };
        let mut ops: Vec<DataOp<'_>> = Vec::new();
        let mut targets: Vec<(&mut Outcome, Request)> = Vec::new();
        for entry in entries.iter_mut() {
            let Entry {
                request,
                payload,
                outcome,
            } = entry;
            if !matches!(outcome, Outcome::Pending) {
                continue;
            }
            let Some(buf) = payload.as_mut() else {
                continue;
            };
            let op = match request.command {
                Command::Read => DataOp::read(request.offset, &mut buf[..]),
                Command::Write => DataOp::write(
                    request.offset,
                    &buf[..],
                    request.flags.contains(CommandFlags::FUA),
                ),
                _ => continue,
            };
            ops.push(op);
            targets.push((outcome, *request));
        }
        if ops.is_empty() {
            return;
        }
        handle.wait_for_qos(&ops);
        match ack {
            Some(ack) => handle.submit_writes(&mut ops, ack),
            None => handle.submit(&mut ops),
        }
        for (op, (outcome, request)) in ops.into_iter().zip(targets) {
            *outcome = data_outcome(structured, &request, op.result, self.conn.peer, |o, l| {
                handle.mapping(o, l).ok()
            });
        }
    }

    fn execute_command(&mut self, index: usize) {
        let Some(entry) = self.batch.get_mut(index) else {
            return;
        };
        entry.outcome = run_command(&self.conn.negotiated.handle, &entry.request, self.conn.peer);
    }

    // -------------------------------------------------------------- reply

    fn send_replies(&mut self) -> Result<(), ConnectionError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.encoded.clear();
        self.segments.clear();
        encode_replies(
            &self.batch,
            &self.conn.negotiated,
            &mut self.encoded,
            &mut self.segments,
        );
        let mut parts: Vec<&[u8]> = Vec::with_capacity(self.segments.len());
        for segment in &self.segments {
            let part = match segment {
                Segment::Encoded(range) => self.encoded.get(range.clone()),
                Segment::Data(index, range) => self
                    .batch
                    .get(*index)
                    .and_then(|e| e.payload.as_ref())
                    .and_then(|buf| buf.get(range.clone())),
            };
            if let Some(part) = part.filter(|p| !p.is_empty()) {
                parts.push(part);
            }
        }
        write_all_vectored(&mut self.conn.replies.lock(), &parts)?;
        Ok(())
    }

    fn recycle(&mut self) {
        for entry in self.batch.drain(..) {
            if let Some(buf) = entry.payload {
                self.pool.give(buf);
            }
        }
        self.batch_bytes = 0;
    }
}

/// Reads exactly `buf.len()` payload bytes; EOF here is a truncated request.
fn read_payload(stream: &mut Stream, buf: &mut [u8]) -> Result<(), ConnectionError> {
    match stream.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ConnectionError::Truncated),
        Err(e) => Err(e.into()),
    }
}
