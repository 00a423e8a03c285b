//! Basalt's NVMe/TCP frontend: an NVMe over Fabrics target (NVMe/TCP
//! transport 1.0, NVMe base 1.4 command set subset) that serves volumes to
//! NVMe hosts such as the Linux kernel's `nvme-tcp` initiator.
//!
//! Shape: [`NvmeServer::start`] binds a listener and runs one acceptor
//! thread and one watchdog thread; every accepted connection is one NVMe
//! queue (admin or I/O) and starts on its own OS thread (module `queue`)
//! that does the ICReq/ICResp exchange and the Fabrics Connect. An I/O
//! queue then moves to one of the event loops (module `evented`, on
//! `basalt_reactor`), which receives its PDUs, runs its reads and writes
//! (on the loop's ring for a single-node volume; in batches to the primary
//! for a replicated one) and sends its completions, with no thread
//! hand-off per I/O. Admin queues (and every queue with no event loops)
//! stay on their threads, which decode every PDU
//! already received, run the reads and writes among them with one
//! `VolumeHandle::submit` and send the responses with one write. Both
//! drivers share the transport (module `transport`: PDUs in, ready
//! commands out) and the I/O commands (module `io_commands`).
//! Controllers (module `controller`) are created by an admin-queue Connect
//! (dynamic model, CNTLID 0xFFFF) and joined by I/O-queue Connects carrying
//! their CNTLID and the same host NQN and host ID. The watchdog enforces the
//! keep-alive timeout (KATO) and notices volume resizes, which it reports
//! with a Namespace Attribute Changed asynchronous event, and changes of
//! the path's ANA state, reported with an ANA Change asynchronous event.
//!
//! Multipath (ANA): in a cluster every node serves every volume under the
//! same subsystem NQN and namespace identifiers, so a host sees one
//! subsystem with one path (controller) per node. Each subsystem has one
//! ANA group (ID 1) holding NSID 1; its state as reported through a
//! controller is [`Subsystems::path_state`]: optimized where the volume's
//! primary runs, non-optimized on nodes that forward to it. Controller IDs
//! come from [`TargetConfig::cntlid_range`] so that the nodes of a cluster
//! hand out disjoint IDs ([`cluster_cntlid_range`]), as hosts require
//! distinct controller IDs within a subsystem.
//!
//! Naming: every volume is its own NVM subsystem with one namespace
//! (NSID 1) whose NQN is [`subsystem_nqn`]`(volume name)`, i.e.
//! `nqn.2026-11.io.basalt:volume:<volume name>`; it is stable across
//! restarts because volume names are. The namespace's NGUID and UUID are the
//! volume's UUID, its serial number is derived from the UUID, its model is
//! [`MODEL`] and its firmware revision the crate version. The discovery
//! subsystem `nqn.2014-08.org.nvmexpress.discovery` lists the subsystems the
//! connecting host may access, at the advertised address.
//!
//! Invariants:
//! - Every command that was received gets exactly one completion (a
//!   CapsuleResp, or a last C2HData with the SUCCESS flag when the host
//!   disabled SQ flow control), except held Asynchronous Event Requests of
//!   a controller that goes away. Completions are sent only after the
//!   operation finished, so FUA and Flush completions imply durability.
//! - Input from the network never panics a thread; a malformed PDU ends
//!   only its own connection, with a C2HTermReq naming the fatal error.
//! - Per-client resources are bounded by [`ServerLimits`]: connections,
//!   time to finish ICReq and Connect, PDU sizes, transfer sizes and the
//!   write data a queue holds while waiting for H2CData.
//! - [`NvmeServer::shutdown`] returns only after every thread it started
//!   has ended.

#![deny(unsafe_code)]

mod auth;
mod controller;
mod error;
mod evented;
mod io_commands;
mod queue;
mod server;
mod transport;

pub use auth::DhchapKeys;
pub use basalt_nvme_wire::auth::{DhchapSecret, SecretError};
pub use basalt_nvme_wire::NQN_MAX_LEN;
pub use error::ConnectionError;
pub use server::{
    cluster_cntlid_range, Disconnector, NvmeServer, ServerLimits, TargetConfig,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
};

use basalt_volume::VolumeHandle;

/// Prefix of every Basalt subsystem NQN; the volume name follows.
pub const NQN_PREFIX: &str = "nqn.2026-11.io.basalt:volume:";
/// Model number reported in Identify Controller.
pub const MODEL: &str = "Basalt volume";
/// Firmware revision reported in Identify Controller: the crate version.
pub const FIRMWARE_REVISION: &str = env!("CARGO_PKG_VERSION");
/// Block (LBA) size of every namespace.
pub const BLOCK_SIZE: u64 = 4096;
/// The namespace ID of a volume within its subsystem.
pub const NSID: u32 = 1;

/// The subsystem NQN of a volume.
pub fn subsystem_nqn(volume: &str) -> String {
    format!("{NQN_PREFIX}{volume}")
}

/// The volume a subsystem NQN names, `None` if it is not a Basalt NQN.
pub fn volume_of_nqn(nqn: &str) -> Option<&str> {
    nqn.strip_prefix(NQN_PREFIX).filter(|v| !v.is_empty())
}

/// Why a host cannot open a subsystem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No such volume.
    #[error("no such volume")]
    NotFound,
    /// The volume exists but this host may not access it.
    #[error("host not allowed")]
    HostNotAllowed,
    /// Opening failed for another reason (logged by the implementation).
    #[error("cannot open the volume: {0}")]
    Failed(String),
}

/// The ANA state of the path to a volume through this target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathState {
    /// The volume is served here (single node, or this node is the
    /// volume's primary).
    Optimized,
    /// The volume is reachable here, but requests are forwarded to another
    /// node.
    NonOptimized,
}

/// Access control and volume lookup: which volumes a host (named by its
/// host NQN) may see, and opening one for it.
///
/// `visible` is called for every discovery log page and `open` for every
/// admin-queue Connect; both must be cheap enough for that.
pub trait Subsystems: Send + Sync + 'static {
    /// Names of the volumes `host_nqn` may access (listed in discovery).
    fn visible(&self, host_nqn: &str) -> Vec<String>;
    /// Opens `volume` for `host_nqn`.
    fn open(&self, host_nqn: &str, volume: &str) -> Result<VolumeHandle, OpenError>;
    /// The ANA state of this target's path to an open volume. Polled by
    /// the watchdog for every controller every tick, so it must be cheap.
    /// Default: optimized (a single node serves every volume itself).
    fn path_state(&self, volume: &VolumeHandle) -> PathState {
        let _ = volume;
        PathState::Optimized
    }
    /// The addresses and port IDs of the other nodes' targets, which
    /// serve the same subsystems: discovery log pages list every
    /// subsystem at each of them after this target's own address, so a
    /// host that discovers through one node connects every path. Called
    /// for every discovery log page. Default: none.
    fn other_ports(&self) -> Vec<(std::net::SocketAddr, u16)> {
        Vec::new()
    }
    /// The DH-HMAC-CHAP secrets `host_nqn` must prove on `volume`'s
    /// subsystem; `None`: no in-band authentication. Called at every
    /// queue's Connect. Default: none.
    fn dhchap_keys(&self, host_nqn: &str, volume: &str) -> Option<DhchapKeys> {
        let _ = (host_nqn, volume);
        None
    }
}
