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
//! - every layer reads and writes its blocks with its own key: its entry's
//!   (a key, or plain), else for a snapshot its volume's (a snapshot's
//!   blocks were written with it). A clone's entry holds its parent's key.
//!   Layers of one stack share a key unless the volume was re-encrypted
//!   ([`Store::rekey_volume`]): its snapshots then keep theirs in entries
//!   of their own, pinned before the volume's entry changes, and reads
//!   resolve each block's key by the layer it comes from;
//! - a layer has a `LayerKey` exactly while it has an entry.

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
    /// Every layer with an entry: its cipher, or that it is plain.
    pub(crate) ciphers: RwLock<HashMap<VolumeId, LayerKey>>,
    /// Some snapshot has an entry of its own (a re-encryption pinned it):
    /// stacks may mix keys, and reads resolve a key per layer. Never
    /// cleared while the store is open.
    pinned: std::sync::atomic::AtomicBool,
}

/// What a layer's entry makes of its blocks at run time.
#[derive(Clone)]
pub(crate) enum LayerKey {
    /// Encrypted; its key not unwrapped yet.
    Locked,
    Unlocked(Arc<BlockCipher>),
    /// Not encrypted (a pinned snapshot of a re-encrypted volume).
    Plain,
}

/// What [`KeySlots::put`] writes for a layer.
#[derive(Clone, Copy)]
pub(crate) enum Entry<'a> {
    Key(&'a WrappedKey),
    Plain,
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
        let mut ciphers = HashMap::new();
        let mut bad_entries = 0;
        for i in 0..layout.key_slots as u32 {
            let at = i as usize * KEY_SLOT_SIZE;
            match decode_key_slot(i, &bytes[at..at + KEY_SLOT_SIZE]) {
                Some(KeySlot::Key { volume, .. }) => {
                    index.insert(volume, i);
                    ciphers.insert(volume, LayerKey::Locked);
                }
                Some(KeySlot::Plain { volume }) => {
                    index.insert(volume, i);
                    ciphers.insert(volume, LayerKey::Plain);
                }
                Some(KeySlot::Empty) => {}
                None => bad_entries += 1,
            }
        }
        Ok(LoadedKeys {
            slots: KeySlots {
                inner: Mutex::new(Region { bytes, index }),
                ciphers: RwLock::new(ciphers),
                pinned: std::sync::atomic::AtomicBool::new(false),
            },
            bad_entries,
        })
    }

    /// Writes every entry empty (at format), without flushing.
    pub(crate) fn format(device: &dyn BlockDevice, layout: &Layout) -> Result<(), StoreError> {
        let mut bytes = AlignedBuf::zeroed(layout.key_len() as usize);
        for i in 0..layout.key_slots as u32 {
            let at = i as usize * KEY_SLOT_SIZE;
            encode_key_slot(i, &KeySlot::Empty, &mut bytes[at..at + KEY_SLOT_SIZE]);
        }
        device.write_at(&bytes, layout.key_offset, false)?;
        Ok(())
    }

    pub(crate) fn note_pinned(&self) {
        self.pinned
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn has_pinned(&self) -> bool {
        self.pinned.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The volumes that have an entry.
    pub(crate) fn volumes(&self) -> Vec<VolumeId> {
        self.inner.lock().index.keys().copied().collect()
    }

    /// `volume`'s own entry, if it has one that verifies.
    pub(crate) fn get(&self, volume: VolumeId) -> Option<KeySlot> {
        let r = self.inner.lock();
        let i = *r.index.get(&volume)?;
        let at = i as usize * KEY_SLOT_SIZE;
        decode_key_slot(i, &r.bytes[at..at + KEY_SLOT_SIZE]).filter(|e| e.volume() == Some(volume))
    }

    /// Sets (`Some`) or empties (`None`) `volume`'s entry and writes its
    /// page durably. Setting takes the volume's entry, else the first that
    /// is not in use (a bad one included).
    pub(crate) fn put(
        &self,
        device: &dyn BlockDevice,
        layout: &Layout,
        volume: VolumeId,
        key: Option<Entry<'_>>,
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
        let entry = match key {
            None => KeySlot::Empty,
            Some(Entry::Plain) => KeySlot::Plain { volume },
            Some(Entry::Key(key)) => KeySlot::Key {
                volume,
                key: key.clone(),
            },
        };
        encode_key_slot(i, &entry, &mut r.bytes[at..at + KEY_SLOT_SIZE]);
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
            Some(Entry::Key(_)) => {
                r.index.insert(volume, i);
                let c = ciphers.entry(volume).or_insert(LayerKey::Locked);
                if matches!(c, LayerKey::Plain) {
                    *c = LayerKey::Locked;
                }
            }
            Some(Entry::Plain) => {
                r.index.insert(volume, i);
                ciphers.insert(volume, LayerKey::Plain);
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
    pub(crate) fn key_slots(&self) -> Result<&KeySlots, StoreError> {
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
        keys.put(
            self.device.as_ref(),
            &self.layout,
            id,
            Some(Entry::Key(key)),
        )
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
        keys.put(
            self.device.as_ref(),
            &self.layout,
            id,
            Some(Entry::Key(key)),
        )
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
        keys.ciphers.write().insert(id, LayerKey::Unlocked(cipher));
        Ok(())
    }

    /// Gives volume `id`, which has a key of its own, the cipher of that
    /// key: it can be opened from now on, as can its snapshots.
    pub fn unlock_volume(&self, id: VolumeId, cipher: Arc<BlockCipher>) -> Result<(), StoreError> {
        let keys = self.key_slots()?;
        let mut ciphers = keys.ciphers.write();
        match ciphers.get_mut(&id) {
            Some(slot @ (LayerKey::Locked | LayerKey::Unlocked(_))) => {
                *slot = LayerKey::Unlocked(cipher);
                Ok(())
            }
            _ => Err(StoreError::Format(format!(
                "volume {id} has no key to unlock"
            ))),
        }
    }

    /// The layers with a key of their own (volumes, and snapshots pinned
    /// by a re-encryption), and whether each is locked.
    pub fn keyed_volumes(&self) -> Vec<(VolumeId, bool)> {
        let Some(keys) = self.keys.as_ref() else {
            return Vec::new();
        };
        let mut v: Vec<_> = keys
            .ciphers
            .read()
            .iter()
            .filter_map(|(&id, c)| match c {
                LayerKey::Locked => Some((id, true)),
                LayerKey::Unlocked(_) => Some((id, false)),
                LayerKey::Plain => None,
            })
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
                Some(LayerKey::Unlocked(c)) => return Ok(Some(c.clone())),
                Some(LayerKey::Locked) => return Err(StoreError::Locked(id)),
                Some(LayerKey::Plain) => return Ok(None),
                None => {}
            }
        }
        Ok(None)
    }

    /// Whether the layers of a stack may have different keys: some volume
    /// of the store was re-encrypted. Checked before anything per batch is
    /// built for it, so the data path of other stores pays nothing.
    pub(crate) fn stacks_may_mix_keys(&self) -> bool {
        self.keys.as_ref().is_some_and(KeySlots::has_pinned)
    }

    /// The cipher of each layer of a stack (`layer_map::stack_states`
    /// order) when they differ; empty when every layer reads with the
    /// head's (`head`: its [`Store::cipher_of`]), as in any store no volume
    /// of which was re-encrypted.
    pub(crate) fn stack_ciphers(
        &self,
        layers: &[Arc<crate::layer_map::VolumeState>],
        head: &Option<Arc<BlockCipher>>,
    ) -> Result<Vec<Option<Arc<BlockCipher>>>, StoreError> {
        if !self.stacks_may_mix_keys() || layers.len() < 2 {
            return Ok(Vec::new());
        }
        let ciphers = layers
            .iter()
            .map(|l| self.cipher_of(l))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(if ciphers.iter().all(|c| same_key(c, head)) {
            Vec::new()
        } else {
            ciphers
        })
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
        keys.put(
            self.device.as_ref(),
            &self.layout,
            clone,
            Some(Entry::Key(&key)),
        )
        .map_err(|e| self.fail(e))?;
        Ok(Some(cipher))
    }

    /// After a clone with an inherited key exists: its cipher, if the
    /// parent's was loaded.
    pub(crate) fn set_inherited_cipher(&self, clone: VolumeId, cipher: Option<Arc<BlockCipher>>) {
        if let (Some(keys), Some(c)) = (self.keys.as_ref(), cipher) {
            keys.ciphers.write().insert(clone, LayerKey::Unlocked(c));
        }
    }

    /// Volume `id`'s wrapped data key: its own, or for a snapshot without
    /// an entry its volume's. None: the layer is not encrypted (or the
    /// store has no key slots).
    pub fn volume_key(&self, id: VolumeId) -> Result<Option<WrappedKey>, StoreError> {
        let vol = self.volume_state(id)?;
        let Some(keys) = self.keys.as_ref() else {
            return Ok(None);
        };
        let entry = keys
            .get(id)
            .or_else(|| vol.snapshot_of.and_then(|origin| keys.get(origin)));
        Ok(match entry {
            Some(KeySlot::Key { key, .. }) => Some(key),
            _ => None,
        })
    }

    /// Whether layer `id` has an entry of its own (a volume's key, a
    /// clone's, or a snapshot pinned by a re-encryption), rather than
    /// reading with its volume's.
    pub fn has_own_key_entry(&self, id: VolumeId) -> bool {
        self.keys.as_ref().is_some_and(|k| k.get(id).is_some())
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
        let live: HashMap<VolumeId, bool> = self
            .meta
            .lock()
            .volumes
            .values()
            .map(|v| (v.id, v.is_snapshot()))
            .collect();
        let mut shredded = 0;
        for id in keys.volumes() {
            match live.get(&id) {
                None => {
                    self.shred_key(id)?;
                    shredded += 1;
                }
                Some(true) => keys.note_pinned(),
                Some(false) => {}
            }
        }
        Ok(shredded)
    }
}

/// Whether two layers' ciphers are one (by identity: the same key unwrapped
/// twice compares unequal, which costs a needless re-encryption, never a
/// wrong one).
pub(crate) fn same_key(a: &Option<Arc<BlockCipher>>, b: &Option<Arc<BlockCipher>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

pub(crate) fn check_wrapped(key: &WrappedKey) -> Result<(), StoreError> {
    if key.suite == 0 || key.blob.len() > MAX_WRAPPED_KEY {
        return Err(StoreError::Format(format!(
            "a wrapped key needs a suite other than 0 and at most {MAX_WRAPPED_KEY} bytes (got suite {}, {} bytes)",
            key.suite,
            key.blob.len()
        )));
    }
    Ok(())
}
