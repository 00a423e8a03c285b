//! The logical unit's command logic: decides what each command does,
//! without touching a disk. The caller (an iSCSI target) performs the
//! I/O a [`Plan`] asks for and sends the response.
//!
//! Shape:
//! - [`LuConfig`] is immutable per snapshot (identity, limits,
//!   provisioning, capacity, write protection, ALUA port groups). A resize
//!   or an ALUA change makes a new config and posts the matching unit
//!   attention to every nexus ([`LuState::post_unit_attention`]).
//! - [`plan`] is pure: config + current mode parameters + one decoded
//!   command + the transport's view of the transfer in, a [`Plan`] out.
//!   The READ/WRITE hot path uses it from any thread with only a snapshot
//!   of [`ModeState`], as long as [`LuState::needs_check`] says the nexus
//!   has nothing pending (no unit attention, no persistent reservation);
//!   [`LuState::generation`] changes whenever that answer may change, so
//!   callers can cache it.
//! - [`LuState`] holds what commands change: mode parameters, persistent
//!   reservations, and the unit attentions queued per I_T nexus.
//!   [`LuState::execute`] takes the raw CDB and applies unit attention and
//!   reservation rules before planning; it is always correct, `plan` is the
//!   fast path.
//! - Commands whose parameter list must arrive before they can be decided
//!   (MODE SELECT, UNMAP, PERSISTENT RESERVE OUT) plan as
//!   [`Plan::ParameterList`]; the caller collects that many bytes of
//!   data-out and calls [`with_parameters`] (pure: UNMAP) or
//!   [`LuState::with_parameters`] (all of them).
//!
//! Invariants:
//! - Nothing here panics on any input; arithmetic on LBAs and lengths is
//!   checked or saturating.
//! - Every data-in a plan carries is already cut to the allocation length
//!   and to the iSCSI expected data transfer length; every plan that ends
//!   in a response carries the residual (RFC 7143 §11.4.5.1) computed from
//!   what the CDB asks to transfer (SPDTL) against the expected length in
//!   the direction the CDB moves data (a direction the initiator did not
//!   flag counts as an expected length of zero).
//! - Writes honour FUA when the CDB sets it and always when the write
//!   cache is disabled (WCE = 0), so durability follows MODE SELECT.
//! - Data-out is never partially applied: a write whose transferable
//!   length (the lesser of SPDTL and the expected length) is not whole
//!   blocks fails with ILLEGAL REQUEST, INVALID FIELD IN COMMAND
//!   INFORMATION UNIT ([`DATA_OUT_REFUSED`]) before any block is written;
//!   commands whose data-out has one fixed meaning (COMPARE AND WRITE,
//!   WRITE SAME) require it exactly.

mod alua;
mod block;
mod io;
mod primary;
mod state;

#[cfg(test)]
mod tests;

pub use alua::access_state;
pub use block::DATA_OUT_REFUSED;
pub use io::{
    finish_data_in, io_failure_sense, miscompare, report_luns, verify_data,
    write_same_may_deallocate, IoFailure,
};
pub use state::{access_of, LuState, MAX_UNIT_ATTENTIONS};

use crate::cdb::{ByteCheck, Command};
use crate::data::mode::ModeState;
use crate::data::{BlockLimits, PortGroup, Provisioning, UnitIdentity};
use crate::reservation::Nexus;
use crate::sense::{Sense, STATUS_CHECK_CONDITION, STATUS_GOOD, STATUS_RESERVATION_CONFLICT};

/// One logical unit's immutable configuration snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuConfig {
    /// INQUIRY identity. Its port fields (relative target port, target
    /// port group) and `alua` are overridden per command from the port the
    /// command arrived on and [`LuConfig::port_groups`], so one config
    /// serves every port.
    pub identity: UnitIdentity,
    pub limits: BlockLimits,
    pub provisioning: Provisioning,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// Every write-type command fails with DATA PROTECT, WRITE PROTECTED.
    pub read_only: bool,
    /// ALUA target port groups; empty when ALUA is not offered (REPORT
    /// TARGET PORT GROUPS is then an unsupported command and every port is
    /// active/optimized).
    pub port_groups: Vec<PortGroup>,
    /// IMPLICIT TRANSITION TIME reported with the port groups.
    pub implicit_transition_secs: u8,
}

impl LuConfig {
    fn block_size(&self) -> u32 {
        self.limits.block_size
    }
}

/// The transport's side of one command: the iSCSI expected data transfer
/// length and the R (read) / W (write) flags of the SCSI Command PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Transfer {
    pub expected_length: u32,
    pub read: bool,
    pub write: bool,
}

impl Transfer {
    /// Expected data-in length: zero unless the R flag is set.
    fn data_in(&self) -> u32 {
        if self.read {
            self.expected_length
        } else {
            0
        }
    }

    /// Expected data-out length: zero unless the W flag is set.
    fn data_out(&self) -> u32 {
        if self.write {
            self.expected_length
        } else {
            0
        }
    }
}

/// Residual of a command (RFC 7143 §11.4.5.1): how the SCSI-presented data
/// transfer length (what the command transfers) compares with the
/// initiator's expected data transfer length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residual {
    #[default]
    None,
    /// Expected more than the command transfers: the count not transferred.
    Underflow(u32),
    /// The command would transfer more than expected: the count cut off.
    Overflow(u32),
}

impl Residual {
    /// Residual of transferring `presented` bytes against `expected`.
    pub fn of(expected: u32, presented: u64) -> Residual {
        let expected64 = u64::from(expected);
        if presented < expected64 {
            Residual::Underflow(clamp_u32(expected64 - presented))
        } else if presented > expected64 {
            Residual::Overflow(clamp_u32(presented - expected64))
        } else {
            Residual::None
        }
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A complete answer to a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u8,
    /// Sense data for CHECK CONDITION (the caller encodes it fixed or
    /// descriptor format, per the D_SENSE bit).
    pub sense: Option<Sense>,
    /// Data-in, already cut to the allocation length and the expected
    /// data transfer length.
    pub data_in: Vec<u8>,
    pub residual: Residual,
}

impl Response {
    pub fn good() -> Response {
        Response {
            status: STATUS_GOOD,
            sense: None,
            data_in: Vec::new(),
            residual: Residual::None,
        }
    }

    pub fn check(sense: Sense) -> Response {
        Response {
            status: STATUS_CHECK_CONDITION,
            sense: Some(sense),
            ..Response::good()
        }
    }

    pub fn reservation_conflict() -> Response {
        Response {
            status: STATUS_RESERVATION_CONFLICT,
            ..Response::good()
        }
    }

    pub fn with_residual(self, residual: Residual) -> Response {
        Response { residual, ..self }
    }
}

/// What the caller does with a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Send this response; nothing to read or write.
    Respond(Response),
    /// Read `blocks` from `lba`, send the first `data_in_len` bytes
    /// (fewer than `blocks` blocks only when the expected length cut the
    /// transfer short), then GOOD with `residual`.
    Read {
        lba: u64,
        blocks: u32,
        fua: bool,
        data_in_len: u32,
        residual: Residual,
    },
    /// Collect `blocks` blocks of data-out and write them at `lba`
    /// (durably before GOOD when `fua`).
    Write {
        lba: u64,
        blocks: u32,
        fua: bool,
        residual: Residual,
    },
    /// Write like [`Plan::Write`] (always durably), then verify the
    /// medium; with `compare` the data read back must equal the data-out
    /// ([`miscompare`]).
    WriteAndVerify {
        lba: u64,
        blocks: u32,
        compare: bool,
        residual: Residual,
    },
    /// Verify `blocks` at `lba`: [`ByteCheck::Medium`] needs no data-out;
    /// `DataOut` collects `blocks` blocks, `OneBlock` one block, and
    /// [`verify_data`] compares them with what is read.
    Verify {
        lba: u64,
        blocks: u32,
        byte_check: ByteCheck,
        residual: Residual,
    },
    /// Write one block of data-out (zeroes when `ndob`, with no data-out)
    /// to each of `blocks` blocks from `lba`. With `unmap` the blocks may
    /// be deallocated instead when [`write_same_may_deallocate`] says so.
    WriteSame {
        lba: u64,
        blocks: u64,
        unmap: bool,
        ndob: bool,
        fua: bool,
        residual: Residual,
    },
    /// Deallocate these ranges (already checked against the capacity and
    /// the block limits; none is empty), then GOOD.
    Unmap {
        ranges: Vec<(u64, u32)>,
        residual: Residual,
    },
    /// Make `blocks` blocks from `lba` durable; with `immed` GOOD may be
    /// sent before the flush completes.
    Flush {
        lba: u64,
        blocks: u64,
        immed: bool,
        residual: Residual,
    },
    /// Collect `2 * blocks` blocks of data-out, read `blocks` at `lba`,
    /// and write the second half only if the first half equals what was
    /// read ([`compare_and_write`]); atomically with other writes.
    CompareAndWrite { lba: u64, blocks: u32, fua: bool },
    /// Build the GET LBA STATUS data from `lba` with
    /// [`crate::data::get_lba_status`], then [`finish_data_in`].
    LbaStatus {
        lba: u64,
        alloc_len: u32,
        expected_length: u32,
    },
    /// Answer with the target's LUN inventory: [`report_luns`].
    ReportLuns {
        select_report: u8,
        alloc_len: u32,
        expected_length: u32,
    },
    /// Collect `len` bytes of data-out (possibly zero), then call
    /// [`with_parameters`] / [`LuState::with_parameters`] with `then`.
    ParameterList { len: u32, then: Pending },
    /// PERSISTENT RESERVE OUT changed the reservations: abort every task
    /// of the `aborted` nexuses (PREEMPT AND ABORT; not this command),
    /// store [`LuState::reservations`] if `persist` (APTPL), then send
    /// `response`.
    ReservationsChanged {
        aborted: Vec<Nexus>,
        persist: bool,
        response: Response,
    },
    /// Only [`LuState::execute`] can decide this command.
    NeedsState,
}

impl Plan {
    /// Bytes of data-out the caller must solicit for this plan. Data-out
    /// the initiator sends beyond it (immediate data of a READ flagged W,
    /// the excess of an underflow) is received and discarded.
    pub fn data_out_len(&self, block_size: u32) -> u64 {
        let bs = u64::from(block_size);
        match self {
            Plan::Write { blocks, .. } | Plan::WriteAndVerify { blocks, .. } => {
                u64::from(*blocks) * bs
            }
            Plan::Verify {
                blocks, byte_check, ..
            } => match byte_check {
                ByteCheck::Medium => 0,
                ByteCheck::DataOut => u64::from(*blocks) * bs,
                ByteCheck::OneBlock => bs,
            },
            Plan::WriteSame { ndob, .. } => {
                if *ndob {
                    0
                } else {
                    bs
                }
            }
            Plan::CompareAndWrite { blocks, .. } => 2 * u64::from(*blocks) * bs,
            Plan::ParameterList { len, .. } => u64::from(*len),
            _ => 0,
        }
    }
}

/// A command waiting for its parameter list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub kind: PendingKind,
    /// The residual of the data-out phase, reported with the final answer.
    pub residual: Residual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingKind {
    ModeSelect {
        ten: bool,
        pf: bool,
        sp: bool,
    },
    Unmap,
    PersistentReserveOut {
        service_action: u8,
        scope: u8,
        kind: u8,
    },
}

/// Decides a command from the configuration and the current mode
/// parameters alone. Valid only while [`LuState::needs_check`] is false for
/// the nexus; returns [`Plan::NeedsState`] for commands that read the
/// reservation state (PERSISTENT RESERVE IN).
pub fn plan(
    config: &LuConfig,
    mode: &ModeState,
    port: u16,
    command: &Command,
    transfer: Transfer,
) -> Plan {
    if let Err(sense) = alua::admit(config, port, command) {
        return Plan::Respond(Response::check(sense));
    }
    match block::plan(config, mode, command, transfer) {
        Some(plan) => plan,
        None => primary::plan(config, mode, port, command, transfer),
    }
}

/// Finishes a two-phase command that needs no state (UNMAP) with its
/// parameter list; returns [`Plan::NeedsState`] for the others.
pub fn with_parameters(config: &LuConfig, pending: Pending, params: &[u8]) -> Plan {
    match pending.kind {
        PendingKind::Unmap => block::unmap_parameters(config, params, pending.residual),
        _ => Plan::NeedsState,
    }
}

/// A finished response with no data and `residual`.
fn respond(sense: Option<Sense>, residual: Residual) -> Plan {
    let response = match sense {
        Some(sense) => Response::check(sense),
        None => Response::good(),
    };
    Plan::Respond(response.with_residual(residual))
}
