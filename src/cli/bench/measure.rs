//! Running `inferno bench`'s tests: the figures of the model file, the plan of tests
//! checked before anything loads, and for each backend × thread count the model loaded and
//! every test timed. Results (and the notes that belong beside them) go to a [`Sink`] as
//! they come, so a table can grow while the benchmark runs.

use super::BenchArgs;
use crate::backend::cpu::simd::Isa;
use crate::backend::KvType;
use crate::engine::generate::{generate_speculative, Flow, GenerateOptions, Sequence, Step};
use crate::engine::loader::{load_model, LoadOptions, LoadedModel};
use crate::engine::memory::resident_bytes;
use crate::engine::speculative::draft::DraftModel;
use crate::engine::speculative::{Method, Solo, Speculation};
use crate::gguf::GgufFile;
use crate::model::{KvCache, Logits, Model, ModelConfig, MoeConfig, Scratch, SeqStep, State};
use crate::sampling::constraint::{Grammar, GrammarCompiler, MaskWorker, ResponseFormat};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

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

/// What the report needs to know of the model file besides the results.
pub struct ModelFacts {
    /// `general.name`, else the file name without its extension.
    pub name: String,
    /// Bytes of all tensors.
    pub size: u64,
    /// Parameters of all tensors.
    pub params: u64,
}

/// A figure that belongs beside the results, not in a row of them.
pub enum Note {
    /// A mixture-of-experts model: what one decode step reads.
    Moe {
        used: usize,
        experts: usize,
        step_bytes: u64,
        active_params: u64,
        params: u64,
    },
    /// The memory read bandwidth measured at a thread count, in bytes per second.
    Bandwidth {
        threads: usize,
        bytes_per_second: f64,
    },
    /// How a backend loaded the experts, and why.
    Experts { backend: String, why: String },
    /// A backend's KV cache and the process's memory once the model is loaded.
    KvCache {
        backend: String,
        types: (KvType, KvType),
        bytes: u64,
        positions: usize,
        resident: Option<u64>,
    },
}

/// Where results go as they are measured.
pub trait Sink {
    fn note(&mut self, note: Note);
    /// One result; `bar` is the progress bar, for printing above it.
    fn result(&mut self, result: &BenchResult, bar: &ProgressBar);
}

/// What the flags and the model file ask for, checked (schema compiled, prompt file read)
/// before any model is loaded, so that a mistake fails at once.
pub struct Plan {
    pub facts: ModelFacts,
    /// (depth, prompt tokens, generated tokens, streams) of every test, in order.
    tests: Vec<(usize, usize, usize, usize)>,
    /// Positions the longest test needs.
    capacity: usize,
    max_streams: usize,
    speculation: Speculation,
    /// The response format's kind (`json_schema`, `json_object`), or empty.
    format_kind: &'static str,
    tokenizer: Option<Tokenizer>,
    prompt_tokens: Vec<u32>,
    grammar: Option<Grammar>,
    moe: Option<MoeConfig>,
    /// The token embedding doubles as the LM head.
    tied: bool,
    /// Bytes a decode step reads whole, and of the stacked expert tensors.
    dense_bytes: u64,
    expert_bytes: u64,
}

fn is_expert(t: &crate::gguf::TensorInfo) -> bool {
    t.name.ends_with("_exps.weight")
}

impl Plan {
    pub fn new(a: &BenchArgs, path: &Path, gguf: &GgufFile) -> Result<Self> {
        let name = gguf
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
        let moe = ModelConfig::from_gguf(gguf).ok().and_then(|c| c.moe);
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
        let tokenizer =
            if format.is_some() || speculative {
                Some(Tokenizer::from_gguf(gguf).with_context(|| {
                    format!("decoding needs the tokenizer of {}", path.display())
                })?)
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
                let vocab = ModelConfig::from_gguf(gguf)?.vocab;
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
        Ok(Self {
            facts: ModelFacts { name, size, params },
            tests,
            capacity,
            max_streams,
            speculation,
            format_kind,
            tokenizer,
            prompt_tokens,
            grammar,
            moe,
            tied,
            dense_bytes,
            expert_bytes,
        })
    }

    /// The share of every expert tensor a step of `streams` tokens reads, each token routed
    /// to k of E experts uniformly at random: the expected distinct experts
    /// E·(1 − (1 − k/E)^s) over E.
    fn expert_share(&self, streams: usize) -> f64 {
        self.moe.map_or(1.0, |m| {
            let used = m.n_used as f64 / m.n_experts.max(1) as f64;
            1.0 - (1.0 - used).powi(streams as i32)
        })
    }

    /// Bytes of weights one decode step of `streams` tokens reads.
    fn step_bytes(&self, streams: usize) -> f64 {
        self.dense_bytes as f64 + self.expert_bytes as f64 * self.expert_share(streams)
    }
}

/// Runs every test of `plan` on every backend × thread count of `a`, handing each result
/// and note to `sink` as it comes; returns the results in order.
pub fn run(
    a: &BenchArgs,
    plan: &Plan,
    path: &Path,
    gguf: &GgufFile,
    sink: &mut dyn Sink,
) -> Result<Vec<BenchResult>> {
    let Plan {
        facts,
        tests,
        capacity,
        max_streams,
        speculation,
        format_kind,
        tokenizer,
        prompt_tokens,
        grammar,
        ..
    } = plan;
    let (capacity, max_streams, format_kind) = (*capacity, *max_streams, *format_kind);
    let speculative = speculation.is_on();
    if let Some(m) = plan.moe {
        let share = plan.expert_share(1);
        let expert_params: u64 = gguf
            .tensors()
            .iter()
            .filter(|t| is_expert(t))
            .map(|t| t.n_elements())
            .sum();
        let embd_rows = gguf
            .tensor_info("token_embd.weight")
            .filter(|_| !plan.tied)
            .map_or(0, |t| t.n_elements() - t.n_elements() / t.dims[1].max(1));
        let active =
            (facts.params - expert_params - embd_rows) as f64 + expert_params as f64 * share;
        sink.note(Note::Moe {
            used: m.n_used,
            experts: m.n_experts,
            step_bytes: plan.step_bytes(1) as u64,
            active_params: active as u64,
            params: facts.params,
        });
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
    let bar = crate::cli::common::progress_bar(runs, "loading");
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
            } = load_model(gguf, &path.display().to_string(), &opts).map_err(anyhow::Error::msg)?;
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
                sink.note(Note::Bandwidth {
                    threads: shown_threads,
                    bytes_per_second: bw,
                });
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
                sink.note(Note::Experts {
                    backend: backend_name.clone(),
                    why,
                });
            }
            sink.note(Note::KvCache {
                backend: backend_name.clone(),
                types: model.kv_types(),
                bytes: runner.state.kv.bytes() as u64,
                positions: runner.state.capacity(),
                resident: resident_bytes(),
            });
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
            for &(depth, n_prompt, n_gen, streams) in tests {
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
                        r.run_speculative(depth, n_gen, (v == 1).then_some(speculation), record)
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
                    bw * s / (plan.step_bytes(streams) + kv_bytes_per_pos * mean_ctx * s)
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
                    let result = BenchResult {
                        model: facts.name.clone(),
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
                    };
                    sink.result(&result, &bar);
                    results.push(result);
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
    Ok(results)
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
                let mut step = seq.advance(l, true, |_| Flow::Continue)?;
                record_mask(seq);
                if let Step::Finished(_) = step {
                    // A complete value: the stream starts the grammar over from the same
                    // logits (that first mask is computed in line).
                    restarts += 1;
                    *seq = start_seq()?;
                    step = seq.advance(l, true, |_| Flow::Continue)?;
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

#[cfg(test)]
mod tests {
    use super::mean_std;

    #[test]
    fn mean_and_sample_stddev() {
        let (m, s) = mean_std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - 2.138).abs() < 1e-3);
        assert_eq!(mean_std(&[3.0]), (3.0, 0.0));
    }
}
