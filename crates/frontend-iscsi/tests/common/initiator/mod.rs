//! A small blocking iSCSI initiator built only on basalt-iscsi-wire,
//! talking to a target over a real TCP socket: login (security stage with
//! optional CHAP, operational keys), SCSI commands with immediate data,
//! unsolicited Data-Out and Data-Out after R2T, Data-In reassembly,
//! pipelining within the target's command window, NOP-Out, task
//! management, logout, and raw bytes.
//!
//! It checks the target as it goes and panics on any violation: StatSN in
//! order on every status, every task answered exactly once (nothing for an
//! unknown or aborted task), Data-In and R2Ts in order and in bounds, the
//! read length consistent with the residual, and the command window obeyed
//! (a command is sent only while CmdSN <= MaxCmdSN).

#![allow(dead_code)]

use basalt_iscsi_wire::decoder::{decode_target, Decoded, DecoderConfig};
use basalt_iscsi_wire::pdu::{
    sn_gt, DataIn, DataOut, InitiatorPdu, LogoutReason, LogoutRequest, LogoutResponseCode, NopOut,
    ReadyToTransfer, Residual, ScsiCommand, ScsiResponse, TargetPdu, TaskAttribute,
    TaskManagementRequest, TmfFunction, TmfResponse, RESERVED_TAG,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

mod login;

pub use super::scsi::*;
pub use login::*;

/// How long one read may block before the test fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// The CmdSN a session starts at: close to the wrap, so that sessions
/// cross it.
pub const FIRST_CMD_SN: u32 = 0xffff_fff8;

/// A PDU received from the target, with its data segment.
#[derive(Debug, Clone)]
pub struct Rx {
    pub pdu: TargetPdu,
    pub data: Vec<u8>,
}

/// A SCSI command to send.
#[derive(Debug, Clone)]
pub struct Command {
    pub cdb: Vec<u8>,
    /// Data-Out (sets W and the expected length).
    pub write: Vec<u8>,
    /// Data-In expected (sets R and the expected length).
    pub read_len: u32,
}

impl Command {
    pub fn none(cdb: Vec<u8>) -> Command {
        Command {
            cdb,
            write: Vec::new(),
            read_len: 0,
        }
    }
    pub fn read(cdb: Vec<u8>, read_len: u32) -> Command {
        Command {
            cdb,
            write: Vec::new(),
            read_len,
        }
    }
    pub fn write(cdb: Vec<u8>, data: Vec<u8>) -> Command {
        Command {
            cdb,
            write: data,
            read_len: 0,
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub itt: u32,
    /// The iSCSI response code (0: command completed at target).
    pub response: u8,
    pub status: u8,
    pub sense: Vec<u8>,
    pub data: Vec<u8>,
    pub residual: Residual,
    pub r2ts: u32,
    pub data_in_pdus: u32,
    pub data_out_pdus: u32,
}

impl Outcome {
    pub fn ok(&self) -> &Outcome {
        assert!(
            self.response == 0 && self.status == STATUS_GOOD,
            "task {:#x} failed: response {}, status {:#04x}, sense {:02x?}",
            self.itt,
            self.response,
            self.status,
            self.sense
        );
        self
    }

    /// Asserts CHECK CONDITION with this sense key, ASC and ASCQ.
    pub fn check(&self, key: u8, asc: u8, ascq: u8) {
        assert_eq!(
            (self.response, self.status),
            (0, STATUS_CHECK_CONDITION),
            "task {:#x}: expected CHECK CONDITION {key:x}/{asc:02x}/{ascq:02x}",
            self.itt
        );
        assert_eq!(
            sense_triple(&self.sense),
            (key, asc, ascq),
            "task {:#x}",
            self.itt
        );
    }
}

/// A task sent and not answered yet.
struct Task {
    write: Vec<u8>,
    read_len: u32,
    data: Vec<u8>,
    /// Bytes of Data-Out sent (contiguous from 0).
    sent: u32,
    next_r2t_sn: u32,
    next_data_sn: u32,
    received: u32,
    /// Data-In bytes of the current sequence (up to its F bit).
    in_burst: u32,
    r2ts: u32,
    data_in_pdus: u32,
    data_out_pdus: u32,
}

/// One connection (one session: MaxConnections=1).
pub struct Initiator {
    pub stream: TcpStream,
    buf: Vec<u8>,
    decoder: DecoderConfig,
    pub negotiated: Negotiated,
    pub tsih: u16,
    pub isid: [u8; 6],
    cmd_sn: u32,
    exp_stat_sn: u32,
    max_cmd_sn: u32,
    /// Whether a StatSN has been seen (the first one is the target's pick).
    synced: bool,
    next_itt: u32,
    tasks: HashMap<u32, Task>,
    done: VecDeque<Outcome>,
    /// Tasks ended by task management: nothing more may come for them.
    aborted: HashSet<u32>,
    /// PDUs that belong to no SCSI task (NOP-In, TMF and logout responses,
    /// Rejects, asynchronous messages), in arrival order.
    pub other: VecDeque<Rx>,
    /// Bytes kept by [`Initiator::hold`].
    held: Option<Vec<u8>>,
}

impl Initiator {
    /// A TCP connection to `addr` (read timeout [`READ_TIMEOUT`]).
    pub fn connect_raw(addr: SocketAddr) -> TcpStream {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    // ------------------------------------------------------------ wire

    /// Sends raw bytes (or keeps them while held).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        match self.held.as_mut() {
            Some(held) => held.extend_from_slice(bytes),
            None => self.stream.write_all(bytes).expect("send"),
        }
    }

    /// Keeps what is sent from now on until the next receive, which sends
    /// it all at once (so that the target gets it in one read).
    pub fn hold(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    fn release(&mut self) {
        if let Some(held) = self.held.take() {
            self.send_raw(&held);
        }
    }

    /// Encodes a PDU with the negotiated digests.
    pub fn encode(&self, pdu: &InitiatorPdu, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        pdu.encode(data, self.negotiated.digests, &mut out).unwrap();
        out
    }

    pub fn send_pdu(&mut self, pdu: &InitiatorPdu, data: &[u8]) {
        let bytes = self.encode(pdu, data);
        self.send_raw(&bytes);
    }

    /// Receives one PDU; `None` once the target closed the connection.
    /// Panics when nothing comes for [`READ_TIMEOUT`] or the PDU is
    /// malformed.
    pub fn recv(&mut self) -> Option<Rx> {
        self.release();
        loop {
            match decode_target(&self.buf, &self.decoder) {
                Ok(Decoded::Pdu {
                    pdu,
                    data,
                    consumed,
                }) => {
                    let data = self.buf[data].to_vec();
                    self.buf.drain(..consumed);
                    return Some(Rx { pdu, data });
                }
                Ok(Decoded::NeedMore(_)) => {
                    let mut chunk = vec![0u8; 256 * 1024];
                    match self.stream.read(&mut chunk) {
                        Ok(0) => return None,
                        Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                        {
                            panic!("nothing from the target for {READ_TIMEOUT:?}")
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => return None,
                    }
                }
                Err(e) => panic!("the target sent a malformed PDU: {e}"),
            }
        }
    }

    /// Waits for the target to close the connection; returns the PDUs
    /// received before.
    pub fn wait_closed(&mut self) -> Vec<Rx> {
        let mut got = Vec::new();
        while let Some(rx) = self.recv() {
            got.push(rx);
        }
        got
    }

    fn itt(&mut self) -> u32 {
        let itt = self.next_itt;
        self.next_itt = match self.next_itt.wrapping_add(1) {
            RESERVED_TAG => 1,
            n => n,
        };
        itt
    }

    /// A StatSN-bearing PDU: in order.
    fn status_sn(&mut self, stat_sn: u32, what: &str) {
        assert_eq!(stat_sn, self.exp_stat_sn, "StatSN of {what}");
        self.exp_stat_sn = self.exp_stat_sn.wrapping_add(1);
    }

    fn window(&mut self, max_cmd_sn: u32) {
        if sn_gt(max_cmd_sn, self.max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
        }
    }

    // ------------------------------------------------------------ receive

    /// Receives one PDU and applies it; `false` on EOF.
    fn pump(&mut self) -> bool {
        let Some(rx) = self.recv() else {
            return false;
        };
        self.apply(rx);
        true
    }

    fn apply(&mut self, rx: Rx) {
        let itt = rx.pdu.itt();
        assert!(
            !self.aborted.contains(&itt) || itt == RESERVED_TAG,
            "a PDU for task {itt:#x}, which task management ended: {:?}",
            rx.pdu
        );
        match &rx.pdu {
            TargetPdu::DataIn(d) => {
                self.window(d.max_cmd_sn);
                self.data_in(d, &rx.data);
            }
            TargetPdu::ScsiResponse(r) => {
                self.window(r.max_cmd_sn);
                self.status_sn(r.stat_sn, "SCSI Response");
                self.scsi_response(r, &rx.data);
            }
            TargetPdu::ReadyToTransfer(r) => {
                self.window(r.max_cmd_sn);
                assert_eq!(
                    r.stat_sn, self.exp_stat_sn,
                    "an R2T carries the next StatSN"
                );
                self.r2t(r);
            }
            TargetPdu::NopIn(n) => {
                self.window(n.max_cmd_sn);
                if n.itt != RESERVED_TAG {
                    self.status_sn(n.stat_sn, "NOP-In");
                    self.other.push_back(rx);
                } else if n.ttt != RESERVED_TAG {
                    // The target's ping: answer it.
                    let pong = InitiatorPdu::NopOut(NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    });
                    self.send_pdu(&pong, &[]);
                }
            }
            TargetPdu::TaskManagementResponse(t) => {
                self.window(t.max_cmd_sn);
                self.status_sn(t.stat_sn, "TMF Response");
                self.other.push_back(rx);
            }
            TargetPdu::LogoutResponse(l) => {
                self.window(l.max_cmd_sn);
                self.status_sn(l.stat_sn, "Logout Response");
                self.other.push_back(rx);
            }
            TargetPdu::TextResponse(t) => {
                self.window(t.max_cmd_sn);
                self.status_sn(t.stat_sn, "Text Response");
                self.other.push_back(rx);
            }
            TargetPdu::Reject(r) => {
                self.window(r.max_cmd_sn);
                self.status_sn(r.stat_sn, "Reject");
                self.other.push_back(rx);
            }
            TargetPdu::AsyncMessage(a) => {
                self.window(a.max_cmd_sn);
                self.status_sn(a.stat_sn, "Asynchronous Message");
                self.other.push_back(rx);
            }
            TargetPdu::LoginResponse(_) => panic!("Login Response in full-feature phase"),
        }
    }

    fn task(&mut self, itt: u32, what: &str) -> &mut Task {
        self.tasks
            .get_mut(&itt)
            .unwrap_or_else(|| panic!("{what} for task {itt:#x}, which is not outstanding"))
    }

    fn data_in(&mut self, d: &DataIn, data: &[u8]) {
        let max_burst = self.negotiated.max_burst;
        let task = self.task(d.itt, "Data-In");
        assert_eq!(d.data_sn, task.next_data_sn, "Data-In DataSN in order");
        assert_eq!(d.buffer_offset, task.received, "Data-In offsets contiguous");
        let end = task.received + data.len() as u32;
        assert!(end <= task.read_len, "Data-In beyond the expected length");
        task.in_burst += data.len() as u32;
        assert!(
            task.in_burst <= max_burst,
            "Data-In sequence beyond MaxBurstLength"
        );
        if d.final_pdu {
            task.in_burst = 0;
        }
        task.data[task.received as usize..end as usize].copy_from_slice(data);
        task.received = end;
        task.next_data_sn += 1;
        task.data_in_pdus += 1;
        if let Some(status) = d.status {
            assert!(d.final_pdu, "status only in a final Data-In");
            self.status_sn(status.stat_sn, "Data-In with status");
            let task = self.tasks.remove(&d.itt).unwrap();
            self.finish(d.itt, task, 0, status.status, Vec::new(), status.residual);
        }
    }

    fn scsi_response(&mut self, r: &ScsiResponse, data: &[u8]) {
        let task = self
            .tasks
            .remove(&r.itt)
            .unwrap_or_else(|| panic!("SCSI Response for task {:#x}, not outstanding", r.itt));
        let sense = match data.len() {
            0 => Vec::new(),
            _ => {
                let n = usize::from(u16::from_be_bytes([data[0], data[1]]));
                data[2..2 + n].to_vec()
            }
        };
        self.finish(r.itt, task, r.response, r.status, sense, r.residual);
    }

    fn finish(
        &mut self,
        itt: u32,
        mut task: Task,
        response: u8,
        status: u8,
        sense: Vec<u8>,
        residual: Residual,
    ) {
        if response == 0 && status == STATUS_GOOD && task.read_len > 0 {
            let expected = match residual {
                Residual::Underflow(n) => task.read_len - n,
                _ => task.read_len,
            };
            assert_eq!(task.received, expected, "read length and residual agree");
        }
        task.data.truncate(task.received as usize);
        self.done.push_back(Outcome {
            itt,
            response,
            status,
            sense,
            data: task.data,
            residual,
            r2ts: task.r2ts,
            data_in_pdus: task.data_in_pdus,
            data_out_pdus: task.data_out_pdus,
        });
    }

    fn r2t(&mut self, r: &ReadyToTransfer) {
        let (segment, max_burst) = (
            self.negotiated.target_max_recv_data_segment,
            self.negotiated.max_burst,
        );
        let exp_stat_sn = self.exp_stat_sn;
        let digests = self.negotiated.digests;
        let task = self.task(r.itt, "R2T");
        assert_eq!(r.r2t_sn, task.next_r2t_sn, "R2TSN in order");
        assert_eq!(r.buffer_offset, task.sent, "R2T asks for the next bytes");
        let end = r.buffer_offset + r.desired_data_transfer_length;
        assert!(r.desired_data_transfer_length > 0 && r.desired_data_transfer_length <= max_burst);
        assert!(end as usize <= task.write.len(), "R2T beyond the data");
        task.next_r2t_sn += 1;
        task.r2ts += 1;
        let mut out = Vec::new();
        let mut at = r.buffer_offset;
        let mut data_sn = 0;
        while at < end {
            let n = (end - at).min(segment);
            let pdu = InitiatorPdu::DataOut(DataOut {
                final_pdu: at + n == end,
                lun: r.lun,
                itt: r.itt,
                ttt: r.ttt,
                exp_stat_sn,
                data_sn,
                buffer_offset: at,
            });
            pdu.encode(
                &task.write[at as usize..(at + n) as usize],
                digests,
                &mut out,
            )
            .unwrap();
            task.data_out_pdus += 1;
            data_sn += 1;
            at += n;
        }
        task.sent = end;
        self.send_raw(&out);
    }

    // ------------------------------------------------------------ commands

    /// Sends a SCSI command (waiting for the command window to open), with
    /// its immediate data and unsolicited Data-Out; returns its ITT.
    pub fn submit(&mut self, cmd: Command) -> u32 {
        while sn_gt(self.cmd_sn, self.max_cmd_sn) {
            assert!(self.pump(), "connection closed while the window was shut");
        }
        let itt = self.itt();
        let n = &self.negotiated;
        let len = cmd.write.len() as u32;
        let segment = n.target_max_recv_data_segment;
        let unsolicited = match (n.initial_r2t, n.immediate_data) {
            (false, _) => n.first_burst.min(len),
            (true, true) => n.first_burst.min(segment).min(len),
            (true, false) => 0,
        };
        let immediate = match n.immediate_data {
            true => unsolicited.min(segment),
            false => 0,
        };
        let mut bhs_cdb = [0u8; 16];
        bhs_cdb[..cmd.cdb.len().min(16)].copy_from_slice(&cmd.cdb[..cmd.cdb.len().min(16)]);
        let pdu = InitiatorPdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_pdu: immediate == unsolicited,
            read: cmd.read_len > 0,
            write: len > 0,
            attr: TaskAttribute::Simple,
            lun: 0,
            itt,
            expected_data_transfer_length: len.max(cmd.read_len),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            bhs_cdb,
            extended_cdb: cmd.cdb.get(16..).unwrap_or(&[]).to_vec(),
            bidi_read_expected_data_transfer_length: None,
        });
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        let mut out = self.encode(&pdu, &cmd.write[..immediate as usize]);
        let mut at = immediate;
        let mut data_sn = 0;
        let mut data_out_pdus = 0;
        while at < unsolicited {
            let n = (unsolicited - at).min(segment);
            let pdu = InitiatorPdu::DataOut(DataOut {
                final_pdu: at + n == unsolicited,
                lun: 0,
                itt,
                ttt: RESERVED_TAG,
                exp_stat_sn: self.exp_stat_sn,
                data_sn,
                buffer_offset: at,
            });
            out.extend(self.encode(&pdu, &cmd.write[at as usize..(at + n) as usize]));
            data_sn += 1;
            data_out_pdus += 1;
            at += n;
        }
        self.tasks.insert(
            itt,
            Task {
                data: vec![0; cmd.read_len as usize],
                read_len: cmd.read_len,
                write: cmd.write,
                sent: unsolicited,
                next_r2t_sn: 0,
                next_data_sn: 0,
                received: 0,
                in_burst: 0,
                r2ts: 0,
                data_in_pdus: 0,
                data_out_pdus,
            },
        );
        self.send_raw(&out);
        itt
    }

    /// Commands sent and not answered.
    pub fn outstanding(&self) -> usize {
        self.tasks.len()
    }

    /// The next command to finish (in the order the target answers).
    pub fn next_outcome(&mut self) -> Outcome {
        loop {
            if let Some(done) = self.done.pop_front() {
                return done;
            }
            assert!(!self.tasks.is_empty(), "no command outstanding");
            assert!(self.pump(), "connection closed with commands outstanding");
            if let Some(rx) = self
                .other
                .iter()
                .find(|r| matches!(r.pdu, TargetPdu::Reject(_)))
            {
                panic!("Reject while commands were outstanding: {:?}", rx);
            }
        }
    }

    /// Sends every command (pipelined) and waits for all; outcomes in the
    /// commands' order.
    pub fn run(&mut self, cmds: Vec<Command>) -> Vec<Outcome> {
        let itts: Vec<u32> = cmds.into_iter().map(|c| self.submit(c)).collect();
        let mut by_itt = HashMap::new();
        while by_itt.len() < itts.len() {
            let o = self.next_outcome();
            assert!(itts.contains(&o.itt), "outcome of a task not in this run");
            assert!(
                by_itt.insert(o.itt, o).is_none(),
                "two answers for one task"
            );
        }
        itts.iter().map(|itt| by_itt.remove(itt).unwrap()).collect()
    }

    pub fn one(&mut self, cmd: Command) -> Outcome {
        self.run(vec![cmd]).pop().unwrap()
    }

    pub fn test_unit_ready(&mut self) -> Outcome {
        self.one(Command::none(test_unit_ready()))
    }

    /// WRITE(16) of `data` (a whole number of blocks) at `lba`.
    pub fn write(&mut self, lba: u64, data: &[u8], fua: bool) -> Outcome {
        let blocks = (data.len() as u64 / BLOCK) as u32;
        self.one(Command::write(write16(lba, blocks, fua), data.to_vec()))
    }

    /// READ(16) of `blocks` blocks at `lba`.
    pub fn read(&mut self, lba: u64, blocks: u32) -> Outcome {
        self.one(Command::read(
            read16(lba, blocks, false),
            blocks * BLOCK as u32,
        ))
    }

    // ------------------------------------------------------------ others

    /// Receives until a PDU that belongs to no SCSI task arrives.
    pub fn next_other(&mut self) -> Rx {
        loop {
            if let Some(rx) = self.other.pop_front() {
                return rx;
            }
            assert!(self.pump(), "connection closed");
        }
    }

    /// NOP-Out ping with `data`; returns the NOP-In's data.
    pub fn nop(&mut self, data: &[u8]) -> Vec<u8> {
        let itt = self.itt();
        let pdu = InitiatorPdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        });
        self.send_pdu(&pdu, data);
        let rx = self.next_other();
        match rx.pdu {
            TargetPdu::NopIn(n) if n.itt == itt => {
                assert_eq!(n.ttt, RESERVED_TAG);
                rx.data
            }
            other => panic!("expected the NOP-In, got {other:?}"),
        }
    }

    /// A task management function (immediate). Tasks still outstanding
    /// when it is answered that it covers are ended: anything received for
    /// them later fails the test. Returns the response and those tasks.
    pub fn task_management(
        &mut self,
        function: TmfFunction,
        referenced: u32,
    ) -> (TmfResponse, Vec<u32>) {
        let itt = self.itt();
        let pdu = InitiatorPdu::TaskManagementRequest(TaskManagementRequest {
            immediate: true,
            function,
            lun: 0,
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        });
        self.send_pdu(&pdu, &[]);
        let rx = self.next_other();
        let TargetPdu::TaskManagementResponse(resp) = rx.pdu else {
            panic!("expected the TMF Response, got {:?}", rx.pdu);
        };
        assert_eq!(resp.itt, itt);
        let mut ended = Vec::new();
        if resp.response == TmfResponse::FunctionComplete {
            ended = match function {
                TmfFunction::AbortTask => vec![referenced],
                _ => self.tasks.keys().copied().collect(),
            };
            ended.retain(|t| self.tasks.remove(t).is_some());
            self.aborted.extend(ended.iter().copied());
        }
        (resp.response, ended)
    }

    /// Logout (close the session); returns the response code after the
    /// target closed the connection.
    pub fn logout(mut self) -> LogoutResponseCode {
        let itt = self.itt();
        let pdu = InitiatorPdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        });
        self.send_pdu(&pdu, &[]);
        let rx = self.next_other();
        let TargetPdu::LogoutResponse(resp) = rx.pdu else {
            panic!("expected the Logout Response, got {:?}", rx.pdu);
        };
        assert_eq!(resp.itt, itt);
        assert!(
            self.wait_closed().is_empty(),
            "nothing after the Logout Response"
        );
        resp.response
    }

    /// Shuts the socket down (as a crashed initiator would).
    pub fn disconnect(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
