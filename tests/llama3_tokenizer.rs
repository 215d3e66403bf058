//! The Llama 3 tokenizer (`gpt2` vocabulary, pre-tokenizer `llama-bpe`) built from GGUF
//! metadata against Hugging Face `tokenizers` on Llama 3's own tokenizer.json, on 604
//! strings (`tests/fixtures/llama3_tokenizer`, made by `gen_llama3_tokenizer.py`; llama.cpp
//! agrees with every case too).

use inferno::gguf::GgufFile;
use inferno::tokenizer::Tokenizer;
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llama3_tokenizer")
        .join(name)
}

fn load() -> (Tokenizer, Vec<Value>) {
    let g = GgufFile::open(fixture("llama3-vocab.gguf")).expect("llama3-vocab.gguf");
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
fn llama3_ids_and_decoding_match_hugging_face() {
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
fn llama3_special_tokens() {
    let (tok, _) = load();
    assert_eq!(tok.vocab_size(), 128_256);
    assert!(tok.add_bos());
    let eot = tok.token_id("<|eot_id|>").expect("<|eot_id|>");
    assert_eq!(eot, 128_009);
    assert!(tok.is_eog(eot), "<|eot_id|> ends a turn");
    // Without parse_special the control tokens' text is ordinary text.
    let plain = tok.encode("<|eot_id|>", false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&eot), "{plain:?}");
}
