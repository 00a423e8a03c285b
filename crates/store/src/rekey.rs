//! Re-encryption of a volume, online: its data key changes — to a new key,
//! or from none to one and back (a retype between plain and encrypted
//! volume types) — while its I/O goes on. The volume's layer becomes a
//! snapshot that keeps the key its blocks were written with, the volume
//! goes on in a new, empty layer under the new key, and `Store::flatten`
//! then copies into that layer every block it still reads through older
//! ones, decrypted with their key and encrypted with its own
//! ([`reseal`]). Once the volume is detached, the caller deletes the
//! snapshot: nothing the volume reads is under the old key any more. The
//! volume's older snapshots keep their key (their data is not rewritten).
//!
//! Invariants:
//! - Every snapshot of the volume has an entry of its own (the key its
//!   blocks were written with, or plain) durably before the volume's entry
//!   changes, so no layer ever reads with a key its blocks were not
//!   written with.
//! - The switch is one step for the data path: the volume's map is held
//!   exclusively from the snapshot until the new entry is durable and its
//!   cipher set, so no write reaches the new layer under the old key. A
//!   crash in between leaves the snapshot, the old entry and an empty new
//!   layer under the old key: consistent, and undone by deleting the
//!   snapshot (a merge, both layers under one key).
//! - A block all zeros on the device was never written through a cipher
//!   and stays zeros when resealed (it reads as zeros under any key).

use crate::engine::Store;
use crate::error::StoreError;
use crate::format::WrappedKey;
use crate::keys::{check_wrapped, Entry, LayerKey};
use crate::{VolumeId, BLOCK_SIZE};
use basalt_crypt::BlockCipher;
use std::sync::Arc;

impl Store {
    /// Re-encrypts volume `volume` from now on: its current layer becomes
    /// snapshot `snap` under the key it has, and the volume goes on under
    /// `next` (a wrapped key and its cipher; `None`: plain). Durable on
    /// return; client I/O pauses for the snapshot and two flushes. The
    /// caller flattens the volume (which reseals what it reads through
    /// older layers) and then deletes `snap`.
    pub fn rekey_volume(
        &self,
        volume: VolumeId,
        snap: VolumeId,
        next: Option<(&WrappedKey, Arc<BlockCipher>)>,
    ) -> Result<(), StoreError> {
        self.check_usable()?;
        let keys = self.key_slots()?;
        if self.presence.is_none() {
            return Err(StoreError::NoLayers);
        }
        if let Some((key, _)) = &next {
            check_wrapped(key)?;
        }
        let _op = self.layer_ops.lock();
        let vol = self.volume_state(volume)?;
        if vol.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{volume} is a snapshot; only a volume is re-encrypted"
            )));
        }
        if self.meta.lock().volumes.contains_key(&snap) {
            return Err(StoreError::Exists(snap));
        }
        // Refused while locked: what it holds could not be resealed.
        let current = self.cipher_of(&vol)?;
        let current_key = self.volume_key(volume)?;
        let pin = match &current_key {
            Some(key) => Entry::Key(key),
            None => Entry::Plain,
        };
        let unpinned: Vec<VolumeId> = self
            .meta
            .lock()
            .volumes
            .values()
            .filter(|v| v.snapshot_of == Some(volume) && keys.get(v.id).is_none())
            .map(|v| v.id)
            .collect();
        let device = self.device.as_ref();
        for id in unpinned.into_iter().chain(std::iter::once(snap)) {
            keys.put(device, &self.layout, id, Some(pin))
                .map_err(|e| self.fail(e))?;
            if let Some(c) = &current {
                keys.ciphers
                    .write()
                    .insert(id, LayerKey::Unlocked(c.clone()));
            }
        }
        keys.note_pinned();
        let paused = {
            let mut map = vol.map.write();
            let since = std::time::Instant::now();
            if let Err(e) = self.freeze_head(&vol, &mut map, snap) {
                drop(map);
                self.shred_key(snap)?;
                return Err(e);
            }
            self.commit()?;
            let entry = next.as_ref().map(|(key, _)| Entry::Key(key));
            keys.put(device, &self.layout, volume, entry)
                .map_err(|e| self.fail(e))?;
            if let Some((_, cipher)) = next {
                keys.ciphers
                    .write()
                    .insert(volume, LayerKey::Unlocked(cipher));
            }
            since.elapsed()
        };
        tracing::info!(%volume, snapshot = %snap, encrypted = self.is_encrypted(volume), io_paused_ms = paused.as_secs_f64() * 1e3, "volume re-encrypted from now on; flattening reseals the rest");
        Ok(())
    }
}

/// Reseals the blocks of `buf` — as a layer under `from` keeps them on the
/// device, the first being block `first_block` of the volume — for a layer
/// under `to`: decrypted, then encrypted. Blocks all zeros stay zeros.
pub(crate) fn reseal(
    buf: &mut [u8],
    first_block: u64,
    from: Option<&BlockCipher>,
    to: Option<&BlockCipher>,
) -> Result<(), StoreError> {
    let bs = BLOCK_SIZE as usize;
    let failed = |e: basalt_crypt::CipherError| {
        StoreError::Layers(format!("cannot reseal a block for its new key: {e}"))
    };
    for (j, block) in buf.chunks_mut(bs).enumerate() {
        if block.iter().all(|&b| b == 0) {
            continue;
        }
        let n = first_block + j as u64;
        if let Some(from) = from {
            from.decrypt(n, block).map_err(failed)?;
        }
        if let Some(to) = to {
            to.encrypt(n, block).map_err(failed)?;
        }
    }
    Ok(())
}
