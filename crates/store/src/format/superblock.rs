//! The superblock: the root of the store, kept in two copies. A write goes
//! to copy `generation % 2` and is flushed before anything depends on it,
//! so a torn write leaves the other copy intact; the reader takes the valid
//! copy with the highest generation, whichever version it is (an upgrade
//! interrupted after writing one version-2 copy finds it there).

use super::{
    block_crc, get_u32, get_u64, get_uuid, known_incompat_features, put_u32, put_u64, FormatError,
    Layout, FORMAT_VERSION, INCOMPAT_DATA_CHECKSUMS, INCOMPAT_KEY_SLOTS, INCOMPAT_LAYERS,
    INCOMPAT_PACKED, KEY_SLOT_SIZE, MAX_VOLUMES, PAGE, SUPERBLOCK_MAGIC,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// 1 (read only to upgrade it) or 2.
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
    /// The journal epoch: only journal blocks of this epoch are replayed.
    /// Every open starts a new one (version 2; 0 in version 1).
    pub journal_epoch: u64,
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
        if self.version >= 2 {
            put_u64(&mut b, 152, self.journal_epoch);
            put_u64(&mut b, 160, l.checksum_offset);
            put_u64(&mut b, 168, l.checksum_pages);
            put_u64(&mut b, 176, l.presence_offset);
            put_u64(&mut b, 184, l.presence_sectors);
            put_u64(&mut b, 192, l.key_offset);
            put_u64(&mut b, 200, l.key_slots);
            put_u64(&mut b, 208, l.virtual_offset);
            put_u32(&mut b, 216, l.virtual_extents);
        }
        let crc = block_crc(&b, 12);
        put_u32(&mut b, 12, crc);
        b
    }

    /// Decodes and validates one copy. Never panics, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        if b.len() < PAGE as usize || &b[0..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::NotAStore);
        }
        // The version comes before the checksum: a future format may
        // protect its superblock differently, and must be named, not
        // reported as corruption.
        let version = get_u32(b, 8);
        if version != 1 && version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { found: version });
        }
        if get_u32(b, 12) != block_crc(&b[..PAGE as usize], 12) {
            return Err(FormatError::BadChecksum);
        }
        let incompat_features = get_u64(b, 16);
        let unknown = incompat_features & !known_incompat_features();
        if unknown != 0 {
            return Err(FormatError::UnknownFeatures(unknown));
        }
        let checksums = version >= 2 && incompat_features & INCOMPAT_DATA_CHECKSUMS != 0;
        let layers = version >= 2 && incompat_features & INCOMPAT_LAYERS != 0;
        let keys = version >= 2 && incompat_features & INCOMPAT_KEY_SLOTS != 0;
        let packed = version >= 2 && incompat_features & INCOMPAT_PACKED != 0;
        let layout = Layout {
            extent_size: get_u32(b, 64),
            volume_slots: get_u32(b, 68),
            volume_table_offset: get_u64(b, 72),
            extent_table_offset: get_u64(b, 80),
            extent_count: get_u32(b, 88),
            journal_offset: get_u64(b, 96),
            journal_blocks: get_u64(b, 104),
            checksum_offset: if checksums { get_u64(b, 160) } else { 0 },
            checksum_pages: if checksums { get_u64(b, 168) } else { 0 },
            presence_offset: if layers { get_u64(b, 176) } else { 0 },
            presence_sectors: if layers { get_u64(b, 184) } else { 0 },
            key_offset: if keys { get_u64(b, 192) } else { 0 },
            key_slots: if keys { get_u64(b, 200) } else { 0 },
            virtual_offset: if packed { get_u64(b, 208) } else { 0 },
            virtual_extents: if packed { get_u32(b, 216) } else { 0 },
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
            journal_epoch: if version >= 2 { get_u64(b, 152) } else { 0 },
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
        let overflow = |a: Option<u64>, limit: u64| a.is_none_or(|e| e > limit);
        if overflow(
            l.data_offset.checked_add(l.capacity_bytes()),
            self.device_size,
        ) || overflow(
            (l.volume_slots as u64 * super::VOLUME_SLOT_SIZE).checked_add(l.volume_table_offset),
            l.extent_table_offset,
        ) || overflow(
            (l.extent_table_pages() * PAGE).checked_add(l.extent_table_offset),
            l.journal_offset,
        ) || overflow(
            l.journal_blocks
                .checked_mul(PAGE)
                .and_then(|j| j.checked_add(l.journal_offset)),
            l.data_offset,
        ) || l.volume_table_offset < 2 * PAGE
        {
            return bad("regions overlap or exceed the device");
        }
        let checksums = self.incompat_features & INCOMPAT_DATA_CHECKSUMS != 0;
        if checksums != l.has_data_checksums() {
            return bad("checksum region and feature bit disagree");
        }
        if checksums
            && (l.checksum_offset < l.journal_offset + l.journal_blocks * PAGE
                || overflow(
                    l.checksum_pages
                        .checked_mul(PAGE)
                        .and_then(|c| c.checked_add(l.checksum_offset)),
                    l.data_offset,
                )
                || l.checksum_pages < l.checksum_pages_needed())
        {
            return bad("checksum region");
        }
        let layers = self.incompat_features & INCOMPAT_LAYERS != 0;
        if layers != l.has_layers() {
            return bad("presence region and feature bit disagree");
        }
        if layers
            && (l.presence_offset < l.checksum_offset + l.checksum_pages * PAGE
                || l.presence_offset < l.journal_offset + l.journal_blocks * PAGE
                || overflow(
                    l.presence_sectors
                        .checked_mul(super::PRESENCE_SECTOR as u64)
                        .and_then(|c| c.checked_add(l.presence_offset)),
                    l.data_offset,
                )
                || l.presence_sectors < l.presence_sectors_needed())
        {
            return bad("presence region");
        }
        let keys = self.incompat_features & INCOMPAT_KEY_SLOTS != 0;
        if keys != l.has_key_slots() {
            return bad("key slot region and feature bit disagree");
        }
        if keys
            && (l.key_offset < l.presence_offset + l.presence_len()
                || l.key_offset < l.checksum_offset + l.checksum_pages * PAGE
                || l.key_offset < l.journal_offset + l.journal_blocks * PAGE
                || l.key_slots > l.volume_slots as u64
                || overflow(
                    l.key_slots
                        .checked_mul(KEY_SLOT_SIZE as u64)
                        .and_then(|c| c.checked_add(l.key_offset)),
                    l.data_offset,
                ))
        {
            return bad("key slot region");
        }
        let packed = self.incompat_features & INCOMPAT_PACKED != 0;
        if packed != l.has_packed() {
            return bad("virtual extent table and feature bit disagree");
        }
        if packed
            && (l.virtual_offset < l.key_offset + l.key_len()
                || l.virtual_offset < l.presence_offset + l.presence_len()
                || l.virtual_offset < l.checksum_offset + l.checksum_pages * PAGE
                || l.virtual_offset < l.journal_offset + l.journal_blocks * PAGE
                || !self.incompat_features & (INCOMPAT_DATA_CHECKSUMS | INCOMPAT_LAYERS) != 0
                || l.extent_count.checked_add(l.virtual_extents).is_none()
                || overflow(
                    (l.virtual_table_pages() * PAGE).checked_add(l.virtual_offset),
                    l.data_offset,
                ))
        {
            return bad("virtual extent table");
        }
        if self
            .journal_tail_seq
            .checked_add(l.journal_blocks)
            .is_none()
        {
            return bad("journal tail");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::DEFAULT_EXTENT_SIZE;

    fn sample_sb() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            incompat_features: crate::format::DEFAULT_FEATURES,
            compat_features: 0,
            store_id: uuid::Uuid::from_u128(42),
            generation: 3,
            device_size: 1 << 30,
            layout: Layout::plan(
                1 << 30,
                DEFAULT_EXTENT_SIZE,
                None,
                crate::format::DEFAULT_FEATURES,
            )
            .unwrap(),
            journal_tail_seq: 9,
            journal_tail_position: 9,
            clean: true,
            created_unix: 1,
            journal_epoch: 5,
        }
    }

    #[test]
    fn superblock_roundtrip_and_rejections() {
        let sb = sample_sb();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        let mut v1 = sb.clone();
        v1.version = 1;
        v1.journal_epoch = 0;
        v1.incompat_features = 0;
        v1.layout = Layout::plan(1 << 30, DEFAULT_EXTENT_SIZE, None, 0).unwrap();
        assert_eq!(Superblock::decode(&v1.encode()).unwrap(), v1);
        let mut bad = b;
        bad[200] ^= 1;
        assert_eq!(Superblock::decode(&bad), Err(FormatError::BadChecksum));
        let mut v3 = sb.clone();
        v3.version = 3;
        assert_eq!(
            Superblock::decode(&v3.encode()),
            Err(FormatError::UnsupportedVersion { found: 3 })
        );
        // Without the feature bits, the checksum and presence fields are
        // not read.
        let mut plain = sb.clone();
        plain.incompat_features = 0;
        let read = Superblock::decode(&plain.encode()).unwrap();
        assert!(!read.layout.has_data_checksums());
        assert!(!read.layout.has_layers());
        assert!(!read.layout.has_key_slots());
        assert!(!read.layout.has_packed());
        let mut no_table = sb.clone();
        no_table.layout.virtual_extents = 0;
        assert!(
            matches!(Superblock::decode(&no_table.encode()), Err(FormatError::Inconsistent(m)) if m.contains("virtual")),
            "the packed-extents bit without a virtual extent table"
        );
        let mut overlapping = sb.clone();
        overlapping.layout.virtual_offset = overlapping.layout.key_offset;
        assert!(matches!(
            Superblock::decode(&overlapping.encode()),
            Err(FormatError::Inconsistent(_))
        ));
        let mut too_many_keys = sb.clone();
        too_many_keys.layout.key_slots = MAX_VOLUMES as u64 + 1;
        assert!(matches!(
            Superblock::decode(&too_many_keys.encode()),
            Err(FormatError::Inconsistent(_))
        ));
        let mut no_presence = sb.clone();
        no_presence.layout.presence_sectors = 1;
        assert!(matches!(
            Superblock::decode(&no_presence.encode()),
            Err(FormatError::Inconsistent(_))
        ));
        let mut short = sb.clone();
        short.layout.checksum_pages = 1;
        assert!(matches!(
            Superblock::decode(&short.encode()),
            Err(FormatError::Inconsistent(_))
        ));
        let mut feat = sb.clone();
        feat.incompat_features = 1 << 7;
        assert!(matches!(
            Superblock::decode(&feat.encode()),
            Err(FormatError::UnknownFeatures(_))
        ));
        assert_eq!(
            Superblock::decode(&[0u8; 4096]),
            Err(FormatError::NotAStore)
        );
    }
}
