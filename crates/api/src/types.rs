//! The JSON bodies of the REST API, shared by the server and its clients
//! (the `basalt` CLI). Field names are the wire format: add fields, never
//! rename them; clients ignore fields they do not know.

use basalt_volume::{parse_size, NodeView, ReplicaStatus, SnapshotInfo, StoreStatus, VolumeInfo};
use serde::{de, Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use uuid::Uuid;

pub use crate::tenancy_types::{
    CreateNbdKey, CreateProject, CreateToken, CreateVolumeType, CreatedNbdKey, CreatedToken,
    NbdKey, NbdKeyList, Project, ProjectList, QuotaSet, Retype, SetDefaultType, Token, TokenList,
    VolumeType, VolumeTypeList,
};

/// A volume, as returned by the volume endpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Volume {
    pub name: String,
    pub id: Uuid,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub created_at: String,
    /// Connections to the volume on the node that answers.
    pub open_connections: usize,
    /// In a cluster (`GET /api/v1/volumes/{name}` only): the other nodes
    /// with connections to the volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections_elsewhere: Vec<NodeConnections>,
    /// Host NQNs attached to the volume for NVMe/TCP.
    #[serde(default)]
    pub nvme_hosts: Vec<String>,
    /// Those that must authenticate in-band (DH-HMAC-CHAP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_hosts_dhchap: Vec<String>,
    /// Initiator IQNs attached to the volume for iSCSI.
    #[serde(default)]
    pub iscsi_initiators: Vec<String>,
    /// Those that must authenticate with CHAP at login.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iscsi_initiators_chap: Vec<String>,
    /// Desired number of replicas (clustered volumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas_wanted: Option<u32>,
    /// The volume's replicas and their state (clustered volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<Replica>,
    /// The snapshot it was cloned from, `VOLUME@SNAPSHOT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<String>,
    /// Names of its snapshots, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<String>,
    /// QoS limits, Cinder QoS key → value (absent: unlimited).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub qos: BTreeMap<String, u64>,
    /// Seconds its operations waited for QoS admission on this node.
    #[serde(default)]
    pub throttled_seconds: f64,
    /// The project it belongs to (absent: cluster-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Its volume type (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
    /// A clone, or a volume being re-encrypted, being flattened through
    /// this node: how far (absent otherwise, and once it is detached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flatten: Option<FlattenStatus>,
    /// Being re-encrypted after a retype between encrypted and plain
    /// types: new writes are under the new key, and flattening the volume
    /// reseals the rest (`encrypted` already says the outcome).
    #[serde(default)]
    pub reencrypting: bool,
    /// Its data is encrypted at rest (AES-256-XTS).
    #[serde(default)]
    pub encrypted: bool,
    /// The codec its cold data is kept compressed with (`lz4`, `zstd`,
    /// `zstd:LEVEL`); null: not compressed.
    #[serde(default)]
    pub compression: Option<String>,
    /// Logical bytes of its own data kept compressed on this node.
    #[serde(default)]
    pub packed_bytes: u64,
    /// Bytes the compressed records of that data take.
    #[serde(default)]
    pub packed_stored_bytes: u64,
    /// `packed_bytes / packed_stored_bytes` (1.0 while nothing is packed).
    #[serde(default = "one")]
    pub compression_ratio: f64,
}

fn one() -> f64 {
    1.0
}

/// How far a clone's flattening has come.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlattenStatus {
    /// The end of the last window copied.
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Bytes copied into the clone so far.
    pub copied_bytes: u64,
    /// Seconds since the last window ended.
    pub idle_seconds: f64,
}

/// A snapshot, as returned by the snapshot endpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub volume: String,
    pub name: String,
    pub id: Uuid,
    /// The volume's size when it was taken.
    pub size_bytes: u64,
    pub created_at: String,
    /// Bytes written while it was the volume's newest layer.
    pub written_bytes: u64,
    /// Bytes no other layer reads: what deleting it frees.
    pub exclusive_bytes: u64,
    /// Volumes cloned from it.
    #[serde(default)]
    pub clones: Vec<String>,
    /// Connections reading it (NBD export `VOLUME@SNAPSHOT`, NVMe/TCP).
    #[serde(default)]
    pub open_connections: usize,
    /// Hosts that may read it over NVMe/TCP, as its own write-protected
    /// subsystem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_hosts: Vec<String>,
    /// Its data is encrypted at rest: as its volume's, unless it was taken
    /// before the volume was re-encrypted (it keeps the key it had).
    #[serde(default)]
    pub encrypted: bool,
}

impl From<SnapshotInfo> for Snapshot {
    fn from(s: SnapshotInfo) -> Self {
        Snapshot {
            volume: s.volume,
            name: s.name,
            id: s.id,
            size_bytes: s.size_bytes,
            created_at: s.created_at,
            written_bytes: s.written_bytes,
            exclusive_bytes: s.exclusive_bytes,
            clones: s.clones,
            open_connections: s.open_connections,
            nvme_hosts: s.nvme_hosts,
            encrypted: s.encrypted,
        }
    }
}

/// `GET /api/v1/snapshots`, `GET /api/v1/volumes/{name}/snapshots`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// `POST /api/v1/volumes/{name}/snapshots`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    pub name: String,
}

/// `POST /api/v1/volumes/{name}/flatten`: the window to copy. The clone
/// is detached by the call whose window reaches its end, if nothing is
/// left to copy.
pub type FlattenVolume = VolumeWindow;

/// What a flatten call did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlattenResult {
    pub volume: String,
    pub offset: u64,
    pub length: u64,
    /// Bytes copied into the clone (4 KiB blocks it read from its source).
    pub copied_bytes: u64,
    /// The clone no longer depends on its source.
    pub detached: bool,
}

/// One range of a diff.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffExtent {
    pub offset: u64,
    pub length: u64,
    /// The newer side reads data here; `false`: it reads zeros.
    pub data: bool,
}

/// `GET /api/v1/volumes/{name}/diff`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeDiffBody {
    pub volume: String,
    /// `VOL@SNAP` the diff starts from; absent: from an empty volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `VOL@SNAP` or the volume's name (its current content).
    pub to: String,
    /// The size of `to`.
    pub size_bytes: u64,
    /// Bytes of the ranges with `data: true`.
    pub data_bytes: u64,
    pub extents: Vec<DiffExtent>,
}

/// `POST /api/v1/volumes/{name}/rollback`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    /// The snapshot of this volume to return to.
    pub snapshot: String,
    /// Disconnect the volume's clients first (else: refused while any).
    #[serde(default)]
    pub force: bool,
}

/// One replica of a clustered volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub node: String,
    pub primary: bool,
    /// `in-sync`, `out-of-sync` or `faulty`.
    pub state: String,
    pub epoch: u64,
    /// Copied so far while the replica is resynced (reported by the
    /// primary's node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_percent: Option<u8>,
    /// Bytes of regions still to copy while the replica is resynced
    /// (reported by the primary's node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_remaining_bytes: Option<u64>,
}

/// Connections to a volume through one node of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeConnections {
    pub node: String,
    pub connections: usize,
}

impl From<ReplicaStatus> for Replica {
    fn from(r: ReplicaStatus) -> Self {
        Replica {
            node: r.node,
            primary: r.primary,
            state: r.state,
            epoch: r.epoch,
            resync_percent: r.resync_percent,
            resync_remaining_bytes: r.resync_remaining_bytes,
        }
    }
}

impl From<VolumeInfo> for Volume {
    fn from(v: VolumeInfo) -> Self {
        let compression_ratio = v.compression_ratio();
        Volume {
            name: v.name,
            id: v.id,
            size_bytes: v.size_bytes,
            allocated_bytes: v.allocated_bytes,
            created_at: v.created_at,
            open_connections: v.open_connections,
            connections_elsewhere: v
                .connections_elsewhere
                .into_iter()
                .map(|(node, connections)| NodeConnections { node, connections })
                .collect(),
            nvme_hosts: v.nvme_hosts,
            nvme_hosts_dhchap: v.nvme_hosts_dhchap,
            iscsi_initiators: v.iscsi_initiators,
            iscsi_initiators_chap: v.iscsi_initiators_chap,
            replicas_wanted: v.replicas_wanted,
            replicas: v.replicas.into_iter().map(Replica::from).collect(),
            clone_of: v.clone_of,
            snapshots: v.snapshots,
            qos: v.qos.0,
            throttled_seconds: v.throttled.as_secs_f64(),
            project: v.project,
            volume_type: v.volume_type,
            encrypted: v.encrypted,
            reencrypting: v.reencrypting,
            compression: v.compression,
            packed_bytes: v.packed_bytes,
            packed_stored_bytes: v.packed_stored_bytes,
            compression_ratio,
            flatten: v.flatten.map(|f| FlattenStatus {
                done_bytes: f.done_bytes,
                total_bytes: f.total_bytes,
                copied_bytes: f.copied_bytes,
                idle_seconds: f.updated.elapsed().as_secs_f64(),
            }),
        }
    }
}

/// `GET /api/v1/volumes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

/// `GET /api/v1/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub capacity_bytes: u64,
    pub provisioned_bytes: u64,
    pub allocated_bytes: u64,
    pub overcommit_ratio: f64,
    pub volume_count: usize,
    pub extent_size: u64,
    /// In a cluster: volumes with fewer replicas in sync than wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes_degraded: Option<usize>,
    /// In a cluster: volumes with a replica being resynced or rebuilt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes_resyncing: Option<usize>,
    /// Store table entries that failed their checksum at the last open.
    #[serde(default)]
    pub quarantined_entries: u64,
    /// The store checks a CRC32C of every 4 KiB block it reads.
    #[serde(default)]
    pub data_checksums: bool,
    /// Reads answered with an error because a block failed its checksum.
    #[serde(default)]
    pub checksum_errors: u64,
    /// Logical bytes of volume data kept compressed.
    #[serde(default)]
    pub packed_bytes: u64,
    /// Bytes the compressed records of that data take.
    #[serde(default)]
    pub packed_stored_bytes: u64,
    /// Bytes of the store extents holding compressed records (part of
    /// `allocated_bytes`).
    #[serde(default)]
    pub pack_extent_bytes: u64,
    /// `packed_bytes / packed_stored_bytes` (1.0 while nothing is packed).
    #[serde(default = "one")]
    pub compression_ratio: f64,
}

/// What a scrub of a volume found: this node's copy checked against its
/// checksums and, in a cluster, the replicas compared.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScrubResult {
    pub volume: String,
    /// The window scrubbed.
    pub offset: u64,
    pub length: u64,
    /// Bytes of this node's copy read and checked (allocated extents).
    pub bytes_checked: u64,
    /// Volume offsets of this node's 4 KiB blocks that fail their checksum.
    pub bad_blocks: Vec<u64>,
    /// False if the store keeps no data checksums (nothing was checked).
    pub data_checksums: bool,
    /// False if this node holds no copy of the volume (a cluster node
    /// without a replica: only the compare ran).
    #[serde(default = "yes")]
    pub local_copy: bool,
    /// Of `bad_blocks`, those the replica compare repaired.
    #[serde(default)]
    pub repaired_blocks: Vec<u64>,
    /// In a cluster: the compare of the volume's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaCompare>,
}

fn yes() -> bool {
    true
}

/// The compare of a replicated volume's copies in a scrub's window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaCompare {
    /// Bytes compared (every region of the window).
    pub bytes_compared: u64,
    /// Bytes compared with fewer than all replicas (one was out of sync:
    /// its resync covers whatever may differ there).
    pub bytes_partial: u64,
    /// Regions where replicas' copies differed from the primary's: being
    /// rewritten from it.
    pub differing: Vec<DifferingRegion>,
    /// Offsets of regions no replica holds a good copy of.
    pub unreadable: Vec<u64>,
}

/// A region where replicas (node names) differed from the primary's copy.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DifferingRegion {
    pub offset: u64,
    pub length: u64,
    pub replicas: Vec<String>,
}

impl From<StoreStatus> for Status {
    fn from(s: StoreStatus) -> Self {
        Status {
            capacity_bytes: s.capacity_bytes,
            provisioned_bytes: s.provisioned_bytes,
            allocated_bytes: s.allocated_bytes,
            overcommit_ratio: s.overcommit_ratio,
            volume_count: s.volume_count,
            extent_size: s.extent_size,
            volumes_degraded: s.volumes_degraded,
            volumes_resyncing: s.volumes_resyncing,
            quarantined_entries: s.quarantined_entries,
            data_checksums: s.data_checksums,
            checksum_errors: s.checksum_errors,
            packed_bytes: s.packed_bytes,
            packed_stored_bytes: s.packed_stored_bytes,
            pack_extent_bytes: s.pack_extent_bytes,
            compression_ratio: basalt_volume::compression_ratio(
                s.packed_bytes,
                s.packed_stored_bytes,
            ),
        }
    }
}

/// A size in a request: bytes as a JSON number, or a human string such as
/// `"10G"` (see `basalt_volume::size`). Serialises as the number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl de::Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a size: a number of bytes or a string like "10G""#)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("size {v} is negative")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(format!(
                    "size {v} is not a whole number of bytes; use an integer or a string like \"1.5G\""
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(SizeVisitor)
    }
}

/// `POST /api/v1/volumes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    /// Required, unless `from` is given (then: the snapshot's size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Size>,
    /// A clone of `VOLUME@SNAPSHOT`, or of `VOLUME` (snapshotted first, as
    /// `clone-NAME`): instant, copy-on-write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Replicas in a cluster (default: 3, or the node count if smaller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Accept more replicas than the cluster has active nodes: the volume
    /// is placed degraded (see docs/cluster.md, "Write quorum").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_degraded: bool,
    /// Its volume type (default: the default type, if one is set).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
    /// The project it belongs to. A project token's volumes always belong
    /// to its project (giving another is refused); a cluster-admin token's
    /// belong to none unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Encrypt its data at rest (the server needs a master key). A clone
    /// is encrypted exactly when its source is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// Keep its cold data compressed: `lz4`, `zstd`, `zstd:LEVEL` (1-19)
    /// or `off` (default: its volume type's; a clone's: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
}

/// What `POST /api/v1/volumes/{name}/compact` did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompactResult {
    pub volume: String,
    /// The codec it compressed with.
    pub compression: String,
    /// Extents (of the volume and its snapshots) compressed by this call.
    pub packed_extents: u64,
    /// Their logical bytes.
    pub packed_bytes: u64,
    /// The bytes their compressed records take.
    pub stored_bytes: u64,
    /// Extents left as they were: compressing saved less than an eighth.
    pub incompressible_extents: u64,
}

/// `POST /api/v1/keys/rotate`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyRotation {
    /// The new master key's id (8 hex digits; a digest, not the key).
    pub master_key_id: String,
    /// Data keys rewrapped with it.
    pub rewrapped: usize,
}

/// `POST /api/v1/volumes/{name}/resize`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolume {
    pub size: Size,
    #[serde(default)]
    pub allow_shrink: bool,
}

/// A window of a volume that a long operation (scrub, flatten) works on,
/// and how fast: a client covers a large volume window by window, showing
/// progress.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeWindow {
    /// Most bytes per second; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Size>,
    /// Whole extents overlapping the window are worked on; the whole
    /// volume when absent.
    #[serde(default)]
    pub offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<Size>,
}

impl VolumeWindow {
    /// The window as a byte range (to the end of any volume when no
    /// length is given), and the rate.
    pub fn range_and_rate(&self) -> (std::ops::Range<u64>, Option<u64>) {
        let end = self
            .length
            .map_or(u64::MAX, |l| self.offset.saturating_add(l.0));
        (self.offset..end, self.rate.map(|r| r.0))
    }
}

/// `POST /api/v1/volumes/{name}/scrub`: the window to scrub.
pub type ScrubVolume = VolumeWindow;

/// `POST /api/v1/volumes/{name}/compact`: the window to compact (in the
/// volume and in each of its snapshots), and how fast.
pub type CompactVolume = VolumeWindow;

/// `PUT /api/v1/volumes/{name}/qos`: the whole spec (an empty object
/// removes every limit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetQos {
    pub qos: BTreeMap<String, u64>,
}

/// `POST /api/v1/volumes/{name}/nvme-hosts`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachHost {
    pub host_nqn: String,
    /// Also make the host authenticate in-band (DH-HMAC-CHAP) with fresh
    /// secrets, returned once (volumes only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dhchap: bool,
}

/// The answer to `POST /api/v1/volumes/{name}/nvme-hosts`: the volume, and
/// with `dhchap` the secrets for `nvme connect --dhchap-secret` and
/// `--dhchap-ctrl-secret`, shown only here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttachedHost {
    #[serde(flatten)]
    pub volume: Volume,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret: Option<String>,
}

/// `POST /api/v1/volumes/{name}/iscsi-initiators`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachInitiator {
    pub initiator_iqn: String,
    /// Also make the initiator authenticate with CHAP at login, with fresh
    /// credentials returned once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chap: bool,
    /// Mutual CHAP: also give the target credentials the initiator checks
    /// (implies `chap`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mutual_chap: bool,
}

/// The answer to `POST /api/v1/volumes/{name}/iscsi-initiators`: the
/// volume, its target name, and with `chap` the credentials for `iscsiadm`
/// (`node.session.auth.*`), shown only here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttachedInitiator {
    #[serde(flatten)]
    pub volume: Volume,
    pub target_iqn: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_username_in: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_password_in: Option<String>,
}

/// The body of every error response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// One line saying what went wrong and, where possible, what to do.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_accepts_numbers_and_strings() {
        let r: ResizeVolume = serde_json::from_str(r#"{"size": "20G"}"#).unwrap();
        assert_eq!(
            r,
            ResizeVolume {
                size: Size(20 << 30),
                allow_shrink: false
            }
        );
        let r: ResizeVolume =
            serde_json::from_str(r#"{"size": 21474836480, "allow_shrink": true}"#).unwrap();
        assert_eq!(
            r,
            ResizeVolume {
                size: Size(20 << 30),
                allow_shrink: true
            }
        );
    }

    #[test]
    fn size_errors_are_readable() {
        for (body, needle) in [
            (r#"{"name":"a","size":"10X"}"#, "unknown unit"),
            (r#"{"name":"a","size":-1}"#, "negative"),
            (r#"{"name":"a","size":1.5}"#, "whole number"),
            (
                r#"{"name":"a","size":true}"#,
                "a number of bytes or a string",
            ),
            (r#"{"name":"a","size":1,"sise":2}"#, "unknown field `sise`"),
        ] {
            let err = serde_json::from_str::<CreateVolume>(body)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{body}: {err}");
        }
        // Without a size: a clone (`from`), or refused by the handler.
        let clone: CreateVolume = serde_json::from_str(r#"{"name":"a","from":"b@c"}"#).unwrap();
        assert_eq!((clone.size, clone.from.as_deref()), (None, Some("b@c")));
    }
}

/// A cluster node, as returned by the node endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub alive: bool,
    /// `active`, `draining` or `removed`.
    pub state: String,
    pub coordinator: bool,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub replicas: usize,
    pub primaries: usize,
    pub peer_addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_addr: Option<String>,
}

impl From<NodeView> for Node {
    fn from(n: NodeView) -> Self {
        Node {
            name: n.name,
            id: n.id,
            zone: n.zone,
            alive: n.alive,
            state: n.state,
            coordinator: n.coordinator,
            capacity_bytes: n.capacity_bytes,
            free_bytes: n.free_bytes,
            replicas: n.replicas,
            primaries: n.primaries,
            peer_addr: n.peer_addr,
            nbd_addr: n.nbd_addr,
            nvme_addr: n.nvme_addr,
            iscsi_addr: n.iscsi_addr,
            api_addr: n.api_addr,
        }
    }
}

/// `GET /api/v1/nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeList {
    pub nodes: Vec<Node>,
}

/// `POST /api/v1/nodes/{name}/state`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetNodeState {
    /// `active`, `draining` or `removed`.
    pub state: String,
}
