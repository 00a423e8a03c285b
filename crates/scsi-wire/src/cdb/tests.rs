//! Literal-byte decoding tests: every CDB below is written out from the
//! SBC-4/SPC-5 field tables, not produced by an encoder.

use super::*;
use crate::sense::{FieldPointer, SenseKey, INVALID_FIELD_IN_CDB};
use proptest::prelude::*;

fn invalid_field(byte: u16, bit: Option<u8>) -> Sense {
    Sense::invalid_field_in_cdb(byte, bit)
}

fn pad16(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    v.resize(16.max(b.len()), 0);
    v
}

#[test]
fn test_unit_ready_and_request_sense() {
    assert_eq!(parse(&[0, 0, 0, 0, 0, 0]), Ok(Command::TestUnitReady));
    assert_eq!(
        parse(&pad16(&[0x03, 0x01, 0, 0, 0xfc, 0])),
        Ok(Command::RequestSense {
            desc: true,
            alloc_len: 0xfc
        })
    );
}

#[test]
fn inquiry() {
    assert_eq!(
        parse(&[0x12, 0, 0, 0x01, 0x00, 0]),
        Ok(Command::Inquiry {
            evpd: false,
            page_code: 0,
            alloc_len: 256
        })
    );
    assert_eq!(
        parse(&[0x12, 0x01, 0xb0, 0x00, 0x40, 0]),
        Ok(Command::Inquiry {
            evpd: true,
            page_code: 0xb0,
            alloc_len: 64
        })
    );
    // EVPD=0 with a page code (libiscsi test_inquiry_evpd).
    assert_eq!(
        parse(&[0x12, 0x00, 0x01, 0x01, 0x00, 0]),
        Err(invalid_field(2, Some(7)))
    );
    // CMDDT.
    assert_eq!(
        parse(&[0x12, 0x02, 0, 0, 0xff, 0]),
        Err(invalid_field(1, Some(1)))
    );
}

#[test]
fn mode_sense_and_select() {
    assert_eq!(
        parse(&[0x1a, 0x08, 0x7f, 0x00, 0xff, 0]),
        Ok(Command::ModeSense {
            ten: false,
            dbd: true,
            llbaa: false,
            page_control: 1,
            page: 0x3f,
            subpage: 0,
            alloc_len: 255
        })
    );
    assert_eq!(
        parse(&[0x5a, 0x10, 0x88, 0xff, 0, 0, 0, 0x10, 0x00, 0]),
        Ok(Command::ModeSense {
            ten: true,
            dbd: false,
            llbaa: true,
            page_control: 2,
            page: 0x08,
            subpage: 0xff,
            alloc_len: 0x1000
        })
    );
    assert_eq!(
        parse(&[0x15, 0x11, 0, 0, 0x18, 0]),
        Ok(Command::ModeSelect {
            ten: false,
            pf: true,
            sp: true,
            param_len: 0x18
        })
    );
    assert_eq!(
        parse(&[0x55, 0x10, 0, 0, 0, 0, 0, 0x01, 0x02, 0]),
        Ok(Command::ModeSelect {
            ten: true,
            pf: true,
            sp: false,
            param_len: 0x0102
        })
    );
}

#[test]
fn start_stop_prevent_allow_send_diagnostic() {
    assert_eq!(
        parse(&[0x1b, 0x01, 0, 0x00, 0x37, 0]),
        Ok(Command::StartStopUnit {
            immed: true,
            power_condition: 3,
            no_flush: true,
            loej: true,
            start: true
        })
    );
    assert_eq!(
        parse(&[0x1e, 0, 0, 0, 0x01, 0]),
        Ok(Command::PreventAllowMediumRemoval { prevent: 1 })
    );
    assert_eq!(
        parse(&[0x1d, 0x04, 0, 0, 0, 0]),
        Ok(Command::SendDiagnostic {
            self_test_code: 0,
            self_test: true,
            param_len: 0
        })
    );
    // SELFTEST with a self-test code.
    assert_eq!(
        parse(&[0x1d, 0x24, 0, 0, 0, 0]),
        Err(invalid_field(1, Some(7)))
    );
    // A parameter list (no diagnostic pages are supported).
    assert_eq!(
        parse(&[0x1d, 0x10, 0, 0, 8, 0]),
        Err(invalid_field(3, None))
    );
}

#[test]
fn read_6_zero_is_256_blocks() {
    assert_eq!(
        parse(&[0x08, 0x1f, 0xff, 0xfe, 0x00, 0]),
        Ok(Command::Read(BlockIo {
            size: CdbSize::Six,
            lba: 0x1f_fffe,
            blocks: 256,
            dpo: false,
            fua: false,
            group: 0
        }))
    );
    // The three top bits of byte 1 were the LUN in SCSI-2: ignored.
    assert_eq!(
        parse(&[0x0a, 0xe0, 0x00, 0x10, 0x08, 0]),
        Ok(Command::Write(BlockIo {
            size: CdbSize::Six,
            lba: 0x10,
            blocks: 8,
            dpo: false,
            fua: false,
            group: 0
        }))
    );
}

#[test]
fn read_write_10_12_16() {
    let io = |size, lba, blocks, dpo, fua, group| BlockIo {
        size,
        lba,
        blocks,
        dpo,
        fua,
        group,
    };
    assert_eq!(
        parse(&[0x28, 0x18, 0x12, 0x34, 0x56, 0x78, 0x05, 0x00, 0x80, 0]),
        Ok(Command::Read(io(
            CdbSize::Ten,
            0x1234_5678,
            128,
            true,
            true,
            5
        )))
    );
    // FUA_NV (bit 1, obsolete) and RARC (bit 2) are accepted and ignored.
    assert_eq!(
        parse(&[0x2a, 0x0e, 0, 0, 0, 1, 0, 0, 1, 0]),
        Ok(Command::Write(io(CdbSize::Ten, 1, 1, false, true, 0)))
    );
    assert_eq!(
        parse(&[0xa8, 0x00, 0, 0, 0x10, 0, 0x00, 0x01, 0x00, 0x00, 0x3f, 0]),
        Ok(Command::Read(io(
            CdbSize::Twelve,
            0x1000,
            0x1_0000,
            false,
            false,
            0x3f
        )))
    );
    assert_eq!(
        parse(&[0xaa, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Ok(Command::Write(io(CdbSize::Twelve, 0, 0, false, true, 0)))
    );
    assert_eq!(
        parse(&[
            0x88, 0x10, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xff, 0xff, 0xff, 0xff,
            0x01, 0
        ]),
        Ok(Command::Read(io(
            CdbSize::Sixteen,
            0x0102_0304_0506_0708,
            u32::MAX,
            true,
            false,
            1
        )))
    );
    assert_eq!(
        parse(&[0x8a, 0x08, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0]),
        Ok(Command::Write(io(CdbSize::Sixteen, 9, 2, false, true, 0)))
    );
}

#[test]
fn protection_fields_are_invalid() {
    for p in 1..8u8 {
        for op in [0x28u8, 0x2a, 0x2f, 0x2e] {
            assert_eq!(
                parse(&pad16(&[op, p << 5, 0, 0, 0, 0, 0, 0, 1, 0])),
                Err(invalid_field(1, Some(7))),
                "opcode {op:#x} protect {p}"
            );
        }
        for op in [0xa8u8, 0xaa, 0xaf, 0xae, 0x88, 0x8a, 0x8f, 0x8e, 0x89, 0x93] {
            assert_eq!(parse(&pad16(&[op, p << 5])), Err(invalid_field(1, Some(7))));
        }
        assert_eq!(
            parse(&pad16(&[0x41, p << 5])),
            Err(invalid_field(1, Some(7)))
        );
    }
}

#[test]
fn verify_and_write_and_verify() {
    let io = |size, lba, blocks, dpo| BlockIo {
        size,
        lba,
        blocks,
        dpo,
        fua: false,
        group: 0,
    };
    assert_eq!(
        parse(&[0x2f, 0x12, 0, 0, 0, 7, 0, 0, 3, 0]),
        Ok(Command::Verify {
            io: io(CdbSize::Ten, 7, 3, true),
            byte_check: ByteCheck::DataOut
        })
    );
    assert_eq!(
        parse(&[0x2f, 0x06, 0, 0, 0, 0, 0, 0, 1, 0]),
        Ok(Command::Verify {
            io: io(CdbSize::Ten, 0, 1, false),
            byte_check: ByteCheck::OneBlock
        })
    );
    // BYTCHK 10b is reserved.
    assert_eq!(
        parse(&[0x2f, 0x04, 0, 0, 0, 0, 0, 0, 1, 0]),
        Err(invalid_field(1, Some(2)))
    );
    assert_eq!(
        parse(&[0xaf, 0x00, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0]),
        Ok(Command::Verify {
            io: io(CdbSize::Twelve, 1, 2, false),
            byte_check: ByteCheck::Medium
        })
    );
    // Bit 3 of VERIFY is reserved, not FUA.
    assert_eq!(
        parse(&[0x8f, 0x08, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0]),
        Ok(Command::Verify {
            io: io(CdbSize::Sixteen, 5, 1, false),
            byte_check: ByteCheck::Medium
        })
    );
    assert_eq!(
        parse(&[0x2e, 0x02, 0, 0, 0, 0, 0, 0, 1, 0]),
        Ok(Command::WriteAndVerify {
            io: io(CdbSize::Ten, 0, 1, false),
            byte_check: ByteCheck::DataOut
        })
    );
    // BYTCHK 11b is reserved for WRITE AND VERIFY.
    assert_eq!(
        parse(&[0x2e, 0x06, 0, 0, 0, 0, 0, 0, 1, 0]),
        Err(invalid_field(1, Some(2)))
    );
    assert_eq!(
        parse(&[0xae, 0x10, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0]),
        Ok(Command::WriteAndVerify {
            io: io(CdbSize::Twelve, 2, 4, true),
            byte_check: ByteCheck::Medium
        })
    );
    assert_eq!(
        parse(&[0x8e, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0]),
        Ok(Command::WriteAndVerify {
            io: io(CdbSize::Sixteen, 3, 1, false),
            byte_check: ByteCheck::Medium
        })
    );
}

#[test]
fn write_same() {
    assert_eq!(
        parse(&[0x41, 0x08, 0, 0, 0x01, 0x00, 0x02, 0x01, 0x00, 0]),
        Ok(Command::WriteSame {
            size: CdbSize::Ten,
            lba: 0x100,
            blocks: 256,
            unmap: true,
            anchor: false,
            ndob: false,
            group: 2
        })
    );
    assert_eq!(
        parse(&[0x93, 0x19, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),
        Ok(Command::WriteSame {
            size: CdbSize::Sixteen,
            lba: 1,
            blocks: 0,
            unmap: true,
            anchor: true,
            ndob: true,
            group: 0
        })
    );
    // ANCHOR without UNMAP (libiscsi test_writesame10_unmap).
    assert_eq!(
        parse(&[0x41, 0x10, 0, 0, 0, 0, 0, 0, 1, 0]),
        Err(invalid_field(1, Some(4)))
    );
    // PBDATA / LBDATA.
    assert_eq!(
        parse(&[0x41, 0x04, 0, 0, 0, 0, 0, 0, 1, 0]),
        Err(invalid_field(1, Some(2)))
    );
    assert_eq!(parse(&pad16(&[0x93, 0x02])), Err(invalid_field(1, Some(2))));
}

#[test]
fn unmap_sync_prefetch_compare_and_write() {
    assert_eq!(
        parse(&[0x42, 0x01, 0, 0, 0, 0, 0x03, 0x00, 0x18, 0]),
        Ok(Command::Unmap {
            anchor: true,
            group: 3,
            param_len: 24
        })
    );
    assert_eq!(
        parse(&[0x35, 0x02, 0, 0, 0, 8, 0, 0, 0, 0]),
        Ok(Command::SynchronizeCache {
            size: CdbSize::Ten,
            lba: 8,
            blocks: 0,
            immed: true,
            group: 0
        })
    );
    assert_eq!(
        parse(&[0x91, 0x00, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x10, 0, 0x01, 0]),
        Ok(Command::SynchronizeCache {
            size: CdbSize::Sixteen,
            lba: 1 << 32,
            blocks: 0x1000,
            immed: false,
            group: 1
        })
    );
    assert_eq!(
        parse(&[0x34, 0x02, 0, 0, 0, 0, 0x03, 0, 1, 0]),
        Ok(Command::PreFetch {
            size: CdbSize::Ten,
            lba: 0,
            blocks: 1,
            immed: true,
            group: 3
        })
    );
    assert_eq!(
        parse(&[0x90, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0]),
        Ok(Command::PreFetch {
            size: CdbSize::Sixteen,
            lba: 4,
            blocks: 2,
            immed: false,
            group: 0
        })
    );
    assert_eq!(
        parse(&[0x89, 0x18, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0x01, 0, 0]),
        Ok(Command::CompareAndWrite {
            lba: 0x20,
            blocks: 1,
            dpo: true,
            fua: true,
            group: 0
        })
    );
}

#[test]
fn capacity_and_lba_status() {
    assert_eq!(
        parse(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Ok(Command::ReadCapacity10)
    );
    assert_eq!(
        parse(&[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0]),
        Ok(Command::ReadCapacity16 { alloc_len: 32 })
    );
    assert_eq!(
        parse(&[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0x18, 0x01, 0]),
        Ok(Command::GetLbaStatus {
            lba: 0x1000,
            alloc_len: 24,
            report_type: 1
        })
    );
    // Unknown SERVICE ACTION IN(16) service action.
    assert_eq!(
        parse(&pad16(&[0x9e, 0x11])),
        Err(INVALID_COMMAND_OPERATION_CODE)
    );
}

#[test]
fn report_luns_and_maintenance_in() {
    assert_eq!(
        parse(&[0xa0, 0, 0x02, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]),
        Ok(Command::ReportLuns {
            select_report: 2,
            alloc_len: 0x1000
        })
    );
    assert_eq!(
        parse(&[0xa0, 0, 0x10, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]),
        Err(invalid_field(2, Some(7)))
    );
    assert_eq!(
        parse(&[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]),
        Ok(Command::ReportTargetPortGroups {
            extended: true,
            alloc_len: 256
        })
    );
    assert_eq!(
        parse(&[0xa3, 0x4a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]),
        Err(invalid_field(1, Some(7)))
    );
    assert_eq!(
        parse(&[0xa3, 0x0c, 0x82, 0x9e, 0x00, 0x10, 0, 0, 0xff, 0xff, 0, 0]),
        Ok(Command::ReportSupportedOpcodes {
            rctd: true,
            options: 2,
            opcode: 0x9e,
            service_action: 0x10,
            alloc_len: 0xffff
        })
    );
    assert_eq!(
        parse(&[0xa3, 0x0c, 0x04, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0]),
        Err(invalid_field(2, Some(2)))
    );
    // REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS is not supported.
    assert_eq!(
        parse(&[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0]),
        Err(INVALID_COMMAND_OPERATION_CODE)
    );
}

#[test]
fn reserve_release() {
    assert_eq!(
        parse(&[0x16, 0, 0, 0, 0, 0]),
        Ok(Command::Reserve { ten: false })
    );
    // Obsolete fields of RESERVE(6) are ignored.
    assert_eq!(
        parse(&[0x17, 0x1f, 1, 0, 0, 0]),
        Ok(Command::Release { ten: false })
    );
    assert_eq!(
        parse(&[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Ok(Command::Reserve { ten: true })
    );
    assert_eq!(
        parse(&[0x57, 0x10, 0, 0, 0, 0, 0, 0, 0, 0]),
        Err(invalid_field(1, Some(4)))
    );
    assert_eq!(
        parse(&[0x56, 0x02, 0, 0, 0, 0, 0, 0, 8, 0]),
        Err(invalid_field(1, Some(1)))
    );
}

#[test]
fn persistent_reserve() {
    assert_eq!(
        parse(&[0x5e, 0x01, 0, 0, 0, 0, 0, 0x20, 0x00, 0]),
        Ok(Command::PersistentReserveIn {
            service_action: 1,
            alloc_len: 0x2000
        })
    );
    for action in 4..0x20u8 {
        assert_eq!(
            parse(&[0x5e, action, 0, 0, 0, 0, 0, 0x20, 0x00, 0]),
            Err(invalid_field(1, Some(4)))
        );
    }
    assert_eq!(
        parse(&[0x5f, 0x01, 0x03, 0, 0, 0, 0, 0, 0x18, 0]),
        Ok(Command::PersistentReserveOut {
            service_action: 1,
            scope: 0,
            kind: 3,
            param_len: 24
        })
    );
    assert_eq!(
        parse(&[0x5f, 0x09, 0, 0, 0, 0, 0, 0, 0x18, 0]),
        Err(invalid_field(1, Some(4)))
    );
}

#[test]
fn unknown_opcodes() {
    assert_eq!(parse(&[]), Err(INVALID_COMMAND_OPERATION_CODE));
    // FORMAT UNIT, ORWRITE, WRITE ATOMIC(16), a reserved group
    // and a vendor opcode.
    for op in [0x04u8, 0x8b, 0x9c, 0x60, 0x7f, 0xc0, 0xff] {
        assert_eq!(
            parse(&pad16(&[op])),
            Err(INVALID_COMMAND_OPERATION_CODE),
            "{op:#x}"
        );
    }
}

#[test]
fn short_cdb_and_naca() {
    // A 10-byte opcode given 6 bytes: the first missing byte is invalid.
    assert_eq!(parse(&[0x28, 0, 0, 0, 0, 0]), Err(invalid_field(6, None)));
    assert_eq!(parse(&[0x12]), Err(invalid_field(1, None)));
    // NACA in the CONTROL byte of each CDB size.
    assert_eq!(
        parse(&[0, 0, 0, 0, 0, 0x04]),
        Err(invalid_field(5, Some(2)))
    );
    assert_eq!(
        parse(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0x04]),
        Err(invalid_field(9, Some(2)))
    );
    assert_eq!(
        parse(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0x04]),
        Err(invalid_field(11, Some(2)))
    );
    let mut c = pad16(&[0x88]);
    c[15] = 0x04;
    assert_eq!(parse(&c), Err(invalid_field(15, Some(2))));
    // LINK and vendor bits are ignored.
    assert_eq!(parse(&[0, 0, 0, 0, 0, 0xc1]), Ok(Command::TestUnitReady));
    // The encoded sense carries C/D and the bit pointer.
    let s = invalid_field(9, Some(2));
    assert_eq!(s.key, SenseKey::IllegalRequest);
    assert!(s.is(&INVALID_FIELD_IN_CDB));
    assert_eq!(
        s.field_pointer,
        Some(FieldPointer {
            in_cdb: true,
            byte: 9,
            bit: Some(2)
        })
    );
}

#[test]
fn opcode_round_trips_through_command() {
    for usage in supported_opcodes() {
        let mut cdb = usage.usage.clone();
        // Zero every field but the opcode/service action so the CDB is
        // valid, and give the commands that need it a non-zero field.
        for (i, b) in cdb.iter_mut().enumerate().skip(1) {
            if !(i == 1 && usage.service_action.is_some()) {
                *b = 0;
            }
        }
        if let Some(sa) = usage.service_action {
            cdb[1] = sa as u8;
        }
        let command = parse(&cdb).unwrap_or_else(|e| panic!("{:#x}: {e}", usage.opcode));
        assert_eq!(command.opcode(), usage.opcode);
    }
}

#[test]
fn usage_maps_are_sorted_and_sized() {
    let ops = supported_opcodes();
    for pair in ops.windows(2) {
        let key = |u: &crate::data::OpcodeUsage| (u.opcode, u.service_action.unwrap_or(0));
        assert!(key(&pair[0]) < key(&pair[1]));
    }
    for u in &ops {
        assert_eq!(Some(u.usage.len()), group_length(u.opcode));
        assert_eq!(u.usage[0], u.opcode);
        // Control byte: NACA is not supported.
        assert_eq!(u.usage.last().map(|c| c & 0x04), Some(0));
    }
    // libiscsi's *_dpofua tests: DPO and FUA are reported for WRITE(10),
    // and DPO for VERIFY(10).
    let find = |op: u8| ops.iter().find(|u| u.opcode == op).map(|u| u.usage[1]);
    assert_eq!(find(opcode::WRITE_10).map(|b| b & 0x18), Some(0x18));
    assert_eq!(
        find(opcode::COMPARE_AND_WRITE).map(|b| b & 0x18),
        Some(0x18)
    );
    assert_eq!(find(opcode::VERIFY_10).map(|b| b & 0x10), Some(0x10));
}

proptest! {
    #[test]
    fn parse_never_panics(b in prop::collection::vec(any::<u8>(), 0..40)) {
        let _ = parse(&b);
    }

    #[test]
    fn parse_never_panics_on_known_opcodes(
        op in prop::sample::select(supported_opcodes().into_iter().map(|u| u.opcode).collect::<Vec<_>>()),
        rest in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let mut b = vec![op];
        b.extend(rest);
        if let Ok(c) = parse(&b) {
            prop_assert_eq!(c.opcode(), op);
        }
    }
}
