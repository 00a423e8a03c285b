//! Data keys and the block cipher they drive: AES-256-XTS over 4 KiB
//! units, tweak = the unit's index in the volume (little endian, as IEEE
//! 1619 numbers data units), run by OpenSSL's EVP interface, whose XTS
//! uses AES-NI (and VAES where present) with many blocks in flight: a
//! block-at-a-time XTS (RustCrypto `xts-mode`) measured 2.4x slower on
//! 1 MiB writes here (BENCHMARKS.md, "Encryption at rest").
//!
//! A `BlockCipher` is shared by every thread serving its volume; each
//! call borrows an initialised OpenSSL context (key schedule done) from a
//! small pool, so the only per-call costs are a pool lock and, per unit,
//! setting the tweak.

use crate::master::{MasterKey, MasterKeyError};
use crate::UNIT;
use openssl::cipher::Cipher;
use openssl::cipher_ctx::CipherCtx;
use parking_lot::Mutex;
use rand::RngCore;
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
        BlockCipher {
            key: Zeroizing::new(*self.0),
            encrypting: Mutex::new(Vec::new()),
            decrypting: Mutex::new(Vec::new()),
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

/// OpenSSL failed to run the cipher (it cannot for a valid key; the
/// caller fails the I/O rather than write or return anything).
#[derive(Debug, thiserror::Error)]
#[error("AES-256-XTS failed: {0}")]
pub struct CipherError(#[from] openssl::error::ErrorStack);

/// AES-256-XTS over whole 4 KiB units.
pub struct BlockCipher {
    key: Zeroizing<[u8; XTS_KEY]>,
    /// Idle OpenSSL contexts with the key set, per direction.
    encrypting: Mutex<Vec<CipherCtx>>,
    decrypting: Mutex<Vec<CipherCtx>>,
}

fn tweak(unit: u128) -> [u8; 16] {
    unit.to_le_bytes()
}

impl BlockCipher {
    /// Runs `f` with an idle context of `pool` (a new one, keyed, if none
    /// is idle) and returns the context to the pool.
    fn with_ctx<R>(
        &self,
        encrypt: bool,
        f: impl FnOnce(&mut CipherCtx) -> Result<R, CipherError>,
    ) -> Result<R, CipherError> {
        let pool = if encrypt {
            &self.encrypting
        } else {
            &self.decrypting
        };
        let idle = pool.lock().pop();
        let mut ctx = match idle {
            Some(ctx) => ctx,
            None => {
                let mut ctx = CipherCtx::new()?;
                let cipher = Cipher::aes_256_xts();
                if encrypt {
                    ctx.encrypt_init(Some(cipher), Some(&self.key[..]), None)?;
                } else {
                    ctx.decrypt_init(Some(cipher), Some(&self.key[..]), None)?;
                }
                ctx
            }
        };
        let r = f(&mut ctx);
        pool.lock().push(ctx);
        r
    }

    fn run(
        &self,
        encrypt: bool,
        first_unit: u128,
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), CipherError> {
        self.with_ctx(encrypt, |ctx| {
            for (i, unit) in data.chunks_mut(unit_len).enumerate() {
                let iv = tweak(first_unit + i as u128);
                if encrypt {
                    ctx.encrypt_init(None, None, Some(&iv))?;
                } else {
                    ctx.decrypt_init(None, None, Some(&iv))?;
                }
                let len = unit.len();
                ctx.cipher_update_inplace(unit, len)?;
            }
            Ok(())
        })
    }

    /// Encrypts `data` (whole units) in place; `first_unit` is the index
    /// in the volume of its first unit.
    pub fn encrypt(&self, first_unit: u64, data: &mut [u8]) -> Result<(), CipherError> {
        debug_assert_eq!(data.len() % UNIT, 0);
        self.run(true, first_unit.into(), UNIT, data)
    }

    /// Decrypts `data` (whole units) in place.
    pub fn decrypt(&self, first_unit: u64, data: &mut [u8]) -> Result<(), CipherError> {
        debug_assert_eq!(data.len() % UNIT, 0);
        self.run(false, first_unit.into(), UNIT, data)
    }

    /// Decrypts the units of `data` (unit `first_unit` of the volume
    /// onwards) that were written through the cipher. A unit that is all
    /// zeros was never written so (a fresh extent, a zeroed or trimmed
    /// range) and stays zeros: the chance that a written unit's ciphertext
    /// is all zeros is 2^-32768.
    pub fn decrypt_written(&self, first_unit: u64, data: &mut [u8]) -> Result<(), CipherError> {
        let units = data.len() / UNIT;
        let zero = |u: usize, data: &[u8]| data[u * UNIT..(u + 1) * UNIT].iter().all(|&x| x == 0);
        let mut u = 0;
        while u < units {
            if zero(u, data) {
                u += 1;
                continue;
            }
            let start = u;
            while u < units && !zero(u, data) {
                u += 1;
            }
            self.decrypt(first_unit + start as u64, &mut data[start * UNIT..u * UNIT])?;
        }
        Ok(())
    }

    /// One data unit of any length (at least 16 bytes) with an explicit
    /// unit number: the IEEE 1619 primitive, for known-answer tests.
    pub fn encrypt_unit(&self, unit: u128, data: &mut [u8]) -> Result<(), CipherError> {
        let len = data.len();
        self.run(true, unit, len, data)
    }

    /// The inverse of [`BlockCipher::encrypt_unit`].
    pub fn decrypt_unit(&self, unit: u128, data: &mut [u8]) -> Result<(), CipherError> {
        let len = data.len();
        self.run(false, unit, len, data)
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
