//! Helpers of the architecture fixture tests (`tests/fixtures/<arch>/`, each made by its
//! `gen_*.py`): the fixture's files, CPU backends, and transformers-vs-ours scores.

use inferno::backend::{create_backend, BackendOptions, Device};
use inferno::gguf::GgufFile;
use inferno::model::{Logits, Model};
use serde_json::Value as Json;
use std::path::PathBuf;

/// One fixture directory under `tests/fixtures`, and the script that writes it.
pub struct Fixture {
    pub sub: &'static str,
    pub generator: &'static str,
}

impl Fixture {
    pub fn dir(&self) -> PathBuf {
        super::fixtures().join(self.sub)
    }

    pub fn manifest(&self) -> Json {
        let text = std::fs::read_to_string(self.dir().join("manifest.json")).unwrap_or_else(|e| {
            panic!(
                "tests/fixtures/{}/manifest.json (run {}): {e}",
                self.sub, self.generator
            )
        });
        serde_json::from_str(&text).expect("manifest is JSON")
    }

    /// A raw little-endian f32 file of the fixture.
    pub fn read_f32(&self, name: &str) -> Vec<f32> {
        std::fs::read(self.dir().join(name))
            .expect(name)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    pub fn open(&self, file: &str) -> GgufFile {
        GgufFile::open(self.dir().join(file)).expect(file)
    }
}

pub fn cpu(name: &str) -> Device {
    create_backend(name, &BackendOptions::default()).expect("backend")
}

/// The index of the largest logit (the last of equal ones, as `max_by` keeps it).
pub fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap_or(0)
}

/// Worst |Δ| relative to each position's logit scale (max |reference logit|), and how many
/// positions share the reference's argmax.
#[derive(Default, Debug)]
pub struct Score {
    pub max_rel: f32,
    pub agree: usize,
    pub total: usize,
}

impl Score {
    pub fn add(&mut self, ours: &[f32], reference: &[f32], vocab: usize) {
        assert_eq!(ours.len(), reference.len(), "reference shape");
        for (a, b) in ours.chunks(vocab).zip(reference.chunks(vocab)) {
            let scale = b.iter().fold(0.0f32, |s, v| s.max(v.abs()));
            let err = a
                .iter()
                .zip(b)
                .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()));
            self.max_rel = self.max_rel.max(err / scale);
            self.agree += (argmax(a) == argmax(b)) as usize;
            self.total += 1;
        }
    }
}

/// Logits at every position of `ids`, in one pass of `batch`-token chunks.
pub fn logits(model: &Model, ids: &[u32], batch: usize) -> Vec<f32> {
    let vocab = model.config.vocab;
    let mut out = vec![0.0f32; ids.len() * vocab];
    let mut st = model.new_state(ids.len(), batch);
    model
        .forward(&mut st, ids, Logits::All(&mut out))
        .expect("forward");
    out
}

/// `n` greedy tokens after `prompt`, one decode step each.
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let vocab = model.config.vocab;
    let mut st = model.new_state(prompt.len() + n + 1, 16);
    let mut row = vec![0.0; vocab];
    model
        .forward(&mut st, prompt, Logits::Last(&mut row))
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..n {
        let id = argmax(&row) as u32;
        got.push(id);
        model
            .forward(&mut st, &[id], Logits::Last(&mut row))
            .unwrap();
    }
    got
}
