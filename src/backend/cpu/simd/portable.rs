//! Plain-Rust versions of the SIMD kernels, over the same data layouts: used on CPUs without a
//! vector path and for shapes the vector code does not cover (e.g. odd head sizes). They
//! follow the scalar backend's arithmetic exactly.

use super::{ActQ8Ref, PackedQ8, GROUP};
use crate::backend::{AttentionShape, KvRows};
use crate::tensor::q8_0;
use half::f16;

/// Q8_0 quantization of whole rows, as `q8_0::quantize` (round half away from zero), with the
/// per-block scale widened back from f16, −128 × the per-block sum of the quants, and the
/// Q8_1 sum field of `legacy::quantize_q8_1` (`Σq · amax / 127` rounded to f16), widened.
pub fn quantize_rows(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32], m: &mut [f32]) {
    for (bi, xb) in x.chunks_exact(q8_0::BLOCK).enumerate() {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        d[bi] = f16::from_f32(dd).to_f32();
        let mut sum = 0i32;
        for (o, &v) in q[bi * q8_0::BLOCK..(bi + 1) * q8_0::BLOCK]
            .iter_mut()
            .zip(xb)
        {
            *o = (v * id).round() as i8;
            sum += *o as i32;
        }
        s[bi] = -128 * sum;
        m[bi] = f16::from_f32(sum as f32 * dd).to_f32();
    }
}

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

pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for row in x.chunks_exact_mut(dim) {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(weight) {
            *v = *v * inv * g;
        }
    }
}

pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Rotates every head of `x` by the angles whose cosines and sines are `cos`/`sin`
/// (`n_tokens × head_dim/2` each), as the scalar backend does.
pub fn rope_apply(x: &mut [f32], n_heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for (t, tok) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in tok.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[i] - b * s[i];
                head[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/// Attention for one query token and all query heads sharing one KV head, with the scalar
/// backend's online softmax. `q` and `out` hold the group's heads back to back.
#[allow(clippy::too_many_arguments)]
pub fn attend_group(
    s: &AttentionShape,
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    kv_len: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    for (qh, acc) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        crate::backend::cpu::scalar::attend_head(qh, k, v, hd, kv_len, s.scale, acc);
    }
}

/// Dot product of one float weight row with `x`, in storage order.
pub fn dot_float(dtype: crate::tensor::GgmlType, w: &[u8], x: &[f32]) -> f32 {
    use crate::tensor::{float, GgmlType};
    match dtype {
        GgmlType::F16 => float::dot_f16(w, x),
        GgmlType::BF16 => float::dot_bf16(w, x),
        _ => float::dot_f32(w, x),
    }
}
