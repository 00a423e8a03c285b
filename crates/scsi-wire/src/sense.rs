//! Sense data and SCSI status codes (SPC-5 §4.4, SAM-5 §5.3): what a device
//! server reports with CHECK CONDITION, and the encodings it is sent in.
//!
//! Invariants:
//! - A [`Sense`] is a plain value (sense key, ASC/ASCQ, optional INFORMATION
//!   and sense-key-specific field pointer); the wire format is chosen only at
//!   encoding time, so the same value serves fixed-format (response codes
//!   70h/71h) and descriptor-format (72h/73h) sense data. A target uses fixed
//!   format unless the D_SENSE bit of the control mode page is set.
//! - Encoders append to a caller `Vec<u8>` and always produce complete sense
//!   data: 18 bytes in fixed format; 8 bytes plus one descriptor per
//!   optional field in descriptor format.
//! - [`Sense::decode`] never panics and never reads past its input.
//! - The named constants' ASC/ASCQ values are those of SPC-5's table of
//!   additional sense codes (Annex F / table "ASC and ASCQ assignments").

/// SCSI status byte values (SAM-5 table "Status codes").
pub const STATUS_GOOD: u8 = 0x00;
pub const STATUS_CHECK_CONDITION: u8 = 0x02;
pub const STATUS_CONDITION_MET: u8 = 0x04;
pub const STATUS_BUSY: u8 = 0x08;
pub const STATUS_RESERVATION_CONFLICT: u8 = 0x18;
pub const STATUS_TASK_SET_FULL: u8 = 0x28;
pub const STATUS_ACA_ACTIVE: u8 = 0x30;
pub const STATUS_TASK_ABORTED: u8 = 0x40;

/// Length of fixed-format sense data as this crate encodes it (additional
/// sense length 10).
pub const FIXED_SENSE_LEN: usize = 18;

/// Response codes of sense data (SPC-5 table "Sense data response codes").
pub const RESPONSE_FIXED_CURRENT: u8 = 0x70;
pub const RESPONSE_FIXED_DEFERRED: u8 = 0x71;
pub const RESPONSE_DESCRIPTOR_CURRENT: u8 = 0x72;
pub const RESPONSE_DESCRIPTOR_DEFERRED: u8 = 0x73;

/// Sense keys (SPC-5 table "Sense key descriptions"); only those a block
/// target reports.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenseKey {
    NoSense = 0,
    RecoveredError = 1,
    NotReady = 2,
    MediumError = 3,
    HardwareError = 4,
    IllegalRequest = 5,
    UnitAttention = 6,
    DataProtect = 7,
    BlankCheck = 8,
    AbortedCommand = 0x0b,
    Miscompare = 0x0e,
}

impl SenseKey {
    /// The sense key for a 4-bit wire value, if it is one this crate models.
    pub const fn from_u8(v: u8) -> Option<SenseKey> {
        Some(match v {
            0 => SenseKey::NoSense,
            1 => SenseKey::RecoveredError,
            2 => SenseKey::NotReady,
            3 => SenseKey::MediumError,
            4 => SenseKey::HardwareError,
            5 => SenseKey::IllegalRequest,
            6 => SenseKey::UnitAttention,
            7 => SenseKey::DataProtect,
            8 => SenseKey::BlankCheck,
            0x0b => SenseKey::AbortedCommand,
            0x0e => SenseKey::Miscompare,
            _ => return None,
        })
    }
}

/// The sense-key-specific field pointer of ILLEGAL REQUEST sense data
/// (SPC-5 §4.4.2.4.2): which byte (and bit) of the CDB or parameter list is
/// in error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// C/D bit: true when the error is in the CDB, false when in the
    /// parameter list (data-out).
    pub in_cdb: bool,
    /// Byte offset of the erroneous field.
    pub byte: u16,
    /// Bit of that byte (0..=7) when the pointer is that precise (BPV = 1).
    pub bit: Option<u8>,
}

impl FieldPointer {
    /// Sense-key-specific bytes (3 bytes, SKSV set).
    fn bytes(&self) -> [u8; 3] {
        let mut b0 = 0x80;
        if self.in_cdb {
            b0 |= 0x40;
        }
        if let Some(bit) = self.bit {
            b0 |= 0x08 | (bit & 0x07);
        }
        let [hi, lo] = self.byte.to_be_bytes();
        [b0, hi, lo]
    }

    /// Field pointer from sense-key-specific bytes, if SKSV is set.
    fn from_bytes(b: [u8; 3]) -> Option<FieldPointer> {
        if b[0] & 0x80 == 0 {
            return None;
        }
        Some(FieldPointer {
            in_cdb: b[0] & 0x40 != 0,
            byte: u16::from_be_bytes([b[1], b[2]]),
            bit: (b[0] & 0x08 != 0).then_some(b[0] & 0x07),
        })
    }
}

/// Sense data reported with CHECK CONDITION (or queued as a unit attention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    pub key: SenseKey,
    pub asc: u8,
    pub ascq: u8,
    /// INFORMATION field (for example the offset of the first miscompared
    /// byte of COMPARE AND WRITE, or the first LBA in error).
    pub information: Option<u64>,
    /// Sense-key-specific field pointer (ILLEGAL REQUEST only).
    pub field_pointer: Option<FieldPointer>,
}

/// Why bytes are not sense data this crate can represent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SenseDecodeError {
    #[error("sense data too short: {0} bytes")]
    TooShort(usize),
    #[error("unknown sense data response code {0:#04x}")]
    ResponseCode(u8),
    #[error("unmodelled sense key {0:#03x}")]
    SenseKey(u8),
}

impl Sense {
    pub const fn new(key: SenseKey, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            information: None,
            field_pointer: None,
        }
    }

    pub fn with_information(self, information: u64) -> Sense {
        Sense {
            information: Some(information),
            ..self
        }
    }

    pub fn with_field_pointer(self, field_pointer: FieldPointer) -> Sense {
        Sense {
            field_pointer: Some(field_pointer),
            ..self
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`).
    pub fn invalid_field_in_cdb(byte: u16, bit: Option<u8>) -> Sense {
        INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer {
            in_cdb: true,
            byte,
            bit,
        })
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte`
    /// (and `bit`) of the parameter list.
    pub fn invalid_field_in_parameter_list(byte: u16, bit: Option<u8>) -> Sense {
        INVALID_FIELD_IN_PARAMETER_LIST.with_field_pointer(FieldPointer {
            in_cdb: false,
            byte,
            bit,
        })
    }

    /// True when key, ASC and ASCQ are those of `other` (the optional
    /// fields are ignored): how tests and callers classify sense.
    pub fn is(&self, other: &Sense) -> bool {
        self.key == other.key && self.asc == other.asc && self.ascq == other.ascq
    }

    /// Appends current fixed-format sense data (response code 70h).
    pub fn encode_fixed(&self, out: &mut Vec<u8>) {
        self.encode_fixed_as(false, out);
    }

    /// Appends fixed-format sense data; `deferred` selects response code 71h
    /// (deferred error) instead of 70h.
    ///
    /// The INFORMATION field is 4 bytes here: a value above `u32::MAX` is
    /// not representable, so it is left out and VALID stays 0 (SPC-5
    /// §4.4.3: VALID set to one only when INFORMATION is as the standard
    /// defines it).
    pub fn encode_fixed_as(&self, deferred: bool, out: &mut Vec<u8>) {
        let info = self.information.and_then(|i| u32::try_from(i).ok());
        let mut b = [0u8; FIXED_SENSE_LEN];
        b[0] = if deferred {
            RESPONSE_FIXED_DEFERRED
        } else {
            RESPONSE_FIXED_CURRENT
        };
        if let Some(i) = info {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&i.to_be_bytes());
        }
        b[2] = self.key as u8;
        b[7] = (FIXED_SENSE_LEN - 8) as u8;
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(fp) = self.field_pointer {
            b[15..18].copy_from_slice(&fp.bytes());
        }
        out.extend_from_slice(&b);
    }

    /// Appends current descriptor-format sense data (response code 72h).
    pub fn encode_descriptor(&self, out: &mut Vec<u8>) {
        self.encode_descriptor_as(false, out);
    }

    /// Appends descriptor-format sense data; `deferred` selects response
    /// code 73h. INFORMATION becomes an information descriptor (type 00h,
    /// VALID set, 8-byte field) and the field pointer a sense key specific
    /// descriptor (type 02h).
    pub fn encode_descriptor_as(&self, deferred: bool, out: &mut Vec<u8>) {
        let start = out.len();
        out.push(if deferred {
            RESPONSE_DESCRIPTOR_DEFERRED
        } else {
            RESPONSE_DESCRIPTOR_CURRENT
        });
        out.extend_from_slice(&[self.key as u8, self.asc, self.ascq, 0, 0, 0, 0]);
        if let Some(info) = self.information {
            out.extend_from_slice(&[0x00, 0x0a, 0x80, 0x00]);
            out.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(fp) = self.field_pointer {
            out.extend_from_slice(&[0x02, 0x06, 0x00, 0x00]);
            out.extend_from_slice(&fp.bytes());
            out.push(0);
        }
        // At most 8 + 12 + 8 bytes, so the additional length fits a byte.
        let additional = out.len() - start - 8;
        if let Some(len) = out.get_mut(start + 7) {
            *len = additional as u8;
        }
    }

    /// Appends sense data in the format the control mode page selects
    /// (`d_sense` = the D_SENSE bit).
    pub fn encode(&self, d_sense: bool, out: &mut Vec<u8>) {
        if d_sense {
            self.encode_descriptor(out);
        } else {
            self.encode_fixed(out);
        }
    }

    /// Parses fixed- or descriptor-format sense data (either current or
    /// deferred). Unknown descriptors are skipped.
    pub fn decode(b: &[u8]) -> Result<Sense, SenseDecodeError> {
        let at = |i: usize| b.get(i).copied().unwrap_or(0);
        let code = at(0) & 0x7f;
        match code {
            RESPONSE_FIXED_CURRENT | RESPONSE_FIXED_DEFERRED => {
                if b.len() < 14 {
                    return Err(SenseDecodeError::TooShort(b.len()));
                }
                let key = at(2) & 0x0f;
                let key = SenseKey::from_u8(key).ok_or(SenseDecodeError::SenseKey(key))?;
                let information = (at(0) & 0x80 != 0)
                    .then(|| u64::from(u32::from_be_bytes([at(3), at(4), at(5), at(6)])));
                // Sense-key-specific bytes only count if the additional
                // length covers them.
                let field_pointer = if key == SenseKey::IllegalRequest
                    && usize::from(at(7)) + 8 >= 18
                    && b.len() >= 18
                {
                    FieldPointer::from_bytes([at(15), at(16), at(17)])
                } else {
                    None
                };
                Ok(Sense {
                    key,
                    asc: at(12),
                    ascq: at(13),
                    information,
                    field_pointer,
                })
            }
            RESPONSE_DESCRIPTOR_CURRENT | RESPONSE_DESCRIPTOR_DEFERRED => {
                if b.len() < 8 {
                    return Err(SenseDecodeError::TooShort(b.len()));
                }
                let key = at(1) & 0x0f;
                let key = SenseKey::from_u8(key).ok_or(SenseDecodeError::SenseKey(key))?;
                let mut sense = Sense::new(key, at(2), at(3));
                let end = b.len().min(8 + usize::from(at(7)));
                let mut pos = 8usize;
                while pos + 2 <= end {
                    let kind = at(pos);
                    let len = usize::from(at(pos + 1));
                    let body = b.get(pos + 2..(pos + 2 + len).min(end)).unwrap_or(&[]);
                    match kind {
                        0x00 if body.len() >= 10 && body.first().is_some_and(|v| v & 0x80 != 0) => {
                            let mut info = [0u8; 8];
                            info.copy_from_slice(body.get(2..10).unwrap_or(&[0; 8]));
                            sense.information = Some(u64::from_be_bytes(info));
                        }
                        0x02 if body.len() >= 5 && key == SenseKey::IllegalRequest => {
                            let g = |i: usize| body.get(i).copied().unwrap_or(0);
                            sense.field_pointer = FieldPointer::from_bytes([g(2), g(3), g(4)]);
                        }
                        _ => {}
                    }
                    pos += 2 + len;
                }
                Ok(sense)
            }
            _ => Err(SenseDecodeError::ResponseCode(at(0))),
        }
    }
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {:02x}/{:02x}", self.key, self.asc, self.ascq)
    }
}

use SenseKey::*;

// NOT READY
pub const LOGICAL_UNIT_NOT_READY: Sense = Sense::new(NotReady, 0x04, 0x00);
pub const LOGICAL_UNIT_BECOMING_READY: Sense = Sense::new(NotReady, 0x04, 0x01);
pub const ASYMMETRIC_ACCESS_STATE_TRANSITION: Sense = Sense::new(NotReady, 0x04, 0x0a);
pub const TARGET_PORT_IN_STANDBY_STATE: Sense = Sense::new(NotReady, 0x04, 0x0b);
pub const TARGET_PORT_IN_UNAVAILABLE_STATE: Sense = Sense::new(NotReady, 0x04, 0x0c);
pub const SANITIZE_IN_PROGRESS: Sense = Sense::new(NotReady, 0x04, 0x1b);
pub const MEDIUM_NOT_PRESENT: Sense = Sense::new(NotReady, 0x3a, 0x00);

// MEDIUM ERROR
pub const WRITE_ERROR: Sense = Sense::new(MediumError, 0x0c, 0x00);
pub const UNRECOVERED_READ_ERROR: Sense = Sense::new(MediumError, 0x11, 0x00);

// HARDWARE ERROR
pub const INTERNAL_TARGET_FAILURE: Sense = Sense::new(HardwareError, 0x44, 0x00);
pub const LOGICAL_UNIT_COMMUNICATION_FAILURE: Sense = Sense::new(HardwareError, 0x08, 0x00);

// ILLEGAL REQUEST
pub const PARAMETER_LIST_LENGTH_ERROR: Sense = Sense::new(IllegalRequest, 0x1a, 0x00);
pub const INVALID_COMMAND_OPERATION_CODE: Sense = Sense::new(IllegalRequest, 0x20, 0x00);
pub const LBA_OUT_OF_RANGE: Sense = Sense::new(IllegalRequest, 0x21, 0x00);
pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(IllegalRequest, 0x24, 0x00);
pub const LOGICAL_UNIT_NOT_SUPPORTED: Sense = Sense::new(IllegalRequest, 0x25, 0x00);
pub const INVALID_FIELD_IN_PARAMETER_LIST: Sense = Sense::new(IllegalRequest, 0x26, 0x00);
pub const PARAMETER_NOT_SUPPORTED: Sense = Sense::new(IllegalRequest, 0x26, 0x01);
pub const PARAMETER_VALUE_INVALID: Sense = Sense::new(IllegalRequest, 0x26, 0x02);
pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: Sense = Sense::new(IllegalRequest, 0x26, 0x04);
pub const SAVING_PARAMETERS_NOT_SUPPORTED: Sense = Sense::new(IllegalRequest, 0x39, 0x00);
pub const MEDIUM_REMOVAL_PREVENTED: Sense = Sense::new(IllegalRequest, 0x53, 0x02);
pub const INSUFFICIENT_REGISTRATION_RESOURCES: Sense = Sense::new(IllegalRequest, 0x55, 0x04);

// UNIT ATTENTION
pub const POWER_ON_RESET: Sense = Sense::new(UnitAttention, 0x29, 0x00);
pub const BUS_DEVICE_RESET_FUNCTION_OCCURRED: Sense = Sense::new(UnitAttention, 0x29, 0x03);
pub const I_T_NEXUS_LOSS_OCCURRED: Sense = Sense::new(UnitAttention, 0x29, 0x07);
pub const MODE_PARAMETERS_CHANGED: Sense = Sense::new(UnitAttention, 0x2a, 0x01);
pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(UnitAttention, 0x2a, 0x03);
pub const RESERVATIONS_RELEASED: Sense = Sense::new(UnitAttention, 0x2a, 0x04);
pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(UnitAttention, 0x2a, 0x05);
pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Sense = Sense::new(UnitAttention, 0x2a, 0x06);
pub const CAPACITY_DATA_HAS_CHANGED: Sense = Sense::new(UnitAttention, 0x2a, 0x09);
pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: Sense = Sense::new(UnitAttention, 0x2f, 0x00);
pub const THIN_PROVISIONING_SOFT_THRESHOLD_REACHED: Sense = Sense::new(UnitAttention, 0x38, 0x07);
pub const INQUIRY_DATA_HAS_CHANGED: Sense = Sense::new(UnitAttention, 0x3f, 0x03);
pub const REPORTED_LUNS_DATA_HAS_CHANGED: Sense = Sense::new(UnitAttention, 0x3f, 0x0e);

// DATA PROTECT
pub const WRITE_PROTECTED: Sense = Sense::new(DataProtect, 0x27, 0x00);
pub const HARDWARE_WRITE_PROTECTED: Sense = Sense::new(DataProtect, 0x27, 0x01);
pub const LOGICAL_UNIT_SOFTWARE_WRITE_PROTECTED: Sense = Sense::new(DataProtect, 0x27, 0x02);
pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: Sense = Sense::new(DataProtect, 0x27, 0x07);

// ABORTED COMMAND
pub const INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT: Sense = Sense::new(AbortedCommand, 0x0e, 0x03);
pub const COMMAND_PHASE_ERROR: Sense = Sense::new(AbortedCommand, 0x4a, 0x00);
pub const DATA_PHASE_ERROR: Sense = Sense::new(AbortedCommand, 0x4b, 0x00);
pub const OVERLAPPED_COMMANDS_ATTEMPTED: Sense = Sense::new(AbortedCommand, 0x4e, 0x00);

// MISCOMPARE
pub const MISCOMPARE_DURING_VERIFY: Sense = Sense::new(Miscompare, 0x1d, 0x00);
pub const MISCOMPARE_VERIFY_OF_UNMAPPED_LBA: Sense = Sense::new(Miscompare, 0x1d, 0x01);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Key/ASC/ASCQ triples as SPC-5's ASC/ASCQ assignments list them.
    #[test]
    fn named_values() {
        let table: [(Sense, u8, u8, u8); 20] = [
            (INVALID_COMMAND_OPERATION_CODE, 0x5, 0x20, 0x00),
            (LBA_OUT_OF_RANGE, 0x5, 0x21, 0x00),
            (INVALID_FIELD_IN_CDB, 0x5, 0x24, 0x00),
            (PARAMETER_LIST_LENGTH_ERROR, 0x5, 0x1a, 0x00),
            (INVALID_FIELD_IN_PARAMETER_LIST, 0x5, 0x26, 0x00),
            (MISCOMPARE_DURING_VERIFY, 0xe, 0x1d, 0x00),
            (WRITE_PROTECTED, 0x7, 0x27, 0x00),
            (POWER_ON_RESET, 0x6, 0x29, 0x00),
            (CAPACITY_DATA_HAS_CHANGED, 0x6, 0x2a, 0x09),
            (ASYMMETRIC_ACCESS_STATE_CHANGED, 0x6, 0x2a, 0x06),
            (REPORTED_LUNS_DATA_HAS_CHANGED, 0x6, 0x3f, 0x0e),
            (RESERVATIONS_PREEMPTED, 0x6, 0x2a, 0x03),
            (RESERVATIONS_RELEASED, 0x6, 0x2a, 0x04),
            (REGISTRATIONS_PREEMPTED, 0x6, 0x2a, 0x05),
            (MODE_PARAMETERS_CHANGED, 0x6, 0x2a, 0x01),
            (SAVING_PARAMETERS_NOT_SUPPORTED, 0x5, 0x39, 0x00),
            (LOGICAL_UNIT_NOT_SUPPORTED, 0x5, 0x25, 0x00),
            (SPACE_ALLOCATION_FAILED_WRITE_PROTECT, 0x7, 0x27, 0x07),
            (INTERNAL_TARGET_FAILURE, 0x4, 0x44, 0x00),
            (COMMANDS_CLEARED_BY_ANOTHER_INITIATOR, 0x6, 0x2f, 0x00),
        ];
        for (s, key, asc, ascq) in table {
            assert_eq!((s.key as u8, s.asc, s.ascq), (key, asc, ascq), "{s}");
        }
        assert_eq!((UNRECOVERED_READ_ERROR.asc, WRITE_ERROR.asc), (0x11, 0x0c));
    }

    #[test]
    fn fixed_plain() {
        let mut out = Vec::new();
        LBA_OUT_OF_RANGE.encode_fixed(&mut out);
        assert_eq!(
            out,
            [0x70, 0, 0x05, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x21, 0x00, 0, 0, 0, 0]
        );
    }

    #[test]
    fn fixed_information_and_deferred() {
        let mut out = Vec::new();
        MISCOMPARE_DURING_VERIFY
            .with_information(0x0102_0304)
            .encode_fixed_as(true, &mut out);
        assert_eq!(
            out,
            [0xf1, 0, 0x0e, 1, 2, 3, 4, 0x0a, 0, 0, 0, 0, 0x1d, 0x00, 0, 0, 0, 0]
        );
        // Too large for 4 bytes: VALID stays clear.
        let mut out = Vec::new();
        UNRECOVERED_READ_ERROR
            .with_information(1 << 40)
            .encode_fixed(&mut out);
        assert_eq!(out[0], 0x70);
        assert_eq!(&out[3..7], &[0, 0, 0, 0]);
    }

    #[test]
    fn fixed_field_pointer() {
        let mut out = Vec::new();
        Sense::invalid_field_in_cdb(2, Some(5)).encode_fixed(&mut out);
        assert_eq!(
            out,
            [0x70, 0, 0x05, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x24, 0, 0, 0xcd, 0x00, 0x02]
        );
        let mut out = Vec::new();
        Sense::invalid_field_in_parameter_list(0x123, None).encode_fixed(&mut out);
        assert_eq!(&out[12..], &[0x26, 0, 0, 0x80, 0x01, 0x23]);
    }

    #[test]
    fn descriptor_plain() {
        let mut out = Vec::new();
        RESERVATIONS_PREEMPTED.encode_descriptor(&mut out);
        assert_eq!(out, [0x72, 0x06, 0x2a, 0x03, 0, 0, 0, 0]);
    }

    #[test]
    fn descriptor_information_and_field_pointer() {
        let mut out = Vec::new();
        Sense::invalid_field_in_cdb(9, Some(1))
            .with_information(0x1122_3344_5566_7788)
            .encode_descriptor(&mut out);
        assert_eq!(
            out,
            [
                0x72, 0x05, 0x24, 0x00, 0, 0, 0, 20, // header
                0x00, 0x0a, 0x80, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x02, 0x06,
                0x00, 0x00, 0xc9, 0x00, 0x09, 0x00,
            ]
        );
    }

    #[test]
    fn decode_both_formats() {
        let s = Sense::invalid_field_in_cdb(9, Some(1)).with_information(77);
        for d in [false, true] {
            let mut out = Vec::new();
            s.encode(d, &mut out);
            assert_eq!(Sense::decode(&out), Ok(s));
        }
        assert_eq!(Sense::decode(&[0x70]), Err(SenseDecodeError::TooShort(1)));
        assert_eq!(
            Sense::decode(&[0x10, 0, 0, 0, 0, 0, 0, 0]),
            Err(SenseDecodeError::ResponseCode(0x10))
        );
    }

    fn any_key() -> impl Strategy<Value = SenseKey> {
        prop::sample::select(vec![
            NoSense,
            RecoveredError,
            NotReady,
            MediumError,
            HardwareError,
            IllegalRequest,
            UnitAttention,
            DataProtect,
            BlankCheck,
            AbortedCommand,
            Miscompare,
        ])
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Sense::decode(&b);
        }

        #[test]
        fn round_trip(key in any_key(), asc: u8, ascq: u8, info: Option<u64>,
                      fp: Option<(bool, u16, Option<u8>)>, descriptor: bool) {
            let mut s = Sense::new(key, asc, ascq);
            s.information = info;
            if key == IllegalRequest {
                s.field_pointer = fp.map(|(in_cdb, byte, bit)| FieldPointer {
                    in_cdb, byte, bit: bit.map(|b| b & 7),
                });
            }
            let mut out = Vec::new();
            s.encode(descriptor, &mut out);
            let mut want = s;
            if !descriptor && info.is_some_and(|i| i > u64::from(u32::MAX)) {
                want.information = None;
            }
            prop_assert_eq!(Sense::decode(&out), Ok(want));
        }
    }
}
