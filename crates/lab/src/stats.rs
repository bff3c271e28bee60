//! Summary statistics over repeats: median, min, max, and ratios against a baseline.

/// Median of a non-empty sample (mean of the middle two for even sizes).
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

pub fn summarize(xs: &[f64]) -> Option<Summary> {
    let m = median(xs)?;
    let finite = xs.iter().copied().filter(|x| x.is_finite());
    Some(Summary {
        median: m,
        min: finite.clone().fold(f64::INFINITY, f64::min),
        max: finite.clone().fold(f64::NEG_INFINITY, f64::max),
        n: finite.count(),
    })
}

/// `value / baseline`, or None when the baseline is zero or missing.
pub fn ratio(value: f64, baseline: Option<f64>) -> Option<f64> {
    baseline.filter(|b| *b != 0.0).map(|b| value / b)
}

/// Pairs each of `runs` with the run in `base` of the same repeat, and gives the ratio
/// of `figure` within each pair whose two figures are known (the baseline's non-zero).
/// Repeats are interleaved, so a pair's two runs are seconds apart and share the
/// host's state, which drifts by tens of percent over minutes on a VM: the median of
/// these ratios holds where the ratio of two medians can differ by the drift.
pub fn paired_ratios<R>(
    runs: &[&R],
    base: &[&R],
    repeat: fn(&R) -> usize,
    figure: impl Fn(&R) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| {
            let b = base.iter().find(|b| repeat(b) == repeat(r))?;
            ratio(figure(r)?, figure(b))
        })
        .collect()
}

/// Percentage change from `old` to `new`.
pub fn pct_change(old: f64, new: f64) -> Option<f64> {
    (old != 0.0).then(|| (new - old) / old * 100.0)
}

/// Jain's fairness index over `xs` (what each of several shares carried): 1 when all
/// carried the same, 1/n when one carried everything; None for fewer than two, or
/// nothing carried.
pub fn jain(xs: &[f64]) -> Option<f64> {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    (xs.len() > 1 && sq > 0.0).then(|| sum * sum / (xs.len() as f64 * sq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn summaries_and_ratios() {
        let s = summarize(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 5.0, 3));
        assert_eq!(ratio(6.0, Some(2.0)), Some(3.0));
        assert_eq!(ratio(6.0, Some(0.0)), None);
        assert_eq!(ratio(6.0, None), None);
        assert_eq!(pct_change(100.0, 110.0), Some(10.0));
        assert_eq!(pct_change(0.0, 1.0), None);
    }
}
