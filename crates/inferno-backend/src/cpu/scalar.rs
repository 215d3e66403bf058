//! The reference backend: plain loops, one core, defining the numerics of every operation.

use crate::{AttentionShape, Backend, KvLayer, KvRows};
use inferno_tensor::{self as tensor, float, GgmlType, Matrix, QuantDot};
use std::cell::RefCell;

thread_local! {
    /// Activation rows quantized for integer dot products; grows to the largest request and
    /// is then reused, so steady-state decode allocates nothing.
    static QUANT_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[derive(Default)]
pub struct ScalarBackend;

impl ScalarBackend {
    pub fn new() -> Self {
        Self
    }
}

/// Runs `f` with a scratch buffer of at least `len` bytes owned by this thread.
pub fn with_quant_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    QUANT_SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        f(&mut buf[..len])
    })
}

/// `out[i] = w[rows.start + i] · x_q` for a range of rows of a quantized matrix, with `x_q`
/// one activation row already quantized to `k.activation`: the unit of work a
/// multi-threaded backend hands each thread.
pub fn quant_rows(
    k: &QuantDot,
    w: &Matrix,
    rows: std::ops::Range<usize>,
    x_q: &[u8],
    out: &mut [f32],
) {
    for (r, o) in rows.zip(out.iter_mut()) {
        *o = (k.dot)(w.row(r), x_q);
    }
}

/// One output value of a float-weight matmul.
fn dot_float_row(dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    match dtype {
        GgmlType::F32 => float::dot_f32(w, x),
        GgmlType::F16 => float::dot_f16(w, x),
        GgmlType::BF16 => float::dot_bf16(w, x),
        _ => unreachable!("float dot on {dtype}"),
    }
}

impl Backend for ScalarBackend {
    fn name(&self) -> &str {
        "scalar"
    }

    fn supports(&self, dtype: GgmlType) -> bool {
        tensor::is_supported(dtype)
    }

    fn matmul(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        let (rows, cols) = (w.rows, w.cols);
        debug_assert_eq!(x.len(), n * cols);
        debug_assert_eq!(out.len(), n * rows);
        match tensor::quant_dot(w.dtype) {
            Some(k) => {
                // Shapes were validated at load, so the activation row size exists.
                let qrow = k.activation.row_size(cols as u64).unwrap_or(0) as usize;
                with_quant_scratch(n * qrow, |qx| {
                    for t in 0..n {
                        (k.quantize)(
                            &x[t * cols..(t + 1) * cols],
                            &mut qx[t * qrow..(t + 1) * qrow],
                        );
                    }
                    for t in 0..n {
                        let o = &mut out[t * rows..(t + 1) * rows];
                        quant_rows(&k, w, 0..rows, &qx[t * qrow..(t + 1) * qrow], o);
                    }
                })
            }
            None => {
                for t in 0..n {
                    let xr = &x[t * cols..(t + 1) * cols];
                    for (r, o) in out[t * rows..(t + 1) * rows].iter_mut().enumerate() {
                        *o = dot_float_row(w.dtype, w.row(r), xr);
                    }
                }
            }
        }
    }

    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]) {
        // The matrix type was checked by `supports` at load, so this cannot fail.
        let _ = tensor::dequantize_row(w.dtype, w.row(row), out);
    }

    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        let dim = weight.len();
        for row in x.chunks_exact_mut(dim) {
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
            for (v, &g) in row.iter_mut().zip(weight) {
                *v = *v * inv * g;
            }
        }
    }

    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
        let half = head_dim / 2;
        for (t, tok) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
            for (i, &f) in inv_freq.iter().enumerate() {
                let (cos, sin) = crate::rope_angle(pos0 + t, f);
                for head in tok.chunks_exact_mut(head_dim) {
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * cos - b * sin;
                    head[i + half] = b * cos + a * sin;
                }
            }
        }
    }

    fn attention(&self, s: &AttentionShape, q: &[f32], kv: KvLayer<'_>, out: &mut [f32]) {
        let hd = s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        for t in 0..s.n_tokens {
            let kv_len = s.pos0 + t + 1;
            for h in 0..s.n_heads {
                let kvh = h / group;
                let base = (t * s.n_heads + h) * hd;
                let qh = &q[base..base + hd];
                let acc = &mut out[base..base + hd];
                let r0 = kvh * s.capacity;
                let k = kv.k.rows(r0, r0 + kv_len, hd);
                let v = kv.v.rows(r0, r0 + kv_len, hd);
                attend_head(qh, k, v, hd, kv_len, s.scale, acc);
            }
        }
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// The largest head the host attention kernels take (a stored key or value row is widened
/// on the stack).
pub const MAX_HEAD_DIM: usize = 512;

/// One query head's attention over the first `kv_len` keys and values (rows of `hd` values
/// in their stored type), into `acc`: the online softmax, one pass over the cache,
/// rescaling when the max grows. The reference every attention kernel's per-row arithmetic
/// follows.
pub fn attend_head(
    qh: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    hd: usize,
    kv_len: usize,
    scale: f32,
    acc: &mut [f32],
) {
    acc.fill(0.0);
    let (mut kbuf, mut vbuf) = ([0.0f32; MAX_HEAD_DIM], [0.0f32; MAX_HEAD_DIM]);
    let mut max = f32::NEG_INFINITY;
    let mut denom = 0.0f32;
    for j in 0..kv_len {
        let kj = k.row(j, hd, &mut kbuf);
        let score = qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
        if score > max {
            let c = (max - score).exp();
            denom *= c;
            acc.iter_mut().for_each(|a| *a *= c);
            max = score;
        }
        let p = (score - max).exp();
        denom += p;
        for (a, &vv) in acc.iter_mut().zip(v.row(j, hd, &mut vbuf)) {
            *a += p * vv;
        }
    }
    let inv = 1.0 / denom;
    acc.iter_mut().for_each(|a| *a *= inv);
}
