//! Basalt's cluster layer: everything a node needs to take part in a
//! replicated cluster, around the sans-I/O protocol of `basalt-replication`.
//!
//! Modules by job:
//! - [`placement`]: which nodes hold a volume's replicas (pure).
//! - `meta`: the cluster's metadata in etcd — node registry with leases,
//!   membership records with compare-and-swap, coordinator election.
//! - `peer`: the node-to-node transport (TCP, frames of `basalt-peer-wire`).
//! - `replica`: the driver that runs one volume's replication state machine
//!   on the local store, the peer transport and etcd.
//!
//! Invariant shared by all of them: the membership record in etcd is the
//! only authority on who is primary in which epoch; a node acts only on what
//! it read from there (or was told by a peer of a newer epoch).

pub mod peer;
pub mod placement;
