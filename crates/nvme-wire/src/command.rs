//! Typed views of the admin and NVM I/O commands a target serves, read from
//! a parsed [`Sqe`]: opcodes, Identify CNS values, log page identifiers,
//! feature identifiers, the fields of each command, and the result dwords
//! some of them complete with.
//!
//! Invariants: viewing never fails (every field value is representable and
//! judging it is the target's business); counts that the wire carries 0's
//! based are exposed 1-based under a name that says so (`blocks`,
//! `ranges`, `dwords`); unknown opcodes are kept, not lost.

use crate::bytes::{le32, le64};
use crate::fabrics::{parse_fabrics, FabricsCommand, FABRICS_OPCODE};
use crate::sqe::Sqe;
use crate::WireError;

/// Admin command opcodes.
pub mod admin_opcode {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const NAMESPACE_MANAGEMENT: u8 = 0x0d;
    pub const FIRMWARE_COMMIT: u8 = 0x10;
    pub const FIRMWARE_DOWNLOAD: u8 = 0x11;
    pub const DEVICE_SELF_TEST: u8 = 0x14;
    pub const NAMESPACE_ATTACHMENT: u8 = 0x15;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const DIRECTIVE_SEND: u8 = 0x19;
    pub const DIRECTIVE_RECEIVE: u8 = 0x1a;
    pub const FORMAT_NVM: u8 = 0x80;
    pub const SECURITY_SEND: u8 = 0x81;
    pub const SECURITY_RECEIVE: u8 = 0x82;
    pub const SANITIZE: u8 = 0x84;
}

/// NVM command set I/O opcodes.
pub mod io_opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const VERIFY: u8 = 0x0c;
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    pub const RESERVATION_REPORT: u8 = 0x0e;
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    pub const RESERVATION_RELEASE: u8 = 0x15;
    pub const COPY: u8 = 0x19;
}

/// Identify CNS values (CDW10 bits 7:0).
pub mod cns {
    /// Identify Namespace for NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list (NSIDs greater than NSID).
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list for NSID.
    pub const NAMESPACE_ID_DESCRIPTORS: u8 = 0x03;
    /// NVM Set list.
    pub const NVM_SET_LIST: u8 = 0x04;
    /// I/O command set specific Identify Namespace (CSI).
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O command set specific Identify Controller (CSI).
    pub const CSI_CONTROLLER: u8 = 0x06;
    /// Active Namespace ID list for a command set (CSI).
    pub const CSI_ACTIVE_NAMESPACES: u8 = 0x07;
    /// I/O command set independent Identify Namespace.
    pub const INDEPENDENT_NAMESPACE: u8 = 0x08;
}

/// Log page identifiers.
pub mod log_id {
    pub const SUPPORTED_LOG_PAGES: u8 = 0x00;
    pub const ERROR_INFORMATION: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    pub const COMMANDS_SUPPORTED_AND_EFFECTS: u8 = 0x05;
    pub const DEVICE_SELF_TEST: u8 = 0x06;
    pub const ASYMMETRIC_NAMESPACE_ACCESS: u8 = 0x0c;
    /// Discovery log page (discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
}

/// Feature identifiers.
pub mod feature_id {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues: CDW11 and result are NSQ (15:0) and NCQ (31:16),
    /// both 0's based.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    /// Asynchronous Event Configuration: which events are reported.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const TIMESTAMP: u8 = 0x0e;
    /// Keep Alive Timer: CDW11 is KATO in milliseconds.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    pub const HOST_IDENTIFIER: u8 = 0x81;
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
    pub const NAMESPACE_WRITE_PROTECTION: u8 = 0x84;
}

/// Asynchronous event completion values (result DW0 of an Asynchronous
/// Event Request, see [`async_event_result`]).
pub mod async_event {
    /// Event type: error status.
    pub const TYPE_ERROR: u8 = 0;
    /// Event type: SMART / health status.
    pub const TYPE_SMART: u8 = 1;
    /// Event type: notice.
    pub const TYPE_NOTICE: u8 = 2;
    /// Event type: I/O command specific status.
    pub const TYPE_IO_COMMAND_SPECIFIC: u8 = 6;
    /// Event type: vendor specific.
    pub const TYPE_VENDOR: u8 = 7;
    /// Notice: namespace attribute changed (read the Changed Namespace
    /// List log page).
    pub const NOTICE_NAMESPACE_ATTRIBUTE_CHANGED: u8 = 0x00;
    /// Notice: firmware activation starting.
    pub const NOTICE_FIRMWARE_ACTIVATION: u8 = 0x01;
    /// Notice: telemetry log changed.
    pub const NOTICE_TELEMETRY_LOG_CHANGED: u8 = 0x02;
    /// Notice: asymmetric namespace access change (read the ANA log page).
    pub const NOTICE_ANA_CHANGE: u8 = 0x03;
    /// Notice: discovery log page changed (discovery controllers).
    pub const NOTICE_DISCOVERY_LOG_CHANGED: u8 = 0xf0;
}

/// Result DW0 of an Asynchronous Event Request: event type (bits 2:0),
/// event information (15:8), log page to read (23:16).
pub fn async_event_result(event_type: u8, info: u8, log_page: u8) -> u32 {
    u32::from(event_type & 0x7) | (u32::from(info) << 8) | (u32::from(log_page) << 16)
}

/// Result DW0 of Set/Get Features Number of Queues: the queue counts
/// allocated, 0's based (NSQA in 15:0, NCQA in 31:16).
pub fn number_of_queues_result(submission_queues: u16, completion_queues: u16) -> u32 {
    u32::from(submission_queues.saturating_sub(1))
        | (u32::from(completion_queues.saturating_sub(1)) << 16)
}

/// Which queue a command arrived on; admin and I/O opcodes overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueType {
    Admin,
    Io,
}

/// Any command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Admin(AdminCommand),
    Io(IoCommand),
    /// Opcode 7Fh on any queue.
    Fabrics(FabricsCommand),
}

/// Views a submission queue entry as a typed command.
pub fn parse_command(sqe: &Sqe, queue: QueueType) -> Command {
    if sqe.opcode == FABRICS_OPCODE {
        return Command::Fabrics(parse_fabrics(sqe));
    }
    match queue {
        QueueType::Admin => Command::Admin(parse_admin(sqe)),
        QueueType::Io => Command::Io(parse_io(sqe)),
    }
}

/// Admin commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdminCommand {
    Identify(Identify),
    GetLogPage(GetLogPage),
    SetFeatures(SetFeatures),
    GetFeatures(GetFeatures),
    /// Keep Alive: no fields.
    KeepAlive,
    /// Asynchronous Event Request: no fields; completes when an event
    /// occurs (see [`async_event_result`]).
    AsyncEventRequest,
    Abort(Abort),
    /// Any other opcode, for the target to refuse.
    Other {
        opcode: u8,
        nsid: u32,
    },
}

/// Identify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identify {
    /// Controller or namespace structure to return (see [`cns`]).
    pub cns: u8,
    /// Controller identifier (CDW10 bits 31:16).
    pub cntid: u16,
    /// Namespace identifier.
    pub nsid: u32,
    /// CNS specific identifier (CDW11 bits 15:0).
    pub cns_specific_id: u16,
    /// Command set identifier (CDW11 bits 31:24).
    pub csi: u8,
    /// UUID index (CDW14 bits 6:0).
    pub uuid_index: u8,
}

/// Get Log Page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GetLogPage {
    /// Namespace identifier (0xFFFFFFFF: all namespaces).
    pub nsid: u32,
    /// Log page identifier (CDW10 bits 7:0, see [`log_id`]).
    pub lid: u8,
    /// Log specific field (CDW10 bits 14:8), e.g. RGO for the ANA log.
    pub lsp: u8,
    /// Retain asynchronous event (CDW10 bit 15).
    pub rae: bool,
    /// Number of dwords to return, 1-based (NUMDU:NUMDL + 1).
    pub dwords: u64,
    /// Log specific identifier (CDW11 bits 31:16).
    pub lsi: u16,
    /// Byte offset into the log page (CDW12-13).
    pub offset: u64,
    /// UUID index (CDW14 bits 6:0).
    pub uuid_index: u8,
    /// Offset type (CDW14 bit 23): offset is an entry index, not bytes.
    pub offset_is_index: bool,
    /// Command set identifier (CDW14 bits 31:24).
    pub csi: u8,
}

impl GetLogPage {
    /// Bytes requested.
    pub fn len(&self) -> u64 {
        self.dwords * 4
    }

    /// Never true: at least one dword is always requested.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Set Features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SetFeatures {
    pub nsid: u32,
    /// Feature identifier (CDW10 bits 7:0, see [`feature_id`]).
    pub fid: u8,
    /// Save across resets (CDW10 bit 31).
    pub save: bool,
    /// Feature specific CDW11 to CDW13.
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    /// UUID index (CDW14 bits 6:0).
    pub uuid_index: u8,
    /// Feature specific CDW15.
    pub cdw15: u32,
}

/// Get Features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GetFeatures {
    pub nsid: u32,
    /// Feature identifier (CDW10 bits 7:0, see [`feature_id`]).
    pub fid: u8,
    /// Select (CDW10 bits 10:8): 0 current, 1 default, 2 saved, 3
    /// supported capabilities.
    pub select: u8,
    /// Feature specific CDW11.
    pub cdw11: u32,
    /// UUID index (CDW14 bits 6:0).
    pub uuid_index: u8,
}

/// Abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Abort {
    /// Submission queue of the command to abort (CDW10 bits 15:0).
    pub sqid: u16,
    /// Its command identifier (CDW10 bits 31:16).
    pub cid: u16,
}

fn parse_admin(s: &Sqe) -> AdminCommand {
    match s.opcode {
        admin_opcode::IDENTIFY => AdminCommand::Identify(Identify {
            cns: s.cdw10 as u8,
            cntid: (s.cdw10 >> 16) as u16,
            nsid: s.nsid,
            cns_specific_id: s.cdw11 as u16,
            csi: (s.cdw11 >> 24) as u8,
            uuid_index: (s.cdw14 & 0x7f) as u8,
        }),
        admin_opcode::GET_LOG_PAGE => {
            let numd = (s.cdw10 >> 16) | ((s.cdw11 & 0xffff) << 16);
            AdminCommand::GetLogPage(GetLogPage {
                nsid: s.nsid,
                lid: s.cdw10 as u8,
                lsp: ((s.cdw10 >> 8) & 0x7f) as u8,
                rae: s.cdw10 & (1 << 15) != 0,
                dwords: u64::from(numd) + 1,
                lsi: (s.cdw11 >> 16) as u16,
                offset: s.cdw12_13(),
                uuid_index: (s.cdw14 & 0x7f) as u8,
                offset_is_index: s.cdw14 & (1 << 23) != 0,
                csi: (s.cdw14 >> 24) as u8,
            })
        }
        admin_opcode::SET_FEATURES => AdminCommand::SetFeatures(SetFeatures {
            nsid: s.nsid,
            fid: s.cdw10 as u8,
            save: s.cdw10 & (1 << 31) != 0,
            cdw11: s.cdw11,
            cdw12: s.cdw12,
            cdw13: s.cdw13,
            uuid_index: (s.cdw14 & 0x7f) as u8,
            cdw15: s.cdw15,
        }),
        admin_opcode::GET_FEATURES => AdminCommand::GetFeatures(GetFeatures {
            nsid: s.nsid,
            fid: s.cdw10 as u8,
            select: ((s.cdw10 >> 8) & 0x7) as u8,
            cdw11: s.cdw11,
            uuid_index: (s.cdw14 & 0x7f) as u8,
        }),
        admin_opcode::KEEP_ALIVE => AdminCommand::KeepAlive,
        admin_opcode::ASYNC_EVENT_REQUEST => AdminCommand::AsyncEventRequest,
        admin_opcode::ABORT => AdminCommand::Abort(Abort {
            sqid: s.cdw10 as u16,
            cid: (s.cdw10 >> 16) as u16,
        }),
        opcode => AdminCommand::Other {
            opcode,
            nsid: s.nsid,
        },
    }
}

/// NVM I/O commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoCommand {
    /// Flush the volatile write cache of `nsid` (0xFFFFFFFF: all).
    Flush {
        nsid: u32,
    },
    Read(ReadWrite),
    Write(ReadWrite),
    WriteZeroes(WriteZeroes),
    DatasetManagement(DatasetManagement),
    /// Any other opcode, for the target to refuse.
    Other {
        opcode: u8,
        nsid: u32,
    },
}

/// Read or Write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadWrite {
    pub nsid: u32,
    /// Starting LBA (CDW10-11).
    pub slba: u64,
    /// Number of logical blocks, 1-based (CDW12 bits 15:0, plus one).
    pub blocks: u32,
    /// Force unit access (CDW12 bit 30).
    pub fua: bool,
    /// Limited retry (CDW12 bit 31).
    pub limited_retry: bool,
    /// Protection information field (CDW12 bits 29:26).
    pub prinfo: u8,
    /// Dataset management hints (CDW13 bits 7:0).
    pub dsm: u8,
}

impl ReadWrite {
    /// One past the last LBA, `None` on overflow.
    pub fn end_lba(&self) -> Option<u64> {
        self.slba.checked_add(u64::from(self.blocks))
    }
}

/// Write Zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriteZeroes {
    pub nsid: u32,
    /// Starting LBA (CDW10-11).
    pub slba: u64,
    /// Number of logical blocks, 1-based (CDW12 bits 15:0, plus one).
    pub blocks: u32,
    /// Deallocate the blocks if possible (CDW12 bit 25).
    pub deallocate: bool,
    /// Force unit access (CDW12 bit 30).
    pub fua: bool,
    /// Limited retry (CDW12 bit 31).
    pub limited_retry: bool,
}

impl WriteZeroes {
    /// One past the last LBA, `None` on overflow.
    pub fn end_lba(&self) -> Option<u64> {
        self.slba.checked_add(u64::from(self.blocks))
    }
}

/// Dataset Management; the ranges are the command's data (16 bytes each,
/// see [`parse_dsm_ranges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatasetManagement {
    pub nsid: u32,
    /// Number of ranges, 1-based (CDW10 bits 7:0, plus one): 1 to 256.
    pub ranges: u16,
    /// Integral dataset for read (CDW11 bit 0).
    pub integral_read: bool,
    /// Integral dataset for write (CDW11 bit 1).
    pub integral_write: bool,
    /// Deallocate (CDW11 bit 2): the ranges may be unmapped.
    pub deallocate: bool,
}

impl DatasetManagement {
    /// Bytes of range data the command carries.
    pub fn data_len(&self) -> usize {
        usize::from(self.ranges) * DSM_RANGE_LEN
    }
}

/// Length of one Dataset Management range.
pub const DSM_RANGE_LEN: usize = 16;

/// One Dataset Management range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DsmRange {
    /// Context attributes (bytes 0-3).
    pub attributes: u32,
    /// Length in logical blocks (bytes 4-7).
    pub blocks: u32,
    /// Starting LBA (bytes 8-15).
    pub slba: u64,
}

impl DsmRange {
    /// The 16 bytes of the range.
    pub fn to_bytes(&self) -> [u8; DSM_RANGE_LEN] {
        let mut b = [0u8; DSM_RANGE_LEN];
        crate::bytes::put32(&mut b, 0, self.attributes);
        crate::bytes::put32(&mut b, 4, self.blocks);
        crate::bytes::put64(&mut b, 8, self.slba);
        b
    }
}

/// Iterator over the ranges of a Dataset Management command's data.
#[derive(Debug, Clone)]
pub struct DsmRanges<'a> {
    chunks: std::slice::ChunksExact<'a, u8>,
}

impl Iterator for DsmRanges<'_> {
    type Item = DsmRange;

    fn next(&mut self) -> Option<DsmRange> {
        self.chunks.next().map(|c| DsmRange {
            attributes: le32(c, 0),
            blocks: le32(c, 4),
            slba: le64(c, 8),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

/// Reads `count` ranges from the command's data, which must hold at least
/// `count * 16` bytes.
pub fn parse_dsm_ranges(data: &[u8], count: u16) -> Result<DsmRanges<'_>, WireError> {
    let needed = usize::from(count) * DSM_RANGE_LEN;
    let bytes = data.get(..needed).ok_or(WireError::TooShort {
        what: "dataset management ranges",
        needed,
        got: data.len(),
    })?;
    Ok(DsmRanges {
        chunks: bytes.chunks_exact(DSM_RANGE_LEN),
    })
}

fn parse_io(s: &Sqe) -> IoCommand {
    let blocks = (s.cdw12 & 0xffff) + 1;
    match s.opcode {
        io_opcode::FLUSH => IoCommand::Flush { nsid: s.nsid },
        io_opcode::READ | io_opcode::WRITE => {
            let rw = ReadWrite {
                nsid: s.nsid,
                slba: s.cdw10_11(),
                blocks,
                fua: s.cdw12 & (1 << 30) != 0,
                limited_retry: s.cdw12 & (1 << 31) != 0,
                prinfo: ((s.cdw12 >> 26) & 0xf) as u8,
                dsm: s.cdw13 as u8,
            };
            if s.opcode == io_opcode::READ {
                IoCommand::Read(rw)
            } else {
                IoCommand::Write(rw)
            }
        }
        io_opcode::WRITE_ZEROES => IoCommand::WriteZeroes(WriteZeroes {
            nsid: s.nsid,
            slba: s.cdw10_11(),
            blocks,
            deallocate: s.cdw12 & (1 << 25) != 0,
            fua: s.cdw12 & (1 << 30) != 0,
            limited_retry: s.cdw12 & (1 << 31) != 0,
        }),
        io_opcode::DATASET_MANAGEMENT => IoCommand::DatasetManagement(DatasetManagement {
            nsid: s.nsid,
            ranges: (s.cdw10 & 0xff) as u16 + 1,
            integral_read: s.cdw11 & 1 != 0,
            integral_write: s.cdw11 & 2 != 0,
            deallocate: s.cdw11 & 4 != 0,
        }),
        opcode => IoCommand::Other {
            opcode,
            nsid: s.nsid,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqe(opcode: u8) -> Sqe {
        Sqe::new(opcode, 0x1234)
    }

    #[test]
    fn write_with_fua() {
        let mut s = sqe(io_opcode::WRITE);
        s.nsid = 1;
        s.cdw10 = 0x89ab_cdef;
        s.cdw11 = 0x0123_4567;
        s.cdw12 = (1 << 30) | 7; // FUA, 8 blocks
        let Command::Io(IoCommand::Write(w)) = parse_command(&s, QueueType::Io) else {
            panic!("not a write");
        };
        assert_eq!(w.slba, 0x0123_4567_89ab_cdef);
        assert_eq!(w.blocks, 8);
        assert!(w.fua);
        assert!(!w.limited_retry);
        assert_eq!(w.end_lba(), Some(0x0123_4567_89ab_cdf7));
        // The same opcode on the admin queue is Create I/O SQ.
        assert!(matches!(
            parse_command(&s, QueueType::Admin),
            Command::Admin(AdminCommand::Other { opcode: 1, .. })
        ));
    }

    #[test]
    fn read_max_blocks_and_flush() {
        let mut s = sqe(io_opcode::READ);
        s.cdw12 = 0xffff;
        let Command::Io(IoCommand::Read(r)) = parse_command(&s, QueueType::Io) else {
            panic!("not a read");
        };
        assert_eq!(r.blocks, 65536);
        assert!(matches!(
            parse_command(&sqe(io_opcode::FLUSH), QueueType::Io),
            Command::Io(IoCommand::Flush { nsid: 0 })
        ));
    }

    #[test]
    fn write_zeroes_and_dsm() {
        let mut s = sqe(io_opcode::WRITE_ZEROES);
        s.cdw12 = (1 << 25) | 15;
        let Command::Io(IoCommand::WriteZeroes(w)) = parse_command(&s, QueueType::Io) else {
            panic!("not write zeroes");
        };
        assert!(w.deallocate && !w.fua);
        assert_eq!(w.blocks, 16);

        let mut s = sqe(io_opcode::DATASET_MANAGEMENT);
        s.cdw10 = 1; // two ranges
        s.cdw11 = 4; // deallocate
        let Command::Io(IoCommand::DatasetManagement(d)) = parse_command(&s, QueueType::Io) else {
            panic!("not DSM");
        };
        assert_eq!((d.ranges, d.deallocate, d.data_len()), (2, true, 32));
        let mut data = Vec::new();
        let r0 = DsmRange {
            attributes: 0,
            blocks: 8,
            slba: 100,
        };
        let r1 = DsmRange {
            attributes: 1,
            blocks: 0x10000,
            slba: u64::MAX - 1,
        };
        data.extend_from_slice(&r0.to_bytes());
        data.extend_from_slice(&r1.to_bytes());
        assert_eq!(data[4..8], [8, 0, 0, 0]);
        let ranges: Vec<_> = parse_dsm_ranges(&data, d.ranges).unwrap().collect();
        assert_eq!(ranges, vec![r0, r1]);
        assert!(parse_dsm_ranges(&data[..31], 2).is_err());
    }

    #[test]
    fn admin_views() {
        let mut s = sqe(admin_opcode::IDENTIFY);
        s.cdw10 = 0x0005_0001;
        s.cdw11 = 0x0200_0007;
        let Command::Admin(AdminCommand::Identify(i)) = parse_command(&s, QueueType::Admin) else {
            panic!("not identify");
        };
        assert_eq!((i.cns, i.cntid, i.cns_specific_id, i.csi), (1, 5, 7, 2));

        let mut s = sqe(admin_opcode::GET_LOG_PAGE);
        s.nsid = 0xffff_ffff;
        s.cdw10 =
            (0x03ff << 16) | (1 << 15) | (1 << 8) | u32::from(log_id::ASYMMETRIC_NAMESPACE_ACCESS);
        s.cdw11 = 0x0001_0000 | 0x0002;
        s.cdw12 = 4096;
        s.cdw13 = 1;
        let Command::Admin(AdminCommand::GetLogPage(g)) = parse_command(&s, QueueType::Admin)
        else {
            panic!("not get log page");
        };
        assert_eq!(g.lid, 0x0c);
        assert_eq!(g.lsp, 1);
        assert!(g.rae);
        assert_eq!(g.dwords, 0x2_03ff + 1);
        assert_eq!(g.len(), (0x2_03ff + 1) * 4);
        assert_eq!(g.lsi, 1);
        assert_eq!(g.offset, (1 << 32) + 4096);

        let mut s = sqe(admin_opcode::SET_FEATURES);
        s.cdw10 = (1 << 31) | u32::from(feature_id::KEEP_ALIVE_TIMER);
        s.cdw11 = 120_000;
        let Command::Admin(AdminCommand::SetFeatures(f)) = parse_command(&s, QueueType::Admin)
        else {
            panic!("not set features");
        };
        assert_eq!((f.fid, f.save, f.cdw11), (0x0f, true, 120_000));

        let mut s = sqe(admin_opcode::GET_FEATURES);
        s.cdw10 = (3 << 8) | u32::from(feature_id::NUMBER_OF_QUEUES);
        let Command::Admin(AdminCommand::GetFeatures(f)) = parse_command(&s, QueueType::Admin)
        else {
            panic!("not get features");
        };
        assert_eq!((f.fid, f.select), (7, 3));
        assert!(matches!(
            parse_command(&sqe(admin_opcode::KEEP_ALIVE), QueueType::Admin),
            Command::Admin(AdminCommand::KeepAlive)
        ));
        assert!(matches!(
            parse_command(&sqe(admin_opcode::ASYNC_EVENT_REQUEST), QueueType::Admin),
            Command::Admin(AdminCommand::AsyncEventRequest)
        ));
    }

    #[test]
    fn results() {
        assert_eq!(
            async_event_result(
                async_event::TYPE_NOTICE,
                async_event::NOTICE_ANA_CHANGE,
                log_id::ASYMMETRIC_NAMESPACE_ACCESS
            ),
            0x000c_0302
        );
        assert_eq!(number_of_queues_result(4, 4), 0x0003_0003);
        assert_eq!(number_of_queues_result(0, 1), 0);
    }
}
