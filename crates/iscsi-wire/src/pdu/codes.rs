//! The coded fields of iSCSI PDUs as typed values: task attributes, task
//! management functions and responses, login stages, logout reasons and
//! responses, SNACK types, reject reasons, asynchronous events, and
//! residual counts.
//!
//! Invariant: every code enum is lossless over its bit field. Values the
//! RFC leaves reserved or vendor specific decode to the enum's `Reserved`
//! variant carrying the raw value, and `from_code(x.code()) == x` for every
//! value `from_code` returns. (A `Reserved` built by hand around a named
//! code encodes as that code.)

/// Defines a code enum over the bits of `mask`, with a `Reserved(u8)`
/// variant for every value without a name.
macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        $name:ident, mask = $mask:literal,
        { $( $(#[$vmeta:meta])* $variant:ident = $code:literal, )* }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A reserved or vendor-specific value, kept as received.
            Reserved(u8),
        }

        impl $name {
            /// The bits of the field this code occupies.
            pub const MASK: u8 = $mask;

            /// The value for the field's bits (bits outside
            /// [`Self::MASK`] are ignored).
            pub fn from_code(code: u8) -> $name {
                match code & $mask {
                    $( $code => $name::$variant, )*
                    other => $name::Reserved(other),
                }
            }

            /// The field's bits.
            pub fn code(self) -> u8 {
                match self {
                    $( $name::$variant => $code, )*
                    $name::Reserved(code) => code & $mask,
                }
            }
        }
    };
}

code_enum! {
    /// Task attribute of a SCSI Command (ATTR, byte 1 bits 0-2; SAM).
    TaskAttribute, mask = 0x07, {
        Untagged = 0,
        Simple = 1,
        Ordered = 2,
        HeadOfQueue = 3,
        Aca = 4,
    }
}

code_enum! {
    /// Function of a Task Management Function Request (RFC 7143 §11.5.1).
    TmfFunction, mask = 0x7f, {
        AbortTask = 1,
        AbortTaskSet = 2,
        ClearAca = 3,
        ClearTaskSet = 4,
        LogicalUnitReset = 5,
        TargetWarmReset = 6,
        TargetColdReset = 7,
        TaskReassign = 8,
    }
}

code_enum! {
    /// Response of a Task Management Function Response (RFC 7143 §11.6.1).
    TmfResponse, mask = 0xff, {
        FunctionComplete = 0,
        TaskDoesNotExist = 1,
        LunDoesNotExist = 2,
        TaskStillAllegiant = 3,
        AllegianceReassignmentNotSupported = 4,
        NotSupported = 5,
        AuthorizationFailed = 6,
        Rejected = 255,
    }
}

code_enum! {
    /// Reason code of a Logout Request (RFC 7143 §11.14.1).
    LogoutReason, mask = 0x7f, {
        CloseSession = 0,
        CloseConnection = 1,
        RemoveConnectionForRecovery = 2,
    }
}

code_enum! {
    /// Response of a Logout Response (RFC 7143 §11.15.1).
    LogoutResponseCode, mask = 0xff, {
        ClosedSuccessfully = 0,
        CidNotFound = 1,
        RecoveryNotSupported = 2,
        CleanupFailed = 3,
    }
}

code_enum! {
    /// Type of a SNACK Request (RFC 7143 §11.16.1).
    SnackType, mask = 0x0f, {
        /// Data/R2T SNACK: retransmit Data-In or R2T PDUs.
        DataR2t = 0,
        /// Status SNACK: retransmit status PDUs.
        Status = 1,
        /// DataACK: positive acknowledgement of Data-In.
        DataAck = 2,
        /// R-Data SNACK: rerun the Data-In sequence.
        RData = 3,
    }
}

code_enum! {
    /// Reason of a Reject (RFC 7143 §11.17.1).
    RejectReason, mask = 0xff, {
        DataDigestError = 0x02,
        SnackReject = 0x03,
        ProtocolError = 0x04,
        CommandNotSupported = 0x05,
        ImmediateCommandReject = 0x06,
        TaskInProgress = 0x07,
        InvalidDataAck = 0x08,
        InvalidPduField = 0x09,
        LongOperationReject = 0x0a,
        /// Deprecated by RFC 7143 (was "Negotiation Reset").
        NegotiationReset = 0x0b,
        WaitingForLogout = 0x0c,
    }
}

code_enum! {
    /// AsyncEvent of an Asynchronous Message (RFC 7143 §11.9.1).
    AsyncEvent, mask = 0xff, {
        /// A SCSI asynchronous event; sense data is in the data segment.
        ScsiAsyncEvent = 0,
        /// The target requests a logout (Parameter3: seconds to wait).
        LogoutRequest = 1,
        /// The target will drop the connection (Parameter1: its CID).
        ConnectionDrop = 2,
        /// The target will drop all connections of the session.
        AllConnectionsDrop = 3,
        /// The target requests parameter renegotiation.
        ParameterNegotiation = 4,
        /// Vendor specific: AsyncVCode says which.
        VendorSpecific = 255,
    }
}

/// A login stage (CSG and NSG fields, RFC 7143 §11.12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoginStage {
    /// 0: SecurityNegotiation.
    SecurityNegotiation,
    /// 1: LoginOperationalNegotiation.
    OperationalNegotiation,
    /// 2: reserved.
    Reserved,
    /// 3: FullFeaturePhase.
    FullFeaturePhase,
}

impl LoginStage {
    /// The stage for the two bits of CSG or NSG (higher bits ignored).
    pub fn from_code(code: u8) -> LoginStage {
        match code & 0x03 {
            0 => LoginStage::SecurityNegotiation,
            1 => LoginStage::OperationalNegotiation,
            2 => LoginStage::Reserved,
            _ => LoginStage::FullFeaturePhase,
        }
    }

    /// The two bits of the field.
    pub fn code(self) -> u8 {
        match self {
            LoginStage::SecurityNegotiation => 0,
            LoginStage::OperationalNegotiation => 1,
            LoginStage::Reserved => 2,
            LoginStage::FullFeaturePhase => 3,
        }
    }
}

/// A residual count and its overflow/underflow flag (O/U, or o/u for the
/// bidirectional read residual). Without either flag the count field is
/// reserved (RFC 7143 §11.4.5), so it is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Residual {
    /// Neither flag: exactly the expected length was transferred.
    #[default]
    None,
    /// Overflow: this many bytes did not fit the expected length.
    Overflow(u32),
    /// Underflow: this many of the expected bytes were not transferred.
    Underflow(u32),
}

impl Residual {
    /// From the overflow and underflow flags and the count field; `None`
    /// when both flags are set (a protocol error, RFC 7143 §11.4.1).
    pub(crate) fn from_flags(overflow: bool, underflow: bool, count: u32) -> Option<Residual> {
        match (overflow, underflow) {
            (false, false) => Some(Residual::None),
            (true, false) => Some(Residual::Overflow(count)),
            (false, true) => Some(Residual::Underflow(count)),
            (true, true) => None,
        }
    }

    /// Whether the overflow flag is set.
    pub fn overflow(self) -> bool {
        matches!(self, Residual::Overflow(_))
    }

    /// Whether the underflow flag is set.
    pub fn underflow(self) -> bool {
        matches!(self, Residual::Underflow(_))
    }

    /// The count field (0 without a flag).
    pub fn count(self) -> u32 {
        match self {
            Residual::None => 0,
            Residual::Overflow(n) | Residual::Underflow(n) => n,
        }
    }
}

/// Response codes of a SCSI Response (RFC 7143 §11.4.3).
pub mod scsi_response {
    /// Command Completed at Target: the Status field is valid.
    pub const COMMAND_COMPLETED: u8 = 0x00;
    /// Target Failure.
    pub const TARGET_FAILURE: u8 = 0x01;
}

/// Status-Class values of a Login Response (RFC 7143 §11.13.5).
pub mod login_status_class {
    pub const SUCCESS: u8 = 0x00;
    pub const REDIRECTION: u8 = 0x01;
    pub const INITIATOR_ERROR: u8 = 0x02;
    pub const TARGET_ERROR: u8 = 0x03;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_over_their_fields() {
        for code in 0..=255u8 {
            assert_eq!(TaskAttribute::from_code(code).code(), code & 0x07);
            assert_eq!(TmfFunction::from_code(code).code(), code & 0x7f);
            assert_eq!(TmfResponse::from_code(code).code(), code);
            assert_eq!(LogoutReason::from_code(code).code(), code & 0x7f);
            assert_eq!(LogoutResponseCode::from_code(code).code(), code);
            assert_eq!(SnackType::from_code(code).code(), code & 0x0f);
            assert_eq!(RejectReason::from_code(code).code(), code);
            assert_eq!(AsyncEvent::from_code(code).code(), code);
            assert_eq!(LoginStage::from_code(code).code(), code & 0x03);
            let r = RejectReason::from_code(code);
            assert_eq!(RejectReason::from_code(r.code()), r);
        }
        assert_eq!(
            RejectReason::from_code(0x05),
            RejectReason::CommandNotSupported
        );
        assert_eq!(RejectReason::from_code(0x01), RejectReason::Reserved(0x01));
        assert_eq!(TmfFunction::from_code(0x85), TmfFunction::LogicalUnitReset);
    }

    #[test]
    fn residual_flags() {
        assert_eq!(Residual::from_flags(true, true, 1), None);
        assert_eq!(Residual::from_flags(false, false, 7), Some(Residual::None));
        let u = Residual::Underflow(512);
        assert!(u.underflow() && !u.overflow());
        assert_eq!(u.count(), 512);
    }
}
