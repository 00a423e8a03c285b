//! A connection's receive buffer on an event loop: the bytes received and
//! not decoded yet, read from a non-blocking socket without waiting.
//!
//! Invariants:
//! - `pending()` is every byte received and not consumed, in order; the
//!   buffer moves them to its front only when a message would not fit
//!   behind them, and grows only to hold the one message being decoded
//!   (`need`), so one connection holds at most its largest message plus
//!   the base size.
//! - Drained, a buffer that grew shrinks back to its base size, so a burst
//!   of large messages does not pin memory on an idle connection.

use std::io::{self, Read};

/// What one [`RecvBuffer::fill`] found.
#[derive(Debug)]
pub enum Fill {
    /// Some bytes arrived.
    Data,
    /// Nothing now: wait for the socket to be readable.
    WouldBlock,
    /// The peer closed the connection between two messages.
    Closed,
    /// The peer closed the connection in the middle of a message.
    Truncated,
    /// The socket failed.
    Failed(io::Error),
}

/// The receive buffer of one connection.
pub struct RecvBuffer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes `pending()` must hold before the next message decodes.
    need: usize,
    base: usize,
}

impl RecvBuffer {
    /// A buffer of `base` bytes holding `leftover` (bytes a thread received
    /// before handing the connection over).
    pub fn new(base: usize, leftover: Vec<u8>) -> RecvBuffer {
        let mut buf = leftover;
        let end = buf.len();
        buf.resize(base.max(end), 0);
        RecvBuffer {
            buf,
            start: 0,
            end,
            need: 1,
            base,
        }
    }

    /// The bytes received and not consumed.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Enough bytes for the decoder to go on.
    pub fn ready(&self) -> bool {
        self.end - self.start >= self.need
    }

    /// The decoder used `n` bytes of `pending()` and needs `more` beyond
    /// what is left before it can decode the next message.
    pub fn consume(&mut self, n: usize, more: usize) {
        self.start += n.min(self.end - self.start);
        self.need = self.end - self.start + more;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Reads what `socket` has now (at most the room left).
    pub fn fill(&mut self, socket: &mut impl Read) -> Fill {
        // Room for at least what the decoder asked for.
        if self.start + self.need > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.need > self.buf.len() {
                self.buf.resize(self.need, 0);
            }
        }
        loop {
            return match socket.read(&mut self.buf[self.end..]) {
                Ok(0) if self.start == self.end => Fill::Closed,
                Ok(0) => Fill::Truncated,
                Ok(n) => {
                    self.end += n;
                    Fill::Data
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.start == self.end && self.buf.len() > self.base {
                        self.buf.truncate(self.base);
                        self.buf.shrink_to(self.base);
                        (self.start, self.end) = (0, 0);
                    }
                    Fill::WouldBlock
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Fill::Failed(e),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that hands out its chunks one read at a time, then
    /// `WouldBlock` (or EOF when `closed`).
    struct Chunks {
        chunks: Vec<Vec<u8>>,
        closed: bool,
    }

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.chunks.is_empty() {
                return match self.closed {
                    true => Ok(0),
                    false => Err(io::ErrorKind::WouldBlock.into()),
                };
            }
            let chunk = &mut self.chunks[0];
            let n = chunk.len().min(buf.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            chunk.drain(..n);
            if chunk.is_empty() {
                self.chunks.remove(0);
            }
            Ok(n)
        }
    }

    #[test]
    fn grows_for_one_large_message_and_shrinks_when_drained() {
        let mut socket = Chunks {
            chunks: vec![vec![1; 10], vec![2; 100], vec![3; 5]],
            closed: false,
        };
        let mut recv = RecvBuffer::new(16, vec![9, 9]);
        assert!(recv.ready());
        // A 2-byte header says a 110-byte message follows.
        recv.consume(0, 110);
        while !recv.ready() {
            assert!(matches!(recv.fill(&mut socket), Fill::Data));
        }
        assert_eq!(recv.pending().len(), 112);
        assert_eq!(recv.pending()[2..12], [1; 10]);
        recv.consume(112, 1);
        assert!(matches!(recv.fill(&mut socket), Fill::Data));
        assert_eq!(recv.pending(), &[3; 5]);
        recv.consume(5, 1);
        assert!(matches!(recv.fill(&mut socket), Fill::WouldBlock));
        assert_eq!(recv.buf.len(), 16, "shrunk back to its base");
    }

    #[test]
    fn end_of_stream_between_and_inside_messages() {
        let mut socket = Chunks {
            chunks: vec![vec![7; 3]],
            closed: true,
        };
        let mut recv = RecvBuffer::new(8, Vec::new());
        assert!(matches!(recv.fill(&mut socket), Fill::Data));
        assert!(matches!(recv.fill(&mut socket), Fill::Truncated));
        recv.consume(3, 1);
        assert!(matches!(recv.fill(&mut socket), Fill::Closed));
    }
}
