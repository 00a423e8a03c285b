//! The NVMe/TCP transport of one queue, whoever drives its socket (a
//! queue thread, or an event loop): PDUs in, commands whose data is
//! complete out; R2Ts for write data that did not fit in the capsule;
//! responses and C2HData encoded for sending. No socket, no volume: bytes
//! and events in, values out.
//!
//! Invariants:
//! - A received command becomes exactly one [`Ready`] (possibly already
//!   failed: a bad SGL, a digest error, too many outstanding transfers) or
//!   one response encoded at once (a CID conflict, a data digest error of
//!   its capsule).
//! - A command waiting for H2CData holds a buffer of exactly its transfer
//!   length; the write data a queue holds is bounded by
//!   `ServerLimits::max_inflight_per_queue` (commands beyond it wait for
//!   their R2T, always at least one transfer at a time).
//! - H2CData must arrive in order, for an R2T sent, inside the transfer,
//!   with LAST_PDU on exactly its last PDU; anything else is fatal.
//! - Command and write data live in 4 KiB-aligned buffers from the
//!   queue's pool, so the store does O_DIRECT straight from them.

use crate::server::ServerLimits;
use crate::ConnectionError;
use basalt_loop_io::BufferPool;
use basalt_nvme_wire::decoder::max_plen_for_data;
use basalt_nvme_wire::fabrics::{fctype, FABRICS_OPCODE};
use basalt_nvme_wire::pdu::{flags, Fes, Negotiated, PduType, PFV_1_0};
use basalt_nvme_wire::{
    decode_pdu, term_req_error_data, C2HDataHeader, CapsuleResp, Cqe, Decoded, DecoderConfig,
    IcResp, Pdu, PduError, SglKind, Sqe, Status, R2T,
};
use basalt_store::AlignedBuf;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;

/// Write data being collected through R2T/H2CData.
struct Pending {
    sqe: Sqe,
    buf: Option<AlignedBuf>,
    received: usize,
    failed: bool,
}

/// A command whose data (if any) is complete.
pub(crate) struct Ready {
    pub sqe: Sqe,
    /// In-capsule or H2CData data (`None` for a command without).
    pub data: Option<AlignedBuf>,
    /// Set when the command already failed (digest error, bad SGL).
    pub status: Option<Status>,
}

/// A transport error that ends the connection.
pub(crate) struct Fatal {
    /// The C2HTermReq to send first: status, field offset, the offending
    /// PDU header (none when the host terminated).
    pub term: Option<(Fes, u32, Vec<u8>)>,
    pub error: ConnectionError,
}

impl Fatal {
    fn protocol(fes: Fes, fei: u32, header: &[u8], what: &'static str) -> Fatal {
        Fatal {
            term: Some((fes, fei, header.to_vec())),
            error: ConnectionError::Protocol(what),
        }
    }
}

/// What one call to [`Transport::receive`] did with its window.
pub(crate) struct Received {
    /// Bytes of whole PDUs consumed from the front of the window.
    pub consumed: usize,
    /// Bytes the next PDU needs at least beyond those left in the window.
    pub need: usize,
}

/// A piece of an encoded C2HData stream: bytes to send as they are, a
/// range of the read data (sent from its buffer), or the data digest of
/// such a range (the CRC32C of those bytes, little-endian).
pub(crate) enum Part<'a> {
    Bytes(&'a [u8]),
    Data(Range<usize>),
    Digest(Range<usize>),
}

/// The transport state of one queue.
pub(crate) struct Transport {
    limits: ServerLimits,
    peer: SocketAddr,
    pub negotiated: Negotiated,
    decoder: DecoderConfig,
    pub ic_done: bool,
    pub qid: u16,
    pub queue_entries: u32,
    sqhd: u16,
    pub sq_flow_control: bool,
    pending: HashMap<u16, Pending>,
    waiting_r2t: VecDeque<u16>,
    /// Write data held by commands whose R2T was sent.
    inflight: usize,
    pub ready: Vec<Ready>,
    pub pool: BufferPool,
    scratch: Vec<u8>,
}

impl Transport {
    pub fn new(limits: ServerLimits, peer: SocketAddr) -> Transport {
        let max_data = limits.in_capsule_data.max(limits.max_h2c_data);
        Transport {
            limits,
            peer,
            negotiated: Negotiated::INITIAL,
            decoder: DecoderConfig::controller(max_plen_for_data(max_data)),
            ic_done: false,
            qid: 0,
            queue_entries: 1,
            sqhd: 0,
            sq_flow_control: true,
            pending: HashMap::new(),
            waiting_r2t: VecDeque::new(),
            inflight: 0,
            ready: Vec::new(),
            pool: BufferPool::new(),
            scratch: Vec::new(),
        }
    }

    /// The queue is connected: its size and flow control.
    pub fn connected(&mut self, qid: u16, queue_entries: u32, sq_flow_control: bool) {
        self.qid = qid;
        self.queue_entries = queue_entries;
        self.sqhd %= queue_entries.max(1) as u16;
        self.sq_flow_control = sq_flow_control;
    }

    /// Decodes every whole PDU at the front of `window`, encoding into
    /// `out` what must be sent at once (ICResp, failures of capsules).
    /// `volume_blocks`: the namespace size of a connected I/O queue, to
    /// refuse a write before fetching its data.
    pub fn receive(
        &mut self,
        window: &[u8],
        out: &mut Vec<u8>,
        volume_blocks: Option<u64>,
    ) -> Result<Received, Fatal> {
        let mut start = 0;
        loop {
            let rest = &window[start..];
            if rest.is_empty() {
                return Ok(Received {
                    consumed: start,
                    need: 1,
                });
            }
            match decode_pdu(rest, &self.decoder) {
                Ok(Decoded::NeedMore(need)) => {
                    return Ok(Received {
                        consumed: start,
                        need,
                    })
                }
                Ok(Decoded::Pdu { pdu, consumed }) => {
                    let header = term_req_error_data(rest);
                    self.handle_pdu(pdu, header, out, volume_blocks)?;
                    start += consumed;
                }
                Err(PduError::DataDigest {
                    pdu_type,
                    command_id,
                    consumed,
                    ..
                }) => {
                    let last = rest.get(1).is_some_and(|f| f & flags::LAST_PDU != 0);
                    self.data_digest_error(pdu_type, command_id, last, out);
                    start += consumed;
                }
                Err(err) => {
                    let fes = err.fes().unwrap_or(Fes::InvalidHeaderField);
                    return Err(Fatal {
                        term: Some((fes, err.fei(), term_req_error_data(rest).to_vec())),
                        error: err.into(),
                    });
                }
            }
        }
    }

    fn handle_pdu(
        &mut self,
        pdu: Pdu<'_>,
        header: &[u8],
        out: &mut Vec<u8>,
        volume_blocks: Option<u64>,
    ) -> Result<(), Fatal> {
        match pdu {
            Pdu::IcReq(req) => {
                if self.ic_done {
                    return Err(Fatal::protocol(
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
                    maxh2cdata: self.limits.max_h2c_data,
                };
                // The ICResp goes out with the old settings; later PDUs use
                // the new ones.
                resp.encode(out);
                self.negotiated = Negotiated::from_exchange(&req, &resp);
                self.decoder = self.decoder.with_negotiated(self.negotiated);
                self.ic_done = true;
                Ok(())
            }
            _ if !self.ic_done => Err(Fatal::protocol(
                Fes::PduSequenceError,
                0,
                header,
                "PDU before ICReq",
            )),
            Pdu::H2CTermReq(t) => Err(Fatal {
                term: None,
                error: ConnectionError::HostTerminated {
                    fes: t.fes,
                    fei: t.fei,
                },
            }),
            Pdu::CapsuleCmd(cmd) => {
                self.command_received(cmd.sqe, cmd.data, out, volume_blocks);
                Ok(())
            }
            Pdu::H2CData(d) => {
                let max = self.limits.max_h2c_data as usize;
                if d.data.len() > max {
                    return Err(Fatal::protocol(
                        Fes::DataTransferLimitExceeded,
                        0,
                        header,
                        "H2CData longer than MAXH2CDATA",
                    ));
                }
                let Some(p) = self.pending.get_mut(&d.cccid).filter(|p| p.buf.is_some()) else {
                    return Err(Fatal::protocol(
                        Fes::InvalidHeaderField,
                        8,
                        header,
                        "H2CData for no outstanding R2T",
                    ));
                };
                if d.ttag != d.cccid {
                    return Err(Fatal::protocol(
                        Fes::InvalidHeaderField,
                        10,
                        header,
                        "H2CData with a wrong transfer tag",
                    ));
                }
                let offset = d.datao as usize;
                let end = offset.saturating_add(d.data.len());
                let len = p.buf.as_ref().map_or(0, |b| b.len());
                if offset != p.received || end > len {
                    return Err(Fatal::protocol(
                        Fes::DataTransferOutOfRange,
                        12,
                        header,
                        "H2CData outside the requested range or out of order",
                    ));
                }
                if let Some(buf) = p.buf.as_mut() {
                    buf[offset..end].copy_from_slice(d.data);
                }
                p.received = end;
                let complete = end == len;
                if complete != d.last {
                    return Err(Fatal::protocol(
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
            | Pdu::R2T(_) => Err(Fatal::protocol(
                Fes::InvalidHeaderField,
                0,
                header,
                "controller-to-host PDU",
            )),
        }
    }

    fn finish_pending(&mut self, cid: u16) {
        if let Some(p) = self.pending.remove(&cid) {
            self.inflight -= p.buf.as_ref().map_or(0, |b| b.len());
            self.ready.push(Ready {
                sqe: p.sqe,
                data: p.buf,
                status: p.failed.then_some(Status::TRANSIENT_TRANSPORT_ERROR),
            });
        }
    }

    fn data_digest_error(&mut self, pdu_type: u8, cid: u16, last: bool, out: &mut Vec<u8>) {
        tracing::warn!(peer = %self.peer, cid, "NVMe/TCP data digest error");
        if pdu_type == PduType::CapsuleCmd.code() {
            self.advance_sqhd();
            self.respond(out, cid, Status::TRANSIENT_TRANSPORT_ERROR, 0);
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
    fn command_received(
        &mut self,
        sqe: Sqe,
        data: &[u8],
        out: &mut Vec<u8>,
        volume_blocks: Option<u64>,
    ) {
        self.advance_sqhd();
        if self.pending.contains_key(&sqe.cid) {
            self.respond(out, sqe.cid, Status::COMMAND_ID_CONFLICT.with_dnr(), 0);
            return;
        }
        let sgl = sqe.sgl();
        let host_to_controller = sqe.opcode & 0x03 == 0x01
            || (sqe.opcode == FABRICS_OPCODE
                && matches!(sqe.fctype(), fctype::CONNECT | fctype::AUTHENTICATION_SEND));
        let len = sgl.length as usize;
        let failed = |status: Status| Ready {
            sqe,
            data: None,
            status: Some(status),
        };
        if !data.is_empty() {
            let status = match sgl.kind() {
                SglKind::InCapsule if sgl.address != 0 => Some(Status::SGL_OFFSET_INVALID),
                SglKind::InCapsule if len != data.len() => Some(Status::DATA_SGL_LENGTH_INVALID),
                SglKind::InCapsule if !host_to_controller => {
                    Some(Status::SGL_DESCRIPTOR_TYPE_INVALID)
                }
                SglKind::InCapsule
                    if data.len() > self.limits.in_capsule_data.max(8192) as usize =>
                {
                    Some(Status::DATA_SGL_LENGTH_INVALID)
                }
                SglKind::InCapsule => None,
                _ => Some(Status::SGL_DESCRIPTOR_TYPE_INVALID),
            };
            let ready = match status {
                Some(status) => failed(status.with_dnr()),
                None => {
                    let mut buf = self.pool.take(data.len());
                    buf.copy_from_slice(data);
                    Ready {
                        sqe,
                        data: Some(buf),
                        status: None,
                    }
                }
            };
            self.ready.push(ready);
            return;
        }
        if !host_to_controller || len == 0 {
            self.ready.push(Ready {
                sqe,
                data: None,
                status: None,
            });
            return;
        }
        let refused = match sgl.kind() {
            SglKind::Transport => None,
            // Announced in-capsule data that is not there.
            SglKind::InCapsule => Some(Status::DATA_SGL_LENGTH_INVALID.with_dnr()),
            SglKind::Other { .. } => Some(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
        }
        .or_else(|| {
            (len > self.limits.max_transfer as usize).then_some(Status::INVALID_FIELD.with_dnr())
        })
        .or_else(|| {
            (self.pending.len() >= self.queue_entries as usize)
                .then_some(Status::COMMAND_INTERRUPTED)
        })
        // Check the command before asking for its data where that is cheap.
        .or_else(|| crate::io_commands::precheck_write(&sqe, self.qid, volume_blocks));
        if let Some(status) = refused {
            self.ready.push(failed(status));
            return;
        }
        self.pending.insert(
            sqe.cid,
            Pending {
                sqe,
                buf: None,
                received: 0,
                failed: false,
            },
        );
        self.waiting_r2t.push_back(sqe.cid);
    }

    /// Sends R2Ts for waiting commands while the in-flight budget allows
    /// (always at least one transfer at a time).
    pub fn issue_r2ts(&mut self, out: &mut Vec<u8>) {
        let budget = self.limits.max_inflight_per_queue;
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
            p.buf = Some(self.pool.take(len));
            self.inflight += len;
            R2T {
                cccid: cid,
                ttag: cid,
                r2to: 0,
                r2tl: len as u32,
            }
            .encode(&self.negotiated, out);
        }
    }

    /// No command is waiting for data or to be run.
    pub fn is_quiet(&self) -> bool {
        self.pending.is_empty() && self.ready.is_empty()
    }

    /// The SQ head pointer a completion reports.
    pub fn cqe_sqhd(&self) -> u16 {
        if self.sq_flow_control {
            self.sqhd
        } else {
            0xffff
        }
    }

    /// Encodes a completion.
    pub fn respond(&self, out: &mut Vec<u8>, cid: u16, status: Status, result: u64) {
        let cqe = Cqe::new(cid, self.qid, self.cqe_sqhd(), status).with_result(result);
        CapsuleResp { cqe }.encode(&self.negotiated, out);
    }

    /// Encodes `len` bytes of read data as C2HData PDUs, then the
    /// completion (or sets SUCCESS on the last PDU when the host disabled
    /// SQ flow control); `emit` gets the pieces in order.
    pub fn c2h_data(&mut self, cid: u16, len: usize, mut emit: impl FnMut(Part<'_>)) {
        let chunk = self.limits.max_h2c_data as usize;
        let success_flag = !self.sq_flow_control;
        let mut offset = 0;
        let mut scratch = std::mem::take(&mut self.scratch);
        while offset < len {
            let end = (offset + chunk).min(len);
            let last = end == len;
            let header = C2HDataHeader {
                cccid: cid,
                datao: offset as u32,
                datal: (end - offset) as u32,
                last,
                success: last && success_flag,
            };
            scratch.clear();
            if header.encode(&self.negotiated, &mut scratch).is_err() {
                break;
            }
            emit(Part::Bytes(&scratch));
            emit(Part::Data(offset..end));
            if self.negotiated.digests.data {
                emit(Part::Digest(offset..end));
            }
            offset = end;
        }
        if len == 0 || !success_flag {
            scratch.clear();
            self.respond(&mut scratch, cid, Status::SUCCESS, 0);
            emit(Part::Bytes(&scratch));
        }
        self.scratch = scratch;
    }
}
