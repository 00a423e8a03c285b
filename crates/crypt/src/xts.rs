//! Data keys and the block cipher they drive: AES-256-XTS over 4 KiB
//! units, tweak = the unit's index in the volume (little endian, as IEEE
//! 1619 numbers data units). The `aes` crate picks AES-NI at run time when
//! the CPU has it and a constant-time bitsliced implementation otherwise.

use crate::master::{MasterKey, MasterKeyError};
use crate::UNIT;
use aes::cipher::KeyInit;
use aes::Aes256;
use rand::RngCore;
use xts_mode::{get_tweak_default, Xts128};
use zeroize::Zeroizing;

/// Suite byte of a wrapped key: a 64-byte AES-256-XTS key wrapped with
/// AES-256 key wrap (RFC 3394) under the master key.
pub const SUITE_XTS_AES256_KW: u8 = 1;

/// Bytes of an AES-256-XTS key (two AES-256 keys).
const XTS_KEY: usize = 64;

/// A volume's data key, in memory only.
pub struct DataKey(Zeroizing<[u8; XTS_KEY]>);

impl DataKey {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> DataKey {
        let mut k = Zeroizing::new([0u8; XTS_KEY]);
        rand::rngs::OsRng.fill_bytes(&mut k[..]);
        DataKey(k)
    }

    /// A key from its 64 bytes (key 1, then key 2); `None` for any other
    /// length.
    pub fn from_bytes(bytes: &[u8]) -> Option<DataKey> {
        let mut k = Zeroizing::new([0u8; XTS_KEY]);
        if bytes.len() != XTS_KEY {
            return None;
        }
        k.copy_from_slice(bytes);
        Some(DataKey(k))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0[..]
    }

    /// The cipher for this key.
    pub fn cipher(&self) -> BlockCipher {
        let c1 = Aes256::new_from_slice(&self.0[..32]).expect("32-byte key");
        let c2 = Aes256::new_from_slice(&self.0[32..]).expect("32-byte key");
        BlockCipher {
            xts: Xts128::new(c1, c2),
        }
    }
}

/// A data key as it is kept (in a store's key slots): wrapped under a
/// master key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrappedDataKey {
    pub suite: u8,
    /// [`MasterKey::id`] of the key that wrapped it.
    pub master_key_id: u32,
    pub blob: Vec<u8>,
}

impl WrappedDataKey {
    /// Unwraps it with `master`: a wrong master key (or a damaged blob)
    /// is an error, never another key.
    pub fn unwrap_with(&self, master: &MasterKey) -> Result<DataKey, MasterKeyError> {
        if self.suite != SUITE_XTS_AES256_KW {
            return Err(MasterKeyError::UnknownSuite(self.suite));
        }
        if self.master_key_id != master.id() {
            return Err(MasterKeyError::WrongMasterKey {
                wanted: self.master_key_id,
                have: master.id(),
            });
        }
        let plain = Zeroizing::new(master.unwrap_blob(&self.blob)?);
        DataKey::from_bytes(&plain).ok_or(MasterKeyError::Damaged)
    }
}

/// AES-256-XTS over whole 4 KiB units.
pub struct BlockCipher {
    xts: Xts128<Aes256>,
}

impl BlockCipher {
    /// Encrypts `data` (whole units) in place; `first_unit` is the index
    /// in the volume of its first unit.
    pub fn encrypt(&self, first_unit: u64, data: &mut [u8]) {
        debug_assert_eq!(data.len() % UNIT, 0);
        self.xts
            .encrypt_area(data, UNIT, first_unit as u128, get_tweak_default);
    }

    /// Decrypts `data` (whole units) in place.
    pub fn decrypt(&self, first_unit: u64, data: &mut [u8]) {
        debug_assert_eq!(data.len() % UNIT, 0);
        self.xts
            .decrypt_area(data, UNIT, first_unit as u128, get_tweak_default);
    }

    /// One data unit of any length (≥ 16 bytes) with an explicit unit
    /// number: the IEEE 1619 primitive, for known-answer tests.
    pub fn encrypt_unit(&self, unit: u128, data: &mut [u8]) {
        self.xts.encrypt_sector(data, get_tweak_default(unit));
    }

    /// The inverse of [`BlockCipher::encrypt_unit`].
    pub fn decrypt_unit(&self, unit: u128, data: &mut [u8]) {
        self.xts.decrypt_sector(data, get_tweak_default(unit));
    }
}

impl MasterKey {
    /// Wraps `key` under this master key.
    pub fn wrap(&self, key: &DataKey) -> WrappedDataKey {
        WrappedDataKey {
            suite: SUITE_XTS_AES256_KW,
            master_key_id: self.id(),
            blob: self.wrap_blob(key.bytes()),
        }
    }
}
