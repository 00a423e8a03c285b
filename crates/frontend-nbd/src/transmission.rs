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

use crate::bufpool::BufferPool;
use crate::handshake::Negotiated;
use crate::socket::{send_if_idle, write_all_vectored, RecvBuffer};
use crate::{ConnectionError, MAX_PAYLOAD};
use basalt_nbd_wire::transmission::MAX_BLOCK_STATUS_DESCRIPTORS;
use basalt_nbd_wire::{
    encode_block_status_chunk, encode_error_chunk, encode_none_chunk, encode_offset_data_header,
    encode_offset_hole_chunk, encode_simple_reply, parse_request, BlockDescriptor,
    BlockStatusFlags, Command, CommandFlags, NbdError, ReplyFlags, Request, WireError,
};
use basalt_store::AlignedBuf;
use basalt_volume::{DataOp, IoError, MappingRun, WriteAck};
use parking_lot::{Mutex, MutexGuard};
use std::borrow::Cow;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
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
/// Structured READs at least this long (and without DF) are checked against
/// the volume's mapping, and unallocated parts are sent as OFFSET_HOLE
/// chunks instead of zeros. Smaller reads are not worth the lookup.
pub const SPARSE_READ_MIN: u32 = 64 * 1024;

/// How a transmission phase ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client sent `NBD_CMD_DISC` (soft disconnect).
    Disconnect,
    /// The client closed the connection between two requests.
    ClientClosed,
}

enum Outcome {
    /// Valid, not executed yet.
    Pending,
    /// Succeeded; a READ's data is in the entry's payload buffer.
    Done,
    /// Succeeded, and this READ covers unallocated runs (sent as holes).
    Sparse(Vec<MappingRun>),
    /// BLOCK_STATUS result.
    Extents(Vec<BlockDescriptor>),
    Failed {
        error: NbdError,
        message: Cow<'static, str>,
    },
}

impl Outcome {
    fn failed(error: NbdError, message: impl Into<Cow<'static, str>>) -> Outcome {
        Outcome::Failed {
            error,
            message: message.into(),
        }
    }
}

struct Entry {
    request: Request,
    /// READ destination or WRITE source; `None` for zero-length data
    /// requests and every other command.
    payload: Option<AlignedBuf>,
    outcome: Outcome,
}

/// Where one piece of the reply stream comes from.
enum Segment {
    /// Bytes of the encoded reply headers.
    Encoded(Range<usize>),
    /// Read data in the payload buffer of the batch entry at this index.
    Data(usize, Range<usize>),
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
    stream: TcpStream,
    recv: RecvBuffer,
    /// Set by the lane that saw the request stream end (DISC, EOF or a
    /// broken stream); every other lane stops when it next takes the intake.
    ended: bool,
}

/// One connection in the transmission phase, shared by its lanes.
struct Connection {
    peer: SocketAddr,
    negotiated: Negotiated,
    intake: Mutex<Intake>,
    /// The sending side: a lane sends a whole batch's replies under it
    /// (shared with the batch's [`EarlyReplies`], which outlive the lane's
    /// borrow of the connection).
    replies: Arc<Mutex<TcpStream>>,
    /// A handle to shut the socket down without waiting for either side.
    control: TcpStream,
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
    socket: Arc<Mutex<TcpStream>>,
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
    stream: TcpStream,
    peer: SocketAddr,
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
        let (outcome, payload) = match self.validate(&request) {
            Err(failed) => (failed, payload),
            // Zero-length data requests succeed without touching the store
            // (the protocol leaves them unspecified and clients only use
            // them as probes). FLUSH always has length 0 and must run.
            Ok(()) if request.length == 0 && request.command != Command::Flush => {
                (Outcome::Done, payload)
            }
            Ok(()) => match request.command {
                Command::Read => (
                    Outcome::Pending,
                    Some(self.pool.take(request.length as usize)),
                ),
                _ => (Outcome::Pending, payload),
            },
        };
        if let Some(buf) = &payload {
            self.batch_bytes += buf.len() as u64;
        }
        self.batch.push(Entry {
            request,
            payload,
            outcome,
        });
    }

    fn validate(&self, request: &Request) -> Result<(), Outcome> {
        let structured = self.conn.negotiated.structured;
        let allowed = match request.command {
            Command::Read if structured => CommandFlags::FUA | CommandFlags::DF,
            Command::Read | Command::Write | Command::Flush | Command::Trim | Command::Cache => {
                CommandFlags::FUA
            }
            Command::WriteZeroes => {
                CommandFlags::FUA | CommandFlags::NO_HOLE | CommandFlags::FAST_ZERO
            }
            Command::BlockStatus => CommandFlags::FUA | CommandFlags::REQ_ONE,
            Command::Disc => CommandFlags::empty(),
            Command::Unknown(_) => {
                return Err(Outcome::failed(NbdError::Invalid, "unknown command"))
            }
        };
        if !allowed.contains(request.flags) {
            return Err(Outcome::failed(
                NbdError::Invalid,
                "command flag not valid for this command",
            ));
        }
        match request.command {
            // FLUSH's offset and length are reserved; nothing to check.
            Command::Flush => return Ok(()),
            Command::Read if request.length > MAX_PAYLOAD => {
                return Err(Outcome::failed(
                    NbdError::Overflow,
                    "READ longer than the maximum payload of 32 MiB",
                ))
            }
            Command::BlockStatus if self.conn.negotiated.base_allocation.is_none() => {
                return Err(Outcome::failed(
                    NbdError::Invalid,
                    "BLOCK_STATUS without a negotiated metadata context",
                ))
            }
            Command::BlockStatus if request.length == 0 => {
                return Err(Outcome::failed(
                    NbdError::Invalid,
                    "zero-length BLOCK_STATUS",
                ))
            }
            _ => {}
        }
        let size = self.conn.negotiated.handle.size();
        match request.end() {
            Some(end) if end <= size => Ok(()),
            // The protocol asks for ENOSPC on writes beyond the end and
            // EINVAL on everything else.
            _ if matches!(request.command, Command::Write | Command::WriteZeroes) => {
                Err(Outcome::failed(
                    NbdError::NoSpace,
                    "request extends beyond the end of the export",
                ))
            }
            _ => Err(Outcome::failed(
                NbdError::Invalid,
                "request extends beyond the end of the export",
            )),
        }
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
        match ack {
            Some(ack) => handle.submit_writes(&mut ops, ack),
            None => handle.submit(&mut ops),
        }
        for (op, (outcome, request)) in ops.into_iter().zip(targets) {
            *outcome = match op.result {
                Err(err) => failure(&err, &request, self.conn.peer),
                Ok(())
                    if request.command == Command::Read
                        && structured
                        && request.length >= SPARSE_READ_MIN
                        && !request.flags.contains(CommandFlags::DF) =>
                {
                    match handle.mapping(request.offset, u64::from(request.length)) {
                        Ok(runs) if runs.iter().any(|r| !r.allocated) => Outcome::Sparse(runs),
                        // Fully allocated, or the lookup failed: the data
                        // itself is correct either way.
                        _ => Outcome::Done,
                    }
                }
                Ok(()) => Outcome::Done,
            };
        }
    }

    fn execute_command(&mut self, index: usize) {
        let handle = &self.conn.negotiated.handle;
        let Some(entry) = self.batch.get_mut(index) else {
            return;
        };
        let request = entry.request;
        let fua = request.flags.contains(CommandFlags::FUA);
        let offset = request.offset;
        let len = u64::from(request.length);
        let result = match request.command {
            Command::Flush => handle.flush(),
            Command::Trim => handle.trim(offset, len, fua),
            // FAST_ZERO needs no check: zeroing is a metadata update or a
            // punch here, never slower than writing zeros.
            Command::WriteZeroes => handle.write_zeroes(
                offset,
                len,
                !request.flags.contains(CommandFlags::NO_HOLE),
                fua,
            ),
            // Nothing to prefetch: reads are served from the device directly.
            Command::Cache => Ok(()),
            Command::BlockStatus => {
                entry.outcome = match handle.mapping(offset, len) {
                    Ok(runs) => block_status(&runs, request.flags.contains(CommandFlags::REQ_ONE)),
                    Err(err) => failure(&err, &request, self.conn.peer),
                };
                return;
            }
            Command::Read | Command::Write | Command::Disc | Command::Unknown(_) => return,
        };
        entry.outcome = match result {
            Ok(()) => Outcome::Done,
            Err(err) => failure(&err, &request, self.conn.peer),
        };
    }

    // -------------------------------------------------------------- reply

    fn send_replies(&mut self) -> Result<(), ConnectionError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.encoded.clear();
        self.segments.clear();
        let mut marked = 0; // start of encoded bytes not yet in a segment
        let context_id = self.conn.negotiated.base_allocation.unwrap_or(0);
        let mut data = Vec::new();
        for (index, entry) in self.batch.iter().enumerate() {
            let before = self.encoded.len();
            if encode_reply(
                entry,
                index,
                self.conn.negotiated.structured,
                context_id,
                &mut self.encoded,
                &mut data,
            )
            .is_err()
            {
                // Cannot happen for values this module builds; still, never
                // leave a request without a reply.
                self.encoded.truncate(before);
                data.clear();
                encode_failure(
                    entry.request.cookie,
                    self.conn.negotiated.structured,
                    NbdError::Io,
                    "internal error encoding the reply",
                    &mut self.encoded,
                );
            }
            for (at, piece) in data.drain(..) {
                self.segments.push(Segment::Encoded(marked..at));
                self.segments.push(piece);
                marked = at;
            }
        }
        self.segments
            .push(Segment::Encoded(marked..self.encoded.len()));
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
fn read_payload(stream: &mut TcpStream, buf: &mut [u8]) -> Result<(), ConnectionError> {
    match stream.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ConnectionError::Truncated),
        Err(e) => Err(e.into()),
    }
}

/// Maps a store error to the NBD error the client sees.
fn nbd_error(err: &IoError, command: Command) -> NbdError {
    match err {
        // The export shrank under the request: same codes as the range check.
        IoError::OutOfRange { .. } => match command {
            Command::Write | Command::WriteZeroes => NbdError::NoSpace,
            _ => NbdError::Invalid,
        },
        IoError::NoSpace => NbdError::NoSpace,
        IoError::Io(_) | IoError::Failed | IoError::Corrupt { .. } => NbdError::Io,
        // The volume was deleted: the client must disconnect, which is what
        // ESHUTDOWN tells it.
        IoError::Gone => NbdError::Shutdown,
        IoError::ReadOnly => NbdError::Perm,
    }
}

fn failure(err: &IoError, request: &Request, peer: SocketAddr) -> Outcome {
    let error = nbd_error(err, request.command);
    if error == NbdError::Io {
        tracing::warn!(%peer, command = ?request.command, offset = request.offset,
            length = request.length, "NBD request failed: {err}");
    } else {
        tracing::debug!(%peer, command = ?request.command, offset = request.offset,
            length = request.length, "NBD request failed: {err}");
    }
    Outcome::failed(error, err.to_string())
}

/// Converts mapping runs into `base:allocation` descriptors.
fn block_status(runs: &[MappingRun], req_one: bool) -> Outcome {
    let mut descriptors = Vec::new();
    for run in runs {
        // Runs cover at most the request's 32-bit length; stop rather than
        // send a wrong length if that ever changed (fewer extents is valid).
        let Ok(length) = u32::try_from(run.len) else {
            break;
        };
        if length == 0 {
            continue;
        }
        let status = if run.allocated {
            BlockStatusFlags::empty()
        } else {
            BlockStatusFlags::HOLE | BlockStatusFlags::ZERO
        };
        descriptors.push(BlockDescriptor { length, status });
        if req_one || descriptors.len() >= MAX_BLOCK_STATUS_DESCRIPTORS {
            break;
        }
    }
    if descriptors.is_empty() {
        return Outcome::failed(NbdError::Io, "no allocation information for the range");
    }
    Outcome::Extents(descriptors)
}

fn encode_failure(
    cookie: u64,
    structured: bool,
    error: NbdError,
    message: &str,
    out: &mut Vec<u8>,
) {
    // A structured error chunk carries the message, so prefer it; error
    // chunks only fail to encode for error value 0, which NbdError never is
    // here.
    if !structured
        || encode_error_chunk(cookie, ReplyFlags::DONE, error, message, None, out).is_err()
    {
        encode_simple_reply(cookie, Some(error), out);
    }
}

/// Encodes the reply to one entry; read data is not copied but listed in
/// `data` as (position in `out` where it goes, segment).
fn encode_reply(
    entry: &Entry,
    index: usize,
    structured: bool,
    context_id: u32,
    out: &mut Vec<u8>,
    data: &mut Vec<(usize, Segment)>,
) -> Result<(), WireError> {
    let request = &entry.request;
    let cookie = request.cookie;
    let len = request.length;
    match (&entry.outcome, request.command) {
        (Outcome::Failed { error, message }, _) => {
            encode_failure(cookie, structured, *error, message, out)
        }
        (Outcome::Pending, _) => encode_failure(
            cookie,
            structured,
            NbdError::Io,
            "request was not executed",
            out,
        ),
        (Outcome::Done, Command::Read) if structured => {
            if len == 0 {
                encode_none_chunk(cookie, out);
            } else {
                encode_offset_data_header(cookie, ReplyFlags::DONE, request.offset, len, out)?;
                data.push((out.len(), Segment::Data(index, 0..len as usize)));
            }
        }
        (Outcome::Done, Command::Read) => {
            encode_simple_reply(cookie, None, out);
            if len > 0 {
                data.push((out.len(), Segment::Data(index, 0..len as usize)));
            }
        }
        (Outcome::Sparse(runs), _) => {
            let mut position: u32 = 0;
            let count = runs.len();
            for (k, run) in runs.iter().enumerate() {
                let run_len = u32::try_from(run.len).map_err(|_| WireError::Malformed {
                    what: "read reply",
                    reason: "mapping run longer than the request",
                })?;
                let flags = if k + 1 == count {
                    ReplyFlags::DONE
                } else {
                    ReplyFlags::empty()
                };
                let offset = request.offset + u64::from(position);
                if run.allocated {
                    encode_offset_data_header(cookie, flags, offset, run_len, out)?;
                    let start = position as usize;
                    data.push((
                        out.len(),
                        Segment::Data(index, start..start + run_len as usize),
                    ));
                } else {
                    encode_offset_hole_chunk(cookie, flags, offset, run_len, out)?;
                }
                position = position.saturating_add(run_len);
            }
        }
        (Outcome::Extents(descriptors), _) => {
            encode_block_status_chunk(cookie, ReplyFlags::DONE, context_id, descriptors, out)?
        }
        (Outcome::Done, _) => encode_simple_reply(cookie, None, out),
    }
    Ok(())
}
