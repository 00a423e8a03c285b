//! The commands this device server supports, with their CDB usage maps
//! for REPORT SUPPORTED OPERATION CODES (SPC-5 §6.35).
//!
//! Invariants: the list covers exactly the operation codes and service
//! actions [`super::parse`] accepts; a usage bit is one only where the
//! device server evaluates the bit (fields it uses); reserved, obsolete and
//! only-zero-accepted fields (protection information, NACA, ANCHOR) are
//! zero. Byte 0 holds the operation code and, for commands with service
//! actions, the SERVICE ACTION field holds its value.

use super::{opcode as op, service_action as sa};
use crate::data::OpcodeUsage;

/// Usage maps for the block I/O commands' byte 1: DPO+FUA, DPO+BYTCHK.
const DPO_FUA: u8 = 0x18;
const DPO_BYTCHK: u8 = 0x16;
/// IMMED of SYNCHRONIZE CACHE and PRE-FETCH.
const IMMED: u8 = 0x02;
/// GROUP NUMBER (6 bits).
const GROUP: u8 = 0x3f;

/// Every command this device server supports, in ascending operation code
/// (then service action) order.
pub fn supported_opcodes() -> Vec<OpcodeUsage> {
    let ff = 0xff;
    let mut ops = vec![
        plain(&[op::TEST_UNIT_READY, 0, 0, 0, 0, 0]),
        plain(&[op::REQUEST_SENSE, 0x01, 0, 0, ff, 0]),
        plain(&[op::READ_6, 0x1f, ff, ff, ff, 0]),
        plain(&[op::WRITE_6, 0x1f, ff, ff, ff, 0]),
        plain(&[op::INQUIRY, 0x01, ff, ff, ff, 0]),
        plain(&[op::MODE_SELECT_6, 0x11, 0, 0, ff, 0]),
        plain(&[op::RESERVE_6, 0, 0, 0, 0, 0]),
        plain(&[op::RELEASE_6, 0, 0, 0, 0, 0]),
        plain(&[op::MODE_SENSE_6, 0x08, ff, ff, ff, 0]),
        plain(&[op::START_STOP_UNIT, 0x01, 0, 0x0f, 0xf7, 0]),
        plain(&[op::SEND_DIAGNOSTIC, 0xe4, 0, ff, ff, 0]),
        plain(&[op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 0x03, 0]),
        plain(&[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        plain(&ten(op::READ_10, DPO_FUA)),
        plain(&ten(op::WRITE_10, DPO_FUA)),
        plain(&ten(op::WRITE_AND_VERIFY_10, DPO_BYTCHK)),
        plain(&ten(op::VERIFY_10, DPO_BYTCHK)),
        plain(&ten(op::PRE_FETCH_10, IMMED)),
        plain(&ten(op::SYNCHRONIZE_CACHE_10, IMMED)),
        // UNMAP is evaluated (a hint without logical block provisioning);
        // ANCHOR is not supported.
        plain(&ten(op::WRITE_SAME_10, 0x08)),
        plain(&[op::UNMAP, 0, 0, 0, 0, 0, GROUP, ff, ff, 0]),
        plain(&[op::MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, ff, ff, 0]),
        plain(&[op::RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        plain(&[op::RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        plain(&[op::MODE_SENSE_10, 0x18, ff, ff, 0, 0, 0, ff, ff, 0]),
    ];
    for action in 0x00..=0x03 {
        ops.push(with_action(
            &[op::PERSISTENT_RESERVE_IN, action, 0, 0, 0, 0, 0, ff, ff, 0],
            action,
        ));
    }
    for action in 0x00..=0x08 {
        ops.push(with_action(
            &[
                op::PERSISTENT_RESERVE_OUT,
                action,
                ff,
                0,
                0,
                ff,
                ff,
                ff,
                ff,
                0,
            ],
            action,
        ));
    }
    ops.extend([
        plain(&sixteen(op::READ_16, DPO_FUA)),
        plain(&[
            op::COMPARE_AND_WRITE,
            DPO_FUA,
            ff,
            ff,
            ff,
            ff,
            ff,
            ff,
            ff,
            ff,
            0,
            0,
            0,
            ff,
            GROUP,
            0,
        ]),
        plain(&sixteen(op::WRITE_16, DPO_FUA)),
        plain(&sixteen(op::WRITE_AND_VERIFY_16, DPO_BYTCHK)),
        plain(&sixteen(op::VERIFY_16, DPO_BYTCHK)),
        plain(&sixteen(op::PRE_FETCH_16, IMMED)),
        plain(&sixteen(op::SYNCHRONIZE_CACHE_16, IMMED)),
        // UNMAP and NDOB.
        plain(&sixteen(op::WRITE_SAME_16, 0x09)),
        with_action(
            &[
                op::SERVICE_ACTION_IN_16,
                sa::READ_CAPACITY_16,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                ff,
                ff,
                ff,
                ff,
                0,
                0,
            ],
            sa::READ_CAPACITY_16,
        ),
        with_action(
            &[
                op::SERVICE_ACTION_IN_16,
                sa::GET_LBA_STATUS,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                0,
                0,
            ],
            sa::GET_LBA_STATUS,
        ),
        plain(&[op::REPORT_LUNS, 0, ff, 0, 0, 0, ff, ff, ff, ff, 0, 0]),
        with_action(
            &[
                op::MAINTENANCE_IN,
                0xe0 | sa::REPORT_TARGET_PORT_GROUPS,
                0,
                0,
                0,
                0,
                ff,
                ff,
                ff,
                ff,
                0,
                0,
            ],
            sa::REPORT_TARGET_PORT_GROUPS,
        ),
        with_action(
            &[
                op::MAINTENANCE_IN,
                sa::REPORT_SUPPORTED_OPERATION_CODES,
                0x87,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                ff,
                0,
                0,
            ],
            sa::REPORT_SUPPORTED_OPERATION_CODES,
        ),
        plain(&twelve(op::READ_12, DPO_FUA)),
        plain(&twelve(op::WRITE_12, DPO_FUA)),
        plain(&twelve(op::WRITE_AND_VERIFY_12, DPO_BYTCHK)),
        plain(&twelve(op::VERIFY_12, DPO_BYTCHK)),
    ]);
    ops
}

fn plain(usage: &[u8]) -> OpcodeUsage {
    OpcodeUsage {
        opcode: usage.first().copied().unwrap_or(0),
        service_action: None,
        usage: usage.to_vec(),
        timeouts: false,
    }
}

fn with_action(usage: &[u8], action: u8) -> OpcodeUsage {
    OpcodeUsage {
        service_action: Some(u16::from(action)),
        ..plain(usage)
    }
}

/// 10-byte LBA + 16-bit length layout.
fn ten(opcode: u8, flags: u8) -> [u8; 10] {
    [opcode, flags, 0xff, 0xff, 0xff, 0xff, GROUP, 0xff, 0xff, 0]
}

/// 12-byte LBA + 32-bit length layout.
fn twelve(opcode: u8, flags: u8) -> [u8; 12] {
    [
        opcode, flags, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, GROUP, 0,
    ]
}

/// 16-byte 64-bit LBA + 32-bit length layout.
fn sixteen(opcode: u8, flags: u8) -> [u8; 16] {
    [
        opcode, flags, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        GROUP, 0,
    ]
}
