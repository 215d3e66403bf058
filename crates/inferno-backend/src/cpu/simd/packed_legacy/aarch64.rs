//! AArch64 products of packed Q4_0, Q5_0, Q4_1 and Q5_1 weights ([`super::PackedLegacy`])
//! with Q8_0 activations, by `sdot` on the codes (all at most 31, so valid signed bytes).
//! Each lane's block sum is the scalar code's exact one; the f16 scales are widened as they
//! are read.

use super::super::aarch64::{f16x4, sdot, store_group};
use super::super::{ActQ8Ref, GROUP};
use super::PackedLegacy;
use std::arch::aarch64::*;

/// One group of 16 rows times `T` tokens of a packed Q4_0 (`FIVE` false), Q5_0, or with
/// `MIN` Q4_1 / Q5_1 matrix: each 64-byte line splits into the codes of two slices (low and
/// high nibbles, plus the fifth bits for five-bit codes), at most 31 and so valid signed
/// bytes for `sdot`. The offset types start each block's sums from `−off·Σx` (off = 8 or
/// 16), the stored `−128·Σx` shifted right by 4 or 3: exact, as it is a multiple of 128.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn group_legacy_sdot<const T: usize, const FIVE: bool, const MIN: bool>(
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
    let sbase = w.group_scales16(g).as_ptr() as *const u8;
    let mins = w.group_mins16(g);
    assert!(!MIN || mins.len() >= nb * GROUP);
    let mbase = mins.as_ptr() as *const u8;
    let hp = high.as_ptr() as *const u8;
    let shift = if FIVE { 3 } else { 4 };
    let m4 = vdupq_n_u8(0x0f);
    let sixteen = vdupq_n_u8(16);
    let xq = a.quants[t0 * cols..(t0 + T) * cols].as_ptr();
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    for b in 0..nb {
        let mut isum: [[int32x4_t; 4]; T] = std::array::from_fn(|t| {
            if MIN {
                [vdupq_n_s32(0); 4]
            } else {
                [vdupq_n_s32(a.offsets[(t0 + t) * nb + b] >> shift); 4]
            }
        });
        // SAFETY: block `b` of group `g` holds 4 lines × 64 bytes.
        let wq = unsafe { qbase.add(b * 256) };
        // The block's fifth-bit line, four rows a register (unused for four-bit codes).
        let hl: [uint8x16_t; 4] = if FIVE {
            // SAFETY: block `b` of a five-bit group has its 64 bytes (checked on entry).
            std::array::from_fn(|q| unsafe { vld1q_u8(hp.add(b * 64 + q * 16)) })
        } else {
            [vdupq_n_u8(0); 4]
        };
        for j in 0..4 {
            // SAFETY: inside the block.
            let v: [uint8x16_t; 4] =
                std::array::from_fn(|q| unsafe { vld1q_u8(wq.add(j * 64 + q * 16)) });
            let mut codes = [v.map(|r| vandq_u8(r, m4)), v.map(|r| vshrq_n_u8::<4>(r))];
            if FIVE {
                for (h, c) in codes.iter_mut().enumerate() {
                    // Slice 2j + h's fifth bits: that bit of each byte, as 16 where set.
                    let sel = vdupq_n_u8(1 << (2 * j + h));
                    for q in 0..4 {
                        c[q] = vorrq_u8(c[q], vandq_u8(vtstq_u8(hl[q], sel), sixteen));
                    }
                }
            }
            for (h, c) in codes.iter().enumerate() {
                let k = 2 * j + h;
                for (t, is) in isum.iter_mut().enumerate() {
                    // SAFETY: token t0+t has `cols` quants; slice k is inside block `b`.
                    let xv = unsafe {
                        (xq.add(t * cols + b * 32 + k * 4) as *const i32).read_unaligned()
                    };
                    let xb = vreinterpretq_s8_s32(vdupq_n_s32(xv));
                    for q in 0..4 {
                        // SAFETY: the dot-product extension is enabled for this function.
                        is[q] = unsafe { sdot(is[q], vreinterpretq_s8_u8(c[q]), xb) };
                    }
                }
            }
        }
        // SAFETY: 16 f16 scales per block.
        let dw: [float32x4_t; 4] =
            std::array::from_fn(|q| unsafe { f16x4(sbase.add(2 * (b * GROUP + 4 * q))) });
        // SAFETY: 16 f16 minimums per block (checked on entry) where the type has them.
        let mw: Option<[float32x4_t; 4]> = MIN
            .then(|| std::array::from_fn(|q| unsafe { f16x4(mbase.add(2 * (b * GROUP + 4 * q))) }));
        for (t, (ac, is)) in acc.iter_mut().zip(&isum).enumerate() {
            let dx = vdupq_n_f32(a.scales[(t0 + t) * nb + b]);
            let sx = vdupq_n_f32(if MIN { a.sums[(t0 + t) * nb + b] } else { 0.0 });
            for q in 0..4 {
                // isum · (d_w · d_x), plus m_w · s_x for the minimum types, then added: the
                // scalar expressions' order (the products commute exactly).
                let mut term = vmulq_f32(vcvtq_f32_s32(is[q]), vmulq_f32(dw[q], dx));
                if let Some(m) = mw {
                    term = vaddq_f32(term, vmulq_f32(m[q], sx));
                }
                ac[q] = vaddq_f32(ac[q], term);
            }
        }
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_group(ac, out.add((t0 + t) * ldo + g * GROUP), rows) };
    }
}

/// `$name::<T>(…)`: [`group_legacy_sdot`] for one legacy type (`FIVE`, `MIN` fixed), as the
/// plain function `for_token_tiles!` takes.
macro_rules! legacy_group_fns {
    ($($name:ident = ($five:literal, $min:literal)),+) => {$(
        #[inline]
        #[target_feature(enable = "neon,dotprod")]
        unsafe fn $name<const T: usize>(
            w: &PackedLegacy,
            g: usize,
            a: &ActQ8Ref<'_>,
            t0: usize,
            out: *mut f32,
            ldo: usize,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe { group_legacy_sdot::<T, $five, $min>(w, g, a, t0, out, ldo) }
        }
    )+};
}

legacy_group_fns!(
    group_q4_0 = (false, false),
    group_q5_0 = (true, false),
    group_q4_1 = (false, true),
    group_q5_1 = (true, true)
);

/// Packed Q4_0 / Q5_0 / Q4_1 / Q5_1 product for the rows of groups `g0..g1` and tokens
/// `0..n` with `sdot`.
///
/// # Safety
/// NEON and the dot-product extension must be present; `a` holds `n` rows of `w.cols`
/// quants with their block scales, offsets and sums; `out` must be writable at
/// `t * ldo + r` for those tokens and rows, which no other thread touches during the call.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn gemm_legacy_sdot(
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
                for_token_tiles!(n, t, [4, 3, 2, 1], group_q4_0(w, g, a, t, out, ldo))
            }
            (true, false) => for_token_tiles!(n, t, [4, 3, 2, 1], group_q5_0(w, g, a, t, out, ldo)),
            (false, true) => for_token_tiles!(n, t, [4, 3, 2, 1], group_q4_1(w, g, a, t, out, ldo)),
            (true, true) => for_token_tiles!(n, t, [4, 3, 2, 1], group_q5_1(w, g, a, t, out, ldo)),
        }
    }
}
