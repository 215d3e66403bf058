//! `inferno synth`: writes a random-weight GGUF of a real model's shape, so benchmarks need
//! no download.

use crate::model::synth::{self, SynthSpec, LLAMA_PRESETS, PRESETS, QWEN3MOE_PRESETS};
use crate::model::Architecture;
use crate::tensor::GgmlType;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Architecture of the file: qwen3, llama or qwen3moe.
    #[arg(long, default_value = "qwen3")]
    pub arch: String,
    /// Shape preset. qwen3: 0.6b (exactly Qwen3-0.6B's shape, the default) or demo (a small
    /// model); llama: 1b (exactly Llama-3.2-1B's shape, the default); qwen3moe: 30b-a3b
    /// (exactly Qwen3-30B-A3B's shape, the default) or tiny (2 layers, 8 experts).
    #[arg(long)]
    pub preset: Option<String>,
    /// Decoder blocks to write instead of the preset's (a model too large for the machine
    /// keeps its per-layer shape with fewer layers).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Type of the weight matrices: q8_0, q5_0, q4_0, f16, bf16 or f32.
    #[arg(long, default_value = "q8_0")]
    pub dtype: String,
    /// Seed of the random weights (the same seed writes the same file).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where to write the GGUF file.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
}

pub fn cmd_synth(a: SynthArgs) -> Result<()> {
    let (arch, presets) = match a.arch.as_str() {
        "qwen3" => (Architecture::Qwen3, PRESETS),
        "llama" => (Architecture::Llama, LLAMA_PRESETS),
        "qwen3moe" => (Architecture::Qwen3Moe, QWEN3MOE_PRESETS),
        _ => bail!(
            "unknown --arch {:?} (synthesized: qwen3, llama, qwen3moe)",
            a.arch
        ),
    };
    let dtype =
        GgmlType::from_name(&a.dtype).with_context(|| format!("unknown --dtype {:?}", a.dtype))?;
    let preset = a.preset.as_deref().unwrap_or(presets[0]);
    let Some(mut spec) = SynthSpec::preset_for(arch, preset, dtype) else {
        bail!(
            "unknown --preset {preset:?} for {} (available: {})",
            a.arch,
            presets.join(", ")
        );
    };
    spec.seed = a.seed;
    if let Some(n) = a.layers {
        if n == 0 || n > spec.n_layers {
            bail!(
                "--layers {n}: the {preset} preset has 1 to {} layers",
                spec.n_layers
            );
        }
        spec.n_layers = n;
    }
    let bar = super::common::progress_bar(spec.n_layers as u64 + 2, "synthesizing");
    let w = synth::build_with_progress(&spec, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.set_message("writing");
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    w.write_to(&a.out)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    bar.finish_and_clear();
    let bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({}, {} layers, hidden {}, {} parameters, {}, {} bytes)",
        a.out.display(),
        spec.name,
        spec.n_layers,
        spec.hidden,
        spec.n_params(),
        dtype,
        bytes
    );
    Ok(())
}
