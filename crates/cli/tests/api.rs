//! The REST API's authentication and its fixed documents.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;

const ROUTES: [&str; 4] = [
    "/api/v1/volumes",
    "/api/v1/status",
    "/metrics",
    "/api/v1/openapi.json",
];

#[test]
fn every_route_requires_the_bearer_token() {
    let s = Server::start("64M");
    let token = s.token();
    assert!(token.len() >= 16, "api-token looks too weak: {token:?}");
    let mode = std::fs::metadata(s.data_dir().join("api-token"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "api-token mode is {mode:o}, expected 600");

    let wrong = format!("{token}x");
    for route in ROUTES {
        for (what, tok) in [
            ("no token", None),
            ("wrong token", Some(wrong.as_str())),
            ("empty token", Some("")),
        ] {
            let r = http(s.api_url(), "GET", route, tok, None);
            assert_eq!(
                r.status, 401,
                "GET {route} with {what}: status {} body {}",
                r.status, r.body
            );
            let v = r.json();
            assert!(
                v["error"].as_str().is_some_and(|e| !e.is_empty()),
                "GET {route} with {what}: 401 body must be JSON {{\"error\": ...}}, got {}",
                r.body
            );
        }
    }
    // Mutations need the token too, and are not carried out without it.
    let r = http(
        s.api_url(),
        "POST",
        "/api/v1/volumes",
        None,
        Some(r#"{"name":"sneaky","size":4194304}"#),
    );
    assert_eq!(r.status, 401, "POST without token: {} {}", r.status, r.body);
    assert!(find_volume(&s.cli_json(&["volume", "list"]), "sneaky").is_none());

    for route in ROUTES {
        let r = http(s.api_url(), "GET", route, Some(&token), None);
        assert_eq!(
            r.status, 200,
            "GET {route} with the token: {} {}",
            r.status, r.body
        );
    }
}

#[test]
fn volumes_status_metrics_openapi() {
    let s = Server::start("64M");
    let token = s.token();
    s.create_volume("apivol", "8M");

    let v = http(s.api_url(), "GET", "/api/v1/volumes", Some(&token), None).json();
    let vol =
        find_volume(&v, "apivol").unwrap_or_else(|| panic!("apivol not in /api/v1/volumes: {v}"));
    assert_eq!(volume_size(&vol), 8 * MIB);

    let st = http(s.api_url(), "GET", "/api/v1/status", Some(&token), None).json();
    assert!(st.is_object(), "/api/v1/status: {st}");

    let m = http(s.api_url(), "GET", "/metrics", Some(&token), None);
    assert!(
        m.headers
            .get("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "metrics content-type: {:?}",
        m.headers.get("content-type")
    );
    let cap = m
        .body
        .lines()
        .find(|l| l.starts_with("basalt_store_capacity_bytes"))
        .unwrap_or_else(|| {
            panic!(
                "no basalt_store_capacity_bytes sample in /metrics:\n{}",
                m.body
            )
        });
    let value: f64 = cap
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("bad sample line {cap:?}"));
    assert!(
        value > 0.0 && value <= (64 * MIB) as f64,
        "capacity sample {value} for a 64M store"
    );
    // Prometheus text format: every non-comment line is `name[{labels}] value`.
    for l in m
        .body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let mut parts = l.rsplitn(2, ' ');
        let val = parts.next().unwrap();
        assert!(
            parts.next().is_some() && val.parse::<f64>().is_ok(),
            "bad metrics line {l:?}"
        );
    }

    let o = http(
        s.api_url(),
        "GET",
        "/api/v1/openapi.json",
        Some(&token),
        None,
    )
    .json();
    let ver = o["openapi"]
        .as_str()
        .unwrap_or_else(|| panic!("openapi.json without `openapi`: {o}"));
    assert!(ver.starts_with('3'), "openapi version {ver}");
    assert!(
        o["paths"]
            .as_object()
            .is_some_and(|p| p.keys().any(|k| k.ends_with("/volumes"))),
        "openapi.json documents no /volumes path: {}",
        o["paths"]
    );
}

/// `basalt_volume_ops_total{volume="NAME",...,op="OP"}` from /metrics.
fn ops_total(s: &Server, volume: &str, op: &str) -> u64 {
    let m = http(s.api_url(), "GET", "/metrics", Some(&s.token()), None);
    assert_eq!(m.status, 200);
    let want_vol = format!("volume=\"{volume}\"");
    let want_op = format!("op=\"{op}\"");
    let line = m
        .body
        .lines()
        .find(|l| {
            l.starts_with("basalt_volume_ops_total{")
                && l.contains(&want_vol)
                && l.contains(&want_op)
        })
        .unwrap_or_else(|| panic!("no basalt_volume_ops_total for {volume}/{op}:\n{}", m.body));
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

#[test]
fn metrics_count_nbd_requests() {
    let s = Server::start("64M");
    s.create_volume("m", "8M");
    let uri = s.uri("m");
    let mut cmd = std::process::Command::new(require_tool("nbdsh"));
    cmd.env("PATH", path_for_nbdsh()).args([
        "-u",
        &uri,
        "-c",
        "h.pwrite(b'x' * 65536, 0)\n\
         h.pwrite(b'y' * 4096, 65536, nbd.CMD_FLAG_FUA)\n\
         h.flush()\n\
         h.flush()\n\
         h.trim(4096, 0)\n\
         h.zero(4096, 8192)\n\
         h.pread(4096, 0)\n\
         h.pread(4096, 4096)\n\
         h.pread(4096, 8192)",
    ]);
    run_cmd(&mut cmd, CMD_TIMEOUT).ok();
    // Each NBD request reaches the volume and is counted (a FLUSH answered
    // without reaching the store would show up here as 0).
    assert_eq!(ops_total(&s, "m", "write"), 2, "writes");
    assert_eq!(ops_total(&s, "m", "flush"), 2, "flushes");
    assert_eq!(ops_total(&s, "m", "trim"), 1, "trims");
    assert_eq!(ops_total(&s, "m", "write_zeroes"), 1, "write_zeroes");
    assert_eq!(ops_total(&s, "m", "read"), 3, "reads");
}
