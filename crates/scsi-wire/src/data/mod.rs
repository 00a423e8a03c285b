//! The data a block logical unit returns (data-in) and the few parameter
//! lists it parses (data-out), with the layouts of SPC-5 and SBC-4:
//! standard INQUIRY and VPD pages ([`inquiry`]), READ CAPACITY, GET LBA
//! STATUS and UNMAP ([`capacity`]), MODE SENSE / MODE SELECT ([`mode`]),
//! and the REPORT LUNS / REPORT TARGET PORT GROUPS / REPORT SUPPORTED
//! OPERATION CODES reports ([`report`]).
//!
//! Invariants:
//! - Every builder appends the FULL data to the caller's `Vec<u8>`; the
//!   caller truncates it to the allocation length and reports the residual
//!   (length fields always describe the full data, as SPC requires).
//! - Multi-byte fields are big-endian; reserved fields are zero; ASCII
//!   fields are padded with spaces, name strings with NULs.
//! - Parsers ([`parse_unmap`], [`mode::mode_select`]) take `&[u8]`, never
//!   panic and never read past their input; failures are the [`Sense`] the
//!   device server reports.

pub mod capacity;
pub mod inquiry;
pub mod mode;
pub mod report;

pub use capacity::{get_lba_status, parse_unmap, read_capacity_10, read_capacity_16, LbaStatus};
pub use inquiry::{standard_inquiry, vpd_page, SUPPORTED_VPD_PAGES};
pub use mode::{mode_select, mode_sense, ModeSenseRequest, ModeState};
pub use report::{
    decode_lun, encode_lun, find_opcode, report_luns, report_supported_opcodes_all,
    report_supported_opcodes_one, report_target_port_groups, AluaState, OpcodeUsage, PortGroup,
};

use crate::sense::Sense;

/// Who the logical unit is: the identification fields of INQUIRY data and
/// the device identification VPD page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitIdentity {
    /// T10 vendor identification (ASCII, space padded).
    pub vendor: [u8; 8],
    /// Product identification (ASCII, space padded).
    pub product: [u8; 16],
    /// Product revision level (ASCII, space padded).
    pub revision: [u8; 4],
    /// Unit serial number (VPD page 80h); printable ASCII, at most 252
    /// bytes are reported.
    pub serial: String,
    /// The volume's UUID: source of the NAA and T10 vendor ID designators.
    pub uuid: [u8; 16],
    /// iSCSI name of the target (SCSI name string designator).
    pub target_name: String,
    /// Target port group of the port the command arrived on.
    pub target_port_group: u16,
    /// Relative target port identifier of that port (1-based).
    pub relative_target_port: u16,
    /// Implicit ALUA is offered (TPGS = 01b, REPORT TARGET PORT GROUPS).
    pub alua: bool,
}

/// The limits reported in the block limits VPD page (B0h) and enforced by
/// the logical unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLimits {
    pub block_size: u32,
    /// MAXIMUM TRANSFER LENGTH in logical blocks (0 = no limit reported).
    pub max_transfer_blocks: u32,
    /// OPTIMAL TRANSFER LENGTH in logical blocks (0 = not reported).
    pub optimal_transfer_blocks: u32,
    /// MAXIMUM UNMAP LBA COUNT (total over one UNMAP; `u32::MAX` = no limit).
    pub max_unmap_blocks: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT (`u32::MAX` = no limit).
    pub max_unmap_descriptors: u32,
    /// OPTIMAL UNMAP GRANULARITY in logical blocks (0 = not reported).
    pub unmap_granularity_blocks: u32,
    /// MAXIMUM WRITE SAME LENGTH in logical blocks (0 = not reported).
    pub max_write_same_blocks: u64,
    /// MAXIMUM COMPARE AND WRITE LENGTH in logical blocks.
    pub max_compare_and_write_blocks: u8,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT of READ CAPACITY (16):
    /// 3 for 512-byte logical blocks on 4096-byte physical ones (512e).
    pub physical_block_exponent: u8,
}

/// Logical block provisioning as reported by READ CAPACITY (16) and the
/// logical block provisioning VPD page (B2h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Provisioning {
    /// Thin provisioned (LBPME = 1, provisioning type 010b).
    pub thin: bool,
    /// UNMAP is supported (LBPU).
    pub unmap: bool,
    /// WRITE SAME (16) / (10) with UNMAP is supported (LBPWS, LBPWS10).
    pub write_same_unmap: bool,
    /// Unmapped blocks read as zeroes (LBPRZ).
    pub zeroes_after_unmap: bool,
}

impl Provisioning {
    /// UNMAP is offered: only a thin provisioned unit unmaps (SBC-4 requires
    /// LBPME for LBPU), so every report goes through this.
    pub fn unmap_supported(&self) -> bool {
        self.thin && self.unmap
    }

    /// WRITE SAME with the UNMAP bit is offered.
    pub fn write_same_unmap_supported(&self) -> bool {
        self.thin && self.write_same_unmap
    }

    /// LBPRZ as reported (meaningless without thin provisioning).
    pub fn lbprz(&self) -> bool {
        self.thin && self.zeroes_after_unmap
    }
}

/// Peripheral qualifier 000b, peripheral device type 00h (direct access
/// block device): byte 0 of INQUIRY data and every VPD page.
pub(crate) const PERIPHERAL_DISK: u8 = 0x00;

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian length field at `at` in `out` (which must already
/// hold the bytes); out-of-range positions are ignored, never panic.
pub(crate) fn patch_u16(out: &mut [u8], at: usize, v: u16) {
    if let Some(dst) = out.get_mut(at..at.saturating_add(2)) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn patch_u32(out: &mut [u8], at: usize, v: u32) {
    if let Some(dst) = out.get_mut(at..at.saturating_add(4)) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

/// Reads a big-endian integer of `N` bytes at `at`, or `None` past the end.
pub(crate) fn be<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    let src = b.get(at..at.checked_add(N)?)?;
    let mut a = [0u8; N];
    a.copy_from_slice(src);
    Some(a)
}

pub(crate) fn be16(b: &[u8], at: usize) -> Option<u16> {
    be::<2>(b, at).map(u16::from_be_bytes)
}

pub(crate) fn be32(b: &[u8], at: usize) -> Option<u32> {
    be::<4>(b, at).map(u32::from_be_bytes)
}

pub(crate) fn be64(b: &[u8], at: usize) -> Option<u64> {
    be::<8>(b, at).map(u64::from_be_bytes)
}

/// Byte offsets in parameter lists are reported in a 16-bit field pointer;
/// larger offsets saturate.
pub(crate) fn field_byte(at: usize) -> u16 {
    u16::try_from(at).unwrap_or(u16::MAX)
}

/// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST at byte `at`.
pub(crate) fn bad_param(at: usize, bit: Option<u8>) -> Sense {
    Sense::invalid_field_in_parameter_list(field_byte(at), bit)
}
