//! The model: hyper-parameters ([`config`]), weights ([`weights`]) and the forward pass
//! shared by the Qwen3, Qwen3-MoE, Qwen2 and Llama architectures ([`transformer`]), for one
//! sequence or a batch of them. The pass is written against `backend::exec`, so it runs on
//! every device; the model knows no device itself.

pub mod config;
pub mod synth;
pub mod transformer;
pub mod weights;

pub use config::{Architecture, ModelConfig, MoeConfig};
pub use inferno_backend::{KvCache, Logits, Scratch, SeqStep};
pub use transformer::{Model, State};
pub use weights::{ExpertWeights, Ffn, ModelWeights, MoeWeights};

use inferno_gguf::GgufError;
use inferno_tensor::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {arch:?} (supported: {supported})")]
    UnsupportedArchitecture { arch: String, supported: String },
    #[error("invalid model hyper-parameters: {0}")]
    BadConfig(String),
    #[error("tensor {0:?} is missing from the model file")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor {name:?} has type {dtype}, which the {backend} backend does not support")]
    UnsupportedDtype {
        name: String,
        dtype: GgmlType,
        backend: String,
    },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("the sequence needs {needed} positions but the context holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    #[error("a forward pass of {rows} token rows exceeds the {capacity} rows its buffers hold")]
    BatchTooLarge { rows: usize, capacity: usize },
    #[error("no tokens to process")]
    EmptyInput,
    #[error("logits buffer holds {got} values, {needed} needed")]
    LogitsBuffer { needed: usize, got: usize },
    #[error(transparent)]
    Device(#[from] inferno_backend::DeviceError),
}
