//! Admission of client connections to a frontend: how many may be live at
//! once, in total and from one source (an IP address, or a local user on a
//! Unix socket).
//!
//! Why per address: with only a total limit, one host that opens (and
//! leaves idle) as many connections as the limit locks every other client
//! out of the frontend for as long as it likes. Each frontend (NBD, NVMe/TCP)
//! has its own [`Admission`].
//!
//! Invariants:
//! - a connection counts from [`Admission::admit`] until its [`Admitted`]
//!   is dropped (however its thread ends), so the counts never drift;
//! - at most `max_total` connections are admitted at once, and at most
//!   `max_per_address` from one source;
//! - refusals are logged at 1, 10, 100, … per address (a flood is one line
//!   per order of magnitude, not one per connection).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// Where connections come from, for the per-source limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A TCP client's IP address.
    Address(IpAddr),
    /// A Unix-socket client's user id.
    LocalUser(u32),
}

impl From<IpAddr> for Source {
    fn from(address: IpAddr) -> Source {
        Source::Address(address)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Address(address) => write!(f, "{address}"),
            Source::LocalUser(uid) => write!(f, "local user {uid}"),
        }
    }
}

/// The limits of one frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    pub max_total: usize,
    pub max_per_address: usize,
}

/// Live connections from one address, and refusals since it last had none.
#[derive(Debug, Default)]
struct PerAddress {
    live: usize,
    refused: u64,
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    by_address: HashMap<Source, PerAddress>,
    /// Refusals for the total limit since a connection was last admitted.
    refused_total: u64,
}

/// The admission counters of one frontend.
#[derive(Debug)]
pub struct Admission {
    /// The protocol, for log lines ("NBD", "NVMe/TCP").
    protocol: &'static str,
    limits: AdmissionLimits,
    state: Mutex<State>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The frontend holds `max_total` connections.
    Total,
    /// The address holds `max_per_address` connections.
    PerAddress,
}

/// An admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
    address: Source,
}

impl Admission {
    pub fn new(protocol: &'static str, limits: AdmissionLimits) -> Arc<Admission> {
        Arc::new(Admission {
            protocol,
            limits,
            state: Mutex::new(State::default()),
        })
    }

    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Counts a new connection from `address`, or refuses it (and logs the
    /// refusal, sparingly).
    pub fn admit(self: &Arc<Self>, address: impl Into<Source>) -> Result<Admitted, Refusal> {
        let address = address.into();
        let mut st = self.state.lock();
        if st.total >= self.limits.max_total {
            st.refused_total += 1;
            let (refused, total) = (st.refused_total, st.total);
            drop(st);
            if power_of_ten(refused) {
                tracing::warn!(%address, refused, total, limit = self.limits.max_total,
                    "{} connection refused: the frontend's connection limit is reached", self.protocol);
            }
            return Err(Refusal::Total);
        }
        let entry = st.by_address.entry(address).or_default();
        if entry.live >= self.limits.max_per_address {
            entry.refused += 1;
            let (refused, live) = (entry.refused, entry.live);
            drop(st);
            if power_of_ten(refused) {
                tracing::warn!(%address, refused, live, limit = self.limits.max_per_address,
                    "{} connection refused: this address's connection limit is reached", self.protocol);
            }
            return Err(Refusal::PerAddress);
        }
        entry.live += 1;
        st.total += 1;
        st.refused_total = 0;
        Ok(Admitted {
            admission: Arc::clone(self),
            address,
        })
    }

    /// Live connections, in total and from `address`.
    pub fn live(&self, address: impl Into<Source>) -> (usize, usize) {
        let address = address.into();
        let st = self.state.lock();
        let from = st.by_address.get(&address).map_or(0, |p| p.live);
        (st.total, from)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut st = self.admission.state.lock();
        st.total = st.total.saturating_sub(1);
        if let Some(p) = st.by_address.get_mut(&self.address) {
            p.live = p.live.saturating_sub(1);
            if p.live == 0 {
                st.by_address.remove(&self.address);
            }
        }
    }
}

/// 1, 10, 100, …: the refusals worth a log line.
fn power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn one_address_cannot_take_every_place() {
        let a = Admission::new(
            "test",
            AdmissionLimits {
                max_total: 10,
                max_per_address: 3,
            },
        );
        let flood: Vec<Admitted> = (0..3).map(|_| a.admit(ip("10.0.0.1")).unwrap()).collect();
        assert_eq!(a.admit(ip("10.0.0.1")).unwrap_err(), Refusal::PerAddress);
        let other = a
            .admit(ip("10.0.0.2"))
            .expect("another address still gets in");
        assert_eq!(a.live(ip("10.0.0.1")), (4, 3));
        drop(flood);
        assert_eq!(a.live(ip("10.0.0.1")), (1, 0));
        let again = a.admit(ip("10.0.0.1")).expect("places are freed on drop");
        drop((other, again));
        assert_eq!(a.live(ip("10.0.0.2")), (0, 0));
    }

    #[test]
    fn the_total_bounds_many_addresses() {
        let a = Admission::new(
            "test",
            AdmissionLimits {
                max_total: 2,
                max_per_address: 2,
            },
        );
        let _x = a.admit(ip("10.0.0.1")).unwrap();
        let _y = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.3")).unwrap_err(), Refusal::Total);
        // A refused address leaves no entry behind.
        assert_eq!(a.state.lock().by_address.len(), 2);
    }

    #[test]
    fn refusals_are_logged_per_order_of_magnitude() {
        let logged: Vec<u64> = (1..=1000).filter(|n| power_of_ten(*n)).collect();
        assert_eq!(logged, [1, 10, 100, 1000]);
    }
}
