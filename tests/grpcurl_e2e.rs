//! End to end with clients that are not ours: the real `grpcurl` binary (through server
//! reflection, without the proto file) and the Python example client (grpcio, stubs
//! generated from proto/ at run time), against the `inferno serve` binary.
//!
//! `scripts/test` installs both into `.venv/`. Under CI (`CI=true`) a missing tool fails
//! the test; elsewhere the test says what is missing and passes without running.

mod service_support;

use service_support::*;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Finds a tool: `$env_var`, then `.venv/bin/<name>`, then `PATH`; checks it runs.
fn find_tool(env_var: &str, name: &str, probe: &[&str]) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os(env_var) {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(repo().join(".venv/bin").join(name));
    candidates.push(PathBuf::from(name));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .args(probe)
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn require(tool: Option<PathBuf>, what: &str) -> Option<PathBuf> {
    if tool.is_none() {
        let msg = format!("{what} is not installed (scripts/test installs it into .venv/)");
        assert!(!in_ci(), "{msg}");
        eprintln!("skipping: {msg}");
    }
    tool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_and_the_python_client_against_the_server() {
    let grpcurl = require(find_tool("GRPCURL", "grpcurl", &["-version"]), "grpcurl");
    let python = require(
        find_tool(
            "INFERNO_PYTHON",
            "python",
            &["-c", "import grpc, grpc_tools"],
        )
        .or_else(|| {
            find_tool(
                "INFERNO_PYTHON",
                "python3",
                &["-c", "import grpc, grpc_tools"],
            )
        }),
        "python with grpcio and grpcio-tools",
    );
    let (Some(grpcurl), Some(python)) = (grpcurl, python) else {
        return;
    };
    let p = spawn_serve(&[]);
    wait_serving(p.addr).await;
    let addr = p.addr.to_string();
    let grpcurl_run = |args: &[&str]| {
        Command::new(&grpcurl)
            .arg("-plaintext")
            .args(args)
            .output()
            .unwrap()
    };

    let list = grpcurl_run(&[&addr, "list"]);
    assert!(list.status.success(), "{}", shown(&list));
    let services = String::from_utf8_lossy(&list.stdout);
    for s in ["inferno.v1.Inference", "grpc.health.v1.Health"] {
        assert!(
            services.lines().any(|l| l == s),
            "{s} missing: {}",
            shown(&list)
        );
    }

    let describe = grpcurl_run(&[&addr, "describe", "inferno.v1.Inference"]);
    assert!(describe.status.success(), "{}", shown(&describe));
    let d = String::from_utf8_lossy(&describe.stdout);
    assert!(
        d.contains("rpc Generate ( .inferno.v1.GenerateRequest ) returns ( stream .inferno.v1.GenerateResponse )"),
        "{}",
        shown(&describe)
    );
    let describe = grpcurl_run(&[&addr, "describe", "inferno.v1.GenerateRequest"]);
    assert!(
        String::from_utf8_lossy(&describe.stdout).contains("max_tokens"),
        "{}",
        shown(&describe)
    );

    let body = r#"{"prompt": "Hello", "max_tokens": 6, "ignore_eos": true,
                   "sampling": {"temperature": 0}, "request_id": "grpcurl-1"}"#;
    let gen = grpcurl_run(&["-d", body, &addr, "inferno.v1.Inference/Generate"]);
    assert!(gen.status.success(), "{}", shown(&gen));
    let out = String::from_utf8_lossy(&gen.stdout);
    assert_eq!(out.matches("\"token\": {").count(), 6, "{}", shown(&gen));
    assert!(out.contains("FINISH_REASON_LENGTH"), "{}", shown(&gen));
    assert!(
        out.contains("\"requestId\": \"grpcurl-1\""),
        "{}",
        shown(&gen)
    );

    // A named tool call, grammar-constrained, comes back as a call; its result goes back in
    // the next turn.
    let tools = r#""tools": [{"name": "get_time", "description": "The local time.",
        "parameters": "{\"type\": \"object\", \"properties\": {\"tz\": {\"enum\": [\"UTC\", \"CET\"]}}, \"required\": [\"tz\"], \"additionalProperties\": false}"}]"#;
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "What time is it?"}}], {tools},
            "tool_choice": {{"function": "get_time"}}, "max_tokens": 120,
            "sampling": {{"temperature": 0}}}}"#
    );
    let gen = grpcurl_run(&["-d", &body, &addr, "inferno.v1.Inference/Generate"]);
    assert!(gen.status.success(), "{}", shown(&gen));
    let out = String::from_utf8_lossy(&gen.stdout);
    assert!(out.contains("FINISH_REASON_TOOL_CALLS"), "{}", shown(&gen));
    assert_eq!(out.matches("\"toolCall\": {").count(), 1, "{}", shown(&gen));
    assert!(out.contains("\"name\": \"get_time\""), "{}", shown(&gen));
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "What time is it?"}},
            {{"role": "assistant", "tool_calls": [{{"id": "call_1", "name": "get_time",
              "arguments": "{{\"tz\": \"UTC\"}}"}}]}},
            {{"role": "tool", "tool_call_id": "call_1", "content": "12:00"}}], {tools},
            "max_tokens": 4, "ignore_eos": true}}"#
    );
    let gen = grpcurl_run(&["-d", &body, &addr, "inferno.v1.Inference/Generate"]);
    assert!(gen.status.success(), "{}", shown(&gen));
    assert!(
        String::from_utf8_lossy(&gen.stdout).contains("\"done\": {"),
        "{}",
        shown(&gen)
    );

    let bad = grpcurl_run(&[
        "-d",
        r#"{"prompt": ""}"#,
        &addr,
        "inferno.v1.Inference/Generate",
    ]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("InvalidArgument"),
        "{}",
        shown(&bad)
    );

    let health = grpcurl_run(&[
        "-d",
        r#"{"service": ""}"#,
        &addr,
        "grpc.health.v1.Health/Check",
    ]);
    assert!(
        String::from_utf8_lossy(&health.stdout).contains("\"SERVING\""),
        "{}",
        shown(&health)
    );

    // The client compiles its stubs in a temporary directory; it leaves nothing behind.
    let py_tmp = tempfile::tempdir().unwrap();
    let py = Command::new(&python)
        .arg(repo().join("examples/python_client/client.py"))
        .args(["--addr", &addr, "--max-tokens", "8", "--seed", "7", "Hi"])
        .env("TMPDIR", py_tmp.path())
        .output()
        .unwrap();
    assert!(py.status.success(), "{}", shown(&py));
    let left: Vec<_> = std::fs::read_dir(py_tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let err = String::from_utf8_lossy(&py.stderr);
    assert!(err.contains("[demo: qwen3, Q8_0"), "{}", shown(&py));
    assert!(
        err.contains("finish_reason=FINISH_REASON_"),
        "{}",
        shown(&py)
    );
    assert!(err.contains("prompt_tokens=2"), "{}", shown(&py));

    // With a token: health itself needs none, but grpcurl first asks reflection for the
    // method, which does; -reflect-header gives the token to reflection only.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let p = spawn_serve(&["--auth-token-file", token_file.to_str().unwrap()]);
    wait_serving(p.addr).await;
    let addr = p.addr.to_string();
    let check = [
        "-d",
        r#"{"service": ""}"#,
        &addr,
        "grpc.health.v1.Health/Check",
    ];
    let bare = grpcurl_run(&check);
    assert!(!bare.status.success(), "{}", shown(&bare));
    assert!(
        String::from_utf8_lossy(&bare.stderr).contains("Unauthenticated"),
        "{}",
        shown(&bare)
    );
    let mut with_token = vec!["-reflect-header", "authorization: Bearer s3cret-token"];
    with_token.extend(check);
    let health = grpcurl_run(&with_token);
    assert!(
        String::from_utf8_lossy(&health.stdout).contains("\"SERVING\""),
        "{}",
        shown(&health)
    );
}
