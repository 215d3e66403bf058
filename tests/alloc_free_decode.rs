//! A decode step performs no heap allocation: every buffer is sized when the sequence starts.
//! Counted through a global allocator, on the thread that runs the decode step (the engine
//! thread): other threads of the test harness may allocate at any time under load.
//!
//! The gpu backend's buffers are made once too, but recording a command buffer allocates
//! inside wgpu on every submit; there the count must stay the same from step to step (it
//! does not grow with the sequence).

mod common;

use inferno::model::Logits;

mod alloc_counter;

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

#[test]
fn decode_step_allocates_nothing() {
    // The counter sees an allocation when there is one.
    assert_eq!(
        alloc_counter::allocations_in(|| drop(std::hint::black_box(Box::new(7u64)))),
        1
    );
    // Qwen3 fixtures on every backend, and Llama ones (RoPE scaling, biases, untied output)
    // and Qwen3-MoE ones on the CPU backends: on lavapipe, wgpu's own count for tiny-llama3.f32 moves by one on
    // a random step (the same step count otherwise), which is wgpu's timing, not this pass.
    let llama = common::fixtures().join("llama");
    let mut files: Vec<(String, std::path::PathBuf, bool)> = ["f32", "f16", "q8_0"]
        .iter()
        .map(|d| {
            let f = format!("tiny-gqa-tied.{d}.gguf");
            (f.clone(), common::models_dir().join(f), true)
        })
        .collect();
    for f in [
        "tiny-llama3.f32.gguf",
        "tiny-llama3.q8_0.gguf",
        "tiny-llama-bias.f32.gguf",
    ] {
        files.push((f.to_string(), llama.join(f), false));
    }
    // Qwen3-MoE (routing tables and expert buffers sized with the sequence), CPU only.
    for f in ["tiny-qwen3moe.f32.gguf", "tiny-qwen3moe.q8_0.gguf"] {
        let path = common::fixtures().join("qwen3moe").join(f);
        files.push((f.to_string(), path, false));
    }
    for (dtype, path, on_gpu) in &files {
        for backend in inferno::backend::BACKEND_NAMES {
            if *backend == "gpu" && !on_gpu {
                continue;
            }
            if *backend == "gpu" && std::env::var("INFERNO_TEST_GPU").is_ok_and(|v| v == "0") {
                eprintln!("SKIPPED gpu: INFERNO_TEST_GPU=0 declares that there is no GPU");
                continue;
            }
            let gguf = inferno::gguf::GgufFile::open(path).expect("fixture");
            let be = inferno::backend::create_backend(backend, &Default::default()).unwrap();
            let model = inferno::model::Model::load(&gguf, be).expect("loads");
            let vocab = model.config.vocab;
            let mut st = model.new_state(64, 16);
            let mut logits = vec![0.0f32; vocab];
            model
                .forward(&mut st, &[1, 2, 3, 4, 5], Logits::Last(&mut logits))
                .unwrap();
            // One warm-up step sizes the kernels' per-thread scratch.
            model
                .forward(&mut st, &[6], Logits::Last(&mut logits))
                .unwrap();
            let per_step: Vec<usize> = (0..20u32)
                .map(|t| {
                    alloc_counter::allocations_in(|| {
                        model
                            .forward(
                                &mut st,
                                &[(t * 7) % vocab as u32],
                                Logits::Last(&mut logits),
                            )
                            .unwrap();
                    })
                })
                .collect();
            if *backend == "gpu" {
                let (lo, hi) = (per_step.iter().min(), per_step.iter().max());
                assert_eq!(
                    lo, hi,
                    "{dtype}: gpu allocations vary by step: {per_step:?}"
                );
            } else {
                let n: usize = per_step.iter().sum();
                assert_eq!(
                    n, 0,
                    "{backend} {dtype}: {n} allocations in 20 decode steps"
                );
            }
        }
    }
}

/// A speculative step allocates nothing either: the n-gram lookup of its drafts, the
/// multi-row forward pass over the last token and its drafts (every row's logits), and
/// dropping the rejected rows from the cache, with buffers sized when the sequence starts.
/// (Not on `parallel`: from four rows on it hands the work to rayon, as it does a prompt's,
/// and rayon's job queue allocates a block now and then.)
#[test]
fn a_verification_step_allocates_nothing() {
    use inferno::engine::speculative::{Method, Solo, Speculation};
    let spec = Speculation::new(Method::Ngram, Some(6)).with_costs(0.01, 0.0);
    for file in ["tiny-gqa-tied.q8_0.gguf", "tiny-gqa-tied.f32.gguf"] {
        for backend in ["scalar", "simd", "pool"] {
            let gguf = inferno::gguf::GgufFile::open(common::models_dir().join(file)).unwrap();
            let be = inferno::backend::create_backend(backend, &Default::default()).unwrap();
            let model = inferno::model::Model::load(&gguf, be).expect("loads");
            let vocab = model.config.vocab;
            let mut st = model.new_state(256, 16);
            let mut solo = Solo::new(&spec, None, 256).unwrap().unwrap();
            let mut logits = vec![0.0f32; 7 * vocab];
            // A repeating context: every lookup finds six drafts.
            let mut tokens: Vec<u32> = (0..40u32).map(|i| (i % 5) * 3 % vocab as u32).collect();
            model
                .forward(&mut st, &tokens, Logits::Last(&mut logits[..vocab]))
                .unwrap();
            let mut run = [0u32; 7];
            let mut step = |st: &mut inferno::model::State, tokens: &[u32]| {
                let drafts = solo.propose(tokens, 6);
                let k = drafts.len();
                run[0] = tokens[tokens.len() - 1];
                run[1..1 + k].copy_from_slice(drafts);
                model
                    .forward(
                        st,
                        &run[..1 + k],
                        Logits::All(&mut logits[..(1 + k) * vocab]),
                    )
                    .unwrap();
                // Keep the last token and two drafts, as a partial acceptance does.
                st.truncate(st.position() - (1 + k) + 3.min(1 + k));
                solo.observe(1 + k, 0.01, k, 2.min(k));
                k
            };
            // One warm-up step sizes the kernels' per-thread scratch.
            step(&mut st, &tokens);
            let mut drafted = 0;
            let per_step: Vec<usize> = (0..10)
                .map(|i| {
                    tokens.push((i % 5) * 3 % vocab as u32);
                    let t = &tokens;
                    alloc_counter::allocations_in(|| drafted += step(&mut st, t))
                })
                .collect();
            assert!(drafted >= 30, "{backend} {file}: {drafted} drafts");
            assert_eq!(
                per_step.iter().sum::<usize>(),
                0,
                "{backend} {file}: {per_step:?}"
            );
        }
    }
}
