//! The 32-element "legacy" block formats Q4_0, Q4_1, Q5_0 and Q5_1, and Q8_1, the activation
//! format the two offset types (Q4_1, Q5_1) are multiplied with.
//!
//! Layouts (little-endian, per block of 32 values):
//!
//! | type | bytes | fields                                   | value                  |
//! |------|------:|------------------------------------------|------------------------|
//! | Q4_0 | 18    | d: f16, qs: [u8; 16]                     | d · (q − 8)            |
//! | Q4_1 | 20    | d: f16, m: f16, qs: [u8; 16]             | d · q + m              |
//! | Q5_0 | 22    | d: f16, qh: u32, qs: [u8; 16]            | d · (q − 16)           |
//! | Q5_1 | 24    | d: f16, m: f16, qh: u32, qs: [u8; 16]    | d · q + m              |
//! | Q8_1 | 36    | d: f16, s: f16, qs: [i8; 32]             | d · q (s = d · Σq)     |
//!
//! Byte `j` of `qs` holds element `j` in its low nibble and element `j + 16` in its high
//! nibble; bit `i` of `qh` is the fifth bit of element `i`.
//!
//! Dot products follow llama.cpp's pairing: Q4_0 and Q5_0 weights against Q8_0 activations,
//! Q4_1 and Q5_1 against Q8_1, each block an exact integer sum scaled once in f32. The
//! offset `m` is folded in through the activation block's precomputed `s`.

use half::f16;

pub const BLOCK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_1_BYTES: usize = 36;

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The 4-bit values of a block, in element order.
#[inline]
fn nibbles(qs: &[u8]) -> [u8; BLOCK] {
    let mut q = [0u8; BLOCK];
    for (j, &b) in qs[..BLOCK / 2].iter().enumerate() {
        q[j] = b & 0x0f;
        q[j + BLOCK / 2] = b >> 4;
    }
    q
}

/// `HIGH_BIT[b][i]` is 16 when bit `i` of `b` is set: the fifth bits of eight consecutive
/// elements from one byte of `qh`, as a whole-array OR the compiler can vectorize (a
/// per-element variable shift defeats that and made these types 5× slower).
const HIGH_BIT: [[u8; 8]; 256] = {
    let mut t = [[0u8; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            t[b][i] = (((b >> i) & 1) as u8) << 4;
            i += 1;
        }
        b += 1;
    }
    t
};

/// The 5-bit values of a block: nibbles plus one bit each from `qh`.
#[inline]
fn five_bits(qh: u32, qs: &[u8]) -> [u8; BLOCK] {
    let mut q = nibbles(qs);
    for (k, byte) in qh.to_le_bytes().iter().enumerate() {
        for (v, &h) in q[8 * k..8 * k + 8]
            .iter_mut()
            .zip(&HIGH_BIT[*byte as usize])
        {
            *v |= h;
        }
    }
    q
}

pub fn dequantize_q4_0(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(Q4_0_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = f16_at(b, 0);
        for (v, &q) in o.iter_mut().zip(&nibbles(&b[2..])) {
            *v = d * (q as i32 - 8) as f32;
        }
    }
}

pub fn dequantize_q4_1(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(Q4_1_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (v, &q) in o.iter_mut().zip(&nibbles(&b[4..])) {
            *v = d * q as f32 + m;
        }
    }
}

pub fn dequantize_q5_0(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(Q5_0_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = f16_at(b, 0);
        for (v, &q) in o.iter_mut().zip(&five_bits(u32_at(b, 2), &b[6..])) {
            *v = d * (q as i32 - 16) as f32;
        }
    }
}

pub fn dequantize_q5_1(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(Q5_1_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (v, &q) in o.iter_mut().zip(&five_bits(u32_at(b, 4), &b[8..])) {
            *v = d * q as f32 + m;
        }
    }
}

/// Packs 32 five-bit values: low nibbles of elements `j` and `j + 16` share byte `j` of
/// `qs`, and bit `i` of the returned `qh` is the fifth bit of element `i`.
#[inline]
fn pack_five_bits(q: &[u8; BLOCK], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..BLOCK / 2 {
        qs[j] = (q[j] & 0x0f) | ((q[j + BLOCK / 2] & 0x0f) << 4);
    }
    for (i, &v) in q.iter().enumerate() {
        qh |= ((v >> 4) as u32 & 1) << i;
    }
    qh
}

/// Quantizes `x` (a multiple of 32 long) into Q5_1 blocks as llama.cpp's reference does:
/// `m` is the block's minimum, `d = (max − min) / 31`, levels round half up.
pub fn quantize_q5_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(Q5_1_BYTES)) {
        // Plain comparisons, not f32::min/max, whose choice between ±0 may vary by build.
        let min = xb.iter().fold(xb[0], |m, &v| if v < m { v } else { m });
        let max = xb.iter().fold(xb[0], |m, &v| if v > m { v } else { m });
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; BLOCK];
        for (l, &v) in q.iter_mut().zip(xb) {
            *l = (((v - min) * id + 0.5) as i32).clamp(0, 31) as u8;
        }
        ob[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        ob[2..4].copy_from_slice(&f16::from_f32(min).to_bits().to_le_bytes());
        let qh = pack_five_bits(&q, &mut ob[8..]);
        ob[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Quantizes `x` (a multiple of 32 long) into Q8_1 blocks: as Q8_0 (scale max|x| / 127,
/// rounding half away from zero), plus `s = Σq · d` with the unrounded f32 scale, stored
/// as f16 — the order llama.cpp's reference uses.
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in ob[4..].iter_mut().zip(xb) {
            let qi = (v * id).round() as i8;
            sum += qi as i32;
            *q = qi as u8;
        }
        ob[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        ob[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_bits().to_le_bytes());
    }
}

/// Q8_1 back to f32 (`d · q`; `s` is redundant). Used by tests and diagnostics.
pub fn dequantize_q8_1(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(Q8_1_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = f16_at(b, 0);
        for (v, &q) in o.iter_mut().zip(&b[4..]) {
            *v = (q as i8) as f32 * d;
        }
    }
}

#[inline]
fn isum(w: &[u8; BLOCK], offset: i32, x: &[u8]) -> i32 {
    let mut s = 0i32;
    for (&a, &b) in w.iter().zip(x) {
        s += (a as i32 - offset) * (b as i8) as i32;
    }
    s
}

/// The 32 unsigned codes (element order) of one Q4_0 block, or with `five` of one Q5_0
/// block: the value of element `i` is `d · (code[i] − 8)` (Q4_0) or `d · (code[i] − 16)`.
pub fn offset_codes(five: bool, block: &[u8]) -> [u8; BLOCK] {
    if five {
        five_bits(u32_at(block, 2), &block[6..])
    } else {
        nibbles(&block[2..])
    }
}

/// The 32 codes (element order) of one Q4_1 block, or with `five` of one Q5_1 block: the
/// value of element `i` is `d · code[i] + m`.
pub fn min_codes(five: bool, block: &[u8]) -> [u8; BLOCK] {
    if five {
        five_bits(u32_at(block, 4), &block[8..])
    } else {
        nibbles(&block[4..])
    }
}

/// Rewrites Q4_0 (or, with `five`, Q5_0) blocks as Q8_0 blocks holding exactly the same
/// values: the same f16 scale, and the quant minus its offset (8 or 16) as an 8-bit integer.
/// Products with Q8_0 activations are then the same integer sums scaled the same way, so
/// the Q8_0 kernels give bit-identical results. Whole blocks only; extra bytes are ignored.
pub fn widen_to_q8_0(five: bool, src: &[u8], out: &mut [u8]) {
    let (bytes, offset) = if five {
        (Q5_0_BYTES, 16)
    } else {
        (Q4_0_BYTES, 8)
    };
    let q8 = super::q8_0::BLOCK_BYTES;
    for (sb, ob) in src.chunks_exact(bytes).zip(out.chunks_exact_mut(q8)) {
        let q = if five {
            five_bits(u32_at(sb, 2), &sb[6..])
        } else {
            nibbles(&sb[2..])
        };
        ob[..2].copy_from_slice(&sb[..2]);
        for (o, &v) in ob[2..].iter_mut().zip(&q) {
            *o = ((v as i32 - offset) as i8) as u8;
        }
    }
}

/// The scale and its inverse for a symmetric block with `levels` codes below the offset:
/// the value of largest magnitude (the first, on ties) maps to code 0, i.e. `d = max / −levels`
/// (llama.cpp's reference quantizers for Q4_0 and Q5_0).
#[inline]
fn symmetric_scale(xb: &[f32], levels: f32) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -levels;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// Quantizes `x` (a multiple of 32 long) into Q4_0 blocks in `out`, as llama.cpp's reference
/// quantizer does: `d = max / −8`, codes `min(15, trunc(x / d + 8.5))`, d stored as f16.
pub fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let (d, id) = symmetric_scale(xb, 8.0);
        ob[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        let code = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..BLOCK / 2 {
            ob[2 + j] = code(xb[j]) | (code(xb[j + BLOCK / 2]) << 4);
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into Q5_0 blocks in `out`, as llama.cpp's reference
/// quantizer does: `d = max / −16`, codes `min(31, trunc(x / d + 16.5))`, the fifth bits in
/// `qh`, d stored as f16.
pub fn quantize_q5_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(Q5_0_BYTES)) {
        let (d, id) = symmetric_scale(xb, 16.0);
        ob[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        let code = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
        let mut qh = 0u32;
        for j in 0..BLOCK / 2 {
            let (lo, hi) = (code(xb[j]), code(xb[j + BLOCK / 2]));
            ob[6 + j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
            qh |= ((lo as u32 >> 4) & 1) << j;
            qh |= ((hi as u32 >> 4) & 1) << (j + BLOCK / 2);
        }
        ob[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Q4_0 weights · Q8_0 activations: `Σ_blocks isum · (d_w · d_x)`.
pub fn dot_q4_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w
        .chunks_exact(Q4_0_BYTES)
        .zip(x.chunks_exact(super::q8_0::BLOCK_BYTES))
    {
        let s = isum(&nibbles(&wb[2..]), 8, &xb[2..]);
        acc += s as f32 * (f16_at(wb, 0) * f16_at(xb, 0));
    }
    acc
}

/// Q5_0 weights · Q8_0 activations, ordered as Q4_0's.
pub fn dot_q5_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w
        .chunks_exact(Q5_0_BYTES)
        .zip(x.chunks_exact(super::q8_0::BLOCK_BYTES))
    {
        let s = isum(&five_bits(u32_at(wb, 2), &wb[6..]), 16, &xb[2..]);
        acc += s as f32 * (f16_at(wb, 0) * f16_at(xb, 0));
    }
    acc
}

/// Q4_1 weights · Q8_1 activations: per block `(d_w · d_x) · isum + m_w · s_x`.
pub fn dot_q4_1_q8_1(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q4_1_BYTES).zip(x.chunks_exact(Q8_1_BYTES)) {
        let s = isum(&nibbles(&wb[4..]), 0, &xb[4..]);
        acc += (f16_at(wb, 0) * f16_at(xb, 0)) * s as f32 + f16_at(wb, 2) * f16_at(xb, 2);
    }
    acc
}

/// Q5_1 weights · Q8_1 activations, ordered as Q4_1's.
pub fn dot_q5_1_q8_1(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q5_1_BYTES).zip(x.chunks_exact(Q8_1_BYTES)) {
        let s = isum(&five_bits(u32_at(wb, 4), &wb[8..]), 0, &xb[4..]);
        acc += (f16_at(wb, 0) * f16_at(xb, 0)) * s as f32 + f16_at(wb, 2) * f16_at(xb, 2);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn nibble_and_high_bit_order() {
        // Element j in the low nibble of byte j, element j+16 in the high nibble; qh bit i
        // is the fifth bit of element i.
        let mut b = vec![0u8; Q5_1_BYTES];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[2..4].copy_from_slice(&f16_bytes(0.0));
        b[4..8].copy_from_slice(&(1u32 << 20 | 1u32 << 3).to_le_bytes());
        for j in 0..16 {
            b[8 + j] = (j as u8) | (((15 - j) as u8) << 4);
        }
        let mut out = [0.0f32; 32];
        dequantize_q5_1(&b, &mut out);
        for j in 0..16 {
            let hi = if j == 3 { 16.0 } else { 0.0 };
            assert_eq!(out[j], j as f32 + hi, "element {j}");
            let hi = if j + 16 == 20 { 16.0 } else { 0.0 };
            assert_eq!(out[j + 16], (15 - j) as f32 + hi, "element {}", j + 16);
        }
    }

    #[test]
    fn q8_1_sum_field_matches_values() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 29 % 31) as f32 - 13.0) * 0.21)
            .collect();
        let mut q = vec![0u8; 2 * Q8_1_BYTES];
        quantize_q8_1(&x, &mut q);
        let mut y = vec![0.0f32; 64];
        dequantize_q8_1(&q, &mut y);
        for (b, yb) in q.chunks_exact(Q8_1_BYTES).zip(y.chunks_exact(32)) {
            let s = f16_at(b, 2);
            let sum: f32 = yb.iter().sum();
            assert!((s - sum).abs() <= 2e-3 * sum.abs().max(1.0), "{s} vs {sum}");
        }
        // Half a step, plus the f16 rounding of the scale times the largest |q| (127).
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let step = amax / 127.0;
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= step * (0.5 + 127.0 / 2048.0), "{a} vs {b}");
        }
    }

    #[test]
    fn offset_types_fold_the_minimum_through_s() {
        // A Q4_1 block with every nibble 0 is the constant m; its dot with x is m · Σx.
        let mut w = vec![0u8; Q4_1_BYTES];
        w[..2].copy_from_slice(&f16_bytes(0.5));
        w[2..4].copy_from_slice(&f16_bytes(-2.0));
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.25).collect();
        let mut xq = vec![0u8; Q8_1_BYTES];
        quantize_q8_1(&x, &mut xq);
        let want = -2.0 * x.iter().sum::<f32>();
        let got = dot_q4_1_q8_1(&w, &xq);
        assert!((got - want).abs() <= 1e-3 * want.abs(), "{got} vs {want}");
    }

    #[test]
    fn widening_to_q8_0_keeps_values_and_products_exact() {
        // Pseudo-random bytes cover every quant; scales include f16 extremes.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        let x: Vec<f32> = (0..8 * BLOCK)
            .map(|i| ((i * 7919) % 61) as f32 - 30.0)
            .collect();
        let mut xq = vec![0u8; 8 * super::super::q8_0::BLOCK_BYTES];
        super::super::q8_0::quantize(&x, &mut xq);
        for five in [false, true] {
            let bytes = if five { Q5_0_BYTES } else { Q4_0_BYTES };
            let mut w: Vec<u8> = (0..8 * bytes).map(|_| next()).collect();
            for (b, scale) in [65504.0f32, -6.1e-5, 1.0, 0.0, -0.37, 2.5e-3, -1e3, 7.0]
                .iter()
                .enumerate()
            {
                w[b * bytes..b * bytes + 2].copy_from_slice(&f16_bytes(*scale));
            }
            let mut wide = vec![0u8; 8 * super::super::q8_0::BLOCK_BYTES];
            widen_to_q8_0(five, &w, &mut wide);
            let (mut a, mut b) = (vec![0f32; 8 * BLOCK], vec![0f32; 8 * BLOCK]);
            if five {
                dequantize_q5_0(&w, &mut a);
            } else {
                dequantize_q4_0(&w, &mut a);
            }
            super::super::q8_0::dequantize(&wide, &mut b);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            let native = if five {
                dot_q5_0_q8_0(&w, &xq)
            } else {
                dot_q4_0_q8_0(&w, &xq)
            };
            assert_eq!(
                native.to_bits(),
                super::super::q8_0::dot(&wide, &xq).to_bits()
            );
        }
    }
}
