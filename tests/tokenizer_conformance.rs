//! Conformance of the GGUF-built tokenizer and chat template against the
//! reference Qwen3 tokenizer (Hugging Face `tokenizers`) and transformers'
//! chat-template rendering, using the committed fixtures in
//! `tests/fixtures/tokenizer/`.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use inferno::gguf::GgufFile;
use inferno::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(name)
}

struct Loaded {
    gguf: GgufFile,
    tokenizer: Tokenizer,
}

/// Loads the 151,936-token Qwen3 vocabulary once per test binary.
fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let t0 = Instant::now();
        let gguf = GgufFile::open(fixture("qwen3-vocab.gguf")).expect("open qwen3-vocab.gguf");
        let t1 = Instant::now();
        let tokenizer = Tokenizer::from_gguf(&gguf).expect("build tokenizer");
        let t2 = Instant::now();
        eprintln!(
            "qwen3 vocab: GGUF open {:.1} ms, tokenizer build {:.1} ms ({} tokens)",
            (t1 - t0).as_secs_f64() * 1e3,
            (t2 - t1).as_secs_f64() * 1e3,
            tokenizer.vocab_size()
        );
        Loaded { gguf, tokenizer }
    })
}

#[derive(Deserialize)]
struct CasesFile {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    id: usize,
    category: String,
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

fn cases() -> Vec<Case> {
    let raw = std::fs::read_to_string(fixture("cases.json")).expect("read cases.json");
    let file: CasesFile = serde_json::from_str(&raw).expect("parse cases.json");
    assert!(file.cases.len() >= 250, "only {} cases", file.cases.len());
    file.cases
}

#[derive(Deserialize)]
struct ChatFile {
    conversations: Vec<Conversation>,
}

/// A JSON value re-serialized to text with object keys in document order;
/// `serde_json::Value` would sort them, and key order is visible in what
/// the template's `tojson` prints.
struct RawJson(String);

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawJson;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, v: bool) -> Result<RawJson, E> {
                Ok(RawJson(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<RawJson, E> {
                Ok(RawJson(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<RawJson, E> {
                Ok(RawJson(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<RawJson, E> {
                Ok(RawJson(serde_json::to_string(&v).unwrap()))
            }
            fn visit_str<E>(self, v: &str) -> Result<RawJson, E> {
                Ok(RawJson(serde_json::to_string(v).unwrap()))
            }
            fn visit_unit<E>(self) -> Result<RawJson, E> {
                Ok(RawJson("null".into()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<RawJson, A::Error> {
                let mut items = Vec::new();
                while let Some(RawJson(item)) = a.next_element()? {
                    items.push(item);
                }
                Ok(RawJson(format!("[{}]", items.join(","))))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<RawJson, A::Error> {
                let mut items = Vec::new();
                while let Some(key) = a.next_key::<String>()? {
                    let RawJson(value) = a.next_value()?;
                    items.push(format!("{}:{value}", serde_json::to_string(&key).unwrap()));
                }
                Ok(RawJson(format!("{{{}}}", items.join(","))))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct Conversation {
    name: String,
    messages: RawJson,
    tools: Option<RawJson>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
    rendered: String,
    ids: Vec<u32>,
}

fn conversations() -> Vec<Conversation> {
    let raw = std::fs::read_to_string(fixture("chat.json")).expect("read chat.json");
    let file: ChatFile = serde_json::from_str(&raw).expect("parse chat.json");
    assert!(!file.conversations.is_empty());
    file.conversations
}

/// Collects failures so one run reports every mismatch, not just the first.
fn report(what: &str, failures: &[String], total: usize) {
    assert!(
        failures.is_empty(),
        "{} of {total} {what}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn ids_match_hugging_face() {
    let tok = &loaded().tokenizer;
    let cases = cases();
    let mut failures = Vec::new();
    for c in &cases {
        match tok.encode(&c.text, true) {
            Ok(ids) if ids == c.ids => {}
            Ok(ids) => {
                let at = ids.iter().zip(&c.ids).take_while(|(a, b)| a == b).count();
                failures.push(format!(
                    "case {} [{}] {:?}: first difference at {at}\n  expected {:?}\n  got      {:?}",
                    c.id, c.category, c.text, c.ids, ids
                ));
            }
            Err(e) => failures.push(format!("case {} [{}] {:?}: {e}", c.id, c.category, c.text)),
        }
    }
    eprintln!(
        "ids: {} of {} cases match",
        cases.len() - failures.len(),
        cases.len()
    );
    report(
        "cases have ids differing from Hugging Face",
        &failures,
        cases.len(),
    );
}

#[test]
fn decode_matches_hugging_face_and_round_trips_to_nfc() {
    let tok = &loaded().tokenizer;
    let cases = cases();
    let mut failures = Vec::new();
    for c in &cases {
        let nfc: String = c.text.nfc().collect();
        let decoded_ref = tok.decode(&c.ids, false).expect("decode reference ids");
        if decoded_ref != c.decoded {
            failures.push(format!(
                "case {} [{}]: decode(hf ids) = {decoded_ref:?}, hf decoded {:?}",
                c.id, c.category, c.decoded
            ));
        }
        let ours = tok.encode(&c.text, true).expect("encode");
        let round = tok.decode(&ours, false).expect("decode");
        if round != nfc {
            failures.push(format!(
                "case {} [{}]: decode(encode(s)) = {round:?}, NFC(s) = {nfc:?}",
                c.id, c.category
            ));
        }
        if round != c.decoded {
            failures.push(format!(
                "case {} [{}]: decode(encode(s)) = {round:?}, hf decoded {:?}",
                c.id, c.category, c.decoded
            ));
        }
    }
    report("decode checks failed", &failures, cases.len());
}

#[test]
fn stream_decoding_matches_full_decode() {
    let tok = &loaded().tokenizer;
    let cases = cases();
    let mut failures = Vec::new();
    for c in &cases {
        let mut stream = tok.stream_decoder();
        let mut out = String::new();
        for &id in &c.ids {
            out.push_str(&stream.push(id));
        }
        out.push_str(&stream.finish());
        if out != c.decoded {
            failures.push(format!(
                "case {} [{}]: streamed {out:?}, expected {:?}",
                c.id, c.category, c.decoded
            ));
        }
    }
    report("streamed decodes differ", &failures, cases.len());
}

#[test]
fn special_token_text_is_plain_without_parse_special() {
    let tok = &loaded().tokenizer;
    let text = "<|im_start|>user\nHi<|im_end|>";
    let parsed = tok.encode(text, true).unwrap();
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(parsed.first(), Some(&im_start));
    assert_eq!(parsed.last(), Some(&im_end));
    let plain = tok.encode(text, false).unwrap();
    assert!(plain.iter().all(|&id| !tok.is_control(id)), "{plain:?}");
    assert_eq!(tok.decode(&plain, false).unwrap(), text);
    // User-defined tokens stay atomic either way.
    let think = tok.token_id("<think>").unwrap();
    assert_eq!(tok.encode("<think>", false).unwrap(), vec![think]);
}

#[test]
fn special_tokens_of_the_real_vocab() {
    let tok = &loaded().tokenizer;
    assert_eq!(tok.vocab_size(), 151_936);
    let id = |t: &str| tok.token_id(t).unwrap_or_else(|| panic!("{t} missing"));
    let im_end = id("<|im_end|>");
    let endoftext = id("<|endoftext|>");
    let think = id("<think>");
    assert_eq!(im_end, 151_645);
    assert_eq!(endoftext, 151_643);
    assert_eq!(tok.eos_id(), Some(im_end));
    assert_eq!(tok.bos_id(), Some(endoftext));
    assert!(!tok.add_bos());
    assert!(tok.is_eog(im_end));
    assert!(tok.is_eog(endoftext));
    assert!(!tok.is_eog(think));
    assert!(!tok.is_eog(id("<|im_start|>")));
    assert!(!tok.is_eog(id("Hello")));
    assert_eq!(tok.eog_ids(), &[endoftext, im_end]);
    assert!(tok.is_control(im_end));
    assert!(!tok.is_control(think));
    assert_eq!(tok.token_text(im_end), Some("<|im_end|>"));
    assert!(tok.decode(&[151_936], false).is_err());
}

#[test]
fn chat_template_renders_like_transformers() {
    let loaded = loaded();
    let tok = &loaded.tokenizer;
    let template = ChatTemplate::from_gguf(&loaded.gguf)
        .expect("load chat template")
        .expect("fixture has a chat template");
    let convs = conversations();
    let mut failures = Vec::new();
    for c in &convs {
        let rendered = match template.render_json(
            &c.messages.0,
            c.tools.as_ref().map(|t| t.0.as_str()),
            c.add_generation_prompt,
            c.enable_thinking,
        ) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: {e}", c.name));
                continue;
            }
        };
        if rendered != c.rendered {
            failures.push(format!(
                "{}: rendered\n{rendered:?}\nexpected\n{:?}",
                c.name, c.rendered
            ));
        }
        // Plain role/content conversations must render the same through the
        // typed API.
        let messages: serde_json::Value = serde_json::from_str(&c.messages.0).unwrap();
        let plain: Option<Vec<ChatMessage>> = c.tools.is_none().then_some(()).and_then(|_| {
            messages
                .as_array()?
                .iter()
                .map(|m| {
                    let obj = m.as_object()?;
                    (obj.len() == 2).then_some(())?;
                    Some(ChatMessage::new(
                        obj.get("role")?.as_str()?,
                        obj.get("content")?.as_str()?,
                    ))
                })
                .collect()
        });
        if let Some(messages) = plain {
            let typed = template
                .render(&messages, c.add_generation_prompt, c.enable_thinking)
                .unwrap();
            if typed != c.rendered {
                failures.push(format!("{}: typed render differs: {typed:?}", c.name));
            }
        }
        let ids = tok.encode(&c.rendered, true).unwrap();
        if ids != c.ids {
            failures.push(format!(
                "{}: ids of the rendering differ\n  expected {:?}\n  got      {ids:?}",
                c.name, c.ids
            ));
        }
    }
    eprintln!(
        "chat: {} conversations, {} failures",
        convs.len(),
        failures.len()
    );
    report("chat conversations failed", &failures, convs.len());
}

/// Found by the `tokenizer` fuzz target: the tokenizer's NFC tables predate U+07FD, so after
/// U+0327 it keeps its place where today's NFC moves it first. The text still decodes back
/// to itself up to normalization, and every id is in the vocabulary.
#[test]
fn fuzz_found_new_combining_marks_round_trip_up_to_normalization() {
    let tok = &loaded().tokenizer;
    let input: &[u8] = &[
        38, 0, 101, 204, 167, 32, 255, 255, 0, 0, 255, 255, 215, 2, 70, 245, 101, 204, 163, 204,
        151, 137, 211, 223, 189, 204, 188, 204, 167, 32, 255, 0, 215, 151, 111, 255, 0, 215, 151,
        111, 255, 239, 215, 151, 100, 122, 255, 0, 204, 101, 49, 204, 188, 204, 167, 32, 228,
    ];
    let text = String::from_utf8_lossy(input);
    for parse_special in [false, true] {
        let ids = tok.encode(&text, parse_special).unwrap();
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        let decoded = tok.decode(&ids, false).unwrap();
        assert_eq!(
            decoded.nfc().collect::<String>(),
            text.nfc().collect::<String>()
        );
    }
}
