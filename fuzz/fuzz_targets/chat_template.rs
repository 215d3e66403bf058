//! Fuzz target: the chat-template renderer. The first byte picks what is arbitrary:
//! - even: a conversation (roles and contents split on NUL bytes, or a JSON messages array)
//!   rendered with Qwen3's template, as a client's request is;
//! - odd: the template source itself (a model file's), compiled and rendered with a fixed
//!   conversation.
//!
//! Anything may fail with an error; nothing may panic.

#![no_main]

use inferno::gguf::GgufFile;
use inferno::tokenizer::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn qwen3() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tokenizer/qwen3-vocab.gguf"
        );
        let gguf = GgufFile::open(path).expect("the tokenizer fixture opens");
        ChatTemplate::from_gguf(&gguf)
            .expect("the fixture's template compiles")
            .expect("the fixture has a template")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let thinking = [None, Some(false), Some(true)][usize::from(mode >> 1) % 3];
    if mode % 2 == 0 {
        let parts: Vec<&str> = text.split('\0').collect();
        let messages: Vec<ChatMessage> = parts
            .chunks(2)
            .map(|p| ChatMessage::new(p[0], p.get(1).copied().unwrap_or("")))
            .collect();
        let _ = qwen3().render(&messages, mode & 4 != 0, thinking);
        let _ = qwen3().render_json(&text, None, true, thinking);
    } else if let Ok(t) = ChatTemplate::new(text.into_owned()) {
        let messages = [
            ChatMessage::new("system", "be brief"),
            ChatMessage::new("user", "hello"),
            ChatMessage::new("assistant", "hi"),
        ];
        let _ = t.render(&messages, true, thinking);
    }
});
