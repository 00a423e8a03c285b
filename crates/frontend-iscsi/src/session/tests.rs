//! The session state machine driven by PDUs an initiator would send, its
//! output decoded with the target-side codec.

use super::*;
use basalt_iscsi_wire::decoder::decode_target;
use basalt_iscsi_wire::pdu::{DataOut, ScsiCommand, TaskAttribute};

const WINDOW: u32 = 4;

fn params(initial_r2t: bool) -> Params {
    Params {
        send_segment: 8192,
        recv_segment: 65536,
        max_burst: 16384,
        first_burst: 8192,
        immediate_data: true,
        initial_r2t,
        digests: Digests::NONE,
        window: WINDOW,
        max_transfer: 1 << 20,
        target_name: "iqn.2026-11.io.basalt:volume:v".into(),
        portal: "127.0.0.1:3260,1".into(),
    }
}

/// A WRITE(10) CDB of `blocks` 512-byte blocks (the test's data-out rule
/// is 512 bytes per block from byte 7-8).
fn write_cdb(blocks: u16) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

fn data_out_len(cdb: &[u8], edtl: u32, _read: bool, _write: bool) -> u32 {
    match cdb.first() {
        Some(0x2a) => (u32::from(u16::from_be_bytes([cdb[7], cdb[8]])) * 512).min(edtl),
        _ => 0,
    }
}

fn command(itt: u32, cmd_sn: u32, cdb: [u8; 16], edtl: u32, final_pdu: bool) -> InitiatorPdu {
    InitiatorPdu::ScsiCommand(ScsiCommand {
        immediate: false,
        final_pdu,
        read: cdb[0] != 0x2a && edtl > 0,
        write: cdb[0] == 0x2a,
        attr: TaskAttribute::Simple,
        lun: 0,
        itt,
        expected_data_transfer_length: edtl,
        cmd_sn,
        exp_stat_sn: 0,
        bhs_cdb: cdb,
        extended_cdb: Vec::new(),
        bidi_read_expected_data_transfer_length: None,
    })
}

fn data_out(itt: u32, ttt: u32, data_sn: u32, offset: u32, final_pdu: bool) -> InitiatorPdu {
    InitiatorPdu::DataOut(DataOut {
        final_pdu,
        lun: 0,
        itt,
        ttt,
        exp_stat_sn: 0,
        data_sn,
        buffer_offset: offset,
    })
}

fn wire(pdu: &InitiatorPdu, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    pdu.encode(data, Digests::NONE, &mut out).unwrap();
    out
}

/// Feeds `bytes` and returns the target PDUs the session answered with.
fn feed(session: &mut Session, bytes: &[u8]) -> Vec<TargetPdu> {
    let mut out = Vec::new();
    let received = session.receive(bytes, &mut out, &data_out_len).unwrap();
    assert_eq!(received.consumed, bytes.len());
    session.issue_r2ts(&mut out);
    decode_all(&out)
}

fn decode_all(mut bytes: &[u8]) -> Vec<TargetPdu> {
    let cfg = DecoderConfig {
        digests: Digests::NONE,
        max_data_segment: 1 << 20,
    };
    let mut pdus = Vec::new();
    while !bytes.is_empty() {
        match decode_target(bytes, &cfg).unwrap() {
            Decoded::Pdu { pdu, consumed, .. } => {
                pdus.push(pdu);
                bytes = &bytes[consumed..];
            }
            Decoded::NeedMore(_) => panic!("truncated output"),
        }
    }
    pdus
}

#[test]
fn a_write_collects_immediate_data_then_its_r2t_sequences() {
    let mut s = Session::new(params(true), 10, 1);
    // 40 KiB write: 8 KiB immediate, then R2Ts of at most 16 KiB.
    let payload: Vec<u8> = (0..40960u32).map(|i| i as u8).collect();
    let out = feed(
        &mut s,
        &wire(&command(7, 1, write_cdb(80), 40960, true), &payload[..8192]),
    );
    let TargetPdu::ReadyToTransfer(r2t) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (
            r2t.buffer_offset,
            r2t.desired_data_transfer_length,
            r2t.r2t_sn
        ),
        (8192, 16384, 0)
    );
    assert!(s.ready.is_empty());
    // The sequence in two PDUs (DataSN 0, 1), F on the last.
    let ttt = r2t.ttt;
    let mut bytes = wire(&data_out(7, ttt, 0, 8192, false), &payload[8192..16384]);
    bytes.extend(wire(
        &data_out(7, ttt, 1, 16384, true),
        &payload[16384..24576],
    ));
    let out = feed(&mut s, &bytes);
    let TargetPdu::ReadyToTransfer(r2t) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (
            r2t.buffer_offset,
            r2t.desired_data_transfer_length,
            r2t.r2t_sn
        ),
        (24576, 16384, 1)
    );
    let out = feed(
        &mut s,
        &wire(&data_out(7, r2t.ttt, 0, 24576, true), &payload[24576..]),
    );
    assert!(out.is_empty());
    let ready = std::mem::take(&mut s.ready);
    assert_eq!(ready.len(), 1);
    assert_eq!(&ready[0].data.as_ref().unwrap()[..], &payload[..]);
    let mut out = Vec::new();
    assert!(s.finish(7, &mut out));
}

#[test]
fn unsolicited_data_beyond_what_the_unit_takes_is_discarded() {
    let mut s = Session::new(params(false), 0, 1);
    // EDTL 8 KiB, the CDB writes 1 block: 512 bytes are taken, the rest of
    // the unsolicited burst is received and dropped, no R2T.
    let payload = vec![0x5au8; 8192];
    let mut bytes = wire(&command(1, 1, write_cdb(1), 8192, false), &payload[..4096]);
    bytes.extend(wire(
        &data_out(1, RESERVED_TAG, 0, 4096, true),
        &payload[4096..],
    ));
    let out = feed(&mut s, &bytes);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(s.ready.len(), 1);
    assert_eq!(s.ready[0].data.as_ref().unwrap().len(), 512);
}

#[test]
fn a_wrong_data_sn_fails_the_task_not_the_connection() {
    let mut s = Session::new(params(true), 0, 1);
    let out = feed(&mut s, &wire(&command(3, 1, write_cdb(8), 4096, true), &[]));
    let TargetPdu::ReadyToTransfer(r2t) = &out[0] else {
        panic!("{out:?}")
    };
    let out = feed(
        &mut s,
        &wire(&data_out(3, r2t.ttt, 5, 0, true), &[0u8; 4096]),
    );
    assert!(matches!(out[0], TargetPdu::Reject(_)), "{out:?}");
    let ready = std::mem::take(&mut s.ready);
    assert!(ready[0].data_error && ready[0].data.is_none());
    // Further Data-Out of the failed task is ignored.
    assert!(feed(
        &mut s,
        &wire(&data_out(3, r2t.ttt, 0, 0, true), &[0u8; 4096])
    )
    .is_empty());
}

#[test]
fn commands_outside_the_window_are_ignored_and_max_cmd_sn_tracks_tasks() {
    let mut s = Session::new(params(true), 0, 1);
    let tur = [0u8; 16];
    // CmdSN 1..=WINDOW fill the window.
    for sn in 1..=WINDOW {
        feed(&mut s, &wire(&command(sn, sn, tur, 0, true), &[]));
    }
    assert_eq!(s.ready.len(), WINDOW as usize);
    assert_eq!(s.max_cmd_sn(), WINDOW); // ExpCmdSN 5, nothing free.
                                        // Beyond MaxCmdSN, and below ExpCmdSN: silently ignored.
    feed(&mut s, &wire(&command(100, WINDOW + 1, tur, 0, true), &[]));
    feed(&mut s, &wire(&command(101, 1, tur, 0, true), &[]));
    assert_eq!(s.ready.len(), WINDOW as usize);
    // Answering one opens one slot.
    let mut out = Vec::new();
    assert!(s.finish(1, &mut out));
    assert_eq!(s.max_cmd_sn(), WINDOW + 1);
    feed(&mut s, &wire(&command(102, WINDOW + 1, tur, 0, true), &[]));
    assert_eq!(s.ready.len(), WINDOW as usize + 1);
}

#[test]
fn abort_task_waits_for_the_running_task_and_suppresses_its_response() {
    let mut s = Session::new(params(true), 0, 1);
    feed(&mut s, &wire(&command(9, 1, [0u8; 16], 0, true), &[]));
    s.ready.clear(); // Now running.
    let abort = InitiatorPdu::TaskManagementRequest(TaskManagementRequest {
        immediate: true,
        function: TmfFunction::AbortTask,
        lun: 0,
        itt: 50,
        referenced_task_tag: 9,
        cmd_sn: 2,
        exp_stat_sn: 0,
        ref_cmd_sn: 1,
        exp_data_sn: 0,
    });
    assert!(feed(&mut s, &wire(&abort, &[])).is_empty());
    let mut out = Vec::new();
    assert!(!s.finish(9, &mut out), "an aborted task is not answered");
    let out = decode_all(&out);
    let TargetPdu::TaskManagementResponse(r) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!((r.itt, r.response), (50, TmfResponse::FunctionComplete));
    // Aborting what is not there.
    let out = feed(&mut s, &wire(&abort, &[]));
    let TargetPdu::TaskManagementResponse(r) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(r.response, TmfResponse::TaskDoesNotExist);
}

#[test]
fn nop_and_logout_are_answered_with_consecutive_stat_sns() {
    let mut s = Session::new(params(true), 41, 1);
    let ping = InitiatorPdu::NopOut(NopOut {
        immediate: true,
        lun: 0,
        itt: 5,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 41,
    });
    let logout = InitiatorPdu::LogoutRequest(LogoutRequest {
        immediate: true,
        reason: LogoutReason::CloseSession,
        itt: 6,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 42,
    });
    let mut bytes = wire(&ping, b"ping");
    bytes.extend(wire(&logout, &[]));
    // Bytes after the logout are not read.
    let tail = wire(&ping, &[]);
    bytes.extend(&tail);
    let mut out = Vec::new();
    let received = s.receive(&bytes, &mut out, &data_out_len).unwrap();
    assert_eq!(received.consumed, bytes.len() - tail.len());
    assert!(s.logged_out);
    let out = decode_all(&out);
    let TargetPdu::NopIn(nop) = &out[0] else {
        panic!("{out:?}")
    };
    let TargetPdu::LogoutResponse(bye) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!((nop.itt, nop.stat_sn, bye.stat_sn), (5, 41, 42));
}

#[test]
fn an_itt_in_use_is_fatal() {
    let mut s = Session::new(params(true), 0, 1);
    let mut out = Vec::new();
    let bytes = wire(&command(1, 1, [0u8; 16], 0, true), &[]);
    s.receive(&bytes, &mut out, &data_out_len).unwrap();
    let again = wire(&command(1, 2, [0u8; 16], 0, true), &[]);
    assert!(s.receive(&again, &mut out, &data_out_len).is_err());
}

#[test]
fn read_data_goes_out_in_segments_and_bursts_with_the_status_on_the_last() {
    let mut s = Session::new(params(true), 7, 1);
    let mut header = Vec::new();
    let mut bytes = Vec::new();
    let payload: Vec<u8> = (0..40000u32).map(|i| (i * 7) as u8).collect();
    let status = Some((0u8, basalt_iscsi_wire::pdu::Residual::Underflow(96)));
    let pdus = s.data_in(
        3,
        0,
        payload.len(),
        status,
        &mut header,
        |part| match part {
            Part::Bytes(b) => bytes.extend_from_slice(b),
            Part::Data(r) => bytes.extend_from_slice(&payload[r]),
            Part::Trailer { pad, .. } => bytes.extend(std::iter::repeat_n(0u8, pad)),
        },
    );
    assert_eq!(pdus, 5); // 8 KiB segments
    let out = decode_all(&bytes);
    let mut offset = 0;
    for (sn, pdu) in out.iter().enumerate() {
        let TargetPdu::DataIn(d) = pdu else { panic!() };
        assert_eq!((d.data_sn, d.buffer_offset), (sn as u32, offset));
        // Bursts of 16 KiB end with F; the last carries the status.
        let end_of_burst = offset % 16384 == 8192 || sn == out.len() - 1;
        assert_eq!(d.final_pdu, end_of_burst, "{d:?}");
        assert_eq!(d.status.is_some(), sn == out.len() - 1);
        offset += 8192;
    }
    let TargetPdu::DataIn(last) = out.last().unwrap() else {
        panic!()
    };
    assert_eq!(last.status.unwrap().stat_sn, 7);
}

#[test]
fn immediate_commands_beyond_the_task_table_are_rejected() {
    let mut s = Session::new(params(true), 0, 1);
    let immediate = |itt: u32| {
        let mut pdu = command(itt, 1, [0u8; 16], 0, true);
        if let InitiatorPdu::ScsiCommand(c) = &mut pdu {
            c.immediate = true;
        }
        wire(&pdu, &[])
    };
    for itt in 0..WINDOW {
        assert!(feed(&mut s, &immediate(itt)).is_empty());
    }
    let out = feed(&mut s, &immediate(99));
    let TargetPdu::Reject(reject) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(reject.reason, RejectReason::ImmediateCommandReject);
    assert_eq!(s.ready.len(), WINDOW as usize);
}
