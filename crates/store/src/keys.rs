//! Key slots at run time: each volume's wrapped data key (encryption at
//! rest keeps its keys here, wrapped by a master key the store never sees),
//! kept in memory as the region's bytes with an index by volume, and
//! written through one page at a time, durably before the call returns.
//!
//! Entries are found by the volume's UUID, not by its volume slot: a
//! snapshot moves its volume to a new slot and a snapshot deletion merges
//! layers, and neither touches the keys.
//!
//! It also holds, for each volume with a key, the cipher the encryption
//! layer handed it ([`Store::unlock_volume`]); until then the volume is
//! locked: it cannot be opened and no I/O reaches its blocks.
//!
//! Invariants:
//! - an entry is written only for a volume or snapshot that exists or is
//!   being created (an encrypted volume's or a clone's entry is durable
//!   before the layer is, so no layer of an encrypted lineage is ever
//!   without its key), under the store's layer-operation lock (so no
//!   delete, snapshot or clone runs beside it), and at most one entry
//!   names a volume;
//! - `set_volume_key` returns once the entry is durable (written and the
//!   device flushed); a crash during it leaves the entry old or new (an
//!   entry never crosses a 512 B sector; see `format/keys.rs`);
//! - deleting a volume empties its entry once the delete is durable (the
//!   wrapped key is gone from the device, not only forgotten); an entry
//!   naming no volume of the store at open (a crash between the two) is
//!   emptied then;
//! - a snapshot without an entry of its own reads with its volume's key (a
//!   snapshot's blocks were written with it); a clone's entry holds its
//!   parent's key, so every layer a read resolves to shares one key;
//! - a volume has a cipher entry exactly while it has a key entry.

use crate::buf::AlignedBuf;
use crate::device::BlockDevice;
use crate::engine::Store;
use crate::error::StoreError;
use crate::format::{
    decode_key_slot, encode_key_slot, KeySlot, Layout, WrappedKey, KEY_SLOT_SIZE, MAX_WRAPPED_KEY,
    PAGE,
};
use crate::VolumeId;
use basalt_crypt::BlockCipher;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;

/// The key slot region as the store holds it.
pub(crate) struct KeySlots {
    inner: Mutex<Region>,
    /// Every volume with a key: its cipher, `None` while locked.
    ciphers: RwLock<HashMap<VolumeId, Option<Arc<BlockCipher>>>>,
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
        let ciphers = index.keys().map(|&v| (v, None)).collect();
        Ok(LoadedKeys {
            slots: KeySlots {
                inner: Mutex::new(Region { bytes, index }),
                ciphers: RwLock::new(ciphers),
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
        let mut ciphers = self.ciphers.write();
        match key {
            Some(_) => {
                r.index.insert(volume, i);
                ciphers.entry(volume).or_insert(None);
            }
            None => {
                r.index.remove(&volume);
                ciphers.remove(&volume);
            }
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
        check_wrapped(key)?;
        let _op = self.layer_ops.lock();
        let vol = self.volume_state(id)?;
        if vol.is_deleted() || vol.is_retired() {
            return Err(StoreError::NotFound(id));
        }
        keys.put(self.device.as_ref(), &self.layout, id, Some(key))
            .map_err(|e| self.fail(e))
    }

    /// Creates volume `id` encrypted: its wrapped `key` is durable before
    /// the volume is, and it is unlocked with `cipher` (the key's, which
    /// the store cannot check). A crash in between leaves an entry naming
    /// no volume, emptied at the next open.
    pub fn create_encrypted_volume(
        &self,
        id: VolumeId,
        size: u64,
        key: &WrappedKey,
        cipher: Arc<BlockCipher>,
    ) -> Result<(), StoreError> {
        self.check_usable()?;
        self.check_size(size)?;
        let keys = self.key_slots()?;
        check_wrapped(key)?;
        let _op = self.layer_ops.lock();
        if self.meta.lock().volumes.contains_key(&id) {
            return Err(StoreError::Exists(id));
        }
        keys.put(self.device.as_ref(), &self.layout, id, Some(key))
            .map_err(|e| self.fail(e))?;
        let added = self.add_layer(&mut self.meta.lock(), id, size, None);
        let created = added.and_then(|()| self.commit());
        if let Err(e) = created {
            if self.meta.lock().volumes.contains_key(&id) {
                return Err(e);
            }
            keys.put(self.device.as_ref(), &self.layout, id, None)
                .map_err(|e| self.fail(e))?;
            return Err(e);
        }
        keys.ciphers.write().insert(id, Some(cipher));
        Ok(())
    }

    /// Gives volume `id`, which has a key of its own, the cipher of that
    /// key: it can be opened from now on, as can its snapshots.
    pub fn unlock_volume(&self, id: VolumeId, cipher: Arc<BlockCipher>) -> Result<(), StoreError> {
        let keys = self.key_slots()?;
        let mut ciphers = keys.ciphers.write();
        match ciphers.get_mut(&id) {
            Some(slot) => {
                *slot = Some(cipher);
                Ok(())
            }
            None => Err(StoreError::Format(format!(
                "volume {id} has no key to unlock"
            ))),
        }
    }

    /// The volumes (not snapshots) with a key, and whether each is locked.
    pub fn keyed_volumes(&self) -> Vec<(VolumeId, bool)> {
        let Some(keys) = self.keys.as_ref() else {
            return Vec::new();
        };
        let mut v: Vec<_> = keys
            .ciphers
            .read()
            .iter()
            .map(|(&id, c)| (id, c.is_none()))
            .collect();
        v.sort();
        v
    }

    /// Whether volume or snapshot `id` is encrypted (its data is).
    pub fn is_encrypted(&self, id: VolumeId) -> bool {
        match self.volume_state(id) {
            Ok(vol) => !matches!(self.cipher_of(&vol), Ok(None)),
            Err(_) => false,
        }
    }

    /// The cipher of `vol`'s blocks: its own key's, or a snapshot's
    /// volume's. `Ok(None)`: not encrypted; `Err(Locked)`: encrypted and
    /// its key is not loaded.
    pub(crate) fn cipher_of(
        &self,
        vol: &crate::layer_map::VolumeState,
    ) -> Result<Option<Arc<BlockCipher>>, StoreError> {
        let Some(keys) = self.keys.as_ref() else {
            return Ok(None);
        };
        let ciphers = keys.ciphers.read();
        for id in std::iter::once(vol.id).chain(vol.snapshot_of) {
            match ciphers.get(&id) {
                Some(Some(c)) => return Ok(Some(c.clone())),
                Some(None) => return Err(StoreError::Locked(id)),
                None => {}
            }
        }
        Ok(None)
    }

    /// Before a clone of `snap` named `clone` is added: gives it an entry
    /// holding the snapshot's key, durably (nothing for a plain snapshot).
    /// Returns the cipher to unlock the clone with once it exists.
    pub(crate) fn inherit_key(
        &self,
        snap: &crate::layer_map::VolumeState,
        clone: VolumeId,
    ) -> Result<Option<Option<Arc<BlockCipher>>>, StoreError> {
        let Some(keys) = self.keys.as_ref() else {
            return Ok(None);
        };
        let Some(key) = self.volume_key(snap.id)? else {
            return Ok(None);
        };
        let cipher = self.cipher_of(snap).ok().flatten();
        keys.put(self.device.as_ref(), &self.layout, clone, Some(&key))
            .map_err(|e| self.fail(e))?;
        Ok(Some(cipher))
    }

    /// After a clone with an inherited key exists: its cipher, if the
    /// parent's was loaded.
    pub(crate) fn set_inherited_cipher(&self, clone: VolumeId, cipher: Option<Arc<BlockCipher>>) {
        if let (Some(keys), Some(c)) = (self.keys.as_ref(), cipher) {
            keys.ciphers.write().insert(clone, Some(c));
        }
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

fn check_wrapped(key: &WrappedKey) -> Result<(), StoreError> {
    if key.suite == 0 || key.blob.len() > MAX_WRAPPED_KEY {
        return Err(StoreError::Format(format!(
            "a wrapped key needs a suite other than 0 and at most {MAX_WRAPPED_KEY} bytes (got suite {}, {} bytes)",
            key.suite,
            key.blob.len()
        )));
    }
    Ok(())
}
