//! The receiving half of a peer connection: bytes from the socket cut into
//! frames.
//!
//! Small frames (acknowledgements, heartbeats, 4 KiB writes) are read in
//! large chunks into one reused buffer and decoded from it; a write's data
//! is then copied once, into an aligned payload. A large frame (a 1 MiB
//! write, a resync copy) is received into a buffer of its own instead,
//! placed so that the frame ends on a 4 KiB boundary: its data, whole
//! blocks at the frame's tail, then starts aligned too, and becomes the
//! write's payload without any copy in user space (the store writes it with
//! O_DIRECT as it is).
//!
//! Invariants:
//! - A frame's header is checked (`decode_header`) before anything is
//!   allocated for its payload, so a corrupt length cannot make the reader
//!   allocate more than [`basalt_peer_wire::MAX_PAYLOAD`].
//! - A large frame's buffer receives exactly that frame's bytes, never the
//!   next frame's; every byte of it handed out was written by the kernel or
//!   copied from the shared buffer.

use basalt_peer_wire::{self as wire, DecodeError, Frame};
use basalt_replication::{Msg, Payload, VolumeId};
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;

/// Smallest read a connection's reader asks the kernel for.
const READ_CHUNK: usize = 256 << 10;
/// Frames at least this long are received into a buffer of their own.
const OWN_BUFFER_FRAME: usize = 64 << 10;
const ALIGN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Decode(DecodeError),
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

/// Buffers one connection's bytes and cuts them into frames.
pub(super) struct FrameReader {
    buf: Vec<u8>,
    /// `buf[pos..end]` is received and not yet decoded.
    pos: usize,
    end: usize,
}

impl FrameReader {
    pub(super) fn new() -> Self {
        FrameReader {
            buf: Vec::new(),
            pos: 0,
            end: 0,
        }
    }

    /// The next frame if it is already received in full and is a message,
    /// without reading. Anything else (a partial frame, a Hello, a decode
    /// error) stays in place for [`FrameReader::next`] to deal with.
    pub(super) fn next_buffered_msg(
        &mut self,
    ) -> Result<Option<(VolumeId, Msg, usize)>, DecodeError> {
        let pending = &self.buf[self.pos..self.end];
        match wire::decode(pending)? {
            Some((Frame::Msg { vol, msg }, used)) => {
                self.pos += used;
                Ok(Some((vol, msg, used)))
            }
            _ => Ok(None),
        }
    }

    /// The next frame and its length on the wire; `None` at a clean end of
    /// the stream (between frames).
    pub(super) fn next<S: Read + AsRawFd>(
        &mut self,
        stream: &mut S,
    ) -> Result<Option<(Frame, usize)>, ReadError> {
        loop {
            let pending = &self.buf[self.pos..self.end];
            if let Some((frame, used)) = wire::decode(pending).map_err(ReadError::Decode)? {
                self.pos += used;
                return Ok(Some((frame, used)));
            }
            // The header is checked, so its length is bounded.
            let need = match wire::decode_header(pending) {
                Ok(Some(h)) => h.frame_len(),
                _ => 0,
            };
            if need >= OWN_BUFFER_FRAME {
                return self.next_own_buffer(stream.as_raw_fd(), need).map(Some);
            }
            // Move the partial frame to the front (it is shorter than
            // OWN_BUFFER_FRAME), and make room for all of it.
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
            let want = need.max(self.end + READ_CHUNK);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            let n = loop {
                match stream.read(&mut self.buf[self.end..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            };
            if n == 0 {
                return if self.end == 0 {
                    Ok(None)
                } else {
                    Err(ReadError::Truncated)
                };
            }
            self.end += n;
        }
    }

    /// Receives the frame of `len` bytes that starts at `pos` (its start is
    /// buffered) into a buffer of its own, and decodes it from there.
    fn next_own_buffer(&mut self, fd: RawFd, len: usize) -> Result<(Frame, usize), ReadError> {
        let mut frame = FrameBuf::new(len);
        let buffered = (self.end - self.pos).min(len);
        frame.extend_from_slice(&self.buf[self.pos..self.pos + buffered]);
        self.pos += buffered;
        while frame.filled < len {
            match frame.read_from(fd) {
                Ok(0) => return Err(ReadError::Truncated),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let bytes = frame.freeze();
        match wire::decode_shared(&bytes).map_err(ReadError::Decode)? {
            Some(decoded) => Ok(decoded),
            // The header said `len` bytes, and they are all here.
            None => Err(ReadError::Truncated),
        }
    }
}

/// The buffer one large frame is received into: `len` bytes, ending on a
/// 4 KiB boundary, filled front to back.
///
/// Invariant: `ptr[start..start + filled]` is initialised; nothing else
/// of the allocation is ever read.
struct FrameBuf {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Where the frame starts in the allocation.
    start: usize,
    len: usize,
    filled: usize,
}

// SAFETY: the allocation is owned exclusively (like a `Vec<u8>`), and only
// read (through `AsRef`) once filled and frozen.
unsafe impl Send for FrameBuf {}
unsafe impl Sync for FrameBuf {}

impl FrameBuf {
    fn new(len: usize) -> Self {
        let cap = len.div_ceil(ALIGN).max(1) * ALIGN;
        let Ok(layout) = Layout::from_size_align(cap, ALIGN) else {
            handle_alloc_error(Layout::new::<u8>())
        };
        // SAFETY: `cap > 0`.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        FrameBuf {
            ptr,
            layout,
            start: cap - len,
            len,
            filled: 0,
        }
    }

    /// Copies `data` (at most what is left to fill) in.
    fn extend_from_slice(&mut self, data: &[u8]) {
        let n = data.len().min(self.len - self.filled);
        // SAFETY: the destination lies within the allocation
        // (`start + filled + n <= start + len = cap`) and cannot overlap
        // `data`, a borrow of other memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.ptr.as_ptr().add(self.start + self.filled),
                n,
            )
        };
        self.filled += n;
    }

    /// One `read(2)` of at most what is left to fill, straight into the
    /// buffer; the bytes it read (0 at the end of the stream).
    fn read_from(&mut self, fd: RawFd) -> io::Result<usize> {
        let left = self.len - self.filled;
        // SAFETY: the kernel writes at most `left` bytes within the
        // allocation (`start + filled + left = cap`); those it reports
        // written are initialised from then on.
        let n = unsafe {
            libc::read(
                fd,
                self.ptr.as_ptr().add(self.start + self.filled).cast(),
                left,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.filled += n as usize;
        Ok(n as usize)
    }

    /// The filled frame as a shared payload.
    fn freeze(self) -> Payload {
        debug_assert_eq!(self.filled, self.len);
        Payload::from_owner(self)
    }
}

impl AsRef<[u8]> for FrameBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr[start..start + filled]` is initialised (the type's
        // invariant) and lives until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(self.start), self.filled) }
    }
}

impl Drop for FrameBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_replication::{ClientReq, Epoch, ReplOp};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    fn write_frame(vol: VolumeId, lba: u64, data: Vec<u8>) -> Frame {
        Frame::Msg {
            vol,
            msg: Msg::Repl {
                vol,
                epoch: Epoch(1),
                session: 1,
                lseq: lba,
                vseq: 0,
                commit: 0,
                floor: 0,
                op: ReplOp::Write {
                    lba,
                    data: data.into(),
                    fua: false,
                },
            },
        }
    }

    /// Small and large frames interleaved, written in odd-sized pieces:
    /// every one decodes as sent, and each large write's data is aligned.
    #[test]
    fn frames_of_every_size_arrive_whole_and_large_writes_aligned() {
        let vol = VolumeId(7);
        let mut frames = Vec::new();
        for (i, blocks) in [1usize, 256, 1, 16, 64, 2, 256, 1].into_iter().enumerate() {
            let data: Vec<u8> = (0..blocks * 4096).map(|b| (b * 31 + i) as u8).collect();
            frames.push(write_frame(vol, i as u64, data));
            frames.push(Frame::Msg {
                vol,
                msg: Msg::ClientReq {
                    id: i as u64,
                    req: ClientReq::Flush,
                },
            });
        }
        let mut bytes = Vec::new();
        for f in &frames {
            wire::encode(f, &mut bytes).unwrap();
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            for piece in bytes.chunks(12_345) {
                s.write_all(piece).unwrap();
            }
        });
        let (mut stream, _) = listener.accept().unwrap();
        let mut reader = FrameReader::new();
        for want in &frames {
            let (got, _) = reader.next(&mut stream).unwrap().unwrap();
            assert_eq!(&got, want);
            if let Frame::Msg {
                msg:
                    Msg::Repl {
                        op: ReplOp::Write { data, .. },
                        ..
                    },
                ..
            } = &got
            {
                if data.len() + 100 >= OWN_BUFFER_FRAME {
                    assert_eq!(data.as_ptr() as usize % ALIGN, 0);
                }
            }
        }
        sender.join().unwrap();
        assert!(reader.next(&mut stream).unwrap().is_none());
    }

    /// A connection that ends inside a large frame is a truncation, not a
    /// frame.
    #[test]
    fn a_large_frame_cut_short_is_truncated() {
        let frame = write_frame(VolumeId(1), 0, vec![5; 64 * 4096]);
        let mut bytes = Vec::new();
        wire::encode(&frame, &mut bytes).unwrap();
        bytes.truncate(bytes.len() - 1000);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&bytes).unwrap();
        });
        let (mut stream, _) = listener.accept().unwrap();
        sender.join().unwrap();
        let mut reader = FrameReader::new();
        assert!(matches!(
            reader.next(&mut stream),
            Err(ReadError::Truncated)
        ));
    }
}
