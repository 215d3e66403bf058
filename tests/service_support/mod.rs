//! Helpers for the service tests: an in-process server on 127.0.0.1:0 serving the built-in
//! demo model, a generated tonic client, and stream collection.
#![allow(dead_code)]

pub mod http;

use inferno::engine::loader::{synthetic_assets, LoadOptions};
use inferno::engine::{generate, Flow, GenerateOptions};
use inferno::engine::{EngineConfig, EngineState};
use inferno::sampling::SamplingParams;
use inferno::server::pb::generate_response::Event;
use inferno::server::pb::inference_client::InferenceClient;
use inferno::server::pb::{self, GenerateDone, GeneratedToken};
use inferno::server::{start, RunningServer, ServerConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Streaming;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A config for a test server: any free port, fault injection on.
pub fn test_config() -> ServerConfig {
    ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        engine: EngineConfig {
            queue_capacity: 16,
            fault_injection: true,
            ..EngineConfig::default()
        },
        ..ServerConfig::default()
    }
}

pub fn demo_loader() -> impl FnOnce() -> Result<inferno::engine::EngineAssets, String> + Send {
    || synthetic_assets("demo", &LoadOptions::default())
}

/// Starts a server on the demo model and waits until the model is loaded.
pub async fn start_demo(config: ServerConfig) -> RunningServer {
    let server = start(config, demo_loader()).await.expect("server starts");
    wait_ready(&server).await;
    server
}

pub async fn wait_ready(server: &RunningServer) {
    let mut state = server.engine_state();
    let ready = tokio::time::timeout(
        Duration::from_secs(120),
        state.wait_for(|s| !matches!(s, EngineState::Loading)),
    )
    .await
    .expect("the model loads (hang guard)")
    .expect("engine state channel open");
    assert!(
        matches!(&*ready, EngineState::Ready(_)),
        "the demo model loads"
    );
}

pub async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

pub async fn client(addr: SocketAddr) -> InferenceClient<Channel> {
    InferenceClient::new(channel(addr).await)
}

/// A greedy request that always generates `max_tokens` tokens.
pub fn greedy(prompt: &str, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: prompt.to_string(),
        max_tokens: Some(max_tokens),
        sampling: Some(pb::SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        }),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Everything a Generate stream delivered.
#[derive(Debug, Default)]
pub struct Collected {
    pub tokens: Vec<GeneratedToken>,
    /// Tool-call events, in order.
    pub tool_calls: Vec<pb::ToolCall>,
    pub done: Option<GenerateDone>,
    /// The stream's final status: Ok, or the error it ended with.
    pub status: Option<tonic::Status>,
}

impl Collected {
    pub fn ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }

    /// Every token's text and the final tail.
    pub fn text(&self) -> String {
        let mut s: String = self.tokens.iter().map(|t| t.text.as_str()).collect();
        if let Some(d) = &self.done {
            s.push_str(&d.text);
        }
        s
    }

    pub fn finish_reason(&self) -> Option<pb::FinishReason> {
        self.done
            .as_ref()
            .map(|d| pb::FinishReason::try_from(d.finish_reason).expect("known finish reason"))
    }

    pub fn code(&self) -> tonic::Code {
        self.status.as_ref().map_or(tonic::Code::Ok, |s| s.code())
    }
}

/// Reads a stream to its end (with a hang guard).
pub async fn collect(mut stream: Streaming<pb::GenerateResponse>) -> Collected {
    let mut c = Collected::default();
    let read = async {
        loop {
            match stream.message().await {
                Ok(Some(m)) => match m.event {
                    Some(Event::Token(t)) => {
                        assert!(c.done.is_none(), "a token after the final message");
                        c.tokens.push(t);
                    }
                    Some(Event::ToolCall(t)) => {
                        assert!(c.done.is_none(), "a tool call after the final message");
                        c.tool_calls.push(t);
                    }
                    Some(Event::Done(d)) => {
                        assert!(c.done.is_none(), "two final messages");
                        c.done = Some(d);
                    }
                    None => panic!("a message without an event"),
                },
                Ok(None) => break,
                Err(s) => {
                    c.status = Some(s);
                    break;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(300), read)
        .await
        .expect("stream ends (hang guard)");
    c
}

/// Sends a request and reads its whole stream; a call refused up front comes back as the
/// status.
pub async fn run(client: &mut InferenceClient<Channel>, req: pb::GenerateRequest) -> Collected {
    match client.generate(req).await {
        Ok(r) => collect(r.into_inner()).await,
        Err(s) => Collected {
            status: Some(s),
            ..Default::default()
        },
    }
}

/// Reads the next token of a stream, failing on anything else.
pub async fn next_token(stream: &mut Streaming<pb::GenerateResponse>) -> GeneratedToken {
    let m = tokio::time::timeout(Duration::from_secs(120), stream.message())
        .await
        .expect("a token arrives (hang guard)")
        .expect("stream ok")
        .expect("stream not ended");
    match m.event {
        Some(Event::Token(t)) => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

/// The value of an unlabelled metric in a text exposition.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing from:\n{text}"))
}

/// A `inferno serve` child process, killed if a test fails before it exits.
pub struct ServeProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    /// The HTTP API's address.
    pub http: SocketAddr,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts the binary on free ports and reads the addresses it prints.
pub fn spawn_serve(extra: &[&str]) -> ServeProcess {
    spawn_serve_command(serve_command(extra))
}

/// `inferno serve` on free ports (gRPC, metrics, HTTP) with `extra` arguments.
fn serve_command(extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferno"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ])
    .args(extra);
    cmd
}

/// [`spawn_serve`] with the server's log (warnings and errors, panics) written to `log`
/// instead of the test's output, for a test to read.
pub fn spawn_serve_logging_to(extra: &[&str], log: &std::path::Path) -> ServeProcess {
    let file = std::fs::File::create(log).expect("the log file can be created");
    spawn_serve_command_with(serve_command(extra), Stdio::from(file))
}

/// Runs `cmd`, which must start `inferno serve` with a metrics address and the HTTP API
/// printing their addresses, and reads them.
pub fn spawn_serve_command(cmd: Command) -> ServeProcess {
    spawn_serve_command_with(cmd, Stdio::inherit())
}

/// [`spawn_serve_command`] with the server's standard error going to `stderr`.
pub fn spawn_serve_command_with(mut cmd: Command, stderr: Stdio) -> ServeProcess {
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("inferno serve starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut find = |prefix: &str| -> String {
        let line = lines
            .next()
            .expect("serve prints its addresses")
            .expect("stdout readable");
        line.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .to_string()
    };
    let addr = find("inferno: gRPC listening on ").parse().unwrap();
    let metrics = find("inferno: metrics listening on http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    let http = find("inferno: HTTP listening on ")
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    ServeProcess {
        child,
        addr,
        metrics,
        http,
    }
}

/// What grpc health says of the whole server (service "").
pub async fn health_status(health: &mut HealthClient<Channel>) -> ServingStatus {
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

pub async fn wait_serving(addr: SocketAddr) {
    let mut health = HealthClient::new(channel(addr).await);
    for _ in 0..1200 {
        if health_status(&mut health).await == ServingStatus::Serving {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server never reported SERVING");
}

pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Greedy completions of `prompts` computed one at a time in-process with the
/// single-sequence `generate` (no batching, no prefix reuse), on the demo model loaded with
/// `opts`.
pub fn reference_on(opts: &LoadOptions, prompts: &[&str], max_tokens: usize) -> Vec<Vec<u32>> {
    let a = synthetic_assets("demo", opts).unwrap();
    let mut state = a.model.new_state(a.ctx_size, a.state_rows);
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        ignore_eos: true,
        time_limit: None,
        grammar: None,
        speculate: true,
        ..GenerateOptions::default()
    };
    prompts
        .iter()
        .map(|p| {
            let mut ids: Vec<u32> = Vec::new();
            if a.tokenizer.add_bos() {
                ids.extend(a.tokenizer.bos_id());
            }
            ids.extend(a.tokenizer.encode(p, true).unwrap());
            generate(&a.model, &a.tokenizer, &mut state, &ids, &opts, |_| {
                Flow::Continue
            })
            .unwrap()
            .tokens
        })
        .collect()
}

/// The real checkpoint the real-model tests use (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), from
/// `INFERNO_TEST_MODEL` or the cache `scripts/fetch-test-model.sh` fills; `None` if absent.
pub fn real_model_path() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    if let Some(p) = std::env::var_os("INFERNO_TEST_MODEL") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let p = cache
        .join("inferno-models")
        .join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    p.exists().then_some(p)
}

/// Whether the tests run under CI, where a missing real checkpoint is a failure.
pub fn in_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

/// The real checkpoint for a real-model test; `None` (the test says it skipped) when it is
/// absent outside CI. Under CI a missing checkpoint fails the test.
#[allow(dead_code)]
pub fn real_model_or_skip() -> Option<std::path::PathBuf> {
    let p = real_model_path();
    if p.is_none() {
        assert!(
            !in_ci(),
            "CI must run the real-model test: set INFERNO_TEST_MODEL"
        );
        eprintln!("SKIPPED: no real checkpoint (set INFERNO_TEST_MODEL)");
    }
    p
}

/// `$INFERNO_PYTHON`, the repository's `.venv/bin/python` (which `scripts/test` fills) or
/// `python3`: the first that runs `import {modules}`. Panics naming `what` and the
/// interpreters tried when none does.
pub fn python_with(modules: &str, what: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    let mut candidates: Vec<PathBuf> = std::env::var_os("INFERNO_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    candidates.push(PathBuf::from("python3"));
    let tried = format!("{candidates:?}");
    candidates
        .into_iter()
        .find(|c| {
            Command::new(c)
                .args(["-c", &format!("import {modules}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .unwrap_or_else(|| {
            panic!(
                "no Python with {what} (tried {tried}): run scripts/test, which installs it \
                 into .venv/, or set INFERNO_PYTHON"
            )
        })
}

/// A finished child's status and output, for assertion messages.
pub fn shown(o: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
