//! Full stores under a replicated volume: a write none of them has space
//! for is answered ENOSPC over NBD (not retried until the client's
//! deadline), the replicas stay identical, the volume comes back in sync,
//! and TRIM gives the space back on every replica. One replica's full
//! store costs no write: that replica leaves the stream, and is resynced
//! once its store has room again.

mod common;

use common::cluster::*;
use common::*;

#[test]
fn full_stores_answer_enospc_and_trim_gives_space_back_on_every_replica() {
    // Three equal stores of 32 MiB (about 28 MiB of data each) under one
    // 40 MiB RF3 volume: they run out together, at the same write.
    let c = Cluster::start_sized(&["32M", "32M", "32M"]);
    let vol = "full";
    c.nodes[0]
        .cli(&["volume", "create", vol, "--size", "40M", "--replicas", "3"])
        .ok();
    let v = c.wait_volume(0, vol, "in sync", |v| all_in_sync(v, 3));
    let p = node_index(&primary(&v).expect("a primary"));
    // Through a secondary's node: the reply crosses the peer protocol.
    let via = (p + 1) % 3;
    let uri = c.nodes[via].uri(vol);

    let (filled, enospc) = nbd_fill(&uri, 5, 0, true);
    assert!(
        enospc,
        "wrote {filled} bytes of a 40 MiB volume on 32 MiB stores without ENOSPC\n{}",
        c.logs()
    );
    assert!(
        (8 * MIB..29 * MIB).contains(&filled),
        "ENOSPC after {filled} bytes on stores of about 28 MiB\n{}",
        c.logs()
    );
    eprintln!("ENOSPC after {} MiB", filled / MIB);
    assert!(
        c.nodes[p]
            .log()
            .contains("the local store has no space for a write of this replica"),
        "the primary's store never refused a write\n{}",
        c.logs()
    );
    // Replicas that held the refused write (or lacked it) are resynced
    // from the primary's copy where it may differ.
    c.wait_volume(via, vol, "in sync after ENOSPC", healthy);
    verify_pattern(None, &uri, 5, 1, 0, filled);
    c.assert_replicas_equal(&[0, 1, 2], vol);
    // Overwriting space already allocated works; the store is still full.
    write_pattern(None, &uri, 6, 1, 0, MIB);
    let (more, still) = nbd_fill(&uri, 5, filled, true);
    assert!(
        still && more == 0,
        "wrote {more} more bytes into full stores (ENOSPC: {still})"
    );
    c.wait_volume(via, vol, "in sync after the second ENOSPC", healthy);

    // TRIM 8 MiB: every replica frees it, so 4 MiB and more fit again.
    nbd_trim(&uri, 2 * MIB, 8 * MIB);
    let (after_trim, _) = nbd_fill(&uri, 5, filled, true);
    assert!(
        after_trim >= 4 * MIB,
        "only {after_trim} bytes writable after trimming 8 MiB\n{}",
        c.logs()
    );
    c.wait_volume(via, vol, "in sync after the trim", healthy);
    verify_pattern(None, &uri, 6, 1, 0, MIB);
    verify_pattern(None, &uri, 5, 1, MIB, MIB);
    verify_pattern(None, &uri, 5, 1, 10 * MIB, filled + after_trim - 10 * MIB);
    c.assert_replicas_equal(&[0, 1, 2], vol);
}

#[test]
fn one_full_replica_leaves_the_stream_and_writes_go_on() {
    // Node 2's store (about 24 MiB of data) is the only one too small for
    // the 32 MiB written below; RF3 needs 2 replicas in sync.
    let c = Cluster::start_sized(&["64M", "64M", "28M"]);
    let vol = "lopsided";
    c.nodes[0]
        .cli(&["volume", "create", vol, "--size", "40M", "--replicas", "3"])
        .ok();
    let v = c.wait_volume(0, vol, "in sync", |v| all_in_sync(v, 3));
    let small = 2;
    assert_ne!(
        primary(&v).map(|p| node_index(&p)),
        Some(small),
        "placement made the smallest store the primary: {v:#}"
    );
    let uri = c.nodes[0].uri(vol);
    write_pattern(None, &uri, 9, 1, 0, 32 * MIB);
    let v = c.show(0, vol);
    assert_eq!(
        replica_state(&v, small).as_deref(),
        Some("out-of-sync"),
        "the full replica still counts: {v:#}\n{}",
        c.logs()
    );
    assert!(
        c.nodes[small]
            .log()
            .contains("the local store has no space for a write of this replica"),
        "{}",
        c.logs()
    );
    verify_pattern(None, &uri, 9, 1, 0, 32 * MIB);

    // Trimming 16 MiB makes room: the replica's resync (zeros where the
    // volume was trimmed) fits, and it is InSync again, identical.
    nbd_trim(&uri, 8 * MIB, 16 * MIB);
    c.wait_volume(0, vol, "in sync after the trim", healthy);
    c.assert_replicas_equal(&[0, 1, 2], vol);
    verify_pattern(None, &c.nodes[small].uri(vol), 9, 1, 0, 8 * MIB);
    verify_pattern(None, &uri, 9, 1, 24 * MIB, 8 * MIB);
}
