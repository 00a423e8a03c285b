//! A write's Data-Out: immediate data, the unsolicited burst, and the
//! solicited sequences of R2Ts (RFC 7143 §4.2.3, §11.7–11.8), collected
//! into one buffer in order (DataPDUInOrder and DataSequenceInOrder are
//! Yes, which this target requires).
//!
//! Invariants:
//! - Bytes arrive in order: each Data-Out starts where the last ended, its
//!   DataSN is the next of its sequence (0 at each sequence's start), and
//!   it stays inside its sequence: the unsolicited burst (FirstBurstLength,
//!   immediate data included) or its R2T's range. Anything else is
//!   rejected and fails the task with a data phase error (error recovery
//!   level 0 cannot ask for a resend); later Data-Out of it is ignored.
//! - One R2T per task at a time, of at most MaxBurstLength; the next is
//!   sent when its sequence is complete.
//! - The logical unit says how many bytes it takes (its plan's data-out
//!   length: the CDB's transfer cut to EDTL, or 0 when it answers without
//!   data). Unsolicited data beyond that, which the initiator may send
//!   anyway up to EDTL, is received and discarded; R2Ts ask only for what
//!   is taken.

use super::{bhs_array, emit, Fatal, Session, TaskState, RESERVED_TAG};
use crate::ConnectionError;
use basalt_iscsi_wire::pdu::{DataOut, ReadyToTransfer, RejectReason, ScsiCommand, TargetPdu};
use basalt_store::AlignedBuf;

/// The Data-Out state of one write.
#[derive(Debug)]
pub(super) struct Transfer {
    /// Where the data goes; `None` when it is swallowed.
    buf: Option<AlignedBuf>,
    /// Bytes to collect (the buffer's length; 0 when swallowed).
    total: u32,
    /// Bytes received so far, contiguous from offset 0.
    received: u32,
    /// End of the unsolicited burst, and whether Data-Out PDUs of it are
    /// still expected.
    unsolicited_end: u32,
    unsolicited_open: bool,
    /// DataSN the next Data-Out of the current sequence carries.
    next_data_sn: u32,
    /// The open R2T: its TTT and the end of its range.
    r2t: Option<(u32, u32)>,
    r2t_sn: u32,
}

impl Transfer {
    pub(super) fn into_buffer(self) -> Option<AlignedBuf> {
        self.buf
    }

    fn complete(&self) -> bool {
        !self.unsolicited_open && self.r2t.is_none() && self.received >= self.total
    }

    fn wants_r2t(&self) -> bool {
        !self.unsolicited_open && self.r2t.is_none() && self.received < self.total
    }
}

/// Why a Data-Out PDU was refused.
enum DataOutError {
    /// The connection cannot go on.
    Fatal(Box<Fatal>),
    /// Its task fails; the connection goes on.
    Task(&'static str),
}

fn protocol(reason: &'static str, bhs: &[u8]) -> Box<Fatal> {
    Box::new(Fatal {
        reject: Some((RejectReason::ProtocolError, bhs_array(bhs))),
        error: ConnectionError::Protocol(reason),
    })
}

impl Session {
    /// Sets up the data of a new command (`wanted`: the bytes of data-out
    /// the logical unit takes from it) and takes its immediate data; a
    /// command with all it needs is ready at once.
    pub(super) fn start_transfer(
        &mut self,
        command: &ScsiCommand,
        wanted: u32,
        immediate: &[u8],
    ) -> Result<(), Box<Fatal>> {
        let itt = command.itt;
        let edtl = command.expected_data_transfer_length;
        let first_burst = self.params.first_burst.min(edtl);
        if immediate.len() as u64 > u64::from(first_burst) {
            return Err(Fatal::protocol(
                "immediate data beyond FirstBurstLength",
                None,
            ));
        }
        let unsolicited_open = !self.params.initial_r2t && !command.final_pdu && command.write;
        // The logical unit never takes more than the target's largest
        // transfer; anything else would be a bug, not an allocation.
        let wanted = match wanted <= self.params.max_transfer {
            true => wanted,
            false => 0,
        };
        let buf = (wanted > 0).then(|| {
            let mut buf = self.pool.take(wanted as usize);
            let n = immediate.len().min(wanted as usize);
            buf[..n].copy_from_slice(&immediate[..n]);
            buf
        });
        let transfer = Transfer {
            buf,
            total: wanted,
            received: immediate.len() as u32,
            unsolicited_end: first_burst,
            unsolicited_open,
            next_data_sn: 0,
            r2t: None,
            r2t_sn: 0,
        };
        let complete = transfer.complete();
        let wants_r2t = transfer.wants_r2t();
        if let Some(task) = self.tasks.get_mut(&itt) {
            task.transfer = Some(transfer);
        }
        if complete {
            self.make_ready(itt);
        } else if wants_r2t {
            self.r2t_wanted.push_back(itt);
        }
        Ok(())
    }

    /// Takes one Data-Out PDU.
    pub(super) fn data_out(
        &mut self,
        pdu: &DataOut,
        bhs: &[u8],
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Box<Fatal>> {
        match self.take_data_out(pdu, bhs, data) {
            Err(DataOutError::Fatal(fatal)) => Err(fatal),
            Err(DataOutError::Task(reason)) => {
                // A broken sequence ends its task, not the connection: the
                // PDU is rejected and the task fails (RFC 7143 §7.1.4.1
                // lets an ERL 0 target do either; initiators recover a task
                // far more cheaply than a session).
                tracing::debug!(itt = pdu.itt, "Data-Out refused: {reason}");
                self.reject(RejectReason::ProtocolError, bhs, out);
                self.r2t_wanted.retain(|t| *t != pdu.itt);
                if let Some(task) = self.tasks.get_mut(&pdu.itt) {
                    if let Some(transfer) = task.transfer.take() {
                        if let Some(buf) = transfer.into_buffer() {
                            self.pool.give(buf);
                        }
                    }
                    task.data_error = true;
                }
                self.make_ready(pdu.itt);
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    fn take_data_out(
        &mut self,
        pdu: &DataOut,
        bhs: &[u8],
        data: &[u8],
    ) -> Result<(), DataOutError> {
        let Some(task) = self.tasks.get_mut(&pdu.itt) else {
            // An aborted task's (or one answered early): RFC 7143 §4.2.3.3
            // has the target discard it.
            tracing::debug!(itt = pdu.itt, "Data-Out for no task: ignored");
            return Ok(());
        };
        if task.state != TaskState::Collecting {
            tracing::debug!(itt = pdu.itt, "Data-Out for a running task: ignored");
            return Ok(());
        }
        let Some(transfer) = task.transfer.as_mut() else {
            return Err(DataOutError::Fatal(protocol(
                "Data-Out for a command without data-out",
                bhs,
            )));
        };
        let len = data.len() as u32;
        let end = pdu
            .buffer_offset
            .checked_add(len)
            .ok_or(DataOutError::Task("Data-Out beyond 4 GiB"))?;
        if pdu.buffer_offset != transfer.received {
            return Err(DataOutError::Task("Data-Out out of order"));
        }
        if pdu.data_sn != transfer.next_data_sn {
            return Err(DataOutError::Task("Data-Out with a wrong DataSN"));
        }
        if pdu.ttt == RESERVED_TAG {
            if !transfer.unsolicited_open || end > transfer.unsolicited_end {
                return Err(DataOutError::Task(
                    "unsolicited Data-Out beyond FirstBurstLength",
                ));
            }
            if pdu.final_pdu {
                transfer.unsolicited_open = false;
                transfer.next_data_sn = 0;
            } else {
                transfer.next_data_sn = transfer.next_data_sn.wrapping_add(1);
            }
        } else {
            let Some((ttt, r2t_end)) = transfer.r2t else {
                return Err(DataOutError::Task("Data-Out for no open R2T"));
            };
            if pdu.ttt != ttt || end > r2t_end {
                return Err(DataOutError::Task("Data-Out outside its R2T"));
            }
            if pdu.final_pdu != (end == r2t_end) {
                return Err(DataOutError::Task(
                    "Data-Out sequence ends before its R2T's range",
                ));
            }
            if pdu.final_pdu {
                transfer.r2t = None;
                transfer.next_data_sn = 0;
            } else {
                transfer.next_data_sn = transfer.next_data_sn.wrapping_add(1);
            }
        }
        if let Some(buf) = transfer.buf.as_mut() {
            // Unsolicited data beyond what the logical unit takes (EDTL
            // larger than the CDB's transfer) is discarded.
            let start = (pdu.buffer_offset as usize).min(buf.len());
            let stop = (end as usize).min(buf.len());
            if let (Some(dst), Some(src)) = (buf.get_mut(start..stop), data.get(..stop - start)) {
                dst.copy_from_slice(src);
            }
        }
        transfer.received = end;
        let (complete, wants_r2t) = (transfer.complete(), transfer.wants_r2t());
        if complete {
            self.make_ready(pdu.itt);
        } else if wants_r2t && !self.r2t_wanted.contains(&pdu.itt) {
            self.r2t_wanted.push_back(pdu.itt);
        }
        Ok(())
    }

    /// Sends the R2Ts of every write waiting for one.
    pub fn issue_r2ts(&mut self, out: &mut Vec<u8>) {
        while let Some(itt) = self.r2t_wanted.pop_front() {
            let ttt = self.next_ttt;
            self.next_ttt = match self.next_ttt.wrapping_add(1) {
                RESERVED_TAG => 1,
                next => next,
            };
            let (exp_cmd_sn, max_cmd_sn, stat_sn) =
                (self.exp_cmd_sn, self.max_cmd_sn(), self.stat_sn);
            let max_burst = self.params.max_burst;
            let Some(task) = self.tasks.get_mut(&itt) else {
                continue;
            };
            let lun = task.lun;
            let Some(transfer) = task.transfer.as_mut() else {
                continue;
            };
            if !transfer.wants_r2t() {
                continue;
            }
            let offset = transfer.received;
            let len = (transfer.total - offset).min(max_burst);
            transfer.r2t = Some((ttt, offset + len));
            transfer.next_data_sn = 0;
            let r2t_sn = transfer.r2t_sn;
            transfer.r2t_sn = transfer.r2t_sn.wrapping_add(1);
            let pdu = TargetPdu::ReadyToTransfer(ReadyToTransfer {
                lun,
                itt,
                ttt,
                // An R2T carries StatSN without taking one.
                stat_sn,
                exp_cmd_sn,
                max_cmd_sn,
                r2t_sn,
                buffer_offset: offset,
                desired_data_transfer_length: len,
            });
            emit(&pdu, &[], self.params.digests, out);
        }
    }
}
