//! The `pool` backend: the `simd` kernels run on a persistent [`ThreadPool`], for decode as
//! well as prefill.
//!
//! Every matmul (packed Q8_0, the other quantized types in their stored layout, float) is
//! split by 16-row groups of output rows, attention by (token, KV head) items (a batched
//! step's sequences together, in one dispatch), RMSNorm by rows and SiLU×up by 8-aligned
//! element ranges, into chunks the threads claim as they go; every output value is computed
//! start to finish by one thread with the same code and order as `simd`, so results are
//! byte-identical to `simd` at any thread count. The caller works too.

use super::scalar::with_quant_scratch;
use super::simd::quants::QuantMatmul;
use super::simd::{with_act_scratch, Kernels, OutPtr, Packed, SimdBackend, GROUP};
use super::threadpool::{default_threads, split, ThreadPool};
use super::ScalarBackend;
use crate::backend::{AttentionJob, AttentionShape, Backend, KvLayer, MatmulJob};
use crate::tensor::{q8_0, GgmlType, Matrix};

/// Products with fewer 16-row groups than this run on the caller alone (dispatch would cost
/// more than it saves).
const MIN_GROUPS_TO_SPLIT: usize = 4;
/// Chunks per thread a job is cut into.
const CHUNKS_PER_THREAD: usize = 8;
/// Element-wise operations smaller than this run on the caller alone.
const MIN_ELEMENTS_TO_SPLIT: usize = 16 * 1024;
/// Most products [`Backend::matmul_batch`] runs in one dispatch (more run one by one).
const MAX_BATCH: usize = 64;

pub struct PoolBackend {
    simd: SimdBackend<ScalarBackend>,
    k: Kernels,
    pool: ThreadPool,
}

/// A raw mutable pointer shared by the threads of one job, each touching its own part.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: used only for disjoint writes into a buffer that outlives the job.
unsafe impl<T> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// `len` elements from `start`.
    ///
    /// # Safety
    /// The range must be inside the buffer and touched by no other thread meanwhile.
    unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

impl PoolBackend {
    /// `threads == 0` picks [`default_threads`].
    pub fn new(simd: SimdBackend<ScalarBackend>, threads: usize) -> Self {
        let threads = if threads == 0 {
            default_threads()
        } else {
            threads
        };
        let k = simd.kernels();
        Self {
            simd,
            k,
            pool: ThreadPool::new(threads),
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub fn thread_pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Chunks to cut `units` of work into: several per thread, so a thread that falls behind
    /// (or is descheduled) leaves its unclaimed chunks to the others.
    fn chunks(&self, units: usize) -> usize {
        units.min(self.pool.n_threads() * CHUNKS_PER_THREAD)
    }

    fn matmul_packed(&self, w: &Matrix, p: Packed<'_>, x: &[f32], n: usize, out: &mut [f32]) {
        let k = self.k;
        let cols = w.cols;
        let nb = cols / q8_0::BLOCK;
        let o = OutPtr(out.as_mut_ptr());
        with_act_scratch(|act| {
            act.reserve(n, cols);
            if n * cols >= MIN_ELEMENTS_TO_SPLIT && n > 1 {
                let (q, d, s, m) = (
                    SharedMut(act.quants.as_mut_ptr()),
                    SharedMut(act.scales.as_mut_ptr()),
                    SharedMut(act.offsets.as_mut_ptr()),
                    SharedMut(act.sums.as_mut_ptr()),
                );
                let nc = self.chunks(n);
                self.pool.run(nc, &|c| {
                    let (t0, t1) = split(n, c, nc);
                    // SAFETY: token rows t0..t1 of the scratch are this thread's alone, and
                    // the scratch (reserved above) outlives the job.
                    let (q, d, s, m) = unsafe {
                        (
                            q.slice(t0 * cols, (t1 - t0) * cols),
                            d.slice(t0 * nb, (t1 - t0) * nb),
                            s.slice(t0 * nb, (t1 - t0) * nb),
                            m.slice(t0 * nb, (t1 - t0) * nb),
                        )
                    };
                    k.quantize(&x[t0 * cols..t1 * cols], q, d, s, m);
                });
            } else {
                k.quantize_into(x, n, cols, act);
            }
            let a = act.view(n, cols);
            let groups = p.groups();
            if groups < MIN_GROUPS_TO_SPLIT {
                // SAFETY: `out` holds n × rows floats and is ours alone.
                unsafe { k.gemm_packed(p, &a, n, 0, groups, o, w.rows) };
                return;
            }
            let nc = self.chunks(groups);
            self.pool.run(nc, &|c| {
                let (g0, g1) = split(groups, c, nc);
                // SAFETY: threads take disjoint groups, hence disjoint output rows of `out`,
                // which outlives the job.
                unsafe { k.gemm_packed(p, &a, n, g0, g1, o, w.rows) };
            });
        });
    }
}

impl PoolBackend {
    /// The `n` activation rows of `x` quantized for `q` into `qx`, split by token rows
    /// across the threads when large (a prompt's rows).
    fn quantize_rows(&self, q: &QuantMatmul, x: &[f32], n: usize, qx: &mut [u8]) {
        let (cols, qrow) = (q.cols, q.qrow);
        assert!(x.len() >= n * cols && qx.len() >= n * qrow);
        if n > 1 && n * cols >= MIN_ELEMENTS_TO_SPLIT {
            let qp = SharedMut(qx.as_mut_ptr());
            let nc = self.chunks(n);
            self.pool.run(nc, &|c| {
                let (t0, t1) = split(n, c, nc);
                // SAFETY: token rows t0..t1 of `qx` (inside it, checked above) are this chunk's
                // alone, and `qx` outlives the job.
                let part = unsafe { qp.slice(t0 * qrow, (t1 - t0) * qrow) };
                q.quantize(&x[t0 * cols..t1 * cols], part);
            });
        } else {
            q.quantize(&x[..n * cols], &mut qx[..n * qrow]);
        }
    }

    /// A quantized matrix in its stored layout: the activation rows are quantized once (split
    /// by token rows when large), then 16-row groups of output rows are claimed by the
    /// threads, each computing its rows for every token.
    fn matmul_quant(&self, q: &QuantMatmul, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        let o = OutPtr(out.as_mut_ptr());
        with_quant_scratch(n * q.qrow, |qx| {
            self.quantize_rows(q, x, n, qx);
            let qx: &[u8] = qx;
            let groups = w.rows.div_ceil(GROUP);
            if groups < MIN_GROUPS_TO_SPLIT {
                // SAFETY: `out` holds n × rows floats and is ours alone.
                unsafe { q.rows(w, qx, n, 0, w.rows, o, w.rows) };
                return;
            }
            let nc = self.chunks(groups);
            self.pool.run(nc, &|c| {
                let (g0, g1) = split(groups, c, nc);
                let (r0, r1) = (g0 * GROUP, (g1 * GROUP).min(w.rows));
                // SAFETY: chunks take disjoint row ranges, hence disjoint elements of `out`,
                // which outlives the job.
                unsafe { q.rows(w, qx, n, r0, r1, o, w.rows) };
            });
        });
    }
}

impl PoolBackend {
    /// [`Backend::matmul_batch`] for jobs that are all quantized products on Q8_K / Q8_1
    /// activations (K-quants packed or stored, Q4_1 and Q5_1 stored, …; the legacy packed
    /// form runs job by job through [`PoolBackend::matmul`]): each job's input quantized
    /// once (a job with the previous job's input shares it), then the 16-row groups of
    /// every job's output cut into chunks for the threads in one dispatch. Returns false,
    /// having done nothing, for any other jobs.
    fn matmul_batch_quant(&self, jobs: &[MatmulJob<'_>], out: &mut [f32]) -> bool {
        let mut quant = [None; MAX_BATCH];
        if jobs.len() > MAX_BATCH {
            return false;
        }
        for (j, q) in jobs.iter().zip(quant.iter_mut()) {
            if Packed::of(&self.k, j.w).is_some() {
                return false;
            }
            *q = QuantMatmul::new(&self.k, j.w);
            if q.is_none() {
                return false;
            }
        }
        let quant: [Option<QuantMatmul>; MAX_BATCH] = quant;
        let q = |i: usize| quant[i].expect("checked above");
        // Where each job's quantized input starts; the first of a run of jobs on one input
        // quantizes it.
        let mut offs = [0usize; MAX_BATCH];
        let mut owns = [true; MAX_BATCH];
        let mut total = 0;
        for (i, j) in jobs.iter().enumerate() {
            let (qi, prev) = (q(i), i.checked_sub(1).map(|p| (&jobs[p], q(p))));
            let shared = prev.is_some_and(|(pj, pq)| {
                std::ptr::eq(pj.x.as_ptr(), j.x.as_ptr())
                    && pj.n == j.n
                    && pq.cols == qi.cols
                    && pq.k.activation == qi.k.activation
            });
            if shared {
                offs[i] = offs[i - 1];
                owns[i] = false;
            } else {
                offs[i] = total;
                total += j.n * qi.qrow;
            }
        }
        // 16-row groups of all jobs, numbered in job order.
        let mut first = [0usize; MAX_BATCH + 1];
        for (i, j) in jobs.iter().enumerate() {
            first[i + 1] = first[i] + j.w.rows.div_ceil(GROUP);
        }
        let units = first[jobs.len()];
        let o = OutPtr(out.as_mut_ptr());
        with_quant_scratch(total, |qx| {
            for (i, j) in jobs.iter().enumerate() {
                if owns[i] {
                    let len = j.n * q(i).qrow;
                    self.quantize_rows(&q(i), j.x, j.n, &mut qx[offs[i]..offs[i] + len]);
                }
            }
            let qx: &[u8] = qx;
            let run = |u0: usize, u1: usize| {
                // Captured whole (Send + Sync), not as its raw pointer field.
                let o: OutPtr = o;
                for (i, j) in jobs.iter().enumerate() {
                    let (g0, g1) = (u0.max(first[i]), u1.min(first[i + 1]));
                    if g0 >= g1 {
                        continue;
                    }
                    let r0 = (g0 - first[i]) * GROUP;
                    let r1 = ((g1 - first[i]) * GROUP).min(j.w.rows);
                    // SAFETY: the caller checked that job i's output range lies inside `out`
                    // and apart from every other job's; within it, chunks take disjoint
                    // rows. `out` and the scratch outlive the job.
                    unsafe {
                        q(i).rows(
                            j.w,
                            &qx[offs[i]..],
                            j.n,
                            r0,
                            r1,
                            OutPtr(o.0.add(j.at)),
                            j.w.rows,
                        )
                    };
                }
            };
            if units < MIN_GROUPS_TO_SPLIT {
                run(0, units);
            } else {
                let nc = self.chunks(units);
                self.pool.run(nc, &|c| {
                    let (u0, u1) = split(units, c, nc);
                    run(u0, u1);
                });
            }
        });
        true
    }
}

thread_local! {
    /// Partial softmaxes of a split attention call, grown to the largest call and reused.
    static SPLIT_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Backend for PoolBackend {
    fn name(&self) -> &str {
        "pool"
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
        assert!(x.len() >= n * w.cols && out.len() >= n * w.rows);
        if let Some(p) = Packed::of(&self.k, w) {
            return self.matmul_packed(w, p, x, n, out);
        }
        if let Some(q) = QuantMatmul::new(&self.k, w) {
            return self.matmul_quant(&q, w, x, n, out);
        }
        match w.dtype {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let k = self.k;
                let o = OutPtr(out.as_mut_ptr());
                let nc = self.chunks(w.rows.div_ceil(GROUP));
                self.pool.run(nc, &|c| {
                    let (g0, g1) = split(w.rows.div_ceil(GROUP), c, nc);
                    let (r0, r1) = (g0 * GROUP, (g1 * GROUP).min(w.rows));
                    // SAFETY: disjoint rows of `out`, which outlives the job.
                    unsafe { k.gemm_float(w, x, n, r0, r1, o, w.rows) };
                });
            }
            _ => self.simd.matmul(w, x, n, out),
        }
    }

    fn matmul_batch(&self, jobs: &[MatmulJob<'_>], out: &mut [f32]) {
        // Ascending, disjoint, in-bounds output ranges and long enough inputs: what makes
        // the threads' writes disjoint.
        let mut end = 0;
        for j in jobs {
            assert!(
                j.at >= end && j.x.len() >= j.n * j.w.cols,
                "matmul_batch: a job overlaps the one before it or lacks input rows"
            );
            end = j.at + j.out_len();
        }
        assert!(end <= out.len(), "matmul_batch: the output is too short");
        if !self.matmul_batch_quant(jobs, out) {
            for j in jobs {
                self.matmul(j.w, j.x, j.n, &mut out[j.at..j.at + j.out_len()]);
            }
        }
    }

    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]) {
        self.simd.get_row(w, row, out)
    }

    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        let dim = weight.len();
        if dim == 0 || x.len() < MIN_ELEMENTS_TO_SPLIT || x.len() / dim < 2 {
            return self.simd.rms_norm(x, weight, eps);
        }
        let rows = x.len() / dim;
        let k = self.k;
        let xp = SharedMut(x.as_mut_ptr());
        let nc = self.chunks(rows);
        self.pool.run(nc, &|c| {
            let (r0, r1) = split(rows, c, nc);
            // SAFETY: rows r0..r1 are this thread's alone; `x` outlives the job.
            let part = unsafe { xp.slice(r0 * dim, (r1 - r0) * dim) };
            k.rms_norm(part, weight, eps);
        });
    }

    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
        self.simd.rope(x, n_heads, head_dim, pos0, inv_freq)
    }

    fn attention(&self, shape: &AttentionShape, q: &[f32], kv: KvLayer<'_>, out: &mut [f32]) {
        let k = self.k;
        let len = out.len();
        let o = OutPtr(out.as_mut_ptr());
        let items = k.attention_items(shape);
        let parts = k.attention_parts(shape);
        let threads = self.pool.n_threads();
        if parts > 1 && threads > 1 && items < 2 * threads {
            // Too few KV heads to keep the threads busy: split each head's positions too.
            // The partial softmaxes are folded in partition order, the bits of one thread.
            let per = k.attention_part_floats(shape);
            let split_items = shape.n_kv_heads * parts;
            return SPLIT_SCRATCH.with(|c| {
                let mut scratch = c.borrow_mut();
                if scratch.len() < split_items * per {
                    scratch.resize(split_items * per, 0.0);
                }
                let sp = OutPtr(scratch.as_mut_ptr());
                let nc = self.chunks(split_items);
                self.pool.run(nc, &|c| {
                    let (i0, i1) = split(split_items, c, nc);
                    // SAFETY: items write only their own part of the scratch, which
                    // outlives the job.
                    unsafe { k.attention_partial(shape, q, kv, sp, i0, i1) };
                });
                let heads = shape.n_kv_heads;
                let nc = self.chunks(heads);
                self.pool.run(nc, &|c| {
                    let range = split(heads, c, nc);
                    // SAFETY: every item was written above; each KV head's output rows are
                    // this chunk's alone, and `out` outlives the job.
                    unsafe { k.attention_merge(shape, q, kv, sp, o, len, range) };
                });
            });
        }
        let nc = self.chunks(items);
        self.pool.run(nc, &|c| {
            let (i0, i1) = split(items, c, nc);
            // SAFETY: each item writes only its own heads of `out`, which outlives the job.
            unsafe { k.attention(shape, q, kv, o, len, i0, i1) };
        });
    }

    fn attention_batch(&self, jobs: &[AttentionJob<'_>], out: &mut [f32]) {
        let k = self.k;
        let threads = self.pool.n_threads();
        // A sequence with fewer work items than threads and a history long enough to split
        // (one decoding on a model with few KV heads) keeps its own dispatch, which splits
        // its positions over the threads; the rest share one dispatch out by item, instead
        // of one dispatch per sequence (eight decoding streams: a token's attention each).
        let shared = |j: &AttentionJob<'_>| {
            k.attention_items(&j.shape) >= threads || k.attention_parts(&j.shape) <= 1
        };
        let together = threads > 1 && jobs.iter().filter(|j| shared(j)).count() > 1;
        for j in jobs {
            // Alone: its own dispatch (or none to share one with), as `attention` runs it.
            if !(together && shared(j)) {
                let o = &mut out[j.at..j.at + j.out_len()];
                self.attention(&j.shape, j.q, j.kv, o);
            }
        }
        if !together {
            return;
        }
        let mut items = 0;
        for j in jobs.iter().filter(|j| shared(j)) {
            assert!(
                j.at + j.out_len() <= out.len(),
                "attention job past the output"
            );
            items += k.attention_items(&j.shape);
        }
        let o = OutPtr(out.as_mut_ptr());
        let nc = self.chunks(items);
        self.pool.run(nc, &|c| {
            let (i0, i1) = split(items, c, nc);
            let mut first = 0;
            for j in jobs.iter().filter(|j| shared(j)) {
                let n = k.attention_items(&j.shape);
                let (lo, hi) = (i0.max(first), i1.min(first + n));
                if lo < hi {
                    // SAFETY: each item writes only its own heads of its job's rows, which
                    // lie inside `out` (checked above) and no other job's; `out` outlives
                    // the job. Items are computed alone, so any split gives their bits.
                    unsafe {
                        let at = o.offset(j.at);
                        k.attention(&j.shape, j.q, j.kv, at, j.out_len(), lo - first, hi - first)
                    };
                }
                first += n;
                if first >= i1 {
                    break;
                }
            }
        });
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        let len = gate.len().min(up.len());
        if len < MIN_ELEMENTS_TO_SPLIT {
            return self.simd.silu_mul(gate, up);
        }
        let k = self.k;
        let g = SharedMut(gate.as_mut_ptr());
        // Split in whole 8-lane vectors so every element takes the same (vector or tail)
        // path as on one thread.
        let units = len.div_ceil(8);
        let nc = self.chunks(units);
        self.pool.run(nc, &|c| {
            let (u0, u1) = split(units, c, nc);
            let (e0, e1) = (u0 * 8, (u1 * 8).min(len));
            if e1 > e0 {
                // SAFETY: elements e0..e1 are this thread's alone; `gate` outlives the job.
                let part = unsafe { g.slice(e0, e1 - e0) };
                k.silu_mul(part, &up[e0..e1]);
            }
        });
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        self.simd.add(x, y)
    }
}
