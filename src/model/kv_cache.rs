//! The key/value cache of one sequence, allocated once when the sequence starts.

/// Per layer, keys and values laid out `[n_kv_heads][capacity][head_dim]` in f32, so one
/// head's history is contiguous for the attention kernel.
pub struct KvCache {
    pub capacity: usize,
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
            n_kv_heads,
            head_dim,
            k: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
        }
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
}
