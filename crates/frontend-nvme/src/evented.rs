//! A connected I/O queue on an event loop (`basalt_reactor`): its PDUs
//! are received, its reads and writes staged, sent to the disk (a
//! single-node volume's) or to the volume's primary (a replicated one's),
//! completed and answered on the one loop thread that owns the queue. The
//! queue's thread hands it over after the Fabrics Connect
//! (`queue::serve`); the admin queue, queues in authentication and any
//! queue when the target runs without event loops stay on their threads.
//!
//! The cycle, driven by completions:
//! 1. *Receive*: when the socket is readable (a poll on the loop's ring),
//!    take what the kernel has without blocking and decode every whole
//!    PDU (`crate::transport`: capsules, H2CData, R2Ts to send).
//! 2. *Execute*, each command on its own, through the queue's
//!    `basalt_loop_io::BlockIo`: a Read or Write goes to the disk on the
//!    loop's ring (or the offload pool when it may block); Flush, Write
//!    Zeroes and Dataset Management run on the pool.
//! 3. *Complete*: a finished command's completion (and a read's C2HData,
//!    the data sent from its buffer, not copied) is queued; after each
//!    round of completions everything queued is sent with non-blocking
//!    vectored writes; what the socket does not take waits for
//!    writability. A replicated volume's Write is completed by the thread
//!    that brings its last acknowledgement, which sends the CapsuleResp
//!    (encoded when the write started) itself when the socket is free
//!    (`basalt_loop_io::ReplyGate`), rather than waking the loop to send
//!    it.
//!
//! Invariants:
//! - Every received command gets exactly one completion, sent only after
//!   its operation finished (so FUA and Flush completions imply
//!   durability); commands in flight together complete in any order, as
//!   NVMe allows.
//! - The queue is dropped only when nothing is in flight: no piece on the
//!   ring, no job on the pool, no poll armed (`finished`).
//! - Memory is bounded: at most `basalt_loop_io::MAX_SLOTS` commands in
//!   flight and [`MAX_QUEUED_REPLY_BYTES`] of completions and read data
//!   queued; beyond that the queue stops receiving until they drain (TCP
//!   pushes back). Write data waiting for H2CData is bounded by the
//!   transport.
//! - A fatal transport error sends a C2HTermReq and then stops receiving;
//!   a controller teardown (reset, keep-alive timeout, admin queue gone)
//!   shuts the socket down, which ends the queue the same way.

use crate::controller::Controller;
use crate::io_commands::{check_transfer, io_status, run_io_command};
use crate::queue::{connection_ended, RECV_BUFFER};
use crate::server::{Guards, Shared};
use crate::transport::{Fatal, Part, Transport};
use crate::ConnectionError;
use basalt_loop_io::{
    BlockIo, Completion, EarlyReply, Fill, Finished, Outcome, RecvBuffer, ReplyQueue, SocketPolls,
    Work,
};
use basalt_nvme_wire::command::{IoCommand, ReadWrite};
use basalt_nvme_wire::digest::crc32c;
use basalt_nvme_wire::fabrics::FabricsCommand;
use basalt_nvme_wire::pdu::PduType;
use basalt_nvme_wire::{parse_command, Command, QueueType, Sqe, Status, TermReq};
use basalt_reactor::{Connection, Io, Payload};
use basalt_store::AlignedBuf;
use basalt_volume::VolumeHandle;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// Completions and read data queued for sending at most before the queue
/// stops receiving.
pub const MAX_QUEUED_REPLY_BYTES: usize = 128 << 20;

/// What the block I/O carries for each command.
#[derive(Debug, Clone, Copy)]
struct Token {
    cid: u16,
    read: bool,
}

/// Moves a connected I/O queue to an event loop (or ends it, if the target
/// is stopping or the loop cannot take it).
pub(crate) fn hand_off(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    transport: Transport,
    ctrl: Arc<Controller>,
    leftover: Vec<u8>,
    guards: Guards,
) {
    let qid = transport.qid;
    let reactor = match &shared.loops {
        Some(loops) if !shared.stopping() => Arc::clone(loops.reactor()),
        // The loops may be gone already: never hand them a queue.
        _ => {
            connection_ended(shared, peer, qid, Some(ctrl), Ok(()));
            return;
        }
    };
    match EventedQueue::new(shared, stream, peer, transport, ctrl, leftover, guards) {
        Ok(queue) => {
            tracing::debug!(%peer, qid, "NVMe I/O queue moved to an event loop");
            reactor.adopt(Box::new(queue));
        }
        Err((err, ctrl)) => connection_ended(shared, peer, qid, Some(ctrl), Err(err.into())),
    }
}

struct EventedQueue {
    shared: Arc<Shared>,
    stream: TcpStream,
    fd: RawFd,
    peer: SocketAddr,
    ctrl: Option<Arc<Controller>>,
    volume: VolumeHandle,
    transport: Transport,
    block_io: BlockIo<Token, Status>,
    /// Received bytes not decoded yet.
    recv: RecvBuffer,
    /// Encoded bytes from the transport, before they join `replies`.
    out: Vec<u8>,
    replies: ReplyQueue,
    polls: SocketPolls,
    /// Still receiving (false after Disconnect, EOF, an error or stop).
    reading: bool,
    /// The socket is shut down or failed: nothing more is sent.
    dead: bool,
    end_result: Option<Result<(), ConnectionError>>,
    guards: Option<Guards>,
}

impl EventedQueue {
    fn new(
        shared: &Arc<Shared>,
        stream: TcpStream,
        peer: SocketAddr,
        transport: Transport,
        ctrl: Arc<Controller>,
        leftover: Vec<u8>,
        guards: Guards,
    ) -> Result<EventedQueue, (io::Error, Arc<Controller>)> {
        let setup = || -> io::Result<(VolumeHandle, BlockIo<Token, Status>)> {
            let volume = ctrl
                .volume()
                .cloned()
                .ok_or_else(|| io::Error::other("an I/O queue without a namespace"))?;
            let block_io = BlockIo::new(volume.clone());
            stream.set_nonblocking(true)?;
            Ok((volume, block_io))
        };
        let (volume, block_io) = match setup() {
            Ok(parts) => parts,
            Err(err) => return Err((err, ctrl)),
        };
        let fd = stream.as_raw_fd();
        let mut block_io = block_io;
        let replies = block_io.reply_queue(fd);
        Ok(EventedQueue {
            shared: Arc::clone(shared),
            fd,
            stream,
            peer,
            ctrl: Some(ctrl),
            volume,
            transport,
            block_io,
            recv: RecvBuffer::new(RECV_BUFFER, leftover),
            out: Vec::new(),
            replies,
            polls: SocketPolls::new(fd),
            reading: true,
            dead: false,
            end_result: None,
            guards: Some(guards),
        })
    }

    /// Records how the queue ends (the first report wins); an error or a
    /// stop shuts the socket down, which also completes any poll.
    fn end_with(&mut self, outcome: Result<(), ConnectionError>, kill: bool) {
        self.reading = false;
        if kill && !self.dead {
            self.dead = true;
            self.polls.close();
            let _ = self.stream.shutdown(Shutdown::Both);
            self.replies.clear(&mut self.transport.pool);
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
    /// nothing now (a poll is armed), the queue is throttled or ends.
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

    /// Decodes the whole PDUs buffered and starts the commands they make
    /// ready.
    fn decode(&mut self, io: &mut Io<'_>) {
        let blocks = Some(self.volume.size() / crate::BLOCK_SIZE);
        let received = self
            .transport
            .receive(self.recv.pending(), &mut self.out, blocks);
        match received {
            Ok(received) => {
                // The decoder counts what it needs beyond the bytes left.
                self.recv.consume(received.consumed, received.need);
                self.execute_ready(io);
                self.transport.issue_r2ts(&mut self.out);
                self.queue_out();
            }
            Err(fatal) => self.terminate(io, fatal),
        }
    }

    /// Sends a C2HTermReq for a fatal error (after the completions of the
    /// commands received before it) and stops receiving.
    fn terminate(&mut self, io: &mut Io<'_>, fatal: Fatal) {
        self.execute_ready(io);
        if let Some((fes, fei, header)) = fatal.term {
            tracing::warn!(peer = %self.peer, fes = fes.code(), fei, "NVMe/TCP fatal PDU error: sending C2HTermReq");
            TermReq::new(fes, fei, &header).encode(PduType::C2HTermReq, &mut self.out);
        }
        self.queue_out();
        self.end_with(Err(fatal.error), false);
    }

    // ------------------------------------------------------------ execute

    /// Starts every command whose data is complete.
    fn execute_ready(&mut self, io: &mut Io<'_>) {
        let mut ready = std::mem::take(&mut self.transport.ready);
        // A queue-depth-1 host: this command alone, nothing else in flight.
        let lone = ready.len() == 1 && self.block_io.in_flight() == 0;
        for mut r in ready.drain(..) {
            let cid = r.sqe.cid;
            let data = r.data.take();
            if let Some(status) = r.status {
                self.respond(cid, status, data);
                continue;
            }
            match parse_command(&r.sqe, QueueType::Io) {
                Command::Io(IoCommand::Read(rw)) => {
                    self.start_transfer(io, &r.sqe, &rw, false, data, lone)
                }
                Command::Io(IoCommand::Write(rw)) => {
                    self.start_transfer(io, &r.sqe, &rw, true, data, lone)
                }
                Command::Io(command) => {
                    let ready = self.ctrl.as_ref().is_some_and(|c| c.state.lock().csts.rdy);
                    if !ready {
                        self.respond(cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), data);
                        continue;
                    }
                    let peer = self.peer;
                    let job = move |volume: &VolumeHandle| {
                        let data = data.as_deref().unwrap_or(&[]);
                        run_io_command(volume, command, data, cid, peer)
                    };
                    let token = Token { cid, read: false };
                    self.block_io
                        .start(io, token, Work::Command(Box::new(job)), lone);
                }
                Command::Fabrics(FabricsCommand::Disconnect { .. }) => {
                    self.respond(cid, Status::SUCCESS, data);
                    self.end_with(Ok(()), false);
                }
                // Connected already; properties are the admin queue's.
                Command::Fabrics(
                    FabricsCommand::Connect(_)
                    | FabricsCommand::PropertyGet(_)
                    | FabricsCommand::PropertySet(_),
                ) => self.respond(cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), data),
                Command::Fabrics(_) | Command::Admin(_) => {
                    self.respond(cid, Status::INVALID_OPCODE.with_dnr(), data)
                }
            }
        }
        // Keep the vector's capacity for the next round.
        self.transport.ready = ready;
        self.take_finished();
    }

    /// Starts a Read or Write that passes its checks (or completes it
    /// with the status that refuses it).
    fn start_transfer(
        &mut self,
        io: &mut Io<'_>,
        sqe: &Sqe,
        rw: &ReadWrite,
        write: bool,
        data: Option<AlignedBuf>,
        lone: bool,
    ) {
        let cid = sqe.cid;
        let data_len = data.as_ref().map_or(0, |d| d.len());
        let max = self.shared.limits.max_transfer;
        match check_transfer(rw, sqe, write, data_len, self.volume.size(), max) {
            Err(status) => self.respond(cid, status, data),
            Ok((offset, bytes)) => {
                let work = match data {
                    // (A completion carries the queue's SQ head at the time
                    // it is sent: encoded by the loop, not in advance.)
                    Some(buf) if write => Work::Write {
                        offset,
                        buf,
                        fua: rw.fua,
                        early: self.early_completion(cid),
                    },
                    _ => Work::Read {
                        offset,
                        buf: self.transport.pool.take(bytes),
                    },
                };
                let token = Token { cid, read: !write };
                self.block_io.start(io, token, work, lone);
            }
        }
    }

    /// A Write's successful completion, encoded in advance for a
    /// replicated volume: the thread that completes the write sends it
    /// (`ReplyGate`). Its SQHD is the queue's as the write starts: no
    /// greater than what later completions carry, which a host reads as
    /// fewer free submission slots at most (hosts on TCP do not depend on
    /// it; without SQ flow control it is 0xFFFF anyway).
    fn early_completion(&mut self, cid: u16) -> Option<EarlyReply> {
        if self.block_io.volume().is_some() {
            return None;
        }
        let mut out = std::mem::take(&mut self.out);
        let from = out.len();
        self.transport.respond(&mut out, cid, Status::SUCCESS, 0);
        let early = EarlyReply::new(&out[from..]);
        out.truncate(from);
        self.out = out;
        early
    }

    // ----------------------------------------------------------- complete

    /// Queues a completion, returning the command's buffer to the pool.
    fn respond(&mut self, cid: u16, status: Status, buf: Option<AlignedBuf>) {
        if let Some(buf) = buf {
            self.transport.pool.give(buf);
        }
        self.transport.respond(&mut self.out, cid, status, 0);
        self.queue_out();
    }

    /// Moves the transport's encoded bytes to the reply queue.
    fn queue_out(&mut self) {
        if !self.dead {
            self.replies.push_encoded(&self.out);
        }
        self.out.clear();
    }

    /// Completes every command the block I/O has finished.
    fn take_finished(&mut self) {
        while let Some(finished) = self.block_io.pop_finished() {
            if finished.replied {
                // Its completion went out from the thread that finished it.
                if let Some(buf) = finished.buf {
                    self.transport.pool.give(buf);
                }
                continue;
            }
            self.complete(finished);
        }
    }

    fn complete(&mut self, finished: Finished<Token, Status>) {
        let Finished {
            token,
            buf,
            outcome,
            ..
        } = finished;
        match outcome {
            Outcome::Data(Ok(())) if token.read => match buf {
                Some(buf) => self.queue_read(token.cid, buf),
                None => self.respond(token.cid, Status::INTERNAL_ERROR.with_dnr(), None),
            },
            Outcome::Data(Ok(())) => self.respond(token.cid, Status::SUCCESS, buf),
            Outcome::Data(Err(err)) => {
                tracing::warn!(peer = %self.peer, cid = token.cid, "NVMe I/O failed: {err}");
                self.respond(token.cid, io_status(&err), buf);
            }
            Outcome::Command(Ok(status)) => self.respond(token.cid, status, buf),
            Outcome::Command(Err(_panicked)) => {
                self.respond(token.cid, Status::INTERNAL_ERROR.with_dnr(), buf)
            }
        }
    }

    /// Queues a read's C2HData PDUs with the data sent from its buffer:
    /// owned by the queue when it fits one PDU, shared by the PDUs
    /// otherwise.
    fn queue_read(&mut self, cid: u16, buf: AlignedBuf) {
        if self.dead {
            self.transport.pool.give(buf);
            return;
        }
        let len = buf.len();
        let replies = &mut self.replies;
        if len <= self.shared.limits.max_h2c_data as usize {
            let mut owned = Some(buf);
            let mut digest = [0u8; 4];
            self.transport.c2h_data(cid, len, |part| match part {
                Part::Bytes(bytes) => replies.push_encoded(bytes),
                Part::Data(range) => {
                    if let Some(buf) = owned.take() {
                        digest = crc32c(&buf[range.clone()]).to_le_bytes();
                        replies.push_owned(buf, range);
                    }
                }
                Part::Digest(_) => replies.push_encoded(&digest),
            });
            if let Some(buf) = owned {
                self.transport.pool.give(buf);
            }
        } else {
            let shared = Arc::new(buf);
            self.transport.c2h_data(cid, len, |part| match part {
                Part::Bytes(bytes) => replies.push_encoded(bytes),
                Part::Data(range) => replies.push_shared(Arc::clone(&shared), range),
                Part::Digest(range) => replies.push_encoded(&crc32c(&shared[range]).to_le_bytes()),
            });
        }
    }

    /// Sends queued completions until the socket takes no more (then waits
    /// for it to be writable).
    fn send(&mut self, io: &mut Io<'_>) {
        if self.dead || self.replies.is_empty() {
            return;
        }
        match self.replies.send(self.fd, &mut self.transport.pool) {
            Ok(true) => {}
            Ok(false) => self.polls.arm_writable(io),
            Err(e) => self.end_with(Err(e.into()), true),
        }
    }
}

impl Connection for EventedQueue {
    fn start(&mut self, io: &mut Io<'_>) {
        self.pump(io);
    }

    /// After the loop's round of completions: send everything queued
    /// during it at once, then receive again if the queue stopped only for
    /// lack of room and now has some.
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
            // Not one of this queue's jobs (they catch their own panics):
            // the queue cannot be trusted.
            tracing::error!(peer = %self.peer, "unexpected message for an NVMe queue; closing it");
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

impl Drop for EventedQueue {
    fn drop(&mut self) {
        let outcome = self.end_result.take().unwrap_or(Ok(()));
        let qid = self.transport.qid;
        connection_ended(&self.shared, self.peer, qid, self.ctrl.take(), outcome);
        drop(self.guards.take());
    }
}
