//! Executing an evented connection's requests, each on its own: a READ or
//! WRITE is staged against the volume's maps and its device pieces go to
//! the loop's ring; commands and anything that may block (unaligned
//! requests, writes that need a commit first: thin allocation, an extent
//! to mark hot) run on the reactor's offload pool (or inline, for a lone
//! request on an idle loop).
//! A request is answered as soon as its own pieces, jobs and commit are
//! done — not when others received with it are — so a client's requests
//! flow the way the disk completes them instead of in convoys.
//!
//! Invariants:
//! - A request leaves `requests` only when nothing of it is in flight: no
//!   piece on the ring (the kernel reads or writes its buffer), no job on
//!   the pool, no commit pending.
//! - A contended map lock is never waited for on the loop: the request
//!   stays `Staging` and is retried (`Io::retry_later`).
//! - A write that needs a commit before its data (checked when dispatched,
//!   and again when staged after a contended lock) runs on the pool. (An extent cooled by the
//!   store's background thread between that check and staging still
//!   commits on the loop: a window of microseconds, once per cooling.)
//! - This module allocates nothing per request in steady state: slots are
//!   reused with their piece-result vectors, payload buffers come from the
//!   pool. (Staging still allocates its piece list and checksum vectors in
//!   the store: three small vectors per request, left for later.)

use super::EventedConnection;
use crate::requests::{data_outcome, failure, run_command, Entry, Outcome};
use basalt_nbd_wire::{Command, CommandFlags, NbdError};
use basalt_reactor::Io;
use basalt_store::{fail_fua_writes, AlignedBuf, Contended, DataKind, DataOp, StagedBatch};
use basalt_volume::IoError;
use io_uring::{opcode, types};
use std::io;
use std::time::Instant;

/// Bits of a ring tag that number the piece within its request.
pub(super) const PIECE_BITS: u32 = 20;

/// Why a request is not finished yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Its map lock was contended: to be staged again.
    Staging,
    /// Pieces on the ring and/or a job on the pool.
    Running,
    /// Waiting for the commit a FUA write needs.
    Committing,
}

/// A request in flight, in its slot of `EventedConnection::requests`.
pub(super) struct InFlight {
    entry: Entry,
    staged: Option<StagedBatch>,
    /// One outcome per piece of `staged` (kept, emptied, with the slot).
    results: Vec<io::Result<()>>,
    pieces_left: usize,
    jobs_left: usize,
    pub(super) state: State,
    /// The only request of its connection in flight when dispatched.
    lone: bool,
    /// Staging found its map lock contended at least once.
    contended: bool,
    started: Instant,
}

/// What an offloaded job sends back, for the request in slot `slot`.
pub(super) enum Delivery {
    Command {
        slot: usize,
        outcome: Outcome,
    },
    /// A READ or WRITE run on the pool: unaligned (read-modify-write), or
    /// a write that needs a commit first.
    Blocking {
        slot: usize,
        buf: AlignedBuf,
        result: Result<(), IoError>,
    },
    Commit {
        slot: usize,
        result: Result<(), IoError>,
    },
}

/// The request's data op over its buffer (`None` for other commands).
fn data_op(entry: &mut Entry) -> Option<DataOp<'_>> {
    let request = entry.request;
    let buf = entry.payload.as_mut()?;
    match request.command {
        Command::Read => Some(DataOp::read(request.offset, &mut buf[..])),
        Command::Write => Some(DataOp::write(
            request.offset,
            &buf[..],
            request.flags.contains(CommandFlags::FUA),
        )),
        _ => None,
    }
}

fn is_aligned_data(entry: &Entry) -> bool {
    let r = &entry.request;
    matches!(r.command, Command::Read | Command::Write)
        && r.offset.is_multiple_of(4096)
        && r.length.is_multiple_of(4096)
        && entry.payload.is_some()
}

impl EventedConnection {
    /// Starts every request received so far.
    pub(super) fn dispatch_forming(&mut self, io: &mut Io<'_>) {
        self.forming_bytes = 0;
        let mut forming = std::mem::take(&mut self.forming);
        // A queue-depth-1 client: this request alone, nothing else in
        // flight on the connection.
        let lone = forming.len() == 1 && self.requests_in_flight == 0;
        for entry in forming.drain(..) {
            self.dispatch(io, entry, lone);
        }
        self.forming = forming;
    }

    fn dispatch(&mut self, io: &mut Io<'_>, mut entry: Entry, lone: bool) {
        self.requests_in_flight += 1;
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.requests.push(None);
                self.requests.len() - 1
            }
        };
        let mut results = self.spare_results.pop().unwrap_or_default();
        results.clear();
        let mut state = State::Running;
        let mut jobs_left = 0;
        let request = entry.request;
        // A lone request with nothing else in flight on the loop (a
        // queue-depth-1 client: a database's write then FLUSH) runs even
        // blocking work right here: nobody waits for the loop meanwhile,
        // and two thread hand-offs to the pool would cost more than it
        // blocks. The loop then holds no map lock that the work could wait
        // behind.
        let inline = lone && io.loop_in_flight() == 0;
        let handle = &self.negotiated.handle;
        if matches!(entry.outcome, Outcome::Pending) {
            // A write that needs metadata made durable first (a thin
            // extent to allocate, a cold extent to mark hot: a commit)
            // would stall the loop: it runs like blocking work.
            let blocking = request.command == Command::Write
                && self
                    .volume
                    .write_needs_commit(request.offset, u64::from(request.length));
            match request.command {
                Command::Read | Command::Write if is_aligned_data(&entry) && !blocking => {
                    state = State::Staging;
                }
                Command::Read | Command::Write => match entry.payload.take() {
                    None => entry.outcome = Outcome::failed(NbdError::Io, "request without buffer"),
                    Some(mut buf) if inline => {
                        let result = blocking_io(handle, &request, &mut buf);
                        entry.payload = Some(buf);
                        entry.outcome = match result {
                            Ok(()) => Outcome::Done,
                            Err(err) => failure(&err, &request, self.peer),
                        };
                    }
                    Some(mut buf) => {
                        let handle = handle.clone();
                        jobs_left += 1;
                        io.offload(move || {
                            let result = guarded(|| blocking_io(&handle, &request, &mut buf))
                                .unwrap_or(Err(IoError::Failed));
                            Box::new(Delivery::Blocking { slot, buf, result })
                        });
                    }
                },
                // Nothing to prefetch: reads are served from the device.
                Command::Cache => entry.outcome = Outcome::Done,
                _ if inline => entry.outcome = run_command(handle, &request, self.peer),
                _ => {
                    let handle = handle.clone();
                    let peer = self.peer;
                    jobs_left += 1;
                    io.offload(move || {
                        let outcome = guarded(|| run_command(&handle, &request, peer))
                            .unwrap_or_else(|| Outcome::failed(NbdError::Io, "internal error"));
                        Box::new(Delivery::Command { slot, outcome })
                    });
                }
            }
        }
        self.requests[slot] = Some(InFlight {
            entry,
            staged: None,
            results,
            pieces_left: 0,
            jobs_left,
            state,
            lone,
            contended: false,
            started: Instant::now(),
        });
        self.stage(io, slot);
    }

    /// Stages the request's read or write and submits its pieces (or asks
    /// for a retry when a map lock is contended).
    pub(super) fn stage(&mut self, io: &mut Io<'_>, slot: usize) {
        let Some(req) = self.requests.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if req.state != State::Staging {
            self.maybe_complete(slot);
            return;
        }
        let request = req.entry.request;
        if req.contended
            && request.command == Command::Write
            && self
                .volume
                .write_needs_commit(request.offset, u64::from(request.length))
        {
            // It needs a commit now (its extent cooled, or was freed, while
            // it waited for a contended lock): not on the loop.
            if let Some(mut buf) = req.entry.payload.take() {
                req.state = State::Running;
                req.jobs_left += 1;
                let handle = self.negotiated.handle.clone();
                io.offload(move || {
                    let result = guarded(|| blocking_io(&handle, &request, &mut buf))
                        .unwrap_or(Err(IoError::Failed));
                    Box::new(Delivery::Blocking { slot, buf, result })
                });
            }
            return;
        }
        let Some(mut op) = data_op(&mut req.entry) else {
            req.state = State::Running;
            self.maybe_complete(slot);
            return;
        };
        let staged = match self.volume.try_stage(std::slice::from_mut(&mut op)) {
            Err(Contended) => {
                req.contended = true;
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
        let Some(staged) = staged else {
            drop(op);
            self.settle(slot, early, false, io);
            return;
        };
        if let Err(err) = early {
            drop(op);
            // Nothing was submitted: dropping the staged batch is safe.
            drop(staged);
            self.settle(slot, Err(err), false, io);
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
                    let tag = ((slot as u32) << PIECE_BITS) | k as u32;
                    // SAFETY: the buffer is the request's payload, which
                    // stays in its slot (heap memory unmoved) until every
                    // piece has completed; the device's file lives as long
                    // as the store, which `volume` keeps.
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
                self.negotiated.handle.record(ops, req.started);
                let result = std::mem::replace(&mut op.result, Ok(()));
                drop(op);
                self.settle(slot, result, commit, io);
            }
        }
    }

    /// A piece of a request completed on the ring.
    pub(super) fn piece_done(&mut self, io: &mut Io<'_>, slot: usize, piece: usize, result: i32) {
        let Some(req) = self.requests.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
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
            match (&req.staged, data_op(&mut req.entry)) {
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
        let Some(mut op) = data_op(&mut req.entry) else {
            return;
        };
        let ops = std::slice::from_mut(&mut op);
        let commit = staged.finish(ops, req.results.drain(..));
        self.negotiated.handle.record(ops, req.started);
        let result = std::mem::replace(&mut op.result, Ok(()));
        drop(op);
        self.settle(slot, result, commit, io);
    }

    /// Turns a finished read's or write's result into its outcome, and
    /// starts the commit a FUA write needs.
    fn settle(&mut self, slot: usize, result: Result<(), IoError>, commit: bool, io: &mut Io<'_>) {
        let structured = self.negotiated.structured;
        let peer = self.peer;
        let volume = &self.volume;
        let Some(req) = self.requests.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        req.entry.outcome = data_outcome(structured, &req.entry.request, result, peer, |o, l| {
            volume.try_mapping(o, l).and_then(Result::ok)
        });
        if commit {
            req.state = State::Committing;
            req.jobs_left += 1;
            let volume = self.volume.clone();
            io.offload(move || {
                let result = guarded(|| volume.flush()).unwrap_or(Err(IoError::Failed));
                Box::new(Delivery::Commit { slot, result })
            });
        }
        self.maybe_complete(slot);
    }

    pub(super) fn on_delivery(&mut self, delivery: Delivery) {
        let slot = match &delivery {
            Delivery::Command { slot, .. }
            | Delivery::Blocking { slot, .. }
            | Delivery::Commit { slot, .. } => *slot,
        };
        let peer = self.peer;
        let Some(req) = self.requests.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        req.jobs_left = req.jobs_left.saturating_sub(1);
        match delivery {
            Delivery::Command { outcome, .. } => req.entry.outcome = outcome,
            Delivery::Blocking { buf, result, .. } => {
                req.entry.payload = Some(buf);
                req.entry.outcome = match result {
                    Ok(()) => Outcome::Done,
                    Err(err) => failure(&err, &req.entry.request, peer),
                };
            }
            Delivery::Commit { result, .. } => {
                req.state = State::Running;
                if let Err(err) = result {
                    // Same rule as the synchronous path: a FUA write fails
                    // with the commit it needed.
                    if let Some(mut op) = data_op(&mut req.entry) {
                        fail_fua_writes(std::slice::from_mut(&mut op), &err);
                        let failed = op.result.is_err();
                        drop(op);
                        if failed {
                            req.entry.outcome = failure(&err, &req.entry.request, peer);
                        }
                    }
                }
            }
        }
        self.maybe_complete(slot);
    }

    /// Queues the reply to a request once all its work is done.
    fn maybe_complete(&mut self, slot: usize) {
        let done = self
            .requests
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|r| {
                r.state == State::Running
                    && r.pieces_left == 0
                    && r.jobs_left == 0
                    && r.staged.is_none()
            });
        if !done {
            return;
        }
        let Some(req) = self.requests.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free_slots.push(slot);
        self.requests_in_flight -= 1;
        self.spare_results.push(req.results);
        self.queue_reply(req.entry);
    }
}

/// Runs a READ or WRITE through the volume's synchronous data path (an
/// unaligned one is a read-modify-write in the store).
fn blocking_io(
    handle: &basalt_volume::VolumeHandle,
    request: &basalt_nbd_wire::Request,
    buf: &mut AlignedBuf,
) -> Result<(), IoError> {
    match request.command {
        Command::Read => handle.read(request.offset, buf),
        _ => handle.write(
            request.offset,
            buf,
            request.flags.contains(CommandFlags::FUA),
        ),
    }
}

/// Runs an offloaded job, turning a panic into `None` (logged), so that
/// its request is still answered (with an error) and its slot freed.
fn guarded<T>(job: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(value) => Some(value),
        Err(_) => {
            tracing::error!("an NBD request's job panicked; answering it with EIO");
            None
        }
    }
}
