//! How failures become HTTP responses: a status code chosen by what the
//! client can do about it, and a JSON body `{"error": "<one line>"}`.

use crate::types::ErrorBody;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use basalt_catalog::CatalogError;
use basalt_store::StoreError;
use basalt_volume::VolumeError;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

/// The status code for a control-plane error:
/// 400 the request is invalid, 403 the token's role may not do it, 404 no
/// such volume (or one the token's project may not see), 409 it conflicts
/// with the volume's state, 413 a project quota would be exceeded, 507 the
/// store has no room for it, 503 the cluster or its
/// metadata store (etcd) is unavailable for now, 500 the node failed.
pub fn status_for(err: &VolumeError) -> StatusCode {
    match err {
        VolumeError::InvalidName { .. }
        | VolumeError::InvalidSnapshotName { .. }
        | VolumeError::InvalidSize(_)
        | VolumeError::InvalidHostNqn { .. }
        | VolumeError::InvalidInitiatorName { .. }
        | VolumeError::InvalidReplicas(_)
        | VolumeError::InvalidNodeState(_)
        | VolumeError::NotSupported(_)
        | VolumeError::InvalidQos(_)
        | VolumeError::InvalidCompression(_)
        | VolumeError::InvalidEntryName { .. }
        | VolumeError::InvalidPolicy(_) => StatusCode::BAD_REQUEST,
        VolumeError::Forbidden(_) => StatusCode::FORBIDDEN,
        // OpenStack's answer to an exceeded quota (Cinder's OverLimit).
        VolumeError::QuotaExceeded { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        VolumeError::Cluster(_) => StatusCode::SERVICE_UNAVAILABLE,
        VolumeError::Catalog(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
        VolumeError::NotFound(_)
        | VolumeError::NoSuchNode(_)
        | VolumeError::SnapshotNotFound { .. }
        | VolumeError::EntryNotFound { .. } => StatusCode::NOT_FOUND,
        VolumeError::AlreadyExists(_)
        | VolumeError::SnapshotExists { .. }
        | VolumeError::HasSnapshots { .. }
        | VolumeError::HasClones { .. }
        | VolumeError::InUse { .. }
        | VolumeError::InUseElsewhere { .. }
        | VolumeError::ShrinkRefused { .. }
        | VolumeError::TooFewNodes { .. }
        | VolumeError::EntryExists { .. }
        | VolumeError::ProjectNotEmpty { .. }
        | VolumeError::TypeInUse { .. }
        | VolumeError::Locked(_)
        | VolumeError::NotCompressed(_)
        | VolumeError::Catalog(CatalogError::Conflict { .. }) => StatusCode::CONFLICT,
        VolumeError::Overcommit { .. }
        | VolumeError::ReplicaNodeFull { .. }
        | VolumeError::ClusterFull { .. }
        | VolumeError::Store(StoreError::TooManyVolumes(_)) => StatusCode::INSUFFICIENT_STORAGE,
        VolumeError::Store(StoreError::InvalidSize(_)) => StatusCode::BAD_REQUEST,
        VolumeError::Store(StoreError::Layers(_)) => StatusCode::CONFLICT,
        VolumeError::Store(StoreError::NoLayers) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<VolumeError> for ApiError {
    fn from(err: VolumeError) -> Self {
        ApiError::new(status_for(&err), err.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() && self.status != StatusCode::INSUFFICIENT_STORAGE {
            tracing::error!(status = %self.status, error = %self.message, "request failed");
        }
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_metadata_store_is_503() {
        let timeout = VolumeError::Catalog(CatalogError::Timeout {
            endpoints: "http://127.0.0.1:2379".into(),
            key: "/basalt/volumes/".into(),
            timeout: std::time::Duration::from_secs(2),
        });
        assert_eq!(status_for(&timeout), StatusCode::SERVICE_UNAVAILABLE);
        assert!(timeout.to_string().contains("metadata store unreachable"));
        let corrupt = VolumeError::Catalog(CatalogError::Corrupt {
            key: "k".into(),
            reason: "r".into(),
        });
        assert_eq!(status_for(&corrupt), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
