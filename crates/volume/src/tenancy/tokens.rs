//! API tokens: created with a role in a project (or cluster-wide), shown
//! once, stored as a SHA-256 hash of their secret, listed, revoked, and
//! turned back into a [`Principal`] on every request.
//!
//! A token reads `bst_<id>_<secret>`: `id` (12 hex digits) is the record's
//! key, so a request costs one catalog read; `secret` is 256 random bits
//! (64 hex digits). High-entropy secrets need no slow password hash: a
//! stolen catalog gives SHA-256 digests of secrets nobody can enumerate.

use super::projects::project_missing;
use super::{entry_error, Principal};
use crate::service::catalog_error;
use crate::{VolumeError, VolumeService};
use basalt_catalog::{Entries, Role, TokenRecord};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

/// How every token created here starts.
pub const TOKEN_PREFIX: &str = "bst_";
const ID_BYTES: usize = 6;
const SECRET_BYTES: usize = 32;

/// What to create a token with.
#[derive(Clone, Debug, PartialEq)]
pub struct NewToken {
    /// The project it acts in; `None`: cluster-wide (admin role only).
    pub project: Option<String>,
    pub role: Role,
    /// Valid for this long from now; `None`: until revoked.
    pub expires_in: Option<Duration>,
    pub description: Option<String>,
}

/// A token as listed: everything but its secret.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenInfo {
    pub id: String,
    pub project: Option<String>,
    pub role: Role,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub description: Option<String>,
    /// Past its expiry: refused, kept listed until revoked.
    pub expired: bool,
}

/// True if `a` equals `b`, in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from the operating system's random generator.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The (id, secret) of a presented token, if it has this module's shape.
fn parse(presented: &str) -> Option<(&str, &str)> {
    let (id, secret) = presented.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (is_lower_hex(id, 2 * ID_BYTES) && is_lower_hex(secret, 2 * SECRET_BYTES))
        .then_some((id, secret))
}

fn digest(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

fn is_expired(record: &TokenRecord, now: SystemTime) -> bool {
    match &record.expires_at {
        None => false,
        // An unreadable expiry fails closed.
        Some(at) => humantime::parse_rfc3339(at).map_or(true, |at| now >= at),
    }
}

fn info(record: TokenRecord, now: SystemTime) -> TokenInfo {
    TokenInfo {
        expired: is_expired(&record, now),
        id: record.id,
        project: record.project,
        role: record.role,
        created_at: record.created_at,
        expires_at: record.expires_at,
        description: record.description,
    }
}

fn token_missing(id: &str) -> VolumeError {
    VolumeError::EntryNotFound {
        kind: "token",
        name: id.to_string(),
    }
}

impl VolumeService {
    /// Creates a token; returns it listed and the token text, which is
    /// shown this once. A cluster admin creates any token; a project admin
    /// tokens of its own project.
    pub fn create_token(
        &self,
        principal: &Principal,
        request: &NewToken,
    ) -> Result<(TokenInfo, String), VolumeError> {
        match &request.project {
            None if request.role == Role::Member => {
                return Err(VolumeError::InvalidPolicy(
                    "a member token belongs to a project: pass a project".into(),
                ))
            }
            None => principal.require_cluster_admin("creating a cluster-wide token")?,
            Some(project) if !principal.administers(project) => {
                return Err(if principal.may_see(Some(project)) {
                    VolumeError::Forbidden(format!(
                        "creating tokens of project {project:?} needs its admin role"
                    ))
                } else {
                    project_missing(project)
                });
            }
            Some(_) => {}
        }
        let now = SystemTime::now();
        let expires_at = match request.expires_in {
            None => None,
            Some(d) if d.is_zero() => {
                return Err(VolumeError::InvalidPolicy(
                    "a token's lifetime must be positive".into(),
                ))
            }
            Some(d) => Some(
                now.checked_add(d)
                    .map(|at| humantime::format_rfc3339_seconds(at).to_string())
                    .ok_or_else(|| {
                        VolumeError::InvalidPolicy("that lifetime is too long".into())
                    })?,
            ),
        };
        let (id, secret) = (
            hex(&random_bytes::<ID_BYTES>()),
            hex(&random_bytes::<SECRET_BYTES>()),
        );
        let record = TokenRecord {
            id: id.clone(),
            project: request.project.clone(),
            role: request.role,
            secret_sha256: digest(&secret),
            created_at: humantime::format_rfc3339_seconds(now).to_string(),
            expires_at,
            description: request.description.clone(),
            unknown: Default::default(),
        };
        let _control = self.control.lock();
        if let Some(project) = &request.project {
            self.project_record(project)?;
        }
        self.catalog
            .insert_entry_record(&record)
            .map_err(|e| entry_error("token", e))?;
        tracing::info!(token = %id, project = ?request.project, role = request.role.as_str(), "token created");
        Ok((info(record, now), format!("{TOKEN_PREFIX}{id}_{secret}")))
    }

    /// The tokens `principal` may manage (cluster admin: all; project
    /// admin: its project's), optionally only those of `project`.
    pub fn tokens(
        &self,
        principal: &Principal,
        project: Option<&str>,
    ) -> Result<Vec<TokenInfo>, VolumeError> {
        if let Some(own) = principal.project() {
            if !principal.administers(own) {
                return Err(VolumeError::Forbidden(
                    "listing tokens needs an admin token".into(),
                ));
            }
        }
        let now = SystemTime::now();
        Ok(self
            .catalog
            .entries::<TokenRecord>()
            .map_err(catalog_error)?
            .into_iter()
            .map(|t| t.record)
            .filter(|t| match principal.project() {
                None => true,
                Some(own) => t.project.as_deref() == Some(own),
            })
            .filter(|t| project.is_none() || t.project.as_deref() == project)
            .map(|t| info(t, now))
            .collect())
    }

    /// Revokes token `id`: it stops working at once, on every node.
    pub fn revoke_token(&self, principal: &Principal, id: &str) -> Result<(), VolumeError> {
        let _control = self.control.lock();
        let current = self
            .catalog
            .entry::<TokenRecord>(id)
            .map_err(catalog_error)?
            .filter(|t| match &t.record.project {
                None => principal.is_cluster_admin(),
                Some(project) => principal.administers(project),
            })
            .ok_or_else(|| token_missing(id))?;
        self.catalog
            .delete_entry_record::<TokenRecord>(id, current.revision)
            .map_err(|e| entry_error("token", e))?;
        tracing::info!(token = id, "token revoked");
        Ok(())
    }

    /// The principal `presented` authenticates, or `None` if it is not a
    /// valid token (malformed, unknown, revoked, expired or wrong secret).
    /// Errors only when the catalog cannot be read.
    pub fn authenticate(&self, presented: &str) -> Result<Option<Principal>, VolumeError> {
        let Some((id, secret)) = parse(presented) else {
            return Ok(None);
        };
        let Some(token) = self
            .catalog
            .entry::<TokenRecord>(id)
            .map_err(catalog_error)?
        else {
            return Ok(None);
        };
        let token = token.record;
        if !constant_time_eq(digest(secret).as_bytes(), token.secret_sha256.as_bytes())
            || is_expired(&token, SystemTime::now())
        {
            return Ok(None);
        }
        Ok(Some(match token.project {
            None if token.role == Role::Admin => Principal::ClusterAdmin,
            // A member token without a project cannot be created; one
            // written by hand confers nothing.
            None => return Ok(None),
            Some(project) => Principal::Project {
                project,
                role: token.role,
                token: token.id,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn only_well_formed_tokens_parse() {
        let id = "0123456789ab";
        let secret = "f".repeat(64);
        let token = format!("bst_{id}_{secret}");
        assert_eq!(parse(&token), Some((id, secret.as_str())));
        for bad in [
            "",
            "bst_",
            &format!("bst_{id}"),
            &format!("bst_{id}_{}", &secret[1..]),
            &format!("bst_{}_{secret}", "0123456789AB"),
            &format!("xyz_{id}_{secret}"),
            &format!("bst_{id}_{secret}_"),
            &format!("bst_{id}__{secret}"),
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn expiry_fails_closed() {
        let mut t = TokenRecord {
            id: "x".into(),
            project: None,
            role: Role::Admin,
            secret_sha256: digest("s"),
            created_at: "2026-01-01T00:00:00Z".into(),
            expires_at: None,
            description: None,
            unknown: Default::default(),
        };
        let now = humantime::parse_rfc3339("2026-06-01T00:00:00Z").unwrap();
        assert!(!is_expired(&t, now));
        t.expires_at = Some("2026-06-01T00:00:01Z".into());
        assert!(!is_expired(&t, now));
        t.expires_at = Some("2026-06-01T00:00:00Z".into());
        assert!(is_expired(&t, now));
        t.expires_at = Some("soon".into());
        assert!(is_expired(&t, now));
    }
}
