//! Flags several commands share, each group defined once and flattened into the commands
//! that take it: where the model comes from (`--model`, Hub access), how it runs (backend,
//! threads, context, KV cache types, experts), speculative decoding, and `--output`.

use crate::backend::KvType;
use crate::engine::loader::{self, EngineAssets, ExpertLoad, LoadOptions};
use crate::engine::speculative::{Method, Speculation};
use crate::hub::{self, HubOptions};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

// How a command prints its results: text for reading, json for scripts.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum OutputFormat {
    Text,
    Json,
}

/// The help of every `--model`.
pub const MODEL_HELP: &str = "A GGUF model: a local file (for a split model, its first part \
    ...-00001-of-0000N.gguf), or a model on the Hugging Face Hub, pulled into its cache when \
    missing: USER/REPO[:QUANT] (also hf.co/USER/REPO[:QUANT]; without QUANT, Q4_K_M, else \
    Q8_0, else the first GGUF) or USER/REPO/FILE.gguf, each with an optional @REVISION. An \
    existing local path always wins";

/// Access to the Hugging Face Hub, for commands that may pull a model.
#[derive(Args, Debug, Clone, Default)]
pub struct HubArgs {
    /// File holding a Hugging Face access token, for gated or private repositories (default:
    /// HF_TOKEN, else the token `hf auth login` saved). HF_ENDPOINT, HF_HOME and
    /// HF_HUB_OFFLINE=1 are read as huggingface_hub reads them.
    #[arg(long, value_name = "FILE")]
    pub hf_token_file: Option<PathBuf>,
}

impl HubArgs {
    pub fn options(&self) -> Result<HubOptions> {
        Ok(HubOptions::from_env(self.hf_token_file.as_deref())?)
    }

    /// The local file `model` names, pulling a Hub reference first.
    pub fn resolve(&self, model: &str) -> Result<PathBuf> {
        Ok(hub::resolve(model, &self.options()?)?)
    }
}

/// A command's model: `--model` and how to reach the Hub for it.
#[derive(Args, Debug, Clone)]
pub struct ModelSource {
    #[arg(long, short = 'm', value_name = "PATH|USER/REPO[:QUANT]", help = MODEL_HELP)]
    pub model: String,
    #[command(flatten)]
    pub hub: HubArgs,
}

impl ModelSource {
    /// The local file to open (see [`HubArgs::resolve`]).
    pub fn resolve(&self) -> Result<PathBuf> {
        self.hub.resolve(&self.model)
    }
}

/// The model of a command that has a built-in one to fall back on (`serve`, and `loadtest`
/// for `--baseline`): `--model`, else the synthetic model `--synthetic` names. The help
/// texts are `serve`'s; `loadtest` words its own.
#[derive(Args, Debug, Clone)]
pub struct ModelOrSynthetic {
    /// The model to serve (without it, a small built-in demo model with random weights,
    /// whose text is random). A Hub reference not yet cached is pulled before serving, while
    /// health says NOT_SERVING.
    #[arg(long, short = 'm', value_name = "PATH|USER/REPO[:QUANT]", help = format!(
        "{} [without --model: a small built-in demo model with random weights, whose text \
         is random; a Hub model not yet cached is pulled before serving, health NOT_SERVING \
         meanwhile]",
        MODEL_HELP
    ))]
    pub model: Option<String>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// Built-in synthetic model served when no --model is given: demo, or 0.6b for a
    /// random-weight model of Qwen3-0.6B's shape.
    #[arg(long, default_value = "demo")]
    pub synthetic: String,
}

/// A model to load and how it runs, for the commands that run one without serving it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    #[command(flatten)]
    pub source: ModelSource,
    #[command(flatten)]
    pub run: RunArgs,
}

impl ModelArgs {
    /// Loads the model these flags name (pulled first when it is a Hub reference not cached),
    /// as `serve` would.
    pub fn load(&self) -> Result<EngineAssets> {
        let path = self.source.resolve()?;
        loader::file_assets(&path, &self.run.load_options()).map_err(anyhow::Error::msg)
    }
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
    #[command(flatten)]
    pub memory: MemoryArgs,
}

/// How a loaded model keeps its state and weights: KV cache types and where the experts of
/// a mixture-of-experts model live. Part of [`RunArgs`]; `bench` takes it alone, with
/// llama-bench's short names for the cache types.
#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
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
            cache_type_k: self.memory.cache_type_k,
            cache_type_v: self.memory.cache_type_v,
            experts: self.memory.experts,
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
