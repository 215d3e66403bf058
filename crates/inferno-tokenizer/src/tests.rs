//! Unit tests for loading, encoding and decoding on synthetic vocabularies.

use super::test_vocab::{byte_token, gguf_from_kv, VocabBuilder, CONTROL, NORMAL, USER_DEFINED};
use super::*;

/// Ids of the interesting tokens in [`sample`].
struct Ids {
    hell: u32,
    world: u32,
    twelve: u32,
    im_start: u32,
    im_end: u32,
    endoftext: u32,
    think: u32,
    normal_end: u32,
}

/// A Qwen2-style vocabulary with a few merges and added tokens.
fn sample() -> (VocabBuilder, Ids) {
    let mut v = VocabBuilder::new();
    v.merge("Ġ", "w");
    v.merge("o", "r");
    v.merge("Ġw", "or");
    v.merge("l", "d");
    let world = v.merge("Ġwor", "ld");
    v.merge("H", "e");
    v.merge("l", "l");
    let hell = v.merge("He", "ll");
    let twelve = v.merge("1", "2");
    let im_start = v.token("<|im_start|>", CONTROL);
    let im_end = v.token("<|im_end|>", CONTROL);
    let endoftext = v.token("<|endoftext|>", CONTROL);
    let think = v.token("<think>", USER_DEFINED);
    // Spelled like an end-of-turn marker but an ordinary piece.
    let normal_end = v.token("<|end|>", NORMAL);
    v.extra = vec![
        ("tokenizer.ggml.eos_token_id", Value::U32(im_end)),
        ("tokenizer.ggml.bos_token_id", Value::U32(endoftext)),
        ("tokenizer.ggml.padding_token_id", Value::U32(endoftext)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
    ];
    (
        v,
        Ids {
            hell,
            world,
            twelve,
            im_start,
            im_end,
            endoftext,
            think,
            normal_end,
        },
    )
}

#[test]
fn encodes_with_merges_and_decodes_back() {
    let (v, ids) = sample();
    let tok = v.build();
    let out = tok.encode("Hello world", true).unwrap();
    assert_eq!(out, vec![ids.hell, u32::from(b'o'), ids.world]);
    assert_eq!(tok.decode(&out, false).unwrap(), "Hello world");
    assert_eq!(tok.encode("", true).unwrap(), Vec::<u32>::new());
    assert_eq!(tok.vocab_size(), v.tokens.len());
}

#[test]
fn control_tokens_are_atomic_only_when_parsing_special() {
    let (v, ids) = sample();
    let tok = v.build();
    let text = "<|im_start|>Hello<|im_end|>";
    let parsed = tok.encode(text, true).unwrap();
    assert_eq!(
        parsed,
        vec![ids.im_start, ids.hell, u32::from(b'o'), ids.im_end]
    );
    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&ids.im_start) && !plain.contains(&ids.im_end));
    assert_eq!(tok.decode(&plain, false).unwrap(), text);
    assert_eq!(tok.decode(&parsed, false).unwrap(), text);
    assert_eq!(tok.decode(&parsed, true).unwrap(), "Hello");
}

#[test]
fn user_defined_tokens_are_always_atomic() {
    let (v, ids) = sample();
    let tok = v.build();
    for parse_special in [true, false] {
        let out = tok.encode("<think>\nHi", parse_special).unwrap();
        assert_eq!(out[0], ids.think, "parse_special={parse_special}");
    }
    // Not special: survives skip_special.
    assert_eq!(tok.decode(&[ids.think], true).unwrap(), "<think>");
}

#[test]
fn input_is_nfc_normalized() {
    let (v, _) = sample();
    let tok = v.build();
    let out = tok.encode("e\u{301}", true).unwrap();
    assert_eq!(out, vec![0xC3, 0xA9]);
    assert_eq!(tok.decode(&out, false).unwrap(), "\u{e9}");
}

#[test]
fn pre_tokenizer_family_changes_digit_splitting() {
    let (mut v, ids) = sample();
    // Qwen2 isolates every digit, so the "1 2" merge never applies.
    assert_eq!(
        v.build().encode("123", true).unwrap(),
        vec![u32::from(b'1'), u32::from(b'2'), u32::from(b'3')]
    );
    // The GPT-2 regex keeps digit runs together.
    v.pre = Some("gpt-2");
    assert_eq!(
        v.build().encode("123", true).unwrap(),
        vec![ids.twelve, u32::from(b'3')]
    );
    v.pre = None;
    assert_eq!(
        v.build().encode("123", true).unwrap(),
        vec![ids.twelve, u32::from(b'3')]
    );
    // Llama 3 groups up to three digits.
    v.pre = Some("llama-bpe");
    assert_eq!(
        v.build().encode("123", true).unwrap(),
        vec![ids.twelve, u32::from(b'3')]
    );
}

#[test]
fn special_ids_and_eog_set() {
    let (v, ids) = sample();
    let tok = v.build();
    assert_eq!(tok.bos_id(), Some(ids.endoftext));
    assert_eq!(tok.eos_id(), Some(ids.im_end));
    assert_eq!(tok.pad_id(), Some(ids.endoftext));
    assert!(!tok.add_bos());
    assert_eq!(tok.eog_ids(), &[ids.im_end, ids.endoftext]);
    assert!(tok.is_eog(ids.im_end));
    assert!(tok.is_eog(ids.endoftext));
    assert!(!tok.is_eog(ids.think));
    assert!(!tok.is_eog(ids.normal_end));
    assert!(!tok.is_eog(u32::MAX));
    assert!(tok.is_control(ids.im_start));
    assert!(!tok.is_control(ids.think));
    assert_eq!(tok.token_type(ids.think), Some(TokenType::UserDefined));
}

#[test]
fn token_lookup_both_ways() {
    let (v, ids) = sample();
    let tok = v.build();
    assert_eq!(tok.token_text(ids.world), Some("Ġworld"));
    assert_eq!(tok.token_id("Ġworld"), Some(ids.world));
    assert_eq!(tok.token_id("<|im_end|>"), Some(ids.im_end));
    assert_eq!(tok.token_text(ids.im_end), Some("<|im_end|>"));
    assert_eq!(tok.token_bytes(ids.world), Some(&b" world"[..]));
    assert_eq!(tok.token_text(10_000), None);
    assert_eq!(tok.token_id("not a token"), None);
}

#[test]
fn out_of_range_ids_are_errors() {
    let (v, _) = sample();
    let tok = v.build();
    let n = tok.vocab_size() as u32;
    let err = tok.decode(&[1, n], false).unwrap_err();
    assert!(
        matches!(err, TokenizerError::TokenOutOfRange { id, .. } if id == n),
        "{err}"
    );
    let mut stream = tok.stream_decoder();
    assert!(stream.try_push(n).is_err());
    assert_eq!(stream.push(n), "");
}

#[test]
fn add_bos_follows_metadata() {
    let (mut v, _) = sample();
    v.extra
        .retain(|(k, _)| *k != "tokenizer.ggml.add_bos_token");
    v.extra
        .push(("tokenizer.ggml.add_bos_token", Value::Bool(true)));
    assert!(v.build().add_bos());
}

#[test]
fn out_of_range_special_ids_are_refused_but_padding_is_ignored() {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        for id in [1_000_000, u32::MAX] {
            let (mut v, _) = sample();
            v.extra = vec![(key, Value::U32(id))];
            let err = Tokenizer::from_gguf(&v.gguf()).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(key) && msg.contains(&id.to_string()) && msg.contains("vocabulary"),
                "{msg}"
            );
        }
    }
    let (mut v, ids) = sample();
    v.extra = vec![
        ("tokenizer.ggml.padding_token_id", Value::U32(u32::MAX)),
        ("tokenizer.ggml.eot_token_id", Value::U32(ids.im_start)),
    ];
    let tok = v.build();
    assert_eq!(tok.eot_id(), Some(ids.im_start));
    assert!(tok.is_eog(ids.im_start));
}

#[test]
fn refuses_other_models_by_name() {
    for model in ["bert", "t5", "llama-spm"] {
        let (mut v, _) = sample();
        v.model = model;
        let err = Tokenizer::from_gguf(&v.gguf()).unwrap_err();
        assert!(matches!(err, TokenizerError::UnsupportedModel(ref m) if m == model));
        assert!(err.to_string().contains(model), "{err}");
    }
}

#[test]
fn refuses_unknown_pre_tokenizer_by_name() {
    let (mut v, _) = sample();
    v.pre = Some("mystery-bpe");
    let err = Tokenizer::from_gguf(&v.gguf()).unwrap_err();
    assert!(err.to_string().contains("mystery-bpe"), "{err}");
}

#[test]
fn malformed_metadata_is_reported() {
    let err = Tokenizer::from_gguf(&gguf_from_kv(vec![(
        "tokenizer.ggml.model",
        Value::String("gpt2".into()),
    )]))
    .unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingKey("tokenizer.ggml.tokens")),
        "{err}"
    );

    let (mut v, _) = sample();
    v.types.pop();
    let err = Tokenizer::from_gguf(&v.gguf()).unwrap_err();
    assert!(err.to_string().contains("token_type"), "{err}");

    let (mut v, _) = sample();
    v.merges.push(format!("{} zzz", byte_token(b"a")));
    let err = Tokenizer::from_gguf(&v.gguf()).unwrap_err();
    assert!(matches!(err, TokenizerError::Build(_)), "{err}");

    let (mut v, _) = sample();
    v.merges.push("nospace".into());
    let err = Tokenizer::from_gguf(&v.gguf()).unwrap_err();
    assert!(err.to_string().contains("merges"), "{err}");

    let mut kv = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array(vec![Value::U32(3)])),
        ("tokenizer.ggml.merges", Value::Array(vec![])),
    ];
    let err = Tokenizer::from_gguf(&gguf_from_kv(kv.clone())).unwrap_err();
    assert!(err.to_string().contains("not a string"), "{err}");
    kv[1].1 = Value::Array(vec![]);
    let err = Tokenizer::from_gguf(&gguf_from_kv(kv)).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
}
