//! Bit-flag fields of the protocol as small newtypes.
//!
//! Every type keeps unknown bits as received (parsers never drop
//! information); `unknown_bits()` tells the caller what it did not recognise,
//! which the server needs because the protocol asks it to reject unknown
//! client and command flags.

use std::fmt;

macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        $name:ident: $bits:ty {
            $( $(#[$fmeta:meta])* $flag:ident = $value:expr; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name($bits);

        impl $name {
            $( $(#[$fmeta])* pub const $flag: Self = Self($value); )*

            /// Every flag this crate knows for this field.
            pub const KNOWN: Self = Self(0 $( | $value )*);

            /// No flag set.
            pub const fn empty() -> Self {
                Self(0)
            }

            /// Wraps raw bits, keeping unknown ones.
            pub const fn from_bits(bits: $bits) -> Self {
                Self(bits)
            }

            /// The raw bits as sent on the wire.
            pub const fn bits(self) -> $bits {
                self.0
            }

            /// True when every flag of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// True when any flag of `other` is set in `self`.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// Both sets of flags.
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }

            /// `self` without the flags of `other`.
            pub const fn difference(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }

            /// True when no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// Bits set in `self` that this crate does not know.
            pub const fn unknown_bits(self) -> $bits {
                self.0 & !Self::KNOWN.0
            }

            fn names() -> &'static [(&'static str, $bits)] {
                &[ $( (stringify!($flag), $value), )* ]
            }
        }

        impl std::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                self.union(rhs)
            }
        }

        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                *self = self.union(rhs);
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                let mut first = true;
                for (name, value) in Self::names() {
                    if self.0 & value != 0 {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(name)?;
                        first = false;
                    }
                }
                let unknown = self.unknown_bits();
                if unknown != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{unknown:#x}")?;
                }
                f.write_str(")")
            }
        }
    };
}

flag_set! {
    /// Handshake flags sent by the server in its greeting (16 bits).
    HandshakeFlags: u16 {
        /// `NBD_FLAG_FIXED_NEWSTYLE`: the server speaks fixed newstyle.
        FIXED_NEWSTYLE = 1 << 0;
        /// `NBD_FLAG_NO_ZEROES`: the server can omit the 124 zero bytes.
        NO_ZEROES = 1 << 1;
    }
}

flag_set! {
    /// Client flags sent in answer to the greeting (32 bits).
    ClientFlags: u32 {
        /// `NBD_FLAG_C_FIXED_NEWSTYLE`.
        FIXED_NEWSTYLE = 1 << 0;
        /// `NBD_FLAG_C_NO_ZEROES`: no 124 zero bytes after EXPORT_NAME.
        NO_ZEROES = 1 << 1;
    }
}

flag_set! {
    /// Transmission flags describing an export (16 bits).
    TransmissionFlags: u16 {
        /// `NBD_FLAG_HAS_FLAGS`: always set.
        HAS_FLAGS = 1 << 0;
        /// `NBD_FLAG_READ_ONLY`.
        READ_ONLY = 1 << 1;
        /// `NBD_FLAG_SEND_FLUSH`.
        SEND_FLUSH = 1 << 2;
        /// `NBD_FLAG_SEND_FUA`.
        SEND_FUA = 1 << 3;
        /// `NBD_FLAG_ROTATIONAL`.
        ROTATIONAL = 1 << 4;
        /// `NBD_FLAG_SEND_TRIM`.
        SEND_TRIM = 1 << 5;
        /// `NBD_FLAG_SEND_WRITE_ZEROES`.
        SEND_WRITE_ZEROES = 1 << 6;
        /// `NBD_FLAG_SEND_DF`: only with structured replies.
        SEND_DF = 1 << 7;
        /// `NBD_FLAG_CAN_MULTI_CONN`: flush/FUA visible across connections.
        CAN_MULTI_CONN = 1 << 8;
        /// `NBD_FLAG_SEND_RESIZE` (experimental extension).
        SEND_RESIZE = 1 << 9;
        /// `NBD_FLAG_SEND_CACHE`.
        SEND_CACHE = 1 << 10;
        /// `NBD_FLAG_SEND_FAST_ZERO`.
        SEND_FAST_ZERO = 1 << 11;
        /// `NBD_FLAG_BLOCK_STATUS_PAYLOAD` (experimental extension).
        BLOCK_STATUS_PAYLOAD = 1 << 12;
    }
}

flag_set! {
    /// Command flags of a transmission request (16 bits).
    CommandFlags: u16 {
        /// `NBD_CMD_FLAG_FUA`: persist before replying.
        FUA = 1 << 0;
        /// `NBD_CMD_FLAG_NO_HOLE`: WRITE_ZEROES must not deallocate.
        NO_HOLE = 1 << 1;
        /// `NBD_CMD_FLAG_DF`: READ reply in at most one content chunk.
        DF = 1 << 2;
        /// `NBD_CMD_FLAG_REQ_ONE`: BLOCK_STATUS with one extent per context.
        REQ_ONE = 1 << 3;
        /// `NBD_CMD_FLAG_FAST_ZERO`: WRITE_ZEROES only if fast.
        FAST_ZERO = 1 << 4;
        /// `NBD_CMD_FLAG_PAYLOAD_LEN` (extended headers extension).
        PAYLOAD_LEN = 1 << 5;
    }
}

flag_set! {
    /// Flags of a structured reply chunk (16 bits).
    ReplyFlags: u16 {
        /// `NBD_REPLY_FLAG_DONE`: the last chunk of a reply.
        DONE = 1 << 0;
    }
}

flag_set! {
    /// Status flags of a `base:allocation` block status descriptor (32 bits).
    BlockStatusFlags: u32 {
        /// `NBD_STATE_HOLE`: not allocated in the backend.
        HOLE = 1 << 0;
        /// `NBD_STATE_ZERO`: reads as zeros.
        ZERO = 1 << 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_keep_unknown_bits_and_format_names() {
        let flags = CommandFlags::from_bits(0x8001);
        assert!(flags.contains(CommandFlags::FUA));
        assert_eq!(flags.unknown_bits(), 0x8000);
        assert_eq!(format!("{flags:?}"), "CommandFlags(FUA | 0x8000)");
        let tx = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH;
        assert_eq!(tx.bits(), 0b101);
        assert_eq!(
            tx.difference(TransmissionFlags::SEND_FLUSH),
            TransmissionFlags::HAS_FLAGS
        );
        assert!(TransmissionFlags::empty().is_empty());
        assert_eq!(ClientFlags::KNOWN.bits(), 3);
        assert_eq!(format!("{:?}", ReplyFlags::empty()), "ReplyFlags()");
    }
}
