//! The one error type of the codec.

/// Why bytes could not be parsed (or a value could not be encoded).
///
/// [`WireError::Incomplete`] is not a protocol violation: it asks the caller
/// for more input. Every other variant means the bytes (or value) can never
/// form a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input ends before the message does; at least this many bytes
    /// (counted from the start of the input) are needed.
    #[error("incomplete message: {0} bytes needed")]
    Incomplete(usize),
    /// A magic number did not match.
    #[error("bad {what} magic {found:#x}")]
    BadMagic { what: &'static str, found: u64 },
    /// A length field announces more than the limit for that field.
    #[error("{what} of {length} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        length: u64,
        limit: u64,
    },
    /// The fields of a message are inconsistent with each other or with the
    /// protocol (for example a name length pointing past the payload).
    #[error("malformed {what}: {reason}")]
    Malformed {
        what: &'static str,
        reason: &'static str,
    },
    /// A string is longer than [`crate::MAX_STRING_LEN`].
    #[error("{what} is {length} bytes long, the limit is {limit}")]
    StringTooLong {
        what: &'static str,
        length: usize,
        limit: usize,
    },
    /// A string is not valid UTF-8 or contains a NUL character.
    #[error("{what} is not a valid protocol string (UTF-8 without NUL)")]
    BadString { what: &'static str },
}

impl WireError {
    /// True when more input could turn this into a successful parse.
    pub fn is_incomplete(&self) -> bool {
        matches!(self, WireError::Incomplete(_))
    }
}
