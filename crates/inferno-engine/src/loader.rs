//! Loading a model to run: a GGUF file or a built-in synthetic model, on a named backend
//! stack, with its tokenizer, chat template and context window. The one loader behind
//! `serve` (where it runs on the engine thread), `generate`, `logits`, `bench` and
//! `loadtest`, so they share their defaults.

use super::memory::{self, gib, KvMemory, SystemMemory};
use super::speculative::draft::DraftModel;
use inferno_backend::{create_backend, BackendOptions, KvType};
use inferno_gguf::{GgufError, GgufFile};
use inferno_model::synth::{self, SynthSpec};
use inferno_model::{ExpertWeights, Model};
use inferno_tensor::GgmlType;
use inferno_tokenizer::{ChatTemplate, Tokenizer};
use std::path::Path;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// What `GetModelInfo` says of a built-in synthetic model.
pub const DEMO_NOTE: &str = "this is a built-in demo model with random weights, so its text \
    is random: serve a real model by name with `inferno serve --model \
    Qwen/Qwen3-0.6B-GGUF:Q8_0`";

/// Token rows of a single-sequence [`inferno_model::State`]: the most prompt tokens one of
/// its forward calls runs.
pub const STATE_ROWS: usize = 512;

/// How to run the model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: String,
    /// Worker threads of the multi-threaded backends (0 = the machine's default).
    pub threads: usize,
    /// Context window, at most the model's; `None` takes the model's where one sequence of
    /// it fits in memory, else the largest that does (see [`memory::context_window`]).
    pub ctx_size: Option<usize>,
    /// A TRACE span around every operation of every step (kernel spans).
    pub tracing: bool,
    /// What the KV cache stores keys and values as; `None` takes the model's default (F32
    /// for an F32 model, else F16).
    pub cache_type_k: Option<KvType>,
    pub cache_type_v: Option<KvType>,
    /// How a mixture-of-experts model's expert matrices are loaded.
    pub experts: ExpertLoad,
    /// A draft model for speculative decoding: a smaller GGUF of the same vocabulary,
    /// loaded on the same device with the same KV cache types.
    pub draft_model: Option<std::path::PathBuf>,
}

/// How to load a mixture-of-experts model's experts (see [`ExpertWeights`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertLoad {
    /// Repacked when the whole model fits in the memory available at load with the
    /// KV margin ([`memory::margin`]) to spare, else memory-mapped.
    #[default]
    Auto,
    /// Always repacked (resident).
    Repack,
    /// Always memory-mapped.
    Mmap,
}

impl ExpertLoad {
    /// The names the command line takes.
    pub const NAMES: &[&str] = &["auto", "repack", "mmap"];

    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "auto" => Ok(Self::Auto),
            "repack" => Ok(Self::Repack),
            "mmap" => Ok(Self::Mmap),
            _ => Err(format!(
                "unknown experts mode {name:?} (supported: {})",
                Self::NAMES.join(", ")
            )),
        }
    }

    /// What this choice means for a model of `weights` bytes on a machine with `machine`
    /// memory (`None`: unknown, which keeps auto mapped), with the reason, for the log.
    pub fn resolve(self, weights: u64, machine: Option<SystemMemory>) -> (ExpertWeights, String) {
        match self {
            Self::Repack => (
                ExpertWeights::Prepared,
                "repacked (--experts repack)".into(),
            ),
            Self::Mmap => (
                ExpertWeights::Mapped,
                "memory-mapped (--experts mmap)".into(),
            ),
            Self::Auto => match machine {
                Some(m) if weights.saturating_add(memory::margin(m.total)) <= m.available => (
                    ExpertWeights::Prepared,
                    format!(
                        "repacked: the {:.2} GiB of weights fit in the {:.2} GiB available",
                        gib(weights),
                        gib(m.available)
                    ),
                ),
                Some(m) => (
                    ExpertWeights::Mapped,
                    format!(
                        "memory-mapped: the {:.2} GiB of weights and a {:.2} GiB margin do not \
                         fit in the {:.2} GiB available (prompts run slower; --experts repack \
                         overrides)",
                        gib(weights),
                        gib(memory::margin(m.total)),
                        gib(m.available)
                    ),
                ),
                None => (
                    ExpertWeights::Mapped,
                    "memory-mapped: the machine's memory is unknown".into(),
                ),
            },
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            backend: "pool".into(),
            threads: 0,
            ctx_size: None,
            tracing: true,
            cache_type_k: None,
            cache_type_v: None,
            experts: ExpertLoad::Auto,
            draft_model: None,
        }
    }
}

/// How the loaded model is described to clients.
#[derive(Clone, Debug, Default)]
pub struct ModelDescription {
    pub name: String,
    /// The file's `general.name`, where it has a non-empty one.
    pub general_name: Option<String>,
    pub backend: String,
    pub threads: usize,
    pub demo: bool,
}

/// A loaded model and everything needed to run requests on it.
pub struct EngineAssets {
    pub model: Model,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    /// Positions one sequence may hold (prompt plus completion).
    pub ctx_size: usize,
    /// The KV cache's types, size per position and the memory it may take.
    pub kv: KvMemory,
    /// Token rows for a single-sequence [`inferno_model::State`] ([`STATE_ROWS`]; the engine
    /// itself runs [`super::EngineConfig::prefill_chunk`] prompt tokens per step).
    pub state_rows: usize,
    pub description: ModelDescription,
    /// The draft model for speculative decoding, when one was given.
    pub draft: Option<DraftModel>,
}

/// A model loaded on a backend, with the threads that backend runs on.
pub struct LoadedModel {
    pub model: Model,
    pub threads: usize,
    /// How the experts were loaded and why (mixture-of-experts models).
    pub experts: Option<String>,
}

/// Builds the backend stack `opts` names and loads the model's weights onto it.
pub fn load_model(gguf: &GgufFile, name: &str, opts: &LoadOptions) -> Result<LoadedModel, String> {
    let backend = create_backend(
        &opts.backend,
        &BackendOptions {
            threads: opts.threads,
            tracing: opts.tracing,
        },
    )
    .map_err(|e| e.to_string())?;
    let moe = gguf
        .tensors()
        .iter()
        .any(|t| t.name.ends_with("_exps.weight"));
    let (experts, why) = if moe && backend.is_gpu() {
        // The device holds its own copy of each stack; the host's stay mapped.
        let why = "uploaded to the GPU, one stack per projection".to_string();
        info!("experts {why}");
        (ExpertWeights::Mapped, Some(why))
    } else if moe && opts.backend.trim() == "scalar" {
        // The reference backend repacks nothing: every weight stays as stored.
        let why = "memory-mapped (the scalar backend multiplies them as stored)".to_string();
        info!("experts {why}");
        (ExpertWeights::Mapped, Some(why))
    } else if moe {
        let (experts, why) = opts
            .experts
            .resolve(weight_bytes(gguf), SystemMemory::read());
        info!("experts {why}");
        (experts, Some(why))
    } else {
        (ExpertWeights::Mapped, None)
    };
    let mut model = Model::load_with(gguf, backend, experts)
        .map_err(|e| format!("cannot load model {name}: {e}"))?;
    let (k, v) = model.kv_types();
    model
        .set_kv_types((
            opts.cache_type_k.unwrap_or(k),
            opts.cache_type_v.unwrap_or(v),
        ))
        .map_err(|e| format!("cannot use that KV cache type for {name}: {e}"))?;
    let threads = model.device().threads();
    Ok(LoadedModel {
        model,
        threads,
        experts: why,
    })
}

/// Bytes the model's weights take once loaded.
fn weight_bytes(gguf: &GgufFile) -> u64 {
    gguf.tensors().iter().map(|t| t.n_bytes).sum()
}

/// Loads everything a generation needs from an opened GGUF file.
pub fn assets_from_gguf(
    gguf: &GgufFile,
    name: &str,
    demo: bool,
    opts: &LoadOptions,
) -> Result<EngineAssets, String> {
    // Read before loading, so the model's own memory is counted once: as the resident
    // size subtracted below.
    let machine = SystemMemory::read();
    let LoadedModel { model, threads, .. } = load_model(gguf, name, opts)?;
    let tokenizer = Tokenizer::from_gguf(gguf)
        .map_err(|e| format!("cannot load the tokenizer of {name}: {e}"))?;
    let draft = match &opts.draft_model {
        Some(path) => Some(load_draft(path, &model, &tokenizer, opts)?),
        None => None,
    };
    let chat_template = ChatTemplate::for_model(gguf);
    let kv = KvMemory {
        types: model.kv_types(),
        bytes_per_token: model.kv_bytes_per_token(),
        // The weights at least; the process's resident size where it is known, which also
        // counts what the backend holds besides them (buffers, any copy of the weights).
        available: memory::kv_memory(
            machine,
            memory::resident_bytes()
                .unwrap_or(0)
                .max(weight_bytes(gguf)),
        ),
    };
    let model_ctx = model.config.context_length;
    let window = memory::context_window(opts.ctx_size, model_ctx, kv.bytes_per_token, kv.available)
        .map_err(|e| format!("{name}: {e}"))?;
    if let Some(why) = &window.warning {
        warn!("{why}");
    }
    let ctx_size = window.ctx;
    if machine.is_none() {
        warn!(
            kv_memory_gib = gib(kv.available),
            "cannot read this system's memory: the KV cache may take a fixed amount"
        );
    }
    // Each command prints these where it starts (serve: "engine ready").
    debug!(
        ctx_size,
        model_context_length = model_ctx,
        cache_type_k = %kv.types.0,
        cache_type_v = %kv.types.1,
        kv_bytes_per_token = kv.bytes_per_token,
        kv_per_sequence_gib = format!("{:.3}", gib(kv.bytes(ctx_size))),
        kv_memory_gib = format!("{:.2}", gib(kv.available)),
        "context window"
    );
    Ok(EngineAssets {
        model,
        tokenizer: Arc::new(tokenizer),
        chat_template: Arc::new(chat_template),
        ctx_size,
        kv,
        state_rows: STATE_ROWS,
        description: ModelDescription {
            name: name.to_string(),
            general_name: gguf
                .get_str("general.name")
                .ok()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string),
            backend: opts.backend.clone(),
            threads,
            demo,
        },
        draft,
    })
}

/// Loads the draft model at `path` for `main` (whose tokenizer is `tokenizer`): on the same
/// device (the same thread pool), its KV caches of the same types; refused unless its
/// vocabulary is the main model's.
pub fn load_draft(
    path: &Path,
    main: &Model,
    tokenizer: &Tokenizer,
    opts: &LoadOptions,
) -> Result<DraftModel, String> {
    let gguf = open_file(path)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let draft_tok = Tokenizer::from_gguf(&gguf)
        .map_err(|e| format!("cannot load the tokenizer of the draft model {name}: {e}"))?;
    // Checked before the weights load: a wrong file fails at once.
    crate::speculative::draft::same_vocabulary(tokenizer, &draft_tok)
        .map_err(|e| format!("the draft model {name} cannot draft for this model: {e}"))?;
    let mut model = Model::load(&gguf, main.device().clone())
        .map_err(|e| format!("cannot load the draft model {name}: {e}"))?;
    model
        .set_kv_types(main.kv_types())
        .map_err(|e| format!("cannot use that KV cache type for the draft model {name}: {e}"))?;
    info!(draft_model = %name, backend = %opts.backend, "draft model loaded");
    DraftModel::new(model, name, &draft_tok, tokenizer, main.config.vocab)
}

/// Opens a GGUF model file.
pub fn open_file(path: &Path) -> Result<GgufFile, String> {
    GgufFile::open(path).map_err(|e| match e {
        // Already names the file.
        GgufError::Io { .. } => e.to_string(),
        _ => format!("cannot load model {}: {e}", path.display()),
    })
}

/// Loads a GGUF model file.
pub fn file_assets(path: &Path, opts: &LoadOptions) -> Result<EngineAssets, String> {
    let gguf = open_file(path)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    assets_from_gguf(&gguf, &name, false, opts)
}

/// Generates a synthetic random-weight model (`demo` or `0.6b`, Q8_0) in memory.
pub fn synthetic_assets(preset: &str, opts: &LoadOptions) -> Result<EngineAssets, String> {
    let spec = SynthSpec::preset(preset, GgmlType::Q8_0).ok_or_else(|| {
        format!(
            "unknown synthetic model {preset:?} (known: {})",
            synth::PRESETS.join(", ")
        )
    })?;
    let bytes = synth::build(&spec)
        .map_err(|e| format!("cannot build the {preset} model: {e}"))?
        .to_bytes();
    let gguf =
        GgufFile::from_bytes(bytes).map_err(|e| format!("cannot read the {preset} model: {e}"))?;
    assets_from_gguf(&gguf, preset, true, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo model as an opened GGUF file.
    fn demo_gguf() -> GgufFile {
        let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
        GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap()
    }

    #[test]
    fn auto_repacks_experts_only_when_the_weights_fit_with_the_margin() {
        let gb = 1u64 << 30;
        let machine = |total, available| Some(SystemMemory { total, available });
        let auto = |weights, m| ExpertLoad::Auto.resolve(weights, m).0;
        // 24 GiB machine: the margin is 20% (4.8 GiB).
        assert_eq!(
            auto(17 * gb, machine(24 * gb, 22 * gb)),
            ExpertWeights::Prepared
        );
        assert_eq!(
            auto(18 * gb, machine(24 * gb, 22 * gb)),
            ExpertWeights::Mapped
        );
        // Less available than total (other processes) counts.
        assert_eq!(
            auto(17 * gb, machine(24 * gb, 12 * gb)),
            ExpertWeights::Mapped
        );
        assert_eq!(auto(gb, None), ExpertWeights::Mapped);
        // The explicit choices ignore memory.
        let m = machine(8 * gb, 4 * gb);
        assert_eq!(
            ExpertLoad::Repack.resolve(17 * gb, m).0,
            ExpertWeights::Prepared
        );
        assert_eq!(ExpertLoad::Mmap.resolve(gb, m).0, ExpertWeights::Mapped);
        let (_, why) = ExpertLoad::Auto.resolve(18 * gb, machine(24 * gb, 22 * gb));
        assert!(why.contains("--experts repack"), "{why}");
        assert_eq!(ExpertLoad::parse("mmap"), Ok(ExpertLoad::Mmap));
        assert!(ExpertLoad::parse("paged")
            .unwrap_err()
            .contains("supported: auto, repack, mmap"));
    }

    #[test]
    fn single_threaded_backends_report_one_thread() {
        let gguf = demo_gguf();
        let threads = |backend: &str, threads| {
            let opts = LoadOptions {
                backend: backend.into(),
                threads,
                ..LoadOptions::default()
            };
            load_model(&gguf, "demo", &opts).unwrap().threads
        };
        assert_eq!(threads("scalar", 8), 1);
        assert_eq!(threads("simd", 0), 1);
        assert_eq!(threads("pool", 3), 3);
        assert_eq!(
            threads("parallel", 0),
            inferno_backend::cpu::threadpool::default_threads()
        );
    }

    #[test]
    fn kv_cache_types_follow_the_options() {
        let gguf = demo_gguf();
        let load = |k, v| {
            let opts = LoadOptions {
                backend: "simd".into(),
                cache_type_k: k,
                cache_type_v: v,
                ..LoadOptions::default()
            };
            load_model(&gguf, "demo", &opts).map(|m| m.model.kv_types())
        };
        // A Q8_0 model defaults to F16 caches; either half can be changed alone.
        assert_eq!(load(None, None).unwrap(), (KvType::F16, KvType::F16));
        assert_eq!(
            load(Some(KvType::Q8_0), None).unwrap(),
            (KvType::Q8_0, KvType::F16)
        );
        assert_eq!(
            load(None, Some(KvType::F32)).unwrap(),
            (KvType::F16, KvType::F32)
        );
    }
}
