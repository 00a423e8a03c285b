//! SCSI for the test initiator: the CDBs the tests send (built by hand,
//! big-endian as SBC-4/SPC-5 lay them out) and readers of fixed-format
//! sense data and of the parameter data the tests check.

#![allow(dead_code)]

/// Logical block size of the target's logical units.
pub const BLOCK: u64 = 512;

pub const STATUS_GOOD: u8 = 0x00;
pub const STATUS_CHECK_CONDITION: u8 = 0x02;
pub const SENSE_UNIT_ATTENTION: u8 = 0x06;

pub fn test_unit_ready() -> Vec<u8> {
    vec![0u8; 6]
}

/// INQUIRY: the standard data, or VPD page `page` when `evpd`.
pub fn inquiry(evpd: bool, page: u8, alloc_len: u16) -> Vec<u8> {
    let mut cdb = vec![0x12, u8::from(evpd), page, 0, 0, 0];
    cdb[3..5].copy_from_slice(&alloc_len.to_be_bytes());
    cdb
}

/// READ CAPACITY(16) (SERVICE ACTION IN(16), service action 0x10).
pub fn read_capacity16(alloc_len: u32) -> Vec<u8> {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[10..14].copy_from_slice(&alloc_len.to_be_bytes());
    cdb
}

/// READ(16) of `blocks` blocks at `lba`.
pub fn read16(lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    rw16(0x88, lba, blocks, fua)
}

/// WRITE(16) of `blocks` blocks at `lba`.
pub fn write16(lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    rw16(0x8a, lba, blocks, fua)
}

fn rw16(opcode: u8, lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    let mut cdb = vec![0u8; 16];
    cdb[0] = opcode;
    cdb[1] = if fua { 0x08 } else { 0 };
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// READ(10) of `blocks` blocks at `lba`.
pub fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = vec![0u8; 10];
    cdb[0] = 0x28;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// WRITE(10) of `blocks` blocks at `lba`.
pub fn write10(lba: u32, blocks: u16, fua: bool) -> Vec<u8> {
    let mut cdb = vec![0u8; 10];
    cdb[0] = 0x2a;
    cdb[1] = if fua { 0x08 } else { 0 };
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// REPORT TARGET PORT GROUPS (MAINTENANCE IN, service action 0x0a).
pub fn report_target_port_groups(alloc_len: u32) -> Vec<u8> {
    let mut cdb = vec![0u8; 12];
    cdb[0] = 0xa3;
    cdb[1] = 0x0a;
    cdb[6..10].copy_from_slice(&alloc_len.to_be_bytes());
    cdb
}

/// Sense key, ASC and ASCQ of fixed-format sense data.
pub fn sense_triple(sense: &[u8]) -> (u8, u8, u8) {
    assert!(sense.len() >= 14, "short sense data: {sense:02x?}");
    assert_eq!(
        sense[0] & 0x7f,
        0x70,
        "fixed-format current sense: {sense:02x?}"
    );
    (sense[2] & 0x0f, sense[12], sense[13])
}

/// READ CAPACITY(16) data: (blocks, block length, LBPPB exponent, LBPME).
pub fn parse_capacity16(data: &[u8]) -> (u64, u32, u8, bool) {
    assert!(data.len() >= 32, "short READ CAPACITY(16) data");
    let last = u64::from_be_bytes(data[0..8].try_into().unwrap());
    let block = u32::from_be_bytes(data[8..12].try_into().unwrap());
    (last + 1, block, data[13] & 0x0f, data[14] & 0x80 != 0)
}

/// One target port group of REPORT TARGET PORT GROUPS data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPortGroup {
    pub preferred: bool,
    /// Asymmetric access state: 0 active/optimized, 1 active/non-optimized.
    pub state: u8,
    pub id: u16,
    pub ports: Vec<u16>,
}

/// Parses REPORT TARGET PORT GROUPS data (length format).
pub fn parse_target_port_groups(data: &[u8]) -> Vec<TargetPortGroup> {
    let len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
    assert_eq!(data.len(), 4 + len, "RETURN DATA LENGTH covers the data");
    let mut groups = Vec::new();
    let mut at = 4;
    while at < data.len() {
        let d = &data[at..];
        let count = usize::from(d[7]);
        let ports = (0..count)
            .map(|i| u16::from_be_bytes([d[8 + 4 * i + 2], d[8 + 4 * i + 3]]))
            .collect();
        groups.push(TargetPortGroup {
            preferred: d[0] & 0x80 != 0,
            state: d[0] & 0x0f,
            id: u16::from_be_bytes([d[2], d[3]]),
            ports,
        });
        at += 8 + 4 * count;
    }
    groups
}

/// Space-trimmed ASCII.
pub fn ascii(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim_end().to_string()
}
