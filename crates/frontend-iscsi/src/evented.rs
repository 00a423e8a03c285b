//! A logged-in normal session on an event loop (`basalt_reactor`): its
//! PDUs are received, its commands decided by the volume's logical unit,
//! its reads and writes run (on the loop's ring for a single-node volume,
//! in batches to the primary for a replicated one), and its Data-In and
//! responses sent, all on the one loop thread that owns the connection,
//! with no thread hand-off per I/O.
//!
//! The cycle, driven by completions:
//! 1. *Receive*: when the socket is readable, take what the kernel has
//!    without blocking and run every whole PDU through the session
//!    (`crate::session`: command window, Data-Out, R2Ts, NOP, TMF,
//!    logout).
//! 2. *Execute*, each ready command on its own: the logical unit's plan
//!    (`crate::units`) says what it does; a read or write goes to
//!    `basalt_loop_io::BlockIo`, anything else (flush, unmap, write same,
//!    verify, compare and write, LBA status) runs as a job on the offload
//!    pool (`crate::scsi_exec`), and answers without I/O are queued at once.
//! 3. *Complete*: a finished command's Data-In (sent from its buffer, not
//!    copied) and response are queued; after each round of completions
//!    everything queued is sent with non-blocking vectored writes; what the
//!    socket does not take waits for writability.
//!
//! Invariants:
//! - Every ready command gets exactly one answer after its operation
//!   finished, or none when task management aborted it; one aborted before
//!   it started never runs. Commands in flight together complete in any
//!   order (SIMPLE task attribute).
//! - The connection is dropped only when nothing is in flight: no piece on
//!   the ring, no job on the pool, no poll armed (`finished`).
//! - Memory is bounded: the session's command window caps commands in
//!   flight, and [`MAX_QUEUED_REPLY_BYTES`] caps what waits to be sent;
//!   beyond it the connection stops receiving until it drains.
//! - A protocol error sends its Reject and then stops receiving; a server
//!   shutdown or a volume's disconnect shuts the socket down, which ends
//!   the connection the same way.

use crate::scsi_exec;
use crate::server::{Guards, Shared};
use crate::session::{Part, Ready, Session};
use crate::units::{Unit, UnitView};
use crate::ConnectionError;
use basalt_loop_io::{
    BlockIo, Completion, Fill, Finished, Outcome, RecvBuffer, ReplyQueue, SocketPolls, Work,
};
use basalt_reactor::{Connection, Io, Payload};
use basalt_scsi_wire::lu::{self, Plan, Response};
use basalt_scsi_wire::reservation::Nexus;
use basalt_scsi_wire::sense::{self, Sense};
use basalt_store::AlignedBuf;
use basalt_volume::VolumeHandle;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// Data-In and responses queued for sending at most before the connection
/// stops receiving.
pub const MAX_QUEUED_REPLY_BYTES: usize = 128 << 20;
/// Receive buffer size; grows to hold one PDU when needed.
pub(crate) const RECV_BUFFER: usize = 256 * 1024;

/// What the block I/O carries for each command.
#[derive(Debug, Clone, Copy)]
struct Token {
    itt: u32,
    lun: u64,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Send the first `len` bytes read, then GOOD with the residual.
    Read { len: u32, residual: lu::Residual },
    /// GOOD with the residual.
    Write { residual: lu::Residual },
    /// The job's own response.
    Command,
}

/// Moves a logged-in session to an event loop (or ends it, if the target
/// is stopping).
#[allow(clippy::too_many_arguments)]
pub(crate) fn hand_off(
    shared: &Arc<Shared>,
    id: u64,
    stream: TcpStream,
    peer: SocketAddr,
    session: Session,
    unit: Arc<Unit>,
    volume: VolumeHandle,
    nexus: Nexus,
    leftover: Vec<u8>,
    guards: Guards,
) {
    if shared.stopping() {
        return;
    }
    if let Err(err) = stream.set_nonblocking(true) {
        tracing::warn!(%peer, "iSCSI session cannot go on an event loop: {err}");
        return;
    }
    let fd = stream.as_raw_fd();
    let view = unit.connect(&nexus, id);
    let connection = EventedSession {
        shared: Arc::clone(shared),
        id,
        fd,
        stream,
        peer,
        session,
        unit,
        view,
        nexus,
        block_io: BlockIo::new(volume),
        recv: RecvBuffer::new(RECV_BUFFER, leftover),
        out: Vec::new(),
        header: Vec::new(),
        replies: ReplyQueue::default(),
        polls: SocketPolls::new(fd),
        reading: true,
        dead: false,
        end_result: None,
        guards: Some(guards),
    };
    shared.loops.reactor().adopt(Box::new(connection));
}

struct EventedSession {
    shared: Arc<Shared>,
    /// The server's id of the connection.
    id: u64,
    stream: TcpStream,
    fd: RawFd,
    peer: SocketAddr,
    session: Session,
    unit: Arc<Unit>,
    /// The logical unit as this connection last saw it.
    view: UnitView,
    nexus: Nexus,
    block_io: BlockIo<Token, Response>,
    /// Received bytes not decoded yet.
    recv: RecvBuffer,
    /// Encoded PDUs before they join `replies`.
    out: Vec<u8>,
    /// Scratch for Data-In headers.
    header: Vec<u8>,
    replies: ReplyQueue,
    polls: SocketPolls,
    /// Still receiving (false after Logout, EOF, an error or stop).
    reading: bool,
    /// The socket is shut down or failed: nothing more is sent.
    dead: bool,
    end_result: Option<Result<(), ConnectionError>>,
    guards: Option<Guards>,
}

impl EventedSession {
    /// Records how the connection ends (the first report wins); an error
    /// or a stop shuts the socket down, which also completes any poll.
    fn end_with(&mut self, outcome: Result<(), ConnectionError>, kill: bool) {
        self.reading = false;
        if kill && !self.dead {
            self.dead = true;
            self.polls.close();
            let _ = self.stream.shutdown(Shutdown::Both);
            self.replies.clear(&mut self.session.pool);
        }
        if self.end_result.is_none() {
            self.end_result = Some(outcome);
        }
    }

    fn throttled(&self) -> bool {
        self.block_io.in_flight() >= basalt_loop_io::MAX_SLOTS
            || self.replies.queued_bytes() >= MAX_QUEUED_REPLY_BYTES
    }

    // ------------------------------------------------------------ receive

    fn pump(&mut self, io: &mut Io<'_>) {
        if let Err(err) = self.receive(io) {
            self.end_with(Err(err), true);
        }
    }

    /// Decodes what is buffered and reads more, until the socket has
    /// nothing now (a poll is armed), the connection is throttled or ends.
    fn receive(&mut self, io: &mut Io<'_>) -> Result<(), ConnectionError> {
        while self.reading && !self.dead {
            if self.throttled() {
                // Resumed when commands complete or replies drain.
                return Ok(());
            }
            if self.recv.ready() {
                self.decode(io);
                continue;
            }
            match self.recv.fill(&mut self.stream) {
                Fill::Data => {}
                Fill::WouldBlock => {
                    self.polls.arm_readable(io);
                    return Ok(());
                }
                Fill::Closed => self.end_with(Ok(()), false),
                Fill::Truncated => return Err(ConnectionError::Truncated),
                Fill::Failed(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Runs the whole PDUs buffered through the session and starts the
    /// commands they make ready.
    fn decode(&mut self, io: &mut Io<'_>) {
        self.refresh_view();
        let (unit, view, nexus) = (&self.unit, &self.view, &self.nexus);
        let data_out_len = |cdb: &[u8], edtl: u32, read: bool, write: bool| {
            unit.data_out_len(view, nexus, cdb, edtl, read, write)
        };
        let received = self
            .session
            .receive(self.recv.pending(), &mut self.out, &data_out_len);
        match received {
            Ok(received) => {
                self.recv.consume(received.consumed, received.need.max(1));
                self.take_lun_resets();
                self.execute_ready(io);
                self.session.issue_r2ts(&mut self.out);
                self.queue_out();
                if self.session.logged_out {
                    self.end_with(Ok(()), false);
                }
            }
            Err(fatal) => {
                tracing::warn!(peer = %self.peer, "iSCSI protocol error: {}; closing the connection", fatal.error);
                self.execute_ready(io);
                self.session.encode_fatal_reject(&fatal, &mut self.out);
                self.queue_out();
                self.end_with(Err(fatal.error), false);
            }
        }
    }

    /// The unit's state may have changed (a unit attention, a
    /// reservation, a resize, MODE SELECT): take a fresh view.
    fn refresh_view(&mut self) {
        if self.unit.generation() != self.view.generation {
            self.view = self.unit.view(&self.nexus);
        }
    }

    fn take_lun_resets(&mut self) {
        while self.session.lun_resets > 0 {
            self.session.lun_resets -= 1;
            self.unit.lun_reset(&self.nexus);
            self.refresh_view();
        }
    }

    // ------------------------------------------------------------ execute

    /// Starts every command whose data is complete.
    fn execute_ready(&mut self, io: &mut Io<'_>) {
        let mut ready = std::mem::take(&mut self.session.ready);
        // A queue-depth-1 initiator: this command alone, nothing else in
        // flight.
        let lone = ready.len() == 1 && self.block_io.in_flight() == 0;
        for r in ready.drain(..) {
            self.refresh_view();
            let Ready {
                itt,
                lun,
                cdb,
                edtl,
                read,
                write,
                data,
                data_error,
            } = r;
            if self.session.aborted(itt) {
                // Aborted by task management received with it, before it
                // started: it never runs, so it cannot take a unit
                // attention the TMF posted for the commands after it.
                self.give(data);
                let answered = self.session.finish(itt, &mut self.out);
                debug_assert!(!answered, "an aborted task is never answered");
                self.queue_out();
                continue;
            }
            if data_error {
                self.give(data);
                self.respond(itt, lun, failure(sense::DATA_PHASE_ERROR));
                continue;
            }
            let transfer = lu::Transfer {
                expected_length: edtl,
                read,
                write,
            };
            let plan = self
                .unit
                .decide(&self.view, &self.nexus, lun, cdb.bytes(), transfer);
            self.run_plan(io, itt, lun, plan, data, lone);
        }
        // Keep the vector's capacity for the next round.
        self.session.ready = ready;
        self.take_finished();
    }

    /// Starts one decided command (`data`: its Data-Out, as long as the
    /// plan's data-out length).
    fn run_plan(
        &mut self,
        io: &mut Io<'_>,
        itt: u32,
        lun: u64,
        plan: Plan,
        data: Option<AlignedBuf>,
        lone: bool,
    ) {
        let block = crate::LOGICAL_BLOCK_SIZE;
        match plan {
            Plan::Respond(response) => {
                self.give(data);
                self.respond(itt, lun, response);
            }
            Plan::Read {
                lba,
                blocks,
                data_in_len,
                residual,
                ..
            } => {
                self.give(data);
                let buf = self.session.pool.take(blocks as usize * block as usize);
                let token = Token {
                    itt,
                    lun,
                    kind: Kind::Read {
                        len: data_in_len,
                        residual,
                    },
                };
                let offset = lba.saturating_mul(block);
                self.block_io
                    .start(io, token, Work::Read { offset, buf }, lone);
            }
            Plan::Write {
                lba,
                blocks,
                fua,
                residual,
            } => match data {
                Some(buf) if buf.len() as u64 == u64::from(blocks) * block => {
                    let token = Token {
                        itt,
                        lun,
                        kind: Kind::Write { residual },
                    };
                    let offset = lba.saturating_mul(block);
                    let work = Work::Write {
                        offset,
                        buf,
                        fua,
                        early: None,
                    };
                    self.block_io.start(io, token, work, lone);
                }
                // The session collects exactly the plan's data-out length
                // (the same pure plan decided it): unreachable unless the
                // unit changed in between, which fails the command.
                other => {
                    self.give(other);
                    self.respond(itt, lun, failure(sense::INTERNAL_TARGET_FAILURE));
                }
            },
            Plan::ParameterList { then, .. } => {
                let next = {
                    let params = data.as_ref().map_or(&[][..], |d| &d[..]);
                    self.unit.with_parameters(&self.nexus, then, params)
                };
                self.give(data);
                self.refresh_view();
                match next {
                    // (A parameter list never asks for another.)
                    Plan::ParameterList { .. } => {
                        self.respond(itt, lun, failure(sense::INTERNAL_TARGET_FAILURE))
                    }
                    next => self.run_plan(io, itt, lun, next, None, lone),
                }
            }
            Plan::ReservationsChanged { response, .. } => {
                // PREEMPT AND ABORT's aborted tasks belong to other
                // sessions, which answer them as they finish; APTPL is not
                // offered (REPORT CAPABILITIES says PTPL_C=0), so there is
                // nothing to persist.
                self.give(data);
                self.respond(itt, lun, response);
            }
            plan => {
                let unit = Arc::clone(&self.unit);
                let job = move |volume: &VolumeHandle| scsi_exec::run(volume, &unit, plan, data);
                let token = Token {
                    itt,
                    lun,
                    kind: Kind::Command,
                };
                self.block_io
                    .start(io, token, Work::Command(Box::new(job)), lone);
            }
        }
    }

    fn give(&mut self, buf: Option<AlignedBuf>) {
        if let Some(buf) = buf {
            self.session.pool.give(buf);
        }
    }

    // ----------------------------------------------------------- complete

    /// Queues the answer of task `itt` (nothing if it was aborted).
    fn respond(&mut self, itt: u32, lun: u64, response: Response) {
        if !self.session.finish(itt, &mut self.out) {
            self.queue_out();
            return;
        }
        let residual = wire_residual(response.residual);
        let good = response.status == sense::STATUS_GOOD && response.sense.is_none();
        if !response.data_in.is_empty() {
            let mut buf = self.session.pool.take(response.data_in.len());
            buf.copy_from_slice(&response.data_in);
            let status = good.then_some((response.status, residual));
            self.queue_data_in(itt, lun, buf, response.data_in.len(), status);
            if good {
                return;
            }
        }
        let sense_bytes = response
            .sense
            .map(|s| self.unit.sense_bytes(&self.view, &s));
        self.session.scsi_response(
            itt,
            response.status,
            sense_bytes.as_deref().unwrap_or(&[]),
            residual,
            &mut self.out,
        );
        self.queue_out();
    }

    /// Queues the Data-In PDUs of `len` bytes of `buf` (then frees it).
    fn queue_data_in(
        &mut self,
        itt: u32,
        lun: u64,
        buf: AlignedBuf,
        len: usize,
        status: Option<(u8, basalt_iscsi_wire::pdu::Residual)>,
    ) {
        self.queue_out();
        if self.dead || len == 0 {
            self.session.pool.give(buf);
            return;
        }
        // One PDU: the buffer goes to the reply queue itself; several: they
        // share it.
        let params = &self.session.params;
        let single = len <= params.send_segment.min(params.max_burst) as usize;
        let digests = params.digests.data;
        let mut held = match single {
            true => Held::Owned(Some(buf)),
            false => Held::Shared(Arc::new(buf)),
        };
        let replies = &mut self.replies;
        let mut digest = [0u8; 4];
        self.session
            .data_in(itt, lun, len, status, &mut self.header, |part| match part {
                Part::Bytes(bytes) => replies.push_encoded(bytes),
                Part::Data(range) => {
                    if digests {
                        digest = crate::session::data_digest(held.bytes(range.clone()));
                    }
                    match &mut held {
                        Held::Owned(buf) => {
                            if let Some(buf) = buf.take() {
                                replies.push_owned(buf, range);
                            }
                        }
                        Held::Shared(buf) => replies.push_shared(Arc::clone(buf), range),
                    }
                }
                Part::Trailer { pad, digest: with } => {
                    let mut trailer = [0u8; 7];
                    let n = match with {
                        Some(_) => {
                            trailer[pad..pad + 4].copy_from_slice(&digest);
                            pad + 4
                        }
                        None => pad,
                    };
                    if n > 0 {
                        replies.push_encoded(&trailer[..n]);
                    }
                }
            });
        if let Held::Owned(Some(buf)) = held {
            self.session.pool.give(buf);
        }
    }

    /// Moves the session's encoded PDUs to the reply queue.
    fn queue_out(&mut self) {
        if !self.dead && !self.out.is_empty() {
            self.replies.push_encoded(&self.out);
        }
        self.out.clear();
    }

    /// Completes every command the block I/O has finished.
    fn take_finished(&mut self) {
        while let Some(finished) = self.block_io.pop_finished() {
            self.complete(finished);
        }
    }

    fn complete(&mut self, finished: Finished<Token, Response>) {
        let Finished {
            token,
            buf,
            outcome,
            ..
        } = finished;
        match (outcome, token.kind) {
            (Outcome::Data(Ok(())), Kind::Read { len, residual }) => match buf {
                Some(buf) if self.session.finish(token.itt, &mut self.out) => {
                    let status = Some((sense::STATUS_GOOD, wire_residual(residual)));
                    self.queue_data_in(token.itt, token.lun, buf, len as usize, status);
                }
                Some(buf) => {
                    self.session.pool.give(buf);
                    self.queue_out();
                }
                None => self.respond(
                    token.itt,
                    token.lun,
                    failure(sense::INTERNAL_TARGET_FAILURE),
                ),
            },
            (Outcome::Data(Ok(())), Kind::Write { residual }) => {
                if let Some(buf) = buf {
                    self.session.pool.give(buf);
                }
                self.respond(
                    token.itt,
                    token.lun,
                    Response::good().with_residual(residual),
                );
            }
            (Outcome::Data(Err(err)), kind) => {
                if let Some(buf) = buf {
                    self.session.pool.give(buf);
                }
                tracing::warn!(peer = %self.peer, itt = token.itt, "iSCSI I/O failed: {err}");
                let write = matches!(kind, Kind::Write { .. });
                let sense = lu::io_failure_sense(scsi_exec::io_failure(&err, write));
                self.respond(token.itt, token.lun, Response::check(sense));
            }
            (Outcome::Command(Ok(response)), _) => {
                if let Some(buf) = buf {
                    self.session.pool.give(buf);
                }
                self.respond(token.itt, token.lun, response)
            }
            (Outcome::Command(Err(_panicked)), _) => self.respond(
                token.itt,
                token.lun,
                failure(sense::INTERNAL_TARGET_FAILURE),
            ),
            (Outcome::Data(Ok(())), Kind::Command) => self.respond(
                token.itt,
                token.lun,
                failure(sense::INTERNAL_TARGET_FAILURE),
            ),
        }
    }

    /// Sends queued PDUs until the socket takes no more (then waits for it
    /// to be writable).
    fn send(&mut self, io: &mut Io<'_>) {
        if self.dead || self.replies.is_empty() {
            return;
        }
        match self.replies.send(self.fd, &mut self.session.pool) {
            Ok(true) => {}
            Ok(false) => self.polls.arm_writable(io),
            Err(e) => self.end_with(Err(e.into()), true),
        }
    }
}

/// A read's buffer while its Data-In PDUs are queued.
enum Held {
    /// Taken by the one PDU's data (`None` once queued).
    Owned(Option<AlignedBuf>),
    Shared(Arc<AlignedBuf>),
}

impl Held {
    /// `range` of the buffer (empty once an owned buffer is queued).
    fn bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        let buf = match self {
            Held::Owned(Some(buf)) => &buf[..],
            Held::Owned(None) => &[],
            Held::Shared(buf) => &buf[..],
        };
        buf.get(range).unwrap_or(&[])
    }
}

fn failure(sense: Sense) -> Response {
    Response::check(sense)
}

/// The logical unit's residual as the PDU codec writes it.
fn wire_residual(residual: lu::Residual) -> basalt_iscsi_wire::pdu::Residual {
    use basalt_iscsi_wire::pdu::Residual as Wire;
    match residual {
        lu::Residual::None => Wire::None,
        lu::Residual::Underflow(n) => Wire::Underflow(n),
        lu::Residual::Overflow(n) => Wire::Overflow(n),
    }
}

impl Connection for EventedSession {
    fn start(&mut self, io: &mut Io<'_>) {
        self.pump(io);
    }

    /// After the loop's round of completions: send everything queued
    /// during it at once, then receive again if the connection stopped
    /// only for lack of room and now has some.
    fn flush(&mut self, io: &mut Io<'_>) {
        self.send(io);
        if self.reading && !self.dead && !self.polls.waiting_readable() && !self.throttled() {
            self.pump(io);
            self.send(io);
        }
        // A replicated volume's commands of this round leave as one batch.
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
        if self.block_io.delivered(io, payload).is_some() {
            // Not one of this connection's jobs (they catch their own
            // panics): the connection cannot be trusted.
            tracing::error!(peer = %self.peer, "unexpected message for an iSCSI session; closing it");
            self.end_with(
                Err(ConnectionError::Io(io::Error::other("command job failed"))),
                true,
            );
        }
        self.take_finished();
    }

    fn retry(&mut self, io: &mut Io<'_>) {
        self.block_io.retry(io);
        self.take_finished();
    }

    fn stop(&mut self, io: &mut Io<'_>) {
        self.end_with(Ok(()), true);
        self.block_io.cancel_throttled(io);
        self.take_finished();
    }

    fn finished(&self) -> bool {
        !self.reading
            && self.block_io.in_flight() == 0
            && (self.dead || self.replies.is_empty())
            && !self.polls.armed()
    }
}

impl Drop for EventedSession {
    fn drop(&mut self) {
        self.unit.nexus_lost(&self.nexus, self.id);
        match self.end_result.take().unwrap_or(Ok(())) {
            Ok(()) => tracing::debug!(peer = %self.peer, "iSCSI session ended"),
            Err(err) if self.shared.stopping() => {
                tracing::debug!(peer = %self.peer, "iSCSI session closed by server shutdown ({err})")
            }
            Err(err) => tracing::info!(peer = %self.peer, "iSCSI session ended: {err}"),
        }
        drop(self.guards.take());
    }
}
