//! `inferno bench`: prompt-processing and generation throughput in the manner of llama.cpp's
//! `llama-bench`, so the two can be run side by side on one file.
//!
//! For each backend × thread count the model is loaded once; each test (`ppN`: one forward
//! pass over N random tokens; `tgN`: N single-token steps) runs once to warm up, then
//! `--repetitions` times, each on a fresh sequence first filled with `--depth` tokens
//! (untimed). Reported: tokens per second, mean ± sample standard deviation.
//!
//! With `--streams S` above 1 a generation test decodes S sequences at once, as the engine
//! does for concurrent requests: each of the N steps is one batched forward pass over one new
//! token of every sequence (each first filled with `--depth` + 1 random tokens, untimed), and
//! the figure is the aggregate: S × N tokens over the time of the N steps.
//!
//! With `--json-schema FILE` (or `--json-object`) each generation test instead runs twice,
//! alternating, on the same streams and token count: unconstrained and constrained. Both
//! decode as the engine does, not by feeding random tokens: every step is one batched
//! forward pass (for one stream too, as in the engine), then each stream's engine
//! [`Sequence`](crate::engine::generate::Sequence) picks its next token greedily from the logits (for the constrained run:
//! waits for the grammar mask its `MaskWorker` computed during the forward pass, masks
//! the logits, samples, commits, and starts the next mask). The engine's scheduler is not
//! involved. Reported besides both figures: their ratio and the per-token mask time and
//! wait. A stream whose grammar completes (or that picks end-of-generation where the
//! grammar allows it) starts over at the grammar's start, so every test decodes all N
//! tokens of every stream; the number of such restarts is reported.
//!
//! With `--speculative ngram|draft` each generation test (one stream) also runs twice,
//! alternating: without and with speculative decoding, both decoding greedily as `generate`
//! does (the single-sequence [`generate_speculative`](crate::engine::generate::generate_speculative)) from the test's context — random
//! tokens, or the text of `--prompt-file` — and reporting the decode rate after the first
//! token. The speculative row adds the ratio, the drafted and accepted tokens, the
//! acceptance rate and the mean accepted drafts per verification.
//!
//! Running the tests is `measure`'s; the table or JSON they are shown as, `report`'s.

mod measure;
mod report;

pub(super) use report::bytes_shown;

use crate::sampling::constraint::ResponseFormat;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
// llama-bench's names for the cache types, and help worded for a benchmark.
#[command(
    mut_arg("cache_type_k", |a| a.visible_alias("ctk")),
    mut_arg("cache_type_v", |a| a
        .visible_alias("ctv")
        .help("Type the KV cache stores values as (default as for keys)")),
    mut_arg("experts", |a| a.help(
        "How a mixture-of-experts model's experts are loaded: auto, repack or mmap (as for \
         `serve`)"
    ))
)]
pub struct BenchArgs {
    /// The model to time.
    #[command(flatten)]
    pub model: super::args::ModelSource,
    /// Backends to compare (comma-separated).
    #[arg(long, short = 'b', value_delimiter = ',', default_value = "pool")]
    pub backend: Vec<String>,
    /// Thread counts (comma-separated; 0 = INFERNO_THREADS if set, else the machine's
    /// physical performance cores).
    #[arg(long, short = 't', value_delimiter = ',', default_value = "0")]
    pub threads: Vec<usize>,
    /// Prompt lengths to time (comma-separated; 0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generated-token counts to time (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Tokens already in the context before each test (comma-separated).
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<usize>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Prompt tokens per forward pass.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// text: a llama-bench style table; json: every result with its samples.
    #[arg(long, short = 'o', value_enum, default_value_t = super::args::OutputFormat::Text)]
    pub output: super::args::OutputFormat,
    /// After each backend's tests, leave it without work for 1 s, then report the process's
    /// CPU use over this many seconds (Linux; 0 skips).
    #[arg(long, default_value_t = 0.0)]
    pub idle_check: f64,
    /// Measure the memory read bandwidth at each thread count and report each generation
    /// test's roofline: the tokens/s reached if every step only streamed the weights and
    /// the KV cache from memory at that bandwidth.
    #[arg(long)]
    pub roofline: bool,
    /// Sequences decoded together in each generation test (comma-separated): every step is
    /// one batched forward pass over one token of each.
    #[arg(short = 's', long, value_delimiter = ',', default_value = "1")]
    pub streams: Vec<usize>,
    #[command(flatten)]
    pub memory: super::args::MemoryArgs,
    /// Run every generation test twice, unconstrained and constrained to a JSON value valid
    /// under the JSON schema in this file (alternating runs, same streams and token count),
    /// and report both tokens/s, their ratio, the per-token grammar mask time and how long
    /// sampling waited for the mask (including masking the logits), p50/p99/max. Both runs
    /// decode as the service does per step, though not through its scheduler: one batched
    /// forward pass (also for one stream), then the engine's per-sequence sampling, greedy,
    /// with the mask worker computing each next mask during the forward pass. So the
    /// unconstrained figure includes sampling and is not the plain tgN figure. A stream
    /// whose JSON completes starts the schema over (reported as restarts), so every run
    /// decodes all its tokens; use a schema whose values are long (benches/schemas).
    #[arg(long, value_name = "FILE", group = "bench_format")]
    pub json_schema: Option<PathBuf>,
    /// As --json-schema, constrained to any JSON object (on random weights such a value
    /// closes within a few tokens, so the run mostly measures restarts).
    #[arg(long, group = "bench_format")]
    pub json_object: bool,
    #[command(flatten)]
    pub spec: super::args::SpecArgs,
    /// With --speculative: start each generation test from this text (tokenized as is, after
    /// its --depth random tokens if any) instead of random tokens alone.
    #[arg(long, value_name = "FILE", requires = "speculative")]
    pub prompt_file: Option<PathBuf>,
}

impl BenchArgs {
    /// The response format the constrained runs follow, with its file read.
    fn response_format(&self) -> Result<Option<ResponseFormat>> {
        Ok(if let Some(p) = &self.json_schema {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Some(ResponseFormat::JsonSchema(text))
        } else if self.json_object {
            Some(ResponseFormat::JsonObject)
        } else {
            None
        })
    }
}

pub fn cmd_bench(a: BenchArgs) -> Result<()> {
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let path = a.model.resolve()?;
    let gguf = super::common::open_gguf(&path)?;
    let plan = measure::Plan::new(&a, &path, &gguf)?;
    let mut report = report::Report::start(a.output, a.roofline, &plan.facts);
    let results = measure::run(&a, &plan, &path, &gguf, &mut report)?;
    report.finish(&results)
}
