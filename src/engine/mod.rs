//! Running requests against a loaded model: a single generation ([`generate`]), and the
//! engine thread that serves queued requests one at a time ([`worker`], [`queue`]).

pub mod generate;
pub mod queue;
pub mod worker;

pub use generate::{
    generate, FinishReason, Flow, GenerateError, GenerateOptions, Generation, Metrics, TokenEvent,
};
pub use worker::{Engine, EngineAssets, EngineConfig, EngineState, Event, Job, JobError};
