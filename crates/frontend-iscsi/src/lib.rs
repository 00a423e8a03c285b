//! Basalt's iSCSI frontend: an iSCSI target (RFC 7143, error recovery
//! level 0) that serves volumes as SCSI block devices (SBC-4/SPC-5) to
//! initiators such as Linux open-iscsi, libiscsi and QEMU.
//!
//! Shape: [`IscsiServer::start_on`] binds a listener and runs one acceptor
//! thread and one watchdog thread. Every accepted connection starts on its
//! own OS thread (module `connection`), which runs the login phase
//! (module `login`: the pure `basalt_iscsi_wire::login` machine over the
//! blocking socket, CHAP against the volume's attachment). A discovery
//! session stays on that thread (module `discovery`: SendTargets). A
//! normal session's connection then moves to one of the event loops
//! (module `evented`, on `basalt_reactor`), which receives its PDUs (the
//! pure session state machine of module `session`: command window,
//! immediate and unsolicited data, R2Ts, Data-Out, task management), runs
//! each command through the volume's logical unit (module `units`: the
//! pure `basalt_scsi_wire::lu` logic with the state every session of the
//! volume shares) and its reads and writes through
//! `basalt_loop_io::BlockIo`, and sends Data-In and responses, with no
//! thread hand-off per I/O.
//!
//! Naming: every volume is its own target, `iqn.2026-11.io.basalt:volume:`
//! followed by the volume's name (`basalt_volume::iscsi_target_name`),
//! with one logical unit, LUN 0, whose identifiers derive from the volume's
//! UUID, so every node of a cluster reports the same device.
//!
//! Multipath (ALUA): each node is a target port group (its ID is the
//! node's [`TargetConfig::port_group`], `basalt_volume::node_port_id` in
//! a cluster) with one target port. A volume's port group is
//! active/optimized where its primary runs, active/non-optimized on the
//! other live nodes and unavailable on dead ones ([`Targets::port_groups`],
//! which REPORT TARGET PORT GROUPS lists); a change of any group's state is
//! reported with an ASYMMETRIC ACCESS STATE CHANGED unit attention, which
//! makes dm-multipath's `prio alua` read the states again. Discovery
//! (SendTargets) lists every node's portal ([`Targets::other_portals`]),
//! so an initiator that discovers through one node learns every path.
//!
//! Invariants:
//! - Every SCSI command received in the command window gets exactly one
//!   response (or a final Data-In with status), sent only after its
//!   operation finished, so a write with FUA (or with the write cache
//!   disabled) and SYNCHRONIZE CACHE imply durability; commands of an
//!   aborted task get none, as RFC 7143 requires.
//! - Input from the network never panics a thread; a malformed PDU gets a
//!   Reject or ends only its own connection.
//! - Per-client resources are bounded by [`ServerLimits`]: connections,
//!   time to log in, PDU and burst sizes, the command window.
//! - [`IscsiServer::shutdown`] returns only after every thread it started
//!   has ended and every connection on the loops is gone.

#![deny(unsafe_code)]

mod connection;
mod discovery;
mod error;
mod evented;
mod login;
mod scsi_exec;
mod server;
mod session;
mod units;

pub use error::ConnectionError;
pub use server::{
    Disconnector, IscsiServer, ServerLimits, TargetConfig, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
};

use basalt_volume::VolumeHandle;

/// Logical block size of every logical unit: 512 bytes on 4096-byte
/// physical blocks ("512e"), which every initiator takes (VMware and
/// Windows among them). Linux aligns to the physical block, so its I/O
/// stays on the 4 KiB fast path; other I/O is read-modify-written by the
/// store.
pub const LOGICAL_BLOCK_SIZE: u64 = 512;
/// Physical block size: the store's block.
pub const PHYSICAL_BLOCK_SIZE: u64 = 4096;

/// Why an initiator cannot open a target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No such volume.
    #[error("no such volume")]
    NotFound,
    /// The volume exists but this initiator may not access it.
    #[error("initiator not allowed")]
    NotAllowed,
    /// Opening failed for another reason (logged by the implementation).
    #[error("cannot open the volume: {0}")]
    Failed(String),
}

/// The ALUA state of the path to a volume through this node's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathState {
    /// The volume is served here (single node, or this node is the
    /// volume's primary): active/optimized.
    Optimized,
    /// Requests are forwarded to another node: active/non-optimized.
    NonOptimized,
    /// The node is down (reported for other nodes' groups only).
    Unavailable,
}

/// The CHAP credentials of one initiator on one target.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    /// The name the initiator answers with (`CHAP_N`).
    pub user: String,
    /// The initiator's secret.
    pub secret: Vec<u8>,
    /// Mutual CHAP: the target's name and secret.
    pub mutual: Option<(String, Vec<u8>)>,
}

impl std::fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .field("mutual", &self.mutual.is_some())
            .finish_non_exhaustive()
    }
}

/// Access control and volume lookup: which volumes an initiator (named by
/// its iSCSI name) may see, opening one for it, and the credentials it
/// must prove. Called at logins and discovery, so they must be cheap
/// enough for that.
pub trait Targets: Send + Sync + 'static {
    /// Names of the volumes `initiator` may access (listed by SendTargets).
    fn visible(&self, initiator: &str) -> Vec<String>;
    /// Whether `initiator` may log in to `volume` (and so learn that it
    /// exists): checked before authentication so that refused initiators
    /// cannot probe names.
    fn allowed(&self, initiator: &str, volume: &str) -> bool;
    /// Opens `volume` for `initiator`.
    fn open(&self, initiator: &str, volume: &str) -> Result<VolumeHandle, OpenError>;
    /// The CHAP credentials `initiator` must prove to log in to `volume`;
    /// `None`: no authentication. Called at every login.
    fn chap(&self, initiator: &str, volume: &str) -> Option<ChapCredentials>;
    /// The ALUA state of this node's path to an open volume.
    /// Default: optimized.
    fn path_state(&self, volume: &VolumeHandle) -> PathState {
        let _ = volume;
        PathState::Optimized
    }
    /// The port groups of every node that serves `volume` (this node's,
    /// `own`, included), as `(port group id, state)`, for REPORT TARGET
    /// PORT GROUPS. Polled by the watchdog for every open volume every
    /// tick (a change is a unit attention), so it must be cheap. Default:
    /// this node's alone.
    fn port_groups(&self, volume: &VolumeHandle, own: u16) -> Vec<(u16, PathState)> {
        vec![(own, self.path_state(volume))]
    }
    /// The portals of the other nodes that serve every volume this node
    /// serves, as `(address, target portal group tag)`: listed by
    /// SendTargets after this node's own. Default: none.
    fn other_portals(&self) -> Vec<(std::net::SocketAddr, u16)> {
        Vec::new()
    }
}
