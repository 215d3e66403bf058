//! The `parallel` backend: the `simd` kernels, with rayon splitting the large prompt-time
//! operations (matmuls and attention over at least [`PARALLEL_MIN_TOKENS`] tokens) across a
//! dedicated thread pool. Single-token decode steps stay on the calling thread: waking rayon's
//! sleeping workers costs about as much as a decode matvec (see the `pool` backend for that).
//!
//! Work is split by output rows and attention heads, never inside a dot product, so results
//! are identical to `simd`'s.

use super::scalar::with_quant_scratch;
use super::simd::quants::QuantMatmul;
use super::simd::{with_act_scratch, Kernels, OutPtr, Packed, SimdBackend};
use super::threadpool::default_threads;
use super::ScalarBackend;
use crate::{AttentionShape, Backend, KvLayer};
use inferno_tensor::{q8_0, GgmlType, Matrix};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Matmuls and attention calls with at least this many tokens go to rayon. Below it the
/// fork-join cost (tens of µs) is comparable to the work; measured with `inferno bench`.
pub const PARALLEL_MIN_TOKENS: usize = 4;

/// One rayon pool per thread count, kept for the life of the process. A dropped rayon pool's
/// threads exit in the background, and their exit allocates; with shared, never-dropped
/// pools no thread exits while another model is decoding.
fn shared_rayon_pool(threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.get(&threads) {
        return Some(Arc::clone(p));
    }
    // Without a private pool (thread creation failed) rayon's global pool is used.
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("inferno-rayon-{i}"))
        .build()
        .ok()?;
    // Run something on every worker now: their start-up allocates, and must not do so
    // later, during a (non-allocating) decode step.
    p.broadcast(|_| ());
    let p = Arc::new(p);
    pools.insert(threads, Arc::clone(&p));
    Some(p)
}

pub struct ParallelBackend {
    simd: SimdBackend<ScalarBackend>,
    k: Kernels,
    pool: Option<Arc<rayon::ThreadPool>>,
    threads: usize,
}

impl ParallelBackend {
    /// `threads == 0` picks [`default_threads`].
    pub fn new(simd: SimdBackend<ScalarBackend>, threads: usize) -> Self {
        let threads = if threads == 0 {
            default_threads()
        } else {
            threads
        };
        let pool = shared_rayon_pool(threads);
        let k = simd.kernels();
        Self {
            simd,
            k,
            pool,
            threads,
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Units of work per thread: enough pieces for rayon to balance uneven progress.
    fn pieces(&self, total: usize) -> usize {
        (self.threads * 4).clamp(1, total.max(1))
    }
}

impl Backend for ParallelBackend {
    fn name(&self) -> &str {
        "parallel"
    }

    fn threads(&self) -> usize {
        Self::threads(self)
    }

    fn supports(&self, dtype: GgmlType) -> bool {
        self.simd.supports(dtype)
    }

    fn prepare(&self, w: &mut Matrix) {
        self.simd.prepare(w)
    }

    fn matmul(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        if n < PARALLEL_MIN_TOKENS {
            return self.simd.matmul(w, x, n, out);
        }
        assert!(x.len() >= n * w.cols && out.len() >= n * w.rows);
        let k = self.k;
        let o = OutPtr(out.as_mut_ptr());
        if let Some(p) = Packed::of(&k, w) {
            with_act_scratch(|act| {
                act.reserve(n, w.cols);
                let (cols, nb) = (w.cols, w.cols / q8_0::BLOCK);
                self.install(|| {
                    // Quantize token rows in parallel, then split the rows of the product.
                    act.quants[..n * cols]
                        .par_chunks_mut(cols)
                        .zip(act.scales[..n * nb].par_chunks_mut(nb))
                        .zip(act.offsets[..n * nb].par_chunks_mut(nb))
                        .zip(act.sums[..n * nb].par_chunks_mut(nb))
                        .zip(x[..n * cols].par_chunks(cols))
                        .for_each(|((((q, d), s), m), xr)| k.quantize(xr, q, d, s, m));
                });
                let a = act.view(n, cols);
                let groups = p.groups();
                let pieces = self.pieces(groups);
                self.install(|| {
                    (0..pieces).into_par_iter().for_each(|i| {
                        let (g0, g1) = super::threadpool::split(groups, i, pieces);
                        // SAFETY: pieces cover disjoint groups, so disjoint output rows of
                        // `out`, which outlives the parallel loop.
                        unsafe { k.gemm_packed(p, &a, n, g0, g1, o, w.rows) };
                    })
                });
            });
            return;
        }
        if let Some(q) = QuantMatmul::new(&k, w) {
            with_quant_scratch(n * q.qrow, |qx| {
                let cols = q.cols;
                self.install(|| {
                    // Quantize token rows in parallel, then split the rows of the product.
                    qx.par_chunks_mut(q.qrow)
                        .zip(x[..n * cols].par_chunks(cols))
                        .for_each(|(qr, xr)| q.quantize_row(xr, qr));
                });
                let qx: &[u8] = qx;
                let pieces = self.pieces(w.rows);
                self.install(|| {
                    (0..pieces).into_par_iter().for_each(|i| {
                        let (r0, r1) = super::threadpool::split(w.rows, i, pieces);
                        // SAFETY: pieces cover disjoint rows of `out`, which outlives the loop.
                        unsafe { q.rows(w, qx, n, r0, r1, o, w.rows) };
                    })
                });
            });
            return;
        }
        match w.dtype {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let pieces = self.pieces(w.rows);
                self.install(|| {
                    (0..pieces).into_par_iter().for_each(|i| {
                        let (r0, r1) = super::threadpool::split(w.rows, i, pieces);
                        // SAFETY: disjoint rows of `out`, as above.
                        unsafe { k.gemm_float(w, x, n, r0, r1, o, w.rows) };
                    })
                });
            }
            _ => self.simd.matmul(w, x, n, out),
        }
    }

    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]) {
        self.simd.get_row(w, row, out)
    }

    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        self.simd.rms_norm(x, weight, eps)
    }

    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
        self.simd.rope(x, n_heads, head_dim, pos0, inv_freq)
    }

    fn attention(&self, shape: &AttentionShape, q: &[f32], kv: KvLayer<'_>, out: &mut [f32]) {
        if shape.n_tokens < PARALLEL_MIN_TOKENS {
            return self.simd.attention(shape, q, kv, out);
        }
        let k = self.k;
        let len = out.len();
        let o = OutPtr(out.as_mut_ptr());
        let items = k.attention_items(shape);
        self.install(|| {
            // One item per task: rayon balances the causal triangle (later tokens see more
            // keys) by stealing.
            (0..items).into_par_iter().for_each(|i| {
                // SAFETY: items are disjoint heads of `out`, which outlives the loop.
                unsafe { k.attention(shape, q, kv, o, len, i, i + 1) };
            })
        });
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        self.simd.silu_mul(gate, up)
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        self.simd.add(x, y)
    }
}
