//! x86-64 products of packed Q4_0, Q5_0, Q4_1 and Q5_1 weights ([`super::PackedLegacy`])
//! with Q8_0 activations: AVX2 (`maddubs` on the unsigned codes) and AVX-512 VNNI
//! (`vpdpbusd`). Each lane's block sum is the scalar code's exact one. Callers check the CPU
//! features first; every function here is `unsafe` for that reason.

use super::super::x86::{fifth_bit_256, nibble_codes_512, store_rows, PF_DIST};
use super::super::{ActQ8Ref, GROUP};
use super::PackedLegacy;
use std::arch::x86_64::*;

/// Each block's integer sums start from `−off·Σx` (off = 8 for Q4_0, 16 for Q5_0), which is
/// the stored `−128·Σx` shifted right by 4 or 3: exact, as `−128·Σx` is a multiple of 128.
#[inline(always)]
fn legacy_offset_shift(five: bool) -> u32 {
    if five {
        3
    } else {
        4
    }
}

/// One group of 16 rows times `T` tokens of a packed Q4_0 (`FIVE` false), Q5_0, or with
/// `MIN` Q4_1 / Q5_1 matrix, AVX2: each 64-byte line splits into the codes of two slices
/// (low and high nibbles, plus the fifth bits for five-bit codes), multiplied as unsigned
/// bytes by `maddubs` (pairs at most 2·31·128 in magnitude: exact), added in i16 over a few
/// slices and widened to 32-bit sums by `madd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_legacy_avx2<const T: usize, const FIVE: bool, const MIN: bool>(
    w: &PackedLegacy,
    g: usize,
    a: &ActQ8Ref<'_>,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = w.nb;
    let cols = w.cols;
    let qbase = w.group_nibbles(g).as_ptr();
    let high = w.group_high(g);
    let sbase = w.group_scales16(g).as_ptr();
    assert!(!FIVE || high.len() >= nb * 8);
    let hp = high.as_ptr() as *const u8;
    let mins = w.group_mins16(g);
    assert!(!MIN || mins.len() >= nb * GROUP);
    let mbase = mins.as_ptr();
    let shift = legacy_offset_shift(FIVE);
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm256_set1_epi8(0x0f);
    let xq = a.quants[t0 * cols..(t0 + T) * cols].as_ptr();
    let xo = a.offsets[t0 * nb..(t0 + T) * nb].as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..nb {
        // The offset types start from −off·Σx; the minimum types add `m · s` after.
        let mut isum: [[__m256i; 2]; T] = std::array::from_fn(|t| {
            if MIN {
                [_mm256_setzero_si256(); 2]
            } else {
                // SAFETY: block `b` of each of the T tokens is inside the slices taken above.
                [_mm256_set1_epi32(unsafe { *xo.add(t * nb + b) } >> shift); 2]
            }
        });
        // SAFETY: block `b` of group `g` holds 4 lines × 64 bytes.
        let wq = unsafe { qbase.add(b * 256) };
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + 64) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + 128) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + 192) as *const i8);
        // The block's fifth-bit line, rows 0–7 and 8–15 (zero and unused for four-bit codes).
        let hl = if FIVE {
            // SAFETY: block `b` of a five-bit group has 64 bytes of them (checked on entry).
            unsafe {
                [
                    _mm256_loadu_si256(hp.add(b * 64) as *const __m256i),
                    _mm256_loadu_si256(hp.add(b * 64 + 32) as *const __m256i),
                ]
            }
        } else {
            [_mm256_setzero_si256(); 2]
        };
        // Lines whose `maddubs` pairs add in i16 before one `madd` widens them: a pair is at
        // most 2·c·128 in magnitude for codes below c, so four-bit codes sum the whole block
        // (8 slices: 30,720) and five-bit codes half of it (4 slices: 31,744), exact. One
        // `madd` per `maddubs` held the products to half the rate of `maddubs`.
        let window = if FIVE { 2 } else { 4 };
        for j0 in (0..4).step_by(window) {
            let mut a16 = [[_mm256_setzero_si256(); 2]; T];
            for j in j0..j0 + window {
                // SAFETY: inside the block (see above).
                let (v0, v1) = unsafe {
                    (
                        _mm256_loadu_si256(wq.add(j * 64) as *const __m256i),
                        _mm256_loadu_si256(wq.add(j * 64 + 32) as *const __m256i),
                    )
                };
                let mut codes = [
                    [_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4)],
                    [
                        _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4),
                    ],
                ];
                if FIVE {
                    for (h, c) in codes.iter_mut().enumerate() {
                        // Slice 2j + h's fifth bits: that bit of each byte, at bit 4. By
                        // shifts (three ops) for a tile of tokens; one token's line runs
                        // faster with the byte compare (four ops, but no shifts): the Q5_0
                        // 4864 × 896 matvec 112 against 127 µs on a Zen 3.
                        for (cq, hq) in c.iter_mut().zip(hl) {
                            let f = if T == 1 {
                                let sel = _mm256_set1_epi8(1 << (2 * j + h));
                                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hq, sel), sel);
                                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                            } else {
                                // SAFETY: AVX2 is enabled here.
                                unsafe { fifth_bit_256(hq, 2 * j + h) }
                            };
                            *cq = _mm256_or_si256(*cq, f);
                        }
                    }
                }
                for (h, c) in codes.iter().enumerate() {
                    let k = 2 * j + h;
                    for (t, a) in a16.iter_mut().enumerate() {
                        // SAFETY: token t0+t has `cols` quants; slice k is inside block `b`.
                        let xv = unsafe {
                            (xq.add(t * cols + b * 32 + k * 4) as *const i32).read_unaligned()
                        };
                        let xb = _mm256_set1_epi32(xv);
                        a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(c[0], xb));
                        a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(c[1], xb));
                    }
                }
            }
            for (is, a) in isum.iter_mut().zip(&a16) {
                is[0] = _mm256_add_epi32(is[0], _mm256_madd_epi16(a[0], ones));
                is[1] = _mm256_add_epi32(is[1], _mm256_madd_epi16(a[1], ones));
            }
        }
        // SAFETY: 16 f16 scales per block.
        let (d0, d1) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(sbase.add(b * 16) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(sbase.add(b * 16 + 8) as *const __m128i)),
            )
        };
        // SAFETY: 16 f16 minimums per block (checked on entry) where the type has them.
        let mw = if MIN {
            Some(unsafe {
                [
                    _mm256_cvtph_ps(_mm_loadu_si128(mbase.add(b * 16) as *const __m128i)),
                    _mm256_cvtph_ps(_mm_loadu_si128(mbase.add(b * 16 + 8) as *const __m128i)),
                ]
            })
        } else {
            None
        };
        for (t, (ac, is)) in acc.iter_mut().zip(&isum).enumerate() {
            let dx = _mm256_set1_ps(a.scales[(t0 + t) * nb + b]);
            for (h, d) in [d0, d1].into_iter().enumerate() {
                // isum · (d_w · d_x), plus m_w · s_x for the minimum types, then added: the
                // scalar expressions' order (the products commute exactly).
                let mut term = _mm256_mul_ps(_mm256_cvtepi32_ps(is[h]), _mm256_mul_ps(d, dx));
                if let Some(m) = mw {
                    let sx = _mm256_set1_ps(a.sums[(t0 + t) * nb + b]);
                    term = _mm256_add_ps(term, _mm256_mul_ps(m[h], sx));
                }
                ac[h] = _mm256_add_ps(ac[h], term);
            }
        }
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.iter().enumerate() {
        let mut lanes = [0.0f32; GROUP];
        // SAFETY: `lanes` holds 16 floats; the destination is the caller's.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), ac[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), ac[1]);
            store_rows(out.add((t0 + t) * ldo + g * GROUP), &lanes, rows);
        }
    }
}

/// Packed Q4_0 / Q5_0 / Q4_1 / Q5_1 product for the rows of groups `g0..g1` and tokens
/// `0..n`, AVX2.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `a` holds `n` rows of `w.cols` quants; `out` must be
/// writable at `t * ldo + r` for those tokens and rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_legacy_avx2(
    w: &PackedLegacy,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    for g in g0..g1 {
        match (w.five, w.min) {
            (false, false) => {
                for_token_tiles!(n, t, [4, 3, 2, 1], group_avx2_q4_0(w, g, a, t, out, ldo))
            }
            (true, false) => {
                for_token_tiles!(n, t, [4, 3, 2, 1], group_avx2_q5_0(w, g, a, t, out, ldo))
            }
            (false, true) => {
                for_token_tiles!(n, t, [4, 3, 2, 1], group_avx2_q4_1(w, g, a, t, out, ldo))
            }
            (true, true) => {
                for_token_tiles!(n, t, [4, 3, 2, 1], group_avx2_q5_1(w, g, a, t, out, ldo))
            }
        }
    }
}

/// `$name::<T>(…)`: the group kernel `$kernel` for one legacy type (`FIVE`, `MIN` fixed), as
/// the plain function `for_token_tiles!` takes.
macro_rules! legacy_group_fns {
    ($features:literal, $kernel:ident: $($name:ident = ($five:literal, $min:literal)),+) => {$(
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const T: usize>(
            w: &PackedLegacy,
            g: usize,
            a: &ActQ8Ref<'_>,
            t0: usize,
            out: *mut f32,
            ldo: usize,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe { $kernel::<T, $five, $min>(w, g, a, t0, out, ldo) }
        }
    )+};
}

legacy_group_fns!("avx2,fma,f16c", group_legacy_avx2:
    group_avx2_q4_0 = (false, false),
    group_avx2_q5_0 = (true, false),
    group_avx2_q4_1 = (false, true),
    group_avx2_q5_1 = (true, true)
);

/// Line `J` of the packed legacy block at `wq` (block `b` of its rows) against tokens
/// `0..T` of `xq` (rows of `cols` quants): the codes of slices `2J`, `2J + 1` (the fifth
/// bits, from the block's fifth-bit line `h`, merged in one op each), each multiplied by one
/// `vpdpbusd` per token with the broadcast activation slice into `isum`.
///
/// # Safety
/// `wq` holds the block's 4 lines; each token row of `xq` holds block `b`; AVX-512 F/BW/VNNI
/// enabled.
#[inline(always)]
unsafe fn legacy_line_vnni<const T: usize, const FIVE: bool, const J: usize>(
    wq: *const u8,
    h: __m512i,
    (xq, cols, b): (*const i8, usize, usize),
    isum: &mut [__m512i; T],
) {
    // SAFETY: line J is inside the block.
    let v = unsafe { _mm512_loadu_si512(wq.add(J * 64) as *const __m512i) };
    _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + J * 64) as *const i8);
    // SAFETY: AVX-512 F/BW are the caller's promise.
    let codes = unsafe { nibble_codes_512::<FIVE, J>(v, h) };
    for (hh, c) in codes.iter().enumerate() {
        let k = 2 * J + hh;
        for (t, is) in isum.iter_mut().enumerate() {
            // SAFETY: token t has `cols` quants; slice k is inside block `b`.
            let xv = unsafe { (xq.add(t * cols + b * 32 + k * 4) as *const i32).read_unaligned() };
            *is = _mm512_dpbusd_epi32(*is, *c, _mm512_set1_epi32(xv));
        }
    }
    // Keep the block line-major, as in `group_vnni`.
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// One group of 16 rows times `T` tokens of a packed Q4_0 (`FIVE` false), Q5_0, or with
/// `MIN` Q4_1 / Q5_1 matrix, AVX-512 VNNI: each 64-byte line gives the codes of two slices
/// for all 16 rows ([`legacy_line_vnni`]), the lines unrolled so each one's fifth bits come
/// out of the block's fifth-bit line with immediate shifts.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_legacy_vnni<const T: usize, const FIVE: bool, const MIN: bool>(
    w: &PackedLegacy,
    g: usize,
    a: &ActQ8Ref<'_>,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = w.nb;
    let cols = w.cols;
    let qbase = w.group_nibbles(g).as_ptr();
    let high = w.group_high(g);
    let sbase = w.group_scales16(g).as_ptr();
    let shift = legacy_offset_shift(FIVE);
    assert!(!FIVE || high.len() >= nb * 8);
    let hp = high.as_ptr() as *const u8;
    let mins = w.group_mins16(g);
    assert!(!MIN || mins.len() >= nb * GROUP);
    let mbase = mins.as_ptr();
    let xq = a.quants[t0 * cols..(t0 + T) * cols].as_ptr();
    let xd = a.scales[t0 * nb..(t0 + T) * nb].as_ptr();
    let xo = a.offsets[t0 * nb..(t0 + T) * nb].as_ptr();
    let xs = a.sums[t0 * nb..(t0 + T) * nb].as_ptr();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        // The offset types start from −off·Σx; the minimum types add `m · s` after.
        let mut isum: [__m512i; T] = std::array::from_fn(|t| {
            if MIN {
                _mm512_setzero_si512()
            } else {
                // SAFETY: block `b` of each of the T tokens is inside the slices taken above.
                _mm512_set1_epi32(unsafe { *xo.add(t * nb + b) } >> shift)
            }
        });
        // SAFETY: block `b` of group `g` holds 4 lines × 64 bytes.
        let wq = unsafe { qbase.add(b * 256) };
        let h = if FIVE {
            // SAFETY: block `b` of a five-bit group has its 64-byte line (checked on entry).
            unsafe { _mm512_loadu_si512(hp.add(b * 64) as *const __m512i) }
        } else {
            _mm512_setzero_si512()
        };
        let xb = (xq, cols, b);
        // SAFETY (all four): the block's lines and the tokens' block `b` (see above).
        unsafe {
            legacy_line_vnni::<T, FIVE, 0>(wq, h, xb, &mut isum);
            legacy_line_vnni::<T, FIVE, 1>(wq, h, xb, &mut isum);
            legacy_line_vnni::<T, FIVE, 2>(wq, h, xb, &mut isum);
            legacy_line_vnni::<T, FIVE, 3>(wq, h, xb, &mut isum);
        }
        // SAFETY: 16 f16 scales per block.
        let dw =
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(sbase.add(b * 16) as *const __m256i)) };
        // SAFETY: 16 f16 minimums per block (checked on entry) where the type has them.
        let mw = if MIN {
            Some(unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(mbase.add(b * 16) as *const __m256i))
            })
        } else {
            None
        };
        for (t, (ac, is)) in acc.iter_mut().zip(&isum).enumerate() {
            // SAFETY: as for the offsets.
            let dx = _mm512_set1_ps(unsafe { *xd.add(t * nb + b) });
            // As in `group_legacy_avx2`.
            let mut term = _mm512_mul_ps(_mm512_cvtepi32_ps(*is), _mm512_mul_ps(dw, dx));
            if let Some(m) = mw {
                // SAFETY: as for the offsets.
                let sx = _mm512_set1_ps(unsafe { *xs.add(t * nb + b) });
                term = _mm512_add_ps(term, _mm512_mul_ps(m, sx));
            }
            *ac = _mm512_add_ps(*ac, term);
        }
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.iter().enumerate() {
        let mut lanes = [0.0f32; GROUP];
        // SAFETY: `lanes` holds 16 floats; the destination is the caller's.
        unsafe {
            _mm512_storeu_ps(lanes.as_mut_ptr(), *ac);
            store_rows(out.add((t0 + t) * ldo + g * GROUP), &lanes, rows);
        }
    }
}

legacy_group_fns!("avx512f,avx512bw,avx512vnni,avx2,fma,f16c", group_legacy_vnni:
    group_vnni_q4_0 = (false, false),
    group_vnni_q5_0 = (true, false),
    group_vnni_q4_1 = (false, true),
    group_vnni_q5_1 = (true, true)
);

/// Packed Q4_0 / Q5_0 / Q4_1 / Q5_1 product for the rows of groups `g0..g1` and tokens
/// `0..n`, AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VNNI, AVX2, FMA and F16C must be present; otherwise as for
/// [`gemm_legacy_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_legacy_vnni(
    w: &PackedLegacy,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    for g in g0..g1 {
        match (w.five, w.min) {
            (false, false) => {
                for_token_tiles!(n, t, [8, 4, 3, 2, 1], group_vnni_q4_0(w, g, a, t, out, ldo))
            }
            (true, false) => {
                for_token_tiles!(n, t, [8, 4, 3, 2, 1], group_vnni_q5_0(w, g, a, t, out, ldo))
            }
            (false, true) => {
                for_token_tiles!(n, t, [8, 4, 3, 2, 1], group_vnni_q4_1(w, g, a, t, out, ldo))
            }
            (true, true) => {
                for_token_tiles!(n, t, [8, 4, 3, 2, 1], group_vnni_q5_1(w, g, a, t, out, ldo))
            }
        }
    }
}
