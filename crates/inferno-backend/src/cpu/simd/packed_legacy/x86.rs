//! x86-64 products of packed Q4_0, Q5_0, Q4_1 and Q5_1 weights ([`super::PackedLegacy`])
//! with Q8_0 activations: AVX2 (`maddubs` on the unsigned codes) and AVX-512 VNNI
//! (`vpdpbusd`). Each lane's block sum is the scalar code's exact one. Callers check the CPU
//! features first; every function here is `unsafe` for that reason.

use super::super::packed_k::Codes;
use super::super::x86::{
    fifth_bit_256, load_rows_256, nibble_codes_512, store_rows_256, store_rows_512, PF_DIST,
};
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

/// The codes of line `j` of the packed block at `wq` (slices `2j` and `2j + 1`, each as
/// rows 0–7 and 8–15), with their fifth bits from the block's fifth-bit line `hl` (rows 0–7
/// and 8–15) for five-bit codes: unsigned bytes, the operand of `maddubs`. The fifth bits
/// come by shifts with `shift` (three ops), else by a byte compare (four ops, but no
/// shifts), which one token's product runs faster with: the Q5_0 4864 × 896 matvec took 112
/// against 127 µs on a Zen 3.
///
/// # Safety
/// `wq` holds the block's 4 lines of 64 bytes; AVX2 enabled.
#[inline(always)]
unsafe fn line_codes_avx2<const FIVE: bool>(
    wq: *const u8,
    hl: [__m256i; 2],
    j: usize,
    shift: bool,
) -> [[__m256i; 2]; 2] {
    let m4 = _mm256_set1_epi8(0x0f);
    // SAFETY: line j is inside the block.
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
            // Slice 2j + h's fifth bits: that bit of each byte, at bit 4.
            let bit = 2 * j + h;
            for (cq, hq) in c.iter_mut().zip(hl) {
                let f = if shift {
                    // SAFETY: AVX2 is the caller's promise.
                    unsafe { fifth_bit_256(hq, bit) }
                } else {
                    let sel = _mm256_set1_epi8(1 << bit);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(hq, sel), sel);
                    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                };
                *cq = _mm256_or_si256(*cq, f);
            }
        }
    }
    codes
}

/// The fifth-bit line of block `b` at `hp` as rows 0–7 and 8–15 (zero for four-bit codes).
///
/// # Safety
/// For five-bit codes, `hp` holds block `b`'s 64 bytes; AVX2 enabled.
#[inline(always)]
unsafe fn fifth_line_avx2<const FIVE: bool>(hp: *const u8, b: usize) -> [__m256i; 2] {
    if FIVE {
        // SAFETY: the caller's.
        unsafe {
            [
                _mm256_loadu_si256(hp.add(b * 64) as *const __m256i),
                _mm256_loadu_si256(hp.add(b * 64 + 32) as *const __m256i),
            ]
        }
    } else {
        [_mm256_setzero_si256(); 2]
    }
}

/// Slices of a block whose `maddubs` pairs add in i16 before one `madd` widens them: a pair
/// is at most 2·c·128 in magnitude for codes below c, so four-bit codes sum the whole block
/// (8 slices: 30,720) and five-bit codes half of it (4 slices: 31,744), exact. One `madd`
/// per `maddubs` held the products to half the rate of `maddubs`.
const fn i16_slices(five: bool) -> usize {
    if five {
        4
    } else {
        8
    }
}

/// Each of `T` tokens' integer sums of a block, before any slice is added: `−off·Σx` for the
/// offset types (see [`legacy_offset_shift`]), zero for the minimum types.
///
/// # Safety
/// `xo` holds block `b` of each of the `T` tokens' rows of `nb` blocks.
#[inline(always)]
unsafe fn block_sums_start<const T: usize, const FIVE: bool, const MIN: bool>(
    xo: *const i32,
    nb: usize,
    b: usize,
) -> [[__m256i; 2]; T] {
    std::array::from_fn(|t| {
        if MIN {
            [_mm256_setzero_si256(); 2]
        } else {
            // SAFETY: the caller's.
            [_mm256_set1_epi32(unsafe { *xo.add(t * nb + b) } >> legacy_offset_shift(FIVE)); 2]
        }
    })
}

/// Block `b`'s integer sums `isum` of tokens `t0..t0 + T` scaled into the running sums
/// `acc` (rows 0–7, 8–15): `isum · (d_w · d_x)`, plus `m_w · s_x` for the minimum types,
/// then added, the scalar expressions' order (the products commute exactly).
///
/// # Safety
/// Block `b` of group `g` and of the tokens exist; AVX2, FMA and F16C enabled.
#[inline(always)]
unsafe fn scale_block_avx2<const T: usize, const MIN: bool>(
    (w, g, a, t0, b): (&PackedLegacy, usize, &ActQ8Ref<'_>, usize, usize),
    isum: &[[__m256i; 2]; T],
    acc: &mut [[__m256; 2]; T],
) {
    let nb = w.nb;
    let sbase = w.group_scales16(g).as_ptr();
    // SAFETY: 16 f16 scales per block.
    let dw = unsafe {
        [
            _mm256_cvtph_ps(_mm_loadu_si128(sbase.add(b * 16) as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(sbase.add(b * 16 + 8) as *const __m128i)),
        ]
    };
    let mw = if MIN {
        let mbase = w.group_mins16(g);
        assert!(mbase.len() >= nb * GROUP);
        let mbase = mbase.as_ptr();
        // SAFETY: 16 f16 minimums per block (checked just above).
        Some(unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(mbase.add(b * 16) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(mbase.add(b * 16 + 8) as *const __m128i)),
            ]
        })
    } else {
        None
    };
    for (t, (ac, is)) in acc.iter_mut().zip(isum).enumerate() {
        let dx = _mm256_set1_ps(a.scales[(t0 + t) * nb + b]);
        for (h, d) in dw.into_iter().enumerate() {
            let mut term = _mm256_mul_ps(_mm256_cvtepi32_ps(is[h]), _mm256_mul_ps(d, dx));
            if let Some(m) = mw {
                let sx = _mm256_set1_ps(a.sums[(t0 + t) * nb + b]);
                term = _mm256_add_ps(term, _mm256_mul_ps(m[h], sx));
            }
            ac[h] = _mm256_add_ps(ac[h], term);
        }
    }
}

/// One slice's codes `c` (rows 0–7, 8–15) times each of `T` tokens' four activations of
/// it (token `t` at `x + t·cols`), added to the tokens' i16 sums `a16`.
///
/// # Safety
/// `x + t·cols` holds 4 bytes for each token; AVX2 enabled.
#[inline(always)]
unsafe fn add_slice_avx2<const T: usize>(
    c: [__m256i; 2],
    x: *const i8,
    cols: usize,
    a16: &mut [[__m256i; 2]; T],
) {
    for (t, a) in a16.iter_mut().enumerate() {
        // SAFETY: the caller's.
        let xb = _mm256_set1_epi32(unsafe { (x.add(t * cols) as *const i32).read_unaligned() });
        a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(c[0], xb));
        a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(c[1], xb));
    }
}

/// The i16 sums of a window of slices widened by `madd` and added to the block's sums.
#[inline(always)]
unsafe fn widen_window_avx2<const T: usize>(a16: &[[__m256i; 2]; T], isum: &mut [[__m256i; 2]; T]) {
    let ones = _mm256_set1_epi16(1);
    for (is, a) in isum.iter_mut().zip(a16) {
        is[0] = _mm256_add_epi32(is[0], _mm256_madd_epi16(a[0], ones));
        is[1] = _mm256_add_epi32(is[1], _mm256_madd_epi16(a[1], ones));
    }
}

/// One group of 16 rows times `T` tokens of a packed Q4_0 (`FIVE` false), Q5_0, or with
/// `MIN` Q4_1 / Q5_1 matrix, AVX2, unpacking as it goes: each 64-byte line splits into the
/// codes of two slices ([`line_codes_avx2`]), multiplied as unsigned bytes by `maddubs`
/// (pairs at most 2·31·128 in magnitude: exact), added in i16 over [`i16_slices`] slices and
/// widened to 32-bit sums by `madd`.
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
    assert!(!FIVE || high.len() >= nb * 8);
    let hp = high.as_ptr() as *const u8;
    let xq = a.quants[t0 * cols..(t0 + T) * cols].as_ptr();
    let xo = a.offsets[t0 * nb..(t0 + T) * nb].as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..nb {
        // SAFETY: block `b` of each of the T tokens is inside the slices taken above.
        let mut isum = unsafe { block_sums_start::<T, FIVE, MIN>(xo, nb, b) };
        // SAFETY: block `b` of group `g` holds 4 lines × 64 bytes.
        let wq = unsafe { qbase.add(b * 256) };
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + 64) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + 128) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(wq.wrapping_add(PF_DIST / 2 + 192) as *const i8);
        // SAFETY: block `b` of a five-bit group has its 64 bytes (checked on entry).
        let hl = unsafe { fifth_line_avx2::<FIVE>(hp, b) };
        let lines = i16_slices(FIVE) / 2;
        for j0 in (0..4).step_by(lines) {
            let mut a16 = [[_mm256_setzero_si256(); 2]; T];
            for j in j0..j0 + lines {
                // SAFETY: inside the block (see above).
                let codes = unsafe { line_codes_avx2::<FIVE>(wq, hl, j, T > 1) };
                for (h, c) in codes.into_iter().enumerate() {
                    let x = xq.wrapping_add(b * 32 + (2 * j + h) * 4);
                    // SAFETY: each token has `cols` quants; slice 2j + h is inside block `b`.
                    unsafe { add_slice_avx2(c, x, cols, &mut a16) };
                }
            }
            // SAFETY: AVX2 enabled.
            unsafe { widen_window_avx2(&a16, &mut isum) };
        }
        // SAFETY: block `b` of the group and the tokens (see above); AVX2 enabled.
        unsafe { scale_block_avx2::<T, MIN>((w, g, a, t0, b), &isum, &mut acc) };
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.into_iter().enumerate() {
        // SAFETY: the destination is the caller's.
        unsafe { store_rows_256(out.add((t0 + t) * ldo + g * GROUP), ac, rows) };
    }
}

/// Blocks of a group unpacked at a time by the products of several tokens: 8 lines of codes
/// a block fill the 16 KiB scratch at 32, which stays in L1 beside a tile's activations.
const UNPACKED_LEGACY_BLOCKS: usize = 32;

/// Block `b` of group `g` unpacked to its 8 slices' codes at `dst`: line `k` (64 bytes)
/// holds slice `k`'s codes of rows 0–7, then of rows 8–15, as [`line_codes_avx2`] gives
/// them.
///
/// # Safety
/// Block `b` of group `g` exists; `dst` is writable for 512 bytes, 32-byte aligned; AVX2
/// enabled.
#[inline(always)]
unsafe fn unpack_block_avx2<const FIVE: bool>(w: &PackedLegacy, g: usize, b: usize, dst: *mut u8) {
    let high = w.group_high(g);
    assert!(b < w.nb && (!FIVE || high.len() >= w.nb * 8));
    // SAFETY: block `b` of the group (checked above) holds 4 lines × 64 bytes and, for
    // five-bit codes, its fifth-bit line.
    let (wq, hl) = unsafe {
        (
            w.group_nibbles(g).as_ptr().add(b * 256),
            fifth_line_avx2::<FIVE>(high.as_ptr() as *const u8, b),
        )
    };
    for j in 0..4 {
        // SAFETY: line j of the block; lines 2j and 2j + 1 of the caller's 8 at `dst`.
        unsafe {
            let codes = line_codes_avx2::<FIVE>(wq, hl, j, true);
            for (h, c) in codes.iter().enumerate() {
                let l = dst.add((2 * j + h) * 64);
                _mm256_store_si256(l as *mut __m256i, c[0]);
                _mm256_store_si256(l.add(32) as *mut __m256i, c[1]);
            }
        }
    }
}

/// Asks for block `b` of group `g` (its code lines, fifth bits and scales) to be brought
/// towards the core while the tiles of the slice before it run from L1.
#[inline(always)]
fn prefetch_block(w: &PackedLegacy, g: usize, b: usize) {
    let q = w.group_nibbles(g)[b * 256..].as_ptr();
    let mut lines = [std::ptr::null::<u8>(); 7];
    for (l, p) in lines[..4].iter_mut().enumerate() {
        *p = q.wrapping_add(64 * l);
    }
    if w.five {
        lines[4] = w.group_high(g)[b * 8..].as_ptr() as *const u8;
    }
    // Scales (and minimums) take 32 bytes a block: one line for two.
    if b.is_multiple_of(2) {
        lines[5] = w.group_scales16(g)[b * GROUP..].as_ptr() as *const u8;
        if w.min {
            lines[6] = w.group_mins16(g)[b * GROUP..].as_ptr() as *const u8;
        }
    }
    for p in lines.into_iter().filter(|p| !p.is_null()) {
        // SAFETY: SSE is part of x86_64; a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) };
    }
}

/// Blocks `b0..b1` of one group of 16 rows times tokens `t0..t0 + T`, AVX2, from the codes
/// [`unpack_block_avx2`] left in `codes` (block `b` at line `8·(b − b0)`): as
/// [`group_legacy_avx2`] without the unpacking, and the running sums continued from the
/// outputs where `b0 > 0` (stored and reloaded exactly, so the sums are the one-pass ones).
/// With `next`, the first tile asks for the same blocks of the next slice to be fetched.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn codes_tile_avx2<const T: usize, const FIVE: bool, const MIN: bool>(
    w: &PackedLegacy,
    g: usize,
    a: &ActQ8Ref<'_>,
    t0: usize,
    (b0, b1): (usize, usize),
    codes: &Codes,
    next: Option<(usize, usize, usize)>,
    (out, ldo): (*mut f32, usize),
) {
    let nb = w.nb;
    let cols = w.cols;
    let rows = w.rows_in_group(g);
    let xq = a.quants[t0 * cols..(t0 + T) * cols].as_ptr();
    let xo = a.offsets[t0 * nb..(t0 + T) * nb].as_ptr();
    let dst = |t: usize| out.wrapping_add((t0 + t) * ldo + g * GROUP);
    let mut acc: [[__m256; 2]; T] = std::array::from_fn(|t| {
        if b0 > 0 {
            // SAFETY: the group's real rows of token t0 + t, written by the slice before.
            unsafe { load_rows_256(dst(t), rows) }
        } else {
            [_mm256_setzero_ps(); 2]
        }
    });
    let slices = i16_slices(FIVE);
    for b in b0..b1 {
        if let Some((ng, nb0, nb1)) = next {
            if nb0 + (b - b0) < nb1 {
                prefetch_block(w, ng, nb0 + (b - b0));
            }
        }
        // SAFETY: block `b` of each of the T tokens is inside the slices taken above.
        let mut isum = unsafe { block_sums_start::<T, FIVE, MIN>(xo, nb, b) };
        let cb = codes.line(8 * (b - b0));
        for k0 in (0..8).step_by(slices) {
            let mut a16 = [[_mm256_setzero_si256(); 2]; T];
            for k in k0..k0 + slices {
                // SAFETY: slice k of block `b` in `codes` (32-byte aligned lines); each token
                // has `cols` quants, slice k inside block `b`.
                unsafe {
                    let l = cb.add(k * 64);
                    let c = [
                        _mm256_load_si256(l as *const __m256i),
                        _mm256_load_si256(l.add(32) as *const __m256i),
                    ];
                    add_slice_avx2(c, xq.add(b * 32 + k * 4), cols, &mut a16);
                }
            }
            // SAFETY: AVX2 enabled.
            unsafe { widen_window_avx2(&a16, &mut isum) };
        }
        // SAFETY: block `b` of the group and the tokens (see above); AVX2 enabled.
        unsafe { scale_block_avx2::<T, MIN>((w, g, a, t0, b), &isum, &mut acc) };
    }
    for (t, ac) in acc.into_iter().enumerate() {
        // SAFETY: the destination is the caller's.
        unsafe { store_rows_256(dst(t), ac, rows) };
    }
}

/// The product of several tokens, AVX2: each group's codes unpacked once per slice of
/// [`UNPACKED_LEGACY_BLOCKS`] blocks, then every token tile multiplied from them.
///
/// # Safety
/// As for [`gemm_legacy_avx2`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_codes_avx2<const FIVE: bool, const MIN: bool>(
    w: &PackedLegacy,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut codes = Codes::new();
    let nb = w.nb;
    let step = UNPACKED_LEGACY_BLOCKS;
    for g in g0..g1 {
        for b0 in (0..nb).step_by(step) {
            let b1 = nb.min(b0 + step);
            for b in b0..b1 {
                // SAFETY: block `b` of the group; lines 8·(b − b0) .. of the scratch, inside
                // it as b − b0 < 32, 64-byte aligned.
                unsafe { unpack_block_avx2::<FIVE>(w, g, b, codes.line_mut(8 * (b - b0))) };
            }
            // The slice after this one: the rest of this group's blocks, or the next group's
            // first ones.
            let next = if b1 < nb {
                Some((g, b1, nb.min(b1 + step)))
            } else {
                (g + 1 < g1).then(|| (g + 1, 0, nb.min(step)))
            };
            // The first tile alone asks for the next slice: with the weights from memory, as
            // a decode step reads them, 8 tokens took 523 µs so, 541 with every tile asking
            // for its share, 605 with no asking (Q5_0 4864 × 896, Zen 3; from cache, no
            // asking was fastest, 477 against 531 µs).
            let pf = |t: usize| if t == 0 { next } else { None };
            let (sb, o) = ((b0, b1), (out, ldo));
            for_token_tiles!(
                n,
                t,
                [4, 2, 1],
                codes_tile_avx2::<_, FIVE, MIN>(w, g, a, t, sb, &codes, pf(t), o)
            );
        }
    }
}

/// Packed Q4_0 / Q5_0 / Q4_1 / Q5_1 product for the rows of groups `g0..g1` and tokens
/// `0..n`, AVX2. Up to one tile of tokens unpacks the codes as it goes; more unpack each
/// group's once ([`gemm_codes_avx2`]), which a second tile already repays (Q5_0 4864 × 896
/// on a Zen 3: 4 tokens 261 against 293 µs unpacking as it goes, 5 tokens 366 against 352,
/// 64 tokens 4.0 against 3.1 ms).
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
    if n > 4 {
        // SAFETY: forwarded.
        unsafe {
            match (w.five, w.min) {
                (false, false) => gemm_codes_avx2::<false, false>(w, a, n, g0, g1, out, ldo),
                (true, false) => gemm_codes_avx2::<true, false>(w, a, n, g0, g1, out, ldo),
                (false, true) => gemm_codes_avx2::<false, true>(w, a, n, g0, g1, out, ldo),
                (true, true) => gemm_codes_avx2::<true, true>(w, a, n, g0, g1, out, ldo),
            }
        }
        return;
    }
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
        // SAFETY: the group's `rows <= 16` outputs of token `t0 + t` are the caller's;
        // AVX-512 F is enabled in this function.
        unsafe { store_rows_512(out.add((t0 + t) * ldo + g * GROUP), *ac, rows) };
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
