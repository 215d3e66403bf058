//! AArch64 product of packed Q8_0 weights ([`super::PackedQ8`], scales widened to f32)
//! with Q8_0 activations, by `sdot`; each lane is one output row and follows the scalar
//! definition exactly.

use super::super::aarch64::{sdot, store_group};
use super::super::{ActQ8Ref, GROUP};
use super::PackedQ8;
use std::arch::aarch64::*;

/// One group of 16 rows times `T` tokens.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn group_sdot<const T: usize>(
    w: &PackedQ8,
    g: usize,
    a: &ActQ8Ref<'_>,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = w.nb;
    let cols = w.cols;
    let qbase = w.group_quants(g).as_ptr() as *const i8;
    let sbase = w.group_scales32(g).as_ptr();
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    for b in 0..nb {
        let mut isum = [[vdupq_n_s32(0); 4]; T];
        // SAFETY: block `b` of group `g` holds 8 slices × 64 bytes.
        let wq = unsafe { qbase.add(b * 512) };
        for k in 0..8 {
            // SAFETY: inside the block.
            let wv: [int8x16_t; 4] =
                std::array::from_fn(|j| unsafe { vld1q_s8(wq.add(k * 64 + j * 16)) });
            for (t, is) in isum.iter_mut().enumerate() {
                // SAFETY: token t0+t has `cols` quants; this slice is inside block `b`.
                let xv = unsafe {
                    (a.quants.as_ptr().add((t0 + t) * cols + b * 32 + k * 4) as *const i32)
                        .read_unaligned()
                };
                let xb = vreinterpretq_s8_s32(vdupq_n_s32(xv));
                for j in 0..4 {
                    // SAFETY: the dot-product extension is enabled for this function.
                    is[j] = unsafe { sdot(is[j], wv[j], xb) };
                }
            }
        }
        // SAFETY: 16 f32 scales per block.
        let dw: [float32x4_t; 4] =
            std::array::from_fn(|j| unsafe { vld1q_f32(sbase.add(b * 16 + j * 4)) });
        for (t, (ac, is)) in acc.iter_mut().zip(&isum).enumerate() {
            let dx = vdupq_n_f32(a.scales[(t0 + t) * nb + b]);
            for j in 0..4 {
                ac[j] = vaddq_f32(ac[j], vmulq_f32(vcvtq_f32_s32(is[j]), vmulq_f32(dw[j], dx)));
            }
        }
    }
    let rows = w.rows_in_group(g);
    for (t, ac) in acc.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_group(ac, out.add((t0 + t) * ldo + g * GROUP), rows) };
    }
}

/// Q8_0 product for the rows of groups `g0..g1` and tokens `0..n` with `sdot`.
///
/// # Safety
/// NEON and the dot-product extension must be present; `w` packed with f32 scales; `out`
/// writable at `t * ldo + r` for those tokens and rows.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn gemm_q8_sdot(
    w: &PackedQ8,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    for g in g0..g1 {
        for_token_tiles!(n, t, [4, 3, 2, 1], group_sdot(w, g, a, t, out, ldo));
    }
}
