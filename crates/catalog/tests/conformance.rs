//! The catalog conformance suite: every case is one generic function over
//! [`Catalog`], run against each backend (`redb::*` and `etcd::*`, the latter
//! on a real etcd from `basalt-etcd-fixture`), so both honour the semantics
//! in the crate docs identically. Behaviour only a networked backend has
//! (unreachable endpoints, restarts, being called from async runtimes) is
//! tested in `etcd_only`.

use basalt_catalog::{
    Catalog, CatalogError, EtcdCatalog, EtcdConfig, RedbCatalog, Revision, VolumeRecord,
};
use basalt_etcd_fixture::{EtcdCluster, EtcdServer};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};
use uuid::Uuid;

// ---------------------------------------------------------------------------
// Backends.

fn open_redb() -> (tempfile::TempDir, RedbCatalog) {
    let dir = tempfile::tempdir().unwrap();
    let cat = RedbCatalog::open(dir.path().join("catalog.redb")).unwrap();
    (dir, cat)
}

fn open_etcd() -> (EtcdServer, EtcdCatalog) {
    let etcd = EtcdServer::start().unwrap();
    let cat = EtcdCatalog::connect(EtcdConfig::new([etcd.endpoint()])).unwrap();
    (etcd, cat)
}

/// Instantiates every listed case once per backend.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod redb {
            $(#[test] fn $case() { let (_guard, cat) = super::open_redb(); super::$case(&cat); })*
        }
        mod etcd {
            $(#[test] fn $case() { let (_guard, cat) = super::open_etcd(); super::$case(&cat); })*
        }
    };
}

conformance!(
    insert_get_list_in_name_order,
    insert_of_an_existing_name_is_already_exists,
    update_is_compare_and_swap,
    delete_is_compare_and_swap,
    update_or_delete_of_a_missing_record_is_not_found,
    revisions_grow_and_are_never_reused,
    unknown_fields_are_kept,
    concurrent_updaters_have_one_winner_per_round,
    concurrent_inserters_have_one_winner,
);

// ---------------------------------------------------------------------------
// Cases.

fn record(name: &str, size: u64) -> VolumeRecord {
    VolumeRecord::new(Uuid::new_v4(), name, size, SystemTime::now())
}

fn names(cat: &impl Catalog) -> Vec<String> {
    cat.list()
        .unwrap()
        .into_iter()
        .map(|v| v.record.name)
        .collect()
}

fn insert_get_list_in_name_order(cat: &impl Catalog) {
    assert!(cat.get("a").unwrap().is_none());
    assert!(cat.list().unwrap().is_empty());
    // Inserted out of order; bytewise name order is what list promises
    // ("B" < "a" < "a-1" < "aa" < "b").
    let recs: Vec<_> = ["b", "a-1", "aa", "a", "B"]
        .iter()
        .enumerate()
        .map(|(i, n)| record(n, 4096 * (i as u64 + 1)))
        .collect();
    let mut revs = Vec::new();
    for rec in &recs {
        revs.push(cat.insert(rec).unwrap());
    }
    for (rec, rev) in recs.iter().zip(&revs) {
        let got = cat.get(&rec.name).unwrap().unwrap();
        assert_eq!((&got.record, got.revision), (rec, *rev));
    }
    let listed = cat.list().unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|v| v.record.name.as_str())
            .collect::<Vec<_>>(),
        ["B", "a", "a-1", "aa", "b"]
    );
    for v in &listed {
        let i = recs.iter().position(|r| r.name == v.record.name).unwrap();
        assert_eq!((&v.record, v.revision), (&recs[i], revs[i]));
    }
    assert!(cat.get("c").unwrap().is_none());
}

fn insert_of_an_existing_name_is_already_exists(cat: &impl Catalog) {
    let first = record("vol", 4096);
    let rev = cat.insert(&first).unwrap();
    let err = cat.insert(&record("vol", 8192)).unwrap_err();
    assert!(
        matches!(err, CatalogError::AlreadyExists(ref n) if n == "vol"),
        "{err}"
    );
    let got = cat.get("vol").unwrap().unwrap();
    assert_eq!(
        (got.record, got.revision),
        (first, rev),
        "first record kept"
    );
}

fn update_is_compare_and_swap(cat: &impl Catalog) {
    let mut rec = record("vol", 4096);
    let r1 = cat.insert(&rec).unwrap();
    rec.size_bytes = 8192;
    let r2 = cat.update(&rec, r1).unwrap();
    assert!(r2 > r1);
    let got = cat.get("vol").unwrap().unwrap();
    assert_eq!((got.record.size_bytes, got.revision), (8192, r2));

    rec.size_bytes = 12288;
    for stale in [r1, Revision::new(0), Revision::new(r2.get() + 1000)] {
        match cat.update(&rec, stale).unwrap_err() {
            CatalogError::Conflict {
                name,
                expected,
                found,
            } => assert_eq!((name.as_str(), expected, found), ("vol", stale, r2)),
            other => panic!("expected conflict for {stale}, got {other}"),
        }
    }
    let got = cat.get("vol").unwrap().unwrap();
    assert_eq!(
        (got.record.size_bytes, got.revision),
        (8192, r2),
        "a losing update changes nothing"
    );
}

fn delete_is_compare_and_swap(cat: &impl Catalog) {
    let mut rec = record("vol", 4096);
    let r1 = cat.insert(&rec).unwrap();
    rec.size_bytes = 8192;
    let r2 = cat.update(&rec, r1).unwrap();
    match cat.delete("vol", r1).unwrap_err() {
        CatalogError::Conflict {
            expected, found, ..
        } => assert_eq!((expected, found), (r1, r2)),
        other => panic!("expected conflict, got {other}"),
    }
    assert_eq!(cat.get("vol").unwrap().unwrap().record, rec, "still there");
    cat.delete("vol", r2).unwrap();
    assert!(cat.get("vol").unwrap().is_none());
    assert!(cat.list().unwrap().is_empty());
}

fn update_or_delete_of_a_missing_record_is_not_found(cat: &impl Catalog) {
    let is_not_found = |r: Result<_, CatalogError>| matches!(r, Err(CatalogError::NotFound(ref n)) if n == "ghost");
    // Never existed; revision 0 must not match a missing key either.
    for rev in [Revision::new(0), Revision::new(1), Revision::new(u64::MAX)] {
        assert!(is_not_found(cat.update(&record("ghost", 4096), rev)));
        assert!(is_not_found(cat.delete("ghost", rev).map(|()| rev)));
    }
    // Existed, then deleted: the revision it had must not revive it.
    let r1 = cat.insert(&record("ghost", 4096)).unwrap();
    cat.delete("ghost", r1).unwrap();
    assert!(is_not_found(cat.update(&record("ghost", 8192), r1)));
    assert!(is_not_found(cat.delete("ghost", r1).map(|()| r1)));
    assert!(
        cat.get("ghost").unwrap().is_none(),
        "update created nothing"
    );
}

fn revisions_grow_and_are_never_reused(cat: &impl Catalog) {
    let mut seen: Vec<Revision> = Vec::new();
    let mut note = |r: Revision| {
        assert!(
            seen.last().is_none_or(|&last| r > last),
            "{r} after {seen:?}"
        );
        seen.push(r);
        r
    };
    let a = note(cat.insert(&record("a", 4096)).unwrap());
    let b = note(cat.insert(&record("b", 4096)).unwrap());
    let a2 = note(cat.update(&record("a", 8192), a).unwrap());
    cat.delete("b", b).unwrap();
    let b_again = note(cat.insert(&record("b", 4096)).unwrap());
    cat.delete("a", a2).unwrap();
    let a_again = note(cat.insert(&record("a", 4096)).unwrap());
    assert!(b_again > a2 && a_again > b_again);
    // Stale handles on the old incarnations lose, and lose as conflicts.
    for (name, stale, current) in [("a", a, a_again), ("a", a2, a_again), ("b", b, b_again)] {
        match cat.delete(name, stale).unwrap_err() {
            CatalogError::Conflict { found, .. } => assert_eq!(found, current),
            other => panic!("expected conflict, got {other}"),
        }
    }
    assert_eq!(names(cat), ["a", "b"]);
}

fn unknown_fields_are_kept(cat: &impl Catalog) {
    let mut rec = record("vol", 4096);
    rec.unknown
        .insert("qos_policy".into(), serde_json::json!(3));
    let r1 = cat.insert(&rec).unwrap();
    assert_eq!(cat.get("vol").unwrap().unwrap().record, rec);
    rec.size_bytes = 8192;
    cat.update(&rec, r1).unwrap();
    assert_eq!(cat.list().unwrap()[0].record.unknown["qos_policy"], 3);
}

fn concurrent_updaters_have_one_winner_per_round<C: Catalog>(cat: &C) {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 15;
    cat.insert(&record("vol", 4096)).unwrap();
    let barrier = Barrier::new(THREADS as usize);
    // (round, thread, revision read, outcome)
    let outcomes: Vec<(u64, u64, Revision, Result<Revision, CatalogError>)> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let mut out = Vec::new();
                        for round in 0..ROUNDS {
                            barrier.wait();
                            let current = cat.get("vol").unwrap().unwrap();
                            // Nobody writes until everyone has read.
                            barrier.wait();
                            let mut rec = current.record;
                            rec.size_bytes = 4096 * (1 + round * THREADS + t);
                            out.push((
                                round,
                                t,
                                current.revision,
                                cat.update(&rec, current.revision),
                            ));
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
    let mut last_winner = None;
    for round in 0..ROUNDS {
        let this: Vec<_> = outcomes.iter().filter(|o| o.0 == round).collect();
        assert_eq!(this.len() as u64, THREADS);
        let read = this[0].2;
        assert!(this.iter().all(|o| o.2 == read), "all read one revision");
        let winners: Vec<_> = this.iter().filter(|o| o.3.is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {this:?}");
        let (_, t, _, Ok(won)) = winners[0] else {
            unreachable!()
        };
        for (_, _, _, outcome) in this.iter().filter(|o| o.3.is_err()) {
            match outcome {
                Err(CatalogError::Conflict {
                    expected, found, ..
                }) => assert_eq!((*expected, *found), (read, *won)),
                other => panic!("round {round}: loser got {other:?}"),
            }
        }
        last_winner = Some((round, *t, *won));
    }
    let (round, t, won) = last_winner.unwrap();
    let got = cat.get("vol").unwrap().unwrap();
    assert_eq!(got.revision, won);
    assert_eq!(got.record.size_bytes, 4096 * (1 + round * THREADS + t));
}

fn concurrent_inserters_have_one_winner<C: Catalog>(cat: &C) {
    const THREADS: usize = 4;
    let barrier = Barrier::new(THREADS);
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let rec = record("vol", 4096 * (t as u64 + 1));
                    barrier.wait();
                    (rec.clone(), cat.insert(&rec))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<_> = results.iter().filter(|r| r.1.is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(results
        .iter()
        .filter(|r| r.1.is_err())
        .all(|r| matches!(r.1, Err(CatalogError::AlreadyExists(_)))));
    let got = cat.get("vol").unwrap().unwrap();
    assert_eq!(&got.record, &winners[0].0);
}

// ---------------------------------------------------------------------------
// What only a networked backend can get wrong.

mod etcd_only {
    use super::*;
    use std::net::TcpListener;

    const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
    /// How much later than the request timeout an error may arrive (the
    /// catalog's own grace plus scheduling slack on a loaded machine).
    const SLACK: Duration = Duration::from_secs(2);

    fn config<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdConfig {
        EtcdConfig::new(endpoints).with_timeouts(Duration::from_millis(500), REQUEST_TIMEOUT)
    }

    /// A port nothing listens on (it was free a moment ago).
    fn refused_endpoint() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }

    fn assert_unavailable(err: &CatalogError, endpoint: &str) {
        assert!(
            matches!(
                err,
                CatalogError::Timeout { .. } | CatalogError::Request { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(endpoint), "{err}");
    }

    #[test]
    fn connect_to_a_refused_port_fails_within_the_timeout() {
        let endpoint = refused_endpoint();
        let t0 = Instant::now();
        let err = EtcdCatalog::connect(config([&endpoint])).unwrap_err();
        assert!(t0.elapsed() < REQUEST_TIMEOUT + SLACK, "{:?}", t0.elapsed());
        assert_unavailable(&err, &endpoint);
    }

    #[test]
    fn connect_to_a_silent_server_times_out() {
        // Accepts TCP connections (the kernel does, from the backlog) but
        // never speaks HTTP/2.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", silent.local_addr().unwrap());
        let t0 = Instant::now();
        let err = EtcdCatalog::connect(config([&endpoint])).unwrap_err();
        assert!(t0.elapsed() < REQUEST_TIMEOUT + SLACK, "{:?}", t0.elapsed());
        assert!(matches!(err, CatalogError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains(&endpoint), "{err}");
    }

    #[test]
    fn one_live_endpoint_among_dead_ones_is_enough() {
        let etcd = EtcdServer::start().unwrap();
        let endpoints = [refused_endpoint(), etcd.endpoint(), refused_endpoint()];
        let cat = EtcdCatalog::connect(config(&endpoints)).unwrap();
        for i in 0..20 {
            cat.insert(&record(&format!("v{i:02}"), 4096)).unwrap();
        }
        assert_eq!(cat.list().unwrap().len(), 20);
    }

    #[test]
    fn survives_an_etcd_restart_and_keeps_the_records() {
        let mut etcd = EtcdServer::start().unwrap();
        let cat = EtcdCatalog::connect(config(&[etcd.endpoint()])).unwrap();
        let mut rec = record("vol", 4096);
        let r1 = cat.insert(&rec).unwrap();
        rec.size_bytes = 8192;
        let r2 = cat.update(&rec, r1).unwrap();
        cat.insert(&record("other", 4096)).unwrap();
        let before = cat.list().unwrap();

        etcd.kill().unwrap(); // SIGKILL: acknowledged writes must be on disk
        let t0 = Instant::now();
        let err = cat.get("vol").unwrap_err();
        assert!(t0.elapsed() < REQUEST_TIMEOUT + SLACK, "{:?}", t0.elapsed());
        assert_unavailable(&err, &etcd.endpoint());
        assert!(err.to_string().contains("/basalt/volumes/vol"), "{err}");

        etcd.restart().unwrap();
        // The same catalog reconnects by itself; give it a few attempts.
        let t0 = Instant::now();
        let got = loop {
            match cat.get("vol") {
                Ok(got) => break got.unwrap(),
                Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                    eprintln!("not reconnected yet: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("no reconnect within 10 s: {e}"),
            }
        };
        eprintln!("reconnected {:?} after the restart", t0.elapsed());
        assert_eq!((got.record, got.revision), (rec.clone(), r2));
        assert_eq!(cat.list().unwrap(), before);
        rec.size_bytes = 12288;
        let r3 = cat.update(&rec, r2).unwrap();
        assert!(r3 > r2);
    }

    /// The index of the cluster's current leader.
    fn leader(cluster: &EtcdCluster) -> usize {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..cluster.size() {
                let mut c = etcd_client::Client::connect([cluster.endpoint(i)], None)
                    .await
                    .unwrap();
                let status = c.status().await.unwrap();
                if status.leader() == status.header().unwrap().member_id() {
                    return i;
                }
            }
            panic!("no leader")
        })
    }

    /// Retries `f` for up to `within` (an election and a request timeout
    /// fit in it), returning its first success.
    fn eventually<T>(within: Duration, mut f: impl FnMut() -> Result<T, CatalogError>) -> T {
        let t0 = Instant::now();
        loop {
            match f() {
                Ok(v) => return v,
                Err(e) if t0.elapsed() < within => {
                    eprintln!("not yet: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("still failing after {within:?}: {e}"),
            }
        }
    }

    #[test]
    fn fails_over_between_the_members_of_a_cluster() {
        let mut cluster = EtcdCluster::start(3).unwrap();
        let lead = leader(&cluster);
        let followers: Vec<usize> = (0..3).filter(|&i| i != lead).collect();
        // The catalog starts on the first endpoint given: a follower.
        let order = [followers[0], followers[1], lead];
        let endpoints: Vec<String> = order.iter().map(|&i| cluster.endpoint(i)).collect();
        let cat = EtcdCatalog::connect(config(&endpoints)).unwrap();
        let mut rec = record("vol", 4096);
        let mut rev = cat.insert(&rec).unwrap();

        // The follower in use dies: it refuses connections, so the very next
        // call, even a write, goes to another member and succeeds.
        cluster.kill(followers[0]).unwrap();
        rec.size_bytes = 8192;
        rev = cat.update(&rec, rev).unwrap();
        cat.insert(&record("after-follower", 4096)).unwrap();
        cluster.restart(followers[0]).unwrap();

        // The leader dies: until the others elect a new one, calls may fail
        // (a write forwarded to the dead leader just times out); then the
        // same catalog works again by itself.
        cluster.kill(lead).unwrap();
        let got = eventually(Duration::from_secs(10), || cat.get("vol")).unwrap();
        assert!(got.revision >= rev);
        let rev = eventually(Duration::from_secs(10), || {
            let cur = cat.get("vol")?.unwrap();
            let mut rec = cur.record;
            rec.size_bytes = 12288;
            cat.update(&rec, cur.revision)
        });
        eventually(Duration::from_secs(10), || {
            match cat.insert(&record("after-leader", 4096)) {
                Err(CatalogError::AlreadyExists(_)) => Ok(()), // an earlier try landed
                other => other.map(drop),
            }
        });
        let got = cat.get("vol").unwrap().unwrap();
        assert_eq!((got.revision, got.record.size_bytes), (rev, 12288));
        assert_eq!(names(&cat), ["after-follower", "after-leader", "vol"]);
    }

    #[test]
    fn a_cluster_without_quorum_fails_within_the_timeout() {
        let mut cluster = EtcdCluster::start(3).unwrap();
        let cat = EtcdCatalog::connect(config(cluster.endpoints())).unwrap();
        let rev = cat.insert(&record("vol", 4096)).unwrap();
        cluster.kill(0).unwrap();
        cluster.kill(1).unwrap();
        // Member 2 is up but cannot reach a quorum: nothing can succeed,
        // and every call must fail in time.
        type Call<'a> = Box<dyn Fn() -> Result<(), CatalogError> + 'a>;
        let calls: [(&str, Call); 3] = [
            ("get", Box::new(|| cat.get("vol").map(drop))),
            (
                "update",
                Box::new(|| cat.update(&record("vol", 8192), rev).map(drop)),
            ),
            ("list", Box::new(|| cat.list().map(drop))),
        ];
        for (what, call) in calls {
            let t0 = Instant::now();
            let err = call().unwrap_err();
            assert!(
                t0.elapsed() < REQUEST_TIMEOUT + SLACK,
                "{what}: {:?}",
                t0.elapsed()
            );
            assert!(
                matches!(
                    err,
                    CatalogError::Timeout { .. } | CatalogError::Request { .. }
                ),
                "{what}: {err}"
            );
        }
        // With a quorum back, the same catalog works again (the update's
        // outcome was unknown: it may have been applied or not).
        cluster.restart(0).unwrap();
        let got = cat.get("vol").unwrap().unwrap();
        assert!(got.revision >= rev);
        cat.update(&record("vol", 12288), got.revision).unwrap();
    }

    #[test]
    fn works_inside_spawn_blocking_of_another_runtime() {
        let (_etcd, cat) = open_etcd();
        let cat = Arc::new(cat);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let tasks: Vec<_> = (0..4)
            .map(|t| {
                let cat = cat.clone();
                rt.spawn_blocking(move || {
                    let name = format!("t{t}");
                    let r1 = cat.insert(&record(&name, 4096)).unwrap();
                    let r2 = cat.update(&record(&name, 8192), r1).unwrap();
                    assert_eq!(cat.get(&name).unwrap().unwrap().revision, r2);
                    cat.list().unwrap().len()
                })
            })
            .collect();
        rt.block_on(async {
            for t in tasks {
                assert!(t.await.unwrap() >= 1);
            }
        });
        assert_eq!(names(&*cat), ["t0", "t1", "t2", "t3"]);
    }

    #[test]
    fn used_on_an_async_thread_without_panicking() {
        // Not how it should be used (it blocks the caller's worker), but
        // connecting, calling, failing and dropping must neither deadlock nor
        // panic, even on a current-thread runtime.
        let etcd = EtcdServer::start().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoint = etcd.endpoint();
        rt.block_on(async move {
            let cat = EtcdCatalog::connect(config([&endpoint])).unwrap();
            let rev = cat.insert(&record("vol", 4096)).unwrap();
            assert_eq!(cat.get("vol").unwrap().unwrap().revision, rev);
            drop(cat); // drops the catalog's own runtime inside this one
                       // A failed connect drops its runtime early, in here too.
            let err = EtcdCatalog::connect(config([refused_endpoint()])).unwrap_err();
            assert_unavailable(&err, "http://127.0.0.1:");
            let err = EtcdCatalog::connect(config([&endpoint, "bad url"])).unwrap_err();
            assert!(matches!(err, CatalogError::Config(_)), "{err}");
        });
    }

    #[test]
    fn prefixes_separate_catalogs_sharing_one_etcd() {
        let etcd = EtcdServer::start().unwrap();
        let a =
            EtcdCatalog::connect(config(&[etcd.endpoint()]).with_prefix("/cluster-a/")).unwrap();
        let b =
            EtcdCatalog::connect(config(&[etcd.endpoint()]).with_prefix("/cluster-b/")).unwrap();
        a.insert(&record("vol", 4096)).unwrap();
        assert!(b.get("vol").unwrap().is_none());
        assert!(b.list().unwrap().is_empty());
        b.insert(&record("vol", 8192)).unwrap();
        assert_eq!(a.get("vol").unwrap().unwrap().record.size_bytes, 4096);
        // Revisions are etcd's, shared by both.
        let ra = a.get("vol").unwrap().unwrap().revision;
        let rb = b.get("vol").unwrap().unwrap().revision;
        assert!(rb > ra);
    }
}
