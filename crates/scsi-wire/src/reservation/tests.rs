//! Scenarios mirroring libiscsi's test_prout_* / test_prin_* /
//! test_reserve6_* tests, literal-byte checks of the PERSISTENT RESERVE IN
//! data, and property tests that nothing panics and failures change
//! nothing.

use super::*;
use crate::sense::{
    INSUFFICIENT_REGISTRATION_RESOURCES, INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
    PARAMETER_LIST_LENGTH_ERROR, REGISTRATIONS_PREEMPTED, RESERVATIONS_PREEMPTED,
    RESERVATIONS_RELEASED,
};
use proptest::prelude::*;

fn nexus(n: u8) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.2024-01.test:i{n},i,0x00023d00000{n}"),
        relative_target_port: 1,
    }
}

fn params(key: u64, sa_key: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    p
}

fn out(
    r: &mut Reservations,
    n: &Nexus,
    sa: u8,
    kind: u8,
    key: u64,
    sa_key: u64,
) -> Result<PrOutcome, PrError> {
    r.reserve_out(n, sa, 0, kind, &params(key, sa_key, 0))
}

fn register(r: &mut Reservations, n: &Nexus, key: u64) {
    out(r, n, PR_OUT_REGISTER_AND_IGNORE_EXISTING_KEY, 0, 0, key).unwrap();
}

fn keys(r: &Reservations) -> (u32, Vec<u64>) {
    let mut b = Vec::new();
    r.reserve_in(PR_IN_READ_KEYS, 16384, &mut b).unwrap();
    let n = u32::from_be_bytes(b[4..8].try_into().unwrap()) as usize;
    assert_eq!(n, b.len() - 8);
    let ks = b[8..]
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    (u32::from_be_bytes(b[..4].try_into().unwrap()), ks)
}

/// (key, type) of the reservation, as READ RESERVATION reports it.
fn reserved_as(r: &Reservations) -> Option<(u64, u8)> {
    let mut b = Vec::new();
    r.reserve_in(PR_IN_READ_RESERVATION, 16384, &mut b).unwrap();
    match u32::from_be_bytes(b[4..8].try_into().unwrap()) {
        0 => None,
        _ => Some((u64::from_be_bytes(b[8..16].try_into().unwrap()), b[21])),
    }
}

const TYPES: [PrType; 6] = [
    PrType::WriteExclusive,
    PrType::ExclusiveAccess,
    PrType::WriteExclusiveRegistrantsOnly,
    PrType::ExclusiveAccessRegistrantsOnly,
    PrType::WriteExclusiveAllRegistrants,
    PrType::ExclusiveAccessAllRegistrants,
];

#[test]
fn register_simple() {
    // test_prout_register_simple
    let mut r = Reservations::new();
    let a = nexus(1);
    assert!(!r.is_active());
    register(&mut r, &a, 0x1234);
    assert!(r.is_active());
    assert_eq!(keys(&r), (1, vec![0x1234]));
    // REGISTER with a RESERVATION KEY that is not ours: conflict.
    assert_eq!(
        out(&mut r, &a, PR_OUT_REGISTER, 0, 0, 0x1235),
        Err(PrError::Conflict)
    );
    // Unregister with REGISTER, our key, SARK 0.
    let o = out(&mut r, &a, PR_OUT_REGISTER, 0, 0x1234, 0).unwrap();
    assert!(o.changed);
    assert_eq!(keys(&r), (2, vec![]));
    assert!(!r.is_active());
    // Unregistering again is a no-op that leaves the generation alone.
    assert_eq!(
        out(&mut r, &a, PR_OUT_REGISTER, 0, 0, 0),
        Ok(PrOutcome::default())
    );
    assert_eq!(r.generation(), 2);
    // An unregistered nexus naming a key is a conflict.
    assert_eq!(
        out(&mut r, &a, PR_OUT_REGISTER, 0, 7, 8),
        Err(PrError::Conflict)
    );
}

#[test]
fn register_changes_key() {
    let mut r = Reservations::new();
    let a = nexus(1);
    out(&mut r, &a, PR_OUT_REGISTER, 0, 0, 5).unwrap();
    out(&mut r, &a, PR_OUT_REGISTER, 0, 5, 6).unwrap();
    out(
        &mut r,
        &a,
        PR_OUT_REGISTER_AND_IGNORE_EXISTING_KEY,
        0,
        99,
        7,
    )
    .unwrap();
    assert_eq!(keys(&r), (3, vec![7]));
}

#[test]
fn reserve_release_each_type() {
    // test_prout_reserve_simple and test_prin_report_caps
    let mut r = Reservations::new();
    let a = nexus(1);
    register(&mut r, &a, 0xabc);
    for t in TYPES {
        out(&mut r, &a, PR_OUT_RESERVE, t as u8, 0xabc, 0).unwrap();
        let key = if t.all_registrants() { 0 } else { 0xabc };
        assert_eq!(reserved_as(&r), Some((key, t as u8)));
        // Reserving the same again is GOOD; another type conflicts.
        out(&mut r, &a, PR_OUT_RESERVE, t as u8, 0xabc, 0).unwrap();
        let other = if t == PrType::WriteExclusive { 3 } else { 1 };
        assert_eq!(
            out(&mut r, &a, PR_OUT_RESERVE, other, 0xabc, 0),
            Err(PrError::Conflict)
        );
        // RELEASE with the wrong type: INVALID RELEASE.
        assert_eq!(
            out(&mut r, &a, PR_OUT_RELEASE, other, 0xabc, 0),
            Err(PrError::Check(INVALID_RELEASE_OF_PERSISTENT_RESERVATION))
        );
        out(&mut r, &a, PR_OUT_RELEASE, t as u8, 0xabc, 0).unwrap();
        assert_eq!(reserved_as(&r), None);
    }
    // RESERVE and RELEASE never change the generation.
    assert_eq!(r.generation(), 1);
}

#[test]
fn reserve_needs_registration_and_key() {
    let mut r = Reservations::new();
    let (a, b) = (nexus(1), nexus(2));
    assert_eq!(
        out(&mut r, &a, PR_OUT_RESERVE, 1, 0, 0),
        Err(PrError::Conflict)
    );
    register(&mut r, &a, 1);
    assert_eq!(
        out(&mut r, &a, PR_OUT_RESERVE, 1, 2, 0),
        Err(PrError::Conflict)
    );
    out(&mut r, &a, PR_OUT_RESERVE, 1, 1, 0).unwrap();
    register(&mut r, &b, 2);
    assert_eq!(
        out(&mut r, &b, PR_OUT_RESERVE, 1, 2, 0),
        Err(PrError::Conflict)
    );
    // Release by a registered non-holder: GOOD, nothing released.
    assert_eq!(
        out(&mut r, &b, PR_OUT_RELEASE, 1, 2, 0),
        Ok(PrOutcome::default())
    );
    assert_eq!(reserved_as(&r), Some((1, 1)));
    // Release by an unregistered nexus: conflict.
    assert_eq!(
        out(&mut r, &nexus(3), PR_OUT_RELEASE, 1, 0, 0),
        Err(PrError::Conflict)
    );
}

#[test]
fn cdb_field_errors() {
    let mut r = Reservations::new();
    let a = nexus(1);
    register(&mut r, &a, 1);
    let p = params(1, 0, 0);
    assert_eq!(
        r.reserve_out(&a, PR_OUT_RESERVE, 1, 1, &p),
        Err(PrError::Check(Sense::invalid_field_in_cdb(2, Some(7))))
    );
    assert_eq!(
        r.reserve_out(&a, PR_OUT_RESERVE, 0, 2, &p),
        Err(PrError::Check(Sense::invalid_field_in_cdb(2, Some(3))))
    );
    for sa in [
        PR_OUT_REGISTER_AND_MOVE,
        PR_OUT_REPLACE_LOST_RESERVATION,
        0x1f,
    ] {
        assert_eq!(
            r.reserve_out(&a, sa, 0, 1, &p),
            Err(PrError::Check(Sense::invalid_field_in_cdb(1, Some(4))))
        );
    }
}

#[test]
fn parameter_list_errors() {
    let mut r = Reservations::new();
    let a = nexus(1);
    let plle = Err(PrError::Check(PARAMETER_LIST_LENGTH_ERROR));
    let p = params(0, 1, 0);
    assert_eq!(r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &p[..23]), plle);
    let mut long = p.clone();
    long.push(0);
    assert_eq!(r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &long), plle);
    assert_eq!(r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &[]), plle);
    let bad = |byte, bit| {
        Err(PrError::Check(Sense::invalid_field_in_parameter_list(
            byte,
            Some(bit),
        )))
    };
    // SPEC_I_PT (even with a longer list), ALL_TG_PT, APTPL unsupported.
    let mut spec = params(0, 1, 0x08);
    spec.extend_from_slice(&[0; 24]);
    assert_eq!(r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &spec), bad(20, 3));
    assert_eq!(
        r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &params(0, 1, 0x04)),
        bad(20, 2)
    );
    assert_eq!(
        r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &params(0, 1, 0x01)),
        bad(20, 0)
    );
    assert_eq!(r, Reservations::new());
}

#[test]
fn aptpl_with_persistence() {
    let mut r = Reservations::with_persistence();
    let a = nexus(1);
    r.reserve_out(&a, PR_OUT_REGISTER, 0, 0, &params(0, 9, 0x01))
        .unwrap();
    assert!(r.aptpl());
    out(&mut r, &a, PR_OUT_RESERVE, 3, 9, 0).unwrap();
    r.power_on();
    assert_eq!(keys(&r).1, vec![9]);
    let restored = Reservations::restore(
        r.generation(),
        r.registrations().to_vec(),
        r.reservation().cloned(),
    );
    assert_eq!(reserved_as(&restored), Some((9, 3)));
    assert_eq!(keys(&restored), keys(&r));
    // Without APTPL, power on forgets everything.
    let mut plain = Reservations::new();
    register(&mut plain, &a, 1);
    plain.power_on();
    assert!(!plain.is_active());
}

#[test]
fn clear_simple() {
    // test_prout_clear_simple
    let mut r = Reservations::new();
    let (a, b) = (nexus(1), nexus(2));
    register(&mut r, &a, 10);
    register(&mut r, &b, 20);
    out(&mut r, &a, PR_OUT_RESERVE, 3, 10, 0).unwrap();
    let gen = r.generation();
    let o = out(&mut r, &a, PR_OUT_CLEAR, 0, 10, 0).unwrap();
    assert_eq!(o.unit_attentions, vec![(b.clone(), RESERVATIONS_PREEMPTED)]);
    assert_eq!(reserved_as(&r), None);
    assert_eq!(keys(&r), (gen + 1, vec![]));
    assert_eq!(
        out(&mut r, &a, PR_OUT_CLEAR, 0, 10, 0),
        Err(PrError::Conflict)
    );
}

#[test]
fn preempt_registration_only() {
    // test_prout_preempt_rm_reg: no reservation, k2 preempts k1.
    let mut r = Reservations::new();
    let (a, b) = (nexus(1), nexus(2));
    register(&mut r, &a, 1);
    register(&mut r, &b, 2);
    let gen = r.generation();
    let o = out(&mut r, &b, PR_OUT_PREEMPT, 3, 2, 1).unwrap();
    assert_eq!(
        o.unit_attentions,
        vec![(a.clone(), REGISTRATIONS_PREEMPTED)]
    );
    assert!(o.aborted.is_empty());
    assert_eq!(keys(&r), (gen + 1, vec![2]));
    assert_eq!(reserved_as(&r), None);
    // Nobody holds key 1 any more; key 0 names nobody.
    assert_eq!(
        out(&mut r, &b, PR_OUT_PREEMPT, 3, 2, 1),
        Err(PrError::Conflict)
    );
    assert_eq!(
        out(&mut r, &b, PR_OUT_PREEMPT, 3, 2, 0),
        Err(PrError::Check(Sense::invalid_field_in_parameter_list(
            8,
            Some(7)
        )))
    );
}

#[test]
fn preempt_holder_and_abort() {
    let mut r = Reservations::new();
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    register(&mut r, &a, 1);
    register(&mut r, &b, 2);
    register(&mut r, &c, 3);
    out(&mut r, &a, PR_OUT_RESERVE, 1, 1, 0).unwrap();
    let o = out(&mut r, &b, PR_OUT_PREEMPT_AND_ABORT, 3, 2, 1).unwrap();
    assert_eq!(o.aborted, vec![a.clone()]);
    assert_eq!(
        o.unit_attentions,
        vec![
            (a.clone(), REGISTRATIONS_PREEMPTED),
            (c.clone(), RESERVATIONS_RELEASED),
        ]
    );
    assert_eq!(reserved_as(&r), Some((2, 3)));
    assert!(r.is_holder(&b));
    // The preempted nexus lost everything.
    assert!(!r.permits(&a, Access::Read));
    // Preempting one's own key changes the type, keeping the registration.
    let o = out(&mut r, &b, PR_OUT_PREEMPT, 6, 2, 2).unwrap();
    assert_eq!(o.unit_attentions, vec![(c.clone(), RESERVATIONS_RELEASED)]);
    assert_eq!(reserved_as(&r), Some((2, 6)));
    assert_eq!(keys(&r).1, vec![2, 3]);
}

#[test]
fn preempt_all_registrants() {
    let mut r = Reservations::new();
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    register(&mut r, &a, 1);
    register(&mut r, &b, 2);
    register(&mut r, &c, 3);
    out(&mut r, &a, PR_OUT_RESERVE, 8, 1, 0).unwrap();
    // A non-zero key only removes registrations.
    let o = out(&mut r, &b, PR_OUT_PREEMPT, 8, 2, 3).unwrap();
    assert_eq!(
        o.unit_attentions,
        vec![(c.clone(), REGISTRATIONS_PREEMPTED)]
    );
    assert_eq!(reserved_as(&r), Some((0, 8)));
    // Key 0 takes the reservation and removes everybody else.
    let o = out(&mut r, &b, PR_OUT_PREEMPT, 1, 2, 0).unwrap();
    assert_eq!(
        o.unit_attentions,
        vec![(a.clone(), REGISTRATIONS_PREEMPTED)]
    );
    assert_eq!(reserved_as(&r), Some((2, 1)));
    assert_eq!(keys(&r).1, vec![2]);
}

/// test_prout_reserve_access_*: (registered i2 read, write, unregistered
/// i2 read, write) for each type.
#[test]
fn reserve_access() {
    let expect = [
        (PrType::ExclusiveAccess, [false, false, false, false]),
        (PrType::WriteExclusive, [true, false, true, false]),
        (
            PrType::ExclusiveAccessRegistrantsOnly,
            [true, true, false, false],
        ),
        (
            PrType::WriteExclusiveRegistrantsOnly,
            [true, true, true, false],
        ),
        (
            PrType::ExclusiveAccessAllRegistrants,
            [true, true, false, false],
        ),
        (
            PrType::WriteExclusiveAllRegistrants,
            [true, true, true, false],
        ),
    ];
    for (t, want) in expect {
        let mut r = Reservations::new();
        let (a, b) = (nexus(1), nexus(2));
        register(&mut r, &a, 1);
        register(&mut r, &b, 2);
        out(&mut r, &a, PR_OUT_RESERVE, t as u8, 1, 0).unwrap();
        for acc in [Access::Read, Access::Write, Access::NonMediaConflicting] {
            assert!(r.permits(&a, acc), "{t:?} holder {acc:?}");
        }
        let reg = [r.permits(&b, Access::Read), r.permits(&b, Access::Write)];
        out(&mut r, &b, PR_OUT_REGISTER, 0, 2, 0).unwrap();
        let unreg = [r.permits(&b, Access::Read), r.permits(&b, Access::Write)];
        assert_eq!([reg[0], reg[1], unreg[0], unreg[1]], want, "{t:?}");
        for acc in [Access::NonMediaAllowed, Access::NonMediaLegacyConflicting] {
            assert!(r.permits(&b, acc));
        }
        assert!(!r.permits(&b, Access::NonMediaConflicting));
    }
}

/// test_prout_reserve_ownership_*: unregistering the holder releases a
/// reservation unless it is an all-registrants one.
#[test]
fn reserve_ownership() {
    for t in TYPES {
        let mut r = Reservations::new();
        let (a, b) = (nexus(1), nexus(2));
        register(&mut r, &a, 1);
        register(&mut r, &b, 2);
        out(&mut r, &a, PR_OUT_RESERVE, t as u8, 1, 0).unwrap();
        let o = out(&mut r, &a, PR_OUT_REGISTER, 0, 1, 0).unwrap();
        if t.all_registrants() {
            assert_eq!(reserved_as(&r), Some((0, t as u8)));
            assert!(o.unit_attentions.is_empty());
            let o = out(&mut r, &b, PR_OUT_RELEASE, t as u8, 2, 0).unwrap();
            assert!(o.unit_attentions.is_empty());
        } else {
            let ua = if t.registrants_have_access() {
                vec![(b.clone(), RESERVATIONS_RELEASED)]
            } else {
                vec![]
            };
            assert_eq!(o.unit_attentions, ua, "{t:?}");
        }
        assert_eq!(reserved_as(&r), None, "{t:?}");
        out(&mut r, &b, PR_OUT_REGISTER, 0, 2, 0).unwrap();
        assert!(!r.is_active());
    }
}

#[test]
fn release_attentions() {
    let mut r = Reservations::new();
    let (a, b) = (nexus(1), nexus(2));
    register(&mut r, &a, 1);
    register(&mut r, &b, 2);
    out(&mut r, &a, PR_OUT_RESERVE, 5, 1, 0).unwrap();
    let o = out(&mut r, &a, PR_OUT_RELEASE, 5, 1, 0).unwrap();
    assert_eq!(o.unit_attentions, vec![(b.clone(), RESERVATIONS_RELEASED)]);
    out(&mut r, &a, PR_OUT_RESERVE, 1, 1, 0).unwrap();
    let o = out(&mut r, &a, PR_OUT_RELEASE, 1, 1, 0).unwrap();
    assert!(o.unit_attentions.is_empty());
}

#[test]
fn read_keys_truncated() {
    // test_prin_read_keys_truncate: ADDITIONAL LENGTH keeps the full size.
    let mut r = Reservations::new();
    register(&mut r, &nexus(1), 0x0102_0304_0506_0708);
    let mut b = Vec::new();
    r.reserve_in(PR_IN_READ_KEYS, 8, &mut b).unwrap();
    assert_eq!(b, [0, 0, 0, 1, 0, 0, 0, 8]);
    b.clear();
    r.reserve_in(PR_IN_READ_KEYS, 100, &mut b).unwrap();
    assert_eq!(b, [0, 0, 0, 1, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn read_reservation_bytes() {
    let mut r = Reservations::new();
    let a = nexus(1);
    let mut b = Vec::new();
    r.reserve_in(PR_IN_READ_RESERVATION, 100, &mut b).unwrap();
    assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0]);
    register(&mut r, &a, 0x55);
    out(&mut r, &a, PR_OUT_RESERVE, 6, 0x55, 0).unwrap();
    b.clear();
    r.reserve_in(PR_IN_READ_RESERVATION, 100, &mut b).unwrap();
    assert_eq!(
        b,
        [
            0, 0, 0, 1, 0, 0, 0, 16, //
            0, 0, 0, 0, 0, 0, 0, 0x55, 0, 0, 0, 0, 0, 0x06, 0, 0,
        ]
    );
}

#[test]
fn report_capabilities_bytes() {
    let r = Reservations::new();
    let mut b = Vec::new();
    r.reserve_in(PR_IN_REPORT_CAPABILITIES, 100, &mut b)
        .unwrap();
    assert_eq!(b, [0, 8, 0x10, 0x90, 0xea, 0x01, 0, 0]);
    let p = Reservations::with_persistence();
    b.clear();
    p.reserve_in(PR_IN_REPORT_CAPABILITIES, 100, &mut b)
        .unwrap();
    assert_eq!(b[2], 0x11);
}

#[test]
fn read_full_status_bytes() {
    let mut r = Reservations::new();
    let a = Nexus {
        initiator_port: "iqn.x,i,0x1".into(),
        relative_target_port: 2,
    };
    register(&mut r, &a, 0x77);
    out(&mut r, &a, PR_OUT_RESERVE, 1, 0x77, 0).unwrap();
    let mut b = Vec::new();
    r.reserve_in(PR_IN_READ_FULL_STATUS, 1000, &mut b).unwrap();
    let mut want = vec![0, 0, 0, 1, 0, 0, 0, 48];
    want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0x77, 0, 0, 0, 0, 0x01, 0x01]);
    want.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 0, 0, 24]);
    want.extend_from_slice(&[0x45, 0, 0, 20]);
    let mut name = b"iqn.x,i,0x1".to_vec();
    name.resize(20, 0);
    want.extend_from_slice(&name);
    assert_eq!(b, want);
}

#[test]
fn service_action_range() {
    // test_prin_serviceaction_range
    let r = Reservations::new();
    for sa in 0..4 {
        assert!(r.reserve_in(sa, 16384, &mut Vec::new()).is_ok());
    }
    for sa in 4..0x20 {
        assert_eq!(
            r.reserve_in(sa, 16384, &mut Vec::new()),
            Err(Sense::invalid_field_in_cdb(1, Some(4)))
        );
    }
}

#[test]
fn legacy_two_initiators() {
    // test_reserve6_2initiators
    let mut r = Reservations::new();
    let (a, b) = (nexus(1), nexus(2));
    r.reserve_legacy(&a).unwrap();
    r.reserve_legacy(&a).unwrap();
    assert_eq!(r.reserve_legacy(&b), Err(PrError::Conflict));
    r.release_legacy(&b).unwrap();
    assert!(r.permits(&a, Access::Read));
    assert!(!r.permits(&b, Access::Read));
    assert!(!r.permits(&b, Access::NonMediaLegacyConflicting));
    assert!(r.permits(&b, Access::NonMediaAllowed));
    assert_eq!(
        out(&mut r, &b, PR_OUT_REGISTER, 0, 0, 1),
        Err(PrError::Conflict)
    );
    r.release_legacy(&a).unwrap();
    r.reserve_legacy(&b).unwrap();
    // Nexus loss and LU reset release it.
    r.nexus_lost(&a);
    assert_eq!(r.legacy_holder(), Some(&b));
    r.logical_unit_reset();
    assert!(!r.is_active());
}

#[test]
fn legacy_with_persistent() {
    let mut r = Reservations::new();
    let (a, b) = (nexus(1), nexus(2));
    register(&mut r, &a, 1);
    // Registrations make SPC-2 RESERVE / RELEASE conflict...
    assert_eq!(r.reserve_legacy(&b), Err(PrError::Conflict));
    assert_eq!(r.reserve_legacy(&a), Err(PrError::Conflict));
    // ...except for the holder, where they are GOOD no-ops.
    out(&mut r, &a, PR_OUT_RESERVE, 5, 1, 0).unwrap();
    r.reserve_legacy(&a).unwrap();
    r.release_legacy(&a).unwrap();
    assert_eq!(r.legacy_holder(), None);
    assert_eq!(reserved_as(&r), Some((1, 5)));
}

#[test]
fn registration_limit() {
    let mut r = Reservations::new();
    for i in 0..MAX_REGISTRATIONS {
        let n = Nexus {
            initiator_port: format!("iqn.{i}"),
            relative_target_port: 1,
        };
        register(&mut r, &n, 1);
    }
    let extra = Nexus {
        initiator_port: "iqn.extra".into(),
        relative_target_port: 1,
    };
    assert_eq!(
        out(&mut r, &extra, PR_OUT_REGISTER, 0, 0, 1),
        Err(PrError::Check(INSUFFICIENT_REGISTRATION_RESOURCES))
    );
}

#[test]
fn transport_ids() {
    assert_eq!(
        input::transport_id("iqn.a"),
        [
            0x05, 0, 0, 20, b'i', b'q', b'n', b'.', b'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0
        ]
    );
    let long = "iqn.2024-01.org.example:initiator,i,0x00023d000001";
    let tid = input::transport_id(long);
    assert_eq!(tid[0], 0x45);
    assert_eq!(
        usize::from(u16::from_be_bytes([tid[2], tid[3]])),
        tid.len() - 4
    );
    assert_eq!((tid.len() - 4) % 4, 0);
    assert!(tid.len() - 4 > long.len());
}

fn any_op() -> impl Strategy<Value = (u8, u8, u8, u8, u64, u64, u8)> {
    (
        0u8..3,
        0u8..10,
        0u8..2,
        0u8..9,
        0u64..4,
        0u64..4,
        any::<u8>(),
    )
}

proptest! {
    /// Random sequences never panic, keep the invariants, and failed
    /// commands leave the state as it was.
    #[test]
    fn random_sequences(ops in prop::collection::vec(any_op(), 0..40)) {
        let mut r = Reservations::new();
        for (who, sa, scope, kind, key, sa_key, flags) in ops {
            let n = nexus(who);
            let before = r.clone();
            let p = params(key, sa_key, flags & 0x05);
            match r.reserve_out(&n, sa, scope, kind, &p) {
                Ok(o) => {
                    prop_assert!(o.unit_attentions.iter().all(|(m, _)| m != &n));
                }
                Err(_) => prop_assert_eq!(&r, &before),
            }
            if let Some(res) = r.reservation() {
                if res.kind.all_registrants() {
                    prop_assert!(!r.registrations().is_empty());
                } else {
                    prop_assert!(r.key_of(&res.holder).is_some());
                }
            }
            prop_assert!(r.registrations().iter().all(|x| x.key != 0));
            for sa in 0..5 {
                let _ = r.reserve_in(sa, 64, &mut Vec::new());
            }
        }
    }

    #[test]
    fn arbitrary_parameter_lists(b in prop::collection::vec(any::<u8>(), 0..64),
                                 sa in 0u8..32, scope in 0u8..16, kind in 0u8..16) {
        let mut r = Reservations::with_persistence();
        register(&mut r, &nexus(1), 1);
        let _ = r.reserve_out(&nexus(1), sa, scope, kind, &b);
        let _ = r.reserve_out(&nexus(2), sa, scope, kind, &b);
    }
}
