//! The decoder-only transformer shared by Qwen3, Qwen3-MoE, Qwen2 and Llama.
//!
//! Each block is pre-norm attention then pre-norm SwiGLU MLP, both added to the residual:
//!
//! ```text
//! h = x + Wo · Attn(RoPE(QNorm(Wq·n)), RoPE(KNorm(Wk·n)), Wv·n)   where n = RMSNorm(x)
//! y = h + Wdown · (SiLU(Wgate·m) ⊙ Wup·m)                         where m = RMSNorm(h)
//! ```
//!
//! Qwen3 adds the per-head Q/K RMSNorm; Qwen2 has biases on the Q/K/V projections instead;
//! Llama has neither (biases where a checkpoint has them, the output projection's too) and
//! may scale its RoPE frequencies. Qwen3-MoE is Qwen3 with a mixture of experts for the MLP:
//! `y = h + Σ_e w_e · Wdown_e · (SiLU(Wgate_e·m) ⊙ Wup_e·m)` over the experts its router
//! picks for the token (the executor's `MoeFfn`). The weights' loader puts Llama's permuted Q/K rows back in
//! transformers' order, so one RoPE serves all three.
//!
//! The pass is written once, against the executor interface (`backend::exec`): the host
//! executor runs each operation with the CPU kernels as it is issued, the GPU executor
//! records it into the step's command buffer. This file only says what is computed, in
//! which order, on which buffers.
//!
//! One forward pass ([`Model::forward_batch`]) runs the new tokens of several sequences at
//! once: their rows are stacked into one activation matrix, so every weight matrix is read
//! once for all of them, while RoPE, the KV store and attention run per sequence at its own
//! positions in its own cache. The kernels compute each row independently of the others,
//! so a sequence's results do not depend on what it is batched with. The single-sequence
//! [`Model::forward`] is the one-sequence case.

use super::weights::{ExpertWeights, Ffn};
use super::{ModelConfig, ModelError, ModelWeights};
use inferno_backend::exec::MoeFfn;
use inferno_backend::{
    Buf, Device, Executor, KvCache, KvShape, KvType, Logits, Scratch, ScratchSpec, SeqStep, LOGITS,
};
use inferno_gguf::GgufFile;
use inferno_tensor::GgmlType;

/// The activation buffers of a pass: the residual stream, the normalized input of a
/// projection, queries, keys, values, the attention output, and the MLP's gate and up rows.
const X: Buf = Buf(0);
const XN: Buf = Buf(1);
const Q: Buf = Buf(2);
const K: Buf = Buf(3);
const V: Buf = Buf(4);
const ATTN: Buf = Buf(5);
const GATE: Buf = Buf(6);
const UP: Buf = Buf(7);
/// A mixture-of-experts MLP's buffers (width 0 in dense models): the router logits, the rows
/// gathered for one expert, that expert's gate and up rows and its outputs, and the mixture.
const ROUTER: Buf = Buf(8);
const XS: Buf = Buf(9);
const EGATE: Buf = Buf(10);
const EUP: Buf = Buf(11);
const YS: Buf = Buf(12);
const MOE_OUT: Buf = Buf(13);

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    device: Device,
    inv_freq: Vec<f32>,
    /// What new KV caches store keys and values as.
    kv_types: (KvType, KvType),
}

/// Everything one sequence needs to run on its own: its KV cache and the activation
/// buffers, all sized once when the sequence starts.
pub struct State {
    pub kv: KvCache,
    scratch: Scratch,
}

impl State {
    /// Tokens processed so far (the next token's position).
    pub fn position(&self) -> usize {
        self.kv.len()
    }

    pub fn capacity(&self) -> usize {
        self.kv.capacity()
    }

    /// Forgets the sequence so the state can serve a new one (the buffers stay).
    pub fn reset(&mut self) {
        self.kv.clear();
    }

    /// Drops every position from `pos` on (e.g. to reuse a shared prefix).
    pub fn truncate(&mut self, pos: usize) {
        self.kv.truncate(pos);
    }
}

impl Model {
    /// Loads the model with its expert matrices (if any) left memory-mapped.
    pub fn load(gguf: &GgufFile, device: impl Into<Device>) -> Result<Self, ModelError> {
        Self::load_with(gguf, device, ExpertWeights::Mapped)
    }

    /// Loads the model, its expert matrices (if any) loaded as `experts` says.
    pub fn load_with(
        gguf: &GgufFile,
        device: impl Into<Device>,
        experts: ExpertWeights,
    ) -> Result<Self, ModelError> {
        let device = device.into();
        let mut config = ModelConfig::from_gguf(gguf)?;
        // The embedding's row count is the true vocabulary size of the weights.
        if let Some(info) = gguf.tensor_info("token_embd.weight") {
            if let [_, rows] = info.dims[..] {
                config.vocab = rows as usize;
            }
        }
        if config.vocab == 0 {
            return Err(ModelError::BadConfig("the vocabulary is empty".into()));
        }
        device.check_head_dim(config.head_dim)?;
        let weights = ModelWeights::load(gguf, &config, &device, experts)?;
        let mut inv_freq = config.rope_inv_freq();
        if let Some(factors) = &weights.rope_freqs {
            if config.rope_scaling != super::config::RopeScaling::None {
                return Err(ModelError::BadConfig(
                    "the file has both rope_freqs.weight and rope.scaling metadata; \
                     only one may say how RoPE is scaled"
                        .into(),
                ));
            }
            if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(ModelError::BadConfig(format!(
                    "rope_freqs.weight holds {bad}; the factors must be positive"
                )));
            }
            // llama.cpp divides each dimension's angle by its factor.
            for (f, d) in inv_freq.iter_mut().zip(factors) {
                *f /= d;
            }
        }
        let kv_types = Self::default_kv_types(weights.main_dtype());
        device.check_kv_types(kv_types, config.head_dim)?;
        Ok(Self {
            config,
            weights,
            device,
            inv_freq,
            kv_types,
        })
    }

    /// The KV cache types a model of this weight type gets unless told otherwise: F32 for
    /// F32 weights (so the model stays exact against its reference), F16 for everything
    /// else (as llama.cpp: half the bytes at a precision the weights do not exceed).
    pub fn default_kv_types(weights: GgmlType) -> (KvType, KvType) {
        match weights {
            GgmlType::F32 => (KvType::F32, KvType::F32),
            _ => (KvType::F16, KvType::F16),
        }
    }

    /// The key and value types of the KV caches made from now on.
    pub fn kv_types(&self) -> (KvType, KvType) {
        self.kv_types
    }

    /// Makes later KV caches store keys as `types.0` and values as `types.1`.
    pub fn set_kv_types(&mut self, types: (KvType, KvType)) -> Result<(), ModelError> {
        self.device.check_kv_types(types, self.config.head_dim)?;
        self.kv_types = types;
        Ok(())
    }

    /// What the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty KV cache for a sequence of up to `capacity` positions (capped by the
    /// model's context, and by what the device holds).
    pub fn new_kv_cache(&self, capacity: usize) -> KvCache {
        let c = &self.config;
        let capacity = capacity.clamp(1, c.context_length);
        self.device.new_kv_cache(self.kv_shape(), capacity)
    }

    /// What one position of this model's KV caches holds.
    pub fn kv_shape(&self) -> KvShape {
        let c = &self.config;
        KvShape {
            n_layers: c.n_layers,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            types: self.kv_types,
        }
    }

    /// Bytes of KV cache one position takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv_shape().bytes_per_token()
    }

    /// Buffers for forward passes of up to `rows` token rows, of which up to `logit_rows`
    /// rows' logits (from several sequences) are computed in one matmul.
    pub fn new_scratch(&self, rows: usize, logit_rows: usize) -> Scratch {
        let c = &self.config;
        let (h, qd, kvd) = (c.hidden, c.q_dim(), c.kv_dim());
        let (ffn, moe) = match c.moe {
            None => (c.ffn, [0; 6]),
            Some(m) => (0, [m.n_experts, h, m.expert_ffn, m.expert_ffn, h, h]),
        };
        let mut widths = vec![h, h, qd, kvd, kvd, qd, ffn, ffn];
        widths.extend(moe);
        self.device.new_scratch(&ScratchSpec {
            // Indexed by the buffer constants above.
            widths,
            rows: rows.max(1),
            logit_rows,
            vocab: c.vocab,
            head_dim: c.head_dim,
            experts: c.moe.map_or(0, |m| m.n_experts),
            experts_used: c.moe.map_or(0, |m| m.n_used),
            expert_ffn: c.moe.map_or(0, |m| m.expert_ffn),
            expert_out: c.moe.map_or(0, |_| h),
        })
    }

    /// A state for a sequence of up to `capacity` tokens, processing prompts in chunks of
    /// `max_batch` tokens.
    pub fn new_state(&self, capacity: usize, max_batch: usize) -> State {
        let kv = self.new_kv_cache(capacity);
        let rows = max_batch.clamp(1, kv.capacity());
        State {
            kv,
            // One sequence: its logits go straight to the caller's buffer.
            scratch: self.new_scratch(rows, 0),
        }
    }

    /// Checks one sequence's step before anything is computed.
    fn check(&self, kv: &KvCache, tokens: &[u32], logits: &Logits<'_>) -> Result<(), ModelError> {
        let vocab = self.config.vocab;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        let needed = kv.len() + tokens.len();
        if needed > kv.capacity() {
            return Err(ModelError::ContextOverflow {
                needed,
                capacity: kv.capacity(),
            });
        }
        let need = logits.rows(tokens.len()) * vocab;
        let got = match logits {
            Logits::None => 0,
            Logits::Last(o) | Logits::All(o) => o.len(),
        };
        if got < need {
            return Err(ModelError::LogitsBuffer { needed: need, got });
        }
        let c = &self.config;
        if kv.shape() != (c.n_layers, c.n_kv_heads, c.head_dim)
            || kv.on_device() != self.device.is_gpu()
        {
            return Err(ModelError::BadConfig(
                "the KV cache was made for another model".into(),
            ));
        }
        Ok(())
    }

    /// Runs `tokens` through the model at the state's next positions, appending to its cache.
    pub fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        mut logits: Logits<'_>,
    ) -> Result<(), ModelError> {
        self.check(&st.kv, tokens, &logits)?;
        let vocab = self.config.vocab;
        let chunk = st.scratch.rows();
        let n_chunks = tokens.len().div_ceil(chunk);
        for (ci, part) in tokens.chunks(chunk).enumerate() {
            let first = ci * chunk;
            let out = match &mut logits {
                Logits::None => Logits::None,
                Logits::Last(o) if ci + 1 == n_chunks => Logits::Last(&mut o[..vocab]),
                Logits::Last(_) => Logits::None,
                Logits::All(o) => Logits::All(&mut o[first * vocab..(first + part.len()) * vocab]),
            };
            let mut one = [SeqStep {
                kv: &mut st.kv,
                tokens: part,
                logits: out,
            }];
            self.forward_batch(&mut one, &mut st.scratch)?;
        }
        Ok(())
    }

    /// One forward pass over the new tokens of every sequence in `seqs` (at most
    /// `scratch.rows()` tokens in all): each sequence's tokens run at its cache's next
    /// positions, are appended to its cache, and produce the logits it asks for.
    pub fn forward_batch(
        &self,
        seqs: &mut [SeqStep<'_>],
        scratch: &mut Scratch,
    ) -> Result<(), ModelError> {
        if seqs.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        for s in seqs.iter() {
            self.check(s.kv, s.tokens, &s.logits)?;
        }
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n > scratch.rows() {
            return Err(ModelError::BatchTooLarge {
                rows: n,
                capacity: scratch.rows(),
            });
        }
        self.device.step(seqs, scratch, &|ex| self.pass(ex))?;
        for s in seqs.iter_mut() {
            s.kv.advance(s.tokens.len());
        }
        Ok(())
    }

    /// The whole pass over the step's rows: embedding, every block, then the logits.
    fn pass(&self, ex: &mut dyn Executor) {
        let n = ex.rows();
        ex.embed(&self.weights.token_embd, X);
        for l in 0..self.weights.layers.len() {
            self.attention_block(ex, l, n);
            self.mlp_block(ex, l, n);
        }
        self.output(ex);
    }

    /// `x += Wo · Attention(RoPE(QNorm(Wq·n)), RoPE(KNorm(Wk·n)), Wv·n)`, `n = RMSNorm(x)`;
    /// each sequence's rows are rotated at its positions, stored in its cache and attend
    /// over its history.
    fn attention_block(&self, ex: &mut dyn Executor, l: usize, n: usize) {
        let c = &self.config;
        let lw = &self.weights.layers[l];
        ex.rms_norm(X, XN, n, &lw.attn_norm, c.rms_eps);
        ex.matmul_shared(XN, n, &[(&lw.wq, Q), (&lw.wk, K), (&lw.wv, V)]);
        for (buf, bias) in [(Q, &lw.bq), (K, &lw.bk), (V, &lw.bv)] {
            if let Some(b) = bias {
                ex.add_bias(buf, n, b);
            }
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            ex.rms_norm(Q, Q, n * c.n_heads, qn, c.rms_eps);
            ex.rms_norm(K, K, n * c.n_kv_heads, kn, c.rms_eps);
        }
        ex.rope(Q, c.n_heads, c.head_dim, &self.inv_freq);
        ex.rope(K, c.n_kv_heads, c.head_dim, &self.inv_freq);
        ex.store_kv(l, K, V);
        let scale = c.attention_logit_factor() / (c.head_dim as f32).sqrt();
        ex.attention(l, Q, ATTN, c.n_heads, scale);
        ex.matmul(&lw.wo, ATTN, n, XN);
        if let Some(bo) = &lw.bo {
            ex.add_bias(XN, n, bo);
        }
        ex.add(X, XN, n);
    }

    /// `x += Wdown · (SiLU(Wgate · m) ⊙ Wup · m)` with `m = RMSNorm(x)`, or for a mixture
    /// of experts the router's logits `Wrouter · m` and the experts they pick.
    fn mlp_block(&self, ex: &mut dyn Executor, l: usize, n: usize) {
        let c = &self.config;
        let lw = &self.weights.layers[l];
        ex.rms_norm(X, XN, n, &lw.ffn_norm, c.rms_eps);
        match &lw.ffn {
            Ffn::Dense { gate, up, down } => {
                ex.matmul_shared(XN, n, &[(gate, GATE), (up, UP)]);
                ex.silu_mul(GATE, UP, n);
                ex.matmul(down, GATE, n, XN);
                ex.add(X, XN, n);
            }
            Ffn::Moe(m) => {
                ex.matmul(&m.router, XN, n, ROUTER);
                ex.moe_ffn(MoeFfn {
                    router: ROUTER,
                    x: XN,
                    out: MOE_OUT,
                    rows: n,
                    gate: &m.gate,
                    up: &m.up,
                    down: &m.down,
                    used: m.used,
                    normalize: m.normalize,
                    xs: XS,
                    g: EGATE,
                    u: EUP,
                    ys: YS,
                });
                ex.add(X, MOE_OUT, n);
            }
        }
    }

    /// `logits = Woutput · RMSNorm(x)` for the rows whose logits are wanted, in the blocks
    /// the executor hands out.
    fn output(&self, ex: &mut dyn Executor) {
        let w = &self.weights;
        let mut first = 0;
        while let Some(count) = ex.logit_block(first) {
            ex.gather_wanted(X, XN, first, count);
            ex.rms_norm(XN, XN, count, &w.output_norm, self.config.rms_eps);
            ex.matmul(&w.output, XN, count, LOGITS);
            first += count;
        }
    }
}
