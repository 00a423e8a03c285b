//! The NVMe/TCP target's view of the node's volumes: every volume in the
//! catalog is an NVM subsystem (`nqn.2026-11.io.basalt:volume:<name>`), and
//! the hosts named with `--nvme-allow-host` may see and open all of them;
//! any other host sees none and is refused at Connect (secure by default:
//! without the flag no host may connect).

use basalt_frontend_nvme::{OpenError, Subsystems};
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

    fn allowed(&self, host_nqn: &str) -> bool {
        self.allowed_hosts.contains(host_nqn)
    }
}

impl Subsystems for VolumeSubsystems {
    fn visible(&self, host_nqn: &str) -> Vec<String> {
        if !self.allowed(host_nqn) {
            return Vec::new();
        }
        match self.service.list() {
            Ok(volumes) => volumes.into_iter().map(|v| v.name).collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list volumes for an NVMe host");
                Vec::new()
            }
        }
    }

    fn open(&self, host_nqn: &str, volume: &str) -> Result<VolumeHandle, OpenError> {
        // Unknown volumes and refused hosts are told apart only for allowed
        // hosts, so a refused host cannot probe volume names.
        if !self.allowed(host_nqn) {
            return Err(OpenError::HostNotAllowed);
        }
        match self.service.open(volume) {
            Ok(handle) => Ok(handle),
            Err(VolumeError::NotFound(_)) => Err(OpenError::NotFound),
            Err(e) => Err(OpenError::Failed(e.to_string())),
        }
    }
}
