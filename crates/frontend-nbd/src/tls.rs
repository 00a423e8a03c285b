//! NBD over TLS with pre-shared keys: the protocol's `NBD_OPT_STARTTLS`, as
//! qemu (`tls-creds-psk`) and libnbd (`nbds://…?tls-psk-file=`) speak it.
//!
//! Shape: the TLS session is accepted on the connection's handshake thread
//! (OpenSSL: rustls has no external pre-shared keys); then a pump thread
//! carries bytes between it and one end of a Unix socket pair, and the
//! server goes on with the other end as with any local client. So the rest
//! of the frontend (option haggling, lanes, event loops) never sees TLS,
//! and a TLS connection costs one pump thread and a copy each way.
//!
//! Invariants:
//! - A key is looked up at every TLS handshake ([`PskKeys`]): a revoked key
//!   admits no new connection. An unknown identity fails the handshake; no
//!   session is made without a key.
//! - What the client may see ([`Scope`]) comes from the key it proved it
//!   holds, never from anything it sends.
//! - Only TLS 1.2 or newer, with authenticated encryption (AES-GCM,
//!   ChaCha20-Poly1305).
//! - The pump ends when either side closes or fails, and then closes both:
//!   a shut-down TCP socket (server stop, `volume disconnect`) ends the
//!   plaintext side, which ends the connection.

use crate::Scope;
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslStream, SslVersion,
};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes the pump moves per read, each way.
const PUMP_BUFFER: usize = 256 * 1024;

// TLS 1.2 suites with a pre-shared key and authenticated encryption (TLS
// 1.3 suites are all of that kind).
use basalt_nbd_wire::TLS_PSK_CIPHERS as TLS12_PSK_CIPHERS;

/// A pre-shared key and what it opens.
#[derive(Clone, Debug)]
pub struct PskKey {
    pub key: Vec<u8>,
    pub scope: Scope,
}

/// Where the server finds the key of a PSK identity.
pub trait PskKeys: Send + Sync + 'static {
    /// The key of `identity`, or `None` if there is no such identity.
    fn key(&self, identity: &str) -> Option<PskKey>;
}

/// The TLS side of a listener that requires TLS.
pub struct TlsPsk {
    context: SslContext,
    /// Set by the key callback: the scope and identity of the key used
    /// (OpenSSL does not report the identity of a TLS 1.3 PSK session).
    client: Index<Ssl, (Scope, String)>,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPsk").finish_non_exhaustive()
    }
}

/// A TLS session accepted for one connection.
pub(crate) struct TlsSession {
    /// The server's end of the plaintext socket pair.
    pub plain: UnixStream,
    pub scope: Scope,
    pub identity: String,
    /// The thread carrying bytes between TLS and `plain`.
    pub pump: JoinHandle<()>,
}

impl TlsPsk {
    /// A TLS acceptor whose keys come from `keys`.
    pub fn new(keys: Arc<dyn PskKeys>) -> Result<TlsPsk, ErrorStack> {
        let client = Ssl::new_ex_index::<(Scope, String)>()?;
        let mut builder = SslContextBuilder::new(SslMethod::tls_server())?;
        builder.set_min_proto_version(Some(SslVersion::TLS1_2))?;
        builder.set_cipher_list(TLS12_PSK_CIPHERS)?;
        builder.set_psk_server_callback(move |ssl, identity, out| {
            let Some(identity) = identity.and_then(|i| std::str::from_utf8(i).ok()) else {
                return Ok(0);
            };
            match keys.key(identity) {
                Some(found) if found.key.len() <= out.len() => {
                    out[..found.key.len()].copy_from_slice(&found.key);
                    ssl.set_ex_data(client, (found.scope, identity.to_string()));
                    Ok(found.key.len())
                }
                // No key: OpenSSL fails the handshake.
                _ => {
                    tracing::warn!(identity, "NBD TLS client presented an unknown PSK identity");
                    Ok(0)
                }
            }
        });
        Ok(TlsPsk {
            context: builder.build(),
            client,
        })
    }

    /// Runs the server side of a TLS handshake on `tcp` (bounded by
    /// `timeout` per read) and starts the pump.
    pub(crate) fn accept(&self, tcp: TcpStream, timeout: Duration) -> io::Result<TlsSession> {
        tcp.set_read_timeout(Some(timeout))?;
        let ssl = Ssl::new(&self.context).map_err(io::Error::other)?;
        let tls = ssl
            .accept(tcp)
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))?;
        let (scope, identity) = tls.ssl().ex_data(self.client).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "TLS without a pre-shared key",
            )
        })?;
        let (plain, outer) = UnixStream::pair()?;
        plain.set_read_timeout(Some(timeout))?;
        tls.get_ref().set_read_timeout(None)?;
        tls.get_ref().set_nonblocking(true)?;
        outer.set_nonblocking(true)?;
        let pump = std::thread::Builder::new()
            .name("nbd-tls".into())
            .spawn(move || Pump::new(tls, outer).run())?;
        Ok(TlsSession {
            plain,
            scope,
            identity,
            pump,
        })
    }
}

/// A buffer of bytes waiting to be written on: `buf[sent..len]`. The
/// buffer is allocated (and zeroed) once; reads go straight into it.
struct Pending {
    buf: Vec<u8>,
    len: usize,
    sent: usize,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            buf: vec![0; PUMP_BUFFER],
            len: 0,
            sent: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.sent == self.len
    }

    fn rest(&self) -> &[u8] {
        &self.buf[self.sent..self.len]
    }

    /// Starts over at the buffer's beginning once everything was written.
    fn rewind_if_written(&mut self) {
        if self.is_empty() {
            (self.len, self.sent) = (0, 0);
        }
    }

    /// Room to read into.
    fn room(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }
}

/// What a step of the pump needs next from the TLS socket.
#[derive(Default)]
struct Wants {
    read: bool,
    write: bool,
}

struct Pump {
    tls: SslStream<TcpStream>,
    plain: UnixStream,
    /// Decrypted from the client, for the server.
    up: Pending,
    /// From the server, for the client.
    down: Pending,
    /// The client may still send.
    client_open: bool,
    /// The server may still send.
    server_open: bool,
}

enum Step {
    Progress,
    Idle(Wants),
    Done,
}

impl Pump {
    fn new(tls: SslStream<TcpStream>, plain: UnixStream) -> Pump {
        Pump {
            tls,
            plain,
            up: Pending::new(),
            down: Pending::new(),
            client_open: true,
            server_open: true,
        }
    }

    fn run(mut self) {
        loop {
            match self.step() {
                Ok(Step::Progress) => {}
                Ok(Step::Idle(wants)) => {
                    if let Err(err) = self.wait(&wants) {
                        tracing::debug!("NBD TLS pump: poll failed: {err}");
                        break;
                    }
                }
                Ok(Step::Done) => break,
                Err(err) => {
                    tracing::debug!("NBD TLS connection ended: {err}");
                    break;
                }
            }
        }
        let _ = self.tls.shutdown();
        let _ = self.tls.get_ref().shutdown(Shutdown::Both);
        let _ = self.plain.shutdown(Shutdown::Both);
    }

    /// Moves what can be moved without blocking, both ways.
    fn step(&mut self) -> io::Result<Step> {
        let mut wants = Wants::default();
        let mut progress = false;
        // Client to server: decrypt while the server has taken everything.
        if self.up.is_empty() && self.client_open {
            self.up.rewind_if_written();
            while self.up.len < PUMP_BUFFER {
                match self.tls.ssl_read(self.up.room()) {
                    Ok(n) => {
                        self.up.len += n;
                        progress = true;
                    }
                    Err(e) => match e.code() {
                        ErrorCode::WANT_READ => {
                            wants.read = true;
                            break;
                        }
                        ErrorCode::WANT_WRITE => {
                            wants.write = true;
                            break;
                        }
                        // The client closed (close_notify, or EOF).
                        ErrorCode::ZERO_RETURN | ErrorCode::SYSCALL if e.io_error().is_none() => {
                            self.client_open = false;
                            progress = true;
                            break;
                        }
                        _ => return Err(io::Error::other(e.to_string())),
                    },
                }
            }
        }
        while !self.up.is_empty() {
            match self.plain.write(self.up.rest()) {
                Ok(n) => {
                    self.up.sent += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if !self.client_open && self.up.is_empty() {
            // The server sees EOF and ends the connection.
            let _ = self.plain.shutdown(Shutdown::Write);
        }
        // Server to client: encrypt what the server wrote.
        if self.down.is_empty() && self.server_open {
            self.down.rewind_if_written();
            match self.plain.read(self.down.room()) {
                Ok(0) => {
                    self.server_open = false;
                    progress = true;
                }
                Ok(n) => {
                    self.down.len += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        while !self.down.is_empty() {
            match self.tls.ssl_write(self.down.rest()) {
                Ok(n) => {
                    self.down.sent += n;
                    progress = true;
                }
                Err(e) => match e.code() {
                    ErrorCode::WANT_WRITE => {
                        wants.write = true;
                        break;
                    }
                    ErrorCode::WANT_READ => {
                        wants.read = true;
                        break;
                    }
                    _ => return Err(io::Error::other(e.to_string())),
                },
            }
        }
        if !self.server_open && self.down.is_empty() {
            return Ok(Step::Done);
        }
        if !self.client_open && self.up.is_empty() && !self.server_open {
            return Ok(Step::Done);
        }
        // Decrypted bytes already inside OpenSSL need no socket wake-up.
        if progress || (self.up.is_empty() && self.client_open && self.tls.ssl().pending() > 0) {
            return Ok(Step::Progress);
        }
        Ok(Step::Idle(wants))
    }

    /// Sleeps until a socket can move what [`Pump::step`] could not.
    fn wait(&self, wants: &Wants) -> io::Result<()> {
        let mut tcp_events = 0;
        if wants.read || (self.client_open && self.up.is_empty()) {
            tcp_events |= libc::POLLIN;
        }
        if wants.write {
            tcp_events |= libc::POLLOUT;
        }
        let mut plain_events = 0;
        if self.server_open && self.down.is_empty() {
            plain_events |= libc::POLLIN;
        }
        if !self.up.is_empty() {
            plain_events |= libc::POLLOUT;
        }
        let mut fds = [
            libc::pollfd {
                // Once the client closed, its hang-up must not wake us.
                fd: if self.client_open || wants.write {
                    self.tls.get_ref().as_raw_fd()
                } else {
                    -1
                },
                events: tcp_events,
                revents: 0,
            },
            libc::pollfd {
                fd: self.plain.as_raw_fd(),
                events: plain_events,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: `fds` is a valid array of two pollfd for the call;
            // both descriptors stay open while `self` lives.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if rc >= 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::ssl::SslConnector;
    use std::net::TcpListener;
    use std::sync::mpsc;

    const KEY: [u8; 32] = [0x5a; 32];

    struct OneKey;

    impl PskKeys for OneKey {
        fn key(&self, identity: &str) -> Option<PskKey> {
            (identity == "p.1").then(|| PskKey {
                key: KEY.to_vec(),
                scope: Scope::Tenant("p".into()),
            })
        }
    }

    /// A TLS-PSK client on `addr` presenting `identity` and `key`.
    fn client(
        addr: std::net::SocketAddr,
        identity: &'static str,
        key: [u8; 32],
    ) -> io::Result<SslStream<TcpStream>> {
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(io::Error::other)?;
        b.set_cipher_list(TLS12_PSK_CIPHERS)
            .map_err(io::Error::other)?;
        b.set_psk_client_callback(move |_, _hint, id, psk| {
            id[..identity.len()].copy_from_slice(identity.as_bytes());
            id[identity.len()] = 0;
            psk[..key.len()].copy_from_slice(&key);
            Ok(key.len())
        });
        let connector = b.build();
        let tcp = TcpStream::connect(addr)?;
        let mut config = connector.configure().map_err(io::Error::other)?;
        config.set_verify_hostname(false);
        config.set_verify(openssl::ssl::SslVerifyMode::NONE);
        config
            .connect("basalt", tcp)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Megabytes both ways in writes larger than the pump's buffer (a
    /// full buffer of decrypted bytes once left the pump spinning with
    /// OpenSSL still holding more), and the connection ends when the
    /// client goes. Fails instead of hanging.
    #[test]
    fn the_pump_carries_large_transfers_both_ways_and_ends_with_the_client() {
        let tls = Arc::new(TlsPsk::new(Arc::new(OneKey)).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (done, finished) = mpsc::channel();
        let up = pattern(5 << 20, 1);
        let down = pattern(3 << 20, 7);
        let (up2, down2) = (up.clone(), down.clone());
        std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            let session = tls.accept(tcp, Duration::from_secs(10)).unwrap();
            assert_eq!(session.scope, Scope::Tenant("p".into()));
            assert_eq!(session.identity, "p.1");
            let mut plain = session.plain;
            plain.set_read_timeout(None).unwrap();
            let mut got = vec![0u8; up2.len()];
            plain.read_exact(&mut got).unwrap();
            assert!(got == up2, "bytes from the client differ");
            plain.write_all(&down2).unwrap();
            // The client closes: the plaintext side sees the end.
            let mut rest = Vec::new();
            plain.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty());
            // The connection ends: the pump ends with it.
            drop(plain);
            session.pump.join().unwrap();
            done.send(()).unwrap();
        });
        let (client_done, client_finished) = mpsc::channel();
        std::thread::spawn(move || {
            let mut c = client(addr, "p.1", KEY).unwrap();
            for chunk in up.chunks(1 << 20) {
                c.write_all(chunk).unwrap();
            }
            let mut got = vec![0u8; down.len()];
            c.read_exact(&mut got).unwrap();
            assert!(got == down, "bytes from the server differ");
            c.shutdown().unwrap();
            drop(c);
            client_done.send(()).unwrap();
        });
        client_finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the client's transfers finished");
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the server side and its pump finished");
    }

    #[test]
    fn unknown_identities_and_wrong_keys_get_no_session() {
        let tls = Arc::new(TlsPsk::new(Arc::new(OneKey)).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            (0..2)
                .map(|_| {
                    let (tcp, _) = listener.accept().unwrap();
                    tls.accept(tcp, Duration::from_secs(10)).is_ok()
                })
                .collect::<Vec<bool>>()
        });
        assert!(client(addr, "nobody", KEY).is_err());
        assert!(client(addr, "p.1", [0; 32]).is_err());
        assert_eq!(server.join().unwrap(), [false, false]);
    }
}
