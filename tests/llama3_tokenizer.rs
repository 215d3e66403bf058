//! The Llama 3 tokenizer (`gpt2` vocabulary, pre-tokenizer `llama-bpe`) built from GGUF
//! metadata against Hugging Face `tokenizers` on Llama 3's own tokenizer.json, on 604
//! strings (`tests/fixtures/llama3_tokenizer`, made by `gen_llama3_tokenizer.py`; llama.cpp
//! agrees with every case too).

use inferno::engine::request::{prompt_tokens, Prompt};
use inferno::gguf::GgufFile;
use inferno::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
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

/// The file's chat template renders as transformers' `apply_chat_template` does, to HF's ids,
/// and a chat prompt starts with one BOS although the tokenizer adds BOS and the template
/// writes it too.
#[test]
fn llama3_chat_template_renders_like_transformers_with_one_bos() {
    let g = GgufFile::open(fixture("llama3-vocab.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let template = ChatTemplate::for_model(&g);
    let text = std::fs::read_to_string(fixture("chat.json")).expect("chat.json");
    let chat: Value = serde_json::from_str(&text).unwrap();
    let bos = tok.bos_id().unwrap();
    for c in chat["conversations"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let messages: Vec<ChatMessage> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let gen = c["add_generation_prompt"].as_bool().unwrap();
        let rendered = template.render(&messages, gen, None).expect("render");
        assert_eq!(rendered, c["rendered"].as_str().unwrap(), "{name}");
        let want = ids(&c["ids"]);
        assert_eq!(tok.encode(&rendered, true).unwrap(), want, "{name}");
        if gen {
            let prompt = Prompt::Chat {
                messages,
                template: Default::default(),
            };
            let got = prompt_tokens(&tok, &template, &prompt).unwrap();
            assert_eq!(got, want, "{name}: the request's tokens");
            assert_eq!(
                got.iter().filter(|&&t| t == bos).count(),
                1,
                "{name}: one BOS"
            );
        }
    }
    // Plain text still gets the tokenizer's BOS.
    let plain = Prompt::Text {
        text: "Hello".into(),
        parse_special: false,
    };
    assert_eq!(prompt_tokens(&tok, &template, &plain).unwrap()[0], bos);
}
