//! x86-64 products of packed Q8_0 weights ([`super::PackedQ8`]) with Q8_0 activations:
//! AVX2 (`maddubs` with the sign moved to the activation) and AVX-512 VNNI (`vpdpbusd` on
//! the quants offset by 128). Each lane is one output row and follows the scalar definition
//! exactly. Callers check the CPU features first; every function here is `unsafe` for that
//! reason.

use super::super::x86::{store_rows_256, store_rows_512, PF_DIST};
use super::super::{ActQ8Ref, GROUP};
use super::PackedQ8;
use std::arch::x86_64::*;

/// One group of 16 rows times `T` tokens, AVX2: per 4-byte slice, `maddubs(|w|, sign(x, w))`
/// (the sign moves to the activation, whose quants never reach -128, so the unsigned operand
/// may be |-128| = 128) then `madd` by ones widens pairs to exact 32-bit sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize>(
    w: &PackedQ8,
    g: usize,
    a: &ActQ8Ref<'_>,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = w.nb;
    let cols = w.cols;
    let qbase = w.group_quants(g).as_ptr();
    let sbase = w.group_scales16(g).as_ptr();
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..nb {
        let mut isum = [[_mm256_setzero_si256(); 2]; T];
        // SAFETY: block `b` of group `g` holds 8 slices × 64 bytes.
        let wq = unsafe { qbase.add(b * 512) };
        for k in 0..8 {
            // SAFETY: inside the block (see above).
            let (w0, w1) = unsafe {
                (
                    _mm256_loadu_si256(wq.add(k * 64) as *const __m256i),
                    _mm256_loadu_si256(wq.add(k * 64 + 32) as *const __m256i),
                )
            };
            _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST + k * 64) as *const i8);
            let (u0, u1) = (_mm256_abs_epi8(w0), _mm256_abs_epi8(w1));
            for (t, is) in isum.iter_mut().enumerate() {
                // SAFETY: token t0+t has `cols` quants; this slice is inside block `b`.
                let xv = unsafe {
                    (a.quants.as_ptr().add((t0 + t) * cols + b * 32 + k * 4) as *const i32)
                        .read_unaligned()
                };
                let xb = _mm256_set1_epi32(xv);
                let p0 = _mm256_maddubs_epi16(u0, _mm256_sign_epi8(xb, w0));
                let p1 = _mm256_maddubs_epi16(u1, _mm256_sign_epi8(xb, w1));
                is[0] = _mm256_add_epi32(is[0], _mm256_madd_epi16(p0, ones));
                is[1] = _mm256_add_epi32(is[1], _mm256_madd_epi16(p1, ones));
            }
        }
        // SAFETY: 16 f16 scales per block.
        let (d0, d1) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(sbase.add(b * 16) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(sbase.add(b * 16 + 8) as *const __m128i)),
            )
        };
        for (t, (ac, is)) in acc.iter_mut().zip(&isum).enumerate() {
            let dx = _mm256_set1_ps(a.scales[(t0 + t) * nb + b]);
            ac[0] = _mm256_add_ps(
                ac[0],
                _mm256_mul_ps(_mm256_cvtepi32_ps(is[0]), _mm256_mul_ps(d0, dx)),
            );
            ac[1] = _mm256_add_ps(
                ac[1],
                _mm256_mul_ps(_mm256_cvtepi32_ps(is[1]), _mm256_mul_ps(d1, dx)),
            );
        }
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.into_iter().enumerate() {
        // SAFETY: the destination is the caller's.
        unsafe { store_rows_256(out.add((t0 + t) * ldo + g * GROUP), ac, rows) };
    }
}

/// Q8_0 product for the rows of groups `g0..g1` and tokens `0..n`, AVX2.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `out` must be writable at `t * ldo + r` for those
/// tokens and rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q8_avx2(
    w: &PackedQ8,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    for g in g0..g1 {
        for_token_tiles!(n, t, [4, 3, 2, 1], group_avx2(w, g, a, t, out, ldo));
    }
}

/// One group of 16 rows times `T` tokens, AVX-512 VNNI. The weights are stored offset by
/// 128 (`w ^ 0x80`, an unsigned byte) so one `vpdpbusd` multiplies them with the signed
/// activation slice: Σ (w + 128)·x = Σ w·x + 128·Σ x. Each block's integer sums start from
/// the activation block's −128·Σ x (stored so when it was quantized, and broadcast straight
/// from memory), which removes the offset exactly and leaves four vector operations per
/// block and token besides the products: the conversion, the two scalings and the sum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_vnni<const T: usize>(
    w: &PackedQ8,
    g: usize,
    a: &ActQ8Ref<'_>,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = w.nb;
    let cols = w.cols;
    let qbase = w.group_quants(g).as_ptr();
    let sbase = w.group_scales16(g).as_ptr();
    // Token t's quants, scales and offsets (the caller guarantees T tokens from t0).
    let xq = a.quants[t0 * cols..(t0 + T) * cols].as_ptr();
    let xd = a.scales[t0 * nb..(t0 + T) * nb].as_ptr();
    let xo = a.offsets[t0 * nb..(t0 + T) * nb].as_ptr();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        // SAFETY: block `b` of each of the T tokens is inside the slices taken above.
        let mut isum: [__m512i; T] =
            std::array::from_fn(|t| unsafe { _mm512_set1_epi32(*xo.add(t * nb + b)) });
        // SAFETY: block `b` of group `g` holds 8 slices × 64 bytes.
        let wq = unsafe { qbase.add(b * 512) };
        for k in 0..8 {
            // SAFETY: inside the block.
            let wv = unsafe { _mm512_loadu_si512(wq.add(k * 64) as *const __m512i) };
            _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST + k * 64) as *const i8);
            for (t, is) in isum.iter_mut().enumerate() {
                // SAFETY: token t0+t has `cols` quants; this slice is inside block `b`.
                let xv =
                    unsafe { (xq.add(t * cols + b * 32 + k * 4) as *const i32).read_unaligned() };
                *is = _mm512_dpbusd_epi32(*is, wv, _mm512_set1_epi32(xv));
            }
            // Keep the block slice-major: without this LLVM loads all eight weight slices
            // up front and goes token by token, which spills the accumulators (measured:
            // 8-stream decode 207 -> 237 tok/s, 64-token prompts 527 -> 630 with it).
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        }
        // SAFETY: 16 f16 scales per block.
        let dw =
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(sbase.add(b * 16) as *const __m256i)) };
        for (t, (ac, is)) in acc.iter_mut().zip(&isum).enumerate() {
            // SAFETY: as for the offsets.
            let dx = _mm512_set1_ps(unsafe { *xd.add(t * nb + b) });
            *ac = _mm512_add_ps(
                *ac,
                _mm512_mul_ps(_mm512_cvtepi32_ps(*is), _mm512_mul_ps(dw, dx)),
            );
        }
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.iter().enumerate() {
        // SAFETY: the group's `rows <= 16` outputs of token `t0 + t` are the caller's;
        // AVX-512 F is enabled in this function.
        unsafe { store_rows_512(out.add((t0 + t) * ldo + g * GROUP), *ac, rows) };
    }
}

/// Q8_0 product for the rows of groups `g0..g1` and tokens `0..n`, AVX-512 VNNI. `w` must
/// have been packed with the 128 offset.
///
/// # Safety
/// AVX-512 F/BW/VNNI, AVX2, FMA and F16C must be present; `out` as for [`gemm_q8_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q8_vnni(
    w: &PackedQ8,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    for g in g0..g1 {
        for_token_tiles!(n, t, [8, 4, 3, 2, 1], group_vnni(w, g, a, t, out, ldo));
    }
}
