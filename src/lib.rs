//! Inferno: an LLM inference engine for GGUF models, served over gRPC and an
//! OpenAI-compatible HTTP API.

pub mod backend;
pub mod cli;
pub mod engine;
pub mod gguf;
pub mod hub;
pub mod model;
pub mod sampling;
pub mod server;
pub mod tensor;
pub mod tokenizer;

#[cfg(test)]
pub(crate) mod test_rng;
