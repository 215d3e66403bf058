//! Helpers shared by the integration tests: fixture paths and loading.
#![allow(dead_code)]

pub mod arch;

use inferno::backend::{create_backend, BackendOptions};
use inferno::gguf::GgufFile;
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Logits, Model};
use inferno::tensor::GgmlType;
use serde_json::Value;
use std::path::PathBuf;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn models_dir() -> PathBuf {
    fixtures().join("models")
}

pub fn manifest() -> Value {
    let text = std::fs::read_to_string(models_dir().join("manifest.json"))
        .expect("tests/fixtures/models/manifest.json (run gen_models.py)");
    serde_json::from_str(&text).expect("manifest is JSON")
}

/// Reads a raw little-endian f32 file.
pub fn read_f32(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(models_dir().join(name)).expect(name);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn load_model(file: &str, backend: &str) -> Model {
    load_model_with(file, backend, 0)
}

pub fn load_model_with(file: &str, backend: &str, threads: usize) -> Model {
    let gguf = GgufFile::open(models_dir().join(file)).expect(file);
    let be = create_backend(
        backend,
        &BackendOptions {
            threads,
            tracing: false,
        },
    )
    .expect("backend");
    Model::load(&gguf, be).expect("model loads")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Largest |a - b| over a row, and the row's largest |b| (the reference's logit scale).
pub fn row_error(ours: &[f32], reference: &[f32]) -> (f32, f32) {
    let mut max_abs = 0.0f32;
    let mut scale = 0.0f32;
    for (a, b) in ours.iter().zip(reference) {
        max_abs = max_abs.max((a - b).abs());
        scale = scale.max(b.abs());
    }
    (max_abs, scale)
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Small synthetic Qwen3 models: GQA with an odd vocabulary (a partial last row group) and a
/// head size that is not a multiple of 8 (the portable attention path).
pub fn synth_models() -> Vec<(String, GgufFile)> {
    let mut out = Vec::new();
    let shapes = [
        (GgmlType::Q8_0, 64, 4, 2, 16, 96),
        (GgmlType::Q8_0, 96, 4, 1, 24, 160),
        (GgmlType::F32, 64, 4, 2, 16, 96),
        (GgmlType::F16, 64, 2, 2, 20, 64),
    ];
    for (i, (dtype, hidden, heads, kv, hd, ffn)) in shapes.into_iter().enumerate() {
        let mut spec = SynthSpec::preset("demo", dtype).expect("preset");
        // Plain random weights with a tied head (not the demo's readable output).
        spec.tied = true;
        spec.readable = false;
        spec.n_layers = 2;
        spec.hidden = hidden;
        spec.n_heads = heads;
        spec.n_kv_heads = kv;
        spec.head_dim = hd;
        spec.ffn = ffn;
        spec.context_length = 256;
        spec.seed = 100 + i as u64;
        let bytes = synth::build(&spec).expect("synth").to_bytes();
        let name = format!("synth-{i}-{dtype}");
        out.push((name, GgufFile::from_bytes(bytes).expect("gguf")));
    }
    out
}

/// Logits of every position of a fixed 13-token prompt (prefilled in chunks of 5, so both
/// the batched and the single-token paths run), then `steps` greedy tokens and their logits.
pub fn greedy_run(model: &Model, steps: usize) -> (Vec<f32>, Vec<u32>) {
    let vocab = model.config.vocab;
    let prompt: Vec<u32> = (0..13u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let mut st = model.new_state(prompt.len() + steps + 1, 5);
    let mut all = vec![0.0; prompt.len() * vocab];
    model
        .forward(&mut st, &prompt, Logits::All(&mut all))
        .expect("prefill");
    let mut tokens = Vec::new();
    let mut logits = all[(prompt.len() - 1) * vocab..].to_vec();
    for _ in 0..steps {
        let next = argmax(&logits) as u32;
        tokens.push(next);
        model
            .forward(&mut st, &[next], Logits::Last(&mut logits))
            .expect("decode");
        all.extend_from_slice(&logits);
    }
    (all, tokens)
}

/// Largest |a - b| over a row, relative to the reference row's largest |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let (d, s) = row_error(a, b);
    d / s.max(f32::MIN_POSITIVE)
}
