//! Basalt volumes on one node: the control plane that keeps the local store
//! converged on the catalog, the data-path handle frontends serve I/O on, and
//! the admission of the frontends' client connections ([`admission`]), and
//! the tenancy around them: projects, quotas, tokens, volume types
//! ([`tenancy`]).

pub mod admission;
mod clients;
mod compression;
mod diff;
mod encryption;
mod error;
mod handle;
mod iscsi_initiators;
mod nvme_hosts;
pub mod qos;
mod qos_control;
mod reencryption;
mod scrub;
mod sealed_snapshot;
mod service;
pub mod size;
mod snapshots;
mod stats;
pub mod tenancy;

pub use basalt_catalog::Role;
pub use basalt_crypt::{BlockCipher, KeySource, MasterKeyError};
pub use basalt_store::{ChangedRun, Codec, CompactReport, DataKind, DataOp, IoError, MappingRun};
pub use clients::ClientDisconnect;
pub use diff::VolumeDiff;
pub use encryption::{Keyring, RotationReport, UnlockReport};
pub use error::VolumeError;
pub use handle::{submit_owned, BlockIo, OnComplete, OwnedOp, VolumeHandle, WriteAck};
pub use iscsi_initiators::{
    iscsi_target_name, validate_iscsi_name, volume_of_target_name, ISCSI_NAME_MAX_LEN,
    ISCSI_TARGET_PREFIX,
};
pub use scrub::{DifferingRange, ReplicaComparison, VolumeScrub};
pub use service::{
    compression_ratio, node_port_id, validate_host_nqn, validate_volume_name, validate_volume_size,
    ClusterVolumes, LayerRequest, NewVolume, NodePortal, NodeView, ProvisioningGuard,
    ReconcileReport, ReplicaStatus, StoreStatus, VolumeInfo, VolumeService,
    DEFAULT_OVERCOMMIT_RATIO,
};
pub use size::{format_size, parse_size, ParseSizeError};
pub use snapshots::{split_snapshot_name, validate_snapshot_name, FlattenProgress, SnapshotInfo};
pub use stats::{OpKind, VolumeStats};
