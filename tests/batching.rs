//! Continuous batching and prompt-prefix reuse: a batched forward pass gives every sequence
//! exactly the logits it gets alone; concurrent streams get exactly the tokens the
//! single-sequence `generate` gives; a cancelled stream leaves the others intact and frees
//! its KV cache; a joining request starts at once; a repeated prompt prefix is reused with
//! the same tokens; admission waits for KV room and refuses what can never fit.

mod service_support;

use inferno::backend::{create_backend, BackendOptions};
use inferno::engine::LoadOptions;
use inferno::engine::FAULT_PANIC_REQUEST_ID;
use inferno::gguf::GgufFile;
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Logits, Model, SeqStep};
use inferno::server::pb;
use service_support::*;
use std::time::Duration;
use tonic::Code;

mod alloc_counter;

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn demo_model(dtype: inferno::tensor::GgmlType, backend: &str) -> Model {
    let spec = SynthSpec::preset("demo", dtype).unwrap();
    let gguf = GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap();
    let be = create_backend(
        backend,
        &BackendOptions {
            threads: 2,
            tracing: false,
        },
    )
    .unwrap();
    Model::load(&gguf, be).unwrap()
}

/// Logits of every step of each sequence run alone: its prompt in one pass, then each
/// decode token.
fn alone(model: &Model, prompt: &[u32], decode: &[u32]) -> Vec<Vec<f32>> {
    let vocab = model.config.vocab;
    let mut st = model.new_state(64, 64);
    let mut out = Vec::new();
    let mut logits = vec![0.0; vocab];
    model
        .forward(&mut st, prompt, Logits::Last(&mut logits))
        .unwrap();
    out.push(logits.clone());
    for &t in decode {
        model
            .forward(&mut st, &[t], Logits::Last(&mut logits))
            .unwrap();
        out.push(logits.clone());
    }
    out
}

#[test]
fn a_batched_forward_gives_each_sequence_its_logits_alone_bit_for_bit() {
    use inferno::tensor::GgmlType;
    let prompts: [&[u32]; 3] = [
        &[5, 17, 99, 3, 250, 7, 42],
        &[11, 12, 13],
        &[200, 1, 2, 3, 4],
    ];
    let decode: [&[u32]; 3] = [&[8, 9, 10], &[100, 101, 102], &[60, 61, 62]];
    for dtype in [GgmlType::Q8_0, GgmlType::F32] {
        for backend in ["scalar", "simd", "pool"] {
            let model = demo_model(dtype, backend);
            let vocab = model.config.vocab;
            let want: Vec<Vec<Vec<f32>>> = (0..3)
                .map(|i| alone(&model, prompts[i], decode[i]))
                .collect();

            let mut kvs: Vec<_> = (0..3).map(|_| model.new_kv_cache(64)).collect();
            let mut logits = vec![vec![0.0f32; vocab]; 3];
            let mut scratch = model.new_scratch(32, 3);
            let mut seen = [0usize; 3];
            let mut check = |i: usize, l: &[f32]| {
                assert!(
                    bits(l) == bits(&want[i][seen[i]]),
                    "{dtype:?} {backend}: sequence {i}, step {}",
                    seen[i]
                );
                seen[i] += 1;
            };
            // Step 1: sequences 0 and 1 prefill together (their first logits); 2 waits.
            {
                let [k0, k1, _] = &mut kvs[..] else {
                    unreachable!()
                };
                let [l0, l1, _] = &mut logits[..] else {
                    unreachable!()
                };
                let mut b = [
                    SeqStep {
                        kv: k0,
                        tokens: prompts[0],
                        logits: Logits::Last(l0),
                    },
                    SeqStep {
                        kv: k1,
                        tokens: prompts[1],
                        logits: Logits::Last(l1),
                    },
                ];
                model.forward_batch(&mut b, &mut scratch).unwrap();
            }
            check(0, &logits[0]);
            check(1, &logits[1]);
            // Steps 2..: 0 and 1 decode while 2 prefills, then all three decode.
            for s in 0..decode[0].len() {
                let [k0, k1, k2] = &mut kvs[..] else {
                    unreachable!()
                };
                let [l0, l1, l2] = &mut logits[..] else {
                    unreachable!()
                };
                let t2: &[u32] = if s == 0 {
                    prompts[2]
                } else {
                    &decode[2][s - 1..s]
                };
                let mut b = [
                    SeqStep {
                        kv: k0,
                        tokens: &decode[0][s..s + 1],
                        logits: Logits::Last(l0),
                    },
                    SeqStep {
                        kv: k2,
                        tokens: t2,
                        logits: Logits::Last(l2),
                    },
                    SeqStep {
                        kv: k1,
                        tokens: &decode[1][s..s + 1],
                        logits: Logits::Last(l1),
                    },
                ];
                model.forward_batch(&mut b, &mut scratch).unwrap();
                check(0, &logits[0]);
                check(1, &logits[1]);
                check(2, &logits[2]);
            }
            assert_eq!(kvs[0].len(), prompts[0].len() + 3);
            assert_eq!(kvs[2].len(), prompts[2].len() + 2);
        }
    }
}

#[test]
fn a_batched_decode_step_allocates_nothing() {
    for backend in ["scalar", "pool"] {
        let model = demo_model(inferno::tensor::GgmlType::Q8_0, backend);
        let vocab = model.config.vocab;
        let mut kvs: Vec<_> = (0..4).map(|_| model.new_kv_cache(64)).collect();
        let mut logits = vec![vec![0.0f32; vocab]; 4];
        let mut scratch = model.new_scratch(12, 4);
        let tokens: Vec<[u32; 1]> = (0..4).map(|i| [i as u32 + 3]).collect();
        let mut run = |n: usize| {
            for _ in 0..n {
                // On the stack: the engine keeps its list of steps allocated once too.
                let mut it =
                    kvs.iter_mut()
                        .zip(logits.iter_mut())
                        .zip(&tokens)
                        .map(|((kv, l), t)| SeqStep {
                            kv,
                            tokens: t,
                            logits: Logits::Last(l),
                        });
                let mut steps: [SeqStep<'_>; 4] = std::array::from_fn(|_| it.next().unwrap());
                model.forward_batch(&mut steps, &mut scratch).unwrap();
            }
        };
        // Warm-up steps size the kernels' per-thread scratch.
        run(2);
        let n = alloc_counter::allocations_in(|| run(10));
        assert_eq!(
            n, 0,
            "{backend}: {n} allocations in 10 batched decode steps"
        );
    }
}

#[test]
fn a_batch_larger_than_the_scratch_is_an_error() {
    let model = demo_model(inferno::tensor::GgmlType::Q8_0, "scalar");
    let mut kv = model.new_kv_cache(64);
    let mut scratch = model.new_scratch(4, 1);
    let mut b = [SeqStep {
        kv: &mut kv,
        tokens: &[1, 2, 3, 4, 5],
        logits: Logits::None,
    }];
    let e = model.forward_batch(&mut b, &mut scratch).unwrap_err();
    assert!(e.to_string().contains("5 token rows"), "{e}");
    assert!(kv.is_empty());
}

fn reference(prompts: &[&str], max_tokens: usize) -> Vec<Vec<u32>> {
    reference_on(&LoadOptions::default(), prompts, max_tokens)
}

/// Distinct first letters: no two prompts share a prefix the cache could reuse.
const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The quick brown fox",
    "In a galaxy far away, there",
    "Hello",
    "A long, long prompt that takes a while to prefill, longer than the others by far",
    "Zebras",
    "Many hands make light work",
    "Quiet rivers run deep",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_greedy_streams_get_exactly_their_tokens_alone() {
    let server = start_demo(test_config()).await;
    let addr = server.addr();
    let want = reference(&PROMPTS, 24);

    let mut calls = Vec::new();
    for p in PROMPTS {
        calls.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            run(&mut c, greedy(p, 24)).await
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.unwrap();
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert_eq!(r.ids(), want[i], "stream {i} ({:?})", PROMPTS[i]);
        let usage = r.done.as_ref().unwrap().usage.unwrap();
        assert_eq!(usage.cached_prompt_tokens, 0);
    }
    // The streams really ran together: some engine steps held several sequences.
    let m = server.metrics();
    let steps = m.batch_size.count();
    let multi = steps - m.batch_size.count_le(1);
    assert!(
        multi > 0,
        "no step batched more than one sequence ({steps} steps)"
    );
    assert_eq!(m.requests("Generate", "OK"), 8);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_leaves_the_others_intact_and_frees_its_cache_at_once() {
    let server = start_demo(test_config()).await;
    let addr = server.addr();
    let companions = ["Many hands make light work", "Quiet rivers run deep"];
    let want = reference(&companions, 300);

    let mut c = client(addr).await;
    let mut target = c
        .generate(greedy("Zebras cross the road", 3000))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut target).await;
    let mut running = Vec::new();
    for p in companions {
        running.push(c.generate(greedy(p, 300)).await.unwrap().into_inner());
    }
    next_token(&mut target).await;
    drop(target);

    // Within a step the target is cancelled and its cache (prompt + 3000 positions) freed,
    // not kept for reuse: what remains is at most the companions' reservations.
    let companions_need: usize = companions.iter().map(|p| p.len() + 300).sum();
    tokio::time::timeout(Duration::from_secs(60), async {
        while server.metrics().requests("Generate", "CANCELLED") < 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the dropped stream is cancelled (hang guard)");
    let text = server.metrics_text();
    let held = metric(&text, "inferno_kv_cache_reserved_tokens")
        + metric(&text, "inferno_kv_cache_cached_tokens");
    assert!(
        held <= companions_need as f64,
        "{held} KV positions still held after the cancel; the companions need {companions_need}"
    );

    for (i, s) in running.into_iter().enumerate() {
        let r = collect(s).await;
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert_eq!(r.ids(), want[i], "companion {i}");
    }
    let m = server.metrics();
    assert_eq!(m.requests("Generate", "CANCELLED"), 1);
    assert_eq!(m.requests("Generate", "OK"), 2);
    let text = server.metrics_text();
    assert_eq!(metric(&text, "inferno_kv_cache_reserved_tokens"), 0.0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_joining_running_streams_finishes_before_them() {
    let server = start_demo(test_config()).await;
    let addr = server.addr();
    let mut c = client(addr).await;
    let mut long_a = c
        .generate(greedy("Once upon a time", 3000))
        .await
        .unwrap()
        .into_inner();
    let mut long_b = c
        .generate(greedy("The quick brown fox", 3000))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut long_a).await;
    next_token(&mut long_b).await;

    let want = reference(&["Hello"], 6);
    let joined = run(&mut c, greedy("Hello", 6)).await;
    assert_eq!(joined.code(), Code::Ok, "{:?}", joined.status);
    assert_eq!(joined.ids(), want[0]);
    // The long streams are still generating: the newcomer did not wait for them.
    assert_eq!(server.metrics().requests("Generate", "OK"), 1);
    next_token(&mut long_a).await;
    next_token(&mut long_b).await;
    drop(long_a);
    drop(long_b);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prompt_prefix_is_reused_with_the_same_tokens() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;
    let system = "You are a helpful assistant. Answer briefly and truthfully. ";
    let p1 = format!("{system}What is the capital of France?");
    let p2 = format!("{system}Name a prime number.");
    let want = reference(&[&p1, &p2], 8);

    let first = run(&mut c, greedy(&p1, 8)).await;
    assert_eq!(first.code(), Code::Ok, "{:?}", first.status);
    assert_eq!(first.ids(), want[0]);
    let u = first.done.as_ref().unwrap().usage.unwrap();
    assert_eq!(u.cached_prompt_tokens, 0);

    // The same prompt again: everything but its last token comes from the cache.
    let again = run(&mut c, greedy(&p1, 8)).await;
    assert_eq!(again.ids(), want[0], "reuse changed the tokens");
    let u = again.done.as_ref().unwrap().usage.unwrap();
    assert_eq!(u.cached_prompt_tokens, u.prompt_tokens - 1);

    // Another question after the same system prompt: the shared prefix is reused.
    let other = run(&mut c, greedy(&p2, 8)).await;
    assert_eq!(other.ids(), want[1], "reuse changed the tokens");
    let u = other.done.as_ref().unwrap().usage.unwrap();
    let shared = p1
        .bytes()
        .zip(p2.bytes())
        .take_while(|(a, b)| a == b)
        .count() as u32; // the demo vocabulary is one token per byte
    assert_eq!(u.cached_prompt_tokens, shared);

    // The first prompt a third time: the one that shared only its opening copied that
    // prefix and left the first prompt's cache whole.
    let third = run(&mut c, greedy(&p1, 8)).await;
    assert_eq!(third.ids(), want[0], "reuse changed the tokens");
    let u = third.done.as_ref().unwrap().usage.unwrap();
    assert_eq!(u.cached_prompt_tokens, u.prompt_tokens - 1);

    // A multi-turn chat resent whole: the earlier turn (prompt and reply) is reused.
    let turn2 = format!("{p2}{} And another?", other.text());
    let want2 = reference(&[&turn2], 8);
    let r = run(&mut c, greedy(&turn2, 8)).await;
    assert_eq!(r.ids(), want2[0], "reuse changed the tokens");
    let u = r.done.as_ref().unwrap().usage.unwrap();
    // The reply's last token was sampled but never run, so its KV is not cached.
    assert!(
        u.cached_prompt_tokens as usize >= p2.len() + other.tokens.len() - 1,
        "{u:?}"
    );

    let reused = server.metrics().prompt_tokens_reused();
    assert!(reused >= (u.cached_prompt_tokens + shared) as u64);
    assert!(metric(&server.metrics_text(), "inferno_prompt_tokens_reused_total") > 0.0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_kv_room_and_one_that_never_fits_is_refused() {
    let mut cfg = test_config();
    // Room for one request of 10 prompt + 30 completion tokens at a time, not two.
    cfg.engine.kv_cache_tokens = Some(64);
    let server = start_demo(cfg).await;
    let addr = server.addr();
    let mut c = client(addr).await;
    let info = c
        .get_model_info(pb::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.kv_cache_tokens, 64);

    let prompts = ["Aardvarks!", "Bumblebees", "Cormorants"];
    let want = reference(&prompts, 30);
    let mut calls = Vec::new();
    for p in prompts {
        calls.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            run(&mut c, greedy(p, 30)).await
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.unwrap();
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert_eq!(r.ids(), want[i]);
    }
    // They ran one at a time: never two sequences in a step.
    let m = server.metrics();
    assert_eq!(m.batch_size.count_le(1), m.batch_size.count());

    // Prompt plus max_tokens beyond the whole KV cache: refused at once, clearly.
    let r = run(&mut c, greedy("Aardvarks!", 60)).await;
    assert_eq!(r.code(), Code::InvalidArgument, "{:?}", r.status);
    let msg = r.status.unwrap().message().to_string();
    assert!(msg.contains("KV cache") && msg.contains("64"), "{msg}");
    // Unset max_tokens is capped by the room the KV cache leaves.
    let mut req = greedy("Aardvarks!", 1);
    req.max_tokens = None;
    let r = run(&mut c, req).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    assert_eq!(r.tokens.len(), 64 - 10);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_only_its_request_and_the_batch_goes_on() {
    let server = start_demo(test_config()).await;
    let addr = server.addr();
    let want = reference(&PROMPTS[..2], 40);
    let mut calls = Vec::new();
    for p in &PROMPTS[..2] {
        calls.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            run(&mut c, greedy(p, 40)).await
        }));
    }
    let mut c = client(addr).await;
    let mut bad = greedy("Hello", 40);
    bad.request_id = FAULT_PANIC_REQUEST_ID.into();
    let r = run(&mut c, bad).await;
    assert_eq!(r.code(), Code::Internal, "{:?}", r.status);
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.unwrap();
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert_eq!(r.ids(), want[i]);
    }
    assert_eq!(server.metrics().requests("Generate", "INTERNAL"), 1);
    let text = server.metrics_text();
    assert_eq!(metric(&text, "inferno_kv_cache_reserved_tokens"), 0.0);
    server.shutdown().await.unwrap();
}
