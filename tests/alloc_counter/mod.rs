//! A global allocator for tests that counts the heap allocations one thread makes while it
//! runs a closure. Only that thread counts: the harness's other threads (and the backends'
//! pool workers) may allocate at any time, and tests run in parallel.
// Each test binary that includes this module uses some of its helpers.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Install with `#[global_allocator] static GLOBAL: Counting = Counting;`.
pub struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs while thread-locals are being torn down.
    if ON.try_with(|c| c.get()).unwrap_or(false) {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations and reallocations `f` makes on this thread (the global allocator must be
/// [`Counting`]).
pub fn allocations_in(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    ON.with(|c| c.set(true));
    f();
    ON.with(|c| c.set(false));
    COUNT.with(|c| c.get())
}

/// Starts counting this thread's allocations, for counts between calls rather than around
/// one closure (see [`take`]).
pub fn start() {
    COUNT.with(|c| c.set(0));
    ON.with(|c| c.set(true));
}

/// The allocations this thread made since [`start`] or the previous `take`; counting goes
/// on.
pub fn take() -> usize {
    COUNT.with(|c| c.replace(0))
}
