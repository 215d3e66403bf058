//! SentencePiece vocabularies (`tokenizer.ggml.model` = `llama`: Llama 2, Mistral v0.1)
//! rebuilt from GGUF metadata (pieces, scores, types) against Hugging Face `tokenizers` and
//! llama.cpp, which agree on all 606 strings, on a SentencePiece BPE model trained with
//! Llama 2's settings (`tests/fixtures/spm_tokenizer`, made by `gen_spm_tokenizer.py`).

use inferno::gguf::GgufFile;
use inferno::tokenizer::Tokenizer;
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/spm_tokenizer")
        .join(name)
}

fn load() -> (Tokenizer, Vec<Value>) {
    let g = GgufFile::open(fixture("spm-vocab.gguf")).expect("spm-vocab.gguf");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer builds");
    let text = std::fs::read_to_string(fixture("cases.json")).expect("cases.json");
    let file: Value = serde_json::from_str(&text).expect("JSON");
    (tok, file["cases"].as_array().unwrap().clone())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn spm_ids_match_hugging_face_and_llama_cpp() {
    let (tok, cases) = load();
    assert!(cases.len() >= 500, "{} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["ids"]);
        match tok.encode(text, true) {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!("{text:?}\n  expected {want:?}\n  got      {got:?}")),
            Err(e) => failures.push(format!("{text:?}: {e}")),
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

/// Decoding gives Hugging Face's text (spaces back from `▁`, byte pieces fused into
/// characters, the prefix space dropped), in one call and token by token.
#[test]
fn spm_decoding_matches_hugging_face_whole_and_streamed() {
    let (tok, cases) = load();
    let mut failures = Vec::new();
    for c in &cases {
        let want = c["decoded"].as_str().unwrap();
        let ids = ids(&c["ids"]);
        let whole = tok.decode(&ids, false).unwrap();
        let mut stream = tok.stream_decoder();
        let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
        streamed += &stream.finish();
        if whole != want || streamed != want {
            failures.push(format!("{want:?}: decode {whole:?}, streamed {streamed:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn spm_special_tokens_and_bos() {
    let (tok, _) = load();
    assert!(tok.add_bos());
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.token_id("</s>"), Some(2));
    assert!(tok.is_eog(2));
    // Control-token text stays text without parse_special.
    let plain = tok.encode("</s>", false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&2), "{plain:?}");
}
