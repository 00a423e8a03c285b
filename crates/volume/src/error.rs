//! Errors of the volume control plane: one variant per outcome a caller (the
//! REST API, the CLI) must tell apart, each with a one-line message that says
//! what was wrong and, where there is one, what to do instead.

use crate::size::format_size;
use basalt_catalog::CatalogError;
use basalt_store::StoreError;

/// Why a volume control operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no volume named {0:?}")]
    NotFound(String),

    #[error("a volume named {0:?} already exists")]
    AlreadyExists(String),

    #[error("invalid volume name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },

    #[error("invalid volume size: {0}")]
    InvalidSize(String),

    #[error("invalid host NQN {nqn:?}: {reason}")]
    InvalidHostNqn { nqn: String, reason: String },

    #[error("invalid iSCSI initiator name {name:?}: {reason}")]
    InvalidInitiatorName { name: String, reason: String },

    #[error(
        "not enough capacity: {} requested with {} already provisioned exceeds the limit of {} ({} store capacity x overcommit ratio {ratio})",
        format_size(*requested), format_size(*provisioned), format_size(*limit), format_size(*capacity)
    )]
    Overcommit {
        /// Bytes the operation would add to the provisioned total.
        requested: u64,
        /// Bytes provisioned to volumes before the operation.
        provisioned: u64,
        /// Bytes that may be provisioned in total: capacity × ratio.
        limit: u64,
        capacity: u64,
        ratio: f64,
    },

    #[error(
        "node {node:?} cannot grow its replica of {volume:?}: {} more with {} already provisioned there exceeds its limit of {} (capacity x overcommit ratio)",
        format_size(*requested), format_size(*provisioned), format_size(*limit)
    )]
    ReplicaNodeFull {
        node: String,
        volume: String,
        /// Bytes the grow would add on that node.
        requested: u64,
        /// Bytes provisioned on that node before the grow.
        provisioned: u64,
        /// Bytes that node may provision: capacity × its overcommit ratio.
        limit: u64,
    },

    #[error(
        "cannot place {replicas} replica(s) of {volume:?} ({}): only {with_room} of the cluster's {nodes} active node(s) can provision it within their limit (capacity x overcommit ratio)",
        format_size(*size)
    )]
    ClusterFull {
        volume: String,
        size: u64,
        /// Replicas the volume needs placed (its count, at most the nodes).
        replicas: usize,
        /// Active nodes that can provision it.
        with_room: usize,
        /// Active nodes in the cluster.
        nodes: usize,
    },

    #[error(
        "volume {volume:?} wants {replicas} replicas but the cluster has {nodes} active node(s): placed on {nodes}, its write quorum is {quorum} of them, so writes stop whenever {} node(s) are down until more nodes join; pass allow_degraded (CLI: --allow-degraded) to create it anyway",
        nodes + 1 - quorum
    )]
    TooFewNodes {
        volume: String,
        replicas: usize,
        /// Active nodes in the cluster.
        nodes: usize,
        /// The write quorum (`min_in_sync`) it would have while degraded.
        quorum: usize,
    },

    #[error(
        "refusing to shrink volume {name:?} from {} to {}: data beyond the new size would be lost; pass allow_shrink (CLI: --allow-shrink) to shrink anyway",
        format_size(*current), format_size(*requested)
    )]
    ShrinkRefused {
        name: String,
        current: u64,
        requested: u64,
    },

    #[error(
        "volume {name:?} is in use by {handles} open connection(s); disconnect its clients first"
    )]
    InUse { name: String, handles: usize },

    #[error(
        "volume {name:?} has clients connected through other nodes ({}); disconnect them first (`basalt volume disconnect`)",
        nodes.iter().map(|(n, c)| format!("{n}: {c}")).collect::<Vec<_>>().join(", ")
    )]
    InUseElsewhere {
        name: String,
        nodes: Vec<(String, usize)>,
    },

    #[error("invalid overcommit ratio {0}: it must be a finite number greater than 0")]
    InvalidOvercommit(f64),

    #[error("{0}")]
    NotSupported(String),

    #[error("volume {0:?} is encrypted and its key is not loaded: start the server with the master key that wrapped it (--master-key-file or --master-key-command)")]
    Locked(String),

    #[error("{0}")]
    InvalidQos(String),

    /// A compression a volume or volume type cannot have (the message names
    /// what is accepted).
    #[error("{0}")]
    InvalidCompression(String),

    #[error("volume {0:?} is not compressed; nothing to compact (volumes are compressed when created with --compression lz4|zstd[:LEVEL] or a volume type that has one)")]
    NotCompressed(String),

    #[error("no node named {0:?} in the cluster")]
    NoSuchNode(String),

    #[error("invalid node state {0:?}: use active, draining or removed")]
    InvalidNodeState(String),

    #[error("invalid replica count {0}: a volume has 1 to 5 replicas")]
    InvalidReplicas(u32),

    #[error("volume {volume:?} has no snapshot named {name:?}")]
    SnapshotNotFound { volume: String, name: String },

    #[error("volume {volume:?} already has a snapshot named {name:?}")]
    SnapshotExists { volume: String, name: String },

    #[error("invalid snapshot name {name:?}: {reason}")]
    InvalidSnapshotName { name: String, reason: String },

    #[error("volume {volume:?} has snapshots ({}); delete them first (basalt snapshot delete {volume}@NAME)", snapshots.join(", "))]
    HasSnapshots {
        volume: String,
        snapshots: Vec<String>,
    },

    #[error("snapshot {snapshot} has clones ({}); delete the clones first", clones.join(", "))]
    HasClones {
        /// `VOLUME@SNAPSHOT`.
        snapshot: String,
        clones: Vec<String>,
    },

    #[error("no {kind} named {name:?}")]
    EntryNotFound { kind: &'static str, name: String },

    #[error("a {kind} named {name:?} already exists")]
    EntryExists { kind: &'static str, name: String },

    #[error("invalid {kind} name {name:?}: {reason}")]
    InvalidEntryName {
        kind: &'static str,
        name: String,
        reason: String,
    },

    #[error("project {project:?} still has volumes ({}); delete them first", volumes.join(", "))]
    ProjectNotEmpty {
        project: String,
        volumes: Vec<String>,
    },

    #[error("volume type {name:?} is used by volumes ({}); retype them first", volumes.join(", "))]
    TypeInUse { name: String, volumes: Vec<String> },

    #[error(
        "quota exceeded: project {project:?} may hold {} of {quota}; it holds {} and this would add {}",
        quota_amount(quota, *limit), quota_amount(quota, *used), quota_amount(quota, *requested)
    )]
    QuotaExceeded {
        project: String,
        /// `capacity`, `volumes` or `snapshots`.
        quota: &'static str,
        limit: u64,
        used: u64,
        requested: u64,
    },

    /// The caller's token may not do this (its role or scope).
    #[error("{0}")]
    Forbidden(String),

    /// A malformed project, token or volume type request.
    #[error("{0}")]
    InvalidPolicy(String),

    #[error("cluster: {0}")]
    Cluster(String),

    #[error("store: {0}")]
    Store(#[from] StoreError),

    #[error("catalog: {0}")]
    Catalog(#[from] CatalogError),
}

/// A quota's amount as people read it: bytes as a size, counts as numbers.
fn quota_amount(quota: &str, amount: u64) -> String {
    if quota == "capacity" {
        format_size(amount)
    } else {
        amount.to_string()
    }
}
