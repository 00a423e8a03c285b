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
//! Path state (ALUA): a clustered volume's path through this node is
//! active/optimized when this node is its primary and active/non-optimized
//! otherwise (requests are forwarded); on a single node every path is
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
}
