//! Encryption at rest: the master key an operator provides, the random
//! per-volume data keys it wraps, and the AES-256-XTS cipher that
//! encrypts a volume's 4 KiB blocks with the block's address in the volume
//! as the tweak.
//!
//! Invariants:
//! - A data key leaves this crate only wrapped ([`MasterKey::wrap`]); key
//!   material is zeroed when dropped.
//! - A wrapped key names its suite and the id of the master key that
//!   wrapped it, so a wrong master key is told apart from a damaged blob,
//!   and unwrapping with the wrong key fails (AES key wrap's integrity
//!   check) rather than yield another key.
//! - Identical plaintext at two block addresses, or in two volumes, gives
//!   different ciphertext (the tweak is the block address; each volume
//!   has its own data key).

mod master;
mod xts;

pub use master::{KeySource, MasterKey, MasterKeyError};
pub use xts::{BlockCipher, CipherError, DataKey, WrappedDataKey, SUITE_XTS_AES256_KW};

/// Bytes of one encryption unit: a volume block.
pub const UNIT: usize = 4096;
