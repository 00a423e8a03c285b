//! Encoders for the Get Log Page payloads a target returns: Error
//! Information, SMART / Health Information, Asymmetric Namespace Access,
//! Changed Namespace List and the Discovery log page, plus the windowing
//! helper that cuts a page to the offset and length a command asked for.
//!
//! Invariants: every page has the size and field offsets the base and
//! fabrics specifications give, with reserved bytes zero; encoders that
//! can fail check everything before writing, so on error the output is
//! untouched; the discovery log parses back to what was encoded.

use crate::bytes::{
    check_ascii, check_nqn, le16, le64, nul_terminated, padded_ascii, put, put128, put16, put32,
    put64, put8, put_ascii, put_nul_padded, u8_at, NQN_MAX_LEN,
};
use crate::completion::Status;
use crate::WireError;

/// Length of one Error Information log entry.
pub const ERROR_LOG_ENTRY_LEN: usize = 64;
/// Length of the SMART / Health Information log page.
pub const SMART_LOG_LEN: usize = 512;
/// Length of the Changed Namespace List log page.
pub const CHANGED_NAMESPACE_LOG_LEN: usize = 4096;
/// Length of the discovery log page header, and of each entry.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

/// Copies the window `[offset, offset + out.len())` of a log page into
/// `out`, zero-filling past the page's end. Fails when `offset` lies
/// beyond the page (a target answers Invalid Field in Command).
pub fn copy_log_window(page: &[u8], offset: u64, out: &mut [u8]) -> Result<(), WireError> {
    let start = usize::try_from(offset)
        .ok()
        .filter(|&s| s <= page.len())
        .ok_or(WireError::BadField {
            what: "Get Log Page",
            offset: 48,
            reason: "log page offset beyond the end of the page",
        })?;
    let avail = page.get(start..).unwrap_or(&[]);
    let n = avail.len().min(out.len());
    let (head, tail) = out.split_at_mut(n);
    head.copy_from_slice(avail.get(..n).unwrap_or(&[]));
    tail.fill(0);
    Ok(())
}

/// One Error Information log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ErrorLogEntry {
    /// Unique, increasing error count; 0 marks an unused entry (bytes 0-7).
    pub error_count: u64,
    /// Submission queue ID (bytes 8-9).
    pub sqid: u16,
    /// Command ID (bytes 10-11).
    pub cid: u16,
    /// Status of the failed command (bytes 12-13, phase tag 0).
    pub status: Status,
    /// Parameter error location: byte (bits 7:0) and bit (10:8) in the
    /// command (bytes 14-15); 0xFFFF when not specific.
    pub parameter_location: u16,
    /// First LBA that failed (bytes 16-23).
    pub lba: u64,
    /// Namespace (bytes 24-27).
    pub nsid: u32,
    /// Vendor specific log page available (byte 28).
    pub vendor_info: u8,
    /// Transport type (byte 29).
    pub trtype: u8,
    /// Command specific information (bytes 32-39).
    pub command_specific: u64,
    /// Transport type specific information (bytes 40-41).
    pub transport_specific: u16,
}

impl ErrorLogEntry {
    /// The 64 bytes.
    pub fn to_bytes(&self) -> [u8; ERROR_LOG_ENTRY_LEN] {
        let mut b = [0u8; ERROR_LOG_ENTRY_LEN];
        put64(&mut b, 0, self.error_count);
        put16(&mut b, 8, self.sqid);
        put16(&mut b, 10, self.cid);
        put16(&mut b, 12, self.status.to_field(false));
        put16(&mut b, 14, self.parameter_location);
        put64(&mut b, 16, self.lba);
        put32(&mut b, 24, self.nsid);
        put8(&mut b, 28, self.vendor_info);
        put8(&mut b, 29, self.trtype);
        put64(&mut b, 32, self.command_specific);
        put16(&mut b, 40, self.transport_specific);
        b
    }
}

/// Appends the Error Information log: the given entries (newest first)
/// followed by `total_entries - entries.len()` empty entries, where
/// `total_entries` is ELPE + 1 of Identify Controller.
pub fn encode_error_log(entries: &[ErrorLogEntry], total_entries: usize, out: &mut Vec<u8>) {
    let count = total_entries.max(entries.len());
    out.reserve(count * ERROR_LOG_ENTRY_LEN);
    for e in entries {
        out.extend_from_slice(&e.to_bytes());
    }
    out.resize(out.len() + (count - entries.len()) * ERROR_LOG_ENTRY_LEN, 0);
}

/// Critical warning bits of the SMART / Health log (byte 0).
pub mod critical_warning {
    pub const SPARE_BELOW_THRESHOLD: u8 = 1 << 0;
    pub const TEMPERATURE: u8 = 1 << 1;
    pub const RELIABILITY_DEGRADED: u8 = 1 << 2;
    pub const READ_ONLY: u8 = 1 << 3;
    pub const VOLATILE_BACKUP_FAILED: u8 = 1 << 4;
    pub const PMR_READ_ONLY: u8 = 1 << 5;
}

/// SMART / Health Information (log page 02h). Counters are 128-bit on the
/// wire; "data units" are thousands of 512-byte units, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmartLog {
    /// Critical warning (byte 0, see [`critical_warning`]).
    pub critical_warning: u8,
    /// Composite temperature in kelvin (bytes 1-2).
    pub temperature: u16,
    /// Available spare, percent (byte 3).
    pub available_spare: u8,
    /// Available spare threshold, percent (byte 4).
    pub available_spare_threshold: u8,
    /// Percentage used (byte 5).
    pub percentage_used: u8,
    /// Endurance group critical warning summary (byte 6).
    pub endurance_group_warning: u8,
    /// Data units read (bytes 32-47).
    pub data_units_read: u128,
    /// Data units written (bytes 48-63).
    pub data_units_written: u128,
    /// Host read commands (bytes 64-79).
    pub host_read_commands: u128,
    /// Host write commands (bytes 80-95).
    pub host_write_commands: u128,
    /// Controller busy time, minutes (bytes 96-111).
    pub controller_busy_time: u128,
    /// Power cycles (bytes 112-127).
    pub power_cycles: u128,
    /// Power on hours (bytes 128-143).
    pub power_on_hours: u128,
    /// Unsafe shutdowns (bytes 144-159).
    pub unsafe_shutdowns: u128,
    /// Media and data integrity errors (bytes 160-175).
    pub media_errors: u128,
    /// Number of error information log entries (bytes 176-191).
    pub error_log_entries: u128,
    /// Warning composite temperature time, minutes (bytes 192-195).
    pub warning_temperature_time: u32,
    /// Critical composite temperature time, minutes (bytes 196-199).
    pub critical_temperature_time: u32,
    /// Temperature sensors 1-8 in kelvin, 0 if absent (bytes 200-215).
    pub temperature_sensors: [u16; 8],
}

impl SmartLog {
    /// The 512 bytes.
    pub fn to_bytes(&self) -> [u8; SMART_LOG_LEN] {
        let mut b = [0u8; SMART_LOG_LEN];
        put8(&mut b, 0, self.critical_warning);
        put16(&mut b, 1, self.temperature);
        put8(&mut b, 3, self.available_spare);
        put8(&mut b, 4, self.available_spare_threshold);
        put8(&mut b, 5, self.percentage_used);
        put8(&mut b, 6, self.endurance_group_warning);
        put128(&mut b, 32, self.data_units_read);
        put128(&mut b, 48, self.data_units_written);
        put128(&mut b, 64, self.host_read_commands);
        put128(&mut b, 80, self.host_write_commands);
        put128(&mut b, 96, self.controller_busy_time);
        put128(&mut b, 112, self.power_cycles);
        put128(&mut b, 128, self.power_on_hours);
        put128(&mut b, 144, self.unsafe_shutdowns);
        put128(&mut b, 160, self.media_errors);
        put128(&mut b, 176, self.error_log_entries);
        put32(&mut b, 192, self.warning_temperature_time);
        put32(&mut b, 196, self.critical_temperature_time);
        for (i, t) in self.temperature_sensors.iter().enumerate() {
            put16(&mut b, 200 + 2 * i, *t);
        }
        b
    }
}

/// Asymmetric namespace access states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnaState {
    /// 01h: optimized.
    Optimized,
    /// 02h: non-optimized.
    NonOptimized,
    /// 03h: inaccessible.
    Inaccessible,
    /// 04h: persistent loss.
    PersistentLoss,
    /// 0Fh: change (transitioning).
    Change,
}

impl AnaState {
    /// The state's value.
    pub fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 0x01,
            AnaState::NonOptimized => 0x02,
            AnaState::Inaccessible => 0x03,
            AnaState::PersistentLoss => 0x04,
            AnaState::Change => 0x0f,
        }
    }

    /// The state for a value, `None` if undefined.
    pub fn from_code(code: u8) -> Option<AnaState> {
        Some(match code {
            0x01 => AnaState::Optimized,
            0x02 => AnaState::NonOptimized,
            0x03 => AnaState::Inaccessible,
            0x04 => AnaState::PersistentLoss,
            0x0f => AnaState::Change,
            _ => return None,
        })
    }
}

/// The LSP bit of Get Log Page for the ANA log: Return Groups Only (omit
/// the NSID lists).
pub const ANA_LSP_RETURN_GROUPS_ONLY: u8 = 1 << 0;

/// One ANA group descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnaGroup {
    /// ANA group ID (bytes 0-3).
    pub id: u32,
    /// Change count of this group (bytes 8-15).
    pub change_count: u64,
    /// State of the group as seen through this controller (byte 16).
    pub state: AnaState,
    /// Attached namespaces of the group, increasing (from byte 32).
    pub nsids: Vec<u32>,
}

/// Asymmetric Namespace Access log page (0Ch).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnaLog {
    /// Change count of the log (bytes 0-7).
    pub change_count: u64,
    /// Group descriptors (their count is bytes 8-9).
    pub groups: Vec<AnaGroup>,
}

impl AnaLog {
    /// Appends the page: a 16-byte header, then per group a 32-byte
    /// descriptor and (unless `groups_only`) its NSIDs.
    pub fn encode(&self, groups_only: bool, out: &mut Vec<u8>) -> Result<(), WireError> {
        let count = u16::try_from(self.groups.len()).map_err(|_| WireError::DoesNotFit {
            what: "ANA log",
            reason: "more than 65535 groups",
        })?;
        let mut total = 16usize;
        for g in &self.groups {
            if u32::try_from(g.nsids.len()).is_err() {
                return Err(WireError::DoesNotFit {
                    what: "ANA group",
                    reason: "more than 2^32 namespaces",
                });
            }
            total += 32 + if groups_only { 0 } else { 4 * g.nsids.len() };
        }
        out.reserve(total);
        let mut header = [0u8; 16];
        put64(&mut header, 0, self.change_count);
        put16(&mut header, 8, count);
        out.extend_from_slice(&header);
        for g in &self.groups {
            let nsids: &[u32] = if groups_only { &[] } else { &g.nsids };
            let mut d = [0u8; 32];
            put32(&mut d, 0, g.id);
            put32(&mut d, 4, nsids.len() as u32);
            put64(&mut d, 8, g.change_count);
            put8(&mut d, 16, g.state.code());
            out.extend_from_slice(&d);
            for nsid in nsids {
                out.extend_from_slice(&nsid.to_le_bytes());
            }
        }
        Ok(())
    }
}

/// Changed Namespace List log page (04h): up to 1024 NSIDs, zero filled;
/// with more changes the list is FFFFFFFFh followed by zeroes.
pub fn changed_namespace_list(nsids: &[u32]) -> [u8; CHANGED_NAMESPACE_LOG_LEN] {
    let mut b = [0u8; CHANGED_NAMESPACE_LOG_LEN];
    if nsids.len() > CHANGED_NAMESPACE_LOG_LEN / 4 {
        put32(&mut b, 0, u32::MAX);
    } else {
        for (i, nsid) in nsids.iter().enumerate() {
            put32(&mut b, 4 * i, *nsid);
        }
    }
    b
}

/// Transport types (TRTYPE).
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const FC: u8 = 2;
    pub const TCP: u8 = 3;
    pub const LOOP: u8 = 254;
}

/// Address families (ADRFAM).
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
    pub const IB: u8 = 3;
    pub const FC: u8 = 4;
    pub const LOOP: u8 = 254;
}

/// Subsystem types (SUBTYPE).
pub mod subtype {
    /// A referral to another discovery service.
    pub const DISCOVERY_REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVME: u8 = 2;
    /// The current discovery subsystem.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport requirements (TREQ).
pub mod treq {
    pub const SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0;
    pub const SECURE_CHANNEL_REQUIRED: u8 = 1;
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
    /// SQ flow control may be disabled (Connect CATTR bit 2).
    pub const SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;
}

/// NVMe/TCP security types (TSAS byte 0, SECTYPE).
pub mod tcp_sectype {
    pub const NONE: u8 = 0;
    pub const TLS_1_2: u8 = 1;
    pub const TLS_1_3: u8 = 2;
}

/// Entry flags (EFLAGS).
pub mod eflags {
    /// Duplicate returned information.
    pub const DUPLICATE_RETURNED_INFO: u16 = 1 << 0;
    /// Explicit persistent connection support for discovery.
    pub const EXPLICIT_PERSISTENT_CONNECTION: u16 = 1 << 1;
}

/// Width of TRSVCID.
pub const TRSVCID_LEN: usize = 32;
/// Width of TRADDR.
pub const TRADDR_LEN: usize = 256;

/// One discovery log page entry (1024 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DiscoveryLogEntry {
    /// Transport type (byte 0, see [`trtype`]).
    pub trtype: u8,
    /// Address family (byte 1, see [`adrfam`]).
    pub adrfam: u8,
    /// Subsystem type (byte 2, see [`subtype`]).
    pub subtype: u8,
    /// Transport requirements (byte 3, see [`treq`]).
    pub treq: u8,
    /// Port ID (bytes 4-5).
    pub portid: u16,
    /// Controller ID (bytes 6-7): 0xFFFF for the dynamic model.
    pub cntlid: u16,
    /// Admin max submission queue size (bytes 8-9).
    pub asqsz: u16,
    /// Entry flags (bytes 10-11, see [`eflags`]).
    pub eflags: u16,
    /// Transport service ID, the port number for TCP (bytes 32-63, ASCII,
    /// space padded).
    pub trsvcid: String,
    /// NQN of the subsystem (bytes 256-511).
    pub subnqn: String,
    /// Transport address, the IP address for TCP (bytes 512-767, ASCII,
    /// space padded).
    pub traddr: String,
    /// Transport specific address subtype (bytes 768-1023); for TCP byte 0
    /// is SECTYPE (see [`tcp_sectype`]).
    pub tsas: [u8; 256],
}

impl DiscoveryLogEntry {
    /// An entry for an NVM subsystem reachable over NVMe/TCP at
    /// `traddr`:`trsvcid` (an IPv4 address unless `traddr` contains a
    /// colon), dynamic controllers, admin queues of 32 entries, no TLS.
    pub fn tcp(subnqn: &str, traddr: &str, trsvcid: &str, portid: u16) -> DiscoveryLogEntry {
        DiscoveryLogEntry {
            trtype: trtype::TCP,
            adrfam: if traddr.contains(':') {
                adrfam::IPV6
            } else {
                adrfam::IPV4
            },
            subtype: subtype::NVME,
            // "Not required" would say a secure channel (TLS) is offered:
            // nvme-cli's connect-all then asks the kernel for TLS, which
            // this target does not speak (and older kernels refuse).
            treq: treq::SECURE_CHANNEL_NOT_SPECIFIED,
            portid,
            cntlid: crate::fabrics::CNTLID_DYNAMIC,
            asqsz: 32,
            eflags: 0,
            trsvcid: trsvcid.into(),
            subnqn: subnqn.into(),
            traddr: traddr.into(),
            tsas: [0; 256],
        }
    }

    fn check(&self) -> Result<(), WireError> {
        check_ascii(&self.trsvcid, TRSVCID_LEN, "TRSVCID")?;
        check_ascii(&self.traddr, TRADDR_LEN, "TRADDR")?;
        check_nqn(&self.subnqn, "SUBNQN")
    }

    /// The 1024 bytes.
    pub fn to_bytes(&self) -> Result<[u8; DISCOVERY_RECORD_LEN], WireError> {
        self.check()?;
        Ok(self.bytes_unchecked())
    }

    fn bytes_unchecked(&self) -> [u8; DISCOVERY_RECORD_LEN] {
        let mut b = [0u8; DISCOVERY_RECORD_LEN];
        put8(&mut b, 0, self.trtype);
        put8(&mut b, 1, self.adrfam);
        put8(&mut b, 2, self.subtype);
        put8(&mut b, 3, self.treq);
        put16(&mut b, 4, self.portid);
        put16(&mut b, 6, self.cntlid);
        put16(&mut b, 8, self.asqsz);
        put16(&mut b, 10, self.eflags);
        put_ascii(&mut b, 32, TRSVCID_LEN, &self.trsvcid);
        put_nul_padded(&mut b, 256, 256, &self.subnqn);
        put_ascii(&mut b, 512, TRADDR_LEN, &self.traddr);
        put(&mut b, 768, &self.tsas);
        b
    }

    /// Parses one entry (host side); TRSVCID and TRADDR lose their
    /// padding (spaces or NULs).
    pub fn parse(b: &[u8]) -> Result<DiscoveryLogEntry, WireError> {
        if b.len() < DISCOVERY_RECORD_LEN {
            return Err(WireError::TooShort {
                what: "discovery log entry",
                needed: DISCOVERY_RECORD_LEN,
                got: b.len(),
            });
        }
        Ok(DiscoveryLogEntry {
            trtype: u8_at(b, 0),
            adrfam: u8_at(b, 1),
            subtype: u8_at(b, 2),
            treq: u8_at(b, 3),
            portid: le16(b, 4),
            cntlid: le16(b, 6),
            asqsz: le16(b, 8),
            eflags: le16(b, 10),
            trsvcid: padded_ascii(b, 32, TRSVCID_LEN),
            subnqn: nul_terminated(b, 256, 256, NQN_MAX_LEN, "discovery entry SUBNQN")?,
            traddr: padded_ascii(b, 512, TRADDR_LEN),
            tsas: crate::bytes::bytes_at(b, 768),
        })
    }
}

/// The discovery log page (70h).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DiscoveryLog {
    /// Generation counter (bytes 0-7): changes whenever the entries do.
    pub genctr: u64,
    /// Record format (bytes 16-17), 0.
    pub recfmt: u16,
    /// The entries; NUMREC (bytes 8-15) is their count.
    pub entries: Vec<DiscoveryLogEntry>,
}

impl DiscoveryLog {
    /// Appends the page: the 1024-byte header, then the entries.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        for e in &self.entries {
            e.check()?;
        }
        out.reserve(DISCOVERY_RECORD_LEN * (1 + self.entries.len()));
        let mut header = [0u8; DISCOVERY_RECORD_LEN];
        put64(&mut header, 0, self.genctr);
        put64(&mut header, 8, self.entries.len() as u64);
        put16(&mut header, 16, self.recfmt);
        out.extend_from_slice(&header);
        for e in &self.entries {
            out.extend_from_slice(&e.bytes_unchecked());
        }
        Ok(())
    }

    /// Parses a page (host side); the page must hold every entry NUMREC
    /// announces.
    pub fn parse(b: &[u8]) -> Result<DiscoveryLog, WireError> {
        if b.len() < DISCOVERY_RECORD_LEN {
            return Err(WireError::TooShort {
                what: "discovery log header",
                needed: DISCOVERY_RECORD_LEN,
                got: b.len(),
            });
        }
        let numrec = le64(b, 8);
        let needed = usize::try_from(numrec)
            .ok()
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(DISCOVERY_RECORD_LEN))
            .ok_or(WireError::BadField {
                what: "discovery log header",
                offset: 8,
                reason: "NUMREC is too large",
            })?;
        if b.len() < needed {
            return Err(WireError::TooShort {
                what: "discovery log",
                needed,
                got: b.len(),
            });
        }
        let entries = b
            .get(DISCOVERY_RECORD_LEN..needed)
            .unwrap_or(&[])
            .chunks_exact(DISCOVERY_RECORD_LEN)
            .map(DiscoveryLogEntry::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DiscoveryLog {
            genctr: le64(b, 0),
            recfmt: le16(b, 16),
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::le32;

    #[test]
    fn window() {
        let page: Vec<u8> = (0..10).collect();
        let mut out = [0xffu8; 6];
        copy_log_window(&page, 7, &mut out).unwrap();
        assert_eq!(out, [7, 8, 9, 0, 0, 0]);
        copy_log_window(&page, 10, &mut out).unwrap();
        assert_eq!(out, [0; 6]);
        assert!(copy_log_window(&page, 11, &mut out).is_err());
        assert!(copy_log_window(&page, u64::MAX, &mut out).is_err());
    }

    #[test]
    fn error_log_layout() {
        let e = ErrorLogEntry {
            error_count: 3,
            sqid: 1,
            cid: 0x42,
            status: Status::LBA_OUT_OF_RANGE.with_dnr(),
            parameter_location: 0xffff,
            lba: 0x1000,
            nsid: 2,
            trtype: trtype::TCP,
            ..ErrorLogEntry::default()
        };
        let mut out = Vec::new();
        encode_error_log(&[e], 4, &mut out);
        assert_eq!(out.len(), 256);
        assert_eq!(le64(&out, 0), 3);
        assert_eq!(le16(&out, 10), 0x42);
        assert_eq!(le16(&out, 12), 0x8100);
        assert_eq!(le16(&out, 14), 0xffff);
        assert_eq!(le64(&out, 16), 0x1000);
        assert_eq!(le32(&out, 24), 2);
        assert_eq!(out[29], 3);
        assert!(out[64..].iter().all(|&x| x == 0));
    }

    #[test]
    fn smart_layout() {
        let s = SmartLog {
            temperature: 300,
            available_spare: 100,
            data_units_read: u128::from(u64::MAX) + 5,
            power_on_hours: 7,
            temperature_sensors: [1, 0, 0, 0, 0, 0, 0, 8],
            ..SmartLog::default()
        };
        let b = s.to_bytes();
        assert_eq!(le16(&b, 1), 300);
        assert_eq!(b[3], 100);
        assert_eq!(le64(&b, 32), 4);
        assert_eq!(le64(&b, 40), 1);
        assert_eq!(le64(&b, 128), 7);
        assert_eq!(le16(&b, 200), 1);
        assert_eq!(le16(&b, 214), 8);
    }

    #[test]
    fn ana_layout() {
        let log = AnaLog {
            change_count: 9,
            groups: vec![
                AnaGroup {
                    id: 1,
                    change_count: 4,
                    state: AnaState::Optimized,
                    nsids: vec![1, 2],
                },
                AnaGroup {
                    id: 2,
                    change_count: 5,
                    state: AnaState::Inaccessible,
                    nsids: vec![3],
                },
            ],
        };
        let mut out = Vec::new();
        log.encode(false, &mut out).unwrap();
        assert_eq!(out.len(), 16 + 32 + 8 + 32 + 4);
        assert_eq!(le64(&out, 0), 9);
        assert_eq!(le16(&out, 8), 2);
        assert_eq!(le32(&out, 16), 1);
        assert_eq!(le32(&out, 20), 2);
        assert_eq!(le64(&out, 24), 4);
        assert_eq!(out[32], 0x01);
        assert_eq!(le32(&out, 48), 1);
        assert_eq!(le32(&out, 52), 2);
        assert_eq!(le32(&out, 56), 2);
        assert_eq!(out[56 + 16], 0x03);
        assert_eq!(le32(&out, 88), 3);
        out.clear();
        log.encode(true, &mut out).unwrap();
        assert_eq!(out.len(), 16 + 64);
        assert_eq!(le32(&out, 20), 0);
        for code in 0..=255u8 {
            if let Some(s) = AnaState::from_code(code) {
                assert_eq!(s.code(), code);
            }
        }
    }

    #[test]
    fn changed_namespaces() {
        let b = changed_namespace_list(&[4, 2]);
        assert_eq!(&b[..12], &[4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        let many: Vec<u32> = (1..=1025).collect();
        let b = changed_namespace_list(&many);
        assert_eq!(le32(&b, 0), u32::MAX);
        assert!(b[4..].iter().all(|&x| x == 0));
    }

    #[test]
    fn discovery_layout() {
        let entry = DiscoveryLogEntry::tcp("nqn.2024-01.io.basalt:vol1", "192.168.1.10", "4420", 1);
        let log = DiscoveryLog {
            genctr: 5,
            recfmt: 0,
            entries: vec![entry.clone()],
        };
        let mut out = Vec::new();
        log.encode(&mut out).unwrap();
        assert_eq!(out.len(), 2048);
        assert_eq!(le64(&out, 0), 5);
        assert_eq!(le64(&out, 8), 1);
        let e = &out[1024..];
        assert_eq!(&e[0..4], &[3, 1, 2, 0]);
        assert_eq!(le16(e, 4), 1);
        assert_eq!(le16(e, 6), 0xffff);
        assert_eq!(le16(e, 8), 32);
        assert_eq!(&e[32..37], b"4420 ");
        assert_eq!(e[63], b' ');
        assert_eq!(&e[256..260], b"nqn.");
        assert_eq!(e[256 + 26], 0);
        assert_eq!(&e[512..524], b"192.168.1.10");
        assert_eq!(e[767], b' ');
        assert_eq!(DiscoveryLog::parse(&out).unwrap(), log);
        assert!(DiscoveryLog::parse(&out[..2047]).is_err());
        let bad = DiscoveryLogEntry {
            traddr: "x".repeat(257),
            ..entry
        };
        let mut out2 = vec![1];
        assert!(DiscoveryLog {
            genctr: 0,
            recfmt: 0,
            entries: vec![bad]
        }
        .encode(&mut out2)
        .is_err());
        assert_eq!(out2, vec![1]);
        assert_eq!(
            DiscoveryLogEntry::tcp("n", "fe80::1", "4420", 1).adrfam,
            adrfam::IPV6
        );
    }
}
