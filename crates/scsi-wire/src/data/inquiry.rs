//! INQUIRY data: the standard INQUIRY data (SPC-5 §6.7.2) and the vital
//! product data pages a block target supports (SPC-5 §7.7, SBC-4 §6.6):
//! supported pages (00h), unit serial number (80h), device identification
//! (83h), block limits (B0h), block device characteristics (B1h) and
//! logical block provisioning (B2h).
//!
//! Invariants: every page starts with peripheral qualifier 000b / device
//! type 00h and its page code; the page length field covers exactly the
//! bytes that follow it; [`SUPPORTED_VPD_PAGES`] is ascending and lists
//! exactly the pages [`vpd_page`] builds.

use super::{
    patch_u16, put_u16, put_u32, put_u64, BlockLimits, Provisioning, UnitIdentity, PERIPHERAL_DISK,
};
use crate::sense::Sense;

/// VERSION field: SPC-4 (06h). SPC-5's 07h would be more accurate, but
/// libiscsi's conformance suite fails every version other than 04h-06h;
/// the version descriptors still claim SPC-5 and SBC-4.
pub const INQUIRY_VERSION: u8 = 0x06;

/// Version descriptors (SPC-5 table "Version descriptor values"): SAM-5,
/// iSCSI, SPC-5, SBC-4, and SPC-4 / SBC-3 because libiscsi decides from
/// them whether the SBC-3 block limits page length (3Ch) is allowed.
pub const VERSION_DESCRIPTORS: [u16; 6] = [
    0x00a0, // SAM-5 (no version claimed)
    0x0960, // iSCSI (no version claimed)
    0x05c0, // SPC-5 (no version claimed)
    0x0600, // SBC-4 (no version claimed)
    0x0460, // SPC-4 (no version claimed)
    0x04c0, // SBC-3 (no version claimed)
];

/// Length of the standard INQUIRY data this target returns.
pub const STANDARD_INQUIRY_LEN: usize = 96;

pub const VPD_SUPPORTED_PAGES: u8 = 0x00;
pub const VPD_UNIT_SERIAL_NUMBER: u8 = 0x80;
pub const VPD_DEVICE_IDENTIFICATION: u8 = 0x83;
pub const VPD_BLOCK_LIMITS: u8 = 0xb0;
pub const VPD_BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
pub const VPD_LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;

/// The VPD pages [`vpd_page`] builds, ascending as SPC requires.
pub const SUPPORTED_VPD_PAGES: [u8; 6] = [
    VPD_SUPPORTED_PAGES,
    VPD_UNIT_SERIAL_NUMBER,
    VPD_DEVICE_IDENTIFICATION,
    VPD_BLOCK_LIMITS,
    VPD_BLOCK_DEVICE_CHARACTERISTICS,
    VPD_LOGICAL_BLOCK_PROVISIONING,
];

/// IEEE company ID of the NAA IEEE Registered Extended designator. Basalt
/// owns no OUI: this value has the CID form (second nibble 1010b, the
/// "local" bit set), so it can never equal a registered OUI; a deployment
/// with its own OUI replaces it.
pub const NAA_COMPANY_ID: u32 = 0x00ba_5a17;

/// Protocol identifier of iSCSI (SPC-5 table "Protocol identifier values").
pub const PROTOCOL_ISCSI: u8 = 0x5;

/// Appends the standard INQUIRY data (96 bytes).
pub fn standard_inquiry(id: &UnitIdentity, out: &mut Vec<u8>) {
    let start = out.len();
    out.push(PERIPHERAL_DISK);
    out.push(0x00); // RMB = 0: not removable
    out.push(INQUIRY_VERSION);
    out.push(0x12); // HISUP = 1, RESPONSE DATA FORMAT = 2
    out.push((STANDARD_INQUIRY_LEN - 5) as u8);
    // TPGS = 01b: implicit asymmetric access only.
    out.push(if id.alua { 0x10 } else { 0x00 });
    out.push(0x00);
    out.push(0x02); // CMDQUE = 1
    out.extend_from_slice(&ascii(&id.vendor));
    out.extend_from_slice(&ascii(&id.product));
    out.extend_from_slice(&ascii(&id.revision));
    out.extend_from_slice(&[0u8; 20]); // vendor specific
    out.extend_from_slice(&[0u8; 2]); // clocking/QAS/IUS, reserved
    for d in VERSION_DESCRIPTORS {
        put_u16(out, d);
    }
    out.resize(start + STANDARD_INQUIRY_LEN, 0);
}

/// Appends the VPD page `page`; an unsupported page is ILLEGAL REQUEST,
/// INVALID FIELD IN CDB pointing at the PAGE CODE (byte 2).
pub fn vpd_page(
    page: u8,
    id: &UnitIdentity,
    limits: &BlockLimits,
    prov: &Provisioning,
    out: &mut Vec<u8>,
) -> Result<(), Sense> {
    if !SUPPORTED_VPD_PAGES.contains(&page) {
        return Err(Sense::invalid_field_in_cdb(2, Some(7)));
    }
    let start = out.len();
    out.extend_from_slice(&[PERIPHERAL_DISK, page, 0, 0]);
    match page {
        VPD_SUPPORTED_PAGES => out.extend_from_slice(&SUPPORTED_VPD_PAGES),
        VPD_UNIT_SERIAL_NUMBER => out.extend(serial_bytes(&id.serial)),
        VPD_DEVICE_IDENTIFICATION => device_identification(id, out),
        VPD_BLOCK_LIMITS => block_limits(limits, prov, out),
        VPD_BLOCK_DEVICE_CHARACTERISTICS => {
            put_u16(out, 0x0001); // MEDIUM ROTATION RATE: non-rotating
            out.resize(start + 64, 0); // product type, form factor: not reported
        }
        _ => logical_block_provisioning(prov, out),
    }
    let len = out.len() - start - 4;
    patch_u16(out, start + 2, u16::try_from(len).unwrap_or(u16::MAX));
    Ok(())
}

/// Printable ASCII or space: SPC-5 §4.3.1 allows only 20h-7Eh in ASCII
/// fields, so anything else is replaced by a space.
fn ascii<const N: usize>(field: &[u8; N]) -> [u8; N] {
    field.map(|c| if (0x20..=0x7e).contains(&c) { c } else { b' ' })
}

/// The serial number as printable ASCII (others become '_'), at most 252
/// bytes so the page stays within 256 bytes.
fn serial_bytes(serial: &str) -> impl Iterator<Item = u8> + '_ {
    serial
        .bytes()
        .map(|c| if (0x21..=0x7e).contains(&c) { c } else { b'_' })
        .take(252)
}

/// Designator header (SPC-5 §7.7.6.1): protocol identifier and PIV are
/// only meaningful (and only set) for target port associations.
fn designator(out: &mut Vec<u8>, code_set: u8, association: u8, kind: u8, body: &[u8]) {
    let (proto, piv) = if association == 0 {
        (0, 0)
    } else {
        (PROTOCOL_ISCSI << 4, 0x80)
    };
    out.push(proto | code_set);
    out.push(piv | (association << 4) | kind);
    out.push(0);
    out.push(u8::try_from(body.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(body);
}

const CODE_SET_BINARY: u8 = 1;
const CODE_SET_ASCII: u8 = 2;
const CODE_SET_UTF8: u8 = 3;
const ASSOC_LU: u8 = 0;
const ASSOC_TARGET_PORT: u8 = 1;
const ASSOC_TARGET_DEVICE: u8 = 2;
const DESIG_T10_VENDOR: u8 = 1;
const DESIG_NAA: u8 = 3;
const DESIG_RELATIVE_TARGET_PORT: u8 = 4;
const DESIG_TARGET_PORT_GROUP: u8 = 5;
const DESIG_SCSI_NAME: u8 = 8;

/// NAA IEEE Registered Extended (NAA 6h): company ID, then 100 bits of the
/// UUID (36-bit vendor specific identifier + 64-bit extension). A random
/// (v4) UUID keeps more than 90 random bits in them.
pub fn naa_designator(uuid: &[u8; 16]) -> [u8; 16] {
    let u = u128::from_be_bytes(*uuid);
    let low100 = u & ((1u128 << 100) - 1);
    let v = (6u128 << 124) | (u128::from(NAA_COMPANY_ID & 0x00ff_ffff) << 100) | low100;
    v.to_be_bytes()
}

/// SCSI name string: the name, NUL terminated and NUL padded to a multiple
/// of four (SPC-5 §7.7.6.11); at most 252 bytes so the length fits a byte.
fn scsi_name(name: &str) -> Vec<u8> {
    let mut b: Vec<u8> = name.bytes().take(251).collect();
    b.push(0);
    let padded = b.len().div_ceil(4) * 4;
    b.resize(padded, 0);
    b
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn device_identification(id: &UnitIdentity, out: &mut Vec<u8>) {
    // Logical unit: NAA (what Linux and multipath use as the WWID) and a
    // T10 vendor ID based one.
    designator(
        out,
        CODE_SET_BINARY,
        ASSOC_LU,
        DESIG_NAA,
        &naa_designator(&id.uuid),
    );
    let mut t10 = ascii(&id.vendor).to_vec();
    t10.extend_from_slice(hex(&id.uuid).as_bytes());
    designator(out, CODE_SET_ASCII, ASSOC_LU, DESIG_T10_VENDOR, &t10);
    // Target port the command arrived on: relative port and port group
    // (ALUA initiators need both when TPGS is non-zero).
    let mut port = [0u8; 4];
    port[2..].copy_from_slice(&id.relative_target_port.to_be_bytes());
    designator(
        out,
        CODE_SET_BINARY,
        ASSOC_TARGET_PORT,
        DESIG_RELATIVE_TARGET_PORT,
        &port,
    );
    let mut group = [0u8; 4];
    group[2..].copy_from_slice(&id.target_port_group.to_be_bytes());
    designator(
        out,
        CODE_SET_BINARY,
        ASSOC_TARGET_PORT,
        DESIG_TARGET_PORT_GROUP,
        &group,
    );
    // Target device: its iSCSI name.
    designator(
        out,
        CODE_SET_UTF8,
        ASSOC_TARGET_DEVICE,
        DESIG_SCSI_NAME,
        &scsi_name(&id.target_name),
    );
}

fn block_limits(limits: &BlockLimits, prov: &Provisioning, out: &mut Vec<u8>) {
    let (max_unmap, max_unmap_desc, granularity) = if prov.unmap_supported() {
        (
            limits.max_unmap_blocks,
            limits.max_unmap_descriptors,
            limits.unmap_granularity_blocks,
        )
    } else {
        (0, 0, 0)
    };
    out.push(0x01); // WSNZ: WRITE SAME with zero blocks is not supported
    out.push(limits.max_compare_and_write_blocks);
    put_u16(out, 0); // OPTIMAL TRANSFER LENGTH GRANULARITY: not reported
    put_u32(out, limits.max_transfer_blocks);
    put_u32(out, limits.optimal_transfer_blocks);
    put_u32(out, 0); // MAXIMUM PREFETCH LENGTH: not reported
    put_u32(out, max_unmap);
    put_u32(out, max_unmap_desc);
    put_u32(out, granularity);
    // UGAVALID with alignment 0 when a granularity is reported.
    put_u32(out, if granularity > 0 { 0x8000_0000 } else { 0 });
    put_u64(out, limits.max_write_same_blocks);
    out.extend_from_slice(&[0u8; 20]); // atomic write limits: not supported
}

fn logical_block_provisioning(prov: &Provisioning, out: &mut Vec<u8>) {
    out.push(0); // THRESHOLD EXPONENT: thresholds not supported
    let mut flags = 0u8;
    if prov.unmap_supported() {
        flags |= 0x80; // LBPU
    }
    if prov.write_same_unmap_supported() {
        flags |= 0x60; // LBPWS, LBPWS10
    }
    if prov.lbprz() {
        flags |= 0x04; // LBPRZ = 001b
    }
    out.push(flags);
    out.push(if prov.thin { 0x02 } else { 0x00 }); // PROVISIONING TYPE
    out.push(0); // THRESHOLD PERCENTAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> UnitIdentity {
        UnitIdentity {
            vendor: *b"BASALT  ",
            product: *b"VOLUME          ",
            revision: *b"0001",
            serial: "vol1".into(),
            uuid: [
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff,
            ],
            target_name: "iqn.a".into(),
            target_port_group: 2,
            relative_target_port: 3,
            alua: true,
        }
    }

    fn limits() -> BlockLimits {
        BlockLimits {
            block_size: 512,
            max_transfer_blocks: 0x800,
            optimal_transfer_blocks: 0x100,
            max_unmap_blocks: 0x40000,
            max_unmap_descriptors: 0x100,
            unmap_granularity_blocks: 8,
            max_write_same_blocks: 0x1_0000_0000,
            max_compare_and_write_blocks: 1,
            physical_block_exponent: 0,
        }
    }

    const THIN: Provisioning = Provisioning {
        thin: true,
        unmap: true,
        write_same_unmap: true,
        zeroes_after_unmap: true,
    };

    fn page(p: u8, prov: &Provisioning) -> Vec<u8> {
        let mut out = Vec::new();
        vpd_page(p, &id(), &limits(), prov, &mut out).unwrap();
        out
    }

    #[test]
    fn standard() {
        let mut out = Vec::new();
        standard_inquiry(&id(), &mut out);
        let mut want = vec![0x00, 0x00, 0x06, 0x12, 91, 0x10, 0x00, 0x02];
        want.extend_from_slice(b"BASALT  VOLUME          0001");
        want.extend_from_slice(&[0; 22]);
        want.extend_from_slice(&[
            0x00, 0xa0, 0x09, 0x60, 0x05, 0xc0, 0x06, 0x00, 0x04, 0x60, 0x04, 0xc0, 0, 0, 0, 0,
        ]);
        want.resize(96, 0);
        assert_eq!(out, want);
        // No ALUA: TPGS = 0; control characters become spaces.
        let mut plain = id();
        plain.alua = false;
        plain.vendor[7] = 0x07;
        let mut out = Vec::new();
        standard_inquiry(&plain, &mut out);
        assert_eq!(out[5], 0);
        assert_eq!(out[15], b' ');
    }

    #[test]
    fn supported_pages() {
        assert_eq!(
            page(0x00, &THIN),
            [0, 0x00, 0, 6, 0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]
        );
    }

    #[test]
    fn serial() {
        let mut i = id();
        i.serial = "a b\u{e9}".into();
        let mut out = Vec::new();
        vpd_page(0x80, &i, &limits(), &THIN, &mut out).unwrap();
        assert_eq!(out, [0, 0x80, 0, 5, b'a', b'_', b'b', b'_', b'_']);
    }

    #[test]
    fn device_identification_layout() {
        let out = page(0x83, &THIN);
        let mut want = vec![0x00, 0x83, 0x00, 0x00];
        // NAA 6, company ID BA5A17, low 100 bits of the UUID.
        want.extend_from_slice(&[0x01, 0x03, 0x00, 0x10]);
        want.extend_from_slice(&[
            0x6b, 0xa5, 0xa1, 0x73, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ]);
        // T10 vendor ID: vendor + UUID in hex.
        want.extend_from_slice(&[0x02, 0x01, 0x00, 40]);
        want.extend_from_slice(b"BASALT  00112233445566778899aabbccddeeff");
        // Relative target port 3, target port group 2 (iSCSI, PIV, port).
        want.extend_from_slice(&[0x51, 0x94, 0x00, 0x04, 0, 0, 0, 3]);
        want.extend_from_slice(&[0x51, 0x95, 0x00, 0x04, 0, 0, 0, 2]);
        // SCSI name string, target device association, UTF-8, NUL padded.
        want.extend_from_slice(&[0x53, 0xa8, 0x00, 0x08]);
        want.extend_from_slice(b"iqn.a\0\0\0");
        let len = (want.len() - 4) as u16;
        want[2..4].copy_from_slice(&len.to_be_bytes());
        assert_eq!(out, want);
    }

    #[test]
    fn block_limits_layout() {
        let out = page(0xb0, &THIN);
        let mut want = vec![0x00, 0xb0, 0x00, 0x3c, 0x01, 0x01, 0x00, 0x00];
        want.extend_from_slice(&[0, 0, 0x08, 0x00]); // max transfer
        want.extend_from_slice(&[0, 0, 0x01, 0x00]); // optimal transfer
        want.extend_from_slice(&[0, 0, 0, 0]); // prefetch
        want.extend_from_slice(&[0, 0x04, 0, 0]); // max unmap LBA count
        want.extend_from_slice(&[0, 0, 0x01, 0]); // max unmap descriptors
        want.extend_from_slice(&[0, 0, 0, 8]); // granularity
        want.extend_from_slice(&[0x80, 0, 0, 0]); // UGAVALID
        want.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]); // max write same
        want.resize(64, 0);
        assert_eq!(out, want);
        // Without UNMAP the unmap counts must be zero (libiscsi checks it).
        let full = page(0xb0, &Provisioning::default());
        assert_eq!(&full[20..36], &[0u8; 16]);
    }

    #[test]
    fn characteristics_and_provisioning() {
        let out = page(0xb1, &THIN);
        assert_eq!(out.len(), 64);
        assert_eq!(&out[..6], &[0, 0xb1, 0, 0x3c, 0x00, 0x01]);
        assert!(out[6..].iter().all(|&b| b == 0));
        assert_eq!(page(0xb2, &THIN), [0, 0xb2, 0, 4, 0, 0xe4, 0x02, 0]);
        assert_eq!(
            page(0xb2, &Provisioning::default()),
            [0, 0xb2, 0, 4, 0, 0, 0, 0]
        );
        // Flags without thin provisioning are not reported.
        let not_thin = Provisioning {
            thin: false,
            ..THIN
        };
        assert_eq!(page(0xb2, &not_thin), [0, 0xb2, 0, 4, 0, 0, 0, 0]);
    }

    #[test]
    fn unsupported_page() {
        let mut out = Vec::new();
        let err = vpd_page(0x86, &id(), &limits(), &THIN, &mut out).unwrap_err();
        assert_eq!(err, Sense::invalid_field_in_cdb(2, Some(7)));
        assert!(out.is_empty());
    }

    #[test]
    fn every_listed_page_builds() {
        for p in SUPPORTED_VPD_PAGES {
            let out = page(p, &THIN);
            assert_eq!(out[1], p);
            assert_eq!(
                usize::from(u16::from_be_bytes([out[2], out[3]])),
                out.len() - 4
            );
        }
    }
}
