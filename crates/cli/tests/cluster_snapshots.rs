//! Snapshots of replicated volumes through a cluster of `basalt server`
//! processes with a real etcd: a snapshot taken under fio load while the
//! primary is SIGKILLed is identical on every replica; a replica that was
//! down when a snapshot was taken rebuilds it when it returns (and its
//! head); the snapshot is exported read-only over NBD by each replica's
//! node; rollback makes every replica read as the snapshot; deletion
//! removes the snapshot everywhere. A clone of a replicated snapshot is
//! replicated on the nodes holding it; a lost replica of it is rebuilt
//! from the snapshot on a node that holds it (only what the clone changed
//! is copied), waiting for its source's replica to be rebuilt there first.

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
    assert!(
        st.success(),
        "fio failed ({st:?}):\n{err}\n{out}\n{}",
        c.logs()
    );
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
}

/// The nodes `v`'s replicas are on, by index, sorted.
fn replica_nodes(v: &Value) -> Vec<usize> {
    node_names(v).iter().map(|n| node_index(n)).collect()
}

#[test]
fn clones_of_replicated_snapshots_are_replicated_and_rebuilt_from_the_snapshot_elsewhere() {
    let seed = test_seed("replicated_clones") % 1_000_000;
    // Replicas unreachable for 2 s are rebuilt on another node.
    let mut c = Cluster::start_with(3, &[], |_| vec!["--replace-after".into(), "2".into()]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "gold",
            "--size",
            "16M",
            "--replicas",
            "2",
        ])
        .ok();
    let gold = c.wait_volume(0, "gold", "placed and in sync", healthy);
    let holders = replica_nodes(&gold);
    write_pattern(None, &c.nodes[0].uri("gold"), seed, 1, 0, 12 * MIB);
    let out = c.nodes[0].cli(&["snapshot", "create", "gold", "base"]);
    assert!(out.code() == Some(0), "snapshot create: {}", out.describe());
    write_pattern(None, &c.nodes[0].uri("gold"), seed, 2, 0, 4 * MIB);

    // A clone is replicated as its source is, on the nodes holding the
    // snapshot, each replica made from it there: equal from the start.
    let out = c.nodes[0].cli(&["volume", "create", "vm1", "--from", "gold@base"]);
    assert!(out.code() == Some(0), "clone: {}", out.describe());
    let vm1 = c.wait_volume(0, "vm1", "placed and in sync", healthy);
    assert_eq!(replica_nodes(&vm1), holders, "{vm1:#}");
    assert_eq!(vm1["clone_of"], "gold@base", "{vm1:#}");
    let base = local_digests(&c, &holders, "gold@base")[0];
    assert_eq!(
        local_digests(&c, &holders, "vm1"),
        vec![base; holders.len()],
        "the clone's replicas read as the snapshot"
    );
    for i in 0..3 {
        verify_pattern(None, &c.nodes[i].uri("vm1"), seed, 1, 0, 12 * MIB);
    }
    for h in &holders {
        assert!(
            c.nodes[*h]
                .log()
                .contains("created the local replica from its source snapshot"),
            "node{h} did not make its replica of vm1 from the snapshot:\n{}",
            c.nodes[*h].log()
        );
    }
    // It diverges on write, on every replica, without touching its source.
    write_pattern(None, &c.nodes[0].uri("vm1"), seed, 3, 8 * MIB, 8 * MIB);
    c.assert_replicas_equal(&holders, "vm1");
    assert_eq!(local_digests(&c, &holders, "gold@base"), vec![base; 2]);
    verify_pattern(None, &c.nodes[1].uri("gold"), seed, 2, 0, 4 * MIB);
    verify_pattern(None, &c.nodes[2].uri("vm1"), seed, 1, 0, 8 * MIB);
    verify_pattern(None, &c.nodes[2].uri("vm1"), seed, 3, 8 * MIB, 8 * MIB);

    // A snapshot with clones is not deleted: one line naming them.
    let out = c.nodes[0].cli(&["snapshot", "delete", "gold@base"]);
    assert_ne!(out.code(), Some(0));
    assert!(out.stderr.contains("vm1"), "{}", out.describe());

    // A holder lost: both volumes are rebuilt on the third node, which
    // lacks the snapshot: the clone waits until its source's replica there
    // is in sync, then is made from the snapshot there and rebuilt from it.
    let p = node_index(&primary(&vm1).expect("a primary"));
    let lost = *holders.iter().find(|h| **h != p).expect("a second holder");
    let spare = (0..3).find(|i| !holders.contains(i)).expect("a spare node");
    c.nodes[lost].kill9();
    for name in ["vm1", "gold"] {
        c.wait_volume(p, name, "rebuilt on the spare node", |v| {
            healthy(v) && replica_nodes(v).contains(&spare)
        });
    }
    c.assert_replicas_equal(&[p, spare], "vm1");
    c.assert_replicas_equal(&[p, spare], "gold@base");
    let log = c.nodes[spare].log();
    assert!(
        log.contains("created the local replica from its source snapshot held here"),
        "node{spare} did not make vm1's replica from gold@base:\n{log}"
    );
    verify_pattern(None, &c.nodes[spare].uri("vm1"), seed, 1, 0, 8 * MIB);
    verify_pattern(None, &c.nodes[spare].uri("vm1"), seed, 3, 8 * MIB, 8 * MIB);
    // The lost node returns: its old copies go, the clone's (flattened
    // first if the source's goes before it) without a failure.
    c.nodes[lost].restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline
        && c.nodes[lost].cli(&["volume", "local-digest", "vm1"]).code() == Some(0)
    {
        std::thread::sleep(Duration::from_millis(300));
    }
    let log = c.nodes[lost].log();
    assert!(
        !log.contains("could not delete a local replica"),
        "node{lost} could not delete its old copies:\n{log}"
    );

    // `--from VOLUME` snapshots implicitly; deleting the clones frees the
    // snapshot.
    let out = c.nodes[spare].cli(&["volume", "create", "vm2", "--from", "gold"]);
    assert!(out.code() == Some(0), "clone: {}", out.describe());
    let vm2 = c.wait_volume(spare, "vm2", "placed and in sync", healthy);
    assert_eq!(replica_nodes(&vm2), vec![p.min(spare), p.max(spare)]);
    verify_pattern(None, &c.nodes[lost].uri("vm2"), seed, 2, 0, 4 * MIB);

    // Flattening goes to every replica: vm1 no longer needs gold@base,
    // which can then go while vm1 keeps its content.
    let out = c.nodes[lost].cli(&["volume", "flatten", "vm1", "--rate", "64M"]);
    assert!(out.code() == Some(0), "flatten: {}", out.describe());
    assert!(
        c.show(p, "vm1")["clone_of"].is_null(),
        "{:#}",
        c.show(p, "vm1")
    );
    let out = c.nodes[p].cli(&["snapshot", "delete", "gold@base"]);
    assert!(out.code() == Some(0), "snapshot delete: {}", out.describe());
    // Every replica was flattened by the protocol, none only when the
    // snapshot went.
    let vm1_id = c.show(p, "vm1")["id"].as_str().expect("an id").to_string();
    for i in [p, spare] {
        let log = c.nodes[i].log();
        assert!(
            !log.lines()
                .any(|l| l.contains("flattening a local clone") && l.contains(&vm1_id)),
            "node{i} flattened vm1 only when its source snapshot went:\n{log}"
        );
    }
    c.assert_replicas_equal(&[p, spare], "vm1");
    c.assert_replicas_equal(&[p, spare], "gold");
    verify_pattern(None, &c.nodes[lost].uri("vm1"), seed, 1, 0, 8 * MIB);
    verify_pattern(None, &c.nodes[lost].uri("vm1"), seed, 3, 8 * MIB, 8 * MIB);
    // A replicated clone with snapshots of its own is flattened with
    // them: its oldest snapshot takes the source's blocks on every
    // replica, and the source can go while both keep their content.
    let out = c.nodes[p].cli(&["snapshot", "create", "vm2", "mine"]);
    assert!(out.code() == Some(0), "snapshot create: {}", out.describe());
    write_pattern(None, &c.nodes[p].uri("vm2"), seed, 4, 2 * MIB, 4 * MIB);
    let out = c.nodes[lost].cli(&["volume", "flatten", "vm2"]);
    assert!(out.code() == Some(0), "flatten: {}", out.describe());
    assert!(
        c.show(p, "vm2")["clone_of"].is_null(),
        "{:#}",
        c.show(p, "vm2")
    );
    let out = c.nodes[p].cli(&["snapshot", "delete", "gold@clone-vm2"]);
    assert!(out.code() == Some(0), "snapshot delete: {}", out.describe());
    c.assert_replicas_equal(&[p, spare], "vm2");
    c.assert_replicas_equal(&[p, spare], "vm2@mine");
    // A snapshot is exported by the nodes holding it.
    let (vm2, mine) = (c.nodes[lost].uri("vm2"), c.nodes[p].uri("vm2@mine"));
    verify_pattern(None, &mine, seed, 2, 0, 4 * MIB);
    verify_pattern(None, &mine, seed, 1, 4 * MIB, 8 * MIB);
    verify_pattern(None, &vm2, seed, 2, 0, 2 * MIB);
    verify_pattern(None, &vm2, seed, 4, 2 * MIB, 4 * MIB);
    verify_pattern(None, &vm2, seed, 1, 6 * MIB, 6 * MIB);
    for args in [
        &["snapshot", "delete", "vm2@mine"][..],
        &["volume", "delete", "vm2"],
    ] {
        let out = c.nodes[p].cli(args);
        assert!(out.code() == Some(0), "{args:?}: {}", out.describe());
    }
    c.assert_replicas_equal(&[p, spare], "gold");
    for i in 0..3 {
        let log = c.nodes[i].log();
        assert!(
            !log.contains("replica layer operation failed"),
            "layer operations failed on node{i}:\n{log}"
        );
    }
}

/// A clone's replica rebuilt on a node that holds its source snapshot is
/// made from the snapshot there and rebuilt from it: only what the clone
/// wrote is copied and allocated, and it reads as the other replica.
#[test]
fn a_clone_replica_rebuilt_where_its_source_is_copies_only_what_the_clone_changed() {
    let seed = test_seed("thin_clone_rebuild") % 1_000_000;
    let mut c = Cluster::start_with(3, &[], |_| vec!["--replace-after".into(), "2".into()]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "gold",
            "--size",
            "32M",
            "--replicas",
            "2",
        ])
        .ok();
    c.wait_volume(0, "gold", "placed and in sync", healthy);
    write_pattern(None, &c.nodes[0].uri("gold"), seed, 1, 0, 24 * MIB);
    c.nodes[0].cli(&["snapshot", "create", "gold", "base"]).ok();
    c.nodes[0]
        .cli(&["volume", "create", "vm1", "--from", "gold@base"])
        .ok();
    let vm1 = c.wait_volume(0, "vm1", "placed and in sync", healthy);
    write_pattern(None, &c.nodes[0].uri("vm1"), seed, 2, 8 * MIB, 2 * MIB);
    // The source gets a replica on the third node too (its snapshot is
    // rebuilt there); the clone keeps two.
    c.nodes[0]
        .cli(&["type", "create", "triple", "--replicas", "3"])
        .ok();
    c.nodes[0].cli(&["volume", "retype", "gold", "triple"]).ok();
    c.wait_volume(0, "gold", "three replicas in sync", |v| all_in_sync(v, 3));
    let holders = replica_nodes(&vm1);
    let p = node_index(&primary(&vm1).expect("a primary"));
    let lost = *holders.iter().find(|h| **h != p).expect("a second holder");
    let spare = (0..3).find(|i| !holders.contains(i)).expect("a spare node");
    let allocated = |c: &Cluster, i: usize| {
        c.nodes[i].cli_json(&["status"])["allocated_bytes"]
            .as_u64()
            .expect("allocated_bytes")
    };
    let before = allocated(&c, spare);
    c.nodes[lost].kill9();
    c.wait_volume(p, "vm1", "rebuilt on the spare node", |v| {
        healthy(v) && replica_nodes(v).contains(&spare)
    });
    let log = c.nodes[spare].log();
    assert!(
        log.contains("created the local replica from its source snapshot held here"),
        "node{spare} did not make vm1's replica from gold@base:\n{log}"
    );
    let added = allocated(&c, spare) - before;
    eprintln!("the clone's rebuilt replica allocated {added} bytes on node{spare}");
    assert!(
        added <= 4 * MIB,
        "the rebuilt clone replica allocated {added} bytes for the clone's 2 MiB (its source reads 24 MiB)"
    );
    c.assert_replicas_equal(&[p, spare], "vm1");
    verify_pattern(None, &c.nodes[spare].uri("vm1"), seed, 1, 0, 8 * MIB);
    verify_pattern(None, &c.nodes[spare].uri("vm1"), seed, 2, 8 * MIB, 2 * MIB);
    verify_pattern(
        None,
        &c.nodes[spare].uri("vm1"),
        seed,
        1,
        10 * MIB,
        14 * MIB,
    );
}

/// A client connected through one node is listed by `volume show` on
/// another and holds off a delete and a rollback asked of it (the error
/// names the node it is connected through); `rollback --force` and
/// `volume disconnect` through that other node drop it.
#[test]
fn clients_through_other_nodes_hold_off_delete_and_rollback() {
    let c = Cluster::start(3, &[]);
    c.create_rf3("held", "8M");
    let hold = |node: usize| {
        let mut cmd = python_cmd("nbdtool.py");
        cmd.args(["hold", &c.nodes[node].uri("held")]);
        let mut holder = Background::spawn(cmd);
        holder.wait_line("READY", Duration::from_secs(30));
        // `volume show` through node2 lists it once its node published it.
        let want = serde_json::json!([{"node": format!("node{node}"), "connections": 1}]);
        c.wait_volume(2, "held", "the client listed as elsewhere", |v| {
            v["connections_elsewhere"] == want
        });
        holder
    };
    let holder = hold(1);
    let err = c.nodes[2].cli(&["volume", "delete", "held"]).cli_error(1);
    assert!(
        err.contains("through other nodes") && err.contains("node1: 1"),
        "{err}"
    );
    c.nodes[0].cli(&["snapshot", "create", "held", "s1"]).ok();
    let err = c.nodes[2]
        .cli(&["volume", "rollback", "held", "--to", "s1"])
        .cli_error(1);
    assert!(err.contains("node1: 1"), "{err}");
    // --force drops the client on node1 first (the rollback fails if it
    // is still published there after 10 s).
    let out = c.nodes[2].cli(&["volume", "rollback", "held", "--to", "s1", "--force"]);
    assert!(
        out.code() == Some(0),
        "rollback --force: {}",
        out.describe()
    );
    let _ = holder.finish(Duration::from_secs(10));

    let holder = hold(0);
    let out = c.nodes[2].cli(&["volume", "disconnect", "held"]);
    assert!(out.code() == Some(0), "disconnect: {}", out.describe());
    let _ = holder.finish(Duration::from_secs(10));
    let shown = c.nodes[2].cli(&["volume", "show", "held"]);
    assert!(
        !shown.ok().contains("connections elsewhere"),
        "{}",
        shown.stdout
    );
    let out = c.nodes[1].cli(&["volume", "rollback", "held", "--to", "s1"]);
    assert!(
        out.code() == Some(0),
        "rollback with no client left anywhere: {}\n{}",
        out.describe(),
        c.logs()
    );
}
