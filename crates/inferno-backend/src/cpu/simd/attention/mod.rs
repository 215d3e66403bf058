//! Attention on the host: how one call is cut into work items (KV heads × blocks of query
//! tokens) and, for long histories, into partitions of cached positions that threads fill
//! apart and fold in order, so the result is the same at any thread count. The kernels are
//! beside this file: `x86.rs` (AVX2 / AVX-512) and `portable.rs` (the scalar reference's
//! online softmax, for other CPUs and shapes).

pub(super) mod portable;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::{Kernels, OutPtr};
use crate::{AttentionShape, KvLayer};

impl Kernels {
    /// Query tokens one attention work item takes: on the x86 vector path as many as fill
    /// [`x86::MAX_ROWS`] rows with their heads of one KV head (so a prompt's tokens share
    /// each key and value read), elsewhere one.
    fn attention_tokens_per_item(&self, s: &AttentionShape) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self.isa.x86_vector() && s.head_dim.is_multiple_of(8) && s.n_kv_heads > 0 {
            return (x86::MAX_ROWS / (s.n_heads / s.n_kv_heads).max(1)).max(1);
        }
        let _ = s;
        1
    }

    /// Work items of one attention call, for splitting it across threads: each is one KV
    /// head with a block of consecutive query tokens (see [`Kernels::attention`]).
    pub fn attention_items(&self, s: &AttentionShape) -> usize {
        s.n_tokens.div_ceil(self.attention_tokens_per_item(s)) * s.n_kv_heads
    }

    /// Partitions of cached positions one attention call can be split into across threads
    /// by [`Kernels::attention_partial`] and [`Kernels::attention_merge`], with the bits of
    /// [`Kernels::attention`]: more than one only on the x86 vector path, for a call whose
    /// query tokens form one work item per KV head (decode), over more than one partition.
    pub fn attention_parts(&self, s: &AttentionShape) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self.isa.x86_vector()
            && s.head_dim.is_multiple_of(8)
            && s.n_kv_heads > 0
            && s.n_tokens <= self.attention_tokens_per_item(s)
        {
            return (s.pos0 + s.n_tokens).div_ceil(x86::PART).max(1);
        }
        let _ = s;
        1
    }

    /// Floats of scratch one (KV head, partition) item of a split attention needs.
    pub fn attention_part_floats(&self, s: &AttentionShape) -> usize {
        #[cfg(target_arch = "x86_64")]
        return x86::MAX_ROWS * (s.head_dim + 2);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = s;
            0
        }
    }

    /// Items `i0..i1` of a split attention (item `kvh * parts + p`: KV head `kvh`, partition
    /// `p` of [`Kernels::attention_parts`]), each writing its rows' partial softmax to its
    /// [`Kernels::attention_part_floats`] floats of `scratch`.
    ///
    /// # Safety
    /// `scratch` holds `n_kv_heads * parts` items; no other thread writes this call's items.
    #[allow(clippy::too_many_arguments, unused_variables)]
    pub unsafe fn attention_partial(
        &self,
        s: &AttentionShape,
        q: &[f32],
        kv: KvLayer<'_>,
        scratch: OutPtr,
        i0: usize,
        i1: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let parts = self.attention_parts(s);
            let hd = s.head_dim;
            let width = self.attention_width;
            let per = self.attention_part_floats(s);
            for item in i0..i1.min(parts * s.n_kv_heads) {
                let (kvh, part) = (item / parts, item % parts);
                let (k, v, rows, n) =
                    self.attention_rows(s, q, kv, kvh, OutPtr(std::ptr::null_mut()));
                let mut state = [x86::PartState::EMPTY; x86::MAX_ROWS];
                // SAFETY: this item's scratch is its own; the rows, ISA and shapes are those
                // `attention` checks and uses.
                unsafe {
                    let base = scratch.0.add(item * per);
                    let range = (part * x86::PART, (part + 1) * x86::PART);
                    x86::attend_rows_partial(width, s, &rows[..n], k, v, range, base, &mut state);
                    for (h, st) in state.iter().enumerate().take(n) {
                        *base.add(x86::MAX_ROWS * hd + 2 * h) = st.max;
                        *base.add(x86::MAX_ROWS * hd + 2 * h + 1) = st.denom;
                    }
                }
            }
        }
    }

    /// Folds the partitions of KV heads `kvh0..kvh1` of a split attention, in order, into
    /// their output rows, normalized: the bits [`Kernels::attention`] writes.
    ///
    /// # Safety
    /// `scratch` holds every item written by [`Kernels::attention_partial`]; `out` as for
    /// [`Kernels::attention`], these heads being this call's alone.
    #[allow(clippy::too_many_arguments, unused_variables)]
    pub unsafe fn attention_merge(
        &self,
        s: &AttentionShape,
        q: &[f32],
        kv: KvLayer<'_>,
        scratch: OutPtr,
        out: OutPtr,
        out_len: usize,
        (kvh0, kvh1): (usize, usize),
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let parts = self.attention_parts(s);
            let hd = s.head_dim;
            let per = self.attention_part_floats(s);
            for kvh in kvh0..kvh1.min(s.n_kv_heads) {
                let (_, _, rows, n) = self.attention_rows(s, q, kv, kvh, out);
                assert!(rows[..n].iter().all(|r| {
                    // SAFETY: only compares addresses.
                    let end = unsafe { out.0.add(out_len) };
                    r.out.wrapping_add(hd) <= end
                }));
                for (h, row) in rows[..n].iter().enumerate() {
                    let mut total = x86::PartState::EMPTY;
                    for part in 0..parts {
                        // SAFETY: item (kvh, part) of the scratch; the row's output is this
                        // call's (checked above); the ISA was checked at construction.
                        unsafe {
                            let base = scratch.0.add((kvh * parts + part) * per);
                            let st = x86::PartState {
                                max: *base.add(x86::MAX_ROWS * hd + 2 * h),
                                denom: *base.add(x86::MAX_ROWS * hd + 2 * h + 1),
                            };
                            x86::fold_part(hd, &mut total, row.out, st, base.add(h * hd));
                        }
                    }
                    // SAFETY: as above.
                    unsafe { x86::normalize_row(hd, total, row.out) };
                }
            }
        }
    }

    /// The query rows of KV head `kvh` for a call whose tokens form one work item (see
    /// [`Kernels::attention_parts`]), with their outputs in `out`, and that head's cache.
    #[cfg(target_arch = "x86_64")]
    fn attention_rows<'a>(
        &self,
        s: &AttentionShape,
        q: &[f32],
        kv: KvLayer<'a>,
        kvh: usize,
        out: OutPtr,
    ) -> (
        crate::KvRows<'a>,
        crate::KvRows<'a>,
        [x86::AttnRow; x86::MAX_ROWS],
        usize,
    ) {
        let hd = s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        let kv_max = s.pos0 + s.n_tokens;
        let r0 = kvh * s.capacity;
        let (k, v) = (
            kv.k.rows(r0, r0 + kv_max, hd),
            kv.v.rows(r0, r0 + kv_max, hd),
        );
        let mut rows = [x86::AttnRow {
            q: std::ptr::null(),
            out: std::ptr::null_mut(),
            kv_len: 0,
        }; x86::MAX_ROWS];
        let mut n = 0;
        for t in 0..s.n_tokens {
            for h in 0..group {
                let o = (t * s.n_heads + kvh * group + h) * hd;
                rows[n] = x86::AttnRow {
                    q: q[o..o + hd].as_ptr(),
                    out: out.0.wrapping_add(o),
                    kv_len: s.pos0 + t + 1,
                };
                n += 1;
            }
        }
        (k, v, rows, n)
    }

    /// The `p`-th work item of one attention call in order of decreasing cost: a prompt's
    /// last block of tokens (which sees the most keys) for every KV head first. Threads that
    /// take items `c, c + n, c + 2n, …` of this order get near-equal shares, and the last
    /// items any thread takes are the cheapest, so none waits long for another at the end.
    pub fn attention_item_by_cost(&self, s: &AttentionShape, p: usize) -> usize {
        let blocks = s
            .n_tokens
            .div_ceil(self.attention_tokens_per_item(s))
            .max(1);
        let kv = s.n_kv_heads.max(1);
        let (b, kvh) = (blocks - 1 - (p / kv) % blocks, p % kv);
        kvh * blocks + b
    }

    /// Attention work items `i0..i1` (clipped to [`Kernels::attention_items`]): item
    /// `kvh * blocks + b` is KV head `kvh` with every query head of it for the `b`-th block
    /// of query tokens. KV-head-major order gives each thread of a contiguous split whole
    /// heads over every token, so the causal triangle's cost spreads evenly.
    ///
    /// # Safety
    /// `out` points to `n_tokens × n_heads × head_dim` floats of which this call writes its
    /// items' heads; no other thread writes those during the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention(
        &self,
        s: &AttentionShape,
        q: &[f32],
        kv: KvLayer<'_>,
        out: OutPtr,
        out_len: usize,
        i0: usize,
        i1: usize,
    ) {
        let hd = s.head_dim;
        if s.n_kv_heads == 0 || hd == 0 {
            return;
        }
        let group = s.n_heads / s.n_kv_heads;
        let per = self.attention_tokens_per_item(s);
        let blocks = s.n_tokens.div_ceil(per);
        for item in i0..i1.min(blocks * s.n_kv_heads) {
            let (kvh, b) = (item / blocks, item % blocks);
            let tokens = b * per..((b + 1) * per).min(s.n_tokens);
            let kv_max = s.pos0 + tokens.end;
            let r0 = kvh * s.capacity;
            let (k, v) = (
                kv.k.rows(r0, r0 + kv_max, hd),
                kv.v.rows(r0, r0 + kv_max, hd),
            );
            // Token t's heads of this KV head: `group` rows from `base(t)`.
            let base = |t: usize| (t * s.n_heads + kvh * group) * hd;
            assert!(base(tokens.end - 1) + group * hd <= out_len.min(q.len()));
            #[cfg(target_arch = "x86_64")]
            if self.isa.x86_vector() && hd.is_multiple_of(8) {
                let width = self.attention_width;
                let mut rows = [x86::AttnRow {
                    q: std::ptr::null(),
                    out: std::ptr::null_mut(),
                    kv_len: 0,
                }; x86::MAX_ROWS];
                let mut n = 0;
                for t in tokens.clone() {
                    for h in 0..group {
                        let o = base(t) + h * hd;
                        rows[n] = x86::AttnRow {
                            q: q[o..o + hd].as_ptr(),
                            // SAFETY: inside `out` (checked above).
                            out: unsafe { out.0.add(o) },
                            kv_len: s.pos0 + t + 1,
                        };
                        n += 1;
                        if n == x86::MAX_ROWS {
                            // SAFETY: the ISA and head size were checked; every row's kv_len
                            // is within `k`/`v`; the rows' outputs are this item's alone.
                            unsafe { x86::attend_rows_any(width, s, &rows[..n], k, v) };
                            n = 0;
                        }
                    }
                }
                if n > 0 {
                    // SAFETY: as above.
                    unsafe { x86::attend_rows_any(width, s, &rows[..n], k, v) };
                }
                continue;
            }
            for t in tokens {
                let kv_len = s.pos0 + t + 1;
                let o = base(t);
                // SAFETY: in bounds (checked above) and owned by this item alone.
                let og = unsafe { std::slice::from_raw_parts_mut(out.0.add(o), group * hd) };
                portable::attend_group(
                    s,
                    &q[o..o + group * hd],
                    k.rows(0, kv_len, hd),
                    v.rows(0, kv_len, hd),
                    kv_len,
                    og,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::Isa;

    /// The cost order visits every item once, and a prompt's items by token block from the
    /// last: no item sees fewer keys than one after it.
    #[test]
    fn items_by_cost_are_a_permutation_dearest_first() {
        for isa in Isa::available() {
            let k = Kernels::new(isa);
            for (n_tokens, n_heads, n_kv_heads) in [(512, 16, 8), (37, 16, 8), (1, 8, 2), (9, 4, 4)]
            {
                let s = AttentionShape {
                    n_tokens,
                    pos0: 3,
                    n_heads,
                    n_kv_heads,
                    head_dim: 64,
                    capacity: 1024,
                    scale: 0.125,
                };
                let n = k.attention_items(&s);
                let per = k.attention_tokens_per_item(&s);
                let blocks = n_tokens.div_ceil(per);
                let order: Vec<usize> = (0..n).map(|p| k.attention_item_by_cost(&s, p)).collect();
                let mut seen = order.clone();
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    (0..n).collect::<Vec<_>>(),
                    "{isa:?} {n_tokens} tokens"
                );
                let last_token = |i: usize| ((i % blocks + 1) * per).min(n_tokens);
                assert!(
                    order
                        .windows(2)
                        .all(|w| last_token(w[0]) >= last_token(w[1])),
                    "{isa:?} {n_tokens} tokens: {order:?}"
                );
            }
        }
    }
}
