//! A full store: writes needing new space get ENOSPC over NBD, nothing
//! already written is lost, the connection and the store stay usable, and
//! TRIM or deleting a volume gives the space back.

mod common;

use common::*;

#[track_caller]
fn verify(uri: &str, seed: u64, offset: u64, length: u64) {
    nbd_script(
        "nbdtool.py",
        [
            "verify",
            uri,
            "--seed",
            &seed.to_string(),
            "--offset",
            &offset.to_string(),
            "--length",
            &length.to_string(),
        ],
    )
    .ok();
}

#[test]
fn enospc_then_trim_and_delete_free_space() {
    let mut s = Server::start("32M");
    // 54 MiB provisioned on a 32 MiB data file (28 MiB usable: thin, within 2x).
    s.create_volume("a", "38M");
    s.create_volume("b", "16M");
    let (a, b) = (s.uri("a"), s.uri("b"));

    nbd_script(
        "nbdtool.py",
        [
            "write",
            &b,
            "--seed",
            "7",
            "--offset",
            "0",
            "--length",
            &(8 * MIB).to_string(),
            "--flush",
        ],
    )
    .ok();

    // Fill a until the store is full.
    let (filled, enospc) = nbd_fill(&a, 1, 0, false);
    assert!(
        enospc,
        "wrote all of a 38 MiB volume into a 28 MiB store holding 8 MiB of b without ENOSPC"
    );
    assert!(
        filled >= 8 * MIB,
        "ENOSPC after only {filled} bytes with ~24 MiB free"
    );
    assert!(
        filled < 24 * MIB + MIB,
        "filled {filled} bytes, more than the free space"
    );
    eprintln!("store full after {} MiB of a", filled / MIB);

    // Still full: a write needing new space fails again; data written before is intact.
    let (more, enospc2) = nbd_fill(&a, 1, filled, false);
    assert!(
        enospc2 && more == 0,
        "second fill wrote {more} bytes (enospc {enospc2})"
    );
    verify(&a, 1, 0, filled);
    verify(&b, 7, 0, 8 * MIB);
    // the API and CLI still work on a full store
    s.cli_json(&["status"]);
    s.cli_json(&["volume", "list"]);

    // TRIM 8 MiB of a: a new write of fresh space succeeds.
    nbd_trim(&a, 2 * MIB, 8 * MIB);
    let (after_trim, _) = nbd_fill(&a, 1, filled, false);
    assert!(
        after_trim >= 4 * MIB,
        "only {after_trim} bytes writable after trimming 8 MiB"
    );
    verify(&a, 1, 0, 2 * MIB);
    nbd_script(
        "nbdtool.py",
        [
            "verify",
            &a,
            "--zero",
            "--offset",
            &(2 * MIB).to_string(),
            "--length",
            &(8 * MIB).to_string(),
        ],
    )
    .ok();
    verify(&a, 1, 10 * MIB, filled - 10 * MIB);
    let end = filled + after_trim;

    // Deleting b frees its 8 MiB.
    s.cli(&["volume", "delete", "b"]).ok();
    let (after_delete, _) = nbd_fill(&a, 1, end, false);
    assert!(
        after_delete >= 4 * MIB,
        "only {after_delete} bytes writable after deleting an 8 MiB volume"
    );
    let end = end + after_delete;

    // A restart (after kill -9, the harshest case) opens the full store cleanly.
    s.kill9();
    s.restart();
    let a = s.uri("a");
    verify(&a, 1, 0, 2 * MIB);
    verify(&a, 1, 10 * MIB, end - 10 * MIB);
    let list = s.cli_json(&["volume", "list"]);
    assert!(
        find_volume(&list, "b").is_none(),
        "deleted volume back after restart: {list}"
    );
    // and it still answers ENOSPC rather than failing otherwise
    let (_, enospc3) = nbd_fill(&a, 1, end, false);
    assert!(enospc3 || end >= 38 * MIB, "no ENOSPC after restart");
}
