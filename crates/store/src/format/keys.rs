//! Key slots (key-slots feature): one 128 B entry per volume slot holding
//! that volume's data key wrapped by a master key, never the plaintext
//! key. Entry `i` belongs to volume slot `i + 1`.
//!
//! | offset | type | field |
//! |---|---|---|
//! | 0 | u8 | entry kind: 0 empty, 1 a key, 2 plain (the layer has no key of its own and is not encrypted) |
//! | 1 | u8 | key suite: how the blob wraps the key (see `WrappedKey::suite`) |
//! | 2 | u8 | blob length (≤ `MAX_WRAPPED_KEY`) |
//! | 3 | u8 | reserved (0) |
//! | 4 | u32 | master key id: which master key wrapped it |
//! | 8 | [u8; 16] | the volume's UUID: an entry of a volume deleted from the slot never passes for another's |
//! | 24 | [u8; 100] | the wrapped key, zero padded |
//! | 124 | u32 | CRC32C of (entry index as u32, bytes 0..124) |
//!
//! A plain entry (kind 2) has every byte but the UUID and the CRC zero. It
//! pins a snapshot of a volume that was re-encrypted (`Store::rekey_volume`)
//! as unencrypted: without it, a snapshot reads with its volume's key.
//! Builds before it read such an entry as damaged.
//!
//! Why 128 B in place, no second copy: an entry never crosses a 512 B
//! sector, and a power cut tears a write at sector boundaries, so an entry
//! rewritten in place (a master key rotation) is either old or new, and
//! both verify (the assumption the extent and volume tables make).

use super::{get_u32, get_uuid, put_u32};

/// Bytes of one key slot entry.
pub const KEY_SLOT_SIZE: usize = 128;
/// The longest wrapped key an entry holds: room for a 64-byte key wrapped
/// by AES-256-GCM (12 B nonce, 16 B tag) or AES-KW (8 B more), with spare.
pub const MAX_WRAPPED_KEY: usize = 100;

/// A volume's data key as the store keeps it: wrapped, with what unwraps
/// it (the suite is defined by the encryption layer and is never 0).
pub type WrappedKey = basalt_crypt::WrappedDataKey;

fn entry_crc(index: u32, b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), &b[..124])
}

/// Encodes entry `index` into `out` (128 bytes). Panics only on a blob
/// longer than `MAX_WRAPPED_KEY` or a suite of 0, which callers check.
pub fn encode_key_slot(index: u32, entry: &KeySlot, out: &mut [u8]) {
    let out = &mut out[..KEY_SLOT_SIZE];
    out.fill(0);
    match entry {
        KeySlot::Empty => {}
        KeySlot::Key { volume, key } => {
            assert!(key.blob.len() <= MAX_WRAPPED_KEY && key.suite != 0);
            out[0] = 1;
            out[1] = key.suite;
            out[2] = key.blob.len() as u8;
            put_u32(out, 4, key.master_key_id);
            out[8..24].copy_from_slice(volume.as_bytes());
            out[24..24 + key.blob.len()].copy_from_slice(&key.blob);
        }
        KeySlot::Plain { volume } => {
            out[0] = 2;
            out[8..24].copy_from_slice(volume.as_bytes());
        }
    }
    let crc = entry_crc(index, out);
    put_u32(out, 124, crc);
}

/// What an entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySlot {
    Empty,
    Key {
        volume: uuid::Uuid,
        key: WrappedKey,
    },
    /// The layer is not encrypted, whatever its volume's entry says.
    Plain {
        volume: uuid::Uuid,
    },
}

impl KeySlot {
    /// The layer an entry names, if any.
    pub fn volume(&self) -> Option<uuid::Uuid> {
        match self {
            KeySlot::Empty => None,
            KeySlot::Key { volume, .. } | KeySlot::Plain { volume } => Some(*volume),
        }
    }
}

/// Decodes entry `index`; `None` if it fails to verify (or is not an entry
/// this build writes). Never panics, whatever the bytes.
pub fn decode_key_slot(index: u32, b: &[u8]) -> Option<KeySlot> {
    let b = b.get(..KEY_SLOT_SIZE)?;
    if get_u32(b, 124) != entry_crc(index, b) {
        return None;
    }
    match b[0] {
        0 => b
            .iter()
            .take(124)
            .all(|x| *x == 0)
            .then_some(KeySlot::Empty),
        1 => {
            let len = b[2] as usize;
            if len > MAX_WRAPPED_KEY || b[1] == 0 || b[3] != 0 {
                return None;
            }
            if b[24 + len..124].iter().any(|x| *x != 0) {
                return None;
            }
            Some(KeySlot::Key {
                volume: get_uuid(b, 8),
                key: WrappedKey {
                    suite: b[1],
                    master_key_id: get_u32(b, 4),
                    blob: b[24..24 + len].to_vec(),
                },
            })
        }
        2 => (b[1..8].iter().all(|x| *x == 0) && b[24..124].iter().all(|x| *x == 0)).then(|| {
            KeySlot::Plain {
                volume: get_uuid(b, 8),
            }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_roundtrip_and_verify_their_place() {
        let key = WrappedKey {
            suite: 1,
            master_key_id: 7,
            blob: (0..72).collect(),
        };
        let vol = uuid::Uuid::from_u128(99);
        let mut b = [0u8; KEY_SLOT_SIZE];
        let entry = KeySlot::Key {
            volume: vol,
            key: key.clone(),
        };
        encode_key_slot(3, &entry, &mut b);
        assert_eq!(decode_key_slot(3, &b), Some(entry));
        // Salted with its index: an entry copied to another place fails.
        assert_eq!(decode_key_slot(4, &b), None);
        let mut flipped = b;
        flipped[40] ^= 1;
        assert_eq!(decode_key_slot(3, &flipped), None);
        let plain = KeySlot::Plain { volume: vol };
        encode_key_slot(3, &plain, &mut b);
        assert_eq!(decode_key_slot(3, &b), Some(plain));
        let mut flipped = b;
        flipped[30] = 1;
        assert_eq!(decode_key_slot(3, &flipped), None);
        encode_key_slot(3, &KeySlot::Empty, &mut b);
        assert_eq!(decode_key_slot(3, &b), Some(KeySlot::Empty));
        // A never-written region (all zeros) does not verify: the CRC of
        // zeros is not zero.
        assert_eq!(decode_key_slot(0, &[0u8; KEY_SLOT_SIZE]), None);
        assert_eq!(decode_key_slot(0, &[0u8; 10]), None);
    }
}
