//! Loading what the engine thread serves: a GGUF file from disk, or the built-in demo model
//! generated in memory. These run on the engine thread (they are the loader it is given).

use crate::backend::threadpool::default_threads;
use crate::backend::{create_backend, BackendOptions};
use crate::engine::worker::{EngineAssets, ModelDescription};
use crate::gguf::{GgufError, GgufFile};
use crate::model::synth::{self, SynthSpec};
use crate::model::Model;
use crate::tensor::GgmlType;
use crate::tokenizer::{ChatTemplate, Tokenizer};
use std::path::Path;
use std::sync::Arc;

/// Prompt tokens per prefill forward call.
const PREFILL_BATCH: usize = 512;

/// How to run the model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: String,
    pub threads: usize,
    /// Context window; `None` takes the model's, capped at 4096.
    pub ctx_size: Option<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            backend: "pool".into(),
            threads: 0,
            ctx_size: None,
        }
    }
}

/// Loads everything the engine needs from an opened GGUF file.
pub fn assets_from_gguf(
    gguf: &GgufFile,
    name: &str,
    demo: bool,
    opts: &LoadOptions,
) -> Result<EngineAssets, String> {
    let backend = create_backend(
        &opts.backend,
        &BackendOptions {
            threads: opts.threads,
            tracing: true,
        },
    )
    .map_err(|e| e.to_string())?;
    let model = Model::load(gguf, backend).map_err(|e| format!("cannot load model {name}: {e}"))?;
    let tokenizer = Tokenizer::from_gguf(gguf)
        .map_err(|e| format!("cannot load the tokenizer of {name}: {e}"))?;
    let chat_template = ChatTemplate::for_model(gguf);
    let ctx_size = opts
        .ctx_size
        .unwrap_or(4096)
        .min(model.config.context_length)
        .max(2);
    Ok(EngineAssets {
        model,
        tokenizer: Arc::new(tokenizer),
        chat_template: Arc::new(chat_template),
        ctx_size,
        max_batch: PREFILL_BATCH,
        description: ModelDescription {
            name: name.to_string(),
            backend: opts.backend.clone(),
            threads: backend_threads(&opts.backend, opts.threads),
            demo,
        },
    })
}

/// Threads the backend really runs on: the single-threaded ones use one; the others
/// resolve 0 to the default the factory used.
fn backend_threads(backend: &str, asked: usize) -> usize {
    match backend.trim() {
        // The GPU backend runs each step on the device from the engine thread alone.
        "scalar" | "simd" | "gpu" | "vulkan" | "metal" => 1,
        _ if asked == 0 => default_threads(),
        _ => asked,
    }
}

/// Loads a GGUF model file.
pub fn file_assets(path: &Path, opts: &LoadOptions) -> Result<EngineAssets, String> {
    let gguf = GgufFile::open(path).map_err(|e| match e {
        // Already names the file.
        GgufError::Io { .. } => e.to_string(),
        _ => format!("cannot load model {}: {e}", path.display()),
    })?;
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
