//! The `inferno` command line: generate, tokenize, logits, info, serve, loadtest, bench and synth.

pub mod bench;
pub mod loadtest;
pub mod quantize;
pub mod serve;
pub mod synth;

use crate::backend::{create_backend, BackendOptions};
use crate::engine::{generate, Flow, GenerateOptions};
use crate::gguf::GgufFile;
use crate::model::{Logits, Model};
use crate::sampling::SamplingParams;
use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Load-test a running service: throughput, time to first token, status counts.
    Loadtest(loadtest::LoadtestArgs),
    /// Time prompt processing and generation, llama-bench style.
    Bench(bench::BenchArgs),
    /// Write a random-weight GGUF of a real model's shape (for benchmarks).
    Synth(synth::SynthArgs),
    /// Rewrite a GGUF model with its weight matrices in another type (e.g. Q8_0).
    Quantize(quantize::QuantizeArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Path to a GGUF model file.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Compute backend: pool (fastest on the CPU), parallel, simd, scalar (the reference), or
    /// gpu (alias vulkan, or metal on macOS: the whole forward pass on the GPU).
    #[arg(long, default_value = "pool")]
    pub backend: String,
    /// Worker threads (default: INFERNO_THREADS or the machine's performance cores).
    #[arg(long, env = "INFERNO_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Context window in tokens (default: the model's, capped at 4096).
    #[arg(long)]
    pub ctx_size: Option<usize>,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
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
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    pub prompt: String,
}

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Treat special-token text such as <|im_start|> as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
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
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Everything loaded from one model file.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub chat_template: ChatTemplate,
    pub ctx_size: usize,
}

pub fn open_gguf(path: &Path) -> Result<GgufFile> {
    match GgufFile::open(path) {
        Ok(f) => Ok(f),
        // Already names the file.
        Err(e @ crate::gguf::GgufError::Io { .. }) => Err(e.into()),
        Err(e) => Err(e).with_context(|| format!("cannot load model {}", path.display())),
    }
}

pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let gguf = open_gguf(&args.model)?;
    let backend = create_backend(
        &args.backend,
        &BackendOptions {
            threads: args.threads,
            tracing: true,
        },
    )?;
    let model = Model::load(&gguf, Arc::clone(&backend))
        .with_context(|| format!("cannot load model {}", args.model.display()))?;
    let tokenizer = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("cannot load the tokenizer of {}", args.model.display()))?;
    let chat_template = ChatTemplate::for_model(&gguf);
    let ctx_size = args
        .ctx_size
        .unwrap_or(4096)
        .min(model.config.context_length)
        .max(1);
    Ok(Loaded {
        model,
        tokenizer,
        chat_template,
        ctx_size,
    })
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(a) => cmd_generate(a),
        Command::Tokenize(a) => cmd_tokenize(a),
        Command::Logits(a) => cmd_logits(a),
        Command::Info(a) => cmd_info(a),
        Command::Serve(a) => serve::cmd_serve(a),
        Command::Loadtest(a) => loadtest::cmd_loadtest(a),
        Command::Bench(a) => bench::cmd_bench(a),
        Command::Synth(a) => synth::cmd_synth(a),
        Command::Quantize(a) => quantize::cmd_quantize(a),
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
    let l = load(&a.model)?;
    let text = if a.chat {
        let mut messages = Vec::new();
        if let Some(sys) = &a.system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: sys.clone(),
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: a.prompt.clone(),
        });
        l.chat_template
            .render(&messages, true, a.no_think.then_some(false))?
    } else {
        a.prompt.clone()
    };
    let mut prompt = Vec::new();
    if l.tokenizer.add_bos() {
        prompt.extend(l.tokenizer.bos_id());
    }
    prompt.extend(l.tokenizer.encode(&text, a.chat)?);
    if prompt.len() >= l.ctx_size {
        bail!(
            "the prompt has {} tokens but the context holds {} (raise --ctx-size, up to {})",
            prompt.len(),
            l.ctx_size,
            l.model.config.context_length
        );
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling,
        stop: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        time_limit: None,
    };
    let mut state = l.model.new_state(l.ctx_size, 512);
    let stream = a.output == OutputFormat::Text;
    let mut stdout = std::io::stdout().lock();
    let g = generate(&l.model, &l.tokenizer, &mut state, &prompt, &opts, |ev| {
        if stream && !ev.text.is_empty() {
            let _ = stdout.write_all(ev.text.as_bytes());
            let _ = stdout.flush();
        }
        Flow::Continue
    })?;
    let m = &g.metrics;
    match a.output {
        OutputFormat::Text => {
            let _ = writeln!(stdout);
            drop(stdout);
            eprintln!();
            eprintln!("backend: {}", l.model.backend().name());
            eprintln!("finish_reason: {:?}", g.finish_reason);
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
        }
        OutputFormat::Json => {
            let v = serde_json::json!({
                "text": g.text,
                "tokens": g.tokens,
                "finish_reason": g.finish_reason,
                "seed": g.seed,
                "metrics": g.metrics,
            });
            writeln!(stdout, "{v}")?;
        }
    }
    Ok(())
}

fn cmd_tokenize(a: TokenizeArgs) -> Result<()> {
    let gguf = open_gguf(&a.model)?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("cannot load the tokenizer of {}", a.model.display()))?;
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
    let ctx = n.max(l.ctx_size).min(l.model.config.context_length);
    let mut state = l.model.new_state(ctx, 512);
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
    let gguf = open_gguf(&a.model)?;
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
            "file": a.model.display().to_string(),
            "version": gguf.version(),
            "architecture": arch,
            "config": config.map(|c| format!("{c:?}")),
            "tokenizer": tokenizer_model,
            "chat_template": has_template,
            "tensors": tensors,
        });
        println!("{v}");
        return Ok(());
    }
    println!("file: {}", a.model.display());
    println!("gguf version: {}", gguf.version());
    println!("architecture: {}", arch.as_deref().unwrap_or("(none)"));
    match &config_result {
        Ok(c) => {
            println!("  layers: {}", c.n_layers);
            println!("  hidden: {}", c.hidden);
            println!("  ffn: {}", c.ffn);
            println!(
                "  heads: {} (kv {}) x head_dim {}",
                c.n_heads, c.n_kv_heads, c.head_dim
            );
            println!("  context_length: {}", c.context_length);
            println!("  rope_theta: {}", c.rope_theta);
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

/// Logs to stderr; `RUST_LOG` filters (default: warnings, and info from inferno; the
/// Vulkan loader's and driver's own chatter that wgpu relays is left out, since the gpu
/// backend turns what matters into its own errors).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,inferno=info,wgpu_hal=off"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for a person at a terminal, not in files and log collectors.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
