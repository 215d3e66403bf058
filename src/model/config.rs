//! Hyper-parameters of a Qwen-family model, read from GGUF metadata.

use super::ModelError;
use crate::gguf::GgufFile;

/// The architectures this engine runs; they share one forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Qwen3: per-head RMSNorm on queries and keys, no projection biases.
    Qwen3,
    /// Qwen2 / Qwen2.5: biases on the Q, K and V projections, no Q/K norm.
    Qwen2,
}

impl Architecture {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(Self::Qwen3),
            "qwen2" => Some(Self::Qwen2),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Qwen2 => "qwen2",
        }
    }
}

pub const SUPPORTED_ARCHITECTURES: &[&str] = &["qwen3", "qwen2"];

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
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
}

impl ModelConfig {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = gguf.architecture()?;
        let arch = Architecture::from_name(arch_name).ok_or_else(|| {
            ModelError::UnsupportedArchitecture {
                arch: arch_name.to_string(),
                supported: SUPPORTED_ARCHITECTURES.join(", "),
            }
        })?;
        let p = arch.name();
        let key = |k: &str| format!("{p}.{k}");
        let n_heads = gguf.get_u64(&key("attention.head_count"))? as usize;
        let hidden = gguf.get_u64(&key("embedding_length"))? as usize;
        let head_dim = match gguf.get(&key("attention.key_length")) {
            Some(_) => gguf.get_u64(&key("attention.key_length"))? as usize,
            None if n_heads > 0 => hidden / n_heads,
            None => 0,
        };
        let n_kv_heads = match gguf.get(&key("attention.head_count_kv")) {
            Some(_) => gguf.get_u64(&key("attention.head_count_kv"))? as usize,
            None => n_heads,
        };
        let rope_theta = match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let vocab = match gguf.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(tokens) => tokens.len(),
            None => 0,
        };
        let cfg = Self {
            arch,
            n_layers: gguf.get_u64(&key("block_count"))? as usize,
            hidden,
            ffn: gguf.get_u64(&key("feed_forward_length"))? as usize,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_length: gguf.get_u64(&key("context_length"))? as usize,
            rope_theta,
            rms_eps: gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Rejects hyper-parameters the forward pass cannot run with.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::BadConfig(msg));
        const LIMIT: usize = 1 << 24;
        for (name, v) in [
            ("block_count", self.n_layers),
            ("embedding_length", self.hidden),
            ("feed_forward_length", self.ffn),
            ("attention.head_count", self.n_heads),
            ("attention.head_count_kv", self.n_kv_heads),
            ("attention.key_length", self.head_dim),
            ("context_length", self.context_length),
        ] {
            if v == 0 || v > LIMIT {
                return bad(format!("{name} = {v} is out of range (1..={LIMIT})"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "key_length {} must be even for RoPE",
                self.head_dim
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!(
                "rope.freq_base {} must be positive",
                self.rope_theta
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad(format!(
                "layer_norm_rms_epsilon {} is invalid",
                self.rms_eps
            ));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// RoPE inverse frequencies, formed in f32 as the reference implementation does.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        (0..self.head_dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f32 / self.head_dim as f32))
            .collect()
    }
}
