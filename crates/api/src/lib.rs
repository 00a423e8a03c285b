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
mod diff;
pub mod error;
mod tenancy;
mod tenancy_types;
pub mod types;
mod volumes;

pub use basalt_volume::tenancy::constant_time_eq;
pub use error::ApiError;

use axum::body::Bytes;
use axum::extract::{Extension, FromRequest, Path, Request, State};
use axum::handler::Handler;
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::{Json, Router};
use basalt_volume::tenancy::Principal;
use basalt_volume::{VolumeError, VolumeService};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use types::{Node, NodeList, SetNodeState, Status};

/// The OpenAPI 3 document describing every route.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone)]
struct AppState {
    service: Arc<VolumeService>,
    /// The server's admin token (cluster admin).
    admin_token: Arc<str>,
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
    .get("/api/v1/volumes", volumes::list_volumes)
    .post("/api/v1/volumes", volumes::create_volume)
    .get("/api/v1/volumes/{name}", volumes::get_volume)
    .delete("/api/v1/volumes/{name}", volumes::delete_volume)
    .post("/api/v1/volumes/{name}/resize", volumes::resize_volume)
    .post("/api/v1/volumes/{name}/retype", volumes::retype_volume)
    .post(
        "/api/v1/volumes/{name}/disconnect",
        volumes::disconnect_volume,
    )
    .post("/api/v1/volumes/{name}/scrub", volumes::scrub_volume)
    .post("/api/v1/volumes/{name}/compact", volumes::compact_volume)
    .get("/api/v1/volumes/{name}/local-digest", volumes::local_digest)
    .get(
        "/api/v1/volumes/{name}/snapshots",
        volumes::list_volume_snapshots,
    )
    .post("/api/v1/volumes/{name}/snapshots", volumes::create_snapshot)
    .get(
        "/api/v1/volumes/{name}/snapshots/{snapshot}",
        volumes::get_snapshot,
    )
    .delete(
        "/api/v1/volumes/{name}/snapshots/{snapshot}",
        volumes::delete_snapshot,
    )
    .post("/api/v1/volumes/{name}/rollback", volumes::rollback_volume)
    .post("/api/v1/volumes/{name}/flatten", volumes::flatten_volume)
    .get("/api/v1/volumes/{name}/diff", diff::volume_diff)
    .post(
        "/api/v1/volumes/{name}/snapshots/{snapshot}/nvme-hosts",
        volumes::attach_snapshot_host,
    )
    .delete(
        "/api/v1/volumes/{name}/snapshots/{snapshot}/nvme-hosts/{host_nqn}",
        volumes::detach_snapshot_host,
    )
    .get("/api/v1/snapshots", volumes::list_snapshots)
    .post("/api/v1/volumes/{name}/nvme-hosts", volumes::attach_host)
    .put("/api/v1/volumes/{name}/qos", volumes::set_qos)
    .post(
        "/api/v1/volumes/{name}/iscsi-initiators",
        volumes::attach_initiator,
    )
    .delete(
        "/api/v1/volumes/{name}/iscsi-initiators/{initiator_iqn}",
        volumes::detach_initiator,
    )
    .delete(
        "/api/v1/volumes/{name}/nvme-hosts/{host_nqn}",
        volumes::detach_host,
    )
    .get("/api/v1/projects", tenancy::list_projects)
    .post("/api/v1/projects", tenancy::create_project)
    .get("/api/v1/projects/{name}", tenancy::get_project)
    .delete("/api/v1/projects/{name}", tenancy::delete_project)
    .put("/api/v1/projects/{name}/quotas", tenancy::set_quotas)
    .get("/api/v1/tokens", tenancy::list_tokens)
    .post("/api/v1/tokens", tenancy::create_token)
    .delete("/api/v1/tokens/{id}", tenancy::revoke_token)
    .get("/api/v1/nbd-keys", tenancy::list_nbd_keys)
    .post("/api/v1/nbd-keys", tenancy::create_nbd_key)
    .delete("/api/v1/nbd-keys/{identity}", tenancy::revoke_nbd_key)
    .get("/api/v1/types", tenancy::list_types)
    .post("/api/v1/types", tenancy::create_type)
    .get("/api/v1/types/{name}", tenancy::get_type)
    .delete("/api/v1/types/{name}", tenancy::delete_type)
    .put("/api/v1/default-type", tenancy::set_default_type)
    .get("/api/v1/nodes", list_nodes)
    .post("/api/v1/nodes/{name}/state", set_node_state)
    .post("/api/v1/keys/rotate", rotate_master_key)
    .get("/api/v1/status", status)
    .get("/api/v1/openapi.json", openapi)
    .get("/metrics", metrics);
    let state = AppState {
        service,
        admin_token: token.into(),
    };
    let router = routes
        .router
        .fallback(no_such_endpoint)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .layer(middleware::from_fn(log_request))
        .with_state(state);
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

async fn list_nodes(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<NodeList>, ApiError> {
    who.require_cluster_admin("listing nodes")?;
    let nodes = blocking(move || app.service.nodes()).await?;
    Ok(Json(NodeList {
        nodes: nodes.into_iter().map(Node::from).collect(),
    }))
}

async fn set_node_state(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<SetNodeState>,
) -> Result<Json<Node>, ApiError> {
    who.require_cluster_admin("changing a node's state")?;
    let node = blocking(move || app.service.set_node_state(&name, &req.state)).await?;
    Ok(Json(node.into()))
}

async fn rotate_master_key(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<types::KeyRotation>, ApiError> {
    who.require_cluster_admin("rotating the master key")?;
    let report = blocking(move || app.service.rotate_master_key()).await?;
    Ok(Json(types::KeyRotation {
        master_key_id: format!("{:08x}", report.master_key_id),
        rewrapped: report.rewrapped,
    }))
}

async fn status(State(app): State<AppState>) -> Result<Json<Status>, ApiError> {
    let status = blocking(move || app.service.status()).await?;
    Ok(Json(status.into()))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn metrics(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Response, ApiError> {
    who.require_cluster_admin("reading metrics")?;
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
