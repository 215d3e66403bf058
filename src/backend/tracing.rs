//! A decorator that records a `tracing` span around every operation of the backend it wraps.
//!
//! Spans are at TRACE level: with the level filtered out each costs one atomic load.

use super::{AttentionShape, Backend};
use crate::tensor::{GgmlType, Matrix};
use tracing::trace_span;

pub struct TracingBackend<B> {
    inner: B,
    name: String,
}

impl<B: Backend> TracingBackend<B> {
    pub fn new(inner: B) -> Self {
        let name = format!("tracing({})", inner.name());
        Self { inner, name }
    }
}

impl<B: Backend> Backend for TracingBackend<B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn supports(&self, dtype: GgmlType) -> bool {
        self.inner.supports(dtype)
    }

    fn prepare(&self, w: &mut Matrix) {
        self.inner.prepare(w)
    }

    fn matmul(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        let _s = trace_span!("matmul", weight = %w.name, dtype = %w.dtype, n, rows = w.rows, cols = w.cols)
            .entered();
        self.inner.matmul(w, x, n, out)
    }

    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]) {
        let _s = trace_span!("get_row", weight = %w.name, row).entered();
        self.inner.get_row(w, row, out)
    }

    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        let _s = trace_span!("rms_norm", len = x.len(), dim = weight.len()).entered();
        self.inner.rms_norm(x, weight, eps)
    }

    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
        let _s = trace_span!("rope", len = x.len(), n_heads, pos0).entered();
        self.inner.rope(x, n_heads, head_dim, pos0, inv_freq)
    }

    fn attention(
        &self,
        shape: &AttentionShape,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        out: &mut [f32],
    ) {
        let _s = trace_span!("attention", n_tokens = shape.n_tokens, pos0 = shape.pos0).entered();
        self.inner.attention(shape, q, k_cache, v_cache, out)
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        let _s = trace_span!("silu_mul", len = gate.len()).entered();
        self.inner.silu_mul(gate, up)
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        let _s = trace_span!("add", len = x.len()).entered();
        self.inner.add(x, y)
    }

    fn add_bias(&self, x: &mut [f32], bias: &[f32]) {
        let _s = trace_span!("add_bias", len = x.len()).entered();
        self.inner.add_bias(x, bias)
    }

    fn gpu(&self) -> Option<&super::gpu::GpuBackend> {
        self.inner.gpu()
    }
}
