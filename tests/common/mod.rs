//! Helpers shared by the integration tests: fixture paths and loading.
#![allow(dead_code)]

use inferno::backend::{create_backend, BackendOptions};
use inferno::gguf::GgufFile;
use inferno::model::Model;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

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
    Model::load(&gguf, Arc::clone(&be)).expect("model loads")
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
