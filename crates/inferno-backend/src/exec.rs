//! The interface a model's forward pass is written against: an [`Executor`] runs (or
//! records) [`Op`]s on a step's activation buffers, for every sequence of the step at once.
//!
//! A model describes a step once, as a sequence of operations on numbered buffers ([`Buf`])
//! and weights ([`Matrix`], [`Vector`]); the host executor runs each operation with the CPU
//! kernels as it arrives, the GPU executor records it into the step's command buffer. Nothing
//! here knows an architecture: the operations are those of decoder transformers in general,
//! and the model names and sizes its buffers ([`ScratchSpec`]).
//!
//! Per-sequence work (positions for RoPE, the KV store, attention over each sequence's own
//! cache, which rows' logits are wanted) is the executor's: it holds the step's
//! [`SeqStep`]s, so the model never loops over sequences.

use super::kv_cache::KvCache;
use inferno_tensor::{Matrix, Vector};
use tracing::trace_span;

/// One of the step's activation buffers, numbered by the model (`0..`) in the order of
/// [`ScratchSpec::widths`]. [`LOGITS`] addresses the logits rows of the current block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Buf(pub usize);

/// The rows of logits being produced (see [`Executor::logit_block`]).
pub const LOGITS: Buf = Buf(usize::MAX);

/// The activation buffers a model's forward pass uses.
#[derive(Clone, Debug)]
pub struct ScratchSpec {
    /// Floats per token row of each buffer, indexed by [`Buf`].
    pub widths: Vec<usize>,
    /// Token rows one forward pass may hold.
    pub rows: usize,
    /// Rows of logits (from several sequences) one block may gather; 0 makes every
    /// sequence's logits a block of its own, written straight to its buffer.
    pub logit_rows: usize,
    /// Values in one row of logits.
    pub vocab: usize,
    /// The RoPE head size (the angle table's width).
    pub head_dim: usize,
    /// Experts of a mixture-of-experts MLP and how many each row uses (0 for dense models):
    /// the host sizes its routing tables by them.
    pub experts: usize,
    pub experts_used: usize,
    /// Rows of one expert's gate and up projections and of its down projection (0 for dense
    /// models): the GPU keeps every routed row's products at once, `rows × experts_used` of
    /// each.
    pub expert_ffn: usize,
    pub expert_out: usize,
}

/// Which logits a forward call produces.
pub enum Logits<'a> {
    /// None: the call only fills the KV cache.
    None,
    /// The last token's logits (`vocab` values).
    Last(&'a mut [f32]),
    /// Every token's logits, row-major (`n_tokens × vocab` values).
    All(&'a mut [f32]),
}

impl Logits<'_> {
    /// Rows of logits wanted for `n` tokens.
    pub fn rows(&self, n: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last(_) => 1,
            Logits::All(_) => n,
        }
    }

    /// The buffer the logits go to (empty for [`Logits::None`]).
    pub fn buffer(&mut self) -> &mut [f32] {
        match self {
            Logits::None => &mut [],
            Logits::Last(o) | Logits::All(o) => o,
        }
    }
}

/// One sequence's part of a batched forward pass: its new tokens, run at the cache's next
/// positions and appended to it.
pub struct SeqStep<'a> {
    pub kv: &'a mut KvCache,
    pub tokens: &'a [u32],
    pub logits: Logits<'a>,
}

/// Empties a list of steps and gives its allocation back for steps of another lifetime, so
/// a per-step list is not reallocated every step (the collect reuses the buffer in place).
// The `filter_map` changes the item type (its lifetime), which `filter` cannot.
#[allow(clippy::unnecessary_filter_map)]
pub fn recycle<'b>(mut v: Vec<SeqStep<'_>>) -> Vec<SeqStep<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// The step's rows whose logits are wanted, in order: each sequence's last `rows` rows.
pub(crate) fn wanted_rows<'s, 'a>(
    seqs: &'s [SeqStep<'a>],
) -> impl Iterator<Item = usize> + use<'s, 'a> {
    let mut r0 = 0;
    seqs.iter().flat_map(move |s| {
        let n = s.tokens.len();
        let first = r0 + n - s.logits.rows(n);
        r0 += n;
        first..r0
    })
}

/// Each sequence of the step with the step row its first new token sits at.
pub(crate) fn with_first_rows<'s, 'a>(
    seqs: &'s [SeqStep<'a>],
) -> impl Iterator<Item = (usize, &'s SeqStep<'a>)> + use<'s, 'a> {
    seqs.iter().scan(0, |r0, s| {
        let first = *r0;
        *r0 += s.tokens.len();
        Some((first, s))
    })
}

/// A mixture of SwiGLU experts over `rows` rows ([`Op::MoeFfn`]): row `t`'s `router` logits
/// (one per expert) go through a softmax; the `used` most probable experts (among exactly
/// equal probabilities the lower index: `torch.topk` leaves that order unspecified, and on the
/// CPU does not take the lowest) each compute `down · (SiLU(gate · x[t]) ⊙ up · x[t])`;
/// `out[t]` is their sum in expert order, each scaled by its probability (divided by the sum
/// of the chosen probabilities when `normalize`). The rows routed to one expert are gathered
/// into `xs` and multiplied together, so an active expert's weights are read once per step
/// and an unused expert's not at all; `g`, `u` hold their gate and up rows, `ys` their
/// outputs. (The GPU executor routes on the device, leaving the probabilities in `router`,
/// and keeps every routed row's products in buffers of its own, sized by [`ScratchSpec`].)
#[derive(Clone, Copy)]
pub struct MoeFfn<'a> {
    pub router: Buf,
    pub x: Buf,
    pub out: Buf,
    pub rows: usize,
    pub gate: &'a [Matrix],
    pub up: &'a [Matrix],
    pub down: &'a [Matrix],
    pub used: usize,
    pub normalize: bool,
    pub xs: Buf,
    pub g: Buf,
    pub u: Buf,
    pub ys: Buf,
}

/// One operation of a forward pass over the step's `rows` token rows (a buffer's row `t`
/// belongs to the step's `t`-th token, sequences in order).
#[derive(Clone, Copy)]
pub enum Op<'a> {
    /// Row `t` of `out` = row `token[t]` of `table`, as f32.
    Embed { table: &'a Matrix, out: Buf },
    /// `dst = src / sqrt(mean(src²) + eps) ⊙ gain` for `rows` rows of `gain.len()` values
    /// (`src == dst` normalizes in place).
    RmsNorm {
        src: Buf,
        dst: Buf,
        rows: usize,
        gain: &'a Vector,
        eps: f32,
    },
    /// `out[t] = w · x[t]` for `rows` rows.
    MatMul {
        w: &'a Matrix,
        x: Buf,
        rows: usize,
        out: Buf,
    },
    /// `out_i[t] = w_i · x[t]` for `rows` rows and each `(w_i, out_i)` of `products`: the
    /// products of one input (a layer's query, key and value projections), which a backend
    /// may quantize once and dispatch together ([`crate::Backend::matmul_shared`]).
    /// The outputs are distinct buffers, none of them `x`.
    MatMulShared {
        x: Buf,
        rows: usize,
        products: &'a [(&'a Matrix, Buf)],
    },
    /// `x[t] += bias` for `rows` rows.
    AddBias {
        x: Buf,
        rows: usize,
        bias: &'a Vector,
    },
    /// Rotary position embedding (NEOX half-split layout) of each row's `n_heads` heads, at
    /// the row's position in its sequence.
    Rope {
        x: Buf,
        n_heads: usize,
        head_dim: usize,
        inv_freq: &'a [f32],
    },
    /// Writes each sequence's rows of `k` and `v` into layer `layer` of its cache, at its
    /// next positions.
    StoreKv { layer: usize, k: Buf, v: Buf },
    /// Causal grouped-query attention of each sequence's rows of `q` over layer `layer` of
    /// its cache (the rows just stored included), into `out`.
    Attention {
        layer: usize,
        q: Buf,
        out: Buf,
        n_heads: usize,
        scale: f32,
    },
    /// `gate = silu(gate) ⊙ up` for `rows` rows.
    SiluMul { gate: Buf, up: Buf, rows: usize },
    /// `x += y` for `rows` rows.
    Add { x: Buf, y: Buf, rows: usize },
    /// A mixture-of-experts MLP (see [`MoeFfn`]).
    MoeFfn(MoeFfn<'a>),
    /// Rows `first .. first + count` of the step's wanted-logits rows, copied from `src` to
    /// rows `0 .. count` of `dst`.
    GatherWanted {
        src: Buf,
        dst: Buf,
        first: usize,
        count: usize,
    },
}

/// Runs one step's operations. Shapes were checked when the model was loaded and the step
/// was planned, so operations do not fail one by one: an executor that meets a problem
/// (a device error) keeps it and reports it when the step ends.
pub trait Executor {
    /// Token rows in this step.
    fn rows(&self) -> usize;

    fn run(&mut self, op: Op<'_>);

    /// Delivers the logits of the block in progress, if any, and starts the block of wanted
    /// rows from `first` (in step order): returns its row count, or `None` when `first` is
    /// past the last wanted row. [`LOGITS`] holds the block's rows until the next call.
    fn logit_block(&mut self, first: usize) -> Option<usize>;

    fn embed(&mut self, table: &Matrix, out: Buf) {
        self.run(Op::Embed { table, out })
    }
    fn rms_norm(&mut self, src: Buf, dst: Buf, rows: usize, gain: &Vector, eps: f32) {
        self.run(Op::RmsNorm {
            src,
            dst,
            rows,
            gain,
            eps,
        })
    }
    fn matmul(&mut self, w: &Matrix, x: Buf, rows: usize, out: Buf) {
        self.run(Op::MatMul { w, x, rows, out })
    }
    fn matmul_shared(&mut self, x: Buf, rows: usize, products: &[(&Matrix, Buf)]) {
        self.run(Op::MatMulShared { x, rows, products })
    }
    fn add_bias(&mut self, x: Buf, rows: usize, bias: &Vector) {
        self.run(Op::AddBias { x, rows, bias })
    }
    fn rope(&mut self, x: Buf, n_heads: usize, head_dim: usize, inv_freq: &[f32]) {
        self.run(Op::Rope {
            x,
            n_heads,
            head_dim,
            inv_freq,
        })
    }
    fn store_kv(&mut self, layer: usize, k: Buf, v: Buf) {
        self.run(Op::StoreKv { layer, k, v })
    }
    fn attention(&mut self, layer: usize, q: Buf, out: Buf, n_heads: usize, scale: f32) {
        self.run(Op::Attention {
            layer,
            q,
            out,
            n_heads,
            scale,
        })
    }
    fn silu_mul(&mut self, gate: Buf, up: Buf, rows: usize) {
        self.run(Op::SiluMul { gate, up, rows })
    }
    fn add(&mut self, x: Buf, y: Buf, rows: usize) {
        self.run(Op::Add { x, y, rows })
    }
    fn moe_ffn(&mut self, op: MoeFfn<'_>) {
        self.run(Op::MoeFfn(op))
    }
    fn gather_wanted(&mut self, src: Buf, dst: Buf, first: usize, count: usize) {
        self.run(Op::GatherWanted {
            src,
            dst,
            first,
            count,
        })
    }
}

/// Wraps any executor in a TRACE-level span per operation (one atomic load each when the
/// level is filtered out).
pub struct Traced<'e>(pub &'e mut dyn Executor);

impl Executor for Traced<'_> {
    fn rows(&self) -> usize {
        self.0.rows()
    }

    fn run(&mut self, op: Op<'_>) {
        let _s = match op {
            Op::Embed { table, .. } => trace_span!("embed", weight = %table.name),
            Op::RmsNorm { rows, gain, .. } => trace_span!("rms_norm", rows, dim = gain.len()),
            Op::MatMul { w, rows, .. } => trace_span!("matmul", weight = %w.name, dtype = %w.dtype, n = rows, rows = w.rows, cols = w.cols),
            Op::MatMulShared { rows, products, .. } => trace_span!("matmul_shared", n = rows, products = products.len(), first = %products.first().map_or("", |p| p.0.name.as_str())),
            Op::AddBias { rows, .. } => trace_span!("add_bias", rows),
            Op::Rope { n_heads, .. } => trace_span!("rope", n_heads),
            Op::StoreKv { layer, .. } => trace_span!("store_kv", layer),
            Op::Attention { layer, .. } => trace_span!("attention", layer),
            Op::SiluMul { rows, .. } => trace_span!("silu_mul", rows),
            Op::Add { rows, .. } => trace_span!("add", rows),
            Op::MoeFfn(m) => trace_span!("moe_ffn", rows = m.rows, experts = m.gate.len(), used = m.used),
            Op::GatherWanted { count, .. } => trace_span!("gather_wanted", count),
        }
        .entered();
        self.0.run(op)
    }

    fn logit_block(&mut self, first: usize) -> Option<usize> {
        let _s = trace_span!("logit_block", first).entered();
        self.0.logit_block(first)
    }
}
