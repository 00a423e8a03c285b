//! Where an NBD server listens and how to reach it: a Unix socket, plain
//! TCP, or TCP with TLS and a pre-shared key. Parsed from the NBD URI forms
//! libnbd and qemu accept (`nbd+unix:///EXPORT?socket=PATH`,
//! `nbd://HOST:PORT/EXPORT`, `nbds://IDENTITY@HOST:PORT/EXPORT?tls-psk-file=FILE`).

use crate::error::ClientError;
use std::path::{Path, PathBuf};

/// NBD's IANA port, the default of `nbd://` URIs.
const DEFAULT_PORT: u16 = 10809;

/// A TLS identity and its key (from a keys.psk file: `IDENTITY:HEXKEY`).
#[derive(Clone, PartialEq, Eq)]
pub struct PskCredentials {
    pub identity: String,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for PskCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PskCredentials({}, <key>)", self.identity)
    }
}

impl PskCredentials {
    /// The key of `identity` in a keys.psk file (one `IDENTITY:HEXKEY` per
    /// line, as psktool and `basalt nbd-key create` write them).
    pub fn from_file(path: &Path, identity: &str) -> Result<PskCredentials, ClientError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ClientError::Tls(format!("cannot read the key file {}: {e}", path.display()))
        })?;
        for line in text.lines() {
            let Some((id, hex)) = line.trim().split_once(':') else {
                continue;
            };
            if id == identity {
                let key = decode_hex(hex).ok_or_else(|| {
                    ClientError::Tls(format!(
                        "the key of {identity} in {} is not hexadecimal",
                        path.display()
                    ))
                })?;
                return Ok(PskCredentials {
                    identity: identity.to_string(),
                    key,
                });
            }
        }
        Err(ClientError::Tls(format!(
            "{} has no key for identity {identity}",
            path.display()
        )))
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// How to reach an NBD server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
    Tls {
        address: String,
        psk: PskCredentials,
    },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix socket {}", path.display()),
            Endpoint::Tcp(address) => write!(f, "{address}"),
            Endpoint::Tls { address, psk } => write!(f, "{} over TLS as {address}", psk.identity),
        }
    }
}

impl Endpoint {
    /// Parses an NBD URI; also returns its export name when it has one.
    pub fn parse_uri(uri: &str) -> Result<(Endpoint, Option<String>), ClientError> {
        let bad = |why: &str| ClientError::Protocol(format!("NBD URI {uri}: {why}"));
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad("expected nbd://, nbds:// or nbd+unix://"))?;
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let params: Vec<(&str, &str)> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
            .collect();
        let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        let export = (!path.is_empty()).then(|| path.to_string());
        let endpoint = match scheme {
            "nbd+unix" => {
                let socket = param("socket").ok_or_else(|| bad("needs ?socket=PATH"))?;
                Endpoint::Unix(PathBuf::from(socket))
            }
            "nbd" | "nbds" => {
                let (user, host) = match authority.rsplit_once('@') {
                    Some((user, host)) => (Some(user), host),
                    None => (None, authority),
                };
                if host.is_empty() {
                    return Err(bad("has no host"));
                }
                let address = if host
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                {
                    host.to_string()
                } else {
                    format!("{host}:{DEFAULT_PORT}")
                };
                if scheme == "nbd" {
                    Endpoint::Tcp(address)
                } else {
                    let identity =
                        user.ok_or_else(|| bad("nbds:// needs IDENTITY@ before the host"))?;
                    let file = param("tls-psk-file")
                        .ok_or_else(|| bad("nbds:// needs ?tls-psk-file=FILE"))?;
                    Endpoint::Tls {
                        address,
                        psk: PskCredentials::from_file(Path::new(file), identity)?,
                    }
                }
            }
            other => return Err(bad(&format!("unsupported scheme {other}"))),
        };
        Ok((endpoint, export))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_of_every_transport_parse() {
        let (e, export) = Endpoint::parse_uri("nbd+unix:///vol1?socket=/run/b.sock").unwrap();
        assert_eq!(e, Endpoint::Unix("/run/b.sock".into()));
        assert_eq!(export.as_deref(), Some("vol1"));
        let (e, export) = Endpoint::parse_uri("nbd://127.0.0.1").unwrap();
        assert_eq!(e, Endpoint::Tcp("127.0.0.1:10809".into()));
        assert_eq!(export, None);
        let (e, _) = Endpoint::parse_uri("nbd://[::1]:10900/v@s").unwrap();
        assert_eq!(e, Endpoint::Tcp("[::1]:10900".into()));

        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.psk");
        std::fs::write(&keys, "other:00ff\np.1:0a0B\n").unwrap();
        let uri = format!(
            "nbds://p.1@127.0.0.1:10900/v?tls-psk-file={}",
            keys.display()
        );
        let (e, export) = Endpoint::parse_uri(&uri).unwrap();
        assert_eq!(
            e,
            Endpoint::Tls {
                address: "127.0.0.1:10900".into(),
                psk: PskCredentials {
                    identity: "p.1".into(),
                    key: vec![0x0a, 0x0b]
                }
            }
        );
        assert_eq!(export.as_deref(), Some("v"));
    }

    #[test]
    fn bad_uris_say_what_is_missing() {
        for (uri, words) in [
            ("http://x", "unsupported scheme"),
            ("nbd+unix:///v", "socket"),
            ("nbds://127.0.0.1/v?tls-psk-file=/x", "IDENTITY@"),
            ("nbds://a@127.0.0.1/v", "tls-psk-file"),
            ("vol", "expected nbd://"),
        ] {
            let e = Endpoint::parse_uri(uri).unwrap_err().to_string();
            assert!(e.contains(words), "{uri}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.psk");
        std::fs::write(&keys, "p.1:zz\n").unwrap();
        let e = PskCredentials::from_file(&keys, "p.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not hexadecimal"), "{e}");
        let e = PskCredentials::from_file(&keys, "p.2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no key for identity p.2"), "{e}");
    }
}
