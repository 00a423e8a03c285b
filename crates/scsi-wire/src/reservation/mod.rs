//! Persistent reservations (SPC-5 §5.14, PERSISTENT RESERVE IN / OUT) as a
//! pure state machine, with the SPC-2 RESERVE / RELEASE reservation kept
//! alongside because the two interact (SPC-5 "exceptions to SPC-2 RESERVE
//! and RELEASE behavior", CRH = 1).
//!
//! The logical unit asks [`Reservations::permits`] before running a
//! command (RESERVATION CONFLICT when it says no), sends PERSISTENT
//! RESERVE OUT to [`Reservations::reserve_out`] and PERSISTENT RESERVE IN
//! to [`Reservations::reserve_in`], and delivers the unit attentions and
//! task aborts a [`PrOutcome`] lists.
//!
//! Invariants:
//! - At most one registration per I_T nexus (ALL_TG_PT and SPEC_I_PT are
//!   not supported, so a registration is exactly one nexus); at most
//!   [`MAX_REGISTRATIONS`] of them.
//! - A persistent reservation exists only while its holder is registered:
//!   for the all-registrants types while any registration remains, for
//!   the other types while the reserving nexus stays registered.
//! - PRgeneration changes only on a successful REGISTER, REGISTER AND
//!   IGNORE EXISTING KEY (that changes state), CLEAR, PREEMPT and PREEMPT
//!   AND ABORT, by one, wrapping.
//! - A failed service action changes nothing.

mod input;
mod output;
#[cfg(test)]
mod tests;

use crate::sense::Sense;

/// The most registrations kept; more is INSUFFICIENT REGISTRATION
/// RESOURCES (bounds the state a misbehaving initiator can create).
pub const MAX_REGISTRATIONS: usize = 1024;

/// PERSISTENT RESERVE IN service actions.
pub const PR_IN_READ_KEYS: u8 = 0x00;
pub const PR_IN_READ_RESERVATION: u8 = 0x01;
pub const PR_IN_REPORT_CAPABILITIES: u8 = 0x02;
pub const PR_IN_READ_FULL_STATUS: u8 = 0x03;

/// PERSISTENT RESERVE OUT service actions.
pub const PR_OUT_REGISTER: u8 = 0x00;
pub const PR_OUT_RESERVE: u8 = 0x01;
pub const PR_OUT_RELEASE: u8 = 0x02;
pub const PR_OUT_CLEAR: u8 = 0x03;
pub const PR_OUT_PREEMPT: u8 = 0x04;
pub const PR_OUT_PREEMPT_AND_ABORT: u8 = 0x05;
pub const PR_OUT_REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
pub const PR_OUT_REGISTER_AND_MOVE: u8 = 0x07;
pub const PR_OUT_REPLACE_LOST_RESERVATION: u8 = 0x08;

/// An I_T nexus: the initiator port (iSCSI name + ",i,0x" + ISID in hex)
/// and the relative identifier of the target port it reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nexus {
    pub initiator_port: String,
    pub relative_target_port: u16,
}

/// Persistent reservation types (SPC-5 table "Persistent reservation type
/// codes").
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    pub const fn from_u8(v: u8) -> Option<PrType> {
        Some(match v {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant is a reservation holder.
    pub const fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants only or all registrants: registered nexuses have full
    /// access.
    pub const fn registrants_have_access(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }

    /// Write exclusive family: reads stay shared.
    pub const fn reads_shared(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusive
                | PrType::WriteExclusiveRegistrantsOnly
                | PrType::WriteExclusiveAllRegistrants
        )
    }
}

/// How a command touches the logical unit, as the reservation conflict
/// tables of SPC-5 (§5.14.3 "SPC commands that are allowed in the presence
/// of various reservations") and SBC-4 (§4.17) classify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Reads data or medium state: READ, VERIFY, PRE-FETCH, GET LBA
    /// STATUS, READ DEFECT DATA, MODE SENSE, READ BUFFER, RECEIVE
    /// DIAGNOSTIC RESULTS, REPORT SUPPORTED OPERATION CODES. Allowed to
    /// non-holders by the write exclusive types, not by exclusive access.
    Read,
    /// Changes data: WRITE, WRITE AND VERIFY, WRITE SAME, UNMAP, COMPARE
    /// AND WRITE, ORWRITE, SYNCHRONIZE CACHE, FORMAT UNIT, SANITIZE.
    Write,
    /// Never conflicts: INQUIRY, REPORT LUNS, REQUEST SENSE, LOG SENSE,
    /// READ CAPACITY, REPORT TARGET PORT GROUPS, START STOP UNIT with
    /// START = 1 and POWER CONDITION = 0, PREVENT ALLOW MEDIUM REMOVAL with
    /// PREVENT = 0, and RESERVE / RELEASE (which [`Reservations::reserve_legacy`]
    /// and [`Reservations::release_legacy`] check themselves).
    NonMediaAllowed,
    /// Conflicts for non-holders: MODE SELECT, LOG SELECT, WRITE BUFFER,
    /// SEND DIAGNOSTIC, START STOP UNIT stopping or changing power
    /// condition, PREVENT ALLOW MEDIUM REMOVAL with PREVENT ≠ 0.
    NonMediaConflicting,
    /// Allowed under any persistent reservation, conflicts with an SPC-2
    /// reservation held by another nexus: TEST UNIT READY, PERSISTENT
    /// RESERVE IN, PERSISTENT RESERVE OUT (whose own rules are in
    /// [`Reservations::reserve_out`]).
    NonMediaLegacyConflicting,
}

/// What a successful PERSISTENT RESERVE OUT asks the caller to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrOutcome {
    /// Unit attentions to establish, each for one I_T nexus.
    pub unit_attentions: Vec<(Nexus, Sense)>,
    /// PREEMPT AND ABORT: the nexuses whose tasks must be aborted (every
    /// task except the PERSISTENT RESERVE OUT itself).
    pub aborted: Vec<Nexus>,
    /// The registrations or reservation changed (with APTPL active the
    /// caller persists [`Reservations::registrations`] and
    /// [`Reservations::reservation`]).
    pub changed: bool,
}

/// Why a PERSISTENT RESERVE OUT (or RESERVE / RELEASE) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrError {
    /// RESERVATION CONFLICT status.
    #[error("reservation conflict")]
    Conflict,
    /// CHECK CONDITION with this sense.
    #[error("check condition: {0}")]
    Check(Sense),
}

impl From<Sense> for PrError {
    fn from(s: Sense) -> Self {
        PrError::Check(s)
    }
}

/// One registered I_T nexus and its reservation key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub nexus: Nexus,
    pub key: u64,
}

/// The persistent reservation (always LU_SCOPE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The nexus that reserved; for the all-registrants types every
    /// registrant is a holder and this only records who reserved.
    pub holder: Nexus,
    pub kind: PrType,
}

/// The persistent reservation state of one logical unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservations {
    generation: u32,
    registrations: Vec<Registration>,
    reservation: Option<Reservation>,
    /// SPC-2 RESERVE(6)/(10) holder.
    legacy: Option<Nexus>,
    /// APTPL may be set (REPORT CAPABILITIES PTPL_C); the caller then
    /// keeps the state across power loss.
    ptpl_capable: bool,
    /// The last successful registration had APTPL set (PTPL_A).
    aptpl: bool,
}

impl Reservations {
    /// No registrations, no reservation; APTPL is refused (PTPL_C = 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`Reservations::new`], but accepting APTPL = 1 (PTPL_C = 1):
    /// for callers that persist the state whenever [`PrOutcome::changed`]
    /// while [`Reservations::aptpl`] is set, and restore it with
    /// [`Reservations::restore`]. Linux sends APTPL = 1 on every register.
    pub fn with_persistence() -> Self {
        Reservations {
            ptpl_capable: true,
            ..Self::default()
        }
    }

    /// Rebuilds persisted state (after power on): registrations and
    /// reservation as they were, APTPL active. Registrations beyond
    /// [`MAX_REGISTRATIONS`], duplicate nexuses and key 0 are dropped; a
    /// reservation whose holder is not registered is dropped.
    pub fn restore(
        generation: u32,
        registrations: Vec<Registration>,
        reservation: Option<Reservation>,
    ) -> Self {
        let mut kept: Vec<Registration> = Vec::new();
        for r in registrations {
            let fresh = r.key != 0 && !kept.iter().any(|k| k.nexus == r.nexus);
            if fresh && kept.len() < MAX_REGISTRATIONS {
                kept.push(r);
            }
        }
        let reservation = reservation.filter(|res| {
            if res.kind.all_registrants() {
                !kept.is_empty()
            } else {
                kept.iter().any(|k| k.nexus == res.holder)
            }
        });
        Reservations {
            generation,
            registrations: kept,
            reservation,
            legacy: None,
            ptpl_capable: true,
            aptpl: true,
        }
    }

    /// PRgeneration.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Anything registered or reserved (persistent or SPC-2): when false,
    /// every command is permitted and the hot path can skip [`permits`].
    ///
    /// [`permits`]: Reservations::permits
    pub fn is_active(&self) -> bool {
        !self.registrations.is_empty() || self.reservation.is_some() || self.legacy.is_some()
    }

    /// APTPL is active: the state must survive power loss.
    pub fn aptpl(&self) -> bool {
        self.aptpl
    }

    pub fn registrations(&self) -> &[Registration] {
        &self.registrations
    }

    pub fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_ref()
    }

    /// The SPC-2 RESERVE holder, if any.
    pub fn legacy_holder(&self) -> Option<&Nexus> {
        self.legacy.as_ref()
    }

    /// The reservation key registered by `nexus`.
    pub fn key_of(&self, nexus: &Nexus) -> Option<u64> {
        self.registrations
            .iter()
            .find(|r| &r.nexus == nexus)
            .map(|r| r.key)
    }

    /// `nexus` holds the persistent reservation.
    pub fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            None => false,
            Some(res) if res.kind.all_registrants() => self.key_of(nexus).is_some(),
            Some(res) => &res.holder == nexus,
        }
    }

    /// May a command of class `access` from `nexus` run now? `false` means
    /// RESERVATION CONFLICT.
    pub fn permits(&self, nexus: &Nexus, access: Access) -> bool {
        if let Some(holder) = &self.legacy {
            if holder != nexus && access != Access::NonMediaAllowed {
                return false;
            }
        }
        let Some(res) = &self.reservation else {
            return true;
        };
        match access {
            Access::NonMediaAllowed | Access::NonMediaLegacyConflicting => return true,
            Access::Read | Access::Write | Access::NonMediaConflicting => {}
        }
        if self.is_holder(nexus) {
            return true;
        }
        if res.kind.registrants_have_access() && self.key_of(nexus).is_some() {
            return true;
        }
        access == Access::Read && res.kind.reads_shared()
    }

    /// SPC-2 RESERVE(6)/(10) of the whole logical unit by `nexus`.
    ///
    /// With persistent reservations in use the SPC-5 exceptions apply
    /// (CRH = 1): from the persistent reservation holder, or from a
    /// registrant under a registrants-only / all-registrants reservation,
    /// it is GOOD and changes nothing; otherwise any registration makes it
    /// a RESERVATION CONFLICT (SPC-2 §5.5.1). Without registrations it is
    /// a conflict only when another nexus holds the SPC-2 reservation.
    pub fn reserve_legacy(&mut self, nexus: &Nexus) -> Result<(), PrError> {
        if self.legacy_exception(nexus)? {
            return Ok(());
        }
        match &self.legacy {
            Some(holder) if holder != nexus => Err(PrError::Conflict),
            _ => {
                self.legacy = Some(nexus.clone());
                Ok(())
            }
        }
    }

    /// SPC-2 RELEASE(6)/(10) by `nexus`: releases the SPC-2 reservation if
    /// `nexus` holds it, otherwise GOOD without effect; registrations make
    /// it a conflict as for [`Reservations::reserve_legacy`].
    pub fn release_legacy(&mut self, nexus: &Nexus) -> Result<(), PrError> {
        if self.legacy_exception(nexus)? {
            return Ok(());
        }
        if self.legacy.as_ref() == Some(nexus) {
            self.legacy = None;
        }
        Ok(())
    }

    /// `Ok(true)`: the CRH exception applies (GOOD, no effect);
    /// `Ok(false)`: process as SPC-2; `Err`: conflict with registrations.
    fn legacy_exception(&self, nexus: &Nexus) -> Result<bool, PrError> {
        if self.is_holder(nexus) {
            return Ok(true);
        }
        if let Some(res) = &self.reservation {
            if res.kind.registrants_have_access() && self.key_of(nexus).is_some() {
                return Ok(true);
            }
        }
        if self.registrations.is_empty() {
            Ok(false)
        } else {
            Err(PrError::Conflict)
        }
    }

    /// The I_T nexus is gone (logout, connection loss): its SPC-2
    /// reservation is released; persistent reservations are unaffected.
    pub fn nexus_lost(&mut self, nexus: &Nexus) {
        if self.legacy.as_ref() == Some(nexus) {
            self.legacy = None;
        }
    }

    /// LOGICAL UNIT RESET / target reset: releases the SPC-2 reservation;
    /// persistent reservations are unaffected.
    pub fn logical_unit_reset(&mut self) {
        self.legacy = None;
    }

    /// Power on: everything is forgotten unless APTPL is active, in which
    /// case the persistent state stays (the SPC-2 reservation never does).
    pub fn power_on(&mut self) {
        self.legacy = None;
        if !self.aptpl {
            self.registrations.clear();
            self.reservation = None;
        }
    }
}
