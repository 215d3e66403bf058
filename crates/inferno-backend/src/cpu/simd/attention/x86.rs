//! x86-64 attention kernels (AVX2, with AVX-512 F where present): an online softmax over
//! chunks of cached keys read in their stored type, several query rows sharing each key and
//! value read, and positions split into partitions that threads fill and [`fold_part`]
//! merges in order. Callers check the CPU features first; every function here is `unsafe`
//! for that reason.

// The register tiles are indexed by query row and lane together (`a[r][u]`): an index loop
// says that more plainly than nested iterators.
#![allow(clippy::needless_range_loop)]

use super::super::x86::{exp256, exp512, hmax, hsum, hsum8};
use super::super::AttentionWidth;
use crate::{AttentionShape, KvRows};
use std::arch::x86_64::*;

/// Keys scored per step of the online softmax: their scores live on the stack, and the
/// chunk of keys stays in L1 while every query head of the group reads it.
const CHUNK: usize = 32;

/// How an attention kernel reads 8 consecutive values of a cached key or value row in its
/// stored type, widened exactly to f32 (the values the scalar reference reads).
trait KvLoad {
    /// Whether rows are plain f32 (read as they are, never widened).
    const IS_F32: bool = false;
    /// Whether converting a row costs enough that rows sharing a chunk should widen it once
    /// (Q8_0). F16 is not: its `vcvtph2ps` per 8 values costs less than the store and the
    /// reloads of a widened copy (a 16-row prompt ran 25% faster and decode at depth 4096
    /// 74% faster reading F16 as stored).
    const WIDEN: bool = false;
    /// Whether rows are F16, which Zen 4 reads faster in the 8-lane forms
    /// ([`AttentionWidth::ZmmExceptF16OrWidened`]).
    const IS_F16: bool = false;
    /// Bytes of one row of `hd` values.
    fn row_bytes(hd: usize) -> usize;
    /// Values `i .. i + 8` of the row at `row` (`i` a multiple of 8).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be present; the row holds at least `i + 8` values.
    unsafe fn load8(row: *const u8, i: usize) -> __m256;
    /// Values `i .. i + 16` of the row at `row` (`i` a multiple of 16), each lane what
    /// [`KvLoad::load8`] reads.
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA and F16C present (inlined into a function that enables them);
    /// the row holds at least `i + 16` values.
    #[inline(always)]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { join_halves(Self::load8(row, i), Self::load8(row, i + 8)) }
    }
    /// Values `i .. i + 8` of the rows at `a` (low half) and `b` (high half).
    ///
    /// # Safety
    /// As for [`KvLoad::load16`], both rows holding `i + 8` values.
    #[inline(always)]
    unsafe fn load8x2(a: *const u8, b: *const u8, i: usize) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { join_halves(Self::load8(a, i), Self::load8(b, i)) }
    }
}

/// `lo` and `hi` as one 512-bit vector.
///
/// # Safety
/// AVX-512 F present (inlined into a function that enables it).
#[inline(always)]
unsafe fn join_halves(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ))
}

struct F32Rows;
struct F16Rows;
struct Q8Rows;

impl KvLoad for F32Rows {
    const IS_F32: bool = true;
    #[inline(always)]
    fn row_bytes(hd: usize) -> usize {
        hd * 4
    }
    #[inline(always)]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        // SAFETY: the caller's promise.
        unsafe { _mm256_loadu_ps(row.cast::<f32>().add(i)) }
    }
    #[inline(always)]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_loadu_ps(row.cast::<f32>().add(i)) }
    }
}

impl KvLoad for F16Rows {
    const IS_F16: bool = true;
    #[inline(always)]
    fn row_bytes(hd: usize) -> usize {
        hd * 2
    }
    #[inline(always)]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        // SAFETY: the caller's promise (F16C present; eight halves at `i`).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.add(i * 2).cast::<__m128i>())) }
    }
    #[inline(always)]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        // SAFETY: the caller's promise (sixteen halves at `i`).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.add(i * 2).cast::<__m256i>())) }
    }
    #[inline(always)]
    unsafe fn load8x2(a: *const u8, b: *const u8, i: usize) -> __m512 {
        // SAFETY: the caller's promise (eight halves at `i` of each row); one conversion
        // for both.
        unsafe {
            let lo = _mm_loadu_si128(a.add(i * 2).cast::<__m128i>());
            let hi = _mm_loadu_si128(b.add(i * 2).cast::<__m128i>());
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
        }
    }
}

impl KvLoad for Q8Rows {
    const WIDEN: bool = true;
    #[inline(always)]
    fn row_bytes(hd: usize) -> usize {
        hd / 32 * 34
    }
    #[inline(always)]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        // SAFETY: the caller's promise: block i / 32 of the row exists, and eight quants at
        // i % 32 lie inside it (i is a multiple of 8).
        unsafe {
            let block = row.add(i / 32 * 34);
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([
                *block,
                *block.add(1),
            ]) as i32)));
            let q = _mm_loadl_epi64(block.add(2 + i % 32).cast::<__m128i>());
            _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                _mm256_set1_ps(d),
            )
        }
    }
}
/// The 8-lane accumulators of `q_r · k_u` for `R` query rows against `N` consecutive key
/// rows (`k + u·row_bytes`), each one FMA chain over the head's 8-value slices, which
/// [`put_scores`] sums horizontally: the same arithmetic for every `N` and `R`, so a score's
/// bits do not depend on the tile it is in.
/// The rows share each widened key slice (for an F16 cache one `vcvtph2ps` then serves `R`
/// FMAs: converting, not multiplying, bounded a prompt's attention), and `N · R` = 8 keeps
/// eight chains in flight.
///
/// # Safety
/// AVX2 and FMA must be present; `hd` is a multiple of 8; each `q` holds `hd` floats and `k`
/// holds `N` rows of `hd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_keys<K: KvLoad, const N: usize, const R: usize>(
    q: [*const f32; R],
    k: *const u8,
    hd: usize,
) -> [[__m256; N]; R] {
    let mut a = [[_mm256_setzero_ps(); N]; R];
    let mut i = 0;
    // SAFETY (whole body): every index below `hd` is inside the rows.
    unsafe {
        while i < hd {
            let qv: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(q[r].add(i)));
            for u in 0..N {
                let kv = K::load8(k.add(u * K::row_bytes(hd)), i);
                for r in 0..R {
                    a[r][u] = _mm256_fmadd_ps(qv[r], kv, a[r][u]);
                }
            }
            i += 8;
        }
    }
    a
}

/// [`score_keys`] on AVX-512 for `R` rows against `2P` keys: key `2p` in the low half of
/// `a[r][p]` and key `2p + 1` in the high half, each half the 8-lane FMA chain of
/// [`score_keys`] (the query slice broadcast to both halves), so every score keeps its bits.
/// One `vcvtph2ps` converts two keys' slices of an F16 cache, and `P · R` = 8 chains.
///
/// # Safety
/// As for [`score_keys`], with AVX-512 F present and `k` holding `2P` rows.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn score_keys_512<K: KvLoad, const P: usize, const R: usize>(
    q: [*const f32; R],
    k: *const u8,
    hd: usize,
) -> [[__m512; P]; R] {
    let rb = K::row_bytes(hd);
    let mut a = [[_mm512_setzero_ps(); P]; R];
    let mut i = 0;
    // SAFETY (whole body): every index below `hd` is inside the rows.
    unsafe {
        while i < hd {
            let qv: [__m512; R] = std::array::from_fn(|r| {
                let v = _mm256_castps_pd(_mm256_loadu_ps(q[r].add(i)));
                _mm512_castpd_ps(_mm512_broadcast_f64x4(v))
            });
            for pp in 0..P {
                let kv = K::load8x2(k.add(2 * pp * rb), k.add((2 * pp + 1) * rb), i);
                for r in 0..R {
                    a[r][pp] = _mm512_fmadd_ps(qv[r], kv, a[r][pp]);
                }
            }
            i += 8;
        }
    }
    a
}

/// For each of `R` rows, `out_r[0..8U] = out_r·corr_r + Σ_j p_r[j]·v_j[d..d + 8U]` in key
/// order (value row j at `v + j·row_bytes`), the sum alone where `first` (the rows' first
/// chunk: `out_r` is not read, the bits of `+0 · 0` before the sum), with `U` vector
/// accumulators per row: each output lane is one FMA chain over the keys whatever `U` and
/// `R` are, and the rows share each widened value slice.
///
/// # Safety
/// AVX2, FMA and F16C must be present; each `out` holds 8U floats; every `p_r` has the same
/// length, and `v` holds that many rows of `hd` values from which `d..d + 8U` are read.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weigh_values<V: KvLoad, const U: usize, const R: usize>(
    first: bool,
    out: [*mut f32; R],
    corr: [__m256; R],
    p: [&[f32]; R],
    v: *const u8,
    d: usize,
    hd: usize,
) {
    // SAFETY (whole body): the caller's promise.
    unsafe {
        // A row's first chunk starts from zero: the `+0 · 0` of an output zeroed before.
        let mut a: [[__m256; U]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|u| {
                if first {
                    _mm256_setzero_ps()
                } else {
                    _mm256_mul_ps(_mm256_loadu_ps(out[r].add(u * 8)), corr[r])
                }
            })
        });
        for j in 0..p[0].len() {
            let pv: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(*p[r].get_unchecked(j)));
            let vr = v.add(j * V::row_bytes(hd));
            for u in 0..U {
                let x = V::load8(vr, d + u * 8);
                for r in 0..R {
                    a[r][u] = _mm256_fmadd_ps(pv[r], x, a[r][u]);
                }
            }
        }
        for r in 0..R {
            for u in 0..U {
                _mm256_storeu_ps(out[r].add(u * 8), a[r][u]);
            }
        }
    }
}

/// [`weigh_values`] on AVX-512: `U` 16-lane accumulators per row (`U · R` = 8), each lane the
/// same FMA chain over the keys as in [`weigh_values`], so the bits do not change.
///
/// # Safety
/// As for [`weigh_values`], with AVX-512 F present and `16U` floats at each `out`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn weigh_values_512<V: KvLoad, const U: usize, const R: usize>(
    first: bool,
    out: [*mut f32; R],
    corr: [f32; R],
    p: [&[f32]; R],
    v: *const u8,
    d: usize,
    hd: usize,
) {
    // SAFETY (whole body): the caller's promise.
    unsafe {
        let mut a: [[__m512; U]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|u| {
                if first {
                    _mm512_setzero_ps()
                } else {
                    _mm512_mul_ps(_mm512_loadu_ps(out[r].add(u * 16)), _mm512_set1_ps(corr[r]))
                }
            })
        });
        for j in 0..p[0].len() {
            let pv: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(*p[r].get_unchecked(j)));
            let vr = v.add(j * V::row_bytes(hd));
            for u in 0..U {
                let x = V::load16(vr, d + u * 16);
                for r in 0..R {
                    a[r][u] = _mm512_fmadd_ps(pv[r], x, a[r][u]);
                }
            }
        }
        for r in 0..R {
            for u in 0..U {
                _mm512_storeu_ps(out[r].add(u * 16), a[r][u]);
            }
        }
    }
}

/// [`attend_rows`] for keys and values in their stored types.
///
/// # Safety
/// As for [`attend_rows`], with `k` and `v` holding the rows.
pub unsafe fn attend_rows_any(
    width: AttentionWidth,
    s: &AttentionShape,
    rows: &[AttnRow],
    k: KvRows<'_>,
    v: KvRows<'_>,
) {
    let (kp, vp) = (kv_ptr(k), kv_ptr(v));
    use KvRows::{F16, F32, Q8_0};
    // SAFETY (every arm): the caller's promise, with the loaders of the rows' own types.
    unsafe {
        match (k, v) {
            (F32(_), F32(_)) => attend_rows::<F32Rows, F32Rows>(width, s, rows, kp, vp),
            (F32(_), F16(_)) => attend_rows::<F32Rows, F16Rows>(width, s, rows, kp, vp),
            (F32(_), Q8_0(_)) => attend_rows::<F32Rows, Q8Rows>(width, s, rows, kp, vp),
            (F16(_), F32(_)) => attend_rows::<F16Rows, F32Rows>(width, s, rows, kp, vp),
            (F16(_), F16(_)) => attend_rows::<F16Rows, F16Rows>(width, s, rows, kp, vp),
            (F16(_), Q8_0(_)) => attend_rows::<F16Rows, Q8Rows>(width, s, rows, kp, vp),
            (Q8_0(_), F32(_)) => attend_rows::<Q8Rows, F32Rows>(width, s, rows, kp, vp),
            (Q8_0(_), F16(_)) => attend_rows::<Q8Rows, F16Rows>(width, s, rows, kp, vp),
            (Q8_0(_), Q8_0(_)) => attend_rows::<Q8Rows, Q8Rows>(width, s, rows, kp, vp),
        }
    }
}

/// The first byte of cached rows, for the loaders.
fn kv_ptr(r: KvRows<'_>) -> *const u8 {
    match r {
        KvRows::F32(s) => s.as_ptr().cast(),
        KvRows::F16(s) => s.as_ptr().cast(),
        KvRows::Q8_0(s) => s.as_ptr(),
    }
}

/// Query rows (heads of one or more tokens sharing a KV head) attended together.
pub const MAX_ROWS: usize = 16;

/// One query row of attention: a head of one token, where its output goes, and how many
/// cached positions it sees (its token's causal limit).
#[derive(Clone, Copy)]
pub struct AttnRow {
    pub q: *const f32,
    pub out: *mut f32,
    pub kv_len: usize,
}

/// One chunk of keys and values (rows `c0 ..` of the KV head, starting at `kc` and `vc`, as
/// `K` and `V` read them) for `R` (1, 2 or 4) query rows that see the same keys of it, sharing
/// every key and value slice loaded: their scores, the new running max, the rescaling of
/// their running sums, then exponentials and the weighted values. Each row's arithmetic is
/// the same whatever `R` is, whether the wide (`W`: AVX-512) forms run, and whether the
/// 8-lane ones keep sixteen chains in flight (`X`: AVX-512 VL's 32 registers) or eight.
///
/// # Safety
/// As for [`attend_rows`]; `rows`, `ph` and `st` hold `R` entries; the chunk holds at least
/// `cl = min(CHUNK, kv_len - c0)` rows, the same for every row. Only inlined into a function
/// that enables AVX2, FMA and F16C, AVX-512 F where `W`, and AVX-512 F and VL where `X`.
#[inline(always)]
unsafe fn rows_chunk<K: KvLoad, V: KvLoad, const R: usize, const W: bool, const X: bool>(
    s: &AttentionShape,
    rows: &[AttnRow],
    (c0, first): (usize, bool),
    (kc, vc): (*const u8, *const u8),
    ph: &mut [[f32; CHUNK]],
    st: &mut [PartState],
) {
    let hd = s.head_dim;
    let krb = K::row_bytes(hd);
    let cl = CHUNK.min(rows[0].kv_len - c0);
    debug_assert!(rows[..R].iter().all(|r| CHUNK.min(r.kv_len - c0) == cl));
    let q: [*const f32; R] = std::array::from_fn(|r| rows[r].q);
    let mut j = 0;
    if W {
        // Sixteen keys a step for one row, eight for two, four for four: eight 16-lane FMA
        // chains.
        let step = 16 / R;
        while j + step <= cl {
            // SAFETY: keys c0+j .. c0+j+step < the rows' kv_len; AVX-512 F where `W`.
            unsafe {
                let kj = kc.add(j * krb);
                match R {
                    1 => put_scores_512::<8, R, 16>(
                        ph,
                        j,
                        s.scale,
                        &score_keys_512::<K, 8, R>(q, kj, hd),
                    ),
                    2 => put_scores_512::<4, R, 8>(
                        ph,
                        j,
                        s.scale,
                        &score_keys_512::<K, 4, R>(q, kj, hd),
                    ),
                    _ => put_scores_512::<2, R, 4>(
                        ph,
                        j,
                        s.scale,
                        &score_keys_512::<K, 2, R>(q, kj, hd),
                    ),
                }
            }
            j += step;
        }
    }
    // Steps of `C / R` keys, `C` FMA chains: the same per-key arithmetic at every size.
    macro_rules! score_steps {
        ($c:literal, $n2:literal, $n4:literal) => {
            let step = $c / R;
            while j + step <= cl {
                // SAFETY: keys c0+j .. c0+j+step < the rows' kv_len.
                unsafe {
                    let kj = kc.add(j * krb);
                    match R {
                        1 => put_scores(ph, j, s.scale, &score_keys::<K, $c, R>(q, kj, hd)),
                        2 => put_scores(ph, j, s.scale, &score_keys::<K, $n2, R>(q, kj, hd)),
                        _ => put_scores(ph, j, s.scale, &score_keys::<K, $n4, R>(q, kj, hd)),
                    }
                }
                j += step;
            }
        };
    }
    if X {
        // With AVX-512 VL's 32 registers, sixteen chains: eight left the FMA ports idle
        // whenever a chain's 4-cycle latency was not covered (a 64-token prompt at 2048
        // over an F16 cache, Zen 4: 15.6 → 14.2 ms).
        score_steps!(16, 8, 4);
    }
    // Eight keys a step for one row, four for two rows, two for four: eight FMA chains, and
    // every key's sum formed exactly as alone.
    score_steps!(8, 4, 2);
    while j < cl {
        // SAFETY: key c0+j < the rows' kv_len.
        unsafe {
            put_scores(
                ph,
                j,
                s.scale,
                &score_keys::<K, 1, R>(q, kc.add(j * krb), hd),
            )
        };
        j += 1;
    }
    let mut cs = [0f32; R];
    for r in 0..R {
        // SAFETY: AVX2 and FMA (AVX-512 F where `W`) are enabled where this is inlined.
        cs[r] = unsafe { chunk_softmax::<W>(&mut ph[r][..cl], &mut st[r]) };
    }
    let cv: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(cs[r]));
    let out: [*mut f32; R] = std::array::from_fn(|r| rows[r].out);
    let p: [&[f32]; R] = std::array::from_fn(|r| &ph[r][..cl]);
    let mut d = 0;
    // SAFETY: each row's output has hd floats; value rows c0+j < their kv_len.
    unsafe {
        let at = |d: usize| -> [*mut f32; R] { std::array::from_fn(|r| out[r].add(d)) };
        if W {
            // Eight 16-lane accumulators (one row, 128 values; two, 64 each; four, 32).
            let width = 128 / R;
            while d + width <= hd {
                match R {
                    1 => weigh_values_512::<V, 8, R>(first, at(d), cs, p, vc, d, hd),
                    2 => weigh_values_512::<V, 4, R>(first, at(d), cs, p, vc, d, hd),
                    _ => weigh_values_512::<V, 2, R>(first, at(d), cs, p, vc, d, hd),
                }
                d += width;
            }
        }
        // `C` accumulators over `8C / R` values a call: each lane the same chain at every C.
        macro_rules! weigh_steps {
            ($c:literal, $u2:literal, $u4:literal) => {
                let width = 8 * $c / R;
                while d + width <= hd {
                    match R {
                        1 => weigh_values::<V, $c, R>(first, at(d), cv, p, vc, d, hd),
                        2 => weigh_values::<V, $u2, R>(first, at(d), cv, p, vc, d, hd),
                        _ => weigh_values::<V, $u4, R>(first, at(d), cv, p, vc, d, hd),
                    }
                    d += width;
                }
            };
        }
        if X {
            // Sixteen accumulators (one row, 128 values; two, 64 each; four, 32).
            weigh_steps!(16, 8, 4);
        }
        // Eight accumulators: eight FMA chains in flight over the chunk's keys (one row,
        // 64 values; two rows, 32 values each; four rows, 16).
        weigh_steps!(8, 4, 2);
        while d < hd {
            weigh_values::<V, 1, R>(first, at(d), cv, p, vc, d, hd);
            d += 8;
        }
    }
}

/// The scores of keys `j + u` from their accumulators `a[r][u]`, summed and scaled, into
/// each row's chunk of scores; `N · R` a multiple of 8 (eight sums at a time) or `N` = 1.
///
/// # Safety
/// AVX2 and FMA present.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn put_scores<const N: usize, const R: usize>(
    ph: &mut [[f32; CHUNK]],
    j: usize,
    scale: f32,
    a: &[[__m256; N]; R],
) {
    if !(N * R).is_multiple_of(8) {
        for (row, ar) in ph.iter_mut().zip(a) {
            for (pj, v) in row[j..j + N].iter_mut().zip(ar) {
                *pj = hsum(*v) * scale;
            }
        }
        return;
    }
    let mut sums = [0f32; 8];
    for f0 in (0..N * R).step_by(8) {
        let v = hsum8(std::array::from_fn(|e| a[(f0 + e) / N][(f0 + e) % N]));
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), _mm256_mul_ps(v, _mm256_set1_ps(scale))) };
        for (e, &v) in sums.iter().enumerate() {
            let f = f0 + e;
            ph[f / N][j + f % N] = v;
        }
    }
}

/// [`put_scores`] for [`score_keys_512`]'s accumulators (`2P` keys per row, `P · R` = 8
/// registers, 16 scores): [`hsum8`]'s tree on four keys per register, each sum in
/// [`hsum`]'s order.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA present; `P · R` = 8 and `N` = `2P`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn put_scores_512<const P: usize, const R: usize, const N: usize>(
    ph: &mut [[f32; CHUNK]],
    j: usize,
    scale: f32,
    a: &[[__m512; P]; R],
) {
    debug_assert!(N == 2 * P && P * R == 8);
    let z: [__m512; 8] = std::array::from_fn(|f| a[f / P][f % P]);
    // Each key's halves added: [A.key0, A.key1, B.key0, B.key1], 4 lanes each.
    let halves = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    };
    let twos = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(x, y),
            _mm512_shuffle_ps::<0xEE>(x, y),
        )
    };
    let q0 = twos(halves(z[0], z[1]), halves(z[2], z[3]));
    let q1 = twos(halves(z[4], z[5]), halves(z[6], z[7]));
    // Position 4k + m holds key 4m + k.
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(q0, q1),
        _mm512_shuffle_ps::<0xDD>(q0, q1),
    );
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let v = _mm512_mul_ps(_mm512_permutexvar_ps(idx, r), _mm512_set1_ps(scale));
    let mut sums = [0f32; 16];
    // SAFETY: 16 floats.
    unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), v) };
    for (f, &v) in sums.iter().enumerate() {
        ph[f / N][j + f % N] = v;
    }
}

/// The online softmax's step for one row's chunk of scores `ph`: the new running max, the
/// exponentials in place, the running sum rescaled and increased; returns the factor the
/// row's running weighted values are rescaled by. With `W`, the exponentials run 16 lanes
/// at a time ([`exp512`]) and each half joins the 8-lane sum in turn, so the bits are the
/// same.
///
/// # Safety
/// AVX2 and FMA must be present, and AVX-512 F where `W`: only inlined into a function
/// that enables them.
#[inline(always)]
unsafe fn chunk_softmax<const W: bool>(ph: &mut [f32], st: &mut PartState) -> f32 {
    let cl = ph.len();
    // The chunk's max, 8 lanes at a time: `f32::max` folded one score after another is a
    // chain of compare-and-blend steps that cost a prompt's attention about as much as its
    // products. A max is exact in any order, and `max_ps(x, m)` keeps `m` where `x` is NaN,
    // as `f32::max` ignores NaN.
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut j = 0;
    // SAFETY: j + 8 <= cl.
    unsafe {
        while j + 8 <= cl {
            mv = _mm256_max_ps(_mm256_loadu_ps(ph.as_ptr().add(j)), mv);
            j += 8;
        }
    }
    let cmax = ph[j..].iter().fold(hmax(mv), |m, &x| m.max(x));
    let new_max = st.max.max(cmax);
    let corr = if st.max == f32::NEG_INFINITY {
        0.0
    } else {
        let e = exp256(_mm256_set1_ps(st.max - new_max));
        _mm_cvtss_f32(_mm256_castps256_ps128(e))
    };
    st.max = new_max;
    let nm = _mm256_set1_ps(new_max);
    let mut j = 0;
    let mut sum = _mm256_setzero_ps();
    if W {
        let nm16 = _mm512_set1_ps(new_max);
        // SAFETY: j + 16 <= cl; AVX-512 F where `W`.
        unsafe {
            while j + 16 <= cl {
                let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(ph.as_ptr().add(j)), nm16));
                _mm512_storeu_ps(ph.as_mut_ptr().add(j), e);
                sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
                let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e));
                sum = _mm256_add_ps(sum, _mm256_castpd_ps(hi));
                j += 16;
            }
        }
    }
    // SAFETY: j + 8 <= cl.
    unsafe {
        while j + 8 <= cl {
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(ph.as_ptr().add(j)), nm));
            _mm256_storeu_ps(ph.as_mut_ptr().add(j), e);
            sum = _mm256_add_ps(sum, e);
            j += 8;
        }
    }
    let mut psum = hsum(sum);
    for pj in &mut ph[j..cl] {
        let e = exp256(_mm256_set1_ps(*pj - new_max));
        *pj = _mm_cvtss_f32(_mm256_castps256_ps128(e));
        psum += *pj;
    }
    st.denom = st.denom * corr + psum;
    corr
}

/// Heads up to which a chunk of Q8_0 keys and values is widened once into f32 on the stack
/// (32 KiB each), so the rows sharing the chunk read plain floats instead of each
/// converting it again. The widened values are exactly what the loaders produce.
const WIDEN_MAX_HD: usize = 256;

/// Rows sharing a chunk up to which it is read in its stored type even so: a decode step has
/// only its group's few query heads per KV head, and for them converting while reading costs
/// less than writing and re-reading the widened copy (at depth 2048 with a Q8_0 cache, 35
/// against 23–29 tok/s for Qwen3-0.6B's 2 rows; a prompt's 16 rows gain 25% from widening).
const WIDEN_MIN_ROWS: usize = 4;

/// Whether `rows` query rows with heads of `hd` widen each chunk of keys and values to f32
/// once before reading it.
fn widens<K: KvLoad, V: KvLoad>(hd: usize, rows: usize) -> bool {
    (K::WIDEN || V::WIDEN) && hd <= WIDEN_MAX_HD && rows > WIDEN_MIN_ROWS
}

/// Rows `0..n` of `hd` values at `src` (read by `L`) as f32 rows at `dst`.
///
/// # Safety
/// AVX2, FMA and F16C present; `src` holds `n` rows; `dst` has room for `n * hd` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_rows<L: KvLoad>(src: *const u8, n: usize, hd: usize, dst: *mut f32) {
    let rb = L::row_bytes(hd);
    for r in 0..n {
        let mut i = 0;
        while i < hd {
            // SAFETY: the caller's promise; i + 8 <= hd (hd is a multiple of 8).
            unsafe { _mm256_storeu_ps(dst.add(r * hd + i), L::load8(src.add(r * rb), i)) };
            i += 8;
        }
    }
}

/// Positions per attention partition. Each row's softmax runs over the partitions one at a
/// time and folds each into its running total in order ([`fold_part`]), so a long row can be
/// split across threads by partitions ([`attend_rows_partial`], [`merge_parts`]) and still
/// give the bits of one thread. A multiple of [`CHUNK`], so chunks never straddle two.
pub const PART: usize = 1024;

/// Largest head size (the scalar reference's limit): the per-row partition buffers live on
/// the stack.
const MAX_HD: usize = crate::cpu::scalar::MAX_HEAD_DIM;

/// One partition's softmax state for one row: its running max, its sum of exponentials and
/// (in a buffer beside) its unnormalized weighted values.
#[derive(Clone, Copy)]
pub struct PartState {
    pub max: f32,
    pub denom: f32,
}

impl PartState {
    pub const EMPTY: PartState = PartState {
        max: f32::NEG_INFINITY,
        denom: 0.0,
    };
}

/// Positions `p0..p1` (clipped to each row's `kv_len`; a multiple of [`CHUNK`] apart unless
/// `p1` ends the rows) for every row: online softmax over chunks from an empty state, the
/// unnormalized weighted values of row `h` into `bufs + h * hd`. Rows that see no position
/// of the range are left [`PartState::EMPTY`] (and their buffer untouched).
///
/// # Safety
/// As for [`attend_rows`]; `bufs` has room for `rows.len() * hd` floats, or is null to
/// write each row's values to its own output; only inlined into
/// [`attend_part_avx2`] (`W` and `X` false), [`attend_part_avx2_x`] (`X` true) or
/// [`attend_part_avx512`] (`W` true).
#[inline(always)]
unsafe fn attend_part<K: KvLoad, V: KvLoad, const W: bool, const X: bool>(
    s: &AttentionShape,
    rows: &[AttnRow],
    k: *const u8,
    v: *const u8,
    (p0, p1): (usize, usize),
    bufs: *mut f32,
    state: &mut [PartState; MAX_ROWS],
) {
    let hd = s.head_dim;
    let kv_end = rows.iter().map(|r| r.kv_len).max().unwrap_or(0).min(p1);
    let mut p = [[0.0f32; CHUNK]; MAX_ROWS];
    // The rows as `rows_chunk` sees them: writing into this partition's buffers.
    let mut part_rows = [AttnRow {
        q: std::ptr::null(),
        out: std::ptr::null_mut(),
        kv_len: 0,
    }; MAX_ROWS];
    for (h, r) in rows.iter().enumerate() {
        state[h] = PartState::EMPTY;
        let out = if bufs.is_null() {
            r.out
        } else {
            // SAFETY: row h's buffer is inside `bufs`.
            unsafe { bufs.add(h * hd) }
        };
        part_rows[h] = AttnRow { out, ..*r };
    }
    let rows = &part_rows[..rows.len()];
    let (krb, vrb) = (K::row_bytes(hd), V::row_bytes(hd));
    let widen = widens::<K, V>(hd, rows.len());
    let mut kbuf = [std::mem::MaybeUninit::<f32>::uninit(); CHUNK * WIDEN_MAX_HD];
    let mut vbuf = [std::mem::MaybeUninit::<f32>::uninit(); CHUNK * WIDEN_MAX_HD];
    let mut c0 = p0;
    while c0 < kv_end {
        // SAFETY (whole loop): chunk rows c0 .. c0 + n < kv_end are inside `k` and `v`; each
        // row's use of them is covered by `rows_chunk`'s contract.
        unsafe {
            let (kc, vc) = (k.add(c0 * krb), v.add(c0 * vrb));
            // The partition's first chunk starts each row's values from zero.
            let at = (c0, c0 == p0);
            if widen {
                let n = CHUNK.min(kv_end - c0);
                let kw: *const u8 = if K::IS_F32 {
                    kc
                } else {
                    widen_rows::<K>(kc, n, hd, kbuf.as_mut_ptr().cast());
                    kbuf.as_ptr().cast()
                };
                let vw: *const u8 = if V::IS_F32 {
                    vc
                } else {
                    widen_rows::<V>(vc, n, hd, vbuf.as_mut_ptr().cast());
                    vbuf.as_ptr().cast()
                };
                chunk_rows::<F32Rows, F32Rows, W, X>(s, rows, at, (kw, vw), &mut p, state);
            } else {
                chunk_rows::<K, V, W, X>(s, rows, at, (kc, vc), &mut p, state);
            }
        }
        c0 += CHUNK;
    }
}

/// The entries that compile [`attend_part`] with each set of target features: the same
/// body, so the same bits, in the forms the features allow.
macro_rules! attend_part_entry {
    ($(#[$doc:meta])* $name:ident, $features:literal, $w:literal, $x:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        unsafe fn $name<K: KvLoad, V: KvLoad>(
            s: &AttentionShape,
            rows: &[AttnRow],
            kv: (*const u8, *const u8),
            range: (usize, usize),
            bufs: *mut f32,
            state: &mut [PartState; MAX_ROWS],
        ) {
            // SAFETY: the caller's promise.
            unsafe { attend_part::<K, V, $w, $x>(s, rows, kv.0, kv.1, range, bufs, state) }
        }
    };
}

attend_part_entry!(
    /// [`attend_part`] with the AVX2 kernels.
    ///
    /// # Safety
    /// As for [`attend_part`]; AVX2, FMA and F16C present.
    attend_part_avx2,
    "avx2,fma,f16c",
    false,
    false
);

attend_part_entry!(
    /// [`attend_part`] with the AVX2 forms and the 32 vector registers of AVX-512 VL.
    ///
    /// # Safety
    /// As for [`attend_part_avx2`], with AVX-512 F and VL present.
    attend_part_avx2_x,
    "avx512f,avx512vl,avx2,fma,f16c",
    false,
    true
);

attend_part_entry!(
    /// [`attend_part`] with the AVX-512 forms of the score and value products: twice the
    /// lanes per FMA (a prompt's attention is bound by them), the same bits.
    ///
    /// # Safety
    /// As for [`attend_part`]; AVX-512 F, AVX2, FMA and F16C present.
    attend_part_avx512,
    "avx512f,avx2,fma,f16c",
    true,
    false
);

/// [`attend_part`] in the forms `width` names.
///
/// # Safety
/// As for [`attend_part_avx2`], and for [`attend_part_avx512`] and [`attend_part_avx2_x`]
/// (AVX-512 F and VL) unless `width` is [`AttentionWidth::Ymm`].
#[inline]
unsafe fn attend_part_on<K: KvLoad, V: KvLoad>(
    width: AttentionWidth,
    s: &AttentionShape,
    rows: &[AttnRow],
    kv: (*const u8, *const u8),
    range: (usize, usize),
    bufs: *mut f32,
    state: &mut [PartState; MAX_ROWS],
) {
    // SAFETY: the caller's promise.
    unsafe {
        match width {
            AttentionWidth::Ymm => attend_part_avx2::<K, V>(s, rows, kv, range, bufs, state),
            // Widened chunks keep to sixteen registers: with 32 the 64-token prompt at 2048
            // over a Q8_0 cache ran 22.0 against 18.0 ms (Zen 4), the same slowdown as
            // their 16-lane forms', not understood (docs/decisions/attention-forms-by-cpu.md).
            AttentionWidth::ZmmExceptF16OrWidened if widens::<K, V>(s.head_dim, rows.len()) => {
                attend_part_avx2::<K, V>(s, rows, kv, range, bufs, state)
            }
            AttentionWidth::ZmmExceptF16OrWidened if K::IS_F16 || V::IS_F16 => {
                attend_part_avx2_x::<K, V>(s, rows, kv, range, bufs, state)
            }
            AttentionWidth::Zmm | AttentionWidth::ZmmExceptF16OrWidened => {
                attend_part_avx512::<K, V>(s, rows, kv, range, bufs, state)
            }
        }
    }
}

/// Chunk `c0` for every row that sees a key of it, four or two rows at a time where
/// neighbours see the same keys of it (a token's heads, and every row whose causal limit is
/// past the chunk's end), else alone.
///
/// # Safety
/// As for [`rows_chunk`], for each row with `kv_len > c0`; `p` and `state` hold an entry per
/// row.
#[inline(always)]
unsafe fn chunk_rows<K: KvLoad, V: KvLoad, const W: bool, const X: bool>(
    s: &AttentionShape,
    rows: &[AttnRow],
    (c0, first): (usize, bool),
    kv: (*const u8, *const u8),
    p: &mut [[f32; CHUNK]; MAX_ROWS],
    state: &mut [PartState; MAX_ROWS],
) {
    let seen = |r: &AttnRow| CHUNK.min(r.kv_len.saturating_sub(c0));
    let at = (c0, first);
    let mut h = 0;
    while h < rows.len() {
        let cl = seen(&rows[h]);
        let same = |n: usize| h + n <= rows.len() && rows[h..h + n].iter().all(|r| seen(r) == cl);
        if cl == 0 {
            h += 1;
        } else if same(4) {
            // SAFETY: the caller's promise, for rows h .. h + 4.
            unsafe {
                rows_chunk::<K, V, 4, W, X>(s, &rows[h..], at, kv, &mut p[h..], &mut state[h..])
            };
            h += 4;
        } else if same(2) {
            // SAFETY: the caller's promise, for rows h and h + 1.
            unsafe {
                rows_chunk::<K, V, 2, W, X>(s, &rows[h..], at, kv, &mut p[h..], &mut state[h..])
            };
            h += 2;
        } else {
            // SAFETY: the caller's promise, for row h.
            unsafe {
                rows_chunk::<K, V, 1, W, X>(s, &rows[h..], at, kv, &mut p[h..], &mut state[h..])
            };
            h += 1;
        }
    }
}

/// Folds one partition (`part`, values at `buf`) into a row's running total (`total`,
/// values at `out`), as the online softmax folds chunks: both rescaled to the larger max.
/// The first partition is taken as it is, and an empty one changes nothing.
///
/// # Safety
/// AVX2 present; `out` and `buf` hold `hd` floats (`hd` a multiple of 8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn fold_part(
    hd: usize,
    total: &mut PartState,
    out: *mut f32,
    part: PartState,
    buf: *const f32,
) {
    if part.max == f32::NEG_INFINITY {
        return;
    }
    if total.max == f32::NEG_INFINITY {
        *total = part;
        // SAFETY: both hold hd floats and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(buf, out, hd) };
        return;
    }
    let m = total.max.max(part.max);
    let e = exp256(_mm256_setr_ps(
        total.max - m,
        part.max - m,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ));
    let mut ab = [0f32; 8];
    // SAFETY: 8 floats.
    unsafe { _mm256_storeu_ps(ab.as_mut_ptr(), e) };
    let (a, b) = (ab[0], ab[1]);
    total.denom = total.denom * a + part.denom * b;
    total.max = m;
    let (av, bv) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
    let mut d = 0;
    // SAFETY: d + 8 <= hd.
    unsafe {
        while d < hd {
            let o = _mm256_mul_ps(_mm256_loadu_ps(out.add(d)), av);
            let p = _mm256_mul_ps(_mm256_loadu_ps(buf.add(d)), bv);
            _mm256_storeu_ps(out.add(d), _mm256_add_ps(o, p));
            d += 8;
        }
    }
}

/// `out · (1 / denom)` for a finished row.
///
/// # Safety
/// AVX2 present; `out` holds `hd` floats (`hd` a multiple of 8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn normalize_row(hd: usize, total: PartState, out: *mut f32) {
    let inv = _mm256_set1_ps(1.0 / total.denom);
    let mut d = 0;
    // SAFETY: d + 8 <= hd.
    unsafe {
        while d < hd {
            _mm256_storeu_ps(out.add(d), _mm256_mul_ps(_mm256_loadu_ps(out.add(d)), inv));
            d += 8;
        }
    }
}

/// Attention of up to [`MAX_ROWS`] query rows that share one KV head, reading each chunk of
/// keys and values from memory once for all of them (it stays in L1 while each row uses
/// it): the heads of a group, and in a prompt several tokens' heads. Online softmax over
/// chunks of keys: scores of a chunk, the new running max, rescaling of the running sums,
/// then exponentials and the weighted values. Each row's arithmetic depends only on its own
/// query and `kv_len`, so a row gives the same bits whatever rows it is grouped with.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `head_dim` is a multiple of 8 (of 32 for Q8_0 rows);
/// `k` and `v` point to at least the largest `kv_len` rows of `head_dim` values in the types
/// `K` and `V` read; each row's `q` and `out` point to `head_dim` floats, the outputs
/// distinct and written by no one else during the call.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_rows<K: KvLoad, V: KvLoad>(
    width: AttentionWidth,
    s: &AttentionShape,
    rows: &[AttnRow],
    k: *const u8,
    v: *const u8,
) {
    let hd = s.head_dim;
    debug_assert!(rows.len() <= MAX_ROWS && hd.is_multiple_of(8) && hd <= MAX_HD);
    let kv_max = rows.iter().map(|r| r.kv_len).max().unwrap_or(0);
    let mut state = [PartState::EMPTY; MAX_ROWS];
    let total = if kv_max <= PART {
        // One partition: its values go straight to the outputs, which folding the only
        // partition into an empty total would copy them to unchanged.
        // SAFETY: the caller's promise; a null buffer writes each row's own output.
        unsafe {
            attend_part_on::<K, V>(
                width,
                s,
                rows,
                (k, v),
                (0, kv_max),
                std::ptr::null_mut(),
                &mut state,
            )
        };
        state
    } else {
        let mut total = [PartState::EMPTY; MAX_ROWS];
        let mut bufs = [std::mem::MaybeUninit::<f32>::uninit(); MAX_ROWS * MAX_HD];
        let bp: *mut f32 = bufs.as_mut_ptr().cast();
        let mut p0 = 0;
        while p0 < kv_max {
            let p1 = (p0 + PART).min(kv_max);
            // SAFETY: the caller's promise; `bufs` holds MAX_ROWS rows of up to MAX_HD floats.
            unsafe { attend_part_on::<K, V>(width, s, rows, (k, v), (p0, p1), bp, &mut state) };
            for (h, row) in rows.iter().enumerate() {
                // SAFETY: row h's output and buffer hold hd floats.
                unsafe { fold_part(hd, &mut total[h], row.out, state[h], bp.add(h * hd)) };
            }
            p0 = p1;
        }
        total
    };
    for (h, row) in rows.iter().enumerate() {
        // SAFETY: each output row has hd floats.
        unsafe { normalize_row(hd, total[h], row.out) };
    }
}

/// One partition (`p0..p1`) of [`attend_rows`]: each row's state to `state` and its
/// unnormalized values to `bufs + h * hd`, for [`merge_parts`] to fold in order.
///
/// # Safety
/// As for [`attend_rows_any`]; `bufs` has room for `rows.len() * hd` floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_rows_partial(
    width: AttentionWidth,
    s: &AttentionShape,
    rows: &[AttnRow],
    k: KvRows<'_>,
    v: KvRows<'_>,
    range: (usize, usize),
    bufs: *mut f32,
    state: &mut [PartState; MAX_ROWS],
) {
    let (kp, vp) = (kv_ptr(k), kv_ptr(v));
    use KvRows::{F16, F32, Q8_0};
    // SAFETY (every arm): the caller's promise, with the loaders of the rows' own types.
    unsafe {
        match (k, v) {
            (F32(_), F32(_)) => {
                attend_part_on::<F32Rows, F32Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (F32(_), F16(_)) => {
                attend_part_on::<F32Rows, F16Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (F32(_), Q8_0(_)) => {
                attend_part_on::<F32Rows, Q8Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (F16(_), F32(_)) => {
                attend_part_on::<F16Rows, F32Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (F16(_), F16(_)) => {
                attend_part_on::<F16Rows, F16Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (F16(_), Q8_0(_)) => {
                attend_part_on::<F16Rows, Q8Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (Q8_0(_), F32(_)) => {
                attend_part_on::<Q8Rows, F32Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (Q8_0(_), F16(_)) => {
                attend_part_on::<Q8Rows, F16Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
            (Q8_0(_), Q8_0(_)) => {
                attend_part_on::<Q8Rows, Q8Rows>(width, s, rows, (kp, vp), range, bufs, state)
            }
        }
    }
}
