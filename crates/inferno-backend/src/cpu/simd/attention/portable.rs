//! Attention without a vector path (and for shapes the vector code does not cover, e.g.
//! odd head sizes): the scalar backend's online softmax.

use crate::{AttentionShape, KvRows};

/// Attention for one query token and all query heads sharing one KV head, with the scalar
/// backend's online softmax. `q` and `out` hold the group's heads back to back.
#[allow(clippy::too_many_arguments)]
pub fn attend_group(
    s: &AttentionShape,
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    kv_len: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    for (qh, acc) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        crate::cpu::scalar::attend_head(qh, k, v, hd, kv_len, s.scale, acc);
    }
}
