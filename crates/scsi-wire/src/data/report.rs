//! The reports a logical unit answers about the target and itself: REPORT
//! LUNS (SPC-5 §6.33), REPORT TARGET PORT GROUPS (SPC-5 §6.36) and REPORT
//! SUPPORTED OPERATION CODES (SPC-5 §6.35), plus the SAM-5 single-level LUN
//! encoding they use.
//!
//! Invariants: list lengths describe the full list; descriptors appear in
//! the order given; a count that does not fit its field (target port count
//! is one byte) is clamped together with the list it counts, so the data
//! always parses.

use super::{patch_u32, put_u16, put_u32};
use crate::sense::Sense;

/// Encodes a LUN number as an 8-byte SAM-5 LUN: peripheral device
/// addressing below 256, flat space addressing below 16384. Larger values
/// are taken as an already encoded 8-byte LUN (big-endian).
pub fn encode_lun(lun: u64) -> [u8; 8] {
    match lun {
        0..=0xff => [0, lun as u8, 0, 0, 0, 0, 0, 0],
        0x100..=0x3fff => [0x40 | (lun >> 8) as u8, lun as u8, 0, 0, 0, 0, 0, 0],
        _ => lun.to_be_bytes(),
    }
}

/// Decodes an 8-byte LUN into the number [`encode_lun`] takes: single
/// level peripheral / flat addressing become the LUN number, anything
/// else is returned as the raw 8 bytes (big-endian).
pub fn decode_lun(lun: [u8; 8]) -> u64 {
    let rest_zero = lun[2..].iter().all(|&b| b == 0);
    match lun[0] >> 6 {
        0b00 if rest_zero && lun[0] == 0 => u64::from(lun[1]),
        0b01 if rest_zero => (u64::from(lun[0] & 0x3f) << 8) | u64::from(lun[1]),
        _ => u64::from_be_bytes(lun),
    }
}

/// Appends REPORT LUNS parameter data: LUN LIST LENGTH, reserved, then one
/// 8-byte LUN per entry of `luns` (see [`encode_lun`]).
pub fn report_luns(luns: &[u64], out: &mut Vec<u8>) {
    let len = luns.len().saturating_mul(8);
    put_u32(out, u32::try_from(len).unwrap_or(u32::MAX));
    put_u32(out, 0);
    for &lun in luns {
        out.extend_from_slice(&encode_lun(lun));
    }
}

/// Asymmetric access states (SPC-5 table "ASYMMETRIC ACCESS STATE field").
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AluaState {
    ActiveOptimized = 0,
    ActiveNonOptimized = 1,
    Standby = 2,
    Unavailable = 3,
    Transitioning = 0xf,
}

/// One target port group as reported by REPORT TARGET PORT GROUPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AluaState,
    /// Relative target port identifiers of the group's ports.
    pub relative_ports: Vec<u16>,
}

/// Supported states byte of every descriptor: T_SUP, U_SUP, S_SUP, AN_SUP,
/// AO_SUP (the states [`AluaState`] has).
const SUPPORTED_STATES: u8 = 0x80 | 0x08 | 0x04 | 0x02 | 0x01;

/// Appends REPORT TARGET PORT GROUPS parameter data in the length-only
/// header format, or with `extended` in the extended header format (format
/// type 001b, IMPLICIT TRANSITION TIME = `implicit_transition_secs`).
///
/// PREF is set on active/optimized groups (they are the preferred path),
/// STATUS CODE is 00h (no status available; transitions are implicit and
/// not tracked here), and at most 255 ports are listed per group.
pub fn report_target_port_groups(
    groups: &[PortGroup],
    extended: bool,
    implicit_transition_secs: u8,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    put_u32(out, 0); // RETURN DATA LENGTH, patched below
    if extended {
        out.extend_from_slice(&[0x10, implicit_transition_secs, 0, 0]);
    }
    for g in groups {
        let pref = if g.state == AluaState::ActiveOptimized {
            0x80
        } else {
            0
        };
        out.push(pref | g.state as u8);
        out.push(SUPPORTED_STATES);
        put_u16(out, g.id);
        out.push(0);
        out.push(0); // STATUS CODE
        out.push(0);
        let ports = &g.relative_ports[..g.relative_ports.len().min(255)];
        out.push(ports.len() as u8);
        for &p in ports {
            put_u16(out, 0);
            put_u16(out, p);
        }
    }
    let len = out.len() - start - 4;
    patch_u32(out, start, u32::try_from(len).unwrap_or(u32::MAX));
}

/// A supported command as reported by REPORT SUPPORTED OPERATION CODES.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpcodeUsage {
    pub opcode: u8,
    /// The service action, for commands that have service actions.
    pub service_action: Option<u16>,
    /// CDB usage data: the CDB with every bit the device server looks at
    /// set (byte 0 is the operation code); its length is the CDB length.
    pub usage: Vec<u8>,
    /// Reserved for nominal/recommended timeouts. The command timeouts
    /// descriptor is emitted for every command whenever RCTD is set (SPC-5
    /// requires it then), with zero values ("not specified").
    pub timeouts: bool,
}

/// Command timeouts descriptor: DESCRIPTOR LENGTH 0Ah, no values.
const TIMEOUTS_DESCRIPTOR: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Appends REPORT SUPPORTED OPERATION CODES parameter data in the
/// all-commands format (reporting options 000b).
pub fn report_supported_opcodes_all(ops: &[OpcodeUsage], rctd: bool, out: &mut Vec<u8>) {
    let start = out.len();
    put_u32(out, 0); // COMMAND DATA LENGTH, patched below
    for op in ops {
        out.push(op.opcode);
        out.push(0);
        put_u16(out, op.service_action.unwrap_or(0));
        out.push(0);
        let mut flags = 0u8;
        if rctd {
            flags |= 0x02; // CTDP
        }
        if op.service_action.is_some() {
            flags |= 0x01; // SERVACTV
        }
        out.push(flags);
        put_u16(out, u16::try_from(op.usage.len()).unwrap_or(u16::MAX));
        if rctd {
            out.extend_from_slice(&TIMEOUTS_DESCRIPTOR);
        }
    }
    let len = out.len() - start - 4;
    patch_u32(out, start, u32::try_from(len).unwrap_or(u32::MAX));
}

/// Appends REPORT SUPPORTED OPERATION CODES parameter data in the
/// one-command format: SUPPORT 011b (supported as the standard says) with
/// the CDB usage data, or 001b (not supported) with no usage data for
/// `None`.
pub fn report_supported_opcodes_one(op: Option<&OpcodeUsage>, rctd: bool, out: &mut Vec<u8>) {
    let ctdp = if rctd { 0x80 } else { 0 };
    match op {
        Some(op) => {
            out.push(0);
            out.push(ctdp | 0x03);
            put_u16(out, u16::try_from(op.usage.len()).unwrap_or(u16::MAX));
            out.extend_from_slice(&op.usage);
        }
        None => out.extend_from_slice(&[0, ctdp | 0x01, 0, 0]),
    }
    if rctd {
        out.extend_from_slice(&TIMEOUTS_DESCRIPTOR);
    }
}

/// Finds the command a one-command REPORT SUPPORTED OPERATION CODES asks
/// about (SPC-5 table "REPORTING OPTIONS field").
///
/// - 001b (operation code only): INVALID FIELD IN CDB if the operation
///   code has service actions;
/// - 010b (operation code and service action): INVALID FIELD IN CDB if a
///   supported operation code has no service actions;
/// - 011b: either form;
/// - any other reporting option (000b is the caller's all-commands case)
///   → INVALID FIELD IN CDB (byte 2).
///
/// `Ok(None)` means "not supported" (SUPPORT 001b).
pub fn find_opcode(
    ops: &[OpcodeUsage],
    reporting_options: u8,
    opcode: u8,
    service_action: u16,
) -> Result<Option<&OpcodeUsage>, Sense> {
    let mut same = ops.iter().filter(|o| o.opcode == opcode).peekable();
    let has_sa = same.peek().is_some_and(|o| o.service_action.is_some());
    let bad_options = Sense::invalid_field_in_cdb(2, Some(2));
    match reporting_options {
        1 if has_sa => Err(bad_options),
        1 => Ok(ops.iter().find(|o| o.opcode == opcode)),
        2 if same.peek().is_some() && !has_sa => Err(bad_options),
        2 | 3 if has_sa => Ok(ops
            .iter()
            .find(|o| o.opcode == opcode && o.service_action == Some(service_action))),
        2 => Ok(None),
        3 => Ok(ops.iter().find(|o| o.opcode == opcode)),
        _ => Err(bad_options),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn luns() {
        let mut out = Vec::new();
        report_luns(&[0, 5, 0x123], &mut out);
        assert_eq!(
            out,
            [
                0, 0, 0, 24, 0, 0, 0, 0, //
                0, 0, 0, 0, 0, 0, 0, 0, //
                0, 5, 0, 0, 0, 0, 0, 0, //
                0x41, 0x23, 0, 0, 0, 0, 0, 0,
            ]
        );
        assert_eq!(encode_lun(0x3fff), [0x7f, 0xff, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_lun(0x0102_0000_0000_0000), [1, 2, 0, 0, 0, 0, 0, 0]);
    }

    proptest! {
        #[test]
        fn lun_round_trip(lun in 0u64..0x4000) {
            prop_assert_eq!(decode_lun(encode_lun(lun)), lun);
        }

        #[test]
        fn lun_decode_total(b: [u8; 8]) {
            let _ = decode_lun(b);
        }
    }

    fn groups() -> Vec<PortGroup> {
        vec![
            PortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                relative_ports: vec![1, 2],
            },
            PortGroup {
                id: 2,
                state: AluaState::Standby,
                relative_ports: vec![],
            },
        ]
    }

    #[test]
    fn tpg_length_only() {
        let mut out = Vec::new();
        report_target_port_groups(&groups(), false, 10, &mut out);
        assert_eq!(
            out,
            [
                0, 0, 0, 24, // return data length
                0x80, 0x8f, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, // group 1
                0x02, 0x8f, 0, 2, 0, 0, 0, 0, // group 2
            ]
        );
    }

    #[test]
    fn tpg_extended() {
        let mut out = Vec::new();
        report_target_port_groups(&groups()[1..], true, 10, &mut out);
        assert_eq!(
            out,
            [0, 0, 0, 12, 0x10, 10, 0, 0, 0x02, 0x8f, 0, 2, 0, 0, 0, 0]
        );
    }

    fn ops() -> Vec<OpcodeUsage> {
        vec![
            OpcodeUsage {
                opcode: 0x00,
                service_action: None,
                usage: vec![0x00, 0, 0, 0, 0, 0x07],
                timeouts: false,
            },
            OpcodeUsage {
                opcode: 0x9e,
                service_action: Some(0x10),
                usage: vec![0x9e, 0x10, 0xff, 0xff],
                timeouts: false,
            },
        ]
    }

    #[test]
    fn opcodes_all() {
        let mut out = Vec::new();
        report_supported_opcodes_all(&ops(), false, &mut out);
        assert_eq!(
            out,
            [
                0, 0, 0, 16, //
                0x00, 0, 0, 0, 0, 0x00, 0, 6, //
                0x9e, 0, 0, 0x10, 0, 0x01, 0, 4,
            ]
        );
        out.clear();
        report_supported_opcodes_all(&ops()[..1], true, &mut out);
        assert_eq!(
            out,
            [
                0, 0, 0, 20, 0x00, 0, 0, 0, 0, 0x02, 0, 6, //
                0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ]
        );
    }

    #[test]
    fn opcodes_one() {
        let ops = ops();
        let mut out = Vec::new();
        report_supported_opcodes_one(Some(&ops[0]), false, &mut out);
        assert_eq!(out, [0, 0x03, 0, 6, 0x00, 0, 0, 0, 0, 0x07]);
        out.clear();
        report_supported_opcodes_one(None, true, &mut out);
        assert_eq!(out, [0, 0x81, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn find() {
        let ops = ops();
        let bad = Err(Sense::invalid_field_in_cdb(2, Some(2)));
        assert_eq!(find_opcode(&ops, 1, 0x00, 0), Ok(Some(&ops[0])));
        assert_eq!(find_opcode(&ops, 1, 0x9e, 0x10), bad);
        assert_eq!(find_opcode(&ops, 2, 0x9e, 0x10), Ok(Some(&ops[1])));
        assert_eq!(find_opcode(&ops, 2, 0x9e, 0x11), Ok(None));
        assert_eq!(find_opcode(&ops, 2, 0x00, 0), bad);
        assert_eq!(find_opcode(&ops, 1, 0x42, 0), Ok(None));
        assert_eq!(find_opcode(&ops, 2, 0x42, 0), Ok(None));
        assert_eq!(find_opcode(&ops, 3, 0x00, 7), Ok(Some(&ops[0])));
        assert_eq!(find_opcode(&ops, 3, 0x9e, 0x10), Ok(Some(&ops[1])));
        assert_eq!(find_opcode(&ops, 4, 0x00, 0), bad);
    }
}
