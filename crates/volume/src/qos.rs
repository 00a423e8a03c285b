//! Quality of service: a volume's limits, named as in Cinder's QoS specs so
//! that an OpenStack operator's specs apply unchanged, and the throttle that
//! enforces them in every frontend's data path.
//!
//! Keys (all optional, positive integers):
//! - `total_iops_sec`, `read_iops_sec`, `write_iops_sec`: operations per
//!   second; `total_bytes_sec`, `read_bytes_sec`, `write_bytes_sec`: bytes
//!   per second;
//! - the same keys with `_per_gb` (`total_iops_sec_per_gb`, …): scaled by
//!   the volume's size in GiB (at least 1), like IOPS-per-GB offerings; a
//!   plain key wins over its `_per_gb` form;
//! - the same keys with `_max` (`total_iops_sec_max`, …): the rate a burst
//!   may reach after the volume was quiet, for at most `burst_length_sec`
//!   seconds (default 1), before the plain limit holds again;
//! - `size_iops_sec`: an operation larger than this many bytes counts as
//!   several for the IOPS limits.
//!
//! Invariants:
//! - The throttle is a set of token buckets, one per limited class (total,
//!   read, write × operations, bytes); an operation is admitted when every
//!   bucket it draws from is not in debt, and then charged in full (a
//!   bucket may go into debt, so an operation larger than a bucket still
//!   passes, and the next waits for the debt to be repaid).
//! - Each bucket refills at its rate up to its capacity: 100 ms of its rate,
//!   or with a burst limit, `(max − rate) × burst_length_sec` more, while a
//!   second bucket at the burst rate caps how fast the burst runs.
//! - An unlimited volume costs one atomic load per operation: no lock, no
//!   clock read.
//! - Pure: time comes in as an argument (`Instant`), so the arithmetic is
//!   tested without sleeping.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The keys a QoS spec may have.
pub const QOS_KEYS: [&str; 26] = [
    "total_iops_sec",
    "read_iops_sec",
    "write_iops_sec",
    "total_bytes_sec",
    "read_bytes_sec",
    "write_bytes_sec",
    "total_iops_sec_per_gb",
    "read_iops_sec_per_gb",
    "write_iops_sec_per_gb",
    "total_bytes_sec_per_gb",
    "read_bytes_sec_per_gb",
    "write_bytes_sec_per_gb",
    "total_iops_sec_max",
    "read_iops_sec_max",
    "write_iops_sec_max",
    "total_bytes_sec_max",
    "read_bytes_sec_max",
    "write_bytes_sec_max",
    "total_iops_sec_per_gb_max",
    "read_iops_sec_per_gb_max",
    "write_iops_sec_per_gb_max",
    "total_bytes_sec_per_gb_max",
    "read_bytes_sec_per_gb_max",
    "write_bytes_sec_per_gb_max",
    "burst_length_sec",
    "size_iops_sec",
];

/// Why a QoS spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    #[error("unknown QoS key {0:?} (keys: total_iops_sec, read_iops_sec, write_iops_sec, total_bytes_sec, read_bytes_sec, write_bytes_sec, their _per_gb and _max forms, burst_length_sec, size_iops_sec)")]
    UnknownKey(String),
    #[error("QoS key {key}: {value:?} is not a positive integer")]
    BadValue { key: String, value: String },
    #[error("QoS key {0}: a burst limit below its sustained limit")]
    BurstBelowRate(String),
    #[error("QoS spec {0:?}: expected KEY=VALUE pairs separated by commas")]
    Syntax(String),
}

/// A volume's QoS spec: Cinder key → value. Empty: unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QosSpec(pub BTreeMap<String, u64>);

impl QosSpec {
    /// Parses `key=value,key=value` (what `basalt volume set-qos` takes);
    /// an empty string is the empty (unlimited) spec.
    pub fn parse(text: &str) -> Result<QosSpec, QosError> {
        let mut map = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| QosError::Syntax(pair.to_string()))?;
            let (key, value) = (key.trim(), value.trim());
            let n = value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| QosError::BadValue {
                    key: key.to_string(),
                    value: value.to_string(),
                })?;
            map.insert(key.to_string(), n);
        }
        let spec = QosSpec(map);
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every key is known, every value positive and no burst limit
    /// below its sustained limit.
    pub fn validate(&self) -> Result<(), QosError> {
        for (key, value) in &self.0 {
            if !QOS_KEYS.contains(&key.as_str()) {
                return Err(QosError::UnknownKey(key.clone()));
            }
            if *value == 0 {
                return Err(QosError::BadValue {
                    key: key.clone(),
                    value: "0".into(),
                });
            }
        }
        for (key, max) in self.0.iter().filter(|(k, _)| k.ends_with("_max")) {
            let base = key.trim_end_matches("_max");
            if self.0.get(base).is_some_and(|rate| max < rate) {
                return Err(QosError::BurstBelowRate(key.clone()));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `key=value,…` in key order (the form `parse` takes).
    pub fn to_text(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The limits for a volume of `size_bytes`.
    pub fn limits(&self, size_bytes: u64) -> Limits {
        let gib = (size_bytes >> 30).max(1);
        let value = |key: &str| -> Option<u64> {
            self.0.get(key).copied().or_else(|| {
                let per_gb = key.replacen("_sec", "_sec_per_gb", 1);
                self.0.get(&per_gb).map(|v| v.saturating_mul(gib))
            })
        };
        let class = |name: &str| {
            value(name).map(|rate| Limit {
                rate,
                burst: value(&format!("{name}_max")).filter(|m| *m > rate),
            })
        };
        Limits {
            classes: [
                class("total_iops_sec"),
                class("read_iops_sec"),
                class("write_iops_sec"),
                class("total_bytes_sec"),
                class("read_bytes_sec"),
                class("write_bytes_sec"),
            ],
            burst_length: Duration::from_secs(self.0.get("burst_length_sec").copied().unwrap_or(1)),
            size_iops: self.0.get("size_iops_sec").copied(),
        }
    }
}

/// One limited class: a sustained rate and an optional burst rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub rate: u64,
    pub burst: Option<u64>,
}

/// The effective limits of a volume (its spec at its size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// total, read, write IOPS; total, read, write bytes/s.
    classes: [Option<Limit>; 6],
    burst_length: Duration,
    size_iops: Option<u64>,
}

impl Limits {
    pub fn is_unlimited(&self) -> bool {
        self.classes.iter().all(Option::is_none)
    }
}

/// Whether an operation reads or writes (the classes it draws from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

/// A token bucket: `level` tokens (negative: debt), refilled at `rate` per
/// second up to `capacity`.
#[derive(Debug, Clone)]
struct Bucket {
    rate: f64,
    capacity: f64,
    level: f64,
}

impl Bucket {
    fn new(rate: f64, capacity: f64) -> Bucket {
        Bucket {
            rate,
            capacity,
            level: capacity,
        }
    }

    fn refill(&mut self, elapsed: f64) {
        self.level = (self.level + self.rate * elapsed).min(self.capacity);
    }

    /// Time until the debt is repaid (zero if none).
    fn wait(&self) -> f64 {
        if self.level >= 0.0 {
            0.0
        } else {
            -self.level / self.rate
        }
    }
}

/// The buckets of one limited class.
#[derive(Debug, Clone)]
struct ClassBuckets {
    sustained: Bucket,
    /// Caps the burst's own rate (only with a burst limit).
    burst_rate: Option<Bucket>,
}

/// The buckets in force and when they were last refilled.
#[derive(Debug)]
struct State {
    limits: Limits,
    buckets: [Option<ClassBuckets>; 6],
    last: Option<Instant>,
}

/// Tokens of 100 ms at `rate`: the smoothing window of every bucket.
const WINDOW: f64 = 0.1;

fn buckets_for(limits: &Limits) -> [Option<ClassBuckets>; 6] {
    limits.classes.map(|class| {
        class.map(|Limit { rate, burst }| {
            let rate = rate as f64;
            let window = (rate * WINDOW).max(1.0);
            match burst {
                Some(max) => {
                    let max = max as f64;
                    let extra = (max - rate) * limits.burst_length.as_secs_f64();
                    ClassBuckets {
                        sustained: Bucket::new(rate, window + extra),
                        burst_rate: Some(Bucket::new(max, (max * WINDOW).max(1.0))),
                    }
                }
                None => ClassBuckets {
                    sustained: Bucket::new(rate, window),
                    burst_rate: None,
                },
            }
        })
    })
}

/// A volume's throttle, shared by every handle and connection of it.
#[derive(Debug)]
pub struct Throttle {
    limited: AtomicBool,
    state: Mutex<State>,
    /// Nanoseconds operations spent waiting for admission.
    throttled_ns: AtomicU64,
}

impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::new(&QosSpec::default().limits(0))
    }
}

impl Throttle {
    pub fn new(limits: &Limits) -> Throttle {
        Throttle {
            limited: AtomicBool::new(!limits.is_unlimited()),
            state: Mutex::new(State {
                buckets: buckets_for(limits),
                limits: limits.clone(),
                last: None,
            }),
            throttled_ns: AtomicU64::new(0),
        }
    }

    /// Puts new limits in force at once (buckets start full).
    pub fn configure(&self, limits: &Limits) {
        let mut st = self.state.lock();
        if st.limits == *limits {
            return;
        }
        st.buckets = buckets_for(limits);
        st.limits = limits.clone();
        st.last = None;
        self.limited
            .store(!limits.is_unlimited(), Ordering::Release);
    }

    /// Whether any limit is in force.
    pub fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Acquire)
    }

    /// Admits an operation of `bytes` at `now` (charging it), or says how
    /// long to wait before asking again (charging nothing).
    pub fn admit(&self, now: Instant, direction: Direction, bytes: u64) -> Option<Duration> {
        if !self.is_limited() {
            return None;
        }
        let mut st = self.state.lock();
        if let Some(last) = st.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            for class in st.buckets.iter_mut().flatten() {
                class.sustained.refill(elapsed);
                if let Some(b) = class.burst_rate.as_mut() {
                    b.refill(elapsed);
                }
            }
        }
        st.last = Some(now);
        // Classes this operation draws from: total and its direction, for
        // operations (0..3) and bytes (3..6).
        let own = match direction {
            Direction::Read => 1,
            Direction::Write => 2,
        };
        let drawn = [0, own, 3, 3 + own];
        let wait = drawn
            .iter()
            .filter_map(|&k| st.buckets[k].as_ref())
            .map(|c| {
                c.sustained
                    .wait()
                    .max(c.burst_rate.as_ref().map_or(0.0, Bucket::wait))
            })
            .fold(0.0, f64::max);
        if wait > 0.0 {
            return Some(Duration::from_secs_f64(wait).max(Duration::from_micros(1)));
        }
        let ops = match st.limits.size_iops {
            Some(size) if bytes > size => bytes.div_ceil(size),
            _ => 1,
        } as f64;
        for (i, &k) in drawn.iter().enumerate() {
            let cost = if i < 2 { ops } else { bytes as f64 };
            if let Some(c) = st.buckets[k].as_mut() {
                c.sustained.level -= cost;
                if let Some(b) = c.burst_rate.as_mut() {
                    b.level -= cost;
                }
            }
        }
        None
    }

    /// Records time an operation waited for admission.
    pub fn record_wait(&self, waited: Duration) {
        self.throttled_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Total time operations of this volume waited for admission.
    pub fn throttled(&self) -> Duration {
        Duration::from_nanos(self.throttled_ns.load(Ordering::Relaxed))
    }

    /// Blocks the calling thread until the operation is admitted (for
    /// frontends that serve one volume per thread: lanes, queue threads).
    pub fn wait_admitted(&self, direction: Direction, bytes: u64) {
        if !self.is_limited() {
            return;
        }
        let start = Instant::now();
        while let Some(wait) = self.admit(Instant::now(), direction, bytes) {
            std::thread::sleep(wait);
        }
        let waited = start.elapsed();
        if waited > Duration::from_micros(10) {
            self.record_wait(waited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> QosSpec {
        QosSpec::parse(text).expect("a valid spec")
    }

    /// Runs a closed loop of back-to-back operations for `secs` of
    /// simulated time; the operations admitted.
    fn run(t: &Throttle, direction: Direction, bytes: u64, secs: f64) -> u64 {
        let start = Instant::now();
        let mut now = start;
        let mut n = 0;
        while (now - start).as_secs_f64() < secs {
            match t.admit(now, direction, bytes) {
                None => n += 1,
                Some(wait) => now += wait,
            }
        }
        n
    }

    #[test]
    fn specs_parse_validate_and_print_back() {
        let s = spec(
            "total_iops_sec=500, read_bytes_sec=1048576,write_iops_sec_max=900,write_iops_sec=300",
        );
        assert_eq!(
            s.to_text(),
            "read_bytes_sec=1048576,total_iops_sec=500,write_iops_sec=300,write_iops_sec_max=900"
        );
        assert_eq!(QosSpec::parse(&s.to_text()), Ok(s));
        assert!(QosSpec::parse("").unwrap().is_empty());
        assert!(matches!(
            QosSpec::parse("iops=5"),
            Err(QosError::UnknownKey(_))
        ));
        assert!(matches!(
            QosSpec::parse("total_iops_sec=0"),
            Err(QosError::BadValue { .. })
        ));
        assert!(matches!(
            QosSpec::parse("total_iops_sec=-1"),
            Err(QosError::BadValue { .. })
        ));
        assert!(matches!(
            QosSpec::parse("total_iops_sec"),
            Err(QosError::Syntax(_))
        ));
        assert!(matches!(
            QosSpec::parse("total_iops_sec=100,total_iops_sec_max=50"),
            Err(QosError::BurstBelowRate(_))
        ));
    }

    #[test]
    fn per_gb_limits_scale_with_the_size_and_plain_keys_win() {
        let s = spec("total_iops_sec_per_gb=30,read_iops_sec=100,read_iops_sec_per_gb=1");
        let l = s.limits(10 << 30);
        assert_eq!(l.classes[0].map(|c| c.rate), Some(300));
        assert_eq!(l.classes[1].map(|c| c.rate), Some(100));
        // Below 1 GiB counts as 1 GiB.
        assert_eq!(s.limits(1 << 20).classes[0].map(|c| c.rate), Some(30));
    }

    #[test]
    fn sustained_limits_hold_in_every_class() {
        for (text, direction, bytes, want) in [
            ("total_iops_sec=1000", Direction::Read, 4096, 1000.0),
            (
                "read_iops_sec=700,write_iops_sec=300",
                Direction::Write,
                4096,
                300.0,
            ),
            (
                "read_iops_sec=700,write_iops_sec=300",
                Direction::Read,
                4096,
                700.0,
            ),
            // 1 MiB operations at 10 MiB/s: 10 per second.
            ("total_bytes_sec=10485760", Direction::Write, 1 << 20, 10.0),
            ("read_bytes_sec=4096000", Direction::Read, 4096, 1000.0),
            // size_iops_sec: a 64 KiB operation counts as 16 of 4 KiB.
            (
                "total_iops_sec=1600,size_iops_sec=4096",
                Direction::Read,
                65536,
                100.0,
            ),
        ] {
            let t = Throttle::new(&spec(text).limits(1 << 30));
            let n = run(&t, direction, bytes, 10.0) as f64;
            assert!(
                (n / 10.0 - want).abs() / want < 0.02,
                "{text}: {n} in 10 s, want {want}/s"
            );
        }
    }

    #[test]
    fn a_burst_runs_at_its_rate_for_its_length_then_the_limit_holds() {
        let t = Throttle::new(
            &spec("total_iops_sec=100,total_iops_sec_max=1000,burst_length_sec=2").limits(1 << 30),
        );
        // First second: at the burst rate (plus the burst bucket's 100 ms
        // window it starts with).
        let first = run(&t, Direction::Read, 4096, 1.0) as f64;
        assert!((1000.0..=1110.0).contains(&first), "first second {first}");
        // The burst (900/s above the limit for 2 s) is used up within
        // about 2 s; afterwards 100/s.
        let _ = run(&t, Direction::Read, 4096, 1.5);
        let later = run(&t, Direction::Read, 4096, 10.0) as f64;
        assert!(
            (later / 10.0 - 100.0).abs() < 3.0,
            "sustained {later} in 10 s"
        );
    }

    #[test]
    fn unlimited_admits_everything_and_reconfiguring_applies_at_once() {
        let t = Throttle::default();
        assert!(!t.is_limited());
        assert_eq!(run(&t, Direction::Write, 4096, 0.0), 0);
        assert_eq!(t.admit(Instant::now(), Direction::Write, 1 << 30), None);
        t.configure(&spec("write_iops_sec=50").limits(1 << 30));
        assert!(t.is_limited());
        let n = run(&t, Direction::Write, 4096, 4.0) as f64;
        assert!((n / 4.0 - 50.0).abs() < 2.0, "{n}");
        // Reads are not limited by a write limit.
        assert_eq!(t.admit(Instant::now(), Direction::Read, 4096), None);
        t.configure(&QosSpec::default().limits(1 << 30));
        assert!(!t.is_limited());
    }
}
