//! The Qwen2 architecture (Q/K/V projection biases, no Q/K norm) against transformers'
//! float32 logits on a tiny random-weight model written as llama.cpp's converter writes
//! Qwen2 checkpoints (`tests/fixtures/qwen2`, made by `gen_qwen2.py`).

use inferno::backend::{create_backend, BackendOptions};
use inferno::gguf::{GgufFile, GgufWriter};
use inferno::model::{Architecture, Logits, Model};
use inferno::tensor::GgmlType;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2")
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(dir().join("manifest.json"))
        .expect("tests/fixtures/qwen2/manifest.json (run gen_qwen2.py)");
    serde_json::from_str(&text).expect("manifest is JSON")
}

fn read_f32(name: &str) -> Vec<f32> {
    std::fs::read(dir().join(name))
        .expect(name)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn load(file: &str) -> Model {
    let gguf = GgufFile::open(dir().join(file)).expect(file);
    let be = create_backend("scalar", &BackendOptions::default()).expect("backend");
    Model::load(&gguf, be).expect("model loads")
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap_or(0)
}

#[test]
fn qwen2_loads_with_biases_and_without_qk_norm() {
    let m = manifest();
    let model = load(m["model"]["gguf"].as_str().unwrap());
    let c = &model.config;
    assert_eq!(c.arch, Architecture::Qwen2);
    assert_eq!(c.vocab, m["model"]["vocab"].as_u64().unwrap() as usize);
    // No attention.key_length in the file: the head size comes from hidden / heads.
    assert_eq!(c.head_dim, 16);
    assert_eq!((c.n_heads, c.n_kv_heads, c.n_layers), (4, 2, 2));
    assert!(!model.weights.tied_embeddings);
    for l in &model.weights.layers {
        assert!(l.q_norm.is_none() && l.k_norm.is_none());
        let bq = l.bq.as_ref().expect("q bias");
        assert_eq!(bq.len(), c.q_dim());
        assert_eq!(l.bk.as_ref().expect("k bias").len(), c.kv_dim());
        assert_eq!(l.bv.as_ref().expect("v bias").len(), c.kv_dim());
        assert!(bq.iter().any(|&b| b.abs() > 0.1), "biases are non-trivial");
    }
}

/// F32 end to end: only summation order differs from transformers, so every position's
/// logits must agree within 1e-4 of that position's logit scale (max |logit|), and the
/// argmax everywhere. Processed both as one batch and token by token through the cache.
#[test]
fn qwen2_logits_match_transformers() {
    let m = manifest();
    let model = load(m["model"]["gguf"].as_str().unwrap());
    let vocab = model.config.vocab;
    let mut report = String::new();
    for (k, seq) in m["sequences"].as_array().unwrap().iter().enumerate() {
        let ids: Vec<u32> = seq["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let hf = read_f32(seq["hf_logits"].as_str().unwrap());
        assert_eq!(hf.len(), ids.len() * vocab, "reference shape");

        let mut batch = vec![0.0f32; ids.len() * vocab];
        let mut st = model.new_state(ids.len(), 16);
        model
            .forward(&mut st, &ids, Logits::All(&mut batch))
            .expect("forward");
        let mut stepwise = vec![0.0f32; ids.len() * vocab];
        let mut st = model.new_state(ids.len(), 1);
        for (t, &id) in ids.iter().enumerate() {
            model
                .forward(
                    &mut st,
                    &[id],
                    Logits::Last(&mut stepwise[t * vocab..(t + 1) * vocab]),
                )
                .expect("forward");
        }

        for (label, ours) in [("batched", &batch), ("stepwise", &stepwise)] {
            let mut worst = 0.0f32;
            for (t, (a, b)) in ours.chunks(vocab).zip(hf.chunks(vocab)).enumerate() {
                let scale = b.iter().fold(0.0f32, |s, v| s.max(v.abs()));
                let err = a
                    .iter()
                    .zip(b)
                    .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()));
                worst = worst.max(err / scale);
                assert!(
                    err <= 1e-4 * scale,
                    "seq {k} {label} position {t}: max |Δ| {err:e} vs scale {scale}"
                );
                assert_eq!(argmax(a), argmax(b), "seq {k} {label} position {t}");
            }
            report += &format!(
                "seq {k} ({} tokens) {label}: max |Δ| / scale {worst:.2e} (llama.cpp: {:.2e})\n",
                ids.len(),
                seq["llama_vs_hf_max_rel"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    println!("{report}");
}

/// The biases matter: without them the logits move far outside the tolerance above, so
/// the comparison cannot pass by ignoring them.
#[test]
fn dropping_the_biases_changes_the_logits() {
    let m = manifest();
    let mut model = load(m["model"]["gguf"].as_str().unwrap());
    for l in &mut model.weights.layers {
        l.bq = None;
        l.bk = None;
        l.bv = None;
    }
    let seq = &m["sequences"][0];
    let ids: Vec<u32> = seq["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let vocab = model.config.vocab;
    let hf = read_f32(seq["hf_logits"].as_str().unwrap());
    let mut out = vec![0.0f32; ids.len() * vocab];
    let mut st = model.new_state(ids.len(), 16);
    model
        .forward(&mut st, &ids, Logits::All(&mut out))
        .expect("forward");
    let worst = out
        .chunks(vocab)
        .zip(hf.chunks(vocab))
        .map(|(a, b)| {
            let scale = b.iter().fold(0.0f32, |s, v| s.max(v.abs()));
            a.iter()
                .zip(b)
                .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()))
                / scale
        })
        .fold(0.0f32, f32::max);
    assert!(
        worst > 1e-2,
        "bias-free logits are within {worst} of the reference"
    );
}

/// The fixture rewritten with tensor `name` stored as `dtype` (zero bytes of that type).
fn retyped(name: &str, dtype: GgmlType) -> GgufFile {
    let m = manifest();
    let src = GgufFile::open(dir().join(m["model"]["gguf"].as_str().unwrap())).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add(k.clone(), v.clone());
    }
    for t in src.tensors() {
        if t.name == name {
            let bytes = dtype.row_size(t.n_elements()).unwrap() as usize;
            w.add_tensor(&t.name, &t.dims, dtype, vec![0u8; bytes])
                .unwrap();
        } else {
            let data = src.tensor_data(&t.name).unwrap().as_slice().to_vec();
            w.add_tensor(&t.name, &t.dims, t.dtype, data).unwrap();
        }
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// A tensor of a type no kernel here reads is refused at load, naming tensor and type,
/// whether it is a matrix or a 1-D vector (norm gain, bias); a supported quantized type in
/// the same place loads.
#[test]
fn unsupported_tensor_types_are_refused_at_load_by_name() {
    let be = || create_backend("scalar", &BackendOptions::default()).unwrap();
    for name in [
        "blk.1.ffn_up.weight",
        "blk.0.attn_norm.weight",
        "blk.1.attn_k.bias",
    ] {
        let err = match Model::load(&retyped(name, GgmlType::IQ4_NL), be()) {
            Ok(_) => panic!("{name} as IQ4_NL loaded"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(name) && err.contains("IQ4_NL"),
            "message does not name the tensor and type: {err}"
        );
        Model::load(&retyped(name, GgmlType::Q4_0), be())
            .unwrap_or_else(|e| panic!("{name} as Q4_0: {e}"));
    }
}
