//! The passes over a whole row of logits that every sampled token pays for, written so the
//! compiler vectorizes them: the check that every logit is finite, the greedy pick, and the
//! `k` best candidates of top-k, found in one pass over the row rather than by listing and
//! partitioning every token of the vocabulary (152K on Qwen); with top-k off, the whole row
//! in order by a radix sort. Each gives exactly what the plain forms give: the same token,
//! the same candidates in the same order.

use std::cmp::Ordering;

/// Logits taken a block at a time: the block's best is found with vector compares, and
/// only a block that holds a candidate is looked at logit by logit.
const BLOCK: usize = 64;

/// `x`'s place in [`f32::total_cmp`]'s order, as an `i32` that orders the same way (the
/// transform `total_cmp` itself applies), so blocks compare as integers.
#[inline(always)]
fn order_key(x: f32) -> i32 {
    let b = x.to_bits() as i32;
    b ^ ((((b >> 31) as u32) >> 1) as i32)
}

/// The sampler's order of candidates: the higher logit first (by [`f32::total_cmp`]), the
/// lower token among equal logits. It is total, so the first `k` are the same whichever
/// way they are found.
pub(super) fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the `k` first of `cand` in [`by_logit_desc`]'s order (in no order).
fn keep_first(cand: &mut Vec<(u32, f32)>, k: usize) {
    if cand.len() > k {
        cand.select_nth_unstable_by(k - 1, by_logit_desc);
        cand.truncate(k);
    }
}

/// Whether top-k `k` narrows a row of `n` logits (0 and `n` or more keep every token).
pub(super) fn narrows(k: usize, n: usize) -> bool {
    k > 0 && k < n
}

/// Candidates [`top_k`] holds at most for `k`.
pub(super) fn top_k_room(k: usize) -> usize {
    2 * k + BLOCK
}

/// The `k` first (token, logit) pairs of `logits` in [`by_logit_desc`]'s order, in that
/// order, into `out`: what sorting every token that way and keeping `k` gives. `k` is at
/// least 1 and less than `logits.len()`; no allocation when `out` has room for
/// [`top_k_room`] pairs.
///
/// Once `k` candidates are held, the `k`-th is the bar: a later token (a higher id) beats
/// it only with a logit above it in the total order, so whole blocks whose best key is at
/// or below the bar are passed over. Candidates gather until there are `2k`, then the
/// best `k` are kept and the bar rises.
pub(super) fn top_k(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    debug_assert!(narrows(k, logits.len()));
    out.clear();
    // Compacted once this many are held, so at most a block more are ever held.
    let room = top_k_room(k) - BLOCK;
    let mut bar: Option<i32> = None;
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        let first = b * BLOCK;
        match bar {
            None => out.extend(
                block
                    .iter()
                    .enumerate()
                    .map(|(j, &x)| ((first + j) as u32, x)),
            ),
            Some(bar) => {
                let best = block.iter().fold(i32::MIN, |m, &x| m.max(order_key(x)));
                if best <= bar {
                    continue;
                }
                for (j, &x) in block.iter().enumerate() {
                    if order_key(x) > bar {
                        out.push(((first + j) as u32, x));
                    }
                }
            }
        }
        if out.len() >= k && (bar.is_none() || out.len() >= room) {
            keep_first(out, k);
            // The k-th kept is the worst of the k: its key is the bar.
            bar = out.iter().map(|c| order_key(c.1)).min();
        }
    }
    keep_first(out, k);
    out.sort_unstable_by(by_logit_desc);
}

/// Digits of the radix sort in [`sort_all`]: three passes cover the 32 bits of a key.
const RADIX_BITS: u32 = 11;
const RADIX: usize = 1 << RADIX_BITS;

/// Every (token, logit) pair of `logits` in [`by_logit_desc`]'s order, into `out`, with
/// `keys` and `tmp` as scratch (no allocation when each has room for the row).
///
/// A stable radix sort of the logits' order keys, least significant digit first, started
/// from the tokens in id order, so equal logits keep their ascending ids: the same order
/// as a comparison sort by [`by_logit_desc`], four to five times faster on 151,936 logits.
pub(super) fn sort_all(
    logits: &[f32],
    out: &mut Vec<(u32, f32)>,
    keys: &mut Vec<u64>,
    tmp: &mut Vec<u64>,
) {
    // The higher logit first: the total order's key made unsigned, then inverted. The
    // token id rides in the low half.
    let desc = |x: f32| !((order_key(x) as u32) ^ 0x8000_0000);
    keys.clear();
    keys.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (u64::from(desc(x)) << 32) | i as u64),
    );
    let digit = |k: u64, pass: u32| ((k >> (32 + pass * RADIX_BITS)) as usize) & (RADIX - 1);
    let mut hist = [[0u32; RADIX]; 3];
    for &k in keys.iter() {
        for (pass, h) in (0u32..).zip(hist.iter_mut()) {
            h[digit(k, pass)] += 1;
        }
    }
    tmp.clear();
    tmp.resize(keys.len(), 0);
    for (pass, h) in (0u32..).zip(&hist) {
        // A digit that every key shares moves nothing.
        if h.iter().any(|&c| c as usize == keys.len()) {
            continue;
        }
        let mut at = [0u32; RADIX];
        let mut sum = 0;
        for (a, &c) in at.iter_mut().zip(h) {
            *a = sum;
            sum += c;
        }
        for &k in keys.iter() {
            let b = digit(k, pass);
            tmp[at[b] as usize] = k;
            at[b] += 1;
        }
        std::mem::swap(keys, tmp);
    }
    out.clear();
    out.extend(keys.iter().map(|&k| {
        let token = k as u32;
        (token, logits[token as usize])
    }));
}

/// The token of the highest logit; the lowest id wins a tie, and a row of nothing above
/// −∞ (or only NaN) gives token 0.
pub fn argmax(logits: &[f32]) -> u32 {
    // Sixteen running maxima, one per lane (a NaN never replaces one), then the first
    // logit equal to their maximum: the first of the largest, as a scan that keeps the
    // strictly greater would find.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut blocks = logits.chunks_exact(16);
    for c in &mut blocks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let best = blocks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if best == f32::NEG_INFINITY {
        return 0;
    }
    first_where(logits, |x| x == best).unwrap_or(0) as u32
}

/// The first logit that is not a finite number, with its index.
pub(super) fn first_non_finite(logits: &[f32]) -> Option<(usize, f32)> {
    first_where(logits, |x| !x.is_finite()).map(|i| (i, logits[i]))
}

/// The index of the first logit for which `hit` holds: a block at a time without branches
/// (vectorized), the index looked for only in the block that has one.
#[inline(always)]
fn first_where(logits: &[f32], hit: impl Fn(f32) -> bool) -> Option<usize> {
    let (b, block) = logits
        .chunks(BLOCK)
        .enumerate()
        .find(|(_, c)| c.iter().fold(false, |any, &x| any | hit(x)))?;
    let j = block.iter().position(|&x| hit(x))?;
    Some(b * BLOCK + j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferno_tensor::test_rng::TestRng;

    /// Every token listed, sorted, the first `k` kept: what [`top_k`] must equal.
    fn top_k_by_sorting(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .copied()
            .enumerate()
            .map(|(i, l)| (i as u32, l))
            .collect();
        all.sort_by(by_logit_desc);
        all.truncate(k);
        all
    }

    fn argmax_by_scan(logits: &[f32]) -> u32 {
        let mut best = (0u32, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            if l > best.1 {
                best = (i as u32, l);
            }
        }
        best.0
    }

    /// Rows with few distinct values (many ties), masked tokens (−∞), signed zeros and, in
    /// some, ascending runs (every block beats the bar) and NaN.
    fn rows(rng: &mut TestRng) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for n in [1usize, 2, 15, 16, 17, 63, 64, 65, 200, 1000, 5003] {
            let levels = [
                f32::NEG_INFINITY,
                -0.0,
                0.0,
                1.0,
                2.5,
                -3.0,
                7.0,
                1e30,
                -1e30,
            ];
            let ties: Vec<f32> = (0..n).map(|_| levels[rng.below(levels.len())]).collect();
            let wide: Vec<f32> = (0..n)
                .map(|_| rng.below(1 << 20) as f32 / (1 << 15) as f32 - 16.0)
                .collect();
            let rising: Vec<f32> = (0..n).map(|i| i as f32 * 0.01 - 3.0).collect();
            let mut masked = wide.clone();
            for x in masked.iter_mut() {
                if rng.below(4) > 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
            let mut nan = wide.clone();
            nan[rng.below(n)] = f32::NAN;
            nan[rng.below(n)] = -f32::NAN;
            out.extend([ties, wide, rising, masked, nan]);
        }
        out
    }

    #[test]
    fn top_k_in_one_pass_is_sorting_every_token() {
        let mut rng = TestRng::new(11);
        for row in rows(&mut rng) {
            let n = row.len();
            for k in [1, 2, 3, 40, 63, 64, 65, 500, n.saturating_sub(1)] {
                if k == 0 || k >= n {
                    continue;
                }
                let mut out = Vec::with_capacity(top_k_room(k));
                top_k(&row, k, &mut out);
                assert!(out.capacity() <= top_k_room(k), "n {n}, k {k}: grew");
                let want = top_k_by_sorting(&row, k);
                let bits =
                    |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "n {n}, k {k}");
            }
        }
    }

    #[test]
    fn the_radix_sort_is_sorting_by_logit_then_token() {
        let mut rng = TestRng::new(13);
        let (mut out, mut keys, mut tmp) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows(&mut rng) {
            sort_all(&row, &mut out, &mut keys, &mut tmp);
            let want = top_k_by_sorting(&row, row.len());
            let bits =
                |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "n {}", row.len());
        }
    }

    #[test]
    fn argmax_is_the_first_of_the_largest() {
        let mut rng = TestRng::new(12);
        for row in rows(&mut rng) {
            assert_eq!(argmax(&row), argmax_by_scan(&row), "{row:?}");
        }
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN]), 0);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, 1.0]), 1);
    }

    #[test]
    fn non_finite_logits_are_found_first_by_index() {
        let mut row = vec![0.5f32; 300];
        assert_eq!(first_non_finite(&row), None);
        row[250] = f32::INFINITY;
        row[130] = f32::NAN;
        let (i, x) = first_non_finite(&row).unwrap();
        assert_eq!(i, 130);
        assert!(x.is_nan());
        assert_eq!(first_non_finite(&[]), None);
    }
}
