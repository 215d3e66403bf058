//! The OpenAI-compatible HTTP API against an in-process server on the demo model, driven
//! over plain sockets: the same greedy request answered over HTTP and over gRPC gives the
//! same tokens with the same logprobs, streamed or not; `n` choices run as one batch and a
//! seed makes choice `i` the `n = 1` reply with seed + i; bad input (malformed JSON, wrong
//! types, huge bodies, slow and half-sent requests, idle keep-alive connections past the
//! cap, a client that disconnects after the first chunk) gets its status while the server
//! stays up and its gauges return to 0; the token, TLS, a full queue and a loading model
//! give 401, TLS-only service, 429 with Retry-After and 503. (The official `openai` Python
//! client is driven by `tests/openai_client.rs`.)

mod service_support;

use inferno::engine::Protocol;
use inferno::server::pb;
use inferno::server::{start, RunningServer, ServerConfig};
use rustls::pki_types::pem::PemObject;
use serde_json::{json, Value};
use service_support::http::{self, HttpResponse};
use service_support::*;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

fn http_config() -> ServerConfig {
    ServerConfig {
        http_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        ..test_config()
    }
}

fn http_addr(server: &RunningServer) -> SocketAddr {
    server.http_addr().expect("the HTTP API listens")
}

fn error_of(r: &HttpResponse) -> Value {
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v["error"].clone()
}

/// Tokens (text, logprob) of a gRPC stream asked for logprobs.
fn grpc_tokens(c: &Collected) -> Vec<(String, f32)> {
    c.tokens
        .iter()
        .map(|t| {
            let lp = t.logprobs.as_ref().unwrap().chosen.as_ref().unwrap();
            (lp.text.clone(), lp.logprob)
        })
        .collect()
}

fn chat_messages() -> Vec<pb::ChatMessage> {
    vec![
        pb::ChatMessage {
            role: "system".into(),
            content: "Be brief.".into(),
            ..Default::default()
        },
        pb::ChatMessage {
            role: "user".into(),
            content: "Name a colour.".into(),
            ..Default::default()
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_answers_as_the_grpc_stream_does_token_for_token() {
    let server = start_demo(http_config()).await;
    let addr = http_addr(&server);
    let mut c = client(server.addr()).await;

    // Completions: the text and each token with its logprob, as gRPC streams them.
    let mut req = greedy("Once upon a time", 16);
    req.logprobs = 1;
    let g = run(&mut c, req).await;
    assert_eq!(g.code(), tonic::Code::Ok);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
                      "ignore_eos": true, "logprobs": 0});
    let h = http::post_async(addr, "/v1/completions", body).await;
    assert_eq!(h.status, 200, "{}", h.text());
    let v = h.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], g.text(), "{v}");
    assert_eq!(choice["finish_reason"], "length");
    let lp = &choice["logprobs"];
    let http_tokens: Vec<(String, f32)> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["token_logprobs"].as_array().unwrap())
        .map(|(t, l)| (t.as_str().unwrap().to_string(), l.as_f64().unwrap() as f32))
        .collect();
    assert_eq!(http_tokens, grpc_tokens(&g));
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["object"], "text_completion");

    // Chat, streamed: each chunk's token and logprob as gRPC's, the text whole.
    let mut req = greedy("", 12);
    req.prompt.clear();
    req.messages = chat_messages();
    req.logprobs = 1;
    let g = run(&mut c, req).await;
    assert_eq!(g.code(), tonic::Code::Ok);
    let body = json!({
        "model": "",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}],
        "max_completion_tokens": 12, "temperature": 0, "ignore_eos": true,
        "logprobs": true, "stream": true, "stream_options": {"include_usage": true},
    });
    let h = http::post_async(addr, "/v1/chat/completions", body.clone()).await;
    assert_eq!(h.status, 200, "{}", h.text());
    assert!(h
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = h.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut streamed = Vec::new();
    for ch in &chunks {
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert_eq!(ch["id"], chunks[0]["id"]);
        if let Some(c) = ch["choices"].get(0) {
            text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
            for t in c["logprobs"]["content"].as_array().into_iter().flatten() {
                streamed.push((
                    t["token"].as_str().unwrap().to_string(),
                    t["logprob"].as_f64().unwrap() as f32,
                ));
            }
        }
    }
    assert_eq!(text, g.text());
    assert_eq!(streamed, grpc_tokens(&g));
    let finals: Vec<&Value> = chunks
        .iter()
        .filter(|c| {
            c["choices"]
                .get(0)
                .is_some_and(|c| !c["finish_reason"].is_null())
        })
        .collect();
    assert_eq!(finals.len(), 1);
    assert_eq!(finals[0]["choices"][0]["finish_reason"], "length");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(
        usage["prompt_tokens"].as_u64().unwrap(),
        g.done
            .as_ref()
            .unwrap()
            .usage
            .as_ref()
            .unwrap()
            .prompt_tokens as u64
    );
    // The same conversation again: its prompt comes from the prefix cache.
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // Not streamed: the same text.
    let mut whole = body;
    whole["stream"] = json!(false);
    let h = http::post_async(addr, "/v1/chat/completions", whole).await;
    let v = h.json();
    assert_eq!(v["choices"][0]["message"]["content"], g.text(), "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["object"], "chat.completion");
    assert!(h.header("x-request-id").is_some());

    // The Responses API: instructions and an input item are the same conversation; the
    // message's text and logprobs are the gRPC stream's, whole and streamed.
    let body = json!({
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}],
        "max_output_tokens": 12, "temperature": 0, "ignore_eos": true,
        "include": ["message.output_text.logprobs"],
    });
    let v = http::post_async(addr, "/v1/responses", body.clone())
        .await
        .json();
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    let part = &v["output"][0]["content"][0];
    assert_eq!(part["text"], g.text(), "{v}");
    let token_logprobs = |list: &Value| -> Vec<(String, f32)> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["token"].as_str().unwrap().to_string(),
                    t["logprob"].as_f64().unwrap() as f32,
                )
            })
            .collect()
    };
    assert_eq!(token_logprobs(&part["logprobs"]), grpc_tokens(&g));
    assert_eq!(v["usage"]["output_tokens"], 12);
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let h = http::post_async(addr, "/v1/responses", streamed).await;
    assert_eq!(h.status, 200, "{}", h.text());
    // Each event is named for its type, and the stream ends with the last one, no [DONE].
    let text = h.text();
    let events: Vec<Value> = h
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
        let kind = e["type"].as_str().unwrap();
        assert!(text.contains(&format!("event: {kind}\n")), "{kind}");
    }
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    let without_ids = |output: &Value| -> Vec<Value> {
        let mut items = output.as_array().unwrap().clone();
        for item in &mut items {
            item.as_object_mut().unwrap().remove("id");
        }
        items
    };
    assert_eq!(
        without_ids(&last["response"]["output"]),
        without_ids(&v["output"])
    );
    let deltas: Vec<(String, f32)> = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .flat_map(|e| token_logprobs(&e["logprobs"]))
        .collect();
    assert_eq!(deltas, grpc_tokens(&g));

    // n choices are one batch: choice i is the n = 1 reply with seed + i.
    let sampled = |n: u32, seed: u64| {
        json!({"prompt": "Seeds", "max_tokens": 10, "temperature": 1.5, "top_k": 0,
               "top_p": 1.0, "min_p": 0.0, "ignore_eos": true, "n": n, "seed": seed})
    };
    let before = server.metrics().batch_size.count() - server.metrics().batch_size.count_le(2);
    let three = http::post_async(addr, "/v1/completions", sampled(3, 40))
        .await
        .json();
    let after = server.metrics().batch_size.count() - server.metrics().batch_size.count_le(2);
    assert!(after > before, "the three choices never ran in one step");
    let texts: Vec<&str> = (0..3)
        .map(|i| three["choices"][i]["text"].as_str().unwrap())
        .collect();
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(three["choices"][i]["index"], i);
        let one = http::post_async(addr, "/v1/completions", sampled(1, 40 + i as u64))
            .await
            .json();
        assert_eq!(one["choices"][0]["text"], *t, "choice {i}");
    }
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    assert_eq!(three["usage"]["completion_tokens"], 30);
    // Token-id prompts are taken as given, and each list is a prompt of its own.
    let ids = http::post_async(addr, "/tokenize", json!({"content": "Seeds"}))
        .await
        .json();
    let body = json!({"prompt": [ids["tokens"].clone(), ids["tokens"].clone()], "max_tokens": 10,
                      "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                      "ignore_eos": true, "seed": 40});
    let two = http::post_async(addr, "/v1/completions", body).await.json();
    assert_eq!(two["choices"][0]["text"], texts[0], "{two}");
    assert_eq!(two["choices"][1]["text"], texts[1], "{two}");
    server.shutdown().await.unwrap();
}

/// Polls the metrics until `cond` holds (a hang guard after two minutes).
async fn metrics_until(server: &RunningServer, what: &str, cond: impl Fn(&str) -> bool) {
    for _ in 0..1200 {
        if cond(&server.metrics_text()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} never happened:\n{}", server.metrics_text());
}

/// Opens a stream on `path`, reads until `marker` (a token's event), and leaves: the
/// generation must stop within 1,000 tokens, be counted as the `cancelled`th cancelled HTTP
/// generation, and free its sequence, KV and queue place.
async fn leave_stream(
    server: &RunningServer,
    path: &'static str,
    body: Value,
    marker: &'static str,
    cancelled: u64,
) {
    let addr = http_addr(server);
    let tokens_before = server.metrics().tokens_total();
    let (s, _) = tokio::task::spawn_blocking(move || http::open_stream(addr, path, &body, marker))
        .await
        .unwrap();
    drop(s);
    metrics_until(
        server,
        &format!("{path}'s cancelled stream's cleanup"),
        |m| {
            metric(m, "inferno_running_streams") == 0.0
                && metric(m, "inferno_kv_cache_reserved_tokens") == 0.0
                && metric(m, "inferno_queue_depth") == 0.0
        },
    )
    .await;
    let m = server.metrics();
    assert_eq!(
        m.requests_by(Some(Protocol::Http), "Generate", "CANCELLED"),
        cancelled,
        "{path}"
    );
    let generated = m.tokens_total() - tokens_before;
    assert!(
        (1..1000).contains(&generated),
        "{path}: {generated} tokens after the client left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_statuses_and_the_server_stays_up() {
    let mut cfg = http_config();
    cfg.max_message_bytes = 64 * 1024;
    cfg.handshake_timeout = Duration::from_millis(800);
    cfg.max_connections = 4;
    let server = start_demo(cfg).await;
    let addr = http_addr(&server);
    let chat = "/v1/chat/completions";

    let r = tokio::task::spawn_blocking(move || {
        // Malformed JSON: 400 without a field.
        let r = http::request(addr, "POST", chat, &[], b"{\"messages\": [");
        assert_eq!(r.status, 400);
        let e = error_of(&r);
        assert!(
            e["message"].as_str().unwrap().contains("not valid JSON"),
            "{e}"
        );
        assert_eq!(e["param"], Value::Null);
        assert_eq!(e["type"], "invalid_request_error");
        // Wrong types and values out of range: 400 naming the field.
        for (body, param) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (json!({"messages": "x"}), "messages"),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "top_p": 2}),
                "top_p",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "n": 0}),
                "n",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
                "top_logprobs",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 30}),
                "top_logprobs",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "maybe"}),
                "tool_choice",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "stop": [""]}),
                "stop",
            ),
            (
                json!({"messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0].type",
            ),
            (json!({"messages": []}), "messages"),
            (json!({}), "messages"),
        ] {
            let r = http::post(addr, chat, &body);
            assert_eq!(r.status, 400, "{body}: {}", r.text());
            assert_eq!(error_of(&r)["param"], param, "{body}");
        }
        // Numbers are read as written (correctly rounded): the error echoes them so, and
        // one step above 1 is out of range for top_p.
        for (number, param, echo) in [
            (
                r#""temperature": -1e-50"#,
                "temperature",
                "invalid temperature -1e-50:",
            ),
            (
                r#""top_p": 1.0000000000000002"#,
                "top_p",
                "invalid top_p 1.0000000000000002:",
            ),
        ] {
            let body = format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], {number}}}"#);
            let r = http::request(addr, "POST", chat, &[], body.as_bytes());
            assert_eq!(r.status, 400, "{body}: {}", r.text());
            let e = error_of(&r);
            assert_eq!(e["param"], param, "{body}");
            assert!(e["message"].as_str().unwrap().starts_with(echo), "{e}");
        }
        let r = http::post(
            addr,
            "/v1/completions",
            &json!({"prompt": "x", "echo": true, "logprobs": 1}),
        );
        assert_eq!(r.status, 400);
        assert_eq!(error_of(&r)["param"], "echo");
        // Unknown fields are ignored.
        let r = http::post(
            addr,
            chat,
            &json!({"messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2, "frobnicate": {"a": [1]}, "user": "u1", "store": false}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        // A model the server does not serve.
        let r = http::post(
            addr,
            chat,
            &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(r.status, 404);
        assert_eq!(error_of(&r)["code"], "model_not_found");
        assert_eq!(http::get(addr, "/v1/models/gpt-4o").status, 404);
        assert_eq!(http::get(addr, "/nowhere").status, 404);
        assert_eq!(
            http::request(addr, "DELETE", "/v1/models", &[], b"").status,
            405
        );

        // Huge bodies: declared, and sent without a length.
        let big = vec![b'x'; 100 * 1024];
        let r = http::request(addr, "POST", chat, &[], &big);
        assert_eq!(r.status, 413, "{}", r.text());
        assert!(error_of(&r)["message"]
            .as_str()
            .unwrap()
            .contains("--max-message-bytes"));
        let mut s = http::connect(addr);
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        for _ in 0..20 {
            if s.write_all(format!("{:x}\r\n", 8192).as_bytes()).is_err()
                || s.write_all(&[b' '; 8192]).is_err()
                || s.write_all(b"\r\n").is_err()
            {
                break;
            }
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert_eq!(http::parse_response(&out).status, 413);
        // A body that stops halfway: 408 once the handshake timeout passes.
        let mut s = http::connect(addr);
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"messages\"").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert_eq!(http::parse_response(&out).status, 408);
        // Headers that never end: the connection is closed.
        let mut s = http::connect(addr);
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(!String::from_utf8_lossy(&out).contains(" 200 "));
        // More idle keep-alive connections than the cap: the newest client is still served.
        let idle: Vec<std::net::TcpStream> = (0..6)
            .map(|_| {
                let mut s = http::connect(addr);
                s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).unwrap();
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
                s
            })
            .collect();
        let r = http::get(addr, "/v1/models");
        assert_eq!(r.status, 200);
        drop(idle);
    });
    r.await.unwrap();

    // A client that leaves after the first chunk: its generation stops, its KV is freed.
    // A token's chunk, not the opening one: that carries the role with an empty content and
    // goes out before the first token, so leaving on it could cancel the request while it
    // still waits for its prefill.
    let body = json!({"messages": [{"role": "user", "content": "go on"}], "max_tokens": 3000,
                      "ignore_eos": true, "temperature": 0, "stream": true});
    leave_stream(
        &server,
        "/v1/chat/completions",
        body,
        "\"delta\":{\"content\":\"",
        1,
    )
    .await;
    let text = server.metrics_text();
    for gauge in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{gauge}{{model_name=")))
            .unwrap_or_else(|| panic!("{gauge} missing:\n{text}"));
        assert!(line.ends_with("} 0"), "{line}");
    }

    // The same for a Responses API stream.
    let body = json!({"input": "go on", "max_output_tokens": 3000, "ignore_eos": true,
                      "temperature": 0, "stream": true});
    leave_stream(
        &server,
        "/v1/responses",
        body,
        "event: response.output_text.delta",
        2,
    )
    .await;

    // Still serving.
    let h = http::get_async(addr, "/health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json(), json!({"status": "ok"}));
    let r = http::post_async(
        addr,
        chat,
        json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_and_tls_guard_the_api_but_not_the_probes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/service_support/tls");
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let mut cfg = http_config();
    cfg.auth_token = Some("s3cret".into());
    cfg.tls = Some(inferno::server::TlsPem {
        cert: read("server.pem"),
        key: read("server.key"),
    });
    let server = start_demo(cfg).await;
    let addr = http_addr(&server);

    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&read("ca.pem")) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let send = |req: Vec<u8>| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(&req).await.unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            http::parse_response(&out)
        }
    };
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}).to_string();
    let chat = |auth: Option<&str>| {
        let mut h = vec![("Content-Type", "application/json")];
        if let Some(a) = auth {
            h.push(("Authorization", a));
        }
        http::request_bytes("POST", "/v1/chat/completions", &h, body.as_bytes())
    };
    let r = send(chat(None)).await;
    assert_eq!(r.status, 401);
    assert_eq!(error_of(&r)["code"], "invalid_api_key");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert!(error_of(&r)["message"]
        .as_str()
        .unwrap()
        .contains("Authorization: Bearer"));
    let r = send(chat(Some("Bearer nope"))).await;
    assert_eq!(r.status, 401);
    let r = send(chat(Some("Bearer s3cret"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(http::request_bytes("GET", "/v1/models", &[], b"")).await;
    assert_eq!(r.status, 401);
    // Probes and metrics need no token.
    let r = send(http::request_bytes("GET", "/health", &[], b"")).await;
    assert_eq!(r.status, 200);
    let r = send(http::request_bytes("GET", "/metrics", &[], b"")).await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains("inferno_auth_failures_total 3\n"),
        "{}",
        r.text()
    );
    // Plaintext gets no answer.
    let plain = tokio::task::spawn_blocking(move || {
        let mut s = http::connect(addr);
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    })
    .await
    .unwrap();
    assert!(!String::from_utf8_lossy(&plain).contains("200 OK"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_429_with_retry_after_and_a_loading_model_503() {
    let mut cfg = http_config();
    cfg.engine.queue_capacity = 1;
    cfg.engine.max_seqs = 1;
    let server = start_demo(cfg).await;
    let addr = http_addr(&server);
    let long = json!({"prompt": "hold", "max_tokens": 3000, "ignore_eos": true, "stream": true});
    let (running, queued) = tokio::task::spawn_blocking(move || {
        let running = http::open_stream(addr, "/v1/completions", &long, "\"text\":\"");
        // Its answer begins only once it runs; being queued is enough here.
        let mut s = http::connect(addr);
        s.write_all(&http::request_bytes(
            "POST",
            "/v1/completions",
            &[],
            long.to_string().as_bytes(),
        ))
        .unwrap();
        (running, s)
    })
    .await
    .unwrap();
    metrics_until(&server, "a queued request", |m| {
        metric(m, "inferno_queue_depth") == 1.0
    })
    .await;
    let r = http::post_async(
        addr,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(error_of(&r)["type"], "rate_limit_error");
    // More choices than the queue holds can never be served.
    let r = http::post_async(addr, "/v1/completions", json!({"prompt": "x", "n": 2})).await;
    assert_eq!(r.status, 400);
    assert_eq!(error_of(&r)["param"], "n");
    drop(running);
    drop(queued);
    metrics_until(&server, "the queue and the batch emptied", |m| {
        metric(m, "inferno_queue_depth") == 0.0 && metric(m, "inferno_running_streams") == 0.0
    })
    .await;
    assert!(
        server
            .metrics()
            .requests_by(Some(Protocol::Http), "Generate", "RESOURCE_EXHAUSTED")
            >= 1
    );
    server.shutdown().await.unwrap();

    // While the model loads: 503 for requests and for the probe.
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let loader = move || {
        release_rx.recv().map_err(|e| e.to_string())?;
        demo_loader()()
    };
    let server = start(http_config(), loader).await.unwrap();
    let addr = http_addr(&server);
    let r = http::post_async(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(r.status, 503);
    assert!(error_of(&r)["message"]
        .as_str()
        .unwrap()
        .contains("loading"));
    assert_eq!(http::get_async(addr, "/health").await.status, 503);
    assert_eq!(http::get_async(addr, "/healthz").await.status, 503);
    release_tx.send(()).unwrap();
    wait_ready(&server).await;
    assert_eq!(http::get_async(addr, "/health").await.status, 200);
    let models = http::get_async(addr, "/v1/models").await.json();
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["data"][0]["object"], "model");
    assert!(models["data"][0]["max_model_len"].as_u64().unwrap() > 0);
    let one = http::get_async(addr, &format!("/v1/models/{id}"))
        .await
        .json();
    assert_eq!(one["id"], id.as_str());
    // The gateway's gauges name the model.
    let text = http::get_async(addr, "/metrics").await.text();
    assert!(
        text.contains(&format!(
            "vllm:num_requests_waiting{{model_name=\"{id}\"}} 0\n"
        )),
        "{text}"
    );
    server.shutdown().await.unwrap();
}
