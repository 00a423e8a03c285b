//! The NVMe/TCP target's view of the node's volumes: every volume in the
//! catalog is an NVM subsystem (`nqn.2026-11.io.basalt:volume:<name>`). The
//! hosts named with `--nvme-allow-host` may see and open all of them; a host
//! attached to a volume (`basalt volume attach VOL --host-nqn NQN`, stored
//! in the volume's catalog record) may see and open that volume; any other
//! host sees nothing and is refused at Connect (secure by default). A
//! snapshot is a subsystem of its own (`…:volume:<volume>@<snapshot>`,
//! write protected) only for the hosts attached to it (`basalt snapshot
//! attach`).
//!
//! In-band authentication: a host attached with `--dhchap` must prove its
//! DH-HMAC-CHAP secret (kept in the volume's record) on every queue.
//!
//! Path state (ANA): a clustered volume's path through this node is
//! optimized when this node is its primary and non-optimized otherwise
//! (requests are forwarded); on a single node every path is optimized.
//! Every node serves every volume, so discovery lists each subsystem at
//! every live node's address too (from the cluster member's memory).

use basalt_frontend_nvme::{DhchapKeys, DhchapSecret, OpenError, PathState, Subsystems};
use basalt_volume::{VolumeError, VolumeHandle, VolumeService};
use std::collections::BTreeSet;
use std::sync::Arc;

/// [`Subsystems`] over a [`VolumeService`] with a server-wide host allow
/// list.
pub struct VolumeSubsystems {
    service: Arc<VolumeService>,
    allowed_hosts: BTreeSet<String>,
}

impl VolumeSubsystems {
    pub fn new(service: Arc<VolumeService>, allowed_hosts: &[String]) -> Self {
        VolumeSubsystems {
            service,
            allowed_hosts: allowed_hosts.iter().cloned().collect(),
        }
    }

    /// Allowed for every volume.
    fn allowed(&self, host_nqn: &str) -> bool {
        self.allowed_hosts.contains(host_nqn)
    }
}

impl Subsystems for VolumeSubsystems {
    fn visible(&self, host_nqn: &str) -> Vec<String> {
        let all = self.allowed(host_nqn);
        let listed = self.service.list().and_then(|volumes| {
            let snapshots = self.service.snapshots(None)?;
            Ok((volumes, snapshots))
        });
        match listed {
            Ok((volumes, snapshots)) => volumes
                .into_iter()
                .filter(|v| all || v.nvme_hosts.iter().any(|h| h == host_nqn))
                .map(|v| v.name)
                .chain(
                    snapshots
                        .into_iter()
                        .filter(|s| s.nvme_hosts.iter().any(|h| h == host_nqn))
                        .map(|s| format!("{}@{}", s.volume, s.name)),
                )
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list volumes for an NVMe host");
                Vec::new()
            }
        }
    }

    fn open(&self, host_nqn: &str, volume: &str) -> Result<VolumeHandle, OpenError> {
        // A snapshot: only for the hosts attached to it, refused alike
        // whether it exists or not.
        if let Some((name, snapshot)) = basalt_volume::split_snapshot_name(volume) {
            let attached = match self.service.snapshot(name, snapshot) {
                Ok(s) => s.nvme_hosts.iter().any(|h| h == host_nqn),
                Err(VolumeError::NotFound(_) | VolumeError::SnapshotNotFound { .. }) => false,
                Err(e) => return Err(OpenError::Failed(e.to_string())),
            };
            if !attached {
                return Err(OpenError::HostNotAllowed);
            }
        }
        // Unknown volumes and refused hosts are told apart only for hosts
        // allowed everywhere, so other hosts cannot probe volume names.
        else if !self.allowed(host_nqn) {
            match self.service.get(volume) {
                Ok(info) if info.nvme_hosts.iter().any(|h| h == host_nqn) => {}
                Ok(_) | Err(VolumeError::NotFound(_)) => return Err(OpenError::HostNotAllowed),
                Err(e) => return Err(OpenError::Failed(e.to_string())),
            }
        }
        match self.service.open(volume) {
            Ok(handle) => Ok(handle),
            Err(VolumeError::NotFound(_)) => Err(OpenError::NotFound),
            Err(e) => Err(OpenError::Failed(e.to_string())),
        }
    }

    fn path_state(&self, volume: &VolumeHandle) -> PathState {
        if self.service.is_local_primary(volume.id()) {
            PathState::Optimized
        } else {
            PathState::NonOptimized
        }
    }

    fn other_ports(&self) -> Vec<(std::net::SocketAddr, u16)> {
        self.service.other_live_addresses(|n| n.nvme_addr)
    }

    fn dhchap_keys(&self, host_nqn: &str, volume: &str) -> Option<DhchapKeys> {
        let keys = self.service.nvme_host_keys(volume, host_nqn)?;
        let parse = |text: &str| match DhchapSecret::parse(text) {
            Ok(secret) => Some(secret),
            Err(e) => {
                // Fail closed: a host with an unreadable secret cannot
                // authenticate (rather than connect without).
                tracing::error!(
                    volume,
                    host_nqn,
                    "stored DH-HMAC-CHAP secret is unreadable: {e}"
                );
                None
            }
        };
        let host = parse(&keys.host_secret).unwrap_or(DhchapSecret {
            transform: 0,
            key: Vec::new(),
        });
        Some(DhchapKeys {
            host,
            controller: keys.controller_secret.as_deref().and_then(parse),
        })
    }
}
