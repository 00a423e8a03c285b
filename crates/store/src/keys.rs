//! Key slots at run time: each volume's wrapped data key (encryption at
//! rest keeps its keys here, wrapped by a master key the store never sees),
//! kept in memory as the region's bytes with an index by volume, and
//! written through one page at a time, durably before the call returns.
//!
//! Entries are found by the volume's UUID, not by its volume slot: a
//! snapshot moves its volume to a new slot and a snapshot deletion merges
//! layers, and neither touches the keys.
//!
//! Invariants:
//! - an entry is written only for a volume or snapshot that exists, under
//!   the store's layer-operation lock (so no delete, snapshot or clone runs
//!   beside it), and at most one entry names a volume;
//! - `set_volume_key` returns once the entry is durable (written and the
//!   device flushed); a crash during it leaves the entry old or new (an
//!   entry never crosses a 512 B sector; see `format/keys.rs`);
//! - deleting a volume empties its entry once the delete is durable (the
//!   wrapped key is gone from the device, not only forgotten); an entry
//!   naming no volume of the store at open (a crash between the two) is
//!   emptied then;
//! - a snapshot without an entry of its own reads with its volume's key (a
//!   snapshot's blocks were written with it).

use crate::buf::AlignedBuf;
use crate::device::BlockDevice;
use crate::engine::Store;
use crate::error::StoreError;
use crate::format::{
    decode_key_slot, encode_key_slot, KeySlot, Layout, WrappedKey, KEY_SLOT_SIZE, MAX_WRAPPED_KEY,
    PAGE,
};
use crate::VolumeId;
use parking_lot::Mutex;
use std::collections::HashMap;

/// The key slot region as the store holds it.
pub(crate) struct KeySlots {
    inner: Mutex<Region>,
}

struct Region {
    bytes: AlignedBuf,
    /// Which entry holds each volume's key.
    index: HashMap<VolumeId, u32>,
}

/// What reading the region at open found.
pub(crate) struct LoadedKeys {
    pub slots: KeySlots,
    /// Entries that failed to verify (ignored, and reused as empty).
    pub bad_entries: u64,
}

impl KeySlots {
    /// Reads the region of `layout`.
    pub(crate) fn load(
        device: &dyn BlockDevice,
        layout: &Layout,
    ) -> Result<LoadedKeys, StoreError> {
        let mut bytes = AlignedBuf::zeroed(layout.key_len() as usize);
        device.read_at(&mut bytes, layout.key_offset)?;
        let mut index = HashMap::new();
        let mut bad_entries = 0;
        for i in 0..layout.key_slots as u32 {
            let at = i as usize * KEY_SLOT_SIZE;
            match decode_key_slot(i, &bytes[at..at + KEY_SLOT_SIZE]) {
                Some(KeySlot::Key { volume, .. }) => {
                    index.insert(volume, i);
                }
                Some(KeySlot::Empty) => {}
                None => bad_entries += 1,
            }
        }
        Ok(LoadedKeys {
            slots: KeySlots {
                inner: Mutex::new(Region { bytes, index }),
            },
            bad_entries,
        })
    }

    /// Writes every entry empty (at format), without flushing.
    pub(crate) fn format(device: &dyn BlockDevice, layout: &Layout) -> Result<(), StoreError> {
        let mut bytes = AlignedBuf::zeroed(layout.key_len() as usize);
        for i in 0..layout.key_slots as u32 {
            let at = i as usize * KEY_SLOT_SIZE;
            encode_key_slot(i, None, &mut bytes[at..at + KEY_SLOT_SIZE]);
        }
        device.write_at(&bytes, layout.key_offset, false)?;
        Ok(())
    }

    /// The volumes that have an entry.
    pub(crate) fn volumes(&self) -> Vec<VolumeId> {
        self.inner.lock().index.keys().copied().collect()
    }

    fn get(&self, volume: VolumeId) -> Option<WrappedKey> {
        let r = self.inner.lock();
        let i = *r.index.get(&volume)?;
        let at = i as usize * KEY_SLOT_SIZE;
        match decode_key_slot(i, &r.bytes[at..at + KEY_SLOT_SIZE])? {
            KeySlot::Key { volume: v, key } if v == volume => Some(key),
            _ => None,
        }
    }

    /// Sets (`Some`) or empties (`None`) `volume`'s entry and writes its
    /// page durably. Setting takes the volume's entry, else the first that
    /// is not in use (a bad one included).
    fn put(
        &self,
        device: &dyn BlockDevice,
        layout: &Layout,
        volume: VolumeId,
        key: Option<&WrappedKey>,
    ) -> Result<(), StoreError> {
        let mut r = self.inner.lock();
        let i = match (r.index.get(&volume).copied(), key) {
            (Some(i), _) => i,
            (None, None) => return Ok(()),
            (None, Some(_)) => {
                let used: std::collections::HashSet<u32> = r.index.values().copied().collect();
                (0..layout.key_slots as u32)
                    .find(|i| !used.contains(i))
                    .ok_or_else(|| {
                        StoreError::Format(format!(
                            "all {} key slots of the store are in use",
                            layout.key_slots
                        ))
                    })?
            }
        };
        let at = i as usize * KEY_SLOT_SIZE;
        encode_key_slot(
            i,
            key.map(|k| (volume, k)),
            &mut r.bytes[at..at + KEY_SLOT_SIZE],
        );
        let page = at as u64 / PAGE;
        let start = (page * PAGE) as usize;
        let end = (start + PAGE as usize).min(r.bytes.len());
        let mut buf = AlignedBuf::zeroed(PAGE as usize);
        buf[..end - start].copy_from_slice(&r.bytes[start..end]);
        // The index changes only once the entry is durable: a failed write
        // leaves the store failed anyway.
        device.write_at(&buf, layout.key_offset + page * PAGE, false)?;
        device.flush()?;
        match key {
            Some(_) => r.index.insert(volume, i),
            None => r.index.remove(&volume),
        };
        Ok(())
    }
}

impl Store {
    fn key_slots(&self) -> Result<&KeySlots, StoreError> {
        self.keys.as_ref().ok_or_else(|| {
            StoreError::Format(
                "this store was formatted without key slots (encryption at rest); format a new store to keep volume keys"
                    .into(),
            )
        })
    }

    /// Keeps `key` as volume (or snapshot) `id`'s wrapped data key,
    /// replacing the one it had (as a master key rotation does), durably
    /// before returning.
    pub fn set_volume_key(&self, id: VolumeId, key: &WrappedKey) -> Result<(), StoreError> {
        self.check_usable()?;
        let keys = self.key_slots()?;
        if key.suite == 0 || key.blob.len() > MAX_WRAPPED_KEY {
            return Err(StoreError::Format(format!(
                "a wrapped key needs a suite other than 0 and at most {MAX_WRAPPED_KEY} bytes (got suite {}, {} bytes)",
                key.suite,
                key.blob.len()
            )));
        }
        let _op = self.layer_ops.lock();
        let vol = self.volume_state(id)?;
        if vol.is_deleted() || vol.is_retired() {
            return Err(StoreError::NotFound(id));
        }
        keys.put(self.device.as_ref(), &self.layout, id, Some(key))
            .map_err(|e| self.fail(e))
    }

    /// Volume `id`'s wrapped data key: its own, or for a snapshot without
    /// one its volume's. None: the volume has no key (it is not encrypted),
    /// or the store has no key slots.
    pub fn volume_key(&self, id: VolumeId) -> Result<Option<WrappedKey>, StoreError> {
        let vol = self.volume_state(id)?;
        let Some(keys) = self.keys.as_ref() else {
            return Ok(None);
        };
        Ok(keys
            .get(id)
            .or_else(|| vol.snapshot_of.and_then(|origin| keys.get(origin))))
    }

    /// Empties volume `id`'s entry, if it has one (after its deletion is
    /// durable).
    pub(crate) fn shred_key(&self, id: VolumeId) -> Result<(), StoreError> {
        let Some(keys) = self.keys.as_ref() else {
            return Ok(());
        };
        keys.put(self.device.as_ref(), &self.layout, id, None)
            .map_err(|e| self.fail(e))
    }

    /// At open: empties the entries of volumes the store no longer holds
    /// (a crash between a volume's deletion and its key's).
    pub(crate) fn shred_orphan_keys(&self) -> Result<u64, StoreError> {
        let Some(keys) = self.keys.as_ref() else {
            return Ok(0);
        };
        let live: std::collections::HashSet<VolumeId> =
            self.meta.lock().volumes.keys().copied().collect();
        let mut shredded = 0;
        for id in keys.volumes() {
            if !live.contains(&id) {
                self.shred_key(id)?;
                shredded += 1;
            }
        }
        Ok(shredded)
    }
}
