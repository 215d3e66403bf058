//! Quantizers from f32 to the K-quant weight formats Q4_K, Q5_K and Q6_K (the layouts are
//! described in [`super::k_quants`], whose dequantizers define what the bytes mean).
//!
//! Each sub-block's scale (and, for Q4_K/Q5_K, its offset) is found by a small search that
//! minimises a weighted squared error, the method llama.cpp's reference quantizers use:
//! candidate step sizes around `range / nmax` are tried, and for each one the levels it
//! rounds to give a least-squares scale and offset. The per-sub-block scales are then
//! themselves quantized to 6 bits (Q4_K/Q5_K) or 8 bits (Q6_K) against one f16 super-block
//! scale, which moves them slightly. Where the reference stops there (re-rounding the
//! values to the stored codes), a last pass here also tries, per sub-block, the codes'
//! neighbours, the codes of a least-squares refit to the chosen levels and (Q4_K/Q5_K) a
//! zero min, and, per super-block, three f16 scales; it keeps whatever reconstructs the
//! block with the least plain squared error. The result is deterministic: no step depends
//! on the build or the thread count.

use super::k_quants::{round_ties_even_small, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK};
use super::{GgmlType, TensorError};
use half::f16;

/// Below this every value of a group is treated as zero (as the reference does), so the
/// scale search never divides by a vanishing maximum.
const GROUP_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, for the magnitudes the searches produce (|y| < 2²²);
/// non-finite inputs are rejected before any block is quantized.
#[inline]
fn rnd(y: f32) -> i32 {
    round_ties_even_small(y) as i32
}

/// The largest and smallest values by plain comparison (the first of equal values wins).
/// `f32::max`/`min` may return either zero for ±0, and which one can differ between
/// optimisation levels; that sign reaches the stored f16 fields, and the output must not
/// depend on how the crate was built.
fn largest(x: &[f32]) -> f32 {
    x.iter().fold(x[0], |m, &v| if v > m { v } else { m })
}

fn smallest(x: &[f32]) -> f32 {
    x.iter().fold(x[0], |m, &v| if v < m { v } else { m })
}

/// Errors unless `x` fills whole super-blocks, `out` holds exactly their bytes and every
/// value is finite (a NaN or infinity would silently become a zero block otherwise).
fn check(dtype: GgmlType, x: &[f32], out: &[u8], block_bytes: usize) -> Result<(), TensorError> {
    if !x.len().is_multiple_of(QK) {
        return Err(TensorError::PartialBlock { dtype, n: x.len() });
    }
    let expected = x.len() / QK * block_bytes;
    if out.len() != expected {
        return Err(TensorError::SizeMismatch {
            dtype,
            n: x.len(),
            expected,
            got: out.len(),
        });
    }
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(TensorError::NonFinite { dtype, index });
    }
    Ok(())
}

/// Quantizes `x` (a multiple of 256 values) to Q4_K blocks in `out`.
pub fn quantize_q4_k(x: &[f32], out: &mut [u8]) -> Result<(), TensorError> {
    check(GgmlType::Q4_K, x, out, Q4_K_BYTES)?;
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        let b = offset_block(xb, 15, -1.0, 20);
        ob[..2].copy_from_slice(&b.d.to_le_bytes());
        ob[2..4].copy_from_slice(&b.dmin.to_le_bytes());
        super::k_quants::pack_scale_min_k4(&b.sc, &b.m, &mut ob[4..16]);
        let qs = &mut ob[16..144];
        qs.fill(0);
        for (e, &l) in b.levels.iter().enumerate() {
            // 64-value chunks: the first 32 in the low nibbles, the next 32 in the high.
            qs[e / 64 * 32 + e % 32] |= (l & 0x0f) << (4 * ((e / 32) % 2));
        }
    }
    Ok(())
}

/// Quantizes `x` (a multiple of 256 values) to Q5_K blocks in `out`.
pub fn quantize_q5_k(x: &[f32], out: &mut [u8]) -> Result<(), TensorError> {
    check(GgmlType::Q5_K, x, out, Q5_K_BYTES)?;
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q5_K_BYTES)) {
        let b = offset_block(xb, 31, -0.5, 15);
        ob[..2].copy_from_slice(&b.d.to_le_bytes());
        ob[2..4].copy_from_slice(&b.dmin.to_le_bytes());
        super::k_quants::pack_scale_min_k4(&b.sc, &b.m, &mut ob[4..16]);
        let (qh, qs) = ob[16..176].split_at_mut(32);
        qh.fill(0);
        qs.fill(0);
        for (e, &l) in b.levels.iter().enumerate() {
            qs[e / 64 * 32 + e % 32] |= (l & 0x0f) << (4 * ((e / 32) % 2));
            qh[e % 32] |= (l >> 4) << (e / 32);
        }
    }
    Ok(())
}

/// Quantizes `x` (a multiple of 256 values) to Q6_K blocks in `out`.
pub fn quantize_q6_k(x: &[f32], out: &mut [u8]) -> Result<(), TensorError> {
    check(GgmlType::Q6_K, x, out, Q6_K_BYTES)?;
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q6_K_BYTES)) {
        let (d, sc, levels) = symmetric_block(xb);
        let (ql, rest) = ob.split_at_mut(128);
        let (qh, rest) = rest.split_at_mut(64);
        ql.fill(0);
        qh.fill(0);
        for (e, &l) in levels.iter().enumerate() {
            // Stored unsigned (level + 32); per 128-value half, `ql` takes the low nibble
            // (values 0–63 low, 64–127 high) and `qh` the top two bits (pair `i / 32`).
            let u = (l + 32) as u8;
            let (h, i) = (e / 128, e % 128);
            ql[h * 64 + i % 64] |= (u & 0x0f) << (4 * (i / 64));
            qh[h * 32 + i % 32] |= (u >> 4) << (2 * (i / 32));
        }
        for (o, &s) in rest[..16].iter_mut().zip(&sc) {
            *o = s as u8;
        }
        rest[16..18].copy_from_slice(&d.to_le_bytes());
    }
    Ok(())
}

/// A Q4_K/Q5_K super-block before packing: f16 bits of `d` and `dmin`, the 6-bit scales and
/// mins, and each value's level (`x ≈ d·sc·l − dmin·m`).
struct OffsetBlock {
    d: u16,
    dmin: u16,
    sc: [u8; 8],
    m: [u8; 8],
    levels: [u8; QK],
}

/// Chooses a Q4_K (`nmax` 15) or Q5_K (`nmax` 31) super-block for 256 values. `first` and
/// `steps` set the search: step counts `nmax + first + 0.1·k` for `k` in `0..=steps`.
fn offset_block(x: &[f32], nmax: u8, first: f32, steps: usize) -> OffsetBlock {
    let mut scale = [0f32; 8];
    let mut offset = [0f32; 8];
    for (j, xs) in x.chunks_exact(32).enumerate() {
        // Weight each value by the sub-block's RMS plus its own magnitude, so large
        // values (which carry most of a dot product) are fitted more closely.
        let rms = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let mut w = [0f32; 32];
        for (wi, &v) in w.iter_mut().zip(xs) {
            *wi = rms + v.abs();
        }
        (scale[j], offset[j]) = fit_offset(xs, &w, nmax, first, steps);
    }
    // Both are ≥ 0 by construction; `+ 0.0` turns a −0 into +0 (see `largest`).
    let max_scale = largest(&scale).max(0.0) + 0.0;
    let max_offset = largest(&offset).max(0.0) + 0.0;
    let dmin = f16::from_f32(max_offset / 63.0);
    // The plain choice puts the largest sub-block scale at 63; a slightly larger or
    // smaller super-block scale can suit the other seven better, so a few are tried.
    let mut best: Option<(f32, OffsetBlock)> = None;
    for f in [1.0f32, 0.98, 1.02] {
        let d = f16::from_f32(max_scale * f / 63.0);
        let mut b = OffsetBlock {
            d: d.to_bits(),
            dmin: dmin.to_bits(),
            sc: [0; 8],
            m: [0; 8],
            levels: [0; QK],
        };
        let mut total = 0f32;
        for (j, xs) in x.chunks_exact(32).enumerate() {
            let lv = &mut b.levels[j * 32..(j + 1) * 32];
            let (err, s, m) =
                refine_offset(xs, d.to_f32(), dmin.to_f32(), scale[j], offset[j], nmax, lv);
            (b.sc[j], b.m[j]) = (s, m);
            total += err;
        }
        if best.as_ref().is_none_or(|(e, _)| total < *e) {
            best = Some((total, b));
        }
    }
    best.map(|(_, b)| b).unwrap_or(OffsetBlock {
        d: 0,
        dmin: 0,
        sc: [0; 8],
        m: [0; 8],
        levels: [0; QK],
    })
}

/// The stored 6-bit scale and min of one sub-block, given the super-block's `d` and `dmin`
/// and the sub-block's fitted `scale` and `offset`: the nearest codes, then whichever of
/// their neighbours, and of the codes nearest a least-squares refit of `(scale, offset)`
/// to the levels chosen so far, reconstructs `xs` with the least squared error. Writes the
/// levels to `lv`; returns `(error, scale code, min code)`.
fn refine_offset(
    xs: &[f32],
    d: f32,
    dmin: f32,
    scale: f32,
    offset: f32,
    nmax: u8,
    lv: &mut [u8],
) -> (f32, u8, u8) {
    let code = |v: f32, unit: f32| -> i32 {
        if unit > 0.0 {
            rnd(v / unit).clamp(0, 63)
        } else {
            0
        }
    };
    let mut tmp = [0u8; 32];
    let eval =
        |s: i32, m: i32, out: &mut [u8]| round_offset(xs, d * s as f32, dmin * m as f32, nmax, out);
    let (s0, m0) = (code(scale, d), code(offset, dmin));
    let mut best = (eval(s0, m0, lv), s0, m0);
    let mut try_codes = |s: i32, m: i32, best: &mut (f32, i32, i32), lv: &mut [u8]| {
        if (0..=63).contains(&s) && (0..=63).contains(&m) && (s, m) != (best.1, best.2) {
            let err = eval(s, m, &mut tmp);
            if err < best.0 {
                *best = (err, s, m);
                lv.copy_from_slice(&tmp);
            }
        }
    };
    for (ds, dm) in [
        (-1, 0),
        (1, 0),
        (0, -1),
        (0, 1),
        (-1, -1),
        (1, 1),
        (-1, 1),
        (1, -1),
    ] {
        try_codes(s0 + ds, m0 + dm, &mut best, lv);
    }
    // No offset, or nothing at all: better when `d` or `dmin` is so coarse (an f16
    // subnormal) that every non-zero code overshoots.
    try_codes(best.1, 0, &mut best, lv);
    try_codes(0, 0, &mut best, lv);
    // Least squares of x on (l, −1) for the current levels, twice (the levels move).
    for _ in 0..2 {
        let (n, sl, sll, sx, sxl) = lv.iter().zip(xs).fold(
            (0f32, 0f32, 0f32, 0f32, 0f32),
            |(n, sl, sll, sx, sxl), (&l, &v)| {
                let l = l as f32;
                (n + 1.0, sl + l, sll + l * l, sx + v, sxl + l * v)
            },
        );
        let det = n * sll - sl * sl;
        if det <= 0.0 {
            break;
        }
        let a = (n * sxl - sl * sx) / det;
        let off = ((sl * sxl - sll * sx) / det).max(0.0);
        let (s, m) = (code(a, d), code(off, dmin));
        try_codes(s, m, &mut best, lv);
    }
    (best.0, best.1 as u8, best.2 as u8)
}

/// Levels of `xs` for step `step` and offset `off` (`x ≈ step·l − off`), clamped to
/// `0..=nmax`, and the squared error of that reconstruction. A zero step stores level 0.
fn round_offset(xs: &[f32], step: f32, off: f32, nmax: u8, lv: &mut [u8]) -> f32 {
    let mut err = 0f32;
    for (l, &v) in lv.iter_mut().zip(xs) {
        let q = if step != 0.0 {
            rnd((v + off) / step).clamp(0, nmax as i32)
        } else {
            0
        };
        *l = q as u8;
        let e = step * q as f32 - off - v;
        err += e * e;
    }
    err
}

/// Fits `x ≈ scale·l − offset` with integer `l` in `0..=nmax`, `scale ≥ 0`, `offset ≥ 0`,
/// minimising `Σ w·(scale·l − offset − x)²`. Returns `(scale, offset)`.
fn fit_offset(x: &[f32], w: &[f32], nmax: u8, first: f32, steps: usize) -> (f32, f32) {
    let n = nmax as f32;
    // The offset only ever moves the range down to include zero: an all-positive group is
    // fitted from 0, since a positive offset would waste the format's (non-negative) min.
    let (lo, hi) = (smallest(x).min(0.0) + 0.0, largest(x));
    if hi == lo {
        return (0.0, 0.0 - lo);
    }
    let (sw, swx) = x
        .iter()
        .zip(w)
        .fold((0f32, 0f32), |(a, b), (&v, &wi)| (a + wi, b + wi * v));
    let level = |v: f32, inv: f32| rnd(inv * (v - lo)).clamp(0, nmax as i32) as f32;
    // Starting point: the plain min/max fit.
    let (mut scale, mut min) = ((hi - lo) / n, lo);
    let mut best = {
        let inv = n / (hi - lo);
        x.iter()
            .zip(w)
            .map(|(&v, &wi)| {
                let e = scale * level(v, inv) + min - v;
                wi * e * e
            })
            .sum::<f32>()
    };
    for k in 0..=steps {
        let inv = (n + first + 0.1 * k as f32) / (hi - lo);
        let (mut sl, mut sll, mut sxl) = (0f32, 0f32, 0f32);
        for (&v, &wi) in x.iter().zip(w) {
            let l = level(v, inv);
            sl += wi * l;
            sll += wi * l * l;
            sxl += wi * l * v;
        }
        // Weighted least squares of x on (l, 1); a positive intercept is not storable, so
        // then the fit is redone through the origin.
        let det = sw * sll - sl * sl;
        if det <= 0.0 {
            continue;
        }
        let (mut s, mut m) = ((sw * sxl - swx * sl) / det, (sll * swx - sl * sxl) / det);
        if m > 0.0 {
            m = 0.0;
            s = sxl / sll;
        }
        let err: f32 = x
            .iter()
            .zip(w)
            .map(|(&v, &wi)| {
                let e = s * level(v, inv) + m - v;
                wi * e * e
            })
            .sum();
        if err < best {
            (best, scale, min) = (err, s, m);
        }
    }
    // `0 − min` rather than `−min`: a zero offset is then +0 whatever the sign of `min`.
    (scale, 0.0 - min)
}

/// Chooses a Q6_K super-block for 256 values: f16 bits of `d`, the sixteen signed 8-bit
/// scales and each value's level in `-32..=31` (`x ≈ d·sc·l`).
fn symmetric_block(x: &[f32]) -> (u16, [i8; 16], [i8; QK]) {
    let mut scale = [0f32; 16];
    for (g, xs) in x.chunks_exact(16).enumerate() {
        scale[g] = fit_symmetric(xs);
    }
    let levels = [0i8; QK];
    let (mut max_abs, mut max) = (0f32, 0f32);
    for &s in &scale {
        if s.abs() > max_abs {
            (max_abs, max) = (s.abs(), s);
        }
    }
    if max_abs < GROUP_EPS {
        return (0, [0; 16], levels);
    }
    // The largest scale maps to −128, the end of the i8 range with the most room; slightly
    // finer or coarser super-block scales are tried as well, as for Q4_K.
    let mut best: Option<(f32, u16, [i8; 16], [i8; QK])> = None;
    for f in [1.0f32, 0.99, 1.01] {
        let d = f16::from_f32(-max * f / 128.0);
        let df = d.to_f32();
        if df == 0.0 {
            continue;
        }
        let mut sc = [0i8; 16];
        let mut lv = [0i8; QK];
        let mut total = 0f32;
        for (g, xs) in x.chunks_exact(16).enumerate() {
            let out = &mut lv[g * 16..(g + 1) * 16];
            let (err, s) = refine_symmetric(xs, df, scale[g], out);
            sc[g] = s;
            total += err;
        }
        if best.as_ref().is_none_or(|b| total < b.0) {
            best = Some((total, d.to_bits(), sc, lv));
        }
    }
    match best {
        Some((_, d, sc, lv)) => (d, sc, lv),
        // Scales so small that d is zero in f16: nothing is representable but zero.
        None => (0, [0; 16], levels),
    }
}

/// The stored 8-bit scale of one Q6_K group for super-block scale `d`: the code nearest
/// `scale`, its neighbours, or the code nearest the least-squares scale of the levels,
/// whichever reconstructs `xs` best. Writes the levels; returns `(error, code)`.
fn refine_symmetric(xs: &[f32], d: f32, scale: f32, lv: &mut [i8]) -> (f32, i8) {
    let code = |v: f32| rnd(v / d).clamp(-128, 127);
    let s0 = code(scale);
    let mut tmp = [0i8; 16];
    let mut best = (round_symmetric(xs, d * s0 as f32, lv), s0);
    let mut try_code = |s: i32, best: &mut (f32, i32), lv: &mut [i8]| {
        if (-128..=127).contains(&s) && s != best.1 {
            let err = round_symmetric(xs, d * s as f32, &mut tmp);
            if err < best.0 {
                *best = (err, s);
                lv.copy_from_slice(&tmp);
            }
        }
    };
    try_code(s0 - 1, &mut best, lv);
    try_code(s0 + 1, &mut best, lv);
    for _ in 0..2 {
        let (sxl, sll) = lv.iter().zip(xs).fold((0f32, 0f32), |(a, b), (&l, &v)| {
            (a + l as f32 * v, b + (l as f32) * (l as f32))
        });
        if sll <= 0.0 {
            break;
        }
        try_code(code(sxl / sll), &mut best, lv);
    }
    (best.0, best.1 as i8)
}

/// Levels of `xs` for step `step` (`x ≈ step·l`, `l` in `-32..=31`) and the squared error.
fn round_symmetric(xs: &[f32], step: f32, lv: &mut [i8]) -> f32 {
    let mut err = 0f32;
    for (l, &v) in lv.iter_mut().zip(xs) {
        let q = if step != 0.0 {
            rnd(v / step).clamp(-32, 31)
        } else {
            0
        };
        *l = q as i8;
        let e = step * q as f32 - v;
        err += e * e;
    }
    err
}

/// Scale of a 16-value group for signed levels `-32..=31`, minimising `Σ x²·(s·l − x)²`
/// over step counts near 32 (weighting by x² favours the large values).
fn fit_symmetric(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            (amax, max) = (v.abs(), v);
        }
    }
    if amax < GROUP_EPS {
        return 0.0;
    }
    // For fixed levels the best scale is Σwxl/Σwl², which lowers the error by
    // (Σwxl)²/Σwl²; the candidate with the largest reduction wins.
    let sums = |inv: f32| {
        let (mut sxl, mut sll) = (0f32, 0f32);
        for &v in x {
            let l = rnd(inv * v).clamp(-32, 31) as f32;
            let w = v * v;
            sxl += w * v * l;
            sll += w * l * l;
        }
        (sxl, sll)
    };
    let (sxl, sll) = sums(-32.0 / max);
    let mut scale = if sll != 0.0 { sxl / sll } else { 0.0 };
    let mut gain = scale * sxl;
    for k in (-9..=9).filter(|&k| k != 0) {
        let (sxl, sll) = sums(-(32.0 + 0.1 * k as f32) / max);
        if sll > 0.0 && sxl * sxl > gain * sll {
            scale = sxl / sll;
            gain = scale * sxl;
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::super::k_quants::{dequantize_q4_k, dequantize_q5_k, dequantize_q6_k};
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    type Quantize = fn(&[f32], &mut [u8]) -> Result<(), TensorError>;
    type Dequantize = fn(&[u8], &mut [f32]);

    const TYPES: [(GgmlType, usize, Quantize, Dequantize); 3] = [
        (GgmlType::Q4_K, Q4_K_BYTES, quantize_q4_k, dequantize_q4_k),
        (GgmlType::Q5_K, Q5_K_BYTES, quantize_q5_k, dequantize_q5_k),
        (GgmlType::Q6_K, Q6_K_BYTES, quantize_q6_k, dequantize_q6_k),
    ];

    fn gaussian(rng: &mut ChaCha8Rng, n: usize, sigma: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                // Box–Muller: two uniforms to one normal value.
                let (u, v): (f32, f32) = (rng.random_range(1e-7..1.0), rng.random());
                sigma * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
            })
            .collect()
    }

    fn rmse(a: &[f32], b: &[f32]) -> f32 {
        let s: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        (s / a.len() as f32).sqrt()
    }

    #[test]
    fn round_trip_error_shrinks_with_the_bits() {
        // Gaussian weights with σ = 0.02: the relative RMSE of each type sits well under the
        // uniform-quantizer bound for its bit count and improves with every extra bit.
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let x = gaussian(&mut rng, QK * 64, 0.02);
        let mut prev = f32::INFINITY;
        for (dtype, bytes, q, dq) in TYPES {
            let mut blocks = vec![0u8; x.len() / QK * bytes];
            q(&x, &mut blocks).unwrap();
            let mut y = vec![0f32; x.len()];
            dq(&blocks, &mut y);
            let rel = rmse(&x, &y) / 0.02;
            // Bounds: a step of (range / levels) gives RMSE ≈ step/√12; a Gaussian
            // sub-block of 32 spans about ±2.5σ.
            let bound = match dtype {
                GgmlType::Q4_K => 5.0 / 15.0 / 12f32.sqrt(),
                GgmlType::Q5_K => 5.0 / 31.0 / 12f32.sqrt(),
                _ => 5.0 / 63.0 / 12f32.sqrt(),
            };
            assert!(rel < bound, "{dtype}: relative RMSE {rel} ≥ {bound}");
            assert!(
                rel < prev,
                "{dtype}: {rel} not below the previous type's {prev}"
            );
            prev = rel;
        }
    }

    #[test]
    fn exact_grids_are_reproduced_exactly() {
        // Values already on a grid the format stores exactly come back unchanged. Q4_K/Q5_K:
        // levels 0..=nmax (all present in every sub-block) times 63·2⁻⁹, so that the
        // super-block scale is the f16-exact 2⁻⁹ and the sub-block scales are all 63. Q6_K:
        // levels -32..=31 times 2⁻³ with -32 in every group, so that d = -2⁻¹⁰, scales -128.
        for (dtype, bytes, q, dq) in TYPES {
            let x: Vec<f32> = (0..QK)
                .map(|i| match dtype {
                    GgmlType::Q4_K => ((i * 7) % 16) as f32 * 63.0 / 512.0,
                    GgmlType::Q5_K => ((i * 7) % 32) as f32 * 63.0 / 512.0,
                    _ if i % 16 == 0 => -4.0,
                    _ => (((i * 7) % 63) as f32 - 31.0) * 0.125,
                })
                .collect();
            let mut blocks = vec![0u8; bytes];
            q(&x, &mut blocks).unwrap();
            let mut y = vec![0f32; QK];
            dq(&blocks, &mut y);
            assert_eq!(x, y, "{dtype}");
        }
    }

    #[test]
    fn zero_and_constant_blocks() {
        for (dtype, bytes, q, dq) in TYPES {
            let mut blocks = vec![0xa5u8; bytes];
            q(&[0.0; QK], &mut blocks).unwrap();
            let mut y = vec![1f32; QK];
            dq(&blocks, &mut y);
            assert!(y.iter().all(|&v| v == 0.0), "{dtype}");
            // A constant negative block: the offset types store it through the min alone.
            q(&[-0.5; QK], &mut blocks).unwrap();
            dq(&blocks, &mut y);
            assert!(
                y.iter().all(|&v| (v + 0.5).abs() < 1e-3),
                "{dtype}: {}",
                y[0]
            );
        }
    }

    #[test]
    fn bad_lengths_and_non_finite_values_are_errors() {
        for (dtype, bytes, q, _) in TYPES {
            let mut out = vec![0u8; bytes];
            assert!(matches!(
                q(&[0.0; 100], &mut out),
                Err(TensorError::PartialBlock { .. })
            ));
            assert!(matches!(
                q(&[0.0; 2 * QK], &mut out),
                Err(TensorError::SizeMismatch { .. })
            ));
            let mut x = vec![0.0; QK];
            x[9] = f32::NAN;
            assert!(
                matches!(
                    q(&x, &mut out),
                    Err(TensorError::NonFinite { index: 9, .. })
                ),
                "{dtype}"
            );
            x[9] = f32::INFINITY;
            assert!(q(&x, &mut out).is_err());
        }
    }
}
