//! x86-64 kernels every concern shares: AVX2 (+FMA, F16C) activation quantization and the
//! vector helpers (horizontal sums, exponentials, the packed lines' nibble codes, storing a
//! group's rows) that the products and attention in the folders beside this file use.
//! Callers check the CPU features first (see [`super::Isa`]); every function here is
//! `unsafe` for that reason.

use super::GROUP;
use std::arch::x86_64::*;

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `[hsum(v[0]), …, hsum(v[7])]`: each lane summed in [`hsum`]'s order (the halves, then
/// lanes two apart, then neighbours), eight at a time by a transposed tree (7 adds and 15
/// shuffles for the eight, against 5 ops each alone), so a score's bits are the same either
/// way.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum8(v: [__m256; 8]) -> __m256 {
    // [a_lo + a_hi | b_lo + b_hi]: the first step of a and b.
    let halves = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    // Lanes j + lanes j + 2 of each 4-lane group: [x0+x2, x1+x3, y0+y2, y1+y3 | ...].
    let twos = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(x, y),
            _mm256_shuffle_ps::<0xEE>(x, y),
        )
    };
    let q0 = twos(halves(v[0], v[1]), halves(v[2], v[3]));
    let q1 = twos(halves(v[4], v[5]), halves(v[6], v[7]));
    // Neighbours: the sums of v0, v2, v4, v6 | v1, v3, v5, v7.
    let r = _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(q0, q1),
        _mm256_shuffle_ps::<0xDD>(q0, q1),
    );
    _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `e^x` for 8 lanes: range reduction by ln 2 and a degree-7 polynomial, within 2 ulp of the
/// true value on [-87, 88]; inputs are clamped to that range (tiny results flush towards 0).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn exp256(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.33654)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 720.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 120.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 24.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 6.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    let e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
}

/// [`exp256`] for 16 lanes, the same operations in the same order: each lane's bits are
/// [`exp256`]'s.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn exp512(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.33654)),
        _mm512_set1_ps(88.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 720.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 120.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 24.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 6.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(p, _mm512_castsi512_ps(e))
}

/// Bit `bit` of each byte of `h` moved to bit 4 (the fifth bit of a Q5_K or Q5_0/Q5_1
/// code), the other bits 0: the AVX2 form of [`fifth_bits_512`], `bit` a constant once
/// inlined.
///
/// # Safety
/// AVX2 must be present.
#[inline(always)]
pub(super) unsafe fn fifth_bit_256(h: __m256i, bit: usize) -> __m256i {
    let m = _mm256_set1_epi8(0x10);
    // 16-bit shifts move bits across bytes; the mask keeps only the wanted one.
    _mm256_and_si256(
        match bit {
            0 => _mm256_slli_epi16(h, 4),
            1 => _mm256_slli_epi16(h, 3),
            2 => _mm256_slli_epi16(h, 2),
            3 => _mm256_slli_epi16(h, 1),
            4 => h,
            5 => _mm256_srli_epi16(h, 1),
            6 => _mm256_srli_epi16(h, 2),
            _ => _mm256_srli_epi16(h, 3),
        },
        m,
    )
}

/// Bit `2M` (`HIGH = false`) or `2M + 1` (`HIGH = true`) of each byte of `h` at bit 4, the
/// other bits 0: the fifth bits of a packed Q5_K or Q5_0/Q5_1 line's low or high nibbles.
/// 16-bit shifts by immediates, the mask dropping what crosses from the neighbouring byte:
/// shifts and logic issue beside `vpdpbusd`, where byte-mask moves, variable shifts (which
/// LLVM guards with a masked move) and rotates compete with it (the 64-token Q5_K product
/// took 1.44 ms with byte masks, 1.29 ms this way).
#[inline(always)]
pub(super) unsafe fn fifth_bits_512<const M: usize, const HIGH: bool>(h: __m512i) -> __m512i {
    let v = match (M, HIGH) {
        (0, false) => _mm512_slli_epi16(h, 4),
        (0, true) => _mm512_slli_epi16(h, 3),
        (1, false) => _mm512_slli_epi16(h, 2),
        (1, true) => _mm512_slli_epi16(h, 1),
        (2, false) => h,
        (2, true) => _mm512_srli_epi16(h, 1),
        (_, false) => _mm512_srli_epi16(h, 2),
        (_, true) => _mm512_srli_epi16(h, 3),
    };
    _mm512_and_si512(v, _mm512_set1_epi8(0x10))
}

/// The codes of a packed line `v`'s low and high nibbles, for five-bit codes with the
/// fifth bits `2M` and `2M + 1` of each byte of `h` ([`fifth_bits_512`]) merged in one op
/// each, `(v & 0x0f) | f` (`h` unused for four-bit codes): the packed Q4_K/Q5_K and
/// Q4_0–Q5_1 lines share this.
#[inline(always)]
pub(super) unsafe fn nibble_codes_512<const FIVE: bool, const M: usize>(
    v: __m512i,
    h: __m512i,
) -> [__m512i; 2] {
    let m4 = _mm512_set1_epi8(0x0f);
    let hi = _mm512_srli_epi16(v, 4);
    if FIVE {
        // SAFETY: AVX-512 F/BW are the caller's promise.
        let (fl, fh) = unsafe { (fifth_bits_512::<M, false>(h), fifth_bits_512::<M, true>(h)) };
        [
            _mm512_ternarylogic_epi32::<0xEC>(v, fl, m4),
            _mm512_ternarylogic_epi32::<0xEC>(hi, fh, m4),
        ]
    } else {
        [_mm512_and_si512(v, m4), _mm512_and_si512(hi, m4)]
    }
}

/// A group's 16 running sums of one token, as two vectors (rows 0–7, 8–15), written to its
/// real rows (the last group may be partial).
#[inline(always)]
pub(super) unsafe fn store_rows_256(dst: *mut f32, v: [__m256; 2], rows: usize) {
    let mut lanes = [0.0f32; GROUP];
    // SAFETY: `lanes` holds 16 floats; the caller owns `rows` floats at `dst`.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), v[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), v[1]);
        store_rows(dst, &lanes, rows);
    }
}

/// The inverse of [`store_rows_256`], the lanes of rows the group lacks zero.
#[inline(always)]
pub(super) unsafe fn load_rows_256(src: *const f32, rows: usize) -> [__m256; 2] {
    let mut lanes = [0.0f32; GROUP];
    // SAFETY: the caller owns `rows <= 16` floats at `src`; `lanes` holds 16.
    unsafe {
        std::ptr::copy_nonoverlapping(src, lanes.as_mut_ptr(), rows);
        [
            _mm256_loadu_ps(lanes.as_ptr()),
            _mm256_loadu_ps(lanes.as_ptr().add(8)),
        ]
    }
}

/// Writes 16 lanes to the real rows of a group (the last group may be partial).
#[inline(always)]
pub(super) unsafe fn store_rows(dst: *mut f32, lanes: &[f32; GROUP], rows: usize) {
    // SAFETY: the caller owns `rows` floats at `dst`.
    unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, rows) };
}

/// A group's 16 running sums of one token in one vector, written to its real rows with a
/// masked store (the last group may be partial). Through a buffer and [`store_rows`], the
/// variable-length copy was a call to `memmove` per group and token: decoding the real
/// Qwen2.5 Q4_K_M file (Q5_0 and Q8_0 products), 3–5% of the samples were in `memmove`,
/// and 0.5–0.8% after (`perf record` of `inferno bench -s 1,8 -d 200`, Zen 4).
///
/// # Safety
/// The caller owns `rows <= 16` floats at `dst`; AVX-512 F enabled.
#[inline(always)]
pub(super) unsafe fn store_rows_512(dst: *mut f32, v: __m512, rows: usize) {
    let mask = ((1u32 << rows) - 1) as __mmask16;
    // SAFETY: only the first `rows` lanes, the caller's, are written.
    unsafe { _mm512_mask_storeu_ps(dst, mask, v) };
}

/// How far ahead of its loads a Q8_0 product asks for weights (into L2): a group's blocks
/// are contiguous and so are consecutive groups, so this runs 8 blocks ahead in one stream.
/// With several tokens per weight load the loop is busy enough that the hardware prefetcher
/// alone left the memory idle part of the time; 1–8 KiB measured, 4 KiB best.
pub(super) const PF_DIST: usize = 4096;

// ---------------------------------------------------------------------------------------
// Activation quantization
// ---------------------------------------------------------------------------------------

/// Q8_0 quantization of `x` (whole blocks), identical to `q8_0::quantize`: the same scale
/// `amax / 127`, the same reciprocal, and rounding half away from zero (done as truncation
/// plus a correction, since the vector rounding mode rounds half to even).
///
/// `m` gets each block's Q8_1 sum field as `legacy::quantize_q8_1` computes it
/// (`Σq · amax / 127`, rounded to f16), widened.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `q` holds `x.len()` values, `d`, `s` and `m`
/// one per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_rows(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32], m: &mut [f32]) {
    let nb = x.len() / 32;
    debug_assert!(q.len() >= nb * 32 && d.len() >= nb && s.len() >= nb && m.len() >= nb);
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..nb {
        // SAFETY: block `b` lies inside `x` (nb whole blocks).
        let v: [__m256; 4] = unsafe {
            let p = x.as_ptr().add(b * 32);
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        };
        let a01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        let a23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        let amax = hmax(_mm256_max_ps(a01, a23));
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        d[b] = half::f16::from_f32(dd).to_f32();
        let idv = _mm256_set1_ps(id);
        let mut qi = [_mm256_setzero_si256(); 4];
        for (o, &vv) in qi.iter_mut().zip(&v) {
            let y = _mm256_mul_ps(vv, idv);
            let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
            let away = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
            let step = _mm256_or_ps(_mm256_and_ps(y, sign), one);
            *o = _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(away, step)));
        }
        let sum = _mm256_add_epi32(
            _mm256_add_epi32(qi[0], qi[1]),
            _mm256_add_epi32(qi[2], qi[3]),
        );
        let s128 = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let s128 = _mm_add_epi32(s128, _mm_shuffle_epi32(s128, 0b01_00_11_10));
        let s128 = _mm_add_epi32(s128, _mm_shuffle_epi32(s128, 0b10_11_00_01));
        let total = _mm_cvtsi128_si32(s128);
        s[b] = -128 * total;
        m[b] = half::f16::from_f32(total as f32 * dd).to_f32();
        let p01 = _mm256_packs_epi32(qi[0], qi[1]);
        let p23 = _mm256_packs_epi32(qi[2], qi[3]);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        // SAFETY: the block's 32 bytes lie inside `q`.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(b * 32) as *mut __m256i, bytes) };
    }
}
