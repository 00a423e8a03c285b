//! Packed extents (the packed-extents feature; docs/format.md, "Packed
//! extents"): a logical extent kept compressed, as a *run* of variable-size
//! records in a few units of a shared *pack extent*, under a *virtual
//! extent* number that the layer maps like any physical extent.
//!
//! Two structures, as pure encode/decode functions:
//! - the virtual extent table entry (32 B, one per virtual extent): its
//!   owner, like an extent table entry, and where its run lies;
//! - the run itself: a header (magic, identity, codec, one 8-byte record
//!   descriptor per 4 KiB block with the CRC32C of the stored bytes,
//!   and the header's own CRC32C) followed by the records, byte after
//!   byte. A run is written once into free units and never changed.
//!
//! A *sealed* run (an encrypted volume's: compress, then encrypt) keeps
//! each compressed record encrypted — `[u16 compressed length][compressed
//! bytes][zeros up to 16 bytes]`, sealed as one XTS data unit by the
//! caller's cipher — and raw records as the ciphertext blocks they were;
//! zero blocks are blocks never written through the cipher, as anywhere.
//!
//! Decoding never panics, whatever the bytes (fuzzed).

use super::{get_u32, put_u32, ExtentState, PAGE};

/// Units a pack extent is divided into at most: 32, or one per 4 KiB block
/// of smaller extents (`Layout::units_per_extent`). A run takes whole
/// units, at most `max_run_units` of them.
pub const MAX_UNITS_PER_EXTENT: u32 = 32;

/// Units a run may take out of `per_extent`: one that would need more
/// saves less than an eighth of the extent, which then stays as it is.
pub fn max_run_units(per_extent: u32) -> u32 {
    per_extent - per_extent / 8
}
/// Owner slot recorded for a pack extent (a physical extent holding runs).
pub const PACK_SLOT: u32 = u32::MAX - 1;
pub const VIRTUAL_ENTRY_SIZE: u64 = 32;
pub const RUN_MAGIC: u32 = u32::from_le_bytes(*b"BRUN");
/// Bytes of a run header before its record descriptors.
const RUN_FIXED: usize = 32;
const RECORD_DESC: usize = 8;
const VIRTUAL_CRC_AT: usize = 28;
/// Run header byte 22, bit 0: the compressed records are sealed.
const RUN_FLAG_SEALED: u8 = 1;
/// A sealed record is at least one XTS data unit long.
const MIN_SEALED: usize = 16;
const BLOCK: usize = PAGE as usize;

/// How a run's records are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Lz4,
    /// zstd at a level (1–19; the level only matters when compressing).
    Zstd(i32),
}

impl Codec {
    pub fn id(self) -> u8 {
        match self {
            Codec::Lz4 => 1,
            Codec::Zstd(_) => 2,
        }
    }
    pub fn from_id(id: u8) -> Option<Codec> {
        match id {
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd(3)),
            _ => None,
        }
    }
    /// `lz4`, `zstd` or `zstd:LEVEL` (what volume types and the CLI say).
    pub fn parse(s: &str) -> Result<Codec, String> {
        match s.split_once(':') {
            None if s == "lz4" => Ok(Codec::Lz4),
            None if s == "zstd" => Ok(Codec::Zstd(3)),
            Some(("zstd", level)) => match level.parse::<i32>() {
                Ok(l) if (1..=19).contains(&l) => Ok(Codec::Zstd(l)),
                _ => Err(format!("zstd level {level:?} is not 1 to 19")),
            },
            _ => Err(format!(
                "unknown compression {s:?}: lz4, zstd, zstd:LEVEL (1-19) or off"
            )),
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Codec::Lz4 => write!(f, "lz4"),
            Codec::Zstd(3) => write!(f, "zstd"),
            Codec::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

/// Where a virtual extent's run lies: units `unit..unit + units` of pack
/// extent `pack`, `stored` bytes of header and records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunLoc {
    pub pack: u32,
    pub unit: u8,
    pub units: u8,
    pub codec: u8,
    pub stored: u32,
}

fn salted_crc(index: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), bytes)
}

/// Encodes virtual extent `virt`'s table entry: its state (free, or owned
/// by a layer's logical extent) and, owned, its run.
pub fn encode_virtual_entry(virt: u32, state: ExtentState, run: RunLoc) -> [u8; 32] {
    let mut b = [0u8; VIRTUAL_ENTRY_SIZE as usize];
    if let ExtentState::Owned { slot, logical, .. } = state {
        put_u32(&mut b, 0, slot);
        put_u32(&mut b, 8, logical);
        put_u32(&mut b, 12, run.pack);
        b[16] = run.unit;
        b[17] = run.units;
        b[18] = run.codec;
        put_u32(&mut b, 20, run.stored);
    }
    let crc = salted_crc(virt, &b[..VIRTUAL_CRC_AT]);
    put_u32(&mut b, VIRTUAL_CRC_AT, crc);
    b
}

/// Decodes virtual extent `virt`'s entry; `None` if it fails to verify or
/// names an impossible run. A free virtual extent decodes as clean.
pub fn decode_virtual_entry(virt: u32, b: &[u8]) -> Option<(ExtentState, RunLoc)> {
    let b = b.get(..VIRTUAL_ENTRY_SIZE as usize)?;
    if get_u32(b, VIRTUAL_CRC_AT) != salted_crc(virt, &b[..VIRTUAL_CRC_AT]) {
        return None;
    }
    let slot = get_u32(b, 0);
    if slot == 0 {
        return Some((ExtentState::CLEAN, RunLoc::default()));
    }
    let run = RunLoc {
        pack: get_u32(b, 12),
        unit: b[16],
        units: b[17],
        codec: b[18],
        stored: get_u32(b, 20),
    };
    let fits = run.units >= 1 && run.unit as u32 + run.units as u32 <= MAX_UNITS_PER_EXTENT;
    if !fits || Codec::from_id(run.codec).is_none() {
        return None;
    }
    let state = ExtentState::Owned {
        slot,
        logical: get_u32(b, 8),
        hot: false,
    };
    Some((state, run))
}

/// Which layer's logical extent a run holds (written into its header, and
/// checked when it is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunIdentity {
    pub virt: u32,
    pub slot: u32,
    pub logical: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("not a packed run (bad magic)")]
    BadMagic,
    #[error("packed run header fails its checksum")]
    BadChecksum,
    #[error("packed run belongs to virtual extent {found}, not {expected}")]
    WrongRun { expected: u32, found: u32 },
    #[error("packed run header is inconsistent: {0}")]
    Inconsistent(&'static str),
    #[error("record of block {0} fails its checksum")]
    BadRecord(u32),
    #[error("record of block {0} does not decompress to 4 KiB")]
    BadCompression(u32),
    #[error("the run is encrypted and its volume's key is not loaded")]
    Sealed,
}

/// How an encrypted volume's extent is packed: `plain` is its content
/// decrypted (blocks never written, all zeros on the device, as zeros),
/// `seal` encrypts a compressed record of block `i` of the extent in
/// place (false: it could not).
pub struct Sealing<'a> {
    pub plain: &'a [u8],
    pub seal: &'a dyn Fn(u32, &mut [u8]) -> bool,
}

/// Decrypts a sealed record of block `i` in place (false: it could not).
pub type Opener<'a> = &'a dyn Fn(u32, &mut [u8]) -> bool;

/// What one block's record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// All zeros; nothing stored.
    Zero,
    Compressed,
    /// Stored as it is (compressing did not make it smaller).
    Raw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    /// Byte offset of the stored bytes from the run's start.
    pub offset: u32,
    pub len: u32,
    pub crc: u32,
}

/// A verified run header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHeader {
    pub identity: RunIdentity,
    pub codec: u8,
    pub units: u8,
    /// Compressed records are sealed (see the module's doc).
    pub sealed: bool,
    pub records: Vec<Record>,
}

/// Bytes of the header of a run of `blocks` records, whole pages.
pub fn run_header_len(blocks: usize) -> usize {
    (RUN_FIXED + RECORD_DESC * blocks).div_ceil(BLOCK) * BLOCK
}

impl RunHeader {
    /// Decodes the header at the start of `b` (at least
    /// `run_header_len(blocks)` bytes), for an extent of `blocks` blocks.
    pub fn decode(b: &[u8], blocks: usize) -> Result<RunHeader, RunError> {
        let described = RUN_FIXED + RECORD_DESC * blocks;
        if b.len() < described {
            return Err(RunError::Inconsistent("header cut short"));
        }
        if get_u32(b, 0) != RUN_MAGIC {
            return Err(RunError::BadMagic);
        }
        let crc = crc32c::crc32c_append(
            crc32c::crc32c_append(crc32c::crc32c(&b[..4]), &[0u8; 4]),
            &b[8..described],
        );
        if get_u32(b, 4) != crc {
            return Err(RunError::BadChecksum);
        }
        if get_u32(b, 24) as usize != blocks {
            return Err(RunError::Inconsistent("block count"));
        }
        let identity = RunIdentity {
            virt: get_u32(b, 8),
            slot: get_u32(b, 12),
            logical: get_u32(b, 16),
        };
        let (codec, units) = (b[20], b[21]);
        if b[22] & !RUN_FLAG_SEALED != 0 {
            return Err(RunError::Inconsistent("unknown run flags"));
        }
        let sealed = b[22] & RUN_FLAG_SEALED != 0;
        let mut offset = run_header_len(blocks) as u64;
        let mut records = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let d = &b[RUN_FIXED + RECORD_DESC * i..];
            let len = u16::from_le_bytes([d[0], d[1]]) as u32;
            let kind = match (d[2], len) {
                (0, 0) => RecordKind::Zero,
                (1, 1..4096) => RecordKind::Compressed,
                (2, 4096) => RecordKind::Raw,
                _ => return Err(RunError::Inconsistent("record descriptor")),
            };
            records.push(Record {
                kind,
                offset: offset as u32,
                len,
                crc: get_u32(d, 4),
            });
            offset += len as u64;
        }
        if offset != get_u32(b, 28) as u64 {
            return Err(RunError::Inconsistent("stored length"));
        }
        Ok(RunHeader {
            identity,
            codec,
            units,
            sealed,
            records,
        })
    }

    /// Bytes of header and records.
    pub fn stored_len(&self) -> usize {
        self.records
            .last()
            .map_or(0, |r| (r.offset + r.len) as usize)
    }

    /// The byte range of the run holding the records of blocks
    /// `first..first + count`.
    pub fn span(&self, first: usize, count: usize) -> std::ops::Range<usize> {
        let rs = &self.records[first..first + count];
        let start = rs.first().map_or(0, |r| r.offset as usize);
        let end = rs.last().map_or(start, |r| (r.offset + r.len) as usize);
        start..end
    }

    /// Decodes block `block` into `out` (4 KiB) from `bytes`, which hold
    /// the run's bytes from offset `base` on; `open` decrypts a sealed
    /// record in place (block index, record). Returns the record's kind:
    /// a sealed run's compressed block decodes to plaintext, its raw and
    /// zero blocks to what the device held.
    pub fn decode_block(
        &self,
        block: usize,
        bytes: &[u8],
        base: usize,
        out: &mut [u8],
        open: Option<Opener<'_>>,
    ) -> Result<RecordKind, RunError> {
        let r = self.records[block];
        let b = block as u32;
        if r.kind == RecordKind::Zero {
            out[..BLOCK].fill(0);
            return Ok(RecordKind::Zero);
        }
        let stored = (r.offset as usize)
            .checked_sub(base)
            .and_then(|at| bytes.get(at..at + r.len as usize))
            .ok_or(RunError::Inconsistent("record outside what was read"))?;
        if crc32c::crc32c(stored) != r.crc {
            return Err(RunError::BadRecord(b));
        }
        let opened;
        let stored = match (self.sealed, r.kind) {
            (true, RecordKind::Compressed) => {
                let open = open.ok_or(RunError::Sealed)?;
                let mut rec = stored.to_vec();
                if rec.len() < MIN_SEALED {
                    return Err(RunError::BadCompression(b));
                }
                if !open(b, &mut rec) {
                    return Err(RunError::Sealed);
                }
                let n = u16::from_le_bytes([rec[0], rec[1]]) as usize;
                if n + 2 > rec.len() {
                    return Err(RunError::BadCompression(b));
                }
                rec.truncate(n + 2);
                opened = rec;
                &opened[2..]
            }
            _ => stored,
        };
        let out = &mut out[..BLOCK];
        match r.kind {
            RecordKind::Raw => out.copy_from_slice(stored),
            _ => {
                let n = match Codec::from_id(self.codec) {
                    Some(Codec::Lz4) => lz4_flex::block::decompress_into(stored, out).ok(),
                    Some(Codec::Zstd(_)) => zstd_decompress(stored, out),
                    None => None,
                };
                if n != Some(BLOCK) {
                    return Err(RunError::BadCompression(b));
                }
            }
        }
        Ok(r.kind)
    }
}

thread_local! {
    /// A zstd decompression context per thread: making one per block
    /// (what `zstd::bulk::decompress_to_buffer` does) costs more than
    /// decompressing the block.
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Decompresses one zstd record into `out`; its length, or `None`.
fn zstd_decompress(stored: &[u8], out: &mut [u8]) -> Option<usize> {
    ZSTD_DCTX.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::bulk::Decompressor::new().ok();
        }
        cell.as_mut()?.decompress_to_buffer(stored, out).ok()
    })
}

/// Compresses the extent `data` (whole 4 KiB blocks) into a run for
/// `identity`, and says how many units of `unit_size` bytes it takes;
/// `None` when it would take more than [`max_run_units`] (it would save
/// less than an eighth). The run is padded to whole pages.
///
/// With `sealing` (an encrypted volume's extent: `data` is what the
/// device holds, ciphertext), blocks are compressed from their plaintext
/// and each compressed record is sealed; raw records keep the ciphertext.
pub fn encode_run(
    data: &[u8],
    identity: RunIdentity,
    codec: Codec,
    unit_size: usize,
    sealing: Option<&Sealing<'_>>,
) -> Option<(Vec<u8>, u8)> {
    let blocks = data.len() / BLOCK;
    let header = run_header_len(blocks);
    let per_extent = (data.len() / unit_size) as u32;
    let limit = max_run_units(per_extent) as usize * unit_size;
    let mut out = vec![0u8; header];
    let mut scratch = vec![0u8; BLOCK + BLOCK / 4 + 64];
    let mut zstd = match codec {
        Codec::Zstd(level) => Some(zstd::bulk::Compressor::new(level).ok()?),
        Codec::Lz4 => None,
    };
    let mut sealed = Vec::new();
    for (i, block) in data.chunks_exact(BLOCK).enumerate() {
        let plain = sealing.map_or(block, |s| &s.plain[i * BLOCK..(i + 1) * BLOCK]);
        let (kind, stored): (u8, &[u8]) = if block.iter().all(|&b| b == 0) {
            (0, &[])
        } else {
            let n = match (&mut zstd, codec) {
                (Some(z), _) => z.compress_to_buffer(plain, &mut scratch[..]).ok(),
                (None, _) => lz4_flex::block::compress_into(plain, &mut scratch).ok(),
            };
            match (n, sealing) {
                (Some(n), None) if n < BLOCK => (1, &scratch[..n]),
                (Some(n), Some(s)) if (n + 2).max(MIN_SEALED) < BLOCK => {
                    sealed.clear();
                    sealed.extend_from_slice(&(n as u16).to_le_bytes());
                    sealed.extend_from_slice(&scratch[..n]);
                    sealed.resize(sealed.len().max(MIN_SEALED), 0);
                    if !(s.seal)(i as u32, &mut sealed) {
                        return None;
                    }
                    (1, &sealed[..])
                }
                _ => (2, block),
            }
        };
        let d = RUN_FIXED + RECORD_DESC * i;
        out[d..d + 2].copy_from_slice(&(stored.len() as u16).to_le_bytes());
        out[d + 2] = kind;
        put_u32(&mut out, d + 4, crc32c::crc32c(stored));
        out.extend_from_slice(stored);
        if out.len() > limit {
            return None;
        }
    }
    let stored = out.len();
    let units = stored.div_ceil(unit_size) as u8;
    put_u32(&mut out, 0, RUN_MAGIC);
    put_u32(&mut out, 8, identity.virt);
    put_u32(&mut out, 12, identity.slot);
    put_u32(&mut out, 16, identity.logical);
    out[20] = codec.id();
    out[21] = units;
    out[22] = if sealing.is_some() {
        RUN_FLAG_SEALED
    } else {
        0
    };
    put_u32(&mut out, 24, blocks as u32);
    put_u32(&mut out, 28, stored as u32);
    let described = RUN_FIXED + RECORD_DESC * blocks;
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(crc32c::crc32c(&out[..4]), &[0u8; 4]),
        &out[8..described],
    );
    put_u32(&mut out, 4, crc);
    out.resize(stored.div_ceil(BLOCK) * BLOCK, 0);
    Some((out, units))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(blocks: usize, seed: u8) -> Vec<u8> {
        let mut d = vec![0u8; blocks * BLOCK];
        for (i, b) in d.chunks_exact_mut(BLOCK).enumerate() {
            match i % 4 {
                0 => {} // zeros
                1 => b.fill(seed),
                2 => {
                    // text-like: compresses
                    for (j, x) in b.iter_mut().enumerate() {
                        *x = b"basalt packed extent "[(j + i) % 21];
                    }
                }
                _ => {
                    // noise: does not
                    let mut s = (i as u32).wrapping_mul(2654435761) ^ seed as u32;
                    for x in b.iter_mut() {
                        s ^= s << 13;
                        s ^= s >> 17;
                        s ^= s << 5;
                        *x = s as u8;
                    }
                }
            }
        }
        d
    }

    #[test]
    fn runs_roundtrip_with_both_codecs() {
        let id = RunIdentity {
            virt: 70,
            slot: 3,
            logical: 9,
        };
        for codec in [Codec::Lz4, Codec::Zstd(3)] {
            let data = extent(256, 7);
            let (run, units) = encode_run(&data, id, codec, 128 << 10, None).expect("compressible");
            assert!(units as u32 <= max_run_units(8) && run.len() <= units as usize * (128 << 10));
            let h = RunHeader::decode(&run, 256).unwrap();
            assert_eq!(h.identity, id);
            assert_eq!(h.units, units);
            let mut out = [0u8; BLOCK];
            for b in 0..256 {
                h.decode_block(b, &run, 0, &mut out, None).unwrap();
                assert_eq!(
                    &out[..],
                    &data[b * BLOCK..(b + 1) * BLOCK],
                    "{codec} block {b}"
                );
            }
            // A span read on its own decodes too.
            let span = h.span(10, 5);
            let part = &run[span.clone()];
            for b in 10..15 {
                h.decode_block(b, part, span.start, &mut out, None).unwrap();
                assert_eq!(&out[..], &data[b * BLOCK..(b + 1) * BLOCK]);
            }
            // A flipped record is caught.
            let mut bad = run.clone();
            let r = h.records[2];
            bad[r.offset as usize] ^= 1;
            assert_eq!(
                h.decode_block(2, &bad, 0, &mut out, None),
                Err(RunError::BadRecord(2))
            );
            let mut bad = run.clone();
            bad[40] ^= 1;
            assert_eq!(RunHeader::decode(&bad, 256), Err(RunError::BadChecksum));
        }
    }

    #[test]
    fn sealed_runs_keep_compressed_records_encrypted() {
        // A stand-in cipher (an involution per block), and "ciphertext"
        // that does not compress while its plaintext does.
        let xor = |i: u32, rec: &mut [u8]| {
            for (j, x) in rec.iter_mut().enumerate() {
                *x ^= 0x5a ^ (i as u8) ^ (j as u8);
            }
            true
        };
        let plain = extent(16, 2);
        let mut disk = plain.clone();
        for (i, b) in disk.chunks_exact_mut(BLOCK).enumerate() {
            if b.iter().any(|&x| x != 0) {
                for (j, x) in b.iter_mut().enumerate() {
                    *x ^= (j as u8).wrapping_mul(151) ^ i as u8 ^ 0xa5;
                }
            }
        }
        let id = RunIdentity {
            virt: 5,
            slot: 2,
            logical: 1,
        };
        let sealing = Sealing {
            plain: &plain,
            seal: &xor,
        };
        let (run, _) = encode_run(&disk, id, Codec::Zstd(1), 8192, Some(&sealing)).unwrap();
        let h = RunHeader::decode(&run, 16).unwrap();
        assert!(h.sealed);
        let mut out = [0u8; BLOCK];
        let mut kinds = Vec::new();
        for b in 0..16 {
            let kind = h.decode_block(b, &run, 0, &mut out, Some(&xor)).unwrap();
            let want = match kind {
                RecordKind::Compressed => &plain[b * BLOCK..(b + 1) * BLOCK],
                RecordKind::Raw | RecordKind::Zero => &disk[b * BLOCK..(b + 1) * BLOCK],
            };
            assert_eq!(&out[..], want, "block {b} ({kind:?})");
            kinds.push(kind);
        }
        assert!(kinds.contains(&RecordKind::Compressed) && kinds.contains(&RecordKind::Zero));
        let b = kinds
            .iter()
            .position(|k| *k == RecordKind::Compressed)
            .unwrap();
        assert_eq!(
            h.decode_block(b, &run, 0, &mut out, None),
            Err(RunError::Sealed)
        );
        // No plaintext in the run.
        let text = &plain[2 * BLOCK..2 * BLOCK + 64];
        assert!(!run.windows(64).any(|w| w == text));
    }

    #[test]
    fn incompressible_extents_are_not_packed() {
        let mut data = vec![0u8; 256 * BLOCK];
        let mut s = 1u64;
        for x in data.iter_mut() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *x = (s >> 33) as u8;
        }
        let id = RunIdentity {
            virt: 1,
            slot: 1,
            logical: 0,
        };
        assert!(encode_run(&data, id, Codec::Lz4, 128 << 10, None).is_none());
        // All zeros: a header alone.
        let (run, units) =
            encode_run(&vec![0u8; 256 * BLOCK], id, Codec::Lz4, 128 << 10, None).unwrap();
        assert_eq!((run.len(), units), (run_header_len(256), 1));
    }

    #[test]
    fn virtual_entries_roundtrip_and_verify_their_place() {
        let run = RunLoc {
            pack: 12,
            unit: 3,
            units: 4,
            codec: 2,
            stored: 300_000,
        };
        let owned = ExtentState::Owned {
            slot: 5,
            logical: 77,
            hot: false,
        };
        let b = encode_virtual_entry(900, owned, run);
        assert_eq!(decode_virtual_entry(900, &b), Some((owned, run)));
        assert_eq!(decode_virtual_entry(901, &b), None);
        let free = encode_virtual_entry(900, ExtentState::DIRTY, run);
        assert_eq!(
            decode_virtual_entry(900, &free),
            Some((ExtentState::CLEAN, RunLoc::default()))
        );
        assert_eq!(decode_virtual_entry(0, &[0u8; 32]), None);
        let mut overrun = run;
        overrun.unit = 30;
        assert_eq!(
            decode_virtual_entry(900, &encode_virtual_entry(900, owned, overrun)),
            None
        );
    }

    #[test]
    fn codecs_parse_as_volume_types_write_them() {
        assert_eq!(Codec::parse("lz4"), Ok(Codec::Lz4));
        assert_eq!(Codec::parse("zstd"), Ok(Codec::Zstd(3)));
        assert_eq!(Codec::parse("zstd:9"), Ok(Codec::Zstd(9)));
        assert!(Codec::parse("zstd:0").is_err());
        assert!(Codec::parse("gzip").is_err());
        assert_eq!(Codec::Zstd(9).to_string(), "zstd:9");
    }
}
