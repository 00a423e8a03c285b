//! Feeds arbitrary bytes through `basalt-scsi-wire` as an iSCSI target's
//! logical unit would meet them: the first bytes choose the transfer (the
//! expected length and the R/W bits) and the nexus, the rest is split into
//! a CDB and a parameter list. Every CDB is decoded, planned by the pure
//! logic and by the stateful unit (unit attentions, reservations), and a
//! plan waiting for a parameter list gets the rest of the bytes; the
//! parameter parsers (UNMAP, MODE SELECT, PERSISTENT RESERVE OUT) and the
//! sense decoder see them too.
//!
//! Beyond "never panics", it checks that no answer carries more data-in
//! than the initiator expects and that a plan never asks for more data-out
//! than the transfer allows.

#![no_main]

use basalt_scsi_wire::data::mode::ModeState;
use basalt_scsi_wire::data::{
    parse_unmap, AluaState, BlockLimits, PortGroup, Provisioning, UnitIdentity,
};
use basalt_scsi_wire::lu::{self, LuConfig, LuState, Plan, Transfer};
use basalt_scsi_wire::reservation::Nexus;
use basalt_scsi_wire::{cdb, sense::Sense};
use libfuzzer_sys::fuzz_target;

fn config() -> LuConfig {
    LuConfig {
        identity: UnitIdentity {
            vendor: *b"BASALT  ",
            product: *b"Basalt volume   ",
            revision: *b"0.1 ",
            serial: "fuzz".into(),
            uuid: [9; 16],
            target_name: "iqn.2026-11.io.basalt:volume:fuzz".into(),
            target_port_group: 1,
            relative_target_port: 1,
            alua: true,
        },
        limits: BlockLimits {
            block_size: 512,
            max_transfer_blocks: 8192,
            optimal_transfer_blocks: 256,
            max_unmap_blocks: 1 << 20,
            max_unmap_descriptors: 256,
            unmap_granularity_blocks: 8,
            max_write_same_blocks: 1 << 15,
            max_compare_and_write_blocks: 16,
            physical_block_exponent: 3,
        },
        provisioning: Provisioning {
            thin: true,
            unmap: true,
            write_same_unmap: true,
            zeroes_after_unmap: true,
        },
        blocks: 1 << 21,
        read_only: false,
        port_groups: vec![PortGroup {
            id: 1,
            state: AluaState::ActiveOptimized,
            relative_ports: vec![1],
        }],
        implicit_transition_secs: 10,
    }
}

fn check(plan: &Plan, transfer: Transfer) {
    if let Plan::Respond(response) = plan {
        let expected = if transfer.read { transfer.expected_length } else { 0 };
        assert!(response.data_in.len() as u64 <= u64::from(expected), "{plan:?}");
    }
    let data_out = plan.data_out_len(512);
    let allowed = if transfer.write { transfer.expected_length } else { 0 };
    assert!(data_out <= u64::from(allowed), "{plan:?} {transfer:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let transfer = Transfer {
        expected_length: u32::from_be_bytes([0, head[0], head[1], head[2]]),
        read: head[3] & 1 != 0,
        write: head[3] & 2 != 0,
    };
    let nexus = Nexus {
        initiator_port: format!("iqn.2026-11.io.fuzz:{},i,0x{:02x}", head[4] % 3, head[5]),
        relative_target_port: 1,
    };
    let cdb_len = usize::from(head[4] >> 2).min(rest.len());
    let (cdb_bytes, params) = rest.split_at(cdb_len);
    let config = config();
    let mode = ModeState::default();

    if let Ok(command) = cdb::parse(cdb_bytes) {
        let plan = lu::plan(&config, &mode, 1, &command, transfer);
        check(&plan, transfer);
    }
    let mut state = LuState::new(mode);
    // Twice: the first answer is the new nexus's unit attention.
    for _ in 0..2 {
        let plan = state.execute(&config, &nexus, cdb_bytes, transfer);
        check(&plan, transfer);
        if let Plan::ParameterList { then, .. } = plan {
            let next = state.with_parameters(&config, &nexus, then, params);
            check(&next, Transfer { write: false, ..transfer });
        }
    }
    let _ = parse_unmap(params, &config.limits);
    let _ = Sense::decode(params);
});
