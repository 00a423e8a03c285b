//! The volume control plane of one node: validates requests, records the
//! desired state in the [`Catalog`] and converges the local [`Store`] on it.
//!
//! Invariants:
//! - The catalog is the source of truth; the store follows it. Every store
//!   volume has a catalog record with the same id and size once a mutation
//!   (or, after a crash, [`VolumeService::reconcile`]) has finished.
//! - Mutations and opens run one at a time under the service's control lock,
//!   so the capacity check, the in-use check and the change they guard cannot
//!   interleave with another mutation on this node. (A clustered catalog adds
//!   revision checks; every catalog write here is already compare-and-swap.)
//! - The sum of catalog sizes never exceeds overcommit ratio × store capacity
//!   through this service.
//!
//! Crash safety comes from the order of the two steps of each mutation, so
//! that any crash in between leaves a state `reconcile` resolves toward what
//! the catalog says:
//! - create: catalog record first, then the store volume. A crash in between
//!   leaves a record without a store volume; reconcile creates it (empty,
//!   which is what a just-created volume holds).
//! - delete: catalog record first, then the store volume. A crash in between
//!   leaves a store volume without a record; reconcile deletes it. Deleting
//!   the record first also means no client can open the volume meanwhile.
//! - resize: catalog size first, then the store. A crash in between leaves a
//!   size mismatch; reconcile resizes the store volume to the catalog size
//!   (the shrink, if it was one, was already explicitly allowed).
//!
//! If the store step fails without a crash, create and resize undo their
//! catalog change before returning the error.
//!
//! In a cluster ([`VolumeService::with_cluster`]) the service keeps only the
//! catalog: create writes the record (with the replica count), delete
//! removes it, and the cluster layer places replicas, creates and deletes
//! the local store volumes of the replicas this node holds, and serves the
//! data path; reconcile then only removes store volumes that have no
//! catalog record at all. A replicated volume only grows: resize checks
//! that every node holding a replica can provision the growth
//! ([`ClusterVolumes::check_grow`]), writes the catalog size, then has the
//! cluster layer record it for the replicas ([`ClusterVolumes::grow`]; the
//! coordinator converges the replicas' size on the catalog should that step
//! be lost). Shrinking a replicated volume is refused.

use crate::clients::{ClientDisconnect, Clients};
use crate::error::VolumeError;
use crate::size::format_size;
use crate::tenancy::Growth;
use crate::{BlockIo, VolumeHandle, VolumeStats};
use basalt_catalog::{Catalog, CatalogError, Versioned, VolumeRecord, MAX_VOLUME_NAME_LEN};
use basalt_store::{Store, StoreError, VolumeId, VolumeUsage, BLOCK_SIZE};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

/// How far provisioned sizes may exceed the store's capacity by default.
pub const DEFAULT_OVERCOMMIT_RATIO: f64 = 2.0;

/// A per-volume gauge: metric name, help text, value.
type VolumeGauge = (&'static str, &'static str, fn(&VolumeInfo) -> u64);

/// What [`VolumeService::create_volume`] creates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NewVolume {
    pub name: String,
    /// Bytes, a multiple of 4 KiB.
    pub size: u64,
    /// Replica count; `None`: the volume type's, else the cluster's default.
    pub replicas: Option<u32>,
    /// Accept more replicas than the cluster has active nodes.
    pub allow_degraded: bool,
    /// The project it belongs to; `None`: cluster-wide.
    pub project: Option<String>,
    /// Its volume type; `None`: the default type, if one is set.
    pub volume_type: Option<String>,
    /// Encrypt its data at rest (needs the server's master key).
    pub encrypted: bool,
    /// Keep its cold data compressed: `lz4`, `zstd`, `zstd:LEVEL` or `off`;
    /// `None`: its volume type's, else none.
    pub compression: Option<String>,
}

/// A volume as the control plane reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeInfo {
    pub name: String,
    pub id: VolumeId,
    /// Provisioned size.
    pub size_bytes: u64,
    /// Bytes of store extents the volume holds (thin provisioning).
    pub allocated_bytes: u64,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// Open handles, i.e. frontend connections to the volume, on this
    /// node.
    pub open_connections: usize,
    /// In a cluster, the other nodes with connections to the volume and
    /// how many each (filled by [`VolumeService::get`] only).
    pub connections_elsewhere: Vec<(String, usize)>,
    /// Host NQNs attached to the volume (NVMe/TCP access).
    pub nvme_hosts: Vec<String>,
    /// Those of them that must authenticate (DH-HMAC-CHAP).
    pub nvme_hosts_dhchap: Vec<String>,
    /// Initiator IQNs attached to the volume (iSCSI access).
    pub iscsi_initiators: Vec<String>,
    /// Those of them that must authenticate (CHAP).
    pub iscsi_initiators_chap: Vec<String>,
    /// Desired replica count (clustered volumes only).
    pub replicas_wanted: Option<u32>,
    /// Where the replicas are and their state (clustered volumes only).
    pub replicas: Vec<ReplicaStatus>,
    /// The snapshot it was cloned from, as `VOLUME@SNAPSHOT`.
    pub clone_of: Option<String>,
    /// Its snapshots, oldest first.
    pub snapshots: Vec<String>,
    /// Its QoS limits (empty: unlimited).
    pub qos: crate::qos::QosSpec,
    /// Time its operations waited for QoS admission on this node.
    pub throttled: std::time::Duration,
    /// The project it belongs to (`None`: cluster-wide).
    pub project: Option<String>,
    /// The volume type it was created or last retyped with.
    pub volume_type: Option<String>,
    /// A clone (or a volume being re-encrypted) being flattened through
    /// this node: how far.
    pub flatten: Option<crate::snapshots::FlattenProgress>,
    /// Being re-encrypted (a retype between encrypted and plain types):
    /// `basalt volume flatten` finishes it.
    pub reencrypting: bool,
    /// Its data is encrypted at rest.
    pub encrypted: bool,
    /// The codec its cold data is kept compressed with (`None`: none).
    pub compression: Option<String>,
    /// Logical bytes of its own data kept compressed on this node, and the
    /// bytes their compressed records take.
    pub packed_bytes: u64,
    pub packed_stored_bytes: u64,
}

impl VolumeInfo {
    /// `packed_bytes / packed_stored_bytes`; 1.0 while nothing is packed.
    pub fn compression_ratio(&self) -> f64 {
        compression_ratio(self.packed_bytes, self.packed_stored_bytes)
    }
}

/// Logical bytes over the bytes they take compressed; 1.0 when nothing is.
pub fn compression_ratio(packed_bytes: u64, packed_stored_bytes: u64) -> f64 {
    if packed_stored_bytes == 0 {
        1.0
    } else {
        packed_bytes as f64 / packed_stored_bytes as f64
    }
}

/// The node's store as the control plane reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreStatus {
    pub capacity_bytes: u64,
    /// Sum of the volumes' provisioned sizes.
    pub provisioned_bytes: u64,
    /// Bytes of extents in use by volumes.
    pub allocated_bytes: u64,
    pub overcommit_ratio: f64,
    pub volume_count: usize,
    pub extent_size: u64,
    /// In a cluster: volumes with fewer replicas in sync than wanted.
    pub volumes_degraded: Option<usize>,
    /// In a cluster: volumes with a replica being copied to.
    pub volumes_resyncing: Option<usize>,
    /// Store table entries that failed their checksum at the last open
    /// (quarantined: never trusted, never reused).
    pub quarantined_entries: u64,
    /// The store checks a CRC32C of every 4 KiB block it reads.
    pub data_checksums: bool,
    /// Reads that found a block not holding what was written to it since
    /// the server started (answered with an error, never with the data).
    pub checksum_errors: u64,
    /// Logical bytes kept compressed, and the bytes their compressed
    /// records take (the compression ratio is the first over the second).
    pub packed_bytes: u64,
    pub packed_stored_bytes: u64,
    /// Bytes of the extents holding compressed records.
    pub pack_extent_bytes: u64,
}

/// What [`VolumeService::reconcile`] changed in the store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReconcileReport {
    /// Volumes created in the store because the catalog had them.
    pub created: Vec<String>,
    /// Volumes resized in the store to their catalog size.
    pub resized: Vec<String>,
    /// Store volumes deleted because the catalog has no record of them.
    pub deleted_orphans: Vec<VolumeId>,
    /// Volumes that could not be converged, with the reason.
    pub failed: Vec<(String, String)>,
}

impl ReconcileReport {
    /// True if the store already matched the catalog.
    pub fn is_clean(&self) -> bool {
        self.created.is_empty()
            && self.resized.is_empty()
            && self.deleted_orphans.is_empty()
            && self.failed.is_empty()
    }
}

/// Holds the cluster's provisioning lock until dropped
/// ([`ClusterVolumes::lock_provisioning`]).
pub type ProvisioningGuard = Box<dyn Send>;

/// A snapshot layer operation of a replicated volume, asked of its
/// primary ([`ClusterVolumes::layer_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRequest {
    /// Take snapshot `id` (the catalog's snapshot UUID, the layer's id in
    /// every replica's store).
    Snapshot(uuid::Uuid),
    /// Delete snapshot `id` on every replica.
    Delete(uuid::Uuid),
    /// Make the volume read as snapshot `id` (its size is kept).
    Rollback(uuid::Uuid),
}

/// What the cluster layer provides to the volume service of a clustered
/// node: the replicated data path and replica placement. In a cluster the
/// service only keeps the catalog; the cluster layer places replicas and
/// converges each node's store on the placement.
pub trait ClusterVolumes: Send + Sync {
    /// The replicated data path of `record`'s volume (served by its primary,
    /// wherever it runs). With `cipher` (an encrypted volume), writes leave
    /// this node as its ciphertext and reads are decrypted here, so the
    /// peer link and every replica carry ciphertext only.
    fn open(
        &self,
        record: &VolumeRecord,
        cipher: Option<Arc<basalt_crypt::BlockCipher>>,
    ) -> Result<Arc<dyn BlockIo>, VolumeError>;
    /// Snapshot `snapshot` (its layer id; `size` bytes) of `record`'s
    /// volume, read-only, read from the primary's copy: the export of a
    /// snapshot through a node that holds no replica of it. With `cipher`
    /// (an encrypted volume), its ciphertext is decrypted here.
    fn open_snapshot(
        &self,
        record: &VolumeRecord,
        snapshot: uuid::Uuid,
        size: u64,
        cipher: Option<Arc<basalt_crypt::BlockCipher>>,
    ) -> Result<Arc<dyn BlockIo>, VolumeError>;
    /// Replicas of a volume created without an explicit count.
    fn default_replicas(&self) -> u32;
    /// The replicas of `record`'s volume as placed now (empty while not yet
    /// placed).
    fn replicas(&self, record: &VolumeRecord) -> Vec<ReplicaStatus>;
    /// Reads this node's primaries asked of another replica because their
    /// own copy failed its checksum (read repair), since the start.
    fn read_repairs(&self) -> u64 {
        0
    }
    /// Replica compares since the start: (complete background passes of
    /// volumes this node is primary of, regions found differing).
    fn replica_compares(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Whether this node is the primary of volume `id` as it knows now,
    /// from memory (cheap: polled by the NVMe/TCP target for its ANA
    /// state); `None` while the volume is unknown or not placed.
    fn is_local_primary(&self, id: uuid::Uuid) -> Option<bool>;
    /// The id of the node that is volume `id`'s primary as this node knows
    /// it now, from memory (cheap); `None` while unknown or not placed.
    fn primary_node(&self, id: uuid::Uuid) -> Option<u32> {
        let _ = id;
        None
    }
    /// Where the frontends of every node not removed from the cluster are
    /// reached (this node's included), from memory (cheap: polled by the
    /// iSCSI target's watchdog).
    fn portals(&self) -> Vec<NodePortal> {
        Vec::new()
    }
    /// The other nodes that have `record`'s volume open (frontend
    /// connections, NVMe controllers, exports), with how many opens each,
    /// as they published them (an open is published within one etcd
    /// write of it).
    fn clients_elsewhere(&self, record: &VolumeRecord)
        -> Result<Vec<(String, usize)>, VolumeError>;
    /// Asks every other node to drop its clients of `record`'s volume and
    /// waits (up to `wait`) until none has it open; how many opens it saw
    /// go. Fails with [`VolumeError::InUseElsewhere`] if some stay.
    fn disconnect_elsewhere(
        &self,
        record: &VolumeRecord,
        wait: std::time::Duration,
    ) -> Result<usize, VolumeError>;
    /// Every node of the cluster.
    fn nodes(&self) -> Result<Vec<NodeView>, VolumeError>;
    /// Changes a node's administrative state: `active`, `draining` (its
    /// replicas move away online) or `removed` (its replicas are rebuilt
    /// elsewhere; the node may not rejoin).
    fn set_node_state(&self, name: &str, state: &str) -> Result<(), VolumeError>;
    /// Waits for the cluster-wide provisioning lock, held until the guard is
    /// dropped. A create or grow holds it from its check
    /// ([`ClusterVolumes::check_create`], [`ClusterVolumes::check_grow`])
    /// until its new size is in the catalog, so that creates and grows
    /// through different nodes are checked one after the other.
    fn lock_provisioning(&self) -> Result<ProvisioningGuard, VolumeError>;
    /// Fails unless every node holding a replica of `record`'s volume can
    /// provision it at `size` bytes (growth within the node's limit of
    /// capacity × overcommit ratio, as on a single node).
    fn check_grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError>;
    /// Fails unless enough nodes can provision a new volume of `size` bytes
    /// for its `replicas` copies (or for one copy per active node when the
    /// cluster has fewer; a node that is down counts, so creation while a
    /// node is down succeeds degraded), after the volumes already in the
    /// catalog but not placed yet took their room. Placement applies the
    /// same limits, so a node is never overfilled either way.
    /// `allow_degraded`: more replicas than active nodes are accepted (the
    /// missing ones are placed when nodes join); else refused with
    /// [`VolumeError::TooFewNodes`], which states the consequence.
    fn check_create(
        &self,
        name: &str,
        size: u64,
        replicas: u32,
        allow_degraded: bool,
    ) -> Result<(), VolumeError>;
    /// Grows the volume's replicas to `size` bytes (already the catalog's
    /// size): every node holding a replica grows its local copy, and the
    /// new blocks are served once the primary has grown (see
    /// `basalt_replication`'s `Node`). Idempotent.
    fn grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError>;
    /// Carries out `req` on `record`'s volume at one point of its
    /// replication stream on every replica: answered once the primary and
    /// every in-sync replica did it durably.
    fn layer_request(&self, record: &VolumeRecord, req: LayerRequest) -> Result<(), VolumeError>;
    /// Flattens `range` (bytes) of clone `record` on every replica that
    /// holds the volume's current content, at most `rate` bytes per second
    /// on each: each copies into its copy the blocks it reads through the
    /// clone's source snapshot, and a copy that reads nothing through it
    /// any more is detached from it. Reports what the primary's copy did.
    fn flatten(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<basalt_store::FlattenReport, VolumeError>;
    /// Compresses the extents of `record`'s volume and of its snapshots
    /// whose first byte lies in `range` (bytes) now, hot ones too, on
    /// every replica that holds its current content (one being copied to
    /// gets what the copy writes, which its node's compactor packs once
    /// cold), at most `rate` bytes per second on each, with the codec each
    /// replica's node keeps it compressed with. Reports what the primary's
    /// copy did; `progress(done, total)` in bytes.
    fn compact(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<basalt_store::CompactReport, VolumeError>;
    /// Compares every in-sync replica's copy of `range` (bytes) with the
    /// primary's, region by region at the same point of the replication
    /// stream, at most `rate` bytes per second; copies that differ are
    /// rewritten from the primary's (whose read verified its checksums or
    /// was repaired). `progress(done, total)` in bytes.
    fn compare_replicas(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<crate::scrub::ReplicaComparison, VolumeError>;
}

/// A cluster node as `node list` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub id: u32,
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
    pub nbd_addr: Option<String>,
    pub nvme_addr: Option<String>,
    pub iscsi_addr: Option<String>,
    pub api_addr: Option<String>,
}

/// Where one node's frontends are reached, as the node registry says
/// ([`ClusterVolumes::portals`]): what discovery hands to initiators and
/// ALUA reports as the node's target port group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePortal {
    pub id: u32,
    /// Whether its liveness key is held (a dead node's paths are
    /// unavailable).
    pub alive: bool,
    /// Whether this is the node asking.
    pub local: bool,
    pub nvme_addr: Option<std::net::SocketAddr>,
    pub iscsi_addr: Option<std::net::SocketAddr>,
}

impl NodePortal {
    /// See [`node_port_id`].
    pub fn port_id(&self) -> u16 {
        node_port_id(self.id)
    }
}

/// The number of cluster node `node_id`'s port in every frontend's
/// multipath reports (iSCSI target port group, relative target port and
/// portal group tag; NVMe/TCP discovery port ID): distinct per node, never
/// 0 (which SPC reserves).
pub fn node_port_id(node_id: u32) -> u16 {
    // `% 0xFFFF` is at most 0xFFFE, so `+ 1` fits in a u16.
    u16::try_from(node_id % 0xFFFF + 1).unwrap_or(1)
}

/// One replica of a clustered volume, as reported by `volume show`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub node: String,
    pub primary: bool,
    /// "in-sync", "out-of-sync" or "faulty".
    pub state: String,
    pub epoch: u64,
    /// While the replica is resynced: how much is copied (known on the
    /// primary's node only).
    pub resync_percent: Option<u8>,
    /// While the replica is resynced: bytes of the regions still to copy
    /// (an upper bound: regions that read as zeros are copied without
    /// their bytes). Known on the primary's node only.
    pub resync_remaining_bytes: Option<u64>,
}

/// How a clustered volume's replicas stand against its wanted count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplicationHealth {
    pub wanted: u32,
    pub in_sync: usize,
    /// Fewer replicas in sync than wanted (missing, out of sync or faulty).
    pub degraded: bool,
    /// A replica is out of sync: the primary is copying to it (a resync
    /// after an outage, or a rebuild or move to another node).
    pub resyncing: bool,
}

impl ReplicationHealth {
    /// For a clustered volume (`wanted` is its replica count); `None` for
    /// a single-node volume.
    pub(crate) fn of(wanted: Option<u32>, replicas: &[ReplicaStatus]) -> Option<Self> {
        let wanted = wanted?;
        let in_sync = replicas.iter().filter(|r| r.state == "in-sync").count();
        Some(ReplicationHealth {
            wanted,
            in_sync,
            degraded: in_sync < wanted as usize,
            resyncing: replicas.iter().any(|r| r.state == "out-of-sync"),
        })
    }
}

/// The volume control plane of a node; see the module docs.
pub struct VolumeService {
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) cluster: Option<Arc<dyn ClusterVolumes>>,
    pub(crate) store: Arc<Store>,
    overcommit_ratio: f64,
    /// Per-volume counters, by id so a recreated name starts from zero.
    pub(crate) stats: Mutex<HashMap<VolumeId, Arc<VolumeStats>>>,
    /// Per-volume QoS throttles, shared by every open on this node.
    pub(crate) throttles: Mutex<HashMap<VolumeId, Arc<crate::qos::Throttle>>>,
    /// Serialises mutations and opens; see the module invariants.
    pub(crate) control: Mutex<()>,
    /// Clones being flattened through this node, until detached.
    pub(crate) flattening: Mutex<HashMap<VolumeId, crate::snapshots::FlattenProgress>>,
    /// The frontends, to drop a volume's clients.
    pub(crate) clients: Clients,
    /// The master key of encrypted volumes; `None`: none configured.
    pub(crate) keyring: Option<Arc<crate::encryption::Keyring>>,
}

impl std::fmt::Debug for VolumeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeService")
            .field("overcommit_ratio", &self.overcommit_ratio)
            .finish_non_exhaustive()
    }
}

/// Checks a volume name: 1–64 characters of `[A-Za-z0-9._-]`, not starting
/// with `.` or `-` (so names are safe as file names, URL path segments, NBD
/// export names and Prometheus label values).
pub fn validate_volume_name(name: &str) -> Result<(), VolumeError> {
    match name_problem(name) {
        Some(reason) => Err(VolumeError::InvalidName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// What is wrong with `name` under the rules of volume names (which
/// projects and volume types share), or `None`.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".into());
    }
    if name.len() > MAX_VOLUME_NAME_LEN {
        return Some("it is longer than 64 characters".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "{bad:?} is not allowed; use letters, digits, '.', '_' and '-'"
        ));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Some("it must not start with '.' or '-'".into());
    }
    None
}

/// Checks a volume size: more than zero and a multiple of 4 KiB.
/// Checks a host NQN: 1 to 223 printable ASCII characters without spaces.
pub fn validate_host_nqn(nqn: &str) -> Result<(), VolumeError> {
    let reason = if nqn.is_empty() {
        "empty"
    } else if nqn.len() > 223 {
        "longer than 223 bytes"
    } else if !nqn.chars().all(|c| c.is_ascii_graphic()) {
        "only printable ASCII characters without spaces are allowed"
    } else {
        return Ok(());
    };
    Err(VolumeError::InvalidHostNqn {
        nqn: nqn.to_string(),
        reason: reason.to_string(),
    })
}

pub fn validate_volume_size(size: u64) -> Result<(), VolumeError> {
    if size == 0 {
        return Err(VolumeError::InvalidSize(
            "size must be greater than 0".to_string(),
        ));
    }
    if !size.is_multiple_of(BLOCK_SIZE) {
        let below = size - size % BLOCK_SIZE;
        let above = below.checked_add(BLOCK_SIZE);
        let suggestion = match (below, above) {
            (0, Some(above)) => format!("use {above} ({})", format_size(above)),
            (below, None) => format!("use {below} ({})", format_size(below)),
            (below, Some(above)) => format!(
                "use {below} ({}) or {above} ({})",
                format_size(below),
                format_size(above)
            ),
        };
        return Err(VolumeError::InvalidSize(format!(
            "{size} bytes is not a multiple of 4096; {suggestion}"
        )));
    }
    Ok(())
}

/// Maps the catalog's outcomes onto the control plane's.
pub(crate) fn catalog_error(e: CatalogError) -> VolumeError {
    match e {
        CatalogError::NotFound(name) => VolumeError::NotFound(name),
        CatalogError::AlreadyExists(name) => VolumeError::AlreadyExists(name),
        other => VolumeError::Catalog(other),
    }
}

impl VolumeService {
    /// A service over `catalog` and `store`. Call [`VolumeService::reconcile`]
    /// before serving requests.
    pub fn new(
        catalog: Arc<dyn Catalog>,
        store: Arc<Store>,
        overcommit_ratio: f64,
    ) -> Result<Self, VolumeError> {
        if !(overcommit_ratio.is_finite() && overcommit_ratio > 0.0) {
            return Err(VolumeError::InvalidOvercommit(overcommit_ratio));
        }
        Ok(VolumeService {
            catalog,
            cluster: None,
            store,
            overcommit_ratio,
            stats: Mutex::new(HashMap::new()),
            throttles: Mutex::new(HashMap::new()),
            control: Mutex::new(()),
            flattening: Mutex::new(HashMap::new()),
            clients: Clients::default(),
            keyring: None,
        })
    }

    /// Registers a frontend whose clients [`VolumeService::disconnect`]
    /// drops.
    pub fn register_frontend(&self, frontend: Arc<dyn ClientDisconnect>) {
        self.clients.register(frontend);
    }

    /// Closes every connection this node's frontends hold on `name`, then
    /// waits (up to `wait`) until none has it open; returns how many were
    /// closed. Clients see their connection drop, as after a server crash.
    pub fn disconnect(&self, name: &str, wait: std::time::Duration) -> Result<usize, VolumeError> {
        let _control = self.control.lock();
        self.disconnect_locked(name, wait)
    }

    /// Closes the connections this node's frontends hold on `name`, and
    /// nothing else: what another node of the cluster asks of this one
    /// when it disconnects the volume (it waits for the opens to go).
    pub fn drop_clients_here(&self, name: &str) -> usize {
        self.clients.disconnect(name)
    }

    /// [`VolumeService::disconnect`] then [`VolumeService::delete`], under
    /// one hold of the control lock, so no client can open the volume in
    /// between.
    pub fn delete_disconnecting(
        &self,
        name: &str,
        wait: std::time::Duration,
    ) -> Result<usize, VolumeError> {
        let _control = self.control.lock();
        let closed = self.disconnect_locked(name, wait)?;
        self.delete_locked(name)?;
        Ok(closed)
    }

    pub(crate) fn disconnect_locked(
        &self,
        name: &str,
        wait: std::time::Duration,
    ) -> Result<usize, VolumeError> {
        let record = self.record(name)?.record;
        let id = record.id;
        let deadline = std::time::Instant::now() + wait;
        // This node's connections close while the other nodes are asked
        // to close theirs (in a cluster); then wait for both.
        let closed = self.clients.disconnect(name);
        let elsewhere = match &self.cluster {
            Some(cluster) => cluster.disconnect_elsewhere(&record, wait)?,
            None => 0,
        };
        loop {
            let handles = self.open_handles(id);
            if handles == 0 {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return Err(VolumeError::InUse {
                    name: name.to_string(),
                    handles,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if closed > 0 {
            tracing::info!(
                volume = name,
                connections = closed,
                "disconnected the volume's clients"
            );
        }
        Ok(closed + elsewhere)
    }

    /// Fails with [`VolumeError::InUseElsewhere`] if another node of the
    /// cluster has `record`'s volume open (nothing to check on a single
    /// node: [`VolumeService::open_handles`] counts every open there).
    pub(crate) fn refuse_if_open_elsewhere(
        &self,
        record: &VolumeRecord,
    ) -> Result<(), VolumeError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let nodes = cluster.clients_elsewhere(record)?;
        if nodes.is_empty() {
            return Ok(());
        }
        Err(VolumeError::InUseElsewhere {
            name: record.name.clone(),
            nodes,
        })
    }

    /// The same service as a member of a cluster: volumes are replicated by
    /// `cluster`, which also places them and manages the local replicas.
    pub fn with_cluster(mut self, cluster: Arc<dyn ClusterVolumes>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Whether volumes are replicated across a cluster.
    pub fn is_clustered(&self) -> bool {
        self.cluster.is_some()
    }

    /// The cluster this node is a member of, if any.
    pub(crate) fn cluster_volumes(&self) -> Option<&Arc<dyn ClusterVolumes>> {
        self.cluster.as_ref()
    }

    fn cluster(&self) -> Result<&Arc<dyn ClusterVolumes>, VolumeError> {
        self.cluster.as_ref().ok_or_else(|| {
            VolumeError::NotSupported(
                "this server is a single node; nodes exist in a cluster (basalt server --etcd ...)"
                    .into(),
            )
        })
    }

    /// Every node of the cluster.
    pub fn nodes(&self) -> Result<Vec<NodeView>, VolumeError> {
        self.cluster()?.nodes()
    }

    /// Sets node `name`'s administrative state (see [`ClusterVolumes`]).
    pub fn set_node_state(&self, name: &str, state: &str) -> Result<NodeView, VolumeError> {
        let cluster = self.cluster()?;
        cluster.set_node_state(name, state)?;
        cluster
            .nodes()?
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| VolumeError::NoSuchNode(name.to_string()))
    }

    /// The replicas of `name` (empty for a single-node volume).
    pub fn replicas(&self, name: &str) -> Result<Vec<ReplicaStatus>, VolumeError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Vec::new());
        };
        let record = self.record(name)?.record;
        Ok(cluster.replicas(&record))
    }

    /// Whether this node serves volume `id` as its primary: always `true`
    /// on a single node; in a cluster `false` also while the volume is
    /// not placed or being failed over (see
    /// [`ClusterVolumes::is_local_primary`]). Cheap, reads no catalog.
    pub fn is_local_primary(&self, id: uuid::Uuid) -> bool {
        match &self.cluster {
            None => true,
            Some(cluster) => cluster.is_local_primary(id).unwrap_or(false),
        }
    }

    /// The node that is volume `id`'s primary, from memory (`None` on a
    /// single node, and while not placed).
    pub fn primary_node(&self, id: uuid::Uuid) -> Option<u32> {
        self.cluster.as_ref()?.primary_node(id)
    }

    /// Where every node's frontends are reached (empty on a single node).
    pub fn portals(&self) -> Vec<NodePortal> {
        self.cluster.as_ref().map_or_else(Vec::new, |c| c.portals())
    }

    /// One frontend's addresses (`address` picks it) on the other live
    /// nodes, with their port IDs: what its discovery lists after this
    /// node's own address.
    pub fn other_live_addresses(
        &self,
        address: impl Fn(&NodePortal) -> Option<std::net::SocketAddr>,
    ) -> Vec<(std::net::SocketAddr, u16)> {
        self.portals()
            .iter()
            .filter(|n| !n.local && n.alive)
            .filter_map(|n| Some((address(n)?, n.port_id())))
            .collect()
    }

    /// The store this service manages.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn overcommit_ratio(&self) -> f64 {
        self.overcommit_ratio
    }

    pub(crate) fn stats_for(&self, id: VolumeId) -> Arc<VolumeStats> {
        self.stats.lock().entry(id).or_default().clone()
    }

    pub(crate) fn open_handles(&self, id: VolumeId) -> usize {
        self.stats
            .lock()
            .get(&id)
            .map_or(0, |stats| stats.open_handles())
    }

    /// Applies `change` to `name`'s record under the control lock and
    /// writes it back if it changed (then calls `log` with the new record,
    /// still under the lock); returns the volume as it is then. For edits
    /// of a record's own lists (attachments) that need no other check.
    pub(crate) fn edit_record(
        &self,
        name: &str,
        change: impl FnOnce(&mut VolumeRecord),
        log: impl FnOnce(&VolumeRecord),
    ) -> Result<VolumeInfo, VolumeError> {
        let control = self.control.lock();
        let current = self.record(name)?;
        let mut record = current.record.clone();
        change(&mut record);
        if record != current.record {
            self.catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
            log(&record);
        }
        drop(control);
        self.get(name)
    }

    pub(crate) fn record(&self, name: &str) -> Result<Versioned<VolumeRecord>, VolumeError> {
        self.catalog
            .get(name)
            .map_err(catalog_error)?
            .ok_or_else(|| VolumeError::NotFound(name.to_string()))
    }

    /// Fails with [`VolumeError::Overcommit`] unless `growth` more bytes fit
    /// under the provisioning limit, given `provisioned` bytes already.
    pub(crate) fn check_capacity(&self, provisioned: u64, growth: u64) -> Result<(), VolumeError> {
        let capacity = self.store.usage().capacity_bytes;
        // `as` saturates, so an absurd ratio cannot wrap the limit.
        let limit = (capacity as f64 * self.overcommit_ratio).floor() as u64;
        if (provisioned as u128) + (growth as u128) > limit as u128 {
            return Err(VolumeError::Overcommit {
                requested: growth,
                provisioned,
                limit,
                capacity,
                ratio: self.overcommit_ratio,
            });
        }
        Ok(())
    }

    pub(crate) fn provisioned(records: &[Versioned<VolumeRecord>]) -> u64 {
        records
            .iter()
            .map(|v| v.record.size_bytes)
            .fold(0u64, u64::saturating_add)
    }

    pub(crate) fn info(
        &self,
        record: &VolumeRecord,
        usage: &HashMap<VolumeId, VolumeUsage>,
    ) -> VolumeInfo {
        let usage = usage.get(&record.id);
        VolumeInfo {
            name: record.name.clone(),
            id: record.id,
            size_bytes: record.size_bytes,
            allocated_bytes: usage.map_or(0, |u| u.allocated_bytes),
            packed_bytes: usage.map_or(0, |u| u.packed_bytes),
            packed_stored_bytes: usage.map_or(0, |u| u.packed_stored_bytes),
            compression: record.compression.clone(),
            created_at: record.created_at.clone(),
            open_connections: self.open_handles(record.id),
            connections_elsewhere: Vec::new(),
            nvme_hosts: record.nvme_hosts.clone(),
            nvme_hosts_dhchap: record.nvme_host_keys.keys().cloned().collect(),
            iscsi_initiators: record.iscsi_initiators.clone(),
            iscsi_initiators_chap: record.iscsi_chap.keys().cloned().collect(),
            replicas_wanted: record.replicas,
            replicas: self
                .cluster
                .as_ref()
                .map(|c| c.replicas(record))
                .unwrap_or_default(),
            clone_of: record
                .clone_of
                .as_ref()
                .map(|c| format!("{}@{}", c.volume, c.snapshot)),
            snapshots: record.snapshots.iter().map(|s| s.name.clone()).collect(),
            qos: crate::qos::QosSpec(record.qos.clone()),
            throttled: self.throttled(record),
            project: record.project.clone(),
            volume_type: record.volume_type.clone(),
            encrypted: record.encrypted,
            flatten: (record.clone_of.is_some() || record.reencryption.is_some())
                .then(|| self.flattening.lock().get(&record.id).cloned())
                .flatten(),
            reencrypting: record.reencryption.is_some(),
        }
    }

    /// The store's usage of each volume (allocated and packed bytes).
    pub(crate) fn allocated_by_volume(&self) -> HashMap<VolumeId, VolumeUsage> {
        self.store
            .volumes()
            .into_iter()
            .map(|v| (v.id, v))
            .collect()
    }

    /// Creates volume `name` of `size` bytes (thin: nothing is allocated
    /// until written).
    pub fn create(&self, name: &str, size: u64) -> Result<VolumeInfo, VolumeError> {
        self.create_replicated(name, size, None, false)
    }

    /// Creates volume `name` with `replicas` copies (a cluster's default when
    /// `None`). Single-node: only 1 is possible. In a cluster the record is
    /// all this does; the cluster layer places the replicas. More replicas
    /// than the cluster has active nodes only with `allow_degraded`.
    pub fn create_replicated(
        &self,
        name: &str,
        size: u64,
        replicas: Option<u32>,
        allow_degraded: bool,
    ) -> Result<VolumeInfo, VolumeError> {
        self.create_volume(&NewVolume {
            name: name.to_string(),
            size,
            replicas,
            allow_degraded,
            ..NewVolume::default()
        })
    }

    /// Creates the volume `request` describes: in its project (checked
    /// against the project's quotas), with its volume type's policies (the
    /// default type's when it names none); an explicit replica count
    /// overrides the type's.
    pub fn create_volume(&self, request: &NewVolume) -> Result<VolumeInfo, VolumeError> {
        let (name, size) = (request.name.as_str(), request.size);
        validate_volume_name(name)?;
        validate_volume_size(size)?;
        let requested_compression = request
            .compression
            .as_deref()
            .map(crate::compression::record_compression)
            .transpose()?;
        if let Some(n) = request.replicas {
            if !(1..=5).contains(&n) {
                return Err(VolumeError::InvalidReplicas(n));
            }
        }
        let _control = self.control.lock();
        if self.catalog.get(name).map_err(catalog_error)?.is_some() {
            return Err(VolumeError::AlreadyExists(name.to_string()));
        }
        let project = request.project.as_deref();
        let volume_type = self.resolve_volume_type(project, request.volume_type.as_deref())?;
        let replicas = request
            .replicas
            .or(volume_type.as_ref().and_then(|t| t.replicas));
        let mut record = VolumeRecord::new(VolumeId::new_v4(), name, size, SystemTime::now());
        record.project = request.project.clone();
        if let Some(t) = &volume_type {
            record.volume_type = Some(t.name.clone());
            record.qos = t.qos.clone();
        }
        let growth = Growth {
            capacity_bytes: size,
            volumes: 1,
            snapshots: 0,
        };
        record.encrypted = request.encrypted || volume_type.as_ref().is_some_and(|t| t.encrypted);
        // The request's ("off": none), else the type's.
        record.compression = match requested_compression {
            Some(c) => c,
            None => volume_type
                .as_ref()
                .and_then(|t| t.compression.as_deref())
                .map(crate::compression::record_compression)
                .transpose()?
                .flatten(),
        };
        let codec = crate::compression::record_codec(&record);
        if codec.is_some() && self.cluster.is_none() {
            self.require_compression()?;
        }
        if let Some(cluster) = &self.cluster {
            if record.encrypted {
                // Kept in the record: each node serving the volume's
                // clients unwraps it with the master key all nodes share.
                let (key, _) = self.new_data_key()?;
                record.wrapped_key = Some(crate::encryption::key_record(&key));
            }
            let n = replicas.unwrap_or_else(|| cluster.default_replicas());
            let _provisioning = cluster.lock_provisioning()?;
            if project.is_some() {
                let records = self.catalog.list().map_err(catalog_error)?;
                self.check_quota(project, &records, growth)?;
            }
            cluster.check_create(name, size, n, request.allow_degraded)?;
            record.replicas = Some(n);
            self.catalog.insert(&record).map_err(catalog_error)?;
            // Its compression is in the record: each replica's node hands
            // it to its own store.
            tracing::info!(volume = name, id = %record.id, size = %format_size(size), replicas = n, project, compression = ?record.compression, "created replicated volume");
            return Ok(self.info(&record, &HashMap::new()));
        }
        if replicas.is_some_and(|n| n != 1) {
            return Err(VolumeError::NotSupported(
                "more than one replica needs a cluster (basalt server --etcd ...)".into(),
            ));
        }
        let records = self.catalog.list().map_err(catalog_error)?;
        self.check_quota(project, &records, growth)?;
        self.check_capacity(Self::provisioned(&records), size)?;

        let key = match record.encrypted {
            true => Some(self.new_data_key()?),
            false => None,
        };
        let revision = self.catalog.insert(&record).map_err(catalog_error)?;
        let created = match key {
            Some((wrapped, cipher)) => self
                .store
                .create_encrypted_volume(record.id, size, &wrapped, cipher),
            None => self.store.create_volume(record.id, size),
        };
        if let Err(e) = created {
            if let Err(undo) = self.catalog.delete(name, revision) {
                tracing::error!(volume = name, error = %undo,
                    "could not remove the catalog record after the store refused the volume; the next start will retry creating it");
            }
            return Err(e.into());
        }
        if codec.is_some() {
            self.store.set_compression(record.id, codec);
        }
        tracing::info!(volume = name, id = %record.id, size = %format_size(size), project, encrypted = record.encrypted, compression = ?record.compression, "created volume");
        Ok(self.info(&record, &HashMap::new()))
    }

    /// Every volume, ordered by name.
    pub fn list(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        let records = self.catalog.list().map_err(catalog_error)?;
        let allocated = self.allocated_by_volume();
        Ok(records
            .iter()
            .map(|v| self.info(&v.record, &allocated))
            .collect())
    }

    /// The volume named `name`.
    pub fn get(&self, name: &str) -> Result<VolumeInfo, VolumeError> {
        let record = self.record(name)?.record;
        let mut info = self.info(&record, &self.allocated_by_volume());
        if let Some(cluster) = &self.cluster {
            info.connections_elsewhere = cluster.clients_elsewhere(&record)?;
        }
        Ok(info)
    }

    /// Changes the size of `name` to `size`, online. Growing is checked
    /// against the provisioning limit; shrinking drops the data beyond the
    /// new size and is refused unless `allow_shrink`. Clients connected
    /// while the size changes keep the size they negotiated until they
    /// reconnect.
    pub fn resize(
        &self,
        name: &str,
        size: u64,
        allow_shrink: bool,
    ) -> Result<VolumeInfo, VolumeError> {
        validate_volume_size(size)?;
        if let Some(cluster) = &self.cluster {
            return self.grow_replicated(cluster, name, size);
        }
        let _control = self.control.lock();
        let records = self.catalog.list().map_err(catalog_error)?;
        let Some(current) = records.iter().find(|v| v.record.name == name) else {
            return Err(VolumeError::NotFound(name.to_string()));
        };
        let old_size = current.record.size_bytes;
        if size < old_size && !allow_shrink {
            return Err(VolumeError::ShrinkRefused {
                name: name.to_string(),
                current: old_size,
                requested: size,
            });
        }
        if size > old_size {
            let growth = Growth {
                capacity_bytes: size - old_size,
                ..Growth::default()
            };
            self.check_quota(current.record.project.as_deref(), &records, growth)?;
            self.check_capacity(Self::provisioned(&records), size - old_size)?;
        }
        if size != old_size {
            let mut record = current.record.clone();
            record.size_bytes = size;
            let revision = self
                .catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
            if let Err(e) = self.store.resize_volume(record.id, size) {
                record.size_bytes = old_size;
                if let Err(undo) = self.catalog.update(&record, revision) {
                    tracing::error!(volume = name, error = %undo,
                        "could not restore the catalog size after the store refused the resize; the next start will retry it");
                }
                return Err(e.into());
            }
            tracing::info!(volume = name, from = %format_size(old_size), to = %format_size(size), "resized volume");
            // `_per_gb` limits follow the size.
            self.throttle_for(&record);
        }
        drop(_control);
        self.get(name)
    }

    /// [`VolumeService::resize`] of a replicated volume: grow only.
    fn grow_replicated(
        &self,
        cluster: &Arc<dyn ClusterVolumes>,
        name: &str,
        size: u64,
    ) -> Result<VolumeInfo, VolumeError> {
        let control = self.control.lock();
        let current = self.record(name)?;
        let old_size = current.record.size_bytes;
        if size < old_size {
            return Err(VolumeError::NotSupported(format!(
                "refusing to shrink replicated volume {name:?} from {} to {}: a replicated volume can only grow",
                format_size(old_size),
                format_size(size)
            )));
        }
        let mut record = current.record.clone();
        if size > old_size {
            let _provisioning = cluster.lock_provisioning()?;
            if let Some(project) = current.record.project.as_deref() {
                let records = self.catalog.list().map_err(catalog_error)?;
                let growth = Growth {
                    capacity_bytes: size - old_size,
                    ..Growth::default()
                };
                self.check_quota(Some(project), &records, growth)?;
            }
            cluster.check_grow(&current.record, size)?;
            record.size_bytes = size;
            self.catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
        }
        // Also when the size is unchanged: finishes a grow whose second
        // step was lost (the coordinator would, within a few seconds).
        if let Err(e) = cluster.grow(&record, size) {
            tracing::warn!(volume = name, error = %e,
                "the catalog has the new size but the replicas were not told yet; the coordinator will");
        }
        if size > old_size {
            tracing::info!(volume = name, from = %format_size(old_size), to = %format_size(size), "grew replicated volume");
            // `_per_gb` limits follow the size.
            self.throttle_for(&record);
        }
        drop(control);
        self.get(name)
    }

    /// Deletes `name` and its data. Refused while a frontend has it open.
    pub fn delete(&self, name: &str) -> Result<(), VolumeError> {
        let _control = self.control.lock();
        self.delete_locked(name)
    }

    fn delete_locked(&self, name: &str) -> Result<(), VolumeError> {
        let current = self.record(name)?;
        let id = current.record.id;
        if !current.record.snapshots.is_empty() {
            return Err(VolumeError::HasSnapshots {
                volume: name.to_string(),
                snapshots: current
                    .record
                    .snapshots
                    .iter()
                    .map(|s| s.name.clone())
                    .collect(),
            });
        }
        let handles = self.open_handles(id);
        if handles > 0 {
            return Err(VolumeError::InUse {
                name: name.to_string(),
                handles,
            });
        }
        self.refuse_if_open_elsewhere(&current.record)?;
        self.catalog
            .delete(name, current.revision)
            .map_err(catalog_error)?;
        self.stats.lock().remove(&id);
        self.throttles.lock().remove(&id);
        if self.cluster.is_some() {
            // Each node's cluster layer stops its replica and frees it.
            tracing::info!(volume = name, %id, "deleted replicated volume");
            return Ok(());
        }
        self.store.set_compression(id, None);
        match self.store.delete_volume(id) {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => {
                tracing::error!(volume = name, %id, error = %e,
                    "volume removed from the catalog, but the store could not free it; the next start will retry");
                return Err(e.into());
            }
        }
        tracing::info!(volume = name, %id, "deleted volume");
        Ok(())
    }

    /// Opens `name` for a frontend; the handle counts as an open connection
    /// until dropped.
    pub fn open(&self, name: &str) -> Result<VolumeHandle, VolumeError> {
        let _control = self.control.lock();
        if let Some((volume, snapshot)) = crate::split_snapshot_name(name) {
            // A snapshot: read-only, on this node's store.
            let record = self.record(volume)?.record;
            let snap = record
                .snapshot(snapshot)
                .ok_or_else(|| VolumeError::SnapshotNotFound {
                    volume: volume.to_string(),
                    name: snapshot.to_string(),
                })?;
            if let Some(cluster) = self
                .cluster
                .as_ref()
                .filter(|_| !self.store.snapshots().iter().any(|s| s.id == snap.id))
            {
                // No replica here: read through the volume's primary.
                let cipher = match record.encrypted {
                    true => Some(
                        self.cluster_cipher(&record)?
                            .ok_or(VolumeError::Locked(name.to_string()))?,
                    ),
                    false => None,
                };
                let io = cluster.open_snapshot(&record, snap.id, snap.size_bytes, cipher)?;
                return Ok(VolumeHandle::clustered(
                    io,
                    snap.id,
                    name.to_string(),
                    self.stats_for(snap.id),
                ));
            }
            if self.cluster.is_some() && record.encrypted {
                // This node's copy holds the cluster's ciphertext.
                let cipher = self
                    .cluster_cipher(&record)?
                    .ok_or(VolumeError::Locked(name.to_string()))?;
                let local = self.store.volume(snap.id)?;
                let io = Arc::new(crate::sealed_snapshot::SealedSnapshot { local, cipher });
                return Ok(VolumeHandle::clustered(
                    io,
                    snap.id,
                    name.to_string(),
                    self.stats_for(snap.id),
                ));
            }
            let encrypted = self.snapshot_encrypted(&record, snap.id);
            let local = self.open_local(snap.id, name, encrypted)?;
            return Ok(VolumeHandle::new(
                local,
                name.to_string(),
                self.stats_for(snap.id),
            ));
        }
        let record = self.record(name)?.record;
        let throttle = self.throttle_for(&record);
        if let Some(cluster) = &self.cluster {
            let cipher = self.cluster_cipher(&record)?;
            let io = cluster.open(&record, cipher)?;
            return Ok(VolumeHandle::clustered(
                io,
                record.id,
                record.name,
                self.stats_for(record.id),
            )
            .with_throttle(throttle));
        }
        let local = self.open_local(record.id, &record.name, record.encrypted)?;
        Ok(
            VolumeHandle::new(local, record.name, self.stats_for(record.id))
                .with_throttle(throttle),
        )
    }

    /// The store's volume `id` (named `name`), refused with the volume's
    /// name if it is encrypted and locked, or if its record says encrypted
    /// and the store holds no key for it (a damaged key slot entry): its
    /// ciphertext is never served as data.
    fn open_local(
        &self,
        id: VolumeId,
        name: &str,
        encrypted: bool,
    ) -> Result<basalt_store::LocalVolume, VolumeError> {
        let local = self.store.volume(id).map_err(|e| match e {
            StoreError::Locked(_) => VolumeError::Locked(name.to_string()),
            e => e.into(),
        })?;
        if encrypted && !self.store.is_encrypted(id) {
            return Err(VolumeError::Locked(name.to_string()));
        }
        Ok(local)
    }

    /// This node's local copy of `name` (its replica in a cluster), or of
    /// snapshot `VOLUME@SNAPSHOT` (its layer in this node's replica).
    pub(crate) fn local_copy(&self, name: &str) -> Result<basalt_store::LocalVolume, VolumeError> {
        let id = match crate::split_snapshot_name(name) {
            Some((volume, snapshot)) => {
                let record = self.record(volume)?.record;
                crate::snapshots::snapshot_id(&record, snapshot)?
            }
            None => self.record(name)?.record.id,
        };
        self.store.volume(id).map_err(|e| match e {
            StoreError::NotFound(_) => {
                VolumeError::NotFound(format!("{name} (no replica on this node)"))
            }
            e => e.into(),
        })
    }

    /// CRC32C of this node's local copy of `name` (its replica in a
    /// cluster), reading the whole copy; unallocated ranges count as zeros.
    /// For checking that replicas are identical once they are in sync.
    pub fn local_digest(&self, name: &str) -> Result<(u32, u64), VolumeError> {
        let local = self.local_copy(name)?;
        let size = local.size();
        let mut crc = 0u32;
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < size {
            let n = (size - at).min(buf.len() as u64) as usize;
            local.read(at, &mut buf[..n]).map_err(|e| match e {
                // Deleted while read (its replica left this node).
                basalt_store::IoError::Gone => {
                    VolumeError::NotFound(format!("{name} (no replica on this node)"))
                }
                e => VolumeError::Cluster(format!("reading the local copy: {e}")),
            })?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            at += n as u64;
        }
        Ok((crc, size))
    }

    /// Capacity, provisioning and allocation of the node's store; in a
    /// cluster also how many volumes are degraded or resyncing.
    pub fn status(&self) -> Result<StoreStatus, VolumeError> {
        let records = self.catalog.list().map_err(catalog_error)?;
        let usage = self.store.usage();
        let (degraded, resyncing) = match &self.cluster {
            None => (None, None),
            Some(cluster) => {
                let health: Vec<ReplicationHealth> = records
                    .iter()
                    .filter_map(|v| {
                        ReplicationHealth::of(v.record.replicas, &cluster.replicas(&v.record))
                    })
                    .collect();
                (
                    Some(health.iter().filter(|h| h.degraded).count()),
                    Some(health.iter().filter(|h| h.resyncing).count()),
                )
            }
        };
        Ok(StoreStatus {
            capacity_bytes: usage.capacity_bytes,
            provisioned_bytes: Self::provisioned(&records),
            allocated_bytes: usage.allocated_bytes,
            overcommit_ratio: self.overcommit_ratio,
            volume_count: records.len(),
            extent_size: usage.extent_size,
            volumes_degraded: degraded,
            volumes_resyncing: resyncing,
            quarantined_entries: {
                let r = self.store.recovery();
                r.quarantined_extents + r.quarantined_slots
            },
            data_checksums: self.store.integrity().data_checksums,
            checksum_errors: self.store.integrity().checksum_errors,
            packed_bytes: usage.packed_bytes,
            packed_stored_bytes: usage.packed_stored_bytes,
            pack_extent_bytes: usage.pack_extent_bytes,
        })
    }

    /// Converges the store on the catalog after a start (see the module docs
    /// for the states a crash can leave). Volumes that cannot be converged
    /// are logged and reported, not fatal; a catalog failure is.
    pub fn reconcile(&self) -> Result<ReconcileReport, VolumeError> {
        let _control = self.control.lock();
        let records = self.catalog.list().map_err(catalog_error)?;
        let store_volumes = self.store.volumes();
        let in_store: HashMap<VolumeId, u64> =
            store_volumes.iter().map(|v| (v.id, v.size)).collect();
        let flattened: std::collections::HashSet<VolumeId> = store_volumes
            .iter()
            .filter(|v| v.parent.is_none())
            .map(|v| v.id)
            .collect();
        let mut report = ReconcileReport::default();

        // In a cluster the cluster layer creates the replicas this node
        // holds; only orphans (no record at all) are removed here.
        let converge = if self.cluster.is_some() {
            &[][..]
        } else {
            &records[..]
        };
        for Versioned { record, .. } in converge {
            let name = &record.name;
            let outcome = match in_store.get(&record.id) {
                None => match &record.clone_of {
                    // A clone whose store step a crash cut short.
                    Some(source) => self.store.clone_snapshot(
                        source.snapshot_id,
                        record.id,
                        Some(record.size_bytes),
                    ),
                    // Created in the catalog only: nothing was written.
                    None if record.encrypted => self
                        .new_data_key()
                        .and_then(|(key, cipher)| {
                            self.store
                                .create_encrypted_volume(record.id, record.size_bytes, &key, cipher)
                                .map_err(VolumeError::from)
                        })
                        .map_err(|e| basalt_store::StoreError::Format(e.to_string())),
                    None => self.store.create_volume(record.id, record.size_bytes),
                }
                .map(|()| report.created.push(name.clone())),
                Some(&size) if size != record.size_bytes => self
                    .store
                    .resize_volume(record.id, record.size_bytes)
                    .map(|()| report.resized.push(name.clone())),
                // A flatten detached the clone, and a stop came before its
                // record said so.
                Some(_) if record.clone_of.is_some() && flattened.contains(&record.id) => {
                    if let Err(e) = self.forget_clone_source(name) {
                        report.failed.push((name.clone(), e.to_string()));
                    }
                    Ok(())
                }
                Some(_) => Ok(()),
            };
            if let Err(e) = outcome {
                tracing::error!(volume = %name, id = %record.id, error = %e, "could not converge volume on its catalog record");
                report.failed.push((name.clone(), e.to_string()));
            }
        }
        if self.cluster.is_none() {
            self.settle_reencryptions(&records, &mut report);
        }
        // Store snapshots no record names: taken by a snapshot whose
        // catalog step a crash cut short, or deleted from the catalog
        // before the store. (A re-encryption's is named by its record.)
        let records = self.catalog.list().map_err(catalog_error)?;
        let named: std::collections::HashSet<VolumeId> = records
            .iter()
            .flat_map(|v| {
                let reencryption = v.record.reencryption.as_ref().map(|r| r.snapshot_id);
                v.record.snapshots.iter().map(|s| s.id).chain(reencryption)
            })
            .collect();
        for snap in self.store.snapshots() {
            if named.contains(&snap.id) || self.cluster.is_some() {
                continue;
            }
            match self.store.delete_snapshot(snap.id) {
                Ok(()) => report.deleted_orphans.push(snap.id),
                Err(e) => {
                    tracing::error!(id = %snap.id, error = %e, "could not delete a store snapshot that has no catalog record");
                    report.failed.push((snap.id.to_string(), e.to_string()));
                }
            }
        }
        let known: std::collections::HashSet<VolumeId> =
            records.iter().map(|v| v.record.id).collect();
        for &id in in_store.keys().filter(|id| !known.contains(id)) {
            match self.store.delete_volume(id) {
                Ok(()) => report.deleted_orphans.push(id),
                Err(e) => {
                    tracing::error!(%id, error = %e, "could not delete store volume that has no catalog record");
                    report.failed.push((id.to_string(), e.to_string()));
                }
            }
        }

        // The compactor's policy is in memory only: set at every start.
        self.apply_compression(&records);

        if report.is_clean() {
            tracing::info!(volumes = records.len(), "store matches the catalog");
        } else {
            tracing::info!(
                created = ?report.created,
                resized = ?report.resized,
                deleted_orphans = ?report.deleted_orphans,
                failed = report.failed.len(),
                "reconciled the store with the catalog"
            );
        }
        Ok(report)
    }

    /// Prometheus text exposition of per-volume I/O statistics and the
    /// store's gauges.
    pub fn render_metrics(&self) -> Result<String, VolumeError> {
        let records = self.catalog.list().map_err(catalog_error)?;
        let usage = self.store.usage();
        let allocated = self.allocated_by_volume();
        let mut out = String::new();

        let gauges: [(&str, &str, u64); 7] = [
            (
                "basalt_store_capacity_bytes",
                "Usable data capacity of the store.",
                usage.capacity_bytes,
            ),
            (
                "basalt_store_allocated_bytes",
                "Bytes of store extents allocated to volumes.",
                usage.allocated_bytes,
            ),
            (
                "basalt_store_provisioned_bytes",
                "Sum of the provisioned sizes of all volumes.",
                Self::provisioned(&records),
            ),
            ("basalt_volumes", "Number of volumes.", records.len() as u64),
            (
                "basalt_store_packed_bytes",
                "Logical bytes of volume data kept compressed.",
                usage.packed_bytes,
            ),
            (
                "basalt_store_packed_stored_bytes",
                "Bytes the compressed records of that data take.",
                usage.packed_stored_bytes,
            ),
            (
                "basalt_store_pack_extent_bytes",
                "Bytes of the store extents holding compressed records.",
                usage.pack_extent_bytes,
            ),
        ];
        for (metric, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {metric} {help}\n# TYPE {metric} gauge\n{metric} {value}"
            );
        }
        let metric = "basalt_store_compression_ratio";
        let _ = writeln!(
            out,
            "# HELP {metric} Logical bytes kept compressed over the bytes they take (1 when none are).\n# TYPE {metric} gauge\n{metric} {:.4}",
            compression_ratio(usage.packed_bytes, usage.packed_stored_bytes)
        );
        let flush = self.store.flush_stats();
        let recovery = self.store.recovery();
        let integrity = self.store.integrity();
        let store_metrics: [(&str, &str, &str, u64); 9] = [
            (
                "basalt_store_scrubbed_bytes_total",
                "counter",
                "Bytes read and checked by scrubs (background and asked for).",
                integrity.scrubbed_bytes,
            ),
            (
                "basalt_store_scrub_damaged_blocks_total",
                "counter",
                "4 KiB blocks scrubs found failing their checksum.",
                integrity.scrub_damaged_blocks,
            ),
            (
                "basalt_store_scrub_passes_total",
                "counter",
                "Complete background scrubs of a volume.",
                integrity.scrub_passes,
            ),
            (
                "basalt_store_data_checksums",
                "gauge",
                "1 if the store checks a CRC32C of every 4 KiB block it reads.",
                integrity.data_checksums as u64,
            ),
            (
                "basalt_store_checksum_errors_total",
                "counter",
                "Reads that found a block not holding what was written to it (answered with an error).",
                integrity.checksum_errors,
            ),
            (
                "basalt_store_hot_extents",
                "gauge",
                "Extents with write intent (checksums not yet durable; recomputed after a crash).",
                integrity.hot_extents,
            ),
            (
                "basalt_store_flush_requests_total",
                "counter",
                "Flushes asked of the store (FLUSH, FUA writes with metadata, control operations).",
                flush.requests,
            ),
            (
                "basalt_store_commits_total",
                "counter",
                "Journal writes with a device flush; flush requests per commit is how much group commit shares.",
                flush.commits,
            ),
            (
                "basalt_store_quarantined_entries",
                "gauge",
                "Store table entries that failed their checksum at the last open (logged; see docs/format.md).",
                recovery.quarantined_extents + recovery.quarantined_slots,
            ),
        ];
        if let Some(cluster) = &self.cluster {
            let metric = "basalt_read_repairs_total";
            let _ = writeln!(
                out,
                "# HELP {metric} Reads this node's primaries asked of an in-sync replica because their own copy failed its checksum.\n# TYPE {metric} counter\n{metric} {}",
                cluster.read_repairs()
            );
            let (passes, differing) = cluster.replica_compares();
            let metric = "basalt_replica_compare_passes_total";
            let _ = writeln!(
                out,
                "# HELP {metric} Complete background compares of the replicas of volumes this node is primary of.\n# TYPE {metric} counter\n{metric} {passes}"
            );
            let metric = "basalt_replica_compare_differing_regions_total";
            let _ = writeln!(
                out,
                "# HELP {metric} Regions where replica compares (background and asked for) found a replica's copy differing from the primary's, and rewrote it.\n# TYPE {metric} counter\n{metric} {differing}"
            );
        }
        for (metric, kind, help, value) in store_metrics {
            let _ = writeln!(
                out,
                "# HELP {metric} {help}\n# TYPE {metric} {kind}\n{metric} {value}"
            );
        }

        let per_volume: [VolumeGauge; 4] = [
            (
                "basalt_volume_size_bytes",
                "Provisioned size of the volume.",
                |v| v.size_bytes,
            ),
            (
                "basalt_volume_allocated_bytes",
                "Bytes of store extents the volume holds.",
                |v| v.allocated_bytes,
            ),
            (
                "basalt_volume_packed_bytes",
                "Logical bytes of the volume's own data kept compressed.",
                |v| v.packed_bytes,
            ),
            (
                "basalt_volume_packed_stored_bytes",
                "Bytes the compressed records of the volume's own data take.",
                |v| v.packed_stored_bytes,
            ),
        ];
        let infos: Vec<VolumeInfo> = records
            .iter()
            .map(|v| self.info(&v.record, &allocated))
            .collect();
        for (metric, help, value) in per_volume {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
            for info in &infos {
                // Names are validated to [A-Za-z0-9._-]: no label escaping needed.
                let _ = writeln!(
                    out,
                    "{metric}{{volume=\"{}\",id=\"{}\"}} {}",
                    info.name,
                    info.id,
                    value(info)
                );
            }
        }

        let metric = "basalt_volume_qos_throttled_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {metric} Time the volume's operations waited for QoS admission on this node.\n# TYPE {metric} counter"
        );
        for info in &infos {
            let _ = writeln!(
                out,
                "{metric}{{volume=\"{}\",id=\"{}\"}} {:.6}",
                info.name,
                info.id,
                info.throttled.as_secs_f64()
            );
        }

        if self.cluster.is_some() {
            render_replication(&mut out, &infos);
        } else {
            self.render_snapshot_space(&mut out, &records);
        }

        VolumeStats::render_prometheus_header(&mut out);
        for Versioned { record, .. } in &records {
            self.stats_for(record.id).render_prometheus(
                &mut out,
                &record.name,
                &record.id.to_string(),
            );
        }
        Ok(out)
    }
}

/// The replication gauges of a clustered node: per volume the replicas
/// wanted and in sync, per replica being copied the bytes left (from the
/// primary's node, the only one that knows), and the node-wide counts of
/// degraded and resyncing volumes (as `basalt status` shows them).
fn render_replication(out: &mut String, infos: &[VolumeInfo]) {
    let health: Vec<(&VolumeInfo, ReplicationHealth)> = infos
        .iter()
        .filter_map(|v| ReplicationHealth::of(v.replicas_wanted, &v.replicas).map(|h| (v, h)))
        .collect();
    let totals: [(&str, &str, usize); 2] = [
        (
            "basalt_volumes_degraded",
            "Replicated volumes with fewer replicas in sync than wanted.",
            health.iter().filter(|(_, h)| h.degraded).count(),
        ),
        (
            "basalt_volumes_resyncing",
            "Replicated volumes with a replica being resynced or rebuilt.",
            health.iter().filter(|(_, h)| h.resyncing).count(),
        ),
    ];
    for (metric, help, value) in totals {
        let _ = writeln!(
            out,
            "# HELP {metric} {help}\n# TYPE {metric} gauge\n{metric} {value}"
        );
    }
    type Gauge = (&'static str, &'static str, fn(&ReplicationHealth) -> usize);
    let per_volume: [Gauge; 2] = [
        (
            "basalt_volume_replicas_wanted",
            "Replicas the volume should have.",
            |h| h.wanted as usize,
        ),
        (
            "basalt_volume_replicas_in_sync",
            "Replicas holding every acknowledged write.",
            |h| h.in_sync,
        ),
    ];
    for (metric, help, value) in per_volume {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (info, h) in &health {
            let _ = writeln!(
                out,
                "{metric}{{volume=\"{}\",id=\"{}\"}} {}",
                info.name,
                info.id,
                value(h)
            );
        }
    }
    let metric = "basalt_volume_resync_remaining_bytes";
    let _ = writeln!(
        out,
        "# HELP {metric} Bytes of regions still to copy to a replica being resynced or rebuilt (reported by the primary's node).\n# TYPE {metric} gauge"
    );
    for (info, _) in &health {
        for r in &info.replicas {
            if let Some(left) = r.resync_remaining_bytes {
                // Node names are validated like volume names: no escaping.
                let _ = writeln!(
                    out,
                    "{metric}{{volume=\"{}\",id=\"{}\",replica=\"{}\"}} {left}",
                    info.name, info.id, r.node
                );
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use basalt_catalog::RedbCatalog;
    use basalt_store::{FormatOptions, SimDevice};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    pub(crate) struct Node {
        _dir: tempfile::TempDir,
        pub catalog: Arc<RedbCatalog>,
        pub store: Arc<Store>,
        pub service: VolumeService,
    }

    /// A node with an in-memory device of `device_size` bytes.
    fn node(device_size: u64, ratio: f64) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RedbCatalog::open(dir.path().join("catalog.redb")).unwrap());
        let device = SimDevice::new(device_size, 7);
        let store = Store::create(device, &FormatOptions::default()).unwrap();
        let service = VolumeService::new(catalog.clone(), store.clone(), ratio).unwrap();
        Node {
            _dir: dir,
            catalog,
            store,
            service,
        }
    }

    pub(crate) fn small_node() -> Node {
        node(256 * MIB, DEFAULT_OVERCOMMIT_RATIO)
    }

    #[test]
    fn create_list_get() {
        let n = small_node();
        let info = n.service.create("db-1", 64 * MIB).unwrap();
        assert_eq!((info.name.as_str(), info.size_bytes), ("db-1", 64 * MIB));
        assert_eq!((info.allocated_bytes, info.open_connections), (0, 0));
        n.service.create("a.vol_2", 4096).unwrap();
        let names: Vec<_> = n
            .service
            .list()
            .unwrap()
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["a.vol_2", "db-1"]);
        let got = n.service.get("db-1").unwrap();
        assert_eq!(got, info);
        assert!(n
            .store
            .volumes()
            .iter()
            .any(|v| v.id == info.id && v.size == 64 * MIB));
        assert!(matches!(
            n.service.get("nope"),
            Err(VolumeError::NotFound(_))
        ));
    }

    #[test]
    fn names_are_validated() {
        let n = small_node();
        let long = "x".repeat(65);
        for bad in [
            "",
            ".hidden",
            "-flag",
            "a b",
            "a/b",
            "ü",
            "a:b",
            long.as_str(),
        ] {
            let err = n.service.create(bad, 4096).unwrap_err();
            assert!(
                matches!(err, VolumeError::InvalidName { .. }),
                "{bad:?}: {err}"
            );
        }
        n.service.create(&"x".repeat(64), 4096).unwrap();
        n.service.create("0", 4096).unwrap();
        assert!(n.service.list().unwrap().len() == 2);
        assert!(
            n.store.volumes().len() == 2,
            "refused names leave nothing behind"
        );
    }

    #[test]
    fn sizes_are_validated_with_suggestions() {
        let n = small_node();
        let err = n.service.create("v", 0).unwrap_err().to_string();
        assert!(err.contains("greater than 0"), "{err}");
        let err = n.service.create("v", 10_000).unwrap_err().to_string();
        assert!(err.contains("8192") && err.contains("12288"), "{err}");
        let err = n.service.create("v", 100).unwrap_err().to_string();
        assert!(err.contains("use 4096"), "{err}");
        assert!(n.service.list().unwrap().is_empty());
    }

    #[test]
    fn duplicate_names_are_refused() {
        let n = small_node();
        let first = n.service.create("v", 4096).unwrap();
        let err = n.service.create("v", 8192).unwrap_err();
        assert!(matches!(err, VolumeError::AlreadyExists(_)), "{err}");
        assert_eq!(n.service.get("v").unwrap().id, first.id);
        assert_eq!(n.store.volumes().len(), 1);
    }

    #[test]
    fn provisioning_is_limited_by_overcommit() {
        let n = node(256 * MIB, 1.5);
        let capacity = n.service.status().unwrap().capacity_bytes;
        let limit = ((capacity as f64 * 1.5) as u64) / 4096 * 4096;
        n.service.create("big", limit - 4096).unwrap();
        n.service.create("last", 4096).unwrap();
        let err = n.service.create("over", 4096).unwrap_err();
        match &err {
            VolumeError::Overcommit {
                requested,
                provisioned,
                capacity: c,
                ratio,
                ..
            } => {
                assert_eq!(
                    (*requested, *provisioned, *c, *ratio),
                    (4096, limit, capacity, 1.5)
                );
            }
            other => panic!("expected overcommit, got {other}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("overcommit ratio 1.5"), "{msg}");
        assert!(n.service.get("over").is_err());
        // Growing is checked too; freeing space makes room again.
        let err = n.service.resize("last", 8192, false).unwrap_err();
        assert!(matches!(err, VolumeError::Overcommit { .. }), "{err}");
        n.service.delete("last").unwrap();
        n.service.resize("big", limit, false).unwrap();
    }

    #[test]
    fn invalid_overcommit_ratio_is_refused() {
        let n = small_node();
        for ratio in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = VolumeService::new(n.catalog.clone(), n.store.clone(), ratio).unwrap_err();
            assert!(matches!(err, VolumeError::InvalidOvercommit(_)), "{err}");
        }
    }

    #[test]
    fn nvme_hosts_attach_and_detach() {
        let n = small_node();
        n.service.create("v", 8 * MIB).unwrap();
        assert!(n.service.get("v").unwrap().nvme_hosts.is_empty());
        let h1 = "nqn.2014-08.org.nvmexpress:uuid:one";
        let h2 = "nqn.2014-08.org.nvmexpress:uuid:two";
        n.service.attach_host("v", h1).unwrap();
        n.service.attach_host("v", h1).unwrap();
        let info = n.service.attach_host("v", h2).unwrap();
        assert_eq!(info.nvme_hosts, vec![h1.to_string(), h2.to_string()]);
        let info = n.service.detach_host("v", h1).unwrap();
        assert_eq!(info.nvme_hosts, vec![h2.to_string()]);
        n.service.detach_host("v", h1).unwrap();
        assert_eq!(n.service.get("v").unwrap().nvme_hosts, vec![h2.to_string()]);
        assert!(matches!(
            n.service.attach_host("v", "has space"),
            Err(VolumeError::InvalidHostNqn { .. })
        ));
        assert!(matches!(
            n.service.attach_host("v", &"n".repeat(224)),
            Err(VolumeError::InvalidHostNqn { .. })
        ));
        assert!(matches!(
            n.service.attach_host("nope", h1),
            Err(VolumeError::NotFound(_))
        ));
    }

    #[test]
    fn resize_grows_and_shrinks_only_when_allowed() {
        let n = small_node();
        n.service.create("v", 8 * MIB).unwrap();
        let grown = n.service.resize("v", 16 * MIB, false).unwrap();
        assert_eq!(grown.size_bytes, 16 * MIB);
        let err = n.service.resize("v", 4 * MIB, false).unwrap_err();
        assert!(
            matches!(err, VolumeError::ShrinkRefused { current, requested, .. }
            if current == 16 * MIB && requested == 4 * MIB),
            "{err}"
        );
        assert!(err.to_string().contains("--allow-shrink"), "{err}");
        assert_eq!(n.service.get("v").unwrap().size_bytes, 16 * MIB);
        let shrunk = n.service.resize("v", 4 * MIB, true).unwrap();
        assert_eq!(shrunk.size_bytes, 4 * MIB);
        let id = shrunk.id;
        assert!(n
            .store
            .volumes()
            .iter()
            .any(|v| v.id == id && v.size == 4 * MIB));
        // Same size is a no-op; bad sizes and names are refused.
        assert_eq!(
            n.service.resize("v", 4 * MIB, false).unwrap().size_bytes,
            4 * MIB
        );
        assert!(matches!(
            n.service.resize("v", 4097, true),
            Err(VolumeError::InvalidSize(_))
        ));
        assert!(matches!(
            n.service.resize("nope", 4096, true),
            Err(VolumeError::NotFound(_))
        ));
    }

    #[test]
    fn data_survives_growth_and_is_visible_in_allocation() {
        let n = small_node();
        n.service.create("v", 8 * MIB).unwrap();
        {
            let h = n.service.open("v").unwrap();
            h.write(0, &[0xAB; 4096], true).unwrap();
        }
        n.service.resize("v", 32 * MIB, false).unwrap();
        let h = n.service.open("v").unwrap();
        assert_eq!(h.size(), 32 * MIB);
        let mut buf = vec![0u8; 4096];
        h.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0xAB));
        drop(h);
        let info = n.service.get("v").unwrap();
        assert!(info.allocated_bytes > 0, "{info:?}");
        let status = n.service.status().unwrap();
        assert_eq!(status.allocated_bytes, info.allocated_bytes);
    }

    #[test]
    fn delete_is_refused_while_open() {
        let n = small_node();
        n.service.create("v", 4 * MIB).unwrap();
        let handle = n.service.open("v").unwrap();
        assert_eq!(n.service.get("v").unwrap().open_connections, 1);
        let err = n.service.delete("v").unwrap_err();
        assert!(
            matches!(err, VolumeError::InUse { handles: 1, .. }),
            "{err}"
        );
        drop(handle);
        assert_eq!(n.service.get("v").unwrap().open_connections, 0);
        n.service.delete("v").unwrap();
        assert!(n.store.volumes().is_empty());
        assert!(n.catalog.list().unwrap().is_empty());
        assert!(matches!(
            n.service.delete("v"),
            Err(VolumeError::NotFound(_))
        ));
        assert!(matches!(n.service.open("v"), Err(VolumeError::NotFound(_))));
    }

    #[test]
    fn recreated_name_is_a_new_empty_volume() {
        let n = small_node();
        let first = n.service.create("v", 4 * MIB).unwrap();
        n.service
            .open("v")
            .unwrap()
            .write(0, &[1; 4096], true)
            .unwrap();
        n.service.delete("v").unwrap();
        let second = n.service.create("v", 4 * MIB).unwrap();
        assert_ne!(first.id, second.id);
        let mut buf = vec![0xFFu8; 4096];
        n.service.open("v").unwrap().read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn status_reports_provisioning() {
        let n = node(256 * MIB, 3.0);
        n.service.create("a", 8 * MIB).unwrap();
        n.service.create("b", GIB / 2).unwrap();
        let s = n.service.status().unwrap();
        assert_eq!(s.provisioned_bytes, 8 * MIB + GIB / 2);
        assert_eq!(s.volume_count, 2);
        assert_eq!(s.overcommit_ratio, 3.0);
        assert!(s.capacity_bytes > 0 && s.capacity_bytes <= 256 * MIB);
        assert!(s.extent_size.is_power_of_two());
    }

    #[test]
    fn reconcile_converges_the_store_on_the_catalog() {
        let n = small_node();
        n.service.create("kept", 4 * MIB).unwrap();
        n.service.create("resized", 4 * MIB).unwrap();
        assert!(n.service.reconcile().unwrap().is_clean());

        // Crash after the catalog step of a create: record without volume.
        let pending = VolumeRecord::new(VolumeId::new_v4(), "pending", 8 * MIB, SystemTime::now());
        n.catalog.insert(&pending).unwrap();
        // Crash after the catalog step of a delete: volume without record.
        let orphan = VolumeId::new_v4();
        n.store.create_volume(orphan, 4 * MIB).unwrap();
        // Crash after the catalog step of a resize: sizes differ.
        let resized = n.catalog.get("resized").unwrap().unwrap();
        let mut rec = resized.record.clone();
        rec.size_bytes = 12 * MIB;
        n.catalog.update(&rec, resized.revision).unwrap();

        let report = n.service.reconcile().unwrap();
        assert_eq!(report.created, ["pending"]);
        assert_eq!(report.resized, ["resized"]);
        assert_eq!(report.deleted_orphans, [orphan]);
        assert!(report.failed.is_empty(), "{report:?}");

        let mut store: Vec<_> = n
            .store
            .volumes()
            .into_iter()
            .map(|v| (v.id, v.size))
            .collect();
        store.sort();
        let mut catalog: Vec<_> = n
            .catalog
            .list()
            .unwrap()
            .into_iter()
            .map(|v| (v.record.id, v.record.size_bytes))
            .collect();
        catalog.sort();
        assert_eq!(store, catalog);
        assert!(n.service.reconcile().unwrap().is_clean());
        n.service.open("pending").unwrap();
    }

    #[test]
    fn volumes_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let device = SimDevice::new(256 * MIB, 3);
        let catalog_path = dir.path().join("catalog.redb");
        {
            let catalog = Arc::new(RedbCatalog::open(&catalog_path).unwrap());
            let store = Store::create(device.clone(), &FormatOptions::default()).unwrap();
            let service = VolumeService::new(catalog, store.clone(), 2.0).unwrap();
            service.create("v", 4 * MIB).unwrap();
            service
                .open("v")
                .unwrap()
                .write(8192, &[9; 4096], true)
                .unwrap();
            drop(service);
            store.close().unwrap();
        }
        let catalog = Arc::new(RedbCatalog::open(&catalog_path).unwrap());
        let store = Store::open(device).unwrap();
        let service = VolumeService::new(catalog, store, 2.0).unwrap();
        assert!(service.reconcile().unwrap().is_clean());
        let mut buf = vec![0u8; 4096];
        service.open("v").unwrap().read(8192, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 9));
    }

    #[test]
    fn metrics_expose_store_gauges_and_volumes() {
        let n = small_node();
        n.service.create("m1", 4 * MIB).unwrap();
        n.service
            .open("m1")
            .unwrap()
            .write(0, &[1; 4096], false)
            .unwrap();
        let text = n.service.render_metrics().unwrap();
        for needle in [
            "# TYPE basalt_store_capacity_bytes gauge",
            "basalt_store_provisioned_bytes 4194304",
            "basalt_volumes 1",
            "basalt_store_allocated_bytes ",
            "basalt_volume_size_bytes{volume=\"m1\"",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
        }
    }

    /// A cluster whose every volume has the replicas `replicas` returns.
    struct FakeCluster {
        replicas: fn(&str) -> Vec<ReplicaStatus>,
        /// Largest size its nodes can provision a volume at.
        max_size: u64,
        /// Sizes `grow` was called with.
        grown: Mutex<Vec<(String, u64)>>,
    }

    impl FakeCluster {
        fn new(replicas: fn(&str) -> Vec<ReplicaStatus>) -> Self {
            FakeCluster {
                replicas,
                max_size: u64::MAX,
                grown: Mutex::new(Vec::new()),
            }
        }
    }

    impl ClusterVolumes for FakeCluster {
        fn open(
            &self,
            _: &VolumeRecord,
            _: Option<Arc<basalt_crypt::BlockCipher>>,
        ) -> Result<Arc<dyn BlockIo>, VolumeError> {
            Err(VolumeError::NotSupported("fake".into()))
        }
        fn default_replicas(&self) -> u32 {
            3
        }
        fn replicas(&self, record: &VolumeRecord) -> Vec<ReplicaStatus> {
            (self.replicas)(&record.name)
        }
        fn is_local_primary(&self, _: uuid::Uuid) -> Option<bool> {
            None
        }
        fn clients_elsewhere(&self, _: &VolumeRecord) -> Result<Vec<(String, usize)>, VolumeError> {
            Ok(Vec::new())
        }
        fn disconnect_elsewhere(
            &self,
            _: &VolumeRecord,
            _: std::time::Duration,
        ) -> Result<usize, VolumeError> {
            Ok(0)
        }
        fn nodes(&self) -> Result<Vec<NodeView>, VolumeError> {
            Ok(Vec::new())
        }
        fn set_node_state(&self, _: &str, _: &str) -> Result<(), VolumeError> {
            Ok(())
        }
        fn lock_provisioning(&self) -> Result<ProvisioningGuard, VolumeError> {
            Ok(Box::new(()))
        }
        fn check_create(&self, _: &str, _: u64, _: u32, _: bool) -> Result<(), VolumeError> {
            Ok(())
        }
        fn check_grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError> {
            if size > self.max_size {
                return Err(VolumeError::ReplicaNodeFull {
                    node: "n2".into(),
                    volume: record.name.clone(),
                    requested: size - record.size_bytes,
                    provisioned: 0,
                    limit: self.max_size,
                });
            }
            Ok(())
        }
        fn grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError> {
            self.grown.lock().push((record.name.clone(), size));
            Ok(())
        }
        fn compare_replicas(
            &self,
            _: &VolumeRecord,
            _: std::ops::Range<u64>,
            _: Option<u64>,
            _: &mut dyn FnMut(u64, u64),
        ) -> Result<crate::scrub::ReplicaComparison, VolumeError> {
            Err(VolumeError::NotSupported("fake".into()))
        }
        fn layer_request(&self, _: &VolumeRecord, _: LayerRequest) -> Result<(), VolumeError> {
            Err(VolumeError::NotSupported("fake".into()))
        }
        fn flatten(
            &self,
            _: &VolumeRecord,
            _: std::ops::Range<u64>,
            _: Option<u64>,
            _: &mut dyn FnMut(u64, u64),
        ) -> Result<basalt_store::FlattenReport, VolumeError> {
            Err(VolumeError::NotSupported("fake".into()))
        }

        fn compact(
            &self,
            _: &VolumeRecord,
            _: std::ops::Range<u64>,
            _: Option<u64>,
            _: &mut dyn FnMut(u64, u64),
        ) -> Result<basalt_store::CompactReport, VolumeError> {
            Err(VolumeError::NotSupported("fake".into()))
        }

        fn open_snapshot(
            &self,
            _: &VolumeRecord,
            _: uuid::Uuid,
            _: u64,
            _: Option<Arc<basalt_crypt::BlockCipher>>,
        ) -> Result<Arc<dyn BlockIo>, VolumeError> {
            Err(VolumeError::NotSupported("fake".into()))
        }
    }

    #[test]
    fn replicated_volumes_grow_and_never_shrink() {
        let n = small_node();
        let fake = Arc::new(FakeCluster {
            max_size: 16 * MIB,
            ..FakeCluster::new(|_| Vec::new())
        });
        let service = VolumeService::new(n.catalog.clone(), n.store.clone(), 2.0)
            .unwrap()
            .with_cluster(fake.clone());
        service
            .create_replicated("r", 4 * MIB, Some(3), false)
            .unwrap();
        let grown = service.resize("r", 8 * MIB, false).unwrap();
        assert_eq!(grown.size_bytes, 8 * MIB);
        assert_eq!(service.get("r").unwrap().size_bytes, 8 * MIB);
        assert_eq!(*fake.grown.lock(), [("r".to_string(), 8 * MIB)]);
        // Shrinking is refused, with or without allow_shrink, and changes
        // nothing.
        for allow in [false, true] {
            let err = service.resize("r", 4 * MIB, allow).unwrap_err();
            assert!(matches!(err, VolumeError::NotSupported(_)), "{err}");
            assert!(err.to_string().contains("can only grow"), "{err}");
            assert!(!err.to_string().contains('\n'));
        }
        assert_eq!(service.get("r").unwrap().size_bytes, 8 * MIB);
        // A replica's node without room: refused before anything changes.
        let err = service.resize("r", 32 * MIB, false).unwrap_err();
        assert!(matches!(err, VolumeError::ReplicaNodeFull { .. }), "{err}");
        assert!(err.to_string().contains("n2"), "{err}");
        assert_eq!(service.get("r").unwrap().size_bytes, 8 * MIB);
        assert_eq!(fake.grown.lock().len(), 1);
        // The same size again re-sends it to the replicas (idempotent).
        service.resize("r", 8 * MIB, false).unwrap();
        assert_eq!(fake.grown.lock().len(), 2);
    }

    fn replica(node: &str, state: &str, left: Option<u64>) -> ReplicaStatus {
        ReplicaStatus {
            node: node.into(),
            primary: node == "n0",
            state: state.into(),
            epoch: 1,
            resync_percent: left.map(|_| 50),
            resync_remaining_bytes: left,
        }
    }

    #[test]
    fn replication_gauges_and_status_counts() {
        let n = small_node();
        let service = VolumeService::new(n.catalog.clone(), n.store.clone(), 2.0)
            .unwrap()
            .with_cluster(Arc::new(FakeCluster::new(|name| match name {
                // One replica rebuilt on n2, 3 MiB to go.
                "rebuilding" => vec![
                    replica("n0", "in-sync", None),
                    replica("n1", "in-sync", None),
                    replica("n2", "out-of-sync", Some(3 * MIB)),
                ],
                // Created while a node was down: two of three placed.
                "short" => vec![
                    replica("n0", "in-sync", None),
                    replica("n1", "in-sync", None),
                ],
                _ => vec![
                    replica("n0", "in-sync", None),
                    replica("n1", "in-sync", None),
                    replica("n2", "in-sync", None),
                ],
            })));
        for name in ["rebuilding", "short", "fine"] {
            service
                .create_replicated(name, 4 * MIB, Some(3), false)
                .unwrap();
        }
        let status = service.status().unwrap();
        assert_eq!(
            (status.volumes_degraded, status.volumes_resyncing),
            (Some(2), Some(1))
        );
        assert_eq!(n.service.status().unwrap().volumes_degraded, None);

        let text = service.render_metrics().unwrap();
        let id = |name: &str| service.get(name).unwrap().id;
        for needle in [
            "# TYPE basalt_volumes_degraded gauge\nbasalt_volumes_degraded 2\n".to_string(),
            "basalt_volumes_resyncing 1\n".to_string(),
            "# TYPE basalt_volume_replicas_wanted gauge".to_string(),
            format!(
                "basalt_volume_replicas_wanted{{volume=\"short\",id=\"{}\"}} 3\n",
                id("short")
            ),
            format!(
                "basalt_volume_replicas_in_sync{{volume=\"short\",id=\"{}\"}} 2\n",
                id("short")
            ),
            format!(
                "basalt_volume_replicas_in_sync{{volume=\"fine\",id=\"{}\"}} 3\n",
                id("fine")
            ),
            "# TYPE basalt_volume_resync_remaining_bytes gauge".to_string(),
            format!(
                "basalt_volume_resync_remaining_bytes{{volume=\"rebuilding\",id=\"{}\",replica=\"n2\"}} 3145728\n",
                id("rebuilding")
            ),
        ] {
            assert!(text.contains(&needle), "missing {needle:?} in:\n{text}");
        }
        assert_eq!(
            text.matches("basalt_volume_resync_remaining_bytes{")
                .count(),
            1
        );
        // A single node has no replication gauges at all.
        assert!(!n.service.render_metrics().unwrap().contains("replicas"));
    }

    #[test]
    fn concurrent_creates_respect_the_limit() {
        let n = Arc::new(node(64 * MIB, 1.0));
        let capacity = n.service.status().unwrap().capacity_bytes;
        let each = (capacity / 4) / 4096 * 4096;
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let n = n.clone();
                std::thread::spawn(move || n.service.create(&format!("v{i}"), each).is_ok())
            })
            .collect();
        let created = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|ok| *ok)
            .count();
        assert_eq!(created, 4);
        assert!(n.service.status().unwrap().provisioned_bytes <= capacity);
    }
}
