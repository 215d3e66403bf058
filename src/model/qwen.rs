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

use super::{KvCache, ModelConfig, ModelError, ModelWeights};
use crate::backend::{AttentionShape, Backend};
use crate::gguf::GgufFile;
use std::sync::Arc;

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    backend: Arc<dyn Backend>,
    inv_freq: Vec<f32>,
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

/// Everything one sequence needs while it runs: its KV cache, its position and the
/// activation buffers, all sized once when the sequence starts.
pub struct State {
    pub kv: KvCache,
    pos: usize,
    max_batch: usize,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl State {
    /// Tokens processed so far (the next token's position).
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn capacity(&self) -> usize {
        self.kv.capacity
    }

    /// Forgets the sequence so the state can serve a new one (the buffers stay).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Drops every position from `pos` on (e.g. to reuse a shared prefix).
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
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
        Ok(Self {
            config,
            weights,
            backend,
            inv_freq,
        })
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// A state for a sequence of up to `capacity` tokens, processing prompts in chunks of
    /// `max_batch` tokens.
    pub fn new_state(&self, capacity: usize, max_batch: usize) -> State {
        let c = &self.config;
        let capacity = capacity.clamp(1, c.context_length);
        let b = max_batch.clamp(1, capacity);
        State {
            kv: KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim, capacity),
            pos: 0,
            max_batch: b,
            x: vec![0.0; b * c.hidden],
            xn: vec![0.0; b * c.hidden],
            q: vec![0.0; b * c.q_dim()],
            k: vec![0.0; b * c.kv_dim()],
            v: vec![0.0; b * c.kv_dim()],
            attn: vec![0.0; b * c.q_dim()],
            gate: vec![0.0; b * c.ffn],
            up: vec![0.0; b * c.ffn],
        }
    }

    /// Runs `tokens` through the model at the state's next positions, appending to its cache.
    pub fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        mut logits: Logits<'_>,
    ) -> Result<(), ModelError> {
        let vocab = self.config.vocab;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        let needed = st.pos + tokens.len();
        if needed > st.capacity() {
            return Err(ModelError::ContextOverflow {
                needed,
                capacity: st.capacity(),
            });
        }
        let need = match &logits {
            Logits::None => 0,
            Logits::Last(_) => vocab,
            Logits::All(_) => tokens.len() * vocab,
        };
        let got = match &logits {
            Logits::None => 0,
            Logits::Last(o) | Logits::All(o) => o.len(),
        };
        if got < need {
            return Err(ModelError::LogitsBuffer { needed: need, got });
        }
        let n_chunks = tokens.len().div_ceil(st.max_batch);
        for (ci, chunk) in tokens.chunks(st.max_batch).enumerate() {
            let first = ci * st.max_batch;
            let out = match &mut logits {
                Logits::None => None,
                Logits::Last(o) if ci + 1 == n_chunks => Some((&mut o[..vocab], true)),
                Logits::Last(_) => None,
                Logits::All(o) => {
                    Some((&mut o[first * vocab..(first + chunk.len()) * vocab], false))
                }
            };
            self.forward_chunk(st, chunk, out);
        }
        Ok(())
    }

    /// One batch of at most `max_batch` tokens. `out` receives the last row's logits
    /// (`last_only`) or every row's.
    fn forward_chunk(&self, st: &mut State, tokens: &[u32], out: Option<(&mut [f32], bool)>) {
        let be = self.backend.as_ref();
        let (n, h) = (tokens.len(), self.config.hidden);
        let w = &self.weights;
        for (t, &id) in tokens.iter().enumerate() {
            be.get_row(&w.token_embd, id as usize, &mut st.x[t * h..(t + 1) * h]);
        }
        let pos0 = st.pos;
        for (l, _) in w.layers.iter().enumerate() {
            self.attention_block(st, l, n, pos0);
            self.mlp_block(st, l, n);
        }
        st.pos += n;
        if let Some((out, last_only)) = out {
            let rows = if last_only { (n - 1)..n } else { 0..n };
            let m = rows.len();
            st.xn[..m * h].copy_from_slice(&st.x[rows.start * h..rows.end * h]);
            be.rms_norm(&mut st.xn[..m * h], &w.output_norm, self.config.rms_eps);
            be.matmul(&w.output, &st.xn[..m * h], m, out);
        }
    }

    /// `x += Wo · Attention(...)` for layer `l`, storing this chunk's keys and values.
    fn attention_block(&self, st: &mut State, l: usize, n: usize, pos0: usize) {
        let be = self.backend.as_ref();
        let c = &self.config;
        let lw = &self.weights.layers[l];
        let (h, qd, kvd) = (c.hidden, c.q_dim(), c.kv_dim());
        let xn = &mut st.xn[..n * h];
        let (q, k, v) = (
            &mut st.q[..n * qd],
            &mut st.k[..n * kvd],
            &mut st.v[..n * kvd],
        );

        xn.copy_from_slice(&st.x[..n * h]);
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
        be.rope(q, c.n_heads, c.head_dim, pos0, &self.inv_freq);
        be.rope(k, c.n_kv_heads, c.head_dim, pos0, &self.inv_freq);
        st.kv.store(l, pos0, k, v);

        let shape = AttentionShape {
            n_tokens: n,
            pos0,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            capacity: st.kv.capacity,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let (kc, vc) = st.kv.layer(l);
        let attn = &mut st.attn[..n * qd];
        be.attention(&shape, q, kc, vc, attn);
        be.matmul(&lw.wo, attn, n, xn);
        be.add(&mut st.x[..n * h], xn);
    }

    /// `x += Wdown · (SiLU(Wgate · m) ⊙ Wup · m)` with `m = RMSNorm(x)`.
    fn mlp_block(&self, st: &mut State, l: usize, n: usize) {
        let be = self.backend.as_ref();
        let c = &self.config;
        let lw = &self.weights.layers[l];
        let h = c.hidden;
        let xn = &mut st.xn[..n * h];
        let (gate, up) = (&mut st.gate[..n * c.ffn], &mut st.up[..n * c.ffn]);

        xn.copy_from_slice(&st.x[..n * h]);
        be.rms_norm(xn, &lw.ffn_norm, c.rms_eps);
        be.matmul(&lw.w_gate, xn, n, gate);
        be.matmul(&lw.w_up, xn, n, up);
        be.silu_mul(gate, up);
        be.matmul(&lw.w_down, gate, n, xn);
        be.add(&mut st.x[..n * h], xn);
    }
}
