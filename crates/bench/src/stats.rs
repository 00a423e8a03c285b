//! The percentile bootstrap of the median: the one statistic `fio-samples`
//! reports (a median with a confidence interval over repeated short runs).
//!
//! Invariants:
//! - Deterministic: the same samples (in the same order), `resamples`,
//!   `confidence` and `seed` always give the identical estimate. The
//!   generator is `rand`'s `StdRng` seeded with `seed_from_u64`; its stream is
//!   fixed for the `rand` version in `Cargo.lock`.
//! - Never panics on any input. Non-finite samples (NaN, ±∞) are ignored and
//!   `samples` counts the finite ones used; `confidence` is clamped into
//!   `[0, 1]` (NaN counts as 0) and recorded as used.
//! - No data, no number: with no finite sample the median and the interval
//!   are NaN; with `resamples == 0` the median is exact and the interval NaN.
//!   With one sample every resample equals it, so the interval has zero width.
//! - Whenever the interval is defined, `min(samples) <= ci_low <= ci_high <=
//!   max(samples)`. It contains the median at the usual confidence levels
//!   (tested at 95%); at very low levels it may not, as the percentile
//!   bootstrap does not force it to.
//!
//! Note for callers persisting the result: `serde_json` writes NaN as `null`,
//! which an `f64` field cannot read back, so record an estimate only when
//! `samples > 0 && resamples > 0`.

use crate::model::BootstrapEstimate;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The median of `samples` with a percentile-bootstrap confidence interval.
///
/// Draws `resamples` resamples of `samples.len()` values with replacement,
/// takes the median of each (the mean of the two middle values for an even
/// count), and returns the `(1 - confidence) / 2` and `(1 + confidence) / 2`
/// percentiles of those medians as `ci_low` and `ci_high`. Percentiles use
/// linear interpolation between closest ranks (Hyndman–Fan type 7, numpy's
/// default). See the module documentation for edge cases.
pub fn bootstrap_median(
    samples: &[f64],
    resamples: usize,
    confidence: f64,
    seed: u64,
) -> BootstrapEstimate {
    let confidence = if confidence.is_nan() {
        0.0
    } else {
        confidence.clamp(0.0, 1.0)
    };
    let mut finite: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    let mut estimate = BootstrapEstimate {
        median: f64::NAN,
        ci_low: f64::NAN,
        ci_high: f64::NAN,
        confidence,
        samples: finite.len(),
        resamples,
        seed,
    };
    if finite.is_empty() {
        return estimate;
    }
    estimate.median = median_in_place(&mut finite);
    if resamples == 0 {
        return estimate;
    }
    let mut medians = resampled_medians(&finite, resamples, seed);
    medians.sort_unstable_by(f64::total_cmp);
    estimate.ci_low = percentile_of_sorted(&medians, (1.0 - confidence) / 2.0);
    estimate.ci_high = percentile_of_sorted(&medians, (1.0 + confidence) / 2.0);
    estimate
}

/// The medians of `resamples` bootstrap resamples of `values` (non-empty,
/// finite), in drawing order.
fn resampled_medians(values: &[f64], resamples: usize, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = values.len();
    let mut resample = Vec::with_capacity(n);
    let mut medians = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        resample.clear();
        resample.extend((0..n).map(|_| values[rng.gen_range(0..n)]));
        medians.push(median_in_place(&mut resample));
    }
    medians
}

/// The median of non-empty `values` (reorders them): the middle value, or the
/// mean of the two middle values for an even count.
fn median_in_place(values: &mut [f64]) -> f64 {
    let n = values.len();
    debug_assert!(n > 0, "median of no values");
    let mid = n / 2;
    let (lower, upper_middle, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    let upper_middle = *upper_middle;
    if n % 2 == 1 {
        return upper_middle;
    }
    let lower_middle = lower
        .iter()
        .copied()
        .max_by(f64::total_cmp)
        .unwrap_or(upper_middle);
    lower_middle + (upper_middle - lower_middle) / 2.0
}

/// The `p`-quantile (`p` in `[0, 1]`) of non-empty ascending `sorted`, by
/// linear interpolation between closest ranks (type 7).
fn percentile_of_sorted(sorted: &[f64], p: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return f64::NAN;
    };
    let rank = p.clamp(0.0, 1.0) * last as f64;
    let below = rank.floor() as usize;
    let above = rank.ceil() as usize;
    let (low, high) = (sorted[below.min(last)], sorted[above.min(last)]);
    low + (rank - below as f64) * (high - low)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: u64 = 0x5eed_ba5a17;

    fn frequency(medians: &[f64], value: f64) -> f64 {
        medians.iter().filter(|&&m| m == value).count() as f64 / medians.len() as f64
    }

    /// Binomial coefficient as f64 (small arguments only).
    fn choose(n: u64, k: u64) -> f64 {
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    }

    /// Exact bootstrap CDF of the median of an odd-sized sample at its k-th
    /// smallest value (1-based, distinct values): a resample's median is at
    /// most x_(k) iff at least (n+1)/2 of its n draws land on the k smallest,
    /// each draw doing so with probability k/n.
    fn exact_median_cdf(n: u64, k: u64) -> f64 {
        let p = k as f64 / n as f64;
        (n.div_ceil(2)..=n)
            .map(|j| choose(n, j) * p.powi(j as i32) * (1.0 - p).powi((n - j) as i32))
            .sum()
    }

    #[test]
    fn constant_samples_give_a_zero_width_interval() {
        let estimate = bootstrap_median(&[7.5; 40], 10_000, 0.95, SEED);
        assert_eq!(estimate.median, 7.5);
        assert_eq!(estimate.ci_low, 7.5);
        assert_eq!(estimate.ci_high, 7.5);
        assert_eq!(estimate.samples, 40);
        assert_eq!(estimate.resamples, 10_000);
        assert_eq!(estimate.confidence, 0.95);
        assert_eq!(estimate.seed, SEED);
    }

    #[test]
    fn no_samples_give_nan_and_do_not_panic() {
        let estimate = bootstrap_median(&[], 10_000, 0.95, SEED);
        assert_eq!(estimate.samples, 0);
        assert!(estimate.median.is_nan());
        assert!(estimate.ci_low.is_nan() && estimate.ci_high.is_nan());
    }

    #[test]
    fn one_sample_is_its_own_median_with_zero_width() {
        let estimate = bootstrap_median(&[42.0], 1_000, 0.95, SEED);
        assert_eq!(
            (estimate.median, estimate.ci_low, estimate.ci_high),
            (42.0, 42.0, 42.0)
        );
        assert_eq!(estimate.samples, 1);
    }

    #[test]
    fn zero_resamples_give_the_exact_median_and_no_interval() {
        let estimate = bootstrap_median(&[3.0, 1.0, 2.0], 0, 0.95, SEED);
        assert_eq!(estimate.median, 2.0);
        assert!(estimate.ci_low.is_nan() && estimate.ci_high.is_nan());
    }

    #[test]
    fn non_finite_samples_are_ignored_and_confidence_is_clamped() {
        let estimate = bootstrap_median(
            &[f64::NAN, 1.0, f64::INFINITY, 3.0, 2.0, f64::NEG_INFINITY],
            500,
            1.7,
            SEED,
        );
        assert_eq!(estimate.samples, 3);
        assert_eq!(estimate.median, 2.0);
        assert_eq!(estimate.confidence, 1.0);
        // Confidence 1: the interval spans the extreme resampled medians.
        assert_eq!((estimate.ci_low, estimate.ci_high), (1.0, 3.0));
        assert_eq!(bootstrap_median(&[1.0], 10, f64::NAN, SEED).confidence, 0.0);
        assert_eq!(bootstrap_median(&[1.0], 10, -0.5, SEED).confidence, 0.0);
    }

    #[test]
    fn even_count_median_is_the_mean_of_the_middle_values() {
        assert_eq!(median_in_place(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median_in_place(&mut [10.0, 20.0]), 15.0);
        assert_eq!(median_in_place(&mut [5.0]), 5.0);
    }

    #[test]
    fn percentiles_interpolate_between_closest_ranks() {
        let sorted = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile_of_sorted(&sorted, 0.0), 1.0);
        assert_eq!(percentile_of_sorted(&sorted, 1.0), 5.0);
        assert_eq!(percentile_of_sorted(&sorted, 0.5), 3.0);
        assert_eq!(percentile_of_sorted(&sorted, 0.125), 1.5);
        assert!(percentile_of_sorted(&[], 0.5).is_nan());
    }

    /// Two samples {10, 20}: a resample is {10,10}, {20,20} (¼ each) or
    /// mixed (½), so its median is 10, 20 (¼ each) or 15 (½).
    #[test]
    fn two_samples_match_their_exact_bootstrap_distribution() {
        let medians = resampled_medians(&[10.0, 20.0], 40_000, SEED);
        // 40 000 draws: the standard error of a frequency is at most 0.0025.
        assert!((frequency(&medians, 10.0) - 0.25).abs() < 0.0125);
        assert!((frequency(&medians, 15.0) - 0.50).abs() < 0.0125);
        assert!((frequency(&medians, 20.0) - 0.25).abs() < 0.0125);
        assert_eq!(
            frequency(&medians, 10.0) + frequency(&medians, 15.0) + frequency(&medians, 20.0),
            1.0
        );

        let wide = bootstrap_median(&[10.0, 20.0], 40_000, 0.95, SEED);
        assert_eq!((wide.median, wide.ci_low, wide.ci_high), (15.0, 10.0, 20.0));
        // The 30th and 70th percentiles both fall in the ½ mass at 15.
        let narrow = bootstrap_median(&[10.0, 20.0], 40_000, 0.4, SEED);
        assert_eq!((narrow.ci_low, narrow.ci_high), (15.0, 15.0));
    }

    /// {3, 1, 4, 1, 5}: enumerating all 5^5 resamples (cross-checked in
    /// Python) gives P(median = 1) = 992/3125, P(3) = 1141/3125,
    /// P(4) = 811/3125, P(5) = 181/3125; the binomial formula agrees.
    #[test]
    fn five_samples_match_their_exact_bootstrap_distribution() {
        let samples = [3.0, 1.0, 4.0, 1.0, 5.0];
        let exact = [
            (1.0, 992.0 / 3125.0),
            (3.0, 1141.0 / 3125.0),
            (4.0, 811.0 / 3125.0),
            (5.0, 181.0 / 3125.0),
        ];
        // Sorted samples 1,1,3,4,5: the CDF at 1 counts the two smallest, at 3 three, at 4 four.
        assert!((exact_median_cdf(5, 2) - exact[0].1).abs() < 1e-12);
        assert!((exact_median_cdf(5, 3) - (exact[0].1 + exact[1].1)).abs() < 1e-12);
        assert!((exact_median_cdf(5, 4) - (1.0 - exact[3].1)).abs() < 1e-12);

        let medians = resampled_medians(&samples, 40_000, SEED);
        for (value, probability) in exact {
            let observed = frequency(&medians, value);
            assert!(
                (observed - probability).abs() < 0.0125,
                "P(median = {value}) observed {observed}, exact {probability}"
            );
        }

        // Percentile bounds, with every boundary at least 0.06 from a CDF step.
        let estimate = |confidence| {
            let e = bootstrap_median(&samples, 40_000, confidence, SEED);
            (e.median, e.ci_low, e.ci_high)
        };
        assert_eq!(estimate(0.95), (3.0, 1.0, 5.0));
        assert_eq!(estimate(0.5), (3.0, 1.0, 4.0));
        assert_eq!(estimate(0.2), (3.0, 3.0, 3.0));
    }

    #[test]
    fn interval_contains_the_median_and_is_ordered() {
        let mut rng = StdRng::seed_from_u64(7);
        for case in 0..50u64 {
            let n = rng.gen_range(1..60);
            let samples: Vec<f64> = (0..n).map(|_| rng.gen_range(100.0..5_000.0)).collect();
            let e = bootstrap_median(&samples, 2_000, 0.95, case);
            assert!(
                e.ci_low <= e.median && e.median <= e.ci_high,
                "case {case}: {e:?}"
            );
            let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
            let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(min <= e.ci_low && e.ci_high <= max, "case {case}: {e:?}");
        }
    }

    #[test]
    fn same_inputs_and_seed_give_identical_estimates() {
        let samples: Vec<f64> = (0..40).map(|i| ((i * 37) % 101) as f64 * 1.5).collect();
        let first = bootstrap_median(&samples, 10_000, 0.95, 1234);
        let second = bootstrap_median(&samples, 10_000, 0.95, 1234);
        assert_eq!(first, second);
        assert_eq!(
            resampled_medians(&samples, 100, 1234),
            resampled_medians(&samples, 100, 1234)
        );
        assert_ne!(
            resampled_medians(&samples, 100, 1234),
            resampled_medians(&samples, 100, 1235),
            "a different seed draws different resamples"
        );
    }
}
