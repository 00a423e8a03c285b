//! Basalt's REST API: JSON over HTTP on the node's volume control plane.
//!
//! Every route, including `/metrics` and the OpenAPI document, requires
//! `Authorization: Bearer <token>`. Every error is `{"error": "<one line>"}`
//! with a status code that says what the client can do about it (see
//! [`error::status_for`]). Paths are versioned under `/api/v1`; the document
//! served at `/api/v1/openapi.json` (the file `openapi.json` in this crate)
//! describes each of them, which a test checks against the router.
//!
//! The control plane is blocking code (catalog transactions, store
//! metadata commits), so handlers run it on tokio's blocking pool.

mod auth;
pub mod error;
pub mod types;

pub use auth::constant_time_eq;
pub use error::ApiError;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, RawQuery, Request, State};
use axum::handler::Handler;
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::{Json, Router};
use basalt_volume::{VolumeError, VolumeService};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use types::{
    AttachHost, CreateSnapshot, CreateVolume, FlattenResult, FlattenVolume, Node, NodeList,
    ResizeVolume, Rollback, ScrubResult, ScrubVolume, SetNodeState, SetQos, Snapshot, SnapshotList,
    Status, Volume, VolumeList,
};

/// The OpenAPI 3 document describing every route.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone)]
struct AppState {
    service: Arc<VolumeService>,
}

/// Serves the API on `listener` until `shutdown` completes, then finishes the
/// requests in flight and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<VolumeService>,
    token: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "REST API listening on http://{addr}/api/v1");
    axum::serve(listener, router(service, token))
        .with_graceful_shutdown(shutdown)
        .await
}

/// The API's router, for [`serve`] and for tests that drive it directly.
pub fn router(service: Arc<VolumeService>, token: impl Into<String>) -> Router {
    build(service, token.into()).0
}

/// One route the router serves: (method, path template).
pub(crate) type RouteSpec = (&'static str, &'static str);

/// Registers routes and remembers which, so tests can compare the router
/// with the OpenAPI document.
struct Routes {
    router: Router<AppState>,
    table: Vec<RouteSpec>,
}

impl Routes {
    fn add<H, T>(
        mut self,
        method: &'static str,
        filter: MethodFilter,
        path: &'static str,
        handler: H,
    ) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.router = self.router.route(path, on(filter, handler));
        self.table.push((method, path));
        self
    }

    fn get<H: Handler<T, AppState>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("GET", MethodFilter::GET, path, handler)
    }

    fn post<H: Handler<T, AppState>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("POST", MethodFilter::POST, path, handler)
    }

    fn put<H: Handler<T, AppState>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("PUT", MethodFilter::PUT, path, handler)
    }

    fn delete<H: Handler<T, AppState>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("DELETE", MethodFilter::DELETE, path, handler)
    }
}

fn build(service: Arc<VolumeService>, token: String) -> (Router, Vec<RouteSpec>) {
    let routes = Routes {
        router: Router::new(),
        table: Vec::new(),
    }
    .get("/api/v1/volumes", list_volumes)
    .post("/api/v1/volumes", create_volume)
    .get("/api/v1/volumes/{name}", get_volume)
    .delete("/api/v1/volumes/{name}", delete_volume)
    .post("/api/v1/volumes/{name}/resize", resize_volume)
    .post("/api/v1/volumes/{name}/disconnect", disconnect_volume)
    .post("/api/v1/volumes/{name}/scrub", scrub_volume)
    .get("/api/v1/volumes/{name}/local-digest", local_digest)
    .get("/api/v1/volumes/{name}/snapshots", list_volume_snapshots)
    .post("/api/v1/volumes/{name}/snapshots", create_snapshot)
    .get("/api/v1/volumes/{name}/snapshots/{snapshot}", get_snapshot)
    .delete(
        "/api/v1/volumes/{name}/snapshots/{snapshot}",
        delete_snapshot,
    )
    .post("/api/v1/volumes/{name}/rollback", rollback_volume)
    .post("/api/v1/volumes/{name}/flatten", flatten_volume)
    .post(
        "/api/v1/volumes/{name}/snapshots/{snapshot}/nvme-hosts",
        attach_snapshot_host,
    )
    .delete(
        "/api/v1/volumes/{name}/snapshots/{snapshot}/nvme-hosts/{host_nqn}",
        detach_snapshot_host,
    )
    .get("/api/v1/snapshots", list_snapshots)
    .post("/api/v1/volumes/{name}/nvme-hosts", attach_host)
    .put("/api/v1/volumes/{name}/qos", set_qos)
    .delete("/api/v1/volumes/{name}/nvme-hosts/{host_nqn}", detach_host)
    .get("/api/v1/nodes", list_nodes)
    .post("/api/v1/nodes/{name}/state", set_node_state)
    .get("/api/v1/status", status)
    .get("/api/v1/openapi.json", openapi)
    .get("/metrics", metrics);
    let token: Arc<str> = token.into();
    let router = routes
        .router
        .fallback(no_such_endpoint)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(token, auth::require_token))
        .layer(middleware::from_fn(log_request))
        .with_state(AppState { service });
    (router, routes.table)
}

/// Runs a control-plane call on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("request handler failed: {e}")))?
        .map_err(ApiError::from)
}

/// A JSON request body whose parse errors become `400 {"error": ...}`.
struct JsonBody<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            ApiError::new(
                e.status(),
                format!("cannot read request body: {}", e.body_text()),
            )
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
    }
}

async fn list_volumes(State(app): State<AppState>) -> Result<Json<VolumeList>, ApiError> {
    let volumes = blocking(move || app.service.list()).await?;
    Ok(Json(VolumeList {
        volumes: volumes.into_iter().map(Volume::from).collect(),
    }))
}

async fn create_volume(
    State(app): State<AppState>,
    JsonBody(req): JsonBody<CreateVolume>,
) -> Result<Response, ApiError> {
    let info = blocking(move || match (&req.from, req.size) {
        (Some(source), size) => {
            if req.replicas.is_some() || req.allow_degraded {
                return Err(VolumeError::NotSupported(
                    "a clone has its source's replica count; leave out replicas and allow_degraded"
                        .into(),
                ));
            }
            app.service
                .create_clone(&req.name, source, size.map(|s| s.0))
        }
        (None, Some(size)) => {
            app.service
                .create_replicated(&req.name, size.0, req.replicas, req.allow_degraded)
        }
        (None, None) => Err(VolumeError::InvalidSize(
            "size is required (or from, to clone a snapshot)".into(),
        )),
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

async fn get_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Volume>, ApiError> {
    let info = blocking(move || app.service.get(&name)).await?;
    Ok(Json(info.into()))
}

/// How long a disconnect waits for the closed connections to let go of
/// the volume.
const DISCONNECT_WAIT: Duration = Duration::from_secs(10);

async fn delete_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
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

async fn disconnect_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let closed = blocking(move || app.service.disconnect(&name, DISCONNECT_WAIT)).await?;
    Ok(Json(serde_json::json!({ "disconnected": closed })))
}

async fn scrub_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<ScrubVolume>,
) -> Result<Json<ScrubResult>, ApiError> {
    let volume = name.clone();
    let (range, rate) = req.range_and_rate();
    let (offset, length) = (range.start, range.end - range.start);
    let report = blocking(move || app.service.scrub(&name, range, rate, &mut |_, _| {})).await?;
    Ok(Json(ScrubResult {
        volume,
        offset,
        length,
        bytes_checked: report.bytes_checked,
        bad_blocks: report.bad_blocks,
        data_checksums: report.checksums,
    }))
}

async fn resize_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<ResizeVolume>,
) -> Result<Json<Volume>, ApiError> {
    let info = blocking(move || app.service.resize(&name, req.size.0, req.allow_shrink)).await?;
    Ok(Json(info.into()))
}

async fn attach_host(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<AttachHost>,
) -> Result<Json<Volume>, ApiError> {
    let info = blocking(move || app.service.attach_host(&name, &req.host_nqn)).await?;
    Ok(Json(info.into()))
}

async fn set_qos(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<SetQos>,
) -> Result<Json<Volume>, ApiError> {
    let spec = basalt_volume::qos::QosSpec(req.qos);
    let info = blocking(move || app.service.set_qos(&name, &spec)).await?;
    Ok(Json(info.into()))
}

async fn detach_host(
    State(app): State<AppState>,
    Path((name, host_nqn)): Path<(String, String)>,
) -> Result<Json<Volume>, ApiError> {
    let info = blocking(move || app.service.detach_host(&name, &host_nqn)).await?;
    Ok(Json(info.into()))
}

async fn local_digest(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (crc, size) = blocking(move || app.service.local_digest(&name)).await?;
    Ok(Json(serde_json::json!({"crc32c": crc, "size_bytes": size})))
}

async fn list_snapshots(State(app): State<AppState>) -> Result<Json<SnapshotList>, ApiError> {
    let snapshots = blocking(move || app.service.snapshots(None)).await?;
    Ok(Json(SnapshotList {
        snapshots: snapshots.into_iter().map(Snapshot::from).collect(),
    }))
}

async fn list_volume_snapshots(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<SnapshotList>, ApiError> {
    let snapshots = blocking(move || app.service.snapshots(Some(&name))).await?;
    Ok(Json(SnapshotList {
        snapshots: snapshots.into_iter().map(Snapshot::from).collect(),
    }))
}

async fn create_snapshot(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<CreateSnapshot>,
) -> Result<Response, ApiError> {
    let info = blocking(move || app.service.create_snapshot(&name, &req.name)).await?;
    let location = format!("/api/v1/volumes/{}/snapshots/{}", info.volume, info.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Snapshot::from(info)),
    )
        .into_response())
}

async fn get_snapshot(
    State(app): State<AppState>,
    Path((name, snapshot)): Path<(String, String)>,
) -> Result<Json<Snapshot>, ApiError> {
    let info = blocking(move || app.service.snapshot(&name, &snapshot)).await?;
    Ok(Json(info.into()))
}

async fn delete_snapshot(
    State(app): State<AppState>,
    Path((name, snapshot)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    blocking(move || app.service.delete_snapshot(&name, &snapshot)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn attach_snapshot_host(
    State(app): State<AppState>,
    Path((name, snapshot)): Path<(String, String)>,
    JsonBody(req): JsonBody<AttachHost>,
) -> Result<Json<Snapshot>, ApiError> {
    let info = blocking(move || {
        app.service
            .attach_snapshot_host(&name, &snapshot, &req.host_nqn)
    })
    .await?;
    Ok(Json(info.into()))
}

async fn detach_snapshot_host(
    State(app): State<AppState>,
    Path((name, snapshot, host_nqn)): Path<(String, String, String)>,
) -> Result<Json<Snapshot>, ApiError> {
    let info = blocking(move || {
        app.service
            .detach_snapshot_host(&name, &snapshot, &host_nqn)
    })
    .await?;
    Ok(Json(info.into()))
}

async fn flatten_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<FlattenVolume>,
) -> Result<Json<FlattenResult>, ApiError> {
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

async fn rollback_volume(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<Rollback>,
) -> Result<Json<Volume>, ApiError> {
    let info = blocking(move || app.service.rollback(&name, &req.snapshot, req.force)).await?;
    Ok(Json(info.into()))
}

async fn list_nodes(State(app): State<AppState>) -> Result<Json<NodeList>, ApiError> {
    let nodes = blocking(move || app.service.nodes()).await?;
    Ok(Json(NodeList {
        nodes: nodes.into_iter().map(Node::from).collect(),
    }))
}

async fn set_node_state(
    State(app): State<AppState>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<SetNodeState>,
) -> Result<Json<Node>, ApiError> {
    let node = blocking(move || app.service.set_node_state(&name, &req.state)).await?;
    Ok(Json(node.into()))
}

async fn status(State(app): State<AppState>) -> Result<Json<Status>, ApiError> {
    let status = blocking(move || app.service.status()).await?;
    Ok(Json(status.into()))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn metrics(State(app): State<AppState>) -> Result<Response, ApiError> {
    let text = blocking(move || app.service.render_metrics()).await?;
    Ok(([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response())
}

async fn no_such_endpoint(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: {method} {}; the API is described at /api/v1/openapi.json",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not supported on {}; the API is described at /api/v1/openapi.json",
            uri.path()
        ),
    )
}

async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    tracing::debug!(%method, %path, status = response.status().as_u16(), "api request");
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_catalog::RedbCatalog;
    use basalt_store::{FormatOptions, SimDevice, Store};
    use std::collections::BTreeSet;

    #[test]
    fn openapi_describes_exactly_the_routes_served() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RedbCatalog::open(dir.path().join("catalog.redb")).unwrap());
        let store = Store::create(SimDevice::new(64 << 20, 1), &FormatOptions::default()).unwrap();
        let service = Arc::new(VolumeService::new(catalog, store, 2.0).unwrap());
        let (_, table) = build(service, "t".into());

        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            let methods = [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ];
            for (method, op) in item.as_object().unwrap() {
                if !methods.contains(&method.as_str()) {
                    continue; // path-level "parameters" etc.
                }
                assert!(
                    op["responses"]["401"].is_object() || doc["security"].is_array(),
                    "{method} {path} documents authentication"
                );
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<_> = table
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty(),
            "routes missing from openapi.json: {undocumented:?}"
        );
        assert!(
            unserved.is_empty(),
            "openapi.json documents routes not served: {unserved:?}"
        );

        // Every $ref points at something that exists.
        fn refs<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                        out.push(r);
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in all {
            let pointer = r.strip_prefix('#').unwrap();
            assert!(doc.pointer(pointer).is_some(), "dangling $ref {r}");
        }
    }
}
