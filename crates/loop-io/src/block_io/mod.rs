//! The block I/O of one connection's requests on its event loop, for any
//! frontend and any volume: each request gets a slot. On a volume of this
//! node's store, an aligned read or write is staged
//! against the volume's maps (`LocalVolume::try_stage`: lookups,
//! allocation, checksums) and its device pieces go to the loop's ring,
//! straight into and out of the request's buffer; anything that may block
//! — a frontend's commands (flush, trim, …), unaligned requests, writes
//! that need a commit first (a thin extent to allocate, a cold extent to
//! mark hot), the commit a FUA write may need — runs on the reactor's
//! offload pool and comes back as a message. A request finishes as soon as
//! its own pieces, jobs and commit are done, not when others started with
//! it are, and the frontend takes it from [`BlockIo::pop_finished`].
//!
//! On a replicated volume, the aligned reads and writes a round started
//! leave together as one batch to the volume's primary
//! (`VolumeHandle::start`, sent by [`BlockIo::submit_started`]), and come
//! back through the loop's mailbox, delivered by the thread that brought
//! the batch's last reply: one hand-over per batch, no thread waiting.
//! Unaligned requests and commands run on the pool as for a local volume.
//!
//! A request the frontend marks *lone* (the only one of its connection in
//! flight: a queue-depth-1 client) runs even blocking work inline when
//! nothing else is in flight on the loop: nobody waits for the loop
//! meanwhile, and two thread hand-offs to the pool would cost more than it
//! blocks. A lone single-piece write is written synchronously for the same
//! reason: on a file, the filesystem completes an asynchronous O_DIRECT
//! write on a kernel worker thread, one more wake-up than a synchronous
//! write.
//!
//! Invariants:
//! - A slot is freed only when nothing of its request is in flight: no
//!   piece on the ring (the kernel reads or writes its buffer), no job on
//!   the pool, no commit pending.
//! - A contended map lock is never waited for on the loop: the request
//!   stays `Staging` and is retried (`Io::retry_later`); after
//!   [`CONTENDED_TRIES`] tries it runs on the pool, which waits for the lock
//!   in its queue (a layer operation that takes the lock extent after
//!   extent, handing it over fairly, would otherwise keep a request that
//!   only ever tries it out for the whole operation: a snapshot deletion
//!   held a write back 2 s).
//! - A read of a packed (compressed) extent, or a write to one, runs on the
//!   pool: decompressing and unpacking are not done on the loop.
//! - A write that needs a commit before its data (checked when started,
//!   and again when staged after a contended lock) runs on the pool. (An
//!   extent cooled by the store's background thread between that check and
//!   staging still commits on the loop: a window of microseconds, once per
//!   cooling.)
//! - A FUA write is reported only after the commit it needs; if that
//!   commit fails, so does the write.
//! - Ring tags of this module are below [`FRONTEND_TAGS`]: slot number
//!   above [`PIECE_BITS`], piece below. At most [`MAX_SLOTS`] requests are
//!   in flight; more wait, in order, for a free slot.
//! - A read or write of a volume with QoS limits starts only once the
//!   volume's throttle admits it; until then it waits, in arrival order,
//!   behind a timer on the loop's ring (at most [`THROTTLE_TICK`] long, so a
//!   stopping connection never waits long for it), never blocking the loop.
//! - Nothing is allocated per request in steady state: slots are reused
//!   with their piece-result vectors, payloads are the frontend's pooled
//!   buffers. (Staging still allocates its piece list and checksum vectors
//!   in the store: three small vectors per request, left for later.)

mod remote;

use crate::gate::{EarlyReply, ReplyGate};
use crate::replies::ReplyQueue;
use basalt_reactor::{Io, JobPanicked, Payload};
use basalt_store::{
    fail_fua_writes, AlignedBuf, Contended, DataKind, DataOp, LocalVolume, StagedBatch,
};
use basalt_volume::qos::Direction;
use basalt_volume::{IoError, OwnedOp, VolumeHandle};
use io_uring::{opcode, types};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bits of a ring tag that number the piece within its request.
pub const PIECE_BITS: u32 = 20;
/// Requests in flight at once per connection at most.
pub const MAX_SLOTS: usize = 1024;
/// Ring tags from here up are the frontend's own (its socket polls).
pub const FRONTEND_TAGS: u32 = (MAX_SLOTS as u32) << PIECE_BITS;
/// The tag of the QoS timer (the last piece number of the last slot, which
/// no request reaches: a request has at most 8192 pieces).
const TIMER_TAG: u32 = FRONTEND_TAGS - 1;
/// Longest a QoS timer waits before the throttle is asked again.
pub const THROTTLE_TICK: Duration = Duration::from_millis(50);

const BLOCK: u64 = 4096;

/// Tries of a request whose map lock is contended before it runs on the
/// offload pool (about 2 ms of retries).
const CONTENDED_TRIES: u32 = 10;

/// A frontend command run on the offload pool (or inline for a lone
/// request): a flush, a trim, a block-status query.
pub type Command<C> = Box<dyn FnOnce(&VolumeHandle) -> C + Send>;

/// What a request asks of the volume.
pub enum Work<C> {
    Read {
        offset: u64,
        buf: AlignedBuf,
    },
    Write {
        offset: u64,
        buf: AlignedBuf,
        fua: bool,
        /// Its reply if it succeeds, which a replicated volume's write may
        /// send from the thread that completes it ([`BlockIo::set_reply_gate`]).
        early: Option<EarlyReply>,
    },
    Command(Command<C>),
}

/// How a request ended.
#[derive(Debug)]
pub enum Outcome<C> {
    /// A read's or write's result (a failed FUA commit fails the write).
    Data(Result<(), IoError>),
    /// A command's result, or the panic of its job (logged).
    Command(Result<C, JobPanicked>),
}

/// A finished request, handed back to the frontend with its buffer.
pub struct Finished<T, C> {
    pub token: T,
    pub buf: Option<AlignedBuf>,
    pub outcome: Outcome<C>,
    /// Its early reply was sent already: the frontend sends none.
    pub replied: bool,
}

/// Why a request is not finished yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its map lock was contended: to be staged again.
    Staging,
    /// Pieces on the ring and/or a job on the pool.
    Running,
    /// Waiting for the commit a FUA write needs.
    Committing,
}

/// A read or write: where, which way, and its buffer (away while a job
/// runs it on the pool).
struct DataRequest {
    offset: u64,
    write: bool,
    fua: bool,
    buf: Option<AlignedBuf>,
    early: Option<EarlyReply>,
}

impl DataRequest {
    fn op(&mut self) -> Option<DataOp<'_>> {
        let buf = self.buf.as_mut()?;
        Some(if self.write {
            DataOp::write(self.offset, &buf[..], self.fua)
        } else {
            DataOp::read(self.offset, &mut buf[..])
        })
    }

    fn aligned(&self) -> bool {
        let len = self.buf.as_ref().map_or(0, |b| b.len() as u64);
        self.offset.is_multiple_of(BLOCK) && len.is_multiple_of(BLOCK)
    }
}

/// A request in flight, in its slot.
struct Slot<T, C> {
    token: T,
    data: Option<DataRequest>,
    staged: Option<StagedBatch>,
    /// One outcome per piece of `staged` (kept, emptied, with the slot).
    results: Vec<io::Result<()>>,
    pieces_left: usize,
    jobs_left: usize,
    state: State,
    lone: bool,
    /// Staging found its map lock contended at least once.
    contended: bool,
    /// Tries that found it contended.
    contended_tries: u32,
    started: Instant,
    outcome: Option<Outcome<C>>,
    /// Its early reply was sent.
    replied: bool,
}

/// What an offloaded job sends back, for the request in slot `slot`.
enum Delivery<C> {
    Command {
        slot: usize,
        result: Result<C, JobPanicked>,
    },
    /// A read or write run on the pool: unaligned (read-modify-write in
    /// the store), or a write that needs a commit first.
    Blocking {
        slot: usize,
        buf: AlignedBuf,
        result: Result<(), IoError>,
    },
    Commit {
        slot: usize,
        result: Result<(), IoError>,
    },
    /// A replicated volume's batch was handed to its primary from the pool
    /// (its completion comes as `Remote`).
    Started,
    /// A replicated volume's batch: each slot's op back with its outcome
    /// (`ops` empty if the batch was lost), and whether its early reply
    /// was sent.
    Remote {
        slots: Vec<usize>,
        ops: Vec<OwnedOp>,
        replied: Vec<bool>,
    },
}

/// The block I/O of one connection.
pub struct BlockIo<T, C> {
    handle: VolumeHandle,
    /// The volume on this node's store; `None`: a replicated volume.
    volume: Option<LocalVolume>,
    ring_fd: Option<RawFd>,
    slots: Vec<Option<Slot<T, C>>>,
    free_slots: Vec<usize>,
    in_flight: usize,
    /// Requests waiting for QoS admission, in arrival order, and since when.
    throttled: VecDeque<(T, Work<C>, bool, Instant)>,
    /// The QoS timer on the ring: its timespec (read by the kernel until
    /// the timer completes).
    timer: Option<Box<types::Timespec>>,
    /// Requests waiting for a free slot, in arrival order.
    waiting: VecDeque<(T, Work<C>, bool)>,
    spare_results: Vec<Vec<io::Result<()>>>,
    retrying: bool,
    finished: VecDeque<Finished<T, C>>,
    /// Slots of a replicated volume's reads and writes started in this
    /// round, to leave as one batch ([`BlockIo::submit_started`]).
    remote: Vec<usize>,
    /// The connection's socket, for writes' early replies.
    gate: Option<Arc<ReplyGate>>,
}

impl<T: Send + 'static, C: Send + 'static> BlockIo<T, C> {
    /// The block I/O of a connection to `handle`'s volume.
    pub fn new(handle: VolumeHandle) -> BlockIo<T, C> {
        let volume = handle.local().cloned();
        BlockIo {
            ring_fd: volume.as_ref().and_then(LocalVolume::ring_fd),
            volume,
            handle,
            slots: Vec::new(),
            free_slots: Vec::new(),
            in_flight: 0,
            throttled: VecDeque::new(),
            timer: None,
            waiting: VecDeque::new(),
            spare_results: Vec::new(),
            retrying: false,
            finished: VecDeque::new(),
            remote: Vec::new(),
            gate: None,
        }
    }

    /// The reply queue of the connection on socket `fd`. A replicated
    /// volume's writes are answered by the thread that brings their last
    /// acknowledgement, when the socket is free: its queue is gated, and
    /// the writes' early replies ([`Work::Write`]) go through that gate.
    pub fn reply_queue(&mut self, fd: RawFd) -> ReplyQueue {
        if self.volume.is_some() {
            return ReplyQueue::default();
        }
        let gate = ReplyGate::new(fd);
        self.gate = Some(Arc::clone(&gate));
        ReplyQueue::gated(gate)
    }

    /// The volume on this node's store (`None`: a replicated volume).
    pub fn volume(&self) -> Option<&LocalVolume> {
        self.volume.as_ref()
    }

    pub fn handle(&self) -> &VolumeHandle {
        &self.handle
    }

    /// Requests started and not yet finished (waiting ones included), plus
    /// one for an armed QoS timer (the ring still refers to it).
    pub fn in_flight(&self) -> usize {
        self.in_flight
            + self.waiting.len()
            + self.throttled.len()
            + usize::from(self.timer.is_some())
    }

    /// The next finished request, if any. A frontend takes them after each
    /// call into this module.
    pub fn pop_finished(&mut self) -> Option<Finished<T, C>> {
        self.finished.pop_front()
    }

    /// Starts a request; `lone` when it is its connection's only request
    /// in flight (a queue-depth-1 client).
    pub fn start(&mut self, io: &mut Io<'_>, token: T, work: Work<C>, lone: bool) {
        if self.handle.throttle().is_limited() || !self.throttled.is_empty() {
            self.throttled
                .push_back((token, work, lone, Instant::now()));
            self.admit_throttled(io);
            return;
        }
        self.waiting.push_back((token, work, lone));
        self.start_waiting(io);
    }

    /// Starts the throttled requests the volume's QoS admits now, in
    /// order; arms the timer for the first one it does not.
    fn admit_throttled(&mut self, io: &mut Io<'_>) {
        let now = Instant::now();
        while let Some((_, work, _, since)) = self.throttled.front() {
            let cost = match work {
                Work::Read { buf, .. } => Some((Direction::Read, buf.len() as u64)),
                Work::Write { buf, .. } => Some((Direction::Write, buf.len() as u64)),
                Work::Command(_) => None,
            };
            let since = *since;
            if let Some((direction, bytes)) = cost {
                if let Some(wait) = self.handle.throttle().admit(now, direction, bytes) {
                    self.arm_timer(io, wait);
                    return;
                }
            }
            let waited = now.saturating_duration_since(since);
            if waited > Duration::from_micros(10) {
                self.handle.throttle().record_wait(waited);
            }
            if let Some((token, work, lone, _)) = self.throttled.pop_front() {
                self.waiting.push_back((token, work, lone));
            }
        }
        self.start_waiting(io);
    }

    /// Gives up on the requests still waiting for QoS admission (the
    /// connection is stopping): reads and writes finish failed, without
    /// running; commands run now.
    pub fn cancel_throttled(&mut self, io: &mut Io<'_>) {
        while let Some((token, work, lone, _)) = self.throttled.pop_front() {
            match work {
                Work::Read { buf, .. } | Work::Write { buf, .. } => {
                    self.finished.push_back(Finished {
                        token,
                        buf: Some(buf),
                        outcome: Outcome::Data(Err(IoError::Failed)),
                        replied: false,
                    });
                }
                command => self.waiting.push_back((token, command, lone)),
            }
        }
        self.start_waiting(io);
    }

    fn arm_timer(&mut self, io: &mut Io<'_>, wait: Duration) {
        if self.timer.is_some() {
            return;
        }
        let timespec = Box::new(types::Timespec::from(wait.min(THROTTLE_TICK)));
        let entry = opcode::Timeout::new(&*timespec as *const types::Timespec).build();
        // SAFETY: the timespec is boxed (its address stable) and kept in
        // `self.timer` until the timeout completes (`completed`); the
        // connection that owns this is not dropped while `in_flight()`
        // counts the timer.
        unsafe { io.push_wait(entry, TIMER_TAG) };
        self.timer = Some(timespec);
    }

    /// Starts requests that wait for a slot, in order, while slots are
    /// free.
    fn start_waiting(&mut self, io: &mut Io<'_>) {
        while !self.waiting.is_empty() {
            let Some(slot) = self.free_slots.pop().or_else(|| {
                (self.slots.len() < MAX_SLOTS).then(|| {
                    self.slots.push(None);
                    self.slots.len() - 1
                })
            }) else {
                return;
            };
            let Some((token, work, lone)) = self.waiting.pop_front() else {
                self.free_slots.push(slot);
                return;
            };
            self.start_in(io, slot, token, work, lone);
        }
    }

    fn start_in(&mut self, io: &mut Io<'_>, slot: usize, token: T, work: Work<C>, lone: bool) {
        self.in_flight += 1;
        let mut results = self.spare_results.pop().unwrap_or_default();
        results.clear();
        let inline = lone && io.loop_in_flight() == 0;
        let mut req = Slot {
            token,
            data: None,
            staged: None,
            results,
            pieces_left: 0,
            jobs_left: 0,
            state: State::Running,
            lone,
            contended: false,
            contended_tries: 0,
            started: Instant::now(),
            outcome: None,
            replied: false,
        };
        match work {
            Work::Command(job) if inline => {
                let result = guarded(|| job(&self.handle));
                req.outcome = Some(Outcome::Command(result));
            }
            Work::Command(job) => {
                let handle = self.handle.clone();
                req.jobs_left += 1;
                io.offload(move || {
                    let result = guarded(|| job(&handle));
                    Box::new(Delivery::<C>::Command { slot, result })
                });
            }
            Work::Read { offset, buf } => {
                req.data = Some(DataRequest {
                    offset,
                    write: false,
                    fua: false,
                    buf: Some(buf),
                    early: None,
                });
            }
            Work::Write {
                offset,
                buf,
                fua,
                early,
            } => {
                req.data = Some(DataRequest {
                    offset,
                    write: true,
                    fua,
                    buf: Some(buf),
                    early,
                });
            }
        }
        if let Some(data) = req.data.as_mut() {
            let len = data.buf.as_ref().map_or(0, |b| b.len() as u64);
            // A write that needs metadata made durable first (a thin
            // extent to allocate, a cold extent to mark hot: a commit)
            // would stall the loop: it runs like blocking work.
            let blocking = !data.aligned()
                || (data.write
                    && self
                        .volume
                        .as_ref()
                        .is_some_and(|v| v.write_needs_commit(data.offset, len)));
            if !blocking && self.volume.is_none() {
                // A replicated volume's: leaves with this round's batch.
                req.jobs_left += 1;
                self.remote.push(slot);
            } else if !blocking {
                req.state = State::Staging;
            } else if inline {
                let result = blocking_io(&self.handle, data);
                req.outcome = Some(Outcome::Data(result));
            } else {
                self.offload_blocking(io, slot, &mut req);
            }
        }
        self.slots[slot] = Some(req);
        self.stage(io, slot);
    }

    /// Runs a read or write through the volume's synchronous data path on
    /// the pool.
    fn offload_blocking(&self, io: &mut Io<'_>, slot: usize, req: &mut Slot<T, C>) {
        let Some(data) = req.data.as_mut() else {
            return;
        };
        let Some(mut buf) = data.buf.take() else {
            return;
        };
        let (offset, write, fua) = (data.offset, data.write, data.fua);
        let handle = self.handle.clone();
        req.state = State::Running;
        req.jobs_left += 1;
        io.offload(move || {
            let result = guarded(|| {
                if write {
                    handle.write(offset, &buf, fua)
                } else {
                    handle.read(offset, &mut buf)
                }
            })
            .unwrap_or(Err(IoError::Failed));
            Box::new(Delivery::<C>::Blocking { slot, buf, result })
        });
    }

    /// Stages the request's read or write and submits its pieces (or asks
    /// for a retry when a map lock is contended).
    fn stage(&mut self, io: &mut Io<'_>, slot: usize) {
        let Some(mut req) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if req.state == State::Staging {
            self.stage_slot(io, slot, &mut req);
        }
        self.slots[slot] = Some(req);
        self.maybe_finish(slot);
    }

    fn stage_slot(&mut self, io: &mut Io<'_>, slot: usize, req: &mut Slot<T, C>) {
        let (Some(data), Some(volume)) = (req.data.as_mut(), self.volume.as_ref()) else {
            req.state = State::Running;
            return;
        };
        let len = data.buf.as_ref().map_or(0, |b| b.len() as u64);
        if req.contended && data.write && volume.write_needs_commit(data.offset, len) {
            // It needs a commit now (its extent cooled, or was freed, while
            // it waited for a contended lock): not on the loop.
            self.offload_blocking(io, slot, req);
            return;
        }
        let Some(mut op) = data.op() else {
            req.state = State::Running;
            return;
        };
        let staged = match volume.try_stage(std::slice::from_mut(&mut op)) {
            Err(Contended) if req.contended_tries + 1 >= CONTENDED_TRIES => {
                self.offload_blocking(io, slot, req);
                return;
            }
            Err(Contended) => {
                req.contended = true;
                req.contended_tries += 1;
                if !self.retrying {
                    self.retrying = true;
                    io.retry_later();
                }
                return;
            }
            Ok(staged) => staged,
        };
        req.state = State::Running;
        // A failure found while staging (range, gone, read-only).
        let early = std::mem::replace(&mut op.result, Ok(()));
        let staged = match (staged, early) {
            (None, result) => {
                req.outcome = Some(Outcome::Data(result));
                return;
            }
            (Some(staged), Err(err)) => {
                // Nothing was submitted: dropping the staged batch is safe.
                drop(staged);
                req.outcome = Some(Outcome::Data(Err(err)));
                return;
            }
            (Some(staged), Ok(())) => staged,
        };
        if staged.has_packed() || staged.needs_unpack() {
            // A packed extent to decompress or unpack: not on the loop.
            // Nothing was submitted, so the batch may be dropped.
            drop(staged);
            drop(op);
            self.offload_blocking(io, slot, req);
            return;
        }
        let pieces = staged.pieces().len();
        let lone_write = req.lone
            && pieces == 1
            && staged.pieces()[0].write
            && io.loop_in_flight() == 0
            && req.jobs_left == 0;
        match self.ring_fd {
            Some(fd) if !lone_write && pieces > 0 => {
                req.results.resize_with(pieces, || Ok(()));
                req.pieces_left = pieces;
                for (k, piece) in staged.pieces().iter().enumerate() {
                    let len = piece.len as u32;
                    let entry = match &mut op.kind {
                        DataKind::Read(buf) => {
                            let ptr = buf[piece.start..].as_mut_ptr();
                            opcode::Read::new(types::Fd(fd), ptr, len)
                                .offset(piece.device_offset)
                                .build()
                        }
                        DataKind::Write(data) => {
                            let ptr = staged.write_data(k, data).as_ptr();
                            let write = opcode::Write::new(types::Fd(fd), ptr, len)
                                .offset(piece.device_offset);
                            if piece.fua {
                                write.rw_flags(libc::RWF_DSYNC).build()
                            } else {
                                write.build()
                            }
                        }
                    };
                    let tag = ((slot as u32) << PIECE_BITS) | k as u32;
                    // SAFETY: the buffer is the request's (or, encrypted,
                    // the staged batch's), which stays in its slot (heap
                    // memory unmoved) until every piece has completed; the device's file lives as long as the
                    // store, which `volume` keeps.
                    unsafe { io.push(entry, tag) };
                }
                drop(op);
                req.staged = Some(staged);
            }
            _ => {
                // No ring for this device (memory, tmpfs), or a lone write:
                // run the pieces here.
                let ops = std::slice::from_mut(&mut op);
                let results = staged.run(ops);
                let commit = staged.finish(ops, results);
                self.handle.record(ops, req.started);
                let result = std::mem::replace(&mut op.result, Ok(()));
                drop(op);
                self.settle(io, slot, req, result, commit);
            }
        }
    }

    /// A ring entry of this module completed (`tag < FRONTEND_TAGS`).
    pub fn completed(&mut self, io: &mut Io<'_>, tag: u32, result: i32) {
        if tag == TIMER_TAG {
            self.timer = None;
            self.admit_throttled(io);
            return;
        }
        let slot = (tag >> PIECE_BITS) as usize;
        let piece = (tag & ((1 << PIECE_BITS) - 1)) as usize;
        let Some(mut req) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.piece_done(io, slot, &mut req, piece, result);
        self.slots[slot] = Some(req);
        self.maybe_finish(slot);
        self.start_waiting(io);
    }

    fn piece_done(
        &mut self,
        io: &mut Io<'_>,
        slot: usize,
        req: &mut Slot<T, C>,
        piece: usize,
        result: i32,
    ) {
        let expected = req
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
            match (&req.staged, req.data.as_mut().and_then(DataRequest::op)) {
                (Some(staged), Some(mut op)) => {
                    staged.run_piece(std::slice::from_mut(&mut op), piece)
                }
                _ => Err(io::Error::other("piece of an unstaged request")),
            }
        };
        if let Some(r) = req.results.get_mut(piece) {
            *r = outcome;
        }
        req.pieces_left = req.pieces_left.saturating_sub(1);
        if req.pieces_left > 0 {
            return;
        }
        let Some(staged) = req.staged.take() else {
            return;
        };
        let Some(mut op) = req.data.as_mut().and_then(DataRequest::op) else {
            return;
        };
        let ops = std::slice::from_mut(&mut op);
        let commit = staged.finish(ops, req.results.drain(..));
        self.handle.record(ops, req.started);
        let result = std::mem::replace(&mut op.result, Ok(()));
        drop(op);
        self.settle(io, slot, req, result, commit);
    }

    /// Records a finished read's or write's result, and starts the commit
    /// a FUA write needs.
    fn settle(
        &self,
        io: &mut Io<'_>,
        slot: usize,
        req: &mut Slot<T, C>,
        result: Result<(), IoError>,
        commit: bool,
    ) {
        req.outcome = Some(Outcome::Data(result));
        if commit {
            req.state = State::Committing;
            req.jobs_left += 1;
            // The store's commit, not a client FLUSH (not counted as one).
            let volume = self.volume.clone();
            io.offload(move || {
                let result = guarded(|| volume.as_ref().map_or(Ok(()), LocalVolume::flush))
                    .unwrap_or(Err(IoError::Failed));
                Box::new(Delivery::<C>::Commit { slot, result })
            });
        }
    }

    /// An offloaded job's result; the payload back if it is not one of
    /// this module's (the frontend's own message).
    pub fn delivered(&mut self, io: &mut Io<'_>, payload: Payload) -> Option<Payload> {
        let delivery = match payload.downcast::<Delivery<C>>() {
            Ok(delivery) => *delivery,
            Err(other) => return Some(other),
        };
        let slot = match &delivery {
            Delivery::Command { slot, .. }
            | Delivery::Blocking { slot, .. }
            | Delivery::Commit { slot, .. } => *slot,
            Delivery::Started => return None,
            Delivery::Remote { .. } => {
                if let Delivery::Remote {
                    slots,
                    ops,
                    replied,
                } = delivery
                {
                    self.remote_done(slots, ops, replied);
                }
                self.start_waiting(io);
                return None;
            }
        };
        // (A delivery for a free slot is stale: consumed.)
        let req = self.slots.get_mut(slot).and_then(Option::as_mut)?;
        req.jobs_left = req.jobs_left.saturating_sub(1);
        match delivery {
            Delivery::Command { result, .. } => req.outcome = Some(Outcome::Command(result)),
            Delivery::Blocking { buf, result, .. } => {
                if let Some(data) = req.data.as_mut() {
                    data.buf = Some(buf);
                }
                req.outcome = Some(Outcome::Data(result));
            }
            Delivery::Remote { .. } | Delivery::Started => {}
            Delivery::Commit { result, .. } => {
                req.state = State::Running;
                if let Err(err) = result {
                    // Same rule as the synchronous path: a FUA write fails
                    // with the commit it needed.
                    if let Some(mut op) = req.data.as_mut().and_then(DataRequest::op) {
                        fail_fua_writes(std::slice::from_mut(&mut op), &err);
                        if let Err(failed) = std::mem::replace(&mut op.result, Ok(())) {
                            drop(op);
                            req.outcome = Some(Outcome::Data(Err(failed)));
                        }
                    }
                }
            }
        }
        self.maybe_finish(slot);
        self.start_waiting(io);
        None
    }

    /// The loop's retry tick: stages again every request whose map lock
    /// was contended.
    pub fn retry(&mut self, io: &mut Io<'_>) {
        self.retrying = false;
        for slot in 0..self.slots.len() {
            if self.slots[slot]
                .as_ref()
                .is_some_and(|r| r.state == State::Staging)
            {
                self.stage(io, slot);
            }
        }
        self.start_waiting(io);
    }

    /// Frees the slot of a request whose work is all done and hands the
    /// request to the frontend.
    fn maybe_finish(&mut self, slot: usize) {
        let done = self
            .slots
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|r| {
                r.state == State::Running
                    && r.pieces_left == 0
                    && r.jobs_left == 0
                    && r.staged.is_none()
                    && r.outcome.is_some()
            });
        if !done {
            return;
        }
        let Some(req) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free_slots.push(slot);
        self.in_flight -= 1;
        self.spare_results.push(req.results);
        self.finished.push_back(Finished {
            token: req.token,
            buf: req.data.and_then(|d| d.buf),
            outcome: req.outcome.unwrap_or(Outcome::Data(Err(IoError::Failed))),
            replied: req.replied,
        });
    }
}

/// Runs a read or write through the volume's synchronous data path (an
/// unaligned one is a read-modify-write in the store).
fn blocking_io(handle: &VolumeHandle, data: &mut DataRequest) -> Result<(), IoError> {
    let Some(buf) = data.buf.as_mut() else {
        return Err(IoError::Failed);
    };
    if data.write {
        handle.write(data.offset, buf, data.fua)
    } else {
        handle.read(data.offset, buf)
    }
}

/// Runs a job, turning a panic into [`JobPanicked`] (logged), so that its
/// request is still answered (with an error) and its slot freed.
fn guarded<R>(job: impl FnOnce() -> R) -> Result<R, JobPanicked> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).map_err(|_| {
        tracing::error!("a request's job panicked; answering it with an error");
        JobPanicked
    })
}
