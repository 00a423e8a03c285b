//! Block command planning: ranges, limits, residuals, FUA, write
//! protection, the data-out rules.

use super::*;
use crate::cdb::ByteCheck;
use crate::lu::block::DATA_OUT_REFUSED;
use crate::sense::{INVALID_COMMAND_OPERATION_CODE, LBA_OUT_OF_RANGE, WRITE_PROTECTED};

const LAST: u32 = (BLOCKS - 1) as u32;

#[test]
fn read_simple() {
    let c = config();
    assert_eq!(
        plan_cdb(&c, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], read_t(BS)),
        Plan::Read {
            lba: 0,
            blocks: 1,
            fua: false,
            data_in_len: BS,
            residual: Residual::None
        }
    );
    // READ(16) with FUA at the last block.
    let mut cdb = write16(u64::from(LAST), 1, 0x08);
    cdb[0] = 0x88;
    assert_eq!(
        plan_cdb(&c, &cdb, read_t(BS)),
        Plan::Read {
            lba: u64::from(LAST),
            blocks: 1,
            fua: true,
            data_in_len: BS,
            residual: Residual::None
        }
    );
}

#[test]
fn read_6_256_blocks() {
    let c = config();
    assert_eq!(
        plan_cdb(&c, &[0x08, 0, 0, 0, 0, 0], read_t(256 * BS)),
        Plan::Read {
            lba: 0,
            blocks: 256,
            fua: false,
            data_in_len: 256 * BS,
            residual: Residual::None
        }
    );
}

#[test]
fn beyond_end_of_medium() {
    // libiscsi test_read10_beyond_eol / test_write10_beyond_eol.
    let c = config();
    for i in 1..=256u16 {
        let past = (BLOCKS + 1 - u64::from(i)) as u32;
        for lba in [past, 0x8000_0000, u32::MAX] {
            let t = u32::from(i) * BS;
            assert_eq!(
                sense_of(&plan_cdb(&c, &read10(lba, i), read_t(t))),
                LBA_OUT_OF_RANGE
            );
            assert_eq!(
                sense_of(&plan_cdb(&c, &write10(lba, i), write_t(t))),
                LBA_OUT_OF_RANGE
            );
        }
        if i >= 2 {
            let t = u32::from(i) * BS;
            assert_eq!(
                sense_of(&plan_cdb(&c, &read10(LAST, i), read_t(t))),
                LBA_OUT_OF_RANGE
            );
        }
    }
    // READ(16) whose LBA + length wraps around.
    let mut cdb = write16(u64::MAX, 2, 0);
    cdb[0] = 0x88;
    assert_eq!(
        sense_of(&plan_cdb(&c, &cdb, read_t(2 * BS))),
        LBA_OUT_OF_RANGE
    );
}

#[test]
fn zero_blocks() {
    // libiscsi test_read10_0blocks / test_write10_0blocks.
    let c = config();
    assert_eq!(plan_cdb(&c, &read10(0, 0), read_t(0)), good(Residual::None));
    assert_eq!(
        plan_cdb(&c, &write10(0, 0), write_t(0)),
        good(Residual::None)
    );
    // Zero blocks at the capacity itself name no block past the end.
    assert_eq!(
        plan_cdb(&c, &read10(BLOCKS as u32, 0), read_t(0)),
        good(Residual::None)
    );
    for lba in [BLOCKS as u32 + 1, 0x8000_0000, u32::MAX] {
        assert_eq!(
            sense_of(&plan_cdb(&c, &read10(lba, 0), read_t(0))),
            LBA_OUT_OF_RANGE
        );
        assert_eq!(
            sense_of(&plan_cdb(&c, &write10(lba, 0), write_t(0))),
            LBA_OUT_OF_RANGE
        );
    }
}

#[test]
fn transfer_limit() {
    let c = config();
    assert_eq!(
        sense_of(&plan_cdb(&c, &read10(0, 1025), read_t(1025 * BS))),
        Sense::invalid_field_in_cdb(7, None)
    );
    let mut cdb = write16(0, 1025, 0);
    assert_eq!(
        sense_of(&plan_cdb(&c, &cdb, write_t(1025 * BS))),
        Sense::invalid_field_in_cdb(10, None)
    );
    cdb[13] = 0;
    cdb[12] = 4; // 1024 blocks
    assert!(matches!(
        plan_cdb(&c, &cdb, write_t(1024 * BS)),
        Plan::Write { blocks: 1024, .. }
    ));
    // No limit reported: none enforced.
    let mut c = config();
    c.limits.max_transfer_blocks = 0;
    assert!(matches!(
        plan_cdb(&c, &read10(0, 4096), read_t(4096 * BS)),
        Plan::Read { blocks: 4096, .. }
    ));
}

#[test]
fn read_residuals() {
    // libiscsi test_read10_residuals.
    let c = config();
    assert_eq!(
        plan_cdb(&c, &read10(0, 1), read_t(0)),
        good(Residual::Overflow(BS))
    );
    assert_eq!(
        plan_cdb(&c, &read10(0, 1), read_t(10000)),
        Plan::Read {
            lba: 0,
            blocks: 1,
            fua: false,
            data_in_len: BS,
            residual: Residual::Underflow(10000 - BS)
        }
    );
    assert_eq!(
        plan_cdb(&c, &read10(0, 1), read_t(200)),
        Plan::Read {
            lba: 0,
            blocks: 1,
            fua: false,
            data_in_len: 200,
            residual: Residual::Overflow(BS - 200)
        }
    );
    assert_eq!(
        plan_cdb(&c, &read10(0, 2), read_t(BS)),
        Plan::Read {
            lba: 0,
            blocks: 1,
            fua: false,
            data_in_len: BS,
            residual: Residual::Overflow(BS)
        }
    );
}

#[test]
fn read_sent_with_the_write_flag() {
    // libiscsi test_read10_invalid: READ(10) flagged W with one block of
    // data-out is GOOD; no data-in goes to an initiator that expects none.
    let c = config();
    assert_eq!(
        plan_cdb(&c, &read10(0, 1), write_t(BS)),
        good(Residual::Overflow(BS))
    );
}

#[test]
fn write_residuals() {
    // libiscsi test_write10_residuals / test_writeverify10_residuals.
    let c = config();
    let w = |lba, blocks, residual| Plan::Write {
        lba,
        blocks,
        fua: false,
        residual,
    };
    assert_eq!(
        plan_cdb(&c, &write10(0, 1), write_t(0)),
        good(Residual::Overflow(BS))
    );
    assert_eq!(
        plan_cdb(&c, &write10(0, 1), write_t(2 * BS)),
        w(0, 1, Residual::Underflow(BS))
    );
    assert_eq!(
        plan_cdb(&c, &write10(0, 2), write_t(BS)),
        w(0, 1, Residual::Overflow(BS))
    );
    assert_eq!(
        plan_cdb(&c, &write10(0, 1), write_t(10000)),
        w(0, 1, Residual::Underflow(10000 - BS))
    );
    // A partial block is refused, with the residual still reported.
    let r = response(plan_cdb(&c, &write10(0, 1), write_t(200)));
    assert_eq!(r.sense, Some(DATA_OUT_REFUSED));
    assert_eq!(r.residual, Residual::Overflow(BS - 200));
    // WRITE flagged R only: nothing arrives, nothing is written.
    assert_eq!(
        plan_cdb(&c, &write10(0, 1), read_t(BS)),
        good(Residual::Overflow(BS))
    );
    // WRITE AND VERIFY with BYTCHK=1 follows the same rules.
    let wv = [0x2e, 0x02, 0, 0, 0, 0, 0, 0, 2, 0];
    assert_eq!(
        plan_cdb(&c, &wv, write_t(BS)),
        Plan::WriteAndVerify {
            lba: 0,
            blocks: 1,
            compare: true,
            residual: Residual::Overflow(BS)
        }
    );
    assert_eq!(
        plan_cdb(&c, &wv, write_t(0)),
        good(Residual::Overflow(2 * BS))
    );
}

#[test]
fn write_cache_decides_fua() {
    let c = config();
    let cached = ModeState { write_cache: true };
    let uncached = ModeState { write_cache: false };
    let fua_of = |mode: &ModeState, cdb: &[u8], t| match plan_mode(&c, mode, cdb, t) {
        Plan::Write { fua, .. }
        | Plan::CompareAndWrite { fua, .. }
        | Plan::WriteSame { fua, .. } => fua,
        other => panic!("{other:?}"),
    };
    assert!(!fua_of(&cached, &write10(0, 1), write_t(BS)));
    assert!(fua_of(&uncached, &write10(0, 1), write_t(BS)));
    // FUA in the CDB (WRITE(10) byte 1 bit 3), DPO alone is only a hint.
    assert!(fua_of(
        &cached,
        &[0x2a, 0x08, 0, 0, 0, 0, 0, 0, 1, 0],
        write_t(BS)
    ));
    assert!(!fua_of(
        &cached,
        &[0x2a, 0x10, 0, 0, 0, 0, 0, 0, 1, 0],
        write_t(BS)
    ));
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
    assert!(!fua_of(&cached, &caw, write_t(2 * BS)));
    assert!(fua_of(&uncached, &caw, write_t(2 * BS)));
    let ws = [0x41, 0, 0, 0, 0, 0, 0, 0, 4, 0];
    assert!(fua_of(&uncached, &ws, write_t(BS)));
    assert!(!fua_of(&cached, &ws, write_t(BS)));
    // WRITE AND VERIFY is durable regardless of the cache.
    let wv = plan_mode(&c, &cached, &[0x2e, 0, 0, 0, 0, 0, 0, 0, 1, 0], write_t(BS));
    assert!(matches!(wv, Plan::WriteAndVerify { compare: false, .. }));
}

#[test]
fn read_only_unit() {
    // libiscsi test_readonly_sbc: DATA PROTECT, WRITE PROTECTED, even for
    // a WRITE SAME with no data-out and for UNMAP.
    let mut c = config();
    c.read_only = true;
    let cases: [(&[u8], Transfer); 7] = [
        (&write10(0, 1), write_t(BS)),
        (&write16(0, 1, 0), write_t(BS)),
        (&[0x2e, 0x02, 0, 0, 0, 0, 0, 0, 1, 0], write_t(BS)),
        (&[0x41, 0x08, 0, 0, 0, 0, 0, 0, 1, 0], none_t()),
        (
            &[0x93, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            write_t(BS),
        ),
        (&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], write_t(24)),
        (
            &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            write_t(2 * BS),
        ),
    ];
    for (cdb, t) in cases {
        assert_eq!(
            sense_of(&plan_cdb(&c, cdb, t)),
            WRITE_PROTECTED,
            "{cdb:02x?}"
        );
    }
    // Reads still work.
    assert!(matches!(
        plan_cdb(&c, &read10(0, 1), read_t(BS)),
        Plan::Read { .. }
    ));
}

#[test]
fn verify() {
    let c = config();
    // BYTCHK=0: no data-out.
    assert_eq!(
        plan_cdb(&c, &[0x2f, 0, 0, 0, 0, 0, 0, 0, 4, 0], none_t()),
        Plan::Verify {
            lba: 0,
            blocks: 4,
            byte_check: ByteCheck::Medium,
            residual: Residual::None
        }
    );
    // BYTCHK=1 at the end of the medium.
    assert_eq!(
        plan_cdb(
            &c,
            &[0x2f, 0x02, 0, 0, 0xff, 0xfe, 0, 0, 2, 0],
            write_t(2 * BS)
        ),
        Plan::Verify {
            lba: u64::from(LAST) - 1,
            blocks: 2,
            byte_check: ByteCheck::DataOut,
            residual: Residual::None
        }
    );
    // BYTCHK=3: one block compared against each.
    let p = plan_cdb(&c, &[0x2f, 0x06, 0, 0, 0, 0, 0, 0, 8, 0], write_t(BS));
    assert_eq!(p.data_out_len(BS), u64::from(BS));
    assert_eq!(
        p,
        Plan::Verify {
            lba: 0,
            blocks: 8,
            byte_check: ByteCheck::OneBlock,
            residual: Residual::None
        }
    );
    // More data-out than the one block: only the block is taken.
    assert!(matches!(
        plan_cdb(&c, &[0x2f, 0x06, 0, 0, 0, 0, 0, 0, 8, 0], write_t(8 * BS)),
        Plan::Verify { blocks: 8, residual: Residual::Underflow(r), .. } if r == 7 * BS
    ));
    // Less than one block: refused.
    let r = response(plan_cdb(
        &c,
        &[0x2f, 0x06, 0, 0, 0, 0, 0, 0, 8, 0],
        write_t(BS / 2),
    ));
    assert_eq!(r.sense, Some(DATA_OUT_REFUSED));
    // libiscsi test_verify10_0blocks.
    for lba in [BLOCKS as u32 + 1, 0x8000_0000, u32::MAX] {
        let l = lba.to_be_bytes();
        let cdb = [0x2f, 0x02, l[0], l[1], l[2], l[3], 0, 0, 0, 0];
        assert_eq!(sense_of(&plan_cdb(&c, &cdb, none_t())), LBA_OUT_OF_RANGE);
    }
    assert_eq!(
        plan_cdb(&c, &[0x2f, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], none_t()),
        good(Residual::None)
    );
}

#[test]
fn write_same() {
    let c = config();
    let ws10 = |lba: u32, blocks: u16, flags: u8| {
        let l = lba.to_be_bytes();
        let n = blocks.to_be_bytes();
        [0x41, flags, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0]
    };
    assert_eq!(
        plan_cdb(&c, &ws10(10, 256, 0x08), write_t(BS)),
        Plan::WriteSame {
            lba: 10,
            blocks: 256,
            unmap: true,
            ndob: false,
            fua: false,
            residual: Residual::None
        }
    );
    // WSNZ: zero blocks is an invalid NUMBER OF LOGICAL BLOCKS.
    assert_eq!(
        sense_of(&plan_cdb(&c, &ws10(0, 0, 0), write_t(BS))),
        Sense::invalid_field_in_cdb(7, None)
    );
    // ANCHOR (with UNMAP) is not supported (ANC_SUP = 0).
    assert_eq!(
        sense_of(&plan_cdb(&c, &ws10(0, 1, 0x18), write_t(BS))),
        Sense::invalid_field_in_cdb(1, Some(4))
    );
    // Past the end outranks the WRITE SAME limit (test_writesame10_beyond_eol).
    assert_eq!(
        sense_of(&plan_cdb(&c, &ws10(LAST, 0x2000, 0), write_t(BS))),
        LBA_OUT_OF_RANGE
    );
    assert_eq!(
        sense_of(&plan_cdb(&c, &ws10(0, 0x1001, 0), write_t(BS))),
        Sense::invalid_field_in_cdb(7, None)
    );
    // Data-out must be exactly one block (test_writesame10_invalid_dataout_size).
    for len in [BS / 2, 2 * BS, 0] {
        let r = response(plan_cdb(&c, &ws10(0, 1, 0x08), write_t(len)));
        assert_eq!(r.sense, Some(DATA_OUT_REFUSED), "{len}");
    }
    // WRITE SAME(16) with NDOB: no data-out at all.
    let ws16 = [0x93, 0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let p = plan_cdb(&c, &ws16, none_t());
    assert_eq!(p.data_out_len(BS), 0);
    assert!(matches!(
        p,
        Plan::WriteSame {
            ndob: true,
            unmap: true,
            blocks: 16,
            ..
        }
    ));
    // Without LBPWS the UNMAP bit is ignored: the blocks are written.
    let mut thick = config();
    thick.provisioning = Provisioning::default();
    assert!(matches!(
        plan_cdb(&thick, &ws10(0, 1, 0x08), write_t(BS)),
        Plan::WriteSame { unmap: false, .. }
    ));
}

#[test]
fn unmap() {
    let c = config();
    let p = plan_cdb(&c, &[0x42, 0, 0, 0, 0, 0, 0, 0, 40, 0], write_t(40));
    let Plan::ParameterList { len: 40, then } = p else {
        panic!("{p:?}")
    };
    // Two descriptors: 8 blocks at 0, none at the capacity itself.
    let mut params = vec![0, 38, 0, 32, 0, 0, 0, 0];
    params.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0]);
    params.extend_from_slice(&BLOCKS.to_be_bytes());
    params.extend_from_slice(&[0; 8]);
    assert_eq!(
        with_parameters(&c, then, &params),
        Plan::Unmap {
            ranges: vec![(0, 8)],
            residual: Residual::None
        }
    );
    // A descriptor past the end.
    let mut past = vec![0, 22, 0, 16];
    past.extend_from_slice(&[0; 4]);
    past.extend_from_slice(&(BLOCKS - 1).to_be_bytes());
    past.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 0]);
    assert_eq!(
        sense_of(&with_parameters(&c, then, &past)),
        LBA_OUT_OF_RANGE
    );
    // Only zero-block descriptors, or no parameter list: GOOD.
    let mut zero = vec![0, 22, 0, 16, 0, 0, 0, 0];
    zero.extend_from_slice(&[0; 16]);
    assert_eq!(with_parameters(&c, then, &zero), good(Residual::None));
    assert_eq!(
        plan_cdb(&c, &[0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0], none_t()),
        good(Residual::None)
    );
    // ANCHOR is not supported.
    assert_eq!(
        sense_of(&plan_cdb(
            &c,
            &[0x42, 1, 0, 0, 0, 0, 0, 0, 24, 0],
            write_t(24)
        )),
        Sense::invalid_field_in_cdb(1, Some(0))
    );
    // Without logical block provisioning UNMAP does not exist.
    let mut thick = config();
    thick.provisioning = Provisioning::default();
    assert_eq!(
        sense_of(&plan_cdb(
            &thick,
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            write_t(24)
        )),
        INVALID_COMMAND_OPERATION_CODE
    );
}

#[test]
fn compare_and_write() {
    let c = config();
    let caw = |lba: u8, blocks: u8| [0x89, 0, 0, 0, 0, 0, 0, 0, 0, lba, 0, 0, 0, blocks, 0, 0];
    let p = plan_cdb(&c, &caw(3, 2), write_t(4 * BS));
    assert_eq!(p.data_out_len(BS), u64::from(4 * BS));
    assert_eq!(
        p,
        Plan::CompareAndWrite {
            lba: 3,
            blocks: 2,
            fua: false
        }
    );
    // More than MAXIMUM COMPARE AND WRITE LENGTH (test_compareandwrite_simple).
    assert_eq!(
        sense_of(&plan_cdb(&c, &caw(0, 9), write_t(18 * BS))),
        Sense::invalid_field_in_cdb(13, None)
    );
    // Data-out not 2 * NLB blocks (test_compareandwrite_invalid_dataout_size).
    for (blocks, len) in [(1u8, 4 * BS), (3, 4 * BS)] {
        let r = response(plan_cdb(&c, &caw(0, blocks), write_t(len)));
        assert_eq!(
            r.sense.map(|s| s.key),
            Some(crate::sense::SenseKey::IllegalRequest)
        );
    }
    // Zero blocks: nothing to do.
    assert_eq!(plan_cdb(&c, &caw(0, 0), none_t()), good(Residual::None));
}

#[test]
fn sync_cache_prefetch_lba_status_capacity() {
    let c = config();
    assert_eq!(
        plan_cdb(&c, &[0x35, 0x02, 0, 0, 0, 16, 0, 0, 0, 0], none_t()),
        Plan::Flush {
            lba: 16,
            blocks: BLOCKS - 16,
            immed: true,
            residual: Residual::None
        }
    );
    assert_eq!(
        sense_of(&plan_cdb(
            &c,
            &[0x91, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0],
            none_t()
        )),
        LBA_OUT_OF_RANGE
    );
    // From the capacity itself to the end: nothing to flush.
    assert_eq!(
        plan_cdb(
            &c,
            &[0x91, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            none_t()
        ),
        good(Residual::None)
    );
    // PRE-FETCH: GOOD after the range check (test_prefetch10_*).
    assert_eq!(
        plan_cdb(&c, &[0x34, 0x02, 0, 0, 0, 0, 0x03, 0, 1, 0], none_t()),
        good(Residual::None)
    );
    assert_eq!(
        sense_of(&plan_cdb(
            &c,
            &[0x34, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
            none_t()
        )),
        LBA_OUT_OF_RANGE
    );
    // GET LBA STATUS (test_get_lba_status_beyond_eol).
    let gls = |lba: u64| {
        let mut c = [0u8; 16];
        c[0] = 0x9e;
        c[1] = 0x12;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[13] = 24;
        c
    };
    assert_eq!(
        plan_cdb(&c, &gls(BLOCKS - 1), read_t(24)),
        Plan::LbaStatus {
            lba: BLOCKS - 1,
            alloc_len: 24,
            expected_length: 24
        }
    );
    for lba in [BLOCKS, BLOCKS + 1, 1 << 63, u64::MAX] {
        assert_eq!(
            sense_of(&plan_cdb(&c, &gls(lba), read_t(24))),
            LBA_OUT_OF_RANGE
        );
    }
    // READ CAPACITY(10): last LBA and block length.
    let r = response(plan_cdb(&c, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], read_t(8)));
    assert_eq!(r.data_in, [0, 0, 0xff, 0xff, 0, 0, 0x02, 0x00]);
    // READ CAPACITY(16) with every allocation length below 16
    // (test_readcapacity16_alloclen).
    for alloc in 0..16u8 {
        let cdb = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, alloc, 0, 0];
        let r = response(plan_cdb(&c, &cdb, read_t(u32::from(alloc))));
        assert_eq!(r.data_in.len(), usize::from(alloc));
        assert_eq!(r.residual, Residual::None);
    }
}
