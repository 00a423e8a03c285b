//! NBD protocol behaviour through libnbd (tests/nbdsh/protocol.py and nbdsh).

mod common;

use std::process::Command;

use common::*;

#[test]
fn nbd_protocol_conformance() {
    let s = Server::start("128M");
    s.create_volume("proto", "32M");
    let out = nbd_script("protocol.py", [s.uri("proto"), (32 * MIB).to_string()]);
    assert!(
        out.status.success(),
        "protocol checks failed:\n{}",
        out.describe()
    );
    assert!(
        out.stdout.contains(" passed, 0 failed"),
        "{}",
        out.describe()
    );
    // The server survived all of that.
    tool("nbdinfo", ["--size", &s.uri("proto")]).ok();
}

#[test]
fn nbdsh_one_liners() {
    let s = Server::start("64M");
    s.create_volume("sh", "16M");
    let uri = s.uri("sh");
    let run = |code: &str| {
        let mut cmd = Command::new(require_tool("nbdsh"));
        cmd.env("PATH", path_for_nbdsh())
            .args(["-u", &uri, "-c", code]);
        run_cmd(&mut cmd, CMD_TIMEOUT)
    };
    run("assert h.can_multi_conn() and h.can_fua() and h.can_flush() and h.can_trim() and h.can_zero() and h.can_cache()").ok();
    run("assert h.get_size() == 16 * 1024 * 1024, h.get_size()").ok();
    run("h.pwrite(b'basalt!!' * 64, 4096, nbd.CMD_FLAG_FUA)\n\
         h.flush()\n\
         assert h.pread(512, 4096) == b'basalt!!' * 64")
    .ok();
    // data persists across connections
    run("assert h.pread(512, 4096) == b'basalt!!' * 64").ok();
    // negative control: a failing assertion makes nbdsh exit non-zero
    let out = run("assert h.pread(512, 4096) == b'nope!!!!' * 64");
    assert_ne!(
        out.code(),
        Some(0),
        "nbdsh should fail:\n{}",
        out.describe()
    );
    // out-of-range read: EINVAL from the server, the connection survives
    run(
        "h.set_strict_mode(0)\n\
         try:\n    h.pread(512, h.get_size())\n    raise SystemExit('read beyond the end succeeded')\n\
         except nbd.Error as e:\n    assert e.errno == 'EINVAL', e\n\
         assert h.pread(8, 4096) == b'basalt!!'",
    )
    .ok();
}
