//! The logical unit's mutable state: mode parameters, persistent
//! reservations and the unit attentions queued per I_T nexus, and the
//! stateful entry points ([`LuState::execute`], [`LuState::with_parameters`]).
//!
//! Invariants:
//! - A nexus seen for the first time (through [`LuState::nexus_connected`]
//!   or its first command) gets POWER ON, RESET OR BUS DEVICE RESET
//!   OCCURRED queued, which supersedes whatever was queued before.
//! - At most [`MAX_UNIT_ATTENTIONS`] are queued per nexus, oldest first,
//!   without duplicates; when full, the newest is dropped (the initiator
//!   still learns that something changed from the ones it gets).
//! - Unit attentions are delivered one per command as CHECK CONDITION,
//!   except that INQUIRY never delivers or clears one, REPORT LUNS clears
//!   only REPORTED LUNS DATA HAS CHANGED, and REQUEST SENSE returns the
//!   oldest as its data with GOOD status (SPC-5 §5.14 with UA_INTLCK_CTRL
//!   00b: each unit attention is cleared when reported).
//! - [`LuState::generation`] changes with every change that can turn
//!   [`LuState::needs_check`] from false to true or change the mode
//!   parameters; a caller caching those answers re-reads them then.

use std::collections::{HashMap, VecDeque};

use super::primary::request_sense;
use super::{plan, respond, LuConfig, Pending, PendingKind, Plan, Residual, Response, Transfer};
use crate::cdb::{self, opcode, Command};
use crate::data::mode::{mode_select, ModeState};
use crate::reservation::{Access, Nexus, PrError, Reservations};
use crate::sense::{
    Sense, MODE_PARAMETERS_CHANGED, POWER_ON_RESET, REPORTED_LUNS_DATA_HAS_CHANGED,
};

/// Bound on the unit attentions queued for one nexus.
pub const MAX_UNIT_ATTENTIONS: usize = 16;

/// What commands change in a logical unit.
#[derive(Debug, Clone)]
pub struct LuState {
    mode: ModeState,
    /// The values a logical unit reset restores (nothing is saved).
    initial_mode: ModeState,
    reservations: Reservations,
    unit_attentions: HashMap<Nexus, VecDeque<Sense>>,
    generation: u64,
}

impl Default for LuState {
    fn default() -> Self {
        LuState::new(ModeState::default())
    }
}

impl LuState {
    pub fn new(mode: ModeState) -> LuState {
        LuState::with_reservations(mode, Reservations::new())
    }

    /// A logical unit whose persistent reservations were restored (APTPL).
    pub fn with_reservations(mode: ModeState, reservations: Reservations) -> LuState {
        LuState {
            mode,
            initial_mode: mode,
            reservations,
            unit_attentions: HashMap::new(),
            generation: 0,
        }
    }

    /// The current mode parameters (the hot path plans with a copy).
    pub fn mode(&self) -> &ModeState {
        &self.mode
    }

    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    /// Changes whenever [`LuState::needs_check`] or [`LuState::mode`] may
    /// have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a command from `nexus` must go through
    /// [`LuState::execute`]: the nexus is new, has unit attentions pending,
    /// or a persistent reservation (or registration) exists.
    pub fn needs_check(&self, nexus: &Nexus) -> bool {
        self.reservations.is_active()
            || self
                .unit_attentions
                .get(nexus)
                .is_none_or(|q| !q.is_empty())
    }

    /// The unit attentions queued for `nexus`, oldest first.
    pub fn pending_unit_attentions(&self, nexus: &Nexus) -> Vec<Sense> {
        self.unit_attentions
            .get(nexus)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// A new I_T nexus (login): it first hears of the power on / reset.
    /// Registering a nexus already known does nothing.
    pub fn nexus_connected(&mut self, nexus: &Nexus) {
        if !self.unit_attentions.contains_key(nexus) {
            self.unit_attentions
                .insert(nexus.clone(), VecDeque::from([POWER_ON_RESET]));
            self.bump();
        }
    }

    /// The I_T nexus is gone (logout, connection loss): its queue and its
    /// SPC-2 reservation go; persistent reservations survive, as SPC-5
    /// requires.
    pub fn nexus_lost(&mut self, nexus: &Nexus) {
        self.unit_attentions.remove(nexus);
        self.reservations.nexus_lost(nexus);
        self.bump();
    }

    /// Queues `sense` for every known nexus (capacity change, ALUA state
    /// change, LUN inventory change).
    pub fn post_unit_attention(&mut self, sense: Sense) {
        for queue in self.unit_attentions.values_mut() {
            enqueue(queue, sense);
        }
        self.bump();
    }

    /// Queues `sense` for one nexus (known or not: an unknown one is
    /// registered first).
    pub fn post_unit_attention_to(&mut self, nexus: &Nexus, sense: Sense) {
        self.nexus_connected(nexus);
        if let Some(queue) = self.unit_attentions.get_mut(nexus) {
            enqueue(queue, sense);
        }
        self.bump();
    }

    /// Queues `sense` for every known nexus but `except`.
    fn post_to_others(&mut self, except: &Nexus, sense: Sense) {
        for (nexus, queue) in &mut self.unit_attentions {
            if nexus != except {
                enqueue(queue, sense);
            }
        }
        self.bump();
    }

    /// LOGICAL UNIT RESET (or a target reset), reported to every nexus
    /// with `sense` (BUS DEVICE RESET FUNCTION OCCURRED for a LUN reset):
    /// mode parameters return to their initial values and the SPC-2
    /// reservation is released; persistent reservations are kept.
    pub fn reset(&mut self, sense: Sense) {
        self.mode = self.initial_mode;
        self.reservations.logical_unit_reset();
        for queue in self.unit_attentions.values_mut() {
            queue.clear();
            queue.push_back(sense);
        }
        self.bump();
    }

    fn take_unit_attention(&mut self, nexus: &Nexus) -> Option<Sense> {
        let sense = self.unit_attentions.get_mut(nexus)?.pop_front()?;
        self.bump();
        Some(sense)
    }

    /// Decides any command from `nexus`: unit attentions first, then the
    /// CDB, reservations, ALUA and the command itself. Never returns
    /// [`Plan::NeedsState`].
    pub fn execute(
        &mut self,
        config: &LuConfig,
        nexus: &Nexus,
        cdb: &[u8],
        transfer: Transfer,
    ) -> Plan {
        self.nexus_connected(nexus);
        let op = cdb.first().copied();
        // Unit attentions go before the CDB is even decoded (SAM-5 §5.14:
        // they outrank every other check but those of the three commands
        // that never report them).
        match op {
            Some(opcode::INQUIRY) | Some(opcode::REQUEST_SENSE) => {}
            Some(opcode::REPORT_LUNS) => self.clear_reported_luns_changed(nexus),
            _ => {
                if let Some(sense) = self.take_unit_attention(nexus) {
                    return respond(Some(sense), Residual::None);
                }
            }
        }
        let command = match cdb::parse(cdb) {
            Ok(c) => c,
            Err(sense) => return respond(Some(sense), Residual::None),
        };
        let port = nexus.relative_target_port;
        if let Err(sense) = super::alua::admit(config, port, &command) {
            return respond(Some(sense), Residual::None);
        }
        if self.reservations.is_active() && !self.reservations.permits(nexus, access_of(&command)) {
            return Plan::Respond(Response::reservation_conflict());
        }
        match command {
            Command::RequestSense { desc, alloc_len } => {
                let pending = self.take_unit_attention(nexus);
                request_sense(pending, desc, alloc_len, transfer)
            }
            Command::PersistentReserveIn {
                service_action,
                alloc_len,
            } => {
                let mut data = Vec::new();
                match self
                    .reservations
                    .reserve_in(service_action, alloc_len, &mut data)
                {
                    Ok(()) => Plan::Respond(super::finish_data_in(
                        data,
                        u32::from(alloc_len),
                        transfer.data_in(),
                    )),
                    Err(sense) => respond(Some(sense), Residual::None),
                }
            }
            Command::Reserve { .. } | Command::Release { .. } => {
                let result = if matches!(command, Command::Reserve { .. }) {
                    self.reservations.reserve_legacy(nexus)
                } else {
                    self.reservations.release_legacy(nexus)
                };
                self.bump();
                match result {
                    Ok(()) => respond(None, Residual::of(transfer.expected_length, 0)),
                    Err(PrError::Conflict) => Plan::Respond(Response::reservation_conflict()),
                    Err(PrError::Check(sense)) => respond(Some(sense), Residual::None),
                }
            }
            _ => plan(config, &self.mode, port, &command, transfer),
        }
    }

    fn clear_reported_luns_changed(&mut self, nexus: &Nexus) {
        if let Some(queue) = self.unit_attentions.get_mut(nexus) {
            let before = queue.len();
            queue.retain(|s| !s.is(&REPORTED_LUNS_DATA_HAS_CHANGED));
            if queue.len() != before {
                self.bump();
            }
        }
    }

    /// Finishes any two-phase command with its parameter list (`params`:
    /// the data-out collected for [`Plan::ParameterList`]).
    pub fn with_parameters(
        &mut self,
        config: &LuConfig,
        nexus: &Nexus,
        pending: Pending,
        params: &[u8],
    ) -> Plan {
        let residual = pending.residual;
        match pending.kind {
            PendingKind::Unmap => super::with_parameters(config, pending, params),
            PendingKind::ModeSelect { ten, pf, sp } => {
                match mode_select(ten, pf, sp, params, &self.mode) {
                    Ok(mode) => {
                        if mode != self.mode {
                            self.mode = mode;
                            // SPC-5 §7.5.1: the other I_T nexuses learn
                            // that the parameters changed.
                            self.post_to_others(nexus, MODE_PARAMETERS_CHANGED);
                        }
                        respond(None, residual)
                    }
                    Err(sense) => respond(Some(sense), residual),
                }
            }
            PendingKind::PersistentReserveOut {
                service_action,
                scope,
                kind,
            } => {
                let outcome =
                    self.reservations
                        .reserve_out(nexus, service_action, scope, kind, params);
                self.bump();
                match outcome {
                    Ok(outcome) => {
                        for (to, sense) in outcome.unit_attentions {
                            self.post_unit_attention_to(&to, sense);
                        }
                        Plan::ReservationsChanged {
                            aborted: outcome.aborted,
                            persist: outcome.changed && self.reservations.aptpl(),
                            response: Response::good().with_residual(residual),
                        }
                    }
                    Err(PrError::Conflict) => {
                        Plan::Respond(Response::reservation_conflict().with_residual(residual))
                    }
                    Err(PrError::Check(sense)) => respond(Some(sense), residual),
                }
            }
        }
    }
}

fn enqueue(queue: &mut VecDeque<Sense>, sense: Sense) {
    if sense.is(&POWER_ON_RESET) {
        // A reset supersedes every older condition.
        queue.clear();
    }
    if queue.iter().any(|s| s.is(&sense)) || queue.len() >= MAX_UNIT_ATTENTIONS {
        return;
    }
    queue.push_back(sense);
}

/// How a command touches the logical unit, for the reservation conflict
/// rules (SPC-5 §5.14.3 and SBC-4 §4.17, as [`Access`] classifies them).
pub fn access_of(command: &Command) -> Access {
    match *command {
        Command::Read(_)
        | Command::Verify { .. }
        | Command::PreFetch { .. }
        | Command::GetLbaStatus { .. }
        | Command::ModeSense { .. }
        | Command::ReportSupportedOpcodes { .. } => Access::Read,
        Command::Write(_)
        | Command::WriteAndVerify { .. }
        | Command::WriteSame { .. }
        | Command::Unmap { .. }
        | Command::CompareAndWrite { .. }
        | Command::SynchronizeCache { .. } => Access::Write,
        Command::ModeSelect { .. } | Command::SendDiagnostic { .. } => {
            Access::NonMediaConflicting
        }
        // Starting the unit and allowing removal never conflict; stopping
        // it, changing its power condition or preventing removal do.
        Command::StartStopUnit {
            start,
            power_condition,
            ..
        } => {
            if start && power_condition == 0 {
                Access::NonMediaAllowed
            } else {
                Access::NonMediaConflicting
            }
        }
        Command::PreventAllowMediumRemoval { prevent } => {
            if prevent == 0 {
                Access::NonMediaAllowed
            } else {
                Access::NonMediaConflicting
            }
        }
        Command::TestUnitReady
        | Command::PersistentReserveIn { .. }
        | Command::PersistentReserveOut { .. } => Access::NonMediaLegacyConflicting,
        Command::RequestSense { .. }
        | Command::Inquiry { .. }
        | Command::ReadCapacity10
        | Command::ReadCapacity16 { .. }
        | Command::ReportLuns { .. }
        | Command::ReportTargetPortGroups { .. }
        // RESERVE / RELEASE apply their own rules.
        | Command::Reserve { .. }
        | Command::Release { .. } => Access::NonMediaAllowed,
    }
}
