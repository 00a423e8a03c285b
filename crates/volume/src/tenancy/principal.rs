//! Who a request acts as, once its token is authenticated, and the checks
//! of what that principal may see and do.

use crate::VolumeError;
use basalt_catalog::Role;

/// The identity a request acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// The whole cluster: the server's admin token, or a token created with
    /// the admin role and no project.
    ClusterAdmin,
    /// One project, as its admin or as a member.
    Project {
        project: String,
        role: Role,
        /// The token's id, for logs.
        token: String,
    },
}

impl Principal {
    /// The project it is confined to; `None` for a cluster admin.
    pub fn project(&self) -> Option<&str> {
        match self {
            Principal::ClusterAdmin => None,
            Principal::Project { project, .. } => Some(project),
        }
    }

    pub fn is_cluster_admin(&self) -> bool {
        matches!(self, Principal::ClusterAdmin)
    }

    /// Whether it may see a volume (or anything else) owned by `owner`
    /// (`None`: owned by no project, i.e. cluster-wide).
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        match self {
            Principal::ClusterAdmin => true,
            Principal::Project { project, .. } => owner == Some(project.as_str()),
        }
    }

    /// Fails with [`VolumeError::Forbidden`] unless a cluster admin;
    /// `what` completes "… needs a cluster-admin token".
    pub fn require_cluster_admin(&self, what: &str) -> Result<(), VolumeError> {
        if self.is_cluster_admin() {
            return Ok(());
        }
        Err(VolumeError::Forbidden(format!(
            "{what} needs a cluster-admin token"
        )))
    }

    /// Whether it may administer `project` (its tokens): a cluster admin or
    /// that project's admin.
    pub fn administers(&self, project: &str) -> bool {
        match self {
            Principal::ClusterAdmin => true,
            Principal::Project {
                project: own, role, ..
            } => own == project && *role == Role::Admin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(p: &str) -> Principal {
        Principal::Project {
            project: p.into(),
            role: Role::Member,
            token: "t".into(),
        }
    }

    #[test]
    fn projects_see_only_their_own() {
        assert!(Principal::ClusterAdmin.may_see(None));
        assert!(Principal::ClusterAdmin.may_see(Some("a")));
        assert!(member("a").may_see(Some("a")));
        assert!(!member("a").may_see(Some("b")));
        assert!(!member("a").may_see(None));
        assert!(!member("a").administers("a"));
        let admin = Principal::Project {
            project: "a".into(),
            role: Role::Admin,
            token: "t".into(),
        };
        assert!(admin.administers("a") && !admin.administers("b"));
        assert!(admin.require_cluster_admin("creating projects").is_err());
    }
}
