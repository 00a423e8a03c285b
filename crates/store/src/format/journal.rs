//! Journal blocks and entries. A block is trusted only if its magic, CRC,
//! store id, sequence number *and* epoch match: the epoch changes at every
//! open, so blocks an earlier run left past a torn commit are never
//! replayed after a later one.
//!
//! An entry takes one 48-byte slot of a block, or two (`Snapshot`, whose
//! second slot has kind 12); the two slots of a wide entry are always in
//! one block, so it replays whole or not at all.
//!
//! Every entry assigns a value to table fields, and what it does to a field
//! depends only on that field's value and the entry (never on another
//! field): replaying any suffix of the journal over tables that already
//! hold part of it reaches the same state (see docs/format.md).

use super::RunLoc;
use super::{block_crc, get_u32, get_u64, get_uuid, put_u32, put_u64, FormatError, PAGE};
use crate::VolumeId;

pub const JOURNAL_MAGIC_V2: u32 = u32::from_le_bytes(*b"BJN2");
pub const JOURNAL_MAGIC_V1: u32 = u32::from_le_bytes(*b"BJNL");
pub const JOURNAL_HEADER_SIZE: usize = 64;
pub const JOURNAL_ENTRY_SIZE: usize = 48;
pub const JOURNAL_ENTRIES_PER_BLOCK: usize =
    (PAGE as usize - JOURNAL_HEADER_SIZE) / JOURNAL_ENTRY_SIZE;

/// One metadata change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalEntry {
    /// Physical extent `phys` now holds logical extent `logical` of `slot`.
    Map { phys: u32, slot: u32, logical: u32 },
    /// Extents `first..first+count` are free and may hold data (dirty):
    /// freed by TRIM, or reserved by the allocator before it hands them out.
    Free { first: u32, count: u32 },
    /// Extents `first..first+count` are free and durably zero.
    Clean { first: u32, count: u32 },
    /// A new volume in `slot`; `parent`: the layer it reads through (a
    /// clone of that snapshot), 0 = none.
    CreateVolume {
        slot: u32,
        id: VolumeId,
        size: u64,
        created_unix: u64,
        parent: u32,
    },
    /// New size of a live slot (none: no-op); extents of the slot wholly
    /// beyond it become free and dirty.
    ResizeVolume { slot: u32, size: u64 },
    /// The slot is free; every extent it owns becomes free and dirty.
    DeleteVolume { slot: u32 },
    /// Owned extents `first..first+count` are hot: writes may land in them
    /// before their checksums are durable (free extents: no-op).
    Hot { first: u32, count: u32 },
    /// Owned extents `first..first+count` are cold again: their checksums
    /// in the checksum region are durable and match their durable data.
    Cold { first: u32, count: u32 },
    /// A scrub finished reading the whole volume in a live slot (none:
    /// no-op) at `unix` seconds.
    Scrubbed { slot: u32, unix: u64 },
    /// Blocks `first..first+count` of extent `phys` hold data of the layer
    /// owning it (presence bits set); cleared whenever the extent is freed.
    Present { phys: u32, first: u32, count: u32 },
    /// A snapshot: the layer in `slot` (a live volume) becomes snapshot
    /// `snap_id` of volume `vol_id`, frozen; the volume continues in
    /// `new_slot`, an empty layer over it. Two slots wide.
    Snapshot {
        slot: u32,
        new_slot: u32,
        snap_id: VolumeId,
        snap_created: u64,
        size: u64,
        vol_id: VolumeId,
        vol_created: u64,
        last_scrub: u64,
    },
    /// Deleting a snapshot merged into its only child: the layer in `slot`
    /// is gone (any extent it still owns becomes free and dirty), and a
    /// live `child` now reads through `parent` (0 = none).
    Unlink { slot: u32, child: u32, parent: u32 },
    /// A rollback: every extent of the live layer in `slot` becomes free
    /// and dirty, it reads through `parent` and has `size` bytes.
    Rollback { slot: u32, parent: u32, size: u64 },
    /// The snapshot in a live `slot` is being deleted (retired flag): no
    /// one reads it any more, and its merge into its child is finished at
    /// the next open if a stop interrupts it.
    Retire { slot: u32 },
    /// A live `slot` reads through `parent` (0 = none: flattened).
    Reparent { slot: u32, parent: u32 },
    /// Compaction: logical extent `logical` of `slot` moves from physical
    /// extent `from` (now free and dirty) to virtual extent `virt`, whose
    /// run is `run`; `run.pack` is (now) a pack extent. The run was
    /// durable before this entry was written.
    Pack {
        virt: u32,
        slot: u32,
        logical: u32,
        from: u32,
        run: RunLoc,
    },
    /// Logical extent `logical` of `slot` moves from virtual extent `virt`
    /// (now free: its run's units are released) to physical extent `to`,
    /// which holds every block of it (hot, all blocks present). `to`'s
    /// data was durable before this entry was written.
    Unpack {
        virt: u32,
        slot: u32,
        logical: u32,
        to: u32,
    },
}

const KIND_MAP: u8 = 1;
const KIND_FREE: u8 = 2;
const KIND_CREATE: u8 = 3;
const KIND_RESIZE: u8 = 4;
const KIND_DELETE: u8 = 5;
const KIND_CLEAN: u8 = 6;
const KIND_HOT: u8 = 7;
const KIND_COLD: u8 = 8;
const KIND_SCRUBBED: u8 = 9;
const KIND_PRESENT: u8 = 10;
const KIND_SNAPSHOT: u8 = 11;
/// The second slot of a `Snapshot` entry.
const KIND_SNAPSHOT_REST: u8 = 12;
const KIND_UNLINK: u8 = 13;
const KIND_ROLLBACK: u8 = 14;
const KIND_RETIRE: u8 = 15;
const KIND_REPARENT: u8 = 16;
const KIND_PACK: u8 = 17;
const KIND_UNPACK: u8 = 18;

/// Consecutive ranges of `entries`, one per journal block, each filling
/// at most `JOURNAL_ENTRIES_PER_BLOCK` slots (a wide entry never split).
pub fn pack_journal_blocks(entries: &[JournalEntry]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, e) in entries.iter().enumerate() {
        if used + e.width() > JOURNAL_ENTRIES_PER_BLOCK {
            out.push(start..i);
            (start, used) = (i, 0);
        }
        used += e.width();
    }
    if start < entries.len() {
        out.push(start..entries.len());
    }
    out
}

impl JournalEntry {
    /// Slots of a journal block this entry takes.
    pub fn width(&self) -> usize {
        match self {
            JournalEntry::Snapshot { .. } => 2,
            _ => 1,
        }
    }

    /// Encodes into `b`, `width()` slots long.
    fn encode_into(&self, b: &mut [u8]) {
        match *self {
            JournalEntry::Map {
                phys,
                slot,
                logical,
            } => {
                b[0] = KIND_MAP;
                put_u32(b, 4, phys);
                put_u32(b, 8, slot);
                put_u64(b, 16, logical as u64);
            }
            JournalEntry::Free { first, count }
            | JournalEntry::Clean { first, count }
            | JournalEntry::Hot { first, count }
            | JournalEntry::Cold { first, count } => {
                b[0] = match self {
                    JournalEntry::Free { .. } => KIND_FREE,
                    JournalEntry::Clean { .. } => KIND_CLEAN,
                    JournalEntry::Hot { .. } => KIND_HOT,
                    _ => KIND_COLD,
                };
                put_u32(b, 4, first);
                put_u32(b, 12, count);
            }
            JournalEntry::CreateVolume {
                slot,
                id,
                size,
                created_unix,
                parent,
            } => {
                b[0] = KIND_CREATE;
                put_u32(b, 4, parent);
                put_u32(b, 8, slot);
                b[16..32].copy_from_slice(id.as_bytes());
                put_u64(b, 32, size);
                put_u64(b, 40, created_unix);
            }
            JournalEntry::ResizeVolume { slot, size } => {
                b[0] = KIND_RESIZE;
                put_u32(b, 8, slot);
                put_u64(b, 32, size);
            }
            JournalEntry::DeleteVolume { slot } => {
                b[0] = KIND_DELETE;
                put_u32(b, 8, slot);
            }
            JournalEntry::Scrubbed { slot, unix } => {
                b[0] = KIND_SCRUBBED;
                put_u32(b, 8, slot);
                put_u64(b, 32, unix);
            }
            JournalEntry::Present { phys, first, count } => {
                b[0] = KIND_PRESENT;
                put_u32(b, 4, phys);
                put_u32(b, 8, first);
                put_u32(b, 12, count);
            }
            JournalEntry::Snapshot {
                slot,
                new_slot,
                snap_id,
                snap_created,
                size,
                vol_id,
                vol_created,
                last_scrub,
            } => {
                b[0] = KIND_SNAPSHOT;
                put_u32(b, 4, slot);
                put_u32(b, 8, new_slot);
                b[16..32].copy_from_slice(snap_id.as_bytes());
                put_u64(b, 32, snap_created);
                put_u64(b, 40, size);
                let r = &mut b[JOURNAL_ENTRY_SIZE..];
                r[0] = KIND_SNAPSHOT_REST;
                r[16..32].copy_from_slice(vol_id.as_bytes());
                put_u64(r, 32, vol_created);
                put_u64(r, 40, last_scrub);
            }
            JournalEntry::Unlink {
                slot,
                child,
                parent,
            } => {
                b[0] = KIND_UNLINK;
                put_u32(b, 8, slot);
                put_u32(b, 12, child);
                put_u32(b, 16, parent);
            }
            JournalEntry::Rollback { slot, parent, size } => {
                b[0] = KIND_ROLLBACK;
                put_u32(b, 8, slot);
                put_u32(b, 12, parent);
                put_u64(b, 32, size);
            }
            JournalEntry::Retire { slot } => {
                b[0] = KIND_RETIRE;
                put_u32(b, 8, slot);
            }
            JournalEntry::Reparent { slot, parent } => {
                b[0] = KIND_REPARENT;
                put_u32(b, 8, slot);
                put_u32(b, 12, parent);
            }
            JournalEntry::Pack {
                virt,
                slot,
                logical,
                from,
                run,
            } => {
                b[0] = KIND_PACK;
                put_u32(b, 4, virt);
                put_u32(b, 8, slot);
                put_u32(b, 12, logical);
                put_u32(b, 16, from);
                put_u32(b, 20, run.pack);
                b[24] = run.unit;
                b[25] = run.units;
                b[26] = run.codec;
                put_u32(b, 28, run.stored);
            }
            JournalEntry::Unpack {
                virt,
                slot,
                logical,
                to,
            } => {
                b[0] = KIND_UNPACK;
                put_u32(b, 4, virt);
                put_u32(b, 8, slot);
                put_u32(b, 12, logical);
                put_u32(b, 16, to);
            }
        }
    }

    /// Decodes one entry from `b` (its slot and every later slot of the
    /// block); `Err(kind)` for a kind this build does not know, or a wide
    /// entry cut short. `v1`: version 1's Unmap (kind 2, one extent, no
    /// count) and nothing past kind 5.
    fn decode(b: &[u8], v1: bool) -> Result<JournalEntry, u8> {
        Ok(match b[0] {
            KIND_MAP => JournalEntry::Map {
                phys: get_u32(b, 4),
                slot: get_u32(b, 8),
                logical: u32::try_from(get_u64(b, 16)).map_err(|_| KIND_MAP)?,
            },
            KIND_FREE if v1 => JournalEntry::Free {
                first: get_u32(b, 4),
                count: 1,
            },
            KIND_FREE => JournalEntry::Free {
                first: get_u32(b, 4),
                count: get_u32(b, 12),
            },
            KIND_CLEAN if !v1 => JournalEntry::Clean {
                first: get_u32(b, 4),
                count: get_u32(b, 12),
            },
            KIND_HOT if !v1 => JournalEntry::Hot {
                first: get_u32(b, 4),
                count: get_u32(b, 12),
            },
            KIND_COLD if !v1 => JournalEntry::Cold {
                first: get_u32(b, 4),
                count: get_u32(b, 12),
            },
            KIND_SCRUBBED if !v1 => JournalEntry::Scrubbed {
                slot: get_u32(b, 8),
                unix: get_u64(b, 32),
            },
            KIND_CREATE => JournalEntry::CreateVolume {
                slot: get_u32(b, 8),
                id: get_uuid(b, 16),
                size: get_u64(b, 32),
                created_unix: get_u64(b, 40),
                parent: if v1 { 0 } else { get_u32(b, 4) },
            },
            KIND_RESIZE => JournalEntry::ResizeVolume {
                slot: get_u32(b, 8),
                size: get_u64(b, 32),
            },
            KIND_DELETE => JournalEntry::DeleteVolume {
                slot: get_u32(b, 8),
            },
            KIND_PRESENT if !v1 => JournalEntry::Present {
                phys: get_u32(b, 4),
                first: get_u32(b, 8),
                count: get_u32(b, 12),
            },
            KIND_SNAPSHOT if !v1 => {
                let r = b
                    .get(JOURNAL_ENTRY_SIZE..2 * JOURNAL_ENTRY_SIZE)
                    .filter(|r| r[0] == KIND_SNAPSHOT_REST)
                    .ok_or(KIND_SNAPSHOT)?;
                JournalEntry::Snapshot {
                    slot: get_u32(b, 4),
                    new_slot: get_u32(b, 8),
                    snap_id: get_uuid(b, 16),
                    snap_created: get_u64(b, 32),
                    size: get_u64(b, 40),
                    vol_id: get_uuid(r, 16),
                    vol_created: get_u64(r, 32),
                    last_scrub: get_u64(r, 40),
                }
            }
            KIND_UNLINK if !v1 => JournalEntry::Unlink {
                slot: get_u32(b, 8),
                child: get_u32(b, 12),
                parent: get_u32(b, 16),
            },
            KIND_ROLLBACK if !v1 => JournalEntry::Rollback {
                slot: get_u32(b, 8),
                parent: get_u32(b, 12),
                size: get_u64(b, 32),
            },
            KIND_RETIRE if !v1 => JournalEntry::Retire {
                slot: get_u32(b, 8),
            },
            KIND_REPARENT if !v1 => JournalEntry::Reparent {
                slot: get_u32(b, 8),
                parent: get_u32(b, 12),
            },
            KIND_PACK if !v1 => JournalEntry::Pack {
                virt: get_u32(b, 4),
                slot: get_u32(b, 8),
                logical: get_u32(b, 12),
                from: get_u32(b, 16),
                run: RunLoc {
                    pack: get_u32(b, 20),
                    unit: b[24],
                    units: b[25],
                    codec: b[26],
                    stored: get_u32(b, 28),
                },
            },
            KIND_UNPACK if !v1 => JournalEntry::Unpack {
                virt: get_u32(b, 4),
                slot: get_u32(b, 8),
                logical: get_u32(b, 12),
                to: get_u32(b, 16),
            },
            other => return Err(other),
        })
    }
}

/// A verified journal block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalBlock {
    pub entries: Vec<JournalEntry>,
    /// Sequence number of the first block of the commit that wrote this
    /// one: a block that fails to verify although a block of a *later*
    /// commit verifies was corrupted after it was durable, not torn.
    pub commit_first: u64,
}

/// Encodes one journal block holding `entries` (filling at most
/// `JOURNAL_ENTRIES_PER_BLOCK` slots), written by the commit whose first
/// block is `commit_first`. The header's count is of slots.
pub fn encode_journal_block(
    store_id: uuid::Uuid,
    epoch: u64,
    seq: u64,
    commit_first: u64,
    entries: &[JournalEntry],
    out: &mut [u8],
) {
    let slots: usize = entries.iter().map(JournalEntry::width).sum();
    debug_assert!(slots <= JOURNAL_ENTRIES_PER_BLOCK);
    let out = &mut out[..PAGE as usize];
    out.fill(0);
    put_u32(out, 0, JOURNAL_MAGIC_V2);
    // 4..8: crc
    put_u64(out, 8, seq);
    out[16..32].copy_from_slice(store_id.as_bytes());
    put_u32(out, 32, slots as u32);
    put_u64(out, 40, epoch);
    put_u64(out, 48, commit_first);
    let mut at = JOURNAL_HEADER_SIZE;
    for e in entries {
        let len = e.width() * JOURNAL_ENTRY_SIZE;
        e.encode_into(&mut out[at..at + len]);
        at += len;
    }
    let crc = block_crc(out, 4);
    put_u32(out, 4, crc);
}

fn decode_block(
    magic: u32,
    store_id: uuid::Uuid,
    epoch: Option<u64>,
    expected_seq: u64,
    b: &[u8],
) -> Result<Option<JournalBlock>, FormatError> {
    if b.len() < PAGE as usize
        || get_u32(b, 0) != magic
        || get_u64(b, 8) != expected_seq
        || get_uuid(b, 16) != store_id
        || epoch.is_some_and(|e| get_u64(b, 40) != e)
        || get_u32(b, 4) != block_crc(&b[..PAGE as usize], 4)
    {
        return Ok(None);
    }
    let count = get_u32(b, 32) as usize;
    let commit_first = if epoch.is_some() {
        get_u64(b, 48)
    } else {
        expected_seq
    };
    if count > JOURNAL_ENTRIES_PER_BLOCK || commit_first > expected_seq {
        return Ok(None);
    }
    let slots = &b[JOURNAL_HEADER_SIZE..JOURNAL_HEADER_SIZE + count * JOURNAL_ENTRY_SIZE];
    let mut entries = Vec::with_capacity(count);
    let mut at = 0;
    while at < slots.len() {
        let e = JournalEntry::decode(&slots[at..], epoch.is_none()).map_err(|kind| {
            FormatError::UnknownJournalEntry {
                seq: expected_seq,
                kind,
            }
        })?;
        at += e.width() * JOURNAL_ENTRY_SIZE;
        entries.push(e);
    }
    Ok(Some(JournalBlock {
        entries,
        commit_first,
    }))
}

/// Decodes a version-2 journal block: `Ok(None)` where replay ends (not a
/// block of this store, sequence and epoch, or torn); an error for a
/// verified block with an entry this build does not know, which must not be
/// skipped.
pub fn decode_journal_block(
    store_id: uuid::Uuid,
    epoch: u64,
    expected_seq: u64,
    b: &[u8],
) -> Result<Option<JournalBlock>, FormatError> {
    decode_block(JOURNAL_MAGIC_V2, store_id, Some(epoch), expected_seq, b)
}

/// Decodes a version-1 journal block (for the upgrade).
pub fn decode_journal_block_v1(
    store_id: uuid::Uuid,
    expected_seq: u64,
    b: &[u8],
) -> Result<Option<JournalBlock>, FormatError> {
    decode_block(JOURNAL_MAGIC_V1, store_id, None, expected_seq, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_block_roundtrip_and_guards() {
        let id = uuid::Uuid::from_u128(7);
        let entries = vec![
            JournalEntry::Map {
                phys: 1,
                slot: 2,
                logical: 3,
            },
            JournalEntry::Free { first: 4, count: 2 },
            JournalEntry::Clean { first: 9, count: 1 },
            JournalEntry::Hot { first: 4, count: 3 },
            JournalEntry::Cold { first: 5, count: 1 },
            JournalEntry::Scrubbed { slot: 2, unix: 77 },
            JournalEntry::CreateVolume {
                slot: 1,
                id: uuid::Uuid::from_u128(5),
                size: 4096,
                created_unix: 6,
                parent: 3,
            },
            JournalEntry::Present {
                phys: 8,
                first: 3,
                count: 5,
            },
            JournalEntry::Snapshot {
                slot: 1,
                new_slot: 2,
                snap_id: uuid::Uuid::from_u128(9),
                snap_created: 10,
                size: 1 << 20,
                vol_id: uuid::Uuid::from_u128(5),
                vol_created: 6,
                last_scrub: 11,
            },
            JournalEntry::Unlink {
                slot: 1,
                child: 2,
                parent: 0,
            },
            JournalEntry::Rollback {
                slot: 2,
                parent: 4,
                size: 8192,
            },
            JournalEntry::Retire { slot: 3 },
            JournalEntry::Reparent { slot: 2, parent: 0 },
            JournalEntry::Pack {
                virt: 900,
                slot: 2,
                logical: 7,
                from: 12,
                run: RunLoc {
                    pack: 30,
                    unit: 5,
                    units: 2,
                    codec: 1,
                    stored: 200_000,
                },
            },
            JournalEntry::Unpack {
                virt: 900,
                slot: 2,
                logical: 7,
                to: 13,
            },
            JournalEntry::ResizeVolume {
                slot: 1,
                size: 8192,
            },
            JournalEntry::DeleteVolume { slot: 1 },
        ];
        let mut b = vec![0u8; 4096];
        encode_journal_block(id, 3, 11, 10, &entries, &mut b);
        assert_eq!(
            decode_journal_block(id, 3, 11, &b),
            Ok(Some(JournalBlock {
                entries,
                commit_first: 10
            }))
        );
        assert_eq!(decode_journal_block(id, 3, 12, &b), Ok(None));
        assert_eq!(decode_journal_block(id, 2, 11, &b), Ok(None), "old epoch");
        assert_eq!(
            decode_journal_block(uuid::Uuid::from_u128(8), 3, 11, &b),
            Ok(None)
        );
        assert_eq!(decode_journal_block_v1(id, 11, &b), Ok(None));
        let mut torn = b.clone();
        torn[100] ^= 0xff;
        assert_eq!(decode_journal_block(id, 3, 11, &torn), Ok(None));
        // A verified block with an unknown entry kind refuses, by kind.
        let mut unknown = b.clone();
        unknown[JOURNAL_HEADER_SIZE] = 77;
        let crc = block_crc(&unknown, 4);
        put_u32(&mut unknown, 4, crc);
        assert_eq!(
            decode_journal_block(id, 3, 11, &unknown),
            Err(FormatError::UnknownJournalEntry { seq: 11, kind: 77 })
        );
    }

    #[test]
    fn wide_entries_are_never_split_between_blocks() {
        let snap = JournalEntry::Snapshot {
            slot: 1,
            new_slot: 2,
            snap_id: uuid::Uuid::from_u128(9),
            snap_created: 10,
            size: 4096,
            vol_id: uuid::Uuid::from_u128(5),
            vol_created: 6,
            last_scrub: 0,
        };
        let free = JournalEntry::Free { first: 1, count: 1 };
        let mut entries = vec![free; JOURNAL_ENTRIES_PER_BLOCK - 1];
        entries.push(snap);
        entries.push(free);
        let blocks = pack_journal_blocks(&entries);
        assert_eq!(
            blocks,
            vec![
                0..JOURNAL_ENTRIES_PER_BLOCK - 1,
                JOURNAL_ENTRIES_PER_BLOCK - 1..entries.len()
            ]
        );
        let id = uuid::Uuid::from_u128(7);
        let mut b = vec![0u8; 4096];
        encode_journal_block(id, 1, 2, 2, &entries[blocks[1].clone()], &mut b);
        let back = decode_journal_block(id, 1, 2, &b).unwrap().unwrap();
        assert_eq!(back.entries, entries[blocks[1].clone()].to_vec());
        // A snapshot entry whose second slot is missing refuses the open.
        let mut cut = vec![0u8; 4096];
        encode_journal_block(id, 1, 2, 2, &[snap], &mut cut);
        put_u32(&mut cut, 32, 1);
        let crc = block_crc(&cut, 4);
        put_u32(&mut cut, 4, crc);
        assert!(decode_journal_block(id, 1, 2, &cut).is_err());
        assert!(pack_journal_blocks(&[]).is_empty());
    }
}
