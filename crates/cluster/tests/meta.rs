//! `cluster::meta` against a real etcd: registration (stable ids, growing
//! boots, liveness), node states, membership compare-and-swap with the
//! protocol's change rules, the coordinator election's failover, fencing of
//! a deposed coordinator's writes, and the provisioning lock.

use basalt_cluster::meta::{
    CasOutcome, ClusterMeta, CoordinatorTerm, ElectionGuard, EtcdConfig, MetaError, NodeInfo,
    NodeState, Registration,
};
use basalt_etcd_fixture::EtcdServer;
use basalt_replication::{Epoch, Membership, NodeId, VolumeId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn info(name: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        peer_addr: "127.0.0.1:7000".parse().unwrap(),
        nbd_addr: None,
        nvme_addr: None,
        iscsi_addr: None,
        api_addr: None,
        zone: Some("z1".into()),
        capacity_bytes: 1 << 30,
        free_bytes: 1 << 30,
        provision_limit_bytes: None,
    }
}

fn connect(etcd: &EtcdServer, prefix: &str) -> ClusterMeta {
    ClusterMeta::connect(EtcdConfig::new([etcd.endpoint()]).with_prefix(prefix)).unwrap()
}

/// Registers `name` and campaigns until it holds the coordinator role.
fn elected(meta: &ClusterMeta, name: &str) -> (Registration, ElectionGuard, CoordinatorTerm) {
    let reg = meta
        .register_node(info(name), Duration::from_secs(2))
        .unwrap();
    let guard = meta.campaign(&reg, Box::new(|_| {})).unwrap();
    wait_until("the election", || meta.coordinator_term().is_some());
    let term = meta.coordinator_term().unwrap();
    (reg, guard, term)
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn registration_ids_boots_liveness_and_states() {
    let etcd = EtcdServer::start().unwrap();
    let meta = connect(&etcd, "/t1/");
    let a = meta.cluster_id().unwrap();
    assert_eq!(
        connect(&etcd, "/t1/").cluster_id().unwrap(),
        a,
        "cluster id is stable"
    );

    let ttl = Duration::from_secs(1);
    let r1 = meta.register_node(info("n1"), ttl).unwrap();
    let r2 = meta.register_node(info("n2"), ttl).unwrap();
    assert_ne!(r1.id(), r2.id());
    let (id1, boot1) = (r1.id(), r1.boot());
    drop(r1); // revokes the lease: down at once
    let nodes = meta.nodes().unwrap();
    assert!(!nodes.iter().find(|n| n.info.name == "n1").unwrap().alive);
    let r1 = meta.register_node(info("n1"), ttl).unwrap();
    assert_eq!(r1.id(), id1, "a name keeps its id");
    assert!(r1.boot() > boot1, "boot grows at every registration");

    // A killed process (lease not revoked) is reported down after its ttl.
    r2.abandon();
    wait_until("n2 down", || {
        meta.nodes()
            .unwrap()
            .iter()
            .any(|n| n.info.name == "n2" && !n.alive)
    });
    meta.set_node_state("n2", NodeState::Removed).unwrap();
    assert!(matches!(
        meta.register_node(info("n2"), ttl),
        Err(MetaError::NodeRemoved(_))
    ));
    assert!(matches!(
        meta.set_node_state("nobody", NodeState::Draining),
        Err(MetaError::UnknownNode(_))
    ));
    drop(r1);
}

#[test]
fn membership_cas_follows_the_protocol_rules() {
    let etcd = EtcdServer::start().unwrap();
    let meta = connect(&etcd, "/t2/");
    let vol = VolumeId(0xfeed_u128 << 64);
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let rec = Membership::new(vol, &[a, b, c], a, 2);
    let (_reg, _guard, term) = elected(&meta, "c");
    assert!(meta.create_membership(term, &rec).unwrap());
    assert!(
        !meta.create_membership(term, &rec).unwrap(),
        "put-if-absent"
    );
    assert_eq!(meta.membership(vol).unwrap(), Some(rec.clone()));

    // A new epoch with a new primary: applied, version + 1.
    let mut next = rec.clone();
    next.epoch = Epoch(2);
    next.primary = b;
    let applied = match meta.cas_membership(1, next.clone()).unwrap() {
        CasOutcome::Applied(r) => r,
        other => panic!("expected Applied, got {other:?}"),
    };
    assert_eq!(applied.version, 2);
    // The same change again at the old version: a conflict naming the
    // current record.
    match meta.cas_membership(1, next.clone()).unwrap() {
        CasOutcome::Conflict(cur) => assert_eq!(cur, applied),
        other => panic!("expected Conflict, got {other:?}"),
    }
    // Primary change without a new epoch, and an epoch going back: refused.
    let mut bad = applied.clone();
    bad.primary = c;
    assert!(matches!(
        meta.cas_membership(2, bad).unwrap(),
        CasOutcome::Invalid(_)
    ));
    let mut bad = applied.clone();
    bad.epoch = Epoch(1);
    assert!(matches!(
        meta.cas_membership(2, bad).unwrap(),
        CasOutcome::Invalid(_)
    ));
    assert_eq!(meta.memberships().unwrap(), vec![applied.clone()]);

    // The watch sees the current record, then every newer version.
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let deleted = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (s, d) = (seen.clone(), deleted.clone());
    let _guard = meta
        .watch_memberships(
            Box::new(move |r| s.lock().push(r.version)),
            Box::new(move |v| d.lock().push(v)),
        )
        .unwrap();
    let mut next = applied.clone();
    next.min_in_sync = 1;
    assert!(matches!(
        meta.cas_membership(2, next).unwrap(),
        CasOutcome::Applied(_)
    ));
    wait_until("the watch to report version 3", || seen.lock().contains(&3));
    assert_eq!(seen.lock().first(), Some(&2));

    // A delete compares the record's mod_revision: one decided from an
    // older listing leaves the record alone.
    let listed = meta.memberships_at().unwrap();
    let (_, rev) = listed.iter().find(|(r, _)| r.volume == vol).unwrap();
    assert!(!meta.delete_membership(term, vol, rev - 1).unwrap());
    assert!(meta.membership(vol).unwrap().is_some());
    assert!(meta.delete_membership(term, vol, *rev).unwrap());
    assert_eq!(meta.membership(vol).unwrap(), None);
    wait_until("the watch to report the deletion", || {
        deleted.lock().contains(&vol)
    });
    assert!(matches!(
        meta.cas_membership(3, applied).unwrap(),
        CasOutcome::Missing
    ));
}

#[test]
fn exactly_one_coordinator_and_failover_when_it_dies() {
    let etcd = EtcdServer::start().unwrap();
    let m1 = connect(&etcd, "/t3/");
    let m2 = connect(&etcd, "/t3/");
    let ttl = Duration::from_secs(2);
    let r1 = m1.register_node(info("c1"), ttl).unwrap();
    let r2 = m2.register_node(info("c2"), ttl).unwrap();
    let e1 = Arc::new(AtomicBool::new(false));
    let e2 = Arc::new(AtomicBool::new(false));
    let (f1, f2) = (e1.clone(), e2.clone());
    let g1 = m1
        .campaign(&r1, Box::new(move |won| f1.store(won, Ordering::SeqCst)))
        .unwrap();
    wait_until("c1 elected", || e1.load(Ordering::SeqCst));
    let _g2 = m2
        .campaign(&r2, Box::new(move |won| f2.store(won, Ordering::SeqCst)))
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // A standby only reads while the role is held: two seconds (four of
    // its polls) commit no raft proposal (each one an fsync on etcd).
    let before = etcd.proposals_committed().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        etcd.proposals_committed().unwrap(),
        before,
        "etcd writes while the coordinator role is held"
    );
    assert!(!e2.load(Ordering::SeqCst), "two coordinators at once");
    assert_eq!(m2.coordinator().unwrap().as_deref(), Some("c1"));
    drop(g1); // resigns
    wait_until("c2 elected", || e2.load(Ordering::SeqCst));
    assert_eq!(m1.coordinator().unwrap().as_deref(), Some("c2"));
    assert!(!e1.load(Ordering::SeqCst));
    drop(r1);
    drop(r2);
}

/// The pause the issue describes: a coordinator loses its role without
/// noticing (here it resigns; a frozen process is the same to etcd), a
/// successor is elected and places the volume again; every write of the
/// old tenure — CAS, create, delete — is refused, and changes nothing.
#[test]
fn a_deposed_coordinators_writes_are_fenced() {
    let etcd = EtcdServer::start().unwrap();
    let (m1, m2) = (connect(&etcd, "/t5/"), connect(&etcd, "/t5/"));
    let vol = VolumeId(0xabcd_u128 << 64);
    let (a, b) = (NodeId(1), NodeId(2));
    let (r1, g1, old_term) = elected(&m1, "old");
    let rec = Membership::new(vol, &[a, b], a, 1);
    assert!(m1.create_membership(old_term, &rec).unwrap());
    let (_, rev) = m1.memberships_at().unwrap()[0];
    drop(g1);
    drop(r1);
    let (_r2, _g2, new_term) = elected(&m2, "new");
    assert_ne!(old_term, new_term);

    let mut failover = rec.clone();
    failover.epoch = Epoch(2);
    failover.primary = b;
    assert!(matches!(
        m1.cas_membership_fenced(old_term, 1, failover.clone()),
        Err(MetaError::Fenced(t)) if t == old_term.0
    ));
    assert!(matches!(
        m1.delete_membership(old_term, vol, rev),
        Err(MetaError::Fenced(_))
    ));
    let other = Membership::new(VolumeId(vol.0 + 1), &[a], a, 1);
    assert!(matches!(
        m1.create_membership(old_term, &other),
        Err(MetaError::Fenced(_))
    ));
    assert_eq!(
        m2.memberships().unwrap(),
        vec![rec.clone()],
        "nothing changed"
    );
    // The current coordinator's writes go through.
    assert!(matches!(
        m2.cas_membership_fenced(new_term, 1, failover).unwrap(),
        CasOutcome::Applied(r) if r.version == 2
    ));
}

#[test]
fn provisioning_lock_has_one_holder_at_a_time() {
    let etcd = EtcdServer::start().unwrap();
    let (m1, m2) = (connect(&etcd, "/t4/"), connect(&etcd, "/t4/"));
    let held = m1.lock_provisioning().unwrap();
    // A second holder waits for the first to let go...
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let lock = m2.lock_provisioning();
        let _ = tx.send(Instant::now());
        lock.map(drop)
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "a second holder got the provisioning lock while the first held it"
    );
    let released = Instant::now();
    drop(held);
    let got = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the waiting holder gets the lock once it is released");
    assert!(got >= released);
    waiter.join().unwrap().unwrap();
    // ...and the lock is free again once that one is dropped too.
    drop(m1.lock_provisioning().unwrap());
}

/// etcd down for longer than the role's margin: the coordinator stops
/// counting on its role (no lease is extended) but, as nobody else could
/// take it, finds it again with the same term as soon as etcd is back (no
/// new election, so primaries' leases resume at once).
#[test]
fn the_coordinator_role_outlives_an_etcd_outage_with_its_term() {
    let mut etcd = EtcdServer::start().unwrap();
    let meta = connect(&etcd, "/t9/");
    let lost = Arc::new(AtomicBool::new(false));
    let l = lost.clone();
    let reg = meta
        .register_node(info("n1"), Duration::from_secs(5))
        .unwrap();
    let _guard = meta
        .campaign(
            &reg,
            Box::new(move |elected| {
                if !elected {
                    l.store(true, Ordering::SeqCst);
                }
            }),
        )
        .unwrap();
    wait_until("the election", || meta.coordinator_role_current());
    let term = meta.coordinator_term().unwrap();
    etcd.kill().unwrap();
    wait_until("the role to lapse", || !meta.coordinator_role_current());
    std::thread::sleep(Duration::from_secs(3));
    etcd.restart().unwrap();
    let back = Instant::now();
    wait_until("the role to resume", || meta.coordinator_role_current());
    assert!(
        back.elapsed() < Duration::from_secs(2),
        "the role resumed {:?} after etcd returned",
        back.elapsed()
    );
    assert_eq!(meta.coordinator_term(), Some(term));
    assert!(!lost.load(Ordering::SeqCst), "the role was given up");
}
