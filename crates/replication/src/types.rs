//! Identifiers and the volume's membership record.
//!
//! Job: name nodes, epochs, volumes and block addresses, and define the
//! membership record the metadata service (etcd) stores per volume, with its
//! compare-and-swap rules.
//!
//! Invariants of a record sequence accepted by [`MetaStore::cas`]:
//! - `version` grows by exactly one per accepted change (it is the CAS token);
//! - `epoch` never decreases, and the primary changes only together with an
//!   epoch increase (so at most one node is primary per epoch);
//! - the primary is always a member;
//! - a replica added to the record is never InSync (it joins empty and is
//!   resynced), and `1 <= min_in_sync <= replicas`;
//! - `blocks` (the volume's size) never decreases: a volume only grows
//!   (0 means "not recorded", from records written before sizes were).
//!
//! Decision: marking a secondary OutOfSync / InSync / Faulty bumps only
//! `version`, never `epoch`. The epoch fences primaries; a secondary's state
//! change does not change who may write, so it needs no fencing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Size of a block address unit.
pub const BLOCK_SIZE: u64 = 4096;

/// A storage node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

/// A volume's generation: incremented each time a primary is appointed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

/// A volume: the catalog's UUID as a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VolumeId(pub u128);

/// A snapshot layer of a volume: the catalog's UUID of the snapshot as a
/// number, the same on every replica (the layer's id in each node's store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LayerId(pub u128);

/// A block address, in units of [`BLOCK_SIZE`].
pub type Lba = u64;

/// A replica's standing in the membership record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaState {
    /// Holds every acknowledged write; may be promoted.
    InSync,
    /// Missing some writes; the primary keeps the dirty regions and resyncs it.
    OutOfSync,
    /// Not heard from within its lease: neither written to nor resynced until
    /// it comes back (then OutOfSync).
    Faulty,
}

/// One replica's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    pub state: ReplicaState,
    /// The node's boot id the coordinator last acknowledged. A node acts on a
    /// record only when this equals its current boot id, so a restarted node
    /// stays passive until the coordinator has handled its restart.
    pub boot: u64,
}

/// The membership record of one volume, as stored in the metadata service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    pub volume: VolumeId,
    /// CAS token: bumped by every accepted change.
    pub version: u64,
    pub epoch: Epoch,
    pub primary: NodeId,
    pub replicas: BTreeMap<NodeId, ReplicaInfo>,
    /// Writes are acknowledged only while at least this many replicas
    /// (primary included) are InSync.
    pub min_in_sync: usize,
    /// The volume's size in blocks (0: not recorded; nodes then keep the
    /// size they have). Only grows. Every node grows its local disk to it
    /// before its state machine serves or applies anything beyond the old
    /// size (see `Node`).
    #[serde(default)]
    pub blocks: u64,
}

impl Membership {
    /// A fresh volume: every replica InSync, `primary` serving, epoch 1.
    pub fn new(volume: VolumeId, nodes: &[NodeId], primary: NodeId, min_in_sync: usize) -> Self {
        let replicas = nodes
            .iter()
            .map(|n| {
                (
                    *n,
                    ReplicaInfo {
                        state: ReplicaState::InSync,
                        boot: 0,
                    },
                )
            })
            .collect();
        Membership {
            volume,
            version: 1,
            epoch: Epoch(1),
            primary,
            replicas,
            min_in_sync,
            blocks: 0,
        }
    }

    /// The same record with the volume's size set to `blocks`.
    pub fn with_blocks(mut self, blocks: u64) -> Self {
        self.blocks = blocks;
        self
    }

    pub fn state(&self, n: NodeId) -> Option<ReplicaState> {
        self.replicas.get(&n).map(|r| r.state)
    }

    /// Whether `new` may replace this record (the rules of the module
    /// docs, apart from the version, which the CAS itself checks). Every
    /// metadata backend applies exactly this check.
    pub fn check_change(&self, new: &Membership) -> Result<(), CasError> {
        if new.volume != self.volume {
            return Err(CasError::Invalid("record of another volume"));
        }
        if new.epoch < self.epoch {
            return Err(CasError::Invalid("epoch went backwards"));
        }
        if new.epoch == self.epoch && new.primary != self.primary {
            return Err(CasError::Invalid("primary changed without a new epoch"));
        }
        if !new.replicas.contains_key(&new.primary) {
            return Err(CasError::Invalid("primary is not a member"));
        }
        // A replica joins empty: it becomes InSync only through a resync by
        // the primary, never by being added.
        if new
            .replicas
            .iter()
            .any(|(n, info)| !self.replicas.contains_key(n) && info.state == ReplicaState::InSync)
        {
            return Err(CasError::Invalid("a replica was added as InSync"));
        }
        if new.min_in_sync == 0 || new.min_in_sync > new.replicas.len() {
            return Err(CasError::Invalid("min_in_sync out of range"));
        }
        if new.blocks < self.blocks {
            return Err(CasError::Invalid("the volume's size went down"));
        }
        Ok(())
    }

    pub fn in_sync_count(&self) -> usize {
        self.replicas
            .values()
            .filter(|r| r.state == ReplicaState::InSync)
            .count()
    }
}

/// Why a CAS was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CasError {
    #[error("version conflict: expected {expected}, record is at {}", current.version)]
    Conflict {
        expected: u64,
        current: Box<Membership>,
    },
    #[error("invalid change: {0}")]
    Invalid(&'static str),
    #[error("no such volume")]
    NoSuchVolume,
}

/// The model of the metadata service (etcd's linearizable KV, one key per
/// volume): used by the simulator and by unit tests; production uses etcd
/// transactions with the same rules.
#[derive(Debug, Default, Clone)]
pub struct MetaStore {
    records: BTreeMap<VolumeId, Membership>,
}

impl MetaStore {
    pub fn create(&mut self, m: Membership) {
        self.records.insert(m.volume, m);
    }

    pub fn get(&self, v: VolumeId) -> Option<&Membership> {
        self.records.get(&v)
    }

    /// Replaces the record if its version is still `expected`; the stored
    /// record gets version `expected + 1`.
    pub fn cas(&mut self, expected: u64, mut new: Membership) -> Result<Membership, CasError> {
        let cur = self
            .records
            .get(&new.volume)
            .ok_or(CasError::NoSuchVolume)?;
        if cur.version != expected {
            return Err(CasError::Conflict {
                expected,
                current: Box::new(cur.clone()),
            });
        }
        cur.check_change(&new)?;
        new.version = expected + 1;
        self.records.insert(new.volume, new.clone());
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_rules() {
        let mut s = MetaStore::default();
        let m = Membership::new(VolumeId(1), &[NodeId(0), NodeId(1)], NodeId(0), 1);
        s.create(m.clone());
        let mut n = m.clone();
        n.primary = NodeId(1);
        assert_eq!(
            s.cas(1, n.clone()),
            Err(CasError::Invalid("primary changed without a new epoch"))
        );
        n.epoch = Epoch(2);
        let got = s.cas(1, n.clone()).unwrap();
        assert_eq!(got.version, 2);
        assert!(matches!(s.cas(1, n), Err(CasError::Conflict { .. })));
        let mut back = got.clone();
        back.epoch = Epoch(1);
        assert!(matches!(s.cas(2, back), Err(CasError::Invalid(_))));
    }

    #[test]
    fn size_only_grows() {
        let mut s = MetaStore::default();
        let m = Membership::new(VolumeId(1), &[NodeId(0)], NodeId(0), 1);
        s.create(m.clone());
        // From "not recorded" to a size, then larger: fine.
        let got = s.cas(1, m.clone().with_blocks(16)).unwrap();
        let got = s.cas(got.version, got.clone().with_blocks(24)).unwrap();
        assert_eq!(got.blocks, 24);
        assert_eq!(
            s.cas(got.version, got.clone().with_blocks(23)),
            Err(CasError::Invalid("the volume's size went down"))
        );
        assert_eq!(
            s.cas(got.version, got.clone().with_blocks(0)),
            Err(CasError::Invalid("the volume's size went down"))
        );
    }
}
