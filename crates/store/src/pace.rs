//! Pacing of long background work (scrubs, flattens, merges, replica
//! compares) to a byte rate: the caller reports how many bytes it has done
//! since it started and sleeps out any lead over the rate.
//!
//! Invariant: the rate holds over the whole run, not per step, so a slow
//! step is made up by the following ones, never punished twice.

use std::time::{Duration, Instant};

/// A run paced at a byte rate (none: unpaced).
#[derive(Debug)]
pub struct Pacer {
    /// Bytes per second; None or 0: no cap.
    rate: Option<u64>,
    started: Instant,
}

impl Pacer {
    /// Starts a run at `rate` bytes per second (None or 0: no cap).
    pub fn new(rate: Option<u64>) -> Pacer {
        Pacer {
            rate: rate.filter(|r| *r > 0),
            started: Instant::now(),
        }
    }

    /// How long a run that has done `done_bytes` by now is ahead of its
    /// rate.
    pub fn lead(&self, done_bytes: u64) -> Duration {
        self.rate.map_or(Duration::ZERO, |rate| {
            Duration::from_secs_f64(done_bytes as f64 / rate as f64)
                .saturating_sub(self.started.elapsed())
        })
    }

    /// Sleeps out the lead of a run that has done `done_bytes`.
    pub fn wait(&self, done_bytes: u64) {
        let lead = self.lead(done_bytes);
        if !lead.is_zero() {
            std::thread::sleep(lead);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unpaced_run_never_leads_and_a_paced_one_leads_by_what_it_is_ahead() {
        assert_eq!(Pacer::new(None).lead(u64::MAX), Duration::ZERO);
        assert_eq!(Pacer::new(Some(0)).lead(u64::MAX), Duration::ZERO);
        let p = Pacer::new(Some(1 << 20));
        // 10 MiB at 1 MiB/s: about 10 s ahead right after the start.
        let lead = p.lead(10 << 20);
        assert!(
            lead > Duration::from_secs(5) && lead <= Duration::from_secs(10),
            "{lead:?}"
        );
        assert_eq!(p.lead(0), Duration::ZERO);
    }
}
