//! Snapshots of replicated volumes through a cluster of `basalt server`
//! processes with a real etcd: a snapshot taken under fio load while the
//! primary is SIGKILLed is identical on every replica; a replica that was
//! down when a snapshot was taken rebuilds it when it returns (and its
//! head); the snapshot is exported read-only over NBD by each replica's
//! node; rollback makes every replica read as the snapshot; deletion
//! removes the snapshot everywhere.

mod common;

use common::cluster::*;
use common::*;
use serde_json::Value;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// `volume local-digest` of `name` (a volume or `VOLUME@SNAPSHOT`) on each
/// of `nodes`.
fn local_digests(c: &Cluster, nodes: &[usize], name: &str) -> Vec<(u64, u64)> {
    nodes
        .iter()
        .map(|i| {
            let d = c.nodes[*i].cli_json(&["volume", "local-digest", name]);
            (
                d["crc32c"].as_u64().expect("crc32c"),
                d["size_bytes"].as_u64().expect("size_bytes"),
            )
        })
        .collect()
}

#[track_caller]
fn assert_same_everywhere(c: &Cluster, name: &str) -> (u64, u64) {
    let d = local_digests(c, &[0, 1, 2], name);
    assert!(
        d.iter().all(|x| *x == d[0]),
        "{name} differs between the replicas (crc32c, size): {d:?}\n{}",
        c.logs()
    );
    d[0]
}

#[test]
fn replicated_snapshots_survive_failover_rebuild_rollback_and_delete() {
    require_tool("fio");
    let seed = test_seed("replicated_snapshots") % 1_000_000;
    let mut c = Cluster::start(3, &[]);
    let v = c.create_rf3("sv", "32M");
    let p = node_index(&primary(&v).expect("a primary"));
    let via = (p + 1) % 3;
    let uri = c.nodes[via].uri("sv");
    // Beyond fio's 16 MiB.
    write_pattern(None, &uri, seed, 1, 16 * MIB, 8 * MIB);

    // Under fio load, through a node that is not the primary: a snapshot,
    // then the primary killed right after it answered.
    let scratch = Scratch::new();
    let fio = Background::spawn(fio_verify(None, &scratch.0, "snapload", &uri, 8, 10));
    std::thread::sleep(Duration::from_secs(3));
    let out = c.nodes[via].cli(&["snapshot", "create", "sv", "s1"]);
    assert!(out.code() == Some(0), "snapshot create: {}", out.describe());
    eprintln!("snapshot taken; killing the primary node{p}");
    c.nodes[p].kill9();
    std::thread::sleep(Duration::from_secs(3));
    c.nodes[p].restart();
    let (st, out, err) = fio.finish(Duration::from_secs(120));
    assert!(st.success(), "fio failed:\n{out}\n{err}\n{}", c.logs());
    c.wait_volume(via, "sv", "in sync after the primary returned", |v| {
        all_in_sync(v, 3)
    });
    let s1 = assert_same_everywhere(&c, "sv@s1");
    c.assert_replicas_equal(&[0, 1, 2], "sv");
    // Read-only over NBD on every replica's node, as it was when taken.
    for i in 0..3 {
        verify_pattern(None, &c.nodes[i].uri("sv@s1"), seed, 1, 16 * MIB, 8 * MIB);
    }
    let snap = c.nodes[via].cli_json(&["snapshot", "show", "sv@s1"]);
    assert_eq!(snap["name"], "s1", "{snap:#}");

    // A replica down while a snapshot is taken rebuilds it when it returns.
    let v = c.show(via, "sv");
    let p = node_index(&primary(&v).expect("a primary"));
    let down = (p + 1) % 3;
    let live = (p + 2) % 3;
    c.nodes[down].kill9();
    let uri = c.nodes[live].uri("sv");
    write_pattern(None, &uri, seed, 2, 20 * MIB, 4 * MIB);
    let out = c.nodes[live].cli(&["snapshot", "create", "sv", "s2"]);
    assert!(out.code() == Some(0), "snapshot create: {}", out.describe());
    write_pattern(None, &uri, seed, 3, 24 * MIB, 4 * MIB);
    c.nodes[down].restart();
    c.wait_volume(live, "sv", "in sync after the replica returned", |v| {
        all_in_sync(v, 3)
    });
    let s2 = assert_same_everywhere(&c, "sv@s2");
    assert_ne!(s1, s2, "s2 holds writes s1 does not");
    assert_same_everywhere(&c, "sv@s1");
    c.assert_replicas_equal(&[0, 1, 2], "sv");
    verify_pattern(
        None,
        &c.nodes[down].uri("sv@s2"),
        seed,
        2,
        20 * MIB,
        4 * MIB,
    );
    verify_pattern(None, &c.nodes[down].uri("sv"), seed, 3, 24 * MIB, 4 * MIB);
    // It rebuilt s2 (a second snapshot taken in its store, after its head
    // was rolled back onto s1), and nothing failed on the way.
    let log = c.nodes[down].log();
    let s2_id = c.nodes[live].cli_json(&["snapshot", "show", "sv@s2"])["id"]
        .as_str()
        .expect("the snapshot's id")
        .to_string();
    assert!(
        log.lines()
            .any(|l| l.contains("snapshot taken") && l.contains(&s2_id)),
        "node{down} never took s2 ({s2_id}) in its store:\n{log}"
    );
    assert!(
        log.contains("volume rolled back"),
        "node{down} did not rebase its head:\n{log}"
    );
    assert!(
        !log.contains("replica layer operation failed"),
        "layer operations failed on node{down}:\n{log}"
    );

    // Diffs between snapshots on any replica's node: every one names the
    // writes of gen 2 and nothing outside what was written between s1 and
    // s2 (fio's 16 MiB, still running after s1, and gen 2). A rebuilt
    // layer may name whole regions where the others name 4 KiB blocks.
    for i in 0..3 {
        let d = c.nodes[i].cli_json(&["volume", "diff", "sv@s1", "sv@s2"]);
        let ranges: Vec<(u64, u64)> = d["extents"]
            .as_array()
            .expect("extents")
            .iter()
            .map(|e| {
                (
                    e["offset"].as_u64().unwrap_or(0),
                    e["length"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        let covered: u64 = ranges
            .iter()
            .map(|(o, l)| (o + l).min(24 * MIB).saturating_sub((*o).max(20 * MIB)))
            .sum();
        assert_eq!(covered, 4 * MIB, "node{i} misses writes of gen 2: {d}");
        assert!(
            ranges
                .iter()
                .all(|(o, l)| o + l <= 16 * MIB || (*o >= 20 * MIB && o + l <= 24 * MIB)),
            "node{i} names ranges nobody wrote between s1 and s2: {d}"
        );
    }

    // Rollback: every replica reads as s1 again.
    write_pattern(None, &uri, seed, 4, 0, 8 * MIB);
    let out = c.nodes[live].cli(&["volume", "rollback", "sv", "--to", "s1"]);
    assert!(out.code() == Some(0), "rollback: {}", out.describe());
    c.wait_volume(live, "sv", "in sync after the rollback", |v| {
        all_in_sync(v, 3)
    });
    assert_eq!(
        assert_same_everywhere(&c, "sv"),
        s1,
        "after the rollback the volume reads as s1"
    );

    // Deletion: gone from the catalog and from every replica's store.
    let out = c.nodes[p].cli(&["snapshot", "delete", "sv@s2"]);
    assert!(out.code() == Some(0), "snapshot delete: {}", out.describe());
    let list: Value = c.nodes[live].cli_json(&["snapshot", "list", "sv"]);
    let names: Vec<&str> = list["snapshots"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, vec!["s1"], "{list:#}");
    assert_same_everywhere(&c, "sv@s1");
    // Clones in a cluster are not there yet: one clear line.
    let out = c.nodes[0].cli(&["volume", "create", "cl", "--from", "sv@s1"]);
    assert_ne!(out.code(), Some(0));
    assert!(
        out.stderr
            .contains("clones in a cluster are not supported yet"),
        "{}",
        out.describe()
    );
}
