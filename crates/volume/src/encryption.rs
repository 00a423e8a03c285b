//! Encryption at rest in the control plane: the server's master key (its
//! [`Keyring`]), each encrypted volume's data key — made and wrapped when
//! the volume is created, unwrapped to unlock the volume when the server
//! starts — and master key rotation, which rewraps data keys and rewrites
//! no data. The store keeps the wrapped keys and encrypts with the ciphers
//! handed to it; plaintext keys exist only in this process's memory.
//!
//! Invariants:
//! - A volume whose key does not unwrap stays locked: it is never opened
//!   (so never read as garbage), one line says why, and every other volume
//!   is served.
//! - Rotation (key file only): the next master key is durable in
//!   `FILE.next` before any data key is wrapped with it; every data key is
//!   rewrapped, durably, and only then does `FILE.next` replace `FILE`. A
//!   stop at any point leaves every data key wrapped by one of the two
//!   files; the next start loads both and the next rotation finishes.
//! - Rotation is refused while any data key does not unwrap with the keys
//!   loaded, so it never leaves a volume behind under a key file it
//!   replaced.
//! - A replicated volume's wrapped key is in its catalog record; the node
//!   serving a client of the volume unwraps it and encrypts there, so the
//!   peer link and every replica's store carry ciphertext only, and a node
//!   that only holds replicas never unwraps it. Every node of a cluster is
//!   started with the same master key.

use crate::error::VolumeError;
use crate::service::VolumeService;
use basalt_catalog::{VolumeRecord, WrappedKeyRecord};
use basalt_crypt::{BlockCipher, DataKey, KeySource, MasterKey, MasterKeyError};
use basalt_store::{VolumeId, WrappedKey};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The server's master key, and during a rotation the next one.
pub struct Keyring {
    source: KeySource,
    /// The current key first; a rotation's next key second.
    keys: RwLock<Vec<Arc<MasterKey>>>,
    rotation: Mutex<()>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({:08x})", self.current().id())
    }
}

fn next_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".next");
    PathBuf::from(p)
}

impl Keyring {
    /// Loads the master key from `source` (a missing key file is created),
    /// and the next key of a rotation a stop interrupted.
    pub fn load(source: KeySource) -> Result<Keyring, MasterKeyError> {
        let mut keys = vec![Arc::new(MasterKey::load(&source)?)];
        if let KeySource::File(path) = &source {
            let next = next_path(path);
            if next.exists() {
                keys.push(Arc::new(MasterKey::load_or_create_file(&next)?));
            }
        }
        Ok(Keyring {
            source,
            keys: RwLock::new(keys),
            rotation: Mutex::new(()),
        })
    }

    /// The key new data keys are wrapped with.
    pub fn current(&self) -> Arc<MasterKey> {
        self.keys.read()[0].clone()
    }

    fn by_id(&self, id: u32) -> Option<Arc<MasterKey>> {
        self.keys.read().iter().find(|k| k.id() == id).cloned()
    }

    fn unwrap(&self, wrapped: &WrappedKey) -> Result<DataKey, MasterKeyError> {
        match self.by_id(wrapped.master_key_id) {
            Some(master) => wrapped.unwrap_with(&master),
            None => wrapped.unwrap_with(&self.current()),
        }
    }
}

/// `key` as a catalog record keeps it.
pub(crate) fn key_record(key: &WrappedKey) -> WrappedKeyRecord {
    WrappedKeyRecord {
        suite: key.suite,
        master_key_id: key.master_key_id,
        blob: key.blob.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

fn from_record(r: &WrappedKeyRecord) -> Option<WrappedKey> {
    let hex = r.blob.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let blob = hex
        .chunks(2)
        .map(|c| {
            std::str::from_utf8(c)
                .ok()
                .and_then(|s| u8::from_str_radix(s, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()?;
    Some(WrappedKey {
        suite: r.suite,
        master_key_id: r.master_key_id,
        blob,
    })
}

/// What [`VolumeService::unlock_volumes`] did.
#[derive(Debug, Default)]
pub struct UnlockReport {
    pub unlocked: usize,
    /// Volumes left locked, with why.
    pub locked: Vec<(String, String)>,
}

/// What [`VolumeService::rotate_master_key`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RotationReport {
    /// The new master key's id.
    pub master_key_id: u32,
    /// Data keys rewrapped with it.
    pub rewrapped: usize,
}

impl VolumeService {
    /// Serves encrypted volumes with `keyring`'s master key.
    pub fn with_keyring(mut self, keyring: Arc<Keyring>) -> Self {
        self.keyring = Some(keyring);
        self
    }

    /// A fresh data key for a new encrypted volume: wrapped for the store,
    /// and its cipher.
    pub(crate) fn new_data_key(&self) -> Result<(WrappedKey, Arc<BlockCipher>), VolumeError> {
        let Some(keyring) = &self.keyring else {
            return Err(VolumeError::NotSupported(
                "encrypted volumes need a master key: start the server with --master-key-file PATH or --master-key-command CMD".into(),
            ));
        };
        let key = DataKey::generate();
        Ok((keyring.current().wrap(&key), Arc::new(key.cipher())))
    }

    /// The cipher of a replicated volume's record (`None`: not encrypted);
    /// refused with the volume's name when its key does not unwrap here.
    pub(crate) fn cluster_cipher(
        &self,
        record: &VolumeRecord,
    ) -> Result<Option<Arc<BlockCipher>>, VolumeError> {
        if !record.encrypted {
            return Ok(None);
        }
        let why = match (
            &self.keyring,
            record.wrapped_key.as_ref().and_then(from_record),
        ) {
            (_, None) => "its record holds no readable wrapped key".to_string(),
            (None, Some(_)) => {
                "this node has no master key (--master-key-file or --master-key-command)".into()
            }
            (Some(keyring), Some(wrapped)) => match keyring.unwrap(&wrapped) {
                Ok(key) => return Ok(Some(Arc::new(key.cipher()))),
                Err(e) => e.to_string(),
            },
        };
        tracing::error!(volume = %record.name, "volume is encrypted and cannot be opened here: {why}");
        Err(VolumeError::Locked(record.name.clone()))
    }

    /// Names of the store's layers, for messages.
    fn names_by_id(&self) -> HashMap<VolumeId, String> {
        self.catalog
            .list()
            .map(|records| {
                records
                    .into_iter()
                    .map(|v| (v.record.id, v.record.name))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// At start: unwraps each encrypted volume's data key and unlocks the
    /// volume. A volume whose key does not unwrap (no master key, another
    /// one, a damaged entry) stays locked, with one line saying so.
    pub fn unlock_volumes(&self) -> UnlockReport {
        let mut report = UnlockReport::default();
        let names = self.names_by_id();
        // One cipher per data key: a snapshot pinned by a re-encryption
        // holds its volume's old key wrapped alike (key wrap is
        // deterministic), and the store moves blocks between layers that
        // share a cipher without resealing them.
        let mut ciphers: HashMap<(u8, u32, Vec<u8>), Arc<BlockCipher>> = HashMap::new();
        for (id, locked) in self.store.keyed_volumes() {
            if !locked {
                continue;
            }
            let name = names.get(&id).cloned().unwrap_or_else(|| id.to_string());
            let outcome = match (&self.keyring, self.store.volume_key(id)) {
                (_, Err(e)) => Err(e.to_string()),
                (_, Ok(None)) => Err("its key slot entry is damaged".into()),
                (None, Ok(Some(_))) => Err(
                    "the server has no master key (--master-key-file or --master-key-command)"
                        .into(),
                ),
                (Some(keyring), Ok(Some(wrapped))) => {
                    let blob = (wrapped.suite, wrapped.master_key_id, wrapped.blob.clone());
                    let cipher = match ciphers.get(&blob) {
                        Some(c) => Ok(c.clone()),
                        None => keyring
                            .unwrap(&wrapped)
                            .map(|key| Arc::new(key.cipher()))
                            .map_err(|e| e.to_string()),
                    };
                    cipher.and_then(|c| {
                        ciphers.insert(blob, c.clone());
                        self.store.unlock_volume(id, c).map_err(|e| e.to_string())
                    })
                }
            };
            match outcome {
                Ok(()) => report.unlocked += 1,
                Err(why) => {
                    tracing::error!(volume = %name, "volume is encrypted and stays closed: {why}");
                    report.locked.push((name, why));
                }
            }
        }
        // A record that says encrypted with no key in the store: its entry
        // was damaged (the store read it as empty). (A re-encryption a stop
        // interrupted is settled by `reconcile`.)
        if let Ok(records) = self.catalog.list() {
            let present: std::collections::HashSet<VolumeId> =
                self.store.volumes().iter().map(|u| u.id).collect();
            for v in records
                .iter()
                .filter(|v| v.record.encrypted && v.record.reencryption.is_none())
            {
                let id = v.record.id;
                if present.contains(&id) && !self.store.is_encrypted(id) {
                    let why = "its key slot entry is missing or damaged".to_string();
                    tracing::error!(volume = %v.record.name, "volume is encrypted and stays closed: {why}");
                    report.locked.push((v.record.name.clone(), why));
                }
            }
        }
        if report.unlocked > 0 {
            tracing::info!(volumes = report.unlocked, "unlocked encrypted volumes");
        }
        // Snapshot deletions a stop interrupted whose layers are under a
        // key wait for it (`Store::finish_snapshot_deletions`).
        if let Err(e) = self.store.finish_snapshot_deletions() {
            tracing::error!(error = %e, "could not finish the snapshot deletions a stop interrupted");
        }
        report
    }

    /// Rewraps every data key with a new master key, then makes that key
    /// the key file's (see the module's invariants). Data is not rewritten.
    pub fn rotate_master_key(&self) -> Result<RotationReport, VolumeError> {
        let Some(keyring) = &self.keyring else {
            return Err(VolumeError::NotSupported(
                "this server has no master key to rotate (--master-key-file)".into(),
            ));
        };
        let KeySource::File(path) = &keyring.source else {
            return Err(VolumeError::NotSupported(
                "rotation needs --master-key-file: with --master-key-command the key manager holds the key".into(),
            ));
        };
        if self.cluster.is_some() {
            return Err(VolumeError::NotSupported(
                "master key rotation is single-node for now: in a cluster every node's key file and every record's wrapped key would have to change together".into(),
            ));
        }
        let _rotation = keyring.rotation.lock();
        let names = self.names_by_id();
        let keyed = self.store.keyed_volumes();
        // Every key must unwrap before anything changes.
        let mut keys = Vec::with_capacity(keyed.len());
        for (id, _) in &keyed {
            let name = names.get(id).cloned().unwrap_or_else(|| id.to_string());
            let wrapped = self.store.volume_key(*id)?.ok_or_else(|| {
                VolumeError::NotSupported(format!(
                    "volume {name}'s key slot entry is damaged; rotation would leave it behind"
                ))
            })?;
            let key = keyring.unwrap(&wrapped).map_err(|e| {
                VolumeError::NotSupported(format!(
                    "volume {name}'s key does not unwrap with this server's master key ({e}); rotation would leave it behind"
                ))
            })?;
            keys.push((*id, wrapped, key));
        }
        let next = {
            let pending = keyring.keys.read().get(1).cloned();
            match pending {
                Some(next) => next,
                None => {
                    let next = Arc::new(MasterKey::generate());
                    next.write_new_file(&next_path(path))
                        .map_err(|e| VolumeError::NotSupported(e.to_string()))?;
                    keyring.keys.write().push(next.clone());
                    next
                }
            }
        };
        let mut rewrapped = 0;
        for (id, wrapped, key) in keys {
            if wrapped.master_key_id != next.id() {
                self.store.set_volume_key(id, &next.wrap(&key))?;
                rewrapped += 1;
            }
        }
        let io = |e: std::io::Error| {
            VolumeError::NotSupported(format!("master key file {}: {e}", path.display()))
        };
        std::fs::rename(next_path(path), path).map_err(io)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
        }
        *keyring.keys.write() = vec![next.clone()];
        tracing::info!(
            master_key = format!("{:08x}", next.id()),
            rewrapped,
            "rotated the master key"
        );
        Ok(RotationReport {
            master_key_id: next.id(),
            rewrapped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_key_survives_its_record_and_a_damaged_one_does_not_parse() {
        let master = MasterKey::generate();
        let wrapped = master.wrap(&DataKey::generate());
        let record = key_record(&wrapped);
        assert_eq!(record.blob.len(), 2 * wrapped.blob.len());
        assert_eq!(from_record(&record), Some(wrapped.clone()));
        let mut odd = record.clone();
        odd.blob.pop();
        assert_eq!(from_record(&odd), None);
        let mut bad = record;
        bad.blob.replace_range(0..2, "zz");
        assert_eq!(from_record(&bad), None);
    }
}
