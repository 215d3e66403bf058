//! Plain-Rust float kernels, for CPUs without a vector path: the scalar backend's
//! arithmetic, in the same order.

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

/// Dot product of one float weight row with `x`, in storage order.
pub fn dot_float(dtype: inferno_tensor::GgmlType, w: &[u8], x: &[f32]) -> f32 {
    use inferno_tensor::{float, GgmlType};
    match dtype {
        GgmlType::F16 => float::dot_f16(w, x),
        GgmlType::BF16 => float::dot_bf16(w, x),
        _ => float::dot_f32(w, x),
    }
}
