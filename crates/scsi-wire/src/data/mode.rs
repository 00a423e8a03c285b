//! Mode parameters (SPC-5 §7.5, SBC-4 §6.5): MODE SENSE (6)/(10) data and
//! MODE SELECT (6)/(10) parameter list parsing for the caching (08h),
//! control (0Ah) and informational exceptions control (1Ch) pages.
//!
//! Invariants:
//! - Only WCE (caching page) is changeable; the changeable-values mask
//!   says exactly that, and MODE SELECT rejects any other difference from
//!   the current values with INVALID FIELD IN PARAMETER LIST.
//! - Saved values are not implemented: page control 11b answers SAVING
//!   PARAMETERS NOT SUPPORTED and PS is never set.
//! - D_SENSE is reported as 0 ([`D_SENSE`]): the target sends fixed-format
//!   sense data.
//! - Pages come out in ascending page code order; the mode data length
//!   counts every byte after itself.

use super::{bad_param, be16, field_byte, patch_u16, put_u32, put_u64};
use crate::sense::{Sense, PARAMETER_LIST_LENGTH_ERROR, SAVING_PARAMETERS_NOT_SUPPORTED};

pub const PAGE_CACHING: u8 = 0x08;
pub const PAGE_CONTROL: u8 = 0x0a;
pub const PAGE_INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
pub const PAGE_ALL: u8 = 0x3f;

/// Page control values (SPC-5 table "Page control (PC) field").
pub const PC_CURRENT: u8 = 0;
pub const PC_CHANGEABLE: u8 = 1;
pub const PC_DEFAULT: u8 = 2;
pub const PC_SAVED: u8 = 3;

/// The D_SENSE bit of the control page as reported: the target uses
/// fixed-format sense data.
pub const D_SENSE: bool = false;

/// The changeable mode parameters of a logical unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeState {
    /// WCE of the caching page: writes may be acknowledged before they are
    /// durable (SYNCHRONIZE CACHE / FUA make them durable).
    pub write_cache: bool,
}

impl Default for ModeState {
    /// The default values: write cache enabled.
    fn default() -> Self {
        ModeState { write_cache: true }
    }
}

/// The fields of a MODE SENSE (6)/(10) CDB that shape the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeSenseRequest {
    /// MODE SENSE (10) (8-byte header) rather than (6) (4-byte header).
    pub ten: bool,
    /// DBD: no block descriptor.
    pub dbd: bool,
    /// LLBAA: long LBA block descriptor (MODE SENSE (10) only).
    pub llbaa: bool,
    /// PC: 0 current, 1 changeable, 2 default, 3 saved.
    pub page_control: u8,
    pub page: u8,
    pub subpage: u8,
}

/// Which values a page is filled with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    Current(ModeState),
    Changeable,
}

const CACHING_LEN: usize = 20;
const CONTROL_LEN: usize = 12;
const IEC_LEN: usize = 12;

fn caching_page(v: Values) -> [u8; CACHING_LEN] {
    let mut p = [0u8; CACHING_LEN];
    p[0] = PAGE_CACHING;
    p[1] = (CACHING_LEN - 2) as u8;
    p[2] = match v {
        Values::Current(s) if s.write_cache => 0x04, // WCE, RCD = 0
        Values::Current(_) => 0x00,
        Values::Changeable => 0x04,
    };
    p
}

fn control_page(v: Values) -> [u8; CONTROL_LEN] {
    let mut p = [0u8; CONTROL_LEN];
    p[0] = PAGE_CONTROL;
    p[1] = (CONTROL_LEN - 2) as u8;
    if let Values::Current(_) = v {
        // TST 000b (one task set), D_SENSE 0, GLTSD 1 (no saved logs).
        p[2] = if D_SENSE { 0x06 } else { 0x02 };
        // QUEUE ALGORITHM MODIFIER 1 (unrestricted reordering), QERR 00b.
        p[3] = 0x10;
    }
    p
}

fn iec_page(v: Values) -> [u8; IEC_LEN] {
    let mut p = [0u8; IEC_LEN];
    p[0] = PAGE_INFORMATIONAL_EXCEPTIONS;
    p[1] = (IEC_LEN - 2) as u8;
    if let Values::Current(_) = v {
        p[2] = 0x08; // DEXCPT: informational exceptions are not reported
    }
    p
}

/// Appends the MODE SENSE data for `req`.
///
/// Errors: saved values → SAVING PARAMETERS NOT SUPPORTED; an unsupported
/// page → INVALID FIELD IN CDB (byte 2); a subpage other than 00h / FFh →
/// INVALID FIELD IN CDB (byte 3). Nothing is appended on error.
pub fn mode_sense(
    req: ModeSenseRequest,
    state: &ModeState,
    blocks: u64,
    block_size: u32,
    write_protected: bool,
    out: &mut Vec<u8>,
) -> Result<(), Sense> {
    let values = match req.page_control {
        PC_CURRENT => Values::Current(*state),
        PC_DEFAULT => Values::Current(ModeState::default()),
        PC_CHANGEABLE => Values::Changeable,
        _ => return Err(SAVING_PARAMETERS_NOT_SUPPORTED),
    };
    if req.subpage != 0x00 && req.subpage != 0xff {
        return Err(Sense::invalid_field_in_cdb(3, Some(7)));
    }
    let (caching, control, iec) = match req.page {
        PAGE_CACHING => (true, false, false),
        PAGE_CONTROL => (false, true, false),
        PAGE_INFORMATIONAL_EXCEPTIONS => (false, false, true),
        PAGE_ALL => (true, true, true),
        _ => return Err(Sense::invalid_field_in_cdb(2, Some(5))),
    };

    let start = out.len();
    // Device-specific parameter (SBC-4 §6.5.1): WP, DPOFUA.
    let dsp = if write_protected { 0x90 } else { 0x10 };
    let long = req.ten && req.llbaa;
    let bd_len = match (req.dbd, long) {
        (true, _) => 0,
        (false, true) => 16,
        (false, false) => 8,
    };
    if req.ten {
        out.extend_from_slice(&[0, 0, 0, dsp, u8::from(long), 0, 0, bd_len]);
    } else {
        out.extend_from_slice(&[0, 0, dsp, bd_len]);
    }
    if !req.dbd {
        // The block descriptor reports the capacity, except in the
        // changeable mask (nothing in it can be changed).
        let (n, len) = match values {
            Values::Changeable => (0, 0),
            Values::Current(_) => (blocks, block_size),
        };
        if long {
            put_u64(out, n);
            put_u32(out, 0);
            put_u32(out, len);
        } else {
            put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
            put_u32(out, len & 0x00ff_ffff);
        }
    }
    if caching {
        out.extend_from_slice(&caching_page(values));
    }
    if control {
        out.extend_from_slice(&control_page(values));
    }
    if iec {
        out.extend_from_slice(&iec_page(values));
    }
    let total = out.len() - start;
    if req.ten {
        patch_u16(out, start, u16::try_from(total - 2).unwrap_or(u16::MAX));
    } else if let Some(len) = out.get_mut(start) {
        // At most 4 + 8 + 44 bytes: fits.
        *len = u8::try_from(total - 1).unwrap_or(u8::MAX);
    }
    Ok(())
}

/// Applies a MODE SELECT (6)/(10) parameter list to `state` and returns
/// the new state (SPC-5 §6.11, §6.12).
///
/// - `sp` (save pages) → INVALID FIELD IN CDB (byte 1, bit 0): nothing can
///   be saved. An empty list changes nothing. A list with pages but `pf`
///   clear → INVALID FIELD IN CDB (byte 1, bit 4).
/// - A header, block descriptor or page cut off by the list's end →
///   PARAMETER LIST LENGTH ERROR.
/// - Block descriptors are checked for shape only (8 bytes each, 16 with
///   LONGLBA); their content is ignored (the capacity and block length
///   cannot be changed and initiators echo what MODE SENSE returned).
/// - The mode data length (reserved in MODE SELECT), medium type and
///   device-specific parameter are ignored likewise.
/// - An unknown page, a subpage format page, a wrong page length, or a
///   page whose bytes differ from the current values outside WCE →
///   INVALID FIELD IN PARAMETER LIST pointing at the offending byte.
pub fn mode_select(
    ten: bool,
    pf: bool,
    sp: bool,
    params: &[u8],
    state: &ModeState,
) -> Result<ModeState, Sense> {
    if sp {
        return Err(Sense::invalid_field_in_cdb(1, Some(0)));
    }
    if params.is_empty() {
        return Ok(*state);
    }
    let header = if ten { 8 } else { 4 };
    if params.len() < header {
        return Err(PARAMETER_LIST_LENGTH_ERROR);
    }
    let (bd_len, descriptor) = if ten {
        let long = params.get(4).is_some_and(|b| b & 0x01 != 0);
        (
            usize::from(be16(params, 6).unwrap_or(0)),
            if long { 16 } else { 8 },
        )
    } else {
        (usize::from(params.get(3).copied().unwrap_or(0)), 8)
    };
    if bd_len % descriptor != 0 {
        return Err(bad_param(if ten { 6 } else { 3 }, Some(7)));
    }
    let mut pos = header + bd_len;
    if pos > params.len() {
        return Err(PARAMETER_LIST_LENGTH_ERROR);
    }
    if pos < params.len() && !pf {
        return Err(Sense::invalid_field_in_cdb(1, Some(4)));
    }
    let mut next = *state;
    while pos < params.len() {
        let code_byte = params.get(pos).copied().unwrap_or(0);
        if code_byte & 0x40 != 0 {
            // SPF: no subpages are supported.
            return Err(bad_param(pos, Some(6)));
        }
        let len = usize::from(
            params
                .get(pos + 1)
                .copied()
                .ok_or(PARAMETER_LIST_LENGTH_ERROR)?,
        );
        let page = params
            .get(pos..pos + 2 + len)
            .ok_or(PARAMETER_LIST_LENGTH_ERROR)?;
        let current = Values::Current(next);
        let (want, mask): (Vec<u8>, Vec<u8>) = match code_byte & 0x3f {
            PAGE_CACHING => (
                caching_page(current).to_vec(),
                caching_page(Values::Changeable).to_vec(),
            ),
            PAGE_CONTROL => (
                control_page(current).to_vec(),
                control_page(Values::Changeable).to_vec(),
            ),
            PAGE_INFORMATIONAL_EXCEPTIONS => (
                iec_page(current).to_vec(),
                iec_page(Values::Changeable).to_vec(),
            ),
            _ => return Err(bad_param(pos, Some(5))),
        };
        if page.len() != want.len() {
            return Err(bad_param(pos + 1, Some(7)));
        }
        // Byte 0 carries PS (reserved in MODE SELECT) and the page code
        // already matched; compare from byte 2 on.
        for (i, ((&got, &cur), &changeable)) in
            page.iter().zip(&want).zip(&mask).enumerate().skip(2)
        {
            let diff = (got ^ cur) & !changeable;
            if diff != 0 {
                let bit = 7 - diff.leading_zeros() as u8;
                return Err(Sense::invalid_field_in_parameter_list(
                    field_byte(pos + i),
                    Some(bit),
                ));
            }
        }
        if code_byte & 0x3f == PAGE_CACHING {
            next.write_cache = page.get(2).is_some_and(|b| b & 0x04 != 0);
        }
        pos += page.len();
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WCE: ModeState = ModeState { write_cache: true };
    const NO_WCE: ModeState = ModeState { write_cache: false };

    fn req(ten: bool, dbd: bool, pc: u8, page: u8) -> ModeSenseRequest {
        ModeSenseRequest {
            ten,
            dbd,
            llbaa: false,
            page_control: pc,
            page,
            subpage: 0,
        }
    }

    fn sense(r: ModeSenseRequest, s: &ModeState, wp: bool) -> Result<Vec<u8>, Sense> {
        let mut out = Vec::new();
        mode_sense(r, s, 0x1000, 512, wp, &mut out).map(|()| out)
    }

    #[test]
    fn sense6_caching_with_descriptor() {
        let out = sense(req(false, false, PC_CURRENT, PAGE_CACHING), &WCE, false).unwrap();
        let mut want = vec![31, 0, 0x10, 8, 0, 0, 0x10, 0x00, 0, 0, 0x02, 0x00];
        want.extend_from_slice(&[0x08, 0x12, 0x04]);
        want.resize(32, 0);
        assert_eq!(out, want);
    }

    #[test]
    fn sense6_control_wp_dbd() {
        let out = sense(req(false, true, PC_CURRENT, PAGE_CONTROL), &WCE, true).unwrap();
        assert_eq!(
            out,
            [15, 0, 0x90, 0, 0x0a, 0x0a, 0x02, 0x10, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn sense10_all_pages_long_lba() {
        let mut r = req(true, false, PC_CURRENT, PAGE_ALL);
        r.llbaa = true;
        let out = sense(r, &NO_WCE, false).unwrap();
        let mut want = vec![0, 66, 0, 0x10, 0x01, 0, 0, 16];
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x02, 0]);
        let mut caching = vec![0x08, 0x12, 0x00];
        caching.resize(20, 0);
        want.extend_from_slice(&caching);
        want.extend_from_slice(&[0x0a, 0x0a, 0x02, 0x10, 0, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0x1c, 0x0a, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(out, want);
        assert_eq!(out.len(), 68);
    }

    #[test]
    fn sense_changeable_and_default() {
        let out = sense(req(false, true, PC_CHANGEABLE, PAGE_ALL), &NO_WCE, false).unwrap();
        assert_eq!(out[4..7], [0x08, 0x12, 0x04]);
        assert!(out[7..24].iter().all(|&b| b == 0));
        assert_eq!(out[24..26], [0x0a, 0x0a]);
        assert!(out[26..36].iter().all(|&b| b == 0));
        assert_eq!(out[36..38], [0x1c, 0x0a]);
        assert!(out[38..].iter().all(|&b| b == 0));
        let out = sense(req(false, true, PC_DEFAULT, PAGE_CACHING), &NO_WCE, false).unwrap();
        assert_eq!(out[6], 0x04);
    }

    #[test]
    fn sense_big_capacity_and_subpages() {
        let mut out = Vec::new();
        mode_sense(
            req(false, false, 0, PAGE_CONTROL),
            &WCE,
            1 << 33,
            4096,
            false,
            &mut out,
        )
        .unwrap();
        assert_eq!(out[4..12], [0xff, 0xff, 0xff, 0xff, 0, 0, 0x10, 0]);
        let mut r = req(false, true, 0, PAGE_ALL);
        r.subpage = 0xff;
        assert!(sense(r, &WCE, false).is_ok());
    }

    #[test]
    fn sense_errors() {
        assert_eq!(
            sense(req(false, true, PC_SAVED, PAGE_ALL), &WCE, false),
            Err(SAVING_PARAMETERS_NOT_SUPPORTED)
        );
        assert_eq!(
            sense(req(false, true, 0, 0x19), &WCE, false),
            Err(Sense::invalid_field_in_cdb(2, Some(5)))
        );
        let mut r = req(false, true, 0, PAGE_CACHING);
        r.subpage = 1;
        assert_eq!(
            sense(r, &WCE, false),
            Err(Sense::invalid_field_in_cdb(3, Some(7)))
        );
    }

    /// What an initiator sends back: MODE SENSE data with its header's
    /// length zeroed (reserved in MODE SELECT).
    fn echo(ten: bool, page: u8, state: &ModeState) -> Vec<u8> {
        let mut out = sense(req(ten, false, 0, page), state, false).unwrap();
        out[0] = 0;
        if ten {
            out[1] = 0;
        }
        out
    }

    #[test]
    fn select_toggles_wce() {
        let mut p = echo(false, PAGE_CACHING, &WCE);
        p[12 + 2] = 0x00;
        assert_eq!(mode_select(false, true, false, &p, &WCE), Ok(NO_WCE));
        let mut p = echo(true, PAGE_ALL, &NO_WCE);
        p[16 + 2] = 0x04;
        assert_eq!(mode_select(true, true, false, &p, &NO_WCE), Ok(WCE));
        assert_eq!(mode_select(true, false, false, &[], &NO_WCE), Ok(NO_WCE));
    }

    #[test]
    fn select_errors() {
        let p = echo(false, PAGE_CACHING, &WCE);
        assert_eq!(
            mode_select(false, true, true, &p, &WCE),
            Err(Sense::invalid_field_in_cdb(1, Some(0)))
        );
        assert_eq!(
            mode_select(false, false, false, &p, &WCE),
            Err(Sense::invalid_field_in_cdb(1, Some(4)))
        );
        assert_eq!(
            mode_select(false, true, false, &p[..p.len() - 1], &WCE),
            Err(PARAMETER_LIST_LENGTH_ERROR)
        );
        assert_eq!(
            mode_select(false, true, false, &[0, 0, 0], &WCE),
            Err(PARAMETER_LIST_LENGTH_ERROR)
        );
        // RCD is not changeable.
        let mut q = p.clone();
        q[12 + 2] |= 0x01;
        assert_eq!(
            mode_select(false, true, false, &q, &WCE),
            Err(Sense::invalid_field_in_parameter_list(14, Some(0)))
        );
        // D_SENSE is not changeable.
        let mut c = echo(false, PAGE_CONTROL, &WCE);
        c[12 + 2] |= 0x04;
        assert_eq!(
            mode_select(false, true, false, &c, &WCE),
            Err(Sense::invalid_field_in_parameter_list(14, Some(2)))
        );
        // Unknown page, wrong length, subpage format.
        let mut u = p.clone();
        u[12] = 0x19;
        assert_eq!(
            mode_select(false, true, false, &u, &WCE),
            Err(Sense::invalid_field_in_parameter_list(12, Some(5)))
        );
        let mut l = p.clone();
        l[13] = 0x0a;
        l.truncate(12 + 12);
        assert_eq!(
            mode_select(false, true, false, &l, &WCE),
            Err(Sense::invalid_field_in_parameter_list(13, Some(7)))
        );
        let mut s = p.clone();
        s[12] |= 0x40;
        assert_eq!(
            mode_select(false, true, false, &s, &WCE),
            Err(Sense::invalid_field_in_parameter_list(12, Some(6)))
        );
        // Block descriptor length not a multiple of 8.
        assert_eq!(
            mode_select(false, true, false, &[0, 0, 0, 4, 0, 0, 0, 0], &WCE),
            Err(Sense::invalid_field_in_parameter_list(3, Some(7)))
        );
    }

    proptest! {
        #[test]
        fn select_never_panics(ten: bool, pf: bool, sp: bool, wce: bool,
                               b in prop::collection::vec(any::<u8>(), 0..96)) {
            let _ = mode_select(ten, pf, sp, &b, &ModeState { write_cache: wce });
        }

        #[test]
        fn sense_select_round_trip(ten: bool, wce: bool, target: bool) {
            let state = ModeState { write_cache: wce };
            let mut p = echo(ten, PAGE_ALL, &state);
            let at = if ten { 16 } else { 12 } + 2;
            p[at] = if target { 0x04 } else { 0 };
            prop_assert_eq!(
                mode_select(ten, true, false, &p, &state),
                Ok(ModeState { write_cache: target })
            );
        }
    }
}
