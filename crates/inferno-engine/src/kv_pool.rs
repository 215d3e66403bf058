//! The engine's KV-cache budget and prompt-prefix cache.
//!
//! Every running sequence holds a KV cache of the positions it reserved when admitted
//! (prompt plus `max_tokens`), so admission never over-commits: the reserved positions of
//! running sequences plus those of the caches kept for reuse never exceed the budget fixed
//! at start. A finished sequence's cache is kept with the tokens it holds; a new prompt
//! that starts with some of those tokens copies that prefix (or takes the cache over, when
//! it extends all of it or room is short) and computes only the rest. Kept caches are
//! evicted least recently used first when room is needed.

use inferno_model::{KvCache, Model};

/// At most this many finished caches are kept, so matching a prompt stays cheap.
const MAX_CACHED: usize = 64;

/// Positions reserved, kept and allowed, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvUsage {
    /// Positions reserved by running sequences.
    pub reserved: usize,
    /// Positions held by finished sequences' caches kept for prefix reuse.
    pub cached: usize,
    pub budget: usize,
}

struct Cached {
    /// The tokens whose keys and values the cache holds (`kv.len()` of them).
    tokens: Vec<u32>,
    kv: KvCache,
    last_used: u64,
}

/// Whether a sequence needing some positions can start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    Now,
    /// Not until running sequences release their caches.
    Later,
    /// Never: it needs more than the whole budget.
    Never,
}

/// A cache handed to a starting sequence.
pub struct Granted {
    pub kv: KvCache,
    /// Leading prompt tokens whose keys and values the cache already holds.
    pub reused: usize,
}

pub struct KvPool {
    budget: usize,
    reserved: usize,
    cached_positions: usize,
    cached: Vec<Cached>,
    clock: u64,
}

impl KvPool {
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            reserved: 0,
            cached_positions: 0,
            cached: Vec::new(),
            clock: 0,
        }
    }

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            reserved: self.reserved,
            cached: self.cached_positions,
            budget: self.budget,
        }
    }

    /// The kept cache sharing the longest prefix with `prompt` (leaving its last token to
    /// compute, since its logits are needed), and that prefix's length.
    fn best_match(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        self.cached
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let n = c
                    .tokens
                    .iter()
                    .zip(usable)
                    .take_while(|(a, b)| a == b)
                    .count();
                (i, n)
            })
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.cached[i].last_used))
    }

    /// Whether a sequence with `prompt` needing `need` positions can start now.
    pub fn fit(&self, prompt: &[u32], need: usize) -> Fit {
        if need > self.budget {
            return Fit::Never;
        }
        let reusable = self
            .best_match(prompt)
            .is_some_and(|(i, _)| self.cached[i].kv.capacity() >= need);
        // Kept caches can all be evicted; taking one in place moves its positions from
        // kept to reserved.
        if reusable || self.reserved + need <= self.budget {
            Fit::Now
        } else {
            Fit::Later
        }
    }

    /// Reserves a cache of `need` positions for `prompt`, with as much of its prefix as a
    /// kept cache holds; `None` when it does not [`fit`](Self::fit) now.
    pub fn acquire(&mut self, model: &Model, prompt: &[u32], need: usize) -> Option<Granted> {
        if self.fit(prompt, need) != Fit::Now {
            return None;
        }
        self.clock += 1;
        let best = self.best_match(prompt);
        if let Some((i, n)) = best {
            let c = &self.cached[i];
            // Taken over in place (everything after the prefix overwritten) when the prompt
            // extends all it holds, as the next turn of a chat does (once this sequence is
            // kept, it would be redundant), or when a fresh cache would need room that other
            // kept caches hold. Otherwise it stays for the next prompt that shares it and
            // its prefix is copied: prompts that share only their first tokens (a template's
            // opening) must not use up each other's caches, nor a prompt sent again the
            // cache of its first sending.
            let extends = n == c.tokens.len();
            if c.kv.capacity() >= need && (extends || self.lacks_room_for(need)) {
                let c = self.cached.remove(i);
                let mut kv = c.kv;
                kv.truncate(n);
                self.cached_positions -= kv.capacity();
                self.reserved += kv.capacity();
                return Some(Granted { kv, reused: n });
            }
        }
        // A fresh cache. The matching kept one (if any) is set aside while others are
        // evicted, and goes last, only if the budget needs its room too.
        let mut source = best.map(|(i, n)| (self.cached.remove(i), n));
        while self.lacks_room_for(need) {
            if let Some(v) = self.lru() {
                self.evict(v);
            } else if let Some((c, _)) = source.take() {
                self.cached_positions -= c.kv.capacity();
            } else {
                break;
            }
        }
        let mut kv = model.new_kv_cache(need);
        let mut reused = 0;
        if let Some((mut c, n)) = source {
            reused = kv.copy_prefix_from(&c.kv, n);
            c.last_used = self.clock;
            self.cached.push(c);
        }
        self.reserved += kv.capacity();
        Some(Granted { kv, reused })
    }

    /// Whether a fresh cache of `need` positions would take room that kept caches hold.
    fn lacks_room_for(&self, need: usize) -> bool {
        self.reserved + self.cached_positions + need > self.budget
    }

    /// The least recently used kept cache.
    fn lru(&self) -> Option<usize> {
        (0..self.cached.len()).min_by_key(|&i| self.cached[i].last_used)
    }

    fn evict(&mut self, i: usize) {
        let c = self.cached.remove(i);
        self.cached_positions -= c.kv.capacity();
    }

    /// Takes back a running sequence's cache. With `tokens` (those whose keys and values
    /// it holds, at least `kv.len()` of them) it is kept for prefix reuse; without, freed.
    pub fn release(&mut self, kv: KvCache, tokens: Option<&[u32]>) {
        self.reserved = self.reserved.saturating_sub(kv.capacity());
        let Some(tokens) = tokens else { return };
        let n = kv.len().min(tokens.len());
        if n == 0 {
            return;
        }
        let tokens = &tokens[..n];
        // A kept cache whose tokens this one extends (an earlier turn of the same chat, the
        // same prompt) is redundant now.
        let mut i = 0;
        while i < self.cached.len() {
            if tokens.starts_with(&self.cached[i].tokens) {
                self.evict(i);
            } else {
                i += 1;
            }
        }
        if self.cached.len() >= MAX_CACHED {
            if let Some(v) = self.lru() {
                self.evict(v);
            }
        }
        self.clock += 1;
        self.cached_positions += kv.capacity();
        self.cached.push(Cached {
            tokens: tokens.to_vec(),
            kv,
            last_used: self.clock,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferno_backend::{create_backend, BackendOptions};
    use inferno_gguf::GgufFile;
    use inferno_model::synth::{self, SynthSpec};
    use inferno_tensor::GgmlType;

    fn demo() -> Model {
        let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
        let gguf = GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap();
        let be = create_backend("scalar", &BackendOptions::default()).unwrap();
        Model::load(&gguf, be).unwrap()
    }

    /// The positions reserved and kept.
    fn reserved_and_kept(pool: &KvPool) -> (usize, usize) {
        (pool.usage().reserved, pool.usage().cached)
    }

    /// A cache holding `tokens` (its contents are not looked at here).
    fn filled(model: &Model, cap: usize, tokens: &[u32]) -> KvCache {
        let mut kv = model.new_kv_cache(cap);
        kv.advance(tokens.len());
        kv
    }

    #[test]
    fn admission_never_over_commits_and_evicts_least_recently_used() {
        let m = demo();
        let mut pool = KvPool::new(100);
        assert_eq!(pool.fit(&[1, 2, 3], 101), Fit::Never);
        let a = pool.acquire(&m, &[1, 2, 3], 60).unwrap();
        assert_eq!(a.reused, 0);
        // 60 reserved: another 60 must wait; 40 fits.
        assert_eq!(pool.fit(&[9, 9], 60), Fit::Later);
        assert!(pool.acquire(&m, &[9, 9], 60).is_none());
        let b = pool.acquire(&m, &[7, 7], 40).unwrap();
        assert_eq!(pool.usage().reserved, 100);

        // Finished caches are kept, and evicted oldest first when room is needed.
        let mut kv = a.kv;
        kv.advance(3);
        pool.release(kv, Some(&[1, 2, 3]));
        assert_eq!(
            pool.usage(),
            KvUsage {
                reserved: 40,
                cached: 60,
                budget: 100
            }
        );
        let c = pool.acquire(&m, &[5, 5, 5], 50).unwrap();
        assert_eq!(c.reused, 0);
        assert_eq!(
            pool.usage(),
            KvUsage {
                reserved: 90,
                cached: 0,
                budget: 100
            }
        );
        pool.release(b.kv, None);
        pool.release(c.kv, None);
        assert_eq!(pool.usage().reserved + pool.usage().cached, 0);
    }

    #[test]
    fn a_kept_prefix_is_copied_or_taken_over_and_its_last_token_recomputed() {
        let m = demo();
        let mut pool = KvPool::new(1000);
        let history = [1, 2, 3, 4, 5, 6];
        pool.release(filled(&m, 10, &history), Some(&history));
        // A prompt sharing part of it: all but the prompt's last token come from it, copied
        // into a fresh cache, and the kept one stays for the next prompt that shares it.
        let g = pool.acquire(&m, &[1, 2, 3, 4], 8).unwrap();
        assert_eq!((g.reused, g.kv.len(), g.kv.capacity()), (3, 3, 8));
        assert_eq!(reserved_and_kept(&pool), (8, 10));
        let mut kv = g.kv;
        kv.advance(2); // the prompt's last token and one generated token ran
        pool.release(kv, Some(&[1, 2, 3, 4, 9]));
        assert_eq!(reserved_and_kept(&pool), (0, 18));
        // The same prompt again finds it too (the newer of two equal matches).
        let g = pool.acquire(&m, &[1, 2, 3, 4], 8).unwrap();
        assert_eq!((g.reused, g.kv.capacity()), (3, 8));
        assert_eq!(reserved_and_kept(&pool), (8, 18));
        pool.release(g.kv, None);
        // A prompt that extends all a kept cache holds, too big for it: copied.
        let g = pool.acquire(&m, &[1, 2, 3, 4, 9, 8, 7], 50).unwrap();
        assert_eq!((g.reused, g.kv.capacity()), (5, 50));
        assert_eq!(reserved_and_kept(&pool), (50, 18));
        // Releasing a cache that extends a kept one replaces it.
        let mut kv = g.kv;
        kv.advance(2);
        pool.release(kv, Some(&[1, 2, 3, 4, 9, 8, 7]));
        assert_eq!(reserved_and_kept(&pool), (0, 60));
        // One that extends all of a kept cache and fits in it takes it over in place.
        let g = pool.acquire(&m, &[1, 2, 3, 4, 9, 8, 7, 6], 20).unwrap();
        assert_eq!((g.reused, g.kv.len(), g.kv.capacity()), (7, 7, 50));
        assert_eq!(reserved_and_kept(&pool), (50, 10));
        pool.release(g.kv, None);
        // No shared first token: nothing reused.
        let g = pool.acquire(&m, &[42, 1, 2], 5).unwrap();
        assert_eq!(g.reused, 0);
    }

    #[test]
    fn a_shared_opening_takes_a_kept_cache_over_only_when_room_is_short() {
        let m = demo();
        let kept = [1, 2, 3, 4, 5];
        // Room for a fresh cache beside the kept one: the kept one stays.
        let mut pool = KvPool::new(20);
        pool.release(filled(&m, 10, &kept), Some(&kept));
        let g = pool.acquire(&m, &[1, 2, 9, 9], 8).unwrap();
        assert_eq!((g.reused, g.kv.capacity()), (2, 8));
        assert_eq!(reserved_and_kept(&pool), (8, 10));
        // No room: taken over rather than evicted.
        let mut pool = KvPool::new(15);
        pool.release(filled(&m, 10, &kept), Some(&kept));
        let g = pool.acquire(&m, &[1, 2, 9, 9], 8).unwrap();
        assert_eq!((g.reused, g.kv.len(), g.kv.capacity()), (2, 2, 10));
        assert_eq!(reserved_and_kept(&pool), (10, 0));
    }
}
