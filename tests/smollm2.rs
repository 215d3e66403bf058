//! A real published Llama-architecture checkpoint: SmolLM2-135M-Instruct, Q4_1 (tokenizer
//! `gpt2` with pre-tokenizer `smollm`, ChatML template). From `tests/fixtures/smollm2`, made
//! by `gen_smollm2.py` from the checkpoint:
//! - its tokenizer (a vocabulary-only copy of the file's `tokenizer.*` keys) gives the ids of
//!   Hugging Face `tokenizers` and of llama.cpp on 599 strings, and decodes them back;
//! - its chat template renders the prompt as llama.cpp renders it, to the same ids;
//! - the checkpoint itself loads and answers "What is the capital of France? Answer in one
//!   sentence." with "The capital of France is Paris." under greedy decoding, on every CPU
//!   backend, and on the GPU backend.
//!
//! The checkpoint (98 MB) is found through `INFERNO_TEST_SMOLLM2` or in the cache that
//! `scripts/fetch-smollm2.sh` fills (scripts/test runs it). When it is absent the model test
//! passes with a notice, except under `CI=true`, where it fails: CI must run it.

use inferno::backend::gpu::GpuBackend;
use inferno::backend::{create_backend, BackendOptions, Device, KvType};
use inferno::gguf::GgufFile;
use inferno::model::{Architecture, Logits, Model};
use inferno::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

const FILE: &str = "smollm2-135m-instruct-q4_1.gguf";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/smollm2")
        .join(name)
}

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).expect(name);
    serde_json::from_str(&text).expect("JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn vocab() -> GgufFile {
    GgufFile::open(fixture("smollm2-vocab.gguf")).expect("smollm2-vocab.gguf")
}

fn model_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("INFERNO_TEST_SMOLLM2") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let p = cache.join("inferno-models").join(FILE);
    p.exists().then_some(p)
}

fn in_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

#[test]
fn smollm2_tokenizer_matches_hugging_face_and_llama_cpp() {
    let tok = Tokenizer::from_gguf(&vocab()).expect("tokenizer builds");
    let file = json("cases.json");
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() >= 500, "{} cases", cases.len());
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["ids"]);
        match tok.encode(text, true) {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!("{text:?}\n  expected {want:?}\n  got      {got:?}")),
            Err(e) => failures.push(format!("{text:?}: {e}")),
        }
        let back = tok.decode(&want, false).expect("decode");
        if back != text {
            failures.push(format!("{text:?} decodes to {back:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_chat_prompt_is_llama_cpp_s() {
    let g = vocab();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let chat = json("chat.json");
    let template = ChatTemplate::for_model(&g);
    let messages: Vec<ChatMessage> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let rendered = template.render(&messages, true, None).expect("render");
    assert_eq!(rendered, chat["rendered"].as_str().unwrap());
    assert_eq!(
        tok.encode(&rendered, true).unwrap(),
        ids(&chat["prompt_ids"])
    );
    assert!(!tok.add_bos(), "SmolLM2 adds no BOS");
}

/// Greedy tokens after `prompt` until an end-of-generation token or `max` tokens.
fn greedy(model: &Model, tok: &Tokenizer, prompt: &[u32], max: usize) -> Vec<u32> {
    let vocab = model.config.vocab;
    let mut st = model.new_state(prompt.len() + max + 1, 64);
    let mut row = vec![0.0; vocab];
    model
        .forward(&mut st, prompt, Logits::Last(&mut row))
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..max {
        let id = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap() as u32;
        if tok.is_eog(id) {
            break;
        }
        out.push(id);
        model
            .forward(&mut st, &[id], Logits::Last(&mut row))
            .unwrap();
    }
    out
}

/// The checkpoint, or `None` (with a notice) where it is absent outside CI.
fn checkpoint() -> Option<GgufFile> {
    let Some(path) = model_path() else {
        assert!(
            !in_ci(),
            "{FILE} is missing under CI (scripts/test fetches it with scripts/fetch-smollm2.sh)"
        );
        eprintln!(
            "SKIPPED: {FILE} not found (set INFERNO_TEST_SMOLLM2 or run scripts/fetch-smollm2.sh)"
        );
        return None;
    };
    Some(GgufFile::open(&path).expect("open the checkpoint"))
}

#[test]
fn smollm2_answers_the_capital_of_france() {
    let Some(g) = checkpoint() else { return };
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let chat = json("chat.json");
    let prompt = ids(&chat["prompt_ids"]);
    let llama = ids(&chat["llama_greedy"]);
    for backend in ["scalar", "simd", "pool"] {
        let be = create_backend(backend, &BackendOptions::default()).unwrap();
        let mut model = Model::load(&g, be).expect("SmolLM2 loads");
        let c = &model.config;
        assert_eq!(c.arch, Architecture::Llama);
        assert_eq!(
            (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads),
            (30, 576, 9, 3)
        );
        assert!(model.weights.tied_embeddings);
        for f32_cache in [true, false] {
            if f32_cache {
                model.set_kv_types((KvType::F32, KvType::F32)).unwrap();
            } else {
                model.set_kv_types((KvType::F16, KvType::F16)).unwrap();
            }
            let got = greedy(&model, &tok, &prompt, 16);
            let text = tok.decode(&got, false).unwrap();
            let same = got.iter().zip(&llama).take_while(|(a, b)| a == b).count();
            println!(
                "{backend} (f32 cache: {f32_cache}): {text:?}; {same} of {} tokens equal llama.cpp's",
                got.len()
            );
            assert!(
                text.starts_with("The capital of France is Paris."),
                "{backend}: {text:?}"
            );
        }
    }
}

#[test]
fn smollm2_answers_the_capital_of_france_on_the_gpu() {
    if std::env::var("INFERNO_TEST_GPU").is_ok_and(|v| v == "0") {
        eprintln!("SKIPPED: INFERNO_TEST_GPU=0 declares that this machine has no GPU adapter");
        return;
    }
    let Some(g) = checkpoint() else { return };
    let gpu = match GpuBackend::new() {
        Ok(b) => Device::gpu(std::sync::Arc::new(b)),
        Err(e) => panic!(
            "{e}\n(the gpu tests need an adapter: scripts/test installs Mesa's lavapipe; \
             set INFERNO_TEST_GPU=0 only on a machine without one)"
        ),
    };
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let prompt = ids(&json("chat.json")["prompt_ids"]);
    let model = Model::load(&g, gpu).expect("SmolLM2 loads on the gpu");
    let text = tok
        .decode(&greedy(&model, &tok, &prompt, 10), false)
        .unwrap();
    println!("gpu: {text:?}");
    assert!(
        text.starts_with("The capital of France is Paris."),
        "gpu: {text:?}"
    );
}
