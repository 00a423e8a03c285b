//! Connections under attack: a flood of idle connections from one address
//! does not lock out clients from another address (NBD and NVMe/TCP), and
//! a client that stalls in the NBD handshake is closed after the handshake
//! timeout, while a negotiated connection may idle, before its first
//! request too (the kernel's `nbd-client -C N` opens such connections). A
//! client that vanishes without closing is found dead by the kernel: every
//! frontend's accepted sockets carry keepalive probes (seen by `ss`).

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A TCP connection to `to` from source address `from` (any loopback
/// address works as a source on Linux).
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    // SAFETY: plain socket calls on a descriptor this function owns; it is
    // handed to TcpStream (which closes it) or closed on every error path.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let ip: std::net::Ipv4Addr = from.parse().expect("an IPv4 address");
        let bind_to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        if libc::bind(
            fd,
            (&bind_to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        let SocketAddr::V4(to) = to else {
            panic!("IPv4 only")
        };
        let dest = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: to.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*to.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        if libc::connect(
            fd,
            (&dest as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// Whether the server serves this connection: it sends its first bytes
/// (NBD's greeting), or at least does not close it (NVMe/TCP waits for the
/// host's ICReq), within `wait`.
fn served(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).expect("timeout");
    let mut buf = [0u8; 8];
    match stream.read(&mut buf) {
        Ok(0) => false,
        Ok(_) => true,
        // Nothing yet and not closed: held open.
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Opens `n` idle connections from `from`; returns those the server kept.
fn flood(from: &str, to: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut kept = Vec::new();
    for _ in 0..n {
        let Ok(mut s) = connect_from(from, to) else {
            continue;
        };
        if served(&mut s, Duration::from_millis(200)) {
            kept.push(s);
        }
    }
    kept
}

#[test]
fn a_flood_from_one_address_does_not_lock_out_another() {
    let s = Server::start_with("64M", &["--max-connections-per-address", "64"]);
    s.create_volume("v", "16M");
    let nbd: SocketAddr = s.nbd_addr().parse().expect("NBD address");
    let started = Instant::now();
    let kept = flood("127.0.0.1", nbd, 1100);
    assert_eq!(
        kept.len(),
        64,
        "the flooding address keeps its limit and no more"
    );
    // Another address still gets in, as a real client.
    let mut other = connect_from("127.0.0.2", nbd).expect("connect");
    assert!(
        served(&mut other, Duration::from_secs(5)),
        "NBD greeting for another address during the flood"
    );
    drop(other);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "checked while the flood's connections are still inside the handshake timeout"
    );
    let log = s.log();
    assert!(
        log.contains("this address's connection limit is reached") && !log.contains("refused=11 "),
        "refusals are logged per order of magnitude: {}",
        log.lines()
            .filter(|l| l.contains("refused"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(kept);

    // NVMe/TCP: the same limit per address.
    let nvme = s.nvme_addr();
    let kept = flood("127.0.0.1", nvme, 300);
    assert_eq!(kept.len(), 64);
    let mut other = connect_from("127.0.0.2", nvme).expect("connect");
    assert!(served(&mut other, Duration::from_millis(500)));
}

#[test]
fn nbd_handshakes_time_out_and_negotiated_connections_may_idle() {
    let s = Server::start_with("64M", &["--handshake-timeout", "2"]);
    s.create_volume("v", "16M");
    let uri = s.uri("v");
    // Stalls before negotiating: the server closes it.
    let nbd: SocketAddr = s.nbd_addr().parse().expect("NBD address");
    let mut stalled = TcpStream::connect(nbd).expect("connect");
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut greeting = [0u8; 18];
    stalled.read_exact(&mut greeting).expect("the NBD greeting");
    let mut rest = [0u8; 1];
    assert_eq!(
        stalled.read(&mut rest).expect("closed, not timed out"),
        0,
        "the server closes a handshake that stalls"
    );
    // Negotiates, then idles past the handshake timeout before its first
    // request (as the kernel's client's extra connections do), and after
    // one: served both times (no keep-alive in NBD: a VM's disk is idle for
    // hours).
    let idle = Command::new(python_nbd())
        .args([
            "-c",
            "import nbd, sys, time\n\
             h = nbd.NBD(); h.connect_uri(sys.argv[1])\n\
             time.sleep(4)\n\
             h.pread(4096, 0)\n\
             time.sleep(4)\n\
             h.pread(4096, 0); print('served')\n",
            &uri,
        ])
        .output()
        .expect("python3 with nbd");
    assert_eq!(
        String::from_utf8_lossy(&idle.stdout).trim(),
        "served",
        "{}",
        String::from_utf8_lossy(&idle.stderr)
    );
}

/// The keepalive timer `ss` reports for the server's end of every
/// established connection to `port`, e.g. `keepalive,29sec,0`.
fn keepalive_timers(port: u16) -> Vec<String> {
    let out = tool(
        "ss",
        [
            "-tnoH",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ],
    );
    out.ok();
    out.stdout
        .lines()
        .map(|l| {
            l.split("timer:(")
                .nth(1)
                .and_then(|t| t.split(')').next())
                .unwrap_or("none")
                .to_string()
        })
        .collect()
}

#[test]
fn every_frontend_probes_idle_clients_for_dead_peers() {
    require_tool("ss");
    let s = Server::start("64M");
    let nbd: SocketAddr = s.nbd_addr().parse().expect("NBD address");
    for addr in [nbd, s.nvme_addr(), s.iscsi_addr()] {
        let client = TcpStream::connect(addr).expect("connect");
        // The server's socket exists once accepted; its timer then runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        let timers = loop {
            let timers = keepalive_timers(addr.port());
            if !timers.is_empty() || Instant::now() > deadline {
                break timers;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(timers.len(), 1, "{addr}: {timers:?}");
        let seconds: f64 = timers[0]
            .strip_prefix("keepalive,")
            .and_then(|t| t.split("sec").next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{addr}: no keepalive timer: {timers:?}"));
        assert!(
            (20.0..=30.0).contains(&seconds),
            "{addr}: first probe in {seconds} s"
        );
        drop(client);
    }
}
