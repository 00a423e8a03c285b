//! The NBD frontend's view of the node's volumes: every volume in the
//! catalog is an export of the same name (a snapshot `VOLUME@SNAPSHOT`);
//! opening one opens a volume handle through the control plane (so delete
//! sees the connection). A client whose TLS key belongs to a project sees
//! that project's volumes only, exactly as the API shows them to the
//! project's tokens; and the keys themselves come from the catalog.

use basalt_catalog::Role;
use basalt_frontend_nbd::{Exports, PskKey, PskKeys, Scope};
use basalt_volume::tenancy::Principal;
use basalt_volume::{format_size, split_snapshot_name, VolumeError, VolumeHandle, VolumeService};
use std::sync::Arc;

/// The principal an NBD client acts as: its TLS key's project as a member.
fn principal(scope: &Scope) -> Principal {
    match scope {
        Scope::All => Principal::ClusterAdmin,
        Scope::Tenant(project) => Principal::Project {
            project: project.clone(),
            role: Role::Member,
            token: "nbd-tls".into(),
        },
    }
}

/// [`Exports`] over a [`VolumeService`].
pub struct VolumeExports {
    service: Arc<VolumeService>,
}

impl VolumeExports {
    pub fn new(service: Arc<VolumeService>) -> Self {
        VolumeExports { service }
    }
}

impl VolumeExports {
    /// Whether `scope` may see export `name` (a snapshot: its volume).
    fn visible(&self, scope: &Scope, name: &str) -> bool {
        let volume = split_snapshot_name(name).map_or(name, |(volume, _)| volume);
        self.service
            .check_visible(&principal(scope), volume)
            .is_ok()
    }
}

impl Exports for VolumeExports {
    fn list(&self, scope: &Scope) -> Vec<String> {
        let who = principal(scope);
        match self.service.list() {
            Ok(volumes) => volumes
                .into_iter()
                .filter(|v| who.may_see(v.project.as_deref()))
                .map(|v| v.name)
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list volumes for an NBD client");
                Vec::new()
            }
        }
    }

    fn open(&self, scope: &Scope, name: &str) -> Option<VolumeHandle> {
        if !self.visible(scope, name) {
            return None;
        }
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

/// [`PskKeys`] from the catalog's NBD keys ([`VolumeService::nbd_key`]).
pub struct CatalogPskKeys {
    service: Arc<VolumeService>,
}

impl CatalogPskKeys {
    pub fn new(service: Arc<VolumeService>) -> Self {
        CatalogPskKeys { service }
    }
}

impl PskKeys for CatalogPskKeys {
    fn key(&self, identity: &str) -> Option<PskKey> {
        let (key, project) = self.service.nbd_key(identity)?;
        Some(PskKey {
            key,
            scope: project.map_or(Scope::All, Scope::Tenant),
        })
    }
}
