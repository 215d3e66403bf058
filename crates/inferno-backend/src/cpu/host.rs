//! The host executor: runs each [`Op`] of a step at once with a [`Backend`]'s kernels, on
//! activation buffers in host memory ([`HostScratch`]).

use crate::exec::{
    wanted_rows, with_first_rows, Buf, Executor, MoeFfn, Op, ScratchSpec, SeqStep, LOGITS,
};
use crate::{AttentionJob, AttentionShape, Backend, KvStore, MatmulJob};
use inferno_tensor::Matrix;

/// Most experts one step's batched expert products take (see [`moe_ffn`]).
const MAX_BATCHED_EXPERTS: usize = 32;

/// Most sequences one [`Backend::attention_batch`] call takes: a step of more makes more
/// calls, each from a list on the stack.
const MAX_ATTENTION_JOBS: usize = 16;
/// Products of one input handed to the backend together ([`Op::MatMulShared`]: a layer's
/// query, key and value projections are three).
const MAX_SHARED_PRODUCTS: usize = 4;

/// Host activation buffers for forward passes of up to `rows` token rows, sized once.
pub struct HostScratch {
    spec: ScratchSpec,
    bufs: Vec<Vec<f32>>,
    /// Logits of several sequences' rows, gathered into one product.
    logits: Vec<f32>,
    /// Mixture-of-experts routing: one row's expert probabilities, each row's chosen
    /// `(expert, weight)`s, the same grouped by expert (`(row, weight)`), and where each
    /// expert's group ends.
    probs: Vec<f32>,
    routes: Vec<(u32, f32)>,
    grouped: Vec<(u32, f32)>,
    ends: Vec<usize>,
}

impl HostScratch {
    pub fn new(spec: &ScratchSpec) -> Self {
        let rows = spec.rows.max(1);
        Self {
            spec: ScratchSpec {
                rows,
                ..spec.clone()
            },
            bufs: spec.widths.iter().map(|w| vec![0.0; rows * w]).collect(),
            logits: vec![0.0; spec.logit_rows * spec.vocab],
            probs: vec![0.0; spec.experts],
            routes: vec![(0, 0.0); rows * spec.experts_used],
            grouped: vec![(0, 0.0); rows * spec.experts_used],
            ends: vec![0; spec.experts],
        }
    }

    pub fn rows(&self) -> usize {
        self.spec.rows
    }
}

/// `out[t] += w · ys[i]` for the `i`-th `(t, w)` of `rows`, rows of `h` values: an expert's
/// outputs added to the rows they were routed from.
fn add_weighted(out: &mut [f32], ys: &[f32], rows: &[(u32, f32)], h: usize) {
    for (i, &(t, w)) in rows.iter().enumerate() {
        let t = t as usize;
        let dst = &mut out[t * h..(t + 1) * h];
        for (o, y) in dst.iter_mut().zip(&ys[i * h..(i + 1) * h]) {
            *o += y * w;
        }
    }
}

/// Runs [`Op::MoeFfn`] on host buffers: routing first (softmax, top-k, optional
/// renormalisation, each row on its own), then the rows grouped by expert, then each active
/// expert's three products over its group, scaled and summed into `out` in expert order.
fn moe_ffn(be: &dyn Backend, sc: &mut HostScratch, op: MoeFfn<'_>) {
    let n_experts = op.gate.len();
    let (rows, k) = (op.rows, op.used);
    let h = op.gate.first().map_or(0, |m| m.cols);
    let f = op.gate.first().map_or(0, |m| m.rows);
    if n_experts == 0 || k == 0 || sc.probs.len() < n_experts || sc.routes.len() < rows * k {
        // Sized from the same config the model was loaded with; nothing to do otherwise.
        return;
    }
    let logits = &sc.bufs[op.router.0];
    for t in 0..rows {
        let row = &logits[t * n_experts..(t + 1) * n_experts];
        let probs = &mut sc.probs[..n_experts];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for (p, &l) in probs.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += *p;
        }
        for p in probs.iter_mut() {
            *p /= sum;
        }
        let chosen = &mut sc.routes[t * k..(t + 1) * k];
        for j in 0..k {
            // The first maximum among the experts not chosen yet: among equal probabilities
            // the lower index wins. Chosen ones are skipped by index, not by value, so even
            // NaN logits pick `k` different experts (an expert's group never outgrows the
            // step's rows).
            let mut best: Option<usize> = None;
            for e in 0..n_experts {
                if chosen[..j].iter().any(|&(c, _)| c as usize == e) {
                    continue;
                }
                if best.is_none_or(|b| probs[e] > probs[b]) {
                    best = Some(e);
                }
            }
            let best = best.unwrap_or(0);
            chosen[j] = (best as u32, probs[best]);
        }
        if op.normalize {
            let total: f32 = chosen.iter().map(|&(_, w)| w).sum();
            for (_, w) in chosen.iter_mut() {
                *w /= total;
            }
        }
    }
    // Group the (row, weight) pairs by expert, rows ascending within each group.
    let ends = &mut sc.ends[..n_experts];
    ends.fill(0);
    for &(e, _) in &sc.routes[..rows * k] {
        ends[e as usize] += 1;
    }
    let mut at = 0;
    for c in ends.iter_mut() {
        let n = *c;
        *c = at;
        at += n;
    }
    for t in 0..rows {
        for &(e, w) in &sc.routes[t * k..(t + 1) * k] {
            let slot = &mut ends[e as usize];
            sc.grouped[*slot] = (t as u32, w);
            *slot += 1;
        }
    }
    // Taken out of the scratch for the loop and put back, so the buffers can be borrowed
    // side by side (moving a Vec allocates nothing).
    let mut xs = std::mem::take(&mut sc.bufs[op.xs.0]);
    let mut g = std::mem::take(&mut sc.bufs[op.g.0]);
    let mut u = std::mem::take(&mut sc.bufs[op.u.0]);
    let mut ys = std::mem::take(&mut sc.bufs[op.ys.0]);
    let mut out = std::mem::take(&mut sc.bufs[op.out.0]);
    let x = &sc.bufs[op.x.0];
    out[..rows * h].fill(0.0);
    let slots = rows * k;
    let active = sc.ends[..n_experts]
        .iter()
        .scan(0, |start, &end| {
            let c = end - *start;
            *start = end;
            Some(c)
        })
        .filter(|&c| c > 0)
        .count();
    if 2 * slots <= sc.spec.rows && active <= MAX_BATCHED_EXPERTS {
        // Few rows (decode): every active expert's gate and up products in one batch, then
        // every down product in another, so a multi-threaded backend wakes its threads
        // twice per layer instead of three times per expert. Each expert's rows sit at its
        // slots (the grouped order); gate outputs fill the first `slots` rows of `g`, up
        // outputs the next. The products, SiLU and sums are those of the loop below.
        let one_row = rows == 1;
        if !one_row {
            for (i, &(t, _)) in sc.grouped[..slots].iter().enumerate() {
                let t = t as usize;
                xs[i * h..(i + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
            }
        }
        let input = |s0: usize, c: usize| -> &[f32] {
            if one_row {
                // The one row is every expert's input: quantized once for all of them.
                &x[..h]
            } else {
                &xs[s0 * h..(s0 + c) * h]
            }
        };
        let dummy = MatmulJob {
            w: &op.gate[0],
            x: &[],
            n: 0,
            at: 0,
        };
        let mut jobs = [dummy; 2 * MAX_BATCHED_EXPERTS];
        let mut count = 0;
        for (proj, base) in [(op.gate, 0), (op.up, slots * f)] {
            let mut s0 = 0;
            for (e, &end) in sc.ends[..n_experts].iter().enumerate() {
                let c = end - s0;
                if c > 0 {
                    jobs[count] = MatmulJob {
                        w: &proj[e],
                        x: input(s0, c),
                        n: c,
                        at: base + s0 * f,
                    };
                    count += 1;
                }
                s0 = end;
            }
        }
        be.matmul_batch(&jobs[..count], &mut g[..2 * slots * f]);
        let (gates, ups) = g[..2 * slots * f].split_at_mut(slots * f);
        let mut s0 = 0;
        for &end in &sc.ends[..n_experts] {
            if end > s0 {
                // Per expert, as in the loop below (the same element ranges).
                be.silu_mul(&mut gates[s0 * f..end * f], &ups[s0 * f..end * f]);
            }
            s0 = end;
        }
        let gates: &[f32] = gates;
        let mut jobs = [dummy; MAX_BATCHED_EXPERTS];
        count = 0;
        let mut s0 = 0;
        for (e, &end) in sc.ends[..n_experts].iter().enumerate() {
            let c = end - s0;
            if c > 0 {
                jobs[count] = MatmulJob {
                    w: &op.down[e],
                    x: &gates[s0 * f..end * f],
                    n: c,
                    at: s0 * h,
                };
                count += 1;
            }
            s0 = end;
        }
        be.matmul_batch(&jobs[..count], &mut ys[..slots * h]);
        add_weighted(&mut out, &ys, &sc.grouped[..slots], h);
    } else {
        let mut start = 0;
        for e in 0..n_experts {
            let end = sc.ends[e];
            let group = &sc.grouped[start..end];
            start = end;
            let c = group.len();
            if c == 0 {
                continue;
            }
            for (i, &(t, _)) in group.iter().enumerate() {
                let t = t as usize;
                xs[i * h..(i + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
            }
            be.matmul(&op.gate[e], &xs[..c * h], c, &mut g[..c * f]);
            be.matmul(&op.up[e], &xs[..c * h], c, &mut u[..c * f]);
            be.silu_mul(&mut g[..c * f], &u[..c * f]);
            be.matmul(&op.down[e], &g[..c * f], c, &mut ys[..c * h]);
            add_weighted(&mut out, &ys, group, h);
        }
    }
    sc.bufs[op.xs.0] = xs;
    sc.bufs[op.g.0] = g;
    sc.bufs[op.u.0] = u;
    sc.bufs[op.ys.0] = ys;
    sc.bufs[op.out.0] = out;
}

/// Where the rows of the current logits block go.
#[derive(Clone, Copy)]
enum Target {
    /// The scratch's logits, copied to their sequences when the block ends.
    Gathered { first: usize, count: usize },
    /// Straight into sequence `index`'s own buffer.
    Seq(usize),
}

/// One step on the host: the kernels, the buffers and the step's sequences.
pub(crate) struct HostExec<'s, 'a> {
    be: &'s dyn Backend,
    sc: &'s mut HostScratch,
    seqs: &'s mut [SeqStep<'a>],
    rows: usize,
    target: Option<Target>,
}

/// The attention of sequence `s`, whose rows start at row `r0` of the step's queries `q`.
fn attention_job<'x>(
    r0: usize,
    s: &'x SeqStep<'_>,
    q: &'x [f32],
    layer: usize,
    n_heads: usize,
    scale: f32,
) -> AttentionJob<'x> {
    let m = s.tokens.len();
    let (_, n_kv_heads, head_dim) = s.kv.shape();
    let w = n_heads * head_dim;
    AttentionJob {
        shape: AttentionShape {
            n_tokens: m,
            pos0: s.kv.len(),
            n_heads,
            n_kv_heads,
            head_dim,
            capacity: s.kv.capacity(),
            scale,
        },
        q: &q[r0 * w..(r0 + m) * w],
        kv: s.kv.layer(layer),
        at: r0 * w,
    }
}

/// `(&bufs[read], &mut bufs[write])` for two different buffers.
fn read_write(bufs: &mut [Vec<f32>], read: usize, write: usize) -> (&[f32], &mut [f32]) {
    assert_ne!(read, write, "an operation reads and writes the same buffer");
    if read < write {
        let (a, b) = bufs.split_at_mut(write);
        (&a[read], &mut b[0])
    } else {
        let (a, b) = bufs.split_at_mut(read);
        (&b[0], &mut a[write])
    }
}

impl HostExec<'_, '_> {
    /// [`Op::MatMulShared`]: the output buffers are moved out of the scratch (no allocation)
    /// so the backend can write them all while reading `x`, then put back.
    fn matmul_shared(&mut self, x: Buf, rows: usize, products: &[(&Matrix, Buf)]) {
        for part in products.chunks(MAX_SHARED_PRODUCTS) {
            let cols = part[0].0.cols;
            let mut taken: [Vec<f32>; MAX_SHARED_PRODUCTS] = Default::default();
            for (t, &(w, out)) in taken.iter_mut().zip(part) {
                assert!(
                    w.cols == cols && out != x && out != LOGITS,
                    "matmul_shared: products of one input into other buffers"
                );
                // A buffer named twice is empty the second time: the slicing below fails.
                *t = std::mem::take(&mut self.sc.bufs[out.0]);
            }
            let mut ws = [part[0].0; MAX_SHARED_PRODUCTS];
            let mut outs: [&mut [f32]; MAX_SHARED_PRODUCTS] = Default::default();
            for (((w, o), t), &(pw, _)) in ws.iter_mut().zip(&mut outs).zip(&mut taken).zip(part) {
                *w = pw;
                *o = &mut t[..rows * pw.rows];
            }
            let n = part.len();
            self.be.matmul_shared(
                &ws[..n],
                &self.sc.bufs[x.0][..rows * cols],
                rows,
                &mut outs[..n],
            );
            for (t, &(_, out)) in taken.iter_mut().zip(part) {
                self.sc.bufs[out.0] = std::mem::take(t);
            }
        }
    }
}

impl<'s, 'a> HostExec<'s, 'a> {
    pub(crate) fn new(
        be: &'s dyn Backend,
        sc: &'s mut HostScratch,
        seqs: &'s mut [SeqStep<'a>],
    ) -> Self {
        let rows = seqs.iter().map(|s| s.tokens.len()).sum();
        Self {
            be,
            sc,
            seqs,
            rows,
            target: None,
        }
    }

    fn width(&self, b: Buf) -> usize {
        if b == LOGITS {
            self.sc.spec.vocab
        } else {
            self.sc.spec.widths[b.0]
        }
    }

    /// Reads `x`'s first `x_len` values and writes `out`'s first `out_len` (the logits
    /// block's destination when `out` is [`LOGITS`]).
    fn io(&mut self, x: Buf, x_len: usize, out: Buf, out_len: usize) -> (&[f32], &mut [f32]) {
        if out == LOGITS {
            let src = &self.sc.bufs[x.0][..x_len];
            let dst = match self.target {
                Some(Target::Seq(i)) => self.seqs[i].logits.buffer(),
                _ => &mut self.sc.logits[..],
            };
            return (src, &mut dst[..out_len]);
        }
        let (src, dst) = read_write(&mut self.sc.bufs, x.0, out.0);
        (&src[..x_len], &mut dst[..out_len])
    }

    /// Copies a finished gathered block to the sequences that asked for its rows.
    fn deliver(&mut self, first: usize, count: usize) {
        let vocab = self.sc.spec.vocab;
        let mut idx = 0;
        for s in self.seqs.iter_mut() {
            let rows = s.logits.rows(s.tokens.len());
            let out = s.logits.buffer();
            for r in 0..rows {
                if (first..first + count).contains(&idx) {
                    let from = (idx - first) * vocab;
                    out[r * vocab..(r + 1) * vocab]
                        .copy_from_slice(&self.sc.logits[from..from + vocab]);
                }
                idx += 1;
            }
        }
    }
}

impl Executor for HostExec<'_, '_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn run(&mut self, op: Op<'_>) {
        let be = self.be;
        match op {
            Op::Embed { table, out } => {
                let h = table.cols;
                let buf = &mut self.sc.bufs[out.0];
                let ids = self.seqs.iter().flat_map(|s| s.tokens.iter());
                for (t, &id) in ids.enumerate() {
                    be.get_row(table, id as usize, &mut buf[t * h..(t + 1) * h]);
                }
            }
            Op::RmsNorm {
                src,
                dst,
                rows,
                gain,
                eps,
            } => {
                let len = rows * gain.len();
                if src == dst {
                    be.rms_norm(&mut self.sc.bufs[dst.0][..len], gain, eps);
                } else {
                    let (s, d) = self.io(src, len, dst, len);
                    d.copy_from_slice(s);
                    be.rms_norm(d, gain, eps);
                }
            }
            Op::MatMul { w, x, rows, out } => {
                let (x, out) = self.io(x, rows * w.cols, out, rows * w.rows);
                be.matmul(w, x, rows, out);
            }
            Op::MatMulShared { x, rows, products } => self.matmul_shared(x, rows, products),
            Op::AddBias { x, rows, bias } => {
                be.add_bias(&mut self.sc.bufs[x.0][..rows * bias.len()], bias);
            }
            Op::Rope {
                x,
                n_heads,
                head_dim,
                inv_freq,
            } => {
                let w = n_heads * head_dim;
                let buf = &mut self.sc.bufs[x.0];
                let mut r0 = 0;
                for s in self.seqs.iter() {
                    let m = s.tokens.len();
                    // The cache's length moves only after the last layer: it is the
                    // position of the sequence's first new token in every layer.
                    let pos0 = s.kv.len();
                    be.rope(
                        &mut buf[r0 * w..(r0 + m) * w],
                        n_heads,
                        head_dim,
                        pos0,
                        inv_freq,
                    );
                    r0 += m;
                }
            }
            Op::StoreKv { layer, k, v } => {
                let w = self.width(k);
                let (kb, vb) = (&self.sc.bufs[k.0], &self.sc.bufs[v.0]);
                // The keys' and values' parts of up to MAX_ATTENTION_JOBS sequences at a
                // time, on the stack (nothing allocated per step).
                let mut parts: [KvStore<'_>; 2 * MAX_ATTENTION_JOBS] =
                    std::array::from_fn(|_| KvStore::default());
                let (mut count, mut r0) = (0, 0);
                for s in self.seqs.iter_mut() {
                    let m = s.tokens.len();
                    let pos0 = s.kv.len();
                    let rows = r0 * w..(r0 + m) * w;
                    r0 += m;
                    let Some([pk, pv]) =
                        s.kv.store_parts(layer, pos0, &kb[rows.clone()], &vb[rows])
                    else {
                        continue;
                    };
                    (parts[count], parts[count + 1]) = (pk, pv);
                    count += 2;
                    if count == parts.len() {
                        be.store_kv(&mut parts);
                        count = 0;
                    }
                }
                be.store_kv(&mut parts[..count]);
            }
            Op::Attention {
                layer,
                q,
                out,
                n_heads,
                scale,
            } => {
                let (qb, ob) = read_write(&mut self.sc.bufs, q.0, out.0);
                let job = |r0, s| attention_job(r0, s, qb, layer, n_heads, scale);
                let Some(first) = self.seqs.first() else {
                    return;
                };
                let mut jobs = [job(0, first); MAX_ATTENTION_JOBS];
                let mut count = 0;
                for (r0, s) in with_first_rows(self.seqs) {
                    jobs[count] = job(r0, s);
                    count += 1;
                    if count == MAX_ATTENTION_JOBS {
                        be.attention_batch(&jobs, ob);
                        count = 0;
                    }
                }
                if count > 0 {
                    be.attention_batch(&jobs[..count], ob);
                }
            }
            Op::SiluMul { gate, up, rows } => {
                let len = rows * self.width(gate);
                let (u, g) = read_write(&mut self.sc.bufs, up.0, gate.0);
                be.silu_mul(&mut g[..len], &u[..len]);
            }
            Op::Add { x, y, rows } => {
                let len = rows * self.width(x);
                let (y, x) = read_write(&mut self.sc.bufs, y.0, x.0);
                be.add(&mut x[..len], &y[..len]);
            }
            Op::MoeFfn(m) => moe_ffn(be, self.sc, m),
            Op::GatherWanted {
                src,
                dst,
                first,
                count,
            } => {
                let w = self.width(src);
                let (s, d) = read_write(&mut self.sc.bufs, src.0, dst.0);
                for (i, from) in wanted_rows(self.seqs).skip(first).take(count).enumerate() {
                    d[i * w..(i + 1) * w].copy_from_slice(&s[from * w..(from + 1) * w]);
                }
            }
        }
    }

    fn logit_block(&mut self, first: usize) -> Option<usize> {
        if let Some(Target::Gathered { first, count }) = self.target.take() {
            self.deliver(first, count);
        }
        let total: usize = self
            .seqs
            .iter()
            .map(|s| s.logits.rows(s.tokens.len()))
            .sum();
        if first >= total {
            return None;
        }
        let wanting = self
            .seqs
            .iter()
            .filter(|s| s.logits.rows(s.tokens.len()) > 0)
            .count();
        // Rows from several sequences share one product (the output matrix is the largest),
        // as many as the scratch holds at a time; with no room for gathering (a single
        // sequence's scratch) or one sequence wanting logits, its rows go straight to its
        // buffer.
        let room = self.sc.spec.logit_rows;
        if wanting > 1 && room > 0 {
            let count = (total - first).min(room);
            self.target = Some(Target::Gathered { first, count });
            return Some(count);
        }
        let mut at = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            let rows = s.logits.rows(s.tokens.len());
            if first < at + rows {
                // Blocks here are whole sequences, so `first` is where sequence `i` starts.
                self.target = Some(Target::Seq(i));
                return Some(at + rows - first);
            }
            at += rows;
        }
        None
    }
}
