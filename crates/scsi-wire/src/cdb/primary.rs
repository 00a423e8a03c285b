//! Decoding of the SPC-5 commands a block target serves (inquiry, sense,
//! mode pages, LUN inventory, persistent reservations, MAINTENANCE IN).
//!
//! Invariant: returns `Ok(None)` exactly for operation codes this module
//! does not own, so [`super::parse`] can try the next module.

use super::{group_length, opcode as op, service_action as sa, Cdb, Command};
use crate::sense::{Sense, INVALID_COMMAND_OPERATION_CODE};

pub(super) fn parse(opcode: u8, cdb: &[u8]) -> Result<Option<Command>, Sense> {
    let owned = matches!(
        opcode,
        op::TEST_UNIT_READY
            | op::REQUEST_SENSE
            | op::INQUIRY
            | op::MODE_SELECT_6
            | op::MODE_SENSE_6
            | op::START_STOP_UNIT
            | op::SEND_DIAGNOSTIC
            | op::PREVENT_ALLOW_MEDIUM_REMOVAL
            | op::MODE_SELECT_10
            | op::MODE_SENSE_10
            | op::RESERVE_6
            | op::RELEASE_6
            | op::RESERVE_10
            | op::RELEASE_10
            | op::PERSISTENT_RESERVE_IN
            | op::PERSISTENT_RESERVE_OUT
            | op::REPORT_LUNS
            | op::MAINTENANCE_IN
    );
    if !owned {
        return Ok(None);
    }
    let len = group_length(opcode).unwrap_or(6);
    let c = Cdb::new(cdb, len)?;
    let command = match opcode {
        op::TEST_UNIT_READY => Command::TestUnitReady,
        op::REQUEST_SENSE => Command::RequestSense {
            desc: c.bit(1, 0),
            alloc_len: c.u8(4),
        },
        op::INQUIRY => inquiry(&c)?,
        op::MODE_SENSE_6 => Command::ModeSense {
            ten: false,
            dbd: c.bit(1, 3),
            llbaa: false,
            page_control: c.u8(2) >> 6,
            page: c.u8(2) & 0x3f,
            subpage: c.u8(3),
            alloc_len: u16::from(c.u8(4)),
        },
        op::MODE_SENSE_10 => Command::ModeSense {
            ten: true,
            dbd: c.bit(1, 3),
            llbaa: c.bit(1, 4),
            page_control: c.u8(2) >> 6,
            page: c.u8(2) & 0x3f,
            subpage: c.u8(3),
            alloc_len: c.be16(7),
        },
        op::MODE_SELECT_6 => Command::ModeSelect {
            ten: false,
            pf: c.bit(1, 4),
            sp: c.bit(1, 0),
            param_len: u16::from(c.u8(4)),
        },
        op::MODE_SELECT_10 => Command::ModeSelect {
            ten: true,
            pf: c.bit(1, 4),
            sp: c.bit(1, 0),
            param_len: c.be16(7),
        },
        op::START_STOP_UNIT => Command::StartStopUnit {
            immed: c.bit(1, 0),
            power_condition: c.u8(4) >> 4,
            no_flush: c.bit(4, 2),
            loej: c.bit(4, 1),
            start: c.bit(4, 0),
        },
        op::PREVENT_ALLOW_MEDIUM_REMOVAL => Command::PreventAllowMediumRemoval {
            prevent: c.u8(4) & 0x03,
        },
        op::SEND_DIAGNOSTIC => send_diagnostic(&c)?,
        // RESERVE(6)/RELEASE(6): bytes 1-4 are obsolete (SPC-2).
        op::RESERVE_6 => Command::Reserve { ten: false },
        op::RELEASE_6 => Command::Release { ten: false },
        op::RESERVE_10 | op::RELEASE_10 => {
            // Third-party reservations (3RDPTY, LONGID) are not supported.
            if c.u8(1) & 0x12 != 0 {
                let bit = if c.bit(1, 4) { 4 } else { 1 };
                return Err(Sense::invalid_field_in_cdb(1, Some(bit)));
            }
            if opcode == op::RESERVE_10 {
                Command::Reserve { ten: true }
            } else {
                Command::Release { ten: true }
            }
        }
        op::REPORT_LUNS => {
            let select_report = c.u8(2);
            // 00h all, 01h well known only, 02h all of both; the
            // administrative-LU selections (10h-12h) need an
            // administrative LU, which this target does not have.
            if select_report > 0x02 {
                return Err(Sense::invalid_field_in_cdb(2, Some(7)));
            }
            Command::ReportLuns {
                select_report,
                alloc_len: c.be32(6),
            }
        }
        op::PERSISTENT_RESERVE_IN => {
            let service_action = c.u8(1) & 0x1f;
            // READ KEYS, READ RESERVATION, REPORT CAPABILITIES, READ FULL
            // STATUS. An unknown service action of a supported opcode is
            // an invalid field (libiscsi's prin_serviceaction_range treats
            // INVALID COMMAND OPERATION CODE as "PR IN unsupported").
            if service_action > 0x03 {
                return Err(Sense::invalid_field_in_cdb(1, Some(4)));
            }
            Command::PersistentReserveIn {
                service_action,
                alloc_len: c.be16(7),
            }
        }
        op::PERSISTENT_RESERVE_OUT => {
            let service_action = c.u8(1) & 0x1f;
            // REGISTER .. REGISTER AND MOVE (07h), REPLACE LOST
            // RESERVATION (08h); which ones are served is the reservation
            // state machine's business.
            if service_action > 0x08 {
                return Err(Sense::invalid_field_in_cdb(1, Some(4)));
            }
            Command::PersistentReserveOut {
                service_action,
                scope: c.u8(2) >> 4,
                kind: c.u8(2) & 0x0f,
                param_len: c.be32(5),
            }
        }
        op::MAINTENANCE_IN => maintenance_in(&c)?,
        _ => return Ok(None),
    };
    Ok(Some(command))
}

fn inquiry(c: &Cdb<'_>) -> Result<Command, Sense> {
    // CMDDT (obsolete since SPC-3) is not supported.
    if c.bit(1, 1) {
        return Err(Sense::invalid_field_in_cdb(1, Some(1)));
    }
    let evpd = c.bit(1, 0);
    let page_code = c.u8(2);
    // A page code without EVPD asks for nothing the standard defines.
    if !evpd && page_code != 0 {
        return Err(Sense::invalid_field_in_cdb(2, Some(7)));
    }
    Ok(Command::Inquiry {
        evpd,
        page_code,
        alloc_len: c.be16(3),
    })
}

fn send_diagnostic(c: &Cdb<'_>) -> Result<Command, Sense> {
    let self_test_code = c.u8(1) >> 5;
    let self_test = c.bit(1, 2);
    let param_len = c.be16(3);
    // No diagnostic pages are supported, so no parameter list either.
    if param_len != 0 {
        return Err(Sense::invalid_field_in_cdb(3, None));
    }
    // SELFTEST requires the code to be zero; without it only the defined
    // codes (background short/extended, abort, foreground short/extended)
    // are accepted.
    let code_ok = if self_test {
        self_test_code == 0
    } else {
        matches!(self_test_code, 0 | 1 | 2 | 4 | 5 | 6)
    };
    if !code_ok {
        return Err(Sense::invalid_field_in_cdb(1, Some(7)));
    }
    Ok(Command::SendDiagnostic {
        self_test_code,
        self_test,
        param_len,
    })
}

fn maintenance_in(c: &Cdb<'_>) -> Result<Command, Sense> {
    match c.u8(1) & 0x1f {
        sa::REPORT_TARGET_PORT_GROUPS => {
            let format = c.u8(1) >> 5;
            if format > 1 {
                return Err(Sense::invalid_field_in_cdb(1, Some(7)));
            }
            Ok(Command::ReportTargetPortGroups {
                extended: format == 1,
                alloc_len: c.be32(6),
            })
        }
        sa::REPORT_SUPPORTED_OPERATION_CODES => {
            let options = c.u8(2) & 0x07;
            if options > 3 {
                return Err(Sense::invalid_field_in_cdb(2, Some(2)));
            }
            Ok(Command::ReportSupportedOpcodes {
                rctd: c.bit(2, 7),
                options,
                opcode: c.u8(3),
                service_action: c.be16(4),
                alloc_len: c.be32(6),
            })
        }
        _ => Err(INVALID_COMMAND_OPERATION_CODE),
    }
}
