//! Encoders for the Identify data structures a target returns, each a
//! 4096-byte page: Identify Controller (I/O and discovery controllers),
//! Identify Namespace, the Namespace Identification Descriptor list and the
//! Active Namespace ID list.
//!
//! Invariants: every structure is exactly [`IDENTIFY_LEN`] bytes with
//! reserved bytes zero; text fields are validated (printable ASCII that
//! fits for SN/MN/FR, at most 223 bytes without NUL for NQNs) before
//! anything is written, and an invalid value is refused, never truncated.

use crate::bytes::{
    check_ascii, check_nqn, put, put128, put16, put32, put64, put8, put_ascii, put_nul_padded,
};
use crate::fabrics::DISCOVERY_NQN;
use crate::properties::Vs;
use crate::WireError;

/// Length of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// CMIC bits (byte 76).
pub mod cmic {
    pub const MULTI_PORT: u8 = 1 << 0;
    pub const MULTI_CONTROLLER: u8 = 1 << 1;
    pub const SR_IOV: u8 = 1 << 2;
    /// Asymmetric namespace access reporting.
    pub const ANA_REPORTING: u8 = 1 << 3;
}

/// OAES bits (bytes 92-95): optional asynchronous events supported.
pub mod oaes {
    pub const NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
    pub const FIRMWARE_ACTIVATION: u32 = 1 << 9;
    pub const ANA_CHANGE: u32 = 1 << 11;
    pub const DISCOVERY_LOG_CHANGE: u32 = 1 << 31;
}

/// CTRATT bits (bytes 96-99).
pub mod ctratt {
    /// 128-bit host identifier.
    pub const HOST_ID_128: u32 = 1 << 0;
    /// Traffic based keep alive.
    pub const TRAFFIC_BASED_KEEP_ALIVE: u32 = 1 << 6;
}

/// CNTRLTYPE values (byte 111).
pub mod controller_type {
    pub const IO: u8 = 1;
    pub const DISCOVERY: u8 = 2;
    pub const ADMINISTRATIVE: u8 = 3;
}

/// OACS bits (bytes 256-257): optional admin commands supported.
pub mod oacs {
    pub const SECURITY: u16 = 1 << 0;
    pub const FORMAT_NVM: u16 = 1 << 1;
    pub const FIRMWARE: u16 = 1 << 2;
    pub const NAMESPACE_MANAGEMENT: u16 = 1 << 3;
    pub const DEVICE_SELF_TEST: u16 = 1 << 4;
    pub const DIRECTIVES: u16 = 1 << 5;
}

/// LPA bits (byte 261): log page attributes.
pub mod lpa {
    /// SMART / health log per namespace.
    pub const SMART_PER_NAMESPACE: u8 = 1 << 0;
    /// Commands Supported and Effects log page (a Linux host then reads it
    /// and fails the controller if it cannot).
    pub const COMMANDS_EFFECTS: u8 = 1 << 1;
    /// Extended data for Get Log Page: NUMDU, LPOL/LPOU.
    pub const EXTENDED_DATA: u8 = 1 << 2;
    pub const TELEMETRY: u8 = 1 << 3;
    pub const PERSISTENT_EVENT: u8 = 1 << 4;
}

/// ANACAP bits (byte 343).
pub mod anacap {
    pub const OPTIMIZED: u8 = 1 << 0;
    pub const NON_OPTIMIZED: u8 = 1 << 1;
    pub const INACCESSIBLE: u8 = 1 << 2;
    pub const PERSISTENT_LOSS: u8 = 1 << 3;
    pub const CHANGE: u8 = 1 << 4;
    /// ANAGRPID does not change while the namespace is attached.
    pub const GRPID_STATIC: u8 = 1 << 6;
    /// Non-zero ANAGRPID supported in Namespace Management.
    pub const NONZERO_GRPID: u8 = 1 << 7;
}

/// ONCS bits (bytes 520-521): optional NVM commands supported.
pub mod oncs {
    pub const COMPARE: u16 = 1 << 0;
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
    pub const SAVE_SELECT: u16 = 1 << 4;
    pub const RESERVATIONS: u16 = 1 << 5;
    pub const TIMESTAMP: u16 = 1 << 6;
    pub const VERIFY: u16 = 1 << 7;
    pub const COPY: u16 = 1 << 8;
}

/// VWC bits (byte 525).
pub mod vwc {
    /// A volatile write cache is present (hosts then send Flush).
    pub const PRESENT: u8 = 1 << 0;
    /// Flush with NSID FFFFFFFFh is not supported.
    pub const FLUSH_ALL_UNSUPPORTED: u8 = 0b10 << 1;
    /// Flush with NSID FFFFFFFFh is supported.
    pub const FLUSH_ALL_SUPPORTED: u8 = 0b11 << 1;
}

/// SGLS bits (bytes 536-539).
pub mod sgls {
    /// SGLs supported, no alignment requirement.
    pub const SUPPORTED: u32 = 0b01;
    /// SGLs supported, dword alignment required.
    pub const SUPPORTED_DWORD_ALIGNED: u32 = 0b10;
    /// Keyed SGL Data Block descriptors (RDMA).
    pub const KEYED: u32 = 1 << 2;
    /// SGL Bit Bucket descriptors.
    pub const BIT_BUCKET: u32 = 1 << 16;
    /// Offset in the address field (in-capsule data); required for
    /// in-capsule data.
    pub const OFFSET_ADDRESSING: u32 = 1 << 20;
}

/// Identify Controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdentifyController {
    /// PCI vendor ID (bytes 0-1).
    pub vid: u16,
    /// PCI subsystem vendor ID (bytes 2-3).
    pub ssvid: u16,
    /// Serial number, ASCII, at most 20 bytes (bytes 4-23).
    pub serial: String,
    /// Model number, ASCII, at most 40 bytes (bytes 24-63).
    pub model: String,
    /// Firmware revision, ASCII, at most 8 bytes (bytes 64-71).
    pub firmware: String,
    /// Recommended arbitration burst (byte 72).
    pub rab: u8,
    /// IEEE OUI, in the byte order of the field (bytes 73-75).
    pub ieee: [u8; 3],
    /// Multi-path I/O and namespace sharing capabilities (byte 76, see
    /// [`cmic`]).
    pub cmic: u8,
    /// Maximum data transfer size as a power of two in units of the
    /// minimum memory page size (CAP.MPSMIN, 4 KiB); 0 means no limit
    /// (byte 77).
    pub mdts: u8,
    /// Controller ID (bytes 78-79); Linux hosts require it to equal the
    /// one Connect returned.
    pub cntlid: u16,
    /// Version (bytes 80-83).
    pub version: Vs,
    /// Optional asynchronous events supported (bytes 92-95, see [`oaes`]).
    pub oaes: u32,
    /// Controller attributes (bytes 96-99, see [`ctratt`]).
    pub ctratt: u32,
    /// Controller type (byte 111, see [`controller_type`]).
    pub controller_type: u8,
    /// Optional admin commands supported (bytes 256-257, see [`oacs`]).
    pub oacs: u16,
    /// Abort command limit, 0's based (byte 258).
    pub acl: u8,
    /// Asynchronous event request limit, 0's based (byte 259).
    pub aerl: u8,
    /// Firmware updates (byte 260).
    pub frmw: u8,
    /// Log page attributes (byte 261, see [`lpa`]).
    pub lpa: u8,
    /// Error log page entries, 0's based (byte 262).
    pub elpe: u8,
    /// Warning composite temperature threshold in kelvin, 0 if unreported
    /// (bytes 266-267).
    pub wctemp: u16,
    /// Critical composite temperature threshold (bytes 268-269).
    pub cctemp: u16,
    /// Keep alive support granularity in 100 ms units; fabrics I/O
    /// controllers must support keep alive (bytes 320-321).
    pub kas: u16,
    /// ANA transition time in seconds (byte 342).
    pub anatt: u8,
    /// ANA capabilities (byte 343, see [`anacap`]).
    pub anacap: u8,
    /// Largest ANA group ID (bytes 344-347).
    pub anagrpmax: u32,
    /// Number of ANA group IDs supported (bytes 348-351).
    pub nanagrpid: u32,
    /// Submission queue entry sizes: required (bits 3:0) and maximum
    /// (7:4) as powers of two (byte 512).
    pub sqes: u8,
    /// Completion queue entry sizes (byte 513).
    pub cqes: u8,
    /// Maximum outstanding commands per queue (bytes 514-515).
    pub maxcmd: u16,
    /// Largest namespace ID (bytes 516-519).
    pub nn: u32,
    /// Optional NVM commands supported (bytes 520-521, see [`oncs`]).
    pub oncs: u16,
    /// Fused operations supported (bytes 522-523).
    pub fuses: u16,
    /// Format NVM attributes (byte 524).
    pub fna: u8,
    /// Volatile write cache (byte 525, see [`vwc`]).
    pub vwc: u8,
    /// Atomic write unit normal, 0's based blocks (bytes 526-527).
    pub awun: u16,
    /// Atomic write unit power fail, 0's based blocks (bytes 528-529).
    pub awupf: u16,
    /// SGL support (bytes 536-539, see [`sgls`]).
    pub sgls: u32,
    /// Maximum number of allowed namespaces (bytes 540-543).
    pub mnan: u32,
    /// NQN of the subsystem (bytes 768-1023).
    pub subnqn: String,
    /// I/O queue command capsule size in 16-byte units: the SQE plus the
    /// largest in-capsule data (bytes 1792-1795).
    pub ioccsz: u32,
    /// I/O queue response capsule size in 16-byte units (bytes 1796-1799).
    pub iorcsz: u32,
    /// In-capsule data offset in 16-byte units; Linux hosts require 0
    /// (bytes 1800-1801).
    pub icdoff: u16,
    /// Fabrics controller attributes: bit 0 set for the static controller
    /// model (byte 1802).
    pub fcatt: u8,
    /// Maximum SGL data block descriptors per command (byte 1803).
    pub msdbd: u8,
}

impl IdentifyController {
    /// An NVMe/TCP I/O controller of the dynamic model with the settings
    /// the Linux target reports (which Linux hosts accept): ANA reporting
    /// for multipath, keep alive in 1 s units, Write Zeroes and Dataset
    /// Management, a volatile write cache, SGLs with in-capsule data of
    /// `in_capsule_data` bytes, NVMe 1.4, 1024 namespaces, 128 commands
    /// per queue and no transfer size limit. Adjust fields as needed.
    pub fn io(cntlid: u16, subnqn: &str, in_capsule_data: u32) -> IdentifyController {
        IdentifyController {
            vid: 0,
            ssvid: 0,
            serial: String::new(),
            model: "Basalt".into(),
            firmware: String::new(),
            rab: 6,
            ieee: [0; 3],
            cmic: cmic::MULTI_PORT | cmic::MULTI_CONTROLLER | cmic::ANA_REPORTING,
            mdts: 0,
            cntlid,
            version: Vs::V1_4,
            oaes: oaes::NAMESPACE_ATTRIBUTE | oaes::ANA_CHANGE,
            ctratt: ctratt::HOST_ID_128,
            controller_type: controller_type::IO,
            oacs: 0,
            acl: 3,
            aerl: 3,
            frmw: 0b11,
            lpa: lpa::EXTENDED_DATA,
            elpe: 0,
            wctemp: 0,
            cctemp: 0,
            kas: 10,
            anatt: 10,
            anacap: anacap::OPTIMIZED
                | anacap::NON_OPTIMIZED
                | anacap::INACCESSIBLE
                | anacap::PERSISTENT_LOSS
                | anacap::CHANGE,
            anagrpmax: 1,
            nanagrpid: 1,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 128,
            nn: 1024,
            oncs: oncs::DATASET_MANAGEMENT | oncs::WRITE_ZEROES,
            fuses: 0,
            fna: 0,
            vwc: vwc::PRESENT,
            awun: 0,
            awupf: 0,
            sgls: sgls::SUPPORTED
                | if in_capsule_data > 0 {
                    sgls::OFFSET_ADDRESSING
                } else {
                    0
                },
            mnan: 1024,
            subnqn: subnqn.into(),
            ioccsz: (64 + in_capsule_data) / 16,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
        }
    }

    /// A discovery controller (subsystem NQN [`DISCOVERY_NQN`]): no I/O
    /// queues, no namespaces, log page offsets supported so hosts can page
    /// through a long discovery log.
    pub fn discovery(cntlid: u16) -> IdentifyController {
        IdentifyController {
            cmic: 0,
            oaes: 0,
            controller_type: controller_type::DISCOVERY,
            aerl: 0,
            anatt: 0,
            anacap: 0,
            anagrpmax: 0,
            nanagrpid: 0,
            nn: 0,
            oncs: 0,
            vwc: 0,
            mnan: 0,
            ioccsz: 0,
            iorcsz: 0,
            sgls: sgls::SUPPORTED | sgls::OFFSET_ADDRESSING,
            ..IdentifyController::io(cntlid, DISCOVERY_NQN, 0)
        }
    }

    /// The 4096 bytes.
    pub fn to_bytes(&self) -> Result<[u8; IDENTIFY_LEN], WireError> {
        check_ascii(&self.serial, 20, "serial number")?;
        check_ascii(&self.model, 40, "model number")?;
        check_ascii(&self.firmware, 8, "firmware revision")?;
        check_nqn(&self.subnqn, "SUBNQN")?;
        let mut b = [0u8; IDENTIFY_LEN];
        put16(&mut b, 0, self.vid);
        put16(&mut b, 2, self.ssvid);
        put_ascii(&mut b, 4, 20, &self.serial);
        put_ascii(&mut b, 24, 40, &self.model);
        put_ascii(&mut b, 64, 8, &self.firmware);
        put8(&mut b, 72, self.rab);
        put(&mut b, 73, &self.ieee);
        put8(&mut b, 76, self.cmic);
        put8(&mut b, 77, self.mdts);
        put16(&mut b, 78, self.cntlid);
        put32(&mut b, 80, self.version.to_u32());
        put32(&mut b, 92, self.oaes);
        put32(&mut b, 96, self.ctratt);
        put8(&mut b, 111, self.controller_type);
        put16(&mut b, 256, self.oacs);
        put8(&mut b, 258, self.acl);
        put8(&mut b, 259, self.aerl);
        put8(&mut b, 260, self.frmw);
        put8(&mut b, 261, self.lpa);
        put8(&mut b, 262, self.elpe);
        put16(&mut b, 266, self.wctemp);
        put16(&mut b, 268, self.cctemp);
        put16(&mut b, 320, self.kas);
        put8(&mut b, 342, self.anatt);
        put8(&mut b, 343, self.anacap);
        put32(&mut b, 344, self.anagrpmax);
        put32(&mut b, 348, self.nanagrpid);
        put8(&mut b, 512, self.sqes);
        put8(&mut b, 513, self.cqes);
        put16(&mut b, 514, self.maxcmd);
        put32(&mut b, 516, self.nn);
        put16(&mut b, 520, self.oncs);
        put16(&mut b, 522, self.fuses);
        put8(&mut b, 524, self.fna);
        put8(&mut b, 525, self.vwc);
        put16(&mut b, 526, self.awun);
        put16(&mut b, 528, self.awupf);
        put32(&mut b, 536, self.sgls);
        put32(&mut b, 540, self.mnan);
        put_nul_padded(&mut b, 768, 256, &self.subnqn);
        put32(&mut b, 1792, self.ioccsz);
        put32(&mut b, 1796, self.iorcsz);
        put16(&mut b, 1800, self.icdoff);
        put8(&mut b, 1802, self.fcatt);
        put8(&mut b, 1803, self.msdbd);
        Ok(b)
    }
}

/// NSFEAT bits (byte 24).
pub mod nsfeat {
    /// Thin provisioning: NCAP may be less than NSZE, NUSE is meaningful.
    pub const THIN_PROVISIONING: u8 = 1 << 0;
    /// NAWUN, NAWUPF and NACWU are namespace specific.
    pub const ATOMICS: u8 = 1 << 1;
    /// Deallocated or unwritten logical block error.
    pub const DEALLOCATED_ERROR: u8 = 1 << 2;
    /// NPWG, NPWA, NPDG, NPDA and NOWS are valid.
    pub const OPTIMAL_PERFORMANCE: u8 = 1 << 4;
}

/// NMIC bits (byte 30).
pub mod nmic {
    /// The namespace may be attached to more than one controller.
    pub const SHARED: u8 = 1 << 0;
}

/// DLFEAT values (byte 33).
pub mod dlfeat {
    /// Deallocated blocks read as zeroes (bits 2:0 = 001b).
    pub const READ_ZEROES: u8 = 0b001;
    /// Write Zeroes' Deallocate bit is supported (bit 3).
    pub const WRITE_ZEROES_DEALLOCATE: u8 = 1 << 3;
}

/// One LBA format (4 bytes at 128 + 4 * index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbaFormat {
    /// Metadata bytes per block (bytes 0-1).
    pub ms: u16,
    /// Block size as a power of two (byte 2): 9 for 512, 12 for 4096.
    pub lbads: u8,
    /// Relative performance (bits 1:0 of byte 3), 0 = best.
    pub rp: u8,
}

/// Most LBA formats an Identify Namespace lists (NLBAF is 0's based and
/// at most 15 without the NVMe 2.0 extension).
pub const MAX_LBA_FORMATS: usize = 16;

/// Identify Namespace (NVM command set).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdentifyNamespace {
    /// Namespace size in blocks (bytes 0-7).
    pub nsze: u64,
    /// Namespace capacity in blocks (bytes 8-15).
    pub ncap: u64,
    /// Namespace utilization in blocks (bytes 16-23).
    pub nuse: u64,
    /// Features (byte 24, see [`nsfeat`]).
    pub nsfeat: u8,
    /// Index of the LBA format in use (FLBAS bits 3:0, byte 26).
    pub flbas: u8,
    /// Multi-path I/O and sharing (byte 30, see [`nmic`]).
    pub nmic: u8,
    /// Deallocate features (byte 33, see [`dlfeat`]).
    pub dlfeat: u8,
    /// Optimal I/O boundary in blocks, 0 = none (bytes 46-47).
    pub noiob: u16,
    /// NVM capacity in bytes (bytes 48-63).
    pub nvmcap: u128,
    /// Preferred write granularity, 0's based blocks (bytes 64-65).
    pub npwg: u16,
    /// Preferred write alignment, 0's based blocks (bytes 66-67).
    pub npwa: u16,
    /// Preferred deallocate granularity, 0's based blocks (bytes 68-69).
    pub npdg: u16,
    /// Preferred deallocate alignment, 0's based blocks (bytes 70-71).
    pub npda: u16,
    /// Optimal write size, 0's based blocks (bytes 72-73).
    pub nows: u16,
    /// ANA group ID (bytes 92-95).
    pub anagrpid: u32,
    /// Attributes: bit 0 write protected (byte 99).
    pub nsattr: u8,
    /// Namespace globally unique identifier (bytes 104-119).
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier (bytes 120-127).
    pub eui64: [u8; 8],
    /// LBA formats, 1 to [`MAX_LBA_FORMATS`] (NLBAF is their count minus
    /// one).
    pub lba_formats: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// A shared namespace of `blocks` blocks of `1 << lba_shift` bytes,
    /// fully allocated, in ANA group `anagrpid`, whose deallocated blocks
    /// read as zeroes.
    pub fn new(blocks: u64, lba_shift: u8, anagrpid: u32) -> IdentifyNamespace {
        IdentifyNamespace {
            nsze: blocks,
            ncap: blocks,
            nuse: blocks,
            nsfeat: 0,
            flbas: 0,
            nmic: nmic::SHARED,
            dlfeat: dlfeat::READ_ZEROES | dlfeat::WRITE_ZEROES_DEALLOCATE,
            noiob: 0,
            nvmcap: 0,
            npwg: 0,
            npwa: 0,
            npdg: 0,
            npda: 0,
            nows: 0,
            anagrpid,
            nsattr: 0,
            nguid: [0; 16],
            eui64: [0; 8],
            lba_formats: vec![LbaFormat {
                ms: 0,
                lbads: lba_shift,
                rp: 0,
            }],
        }
    }

    /// The 4096 bytes.
    pub fn to_bytes(&self) -> Result<[u8; IDENTIFY_LEN], WireError> {
        let count = self.lba_formats.len();
        if count == 0 || count > MAX_LBA_FORMATS {
            return Err(WireError::DoesNotFit {
                what: "LBA formats",
                reason: "there must be 1 to 16",
            });
        }
        if usize::from(self.flbas) >= count {
            return Err(WireError::DoesNotFit {
                what: "FLBAS",
                reason: "names an LBA format that is not listed",
            });
        }
        let mut b = [0u8; IDENTIFY_LEN];
        put64(&mut b, 0, self.nsze);
        put64(&mut b, 8, self.ncap);
        put64(&mut b, 16, self.nuse);
        put8(&mut b, 24, self.nsfeat);
        put8(&mut b, 25, (count - 1) as u8);
        put8(&mut b, 26, self.flbas & 0x0f);
        put8(&mut b, 30, self.nmic);
        put8(&mut b, 33, self.dlfeat);
        put16(&mut b, 46, self.noiob);
        put128(&mut b, 48, self.nvmcap);
        put16(&mut b, 64, self.npwg);
        put16(&mut b, 66, self.npwa);
        put16(&mut b, 68, self.npdg);
        put16(&mut b, 70, self.npda);
        put16(&mut b, 72, self.nows);
        put32(&mut b, 92, self.anagrpid);
        put8(&mut b, 99, self.nsattr);
        put(&mut b, 104, &self.nguid);
        put(&mut b, 120, &self.eui64);
        for (i, f) in self.lba_formats.iter().enumerate() {
            let at = 128 + 4 * i;
            put16(&mut b, at, f.ms);
            put8(&mut b, at + 2, f.lbads);
            put8(&mut b, at + 3, f.rp & 0x3);
        }
        Ok(b)
    }
}

/// One Namespace Identification Descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NsIdDescriptor {
    /// NIDT 1, 8 bytes.
    Eui64([u8; 8]),
    /// NIDT 2, 16 bytes.
    Nguid([u8; 16]),
    /// NIDT 3, 16 bytes.
    Uuid([u8; 16]),
    /// NIDT 4, the command set identifier (0 for NVM).
    Csi(u8),
}

impl NsIdDescriptor {
    fn parts(&self) -> (u8, &[u8]) {
        match self {
            NsIdDescriptor::Eui64(v) => (1, v),
            NsIdDescriptor::Nguid(v) => (2, v),
            NsIdDescriptor::Uuid(v) => (3, v),
            NsIdDescriptor::Csi(v) => (4, std::slice::from_ref(v)),
        }
    }
}

/// The Namespace Identification Descriptor list (CNS 03h): each
/// descriptor is NIDT (1 byte), NIDL (1 byte), 2 reserved bytes and NIDL
/// bytes of identifier; the rest of the page is zero, which ends the list.
pub fn namespace_id_descriptors(list: &[NsIdDescriptor]) -> Result<[u8; IDENTIFY_LEN], WireError> {
    let mut b = [0u8; IDENTIFY_LEN];
    let mut at = 0;
    for d in list {
        let (nidt, nid) = d.parts();
        let end = at + 4 + nid.len();
        if end > IDENTIFY_LEN {
            return Err(WireError::DoesNotFit {
                what: "namespace identification descriptors",
                reason: "more than fit in 4096 bytes",
            });
        }
        put8(&mut b, at, nidt);
        put8(&mut b, at + 1, nid.len() as u8);
        put(&mut b, at + 4, nid);
        at = end;
    }
    Ok(b)
}

/// Most namespace IDs in one list page.
pub const MAX_NAMESPACE_LIST: usize = IDENTIFY_LEN / 4;

/// The Active Namespace ID list (CNS 02h): the active NSIDs greater than
/// `after` (the command's NSID) in increasing order, at most 1024, zero
/// filled. `nsids` need not be sorted; duplicates are listed once.
pub fn active_namespace_list(nsids: &[u32], after: u32) -> [u8; IDENTIFY_LEN] {
    let mut list: Vec<u32> = nsids.iter().copied().filter(|&n| n > after).collect();
    list.sort_unstable();
    list.dedup();
    let mut b = [0u8; IDENTIFY_LEN];
    for (i, nsid) in list.iter().take(MAX_NAMESPACE_LIST).enumerate() {
        put32(&mut b, 4 * i, *nsid);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{le16, le32, le64};

    #[test]
    fn io_controller_layout() {
        let mut id = IdentifyController::io(7, "nqn.2024-01.io.basalt:sub", 8192);
        id.serial = "SN1".into();
        id.firmware = "0.1.0".into();
        id.mdts = 5;
        let b = id.to_bytes().unwrap();
        assert_eq!(&b[4..24], b"SN1                 ");
        assert_eq!(&b[24..30], b"Basalt");
        assert_eq!(b[63], b' ');
        assert_eq!(&b[64..72], b"0.1.0   ");
        assert_eq!(b[72], 6);
        assert_eq!(b[76], 0b1011);
        assert_eq!(b[77], 5);
        assert_eq!(le16(&b, 78), 7);
        assert_eq!(le32(&b, 80), 0x0001_0400);
        assert_eq!(le32(&b, 92), (1 << 8) | (1 << 11));
        assert_eq!(le32(&b, 96), 1);
        assert_eq!(b[111], 1);
        assert_eq!(b[259], 3);
        assert_eq!(b[261], 0b100);
        assert_eq!(le16(&b, 320), 10);
        assert_eq!(b[343], 0x1f);
        assert_eq!(le32(&b, 344), 1);
        assert_eq!(le32(&b, 348), 1);
        assert_eq!((b[512], b[513]), (0x66, 0x44));
        assert_eq!(le16(&b, 514), 128);
        assert_eq!(le32(&b, 516), 1024);
        assert_eq!(le16(&b, 520), 0b1100);
        assert_eq!(b[525], 1);
        assert_eq!(le32(&b, 536), 0x0010_0001);
        assert_eq!(&b[768..793], b"nqn.2024-01.io.basalt:sub");
        assert_eq!(b[793], 0);
        assert_eq!(le32(&b, 1792), (64 + 8192) / 16);
        assert_eq!(le32(&b, 1796), 1);
        assert_eq!(le16(&b, 1800), 0);
        assert_eq!(b[1803], 1);
        assert!(b[2048..].iter().all(|&x| x == 0));
    }

    #[test]
    fn discovery_controller_layout() {
        let b = IdentifyController::discovery(1).to_bytes().unwrap();
        assert_eq!(b[111], 2);
        assert_eq!(&b[768..768 + DISCOVERY_NQN.len()], DISCOVERY_NQN.as_bytes());
        assert_eq!(le32(&b, 516), 0);
        assert_eq!(b[261] & lpa::EXTENDED_DATA, lpa::EXTENDED_DATA);
        assert_eq!(le32(&b, 1792), 0);
    }

    #[test]
    fn controller_text_is_checked() {
        let mut id = IdentifyController::io(1, "nqn.x", 0);
        id.serial = "x".repeat(21);
        assert!(id.to_bytes().is_err());
        id.serial = "é".into();
        assert!(id.to_bytes().is_err());
        id.serial = "ok".into();
        id.subnqn = "n".repeat(224);
        assert!(id.to_bytes().is_err());
    }

    #[test]
    fn namespace_layout() {
        let mut ns = IdentifyNamespace::new(1 << 21, 12, 1);
        ns.nguid = [0x11; 16];
        ns.eui64 = [0x22; 8];
        ns.lba_formats.push(LbaFormat {
            ms: 8,
            lbads: 9,
            rp: 2,
        });
        let b = ns.to_bytes().unwrap();
        assert_eq!(le64(&b, 0), 1 << 21);
        assert_eq!(le64(&b, 8), 1 << 21);
        assert_eq!(le64(&b, 16), 1 << 21);
        assert_eq!(b[25], 1); // NLBAF: two formats
        assert_eq!(b[26], 0);
        assert_eq!(b[30], 1);
        assert_eq!(b[33], 0x09);
        assert_eq!(le32(&b, 92), 1);
        assert_eq!(&b[104..120], &[0x11; 16]);
        assert_eq!(&b[120..128], &[0x22; 8]);
        assert_eq!(&b[128..136], &[0, 0, 12, 0, 8, 0, 9, 2]);
        ns.flbas = 2;
        assert!(ns.to_bytes().is_err());
        ns.flbas = 0;
        ns.lba_formats.clear();
        assert!(ns.to_bytes().is_err());
    }

    #[test]
    fn descriptor_list() {
        let b = namespace_id_descriptors(&[
            NsIdDescriptor::Nguid([0xaa; 16]),
            NsIdDescriptor::Uuid([0xbb; 16]),
            NsIdDescriptor::Csi(0),
        ])
        .unwrap();
        assert_eq!(&b[0..4], &[2, 16, 0, 0]);
        assert_eq!(&b[4..20], &[0xaa; 16]);
        assert_eq!(&b[20..24], &[3, 16, 0, 0]);
        assert_eq!(&b[40..45], &[4, 1, 0, 0, 0]);
        assert!(b[45..].iter().all(|&x| x == 0));
        let many = vec![NsIdDescriptor::Uuid([1; 16]); 205];
        assert!(namespace_id_descriptors(&many).is_err());
    }

    #[test]
    fn active_list() {
        let b = active_namespace_list(&[5, 1, 3, 3, 9], 1);
        assert_eq!(&b[0..16], &[3, 0, 0, 0, 5, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
        let all: Vec<u32> = (1..=2000).collect();
        let b = active_namespace_list(&all, 0);
        assert_eq!(le32(&b, 4092), 1024);
    }
}
