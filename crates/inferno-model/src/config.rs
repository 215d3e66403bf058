//! Hyper-parameters of a decoder-only model (Qwen3, Qwen3-MoE, Qwen2, Llama), read from GGUF
//! metadata, including how RoPE frequencies are scaled and how tokens are routed to experts.

use super::ModelError;
use inferno_gguf::GgufFile;

/// The architectures this engine runs; they share one forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Qwen3: per-head RMSNorm on queries and keys, no projection biases.
    Qwen3,
    /// Qwen2 / Qwen2.5: biases on the Q, K and V projections, no Q/K norm.
    Qwen2,
    /// Llama 2/3.x, Mistral, SmolLM: no Q/K norm, projection biases only where the file has
    /// them, Q/K rows stored permuted for interleaved-pair RoPE, RoPE frequencies that may be
    /// scaled (linear, Llama 3, or per-dimension factors in `rope_freqs.weight`).
    Llama,
    /// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention, and in every block a
    /// mixture of SwiGLU experts in place of the dense MLP (see [`MoeConfig`]).
    Qwen3Moe,
}

impl Architecture {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(Self::Qwen3),
            "qwen2" => Some(Self::Qwen2),
            "llama" => Some(Self::Llama),
            "qwen3moe" => Some(Self::Qwen3Moe),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Qwen2 => "qwen2",
            Self::Llama => "llama",
            Self::Qwen3Moe => "qwen3moe",
        }
    }
}

pub const SUPPORTED_ARCHITECTURES: &[&str] = &["qwen3", "qwen2", "llama", "qwen3moe"];

/// A mixture-of-experts MLP (`{arch}.expert_*` keys): a router scores the `n_experts`
/// experts for each token, the `n_used` most probable after a softmax run on it, and their
/// outputs are summed weighted by those probabilities, renormalised to sum to one when
/// `normalize` (transformers' `norm_topk_prob`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub n_used: usize,
    /// Rows of each expert's gate and up projections.
    pub expert_ffn: usize,
    pub normalize: bool,
}

/// How the RoPE inverse frequencies `base^(-2i/d)` are rescaled for a longer context
/// (`{arch}.rope.scaling.*`). A `rope_freqs.weight` tensor (per-dimension divisors, what
/// llama.cpp's converter writes for Llama 3.x) is applied on top by the model, not here.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Every frequency divided by `factor` (positions interpolated).
    Linear {
        factor: f32,
    },
    /// Llama 3.1's scheme: low frequencies divided by `factor`, high ones kept, a smooth
    /// blend between the two wavelength bounds `original_context / {low,high}_freq_factor`.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
    /// YaRN (Qwen3 past 32k, and many long-context fine-tunes): frequencies whose wavelength
    /// fits many times in the original context are kept (extrapolated), those that fit
    /// fewer than `beta_slow` times are divided by `factor` (interpolated), with a linear ramp
    /// over the dimensions between; and the attention logits are sharpened by
    /// `attn_factor²` (cos and sin are both scaled by `attn_factor`, `0.1·ln(factor) + 1`
    /// unless the file says otherwise).
    Yarn {
        factor: f32,
        original_context: f32,
        beta_fast: f32,
        beta_slow: f32,
        attn_factor: f32,
    },
}

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
    pub rope_scaling: RopeScaling,
    pub rms_eps: f32,
    /// The experts of a mixture-of-experts architecture (Qwen3-MoE); `None` for dense MLPs.
    pub moe: Option<MoeConfig>,
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
        let rope_scaling = read_rope_scaling(gguf, p)?;
        if let Some(v) = gguf.get(&key("rope.dimension_count")) {
            let dims = v.as_u64().unwrap_or(0) as usize;
            if dims != head_dim {
                return Err(ModelError::BadConfig(format!(
                    "rope.dimension_count {dims} differs from the head size {head_dim}: \
                     partial RoPE is not supported"
                )));
            }
        }
        let vocab = match gguf.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(tokens) => tokens.len(),
            None => 0,
        };
        let ffn = gguf.get_u64(&key("feed_forward_length"))? as usize;
        let moe = match arch {
            Architecture::Qwen3Moe => Some(read_moe(gguf, p, ffn)?),
            _ => None,
        };
        let cfg = Self {
            arch,
            n_layers: gguf.get_u64(&key("block_count"))? as usize,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_length: gguf.get_u64(&key("context_length"))? as usize,
            rope_theta,
            rope_scaling,
            rms_eps: gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            moe,
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
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                if !(factor.is_finite() && factor > 0.0) {
                    return bad(format!("rope.scaling.factor {factor} must be positive"));
                }
            }
            RopeScaling::Yarn { .. } => {}
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                let ok = |v: f32| v.is_finite() && v > 0.0;
                if !(ok(factor)
                    && ok(low_freq_factor)
                    && ok(high_freq_factor)
                    && ok(original_context))
                    || high_freq_factor <= low_freq_factor
                {
                    return bad(format!(
                        "llama3 rope scaling (factor {factor}, low {low_freq_factor}, high \
                         {high_freq_factor}, original context {original_context}) needs positive \
                         values and high > low"
                    ));
                }
            }
        }
        if let RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            attn_factor,
        } = self.rope_scaling
        {
            let ok = |v: f32| v.is_finite() && v > 0.0;
            if !(ok(factor)
                && ok(original_context)
                && ok(beta_fast)
                && ok(beta_slow)
                && ok(attn_factor))
                || beta_fast <= beta_slow
            {
                return bad(format!(
                    "yarn rope scaling (factor {factor}, original context {original_context}, \
                     beta fast {beta_fast} / slow {beta_slow}, attention factor {attn_factor}) \
                     needs positive values and beta fast > slow"
                ));
            }
        }
        if let Some(m) = self.moe {
            if m.n_experts == 0 || m.n_experts > 1 << 16 {
                return bad(format!(
                    "expert_count = {} is out of range (1..=65536)",
                    m.n_experts
                ));
            }
            if m.n_used == 0 || m.n_used > m.n_experts {
                return bad(format!(
                    "expert_used_count = {} must be between 1 and expert_count {}",
                    m.n_used, m.n_experts
                ));
            }
            if m.expert_ffn == 0 || m.expert_ffn > LIMIT {
                return bad(format!(
                    "expert_feed_forward_length = {} is out of range (1..={LIMIT})",
                    m.expert_ffn
                ));
            }
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

    /// RoPE inverse frequencies after the metadata's scaling, formed in f32 step by step as
    /// transformers forms them (`_compute_default_rope_parameters`, and for Llama 3
    /// `_compute_llama3_parameters`).
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let base = (0..self.head_dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f32 / self.head_dim as f32));
        match self.rope_scaling {
            RopeScaling::None => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                let low_wavelen = original_context / low_freq_factor;
                let high_wavelen = original_context / high_freq_factor;
                base.map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
                ..
            } => {
                // transformers' `_compute_yarn_parameters`: the correction range in f64,
                // truncated to whole dimensions, then the blend in f32.
                let dim = self.head_dim as f64;
                let base = self.rope_theta as f64;
                let correction_dim = |rotations: f64| {
                    dim * (original_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * base.ln())
                };
                let low = correction_dim(beta_fast as f64).floor().max(0.0) as f32;
                let high = correction_dim(beta_slow as f64).ceil().min(dim - 1.0) as f32;
                let high = if low == high { high + 0.001 } else { high };
                (0..self.head_dim / 2)
                    .map(|i| {
                        let pos_freq = self.rope_theta.powf((2 * i) as f32 / self.head_dim as f32);
                        let extrapolation = 1.0 / pos_freq;
                        let interpolation = 1.0 / (factor * pos_freq);
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        interpolation * (1.0 - keep) + extrapolation * keep
                    })
                    .collect()
            }
        }
    }

    /// The factor attention logits are multiplied by beyond `1/√head_dim`: YaRN's
    /// attention factor squared (it scales the rotated queries and keys alike), else 1.
    pub fn attention_logit_factor(&self) -> f32 {
        match self.rope_scaling {
            RopeScaling::Yarn { attn_factor, .. } => attn_factor * attn_factor,
            _ => 1.0,
        }
    }
}

/// Reads the `{arch}.expert_*` keys as llama.cpp's converter writes them for Qwen3-MoE:
/// `expert_count` and `expert_used_count` (required), `expert_feed_forward_length` (llama.cpp
/// falls back to `feed_forward_length / expert_used_count`, and so does this). llama.cpp always
/// renormalises the chosen weights for qwen3moe, which is Qwen3-MoE's released setting;
/// `expert_weights_norm` (the key llama.cpp reads for other MoE architectures) may say
/// `false`, for checkpoints with `norm_topk_prob` off. Qwen3-MoE has no shared expert: a file
/// that declares one (`expert_shared_feed_forward_length`) is refused rather than run without
/// it.
fn read_moe(gguf: &GgufFile, arch: &str, ffn: usize) -> Result<MoeConfig, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let required = |k: &str| -> Result<usize, ModelError> {
        match gguf.get(&key(k)) {
            Some(_) => Ok(gguf.get_u64(&key(k))? as usize),
            None => Err(ModelError::BadConfig(format!(
                "a {arch} model needs {}",
                key(k)
            ))),
        }
    };
    let n_experts = required("expert_count")?;
    let n_used = required("expert_used_count")?;
    let expert_ffn = match gguf.get(&key("expert_feed_forward_length")) {
        Some(_) => gguf.get_u64(&key("expert_feed_forward_length"))? as usize,
        None => ffn / n_used.max(1),
    };
    if let Some(v) = gguf.get(&key("expert_shared_feed_forward_length")) {
        if v.as_u64() != Some(0) {
            return Err(ModelError::BadConfig(format!(
                "{} is set, but shared experts are not part of {arch}",
                key("expert_shared_feed_forward_length")
            )));
        }
    }
    let normalize = match gguf.get(&key("expert_weights_norm")) {
        Some(v) => v.as_bool().ok_or_else(|| {
            ModelError::BadConfig(format!("{} must be a bool", key("expert_weights_norm")))
        })?,
        None => true,
    };
    Ok(MoeConfig {
        n_experts,
        n_used,
        expert_ffn,
        normalize,
    })
}

/// Reads `{arch}.rope.scaling.*`. `type` is llama.cpp's `none`/`linear` (with `factor`), or
/// `llama3` with `factor`, `original_context_length` and this engine's
/// `low_freq_factor`/`high_freq_factor` keys (default 1 and 4, Llama 3.1's values), or `yarn`
/// with `factor`, `original_context_length` and llama.cpp's optional `yarn_beta_fast`,
/// `yarn_beta_slow` and `yarn_attn_factor` (a multiplier of the default attention factor, as
/// in llama.cpp); other types (LongRoPE) are refused rather than run unscaled.
fn read_rope_scaling(gguf: &GgufFile, arch: &str) -> Result<RopeScaling, ModelError> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let f32_or = |k: &str, default: f32| -> Result<f32, ModelError> {
        match gguf.get(&key(k)) {
            Some(_) => Ok(gguf.get_f32(&key(k))?),
            None => Ok(default),
        }
    };
    let kind = match gguf.get(&key("type")) {
        Some(_) => gguf.get_str(&key("type"))?.to_string(),
        None => return Ok(RopeScaling::None),
    };
    match kind.as_str() {
        "none" => Ok(RopeScaling::None),
        "linear" => {
            let factor = f32_or("factor", 1.0)?;
            Ok(RopeScaling::Linear { factor })
        }
        "llama3" => {
            let original_context = match gguf.get(&key("original_context_length")) {
                Some(_) => gguf.get_u64(&key("original_context_length"))? as f32,
                None => {
                    return Err(ModelError::BadConfig(format!(
                        "llama3 rope scaling needs {}",
                        key("original_context_length")
                    )))
                }
            };
            Ok(RopeScaling::Llama3 {
                factor: f32_or("factor", 8.0)?,
                low_freq_factor: f32_or("low_freq_factor", 1.0)?,
                high_freq_factor: f32_or("high_freq_factor", 4.0)?,
                original_context,
            })
        }
        "yarn" => {
            let original_context = match gguf.get(&key("original_context_length")) {
                Some(_) => gguf.get_u64(&key("original_context_length"))? as f32,
                None => {
                    return Err(ModelError::BadConfig(format!(
                        "yarn rope scaling needs {}",
                        key("original_context_length")
                    )))
                }
            };
            let factor = f32_or("factor", 1.0)?;
            // llama.cpp's keys; its default attention factor is YaRN's 0.1·ln(factor) + 1.
            let default_attn = if factor > 1.0 {
                0.1 * factor.ln() + 1.0
            } else {
                1.0
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast: f32_or("yarn_beta_fast", 32.0)?,
                beta_slow: f32_or("yarn_beta_slow", 1.0)?,
                attn_factor: match gguf.get(&key("yarn_attn_factor")) {
                    Some(_) => gguf.get_f32(&key("yarn_attn_factor"))? * default_attn,
                    None => default_attn,
                },
            })
        }
        other => Err(ModelError::BadConfig(format!(
            "rope scaling type {other:?} is not supported (supported: none, linear, llama3, yarn)"
        ))),
    }
}
