//! Tenancy in a cluster (3 node processes, a real etcd): projects, tokens
//! and volume types live in etcd with the catalog, so a token made through
//! one node works on every node and is revoked on all at once; a quota is
//! enforced atomically across nodes (two creates through two nodes racing
//! for the last volume: exactly one wins); and a retype changes a volume's
//! replica count through the cluster's placement, up and down.

mod common;

use common::cluster::{all_in_sync, replicas, Cluster};
use common::*;

/// `basalt ARGS --token TOKEN` through node `via`.
fn as_token(c: &Cluster, via: usize, token: &str, args: &[&str]) -> CmdOutput {
    let mut a = args.to_vec();
    a.extend(["--token", token]);
    c.nodes[via].cli(&a)
}

#[test]
fn tokens_quotas_and_types_hold_across_nodes() {
    let c = Cluster::start(3, &[]);
    c.nodes[0]
        .cli(&["project", "create", "p", "--volumes", "2"])
        .ok();
    let out = c.nodes[1].cli(&["token", "create", "--project", "p", "--role", "member"]);
    let token = out.ok().trim().to_string();
    for via in 0..3 {
        as_token(&c, via, &token, &["volume", "list"]).ok();
    }
    as_token(
        &c,
        2,
        &token,
        &[
            "volume",
            "create",
            "first",
            "--size",
            "8M",
            "--replicas",
            "1",
        ],
    )
    .ok();

    // Two creates through two nodes at the same moment, one volume left.
    let barrier = std::sync::Barrier::new(2);
    let outs: Vec<CmdOutput> = std::thread::scope(|s| {
        let handles: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|via| {
                let (barrier, c, token) = (&barrier, &c, &token);
                s.spawn(move || {
                    let name = format!("race{via}");
                    barrier.wait();
                    as_token(
                        c,
                        via,
                        token,
                        &["volume", "create", &name, "--size", "8M", "--replicas", "1"],
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("CLI thread"))
            .collect()
    });
    let won: Vec<&CmdOutput> = outs.iter().filter(|o| o.code() == Some(0)).collect();
    assert_eq!(
        won.len(),
        1,
        "exactly one create may take the last volume:\n{}\n{}",
        outs[0].describe(),
        outs[1].describe()
    );
    let lost = outs.iter().find(|o| o.code() != Some(0)).expect("a loser");
    assert!(
        lost.stderr.contains("quota exceeded"),
        "{}",
        lost.describe()
    );
    let project = c.nodes[2].cli_json(&["project", "show", "p"]);
    assert_eq!(project["usage"]["volumes"], 2, "{project}");

    // Retype through the cluster: a type made on node 0 is used on node 2,
    // and the replica count follows it up, then down.
    c.nodes[0]
        .cli(&["type", "create", "triple", "--replicas", "3"])
        .ok();
    c.nodes[0]
        .cli(&["type", "create", "single", "--replicas", "1"])
        .ok();
    as_token(&c, 2, &token, &["volume", "retype", "first", "triple"]).ok();
    let v = c.wait_volume(1, "first", "three replicas in sync", |v| all_in_sync(v, 3));
    assert_eq!(v["replicas_wanted"], 3, "{v}");
    as_token(&c, 1, &token, &["volume", "retype", "first", "single"]).ok();
    c.wait_volume(0, "first", "back to one replica", |v| {
        replicas(v).len() == 1 && all_in_sync(v, 1)
    });

    // Revoked through node 2: refused by every node at once.
    let id = token.split('_').nth(1).expect("token id").to_string();
    c.nodes[2].cli(&["token", "revoke", &id]).ok();
    for via in 0..3 {
        let err = as_token(&c, via, &token, &["volume", "list"]).cli_error(1);
        assert!(err.contains("invalid token"), "node {via}: {err}");
    }
}
