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

/// TLS 1.2 suites with a pre-shared key and authenticated encryption (TLS
/// 1.3 suites are all of that kind).
const TLS12_PSK_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
DHE-PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256";

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
    scope: Index<Ssl, Scope>,
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
        let scope = Ssl::new_ex_index::<Scope>()?;
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
                    ssl.set_ex_data(scope, found.scope);
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
            scope,
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
        let scope = tls.ssl().ex_data(self.scope).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "TLS without a pre-shared key",
            )
        })?;
        let identity = tls
            .ssl()
            .psk_identity()
            .map(|i| String::from_utf8_lossy(i).into_owned())
            .unwrap_or_default();
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

/// Bytes waiting to be written on, with how much went already.
struct Pending {
    bytes: Vec<u8>,
    sent: usize,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            bytes: Vec::with_capacity(PUMP_BUFFER),
            sent: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.sent == self.bytes.len()
    }

    fn rest(&self) -> &[u8] {
        &self.bytes[self.sent..]
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.sent = 0;
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
    buf: Vec<u8>,
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
            buf: vec![0; PUMP_BUFFER],
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
            self.up.clear();
            while self.up.bytes.len() < PUMP_BUFFER {
                match self.tls.ssl_read(&mut self.buf) {
                    Ok(n) => {
                        self.up.bytes.extend_from_slice(&self.buf[..n]);
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
            self.down.clear();
            self.down.bytes.resize(PUMP_BUFFER, 0);
            match self.plain.read(&mut self.down.bytes) {
                Ok(0) => {
                    self.down.bytes.clear();
                    self.server_open = false;
                    progress = true;
                }
                Ok(n) => {
                    self.down.bytes.truncate(n);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.down.bytes.clear(),
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
