//! A persistent pool of worker threads for the many short data-parallel jobs of a decode step.
//!
//! A decode step runs a couple of hundred matrix-vector products of 50–500 µs each; waking
//! sleeping threads through the OS for each would cost as much as the work. Here workers are
//! spawned once and watch one atomic generation counter: publishing a job is a store to a
//! mailbox plus one increment, and the caller works on the job too. A worker that sees no job
//! for a while (`SPIN_WINDOW`) parks on a condition variable, so an idle process costs no
//! CPU; the next job wakes it.
//!
//! A job is `n_chunks` independent chunks, claimed from a shared atomic counter by whichever
//! thread is free. So a worker the OS has descheduled (the machine is busy) delays the job by
//! at most the chunk it is in the middle of, never by its whole share: the caller takes the
//! chunks it has not claimed. Which thread runs a chunk never changes what the chunk
//! computes, so results do not depend on the thread count or the timing.
//!
//! Jobs are closures borrowed from the caller's stack for the duration of [`ThreadPool::run`]:
//! nothing is boxed, so dispatch allocates nothing.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking. Long enough to bridge the gaps between the
/// jobs of one decode step and between steps (sampling, streaming), short enough that an idle
/// pool goes quiet at once.
const SPIN_WINDOW: Duration = Duration::from_millis(2);

/// Spins of the caller's wait for a worker finishing its last chunk before it starts
/// yielding its core (the worker may have been descheduled).
const WAIT_SPINS_BEFORE_YIELD: u32 = 1 << 12;

/// A type-erased job: `func(ctx, chunk)` for chunks `0..n_chunks`.
#[derive(Clone, Copy)]
struct Job {
    func: unsafe fn(*const (), usize),
    ctx: *const (),
    n_chunks: usize,
}

/// Keeps the hot counters on separate cache lines.
#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    /// Bumped once per published job (and once at shutdown); idle workers wait for it to move.
    generation: Padded<AtomicUsize>,
    /// The generation of the job that may still be joined, or 0 once it is closed.
    open: Padded<AtomicUsize>,
    /// Next unclaimed chunk of the open job.
    next: Padded<AtomicUsize>,
    /// Workers that joined the current job and have not left it.
    active: Padded<AtomicUsize>,
    /// The current job; written only while no worker can be reading it (see `run`).
    job: UnsafeCell<Job>,
    stop: AtomicBool,
    /// Set when a job panicked on a worker; reported to the caller after the job.
    panicked: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    /// Workers that have started running.
    started: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field. The dispatching thread writes it only while no
// worker is inside a job (`active` is zero and the previous job is closed) and before
// publishing the next one (`open` store, SeqCst); a worker reads it only after it has joined
// (`active` increment) and seen that job still open (`open` load, SeqCst), and the caller
// waits for `active` to drop to zero before it returns. So reads and writes never overlap,
// and the context pointer is dereferenced only while `run` keeps the closure alive.
unsafe impl Sync for Shared {}
// SAFETY: see above; the pointer in `job` is only a borrowed context, never owned.
unsafe impl Send for Shared {}

/// A fixed set of `n_threads - 1` workers plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Held while a job is in flight: the mailbox serves one job at a time, so a second
    /// caller (another thread, or a job that dispatches) runs its job inline instead.
    busy: AtomicBool,
}

unsafe fn noop(_: *const (), _: usize) {}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    // The mutex guards no data, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Claims and runs chunks of `job` until none is left.
///
/// # Safety
/// `job` must be the open job, kept alive by its caller until this returns.
unsafe fn drain(s: &Shared, job: Job) {
    loop {
        let i = s.next.0.fetch_add(1, Ordering::Relaxed);
        if i >= job.n_chunks {
            return;
        }
        // SAFETY: the caller's promise.
        unsafe { (job.func)(job.ctx, i) };
    }
}

impl ThreadPool {
    /// A pool of `n_threads` (at least one: the caller). If the system cannot spawn that
    /// many threads, the pool runs with those it got.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: Padded(AtomicUsize::new(0)),
            open: Padded(AtomicUsize::new(0)),
            next: Padded(AtomicUsize::new(0)),
            active: Padded(AtomicUsize::new(0)),
            job: UnsafeCell::new(Job {
                func: noop,
                ctx: std::ptr::null(),
                n_chunks: 0,
            }),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n_threads - 1);
        for id in 1..n_threads {
            let s = Arc::clone(&shared);
            match thread::Builder::new()
                .name(format!("inferno-pool-{id}"))
                .spawn(move || worker_loop(&s))
            {
                Ok(h) => workers.push(h),
                // Chunks are claimed dynamically, so fewer workers only means less help.
                Err(_) => break,
            }
        }
        // Wait until every worker runs: a thread's start-up allocates, and it must not do
        // so later, in the middle of a (non-allocating) decode step.
        while shared.started.load(Ordering::SeqCst) < workers.len() {
            thread::yield_now();
        }
        Self {
            n_threads: workers.len() + 1,
            shared,
            workers,
            busy: AtomicBool::new(false),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(i)` once for every chunk `i < n_chunks`, spread over the pool's threads
    /// (including the caller), and returns when all are done. Chunks run concurrently, so
    /// each must touch only its own part of any shared output.
    pub fn run<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: &F) {
        if n_chunks <= 1
            || self.n_threads == 1
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..n_chunks).for_each(f);
            return;
        }

        unsafe fn call<F: Fn(usize)>(ctx: *const (), i: usize) {
            // SAFETY: `ctx` was made from `&F` in `run`, which outlives every call (it waits
            // for all joined workers before returning or unwinding).
            let f = unsafe { &*(ctx as *const F) };
            f(i);
        }

        let s = &*self.shared;
        let job = Job {
            func: call::<F>,
            ctx: f as *const F as *const (),
            n_chunks,
        };
        // SAFETY: `busy` is ours, and the previous job was closed with no worker left in it,
        // so nobody reads the mailbox until we open the next job below.
        unsafe { *s.job.get() = job };
        s.next.0.store(0, Ordering::Relaxed);
        let g = s
            .generation
            .0
            .load(Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        s.open.0.store(g, Ordering::SeqCst);
        s.generation.0.store(g, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this notify after any worker's check-then-wait.
            let _g = lock(&s.lock);
            s.wake.notify_all();
        }

        // Close the job and wait for joined workers even if a chunk panics here: they
        // borrow `f`.
        struct CloseOnDrop<'a>(&'a ThreadPool);
        impl Drop for CloseOnDrop<'_> {
            fn drop(&mut self) {
                let s = &*self.0.shared;
                s.open.0.store(0, Ordering::SeqCst);
                let mut spins = 0u32;
                while s.active.0.load(Ordering::SeqCst) != 0 {
                    if spins < WAIT_SPINS_BEFORE_YIELD {
                        spins += 1;
                        std::hint::spin_loop();
                    } else {
                        thread::yield_now();
                    }
                }
                self.0.busy.store(false, Ordering::Release);
            }
        }
        let guard = CloseOnDrop(self);
        // SAFETY: `f` lives until the end of this function.
        unsafe { drain(s, job) };
        drop(guard);

        if s.panicked.swap(false, Ordering::Relaxed) {
            // A kernel bug, not an input error: report it where it can be seen.
            panic!("a thread-pool worker panicked while running a job");
        }
    }

    fn shutdown(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::SeqCst);
        s.generation.0.fetch_add(1, Ordering::SeqCst);
        {
            let _g = lock(&s.lock);
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }

    /// Workers currently parked (for tests of the idle behaviour).
    pub fn parked_workers(&self) -> usize {
        self.shared.sleepers.load(Ordering::SeqCst)
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.n_threads)
    }
}

/// Waits until `generation` moves past `seen`: spins for `SPIN_WINDOW`, then parks.
fn wait_for_job(s: &Shared, seen: usize) -> usize {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let g = s.generation.0.load(Ordering::Acquire);
        if g != seen {
            return g;
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        // Reading the clock costs more than a spin; look at it now and then.
        if spins.is_multiple_of(256) && start.elapsed() >= SPIN_WINDOW {
            break;
        }
    }
    let mut guard = lock(&s.lock);
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let g = loop {
        let g = s.generation.0.load(Ordering::SeqCst);
        if g != seen {
            break g;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    };
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    g
}

fn worker_loop(s: &Shared) {
    s.started.fetch_add(1, Ordering::SeqCst);
    let mut seen = 0usize;
    loop {
        seen = wait_for_job(s, seen);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        s.active.0.fetch_add(1, Ordering::SeqCst);
        if s.open.0.load(Ordering::SeqCst) == seen {
            // SAFETY: we joined job `seen` while it was open, so the caller has finished
            // writing the mailbox and will not return (or rewrite it) until we leave.
            let job = unsafe { *s.job.get() };
            // SAFETY: as above, the job's closure outlives our stay.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { drain(s, job) }));
            if r.is_err() {
                s.panicked.store(true, Ordering::Relaxed);
                // Let the caller finish the remaining chunks' bookkeeping.
                s.next.0.store(usize::MAX / 2, Ordering::Relaxed);
            }
        }
        s.active.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The half-open range `[start, end)` of `total` items that thread `id` of `n` takes: sizes
/// differ by at most one, earlier threads take the larger shares.
pub fn split(total: usize, id: usize, n: usize) -> (usize, usize) {
    let n = n.max(1);
    let base = total / n;
    let rem = total % n;
    let start = id * base + id.min(rem);
    let len = base + usize::from(id < rem);
    (start.min(total), (start + len).min(total))
}

/// `units` of work cut into chunks that threads claim in order: equal chunks of `1 /
/// (per_thread · threads)` of the work while much is left, then chunks of a `2 · threads`-th
/// of what is left, down to one unit. With equal chunks to the end, a thread that takes
/// none of the last one idles for half a chunk on average while another finishes it;
/// shrinking ones end the threads within about a unit of each other. No chunk is larger
/// than an equal one, so a thread the OS deschedules still holds a job up by at most that.
/// Over the jobs of eight decoding streams (Zen 4, two threads) the two threads' ends of a
/// job were 4.5–4.8 µs apart on average with equal chunks, 1.3–1.9 µs with these
/// (docs/decisions/shrinking-chunks.md).
#[derive(Clone, Copy, Debug)]
pub struct Chunks {
    units: usize,
    /// The largest chunk: the size of an equal one.
    max: usize,
    /// A chunk takes at most what is left divided by this.
    div: usize,
}

impl Chunks {
    pub fn new(units: usize, threads: usize, per_thread: usize) -> Self {
        let threads = threads.max(1);
        Self {
            units,
            max: units.div_ceil((per_thread * threads).max(1)).max(1),
            div: 2 * threads,
        }
    }

    /// The size of the chunk that starts where `left` units are left.
    fn size(&self, left: usize) -> usize {
        left.div_ceil(self.div).clamp(1, self.max).min(left)
    }

    /// How many chunks there are.
    pub fn count(&self) -> usize {
        let (mut left, mut n) = (self.units, 0);
        while left > 0 {
            left -= self.size(left);
            n += 1;
        }
        n
    }

    /// The half-open range of units chunk `c` covers (empty past the last chunk).
    pub fn range(&self, c: usize) -> (usize, usize) {
        let mut start = 0;
        for _ in 0..c {
            start += self.size(self.units - start);
        }
        (start, start + self.size(self.units - start))
    }
}

/// Threads to use when none were asked for: `INFERNO_THREADS` if set, else the machine's
/// physical performance cores.
pub fn default_threads() -> usize {
    if let Some(n) = std::env::var("INFERNO_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    let available = thread::available_parallelism().map_or(1, |n| n.get());
    physical_performance_cores()
        .map_or(available, |p| p.min(available))
        .max(1)
}

/// Physical performance cores: `hw.perflevel0.physicalcpu` on macOS (the P-cores: a barrier
/// waits for its slowest thread, and an E-core is slower), distinct (package, core) pairs of
/// `/proc/cpuinfo` on Linux (SMT siblings share one core's load ports and bandwidth).
fn physical_performance_cores() -> Option<usize> {
    #[cfg(target_os = "macos")]
    {
        for key in ["hw.perflevel0.physicalcpu", "hw.physicalcpu"] {
            let out = std::process::Command::new("sysctl")
                .args(["-n", key])
                .output()
                .ok()?;
            if let Some(n) = std::str::from_utf8(&out.stdout)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
            {
                return Some(n);
            }
        }
        None
    }
    #[cfg(target_os = "linux")]
    {
        let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        count_physical_cores(&text)
    }
    #[cfg(not(any(target_os = "macos", target_os = "linux")))]
    {
        None
    }
}

/// Distinct `(physical id, core id)` pairs in a `/proc/cpuinfo` text.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn count_physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    let (mut package, mut core) = (None::<String>, None::<String>);
    for line in cpuinfo.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let Some(c) = core.take() {
                cores.insert((package.take().unwrap_or_default(), c));
            }
            package = None;
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "physical id" => package = Some(v.trim().to_string()),
                "core id" => core = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn split_covers_everything_once() {
        for total in [0, 1, 5, 16, 17, 1000] {
            for n in 1..6 {
                let mut next = 0;
                for id in 0..n {
                    let (a, b) = split(total, id, n);
                    assert_eq!(a, next);
                    assert!(b >= a && b - a <= total / n + 1);
                    next = b;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn chunks_cover_everything_once_and_shrink_at_the_end() {
        for units in [0, 1, 3, 4, 16, 17, 64, 384, 9496] {
            for threads in 1..5 {
                let c = Chunks::new(units, threads, 8);
                let equal = units.div_ceil(8 * threads).max(1);
                let (mut next, mut last) = (0, usize::MAX);
                for i in 0..c.count() {
                    let (a, b) = c.range(i);
                    assert_eq!(a, next, "{units} units, {threads} threads, chunk {i}");
                    assert!(b > a && b - a <= equal && b - a <= last);
                    (next, last) = (b, b - a);
                }
                assert_eq!(next, units);
                // Past the last chunk, ranges are empty.
                let (a, b) = c.range(c.count());
                assert_eq!((a, b), (units, units));
                if units > 0 {
                    assert_eq!(last, 1, "{units} units, {threads} threads end in one unit");
                }
            }
        }
        // 64 groups on two threads (a 1024-row product): 4 groups a chunk while more than
        // 12 are left, then a quarter of what is left, rounded up.
        let c = Chunks::new(64, 2, 8);
        let sizes: Vec<usize> = (0..c.count())
            .map(|i| c.range(i).1 - c.range(i).0)
            .collect();
        assert_eq!(
            sizes,
            [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 2, 1, 1, 1, 1]
        );
    }

    #[test]
    fn every_chunk_runs_exactly_once() {
        for n in 1..5 {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            for round in 0..300u64 {
                let chunks = (round % 37) as usize;
                let hits: Vec<AtomicU64> = (0..chunks).map(|_| AtomicU64::new(0)).collect();
                pool.run(chunks, &|i| {
                    hits[i].fetch_add(round + 1, Ordering::Relaxed);
                });
                for h in &hits {
                    assert_eq!(h.load(Ordering::Relaxed), round + 1);
                }
            }
        }
    }

    #[test]
    fn workers_share_the_work() {
        let pool = ThreadPool::new(2);
        let seen = Mutex::new(std::collections::HashSet::new());
        // Long enough chunks that the worker joins before the caller has taken them all.
        for _ in 0..50 {
            pool.run(64, &|_| {
                seen.lock().unwrap().insert(thread::current().id());
                thread::sleep(Duration::from_micros(200));
            });
        }
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn workers_park_when_idle_and_wake_for_the_next_job() {
        let pool = ThreadPool::new(3);
        let sum = AtomicU64::new(0);
        pool.run(8, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.parked_workers() < 2 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(pool.parked_workers(), 2, "idle workers should park");
        pool.run(8, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 56);
    }

    #[test]
    fn nested_dispatch_runs_inline() {
        let pool = ThreadPool::new(2);
        let count = AtomicU64::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn counts_distinct_physical_cores() {
        let text = "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 2\nphysical id\t: 0\ncore id\t: 1\n\n\
                    processor\t: 3\nphysical id\t: 1\ncore id\t: 0\n";
        assert_eq!(count_physical_cores(text), Some(3));
        assert_eq!(count_physical_cores("processor\t: 0\n"), None);
        assert!(default_threads() >= 1);
    }
}
