//! The compute backends. A model's forward pass is written once against the [`exec`]
//! interface and runs on a [`Device`]: the host CPU's kernels ([`cpu`]: the [`Backend`]
//! kernel sets `scalar` at the base, `simd` over it, `parallel` and `pool` spreading it over
//! threads, run op by op by the host executor), or the [`gpu`], whose executor records a
//! whole step into one command buffer. The [`factory`] builds a device from its name.
//!
//! This module holds the interfaces only (the executor, the device, the kernel trait, KV
//! cache types); `cpu/` and `gpu/` depend on them and never on each other. A KV cache in
//! device memory is the device's own ([`DeviceKv`]), so the cache types know no device.
//!
//! Operations write into buffers allocated once per sequence, and weights stay in their
//! stored layout ([`Matrix`]), so a decode step allocates nothing. Nothing here knows a model
//! architecture.

pub mod cpu;
pub mod device;
pub mod exec;
pub mod factory;
pub mod gpu;
pub mod kv_cache;

pub use cpu::{ParallelBackend, PoolBackend, ScalarBackend, SimdBackend};
pub use device::{Device, DeviceError, Scratch};
pub use exec::{Buf, Executor, Logits, Op, ScratchSpec, SeqStep, LOGITS};
pub use factory::{create_backend, BackendOptions, BACKEND_NAMES};
pub use kv_cache::{DeviceKv, KvCache, KvLayer, KvRows, KvShape, KvStore, KvType, KV_TYPE_NAMES};

use inferno_tensor::{GgmlType, Matrix};

/// The RoPE rotation for position `pos` at inverse frequency `inv_freq`, `(cos, sin)`: the
/// angle is formed in f32 like the reference implementation, its cosine and sine in f64.
/// Every backend rotates by these values.
pub fn rope_angle(pos: usize, inv_freq: f32) -> (f32, f32) {
    let angle = (pos as f32 * inv_freq) as f64;
    (angle.cos() as f32, angle.sin() as f32)
}

/// Shape of one attention call: `n_tokens` queries at absolute positions
/// `pos0 .. pos0 + n_tokens`, each attending causally to cache positions `0 ..= its own`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_tokens: usize,
    pub pos0: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions the cache holds per KV head (its stride between heads, in rows).
    pub capacity: usize,
    pub scale: f32,
}

/// One sequence's attention in [`Backend::attention_batch`]: its shape, its query rows, its
/// cache layer, and the float of the batch's output where its rows start.
#[derive(Clone, Copy)]
pub struct AttentionJob<'a> {
    pub shape: AttentionShape,
    pub q: &'a [f32],
    pub kv: KvLayer<'a>,
    pub at: usize,
}

impl AttentionJob<'_> {
    /// Floats of output the job writes (as many as its queries).
    pub fn out_len(&self) -> usize {
        self.shape.n_tokens * self.shape.n_heads * self.shape.head_dim
    }
}

/// One product of [`Backend::matmul_batch`]: `n` rows of `x` times `w`, written row-major
/// (`n × w.rows`) from float `at` of the batch's output.
#[derive(Clone, Copy)]
pub struct MatmulJob<'a> {
    pub w: &'a Matrix,
    pub x: &'a [f32],
    pub n: usize,
    pub at: usize,
}

impl MatmulJob<'_> {
    /// Floats of output the job writes.
    pub fn out_len(&self) -> usize {
        self.n * self.w.rows
    }
}

/// A set of kernels. Every slice argument is sized by the caller; shapes are validated when
/// the model is loaded, so implementations may index without re-checking.
pub trait Backend: Send + Sync {
    fn name(&self) -> &str;

    /// Threads the kernels run on.
    fn threads(&self) -> usize {
        1
    }

    /// Whether `matmul` and `get_row` accept matrices of this type.
    fn supports(&self, dtype: GgmlType) -> bool;

    /// Called once per weight matrix at load: a backend may attach a repacked copy of the
    /// weights to `w.prepared` for its kernels. The default keeps the stored layout.
    fn prepare(&self, _w: &mut Matrix) {}

    /// `out[t][r] = Σ_c x[t][c] · w[r][c]` for `t < n`: `x` is `n × w.cols`, `out` is
    /// `n × w.rows`, both row-major.
    fn matmul(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]);

    /// Several independent products as one piece of work (the experts of a decode step):
    /// a multi-threaded backend hands all their rows to its threads at once instead of
    /// waking them once per product. Jobs write ascending, disjoint ranges of `out`; each
    /// output equals [`Backend::matmul`]'s.
    fn matmul_batch(&self, jobs: &[MatmulJob<'_>], out: &mut [f32]) {
        for j in jobs {
            self.matmul(j.w, j.x, j.n, &mut out[j.at..j.at + j.out_len()]);
        }
    }

    /// Products of several matrices with the same `n` input rows (a layer's query, key and
    /// value projections): `outs[i] = ws[i] · x`, each `n × ws[i].rows`. A backend that
    /// quantizes its activations quantizes `x` once for all of them, and a multi-threaded one
    /// hands all their rows to its threads at once. Each output equals [`Backend::matmul`]'s.
    fn matmul_shared(&self, ws: &[&Matrix], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), outs.len(), "matmul_shared: one output per matrix");
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, n, out);
        }
    }

    /// Row `row` of `w` as f32 (the token-embedding lookup).
    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]);

    /// RMSNorm of each `weight.len()`-long row of `x`, in place: `x / sqrt(mean(x²) + eps) * weight`.
    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32);

    /// Rotary position embedding in the NEOX (half-split) layout, in place. `x` is
    /// `n_tokens × n_heads × head_dim`; token `t` sits at position `pos0 + t`;
    /// `inv_freq` has `head_dim / 2` entries.
    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]);

    /// Causal grouped-query attention over one layer of a KV cache, rows laid out
    /// `[n_kv_heads][capacity]`. `q` and `out` are `n_tokens × n_heads × head_dim`.
    fn attention(&self, shape: &AttentionShape, q: &[f32], kv: KvLayer<'_>, out: &mut [f32]);

    /// The attention of several sequences of one step, each job's output at `out[job.at..]`,
    /// every job's result that of [`Backend::attention`] bit for bit. A backend that can
    /// share one dispatch out among all the sequences' work items overrides it: a batched
    /// decode step has one token per sequence, too little work to pay a dispatch each.
    fn attention_batch(&self, jobs: &[AttentionJob<'_>], out: &mut [f32]) {
        for j in jobs {
            self.attention(&j.shape, j.q, j.kv, &mut out[j.at..j.at + j.out_len()]);
        }
    }

    /// Writes the new keys and values of a step's sequences into their caches. A backend
    /// with threads overrides it to run the parts on them: converting eight streams' rows
    /// to F16 (and the misses of writing them) on one thread left the others idle.
    fn store_kv(&self, parts: &mut [KvStore<'_>]) {
        for p in parts {
            p.run();
        }
    }

    /// `gate = silu(gate) * up`, element-wise (the SwiGLU gate).
    fn silu_mul(&self, gate: &mut [f32], up: &[f32]);

    /// `x += y`, element-wise.
    fn add(&self, x: &mut [f32], y: &[f32]);

    /// Adds `bias` to every `bias.len()`-long row of `x`.
    fn add_bias(&self, x: &mut [f32], bias: &[f32]) {
        for row in x.chunks_exact_mut(bias.len()) {
            self.add(row, bias);
        }
    }
}

/// Lets a boxed stack be decorated like a concrete backend.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn supports(&self, dtype: GgmlType) -> bool {
        (**self).supports(dtype)
    }
    fn prepare(&self, w: &mut Matrix) {
        (**self).prepare(w)
    }
    fn matmul(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        (**self).matmul(w, x, n, out)
    }
    fn matmul_batch(&self, jobs: &[MatmulJob<'_>], out: &mut [f32]) {
        (**self).matmul_batch(jobs, out)
    }
    fn matmul_shared(&self, ws: &[&Matrix], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        (**self).matmul_shared(ws, x, n, outs)
    }
    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]) {
        (**self).get_row(w, row, out)
    }
    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        (**self).rms_norm(x, weight, eps)
    }
    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
        (**self).rope(x, n_heads, head_dim, pos0, inv_freq)
    }
    fn attention(&self, shape: &AttentionShape, q: &[f32], kv: KvLayer<'_>, out: &mut [f32]) {
        (**self).attention(shape, q, kv, out)
    }
    fn attention_batch(&self, jobs: &[AttentionJob<'_>], out: &mut [f32]) {
        (**self).attention_batch(jobs, out)
    }
    fn store_kv(&self, parts: &mut [KvStore<'_>]) {
        (**self).store_kv(parts)
    }
    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        (**self).silu_mul(gate, up)
    }
    fn add(&self, x: &mut [f32], y: &[f32]) {
        (**self).add(x, y)
    }
    fn add_bias(&self, x: &mut [f32], bias: &[f32]) {
        (**self).add_bias(x, bias)
    }
    fn threads(&self) -> usize {
        (**self).threads()
    }
}
