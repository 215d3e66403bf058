//! The HTTP API against clients nobody here wrote: the official `openai` Python package
//! (`tests/openai/check_openai_api.py`: chat, streaming with usage, a two-turn tool
//! conversation, json_schema validated by `jsonschema`, logprobs, n = 2, stop strings,
//! seeds, completions from token ids, models, reasoning, and each error class as the
//! client's own exception) against the `inferno serve` binary; and the README's `curl` and
//! `openai` examples, run as written but for the address. On the real checkpoint
//! (Qwen2.5-Coder-0.5B-Instruct, found as tests/real_model.rs finds it) the script runs
//! again, and a greedy chat over HTTP must give the gRPC stream's tokens, logprob for
//! logprob. The Responses API is driven the same way (`tests/openai/check_responses_api.py`:
//! each greedy response against the chat completion of the same conversation, streamed
//! through the client's own stream helper, kept turns, function calls, formats, reasoning
//! items, logprobs and refusals), on both models.
//!
//! Python with `openai` and `jsonschema` is required: `scripts/test` installs them into
//! `.venv/`; `INFERNO_PYTHON` may name another interpreter. `curl` must be on the PATH.

mod service_support;

use serde_json::{json, Value};
use service_support::http;
use service_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    python_with("openai, jsonschema", "openai and jsonschema")
}

/// Runs the checking script against a server's HTTP address; returns its summary.
fn check_api(python: &Path, p: &ServeProcess, extra: &[&str]) -> Value {
    run_script(python, "check_openai_api.py", p, extra)
}

/// Runs the Responses API's checking script; returns its summary.
fn check_responses(python: &Path, p: &ServeProcess, extra: &[&str]) -> Value {
    run_script(python, "check_responses_api.py", p, extra)
}

fn run_script(python: &Path, script: &str, p: &ServeProcess, extra: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(repo().join("tests/openai").join(script))
        .args(["--base-url", &format!("http://{}/v1", p.http)])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", shown(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", shown(&out)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_gets_what_it_expects_and_each_error_as_its_exception() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let p = spawn_serve(&[
        "--auth-token-file",
        token.to_str().unwrap(),
        "--queue-capacity",
        "2",
        "--max-batch",
        "2",
        "--max-message-bytes",
        "65536",
    ]);
    wait_serving(p.addr).await;
    let v = check_api(&python, &p, &["--api-key", "t0ken", "--limits"]);
    eprintln!("demo model: {v}");
    for code in ["400", "401", "404", "413", "429"] {
        assert!(v["errors"][code].is_string(), "{code}: {v}");
    }
    assert!(
        v["errors"]["413"]
            .as_str()
            .unwrap()
            .contains("--max-message-bytes"),
        "{v}"
    );
    assert!(
        v["tools"]["turn2_cached_tokens"].as_u64().unwrap() > 0,
        "{v}"
    );
    let r = check_responses(&python, &p, &["--api-key", "t0ken"]);
    eprintln!("responses, demo model: {r}");
    assert_eq!(r["refusals"].as_object().unwrap().len(), 10, "{r}");
}

/// The fenced blocks of a language in the README's HTTP section that talk to the default
/// address.
fn readme_blocks(lang: &str, needle: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let fence = format!("```{lang}\n");
    let mut blocks = Vec::new();
    let mut rest = readme.as_str();
    while let Some(start) = rest.find(&fence) {
        let body = &rest[start + fence.len()..];
        let end = body.find("```").expect("a closed block");
        if body[..end].contains(needle) {
            blocks.push(body[..end].to_string());
        }
        rest = &body[end + 3..];
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_examples_and_the_real_checkpoint() {
    let python = python();
    let real = real_model_or_skip();
    let p = match &real {
        Some(m) => spawn_serve(&["--model", m.to_str().unwrap(), "--ctx-size", "1024"]),
        None => spawn_serve(&[]),
    };
    wait_serving(p.addr).await;
    let here = p.http.to_string();

    // The README's examples, as written but for the address.
    let curls = readme_blocks("sh", "curl http://127.0.0.1:8080");
    assert!(curls.len() >= 3, "the README shows curl examples");
    for block in &curls {
        let script = block.replace("127.0.0.1:8080", &here);
        let out = Command::new("sh")
            .args(["-e", "-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}\n{}", shown(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("\"choices\"")
                || text.contains("data: [DONE]")
                || text.contains("\"object\":\"response\""),
            "{script}\n{text}"
        );
    }
    let pys = readme_blocks("python", "base_url=\"http://127.0.0.1:8080/v1\"");
    assert!(pys.len() >= 2, "the README shows the openai client");
    for block in &pys {
        let script = block.replace("127.0.0.1:8080", &here);
        let out = Command::new(&python)
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}\n{}", shown(&out));
        assert!(!out.stdout.is_empty(), "{script}\n{}", shown(&out));
    }

    let Some(_) = real else { return };
    let v = check_api(&python, &p, &["--real"]);
    eprintln!("real checkpoint: {v}");
    let r = check_responses(&python, &p, &["--real"]);
    eprintln!("responses, real checkpoint: {r}");

    // A greedy chat over HTTP gives the gRPC stream's tokens, logprob for logprob.
    let mut c = client(p.addr).await;
    let question = "Write a haiku about compilers.";
    let mut req = greedy("", 24);
    req.prompt.clear();
    req.ignore_eos = false;
    req.messages = vec![inferno::server::pb::ChatMessage {
        role: "user".into(),
        content: question.into(),
        ..Default::default()
    }];
    req.logprobs = 1;
    let g = run(&mut c, req).await;
    assert_eq!(g.code(), tonic::Code::Ok);
    let body = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 24,
                      "temperature": 0, "logprobs": true});
    let h = http::post_async(p.http, "/v1/chat/completions", body)
        .await
        .json();
    let choice = &h["choices"][0];
    assert_eq!(choice["message"]["content"], g.text(), "{h}");
    let http_tokens: Vec<(String, f32)> = choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["token"].as_str().unwrap().to_string(),
                t["logprob"].as_f64().unwrap() as f32,
            )
        })
        .collect();
    let grpc_tokens: Vec<(String, f32)> = g
        .tokens
        .iter()
        .map(|t| {
            let lp = t.logprobs.as_ref().unwrap().chosen.as_ref().unwrap();
            (lp.text.clone(), lp.logprob)
        })
        .collect();
    assert_eq!(http_tokens, grpc_tokens);
}
