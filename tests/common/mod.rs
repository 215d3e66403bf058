//! Helpers shared by the integration tests: fixture paths and loading.
#![allow(dead_code)]

pub mod arch;
pub mod spec;

use inferno::backend::{create_backend, BackendOptions};
use inferno::gguf::{GgufFile, GgufWriter, Value as GgufValue};
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Logits, Model, SeqStep};
use inferno::tensor::GgmlType;
use inferno::tensor::{self, mixture};
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

// ---------------------------------------------------------------------------------------
// Verification rows (speculative decoding)
// ---------------------------------------------------------------------------------------

/// `g`'s matrices rewritten as `scheme` says (`inferno quantize`'s plan and conversion).
pub fn requantize(g: &GgufFile, scheme: &str) -> GgufFile {
    let scheme = mixture::Scheme::from_name(scheme).expect("scheme");
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "general.alignment" {
            w.add(k.clone(), v.clone());
        }
    }
    let list: Vec<(&str, &[u64])> = g
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice()))
        .collect();
    let arch = g.architecture().expect("architecture").to_string();
    let layers = g
        .get_u64(&format!("{arch}.block_count"))
        .expect("block count") as usize;
    for (t, target) in g.tensors().iter().zip(mixture::plan(scheme, &list, layers)) {
        let data = g.tensor_data(&t.name).expect("data");
        let (dt, bytes) = match target.filter(|&dt| dt != t.dtype) {
            Some(dt) => {
                use rayon::prelude::*;
                let cols = t.dims[0] as usize;
                let row = t.dtype.row_size(cols as u64).unwrap() as usize;
                // Rows on their own, in parallel (a real checkpoint has millions).
                let rows: Vec<Vec<u8>> = data
                    .as_slice()
                    .par_chunks(row)
                    .map(|r| {
                        let mut vals = vec![0f32; cols];
                        tensor::dequantize_row(t.dtype, r, &mut vals).unwrap();
                        tensor::encode(&vals, dt).unwrap()
                    })
                    .collect();
                (dt, rows.concat())
            }
            None => (t.dtype, data.as_slice().to_vec()),
        };
        w.add_tensor(t.name.clone(), &t.dims, dt, bytes).unwrap();
    }
    w.add(
        "general.file_type",
        GgufValue::U32(scheme.file_type().unwrap_or(0)),
    );
    GgufFile::from_bytes(w.to_bytes()).expect("requantized gguf")
}

fn row_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `n` token ids spread over the vocabulary.
pub fn tokens(vocab: usize, n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 97 + seed * 31 + 11) % vocab as u32)
        .collect()
}

/// Logits of each one-row decode step of `drafts` after `prompt`.
pub fn one_by_one(model: &Model, prompt: &[u32], drafts: &[u32]) -> Vec<Vec<f32>> {
    let vocab = model.config.vocab;
    let mut st = model.new_state(prompt.len() + drafts.len() + 1, 64);
    model.forward(&mut st, prompt, Logits::None).unwrap();
    drafts
        .iter()
        .map(|&t| {
            let mut l = vec![0.0; vocab];
            model.forward(&mut st, &[t], Logits::Last(&mut l)).unwrap();
            l
        })
        .collect()
}

/// Checks that the rows of one multi-row step (alone in its step, then batched with a
/// decoding sequence and a prefilling one) give `want`'s logits bit for bit.
pub fn check_rows(name: &str, model: &Model, prompt: &[u32], drafts: &[u32], want: &[Vec<f32>]) {
    let vocab = model.config.vocab;
    let k = drafts.len();
    // Alone: the single-sequence path (its logits straight into the caller's buffer).
    let mut st = model.new_state(prompt.len() + k + 1, 64);
    model.forward(&mut st, prompt, Logits::None).unwrap();
    let mut all = vec![0.0; k * vocab];
    model
        .forward(&mut st, drafts, Logits::All(&mut all))
        .unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            row_bits(&all[i * vocab..(i + 1) * vocab]) == row_bits(w),
            "{name}: row {i} of {k} alone differs from its one-row step"
        );
    }
    // Batched, as the engine runs it: another sequence decoding one token before it and a
    // prompt chunk after it, the logits of several sequences gathered into products.
    let other = tokens(vocab, 5, 3);
    let chunk = tokens(vocab, 6, 4);
    let mut kv = model.new_kv_cache(prompt.len() + k + 1);
    let mut kv_other = model.new_kv_cache(16);
    let mut kv_chunk = model.new_kv_cache(16);
    // Room for 3 rows of logits at a time: the gathered blocks split the sequences' rows.
    let mut scratch = model.new_scratch(prompt.len() + other.len() + 64, 3);
    {
        let mut prefill = [
            SeqStep {
                kv: &mut kv,
                tokens: prompt,
                logits: Logits::None,
            },
            SeqStep {
                kv: &mut kv_other,
                tokens: &other,
                logits: Logits::None,
            },
        ];
        model.forward_batch(&mut prefill, &mut scratch).unwrap();
    }
    let (mut l_other, mut l_chunk) = (vec![0.0; vocab], vec![0.0; vocab]);
    let mut all = vec![0.0; k * vocab];
    let mut step = [
        SeqStep {
            kv: &mut kv_other,
            tokens: &other[..1],
            logits: Logits::Last(&mut l_other),
        },
        SeqStep {
            kv: &mut kv,
            tokens: drafts,
            logits: Logits::All(&mut all),
        },
        SeqStep {
            kv: &mut kv_chunk,
            tokens: &chunk,
            logits: Logits::Last(&mut l_chunk),
        },
    ];
    model.forward_batch(&mut step, &mut scratch).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            row_bits(&all[i * vocab..(i + 1) * vocab]) == row_bits(w),
            "{name}: row {i} of {k} batched differs from its one-row step"
        );
    }
}
