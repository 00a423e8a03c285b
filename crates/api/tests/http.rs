//! The REST API over a real TCP listener, driven by a blocking HTTP client
//! the way the CLI drives it: authentication, CRUD, error mapping, and that
//! every documented route is served.

use basalt_api::{serve, OPENAPI_JSON};
use basalt_catalog::RedbCatalog;
use basalt_store::{FormatOptions, SimDevice, Store};
use basalt_volume::VolumeService;
use serde_json::{json, Value};
use std::sync::Arc;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const MIB: u64 = 1 << 20;

struct Server {
    url: String,
    service: Arc<VolumeService>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A node with a 256 MiB in-memory store and overcommit ratio 2.
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RedbCatalog::open(dir.path().join("catalog.redb")).unwrap());
        let store = Store::create(SimDevice::new(256 * MIB, 5), &FormatOptions::default()).unwrap();
        let service = Arc::new(VolumeService::new(catalog, store, 2.0).unwrap());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = service.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                addr_tx.send(listener.local_addr()?).unwrap();
                serve(listener, svc, TOKEN.to_string(), async {
                    let _ = stop_rx.await;
                })
                .await
            })
        });
        let addr = addr_rx.recv().unwrap();
        Server {
            url: format!("http://{addr}"),
            service,
            shutdown: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// Sends a request with `auth` as the Authorization header; returns the
    /// status, the Content-Type and the body.
    fn raw(
        &self,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: Option<&str>,
    ) -> (u16, ureq::Response) {
        let mut req = ureq::request(method, &format!("{}{path}", self.url));
        if let Some(auth) = auth {
            req = req.set("Authorization", auth);
        }
        let result = match body {
            Some(body) => req
                .set("Content-Type", "application/json")
                .send_string(body),
            None => req.call(),
        };
        match result {
            Ok(resp) => (resp.status(), resp),
            Err(ureq::Error::Status(code, resp)) => (code, resp),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// An authenticated request with a JSON body; returns status and JSON.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let (status, resp) = self.raw(
            method,
            path,
            Some(&format!("Bearer {TOKEN}")),
            body.as_deref(),
        );
        let text = resp.into_string().unwrap();
        let json = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"))
        };
        (status, json)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let result = t.join().expect("server thread panicked");
            if !std::thread::panicking() {
                result.expect("server returned an error");
            }
        }
    }
}

fn error_of(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field in {v}"))
}

#[test]
fn every_route_requires_the_token() {
    let server = Server::start();
    for (method, path) in [
        ("GET", "/api/v1/volumes"),
        ("POST", "/api/v1/volumes"),
        ("GET", "/api/v1/volumes/x"),
        ("DELETE", "/api/v1/volumes/x"),
        ("POST", "/api/v1/volumes/x/resize"),
        ("GET", "/api/v1/status"),
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/metrics"),
        ("GET", "/no/such/route"),
    ] {
        for (auth, expect) in [
            (None, "authentication required"),
            (Some("Bearer wrong"), "invalid token"),
            (Some(&*format!("Bearer {TOKEN}x")), "invalid token"),
            (Some("Bearer "), "invalid token"),
            (
                Some(&*format!("Basic {TOKEN}")),
                "malformed Authorization header",
            ),
        ] {
            let (status, resp) = server.raw(method, path, auth, None);
            assert_eq!(status, 401, "{method} {path} with {auth:?}");
            assert_eq!(resp.header("WWW-Authenticate"), Some("Bearer"));
            let body: Value = serde_json::from_str(&resp.into_string().unwrap()).unwrap();
            let msg = error_of(&body);
            assert!(
                msg.starts_with(expect),
                "{method} {path} with {auth:?}: {msg}"
            );
            assert!(
                msg.contains("Authorization: Bearer <token>") && msg.contains("api-token"),
                "{msg}"
            );
        }
    }
    // The scheme name is case-insensitive.
    let (status, _) = server.raw(
        "GET",
        "/api/v1/status",
        Some(&format!("bearer {TOKEN}")),
        None,
    );
    assert_eq!(status, 200);
}

#[test]
fn volume_lifecycle() {
    let server = Server::start();
    let (status, list) = server.call("GET", "/api/v1/volumes", None);
    assert_eq!((status, list), (200, json!({"volumes": []})));

    let (status, resp) = server.raw(
        "POST",
        "/api/v1/volumes",
        Some(&format!("Bearer {TOKEN}")),
        Some(r#"{"name": "db", "size": "64M"}"#),
    );
    assert_eq!(status, 201);
    assert_eq!(resp.header("Location"), Some("/api/v1/volumes/db"));
    let created: Value = resp.into_json().unwrap();
    assert_eq!(created["name"], "db");
    assert_eq!(created["size_bytes"], 64 * MIB);
    assert_eq!(created["allocated_bytes"], 0);
    assert_eq!(created["open_connections"], 0);
    assert!(created["id"].as_str().unwrap().len() == 36);
    assert!(created["created_at"].as_str().unwrap().ends_with('Z'));

    let (status, got) = server.call("GET", "/api/v1/volumes/db", None);
    assert_eq!((status, &got), (200, &created));
    let (_, list) = server.call("GET", "/api/v1/volumes", None);
    assert_eq!(list["volumes"], json!([created]));

    let (status, grown) = server.call(
        "POST",
        "/api/v1/volumes/db/resize",
        Some(json!({"size": 128 * MIB})),
    );
    assert_eq!(
        (status, grown["size_bytes"].as_u64()),
        (200, Some(128 * MIB))
    );

    let (status, err) = server.call(
        "POST",
        "/api/v1/volumes/db/resize",
        Some(json!({"size": "32M"})),
    );
    assert_eq!(status, 409);
    assert!(error_of(&err).contains("allow_shrink"), "{err}");
    let (status, shrunk) = server.call(
        "POST",
        "/api/v1/volumes/db/resize",
        Some(json!({"size": "32M", "allow_shrink": true})),
    );
    assert_eq!(
        (status, shrunk["size_bytes"].as_u64()),
        (200, Some(32 * MIB))
    );

    let (status, body) = server.call("DELETE", "/api/v1/volumes/db", None);
    assert_eq!((status, body), (204, Value::Null));
    let (status, err) = server.call("GET", "/api/v1/volumes/db", None);
    assert_eq!(status, 404);
    assert_eq!(error_of(&err), "no volume named \"db\"");
}

#[test]
fn errors_map_to_status_codes() {
    let server = Server::start();
    let create = |body: Value| server.call("POST", "/api/v1/volumes", Some(body));

    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"name": "-bad", "size": "1G"}),
            400,
            "invalid volume name",
        ),
        (
            json!({"name": "a b", "size": "1G"}),
            400,
            "invalid volume name",
        ),
        (
            json!({"name": "v", "size": "ten gigs"}),
            400,
            "invalid size",
        ),
        (json!({"name": "v", "size": "10GB"}), 400, "ambiguous"),
        (
            json!({"name": "v", "size": 10000}),
            400,
            "use 8192 (8 KiB) or 12288 (12 KiB)",
        ),
        (json!({"name": "v", "size": 0}), 400, "greater than 0"),
        (json!({"name": "v"}), 400, "size is required"),
        (
            json!({"name": "v", "size": 4096, "colour": "red"}),
            400,
            "unknown field `colour`",
        ),
        (
            json!({"name": "v", "size": "1T"}),
            507,
            "not enough capacity",
        ),
    ];
    for (body, status, needle) in cases {
        let (got, err) = create(body.clone());
        assert_eq!(got, status, "{body}: {err}");
        assert!(error_of(&err).contains(needle), "{body}: {err}");
    }

    let (status, resp) = server.raw(
        "POST",
        "/api/v1/volumes",
        Some(&format!("Bearer {TOKEN}")),
        Some("{not json"),
    );
    assert_eq!(status, 400);
    let err: Value = resp.into_json().unwrap();
    assert!(error_of(&err).starts_with("invalid request body"), "{err}");

    assert_eq!(create(json!({"name": "v", "size": "4M"})).0, 201);
    let (status, err) = create(json!({"name": "v", "size": "4M"}));
    assert_eq!(status, 409);
    assert!(error_of(&err).contains("already exists"), "{err}");

    let (status, err) = server.call(
        "POST",
        "/api/v1/volumes/v/resize",
        Some(json!({"size": "2T"})),
    );
    assert_eq!(status, 507, "{err}");
    let (status, _) = server.call(
        "POST",
        "/api/v1/volumes/nope/resize",
        Some(json!({"size": "8M"})),
    );
    assert_eq!(status, 404);
    let (status, _) = server.call("DELETE", "/api/v1/volumes/nope", None);
    assert_eq!(status, 404);

    // Deleting a volume with a connected client is refused.
    let handle = server.service.open("v").unwrap();
    let (status, err) = server.call("DELETE", "/api/v1/volumes/v", None);
    assert_eq!(status, 409);
    assert!(
        error_of(&err).contains("in use by 1 open connection"),
        "{err}"
    );
    let (_, shown) = server.call("GET", "/api/v1/volumes/v", None);
    assert_eq!(shown["open_connections"], 1);
    drop(handle);
    assert_eq!(server.call("DELETE", "/api/v1/volumes/v", None).0, 204);

    let (status, err) = server.call("GET", "/api/v2/volumes", None);
    assert_eq!(status, 404);
    assert!(
        error_of(&err).contains("no such endpoint: GET /api/v2/volumes"),
        "{err}"
    );
    let (status, err) = server.call("PUT", "/api/v1/volumes", None);
    assert_eq!(status, 405);
    assert!(error_of(&err).contains("PUT is not supported"), "{err}");
}

#[test]
fn status_metrics_and_openapi() {
    let server = Server::start();
    server.call(
        "POST",
        "/api/v1/volumes",
        Some(json!({"name": "a", "size": "100M"})),
    );
    server.call(
        "POST",
        "/api/v1/volumes",
        Some(json!({"name": "b", "size": 4096})),
    );
    let (status, s) = server.call("GET", "/api/v1/status", None);
    assert_eq!(status, 200);
    assert_eq!(s["provisioned_bytes"], 100 * MIB + 4096);
    assert_eq!(s["volume_count"], 2);
    assert_eq!(s["overcommit_ratio"], 2.0);
    assert!(s["capacity_bytes"].as_u64().unwrap() > 0);
    assert!(s["extent_size"].as_u64().unwrap() > 0);
    assert_eq!(s["allocated_bytes"], 0);

    let auth = format!("Bearer {TOKEN}");
    let (status, resp) = server.raw("GET", "/metrics", Some(&auth), None);
    assert_eq!(status, 200);
    assert!(resp.content_type().starts_with("text/plain"));
    let text = resp.into_string().unwrap();
    assert!(text.contains("basalt_volumes 2"), "{text}");
    assert!(text.contains(&format!(
        "basalt_store_provisioned_bytes {}",
        100 * MIB + 4096
    )));

    let (status, resp) = server.raw("GET", "/api/v1/openapi.json", Some(&auth), None);
    assert_eq!(status, 200);
    assert_eq!(resp.content_type(), "application/json");
    let served: Value = resp.into_json().unwrap();
    assert_eq!(served, serde_json::from_str::<Value>(OPENAPI_JSON).unwrap());
}

#[test]
fn every_documented_route_is_served() {
    let server = Server::start();
    server.call(
        "POST",
        "/api/v1/volumes",
        Some(json!({"name": "v", "size": "4M"})),
    );
    let doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            let concrete = path.replace("{name}", "v");
            let body = (method == "post").then_some("{}");
            let auth = format!("Bearer {TOKEN}");
            let (status, resp) = server.raw(&method.to_uppercase(), &concrete, Some(&auth), body);
            assert_ne!(status, 405, "{method} {path}");
            let text = resp.into_string().unwrap();
            assert!(
                !text.contains("no such endpoint"),
                "{method} {path} not routed: {text}"
            );
        }
    }
}
