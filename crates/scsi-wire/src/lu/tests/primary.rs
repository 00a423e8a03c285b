//! SPC command planning: data-in cut to allocation and expected lengths,
//! REPORT SUPPORTED OPERATION CODES, ALUA admission.

use super::*;
use crate::sense::{
    INVALID_COMMAND_OPERATION_CODE, STATUS_GOOD, TARGET_PORT_IN_STANDBY_STATE,
    TARGET_PORT_IN_UNAVAILABLE_STATE,
};

#[test]
fn inquiry_allocation_and_expected_lengths() {
    let c = config();
    // Standard INQUIRY is 96 bytes.
    let r = response(plan_cdb(&c, &[0x12, 0, 0, 0, 0xff, 0], read_t(255)));
    assert_eq!(r.status, STATUS_GOOD);
    assert_eq!(r.data_in.len(), 96);
    assert_eq!(r.residual, Residual::Underflow(255 - 96));
    assert_eq!(&r.data_in[8..16], b"BASALT  ");
    // Cut by the allocation length: no residual when EDTL matches it.
    let r = response(plan_cdb(&c, &[0x12, 0, 0, 0, 5, 0], read_t(5)));
    assert_eq!(r.data_in.len(), 5);
    assert_eq!(r.residual, Residual::None);
    // Cut by the expected length: overflow.
    let r = response(plan_cdb(&c, &[0x12, 0, 0, 0, 0xff, 0], read_t(36)));
    assert_eq!(r.data_in.len(), 36);
    assert_eq!(r.residual, Residual::Overflow(96 - 36));
    // Supported VPD pages.
    let r = response(plan_cdb(&c, &[0x12, 1, 0, 0, 0xff, 0], read_t(255)));
    assert_eq!(&r.data_in[..2], &[0, 0]);
    // An unsupported page.
    assert_eq!(
        sense_of(&plan_cdb(&c, &[0x12, 1, 0x99, 0, 0xff, 0], read_t(255))).asc,
        0x24
    );
}

#[test]
fn mode_sense_residuals() {
    // libiscsi test_modesense6_residuals.
    let c = config();
    let r = response(plan_cdb(&c, &[0x1a, 0, 0x3f, 0, 4, 0], read_t(4)));
    assert!(r.data_in.len() <= 4);
    assert!(!matches!(r.residual, Residual::Overflow(_)));
    let r = response(plan_cdb(&c, &[0x1a, 0, 0x3f, 0, 255, 0], read_t(255)));
    assert!(r.data_in.len() < 255);
    assert!(matches!(r.residual, Residual::Underflow(_)));
    // DPOFUA in the device-specific parameter, no WP.
    assert_eq!(r.data_in[2] & 0x90, 0x10);
    let mut ro = config();
    ro.read_only = true;
    let r = response(plan_cdb(&ro, &[0x1a, 0, 0x3f, 0, 255, 0], read_t(255)));
    assert_eq!(r.data_in[2] & 0x80, 0x80);
}

#[test]
fn mode_select_is_two_phase() {
    let c = config();
    let p = plan_cdb(&c, &[0x15, 0x10, 0, 0, 24, 0], write_t(24));
    assert_eq!(
        p,
        Plan::ParameterList {
            len: 24,
            then: Pending {
                kind: PendingKind::ModeSelect {
                    ten: false,
                    pf: true,
                    sp: false
                },
                residual: Residual::None
            }
        }
    );
    // The pure completion cannot apply it.
    let Plan::ParameterList { then, .. } = p else {
        unreachable!()
    };
    assert_eq!(with_parameters(&c, then, &[0; 24]), Plan::NeedsState);
    // Expected length shorter than the parameter list: only that arrives.
    assert!(matches!(
        plan_cdb(&c, &[0x15, 0x10, 0, 0, 24, 0], write_t(12)),
        Plan::ParameterList {
            len: 12,
            then: Pending {
                residual: Residual::Overflow(12),
                ..
            }
        }
    ));
}

#[test]
fn request_sense_without_pending_sense() {
    let c = config();
    let r = response(plan_cdb(&c, &[0x03, 0, 0, 0, 18, 0], read_t(18)));
    assert_eq!(
        r.data_in,
        [0x70, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    let r = response(plan_cdb(&c, &[0x03, 1, 0, 0, 252, 0], read_t(252)));
    assert_eq!(r.data_in, [0x72, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(r.residual, Residual::Underflow(244));
}

#[test]
fn no_data_commands() {
    let c = config();
    for cdb in [
        [0x00, 0, 0, 0, 0, 0],
        [0x1b, 0, 0, 0, 0x01, 0],
        [0x1b, 0x01, 0, 0, 0x00, 0],
        [0x1e, 0, 0, 0, 0x01, 0],
        [0x1e, 0, 0, 0, 0x00, 0],
        [0x1d, 0x04, 0, 0, 0, 0],
    ] {
        assert_eq!(
            plan_cdb(&c, &cdb, none_t()),
            good(Residual::None),
            "{cdb:02x?}"
        );
    }
    // Expected data with a command that moves none: underflow.
    assert_eq!(
        plan_cdb(&c, &[0, 0, 0, 0, 0, 0], read_t(512)),
        good(Residual::Underflow(512))
    );
    assert_eq!(
        sense_of(&plan_cdb(&c, &[0x1e, 0, 0, 0, 0x02, 0], none_t())),
        Sense::invalid_field_in_cdb(4, Some(1))
    );
}

#[test]
fn report_luns_and_persistent_reserve_in_are_deferred() {
    let c = config();
    let p = plan_cdb(
        &c,
        &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        read_t(0x1000),
    );
    assert_eq!(
        p,
        Plan::ReportLuns {
            select_report: 0,
            alloc_len: 0x1000,
            expected_length: 0x1000
        }
    );
    let r = report_luns(&[0, 1], 0, 0x1000, 0x1000);
    assert_eq!(
        r.data_in,
        [0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(r.residual, Residual::Underflow(0x1000 - 24));
    // Well known LUs only: none.
    assert_eq!(report_luns(&[0, 1], 1, 16, 16).data_in, [0; 8]);
    assert_eq!(
        plan_cdb(&c, &[0x5e, 0, 0, 0, 0, 0, 0, 0x20, 0, 0], read_t(0x2000)),
        Plan::NeedsState
    );
}

fn rsoc(options: u8, op: u8, sa: u16) -> [u8; 12] {
    let s = sa.to_be_bytes();
    [0xa3, 0x0c, options, op, s[0], s[1], 0, 0, 0xff, 0xff, 0, 0]
}

#[test]
fn report_supported_operation_codes() {
    let c = config();
    // All commands, with the timeout descriptors when RCTD is set.
    let r = response(plan_cdb(&c, &rsoc(0, 0, 0), read_t(0xffff)));
    let len = u32::from_be_bytes([r.data_in[0], r.data_in[1], r.data_in[2], r.data_in[3]]);
    assert_eq!(len as usize + 4, r.data_in.len());
    let r = response(plan_cdb(&c, &rsoc(0x80, 0, 0), read_t(0xffff)));
    assert_eq!(r.data_in[4 + 5] & 0x02, 0x02);
    // WRITE(10) by opcode: DPO and FUA in the usage data.
    let r = response(plan_cdb(&c, &rsoc(1, 0x2a, 0), read_t(0xffff)));
    assert_eq!(r.data_in[1] & 0x07, 0x03);
    assert_eq!(&r.data_in[2..4], &[0, 10]);
    assert_eq!(r.data_in[4], 0x2a);
    assert_eq!(r.data_in[5] & 0x18, 0x18);
    // An opcode with service actions asked for without one, and the
    // reverse (test_report_supported_opcodes_one_command).
    assert_eq!(
        sense_of(&plan_cdb(&c, &rsoc(1, 0x9e, 0x10), read_t(0xffff))).asc,
        0x24
    );
    assert_eq!(
        sense_of(&plan_cdb(&c, &rsoc(2, 0x2a, 0), read_t(0xffff))).asc,
        0x24
    );
    let r = response(plan_cdb(&c, &rsoc(2, 0x9e, 0x10), read_t(0xffff)));
    assert_eq!(&r.data_in[4..6], &[0x9e, 0x10]);
    // An unsupported opcode: SUPPORT = 001b.
    let r = response(plan_cdb(&c, &rsoc(1, 0x04, 0), read_t(0xffff)));
    assert_eq!(r.data_in[1] & 0x07, 0x01);
    // Without provisioning UNMAP is not listed; without ALUA neither is
    // REPORT TARGET PORT GROUPS.
    let mut thick = config();
    thick.provisioning = Provisioning::default();
    let r = response(plan_cdb(&thick, &rsoc(1, 0x42, 0), read_t(0xffff)));
    assert_eq!(r.data_in[1] & 0x07, 0x01);
    let r = response(plan_cdb(&c, &rsoc(2, 0xa3, 0x0a), read_t(0xffff)));
    assert_eq!(r.data_in[1] & 0x07, 0x01);
    let r = response(plan_cdb(
        &alua_config(AluaState::Standby),
        &rsoc(2, 0xa3, 0x0a),
        read_t(0xffff),
    ));
    assert_eq!(r.data_in[1] & 0x07, 0x03);
}

#[test]
fn report_target_port_groups() {
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    assert_eq!(
        sense_of(&plan_cdb(&config(), &rtpg, read_t(256))),
        INVALID_COMMAND_OPERATION_CODE
    );
    let r = response(plan_cdb(
        &alua_config(AluaState::Standby),
        &rtpg,
        read_t(256),
    ));
    assert_eq!(r.status, STATUS_GOOD);
    assert!(r.data_in.len() > 4);
}

#[test]
fn alua_admission() {
    let port2 = |c: &LuConfig, cdb: &[u8], t| {
        let command = parse(cdb).expect("valid");
        plan(c, &ModeState::default(), 2, &command, t)
    };
    let standby = alua_config(AluaState::Standby);
    assert_eq!(
        sense_of(&port2(&standby, &[0, 0, 0, 0, 0, 0], none_t())),
        TARGET_PORT_IN_STANDBY_STATE
    );
    assert_eq!(
        sense_of(&port2(&standby, &read10(0, 1), read_t(BS))),
        TARGET_PORT_IN_STANDBY_STATE
    );
    assert!(matches!(
        port2(&standby, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], read_t(8)),
        Plan::Respond(Response {
            status: STATUS_GOOD,
            ..
        })
    ));
    // The active port of the same unit is unaffected.
    assert!(matches!(
        plan_cdb(&standby, &read10(0, 1), read_t(BS)),
        Plan::Read { .. }
    ));
    let unavailable = alua_config(AluaState::Unavailable);
    assert_eq!(
        sense_of(&port2(
            &unavailable,
            &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            read_t(8)
        )),
        TARGET_PORT_IN_UNAVAILABLE_STATE
    );
    // INQUIRY always answers, with the port's group in the identifiers
    // and TPGS set.
    let r = response(port2(&unavailable, &[0x12, 0, 0, 0, 96, 0], read_t(96)));
    assert_eq!(r.data_in[5] & 0x30, 0x10);
}
