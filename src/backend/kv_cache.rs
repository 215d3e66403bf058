//! The key/value cache of one sequence: allocated once for a fixed number of positions, it
//! knows how many of them hold the sequence's history so far. It lives where the executor
//! that fills it runs: host memory, or device memory on the `gpu` backend.

use super::gpu::GpuKv;

/// Per layer, keys and values laid out `[n_kv_heads][capacity][head_dim]` in f32, so one
/// head's history is contiguous for the attention kernel.
pub struct KvCache {
    capacity: usize,
    /// Positions `0..len` hold valid keys and values.
    len: usize,
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    store: Store,
}

enum Store {
    Host { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
    Gpu(GpuKv),
}

impl KvCache {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let per_layer = n_kv_heads * capacity * head_dim;
        Self {
            capacity,
            len: 0,
            n_layers,
            n_kv_heads,
            head_dim,
            store: Store::Host {
                k: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
                v: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
            },
        }
    }

    /// A cache whose keys and values live in device memory.
    pub(crate) fn on_gpu(kv: GpuKv, n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            capacity: kv.capacity(),
            len: 0,
            n_layers,
            n_kv_heads,
            head_dim,
            store: Store::Gpu(kv),
        }
    }

    /// Whether the keys and values live in device memory.
    pub fn on_device(&self) -> bool {
        matches!(self.store, Store::Gpu(_))
    }

    /// The device cache, when this cache lives on the GPU.
    pub(crate) fn gpu(&self) -> Option<&GpuKv> {
        match &self.store {
            Store::Gpu(kv) => Some(kv),
            Store::Host { .. } => None,
        }
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions that hold the sequence so far (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions still free.
    pub fn room(&self) -> usize {
        self.capacity - self.len
    }

    /// Forgets every position from `len` on (e.g. to keep only a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets the whole sequence (the memory stays).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Marks `n` more positions as filled, once every layer has stored them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.capacity);
    }

    /// Layers, KV heads and head size.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.n_layers, self.n_kv_heads, self.head_dim)
    }

    /// Whether `other` has the same layers and heads and lives in the same memory (so
    /// positions can be copied across).
    pub fn same_shape(&self, other: &KvCache) -> bool {
        self.shape() == other.shape() && self.on_device() == other.on_device()
    }

    /// Replaces this cache's contents with the first `n` positions of `other` (a shared
    /// prompt prefix): copying is far cheaper than recomputing them. Returns the positions
    /// copied, which is `n` capped by both capacities and `other`'s length; 0 when the
    /// shapes differ.
    pub fn copy_prefix_from(&mut self, other: &KvCache, n: usize) -> usize {
        if !self.same_shape(other) {
            self.len = 0;
            return 0;
        }
        let n = n.min(other.len).min(self.capacity);
        let (hd, heads, cap) = (self.head_dim, self.n_kv_heads, self.capacity);
        match (&mut self.store, &other.store) {
            (Store::Gpu(dst), Store::Gpu(src)) => dst.copy_prefix_from(src, n),
            (Store::Host { k, v }, Store::Host { k: ok, v: ov }) => {
                for (dst, src) in [(k, ok), (v, ov)] {
                    for (dl, sl) in dst.iter_mut().zip(src.iter()) {
                        for h in 0..heads {
                            let d0 = h * cap * hd;
                            let s0 = h * other.capacity * hd;
                            dl[d0..d0 + n * hd].copy_from_slice(&sl[s0..s0 + n * hd]);
                        }
                    }
                }
            }
            // Different memories were ruled out by `same_shape`.
            _ => return 0,
        }
        self.len = n;
        n
    }

    /// Stores `n_tokens` rows of keys and values (`n_tokens × n_kv_heads × head_dim`) at
    /// positions `pos0 ..`.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let (row, cap) = (self.n_kv_heads * hd, self.capacity);
        // A device cache is filled by the GPU kernels; the host path never stores into it.
        let Store::Host { k: kc, v: vc } = &mut self.store else {
            return;
        };
        let (Some(kl), Some(vl)) = (kc.get_mut(layer), vc.get_mut(layer)) else {
            return;
        };
        for (t, (kt, vt)) in k.chunks_exact(row).zip(v.chunks_exact(row)).enumerate() {
            for h in 0..self.n_kv_heads {
                let dst = (h * cap + pos0 + t) * hd;
                kl[dst..dst + hd].copy_from_slice(&kt[h * hd..(h + 1) * hd]);
                vl[dst..dst + hd].copy_from_slice(&vt[h * hd..(h + 1) * hd]);
            }
        }
    }

    /// Layer `layer`'s keys and values in host memory (empty for a device cache, which the
    /// host kernels never see: a step checks where its caches live before it starts).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        let Store::Host { k, v } = &self.store else {
            return (&[], &[]);
        };
        match (k.get(layer), v.get(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => (&[], &[]),
        }
    }

    pub fn bytes(&self) -> usize {
        Self::bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim) * self.capacity
    }

    /// Bytes one position takes in a cache of this shape (keys and values, every layer).
    pub fn bytes_per_token(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> usize {
        2 * n_layers * n_kv_heads * head_dim * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::KvCache;

    #[test]
    fn prefix_copy_moves_every_head_across_capacities() {
        let (layers, heads, hd) = (2, 2, 3);
        let mut a = KvCache::new(layers, heads, hd, 4);
        for l in 0..layers {
            let k: Vec<f32> = (0..4 * heads * hd).map(|i| (l * 100 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            a.store(l, 0, &k, &v);
        }
        a.advance(4);
        let mut b = KvCache::new(layers, heads, hd, 9);
        assert_eq!(b.copy_prefix_from(&a, 3), 3);
        assert_eq!(b.len(), 3);
        for l in 0..layers {
            let (ak, av) = a.layer(l);
            let (bk, bv) = b.layer(l);
            for h in 0..heads {
                for p in 0..3 {
                    let ai = (h * 4 + p) * hd;
                    let bi = (h * 9 + p) * hd;
                    assert_eq!(ak[ai..ai + hd], bk[bi..bi + hd]);
                    assert_eq!(av[ai..ai + hd], bv[bi..bi + hd]);
                }
            }
        }
        // Never more than the source holds.
        a.truncate(2);
        assert_eq!(b.copy_prefix_from(&a, 3), 2);
    }
}
