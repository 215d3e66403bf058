//! Random-weight models of a real model's shape: benchmarks need no download, and the
//! service has a built-in demo model. Deterministic for a given seed.
//!
//! Three architectures: `qwen3` (Qwen3-0.6B's shape, and the demo), `llama` (Llama-3.2-1B's
//! shape, with its Llama 3 RoPE scaling written as llama.cpp's converter writes it, a
//! `rope_freqs.weight` tensor) and `qwen3moe` (Qwen3-30B-A3B's shape, its experts stacked into
//! 3-D tensors as llama.cpp's converter stacks them, and a tiny one for tests).
//!
//! The vocabulary is byte-level (the 256 byte tokens of GPT-2's byte encoding, no merges)
//! plus the Qwen special tokens, padded to the preset's vocabulary size.
//!
//! Random weights alone make a model that repeats its last token: with a tied LM head the
//! residual stream, mostly the last token's embedding, scores that token far above all
//! others. The demo preset is `readable` instead: its own LM head, small enough that
//! sampling varies, turned away from each token's own embedding (so it rarely repeats
//! itself), and a prior carried by one residual dimension that no layer writes to: it makes
//! lowercase letters (at English frequencies), spaces and a little punctuation likely and
//! every other token, end tokens included, all but impossible. Its text is still random,
//! only no longer one repeated character.

use crate::config::RopeScaling;
use crate::{Architecture, ModelConfig, MoeConfig};
use inferno_gguf::{GgufError, GgufWriter, Value};
use inferno_tensor::{float, q8_0, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::ops::{Deref, DerefMut};

/// A model to synthesize: the hyper-parameters its file describes and how its weights are
/// drawn. It dereferences to its [`ModelConfig`], so `spec.n_layers` reads and sets the
/// config's field.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub name: String,
    /// The hyper-parameters written to the file's metadata. `rope_scaling` must be
    /// [`RopeScaling::None`]: no scaling keys are written (Llama 3's scaling is the
    /// `rope_freqs.weight` tensor). `moe` holds the experts of a `qwen3moe` model (its MLPs
    /// are mixtures of them) and is `None` otherwise.
    pub config: ModelConfig,
    pub tied: bool,
    /// Type of the 2-D weight matrices (norms stay F32).
    pub dtype: GgmlType,
    pub seed: u64,
    /// Shape the output toward varied printable text (see the module's notes; needs an
    /// untied LM head).
    pub readable: bool,
}

impl Deref for SynthSpec {
    type Target = ModelConfig;

    fn deref(&self) -> &ModelConfig {
        &self.config
    }
}

impl DerefMut for SynthSpec {
    fn deref_mut(&mut self) -> &mut ModelConfig {
        &mut self.config
    }
}

pub const PRESETS: &[&str] = &["0.6b", "demo"];
/// The presets of `--arch llama`.
pub const LLAMA_PRESETS: &[&str] = &["1b"];
/// The presets of `--arch qwen3moe`.
pub const QWEN3MOE_PRESETS: &[&str] = &["30b-a3b", "tiny"];

/// Llama 3.2's RoPE scaling: factor, low and high frequency factors, original context.
const LLAMA3_ROPE: (f64, f64, f64, f64) = (32.0, 1.0, 4.0, 8192.0);

/// Special tokens appended after the 256 byte tokens.
const SPECIALS: &[(&str, i32)] = &[
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<think>", 4),
    ("</think>", 4),
];

impl SynthSpec {
    /// `0.6b`: exactly Qwen3-0.6B's shape. `demo`: a small model for the built-in service demo.
    pub fn preset(name: &str, dtype: GgmlType) -> Option<Self> {
        let base = Self {
            name: format!("synthetic-qwen3-{name}"),
            config: ModelConfig {
                arch: Architecture::Qwen3,
                n_layers: 28,
                hidden: 1024,
                ffn: 3072,
                n_heads: 16,
                n_kv_heads: 8,
                head_dim: 128,
                vocab: 151_936,
                context_length: 40_960,
                rope_theta: 1_000_000.0,
                rope_scaling: RopeScaling::None,
                rms_eps: 1e-6,
                moe: None,
            },
            tied: true,
            dtype,
            seed: 42,
            readable: false,
        };
        match name {
            "0.6b" => Some(base),
            "demo" => Some(Self {
                config: ModelConfig {
                    n_layers: 4,
                    hidden: 256,
                    ffn: 768,
                    n_heads: 4,
                    n_kv_heads: 2,
                    head_dim: 64,
                    vocab: 256 + SPECIALS.len(),
                    context_length: 4096,
                    ..base.config
                },
                tied: false,
                readable: true,
                ..base
            }),
            _ => None,
        }
    }

    /// A preset of `arch`: [`SynthSpec::preset`] for qwen3; for llama `1b`, exactly
    /// Llama-3.2-1B's shape (16 layers, hidden 2048, 32/8 heads of 64, FFN 8192, vocabulary
    /// 128,256, tied, RoPE base 5e5 with Llama 3 scaling).
    pub fn preset_for(arch: Architecture, name: &str, dtype: GgmlType) -> Option<Self> {
        match (arch, name) {
            (Architecture::Qwen3, _) => Self::preset(name, dtype),
            (Architecture::Llama, "1b") => Some(Self {
                name: "synthetic-llama-3.2-1b".into(),
                config: ModelConfig {
                    arch,
                    n_layers: 16,
                    hidden: 2048,
                    ffn: 8192,
                    n_heads: 32,
                    n_kv_heads: 8,
                    head_dim: 64,
                    vocab: 128_256,
                    context_length: 131_072,
                    rope_theta: 500_000.0,
                    rope_scaling: RopeScaling::None,
                    rms_eps: 1e-5,
                    moe: None,
                },
                tied: true,
                dtype,
                seed: 42,
                readable: false,
            }),
            (Architecture::Qwen3Moe, "30b-a3b" | "tiny") => {
                let full = Self {
                    name: "synthetic-qwen3-30b-a3b".into(),
                    config: ModelConfig {
                        arch,
                        n_layers: 48,
                        hidden: 2048,
                        ffn: 6144,
                        n_heads: 32,
                        n_kv_heads: 4,
                        head_dim: 128,
                        vocab: 151_936,
                        context_length: 40_960,
                        rope_theta: 1_000_000.0,
                        rope_scaling: RopeScaling::None,
                        rms_eps: 1e-6,
                        moe: Some(MoeConfig {
                            n_experts: 128,
                            n_used: 8,
                            expert_ffn: 768,
                            normalize: true,
                        }),
                    },
                    tied: false,
                    dtype,
                    seed: 42,
                    readable: false,
                };
                Some(if name == "tiny" {
                    Self {
                        name: "synthetic-qwen3moe-tiny".into(),
                        config: ModelConfig {
                            n_layers: 2,
                            hidden: 64,
                            ffn: 256,
                            n_heads: 4,
                            n_kv_heads: 2,
                            head_dim: 16,
                            vocab: 256 + SPECIALS.len(),
                            context_length: 256,
                            moe: Some(MoeConfig {
                                n_experts: 8,
                                n_used: 2,
                                expert_ffn: 32,
                                normalize: true,
                            }),
                            ..full.config
                        },
                        ..full
                    }
                } else {
                    full
                })
            }
            _ => None,
        }
    }

    pub fn n_params(&self) -> usize {
        let (h, qd, kvd) = (
            self.hidden,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        let qk_norms = match self.arch {
            Architecture::Qwen3 | Architecture::Qwen3Moe => 2 * self.head_dim,
            _ => 0,
        };
        let mlp = match self.moe {
            None => 3 * h * self.ffn,
            Some(m) => m.n_experts * h + 3 * m.n_experts * h * m.expert_ffn,
        };
        let layer = h * qd * 2 + h * kvd * 2 + mlp + 2 * h + qk_norms;
        let out = if self.tied { 0 } else { self.vocab * h };
        self.vocab * h + self.n_layers * layer + h + out
    }
}

/// GPT-2's byte-to-character table: printable bytes map to themselves, the rest to U+0100…
pub fn byte_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('?')
        };
    }
    table
}

fn tokenizer_metadata(w: &mut GgufWriter, vocab: usize) {
    let table = byte_to_unicode();
    let mut tokens: Vec<Value> = table.iter().map(|c| Value::String(c.to_string())).collect();
    let mut types: Vec<Value> = vec![Value::I32(1); 256];
    for (s, t) in SPECIALS {
        tokens.push(Value::String(s.to_string()));
        types.push(Value::I32(*t));
    }
    while tokens.len() < vocab {
        tokens.push(Value::String(format!("[PAD{}]", tokens.len())));
        types.push(Value::I32(5));
    }
    let id = |name: &str| (256 + SPECIALS.iter().position(|(s, _)| *s == name).unwrap_or(0)) as u32;
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", Value::String("qwen2".into()));
    w.add("tokenizer.ggml.tokens", Value::Array(tokens));
    w.add("tokenizer.ggml.token_type", Value::Array(types));
    w.add("tokenizer.ggml.merges", Value::Array(Vec::new()));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(id("<|im_end|>")));
    w.add(
        "tokenizer.ggml.padding_token_id",
        Value::U32(id("<|endoftext|>")),
    );
    w.add(
        "tokenizer.ggml.bos_token_id",
        Value::U32(id("<|endoftext|>")),
    );
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.add(
        "tokenizer.chat_template",
        Value::String(
            inferno_tokenizer::ChatTemplate::chatml()
                .source()
                .to_string(),
        ),
    );
}

/// `n` values from N(0, std²) (Box–Muller).
fn normal_values(rng: &mut ChaCha8Rng, n: usize, std: f32) -> Vec<f32> {
    let mut vals = vec![0.0f32; n];
    for pair in vals.chunks_mut(2) {
        let u1: f32 = rng.random::<f32>().max(1e-7);
        let u2: f32 = rng.random::<f32>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let t = std::f32::consts::TAU * u2;
        pair[0] = r * t.cos();
        if pair.len() > 1 {
            pair[1] = r * t.sin();
        }
    }
    vals
}

fn encode(vals: &[f32], dtype: GgmlType) -> Vec<u8> {
    // The synthesizer only builds shapes whose rows are whole Q8_0 blocks, and only
    // accepts the types `tensor::encode` writes; anything else falls back to f32.
    inferno_tensor::encode(vals, dtype).unwrap_or_else(|_| float::f32_to_le_bytes(vals))
}

/// Residual dimension that carries a constant (no layer writes to it), through which a
/// readable model's LM head adds a per-token prior; and that constant in every embedding.
const PRIOR_DIM: usize = 0;
const PRIOR_DIM_VALUE: f32 = 12.0;
/// Entries of a readable model's LM head: small, so the logits spread over a few units and
/// sampling at temperature 1 varies. (Chosen by eye on the demo's output, as the rest.)
const READABLE_HEAD_STD: f32 = 0.08;
/// Scale from a token's log-frequency to its LM-head entry on the prior dimension.
const PRIOR_SCALE: f32 = 0.1;
/// How much of its own embedding each LM-head row loses, so that the residual stream
/// (mostly the last token's embedding) scores that token lower, not higher.
const SELF_PENALTY: f32 = 0.01;

/// Relative frequency of each byte token in the readable model's output: lowercase letters
/// as in English text, spaces, a little punctuation; 0 for every other byte.
fn byte_frequency(b: u8) -> f32 {
    const LETTERS: [f32; 26] = [
        8.2, 1.5, 2.8, 4.3, 12.7, 2.2, 2.0, 6.1, 7.0, 0.15, 0.8, 4.0, 2.4, 6.7, 7.5, 1.9, 0.1, 6.0,
        6.3, 9.1, 2.8, 1.0, 2.4, 0.15, 2.0, 0.07,
    ];
    match b {
        b'a'..=b'z' => LETTERS[(b - b'a') as usize],
        // Above its share in English text: it competes with every letter's context.
        b' ' => 60.0,
        b'.' | b',' => 1.0,
        b'\n' => 0.3,
        _ => 0.0,
    }
}

/// The readable model's LM head: small random rows less a little of the token's own
/// embedding `emb`, and on the prior dimension each token's log-frequency (specials,
/// padding and unlikely bytes far below the rest).
fn readable_head(
    rng: &mut ChaCha8Rng,
    emb: &[f32],
    vocab: usize,
    hidden: usize,
    dtype: GgmlType,
) -> Vec<u8> {
    let mut vals = normal_values(rng, vocab * hidden, READABLE_HEAD_STD);
    for (t, (row, own)) in vals.chunks_mut(hidden).zip(emb.chunks(hidden)).enumerate() {
        for (v, e) in row.iter_mut().zip(own) {
            *v -= SELF_PENALTY * e;
        }
        let f = u8::try_from(t).map_or(0.0, byte_frequency);
        let log_f = if f > 0.0 { f.ln() } else { -40.0 };
        row[PRIOR_DIM] = PRIOR_SCALE * log_f;
    }
    encode(&vals, dtype)
}

/// Norm gains near one, so the model is not a plain identity at the norms.
fn random_gain(rng: &mut ChaCha8Rng, n: usize) -> Vec<u8> {
    let v: Vec<f32> = (0..n)
        .map(|_| 1.0 + 0.1 * (rng.random::<f32>() - 0.5))
        .collect();
    float::f32_to_le_bytes(&v)
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown preset {0:?} (available: 0.6b, demo)")]
    UnknownPreset(String),
    #[error(
        "type {0} cannot be written by the synthesizer (use f32, f16, bf16, q8_0, q5_0 or q4_0)"
    )]
    UnsupportedType(GgmlType),
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// Builds the whole GGUF in a writer (weights held in memory until written).
pub fn build(spec: &SynthSpec) -> Result<GgufWriter, SynthError> {
    build_with_progress(spec, |_, _| {})
}

/// [`build`], telling `progress(done, total)` after each part (the embedding, each layer,
/// the head), since a full-size model takes a while.
pub fn build_with_progress(
    spec: &SynthSpec,
    mut progress: impl FnMut(usize, usize),
) -> Result<GgufWriter, SynthError> {
    let parts = spec.n_layers + 2;
    if !matches!(
        spec.dtype,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q5_0
    ) {
        return Err(SynthError::UnsupportedType(spec.dtype));
    }
    let (h, qd, kvd, ffn) = (
        spec.hidden,
        spec.n_heads * spec.head_dim,
        spec.n_kv_heads * spec.head_dim,
        spec.ffn,
    );
    let blocked = spec.dtype.block_size() > 1;
    // The MLP's inner width: the dense FFN, or each expert's.
    let inner = spec.moe.map_or(ffn, |m| m.expert_ffn);
    if blocked && [h, qd, inner].iter().any(|d| d % q8_0::BLOCK != 0) {
        return Err(SynthError::Shape(format!(
            "{} needs row lengths that are multiples of 32 (hidden {h}, q {qd}, ffn {inner})",
            spec.dtype
        )));
    }
    if !matches!(
        spec.arch,
        Architecture::Qwen3 | Architecture::Llama | Architecture::Qwen3Moe
    ) {
        return Err(SynthError::Shape(format!(
            "architecture {} is not synthesized (qwen3, llama, qwen3moe)",
            spec.arch.name()
        )));
    }
    if (spec.arch == Architecture::Qwen3Moe) != spec.moe.is_some() {
        return Err(SynthError::Shape(
            "experts are given exactly for qwen3moe".into(),
        ));
    }
    if spec.rope_scaling != RopeScaling::None {
        return Err(SynthError::Shape(
            "RoPE scaling keys are not synthesized (rope_scaling must be None)".into(),
        ));
    }
    let llama = spec.arch == Architecture::Llama;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut w = GgufWriter::new();
    let a = spec.arch.name();
    w.add("general.architecture", Value::String(a.into()));
    w.add("general.name", Value::String(spec.name.clone()));
    w.add(
        "general.file_type",
        Value::U32(inferno_tensor::file_type(spec.dtype).unwrap_or(0)),
    );
    w.add(format!("{a}.block_count"), Value::U32(spec.n_layers as u32));
    w.add(
        format!("{a}.context_length"),
        Value::U32(spec.context_length as u32),
    );
    w.add(format!("{a}.embedding_length"), Value::U32(h as u32));
    w.add(format!("{a}.feed_forward_length"), Value::U32(ffn as u32));
    w.add(
        format!("{a}.attention.head_count"),
        Value::U32(spec.n_heads as u32),
    );
    w.add(
        format!("{a}.attention.head_count_kv"),
        Value::U32(spec.n_kv_heads as u32),
    );
    w.add(
        format!("{a}.attention.key_length"),
        Value::U32(spec.head_dim as u32),
    );
    w.add(
        format!("{a}.attention.value_length"),
        Value::U32(spec.head_dim as u32),
    );
    w.add(format!("{a}.rope.freq_base"), Value::F32(spec.rope_theta));
    if llama {
        w.add(
            format!("{a}.rope.dimension_count"),
            Value::U32(spec.head_dim as u32),
        );
    }
    w.add(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(spec.rms_eps),
    );
    if let Some(m) = spec.moe {
        w.add(format!("{a}.expert_count"), Value::U32(m.n_experts as u32));
        w.add(
            format!("{a}.expert_used_count"),
            Value::U32(m.n_used as u32),
        );
        w.add(
            format!("{a}.expert_feed_forward_length"),
            Value::U32(m.expert_ffn as u32),
        );
        if !m.normalize {
            w.add(format!("{a}.expert_weights_norm"), Value::Bool(false));
        }
    }
    tokenizer_metadata(&mut w, spec.vocab);

    let dt = spec.dtype;
    let mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, rng: &mut ChaCha8Rng| {
        let std = 1.0 / (cols as f32).sqrt();
        let mut vals = normal_values(rng, rows * cols, std);
        // In a readable model no layer writes the prior dimension: the projections into the
        // residual stream have that row zero.
        if spec.readable
            && (name.ends_with("attn_output.weight") || name.ends_with("ffn_down.weight"))
        {
            vals[PRIOR_DIM * cols..(PRIOR_DIM + 1) * cols].fill(0.0);
        }
        let data = encode(&vals, dt);
        w.add_tensor(name, &[cols as u64, rows as u64], dt, data)
            .map(|_| ())
    };
    if spec.readable && (spec.tied || h < PRIOR_DIM + 1) {
        return Err(SynthError::Shape(
            "a readable model needs an untied LM head and a hidden dimension for its prior".into(),
        ));
    }
    // Embedding entries of order one, like trained models after the first norm.
    let mut emb = normal_values(&mut rng, spec.vocab * h, 1.0);
    if spec.readable {
        for row in emb.chunks_mut(h) {
            row[PRIOR_DIM] = PRIOR_DIM_VALUE;
        }
    }
    w.add_tensor(
        "token_embd.weight",
        &[h as u64, spec.vocab as u64],
        dt,
        encode(&emb, dt),
    )?;
    if llama {
        let factors = llama3_rope_factors(spec.rope_theta, spec.head_dim);
        let bytes = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
        w.add_tensor(
            "rope_freqs.weight",
            &[factors.len() as u64],
            GgmlType::F32,
            bytes,
        )?;
    }
    progress(1, parts);
    for i in 0..spec.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        w.add_tensor(
            n("attn_norm.weight"),
            &[h as u64],
            GgmlType::F32,
            random_gain(&mut rng, h),
        )?;
        mat(&mut w, &n("attn_q.weight"), qd, h, &mut rng)?;
        mat(&mut w, &n("attn_k.weight"), kvd, h, &mut rng)?;
        mat(&mut w, &n("attn_v.weight"), kvd, h, &mut rng)?;
        mat(&mut w, &n("attn_output.weight"), h, qd, &mut rng)?;
        let hd = spec.head_dim;
        if !llama {
            w.add_tensor(
                n("attn_q_norm.weight"),
                &[hd as u64],
                GgmlType::F32,
                random_gain(&mut rng, hd),
            )?;
            w.add_tensor(
                n("attn_k_norm.weight"),
                &[hd as u64],
                GgmlType::F32,
                random_gain(&mut rng, hd),
            )?;
        }
        w.add_tensor(
            n("ffn_norm.weight"),
            &[h as u64],
            GgmlType::F32,
            random_gain(&mut rng, h),
        )?;
        match spec.moe {
            None => {
                mat(&mut w, &n("ffn_gate.weight"), ffn, h, &mut rng)?;
                mat(&mut w, &n("ffn_up.weight"), ffn, h, &mut rng)?;
                mat(&mut w, &n("ffn_down.weight"), h, ffn, &mut rng)?;
            }
            Some(m) => {
                let (e, f) = (m.n_experts, m.expert_ffn);
                mat(&mut w, &n("ffn_gate_inp.weight"), e, h, &mut rng)?;
                // Each stacked tensor is its experts' rows one after the other, so one draw
                // of `e × rows` rows encodes it (every row is quantized on its own).
                for (name, rows, cols) in [
                    ("ffn_gate_exps.weight", f, h),
                    ("ffn_up_exps.weight", f, h),
                    ("ffn_down_exps.weight", h, f),
                ] {
                    let std = 1.0 / (cols as f32).sqrt();
                    let vals = normal_values(&mut rng, e * rows * cols, std);
                    w.add_tensor(
                        n(name),
                        &[cols as u64, rows as u64, e as u64],
                        dt,
                        encode(&vals, dt),
                    )?;
                }
            }
        }
        progress(i + 2, parts);
    }
    w.add_tensor(
        "output_norm.weight",
        &[h as u64],
        GgmlType::F32,
        random_gain(&mut rng, h),
    )?;
    if spec.readable {
        let head = readable_head(&mut rng, &emb, spec.vocab, h, dt);
        w.add_tensor("output.weight", &[h as u64, spec.vocab as u64], dt, head)?;
    } else if !spec.tied {
        mat(&mut w, "output.weight", spec.vocab, h, &mut rng)?;
    }
    progress(parts, parts);
    Ok(w)
}

/// The divisor of each RoPE frequency under Llama 3.2's scaling ([`LLAMA3_ROPE`]), as
/// llama.cpp's converter computes `rope_freqs.weight` (in f64, stored as f32).
fn llama3_rope_factors(theta: f32, head_dim: usize) -> Vec<f32> {
    let (factor, low, high, old) = LLAMA3_ROPE;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / (theta as f64).powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferno_gguf::GgufFile;

    #[test]
    fn demo_model_loads_and_is_deterministic() {
        let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
        let a = build(&spec).unwrap().to_bytes();
        let b = build(&spec).unwrap().to_bytes();
        assert_eq!(a, b);
        let g = GgufFile::from_bytes(a).unwrap();
        let cfg = crate::ModelConfig::from_gguf(&g).unwrap();
        assert_eq!(cfg.n_layers, 4);
        // The file describes exactly the spec's config.
        assert_eq!(cfg, spec.config);
        let tok = inferno_tokenizer::Tokenizer::from_gguf(&g).unwrap();
        let ids = tok.encode("héllo <|im_end|>", true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), "héllo <|im_end|>");
        assert!(tok.is_eog(tok.token_id("<|im_end|>").unwrap()));
    }

    #[test]
    fn progress_counts_every_part_once_up_to_the_total() {
        let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
        let mut seen = Vec::new();
        let with = build_with_progress(&spec, |done, total| seen.push((done, total)))
            .unwrap()
            .to_bytes();
        let want: Vec<(usize, usize)> = (1..=spec.n_layers + 2)
            .map(|d| (d, spec.n_layers + 2))
            .collect();
        assert_eq!(seen, want);
        assert_eq!(with, build(&spec).unwrap().to_bytes());
    }

    #[test]
    fn llama_preset_has_llama_3_2_1b_parameter_count_and_a_small_one_runs() {
        let spec = SynthSpec::preset_for(Architecture::Llama, "1b", GgmlType::Q8_0).unwrap();
        assert_eq!(spec.n_params(), 1_235_814_400);
        let small = SynthSpec {
            config: ModelConfig {
                n_layers: 2,
                hidden: 64,
                ffn: 128,
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 16,
                vocab: 256 + SPECIALS.len(),
                context_length: 64,
                ..spec.config
            },
            ..spec
        };
        let g = GgufFile::from_bytes(build(&small).unwrap().to_bytes()).unwrap();
        let be = inferno_backend::create_backend("scalar", &Default::default()).unwrap();
        let model = crate::Model::load(&g, be).unwrap();
        assert_eq!(model.config.arch, Architecture::Llama);
        assert_eq!(model.config, small.config);
        let f = model
            .weights
            .rope_freqs
            .as_ref()
            .expect("rope_freqs.weight");
        assert_eq!((f[0], f[7]), (1.0, 32.0));
        assert!(model.weights.layers[0].q_norm.is_none());
        let mut st = model.new_state(4, 4);
        let mut out = vec![0.0; model.config.vocab];
        model
            .forward(&mut st, &[1, 2, 3], crate::Logits::Last(&mut out))
            .unwrap();
        assert!(out.iter().all(|v| v.is_finite()));
        assert!(SynthSpec::preset_for(Architecture::Llama, "0.6b", GgmlType::Q8_0).is_none());
    }

    #[test]
    fn qwen3moe_presets_have_qwen3_30b_a3b_parameter_count_and_the_tiny_one_generates() {
        let full =
            SynthSpec::preset_for(Architecture::Qwen3Moe, "30b-a3b", GgmlType::Q8_0).unwrap();
        // Qwen3-30B-A3B's published total.
        assert_eq!(full.n_params(), 30_532_122_624);
        let tiny = SynthSpec::preset_for(Architecture::Qwen3Moe, "tiny", GgmlType::Q8_0).unwrap();
        let bytes = build(&tiny).unwrap().to_bytes();
        assert_eq!(bytes, build(&tiny).unwrap().to_bytes());
        let g = GgufFile::from_bytes(bytes).unwrap();
        let info = g.tensor_info("blk.1.ffn_down_exps.weight").unwrap();
        assert_eq!(info.dims, vec![32, 64, 8]);
        let be = inferno_backend::create_backend("scalar", &Default::default()).unwrap();
        let model = crate::Model::load(&g, be).unwrap();
        assert_eq!(model.config.arch, Architecture::Qwen3Moe);
        assert_eq!(model.config, tiny.config);
        let crate::Ffn::Moe(m) = &model.weights.layers[0].ffn else {
            panic!("a qwen3moe layer has experts");
        };
        assert_eq!((m.gate.len(), m.down[7].rows, m.down[7].cols), (8, 64, 32));
        // Greedy decoding, token by token, runs and stays inside the vocabulary.
        let mut st = model.new_state(16, 4);
        let mut row = vec![0.0; model.config.vocab];
        model
            .forward(&mut st, &[1, 2, 3], crate::Logits::Last(&mut row))
            .unwrap();
        for _ in 0..8 {
            assert!(row.iter().all(|v| v.is_finite()));
            let id = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap() as u32;
            model
                .forward(&mut st, &[id], crate::Logits::Last(&mut row))
                .unwrap();
        }
        assert_eq!(st.position(), 11);
        assert!(SynthSpec::preset_for(Architecture::Qwen3Moe, "0.6b", GgmlType::Q8_0).is_none());
    }

    #[test]
    fn full_size_preset_has_qwen3_0_6b_parameter_count() {
        let spec = SynthSpec::preset("0.6b", GgmlType::Q8_0).unwrap();
        assert_eq!(spec.n_params(), 596_049_920);
    }
}
