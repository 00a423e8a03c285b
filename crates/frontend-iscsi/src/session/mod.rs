//! The full-feature phase of one iSCSI connection as a pure state machine:
//! received bytes in, ready SCSI commands and encoded PDUs out. Basalt
//! negotiates MaxConnections=1, so a session is its one connection.
//!
//! What it keeps (RFC 7143, error recovery level 0):
//! - *Command numbering*: ExpCmdSN, and MaxCmdSN = ExpCmdSN − 1 + the
//!   window left (the configured window minus the non-immediate tasks not
//!   answered yet), so an initiator never has more than the window
//!   outstanding. A non-immediate command outside [ExpCmdSN, MaxCmdSN] is
//!   silently ignored (§4.2.2.1). StatSN counts every status the
//!   connection sends.
//! - *Tasks* by ITT, from their SCSI Command until their response: a write
//!   collects its data (immediate data, the unsolicited burst, then the
//!   solicited sequences of its R2Ts, module `data_out`) into one buffer
//!   and becomes [`Ready`] when it has it all; other commands are ready at
//!   once. An ITT already in use is a protocol error.
//! - *Task management*: ABORT TASK, ABORT TASK SET, CLEAR TASK SET and
//!   LOGICAL UNIT RESET end the tasks they name: one still collecting data
//!   ends at once, one running is marked aborted and answered with nothing
//!   when it finishes (§4.2.3.3), and the TMF response waits for the last
//!   of them.
//!
//! Invariants:
//! - Every ready task gets exactly one response or none if aborted
//!   ([`Session::finish`] says which), and only after the caller finished
//!   it; a task is forgotten once answered, so its ITT may be reused.
//! - Memory is bounded: at most `window` numbered tasks, and immediate
//!   ones only while fewer than `window` tasks are open (beyond, they are
//!   rejected), each with one buffer of at most `max_transfer` bytes.
//! - A protocol error is [`Fatal`]: the caller sends the Reject it carries
//!   and closes the connection (error recovery level 0 recovers sessions,
//!   not PDUs).

mod data_out;
mod responses;
#[cfg(test)]
mod tests;

pub(crate) use responses::{data_digest, Part};

use crate::ConnectionError;
use basalt_iscsi_wire::decoder::{decode_initiator, Decoded, DecoderConfig};
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::login::send_targets::{answer_text_request, TextContext};
use basalt_iscsi_wire::negotiation::SessionType;
use basalt_iscsi_wire::pdu::{
    sn_le, sn_lt, InitiatorPdu, LogoutReason, LogoutRequest, LogoutResponse, LogoutResponseCode,
    NopIn, NopOut, RejectReason, ScsiCommand, TargetPdu, TaskManagementRequest,
    TaskManagementResponse, TextRequest, TextResponse, TmfFunction, TmfResponse, BHS_LEN,
};
use basalt_loop_io::BufferPool;
use basalt_store::AlignedBuf;
use std::collections::{HashMap, VecDeque};

/// The ITT and TTT value that means "none".
pub(crate) const RESERVED_TAG: u32 = 0xffff_ffff;

/// What the login settled for the connection.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    /// The initiator's MaxRecvDataSegmentLength: the largest data segment
    /// this side sends.
    pub send_segment: u32,
    /// This side's MaxRecvDataSegmentLength: the largest it accepts.
    pub recv_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub digests: Digests,
    /// Commands outstanding at most.
    pub window: u32,
    /// Largest transfer of one command.
    pub max_transfer: u32,
    /// This target's name, portal and portal group tag (SendTargets in a
    /// normal session reports only the session's own target).
    pub target_name: String,
    pub portal: String,
}

/// A SCSI command whose data (if any) is all here, for the caller to run.
#[derive(Debug)]
pub(crate) struct Ready {
    pub itt: u32,
    pub lun: u64,
    pub cdb: Cdb,
    /// Expected Data Transfer Length of the command.
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
    /// The Data-Out bytes the logical unit takes (`None` when none).
    pub data: Option<AlignedBuf>,
    /// Its Data-Out broke the sequence rules: it fails with a data phase
    /// error instead of running.
    pub data_error: bool,
}

/// A CDB, kept without allocating for the usual 6- to 16-byte ones.
#[derive(Debug, Clone)]
pub(crate) enum Cdb {
    Short([u8; 16]),
    Long(Box<[u8]>),
}

impl Cdb {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Cdb::Short(b) => b,
            Cdb::Long(b) => b,
        }
    }

    fn of(command: &ScsiCommand) -> Cdb {
        match command.extended_cdb.is_empty() {
            true => Cdb::Short(command.bhs_cdb),
            false => Cdb::Long(command.cdb().into_owned().into_boxed_slice()),
        }
    }
}

/// A protocol error that ends the connection.
#[derive(Debug)]
pub(crate) struct Fatal {
    /// The Reject to send first (reason and the offending BHS), if any.
    pub reject: Option<(RejectReason, [u8; BHS_LEN])>,
    pub error: ConnectionError,
}

impl Fatal {
    fn protocol(reason: &'static str, bhs: Option<&[u8]>) -> Box<Fatal> {
        Box::new(Fatal {
            reject: bhs.map(|b| (RejectReason::ProtocolError, bhs_array(b))),
            error: ConnectionError::Protocol(reason),
        })
    }
}

/// How many Data-Out bytes the logical unit takes from a command:
/// `(cdb, expected data transfer length, R bit, W bit)`.
pub(crate) type DataOutLen<'a> = &'a dyn Fn(&[u8], u32, bool, bool) -> u32;

fn bhs_array(bytes: &[u8]) -> [u8; BHS_LEN] {
    let mut bhs = [0u8; BHS_LEN];
    let n = bytes.len().min(BHS_LEN);
    bhs[..n].copy_from_slice(&bytes[..n]);
    bhs
}

/// How far [`Session::receive`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    /// Bytes of the input used (whole PDUs only).
    pub consumed: usize,
    /// Bytes needed beyond the unused rest before the next PDU decodes.
    pub need: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskState {
    /// Waiting for Data-Out.
    Collecting,
    /// Handed to the caller.
    Running,
    /// Running, but aborted by task management: no response.
    Aborted,
}

#[derive(Debug)]
struct Task {
    state: TaskState,
    lun: u64,
    /// Takes a CmdSN (not immediate): counts against the window.
    numbered: bool,
    command: Option<Pending>,
    transfer: Option<data_out::Transfer>,
    data_error: bool,
}

/// What a collecting task will be handed over as.
#[derive(Debug)]
struct Pending {
    cdb: Cdb,
    edtl: u32,
    read: bool,
    write: bool,
}

/// A TMF waiting for the aborted tasks to finish.
#[derive(Debug)]
struct PendingTmf {
    itt: u32,
    waiting: Vec<u32>,
}

/// One connection's full-feature phase.
pub(crate) struct Session {
    pub params: Params,
    decoder: DecoderConfig,
    stat_sn: u32,
    exp_cmd_sn: u32,
    /// Non-immediate tasks not answered yet.
    numbered: u32,
    tasks: HashMap<u32, Task>,
    /// Writes waiting to be sent an R2T, in arrival order.
    r2t_wanted: VecDeque<u32>,
    next_ttt: u32,
    tmfs: Vec<PendingTmf>,
    /// Commands whose data is complete, in CmdSN order.
    pub ready: Vec<Ready>,
    /// LUN resets received (the caller resets the logical unit's state).
    pub lun_resets: u32,
    pub pool: BufferPool,
    /// The initiator asked to log out: answered, nothing more is read.
    pub logged_out: bool,
}

impl Session {
    /// The session after a login whose last response carried StatSN
    /// `stat_sn - 1` and whose ExpCmdSN was `exp_cmd_sn`.
    pub fn new(params: Params, stat_sn: u32, exp_cmd_sn: u32) -> Session {
        let decoder = DecoderConfig {
            digests: params.digests,
            max_data_segment: params.recv_segment,
        };
        Session {
            params,
            decoder,
            stat_sn,
            exp_cmd_sn,
            numbered: 0,
            tasks: HashMap::new(),
            r2t_wanted: VecDeque::new(),
            next_ttt: 1,
            tmfs: Vec::new(),
            ready: Vec::new(),
            lun_resets: 0,
            pool: BufferPool::new(),
            logged_out: false,
        }
    }

    fn max_cmd_sn(&self) -> u32 {
        let free = self.params.window.saturating_sub(self.numbered);
        self.exp_cmd_sn.wrapping_sub(1).wrapping_add(free)
    }

    /// StatSN for the next status-bearing PDU (and advances it).
    fn next_stat_sn(&mut self) -> u32 {
        let sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        sn
    }

    /// Decodes every whole PDU of `input` (stopping after a Logout),
    /// appending the PDUs it answers at once (NOP-In, R2T, TMF, Text,
    /// Logout responses) to `out` and the commands it makes ready to
    /// [`Session::ready`]. `data_out_len(cdb, edtl, read, write)` says how
    /// many Data-Out bytes the logical unit takes from a command.
    pub fn receive(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        data_out_len: DataOutLen<'_>,
    ) -> Result<Received, Box<Fatal>> {
        let mut consumed = 0;
        while !self.logged_out {
            let rest = &input[consumed..];
            match decode_initiator(rest, &self.decoder) {
                Ok(Decoded::NeedMore(need)) => {
                    return Ok(Received { consumed, need });
                }
                Ok(Decoded::Pdu {
                    pdu,
                    data,
                    consumed: used,
                }) => {
                    let bhs = &rest[..BHS_LEN.min(rest.len())];
                    let data = rest.get(data).unwrap_or(&[]);
                    self.dispatch(pdu, bhs, data, out, data_out_len)?;
                    consumed += used;
                }
                Err(err) => match err.skip_len() {
                    // A PDU the decoder could delimit: rejected, and the
                    // connection goes on (§7.3: the initiator decides).
                    Some(skip) if skip > 0 => {
                        tracing::debug!("iSCSI PDU rejected: {err}");
                        if let (Some(reason), Some(bhs)) = (err.reject_reason(), err.rejected_bhs())
                        {
                            self.reject(reason, bhs, out);
                        }
                        consumed += skip;
                    }
                    _ => return Err(decode_fatal(err)),
                },
            }
        }
        Ok(Received { consumed, need: 0 })
    }

    fn dispatch(
        &mut self,
        pdu: InitiatorPdu,
        bhs: &[u8],
        data: &[u8],
        out: &mut Vec<u8>,
        data_out_len: DataOutLen<'_>,
    ) -> Result<(), Box<Fatal>> {
        match pdu {
            InitiatorPdu::ScsiCommand(command) => {
                if command.immediate && self.tasks.len() as u32 >= self.params.window {
                    // Immediate commands take no CmdSN, so the window does
                    // not bound them: a full task table refuses them
                    // (§11.17.1, "Immediate command reject").
                    self.reject(RejectReason::ImmediateCommandReject, bhs, out);
                } else if self.admit(command.immediate, command.cmd_sn) {
                    self.command(command, bhs, data, data_out_len)?;
                }
            }
            InitiatorPdu::DataOut(data_out) => self.data_out(&data_out, bhs, data, out)?,
            InitiatorPdu::NopOut(nop) => {
                if self.admit(nop.immediate, nop.cmd_sn) {
                    self.nop_out(&nop, data, out);
                }
            }
            InitiatorPdu::TaskManagementRequest(tmf) => {
                if self.admit(tmf.immediate, tmf.cmd_sn) {
                    self.task_management(&tmf, out);
                }
            }
            InitiatorPdu::TextRequest(text) => {
                if self.admit(text.immediate, text.cmd_sn) {
                    self.text(&text, data, out);
                }
            }
            InitiatorPdu::LogoutRequest(logout) => {
                if self.admit(logout.immediate, logout.cmd_sn) {
                    self.logout(&logout, out);
                }
            }
            InitiatorPdu::LoginRequest(_) => {
                return Err(Fatal::protocol(
                    "login request in full-feature phase",
                    Some(bhs),
                ))
            }
            InitiatorPdu::SnackRequest(_) => {
                // Error recovery level 0 has no SNACKs (§11.16).
                self.reject(RejectReason::SnackReject, bhs, out);
            }
        }
        Ok(())
    }

    /// Whether a request with `cmd_sn` is inside the command window (and
    /// takes its number when not immediate). Outside: silently ignored.
    fn admit(&mut self, immediate: bool, cmd_sn: u32) -> bool {
        if immediate {
            return true;
        }
        let max = self.max_cmd_sn();
        if sn_lt(cmd_sn, self.exp_cmd_sn) || !sn_le(cmd_sn, max) {
            tracing::debug!(
                cmd_sn,
                exp_cmd_sn = self.exp_cmd_sn,
                max_cmd_sn = max,
                "iSCSI request outside the command window: ignored"
            );
            return false;
        }
        // One connection delivers in order; a gap can only be a skipped
        // number, which no later PDU will fill: move past it.
        self.exp_cmd_sn = cmd_sn.wrapping_add(1);
        true
    }

    fn command(
        &mut self,
        command: ScsiCommand,
        bhs: &[u8],
        data: &[u8],
        data_out_len: DataOutLen<'_>,
    ) -> Result<(), Box<Fatal>> {
        if command.itt == RESERVED_TAG || self.tasks.contains_key(&command.itt) {
            return Err(Box::new(Fatal {
                reject: Some((RejectReason::InvalidPduField, bhs_array(bhs))),
                error: ConnectionError::Protocol("SCSI command with an ITT in use"),
            }));
        }
        if !data.is_empty() && (!self.params.immediate_data || !command.write) {
            return Err(Fatal::protocol("immediate data not allowed", Some(bhs)));
        }
        let numbered = !command.immediate;
        if numbered {
            self.numbered += 1;
        }
        let cdb = Cdb::of(&command);
        let wanted = data_out_len(
            cdb.bytes(),
            command.expected_data_transfer_length,
            command.read,
            command.write,
        );
        let pending = Pending {
            cdb,
            edtl: command.expected_data_transfer_length,
            read: command.read,
            write: command.write,
        };
        let task = Task {
            state: TaskState::Collecting,
            lun: command.lun,
            numbered,
            command: Some(pending),
            transfer: None,
            data_error: false,
        };
        self.tasks.insert(command.itt, task);
        self.start_transfer(&command, wanted, data)
    }

    /// Moves a task whose data is complete to [`Session::ready`].
    fn make_ready(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        let Some(pending) = task.command.take() else {
            return;
        };
        let data = task.transfer.take().and_then(|t| t.into_buffer());
        task.state = TaskState::Running;
        self.ready.push(Ready {
            itt,
            lun: task.lun,
            cdb: pending.cdb,
            edtl: pending.edtl,
            read: pending.read,
            write: pending.write,
            data,
            data_error: task.data_error,
        });
    }

    /// Whether task management aborted task `itt` (it is still owed a
    /// [`Session::finish`], which then sends nothing).
    pub fn aborted(&self, itt: u32) -> bool {
        self.tasks
            .get(&itt)
            .is_some_and(|t| t.state == TaskState::Aborted)
    }

    /// The caller finished running task `itt`: forgets it, completes the
    /// TMFs that waited for it (their responses go to `out`), and says
    /// whether the task's response is to be sent (not when aborted).
    pub fn finish(&mut self, itt: u32, out: &mut Vec<u8>) -> bool {
        let Some(task) = self.tasks.remove(&itt) else {
            return false;
        };
        if task.numbered {
            self.numbered -= 1;
        }
        if let Some(transfer) = task.transfer {
            if let Some(buf) = transfer.into_buffer() {
                self.pool.give(buf);
            }
        }
        let mut done = Vec::new();
        for tmf in &mut self.tmfs {
            tmf.waiting.retain(|t| *t != itt);
            if tmf.waiting.is_empty() {
                done.push(tmf.itt);
            }
        }
        self.tmfs.retain(|t| !t.waiting.is_empty());
        for tmf_itt in done {
            self.tmf_response(tmf_itt, TmfResponse::FunctionComplete, out);
        }
        task.state != TaskState::Aborted
    }

    // ---------------------------------------------------- other requests

    fn nop_out(&mut self, nop: &NopOut, data: &[u8], out: &mut Vec<u8>) {
        if nop.itt == RESERVED_TAG {
            // The answer to a NOP-In of ours, or a ping wanting nothing.
            return;
        }
        let ping = &data[..data.len().min(self.params.send_segment as usize)];
        let pdu = TargetPdu::NopIn(NopIn {
            lun: nop.lun,
            itt: nop.itt,
            ttt: RESERVED_TAG,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
        });
        emit(&pdu, ping, self.params.digests, out);
    }

    fn task_management(&mut self, tmf: &TaskManagementRequest, out: &mut Vec<u8>) {
        let targets: Vec<u32> = match tmf.function {
            TmfFunction::AbortTask => match self.tasks.get(&tmf.referenced_task_tag) {
                Some(task) if task.lun == tmf.lun => vec![tmf.referenced_task_tag],
                // Answered already (or never received): RFC 7143
                // §11.6.1 lets the target say it does not exist.
                _ => {
                    self.tmf_response(tmf.itt, TmfResponse::TaskDoesNotExist, out);
                    return;
                }
            },
            TmfFunction::AbortTaskSet | TmfFunction::ClearTaskSet => self
                .tasks
                .iter()
                .filter(|(_, t)| t.lun == tmf.lun)
                .map(|(itt, _)| *itt)
                .collect(),
            TmfFunction::LogicalUnitReset => {
                self.lun_resets += 1;
                self.tasks.keys().copied().collect()
            }
            TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset => {
                // Would end every session of the target; refused (the
                // initiator falls back to a LUN reset or a relogin).
                self.tmf_response(tmf.itt, TmfResponse::NotSupported, out);
                return;
            }
            TmfFunction::TaskReassign => {
                // Needs error recovery level 2.
                self.tmf_response(
                    tmf.itt,
                    TmfResponse::AllegianceReassignmentNotSupported,
                    out,
                );
                return;
            }
            TmfFunction::ClearAca | TmfFunction::Reserved(_) => {
                self.tmf_response(tmf.itt, TmfResponse::NotSupported, out);
                return;
            }
        };
        let mut waiting = Vec::new();
        for itt in targets {
            match self.tasks.get(&itt).map(|t| t.state) {
                Some(TaskState::Collecting) => {
                    // Not started: end it here (its later Data-Out PDUs
                    // are ignored as for an unknown task).
                    self.r2t_wanted.retain(|t| *t != itt);
                    let _ = self.finish(itt, out);
                }
                Some(TaskState::Running) => {
                    if let Some(task) = self.tasks.get_mut(&itt) {
                        task.state = TaskState::Aborted;
                    }
                    waiting.push(itt);
                }
                Some(TaskState::Aborted) => waiting.push(itt),
                None => {}
            }
        }
        if waiting.is_empty() {
            self.tmf_response(tmf.itt, TmfResponse::FunctionComplete, out);
        } else {
            self.tmfs.push(PendingTmf {
                itt: tmf.itt,
                waiting,
            });
        }
    }

    fn tmf_response(&mut self, itt: u32, response: TmfResponse, out: &mut Vec<u8>) {
        let pdu = TargetPdu::TaskManagementResponse(TaskManagementResponse {
            response,
            itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
        });
        emit(&pdu, &[], self.params.digests, out);
    }

    /// Text in a normal session: SendTargets reports this session's own
    /// target; any other key is not understood. (One target's record
    /// always fits one PDU, so no continuation is needed.)
    fn text(&mut self, text: &TextRequest, data: &[u8], out: &mut Vec<u8>) {
        let targets = [(
            self.params.target_name.clone(),
            vec![self.params.portal.clone()],
        )];
        let ctx = TextContext {
            session_type: SessionType::Normal,
            current_target: Some(&self.params.target_name),
            targets: &targets,
        };
        let mut reply = Vec::new();
        if answer_text_request(data, &ctx, &mut reply).is_err() {
            reply.clear();
        }
        reply.truncate(self.params.send_segment as usize);
        let pdu = TargetPdu::TextResponse(TextResponse {
            final_pdu: true,
            cont: false,
            lun: text.lun,
            itt: text.itt,
            ttt: RESERVED_TAG,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
        });
        emit(&pdu, &reply, self.params.digests, out);
    }

    fn logout(&mut self, logout: &LogoutRequest, out: &mut Vec<u8>) {
        let response = match logout.reason {
            LogoutReason::CloseSession | LogoutReason::CloseConnection => {
                LogoutResponseCode::ClosedSuccessfully
            }
            _ => LogoutResponseCode::RecoveryNotSupported,
        };
        let pdu = TargetPdu::LogoutResponse(LogoutResponse {
            response,
            itt: logout.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            time2wait: 0,
            time2retain: 0,
        });
        emit(&pdu, &[], self.params.digests, out);
        self.logged_out = response == LogoutResponseCode::ClosedSuccessfully;
    }

    fn reject(&mut self, reason: RejectReason, bhs: &[u8], out: &mut Vec<u8>) {
        let pdu = TargetPdu::Reject(basalt_iscsi_wire::pdu::Reject {
            reason,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            data_sn: 0,
        });
        emit(&pdu, &bhs_array(bhs), self.params.digests, out);
    }

    /// Encodes the Reject of a fatal error (sent before closing).
    pub fn encode_fatal_reject(&mut self, fatal: &Fatal, out: &mut Vec<u8>) {
        if let Some((reason, bhs)) = &fatal.reject {
            self.reject(*reason, bhs, out);
        }
    }
}

/// The fatal error (and Reject) of a PDU the decoder refused.
fn decode_fatal(err: basalt_iscsi_wire::decoder::PduError) -> Box<Fatal> {
    let reject = err.reject_reason().zip(err.rejected_bhs().copied());
    Box::new(Fatal {
        reject,
        error: ConnectionError::Pdu(err),
    })
}

/// Appends a whole target PDU. The data segments this target sends are
/// bounded by the negotiated lengths, far below what an encoder refuses;
/// a refusal would be a bug, logged rather than sent malformed.
pub(crate) fn emit(pdu: &TargetPdu, data: &[u8], digests: Digests, out: &mut Vec<u8>) {
    if let Err(err) = pdu.encode(data, digests, out) {
        tracing::error!(opcode = ?pdu.opcode(), "cannot encode an iSCSI PDU: {err}");
    }
}
