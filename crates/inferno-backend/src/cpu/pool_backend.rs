//! The `pool` backend: the `simd` kernels run on a persistent [`ThreadPool`], for decode as
//! well as prefill.
//!
//! Every matmul (packed Q8_0, the other quantized types in their stored layout, float) is
//! split by 16-row groups of output rows, attention by (token, KV head) items (a batched
//! step's sequences together, in one dispatch), RMSNorm by rows, SiLU×up by 8-aligned
//! element ranges and a step's KV stores by sequence (keys and values apart), into chunks
//! the threads claim as they go (for the products and attention, [`Chunks`] that shrink at
//! the end); every output value is computed start to finish by one thread with the same
//! code and order as `simd`, so results are byte-identical to `simd` at any thread count.
//! The caller works too. The products of one input (a layer's query, key and value, or its
//! gate and up) quantize it once and go to the threads in one dispatch
//! ([`Backend::matmul_shared`]).

use super::scalar::with_quant_scratch;
use super::simd::quants::QuantMatmul;
use super::simd::{with_act_scratch, ActQ8, Kernels, OutPtr, Packed, SimdBackend, GROUP};
use super::threadpool::{default_threads, split, Chunks, ThreadPool};
use super::ScalarBackend;
use crate::{AttentionJob, AttentionShape, Backend, KvLayer, KvStore, MatmulJob};
use inferno_tensor::{q8_0, GgmlType, Matrix};

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
struct SharedMut<T>(*mut T);

// Copy for any `T` (a derive would ask `T: Copy`): only the pointer is copied.
impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}
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

    /// The `n` activation rows of `x` (`cols` long) quantized into `act` for the packed
    /// kernels, split by token rows across the threads when large (a prompt's rows).
    fn quantize_act(&self, x: &[f32], n: usize, cols: usize, act: &mut ActQ8) {
        let k = self.k;
        let nb = cols / q8_0::BLOCK;
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
    }

    /// `f(part, e0)` on parts of `x` split across the threads in whole 8-lane vectors, so
    /// every element takes the same (vector or tail) path as on one thread; `e0` is where
    /// the part starts in `x`.
    fn split_lanes(&self, x: &mut [f32], f: &(dyn Fn(&mut [f32], usize) + Sync)) {
        let len = x.len();
        let xp = SharedMut(x.as_mut_ptr());
        let units = len.div_ceil(8);
        let nc = self.chunks(units);
        self.pool.run(nc, &|c| {
            let (u0, u1) = split(units, c, nc);
            let (e0, e1) = (u0 * 8, (u1 * 8).min(len));
            if e1 > e0 {
                // SAFETY: elements e0..e1 are this thread's alone; `x` outlives the job.
                f(unsafe { xp.slice(e0, e1 - e0) }, e0);
            }
        });
    }

    /// `run(u0, u1)` over the 16-row groups `0..units` of one or more products: on the
    /// caller alone when they are few, else cut into [`Chunks`] the threads claim.
    fn run_groups(&self, units: usize, run: &(dyn Fn(usize, usize) + Sync)) {
        if units < MIN_GROUPS_TO_SPLIT {
            run(0, units);
        } else {
            let chunks = Chunks::new(units, self.pool.n_threads(), CHUNKS_PER_THREAD);
            self.pool.run(chunks.count(), &|c| {
                let (u0, u1) = chunks.range(c);
                run(u0, u1);
            });
        }
    }

    fn matmul_packed(&self, w: &Matrix, p: Packed<'_>, x: &[f32], n: usize, out: &mut [f32]) {
        let k = self.k;
        let o = OutPtr(out.as_mut_ptr());
        with_act_scratch(|act| {
            self.quantize_act(x, n, w.cols, act);
            let a = act.view(n, w.cols);
            self.run_groups(p.groups(), &|g0, g1| {
                // SAFETY: chunks take disjoint groups, hence disjoint output rows of `out`,
                // which outlives the job.
                unsafe { k.gemm_packed(p, &a, n, g0, g1, o, w.rows) };
            });
        });
    }

    /// [`Backend::matmul_shared`] where every matrix has a packed form (Q8_0, and Q4_0 …
    /// Q5_1 where packed): `x` quantized once, then the 16-row groups of all the products
    /// in one dispatch. Returns false, having done nothing, for any other matrices. Its
    /// caller has checked that there are at most [`MAX_BATCH`] and that `x` holds their
    /// `n` rows.
    ///
    /// # Safety
    /// `outs[i]` must be valid for `n × ws[i].rows` writes, apart from every other output
    /// and from `x`, and touched by no one else during the call.
    unsafe fn matmul_packed_shared(
        &self,
        ws: &[&Matrix],
        x: &[f32],
        n: usize,
        outs: &[OutPtr],
    ) -> bool {
        let k = self.k;
        let mut packed = [None; MAX_BATCH];
        let cols = ws.first().map_or(0, |w| w.cols);
        for (p, w) in packed.iter_mut().zip(ws) {
            *p = Packed::of(&k, w);
            if p.is_none() || w.cols != cols {
                return false;
            }
        }
        let mut first = [0usize; MAX_BATCH + 1];
        for (i, p) in packed.iter().take(ws.len()).enumerate() {
            first[i + 1] = first[i] + p.map_or(0, |p| p.groups());
        }
        let units = first[ws.len()];
        with_act_scratch(|act| {
            self.quantize_act(x, n, cols, act);
            let a = act.view(n, cols);
            let run = |u0: usize, u1: usize| {
                for (i, w) in ws.iter().enumerate() {
                    let (g0, g1) = (u0.max(first[i]), u1.min(first[i + 1]));
                    let Some(p) = packed[i].filter(|_| g0 < g1) else {
                        continue;
                    };
                    // SAFETY: the caller's promise for product i's outputs; within them,
                    // chunks take disjoint groups. The outputs and the scratch outlive
                    // the job.
                    unsafe {
                        k.gemm_packed(p, &a, n, g0 - first[i], g1 - first[i], outs[i], w.rows)
                    };
                }
            };
            self.run_groups(units, &run);
        });
        true
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
            self.run_groups(w.rows.div_ceil(GROUP), &|g0, g1| {
                let (r0, r1) = (g0 * GROUP, (g1 * GROUP).min(w.rows));
                // SAFETY: chunks take disjoint row ranges, hence disjoint elements of `out`,
                // which outlives the job.
                unsafe { q.rows(w, qx, n, r0, r1, o, w.rows) };
            });
        });
    }
}

impl PoolBackend {
    /// [`Backend::matmul_batch`] and [`Backend::matmul_shared`] for products that are all
    /// quantized ones on Q8_K / Q8_1 activations (K-quants packed or stored, Q4_1 and Q5_1
    /// stored, …; the legacy packed form runs product by product through
    /// [`PoolBackend::matmul`]): each input quantized once (a product with the previous
    /// one's input rows shares them), then the 16-row groups of every product's output cut
    /// into chunks for the threads in one dispatch. `job(i)` is product `i < count`: its
    /// matrix, input rows, their count and where its `n × w.rows` outputs go. Returns false,
    /// having done nothing, for any other products.
    ///
    /// # Safety
    /// Each product's outputs must be valid for writes, apart from every other product's
    /// and from the inputs, and touched by no one else during the call.
    unsafe fn matmul_jobs_quant<'w>(
        &self,
        count: usize,
        job: impl Fn(usize) -> (&'w Matrix, &'w [f32], usize, OutPtr) + Sync,
    ) -> bool {
        let mut quant = [None; MAX_BATCH];
        if count > MAX_BATCH {
            return false;
        }
        for (i, q) in quant.iter_mut().enumerate().take(count) {
            let w = job(i).0;
            if Packed::of(&self.k, w).is_some() {
                return false;
            }
            *q = QuantMatmul::new(&self.k, w);
            if q.is_none() {
                return false;
            }
        }
        let quant: [Option<QuantMatmul>; MAX_BATCH] = quant;
        let q = |i: usize| quant[i].expect("checked above");
        // Where each product's quantized input starts; the first of a run of products on one
        // input quantizes it.
        let mut offs = [0usize; MAX_BATCH];
        let mut owns = [true; MAX_BATCH];
        let mut total = 0;
        for i in 0..count {
            let ((_, x, n, _), qi) = (job(i), q(i));
            let shared = i.checked_sub(1).is_some_and(|p| {
                let ((_, px, pn, _), pq) = (job(p), q(p));
                std::ptr::eq(px.as_ptr(), x.as_ptr())
                    && pn == n
                    && pq.cols == qi.cols
                    && pq.k.activation == qi.k.activation
            });
            if shared {
                offs[i] = offs[i - 1];
                owns[i] = false;
            } else {
                offs[i] = total;
                total += n * qi.qrow;
            }
        }
        // 16-row groups of all products, numbered in product order.
        let mut first = [0usize; MAX_BATCH + 1];
        for i in 0..count {
            first[i + 1] = first[i] + job(i).0.rows.div_ceil(GROUP);
        }
        let units = first[count];
        with_quant_scratch(total, |qx| {
            for i in 0..count {
                if owns[i] {
                    let (_, x, n, _) = job(i);
                    let len = n * q(i).qrow;
                    self.quantize_rows(&q(i), x, n, &mut qx[offs[i]..offs[i] + len]);
                }
            }
            let qx: &[u8] = qx;
            let run = |u0: usize, u1: usize| {
                for i in 0..count {
                    let (g0, g1) = (u0.max(first[i]), u1.min(first[i + 1]));
                    if g0 >= g1 {
                        continue;
                    }
                    let (w, _, n, o) = job(i);
                    let r0 = (g0 - first[i]) * GROUP;
                    let r1 = ((g1 - first[i]) * GROUP).min(w.rows);
                    // SAFETY: the caller's promise for product i's outputs; within them,
                    // chunks take disjoint rows. The outputs and the scratch outlive the job.
                    unsafe { q(i).rows(w, &qx[offs[i]..], n, r0, r1, o, w.rows) };
                }
            };
            self.run_groups(units, &run);
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
                self.run_groups(w.rows.div_ceil(GROUP), &|g0, g1| {
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
        let o = OutPtr(out.as_mut_ptr());
        let job = |i: usize| {
            let j: &MatmulJob<'_> = &jobs[i];
            (j.w, j.x, j.n, o.offset(j.at))
        };
        // SAFETY: the job's output ranges were checked above to be ascending, disjoint and
        // inside `out`, which is ours alone; the inputs are shared borrows, apart from it.
        if !unsafe { self.matmul_jobs_quant(jobs.len(), job) } {
            for j in jobs {
                self.matmul(j.w, j.x, j.n, &mut out[j.at..j.at + j.out_len()]);
            }
        }
    }

    fn matmul_shared(&self, ws: &[&Matrix], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), outs.len(), "matmul_shared: one output per matrix");
        assert!(x.len() >= n * ws.iter().map(|w| w.cols).max().unwrap_or(0));
        let mut ptrs = [OutPtr(std::ptr::null_mut()); MAX_BATCH];
        for ((p, w), out) in ptrs.iter_mut().zip(ws).zip(outs.iter_mut()) {
            assert!(
                out.len() >= n * w.rows,
                "matmul_shared: an output is too short"
            );
            *p = OutPtr(out.as_mut_ptr());
        }
        let job = |i: usize| (ws[i], x, n, ptrs[i]);
        // SAFETY (both calls): each output is a distinct `&mut` slice (so apart from the
        // others and from `x`) holding its n × rows floats, checked above.
        let done = ws.len() <= MAX_BATCH
            && unsafe {
                self.matmul_packed_shared(ws, x, n, &ptrs[..ws.len()])
                    || self.matmul_jobs_quant(ws.len(), job)
            };
        if !done {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(w, x, n, out);
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
        let row = n_heads * head_dim;
        if row == 0 || inv_freq.len() * 2 != head_dim || x.len() < MIN_ELEMENTS_TO_SPLIT {
            return self.simd.rope(x, n_heads, head_dim, pos0, inv_freq);
        }
        // A prompt's rows split by token, the angles computed once on this thread.
        let (k, n, half) = (self.k, x.len() / row, head_dim / 2);
        let xp = SharedMut(x.as_mut_ptr());
        k.with_rope_table(pos0, n, inv_freq, |cos, sin| {
            let nc = self.chunks(n);
            self.pool.run(nc, &|c| {
                let (t0, t1) = split(n, c, nc);
                // SAFETY: token rows t0..t1 are this thread's alone; `x` outlives the job.
                let part = unsafe { xp.slice(t0 * row, (t1 - t0) * row) };
                let (c, s) = (&cos[t0 * half..t1 * half], &sin[t0 * half..t1 * half]);
                k.rope_apply(part, n_heads, head_dim, c, s);
            });
        })
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
            // Every `nc`-th item in order of decreasing cost: a prompt's causal triangle
            // makes its last tokens' items the dearest, and contiguous chunks of them left
            // one thread waiting on the other's last dear chunk.
            for p in (c..items).step_by(nc) {
                let i = k.attention_item_by_cost(shape, p);
                // SAFETY: each item writes only its own heads of `out`, which outlives the
                // job.
                unsafe { k.attention(shape, q, kv, o, len, i, i + 1) };
            }
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
        // Shrinking chunks, as for the products: eight streams' items cost about the same,
        // and equal chunks left a thread idle at the end of each layer's attention.
        let chunks = Chunks::new(items, threads, CHUNKS_PER_THREAD);
        self.pool.run(chunks.count(), &|c| {
            let (i0, i1) = chunks.range(c);
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

    fn store_kv(&self, parts: &mut [KvStore<'_>]) {
        let values: usize = parts.iter().map(KvStore::len).sum();
        if parts.len() < 2 || values < MIN_ELEMENTS_TO_SPLIT {
            return parts.iter_mut().for_each(KvStore::run);
        }
        let ps = SharedMut(parts.as_mut_ptr());
        self.pool.run(parts.len(), &|c| {
            // SAFETY: chunk `c` is part `c`, run by this thread alone; each part writes its
            // own rows of its own cache (a sequence's keys and values are two parts, of
            // two different buffers), and `parts` outlives the job.
            unsafe { ps.slice(c, 1)[0].run() };
        });
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        let len = gate.len().min(up.len());
        if len < MIN_ELEMENTS_TO_SPLIT {
            return self.simd.silu_mul(gate, up);
        }
        let k = self.k;
        self.split_lanes(&mut gate[..len], &|part, e0| {
            k.silu_mul(part, &up[e0..e0 + part.len()])
        });
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        let len = x.len().min(y.len());
        if len < MIN_ELEMENTS_TO_SPLIT {
            return self.simd.add(x, y);
        }
        let k = self.k;
        self.split_lanes(&mut x[..len], &|part, e0| {
            k.add(part, &y[e0..e0 + part.len()])
        });
    }
}
