//! The iSCSI target driven by a test initiator (built on
//! basalt-iscsi-wire) over real TCP sockets, against a store on a
//! simulated device: login and negotiation, CHAP, the data path with
//! immediate data, unsolicited data and R2Ts, digests, malformed input,
//! many pipelining sessions at once, session reinstatement, unit
//! attentions and ALUA, and task management.

mod common;

use basalt_frontend_iscsi::PathState;
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::pdu::{
    InitiatorPdu, LoginRequest, LoginStage, LogoutResponseCode, NopOut, RejectReason, TargetPdu,
    TmfFunction, TmfResponse, RESERVED_TAG,
};
use common::*;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HEADER_ONLY: Digests = Digests {
    header: true,
    data: false,
};

// ---------------------------------------------------------------- data path

/// Writes `data` at `lba` and reads it back.
fn write_read(s: &mut Initiator, lba: u64, data: &[u8], fua: bool) -> (Outcome, Outcome) {
    let w = s.write(lba, data, fua);
    w.ok();
    let r = s.read(lba, (data.len() as u64 / BLOCK) as u32);
    r.ok();
    assert!(r.data == data, "data read back at LBA {lba} differs");
    (w, r)
}

fn data_path(fx: Fixture, digests: Digests) {
    let mut opts = options("vol0");
    opts.digests = digests;
    let mut s = Initiator::login(fx.addr(), &opts).expect("login");
    let n = s.negotiated.clone();
    assert_eq!(n.digests, digests);
    assert_eq!(n.target_max_recv_data_segment, 32 * KIB as u32);
    assert_eq!(
        (n.first_burst, n.max_burst),
        (64 * KIB as u32, 256 * KIB as u32)
    );
    assert!(n.immediate_data && !n.initial_r2t);

    // A new I_T nexus hears of the power on first; INQUIRY never reports
    // a unit attention.
    let inq = s.one(Command::read(inquiry(false, 0, 96), 96));
    inq.ok();
    s.test_unit_ready().check(SENSE_UNIT_ATTENTION, 0x29, 0x00);
    s.test_unit_ready().ok();
    assert_eq!(inq.data[0] & 0x1f, 0, "direct-access block device");
    assert_eq!(ascii(&inq.data[8..16]), "BASALT");
    assert_eq!(ascii(&inq.data[16..32]), "Basalt volume");
    assert_eq!((inq.data[5] >> 4) & 3, 1, "implicit ALUA (TPGS)");
    let serial = s.one(Command::read(inquiry(true, 0x80, 255), 255));
    serial.ok();
    assert_eq!(serial.data[1], 0x80);
    let len = usize::from(serial.data[3]);
    assert_eq!(
        ascii(&serial.data[4..4 + len]),
        fx.targets.id_of("vol0").simple().to_string()
    );

    let cap = s.one(Command::read(read_capacity16(32), 32));
    cap.ok();
    let (blocks, block, exponent, thin) = parse_capacity16(&cap.data);
    assert_eq!((blocks, block), (64 * MIB / 512, 512));
    assert_eq!(exponent, 3, "8 logical blocks per 4096-byte physical block");
    assert!(thin, "LBPME");

    // 512 bytes at an unaligned LBA: only its block changes.
    write_read(&mut s, 1, &pattern(512, 1), false);
    let around = s.read(0, 4);
    around.ok();
    assert!(around.data[..512].iter().all(|&b| b == 0));
    assert_eq!(&around.data[512..1024], &pattern(512, 1)[..]);
    assert!(around.data[1024..].iter().all(|&b| b == 0));

    // 4 KiB, aligned with FUA and unaligned: immediate data only.
    for (lba, seed) in [(8, 2), (21, 3)] {
        let (w, r) = write_read(&mut s, lba, &pattern(4096, seed), lba == 8);
        assert_eq!((w.r2ts, w.data_out_pdus), (0, 0));
        assert_eq!(r.data_in_pdus, 1);
    }

    // 1 MiB: 32 KiB immediate, 32 KiB unsolicited Data-Out, then the
    // other 960 KiB in four R2Ts of at most 256 KiB.
    for (lba, seed) in [(2048, 4), (4096 + 3, 5)] {
        let (w, r) = write_read(&mut s, lba, &pattern(MIB as usize, seed), false);
        assert_eq!(w.r2ts, 4);
        assert_eq!(w.data_out_pdus, 1 + 30);
        assert_eq!(r.data_in_pdus, 16, "Data-In PDUs of 64 KiB");
    }

    // All of it again, pipelined.
    let reads = vec![
        Command::read(read16(1, 1, false), 512),
        Command::read(read16(8, 8, false), 4096),
        Command::read(read10(21, 8), 4096),
        Command::read(read16(2048, 2048, false), MIB as u32),
        Command::read(read16(4099, 2048, true), MIB as u32),
    ];
    let seeds = [1, 2, 3, 4, 5];
    for (o, seed) in s.run(reads).iter().zip(seeds) {
        o.ok();
        assert!(o.data == pattern(o.data.len(), seed));
    }
    assert_eq!(s.nop(b"still here"), b"still here");
    assert_eq!(s.logout(), LogoutResponseCode::ClosedSuccessfully);
    fx.wait_connections(0);
}

#[test]
fn login_inquiry_capacity_and_data_path() {
    data_path(target_with(&[("vol0", 64 * MIB)]), Digests::NONE);
}

#[test]
fn data_path_with_header_and_data_digests() {
    data_path(target_with(&[("vol0", 64 * MIB)]), Digests::BOTH);
}

#[test]
fn data_path_on_a_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let targets = StoreTargets::file(dir.path(), 128 * MIB, &[INITIATOR]);
    let fx = target_on(targets, &[("vol0", 64 * MIB)], test_limits(), None);
    data_path(fx, HEADER_ONLY);
}

#[test]
fn data_path_with_initial_r2t_and_without_immediate_data() {
    let fx = target_with(&[("vol0", 16 * MIB)]);
    let mut opts = options("vol0");
    opts.initial_r2t = true;
    opts.immediate_data = false;
    let mut s = session(fx.addr(), &opts);
    assert!(s.negotiated.initial_r2t && !s.negotiated.immediate_data);
    let (w, _) = write_read(&mut s, 0, &pattern(4096, 9), false);
    assert_eq!((w.r2ts, w.data_out_pdus), (1, 1), "all data solicited");
    let (w, _) = write_read(&mut s, 100, &pattern(MIB as usize, 10), true);
    assert_eq!((w.r2ts, w.data_out_pdus), (4, 32));
}

// ---------------------------------------------------------------- CHAP

#[test]
fn chap_and_login_refusals() {
    const SECRET: &[u8] = b"alice-secret-1234";
    let fx = target_with(&[("vol0", 16 * MIB)]);
    fx.targets.set_chap(INITIATOR, "alice", SECRET);
    let mut opts = options("vol0");

    opts.chap = Some(("alice".into(), SECRET.to_vec()));
    let mut s = session(fx.addr(), &opts);
    write_read(&mut s, 0, &pattern(4096, 1), false);
    assert_eq!(s.logout(), LogoutResponseCode::ClosedSuccessfully);

    let refused = |opts: &LoginOptions| match Initiator::login(fx.addr(), opts) {
        Ok(_) => panic!("login of {} to {} succeeded", opts.initiator, opts.target),
        Err(refused) => {
            assert!(refused.closed, "the target closes a refused login");
            refused.status
        }
    };
    opts.chap = Some(("alice".into(), b"not-the-secret-xyz".to_vec()));
    assert_eq!(
        refused(&opts),
        0x0201,
        "wrong secret: authentication failure"
    );
    opts.chap = Some(("mallory".into(), SECRET.to_vec()));
    assert_eq!(refused(&opts), 0x0201, "wrong user: authentication failure");
    opts.chap = None;
    assert_eq!(refused(&opts), 0x0201, "CHAP required");

    let intruder = LoginOptions::new(INTRUDER, &target_name("vol0"));
    assert_eq!(refused(&intruder), 0x0202, "initiator not allowed");
    let probe = LoginOptions::new(INTRUDER, &target_name("no-such-volume"));
    assert_eq!(refused(&probe), 0x0202, "names cannot be probed");
    let foreign = LoginOptions::new(INITIATOR, "iqn.2001-04.com.example:storage.disk1");
    assert_eq!(refused(&foreign), 0x0203, "not a target here");

    fx.wait_connections(0);
    assert_eq!(fx.targets.open_handles("vol0"), 0);
}

// ---------------------------------------------------------------- malformed input

/// Sends `bytes` on a new connection and waits for the target to close
/// it (well before the login timeout); returns what it sent before.
fn closes_after(addr: SocketAddr, bytes: &[u8]) -> Vec<TargetPdu> {
    use basalt_iscsi_wire::decoder::{decode_target, Decoded, DecoderConfig};
    let started = Instant::now();
    let mut stream = Initiator::connect_raw(addr);
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    // The target may close before it has read everything.
    let _ = stream.write_all(bytes);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock) => {
                panic!("the target kept the connection open after {bytes:02x?}")
            }
            Err(_) => break,
        }
    }
    assert!(started.elapsed() < Duration::from_secs(4));
    let mut pdus = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        match decode_target(&buf[at..], &DecoderConfig::LOGIN).expect("a well-formed PDU") {
            Decoded::Pdu { pdu, consumed, .. } => {
                pdus.push(pdu);
                at += consumed;
            }
            Decoded::NeedMore(_) => panic!("a truncated PDU"),
        }
    }
    pdus
}

/// Verified I/O on its own session until `stop`; returns the rounds done.
fn background_io(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut opts = options("vol0");
        opts.isid = [0x80, 0, 0, 0, 0xbb, 1];
        opts.digests = Digests::BOTH;
        let mut s = Initiator::login(addr, &opts).expect("login");
        s.test_unit_ready().check(SENSE_UNIT_ATTENTION, 0x29, 0x00);
        let mut rounds = 0;
        while !stop.load(Ordering::SeqCst) || rounds < 3 {
            let data = pattern(64 * KIB as usize + 512 * (rounds % 7), rounds as u8);
            write_read(
                &mut s,
                8192 + (rounds as u64 % 16) * 256,
                &data,
                rounds % 2 == 0,
            );
            rounds += 1;
        }
        assert_eq!(s.logout(), LogoutResponseCode::ClosedSuccessfully);
        rounds
    })
}

fn pseudo_random(len: usize, mut x: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn malformed_input_ends_only_its_own_connection() {
    let fx = target_with(&[("vol0", 64 * MIB)]);
    let panics_before = target_panics();
    let stop = Arc::new(AtomicBool::new(false));
    let other = background_io(fx.addr(), Arc::clone(&stop));

    // Garbage instead of a login.
    let http = b"GET / HTTP/1.1\r\nHost: target.example\r\nUser-Agent: test\r\n\r\n";
    let mut noise = pseudo_random(4096, 0x9e37_79b9_7f4a_7c15);
    noise[0] = 0xff;
    let mut bad_text = vec![0u8; 48];
    bad_text[0] = 0x43; // Login Request, immediate
    bad_text[1] = 0x81; // T, CSG 0, NSG 1
    bad_text[7] = 200; // DataSegmentLength
    bad_text.extend(pseudo_random(200, 7).iter().map(|b| b | 0x80));
    for garbage in [&http[..], &noise, &[0u8; 48], &bad_text] {
        for pdu in closes_after(fx.addr(), garbage) {
            match pdu {
                TargetPdu::LoginResponse(r) => assert_eq!(r.status_class, 2, "initiator error"),
                other => panic!("unexpected answer to garbage: {other:?}"),
            }
        }
    }

    // A Login Request announcing a 16 MiB data segment: refused without
    // waiting for (or buffering) the data.
    let login = InitiatorPdu::LoginRequest(LoginRequest {
        transit: true,
        cont: false,
        csg: LoginStage::SecurityNegotiation,
        nsg: LoginStage::OperationalNegotiation,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 9],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    });
    let mut huge = Vec::new();
    login
        .encode_header(0x00ff_ffff, Digests::NONE, &mut huge)
        .unwrap();
    huge.extend_from_slice(&[b'a'; 1000]);
    closes_after(fx.addr(), &huge);

    // Unknown opcodes in the full-feature phase: rejected, the session
    // goes on.
    let mut opts = options("vol0");
    opts.digests = HEADER_ONLY;
    let mut s = session(fx.addr(), &opts);
    for opcode in [0x1c, 0x21, 0x3f] {
        let mut bhs = [0u8; 48];
        bhs[0] = opcode;
        bhs[1] = 0x80;
        bhs[7] = 100; // DataSegmentLength
        bhs[16..20].copy_from_slice(&0x7777u32.to_be_bytes());
        let mut bytes = bhs.to_vec();
        let digest = basalt_iscsi_wire::digest::header_digest(&bhs);
        bytes.extend_from_slice(&basalt_iscsi_wire::digest::digest_bytes(digest));
        bytes.extend_from_slice(&[0x5a; 100]);
        s.send_raw(&bytes);
        let rx = s.next_other();
        let TargetPdu::Reject(reject) = rx.pdu else {
            panic!("expected a Reject, got {:?}", rx.pdu);
        };
        assert_eq!(reject.reason, RejectReason::CommandNotSupported);
        assert_eq!(reject.reason.code(), 0x05);
        assert_eq!(rx.data, bhs, "the Reject carries the rejected header");
        assert_eq!(s.nop(b"after reject"), b"after reject");
    }
    write_read(&mut s, 0, &pattern(100 * KIB as usize, 3), true);

    // A header digest error: nothing in the header can be trusted, so the
    // connection closes, without a Reject.
    let nop = InitiatorPdu::NopOut(NopOut {
        immediate: true,
        lun: 0,
        itt: 0x4242,
        ttt: RESERVED_TAG,
        cmd_sn: 0,
        exp_stat_sn: 0,
    });
    let mut bytes = s.encode(&nop, b"ping");
    bytes[48] ^= 0x01;
    s.send_raw(&bytes);
    assert!(
        s.wait_closed().is_empty(),
        "no answer to an untrusted header"
    );

    stop.store(true, Ordering::SeqCst);
    let rounds = other.join().expect("the other session failed");
    assert!(rounds >= 3);
    fx.wait_connections(0);
    assert_eq!(target_panics(), panics_before, "a target thread panicked");
}

// ---------------------------------------------------------------- reinstatement

#[test]
fn login_with_the_same_isid_reinstates_the_session() {
    let fx = target_with(&[("vol0", 16 * MIB)]);
    let opts = options("vol0");
    let mut first = session(fx.addr(), &opts);
    first.write(64, &pattern(8192, 4), true).ok();
    assert_eq!(fx.server.sessions(), 1);

    let mut second = Initiator::login(fx.addr(), &opts).expect("login");
    assert_ne!(second.tsih, first.tsih);
    assert!(
        first.wait_closed().is_empty(),
        "the old connection is closed"
    );
    // The same I_T nexus, lost and made again at the reinstatement: one
    // POWER ON RESET, whenever the old connection's end is seen.
    second
        .test_unit_ready()
        .check(SENSE_UNIT_ATTENTION, 0x29, 0x00);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(second.test_unit_ready().status, STATUS_GOOD);
    let r = second.read(64, 16);
    r.ok();
    assert!(r.data == pattern(8192, 4));
    eventually("one session", || fx.server.sessions() == 1);
    fx.wait_connections(1);

    // Another ISID is another session: both live.
    let mut other = options("vol0");
    other.isid[5] ^= 0x55;
    let mut third = session(fx.addr(), &other);
    assert_eq!(second.nop(b"a"), b"a");
    assert_eq!(third.nop(b"b"), b"b");
    assert_eq!(fx.server.sessions(), 2);
}

// ---------------------------------------------------------------- unit attentions

/// TEST UNIT READY until it reports a unit attention (the watchdog posts
/// them every 100 ms); returns it.
fn next_attention(s: &mut Initiator) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let o = s.test_unit_ready();
        if o.status != STATUS_GOOD {
            return o;
        }
        assert!(Instant::now() < deadline, "no unit attention");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn port_groups(s: &mut Initiator) -> Vec<TargetPortGroup> {
    let o = s.one(Command::read(report_target_port_groups(1024), 1024));
    o.ok();
    parse_target_port_groups(&o.data)
}

#[test]
fn resize_and_alua_changes_are_unit_attentions() {
    let fx = target_with(&[("vol0", 32 * MIB)]);
    fx.targets.set_other_groups(&[(2, PathState::NonOptimized)]);
    let mut s = session(fx.addr(), &options("vol0"));
    let mut other_opts = options("vol0");
    other_opts.isid[5] = 0x22;
    let mut other = session(fx.addr(), &other_opts);

    fx.targets.resize("vol0", 48 * MIB);
    next_attention(&mut s).check(SENSE_UNIT_ATTENTION, 0x2a, 0x09);
    s.test_unit_ready().ok();
    let cap = s.one(Command::read(read_capacity16(32), 32));
    cap.ok();
    assert_eq!(parse_capacity16(&cap.data).0, 48 * MIB / 512);
    // Every I_T nexus hears of it.
    other
        .test_unit_ready()
        .check(SENSE_UNIT_ATTENTION, 0x2a, 0x09);
    let beyond = s.write(40 * MIB / 512, &pattern(4096, 6), false);
    beyond.ok();

    let groups = port_groups(&mut s);
    let own = TargetPortGroup {
        preferred: true,
        state: 0,
        id: 1,
        ports: vec![1],
    };
    let remote = TargetPortGroup {
        preferred: false,
        state: 1,
        id: 2,
        ports: vec![2],
    };
    assert_eq!(groups, vec![own, remote.clone()]);

    fx.targets.set_path_state(PathState::NonOptimized);
    next_attention(&mut s).check(SENSE_UNIT_ATTENTION, 0x2a, 0x06);
    let groups = port_groups(&mut s);
    let own = TargetPortGroup {
        preferred: false,
        state: 1,
        id: 1,
        ports: vec![1],
    };
    assert_eq!(groups, vec![own.clone(), remote]);
    other
        .test_unit_ready()
        .check(SENSE_UNIT_ATTENTION, 0x2a, 0x06);
    // Non-optimized paths still serve I/O.
    write_read(&mut s, 0, &pattern(4096, 7), false);

    // Another node's group changing (its node died) is a unit attention
    // too, though this path's state stays: SPC reports any group's change.
    fx.targets.set_other_groups(&[(2, PathState::Unavailable)]);
    next_attention(&mut s).check(SENSE_UNIT_ATTENTION, 0x2a, 0x06);
    let unavailable = TargetPortGroup {
        preferred: false,
        state: 3,
        id: 2,
        ports: vec![2],
    };
    assert_eq!(port_groups(&mut s), vec![own, unavailable]);
}

#[test]
fn read_capacity_right_after_a_resize_sees_it() {
    // An initiator that rescans as soon as the resize returned (the
    // watchdog, every 100 ms, has not looked yet) gets the attention and
    // then the new capacity, never the old one without an attention.
    let fx = target_with(&[("vol0", 32 * MIB)]);
    let mut s = session(fx.addr(), &options("vol0"));
    for step in 1..=3u64 {
        let size = (32 + 16 * step) * MIB;
        fx.targets.resize("vol0", size);
        s.one(Command::read(read_capacity16(32), 32))
            .check(SENSE_UNIT_ATTENTION, 0x2a, 0x09);
        let cap = s.one(Command::read(read_capacity16(32), 32));
        cap.ok();
        assert_eq!(parse_capacity16(&cap.data).0, size / 512, "resize {step}");
        // The watchdog, when it looks, has nothing more to say.
        std::thread::sleep(Duration::from_millis(250));
        s.test_unit_ready().ok();
    }
}

// ---------------------------------------------------------------- task management

#[test]
fn task_management() {
    let fx = target_with(&[("vol0", 32 * MIB)]);
    let mut s = session(fx.addr(), &options("vol0"));
    let mut other_opts = options("vol0");
    other_opts.isid[5] = 0x33;
    let mut other = session(fx.addr(), &other_opts);

    let (response, ended) = s.task_management(TmfFunction::AbortTask, 0xdead_beef);
    assert_eq!(response, TmfResponse::TaskDoesNotExist);
    assert!(ended.is_empty());
    let done = s.write(0, &pattern(64 * KIB as usize, 1), false);
    done.ok();
    let (response, _) = s.task_management(TmfFunction::AbortTask, done.itt);
    assert_eq!(response, TmfResponse::TaskDoesNotExist, "answered already");

    // LOGICAL UNIT RESET right behind reads (in one segment, so the
    // target takes them together): each read is answered before the TMF
    // response or never, and none takes the reset's unit attention.
    s.hold();
    let itts: Vec<u32> = (0..8)
        .map(|i| s.submit(Command::read(read16(i * 128, 128, false), 64 * 1024)))
        .collect();
    let (response, ended) = s.task_management(TmfFunction::LogicalUnitReset, RESERVED_TAG);
    assert_eq!(response, TmfResponse::FunctionComplete);
    assert_eq!(s.outstanding(), 0);
    let mut answered = 0;
    while answered + ended.len() < itts.len() {
        let o = s.next_outcome();
        o.ok();
        if o.itt == itts[0] {
            assert!(o.data == pattern(64 * KIB as usize, 1));
        }
        answered += 1;
    }
    assert_eq!(answered + ended.len(), itts.len());
    s.test_unit_ready().check(SENSE_UNIT_ATTENTION, 0x29, 0x03);
    s.test_unit_ready().ok();
    other
        .test_unit_ready()
        .check(SENSE_UNIT_ATTENTION, 0x29, 0x03);
    // Nothing more comes for the ended tasks (the initiator fails on it).
    assert_eq!(s.nop(b"after reset"), b"after reset");
    write_read(&mut s, 512, &pattern(4096, 2), false);

    let (response, _) = s.task_management(TmfFunction::TargetColdReset, RESERVED_TAG);
    assert_eq!(response, TmfResponse::NotSupported);
    assert_eq!(s.nop(b"x"), b"x");
}

// ---------------------------------------------------------------- stress

const SESSIONS: usize = 64;
/// Each session's own part of the volume.
const REGION: u64 = 2 * MIB;
/// A batch's commands go to distinct slots of the region, so they never
/// overlap (SIMPLE tasks complete in any order).
const SLOTS: usize = 16;
const SLOT: u64 = REGION / SLOTS as u64;
const ROUNDS: usize = 20;

/// A write lost with its connection: its range holds its old data or its
/// new data, all of it.
struct Uncertain {
    offset: usize,
    old: Vec<u8>,
    new: Vec<u8>,
}

/// What a stress session leaves: commands checked, the region as it must
/// be, and the writes whose outcome is unknown.
type StressResult = (usize, Vec<u8>, Vec<Uncertain>);

fn stress_isid(session: usize, generation: u8) -> [u8; 6] {
    [
        0x80,
        0,
        (session >> 8) as u8,
        session as u8,
        generation,
        0x5,
    ]
}

/// One session's stress: rounds of up to 16 pipelined reads and writes of
/// random sizes (some beyond FirstBurstLength) at random LBAs of its
/// region, random FUA, reads checked against what it wrote; a few
/// sessions lose their connection in the middle of commands and log in
/// again (with a new ISID, so the old nexus ending late cannot touch the
/// new one).
fn stress_session(addr: SocketAddr, i: usize) -> StressResult {
    use rand::{Rng, RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_0000 + i as u64);
    let base = i as u64 * REGION / BLOCK;
    let mut shadow = vec![0u8; REGION as usize];
    let mut uncertain = Vec::new();
    let mut usable: Vec<usize> = (0..SLOTS).collect();
    let mut generation = 0;
    let mut opts = options("stress");
    opts.isid = stress_isid(i, generation);
    opts.digests = [Digests::NONE, HEADER_ONLY, Digests::BOTH][i % 3];
    let mut s = session(addr, &opts);
    let disconnects: &[usize] = if i % 16 == 3 { &[2, 6] } else { &[] };
    let mut checked = 0;
    for round in 0..ROUNDS {
        let lose = disconnects.contains(&round);
        let n = match lose {
            true => 4,
            false => rng.gen_range(1..=16),
        };
        rand::seq::SliceRandom::shuffle(&mut usable[..], &mut rng);
        let slots: Vec<usize> = usable.iter().copied().take(n).collect();
        let mut cmds = Vec::new();
        let mut plan = Vec::new();
        for &slot in &slots {
            let most = SLOT / BLOCK;
            let blocks = match rng.gen_range(0..4) {
                0 => 1,
                1 => 8,
                2 => rng.gen_range(1..=most),
                _ => rng.gen_range(129..=most), // beyond FirstBurstLength
            };
            let first = rng.gen_range(0..=most - blocks);
            let offset = (slot as u64 * SLOT + first * BLOCK) as usize;
            let len = (blocks * BLOCK) as usize;
            let lba = base + offset as u64 / BLOCK;
            let fua = rng.gen_bool(0.3);
            if rng.gen_bool(0.5) {
                let mut data = vec![0u8; len];
                rng.fill_bytes(&mut data);
                cmds.push(Command::write(
                    write16(lba, blocks as u32, fua),
                    data.clone(),
                ));
                plan.push((offset, len, Some(data)));
            } else {
                cmds.push(Command::read(read16(lba, blocks as u32, fua), len as u32));
                plan.push((offset, len, None));
            }
        }
        if lose {
            for c in cmds {
                s.submit(c);
            }
            if round == disconnects[0] {
                // One answer, then half a command PDU.
                let _ = s.next_outcome();
                let half = s.encode(
                    &InitiatorPdu::NopOut(NopOut {
                        immediate: true,
                        lun: 0,
                        itt: 0x9999,
                        ttt: RESERVED_TAG,
                        cmd_sn: 0,
                        exp_stat_sn: 0,
                    }),
                    &[1; 64],
                );
                s.send_raw(&half[..30]);
            }
            s.disconnect();
            for (offset, len, data) in plan {
                if let Some(new) = data {
                    let old = shadow[offset..offset + len].to_vec();
                    uncertain.push(Uncertain { offset, old, new });
                    usable.retain(|&u| u as u64 != offset as u64 / SLOT);
                }
            }
            generation += 1;
            opts.isid = stress_isid(i, generation);
            s = session(addr, &opts);
            continue;
        }
        for (o, (offset, len, data)) in s.run(cmds).iter().zip(plan) {
            o.ok();
            match data {
                Some(d) => shadow[offset..offset + len].copy_from_slice(&d),
                None => assert!(
                    o.data == shadow[offset..offset + len],
                    "session {i} round {round}: read at region offset {offset} differs"
                ),
            }
            checked += 1;
        }
    }
    assert_eq!(s.logout(), LogoutResponseCode::ClosedSuccessfully);
    (checked, shadow, uncertain)
}

/// The process's resident set, in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn many_sessions_pipelining_on_event_loops() {
    let reactor = basalt_reactor::Reactor::start("t", 2).expect("event loops");
    let limits = basalt_frontend_iscsi::ServerLimits {
        command_window: 12,
        ..test_limits()
    };
    let targets = StoreTargets::sim(256 * MIB, &[INITIATOR]);
    let volume = [("stress", SESSIONS as u64 * REGION)];
    let fx = target_on(targets, &volume, limits, Some(reactor));
    let addr = fx.addr();
    let panics_before = target_panics();
    let resident_before = resident();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..SESSIONS {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let result = std::panic::catch_unwind(|| stress_session(addr, i));
            let _ = tx.send((i, result.map_err(|e| panic_text(&*e))));
        });
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut results: Vec<Option<StressResult>> = (0..SESSIONS).map(|_| None).collect();
    let mut peak = resident();
    for _ in 0..SESSIONS {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, result) = rx.recv_timeout(left).expect("stress sessions hung");
        peak = peak.max(resident());
        results[i] = Some(result.unwrap_or_else(|e| panic!("session {i}: {e}")));
    }
    fx.wait_connections(0);
    let grown = peak.saturating_sub(resident_before);
    assert!(
        grown < 1024 * MIB,
        "resident set grew by {} MiB",
        grown / MIB
    );

    // Everything as written, read back by a fresh session.
    let mut opts = options("stress");
    opts.isid = stress_isid(0xfff, 0);
    let mut v = session(addr, &opts);
    let mut checked = 0;
    for (i, result) in results.into_iter().enumerate() {
        let (n, mut expected, uncertain) = result.unwrap();
        checked += n;
        let got = v.read(i as u64 * REGION / BLOCK, (REGION / BLOCK) as u32);
        got.ok();
        for u in uncertain {
            let range = u.offset..u.offset + u.new.len();
            let at = &got.data[range.clone()];
            assert!(
                at == u.old || at == u.new,
                "session {i}: a lost write half done"
            );
            expected[range].copy_from_slice(at);
        }
        assert!(got.data == expected, "session {i}: region differs");
    }
    assert!(
        checked > SESSIONS * ROUNDS * 4,
        "only {checked} commands checked"
    );
    assert_eq!(target_panics(), panics_before, "a target thread panicked");
}

fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}
