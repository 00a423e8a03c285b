//! Which guest-side addresses lead to which host sockets.
//!
//! The guest sits on QEMU's user-mode network (`10.0.2.0/24`, the guest is
//! `10.0.2.15`) with `restrict=on`: it can reach nothing but the forwards
//! listed here. Each [`Forward`] makes connections to a guest-side address
//! (by default `10.0.2.100:PORT`) arrive at a host address (normally a
//! server on 127.0.0.1 that a test started): QEMU runs the harness's relay
//! program for each connection (`guestfwd=tcp:IP:PORT-cmd:RELAY HOST`).
//!
//! Why a relay and not QEMU's built-in `guestfwd=...-tcp:HOST` chardev: that
//! chardev is one connection, opened when QEMU starts and shared by every
//! guest connection, so a second connection (multi-connection NBD, NVMe/TCP
//! admin and I/O queues) or a server that is not yet listening breaks it.
//! Why our own relay and not socat: slirp hands the command one end of a
//! loopback TCP pair whose other end has Nagle on, so without TCP_QUICKACK
//! on the relay's end (and TCP_NODELAY towards the server) every
//! multi-segment write stalls ~40 ms on a delayed ACK (`relay/main.rs`).
//!
//! A target that advertises its own address to initiators (NVMe/TCP
//! discovery) must advertise the guest-side address ([`Forward::guest`]),
//! not the 127.0.0.1 address the host sees.
//!
//! Invariants: guest-side addresses are unique, inside the user network and
//! not one of its reserved addresses (gateway, DNS, the guest itself).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;

use crate::error::{Error, Result};

/// The guest's own address.
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The default guest-side address of forwards.
pub const FORWARD_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// The user network's gateway and DNS addresses (slirp's own).
const RESERVED: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 0, 2, 2),
    Ipv4Addr::new(10, 0, 2, 3),
    GUEST_IP,
];

/// The path of the relay executable the build script compiled.
pub fn relay_path() -> &'static Path {
    Path::new(env!("BASALT_GUEST_RELAY"))
}

/// Connections from the guest to `guest` are carried to `host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    pub guest: SocketAddrV4,
    pub host: SocketAddr,
}

impl Forward {
    /// `10.0.2.100:guest_port` in the guest leads to `host`.
    pub fn new(guest_port: u16, host: SocketAddr) -> Forward {
        Forward {
            guest: SocketAddrV4::new(FORWARD_IP, guest_port),
            host,
        }
    }

    /// A forward at another guest-side address (e.g. a second target
    /// address for multipath tests: `10.0.2.101`).
    pub fn at(guest: SocketAddrV4, host: SocketAddr) -> Forward {
        Forward { guest, host }
    }
}

impl From<(u16, SocketAddr)> for Forward {
    fn from((guest_port, host): (u16, SocketAddr)) -> Forward {
        Forward::new(guest_port, host)
    }
}

/// Checks the forwards against each other and the user network.
pub fn validate(forwards: &[Forward]) -> Result<()> {
    for (i, f) in forwards.iter().enumerate() {
        let ip = f.guest.ip().octets();
        if ip[..3] != [10, 0, 2] || ip[3] == 0 || ip[3] == 255 || RESERVED.contains(f.guest.ip()) {
            return Err(Error::Config(format!(
                "forward guest address {} must be in 10.0.2.0/24 and not 10.0.2.2, .3 or .15",
                f.guest
            )));
        }
        if f.guest.port() == 0 {
            return Err(Error::Config(format!("forward {}: guest port 0", f.guest)));
        }
        if forwards[..i].iter().any(|g| g.guest == f.guest) {
            return Err(Error::Config(format!(
                "two forwards at guest address {}",
                f.guest
            )));
        }
    }
    Ok(())
}

/// Quotes a word for the shell-like parser (`g_shell_parse_argv`) slirp
/// splits the command with.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `-netdev` argument: user networking restricted to the forwards.
/// (QEMU option values escape `,` as `,,`.)
pub fn netdev_arg(forwards: &[Forward], relay: &Path) -> String {
    let mut arg = String::from("user,id=net0,net=10.0.2.0/24,restrict=on");
    for f in forwards {
        let cmd = format!(
            "{} {}",
            shell_quote(&relay.to_string_lossy()),
            shell_quote(&f.host.to_string())
        );
        arg.push_str(&format!(
            ",guestfwd=tcp:{}:{}-cmd:{}",
            f.guest.ip(),
            f.guest.port(),
            cmd.replace(',', ",,")
        ));
    }
    arg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn validate_rejects_reserved_duplicate_and_outside_addresses() {
        assert!(validate(&[Forward::new(10809, host(1)), Forward::new(4420, host(2))]).is_ok());
        assert!(validate(&[Forward::new(10809, host(1)), Forward::new(10809, host(2))]).is_err());
        for ip in [
            [10, 0, 2, 2],
            [10, 0, 2, 3],
            [10, 0, 2, 15],
            [10, 0, 3, 1],
            [127, 0, 0, 1],
        ] {
            let f = Forward::at(SocketAddrV4::new(ip.into(), 1), host(1));
            assert!(validate(&[f]).is_err(), "{ip:?}");
        }
        assert!(validate(&[Forward::new(0, host(1))]).is_err());
    }

    #[test]
    fn netdev_quotes_the_relay_command() {
        let a = netdev_arg(
            &[Forward::new(10809, host(40000))],
            Path::new("/t/a,b/relay"),
        );
        assert_eq!(
            a,
            "user,id=net0,net=10.0.2.0/24,restrict=on,guestfwd=tcp:10.0.2.100:10809-cmd:'/t/a,,b/relay' '127.0.0.1:40000'"
        );
    }

    /// The relay as slirp runs it: fds 0-2 are one end of a socket pair,
    /// the argument is the host address. Bytes go both ways, and when the
    /// host closes, the guest side sees the end and the relay exits.
    #[test]
    fn relay_carries_both_directions_and_exits_when_the_host_closes() {
        use std::io::{Read, Write};
        use std::net::TcpListener;
        use std::os::unix::net::UnixStream;
        use std::process::{Command, Stdio};

        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let (mut guest, relay_end) = UnixStream::pair().unwrap();
        let mut child = Command::new(relay_path())
            .arg(addr.to_string())
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(
                relay_end.try_clone().unwrap(),
            )))
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(
                relay_end.try_clone().unwrap(),
            )))
            .stderr(Stdio::from(std::os::fd::OwnedFd::from(relay_end)))
            .spawn()
            .unwrap();
        let (mut conn, _) = server.accept().unwrap();
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        guest.write_all(&big).unwrap();
        let mut got = vec![0u8; big.len()];
        conn.read_exact(&mut got).unwrap();
        assert!(got == big, "guest -> host bytes differ");
        conn.write_all(b"reply").unwrap();
        drop(conn);
        let mut back = Vec::new();
        guest.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"reply");
        let st = child.wait().unwrap();
        assert!(st.success(), "{st:?}");
    }

    #[test]
    fn relay_fails_when_the_host_is_not_listening() {
        use std::os::unix::net::UnixStream;
        use std::process::{Command, Stdio};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (_guest, relay_end) = UnixStream::pair().unwrap();
        let st = Command::new(relay_path())
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(relay_end)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(1));
    }
}
