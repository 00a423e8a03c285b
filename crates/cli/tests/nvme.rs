//! The NVMe/TCP target of the real `basalt server`: a test host built on
//! basalt-nvme-wire discovers the volumes, connects, writes and reads back.

mod common;

#[path = "../../frontend-nvme/tests/common/host.rs"]
mod host;

use basalt_frontend_nvme::subsystem_nqn;
use basalt_nvme_wire::command::{cns, log_id};
use basalt_nvme_wire::fabrics::CNTLID_DYNAMIC;
use basalt_nvme_wire::log_page::DiscoveryLog;
use basalt_nvme_wire::{Digests, Status};
use common::*;
use host::{pattern, Host, HOST_NQN, OTHER_HOST_NQN};
use std::time::Duration;

#[test]
fn nvme_tcp_write_read_verify_through_basalt_server() {
    let mut s = Server::start_with(
        "128M",
        &[
            "--nvme-advertise",
            "198.51.100.1:4420",
            "--nvme-allow-host",
            HOST_NQN,
        ],
    );
    s.create_volume("disk", "32M");
    assert!(s.log().contains("NVMe/TCP listening on"), "{}", s.log());
    let addr = s.nvme_addr();

    // Discovery lists the volume at the advertised address.
    let mut d = Host::discovery(addr, HOST_NQN);
    let page = d.get_log(log_id::DISCOVERY, 0, 2048, 0).ok().data.clone();
    let log = DiscoveryLog::parse(&page).unwrap();
    assert_eq!(log.entries.len(), 1);
    assert_eq!(log.entries[0].subnqn, subsystem_nqn("disk"));
    assert_eq!(log.entries[0].traddr, "198.51.100.1");
    assert_eq!(log.entries[0].trsvcid, "4420");
    drop(d);

    // Write and read back over two I/O queues, with digests.
    let mut admin = Host::admin(addr, Digests::BOTH, "disk", 5000);
    let nguid = admin.identify(cns::NAMESPACE, 1).ok().data[104..120].to_vec();
    let mut q1 = Host::io_queue(addr, Digests::BOTH, &admin, "disk", 1);
    let mut q2 = Host::io_queue(addr, Digests::BOTH, &admin, "disk", 2);
    let big = pattern(256 * 1024, 11);
    let cmd = q1.write_cmd(64, big.clone(), true, false);
    q1.one(cmd).ok();
    q1.write(0, &pattern(4096, 3), false).ok();
    q1.flush().ok();
    assert_eq!(q2.read(64, 64).ok().data, big);
    assert_eq!(q2.read(0, 1).ok().data, pattern(4096, 3));

    // Another host is refused.
    let mut other = Host::connect(addr, Digests::NONE);
    let r = other.connect_queue(
        0,
        31,
        0,
        CNTLID_DYNAMIC,
        &subsystem_nqn("disk"),
        OTHER_HOST_NQN,
    );
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);

    // SIGTERM with hosts connected: a clean stop.
    let status = s.sigterm(Duration::from_secs(30));
    assert!(status.success(), "exit {status:?}\n{}", s.log());
    assert!(s.log().contains("NVMe/TCP target on"), "{}", s.log());
    q1.wait_closed();
    drop((q1, q2, admin));

    // After a restart: same subsystem, same NGUID, the data is there.
    s.restart();
    let addr = s.nvme_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "disk", 5000);
    assert_eq!(
        admin.identify(cns::NAMESPACE, 1).ok().data[104..120],
        nguid[..]
    );
    let mut q1 = Host::io_queue(addr, Digests::NONE, &admin, "disk", 1);
    assert_eq!(q1.read(64, 64).ok().data, big);
}

#[test]
fn nvme_hosts_attached_per_volume() {
    // No --nvme-allow-host: nobody may connect until attached.
    let s = Server::start("64M");
    s.create_volume("a", "16M");
    s.create_volume("b", "16M");
    let addr = s.nvme_addr();
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(0, 31, 0, CNTLID_DYNAMIC, &subsystem_nqn("a"), HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);
    let mut d = Host::discovery(addr, HOST_NQN);
    let page = d.get_log(log_id::DISCOVERY, 0, 1024, 0).ok().data.clone();
    assert_eq!(DiscoveryLog::parse(&page).unwrap().entries.len(), 0);

    let out = s.cli(&["volume", "attach", "a", "--host-nqn", HOST_NQN]);
    assert!(out.ok().contains(&subsystem_nqn("a")), "{}", out.describe());
    let shown = s.cli_json(&["volume", "show", "a"]);
    assert_eq!(shown["nvme_hosts"][0], HOST_NQN, "{shown}");

    // Discovery lists only "a"; connecting to "a" works, to "b" does not.
    let page = d.get_log(log_id::DISCOVERY, 0, 3072, 0).ok().data.clone();
    let log = DiscoveryLog::parse(&page).unwrap();
    let nqns: Vec<_> = log.entries.iter().map(|e| e.subnqn.clone()).collect();
    assert_eq!(nqns, vec![subsystem_nqn("a")]);
    let admin = Host::admin(addr, Digests::NONE, "a", 0);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "a", 1);
    io.write(0, &pattern(4096, 2), false).ok();
    assert_eq!(io.read(0, 1).ok().data, pattern(4096, 2));
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(0, 31, 0, CNTLID_DYNAMIC, &subsystem_nqn("b"), HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);

    // Detach: new connections are refused again.
    s.cli(&["volume", "detach", "a", "--host-nqn", HOST_NQN])
        .ok();
    assert!(s.cli_json(&["volume", "show", "a"])["nvme_hosts"]
        .as_array()
        .is_none_or(|a| a.is_empty()));
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(0, 31, 0, CNTLID_DYNAMIC, &subsystem_nqn("a"), HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);
    // Invalid NQNs are refused by the API.
    let out = s.cli(&["volume", "attach", "a", "--host-nqn", "has space"]);
    assert_ne!(out.code(), Some(0), "{}", out.describe());
}

#[test]
fn a_snapshot_is_a_write_protected_subsystem_for_the_hosts_attached_to_it() {
    // The volume's host list does not reach its snapshots: a snapshot is
    // exported over NVMe/TCP only to the hosts attached to it.
    let s = Server::start("64M");
    s.create_volume("disk", "16M");
    qemu_io(&s.uri("disk"), &["write -P 0x42 0 1M"]).ok();
    s.cli(&["snapshot", "create", "disk", "s1"]).ok();
    qemu_io(&s.uri("disk"), &["write -P 0x43 0 1M"]).ok();
    s.cli(&["volume", "attach", "disk", "--host-nqn", HOST_NQN])
        .ok();
    let addr = s.nvme_addr();
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(
        0,
        31,
        0,
        CNTLID_DYNAMIC,
        &subsystem_nqn("disk@s1"),
        HOST_NQN,
    );
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);
    drop(h);

    let out = s.cli(&["snapshot", "attach", "disk@s1", "--host-nqn", HOST_NQN]);
    assert!(
        out.ok().contains(&subsystem_nqn("disk@s1")),
        "{}",
        out.describe()
    );
    let mut d = Host::discovery(addr, HOST_NQN);
    let page = d.get_log(log_id::DISCOVERY, 0, 3072, 0).ok().data.clone();
    let nqns: Vec<_> = DiscoveryLog::parse(&page)
        .unwrap()
        .entries
        .iter()
        .map(|e| e.subnqn.clone())
        .collect();
    assert_eq!(nqns, vec![subsystem_nqn("disk"), subsystem_nqn("disk@s1")]);
    drop(d);

    let mut admin = Host::admin(addr, Digests::NONE, "disk@s1", 5000);
    let ns = admin.identify(cns::NAMESPACE, 1).ok().data.clone();
    assert_eq!(ns[99] & 1, 1, "NSATTR: write protected");
    let mut q = Host::io_queue(addr, Digests::NONE, &admin, "disk@s1", 1);
    assert_eq!(q.read(0, 256).ok().data, vec![0x42; 1 << 20]);
    let w = q.write(0, &pattern(4096, 1), false);
    assert_eq!(w.status().sc, Status::NAMESPACE_WRITE_PROTECTED.sc);
    assert_eq!(q.read(0, 1).ok().data, vec![0x42; 4096]);

    // Another host is refused; detaching revokes new connections.
    let mut other = Host::connect(addr, Digests::NONE);
    let r = other.connect_queue(
        0,
        31,
        0,
        CNTLID_DYNAMIC,
        &subsystem_nqn("disk@s1"),
        OTHER_HOST_NQN,
    );
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);
    s.cli(&["snapshot", "detach", "disk@s1", "--host-nqn", HOST_NQN])
        .ok();
    let mut again = Host::connect(addr, Digests::NONE);
    let r = again.connect_queue(
        0,
        31,
        0,
        CNTLID_DYNAMIC,
        &subsystem_nqn("disk@s1"),
        HOST_NQN,
    );
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);
}
