//! The two tables, entry by entry: volume slots (128 B) and extent entries
//! (16 B, one per physical extent, naming its owner: a reverse map). Each
//! entry carries a CRC32C salted with its index, so an entry written to the
//! wrong place, flipped on disk or never written fails to verify; entries
//! never cross a 512 B sector, so a torn page leaves each one old or new.
//!
//! A version-1 entry has zeros where version 2 keeps the checksum; the
//! upgrade reads either form (`decode_any`).

use super::{get_u32, get_u64, get_uuid, put_u32, put_u64, EXTENT_ENTRY_SIZE, VOLUME_SLOT_SIZE};
use crate::VolumeId;

const SLOT_CRC_AT: usize = 124;
const EXTENT_CRC_AT: usize = 12;
/// Owner slot recorded for an extent whose entry failed to verify: kept
/// out of use (never free, never mapped) until the journal reassigns it.
pub const QUARANTINE_SLOT: u32 = u32::MAX;
/// Slot marker byte of a volume slot whose record failed to verify.
const SLOT_QUARANTINED: u8 = 2;
const EXTENT_DIRTY: u32 = 1;
/// An owned extent that may hold writes whose checksums are not durable.
const EXTENT_HOT: u32 = 2;

fn salted_crc(index: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), bytes)
}

/// One volume's persistent record (slot index + 1 is the volume's local
/// slot number; 0 means "no volume").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSlot {
    pub id: VolumeId,
    pub size: u64,
    pub created_unix: u64,
    /// Slot of the layer whose blocks this one reads where it has none of
    /// its own (layers feature); 0 = none.
    pub parent_slot: u32,
    /// Bit 0 (`SLOT_SNAPSHOT`): a snapshot, a read-only layer. Bit 1
    /// (`SLOT_RETIRED`): a snapshot being deleted (merged into its child).
    pub flags: u32,
    /// Reserved: always 0 in version 2.
    pub epoch: u64,
    /// When a scrub last read the whole volume (Unix seconds; 0 = never).
    pub last_scrub_unix: u64,
    /// Of a snapshot: the volume it was taken of (nil otherwise).
    pub origin: VolumeId,
}

/// `VolumeSlot::flags`: the slot is a snapshot (read-only layer).
pub const SLOT_SNAPSHOT: u32 = 1;
/// `VolumeSlot::flags`: the snapshot is being deleted; nobody may read it
/// (a merge half done changes what it reads), and the open finishes it.
pub const SLOT_RETIRED: u32 = 2;

impl VolumeSlot {
    pub fn is_snapshot(&self) -> bool {
        self.flags & SLOT_SNAPSHOT != 0
    }
    pub fn is_retired(&self) -> bool {
        self.flags & SLOT_RETIRED != 0
    }
}

/// What a volume-table slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Free,
    Live(VolumeSlot),
    /// The record failed to verify: the slot is never reused and the
    /// extents naming it are kept, unmapped, for an operator to examine.
    Quarantined,
}

impl SlotState {
    pub fn live(&self) -> Option<&VolumeSlot> {
        match self {
            SlotState::Live(v) => Some(v),
            _ => None,
        }
    }

    /// Encodes the slot at table index `index` (slot number - 1).
    pub fn encode(&self, index: u32) -> [u8; VOLUME_SLOT_SIZE as usize] {
        let mut b = [0u8; VOLUME_SLOT_SIZE as usize];
        match self {
            SlotState::Free => {}
            SlotState::Quarantined => b[0] = SLOT_QUARANTINED,
            SlotState::Live(s) => {
                b[0] = 1;
                b[8..24].copy_from_slice(s.id.as_bytes());
                put_u64(&mut b, 24, s.size);
                put_u64(&mut b, 32, s.created_unix);
                put_u32(&mut b, 40, s.parent_slot);
                put_u32(&mut b, 44, s.flags);
                put_u64(&mut b, 48, s.epoch);
                put_u64(&mut b, 56, s.last_scrub_unix);
                b[64..80].copy_from_slice(s.origin.as_bytes());
            }
        }
        let crc = salted_crc(index, &b[..SLOT_CRC_AT]);
        put_u32(&mut b, SLOT_CRC_AT, crc);
        b
    }

    /// Decodes a version-2 slot; `None` if it fails to verify.
    pub fn decode(index: u32, b: &[u8]) -> Option<SlotState> {
        let b = b.get(..VOLUME_SLOT_SIZE as usize)?;
        if get_u32(b, SLOT_CRC_AT) != salted_crc(index, &b[..SLOT_CRC_AT]) {
            return None;
        }
        Self::fields(b)
    }

    /// Decodes a slot written by version 1 or 2 (an upgrade interrupted
    /// half way leaves both forms); `None` if it is neither.
    pub fn decode_any(index: u32, b: &[u8]) -> Option<SlotState> {
        let b = b.get(..VOLUME_SLOT_SIZE as usize)?;
        if let Some(s) = Self::decode(index, b) {
            return Some(s);
        }
        // Version 1 left every byte past the epoch zero.
        if b[56..].iter().any(|&x| x != 0) || b[0] > 1 {
            return None;
        }
        Self::fields(b)
    }

    fn fields(b: &[u8]) -> Option<SlotState> {
        match b[0] {
            0 => Some(SlotState::Free),
            1 => Some(SlotState::Live(VolumeSlot {
                id: get_uuid(b, 8),
                size: get_u64(b, 24),
                created_unix: get_u64(b, 32),
                parent_slot: get_u32(b, 40),
                flags: get_u32(b, 44),
                epoch: get_u64(b, 48),
                last_scrub_unix: get_u64(b, 56),
                origin: get_uuid(b, 64),
            })),
            SLOT_QUARANTINED => Some(SlotState::Quarantined),
            _ => None,
        }
    }
}

/// What one physical extent is, in the extent table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentState {
    /// Free. `dirty`: it may hold data (freed and not yet zeroed, or handed
    /// to the allocator), so it is zeroed before anyone reads it; a clean
    /// free extent is durably zero.
    Free { dirty: bool },
    /// Holds logical extent `logical` of the volume in `slot`
    /// (`QUARANTINE_SLOT`: its entry failed to verify). `hot`: it may hold
    /// writes whose data checksums are not durable (a write intent), so its
    /// checksums are recomputed from its data after a crash.
    Owned { slot: u32, logical: u32, hot: bool },
}

impl ExtentState {
    pub const CLEAN: ExtentState = ExtentState::Free { dirty: false };
    pub const DIRTY: ExtentState = ExtentState::Free { dirty: true };
    pub const QUARANTINED: ExtentState = ExtentState::Owned {
        slot: QUARANTINE_SLOT,
        logical: 0,
        hot: false,
    };

    /// Encodes the entry of physical extent `phys`.
    pub fn encode(&self, phys: u32) -> [u8; EXTENT_ENTRY_SIZE as usize] {
        let mut b = [0u8; EXTENT_ENTRY_SIZE as usize];
        match *self {
            ExtentState::Free { dirty } => put_u32(&mut b, 4, if dirty { EXTENT_DIRTY } else { 0 }),
            ExtentState::Owned { slot, logical, hot } => {
                put_u32(&mut b, 0, slot);
                put_u32(&mut b, 4, if hot { EXTENT_HOT } else { 0 });
                put_u32(&mut b, 8, logical);
            }
        }
        let crc = salted_crc(phys, &b[..EXTENT_CRC_AT]);
        put_u32(&mut b, EXTENT_CRC_AT, crc);
        b
    }

    /// Decodes a version-2 entry; `None` if it fails to verify.
    pub fn decode(phys: u32, b: &[u8]) -> Option<ExtentState> {
        let b = b.get(..EXTENT_ENTRY_SIZE as usize)?;
        if get_u32(b, EXTENT_CRC_AT) != salted_crc(phys, &b[..EXTENT_CRC_AT]) {
            return None;
        }
        let (slot, flags) = (get_u32(b, 0), get_u32(b, 4));
        Some(match (slot, flags) {
            (0, 0) => ExtentState::CLEAN,
            (0, EXTENT_DIRTY) => ExtentState::DIRTY,
            (0, _) => return None,
            (slot, 0 | EXTENT_HOT) => ExtentState::Owned {
                slot,
                logical: get_u32(b, 8),
                hot: flags == EXTENT_HOT,
            },
            _ => return None,
        })
    }

    /// Decodes an entry written by version 1 (owner u32, flags u32 = 0,
    /// logical u64) or version 2. Version 1 kept no dirty state: its free
    /// extents are taken as clean, and the upgrade marks them all dirty when
    /// the store was not closed cleanly.
    pub fn decode_any(phys: u32, b: &[u8]) -> Option<ExtentState> {
        let b = b.get(..EXTENT_ENTRY_SIZE as usize)?;
        if let Some(e) = Self::decode(phys, b) {
            return Some(e);
        }
        if get_u32(b, 4) != 0 || get_u32(b, EXTENT_CRC_AT) != 0 {
            return None;
        }
        let slot = get_u32(b, 0);
        Some(if slot == 0 {
            ExtentState::CLEAN
        } else {
            ExtentState::Owned {
                slot,
                logical: u32::try_from(get_u64(b, 8)).ok()?,
                hot: false,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_roundtrip_and_verify_their_place() {
        for e in [
            ExtentState::CLEAN,
            ExtentState::DIRTY,
            ExtentState::Owned {
                slot: 3,
                logical: 9,
                hot: false,
            },
            ExtentState::Owned {
                slot: 3,
                logical: 9,
                hot: true,
            },
            ExtentState::QUARANTINED,
        ] {
            let b = e.encode(17);
            assert_eq!(ExtentState::decode(17, &b), Some(e));
            assert_eq!(ExtentState::decode_any(17, &b), Some(e));
            assert_eq!(ExtentState::decode(18, &b), None, "misplaced entry");
            let mut flipped = b;
            flipped[0] ^= 4;
            assert_eq!(ExtentState::decode(17, &flipped), None);
        }
        // A zeroed (never written, or lost) entry is not a valid v2 entry.
        assert_eq!(ExtentState::decode(0, &[0u8; 16]), None);
        let mut v1 = [0u8; 16];
        v1[0..4].copy_from_slice(&5u32.to_le_bytes());
        v1[8..16].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(
            ExtentState::decode_any(0, &v1),
            Some(ExtentState::Owned {
                slot: 5,
                logical: 7,
                hot: false,
            })
        );
        let s = SlotState::Live(VolumeSlot {
            id: uuid::Uuid::from_u128(1),
            size: 4096,
            created_unix: 2,
            parent_slot: 0,
            flags: 0,
            epoch: 0,
            last_scrub_unix: 0,
            origin: uuid::Uuid::nil(),
        });
        let snap = SlotState::Live(VolumeSlot {
            id: uuid::Uuid::from_u128(2),
            size: 8192,
            created_unix: 3,
            parent_slot: 7,
            flags: SLOT_SNAPSHOT,
            epoch: 0,
            last_scrub_unix: 9,
            origin: uuid::Uuid::from_u128(1),
        });
        assert!(snap.live().unwrap().is_snapshot());
        for st in [snap, s, SlotState::Free, SlotState::Quarantined] {
            let b = st.encode(4);
            assert_eq!(SlotState::decode(4, &b), Some(st));
        }
        for st in [s, SlotState::Free, SlotState::Quarantined] {
            let b = st.encode(4);
            assert_eq!(SlotState::decode(4, &b), Some(st));
            assert_eq!(SlotState::decode(5, &b), None);
        }
        let mut v1slot = [0u8; 128];
        v1slot[..56].copy_from_slice(&s.encode(0)[..56]);
        assert_eq!(SlotState::decode_any(9, &v1slot), Some(s));
        assert_eq!(SlotState::decode_any(9, &[0u8; 128]), Some(SlotState::Free));
    }
}
