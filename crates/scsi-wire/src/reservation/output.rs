//! PERSISTENT RESERVE OUT (SPC-5 §6.17): the basic parameter list and the
//! REGISTER, REGISTER AND IGNORE EXISTING KEY, RESERVE, RELEASE, CLEAR,
//! PREEMPT and PREEMPT AND ABORT service actions (SPC-5 §5.14.7 -
//! §5.14.11).
//!
//! Not supported, each refused as SPC-5 prescribes for an unsupported
//! option: SPEC_I_PT and ALL_TG_PT (INVALID FIELD IN PARAMETER LIST;
//! SIP_C = ATP_C = 0), APTPL unless built [`Reservations::with_persistence`]
//! (INVALID FIELD IN PARAMETER LIST; PTPL_C = 0), REGISTER AND MOVE and
//! REPLACE LOST RESERVATION (INVALID FIELD IN CDB: moving a reservation
//! needs TransportID parsing and cross-port registrations that no
//! initiator this target serves uses).
//!
//! Invariant: every check happens before the first change, so an error
//! leaves the state untouched.

use super::{
    Nexus, PrError, PrOutcome, PrType, Registration, Reservation, Reservations, MAX_REGISTRATIONS,
    PR_OUT_CLEAR, PR_OUT_PREEMPT, PR_OUT_PREEMPT_AND_ABORT, PR_OUT_REGISTER,
    PR_OUT_REGISTER_AND_IGNORE_EXISTING_KEY, PR_OUT_RELEASE, PR_OUT_RESERVE,
};
use crate::data::be64;
use crate::sense::{
    Sense, INSUFFICIENT_REGISTRATION_RESOURCES, INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
    PARAMETER_LIST_LENGTH_ERROR, REGISTRATIONS_PREEMPTED, RESERVATIONS_PREEMPTED,
    RESERVATIONS_RELEASED,
};

/// Length of the basic PERSISTENT RESERVE OUT parameter list.
pub const PR_OUT_PARAMETER_LIST_LEN: usize = 24;

const SPEC_I_PT: u8 = 0x08;
const ALL_TG_PT: u8 = 0x04;
const APTPL: u8 = 0x01;

/// The fields of the basic parameter list this target uses.
struct Params {
    key: u64,
    sa_key: u64,
    flags: u8,
}

/// Parses the basic parameter list: it must be exactly 24 bytes (PARAMETER
/// LIST LENGTH ERROR otherwise), unless SPEC_I_PT is set, which is refused
/// as unsupported before its longer list matters.
fn parse(params: &[u8]) -> Result<Params, Sense> {
    let (Some(key), Some(sa_key), Some(&flags)) =
        (be64(params, 0), be64(params, 8), params.get(20))
    else {
        return Err(PARAMETER_LIST_LENGTH_ERROR);
    };
    if flags & SPEC_I_PT != 0 {
        return Err(Sense::invalid_field_in_parameter_list(20, Some(3)));
    }
    if params.len() != PR_OUT_PARAMETER_LIST_LEN {
        return Err(PARAMETER_LIST_LENGTH_ERROR);
    }
    Ok(Params { key, sa_key, flags })
}

/// SCOPE must be LU_SCOPE and TYPE one of the six types.
fn scope_and_type(scope: u8, kind: u8) -> Result<PrType, Sense> {
    if scope != 0 {
        return Err(Sense::invalid_field_in_cdb(2, Some(7)));
    }
    PrType::from_u8(kind).ok_or(Sense::invalid_field_in_cdb(2, Some(3)))
}

impl Reservations {
    /// Runs a PERSISTENT RESERVE OUT from `nexus`: `service_action`, `scope`
    /// and `kind` (TYPE) from the CDB, `params` the parameter list (as
    /// long as the CDB's PARAMETER LIST LENGTH).
    ///
    /// Errors: an unsupported service action or invalid SCOPE / TYPE is
    /// INVALID FIELD IN CDB; parameter list problems as `parse` says; an
    /// unregistered nexus or a RESERVATION KEY that is not the nexus' key
    /// (except for REGISTER AND IGNORE EXISTING KEY, and REGISTER from an
    /// unregistered nexus with key 0) is RESERVATION CONFLICT, as is any
    /// PERSISTENT RESERVE OUT while another nexus holds an SPC-2
    /// reservation.
    pub fn reserve_out(
        &mut self,
        nexus: &Nexus,
        service_action: u8,
        scope: u8,
        kind: u8,
        params: &[u8],
    ) -> Result<PrOutcome, PrError> {
        if self.legacy.as_ref().is_some_and(|h| h != nexus) {
            return Err(PrError::Conflict);
        }
        let prtype = match service_action {
            PR_OUT_RESERVE | PR_OUT_PREEMPT | PR_OUT_PREEMPT_AND_ABORT => {
                Some(scope_and_type(scope, kind)?)
            }
            PR_OUT_REGISTER
            | PR_OUT_RELEASE
            | PR_OUT_CLEAR
            | PR_OUT_REGISTER_AND_IGNORE_EXISTING_KEY => None,
            _ => return Err(Sense::invalid_field_in_cdb(1, Some(4)).into()),
        };
        let p = parse(params)?;
        match (service_action, prtype) {
            (PR_OUT_REGISTER, _) => self.register(nexus, &p, false),
            (PR_OUT_REGISTER_AND_IGNORE_EXISTING_KEY, _) => self.register(nexus, &p, true),
            (PR_OUT_RELEASE, _) => self.release(nexus, &p, scope, kind),
            (PR_OUT_CLEAR, _) => self.clear(nexus, &p),
            (PR_OUT_RESERVE, Some(t)) => self.reserve(nexus, &p, t),
            (PR_OUT_PREEMPT, Some(t)) => self.preempt(nexus, &p, t, false),
            (_, Some(t)) => self.preempt(nexus, &p, t, true),
            (_, None) => Err(Sense::invalid_field_in_cdb(1, Some(4)).into()),
        }
    }

    /// The registration of `nexus` if RESERVATION KEY matches it;
    /// RESERVATION CONFLICT otherwise.
    fn registered(&self, nexus: &Nexus, key: u64) -> Result<(), PrError> {
        match self.key_of(nexus) {
            Some(k) if k == key => Ok(()),
            _ => Err(PrError::Conflict),
        }
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Unit attention `sense` for every registered nexus but `except`.
    fn attention_to_others(&self, except: &Nexus, sense: Sense, out: &mut PrOutcome) {
        for r in &self.registrations {
            if &r.nexus != except {
                out.unit_attentions.push((r.nexus.clone(), sense));
            }
        }
    }

    fn register(&mut self, nexus: &Nexus, p: &Params, ignore: bool) -> Result<PrOutcome, PrError> {
        if p.flags & ALL_TG_PT != 0 {
            return Err(Sense::invalid_field_in_parameter_list(20, Some(2)).into());
        }
        let aptpl = p.flags & APTPL != 0;
        if aptpl && !self.ptpl_capable {
            return Err(Sense::invalid_field_in_parameter_list(20, Some(0)).into());
        }
        let mut outcome = PrOutcome::default();
        match self.registrations.iter().position(|r| &r.nexus == nexus) {
            None => {
                if !ignore && p.key != 0 {
                    return Err(PrError::Conflict);
                }
                if p.sa_key == 0 {
                    // Unregistering an unregistered nexus: nothing to do,
                    // and nothing changed, so PRgeneration stays.
                    return Ok(outcome);
                }
                if self.registrations.len() >= MAX_REGISTRATIONS {
                    return Err(INSUFFICIENT_REGISTRATION_RESOURCES.into());
                }
                self.registrations.push(Registration {
                    nexus: nexus.clone(),
                    key: p.sa_key,
                });
            }
            Some(i) => {
                let current = self.registrations.get(i).map(|r| r.key);
                if !ignore && current != Some(p.key) {
                    return Err(PrError::Conflict);
                }
                if p.sa_key == 0 {
                    self.unregister(i, &mut outcome);
                } else if let Some(r) = self.registrations.get_mut(i) {
                    r.key = p.sa_key;
                }
            }
        }
        self.aptpl = aptpl;
        self.bump();
        outcome.changed = true;
        Ok(outcome)
    }

    /// Removes registration `i`, releasing the reservation it held (SPC-5
    /// §5.14.11.2.3): a registrants-only reservation released this way
    /// tells the other registrants RESERVATIONS RELEASED; an
    /// all-registrants reservation ends with its last registrant.
    fn unregister(&mut self, i: usize, outcome: &mut PrOutcome) {
        if i >= self.registrations.len() {
            return;
        }
        let gone = self.registrations.remove(i);
        let Some(res) = &self.reservation else {
            return;
        };
        if res.kind.all_registrants() {
            if self.registrations.is_empty() {
                self.reservation = None;
            }
        } else if res.holder == gone.nexus {
            let kind = res.kind;
            self.reservation = None;
            if kind.registrants_have_access() {
                self.attention_to_others(&gone.nexus, RESERVATIONS_RELEASED, outcome);
            }
        }
    }

    fn reserve(&mut self, nexus: &Nexus, p: &Params, kind: PrType) -> Result<PrOutcome, PrError> {
        self.registered(nexus, p.key)?;
        let mut outcome = PrOutcome::default();
        match &self.reservation {
            // Reserving again what one holds is GOOD without effect.
            Some(res) if res.kind == kind && self.is_holder(nexus) => {}
            Some(_) => return Err(PrError::Conflict),
            None => {
                self.reservation = Some(Reservation {
                    holder: nexus.clone(),
                    kind,
                });
                outcome.changed = true;
            }
        }
        Ok(outcome)
    }

    fn release(
        &mut self,
        nexus: &Nexus,
        p: &Params,
        scope: u8,
        kind: u8,
    ) -> Result<PrOutcome, PrError> {
        self.registered(nexus, p.key)?;
        let mut outcome = PrOutcome::default();
        let Some(res) = &self.reservation else {
            return Ok(outcome);
        };
        if !self.is_holder(nexus) {
            // Not the holder: GOOD, nothing released (SPC-5 §5.14.11.2.2).
            return Ok(outcome);
        }
        if scope != 0 || kind != res.kind as u8 {
            return Err(INVALID_RELEASE_OF_PERSISTENT_RESERVATION.into());
        }
        let released = res.kind;
        self.reservation = None;
        if released.registrants_have_access() {
            self.attention_to_others(nexus, RESERVATIONS_RELEASED, &mut outcome);
        }
        outcome.changed = true;
        Ok(outcome)
    }

    fn clear(&mut self, nexus: &Nexus, p: &Params) -> Result<PrOutcome, PrError> {
        self.registered(nexus, p.key)?;
        let mut outcome = PrOutcome::default();
        self.attention_to_others(nexus, RESERVATIONS_PREEMPTED, &mut outcome);
        self.registrations.clear();
        self.reservation = None;
        self.bump();
        outcome.changed = true;
        Ok(outcome)
    }

    /// Removes every registration with `key` except the one of `keep`,
    /// returning the nexuses removed.
    fn remove_key(&mut self, key: u64, keep: &Nexus) -> Vec<Nexus> {
        let mut removed = Vec::new();
        self.registrations.retain(|r| {
            let goes = r.key == key && &r.nexus != keep;
            if goes {
                removed.push(r.nexus.clone());
            }
            !goes
        });
        removed
    }

    /// PREEMPT / PREEMPT AND ABORT (SPC-5 §5.14.11.4): SERVICE ACTION
    /// RESERVATION KEY names the registrations to remove; preempting the
    /// holder's key (or, under an all-registrants reservation, key 0) also
    /// moves the reservation to the preempting nexus with the new TYPE.
    /// The preempting nexus never loses its own registration.
    fn preempt(
        &mut self,
        nexus: &Nexus,
        p: &Params,
        kind: PrType,
        abort: bool,
    ) -> Result<PrOutcome, PrError> {
        self.registered(nexus, p.key)?;
        let sark = p.sa_key;
        let current = self.reservation.clone();
        let takes_reservation = match &current {
            None => false,
            Some(res) if res.kind.all_registrants() => sark == 0,
            Some(res) => self.key_of(&res.holder) == Some(sark),
        };
        if !takes_reservation {
            // Only registrations go: key 0 names none, and a key nobody
            // else holds is a conflict.
            if sark == 0 {
                return Err(Sense::invalid_field_in_parameter_list(8, Some(7)).into());
            }
            if !self
                .registrations
                .iter()
                .any(|r| r.key == sark && &r.nexus != nexus)
            {
                return Err(PrError::Conflict);
            }
        }
        let mut outcome = PrOutcome::default();
        let removed = if takes_reservation && sark == 0 {
            // All-registrants reservation preempted as a whole.
            let mut others = Vec::new();
            self.registrations.retain(|r| {
                let goes = &r.nexus != nexus;
                if goes {
                    others.push(r.nexus.clone());
                }
                !goes
            });
            others
        } else {
            self.remove_key(sark, nexus)
        };
        for n in &removed {
            outcome
                .unit_attentions
                .push((n.clone(), REGISTRATIONS_PREEMPTED));
        }
        if takes_reservation {
            self.reservation = Some(Reservation {
                holder: nexus.clone(),
                kind,
            });
            if current.is_some_and(|res| res.kind != kind) {
                // Remaining registrants see the old reservation go.
                self.attention_to_others(nexus, RESERVATIONS_RELEASED, &mut outcome);
            }
        }
        if abort {
            outcome.aborted = removed;
        }
        self.bump();
        outcome.changed = true;
        Ok(outcome)
    }
}
