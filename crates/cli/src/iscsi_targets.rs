//! The iSCSI target's view of the node's volumes: every volume in the
//! catalog is a target (`iqn.2026-11.io.basalt:volume:<name>`, see
//! `basalt_volume::iscsi_target_name`) with one LUN. The initiators named
//! with `--iscsi-allow-initiator` may discover and log in to all of them;
//! an initiator attached to a volume (`basalt volume attach VOL
//! --initiator-iqn IQN`, kept in the volume's catalog record) may discover
//! and log in to that volume; any other initiator sees nothing and is
//! refused at login (secure by default). An initiator attached with
//! `--chap` must prove the CHAP secret kept in the volume's record.
//!
//! Paths (ALUA): in a cluster every node serves every volume, so every
//! live node with an iSCSI portal is a path: its port group
//! (`basalt_volume::node_port_id`) is active/optimized on the volume's primary,
//! active/non-optimized elsewhere (requests are forwarded) and unavailable
//! while the node is down; discovery lists every node's portal. All of it
//! comes from the cluster member's memory, never from etcd, so the
//! watchdog's polling costs nothing. On a single node the one path is
//! optimized.

use basalt_frontend_iscsi::{ChapCredentials, OpenError, PathState, Targets};
use basalt_volume::{VolumeError, VolumeHandle, VolumeService};
use std::collections::BTreeSet;
use std::sync::Arc;

/// [`Targets`] over a [`VolumeService`] with a server-wide initiator allow
/// list.
pub struct VolumeTargets {
    service: Arc<VolumeService>,
    allowed_initiators: BTreeSet<String>,
}

impl VolumeTargets {
    pub fn new(service: Arc<VolumeService>, allowed_initiators: &[String]) -> Self {
        VolumeTargets {
            service,
            allowed_initiators: allowed_initiators.iter().cloned().collect(),
        }
    }
}

/// A cluster path's ALUA state: `primary` is the volume's primary node.
fn node_path_state(node: &basalt_volume::NodePortal, primary: Option<u32>) -> PathState {
    match (node.alive, primary == Some(node.id)) {
        (false, _) => PathState::Unavailable,
        (true, true) => PathState::Optimized,
        (true, false) => PathState::NonOptimized,
    }
}

impl Targets for VolumeTargets {
    fn visible(&self, initiator: &str) -> Vec<String> {
        let all = self.allowed_initiators.contains(initiator);
        match self.service.list() {
            Ok(volumes) => volumes
                .into_iter()
                .filter(|v| all || v.iscsi_initiators.iter().any(|i| i == initiator))
                .map(|v| v.name)
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list volumes for an iSCSI initiator");
                Vec::new()
            }
        }
    }

    fn allowed(&self, initiator: &str, volume: &str) -> bool {
        if self.allowed_initiators.contains(initiator) {
            return true;
        }
        match self.service.get(volume) {
            Ok(info) => info.iscsi_initiators.iter().any(|i| i == initiator),
            Err(VolumeError::NotFound(_)) => false,
            Err(e) => {
                tracing::error!(volume, error = %e, "cannot read a volume's iSCSI initiators");
                false
            }
        }
    }

    fn open(&self, initiator: &str, volume: &str) -> Result<VolumeHandle, OpenError> {
        if !self.allowed(initiator, volume) {
            return Err(OpenError::NotAllowed);
        }
        match self.service.open(volume) {
            Ok(handle) => Ok(handle),
            Err(VolumeError::NotFound(_)) => Err(OpenError::NotFound),
            Err(e) => Err(OpenError::Failed(e.to_string())),
        }
    }

    fn chap(&self, initiator: &str, volume: &str) -> Option<ChapCredentials> {
        let record = self.service.iscsi_chap(volume, initiator)?;
        Some(ChapCredentials {
            user: record.user,
            secret: record.secret.into_bytes(),
            mutual: match (record.target_user, record.target_secret) {
                (Some(user), Some(secret)) => Some((user, secret.into_bytes())),
                _ => None,
            },
        })
    }

    fn path_state(&self, volume: &VolumeHandle) -> PathState {
        if self.service.is_local_primary(volume.id()) {
            PathState::Optimized
        } else {
            PathState::NonOptimized
        }
    }

    fn port_groups(&self, volume: &VolumeHandle, own: u16) -> Vec<(u16, PathState)> {
        let primary = self.service.primary_node(volume.id());
        let mut groups: Vec<(u16, PathState)> = self
            .service
            .portals()
            .iter()
            .filter(|n| !n.local && n.iscsi_addr.is_some())
            .map(|n| (n.port_id(), node_path_state(n, primary)))
            .collect();
        // A stable order: the watchdog compares lists.
        groups.sort_unstable_by_key(|&(group, _)| group);
        // This node's own state from the same source as its I/O path's.
        groups.insert(0, (own, self.path_state(volume)));
        groups
    }

    fn other_portals(&self) -> Vec<(std::net::SocketAddr, u16)> {
        self.service.other_live_addresses(|n| n.iscsi_addr)
    }
}
