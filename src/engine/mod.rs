//! Running requests against a loaded model: a single generation ([`generate`]).

pub mod generate;

pub use generate::{
    generate, FinishReason, Flow, GenerateError, GenerateOptions, Generation, Metrics, TokenEvent,
};
