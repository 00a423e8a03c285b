//! The NVMe/TCP target driven by a test host (built on basalt-nvme-wire)
//! over real TCP sockets, against a store on a simulated device.

mod common;

use basalt_frontend_nvme::{
    cluster_cntlid_range, subsystem_nqn, NvmeServer, PathState, TargetConfig, FIRMWARE_REVISION,
    MODEL,
};
use basalt_nvme_wire::command::{async_event, cns, feature_id, log_id};
use basalt_nvme_wire::fabrics::{CNTLID_DYNAMIC, DISCOVERY_NQN};
use basalt_nvme_wire::log_page::{DiscoveryLog, SMART_LOG_LEN};
use basalt_nvme_wire::pdu::Fes;
use basalt_nvme_wire::properties::{offset, Cap, Csts, PropertySize, Vs};
use basalt_nvme_wire::{Digests, Sqe, Status};
use common::*;
use std::time::Duration;

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

#[test]
fn full_connect_sequence_and_identify() {
    let (server, subs) = target_with(&[("vol0", 64 * MIB)]);
    let addr = server.local_addr();
    let mut h = Host::connect(addr, Digests::NONE);
    let c = h
        .connect_queue(
            0,
            31,
            5000,
            CNTLID_DYNAMIC,
            &subsystem_nqn("vol0"),
            HOST_NQN,
        )
        .ok()
        .clone();
    let cntlid = c.cqe.dw0 as u16;
    assert!((1..=0xffef).contains(&cntlid));

    let cap = Cap::from_u64(h.prop_get(offset::CAP, PropertySize::Eight));
    assert_eq!(cap.mqes, 127);
    assert_ne!(cap.css & Cap::CSS_NVM, 0);
    let vs = Vs::from_u32(h.prop_get(offset::VS, PropertySize::Four) as u32);
    assert!(vs >= Vs::V1_3);
    let csts = Csts::from_u32(h.prop_get(offset::CSTS, PropertySize::Four) as u32);
    assert!(!csts.rdy);
    // Admin commands before CC.EN are a sequence error.
    assert_eq!(
        h.identify(cns::CONTROLLER, 0).status().sc,
        Status::COMMAND_SEQUENCE_ERROR.sc
    );
    h.enable();

    // Identify Controller.
    let id = h.identify(cns::CONTROLLER, 0).ok().data.clone();
    assert_eq!(le16(&id, 78), cntlid, "CNTLID equals Connect's");
    assert_eq!(text(&id[24..64]), MODEL);
    assert_eq!(text(&id[64..72]), FIRMWARE_REVISION);
    assert_eq!(text(&id[768..1024]), subsystem_nqn("vol0"));
    assert!(!text(&id[4..24]).is_empty(), "serial number");
    assert_eq!(le16(&id, 1800), 0, "ICDOFF");
    assert_eq!(id[111], 1, "I/O controller");
    assert_eq!(id[261] & 0x02, 0, "no commands effects log advertised");
    assert_eq!(le32(&id, 516), 1, "NN");
    let ioccsz = le32(&id, 1792);
    assert_eq!(ioccsz, (64 + 8192) / 16);

    // Identify Namespace: 64 MiB of 4 KiB blocks, NGUID = volume UUID.
    let volume_id = subs.id_of("vol0");
    let ns = h.identify(cns::NAMESPACE, 1).ok().data.clone();
    assert_eq!(le64(&ns, 0), 64 * MIB / 4096);
    assert_eq!(ns[128 + 2], 12, "4 KiB LBA format");
    assert_eq!(le32(&ns, 92), 1, "ANA group");
    let nguid: [u8; 16] = ns[104..120].try_into().unwrap();
    assert_eq!(&nguid, volume_id.as_bytes());
    assert_eq!(
        h.identify(cns::NAMESPACE, 2).status().sc,
        Status::INVALID_NAMESPACE.sc
    );

    // Active namespace list.
    let list = h.identify(cns::ACTIVE_NAMESPACES, 0).ok().data.clone();
    assert_eq!(le32(&list, 0), 1);
    assert_eq!(le32(&list, 4), 0);
    let list = h.identify(cns::ACTIVE_NAMESPACES, 1).ok().data.clone();
    assert_eq!(le32(&list, 0), 0);

    // Descriptors: NGUID then UUID, both the volume's UUID.
    let d = h
        .identify(cns::NAMESPACE_ID_DESCRIPTORS, 1)
        .ok()
        .data
        .clone();
    assert_eq!((d[0], d[1]), (2, 16));
    assert_eq!(&d[4..20], &nguid);
    assert_eq!((d[20], d[21]), (3, 16));
    assert_eq!(&d[24..40], &nguid);

    // Number of queues: asked 8, granted 8 (0's based in both directions).
    let q = h.set_features(feature_id::NUMBER_OF_QUEUES, (7 << 16) | 7);
    assert_eq!(q.ok().cqe.dw0, (7 << 16) | 7);
    h.set_features(feature_id::ASYNC_EVENT_CONFIG, 1 << 8).ok();

    // Log pages: error, SMART, ANA (one optimized group with NSID 1),
    // changed namespaces (none).
    h.get_log(log_id::ERROR_INFORMATION, 0xffff_ffff, 64, 0)
        .ok();
    let smart = h.get_log(log_id::SMART_HEALTH, 0xffff_ffff, SMART_LOG_LEN as u32, 0);
    assert_eq!(smart.ok().data[3], 100, "available spare");
    let ana = h
        .get_log(log_id::ASYMMETRIC_NAMESPACE_ACCESS, 0, 4096, 0)
        .ok()
        .data
        .clone();
    assert_eq!(le16(&ana, 8), 1, "one group");
    assert_eq!(le32(&ana, 16), 1, "group id");
    assert_eq!(le32(&ana, 16 + 4), 1, "one namespace");
    assert_eq!(ana[16 + 16], 0x01, "optimized");
    assert_eq!(le32(&ana, 16 + 32), 1, "NSID 1");
    let changed = h
        .get_log(log_id::CHANGED_NAMESPACES, 0, 4096, 0)
        .ok()
        .data
        .clone();
    assert_eq!(le32(&changed, 0), 0);
    assert_eq!(
        h.get_log(0x05, 0, 4096, 0).status().sc,
        Status::INVALID_LOG_PAGE.sc
    );
    h.keep_alive().ok();

    // I/O queue.
    let mut io = Host::io_queue(addr, Digests::NONE, &h, "vol0", 1);
    io.write(0, &pattern(4096, 1), false).ok();
    assert_eq!(io.read(0, 1).ok().data, pattern(4096, 1));
    assert_eq!(server.controllers(), 1);
    assert_eq!(subs.open_handles("vol0"), 1);

    // A second I/O queue with the same QID is refused.
    let mut dup = Host::connect(addr, Digests::NONE);
    let r = dup.connect_queue(1, 31, 0, h.cntlid, &subsystem_nqn("vol0"), HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_PARAMETERS.sc);
    // So is a different host NQN and an unknown controller.
    let mut other = Host::connect(addr, Digests::NONE);
    let r = other.connect_queue(2, 31, 0, h.cntlid, &subsystem_nqn("vol0"), OTHER_HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_PARAMETERS.sc);
    assert_eq!(
        r.cqe.dw0,
        (1 << 16) | 512,
        "names HOSTNQN in the connect data"
    );
    let r = other.connect_queue(2, 31, 0, 0x7777, &subsystem_nqn("vol0"), HOST_NQN);
    assert_eq!(r.cqe.dw0, (1 << 16) | 16, "names CNTLID");

    // Shutdown notification completes.
    let cc = h.prop_get(offset::CC, PropertySize::Four);
    h.prop_set(offset::CC, cc | (1 << 14));
    let csts = Csts::from_u32(h.prop_get(offset::CSTS, PropertySize::Four) as u32);
    assert_eq!(csts.shst, 2);

    // Closing the admin queue tears the controller and its I/O queues down.
    drop(h);
    io.wait_closed();
    eventually("controller removed", || server.controllers() == 0);
    eventually("volume closed", || subs.open_handles("vol0") == 0);
    server.shutdown();
}

fn data_path(digests: Digests) {
    data_path_on(target_with(&[("v", 64 * MIB)]).0, digests);
}

fn data_path_on(server: NvmeServer, digests: Digests) {
    let addr = server.local_addr();
    let admin = Host::admin(addr, digests, "v", 0);
    let mut io = Host::io_queue(addr, digests, &admin, "v", 1);

    // In-capsule write (8 KiB fits the capsule).
    let small = pattern(8192, 3);
    let cmd = io.write_cmd(10, small.clone(), false, true);
    let d = io.one(cmd);
    d.ok();
    assert_eq!(d.r2ts, 0);
    // R2T write larger than in-capsule and than MAXH2CDATA (32 KiB).
    let big = pattern(512 * 1024, 9);
    let cmd = io.write_cmd(100, big.clone(), false, false);
    let d = io.one(cmd);
    d.ok();
    assert_eq!(d.r2ts, 1);
    assert_eq!(d.h2c_pdus, 16, "512 KiB in 32 KiB H2CData PDUs");
    // Multi-PDU reads.
    let d = io.read(100, 128);
    assert_eq!(d.ok().data, big);
    assert_eq!(d.c2h_pdus, 16);
    assert_eq!(io.read(10, 2).ok().data, small);
    // The largest transfer (MDTS: 1 MiB) works, one block more does not.
    let huge = pattern(1024 * 1024, 5);
    let cmd = io.write_cmd(1000, huge.clone(), true, false);
    io.one(cmd).ok();
    assert_eq!(io.read(1000, 256).ok().data, huge);
    let d = io.read(1000, 257);
    assert_eq!(d.status().sc, Status::INVALID_FIELD.sc);
    assert!(d.status().dnr);
    server.shutdown();
}

#[test]
fn data_path_without_digests() {
    data_path(Digests::NONE);
}

#[test]
fn data_path_with_header_and_data_digests() {
    data_path(Digests::BOTH);
}

#[test]
fn data_path_on_queue_threads() {
    // I/O queues of replicated volumes, or a target without event loops.
    let (server, _subs) = target_with_limits(&[("v", 64 * MIB)], thread_limits());
    data_path_on(server, Digests::BOTH);
}

#[test]
fn data_path_on_a_file_store() {
    // The event loop runs the device I/O on its ring.
    let dir = tempfile::tempdir().expect("tempdir");
    data_path_on(file_target(dir.path(), &[("v", 64 * MIB)]), Digests::BOTH);
}

#[test]
fn data_path_with_header_digest_only() {
    data_path(Digests {
        header: true,
        data: false,
    });
}

#[test]
fn flush_fua_write_zeroes_and_deallocate() {
    let (server, _subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let admin = Host::admin(addr, Digests::NONE, "v", 0);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    let data = pattern(64 * 1024, 7);
    let cmd = io.write_cmd(0, data.clone(), true, false);
    io.one(cmd).ok();
    io.flush().ok();
    assert_eq!(io.read(0, 16).ok().data, data);

    // Write Zeroes without and with deallocate.
    io.write_zeroes(2, 2, false).ok();
    io.write_zeroes(8, 4, true).ok();
    let back = io.read(0, 16).ok().data.clone();
    let mut want = data.clone();
    want[2 * 4096..4 * 4096].fill(0);
    want[8 * 4096..12 * 4096].fill(0);
    assert_eq!(back, want);

    // Dataset Management deallocate of two ranges.
    io.write(100, &pattern(8192, 1), false).ok();
    io.write(200, &pattern(8192, 2), false).ok();
    io.deallocate(&[(100, 2), (200, 1)]).ok();
    assert_eq!(io.read(100, 2).ok().data, vec![0u8; 8192]);
    assert_eq!(io.read(200, 2).ok().data[..4096], vec![0u8; 4096][..]);
    assert_eq!(io.read(200, 2).ok().data[4096..], pattern(8192, 2)[4096..]);

    // Out of range.
    let blocks = 16 * MIB / 4096;
    assert_eq!(
        io.write_zeroes(blocks - 1, 2, false).status().sc,
        Status::LBA_OUT_OF_RANGE.sc
    );
    assert_eq!(
        io.deallocate(&[(blocks, 1)]).status().sc,
        Status::LBA_OUT_OF_RANGE.sc
    );
    server.shutdown();
}

#[test]
fn error_statuses() {
    let (server, _subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    let blocks = 16 * MIB / 4096;

    let d = io.read(blocks - 1, 2);
    assert_eq!(d.status().sc, Status::LBA_OUT_OF_RANGE.sc);
    assert!(d.status().dnr);
    let d = io.read(u64::MAX, 1);
    assert_eq!(d.status().sc, Status::LBA_OUT_OF_RANGE.sc);
    // In-capsule and R2T writes beyond the end (the R2T one is refused
    // without asking for its data).
    assert_eq!(
        io.write(blocks, &pattern(4096, 0), false).status().sc,
        Status::LBA_OUT_OF_RANGE.sc
    );
    let cmd = io.write_cmd(blocks - 4, pattern(64 * 1024, 0), false, false);
    let d = io.one(cmd);
    assert_eq!(d.status().sc, Status::LBA_OUT_OF_RANGE.sc);
    assert_eq!(d.r2ts, 0);

    // Invalid opcodes on both queues.
    let cid = io.cid();
    let mut sqe = Sqe::new(0x7e, cid);
    sqe.nsid = 1;
    assert_eq!(io.simple(sqe).status().sc, Status::INVALID_OPCODE.sc);
    let cid = admin.cid();
    assert_eq!(
        admin.simple(Sqe::new(0x80, cid)).status().sc,
        Status::INVALID_OPCODE.sc
    );
    // Wrong namespace.
    let mut cmd = io.read_cmd(0, 1);
    cmd.sqe.nsid = 2;
    assert_eq!(io.one(cmd).status().sc, Status::INVALID_NAMESPACE.sc);
    // SGL length that does not match the block count.
    let mut cmd = io.read_cmd(0, 2);
    cmd.sqe
        .set_sgl(&basalt_nvme_wire::SglDescriptor::transport(4096));
    cmd.read_len = 4096;
    assert_eq!(io.one(cmd).status().sc, Status::DATA_SGL_LENGTH_INVALID.sc);
    // In-capsule data larger than the block count says.
    let mut cmd = io.write_cmd(0, pattern(8192, 0), false, true);
    cmd.sqe.cdw12 = 0;
    assert_eq!(io.one(cmd).status().sc, Status::DATA_SGL_LENGTH_INVALID.sc);
    // An unknown SGL descriptor type.
    let mut cmd = io.read_cmd(0, 1);
    let mut sgl = basalt_nvme_wire::SglDescriptor::transport(4096);
    sgl.id = 0x20;
    cmd.sqe.set_sgl(&sgl);
    assert_eq!(
        io.one(cmd).status().sc,
        Status::SGL_DESCRIPTOR_TYPE_INVALID.sc
    );
    // Unknown feature and log page.
    assert_eq!(
        admin.set_features(0x7d, 0).status().sc,
        Status::INVALID_FIELD.sc
    );
    // The queue still works.
    io.write(0, &pattern(4096, 4), false).ok();
    assert_eq!(io.read(0, 1).ok().data, pattern(4096, 4));
    server.shutdown();
}

#[test]
fn several_io_queues_with_concurrent_commands() {
    several_io_queues(target_with(&[("v", 64 * MIB)]).0);
}

#[test]
fn several_io_queues_on_queue_threads() {
    several_io_queues(target_with_limits(&[("v", 64 * MIB)], thread_limits()).0);
}

#[test]
fn several_io_queues_on_a_file_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    several_io_queues(file_target(dir.path(), &[("v", 64 * MIB)]));
}

/// The same on a replicated volume's kind of data path: writes completed
/// (and their CapsuleResp sent) by the threads that finish them.
#[test]
fn several_io_queues_on_a_relayed_volume() {
    let (server, subsystems) = target_with(&[("v", 64 * MIB)]);
    subsystems
        .relay_delay_us
        .store(300, std::sync::atomic::Ordering::Relaxed);
    several_io_queues(server);
}

fn several_io_queues(server: NvmeServer) {
    let addr = server.local_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    admin
        .set_features(feature_id::NUMBER_OF_QUEUES, (3 << 16) | 3)
        .ok();
    let queues: Vec<Host> = (1..=4)
        .map(|qid| Host::io_queue(addr, Digests::BOTH, &admin, "v", qid))
        .collect();
    // A fifth queue exceeds what was granted.
    let mut extra = Host::connect(addr, Digests::NONE);
    let r = extra.connect_queue(5, 31, 0, admin.cntlid, &subsystem_nqn("v"), HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_PARAMETERS.sc);

    let threads: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(q, mut io)| {
            std::thread::spawn(move || {
                let base = q as u64 * 2048;
                for round in 0..5u8 {
                    // 32 commands in flight: small in-capsule writes and
                    // R2T writes of different sizes.
                    let mut cmds = Vec::new();
                    let mut expect = Vec::new();
                    for i in 0..32u64 {
                        let len = if i % 3 == 0 {
                            4096
                        } else {
                            4096 * (1 + i as usize % 9)
                        };
                        let lba = base + i * 16;
                        let data = pattern(len, round.wrapping_add(i as u8).wrapping_add(q as u8));
                        cmds.push(io.write_cmd(lba, data.clone(), i % 5 == 0, len <= 8192));
                        expect.push((lba, data));
                    }
                    for d in io.run(cmds) {
                        d.ok();
                    }
                    let cmds: Vec<_> = expect
                        .iter()
                        .map(|(lba, data)| io.read_cmd(*lba, (data.len() / 4096) as u32))
                        .collect();
                    for (d, (_, data)) in io.run(cmds).iter().zip(&expect) {
                        assert_eq!(&d.ok().data, data);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    server.shutdown();
}

#[test]
fn malformed_pdu_ends_only_that_connection() {
    let (server, _subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let admin = Host::admin(addr, Digests::NONE, "v", 0);
    let mut good = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    let mut bad = Host::io_queue(addr, Digests::NONE, &admin, "v", 2);
    // A CapsuleCmd with a wrong HLEN.
    let mut pdu = vec![0x04, 0, 40, 0];
    pdu.extend_from_slice(&72u32.to_le_bytes());
    pdu.extend_from_slice(&[0u8; 64]);
    bad.send_raw(&pdu);
    let got = bad.wait_closed();
    match got.last() {
        Some(HostPdu::TermReq { fes, fei }) => {
            assert_eq!(*fes, Fes::InvalidHeaderField.code());
            assert_eq!(*fei, 2, "HLEN is at byte 2");
        }
        other => panic!("expected a C2HTermReq, got {other:?}"),
    }
    // An H2CData for a transfer that was never requested.
    let mut bad2 = Host::io_queue(addr, Digests::NONE, &admin, "v", 3);
    let mut out = Vec::new();
    basalt_nvme_wire::H2CData {
        cccid: 9,
        ttag: 9,
        datao: 0,
        last: true,
        data: &[1u8; 512],
    }
    .encode(&bad2.negotiated, &mut out)
    .unwrap();
    bad2.send_raw(&out);
    assert!(matches!(
        bad2.wait_closed().last(),
        Some(HostPdu::TermReq { .. })
    ));
    // A PDU before ICReq: garbage on a fresh connection.
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    raw.write_all(&[0xff; 8]).unwrap();
    let mut sink = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = raw.read_to_end(&mut sink);
    assert_eq!(sink.first(), Some(&0x03), "C2HTermReq");

    // The other queue and the controller carry on.
    good.write(5, &pattern(4096, 5), false).ok();
    assert_eq!(good.read(5, 1).ok().data, pattern(4096, 5));
    assert_eq!(server.controllers(), 1);
    server.shutdown();
}

#[test]
fn data_digest_error_fails_only_the_command() {
    let (server, _subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let admin = Host::admin(addr, Digests::BOTH, "v", 0);
    let mut io = Host::io_queue(addr, Digests::BOTH, &admin, "v", 1);
    let cmd = io.write_cmd(0, pattern(4096, 1), false, true);
    let mut out = Vec::new();
    basalt_nvme_wire::CapsuleCmd {
        sqe: {
            let mut s = cmd.sqe;
            s.set_sgl(&basalt_nvme_wire::SglDescriptor::in_capsule(0, 4096));
            s
        },
        data: &cmd.write,
    }
    .encode(&io.negotiated, &mut out)
    .unwrap();
    let n = out.len();
    out[n - 1] ^= 0xff; // corrupt the data digest
    io.send_raw(&out);
    match io.recv() {
        HostPdu::Resp(cqe) => {
            assert_eq!(cqe.cid, cmd.sqe.cid);
            assert_eq!(cqe.status.sc, Status::TRANSIENT_TRANSPORT_ERROR.sc);
        }
        other => panic!("expected a completion, got {other:?}"),
    }
    // Nothing was written; the connection still works.
    assert_eq!(io.read(0, 1).ok().data, vec![0u8; 4096]);
    server.shutdown();
}

#[test]
fn keep_alive_timeout_tears_the_controller_down() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    // KATO 600 ms, kept alive for a while, then silent.
    let mut admin = Host::admin(addr, Digests::NONE, "v", 600);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(200));
        admin.keep_alive().ok();
    }
    assert_eq!(server.controllers(), 1, "kept alive");
    io.write(0, &pattern(4096, 1), false).ok();
    let start = std::time::Instant::now();
    admin.wait_closed();
    io.wait_closed();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(400),
        "closed too early: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(5),
        "closed too late: {waited:?}"
    );
    eventually("controller removed", || server.controllers() == 0);
    eventually("volume closed", || subs.open_handles("v") == 0);
    server.shutdown();
}

#[test]
fn discovery_lists_allowed_subsystems_at_the_advertised_address() {
    let (server, _subs) = target_with(&[("alpha", 16 * MIB), ("beta", 16 * MIB)]);
    let addr = server.local_addr();
    let mut d = Host::discovery(addr, HOST_NQN);
    let id = d.identify(cns::CONTROLLER, 0).ok().data.clone();
    assert_eq!(id[111], 2, "discovery controller");
    assert_eq!(text(&id[768..1024]), DISCOVERY_NQN);
    assert_eq!(le16(&id, 78), d.cntlid);
    // Header first (as nvme-cli does), then the whole page.
    let head = d.get_log(log_id::DISCOVERY, 0, 1024, 0).ok().data.clone();
    let numrec = le64(&head, 8);
    assert_eq!(numrec, 2);
    let full = d
        .get_log(log_id::DISCOVERY, 0, 1024 * (1 + numrec as u32), 0)
        .ok()
        .data
        .clone();
    let log = DiscoveryLog::parse(&full).unwrap();
    assert_eq!(le64(&head, 0), log.genctr);
    let nqns: Vec<_> = log.entries.iter().map(|e| e.subnqn.clone()).collect();
    assert_eq!(nqns, vec![subsystem_nqn("alpha"), subsystem_nqn("beta")]);
    for e in &log.entries {
        assert_eq!(e.traddr, "192.0.2.7");
        assert_eq!(e.trsvcid, "4420");
        assert_eq!(e.trtype, 3, "TCP");
        assert_eq!(e.adrfam, 1, "IPv4");
        assert_eq!(e.subtype, 2, "NVM subsystem");
    }
    // A window at an offset.
    let second = d
        .get_log(log_id::DISCOVERY, 0, 1024, 2048)
        .ok()
        .data
        .clone();
    assert_eq!(&second[..], &full[2048..3072]);
    // I/O commands and I/O queues are not for discovery controllers.
    assert_eq!(
        d.identify(cns::NAMESPACE, 1).status().sc,
        Status::INVALID_FIELD.sc
    );
    // A host that is not allowed sees nothing.
    let mut other = Host::discovery(addr, OTHER_HOST_NQN);
    let head = other
        .get_log(log_id::DISCOVERY, 0, 1024, 0)
        .ok()
        .data
        .clone();
    assert_eq!(le64(&head, 8), 0);
    server.shutdown();
}

#[test]
fn host_not_allowed_is_refused() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(
        0,
        31,
        0,
        CNTLID_DYNAMIC,
        &subsystem_nqn("v"),
        OTHER_HOST_NQN,
    );
    assert_eq!(r.status().sct, Status::CONNECT_INVALID_HOST.sct);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_HOST.sc);
    assert_eq!(server.controllers(), 0);
    assert_eq!(subs.open_handles("v"), 0);
    // Unknown subsystems are invalid parameters naming SUBNQN.
    let r = h.connect_queue(0, 31, 0, CNTLID_DYNAMIC, &subsystem_nqn("nope"), HOST_NQN);
    assert_eq!(r.status().sc, Status::CONNECT_INVALID_PARAMETERS.sc);
    assert_eq!(r.cqe.dw0, (1 << 16) | 256);
    let r = h.connect_queue(
        0,
        31,
        0,
        CNTLID_DYNAMIC,
        "nqn.2000-01.com.example:x",
        HOST_NQN,
    );
    assert_eq!(r.cqe.dw0, (1 << 16) | 256);
    // Queue size beyond MQES.
    let r = h.connect_queue(0, 1000, 0, CNTLID_DYNAMIC, &subsystem_nqn("v"), HOST_NQN);
    assert_eq!(r.cqe.dw0, 44);
    // Commands before Connect.
    let cid = h.cid();
    let mut sqe = Sqe::new(basalt_nvme_wire::command::io_opcode::READ, cid);
    sqe.nsid = 1;
    assert_eq!(h.simple(sqe).status().sc, Status::COMMAND_SEQUENCE_ERROR.sc);
    server.shutdown();
}

#[test]
fn resize_completes_an_async_event_request() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    admin
        .set_features(feature_id::ASYNC_EVENT_CONFIG, 1 << 8)
        .ok();
    let cid = admin.cid();
    let aer = Sqe::new(
        basalt_nvme_wire::command::admin_opcode::ASYNC_EVENT_REQUEST,
        cid,
    );
    let mut out = Vec::new();
    basalt_nvme_wire::CapsuleCmd {
        sqe: aer,
        data: &[],
    }
    .encode(&admin.negotiated, &mut out)
    .unwrap();
    admin.send_raw(&out);
    // Held: a keep alive completes first.
    admin.keep_alive().ok();
    subs.resize("v", 32 * MIB);
    match admin.recv() {
        HostPdu::Resp(cqe) => {
            assert_eq!(cqe.cid, cid);
            assert!(cqe.status.is_success());
            assert_eq!(cqe.dw0 & 7, u32::from(async_event::TYPE_NOTICE));
            assert_eq!((cqe.dw0 >> 8) & 0xff, 0);
            assert_eq!(
                (cqe.dw0 >> 16) & 0xff,
                u32::from(log_id::CHANGED_NAMESPACES)
            );
        }
        other => panic!("expected the AER completion, got {other:?}"),
    }
    let changed = admin
        .get_log(log_id::CHANGED_NAMESPACES, 0, 4096, 0)
        .ok()
        .data
        .clone();
    assert_eq!(le32(&changed, 0), 1);
    let changed = admin
        .get_log(log_id::CHANGED_NAMESPACES, 0, 4096, 0)
        .ok()
        .data
        .clone();
    assert_eq!(le32(&changed, 0), 0, "reading clears the list");
    let ns = admin.identify(cns::NAMESPACE, 1).ok().data.clone();
    assert_eq!(le64(&ns, 0), 32 * MIB / 4096);
    // The new blocks are usable.
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    io.write(32 * MIB / 4096 - 1, &pattern(4096, 8), true).ok();
    server.shutdown();
}

#[test]
fn disconnecting_a_volume_tears_down_its_controllers_only() {
    use basalt_volume::ClientDisconnect;
    let (server, subs) = target_with(&[("v", 16 * MIB), ("w", 16 * MIB)]);
    let addr = server.local_addr();
    let admin_v = Host::admin(addr, Digests::NONE, "v", 0);
    let mut io_v = Host::io_queue(addr, Digests::NONE, &admin_v, "v", 1);
    let admin_w = Host::admin(addr, Digests::NONE, "w", 0);
    let mut io_w = Host::io_queue(addr, Digests::NONE, &admin_w, "w", 1);
    io_v.write(0, &pattern(4096, 1), true).ok();
    io_w.write(0, &pattern(4096, 2), true).ok();
    assert_eq!(server.disconnector().disconnect("v"), 1);
    io_v.wait_closed();
    eventually("v closed", || subs.open_handles("v") == 0);
    // Even with KATO 0 (no keep-alive), w's host is untouched.
    io_w.write(1, &pattern(4096, 3), true).ok();
    assert_eq!(server.controllers(), 1);
    assert_eq!(server.disconnector().disconnect("v"), 0);
    server.shutdown();
}

#[test]
fn shutdown_closes_connections_and_ends_threads() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let admin = Host::admin(addr, Digests::NONE, "v", 0);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    io.write(0, &pattern(4096, 1), true).ok();
    assert_eq!(server.connections(), 2);
    server.shutdown();
    io.wait_closed();
    assert_eq!(subs.open_handles("v"), 0);
}

#[test]
fn idle_connections_and_connection_count_are_bounded() {
    let limits = basalt_frontend_nvme::ServerLimits {
        max_connections: 2,
        connect_timeout: Duration::from_millis(300),
        ..test_limits()
    };
    let (server, _subs) = target_with_limits(&[("v", 16 * MIB)], limits);
    let addr = server.local_addr();
    use std::io::Read;
    // No ICReq: closed after the connect timeout.
    let mut idle = std::net::TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = std::time::Instant::now();
    let mut sink = Vec::new();
    let _ = idle.read_to_end(&mut sink);
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(sink.is_empty());
    // ICReq but no Connect: closed too.
    let mut half = Host::connect(addr, Digests::NONE);
    assert!(half.wait_closed().is_empty());
    // A connected queue is not subject to the timeout.
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    std::thread::sleep(Duration::from_millis(600));
    admin.keep_alive().ok();
    // Connection limit: a second connection is fine, a third is closed.
    let _second = std::net::TcpStream::connect(addr).unwrap();
    eventually("two connections", || server.connections() == 2);
    let mut third = std::net::TcpStream::connect(addr).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = third.read_to_end(&mut sink);
    assert!(sink.is_empty());
    admin.keep_alive().ok();
    server.shutdown();
}

#[test]
fn write_data_held_per_queue_is_bounded() {
    // 256 KiB of write data in flight per queue: 16 writes of 64 KiB are
    // asked for in turns, and all complete.
    let limits = basalt_frontend_nvme::ServerLimits {
        max_inflight_per_queue: 256 * 1024,
        ..test_limits()
    };
    let (server, _subs) = target_with_limits(&[("v", 16 * MIB)], limits);
    let addr = server.local_addr();
    let admin = Host::admin(addr, Digests::NONE, "v", 0);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    let mut cmds = Vec::new();
    for i in 0..16u64 {
        cmds.push(io.write_cmd(i * 16, pattern(64 * 1024, i as u8), false, false));
    }
    // Send the capsules, then count the R2Ts that arrive before any data
    // is sent: at most 4 (256 KiB / 64 KiB).
    let mut out = Vec::new();
    for c in &cmds {
        let mut sqe = c.sqe;
        sqe.set_sgl(&basalt_nvme_wire::SglDescriptor::transport(64 * 1024));
        basalt_nvme_wire::CapsuleCmd { sqe, data: &[] }
            .encode(&io.negotiated, &mut out)
            .unwrap();
    }
    io.send_raw(&out);
    io.stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut r2ts = Vec::new();
    while let Some(HostPdu::R2T(r)) = io.try_recv() {
        r2ts.push(r);
    }
    assert_eq!(r2ts.len(), 4, "R2Ts beyond the in-flight budget");
    drop(io);
    // A fresh queue runs the same 16 writes to completion.
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 2);
    let cmds: Vec<_> = (0..16u64)
        .map(|i| io.write_cmd(i * 16, pattern(64 * 1024, i as u8), false, false))
        .collect();
    for d in io.run(cmds) {
        d.ok();
    }
    for i in 0..16u64 {
        assert_eq!(io.read(i * 16, 16).ok().data, pattern(64 * 1024, i as u8));
    }
    server.shutdown();
}

/// Enabled CC as Linux writes it, with `en` and `shn` as given.
fn cc_value(en: bool, shn: u8) -> u64 {
    let cc = basalt_nvme_wire::properties::Cc {
        en,
        css: 0,
        mps: 0,
        iosqes: 6,
        iocqes: 4,
        shn,
        ..basalt_nvme_wire::properties::Cc::default()
    };
    u64::from(cc.to_u32())
}

fn csts(h: &mut Host) -> Csts {
    Csts::from_u32(h.prop_get(offset::CSTS, PropertySize::Four) as u32)
}

#[test]
fn clearing_cc_en_resets_the_controller() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    io.write(0, &pattern(4096, 5), true).ok();
    // A held Asynchronous Event Request, which the reset must drop.
    admin
        .set_features(feature_id::ASYNC_EVENT_CONFIG, 1 << 8)
        .ok();
    let cid = admin.cid();
    let aer = Sqe::new(
        basalt_nvme_wire::command::admin_opcode::ASYNC_EVENT_REQUEST,
        cid,
    );
    let mut out = Vec::new();
    basalt_nvme_wire::CapsuleCmd {
        sqe: aer,
        data: &[],
    }
    .encode(&admin.negotiated, &mut out)
    .unwrap();
    admin.send_raw(&out);
    admin.keep_alive().ok();

    // CC.EN 1 -> 0: not ready, I/O queues deleted, admin queue kept.
    admin.prop_set(offset::CC, cc_value(false, 0));
    assert!(!csts(&mut admin).rdy);
    io.wait_closed();
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(1, 127, 0, admin.cntlid, &subsystem_nqn("v"), HOST_NQN);
    assert_eq!(r.status().sc, Status::COMMAND_SEQUENCE_ERROR.sc);
    // The dropped request is never completed: a resize now sends nothing
    // ahead of the next command's completion.
    subs.resize("v", 32 * MIB);
    std::thread::sleep(Duration::from_millis(300));

    // Enable again: a new I/O queue with the same QID works and stays
    // registered (the old queue's thread ending does not unregister it).
    admin.enable();
    admin.keep_alive().ok();
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(io.read(0, 1).ok().data, pattern(4096, 5));
    let mut h = Host::connect(addr, Digests::NONE);
    let r = h.connect_queue(1, 127, 0, admin.cntlid, &subsystem_nqn("v"), HOST_NQN);
    assert_eq!(
        r.status().sc,
        Status::CONNECT_INVALID_PARAMETERS.sc,
        "QID 1 is taken"
    );
    // Features are back to their defaults.
    let cid = admin.cid();
    let mut sqe = Sqe::new(basalt_nvme_wire::command::admin_opcode::GET_FEATURES, cid);
    sqe.cdw10 = u32::from(feature_id::ASYNC_EVENT_CONFIG);
    let aec = admin.simple(sqe).ok().cqe.result();
    assert_eq!(aec, 0);
    server.shutdown();
}

#[test]
fn shutdown_notification_completes_at_once() {
    let (server, _subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    assert_eq!(
        csts(&mut admin).shst,
        basalt_nvme_wire::properties::shst::NORMAL
    );
    admin.prop_set(offset::CC, cc_value(true, 1));
    assert_eq!(
        csts(&mut admin).shst,
        basalt_nvme_wire::properties::shst::COMPLETE
    );
    // Then disabled, as Linux does on disconnect: not ready.
    admin.prop_set(offset::CC, cc_value(false, 0));
    let st = csts(&mut admin);
    assert!(!st.rdy);
    assert_eq!(st.shst, basalt_nvme_wire::properties::shst::NORMAL);
    server.shutdown();
}

#[test]
fn identify_namespace_nuse_counts_allocated_blocks() {
    let (server, _subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    let nuse = |admin: &mut Host| {
        let ns = admin.identify(cns::NAMESPACE, 1).ok().data.clone();
        assert_eq!(le64(&ns, 0), 16 * MIB / 4096, "NSZE");
        assert_eq!(le64(&ns, 8), 16 * MIB / 4096, "NCAP");
        le64(&ns, 16)
    };
    assert_eq!(nuse(&mut admin), 0, "a new thin volume uses nothing");
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    // One block in each of two extents (64 KiB in the test store).
    io.write(0, &pattern(4096, 1), false).ok();
    io.write(40, &pattern(4096, 2), false).ok();
    assert_eq!(nuse(&mut admin), 2 * 64 * KIB / 4096);
    server.shutdown();
}

/// Sends an Asynchronous Event Request on `admin` (held by the target);
/// returns its CID.
fn send_aer(admin: &mut Host) -> u16 {
    let cid = admin.cid();
    let aer = Sqe::new(
        basalt_nvme_wire::command::admin_opcode::ASYNC_EVENT_REQUEST,
        cid,
    );
    let mut out = Vec::new();
    basalt_nvme_wire::CapsuleCmd {
        sqe: aer,
        data: &[],
    }
    .encode(&admin.negotiated, &mut out)
    .unwrap();
    admin.send_raw(&out);
    cid
}

/// (change count, state of group 1) from the ANA log.
fn ana_of(admin: &mut Host) -> (u64, u8) {
    let ana = admin
        .get_log(log_id::ASYMMETRIC_NAMESPACE_ACCESS, 0, 4096, 0)
        .ok()
        .data
        .clone();
    assert_eq!(le16(&ana, 8), 1, "one group");
    assert_eq!(le32(&ana, 16), 1, "group id");
    assert_eq!(le32(&ana, 16 + 4), 1, "one namespace");
    assert_eq!(le32(&ana, 16 + 32), 1, "NSID 1");
    assert_eq!(
        le64(&ana, 16 + 8),
        le64(&ana, 0),
        "group and log change counts"
    );
    (le64(&ana, 0), ana[16 + 16])
}

#[test]
fn ana_state_follows_the_path_state_and_changes_are_notified() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let addr = server.local_addr();
    // A forwarding path from the start: non-optimized.
    subs.set_path_state(PathState::NonOptimized);
    let mut admin = Host::admin(addr, Digests::NONE, "v", 0);
    assert_eq!(ana_of(&mut admin), (1, 0x02), "non-optimized at connect");
    // ANA change notices enabled (bit 11), as Linux does.
    admin
        .set_features(feature_id::ASYNC_EVENT_CONFIG, (1 << 8) | (1 << 11))
        .ok();
    let cid = send_aer(&mut admin);
    admin.keep_alive().ok();
    // The primary moves here: the watchdog notices and completes the AER.
    subs.set_path_state(PathState::Optimized);
    match admin.recv() {
        HostPdu::Resp(cqe) => {
            assert_eq!(cqe.cid, cid);
            assert!(cqe.status.is_success());
            assert_eq!(cqe.dw0 & 7, u32::from(async_event::TYPE_NOTICE));
            assert_eq!(
                (cqe.dw0 >> 8) & 0xff,
                u32::from(async_event::NOTICE_ANA_CHANGE)
            );
            assert_eq!(
                (cqe.dw0 >> 16) & 0xff,
                u32::from(log_id::ASYMMETRIC_NAMESPACE_ACCESS)
            );
        }
        other => panic!("expected the AER completion, got {other:?}"),
    }
    assert_eq!(ana_of(&mut admin), (2, 0x01), "optimized, count bumped");
    // A change while no request is held is delivered by the next one.
    subs.set_path_state(PathState::NonOptimized);
    eventually("the ANA log to change", || ana_of(&mut admin) == (3, 0x02));
    let cid = send_aer(&mut admin);
    match admin.recv() {
        HostPdu::Resp(cqe) => {
            assert_eq!(cqe.cid, cid);
            assert_eq!(
                (cqe.dw0 >> 8) & 0xff,
                u32::from(async_event::NOTICE_ANA_CHANGE)
            );
        }
        other => panic!("expected the AER completion, got {other:?}"),
    }
    // I/O still works through a non-optimized path.
    let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
    io.write(0, &pattern(4096, 3), true).ok();
    server.shutdown();
}

#[test]
fn ana_change_without_notices_enabled_sends_no_event() {
    let (server, subs) = target_with(&[("v", 16 * MIB)]);
    let mut admin = Host::admin(server.local_addr(), Digests::NONE, "v", 0);
    admin
        .set_features(feature_id::ASYNC_EVENT_CONFIG, 1 << 8)
        .ok();
    let cid = send_aer(&mut admin);
    subs.set_path_state(PathState::NonOptimized);
    eventually("the ANA log to change", || ana_of(&mut admin) == (2, 0x02));
    // The AER is still held: the next completion is a keep alive's.
    let ka = admin.keep_alive();
    assert_ne!(ka.cqe.cid, cid, "the held AER completed");
    server.shutdown();
}

#[test]
fn controller_ids_come_from_the_configured_range() {
    assert_eq!(cluster_cntlid_range(0), (1, 999));
    assert_eq!(cluster_cntlid_range(2), (2001, 2999));
    assert_eq!(cluster_cntlid_range(64), (64001, 64999));
    assert_eq!(cluster_cntlid_range(65), (1, 999), "wraps below 0xFFEF");
    let (server, _subs) = target_with_config(
        &[("v", 16 * MIB)],
        TargetConfig {
            limits: test_limits(),
            cntlid_range: Some((2001, 2002)),
            ..TargetConfig::default()
        },
    );
    let addr = server.local_addr();
    let a = Host::admin(addr, Digests::NONE, "v", 0);
    let b = Host::admin(addr, Digests::NONE, "v", 0);
    let mut ids = [a.cntlid, b.cntlid];
    ids.sort();
    assert_eq!(ids, [2001, 2002]);
    // The range is used up while both live; a third admin Connect is
    // refused as busy, and succeeds (reusing an ID) once one is gone.
    let mut c = Host::connect(addr, Digests::NONE);
    let done = c.connect_queue(0, 31, 0, CNTLID_DYNAMIC, &subsystem_nqn("v"), HOST_NQN);
    assert_eq!(done.status().sc, Status::CONNECT_CONTROLLER_BUSY.sc);
    drop(a);
    eventually("a controller to go", || server.controllers() == 1);
    let d = Host::admin(addr, Digests::NONE, "v", 0);
    assert!((2001..=2002).contains(&d.cntlid), "{}", d.cntlid);
    drop(b);
    drop(d);
    server.shutdown();
}
