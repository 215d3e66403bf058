//! Small synthetic byte-level vocabularies for unit tests.

use inferno_gguf::{GgufFile, GgufWriter, Value};

use super::byte_level::byte_to_char;
use super::Tokenizer;

/// GGUF token types.
pub const NORMAL: i32 = 1;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;

/// Builds an in-memory GGUF holding `kv`.
pub fn gguf_from_kv(kv: Vec<(&str, Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in kv {
        w.add(k, v);
    }
    GgufFile::from_bytes(w.to_bytes()).expect("test GGUF parses")
}

/// The byte-level vocabulary string for raw bytes.
pub fn byte_token(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// A vocabulary under construction: the 256 single-byte tokens come first,
/// so the id of byte `b` is `b`.
pub struct VocabBuilder {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub extra: Vec<(&'static str, Value)>,
    pub pre: Option<&'static str>,
    pub model: &'static str,
}

impl Default for VocabBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl VocabBuilder {
    pub fn new() -> Self {
        Self {
            tokens: (0..=255u8).map(|b| byte_token(&[b])).collect(),
            types: vec![NORMAL; 256],
            merges: Vec::new(),
            extra: Vec::new(),
            pre: Some("qwen2"),
            model: "gpt2",
        }
    }

    /// Adds a token with the given type and returns its id.
    pub fn token(&mut self, text: &str, ty: i32) -> u32 {
        self.tokens.push(text.to_owned());
        self.types.push(ty);
        (self.tokens.len() - 1) as u32
    }

    /// Adds a normal token standing for raw `bytes` (no merge) and returns its id.
    pub fn bytes_token(&mut self, bytes: &[u8]) -> u32 {
        let text = byte_token(bytes);
        if let Some(i) = self.tokens.iter().position(|t| *t == text) {
            return i as u32;
        }
        self.token(&text, NORMAL)
    }

    /// Adds the merge `a b` and its result token; returns the result's id.
    pub fn merge(&mut self, a: &str, b: &str) -> u32 {
        self.merges.push(format!("{a} {b}"));
        self.token(&format!("{a}{b}"), NORMAL)
    }

    pub fn gguf(&self) -> GgufFile {
        let strings = |v: &[String]| Value::Array(v.iter().cloned().map(Value::String).collect());
        let mut kv: Vec<(&str, Value)> = vec![
            ("tokenizer.ggml.model", Value::String(self.model.into())),
            ("tokenizer.ggml.tokens", strings(&self.tokens)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(self.types.iter().map(|&t| Value::I32(t)).collect()),
            ),
            ("tokenizer.ggml.merges", strings(&self.merges)),
        ];
        if let Some(pre) = self.pre {
            kv.push(("tokenizer.ggml.pre", Value::String(pre.into())));
        }
        kv.extend(self.extra.iter().cloned());
        gguf_from_kv(kv)
    }

    pub fn build(&self) -> Tokenizer {
        Tokenizer::from_gguf(&self.gguf()).expect("test tokenizer builds")
    }
}
