//! NBD over TLS with pre-shared keys, with clients nobody here wrote
//! (libnbd's nbdinfo and nbdcopy, qemu-io with `tls-creds-psk`, all on
//! GnuTLS): `--nbd-listen` without `--nbd-insecure` serves TLS only;
//! a project's key lists and opens that project's volumes and nothing else;
//! a wrong key, an unknown identity, a revoked key and a client without TLS
//! are refused; data copied in through TLS reads back the same.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Creates an NBD key with `args`, writes its `keys.psk` line to `file`
/// (0600) and returns its identity.
fn nbd_key(s: &Server, args: &[&str], file: &Path) -> String {
    let mut a = vec!["nbd-key", "create"];
    a.extend(args);
    let out = s.cli(&a);
    let line = out.ok().trim().to_string();
    let (identity, key) = line.split_once(':').expect("IDENTITY:KEY");
    assert_eq!(key.len(), 64, "{line}");
    std::fs::write(file, format!("{line}\n")).unwrap();
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    identity.to_string()
}

fn nbds(s: &Server, identity: &str, export: &str, psk: &Path) -> String {
    format!(
        "nbds://{identity}@{}/{export}?tls-psk-file={}",
        s.nbd_addr(),
        psk.display()
    )
}

#[test]
fn tls_keys_open_their_projects_volumes_only() {
    require_tool("nbdinfo");
    let s = Server::start_tls("512M");
    let dir = Scratch::new();
    s.cli(&["project", "create", "p1"]).ok();
    s.cli(&["project", "create", "p2"]).ok();
    s.cli(&["volume", "create", "v1", "--size", "16M", "--project", "p1"])
        .ok();
    s.cli(&["volume", "create", "v2", "--size", "16M", "--project", "p2"])
        .ok();
    s.create_volume("shared", "16M");
    let k1 = dir.path("p1.psk");
    let id1 = nbd_key(&s, &["--project", "p1"], &k1);
    assert!(id1.starts_with("p1."), "{id1}");

    // The project's key lists its volume only, and opens it.
    let listed = tool("nbdinfo", ["--list", "--json", &nbds(&s, &id1, "", &k1)]);
    let v: serde_json::Value = serde_json::from_str(listed.ok()).expect("nbdinfo JSON");
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["v1"], "{v}");
    assert_eq!(
        tool("nbdinfo", ["--size", &nbds(&s, &id1, "v1", &k1)])
            .ok()
            .trim(),
        (16 << 20).to_string()
    );
    // Another project's volume and a cluster-wide one look missing.
    for other in ["v2", "shared"] {
        let out = tool("nbdinfo", ["--size", &nbds(&s, &id1, other, &k1)]);
        assert!(out.code() != Some(0), "{}", out.describe());
        assert!(
            out.describe().contains("No such file") || out.describe().contains("not available"),
            "{other}: {}",
            out.describe()
        );
    }

    // Data through TLS, both ways, with requests in flight on several
    // connections (nbdcopy; fio's nbd engine may not read a PSK file).
    {
        let source = dir.path("source.raw");
        let back = dir.path("back.raw");
        let mut bytes = vec![0u8; 8 << 20];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for chunk in bytes.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(&source, &bytes).unwrap();
        let uri = nbds(&s, &id1, "v1", &k1);
        let source_arg = source.display().to_string();
        let back_arg = back.display().to_string();
        tool(
            "nbdcopy",
            ["--connections=2", "--requests=16", &source_arg, &uri],
        )
        .ok();
        tool("nbdcopy", ["--connections=2", &uri, &back_arg]).ok();
        let read = std::fs::read(&back).unwrap();
        assert_eq!(read.len(), 16 << 20);
        assert!(
            read[..8 << 20] == bytes[..],
            "data read back over TLS differs"
        );
        assert!(read[8 << 20..].iter().all(|b| *b == 0));
    }
    // qemu's own TLS client, with its PSK credentials directory.
    let creds = dir.path("qemu-creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::copy(&k1, creds.join("keys.psk")).unwrap();
    let object = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username={id1}",
        creds.display()
    );
    let (host, port) = s.nbd_addr().rsplit_once(':').unwrap();
    let image = format!("driver=nbd,host={host},port={port},export=v1,tls-creds=tls0");
    let out = tool(
        "qemu-io",
        [
            "--object",
            &object,
            "--image-opts",
            &image,
            "-c",
            "write -P 0x5a 1M 64k",
            "-c",
            "read -P 0x5a 1M 64k",
        ],
    );
    out.ok();
    assert!(
        !out.stdout.contains("Pattern verification failed"),
        "{}",
        out.describe()
    );

    // Refused: a wrong key, an unknown identity, no TLS at all.
    let wrong = dir.path("wrong.psk");
    std::fs::write(&wrong, format!("{id1}:{}\n", "0".repeat(64))).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let unknown = dir.path("unknown.psk");
    std::fs::write(&unknown, format!("nobody:{}\n", "1".repeat(64))).unwrap();
    std::fs::set_permissions(&unknown, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (what, uri) in [
        ("a wrong key", nbds(&s, &id1, "v1", &wrong)),
        ("an unknown identity", nbds(&s, "nobody", "v1", &unknown)),
        ("no TLS", format!("nbd://{}/v1", s.nbd_addr())),
    ] {
        let out = tool("nbdinfo", ["--size", &uri]);
        assert!(out.code() != Some(0), "{what}: {}", out.describe());
    }
    let plain_list = tool("nbdinfo", ["--list", &format!("nbd://{}", s.nbd_addr())]);
    assert!(
        !plain_list.stdout.contains("v1"),
        "a client without TLS must see nothing: {}",
        plain_list.describe()
    );

    // A cluster-wide key sees every volume; a revoked key opens nothing.
    let all = dir.path("all.psk");
    let id_all = nbd_key(&s, &[], &all);
    let listed = tool(
        "nbdinfo",
        ["--list", "--json", &nbds(&s, &id_all, "", &all)],
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(listed.ok()).unwrap()["exports"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let keys = s.cli_json(&["nbd-key", "list"]);
    assert_eq!(keys["keys"].as_array().unwrap().len(), 2, "{keys}");
    s.cli(&["nbd-key", "revoke", &id1]).ok();
    let out = tool("nbdinfo", ["--size", &nbds(&s, &id1, "v1", &k1)]);
    assert!(out.code() != Some(0), "revoked: {}", out.describe());
    // The server names the refused identity in its log.
    assert!(s.log().contains("unknown PSK identity"), "{}", s.log());
}

#[test]
fn project_admins_manage_their_own_nbd_keys_only() {
    let s = Server::start_tls("128M");
    s.cli(&["project", "create", "p1"]).ok();
    s.cli(&["project", "create", "p2"]).ok();
    let admin = s
        .cli(&["token", "create", "--project", "p1", "--role", "admin"])
        .ok()
        .trim()
        .to_string();
    let member = s
        .cli(&["token", "create", "--project", "p1", "--role", "member"])
        .ok()
        .trim()
        .to_string();
    s.cli(&["nbd-key", "create", "--project", "p1", "--token", &admin])
        .ok();
    let err = s
        .cli(&["nbd-key", "create", "--project", "p2", "--token", &admin])
        .cli_error(1);
    assert!(err.contains("no project named \"p2\""), "{err}");
    let err = s
        .cli(&["nbd-key", "create", "--token", &admin])
        .cli_error(1);
    assert!(err.contains("cluster-admin"), "{err}");
    let err = s
        .cli(&["nbd-key", "create", "--project", "p1", "--token", &member])
        .cli_error(1);
    assert!(err.contains("admin role"), "{err}");
    let listed = s.cli_json(&["nbd-key", "list", "--token", &admin]);
    let keys = listed["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert!(
        keys[0].get("key_hex").is_none(),
        "keys are never listed: {listed}"
    );

    // A deleted project's keys go with it: a project created later under
    // the same name is not opened by them.
    require_tool("nbdinfo");
    let dir = Scratch::new();
    s.cli(&["project", "create", "p3"]).ok();
    let k3 = dir.path("p3.psk");
    let id3 = nbd_key(&s, &["--project", "p3"], &k3);
    s.cli(&["project", "delete", "p3"]).ok();
    s.cli(&["project", "create", "p3"]).ok();
    s.cli(&["volume", "create", "v3", "--size", "4M", "--project", "p3"])
        .ok();
    let out = tool("nbdinfo", ["--size", &nbds(&s, &id3, "v3", &k3)]);
    assert!(out.code() != Some(0), "{}", out.describe());
}
