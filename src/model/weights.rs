//! The model's tensors, looked up by their GGUF names and checked against the config.

use super::{Architecture, ModelConfig, ModelError};
use crate::backend::Device;
use crate::gguf::GgufFile;
use crate::tensor::{self, GgmlType, Matrix, Vector};

/// One transformer block's weights.
pub struct LayerWeights {
    pub attn_norm: Vector,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    /// Qwen2's projection biases.
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    /// Qwen3's per-head RMSNorm gains on queries and keys.
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
    pub ffn_norm: Vector,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

pub struct ModelWeights {
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vector,
    /// The LM head: `output.weight`, or the token embedding when the model ties them.
    pub output: Matrix,
    pub tied_embeddings: bool,
}

struct Loader<'a> {
    gguf: &'a GgufFile,
    device: &'a Device,
}

impl Loader<'_> {
    /// A 2-D matrix with `rows` rows of `cols` values.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        let info = self
            .gguf
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let want = [cols as u64, rows as u64];
        if info.dims != want {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: want.to_vec(),
                found: info.dims.clone(),
            });
        }
        if !self.device.supports(info.dtype) {
            return Err(ModelError::UnsupportedDtype {
                name: name.to_string(),
                dtype: info.dtype,
                backend: self.device.name().to_string(),
            });
        }
        let mut m = Matrix {
            name: name.to_string(),
            dtype: info.dtype,
            rows,
            cols,
            data: self.gguf.tensor_data(name)?,
            prepared: None,
        };
        self.device.prepare_matrix(&mut m)?;
        Ok(m)
    }

    /// A 1-D vector of `len` values (norm gains, biases), widened to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vector, ModelError> {
        let info = self
            .gguf
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if info.n_elements() != len as u64 || info.dims.iter().filter(|&&d| d != 1).count() > 1 {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: vec![len as u64],
                found: info.dims.clone(),
            });
        }
        // Vectors are widened to f32 on load, so any type the scalar code reads will do.
        let unsupported = || ModelError::UnsupportedDtype {
            name: name.to_string(),
            dtype: info.dtype,
            backend: self.device.name().to_string(),
        };
        if !tensor::is_supported(info.dtype) {
            return Err(unsupported());
        }
        let mut out = vec![0.0f32; len];
        tensor::dequantize_row(
            info.dtype,
            self.gguf.tensor_data(name)?.as_slice(),
            &mut out,
        )
        .map_err(|_| unsupported())?;
        let mut v = Vector::new(name, out);
        self.device.prepare_vector(&mut v)?;
        Ok(v)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vector>, ModelError> {
        match self.gguf.tensor_info(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }
}

impl ModelWeights {
    pub fn load(gguf: &GgufFile, cfg: &ModelConfig, device: &Device) -> Result<Self, ModelError> {
        let ld = Loader { gguf, device };
        let (h, qd, kvd, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let token_embd = ld.matrix("token_embd.weight", cfg.vocab, h)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let (q_norm, k_norm, bq, bk, bv) = match cfg.arch {
                Architecture::Qwen3 => (
                    Some(ld.vector(&n("attn_q_norm.weight"), hd)?),
                    Some(ld.vector(&n("attn_k_norm.weight"), hd)?),
                    None,
                    None,
                    None,
                ),
                Architecture::Qwen2 => (
                    None,
                    None,
                    ld.optional_vector(&n("attn_q.bias"), qd)?,
                    ld.optional_vector(&n("attn_k.bias"), kvd)?,
                    ld.optional_vector(&n("attn_v.bias"), kvd)?,
                ),
            };
            layers.push(LayerWeights {
                attn_norm: ld.vector(&n("attn_norm.weight"), h)?,
                wq: ld.matrix(&n("attn_q.weight"), qd, h)?,
                wk: ld.matrix(&n("attn_k.weight"), kvd, h)?,
                wv: ld.matrix(&n("attn_v.weight"), kvd, h)?,
                wo: ld.matrix(&n("attn_output.weight"), h, qd)?,
                bq,
                bk,
                bv,
                q_norm,
                k_norm,
                ffn_norm: ld.vector(&n("ffn_norm.weight"), h)?,
                w_gate: ld.matrix(&n("ffn_gate.weight"), cfg.ffn, h)?,
                w_up: ld.matrix(&n("ffn_up.weight"), cfg.ffn, h)?,
                w_down: ld.matrix(&n("ffn_down.weight"), h, cfg.ffn)?,
            });
        }
        let (output, tied_embeddings) = match gguf.tensor_info("output.weight") {
            Some(_) => (ld.matrix("output.weight", cfg.vocab, h)?, false),
            None => (token_embd.clone(), true),
        };
        Ok(Self {
            token_embd,
            layers,
            output_norm: ld.vector("output_norm.weight", h)?,
            output,
            tied_embeddings,
        })
    }

    /// The most common matrix type (the file's effective quantization).
    pub fn main_dtype(&self) -> GgmlType {
        self.layers
            .first()
            .map(|l| l.w_gate.dtype)
            .unwrap_or(self.token_embd.dtype)
    }
}
