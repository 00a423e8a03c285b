//! iSCSI initiator attachments of a volume: which initiator IQNs may log in
//! to its target, and the CHAP credentials an initiator must prove at
//! login (generated here, returned once, kept in the volume's catalog
//! record).
//!
//! Invariants: a detached initiator loses its credentials with its
//! attachment; re-attaching with CHAP replaces them (the old ones stop
//! working at the initiator's next login); attaching without CHAP keeps
//! existing ones (attach is idempotent). Secrets are 16 characters from a
//! 62-letter alphabet (≈95 bits): RFC 7143 asks for at least 96 bits of
//! randomness only for secrets that are not typed by people, yet many
//! initiators cap secrets at 16 characters, so 16 is what works everywhere.

use crate::{VolumeError, VolumeInfo, VolumeService};
use basalt_catalog::{IscsiChapRecord, VolumeRecord};
use rand::Rng;

/// The longest iSCSI name (RFC 7143 §4.2.7.1).
pub const ISCSI_NAME_MAX_LEN: usize = 223;

/// Length of generated CHAP secrets.
const SECRET_LEN: usize = 16;

/// Checks an iSCSI name: `iqn.YYYY-MM.reversed.domain[:anything]`,
/// `eui.` + 16 hex digits or `naa.` + 16 or 32 hex digits, lowercase as
/// stringprep leaves it (RFC 7143 §4.2.7).
pub fn validate_iscsi_name(name: &str) -> Result<(), VolumeError> {
    let fail = |reason: &str| {
        Err(VolumeError::InvalidInitiatorName {
            name: name.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.is_empty() || name.len() > ISCSI_NAME_MAX_LEN {
        return fail("1 to 223 bytes");
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(c);
    if !name.chars().all(allowed) {
        return fail("only lowercase letters, digits, '-', '.' and ':' are allowed");
    }
    let hex = |s: &str, lens: &[usize]| {
        lens.contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit())
    };
    if let Some(rest) = name.strip_prefix("iqn.") {
        let date_ok = rest.len() > 8
            && rest.as_bytes().get(4) == Some(&b'-')
            && rest.as_bytes().get(7) == Some(&b'.')
            && rest[..4].chars().all(|c| c.is_ascii_digit())
            && rest[5..7].chars().all(|c| c.is_ascii_digit());
        if !date_ok {
            return fail("an iqn. name continues with a date (YYYY-MM.) and a reversed domain");
        }
        return Ok(());
    }
    if let Some(rest) = name.strip_prefix("eui.") {
        // (Lowercase hex: stringprep folds case.)
        if hex(rest, &[16]) {
            return Ok(());
        }
        return fail("an eui. name has 16 hex digits");
    }
    if let Some(rest) = name.strip_prefix("naa.") {
        if hex(rest, &[16, 32]) {
            return Ok(());
        }
        return fail("a naa. name has 16 or 32 hex digits");
    }
    fail("an iSCSI name starts with iqn., eui. or naa.")
}

/// The prefix of every volume's iSCSI target name.
pub const ISCSI_TARGET_PREFIX: &str = "iqn.2026-11.io.basalt:volume:";

/// The iSCSI target name of volume (or snapshot, `VOL@SNAP`) `volume`:
/// [`ISCSI_TARGET_PREFIX`] and the name, in which the characters iSCSI
/// names lack are escaped with `:` (which volume names lack): an uppercase
/// letter `X` is written `:x`, `_` is `::` and the snapshot separator `@`
/// is `:.`; every `:` starts such a pair, so the mapping is one to one. Lowercase
/// names read as themselves.
pub fn iscsi_target_name(volume: &str) -> String {
    let mut name = String::with_capacity(ISCSI_TARGET_PREFIX.len() + volume.len() + 4);
    name.push_str(ISCSI_TARGET_PREFIX);
    for c in volume.chars() {
        match c {
            'A'..='Z' => {
                name.push(':');
                name.push(c.to_ascii_lowercase());
            }
            '_' => name.push_str("::"),
            '@' => name.push_str(":."),
            c => name.push(c),
        }
    }
    name
}

/// The volume (or `VOL@SNAP`) whose target name is `target`, if it is one.
pub fn volume_of_target_name(target: &str) -> Option<String> {
    let escaped = target.strip_prefix(ISCSI_TARGET_PREFIX)?;
    let mut volume = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' => match chars.next()? {
                ':' => volume.push('_'),
                '.' => volume.push('@'),
                c if c.is_ascii_lowercase() => volume.push(c.to_ascii_uppercase()),
                _ => return None,
            },
            c if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' => {
                volume.push(c)
            }
            _ => return None,
        }
    }
    (!volume.is_empty()).then_some(volume)
}

fn fresh_secret() -> String {
    let mut rng = rand::rngs::OsRng;
    (0..SECRET_LEN)
        .map(|_| rng.sample(rand::distributions::Alphanumeric) as char)
        .collect()
}

impl VolumeService {
    /// Lets initiator `iqn` log in to `name`'s iSCSI target (idempotent).
    pub fn attach_initiator(&self, name: &str, iqn: &str) -> Result<VolumeInfo, VolumeError> {
        validate_iscsi_name(iqn)?;
        self.update_initiators(name, |record| {
            if !record.iscsi_initiators.iter().any(|i| i == iqn) {
                record.iscsi_initiators.push(iqn.to_string());
            }
        })
    }

    /// [`VolumeService::attach_initiator`] with fresh CHAP credentials (and
    /// the target's own, for mutual CHAP, when `mutual`): from now on the
    /// initiator must authenticate at every login. Returns them, shown
    /// this once.
    pub fn attach_initiator_chap(
        &self,
        name: &str,
        iqn: &str,
        mutual: bool,
    ) -> Result<(VolumeInfo, IscsiChapRecord), VolumeError> {
        validate_iscsi_name(iqn)?;
        let chap = IscsiChapRecord {
            // The initiator's name is what open-iscsi and most initiators
            // answer with by default when no user name is configured.
            user: iqn.to_string(),
            secret: fresh_secret(),
            target_user: mutual.then(|| format!("basalt:{name}")),
            target_secret: mutual.then(fresh_secret),
            unknown: Default::default(),
        };
        let info = self.update_initiators(name, |record| {
            if !record.iscsi_initiators.iter().any(|i| i == iqn) {
                record.iscsi_initiators.push(iqn.to_string());
            }
            record.iscsi_chap.insert(iqn.to_string(), chap.clone());
        })?;
        Ok((info, chap))
    }

    /// Revokes initiator `iqn`'s access to `name`, and its credentials
    /// (idempotent). Logged-in sessions last until they log out.
    pub fn detach_initiator(&self, name: &str, iqn: &str) -> Result<VolumeInfo, VolumeError> {
        self.update_initiators(name, |record| {
            record.iscsi_initiators.retain(|i| i != iqn);
            record.iscsi_chap.remove(iqn);
        })
    }

    /// The CHAP credentials initiator `iqn` must prove to log in to
    /// `name`; `None` when it has none (or the volume is unknown).
    pub fn iscsi_chap(&self, name: &str, iqn: &str) -> Option<IscsiChapRecord> {
        match self.catalog.get(name) {
            Ok(found) => found?.record.iscsi_chap.get(iqn).cloned(),
            Err(e) => {
                tracing::error!(volume = name, error = %e, "cannot read a volume's iSCSI credentials");
                None
            }
        }
    }

    fn update_initiators(
        &self,
        name: &str,
        change: impl FnOnce(&mut VolumeRecord),
    ) -> Result<VolumeInfo, VolumeError> {
        self.edit_record(name, change, |record| {
            let with_chap: Vec<&String> = record.iscsi_chap.keys().collect();
            tracing::info!(volume = name, initiators = ?record.iscsi_initiators, chap = ?with_chap, "iSCSI initiators changed");
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iscsi_names() {
        for ok in [
            "iqn.2026-11.io.basalt:volume:a",
            "iqn.1993-08.org.debian:01:abcdef",
            "eui.02004567a425678d",
            "naa.52004567ba64678d",
            "naa.62004567ba64678d0123456789abcdef",
        ] {
            validate_iscsi_name(ok).unwrap();
        }
        for bad in [
            "",
            "iqn.",
            "iqn.2026.io.basalt",
            "IQN.2026-11.io.basalt",
            "eui.1234",
            "naa.xyz",
            "host1",
            "iqn.2026-11.io.basalt with space",
        ] {
            assert!(validate_iscsi_name(bad).is_err(), "{bad}");
        }
        assert!(validate_iscsi_name(&format!("iqn.2026-11.{}", "a".repeat(220))).is_err());
    }

    #[test]
    fn target_names_map_volume_names_both_ways() {
        assert_eq!(
            iscsi_target_name("db-1"),
            "iqn.2026-11.io.basalt:volume:db-1"
        );
        for volume in ["db-1", "Golden_Image.v2", "a", "a@snap_1", "ABC", "x_:y"] {
            let target = iscsi_target_name(volume);
            if volume.contains(':') {
                continue;
            }
            validate_iscsi_name(&target).unwrap();
            assert_eq!(
                volume_of_target_name(&target).as_deref(),
                Some(volume),
                "{target}"
            );
        }
        for bad in [
            "iqn.2026-11.io.basalt:volume:",
            "iqn.2026-11.io.basalt:volume:a:",
            "iqn.2026-11.io.basalt:volume:a:1",
            "iqn.2026-11.io.basalt:volume:a:_",
            "iqn.2026-11.io.other:volume:a",
            "iqn.2026-11.io.basalt:volume:A",
        ] {
            assert_eq!(volume_of_target_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn secrets_are_sixteen_alphanumerics() {
        let s = fresh_secret();
        assert_eq!(s.len(), SECRET_LEN);
        assert!(s.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(s, fresh_secret());
    }
}
