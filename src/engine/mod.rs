//! Running requests against a loaded model: a single generation ([`generate`]), and the
//! engine thread that serves queued requests in continuous batches ([`worker`], [`batch`],
//! [`queue`]) within a KV-cache budget that also keeps prompt prefixes for reuse
//! ([`kv_pool`]).

pub mod batch;
pub mod generate;
pub mod kv_pool;
pub mod queue;
pub mod worker;

pub use generate::{
    generate, FinishReason, Flow, GenerateError, GenerateOptions, Generation, Metrics, Sequence,
    Step, TokenEvent,
};
pub use kv_pool::KvUsage;
pub use worker::{Engine, EngineAssets, EngineConfig, EngineState, Event, Job, JobError};
