//! Transmission behaviour over a real socket against a real store: every
//! command, FUA and flush, errors, pipelining, several connections, DISC and
//! server shutdown.

mod common;

use basalt_frontend_nbd::{Exports, NbdServer, SPARSE_READ_MIN};
use basalt_nbd_wire::*;
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOLE_ZERO: BlockStatusFlags = BlockStatusFlags::HOLE.union(BlockStatusFlags::ZERO);

#[test]
fn write_read_flush_fua_over_structured_and_simple_replies() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let addr = server.local_addr().expect("a TCP server");
    for structured in [true, false] {
        let mut c = if structured {
            Client::open(addr, "vol")
        } else {
            Client::open_simple(addr, "vol")
        };
        let base = if structured { 0 } else { 4 * MIB };
        let data = pattern(1, 128 * 1024);
        c.write(base, &data, CommandFlags::empty()).expect("write");
        assert_eq!(c.read(base, data.len() as u32).expect("read"), data);
        // FUA on a write, a flush, and FUA on a flush (valid on any command).
        let fua = pattern(2, 4096);
        c.write(base + 8192, &fua, CommandFlags::FUA)
            .expect("FUA write");
        c.flush().expect("flush");
        let r = c.call(Command::Flush, CommandFlags::FUA, 0, 0, &[]);
        assert_eq!(r.error, None);
        let mut expected = data.clone();
        expected[8192..8192 + 4096].copy_from_slice(&fua);
        assert_eq!(c.read(base, data.len() as u32).expect("read"), expected);
        // Unaligned I/O is served (read-modify-write in the store).
        c.write(base + 1, b"abc", CommandFlags::empty())
            .expect("unaligned write");
        assert_eq!(c.read(base, 5).expect("unaligned read")[1..4], *b"abc");
        c.disconnect();
    }
    server.shutdown();
}

#[test]
fn structured_reads_use_holes_for_unallocated_parts_unless_df() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    // One written extent in the middle of a 4-extent range.
    let data = pattern(3, EXTENT as usize);
    c.write(2 * MIB + EXTENT, &data, CommandFlags::empty())
        .expect("write");
    let len = (4 * EXTENT) as u32;
    assert!(len >= SPARSE_READ_MIN);
    let r = c.call(Command::Read, CommandFlags::empty(), 2 * MIB, len, &[]);
    assert_eq!(r.error, None);
    assert_eq!(r.chunks, vec!["hole", "data", "hole"]);
    let mut expected = vec![0u8; len as usize];
    expected[EXTENT as usize..2 * EXTENT as usize].copy_from_slice(&data);
    assert_eq!(r.data, expected);
    // DF: one content chunk with the zeros explicit.
    let r = c.call(Command::Read, CommandFlags::DF, 2 * MIB, len, &[]);
    assert_eq!(r.chunks, vec!["data"]);
    assert_eq!(r.data, expected);
    // Fully allocated and small reads are one data chunk.
    let r = c.call(
        Command::Read,
        CommandFlags::empty(),
        2 * MIB + EXTENT,
        4096,
        &[],
    );
    assert_eq!(r.chunks, vec!["data"]);
    // A read of a fresh region is all hole.
    let r = c.call(Command::Read, CommandFlags::empty(), 8 * MIB, len, &[]);
    assert_eq!(r.chunks, vec!["hole"]);
    assert_eq!(r.data, vec![0u8; len as usize]);
    server.shutdown();
}

#[test]
fn block_status_trim_and_write_zeroes() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    // A fresh volume is one hole.
    let extents = c
        .block_status(0, (16 * MIB) as u32, CommandFlags::empty())
        .expect("status");
    assert_eq!(
        extents,
        vec![BlockDescriptor {
            length: (16 * MIB) as u32,
            status: HOLE_ZERO
        }]
    );
    // Write two extents, check allocation; REQ_ONE gives one extent.
    let data = pattern(4, 2 * EXTENT as usize);
    c.write(MIB, &data, CommandFlags::empty()).expect("write");
    let extents = c
        .block_status(0, (2 * MIB) as u32, CommandFlags::empty())
        .expect("status");
    assert_eq!(
        extents,
        vec![
            BlockDescriptor {
                length: MIB as u32,
                status: HOLE_ZERO
            },
            BlockDescriptor {
                length: (2 * EXTENT) as u32,
                status: BlockStatusFlags::empty()
            },
            BlockDescriptor {
                length: (MIB - 2 * EXTENT) as u32,
                status: HOLE_ZERO
            },
        ]
    );
    let one = c
        .block_status(MIB, MIB as u32, CommandFlags::REQ_ONE)
        .expect("status");
    assert_eq!(
        one,
        vec![BlockDescriptor {
            length: (2 * EXTENT) as u32,
            status: BlockStatusFlags::empty()
        }]
    );
    // The reply's context id is the one SET_META_CONTEXT returned.
    let r = c.call(Command::BlockStatus, CommandFlags::empty(), 0, 4096, &[]);
    assert_eq!(r.context_id, Some(basalt_frontend_nbd::BASE_ALLOCATION_ID));

    // TRIM then read: zeros, and the space is a hole again.
    c.trim(MIB, EXTENT as u32).expect("trim");
    assert_eq!(
        c.read(MIB, EXTENT as u32).expect("read"),
        vec![0u8; EXTENT as usize]
    );
    let extents = c
        .block_status(MIB, EXTENT as u32, CommandFlags::empty())
        .expect("status");
    assert_eq!(
        extents,
        vec![BlockDescriptor {
            length: EXTENT as u32,
            status: HOLE_ZERO
        }]
    );

    // WRITE_ZEROES without NO_HOLE may unmap; with NO_HOLE it stays allocated.
    c.write_zeroes(MIB + EXTENT, EXTENT as u32, CommandFlags::FUA)
        .expect("zero");
    assert_eq!(c.read(MIB + EXTENT, 4096).expect("read"), vec![0u8; 4096]);
    c.write(3 * MIB, &data, CommandFlags::empty())
        .expect("write");
    c.write_zeroes(3 * MIB, EXTENT as u32, CommandFlags::NO_HOLE)
        .expect("zero no hole");
    assert_eq!(
        c.read(3 * MIB, EXTENT as u32).expect("read"),
        vec![0u8; EXTENT as usize]
    );
    let extents = c
        .block_status(3 * MIB, EXTENT as u32, CommandFlags::empty())
        .expect("status");
    assert_eq!(
        extents[0].status,
        BlockStatusFlags::empty(),
        "NO_HOLE keeps the space"
    );
    // FAST_ZERO is always accepted: zeroing is fast here.
    c.write_zeroes(5 * MIB, (2 * MIB) as u32, CommandFlags::FAST_ZERO)
        .expect("fast zero");
    // CACHE: success after the range check.
    let r = c.call(Command::Cache, CommandFlags::empty(), 0, MIB as u32, &[]);
    assert_eq!(r.error, None);
    // Zero-length TRIM/WRITE_ZEROES/CACHE succeed.
    c.trim(0, 0).expect("zero-length trim");
    c.write_zeroes(0, 0, CommandFlags::empty())
        .expect("zero-length zero");
    server.shutdown();
}

#[test]
fn out_of_range_and_invalid_requests_get_errors_and_the_connection_survives() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    let size = c.size;
    let alive = |c: &mut Client| {
        c.write(15 * MIB, &[0x5a; 4096], CommandFlags::empty())
            .expect("still usable");
        assert_eq!(
            c.read(15 * MIB, 4096).expect("still usable"),
            vec![0x5a; 4096]
        );
    };
    let call = |c: &mut Client, command, flags, offset, len: u32| {
        let data = if command == Command::Write {
            vec![1u8; len as usize]
        } else {
            Vec::new()
        };
        c.call(command, flags, offset, len, &data).error
    };
    let none = CommandFlags::empty();
    // Beyond the end: EINVAL for reads and friends, ENOSPC for writes.
    assert_eq!(
        call(&mut c, Command::Read, none, size, 512),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::Read, none, size - 512, 1024),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::Read, none, u64::MAX - 100, 512),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::Write, none, size, 512),
        Some(NbdError::NoSpace)
    );
    assert_eq!(
        call(&mut c, Command::Write, none, u64::MAX - 100, 512),
        Some(NbdError::NoSpace)
    );
    assert_eq!(
        call(&mut c, Command::WriteZeroes, none, size - 512, 4096),
        Some(NbdError::NoSpace)
    );
    assert_eq!(
        call(&mut c, Command::Trim, none, size, 4096),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::Cache, none, size, 4096),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::BlockStatus, none, size, 4096),
        Some(NbdError::Invalid)
    );
    alive(&mut c);
    // Unknown command, unknown flags, flags on the wrong command.
    assert_eq!(
        call(&mut c, Command::Unknown(42), none, 0, 0),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(
            &mut c,
            Command::Read,
            CommandFlags::from_bits(0x8000),
            0,
            512
        ),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::Write, CommandFlags::NO_HOLE, 0, 512),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::Read, CommandFlags::REQ_ONE, 0, 512),
        Some(NbdError::Invalid)
    );
    assert_eq!(
        call(&mut c, Command::BlockStatus, none, 0, 0),
        Some(NbdError::Invalid)
    );
    alive(&mut c);
    // Oversize READ: EOVERFLOW before any range check.
    assert_eq!(
        call(&mut c, Command::Read, none, 0, MAX_PAYLOAD + 512),
        Some(NbdError::Overflow)
    );
    // Oversize WRITE: its payload is consumed, the reply is EINVAL, and the
    // stream stays in sync.
    assert_eq!(
        call(&mut c, Command::Write, none, 0, MAX_PAYLOAD + 4096),
        Some(NbdError::Invalid)
    );
    alive(&mut c);
    // Zero-length READ (NONE chunk) and WRITE, even at the very end.
    let r = c.call(Command::Read, none, size, 0, &[]);
    assert_eq!((r.error, r.chunks), (None, vec!["none"]));
    c.write(size, &[], none)
        .expect("zero-length write at the end");
    alive(&mut c);
    // Errors carry a message for humans in structured replies.
    let r = c.call(Command::Read, none, size, 512, &[]);
    assert!(r.message.expect("message").contains("beyond the end"));
    c.disconnect();
    server.shutdown();
}

#[test]
fn simple_replies_for_errors_and_df_needs_structured_replies() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::open_simple(server.local_addr().expect("a TCP server"), "vol");
    let r = c.call(Command::Read, CommandFlags::empty(), c.size, 512, &[]);
    assert_eq!(
        (r.error, r.chunks),
        (Some(NbdError::Invalid), vec!["simple"])
    );
    let r = c.call(Command::Read, CommandFlags::DF, 0, 512, &[]);
    assert_eq!(
        r.error,
        Some(NbdError::Invalid),
        "DF without structured replies"
    );
    let r = c.call(Command::BlockStatus, CommandFlags::empty(), 0, 512, &[]);
    assert_eq!(
        r.error,
        Some(NbdError::Invalid),
        "BLOCK_STATUS without structured replies"
    );
    assert_eq!(c.read(0, 512).expect("read"), vec![0; 512]);
    server.shutdown();
}

#[test]
fn absurd_write_length_closes_the_connection() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    c.submit(Command::Write, CommandFlags::empty(), 0, u32::MAX, &[]);
    assert!(c.server_closed());
    eventually("connection to be released", || server.connections() == 0);
    server.shutdown();
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut good = Client::open(server.local_addr().expect("a TCP server"), "vol");
    let mut bad = Client::open(server.local_addr().expect("a TCP server"), "vol");
    bad.send(&[0x12, 0x56, 0x09, 0x53].repeat(7));
    assert!(bad.server_closed());
    assert_eq!(
        good.read(0, 512).expect("other connection unaffected"),
        vec![0; 512]
    );
    eventually("bad connection to be released", || {
        server.connections() == 1
    });
    good.disconnect();
    server.shutdown();
}

#[test]
fn pipelined_requests_on_one_connection() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    for structured in [true, false] {
        let mut c = if structured {
            Client::open(server.local_addr().expect("a TCP server"), "vol")
        } else {
            Client::open_simple(server.local_addr().expect("a TCP server"), "vol")
        };
        let base = if structured { 0 } else { 8 * MIB };
        // 300 writes of 4 KiB (more than one batch) sent in one go, then 300
        // reads, then a mix with errors in between.
        let n = 300u64;
        let mut out = Vec::new();
        let mut cookies = Vec::new();
        for i in 0..n {
            let data = pattern(100 + i, 4096);
            cookies.push(c.queue(
                &mut out,
                Command::Write,
                CommandFlags::empty(),
                base + i * 4096,
                4096,
                &data,
            ));
        }
        c.send(&out);
        let mut answered: Vec<u64> = (0..n)
            .map(|_| {
                let r = c.reply();
                assert_eq!(r.error, None);
                r.cookie
            })
            .collect();
        answered.sort_unstable();
        assert_eq!(answered, cookies);

        let mut out = Vec::new();
        let mut expected = std::collections::HashMap::new();
        for i in 0..n {
            let cookie = c.queue(
                &mut out,
                Command::Read,
                CommandFlags::empty(),
                base + i * 4096,
                4096,
                &[],
            );
            expected.insert(cookie, pattern(100 + i, 4096));
            if i % 50 == 0 {
                let bad = c.queue(
                    &mut out,
                    Command::Read,
                    CommandFlags::empty(),
                    1 << 40,
                    4096,
                    &[],
                );
                expected.insert(bad, Vec::new());
            }
        }
        c.send(&out);
        for _ in 0..expected.len() {
            let r = c.reply();
            let want = expected.remove(&r.cookie).expect("known cookie");
            if want.is_empty() {
                assert_eq!(r.error, Some(NbdError::Invalid));
            } else {
                assert_eq!(r.error, None);
                assert!(r.data == want, "read {} differs", r.cookie);
            }
        }
        c.disconnect();
    }
    server.shutdown();
}

/// With one lane, requests execute in arrival order, commands included
/// (with more lanes that holds within each batch only, as NBD allows).
#[test]
fn one_lane_keeps_commands_in_order_relative_to_data_requests() {
    let (server, _exports) = server_with_lanes(&[("vol", 16 * MIB)], 1);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    let at = 6 * MIB;
    let data = pattern(9, EXTENT as usize);
    // WRITE, TRIM, READ, WRITE_ZEROES(NO_HOLE), WRITE, FLUSH, READ, in one send.
    let mut out = Vec::new();
    let w1 = c.queue(
        &mut out,
        Command::Write,
        CommandFlags::empty(),
        at,
        EXTENT as u32,
        &data,
    );
    let t = c.queue(
        &mut out,
        Command::Trim,
        CommandFlags::empty(),
        at,
        EXTENT as u32,
        &[],
    );
    let r1 = c.queue(
        &mut out,
        Command::Read,
        CommandFlags::empty(),
        at,
        EXTENT as u32,
        &[],
    );
    let z = c.queue(
        &mut out,
        Command::WriteZeroes,
        CommandFlags::NO_HOLE,
        at,
        4096,
        &[],
    );
    let w2 = c.queue(
        &mut out,
        Command::Write,
        CommandFlags::FUA,
        at + 4096,
        4096,
        &data[..4096],
    );
    let f = c.queue(&mut out, Command::Flush, CommandFlags::empty(), 0, 0, &[]);
    let r2 = c.queue(
        &mut out,
        Command::Read,
        CommandFlags::empty(),
        at,
        8192,
        &[],
    );
    c.send(&out);
    let mut replies = std::collections::HashMap::new();
    for _ in 0..7 {
        let r = c.reply();
        assert_eq!(r.error, None, "cookie {}", r.cookie);
        replies.insert(r.cookie, r);
    }
    for cookie in [w1, t, z, w2, f] {
        assert!(replies.contains_key(&cookie));
    }
    assert_eq!(
        replies[&r1].data,
        vec![0u8; EXTENT as usize],
        "READ after TRIM sees zeros"
    );
    let mut expected = vec![0u8; 8192];
    expected[4096..].copy_from_slice(&data[..4096]);
    assert_eq!(replies[&r2].data, expected);
    server.shutdown();
}

#[test]
fn disc_answers_requests_sent_before_it_then_closes() {
    // One lane: the READ must see the WRITE sent before it.
    let (server, exports) = server_with_lanes(&[("vol", 16 * MIB)], 1);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    assert_eq!(server.connections(), 1);
    assert_eq!(exports.open_handles("vol"), 1);
    let mut out = Vec::new();
    let data = pattern(5, 8192);
    let w = c.queue(
        &mut out,
        Command::Write,
        CommandFlags::empty(),
        0,
        8192,
        &data,
    );
    let r = c.queue(&mut out, Command::Read, CommandFlags::empty(), 0, 8192, &[]);
    c.queue(&mut out, Command::Disc, CommandFlags::empty(), 0, 0, &[]);
    c.send(&out);
    let first = c.reply();
    let second = c.reply();
    assert_eq!((first.cookie, second.cookie), (w, r));
    assert_eq!(second.data, data);
    assert!(c.server_closed());
    eventually("connection to be released", || server.connections() == 0);
    assert_eq!(
        exports.open_handles("vol"),
        0,
        "the volume handle is closed"
    );
    server.shutdown();
}

#[test]
fn client_eof_ends_the_connection_cleanly() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    assert_eq!(server.connections(), 1);
    c.hang_up();
    eventually("connection to be released", || server.connections() == 0);
    server.shutdown();
}

#[test]
fn several_connections_at_once_share_the_volume() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB), ("other", 16 * MIB)]);
    let addr = server.local_addr().expect("a TCP server");
    let threads: Vec<_> = (0..6u64)
        .map(|i| {
            std::thread::spawn(move || {
                let export = if i % 2 == 0 { "vol" } else { "other" };
                let mut c = Client::open(addr, export);
                let base = i * 2 * MIB;
                for round in 0..20u64 {
                    let data = pattern(i * 1000 + round, 16 * 1024);
                    let off = base + round * 16 * 1024;
                    c.write(off, &data, CommandFlags::empty()).expect("write");
                    assert_eq!(c.read(off, data.len() as u32).expect("read"), data);
                }
                c.flush().expect("flush");
                c
            })
        })
        .collect();
    let clients: Vec<Client> = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    assert_eq!(server.connections(), 6);
    // Multi-conn: a write on one connection is visible on another.
    let mut a = Client::open(addr, "vol");
    let mut b = Client::open(addr, "vol");
    a.write(14 * MIB, &[0x99; 4096], CommandFlags::empty())
        .expect("write");
    assert_eq!(b.read(14 * MIB, 4096).expect("read"), vec![0x99; 4096]);
    b.flush().expect("flush on the other connection");
    for c in clients {
        c.disconnect();
    }
    a.disconnect();
    b.disconnect();
    eventually("connections to be released", || server.connections() == 0);
    server.shutdown();
}

#[test]
fn shutdown_unblocks_idle_and_half_negotiated_connections() {
    let (server, exports) = server_with(&[("vol", 16 * MIB)]);
    let addr = server.local_addr().expect("a TCP server");
    let mut idle = Client::open(addr, "vol");
    let mut negotiating = Client::connect(addr); // stuck before any option
    let mut raw = std::net::TcpStream::connect(addr).expect("connect"); // never reads the greeting
    raw.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    eventually("three connections", || server.connections() == 3);
    let started = Instant::now();
    server.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(idle.server_closed());
    assert!(negotiating.server_closed());
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut raw, &mut sink);
    assert_eq!(exports.open_handles("vol"), 0);
    // The port no longer accepts NBD sessions.
    if let Ok(mut late) = std::net::TcpStream::connect(addr) {
        late.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut greeting = [0u8; 18];
        assert!(std::io::Read::read_exact(&mut late, &mut greeting).is_err());
    }
}

#[test]
fn deleted_volume_reports_eshutdown() {
    let (server, exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    c.write(0, &[1; 4096], CommandFlags::empty())
        .expect("write");
    exports.delete_volume("vol");
    assert_eq!(c.read(0, 4096), Err(NbdError::Shutdown));
    server.shutdown();
}

#[test]
fn largest_payloads_and_file_device() {
    init_logging();
    let dir = tempfile::tempdir().expect("temp dir");
    let exports = StoreExports::file(dir.path(), 96 * MIB);
    exports.add_volume("big", 40 * MIB);
    let server = NbdServer::start(
        "127.0.0.1:0".parse().expect("address"),
        Arc::clone(&exports) as Arc<dyn Exports>,
    )
    .expect("start");
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "big");
    let data = pattern(77, MAX_PAYLOAD as usize);
    c.write(MIB, &data, CommandFlags::FUA)
        .expect("32 MiB write");
    let back = c.read(MIB, MAX_PAYLOAD).expect("32 MiB read");
    assert!(back == data, "32 MiB read differs");
    c.flush().expect("flush");
    c.trim(MIB, (4 * MIB) as u32).expect("trim");
    assert_eq!(c.read(MIB, 4096).expect("read"), vec![0; 4096]);
    c.disconnect();
    server.shutdown();
}

/// A FLUSH from one connection makes the writes another connection completed
/// durable: after the simulated disk loses power, the store has them.
#[test]
fn flush_survives_power_loss_of_the_device() {
    let device = basalt_store::SimDevice::new(64 * MIB, 11);
    let exports = StoreExports::on_device(device.clone());
    exports.add_volume("vol", 16 * MIB);
    let server = NbdServer::start(
        "127.0.0.1:0".parse().unwrap(),
        exports.clone() as Arc<dyn Exports>,
    )
    .expect("start");
    let mut writer = Client::open(server.local_addr().expect("a TCP server"), "vol");
    let flushed = pattern(21, 256 * 1024);
    writer
        .write(0, &flushed, CommandFlags::empty())
        .expect("write");
    // The flush comes from another connection (multi-conn consistency).
    let mut flusher = Client::open(server.local_addr().expect("a TCP server"), "vol");
    flusher.flush().expect("flush");
    flusher.disconnect();
    writer.disconnect();
    server.shutdown();
    let id = exports.store.volumes()[0].id;
    drop(exports);
    device.crash();
    let store = basalt_store::Store::open(device).expect("reopen after power loss");
    let vol = store.volume(id).expect("volume");
    let mut back = vec![0u8; flushed.len()];
    vol.read(0, &mut back).expect("read");
    assert!(back == flushed, "flushed data lost");
}

/// Several lanes share a connection: a client that keeps many requests in
/// flight gets every reply exactly once with the right data, requests
/// still in flight on other lanes are answered before DISC closes the
/// connection, and a client vanishing mid-stream frees every lane.
#[test]
fn lanes_serve_a_pipelining_client_and_finish_cleanly() {
    for lanes in [2, 4] {
        let (server, exports) = server_with_lanes(&[("vol", 16 * MIB)], lanes);
        let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
        // Rounds of 64 writes sent in small pieces (so that lanes split
        // them into several batches), each round verified by 64 reads.
        for round in 0..8u64 {
            let mut cookies = std::collections::HashMap::new();
            for i in 0..64u64 {
                let mut out = Vec::new();
                let at = ((round * 64 + i) % 512) * 8192;
                let data = pattern(round * 1000 + i, 8192);
                let cookie = c.queue(
                    &mut out,
                    Command::Write,
                    CommandFlags::empty(),
                    at,
                    8192,
                    &data,
                );
                cookies.insert(cookie, (at, data));
                c.send(&out);
            }
            let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
            for _ in 0..64 {
                let r = c.reply();
                assert_eq!(r.error, None);
                writes.push(cookies.remove(&r.cookie).expect("each write answered once"));
            }
            assert!(cookies.is_empty());
            let mut reads = std::collections::HashMap::new();
            for (at, data) in writes {
                let mut out = Vec::new();
                let cookie = c.queue(
                    &mut out,
                    Command::Read,
                    CommandFlags::empty(),
                    at,
                    8192,
                    &[],
                );
                reads.insert(cookie, data);
                c.send(&out);
            }
            for _ in 0..64 {
                let r = c.reply();
                assert_eq!(r.error, None);
                let want = reads.remove(&r.cookie).expect("each read answered once");
                assert!(r.data == want, "lanes {lanes}: read {} differs", r.cookie);
            }
        }
        // Requests in flight, then DISC: all answered, then closed.
        let mut out = Vec::new();
        let mut pending = std::collections::HashSet::new();
        for i in 0..32u64 {
            pending.insert(c.queue(
                &mut out,
                Command::Read,
                CommandFlags::empty(),
                i * 4096,
                4096,
                &[],
            ));
        }
        c.send(&out);
        let mut out = Vec::new();
        c.queue(&mut out, Command::Disc, CommandFlags::empty(), 0, 0, &[]);
        c.send(&out);
        while !pending.is_empty() {
            let r = c.reply();
            assert!(pending.remove(&r.cookie), "unexpected cookie {}", r.cookie);
        }
        assert!(c.server_closed());
        eventually("connection to be released", || server.connections() == 0);
        assert_eq!(exports.open_handles("vol"), 0);

        // A client that vanishes with requests in flight and half a request
        // sent: every lane ends and the volume handle is released.
        let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
        let mut out = Vec::new();
        for i in 0..16u64 {
            c.queue(
                &mut out,
                Command::Write,
                CommandFlags::empty(),
                i * 4096,
                4096,
                &pattern(i, 4096),
            );
        }
        out.truncate(out.len() - 100);
        c.send(&out);
        c.hang_up();
        eventually("vanished client's connection to be released", || {
            server.connections() == 0 && exports.open_handles("vol") == 0
        });
        server.shutdown();
    }
}
