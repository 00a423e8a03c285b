//! PERSISTENT RESERVE IN parameter data (SPC-5 §6.16): READ KEYS, READ
//! RESERVATION, REPORT CAPABILITIES and READ FULL STATUS.
//!
//! Invariant: the length fields describe the full data whatever the
//! allocation length; only the bytes appended are cut to it.

use super::{
    Reservations, PR_IN_READ_FULL_STATUS, PR_IN_READ_KEYS, PR_IN_READ_RESERVATION,
    PR_IN_REPORT_CAPABILITIES,
};
use crate::data::inquiry::PROTOCOL_ISCSI;
use crate::data::{patch_u32, put_u16, put_u32, put_u64};
use crate::sense::Sense;

/// PERSISTENT RESERVATION TYPE MASK: WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC,
/// WR_EX (byte 4) and EX_AC_AR (byte 5), i.e. all six types.
const TYPE_MASK: [u8; 2] = [0xea, 0x01];

impl Reservations {
    /// Appends the PERSISTENT RESERVE IN data for `service_action`, cut to
    /// `alloc_len` bytes. An unknown service action is INVALID FIELD IN
    /// CDB (byte 1) and appends nothing.
    pub fn reserve_in(
        &self,
        service_action: u8,
        alloc_len: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), Sense> {
        let start = out.len();
        match service_action {
            PR_IN_READ_KEYS => self.read_keys(out),
            PR_IN_READ_RESERVATION => self.read_reservation(out),
            PR_IN_REPORT_CAPABILITIES => self.report_capabilities(out),
            PR_IN_READ_FULL_STATUS => self.read_full_status(out),
            _ => return Err(Sense::invalid_field_in_cdb(1, Some(4))),
        }
        out.truncate(start + usize::from(alloc_len));
        Ok(())
    }

    fn read_keys(&self, out: &mut Vec<u8>) {
        put_u32(out, self.generation);
        // At most MAX_REGISTRATIONS * 8 bytes: fits.
        put_u32(out, (self.registrations.len() * 8) as u32);
        for r in &self.registrations {
            put_u64(out, r.key);
        }
    }

    fn read_reservation(&self, out: &mut Vec<u8>) {
        put_u32(out, self.generation);
        let Some(res) = &self.reservation else {
            put_u32(out, 0);
            return;
        };
        put_u32(out, 16);
        // All-registrants reservations report key 0 (SPC-5 §6.16.3.2).
        let key = if res.kind.all_registrants() {
            0
        } else {
            self.key_of(&res.holder).unwrap_or(0)
        };
        put_u64(out, key);
        put_u32(out, 0); // obsolete
        out.push(0);
        out.push(res.kind as u8); // SCOPE = LU_SCOPE (0)
        put_u16(out, 0); // obsolete
    }

    fn report_capabilities(&self, out: &mut Vec<u8>) {
        put_u16(out, 8); // LENGTH
                         // CRH: the SPC-2 RESERVE/RELEASE exceptions apply. SIP_C, ATP_C = 0.
        out.push(0x10 | u8::from(self.ptpl_capable));
        // TMV; ALLOW COMMANDS 001b (TEST UNIT READY passes write exclusive
        // and exclusive access reservations); PTPL_A.
        out.push(0x80 | 0x10 | u8::from(self.aptpl));
        out.extend_from_slice(&TYPE_MASK);
        put_u16(out, 0);
    }

    fn read_full_status(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u32(out, self.generation);
        put_u32(out, 0); // ADDITIONAL LENGTH, patched below
        for r in &self.registrations {
            put_u64(out, r.key);
            put_u32(out, 0);
            let holder = self.is_holder(&r.nexus);
            out.push(u8::from(holder)); // ALL_TG_PT = 0, R_HOLDER
            let kind = self.reservation.as_ref().map_or(0, |res| res.kind as u8);
            out.push(if holder { kind } else { 0 }); // SCOPE 0, TYPE
            put_u32(out, 0);
            put_u16(out, r.nexus.relative_target_port);
            let tid = transport_id(&r.nexus.initiator_port);
            put_u32(out, u32::try_from(tid.len()).unwrap_or(u32::MAX));
            out.extend_from_slice(&tid);
        }
        let len = out.len() - start - 8;
        patch_u32(out, start + 4, u32::try_from(len).unwrap_or(u32::MAX));
    }
}

/// iSCSI TransportID (SPC-5 §7.6.4.6) of an initiator port: format 01b
/// (name, ",i,0x", ISID) when the port name has that form, else format 00b
/// (name only); NUL terminated, padded to a multiple of four and to at
/// least 20 bytes of name, as SPC-5 requires.
pub fn transport_id(initiator_port: &str) -> Vec<u8> {
    let format = if initiator_port.contains(",i,0x") {
        0x40
    } else {
        0x00
    };
    let mut name: Vec<u8> = initiator_port.bytes().take(0xfff0).collect();
    name.push(0);
    let padded = (name.len().div_ceil(4) * 4).max(20);
    name.resize(padded, 0);
    let mut tid = vec![format | PROTOCOL_ISCSI, 0];
    tid.extend_from_slice(&(padded as u16).to_be_bytes());
    tid.extend_from_slice(&name);
    tid
}
