//! A decode step performs no heap allocation: every buffer is sized when the sequence starts.
//! Counted through a global allocator, on the thread that runs the decode step (the engine
//! thread): other threads of the test harness may allocate at any time under load.

mod common;

use inferno::model::Logits;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    static IS_CALLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed) && IS_CALLER.try_with(|c| c.get()).unwrap_or(false)
}
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_step_allocates_nothing() {
    IS_CALLER.with(|c| c.set(true));
    for dtype in ["f32", "f16", "q8_0"] {
        for backend in inferno::backend::BACKEND_NAMES {
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
            ALLOCS.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            for t in 0..20u32 {
                model
                    .forward(
                        &mut st,
                        &[(t * 7) % vocab as u32],
                        Logits::Last(&mut logits),
                    )
                    .unwrap();
            }
            COUNTING.store(false, Ordering::SeqCst);
            let n = ALLOCS.load(Ordering::SeqCst);
            assert_eq!(
                n, 0,
                "{backend} {dtype}: {n} allocations in 20 decode steps"
            );
        }
    }
}
