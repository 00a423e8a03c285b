//! A cluster of `basalt server` processes with a real etcd: replicated
//! volumes, placement, I/O through any node, failover when nodes are killed
//! with SIGKILL, resync when they return, online grow while a replica is
//! down, and replicas identical afterwards.
//!
//! Durability is checked with tests/nbdsh/crash_writer.py: every write that
//! was acknowledged with FUA or before a completed FLUSH must read back,
//! through another node, after the node the writer used was killed.

mod common;

#[path = "../../frontend-nvme/tests/common/host.rs"]
mod host;

use common::cluster::*;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Runs crash_writer.py against `uri` for one round: verify everything
/// durable so far, write until the connection dies (the test kills the node
/// it is connected to after `run_ms`).
fn writer_round(
    c: &mut Cluster,
    via: usize,
    volume: &str,
    state: &std::path::Path,
    seed: u64,
    run_ms: u64,
    also_kill: Option<usize>,
) {
    let mut cmd = python_cmd("crash_writer.py");
    cmd.arg(c.nodes[via].uri(volume))
        .arg(state)
        .arg(seed.to_string())
        .args(["--max-seconds", "120", "--fua-rate", "0.2"]);
    let mut w = Background::spawn(cmd);
    w.wait_line("READY", Duration::from_secs(120));
    if let Some(other) = also_kill {
        std::thread::sleep(Duration::from_millis(run_ms / 2));
        eprintln!("killing node{other} while node{via} serves the writer");
        c.nodes[other].kill9();
    }
    std::thread::sleep(Duration::from_millis(run_ms));
    c.nodes[via].kill9();
    let (st, out, err) = w.finish(Duration::from_secs(120));
    for l in out.lines().filter(|l| l.trim() != "READY") {
        eprintln!("    writer: {l}");
    }
    assert!(
        st.success(),
        "crash writer failed via node{via}:\n{out}\n{err}\n{}",
        c.logs()
    );
}

#[test]
fn replicated_volume_survives_killed_nodes_and_resyncs() {
    let seed = test_seed("replicated_volume_survives_killed_nodes_and_resyncs");
    let mut rng = Rng(seed);
    let mut c = Cluster::start(3, &["a", "b", "c"]);
    c.nodes[0]
        .cli(&["volume", "create", "r3", "--size", "32M", "--replicas", "3"])
        .ok();
    let v = c.wait_volume(1, "r3", "placed and in sync", |v| all_in_sync(v, 3));
    let names: std::collections::BTreeSet<String> = replicas(&v)
        .iter()
        .filter_map(|r| r["node"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names.len(), 3, "replicas on distinct nodes: {v:#}");
    assert_eq!(epoch(&v), 1);

    let scratch = Scratch::new();
    let state = scratch.path("state.json");
    let py_seed = seed % 1_000_000;
    for round in 0..3u64 {
        let v = c.wait_volume(0, "r3", "in sync", |v| all_in_sync(v, 3));
        let p = node_index(&primary(&v).expect("a primary"));
        // Round 0: the writer's node is a secondary, and the primary dies
        // under it. Round 1: the writer's node is the primary. Round 2: a
        // secondary dies while the writer's node (the primary) serves.
        let (via, also) = match round {
            0 => ((p + 1) % 3, Some(p)),
            1 => (p, None),
            _ => (p, Some((p + 1) % 3)),
        };
        let run_ms = rng.range(1500, 3000);
        eprintln!("round {round}: primary node{p}, writer via node{via}, also killing {also:?}");
        writer_round(&mut c, via, "r3", &state, py_seed, run_ms, also);
        // Verify through a surviving node, then bring the dead back.
        let survivor = (0..3)
            .find(|i| *i != via && Some(*i) != also)
            .expect("a survivor");
        if also.is_some() {
            // One node of three left: writes wait for a second in-sync
            // replica; restart one before verifying.
            c.nodes[via].restart();
        }
        let mut verify = python_cmd("crash_writer.py");
        verify
            .arg(c.nodes[survivor].uri("r3"))
            .arg(&state)
            .arg(py_seed.to_string())
            .arg("--verify-only");
        let out = run_cmd(&mut verify, Duration::from_secs(180));
        assert!(
            out.code() == Some(0),
            "verification through node{survivor} failed after round {round}:\n{}\n{}",
            out.describe(),
            c.logs()
        );
        for i in 0..3 {
            if !c.nodes[i].is_running() {
                c.nodes[i].restart();
            }
        }
    }
    // Everyone back: replicas converge and hold identical data.
    let v = c.wait_volume(2, "r3", "in sync after the last restart", |v| {
        all_in_sync(v, 3)
    });
    assert!(
        epoch(&v) >= 4,
        "every round replaced the primary at least once: {v:#}"
    );
    c.assert_replicas_equal(&[0, 1, 2], "r3");
    drop(c.etcd);
}

/// A cluster with nothing to do costs etcd no writes: standbys do not
/// campaign while the coordinator role is held, and nodes republish their
/// capacity only when it changed. Every write is a raft proposal and an
/// fsync of etcd's WAL, so a per-node trickle adds up with the node count.
#[test]
fn quiet_cluster_writes_nothing_to_etcd() {
    let c = Cluster::start(3, &[]);
    let v = c.create_rf3("q", "16M");
    let p = node_index(&primary(&v).expect("a primary"));
    // Allocation changes every replica's free capacity: republished once.
    write_pattern(None, &c.nodes[p].uri("q"), 3, 1, 0, 4 << 20);
    // One window longer than the capacity republishing period (10 s)
    // without a single proposal, within a deadline that allows for the
    // writes that settle the volume and publish the new capacity.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = c.etcd.proposals_committed().expect("etcd metrics");
        std::thread::sleep(Duration::from_secs(12));
        let after = c.etcd.proposals_committed().expect("etcd metrics");
        if after == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd still committed {} proposals in 12 s of a quiet cluster",
            after - before
        );
    }
}

/// A rolling restart (each node in turn stopped with SIGTERM and started
/// again, the volumes' primaries failing over as their nodes stop) of a
/// volume that takes no writes meanwhile, and of one never written at all,
/// never copies a replica in full: every failover resync is narrowed, even
/// in epochs without a single write.
#[test]
fn rolling_restart_of_idle_volumes_copies_no_replica_in_full() {
    let mut c = Cluster::start(3, &[]);
    let vols = ["written", "empty"];
    for vol in vols {
        c.create_rf3(vol, "32M");
    }
    let v = c.show(0, "written");
    let p = node_index(&primary(&v).expect("a primary"));
    write_pattern(None, &c.nodes[p].uri("written"), 11, 1, 0, 16 << 20);
    let mut failovers = 0;
    for node in [0, 1, 2, 0, 1, 2] {
        let via = (node + 1) % 3;
        for vol in vols {
            c.wait_volume(via, vol, "in sync", healthy);
        }
        let primaries: Vec<usize> = vols
            .iter()
            .map(|v| node_index(&primary(&c.show(via, v)).expect("a primary")))
            .collect();
        failovers += primaries.iter().filter(|p| **p == node).count();
        eprintln!("stopping node{node} (primaries: {primaries:?})");
        let st = c.nodes[node].sigterm(Duration::from_secs(30));
        assert!(st.success(), "node{node} exited with {st:?}");
        for vol in vols {
            c.wait_volume(via, vol, "served by a live primary", |v| {
                primary(v).is_some_and(|n| node_index(&n) != node)
            });
        }
        c.nodes[node].restart();
        for vol in vols {
            c.wait_volume(via, vol, "every replica in sync again", healthy);
        }
    }
    let (narrowed, full) = c.failover_resyncs();
    assert!(
        failovers >= 2 && narrowed >= 2 * failovers && full == 0,
        "{failovers} failovers, failover resyncs: {narrowed} narrowed, {full} full\n{}",
        c.logs()
    );
    verify_pattern(None, &c.nodes[0].uri("written"), 11, 1, 0, 16 << 20);
    for vol in vols {
        c.assert_replicas_equal(&[0, 1, 2], vol);
    }
}

/// A volume created while a node is down is placed degraded and completed
/// when the node returns; a removed node's replica is rebuilt on a new node.
/// The value of the first `/metrics` sample of node `s` whose line starts
/// with `prefix` (metric name and the start of its labels).
fn metric(s: &Server, prefix: &str) -> Option<f64> {
    let m = http(s.api_url(), "GET", "/metrics", Some(&s.token()), None);
    m.body
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn degraded_creation_completes_and_removed_replica_is_rebuilt() {
    let mut c = Cluster::start(3, &[]);
    c.nodes[2].kill9();
    // Wait until the coordinator sees node2 gone (its etcd lease lapses).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = c.nodes[0].cli_json(&["node", "list"]);
        let down = nodes["nodes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n["name"] == "node2" && n["alive"] == false)
        });
        if down {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node2 never reported down: {nodes:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "deg",
            "--size",
            "16M",
            "--replicas",
            "3",
        ])
        .ok();
    let v = c.wait_volume(1, "deg", "placed on the two live nodes", |v| {
        all_in_sync(v, 2)
    });
    // More replicas than the cluster has nodes (a node that is down still
    // counts): refused with the cost stated, unless accepted explicitly.
    let four = [
        "volume",
        "create",
        "four",
        "--size",
        "16M",
        "--replicas",
        "4",
    ];
    let refused = c.nodes[0].cli(&four).cli_error(1);
    assert!(
        refused.contains("3 active node(s)")
            && refused.contains("write quorum is 3")
            && refused.contains("writes stop whenever 1 node(s) are down")
            && refused.contains("--allow-degraded"),
        "{refused}"
    );
    let mut accepted = four.to_vec();
    accepted.push("--allow-degraded");
    c.nodes[0].cli(&accepted).ok();
    c.wait_volume(0, "four", "placed degraded on the two live nodes", |v| {
        all_in_sync(v, 2)
    });
    c.nodes[0].cli(&["volume", "delete", "four"]).ok();
    assert_eq!(node_names(&v), ["node0", "node1"], "{v:#}");
    // Node0 learns the placement through its own watch, maybe later.
    c.wait_volume(0, "deg", "placed, as node0 knows it", |v| all_in_sync(v, 2));
    let human = c.nodes[0].cli(&["volume", "show", "deg"]);
    assert!(human.ok().contains("degraded"), "{}", human.describe());
    // Metrics and status say so on any node.
    let m = |prefix: &str| metric(&c.nodes[0], prefix);
    assert_eq!(m("basalt_volume_replicas_wanted{volume=\"deg\""), Some(3.0));
    assert_eq!(
        m("basalt_volume_replicas_in_sync{volume=\"deg\""),
        Some(2.0)
    );
    assert_eq!(m("basalt_volumes_degraded "), Some(1.0));
    let status = c.nodes[0].cli_json(&["status"]);
    assert_eq!(status["volumes_degraded"], 1, "{status:#}");
    write_pattern(None, &c.nodes[1].uri("deg"), 7, 1, 0, 8 << 20);

    c.nodes[2].restart();
    let v = c.wait_volume(0, "deg", "completed on node2", |v| all_in_sync(v, 3));
    assert_eq!(node_names(&v), ["node0", "node1", "node2"]);
    let m = |prefix: &str| metric(&c.nodes[0], prefix);
    assert_eq!(
        m("basalt_volume_replicas_in_sync{volume=\"deg\""),
        Some(3.0)
    );
    assert_eq!(m("basalt_volumes_degraded "), Some(0.0));
    assert_eq!(m("basalt_volumes_resyncing "), Some(0.0));
    assert_eq!(
        m("basalt_volume_resync_remaining_bytes{volume=\"deg\""),
        None
    );
    let status = c.nodes[0].cli_json(&["status"]);
    assert_eq!(
        (&status["volumes_degraded"], &status["volumes_resyncing"]),
        (&Value::from(0), &Value::from(0)),
        "{status:#}"
    );
    verify_pattern(None, &c.nodes[2].uri("deg"), 7, 1, 0, 8 << 20);

    // Remove a secondary's node for good; a fourth node takes its replica.
    let p = primary(&v).expect("primary");
    let gone = ["node0", "node1", "node2"]
        .into_iter()
        .find(|n| *n != p)
        .expect("a secondary");
    let gi = node_index(gone);
    c.nodes[gi].kill9();
    let pi = node_index(&p);
    c.nodes[pi].cli(&["node", "remove", gone]).ok();
    let endpoint = c.etcd.endpoint();
    let secret = c.secrets.path("cluster-secret").display().to_string();
    let peer = format!("127.0.0.1:{}", free_port());
    c.nodes.push(Server::start_with(
        "512M",
        &[
            "--etcd",
            &endpoint,
            "--node-name",
            "node3",
            "--peer-listen",
            &peer,
            "--cluster-secret-file",
            &secret,
            "--lease-ms",
            "1000",
            "--resync-rate",
            "32",
        ],
    ));
    let v = c.wait_volume(3, "deg", "rebuilt on node3", |v| {
        all_in_sync(v, 3) && node_names(v).contains(&"node3".to_string())
    });
    assert!(!node_names(&v).contains(&gone.to_string()), "{v:#}");
    verify_pattern(None, &c.nodes[3].uri("deg"), 7, 1, 0, 8 << 20);
    // The rebuilt replica stays thin: only the 8 MiB written are allocated
    // (the never-written half of the volume is copied as zeros, which the
    // replica does not allocate).
    let allocated = c.nodes[3].cli_json(&["status"])["allocated_bytes"]
        .as_u64()
        .expect("allocated_bytes");
    assert!(
        allocated <= 8 << 20,
        "rebuilt replica allocated {allocated} bytes for 8 MiB of data"
    );
    let live: Vec<usize> = (0..4).filter(|i| *i != gi).collect();
    c.assert_replicas_equal(&live, "deg");

    // Drain: a fifth node joins and node3 is drained; its replica moves
    // there online, and the data follows.
    let peer = format!("127.0.0.1:{}", free_port());
    c.nodes.push(Server::start_with(
        "512M",
        &[
            "--etcd",
            &endpoint,
            "--node-name",
            "node4",
            "--peer-listen",
            &peer,
            "--cluster-secret-file",
            &secret,
            "--lease-ms",
            "1000",
        ],
    ));
    c.nodes[pi].cli(&["node", "drain", "node3"]).ok();
    let v = c.wait_volume(4, "deg", "moved off the drained node3", |v| {
        let n = node_names(v);
        all_in_sync(v, 3) && n.contains(&"node4".to_string()) && !n.contains(&"node3".to_string())
    });
    assert_ne!(primary(&v).as_deref(), Some("node3"));
    verify_pattern(None, &c.nodes[4].uri("deg"), 7, 1, 0, 8 << 20);
    let nodes = c.nodes[4].cli_json(&["node", "list"]);
    let node3 = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == "node3").cloned())
        .expect("node3 listed");
    assert_eq!(node3["state"], "draining", "{nodes:#}");
    assert_eq!(node3["replicas"], 0, "{nodes:#}");
}

/// A primary that is frozen (SIGSTOP: it can neither send nor renew its
/// lease, like a partitioned node) is replaced; when it wakes up it is
/// fenced: it steps down, and the data written through the new primary
/// meanwhile is what every node returns.
#[test]
fn frozen_primary_is_replaced_and_fenced() {
    let mut c = Cluster::start(3, &[]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "fence",
            "--size",
            "16M",
            "--replicas",
            "3",
        ])
        .ok();
    let v = c.wait_volume(0, "fence", "in sync", |v| all_in_sync(v, 3));
    let old = node_index(&primary(&v).expect("primary"));
    let other = (old + 1) % 3;
    write_pattern(None, &c.nodes[other].uri("fence"), 11, 1, 0, 4 << 20);

    c.nodes[old].signal(libc::SIGSTOP);
    c.wait_volume(other, "fence", "failed over", |v| {
        epoch(v) >= 2 && primary(v).is_some_and(|p| node_index(&p) != old)
    });
    // Generation 2 written through the new primary while the old one sleeps.
    write_pattern(None, &c.nodes[other].uri("fence"), 11, 2, 0, 4 << 20);
    // A reader of the frozen node, queued before it wakes: its first reads
    // reach the node the moment it runs again, with its stale view (its old
    // epoch, a lease that ran out meanwhile). It must never be served the
    // data of generation 1.
    let mut reader = python_cmd("nbdtool.py");
    reader.args([
        "verify",
        &c.nodes[old].uri("fence"),
        "--seed",
        "11",
        "--gen",
        "2",
        "--offset",
        "0",
        "--length",
        &(4u64 << 20).to_string(),
    ]);
    let reader = Background::spawn(reader);
    std::thread::sleep(Duration::from_millis(300));
    c.nodes[old].signal(libc::SIGCONT);
    let (st, out, err) = reader.finish(Duration::from_secs(120));
    assert!(
        st.success(),
        "a reader of the woken node read stale data:\n{out}\n{err}\n{}",
        c.logs()
    );
    // Later readers too: the woken node serves (forwards) correctly and
    // never overwrites the newer data with its stale view.
    verify_pattern(None, &c.nodes[old].uri("fence"), 11, 2, 0, 4 << 20);
    let v = c.wait_volume(old, "fence", "in sync again", |v| all_in_sync(v, 3));
    assert_ne!(primary(&v).map(|p| node_index(&p)), Some(old), "{v:#}");
    assert!(epoch(&v) >= 2);
    c.assert_replicas_equal(&[0, 1, 2], "fence");

    // Deleting the volume frees its replica on every node.
    c.nodes[other].cli(&["volume", "delete", "fence"]).ok();
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..3 {
        loop {
            let st = c.nodes[i].cli_json(&["status"]);
            if st["allocated_bytes"] == 0 && st["volume_count"] == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node{i} still holds the deleted volume: {st:#}\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// fio with `verify=crc32c` through a secondary's node while etcd restarts
/// (idle, then under I/O) and the third node is killed and restarted: no
/// I/O error, no verify error, replicas identical afterwards.
#[test]
fn fio_verify_survives_etcd_restart_and_node_kill() {
    require_tool("fio");
    let mut c = Cluster::start(3, &[]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "fiov",
            "--size",
            "32M",
            "--replicas",
            "3",
        ])
        .ok();
    let v = c.wait_volume(0, "fiov", "in sync", |v| all_in_sync(v, 3));
    let p = node_index(&primary(&v).expect("primary"));
    let via = (p + 1) % 3;
    let other = (p + 2) % 3;

    // etcd restart while idle: the cluster carries on.
    c.etcd.restart().expect("restart etcd");
    c.wait_volume(via, "fiov", "in sync after an idle etcd restart", |v| {
        all_in_sync(v, 3)
    });

    let scratch = Scratch::new();
    let cmd = fio_verify(
        None,
        &scratch.0,
        "clusterverify",
        &c.nodes[via].uri("fiov"),
        8,
        14,
    );
    let fio = Background::spawn(cmd);
    std::thread::sleep(Duration::from_secs(3));
    eprintln!("restarting etcd under I/O");
    c.etcd.restart().expect("restart etcd");
    std::thread::sleep(Duration::from_secs(3));
    eprintln!("killing node{other}");
    c.nodes[other].kill9();
    std::thread::sleep(Duration::from_secs(3));
    c.nodes[other].restart();
    let (st, out, err) = fio.finish(Duration::from_secs(120));
    assert!(
        st.success(),
        "fio failed ({st:?}):\n{err}\n{out}\n{}",
        c.logs()
    );
    // fio's nbd engine prints a line of its own before the JSON.
    let start = out.find('{').unwrap_or(0);
    let json: Value = serde_json::from_str(&out[start..])
        .unwrap_or_else(|e| panic!("fio output is not JSON ({e}):\n{out}\n{err}"));
    let job = &json["jobs"][0];
    assert_eq!(job["error"].as_u64(), Some(0), "fio job error: {job}");
    assert!(
        job["write"]["total_ios"].as_u64().unwrap_or(0) > 1000,
        "fio wrote almost nothing: {job}"
    );
    c.wait_volume(via, "fiov", "in sync after the node returned", |v| {
        all_in_sync(v, 3)
    });
    c.assert_replicas_equal(&[0, 1, 2], "fiov");
}

/// A node stopped with SIGTERM saves its replicas' logs and restores them
/// when it starts again: after a failover it is resynced in the regions
/// that may differ, not copied in full, whether it was a secondary or the
/// primary. A primary killed with SIGKILL comes back with its crash-safe
/// copy of the logs and is not copied in full either.
#[test]
fn cleanly_restarted_nodes_keep_their_logs_and_are_not_copied_in_full() {
    const MIB: u64 = 1 << 20;
    let seed = test_seed("cleanly_restarted_nodes_keep_their_logs") % 1_000_000;
    let mut c = Cluster::start(3, &[]);
    let vol = "cr";
    let v = c.create_rf3(vol, "64M");
    let p = node_index(&primary(&v).expect("a primary"));
    let secondaries: Vec<usize> = (0..3).filter(|i| *i != p).collect();
    let (s1, s2) = (secondaries[0], secondaries[1]);
    let uri = |c: &Cluster, i: usize| c.nodes[i].uri(vol);
    write_pattern(None, &uri(&c, s2), seed, 1, 0, 32 * MIB);

    // A secondary stops cleanly, writes go on without it, then the primary
    // is lost: the remaining secondary takes over.
    let st = c.nodes[s1].sigterm(Duration::from_secs(30));
    assert!(st.success(), "node{s1} exited with {st:?}");
    assert!(
        c.nodes[s1].log().contains("saved the replication logs"),
        "{}",
        c.logs()
    );
    write_pattern(None, &uri(&c, s2), seed, 2, 0, 4 * MIB);
    c.nodes[p].kill9();
    c.wait_volume(s2, vol, "failed over to the remaining secondary", |v| {
        primary(v).is_some_and(|n| node_index(&n) == s2)
    });
    // Alone, the new primary is below min_in_sync (2): writes wait for the
    // returning node's resync.
    let before = c.failover_resyncs();
    c.nodes[s1].restart();
    write_pattern(None, &uri(&c, s2), seed, 3, 4 * MIB, 2 * MIB);
    c.wait_volume(s2, vol, "the cleanly stopped node in sync again", |v| {
        replica_state(v, s1).as_deref() == Some("in-sync")
    });
    let after = c.failover_resyncs();
    assert!(
        after.0 > before.0 && after.1 == before.1,
        "the cleanly stopped secondary's resync: (narrowed, full) went from {before:?} to {after:?}\n{}",
        c.logs()
    );
    c.assert_replicas_equal(&[s1, s2], vol);

    // The killed primary restores its crash-safe copy: resynced in the
    // regions it names (those it wrote) and the new primary's, not in full.
    c.nodes[p].restart();
    c.wait_volume(s2, vol, "the killed primary back in sync", healthy);
    let before = c.failover_resyncs();
    assert!(
        before.0 > after.0 && before.1 == after.1,
        "the killed primary's resync: (narrowed, full) went from {after:?} to {before:?}\n{}",
        c.logs()
    );
    assert!(
        c.nodes[p]
            .log()
            .contains("restored the replica's crash-safe log copy"),
        "{}",
        c.logs()
    );
    c.assert_replicas_equal(&[p, s1, s2], vol);

    // Now the primary itself stops cleanly: it saves its own writes' log,
    // and is resynced in those regions (and the new ones) only.
    let st = c.nodes[s2].sigterm(Duration::from_secs(30));
    assert!(st.success(), "node{s2} exited with {st:?}");
    let v = c.wait_volume(s1, vol, "failed over from the stopped primary", |v| {
        primary(v).is_some_and(|n| node_index(&n) != s2)
    });
    let now_primary = node_index(&primary(&v).expect("a primary"));
    write_pattern(None, &uri(&c, now_primary), seed, 4, 8 * MIB, 2 * MIB);
    c.nodes[s2].restart();
    c.wait_volume(now_primary, vol, "every replica in sync", healthy);
    let after = c.failover_resyncs();
    assert!(
        after.0 >= before.0 + 2 && after.1 == before.1,
        "after the primary's clean stop: (narrowed, full) went from {before:?} to {after:?}\n{}",
        c.logs()
    );

    for i in 0..3 {
        let u = uri(&c, i);
        verify_pattern(None, &u, seed, 2, 0, 4 * MIB);
        verify_pattern(None, &u, seed, 3, 4 * MIB, 2 * MIB);
        verify_pattern(None, &u, seed, 1, 6 * MIB, 2 * MIB);
        verify_pattern(None, &u, seed, 4, 8 * MIB, 2 * MIB);
        verify_pattern(None, &u, seed, 1, 10 * MIB, 22 * MIB);
    }
    c.assert_replicas_equal(&[0, 1, 2], vol);
}

/// Online grow of an RF3 volume while one secondary's node is down: a
/// client connected before keeps working at its old size, a new connection
/// sees the new size and writes (and flushes) beyond the old end; the
/// killed node returns, grows its replica and is resynced; everything
/// flushed reads back through it, and all replicas are identical, at the
/// new size. Shrinking a replicated volume is refused.
#[test]
fn replicated_volume_grows_online_while_a_replica_is_down() {
    const MIB: u64 = 1 << 20;
    let mut c = Cluster::start(3, &[]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "grow",
            "--size",
            "8M",
            "--replicas",
            "3",
        ])
        .ok();
    let v = c.wait_volume(0, "grow", "in sync", |v| all_in_sync(v, 3));
    let p = node_index(&primary(&v).expect("primary"));
    let (down, via) = ((p + 1) % 3, (p + 2) % 3);
    write_pattern(None, &c.nodes[via].uri("grow"), 21, 1, 0, 8 * MIB);

    // A client connected before the grow (through the other secondary).
    let mut cmd = python_cmd("nbdtool.py");
    let mib = MIB.to_string();
    cmd.args([
        "hold",
        &c.nodes[via].uri("grow"),
        "--seed",
        "21",
        "--gen",
        "2",
        "--offset",
        "0",
        "--length",
        &mib,
    ]);
    let mut holder = Background::spawn(cmd);
    holder.wait_line("READY", Duration::from_secs(30));

    eprintln!("killing node{down} (a secondary; node{p} is the primary)");
    c.nodes[down].kill9();
    c.nodes[via]
        .cli(&["volume", "resize", "grow", "--size", "24M"])
        .ok();
    for i in [p, via] {
        assert_eq!(
            c.show(i, "grow")["size_bytes"].as_u64(),
            Some(24 * MIB),
            "volume show through node{i}"
        );
    }
    // Shrinking a replicated volume is refused, with or without
    // --allow-shrink, and leaves the size alone.
    for extra in [&[][..], &["--allow-shrink"][..]] {
        let mut args = vec!["volume", "resize", "grow", "--size", "8M"];
        args.extend_from_slice(extra);
        let e = c.nodes[p].cli(&args).cli_error(1);
        assert!(e.contains("can only grow"), "{e}");
    }
    assert_eq!(c.show(p, "grow")["size_bytes"].as_u64(), Some(24 * MIB));

    // A new connection sees the new size and writes beyond the old end.
    let uri = c.nodes[via].uri("grow");
    let size = tool("nbdinfo", ["--size", &uri]);
    assert_eq!(size.ok().trim(), (24 * MIB).to_string());
    write_pattern(None, &uri, 21, 3, 8 * MIB, 16 * MIB);
    // The connection from before the grow still works, at its old size.
    let (st, out, err) = holder.finish(Duration::from_secs(60));
    assert!(st.success(), "held connection: {out}\n{err}\n{}", c.logs());
    assert!(
        out.contains(&format!("SIZE {}", 8 * MIB)),
        "held connection: {out}"
    );

    // The killed node returns, grows its replica and catches up.
    c.nodes[down].restart();
    c.wait_volume(down, "grow", "in sync after node returned", |v| {
        all_in_sync(v, 3)
    });
    for i in [down, p] {
        let u = c.nodes[i].uri("grow");
        verify_pattern(None, &u, 21, 2, 0, MIB);
        verify_pattern(None, &u, 21, 1, MIB, 7 * MIB);
        verify_pattern(None, &u, 21, 3, 8 * MIB, 16 * MIB);
    }
    for i in 0..3 {
        let d = c.nodes[i].cli_json(&["volume", "local-digest", "grow"]);
        assert_eq!(
            d["size_bytes"].as_u64(),
            Some(24 * MIB),
            "node{i}'s replica: {d}"
        );
    }
    c.assert_replicas_equal(&[0, 1, 2], "grow");

    // Creation checks the nodes' provisioning limits as grow does: each
    // node (512 MiB, overcommit 2) may hold about 1 GiB of volume sizes
    // (its store's capacity, a little less than 512 MiB, times 2), and
    // holds 24 MiB now.
    let e = c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "toobig",
            "--size",
            "1001M",
            "--replicas",
            "3",
        ])
        .cli_error(1);
    assert!(
        e.contains("only 0 of the cluster's 3 active node(s) can provision it"),
        "{e}"
    );
    c.nodes[1]
        .cli(&[
            "volume",
            "create",
            "fits",
            "--size",
            "900M",
            "--replicas",
            "3",
        ])
        .ok();
    c.wait_volume(0, "fits", "placed", |v| all_in_sync(v, 3));
    let e = c.nodes[2]
        .cli(&[
            "volume",
            "create",
            "over",
            "--size",
            "200M",
            "--replicas",
            "1",
        ])
        .cli_error(1);
    assert!(e.contains("cannot place 1 replica(s)"), "{e}");
    c.nodes[2]
        .cli(&[
            "volume",
            "create",
            "last",
            "--size",
            "50M",
            "--replicas",
            "1",
        ])
        .ok();
    c.wait_volume(0, "last", "placed", |v| all_in_sync(v, 1));
}

/// Runs `args` through node `a` and `b` at the same moment (both CLI
/// processes start once both threads are ready); returns both outcomes.
fn cli_at_once(c: &Cluster, a: (usize, &[&str]), b: (usize, &[&str])) -> [CmdOutput; 2] {
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let handles = [a, b].map(|(i, args)| {
            let (barrier, node) = (&barrier, &c.nodes[i]);
            s.spawn(move || {
                barrier.wait();
                node.cli(args)
            })
        });
        handles.map(|h| h.join().expect("CLI thread"))
    })
}

/// Of two outcomes, exactly one succeeded and the other was refused with
/// `refusal` in its message; returns the index of the one that succeeded.
#[track_caller]
fn exactly_one_accepted(outs: &[CmdOutput; 2], refusal: &str, what: &str) -> usize {
    let ok: Vec<usize> = (0..2).filter(|i| outs[*i].code() == Some(0)).collect();
    assert_eq!(
        ok.len(),
        1,
        "{what}: {}\n{}",
        outs[0].describe(),
        outs[1].describe()
    );
    let refused = &outs[1 - ok[0]];
    assert!(refused.stderr.contains(refusal), "{}", refused.describe());
    ok[0]
}

/// Creates and grows through different nodes at the same moment are
/// checked one after the other (the cluster's provisioning lock in etcd),
/// and a create counts the volumes created just before it that are not
/// placed yet: of two that fit only one at a time, exactly one succeeds,
/// and every volume that was accepted gets placed in full.
#[test]
fn concurrent_creates_and_grows_through_different_nodes_fit_the_nodes() {
    const MIB: u64 = 1 << 20;
    let c = Cluster::start(3, &[]);
    // Every RF3 volume has a replica on each of the 3 nodes, so each node
    // has the same room left: the smallest limit (capacity × the default
    // overcommit ratio, 2), less what it holds.
    let nodes = c.nodes[0].cli_json(&["node", "list"]);
    let limit = nodes["nodes"]
        .as_array()
        .expect("node list")
        .iter()
        .map(|n| n["capacity_bytes"].as_u64().expect("capacity") * 2)
        .min()
        .expect("nodes");
    let mut room = limit / MIB;
    let mut accepted = Vec::new();
    for round in 0..2 {
        // Each fits alone; both together do not.
        let size = format!("{}M", room * 6 / 10);
        let (x, y) = (format!("c{round}x"), format!("c{round}y"));
        let outs = cli_at_once(
            &c,
            (
                1,
                &["volume", "create", &x, "--size", &size, "--replicas", "3"],
            ),
            (
                2,
                &["volume", "create", &y, "--size", &size, "--replicas", "3"],
            ),
        );
        let what = format!("create round {round} ({size} twice, {room} MiB of room)");
        let won = exactly_one_accepted(&outs, "can provision it", &what);
        accepted.push(if won == 0 { x } else { y });
        room -= room * 6 / 10;
    }
    // Two small volumes, then both grown at once by more than half the room.
    for name in ["g0", "g1"] {
        c.nodes[0]
            .cli(&["volume", "create", name, "--size", "4M", "--replicas", "3"])
            .ok();
        accepted.push(name.to_string());
        room -= 4;
    }
    for name in &accepted {
        c.wait_volume(0, name, "placed in full", |v| all_in_sync(v, 3));
    }
    let size = format!("{}M", 4 + room * 6 / 10);
    let outs = cli_at_once(
        &c,
        (1, &["volume", "resize", "g0", "--size", &size]),
        (2, &["volume", "resize", "g1", "--size", &size]),
    );
    let what = format!("grows to {size} ({room} MiB of room)");
    exactly_one_accepted(&outs, "exceeds its limit", &what);
    // Nothing was accepted beyond any node's limit.
    let mut total = 0;
    for name in &accepted {
        total += c.show(0, name)["size_bytes"].as_u64().expect("size");
    }
    assert!(
        total <= limit,
        "{total} bytes accepted on nodes that may hold {limit}"
    );
}

/// An NVMe/TCP host connected to a replicated volume sees it grow: the
/// namespace reports the new size while connected, and blocks beyond the
/// old end are written and read back over the same queue.
#[test]
fn nvme_host_sees_a_replicated_volume_grow_while_connected() {
    use basalt_nvme_wire::command::cns;
    use basalt_nvme_wire::Digests;
    const MIB: u64 = 1 << 20;
    let c = Cluster::start_with(3, &[], |_| {
        vec!["--nvme-allow-host".into(), host::HOST_NQN.into()]
    });
    c.create_rf3("nv", "16M");
    let addr = c.nodes[1].nvme_addr();
    let mut admin = host::Host::admin(addr, Digests::NONE, "nv", 10_000);
    let nsze = |admin: &mut host::Host| {
        let d = admin.identify(cns::NAMESPACE, 1).ok().data.clone();
        u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"))
    };
    assert_eq!(nsze(&mut admin), 16 * MIB / 4096);
    let mut q = host::Host::io_queue(addr, Digests::NONE, &admin, "nv", 1);
    let old = host::pattern(4096, 5);
    q.write(100, &old, false).ok();
    // Beyond the end: refused before the resize.
    let beyond = 6000;
    assert!(q.read(beyond, 1).status().sc != 0, "read beyond the end");

    c.nodes[0]
        .cli(&["volume", "resize", "nv", "--size", "32M"])
        .ok();
    let deadline = Instant::now() + Duration::from_secs(20);
    while nsze(&mut admin) != 32 * MIB / 4096 {
        assert!(
            Instant::now() < deadline,
            "the namespace never grew\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let new = host::pattern(4096, 9);
    q.write(beyond, &new, false).ok();
    q.flush().ok();
    assert_eq!(q.read(beyond, 1).ok().data, new);
    assert_eq!(q.read(100, 1).ok().data, old);
    drop((q, admin));
    c.wait_volume(0, "nv", "in sync", healthy);
    c.assert_replicas_equal(&[0, 1, 2], "nv");
}

/// With etcd down, every command that needs it fails with one line naming
/// the metadata store (the API answers 503), never the gRPC client's debug
/// text; once etcd is back, the same commands work again.
/// etcd down for 10 s under light I/O (fio, crc32c-verified, 100 writes
/// a second through a node that is not the primary): no I/O error; I/O
/// goes on until the coordinator can no longer be sure of its role plus a
/// lease, then pauses, and resumes within about a second of etcd's return
/// (the coordinator's role, still its own in etcd, resumes at its next
/// keep-alive; no new election); meanwhile the CLI prints one line.
#[test]
fn an_etcd_outage_pauses_io_no_longer_than_the_leases_require() {
    require_tool("fio");
    let mut c = Cluster::start(3, &[]);
    let v = c.create_rf3("eo", "16M");
    let p = node_index(&primary(&v).expect("primary"));
    let via = (p + 1) % 3;
    let scratch = Scratch::new();
    let mut cmd = fio_verify(None, &scratch.0, "eo", &c.nodes[via].uri("eo"), 1, 24);
    cmd.args(["--rate_iops=100", "--write_lat_log=eo", "--log_avg_msec=0"]);
    let started = monotonic_secs();
    let fio = Background::spawn(cmd);
    std::thread::sleep(Duration::from_secs(5));
    let killed = monotonic_secs() - started;
    c.etcd.kill().expect("kill etcd");
    std::thread::sleep(Duration::from_secs(2));
    let line = c.nodes[via].cli(&["volume", "list"]).cli_error(1);
    assert!(line.contains("metadata store unreachable"), "{line}");
    std::thread::sleep(Duration::from_secs(8));
    c.etcd.restart().expect("restart etcd");
    let back = monotonic_secs() - started;
    let (st, out, err) = fio.finish(Duration::from_secs(120));
    assert!(
        st.success(),
        "fio failed ({st:?}):\n{err}\n{out}\n{}",
        c.logs()
    );
    // Completion times (ms since fio's start, a little after `started`).
    let log = std::fs::read_to_string(scratch.path("eo_clat.1.log")).expect("fio latency log");
    let mut done: Vec<f64> = log
        .lines()
        .filter_map(|l| l.split(',').next()?.trim().parse::<f64>().ok())
        .map(|ms| ms / 1000.0)
        .collect();
    done.sort_by(f64::total_cmp);
    let (gap_start, gap_end) = done
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
        .expect("fio completed writes");
    let pause = gap_end - gap_start;
    eprintln!(
        "etcd down from {killed:.2} s to {back:.2} s ({:.2} s); I/O paused from {gap_start:.2} s to \
         {gap_end:.2} s ({pause:.2} s), resumed {:.2} s after etcd was back",
        back - killed,
        gap_end - back
    );
    // I/O goes on for at least a lease after the kill, and resumes within
    // a second and a half of etcd's return.
    assert!(
        gap_start >= killed + 0.5,
        "I/O paused {:.2} s after etcd died: sooner than a lease",
        gap_start - killed
    );
    assert!(
        gap_end <= back + 1.5,
        "I/O resumed {:.2} s after etcd was back",
        gap_end - back
    );
    assert!(pause <= back - killed + 0.5, "I/O paused {pause:.2} s");
}

#[test]
fn an_unreachable_etcd_gets_one_clear_line() {
    let mut c = Cluster::start(1, &[]);
    c.nodes[0]
        .cli(&["volume", "create", "v", "--size", "16M"])
        .ok();
    c.etcd.kill().expect("kill etcd");
    let commands: [&[&str]; 5] = [
        &["volume", "list"],
        &["node", "list"],
        &["status"],
        &["volume", "show", "v"],
        &["volume", "create", "w", "--size", "16M"],
    ];
    for args in commands {
        let line = c.nodes[0].cli(args).cli_error(1);
        assert!(
            line.contains("metadata store unreachable: etcd at"),
            "{args:?}: {line}"
        );
        for raw in ["grpc", "tonic", "Status {", "MetadataMap", "source:"] {
            assert!(
                !line.contains(raw),
                "{args:?} prints raw client text: {line}"
            );
        }
    }
    c.etcd.restart().expect("restart etcd");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = c.nodes[0].cli(&["volume", "list"]);
        if out.code() == Some(0) {
            assert!(out.ok().contains('v'));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd is back but: {}",
            out.describe()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A bit flipped in the primary's copy of a replicated volume (as a disk
/// rots it) is never returned: the read is served from an in-sync replica,
/// the primary's copy is rewritten with it, and the replicas are identical
/// again without a resync.
#[test]
fn a_rotten_block_on_the_primary_is_read_from_a_replica_and_rewritten() {
    let c = Cluster::start(3, &[]);
    c.create_rf3("db", "32M");
    let v = c.wait_volume(0, "db", "in sync", healthy);
    let p = node_index(&primary(&v).expect("a primary"));
    let uri = c.nodes[p].uri("db");
    let qemu_io = |cmd: &str| tool("qemu-io", ["-f", "raw", &uri, "-c", cmd]);
    qemu_io("write -P 0x5c 5M 4k").ok();
    qemu_io("flush").ok();
    c.wait_volume(0, "db", "in sync", healthy);

    // The block in the primary's data file (the only 4 KiB of 0x5c there).
    let data = c.nodes[p].data_dir().join("basalt.data");
    let at = rot_block(&data, 0x5c);

    let out = qemu_io("read -P 0x5c 5M 4k");
    out.ok();
    assert!(
        !out.stdout.contains("mismatch") && !out.stderr.contains("mismatch"),
        "the rotten block must read back good:\n{}",
        out.describe()
    );
    let log = c.nodes[p].log();
    assert!(
        log.contains("local copy fails its checksum; reading it from another replica"),
        "{log}"
    );
    // Rewritten in place: the primary's file holds the good block again.
    wait_rewritten(&data, at, 0x5c, Duration::from_secs(10), || {
        "the primary's copy was not rewritten".into()
    });
    let scrub = c.nodes[p].cli(&["volume", "scrub", "db", "--output", "json"]);
    let report: Value = serde_json::from_str(scrub.ok()).unwrap();
    assert_eq!(report["bad_blocks"], serde_json::json!([]), "{report}");
    c.assert_replicas_equal(&[0, 1, 2], "db");
    let v = c.show(0, "db");
    assert!(healthy(&v), "no replica was failed over the rot: {v}");
    let metrics = ureq::get(&format!("{}/metrics", c.nodes[p].api_url()))
        .set("Authorization", &format!("Bearer {}", c.nodes[p].token()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("basalt_read_repairs_total 1"),
        "one read repaired, counted: {metrics}"
    );
}

/// Waits until the 4 KiB block at `at` of `data` (a node's store file) is
/// all `pattern` again; fails with `what()` after `patience`.
fn wait_rewritten(
    data: &std::path::Path,
    at: u64,
    pattern: u8,
    patience: Duration,
    what: impl Fn() -> String,
) {
    use std::os::unix::fs::FileExt;
    let deadline = Instant::now() + patience;
    loop {
        let mut b = vec![0u8; 4096];
        std::fs::File::open(data)
            .unwrap()
            .read_exact_at(&mut b, at)
            .unwrap();
        if b.iter().all(|&x| x == pattern) {
            return;
        }
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Flips a bit in the only 4 KiB block of `data` (a node's store file)
/// filled with `pattern`, as a disk rots it; returns its offset.
fn rot_block(data: &std::path::Path, pattern: u8) -> u64 {
    use std::os::unix::fs::FileExt;
    let bytes = std::fs::read(data).unwrap();
    let at = bytes
        .chunks(4096)
        .position(|b| b.iter().all(|&x| x == pattern))
        .expect("the block on the node's disk") as u64
        * 4096;
    drop(bytes);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at + 123).unwrap();
    b[0] ^= 0x08;
    f.write_all_at(&b, at + 123).unwrap();
    f.sync_all().unwrap();
    at
}

/// A bit flipped in a secondary's copy, which no client read ever reaches,
/// is found by `volume scrub` (run on that node: its local check reports
/// the block, the replica compare names the node as differing), and the
/// secondary's copy is rewritten from the primary's while every replica
/// stays in sync.
#[test]
fn scrub_compares_replicas_and_rewrites_a_rotten_secondary() {
    let c = Cluster::start(3, &[]);
    c.create_rf3("db", "32M");
    let v = c.wait_volume(0, "db", "in sync", healthy);
    let p = node_index(&primary(&v).expect("a primary"));
    let s = (p + 1) % 3;
    let uri = c.nodes[p].uri("db");
    let qemu_io = |cmd: &str| tool("qemu-io", ["-f", "raw", &uri, "-c", cmd]);
    qemu_io("write -P 0x3d 9M 4k").ok();
    qemu_io("flush").ok();
    c.wait_volume(0, "db", "in sync", healthy);
    let data = c.nodes[s].data_dir().join("basalt.data");
    let at = rot_block(&data, 0x3d);

    // Client reads never reach a secondary: the damage stays unseen.
    let out = qemu_io("read -P 0x3d 9M 4k");
    out.ok();
    assert!(!out.stdout.contains("mismatch"), "{}", out.describe());

    let scrub = c.nodes[s].cli(&["volume", "scrub", "db", "--output", "json"]);
    let report: Value = serde_json::from_str(scrub.ok()).unwrap();
    let block = 9u64 << 20;
    assert_eq!(report["bad_blocks"], serde_json::json!([block]), "{report}");
    assert_eq!(
        report["repaired_blocks"],
        serde_json::json!([block]),
        "{report}"
    );
    let differing = report["replicas"]["differing"]
        .as_array()
        .expect("a compare");
    assert_eq!(differing.len(), 1, "one region differed: {report}");
    assert_eq!(differing[0]["offset"], serde_json::json!(block), "{report}");
    assert_eq!(
        differing[0]["replicas"],
        serde_json::json!([format!("node{s}")]),
        "{report}"
    );
    assert_eq!(
        report["replicas"]["bytes_compared"],
        serde_json::json!(32u64 << 20)
    );
    assert_eq!(report["replicas"]["bytes_partial"], serde_json::json!(0));

    // Rewritten from the primary's copy, in the background.
    wait_rewritten(&data, at, 0x3d, Duration::from_secs(10), || {
        "the secondary's copy was not rewritten".into()
    });
    c.assert_replicas_equal(&[0, 1, 2], "db");
    let v = c.show(0, "db");
    assert!(healthy(&v), "no replica was failed over the rot: {v}");

    // A second scrub, through another node, finds nothing; the table says
    // what was compared.
    let again = c.nodes[(s + 1) % 3].cli(&["volume", "scrub", "db"]);
    let text = again.ok();
    assert!(text.contains("replicas compared"), "{text}");
    assert!(text.contains("regions differing"), "{text}");
    let again = c.nodes[p].cli(&["volume", "scrub", "db", "--output", "json"]);
    let report: Value = serde_json::from_str(again.ok()).unwrap();
    assert_eq!(
        report["replicas"]["differing"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(report["bad_blocks"], serde_json::json!([]), "{report}");
}

/// The background scrubber compares replicas too: after its pass over the
/// primary's copy it compares every replica's, and after a pass over a
/// secondary's that found damage it has the primary compare those regions,
/// so a rotten secondary is rewritten with nobody asking (logged and
/// counted where the compare ran).
#[test]
fn background_scrub_compares_replicas_and_rewrites_a_rotten_secondary() {
    let c = Cluster::start_with(3, &[], |_| vec!["--scrub-interval".into(), "3s".into()]);
    c.create_rf3("db", "32M");
    let v = c.wait_volume(0, "db", "in sync", healthy);
    let p = node_index(&primary(&v).expect("a primary"));
    let s = (p + 2) % 3;
    let uri = c.nodes[p].uri("db");
    tool("qemu-io", ["-f", "raw", &uri, "-c", "write -P 0x6e 17M 4k"]).ok();
    tool("qemu-io", ["-f", "raw", &uri, "-c", "flush"]).ok();
    c.wait_volume(0, "db", "in sync", healthy);
    let data = c.nodes[s].data_dir().join("basalt.data");
    let at = rot_block(&data, 0x6e);

    let deadline = Instant::now() + Duration::from_secs(60);
    wait_rewritten(&data, at, 0x6e, Duration::from_secs(60), || {
        format!(
            "no background compare rewrote the secondary's copy:\n{}",
            c.nodes[p].log()
        )
    });
    let metrics = |n: usize| {
        ureq::get(&format!("{}/metrics", c.nodes[n].api_url()))
            .set("Authorization", &format!("Bearer {}", c.nodes[n].token()))
            .call()
            .unwrap()
            .into_string()
            .unwrap()
    };
    // Whichever pass came first did it: the secondary's, which found the
    // damage and had the primary compare that region, or the primary's,
    // which compares the whole volume. The one that did logs and counts it.
    let by = if c.nodes[s]
        .log()
        .contains("asking the primary to compare the regions where this copy is damaged")
    {
        s
    } else {
        p
    };
    // The copy is rewritten before the primary answers the compare, and
    // the compare logs once every answer is in (and its rate allows): wait
    // for the line.
    let logged = Instant::now() + Duration::from_secs(10);
    let differ = "background replica compare: copies differ from the primary's";
    while !c.nodes[by].log().contains(differ) && Instant::now() < logged {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = c.nodes[by].log();
    assert!(log.contains(differ), "{log}");
    let m = metrics(by);
    assert!(
        metric_value(&m, "basalt_replica_compare_differing_regions_total") >= 1.0,
        "{m}"
    );
    // The primary's own pass compares the whole volume, and counts it.
    while metric_value(&metrics(p), "basalt_replica_compare_passes_total") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no background compare pass ended:\n{}",
            c.nodes[p].log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    c.assert_replicas_equal(&[0, 1, 2], "db");
    assert!(healthy(&c.show(0, "db")), "no replica failed over the rot");
}

/// The value of the unlabelled metric `name` in a `/metrics` text.
fn metric_value(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
}

/// The node registry names the ports the frontends bound, not the port 0
/// they were asked to listen on (so clients and the Cinder driver can reach
/// every node from `node list`).
#[test]
fn the_node_registry_names_the_bound_ports() {
    let c = Cluster::start(2, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = c.nodes[0].cli_json(&["node", "list"]);
        let nodes = listed["nodes"].as_array().cloned().unwrap_or_default();
        let bound = |i: usize| {
            nodes.iter().any(|n| {
                n["name"] == format!("node{i}")
                    && n["nvme_addr"] == c.nodes[i].nvme_addr().to_string()
                    && c.nodes[i]
                        .api_url()
                        .ends_with(n["api_addr"].as_str().unwrap_or("-"))
            })
        };
        if bound(0) && bound(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the registry does not name the bound ports: {listed}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
