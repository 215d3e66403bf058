//! Inferno: an LLM inference engine for GGUF models, served over gRPC and an
//! OpenAI-compatible HTTP API.
//!
//! This package is the service ([`server`]: the gRPC and HTTP front-ends, which only convert
//! wire types to the engine's) and the `inferno` binary. Each layer below it is a crate of
//! its own, re-exported here under its module name: [`tensor`] (element types and the
//! scalar reference numerics), [`gguf`] (the file format), [`backend`] (the executor
//! interface, CPU kernels, GPU), [`tokenizer`], [`sampling`], [`model`] (config, weights,
//! the forward pass), [`engine`] (requests, scheduler, the engine thread) and [`hub`].

pub use inferno_backend as backend;
pub use inferno_engine as engine;
pub use inferno_gguf as gguf;
pub use inferno_hub as hub;
pub use inferno_model as model;
pub use inferno_sampling as sampling;
pub mod server;
pub use inferno_tensor as tensor;
pub use inferno_tokenizer as tokenizer;
