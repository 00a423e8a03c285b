//! The catalog's error type, shared by every backend so callers can match on
//! outcomes (absent, duplicate, lost race) without knowing the backend.

use crate::Revision;
use std::path::PathBuf;
use std::time::Duration;

/// Why a catalog call failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("no volume named {0:?} in the catalog")]
    NotFound(String),

    #[error("a volume named {0:?} already exists")]
    AlreadyExists(String),

    #[error(
        "volume {name:?} was changed concurrently (expected revision {expected}, found {found}); re-read and retry"
    )]
    Conflict {
        name: String,
        expected: Revision,
        found: Revision,
    },

    #[error("catalog record {key:?} is unreadable: {reason}")]
    Corrupt { key: String, reason: String },

    #[error(
        "catalog schema version {found} is newer than this binary supports (up to {supported}); upgrade basalt"
    )]
    UnsupportedSchema { found: u64, supported: u64 },

    #[error("catalog {} is in use by another process (is another basalt server running on this data directory?)", .0.display())]
    Locked(PathBuf),

    /// A request to a remote backend failed (no endpoint reachable, no
    /// leader, refused, ...). A failed mutation may still have been applied:
    /// re-read before retrying. Displayed as one line without the gRPC
    /// client's debug text.
    #[error("{}", crate::etcd_catalog::describe_request_failure(endpoints, key, source.as_ref()))]
    Request {
        endpoints: String,
        key: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A remote backend did not answer within the configured time. As with
    /// [`CatalogError::Request`], a mutation may still have been applied.
    #[error(
        "metadata store unreachable: etcd at {endpoints} did not answer for {key:?} within {timeout:?} (is it running, reachable and with a leader?)"
    )]
    Timeout {
        endpoints: String,
        key: String,
        timeout: Duration,
    },

    #[error("invalid catalog configuration: {0}")]
    Config(String),

    #[error("catalog backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl CatalogError {
    /// The remote metadata store failed or could not be reached: the request
    /// may succeed later (HTTP 503), it is not the caller's mistake.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CatalogError::Request { .. } | CatalogError::Timeout { .. }
        )
    }

    /// Wraps a backend-specific failure.
    pub fn backend(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        CatalogError::Backend(Box::new(err))
    }
}
