//! A small reproducible random source for the workspace's randomized unit tests: no
//! dependency, and the same cases on every run, so a failure names a case that replays.

/// xorshift64 (Marsaglia): fast, and enough for drawing test cases.
pub struct TestRng(u64);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        // Zero is xorshift's one fixed point.
        Self(seed.max(1))
    }

    /// A number below `n`, which must not be 0.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
