//! Speculative decoding changes nothing but the speed: with n-gram drafts, with a draft model
//! (a smaller quantization of the same model), with drafts that are always right and with
//! drafts that are always wrong, every generation gives exactly the tokens, the logits behind
//! each token (so its logprobs) and the finish reason it gives without speculation — greedy
//! and seeded sampling with a repetition penalty, on every CPU backend, alone and as 8
//! concurrent streams of the engine, under a JSON schema, with a stop string hit inside an
//! accepted draft and with `max_tokens` reached inside a verification. (The gpu backend's
//! share is in tests/gpu_backend.rs, the real checkpoint's in tests/real_model.rs.)

mod common;
mod service_support;

use common::spec::{oracle, solo};
use inferno::backend::{create_backend, BackendOptions};
use inferno::engine::loader::{synthetic_assets, LoadOptions};
use inferno::engine::speculative::draft::DraftModel;
use inferno::engine::speculative::{Method, Speculation};
use inferno::engine::{
    Engine, EngineConfig, EngineState, Event, FinishReason, GenerateOptions, Job, NoObserver,
};
use inferno::gguf::{GgufFile, GgufWriter, Value};
use inferno::model::synth::{self, SynthSpec};
use inferno::model::Model;
use inferno::sampling::constraint::{GrammarCompiler, ResponseFormat};
use inferno::sampling::SamplingParams;
use inferno::tensor::GgmlType;
use inferno::tokenizer::Tokenizer;
use std::sync::Arc;

fn demo_gguf() -> GgufFile {
    let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
    GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap()
}

/// The first `layers` layers of `g` (a cheaper draft of the same vocabulary).
fn truncate_layers(g: &GgufFile, layers: usize) -> GgufFile {
    let mut w = GgufWriter::new();
    let arch = g.architecture().unwrap().to_string();
    for (k, v) in g.metadata() {
        if k == &format!("{arch}.block_count") {
            w.add(k.clone(), Value::U32(layers as u32));
        } else if k != "general.alignment" {
            w.add(k.clone(), v.clone());
        }
    }
    for t in g.tensors() {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        if layer.is_some_and(|l| l >= layers) {
            continue;
        }
        let data = g.tensor_data(&t.name).unwrap();
        w.add_tensor(t.name.clone(), &t.dims, t.dtype, data.as_slice().to_vec())
            .unwrap();
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// The demo model's draft: its first two layers of four, in Q4_0 (a draft as costly as
/// the model itself would rarely be worth running, and the engine would rarely run it).
fn small_draft(g: &GgufFile) -> GgufFile {
    truncate_layers(&common::requantize(g, "q4_0"), 2)
}

fn device(name: &str, threads: usize) -> inferno::backend::Device {
    create_backend(
        name,
        &BackendOptions {
            threads,
            tracing: false,
        },
    )
    .unwrap()
}

/// `draft` loaded as the draft model of `main` (on its device).
fn draft_of(main: &Model, main_tok: &Tokenizer, draft: &GgufFile) -> DraftModel {
    let model = Model::load(draft, main.device().clone()).unwrap();
    let tok = Tokenizer::from_gguf(draft).unwrap();
    DraftModel::new(model, "draft".into(), &tok, main_tok, main.config.vocab).unwrap()
}

fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    ["The sea, the sea, the sea", "Once upon a time there was"]
        .iter()
        .map(|p| tok.encode(p, false).unwrap())
        .collect()
}

fn samplings() -> Vec<(&'static str, SamplingParams)> {
    vec![
        ("greedy", SamplingParams::greedy()),
        (
            "seeded",
            SamplingParams {
                temperature: 0.9,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.02,
                repeat_penalty: 1.2,
                repeat_last_n: 16,
                frequency_penalty: 0.3,
                presence_penalty: 0.2,
                // Byte tokens of the demo vocabulary: 'e' made likelier, ' ' all but banned.
                logit_bias: vec![(b'e' as u32, 2.0), (b' ' as u32, -100.0)],
                seed: Some(7),
            },
        ),
    ]
}

#[test]
fn every_proposer_gives_the_generation_without_speculation_on_every_cpu_backend() {
    let gguf = demo_gguf();
    let draft_gguf = small_draft(&gguf);
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let backends = [
        ("scalar", 1),
        ("simd", 1),
        ("parallel", 2),
        ("pool", 1),
        ("pool", 3),
    ];
    for (be, threads) in backends {
        let model = Model::load(&gguf, device(be, threads)).unwrap();
        let vocab = model.config.vocab;
        let draft = draft_of(&model, &tok, &draft_gguf);
        for (sname, sampling) in samplings() {
            let opts = GenerateOptions {
                max_tokens: 40,
                sampling,
                ignore_eos: true,
                ..GenerateOptions::default()
            };
            for prompt in prompts(&tok) {
                let (want, _) = solo(&model, &tok, None, None, &prompt, &opts);
                let reference = vec![(prompt.clone(), want.tokens.iter().map(|t| t.0).collect())];
                // Fixed costs: every proposer drafts whatever the machine's load.
                let cases = [
                    (
                        "ngram",
                        Speculation::new(Method::Ngram, None).with_costs(0.1, 0.1),
                    ),
                    (
                        "draft",
                        Speculation::new(Method::Draft, Some(4)).with_costs(0.1, 0.1),
                    ),
                    ("right", oracle(reference.clone(), 5, false, vocab)),
                    ("wrong", oracle(reference.clone(), 3, true, vocab)),
                ];
                for (name, spec) in &cases {
                    let (got, c) = solo(&model, &tok, Some(&draft), Some(spec), &prompt, &opts);
                    let what = format!("{be}/{threads} {sname} {name} on {prompt:?}");
                    assert_eq!(got, want, "{what}");
                    match *name {
                        "right" => {
                            assert!(c.drafted > 20 && c.accepted == c.drafted, "{what}: {c:?}")
                        }
                        "wrong" => assert!(c.drafted > 20 && c.accepted == 0, "{what}: {c:?}"),
                        _ => assert!(c.drafted > 0 && c.accepted <= c.drafted, "{what}: {c:?}"),
                    }
                }
            }
        }
    }
}

/// Lookups and the draft model really draft here (so the comparisons above tested
/// something): the demo model's greedy text repeats itself, and its small draft agrees
/// with it often. (The costs are fixed: measured ones depend on the machine's load.)
#[test]
fn lookups_and_the_draft_model_draft_and_are_accepted() {
    let gguf = demo_gguf();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let model = Model::load(&gguf, device("pool", 2)).unwrap();
    let draft = draft_of(
        &model,
        &tok,
        &truncate_layers(&common::requantize(&gguf, "q4_0"), 2),
    );
    let opts = GenerateOptions {
        max_tokens: 96,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let prompt = &prompts(&tok)[0];
    for method in [Method::Ngram, Method::Draft] {
        let (_, c) = solo(
            &model,
            &tok,
            Some(&draft),
            Some(&Speculation::new(method, None).with_costs(0.1, 0.1)),
            prompt,
            &opts,
        );
        assert!(c.accepted > 10, "{method:?}: {c:?}");
    }
}

#[test]
fn a_stop_string_inside_an_accepted_draft_and_max_tokens_inside_a_verification() {
    let gguf = demo_gguf();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let model = Model::load(&gguf, device("pool", 2)).unwrap();
    let vocab = model.config.vocab;
    let prompt = &prompts(&tok)[1];
    let free = GenerateOptions {
        max_tokens: 40,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let (full, _) = solo(&model, &tok, None, None, prompt, &free);
    let ids: Vec<u32> = full.tokens.iter().map(|t| t.0).collect();
    // Three drafts a step, all right: after the first token, every step verifies tokens
    // 4j+1 ..= 4j+3 (accepted drafts) and picks 4j+4. A stop string that first appears with
    // a token at a draft position stops the sequence inside an accepted draft.
    let spec = oracle(vec![(prompt.clone(), ids.clone())], 3, false, vocab);
    let text_at = |n: usize| tok.decode(&ids[..n], false).unwrap();
    let s = (5..ids.len())
        .filter(|s| s % 4 != 0)
        .find(|&s| {
            let (before, after) = (text_at(s), text_at(s + 1));
            let piece = &after[before.len()..];
            !piece.trim().is_empty() && !before.contains(piece)
        })
        .expect("a token whose text is new");
    let piece = text_at(s + 1)[text_at(s).len()..].to_string();
    let stopping = GenerateOptions {
        stop: vec![piece.clone()],
        ..free.clone()
    };
    let (want, _) = solo(&model, &tok, None, None, prompt, &stopping);
    assert_eq!(want.finish, FinishReason::StopSequence);
    assert_eq!(want.tokens.len(), s + 1, "stop {piece:?}");
    let (got, c) = solo(&model, &tok, None, Some(&spec), prompt, &stopping);
    assert_eq!(got, want);
    // The drafts after the stop were run but are not kept.
    assert!(c.accepted > 0 && c.accepted <= c.drafted, "{c:?}");

    // max_tokens ends the sequence within a verification (its last row), and drafts past
    // it are never run.
    for max_tokens in [1, 2, 6, 7, 11] {
        let opts = GenerateOptions {
            max_tokens,
            ..free.clone()
        };
        let (want, _) = solo(&model, &tok, None, None, prompt, &opts);
        let (got, c) = solo(&model, &tok, None, Some(&spec), prompt, &opts);
        assert_eq!(got, want, "max_tokens {max_tokens}");
        assert_eq!(got.finish, FinishReason::Length);
        assert!(c.drafted < max_tokens, "max_tokens {max_tokens}: {c:?}");
    }
}

#[test]
fn json_schema_output_is_the_same_with_drafts_right_wrong_and_looked_up() {
    let gguf = demo_gguf();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let model = Model::load(&gguf, device("pool", 2)).unwrap();
    let vocab = model.config.vocab;
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "tags"]}"#;
    let grammar = GrammarCompiler::new(&tok, vocab)
        .unwrap()
        .compile(&ResponseFormat::JsonSchema(schema.into()))
        .unwrap();
    for (sname, sampling) in samplings() {
        let opts = GenerateOptions {
            max_tokens: 48,
            sampling,
            grammar: Some(grammar.clone()),
            ..GenerateOptions::default()
        };
        let prompt = &prompts(&tok)[0];
        let (want, _) = solo(&model, &tok, None, None, prompt, &opts);
        let ids: Vec<u32> = want.tokens.iter().map(|t| t.0).collect();
        let reference = vec![(prompt.clone(), ids)];
        for (name, spec) in [
            ("ngram", Speculation::new(Method::Ngram, None)),
            ("right", oracle(reference.clone(), 4, false, vocab)),
            ("wrong", oracle(reference.clone(), 4, true, vocab)),
        ] {
            let (got, c) = solo(&model, &tok, None, Some(&spec), prompt, &opts);
            assert_eq!(got, want, "{sname} {name}");
            if name == "right" && want.tokens.len() > 2 {
                assert!(c.accepted > 0, "{sname}: {c:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The engine: batched verification
// ---------------------------------------------------------------------------------------

/// What one engine stream delivered: each token's id and logprobs, and the finish.
type Stream = (
    Vec<(u32, Option<inferno::engine::Logprobs>)>,
    Option<FinishReason>,
    usize,
    usize,
);

/// Runs `jobs` (prompt, options) through an engine speculating as `spec` says, all at once.
fn engine_run(
    backend: &str,
    spec: Speculation,
    draft: bool,
    jobs: &[(Vec<u32>, GenerateOptions)],
) -> Vec<Stream> {
    let config = EngineConfig {
        max_seqs: 8,
        speculation: spec,
        ..EngineConfig::default()
    };
    let backend = backend.to_string();
    let engine = Engine::start(
        config,
        move || {
            let load = LoadOptions {
                backend,
                threads: 2,
                ..LoadOptions::default()
            };
            let mut a = synthetic_assets("demo", &load)?;
            if draft {
                let g = small_draft(&demo_gguf());
                a.draft = Some(draft_of(&a.model, &a.tokenizer, &g));
            }
            Ok(a)
        },
        Arc::new(NoObserver),
    )
    .unwrap();
    while matches!(engine.state(), EngineState::Loading) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut rxs = Vec::new();
    for (i, (prompt, opts)) in jobs.iter().enumerate() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut job = Job::new(format!("job-{i}"), prompt.clone(), opts.clone(), tx);
        job.logprobs = 3;
        engine.submit(job).unwrap();
        rxs.push(rx);
    }
    let out = rxs
        .iter_mut()
        .map(|rx| {
            let mut s: Stream = (Vec::new(), None, 0, 0);
            while let Some(ev) = rx.blocking_recv() {
                match ev {
                    Event::Token(t) => s.0.push((t.id, t.logprobs)),
                    Event::Done(d) => {
                        s.1 = d.finish_reason;
                        s.2 = d.drafted_tokens;
                        s.3 = d.accepted_tokens;
                    }
                    Event::Failed(e) => panic!("{e}"),
                }
            }
            s
        })
        .collect();
    engine.join();
    out
}

#[test]
fn one_and_eight_engine_streams_get_their_tokens_and_logprobs_without_speculation() {
    let gguf = demo_gguf();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let texts = [
        "The sea, the sea, the sea",
        "Once upon a time there was",
        "a b c a b c a b",
        "Hello",
        "Zebras and zebras",
        "Many hands make light work",
        "Quiet rivers run deep",
        "In a galaxy far away",
    ];
    let mut jobs = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let (_, sampling) = &samplings()[i % 2];
        let mut opts = GenerateOptions {
            max_tokens: 24 + 3 * i,
            sampling: sampling.clone(),
            ignore_eos: i % 3 != 0,
            ..GenerateOptions::default()
        };
        if i == 5 {
            opts.stop = vec!["e".into()];
        }
        jobs.push((tok.encode(t, false).unwrap(), opts));
    }
    let vocab = Model::load(&gguf, device("simd", 1)).unwrap().config.vocab;
    for backend in ["simd", "pool"] {
        let want = engine_run(backend, Speculation::off(), false, &jobs);
        let reference: Vec<(Vec<u32>, Vec<u32>)> = jobs
            .iter()
            .zip(&want)
            .map(|((p, _), w)| (p.clone(), w.0.iter().map(|t| t.0).collect()))
            .collect();
        let cases = [
            (
                "ngram",
                Speculation::new(Method::Ngram, None).with_costs(0.1, 0.1),
                false,
            ),
            (
                "draft",
                Speculation::new(Method::Draft, Some(4)).with_costs(0.1, 0.1),
                true,
            ),
            ("right", oracle(reference.clone(), 6, false, vocab), false),
            ("wrong", oracle(reference.clone(), 2, true, vocab), false),
        ];
        for (name, spec, draft) in cases {
            // Alone (one stream at a time), then all eight at once.
            for i in [0, 1] {
                let got = engine_run(backend, spec.clone(), draft, &jobs[i..i + 1]);
                assert_eq!(got[0].0, want[i].0, "{backend} {name} alone: stream {i}");
                assert_eq!(got[0].1, want[i].1, "{backend} {name} alone: stream {i}");
            }
            let got = engine_run(backend, spec.clone(), draft, &jobs);
            let (mut drafted, mut accepted) = (0, 0);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.0, w.0, "{backend} {name}: stream {i}");
                assert_eq!(g.1, w.1, "{backend} {name}: stream {i}");
                drafted += g.2;
                accepted += g.3;
            }
            match name {
                "right" => assert!(accepted > 50 && accepted == drafted, "{drafted} {accepted}"),
                "wrong" => assert!(drafted > 50 && accepted == 0, "{drafted} {accepted}"),
                _ => assert!(drafted > 0 && accepted <= drafted, "{drafted} {accepted}"),
            }
        }
    }
}

/// The per-request switch: a request that turns speculation off drafts nothing, on an
/// engine that speculates, and gets the same tokens.
#[test]
fn a_request_can_turn_speculation_off() {
    let gguf = demo_gguf();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let prompt = tok.encode("a b c a b c a b", false).unwrap();
    let opts = GenerateOptions {
        max_tokens: 48,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let off = GenerateOptions {
        speculate: false,
        ..opts.clone()
    };
    let got = engine_run(
        "pool",
        Speculation::new(Method::Ngram, None).with_costs(0.1, 0.0),
        false,
        &[(prompt.clone(), opts), (prompt, off)],
    );
    assert_eq!(got[0].0, got[1].0);
    assert!(got[0].2 > 0, "the speculating request drafted nothing");
    assert_eq!((got[1].2, got[1].3), (0, 0));
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let gguf = demo_gguf();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let model = Model::load(&gguf, device("simd", 1)).unwrap();
    let other = GgufFile::open(common::fixtures().join("llama/tiny-llama3.q8_0.gguf")).unwrap();
    let draft = Model::load(&other, model.device().clone()).unwrap();
    let other_tok = Tokenizer::from_gguf(&other).unwrap();
    let err = DraftModel::new(
        draft,
        "tiny-llama3".into(),
        &other_tok,
        &tok,
        model.config.vocab,
    )
    .err()
    .expect("refused");
    assert!(err.contains("tiny-llama3 cannot draft"), "{err}");
    assert!(err.contains("vocabulary") || err.contains("token"), "{err}");
    // And through the loader, by path, before the draft's weights load.
    let dir = tempfile::tempdir().unwrap();
    let main_path = dir.path().join("demo.gguf");
    std::fs::write(
        &main_path,
        synth::build(&SynthSpec::preset("demo", GgmlType::Q8_0).unwrap())
            .unwrap()
            .to_bytes(),
    )
    .unwrap();
    let opts = LoadOptions {
        backend: "simd".into(),
        draft_model: Some(common::fixtures().join("llama/tiny-llama3.q8_0.gguf")),
        ..LoadOptions::default()
    };
    let err = inferno::engine::loader::file_assets(&main_path, &opts)
        .err()
        .expect("refused");
    assert!(err.contains("tiny-llama3.q8_0.gguf cannot draft"), "{err}");
}

/// Over gRPC and HTTP: the service says how it speculates, a `done` reports what was drafted and
/// kept, a request can turn speculation off, and Prometheus counts it per method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_reports_speculation_and_honours_the_switch() {
    use inferno::server::pb;
    use service_support::*;
    let mut config = test_config();
    config.http_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    config.engine.speculation = Speculation::new(Method::Ngram, Some(6)).with_costs(0.1, 0.0);
    let server = start_demo(config).await;
    let mut c = client(server.addr()).await;
    let info = c
        .get_model_info(pb::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.speculative.as_str(), info.draft_max), ("ngram", 6));
    assert!(info.draft_model.is_empty());
    let on = run(&mut c, greedy("a b c a b c a b", 48)).await;
    let off = run(
        &mut c,
        pb::GenerateRequest {
            disable_speculation: true,
            ..greedy("a b c a b c a b", 48)
        },
    )
    .await;
    assert_eq!(on.ids(), off.ids());
    let (u_on, u_off) = (
        on.done.clone().unwrap().usage.unwrap(),
        off.done.unwrap().usage.unwrap(),
    );
    assert!(
        u_on.drafted_tokens > 0 && u_on.accepted_tokens <= u_on.drafted_tokens,
        "{u_on:?}"
    );
    assert_eq!((u_off.drafted_tokens, u_off.accepted_tokens), (0, 0));
    let (drafted, accepted) = server.metrics().speculated_tokens(Method::Ngram);
    assert_eq!(
        (drafted, accepted),
        (
            u64::from(u_on.drafted_tokens),
            u64::from(u_on.accepted_tokens)
        )
    );
    let text = server.metrics_text();
    assert!(
        text.contains(&format!(
            "inferno_speculative_accepted_tokens_total{{method=\"ngram\"}} {accepted}\n"
        )),
        "{text}"
    );

    // Over HTTP: the same tokens, the drafts under OpenAI's predicted-token names, and the
    // same switch.
    let addr = server.http_addr().expect("the HTTP API listens");
    let body = |disable: bool| {
        serde_json::json!({"prompt": "a b c a b c a b", "max_tokens": 48, "temperature": 0,
                           "ignore_eos": true, "disable_speculation": disable})
    };
    let r_on = service_support::http::post_async(addr, "/v1/completions", body(false)).await;
    let r_off = service_support::http::post_async(addr, "/v1/completions", body(true)).await;
    let (v_on, v_off) = (r_on.json(), r_off.json());
    assert_eq!(v_on["choices"][0]["text"], v_off["choices"][0]["text"]);
    assert_eq!(v_on["choices"][0]["text"].as_str().unwrap(), on.text());
    let details = |v: &serde_json::Value| {
        let d = &v["usage"]["completion_tokens_details"];
        (
            d["accepted_prediction_tokens"].as_u64().unwrap(),
            d["rejected_prediction_tokens"].as_u64().unwrap(),
        )
    };
    let accepted_http = details(&v_on);
    assert_eq!(
        accepted_http,
        (
            u64::from(u_on.accepted_tokens),
            u64::from(u_on.drafted_tokens - u_on.accepted_tokens)
        ),
        "{v_on}"
    );
    assert_eq!(details(&v_off), (0, 0), "{v_off}");
    server.shutdown().await.unwrap();
}
