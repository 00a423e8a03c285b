//! Sequence-number comparison: RFC 1982 serial number arithmetic with
//! SERIAL_BITS = 32, which RFC 7143 prescribes for CmdSN, StatSN,
//! DataSN and R2TSN.
//!
//! Invariant: two numbers exactly 2^31 apart are neither less nor greater
//! than each other (RFC 1982 leaves the comparison undefined); every
//! predicate here answers `false` for such a pair, except that `sn_le`
//! and `sn_ge` stay true for equal numbers.

/// Half the sequence-number space.
const HALF: u32 = 1 << 31;

/// `a < b` in serial arithmetic.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < HALF
}

/// `a <= b` in serial arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// `a > b` in serial arithmetic.
pub fn sn_gt(a: u32, b: u32) -> bool {
    sn_lt(b, a)
}

/// `a >= b` in serial arithmetic.
pub fn sn_ge(a: u32, b: u32) -> bool {
    sn_le(b, a)
}

/// Whether `sn` lies in the window `first..=last` (for example a CmdSN
/// between ExpCmdSN and MaxCmdSN). An empty window, `last == first - 1`
/// (a target that accepts no command for now), contains nothing.
pub fn sn_in_window(sn: u32, first: u32, last: u32) -> bool {
    sn_le(first, sn) && sn_le(sn, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_around() {
        assert!(sn_lt(0xffff_fffe, 0xffff_ffff));
        assert!(sn_lt(0xffff_ffff, 0));
        assert!(sn_lt(0xffff_ff00, 5));
        assert!(sn_gt(5, 0xffff_ff00));
        assert!(!sn_lt(5, 5) && sn_le(5, 5) && sn_ge(5, 5));
        assert!(sn_lt(0, HALF - 1));
        assert!(!sn_lt(0, HALF) && !sn_gt(0, HALF));
        assert!(!sn_le(0, HALF) && !sn_ge(0, HALF));
    }

    #[test]
    fn windows() {
        assert!(sn_in_window(10, 10, 20));
        assert!(sn_in_window(20, 10, 20));
        assert!(!sn_in_window(21, 10, 20));
        assert!(!sn_in_window(9, 10, 20));
        assert!(sn_in_window(1, 0xffff_fff0, 3));
        // MaxCmdSN = ExpCmdSN - 1: closed window.
        assert!(!sn_in_window(10, 10, 9));
        assert!(!sn_in_window(9, 10, 9));
    }
}
