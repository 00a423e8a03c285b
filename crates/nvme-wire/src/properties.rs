//! Controller properties as NVMe over Fabrics exposes them through
//! Property Get/Set: CAP, VS, CC, CSTS and NSSR, their offsets and sizes,
//! and helpers that pack and unpack their fields.
//!
//! Invariants: `from_u64`/`from_u32` followed by `to_u64`/`to_u32`
//! reproduces every defined field bit; packing masks each field to its
//! width, so an oversized field value never spills into its neighbour.

/// Property offsets.
pub mod offset {
    /// Controller Capabilities, 8 bytes, read-only.
    pub const CAP: u32 = 0x00;
    /// Version, 4 bytes, read-only.
    pub const VS: u32 = 0x08;
    /// Interrupt Mask Set (PCIe only).
    pub const INTMS: u32 = 0x0c;
    /// Interrupt Mask Clear (PCIe only).
    pub const INTMC: u32 = 0x10;
    /// Controller Configuration, 4 bytes.
    pub const CC: u32 = 0x14;
    /// Controller Status, 4 bytes, read-only.
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset, 4 bytes (optional).
    pub const NSSR: u32 = 0x20;
}

/// The value whose write to NSSR resets the subsystem ("NVMe").
pub const NSSR_RESET_VALUE: u32 = 0x4e56_4d65;

/// Size of a property access (Property Get/Set ATTRIB bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropertySize {
    /// 0: 4 bytes.
    Four,
    /// 1: 8 bytes.
    Eight,
    /// A reserved size value.
    Reserved(u8),
}

impl PropertySize {
    /// From the ATTRIB byte of Property Get/Set.
    pub fn from_attrib(attrib: u8) -> PropertySize {
        match attrib & 0x7 {
            0 => PropertySize::Four,
            1 => PropertySize::Eight,
            other => PropertySize::Reserved(other),
        }
    }

    /// The ATTRIB byte.
    pub fn attrib(self) -> u8 {
        match self {
            PropertySize::Four => 0,
            PropertySize::Eight => 1,
            PropertySize::Reserved(v) => v & 0x7,
        }
    }
}

/// The properties a fabrics controller implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Property {
    Cap,
    Vs,
    Cc,
    Csts,
    Nssr,
}

impl Property {
    /// The property at `offset`, `None` for any other offset.
    pub fn from_offset(offset: u32) -> Option<Property> {
        Some(match offset {
            offset::CAP => Property::Cap,
            offset::VS => Property::Vs,
            offset::CC => Property::Cc,
            offset::CSTS => Property::Csts,
            offset::NSSR => Property::Nssr,
            _ => return None,
        })
    }

    /// Its offset.
    pub fn offset(self) -> u32 {
        match self {
            Property::Cap => offset::CAP,
            Property::Vs => offset::VS,
            Property::Cc => offset::CC,
            Property::Csts => offset::CSTS,
            Property::Nssr => offset::NSSR,
        }
    }

    /// Its size: 8 bytes for CAP, 4 for the others.
    pub fn size(self) -> PropertySize {
        match self {
            Property::Cap => PropertySize::Eight,
            _ => PropertySize::Four,
        }
    }

    /// True when the host may write it (CC, NSSR).
    pub fn is_writable(self) -> bool {
        matches!(self, Property::Cc | Property::Nssr)
    }
}

fn field(v: u64, shift: u32, width: u32) -> u64 {
    (v >> shift) & ((1 << width) - 1)
}

fn place(v: u64, shift: u32, width: u32) -> u64 {
    (v & ((1 << width) - 1)) << shift
}

/// Controller Capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cap {
    /// Maximum queue entries supported, 0's based (bits 15:0).
    pub mqes: u16,
    /// Contiguous queues required (bit 16).
    pub cqr: bool,
    /// Arbitration mechanisms supported (bits 18:17).
    pub ams: u8,
    /// Worst-case time to become ready, in 500 ms units (bits 31:24).
    pub timeout: u8,
    /// Doorbell stride (bits 35:32).
    pub dstrd: u8,
    /// NVM subsystem reset supported (bit 36).
    pub nssrs: bool,
    /// Command sets supported (bits 44:37): bit 0 NVM command set, bit 6
    /// I/O command sets, bit 7 admin only.
    pub css: u8,
    /// Boot partition support (bit 45).
    pub bps: bool,
    /// Memory page size minimum, 2^(12+n) (bits 51:48).
    pub mpsmin: u8,
    /// Memory page size maximum, 2^(12+n) (bits 55:52).
    pub mpsmax: u8,
}

impl Cap {
    /// CSS bit: the NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;
    /// CSS bit: one or more I/O command sets (CC.CSS 110b).
    pub const CSS_IO_COMMAND_SETS: u8 = 1 << 6;
    /// CSS bit: no I/O command set (admin only).
    pub const CSS_ADMIN_ONLY: u8 = 1 << 7;

    /// A fabrics controller with queues of up to `max_queue_entries`
    /// entries, the NVM command set, 4 KiB pages and a 7.5 s ready timeout
    /// (what the Linux target reports).
    pub fn fabrics(max_queue_entries: u16) -> Cap {
        Cap {
            mqes: max_queue_entries.saturating_sub(1),
            timeout: 15,
            css: Cap::CSS_NVM,
            ..Cap::default()
        }
    }

    /// Unpacks the 64-bit value.
    pub fn from_u64(v: u64) -> Cap {
        Cap {
            mqes: field(v, 0, 16) as u16,
            cqr: field(v, 16, 1) != 0,
            ams: field(v, 17, 2) as u8,
            timeout: field(v, 24, 8) as u8,
            dstrd: field(v, 32, 4) as u8,
            nssrs: field(v, 36, 1) != 0,
            css: field(v, 37, 8) as u8,
            bps: field(v, 45, 1) != 0,
            mpsmin: field(v, 48, 4) as u8,
            mpsmax: field(v, 52, 4) as u8,
        }
    }

    /// Packs the 64-bit value.
    pub fn to_u64(&self) -> u64 {
        place(u64::from(self.mqes), 0, 16)
            | place(u64::from(self.cqr), 16, 1)
            | place(u64::from(self.ams), 17, 2)
            | place(u64::from(self.timeout), 24, 8)
            | place(u64::from(self.dstrd), 32, 4)
            | place(u64::from(self.nssrs), 36, 1)
            | place(u64::from(self.css), 37, 8)
            | place(u64::from(self.bps), 45, 1)
            | place(u64::from(self.mpsmin), 48, 4)
            | place(u64::from(self.mpsmax), 52, 4)
    }
}

/// Version (also the VER field of Identify Controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vs {
    /// Major version (bits 31:16).
    pub major: u16,
    /// Minor version (bits 15:8).
    pub minor: u8,
    /// Tertiary version (bits 7:0).
    pub tertiary: u8,
}

impl Vs {
    /// NVMe 1.3.
    pub const V1_3: Vs = Vs::new(1, 3, 0);
    /// NVMe 1.4 (the first with asymmetric namespace access).
    pub const V1_4: Vs = Vs::new(1, 4, 0);
    /// NVMe 2.0.
    pub const V2_0: Vs = Vs::new(2, 0, 0);

    /// A version.
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Vs {
        Vs {
            major,
            minor,
            tertiary,
        }
    }

    /// Unpacks the 32-bit value.
    pub fn from_u32(v: u32) -> Vs {
        Vs::new((v >> 16) as u16, (v >> 8) as u8, v as u8)
    }

    /// Packs the 32-bit value.
    pub fn to_u32(&self) -> u32 {
        (u32::from(self.major) << 16) | (u32::from(self.minor) << 8) | u32::from(self.tertiary)
    }
}

/// Shutdown notification values (CC.SHN).
pub mod shn {
    pub const NONE: u8 = 0;
    pub const NORMAL: u8 = 1;
    pub const ABRUPT: u8 = 2;
}

/// Shutdown status values (CSTS.SHST).
pub mod shst {
    pub const NORMAL: u8 = 0;
    pub const OCCURRING: u8 = 1;
    pub const COMPLETE: u8 = 2;
}

/// Controller Configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cc {
    /// Enable (bit 0).
    pub en: bool,
    /// I/O command set selected (bits 6:4): 0 NVM, 6 all supported I/O
    /// command sets, 7 admin only.
    pub css: u8,
    /// Memory page size, 2^(12+n) (bits 10:7).
    pub mps: u8,
    /// Arbitration mechanism (bits 13:11).
    pub ams: u8,
    /// Shutdown notification (bits 15:14, see [`shn`]).
    pub shn: u8,
    /// I/O submission queue entry size, 2^n (bits 19:16); 6 for 64 bytes.
    pub iosqes: u8,
    /// I/O completion queue entry size, 2^n (bits 23:20); 4 for 16 bytes.
    pub iocqes: u8,
    /// Controller ready independent of media enable (bit 24).
    pub crime: bool,
}

impl Cc {
    /// Unpacks the 32-bit value.
    pub fn from_u32(v: u32) -> Cc {
        let v = u64::from(v);
        Cc {
            en: field(v, 0, 1) != 0,
            css: field(v, 4, 3) as u8,
            mps: field(v, 7, 4) as u8,
            ams: field(v, 11, 3) as u8,
            shn: field(v, 14, 2) as u8,
            iosqes: field(v, 16, 4) as u8,
            iocqes: field(v, 20, 4) as u8,
            crime: field(v, 24, 1) != 0,
        }
    }

    /// Packs the 32-bit value.
    pub fn to_u32(&self) -> u32 {
        (place(u64::from(self.en), 0, 1)
            | place(u64::from(self.css), 4, 3)
            | place(u64::from(self.mps), 7, 4)
            | place(u64::from(self.ams), 11, 3)
            | place(u64::from(self.shn), 14, 2)
            | place(u64::from(self.iosqes), 16, 4)
            | place(u64::from(self.iocqes), 20, 4)
            | place(u64::from(self.crime), 24, 1)) as u32
    }
}

/// Controller Status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Csts {
    /// Ready (bit 0).
    pub rdy: bool,
    /// Controller fatal status (bit 1).
    pub cfs: bool,
    /// Shutdown status (bits 3:2, see [`shst`]).
    pub shst: u8,
    /// NVM subsystem reset occurred (bit 4).
    pub nssro: bool,
    /// Processing paused (bit 5).
    pub pp: bool,
}

impl Csts {
    /// Unpacks the 32-bit value.
    pub fn from_u32(v: u32) -> Csts {
        let v = u64::from(v);
        Csts {
            rdy: field(v, 0, 1) != 0,
            cfs: field(v, 1, 1) != 0,
            shst: field(v, 2, 2) as u8,
            nssro: field(v, 4, 1) != 0,
            pp: field(v, 5, 1) != 0,
        }
    }

    /// Packs the 32-bit value.
    pub fn to_u32(&self) -> u32 {
        (place(u64::from(self.rdy), 0, 1)
            | place(u64::from(self.cfs), 1, 1)
            | place(u64::from(self.shst), 2, 2)
            | place(u64::from(self.nssro), 4, 1)
            | place(u64::from(self.pp), 5, 1)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_matches_linux_target() {
        // Linux nvmet: (1 << 37) | (15 << 24) | (queue size - 1).
        let cap = Cap::fabrics(1024);
        assert_eq!(cap.to_u64(), (1u64 << 37) | (15 << 24) | 1023);
        assert_eq!(Cap::from_u64(cap.to_u64()), cap);
        let all = Cap::from_u64(u64::MAX);
        assert_eq!(all.css, 0xff);
        assert_eq!(all.mpsmax, 0xf);
    }

    #[test]
    fn cc_as_linux_host_writes_it() {
        // Linux host enable: IOSQES 6, IOCQES 4, CSS NVM, MPS 0, EN.
        let cc = Cc::from_u32(0x0046_0001);
        assert!(cc.en);
        assert_eq!(
            (cc.iosqes, cc.iocqes, cc.css, cc.mps, cc.shn),
            (6, 4, 0, 0, 0)
        );
        assert_eq!(cc.to_u32(), 0x0046_0001);
        let shutdown = Cc {
            shn: shn::NORMAL,
            ..cc
        };
        assert_eq!(shutdown.to_u32(), 0x0046_4001);
    }

    #[test]
    fn csts_and_vs() {
        let csts = Csts {
            rdy: true,
            shst: shst::COMPLETE,
            ..Csts::default()
        };
        assert_eq!(csts.to_u32(), 0b1001);
        assert_eq!(Csts::from_u32(0b1001), csts);
        assert_eq!(Vs::V1_4.to_u32(), 0x0001_0400);
        assert_eq!(Vs::from_u32(0x0002_0100), Vs::new(2, 1, 0));
        assert!(Vs::V2_0 > Vs::V1_4);
    }

    #[test]
    fn property_table() {
        for p in [
            Property::Cap,
            Property::Vs,
            Property::Cc,
            Property::Csts,
            Property::Nssr,
        ] {
            assert_eq!(Property::from_offset(p.offset()), Some(p));
        }
        assert_eq!(Property::from_offset(0x24), None);
        assert_eq!(Property::Cap.size(), PropertySize::Eight);
        assert_eq!(Property::Csts.size(), PropertySize::Four);
        assert_eq!(PropertySize::from_attrib(0xf9), PropertySize::Eight);
        assert_eq!(PropertySize::from_attrib(2).attrib(), 2);
    }
}
