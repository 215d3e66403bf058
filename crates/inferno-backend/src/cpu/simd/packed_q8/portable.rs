//! The plain-Rust product of packed Q8_0 weights, for CPUs without a vector path: each
//! output row's block sums in the scalar backend's order.

use super::super::{ActQ8Ref, GROUP};
use super::PackedQ8;

/// `out[t * ldo + r]` for every token `t < n` and every real row `r` of groups `g0..g1`.
///
/// # Safety
/// `out` must be valid for writes at those offsets.
pub unsafe fn gemm_q8(
    w: &PackedQ8,
    a: &ActQ8Ref<'_>,
    n: usize,
    g0: usize,
    g1: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = w.nb;
    for g in g0..g1 {
        let rows = w.rows_in_group(g);
        for t in 0..n {
            let xq = &a.quants[t * w.cols..(t + 1) * w.cols];
            let xd = &a.scales[t * nb..(t + 1) * nb];
            let mut acc = [0.0f32; GROUP];
            for b in 0..nb {
                let blk = w.block_quants(g, b);
                let mut isum = [0i32; GROUP];
                for k in 0..8 {
                    let xs = &xq[b * 32 + k * 4..b * 32 + k * 4 + 4];
                    let slice = &blk[k * 64..(k + 1) * 64];
                    for (r, is) in isum.iter_mut().enumerate() {
                        for j in 0..4 {
                            *is += w.weight_value(slice[r * 4 + j]) as i32 * xs[j] as i32;
                        }
                    }
                }
                for (r, accr) in acc.iter_mut().enumerate() {
                    *accr += isum[r] as f32 * (w.scale(g, b, r) * xd[b]);
                }
            }
            for (r, &v) in acc.iter().enumerate().take(rows) {
                // SAFETY: the caller guarantees the offsets are writable.
                unsafe { *out.add(t * ldo + g * GROUP + r) = v };
            }
        }
    }
}
