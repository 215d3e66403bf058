//! The key/value cache of one sequence: allocated once for a fixed number of positions, it
//! knows how many of them hold the sequence's history so far.

/// Per layer, keys and values laid out `[n_kv_heads][capacity][head_dim]` in f32, so one
/// head's history is contiguous for the attention kernel.
pub struct KvCache {
    capacity: usize,
    /// Positions `0..len` hold valid keys and values.
    len: usize,
    n_kv_heads: usize,
    head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let per_layer = n_kv_heads * capacity * head_dim;
        Self {
            capacity,
            len: 0,
            n_kv_heads,
            head_dim,
            k: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
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
        (self.k.len(), self.n_kv_heads, self.head_dim)
    }

    /// Whether `other` has the same layers and heads (so positions can be copied across).
    pub fn same_shape(&self, other: &KvCache) -> bool {
        self.shape() == other.shape()
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
        let hd = self.head_dim;
        for (dst, src) in [(&mut self.k, &other.k), (&mut self.v, &other.v)] {
            for (dl, sl) in dst.iter_mut().zip(src.iter()) {
                for h in 0..self.n_kv_heads {
                    let d0 = h * self.capacity * hd;
                    let s0 = h * other.capacity * hd;
                    dl[d0..d0 + n * hd].copy_from_slice(&sl[s0..s0 + n * hd]);
                }
            }
        }
        self.len = n;
        n
    }

    /// Stores `n_tokens` rows of keys and values (`n_tokens × n_kv_heads × head_dim`) at
    /// positions `pos0 ..`.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let row = self.n_kv_heads * hd;
        for (t, (kt, vt)) in k.chunks_exact(row).zip(v.chunks_exact(row)).enumerate() {
            for h in 0..self.n_kv_heads {
                let dst = (h * self.capacity + pos0 + t) * hd;
                self.k[layer][dst..dst + hd].copy_from_slice(&kt[h * hd..(h + 1) * hd]);
                self.v[layer][dst..dst + hd].copy_from_slice(&vt[h * hd..(h + 1) * hd]);
            }
        }
    }

    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    pub fn bytes(&self) -> usize {
        2 * self.k.iter().map(|l| l.len() * 4).sum::<usize>()
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
