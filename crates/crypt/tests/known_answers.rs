//! Known answers: IEEE 1619-2007 XTS-AES-256 vector 10 (RFC 3394's is a
//! unit test of `master.rs`), then the properties the
//! store relies on: the tweak is the unit's address, keys differ per
//! volume, and a wrong master key never unwraps.

use basalt_crypt::{DataKey, MasterKey, MasterKeyError, UNIT};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

const VECTOR_10_KEY: &str = "2718281828459045235360287471352662497757247093699959574966967627
    3141592653589793238462643383279502884197169399375105820974944592";
const VECTOR_10_CT: &str = "
    1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b
    5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd
    5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0
    c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca
    2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0
    b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f
    93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec
    583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a
    84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1
    505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae
    9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29
    a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac
    6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f
    645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed4385
    1ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa
    773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151";

#[test]
fn ieee_1619_vector_10_encrypts_and_decrypts() {
    let key = DataKey::from_bytes(&hex(VECTOR_10_KEY)).unwrap();
    let cipher = key.cipher();
    let plain: Vec<u8> = (0..512).map(|i| i as u8).collect();
    let mut data = plain.clone();
    cipher.encrypt_unit(0xff, &mut data).unwrap();
    assert_eq!(data, hex(VECTOR_10_CT));
    cipher.decrypt_unit(0xff, &mut data).unwrap();
    assert_eq!(data, plain);
}

#[test]
fn the_tweak_is_the_unit_address_and_each_volume_has_its_own_key() {
    let (a, b) = (DataKey::generate().cipher(), DataKey::generate().cipher());
    let plain = vec![0x5au8; 2 * UNIT];
    let mut one = plain.clone();
    a.encrypt(7, &mut one).unwrap();
    // Two units with equal plaintext: different ciphertext.
    assert_ne!(one[..UNIT], one[UNIT..]);
    // The second unit of a run starting at 7 is unit 8 on its own.
    let mut eight = plain[..UNIT].to_vec();
    a.encrypt(8, &mut eight).unwrap();
    assert_eq!(eight, one[UNIT..]);
    // Another volume's key: different ciphertext at the same address.
    let mut other = plain.clone();
    b.encrypt(7, &mut other).unwrap();
    assert_ne!(other, one);
    a.decrypt(7, &mut one).unwrap();
    assert_eq!(one, plain);
}

#[test]
fn a_data_key_unwraps_only_with_its_master_key() {
    let master = MasterKey::generate();
    let data = DataKey::generate();
    let wrapped = master.wrap(&data);
    assert_eq!(wrapped.blob.len(), 72);
    let back = wrapped.unwrap_with(&master).unwrap();
    let mut x = vec![1u8; UNIT];
    let mut y = x.clone();
    data.cipher().encrypt(3, &mut x).unwrap();
    back.cipher().encrypt(3, &mut y).unwrap();
    assert_eq!(x, y);

    let other = MasterKey::generate();
    assert!(matches!(
        wrapped.unwrap_with(&other),
        Err(MasterKeyError::WrongMasterKey { .. })
    ));
    // Same id claimed, wrong key: the wrap's integrity check refuses it.
    let mut forged = wrapped.clone();
    forged.master_key_id = other.id();
    assert!(matches!(
        forged.unwrap_with(&other),
        Err(MasterKeyError::Damaged)
    ));
    let mut damaged = wrapped;
    damaged.blob[10] ^= 1;
    assert!(matches!(
        damaged.unwrap_with(&master),
        Err(MasterKeyError::Damaged)
    ));
}

#[test]
fn key_files_are_created_private_and_refused_when_others_can_read_them() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let created = MasterKey::load_or_create_file(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = MasterKey::load_or_create_file(&path).unwrap();
    assert_eq!(created.id(), again.id());

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = MasterKey::load_or_create_file(&path).unwrap_err();
    assert!(err.to_string().contains("chmod 600"), "{err}");

    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "not a key\n").unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = MasterKey::load_or_create_file(&bad).unwrap_err();
    assert!(err.to_string().contains("64 hexadecimal digits"), "{err}");
}

#[test]
fn a_command_prints_the_key() {
    let key = "00".repeat(31) + "01";
    let m = MasterKey::from_command(&format!("echo {key}")).unwrap();
    assert_eq!(m.id(), MasterKey::parse(&key, "x").unwrap().id());
    let err = MasterKey::from_command("echo nope >&2; exit 3").unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}
