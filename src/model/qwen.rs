//! The Qwen2/Qwen3 decoder-only transformer.
//!
//! Each block is pre-norm attention then pre-norm SwiGLU MLP, both added to the residual:
//!
//! ```text
//! h = x + Wo · Attn(RoPE(QNorm(Wq·n)), RoPE(KNorm(Wk·n)), Wv·n)   where n = RMSNorm(x)
//! y = h + Wdown · (SiLU(Wgate·m) ⊙ Wup·m)                         where m = RMSNorm(h)
//! ```
//!
//! Qwen3 adds the per-head Q/K RMSNorm; Qwen2 has biases on the Q/K/V projections instead.
//! Kernels live in the backend; this file only says what is computed, in which order.
//!
//! One forward pass ([`Model::forward_batch`]) runs the new tokens of several sequences at
//! once: their rows are stacked into one activation matrix, so every weight matrix is read
//! once for all of them, while RoPE, the KV store and attention run per sequence at its own
//! positions in its own cache. The backends compute each row independently of the others,
//! so a sequence's results do not depend on what it is batched with. The single-sequence
//! [`Model::forward`] is the one-sequence case.
//!
//! On the `gpu` backend the same pass runs on the device as one command buffer per step
//! (`backend::gpu::GpuModel`, which follows this file's order); the weights, the KV caches
//! and the activation buffers then live in device memory.

use super::{KvCache, ModelConfig, ModelError, ModelWeights};
use crate::backend::gpu::{GpuModel, GpuScratch};
use crate::backend::{AttentionShape, Backend};
use crate::gguf::GgufFile;
use std::sync::Arc;

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    backend: Arc<dyn Backend>,
    inv_freq: Vec<f32>,
    /// The weights on the GPU, when the backend runs whole passes there.
    device: Option<GpuModel>,
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
    fn rows(&self, n: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last(_) => 1,
            Logits::All(_) => n,
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

/// Activation buffers for up to `rows` token rows per forward pass, sized once.
pub struct Scratch {
    rows: usize,
    /// Rows of logits that can be gathered from several sequences into one matmul.
    logit_rows: usize,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    /// The device buffers, for a model on the GPU (the host buffers are then empty).
    gpu: Option<GpuScratch>,
}

impl Scratch {
    /// Token rows one forward pass may hold.
    pub fn rows(&self) -> usize {
        self.rows
    }
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
    pub fn load(gguf: &GgufFile, backend: Arc<dyn Backend>) -> Result<Self, ModelError> {
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
        let weights = ModelWeights::load(gguf, &config, backend.as_ref())?;
        let inv_freq = config.rope_inv_freq();
        let device = match backend.gpu() {
            Some(gpu) => Some(GpuModel::upload(
                gpu.context(),
                &config,
                &weights,
                &inv_freq,
            )?),
            None => None,
        };
        Ok(Self {
            config,
            weights,
            backend,
            inv_freq,
            device,
        })
    }

    /// The model's weights on the GPU, when it runs there.
    pub fn gpu(&self) -> Option<&GpuModel> {
        self.device.as_ref()
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// An empty KV cache for a sequence of up to `capacity` positions (capped by the
    /// model's context).
    pub fn new_kv_cache(&self, capacity: usize) -> KvCache {
        let c = &self.config;
        let capacity = capacity.clamp(1, c.context_length);
        match &self.device {
            Some(dev) => {
                let capacity = capacity.min(dev.max_kv_capacity()).max(1);
                KvCache::on_device(
                    dev.new_kv(c.n_layers, capacity),
                    c.n_layers,
                    c.n_kv_heads,
                    c.head_dim,
                )
            }
            None => KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim, capacity),
        }
    }

    /// Bytes of KV cache one position takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        let c = &self.config;
        KvCache::bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim)
    }

    /// Buffers for forward passes of up to `rows` token rows, of which up to `logit_rows`
    /// rows' logits (from several sequences) are computed in one matmul.
    pub fn new_scratch(&self, rows: usize, logit_rows: usize) -> Scratch {
        let c = &self.config;
        if let Some(dev) = &self.device {
            let gpu = dev.new_scratch(rows, logit_rows);
            return Scratch {
                rows: gpu.rows(),
                logit_rows,
                x: Vec::new(),
                xn: Vec::new(),
                q: Vec::new(),
                k: Vec::new(),
                v: Vec::new(),
                attn: Vec::new(),
                gate: Vec::new(),
                up: Vec::new(),
                logits: Vec::new(),
                gpu: Some(gpu),
            };
        }
        let b = rows.max(1);
        Scratch {
            rows: b,
            logit_rows,
            x: vec![0.0; b * c.hidden],
            xn: vec![0.0; b * c.hidden],
            q: vec![0.0; b * c.q_dim()],
            k: vec![0.0; b * c.kv_dim()],
            v: vec![0.0; b * c.kv_dim()],
            attn: vec![0.0; b * c.q_dim()],
            gate: vec![0.0; b * c.ffn],
            up: vec![0.0; b * c.ffn],
            logits: vec![0.0; logit_rows * c.vocab],
            gpu: None,
        }
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
            || kv.gpu().is_some() != self.device.is_some()
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
        let chunk = st.scratch.rows;
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
        if n > scratch.rows {
            return Err(ModelError::BatchTooLarge {
                rows: n,
                capacity: scratch.rows,
            });
        }
        if let Some(dev) = &self.device {
            let gpu = scratch.gpu.as_mut().ok_or_else(|| {
                ModelError::BadConfig("the scratch buffers were made for another model".into())
            })?;
            dev.forward(seqs, gpu)?;
            for s in seqs.iter_mut() {
                s.kv.advance(s.tokens.len());
            }
            return Ok(());
        }
        let be = self.backend.as_ref();
        let h = self.config.hidden;
        let w = &self.weights;
        let rows = seqs.iter().flat_map(|s| s.tokens.iter());
        for (t, &id) in rows.enumerate() {
            be.get_row(
                &w.token_embd,
                id as usize,
                &mut scratch.x[t * h..(t + 1) * h],
            );
        }
        for l in 0..w.layers.len() {
            self.attention_block(seqs, scratch, l, n);
            self.mlp_block(scratch, l, n);
        }
        for s in seqs.iter_mut() {
            s.kv.advance(s.tokens.len());
        }
        self.output(seqs, scratch);
        Ok(())
    }

    /// `x += Wo · Attention(...)` for layer `l` over all `n` rows; each sequence's rows are
    /// rotated at its positions, stored in its cache and attend over its history.
    fn attention_block(&self, seqs: &mut [SeqStep<'_>], sc: &mut Scratch, l: usize, n: usize) {
        let be = self.backend.as_ref();
        let c = &self.config;
        let lw = &self.weights.layers[l];
        let (h, qd, kvd) = (c.hidden, c.q_dim(), c.kv_dim());
        let xn = &mut sc.xn[..n * h];
        let (q, k, v) = (
            &mut sc.q[..n * qd],
            &mut sc.k[..n * kvd],
            &mut sc.v[..n * kvd],
        );

        xn.copy_from_slice(&sc.x[..n * h]);
        be.rms_norm(xn, &lw.attn_norm, c.rms_eps);
        be.matmul(&lw.wq, xn, n, q);
        be.matmul(&lw.wk, xn, n, k);
        be.matmul(&lw.wv, xn, n, v);
        if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
            be.add_bias(q, bq);
            be.add_bias(k, bk);
            be.add_bias(v, bv);
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            be.rms_norm(q, qn, c.rms_eps);
            be.rms_norm(k, kn, c.rms_eps);
        }

        let mut r0 = 0;
        for s in seqs.iter_mut() {
            let m = s.tokens.len();
            // The cache's length moves only after the last layer: every layer stores here.
            let pos0 = s.kv.len();
            let q = &mut q[r0 * qd..(r0 + m) * qd];
            let k = &mut k[r0 * kvd..(r0 + m) * kvd];
            be.rope(q, c.n_heads, c.head_dim, pos0, &self.inv_freq);
            be.rope(k, c.n_kv_heads, c.head_dim, pos0, &self.inv_freq);
            s.kv.store(l, pos0, k, &v[r0 * kvd..(r0 + m) * kvd]);
            let shape = AttentionShape {
                n_tokens: m,
                pos0,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                capacity: s.kv.capacity(),
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            };
            let (kc, vc) = s.kv.layer(l);
            be.attention(&shape, q, kc, vc, &mut sc.attn[r0 * qd..(r0 + m) * qd]);
            r0 += m;
        }
        be.matmul(&lw.wo, &sc.attn[..n * qd], n, xn);
        be.add(&mut sc.x[..n * h], xn);
    }

    /// `x += Wdown · (SiLU(Wgate · m) ⊙ Wup · m)` with `m = RMSNorm(x)`.
    fn mlp_block(&self, sc: &mut Scratch, l: usize, n: usize) {
        let be = self.backend.as_ref();
        let c = &self.config;
        let lw = &self.weights.layers[l];
        let h = c.hidden;
        let xn = &mut sc.xn[..n * h];
        let (gate, up) = (&mut sc.gate[..n * c.ffn], &mut sc.up[..n * c.ffn]);

        xn.copy_from_slice(&sc.x[..n * h]);
        be.rms_norm(xn, &lw.ffn_norm, c.rms_eps);
        be.matmul(&lw.w_gate, xn, n, gate);
        be.matmul(&lw.w_up, xn, n, up);
        be.silu_mul(gate, up);
        be.matmul(&lw.w_down, gate, n, xn);
        be.add(&mut sc.x[..n * h], xn);
    }

    /// The logits each sequence asked for. Rows from several sequences share one matmul
    /// (the output matrix is the largest) when the scratch has room for them; one
    /// sequence's rows go straight to its buffer.
    fn output(&self, seqs: &mut [SeqStep<'_>], sc: &mut Scratch) {
        let h = self.config.hidden;
        let vocab = self.config.vocab;
        let wanting = seqs
            .iter()
            .filter(|s| !matches!(s.logits, Logits::None))
            .count();
        let total: usize = seqs.iter().map(|s| s.logits.rows(s.tokens.len())).sum();
        if wanting > 1 && total <= sc.logit_rows {
            let mut r0 = 0;
            let mut m = 0;
            for s in seqs.iter() {
                let rows = s.logits.rows(s.tokens.len());
                let from = r0 + s.tokens.len() - rows;
                sc.xn[m * h..(m + rows) * h].copy_from_slice(&sc.x[from * h..(from + rows) * h]);
                m += rows;
                r0 += s.tokens.len();
            }
            self.final_norm_and_project(&mut sc.xn[..m * h], m, &mut sc.logits[..m * vocab]);
            let mut m = 0;
            for s in seqs.iter_mut() {
                let rows = s.logits.rows(s.tokens.len());
                if let Logits::Last(o) | Logits::All(o) = &mut s.logits {
                    o[..rows * vocab].copy_from_slice(&sc.logits[m * vocab..(m + rows) * vocab]);
                }
                m += rows;
            }
            return;
        }
        let mut r0 = 0;
        for s in seqs.iter_mut() {
            let n = s.tokens.len();
            let rows = s.logits.rows(n);
            if let Logits::Last(o) | Logits::All(o) = &mut s.logits {
                let from = r0 + n - rows;
                sc.xn[..rows * h].copy_from_slice(&sc.x[from * h..(from + rows) * h]);
                self.final_norm_and_project(&mut sc.xn[..rows * h], rows, &mut o[..rows * vocab]);
            }
            r0 += n;
        }
    }

    /// `out = Woutput · RMSNorm(x)` for `m` rows.
    fn final_norm_and_project(&self, x: &mut [f32], m: usize, out: &mut [f32]) {
        let be = self.backend.as_ref();
        let w = &self.weights;
        be.rms_norm(x, &w.output_norm, self.config.rms_eps);
        be.matmul(&w.output, x, m, out);
    }
}
