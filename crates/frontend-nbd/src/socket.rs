//! Socket plumbing for a connection: a receive buffer that can be topped up
//! without blocking (to gather pipelined requests into one batch), and a
//! vectored write that sends a batch's replies and read data with as few
//! `writev` calls as possible.

use crate::stream::Stream;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;

/// Most iovecs one `writev` accepts on Linux (`IOV_MAX`).
const IOV_MAX: usize = 1024;

/// A byte window `[start, end)` over a fixed buffer the socket is read into.
pub(crate) struct RecvBuffer {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl RecvBuffer {
    pub(crate) fn new(capacity: usize) -> RecvBuffer {
        RecvBuffer {
            buf: vec![0u8; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Bytes received and not yet consumed.
    pub(crate) fn data(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or(&[])
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Marks `n` bytes (at most what is buffered) as consumed.
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Moves unconsumed bytes to the front so the free tail is as large as
    /// possible. Cheap: between requests at most a partial header remains.
    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    fn free_tail(&mut self) -> &mut [u8] {
        if self.end == self.buf.len() {
            self.compact();
        }
        let end = self.end;
        self.buf.get_mut(end..).unwrap_or(&mut [])
    }

    /// Blocks until some bytes arrive; returns 0 on EOF.
    pub(crate) fn fill(&mut self, stream: &mut Stream) -> io::Result<usize> {
        loop {
            let tail = self.free_tail();
            if tail.is_empty() {
                return Err(io::Error::other("receive buffer full"));
            }
            match stream.read(tail) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether a receive can add bytes (after compacting if need be).
    pub(crate) fn has_room(&mut self) -> bool {
        !self.free_tail().is_empty()
    }

    /// Takes whatever the kernel already has, without blocking: `Ok(None)`
    /// when nothing is waiting, `Ok(Some(0))` on EOF.
    pub(crate) fn fill_nonblocking(&mut self, stream: &Stream) -> io::Result<Option<usize>> {
        let fd = stream.as_raw_fd();
        loop {
            let tail = self.free_tail();
            if tail.is_empty() {
                return Ok(None);
            }
            // SAFETY: `tail` is a valid, writable buffer of `tail.len()` bytes
            // and `fd` is the open socket owned by `stream` for this call.
            // MSG_DONTWAIT makes this one call non-blocking without changing
            // the socket's mode (which would cost two more syscalls).
            let n = unsafe {
                libc::recv(
                    fd,
                    tail.as_mut_ptr().cast::<libc::c_void>(),
                    tail.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                // n is non-negative and at most tail.len().
                let n = n as usize;
                self.end += n;
                return Ok(Some(n));
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err),
            }
        }
    }
}

/// Sends `bytes` now, without blocking the calling thread on a client that
/// does not read: only if the socket has nothing queued for sending (then
/// the kernel takes a few KiB whole) and only by a non-blocking send. `None`
/// when nothing was sent (queue not empty, or the kernel refused); then the
/// caller's usual blocking path sends them.
///
/// Invariant: `Some` means every byte was written, in order, or the socket
/// failed. Should the kernel take only a part (it does not with an empty
/// queue and default buffers), the rest is written blocking before return,
/// since nothing else may follow a partial reply on the stream.
pub(crate) fn send_if_idle(stream: &Stream, bytes: &[u8]) -> Option<io::Result<()>> {
    let fd = stream.as_raw_fd();
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ for TCP) writes one int to `queued`; `fd`
    // is the open socket owned by `stream` for this call.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued as *mut libc::c_int) };
    if rc != 0 || queued != 0 {
        return None;
    }
    // SAFETY: `bytes` is a valid buffer of `bytes.len()` bytes for the call.
    let n = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast::<libc::c_void>(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => None,
            _ => Some(Err(err)),
        };
    }
    // n is non-negative and at most bytes.len().
    let rest = bytes.get(n as usize..).unwrap_or(&[]);
    let mut stream = stream;
    Some(if rest.is_empty() {
        Ok(())
    } else {
        stream.write_all(rest)
    })
}

/// Writes every byte of `parts`, in order, with `writev` (at most `IOV_MAX`
/// slices per call), retrying after partial writes.
pub(crate) fn write_all_vectored(stream: &mut Stream, parts: &[&[u8]]) -> io::Result<()> {
    let mut index = 0; // first part not completely written
    let mut offset = 0; // bytes of parts[index] already written
    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len().min(IOV_MAX));
    while index < parts.len() {
        iov.clear();
        for (i, part) in parts.iter().enumerate().skip(index).take(IOV_MAX) {
            let part = if i == index {
                part.get(offset..).unwrap_or(&[])
            } else {
                part
            };
            if !part.is_empty() {
                iov.push(IoSlice::new(part));
            }
        }
        if iov.is_empty() {
            break;
        }
        let mut written = match stream.write_vectored(&iov) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // Advance (index, offset) past `written` bytes.
        while written > 0 && index < parts.len() {
            let left = parts[index].len() - offset;
            if written >= left {
                written -= left;
                index += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
        while index < parts.len() && parts[index].len() == offset {
            index += 1;
            offset = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (Stream, Stream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (Stream::Tcp(a), Stream::Tcp(b))
    }

    #[test]
    fn vectored_write_sends_everything_in_order() {
        let (mut a, mut b) = pair();
        // Large enough to force partial writes (socket buffers are smaller).
        let big = vec![7u8; 8 << 20];
        let small: Vec<Vec<u8>> = (0..3000u32).map(|i| i.to_be_bytes().to_vec()).collect();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            b.read_to_end(&mut all).unwrap();
            all
        });
        let mut parts: Vec<&[u8]> = vec![&big, &[]];
        parts.extend(small.iter().map(Vec::as_slice));
        parts.push(&big);
        write_all_vectored(&mut a, &parts).unwrap();
        drop(a);
        let all = reader.join().unwrap();
        let expected: Vec<u8> = parts.concat();
        assert_eq!(all.len(), expected.len());
        assert!(all == expected);
    }

    #[test]
    fn idle_send_goes_out_and_a_backed_up_socket_is_left_alone() {
        let (a, mut b) = pair();
        assert!(matches!(send_if_idle(&a, b"reply"), Some(Ok(()))));
        let mut got = [0u8; 5];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"reply");
        // A client that stops reading: once its window is full, bytes stay
        // queued on our side and the send is left to the blocking path.
        a.set_nonblocking(true).unwrap();
        let chunk = vec![1u8; 64 << 10];
        loop {
            match (&a).write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        a.set_nonblocking(false).unwrap();
        assert!(send_if_idle(&a, b"reply").is_none());
    }

    #[test]
    fn receive_buffer_fills_and_compacts() {
        let (mut a, mut b) = pair();
        let mut rb = RecvBuffer::new(8);
        assert_eq!(rb.fill_nonblocking(&b).unwrap(), None);
        a.write_all(b"0123456789").unwrap();
        let mut got = 0;
        while got < 8 {
            got += rb.fill(&mut b).unwrap();
        }
        assert_eq!(rb.data(), b"01234567");
        rb.consume(6);
        assert_eq!(rb.data(), b"67");
        // The tail is full: filling compacts first.
        loop {
            if let Some(n) = rb.fill_nonblocking(&b).unwrap() {
                assert!(n > 0);
                break;
            }
        }
        assert_eq!(rb.data(), b"6789");
        rb.consume(4);
        assert!(rb.is_empty());
        drop(a);
        assert_eq!(rb.fill(&mut b).unwrap(), 0, "EOF");
    }
}
