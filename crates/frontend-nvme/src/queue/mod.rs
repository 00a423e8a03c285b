//! One NVMe/TCP connection, which is one queue, served by its own thread:
//! the ICReq/ICResp exchange, the Fabrics Connect that binds the queue to
//! a (new or existing) controller (`admin.rs`), then every admin or I/O
//! command of the queue. An I/O queue of a volume on this node's store is
//! handed to the event loops (`crate::evented`) once it is connected and
//! quiet; everything else stays on its thread.
//!
//! Invariants:
//! - The thread reads whatever the socket has, decodes every complete PDU
//!   in it (`crate::transport`), runs the commands that are ready in
//!   arrival order (consecutive reads and writes together in one
//!   `VolumeHandle::submit`; a Flush, Write Zeroes or deallocate runs
//!   between such groups, so it never overtakes a write received before
//!   it), and then sends every response with one write.
//! - Every received command gets exactly one completion.
//! - A malformed or out-of-sequence PDU ends the connection after a
//!   C2HTermReq carrying the fatal error status; a data digest error only
//!   fails its command (Transient Transport Error).
//! - The admin queue's end tears its controller (and thereby every I/O
//!   queue of it) down; an I/O queue's end unregisters only itself.
//! - A queue is handed over only between rounds, with no command pending
//!   or ready, so no command is split between the two drivers.

mod admin;

use crate::auth::Authenticator;
use crate::controller::{Controller, Writer};
use crate::io_commands::{check_transfer, io_status, run_io_command};
use crate::server::{Guards, Shared};
use crate::transport::{Fatal, Part, Ready, Transport};
use crate::ConnectionError;
use basalt_nvme_wire::command::IoCommand;
use basalt_nvme_wire::digest::crc32c;
use basalt_nvme_wire::fabrics::FABRICS_OPCODE;
use basalt_nvme_wire::pdu::{Negotiated, PduType};
use basalt_nvme_wire::{parse_command, Command, QueueType, SglKind, Sqe, Status, TermReq};
use basalt_store::{AlignedBuf, DataOp, IoError};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// Receive buffer size; grows to hold one PDU when needed.
pub(crate) const RECV_BUFFER: usize = 256 * 1024;
/// Read and write data of one `submit` at most; more is split.
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Responses buffered before they are written out mid-round.
const MAX_OUT_BYTES: usize = 4 * 1024 * 1024;
/// Held Asynchronous Event Requests per controller (AERL + 1).
const AER_LIMIT: u8 = 4;

/// How a queue thread's loop ended without an error.
enum Ended {
    /// The host closed the connection or disconnected the queue.
    Closed,
    /// A connected I/O queue to go on on an event loop, with the bytes
    /// received but not decoded yet.
    HandOff(Vec<u8>),
}

/// Serves one connection until it ends or moves to an event loop, logging
/// how it ended. `guards` (its registration with the server, its admission)
/// are dropped when the connection ends, wherever it was served.
pub(crate) fn serve(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr, guards: Guards) {
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(%peer, "cannot set TCP_NODELAY: {err}");
    }
    let setup = stream
        .set_read_timeout(Some(shared.limits.connect_timeout))
        .and_then(|()| stream.set_write_timeout(Some(shared.limits.send_timeout)))
        .and_then(|()| stream.try_clone());
    let write_half = match setup {
        Ok(w) => w,
        Err(err) => {
            tracing::warn!(%peer, "NVMe/TCP connection refused, cannot set up its socket: {err}");
            return;
        }
    };
    let mut q = Queue::new(shared, stream, write_half, peer);
    let outcome = q.run();
    if let Ok(Ended::HandOff(leftover)) = outcome {
        let Queue {
            reader,
            transport,
            ctrl,
            ..
        } = q;
        if let Some(ctrl) = ctrl {
            crate::evented::hand_off(shared, reader, peer, transport, ctrl, leftover, guards);
        }
        return;
    }
    let qid = q.transport.qid;
    let ctrl = q.ctrl.take();
    connection_ended(shared, peer, qid, ctrl, outcome.map(|_| ()));
    drop(guards);
}

/// Unregisters a queue that ended (the admin queue: its whole controller)
/// and logs how it ended.
pub(crate) fn connection_ended(
    shared: &Shared,
    peer: SocketAddr,
    qid: u16,
    ctrl: Option<Arc<Controller>>,
    outcome: Result<(), ConnectionError>,
) {
    let cntlid = ctrl.as_ref().map(|c| c.cntlid);
    if let Some(ctrl) = ctrl {
        if qid == 0 {
            shared.controllers.remove(&ctrl);
            tracing::info!(%peer, cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, "NVMe controller removed");
        } else {
            // Only this connection's registration: after a controller reset
            // a new connection may already hold the same QID.
            let mut st = ctrl.state.lock();
            if st
                .queues
                .get(&qid)
                .is_some_and(|s| s.peer_addr().ok() == Some(peer))
            {
                st.queues.remove(&qid);
            }
        }
    }
    match outcome {
        Ok(()) => tracing::debug!(%peer, ?cntlid, qid, "NVMe/TCP host closed the connection"),
        Err(err) if shared.stopping() => {
            tracing::debug!(%peer, ?cntlid, qid, "NVMe/TCP connection closed by server shutdown ({err})")
        }
        Err(ConnectionError::Io(err)) => {
            tracing::info!(%peer, ?cntlid, qid, "NVMe/TCP connection closed: {err}")
        }
        Err(err) => tracing::warn!(%peer, ?cntlid, qid, "NVMe/TCP connection closed: {err}"),
    }
}

/// A read or write of the current `submit` batch.
struct BatchItem {
    cid: u16,
    offset: u64,
    write: bool,
    fua: bool,
    buf: AlignedBuf,
}

/// What a command produces.
enum Reply {
    Status(Status),
    Result(u64),
    /// A result with a failure status (Connect Invalid Parameters).
    StatusResult(Status, u64),
    /// Data for the host, then success.
    Data(Vec<u8>),
    /// Sent later (held Asynchronous Event Request).
    Held,
}

fn fail(s: Status) -> Reply {
    Reply::Status(s.with_dnr())
}

struct Queue<'a> {
    shared: &'a Arc<Shared>,
    peer: SocketAddr,
    reader: TcpStream,
    /// The socket's sending side, shared with whoever completes a held
    /// Asynchronous Event Request of this (admin) queue.
    writer: Arc<Mutex<Writer>>,
    out: Vec<u8>,
    transport: Transport,
    ctrl: Option<Arc<Controller>>,
    /// The queue's DH-HMAC-CHAP transaction, while the host must still
    /// authenticate (`crate::auth`); only authentication commands run
    /// until it is done.
    auth: Option<Authenticator>,
    disconnect: bool,
}

impl<'a> Queue<'a> {
    fn new(
        shared: &'a Arc<Shared>,
        reader: TcpStream,
        write_half: TcpStream,
        peer: SocketAddr,
    ) -> Queue<'a> {
        Queue {
            shared,
            peer,
            reader,
            writer: Arc::new(Mutex::new(Writer {
                stream: write_half,
                negotiated: Negotiated::INITIAL,
                sqhd: 0,
                scratch: Vec::new(),
            })),
            out: Vec::with_capacity(64 * 1024),
            transport: Transport::new(shared.limits, peer),
            ctrl: None,
            auth: None,
            disconnect: false,
        }
    }

    fn run(&mut self) -> Result<Ended, ConnectionError> {
        let mut buf = vec![0u8; RECV_BUFFER];
        let (mut start, mut end) = (0usize, 0usize);
        let mut need = 1usize;
        loop {
            // Room for at least what the decoder asked for.
            if end + need > buf.len() {
                buf.copy_within(start..end, 0);
                end -= start;
                start = 0;
                if end + need > buf.len() {
                    buf.resize(end + need, 0);
                }
            }
            let n = match self.reader.read(&mut buf[end..]) {
                Ok(0) if start == end => return Ok(Ended::Closed),
                Ok(0) => return Err(ConnectionError::Truncated),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            end += n;
            let was_negotiated = self.transport.ic_done;
            let blocks = self.volume_blocks();
            let received = self
                .transport
                .receive(&buf[start..end], &mut self.out, blocks);
            let received = match received {
                Ok(received) => received,
                Err(fatal) => return Err(self.terminate(fatal)),
            };
            start += received.consumed;
            need = received.need;
            if start == end {
                (start, end) = (0, 0);
            }
            if !was_negotiated && self.transport.ic_done {
                // The ICResp goes out with the old settings; completions
                // of held requests use the new ones.
                self.flush_out()?;
                self.writer.lock().negotiated = self.transport.negotiated;
            }
            self.execute_ready();
            let mut out = std::mem::take(&mut self.out);
            self.transport.issue_r2ts(&mut out);
            self.out = out;
            self.flush_out()?;
            if self.disconnect {
                return Ok(Ended::Closed);
            }
            if self.may_hand_off() {
                return Ok(Ended::HandOff(buf[start..end].to_vec()));
            }
            if buf.len() > RECV_BUFFER && start == end {
                buf.truncate(RECV_BUFFER);
                buf.shrink_to(RECV_BUFFER);
            }
        }
    }

    /// A connected, quiet I/O queue, with event loops to take it.
    fn may_hand_off(&self) -> bool {
        self.transport.qid != 0
            && self.auth.is_none()
            && self.transport.is_quiet()
            && self.shared.loops.is_some()
            && self.ctrl.as_ref().and_then(|c| c.volume()).is_some()
    }

    /// The namespace size of a connected I/O queue, in blocks.
    fn volume_blocks(&self) -> Option<u64> {
        let volume = self.ctrl.as_ref()?.volume()?;
        Some(volume.size() / crate::BLOCK_SIZE)
    }

    /// Sends a C2HTermReq (best effort) for a fatal error; the error.
    fn terminate(&mut self, fatal: Fatal) -> ConnectionError {
        if let Some((fes, fei, header)) = fatal.term {
            tracing::warn!(peer = %self.peer, fes = fes.code(), fei, "NVMe/TCP fatal PDU error: sending C2HTermReq");
            self.execute_ready();
            TermReq::new(fes, fei, &header).encode(PduType::C2HTermReq, &mut self.out);
            let _ = self.flush_out();
        }
        fatal.error
    }

    fn flush_out(&mut self) -> Result<(), ConnectionError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let mut w = self.writer.lock();
        w.sqhd = self.transport.cqe_sqhd();
        let r = w.stream.write_all(&self.out);
        drop(w);
        self.out.clear();
        if self.out.capacity() > 2 * MAX_OUT_BYTES {
            self.out.shrink_to(64 * 1024);
        }
        r.map_err(ConnectionError::from)
    }

    fn respond(&mut self, cid: u16, status: Status, result: u64) {
        self.transport.respond(&mut self.out, cid, status, result);
    }

    /// Sends `data` in C2HData PDUs, then the completion.
    fn send_data(&mut self, cid: u16, data: &[u8]) {
        let out = &mut self.out;
        self.transport.c2h_data(cid, data.len(), |part| match part {
            Part::Bytes(bytes) => out.extend_from_slice(bytes),
            Part::Data(range) => out.extend_from_slice(&data[range]),
            Part::Digest(range) => out.extend_from_slice(&crc32c(&data[range]).to_le_bytes()),
        });
    }

    fn reply(&mut self, cid: u16, reply: Reply) {
        match reply {
            Reply::Status(s) => self.respond(cid, s, 0),
            Reply::Result(r) => self.respond(cid, Status::SUCCESS, r),
            Reply::StatusResult(s, r) => self.respond(cid, s, r),
            Reply::Data(d) => self.send_data(cid, &d),
            Reply::Held => {}
        }
    }

    /// Runs every ready command in arrival order.
    fn execute_ready(&mut self) {
        let ready = std::mem::take(&mut self.transport.ready);
        let mut batch: Vec<BatchItem> = Vec::new();
        let mut batch_bytes = 0;
        for mut r in ready {
            let cid = r.sqe.cid;
            if let Some(status) = r.status {
                self.respond(cid, status, 0);
                self.give_back(r.data.take());
                continue;
            }
            if self.transport.qid != 0
                && self.ctrl.is_some()
                && self.auth.is_none()
                && r.sqe.opcode != FABRICS_OPCODE
            {
                if let Some(item) = self.as_batch_item(&mut r) {
                    match item {
                        Ok(item) => {
                            batch_bytes += item.buf.len();
                            batch.push(item);
                            if batch_bytes >= MAX_BATCH_BYTES {
                                self.run_batch(&mut batch);
                                batch_bytes = 0;
                                // Errors surface at the round's last flush.
                                let _ = self.flush_out();
                            }
                        }
                        Err(status) => {
                            self.respond(cid, status, 0);
                            self.give_back(r.data.take());
                        }
                    }
                    continue;
                }
                self.run_batch(&mut batch);
                batch_bytes = 0;
            }
            let reply = self.execute(&r);
            self.reply(cid, reply);
            self.give_back(r.data.take());
            if self.out.len() >= MAX_OUT_BYTES {
                let _ = self.flush_out();
            }
        }
        self.run_batch(&mut batch);
    }

    fn give_back(&mut self, buf: Option<AlignedBuf>) {
        if let Some(buf) = buf {
            self.transport.pool.give(buf);
        }
    }

    /// A Read or Write that goes into the `submit` batch (or its error
    /// status); `None` for every other command. A write's data moves into
    /// the item.
    fn as_batch_item(&mut self, r: &mut Ready) -> Option<Result<BatchItem, Status>> {
        let (rw, write) = match parse_command(&r.sqe, QueueType::Io) {
            Command::Io(IoCommand::Read(rw)) => (rw, false),
            Command::Io(IoCommand::Write(rw)) => (rw, true),
            _ => return None,
        };
        let size = self.ctrl.as_ref()?.volume()?.size();
        let data_len = r.data.as_ref().map_or(0, |d| d.len());
        let max_transfer = self.shared.limits.max_transfer;
        Some(
            check_transfer(&rw, &r.sqe, write, data_len, size, max_transfer).map(
                |(offset, bytes)| BatchItem {
                    cid: r.sqe.cid,
                    offset,
                    write,
                    fua: rw.fua,
                    buf: match r.data.take() {
                        Some(data) if write => data,
                        _ => self.transport.pool.take(bytes),
                    },
                },
            ),
        )
    }

    /// Runs the batch with one `submit` and queues its responses.
    fn run_batch(&mut self, batch: &mut Vec<BatchItem>) {
        if batch.is_empty() {
            return;
        }
        let Some(volume) = self.ctrl.as_ref().and_then(|c| c.volume()).cloned() else {
            batch.clear();
            return;
        };
        let results: Vec<Result<(), IoError>> = {
            let mut ops: Vec<DataOp<'_>> = batch
                .iter_mut()
                .map(|item| {
                    if item.write {
                        DataOp::write(item.offset, &item.buf, item.fua)
                    } else {
                        DataOp::read(item.offset, &mut item.buf)
                    }
                })
                .collect();
            volume.wait_for_qos(&ops);
            volume.submit(&mut ops);
            ops.into_iter().map(|op| op.result).collect()
        };
        for (item, result) in batch.drain(..).zip(results) {
            match result {
                Ok(()) if item.write => self.respond(item.cid, Status::SUCCESS, 0),
                Ok(()) => self.send_data(item.cid, &item.buf),
                Err(err) => {
                    tracing::warn!(peer = %self.peer, cid = item.cid, "NVMe I/O failed: {err}");
                    self.respond(item.cid, io_status(&err), 0);
                }
            }
            self.transport.pool.give(item.buf);
        }
    }

    /// Executes one non-batched command.
    fn execute(&mut self, r: &Ready) -> Reply {
        let queue_type = if self.transport.qid == 0 {
            QueueType::Admin
        } else {
            QueueType::Io
        };
        let cmd = parse_command(&r.sqe, queue_type);
        if let Command::Fabrics(f) = cmd {
            return self.fabrics(f, r);
        }
        if self.auth.is_some() {
            return fail(Status::AUTHENTICATION_REQUIRED);
        }
        let Some(ctrl) = self.ctrl.clone() else {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        if !ctrl.state.lock().csts.rdy {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        }
        match cmd {
            Command::Admin(a) => self.admin(&ctrl, a, &r.sqe),
            Command::Io(io) => match ctrl.volume() {
                Some(volume) => {
                    let data = r.data.as_deref().unwrap_or(&[]);
                    Reply::Status(run_io_command(volume, io, data, r.sqe.cid, self.peer))
                }
                None => fail(Status::INVALID_OPCODE),
            },
            Command::Fabrics(_) => fail(Status::INTERNAL_ERROR),
        }
    }
}

impl Reply {
    /// A result with a non-success status (Connect Invalid Parameters).
    fn with_status(self, status: Status) -> Reply {
        match self {
            Reply::Result(r) => Reply::StatusResult(status, r),
            other => other,
        }
    }
}

/// Data for a controller-to-host command, cut to what its SGL can hold.
fn data_reply(sqe: &Sqe, mut page: Vec<u8>) -> Reply {
    let sgl = sqe.sgl();
    if sgl.kind() != SglKind::Transport {
        return fail(Status::SGL_DESCRIPTOR_TYPE_INVALID);
    }
    page.truncate(sgl.length as usize);
    Reply::Data(page)
}
