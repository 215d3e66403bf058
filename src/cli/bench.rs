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
//! [`Sequence`] picks its next token greedily from the logits (for the constrained run:
//! waits for the grammar mask its [`MaskWorker`] computed during the forward pass, masks
//! the logits, samples, commits, and starts the next mask). The engine's scheduler is not
//! involved. Reported besides both figures: their ratio and the per-token mask time and
//! wait. A stream whose grammar completes (or that picks end-of-generation where the
//! grammar allows it) starts over at the grammar's start, so every test decodes all N
//! tokens of every stream; the number of such restarts is reported.
//!
//! With `--speculative ngram|draft` each generation test (one stream) also runs twice,
//! alternating: without and with speculative decoding, both decoding greedily as `generate`
//! does (the single-sequence [`generate_speculative`]) from the test's context — random
//! tokens, or the text of `--prompt-file` — and reporting the decode rate after the first
//! token. The speculative row adds the ratio, the drafted and accepted tokens, the
//! acceptance rate and the mean accepted drafts per verification.

use crate::backend::simd::Isa;
use crate::engine::generate::{generate_speculative, Flow, GenerateOptions, Sequence, Step};
use crate::engine::loader::{load_model, LoadOptions, LoadedModel};
use crate::engine::memory::resident_bytes;
use crate::engine::speculative::draft::DraftModel;
use crate::engine::speculative::{Method, Solo, Speculation};
use crate::model::{KvCache, Logits, Model, ModelConfig, Scratch, SeqStep, State};
use crate::sampling::constraint::{Grammar, GrammarCompiler, MaskWorker, ResponseFormat};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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

/// Percentiles of per-token times, in milliseconds.
#[derive(Debug, Serialize)]
pub struct TimeSummary {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub n: usize,
}

impl TimeSummary {
    fn of(times: &mut [Duration]) -> Self {
        times.sort_unstable();
        let at = |q: f64| {
            if times.is_empty() {
                return 0.0;
            }
            // Nearest rank.
            let i = ((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1;
            times[i].as_secs_f64() * 1e3
        };
        Self {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
            n: times.len(),
        }
    }

    fn shown(&self) -> String {
        format!(
            "p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            self.p50_ms, self.p99_ms, self.max_ms
        )
    }
}

/// What a constrained generation test measured besides its throughput.
#[derive(Debug, Serialize)]
pub struct ConstraintResult {
    /// `json_schema` or `json_object`.
    pub format: String,
    /// Constrained tokens/s over the unconstrained run's (means of the samples).
    pub ratio: f64,
    /// Computing each token's mask (on the mask worker, for a mask computed ahead).
    pub mask: TimeSummary,
    /// How long sampling each token waited for its mask and applied it.
    pub mask_wait: TimeSummary,
    /// Times a stream's grammar completed and started over, over the timed runs.
    pub restarts: usize,
}

/// What a speculative generation test measured besides its throughput (summed over its
/// timed runs).
#[derive(Debug, Serialize)]
pub struct SpecResult {
    pub method: String,
    /// Decode tokens/s with speculation over without (means of the samples).
    pub ratio: f64,
    pub drafted: usize,
    pub accepted: usize,
    pub verify_steps: usize,
    /// Accepted drafts over drafted ones.
    pub acceptance: f64,
    /// Accepted drafts per verification step.
    pub mean_accepted: f64,
}

/// One row of results.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub model: String,
    pub backend: String,
    pub simd: String,
    pub threads: usize,
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    /// Sequences decoded together (1 for prompt tests).
    pub streams: usize,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ts: Vec<f64>,
    /// With `--roofline`: the memory-bandwidth bound for this test (generation tests only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline_ts: Option<f64>,
    /// With `--json-schema`/`--json-object`: set on the constrained run of a generation
    /// test (whose unconstrained twin is the row before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<ConstraintResult>,
    /// With `--speculative`: set on the speculative run of a generation test (whose plain
    /// twin is the row before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpecResult>,
}

/// Mean and sample standard deviation.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

struct Runner<'a> {
    model: &'a Model,
    state: State,
    logits: Vec<f32>,
    rng: ChaCha8Rng,
    /// For tests of several streams: their caches, one scratch for the batched step and
    /// each stream's logits.
    caches: Vec<KvCache>,
    batch_scratch: Option<Scratch>,
    batch_logits: Vec<Vec<f32>>,
    /// For structured comparisons: the tokenizer the sequences decode with, the worker
    /// that computes their masks, and what the constrained runs measured.
    tokenizer: Option<&'a Tokenizer>,
    masks: Option<MaskWorker>,
    mask_times: Vec<Duration>,
    wait_times: Vec<Duration>,
    restarts: usize,
    /// For speculative comparisons: the text the tests start from, the draft model, and
    /// what the speculative runs drafted (drafted, accepted, verify steps).
    prompt: Vec<u32>,
    draft: Option<DraftModel>,
    spec_counts: (usize, usize, usize),
}

impl Runner<'_> {
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        let vocab = self.model.config.vocab as u32;
        (0..n).map(|_| self.rng.random_range(0..vocab)).collect()
    }

    /// Fills the context with `depth` tokens, then times `n_prompt` prompt tokens in one
    /// forward call or `n_gen` single-token steps; returns tokens per second.
    fn run(&mut self, depth: usize, n_prompt: usize, n_gen: usize) -> Result<f64> {
        self.state.reset();
        if depth > 0 {
            let t = self.tokens(depth);
            self.model.forward(&mut self.state, &t, Logits::None)?;
        }
        if n_prompt > 0 {
            let t = self.tokens(n_prompt);
            let start = Instant::now();
            self.model
                .forward(&mut self.state, &t, Logits::Last(&mut self.logits))?;
            return Ok(n_prompt as f64 / start.elapsed().as_secs_f64());
        }
        let t = self.tokens(n_gen);
        let start = Instant::now();
        for &id in &t {
            self.model
                .forward(&mut self.state, &[id], Logits::Last(&mut self.logits))?;
        }
        Ok(n_gen as f64 / start.elapsed().as_secs_f64())
    }

    /// `n_gen` batched steps over the first `s` caches' sequences, each first filled with
    /// `depth` tokens; returns aggregate tokens per second.
    fn run_streams(&mut self, s: usize, depth: usize, n_gen: usize) -> Result<f64> {
        let prompt = self.tokens(depth + 1);
        let steps: Vec<Vec<u32>> = (0..s).map(|_| self.tokens(n_gen)).collect();
        let scratch = self
            .batch_scratch
            .as_mut()
            .context("no scratch for batched steps")?;
        let caches = &mut self.caches[..s];
        for kv in caches.iter_mut() {
            kv.clear();
        }
        // Every stream starts from its own context (untimed), one prompt pass each.
        for kv in caches.iter_mut() {
            let mut one = [SeqStep {
                kv,
                tokens: &prompt,
                logits: Logits::None,
            }];
            for part in prompt.chunks(scratch.rows()) {
                one[0].tokens = part;
                self.model.forward_batch(&mut one, scratch)?;
            }
        }
        let start = Instant::now();
        for i in 0..n_gen {
            let mut batch: Vec<SeqStep<'_>> = caches
                .iter_mut()
                .zip(&mut self.batch_logits)
                .zip(&steps)
                .map(|((kv, l), t)| SeqStep {
                    kv,
                    tokens: &t[i..i + 1],
                    logits: Logits::Last(l),
                })
                .collect();
            self.model.forward_batch(&mut batch, scratch)?;
        }
        Ok((s * n_gen) as f64 / start.elapsed().as_secs_f64())
    }

    /// `n_gen` tokens decoded greedily after `depth` random tokens and the prompt, as
    /// `generate` decodes them, speculating as `spec` says (`None`: without); returns the
    /// decode rate after the first token. With `record`, what was drafted is kept.
    fn run_speculative(
        &mut self,
        depth: usize,
        n_gen: usize,
        spec: Option<&Speculation>,
        record: bool,
    ) -> Result<f64> {
        let tokenizer = self.tokenizer.context("no tokenizer for decoding")?;
        let mut prompt = self.tokens(depth);
        prompt.extend_from_slice(&self.prompt);
        if prompt.is_empty() {
            prompt = self.tokens(1);
        }
        let opts = GenerateOptions {
            max_tokens: n_gen,
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        let cap = self.state.capacity();
        let mut solo = match spec {
            Some(s) => Solo::new(s, self.draft.as_ref(), cap).map_err(anyhow::Error::msg)?,
            None => None,
        };
        let g = generate_speculative(
            self.model,
            tokenizer,
            &mut self.state,
            &prompt,
            &opts,
            solo.as_mut(),
            |_| Flow::Continue,
        )?;
        let m = &g.metrics;
        if record && spec.is_some() {
            let c = &mut self.spec_counts;
            *c = (
                c.0 + m.drafted_tokens,
                c.1 + m.accepted_tokens,
                c.2 + m.verify_steps,
            );
        }
        Ok(m.decode_tokens_per_second)
    }

    /// `n_gen` engine-style steps over the first `s` caches' sequences (each first filled
    /// with `depth` + 1 tokens, untimed): one batched forward pass, then each stream's
    /// [`Sequence`] picks its next token from the logits, under `grammar` when given.
    /// Returns aggregate tokens per second; with `record`, the constrained run's mask
    /// times and restarts are kept.
    fn run_sequences(
        &mut self,
        s: usize,
        depth: usize,
        n_gen: usize,
        grammar: Option<&Grammar>,
        record: bool,
    ) -> Result<f64> {
        let tokenizer = self.tokenizer.context("no tokenizer for sequences")?;
        let vocab = self.model.config.vocab;
        let prompt = self.tokens(depth + 1);
        let scratch = self
            .batch_scratch
            .as_mut()
            .context("no scratch for batched steps")?;
        let caches = &mut self.caches[..s];
        let context = caches.first().map_or(0, KvCache::capacity);
        for (kv, l) in caches.iter_mut().zip(&mut self.batch_logits) {
            kv.clear();
            let chunks = prompt.chunks(scratch.rows());
            let last = chunks.len() - 1;
            for (i, part) in chunks.enumerate() {
                let mut one = [SeqStep {
                    kv: &mut *kv,
                    tokens: part,
                    // The first sampled token needs the prompt's last logits.
                    logits: if i == last {
                        Logits::Last(&mut *l)
                    } else {
                        Logits::None
                    },
                }];
                self.model.forward_batch(&mut one, scratch)?;
            }
        }
        let opts = GenerateOptions {
            max_tokens: n_gen + 1,
            sampling: SamplingParams {
                temperature: 0.0,
                seed: Some(0),
                ..SamplingParams::default()
            },
            // Unconstrained streams run every token; constrained ones end (and restart)
            // where the grammar allows end-of-generation and the model picks it.
            ignore_eos: true,
            grammar: grammar.cloned(),
            ..GenerateOptions::default()
        };
        let masks = self.masks.as_ref();
        let start_seq = || -> Result<Sequence<'_>> {
            let mut seq = Sequence::new(tokenizer, vocab, &prompt, opts.clone(), context)?;
            if let Some(w) = masks {
                seq.use_mask_worker(w.handle());
            }
            Ok(seq)
        };
        let mut seqs = (0..s).map(|_| start_seq()).collect::<Result<Vec<_>>>()?;
        let mut next = vec![0u32; s];
        let mut restarts = 0;
        let (mask_times, wait_times) = (&mut self.mask_times, &mut self.wait_times);
        // Every mask a step used, with how long sampling waited for it.
        let mut record_mask = |seq: &mut Sequence<'_>| {
            if let (true, Some((mask, waited))) = (record, seq.take_mask_time()) {
                mask_times.push(mask);
                wait_times.push(waited);
            }
        };
        let start = Instant::now();
        for _ in 0..n_gen {
            for ((seq, l), id) in seqs.iter_mut().zip(&self.batch_logits).zip(&mut next) {
                let mut step = seq.advance(l, true, |_| Flow::Continue);
                record_mask(seq);
                if let Step::Finished(_) = step {
                    // A complete value: the stream starts the grammar over from the same
                    // logits (that first mask is computed in line).
                    restarts += 1;
                    *seq = start_seq()?;
                    step = seq.advance(l, true, |_| Flow::Continue);
                    record_mask(seq);
                }
                *id = match step {
                    Step::Feed(id) => id,
                    Step::Finished(why) => bail!("a sequence ended at its first token ({why:?})"),
                };
            }
            let mut batch: Vec<SeqStep<'_>> = caches
                .iter_mut()
                .zip(&mut self.batch_logits)
                .zip(&next)
                .map(|((kv, l), t)| SeqStep {
                    kv,
                    tokens: std::slice::from_ref(t),
                    logits: Logits::Last(l),
                })
                .collect();
            self.model.forward_batch(&mut batch, scratch)?;
        }
        let tps = (s * n_gen) as f64 / start.elapsed().as_secs_f64();
        if record {
            self.restarts += restarts;
        }
        Ok(tps)
    }
}

pub fn cmd_bench(a: BenchArgs) -> Result<()> {
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let path = a.model.resolve()?;
    let gguf = super::common::open_gguf(&path)?;
    let model_name = gguf
        .get_str("general.name")
        .map(str::to_string)
        .unwrap_or_else(|_| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
    let size: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
    // A decode step reads every weight once; the token embedding only for one row, unless
    // it doubles as the LM head (tied), when it is read whole; of a stacked expert tensor,
    // the experts its tokens are routed to.
    let tied = !gguf.tensors().iter().any(|t| t.name == "output.weight");
    let moe_cfg = ModelConfig::from_gguf(&gguf).ok().and_then(|c| c.moe);
    let is_expert = |t: &crate::gguf::TensorInfo| t.name.ends_with("_exps.weight");
    let dense_bytes: u64 = gguf
        .tensors()
        .iter()
        .filter(|t| (tied || t.name != "token_embd.weight") && !is_expert(t))
        .map(|t| t.n_bytes)
        .sum();
    let expert_bytes: u64 = gguf
        .tensors()
        .iter()
        .filter(|t| is_expert(t))
        .map(|t| t.n_bytes)
        .sum();
    // The share of every expert tensor a step of `streams` tokens reads, each token routed
    // to k of E experts uniformly at random: the expected distinct experts E·(1 − (1 − k/E)^s)
    // over E.
    let expert_share = |streams: usize| -> f64 {
        moe_cfg.map_or(1.0, |m| {
            let used = m.n_used as f64 / m.n_experts.max(1) as f64;
            1.0 - (1.0 - used).powi(streams as i32)
        })
    };
    let step_bytes =
        |streams: usize| dense_bytes as f64 + expert_bytes as f64 * expert_share(streams);
    let params: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
    let mut tests = Vec::new();
    for &d in &a.depth {
        for &p in a.n_prompt.iter().filter(|&&p| p > 0) {
            tests.push((d, p, 0));
        }
        for &n in a.n_gen.iter().filter(|&&n| n > 0) {
            tests.push((d, 0, n));
        }
    }
    if tests.is_empty() {
        bail!("nothing to run: give -p and/or -n values above 0");
    }
    if a.streams.contains(&0) {
        bail!("--streams must be at least 1");
    }
    let max_streams = a.streams.iter().copied().max().unwrap_or(1);
    let speculation = a.spec.speculation(Method::Off)?;
    let speculative = speculation.is_on();
    if speculative && (max_streams > 1 || a.json_schema.is_some() || a.json_object) {
        bail!("--speculative compares single-stream decoding: without --streams above 1 or a response format");
    }
    // The constrained runs' grammar, compiled before any model is loaded so that a bad
    // schema fails at once.
    let format = a.response_format()?;
    let format_kind = format.as_ref().map_or("", ResponseFormat::kind);
    let tokenizer = if format.is_some() || speculative {
        Some(
            Tokenizer::from_gguf(&gguf)
                .with_context(|| format!("decoding needs the tokenizer of {}", path.display()))?,
        )
    } else {
        None
    };
    let prompt_tokens = match (&a.prompt_file, &tokenizer) {
        (Some(p), Some(tok)) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            tok.encode(&text, true)?
        }
        _ => Vec::new(),
    };
    let grammar = match (&format, &tokenizer) {
        (Some(f), Some(tok)) => {
            let vocab = ModelConfig::from_gguf(&gguf)?.vocab;
            let g = GrammarCompiler::new(tok, vocab)
                .and_then(|c| c.compile(f))
                .with_context(|| match &a.json_schema {
                    Some(p) => format!("cannot use the schema in {}", p.display()),
                    None => "cannot use the JSON object format".to_string(),
                })?;
            Some(g)
        }
        _ => None,
    };
    // Prompt tests run one sequence; generation tests once per stream count.
    let tests: Vec<(usize, usize, usize, usize)> = tests
        .into_iter()
        .flat_map(|(d, p, n)| {
            let counts = if p > 0 { vec![1] } else { a.streams.clone() };
            counts.into_iter().map(move |s| (d, p, n, s))
        })
        .collect();
    let capacity = tests
        .iter()
        .map(|&(d, p, n, _)| d + p.max(n) + 1 + prompt_tokens.len())
        .max()
        .unwrap_or(1);
    let text = a.output == super::args::OutputFormat::Text;
    if text {
        let (roofline, rule) = if a.roofline {
            (
                format!(" {:>18} |", "roofline t/s"),
                format!(" {:->18} |", ":"),
            )
        } else {
            (String::new(), String::new())
        };
        println!(
            "| {:<24} | {:>10} | {:>8} | {:<10} | {:<10} | {:>7} | {:>14} | {:>16} |{roofline}",
            "model", "size", "params", "backend", "simd", "threads", "test", "t/s"
        );
        println!(
            "| {:-<24} | {:->10} | {:->8} | {:-<10} | {:-<10} | {:->7} | {:->14} | {:->16} |{rule}",
            ":", ":", ":", ":", ":", ":", ":", ":"
        );
    }
    // Figures that belong beside the table (memory bandwidths), printed under it.
    let mut notes = Vec::new();
    if let Some(m) = moe_cfg {
        let share = expert_share(1);
        let expert_params: u64 = gguf
            .tensors()
            .iter()
            .filter(|t| is_expert(t))
            .map(|t| t.n_elements())
            .sum();
        let embd_rows = gguf
            .tensor_info("token_embd.weight")
            .filter(|_| !tied)
            .map_or(0, |t| t.n_elements() - t.n_elements() / t.dims[1].max(1));
        let active = (params - expert_params - embd_rows) as f64 + expert_params as f64 * share;
        notes.push(format!(
            "mixture of experts, {} of {} per token: one decode step reads {} of weights, \
             {} active parameters of {}",
            m.n_used,
            m.n_experts,
            bytes_shown(step_bytes(1) as u64),
            count_shown(active as u64),
            count_shown(params)
        ));
    }
    let mut results = Vec::new();
    // One step per timed or warm-up run of every test (twice over for a generation test
    // with a response format).
    let per_load: usize = tests
        .iter()
        .map(|&(_, _, n, _)| {
            if n > 0 && (grammar.is_some() || speculative) {
                2
            } else {
                1
            }
        })
        .sum();
    let runs = (a.backend.len() * a.threads.len() * per_load * (a.repetitions + 1)) as u64;
    let bar = super::common::progress_bar(runs, "loading");
    // A tick keeps the elapsed time moving through a long depth fill; none off a terminal,
    // where nothing is drawn.
    let tick = |on: bool| {
        if on && !bar.is_hidden() {
            bar.enable_steady_tick(std::time::Duration::from_millis(250));
        } else {
            bar.disable_steady_tick();
        }
    };
    tick(true);
    for backend_name in &a.backend {
        for &threads in &a.threads {
            let opts = LoadOptions {
                backend: backend_name.clone(),
                threads,
                // Kernel spans would be measured too.
                tracing: false,
                cache_type_k: a.memory.cache_type_k,
                cache_type_v: a.memory.cache_type_v,
                experts: a.memory.experts,
                ..LoadOptions::default()
            };
            let LoadedModel {
                model,
                threads: shown_threads,
                experts,
            } = load_model(&gguf, &path.display().to_string(), &opts)
                .map_err(anyhow::Error::msg)?;
            let on_gpu = model.device().gpu_backend();
            if let Some(g) = on_gpu {
                bar.suspend(|| eprintln!("gpu: {}", g.context().describe()));
            }
            let simd = if let Some(g) = on_gpu {
                g.context().info.name.clone()
            } else if backend_name == "scalar" {
                "-".to_string()
            } else {
                Isa::selected().name().to_string()
            };
            let bandwidth = if a.roofline {
                let bw = read_bandwidth(shown_threads);
                notes.push(format!(
                    "memory read bandwidth, {shown_threads} thread(s): {:.1} GB/s",
                    bw / 1e9
                ));
                Some(bw)
            } else {
                None
            };
            // Keys and values of every layer, per position, in the cache's types.
            let kv_bytes_per_pos = model.kv_bytes_per_token() as f64;
            let mut runner = Runner {
                state: model.new_state(capacity.min(model.config.context_length), a.batch),
                logits: vec![0.0; model.config.vocab],
                model: &model,
                rng: ChaCha8Rng::seed_from_u64(1234),
                caches: Vec::new(),
                batch_scratch: None,
                batch_logits: Vec::new(),
                tokenizer: tokenizer.as_ref(),
                masks: None,
                mask_times: Vec::new(),
                wait_times: Vec::new(),
                restarts: 0,
                prompt: prompt_tokens.clone(),
                draft: None,
                spec_counts: (0, 0, 0),
            };
            if let (Some(path), Some(tok)) = (&a.spec.draft_model, tokenizer.as_ref()) {
                let draft = crate::engine::loader::load_draft(path, &model, tok, &opts)
                    .map_err(anyhow::Error::msg)?;
                runner.draft = Some(draft);
            }
            if let Some(why) = experts {
                notes.push(format!("{backend_name}: experts {why}"));
            }
            let (kt, vt) = model.kv_types();
            notes.push(format!(
                "{backend_name}: KV cache {kt}/{vt}, {} per sequence of {} positions; \
                 resident memory after load {}",
                bytes_shown(runner.state.kv.bytes() as u64),
                runner.state.capacity(),
                resident_bytes().map_or("unknown".into(), bytes_shown),
            ));
            // Structured runs decode every stream count through batched passes, as the
            // engine does.
            if max_streams > 1 || grammar.is_some() {
                let cap = capacity.min(model.config.context_length);
                runner.batch_scratch =
                    Some(model.new_scratch(a.batch.max(max_streams), max_streams));
                runner.caches = (0..max_streams).map(|_| model.new_kv_cache(cap)).collect();
                runner.batch_logits = vec![vec![0.0; model.config.vocab]; max_streams];
            }
            if grammar.is_some() {
                // As the engine: one mask in flight per sequence; without the thread,
                // masks are computed in line.
                runner.masks = MaskWorker::start(max_streams).ok();
                let most = a.repetitions * max_streams * a.n_gen.iter().max().unwrap_or(&0);
                runner.mask_times = Vec::with_capacity(most);
                runner.wait_times = Vec::with_capacity(most);
            }
            if capacity > model.config.context_length {
                bail!(
                    "the longest test needs {capacity} positions; the model holds {}",
                    model.config.context_length
                );
            }
            for &(depth, n_prompt, n_gen, streams) in &tests {
                let mut test = if n_prompt > 0 {
                    format!("pp{n_prompt}")
                } else {
                    format!("tg{n_gen}")
                };
                if streams > 1 {
                    test.push_str(&format!(" x{streams}"));
                }
                if depth > 0 {
                    test.push_str(&format!(" @ d{depth}"));
                }
                bar.set_message(format!("{backend_name} x{shown_threads} {test}"));
                // With a response format, a generation test's runs alternate between the
                // unconstrained (0) and the constrained (1) variant; with speculation,
                // between decoding without (0) and with (1) it.
                let structured = grammar.as_ref().filter(|_| n_gen > 0);
                let speculating = speculative && n_gen > 0;
                let variants = if structured.is_some() || speculating {
                    2
                } else {
                    1
                };
                let run = |r: &mut Runner<'_>, v: usize, record: bool| {
                    let tps = if speculating {
                        r.run_speculative(depth, n_gen, (v == 1).then_some(&speculation), record)
                    } else if let Some(g) = structured {
                        r.run_sequences(streams, depth, n_gen, (v == 1).then_some(g), record)
                    } else if streams > 1 {
                        r.run_streams(streams, depth, n_gen)
                    } else {
                        r.run(depth, n_prompt, n_gen)
                    };
                    bar.inc(1);
                    tps
                };
                for v in 0..variants {
                    run(&mut runner, v, false)?; // warm-up
                }
                if let Some(g) = on_gpu {
                    g.set_profiling(true);
                }
                runner.mask_times.clear();
                runner.wait_times.clear();
                runner.restarts = 0;
                runner.spec_counts = (0, 0, 0);
                let mut samples = vec![Vec::with_capacity(a.repetitions); variants];
                for _ in 0..a.repetitions {
                    for (v, samples) in samples.iter_mut().enumerate() {
                        samples.push(run(&mut runner, v, true)?);
                    }
                }
                let roofline = bandwidth.filter(|_| n_gen > 0).map(|bw| {
                    // A batched step reads the weights once and every stream's cache.
                    let mean_ctx = depth as f64 + (n_gen as f64 + 1.0) / 2.0;
                    let s = streams as f64;
                    bw * s / (step_bytes(streams) + kv_bytes_per_pos * mean_ctx * s)
                });
                if let Some(g) = on_gpu {
                    let t = g.step_times();
                    g.set_profiling(false);
                    let per =
                        |d: std::time::Duration| d.as_secs_f64() * 1e3 / t.steps.max(1) as f64;
                    let gpu = if g.context().timestamps {
                        format!(
                            "GPU execution {:.3} ms + submit/read-back/sync {:.3} ms",
                            per(t.gpu),
                            per(t.submit_to_results.saturating_sub(t.gpu))
                        )
                    } else {
                        "no GPU timestamps on this adapter".to_string()
                    };
                    bar.suspend(|| {
                        eprintln!(
                            "{test}: per forward pass ({} passes): encode {:.3} ms, submit to logits {:.3} ms ({gpu})",
                            t.steps,
                            per(t.encode),
                            per(t.submit_to_results),
                        )
                    });
                }
                let free_avg = mean_std(&samples[0]).0;
                for (v, samples) in samples.into_iter().enumerate() {
                    let (avg, sd) = mean_std(&samples);
                    let spec_result = (v == 1 && speculating).then(|| {
                        let (drafted, accepted, steps) = runner.spec_counts;
                        SpecResult {
                            method: speculation.method.name().to_string(),
                            ratio: avg / free_avg,
                            drafted,
                            accepted,
                            verify_steps: steps,
                            acceptance: accepted as f64 / drafted.max(1) as f64,
                            mean_accepted: accepted as f64 / steps.max(1) as f64,
                        }
                    });
                    let constraint = (v == 1 && !speculating).then(|| ConstraintResult {
                        format: format_kind.to_string(),
                        ratio: avg / free_avg,
                        mask: TimeSummary::of(&mut runner.mask_times),
                        mask_wait: TimeSummary::of(&mut runner.wait_times),
                        restarts: runner.restarts,
                    });
                    let test = match (v, &spec_result) {
                        (1, Some(r)) => format!("{test} +{}", r.method),
                        (1, None) => format!("{test} +{}", short_kind(format_kind)),
                        _ => test.clone(),
                    };
                    if let Some(r) = &spec_result {
                        notes.push(format!(
                            "{backend_name} x{shown_threads} {test}: {:.3} × without; drafted \
                             {}, accepted {} ({:.1}%), {:.2} accepted per verification ({} \
                             verifications)",
                            r.ratio,
                            r.drafted,
                            r.accepted,
                            r.acceptance * 100.0,
                            r.mean_accepted,
                            r.verify_steps
                        ));
                    }
                    if let Some(c) = &constraint {
                        notes.push(format!(
                            "{backend_name} x{shown_threads} {test}: {:.3} × unconstrained; \
                             mask {}; sampling waited {} ({} masks, {} restarts)",
                            c.ratio,
                            c.mask.shown(),
                            c.mask_wait.shown(),
                            c.mask.n,
                            c.restarts
                        ));
                    }
                    if text {
                        let roofline = match (a.roofline, roofline) {
                            (false, _) => String::new(),
                            // The bound and how much of it this run reached.
                            (true, Some(r)) => {
                                format!(" {:>18} |", format!("{r:.1} ({:.0}%)", avg / r * 100.0))
                            }
                            (true, None) => format!(" {:>18} |", "-"),
                        };
                        // Above the bar, which redraws under the table.
                        bar.suspend(|| {
                            println!(
                                "| {:<24} | {:>10} | {:>8} | {:<10} | {:<10} | {:>7} | {:>14} | {:>7.2} ± {:>6.2} |{roofline}",
                                truncate(&model_name, 24),
                                bytes_shown(size),
                                count_shown(params),
                                backend_name,
                                simd,
                                shown_threads,
                                test,
                                avg,
                                sd
                            )
                        });
                    }
                    results.push(BenchResult {
                        model: model_name.clone(),
                        backend: backend_name.clone(),
                        simd: simd.clone(),
                        threads: shown_threads,
                        test,
                        n_prompt,
                        n_gen,
                        depth,
                        streams,
                        avg_ts: avg,
                        stddev_ts: sd,
                        samples_ts: samples,
                        roofline_ts: roofline,
                        constraint,
                        speculative: spec_result,
                    });
                }
            }
            if a.idle_check > 0.0 {
                // The model (and its thread pool) is still alive here, only idle; so is the
                // bar, whose ticks would count.
                tick(false);
                let idle = idle_cpu_percent(a.idle_check);
                tick(true);
                bar.suspend(|| match idle {
                    Some(p) => eprintln!(
                        "idle: {backend_name} x{shown_threads} used {p:.2}% of one core over {:.1} s, after 1 s without work",
                        a.idle_check
                    ),
                    None => eprintln!("idle: CPU time is not readable on this system"),
                });
            }
            drop(runner);
        }
    }
    bar.finish_and_clear();
    if text {
        for n in &notes {
            println!("{n}");
        }
    } else {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(())
}

/// A size in the largest binary unit that keeps it at least 1 (`1.20 GiB`, `5.47 MiB`), so
/// a small model does not read `0.00 GiB`.
pub(super) fn bytes_shown(bytes: u64) -> String {
    const UNITS: &[(&str, u64)] = &[("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for &(unit, size) in UNITS {
        if bytes >= size {
            return format!("{:.2} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// A parameter count in billions, millions or thousands (`0.60 B`, `3.42 M`).
fn count_shown(n: u64) -> String {
    const UNITS: &[(&str, f64)] = &[("B", 1e9), ("M", 1e6), ("K", 1e3)];
    for &(unit, size) in UNITS {
        if n as f64 >= size {
            return format!("{:.2} {unit}", n as f64 / size);
        }
    }
    n.to_string()
}

/// Bytes per second `threads` threads read from memory, each summing its own share of a
/// 1 GiB array (larger than any cache): the best of five passes.
fn read_bandwidth(threads: usize) -> f64 {
    const BYTES: usize = 1 << 30;
    let words: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let threads = threads.max(1);
    let share = words.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        std::thread::scope(|s| {
            for part in words.chunks(share) {
                s.spawn(move || {
                    // Four independent sums keep several loads in flight.
                    let mut acc = [0u64; 4];
                    for c in part.chunks_exact(4) {
                        for (a, &w) in acc.iter_mut().zip(c) {
                            *a = a.wrapping_add(w);
                        }
                    }
                    std::hint::black_box(acc);
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    BYTES as f64 / best
}

/// CPU time used by all of this process's threads, in seconds (Linux only).
pub fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        // Threads may exit while we look; skip those.
        if let Ok(t) = std::fs::read_to_string(path) {
            ns += t.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(ns as f64 * 1e-9)
}

/// Percent of one core the process uses over `secs` seconds, after one second without work.
fn idle_cpu_percent(secs: f64) -> Option<f64> {
    std::thread::sleep(std::time::Duration::from_secs(1));
    let c0 = process_cpu_seconds()?;
    let t0 = Instant::now();
    std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    let c1 = process_cpu_seconds()?;
    Some((c1 - c0) / t0.elapsed().as_secs_f64() * 100.0)
}

/// The suffix a constrained test's name carries.
fn short_kind(kind: &str) -> &str {
    match kind {
        "json_schema" => "schema",
        "json_object" => "object",
        other => other,
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::{bytes_shown, count_shown, mean_std};

    #[test]
    fn sizes_and_counts_keep_their_digits() {
        assert_eq!(bytes_shown(639_000_000), "609.40 MiB");
        assert_eq!(bytes_shown(3 << 30), "3.00 GiB");
        assert_eq!(bytes_shown(5_000), "4.88 KiB");
        assert_eq!(bytes_shown(12), "12 B");
        assert_eq!(count_shown(596_049_920), "596.05 M");
        assert_eq!(count_shown(1_500_000_000), "1.50 B");
        assert_eq!(count_shown(3_400), "3.40 K");
        assert_eq!(count_shown(7), "7");
    }

    #[test]
    fn mean_and_sample_stddev() {
        let (m, s) = mean_std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - 2.138).abs() < 1e-3);
        assert_eq!(mean_std(&[3.0]), (3.0, 0.0));
    }
}
