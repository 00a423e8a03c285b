//! Tests of the logical unit's decisions. CDBs are literal bytes; the
//! expected sense values are those libiscsi's iscsi-test-cu checks.

mod block;
mod primary;
mod props;
mod state;

use super::*;
use crate::cdb::parse;
use crate::data::{AluaState, BlockLimits, PortGroup, Provisioning, UnitIdentity};
use crate::reservation::Nexus;

pub(super) const BS: u32 = 512;
pub(super) const BLOCKS: u64 = 0x1_0000;

pub(super) fn config() -> LuConfig {
    LuConfig {
        identity: UnitIdentity {
            vendor: *b"BASALT  ",
            product: *b"VOLUME          ",
            revision: *b"0001",
            serial: "0123456789".into(),
            uuid: [7; 16],
            target_name: "iqn.2024-01.io.basalt:vol".into(),
            target_port_group: 0,
            relative_target_port: 1,
            alua: false,
        },
        limits: BlockLimits {
            block_size: BS,
            max_transfer_blocks: 1024,
            optimal_transfer_blocks: 8,
            max_unmap_blocks: 0x1_0000,
            max_unmap_descriptors: 16,
            unmap_granularity_blocks: 8,
            max_write_same_blocks: 0x1000,
            max_compare_and_write_blocks: 8,
            physical_block_exponent: 0,
        },
        provisioning: Provisioning {
            thin: true,
            unmap: true,
            write_same_unmap: true,
            zeroes_after_unmap: true,
        },
        blocks: BLOCKS,
        read_only: false,
        port_groups: Vec::new(),
        implicit_transition_secs: 10,
    }
}

pub(super) fn alua_config(state: AluaState) -> LuConfig {
    LuConfig {
        port_groups: vec![
            PortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                relative_ports: vec![1],
            },
            PortGroup {
                id: 2,
                state,
                relative_ports: vec![2],
            },
        ],
        ..config()
    }
}

pub(super) fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.2024-01.test:{name},i,0x000000000001"),
        relative_target_port: 1,
    }
}

pub(super) fn read_t(len: u32) -> Transfer {
    Transfer {
        expected_length: len,
        read: true,
        write: false,
    }
}

pub(super) fn write_t(len: u32) -> Transfer {
    Transfer {
        expected_length: len,
        read: false,
        write: true,
    }
}

pub(super) fn none_t() -> Transfer {
    Transfer::default()
}

/// Plans a literal CDB with the default mode parameters from port 1.
pub(super) fn plan_cdb(config: &LuConfig, cdb: &[u8], transfer: Transfer) -> Plan {
    plan_mode(config, &ModeState::default(), cdb, transfer)
}

pub(super) fn plan_mode(
    config: &LuConfig,
    mode: &ModeState,
    cdb: &[u8],
    transfer: Transfer,
) -> Plan {
    let command = parse(cdb).expect("valid CDB");
    plan(config, mode, 1, &command, transfer)
}

/// The sense of a CHECK CONDITION response plan.
pub(super) fn sense_of(plan: &Plan) -> Sense {
    match plan {
        Plan::Respond(Response {
            status: crate::sense::STATUS_CHECK_CONDITION,
            sense: Some(s),
            ..
        }) => *s,
        other => panic!("not a CHECK CONDITION: {other:?}"),
    }
}

/// The response of a [`Plan::Respond`].
pub(super) fn response(plan: Plan) -> Response {
    match plan {
        Plan::Respond(r) => r,
        other => panic!("not a response: {other:?}"),
    }
}

pub(super) fn good(residual: Residual) -> Plan {
    Plan::Respond(Response::good().with_residual(residual))
}

pub(super) fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let n = blocks.to_be_bytes();
    [0x28, 0, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0]
}

pub(super) fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

pub(super) fn write16(lba: u64, blocks: u32, flags: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}
