//! The model's tensors, looked up by their GGUF names and checked against the config.
//!
//! A mixture-of-experts layer's experts are stored stacked, one 3-D tensor per projection
//! (`ffn_{gate,up,down}_exps`, the expert the slowest dimension); each expert's rows are one
//! contiguous run of bytes, so every expert is a [`Matrix`] viewing its part of the mapped
//! file, nothing copied ([`ExpertWeights::Mapped`]), or, when the loader says so, prepared
//! like every other matrix ([`ExpertWeights::Prepared`]: repacked for the CPU kernels). On
//! the GPU the stack is uploaded whole, once per projection (`Device::prepare_experts`), so
//! one dispatch reaches every expert.
//!
//! Llama files store the Q and K projection rows permuted (llama.cpp's converter reorders
//! each head so that RoPE rotates adjacent pairs); they are put back in transformers' order
//! here, so every backend runs one RoPE (pairs `i`, `i + d/2`) for every architecture. The
//! permutation only moves whole rows (each quantized independently), so it is exact for
//! every weight type, and a query·key dot product does not depend on the order of the
//! dimensions it sums over.

use super::{Architecture, ModelConfig, ModelError};
use inferno_backend::Device;
use inferno_gguf::GgufFile;
use inferno_tensor::{self as tensor, GgmlType, Matrix, TensorBytes, Vector};
use rayon::prelude::*;

/// One transformer block's weights.
pub struct LayerWeights {
    pub attn_norm: Vector,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    /// Projection biases (Qwen2's Q/K/V; Llama's only where the checkpoint has them).
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    pub bo: Option<Vector>,
    /// Qwen3's per-head RMSNorm gains on queries and keys.
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
    pub ffn_norm: Vector,
    pub ffn: Ffn,
}

/// A block's MLP.
pub enum Ffn {
    /// `Wdown · (SiLU(Wgate · m) ⊙ Wup · m)`.
    Dense {
        gate: Matrix,
        up: Matrix,
        down: Matrix,
    },
    /// A mixture of SwiGLU experts chosen per token by a router.
    Moe(MoeWeights),
}

/// One layer's experts: the router (`[n_experts, hidden]`) and each expert's projections,
/// indexed by expert.
pub struct MoeWeights {
    pub router: Matrix,
    pub gate: Vec<Matrix>,
    pub up: Vec<Matrix>,
    pub down: Vec<Matrix>,
    /// Experts each token uses, and whether their weights are renormalised (see
    /// [`super::config::MoeConfig`]).
    pub used: usize,
    pub normalize: bool,
}

/// How a mixture-of-experts model's expert matrices are loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertWeights {
    /// Left in the memory-mapped file in their stored layout: only the pages of the experts
    /// tokens are routed to are ever read, and a model larger than memory still runs; the
    /// CPU kernels multiply them one weight row and token at a time.
    #[default]
    Mapped,
    /// Prepared by the device like the dense matrices: on the CPU backends repacked for the
    /// multi-row integer kernels (several times faster for prompts, which route many rows
    /// to each expert), their mapped pages released, so every expert is read once at load
    /// and stays resident.
    Prepared,
}

pub struct ModelWeights {
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vector,
    /// The LM head: `output.weight`, or the token embedding when the model ties them.
    pub output: Matrix,
    pub tied_embeddings: bool,
    /// `rope_freqs.weight`: a divisor per RoPE frequency (Llama 3.x as converted by llama.cpp).
    pub rope_freqs: Option<Vec<f32>>,
}

struct Loader<'a> {
    gguf: &'a GgufFile,
    device: &'a Device,
    experts: ExpertWeights,
}

impl Loader<'_> {
    /// A 2-D matrix with `rows` rows of `cols` values.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        self.matrix_rows(name, rows, cols, None)
    }

    /// A matrix whose rows are Q or K heads of `head_dim` rows each in llama.cpp's
    /// interleaved order, read back into transformers' order (see the module doc).
    fn head_matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        head_dim: usize,
    ) -> Result<Matrix, ModelError> {
        self.matrix_rows(name, rows, cols, Some(head_dim))
    }

    /// A matrix, its rows unpermuted by heads of `heads` rows when given.
    fn matrix_rows(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        heads: Option<usize>,
    ) -> Result<Matrix, ModelError> {
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
        if let Some(head_dim) = heads {
            let rb = m.row_bytes();
            let src = m.data.as_slice();
            let mut out = Vec::with_capacity(src.len());
            for r in 0..rows {
                let from = unpermuted_row(r, head_dim);
                out.extend_from_slice(&src[from * rb..(from + 1) * rb]);
            }
            m.data = TensorBytes::from_vec(out);
        }
        self.device.prepare_matrix(&mut m)?;
        Ok(m)
    }

    /// The `n` experts of a stacked 3-D tensor (GGUF dims `[cols, rows, n]`), each a matrix
    /// of `rows × cols` viewing its bytes in the file.
    fn experts(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Matrix>, ModelError> {
        let info = self
            .gguf
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let want = [cols as u64, rows as u64, n as u64];
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
        let data = self.gguf.tensor_data(name)?;
        let row_bytes = info.dtype.row_size(cols as u64).unwrap_or(0) as usize;
        let size = rows * row_bytes;
        let mut experts = (0..n)
            .map(|e| {
                let bytes = data
                    .slice(e * size, size)
                    .ok_or_else(|| ModelError::TensorShape {
                        name: name.to_string(),
                        expected: want.to_vec(),
                        found: info.dims.clone(),
                    })?;
                let m = Matrix {
                    name: format!("{name}[{e}]"),
                    dtype: info.dtype,
                    rows,
                    cols,
                    data: bytes,
                    prepared: None,
                };
                Ok(m)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        // The CPU kernels multiply every type in its stored layout with the same bits as the
        // packed one, so the choice changes speed and memory only. The experts are repacked
        // side by side: most of the work is the kernel faulting in and releasing pages,
        // which the threads then share. (The GPU takes the whole stack below.)
        if self.experts == ExpertWeights::Prepared && !self.device.is_gpu() {
            experts
                .par_iter_mut()
                .try_for_each(|m| self.device.prepare_matrix(m))?;
        }
        if self.device.is_gpu() {
            let stacked = Matrix {
                name: name.to_string(),
                dtype: info.dtype,
                rows: n * rows,
                cols,
                data,
                prepared: None,
            };
            self.device.prepare_experts(&stacked, &mut experts)?;
        }
        Ok(experts)
    }

    /// A bias of Q or K heads, reordered as [`Loader::head_matrix`] reorders rows.
    fn optional_head_vector(
        &self,
        name: &str,
        len: usize,
        head_dim: usize,
    ) -> Result<Option<Vector>, ModelError> {
        if self.gguf.tensor_info(name).is_none() {
            return Ok(None);
        }
        let raw = self.raw_vector(name, len)?;
        let v: Vec<f32> = (0..len).map(|r| raw[unpermuted_row(r, head_dim)]).collect();
        let mut v = Vector::new(name, v);
        self.device.prepare_vector(&mut v)?;
        Ok(Some(v))
    }

    /// A 1-D vector of `len` values (norm gains, biases), widened to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vector, ModelError> {
        let mut v = Vector::new(name, self.raw_vector(name, len)?);
        self.device.prepare_vector(&mut v)?;
        Ok(v)
    }

    /// The values of a 1-D tensor of `len` values, widened to f32.
    fn raw_vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
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
        Ok(out)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vector>, ModelError> {
        match self.gguf.tensor_info(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }
}

/// Where row `r` (in transformers' order) of a permuted Q/K matrix is stored: within each
/// head, transformers' row `j * d/2 + i` (half `j`, pair `i`) is llama.cpp's row `2i + j`.
fn unpermuted_row(r: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (head, k) = (r / head_dim, r % head_dim);
    let (j, i) = (k / half, k % half);
    head * head_dim + 2 * i + j
}

impl ModelWeights {
    pub fn load(
        gguf: &GgufFile,
        cfg: &ModelConfig,
        device: &Device,
        experts: ExpertWeights,
    ) -> Result<Self, ModelError> {
        let ld = Loader {
            gguf,
            device,
            experts,
        };
        let (h, qd, kvd, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let token_embd = ld.matrix("token_embd.weight", cfg.vocab, h)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let (q_norm, k_norm, bq, bk, bv, bo) = match cfg.arch {
                Architecture::Qwen3 | Architecture::Qwen3Moe => (
                    Some(ld.vector(&n("attn_q_norm.weight"), hd)?),
                    Some(ld.vector(&n("attn_k_norm.weight"), hd)?),
                    None,
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
                    None,
                ),
                Architecture::Llama => (
                    None,
                    None,
                    ld.optional_head_vector(&n("attn_q.bias"), qd, hd)?,
                    ld.optional_head_vector(&n("attn_k.bias"), kvd, hd)?,
                    ld.optional_vector(&n("attn_v.bias"), kvd)?,
                    ld.optional_vector(&n("attn_output.bias"), h)?,
                ),
            };
            let (wq, wk) = match cfg.arch {
                Architecture::Llama => (
                    ld.head_matrix(&n("attn_q.weight"), qd, h, hd)?,
                    ld.head_matrix(&n("attn_k.weight"), kvd, h, hd)?,
                ),
                _ => (
                    ld.matrix(&n("attn_q.weight"), qd, h)?,
                    ld.matrix(&n("attn_k.weight"), kvd, h)?,
                ),
            };
            let ffn = match cfg.moe {
                None => Ffn::Dense {
                    gate: ld.matrix(&n("ffn_gate.weight"), cfg.ffn, h)?,
                    up: ld.matrix(&n("ffn_up.weight"), cfg.ffn, h)?,
                    down: ld.matrix(&n("ffn_down.weight"), h, cfg.ffn)?,
                },
                Some(moe) => {
                    let (e, f) = (moe.n_experts, moe.expert_ffn);
                    Ffn::Moe(MoeWeights {
                        router: ld.matrix(&n("ffn_gate_inp.weight"), e, h)?,
                        gate: ld.experts(&n("ffn_gate_exps.weight"), e, f, h)?,
                        up: ld.experts(&n("ffn_up_exps.weight"), e, f, h)?,
                        down: ld.experts(&n("ffn_down_exps.weight"), e, h, f)?,
                        used: moe.n_used,
                        normalize: moe.normalize,
                    })
                }
            };
            layers.push(LayerWeights {
                attn_norm: ld.vector(&n("attn_norm.weight"), h)?,
                wq,
                wk,
                wv: ld.matrix(&n("attn_v.weight"), kvd, h)?,
                wo: ld.matrix(&n("attn_output.weight"), h, qd)?,
                bq,
                bk,
                bv,
                bo,
                q_norm,
                k_norm,
                ffn_norm: ld.vector(&n("ffn_norm.weight"), h)?,
                ffn,
            });
        }
        let (output, tied_embeddings) = match gguf.tensor_info("output.weight") {
            Some(_) => (ld.matrix("output.weight", cfg.vocab, h)?, false),
            None => (token_embd.clone(), true),
        };
        let rope_freqs = match gguf.tensor_info("rope_freqs.weight") {
            Some(_) => Some(ld.raw_vector("rope_freqs.weight", hd / 2)?),
            None => None,
        };
        let output_norm = ld.vector("output_norm.weight", h)?;
        // Every tensor is read: the repacked ones' pages that later reads mapped back in
        // (a fault maps a whole large folio) leave resident memory for good.
        gguf.release_again();
        Ok(Self {
            token_embd,
            layers,
            output_norm,
            output,
            tied_embeddings,
            rope_freqs,
        })
    }

    /// The most common matrix type (the file's effective quantization).
    pub fn main_dtype(&self) -> GgmlType {
        self.layers
            .first()
            .map(|l| match &l.ffn {
                Ffn::Dense { gate, .. } => gate.dtype,
                Ffn::Moe(m) => m.gate.first().map_or(m.router.dtype, |g| g.dtype),
            })
            .unwrap_or(self.token_embd.dtype)
    }
}
