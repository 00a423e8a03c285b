//! Executing an evented connection's requests through its
//! [`basalt_loop_io::BlockIo`]: a READ or WRITE goes to the disk on the
//! loop's ring (or the pool, when it may block); FLUSH, TRIM,
//! WRITE_ZEROES and BLOCK_STATUS run on the offload pool as commands. Each
//! request is answered as soon as it finishes — not when others received
//! with it do — so a client's requests flow the way the disk completes
//! them instead of in convoys.
//!
//! Invariants:
//! - A request that failed validation, or needs no work (CACHE, a
//!   zero-length probe), is answered at once, in the round it arrived.
//! - A request is *lone* when it arrived alone and nothing else of the
//!   connection is in flight: a queue-depth-1 client, whose blocking work
//!   may run inline on an idle loop.

use super::EventedConnection;
use crate::requests::{data_outcome, run_command, Entry, Outcome};
use basalt_loop_io::{EarlyReply, Finished, Outcome as Done, Work};
use basalt_nbd_wire::{encode_simple_reply, Command, CommandFlags, NbdError, Request};
use basalt_reactor::Io;

/// What a connection's block I/O carries for each request.
pub(super) type Token = Request;

impl EventedConnection {
    /// Starts every request received so far.
    pub(super) fn dispatch_forming(&mut self, io: &mut Io<'_>) {
        self.forming_bytes = 0;
        let mut forming = std::mem::take(&mut self.forming);
        let lone = forming.len() == 1 && self.block_io.in_flight() == 0;
        for entry in forming.drain(..) {
            self.dispatch(io, entry, lone);
        }
        self.forming = forming;
        self.take_finished();
    }

    fn dispatch(&mut self, io: &mut Io<'_>, mut entry: Entry, lone: bool) {
        if !matches!(entry.outcome, Outcome::Pending) {
            self.queue_reply(entry);
            return;
        }
        let request = entry.request;
        let work = match request.command {
            Command::Read | Command::Write => match entry.payload.take() {
                None => {
                    entry.outcome = Outcome::failed(NbdError::Io, "request without buffer");
                    self.queue_reply(entry);
                    return;
                }
                Some(buf) if request.command == Command::Read => Work::Read {
                    offset: request.offset,
                    buf,
                },
                Some(buf) => Work::Write {
                    offset: request.offset,
                    buf,
                    fua: request.flags.contains(CommandFlags::FUA),
                    early: self.early_reply(&request),
                },
            },
            // Nothing to prefetch: reads are served from the device.
            Command::Cache => {
                entry.outcome = Outcome::Done;
                self.queue_reply(entry);
                return;
            }
            _ => {
                let peer = self.peer;
                Work::Command(Box::new(move |handle: &basalt_volume::VolumeHandle| {
                    run_command(handle, &request, peer)
                }))
            }
        };
        self.block_io.start(io, request, work, lone);
    }

    /// A WRITE's success reply, encoded in advance for a replicated
    /// volume: the thread that completes the write sends it (`ReplyGate`).
    fn early_reply(&mut self, request: &Request) -> Option<EarlyReply> {
        if self.block_io.volume().is_some() {
            return None;
        }
        let mut out = std::mem::take(&mut self.scratch_encoded);
        out.clear();
        encode_simple_reply(request.cookie, None, &mut out);
        let early = EarlyReply::new(&out);
        self.scratch_encoded = out;
        early
    }

    /// Queues the replies of every request the block I/O has finished
    /// (but those whose early reply was sent already).
    pub(super) fn take_finished(&mut self) {
        while let Some(finished) = self.block_io.pop_finished() {
            if finished.replied {
                if let Some(buf) = finished.buf {
                    self.pool.give(buf);
                }
                continue;
            }
            let entry = self.entry_of(finished);
            self.queue_reply(entry);
        }
    }

    /// A finished request as an entry to reply to.
    fn entry_of(&self, finished: Finished<Token, Outcome>) -> Entry {
        let Finished {
            token: request,
            buf,
            outcome,
            ..
        } = finished;
        let outcome = match outcome {
            Done::Data(result) => {
                let volume = self.block_io.volume();
                data_outcome(
                    self.negotiated.structured,
                    &request,
                    result,
                    self.peer,
                    |o, l| volume?.try_mapping(o, l).and_then(Result::ok),
                )
            }
            Done::Command(Ok(outcome)) => outcome,
            Done::Command(Err(_panicked)) => Outcome::failed(NbdError::Io, "internal error"),
        };
        Entry {
            request,
            payload: buf,
            outcome,
        }
    }
}
