//! The stateful path: unit attention delivery, MODE SELECT, reservations.

use super::*;
use crate::sense::{
    BUS_DEVICE_RESET_FUNCTION_OCCURRED, CAPACITY_DATA_HAS_CHANGED, INVALID_COMMAND_OPERATION_CODE,
    MODE_PARAMETERS_CHANGED, POWER_ON_RESET, REPORTED_LUNS_DATA_HAS_CHANGED, STATUS_GOOD,
    STATUS_RESERVATION_CONFLICT,
};

const TUR: [u8; 6] = [0, 0, 0, 0, 0, 0];

fn exec(state: &mut LuState, n: &Nexus, cdb: &[u8], t: Transfer) -> Plan {
    state.execute(&config(), n, cdb, t)
}

#[test]
fn new_nexus_gets_power_on_reset_once() {
    let mut s = LuState::default();
    let a = nexus("a");
    assert!(s.needs_check(&a));
    assert_eq!(sense_of(&exec(&mut s, &a, &TUR, none_t())), POWER_ON_RESET);
    assert_eq!(exec(&mut s, &a, &TUR, none_t()), good(Residual::None));
    assert!(!s.needs_check(&a));
    // Registering at login works the same way.
    let b = nexus("b");
    s.nexus_connected(&b);
    assert!(s.needs_check(&b));
    assert_eq!(s.pending_unit_attentions(&b), [POWER_ON_RESET]);
}

#[test]
fn inquiry_neither_reports_nor_clears() {
    let mut s = LuState::default();
    let a = nexus("a");
    let r = response(exec(&mut s, &a, &[0x12, 0, 0, 0, 96, 0], read_t(96)));
    assert_eq!(r.status, STATUS_GOOD);
    assert_eq!(r.data_in.len(), 96);
    assert_eq!(s.pending_unit_attentions(&a), [POWER_ON_RESET]);
}

#[test]
fn unit_attention_outranks_an_invalid_cdb() {
    let mut s = LuState::default();
    let a = nexus("a");
    // An unknown opcode first reports (and clears) the unit attention.
    let bad = [0xc0, 0, 0, 0, 0, 0];
    assert_eq!(sense_of(&exec(&mut s, &a, &bad, none_t())), POWER_ON_RESET);
    assert_eq!(
        sense_of(&exec(&mut s, &a, &bad, none_t())),
        INVALID_COMMAND_OPERATION_CODE
    );
}

#[test]
fn request_sense_delivers_as_data() {
    let mut s = LuState::default();
    let a = nexus("a");
    let r = response(exec(&mut s, &a, &[0x03, 0, 0, 0, 18, 0], read_t(18)));
    assert_eq!(r.status, STATUS_GOOD);
    assert_eq!(
        r.data_in,
        [0x70, 0, 0x06, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0, 0, 0, 0, 0]
    );
    assert!(!s.needs_check(&a));
    // Then NO SENSE.
    let r = response(exec(&mut s, &a, &[0x03, 0, 0, 0, 18, 0], read_t(18)));
    assert_eq!(r.data_in[2], 0);
}

#[test]
fn posted_attentions_reach_every_nexus_in_order() {
    let mut s = LuState::default();
    let (a, b) = (nexus("a"), nexus("b"));
    for n in [&a, &b] {
        exec(&mut s, n, &TUR, none_t());
    }
    let g = s.generation();
    s.post_unit_attention(CAPACITY_DATA_HAS_CHANGED);
    s.post_unit_attention(REPORTED_LUNS_DATA_HAS_CHANGED);
    // Duplicates are not queued twice.
    s.post_unit_attention(CAPACITY_DATA_HAS_CHANGED);
    assert_ne!(s.generation(), g);
    assert!(s.needs_check(&a) && s.needs_check(&b));
    assert_eq!(
        s.pending_unit_attentions(&a),
        [CAPACITY_DATA_HAS_CHANGED, REPORTED_LUNS_DATA_HAS_CHANGED]
    );
    // READ reports the oldest; nothing is read.
    assert_eq!(
        sense_of(&exec(&mut s, &a, &read10(0, 1), read_t(BS))),
        CAPACITY_DATA_HAS_CHANGED
    );
    // REPORT LUNS clears only REPORTED LUNS DATA HAS CHANGED and runs.
    let rl = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    assert!(matches!(
        exec(&mut s, &b, &rl, read_t(256)),
        Plan::ReportLuns { .. }
    ));
    assert_eq!(s.pending_unit_attentions(&b), [CAPACITY_DATA_HAS_CHANGED]);
    assert_eq!(
        sense_of(&exec(&mut s, &a, &TUR, none_t())),
        REPORTED_LUNS_DATA_HAS_CHANGED
    );
    assert!(!s.needs_check(&a));
}

#[test]
fn queue_is_bounded_and_reset_supersedes() {
    let mut s = LuState::default();
    let a = nexus("a");
    exec(&mut s, &a, &TUR, none_t());
    for ascq in 0..40u8 {
        s.post_unit_attention(Sense::new(
            crate::sense::SenseKey::UnitAttention,
            0x3f,
            ascq,
        ));
    }
    assert_eq!(s.pending_unit_attentions(&a).len(), MAX_UNIT_ATTENTIONS);
    s.post_unit_attention(POWER_ON_RESET);
    assert_eq!(s.pending_unit_attentions(&a), [POWER_ON_RESET]);
    s.reset(BUS_DEVICE_RESET_FUNCTION_OCCURRED);
    assert_eq!(
        s.pending_unit_attentions(&a),
        [BUS_DEVICE_RESET_FUNCTION_OCCURRED]
    );
    s.nexus_lost(&a);
    assert_eq!(s.pending_unit_attentions(&a), []);
    assert!(s.needs_check(&a));
}

/// MODE SENSE(6) of the caching page (DBD) turned into a MODE SELECT(6)
/// parameter list with WCE set to `wce`.
fn caching_select(s: &mut LuState, n: &Nexus, wce: bool) -> Vec<u8> {
    let r = response(exec(s, n, &[0x1a, 0x08, 0x08, 0, 255, 0], read_t(255)));
    let mut p = r.data_in;
    p[0] = 0; // MODE DATA LENGTH is reserved in MODE SELECT
    p[2] = 0;
    if wce {
        p[6] |= 0x04;
    } else {
        p[6] &= !0x04;
    }
    p
}

#[test]
fn mode_select_changes_wce_and_tells_the_others() {
    let c = config();
    let mut s = LuState::default();
    let (a, b) = (nexus("a"), nexus("b"));
    for n in [&a, &b] {
        exec(&mut s, n, &TUR, none_t());
    }
    assert!(s.mode().write_cache);
    let params = caching_select(&mut s, &a, false);
    let len = params.len() as u8;
    let p = exec(
        &mut s,
        &a,
        &[0x15, 0x10, 0, 0, len, 0],
        write_t(u32::from(len)),
    );
    let Plan::ParameterList { len: got, then } = p else {
        panic!("{p:?}")
    };
    assert_eq!(got, u32::from(len));
    let g = s.generation();
    assert_eq!(
        s.with_parameters(&c, &a, then, &params),
        good(Residual::None)
    );
    assert!(!s.mode().write_cache);
    assert_ne!(s.generation(), g);
    // The other nexus hears of it, the one that changed it does not.
    assert_eq!(s.pending_unit_attentions(&b), [MODE_PARAMETERS_CHANGED]);
    assert_eq!(s.pending_unit_attentions(&a), []);
    // Writes are now durable.
    assert!(matches!(
        exec(&mut s, &a, &write10(0, 1), write_t(BS)),
        Plan::Write { fua: true, .. }
    ));
    // Selecting the same values again changes nothing.
    let params = caching_select(&mut s, &a, false);
    assert_eq!(
        s.with_parameters(&c, &a, then, &params),
        good(Residual::None)
    );
    assert_eq!(s.pending_unit_attentions(&b), [MODE_PARAMETERS_CHANGED]);
    // A logical unit reset restores the initial WCE.
    s.reset(BUS_DEVICE_RESET_FUNCTION_OCCURRED);
    assert!(s.mode().write_cache);
}

/// PERSISTENT RESERVE OUT through the two phases.
fn pr_out(s: &mut LuState, n: &Nexus, sa: u8, kind: u8, key: u64, sa_key: u64) -> Plan {
    let cdb = [0x5f, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let Plan::ParameterList { len: 24, then } = exec(s, n, &cdb, write_t(24)) else {
        panic!("PR OUT did not ask for its parameter list")
    };
    let mut params = vec![0u8; 24];
    params[..8].copy_from_slice(&key.to_be_bytes());
    params[8..16].copy_from_slice(&sa_key.to_be_bytes());
    s.with_parameters(&config(), n, then, &params)
}

fn status(plan: &Plan) -> u8 {
    match plan {
        Plan::Respond(r) => r.status,
        Plan::ReservationsChanged { response, .. } => response.status,
        Plan::Read { .. } | Plan::Write { .. } => STATUS_GOOD,
        other => panic!("{other:?}"),
    }
}

#[test]
fn persistent_reservation_conflicts() {
    let mut s = LuState::default();
    let (a, b) = (nexus("a"), nexus("b"));
    for n in [&a, &b] {
        exec(&mut s, n, &TUR, none_t());
    }
    // REGISTER key 0x1234, then RESERVE write exclusive.
    assert_eq!(status(&pr_out(&mut s, &a, 0, 0, 0, 0x1234)), STATUS_GOOD);
    assert!(s.needs_check(&b));
    assert_eq!(status(&pr_out(&mut s, &a, 1, 1, 0x1234, 0)), STATUS_GOOD);
    // B may read but not write; A may do both.
    assert_eq!(
        status(&exec(&mut s, &b, &read10(0, 1), read_t(BS))),
        STATUS_GOOD
    );
    assert_eq!(
        status(&exec(&mut s, &b, &write10(0, 1), write_t(BS))),
        STATUS_RESERVATION_CONFLICT
    );
    assert_eq!(
        status(&exec(&mut s, &a, &write10(0, 1), write_t(BS))),
        STATUS_GOOD
    );
    // PR IN READ KEYS from B lists A's key.
    let r = response(exec(
        &mut s,
        &b,
        &[0x5e, 0, 0, 0, 0, 0, 0, 0, 0xff, 0],
        read_t(255),
    ));
    assert_eq!(
        &r.data_in[4..16],
        &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x12, 0x34]
    );
    assert_eq!(r.residual, Residual::Underflow(255 - 16));
    // RELEASE and unregister: the hot path is clear again.
    assert_eq!(status(&pr_out(&mut s, &a, 2, 1, 0x1234, 0)), STATUS_GOOD);
    assert_eq!(status(&pr_out(&mut s, &a, 0, 0, 0x1234, 0)), STATUS_GOOD);
    assert!(!s.needs_check(&a) && !s.needs_check(&b));
}

#[test]
fn spc2_reserve_release() {
    // libiscsi test_reserve6_2initiators / _itnexus_loss / _lun_reset.
    let mut s = LuState::default();
    let (a, b) = (nexus("a"), nexus("b"));
    for n in [&a, &b] {
        exec(&mut s, n, &TUR, none_t());
    }
    let reserve = [0x16, 0, 0, 0, 0, 0];
    let release = [0x17, 0, 0, 0, 0, 0];
    let mode_sense = [0x1a, 0, 0x3f, 0, 255, 0];
    assert_eq!(status(&exec(&mut s, &a, &reserve, none_t())), STATUS_GOOD);
    assert_eq!(status(&exec(&mut s, &a, &reserve, none_t())), STATUS_GOOD);
    assert_eq!(
        status(&exec(&mut s, &b, &reserve, none_t())),
        STATUS_RESERVATION_CONFLICT
    );
    assert_eq!(status(&exec(&mut s, &b, &release, none_t())), STATUS_GOOD);
    assert_eq!(
        status(&exec(&mut s, &a, &mode_sense, read_t(255))),
        STATUS_GOOD
    );
    assert_eq!(
        status(&exec(&mut s, &b, &mode_sense, read_t(255))),
        STATUS_RESERVATION_CONFLICT
    );
    assert_eq!(status(&exec(&mut s, &a, &release, none_t())), STATUS_GOOD);
    assert_eq!(status(&exec(&mut s, &b, &reserve, none_t())), STATUS_GOOD);
    // I_T nexus loss releases it.
    s.nexus_lost(&b);
    assert_eq!(status(&exec(&mut s, &a, &reserve, none_t())), STATUS_GOOD);
    // So does a logical unit reset (then A hears of the reset).
    s.reset(BUS_DEVICE_RESET_FUNCTION_OCCURRED);
    assert_eq!(
        sense_of(&exec(&mut s, &b, &reserve, none_t())),
        POWER_ON_RESET
    );
    assert_eq!(status(&exec(&mut s, &b, &reserve, none_t())), STATUS_GOOD);
}
