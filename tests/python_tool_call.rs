//! A two-turn tool conversation from Python (grpcio, the stubs generated from proto/ at
//! run time) against the `inferno serve` binary: `examples/python_client/tool_call.py`.
//!
//! Turn 1 must come back as one grammar-constrained call (FINISH_REASON_TOOL_CALLS, the call
//! streamed and listed in the final message); turn 2 sends the assistant turn with that call
//! and a `tool` message with its id and result, and must be answered. Run on the demo model
//! and on the real checkpoint (Qwen2.5-Coder-0.5B-Instruct, found as tests/real_model.rs
//! finds it). That the server renders such a conversation as transformers does is checked
//! byte for byte by the unit tests of `engine::plan`.
//!
//! Python with grpcio and grpcio-tools is required: `scripts/test` installs them into
//! `.venv/`; `INFERNO_PYTHON` may name another interpreter. Without one the test fails.

mod service_support;

use service_support::*;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    python_with("grpc, grpc_tools", "grpcio and grpcio-tools")
}

/// Runs the example against a server started with `serve_args`; returns its summary.
async fn conversation(python: &PathBuf, serve_args: &[&str]) -> serde_json::Value {
    let p = spawn_serve(serve_args);
    wait_serving(p.addr).await;
    let out = Command::new(python)
        .arg(repo().join("examples/python_client/tool_call.py"))
        .args([
            "--addr",
            &p.addr.to_string(),
            "--max-tokens",
            "24",
            "--json",
        ])
        .output()
        .unwrap();
    let shown = shown(&out);
    assert!(out.status.success(), "{shown}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {shown}"))
}

fn check(v: &serde_json::Value) {
    let t1 = &v["turn1"];
    assert_eq!(t1["finish_reason"], "FINISH_REASON_TOOL_CALLS", "{v}");
    let calls = t1["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(t1["streamed_calls"], t1["tool_calls"], "{v}");
    assert_eq!(t1["text"], "", "a call's text is not sent as text: {v}");
    let call = &calls[0];
    assert_eq!(call["name"], "get_time", "{v}");
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{v}");
    let args: serde_json::Value = serde_json::from_str(call["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {v}"));
    let tz = args["tz"].as_str().unwrap();
    assert!(["UTC", "CET", "JST"].contains(&tz), "{v}");
    assert_eq!(args.as_object().unwrap().len(), 1, "{v}");
    // The tool ran on the call's arguments.
    assert!(v["results"][0].as_str().unwrap().contains(tz), "{v}");

    let t2 = &v["turn2"];
    let reason = t2["finish_reason"].as_str().unwrap();
    assert!(
        ["FINISH_REASON_EOS", "FINISH_REASON_LENGTH"].contains(&reason),
        "{v}"
    );
    assert!(t2["completion_tokens"].as_u64().unwrap() > 0, "{v}");
    // The prompt grew by the call and its result, and begins with turn 1's whole prompt:
    // the server found all of it in its prefix cache.
    let p1 = t1["prompt_tokens"].as_u64().unwrap();
    assert!(t2["prompt_tokens"].as_u64().unwrap() > p1 + 10, "{v}");
    assert!(t2["cached_prompt_tokens"].as_u64().unwrap() >= p1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_turn_tool_conversation_from_python() {
    let python = python();
    let demo = conversation(&python, &[]).await;
    check(&demo);
    eprintln!("demo model: {demo}");

    let Some(model) = real_model_or_skip() else {
        return;
    };
    let real = conversation(
        &python,
        &["--model", model.to_str().unwrap(), "--ctx-size", "1024"],
    )
    .await;
    check(&real);
    eprintln!("real checkpoint: {real}");
    // A real model answers with text once it has the result.
    assert!(
        !real["turn2"]["text"].as_str().unwrap().trim().is_empty(),
        "{real}"
    );
}
