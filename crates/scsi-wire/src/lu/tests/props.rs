//! Completion helpers and "never panics" properties.

use super::*;
use crate::cdb::ByteCheck;
use crate::sense::{
    INTERNAL_TARGET_FAILURE, MISCOMPARE_DURING_VERIFY, SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
    UNRECOVERED_READ_ERROR, WRITE_ERROR,
};
use proptest::prelude::*;

#[test]
fn residual_of() {
    assert_eq!(Residual::of(512, 512), Residual::None);
    assert_eq!(Residual::of(10000, 512), Residual::Underflow(9488));
    assert_eq!(Residual::of(200, 512), Residual::Overflow(312));
    assert_eq!(Residual::of(0, u64::MAX), Residual::Overflow(u32::MAX));
}

#[test]
fn miscompare_points_at_the_first_difference() {
    // libiscsi test_compareandwrite_miscompare_sense: INFORMATION is the
    // offset of the differing byte.
    let a = [b'B'; 512];
    for i in [0usize, 1, 300, 511] {
        let mut b = a;
        b[i] = b'Z';
        assert_eq!(
            miscompare(&b, &a),
            Some(MISCOMPARE_DURING_VERIFY.with_information(i as u64))
        );
    }
    assert_eq!(miscompare(&a, &a), None);
    assert_eq!(
        miscompare(&a[..10], &a[..4]),
        Some(MISCOMPARE_DURING_VERIFY.with_information(4))
    );
}

#[test]
fn verify_data_modes() {
    let block = [7u8; 4];
    let medium = [7u8; 12];
    assert_eq!(verify_data(ByteCheck::OneBlock, &block, &medium, 4), Ok(()));
    let mut bad = medium;
    bad[9] = 0;
    assert_eq!(
        verify_data(ByteCheck::OneBlock, &block, &bad, 4),
        Err(MISCOMPARE_DURING_VERIFY.with_information(9))
    );
    assert_eq!(
        verify_data(ByteCheck::DataOut, &medium, &bad, 4),
        Err(MISCOMPARE_DURING_VERIFY.with_information(9))
    );
    assert_eq!(verify_data(ByteCheck::Medium, &[], &bad, 4), Ok(()));
}

#[test]
fn data_out_refusal_is_an_illegal_request() {
    // libiscsi's residual tests accept only ILLEGAL REQUEST with ASC/ASCQ
    // 0Eh/03h for a refused data-out.
    let mut out = Vec::new();
    DATA_OUT_REFUSED.encode_fixed(&mut out);
    assert_eq!(
        out,
        [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x0e, 0x03, 0, 0, 0, 0]
    );
}

#[test]
fn io_failures() {
    assert_eq!(
        io_failure_sense(IoFailure::OutOfSpace),
        SPACE_ALLOCATION_FAILED_WRITE_PROTECT
    );
    assert_eq!(
        io_failure_sense(IoFailure::Read { lba: Some(9) }),
        UNRECOVERED_READ_ERROR.with_information(9)
    );
    assert_eq!(
        io_failure_sense(IoFailure::Write { lba: None }),
        WRITE_ERROR
    );
    assert_eq!(io_failure_sense(IoFailure::Other), INTERNAL_TARGET_FAILURE);
}

#[test]
fn write_same_deallocation() {
    let prov = config().provisioning;
    assert!(write_same_may_deallocate(&prov, true, Some(&[0; 512])));
    assert!(write_same_may_deallocate(&prov, true, None));
    assert!(!write_same_may_deallocate(&prov, true, Some(&[1; 512])));
    assert!(!write_same_may_deallocate(&prov, false, Some(&[0; 512])));
    let no_lbprz = Provisioning {
        zeroes_after_unmap: false,
        ..prov
    };
    assert!(!write_same_may_deallocate(&no_lbprz, true, Some(&[0; 512])));
}

#[test]
fn finish_data_in_cuts() {
    let r = finish_data_in(vec![1; 100], 50, 200);
    assert_eq!(r.data_in.len(), 50);
    assert_eq!(r.residual, Residual::Underflow(150));
    let r = finish_data_in(vec![1; 100], 200, 30);
    assert_eq!(r.data_in.len(), 30);
    assert_eq!(r.residual, Residual::Overflow(70));
}

fn any_transfer() -> impl Strategy<Value = Transfer> {
    (any::<u32>(), any::<bool>(), any::<bool>()).prop_map(|(expected_length, read, write)| {
        Transfer {
            expected_length,
            read,
            write,
        }
    })
}

fn any_config() -> impl Strategy<Value = LuConfig> {
    (
        0u64..=u64::MAX,
        prop::sample::select(vec![0u32, 1, 512, 4096]),
        any::<bool>(),
        any::<bool>(),
        0u32..4,
        prop::option::of(0u8..4),
    )
        .prop_map(|(blocks, bs, read_only, thin, max_transfer, alua)| {
            let mut c = config();
            c.blocks = blocks;
            c.limits.block_size = bs;
            c.limits.max_transfer_blocks = max_transfer;
            c.read_only = read_only;
            c.provisioning.thin = thin;
            if let Some(state) = alua {
                let state = [
                    AluaState::ActiveNonOptimized,
                    AluaState::Standby,
                    AluaState::Unavailable,
                    AluaState::Transitioning,
                ][usize::from(state)];
                c = LuConfig {
                    blocks,
                    ..alua_config(state)
                };
            }
            c
        })
}

fn any_cdb() -> impl Strategy<Value = Vec<u8>> {
    let ops: Vec<u8> = crate::cdb::supported_opcodes()
        .into_iter()
        .map(|u| u.opcode)
        .collect();
    (
        prop::sample::select(ops),
        prop::collection::vec(any::<u8>(), 0..20),
    )
        .prop_map(|(op, rest)| {
            let mut v = vec![op];
            v.extend(rest);
            v
        })
}

proptest! {
    #[test]
    fn plan_never_panics(
        c in any_config(), cdb in any_cdb(), t in any_transfer(), port in 0u16..4, wce: bool,
    ) {
        if let Ok(command) = parse(&cdb) {
            let p = plan(&c, &ModeState { write_cache: wce }, port, &command, t);
            // Data-in never exceeds what the initiator expects.
            if let Plan::Respond(r) = &p {
                prop_assert!(r.data_in.len() as u64 <= u64::from(t.expected_length));
            }
            if let Plan::Read { data_in_len, .. } = &p {
                prop_assert!(*data_in_len <= t.expected_length);
            }
            let _ = p.data_out_len(c.limits.block_size);
        }
    }

    #[test]
    fn execute_and_parameters_never_panic(
        c in any_config(),
        cmds in prop::collection::vec((any_cdb(), any_transfer(), 0u8..3), 1..12),
        params in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut s = LuState::default();
        let nexuses = [nexus("a"), nexus("b"), nexus("c")];
        for (cdb, t, who) in cmds {
            let n = &nexuses[usize::from(who)];
            if let Plan::ParameterList { len, then } = s.execute(&c, n, &cdb, t) {
                let cut = params.len().min(len as usize);
                let _ = s.with_parameters(&c, n, then, &params[..cut]);
                let _ = with_parameters(&c, then, &params[..cut]);
            }
        }
    }
}
