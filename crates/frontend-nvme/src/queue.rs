//! One NVMe/TCP connection, which is one queue: the ICReq/ICResp exchange,
//! the Fabrics Connect that binds the queue to a (new or existing)
//! controller, then every admin or I/O command of the queue, with R2T /
//! H2CData for write data that did not fit in the capsule and C2HData for
//! read data.
//!
//! Invariants:
//! - The thread reads whatever the socket has, decodes every complete PDU
//!   in it, runs the commands that are ready in arrival order (consecutive
//!   reads and writes together in one `VolumeHandle::submit`; a Flush, Write
//!   Zeroes or deallocate runs between such groups, so it never overtakes a
//!   write received before it), and then sends every response with one
//!   write.
//! - Every received command gets exactly one completion; a command waiting
//!   for H2CData holds a buffer of exactly its transfer length, and the
//!   write data a queue holds is bounded by
//!   `ServerLimits::max_inflight_per_queue` (commands beyond it wait for
//!   their R2T).
//! - A malformed or out-of-sequence PDU ends the connection after a
//!   C2HTermReq carrying the fatal error status; a data digest error only
//!   fails its command (Transient Transport Error).
//! - The admin queue's end tears its controller (and thereby every I/O
//!   queue of it) down.

use crate::controller::{self, Controller, IdentifySettings, Kind, Writer};
use crate::server::Shared;
use crate::{volume_of_nqn, ConnectionError, OpenError, PathState, BLOCK_SIZE, NSID};
use basalt_nvme_wire::command::{
    cns, feature_id, io_opcode, log_id, number_of_queues_result, parse_dsm_ranges, AdminCommand,
    GetLogPage, Identify, IoCommand,
};
use basalt_nvme_wire::decoder::max_plen_for_data;
use basalt_nvme_wire::fabrics::{
    connect_data_offset, connect_invalid_parameter_result, connect_sqe_offset,
    connect_success_result, fctype, FabricsCommand, CNTLID_DYNAMIC, CNTLID_STATIC_ANY,
    CONNECT_DATA_LEN, FABRICS_OPCODE,
};
use basalt_nvme_wire::log_page::{copy_log_window, ANA_LSP_RETURN_GROUPS_ONLY};
use basalt_nvme_wire::pdu::{flags, Fes, Negotiated, PduType, PFV_1_0};
use basalt_nvme_wire::properties::{Cap, Property, Vs};
use basalt_nvme_wire::{
    decode_pdu, parse_command, term_req_error_data, C2HDataHeader, CapsuleResp, Command, Cqe,
    Decoded, DecoderConfig, IcResp, Pdu, PduError, QueueType, SglKind, Sqe, Status, TermReq, R2T,
};
use basalt_store::{DataOp, IoError};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

/// Receive buffer size; grows to hold one PDU when needed.
const RECV_BUFFER: usize = 256 * 1024;
/// Read and write data of one `submit` at most; more is split.
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Responses buffered before they are written out mid-round.
const MAX_OUT_BYTES: usize = 4 * 1024 * 1024;
/// Held Asynchronous Event Requests per controller (AERL + 1).
const AER_LIMIT: u8 = 4;

/// Serves one connection until it ends, logging how it ended.
pub(crate) fn serve(shared: &Shared, stream: TcpStream, peer: SocketAddr) {
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
    let (qid, cntlid) = (q.qid, q.ctrl.as_ref().map(|c| c.cntlid));
    if let Some(ctrl) = q.ctrl.take() {
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

/// Write data being collected through R2T/H2CData.
struct Pending {
    sqe: Sqe,
    buf: Vec<u8>,
    received: usize,
    r2t_sent: bool,
    failed: bool,
}

/// A command whose data (if any) is complete.
struct Ready {
    sqe: Sqe,
    data: Vec<u8>,
    /// Set when the command already failed (digest error).
    status: Option<Status>,
}

/// A read or write of the current `submit` batch.
struct BatchItem {
    cid: u16,
    offset: u64,
    write: bool,
    fua: bool,
    buf: Vec<u8>,
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
    shared: &'a Shared,
    peer: SocketAddr,
    reader: TcpStream,
    writer: Arc<Mutex<Writer>>,
    out: Vec<u8>,
    negotiated: Negotiated,
    decoder: DecoderConfig,
    ic_done: bool,
    ctrl: Option<Arc<Controller>>,
    qid: u16,
    queue_entries: u32,
    sqhd: u16,
    sq_flow_control: bool,
    pending: HashMap<u16, Pending>,
    waiting_r2t: VecDeque<u16>,
    inflight: usize,
    ready: Vec<Ready>,
    disconnect: bool,
}

impl<'a> Queue<'a> {
    fn new(
        shared: &'a Shared,
        reader: TcpStream,
        write_half: TcpStream,
        peer: SocketAddr,
    ) -> Queue<'a> {
        let limits = &shared.limits;
        let max_data = limits.in_capsule_data.max(limits.max_h2c_data);
        let decoder = DecoderConfig::controller(max_plen_for_data(max_data));
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
            negotiated: Negotiated::INITIAL,
            decoder,
            ic_done: false,
            ctrl: None,
            qid: 0,
            queue_entries: 1,
            sqhd: 0,
            sq_flow_control: true,
            pending: HashMap::new(),
            waiting_r2t: VecDeque::new(),
            inflight: 0,
            ready: Vec::new(),
            disconnect: false,
        }
    }

    fn run(&mut self) -> Result<(), ConnectionError> {
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
                Ok(0) if start == end => return Ok(()),
                Ok(0) => return Err(ConnectionError::Truncated),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            end += n;
            loop {
                let window = &buf[start..end];
                match decode_pdu(window, &self.decoder) {
                    Ok(Decoded::NeedMore(k)) => {
                        need = k;
                        break;
                    }
                    Ok(Decoded::Pdu { pdu, consumed }) => {
                        let header = term_req_error_data(window);
                        self.handle_pdu(pdu, header)?;
                        start += consumed;
                    }
                    Err(PduError::DataDigest {
                        pdu_type,
                        command_id,
                        consumed,
                        ..
                    }) => {
                        let last = window.get(1).is_some_and(|f| f & flags::LAST_PDU != 0);
                        self.data_digest_error(pdu_type, command_id, last);
                        start += consumed;
                    }
                    Err(err) => {
                        let data = term_req_error_data(window).to_vec();
                        let fes = err.fes().unwrap_or(Fes::InvalidHeaderField);
                        self.terminate(fes, err.fei(), &data);
                        return Err(err.into());
                    }
                }
                if start == end {
                    start = 0;
                    end = 0;
                    need = 1;
                    break;
                }
            }
            self.execute_ready();
            self.issue_r2ts();
            self.flush_out()?;
            if self.disconnect {
                return Ok(());
            }
            if buf.len() > RECV_BUFFER && start == end {
                buf.truncate(RECV_BUFFER);
                buf.shrink_to(RECV_BUFFER);
            }
        }
    }

    /// Sends a C2HTermReq (best effort) for a fatal error.
    fn terminate(&mut self, fes: Fes, fei: u32, header: &[u8]) {
        tracing::warn!(peer = %self.peer, fes = fes.code(), fei, "NVMe/TCP fatal PDU error: sending C2HTermReq");
        self.execute_ready();
        TermReq::new(fes, fei, header).encode(PduType::C2HTermReq, &mut self.out);
        let _ = self.flush_out();
    }

    fn protocol_error(
        &mut self,
        fes: Fes,
        fei: u32,
        header: &[u8],
        what: &'static str,
    ) -> ConnectionError {
        let header = header.to_vec();
        self.terminate(fes, fei, &header);
        ConnectionError::Protocol(what)
    }

    fn handle_pdu(&mut self, pdu: Pdu<'_>, header: &[u8]) -> Result<(), ConnectionError> {
        match pdu {
            Pdu::IcReq(req) => {
                if self.ic_done {
                    return Err(self.protocol_error(
                        Fes::PduSequenceError,
                        0,
                        header,
                        "second ICReq",
                    ));
                }
                let resp = IcResp {
                    pfv: PFV_1_0,
                    cpda: 0,
                    // Echo what the host asked for: Linux hosts refuse an
                    // ICResp whose digests differ from their request.
                    digests: req.digests,
                    maxh2cdata: self.shared.limits.max_h2c_data,
                };
                resp.encode(&mut self.out);
                self.negotiated = Negotiated::from_exchange(&req, &resp);
                self.decoder = self.decoder.with_negotiated(self.negotiated);
                self.ic_done = true;
                // The ICResp goes out with the old settings; later PDUs use
                // the new ones.
                self.flush_out()?;
                self.writer.lock().negotiated = self.negotiated;
                Ok(())
            }
            _ if !self.ic_done => {
                Err(self.protocol_error(Fes::PduSequenceError, 0, header, "PDU before ICReq"))
            }
            Pdu::H2CTermReq(t) => Err(ConnectionError::HostTerminated {
                fes: t.fes,
                fei: t.fei,
            }),
            Pdu::CapsuleCmd(cmd) => {
                self.command_received(cmd.sqe, cmd.data);
                Ok(())
            }
            Pdu::H2CData(d) => {
                let max = self.shared.limits.max_h2c_data as usize;
                if d.data.len() > max {
                    return Err(self.protocol_error(
                        Fes::DataTransferLimitExceeded,
                        0,
                        header,
                        "H2CData longer than MAXH2CDATA",
                    ));
                }
                let Some(p) = self.pending.get_mut(&d.cccid).filter(|p| p.r2t_sent) else {
                    return Err(self.protocol_error(
                        Fes::InvalidHeaderField,
                        8,
                        header,
                        "H2CData for no outstanding R2T",
                    ));
                };
                if d.ttag != d.cccid {
                    return Err(self.protocol_error(
                        Fes::InvalidHeaderField,
                        10,
                        header,
                        "H2CData with a wrong transfer tag",
                    ));
                }
                let offset = d.datao as usize;
                let end = offset.saturating_add(d.data.len());
                if offset != p.received || end > p.buf.len() {
                    return Err(self.protocol_error(
                        Fes::DataTransferOutOfRange,
                        12,
                        header,
                        "H2CData outside the requested range or out of order",
                    ));
                }
                p.buf[offset..end].copy_from_slice(d.data);
                p.received = end;
                let complete = end == p.buf.len();
                if complete != d.last {
                    return Err(self.protocol_error(
                        Fes::PduSequenceError,
                        1,
                        header,
                        "H2CData LAST_PDU flag does not match the transfer",
                    ));
                }
                if complete {
                    self.finish_pending(d.cccid);
                }
                Ok(())
            }
            Pdu::IcResp(_)
            | Pdu::C2HTermReq(_)
            | Pdu::CapsuleResp(_)
            | Pdu::C2HData(_)
            | Pdu::R2T(_) => Err(self.protocol_error(
                Fes::InvalidHeaderField,
                0,
                header,
                "controller-to-host PDU",
            )),
        }
    }

    fn finish_pending(&mut self, cid: u16) {
        if let Some(p) = self.pending.remove(&cid) {
            self.inflight -= p.buf.len();
            self.ready.push(Ready {
                sqe: p.sqe,
                data: p.buf,
                status: p.failed.then_some(Status::TRANSIENT_TRANSPORT_ERROR),
            });
        }
    }

    fn data_digest_error(&mut self, pdu_type: u8, cid: u16, last: bool) {
        tracing::warn!(peer = %self.peer, cid, "NVMe/TCP data digest error");
        if pdu_type == PduType::CapsuleCmd.code() {
            self.advance_sqhd();
            self.respond(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0);
        } else if let Some(p) = self.pending.get_mut(&cid) {
            p.failed = true;
            if last {
                self.finish_pending(cid);
            }
        }
    }

    fn advance_sqhd(&mut self) {
        self.sqhd = ((u32::from(self.sqhd) + 1) % self.queue_entries.max(1)) as u16;
    }

    /// A command capsule arrived: either it is ready, or its data must be
    /// fetched with an R2T.
    fn command_received(&mut self, sqe: Sqe, data: &[u8]) {
        self.advance_sqhd();
        if self.pending.contains_key(&sqe.cid) {
            self.respond(sqe.cid, Status::COMMAND_ID_CONFLICT.with_dnr(), 0);
            return;
        }
        let sgl = sqe.sgl();
        let host_to_controller = sqe.opcode & 0x03 == 0x01
            || (sqe.opcode == FABRICS_OPCODE && sqe.fctype() == fctype::CONNECT);
        let len = sgl.length as usize;
        let ready = |status| Ready {
            sqe,
            data: Vec::new(),
            status,
        };
        if !data.is_empty() {
            let status = match sgl.kind() {
                SglKind::InCapsule if sgl.address != 0 => Some(Status::SGL_OFFSET_INVALID),
                SglKind::InCapsule if len != data.len() => Some(Status::DATA_SGL_LENGTH_INVALID),
                SglKind::InCapsule if !host_to_controller => {
                    Some(Status::SGL_DESCRIPTOR_TYPE_INVALID)
                }
                SglKind::InCapsule
                    if data.len() > self.shared.limits.in_capsule_data.max(8192) as usize =>
                {
                    Some(Status::DATA_SGL_LENGTH_INVALID)
                }
                SglKind::InCapsule => None,
                _ => Some(Status::SGL_DESCRIPTOR_TYPE_INVALID),
            };
            self.ready.push(Ready {
                sqe,
                data: if status.is_none() {
                    data.to_vec()
                } else {
                    Vec::new()
                },
                status: status.map(Status::with_dnr),
            });
            return;
        }
        if !host_to_controller || len == 0 {
            self.ready.push(ready(None));
            return;
        }
        match sgl.kind() {
            SglKind::Transport => {}
            SglKind::InCapsule => {
                // Announced in-capsule data that is not there.
                self.ready
                    .push(ready(Some(Status::DATA_SGL_LENGTH_INVALID.with_dnr())));
                return;
            }
            SglKind::Other { .. } => {
                self.ready
                    .push(ready(Some(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr())));
                return;
            }
        }
        if len > self.shared.limits.max_transfer as usize {
            self.ready
                .push(ready(Some(Status::INVALID_FIELD.with_dnr())));
            return;
        }
        if self.pending.len() >= self.queue_entries as usize {
            self.ready.push(ready(Some(Status::COMMAND_INTERRUPTED)));
            return;
        }
        // Check the command before asking for its data where that is cheap.
        if let Some(status) = self.precheck_write(&sqe) {
            self.ready.push(ready(Some(status)));
            return;
        }
        self.pending.insert(
            sqe.cid,
            Pending {
                sqe,
                buf: Vec::new(),
                received: 0,
                r2t_sent: false,
                failed: false,
            },
        );
        self.waiting_r2t.push_back(sqe.cid);
    }

    /// Rejections of a write that do not need its data.
    fn precheck_write(&self, sqe: &Sqe) -> Option<Status> {
        if self.qid == 0 || sqe.opcode != io_opcode::WRITE {
            return None;
        }
        let ctrl = self.ctrl.as_ref()?;
        let volume = ctrl.volume()?;
        if let Command::Io(IoCommand::Write(rw)) = parse_command(sqe, QueueType::Io) {
            if rw.nsid != NSID {
                return Some(Status::INVALID_NAMESPACE.with_dnr());
            }
            let blocks = volume.size() / BLOCK_SIZE;
            if rw.end_lba().is_none_or(|e| e > blocks) {
                return Some(Status::LBA_OUT_OF_RANGE.with_dnr());
            }
        }
        None
    }

    /// Sends R2Ts for waiting commands while the in-flight budget allows
    /// (always at least one transfer at a time).
    fn issue_r2ts(&mut self) {
        let budget = self.shared.limits.max_inflight_per_queue;
        while let Some(&cid) = self.waiting_r2t.front() {
            let Some(p) = self.pending.get_mut(&cid) else {
                self.waiting_r2t.pop_front();
                continue;
            };
            let len = p.sqe.sgl().length as usize;
            if self.inflight > 0 && self.inflight + len > budget {
                break;
            }
            self.waiting_r2t.pop_front();
            p.buf = vec![0u8; len];
            p.r2t_sent = true;
            self.inflight += len;
            R2T {
                cccid: cid,
                ttag: cid,
                r2to: 0,
                r2tl: len as u32,
            }
            .encode(&self.negotiated, &mut self.out);
        }
    }

    fn flush_out(&mut self) -> Result<(), ConnectionError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let mut w = self.writer.lock();
        w.sqhd = self.sqhd;
        let r = w.stream.write_all(&self.out);
        drop(w);
        self.out.clear();
        if self.out.capacity() > 2 * MAX_OUT_BYTES {
            self.out.shrink_to(64 * 1024);
        }
        r.map_err(ConnectionError::from)
    }

    fn cqe_sqhd(&self) -> u16 {
        if self.sq_flow_control {
            self.sqhd
        } else {
            0xffff
        }
    }

    fn respond(&mut self, cid: u16, status: Status, result: u64) {
        let cqe = Cqe::new(cid, self.qid, self.cqe_sqhd(), status).with_result(result);
        CapsuleResp { cqe }.encode(&self.negotiated, &mut self.out);
    }

    /// Sends `data` in C2HData PDUs, then the completion (or sets SUCCESS
    /// on the last PDU when the host disabled SQ flow control).
    fn send_data(&mut self, cid: u16, data: &[u8]) {
        let chunk = self.shared.limits.max_h2c_data as usize;
        let success_flag = !self.sq_flow_control;
        let mut offset = 0;
        while offset < data.len() {
            let end = (offset + chunk).min(data.len());
            let piece = &data[offset..end];
            let last = end == data.len();
            let header = C2HDataHeader {
                cccid: cid,
                datao: offset as u32,
                datal: piece.len() as u32,
                last,
                success: last && success_flag,
            };
            if header.encode(&self.negotiated, &mut self.out).is_err() {
                break;
            }
            self.out.extend_from_slice(piece);
            if self.negotiated.digests.data {
                self.out
                    .extend_from_slice(&basalt_nvme_wire::digest::crc32c(piece).to_le_bytes());
            }
            offset = end;
        }
        if data.is_empty() || !success_flag {
            self.respond(cid, Status::SUCCESS, 0);
        }
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
        let ready = std::mem::take(&mut self.ready);
        let mut batch: Vec<BatchItem> = Vec::new();
        let mut batch_bytes = 0;
        for r in ready {
            let cid = r.sqe.cid;
            if let Some(status) = r.status {
                self.respond(cid, status, 0);
                continue;
            }
            if self.qid != 0 && self.ctrl.is_some() && r.sqe.opcode != FABRICS_OPCODE {
                if let Some(item) = self.as_batch_item(&r) {
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
                        Err(status) => self.respond(cid, status, 0),
                    }
                    continue;
                }
                self.run_batch(&mut batch);
                batch_bytes = 0;
            }
            let reply = self.execute(&r);
            self.reply(cid, reply);
            if self.out.len() >= MAX_OUT_BYTES {
                let _ = self.flush_out();
            }
        }
        self.run_batch(&mut batch);
    }

    /// A Read or Write that goes into the `submit` batch (or its error
    /// status); `None` for every other command.
    fn as_batch_item(&self, r: &Ready) -> Option<Result<BatchItem, Status>> {
        let (rw, write) = match parse_command(&r.sqe, QueueType::Io) {
            Command::Io(IoCommand::Read(rw)) => (rw, false),
            Command::Io(IoCommand::Write(rw)) => (rw, true),
            _ => return None,
        };
        let volume = self.ctrl.as_ref()?.volume()?;
        let check = || -> Result<BatchItem, Status> {
            if rw.nsid != NSID {
                return Err(Status::INVALID_NAMESPACE.with_dnr());
            }
            let blocks = volume.size() / BLOCK_SIZE;
            if rw.end_lba().is_none_or(|e| e > blocks) {
                return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
            }
            let bytes = u64::from(rw.blocks) * BLOCK_SIZE;
            if bytes > u64::from(self.shared.limits.max_transfer) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let sgl = r.sqe.sgl();
            if u64::from(sgl.length) != bytes {
                return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            }
            if !write && sgl.kind() != SglKind::Transport {
                return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr());
            }
            if write && r.data.len() as u64 != bytes {
                return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            }
            Ok(BatchItem {
                cid: r.sqe.cid,
                offset: rw.slba * BLOCK_SIZE,
                write,
                fua: rw.fua,
                buf: if write {
                    r.data.clone()
                } else {
                    vec![0u8; bytes as usize]
                },
            })
        };
        Some(check())
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
        }
    }

    /// Executes one non-batched command.
    fn execute(&mut self, r: &Ready) -> Reply {
        let queue_type = if self.qid == 0 {
            QueueType::Admin
        } else {
            QueueType::Io
        };
        let cmd = parse_command(&r.sqe, queue_type);
        if let Command::Fabrics(f) = cmd {
            return self.fabrics(f, r);
        }
        let Some(ctrl) = self.ctrl.clone() else {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        if !ctrl.state.lock().csts.rdy {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        }
        match cmd {
            Command::Admin(a) => self.admin(&ctrl, a, &r.sqe),
            Command::Io(io) => self.io(&ctrl, io, r),
            Command::Fabrics(_) => fail(Status::INTERNAL_ERROR),
        }
    }

    fn fabrics(&mut self, f: FabricsCommand, r: &Ready) -> Reply {
        match f {
            FabricsCommand::Connect(c) => self.connect(c, &r.data),
            FabricsCommand::PropertyGet(p) => {
                let Some(ctrl) = self.ctrl.clone().filter(|_| self.qid == 0) else {
                    return fail(Status::COMMAND_SEQUENCE_ERROR);
                };
                let limits = &self.shared.limits;
                let st = ctrl.state.lock();
                match Property::from_offset(p.offset) {
                    Some(Property::Cap) => {
                        let mut cap = Cap::fabrics(limits.max_queue_entries);
                        if ctrl.is_discovery() {
                            cap.css = Cap::CSS_NVM;
                        }
                        Reply::Result(cap.to_u64())
                    }
                    Some(Property::Vs) => Reply::Result(u64::from(Vs::V1_4.to_u32())),
                    Some(Property::Cc) => Reply::Result(u64::from(st.cc.to_u32())),
                    Some(Property::Csts) => Reply::Result(u64::from(st.csts.to_u32())),
                    Some(Property::Nssr) | None => fail(Status::INVALID_FIELD),
                }
            }
            FabricsCommand::PropertySet(p) => {
                let Some(ctrl) = self.ctrl.clone().filter(|_| self.qid == 0) else {
                    return fail(Status::COMMAND_SEQUENCE_ERROR);
                };
                match Property::from_offset(p.offset) {
                    Some(Property::Cc) => {
                        ctrl.set_cc(p.value as u32);
                        Reply::Status(Status::SUCCESS)
                    }
                    _ => fail(Status::INVALID_FIELD),
                }
            }
            FabricsCommand::Disconnect { .. } => {
                self.disconnect = true;
                Reply::Status(Status::SUCCESS)
            }
            FabricsCommand::AuthenticationSend(_)
            | FabricsCommand::AuthenticationReceive(_)
            | FabricsCommand::Other { .. } => fail(Status::INVALID_OPCODE),
        }
    }

    fn connect(&mut self, c: basalt_nvme_wire::fabrics::Connect, data: &[u8]) -> Reply {
        let invalid = |in_data: bool, offset: u16| {
            Reply::Result(u64::from(connect_invalid_parameter_result(in_data, offset)))
                .with_status(Status::CONNECT_INVALID_PARAMETERS.with_dnr())
        };
        if self.ctrl.is_some() {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        }
        if c.recfmt != 0 {
            return fail(Status::CONNECT_INCOMPATIBLE_FORMAT);
        }
        if data.len() < CONNECT_DATA_LEN {
            return fail(Status::DATA_SGL_LENGTH_INVALID);
        }
        let cd = match basalt_nvme_wire::ConnectData::parse(data) {
            Ok(cd) => cd,
            Err(basalt_nvme_wire::WireError::BadField { offset, .. }) => {
                return invalid(true, offset as u16)
            }
            Err(_) => return invalid(true, connect_data_offset::SUBNQN),
        };
        let limits = &self.shared.limits;
        if c.sqsize == 0 || c.queue_entries() > u32::from(limits.max_queue_entries) {
            return invalid(false, connect_sqe_offset::SQSIZE);
        }
        // The queue's socket, registered with the controller so that
        // tearing the controller down ends this connection too.
        let socket = match self.reader.try_clone() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(peer = %self.peer, "cannot register an NVMe queue: {e}");
                return fail(Status::INTERNAL_ERROR);
            }
        };
        let ctrl = if c.qid == 0 {
            if cd.cntlid != CNTLID_DYNAMIC && cd.cntlid != CNTLID_STATIC_ANY {
                return invalid(true, connect_data_offset::CNTLID);
            }
            let kind = if controller::is_discovery_nqn(&cd.subnqn) {
                Kind::Discovery
            } else {
                let Some(volume) = volume_of_nqn(&cd.subnqn) else {
                    return invalid(true, connect_data_offset::SUBNQN);
                };
                match self.shared.subsystems.open(&cd.hostnqn, volume) {
                    Ok(handle) => Kind::Io { volume: handle },
                    Err(OpenError::HostNotAllowed) => {
                        tracing::warn!(peer = %self.peer, hostnqn = %cd.hostnqn, subnqn = %cd.subnqn,
                            "NVMe Connect refused: host not allowed");
                        return fail(Status::CONNECT_INVALID_HOST);
                    }
                    Err(OpenError::NotFound) => {
                        tracing::info!(peer = %self.peer, subnqn = %cd.subnqn, "NVMe Connect to an unknown subsystem");
                        return invalid(true, connect_data_offset::SUBNQN);
                    }
                    Err(OpenError::Failed(e)) => {
                        tracing::error!(peer = %self.peer, subnqn = %cd.subnqn, "NVMe Connect failed: {e}");
                        return fail(Status::INTERNAL_ERROR);
                    }
                }
            };
            let ana_state = match &kind {
                Kind::Io { volume } => self.shared.subsystems.path_state(volume),
                Kind::Discovery => PathState::Optimized,
            };
            let made = self.shared.controllers.create(|id| {
                Controller::new(
                    id,
                    cd.subnqn.clone(),
                    cd.hostnqn.clone(),
                    cd.hostid,
                    kind,
                    c.kato,
                    ana_state,
                )
            });
            let Some(ctrl) = made else {
                return fail(Status::CONNECT_CONTROLLER_BUSY);
            };
            {
                let mut st = ctrl.state.lock();
                st.admin_writer = Some(Arc::clone(&self.writer));
                st.queues.insert(0, socket);
            }
            tracing::info!(peer = %self.peer, cntlid = ctrl.cntlid, subnqn = %cd.subnqn,
                hostnqn = %cd.hostnqn, kato_ms = c.kato, "NVMe controller created");
            ctrl
        } else {
            let Some(ctrl) = self.shared.controllers.get(cd.cntlid) else {
                return invalid(true, connect_data_offset::CNTLID);
            };
            if ctrl.subnqn != cd.subnqn {
                return invalid(true, connect_data_offset::SUBNQN);
            }
            if ctrl.hostnqn != cd.hostnqn {
                return invalid(true, connect_data_offset::HOSTNQN);
            }
            if ctrl.hostid != cd.hostid {
                return invalid(true, connect_data_offset::HOSTID);
            }
            if ctrl.is_discovery() {
                return invalid(false, connect_sqe_offset::QID);
            }
            let mut st = ctrl.state.lock();
            if !st.csts.rdy || st.dead {
                return fail(Status::COMMAND_SEQUENCE_ERROR);
            }
            let max = st.io_queues.unwrap_or(limits.max_io_queues);
            if c.qid > max || st.queues.contains_key(&c.qid) {
                return invalid(false, connect_sqe_offset::QID);
            }
            // Registered under the same lock that checked the controller
            // is alive, so a teardown cannot miss this queue.
            st.queues.insert(c.qid, socket);
            drop(st);
            ctrl
        };
        if let Err(e) = self.reader.set_read_timeout(None) {
            tracing::warn!(peer = %self.peer, "cannot clear the connect timeout: {e}");
        }
        self.qid = c.qid;
        self.queue_entries = c.queue_entries();
        self.sqhd %= self.queue_entries as u16;
        self.sq_flow_control = !c.disable_sq_flow_control();
        let cntlid = ctrl.cntlid;
        if c.qid != 0 {
            tracing::debug!(peer = %self.peer, cntlid, qid = c.qid, size = self.queue_entries, "NVMe I/O queue connected");
        }
        self.ctrl = Some(ctrl);
        Reply::Result(u64::from(connect_success_result(cntlid, 0)))
    }

    fn admin(&mut self, ctrl: &Arc<Controller>, a: AdminCommand, sqe: &Sqe) -> Reply {
        let discovery = ctrl.is_discovery();
        match a {
            AdminCommand::Identify(id) => self.identify(ctrl, id, sqe),
            AdminCommand::GetLogPage(g) => self.get_log_page(ctrl, g, sqe),
            AdminCommand::KeepAlive => {
                ctrl.state.lock().last_keep_alive = Instant::now();
                Reply::Status(Status::SUCCESS)
            }
            AdminCommand::SetFeatures(f) => {
                if f.save {
                    return fail(Status::FEATURE_NOT_SAVEABLE);
                }
                let mut st = ctrl.state.lock();
                match f.fid {
                    feature_id::NUMBER_OF_QUEUES if !discovery => {
                        let nsq = (f.cdw11 & 0xffff) as u16;
                        let ncq = (f.cdw11 >> 16) as u16;
                        if nsq == 0xffff || ncq == 0xffff {
                            return fail(Status::INVALID_FIELD);
                        }
                        if st.queues.len() > 1 {
                            return fail(Status::COMMAND_SEQUENCE_ERROR);
                        }
                        let max = self.shared.limits.max_io_queues;
                        let granted = (nsq.max(ncq).saturating_add(1)).min(max);
                        st.io_queues = Some(granted);
                        Reply::Result(u64::from(number_of_queues_result(granted, granted)))
                    }
                    feature_id::KEEP_ALIVE_TIMER => {
                        st.kato_ms = f.cdw11;
                        st.last_keep_alive = Instant::now();
                        Reply::Status(Status::SUCCESS)
                    }
                    feature_id::ASYNC_EVENT_CONFIG => {
                        st.async_event_config = f.cdw11;
                        Reply::Status(Status::SUCCESS)
                    }
                    feature_id::VOLATILE_WRITE_CACHE if !discovery => {
                        Reply::Status(Status::SUCCESS)
                    }
                    _ => fail(Status::INVALID_FIELD),
                }
            }
            AdminCommand::GetFeatures(f) => {
                let st = ctrl.state.lock();
                match f.fid {
                    feature_id::NUMBER_OF_QUEUES if !discovery => {
                        let n = st.io_queues.unwrap_or(self.shared.limits.max_io_queues);
                        Reply::Result(u64::from(number_of_queues_result(n, n)))
                    }
                    feature_id::KEEP_ALIVE_TIMER => Reply::Result(u64::from(st.kato_ms)),
                    feature_id::ASYNC_EVENT_CONFIG => {
                        Reply::Result(u64::from(st.async_event_config))
                    }
                    feature_id::VOLATILE_WRITE_CACHE if !discovery => Reply::Result(1),
                    _ => fail(Status::INVALID_FIELD),
                }
            }
            AdminCommand::AsyncEventRequest => {
                if ctrl.hold_aer(sqe.cid, usize::from(AER_LIMIT)) {
                    Reply::Held
                } else {
                    fail(Status::ASYNC_EVENT_LIMIT_EXCEEDED)
                }
            }
            // Nothing is ever long enough to abort: report "not aborted".
            AdminCommand::Abort(_) if !discovery => Reply::Result(1),
            AdminCommand::Abort(_) | AdminCommand::Other { .. } => fail(Status::INVALID_OPCODE),
        }
    }

    fn settings(&self) -> IdentifySettings {
        let limits = &self.shared.limits;
        IdentifySettings {
            in_capsule_data: limits.in_capsule_data,
            max_queue_entries: limits.max_queue_entries,
            mdts: (limits.max_transfer / 4096).trailing_zeros() as u8,
            aerl: AER_LIMIT - 1,
        }
    }

    fn identify(&mut self, ctrl: &Arc<Controller>, id: Identify, sqe: &Sqe) -> Reply {
        let page = match (id.cns, ctrl.volume()) {
            (cns::CONTROLLER, _) => controller::identify_controller(ctrl, &self.settings()),
            (cns::NAMESPACE, Some(v)) if id.nsid == NSID => controller::identify_namespace(v),
            (cns::NAMESPACE, Some(_)) => return fail(Status::INVALID_NAMESPACE),
            (cns::ACTIVE_NAMESPACES, Some(_)) => {
                if id.nsid >= 0xffff_fffe {
                    return fail(Status::INVALID_NAMESPACE);
                }
                Some(controller::active_namespaces(id.nsid))
            }
            (cns::NAMESPACE_ID_DESCRIPTORS, Some(v)) if id.nsid == NSID => {
                controller::namespace_descriptors(v)
            }
            (cns::NAMESPACE_ID_DESCRIPTORS, Some(_)) => return fail(Status::INVALID_NAMESPACE),
            // NVM command set specific structures: no limits to report.
            (cns::CSI_NAMESPACE | cns::CSI_CONTROLLER, Some(_)) if id.csi == 0 => {
                Some(vec![0u8; 4096])
            }
            _ => return fail(Status::INVALID_FIELD),
        };
        match page {
            Some(page) => data_reply(sqe, page),
            None => fail(Status::INTERNAL_ERROR),
        }
    }

    fn get_log_page(&mut self, ctrl: &Arc<Controller>, g: GetLogPage, sqe: &Sqe) -> Reply {
        let discovery = ctrl.is_discovery();
        let page = match g.lid {
            log_id::ERROR_INFORMATION => Some(controller::error_log()),
            log_id::SMART_HEALTH if !discovery => Some(controller::smart_log()),
            log_id::CHANGED_NAMESPACES if !discovery => Some(controller::changed_namespaces(ctrl)),
            log_id::ASYMMETRIC_NAMESPACE_ACCESS if !discovery => {
                controller::ana_log(ctrl, g.lsp & ANA_LSP_RETURN_GROUPS_ONLY != 0)
            }
            log_id::DISCOVERY if discovery => {
                let visible = self.shared.subsystems.visible(&ctrl.hostnqn);
                controller::discovery_log(&visible, self.shared.advertise)
            }
            _ => return fail(Status::INVALID_LOG_PAGE),
        };
        let Some(page) = page else {
            return fail(Status::INTERNAL_ERROR);
        };
        if g.offset_is_index || !g.offset.is_multiple_of(4) {
            return fail(Status::INVALID_FIELD);
        }
        let len = g.len().min(u64::from(self.shared.limits.max_transfer)) as usize;
        let mut out = vec![0u8; len];
        if copy_log_window(&page, g.offset, &mut out).is_err() {
            return fail(Status::INVALID_FIELD);
        }
        data_reply(sqe, out)
    }

    fn io(&mut self, ctrl: &Arc<Controller>, io: IoCommand, r: &Ready) -> Reply {
        let Some(volume) = ctrl.volume().cloned() else {
            return fail(Status::INVALID_OPCODE);
        };
        let blocks = volume.size() / BLOCK_SIZE;
        let result = match io {
            IoCommand::Flush { nsid } => {
                if nsid != NSID && nsid != 0xffff_ffff {
                    return fail(Status::INVALID_NAMESPACE);
                }
                volume.flush()
            }
            IoCommand::WriteZeroes(wz) => {
                if wz.nsid != NSID {
                    return fail(Status::INVALID_NAMESPACE);
                }
                if wz.end_lba().is_none_or(|e| e > blocks) {
                    return fail(Status::LBA_OUT_OF_RANGE);
                }
                volume.write_zeroes(
                    wz.slba * BLOCK_SIZE,
                    u64::from(wz.blocks) * BLOCK_SIZE,
                    wz.deallocate,
                    wz.fua,
                )
            }
            IoCommand::DatasetManagement(dsm) => {
                if dsm.nsid != NSID {
                    return fail(Status::INVALID_NAMESPACE);
                }
                if r.data.len() < dsm.data_len() {
                    return fail(Status::DATA_SGL_LENGTH_INVALID);
                }
                if !dsm.deallocate {
                    return Reply::Status(Status::SUCCESS);
                }
                let Ok(ranges) = parse_dsm_ranges(&r.data, dsm.ranges) else {
                    return fail(Status::DATA_SGL_LENGTH_INVALID);
                };
                let ranges: Vec<_> = ranges.collect();
                if ranges.iter().any(|rg| {
                    rg.slba
                        .checked_add(u64::from(rg.blocks))
                        .is_none_or(|e| e > blocks)
                }) {
                    return fail(Status::LBA_OUT_OF_RANGE);
                }
                ranges.iter().filter(|rg| rg.blocks > 0).try_for_each(|rg| {
                    volume.trim(
                        rg.slba * BLOCK_SIZE,
                        u64::from(rg.blocks) * BLOCK_SIZE,
                        false,
                    )
                })
            }
            IoCommand::Read(_) | IoCommand::Write(_) => {
                // Only reached when not batched (never for a connected I/O
                // queue).
                return fail(Status::INTERNAL_ERROR);
            }
            IoCommand::Other { .. } => return fail(Status::INVALID_OPCODE),
        };
        match result {
            Ok(()) => Reply::Status(Status::SUCCESS),
            Err(err) => {
                tracing::warn!(peer = %self.peer, cid = r.sqe.cid, "NVMe I/O failed: {err}");
                Reply::Status(io_status(&err))
            }
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

/// The completion status for a failed store operation.
fn io_status(err: &IoError) -> Status {
    match err {
        IoError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE.with_dnr(),
        IoError::NoSpace => Status::CAPACITY_EXCEEDED.with_dnr(),
        IoError::Io(_) => Status::WRITE_FAULT,
        IoError::Corrupt { .. } => Status::UNRECOVERED_READ_ERROR,
        IoError::Gone => Status::INVALID_NAMESPACE.with_dnr(),
        IoError::Failed => Status::INTERNAL_ERROR.with_dnr(),
        IoError::ReadOnly => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
    }
}
