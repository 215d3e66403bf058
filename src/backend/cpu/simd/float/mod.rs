//! Float operations on the host: float-weight products (F32, F16, BF16 rows against f32
//! activations) and the element-wise operations (RMSNorm, SiLU · up, add, RoPE with its
//! angle table), dispatched to `x86.rs` beside this file or the portable versions.

pub(super) mod portable;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::{Kernels, OutPtr};
use crate::tensor::{GgmlType, Matrix};
use std::cell::RefCell;

thread_local! {
    static ROPE: RefCell<RopeTable> = RefCell::new(RopeTable::default());
}

/// Cosines and sines of the last positions asked for, shared by the 2 × n_layers RoPE calls
/// of one forward pass. Computed exactly as the scalar backend computes them.
#[derive(Default)]
struct RopeTable {
    pos0: usize,
    n: usize,
    inv_freq: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    fn update(&mut self, pos0: usize, n: usize, inv_freq: &[f32]) {
        if self.pos0 == pos0 && self.n == n && self.inv_freq == inv_freq && !self.cos.is_empty() {
            return;
        }
        let half = inv_freq.len();
        if self.inv_freq.len() != half {
            self.inv_freq.resize(half, 0.0);
        }
        self.inv_freq.copy_from_slice(inv_freq);
        if self.cos.len() < n * half {
            self.cos.resize(n * half, 0.0);
            self.sin.resize(n * half, 0.0);
        }
        for t in 0..n {
            for (i, &f) in inv_freq.iter().enumerate() {
                let (cos, sin) = crate::backend::rope_angle(pos0 + t, f);
                self.cos[t * half + i] = cos;
                self.sin[t * half + i] = sin;
            }
        }
        self.pos0 = pos0;
        self.n = n;
    }
}

impl Kernels {
    /// One float-weight dot product.
    #[inline]
    pub fn dot_float(&self, dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was checked at construction; `w` is one row matching `x`.
            super::Isa::Avx2 | super::Isa::Avx512Vnni if w.len() >= x.len() * dtype.type_size() => unsafe {
                x86::dot_float(dtype, w, x)
            },
            _ => portable::dot_float(dtype, w, x),
        }
    }

    /// Float-weight product for rows `r0..r1` and tokens `t < n`.
    ///
    /// # Safety
    /// As for [`Kernels::gemm_q8`], for the rows `r0..r1`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_float(
        &self,
        w: &Matrix,
        x: &[f32],
        n: usize,
        r0: usize,
        r1: usize,
        out: OutPtr,
        ldo: usize,
    ) {
        let cols = w.cols;
        for r in r0..r1 {
            let row = w.row(r);
            for t in 0..n {
                let v = self.dot_float(w.dtype, row, &x[t * cols..(t + 1) * cols]);
                // SAFETY: the caller owns this output element.
                unsafe { *out.0.add(t * ldo + r) = v };
            }
        }
    }

    pub fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        if weight.is_empty() {
            return;
        }
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was checked at construction.
            i if i.x86_vector() => unsafe { x86::rms_norm(x, weight, eps) },
            _ => portable::rms_norm(x, weight, eps),
        }
    }

    pub fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was checked at construction.
            i if i.x86_vector() => unsafe { x86::silu_mul(gate, up) },
            _ => portable::silu_mul(gate, up),
        }
    }

    pub fn add(&self, x: &mut [f32], y: &[f32]) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was checked at construction.
            i if i.x86_vector() => unsafe { x86::add(x, y) },
            _ => {
                for (a, &b) in x.iter_mut().zip(y) {
                    *a += b;
                }
            }
        }
    }

    pub fn rope(
        &self,
        x: &mut [f32],
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
        inv_freq: &[f32],
    ) {
        let row = n_heads * head_dim;
        if row == 0 || inv_freq.len() * 2 != head_dim {
            return;
        }
        let n = x.len() / row;
        self.with_rope_table(pos0, n, inv_freq, |cos, sin| {
            self.rope_apply(x, n_heads, head_dim, cos, sin)
        })
    }

    /// `f(cos, sin)` with this thread's table of the angles of the `n` positions from
    /// `pos0` (`inv_freq.len()` a position), computed once for the 2 × n_layers RoPE calls
    /// of a forward pass; other threads may read the slices while `f` runs.
    pub fn with_rope_table<R>(
        &self,
        pos0: usize,
        n: usize,
        inv_freq: &[f32],
        f: impl FnOnce(&[f32], &[f32]) -> R,
    ) -> R {
        ROPE.with(|t| {
            let mut t = t.borrow_mut();
            t.update(pos0, n, inv_freq);
            let half = inv_freq.len();
            f(&t.cos[..n * half], &t.sin[..n * half])
        })
    }

    /// RoPE on whole token rows of `x` (`n_heads · head_dim` each) with the angles of their
    /// positions in `cos` and `sin` (`head_dim / 2` a row).
    pub fn rope_apply(
        &self,
        x: &mut [f32],
        n_heads: usize,
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
    ) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was checked at construction.
            i if i.x86_vector() => unsafe { x86::rope_apply(x, n_heads, head_dim, cos, sin) },
            _ => portable::rope_apply(x, n_heads, head_dim, cos, sin),
        }
    }
}
