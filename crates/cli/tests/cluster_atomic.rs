//! Writes to one replicated volume from two nodes at once that must not
//! lose each other: sub-block writes (a read-modify-write of their 4 KiB
//! block) and SCSI COMPARE AND WRITE, both made atomic by the primary's
//! compare-and-write (`ClientReq::CompareWrite`), whichever nodes the
//! clients reach the volume through.
//!
//! - Two NBD clients on two nodes write the even and the odd 512-byte
//!   sectors of the same blocks, over and over: each, after every write,
//!   reads back its own sectors, which must hold what it wrote last (a
//!   read-modify-write made from a stale read by the other node would
//!   bring an older value back).
//! - Two iSCSI sessions on two nodes count to 2N in one block with
//!   COMPARE AND WRITE (read, then compare-and-write the next number,
//!   again on a miscompare): every increment counts once, as VMware's ATS
//!   locking relies on. The initiator is the one `basalt-frontend-iscsi`'s
//!   tests are written with.
//! - libiscsi's COMPARE AND WRITE tests (`iscsi-test-cu`), their multipath
//!   ones with one session on each of two nodes, neither holding a replica
//!   of the volume.

mod common;
#[path = "../../frontend-iscsi/tests/common/initiator/mod.rs"]
mod initiator;
#[path = "../../frontend-iscsi/tests/common/scsi.rs"]
mod scsi;

use basalt_nbd_client::{ClientError, Endpoint, NbdClient, WriteOp};
use common::cluster::{healthy, node_index, node_names, Cluster};
use common::*;
use std::process::Command;
use std::sync::Arc;
use std::sync::Barrier;
use std::time::Duration;

const SECTOR: usize = 512;
/// Blocks both writers share.
const BLOCKS: u64 = 4;
const ROUNDS: u32 = 150;

fn connect(c: &Cluster, node: usize, volume: &str) -> NbdClient {
    let (endpoint, _) = Endpoint::parse_uri(&c.nodes[node].uri(volume)).unwrap();
    NbdClient::connect(&endpoint, volume).unwrap_or_else(|e| panic!("NBD {volume}: {e}"))
}

fn write(client: &mut NbdClient, offset: u64, data: Vec<u8>) {
    let op = Ok::<_, ClientError>(WriteOp::Data { offset, data });
    client
        .write_pipelined(std::iter::once(op), 1)
        .unwrap_or_else(|e| panic!("write at {offset}: {e}"));
}

fn read(client: &mut NbdClient, offset: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    client
        .read_pipelined::<ClientError>(std::iter::once((offset, len)), 1, |_, bytes| {
            out.extend_from_slice(&bytes);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("read at {offset}: {e}"));
    out
}

/// The sector `writer` (0: even sectors, 1: odd) writes in `round`.
fn sector(writer: usize, round: u32) -> Vec<u8> {
    let mut s = vec![b'a' + writer as u8; SECTOR];
    s[..4].copy_from_slice(&round.to_le_bytes());
    s
}

/// Which writer's round a sector holds, as far as it tells.
fn describe(s: &[u8]) -> String {
    match s.get(4) {
        Some(&w @ (b'a' | b'b')) => format!(
            "round {} of writer {}",
            u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
            w - b'a'
        ),
        _ if s.iter().all(|&b| b == 0) => "zeros".into(),
        _ => "neither writer's data".into(),
    }
}

#[test]
fn sub_block_writes_from_two_nodes_lose_nothing() {
    let c = Cluster::start(3, &[]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "halves",
            "--size",
            "16M",
            "--replicas",
            "2",
        ])
        .ok();
    c.wait_volume(0, "halves", "placed and in sync", healthy);
    let start = Arc::new(Barrier::new(2));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let mut client = connect(&c, w, "halves");
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for round in 1..=ROUNDS {
                    for block in 0..BLOCKS {
                        for k in (w..8).step_by(2) {
                            let at = block * 4096 + (k * SECTOR) as u64;
                            write(&mut client, at, sector(w, round));
                        }
                    }
                    let got = read(&mut client, 0, (BLOCKS * 4096) as u32);
                    for (i, s) in got.chunks(SECTOR).enumerate() {
                        if i % 2 == w && s != sector(w, round) {
                            return Err(format!(
                                "writer {w} round {round}: sector {i} reads {}",
                                describe(s)
                            ));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for w in writers {
        if let Err(e) = w.join().expect("writer thread") {
            panic!("{e}\n{}", c.logs());
        }
    }
    let got = read(&mut connect(&c, 2, "halves"), 0, (BLOCKS * 4096) as u32);
    for (i, s) in got.chunks(SECTOR).enumerate() {
        assert_eq!(
            s,
            sector(i % 2, ROUNDS),
            "sector {i} through the third node"
        );
    }
}

/// COMPARE AND WRITE of `blocks` 512-byte blocks at `lba`.
fn compare_and_write(lba: u64, blocks: u8) -> Vec<u8> {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = blocks;
    cdb
}

/// `n` nodes that let `initiators` log in over iSCSI, and an RF2 volume
/// `ats` of 64 MiB on them, in sync (with its `volume show`).
fn iscsi_cluster(n: usize, initiators: &[&str]) -> (Cluster, serde_json::Value) {
    let c = Cluster::start_with(n, &[], |_| {
        initiators
            .iter()
            .flat_map(|i| ["--iscsi-allow-initiator".to_string(), i.to_string()])
            .collect()
    });
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "ats",
            "--size",
            "64M",
            "--replicas",
            "2",
        ])
        .ok();
    let v = c.wait_volume(0, "ats", "placed and in sync", healthy);
    (c, v)
}

/// Increments per iSCSI session.
const INCREMENTS: u64 = 100;

#[test]
fn compare_and_write_from_two_nodes_counts_every_increment_once() {
    use initiator::{Command as Scsi, Initiator, LoginOptions};
    let hosts = ["iqn.2026-11.io.test:host0", "iqn.2026-11.io.test:host1"];
    let (c, _) = iscsi_cluster(3, &hosts);
    let target = basalt_volume::iscsi_target_name("ats");
    let start = Arc::new(Barrier::new(2));
    let sessions: Vec<_> = (0..2)
        .map(|w| {
            let mut opts = LoginOptions::new(hosts[w], &target);
            opts.isid[5] = w as u8 + 1;
            let mut s = Initiator::login(c.nodes[w].iscsi_addr(), &opts)
                .unwrap_or_else(|r| panic!("login to node{w}: {r:?}"));
            // The new session's unit attention (power on, reset).
            s.test_unit_ready();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let (mut wins, mut misses) = (0, 0);
                while wins < INCREMENTS {
                    let current = s.read(0, 1).ok().data.clone();
                    let count = u64::from_le_bytes(current[..8].try_into().unwrap());
                    let mut next = vec![0u8; 512];
                    next[..8].copy_from_slice(&(count + 1).to_le_bytes());
                    next[8] = w as u8;
                    let outcome = s.one(Scsi::write(
                        compare_and_write(0, 1),
                        [current, next].concat(),
                    ));
                    if outcome.status == scsi::STATUS_GOOD {
                        wins += 1;
                    } else {
                        // MISCOMPARE: the other session counted first.
                        outcome.check(0x0e, 0x1d, 0x00);
                        misses += 1;
                    }
                }
                misses
            })
        })
        .collect();
    let misses: Vec<u64> = sessions
        .into_iter()
        .map(|t| t.join().expect("session thread"))
        .collect();
    let opts = LoginOptions::new(hosts[0], &target);
    let mut third = Initiator::login(c.nodes[2].iscsi_addr(), &opts).expect("login to node2");
    third.test_unit_ready();
    let block = third.read(0, 1).ok().data.clone();
    let count = u64::from_le_bytes(block[..8].try_into().unwrap());
    eprintln!("counted to {count}; miscompares per session: {misses:?}");
    assert_eq!(count, 2 * INCREMENTS, "{}", c.logs());
}

#[test]
fn compare_and_write_through_nodes_without_a_replica() {
    let suite = require_tool("iscsi-test-cu");
    let initiators = [
        "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
        "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2",
    ];
    let (c, v) = iscsi_cluster(4, &initiators);
    let holders: Vec<usize> = node_names(&v).iter().map(|n| node_index(n)).collect();
    let others: Vec<usize> = (0..4).filter(|i| !holders.contains(i)).collect();
    let url = |i: usize| {
        format!(
            "iscsi://{}/{}/0",
            c.nodes[i].iscsi_addr(),
            basalt_volume::iscsi_target_name("ats")
        )
    };
    let out = run_cmd(
        Command::new(&suite).args([
            "-n",
            "-d",
            "-t",
            "ALL.CompareAndWrite",
            &url(others[0]),
            &url(others[1]),
        ]),
        Duration::from_secs(300),
    );
    let multipath = run_cmd(
        Command::new(&suite).args([
            "-n",
            "-d",
            "-t",
            "ALL.MultipathIO.CompareAndWrite*",
            &url(others[0]),
            &url(others[1]),
        ]),
        Duration::from_secs(300),
    );
    for out in [out, multipath] {
        let run = iscsi_suite_run(&out);
        assert!(
            run.ran > 0
                && run.failed == 0
                && run.passed == run.ran
                && !run.log.contains("[SKIPPED]"),
            "{}\n{}\n{}",
            run.summary,
            run.log,
            c.logs()
        );
        eprintln!("{}", run.summary);
    }
}
