//! Latency histogram: log-linear buckets (64 per power of two, so every bucket is within
//! 1.6% of its values) over nanoseconds, with exact count, min, max and mean.

#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros() - SUB_BITS + 1; // >= 1
    let mantissa = (v >> (exp - 1)) - SUB; // in [0, SUB)
    (exp as u64 * SUB + mantissa) as usize
}

/// Smallest value that lands in bucket `i`.
fn lower_bound(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let exp = i / SUB;
    let mantissa = i % SUB;
    (((SUB + mantissa) as u128) << (exp - 1)).min(u64::MAX as u128) as u64
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; index(u64::MAX) + 1],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        self.buckets[index(v)] += 1;
        self.count += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding the
    /// ceil(q·n)-th smallest sample, clamped to the observed min and max.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        // The extremes are known exactly; only interior ranks need the buckets.
        if rank == 1 {
            return self.min;
        }
        if rank == self.count {
            return self.max;
        }
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let lo = lower_bound(i);
                let hi = lower_bound(i + 1).saturating_sub(1).max(lo);
                return (lo + (hi - lo) / 2).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..1_000_000u64).step_by(7).chain([u64::MAX / 2, u64::MAX]) {
            let i = index(v);
            assert!(i >= last);
            last = i;
            assert!(lower_bound(i) <= v, "v {v} bucket {i}");
            assert!(lower_bound(i + 1) > v || i + 1 > index(u64::MAX));
            if v >= SUB {
                let width = lower_bound(i + 1) - lower_bound(i);
                assert!(
                    width as f64 / v as f64 <= 1.0 / 32.0 + 1e-9,
                    "v {v} width {width}"
                );
            }
        }
    }

    #[test]
    fn quantiles_of_uniform_data() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        for (q, want) in [
            (0.5, 50_000_000.0),
            (0.9, 90_000_000.0),
            (0.99, 99_000_000.0),
            (0.999, 99_900_000.0),
        ] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.02, "q {q}: {got} vs {want}");
        }
        assert_eq!(h.count(), 100_000);
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(h.quantile(0.0), 1000);
        assert!((h.mean() - 50_000_500.0).abs() < 1.0);
    }

    #[test]
    fn merge_and_small_values() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        for v in 0..10 {
            a.record(v);
            b.record(v + 10);
        }
        a.merge(&b);
        assert_eq!(a.count(), 20);
        assert_eq!(a.quantile(0.5), 9);
        assert_eq!(a.max(), 19);
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }
}
