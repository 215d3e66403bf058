//! Random-weight models of a real model's shape: benchmarks need no download, and the
//! service has a built-in demo model. Deterministic for a given seed.
//!
//! The vocabulary is byte-level (the 256 byte tokens of GPT-2's byte encoding, no merges)
//! plus the Qwen special tokens, padded to the preset's vocabulary size.

use crate::gguf::{GgufError, GgufWriter, Value};
use crate::tensor::{float, q8_0, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub name: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub tied: bool,
    /// Type of the 2-D weight matrices (norms stay F32).
    pub dtype: GgmlType,
    pub seed: u64,
}

pub const PRESETS: &[&str] = &["0.6b", "demo"];

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
            n_layers: 28,
            hidden: 1024,
            ffn: 3072,
            n_heads: 16,
            n_kv_heads: 8,
            head_dim: 128,
            vocab: 151_936,
            context_length: 40_960,
            rope_theta: 1_000_000.0,
            rms_eps: 1e-6,
            tied: true,
            dtype,
            seed: 42,
        };
        match name {
            "0.6b" => Some(base),
            "demo" => Some(Self {
                n_layers: 4,
                hidden: 256,
                ffn: 768,
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 64,
                vocab: 256 + SPECIALS.len(),
                context_length: 4096,
                ..base
            }),
            _ => None,
        }
    }

    pub fn n_params(&self) -> usize {
        let (h, qd, kvd) = (
            self.hidden,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        let layer = h * qd * 2 + h * kvd * 2 + 3 * h * self.ffn + 2 * h + 2 * self.head_dim;
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
            crate::tokenizer::ChatTemplate::chatml()
                .source()
                .to_string(),
        ),
    );
}

/// `rows × cols` values from N(0, std²) (Box–Muller), encoded as `dtype`.
fn random_matrix(
    rng: &mut ChaCha8Rng,
    rows: usize,
    cols: usize,
    std: f32,
    dtype: GgmlType,
) -> Vec<u8> {
    let mut vals = vec![0.0f32; rows * cols];
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
    encode(&vals, dtype)
}

fn encode(vals: &[f32], dtype: GgmlType) -> Vec<u8> {
    // The synthesizer only builds shapes whose rows are whole Q8_0 blocks, and only
    // accepts the types `tensor::encode` writes; anything else falls back to f32.
    crate::tensor::encode(vals, dtype).unwrap_or_else(|_| float::f32_to_le_bytes(vals))
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
    #[error("type {0} cannot be written by the synthesizer (use f32, f16, bf16 or q8_0)")]
    UnsupportedType(GgmlType),
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// Builds the whole GGUF in a writer (weights held in memory until written).
pub fn build(spec: &SynthSpec) -> Result<GgufWriter, SynthError> {
    if !matches!(
        spec.dtype,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0
    ) {
        return Err(SynthError::UnsupportedType(spec.dtype));
    }
    let (h, qd, kvd, ffn) = (
        spec.hidden,
        spec.n_heads * spec.head_dim,
        spec.n_kv_heads * spec.head_dim,
        spec.ffn,
    );
    if spec.dtype == GgmlType::Q8_0 && [h, qd, ffn].iter().any(|d| d % q8_0::BLOCK != 0) {
        return Err(SynthError::Shape(format!(
            "Q8_0 needs row lengths that are multiples of 32 (hidden {h}, q {qd}, ffn {ffn})"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut w = GgufWriter::new();
    let a = "qwen3";
    w.add("general.architecture", Value::String(a.into()));
    w.add("general.name", Value::String(spec.name.clone()));
    w.add(
        "general.file_type",
        Value::U32(crate::tensor::file_type(spec.dtype).unwrap_or(0)),
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
    w.add(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(spec.rms_eps),
    );
    tokenizer_metadata(&mut w, spec.vocab);

    let dt = spec.dtype;
    let mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, rng: &mut ChaCha8Rng| {
        let std = 1.0 / (cols as f32).sqrt();
        let data = random_matrix(rng, rows, cols, std, dt);
        w.add_tensor(name, &[cols as u64, rows as u64], dt, data)
            .map(|_| ())
    };
    // Embedding entries of order one, like trained models after the first norm.
    let emb = random_matrix(&mut rng, spec.vocab, h, 1.0, dt);
    w.add_tensor("token_embd.weight", &[h as u64, spec.vocab as u64], dt, emb)?;
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
        w.add_tensor(
            n("ffn_norm.weight"),
            &[h as u64],
            GgmlType::F32,
            random_gain(&mut rng, h),
        )?;
        mat(&mut w, &n("ffn_gate.weight"), ffn, h, &mut rng)?;
        mat(&mut w, &n("ffn_up.weight"), ffn, h, &mut rng)?;
        mat(&mut w, &n("ffn_down.weight"), h, ffn, &mut rng)?;
    }
    w.add_tensor(
        "output_norm.weight",
        &[h as u64],
        GgmlType::F32,
        random_gain(&mut rng, h),
    )?;
    if !spec.tied {
        mat(&mut w, "output.weight", spec.vocab, h, &mut rng)?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    #[test]
    fn demo_model_loads_and_is_deterministic() {
        let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
        let a = build(&spec).unwrap().to_bytes();
        let b = build(&spec).unwrap().to_bytes();
        assert_eq!(a, b);
        let g = GgufFile::from_bytes(a).unwrap();
        let cfg = crate::model::ModelConfig::from_gguf(&g).unwrap();
        assert_eq!(cfg.n_layers, 4);
        assert_eq!(cfg.vocab, spec.vocab);
        let tok = crate::tokenizer::Tokenizer::from_gguf(&g).unwrap();
        let ids = tok.encode("héllo <|im_end|>", true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), "héllo <|im_end|>");
        assert!(tok.is_eog(tok.token_id("<|im_end|>").unwrap()));
    }

    #[test]
    fn full_size_preset_has_qwen3_0_6b_parameter_count() {
        let spec = SynthSpec::preset("0.6b", GgmlType::Q8_0).unwrap();
        assert_eq!(spec.n_params(), 596_049_920);
    }
}
