//! Constrained generation (`GenerateRequest.response_format`) through the gRPC service.
//!
//! On the built-in demo model (random weights, so any text is as likely as any other) the
//! output must still match the regex it was given, and formats that cannot compile are
//! refused with INVALID_ARGUMENT before they queue.
//!
//! On the real checkpoint (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, found as tests/real_model.rs
//! finds it), for each of the JSON schemas in `tests/fixtures/structured/schemas.json`, the
//! greedy and the sampled outputs must validate under an independent validator (the
//! `jsonschema` crate, formats included); regex outputs must match under the `regex` crate;
//! Lark grammars' outputs must parse (as JSON, or under an equivalent regex). The same
//! prompts without the constraint must fail validation at least once, which shows the
//! constraint is what makes the difference. Constrained and unconstrained requests run
//! side by side, so they share the engine's batches.

mod service_support;

use inferno::engine::loader::{assets_from_gguf, LoadOptions};
use inferno::engine::EngineConfig;
use inferno::gguf::GgufFile;
use inferno::server::pb::{self, response_format::Format, FinishReason};
use inferno::server::{start, ServerConfig};
use serde_json::Value;
use service_support::*;
use tonic::Code;

fn format(f: Format) -> Option<pb::ResponseFormat> {
    Some(pb::ResponseFormat { format: Some(f) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_model_follows_a_regex_and_bad_formats_are_refused() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let rx = "(yes|no), [0-9]{2,4} (apples|pears)";
    let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    for seed in 0..4 {
        let mut req = greedy("Answer:", 64);
        // Sampling at a high temperature: random weights give every allowed token a chance.
        req.sampling = Some(pb::SamplingParams {
            temperature: Some(1.5),
            seed: Some(seed),
            top_k: Some(0),
            ..Default::default()
        });
        req.ignore_eos = false;
        req.response_format = format(Format::Regex(rx.into()));
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert!(
            full.is_match(&r.text()),
            "{:?} does not match {rx}",
            r.text()
        );
        assert_eq!(r.finish_reason(), Some(FinishReason::Eos));
    }
    // An unconstrained request alongside: the service still serves free text.
    let r = run(&mut c, greedy("Answer:", 8)).await;
    assert_eq!(r.code(), Code::Ok);
    assert_eq!(r.tokens.len(), 8);

    for (f, says) in [
        (Format::Regex("(unclosed".into()), "regex"),
        (Format::JsonSchema("{\"type\": ".into()), "not valid JSON"),
        (Format::JsonSchema("[1, 2]".into()), "must be a JSON object"),
        (
            Format::JsonSchema(r#"{"type":"string","format":"no-such-format"}"#.into()),
            "no-such-format",
        ),
        (Format::Lark("start: undefined_rule".into()), "lark"),
    ] {
        let mut req = greedy("Answer:", 8);
        req.response_format = format(f.clone());
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::InvalidArgument, "{f:?}");
        let msg = r.status.unwrap().message().to_string();
        assert!(msg.contains(says), "{f:?}: {msg}");
        assert!(r.tokens.is_empty() && r.done.is_none());
    }
    let mut req = greedy("Answer:", 8);
    req.response_format = Some(pb::ResponseFormat { format: None });
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::InvalidArgument);

    let text = server.metrics_text();
    assert_eq!(metric(&text, "inferno_constrained_requests_total"), 4.0);
    assert!(
        metric(&text, "inferno_grammar_mask_seconds_count") >= 4.0 * 5.0,
        "a mask per sampled token:\n{text}"
    );
    // Each mask, computed ahead or not, was waited for once.
    assert_eq!(
        metric(&text, "inferno_grammar_mask_wait_seconds_count"),
        metric(&text, "inferno_grammar_mask_seconds_count")
    );
}

/// A chat request for `task`, greedy or sampled, with at most `max_tokens` tokens.
fn chat(task: &str, max_tokens: u32, seed: Option<u64>) -> pb::GenerateRequest {
    pb::GenerateRequest {
        messages: vec![
            pb::ChatMessage {
                role: "system".into(),
                content: "You are a helpful assistant. Answer with JSON only.".into(),
                ..Default::default()
            },
            pb::ChatMessage {
                role: "user".into(),
                content: task.into(),
                ..Default::default()
            },
        ],
        max_tokens: Some(max_tokens),
        sampling: Some(pb::SamplingParams {
            temperature: Some(if seed.is_some() { 0.8 } else { 0.0 }),
            seed,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs every request at once (so they share batches), returning the results in order.
async fn run_all(
    addr: std::net::SocketAddr,
    reqs: Vec<pb::GenerateRequest>,
) -> Vec<service_support::Collected> {
    let c = client(addr).await;
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|req| {
            let mut c = c.clone();
            tokio::spawn(async move { run(&mut c, req).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Whether `text` is one JSON value valid under `schema` (formats checked); the reason if
/// not.
fn validate(schema: &Value, text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("the fixture schema is valid");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_model_outputs_validate_under_their_schemas_regexes_and_grammars() {
    let Some(path) = real_model_or_skip() else {
        return;
    };
    let config = ServerConfig {
        engine: EngineConfig {
            queue_capacity: 128,
            max_seqs: 16,
            ..EngineConfig::default()
        },
        ..test_config()
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
    let server = start(config, loader).await.expect("server starts");
    wait_ready(&server).await;
    let fixtures: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/structured/schemas.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(fixtures.len() >= 30);

    // Greedy and sampled with the schema, and greedy without it, all at once.
    let mut reqs = Vec::new();
    for (i, f) in fixtures.iter().enumerate() {
        let task = f["task"].as_str().unwrap();
        let schema = serde_json::to_string(&f["schema"]).unwrap();
        for seed in [None, Some(i as u64)] {
            let mut r = chat(task, 200, seed);
            r.response_format = format(Format::JsonSchema(schema.clone()));
            reqs.push(r);
        }
        reqs.push(chat(task, 96, None));
    }
    let results = run_all(server.addr(), reqs).await;
    let mut unconstrained_failures = Vec::new();
    for (f, r) in fixtures.iter().zip(results.chunks(3)) {
        let name = f["name"].as_str().unwrap();
        for (r, how) in r[..2].iter().zip(["greedy", "sampled"]) {
            assert_eq!(r.code(), Code::Ok, "{name} {how}: {:?}", r.status);
            let text = r.text();
            assert_eq!(
                r.finish_reason(),
                Some(FinishReason::Eos),
                "{name} {how}: the grammar ends the output: {text}"
            );
            if let Err(e) = validate(&f["schema"], &text) {
                panic!("{name} {how}: {text}\n  is invalid: {e}");
            }
        }
        let free = &r[2];
        assert_eq!(free.code(), Code::Ok);
        if let Err(e) = validate(&f["schema"], free.text().trim()) {
            unconstrained_failures.push(format!("{name}: {e}"));
        }
    }
    eprintln!(
        "unconstrained: {} of {} fail validation, e.g. {:?}",
        unconstrained_failures.len(),
        fixtures.len(),
        unconstrained_failures.first()
    );
    assert!(
        !unconstrained_failures.is_empty(),
        "without the constraint every output validated, so these prompts show nothing"
    );

    // Regexes, and Lark grammars checked by an independent parser or an equivalent regex.
    let regexes = [
        ("Give today's date.", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        ("Give a US phone number.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
        ("Is the sky blue? Answer yes or no.", r"(yes|no)"),
        ("Give a hex colour for red.", r"#[0-9a-fA-F]{6}"),
        (
            "Give an IPv4 address of a home router.",
            r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
        ),
        ("Name a primary colour in lower case.", r"[a-z]{3,10}"),
    ];
    let lark_list = "start: \"[\" num (\", \" num)* \"]\"\nnum: /-?[1-9][0-9]{0,3}/ | \"0\"";
    let lark_sql =
        "start: \"SELECT \" cols \" FROM \" ident (\" WHERE \" ident \" = \" /[0-9]{1,4}/)?\n\
                    cols: ident (\", \" ident)*\n\
                    ident: /[a-z_]{1,12}/";
    let sql = regex::Regex::new(
        r"^SELECT [a-z_]{1,12}(, [a-z_]{1,12})* FROM [a-z_]{1,12}( WHERE [a-z_]{1,12} = [0-9]{1,4})?$",
    )
    .unwrap();
    let mut reqs = Vec::new();
    for (task, rx) in regexes {
        for seed in [None, Some(7)] {
            let mut r = chat(task, 40, seed);
            r.response_format = format(Format::Regex(rx.into()));
            reqs.push(r);
        }
    }
    for seed in [None, Some(3)] {
        let mut r = chat("List the first five prime numbers.", 60, seed);
        r.response_format = format(Format::Lark(lark_list.into()));
        reqs.push(r);
        let mut r = chat(
            "Write an SQL query for the names of users with id 5.",
            60,
            seed,
        );
        r.response_format = format(Format::Lark(lark_sql.into()));
        reqs.push(r);
    }
    let results = run_all(server.addr(), reqs).await;
    let (rx_results, lark_results) = results.split_at(regexes.len() * 2);
    for ((_, rx), r) in regexes.iter().flat_map(|p| [p, p]).zip(rx_results) {
        assert_eq!(r.code(), Code::Ok, "{rx}: {:?}", r.status);
        let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
        assert!(
            full.is_match(&r.text()),
            "{:?} does not match {rx}",
            r.text()
        );
        assert_eq!(r.finish_reason(), Some(FinishReason::Eos), "{rx}");
    }
    for pair in lark_results.chunks(2) {
        let (list, query) = (&pair[0], &pair[1]);
        assert_eq!(list.code(), Code::Ok);
        let nums: Vec<i64> = serde_json::from_str(&list.text())
            .unwrap_or_else(|e| panic!("{:?} is no JSON list: {e}", list.text()));
        assert!(!nums.is_empty());
        assert_eq!(query.code(), Code::Ok);
        assert!(sql.is_match(&query.text()), "{:?}", query.text());
    }

    // A required tool call through the model's own template (which shows it the tools),
    // then the answer to the call's result.
    let mut c = client(server.addr()).await;
    let question = user("What is the weather in Paris, in celsius?");
    let mut req = chat("", 80, None);
    req.messages = vec![question.clone()];
    req.tools = weather_tools();
    req.tool_choice = Some(pb::ToolChoice {
        choice: Some(pb::tool_choice::Choice::Mode(
            pb::tool_choice::Mode::Required as i32,
        )),
    });
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    assert_eq!(
        r.finish_reason(),
        Some(FinishReason::ToolCalls),
        "{}",
        r.text()
    );
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.done.as_ref().unwrap().tool_calls, r.tool_calls);
    let call = &r.tool_calls[0];
    let tool = weather_tools()
        .into_iter()
        .find(|t| t.name == call.name)
        .unwrap();
    validate(
        &serde_json::from_str(&tool.parameters).unwrap(),
        &call.arguments,
    )
    .unwrap();
    eprintln!("required call: {}({})", call.name, call.arguments);
    let mut req = chat("", 40, None);
    req.tools = weather_tools();
    req.messages = vec![
        question,
        pb::ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![call.clone()],
            ..Default::default()
        },
        pb::ChatMessage {
            role: "tool".into(),
            content: r#"{"temperature": 21, "sky": "clear"}"#.into(),
            tool_call_id: call.id.clone(),
            ..Default::default()
        },
    ];
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    assert!(!r.text().is_empty() || !r.tool_calls.is_empty());
    eprintln!("after the result: {:?} {:?}", r.text(), r.tool_calls);

    let text = server.metrics_text();
    let constrained = (fixtures.len() * 2 + regexes.len() * 2 + 4 + 1) as f64;
    assert_eq!(
        metric(&text, "inferno_constrained_requests_total"),
        constrained
    );
    server.shutdown().await.unwrap();
}

fn weather_tools() -> Vec<pb::Tool> {
    vec![
        pb::Tool {
            name: "get_weather".into(),
            description: "The weather in a city now.".into(),
            parameters: r#"{"type": "object", "properties": {"city": {"type": "string",
                "minLength": 1, "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"], "additionalProperties": false}"#
                .into(),
        },
        pb::Tool {
            name: "get_time".into(),
            description: "The local time in a time zone.".into(),
            parameters: r#"{"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"], "additionalProperties": false}"#
                .into(),
        },
    ]
}

fn user(content: &str) -> pb::ChatMessage {
    pb::ChatMessage {
        role: "user".into(),
        content: content.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_tool_call_streams_as_a_call_and_the_conversation_round_trips() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let tools = weather_tools();
    for (choice, names) in [
        (
            pb::tool_choice::Choice::Mode(pb::tool_choice::Mode::Required as i32),
            &["get_weather", "get_time"][..],
        ),
        (
            pb::tool_choice::Choice::Function("get_time".into()),
            &["get_time"][..],
        ),
    ] {
        for seed in 0..3 {
            let mut req = greedy("", 120);
            req.prompt.clear();
            req.ignore_eos = false;
            req.messages = vec![user("What is the weather in Paris?")];
            req.sampling = Some(pb::SamplingParams {
                temperature: Some(1.0),
                seed: Some(seed),
                ..Default::default()
            });
            req.tools = tools.clone();
            req.tool_choice = Some(pb::ToolChoice {
                choice: Some(choice.clone()),
            });
            let mut stream = c.generate(req).await.unwrap().into_inner();
            let (mut streamed, mut text, mut done) = (Vec::new(), String::new(), None);
            while let Some(m) = stream.message().await.unwrap() {
                match m.event.unwrap() {
                    pb::generate_response::Event::Token(t) => text.push_str(&t.text),
                    pb::generate_response::Event::ToolCall(call) => streamed.push(call),
                    pb::generate_response::Event::Done(d) => done = Some(d),
                }
            }
            let done = done.expect("a final message");
            text.push_str(&done.text);
            assert_eq!(
                done.finish_reason,
                FinishReason::ToolCalls as i32,
                "{text:?} {streamed:?}"
            );
            assert_eq!(streamed.len(), 1, "one call, streamed: {text:?}");
            assert_eq!(done.tool_calls, streamed);
            // The call's text is not sent as text; the grammar allowed nothing else.
            assert_eq!(text.trim(), "", "text outside the call");
            let call = &streamed[0];
            assert!(names.contains(&call.name.as_str()), "{call:?}");
            assert!(call.id.starts_with("call_"));
            let tool = tools.iter().find(|t| t.name == call.name).unwrap();
            let schema: Value = serde_json::from_str(&tool.parameters).unwrap();
            validate(&schema, &call.arguments)
                .unwrap_or_else(|e| panic!("{call:?} breaks its schema: {e}"));

            // The second turn: the call and its result go back to the model.
            let mut req = greedy("", 4);
            req.prompt.clear();
            req.tools = tools.clone();
            req.messages = vec![
                user("What is the weather in Paris?"),
                pb::ChatMessage {
                    role: "assistant".into(),
                    tool_calls: vec![call.clone()],
                    ..Default::default()
                },
                pb::ChatMessage {
                    role: "tool".into(),
                    content: r#"{"temperature": 21}"#.into(),
                    tool_call_id: call.id.clone(),
                    ..Default::default()
                },
            ];
            let r = run(&mut c, req).await;
            assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
            assert_eq!(r.tokens.len(), 4);
        }
    }

    // What cannot work is refused up front.
    let base = || {
        let mut req = greedy("", 8);
        req.prompt.clear();
        req.messages = vec![user("hi")];
        req.tools = weather_tools();
        req
    };
    let named = |n: &str| {
        Some(pb::ToolChoice {
            choice: Some(pb::tool_choice::Choice::Function(n.into())),
        })
    };
    let mut cases = Vec::new();
    let mut r = base();
    r.tool_choice = named("no_such_tool");
    cases.push((r, "no_such_tool"));
    let mut r = base();
    r.tools[0].parameters = "{oops".into();
    cases.push((r, "tools[0].parameters"));
    let mut r = base();
    r.tools[1].name = "bad name".into();
    cases.push((r, "tools[1].name"));
    let mut r = base();
    r.tool_choice = named("get_time");
    r.response_format = format(Format::JsonObject(Default::default()));
    cases.push((r, "response_format"));
    let mut r = base();
    r.messages.push(pb::ChatMessage {
        role: "assistant".into(),
        tool_calls: vec![pb::ToolCall {
            id: "x".into(),
            name: "get_time".into(),
            arguments: "[1]".into(),
        }],
        ..Default::default()
    });
    cases.push((r, "messages[1].tool_calls[0].arguments"));
    let mut r = greedy("a raw prompt", 8);
    r.tools = weather_tools();
    cases.push((r, "messages"));
    for (req, says) in cases {
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::InvalidArgument, "{says}");
        let msg = r.status.unwrap().message().to_string();
        assert!(msg.contains(says), "{says}: {msg}");
    }
}
