//! Float operations on the host: float-weight products (F32, F16, BF16 rows against f32
//! activations) and the element-wise operations (RMSNorm, SiLU · up, add, RoPE with its
//! angle table), dispatched to `x86.rs` beside this file or the portable versions.

pub(super) mod portable;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::{Kernels, OutPtr};
use inferno_tensor::{GgmlType, Matrix};
use std::cell::RefCell;

thread_local! {
    static ROPE: RefCell<RopeTables> = RefCell::new(RopeTables::default());
}

/// Windows of positions whose angles one thread keeps: a step's sequences sit at
/// different positions, and each one's window serves its 2 × n_layers RoPE calls of this
/// step and the next ones, up to [`ROPE_WINDOW`] positions on.
const ROPE_WINDOWS: usize = 16;

/// Positions a window covers at least from the first it was computed for, so a decoding
/// sequence computes its angles once every so many steps, not once a step.
const ROPE_WINDOW: usize = 64;

/// Cosines and sines of positions `pos0 .. pos0 + n`, computed exactly as the scalar
/// backend computes them.
#[derive(Default)]
struct RopeWindow {
    pos0: usize,
    n: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    last_used: u64,
}

/// The windows of one thread, for one set of inverse frequencies (a model's).
#[derive(Default)]
struct RopeTables {
    inv_freq: Vec<f32>,
    windows: Vec<RopeWindow>,
    clock: u64,
}

impl RopeTables {
    /// The window that holds positions `pos0 .. pos0 + n`, computed into the least
    /// recently used one when none does.
    fn find(&mut self, pos0: usize, n: usize, inv_freq: &[f32]) -> &RopeWindow {
        if self.inv_freq != inv_freq || self.windows.is_empty() {
            // Every window sized for a decoding sequence at once, so a step that moves a
            // sequence past its window allocates nothing.
            self.inv_freq.clear();
            self.inv_freq.extend_from_slice(inv_freq);
            let floats = ROPE_WINDOW * inv_freq.len();
            self.windows.clear();
            self.windows.resize_with(ROPE_WINDOWS, || RopeWindow {
                cos: vec![0.0; floats],
                sin: vec![0.0; floats],
                ..RopeWindow::default()
            });
        }
        self.clock += 1;
        let held = |w: &RopeWindow| w.n > 0 && w.pos0 <= pos0 && pos0 + n <= w.pos0 + w.n;
        let i = match self.windows.iter().position(held) {
            Some(i) => i,
            None => {
                let i = (0..self.windows.len())
                    .min_by_key(|&i| self.windows[i].last_used)
                    .unwrap_or(0);
                self.windows[i].fill(pos0, n.max(ROPE_WINDOW), inv_freq);
                i
            }
        };
        let w = &mut self.windows[i];
        w.last_used = self.clock;
        w
    }
}

impl RopeWindow {
    fn fill(&mut self, pos0: usize, n: usize, inv_freq: &[f32]) {
        let half = inv_freq.len();
        if self.cos.len() < n * half {
            self.cos.resize(n * half, 0.0);
            self.sin.resize(n * half, 0.0);
        }
        for t in 0..n {
            for (i, &f) in inv_freq.iter().enumerate() {
                let (cos, sin) = crate::rope_angle(pos0 + t, f);
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
    /// `pos0` (`inv_freq.len()` a position), kept in windows of positions so each of a
    /// step's sequences computes its angles once for the 2 × n_layers RoPE calls of this
    /// step and the next few; other threads may read the slices while `f` runs.
    pub fn with_rope_table<R>(
        &self,
        pos0: usize,
        n: usize,
        inv_freq: &[f32],
        f: impl FnOnce(&[f32], &[f32]) -> R,
    ) -> R {
        ROPE.with(|t| {
            let mut t = t.borrow_mut();
            let w = t.find(pos0, n, inv_freq);
            let half = inv_freq.len();
            let at = (pos0 - w.pos0) * half..(pos0 - w.pos0 + n) * half;
            f(&w.cos[at.clone()], &w.sin[at])
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::Isa;
    use inferno_tensor::test_rng::TestRng;

    #[test]
    fn rope_windows_hold_the_angles_of_every_position_asked_for() {
        let k = Kernels::new(Isa::best());
        let inv_freq: Vec<f32> = (0..32).map(|i| 10000f32.powf(-(i as f32) / 32.0)).collect();
        let mut rng = TestRng::new(3);
        // Sequences decoding at their own positions, more of them than windows, with
        // prompts of various lengths between them.
        let mut pos: Vec<usize> = (0..ROPE_WINDOWS + 3).map(|s| 37 * s).collect();
        for _ in 0..2000 {
            let s = rng.below(pos.len());
            let n = if rng.below(10) == 0 {
                1 + rng.below(200)
            } else {
                1
            };
            k.with_rope_table(pos[s], n, &inv_freq, |cos, sin| {
                assert_eq!((cos.len(), sin.len()), (n * 32, n * 32));
                for t in 0..n {
                    for (i, &f) in inv_freq.iter().enumerate() {
                        let (c, si) = crate::rope_angle(pos[s] + t, f);
                        assert_eq!(cos[t * 32 + i].to_bits(), c.to_bits());
                        assert_eq!(sin[t * 32 + i].to_bits(), si.to_bits());
                    }
                }
            });
            pos[s] += n;
        }
        // Another model's frequencies are not served from the first one's windows.
        let other: Vec<f32> = inv_freq.iter().map(|f| f * 0.5).collect();
        k.with_rope_table(pos[0] - 1, 1, &other, |cos, _| {
            assert_eq!(cos[5], crate::rope_angle(pos[0] - 1, other[5]).0);
        });
    }
}
