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
    for dtype in ["f32", "f16", "q8_0"] {
        for backend in inferno::backend::BACKEND_NAMES {
            if *backend == "gpu" && std::env::var("INFERNO_TEST_GPU").is_ok_and(|v| v == "0") {
                eprintln!("SKIPPED gpu: INFERNO_TEST_GPU=0 declares that there is no GPU");
                continue;
            }
            let model = common::load_model(&format!("tiny-gqa-tied.{dtype}.gguf"), backend);
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
