//! DH-HMAC-CHAP in-band authentication, controller side (NVMe Base
//! Specification 2.0, 8.13): what a queue of a host with a secret goes
//! through after Connect and before any other command.
//!
//! Shape: [`Authenticator`] is a state machine driven by the queue's
//! Authentication Send ([`Authenticator::send`]) and Receive
//! ([`Authenticator::receive`]) commands; it owns the transaction's
//! challenge and Diffie-Hellman key and produces the messages to return.
//! The flow: Negotiate (host) → Challenge (controller) → Reply (host) →
//! Success1 or Failure1 (controller) → Success2 (host, only when it asked
//! the controller to authenticate itself too).
//!
//! Invariants:
//! - The queue is usable only once [`Authenticator::is_done`]; a failed
//!   transaction returns AUTH_Failure1 once and then [`Authenticator::failed`]
//!   (the queue ends the connection).
//! - The host's response is compared in constant time; a failure says only
//!   "authentication failed", whichever check failed.
//! - Responses follow the Linux host's and SPDK's computation, so the
//!   kernel initiator authenticates: a key transformed with HMAC over the
//!   NQN (`DHHC-1:01..03`), the challenge augmented with the hash of the
//!   Diffie-Hellman secret (RFC 7919 groups, padded to the group's size),
//!   and HMAC(key, challenge ‖ seqnum ‖ tid ‖ 0 ‖ "HostHost" ‖ hostnqn ‖ 0 ‖
//!   subnqn) ("Controller" and the NQNs swapped for the controller).

use basalt_nvme_wire::auth::{
    dh_group, failure, hash_id, ControllerMessage, DhchapSecret, HostMessage,
};
use basalt_volume::tenancy::constant_time_eq;
use hmac::{Hmac, Mac};
use openssl::bn::{BigNum, BigNumContext};
use rand::RngCore;
use sha2::{Digest, Sha256, Sha384, Sha512};

/// The secrets of one host on one subsystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhchapKeys {
    /// The host proves it holds this one.
    pub host: DhchapSecret,
    /// The controller proves it holds this one, when the host asks.
    pub controller: Option<DhchapSecret>,
}

/// Hash functions in the order the controller prefers them.
const HASHES: [u8; 3] = [hash_id::SHA512, hash_id::SHA384, hash_id::SHA256];
/// DH groups in the order the controller prefers them: 3072 bits matches
/// SHA-256's strength at a fraction of 8192's cost per connect; the null
/// group only for hosts that offer nothing else.
const GROUPS: [u8; 6] = [
    dh_group::FFDHE3072,
    dh_group::FFDHE4096,
    dh_group::FFDHE2048,
    dh_group::FFDHE6144,
    dh_group::FFDHE8192,
    dh_group::NULL,
];

fn hash_len(hash: u8) -> usize {
    match hash {
        hash_id::SHA256 => 32,
        hash_id::SHA384 => 48,
        _ => 64,
    }
}

fn digest(hash: u8, data: &[u8]) -> Vec<u8> {
    match hash {
        hash_id::SHA256 => Sha256::digest(data).to_vec(),
        hash_id::SHA384 => Sha384::digest(data).to_vec(),
        _ => Sha512::digest(data).to_vec(),
    }
}

fn hmac(hash: u8, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        // HMAC takes keys of any length.
        let mut mac =
            <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC accepts any key length");
        for p in parts {
            mac.update(p);
        }
        mac.finalize().into_bytes().to_vec()
    }
    match hash {
        hash_id::SHA256 => run::<Hmac<Sha256>>(key, parts),
        hash_id::SHA384 => run::<Hmac<Sha384>>(key, parts),
        _ => run::<Hmac<Sha512>>(key, parts),
    }
}

/// The key as used for `nqn`: transformed with HMAC over the NQN unless
/// the secret says not to.
fn transformed(secret: &DhchapSecret, nqn: &str) -> Vec<u8> {
    match secret.transform {
        0 => secret.key.clone(),
        t => hmac(t, &secret.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
    }
}

/// The response to `challenge` (DH-HMAC-CHAP's computation; see the
/// module docs). `role` is "HostHost" or "Controller", `nqn1` the prover's
/// NQN.
#[allow(clippy::too_many_arguments)]
pub(crate) fn response(
    hash: u8,
    secret: &DhchapSecret,
    challenge: &[u8],
    dh_secret: Option<&[u8]>,
    seqnum: u32,
    tid: u16,
    role: &str,
    nqn1: &str,
    nqn2: &str,
) -> Vec<u8> {
    let augmented = match dh_secret {
        Some(z) => hmac(hash, &digest(hash, z), &[challenge]),
        None => challenge.to_vec(),
    };
    hmac(
        hash,
        &transformed(secret, nqn1),
        &[
            &augmented,
            &seqnum.to_le_bytes(),
            &tid.to_le_bytes(),
            &[0],
            role.as_bytes(),
            nqn1.as_bytes(),
            &[0],
            nqn2.as_bytes(),
        ],
    )
}

fn random(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::OsRng.fill_bytes(&mut v);
    v
}

/// A Diffie-Hellman key in one RFC 7919 group.
pub(crate) struct DhKey {
    prime: BigNum,
    private: BigNum,
    /// Our public value, padded to the group's size.
    pub public: Vec<u8>,
}

// The crate's only unsafe code: reading a prime out of libcrypto.
#[allow(unsafe_code)]
mod ffdhe {
    use openssl::bn::BigNum;

    extern "C" {
        // libcrypto's RFC 7919 groups (openssl-sys does not bind it).
        fn DH_new_by_nid(nid: libc::c_int) -> *mut openssl_sys::DH;
    }

    /// The prime of group `id`, from OpenSSL's built-in RFC 7919 groups.
    pub(super) fn prime(id: u8) -> Option<BigNum> {
        let nid = match id {
            1 => 1126,
            2 => 1127,
            3 => 1128,
            4 => 1129,
            5 => 1130,
            _ => return None,
        };
        // SAFETY: DH_new_by_nid returns a new DH object (or null) we own;
        // DH_get0_pqg writes borrowed pointers into it (q and g are not
        // needed); BN_bn2bin writes BN_num_bytes(p) bytes, which the
        // buffer holds; the object is freed once p is copied out.
        unsafe {
            let dh = DH_new_by_nid(nid);
            if dh.is_null() {
                return None;
            }
            let mut p: *const openssl_sys::BIGNUM = std::ptr::null();
            openssl_sys::DH_get0_pqg(dh, &mut p, std::ptr::null_mut(), std::ptr::null_mut());
            let out = if p.is_null() {
                None
            } else {
                let len = (openssl_sys::BN_num_bits(p) as usize).div_ceil(8);
                let mut bytes = vec![0u8; len];
                openssl_sys::BN_bn2bin(p, bytes.as_mut_ptr());
                BigNum::from_slice(&bytes).ok()
            };
            openssl_sys::DH_free(dh);
            out
        }
    }
}

impl DhKey {
    /// A fresh key in group `id` (not the null group).
    pub(crate) fn generate(id: u8) -> Option<DhKey> {
        let prime = ffdhe::prime(id)?;
        let len = prime.num_bytes();
        // Twice the group's security strength in private bits, as RFC
        // 7919 advises (at least 256).
        let bits = match id {
            dh_group::FFDHE2048 | dh_group::FFDHE3072 => 256,
            dh_group::FFDHE4096 => 304,
            dh_group::FFDHE6144 => 352,
            _ => 400,
        };
        let mut private = BigNum::new().ok()?;
        private
            .rand(bits, openssl::bn::MsbOption::MAYBE_ZERO, false)
            .ok()?;
        let mut ctx = BigNumContext::new().ok()?;
        let two = BigNum::from_u32(2).ok()?;
        let mut public = BigNum::new().ok()?;
        public.mod_exp(&two, &private, &prime, &mut ctx).ok()?;
        let public = public.to_vec_padded(len).ok()?;
        Some(DhKey {
            prime,
            private,
            public,
        })
    }

    /// The shared secret with the peer's public value, padded to the
    /// group's size; `None` if the value is out of range (1 < y < p - 1).
    pub(crate) fn shared(&self, peer: &[u8]) -> Option<Vec<u8>> {
        let len = self.prime.num_bytes();
        if peer.len() != len as usize {
            return None;
        }
        let y = BigNum::from_slice(peer).ok()?;
        let one = BigNum::from_u32(1).ok()?;
        let mut p_minus_1 = BigNum::new().ok()?;
        p_minus_1.checked_sub(&self.prime, &one).ok()?;
        if y <= one || y >= p_minus_1 {
            return None;
        }
        let mut ctx = BigNumContext::new().ok()?;
        let mut z = BigNum::new().ok()?;
        z.mod_exp(&y, &self.private, &self.prime, &mut ctx).ok()?;
        z.to_vec_padded(len).ok()
    }
}

/// Where a transaction stands.
enum State {
    /// Waiting for the host's AUTH_Negotiate.
    AwaitNegotiate,
    /// Negotiated; the next Receive returns the challenge.
    Negotiated {
        tid: u16,
        hash: u8,
        group: u8,
    },
    /// Challenge sent; waiting for the host's reply.
    AwaitReply {
        tid: u16,
        hash: u8,
        seqnum: u32,
        challenge: Vec<u8>,
        dh: Option<DhKey>,
    },
    /// The host proved itself; the next Receive returns AUTH_Success1
    /// (with our own response when the host asked for one).
    Replied {
        tid: u16,
        hash: u8,
        response: Option<Vec<u8>>,
    },
    /// Waiting for the host's AUTH_Success2 (bidirectional only).
    AwaitSuccess2 {
        tid: u16,
    },
    /// Failed; the next Receive returns AUTH_Failure1.
    Failing {
        tid: u16,
        explanation: u8,
    },
    Done,
    Failed,
}

/// One queue's DH-HMAC-CHAP transaction; see the module docs.
pub(crate) struct Authenticator {
    keys: DhchapKeys,
    host_nqn: String,
    sub_nqn: String,
    /// Sequence numbers of this controller's challenges.
    seqnum: u32,
    state: State,
}

impl Authenticator {
    pub(crate) fn new(keys: DhchapKeys, host_nqn: &str, sub_nqn: &str) -> Authenticator {
        let mut seq = [0u8; 4];
        rand::rngs::OsRng.fill_bytes(&mut seq);
        Authenticator {
            keys,
            host_nqn: host_nqn.to_string(),
            sub_nqn: sub_nqn.to_string(),
            seqnum: u32::from_le_bytes(seq) | 1,
            state: State::AwaitNegotiate,
        }
    }

    /// The host authenticated (and the controller too, when asked).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The transaction failed and its AUTH_Failure1 (if any) was returned.
    pub(crate) fn failed(&self) -> bool {
        matches!(self.state, State::Failed)
    }

    fn tid(&self) -> u16 {
        match &self.state {
            State::Negotiated { tid, .. }
            | State::AwaitReply { tid, .. }
            | State::Replied { tid, .. }
            | State::AwaitSuccess2 { tid }
            | State::Failing { tid, .. } => *tid,
            _ => 0,
        }
    }

    fn fail(&mut self, explanation: u8) {
        let tid = self.tid();
        self.state = State::Failing { tid, explanation };
    }

    /// An Authentication Send's data. The command itself succeeds; a
    /// failure is reported by the next Receive (AUTH_Failure1).
    pub(crate) fn send(&mut self, data: &[u8]) {
        let message = match HostMessage::parse(data) {
            Ok(m) => m,
            Err(_) => return self.fail(failure::INCORRECT_PAYLOAD),
        };
        let state = std::mem::replace(&mut self.state, State::Failed);
        match (state, message) {
            (
                State::AwaitNegotiate,
                HostMessage::Negotiate {
                    tid,
                    sc_c,
                    protocols,
                },
            ) => {
                self.state = State::Failing {
                    tid,
                    explanation: failure::FAILED,
                };
                if sc_c != 0 {
                    return self.fail(failure::SCC_MISMATCH);
                }
                let Some(p) = protocols.iter().find(|p| p.auth_id == 1) else {
                    return self.fail(failure::PROTOCOL_UNUSABLE);
                };
                let Some(hash) = HASHES.into_iter().find(|h| p.hash_ids.contains(h)) else {
                    return self.fail(failure::HASH_UNUSABLE);
                };
                let Some(group) = GROUPS.into_iter().find(|g| p.dh_groups.contains(g)) else {
                    return self.fail(failure::DHGROUP_UNUSABLE);
                };
                self.state = State::Negotiated { tid, hash, group };
            }
            (
                State::AwaitReply {
                    tid,
                    hash,
                    seqnum,
                    challenge,
                    dh,
                },
                HostMessage::Reply {
                    tid: reply_tid,
                    response: host_response,
                    challenge: host_challenge,
                    seqnum: host_seqnum,
                    dh_value,
                },
            ) => {
                self.state = State::Failing {
                    tid,
                    explanation: failure::FAILED,
                };
                let hl = hash_len(hash);
                if reply_tid != tid || host_response.len() != hl {
                    return self.fail(failure::INCORRECT_PAYLOAD);
                }
                let dh_secret = match &dh {
                    Some(key) => match key.shared(&dh_value) {
                        Some(z) => Some(z),
                        None => return self.fail(failure::INCORRECT_PAYLOAD),
                    },
                    None if dh_value.is_empty() => None,
                    None => return self.fail(failure::INCORRECT_PAYLOAD),
                };
                let expected = response(
                    hash,
                    &self.keys.host,
                    &challenge,
                    dh_secret.as_deref(),
                    seqnum,
                    tid,
                    "HostHost",
                    &self.host_nqn,
                    &self.sub_nqn,
                );
                if !constant_time_eq(&expected, &host_response) {
                    return self.fail(failure::FAILED);
                }
                let ours = match (host_challenge, &self.keys.controller) {
                    (None, _) => None,
                    // Asked to prove ourselves without a controller secret.
                    (Some(_), None) => return self.fail(failure::FAILED),
                    (Some(c), Some(_)) if host_seqnum == 0 || c.len() != hl => {
                        return self.fail(failure::INCORRECT_PAYLOAD)
                    }
                    (Some(c), Some(secret)) => Some(response(
                        hash,
                        secret,
                        &c,
                        dh_secret.as_deref(),
                        host_seqnum,
                        tid,
                        "Controller",
                        &self.sub_nqn,
                        &self.host_nqn,
                    )),
                };
                self.state = State::Replied {
                    tid,
                    hash,
                    response: ours,
                };
            }
            (State::AwaitSuccess2 { tid }, HostMessage::Success2 { tid: t }) if t == tid => {
                self.state = State::Done;
            }
            (State::AwaitSuccess2 { .. }, HostMessage::Failure2 { .. }) => {
                self.state = State::Failed;
            }
            (state, _) => {
                self.state = state;
                self.fail(failure::INCORRECT_PROTOCOL_MESSAGE);
            }
        }
    }

    /// An Authentication Receive: the message to return.
    pub(crate) fn receive(&mut self) -> Vec<u8> {
        let state = std::mem::replace(&mut self.state, State::Failed);
        let message = match state {
            State::Negotiated { tid, hash, group } => {
                let dh = match group {
                    dh_group::NULL => None,
                    g => match DhKey::generate(g) {
                        Some(key) => Some(key),
                        None => {
                            self.state = State::Failed;
                            return failure1(tid, failure::FAILED);
                        }
                    },
                };
                self.seqnum = self.seqnum.wrapping_add(1).max(1);
                let challenge = random(hash_len(hash));
                let message = ControllerMessage::Challenge {
                    tid,
                    hash_id: hash,
                    dh_group: group,
                    seqnum: self.seqnum,
                    challenge: challenge.clone(),
                    dh_value: dh.as_ref().map(|k| k.public.clone()).unwrap_or_default(),
                };
                self.state = State::AwaitReply {
                    tid,
                    hash,
                    seqnum: self.seqnum,
                    challenge,
                    dh,
                };
                message
            }
            State::Replied {
                tid,
                hash,
                response,
            } => {
                self.state = match response {
                    Some(_) => State::AwaitSuccess2 { tid },
                    None => State::Done,
                };
                ControllerMessage::Success1 {
                    tid,
                    hash_len: hash_len(hash) as u8,
                    response,
                }
            }
            State::Failing { tid, explanation } => {
                return failure1(tid, explanation);
            }
            other => {
                let tid = match &other {
                    State::AwaitReply { tid, .. } | State::AwaitSuccess2 { tid } => *tid,
                    _ => 0,
                };
                return failure1(tid, failure::INCORRECT_PROTOCOL_MESSAGE);
            }
        };
        let mut out = Vec::new();
        message.encode(&mut out);
        out
    }
}

fn failure1(tid: u16, explanation: u8) -> Vec<u8> {
    let mut out = Vec::new();
    ControllerMessage::Failure1 { tid, explanation }.encode(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_nvme_wire::auth::ProtocolDescriptor;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host";
    const SUB: &str = "nqn.2026-11.io.basalt:volume:v";

    fn secret(byte: u8) -> DhchapSecret {
        DhchapSecret {
            transform: hash_id::SHA256,
            key: vec![byte; 32],
        }
    }

    fn negotiate(groups: Vec<u8>) -> Vec<u8> {
        let mut b = Vec::new();
        HostMessage::Negotiate {
            tid: 5,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor {
                auth_id: 1,
                hash_ids: vec![hash_id::SHA256, hash_id::SHA384],
                dh_groups: groups,
            }],
        }
        .encode(&mut b);
        b
    }

    /// Runs a host through a transaction (the host side computed here
    /// independently of the controller's state); the controller's last
    /// message.
    fn run_host(
        a: &mut Authenticator,
        host_secret: &DhchapSecret,
        groups: Vec<u8>,
        bidirectional: Option<&DhchapSecret>,
    ) -> ControllerMessage {
        a.send(&negotiate(groups));
        let ControllerMessage::Challenge {
            tid,
            hash_id,
            dh_group,
            seqnum,
            challenge,
            dh_value,
        } = ControllerMessage::parse(&a.receive()).unwrap()
        else {
            panic!("no challenge");
        };
        let (host_dh, z) = if dh_group == 0 {
            (Vec::new(), None)
        } else {
            let ours = DhKey::generate(dh_group).unwrap();
            let z = ours.shared(&dh_value).unwrap();
            (ours.public.clone(), Some(z))
        };
        let r = response(
            hash_id,
            host_secret,
            &challenge,
            z.as_deref(),
            seqnum,
            tid,
            "HostHost",
            HOST,
            SUB,
        );
        let c2 = bidirectional.map(|_| random(hash_len(hash_id)));
        let mut b = Vec::new();
        HostMessage::Reply {
            tid,
            response: r,
            challenge: c2.clone(),
            seqnum: 99,
            dh_value: host_dh,
        }
        .encode(&mut b);
        a.send(&b);
        let last = ControllerMessage::parse(&a.receive()).unwrap();
        if let (Some(ctrl_secret), Some(c2)) = (bidirectional, c2) {
            if let ControllerMessage::Success1 {
                response: Some(r2), ..
            } = &last
            {
                let want = response(
                    hash_id,
                    ctrl_secret,
                    &c2,
                    z.as_deref(),
                    99,
                    tid,
                    "Controller",
                    SUB,
                    HOST,
                );
                assert_eq!(r2, &want, "controller's response");
                let mut b = Vec::new();
                HostMessage::Success2 { tid }.encode(&mut b);
                a.send(&b);
            }
        }
        last
    }

    #[test]
    fn the_right_secret_authenticates_with_and_without_diffie_hellman() {
        for groups in [vec![0], vec![0, 1], vec![0, 1, 2, 3, 4, 5]] {
            let keys = DhchapKeys {
                host: secret(1),
                controller: None,
            };
            let mut a = Authenticator::new(keys, HOST, SUB);
            let last = run_host(&mut a, &secret(1), groups.clone(), None);
            assert!(
                matches!(last, ControllerMessage::Success1 { response: None, .. }),
                "{groups:?}: {last:?}"
            );
            assert!(a.is_done());
        }
    }

    #[test]
    fn a_wrong_secret_gets_failure1_and_nothing_else() {
        let keys = DhchapKeys {
            host: secret(1),
            controller: None,
        };
        let mut a = Authenticator::new(keys, HOST, SUB);
        let last = run_host(&mut a, &secret(2), vec![0, 1], None);
        assert_eq!(
            last,
            ControllerMessage::Failure1 {
                tid: 5,
                explanation: failure::FAILED
            }
        );
        assert!(a.failed() && !a.is_done());
    }

    #[test]
    fn bidirectional_authentication_proves_the_controller_too() {
        let keys = DhchapKeys {
            host: secret(1),
            controller: Some(secret(3)),
        };
        let mut a = Authenticator::new(keys, HOST, SUB);
        run_host(&mut a, &secret(1), vec![1], Some(&secret(3)));
        assert!(a.is_done());
        // Asked to prove itself without a controller secret: refused.
        let keys = DhchapKeys {
            host: secret(1),
            controller: None,
        };
        let mut a = Authenticator::new(keys, HOST, SUB);
        let last = run_host(&mut a, &secret(1), vec![0], Some(&secret(3)));
        assert!(
            matches!(last, ControllerMessage::Failure1 { .. }),
            "{last:?}"
        );
    }

    #[test]
    fn out_of_order_and_garbage_messages_fail() {
        let keys = DhchapKeys {
            host: secret(1),
            controller: None,
        };
        let mut a = Authenticator::new(keys.clone(), HOST, SUB);
        a.send(&[1, 2, 3]);
        assert!(matches!(
            ControllerMessage::parse(&a.receive()),
            Ok(ControllerMessage::Failure1 { .. })
        ));
        assert!(a.failed());
        // A Receive before any Negotiate.
        let mut a = Authenticator::new(keys.clone(), HOST, SUB);
        assert!(matches!(
            ControllerMessage::parse(&a.receive()),
            Ok(ControllerMessage::Failure1 { .. })
        ));
        // Hashes the controller does not know.
        let mut a = Authenticator::new(keys, HOST, SUB);
        let mut b = Vec::new();
        HostMessage::Negotiate {
            tid: 1,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor {
                auth_id: 1,
                hash_ids: vec![9],
                dh_groups: vec![0],
            }],
        }
        .encode(&mut b);
        a.send(&b);
        assert_eq!(
            ControllerMessage::parse(&a.receive()),
            Ok(ControllerMessage::Failure1 {
                tid: 1,
                explanation: failure::HASH_UNUSABLE
            })
        );
    }

    #[test]
    fn diffie_hellman_agrees_and_refuses_degenerate_values() {
        let a = DhKey::generate(dh_group::FFDHE2048).unwrap();
        let b = DhKey::generate(dh_group::FFDHE2048).unwrap();
        assert_eq!(a.public.len(), 256);
        assert_eq!(a.shared(&b.public), b.shared(&a.public));
        let mut one = vec![0u8; 256];
        one[255] = 1;
        assert_eq!(a.shared(&one), None);
        assert_eq!(a.shared(&[0u8; 256]), None);
        assert_eq!(a.shared(&[0xff; 256]), None);
        assert_eq!(a.shared(&[1; 10]), None);
    }
}
