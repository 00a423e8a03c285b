//! The peer transport on loopback: every message kind in order between two
//! and three nodes, batches bigger than the socket takes at once, reconnection to a restarted peer, refusal of other
//! clusters and wrong nodes, garbage closing only its own connection, the
//! full-queue drop counter, and shutdown joining every thread.

use basalt_cluster::peer::{PeerConfig, PeerHandler, PeerNet, PeerStats};
use basalt_cluster::secret::ClusterSecret;
use basalt_replication::{
    ClientReply, ClientReq, Epoch, LayerId, Msg, NodeId, Prior, ReplOp, VolumeId,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLUSTER: [u8; 16] = *b"basalt-test-clus";
const VOL: VolumeId = VolumeId(0xfeed);

#[derive(Default)]
struct Inbox {
    got: Mutex<Vec<(NodeId, VolumeId, Msg)>>,
    /// Messages still to be taken slowly (a stalled receiver, so that the
    /// sender's socket fills up).
    slow: std::sync::atomic::AtomicUsize,
}

impl PeerHandler for Inbox {
    fn on_message(&self, from: NodeId, vol: VolumeId, msg: Msg) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.slow.load(SeqCst) > 0 {
            self.slow.fetch_sub(1, SeqCst);
            std::thread::sleep(Duration::from_millis(2));
        }
        self.got.lock().unwrap().push((from, vol, msg));
    }
}

impl Inbox {
    fn from(&self, node: NodeId) -> Vec<Msg> {
        let got = self.got.lock().unwrap();
        got.iter()
            .filter(|(f, _, _)| *f == node)
            .map(|(_, _, m)| m.clone())
            .collect()
    }

    fn len(&self) -> usize {
        self.got.lock().unwrap().len()
    }
}

fn config(me: u32, cluster: [u8; 16]) -> PeerConfig {
    PeerConfig {
        cluster,
        secret: ClusterSecret::from_bytes([0x5e; 32]),
        me: NodeId(me),
        boot: 1000 + u64::from(me),
        listen: "127.0.0.1:0".parse().unwrap(),
        connect_timeout: Duration::from_secs(2),
        max_queue_bytes: 64 << 20,
    }
}

fn node(me: u32) -> (PeerNet, Arc<Inbox>) {
    let inbox = Arc::new(Inbox::default());
    let net = PeerNet::start(config(me, CLUSTER), inbox.clone()).unwrap();
    (net, inbox)
}

/// Nodes 1 and 2, each knowing the other's address.
fn pair() -> ((PeerNet, Arc<Inbox>), (PeerNet, Arc<Inbox>)) {
    let (a, b) = (node(1), node(2));
    a.0.set_peer_addr(NodeId(2), b.0.local_addr());
    b.0.set_peer_addr(NodeId(1), a.0.local_addr());
    (a, b)
}

/// Polls `cond` until it holds; panics after a generous deadline.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One of every peer message kind, with `tag` in the numbers, including a
/// 1 MiB write.
fn every_kind(tag: u64) -> Vec<Msg> {
    let big: Vec<u8> = (0..1 << 20).map(|i| (i as u64 * 7 + tag) as u8).collect();
    vec![
        Msg::Repl {
            vol: VOL,
            epoch: Epoch(tag),
            session: 1,
            lseq: 0,
            vseq: tag,
            commit: tag,
            floor: 0,
            op: ReplOp::Start,
        },
        Msg::Repl {
            vol: VOL,
            epoch: Epoch(tag),
            session: 1,
            lseq: 1,
            vseq: tag + 1,
            commit: tag,
            floor: tag,
            op: ReplOp::Write {
                lba: 8,
                data: big.clone().into(),
                fua: true,
            },
        },
        Msg::Repl {
            vol: VOL,
            epoch: Epoch(tag),
            session: 1,
            lseq: 2,
            vseq: tag + 2,
            commit: tag + 1,
            floor: tag,
            op: ReplOp::Flush,
        },
        Msg::ReplStarted {
            vol: VOL,
            epoch: Epoch(tag),
            session: 1,
            prior: Some(Prior {
                epoch: Epoch(tag.max(1)),
                synced: tag,
                regions: vec![1, 5, 9],
            }),
            layers: vec![LayerId(u128::from(tag) << 64 | 7)],
        },
        Msg::ReplAck {
            vol: VOL,
            epoch: Epoch(tag),
            session: 1,
            lseq: 2,
        },
        Msg::Fenced {
            vol: VOL,
            epoch: Epoch(tag + 1),
        },
        Msg::Heartbeat {
            boot: tag,
            sent_at: 5,
        },
        Msg::HeartbeatAck {
            sent_at: 5,
            vol: VOL,
            epoch: Epoch(tag),
            primary: NodeId(1),
            lease_ms: 1500,
        },
        Msg::ClientReq {
            id: tag,
            req: ClientReq::Write {
                lba: 0,
                data: vec![tag as u8; 4096].into(),
                fua: false,
            },
        },
        Msg::ClientReq {
            id: tag + 1,
            req: ClientReq::Flush,
        },
        Msg::ClientReq {
            id: tag + 2,
            req: ClientReq::Read { lba: 3, blocks: 2 },
        },
        Msg::ClientReply {
            id: tag,
            reply: ClientReply::Ok {
                by: NodeId(1),
                epoch: Epoch(tag),
                data: Some(big),
            },
        },
        Msg::ClientReply {
            id: tag + 1,
            reply: ClientReply::Ok {
                by: NodeId(1),
                epoch: Epoch(tag),
                data: None,
            },
        },
        Msg::ClientReply {
            id: tag + 2,
            reply: ClientReply::NotPrimary,
        },
    ]
}

#[test]
fn two_nodes_exchange_every_kind_in_order() {
    let ((a, a_in), (b, b_in)) = pair();
    let (to_b, to_a) = (every_kind(10), every_kind(20));
    for _ in 0..3 {
        for m in &to_b {
            a.send(NodeId(2), VOL, m.clone());
        }
        for m in &to_a {
            b.send(NodeId(1), VOL, m.clone());
        }
    }
    let want_b: Vec<Msg> = to_b.iter().cycle().take(3 * to_b.len()).cloned().collect();
    let want_a: Vec<Msg> = to_a.iter().cycle().take(3 * to_a.len()).cloned().collect();
    wait_until("all frames", || {
        b_in.len() == want_b.len() && a_in.len() == want_a.len()
    });
    assert_eq!(b_in.from(NodeId(1)), want_b);
    assert_eq!(a_in.from(NodeId(2)), want_a);
    assert!(b_in.got.lock().unwrap().iter().all(|(_, v, _)| *v == VOL));

    let s = a.stats();
    assert_eq!(s.frames_sent, want_b.len() as u64);
    assert_eq!(s.frames_received, want_a.len() as u64);
    assert_eq!((s.frames_dropped, s.connects, s.accepts), (0, 1, 1));
    assert!(s.bytes_sent > 6 << 20);
    assert!(s.peers[&NodeId(2)].connected);
    a.shutdown();
    b.shutdown();
}

/// A write of `len` bytes tagged `n` (in its lba and its first bytes).
fn tagged_write(n: u64, len: usize) -> Msg {
    let mut data = vec![(n % 251) as u8; len];
    data[..8].copy_from_slice(&n.to_le_bytes());
    Msg::Repl {
        vol: VOL,
        epoch: Epoch(1),
        session: 1,
        lseq: n,
        vseq: n,
        commit: 0,
        floor: 0,
        op: ReplOp::Write {
            lba: n,
            data: data.into(),
            fua: false,
        },
    }
}

#[test]
fn batches_larger_than_the_socket_arrive_whole_and_in_order() {
    let ((a, _a_in), (b, b_in)) = pair();
    // Connect first, so the batches take the direct path.
    a.send(NodeId(2), VOL, tagged_write(0, 4096));
    wait_until("the connection", || b_in.len() == 1);
    b_in.slow.store(200, std::sync::atomic::Ordering::SeqCst);
    // Batches of 300 frames (more than one sendmsg) of up to 64 KiB: the
    // socket takes part of a batch, the rest queues behind the tail of
    // the frame it stopped in.
    let mut want = vec![tagged_write(0, 4096)];
    for round in 0..6u64 {
        // Tags: 301 per round (300 in the batch, then a single one).
        let first = 1 + round * 301;
        let batch: Vec<Msg> = (0..300)
            .map(|i| {
                let len = if (i + round) % 7 == 0 { 65536 } else { 4096 };
                tagged_write(first + i, len)
            })
            .collect();
        want.extend(batch.iter().cloned());
        a.send_batch(NodeId(2), VOL, batch);
        // Single sends in between go after the whole batch.
        let m = tagged_write(first + 300, 512);
        want.push(m.clone());
        a.send(NodeId(2), VOL, m);
    }
    wait_until("every frame", || b_in.len() == want.len());
    assert!(
        b_in.from(NodeId(1)) == want,
        "frames lost, changed or reordered"
    );
    let s = a.stats();
    assert_eq!(s.frames_sent, want.len() as u64);
    assert_eq!(s.frames_dropped, 0);
    a.shutdown();
    b.shutdown();
}

#[test]
fn three_nodes_all_to_all() {
    let nodes: Vec<_> = (1..=3).map(node).collect();
    for (net, _) in &nodes {
        for (i, (other, _)) in nodes.iter().enumerate() {
            net.set_peer_addr(NodeId(i as u32 + 1), other.local_addr());
        }
    }
    for (i, (net, _)) in nodes.iter().enumerate() {
        let me = i as u32 + 1;
        for to in (1..=3).filter(|n| *n != me) {
            for m in every_kind(u64::from(me * 100)) {
                net.send(NodeId(to), VOL, m);
            }
        }
        // To itself: dropped and counted, never delivered.
        net.send(NodeId(me), VOL, every_kind(0).remove(0));
        assert_eq!(net.stats().frames_dropped, 1);
    }
    let per_sender = every_kind(0).len();
    for (_, inbox) in &nodes {
        wait_until("all frames", || inbox.len() == 2 * per_sender);
    }
    for (i, (_, inbox)) in nodes.iter().enumerate() {
        let me = i as u32 + 1;
        for from in (1..=3).filter(|n| *n != me) {
            assert_eq!(inbox.from(NodeId(from)), every_kind(u64::from(from * 100)));
        }
    }
}

#[test]
fn unknown_peer_and_meta_messages_are_dropped() {
    let (a, _) = node(1);
    a.send(
        NodeId(9),
        VOL,
        Msg::Fenced {
            vol: VOL,
            epoch: Epoch(1),
        },
    );
    a.send(NodeId(9), VOL, Msg::MetaGet { vol: VOL });
    assert_eq!(a.stats().frames_dropped, 2);
}

#[test]
fn restarted_peer_is_reached_again() {
    let (a, _) = node(1);
    let (b, b_in) = node(2);
    let addr = b.local_addr();
    a.set_peer_addr(NodeId(2), addr);
    let hb = |n: u64| Msg::Heartbeat {
        boot: 1,
        sent_at: n,
    };
    a.send(NodeId(2), VOL, hb(0));
    wait_until("first frame", || b_in.len() == 1);
    b.shutdown();
    drop(b);

    let b_in = Arc::new(Inbox::default());
    let mut cfg = config(2, CLUSTER);
    cfg.listen = addr;
    cfg.boot = 77;
    let b = PeerNet::start(cfg, b_in.clone()).unwrap();
    // Frames handed to the dead connection may be lost; keep sending (as
    // the protocol retransmits) until they flow again.
    let mut n = 1;
    wait_until("frames after restart", || {
        a.send(NodeId(2), VOL, hb(n));
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
        b_in.len() > 0
    });
    for _ in 0..100 {
        a.send(NodeId(2), VOL, hb(n));
        n += 1;
    }
    wait_until("the rest", || {
        b_in.from(NodeId(1)).last() == Some(&hb(n - 1))
    });
    // In order, no duplicates: strictly increasing.
    let got: Vec<u64> = b_in
        .from(NodeId(1))
        .iter()
        .map(|m| match m {
            Msg::Heartbeat { sent_at, .. } => *sent_at,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    // Once the new connection stands, nothing is lost.
    assert_eq!(got[got.len() - 100..], (n - 100..n).collect::<Vec<_>>()[..]);
    assert!(a.stats().connects >= 2);
    b.shutdown();
}

/// Node 1 (of this test's cluster) and `other` (node 2, configured with
/// `cfg`) each send the other a frame; both must refuse the connection and
/// neither may take a frame. Returns node 1 and its inbox.
fn assert_refused_both_ways(cfg: PeerConfig) -> (PeerNet, Arc<Inbox>) {
    let (a, a_in) = node(1);
    let other_in = Arc::new(Inbox::default());
    let other = PeerNet::start(cfg, other_in.clone()).unwrap();
    other.set_peer_addr(NodeId(1), a.local_addr());
    a.set_peer_addr(NodeId(2), other.local_addr());
    for (from, to, epoch) in [(&other, NodeId(1), 1), (&a, NodeId(2), 2)] {
        from.send(
            to,
            VOL,
            Msg::Fenced {
                vol: VOL,
                epoch: Epoch(epoch),
            },
        );
    }
    wait_until("both refusals", || {
        a.stats().protocol_errors >= 1 && other.stats().protocol_errors >= 1
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a_in.len() + other_in.len(), 0);
    for s in [a.stats(), other.stats()] {
        assert_eq!((s.connects, s.accepts, s.frames_sent), (0, 0, 0));
    }
    (a, a_in)
}

#[test]
fn another_cluster_is_refused_both_ways() {
    assert_refused_both_ways(config(2, *b"another-cluster!"));
}

#[test]
fn a_node_without_the_cluster_secret_is_refused_both_ways() {
    // Same cluster id (anyone who can read etcd knows it), another secret.
    let (a, a_in) = assert_refused_both_ways(PeerConfig {
        secret: ClusterSecret::from_bytes([0x11; 32]),
        ..config(2, CLUSTER)
    });

    // A raw client that knows the cluster id: its Hello is answered, but
    // without the secret its Auth is refused and nothing it sends is taken.
    let mut raw = TcpStream::connect(a.local_addr()).unwrap();
    raw.write_all(&hello_bytes(5)).unwrap();
    let mut frames = Vec::new();
    for frame in [
        basalt_peer_wire::Frame::Auth { proof: [0; 32] },
        basalt_peer_wire::Frame::Msg {
            vol: VOL,
            msg: Msg::Heartbeat {
                boot: 1,
                sent_at: 2,
            },
        },
    ] {
        basalt_peer_wire::encode(&frame, &mut frames).unwrap();
    }
    raw.write_all(&frames).unwrap();
    assert_closed_by_server(raw);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(a_in.len(), 0);
}

#[test]
fn dialer_checks_the_node_id() {
    let (a, _) = node(1);
    let (b, b_in) = node(2);
    // A believes node 3 listens where node 2 does.
    a.set_peer_addr(NodeId(3), b.local_addr());
    a.send(
        NodeId(3),
        VOL,
        Msg::Fenced {
            vol: VOL,
            epoch: Epoch(1),
        },
    );
    wait_until("refusal", || a.stats().protocol_errors >= 1);
    assert_eq!(a.stats().connects, 0);
    assert_eq!(b_in.len(), 0);
}

fn hello_bytes(node: u32) -> Vec<u8> {
    let mut out = Vec::new();
    basalt_peer_wire::encode(
        &basalt_peer_wire::Frame::Hello {
            cluster: CLUSTER,
            node: NodeId(node),
            boot: 5,
            nonce: [9; 16],
            proof: [0; 32],
        },
        &mut out,
    )
    .unwrap();
    out
}

/// Reads until the server closes the connection; panics if it does not.
fn assert_closed_by_server(mut raw: TcpStream) {
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match raw.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {} // the server's Hello
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("connection not closed: {e}"),
        }
    }
}

#[test]
fn garbage_closes_only_its_connection() {
    let (a, a_in) = node(1);
    let (b, _) = node(2);
    b.set_peer_addr(NodeId(1), a.local_addr());
    b.send(
        NodeId(1),
        VOL,
        Msg::Heartbeat {
            boot: 1,
            sent_at: 1,
        },
    );
    wait_until("first frame", || a_in.len() == 1);

    // Garbage instead of a Hello.
    let mut raw = TcpStream::connect(a.local_addr()).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_closed_by_server(raw);

    // A valid Hello, then a frame with a corrupt payload.
    let mut raw = TcpStream::connect(a.local_addr()).unwrap();
    raw.write_all(&hello_bytes(5)).unwrap();
    let mut frame = Vec::new();
    basalt_peer_wire::encode(
        &basalt_peer_wire::Frame::Msg {
            vol: VOL,
            msg: Msg::Heartbeat {
                boot: 1,
                sent_at: 2,
            },
        },
        &mut frame,
    )
    .unwrap();
    let last = frame.len() - 1;
    frame[last] ^= 0x40;
    raw.write_all(&frame).unwrap();
    assert_closed_by_server(raw);
    wait_until("errors counted", || a.stats().protocol_errors == 2);

    // The good connection still works.
    b.send(
        NodeId(1),
        VOL,
        Msg::Heartbeat {
            boot: 1,
            sent_at: 3,
        },
    );
    wait_until("frame after garbage", || a_in.len() == 2);
    assert_eq!(a_in.from(NodeId(5)), vec![]);
    assert_eq!(b.stats().connects, 1);
}

/// An address where nothing listens.
fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[test]
fn full_queue_drops_and_counts_while_destination_is_down() {
    let inbox = Arc::new(Inbox::default());
    let mut cfg = config(1, CLUSTER);
    cfg.max_queue_bytes = 100 << 10;
    let a = PeerNet::start(cfg, inbox).unwrap();
    a.set_peer_addr(NodeId(2), dead_addr());
    let write = Msg::Repl {
        vol: VOL,
        epoch: Epoch(1),
        session: 1,
        lseq: 1,
        vseq: 1,
        commit: 0,
        floor: 0,
        op: ReplOp::Write {
            lba: 0,
            data: vec![0; 10 << 10].into(),
            fua: false,
        },
    };
    for _ in 0..20 {
        a.send(NodeId(2), VOL, write.clone());
    }
    let s: PeerStats = a.stats();
    let link = &s.peers[&NodeId(2)];
    assert!(!link.connected);
    // About 10 KiB each: 9 fit in 100 KiB, the other 11 are dropped.
    assert_eq!(link.queued_frames, 9);
    assert!(link.queued_bytes <= 100 << 10);
    assert_eq!(s.dropped_queue_full, 11);
    assert_eq!(s.frames_dropped, 11);
    assert_eq!(link.dropped, 11);
    a.shutdown();
    // Still queued at shutdown: dropped too.
    assert_eq!(a.stats().frames_dropped, 20);
}

#[test]
fn shutdown_joins_every_thread() {
    let (a, a_in) = node(1);
    let (b, _) = node(2);
    b.set_peer_addr(NodeId(1), a.local_addr());
    a.set_peer_addr(NodeId(2), b.local_addr());
    a.set_peer_addr(NodeId(3), dead_addr()); // a writer in backoff
    a.send(
        NodeId(3),
        VOL,
        Msg::Heartbeat {
            boot: 1,
            sent_at: 1,
        },
    );
    a.send(
        NodeId(2),
        VOL,
        Msg::Heartbeat {
            boot: 1,
            sent_at: 1,
        },
    );
    b.send(
        NodeId(1),
        VOL,
        Msg::Heartbeat {
            boot: 1,
            sent_at: 1,
        },
    );
    wait_until("traffic", || {
        a_in.len() == 1 && b.stats().frames_received == 1
    });
    // An idle inbound connection whose reader is blocked in read() (it
    // waits for the Auth the raw client never sends).
    let mut raw = TcpStream::connect(a.local_addr()).unwrap();
    raw.write_all(&hello_bytes(4)).unwrap();
    let mut reply = [0u8; 20];
    raw.read_exact(&mut reply).unwrap();

    let addr = a.local_addr();
    let started = Instant::now();
    a.shutdown();
    assert!(started.elapsed() < Duration::from_secs(10));
    // Every thread held a reference to the handler; joined, they let go.
    drop(a);
    assert_eq!(Arc::strong_count(&a_in), 1);
    assert!(TcpStream::connect(addr).is_err(), "listener still open");
    assert_closed_by_server(raw);
    // Sends after shutdown are dropped, not queued.
    b.shutdown();
    b.send(
        NodeId(1),
        VOL,
        Msg::Heartbeat {
            boot: 1,
            sent_at: 2,
        },
    );
    assert!(b.stats().frames_dropped >= 1);
}
