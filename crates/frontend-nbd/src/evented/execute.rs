//! Executing an evented connection's requests: each request becomes a
//! batch of its own, whose read or write is staged against the volume's
//! maps and whose device pieces go to the loop's ring, while commands and
//! anything that may block run on the reactor's offload pool. A batch is
//! answered once its pieces, jobs and commit are all done.
//!
//! Invariants:
//! - A batch leaves `batches` only when nothing of it is in flight: no
//!   piece on the ring (the kernel writes into its buffers), no job on the
//!   pool, no commit pending.
//! - A contended map lock is never waited for on the loop: the batch stays
//!   `Staging` and is retried (`Io::retry_later`).

use super::EventedConnection;
use crate::requests::{data_outcome, failure, run_command, Entry, Outcome};
use basalt_nbd_wire::{Command, CommandFlags, NbdError};
use basalt_reactor::Io;
use basalt_store::{fail_fua_writes, AlignedBuf, Contended, DataKind, DataOp, StagedBatch};
use basalt_volume::IoError;
use io_uring::{opcode, types};
use std::io;
use std::time::Instant;

/// Bits of a ring tag that number the piece within its batch.
pub(super) const PIECE_BITS: u32 = 20;

/// Why a batch is not finished yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchState {
    /// Its map lock was contended: to be staged again.
    Staging,
    /// Pieces on the ring and/or jobs on the pool.
    Running,
    /// Waiting for the commit its FUA writes need.
    Committing,
}

pub(super) struct Batch {
    entries: Vec<Entry>,
    /// The entries (indexes) that are the staged batch's ops, in order.
    data: Vec<usize>,
    staged: Option<StagedBatch>,
    /// One outcome per piece of `staged`.
    results: Vec<io::Result<()>>,
    pieces_left: usize,
    jobs_left: usize,
    pub(super) state: BatchState,
    /// The only request of its connection in flight when dispatched.
    lone: bool,
    started: Instant,
}

/// What an offloaded job sends back.
pub(super) enum Delivery {
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

impl EventedConnection {
    /// Starts every request received so far, each as its own batch: a
    /// request is answered as soon as its own I/O is done, so a client's
    /// requests keep flowing one by one the way the disk completes them
    /// instead of in convoys (replies still leave together, see `flush`).
    pub(super) fn dispatch_forming(&mut self, io: &mut Io<'_>) {
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
        // A lone request with nothing else in flight on the loop (a
        // queue-depth-1 client: a database's write then FLUSH) runs even
        // blocking work right here: nobody waits for the loop meanwhile,
        // and two thread hand-offs to the pool would cost more than it
        // blocks. The loop then holds no map lock that the work could wait
        // behind.
        let inline = lone && io.loop_in_flight() == 0;
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
                    let fua = request.flags.contains(CommandFlags::FUA);
                    if inline {
                        let result = match request.command {
                            Command::Read => handle.read(request.offset, &mut buf),
                            _ => handle.write(request.offset, &buf, fua),
                        };
                        entry.payload = Some(buf);
                        entry.outcome = match result {
                            Ok(()) => Outcome::Done,
                            Err(err) => failure(&err, &request, self.peer),
                        };
                        continue;
                    }
                    let handle = handle.clone();
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
                _ if inline => entry.outcome = run_command(&handle, &request, self.peer),
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
    pub(super) fn stage(&mut self, io: &mut Io<'_>, index: usize) {
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
                entry.outcome = failure(&err, &entry.request, self.peer);
            }
        }
    }

    /// A piece of a batch completed on the ring.
    pub(super) fn piece_done(&mut self, io: &mut Io<'_>, index: usize, piece: usize, result: i32) {
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

    pub(super) fn on_delivery(&mut self, delivery: Delivery) {
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
                        Err(err) => failure(&err, &e.request, peer),
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
                                e.outcome = failure(&err, &e.request, peer);
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
