//! The NBD frontend's view of the node's volumes: every volume in the
//! catalog is an export of the same name; opening one opens a volume handle
//! through the control plane (so delete sees the connection).

use basalt_frontend_nbd::Exports;
use basalt_volume::{format_size, VolumeError, VolumeHandle, VolumeService};
use std::sync::Arc;

/// [`Exports`] over a [`VolumeService`].
pub struct VolumeExports {
    service: Arc<VolumeService>,
}

impl VolumeExports {
    pub fn new(service: Arc<VolumeService>) -> Self {
        VolumeExports { service }
    }
}

impl Exports for VolumeExports {
    fn list(&self) -> Vec<String> {
        match self.service.list() {
            Ok(volumes) => volumes.into_iter().map(|v| v.name).collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list volumes for an NBD client");
                Vec::new()
            }
        }
    }

    fn open(&self, name: &str) -> Option<VolumeHandle> {
        match self.service.open(name) {
            Ok(handle) => Some(handle),
            Err(VolumeError::NotFound(_)) => None,
            Err(e) => {
                tracing::error!(volume = name, error = %e, "cannot open volume for an NBD client");
                None
            }
        }
    }

    fn describe(&self, name: &str) -> Option<String> {
        let info = self.service.get(name).ok()?;
        Some(format!(
            "basalt volume {} ({}, id {})",
            info.name,
            format_size(info.size_bytes),
            info.id
        ))
    }
}
