//! AVX2 dot products of the quantized weight types kept in their stored layout (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0 and Q2_K–Q6_K) with one activation row (Q8_0, Q8_1 or Q8_K).
//!
//! Each function reproduces its scalar definition in `inferno_tensor` bit for bit: the
//! integer sums are formed with `maddubs`/`madd` (exact: the bounds are noted where they
//! matter) and then every block is folded into the f32 accumulator with the scalar
//! expression, block after block. Weights enter `maddubs` as its unsigned operand (their
//! stored unsigned codes) and any offset is taken off with a second `maddubs` of the offset
//! against the same activations, so no sign trick is needed and every byte value of the
//! activations, -128 included, gives the exact sum.
//!
//! Slices are cut to whole blocks, as the scalar code does. Every function needs AVX2, FMA
//! and F16C (checked by the caller; see [`super::Isa`]), hence `unsafe`.

use super::super::x86::hmax;
use super::scale_min_k4_words as scale_min_k4;
use inferno_tensor::k_quants::{Q2_K_BYTES, Q3_K_BYTES};
use inferno_tensor::k_quants::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES};
use inferno_tensor::legacy::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_1_BYTES};
use inferno_tensor::q8_0::BLOCK_BYTES as Q8_0_BYTES;
use std::arch::x86_64::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// 16 bytes at `p`.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline(always)]
unsafe fn ld128(p: *const u8) -> __m128i {
    // SAFETY: the caller's promise; unaligned loads are allowed.
    unsafe { _mm_loadu_si128(p as *const __m128i) }
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p..p + 32` must be readable and AVX must be enabled in the caller.
#[inline(always)]
unsafe fn ld256(p: *const u8) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// A little-endian u16 at `p`.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: the caller's promise.
    u16::from_le(unsafe { (p as *const u16).read_unaligned() })
}

/// An f16 widened to f32 with F16C (exact, like `half`'s conversion).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_to_f32(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// The f16 at `p`, as f32.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's promise.
    f16_to_f32(unsafe { rd_u16(p) })
}

/// The f16 values at `p`, `p + stride`, `p + 2·stride`, `p + 3·stride`, widened.
///
/// # Safety
/// All four must be readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x4(p: *const u8, stride: usize) -> __m128 {
    // SAFETY: the caller's promise.
    let h = unsafe {
        [
            rd_u16(p),
            rd_u16(p.add(stride)),
            rd_u16(p.add(2 * stride)),
            rd_u16(p.add(3 * stride)),
        ]
    };
    _mm_cvtph_ps(_mm_setr_epi16(
        h[0] as i16,
        h[1] as i16,
        h[2] as i16,
        h[3] as i16,
        0,
        0,
        0,
        0,
    ))
}

/// Sum of the eight i32 lanes (exact while it fits, as every sum here does).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// The lane sums of four vectors, as lanes 0–3: one reduction for four blocks.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    let abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    _mm_add_epi32(
        _mm256_castsi256_si128(abcd),
        _mm256_extracti128_si256(abcd, 1),
    )
}

/// `acc + p[0] + p[1] + p[2] + p[3]`, added one lane at a time in order (the scalar
/// accumulation order).
#[inline]
#[target_feature(enable = "avx2")]
fn add_in_order(acc: f32, p: __m128) -> f32 {
    let mut l = [0.0f32; 4];
    // SAFETY: `l` holds four floats.
    unsafe { _mm_storeu_ps(l.as_mut_ptr(), p) };
    let mut acc = acc;
    for v in l {
        acc += v;
    }
    acc
}

/// The 32 4-bit values of a legacy block in element order: the low nibbles of the 16 bytes
/// at `p` (elements 0–15), then their high nibbles (16–31).
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // Both halves from one broadcast load; the upper half shifted by a nibble (bits that
    // cross from the next byte are masked off). No cross-lane shuffle needed.
    // SAFETY: the caller's promise.
    let v = unsafe { _mm256_broadcastsi128_si256(ld128(p)) };
    let v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// 0xff in byte `i` where bit `i` of `bits` is set, else 0.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bit_mask32(p: *const u8) -> __m256i {
    // Byte i takes byte i / 8 of the u32 (the broadcast repeats its four bytes in both
    // 128-bit halves, so the in-lane shuffle can reach bytes 2 and 3 from the upper half),
    // then tests bit i % 8 of it. (The load folds into a broadcast from memory.)
    // SAFETY: the caller's promise.
    let v = _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() });
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, idx), sel), sel)
}

/// Σ q·x over 32 unsigned weight codes `q` (each < 64) and signed activations, as eight
/// partial i32 sums: `maddubs` pairs stay below 2·63·128 < 2¹⁵, so nothing saturates.
#[inline]
#[target_feature(enable = "avx2")]
fn isum_u(q: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1))
}

/// Σ (q − off)·x as eight partial i32 sums, with `off` the offset broadcast to every byte;
/// both `maddubs` are exact, and so is their difference (|pair| ≤ 2·32·128).
#[inline]
#[target_feature(enable = "avx2")]
fn pairs_offset(q: __m256i, x: __m256i, off: __m256i) -> __m256i {
    _mm256_sub_epi16(_mm256_maddubs_epi16(q, x), _mm256_maddubs_epi16(off, x))
}

/// Sixteen i16 lanes: eight copies of scale `g`, then eight of scale `g + 1`, from sixteen
/// signed 8-bit scales (the two 16-value groups one 32-byte vector of quants spans).
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair(scales: __m128i, g: usize) -> __m256i {
    let idx = _mm_add_epi8(
        _mm_set1_epi8(g as i8),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
    );
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, idx))
}

// ---------------------------------------------------------------------------------------
// 32-value blocks (Q4_0, Q5_0, Q8_0 · Q8_0; Q4_1, Q5_1 · Q8_1)
// ---------------------------------------------------------------------------------------

/// Integer sum of one Q4_0 block with a Q8_0 block, as partial lanes.
///
/// # Safety
/// A whole block must be readable at `w` and at `x`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_q4_0(w: *const u8, x: *const u8) -> __m256i {
    // SAFETY: the caller's promise (quants at w + 2, 16 bytes; x + 2, 32 bytes).
    let (q, xv) = unsafe { (codes_q4_0(w), ld256(x.add(2))) };
    let p = pairs_offset(q, xv, _mm256_set1_epi8(8));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// The 32 unsigned 4-bit codes of the Q4_0 block at `w`, in element order.
///
/// # Safety
/// A whole Q4_0 block must be readable at `w`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes_q4_0(w: *const u8) -> __m256i {
    // SAFETY: the caller's promise (quants at w + 2, 16 bytes).
    unsafe { nibbles32(w.add(2)) }
}

/// The 32 unsigned 5-bit codes of the Q5_0 block at `w`, in element order.
///
/// # Safety
/// A whole Q5_0 block must be readable at `w`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes_q5_0(w: *const u8) -> __m256i {
    // SAFETY: the caller's promise (qh at w + 2, quants at w + 6).
    let (qh, lo) = unsafe { (bit_mask32(w.add(2)), nibbles32(w.add(6))) };
    _mm256_or_si256(lo, _mm256_and_si256(qh, _mm256_set1_epi8(0x10)))
}

/// Integer sum of one Q5_0 block with a Q8_0 block.
///
/// # Safety
/// As for [`block_q4_0`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_q5_0(w: *const u8, x: *const u8) -> __m256i {
    // SAFETY: the caller's promise (a whole block at w; quants at x + 2).
    let (q, xv) = unsafe { (codes_q5_0(w), ld256(x.add(2))) };
    let p = pairs_offset(q, xv, _mm256_set1_epi8(16));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Integer sum of one Q4_1 block with a Q8_1 block.
///
/// # Safety
/// As for [`block_q4_0`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_q4_1(w: *const u8, x: *const u8) -> __m256i {
    // SAFETY: the caller's promise (quants at w + 4 and x + 4).
    let (q, xv) = unsafe { (nibbles32(w.add(4)), ld256(x.add(4))) };
    isum_u(q, xv)
}

/// Integer sum of one Q5_1 block with a Q8_1 block.
///
/// # Safety
/// As for [`block_q4_0`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_q5_1(w: *const u8, x: *const u8) -> __m256i {
    // SAFETY: the caller's promise (qh at w + 4, quants at w + 8 and x + 4).
    let (qh, lo, xv) = unsafe { (bit_mask32(w.add(4)), nibbles32(w.add(8)), ld256(x.add(4))) };
    let q = _mm256_or_si256(lo, _mm256_and_si256(qh, _mm256_set1_epi8(0x10)));
    isum_u(q, xv)
}

/// Integer sum of two Q8_0 blocks, widened to i16 first: exact for every pair of bytes
/// (including -128 on both sides, which `maddubs` could not take).
///
/// # Safety
/// As for [`block_q4_0`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_q8_0(w: *const u8, x: *const u8) -> __m256i {
    // SAFETY: the caller's promise (quants at w + 2 and x + 2, 32 bytes each).
    let (w0, w1, x0, x1) = unsafe {
        (
            ld128(w.add(2)),
            ld128(w.add(18)),
            ld128(x.add(2)),
            ld128(x.add(18)),
        )
    };
    let a = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w0), _mm256_cvtepi8_epi16(x0));
    let b = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w1), _mm256_cvtepi8_epi16(x1));
    _mm256_add_epi32(a, b)
}

/// `isum · (d_w · d_x)` for four blocks, lane by lane (the Q8_0-activation types).
///
/// # Safety
/// Four blocks of `ws` and `xs` bytes must be readable at `w` and `x`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn terms_d(w: *const u8, ws: usize, x: *const u8, xs: usize, s: __m128i) -> __m128 {
    // SAFETY: the caller's promise (the scales lead each block).
    let (dw, dx) = unsafe { (f16x4(w, ws), f16x4(x, xs)) };
    _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(dw, dx))
}

/// One block's `isum · (d_w · d_x)`.
///
/// # Safety
/// The scales at `w` and `x` must be readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn term_d(w: *const u8, x: *const u8, s: i32) -> f32 {
    // SAFETY: the caller's promise.
    let (dw, dx) = unsafe { (f16_at(w), f16_at(x)) };
    s as f32 * (dw * dx)
}

/// `(d_w · d_x) · isum + m_w · s_x` for four blocks, lane by lane (Q4_1, Q5_1).
///
/// # Safety
/// As for [`terms_d`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn terms_dm(w: *const u8, ws: usize, x: *const u8, xs: usize, s: __m128i) -> __m128 {
    // SAFETY: the caller's promise (d then m / s lead each block).
    let (dw, dx, mw, sx) = unsafe {
        (
            f16x4(w, ws),
            f16x4(x, xs),
            f16x4(w.add(2), ws),
            f16x4(x.add(2), xs),
        )
    };
    _mm_add_ps(
        _mm_mul_ps(_mm_mul_ps(dw, dx), _mm_cvtepi32_ps(s)),
        _mm_mul_ps(mw, sx),
    )
}

/// One block's `(d_w · d_x) · isum + m_w · s_x`.
///
/// # Safety
/// As for [`term_d`], for the first four bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn term_dm(w: *const u8, x: *const u8, s: i32) -> f32 {
    // SAFETY: the caller's promise.
    let (dw, dx, mw, sx) = unsafe { (f16_at(w), f16_at(x), f16_at(w.add(2)), f16_at(x.add(2))) };
    (dw * dx) * s as f32 + mw * sx
}

/// A dot product over 32-value blocks: integer sums four blocks at a time with one
/// reduction, the per-block f32 terms four lanes at a time, then the terms added to the
/// accumulator one by one in block order.
macro_rules! legacy_dot {
    ($(#[$doc:meta])* $name:ident, $wsz:expr, $xsz:expr, $block:ident, $terms:ident, $term:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// AVX2, FMA and F16C must be present.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], x: &[u8]) -> f32 {
            let nb = (w.len() / $wsz).min(x.len() / $xsz);
            let (wp, xp) = (w.as_ptr(), x.as_ptr());
            let mut acc = 0.0f32;
            let mut b = 0;
            while b + 4 <= nb {
                // SAFETY: blocks b..b + 4 lie inside both rows (nb whole blocks).
                let t = unsafe {
                    let (wb, xb) = (wp.add(b * $wsz), xp.add(b * $xsz));
                    let s = reduce4(
                        $block(wb, xb),
                        $block(wb.add($wsz), xb.add($xsz)),
                        $block(wb.add(2 * $wsz), xb.add(2 * $xsz)),
                        $block(wb.add(3 * $wsz), xb.add(3 * $xsz)),
                    );
                    $terms(wb, $wsz, xb, $xsz, s)
                };
                acc = add_in_order(acc, t);
                b += 4;
            }
            while b < nb {
                // SAFETY: block b lies inside both rows.
                acc += unsafe {
                    let (wb, xb) = (wp.add(b * $wsz), xp.add(b * $xsz));
                    $term(wb, xb, hsum_i32($block(wb, xb)))
                };
                b += 1;
            }
            acc
        }
    };
}

legacy_dot!(
    /// Q4_0 weights · Q8_0 activations, as `legacy::dot_q4_0_q8_0`.
    dot_q4_0_q8_0, Q4_0_BYTES, Q8_0_BYTES, block_q4_0, terms_d, term_d
);
legacy_dot!(
    /// Q5_0 weights · Q8_0 activations, as `legacy::dot_q5_0_q8_0`.
    dot_q5_0_q8_0, Q5_0_BYTES, Q8_0_BYTES, block_q5_0, terms_d, term_d
);
legacy_dot!(
    /// Q8_0 weights (unpacked) · Q8_0 activations, as `q8_0::dot`.
    dot_q8_0_q8_0, Q8_0_BYTES, Q8_0_BYTES, block_q8_0, terms_d, term_d
);
legacy_dot!(
    /// Q4_1 weights · Q8_1 activations, as `legacy::dot_q4_1_q8_1`.
    dot_q4_1_q8_1, Q4_1_BYTES, Q8_1_BYTES, block_q4_1, terms_dm, term_dm
);
legacy_dot!(
    /// Q5_1 weights · Q8_1 activations, as `legacy::dot_q5_1_q8_1`.
    dot_q5_1_q8_1, Q5_1_BYTES, Q8_1_BYTES, block_q5_1, terms_dm, term_dm
);

// ---------------------------------------------------------------------------------------
// 256-value super-blocks (Q2_K … Q6_K · Q8_K)
// ---------------------------------------------------------------------------------------

/// Offset of the quants in a Q8_K block, and of its sixteen i16 group sums.
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 4 + 256;

/// The f32 scale of a Q8_K block.
#[inline]
fn q8k_d(xb: &[u8]) -> f32 {
    f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]])
}

/// Σ_j m[j] · (bsum[2j] + bsum[2j+1]) for Q4_K/Q5_K: `madd` of the sixteen group sums with
/// each min repeated twice gives exactly the eight terms (|term| < 2¹⁶ · 64).
///
/// # Safety
/// `xb` is a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn min_sum_k4(m: &[u8; 8], xb: &[u8]) -> i32 {
    // SAFETY: the group sums are the block's last 32 bytes; `m` has 8 bytes.
    let (bs, mv) = unsafe {
        (
            ld256(xb.as_ptr().add(Q8K_BSUMS)),
            _mm_loadl_epi64(m.as_ptr() as *const __m128i),
        )
    };
    let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    hsum_i32(_mm256_madd_epi16(bs, m16))
}

/// Q2_K weights · Q8_K activations, as `k_quants::dot_q2_k_q8_k`.
///
/// # Safety
/// AVX2, FMA and F16C must be present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q2_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    for (wb, xb) in w.chunks_exact(Q2_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (wp, xq) = (wb.as_ptr(), xb[Q8K_QS..].as_ptr());
        // SAFETY: the scales are the block's first 16 bytes; the group sums its last 32.
        let (raw, bs) = unsafe { (ld128(wp), ld256(xb.as_ptr().add(Q8K_BSUMS))) };
        let scales = _mm_and_si128(raw, m4);
        let mins = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
        let msum = hsum_i32(_mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), bs));
        let mut s = _mm256_setzero_si256();
        for h in 0..2 {
            // SAFETY: quants at 16..80 of the block.
            let qv = unsafe { ld256(wp.add(16 + 32 * h)) };
            for k in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * k as i32)), m3);
                // SAFETY: elements 128h + 32k .. +32 of the activation block.
                let xv = unsafe { ld256(xq.add(128 * h + 32 * k)) };
                // 2·3·128 per pair, times a scale < 16: exact.
                let p = _mm256_maddubs_epi16(q, xv);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scale_pair(scales, 8 * h + 2 * k)));
            }
        }
        let isum = hsum_i32(s);
        let dx = q8k_d(xb);
        // SAFETY: d and dmin at 80 and 82.
        let (d, dmin) = unsafe { (f16_at(wp.add(80)), f16_at(wp.add(82))) };
        acc += (d * dx) * isum as f32 - (dmin * dx) * msum as f32;
    }
    acc
}

/// The sixteen Q3_K scales minus 32, as signed bytes, as `k_quants::q3_k_scales` forms
/// them: low nibbles from bytes 0–7 (low nibbles for scales 0–7, high for 8–15), top two
/// bits from bytes 8–11 (bit pair `i / 4` of byte `8 + i % 4`).
#[inline]
#[target_feature(enable = "avx2")]
fn q3_k_scales(s: &[u8]) -> __m128i {
    let lo8 = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    let hi4 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let m4 = _mm_set1_epi8(0x0f);
    let v = _mm_cvtsi64_si128(lo8 as i64);
    let lo = _mm_and_si128(_mm_unpacklo_epi64(v, _mm_srli_epi16(v, 4)), m4);
    // Dword j of the broadcast shifted right by 2j: bits 0–1 of each of its bytes are then
    // the bit pair j of that byte (the shift is at most 6, so they never cross bytes).
    let h = _mm_srlv_epi32(_mm_set1_epi32(hi4 as i32), _mm_setr_epi32(0, 2, 4, 6));
    let hi = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi8(3)), 4);
    _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32))
}

/// Q3_K weights · Q8_K activations, as `k_quants::dot_q3_k_q8_k`: the signed 3-bit value is
/// taken as the unsigned code `low2 + 4·hbit` minus 4.
///
/// # Safety
/// AVX2, FMA and F16C must be present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q3_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    for (wb, xb) in w.chunks_exact(Q3_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let scales = q3_k_scales(&wb[96..108]);
        let (wp, xq) = (wb.as_ptr(), xb[Q8K_QS..].as_ptr());
        // SAFETY: hmask is the block's first 32 bytes.
        let hm = unsafe { ld256(wp) };
        let mut s = _mm256_setzero_si256();
        for h in 0..2 {
            // SAFETY: quants at 32..96 of the block.
            let qv = unsafe { ld256(wp.add(32 + 32 * h)) };
            for k in 0..4 {
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let bit = _mm256_set1_epi8((1u8 << (4 * h + k)) as i8);
                let hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                // SAFETY: elements 128h + 32k .. +32 of the activation block.
                let xv = unsafe { ld256(xq.add(128 * h + 32 * k)) };
                let p = pairs_offset(_mm256_or_si256(low, hb), xv, four);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scale_pair(scales, 8 * h + 2 * k)));
            }
        }
        let isum = hsum_i32(s);
        // SAFETY: d at 108.
        let d = unsafe { f16_at(wp.add(108)) };
        acc += (d * q8k_d(xb)) * isum as f32;
    }
    acc
}

/// The eight sub-block scales of a Q4_K/Q5_K block as i16, in both 128-bit halves.
#[inline]
#[target_feature(enable = "avx2")]
fn scales_i16(sc: &[u8; 8]) -> __m256i {
    let v = _mm_cvtsi64_si128(u64::from_le_bytes(*sc) as i64);
    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v))
}

/// Scale `j` of [`scales_i16`] in all sixteen lanes (an in-lane byte shuffle).
#[inline]
#[target_feature(enable = "avx2")]
fn scale_of(sc16: __m256i, j: usize) -> __m256i {
    let lo = 2 * j as i16;
    _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(((lo + 1) << 8) | lo))
}

/// Q4_K weights · Q8_K activations, as `k_quants::dot_q4_k_q8_k`.
///
/// # Safety
/// AVX2, FMA and F16C must be present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm256_set1_epi8(0x0f);
    for (wb, xb) in w.chunks_exact(Q4_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (sc, m) = scale_min_k4(&wb[4..16]);
        let sc16 = scales_i16(&sc);
        let (wp, xq) = (wb.as_ptr(), xb[Q8K_QS..].as_ptr());
        let mut s = _mm256_setzero_si256();
        for c in 0..4 {
            // SAFETY: quants at 16..144 of the block; activations 64c .. 64c + 64.
            let (v, x0, x1) = unsafe {
                (
                    ld256(wp.add(16 + 32 * c)),
                    ld256(xq.add(64 * c)),
                    ld256(xq.add(64 * c + 32)),
                )
            };
            let lo = _mm256_and_si256(v, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            // 2·15·128 per pair, times a 6-bit scale: exact.
            let p0 = _mm256_maddubs_epi16(lo, x0);
            let p1 = _mm256_maddubs_epi16(hi, x1);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p0, scale_of(sc16, 2 * c)));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p1, scale_of(sc16, 2 * c + 1)));
        }
        let isum = hsum_i32(s);
        // SAFETY: `xb` is a whole block.
        let msum = unsafe { min_sum_k4(&m, xb) };
        let dx = q8k_d(xb);
        // SAFETY: d and dmin at 0 and 2.
        let (d, dmin) = unsafe { (f16_at(wp), f16_at(wp.add(2))) };
        acc += (d * dx) * isum as f32 - (dmin * dx) * msum as f32;
    }
    acc
}

/// Q5_K weights · Q8_K activations, as `k_quants::dot_q5_k_q8_k`.
///
/// # Safety
/// AVX2, FMA and F16C must be present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm256_set1_epi8(0x0f);
    let (b0, b1) = (_mm256_set1_epi8(1), _mm256_set1_epi8(2));
    for (wb, xb) in w.chunks_exact(Q5_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (sc, m) = scale_min_k4(&wb[4..16]);
        let sc16 = scales_i16(&sc);
        let (wp, xq) = (wb.as_ptr(), xb[Q8K_QS..].as_ptr());
        // SAFETY: qh at 16..48 of the block.
        let qh = unsafe { ld256(wp.add(16)) };
        let mut s = _mm256_setzero_si256();
        for c in 0..4 {
            // SAFETY: quants at 48..176 of the block; activations 64c .. 64c + 64.
            let (v, x0, x1) = unsafe {
                (
                    ld256(wp.add(48 + 32 * c)),
                    ld256(xq.add(64 * c)),
                    ld256(xq.add(64 * c + 32)),
                )
            };
            // Bits 2c and 2c+1 of each qh byte are the fifth bits of sub-blocks 2c and 2c+1;
            // a 16-bit shift by 2c <= 6 keeps them inside their byte.
            let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32));
            let lo = _mm256_or_si256(
                _mm256_and_si256(v, m4),
                _mm256_slli_epi16(_mm256_and_si256(h, b0), 4),
            );
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(h, b1), 3),
            );
            // 2·31·128 per pair, times a 6-bit scale: exact.
            let p0 = _mm256_maddubs_epi16(lo, x0);
            let p1 = _mm256_maddubs_epi16(hi, x1);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p0, scale_of(sc16, 2 * c)));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p1, scale_of(sc16, 2 * c + 1)));
        }
        let isum = hsum_i32(s);
        // SAFETY: `xb` is a whole block.
        let msum = unsafe { min_sum_k4(&m, xb) };
        let dx = q8k_d(xb);
        // SAFETY: d and dmin at 0 and 2.
        let (d, dmin) = unsafe { (f16_at(wp), f16_at(wp.add(2))) };
        acc += (d * dx) * isum as f32 - (dmin * dx) * msum as f32;
    }
    acc
}

/// Q6_K weights · Q8_K activations, as `k_quants::dot_q6_k_q8_k`: the signed 6-bit value
/// is its unsigned code minus 32.
///
/// # Safety
/// AVX2, FMA and F16C must be present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let off = _mm256_set1_epi8(32);
    for (wb, xb) in w.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (wp, xq) = (wb.as_ptr(), xb[Q8K_QS..].as_ptr());
        // SAFETY: the sixteen i8 scales at 192..208.
        let scales = unsafe { ld128(wp.add(192)) };
        let mut s = _mm256_setzero_si256();
        for h in 0..2 {
            // SAFETY: ql at 0..128 and qh at 128..192 of the block.
            let (l0, l1, hh) = unsafe {
                (
                    ld256(wp.add(64 * h)),
                    ld256(wp.add(64 * h + 32)),
                    ld256(wp.add(128 + 32 * h)),
                )
            };
            // Bit pairs 0, 2, 4, 6 of qh moved to bits 4–5 (16-bit shifts; the bits that
            // cross into the neighbouring byte are masked off).
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(l0, m4),
                    _mm256_and_si256(_mm256_slli_epi16(hh, 4), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(l1, m4),
                    _mm256_and_si256(_mm256_slli_epi16(hh, 2), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                    _mm256_and_si256(hh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(hh, 2), m30),
                ),
            ];
            for (k, &qk) in q.iter().enumerate() {
                // SAFETY: elements 128h + 32k .. +32 of the activation block.
                let xv = unsafe { ld256(xq.add(128 * h + 32 * k)) };
                // |pair| <= 2·32·128, times an i8 scale: exact.
                let p = pairs_offset(qk, xv, off);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scale_pair(scales, 8 * h + 2 * k)));
            }
        }
        let isum = hsum_i32(s);
        // SAFETY: d at 208.
        let d = unsafe { f16_at(wp.add(208)) };
        acc += (d * q8k_d(xb)) * isum as f32;
    }
    acc
}

/// Four weight rows · one activation row for the offset types scaled by `d` alone (Q4_0,
/// Q5_0), returning each row's dot as the single-row kernel (and the scalar code) computes
/// it. The activation side of every block (its load, the offset product `off·x` and its
/// scale) is done once for the four rows. The four rows' block sums are reduced into one
/// vector (lane r = row r), so each row's f32 term and its accumulation are lanes of vector
/// operations: `acc_r += isum_r · (d_w,r · d_x)`, block after block, the scalar order.
macro_rules! legacy_dot4 {
    ($(#[$doc:meta])* $name:ident, $wsz:expr, $codes:ident, $off:expr) => {
        $(#[$doc])*
        ///
        /// `w` holds four consecutive rows of `rb` bytes each.
        ///
        /// # Safety
        /// AVX2, FMA and F16C must be present.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], rb: usize, x: &[u8]) -> [f32; 4] {
            let nb = (rb / $wsz).min(x.len() / Q8_0_BYTES);
            assert!(nb == 0 || w.len() >= 3 * rb + nb * $wsz);
            let (wp, xp) = (w.as_ptr(), x.as_ptr());
            let off = _mm256_set1_epi8($off);
            let ones = _mm256_set1_epi16(1);
            let mut acc = _mm_setzero_ps();
            for b in 0..nb {
                // SAFETY: block b of each of the four rows (at r·rb, r < 4) and of the
                // activation row lies inside its slice (nb whole blocks, checked above).
                let t = unsafe {
                    let (wb, xb) = (wp.add(b * $wsz), xp.add(b * Q8_0_BYTES));
                    // Four rows walked side by side defeat the hardware prefetcher on
                    // weights streamed from DRAM, so fetch the next four rows (the next
                    // call's, contiguous) linearly: two lines per block cover its four blocks.
                    let ahead = wp.wrapping_add(4 * rb + b * 4 * $wsz);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64) as *const i8);
                    let xv = ld256(xb.add(2));
                    let xo = _mm256_maddubs_epi16(off, xv);
                    // Σ (q − off)·x of one row's block: both `maddubs` exact, as in
                    // `pairs_offset`.
                    let row = |p: *const u8| {
                        let q = $codes(p);
                        let d = _mm256_sub_epi16(_mm256_maddubs_epi16(q, xv), xo);
                        _mm256_madd_epi16(d, ones)
                    };
                    let s = reduce4(row(wb), row(wb.add(rb)), row(wb.add(2 * rb)), row(wb.add(3 * rb)));
                    let dw = f16x4(wb, rb);
                    let dx = _mm_set1_ps(f16_at(xb));
                    _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(dw, dx))
                };
                acc = _mm_add_ps(acc, t);
            }
            let mut out = [0.0f32; 4];
            // SAFETY: `out` holds four floats.
            unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
            out
        }
    };
}

legacy_dot4!(
    /// Q4_0 weights · Q8_0 activations for four rows, as `legacy::dot_q4_0_q8_0` per row.
    dot4_q4_0_q8_0, Q4_0_BYTES, codes_q4_0, 8
);
legacy_dot4!(
    /// Q5_0 weights · Q8_0 activations for four rows, as `legacy::dot_q5_0_q8_0` per row.
    dot4_q5_0_q8_0, Q5_0_BYTES, codes_q5_0, 16
);

/// The first element of the largest magnitude in a block whose largest and smallest values
/// (each taken from 0) are `hi` and `lo`: the extreme of the larger side, or where both
/// sides reach that magnitude, the element `first(magnitude)` finds by a scan. `None` when
/// the magnitude is 0 (the block quantizes to zeros).
#[inline(always)]
fn block_max(hi: f32, lo: f32, first: impl FnOnce(f32) -> Option<f32>) -> Option<f32> {
    let amax = hi.max(-lo);
    if amax == 0.0 {
        None
    } else if hi > -lo {
        Some(hi)
    } else if hi < -lo {
        Some(lo)
    } else {
        first(amax).or(Some(amax))
    }
}

/// Q8_K quantization identical to `k_quants::quantize_q8_k` byte for byte. The scale comes
/// from the first element of the largest magnitude: one pass takes the block's largest and
/// smallest values (a NaN lane never wins, as in the scalar comparison), and that element is
/// the extreme of the larger side, unless both sides reach the same magnitude, when a scan
/// finds which comes first. Then per 16 values `round(iscale · v)` clamped to [−128, 127]
/// (the conversion rounds to nearest, ties to even, as the scalar code does; clamping before
/// or after rounding to integer bounds is the same), NaN to 0 as the scalar cast does, and
/// the group sums, reduced four groups at a time.
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let p = xb.as_ptr();
        // The largest and smallest values, as in `quantize_q8_k_avx512`.
        let (mut hv, mut lv) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        // SAFETY (this block and the scan below): indices below 256 are inside the block.
        unsafe {
            for i in (0..256).step_by(8) {
                hv = _mm256_max_ps(_mm256_loadu_ps(p.add(i)), hv);
                lv = _mm256_min_ps(_mm256_loadu_ps(p.add(i)), lv);
            }
        }
        // No lane is NaN, so each extreme is the same in any order (the smallest value is
        // the largest of the negated lanes, negated: exact).
        let (hi, lo) = (hmax(hv), -hmax(_mm256_xor_ps(lv, sign)));
        let first = |amax: f32| {
            let target = _mm256_set1_ps(amax);
            (0..256).step_by(8).find_map(|i| {
                // SAFETY: as above.
                let v = unsafe { _mm256_loadu_ps(p.add(i)) };
                let eq = _mm256_movemask_ps(_mm256_cmp_ps(
                    _mm256_andnot_ps(sign, v),
                    target,
                    _CMP_EQ_OQ,
                ));
                (eq != 0).then(|| xb[i + eq.trailing_zeros() as usize])
            })
        };
        let Some(max) = block_max(hi, lo, first) else {
            ob.fill(0);
            continue;
        };
        let iscale = -127.0 / max;
        let s = _mm256_set1_ps(iscale);
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
        // Each group's codes as eight i32 lanes to sum, reduced four groups at a time below.
        let mut parts = [_mm256_setzero_si256(); 16];
        for (g, part) in parts.iter_mut().enumerate() {
            let q = |i: usize| {
                // SAFETY: as above.
                let y = _mm256_mul_ps(s, unsafe { _mm256_loadu_ps(p.add(16 * g + i)) });
                let ordered = _mm256_cmp_ps(y, y, _CMP_ORD_Q);
                let c = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
                _mm256_cvtps_epi32(_mm256_and_ps(c, ordered))
            };
            let (a, b) = (q(0), q(8));
            let w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
            let w8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(w16, w16), 0x08);
            // SAFETY: bytes 4 + 16g .. +16 of the output block.
            unsafe {
                _mm_storeu_si128(
                    ob.as_mut_ptr().add(Q8K_QS + 16 * g) as *mut __m128i,
                    _mm256_castsi256_si128(w8),
                )
            };
            *part = _mm256_add_epi32(a, b);
        }
        let sums: [__m128i; 4] = std::array::from_fn(|i| {
            reduce4(
                parts[4 * i],
                parts[4 * i + 1],
                parts[4 * i + 2],
                parts[4 * i + 3],
            )
        });
        // |sum| <= 16 · 128, so packing to i16 saturates nothing.
        let words = [
            _mm_packs_epi32(sums[0], sums[1]),
            _mm_packs_epi32(sums[2], sums[3]),
        ];
        for (i, w) in words.iter().enumerate() {
            // SAFETY: 16 of the 32 bytes of group sums inside the output block.
            unsafe {
                _mm_storeu_si128(ob.as_mut_ptr().add(Q8K_BSUMS + 16 * i) as *mut __m128i, *w)
            };
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// [`quantize_q8_k`] on AVX-512, the same bytes and the same scale: a 16-value group is one
/// register, so its codes are one rounding conversion and one narrowing (exact: they are
/// clamped to a byte's range first), and the 16 group sums
/// come out of one tree of lane-block shuffles instead of a horizontal sum per group (the
/// sums are of integers, so their order does not matter). A prompt's rows are quantized
/// before every product: in a 512-token Q5_K_M prompt on Zen 4 the AVX2 form took 4.4% of
/// the samples and this one 1.1%.
///
/// # Safety
/// AVX-512 F and BW must be present.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn quantize_q8_k_avx512(x: &[f32], out: &mut [u8]) {
    let magnitude = _mm512_set1_epi32(0x7fff_ffff);
    let abs = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), magnitude));
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let p = xb.as_ptr();
        // SAFETY (every load below): indices below 256 are inside the block.
        let load = |g: usize| unsafe { _mm512_loadu_ps(p.add(16 * g)) };
        // The largest and smallest values (from 0, so an all-NaN block gives 0 and 0):
        // `max_ps` and `min_ps` return their second operand when the first is NaN, as the
        // scalar comparison never picks NaN. The first value of the largest magnitude is
        // the extreme of that side, unless both sides reach it: then a scan finds which
        // comes first.
        let (mut hi, mut lo) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for g in 0..16 {
            hi = _mm512_max_ps(load(g), hi);
            lo = _mm512_min_ps(load(g), lo);
        }
        // No lane is NaN, so each extreme is the same in any order.
        let (hi, lo) = (_mm512_reduce_max_ps(hi), _mm512_reduce_min_ps(lo));
        let first = |amax: f32| {
            let target = _mm512_set1_ps(amax);
            (0..16).find_map(|g| {
                let eq = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(abs(load(g)), target);
                (eq != 0).then(|| xb[16 * g + eq.trailing_zeros() as usize])
            })
        };
        let Some(max) = block_max(hi, lo, first) else {
            ob.fill(0);
            continue;
        };
        let iscale = -127.0 / max;
        let s = _mm512_set1_ps(iscale);
        let (lo, hi) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
        let codes: [__m512i; 16] = std::array::from_fn(|g| {
            let y = _mm512_mul_ps(s, load(g));
            let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(y, y);
            let c = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
            // NaN to 0, as the scalar cast does; the rest round to nearest, ties to even.
            _mm512_maskz_cvtps_epi32(ordered, c)
        });
        for (g, &c) in codes.iter().enumerate() {
            // SAFETY: bytes 4 + 16g .. +16 of the output block; the codes fit a byte.
            unsafe {
                _mm_storeu_si128(
                    ob.as_mut_ptr().add(Q8K_QS + 16 * g) as *mut __m128i,
                    _mm512_cvtepi32_epi8(c),
                )
            };
        }
        // Pairs of registers to one: 128-bit blocks 0 and 2 of each beside 1 and 3, added,
        // so each block holds part of one group; twice over, each block holds four lanes
        // of one group.
        let blocks = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0x88>(a, b),
                _mm512_shuffle_i32x4::<0xDD>(a, b),
            )
        };
        let h: [__m512i; 8] = std::array::from_fn(|i| blocks(codes[2 * i], codes[2 * i + 1]));
        let q: [__m512i; 4] = std::array::from_fn(|i| blocks(h[2 * i], h[2 * i + 1]));
        // Block k of q[i] holds the four lanes of group 4i + k. Within each block, lanes
        // 0 + 2 and 1 + 3 of two registers side by side, then adjacent pairs: lane 4k + m
        // of `sums` is group 4m + k.
        let halves = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
        };
        let (t0, t1) = (
            _mm512_castsi512_ps(halves(q[0], q[1])),
            _mm512_castsi512_ps(halves(q[2], q[3])),
        );
        let sums = _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(t0, t1)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(t0, t1)),
        );
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        // |sum| <= 16 · 128, so each fits the i16 it is stored as.
        let sums = _mm512_cvtepi32_epi16(_mm512_permutexvar_epi32(idx, sums));
        // SAFETY: the 32 bytes of group sums inside the output block.
        unsafe { _mm256_storeu_si256(ob.as_mut_ptr().add(Q8K_BSUMS) as *mut __m256i, sums) };
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
