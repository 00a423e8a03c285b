//! Re-encryption of single-node volumes: what a retype between an
//! encrypted and a plain volume type does. The store switches the volume's
//! key at once (`Store::rekey_volume`: its layer as it was becomes a
//! snapshot under the old key, no record lists it), and flattening
//! (`basalt volume flatten`, which `basalt volume retype` runs with a
//! progress bar) reseals into the volume every block it still reads
//! through that layer; the snapshot is then deleted. Client I/O goes on
//! throughout. The volume's own snapshots keep the key they were taken
//! under.
//!
//! Invariants:
//! - The record names the re-encryption (its store snapshot and whether
//!   the volume ends up encrypted) before the store switches the key, so
//!   the next start settles a stop at any point (`settle_reencryptions`,
//!   from `reconcile`): undone (the snapshot merged back, one key on both
//!   sides) if the store had not switched, left to flattening if it had,
//!   finished if the volume was already detached.
//! - `record.encrypted` follows the store's key once the switch is done.
//! - The snapshot is deleted only once the volume reads nothing through it.
//! - No snapshot is taken and no rollback done while it runs.

use crate::error::VolumeError;
use crate::service::{catalog_error, ReconcileReport, VolumeService};
use basalt_catalog::{Reencryption, Revision, Versioned, VolumeRecord};
use basalt_store::{StoreError, VolumeId};

impl VolumeService {
    /// Starts re-encrypting `current`'s volume so that it ends up
    /// `encrypted` (or plain); returns the re-encryption and the record's
    /// new revision (the caller's retype writes the rest of the record).
    pub(crate) fn begin_reencryption(
        &self,
        current: &Versioned<VolumeRecord>,
        encrypted: bool,
    ) -> Result<(Reencryption, Revision), VolumeError> {
        let name = &current.record.name;
        if self.cluster.is_some() {
            return Err(VolumeError::NotSupported(format!(
                "volume {name} is replicated: re-encrypting a replicated volume (a retype between encrypted and plain types) is not built yet; copy it into a new volume of that type instead"
            )));
        }
        if current.record.reencryption.is_some() {
            return Err(self.busy_reencrypting(name));
        }
        let next = if encrypted {
            Some(self.new_data_key()?)
        } else {
            None
        };
        let started = Reencryption::new(VolumeId::new_v4(), encrypted);
        let mut record = current.record.clone();
        record.reencryption = Some(started.clone());
        let revision = self
            .catalog
            .update(&record, current.revision)
            .map_err(catalog_error)?;
        let switched = self.store.rekey_volume(
            record.id,
            started.snapshot_id,
            next.as_ref().map(|(key, cipher)| (key, cipher.clone())),
        );
        if let Err(e) = switched {
            // Nothing changed in the store (or the next start undoes it).
            record.reencryption = None;
            let _ = self.catalog.update(&record, revision);
            return Err(e.into());
        }
        tracing::info!(volume = %name, encrypted, "re-encryption started: new writes are under the new key; flattening reseals the rest");
        Ok((started, revision))
    }

    /// Whether snapshot `snap` of `volume` is encrypted: as the volume is,
    /// unless a re-encryption pinned it to the key it was taken under (a
    /// single node's store says so; a replicated volume is never
    /// re-encrypted).
    pub(crate) fn snapshot_encrypted(&self, volume: &VolumeRecord, snap: VolumeId) -> bool {
        match self.cluster.is_none() && self.store.has_own_key_entry(snap) {
            true => self.store.is_encrypted(snap),
            false => volume.encrypted,
        }
    }

    /// The refusal of what waits for a re-encryption to finish.
    pub(crate) fn busy_reencrypting(&self, name: &str) -> VolumeError {
        VolumeError::NotSupported(format!(
            "volume {name} is being re-encrypted; `basalt volume flatten {name}` finishes that first"
        ))
    }

    /// After flattening detached `name`: deletes the snapshot that held
    /// its layer under the old key, and drops the re-encryption from the
    /// record.
    pub(crate) fn finish_reencryption(&self, name: &str) -> Result<(), VolumeError> {
        let current = self.record(name)?;
        let Some(done) = current.record.reencryption.clone() else {
            return Ok(());
        };
        self.delete_reencryption_snapshot(done.snapshot_id)?;
        let mut record = current.record.clone();
        record.reencryption = None;
        record.encrypted = done.encrypted;
        self.catalog
            .update(&record, current.revision)
            .map_err(catalog_error)?;
        tracing::info!(
            volume = name,
            encrypted = done.encrypted,
            "volume re-encrypted"
        );
        Ok(())
    }

    fn delete_reencryption_snapshot(&self, id: VolumeId) -> Result<(), VolumeError> {
        match self.store.delete_snapshot(id) {
            Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// At start (single node): settles each re-encryption a stop left in
    /// a record (see the module's invariants).
    pub(crate) fn settle_reencryptions(
        &self,
        records: &[Versioned<VolumeRecord>],
        report: &mut ReconcileReport,
    ) {
        let usage = self.store.volumes();
        let snapshots: std::collections::HashSet<VolumeId> =
            self.store.snapshots().iter().map(|s| s.id).collect();
        for current in records {
            let Some(re) = current.record.reencryption.clone() else {
                continue;
            };
            let name = &current.record.name;
            let id = current.record.id;
            if !usage.iter().any(|v| v.id == id) {
                continue;
            }
            let mut record = current.record.clone();
            let held = snapshots.contains(&re.snapshot_id);
            let outcome = if self.store.is_encrypted(id) != re.encrypted {
                tracing::warn!(volume = %name, "a stop interrupted a re-encryption before it began; it is undone (retype the volume again)");
                record.reencryption = None;
                if held {
                    self.delete_reencryption_snapshot(re.snapshot_id)
                } else {
                    Ok(())
                }
            } else {
                record.encrypted = re.encrypted;
                let detached = usage.iter().any(|v| v.id == id && v.parent.is_none());
                if detached || !held {
                    record.reencryption = None;
                    self.delete_reencryption_snapshot(re.snapshot_id)
                } else {
                    tracing::info!(volume = %name, "re-encryption under way: `basalt volume flatten {name}` finishes it");
                    Ok(())
                }
            };
            let updated = outcome.and_then(|()| {
                if record == current.record {
                    return Ok(());
                }
                self.catalog
                    .update(&record, current.revision)
                    .map(|_| ())
                    .map_err(catalog_error)
            });
            if let Err(e) = updated {
                tracing::error!(volume = %name, error = %e, "could not settle the volume's re-encryption");
                report.failed.push((name.clone(), e.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::service::tests::small_node;
    use basalt_catalog::{Catalog, Reencryption};
    use basalt_crypt::{DataKey, MasterKey};
    use basalt_store::VolumeId;
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    /// A 4 MiB volume `name` holding `fill` in its first 1 MiB.
    fn written(n: &crate::service::tests::Node, name: &str, fill: u8) -> VolumeId {
        let id = n.service.create(name, 4 * MIB).unwrap().id;
        let h = n.store.volume(id).unwrap();
        h.write(0, &vec![fill; MIB as usize], true).unwrap();
        id
    }

    fn read_first_mib(n: &crate::service::tests::Node, id: VolumeId) -> Vec<u8> {
        let mut buf = vec![0u8; MIB as usize];
        n.store.volume(id).unwrap().read(0, &mut buf).unwrap();
        buf
    }

    /// What a stop leaves in the record: the re-encryption named, the rest
    /// as it was.
    fn name_reencryption(n: &crate::service::tests::Node, name: &str, snap: VolumeId) {
        let current = n.catalog.get(name).unwrap().unwrap();
        let mut record = current.record.clone();
        record.reencryption = Some(Reencryption::new(snap, true));
        n.catalog.update(&record, current.revision).unwrap();
    }

    fn switch(n: &crate::service::tests::Node, id: VolumeId, snap: VolumeId) {
        let key = DataKey::generate();
        let wrapped = MasterKey::generate().wrap(&key);
        n.store
            .rekey_volume(id, snap, Some((&wrapped, Arc::new(key.cipher()))))
            .unwrap();
    }

    #[test]
    fn a_stop_at_any_step_is_settled_at_the_next_start() {
        let n = small_node();
        // Before the switch (its snapshot taken, the key not changed):
        // undone, the snapshot merged back.
        let early = written(&n, "early", 0x11);
        let s1 = VolumeId::new_v4();
        n.store.snapshot(early, s1).unwrap();
        name_reencryption(&n, "early", s1);
        // Switched, not flattened: left to flattening, the record saying
        // encrypted.
        let mid = written(&n, "mid", 0x22);
        let s2 = VolumeId::new_v4();
        name_reencryption(&n, "mid", s2);
        switch(&n, mid, s2);
        // Flattened and detached, its snapshot not deleted yet: finished.
        let late = written(&n, "late", 0x33);
        let s3 = VolumeId::new_v4();
        name_reencryption(&n, "late", s3);
        switch(&n, late, s3);
        assert!(
            n.store
                .flatten(late, 0..4 * MIB, None, &mut |_, _| {})
                .unwrap()
                .detached
        );

        let report = n.service.reconcile().unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        assert!(report.deleted_orphans.is_empty(), "{report:?}");
        let snapshots: Vec<VolumeId> = n.store.snapshots().iter().map(|s| s.id).collect();
        assert_eq!(snapshots, [s2], "only the one still read through stays");

        let early_info = n.service.get("early").unwrap();
        assert!(!early_info.reencrypting && !early_info.encrypted);
        assert!(!n.store.is_encrypted(early));
        let mid_info = n.service.get("mid").unwrap();
        assert!(mid_info.reencrypting && mid_info.encrypted);
        let late_info = n.service.get("late").unwrap();
        assert!(!late_info.reencrypting && late_info.encrypted);
        for (id, fill) in [(early, 0x11), (mid, 0x22), (late, 0x33)] {
            assert_eq!(read_first_mib(&n, id), vec![fill; MIB as usize]);
        }

        // Flattening finishes the one under way; snapshots wait for it.
        assert!(n.service.create_snapshot("mid", "s").is_err());
        let report = n
            .service
            .flatten("mid", 0..4 * MIB, None, &mut |_, _| {})
            .unwrap();
        assert!(report.detached);
        let mid_info = n.service.get("mid").unwrap();
        assert!(!mid_info.reencrypting && mid_info.encrypted);
        assert!(n.store.snapshots().is_empty());
        assert_eq!(read_first_mib(&n, mid), vec![0x22; MIB as usize]);
        n.service.create_snapshot("mid", "s").unwrap();
    }
}
