//! The catalog's record of one volume.
//!
//! Compatibility rules, so records written by any basalt version stay
//! readable by any other:
//! - A field added later must carry `#[serde(default)]` (records written
//!   before it existed lack it).
//! - Fields this version does not know are kept in [`VolumeRecord::unknown`]
//!   and written back unchanged, so an older node updating a record does not
//!   drop what a newer one added.
//! - Fields are never renamed or re-typed; add a new one instead.

use serde::{Deserialize, Serialize};
use std::time::SystemTime;
use uuid::Uuid;

/// The longest volume name the control plane accepts, in bytes.
pub const MAX_VOLUME_NAME_LEN: usize = 64;

/// The desired state of one volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Stable identity and the store's volume id; never changes. A name can
    /// be reused after a delete, always with a new id.
    pub id: Uuid,
    /// Unique, user-chosen name; the catalog key.
    pub name: String,
    /// Provisioned size in bytes (a multiple of 4096).
    pub size_bytes: u64,
    /// Creation time, RFC 3339 in UTC with second precision.
    pub created_at: String,
    /// Host NQNs that may access the volume over NVMe/TCP (besides the
    /// hosts the server allows for every volume); absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_hosts: Vec<String>,
    /// DH-HMAC-CHAP secrets of attached hosts (host NQN → secrets): such a
    /// host must authenticate in-band on every queue; absent when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub nvme_host_keys: std::collections::BTreeMap<String, NvmeHostKeys>,
    /// Initiator IQNs that may log in to the volume's iSCSI target;
    /// absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iscsi_initiators: Vec<String>,
    /// CHAP credentials of attached initiators (initiator IQN → credentials):
    /// such an initiator must authenticate at every login; absent when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub iscsi_chap: std::collections::BTreeMap<String, IscsiChapRecord>,
    /// Desired number of replicas in a cluster (absent: single-node volume,
    /// or the cluster's default chosen at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// The volume's snapshots, oldest first; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// The snapshot this volume was cloned from; absent for a volume
    /// created empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<CloneSource>,
    /// QoS limits, Cinder QoS key → value (`basalt_volume::qos`); absent
    /// when unlimited.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub qos: std::collections::BTreeMap<String, u64>,
    /// The project the volume belongs to; absent for a volume only
    /// cluster-wide tokens manage (all volumes made before projects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The volume type it was created or last retyped with; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
    /// Its data is encrypted at rest. A single-node volume's wrapped data
    /// key is in its store's key slots; a replicated one's is here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// A replicated encrypted volume's data key, wrapped by the master key
    /// every node of the cluster is started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<WrappedKeyRecord>,
    /// The codec its cold data is kept compressed with (`lz4`, `zstd`,
    /// `zstd:LEVEL`); absent: not compressed. A policy of the store's
    /// compactor, set again at every start: the data's format does not
    /// depend on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// A re-encryption under way (a retype between encrypted and plain
    /// types of a single-node volume), until the volume holds everything
    /// under its new key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencryption: Option<Reencryption>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// A volume's re-encryption under way: its layer as it was under the old
/// key is a store snapshot no record lists, deleted once flattening has
/// resealed into the volume every block it read through it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reencryption {
    /// The store snapshot holding the layer under its old key.
    pub snapshot_id: Uuid,
    /// Whether the volume ends up encrypted (else plain).
    pub encrypted: bool,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// A data key wrapped by a master key, as a record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrappedKeyRecord {
    /// How `blob` wraps the key (1: AES-256 key wrap of an AES-256-XTS key).
    pub suite: u8,
    /// Which master key wrapped it (a digest of the key, not the key).
    pub master_key_id: u32,
    /// The wrapped key, in hex.
    pub blob: String,
}

/// The DH-HMAC-CHAP secrets of one host attachment, in the `DHHC-1` form
/// `nvme connect --dhchap-secret` takes. Stored as they are: the target
/// computes with them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeHostKeys {
    /// What the host proves it holds.
    pub host_secret: String,
    /// What the controller proves it holds when the host asks
    /// (bidirectional authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_secret: Option<String>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl std::fmt::Debug for NvmeHostKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        f.debug_struct("NvmeHostKeys")
            .field("bidirectional", &self.controller_secret.is_some())
            .finish_non_exhaustive()
    }
}

/// The CHAP credentials of one iSCSI initiator attachment (RFC 7143
/// §12.1.3), as `iscsiadm`'s `node.session.auth.*` settings take them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IscsiChapRecord {
    /// The CHAP name the initiator answers with (`CHAP_N`).
    pub user: String,
    /// The secret the initiator proves it holds.
    pub secret: String,
    /// Mutual CHAP: the name and secret the target proves itself with
    /// when the initiator challenges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_secret: Option<String>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl std::fmt::Debug for IscsiChapRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        f.debug_struct("IscsiChapRecord")
            .field("user", &self.user)
            .field("mutual", &self.target_secret.is_some())
            .finish_non_exhaustive()
    }
}

/// One snapshot of a volume: a read-only point-in-time copy, named
/// `VOLUME@NAME`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The store's id of the snapshot layer; never changes.
    pub id: Uuid,
    /// Unique among the volume's snapshots; the same rules as volume names.
    pub name: String,
    /// The volume's size when the snapshot was taken.
    pub size_bytes: u64,
    /// RFC 3339 in UTC with second precision.
    pub created_at: String,
    /// Host NQNs that may read it over NVMe/TCP, as its own subsystem
    /// (`basalt snapshot attach`); absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_hosts: Vec<String>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl SnapshotRecord {
    /// A record for a snapshot taken at `now`.
    pub fn new(id: Uuid, name: impl Into<String>, size_bytes: u64, now: SystemTime) -> Self {
        SnapshotRecord {
            id,
            name: name.into(),
            size_bytes,
            created_at: humantime::format_rfc3339_seconds(now).to_string(),
            nvme_hosts: Vec::new(),
            unknown: serde_json::Map::new(),
        }
    }
}

/// Where a clone's data comes from until it is flattened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CloneSource {
    /// The volume the snapshot belongs to (its name cannot be reused while
    /// the snapshot exists: a volume with snapshots is not deleted).
    pub volume: String,
    pub snapshot: String,
    /// The snapshot's id ([`SnapshotRecord::id`]).
    pub snapshot_id: Uuid,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl Reencryption {
    pub fn new(snapshot_id: Uuid, encrypted: bool) -> Self {
        Reencryption {
            snapshot_id,
            encrypted,
            unknown: serde_json::Map::new(),
        }
    }
}

impl CloneSource {
    pub fn new(volume: impl Into<String>, snapshot: impl Into<String>, snapshot_id: Uuid) -> Self {
        CloneSource {
            volume: volume.into(),
            snapshot: snapshot.into(),
            snapshot_id,
            unknown: serde_json::Map::new(),
        }
    }
}

impl VolumeRecord {
    /// A record for a new volume created at `now`.
    pub fn new(id: Uuid, name: impl Into<String>, size_bytes: u64, now: SystemTime) -> Self {
        VolumeRecord {
            id,
            name: name.into(),
            size_bytes,
            created_at: humantime::format_rfc3339_seconds(now).to_string(),
            nvme_hosts: Vec::new(),
            nvme_host_keys: Default::default(),
            iscsi_initiators: Vec::new(),
            iscsi_chap: Default::default(),
            replicas: None,
            snapshots: Vec::new(),
            clone_of: None,
            qos: Default::default(),
            project: None,
            volume_type: None,
            encrypted: false,
            wrapped_key: None,
            compression: None,
            reencryption: None,
            unknown: serde_json::Map::new(),
        }
    }

    /// The snapshot named `name`, if the volume has one.
    pub fn snapshot(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots.iter().find(|s| s.name == name)
    }

    /// The JSON stored as the record's value.
    pub fn to_json(&self) -> String {
        // Serialising plain strings, numbers and JSON values cannot fail.
        serde_json::to_string(self).expect("VolumeRecord serialises to JSON")
    }

    /// Parses a stored value; `key` only names the record in the error.
    pub fn from_json(key: &str, json: &str) -> Result<Self, crate::CatalogError> {
        serde_json::from_str(json).map_err(|e| crate::CatalogError::Corrupt {
            key: key.to_string(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip() {
        let rec = VolumeRecord::new(Uuid::new_v4(), "vol-1", 1 << 30, SystemTime::UNIX_EPOCH);
        assert_eq!(rec.created_at, "1970-01-01T00:00:00Z");
        let back = VolumeRecord::from_json("vol-1", &rec.to_json()).unwrap();
        assert_eq!(back, rec);
    }

    #[test]
    fn snapshots_and_clone_sources_round_trip() {
        let mut rec = VolumeRecord::new(Uuid::new_v4(), "vol-1", 1 << 30, SystemTime::UNIX_EPOCH);
        assert!(!rec.to_json().contains("snapshots"), "absent when empty");
        let mut snap = SnapshotRecord::new(
            Uuid::new_v4(),
            "before-upgrade",
            1 << 30,
            SystemTime::UNIX_EPOCH,
        );
        snap.nvme_hosts
            .push("nqn.2014-08.org.nvmexpress:uuid:backup".into());
        rec.snapshots.push(snap);
        rec.clone_of = Some(CloneSource {
            volume: "golden".into(),
            snapshot: "v1".into(),
            snapshot_id: Uuid::new_v4(),
            unknown: serde_json::Map::new(),
        });
        let back = VolumeRecord::from_json("vol-1", &rec.to_json()).unwrap();
        assert_eq!(back, rec);
        assert!(back.snapshot("before-upgrade").is_some());
    }

    #[test]
    fn unknown_fields_survive_a_rewrite() {
        let json = r#"{"id":"67e55044-10b1-426f-9247-bb680e5fe0c8","name":"a","size_bytes":4096,
            "created_at":"2024-01-01T00:00:00Z","qos_policy":3,"tenant":{"id":"t1"}}"#;
        let rec = VolumeRecord::from_json("a", json).unwrap();
        assert_eq!(rec.unknown.len(), 2);
        let rewritten: serde_json::Value = serde_json::from_str(&rec.to_json()).unwrap();
        assert_eq!(rewritten["qos_policy"], 3);
        assert_eq!(rewritten["tenant"]["id"], "t1");
        assert_eq!(rewritten["size_bytes"], 4096);
    }

    #[test]
    fn compression_is_optional_and_round_trips() {
        let json = r#"{"id":"67e55044-10b1-426f-9247-bb680e5fe0c8","name":"a","size_bytes":4096,
            "created_at":"2024-01-01T00:00:00Z"}"#;
        let mut rec = VolumeRecord::from_json("a", json).unwrap();
        assert_eq!(rec.compression, None, "records from before it load");
        assert!(!rec.to_json().contains("compression"), "absent when none");
        rec.compression = Some("zstd:3".into());
        let back = VolumeRecord::from_json("a", &rec.to_json()).unwrap();
        assert_eq!(back.compression.as_deref(), Some("zstd:3"));
        assert!(back.unknown.is_empty());
    }

    #[test]
    fn missing_required_field_is_corrupt() {
        let err = VolumeRecord::from_json("a", r#"{"name":"a"}"#).unwrap_err();
        assert!(matches!(err, crate::CatalogError::Corrupt { .. }), "{err}");
    }
}
