//! The K-quant super-block formats Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (256 values a block,
//! split into sub-blocks with their own small integer scales), and Q8_K, the activation
//! format they are all multiplied with.
//!
//! Layouts (little-endian), fields in storage order:
//!
//! | type | bytes | fields                                                                     |
//! |------|------:|----------------------------------------------------------------------------|
//! | Q2_K | 84    | scales `[u8; 16]` (lo 4 bits scale, hi 4 bits min), qs `[u8; 64]`, d, dmin |
//! | Q3_K | 110   | hmask `[u8; 32]`, qs `[u8; 64]`, scales `[u8; 12]` (16 × 6 bits), d        |
//! | Q4_K | 144   | d, dmin, scales `[u8; 12]` (8 scales + 8 mins, 6 bits), qs `[u8; 128]`     |
//! | Q5_K | 176   | d, dmin, scales `[u8; 12]`, qh `[u8; 32]`, qs `[u8; 128]`                  |
//! | Q6_K | 210   | ql `[u8; 128]`, qh `[u8; 64]`, scales `[i8; 16]`, d                        |
//! | Q8_K | 292   | d: f32, qs `[i8; 256]`, bsums `[i16; 16]` (sums of each 16 values)         |
//!
//! `d` and `dmin` are f16 except in Q8_K. Values are `d·sc·q − dmin·m` (Q2_K, Q4_K, Q5_K),
//! `d·(sc−32)·(q−4·!hbit)` (Q3_K) and `d·sc·(q−32)` (Q6_K).
//!
//! The dot products compute, per super-block, an exact i32 sum of `scale · q_w · q_x` (and
//! of `min · bsum` where the type has mins), then combine the block in f32 as
//! `acc += (d_w·d_x) · isum − (dmin_w·d_x) · msum`. Any faster kernel that forms the same
//! integer sums reproduces these results bit for bit.

use half::f16;

pub const QK: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
pub const Q8_K_BYTES: usize = 292;

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The eight 6-bit scales and eight 6-bit mins packed in 12 bytes (Q4_K, Q5_K): bytes 0–3
/// hold scales 0–3 in their low 6 bits, bytes 4–7 mins 0–3; scales and mins 4–7 take their
/// low 4 bits from the nibbles of bytes 8–11 and their top 2 bits from the spare top bits
/// of bytes 0–3 (scales) and 4–7 (mins).
#[inline]
pub fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// The inverse of [`scale_min_k4`]: eight 6-bit scales and mins into their 12 stored bytes.
#[inline]
pub fn pack_scale_min_k4(sc: &[u8; 8], mn: &[u8; 8], s: &mut [u8]) {
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
    }
}

/// The sixteen 6-bit Q3_K scales, already offset by −32: low 4 bits from the nibbles of
/// bytes 0–7 (low nibbles for scales 0–7, high for 8–15), top 2 bits from bytes 8–11.
#[inline]
pub fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = ((lo | (hi << 4)) as i8) - 32;
    }
    out
}

/// The inverse of [`q3_k_scales`]: sixteen scales (offset by −32) into their 12 stored
/// bytes.
pub fn pack_q3_k_scales(sc: &[i8; 16], s: &mut [u8]) {
    s.fill(0);
    for (i, &v) in sc.iter().enumerate() {
        let u = (v as i16 + 32) as u8;
        s[i % 8] |= (u & 0x0f) << (4 * (i / 8));
        s[8 + i % 4] |= (u >> 4) << (2 * (i / 4));
    }
}

/// Q2_K's 2-bit values in element order: byte `l` of each 32-byte half holds elements
/// `l`, `l+32`, `l+64`, `l+96` of that half's 128 in bit pairs 0, 2, 4, 6.
#[inline]
fn q2_k_values(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for half in 0..2 {
        for shift in 0..4 {
            for l in 0..32 {
                q[half * 128 + shift * 32 + l] = (qs[half * 32 + l] >> (2 * shift)) & 3;
            }
        }
    }
    q
}

/// Q3_K's signed 3-bit values: the 2-bit part laid out as in Q2_K, minus 4 where the
/// element's `hmask` bit (bit `e / 32` of byte `e % 32`) is clear.
#[inline]
fn q3_k_values(hmask: &[u8], qs: &[u8]) -> [i8; QK] {
    let low = q2_k_values(qs);
    let mut q = [0i8; QK];
    // One shift per 32-element run keeps the inner loop vectorizable.
    for j in 0..8 {
        let run = j * 32..(j + 1) * 32;
        for ((v, &lo), &h) in q[run.clone()].iter_mut().zip(&low[run]).zip(&hmask[..32]) {
            *v = lo as i8 - 4 * (((h >> j) & 1) ^ 1) as i8;
        }
    }
    q
}

/// 4-bit values of Q4_K/Q5_K: each 32-byte chunk holds 64 elements, the first 32 in the low
/// nibbles and the next 32 in the high nibbles.
#[inline]
fn q4_k_values(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for c in 0..4 {
        for l in 0..32 {
            let b = qs[c * 32 + l];
            q[c * 64 + l] = b & 0x0f;
            q[c * 64 + 32 + l] = b >> 4;
        }
    }
    q
}

/// 5-bit values of Q5_K: Q4_K's nibbles plus bit `e / 32` of `qh[e % 32]` as the fifth bit.
#[inline]
fn q5_k_values(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let mut q = q4_k_values(qs);
    for j in 0..8 {
        for (v, &h) in q[j * 32..(j + 1) * 32].iter_mut().zip(&qh[..32]) {
            *v |= ((h >> j) & 1) << 4;
        }
    }
    q
}

/// Signed 6-bit values of Q6_K: per 128-element half, `ql` bytes `0..64` give elements
/// `0..64` (low nibbles) and `64..128` (high nibbles); `qh` byte `l` gives the top two bits
/// of elements `l`, `l+32`, `l+64`, `l+96` in bit pairs 0, 2, 4, 6.
#[inline]
fn q6_k_values(ql: &[u8], qh: &[u8]) -> [i8; QK] {
    let mut q = [0i8; QK];
    for half in 0..2 {
        let (ql, qh) = (&ql[half * 64..], &qh[half * 32..]);
        let q = &mut q[half * 128..];
        for l in 0..32 {
            let h = qh[l];
            q[l] = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32;
            q[l + 32] = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
            q[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            q[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    q
}

pub fn dequantize_q2_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q2_K_BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let q = q2_k_values(&b[16..80]);
        for (g, (og, qg)) in o.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * (b[g] & 0x0f) as f32;
            let ml = dmin * (b[g] >> 4) as f32;
            for (v, &qv) in og.iter_mut().zip(qg) {
                *v = dl * qv as f32 - ml;
            }
        }
    }
}

pub fn dequantize_q3_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q3_K_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 108);
        let sc = q3_k_scales(&b[96..108]);
        let q = q3_k_values(&b[..32], &b[32..96]);
        for (g, (og, qg)) in o.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * sc[g] as f32;
            for (v, &qv) in og.iter_mut().zip(qg) {
                *v = dl * qv as f32;
            }
        }
    }
}

pub fn dequantize_q4_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q4_K_BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (sc, m) = scale_min_k4(&b[4..16]);
        let q = q4_k_values(&b[16..144]);
        for (j, (oj, qj)) in o.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (d1, m1) = (d * sc[j] as f32, dmin * m[j] as f32);
            for (v, &qv) in oj.iter_mut().zip(qj) {
                *v = d1 * qv as f32 - m1;
            }
        }
    }
}

pub fn dequantize_q5_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q5_K_BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (sc, m) = scale_min_k4(&b[4..16]);
        let q = q5_k_values(&b[16..48], &b[48..176]);
        for (j, (oj, qj)) in o.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (d1, m1) = (d * sc[j] as f32, dmin * m[j] as f32);
            for (v, &qv) in oj.iter_mut().zip(qj) {
                *v = d1 * qv as f32 - m1;
            }
        }
    }
}

pub fn dequantize_q6_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q6_K_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 208);
        let q = q6_k_values(&b[..128], &b[128..192]);
        for (g, (og, qg)) in o.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * (b[192 + g] as i8) as f32;
            for (v, &qv) in og.iter_mut().zip(qg) {
                *v = dl * qv as f32;
            }
        }
    }
}

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks as llama.cpp's reference does:
/// the element of largest magnitude `max` maps to −127 (`d = −max/127`, f32), values are
/// rounded half to even, and each 16-value group's sum is stored for the min terms.
/// `y.round_ties_even()` for |y| < 2²² (here |y| ≤ 127): adding 1.5 · 2²³ leaves a float
/// whose spacing is 1, so the addition itself rounds to the nearest integer, ties to even.
/// Unlike `round_ties_even` on the baseline x86-64 target (a `rintf` call per value, no
/// SSE4.1), this vectorizes. Zero's sign may differ, which the conversion to i8 erases.
#[inline]
pub(crate) fn round_ties_even_small(y: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (y + MAGIC) - MAGIC
}

pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in ob[4..4 + QK].iter_mut().zip(xb) {
            *q = (round_ties_even_small(iscale * v).clamp(-128.0, 127.0) as i8) as u8;
        }
        for g in 0..QK / 16 {
            let s: i16 = ob[4 + g * 16..4 + (g + 1) * 16]
                .iter()
                .map(|&q| (q as i8) as i16)
                .sum();
            ob[4 + QK + 2 * g..4 + QK + 2 * g + 2].copy_from_slice(&s.to_le_bytes());
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

#[inline]
fn q8_k_d(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[inline]
fn q8_k_qs(b: &[u8]) -> &[u8] {
    &b[4..4 + QK]
}

#[inline]
fn q8_k_bsum(b: &[u8], g: usize) -> i32 {
    i16::from_le_bytes([b[4 + QK + 2 * g], b[4 + QK + 2 * g + 1]]) as i32
}

/// Q8_K back to f32 (`d · q`). Used by tests and diagnostics.
pub fn dequantize_q8_k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(Q8_K_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = q8_k_d(b);
        for (v, &q) in o.iter_mut().zip(q8_k_qs(b)) {
            *v = (q as i8) as f32 * d;
        }
    }
}

/// Σ over `group`-value groups of `scale(g) · Σ q_w · q_x`, exact in i32: for every type
/// here |scale| ≤ 128, |q_w| ≤ 64 and |q_x| ≤ 127 over 256 values, under 2³¹.
#[inline]
fn scaled_isum<W: Copy + Into<i32>>(
    q: &[W],
    x: &[u8],
    group: usize,
    scale: impl Fn(usize) -> i32,
) -> i32 {
    let mut total = 0i32;
    for (g, (qg, xg)) in q.chunks_exact(group).zip(x.chunks_exact(group)).enumerate() {
        let mut s = 0i32;
        for (&a, &b) in qg.iter().zip(xg) {
            s += a.into() * (b as i8) as i32;
        }
        total += scale(g) * s;
    }
    total
}

pub fn dot_q2_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q2_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let sc = &wb[..16];
        let q = q2_k_values(&wb[16..80]);
        let isum = scaled_isum(&q, q8_k_qs(xb), 16, |g| (sc[g] & 0x0f) as i32);
        let msum: i32 = (0..16)
            .map(|g| (sc[g] >> 4) as i32 * q8_k_bsum(xb, g))
            .sum();
        let dx = q8_k_d(xb);
        acc += (f16_at(wb, 80) * dx) * isum as f32 - (f16_at(wb, 82) * dx) * msum as f32;
    }
    acc
}

pub fn dot_q3_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q3_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let sc = q3_k_scales(&wb[96..108]);
        let q = q3_k_values(&wb[..32], &wb[32..96]);
        let isum = scaled_isum(&q, q8_k_qs(xb), 16, |g| sc[g] as i32);
        acc += (f16_at(wb, 108) * q8_k_d(xb)) * isum as f32;
    }
    acc
}

/// Σ over the eight 32-value sub-blocks of `min · (bsum pair)` for Q4_K/Q5_K.
#[inline]
fn k4_min_sum(m: &[u8; 8], xb: &[u8]) -> i32 {
    (0..8)
        .map(|j| m[j] as i32 * (q8_k_bsum(xb, 2 * j) + q8_k_bsum(xb, 2 * j + 1)))
        .sum()
}

pub fn dot_q4_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q4_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (sc, m) = scale_min_k4(&wb[4..16]);
        let q = q4_k_values(&wb[16..144]);
        let isum = scaled_isum(&q, q8_k_qs(xb), 32, |j| sc[j] as i32);
        let msum = k4_min_sum(&m, xb);
        let dx = q8_k_d(xb);
        acc += (f16_at(wb, 0) * dx) * isum as f32 - (f16_at(wb, 2) * dx) * msum as f32;
    }
    acc
}

pub fn dot_q5_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q5_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (sc, m) = scale_min_k4(&wb[4..16]);
        let q = q5_k_values(&wb[16..48], &wb[48..176]);
        let isum = scaled_isum(&q, q8_k_qs(xb), 32, |j| sc[j] as i32);
        let msum = k4_min_sum(&m, xb);
        let dx = q8_k_d(xb);
        acc += (f16_at(wb, 0) * dx) * isum as f32 - (f16_at(wb, 2) * dx) * msum as f32;
    }
    acc
}

pub fn dot_q6_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let q = q6_k_values(&wb[..128], &wb[128..192]);
        let sc = &wb[192..208];
        let isum = scaled_isum(&q, q8_k_qs(xb), 16, |g| (sc[g] as i8) as i32);
        acc += (f16_at(wb, 208) * q8_k_d(xb)) * isum as f32;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_rounding_is_round_ties_even() {
        // Every quarter step over the range Q8_K quantization can produce (ties included),
        // and values a hair either side of each tie.
        for i in -520..=520 {
            let y = i as f32 * 0.25;
            for v in [
                y,
                f32::from_bits(y.to_bits() + 1),
                f32::from_bits(y.to_bits().max(1) - 1),
            ] {
                assert_eq!(round_ties_even_small(v), v.round_ties_even(), "{v}");
            }
        }
    }

    #[test]
    fn q8_k_maps_the_largest_magnitude_to_minus_127() {
        let x: Vec<f32> = (0..QK)
            .map(|i| ((i * 53 % 97) as f32 - 40.0) * 0.1)
            .collect();
        let mut q = vec![0u8; Q8_K_BYTES];
        quantize_q8_k(&x, &mut q);
        // The largest magnitude is the positive 5.6, so d = -5.6/127 and it quantizes to -127.
        let imax = (0..QK)
            .max_by(|&a, &b| x[a].abs().total_cmp(&x[b].abs()))
            .unwrap();
        assert!((x[imax] - 5.6).abs() < 1e-5);
        assert!((q8_k_d(&q) + x[imax] / 127.0).abs() < 1e-7);
        assert_eq!(q8_k_qs(&q)[imax] as i8, -127);
        let mut y = vec![0.0f32; QK];
        dequantize_q8_k(&q, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 5.6 / 127.0 * 0.5 + 1e-5);
        }
        for g in 0..16 {
            let s: i32 = q8_k_qs(&q)[g * 16..(g + 1) * 16]
                .iter()
                .map(|&v| (v as i8) as i32)
                .sum();
            assert_eq!(q8_k_bsum(&q, g), s);
        }
    }

    #[test]
    fn q8_k_zero_block_is_all_zero() {
        let mut q = vec![0xaau8; Q8_K_BYTES];
        quantize_q8_k(&[0.0; QK], &mut q);
        assert!(q.iter().all(|&b| b == 0));
    }

    #[test]
    fn packed_scales_unpack_to_six_bits() {
        // Scale j = j + 40 and min j = 63 - j, packed as the layout describes.
        let mut s = [0u8; 12];
        for j in 0..4 {
            let (sc, m) = (j as u8 + 40, 63 - j as u8);
            let (sc4, m4) = (j as u8 + 44, 59 - j as u8);
            s[j] = sc | ((sc4 >> 4) << 6);
            s[j + 4] = m | ((m4 >> 4) << 6);
            s[j + 8] = (sc4 & 0x0f) | ((m4 & 0x0f) << 4);
        }
        let (sc, m) = scale_min_k4(&s);
        for j in 0..8 {
            assert_eq!(sc[j], j as u8 + 40);
            assert_eq!(m[j], 63 - j as u8);
        }
    }
}
