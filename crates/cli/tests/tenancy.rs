//! Projects, tokens, quotas and volume types through the CLI and the REST
//! API of a real server: the isolation matrix (a project token cannot list,
//! show, resize, delete, snapshot, attach, clone or retype another
//! project's volume, and gets 404 as for a missing one), each quota refused
//! with a one-line error naming it (also when two creates race for the
//! last unit), tokens that are revoked or expired stop working, and volume
//! types give their policies to new volumes and to retyped ones.

mod common;

use common::*;
use serde_json::Value;

/// Creates a token with `args` as the admin and returns its text.
fn token(s: &Server, args: &[&str]) -> String {
    let mut a = vec!["token", "create"];
    a.extend(args);
    let out = s.cli(&a);
    let text = out.ok().trim().to_string();
    assert!(text.starts_with("bst_"), "{}", out.describe());
    text
}

/// `basalt ARGS --token TOKEN`.
fn as_token(s: &Server, token: &str, args: &[&str]) -> CmdOutput {
    let mut a = args.to_vec();
    a.extend(["--token", token]);
    s.cli(&a)
}

fn as_token_json(s: &Server, token: &str, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["--output", "json"]);
    let out = as_token(s, token, &a);
    out.ok();
    serde_json::from_str(&out.stdout).expect("JSON")
}

fn names(list: &Value, key: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn projects_are_isolated_through_the_cli_and_the_api() {
    let s = Server::start("512M");
    s.cli(&["project", "create", "alpha"]).ok();
    s.cli(&["project", "create", "beta"]).ok();
    let a = token(&s, &["--project", "alpha", "--role", "member"]);
    let b = token(&s, &["--project", "beta", "--role", "member"]);

    as_token(&s, &a, &["volume", "create", "a-vol", "--size", "16M"]).ok();
    as_token(&s, &b, &["volume", "create", "b-vol", "--size", "16M"]).ok();
    as_token(&s, &a, &["snapshot", "create", "a-vol", "s1"]).ok();
    s.create_volume("admin-vol", "16M");

    // Each project lists only its own; the admin lists all, with owners.
    let listed = as_token_json(&s, &a, &["volume", "list"]);
    assert_eq!(names(&listed, "volumes"), ["a-vol"], "{listed}");
    let all = s.cli_json(&["volume", "list"]);
    let owner = |n: &str| find_volume(&all, n).unwrap()["project"].clone();
    assert_eq!(owner("a-vol"), "alpha");
    assert_eq!(owner("b-vol"), "beta");
    assert_eq!(owner("admin-vol"), Value::Null);
    let snaps = as_token_json(&s, &b, &["snapshot", "list"]);
    assert!(snaps["snapshots"].as_array().unwrap().is_empty(), "{snaps}");

    // Everything B tries on A's volume answers exactly like a missing one.
    for (what, args) in [
        ("show", vec!["volume", "show", "a-vol"]),
        ("resize", vec!["volume", "resize", "a-vol", "--size", "32M"]),
        ("delete", vec!["volume", "delete", "a-vol"]),
        ("snapshot", vec!["snapshot", "create", "a-vol", "mine"]),
        ("snapshot show", vec!["snapshot", "show", "a-vol@s1"]),
        ("snapshot delete", vec!["snapshot", "delete", "a-vol@s1"]),
        ("diff", vec!["volume", "diff", "a-vol@s1"]),
        // Its own volume against A's snapshot: A's blocks stay unseen.
        (
            "diff from A's snapshot",
            vec!["volume", "diff", "a-vol@s1", "b-vol"],
        ),
        (
            "attach",
            vec![
                "volume",
                "attach",
                "a-vol",
                "--host-nqn",
                "nqn.2014-08.org.nvmexpress:uuid:x",
            ],
        ),
        (
            "clone",
            vec!["volume", "create", "stolen", "--from", "a-vol@s1"],
        ),
        (
            "rollback",
            vec!["volume", "rollback", "a-vol", "--to", "s1"],
        ),
        ("disconnect", vec!["volume", "disconnect", "a-vol"]),
    ] {
        let err = as_token(&s, &b, &args).cli_error(1);
        assert!(
            err.contains("no volume named \"a-vol\""),
            "{what}: B must see A's volume as missing, got {err:?}"
        );
        // The same words as for a volume that does not exist at all.
        let missing: Vec<&str> = args
            .iter()
            .map(|a| match *a {
                "a-vol" => "nothing-here",
                "a-vol@s1" => "nothing-here@s1",
                other => other,
            })
            .collect();
        let err2 = as_token(&s, &b, &missing).cli_error(1);
        assert_eq!(
            err.replace("a-vol", "X"),
            err2.replace("nothing-here", "X"),
            "{what}"
        );
    }
    // A member cannot reach the cluster-admin endpoints, nor the admin's
    // volumes, nor create in another project.
    let err = as_token(&s, &a, &["volume", "set-qos", "a-vol", "total_iops_sec=1"]).cli_error(1);
    assert!(err.contains("cluster-admin"), "{err}");
    let err = as_token(&s, &a, &["project", "create", "gamma"]).cli_error(1);
    assert!(err.contains("cluster-admin"), "{err}");
    let err = as_token(&s, &a, &["volume", "show", "admin-vol"]).cli_error(1);
    assert!(err.contains("no volume named"), "{err}");
    let err = as_token(
        &s,
        &a,
        &["volume", "create", "x", "--size", "4M", "--project", "beta"],
    )
    .cli_error(1);
    assert!(err.contains("only"), "{err}");
    let r = http(s.api_url(), "GET", "/metrics", Some(&a), None);
    assert_eq!(r.status, 403, "{}", r.body);
    let r = http(s.api_url(), "GET", "/api/v1/volumes/a-vol", Some(&b), None);
    assert_eq!(r.status, 404, "{}", r.body);
    // Projects: each sees its own only.
    let projects = as_token_json(&s, &a, &["project", "list"]);
    assert_eq!(names(&projects, "projects"), ["alpha"], "{projects}");
    as_token(&s, &a, &["project", "show", "beta"]).cli_error(1);

    // A's own operations work, and nothing of B's changed.
    as_token(
        &s,
        &a,
        &["volume", "create", "a-clone", "--from", "a-vol@s1"],
    )
    .ok();
    let clone = as_token_json(&s, &a, &["volume", "show", "a-clone"]);
    assert_eq!(
        clone["project"], "alpha",
        "a clone belongs to its source's project"
    );
    let b_vol = as_token_json(&s, &b, &["volume", "show", "b-vol"]);
    assert_eq!(volume_size(&b_vol), 16 << 20);

    // Tokens: a project admin manages its project's tokens only; a revoked
    // token stops working at once.
    let a_admin = token(&s, &["--project", "alpha", "--role", "admin"]);
    let a2 = token(&s, &["--project", "alpha", "--role", "member"]);
    let listed = as_token_json(&s, &a_admin, &["token", "list"]);
    assert!(
        listed["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["project"] == "alpha" && t.get("secret_sha256").is_none()),
        "{listed}"
    );
    let err = as_token(
        &s,
        &a_admin,
        &["token", "create", "--project", "beta", "--role", "member"],
    )
    .cli_error(1);
    assert!(err.contains("no project named"), "{err}");
    let err = as_token(&s, &a, &["token", "list"]).cli_error(1);
    assert!(err.contains("admin"), "{err}");
    let id = a2.split('_').nth(1).unwrap().to_string();
    as_token(&s, &a2, &["volume", "list"]).ok();
    as_token(&s, &a_admin, &["token", "revoke", &id]).ok();
    let r = http(s.api_url(), "GET", "/api/v1/volumes", Some(&a2), None);
    assert_eq!(r.status, 401, "a revoked token: {}", r.body);
    // A forged secret for a real id is refused.
    let forged = format!("bst_{}_{}", a.split('_').nth(1).unwrap(), "0".repeat(64));
    let r = http(s.api_url(), "GET", "/api/v1/volumes", Some(&forged), None);
    assert_eq!(r.status, 401, "a forged token: {}", r.body);

    // An expiring token works, then stops.
    let short = token(
        &s,
        &["--project", "beta", "--role", "member", "--expires", "2s"],
    );
    as_token(&s, &short, &["volume", "list"]).ok();
    std::thread::sleep(std::time::Duration::from_millis(3100));
    let r = http(s.api_url(), "GET", "/api/v1/volumes", Some(&short), None);
    assert_eq!(r.status, 401, "an expired token: {}", r.body);
    let all_tokens = s.cli_json(&["token", "list"]);
    assert!(
        all_tokens["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["expired"] == true),
        "{all_tokens}"
    );

    // A project with volumes is not deleted; once empty it is, with its
    // tokens.
    let err = s.cli(&["project", "delete", "beta"]).cli_error(1);
    assert!(err.contains("still has volumes (b-vol)"), "{err}");
    as_token(&s, &b, &["volume", "delete", "b-vol"]).ok();
    s.cli(&["project", "delete", "beta"]).ok();
    let r = http(s.api_url(), "GET", "/api/v1/volumes", Some(&b), None);
    assert_eq!(r.status, 401, "a deleted project's token: {}", r.body);
}

#[test]
fn quotas_refuse_growth_with_one_line_naming_the_quota() {
    let s = Server::start("512M");
    s.cli(&[
        "project",
        "create",
        "q",
        "--capacity",
        "64M",
        "--volumes",
        "3",
        "--snapshots",
        "1",
    ])
    .ok();
    let t = token(&s, &["--project", "q", "--role", "member"]);
    as_token(&s, &t, &["volume", "create", "v1", "--size", "32M"]).ok();

    let err = as_token(&s, &t, &["volume", "create", "v2", "--size", "33M"]).cli_error(1);
    assert!(
        err.contains("quota exceeded") && err.contains("capacity"),
        "{err}"
    );
    let err = as_token(&s, &t, &["volume", "resize", "v1", "--size", "65M"]).cli_error(1);
    assert!(err.contains("capacity"), "{err}");
    as_token(&s, &t, &["snapshot", "create", "v1", "s1"]).ok();
    let err = as_token(&s, &t, &["snapshot", "create", "v1", "s2"]).cli_error(1);
    assert!(err.contains("may hold 1 of snapshots"), "{err}");
    // A clone of VOLUME takes a snapshot first: refused whole, nothing left.
    let err = as_token(&s, &t, &["volume", "create", "c", "--from", "v1"]).cli_error(1);
    assert!(err.contains("snapshots"), "{err}");
    let shown = as_token_json(&s, &t, &["volume", "show", "v1"]);
    assert_eq!(shown["snapshots"], serde_json::json!(["s1"]), "{shown}");
    let r = http(
        s.api_url(),
        "POST",
        "/api/v1/volumes",
        Some(&t),
        Some(r#"{"name":"v9","size":"64M"}"#),
    );
    assert_eq!(r.status, 413, "{}", r.body);

    // Two creates racing for the last volume: exactly one wins.
    s.cli(&[
        "project",
        "set-quota",
        "q",
        "--capacity",
        "none",
        "--volumes",
        "2",
    ])
    .ok();
    let results: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let (url, t) = (s.api_url().to_string(), t.clone());
                scope.spawn(move || {
                    let body = format!(r#"{{"name":"race{i}","size":"4M"}}"#);
                    http(&url, "POST", "/api/v1/volumes", Some(&t), Some(&body)).status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = results.clone();
    sorted.sort();
    assert_eq!(sorted, [201, 413], "{results:?}");
    let project = s.cli_json(&["project", "show", "q"]);
    assert_eq!(project["usage"]["volumes"], 2, "{project}");

    // Lowering a quota below use only stops growth: deletes still work.
    s.cli(&["project", "set-quota", "q", "--volumes", "1"]).ok();
    let v = as_token_json(&s, &t, &["volume", "list"]);
    let victim = names(&v, "volumes")
        .into_iter()
        .find(|n| n != "v1")
        .unwrap();
    as_token(&s, &t, &["volume", "delete", &victim]).ok();

    // Bad quota input: one line each.
    let err = s
        .cli(&["project", "set-quota", "q", "--volumes", "lots"])
        .cli_error(1);
    assert!(err.contains("not a count"), "{err}");
    let err = s.cli(&["project", "set-quota", "q"]).cli_error(1);
    assert!(err.contains("nothing to change"), "{err}");
    let err = s.cli(&["project", "create", "bad name"]).cli_error(1);
    assert!(err.contains("invalid project name"), "{err}");
}

#[test]
fn volume_types_give_their_policies_and_retype_changes_them_online() {
    let s = Server::start("512M");
    s.cli(&["project", "create", "p"]).ok();
    s.cli(&["project", "create", "other"]).ok();
    s.cli(&[
        "type",
        "create",
        "gold",
        "--qos",
        "total_iops_sec=5000",
        "--default",
    ])
    .ok();
    s.cli(&[
        "type",
        "create",
        "bronze",
        "--qos",
        "total_iops_sec=100,write_bytes_sec=10M",
        "--project",
        "p",
    ])
    .ok();
    s.cli(&["type", "create", "private", "--project", "other"])
        .ok();
    let t = token(&s, &["--project", "p", "--role", "member"]);

    // The default type applies without --type; --type picks another.
    as_token(&s, &t, &["volume", "create", "v", "--size", "8M"]).ok();
    let v = as_token_json(&s, &t, &["volume", "show", "v"]);
    assert_eq!(v["volume_type"], "gold", "{v}");
    assert_eq!(v["qos"]["total_iops_sec"], 5000, "{v}");
    as_token(
        &s,
        &t,
        &["volume", "create", "w", "--size", "8M", "--type", "bronze"],
    )
    .ok();
    let w = as_token_json(&s, &t, &["volume", "show", "w"]);
    assert_eq!(w["qos"]["write_bytes_sec"], 10 << 20, "{w}");

    // A project sees public types and its own, not another's.
    let types = as_token_json(&s, &t, &["type", "list"]);
    assert_eq!(names(&types, "types"), ["bronze", "gold"], "{types}");
    let err = as_token(
        &s,
        &t,
        &["volume", "create", "x", "--size", "8M", "--type", "private"],
    )
    .cli_error(1);
    assert!(err.contains("no volume type named \"private\""), "{err}");

    // Retype online: the QoS follows at once.
    as_token(&s, &t, &["volume", "retype", "v", "bronze"]).ok();
    let v = as_token_json(&s, &t, &["volume", "show", "v"]);
    assert_eq!(v["volume_type"], "bronze");
    assert_eq!(v["qos"]["total_iops_sec"], 100, "{v}");

    // A type in use stays; a single node refuses replicated types.
    let err = s.cli(&["type", "delete", "bronze"]).cli_error(1);
    assert!(err.contains("used by volumes"), "{err}");
    let err = s
        .cli(&["type", "create", "triple", "--replicas", "3"])
        .cli_error(1);
    assert!(err.contains("cluster"), "{err}");
    let err = as_token(&s, &t, &["type", "delete", "gold"]).cli_error(1);
    assert!(err.contains("cluster-admin"), "{err}");
    // Deleting the default type clears the default.
    s.cli(&[
        "volume", "create", "plain", "--size", "4M", "--type", "private",
    ])
    .ok();
    as_token(&s, &t, &["volume", "retype", "v", "bronze"]).ok();
    s.cli(&["type", "set-default", "none"]).ok();
    s.cli(&["type", "set-default", "gold"]).ok();
    s.cli(&["type", "delete", "gold"]).ok();
    as_token(&s, &t, &["volume", "create", "y", "--size", "4M"]).ok();
    let y = as_token_json(&s, &t, &["volume", "show", "y"]);
    assert!(y.get("volume_type").is_none(), "{y}");
    let listed = s.cli(&["type", "list"]);
    assert!(!listed.ok().contains("(default)"), "{}", listed.describe());
}
