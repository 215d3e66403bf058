//! The `inferno` command line: generate, tokenize, logits, info, serve, health, loadtest,
//! bench, synth, quantize, and pull, list and rm for models from the Hugging Face Hub.

pub mod bench;
pub mod health;
pub mod hub;
pub mod loadtest;
pub mod quantize;
pub mod serve;
pub mod synth;

use crate::backend::KvType;
use crate::engine::loader::{self, EngineAssets, ExpertLoad, LoadOptions};
use crate::engine::memory::gib;
use crate::engine::plan::{plan_prompt, Input, Message, PlanError, PromptSpec, Tool, ToolChoice};
use crate::engine::request::{check_context, prompt_tokens, Prompt};
use crate::engine::speculative::{Method, Solo, Speculation};
use crate::engine::{generate_speculative, FinishReason, Flow, GenerateOptions};
use crate::gguf::GgufFile;
use crate::model::Logits;
use crate::sampling::constraint::{GrammarCompiler, ResponseFormat};
use crate::sampling::SamplingParams;
use crate::tokenizer::reasoning::{ReasoningParser, ReplyParser, ReplyPiece};
use crate::tokenizer::tool_calls::Parsed;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "inferno",
    version,
    about = "LLM inference for GGUF models, served over gRPC"
)]
pub struct Cli {
    /// Log output format (filter with RUST_LOG, e.g. RUST_LOG=inferno=debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(GenerateArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(TokenizeArgs),
    /// Print the logits for a sequence of token ids as JSON.
    Logits(LogitsArgs),
    /// Describe a GGUF model: architecture, hyper-parameters, tensors, tokenizer.
    Info(InfoArgs),
    /// Serve a model over gRPC (the built-in demo model when no --model is given).
    Serve(serve::ServeArgs),
    /// Ask a running service's gRPC health whether it is serving (exit 0 only if it is).
    Health(health::HealthArgs),
    /// Load-test a running service: throughput, time to first token, status counts.
    Loadtest(loadtest::LoadtestArgs),
    /// Time prompt processing and generation, llama-bench style.
    Bench(bench::BenchArgs),
    /// Write a random-weight GGUF of a real model's shape (for benchmarks).
    Synth(synth::SynthArgs),
    /// Rewrite a GGUF model with its weight matrices in another type (e.g. Q8_0).
    Quantize(quantize::QuantizeArgs),
    /// Download a model from the Hugging Face Hub into its cache and print its local path.
    Pull(hub::PullArgs),
    /// List the GGUF models in the Hugging Face cache: reference, quantization, size, path.
    List(hub::ListArgs),
    /// Remove a model from the Hugging Face cache.
    Rm(hub::RmArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    #[command(flatten)]
    pub source: hub::ModelSource,
    #[command(flatten)]
    pub run: RunArgs,
}

/// How a model runs, for every command that loads one: backend, threads, context window and
/// KV cache types.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Compute backend: pool (fastest on the CPU), parallel, simd, scalar (the reference), or
    /// gpu (alias vulkan, or metal on macOS: the whole forward pass on the GPU).
    #[arg(long, default_value = "pool")]
    pub backend: String,
    /// Worker threads; 0 = the machine's physical performance cores.
    #[arg(long, env = "INFERNO_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Context window in tokens, at most the model's (default: the model's where one
    /// sequence of it fits in memory, else the largest that does).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Type the KV cache stores keys as: f32, f16 or q8_0 (default: f32 for an F32 model,
    /// else f16).
    #[arg(long, value_parser = parse_kv_type)]
    pub cache_type_k: Option<KvType>,
    /// Type the KV cache stores values as: f32, f16 or q8_0 (default as for keys).
    #[arg(long, value_parser = parse_kv_type)]
    pub cache_type_v: Option<KvType>,
    /// How a mixture-of-experts model's experts are loaded: repack (resident, repacked for
    /// the multi-row kernels: fast prompts), mmap (left in the mapped file: only routed
    /// experts are read, a model larger than memory runs) or auto (repack when the model
    /// fits in memory).
    #[arg(long, default_value = "auto", value_parser = parse_experts)]
    pub experts: ExpertLoad,
}

impl RunArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            backend: self.backend.clone(),
            threads: self.threads,
            ctx_size: self.ctx_size,
            cache_type_k: self.cache_type_k,
            cache_type_v: self.cache_type_v,
            experts: self.experts,
            ..LoadOptions::default()
        }
    }
}

/// Speculative decoding, for the commands that generate (`generate`, `serve`, `bench`).
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: off; ngram (drafts are the tokens that followed the last few
    /// tokens where they occurred before in the prompt or output: fast on edits, quotes,
    /// code); or draft (drafts from --draft-model). It never changes the output (the same
    /// tokens, logprobs and finish), only how many tokens a step yields. Default: draft with
    /// --draft-model; else ngram for generate and serve, off for bench (whose --speculative
    /// runs each generation test twice, to compare).
    #[arg(long, value_parser = parse_speculative)]
    pub speculative: Option<Method>,
    /// The draft model of --speculative draft: a smaller GGUF of the same vocabulary (e.g.
    /// a smaller quantization of the model, made with `inferno quantize`).
    #[arg(long, value_name = "FILE")]
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens a sequence verifies in one step (default: 16 for ngram, 8 for
    /// draft); fewer are tried where drafts are seldom accepted or the batch is large.
    #[arg(long)]
    pub draft_max: Option<usize>,
}

impl SpecArgs {
    /// The speculation the flags ask for, checked; `default` is the command's method when
    /// neither --speculative nor --draft-model is given.
    pub fn speculation(&self, default: Method) -> Result<Speculation> {
        let method = match (self.speculative, &self.draft_model) {
            (Some(m), _) => m,
            (None, Some(_)) => Method::Draft,
            (None, None) => default,
        };
        match (method, &self.draft_model) {
            (Method::Draft, None) => bail!("--speculative draft needs --draft-model FILE"),
            (Method::Off | Method::Ngram, Some(_)) => {
                bail!("--draft-model is used by --speculative draft only")
            }
            _ => {}
        }
        if self.draft_max == Some(0) {
            bail!("--draft-max must be at least 1 (--speculative off turns speculation off)");
        }
        Ok(Speculation::new(method, self.draft_max))
    }

    /// `load` with the draft model to load, if any.
    pub fn load_options(&self, load: LoadOptions) -> LoadOptions {
        LoadOptions {
            draft_model: self.draft_model.clone(),
            ..load
        }
    }
}

/// A speculative method from its name, for the command line.
pub fn parse_speculative(s: &str) -> Result<Method, String> {
    Method::parse(s)
}

/// How to load experts, from its name, for the command line.
pub fn parse_experts(s: &str) -> Result<ExpertLoad, String> {
    ExpertLoad::parse(s)
}

/// A KV cache type from its name, for the command line.
pub fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::parse(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Most tokens to generate (fewer when an end token or a stop string comes first).
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature: 0 always takes the most likely token (greedy); higher is more
    /// random.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample only among the most likely tokens whose probabilities add up to this
    /// (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Divide the scores of recently generated tokens by this, to discourage repeats
    /// (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Seed of the sampler, for a repeatable run (default: a random one, printed with
    /// --output json).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: ask a Qwen3 model to answer without a thinking section.
    #[arg(long)]
    pub no_think: bool,
    /// Optional system message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Stop when the text contains this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// text: stream the text to stdout and the metrics to stderr; json: print one JSON
    /// object at the end.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Constrain the output to a JSON value valid under the JSON schema in this file.
    #[arg(long, value_name = "FILE", group = "response_format")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to any JSON object.
    #[arg(long, group = "response_format")]
    pub json_object: bool,
    /// Constrain the output to match this regular expression (Rust regex syntax) whole.
    #[arg(long, value_name = "REGEX", group = "response_format")]
    pub regex: Option<String>,
    /// Constrain the output to the Lark grammar in this file (llguidance's dialect; the
    /// output is a sentence of its `start` rule).
    #[arg(long, value_name = "FILE", group = "response_format")]
    pub grammar: Option<PathBuf>,
    /// Tools the model may call, from this JSON file: an array of OpenAI-style tools
    /// ({"type": "function", "function": {"name", "description", "parameters"}}) or of
    /// bare {"name", "description", "parameters"} objects. Implies --chat; the tools are
    /// shown to the model through its chat template, and each call it makes is printed as
    /// one JSON line {"name", "arguments"} on stdout (with --output json: in "tool_calls").
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
    /// With --tools: auto (the model decides), none (no tools shown, no calls parsed),
    /// required (exactly one call of some tool, grammar-constrained) or a tool's name
    /// (exactly one call of that tool, grammar-constrained).
    #[arg(
        long,
        value_name = "MODE|NAME",
        requires = "tools",
        default_value = "auto"
    )]
    pub tool_choice: String,
    /// Report a thinking model's reasoning (a <think> ... </think> section at the start of
    /// the output, or the rest of one the prompt opened) apart from its answer: with
    /// --output text it streams to stderr, between "[reasoning]" and "[/reasoning]" lines,
    /// and only the answer goes to stdout; with --output json it is "reasoning_content" and
    /// "text" is the answer. Without this flag the reasoning is ordinary text.
    #[arg(long)]
    pub separate_reasoning: bool,
    /// The prompt (with --chat: the user's message).
    pub prompt: String,
}

impl GenerateArgs {
    /// The response format the flags ask for, with its file read.
    fn response_format(&self) -> Result<Option<ResponseFormat>> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        };
        Ok(if let Some(p) = &self.json_schema {
            Some(ResponseFormat::JsonSchema(read(p)?))
        } else if let Some(p) = &self.grammar {
            Some(ResponseFormat::Lark(read(p)?))
        } else if let Some(r) = &self.regex {
            Some(ResponseFormat::Regex(r.clone()))
        } else if self.json_object {
            Some(ResponseFormat::JsonObject)
        } else {
            None
        })
    }
}

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The model whose tokenizer to use.
    #[command(flatten)]
    pub model: hub::ModelSource,
    /// Treat special-token text such as <|im_start|> as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// The text to encode.
    pub text: String,
}

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<u32>,
    /// Every position's logits instead of the last one's.
    #[arg(long)]
    pub all: bool,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The model to describe.
    #[command(flatten)]
    pub model: hub::ModelSource,
    /// text for reading, json for scripts.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn open_gguf(path: &Path) -> Result<GgufFile> {
    match GgufFile::open(path) {
        Ok(f) => Ok(f),
        // Already names the file.
        Err(e @ crate::gguf::GgufError::Io { .. }) => Err(e.into()),
        Err(e) => Err(e).with_context(|| format!("cannot load model {}", path.display())),
    }
}

/// Loads the model `args` names (pulled first when it is a Hub reference not cached), as
/// `serve` would.
pub fn load(args: &ModelArgs) -> Result<EngineAssets> {
    let path = args.source.resolve()?;
    loader::file_assets(&path, &args.run.load_options()).map_err(anyhow::Error::msg)
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(a) => cmd_generate(a),
        Command::Tokenize(a) => cmd_tokenize(a),
        Command::Logits(a) => cmd_logits(a),
        Command::Info(a) => cmd_info(a),
        Command::Serve(a) => serve::cmd_serve(a),
        Command::Health(a) => health::cmd_health(a),
        Command::Loadtest(a) => loadtest::cmd_loadtest(a),
        Command::Bench(a) => bench::cmd_bench(a),
        Command::Synth(a) => synth::cmd_synth(a),
        Command::Quantize(a) => quantize::cmd_quantize(a),
        Command::Pull(a) => hub::cmd_pull(a),
        Command::List(a) => hub::cmd_list(a),
        Command::Rm(a) => hub::cmd_rm(a),
    }
}

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        seed: a.seed,
        ..SamplingParams::default()
    };
    sampling.validate()?;
    let speculation = a.spec.speculation(Method::Ngram)?;
    let format = a.response_format()?;
    // Checked (files read, tools converted) before the model takes its time to load.
    let (input, format, with_tools) = if a.chat || a.tools.is_some() {
        chat_prompt(&a, format)?
    } else {
        let text = Prompt::Text {
            text: a.prompt.clone(),
            parse_special: false,
        };
        (text, format, false)
    };
    let path = a.model.source.resolve()?;
    let l = loader::file_assets(&path, &a.spec.load_options(a.model.run.load_options()))
        .map_err(anyhow::Error::msg)?;
    let grammar = match &format {
        None => None,
        Some(f) => Some(GrammarCompiler::new(&l.tokenizer, l.model.config.vocab)?.compile(f)?),
    };
    let prompt = prompt_tokens(&l.tokenizer, &l.chat_template, &input)?;
    check_context(prompt.len(), Some(a.max_tokens), l.ctx_size).map_err(|e| {
        anyhow!(
            "{e} (raise --ctx-size, up to {})",
            l.model.config.context_length
        )
    })?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling,
        stop: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        time_limit: None,
        grammar,
        speculate: true,
    };
    // Only the positions this run can fill: a whole long context of cache is gigabytes.
    let positions = (prompt.len() + a.max_tokens).min(l.ctx_size);
    let (kt, vt) = l.kv.types;
    eprintln!(
        "context: {} tokens (model: {}); KV cache {kt}/{vt}, {} bytes per position, {} for \
         this run's {positions} positions (KV memory: {:.2} GiB)",
        l.ctx_size,
        l.model.config.context_length,
        l.kv.bytes_per_token,
        bench::bytes_shown(l.kv.bytes(positions)),
        gib(l.kv.available),
    );
    let mut state = l.model.new_state(positions, l.state_rows);
    let stream = a.output == OutputFormat::Text;
    let reasoning = a.separate_reasoning.then(|| {
        // As the service does: a prompt ending in an open `<think>` starts inside it.
        let tail = &prompt[prompt.len().saturating_sub(8)..];
        ReasoningParser::after_prompt(&l.tokenizer.decode(tail, false).unwrap_or_default())
    });
    let mut out = ReplyOut {
        parser: ReplyParser::new(reasoning, with_tools),
        stream,
        stdout: std::io::stdout().lock(),
        reasoning: String::new(),
        in_reasoning: false,
        answer: String::new(),
        at_line_start: true,
        calls: Vec::new(),
    };
    let mut solo =
        Solo::new(&speculation, l.draft.as_ref(), positions).map_err(anyhow::Error::msg)?;
    let g = generate_speculative(
        &l.model,
        &l.tokenizer,
        &mut state,
        &prompt,
        &opts,
        solo.as_mut(),
        |ev| {
            if !ev.text.is_empty() {
                let piece = out.parser.push(ev.text);
                out.show(piece);
            }
            Flow::Continue
        },
    )?;
    let piece = out.parser.finish();
    out.show(piece);
    out.end_reasoning();
    let ReplyOut {
        mut stdout,
        reasoning,
        answer,
        calls,
        ..
    } = out;
    let m = &g.metrics;
    let mut finish = g.finish_reason;
    if finish == FinishReason::Eos && !calls.is_empty() {
        finish = FinishReason::ToolCalls;
    }
    let finish_reason = crate::server::service::finish_reason(Some(finish)).as_str_name();
    match a.output {
        OutputFormat::Text => {
            let _ = writeln!(stdout);
            drop(stdout);
            eprintln!();
            eprintln!(
                "backend: {} ({} threads)",
                l.model.device().name(),
                l.model.device().threads()
            );
            eprintln!("finish_reason: {finish_reason}");
            eprintln!("metrics:");
            eprintln!("  prompt_tokens: {}", m.prompt_tokens);
            eprintln!("  completion_tokens: {}", m.completion_tokens);
            eprintln!("  time_to_first_token_ms: {:.3}", m.time_to_first_token_ms);
            eprintln!(
                "  prefill_tokens_per_second: {:.3}",
                m.prefill_tokens_per_second
            );
            eprintln!(
                "  decode_tokens_per_second: {:.3}",
                m.decode_tokens_per_second
            );
            eprintln!(
                "  per_forward_ms: min {:.3}  max {:.3}  mean {:.3}  (n={})",
                m.per_forward_ms_min, m.per_forward_ms_max, m.per_forward_ms_mean, m.forward_calls
            );
            if m.masks > 0 {
                eprintln!(
                    "  grammar_mask_ms: mean {:.3}  p99 {:.3}  max {:.3}  (n={})",
                    m.mask_ms_mean, m.mask_ms_p99, m.mask_ms_max, m.masks
                );
            }
            if speculation.is_on() {
                eprintln!(
                    "  speculative ({}): drafted {}  accepted {}  in {} verify steps",
                    speculation.method.name(),
                    m.drafted_tokens,
                    m.accepted_tokens,
                    m.verify_steps
                );
            }
        }
        OutputFormat::Json => {
            let mut v = serde_json::json!({
                "text": answer,
                "tokens": g.tokens,
                "finish_reason": finish_reason,
                "seed": g.seed,
                "metrics": g.metrics,
            });
            if a.separate_reasoning {
                v["reasoning_content"] = reasoning.into();
            }
            if with_tools {
                v["tool_calls"] = calls.into();
            }
            writeln!(stdout, "{v}")?;
        }
    }
    Ok(())
}

/// The chat prompt of `generate --chat` (or `--tools`), built as the service builds a
/// Generate request's (tools and tool choice included), with the response format it
/// implies and whether the output has tool calls to find.
fn chat_prompt(
    a: &GenerateArgs,
    format: Option<ResponseFormat>,
) -> Result<(Prompt, Option<ResponseFormat>, bool)> {
    let mut messages = Vec::new();
    if let Some(sys) = &a.system {
        messages.push(Message::new("system", sys.clone()));
    }
    messages.push(Message::new("user", a.prompt.clone()));
    let mut spec = PromptSpec::new(Input::Messages(messages));
    if let Some(path) = &a.tools {
        spec.tools = read_tools(path)?;
        spec.tool_choice = match a.tool_choice.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            name => ToolChoice::Function(name.to_string()),
        };
    }
    spec.response_format = format;
    spec.enable_thinking = a.no_think.then_some(false);
    // The planner names request fields; two of them are flags here, said in their terms.
    let plan = plan_prompt(&spec).map_err(|e| match e {
        PlanError::UnknownToolChoice(name) => anyhow!(
            "--tool-choice names the function {name:?}, which is not among the tools of \
             --tools"
        ),
        PlanError::FormatWithForcedTool => anyhow!(
            "a response format flag (--json-schema, --json-object, --regex, --grammar) cannot \
             be combined with --tool-choice required or a tool's name"
        ),
        e => e.into(),
    })?;
    Ok((plan.prompt, plan.response_format, plan.tools))
}

/// The tools of a `--tools` file, as the service takes them.
fn read_tools(path: &Path) -> Result<Vec<Tool>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the tools file {shown}"))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("the tools file {shown} is not valid JSON"))?;
    let Some(items) = v.as_array() else {
        bail!("the tools file {shown} must hold a JSON array of tools");
    };
    let mut tools = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let bad = |why: &str| anyhow!("the tools file {shown}: tool {i} {why}");
        // OpenAI's wrapping, or the function itself.
        let f = match item.get("type") {
            Some(t) if t == "function" => item
                .get("function")
                .ok_or_else(|| bad("has type \"function\" but no \"function\" object"))?,
            Some(t) => return Err(bad(&format!("has type {t}; only \"function\" is known"))),
            None => item,
        };
        let Some(f) = f.as_object() else {
            return Err(bad("is not a JSON object"));
        };
        let name = match f.get("name") {
            Some(serde_json::Value::String(n)) => n.clone(),
            _ => return Err(bad("has no \"name\" string")),
        };
        let description = match f.get("description") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(d)) => d.clone(),
            Some(_) => return Err(bad("has a \"description\" that is not a string")),
        };
        let parameters = match f.get("parameters") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(p @ serde_json::Value::Object(_)) => p.to_string(),
            Some(_) => return Err(bad("has \"parameters\" that are not a JSON object")),
        };
        tools.push(Tool {
            name,
            description,
            parameters,
        });
    }
    if tools.is_empty() {
        bail!("the tools file {shown} holds no tools");
    }
    Ok(tools)
}

/// Where `generate` puts a reply's parts as they come: the answer on stdout, each tool
/// call as a JSON line on stdout, the reasoning on stderr (with --output text); all of it
/// kept for --output json.
struct ReplyOut<W: Write> {
    parser: ReplyParser,
    stream: bool,
    stdout: W,
    reasoning: String,
    /// The "[reasoning]" line is printed and its end is not.
    in_reasoning: bool,
    answer: String,
    at_line_start: bool,
    calls: Vec<serde_json::Value>,
}

impl<W: Write> ReplyOut<W> {
    fn show(&mut self, piece: ReplyPiece) {
        if !piece.reasoning.is_empty() {
            if self.stream {
                if !self.in_reasoning {
                    eprintln!("[reasoning]");
                    self.in_reasoning = true;
                }
                eprint!("{}", piece.reasoning);
            }
            self.reasoning.push_str(&piece.reasoning);
        }
        for p in piece.answer {
            self.end_reasoning();
            let shown = match p {
                Parsed::Text(t) => {
                    self.answer.push_str(&t);
                    t
                }
                Parsed::Call(c) => {
                    let arguments: serde_json::Value =
                        serde_json::from_str(&c.arguments).unwrap_or_default();
                    let call = serde_json::json!({"name": c.name, "arguments": arguments});
                    let mut line = if self.at_line_start {
                        String::new()
                    } else {
                        "\n".to_string()
                    };
                    line.push_str(&call.to_string());
                    line.push('\n');
                    self.calls.push(call);
                    line
                }
            };
            if self.stream && !shown.is_empty() {
                let _ = self.stdout.write_all(shown.as_bytes());
                let _ = self.stdout.flush();
                self.at_line_start = shown.ends_with('\n');
            }
        }
    }

    /// Closes the reasoning on stderr once the answer starts (or the reply ends).
    fn end_reasoning(&mut self) {
        if self.in_reasoning {
            eprintln!("\n[/reasoning]");
            self.in_reasoning = false;
        }
    }
}

fn cmd_tokenize(a: TokenizeArgs) -> Result<()> {
    let path = a.model.resolve()?;
    let gguf = open_gguf(&path)?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    let ids = tok.encode(&a.text, !a.no_parse_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let l = load(&a.model)?;
    let vocab = l.model.config.vocab;
    let n = a.ids.len();
    if n == 0 {
        bail!("--ids is empty");
    }
    // Only the positions the ids fill (a forward past the model's context is refused).
    let ctx = n.min(l.model.config.context_length);
    let mut state = l.model.new_state(ctx, l.state_rows);
    let rows = if a.all { n } else { 1 };
    let mut out = vec![0.0f32; rows * vocab];
    let logits = if a.all {
        Logits::All(&mut out)
    } else {
        Logits::Last(&mut out)
    };
    l.model.forward(&mut state, &a.ids, logits)?;
    let rows: Vec<&[f32]> = out.chunks(vocab).collect();
    let v = serde_json::json!({ "n_vocab": vocab, "logits": rows });
    println!("{v}");
    Ok(())
}

fn cmd_info(a: InfoArgs) -> Result<()> {
    let path = a.model.resolve()?;
    let gguf = open_gguf(&path)?;
    let parts: Vec<String> = gguf
        .paths()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let arch = gguf.architecture().ok().map(str::to_string);
    let config_result = crate::model::ModelConfig::from_gguf(&gguf);
    let config = config_result.as_ref().ok();
    let has_tokenizer = gguf.get("tokenizer.ggml.tokens").is_some();
    let tokenizer_model = gguf
        .get_str("tokenizer.ggml.model")
        .ok()
        .map(str::to_string);
    let has_template = gguf.get("tokenizer.chat_template").is_some();
    let tensors: Vec<serde_json::Value> = gguf
        .tensors()
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name, "dtype": t.dtype.name(), "dims": t.dims, "bytes": t.n_bytes,
                "supported": crate::tensor::is_supported(t.dtype),
            })
        })
        .collect();
    if a.output == OutputFormat::Json {
        let v = serde_json::json!({
            "file": path.display().to_string(),
            "parts": parts,
            "version": gguf.version(),
            "architecture": arch,
            "config": config.map(config_json),
            "config_error": config_result.as_ref().err().map(|e| e.to_string()),
            "tokenizer": tokenizer_model,
            "chat_template": has_template,
            "tensors": tensors,
        });
        println!("{v}");
        return Ok(());
    }
    println!("file: {}", path.display());
    if parts.len() > 1 {
        println!("split into {} parts:", parts.len());
        for p in &parts {
            println!("  {p}");
        }
    }
    println!("gguf version: {}", gguf.version());
    println!("architecture: {}", arch.as_deref().unwrap_or("(none)"));
    match &config_result {
        Ok(c) => {
            println!("  layers: {}", c.n_layers);
            println!("  hidden: {}", c.hidden);
            println!("  ffn: {}", c.ffn);
            if let Some(m) = c.moe {
                println!(
                    "  experts: {} ({} used per token, expert ffn {}, {})",
                    m.n_experts,
                    m.n_used,
                    m.expert_ffn,
                    if m.normalize {
                        "renormalised"
                    } else {
                        "not renormalised"
                    }
                );
            }
            println!(
                "  heads: {} (kv {}) x head_dim {}",
                c.n_heads, c.n_kv_heads, c.head_dim
            );
            println!("  vocab: {}", c.vocab);
            println!("  context_length: {}", c.context_length);
            println!("  rope_theta: {}", c.rope_theta);
            println!("  rope_scaling: {:?}", c.rope_scaling);
            println!("  rms_eps: {:e}", c.rms_eps);
        }
        Err(e) => println!("  (not runnable: {e})"),
    }
    println!(
        "tokenizer: {}",
        match (&tokenizer_model, has_tokenizer) {
            (Some(m), true) => m.as_str(),
            _ => "(none)",
        }
    );
    println!("chat template: {}", if has_template { "yes" } else { "no" });
    let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
    println!(
        "tensors: {} ({:.2} MiB)",
        gguf.tensors().len(),
        total as f64 / 1048576.0
    );
    for t in gguf.tensors() {
        let flag = if crate::tensor::is_supported(t.dtype) {
            ""
        } else {
            "  (unsupported)"
        };
        println!(
            "  {:<32} {:<6} {:?} {} bytes{}",
            t.name,
            t.dtype.name(),
            t.dims,
            t.n_bytes,
            flag
        );
    }
    Ok(())
}

/// A progress bar on stderr for long work, drawn only when stderr is a terminal (hidden,
/// so silent, in logs and pipes).
pub fn progress_bar(len: u64, message: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg:>14} [{bar:40}] {pos}/{len} ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}

/// A model's hyper-parameters as a JSON object, named as `info` prints them.
fn config_json(c: &crate::model::ModelConfig) -> serde_json::Value {
    // JSON numbers are f64: widen an f32 through its shortest decimal, so 1e-6 stays 1e-6
    // and does not print as 9.99999997e-7.
    let wide = |x: f32| x.to_string().parse::<f64>().unwrap_or(f64::from(x));
    let mut v = serde_json::json!({
        "architecture": c.arch.name(),
        "layers": c.n_layers,
        "hidden": c.hidden,
        "ffn": c.ffn,
        "heads": c.n_heads,
        "kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "vocab": c.vocab,
        "context_length": c.context_length,
        "rope_theta": wide(c.rope_theta),
        "rms_eps": wide(c.rms_eps),
    });
    if let Some(m) = c.moe {
        v["experts"] = serde_json::json!({
            "count": m.n_experts,
            "used": m.n_used,
            "ffn": m.expert_ffn,
            "normalize": m.normalize,
        });
    }
    v
}

/// Logs to stderr; `RUST_LOG` filters (default: warnings, and info from inferno; the
/// Vulkan loader's and driver's own chatter that wgpu relays is left out, since the gpu
/// backend turns what matters into its own errors).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,inferno=info,wgpu_hal=off"));
    // Colours only on a terminal: a log file or a test's captured output gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every subcommand and every flag or positional argument of every command says what it
    /// is for in `--help`.
    #[test]
    fn every_command_and_argument_has_a_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                // clap's own --help and --version.
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        let cmd = Cli::command();
        let mut missing = Vec::new();
        walk(&cmd, "inferno", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
        // The tree really was walked: a nested flag is reached.
        let generate = cmd.find_subcommand("generate").expect("generate");
        assert!(generate.get_arguments().any(|a| a.get_id() == "top_k"));
    }

    #[test]
    fn threads_help_says_what_zero_means() {
        let cmd = Cli::command();
        for name in ["generate", "serve", "loadtest", "logits"] {
            let sub = cmd.find_subcommand(name).expect(name);
            let threads = sub
                .get_arguments()
                .find(|a| a.get_id() == "threads")
                .unwrap_or_else(|| panic!("{name} has --threads"));
            let help = threads
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(help.contains("0 = "), "{name}: {help}");
        }
    }
}
