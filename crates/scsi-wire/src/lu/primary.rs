//! Planning of the SPC-5 commands: INQUIRY, MODE SENSE/SELECT, REQUEST
//! SENSE, REPORT LUNS, REPORT TARGET PORT GROUPS, REPORT SUPPORTED
//! OPERATION CODES, persistent reservations and the no-op commands a
//! non-removable disk accepts.
//!
//! Invariant: every data-in leaves through [`finish_data_in`], so it is cut
//! to the allocation length and the expected length with its residual.

use super::{finish_data_in, respond, LuConfig, Pending, PendingKind, Plan, Residual, Transfer};
use crate::cdb::{opcode, supported_opcodes, Command};
use crate::data::mode::{mode_sense, ModeSenseRequest, ModeState};
use crate::data::{
    find_opcode, report_supported_opcodes_all, report_supported_opcodes_one,
    report_target_port_groups, standard_inquiry, vpd_page, OpcodeUsage, UnitIdentity,
};
use crate::sense::{Sense, SenseKey, INVALID_COMMAND_OPERATION_CODE};

pub(super) fn plan(
    config: &LuConfig,
    mode: &ModeState,
    port: u16,
    command: &Command,
    transfer: Transfer,
) -> Plan {
    let no_data = Residual::of(transfer.expected_length, 0);
    let result = match *command {
        Command::TestUnitReady | Command::StartStopUnit { .. } | Command::SendDiagnostic { .. } => {
            Ok(respond(None, no_data))
        }
        // Not removable: PREVENT (01b) and ALLOW (00b) have nothing to
        // lock; 10b/11b are obsolete/MMC-only.
        Command::PreventAllowMediumRemoval { prevent } => {
            if prevent > 1 {
                Err(Sense::invalid_field_in_cdb(4, Some(1)))
            } else {
                Ok(respond(None, no_data))
            }
        }
        Command::RequestSense { desc, alloc_len } => {
            Ok(request_sense(None, desc, alloc_len, transfer))
        }
        Command::Inquiry {
            evpd,
            page_code,
            alloc_len,
        } => inquiry(config, port, evpd, page_code, alloc_len, transfer),
        Command::ModeSense {
            ten,
            dbd,
            llbaa,
            page_control,
            page,
            subpage,
            alloc_len,
        } => {
            let request = ModeSenseRequest {
                ten,
                dbd,
                llbaa,
                page_control,
                page,
                subpage,
            };
            let mut data = Vec::new();
            mode_sense(
                request,
                mode,
                config.blocks,
                config.block_size(),
                config.read_only,
                &mut data,
            )
            .map(|()| {
                Plan::Respond(finish_data_in(
                    data,
                    u32::from(alloc_len),
                    transfer.data_in(),
                ))
            })
        }
        Command::ModeSelect {
            ten,
            pf,
            sp,
            param_len,
        } => Ok(parameter_list(
            u32::from(param_len),
            PendingKind::ModeSelect { ten, pf, sp },
            transfer,
        )),
        Command::ReportLuns {
            select_report,
            alloc_len,
        } => Ok(Plan::ReportLuns {
            select_report,
            alloc_len,
            expected_length: transfer.data_in(),
        }),
        Command::ReportTargetPortGroups {
            extended,
            alloc_len,
        } => {
            if config.port_groups.is_empty() {
                Err(INVALID_COMMAND_OPERATION_CODE)
            } else {
                let mut data = Vec::new();
                report_target_port_groups(
                    &config.port_groups,
                    extended,
                    config.implicit_transition_secs,
                    &mut data,
                );
                Ok(Plan::Respond(finish_data_in(
                    data,
                    alloc_len,
                    transfer.data_in(),
                )))
            }
        }
        Command::ReportSupportedOpcodes {
            rctd,
            options,
            opcode,
            service_action,
            alloc_len,
        } => report_supported(config, rctd, options, opcode, service_action)
            .map(|data| Plan::Respond(finish_data_in(data, alloc_len, transfer.data_in()))),
        Command::PersistentReserveIn { .. } | Command::Reserve { .. } | Command::Release { .. } => {
            Ok(Plan::NeedsState)
        }
        Command::PersistentReserveOut {
            service_action,
            scope,
            kind,
            param_len,
        } => Ok(parameter_list(
            param_len,
            PendingKind::PersistentReserveOut {
                service_action,
                scope,
                kind,
            },
            transfer,
        )),
        // Block commands are planned in `block`; nothing reaches here.
        _ => Err(INVALID_COMMAND_OPERATION_CODE),
    };
    result.unwrap_or_else(|sense| respond(Some(sense), Residual::None))
}

/// REQUEST SENSE data: `pending` (a unit attention being delivered) or NO
/// SENSE, in the format DESC asks for.
pub(super) fn request_sense(
    pending: Option<Sense>,
    desc: bool,
    alloc_len: u8,
    transfer: Transfer,
) -> Plan {
    let sense = pending.unwrap_or(Sense::new(SenseKey::NoSense, 0, 0));
    let mut data = Vec::new();
    sense.encode(desc, &mut data);
    Plan::Respond(finish_data_in(
        data,
        u32::from(alloc_len),
        transfer.data_in(),
    ))
}

/// The data-out phase of MODE SELECT / PERSISTENT RESERVE OUT: collect the
/// lesser of the parameter list length and the expected length.
fn parameter_list(param_len: u32, kind: PendingKind, transfer: Transfer) -> Plan {
    let expected = transfer.data_out();
    Plan::ParameterList {
        len: param_len.min(expected),
        then: Pending {
            kind,
            residual: Residual::of(expected, u64::from(param_len)),
        },
    }
}

fn inquiry(
    config: &LuConfig,
    port: u16,
    evpd: bool,
    page_code: u8,
    alloc_len: u16,
    transfer: Transfer,
) -> Result<Plan, Sense> {
    let identity = identity_for_port(config, port);
    let mut data = Vec::new();
    if evpd {
        vpd_page(
            page_code,
            &identity,
            &config.limits,
            &config.provisioning,
            &mut data,
        )?;
    } else {
        standard_inquiry(&identity, &mut data);
    }
    Ok(Plan::Respond(finish_data_in(
        data,
        u32::from(alloc_len),
        transfer.data_in(),
    )))
}

/// The identity as seen through `port`: its relative port and port group.
fn identity_for_port(config: &LuConfig, port: u16) -> UnitIdentity {
    let mut identity = config.identity.clone();
    identity.relative_target_port = port;
    if let Some(group) = config
        .port_groups
        .iter()
        .find(|g| g.relative_ports.contains(&port))
    {
        identity.target_port_group = group.id;
    }
    identity.alua = !config.port_groups.is_empty();
    identity
}

/// The commands this logical unit offers: the decoder's list minus UNMAP
/// without logical block provisioning and REPORT TARGET PORT GROUPS
/// without ALUA.
pub(super) fn offered_opcodes(config: &LuConfig) -> Vec<OpcodeUsage> {
    let mut ops = supported_opcodes();
    ops.retain(|u| match (u.opcode, u.service_action) {
        (opcode::UNMAP, _) => config.provisioning.unmap_supported(),
        (opcode::MAINTENANCE_IN, Some(sa)) => {
            sa != u16::from(crate::cdb::service_action::REPORT_TARGET_PORT_GROUPS)
                || !config.port_groups.is_empty()
        }
        _ => true,
    });
    ops
}

fn report_supported(
    config: &LuConfig,
    rctd: bool,
    options: u8,
    requested: u8,
    service_action: u16,
) -> Result<Vec<u8>, Sense> {
    let ops = offered_opcodes(config);
    let mut data = Vec::new();
    if options == 0 {
        report_supported_opcodes_all(&ops, rctd, &mut data);
    } else {
        let op = find_opcode(&ops, options, requested, service_action)?;
        report_supported_opcodes_one(op, rctd, &mut data);
    }
    Ok(data)
}
