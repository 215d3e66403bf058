//! Reasoning separation (`GenerateRequest.separate_reasoning`) through the gRPC service.
//!
//! Neither the demo model nor the real checkpoint (Qwen2.5-Coder-0.5B-Instruct, found as
//! tests/real_model.rs finds it) thinks on its own, so a regex response format makes them
//! write a `<think>` section: the same greedy request with and without the flag generates
//! the same tokens, and the flag only changes how their text is reported. Without the flag
//! the text is exactly what it was before the flag existed (tags included).

mod service_support;

use inferno::engine::loader::{assets_from_gguf, LoadOptions};
use inferno::gguf::GgufFile;
use inferno::server::pb::{self, response_format::Format, FinishReason};
use inferno::server::{start, RunningServer};
use service_support::*;
use tonic::Code;

fn forced(prompt: &str, rx: &str, separate: bool) -> pb::GenerateRequest {
    let mut req = greedy(prompt, 64);
    req.ignore_eos = false;
    req.response_format = Some(pb::ResponseFormat {
        format: Some(Format::Regex(rx.into())),
    });
    req.separate_reasoning = separate;
    req
}

/// The reasoning and answer `text` holds by the rules of the reasoning parser, worked out
/// here with string operations on the whole text.
fn expected_split(text: &str, opened_in_prompt: bool) -> (String, String) {
    let body = if opened_in_prompt {
        text
    } else {
        text.trim_start()
            .strip_prefix("<think>")
            .expect("the output opens a section")
    };
    let (reasoning, answer) = body.split_once("</think>").expect("the section closes");
    (
        reasoning.trim().to_string(),
        answer.trim_start().to_string(),
    )
}

/// Checks one forced request with and without separation; returns the separated result.
async fn check_separation(
    server: &RunningServer,
    prompt: &str,
    rx: &str,
    opened: bool,
) -> Collected {
    let mut c = client(server.addr()).await;
    let plain = run(&mut c, forced(prompt, rx, false)).await;
    assert_eq!(plain.code(), Code::Ok, "{:?}", plain.status);
    let text = plain.text();
    let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    assert!(full.is_match(&text), "{text:?} does not match {rx}");
    // Without the flag: nothing is reasoning, the tags are text.
    assert!(plain.tokens.iter().all(|t| t.reasoning.is_empty()));
    let done = plain.done.as_ref().unwrap();
    assert!(done.reasoning.is_empty() && done.reasoning_content.is_empty());
    assert!(text.contains("</think>"), "{text:?}");

    let sep = run(&mut c, forced(prompt, rx, true)).await;
    assert_eq!(sep.code(), Code::Ok, "{:?}", sep.status);
    assert_eq!(sep.ids(), plain.ids(), "the flag changes no token");
    assert_eq!(sep.finish_reason(), plain.finish_reason());
    let (reasoning, answer) = expected_split(&text, opened);
    let done = sep.done.as_ref().unwrap();
    assert_eq!(done.reasoning_content, reasoning, "from {text:?}");
    assert!(!reasoning.is_empty());
    let mut streamed: String = sep.tokens.iter().map(|t| t.reasoning.as_str()).collect();
    streamed.push_str(&done.reasoning);
    assert_eq!(
        streamed, reasoning,
        "the deltas add up to reasoning_content"
    );
    assert_eq!(sep.text(), answer, "from {text:?}");
    assert!(!sep.text().contains("think>"));
    // Reasoning streams as it is generated, and all of it comes before the answer.
    let first_answer = sep.tokens.iter().position(|t| !t.text.is_empty());
    let last_reasoning = sep.tokens.iter().rposition(|t| !t.reasoning.is_empty());
    assert!(
        last_reasoning.is_some(),
        "reasoning arrived with the tokens"
    );
    if let (Some(a), Some(r)) = (first_answer, last_reasoning) {
        assert!(
            r < a,
            "reasoning at token {r} after answer text at token {a}"
        );
    }
    sep
}

/// The section written by the model, the one a prompt opened, and a tool call after the
/// reasoning (parsed from the answer, while call-like text in the reasoning is not).
async fn separation_cases(server: &RunningServer) {
    check_separation(
        server,
        "Think, then answer:",
        "<think>[a-z][a-z ]{0,19}</think>[a-z ]{1,20}",
        false,
    )
    .await;
    // A prompt that ends in an open `<think>`, as Qwen3 thinking templates write it.
    check_separation(
        server,
        "Question: what is red?\nAnswer: <think>\n",
        "[a-z][a-z ]{0,19}\n</think>\n\n[a-z ]{1,20}",
        true,
    )
    .await;

    let mut c = client(server.addr()).await;
    let rx = r#"<think>[a-z]{1,12} <tool_call>\{\}</tool_call></think>
<tool_call>
\{"name": "get_time", "arguments": \{"tz": "UTC"\}\}
</tool_call>"#;
    let mut req = forced("", rx, true);
    // The demo model's vocabulary is mostly single bytes.
    req.max_tokens = Some(200);
    req.prompt.clear();
    req.messages = vec![pb::ChatMessage {
        role: "user".into(),
        content: "What time is it?".into(),
        ..Default::default()
    }];
    req.tools = vec![pb::Tool {
        name: "get_time".into(),
        description: "The local time in a time zone.".into(),
        parameters: r#"{"type": "object", "properties": {"tz": {"type": "string"}}}"#.into(),
    }];
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    let done = r.done.as_ref().unwrap();
    assert!(
        done.reasoning_content
            .ends_with(" <tool_call>{}</tool_call>"),
        "{done:?}"
    );
    assert_eq!(r.tool_calls.len(), 1, "{r:?}");
    assert_eq!(r.tool_calls[0].name, "get_time");
    assert_eq!(r.tool_calls[0].arguments, r#"{"tz":"UTC"}"#);
    assert_eq!(done.tool_calls, r.tool_calls);
    assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    assert_eq!(r.text(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_reported_apart_on_the_demo_model() {
    let server = start_demo(test_config()).await;
    separation_cases(&server).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_reported_apart_on_the_real_checkpoint() {
    let Some(path) = real_model_or_skip() else {
        return;
    };
    let loader = move || {
        let gguf = GgufFile::open(&path).map_err(|e| e.to_string())?;
        let opts = LoadOptions {
            ctx_size: Some(1024),
            tracing: false,
            ..LoadOptions::default()
        };
        assets_from_gguf(&gguf, "qwen2.5-coder-0.5b-instruct", false, &opts)
    };
    let server = start(test_config(), loader).await.expect("server starts");
    wait_ready(&server).await;
    separation_cases(&server).await;
    server.shutdown().await.unwrap();
}
