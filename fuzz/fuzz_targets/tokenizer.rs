//! Fuzz target: the Qwen3 tokenizer on arbitrary text. Encoding must not panic in either
//! mode, every id must be in the vocabulary, plain text must decode back to its NFC form, and
//! decoding token by token must give the same text as decoding all at once.

#![no_main]

use inferno::gguf::GgufFile;
use inferno::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use unicode_normalization::UnicodeNormalization;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tokenizer/qwen3-vocab.gguf"
        );
        let gguf = GgufFile::open(path).expect("the tokenizer fixture opens");
        Tokenizer::from_gguf(&gguf).expect("the tokenizer fixture loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let tok = tokenizer();
    let text = String::from_utf8_lossy(data);
    let vocab = tok.vocab_size() as u32;
    for parse_special in [false, true] {
        let ids = tok
            .encode(&text, parse_special)
            .expect("encoding never fails");
        assert!(ids.iter().all(|&id| id < vocab));
        let decoded = tok.decode(&ids, false).expect("own ids decode");
        if !parse_special {
            // Compared after normalizing both: the tokenizer's NFC tables are of an older
            // Unicode version, so combining marks added since may stay in their order.
            assert_eq!(
                decoded.nfc().collect::<String>(),
                text.nfc().collect::<String>()
            );
        }
        let mut stream = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &ids {
            stream.push_into(id, &mut streamed).expect("own ids stream");
        }
        stream.finish_into(&mut streamed);
        assert_eq!(streamed, decoded);
    }
});
