//! AVX-512 VNNI and AVX2 products of packed Q2_K–Q6_K weights ([`super::PackedK`])
//! with Q8_K activation rows: a group of 16 weight rows against a tile of tokens, each weight
//! line loaded and unpacked once for all the tokens of the tile. Prompts (VNNI: from 16
//! tokens; AVX2: every product of two tokens or more, batched decode included) unpack each
//! group's codes once, a few super-blocks at a time into a stack buffer, for all their tiles
//! ([`gemm_codes_vnni`], [`gemm_codes_avx2`]).
//!
//! Integer sums (exact in i32, as in `inferno_tensor::k_quants`):
//! - VNNI: the unsigned weight codes (4, 5 or 6 bits) are `vpdpbusd`'s unsigned operand and
//!   the activation's four bytes, broadcast, its signed one, so lane `r` accumulates row
//!   `r`'s products of one sub-block; the sub-block's 6-bit (or signed 8-bit) scale then
//!   multiplies the lane (`vpmulld`). Q2_K with AVX-512 VBMI, from two tokens, instead takes
//!   each 2-bit code times its 4-bit scale (at most 45, a byte) from a table (`vpermb`),
//!   which issues beside `vpdpbusd` where `vpmulld` takes its port ([`q2_scaled_vnni`]).
//! - AVX2: eight rows a vector; `maddubs` forms pairs (at most 2·63·128, no saturation) and
//!   `madd` against the row's scale, repeated in both 16-bit halves of its lane, forms the
//!   scaled sum of four products directly. On unpacked codes the pairs of a few lines of one
//!   sub-block are first added in i16, as many as cannot wrap ([`i16_lines`]).
//!
//! The mins (Q4_K, Q5_K) are products of 16-bit pairs (`vpdpwssd` / `madd`: two sub-blocks'
//! mins against their activation sums; Q2_K's per 16-value sub-block) and the offsets of
//! Q6_K (32) and Q3_K (4) are taken off with the activation block's sums of 16 values, as
//! the scalar products take the mins: on AVX2 as pair products against the scales, on VNNI
//! from each sub-block's sum before its scale multiplies in ([`code_offsets`]). Each
//! super-block is folded into the f32 accumulator with the scalar expression (separate
//! multiplies, no FMA), block after block, so every output is bit-identical to the scalar
//! dot product of its row.

use super::super::x86::{fifth_bit_256, nibble_codes_512};
use super::GROUP;
use super::{
    fifth_line, load_window, owned_lanes, qs_line, quant_line, store_window, x4, x_bsum_pair,
    x_bsums, x_d, x_min_pair, Codes, FifthBits, Job, CODE_LINES, KIND_Q2, KIND_Q2_SCALED, KIND_Q3,
    KIND_Q4, KIND_Q5, KIND_Q6, UNPACKED_BLOCKS, UNPACK_MIN_TOKENS,
};
use inferno_tensor::k_quants::Q8_K_BYTES;
use inferno_tensor::GgmlType;
use std::arch::x86_64::*;

/// Eight 8-bit scales at `p` (rows of one half-group) as i16 pairs `(s, s)` per i32 lane,
/// so `madd` of byte pairs against them gives `s · (pair sum)` per lane.
///
/// # Safety
/// 8 bytes at `p` must be readable; AVX2 enabled.
#[inline(always)]
unsafe fn scale_lanes_u8(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 8 bytes.
    let v = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p as *const __m128i) });
    _mm256_or_si256(v, _mm256_slli_epi32(v, 16))
}

/// As [`scale_lanes_u8`] for signed scales (Q6_K): the low 16 bits of each sign-extended
/// scale, in both halves of its lane.
///
/// # Safety
/// As for [`scale_lanes_u8`].
#[inline(always)]
unsafe fn scale_lanes_i8(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 8 bytes.
    let v = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(p as *const __m128i) });
    let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    _mm256_or_si256(lo, _mm256_slli_epi32(v, 16))
}

// ---------------------------------------------------------------------------------------
// AVX-512 VNNI
// ---------------------------------------------------------------------------------------

/// Writes the lanes of `v` (rows `g·16 ..` of token `t`'s output) that fall in the job's
/// `r0..r1`, with one masked store (no call to `memcpy` for 16 floats).
///
/// # Safety
/// The caller owns those output elements; AVX-512 F enabled.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_window_512(j: Job<'_>, g: usize, t: usize, v: __m512) {
    let first = g * GROUP;
    let (lo, hi) = owned_lanes(first, j.r0, j.r1);
    if lo < hi {
        let mask = ((1u32 << hi) - (1u32 << lo)) as __mmask16;
        // SAFETY: only the lanes `lo..hi`, rows inside `r0..r1`, are written.
        unsafe { _mm512_mask_storeu_ps(j.out.add(t * j.ldo + first), mask, v) };
    }
}

/// Quant line `8c + k` (`k mod 4 = M`) of the super-block at `blk` against the tokens `x`:
/// its low nibbles into `lo`, its high ones into `hi`. One token alone has only two
/// accumulator chains, which the latency of `vpdpbusd` would bound: it gets two per half,
/// lines alternating (exact in i32).
///
/// # Safety
/// `blk` is a packed Q4_K or Q5_K (`Chunks` form) super-block, each `x` a token's Q8_K
/// block; AVX-512 F/BW/VNNI enabled.
#[inline(always)]
unsafe fn q45_line_vnni<const T: usize, const FIVE: bool, const M: usize>(
    blk: *const u8,
    x: &[*const u8; T],
    c: usize,
    k: usize,
    lo: &mut [[__m512i; 2]; T],
    hi: &mut [[__m512i; 2]; T],
) {
    // A packed Q5_K reaches this kernel only in the `Chunks` form (see `PackedK::rows`).
    let ty = if FIVE { GgmlType::Q5_K } else { GgmlType::Q4_K };
    // SAFETY (this block): every line read is inside the packed super-block, every
    // activation byte inside the token's Q8_K block.
    unsafe {
        let wv = _mm512_loadu_si512(
            blk.add(qs_line(ty, FifthBits::Chunks, c, k) * 64) as *const __m512i
        );
        // This line's fifth bits are bits 2M and 2M + 1 of each byte of its chunk's
        // fifth-bit line.
        let h = if FIVE {
            _mm512_loadu_si512(blk.add(fifth_line(c, k) * 64) as *const __m512i)
        } else {
            _mm512_setzero_si512()
        };
        let [wl, wh] = nibble_codes_512::<FIVE, M>(wv, h);
        let a = if T == 1 { k % 2 } else { 0 };
        for t in 0..T {
            let xl = _mm512_set1_epi32(x4(x[t], 64 * c + 4 * k));
            let xh = _mm512_set1_epi32(x4(x[t], 64 * c + 32 + 4 * k));
            lo[t][a] = _mm512_dpbusd_epi32(lo[t][a], wl, xl);
            hi[t][a] = _mm512_dpbusd_epi32(hi[t][a], wh, xh);
        }
    }
    // Keep the loop line-major (as in the Q8_0 kernel): otherwise LLVM hoists all the loads
    // and spills the accumulators.
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Q4_K (`FIVE = false`) or Q5_K (`FIVE = true`), group `g`, tokens `t0..t0 + T`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q45_vnni<const T: usize, const FIVE: bool>(j: Job<'_>, g: usize, t0: usize) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..p.nsb {
        // SAFETY: super-block `b` of group `g` and of each token's row exist (sizes checked
        // by the caller).
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [_mm512_setzero_si512(); T];
        for c in 0..4 {
            // The next group's share a chunk at a time: bursts of at most 10 lines.
            prefetch_share(j, b, c, 4);
            let mut lo = [[_mm512_setzero_si512(); 2]; T];
            let mut hi = [[_mm512_setzero_si512(); 2]; T];
            for k4 in (0..8).step_by(4) {
                // Four lines with their fifth bits' positions as constants (see
                // `fifth_bits_512`).
                // SAFETY: forwarded; the lines are inside the super-block.
                unsafe {
                    q45_line_vnni::<T, FIVE, 0>(blk, &x, c, k4, &mut lo, &mut hi);
                    q45_line_vnni::<T, FIVE, 1>(blk, &x, c, k4 + 1, &mut lo, &mut hi);
                    q45_line_vnni::<T, FIVE, 2>(blk, &x, c, k4 + 2, &mut lo, &mut hi);
                    q45_line_vnni::<T, FIVE, 3>(blk, &x, c, k4 + 3, &mut lo, &mut hi);
                }
            }
            // SAFETY: sub-block scales 2c and 2c+1 of the 16 rows (lines 1–2).
            let (sl, sh) = unsafe {
                (
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(64 + 32 * c) as *const __m128i)),
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        blk.add(64 + 32 * c + 16) as *const __m128i
                    )),
                )
            };
            for t in 0..T {
                let (l, h) = if T == 1 {
                    (
                        _mm512_add_epi32(lo[t][0], lo[t][1]),
                        _mm512_add_epi32(hi[t][0], hi[t][1]),
                    )
                } else {
                    (lo[t][0], hi[t][0])
                };
                let s = _mm512_add_epi32(_mm512_mullo_epi32(l, sl), _mm512_mullo_epi32(h, sh));
                isum[t] = _mm512_add_epi32(isum[t], s);
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_q45_vnni(j, b, blk, &x, &isum, &mut acc) };
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_window_512(j, g, t0 + t, *a) };
    }
}

/// The end of a Q4_K or Q5_K super-block: the mins (two sub-blocks' 16-bit pair against the
/// activation's min pair) and the fold of `d · dx · isum − dmin · dx · msum` into `acc`,
/// the scalar expression.
///
/// # Safety
/// `blk` is packed super-block `b` (d and dmin at line 0, the mins at lines 3–4); each `x`
/// a token's Q8_K block `b` of a row quantized with its min pairs; AVX-512 F/BW/VNNI
/// enabled.
#[inline(always)]
unsafe fn fold_q45_vnni<const T: usize>(
    j: Job<'_>,
    b: usize,
    blk: *const u8,
    x: &[*const u8; T],
    isum: &[__m512i; T],
    acc: &mut [__m512; T],
) {
    let po = j.min_pairs_from(b);
    let mut msum = [_mm512_setzero_si512(); T];
    for pp in 0..4 {
        // SAFETY: the mins of sub-blocks 2pp, 2pp+1 (lines 3–4); the token's min pairs
        // (`PackedK::rows` checked the row size).
        unsafe {
            let m =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(192 + 32 * pp) as *const __m256i));
            for t in 0..T {
                let bs = _mm512_set1_epi32(x_min_pair(x[t], po, pp));
                msum[t] = _mm512_dpwssd_epi32(msum[t], m, bs);
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { fold_dmin_vnni(blk, x, isum, &msum, acc) };
}

/// `acc += d · dx · isum − dmin · dx · msum`, the scalar expression of the super-blocks with
/// mins (Q4_K, Q5_K, Q2_K).
///
/// # Safety
/// `blk` is a packed super-block with the 16 d then the 16 dmin at line 0; each `x` a
/// token's Q8_K block; AVX-512 F and F16C enabled.
#[inline(always)]
unsafe fn fold_dmin_vnni<const T: usize>(
    blk: *const u8,
    x: &[*const u8; T],
    isum: &[__m512i; T],
    msum: &[__m512i; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: line 0 holds the 16 d then the 16 dmin.
    let (dw, dm) = unsafe {
        (
            _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i)),
            _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i)),
        )
    };
    for t in 0..T {
        // SAFETY: the token's block scale.
        let dx = _mm512_set1_ps(unsafe { x_d(x[t]) });
        let a = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[t]));
        let m = _mm512_mul_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(msum[t]));
        acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(a, m));
    }
}

/// `2^SHIFT` · each token's 16 sums of 16 quants, as i32: the offset that the unsigned
/// codes of a type with signed sub-block scales (Q6_K: values + 32, Q3_K: values + 4) add
/// to each 16-value sub-block's product. Each sub-block's product is taken off its offset
/// before its scale multiplies in, the scalar sum in another order (exact in i32): one
/// subtraction per sub-block, beside `vpdpbusd`, where the offsets' 16-bit pair products
/// against the scales took the multiplier port it needs.
///
/// # Safety
/// Each `x` a token's Q8_K block; AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn code_offsets<const T: usize, const SHIFT: u32>(x: &[*const u8; T]) -> [[i32; 16]; T] {
    let mut off = [[0i32; 16]; T];
    for t in 0..T {
        // SAFETY: the block's 16 i16 sums; `off[t]` holds 16 i32.
        unsafe {
            let s = _mm512_cvtepi16_epi32(_mm256_loadu_si256(x_bsums(x[t]) as *const __m256i));
            _mm512_storeu_si512(
                off[t].as_mut_ptr() as *mut __m512i,
                _mm512_slli_epi32::<SHIFT>(s),
            );
        }
    }
    off
}

/// Sub-block product `a` (16 rows, of codes with their offset) less the token's offset
/// `off`, times the rows' scales `sc`.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn scaled_sub_block(a: __m512i, off: i32, sc: __m512i) -> __m512i {
    _mm512_mullo_epi32(_mm512_sub_epi32(a, _mm512_set1_epi32(off)), sc)
}

/// The end of a super-block of a type with signed sub-block scales (Q6_K, Q3_K): folds
/// each token's integer sum into `acc` with the scalar expression `d · dx · isum`.
///
/// # Safety
/// `blk` is a packed super-block with `d` at line 0; each `x` a token's Q8_K block;
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn fold_d_vnni<const T: usize>(
    blk: *const u8,
    x: &[*const u8; T],
    isum: &[__m512i; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: line 0 holds the 16 d.
    let dw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i)) };
    for t in 0..T {
        // SAFETY: the token's block scale.
        let dx = _mm512_set1_ps(unsafe { x_d(x[t]) });
        let v = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[t]));
        acc[t] = _mm512_add_ps(acc[t], v);
    }
}

/// Q6_K code `s` of the four that the line triple `la`, `lb`, `hh` holds (see `packed_k`):
/// a nibble of `la` or `lb` and two bits of `hh`, joined in one ternary op.
///
/// # Safety
/// AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn q6_code_512(la: __m512i, lb: __m512i, hh: __m512i, s: usize) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0f);
    let (lo, hi) = match s {
        0 => (_mm512_and_si512(la, m4), _mm512_slli_epi16(hh, 4)),
        1 => (_mm512_and_si512(lb, m4), _mm512_slli_epi16(hh, 2)),
        2 => (_mm512_and_si512(_mm512_srli_epi16(la, 4), m4), hh),
        _ => (
            _mm512_and_si512(_mm512_srli_epi16(lb, 4), m4),
            _mm512_srli_epi16(hh, 2),
        ),
    };
    // lo | (hi & 0x30)
    _mm512_ternarylogic_epi32::<0xF8>(lo, hi, _mm512_set1_epi8(0x30))
}

/// Q6_K sub-block `8h + 2S + q` of the super-block at `blk` (slot `S` of the line triples
/// `(h, 4q ..= 4q + 3)`): each token's product of its 16 codes, less the codes' offset
/// (`off`: 32 · the token's sum of those 16 quants), times the rows' scale, added to `isum`.
/// `line(kk)` gives the nibble line and the high-bit line of slot `S` of triple
/// `(h, 4q + kk)`.
///
/// # Safety
/// `blk` is a packed Q6_K super-block, each `x` a token's Q8_K block; AVX-512 F/BW/VNNI
/// enabled.
#[inline(always)]
unsafe fn q6_sub_block_vnni<const T: usize, const S: usize>(
    line: impl Fn(usize) -> (__m512i, __m512i),
    blk: *const u8,
    x: &[*const u8; T],
    off: &[[i32; 16]; T],
    h: usize,
    q: usize,
    isum: &mut [__m512i; T],
) {
    let gi = 8 * h + 2 * S + q;
    let mut a = [_mm512_setzero_si512(); T];
    for kk in 0..4 {
        let k = 4 * q + kk;
        // SAFETY (this block): the activation quants.
        unsafe {
            let (lo, hh) = line(kk);
            let c = q6_code_512(lo, lo, hh, S);
            for t in 0..T {
                let xv = _mm512_set1_epi32(x4(x[t], 128 * h + 32 * S + 4 * k));
                a[t] = _mm512_dpbusd_epi32(a[t], c, xv);
            }
        }
    }
    // SAFETY: group gi's 16 signed scales (lines 1–4).
    let sc =
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(64 + 16 * gi) as *const __m128i)) };
    for t in 0..T {
        // SAFETY: AVX-512 F, the caller's.
        isum[t] = _mm512_add_epi32(isum[t], unsafe { scaled_sub_block(a[t], off[t][gi], sc) });
    }
}

/// Q6_K, group `g`, tokens `t0..t0 + T`.
///
/// Written one sub-block (16 values of each row) at a time, the slot a constant: its codes
/// taken out of the packed lines with the slot's own shifts, one accumulator per token,
/// then the codes' offset taken off and the rows' scale multiplied in. Written as four
/// slots of a line triple at once, with the offsets as pair products at the end, the same
/// product ran 17% slower (8 tokens, 3072 × 1024, one Zen 4 thread: 247.8 against 204.7 µs,
/// `cargo bench --bench kernels -- q6_k`; LLVM spilled the 4·T accumulators).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_vnni<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, 0, 1);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        // SAFETY: the tokens' blocks.
        let off = unsafe { code_offsets::<T, 5>(&x) };
        let mut isum = [_mm512_setzero_si512(); T];
        for h in 0..2 {
            for q in 0..2 {
                // Line `i` of the triple (h, 4q + kk).
                let load = |kk: usize, i: usize| {
                    // SAFETY: kk < 4 and i < 3: a line inside the super-block.
                    unsafe {
                        let l = blk.add((5 + (8 * h + 4 * q + kk) * 3 + i) * 64);
                        _mm512_loadu_si512(l as *const __m512i)
                    }
                };
                // Several tokens load the four triples once for the four slots, not once per
                // slot (8 tokens' 3072 × 1024 product from cache, one Zen 4 thread: 197.7 →
                // 185.0 µs median). One token, which waits on memory, measured 7% slower that
                // way (one stream of the Q6_K file, two alternated runs) and loads per slot.
                let lines: [[__m512i; 3]; 4] = if T > 1 {
                    std::array::from_fn(|kk| std::array::from_fn(|i| load(kk, i)))
                } else {
                    [[_mm512_setzero_si512(); 3]; 4]
                };
                let line = |kk: usize, s: usize| {
                    if T > 1 {
                        (lines[kk][s & 1], lines[kk][2])
                    } else {
                        (load(kk, s & 1), load(kk, 2))
                    }
                };
                // SAFETY (all four): the super-block and the tokens' blocks, as above.
                unsafe {
                    q6_sub_block_vnni::<T, 0>(|kk| line(kk, 0), blk, &x, &off, h, q, &mut isum);
                    q6_sub_block_vnni::<T, 1>(|kk| line(kk, 1), blk, &x, &off, h, q, &mut isum);
                    q6_sub_block_vnni::<T, 2>(|kk| line(kk, 2), blk, &x, &off, h, q, &mut isum);
                    q6_sub_block_vnni::<T, 3>(|kk| line(kk, 3), blk, &x, &off, h, q, &mut isum);
                }
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_d_vnni(blk, &x, &isum, &mut acc) };
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_window_512(j, g, t0 + t, *a) };
    }
}

/// The three packed Q3_K lines of one `k` at `l` (see `packed_k`).
///
/// # Safety
/// The three lines at `l` are readable; AVX-512 F enabled.
#[inline(always)]
unsafe fn q3_lines_512(l: *const u8) -> [__m512i; 3] {
    // SAFETY: the caller's promise.
    [0, 1, 2].map(|i| unsafe { _mm512_loadu_si512(l.add(64 * i) as *const __m512i) })
}

/// Q3_K code `s` of the four of runs `4·pass ..` (elements `32j + 4k + i`) in the line
/// triple `l` of one `k`: the first six come out with a shift and a mask, the last two
/// combine their low pair (from `X`, `Y`) with their third bit (from `Z`).
///
/// # Safety
/// AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn q3_code_512(l: &[__m512i; 3], pass: usize, s: usize) -> __m512i {
    let m7 = _mm512_set1_epi8(7);
    let m3 = _mm512_set1_epi8(3);
    let m4 = _mm512_set1_epi8(4);
    let [lx, ly, lz] = *l;
    match (pass, s) {
        (0, 0) => _mm512_and_si512(lx, m7),
        (0, 1) => _mm512_and_si512(_mm512_srli_epi16(lx, 3), m7),
        (0, 2) => _mm512_and_si512(ly, m7),
        (0, _) => _mm512_and_si512(_mm512_srli_epi16(ly, 3), m7),
        (_, 0) => _mm512_and_si512(lz, m7),
        (_, 1) => _mm512_and_si512(_mm512_srli_epi16(lz, 3), m7),
        // (a & 3) | b in one op.
        (_, 2) => _mm512_ternarylogic_epi32::<0xEC>(
            _mm512_srli_epi16(lx, 6),
            _mm512_and_si512(_mm512_srli_epi16(lz, 4), m4),
            m3,
        ),
        _ => _mm512_ternarylogic_epi32::<0xEC>(
            _mm512_srli_epi16(ly, 6),
            _mm512_and_si512(_mm512_srli_epi16(lz, 5), m4),
            m3,
        ),
    }
}

/// Q3_K, group `g`, tokens `t0..t0 + T`: the codes (0–7) into `vpdpbusd`, each sub-block's
/// sum times its signed scale, then `4 · Σ scale · bsum` taken off (the codes are the
/// values plus 4).
// Index loops: the slot index is also the layout's arithmetic (lines, sub-blocks).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_vnni<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, 0, 1);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        // SAFETY: the tokens' blocks.
        let off = unsafe { code_offsets::<T, 2>(&x) };
        let mut isum = [_mm512_setzero_si512(); T];
        for q in 0..2 {
            for pass in 0..2 {
                // Slot s: run 4·pass + s, elements 32(4·pass + s) + 16q .. +16, sub-block
                // 2(4·pass + s) + q.
                let mut a = [[_mm512_setzero_si512(); 4]; T];
                for kk in 0..4 {
                    let k = 4 * q + kk;
                    // SAFETY (this block): the three lines of k and the activation quants.
                    unsafe {
                        let lines = q3_lines_512(blk.add((quant_line(p.dtype) + 3 * k) * 64));
                        // Each code taken out just before its tokens' products: with the
                        // four taken out first, tokens outermost or slots, the tile of 4 ran
                        // 141 and 139 against 81 µs (4 × 3072 × 1024, one Zen 4 thread).
                        for s in 0..4 {
                            let c = q3_code_512(&lines, pass, s);
                            for t in 0..T {
                                let xv = _mm512_set1_epi32(x4(x[t], 32 * (4 * pass + s) + 4 * k));
                                a[t][s] = _mm512_dpbusd_epi32(a[t][s], c, xv);
                            }
                        }
                    }
                    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
                }
                for s in 0..4 {
                    let gi = 2 * (4 * pass + s) + q;
                    // SAFETY: sub-block gi's 16 signed scales (lines 1–4).
                    unsafe {
                        let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                            blk.add(64 + 16 * gi) as *const __m128i
                        ));
                        for t in 0..T {
                            let v = scaled_sub_block(a[t][s], off[t][gi], sc);
                            isum[t] = _mm512_add_epi32(isum[t], v);
                        }
                    }
                }
            }
        }
        // SAFETY: as for `q6_vnni`'s call.
        unsafe { fold_d_vnni(blk, &x, &isum, &mut acc) };
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_window_512(j, g, t0 + t, *a) };
    }
}

/// The end of a Q2_K super-block: the mins (high nibbles of the scale bytes, two
/// sub-blocks' 16-bit pair against the activation's pair of 16-value sums) and the fold of
/// `d · dx · isum − dmin · dx · msum` into `acc`, the scalar expression.
///
/// # Safety
/// `blk` is a packed Q2_K super-block; each `x` a token's Q8_K block; AVX-512 F/BW/VNNI
/// enabled.
#[inline(always)]
unsafe fn fold_q2_vnni<const T: usize>(
    blk: *const u8,
    x: &[*const u8; T],
    isum: &[__m512i; T],
    acc: &mut [__m512; T],
) {
    let mut msum = [_mm512_setzero_si512(); T];
    for pp in 0..8 {
        // SAFETY: the scale bytes of sub-blocks 2pp, 2pp+1 (lines 1–4); the sums.
        unsafe {
            let a = _mm_loadu_si128(blk.add(64 + 32 * pp) as *const __m128i);
            let b = _mm_loadu_si128(blk.add(64 + 32 * pp + 16) as *const __m128i);
            let pairs = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
            let m = _mm512_srli_epi16(_mm512_cvtepu8_epi16(pairs), 4);
            for t in 0..T {
                let bs = _mm512_set1_epi32(x_bsum_pair(x[t], pp));
                msum[t] = _mm512_dpwssd_epi32(msum[t], m, bs);
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { fold_dmin_vnni(blk, x, isum, &msum, acc) };
}

/// `code · scale` for the index `scale + 16 · code` (scale 0–15, code 0–3): the products of
/// Q2_K codes with their sub-block scales, at most 45.
const Q2_PRODUCTS: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = ((i >> 4) * (i & 15)) as u8;
        i += 1;
    }
    t
};

/// `vpshufb` indices repeating byte `r` of a 16-byte vector (broadcast to each 128-bit lane)
/// in bytes `4r .. 4r + 4`: one row's byte in each of its lane's four bytes.
const REPEAT_ROW_BYTE: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (i / 4) as u8;
        i += 1;
    }
    t
};

/// The 16 rows' stored scale bytes of Q2_K sub-block `gi` (scale in the low nibble), each in
/// the four bytes of its row's lane.
///
/// # Safety
/// `blk` is a packed Q2_K super-block; `gi < 16`; AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn q2_scale_bytes(blk: *const u8, gi: usize) -> __m512i {
    // SAFETY: sub-block gi's 16 scale bytes (lines 1–4); the index table's 64 bytes.
    unsafe {
        let s = _mm512_broadcast_i32x4(_mm_loadu_si128(blk.add(64 + 16 * gi) as *const __m128i));
        let r = _mm512_loadu_si512(REPEAT_ROW_BYTE.as_ptr() as *const __m512i);
        _mm512_shuffle_epi8(s, r)
    }
}

/// Each code times its row's sub-block scale, by lookup: `code_at_4` holds each code in
/// bits 4–5 of its byte (a quant line shifted), `scales` the rows' scale bytes
/// ([`q2_scale_bytes`]); the index takes bits 0–3 from the scale byte and the rest from the
/// code, and `vpermb` reads only its low 6 bits.
///
/// # Safety
/// AVX-512 F/BW/VBMI enabled.
#[inline(always)]
unsafe fn q2_scaled_codes(code_at_4: __m512i, scales: __m512i, table: __m512i) -> __m512i {
    // Bitwise `mask ? scales : code_at_4`.
    let idx = _mm512_ternarylogic_epi32::<0xD8>(code_at_4, scales, _mm512_set1_epi8(0x0f));
    _mm512_permutexvar_epi8(idx, table)
}

/// The four codes of a Q2_K quant line `w` (bit pairs `2s`, slots `s`), each times its
/// sub-block's scale (`scales[s]`).
///
/// # Safety
/// AVX-512 F/BW/VBMI enabled.
#[inline(always)]
unsafe fn q2_scaled_line(w: __m512i, scales: &[__m512i; 4], table: __m512i) -> [__m512i; 4] {
    // SAFETY: the caller enables the features.
    unsafe {
        [
            q2_scaled_codes(_mm512_slli_epi16(w, 4), scales[0], table),
            q2_scaled_codes(_mm512_slli_epi16(w, 2), scales[1], table),
            q2_scaled_codes(w, scales[2], table),
            q2_scaled_codes(_mm512_srli_epi16(w, 2), scales[3], table),
        ]
    }
}

/// Q2_K, group `g`, tokens `t0..t0 + T`: the 2-bit codes into `vpdpbusd`, each sub-block's
/// sum times its 4-bit scale, the 4-bit mins against the activation sums.
///
/// # Safety
/// As for [`gemm_vnni`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_vnni<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    // SAFETY: forwarded.
    unsafe { q2_product::<T, false>(j, g, t0) }
}

/// [`q2_vnni`] with the codes scaled by lookup ([`super::q2_lookups`]): every sub-block's
/// products go straight into the token's integer sum, the same sum of scaled sub-block sums.
///
/// # Safety
/// As for [`gemm_vnni`]; AVX-512 VBMI present too.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn q2_scaled_vnni<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    // SAFETY: forwarded.
    unsafe { q2_product::<T, true>(j, g, t0) }
}

/// The body of [`q2_vnni`] (`SCALED` false) and [`q2_scaled_vnni`], inlined into each with
/// its target features.
///
/// # Safety
/// As for the entry.
// Index loops: the slot index is also the layout's arithmetic (lines, sub-blocks).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn q2_product<const T: usize, const SCALED: bool>(j: Job<'_>, g: usize, t0: usize) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let ql = quant_line(p.dtype);
    let m3 = _mm512_set1_epi8(3);
    let m15 = _mm512_set1_epi32(0x0f);
    // SAFETY: 64 bytes.
    let table = unsafe { _mm512_loadu_si512(Q2_PRODUCTS.as_ptr() as *const __m512i) };
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, 0, 1);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [_mm512_setzero_si512(); T];
        // Scaled codes: two chains per token through the whole block, for vpdpbusd's
        // latency (four per slot, added up after each sub-block as the multiplied sums are,
        // ran the 8-token product at 184–206 µs against 170, alternated); otherwise one per
        // slot, each multiplied by its scale after its 4 lines.
        let mut a = [[_mm512_setzero_si512(); 4]; T];
        for h in 0..2 {
            for q in 0..2 {
                // Slot s: elements 128h + 32s + 16q .. +16, sub-block 8h + 2s + q.
                // SAFETY: the block's scale bytes.
                let scales: [__m512i; 4] = std::array::from_fn(|s| unsafe {
                    if SCALED {
                        q2_scale_bytes(blk, 8 * h + 2 * s + q)
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                for kk in 0..4 {
                    let k = 4 * q + kk;
                    // SAFETY (this block): the quant line of (h, k), the activation quants.
                    unsafe {
                        let w =
                            _mm512_loadu_si512(blk.add((ql + 8 * h + k) * 64) as *const __m512i);
                        let c = if SCALED {
                            q2_scaled_line(w, &scales, table)
                        } else {
                            [
                                _mm512_and_si512(w, m3),
                                _mm512_and_si512(_mm512_srli_epi16(w, 2), m3),
                                _mm512_and_si512(_mm512_srli_epi16(w, 4), m3),
                                _mm512_and_si512(_mm512_srli_epi16(w, 6), m3),
                            ]
                        };
                        for t in 0..T {
                            for s in 0..4 {
                                let xv = _mm512_set1_epi32(x4(x[t], 128 * h + 32 * s + 4 * k));
                                let i = if SCALED { s % 2 } else { s };
                                a[t][i] = _mm512_dpbusd_epi32(a[t][i], c[s], xv);
                            }
                        }
                    }
                    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
                }
                if SCALED {
                    continue;
                }
                for s in 0..4 {
                    let gi = 8 * h + 2 * s + q;
                    // SAFETY: sub-block gi's 16 scale bytes (lines 1–4).
                    unsafe {
                        let sc = _mm512_and_si512(
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                blk.add(64 + 16 * gi) as *const __m128i
                            )),
                            m15,
                        );
                        for t in 0..T {
                            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(a[t][s], sc));
                            a[t][s] = _mm512_setzero_si512();
                        }
                    }
                }
            }
        }
        if SCALED {
            for t in 0..T {
                isum[t] = _mm512_add_epi32(a[t][0], a[t][1]);
                a[t] = [_mm512_setzero_si512(); 4];
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_q2_vnni(blk, &x, &isum, &mut acc) };
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_window_512(j, g, t0 + t, *a) };
    }
}

// ---------------------------------------------------------------------------------------
// AVX-512 VNNI, prompts: a group's codes unpacked once for all its token tiles
// ---------------------------------------------------------------------------------------

/// Writes the codes of the packed super-block at `blk` to the 64 lines at `dst`.
///
/// # Safety
/// `blk` is a packed super-block of the kind's type (a Q5_K in the `Chunks` form); `dst`
/// holds 64 aligned lines; AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn unpack_block<const KIND: u8>(blk: *const u8, dst: *mut u8) {
    let put = |line: usize, v: __m512i| {
        // SAFETY: line < 64, inside `dst`, 64-byte aligned.
        unsafe { _mm512_store_si512(dst.add(line * 64) as *mut __m512i, v) }
    };
    // SAFETY (whole body): every line read is inside the packed super-block.
    unsafe {
        match KIND {
            KIND_Q4 | KIND_Q5 => {
                for c in 0..4 {
                    for k4 in (0..8).step_by(4) {
                        unpack_q45_line::<KIND, 0>(blk, c, k4, put);
                        unpack_q45_line::<KIND, 1>(blk, c, k4 + 1, put);
                        unpack_q45_line::<KIND, 2>(blk, c, k4 + 2, put);
                        unpack_q45_line::<KIND, 3>(blk, c, k4 + 3, put);
                    }
                }
            }
            KIND_Q6 => {
                for h in 0..2 {
                    for k in 0..8 {
                        let l = blk.add((5 + (8 * h + k) * 3) * 64);
                        let la = _mm512_loadu_si512(l as *const __m512i);
                        let lb = _mm512_loadu_si512(l.add(64) as *const __m512i);
                        let hh = _mm512_loadu_si512(l.add(128) as *const __m512i);
                        for s in 0..4 {
                            // Elements 128h + 32s + 4k ...
                            put(32 * h + 8 * s + k, q6_code_512(la, lb, hh, s));
                        }
                    }
                }
            }
            KIND_Q3 => {
                for k in 0..8 {
                    let lines = q3_lines_512(blk.add((quant_line(GgmlType::Q3_K) + 3 * k) * 64));
                    for pass in 0..2 {
                        for s in 0..4 {
                            // Elements 32(4·pass + s) + 4k ...
                            put(8 * (4 * pass + s) + k, q3_code_512(&lines, pass, s));
                        }
                    }
                }
            }
            KIND_Q2_SCALED => {
                let table = _mm512_loadu_si512(Q2_PRODUCTS.as_ptr() as *const __m512i);
                for h in 0..2 {
                    for q in 0..2 {
                        let scales: [__m512i; 4] =
                            std::array::from_fn(|s| q2_scale_bytes(blk, 8 * h + 2 * s + q));
                        for k in 4 * q..4 * q + 4 {
                            let w = _mm512_loadu_si512(
                                blk.add((quant_line(GgmlType::Q2_K) + 8 * h + k) * 64)
                                    as *const __m512i,
                            );
                            // Elements 128h + 32s + 4k ..., sub-block 8h + 2s + q.
                            for (s, v) in q2_scaled_line(w, &scales, table).into_iter().enumerate()
                            {
                                put(32 * h + 8 * s + k, v);
                            }
                        }
                    }
                }
            }
            _ => {
                let m3 = _mm512_set1_epi8(3);
                for h in 0..2 {
                    for k in 0..8 {
                        let w = _mm512_loadu_si512(
                            blk.add((quant_line(GgmlType::Q2_K) + 8 * h + k) * 64)
                                as *const __m512i,
                        );
                        // Elements 128h + 32s + 4k ... in bit pairs 2s.
                        put(32 * h + k, _mm512_and_si512(w, m3));
                        put(
                            32 * h + 8 + k,
                            _mm512_and_si512(_mm512_srli_epi16(w, 2), m3),
                        );
                        put(
                            32 * h + 16 + k,
                            _mm512_and_si512(_mm512_srli_epi16(w, 4), m3),
                        );
                        put(
                            32 * h + 24 + k,
                            _mm512_and_si512(_mm512_srli_epi16(w, 6), m3),
                        );
                    }
                }
            }
        }
    }
}

/// Quant line `8c + k` (`k mod 4 = M`) of a packed Q4_K or Q5_K super-block as codes: its
/// low nibbles (elements `64c + 4k ..`, line `16c + k`) and high ones (`64c + 32 + 4k ..`,
/// line `16c + 8 + k`).
///
/// # Safety
/// As for [`unpack_block`].
#[inline(always)]
unsafe fn unpack_q45_line<const KIND: u8, const M: usize>(
    blk: *const u8,
    c: usize,
    k: usize,
    put: impl Fn(usize, __m512i),
) {
    let ty = if KIND == KIND_Q5 {
        GgmlType::Q5_K
    } else {
        GgmlType::Q4_K
    };
    // SAFETY: the quant line and its chunk's fifth-bit line are inside the super-block.
    let [wl, wh] = unsafe {
        let wv = _mm512_loadu_si512(
            blk.add(qs_line(ty, FifthBits::Chunks, c, k) * 64) as *const __m512i
        );
        if KIND == KIND_Q5 {
            let h = _mm512_loadu_si512(blk.add(fifth_line(c, k) * 64) as *const __m512i);
            nibble_codes_512::<true, M>(wv, h)
        } else {
            nibble_codes_512::<false, M>(wv, _mm512_setzero_si512())
        }
    };
    put(16 * c + k, wl);
    put(16 * c + 8 + k, wh);
}

/// The owned lanes of token `t`'s output rows `g·16 ..` (as [`store_window_512`] writes
/// them), others zero: a tile's running sums between two slices of super-blocks.
///
/// # Safety
/// As for [`store_window_512`].
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_window_512(j: Job<'_>, g: usize, t: usize) -> __m512 {
    let first = g * GROUP;
    let (lo, hi) = owned_lanes(first, j.r0, j.r1);
    if lo >= hi {
        return _mm512_setzero_ps();
    }
    let mask = ((1u32 << hi) - (1u32 << lo)) as __mmask16;
    // SAFETY: only the lanes `lo..hi`, rows inside `r0..r1`, are read.
    unsafe { _mm512_maskz_loadu_ps(mask, j.out.add(t * j.ldo + first)) }
}

/// Super-blocks `b0..b1` of group `g` (their codes in `codes`) for tokens `t0..t0 + T`,
/// continuing the sums stored by the slices before (`b0 > 0`). Sub-blocks go in pairs, one
/// accumulator per token for each, then each sum times its scale; the super-block ends as
/// in the kernels that unpack as they go, so the outputs are theirs bit for bit.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn codes_vnni<const T: usize, const KIND: u8>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    n: usize,
    (b0, b1): (usize, usize),
    codes: &Codes,
) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    // Lines per sub-block: 8 (32 values) for Q4_K and Q5_K, 4 (16 values) for the others.
    let sl = if KIND <= KIND_Q5 { 8 } else { 4 };
    let mut acc: [__m512; T] = std::array::from_fn(|t| {
        if b0 == 0 {
            _mm512_setzero_ps()
        } else {
            // SAFETY: the caller's rows, stored by the previous slice.
            unsafe { load_window_512(j, g, t0 + t) }
        }
    });
    for b in b0..b1 {
        // SAFETY: super-block `b` of group `g` and of each token's row exist.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let cb = codes.block(b - b0);
        prefetch_tokens(j, b - b0, t0, t0 + T, n);
        // The codes' offsets of the types with signed scales (see `code_offsets`).
        // SAFETY: the tokens' blocks.
        let off = unsafe {
            match KIND {
                KIND_Q6 => code_offsets::<T, 5>(&x),
                KIND_Q3 => code_offsets::<T, 2>(&x),
                _ => [[0; 16]; T],
            }
        };
        let mut isum = [_mm512_setzero_si512(); T];
        for pair in 0..CODE_LINES / (2 * sl) {
            let (ll, lh) = (2 * pair * sl, (2 * pair + 1) * sl);
            let mut lo = [[_mm512_setzero_si512(); 2]; T];
            let mut hi = [[_mm512_setzero_si512(); 2]; T];
            for k in 0..sl {
                // One token alone alternates two chains per sub-block (exact in i32).
                let a = if T == 1 { k % 2 } else { 0 };
                // SAFETY: lines of super-block `b` in `codes`; activation bytes inside the
                // tokens' blocks.
                unsafe {
                    let wl = _mm512_load_si512(cb.add((ll + k) * 64) as *const __m512i);
                    let wh = _mm512_load_si512(cb.add((lh + k) * 64) as *const __m512i);
                    for t in 0..T {
                        let xl = _mm512_set1_epi32(x4(x[t], 4 * (ll + k)));
                        let xh = _mm512_set1_epi32(x4(x[t], 4 * (lh + k)));
                        lo[t][a] = _mm512_dpbusd_epi32(lo[t][a], wl, xl);
                        hi[t][a] = _mm512_dpbusd_epi32(hi[t][a], wh, xh);
                    }
                }
                // Line-major, as in `q45_line_vnni`.
                std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
            }
            // Scaled codes carry their scales; the others' are multiplied in below.
            let (sa, sb) = if KIND == KIND_Q2_SCALED {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            } else {
                // SAFETY: the 16 rows' scales of sub-blocks 2·pair and 2·pair + 1 (lines 1–4).
                unsafe { sub_block_scales::<KIND>(blk, 2 * pair) }
            };
            for t in 0..T {
                let (l, h) = if T == 1 {
                    (
                        _mm512_add_epi32(lo[t][0], lo[t][1]),
                        _mm512_add_epi32(hi[t][0], hi[t][1]),
                    )
                } else {
                    (lo[t][0], hi[t][0])
                };
                let s = if KIND == KIND_Q2_SCALED {
                    // The codes carry their scales.
                    _mm512_add_epi32(l, h)
                } else if matches!(KIND, KIND_Q6 | KIND_Q3) {
                    // SAFETY: AVX-512 F, enabled here.
                    unsafe {
                        _mm512_add_epi32(
                            scaled_sub_block(l, off[t][2 * pair], sa),
                            scaled_sub_block(h, off[t][2 * pair + 1], sb),
                        )
                    }
                } else {
                    _mm512_add_epi32(_mm512_mullo_epi32(l, sa), _mm512_mullo_epi32(h, sb))
                };
                isum[t] = _mm512_add_epi32(isum[t], s);
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row (see above).
        unsafe {
            match KIND {
                KIND_Q4 | KIND_Q5 => fold_q45_vnni(j, b, blk, &x, &isum, &mut acc),
                KIND_Q6 | KIND_Q3 => fold_d_vnni(blk, &x, &isum, &mut acc),
                _ => fold_q2_vnni(blk, &x, &isum, &mut acc),
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_window_512(j, g, t0 + t, *a) };
    }
}

/// The 16 rows' scales of sub-blocks `i` and `i + 1`, one i32 lane per row: 6-bit (Q4_K,
/// Q5_K), signed 8-bit (Q6_K, Q3_K) or the low nibble of the stored byte (Q2_K).
///
/// # Safety
/// `blk` is a packed super-block of the kind's type; AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn sub_block_scales<const KIND: u8>(blk: *const u8, i: usize) -> (__m512i, __m512i) {
    // SAFETY: bytes 16·i .. 16·i + 32 of lines 1–4.
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(blk.add(64 + 16 * i) as *const __m128i),
            _mm_loadu_si128(blk.add(64 + 16 * i + 16) as *const __m128i),
        )
    };
    match KIND {
        KIND_Q6 | KIND_Q3 => (_mm512_cvtepi8_epi32(a), _mm512_cvtepi8_epi32(b)),
        KIND_Q2 => {
            let m15 = _mm512_set1_epi32(0x0f);
            (
                _mm512_and_si512(_mm512_cvtepu8_epi32(a), m15),
                _mm512_and_si512(_mm512_cvtepu8_epi32(b), m15),
            )
        }
        _ => (_mm512_cvtepu8_epi32(a), _mm512_cvtepu8_epi32(b)),
    }
}

/// The products for groups `g0..g1` and tokens `0..n` with each group's codes unpacked
/// once, a slice of [`UNPACKED_BLOCKS`] super-blocks at a time, for all its token tiles.
///
/// # Safety
/// As for [`gemm_vnni`]; a Q5_K packed in the `Chunks` form.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_codes_vnni<const KIND: u8>(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    // SAFETY: forwarded.
    unsafe { codes_product::<KIND>(j, n, g0, g1) }
}

/// [`gemm_codes_vnni`] for a Q2_K whose codes are scaled as they are unpacked
/// ([`super::q2_lookups`]).
///
/// # Safety
/// As for [`gemm_vnni`]; AVX-512 VBMI present too.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn gemm_codes_q2_scaled(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    // SAFETY: forwarded.
    unsafe { codes_product::<KIND_Q2_SCALED>(j, n, g0, g1) }
}

/// The body of [`gemm_codes_vnni`], inlined into each entry with its target features.
///
/// # Safety
/// As for [`gemm_codes_vnni`], with the features its entry enables.
#[inline(always)]
unsafe fn codes_product<const KIND: u8>(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    let mut codes = Codes::new();
    let nsb = j.p.nsb;
    for g in g0..g1 {
        let base = j.p.group(g).as_ptr();
        for b0 in (0..nsb).step_by(UNPACKED_BLOCKS) {
            let b1 = nsb.min(b0 + UNPACKED_BLOCKS);
            for b in b0..b1 {
                // SAFETY: super-block `b` of the group; slot `b - b0` of `codes`.
                unsafe {
                    unpack_block::<KIND>(base.add(b * j.p.block_bytes()), codes.block_mut(b - b0))
                };
            }
            let sb = (b0, b1);
            // The next slice streams in while the tiles run from L1, as on AVX2: unpacking
            // it otherwise waits on memory (a 128-token Q5_K_M prompt on one Zen 4 thread,
            // 292 → 310 tok/s; at 512 tokens the unpacking is spread over 4× the tiles, and
            // nothing changed).
            let mut jt = j;
            if b1 < nsb || g + 1 < g1 {
                // SAFETY: the next slice is inside the packed matrix (checked just above).
                jt.pf = unsafe { base.add(b1 * j.p.block_bytes()) };
                jt.pf_block = j.p.block_bytes();
            }
            for_token_tiles!(
                n,
                t,
                [8, 4, 2, 1],
                codes_vnni::<_, KIND>(jt, g, t, n, sb, &codes)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// AVX2
// ---------------------------------------------------------------------------------------

/// Q4_K / Q5_K, rows `8·half ..` of group `g`, tokens `t0..t0 + T`, into `acc` lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45_avx2_half<const T: usize, const FIVE: bool>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    half: usize,
) -> [__m256; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, half, 2);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [_mm256_setzero_si256(); T];
        for c in 0..4 {
            // SAFETY (this block): lines inside the super-block, bytes inside the tokens'
            // Q8_K blocks.
            unsafe {
                let sl = scale_lanes_u8(blk.add(64 + 32 * c + 8 * half));
                let sh = scale_lanes_u8(blk.add(64 + 32 * c + 16 + 8 * half));
                for k in 0..8 {
                    let [wl, wh] = q45_codes_256::<FIVE>(blk, c, k, half);
                    for t in 0..T {
                        let xl = _mm256_set1_epi32(x4(x[t], 64 * c + 4 * k));
                        let xh = _mm256_set1_epi32(x4(x[t], 64 * c + 32 + 4 * k));
                        let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(wl, xl), sl);
                        let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(wh, xh), sh);
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(pl, ph));
                    }
                }
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_q45_avx2(j, b, blk, half, &x, &isum, &mut acc) };
    }
    acc
}

/// [`fold_q45_vnni`] for rows `8·half ..` of the group, with AVX2.
///
/// # Safety
/// As for [`fold_q45_vnni`]; AVX2, FMA and F16C enabled.
#[inline(always)]
unsafe fn fold_q45_avx2<const T: usize>(
    j: Job<'_>,
    b: usize,
    blk: *const u8,
    half: usize,
    x: &[*const u8; T],
    isum: &[__m256i; T],
    acc: &mut [__m256; T],
) {
    let po = j.min_pairs_from(b);
    let mut msum = [_mm256_setzero_si256(); T];
    for pp in 0..4 {
        // SAFETY: the mins of sub-blocks 2pp, 2pp+1 for these 8 rows; the token's min
        // pairs (`PackedK::rows` checked the row size).
        unsafe {
            let m = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                blk.add(192 + 32 * pp + 16 * half) as *const __m128i
            ));
            for t in 0..T {
                let bs = _mm256_set1_epi32(x_min_pair(x[t], po, pp));
                msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(m, bs));
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { fold_dmin_avx2(blk, half, x, isum, &msum, acc) };
}

/// [`fold_dmin_vnni`] for rows `8·half ..` of the group, with AVX2.
///
/// # Safety
/// As for [`fold_dmin_vnni`]; AVX2 and F16C enabled.
#[inline(always)]
unsafe fn fold_dmin_avx2<const T: usize>(
    blk: *const u8,
    half: usize,
    x: &[*const u8; T],
    isum: &[__m256i; T],
    msum: &[__m256i; T],
    acc: &mut [__m256; T],
) {
    // SAFETY: line 0: d of the 16 rows, then dmin.
    let (dw, dm) = unsafe {
        (
            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(32 + 16 * half) as *const __m128i)),
        )
    };
    for t in 0..T {
        // SAFETY: the token's block scale.
        let dx = _mm256_set1_ps(unsafe { x_d(x[t]) });
        let a = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[t]));
        let m = _mm256_mul_ps(_mm256_mul_ps(dm, dx), _mm256_cvtepi32_ps(msum[t]));
        acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(a, m));
    }
}

/// The two code vectors (low and high nibbles, fifth bits merged for Q5_K in the `Bytes`
/// form) of quant line `8c + k` of a packed Q4_K/Q5_K super-block, rows `8·half ..`:
/// elements `64c + 4k ..` and `64c + 32 + 4k ..`.
///
/// # Safety
/// `blk` is such a super-block; AVX2 enabled.
#[inline(always)]
unsafe fn q45_codes_256<const FIVE: bool>(
    blk: *const u8,
    c: usize,
    k: usize,
    half: usize,
) -> [__m256i; 2] {
    let m4 = _mm256_set1_epi8(0x0f);
    let ql = quant_line(if FIVE { GgmlType::Q5_K } else { GgmlType::Q4_K });
    // SAFETY: the quant line and the fifth-bit line k are inside the super-block.
    unsafe {
        let wv = _mm256_loadu_si256(blk.add((ql + 8 * c + k) * 64 + 32 * half) as *const __m256i);
        let mut wl = _mm256_and_si256(wv, m4);
        let mut wh = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4);
        if FIVE {
            let h = _mm256_loadu_si256(blk.add((5 + k) * 64 + 32 * half) as *const __m256i);
            wl = _mm256_or_si256(wl, fifth_bit_256(h, 2 * c));
            wh = _mm256_or_si256(wh, fifth_bit_256(h, 2 * c + 1));
        }
        [wl, wh]
    }
}

/// The four Q6_K code vectors of the line triple at `l` (rows `8·half ..`, see `packed_k`):
/// slot `s` holds elements `128h + 32s + 4k ..`, a nibble of `la` or `lb` and two bits of
/// `hh`.
///
/// # Safety
/// The three lines' 32 bytes at `l`, `l + 64`, `l + 128` are readable; AVX2 enabled.
#[inline(always)]
unsafe fn q6_codes_256(l: *const u8) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    // SAFETY: the caller's promise.
    let (la, lb, hh) = unsafe {
        (
            _mm256_loadu_si256(l as *const __m256i),
            _mm256_loadu_si256(l.add(64) as *const __m256i),
            _mm256_loadu_si256(l.add(128) as *const __m256i),
        )
    };
    [
        _mm256_or_si256(
            _mm256_and_si256(la, m4),
            _mm256_and_si256(_mm256_slli_epi16(hh, 4), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(lb, m4),
            _mm256_and_si256(_mm256_slli_epi16(hh, 2), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(la, 4), m4),
            _mm256_and_si256(hh, m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(lb, 4), m4),
            _mm256_and_si256(_mm256_srli_epi16(hh, 2), m30),
        ),
    ]
}

/// The four Q2_K code vectors of the quant line half at `l`: bit pair `s` of each byte.
///
/// # Safety
/// 32 bytes at `l` are readable; AVX2 enabled.
#[inline(always)]
unsafe fn q2_codes_256(l: *const u8) -> [__m256i; 4] {
    let m3 = _mm256_set1_epi8(3);
    // SAFETY: the caller's promise.
    let w = unsafe { _mm256_loadu_si256(l as *const __m256i) };
    [
        _mm256_and_si256(w, m3),
        _mm256_and_si256(_mm256_srli_epi16(w, 2), m3),
        _mm256_and_si256(_mm256_srli_epi16(w, 4), m3),
        _mm256_and_si256(_mm256_srli_epi16(w, 6), m3),
    ]
}

/// The end of a super-block of a type with signed sub-block scales (Q6_K, Q3_K), whose
/// unsigned codes are the values plus `1 << SHIFT`, for rows `8·half ..` of the group, with
/// AVX2: takes `(1 << SHIFT) · Σ_g scale_g · Σx_g` off each token's integer sum (the
/// scales of groups 2p, 2p+1 interleaved into 16-bit pairs per row against the
/// activation's pair of sums), then folds it into `acc` with the scalar expression
/// `d · dx · isum`.
///
/// # Safety
/// `blk` is a packed super-block with `d` at line 0 and the scales at lines 1–4; each `x` a
/// token's Q8_K block; AVX2 enabled.
#[inline(always)]
unsafe fn fold_signed_avx2<const T: usize, const SHIFT: i32>(
    blk: *const u8,
    half: usize,
    x: &[*const u8; T],
    isum: &mut [__m256i; T],
    acc: &mut [__m256; T],
) {
    let mut corr = [_mm256_setzero_si256(); T];
    for pp in 0..8 {
        // SAFETY: the scales of groups 2pp, 2pp+1 for these 8 rows; the activation sums.
        unsafe {
            let a = _mm_loadl_epi64(blk.add(64 + 32 * pp + 8 * half) as *const __m128i);
            let b = _mm_loadl_epi64(blk.add(64 + 32 * pp + 16 + 8 * half) as *const __m128i);
            let sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
            for t in 0..T {
                let bs = _mm256_set1_epi32(x_bsum_pair(x[t], pp));
                corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(sc, bs));
            }
        }
    }
    for t in 0..T {
        isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32::<SHIFT>(corr[t]));
    }
    // SAFETY: line 0: d of the 16 rows.
    let dw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i)) };
    for t in 0..T {
        // SAFETY: the token's block scale.
        let dx = _mm256_set1_ps(unsafe { x_d(x[t]) });
        let v = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[t]));
        acc[t] = _mm256_add_ps(acc[t], v);
    }
}

/// Adds line `k`'s four code slots of a Q6_K, Q3_K or Q2_K super-block (slot s: elements
/// `128h + 32s + 4k ..` of 8 rows; for Q3_K, `h` is the pass) times each token's activation
/// bytes to the tokens' running i16 sums of the window.
///
/// # Safety
/// Each `x` is a token's Q8_K block; AVX2 enabled.
#[inline(always)]
unsafe fn add_slots_i16<const T: usize>(
    c: [__m256i; 4],
    x: &[*const u8; T],
    h: usize,
    k: usize,
    a16: &mut [[__m256i; 4]; T],
) {
    for (s, &cs) in c.iter().enumerate() {
        for t in 0..T {
            // SAFETY: 4 bytes inside the token's block.
            let xv = _mm256_set1_epi32(unsafe { x4(x[t], 128 * h + 32 * s + 4 * k) });
            a16[t][s] = _mm256_add_epi16(a16[t][s], _mm256_maddubs_epi16(cs, xv));
        }
    }
}

/// Takes a window's i16 sums of [`add_slots_i16`] (lines `k0 ..` of half `h`: slot s in
/// sub-block `8h + 2s + k0 / 4`) times their sub-block's scale into the tokens' integer sums.
///
/// # Safety
/// `blk` is a packed Q6_K, Q3_K or Q2_K super-block (the kind); AVX2 enabled.
// Index loop: the slot index is also the sub-block's arithmetic.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn fold_slots<const T: usize, const KIND: u8>(
    blk: *const u8,
    half: usize,
    h: usize,
    k0: usize,
    a16: &[[__m256i; 4]; T],
    isum: &mut [__m256i; T],
) {
    for s in 0..4 {
        let gi = 8 * h + 2 * s + k0 / 4;
        // SAFETY: sub-block gi's scales for these 8 rows.
        let sc = unsafe { scale_lanes::<KIND>(blk.add(64 + 16 * gi + 8 * half)) };
        for t in 0..T {
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(a16[t][s], sc));
        }
    }
}

/// Q6_K, rows `8·half ..` of group `g`, tokens `t0..t0 + T`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_avx2_half<const T: usize>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    half: usize,
) -> [__m256; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, half, 2);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [_mm256_setzero_si256(); T];
        let w = i16_lines(KIND_Q6);
        for h in 0..2 {
            for k0 in (0..8).step_by(w) {
                // Slot s holds elements 128h + 32s + 4k .., in group 8h + 2s + k / 4: the
                // same group for the whole window (w divides 4), summed in i16.
                let mut a16 = [[_mm256_setzero_si256(); 4]; T];
                for k in k0..k0 + w {
                    // SAFETY: the three lines of (h, k); the tokens' blocks.
                    unsafe {
                        let c = q6_codes_256(blk.add((5 + (8 * h + k) * 3) * 64 + 32 * half));
                        add_slots_i16(c, &x, h, k, &mut a16);
                    }
                }
                // SAFETY: the group's scales.
                unsafe { fold_slots::<T, KIND_Q6>(blk, half, h, k0, &a16, &mut isum) };
            }
        }
        // The codes are the values plus 32.
        // SAFETY: super-block `b` of the group and of each token's row (see above).
        unsafe { fold_signed_avx2::<T, 5>(blk, half, &x, &mut isum, &mut acc) };
    }
    acc
}

/// The four Q3_K codes of runs `4·pass ..` for rows `8·half ..`, each taken out as
/// [`q3_code_512`] takes one.
///
/// # Safety
/// The three lines at `l` (offset to the half) must be readable; AVX2 enabled.
#[inline(always)]
unsafe fn q3_codes_256(l: *const u8, pass: usize) -> [__m256i; 4] {
    let m7 = _mm256_set1_epi8(7);
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm256_set1_epi8(4);
    // SAFETY: the caller guarantees the three lines at `l`.
    let (lx, ly, lz) = unsafe {
        (
            _mm256_loadu_si256(l as *const __m256i),
            _mm256_loadu_si256(l.add(64) as *const __m256i),
            _mm256_loadu_si256(l.add(128) as *const __m256i),
        )
    };
    if pass == 0 {
        [
            _mm256_and_si256(lx, m7),
            _mm256_and_si256(_mm256_srli_epi16(lx, 3), m7),
            _mm256_and_si256(ly, m7),
            _mm256_and_si256(_mm256_srli_epi16(ly, 3), m7),
        ]
    } else {
        [
            _mm256_and_si256(lz, m7),
            _mm256_and_si256(_mm256_srli_epi16(lz, 3), m7),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(lx, 6), m3),
                _mm256_and_si256(_mm256_srli_epi16(lz, 4), m4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ly, 6), m3),
                _mm256_and_si256(_mm256_srli_epi16(lz, 5), m4),
            ),
        ]
    }
}

/// Q3_K, rows `8·half ..` of group `g`, tokens `t0..t0 + T`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_avx2_half<const T: usize>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    half: usize,
) -> [__m256; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let ql = quant_line(p.dtype);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, half, 2);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [_mm256_setzero_si256(); T];
        let w = i16_lines(KIND_Q3);
        for k0 in (0..8).step_by(w) {
            // Pass p's slot s is run 4p + s: elements 128p + 32s + 4k .., in sub-block
            // 8p + 2s + k0 / 4 for the whole window (w divides 4), summed in i16: the Q6_K and
            // Q2_K arithmetic with the pass for the half-super-block.
            let mut a16 = [[[_mm256_setzero_si256(); 4]; T]; 2];
            for k in k0..k0 + w {
                for (pass, a16) in a16.iter_mut().enumerate() {
                    // SAFETY: the three lines of k; the tokens' blocks.
                    unsafe {
                        let c = q3_codes_256(blk.add((ql + 3 * k) * 64 + 32 * half), pass);
                        add_slots_i16(c, &x, pass, k, a16);
                    }
                }
            }
            for (pass, a16) in a16.iter().enumerate() {
                // SAFETY: the sub-blocks' scales.
                unsafe { fold_slots::<T, KIND_Q3>(blk, half, pass, k0, a16, &mut isum) };
            }
        }
        // The codes are the values plus 4.
        // SAFETY: as for `q6_avx2_half`'s call.
        unsafe { fold_signed_avx2::<T, 2>(blk, half, &x, &mut isum, &mut acc) };
    }
    acc
}

/// Q2_K, rows `8·half ..` of group `g`, tokens `t0..t0 + T`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_avx2_half<const T: usize>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    half: usize,
) -> [__m256; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let ql = quant_line(p.dtype);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..p.nsb {
        prefetch_share(j, b, half, 2);
        // SAFETY: as in `q45_vnni`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [_mm256_setzero_si256(); T];
        let w = i16_lines(KIND_Q2);
        for h in 0..2 {
            for k0 in (0..8).step_by(w) {
                // Slot s holds elements 128h + 32s + 4k .., in sub-block 8h + 2s + k / 4:
                // the same sub-block for the whole window (w divides 4), summed in i16.
                let mut a16 = [[_mm256_setzero_si256(); 4]; T];
                for k in k0..k0 + w {
                    // SAFETY: the quant line of (h, k); the tokens' blocks.
                    unsafe {
                        let c = q2_codes_256(blk.add((ql + 8 * h + k) * 64 + 32 * half));
                        add_slots_i16(c, &x, h, k, &mut a16);
                    }
                }
                // SAFETY: the sub-blocks' scales.
                unsafe { fold_slots::<T, KIND_Q2>(blk, half, h, k0, &a16, &mut isum) };
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_q2_avx2(blk, half, &x, &isum, &mut acc) };
    }
    acc
}

/// [`fold_q2_vnni`] for rows `8·half ..` of the group, with AVX2.
///
/// # Safety
/// As for [`fold_q2_vnni`]; AVX2, FMA and F16C enabled.
#[inline(always)]
unsafe fn fold_q2_avx2<const T: usize>(
    blk: *const u8,
    half: usize,
    x: &[*const u8; T],
    isum: &[__m256i; T],
    acc: &mut [__m256; T],
) {
    let mut msum = [_mm256_setzero_si256(); T];
    for pp in 0..8 {
        // SAFETY: the scale bytes of sub-blocks 2pp, 2pp+1 for these 8 rows; the sums.
        unsafe {
            let a = _mm_loadl_epi64(blk.add(64 + 32 * pp + 8 * half) as *const __m128i);
            let b = _mm_loadl_epi64(blk.add(64 + 32 * pp + 16 + 8 * half) as *const __m128i);
            let m = _mm256_srli_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b)), 4);
            for t in 0..T {
                let bs = _mm256_set1_epi32(x_bsum_pair(x[t], pp));
                msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(m, bs));
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { fold_dmin_avx2(blk, half, x, isum, &msum, acc) };
}

/// Both halves of group `g` on AVX2, stored.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    let mut lanes = [[0.0f32; GROUP]; T];
    for half in 0..2 {
        // SAFETY: forwarded from the caller.
        let acc = unsafe {
            match j.p.dtype {
                GgmlType::Q4_K => q45_avx2_half::<T, false>(j, g, t0, half),
                GgmlType::Q5_K => q45_avx2_half::<T, true>(j, g, t0, half),
                GgmlType::Q3_K => q3_avx2_half::<T>(j, g, t0, half),
                GgmlType::Q2_K => q2_avx2_half::<T>(j, g, t0, half),
                _ => q6_avx2_half::<T>(j, g, t0, half),
            }
        };
        for (l, a) in lanes.iter_mut().zip(acc) {
            // SAFETY: 8 floats at lane offset 8·half.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * half), a) };
        }
    }
    for (t, l) in lanes.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe {
            store_window(
                j.out.add((t0 + t) * j.ldo + g * GROUP),
                l,
                g * GROUP,
                j.r0,
                j.r1,
            )
        };
    }
}

/// `j` with the share of group `g + 1` (if below `g1`) that belongs to tokens `t0..t0 + tile`
/// of `n` set to be prefetched, when the tokens take more than one tile (`tile < n`), or
/// where [`prefetch_single_tile`] says so. The first tile streams group `g` in and the later
/// ones run from cache, where the hardware prefetcher alone leaves the memory idle: each tile
/// then reads its share of the next group as it goes.
#[inline(always)]
fn with_next_share(
    mut j: Job<'_>,
    g: usize,
    g1: usize,
    t0: usize,
    tile: usize,
    n: usize,
) -> Job<'_> {
    if (tile < n || prefetch_single_tile()) && g + 1 < g1 {
        let next = j.p.group(g + 1);
        j.pf = next.as_ptr().wrapping_add(next.len() * t0 / n);
        j.pf_block = j.p.block_bytes() * tile / n;
    }
    j
}

/// Whether a product whose tokens fit in one tile (a decode step) prefetches the next group
/// too. On an Intel Xeon (Emerald Rapids) the hardware prefetcher alone left one decoding
/// thread at 18–22 tok/s on the Qwen3-0.6B-shaped Q4_K_M file, 24–31 with the bursts; on AMD
/// Zen 4 the same bursts measured slower (38 against 51 tok/s), so only Intel CPUs take them
/// (docs/decisions/prefetch-by-vendor.md). `INFERNO_DECODE_PREFETCH=0` or `1` overrides the
/// choice, to measure both on one machine.
/// Decided once per process.
fn prefetch_single_tile() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(
        || match std::env::var("INFERNO_DECODE_PREFETCH").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => is_intel(),
        },
    )
}

/// Whether the CPU's vendor string is Intel's.
fn is_intel() -> bool {
    crate::cpu::simd::cpu_vendor_family().0 == *b"GenuineIntel"
}

/// Prefetches part `part` of `parts` of super-block `b`'s share of the next group (see
/// [`with_next_share`]) in one burst, as the super-block (or, for the VNNI Q4_K/Q5_K kernel,
/// each of its four chunks) starts: bursts measured faster than one or two lines at each
/// step of the kernel's loop.
#[inline(always)]
fn prefetch_share(j: Job<'_>, b: usize, part: usize, parts: usize) {
    if j.pf.is_null() {
        return;
    }
    let s = b * j.pf_block;
    let (lo, hi) = (
        s + j.pf_block * part / parts,
        s + j.pf_block * (part + 1) / parts,
    );
    for off in (lo & !63..hi).step_by(64) {
        // SAFETY: SSE is part of x86_64; a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(j.pf.wrapping_add(off) as *const i8) };
    }
}

/// Prefetches the share of tokens `t0..t1` of `n` of super-block `b` of the bytes at
/// `j.pf` (`j.pf_block` bytes a super-block), if any, in one burst.
#[inline(always)]
fn prefetch_tokens(j: Job<'_>, b: usize, t0: usize, t1: usize, n: usize) {
    if j.pf.is_null() {
        return;
    }
    let s = b * j.pf_block;
    let (lo, hi) = (s + j.pf_block * t0 / n, s + j.pf_block * t1 / n);
    for off in (lo & !63..hi).step_by(64) {
        // SAFETY: SSE is part of x86_64; a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(j.pf.wrapping_add(off) as *const i8) };
    }
}

/// Tokens `t0..t0 + T` of group `g` on AVX2, with the next group's share prefetched.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const T: usize>(j: Job<'_>, g: usize, g1: usize, t0: usize, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { group_avx2::<T>(with_next_share(j, g, g1, t0, T, n), g, t0) }
}

/// Tokens `t0..t0 + T` of group `g` on VNNI, with the next group's share prefetched.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_vnni<const T: usize>(j: Job<'_>, g: usize, g1: usize, t0: usize, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { group_vnni::<T>(with_next_share(j, g, g1, t0, T, n), g, t0) }
}

/// Group `g` on VNNI, stored.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_vnni<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match j.p.dtype {
            GgmlType::Q4_K => q45_vnni::<T, false>(j, g, t0),
            GgmlType::Q5_K => q45_vnni::<T, true>(j, g, t0),
            GgmlType::Q3_K => q3_vnni::<T>(j, g, t0),
            GgmlType::Q2_K if T > 1 && j.p.q2_lookups => q2_scaled_vnni::<T>(j, g, t0),
            GgmlType::Q2_K => q2_vnni::<T>(j, g, t0),
            _ => q6_vnni::<T>(j, g, t0),
        }
    }
}

/// The product for groups `g0..g1` and tokens `0..n`, AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VNNI, AVX2, FMA and F16C must be present; `xq` must hold `n` Q8_K rows of
/// `qrow` bytes covering `p.cols`, each with its min pairs after its blocks; `out` must be
/// writable at `t * ldo + r` for those tokens and the rows `r0..r1`, which no other thread
/// touches during the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemm_vnni(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    // Prompts unpack each group's codes once for all their tiles: the 64-token products
    // took Q4_K 1.12 → 1.01 ms, Q5_K 1.25 → 1.04 ms and Q6_K 2.22 → 1.34 ms (Xeon, one
    // thread), the unpacking having cost as much as the products' scale multiplies.
    if n >= UNPACK_MIN_TOKENS {
        // SAFETY: forwarded.
        unsafe {
            match j.p.dtype {
                GgmlType::Q4_K => gemm_codes_vnni::<KIND_Q4>(j, n, g0, g1),
                GgmlType::Q5_K => gemm_codes_vnni::<KIND_Q5>(j, n, g0, g1),
                GgmlType::Q6_K => gemm_codes_vnni::<KIND_Q6>(j, n, g0, g1),
                GgmlType::Q3_K => gemm_codes_vnni::<KIND_Q3>(j, n, g0, g1),
                _ if j.p.q2_lookups => gemm_codes_q2_scaled(j, n, g0, g1),
                _ => gemm_codes_vnni::<KIND_Q2>(j, n, g0, g1),
            }
        }
        return;
    }
    // Q4_K and Q5_K keep two accumulators per token and take 8 tokens per pass over the
    // weights from 9 tokens (64-token products 10-17% faster than with 4); Q6_K, Q3_K and Q2_K
    // stop at 4 (Q3_K and Q2_K keep four accumulators per token, which LLVM spilled at 8, as
    // it did Q6_K's before its product went by sub-block: 1.5-1.8x slower). Eight tokens
    // alone (batched decode) still go 4 at a time: one pass of 8 left the memory idle behind
    // the heavier compute (8 streams 181-189 tok/s against 199, prefetch or not; Q6_K by
    // sub-block, 5% faster in 8 from cache, ran 8 Q6_K streams at 161 against 203 tok/s).
    // Q3_K's codes are not unpacked once for a batched decode either: its 8-token product
    // ran 162 µs in tiles of 4 against 186 µs unpacked (from cache; from memory 172–205
    // against 207–212 µs; Zen 4, one thread).
    let wide = matches!(j.p.dtype, GgmlType::Q4_K | GgmlType::Q5_K) && n > 8;
    for g in g0..g1 {
        if wide {
            for_token_tiles!(n, t, [8, 4, 2, 1], tile_vnni(j, g, g1, t, n));
        } else {
            for_token_tiles!(n, t, [4, 2, 1], tile_vnni(j, g, g1, t, n));
        }
    }
}

/// [`unpack_block`] with AVX2, a half line (8 rows) at a time; a Q5_K in the `Bytes` form.
///
/// # Safety
/// As for [`unpack_block`]; AVX2 enabled.
#[inline(always)]
unsafe fn unpack_block_avx2<const KIND: u8>(blk: *const u8, dst: *mut u8) {
    for half in 0..2 {
        let put = |line: usize, v: __m256i| {
            // SAFETY: line < 64, inside `dst`, its 32-byte half aligned.
            unsafe { _mm256_store_si256(dst.add(line * 64 + 32 * half) as *mut __m256i, v) }
        };
        // SAFETY (whole body): every line read is inside the packed super-block.
        unsafe {
            match KIND {
                KIND_Q4 | KIND_Q5 => {
                    for c in 0..4 {
                        for k in 0..8 {
                            let [wl, wh] = if KIND == KIND_Q5 {
                                q45_codes_256::<true>(blk, c, k, half)
                            } else {
                                q45_codes_256::<false>(blk, c, k, half)
                            };
                            put(16 * c + k, wl);
                            put(16 * c + 8 + k, wh);
                        }
                    }
                }
                KIND_Q6 => {
                    for h in 0..2 {
                        for k in 0..8 {
                            let l = blk.add((5 + (8 * h + k) * 3) * 64 + 32 * half);
                            for (s, v) in q6_codes_256(l).into_iter().enumerate() {
                                put(32 * h + 8 * s + k, v);
                            }
                        }
                    }
                }
                KIND_Q3 => {
                    let ql = quant_line(GgmlType::Q3_K);
                    for k in 0..8 {
                        for pass in 0..2 {
                            let c = q3_codes_256(blk.add((ql + 3 * k) * 64 + 32 * half), pass);
                            for (s, v) in c.into_iter().enumerate() {
                                put(8 * (4 * pass + s) + k, v);
                            }
                        }
                    }
                }
                _ => {
                    let ql = quant_line(GgmlType::Q2_K);
                    for h in 0..2 {
                        for k in 0..8 {
                            let l = blk.add((ql + 8 * h + k) * 64 + 32 * half);
                            for (s, v) in q2_codes_256(l).into_iter().enumerate() {
                                put(32 * h + 8 * s + k, v);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Lines of codes whose `maddubs` pair sums a kind's AVX2 kernels add in i16 before one
/// `madd` takes them times the sub-block's scale: a pair sum is at most 2 · c · 128 in
/// magnitude for codes below `c`, so Q4_K (c = 16) sums 8 lines (30,720), Q5_K 4 (31,744),
/// Q6_K 2 (32,256), Q3_K and Q2_K a whole 16-value sub-block of 4 (7,168): exact, no
/// wrap. One `madd` per line, as before, held the products to half the rate of `maddubs`.
const fn i16_lines(kind: u8) -> usize {
    match kind {
        KIND_Q4 => 8,
        KIND_Q6 => 2,
        _ => 4,
    }
}

/// Whether [`codes_avx2`] keeps a kind's super-block sums (`isum`, 2·T vectors) in memory
/// rather than in registers. Q2_K and Q3_K `madd` every 4 lines, and with those sums held
/// beside the 2·T i16 sums the compiler spilled the i16 sums inside the window instead; kept
/// in memory the 8-token products took 8% (Q2_K) and 7% (Q3_K) less time on a Zen 3. Q4_K,
/// Q5_K and Q6_K measured the same or slower so (docs/decisions/avx2-sums-in-memory.md).
const fn sums_in_memory(kind: u8) -> bool {
    matches!(kind, KIND_Q2 | KIND_Q3)
}

/// Adds `v` to the vector at `q` by a volatile load and store, so the compiler cannot keep
/// it in a register (see [`sums_in_memory`]).
///
/// # Safety
/// `q` must be valid for reads and writes of an aligned `__m256i`.
#[inline(always)]
unsafe fn add_in_memory(q: *mut __m256i, v: __m256i) {
    // SAFETY: the caller's.
    unsafe { std::ptr::write_volatile(q, _mm256_add_epi32(std::ptr::read_volatile(q), v)) };
}

/// [`codes_vnni`] with AVX2: the 16 rows as two vectors of 8, both against each token's
/// broadcast activation bytes (a broadcast costs about as much as a `maddubs` here, so one
/// serves both halves); each sub-block's lines `maddubs` against the tokens' quants, summed
/// in i16 over [`i16_lines`] lines, then one `madd` against the sub-block's scale per token
/// and half, so the integer sums are the scalar ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes_avx2<const T: usize, const KIND: u8>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    n: usize,
    (b0, b1): (usize, usize),
    codes: &Codes,
) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let first = g * GROUP;
    // Where the job owns the whole group (all but the edges of its range) its outputs are
    // read and written in place, else through `lanes` and the window copies.
    let whole = owned_lanes(first, j.r0, j.r1) == (0, GROUP);
    let row = |t: usize| j.out.wrapping_add((t0 + t) * j.ldo + first);
    // The running sums of the owned rows, from the slices before.
    let mut lanes = [[0.0f32; GROUP]; T];
    if b0 > 0 && !whole {
        for (t, l) in lanes.iter_mut().enumerate() {
            // SAFETY: the rows of token t0 + t that this job owns.
            unsafe { load_window(row(t), l, first, j.r0, j.r1) };
        }
    }
    let mut acc: [[__m256; T]; 2] = std::array::from_fn(|h| {
        std::array::from_fn(|t| {
            // SAFETY: 8 floats at lane offset 8·h of `lanes`, or of the token's output row
            // where the job owns all 16.
            unsafe {
                if b0 > 0 && whole {
                    _mm256_loadu_ps(row(t).add(8 * h))
                } else {
                    _mm256_loadu_ps(lanes[t].as_ptr().add(8 * h))
                }
            }
        })
    });
    // Lines per sub-block: 8 (32 values) for Q4_K and Q5_K, 4 (16 values) for the others.
    let sl = if KIND <= KIND_Q5 { 8 } else { 4 };
    let wl = i16_lines(KIND);
    for b in b0..b1 {
        // SAFETY: super-block `b` of group `g` and of each token's row exist.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let cb = codes.block(b - b0);
        prefetch_tokens(j, b - b0, t0, t0 + T, n);
        let mut isum = [[_mm256_setzero_si256(); T]; 2];
        let isum_at = isum.as_mut_ptr() as *mut __m256i;
        for i in 0..CODE_LINES / sl {
            for w0 in (0..sl).step_by(wl) {
                let mut a16 = [[_mm256_setzero_si256(); 2]; T];
                for k in w0..w0 + wl {
                    let line = i * sl + k;
                    // SAFETY: line of super-block `b` in `codes`; activation bytes inside
                    // the tokens' blocks.
                    unsafe {
                        let l = cb.add(line * 64);
                        let w = [
                            _mm256_load_si256(l as *const __m256i),
                            _mm256_load_si256(l.add(32) as *const __m256i),
                        ];
                        for t in 0..T {
                            let xv = _mm256_set1_epi32(x4(x[t], 4 * line));
                            for h in 0..2 {
                                let v = _mm256_maddubs_epi16(w[h], xv);
                                a16[t][h] = _mm256_add_epi16(a16[t][h], v);
                            }
                        }
                    }
                }
                for h in 0..2 {
                    // SAFETY: sub-block i's scales for rows 8·h .. (lines 1–4).
                    let sc = unsafe { scale_lanes::<KIND>(blk.add(64 + 16 * i + 8 * h)) };
                    for t in 0..T {
                        let v = _mm256_madd_epi16(a16[t][h], sc);
                        if sums_in_memory(KIND) {
                            // SAFETY: `isum_at` is `isum`, of 2·T vectors, and `h·T + t` one
                            // of them; nothing else refers to `isum` until the fold.
                            unsafe { add_in_memory(isum_at.add(h * T + t), v) };
                        } else {
                            isum[h][t] = _mm256_add_epi32(isum[h][t], v);
                        }
                    }
                }
            }
        }
        for (h, (isum, acc)) in isum.iter_mut().zip(&mut acc).enumerate() {
            // SAFETY: super-block `b` of the group and of each token's row (see above).
            unsafe {
                match KIND {
                    KIND_Q4 | KIND_Q5 => fold_q45_avx2(j, b, blk, h, &x, isum, acc),
                    KIND_Q6 => fold_signed_avx2::<T, 5>(blk, h, &x, isum, acc),
                    KIND_Q3 => fold_signed_avx2::<T, 2>(blk, h, &x, isum, acc),
                    _ => fold_q2_avx2(blk, h, &x, isum, acc),
                }
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (t, (l, a)) in lanes.iter_mut().zip(acc).enumerate() {
            // SAFETY: 8 floats at lane offset 8·h of `lanes`, or of the token's output row
            // where the job owns all 16.
            unsafe {
                if whole {
                    _mm256_storeu_ps(row(t).add(8 * h), *a);
                } else {
                    _mm256_storeu_ps(l.as_mut_ptr().add(8 * h), *a);
                }
            }
        }
    }
    if !whole {
        for (t, l) in lanes.iter().enumerate() {
            // SAFETY: the destination rows are the caller's.
            unsafe { store_window(row(t), l, first, j.r0, j.r1) };
        }
    }
}

/// The eight scales at `p` (one sub-block, rows of a half-group) as `madd` operands for
/// the kind: 6-bit (Q4_K, Q5_K), signed 8-bit (Q6_K, Q3_K) or the low nibble of the
/// stored byte (Q2_K).
///
/// # Safety
/// As for [`scale_lanes_u8`].
#[inline(always)]
unsafe fn scale_lanes<const KIND: u8>(p: *const u8) -> __m256i {
    // SAFETY: forwarded.
    unsafe {
        match KIND {
            KIND_Q6 | KIND_Q3 => scale_lanes_i8(p),
            KIND_Q2 => _mm256_and_si256(scale_lanes_u8(p), _mm256_set1_epi16(0x0f)),
            _ => scale_lanes_u8(p),
        }
    }
}

/// [`gemm_codes_vnni`] with AVX2, four tokens a tile (eight measured the same: the
/// products, not the activation loads, bound it).
///
/// # Safety
/// As for [`gemm_avx2`]; a Q5_K packed in the `Bytes` form.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_codes_avx2<const KIND: u8>(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    let mut codes = Codes::new();
    let nsb = j.p.nsb;
    for g in g0..g1 {
        let base = j.p.group(g).as_ptr();
        for b0 in (0..nsb).step_by(UNPACKED_BLOCKS) {
            let b1 = nsb.min(b0 + UNPACKED_BLOCKS);
            for b in b0..b1 {
                // SAFETY: super-block `b` of the group; slot `b - b0` of `codes`.
                unsafe {
                    unpack_block_avx2::<KIND>(
                        base.add(b * j.p.block_bytes()),
                        codes.block_mut(b - b0),
                    )
                };
            }
            let sb = (b0, b1);
            // The next slice (of this group or the next one, which follows it in memory)
            // streams in while the tiles run from L1: each tile prefetches its tokens'
            // share of it, a part per super-block.
            let mut jt = j;
            if b1 < nsb || g + 1 < g1 {
                // SAFETY: the next slice is inside the packed matrix (checked just above).
                jt.pf = unsafe { base.add(b1 * j.p.block_bytes()) };
                jt.pf_block = j.p.block_bytes();
            }
            for_token_tiles!(
                n,
                t,
                [4, 2, 1],
                codes_avx2::<_, KIND>(jt, g, t, n, sb, &codes)
            );
        }
    }
}

/// The product for groups `g0..g1` and tokens `0..n`, AVX2.
///
/// # Safety
/// AVX2, FMA and F16C must be present; otherwise as for [`gemm_vnni`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_avx2(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    // Every product of several tokens, batched decode included, unpacks each group's codes
    // once: two tokens already repay the stores and reloads, for every type but Q4_K, which
    // has the least to unpack (3072 × 1024 products on a Zen 3, 2 tokens: Q4_K 93 against
    // 117 µs unpacking as it goes, Q5_K 179 against 133, Q6_K 183 against 146; 8 tokens:
    // Q4_K 346 against 280, Q5_K 695 against 312, Q6_K 578 against 362).
    if n >= 2 {
        // SAFETY: forwarded.
        unsafe {
            match j.p.dtype {
                GgmlType::Q4_K => gemm_codes_avx2::<KIND_Q4>(j, n, g0, g1),
                GgmlType::Q5_K => gemm_codes_avx2::<KIND_Q5>(j, n, g0, g1),
                GgmlType::Q6_K => gemm_codes_avx2::<KIND_Q6>(j, n, g0, g1),
                GgmlType::Q3_K => gemm_codes_avx2::<KIND_Q3>(j, n, g0, g1),
                _ => gemm_codes_avx2::<KIND_Q2>(j, n, g0, g1),
            }
        }
        return;
    }
    for g in g0..g1 {
        // SAFETY: forwarded; one token.
        unsafe { tile_avx2::<1>(j, g, g1, 0, n) };
    }
}

#[cfg(test)]
mod tests {
    /// The vendor test that decides the decode prefetch reads the same vendor as the kernel
    /// reports (Linux only: elsewhere there is nothing to compare against).
    #[test]
    #[cfg(target_os = "linux")]
    fn intel_is_detected_as_the_kernel_reports_it() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let vendor = info
            .lines()
            .find_map(|l| {
                l.strip_prefix("vendor_id")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']))
            })
            .expect("a vendor_id line");
        assert_eq!(
            super::is_intel(),
            vendor.trim() == "GenuineIntel",
            "vendor {vendor:?}"
        );
    }
}
