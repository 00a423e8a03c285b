//! The PDUs that answer a SCSI command: Data-In carrying a read's data
//! (with the status in the last one when it is GOOD: phase collapse) and
//! SCSI Response carrying status, sense data and residuals (RFC 7143
//! §11.4, §11.7).
//!
//! Invariants:
//! - Data-In PDUs carry at most the initiator's MaxRecvDataSegmentLength
//!   each, and a sequence (ended by the F bit) at most MaxBurstLength;
//!   DataSN counts the command's Data-In PDUs from 0, buffer offsets are
//!   contiguous.
//! - Every status-bearing PDU takes the next StatSN and reports the
//!   current ExpCmdSN and MaxCmdSN.

use super::{emit, Session, RESERVED_TAG};
use basalt_iscsi_wire::digest::DataDigest;
use basalt_iscsi_wire::pdu::{
    data_padding, DataIn, DataInStatus, Residual, ScsiResponse, TargetPdu,
};
use std::ops::Range;

/// A piece of a Data-In PDU, in sending order: encoded header bytes, a
/// range of the read's buffer, or the padding and data digest after it.
pub(crate) enum Part<'a> {
    Bytes(&'a [u8]),
    Data(Range<usize>),
    /// The data segment `Range` ends here: zero padding to 4 bytes, and its
    /// data digest (when negotiated; the caller computes it over the range
    /// with [`data_digest`]).
    Trailer {
        pad: usize,
        digest: Option<Range<usize>>,
    },
}

/// The data digest of `data` as sent after it (padding included).
pub(crate) fn data_digest(data: &[u8]) -> [u8; 4] {
    let mut d = DataDigest::new();
    d.update(data);
    d.finish_bytes()
}

impl Session {
    /// Encodes the SCSI Response of task `itt`: `status`, the sense data
    /// (empty for none) and the residual.
    pub fn scsi_response(
        &mut self,
        itt: u32,
        status: u8,
        sense: &[u8],
        residual: Residual,
        out: &mut Vec<u8>,
    ) {
        let pdu = TargetPdu::ScsiResponse(ScsiResponse {
            bidi_read_residual: Residual::None,
            residual,
            response: 0,
            status,
            itt,
            snack_tag: 0,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            exp_data_sn: 0,
        });
        // The data segment is SenseLength (2 bytes) and the sense data.
        let mut segment = [0u8; 2 + 252];
        let n = sense.len().min(252);
        segment[..2].copy_from_slice(&(n as u16).to_be_bytes());
        segment[2..2 + n].copy_from_slice(&sense[..n]);
        let data = match n {
            0 => &[][..],
            _ => &segment[..2 + n],
        };
        emit(&pdu, data, self.params.digests, out);
    }

    /// Emits the Data-In PDUs of `len` bytes of read data of task `itt`
    /// (`0..len` of the caller's buffer, `len > 0`). With `status`, the last PDU
    /// carries it and the residual (phase collapse), and takes a StatSN;
    /// without, a SCSI Response is to follow. Returns the number of
    /// Data-In PDUs (the ExpDataSN of a following response).
    pub fn data_in(
        &mut self,
        itt: u32,
        lun: u64,
        len: usize,
        status: Option<(u8, Residual)>,
        header: &mut Vec<u8>,
        mut emit_part: impl FnMut(Part<'_>),
    ) -> u32 {
        let segment = self.params.send_segment.max(512) as usize;
        let burst = self.params.max_burst.max(512) as usize;
        let digests = self.params.digests;
        let mut offset = 0;
        let mut data_sn = 0u32;
        let mut in_burst = 0;
        while offset < len {
            let n = (len - offset).min(segment).min(burst - in_burst);
            let end = offset + n;
            let last = end >= len;
            in_burst += n;
            let final_pdu = last || in_burst >= burst;
            if final_pdu {
                in_burst = 0;
            }
            let status = match (last, status) {
                (true, Some((status, residual))) => Some(DataInStatus {
                    status,
                    stat_sn: self.next_stat_sn(),
                    residual,
                }),
                _ => None,
            };
            let pdu = TargetPdu::DataIn(DataIn {
                final_pdu,
                ack: false,
                status,
                lun,
                itt,
                ttt: RESERVED_TAG,
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn(),
                data_sn,
                buffer_offset: offset as u32,
            });
            header.clear();
            if let Err(err) = pdu.encode_header(n as u32, digests, header) {
                tracing::error!("cannot encode a Data-In header: {err}");
                return data_sn;
            }
            emit_part(Part::Bytes(header));
            if n > 0 {
                emit_part(Part::Data(offset..end));
                emit_part(Part::Trailer {
                    pad: data_padding(n),
                    digest: digests.data.then_some(offset..end),
                });
            }
            data_sn = data_sn.wrapping_add(1);
            offset = end;
        }
        data_sn
    }
}
