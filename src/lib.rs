//! Inferno: an LLM inference engine for GGUF models, served over gRPC and an
//! OpenAI-compatible HTTP API.

pub use inferno_backend as backend;
pub use inferno_engine as engine;
pub use inferno_gguf as gguf;
pub use inferno_hub as hub;
pub use inferno_model as model;
pub use inferno_sampling as sampling;
pub mod server;
pub use inferno_tensor as tensor;
pub use inferno_tokenizer as tokenizer;
