//! Basalt's cluster layer: everything a node needs to take part in a
//! replicated cluster, around the sans-I/O protocol of `basalt-replication`.
//!
//! Modules by job:
//! - [`placement`]: which nodes hold a volume's replicas (pure).
//! - [`plan`]: the coordinator's placement round — records to create, drop
//!   and change — from the catalog, the records and the registry (pure).
//! - [`meta`]: the cluster's metadata in etcd — node registry with leases,
//!   membership records with compare-and-swap, coordinator election.
//! - [`peer`]: the node-to-node transport (TCP, frames of `basalt-peer-wire`),
//!   both ends authenticated with the cluster secret ([`secret`]).
//! - `replica`: the driver that runs one volume's replication state machine
//!   on the local store, the peer transport and etcd.
//! - `saved_logs`: the replicas' uncertain-region logs kept across a clean
//!   restart (one file in the data directory, used once).
//! - `coordinator`: the elected coordinator's task (leases, failover,
//!   placement of new volumes).
//! - [`member`]: this process as a cluster member, tying the above together
//!   and serving replicated volumes to the frontends.
//!
//! Invariant shared by all of them: the membership record in etcd is the
//! only authority on who is primary in which epoch; a node acts only on what
//! it read from there (or was told by a peer of a newer epoch).

mod coordinator;
mod crash_logs;
pub mod member;
pub mod meta;
pub mod peer;
pub mod placement;
pub mod plan;
mod replica;
mod saved_logs;
pub mod secret;
mod ticker;

pub use member::{ClientAddrs, ClusterMember, MemberConfig, Timing};

/// Why the cluster layer could not do something.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster metadata: {0}")]
    Meta(#[from] meta::MetaError),
    #[error("peer transport: {0}")]
    Peer(#[from] peer::PeerError),
    #[error("catalog: {0}")]
    Catalog(#[from] basalt_catalog::CatalogError),
    #[error("store: {0}")]
    Store(#[from] basalt_store::StoreError),
    #[error("could not start a thread: {0}")]
    Thread(String),
    #[error("volume {0} is not in the catalog")]
    UnknownVolume(uuid::Uuid),
    #[error("the cluster member is stopping")]
    Stopped,
    #[error("replica crash-safe log copy: {0}")]
    CrashLog(std::io::Error),
    #[error("clone {0} has no local copy here and its record calls this replica in sync: waiting to be marked out of sync and copied in full")]
    CloneNotCopied(String),
}
