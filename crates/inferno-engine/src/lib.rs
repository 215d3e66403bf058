//! Running requests against a loaded model.
//!
//! | module | what it owns |
//! |---|---|
//! | [`loader`] | loading a model (file or synthetic, backend, threads, context) for every command |
//! | [`memory`] | the machine's memory, the KV memory and the default context window it allows |
//! | [`plan`] | planning a request from what a client states (prompt, chat, tools, tool choice, response format, reasoning, sampling, limits) in plain types every front-end converts to, with errors that name their field |
//! | [`reply`] | a sequence's events split into reasoning, answer text and tool calls, as front-ends report them |
//! | [`request`] | building a request: chat template, BOS, tokenization, limits; what handlers see ([`Served`], [`EngineState`]) |
//! | [`generate`](mod@generate) | one generation: sampling, stop strings, streamed text, metrics ([`Sequence`]), and [`generate()`] for a single sequence |
//! | [`job`] | a request as the engine thread serves it and the events it sends back |
//! | [`limits`] | the engine's configured and resolved limits |
//! | [`handle`] | the engine thread and its handle ([`Engine`]) |
//! | `scheduler` | each step's decisions: admission, stops, who decodes and who prefills how much |
//! | `step_loop` | the loop that carries the plan out, step by step: the batched forward pass, sampling, ending requests |
//! | `active` | one active (running) request: its rows, its streamed tokens, its final events |
//! | [`speculative`] | speculative decoding: the proposers (n-gram lookup, a draft model), acceptance, how many drafts a step tries |
//! | [`kv_pool`] | the KV-cache budget and the prefix cache |
//! | [`queue`] | the bounded queue of waiting requests |
//! | [`observer`] | what the engine measures, for metrics |
//!
//! Dependencies point one way: `handle` → `step_loop` → `active` → `scheduler`, with the
//! data types (`job`, `limits`, `request`, `loader`) below them all.

mod active;
pub mod generate;
pub mod handle;
pub mod job;
pub mod kv_pool;
pub mod limits;
pub mod loader;
pub mod memory;
pub mod observer;
pub mod plan;
pub mod queue;
pub mod reply;
pub mod request;
mod scheduler;
mod shared;
pub mod speculative;
mod step_loop;

pub use generate::{
    generate, generate_speculative, FinishReason, Flow, GenerateError, GenerateOptions, Generation,
    Metrics, Sequence, Step, TokenEvent, Verified,
};
pub use handle::{Engine, SubmitError};
#[cfg(feature = "fault-injection")]
pub use job::FAULT_PANIC_REQUEST_ID;
pub use job::{
    Done, Event, Job, JobError, Logprobs, Outcome, Protocol, Timings, TokenLogprob, TokenOut,
    MAX_LOGPROBS,
};
pub use kv_pool::KvUsage;
pub use limits::{EngineConfig, Limits};
pub use loader::{EngineAssets, LoadOptions, ModelDescription, DEMO_NOTE};
pub use observer::{NoObserver, Observer};
pub use request::{Built, EngineState, Prompt, Request, RequestError, Served};
