//! The volume and snapshot endpoints. Each runs as the request's
//! [`Principal`]: a project token sees and acts on its project's volumes
//! only, and any other volume answers 404 exactly like a missing one
//! ([`VolumeService::check_visible`]).

use crate::error::ApiError;
use crate::types::{
    AttachHost, AttachInitiator, AttachedHost, AttachedInitiator, CompactResult, CompactVolume,
    CreateSnapshot, CreateVolume, DifferingRegion, FlattenResult, FlattenVolume, ReplicaCompare,
    ResizeVolume, Retype, Rollback, ScrubResult, ScrubVolume, SetQos, Snapshot, SnapshotList,
    Volume, VolumeList,
};
use crate::{blocking, AppState, JsonBody};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use basalt_volume::tenancy::Principal;
use basalt_volume::{split_snapshot_name, NewVolume, VolumeError};
use std::time::Duration;

pub(crate) async fn list_volumes(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<VolumeList>, ApiError> {
    let volumes = blocking(move || app.service.list()).await?;
    Ok(Json(VolumeList {
        volumes: volumes
            .into_iter()
            .filter(|v| who.may_see(v.project.as_deref()))
            .map(Volume::from)
            .collect(),
    }))
}

pub(crate) async fn create_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    JsonBody(req): JsonBody<CreateVolume>,
) -> Result<Response, ApiError> {
    let info = blocking(move || {
        let project = match (who.project(), req.project) {
            (None, project) => project,
            (Some(own), None) => Some(own.to_string()),
            (Some(own), Some(given)) if given == own => Some(given),
            (Some(own), Some(given)) => {
                return Err(VolumeError::Forbidden(format!(
                    "a token of project {own:?} creates volumes in {own:?} only, not in {given:?}"
                )))
            }
        };
        match (&req.from, req.size) {
            (Some(source), size) => {
                if req.replicas.is_some()
                    || req.allow_degraded
                    || req.volume_type.is_some()
                    || req.encrypted
                {
                    return Err(VolumeError::NotSupported(
                        "a clone has its source's replica count, type and encryption; leave out replicas, allow_degraded, type and encrypted"
                            .into(),
                    ));
                }
                let volume = split_snapshot_name(source).map_or(source.as_str(), |(v, _)| v);
                app.service.check_visible(&who, volume)?;
                let owner = app.service.get(volume)?.project;
                if project.is_some() && project != owner {
                    return Err(VolumeError::InvalidPolicy(format!(
                        "a clone belongs to its source's project ({})",
                        owner.as_deref().unwrap_or("none")
                    )));
                }
                app.service.create_clone(
                    &req.name,
                    source,
                    size.map(|s| s.0),
                    req.compression.as_deref(),
                )
            }
            (None, Some(size)) => app.service.create_volume(&NewVolume {
                name: req.name,
                size: size.0,
                replicas: req.replicas,
                allow_degraded: req.allow_degraded,
                project,
                volume_type: req.volume_type,
                encrypted: req.encrypted,
                compression: req.compression,
            }),
            (None, None) => Err(VolumeError::InvalidSize(
                "size is required (or from, to clone a snapshot)".into(),
            )),
        }
    })
    .await?;
    // Validated names are URL- and header-safe.
    let location = format!("/api/v1/volumes/{}", info.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Volume::from(info)),
    )
        .into_response())
}

pub(crate) async fn get_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Volume>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.get(&name)).await?;
    Ok(Json(info.into()))
}

/// How long a disconnect waits for the closed connections to let go of
/// the volume.
const DISCONNECT_WAIT: Duration = Duration::from_secs(10);

pub(crate) async fn delete_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    visible(&app, &who, &name).await?;
    let force = force_param(query.as_deref())?;
    blocking(move || {
        if force {
            app.service
                .delete_disconnecting(&name, DISCONNECT_WAIT)
                .map(|_| ())
        } else {
            app.service.delete(&name)
        }
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `force=true|false` (or `1|0`) from a query string; absent: false.
fn force_param(query: Option<&str>) -> Result<bool, ApiError> {
    let mut force = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        force = match pair.split_once('=') {
            Some(("force", "true" | "1")) => true,
            Some(("force", "false" | "0")) => false,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid query parameter {pair:?}: the only one is force=true|false"
                )))
            }
        };
    }
    Ok(force)
}

pub(crate) async fn disconnect_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    visible(&app, &who, &name).await?;
    let closed = blocking(move || app.service.disconnect(&name, DISCONNECT_WAIT)).await?;
    Ok(Json(serde_json::json!({ "disconnected": closed })))
}

pub(crate) async fn scrub_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<ScrubVolume>,
) -> Result<Json<ScrubResult>, ApiError> {
    visible(&app, &who, &name).await?;
    let volume = name.clone();
    let (range, rate) = req.range_and_rate();
    let (offset, length) = (range.start, range.end - range.start);
    let scrub = blocking(move || app.service.scrub(&name, range, rate, &mut |_, _| {})).await?;
    let local = scrub.local.clone().unwrap_or_default();
    Ok(Json(ScrubResult {
        volume,
        offset,
        length,
        bytes_checked: local.bytes_checked,
        bad_blocks: local.bad_blocks,
        data_checksums: scrub.local.as_ref().is_none_or(|l| l.checksums),
        local_copy: scrub.local.is_some(),
        repaired_blocks: scrub.repaired_blocks,
        replicas: scrub.replicas.map(|c| ReplicaCompare {
            bytes_compared: c.bytes_compared,
            bytes_partial: c.bytes_partial,
            differing: c
                .differing
                .into_iter()
                .map(|d| DifferingRegion {
                    offset: d.offset,
                    length: d.length,
                    replicas: d.replicas,
                })
                .collect(),
            unreadable: c.unreadable,
        }),
    }))
}

/// `POST /api/v1/volumes/{name}/compact`: authorized like scrub (any
/// token that may see the volume).
pub(crate) async fn compact_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<CompactVolume>,
) -> Result<Json<CompactResult>, ApiError> {
    visible(&app, &who, &name).await?;
    let volume = name.clone();
    let (range, rate) = req.range_and_rate();
    let (compression, report) =
        blocking(move || app.service.compact(&name, range, rate, &mut |_, _| {})).await?;
    Ok(Json(CompactResult {
        volume,
        compression,
        packed_extents: report.packed_extents,
        packed_bytes: report.packed_bytes,
        stored_bytes: report.stored_bytes,
        incompressible_extents: report.incompressible_extents,
    }))
}

pub(crate) async fn resize_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<ResizeVolume>,
) -> Result<Json<Volume>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.resize(&name, req.size.0, req.allow_shrink)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn attach_host(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<AttachHost>,
) -> Result<Json<AttachedHost>, ApiError> {
    visible(&app, &who, &name).await?;
    let attached = blocking(move || match req.dhchap {
        false => Ok(AttachedHost {
            volume: app.service.attach_host(&name, &req.host_nqn)?.into(),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
        }),
        true => {
            let (info, keys) = app.service.attach_host_dhchap(&name, &req.host_nqn)?;
            Ok(AttachedHost {
                volume: info.into(),
                dhchap_secret: Some(keys.host_secret.clone()),
                dhchap_ctrl_secret: keys.controller_secret.clone(),
            })
        }
    })
    .await?;
    Ok(Json(attached))
}

pub(crate) async fn set_qos(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<SetQos>,
) -> Result<Json<Volume>, ApiError> {
    who.require_cluster_admin("changing QoS")?;
    let spec = basalt_volume::qos::QosSpec(req.qos);
    let info = blocking(move || app.service.set_qos(&name, &spec)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn detach_host(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((name, host_nqn)): Path<(String, String)>,
) -> Result<Json<Volume>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.detach_host(&name, &host_nqn)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn attach_initiator(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<AttachInitiator>,
) -> Result<Json<AttachedInitiator>, ApiError> {
    visible(&app, &who, &name).await?;
    let attached = blocking(move || {
        let (info, chap) = match req.chap || req.mutual_chap {
            false => (
                app.service.attach_initiator(&name, &req.initiator_iqn)?,
                None,
            ),
            true => {
                let (info, chap) = app.service.attach_initiator_chap(
                    &name,
                    &req.initiator_iqn,
                    req.mutual_chap,
                )?;
                (info, Some(chap))
            }
        };
        let chap = chap.unwrap_or(basalt_catalog::IscsiChapRecord {
            user: String::new(),
            secret: String::new(),
            target_user: None,
            target_secret: None,
            unknown: Default::default(),
        });
        let some = |s: String| (!s.is_empty()).then_some(s);
        Ok(AttachedInitiator {
            target_iqn: basalt_volume::iscsi_target_name(&info.name),
            volume: info.into(),
            chap_username: some(chap.user),
            chap_password: some(chap.secret),
            chap_username_in: chap.target_user,
            chap_password_in: chap.target_secret,
        })
    })
    .await?;
    Ok(Json(attached))
}

pub(crate) async fn detach_initiator(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((name, initiator_iqn)): Path<(String, String)>,
) -> Result<Json<Volume>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.detach_initiator(&name, &initiator_iqn)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn local_digest(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    who.require_cluster_admin("reading a replica digest")?;
    let (crc, size) = blocking(move || app.service.local_digest(&name)).await?;
    Ok(Json(serde_json::json!({"crc32c": crc, "size_bytes": size})))
}

pub(crate) async fn list_snapshots(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<SnapshotList>, ApiError> {
    let (snapshots, volumes) =
        blocking(move || Ok((app.service.snapshots(None)?, app.service.list()?))).await?;
    let visible: std::collections::HashSet<String> = volumes
        .into_iter()
        .filter(|v| who.may_see(v.project.as_deref()))
        .map(|v| v.name)
        .collect();
    Ok(Json(SnapshotList {
        snapshots: snapshots
            .into_iter()
            .filter(|s| visible.contains(&s.volume))
            .map(Snapshot::from)
            .collect(),
    }))
}

pub(crate) async fn list_volume_snapshots(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<SnapshotList>, ApiError> {
    visible(&app, &who, &name).await?;
    let snapshots = blocking(move || app.service.snapshots(Some(&name))).await?;
    Ok(Json(SnapshotList {
        snapshots: snapshots.into_iter().map(Snapshot::from).collect(),
    }))
}

pub(crate) async fn create_snapshot(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<CreateSnapshot>,
) -> Result<Response, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.create_snapshot(&name, &req.name)).await?;
    let location = format!("/api/v1/volumes/{}/snapshots/{}", info.volume, info.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Snapshot::from(info)),
    )
        .into_response())
}

pub(crate) async fn get_snapshot(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((name, snapshot)): Path<(String, String)>,
) -> Result<Json<Snapshot>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.snapshot(&name, &snapshot)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn delete_snapshot(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((name, snapshot)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    visible(&app, &who, &name).await?;
    blocking(move || app.service.delete_snapshot(&name, &snapshot)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn attach_snapshot_host(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((name, snapshot)): Path<(String, String)>,
    JsonBody(req): JsonBody<AttachHost>,
) -> Result<Json<Snapshot>, ApiError> {
    if req.dhchap {
        return Err(ApiError::bad_request(
            "DH-HMAC-CHAP secrets are per volume attachment; a snapshot's hosts read it without",
        ));
    }
    visible(&app, &who, &name).await?;
    let info = blocking(move || {
        app.service
            .attach_snapshot_host(&name, &snapshot, &req.host_nqn)
    })
    .await?;
    Ok(Json(info.into()))
}

pub(crate) async fn detach_snapshot_host(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((name, snapshot, host_nqn)): Path<(String, String, String)>,
) -> Result<Json<Snapshot>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || {
        app.service
            .detach_snapshot_host(&name, &snapshot, &host_nqn)
    })
    .await?;
    Ok(Json(info.into()))
}

pub(crate) async fn flatten_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<FlattenVolume>,
) -> Result<Json<FlattenResult>, ApiError> {
    visible(&app, &who, &name).await?;
    let volume = name.clone();
    let (range, rate) = req.range_and_rate();
    let (offset, length) = (range.start, range.end - range.start);
    let report = blocking(move || app.service.flatten(&name, range, rate, &mut |_, _| {})).await?;
    Ok(Json(FlattenResult {
        volume,
        offset,
        length,
        copied_bytes: report.copied_blocks * 4096,
        detached: report.detached,
    }))
}

pub(crate) async fn rollback_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<Rollback>,
) -> Result<Json<Volume>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.rollback(&name, &req.snapshot, req.force)).await?;
    Ok(Json(info.into()))
}

pub(crate) async fn retype_volume(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<Retype>,
) -> Result<Json<Volume>, ApiError> {
    visible(&app, &who, &name).await?;
    let info = blocking(move || app.service.retype(&name, &req.volume_type)).await?;
    Ok(Json(info.into()))
}

/// Fails with 404, as for a missing volume, unless `who` may see `volume`.
pub(crate) async fn visible(app: &AppState, who: &Principal, volume: &str) -> Result<(), ApiError> {
    if who.is_cluster_admin() {
        return Ok(());
    }
    let (app, who, volume) = (app.clone(), who.clone(), volume.to_string());
    blocking(move || app.service.check_visible(&who, &volume)).await
}
