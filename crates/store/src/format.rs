//! The on-disk format, as pure encode/decode functions (no I/O): superblock,
//! volume table slots, extent table entries and journal blocks. All integers
//! are little-endian. `docs/format.md` is the prose version of this module;
//! change both together and bump `FORMAT_VERSION` on any incompatible change.
//!
//! Every structure a crash can tear is either protected by a CRC32C
//! (superblock, journal block) or made of fields no wider than a sector that
//! are rewritten in place and redone from the journal (volume slots, extent
//! entries).

use crate::VolumeId;

pub const FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"BASALTSB";
pub const JOURNAL_MAGIC: u32 = u32::from_le_bytes(*b"BJNL");
pub const PAGE: u64 = 4096;
pub const SUPERBLOCK_COPIES: [u64; 2] = [0, PAGE];
pub const VOLUME_SLOT_SIZE: u64 = 128;
pub const MAX_VOLUMES: u32 = 16384;
pub const EXTENT_ENTRY_SIZE: u64 = 16;
pub const JOURNAL_HEADER_SIZE: usize = 64;
pub const JOURNAL_ENTRY_SIZE: usize = 48;
pub const JOURNAL_ENTRIES_PER_BLOCK: usize =
    (PAGE as usize - JOURNAL_HEADER_SIZE) / JOURNAL_ENTRY_SIZE;
pub const DEFAULT_EXTENT_SIZE: u32 = 1 << 20;

/// Feature bits a reader must understand to open the store. None are defined
/// yet; snapshots, checksums, compression and encryption will add theirs.
pub const KNOWN_INCOMPAT_FEATURES: u64 = 0;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("no Basalt store on this device (bad superblock magic)")]
    NotAStore,
    #[error("superblock checksum mismatch")]
    BadChecksum,
    #[error("unsupported store format version {found}; this build reads version {FORMAT_VERSION}")]
    UnsupportedVersion { found: u32 },
    #[error(
        "the store uses features this build does not know (incompat bits {0:#x}); upgrade Basalt"
    )]
    UnknownFeatures(u64),
    #[error("inconsistent superblock: {0}")]
    Inconsistent(String),
}

/// Where each region lives; derived from device size and extent size at
/// format time and recorded in the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub extent_size: u32,
    pub volume_table_offset: u64,
    pub volume_slots: u32,
    pub extent_table_offset: u64,
    pub extent_count: u32,
    pub journal_offset: u64,
    pub journal_blocks: u64,
    pub data_offset: u64,
}

impl Layout {
    /// Plans the regions of a device of `device_size` bytes, or says why it
    /// cannot hold a store.
    pub fn plan(device_size: u64, extent_size: u32) -> Result<Layout, String> {
        let es = extent_size as u64;
        if extent_size < 64 * 1024 || !extent_size.is_power_of_two() || extent_size > 64 << 20 {
            return Err(format!(
                "extent size {extent_size} must be a power of two from 64 KiB to 64 MiB"
            ));
        }
        let volume_table_offset = 2 * PAGE;
        let volume_table_len = MAX_VOLUMES as u64 * VOLUME_SLOT_SIZE;
        let extent_table_offset = volume_table_offset + volume_table_len;
        let max_extents = device_size / es;
        let extent_table_len = (max_extents * EXTENT_ENTRY_SIZE).div_ceil(PAGE) * PAGE;
        let journal_offset = extent_table_offset + extent_table_len;
        let journal_len = (device_size / 512).clamp(1 << 20, 64 << 20) / PAGE * PAGE;
        let data_offset = (journal_offset + journal_len).div_ceil(es) * es;
        if data_offset >= device_size {
            return Err(format!(
                "{device_size} bytes cannot hold the metadata and one extent"
            ));
        }
        let extent_count = (device_size - data_offset) / es;
        if extent_count < 4 {
            return Err(format!(
                "{device_size} bytes leave fewer than 4 data extents of {es} bytes"
            ));
        }
        let extent_count = u32::try_from(extent_count)
            .map_err(|_| "device too large for this extent size".to_string())?;
        Ok(Layout {
            extent_size,
            volume_table_offset,
            volume_slots: MAX_VOLUMES,
            extent_table_offset,
            extent_count,
            journal_offset,
            journal_blocks: journal_len / PAGE,
            data_offset,
        })
    }

    pub fn extent_offset(&self, phys: u32) -> u64 {
        self.data_offset + phys as u64 * self.extent_size as u64
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.extent_count as u64 * self.extent_size as u64
    }

    pub fn extent_table_pages(&self) -> u64 {
        (self.extent_count as u64 * EXTENT_ENTRY_SIZE).div_ceil(PAGE)
    }

    pub fn volume_table_pages(&self) -> u64 {
        (self.volume_slots as u64 * VOLUME_SLOT_SIZE).div_ceil(PAGE)
    }

    pub fn journal_block_offset(&self, position: u64) -> u64 {
        self.journal_offset + (position % self.journal_blocks) * PAGE
    }
}

/// The root of the store; two copies, the valid one with the highest
/// generation wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub incompat_features: u64,
    pub compat_features: u64,
    pub store_id: uuid::Uuid,
    pub generation: u64,
    pub device_size: u64,
    pub layout: Layout,
    /// The journal sequence number of the first block not covered by the
    /// tables on disk, and its position (block index, modulo the ring).
    pub journal_tail_seq: u64,
    pub journal_tail_position: u64,
    /// Set by a clean close, cleared while the store is open.
    pub clean: bool,
    pub created_unix: u64,
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
fn get_uuid(b: &[u8], at: usize) -> uuid::Uuid {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    uuid::Uuid::from_bytes(a)
}

/// CRC32C of a 4 KiB block with its 4-byte checksum field (at `crc_at`) taken as zero.
fn block_crc(block: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&block[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &block[crc_at + 4..])
}

impl Superblock {
    pub fn encode(&self) -> [u8; PAGE as usize] {
        let mut b = [0u8; PAGE as usize];
        b[0..8].copy_from_slice(SUPERBLOCK_MAGIC);
        put_u32(&mut b, 8, self.version);
        // 12..16: crc
        put_u64(&mut b, 16, self.incompat_features);
        put_u64(&mut b, 24, self.compat_features);
        b[32..48].copy_from_slice(self.store_id.as_bytes());
        put_u64(&mut b, 48, self.generation);
        put_u64(&mut b, 56, self.device_size);
        let l = &self.layout;
        put_u32(&mut b, 64, l.extent_size);
        put_u32(&mut b, 68, l.volume_slots);
        put_u64(&mut b, 72, l.volume_table_offset);
        put_u64(&mut b, 80, l.extent_table_offset);
        put_u32(&mut b, 88, l.extent_count);
        put_u64(&mut b, 96, l.journal_offset);
        put_u64(&mut b, 104, l.journal_blocks);
        put_u64(&mut b, 112, l.data_offset);
        put_u64(&mut b, 120, self.journal_tail_seq);
        put_u64(&mut b, 128, self.journal_tail_position);
        b[136] = self.clean as u8;
        put_u64(&mut b, 144, self.created_unix);
        let crc = block_crc(&b, 12);
        put_u32(&mut b, 12, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        if b.len() < PAGE as usize || &b[0..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::NotAStore);
        }
        // The version comes before the checksum: a future format may
        // protect its superblock differently, and must be named, not
        // reported as corruption.
        let version = get_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { found: version });
        }
        if get_u32(b, 12) != block_crc(&b[..PAGE as usize], 12) {
            return Err(FormatError::BadChecksum);
        }
        let incompat_features = get_u64(b, 16);
        if incompat_features & !KNOWN_INCOMPAT_FEATURES != 0 {
            return Err(FormatError::UnknownFeatures(
                incompat_features & !KNOWN_INCOMPAT_FEATURES,
            ));
        }
        let layout = Layout {
            extent_size: get_u32(b, 64),
            volume_slots: get_u32(b, 68),
            volume_table_offset: get_u64(b, 72),
            extent_table_offset: get_u64(b, 80),
            extent_count: get_u32(b, 88),
            journal_offset: get_u64(b, 96),
            journal_blocks: get_u64(b, 104),
            data_offset: get_u64(b, 112),
        };
        let sb = Superblock {
            version,
            incompat_features,
            compat_features: get_u64(b, 24),
            store_id: get_uuid(b, 32),
            generation: get_u64(b, 48),
            device_size: get_u64(b, 56),
            layout,
            journal_tail_seq: get_u64(b, 120),
            journal_tail_position: get_u64(b, 128),
            clean: b[136] != 0,
            created_unix: get_u64(b, 144),
        };
        sb.validate()?;
        Ok(sb)
    }

    fn validate(&self) -> Result<(), FormatError> {
        let l = &self.layout;
        let bad = |m: &str| Err(FormatError::Inconsistent(m.to_string()));
        if !l.extent_size.is_power_of_two() || l.extent_size < 4096 {
            return bad("extent size");
        }
        if l.volume_slots == 0 || l.volume_slots > MAX_VOLUMES || l.journal_blocks == 0 {
            return bad("table sizes");
        }
        let data_end = l.data_offset.checked_add(l.capacity_bytes());
        if data_end.is_none_or(|e| e > self.device_size)
            || l.extent_table_offset + l.extent_table_pages() * PAGE > l.journal_offset
            || l.journal_offset + l.journal_blocks * PAGE > l.data_offset
        {
            return bad("regions overlap or exceed the device");
        }
        Ok(())
    }
}

/// One volume's persistent record, in the volume table (slot index + 1 is
/// the volume's local slot number; 0 means "no volume").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSlot {
    pub id: VolumeId,
    pub size: u64,
    pub created_unix: u64,
    /// Slot of the layer this volume reads through for unmapped extents
    /// (snapshots and clones); 0 = none. Reserved: always 0 in version 1.
    pub parent_slot: u32,
    /// Reserved for read-only/snapshot/encryption/compression flags.
    pub flags: u32,
    /// Replication epoch of this replica; reserved for the cluster.
    pub epoch: u64,
}

impl VolumeSlot {
    pub fn encode(slot: Option<&VolumeSlot>) -> [u8; VOLUME_SLOT_SIZE as usize] {
        let mut b = [0u8; VOLUME_SLOT_SIZE as usize];
        if let Some(s) = slot {
            b[0] = 1;
            b[8..24].copy_from_slice(s.id.as_bytes());
            put_u64(&mut b, 24, s.size);
            put_u64(&mut b, 32, s.created_unix);
            put_u32(&mut b, 40, s.parent_slot);
            put_u32(&mut b, 44, s.flags);
            put_u64(&mut b, 48, s.epoch);
        }
        b
    }

    pub fn decode(b: &[u8]) -> Option<VolumeSlot> {
        if b.len() < VOLUME_SLOT_SIZE as usize || b[0] != 1 {
            return None;
        }
        Some(VolumeSlot {
            id: get_uuid(b, 8),
            size: get_u64(b, 24),
            created_unix: get_u64(b, 32),
            parent_slot: get_u32(b, 40),
            flags: get_u32(b, 44),
            epoch: get_u64(b, 48),
        })
    }
}

/// The owner of one physical extent, in the extent table (indexed by
/// physical extent number). `slot == 0` means free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtentOwner {
    pub slot: u32,
    pub logical: u32,
}

impl ExtentOwner {
    pub const FREE: ExtentOwner = ExtentOwner {
        slot: 0,
        logical: 0,
    };

    pub fn is_free(&self) -> bool {
        self.slot == 0
    }

    pub fn encode(&self) -> [u8; EXTENT_ENTRY_SIZE as usize] {
        let mut b = [0u8; EXTENT_ENTRY_SIZE as usize];
        put_u32(&mut b, 0, self.slot);
        // 4..8: flags (reserved: compression, checksums), 8..16: logical extent (u64 on disk)
        put_u64(&mut b, 8, self.logical as u64);
        b
    }

    pub fn decode(b: &[u8]) -> ExtentOwner {
        let logical = get_u64(b, 8);
        ExtentOwner {
            slot: get_u32(b, 0),
            logical: u32::try_from(logical).unwrap_or(u32::MAX),
        }
    }
}

/// One metadata change. Each entry states a result (not a delta), so
/// replaying a suffix of the journal over tables that already contain some
/// of it reaches the same state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalEntry {
    /// Physical extent `phys` now holds logical extent `logical` of `slot`.
    Map { phys: u32, slot: u32, logical: u32 },
    /// Physical extent `phys` is free.
    Unmap { phys: u32 },
    CreateVolume {
        slot: u32,
        id: VolumeId,
        size: u64,
        created_unix: u64,
    },
    /// New size; extents wholly beyond it are freed.
    ResizeVolume { slot: u32, size: u64 },
    /// The volume and every extent it owns are gone.
    DeleteVolume { slot: u32 },
}

impl JournalEntry {
    fn encode_into(&self, b: &mut [u8]) {
        match *self {
            JournalEntry::Map {
                phys,
                slot,
                logical,
            } => {
                b[0] = 1;
                put_u32(b, 4, phys);
                put_u32(b, 8, slot);
                put_u64(b, 16, logical as u64);
            }
            JournalEntry::Unmap { phys } => {
                b[0] = 2;
                put_u32(b, 4, phys);
            }
            JournalEntry::CreateVolume {
                slot,
                id,
                size,
                created_unix,
            } => {
                b[0] = 3;
                put_u32(b, 8, slot);
                b[16..32].copy_from_slice(id.as_bytes());
                put_u64(b, 32, size);
                put_u64(b, 40, created_unix);
            }
            JournalEntry::ResizeVolume { slot, size } => {
                b[0] = 4;
                put_u32(b, 8, slot);
                put_u64(b, 32, size);
            }
            JournalEntry::DeleteVolume { slot } => {
                b[0] = 5;
                put_u32(b, 8, slot);
            }
        }
    }

    fn decode(b: &[u8]) -> Option<JournalEntry> {
        Some(match b[0] {
            1 => JournalEntry::Map {
                phys: get_u32(b, 4),
                slot: get_u32(b, 8),
                logical: u32::try_from(get_u64(b, 16)).ok()?,
            },
            2 => JournalEntry::Unmap {
                phys: get_u32(b, 4),
            },
            3 => JournalEntry::CreateVolume {
                slot: get_u32(b, 8),
                id: get_uuid(b, 16),
                size: get_u64(b, 32),
                created_unix: get_u64(b, 40),
            },
            4 => JournalEntry::ResizeVolume {
                slot: get_u32(b, 8),
                size: get_u64(b, 32),
            },
            5 => JournalEntry::DeleteVolume {
                slot: get_u32(b, 8),
            },
            _ => return None,
        })
    }
}

/// Encodes one journal block holding `entries` (at most
/// `JOURNAL_ENTRIES_PER_BLOCK`).
pub fn encode_journal_block(
    store_id: uuid::Uuid,
    seq: u64,
    entries: &[JournalEntry],
    out: &mut [u8],
) {
    debug_assert!(entries.len() <= JOURNAL_ENTRIES_PER_BLOCK);
    let out = &mut out[..PAGE as usize];
    out.fill(0);
    put_u32(out, 0, JOURNAL_MAGIC);
    // 4..8: crc
    put_u64(out, 8, seq);
    out[16..32].copy_from_slice(store_id.as_bytes());
    put_u32(out, 32, entries.len() as u32);
    for (i, e) in entries.iter().enumerate() {
        let at = JOURNAL_HEADER_SIZE + i * JOURNAL_ENTRY_SIZE;
        e.encode_into(&mut out[at..at + JOURNAL_ENTRY_SIZE]);
    }
    let crc = block_crc(out, 4);
    put_u32(out, 4, crc);
}

/// Decodes a journal block if it is intact, belongs to this store and has
/// the expected sequence number; anything else ends replay.
pub fn decode_journal_block(
    store_id: uuid::Uuid,
    expected_seq: u64,
    b: &[u8],
) -> Option<Vec<JournalEntry>> {
    if b.len() < PAGE as usize
        || get_u32(b, 0) != JOURNAL_MAGIC
        || get_u64(b, 8) != expected_seq
        || get_uuid(b, 16) != store_id
        || get_u32(b, 4) != block_crc(&b[..PAGE as usize], 4)
    {
        return None;
    }
    let count = get_u32(b, 32) as usize;
    if count > JOURNAL_ENTRIES_PER_BLOCK {
        return None;
    }
    (0..count)
        .map(|i| {
            let at = JOURNAL_HEADER_SIZE + i * JOURNAL_ENTRY_SIZE;
            JournalEntry::decode(&b[at..at + JOURNAL_ENTRY_SIZE])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_sb() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            incompat_features: 0,
            compat_features: 0,
            store_id: uuid::Uuid::from_u128(42),
            generation: 3,
            device_size: 1 << 30,
            layout: Layout::plan(1 << 30, DEFAULT_EXTENT_SIZE).unwrap(),
            journal_tail_seq: 9,
            journal_tail_position: 9,
            clean: true,
            created_unix: 1,
        }
    }

    #[test]
    fn superblock_roundtrip_and_rejections() {
        let sb = sample_sb();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        let mut bad = b;
        bad[200] ^= 1;
        assert_eq!(Superblock::decode(&bad), Err(FormatError::BadChecksum));
        let mut v2 = sb.clone();
        v2.version = 2;
        assert_eq!(
            Superblock::decode(&v2.encode()),
            Err(FormatError::UnsupportedVersion { found: 2 })
        );
        let mut feat = sb.clone();
        feat.incompat_features = 1 << 5;
        assert!(matches!(
            Superblock::decode(&feat.encode()),
            Err(FormatError::UnknownFeatures(_))
        ));
        assert_eq!(
            Superblock::decode(&[0u8; 4096]),
            Err(FormatError::NotAStore)
        );
    }

    #[test]
    fn layout_regions_do_not_overlap() {
        for size in [32u64 << 20, 64 << 20, 1 << 30, 20 << 30, 4 << 40] {
            let l = Layout::plan(size, DEFAULT_EXTENT_SIZE).unwrap();
            assert!(l.extent_table_offset >= l.volume_table_offset + l.volume_table_pages() * PAGE);
            assert!(l.journal_offset >= l.extent_table_offset + l.extent_table_pages() * PAGE);
            assert!(l.data_offset >= l.journal_offset + l.journal_blocks * PAGE);
            assert_eq!(l.data_offset % DEFAULT_EXTENT_SIZE as u64, 0);
            assert!(l.data_offset + l.capacity_bytes() <= size);
        }
        assert!(Layout::plan(2 << 20, DEFAULT_EXTENT_SIZE).is_err());
    }

    #[test]
    fn journal_block_roundtrip_and_guards() {
        let id = uuid::Uuid::from_u128(7);
        let entries = vec![
            JournalEntry::Map {
                phys: 1,
                slot: 2,
                logical: 3,
            },
            JournalEntry::Unmap { phys: 4 },
            JournalEntry::CreateVolume {
                slot: 1,
                id: uuid::Uuid::from_u128(5),
                size: 4096,
                created_unix: 6,
            },
            JournalEntry::ResizeVolume {
                slot: 1,
                size: 8192,
            },
            JournalEntry::DeleteVolume { slot: 1 },
        ];
        let mut b = vec![0u8; 4096];
        encode_journal_block(id, 11, &entries, &mut b);
        assert_eq!(decode_journal_block(id, 11, &b).unwrap(), entries);
        assert!(decode_journal_block(id, 12, &b).is_none());
        assert!(decode_journal_block(uuid::Uuid::from_u128(8), 11, &b).is_none());
        b[100] ^= 0xff;
        assert!(decode_journal_block(id, 11, &b).is_none());
    }
}
