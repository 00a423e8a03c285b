//! Connections on event loops, stressed: many connections per loop on a
//! data file (so reads and writes go through the loops' rings), mixed
//! sizes including unaligned ones (run on the offload pool), pipelined,
//! flushes and FUA among them, and clients that vanish mid-request. Every
//! request is answered exactly once with the right data, vanished clients
//! release everything they held, and the server stops cleanly. Once on a
//! volume of the store (the loops' rings do its I/O), once on a volume
//! whose I/O completes on other threads (a replicated volume's path).

mod common;

use basalt_frontend_nbd::ServerLimits;
use basalt_nbd_wire::*;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

/// Bytes of the volume each connection owns.
const REGION: u64 = 256 * 1024;
const CONNECTIONS: u64 = 256;
const THREADS: u64 = 16;

/// A seeded generator, so a failure can be replayed.
struct Rng(StdRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.gen_range(0..n)
    }
}

/// One connection: rounds of pipelined writes of mixed sizes (some FUA,
/// half not 4 KiB-aligned, a FLUSH among them), then reads of its whole
/// region checked against a model of what it wrote.
struct Session {
    client: Client,
    rng: Rng,
    seed: u64,
    base: u64,
    model: Vec<u8>,
    /// Requests sent and not answered yet.
    expect: HashMap<u64, Command>,
}

impl Session {
    fn open(addr: SocketAddr, region: u64) -> Session {
        Session {
            client: Client::open(addr, "vol"),
            rng: Rng::new(region),
            seed: region,
            base: region * REGION,
            model: vec![0u8; REGION as usize],
            expect: HashMap::new(),
        }
    }

    /// Sends one round of writes and a FLUSH, in uneven pieces so that
    /// payloads straddle the server's receive boundaries.
    fn send_round(&mut self, round: u64) {
        let mut out = Vec::new();
        // Writes in flight together have no order in NBD: keep them
        // disjoint so the model knows what the region holds.
        let mut written: Vec<(u64, u64)> = Vec::new();
        for _ in 0..24 {
            let len = if self.rng.below(2) == 0 {
                (1 + self.rng.below(16)) * 4096
            } else {
                (1 + self.rng.below(128)) * 512
            };
            let at = self.rng.below((REGION - len) / 512) * 512;
            if written.iter().any(|&(a, l)| at < a + l && a < at + len) {
                continue;
            }
            written.push((at, len));
            let data = pattern(self.seed ^ (round << 32) ^ at, len as usize);
            let flags = if self.rng.below(8) == 0 {
                CommandFlags::FUA
            } else {
                CommandFlags::empty()
            };
            let cookie = self.client.queue(
                &mut out,
                Command::Write,
                flags,
                self.base + at,
                len as u32,
                &data,
            );
            self.model[at as usize..(at + len) as usize].copy_from_slice(&data);
            self.expect.insert(cookie, Command::Write);
        }
        let flush = self
            .client
            .queue(&mut out, Command::Flush, CommandFlags::empty(), 0, 0, &[]);
        self.expect.insert(flush, Command::Flush);
        let piece = 1 + self.rng.below(9000) as usize;
        for chunk in out.chunks(piece) {
            self.client.send(chunk);
        }
    }

    /// Reads every reply of the round: each request answered exactly once.
    fn collect_round(&mut self) {
        while !self.expect.is_empty() {
            let r = self.client.reply();
            assert_eq!(r.error, None, "seed {}: {:?}", self.seed, r.message);
            assert!(
                self.expect.remove(&r.cookie).is_some(),
                "seed {}: reply to an unknown or already answered request {}",
                self.seed,
                r.cookie
            );
        }
    }

    /// Reads the whole region back in pipelined 32 KiB reads.
    fn verify(mut self) {
        let mut out = Vec::new();
        let mut reads = HashMap::new();
        for k in 0..REGION / 32768 {
            let cookie = self.client.queue(
                &mut out,
                Command::Read,
                CommandFlags::empty(),
                self.base + k * 32768,
                32768,
                &[],
            );
            reads.insert(cookie, k as usize);
        }
        self.client.send(&out);
        for _ in 0..reads.len() {
            let r = self.client.reply();
            assert_eq!(r.error, None);
            let k = reads.remove(&r.cookie).expect("each read answered once");
            assert!(
                r.data[..] == self.model[k * 32768..(k + 1) * 32768],
                "seed {}: block {k} of the region differs",
                self.seed
            );
        }
        self.client.disconnect();
    }
}

/// A client that vanishes: sends requests (the last WRITE cut off in the
/// middle of its payload) and closes without reading a reply. It works in
/// a region of its own: the server may still be executing its requests
/// when the others run, and NBD orders nothing across connections.
fn vanish(addr: SocketAddr, region: u64) {
    let mut rng = Rng::new(1000 + region);
    let mut c = Client::open(addr, "vol");
    let base = region * REGION;
    let mut out = Vec::new();
    for _ in 0..16 {
        let len = (1 + rng.below(16)) * 4096;
        let at = rng.below((REGION - len) / 4096) * 4096;
        if rng.below(2) == 0 {
            c.queue(
                &mut out,
                Command::Read,
                CommandFlags::empty(),
                base + at,
                len as u32,
                &[],
            );
        } else {
            let data = pattern(region, len as usize);
            c.queue(
                &mut out,
                Command::Write,
                CommandFlags::empty(),
                base + at,
                len as u32,
                &data,
            );
        }
    }
    let data = pattern(region, 65536);
    c.queue(
        &mut out,
        Command::Write,
        CommandFlags::empty(),
        base,
        65536,
        &data,
    );
    let cut = out.len() - 30_000;
    let _ = c.stream.write_all(&out[..cut]);
    // Dropping the client closes the socket with requests in flight.
}

#[test]
fn many_connections_per_loop_answer_every_request_once() {
    init_logging();
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = StoreExports::file(dir.path(), 256 * MIB);
    stress(exports);
}

/// The same stress on a volume whose reads and writes complete on other
/// threads than the loops' (a replicated volume's path): every request
/// answered once, with the right data, and nothing held after.
#[test]
fn many_connections_per_loop_on_a_relayed_volume_answer_every_request_once() {
    init_logging();
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = StoreExports::file(dir.path(), 256 * MIB);
    *exports.relay.lock() = Some(Box::new(common::relayed::Relayed::over));
    stress(exports);
}

fn stress(exports: Arc<StoreExports>) {
    // Regions 0..CONNECTIONS for the sessions, then one per vanishing client.
    exports.add_volume("vol", (CONNECTIONS + CONNECTIONS / 8) * REGION);
    let server = basalt_frontend_nbd::NbdServer::start_with_limits(
        "127.0.0.1:0".parse().expect("address"),
        Arc::clone(&exports) as Arc<dyn basalt_frontend_nbd::Exports>,
        ServerLimits {
            event_loops: 2,
            max_connections_per_address: 1024,
            ..ServerLimits::default()
        },
    )
    .expect("start server");
    let addr = server.local_addr().expect("a TCP server");
    // Each thread holds its share of the connections open at once, all of
    // them with requests in flight together, round after round.
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let regions = t * (CONNECTIONS / THREADS)..(t + 1) * (CONNECTIONS / THREADS);
                // Every eighth connection is first a client that vanishes.
                for region in regions.clone().filter(|r| r % 8 == 3) {
                    vanish(addr, CONNECTIONS + region / 8);
                }
                let mut sessions: Vec<Session> =
                    regions.map(|region| Session::open(addr, region)).collect();
                for round in 0..4 {
                    for s in &mut sessions {
                        s.send_round(round);
                    }
                    for s in &mut sessions {
                        s.collect_round();
                    }
                }
                for s in sessions {
                    s.verify();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("client thread");
    }
    eventually("every connection to end", || server.connections() == 0);
    eventually("every handle to be released", || {
        exports.open_handles("vol") == 0
    });
    server.shutdown();
}
