//! CHAP with MD5 (RFC 1994, as iSCSI uses it in RFC 7143 §12.1.3): the
//! response computation, its constant-time check, the credentials a target
//! holds per initiator, and the target's side of one CHAP exchange
//! ([`TargetChap`]): pick the algorithm, issue the challenge, verify the
//! initiator's answer and, for mutual CHAP, answer the initiator's challenge.
//!
//! Invariants:
//! - Only CHAP_A=5 (MD5) is spoken; an offer without 5 fails the exchange.
//! - Randomness (identifier, challenge) comes from the caller; nothing here
//!   is random, so every exchange is reproducible in tests.
//! - Responses are compared in constant time with respect to their content.
//! - Secrets are at least [`MIN_SECRET_LEN`] bytes (RFC 7143 §9.2.1 wants 96
//!   random bits when IPsec is not used), and a mutual (target) secret never
//!   equals the initiator's (§9.2.1: a secret authenticates one direction).
//! - A mutual challenge equal to the target's own challenge is refused
//!   (reflection attack, §12.1.3).

use crate::text::value;
use md5::{Digest, Md5};

/// The CHAP algorithm number of MD5 (RFC 1994).
pub const CHAP_MD5: u8 = 5;
/// Length of an MD5 CHAP response.
pub const RESPONSE_LEN: usize = 16;
/// Shortest secret accepted: 96 bits (RFC 7143 §9.2.1).
pub const MIN_SECRET_LEN: usize = 12;
/// Longest secret accepted (a CHAP secret is a key value, §6.1 limit).
pub const MAX_SECRET_LEN: usize = 255;
/// Longest challenge accepted from an initiator (RFC 7143 §12.1.3).
pub const MAX_CHALLENGE_LEN: usize = 1024;

/// Why CHAP credentials are unusable or an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChapError {
    #[error("CHAP secret is {len} bytes; at least {MIN_SECRET_LEN} bytes (96 bits) are required")]
    SecretTooShort { len: usize },
    #[error("CHAP secret is {len} bytes; at most {MAX_SECRET_LEN} bytes are allowed")]
    SecretTooLong { len: usize },
    #[error("CHAP user name is empty")]
    EmptyUser,
    #[error("the mutual (target) CHAP secret must differ from the initiator's secret")]
    SameSecretBothWays,
    #[error("the initiator offered no supported CHAP algorithm (only 5, MD5, is supported)")]
    NoAcceptableAlgorithm,
    #[error("CHAP_N and CHAP_R must be sent together")]
    MissingResponse,
    #[error("CHAP_N does not name the expected user")]
    WrongUser,
    #[error("CHAP_R is not a 16-byte binary value")]
    MalformedResponse,
    #[error("CHAP_R does not match")]
    WrongResponse,
    #[error("CHAP_I and CHAP_C must be sent together")]
    IncompleteChallenge,
    #[error("the initiator's CHAP_I or CHAP_C is malformed")]
    MalformedChallenge,
    #[error("the initiator's challenge repeats the target's (reflection)")]
    ReflectedChallenge,
    #[error("the initiator asked for mutual CHAP but no target secret is configured")]
    MutualNotConfigured,
}

/// MD5(identifier || secret || challenge), the CHAP response (RFC 1994 §4.1).
pub fn chap_response(identifier: u8, secret: &[u8], challenge: &[u8]) -> [u8; RESPONSE_LEN] {
    let mut md5 = Md5::new();
    md5.update([identifier]);
    md5.update(secret);
    md5.update(challenge);
    md5.finalize().into()
}

/// Equality whose running time depends on the lengths only, not on where
/// the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks a CHAP response in constant time.
pub fn verify_response(identifier: u8, secret: &[u8], challenge: &[u8], response: &[u8]) -> bool {
    constant_time_eq(&chap_response(identifier, secret, challenge), response)
}

/// The algorithm to use from an initiator's CHAP_A list: 5 if offered.
pub fn select_algorithm(offer: &str) -> Option<u8> {
    value::list(offer)
        .filter_map(|a| value::parse_number(a).ok())
        .find(|&a| a == u64::from(CHAP_MD5))
        .map(|_| CHAP_MD5)
}

/// A secret checked against the length rules. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapSecret(Vec<u8>);

impl ChapSecret {
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<ChapSecret, ChapError> {
        let secret = secret.into();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ChapError::SecretTooShort { len: secret.len() });
        }
        if secret.len() > MAX_SECRET_LEN {
            return Err(ChapError::SecretTooLong { len: secret.len() });
        }
        Ok(ChapSecret(secret))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChapSecret({} bytes)", self.0.len())
    }
}

/// What a target holds to authenticate one initiator, and optionally to
/// authenticate itself to it (mutual CHAP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    /// The CHAP_N the initiator must send.
    pub initiator_user: String,
    pub initiator_secret: ChapSecret,
    /// The target's CHAP_N and secret, used when the initiator challenges.
    pub mutual: Option<(String, ChapSecret)>,
}

impl ChapCredentials {
    /// Checks the configuration rules (lengths, non-empty users, distinct
    /// secrets per direction).
    pub fn new(
        initiator_user: impl Into<String>,
        initiator_secret: impl Into<Vec<u8>>,
        mutual: Option<(String, Vec<u8>)>,
    ) -> Result<ChapCredentials, ChapError> {
        let initiator_user = initiator_user.into();
        if initiator_user.is_empty() {
            return Err(ChapError::EmptyUser);
        }
        let initiator_secret = ChapSecret::new(initiator_secret)?;
        let mutual = match mutual {
            None => None,
            Some((user, secret)) => {
                if user.is_empty() {
                    return Err(ChapError::EmptyUser);
                }
                let secret = ChapSecret::new(secret)?;
                if secret == initiator_secret {
                    return Err(ChapError::SameSecretBothWays);
                }
                Some((user, secret))
            }
        };
        Ok(ChapCredentials {
            initiator_user,
            initiator_secret,
            mutual,
        })
    }
}

/// The keys a target answers a CHAP_A offer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapChallenge {
    pub algorithm: u8,
    pub identifier: u8,
    pub challenge: Vec<u8>,
}

impl ChapChallenge {
    /// `CHAP_A=5`, `CHAP_I=<id>`, `CHAP_C=0x<challenge>`.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        vec![
            ("CHAP_A".into(), self.algorithm.to_string()),
            ("CHAP_I".into(), self.identifier.to_string()),
            ("CHAP_C".into(), value::hex(&self.challenge)),
        ]
    }
}

/// The initiator's answer as received (raw key values, absent if not sent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChapAnswer<'a> {
    pub name: Option<&'a str>,
    pub response: Option<&'a str>,
    /// Mutual CHAP: the initiator's identifier and challenge for the target.
    pub identifier: Option<&'a str>,
    pub challenge: Option<&'a str>,
}

/// The target's answer to a mutual challenge: `CHAP_N` and `CHAP_R`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MutualResponse {
    pub name: String,
    pub response: [u8; RESPONSE_LEN],
}

impl MutualResponse {
    /// `CHAP_N=<target user>`, `CHAP_R=0x<response>`.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        vec![
            ("CHAP_N".into(), self.name.clone()),
            ("CHAP_R".into(), value::hex(&self.response)),
        ]
    }
}

/// The target's side of one CHAP exchange, with the identifier and
/// challenge the caller drew at random.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetChap {
    identifier: u8,
    challenge: Vec<u8>,
}

impl TargetChap {
    /// `challenge` should be at least 16 random bytes, fresh per exchange.
    pub fn new(identifier: u8, challenge: &[u8]) -> TargetChap {
        TargetChap {
            identifier,
            challenge: challenge.to_vec(),
        }
    }

    /// Answers the initiator's CHAP_A list with the challenge keys.
    pub fn offer(&self, chap_a: &str) -> Result<ChapChallenge, ChapError> {
        let algorithm = select_algorithm(chap_a).ok_or(ChapError::NoAcceptableAlgorithm)?;
        Ok(ChapChallenge {
            algorithm,
            identifier: self.identifier,
            challenge: self.challenge.clone(),
        })
    }

    /// Verifies CHAP_N/CHAP_R and, when the initiator challenged the target
    /// too, computes the target's CHAP_N/CHAP_R.
    pub fn verify(
        &self,
        answer: &ChapAnswer<'_>,
        credentials: &ChapCredentials,
    ) -> Result<Option<MutualResponse>, ChapError> {
        let (Some(name), Some(response)) = (answer.name, answer.response) else {
            return Err(ChapError::MissingResponse);
        };
        // Decode the mutual challenge first: a malformed or reflected one
        // fails the login whatever the response.
        let mutual_challenge = match (answer.identifier, answer.challenge) {
            (None, None) => None,
            (Some(i), Some(c)) => Some(self.mutual_challenge(i, c)?),
            _ => return Err(ChapError::IncompleteChallenge),
        };
        let response = value::decode_binary(response).map_err(|_| ChapError::MalformedResponse)?;
        if response.len() != RESPONSE_LEN {
            return Err(ChapError::MalformedResponse);
        }
        // Check the response even when the name is wrong, so both failures
        // take the same time.
        let response_ok = verify_response(
            self.identifier,
            credentials.initiator_secret.as_bytes(),
            &self.challenge,
            &response,
        );
        let name_ok = constant_time_eq(name.as_bytes(), credentials.initiator_user.as_bytes());
        if !name_ok {
            return Err(ChapError::WrongUser);
        }
        if !response_ok {
            return Err(ChapError::WrongResponse);
        }
        let Some((identifier, challenge)) = mutual_challenge else {
            return Ok(None);
        };
        let (user, secret) = credentials
            .mutual
            .as_ref()
            .ok_or(ChapError::MutualNotConfigured)?;
        Ok(Some(MutualResponse {
            name: user.clone(),
            response: chap_response(identifier, secret.as_bytes(), &challenge),
        }))
    }

    fn mutual_challenge(
        &self,
        identifier: &str,
        challenge: &str,
    ) -> Result<(u8, Vec<u8>), ChapError> {
        let identifier = value::parse_number(identifier)
            .ok()
            .and_then(|i| u8::try_from(i).ok())
            .ok_or(ChapError::MalformedChallenge)?;
        let challenge =
            value::decode_binary(challenge).map_err(|_| ChapError::MalformedChallenge)?;
        if challenge.is_empty() || challenge.len() > MAX_CHALLENGE_LEN {
            return Err(ChapError::MalformedChallenge);
        }
        if challenge == self.challenge {
            return Err(ChapError::ReflectedChallenge);
        }
        Ok((identifier, challenge))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        value::decode_binary(&format!("0x{s}")).unwrap()
    }

    /// RFC 1321 appendix A.5 test suite, split across the three CHAP
    /// inputs: the construction must be a plain concatenation.
    #[test]
    fn known_answers_from_rfc1321() {
        assert_eq!(
            chap_response(b'a', b"b", b"c").to_vec(),
            unhex("900150983cd24fb0d6963f7d28e17f72")
        );
        assert_eq!(
            chap_response(b'm', b"essage", b" digest").to_vec(),
            unhex("f96b697d7cb7938d525a2f31aaf161d0")
        );
        assert_eq!(
            chap_response(b'a', b"bcdefghijklm", b"nopqrstuvwxyz").to_vec(),
            unhex("c3fcd3d76192e4007dfb496cca67e13b")
        );
        assert_eq!(
            chap_response(b'a', b"", b"").to_vec(),
            unhex("0cc175b9c0f1b6a831c399e269772661")
        );
    }

    #[test]
    fn algorithm_selection() {
        assert_eq!(select_algorithm("5"), Some(5));
        assert_eq!(select_algorithm("7,6,5"), Some(5));
        assert_eq!(select_algorithm("5,6,7,8"), Some(5));
        assert_eq!(select_algorithm("56"), None);
        assert_eq!(select_algorithm(""), None);
        assert_eq!(select_algorithm("6,7"), None);
    }

    #[test]
    fn credentials_rules() {
        assert_eq!(
            ChapCredentials::new("u", b"short".to_vec(), None),
            Err(ChapError::SecretTooShort { len: 5 })
        );
        assert!(ChapCredentials::new("u", b"twelve bytes".to_vec(), None).is_ok());
        assert_eq!(
            ChapCredentials::new(
                "u",
                b"twelve bytes".to_vec(),
                Some(("t".into(), b"twelve bytes".to_vec()))
            ),
            Err(ChapError::SameSecretBothWays)
        );
        assert_eq!(
            ChapCredentials::new("", b"twelve bytes".to_vec(), None),
            Err(ChapError::EmptyUser)
        );
        let s = ChapSecret::new(b"secret secret".to_vec()).unwrap();
        assert!(!format!("{s:?}").contains("secret secret"));
    }

    fn creds(mutual: bool) -> ChapCredentials {
        ChapCredentials::new(
            "alice",
            b"initiator-secret".to_vec(),
            mutual.then(|| ("target".to_string(), b"target-secret!".to_vec())),
        )
        .unwrap()
    }

    #[test]
    fn exchange_one_way_and_mutual() {
        let chal = [7u8; 16];
        let t = TargetChap::new(9, &chal);
        let offer = t.offer("5").unwrap();
        assert_eq!(
            offer.to_pairs()[2],
            ("CHAP_C".to_string(), format!("0x{}", "07".repeat(16)))
        );
        let r = value::hex(&chap_response(9, b"initiator-secret", &chal));
        let ok = ChapAnswer {
            name: Some("alice"),
            response: Some(&r),
            ..Default::default()
        };
        assert_eq!(t.verify(&ok, &creds(false)), Ok(None));

        let mutual = ChapAnswer {
            identifier: Some("3"),
            challenge: Some("0x0102030405060708090a0b0c0d0e0f10"),
            ..ok.clone()
        };
        let m = t.verify(&mutual, &creds(true)).unwrap().unwrap();
        assert_eq!(m.name, "target");
        assert_eq!(
            m.response,
            chap_response(
                3,
                b"target-secret!",
                &unhex("0102030405060708090a0b0c0d0e0f10")
            )
        );
        assert_eq!(
            t.verify(&mutual, &creds(false)),
            Err(ChapError::MutualNotConfigured)
        );
        let reflected = ChapAnswer {
            challenge: Some("0x07070707070707070707070707070707"),
            ..mutual.clone()
        };
        assert_eq!(
            t.verify(&reflected, &creds(true)),
            Err(ChapError::ReflectedChallenge)
        );
    }

    #[test]
    fn wrong_answers_fail() {
        let chal = [1u8; 16];
        let t = TargetChap::new(1, &chal);
        let good = chap_response(1, b"initiator-secret", &chal);
        let hex = value::hex(&good);
        let mut b64 = String::new();
        value::encode_base64(&good, &mut b64);
        let answer = |name, resp| ChapAnswer {
            name: Some(name),
            response: Some(resp),
            ..Default::default()
        };
        assert_eq!(t.verify(&answer("alice", &b64), &creds(false)), Ok(None));
        assert_eq!(
            t.verify(&answer("bob", &hex), &creds(false)),
            Err(ChapError::WrongUser)
        );
        let mut bad = good;
        bad[15] ^= 1;
        let bad_hex = value::hex(&bad);
        assert_eq!(
            t.verify(&answer("alice", &bad_hex), &creds(false)),
            Err(ChapError::WrongResponse)
        );
        // Extra bytes in front of a valid base64 response (libiscsi's
        // oversize test) make it the wrong length.
        let oversize = format!("0bb3ZlcnNpemUK{}", &b64[2..]);
        assert_eq!(
            t.verify(&answer("alice", &oversize), &creds(false)),
            Err(ChapError::MalformedResponse)
        );
        assert_eq!(
            t.verify(
                &ChapAnswer {
                    name: Some("alice"),
                    ..Default::default()
                },
                &creds(false)
            ),
            Err(ChapError::MissingResponse)
        );
        assert_eq!(
            t.verify(
                &ChapAnswer {
                    identifier: Some("1"),
                    ..answer("alice", &hex)
                },
                &creds(true)
            ),
            Err(ChapError::IncompleteChallenge)
        );
        assert_eq!(
            t.verify(
                &ChapAnswer {
                    identifier: Some("256"),
                    challenge: Some("0x01"),
                    ..answer("alice", &hex)
                },
                &creds(true)
            ),
            Err(ChapError::MalformedChallenge)
        );
    }

    #[test]
    fn constant_time_eq_basics() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
