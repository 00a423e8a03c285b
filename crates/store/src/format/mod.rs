//! The on-disk format, version 2, as pure encode/decode functions (no I/O).
//! `docs/format.md` is the prose version of this module and states the
//! durability rules the engine follows; change both together and bump
//! `FORMAT_VERSION` on any incompatible change.
//!
//! Every metadata structure carries a CRC32C: the superblock and each
//! journal block over the whole 4 KiB block, table pages per entry (each
//! extent entry and each volume slot, salted with its index). Table pages
//! are rewritten in place, and a power cut tears a page at sector
//! boundaries: a per-entry checksum keeps every entry of a torn page either
//! its old or its new value, both verifiable, where a per-page checksum
//! would make the whole page unreadable.
//!
//! Version 1 structures are still decoded here (superblock, table entries
//! without checksums, journal blocks without an epoch) for the upgrade.

mod checksums;
mod journal;
mod keys;
mod packed;
mod presence;
mod superblock;
mod tables;

pub use checksums::{
    decode_checksum_page, encode_checksum_page, CHECKSUMS_PER_PAGE, CHECKSUM_UNKNOWN,
};

pub use journal::{
    decode_journal_block, decode_journal_block_v1, encode_journal_block, pack_journal_blocks,
    JournalBlock, JournalEntry, JOURNAL_ENTRIES_PER_BLOCK, JOURNAL_ENTRY_SIZE, JOURNAL_HEADER_SIZE,
};
pub use keys::{
    decode_key_slot, encode_key_slot, KeySlot, WrappedKey, KEY_SLOT_SIZE, MAX_WRAPPED_KEY,
};
pub use packed::{
    decode_virtual_entry, encode_run, encode_virtual_entry, max_run_units, run_header_len, Codec,
    Opener, Record, RecordKind, RunError, RunHeader, RunIdentity, RunLoc, Sealing,
    MAX_UNITS_PER_EXTENT, PACK_SLOT, VIRTUAL_ENTRY_SIZE,
};
pub use presence::{
    decode_presence_sector, encode_presence_sector, presence_bit, PRESENCE_BITS_PER_SECTOR,
    PRESENCE_SECTOR, PRESENCE_WORDS_PER_SECTOR,
};
pub use superblock::Superblock;
pub use tables::{
    ExtentState, SlotState, VolumeSlot, QUARANTINE_SLOT, SLOT_RETIRED, SLOT_SNAPSHOT,
};

pub const FORMAT_VERSION: u32 = 2;
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"BASALTSB";
pub const PAGE: u64 = 4096;
pub const SUPERBLOCK_COPIES: [u64; 2] = [0, PAGE];
pub const VOLUME_SLOT_SIZE: u64 = 128;
pub const MAX_VOLUMES: u32 = 16384;
pub const EXTENT_ENTRY_SIZE: u64 = 16;
pub const DEFAULT_EXTENT_SIZE: u32 = 1 << 20;
/// The smallest journal ring a store may be formatted with (tests use it,
/// so that the ring wraps and checkpoints often).
pub const MIN_JOURNAL_BLOCKS: u64 = 4;

/// The store keeps a CRC32C of every 4 KiB data block in its checksum
/// region, and extent entries and the journal carry write-intent ("hot")
/// marks. Set at format (the default); stores upgraded from version 1 lack
/// the region and run without it.
pub const INCOMPAT_DATA_CHECKSUMS: u64 = 1 << 0;

/// Volumes may have a parent layer (snapshots and clones): the store has a
/// presence region (which 4 KiB blocks each layer's extent holds), volume
/// slots carry a parent and an origin, and the journal has the layer
/// entries (docs/format.md, "Layers"). Set at format (the default).
pub const INCOMPAT_LAYERS: u64 = 1 << 1;
/// Incompatible feature: per-volume key slots (wrapped data keys for
/// encryption at rest) in a region of their own.
pub const INCOMPAT_KEY_SLOTS: u64 = 1 << 2;

/// Incompatible feature: packed extents (compression). A logical extent may
/// map to a *virtual* extent, numbered after the physical ones, whose data
/// is a run of variable-size records in units of a shared pack extent; the
/// virtual extent table says where (docs/format.md, "Packed extents").
pub const INCOMPAT_PACKED: u64 = 1 << 3;

/// What a new store is formatted with.
pub const DEFAULT_FEATURES: u64 =
    INCOMPAT_DATA_CHECKSUMS | INCOMPAT_LAYERS | INCOMPAT_KEY_SLOTS | INCOMPAT_PACKED;

/// Feature bits a reader must understand to open the store, by name.
/// Compression and encryption add theirs.
pub const INCOMPAT_FEATURES: &[(u64, &str)] = &[
    (INCOMPAT_DATA_CHECKSUMS, "data-checksums"),
    (INCOMPAT_LAYERS, "layers"),
    (INCOMPAT_KEY_SLOTS, "key-slots"),
    (INCOMPAT_PACKED, "packed-extents"),
];

/// The names of feature bits, for messages ("data-checksums, layers").
pub fn feature_names(bits: u64) -> String {
    let mut names: Vec<String> = INCOMPAT_FEATURES
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    let unknown = bits & !known_incompat_features();
    if unknown != 0 {
        names.push(format!("unknown bits {unknown:#x}"));
    }
    names.join(", ")
}

pub fn known_incompat_features() -> u64 {
    INCOMPAT_FEATURES.iter().fold(0, |a, (bit, _)| a | bit)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("no Basalt store on this device (bad superblock magic)")]
    NotAStore,
    #[error("superblock checksum mismatch")]
    BadChecksum,
    #[error("unsupported store format version {found}; this build reads versions 1 (upgraded at open) and {FORMAT_VERSION}")]
    UnsupportedVersion { found: u32 },
    #[error(
        "the store uses features this build does not know (incompat bits {0:#x}); upgrade Basalt"
    )]
    UnknownFeatures(u64),
    #[error("inconsistent superblock: {0}")]
    Inconsistent(String),
    #[error("journal block {seq} holds entry kind {kind}, which this build does not know; upgrade Basalt")]
    UnknownJournalEntry { seq: u64, kind: u8 },
}

/// Where each region lives; derived from device size and extent size at
/// format time and recorded in the superblock. Version 2 keeps version 1's
/// geometry, so an upgrade rewrites metadata in place and moves no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub extent_size: u32,
    pub volume_table_offset: u64,
    pub volume_slots: u32,
    pub extent_table_offset: u64,
    pub extent_count: u32,
    pub journal_offset: u64,
    pub journal_blocks: u64,
    /// The checksum region (one CRC32C per 4 KiB data block); 0 pages
    /// without the data-checksums feature.
    pub checksum_offset: u64,
    pub checksum_pages: u64,
    /// The presence region (one bit per 4 KiB data block, 4064 to a 512 B
    /// sector); 0 sectors without the layers feature.
    pub presence_offset: u64,
    pub presence_sectors: u64,
    /// Key slots (key-slots feature; else 0): entries for volume slots
    /// 1..=key_slots.
    pub key_offset: u64,
    pub key_slots: u64,
    /// The virtual extent table (packed-extents feature; else 0): entries
    /// for virtual extents `extent_count..extent_count + virtual_extents`.
    pub virtual_offset: u64,
    pub virtual_extents: u32,
    pub data_offset: u64,
}

impl Layout {
    /// Plans the regions of a device of `device_size` bytes, or says why it
    /// cannot hold a store. `journal_blocks` overrides the journal's size
    /// (default: device size / 512, clamped to 1–64 MiB); the features
    /// `INCOMPAT_DATA_CHECKSUMS` and `INCOMPAT_LAYERS` add the checksum and
    /// presence regions after the journal.
    pub fn plan(
        device_size: u64,
        extent_size: u32,
        journal_blocks: Option<u64>,
        features: u64,
    ) -> Result<Layout, String> {
        let data_checksums = features & INCOMPAT_DATA_CHECKSUMS != 0;
        let layers = features & INCOMPAT_LAYERS != 0;
        let key_slots = features & INCOMPAT_KEY_SLOTS != 0;
        let packed = features & INCOMPAT_PACKED != 0;
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
        let journal_len = match journal_blocks {
            Some(b) if b < MIN_JOURNAL_BLOCKS => {
                return Err(format!(
                    "a journal of {b} blocks is below the minimum of {MIN_JOURNAL_BLOCKS}"
                ))
            }
            Some(b) => b * PAGE,
            None => (device_size / 512).clamp(1 << 20, 64 << 20) / PAGE * PAGE,
        };
        let checksum_offset = journal_offset + journal_len;
        // Sized for every extent the device could hold, so at most a page
        // more than the extents left after it need.
        let checksum_pages = if data_checksums {
            (max_extents * (es / PAGE)).div_ceil(CHECKSUMS_PER_PAGE as u64)
        } else {
            0
        };
        let presence_offset = checksum_offset + checksum_pages * PAGE;
        let presence_sectors = if layers {
            (max_extents * (es / PAGE)).div_ceil(PRESENCE_BITS_PER_SECTOR)
        } else {
            0
        };
        let presence_len = (presence_sectors * PRESENCE_SECTOR as u64).div_ceil(PAGE) * PAGE;
        let key_offset = presence_offset + presence_len;
        let key_slots = if key_slots {
            Layout::key_slots_for(device_size)
        } else {
            0
        };
        let key_len = (key_slots * KEY_SLOT_SIZE as u64).div_ceil(PAGE) * PAGE;
        let virtual_offset = key_offset + key_len;
        // As many virtual extents as physical ones: packed data can at most
        // double what the store holds (docs/format.md says why it is enough).
        let virtual_len = if packed {
            (max_extents * VIRTUAL_ENTRY_SIZE).div_ceil(PAGE) * PAGE
        } else {
            0
        };
        let data_offset = (virtual_offset + virtual_len).div_ceil(es) * es;
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
            checksum_offset: if data_checksums { checksum_offset } else { 0 },
            checksum_pages,
            presence_offset: if layers { presence_offset } else { 0 },
            presence_sectors,
            key_offset: if key_slots > 0 { key_offset } else { 0 },
            key_slots,
            virtual_offset: if packed { virtual_offset } else { 0 },
            virtual_extents: if packed { extent_count } else { 0 },
            data_offset,
        })
    }

    pub fn has_packed(&self) -> bool {
        self.virtual_extents > 0
    }

    /// Whether extent number `phys` is a virtual (packed) extent.
    pub fn is_virtual(&self, phys: u32) -> bool {
        phys >= self.extent_count
    }

    /// Physical and virtual extents: the numbers an extent entry may have.
    pub fn all_extents(&self) -> u32 {
        self.extent_count + self.virtual_extents
    }

    /// Where virtual extents' data would lie if they were physical: the
    /// data path tells a packed piece by its offset at or past this.
    pub fn virtual_base(&self) -> u64 {
        self.extent_offset(self.extent_count)
    }

    /// Bytes of the virtual extent table, whole pages.
    pub fn virtual_table_pages(&self) -> u64 {
        (self.virtual_extents as u64 * VIRTUAL_ENTRY_SIZE).div_ceil(PAGE)
    }

    /// Units of a pack extent: 32, or one per 4 KiB block if fewer.
    pub fn units_per_extent(&self) -> u32 {
        (self.blocks_per_extent() as u32).min(packed::MAX_UNITS_PER_EXTENT)
    }

    /// Bytes of one unit of a pack extent (a multiple of 4 KiB).
    pub fn unit_size(&self) -> u64 {
        self.extent_size as u64 / self.units_per_extent() as u64
    }

    /// Key slots a store formatted on `device_size` bytes gets: one per
    /// MiB, at least 64 and at most one per volume slot (a small store
    /// spends 8 KiB on them, a store of 16 GiB or more 2 MiB). Volumes in
    /// slots beyond cannot hold a key.
    pub fn key_slots_for(device_size: u64) -> u64 {
        (device_size >> 20).clamp(64, MAX_VOLUMES as u64)
    }

    pub fn has_key_slots(&self) -> bool {
        self.key_slots > 0
    }

    /// Bytes of the key slot region, whole pages.
    pub fn key_len(&self) -> u64 {
        (self.key_slots * KEY_SLOT_SIZE as u64).div_ceil(PAGE) * PAGE
    }

    pub fn has_data_checksums(&self) -> bool {
        self.checksum_pages > 0
    }

    pub fn has_layers(&self) -> bool {
        self.presence_sectors > 0
    }

    /// Presence sectors the data region needs.
    pub fn presence_sectors_needed(&self) -> u64 {
        self.data_blocks().div_ceil(PRESENCE_BITS_PER_SECTOR)
    }

    /// The presence region's length, in whole pages.
    pub fn presence_len(&self) -> u64 {
        (self.presence_sectors * PRESENCE_SECTOR as u64).div_ceil(PAGE) * PAGE
    }

    /// 4 KiB blocks per extent.
    pub fn blocks_per_extent(&self) -> u64 {
        self.extent_size as u64 / PAGE
    }

    /// 4 KiB blocks in the data region.
    pub fn data_blocks(&self) -> u64 {
        self.extent_count as u64 * self.blocks_per_extent()
    }

    /// Checksum pages the data region needs.
    pub fn checksum_pages_needed(&self) -> u64 {
        self.data_blocks().div_ceil(CHECKSUMS_PER_PAGE as u64)
    }

    pub fn checksum_page_offset(&self, page: u64) -> u64 {
        self.checksum_offset + page * PAGE
    }

    /// The data block (4 KiB, counted from the data region's start) at
    /// device offset `offset`.
    pub fn data_block_at(&self, offset: u64) -> u64 {
        (offset - self.data_offset) / PAGE
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

    pub fn journal_block_offset(&self, seq: u64) -> u64 {
        self.journal_offset + (seq % self.journal_blocks) * PAGE
    }

    /// Extents needed to hold `size` bytes of a volume.
    pub fn extents_for_size(&self, size: u64) -> u64 {
        size.div_ceil(self.extent_size as u64)
    }
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
pub(crate) fn get_uuid(b: &[u8], at: usize) -> uuid::Uuid {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    uuid::Uuid::from_bytes(a)
}

/// CRC32C of a block with its 4-byte checksum field (at `crc_at`) taken as zero.
pub(crate) fn block_crc(block: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&block[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &block[crc_at + 4..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_regions_do_not_overlap() {
        for size in [32u64 << 20, 64 << 20, 1 << 30, 20 << 30, 4 << 40] {
            let l = Layout::plan(size, DEFAULT_EXTENT_SIZE, None, DEFAULT_FEATURES).unwrap();
            assert!(l.extent_table_offset >= l.volume_table_offset + l.volume_table_pages() * PAGE);
            assert!(l.journal_offset >= l.extent_table_offset + l.extent_table_pages() * PAGE);
            assert!(l.checksum_offset >= l.journal_offset + l.journal_blocks * PAGE);
            assert!(l.presence_offset >= l.checksum_offset + l.checksum_pages * PAGE);
            assert!(l.data_offset >= l.presence_offset + l.presence_len());
            assert!(l.presence_sectors >= l.presence_sectors_needed());
            assert!(l.checksum_pages >= l.checksum_pages_needed());
            assert_eq!(l.data_offset % DEFAULT_EXTENT_SIZE as u64, 0);
            assert!(l.data_offset + l.capacity_bytes() <= size);
        }
        assert!(Layout::plan(2 << 20, DEFAULT_EXTENT_SIZE, None, DEFAULT_FEATURES).is_err());
        assert!(Layout::plan(64 << 20, DEFAULT_EXTENT_SIZE, Some(2), DEFAULT_FEATURES).is_err());
        let small = Layout::plan(8 << 20, 64 << 10, Some(6), DEFAULT_FEATURES).unwrap();
        assert_eq!(small.journal_blocks, 6);
        let plain = Layout::plan(8 << 20, 64 << 10, Some(6), 0).unwrap();
        assert_eq!((plain.checksum_offset, plain.checksum_pages), (0, 0));
        assert_eq!((plain.presence_offset, plain.presence_sectors), (0, 0));
        assert!(plain.extent_count >= small.extent_count);
    }
}
