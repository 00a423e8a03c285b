//! The transmission phase of one connection on an event loop
//! (`basalt_reactor`): for a volume on this node's store, requests are
//! received, staged, sent to the disk, completed and answered on the one
//! loop thread that owns the connection, with no thread hand-off.
//!
//! The cycle, driven by completions:
//! 1. *Receive*: when the socket is readable (a poll on the loop's ring),
//!    take what the kernel has without blocking, parse every complete
//!    request, and receive WRITE payloads into pooled aligned buffers (a
//!    payload that is still arriving waits for the next readiness). The
//!    requests parsed together form a batch.
//! 2. *Execute*: the batch's aligned READs and WRITEs are staged in one
//!    call (`LocalVolume::try_stage`: lookups, allocation, checksums) and
//!    their device pieces submitted to the loop's ring, straight into and
//!    out of the request buffers. Everything that may block — FLUSH, TRIM,
//!    WRITE_ZEROES, BLOCK_STATUS, unaligned reads and writes, the commit a
//!    FUA write may need — runs on the reactor's offload pool and comes
//!    back as a message. A batch whose map lock is contended (a snapshot or
//!    trim waits for it) is retried shortly, never waited for.
//! 3. *Reply*: when the last piece and job of a batch are done, its
//!    replies are encoded and queued with the read data (not copied), and
//!    sent with non-blocking vectored writes; what the socket does not take
//!    waits for writability.
//!
//! A client at queue depth 1 whose write is the only I/O in flight on the
//! loop gets it written synchronously on the loop thread: on a file, the
//! filesystem completes an asynchronous O_DIRECT write on a kernel worker
//! thread, which costs one more wake-up than a synchronous write, and with
//! nothing else in flight nobody waits for the loop meanwhile.
//!
//! Invariants:
//! - Each request gets exactly one complete reply (except DISC), sent only
//!   after its operation (and, for FUA, the commit) finished; batches in
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

use crate::bufpool::BufferPool;
use crate::handshake::Negotiated;
use crate::requests::{
    data_outcome, encode_replies, run_command, validate, Entry, Outcome, Segment,
};
use crate::socket::RecvBuffer;
use crate::transmission::{
    SessionEnd, MAX_BATCH_BYTES, MAX_BATCH_REQUESTS, MAX_DISCARDED_WRITE, RECV_BUFFER_BYTES,
};
use crate::{ConnectionError, MAX_PAYLOAD};
use basalt_nbd_wire::{parse_request, Command, CommandFlags, NbdError, Request, WireError};
use basalt_reactor::{Connection, Io, Payload};
use basalt_store::{
    fail_fua_writes, AlignedBuf, Contended, DataKind, DataOp, LocalVolume, StagedBatch,
};
use basalt_volume::IoError;
use io_uring::{opcode, types};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

/// Requests of one connection in flight at most; more wait in the socket.
pub const MAX_IN_FLIGHT_REQUESTS: usize = 1024;
/// Encoded replies and read data queued for sending at most before the
/// connection stops receiving.
pub const MAX_QUEUED_REPLY_BYTES: usize = 128 << 20;
/// Batches in flight at most (the tag has room for 1024).
const MAX_BATCHES: usize = 1023;
const TAG_POLL_IN: u32 = 0x7FFF_FFFF;
const TAG_POLL_OUT: u32 = 0x7FFF_FFFE;
const PIECE_BITS: u32 = 20;
/// iovecs per `sendmsg` at most.
const SEND_IOVECS: usize = 64;

/// How the connection ends, reported once when it is dropped.
pub(crate) type OnEnd = Box<dyn FnOnce(Result<SessionEnd, ConnectionError>) + Send>;

/// A WRITE whose payload is still arriving.
struct Incoming {
    request: Request,
    buf: AlignedBuf,
    have: usize,
}

/// Why a batch is not finished yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchState {
    /// Its map lock was contended: to be staged again.
    Staging,
    /// Pieces on the ring and/or jobs on the pool.
    Running,
    /// Waiting for the commit its FUA writes need.
    Committing,
}

struct Batch {
    entries: Vec<Entry>,
    /// The entries (indexes) that are the staged batch's ops, in order.
    data: Vec<usize>,
    staged: Option<StagedBatch>,
    /// One outcome per piece of `staged`.
    results: Vec<io::Result<()>>,
    pieces_left: usize,
    jobs_left: usize,
    state: BatchState,
    /// The only request of its connection in flight when dispatched.
    lone: bool,
    started: Instant,
}

/// What an offloaded job sends back.
enum Delivery {
    Command {
        batch: usize,
        entry: usize,
        outcome: Outcome,
    },
    Unaligned {
        batch: usize,
        entry: usize,
        buf: AlignedBuf,
        result: Result<(), IoError>,
    },
    Commit {
        batch: usize,
        result: Result<(), IoError>,
    },
}

/// A piece of the reply stream queued for sending.
enum Outgoing {
    /// The next `n` bytes of `encoded`.
    Encoded(usize),
    /// Read data.
    Data(Arc<AlignedBuf>, std::ops::Range<usize>),
}

pub(crate) struct EventedConnection {
    stream: TcpStream,
    fd: RawFd,
    peer: SocketAddr,
    negotiated: Negotiated,
    volume: LocalVolume,
    ring_fd: Option<RawFd>,
    recv: RecvBuffer,
    pool: BufferPool,
    incoming: Option<Incoming>,
    /// Bytes of an oversize WRITE's payload still to drop.
    discarding: usize,
    forming: Vec<Entry>,
    forming_bytes: u64,
    batches: Vec<Option<Batch>>,
    free_batches: Vec<usize>,
    batches_in_flight: usize,
    requests_in_flight: usize,
    retrying: bool,
    /// Encoded reply bytes not yet sent, front first.
    encoded: VecDeque<u8>,
    outgoing: VecDeque<Outgoing>,
    /// Bytes of the front of `outgoing` already sent.
    front_sent: usize,
    queued_bytes: usize,
    poll_in: bool,
    poll_out: bool,
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
    /// A connection after its handshake, on a volume of this node's store.
    pub(crate) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        negotiated: Negotiated,
        volume: LocalVolume,
        on_end: OnEnd,
    ) -> io::Result<EventedConnection> {
        stream.set_nonblocking(true)?;
        Ok(EventedConnection {
            fd: stream.as_raw_fd(),
            stream,
            peer,
            ring_fd: volume.ring_fd(),
            volume,
            negotiated,
            recv: RecvBuffer::new(RECV_BUFFER_BYTES),
            pool: BufferPool::new(),
            incoming: None,
            discarding: 0,
            forming: Vec::new(),
            forming_bytes: 0,
            batches: Vec::new(),
            free_batches: Vec::new(),
            batches_in_flight: 0,
            requests_in_flight: 0,
            retrying: false,
            encoded: VecDeque::new(),
            outgoing: VecDeque::new(),
            front_sent: 0,
            queued_bytes: 0,
            poll_in: false,
            poll_out: false,
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
            let _ = self.stream.shutdown(Shutdown::Both);
            self.drop_outgoing();
        }
        if self.end.is_none() {
            self.end = Some(outcome);
        }
    }

    fn drop_outgoing(&mut self) {
        self.encoded.clear();
        for out in self.outgoing.drain(..) {
            if let Outgoing::Data(buf, _) = out {
                if let Ok(buf) = Arc::try_unwrap(buf) {
                    self.pool.give(buf);
                }
            }
        }
        self.front_sent = 0;
        self.queued_bytes = 0;
    }

    fn throttled(&self) -> bool {
        self.requests_in_flight + self.forming.len() >= MAX_IN_FLIGHT_REQUESTS
            || self.batches_in_flight >= MAX_BATCHES
            || self.queued_bytes >= MAX_QUEUED_REPLY_BYTES
    }

    fn arm_poll_in(&mut self, io: &mut Io<'_>) {
        if self.poll_in || self.dead {
            return;
        }
        self.poll_in = true;
        let entry = opcode::PollAdd::new(types::Fd(self.fd), libc::POLLIN as u32).build();
        // SAFETY: the socket stays open until this connection is dropped,
        // which `finished` prevents while the poll is armed.
        unsafe { io.push_wait(entry, TAG_POLL_IN) };
    }

    fn arm_poll_out(&mut self, io: &mut Io<'_>) {
        if self.poll_out || self.dead {
            return;
        }
        self.poll_out = true;
        let entry = opcode::PollAdd::new(types::Fd(self.fd), libc::POLLOUT as u32).build();
        // SAFETY: as for `arm_poll_in`.
        unsafe { io.push_wait(entry, TAG_POLL_OUT) };
    }

    // ------------------------------------------------------------ receive

    /// Receives and parses what the socket has, dispatching batches.
    fn pump(&mut self, io: &mut Io<'_>) {
        if let Err(err) = self.receive(io) {
            self.end_with(Err(err), true);
        }
        self.dispatch_forming(io);
    }

    fn receive(&mut self, io: &mut Io<'_>) -> Result<(), ConnectionError> {
        while self.reading && !self.dead {
            if self.throttled() {
                // Resumed when a batch completes or replies drain.
                return Ok(());
            }
            if let Some(mut incoming) = self.incoming.take() {
                if !self.fill_incoming(&mut incoming)? {
                    self.incoming = Some(incoming);
                    self.arm_poll_in(io);
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
                self.arm_poll_in(io);
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

    /// Validates a request and adds it to the forming batch; READs get
    /// their buffer here.
    fn push(&mut self, request: Request, payload: Option<AlignedBuf>) {
        let (outcome, payload) = match validate(&self.negotiated, &request) {
            Err(failed) => (failed, payload),
            // Zero-length data requests succeed without touching the store
            // (FLUSH always has length 0 and must run).
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
            self.forming_bytes += buf.len() as u64;
        }
        self.forming.push(Entry {
            request,
            payload,
            outcome,
        });
    }

    // ------------------------------------------------------------ execute

    /// Starts every request received so far, each as its own batch: a
    /// request is answered as soon as its own I/O is done, so a client's
    /// requests keep flowing one by one the way the disk completes them
    /// instead of in convoys (replies still leave together, see `flush`).
    fn dispatch_forming(&mut self, io: &mut Io<'_>) {
        self.forming_bytes = 0;
        let mut forming = std::mem::take(&mut self.forming);
        // A queue-depth-1 client: this request alone, nothing else in
        // flight on the connection.
        let lone = forming.len() == 1 && self.requests_in_flight == 0;
        for entry in forming.drain(..) {
            self.dispatch(io, vec![entry], lone);
        }
        self.forming = forming;
    }

    fn dispatch(&mut self, io: &mut Io<'_>, entries: Vec<Entry>, lone: bool) {
        self.requests_in_flight += entries.len();
        self.batches_in_flight += 1;
        let index = match self.free_batches.pop() {
            Some(i) => i,
            None => {
                self.batches.push(None);
                self.batches.len() - 1
            }
        };
        let handle = self.negotiated.handle.clone();
        let mut batch = Batch {
            entries,
            data: Vec::new(),
            staged: None,
            results: Vec::new(),
            pieces_left: 0,
            jobs_left: 0,
            state: BatchState::Running,
            lone,
            started: Instant::now(),
        };
        for (i, entry) in batch.entries.iter_mut().enumerate() {
            if !matches!(entry.outcome, Outcome::Pending) {
                continue;
            }
            let request = entry.request;
            match request.command {
                Command::Read | Command::Write => {
                    let aligned = request.offset % 4096 == 0 && request.length % 4096 == 0;
                    if aligned {
                        batch.data.push(i);
                        continue;
                    }
                    let Some(mut buf) = entry.payload.take() else {
                        entry.outcome = Outcome::failed(NbdError::Io, "request without buffer");
                        continue;
                    };
                    let handle = handle.clone();
                    let fua = request.flags.contains(CommandFlags::FUA);
                    batch.jobs_left += 1;
                    io.offload(move || {
                        let result = match request.command {
                            Command::Read => handle.read(request.offset, &mut buf),
                            _ => handle.write(request.offset, &buf, fua),
                        };
                        Box::new(Delivery::Unaligned {
                            batch: index,
                            entry: i,
                            buf,
                            result,
                        })
                    });
                }
                // Nothing to prefetch: reads are served from the device.
                Command::Cache => entry.outcome = Outcome::Done,
                _ => {
                    let handle = handle.clone();
                    let peer = self.peer;
                    batch.jobs_left += 1;
                    io.offload(move || {
                        let outcome = run_command(&handle, &request, peer);
                        Box::new(Delivery::Command {
                            batch: index,
                            entry: i,
                            outcome,
                        })
                    });
                }
            }
        }
        if !batch.data.is_empty() {
            batch.state = BatchState::Staging;
        }
        self.batches[index] = Some(batch);
        self.stage(io, index);
    }

    /// Stages the batch's reads and writes and submits their pieces (or
    /// asks for a retry when a map lock is contended).
    fn stage(&mut self, io: &mut Io<'_>, index: usize) {
        let Some(batch) = self.batches.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        if batch.state != BatchState::Staging {
            self.maybe_complete(index);
            return;
        }
        let mut ops = data_ops(&mut batch.entries, &batch.data);
        let staged = match self.volume.try_stage(&mut ops) {
            Err(Contended) => {
                drop(ops);
                if !self.retrying {
                    self.retrying = true;
                    io.retry_later();
                }
                return;
            }
            Ok(staged) => staged,
        };
        // Failures found while staging (range, gone, read-only).
        let failed: Vec<(usize, IoError)> = ops
            .iter_mut()
            .enumerate()
            .filter_map(|(k, op)| {
                std::mem::replace(&mut op.result, Ok(()))
                    .err()
                    .map(|e| (k, e))
            })
            .collect();
        batch.state = BatchState::Running;
        let Some(staged) = staged else {
            drop(ops);
            self.record_failures(index, failed);
            self.maybe_complete(index);
            return;
        };
        let pieces = staged.pieces().len();
        let lone_write = batch.lone
            && pieces == 1
            && staged.pieces()[0].write
            && io.loop_in_flight() == 0
            && batch.jobs_left == 0;
        match self.ring_fd {
            Some(fd) if !lone_write && pieces > 0 => {
                batch.results = (0..pieces).map(|_| Ok(())).collect();
                batch.pieces_left = pieces;
                for (k, piece) in staged.pieces().iter().enumerate() {
                    let len = piece.len as u32;
                    let entry = match &mut ops[piece.op].kind {
                        DataKind::Read(buf) => {
                            let ptr = buf[piece.start..].as_mut_ptr();
                            opcode::Read::new(types::Fd(fd), ptr, len)
                                .offset(piece.device_offset)
                                .build()
                        }
                        DataKind::Write(data) => {
                            let ptr = data[piece.start..].as_ptr();
                            let write = opcode::Write::new(types::Fd(fd), ptr, len)
                                .offset(piece.device_offset);
                            if piece.fua {
                                write.rw_flags(libc::RWF_DSYNC).build()
                            } else {
                                write.build()
                            }
                        }
                    };
                    let tag = ((index as u32) << PIECE_BITS) | k as u32;
                    // SAFETY: the buffer belongs to a request of this batch,
                    // which stays in `self.batches` (heap memory unmoved)
                    // until every piece has completed; the device's file
                    // lives as long as the store, which `volume` keeps.
                    unsafe { io.push(entry, tag) };
                }
                drop(ops);
                batch.staged = Some(staged);
                self.record_failures(index, failed);
            }
            _ => {
                // No ring for this device (memory, tmpfs), or a lone write:
                // run the pieces here.
                let results = staged.run(&mut ops);
                let commit = staged.finish(&mut ops, results);
                let finished: Vec<Result<(), IoError>> = ops
                    .iter_mut()
                    .map(|op| std::mem::replace(&mut op.result, Ok(())))
                    .collect();
                self.negotiated.handle.record(&ops, batch.started);
                drop(ops);
                self.record_failures(index, failed);
                self.apply_data_results(index, finished, commit, io);
            }
        }
    }

    fn record_failures(&mut self, index: usize, failed: Vec<(usize, IoError)>) {
        let Some(batch) = self.batches.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        for (k, err) in failed {
            if let Some(entry) = batch.data.get(k).and_then(|&i| batch.entries.get_mut(i)) {
                entry.outcome = crate::requests::failure(&err, &entry.request, self.peer);
            }
        }
    }

    /// A piece of a batch completed on the ring.
    fn piece_done(&mut self, io: &mut Io<'_>, index: usize, piece: usize, result: i32) {
        let Some(batch) = self.batches.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        let expected = batch
            .staged
            .as_ref()
            .and_then(|s| s.pieces().get(piece))
            .map_or(0, |p| p.len);
        let outcome = if result >= 0 && result as usize == expected {
            Ok(())
        } else if result < 0 && !matches!(-result, libc::EAGAIN | libc::EINTR) {
            Err(io::Error::from_raw_os_error(-result))
        } else {
            // Short, or to be retried: finish this piece synchronously.
            let mut ops = data_ops(&mut batch.entries, &batch.data);
            match &batch.staged {
                Some(staged) => staged.run_piece(&mut ops, piece),
                None => Err(io::Error::other("piece of an unstaged batch")),
            }
        };
        if let Some(slot) = batch.results.get_mut(piece) {
            *slot = outcome;
        }
        batch.pieces_left = batch.pieces_left.saturating_sub(1);
        if batch.pieces_left > 0 {
            return;
        }
        let Some(staged) = batch.staged.take() else {
            return;
        };
        let results = std::mem::take(&mut batch.results);
        let mut ops = data_ops(&mut batch.entries, &batch.data);
        for op in ops.iter_mut() {
            op.result = Ok(());
        }
        let commit = staged.finish(&mut ops, results);
        let finished: Vec<Result<(), IoError>> = ops
            .iter_mut()
            .map(|op| std::mem::replace(&mut op.result, Ok(())))
            .collect();
        self.negotiated.handle.record(&ops, batch.started);
        drop(ops);
        self.apply_data_results(index, finished, commit, io);
    }

    /// Turns the finished results of a batch's data ops into outcomes, and
    /// starts the commit its FUA writes need.
    fn apply_data_results(
        &mut self,
        index: usize,
        results: Vec<Result<(), IoError>>,
        commit: bool,
        io: &mut Io<'_>,
    ) {
        let structured = self.negotiated.structured;
        let peer = self.peer;
        let volume = &self.volume;
        let Some(batch) = self.batches.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        for (k, result) in results.into_iter().enumerate() {
            let Some(entry) = batch.data.get(k).and_then(|&i| batch.entries.get_mut(i)) else {
                continue;
            };
            if !matches!(entry.outcome, Outcome::Pending) {
                continue;
            }
            entry.outcome = data_outcome(structured, &entry.request, result, peer, |o, l| {
                volume.try_mapping(o, l).and_then(Result::ok)
            });
        }
        if commit {
            batch.state = BatchState::Committing;
            batch.jobs_left += 1;
            let volume = self.volume.clone();
            io.offload(move || {
                Box::new(Delivery::Commit {
                    batch: index,
                    result: volume.flush(),
                })
            });
        }
        self.maybe_complete(index);
    }

    fn on_delivery(&mut self, delivery: Delivery) {
        let (index, peer) = match &delivery {
            Delivery::Command { batch, .. }
            | Delivery::Unaligned { batch, .. }
            | Delivery::Commit { batch, .. } => (*batch, self.peer),
        };
        let Some(batch) = self.batches.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        batch.jobs_left = batch.jobs_left.saturating_sub(1);
        match delivery {
            Delivery::Command { entry, outcome, .. } => {
                if let Some(e) = batch.entries.get_mut(entry) {
                    e.outcome = outcome;
                }
            }
            Delivery::Unaligned {
                entry, buf, result, ..
            } => {
                if let Some(e) = batch.entries.get_mut(entry) {
                    e.payload = Some(buf);
                    e.outcome = match result {
                        Ok(()) => Outcome::Done,
                        Err(err) => crate::requests::failure(&err, &e.request, peer),
                    };
                }
            }
            Delivery::Commit { result, .. } => {
                batch.state = BatchState::Running;
                if let Err(err) = result {
                    // Same rule as the synchronous path: every FUA write of
                    // the batch fails with the commit.
                    let mut ops = data_ops(&mut batch.entries, &batch.data);
                    for op in ops.iter_mut() {
                        op.result = Ok(());
                    }
                    fail_fua_writes(&mut ops, &err);
                    let failed: Vec<bool> = ops.iter().map(|op| op.result.is_err()).collect();
                    drop(ops);
                    for (k, failed) in failed.into_iter().enumerate() {
                        if let Some(e) = batch.data.get(k).and_then(|&i| batch.entries.get_mut(i)) {
                            if failed {
                                e.outcome = crate::requests::failure(&err, &e.request, peer);
                            }
                        }
                    }
                }
            }
        }
        self.maybe_complete(index);
    }

    /// Replies to a batch once all its work is done.
    fn maybe_complete(&mut self, index: usize) {
        let done = self
            .batches
            .get(index)
            .and_then(Option::as_ref)
            .is_some_and(|b| {
                b.state == BatchState::Running
                    && b.pieces_left == 0
                    && b.jobs_left == 0
                    && b.staged.is_none()
            });
        if !done {
            return;
        }
        let Some(batch) = self.batches.get_mut(index).and_then(Option::take) else {
            return;
        };
        self.free_batches.push(index);
        self.batches_in_flight -= 1;
        self.requests_in_flight -= batch.entries.len();
        self.queue_replies(batch.entries);
    }

    /// After a round of callbacks: receive again if the connection stopped
    /// receiving only for lack of room (throttled) and now has some.
    /// Never called from inside `pump`, so completions that happen
    /// synchronously cannot recurse into receiving.
    fn resume(&mut self, io: &mut Io<'_>) {
        if self.reading && !self.dead && !self.poll_in && !self.throttled() {
            self.pump(io);
        }
    }

    // -------------------------------------------------------------- reply

    fn queue_replies(&mut self, entries: Vec<Entry>) {
        if self.dead {
            for e in entries {
                if let Some(buf) = e.payload {
                    self.pool.give(buf);
                }
            }
            return;
        }
        let mut encoded = std::mem::take(&mut self.scratch_encoded);
        let mut segments = std::mem::take(&mut self.scratch_segments);
        encoded.clear();
        segments.clear();
        encode_replies(&entries, &self.negotiated, &mut encoded, &mut segments);
        let mut buffers: Vec<Option<Arc<AlignedBuf>>> = entries
            .into_iter()
            .map(|e| e.payload.map(Arc::new))
            .collect();
        for segment in segments.drain(..) {
            match segment {
                Segment::Encoded(range) => {
                    if range.is_empty() {
                        continue;
                    }
                    self.queued_bytes += range.len();
                    self.outgoing.push_back(Outgoing::Encoded(range.len()));
                    self.encoded.extend(&encoded[range]);
                }
                Segment::Data(i, range) => {
                    if range.is_empty() {
                        continue;
                    }
                    if let Some(Some(buf)) = buffers.get(i) {
                        self.queued_bytes += range.len();
                        self.outgoing
                            .push_back(Outgoing::Data(Arc::clone(buf), range));
                    }
                }
            }
        }
        // Buffers no reply refers to (WRITE payloads) go back now.
        for buf in buffers.iter_mut().filter_map(Option::take) {
            if let Ok(buf) = Arc::try_unwrap(buf) {
                self.pool.give(buf);
            }
        }
        self.scratch_encoded = encoded;
        self.scratch_segments = segments;
    }

    /// Sends queued replies until the socket takes no more.
    fn send(&mut self, io: &mut Io<'_>) {
        while !self.outgoing.is_empty() && !self.dead {
            let sent = {
                let (first, second) = self.encoded.as_slices();
                let mut encoded_at = 0usize;
                let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(SEND_IOVECS);
                for (k, out) in self.outgoing.iter().enumerate() {
                    if slices.len() >= SEND_IOVECS {
                        break;
                    }
                    let skip = if k == 0 { self.front_sent } else { 0 };
                    match out {
                        Outgoing::Encoded(n) => {
                            let (a, b) = (encoded_at + skip, encoded_at + n);
                            encoded_at += n;
                            // The range may straddle the deque's two halves.
                            if a < first.len() {
                                slices.push(IoSlice::new(&first[a..b.min(first.len())]));
                            }
                            if b > first.len() {
                                let a2 = a.max(first.len()) - first.len();
                                slices.push(IoSlice::new(&second[a2..b - first.len()]));
                            }
                        }
                        Outgoing::Data(buf, range) => {
                            slices.push(IoSlice::new(&buf[range.start + skip..range.end]));
                        }
                    }
                }
                send_vectored(self.fd, &slices)
            };
            match sent {
                Ok(n) => self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.arm_poll_out(io);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.end_with(Err(e.into()), true);
                    return;
                }
            }
        }
    }

    /// Drops `n` sent bytes from the front of the queue.
    fn advance(&mut self, mut n: usize) {
        self.queued_bytes = self.queued_bytes.saturating_sub(n);
        while n > 0 {
            let Some(front) = self.outgoing.front() else {
                return;
            };
            let len = match front {
                Outgoing::Encoded(len) => *len,
                Outgoing::Data(_, range) => range.len(),
            };
            let left = len - self.front_sent;
            if n < left {
                self.front_sent += n;
                if matches!(front, Outgoing::Encoded(_)) {
                    self.encoded.drain(..n);
                    if let Some(Outgoing::Encoded(len)) = self.outgoing.front_mut() {
                        *len -= n;
                    }
                    self.front_sent = 0;
                }
                return;
            }
            n -= left;
            self.front_sent = 0;
            match self.outgoing.pop_front() {
                Some(Outgoing::Encoded(_)) => {
                    self.encoded.drain(..left);
                }
                Some(Outgoing::Data(buf, _)) => {
                    if let Ok(buf) = Arc::try_unwrap(buf) {
                        self.pool.give(buf);
                    }
                }
                None => {}
            }
        }
    }
}

/// The data ops of a batch over its entries' buffers, in `data` order.
fn data_ops<'a>(entries: &'a mut [Entry], data: &[usize]) -> Vec<DataOp<'a>> {
    let mut ops = Vec::with_capacity(data.len());
    let mut wanted = data.iter().peekable();
    for (i, entry) in entries.iter_mut().enumerate() {
        if wanted.next_if(|&&w| w == i).is_none() {
            continue;
        }
        let request = entry.request;
        let Some(buf) = entry.payload.as_mut() else {
            continue;
        };
        ops.push(match request.command {
            Command::Read => DataOp::read(request.offset, &mut buf[..]),
            _ => DataOp::write(
                request.offset,
                &buf[..],
                request.flags.contains(CommandFlags::FUA),
            ),
        });
    }
    ops
}

/// One non-blocking `sendmsg` of `slices`.
fn send_vectored(fd: RawFd, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid; the iovecs point into live slices
    // (IoSlice is ABI-compatible with iovec) for the duration of the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = slices.as_ptr().cast_mut().cast();
    msg.msg_iovlen = slices.len() as _;
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
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
    }

    fn completed(&mut self, io: &mut Io<'_>, tag: u32, result: i32) {
        match tag {
            TAG_POLL_IN => {
                self.poll_in = false;
                if result < 0 && !self.dead {
                    self.end_with(Err(io::Error::from_raw_os_error(-result).into()), true);
                    return;
                }
                self.pump(io);
            }
            TAG_POLL_OUT => {
                self.poll_out = false;
                self.send(io);
            }
            _ => {
                let index = (tag >> PIECE_BITS) as usize;
                let piece = (tag & ((1 << PIECE_BITS) - 1)) as usize;
                self.piece_done(io, index, piece, result);
            }
        }
    }

    fn delivered(&mut self, _io: &mut Io<'_>, payload: Payload) {
        match payload.downcast::<Delivery>() {
            Ok(delivery) => self.on_delivery(*delivery),
            Err(_) => {
                // A job panicked: its request cannot be answered correctly.
                tracing::error!(peer = %self.peer, "NBD request job failed; closing the connection");
                self.end_with(
                    Err(ConnectionError::Io(io::Error::other("request job failed"))),
                    true,
                );
            }
        }
    }

    fn retry(&mut self, io: &mut Io<'_>) {
        self.retrying = false;
        let waiting: Vec<usize> = self
            .batches
            .iter()
            .enumerate()
            .filter(|(_, b)| b.as_ref().is_some_and(|b| b.state == BatchState::Staging))
            .map(|(i, _)| i)
            .collect();
        for index in waiting {
            self.stage(io, index);
        }
    }

    fn stop(&mut self, _io: &mut Io<'_>) {
        self.end_with(Ok(SessionEnd::ClientClosed), true);
    }

    fn finished(&self) -> bool {
        let drained = self.dead || self.outgoing.is_empty();
        !self.reading
            && self.batches_in_flight == 0
            && self.forming.is_empty()
            && drained
            && !self.poll_in
            && !self.poll_out
    }
}

impl Drop for EventedConnection {
    fn drop(&mut self) {
        if let Some(on_end) = self.on_end.take() {
            on_end(self.end.take().unwrap_or(Ok(SessionEnd::ClientClosed)));
        }
    }
}
