//! The Inference service end to end over a real socket: streamed tokens and finish reasons,
//! chat messages, logprobs, tokenizer calls, model info, every invalid argument, deadlines,
//! and an engine panic that fails one request while the service keeps serving.

mod service_support;

use inferno::engine::loader::{synthetic_assets, LoadOptions};
use inferno::engine::FAULT_PANIC_REQUEST_ID;
use inferno::engine::{generate, Flow, GenerateOptions};
use inferno::sampling::SamplingParams;
use inferno::server::pb::{self, FinishReason};
use service_support::*;
use std::time::Duration;
use tonic::Code;

/// The greedy completion of `prompt` computed in-process with the engine directly.
fn reference(prompt: &str, max_tokens: usize) -> (Vec<u32>, String) {
    reference_with(prompt, max_tokens, SamplingParams::greedy())
}

/// The completion of `prompt` with `sampling`, computed in-process with the engine directly
/// (end-of-generation ignored).
fn reference_with(prompt: &str, max_tokens: usize, sampling: SamplingParams) -> (Vec<u32>, String) {
    let a = synthetic_assets("demo", &LoadOptions::default()).unwrap();
    let mut ids: Vec<u32> = Vec::new();
    if a.tokenizer.add_bos() {
        ids.extend(a.tokenizer.bos_id());
    }
    ids.extend(a.tokenizer.encode(prompt, true).unwrap());
    let mut state = a.model.new_state(a.ctx_size, a.state_rows);
    let opts = GenerateOptions {
        max_tokens,
        sampling,
        stop: vec![],
        ignore_eos: true,
        time_limit: None,
        grammar: None,
        speculate: true,
        ..GenerateOptions::default()
    };
    let g = generate(&a.model, &a.tokenizer, &mut state, &ids, &opts, |_| {
        Flow::Continue
    })
    .unwrap();
    (g.tokens, g.text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_the_engines_tokens_in_order_with_finish_reasons() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let prompt = "Once upon a time";
    let (ref_ids, ref_text) = reference(prompt, 12);

    // LENGTH: exactly the in-process greedy completion, token by token.
    let mut req = greedy(prompt, 12);
    req.request_id = "req-length".into();
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    assert_eq!(r.ids(), ref_ids);
    assert_eq!(r.text(), ref_text);
    let idx: Vec<u32> = r.tokens.iter().map(|t| t.index).collect();
    assert_eq!(idx, (0..12).collect::<Vec<u32>>());
    assert_eq!(r.finish_reason(), Some(FinishReason::Length));
    let done = r.done.as_ref().unwrap();
    assert_eq!(done.request_id, "req-length");
    let usage = done.usage.unwrap();
    assert_eq!(usage.prompt_tokens, prompt.len() as u32); // byte-level vocabulary
    assert_eq!(usage.completion_tokens, 12);
    let t = done.timings.unwrap();
    assert!(t.time_to_first_token_ms > 0.0 && t.decode_tokens_per_second > 0.0);
    assert!(t.queue_wait_ms >= 0.0 && t.total_ms >= t.time_to_first_token_ms);

    // STOP_SEQUENCE: a stop string taken from the middle of the reference text.
    let chars: Vec<char> = ref_text.chars().collect();
    assert!(chars.len() >= 8, "reference text {ref_text:?}");
    let stop: String = chars[4..6].iter().collect();
    let cut = ref_text.find(&stop).unwrap();
    let mut req = greedy(prompt, 12);
    req.stop = vec![stop.clone()];
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok);
    assert_eq!(r.finish_reason(), Some(FinishReason::StopSequence));
    assert_eq!(r.text(), ref_text[..cut]);

    // TIME_LIMIT: a 1 ms limit ends a long generation early and successfully.
    let mut req = greedy(prompt, 2000);
    req.time_limit_ms = 1;
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok);
    assert_eq!(r.finish_reason(), Some(FinishReason::TimeLimit));
    assert!(r.tokens.len() < 2000);

    // Seeded sampling is reproducible and reports its seed.
    let mut req = greedy(prompt, 10);
    req.sampling = Some(pb::SamplingParams {
        temperature: Some(1.0),
        seed: Some(1234),
        ..Default::default()
    });
    let a = run(&mut c, req.clone()).await;
    let b = run(&mut c, req).await;
    assert_eq!(a.ids(), b.ids());
    assert_eq!(a.done.unwrap().seed, 1234);

    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_messages_logprobs_tokenizer_and_model_info() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;

    let info = c
        .get_model_info(pb::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.architecture, "qwen3");
    assert!(info.demo);
    assert!(info.note.contains("random weights"), "{}", info.note);
    assert_eq!(info.quantization, "Q8_0");
    // The service's default stack, on the threads it really runs (INFERNO_THREADS or the
    // physical cores).
    assert_eq!(info.backend, "pool");
    assert_eq!(
        info.threads as usize,
        inferno::backend::cpu::threadpool::default_threads()
    );
    assert_eq!(info.vocab_size, 261);
    assert_eq!(info.queue_capacity, 16);
    assert_eq!(info.max_batch, 8);
    assert_eq!(info.prefill_chunk, 256);
    // The default KV budget: max_seqs full contexts (the demo model's cache is small).
    assert_eq!(info.kv_cache_tokens, 8 * info.context_length);
    assert!(info.context_length >= 2 && info.context_length <= info.model_context_length);
    // The KV memory: F16 caches (a Q8_0 model's default), 4 layers x 2 KV heads x 64 x
    // (K + V) x 2 bytes per position, and the budget's bytes in those.
    assert_eq!(
        (info.kv_cache_type_k.as_str(), info.kv_cache_type_v.as_str()),
        ("f16", "f16")
    );
    assert_eq!(info.kv_bytes_per_token, 2048);
    assert_eq!(
        info.kv_cache_bytes,
        info.kv_cache_tokens as u64 * info.kv_bytes_per_token
    );

    let ids = c
        .tokenize(pb::TokenizeRequest {
            text: "<|im_start|>hé".into(),
            parse_special: None,
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(ids.len(), 1 + "hé".len(), "{ids:?}");
    let plain = c
        .tokenize(pb::TokenizeRequest {
            text: "<|im_start|>".into(),
            parse_special: Some(false),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(plain.len(), "<|im_start|>".len());
    let text = c
        .detokenize(pb::DetokenizeRequest {
            ids: ids.clone(),
            skip_special: false,
        })
        .await
        .unwrap()
        .into_inner()
        .text;
    assert_eq!(text, "<|im_start|>hé");
    let skipped = c
        .detokenize(pb::DetokenizeRequest {
            ids,
            skip_special: true,
        })
        .await
        .unwrap()
        .into_inner()
        .text;
    assert_eq!(skipped, "hé");
    let bad = c
        .detokenize(pb::DetokenizeRequest {
            ids: vec![100_000],
            skip_special: false,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);

    // Chat: the prompt is the rendered template (ChatML with thinking switched off).
    let mut req = greedy("", 4);
    req.messages = vec![
        pb::ChatMessage {
            role: "system".into(),
            content: "Be brief.".into(),
            ..Default::default()
        },
        pb::ChatMessage {
            role: "user".into(),
            content: "Hi".into(),
            ..Default::default()
        },
    ];
    req.enable_thinking = Some(false);
    req.logprobs = 3;
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                    <|im_start|>assistant\n";
    let expect_prompt = c
        .tokenize(pb::TokenizeRequest {
            text: rendered.into(),
            parse_special: None,
        })
        .await
        .unwrap()
        .into_inner()
        .ids
        .len() as u32;
    let prompt_tokens = r.done.as_ref().unwrap().usage.unwrap().prompt_tokens;
    // The template may add an empty think block when thinking is off.
    assert!(
        prompt_tokens >= expect_prompt,
        "{prompt_tokens} < {expect_prompt}"
    );
    for t in &r.tokens {
        let lp = t.logprobs.as_ref().expect("logprobs requested");
        assert_eq!(lp.top.len(), 3);
        let chosen = lp.chosen.as_ref().unwrap();
        assert_eq!(chosen.id, t.id);
        // Greedy with no penalty picks the most likely token.
        assert_eq!(lp.top[0].id, t.id);
        assert!(chosen.logprob <= 0.0);
        assert!(lp.top[0].logprob >= lp.top[1].logprob && lp.top[1].logprob >= lp.top[2].logprob);
    }

    server.shutdown().await.unwrap();
}

/// `logit_bias` over gRPC: a banned token never comes, a forced one always does (greedy and
/// sampled), and each stream is the engine's own completion with that bias.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_bans_and_forces_tokens_as_the_engine_does() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let prompt = "Once upon a time";
    let (plain, _) = reference(prompt, 16);
    let banned = plain[0];
    let forced = (plain[0] + 1) % 256;
    let cases = [
        (0.0, vec![(banned, -100.0)]),
        (1.3, vec![(banned, -100.0)]),
        (0.0, vec![(forced, 100.0)]),
        (1.3, vec![(forced, 100.0), (banned, -3.5)]),
    ];
    for (temperature, bias) in cases {
        let mut req = greedy(prompt, 16);
        req.sampling = Some(pb::SamplingParams {
            temperature: Some(temperature),
            seed: Some(5),
            logit_bias: bias.iter().copied().collect(),
            ..Default::default()
        });
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        let want = reference_with(
            prompt,
            16,
            SamplingParams {
                temperature,
                seed: Some(5),
                logit_bias: bias.clone(),
                ..SamplingParams::default()
            },
        );
        assert_eq!(r.ids(), want.0, "temperature {temperature}, bias {bias:?}");
        assert_eq!(r.text(), want.1);
        if bias[0].1 > 0.0 {
            assert_eq!(r.ids(), vec![forced; 16], "{bias:?}");
        } else {
            assert!(!r.ids().contains(&banned), "{bias:?}: {:?}", r.ids());
            assert_ne!(r.ids(), plain);
        }
    }
    server.shutdown().await.unwrap();
}

/// `min_tokens` holds end-of-generation (forced by a bias) back for that many tokens, and
/// `stop_token_ids` end the output like it, with their own finish reason; both checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_and_stop_token_ids_end_the_output_when_asked() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let im_end = c
        .tokenize(pb::TokenizeRequest {
            text: "<|im_end|>".into(),
            parse_special: Some(true),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(im_end.len(), 1);
    let (eos, x) = (im_end[0], u32::from(b'x'));
    let ask = |bias: &[(u32, f32)], min_tokens: u32, stop_token_ids: Vec<u32>| {
        let mut req = greedy("Once upon a time", 20);
        req.ignore_eos = false;
        req.sampling = Some(pb::SamplingParams {
            temperature: Some(0.0),
            logit_bias: bias.iter().copied().collect(),
            ..Default::default()
        });
        req.min_tokens = min_tokens;
        req.stop_token_ids = stop_token_ids;
        req
    };
    let cases = [
        (ask(&[(eos, 100.0)], 0, vec![]), 0, FinishReason::Eos),
        (ask(&[(eos, 100.0)], 5, vec![]), 5, FinishReason::Eos),
        (
            ask(&[(x, 100.0)], 0, vec![x]),
            0,
            FinishReason::StopSequence,
        ),
        (
            ask(&[(x, 100.0)], 3, vec![x]),
            3,
            FinishReason::StopSequence,
        ),
        // Held back too: end-of-generation next best after the stop token.
        (
            ask(&[(x, 100.0), (eos, 99.0)], 4, vec![x]),
            4,
            FinishReason::StopSequence,
        ),
    ];
    for (i, (req, n, finish)) in cases.into_iter().enumerate() {
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::Ok, "case {i}: {:?}", r.status);
        assert_eq!(r.finish_reason(), Some(finish), "case {i}: {:?}", r.ids());
        assert_eq!(r.tokens.len(), n, "case {i}: {:?}", r.ids());
        assert!(!r.ids().contains(&eos) && !r.ids().contains(&x), "case {i}");
        assert_eq!(r.done.unwrap().usage.unwrap().completion_tokens, n as u32);
    }
    for (req, want) in [
        (
            ask(&[], 21, vec![]),
            "min_tokens (21) exceeds max_tokens (20)",
        ),
        (
            ask(&[], 0, vec![1_000_000]),
            "stop_token_ids has token 1000000, outside the model's vocabulary",
        ),
        (
            ask(&[], 0, vec![x; 65]),
            "65 stop_token_ids given; at most 64",
        ),
    ] {
        let r = run(&mut c, req).await;
        let s = r.status.expect("refused");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains(want), "{s:?}");
    }
    server.shutdown().await.unwrap();
}

/// A reply of two tool calls (a regex writes it): both reported by default, the first
/// alone with `parallel_tool_calls` false.
/// vLLM's chat options over gRPC: a prefilled reply (`continue_final_message`) is continued
/// as the engine continues the prompt the model's template renders for it, and
/// `add_generation_prompt: false` leaves the assistant turn unopened; asking for both, a
/// template variable the server sets, a variable list that is no object and either option
/// on a raw prompt are refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefilled_reply_is_continued_and_chat_options_are_checked() {
    use inferno::tokenizer::{ChatEnding, ChatMessage, TemplateArgs};
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let template = synthetic_assets("demo", &LoadOptions::default())
        .unwrap()
        .chat_template;
    let conversation = [("user", "Hi"), ("assistant", "Hello th")];
    let messages: Vec<ChatMessage> = conversation
        .iter()
        .map(|(role, content)| ChatMessage::new(*role, *content))
        .collect();
    let chat = |ending: ChatEnding| {
        let mut req = greedy("", 8);
        req.messages = conversation
            .iter()
            .map(|(role, content)| pb::ChatMessage {
                role: (*role).into(),
                content: (*content).into(),
                ..Default::default()
            })
            .collect();
        req.continue_final_message = ending == ChatEnding::ContinueFinal;
        req.add_generation_prompt = (ending == ChatEnding::Closed).then_some(false);
        req.chat_template_kwargs = r#"{"unused": [1, {"b": 2}]}"#.into();
        req
    };
    for ending in [ChatEnding::ContinueFinal, ChatEnding::Closed] {
        let rendered = template
            .render_with(
                &messages,
                &TemplateArgs {
                    ending,
                    ..Default::default()
                },
            )
            .unwrap();
        if ending == ChatEnding::ContinueFinal {
            assert!(rendered.ends_with("assistant\nHello th"), "{rendered:?}");
        }
        let (want, text) = reference(&rendered, 8);
        let r = run(&mut c, chat(ending)).await;
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert_eq!(r.ids(), want, "{ending:?}");
        assert_eq!(r.text(), text, "{ending:?}");
    }

    type Change = Box<dyn Fn(&mut pb::GenerateRequest)>;
    let refusals: [(Change, &str); 5] = [
        (
            Box::new(|r| r.add_generation_prompt = Some(true)),
            "add_generation_prompt (a new assistant turn) cannot be true",
        ),
        (
            Box::new(|r| r.chat_template_kwargs = r#"{"tools": []}"#.into()),
            "chat_template_kwargs may not set \"tools\"",
        ),
        (
            Box::new(|r| r.chat_template_kwargs = "[1]".into()),
            "chat_template_kwargs must be a JSON object",
        ),
        (
            Box::new(|r| {
                r.messages.clear();
                r.prompt = "Hi".into();
            }),
            "continue_final_message applies to a chat request",
        ),
        (
            Box::new(|r| r.messages.last_mut().unwrap().content = String::new()),
            "",
        ),
    ];
    for (i, (change, message)) in refusals.iter().enumerate() {
        let mut req = chat(ChatEnding::ContinueFinal);
        change(&mut req);
        let r = run(&mut c, req).await;
        if message.is_empty() {
            // An empty prefill is allowed: it continues an empty reply.
            assert_eq!(r.code(), Code::Ok, "{i}: {:?}", r.status);
            continue;
        }
        assert_eq!(r.code(), Code::InvalidArgument, "{i}: {:?}", r.status);
        let got = r.status.as_ref().unwrap().message();
        assert!(got.contains(message), "{i}: {got}");
    }
    server.shutdown().await.unwrap();
}

/// A choice over gRPC: the output is exactly one of the options, whatever characters they
/// hold, with the end of generation; no options at all is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_choice_gives_exactly_one_of_its_options() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let options: Vec<String> = ["yes", "no", "maybe (a.k.a. 50/50)?", "[n/a]"]
        .map(String::from)
        .into();
    let choice = |options: Vec<String>| {
        let mut req = greedy("Answer:", 32);
        req.ignore_eos = false;
        req.response_format = Some(pb::ResponseFormat {
            format: Some(pb::response_format::Format::Choice(
                pb::response_format::Choice { options },
            )),
        });
        req
    };
    for seed in 0..4 {
        let mut req = choice(options.clone());
        req.sampling = Some(pb::SamplingParams {
            temperature: Some(1.5),
            seed: Some(seed),
            ..Default::default()
        });
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert!(options.contains(&r.text()), "{:?}", r.text());
        assert_eq!(r.finish_reason(), Some(FinishReason::Eos));
    }
    let r = run(&mut c, choice(Vec::new())).await;
    assert_eq!(r.code(), Code::InvalidArgument);
    assert!(
        r.status.as_ref().unwrap().message().contains("no options"),
        "{:?}",
        r.status
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_tool_calls_false_reports_the_first_call_alone() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let two = regex::escape(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n\
         <tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": 1}}\n</tool_call>",
    );
    for (parallel, want) in [(None, vec!["f", "g"]), (Some(false), vec!["f"])] {
        let mut req = greedy("", 300);
        req.ignore_eos = false;
        req.messages = vec![pb::ChatMessage {
            role: "user".into(),
            content: "Call f and g.".into(),
            ..Default::default()
        }];
        req.tools = ["f", "g"]
            .map(|name| pb::Tool {
                name: name.into(),
                ..Default::default()
            })
            .into();
        req.response_format = Some(pb::ResponseFormat {
            format: Some(pb::response_format::Format::Regex(two.clone())),
        });
        req.parallel_tool_calls = parallel;
        let r = run(&mut c, req).await;
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        let names: Vec<&str> = r.tool_calls.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, want, "parallel_tool_calls {parallel:?}");
        // The newline between the blocks is layout, not text.
        assert_eq!(r.text(), "", "parallel_tool_calls {parallel:?}");
        assert_eq!(r.done.as_ref().unwrap().tool_calls, r.tool_calls);
        assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_are_rejected_with_clear_messages() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let ok = greedy("hello", 4);
    let with = |f: &dyn Fn(&mut pb::GenerateRequest)| {
        let mut r = ok.clone();
        f(&mut r);
        r
    };
    let user = |content: &str| pb::ChatMessage {
        role: "user".into(),
        content: content.into(),
        ..Default::default()
    };
    let sampling = |f: &dyn Fn(&mut pb::SamplingParams)| {
        let mut s = pb::SamplingParams::default();
        f(&mut s);
        Some(s)
    };
    let ctx = c
        .get_model_info(pb::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .context_length as usize;
    let cases: Vec<(&str, pb::GenerateRequest, &str)> = vec![
        (
            "empty prompt",
            with(&|r| r.prompt.clear()),
            "prompt is empty",
        ),
        (
            "prompt and messages",
            with(&|r| r.messages = vec![user("hi")]),
            "either prompt or messages",
        ),
        (
            "unknown role",
            with(&|r| {
                r.prompt.clear();
                r.messages = vec![pb::ChatMessage {
                    role: "wizard".into(),
                    content: "hi".into(),
                    ..Default::default()
                }];
            }),
            "unknown role \"wizard\"",
        ),
        (
            "max_tokens 0",
            with(&|r| r.max_tokens = Some(0)),
            "max_tokens must be at least 1",
        ),
        (
            "max_tokens past the context",
            with(&|r| r.max_tokens = Some(ctx as u32)),
            "exceeds the context window",
        ),
        (
            "negative temperature",
            with(&|r| r.sampling = sampling(&|s| s.temperature = Some(-0.5))),
            "temperature",
        ),
        (
            "top_p 0",
            with(&|r| r.sampling = sampling(&|s| s.top_p = Some(0.0))),
            "top_p",
        ),
        (
            "top_p above 1",
            with(&|r| r.sampling = sampling(&|s| s.top_p = Some(1.5))),
            "top_p",
        ),
        (
            "logit_bias beyond 100",
            with(&|r| r.sampling = sampling(&|s| s.logit_bias = [(65, 150.0)].into())),
            "invalid logit_bias 150",
        ),
        (
            "logit_bias of a token the model does not have",
            with(&|r| r.sampling = sampling(&|s| s.logit_bias = [(1_000_000, 1.0)].into())),
            "logit_bias names token 1000000, outside the model's vocabulary",
        ),
        (
            "prompt longer than the context",
            with(&|r| r.prompt = "a".repeat(ctx + 10)),
            "context window holds",
        ),
        ("too many logprobs", with(&|r| r.logprobs = 21), "logprobs"),
        (
            "empty stop string",
            with(&|r| r.stop = vec![String::new()]),
            "stop strings",
        ),
        // A request_id is logged: one that could start a forged log line is refused.
        (
            "request_id with a newline",
            with(&|r| r.request_id = "ok\n2026-01-01T00:00:00Z  INFO forged".into()),
            "printable ASCII",
        ),
        (
            "request_id with an escape code",
            with(&|r| r.request_id = "\u{1b}[2Jcleared".into()),
            "printable ASCII",
        ),
        (
            "request_id with a non-ASCII line separator",
            with(&|r| r.request_id = "a\u{2028}b".into()),
            "printable ASCII",
        ),
    ];
    for (name, req, want) in cases {
        let r = run(&mut c, req).await;
        let s = r.status.unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(s.code(), Code::InvalidArgument, "{name}: {s:?}");
        assert!(
            s.message().contains(want),
            "{name}: message {:?} lacks {want:?}",
            s.message()
        );
        assert!(r.tokens.is_empty());
    }
    let n_invalid = server.metrics().requests("Generate", "INVALID_ARGUMENT");
    assert_eq!(n_invalid, 16);
    // An id of printable ASCII is used as given.
    let r = run(&mut c, with(&|r| r.request_id = "job 42/a-b_c".into())).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    assert_eq!(r.done.unwrap().request_id, "job 42/a-b_c");

    // Message size limit: a prompt over the limit is refused by the transport with the
    // gRPC convention's code, naming the flag that sets the limit; so is a text over the
    // tokenizing limit, for Generate and Tokenize alike.
    let mut cfg = test_config();
    cfg.max_message_bytes = 1024;
    cfg.max_text_bytes = 512;
    let small = start_demo(cfg).await;
    let mut c2 = client(small.addr()).await;
    let limits = [
        (4096, Code::ResourceExhausted, "--max-message-bytes"),
        (600, Code::InvalidArgument, "--max-text-bytes"),
    ];
    for (bytes, code, flag) in limits {
        let r = run(&mut c2, with(&|r| r.prompt = "x".repeat(bytes))).await;
        let s = r
            .status
            .unwrap_or_else(|| panic!("{bytes}-byte prompt accepted"));
        assert_eq!(s.code(), code, "{bytes}-byte prompt: {s:?}");
        assert!(s.message().contains(flag), "{bytes}-byte prompt: {s:?}");
        let s = c2
            .tokenize(pb::TokenizeRequest {
                text: "y".repeat(bytes),
                parse_special: None,
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), code, "{bytes}-byte Tokenize: {s:?}");
        assert!(s.message().contains(flag), "{bytes}-byte Tokenize: {s:?}");
    }
    let r = run(&mut c2, greedy("fine", 2)).await;
    assert_eq!(r.code(), Code::Ok);

    small.shutdown().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_panic_fails_that_request_with_internal_and_serving_goes_on() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let (ref_ids, _) = reference("abc", 6);

    let mut bad = greedy("abc", 50);
    bad.request_id = FAULT_PANIC_REQUEST_ID.into();
    let r = run(&mut c, bad).await;
    assert_eq!(r.code(), Code::Internal, "{:?}", r.status);
    assert!(r.status.as_ref().unwrap().message().contains("panic"));
    // It had started streaming: the failure is never a successful end.
    assert!(!r.tokens.is_empty());
    assert_eq!(r.finish_reason(), Some(FinishReason::Error));

    let r = run(&mut c, greedy("abc", 6)).await;
    assert_eq!(r.code(), Code::Ok);
    assert_eq!(
        r.ids(),
        ref_ids,
        "the next request runs on a clean sequence"
    );
    assert_eq!(server.metrics().requests("Generate", "INTERNAL"), 1);

    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_end_running_and_queued_requests() {
    // One sequence slot, so that a running request makes the next one queue.
    let mut cfg = test_config();
    cfg.engine.max_seqs = 1;
    let server = start_demo(cfg).await;
    let mut c = client(server.addr()).await;

    // A running request past its deadline ends with DEADLINE_EXCEEDED, not success.
    let mut req = tonic::Request::new(greedy("deadline", 3000));
    req.set_timeout(Duration::from_millis(300));
    let r = collect(c.generate(req).await.unwrap().into_inner()).await;
    assert_eq!(r.code(), Code::DeadlineExceeded, "{:?}", r.status);
    assert!(r.tokens.len() < 3000);
    assert!(r.done.is_none());

    // A queued request whose deadline passes while it waits never starts.
    let mut blocker = c
        .generate(greedy("blocker", 3000))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut blocker).await;
    let mut queued = tonic::Request::new(greedy("queued", 5));
    queued.set_timeout(Duration::from_millis(100));
    let queued = c.generate(queued).await.unwrap().into_inner();
    // Its deadline (100 ms after it arrived) passes while the blocker holds the engine.
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(blocker);
    let r = collect(queued).await;
    assert_eq!(r.code(), Code::DeadlineExceeded, "{:?}", r.status);
    assert!(r.tokens.is_empty());

    let m = server.metrics();
    assert_eq!(m.requests("Generate", "DEADLINE_EXCEEDED"), 2);
    server.shutdown().await.unwrap();
}
