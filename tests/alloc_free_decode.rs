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
