//! A client's connection, whichever listener it came through: TCP (remote
//! hosts, or loopback) or the Unix socket in the data directory (a local
//! hypervisor, admitted by the socket file's permissions), and who is at
//! the other end, for logs and per-source admission.
//!
//! Invariants:
//! - Every operation the server needs behaves the same on both kinds
//!   (TCP_NODELAY is a no-op on a Unix socket, where nothing delays
//!   writes).
//! - A Unix client's identity is the kernel's (SO_PEERCRED), not anything
//!   the client says.

use basalt_volume::admission::Source;
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A client's byte stream.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Who is at the other end of a [`Stream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Tcp(SocketAddr),
    /// A local process, as the kernel identified it when it connected.
    Unix {
        uid: u32,
        pid: i32,
    },
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(addr) => write!(f, "{addr}"),
            Peer::Unix { uid, pid } => write!(f, "unix socket (uid {uid}, pid {pid})"),
        }
    }
}

impl Peer {
    /// The source the per-source connection limit counts against.
    pub fn source(&self) -> Source {
        match self {
            Peer::Tcp(addr) => Source::Address(addr.ip()),
            Peer::Unix { uid, .. } => Source::LocalUser(*uid),
        }
    }

    /// The identity of a Unix socket's client (SO_PEERCRED).
    pub(crate) fn of_unix(stream: &UnixStream) -> io::Result<Peer> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` are valid for writes of the sizes given;
        // the descriptor is the open socket `stream` borrows.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Peer::Unix {
            uid: cred.uid,
            pid: cred.pid,
        })
    }
}

macro_rules! both {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            Stream::Tcp($s) => $e,
            Stream::Unix($s) => $e,
        }
    };
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        both!(self, s => s.shutdown(how))
    }

    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        both!(self, s => s.set_nonblocking(nonblocking))
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        both!(self, s => s.set_read_timeout(timeout))
    }

    /// Disables Nagle's algorithm on TCP; nothing to do on a Unix socket.
    pub fn set_nodelay(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nodelay(true),
            Stream::Unix(_) => Ok(()),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        both!(self, s => s.as_raw_fd())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        both!(self, s => s.read(buf))
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        both!(self, s => s.write(buf))
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        both!(self, s => s.write_vectored(bufs))
    }

    fn flush(&mut self) -> io::Result<()> {
        both!(self, s => s.flush())
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
            Stream::Unix(s) => (&*s).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
