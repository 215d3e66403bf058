//! The GPU executor: each [`Op`] of a step is recorded into one compute pass, and the step
//! is submitted once (again only for further blocks of logits than the scratch holds). The
//! buffers it records against are `buffers.rs`'s.

use super::buffers::*;
use super::{as_bytes, GpuBackend, GpuContext, GpuError, GpuKv, Kernels};
use crate::exec::{wanted_rows, with_first_rows, Executor, MoeFfn, Op, SeqStep};
use crate::rope_angle;
use inferno_tensor::{Matrix, Vector};
use std::time::{Duration, Instant};

/// Records dispatches into one compute pass. Bind group 0 (the activations) stays set;
/// group 1 and the parameters are set per dispatch.
struct Recorder<'a> {
    pass: wgpu::ComputePass<'static>,
    k: &'a Kernels,
    own: Internal,
    /// Group 1 for the kernels that read no weights.
    none: &'a wgpu::BindGroup,
    /// Which activation region the quantized-activation buffer holds now (offset, rows,
    /// cols), so Q, K and V (and gate and up) quantize their shared input once; cleared by
    /// every other kernel.
    quantized: Option<(u32, usize, usize)>,
}

impl<'a> Recorder<'a> {
    fn new(
        enc: &mut wgpu::CommandEncoder,
        k: &'a Kernels,
        sc: &GpuScratch,
        none: &'a wgpu::BindGroup,
        timer: Option<&Timer>,
    ) -> Self {
        let mut pass = enc
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: timer.map(|t| wgpu::ComputePassTimestampWrites {
                    query_set: &t.set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            })
            .forget_lifetime();
        pass.set_bind_group(0, &sc.group, &[]);
        Self {
            pass,
            k,
            own: sc.own,
            none,
            quantized: None,
        }
    }

    fn dispatch(
        &mut self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        params: &[u32],
        grid: (u32, u32, u32),
    ) {
        // Any other kernel may change what the quantized activations were made from.
        self.quantized = None;
        let mut p = [0u32; 12];
        p[..params.len()].copy_from_slice(params);
        self.pass.set_pipeline(pipe);
        self.pass.set_bind_group(1, group, &[]);
        self.pass.set_immediates(0, as_bytes(&p));
        self.pass.dispatch_workgroups(grid.0, grid.1, grid.2);
    }

    /// A grid of `groups` workgroups, laid out as the shaders' `group_index` reads it.
    fn grid(groups: usize) -> (u32, u32) {
        let g = groups.max(1) as u32;
        (g.min(GRID_X), g.div_ceil(GRID_X))
    }

    /// One invocation per element of `count`.
    fn dispatch_count<const N: usize>(
        &mut self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        params: [u32; N],
        count: usize,
    ) {
        let (x, y) = Self::grid(count.div_ceil(WG as usize));
        self.dispatch(pipe, group, &params, (x, y, 1));
    }

    /// `out[t] = W · x[t]` for `n` rows, chunk by chunk; Q8_0 weights take the activations
    /// quantized to Q8_0 first (as the CPU kernels do).
    fn matmul(&mut self, w: &GpuMatrix, x: u32, n: usize, out: u32) {
        let k = self.k;
        let kept = self.quantized;
        let x_in = self.input_for(w, x, n);
        let rows_per_group = if w.kind == 0 { k.q8_rows as usize } else { 1 };
        for c in &w.chunks {
            let (gx, gy) = Self::grid(c.rows.div_ceil(rows_per_group));
            self.dispatch(
                match w.kind {
                    0 => &k.mm_q8,
                    3 => &k.mm_raw,
                    _ => &k.mm_float,
                },
                &c.group,
                &[
                    c.rows as u32,
                    w.cols as u32,
                    n as u32,
                    x_in,
                    self.own.xs,
                    out,
                    w.rows as u32,
                    c.row0 as u32,
                    w.code,
                    w.row_bytes,
                ],
                (gx, gy, (n as u32).div_ceil(TN)),
            );
        }
        self.keep_input(w, x, n, out, kept);
    }

    /// Where a product of `w` reads its `n` input rows at `x`: Q8_0 weights take them
    /// quantized to Q8_0 (quantized here unless the buffer already holds them).
    fn input_for(&mut self, w: &GpuMatrix, x: u32, n: usize) -> u32 {
        if w.kind != 0 {
            return x;
        }
        if self.quantized != Some((x, n, w.cols)) {
            let blocks = n * w.cols / 32;
            let (k, none) = (self.k, self.none);
            self.dispatch_count(
                &k.quantize_q8,
                none,
                [x, self.own.xq, self.own.xs, blocks as u32],
                blocks,
            );
        }
        self.own.xq
    }

    /// After a product of `w` from `x` into `out` (`kept`: what the quantized buffer held
    /// before it): the quantized input stays valid for the next product unless this one
    /// overwrote its source.
    fn keep_input(
        &mut self,
        w: &GpuMatrix,
        x: u32,
        n: usize,
        out: u32,
        kept: Option<(u32, usize, usize)>,
    ) {
        self.quantized = match (w.kind == 0, kept) {
            (true, _) if out != x => Some((x, n, w.cols)),
            (false, Some(q)) if out != q.0 => Some(q),
            _ => None,
        };
    }
}

impl Recorder<'_> {
    /// Output slot `s` = expert `ids[s]` of the stack `w` times input row `s / per_x`, for
    /// `x_rows * per_x` slots: one dispatch per chunk of whole experts. Q8_0 experts take
    /// the input quantized first, as [`Recorder::matmul`] does (and keep it for the next
    /// product of the same input).
    fn matmul_ids(&mut self, w: &GpuExperts, x: u32, x_rows: usize, per_x: usize, out: u32) {
        let k = self.k;
        let m = &w.m;
        let kept = self.quantized;
        let x_in = self.input_for(m, x, x_rows);
        let slots = x_rows * per_x;
        for c in &m.chunks {
            let (gx, gy) = Self::grid(w.rows * slots);
            self.dispatch(
                match m.kind {
                    0 => &k.mm_id_q8,
                    3 => &k.mm_id_raw,
                    _ => &k.mm_id_float,
                },
                &c.group,
                &[
                    w.rows as u32,
                    m.cols as u32,
                    slots as u32,
                    x_in,
                    self.own.xs,
                    out,
                    self.own.route_e,
                    (c.row0 / w.rows) as u32,
                    m.code,
                    m.row_bytes,
                    (c.rows / w.rows) as u32,
                    per_x as u32,
                ],
                (gx, gy, 1),
            );
        }
        self.keep_input(m, x, x_rows, out, kept);
    }

    /// [`Op::MoeFfn`]: routing on the device (into the slots' experts and weights), each
    /// slot's gate and up rows, SwiGLU, its down row, then every row's slots summed in
    /// expert order. Only routed experts' weights are read.
    fn moe_ffn(&mut self, sc: &GpuScratch, op: MoeFfn<'_>) -> Result<(), GpuError> {
        let (gate, up, down) = (
            device_experts(op.gate)?,
            device_experts(op.up)?,
            device_experts(op.down)?,
        );
        let (n_experts, used, rows) = (op.gate.len(), op.used, op.rows);
        let (h, f, out_w) = (gate.m.cols, gate.rows, down.rows);
        let fits = used >= 1
            && used <= n_experts
            && used <= sc.experts_used
            && f <= sc.expert_ffn
            && out_w <= sc.expert_out
            && (up.rows, up.m.cols, down.m.cols) == (f, h, f)
            && up.experts == n_experts
            && down.experts == n_experts
            && sc.width(op.router) == n_experts
            && sc.width(op.x) == h
            && sc.width(op.out) == out_w;
        if !fits {
            return Err(GpuError::Device(format!(
                "{}: a mixture of {n_experts} experts ({used} used, {f} × {h}, out {out_w}) \
                 does not fit the scratch's {} used, {} × {}",
                op.gate[0].name, sc.experts_used, sc.expert_ffn, sc.expert_out
            )));
        }
        // Routing writes only the router's buffer and the slots, so an input quantized
        // for the router's product stays valid for the experts'.
        let kept = self.quantized.filter(|q| q.0 != sc.at(op.router));
        let none = self.none;
        let k = self.k;
        self.dispatch_count(
            &k.moe_route,
            none,
            [
                sc.at(op.router),
                n_experts as u32,
                rows as u32,
                used as u32,
                op.normalize as u32,
                self.own.route_e,
                self.own.route_w,
            ],
            rows,
        );
        self.quantized = kept;
        let (g, u, y) = (self.own.slot_g, self.own.slot_u, self.own.slot_y);
        let slots = rows * used;
        self.matmul_ids(gate, sc.at(op.x), rows, used, g);
        self.matmul_ids(up, sc.at(op.x), rows, used, u);
        self.dispatch_count(&k.silu_mul, none, [g, u, (slots * f) as u32], slots * f);
        self.matmul_ids(down, g, slots, 1, y);
        self.dispatch_count(
            &k.moe_sum,
            none,
            [
                y,
                sc.at(op.out),
                out_w as u32,
                used as u32,
                self.own.route_w,
                rows as u32,
            ],
            rows * out_w,
        );
        Ok(())
    }
}

/// A block of logits rows in progress: rows `first .. first + count` of the wanted list.
#[derive(Clone, Copy)]
struct Block {
    first: usize,
    count: usize,
}

/// One step on the GPU: the operations go into a compute pass as they arrive; the pass is
/// submitted when a block of logits is complete (or when the step ends).
pub(crate) struct GpuExec<'s, 'a> {
    gpu: &'s GpuBackend,
    sc: &'s mut GpuScratch,
    seqs: &'s mut [SeqStep<'a>],
    rows: usize,
    wanted: usize,
    enc: Option<wgpu::CommandEncoder>,
    rec: Option<Recorder<'s>>,
    block: Option<Block>,
    /// The RoPE table written for this step: (inverse frequencies' address, head size).
    rope: Option<(usize, usize)>,
    /// Whether the first submit (every layer's work) has gone.
    submitted: bool,
    profiling: bool,
    started: Instant,
    error: Option<GpuError>,
}

/// A matrix's device copy, made at load by [`GpuBackend::upload_matrix`].
fn device_matrix(m: &Matrix) -> Result<&GpuMatrix, GpuError> {
    m.prepared
        .as_ref()
        .and_then(|p| p.downcast_ref::<GpuMatrix>())
        .ok_or_else(|| GpuError::Device(format!("{} was not uploaded to the GPU", m.name)))
}

/// A sequence's device cache, its KV heads and head size.
fn device_cache<'k>(s: &'k SeqStep<'_>) -> Result<(&'k GpuKv, u32, u32), GpuError> {
    let kv =
        s.kv.device()
            .and_then(|d| d.as_any().downcast_ref::<GpuKv>())
            .ok_or_else(|| GpuError::Device("a host KV cache reached the GPU executor".into()))?;
    let (_, kvh, hd) = s.kv.shape();
    if hd > MAX_HEAD_DIM {
        return Err(GpuError::Device(format!(
            "head size {hd} is over the attention kernel's {MAX_HEAD_DIM}"
        )));
    }
    Ok((kv, kvh as u32, hd as u32))
}

/// A vector's device copy, made at load by [`GpuBackend::upload_vector`].
fn device_vector(v: &Vector) -> Result<&wgpu::BindGroup, GpuError> {
    v.prepared
        .as_ref()
        .and_then(|p| p.downcast_ref::<GpuVector>())
        .map(|g| &g.group)
        .ok_or_else(|| GpuError::Device(format!("{} was not uploaded to the GPU", v.name)))
}

impl<'s, 'a> GpuExec<'s, 'a> {
    pub(crate) fn new(
        gpu: &'s GpuBackend,
        sc: &'s mut GpuScratch,
        seqs: &'s mut [SeqStep<'a>],
    ) -> Self {
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let mut error = None;
        if rows > sc.rows {
            error = Some(GpuError::Device(format!(
                "{rows} token rows exceed the {} this scratch holds",
                sc.rows
            )));
        }
        let ctx = gpu.context();
        let mut wanted = 0;
        if error.is_none() {
            let ids = seqs.iter().flat_map(|s| s.tokens.iter());
            for (slot, &id) in sc.ids_host.iter_mut().zip(ids) {
                *slot = id;
            }
            for (slot, r) in sc.list_host.iter_mut().zip(wanted_rows(seqs)) {
                *slot = r as u32;
                wanted += 1;
            }
            ctx.queue
                .write_buffer(&sc.actq, sc.ids as u64 * 4, as_bytes(&sc.ids_host[..rows]));
            ctx.queue.write_buffer(
                &sc.actq,
                sc.list as u64 * 4,
                as_bytes(&sc.list_host[..wanted]),
            );
        }
        let profiling = gpu.profiling();
        let mut ex = Self {
            gpu,
            sc,
            seqs,
            rows,
            wanted,
            enc: None,
            rec: None,
            block: None,
            rope: None,
            submitted: false,
            profiling,
            started: Instant::now(),
            error,
        };
        ex.open_pass();
        ex
    }

    /// Starts a command buffer and its compute pass (timed, for the step's first one, when
    /// profiling).
    fn open_pass(&mut self) {
        let ctx: &'s GpuContext = self.gpu.context();
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(if self.submitted { "logits" } else { "forward" }),
            });
        let timer = self
            .sc
            .timer
            .as_ref()
            .filter(|_| self.profiling && !self.submitted);
        self.rec = Some(Recorder::new(
            &mut enc,
            &ctx.kernels,
            self.sc,
            self.gpu.no_weights(),
            timer,
        ));
        self.enc = Some(enc);
    }

    fn fail(&mut self, e: GpuError) {
        self.error.get_or_insert(e);
    }

    /// Records one operation into the open pass.
    fn record(&mut self, op: Op<'_>) -> Result<(), GpuError> {
        if self.error.is_some() {
            return Ok(());
        }
        if let Op::Rope {
            inv_freq, head_dim, ..
        } = op
        {
            self.rope_table(inv_freq, head_dim)?;
        }
        let n = self.rows;
        let k = &self.gpu.context().kernels;
        let sc = &*self.sc;
        let Some(rec) = self.rec.as_mut() else {
            return Err(GpuError::Device(
                "an operation came after the step's last block of logits".into(),
            ));
        };
        match op {
            Op::Embed { table, out } => {
                let e = device_matrix(table)?;
                let raw = e.kind == 3;
                for chunk in &e.chunks {
                    rec.dispatch_count(
                        if raw { &k.embed_raw } else { &k.embed },
                        &chunk.group,
                        [
                            e.cols as u32,
                            n as u32,
                            sc.ids,
                            sc.at(out),
                            chunk.row0 as u32,
                            chunk.rows as u32,
                            e.code,
                            e.row_bytes,
                        ],
                        // Raw blocks: one invocation per 32 values.
                        n * e.cols / if raw { 32 } else { 1 },
                    );
                }
            }
            Op::RmsNorm {
                src,
                dst,
                rows,
                gain,
                eps,
            } => {
                let group = device_vector(gain)?;
                let (x, y) = Recorder::grid(rows);
                rec.dispatch(
                    &k.rms_norm,
                    group,
                    &[sc.at(src), sc.at(dst), gain.len() as u32, 0, eps.to_bits()],
                    (x, y, 1),
                );
            }
            Op::MatMul { w, x, rows, out } => {
                rec.matmul(device_matrix(w)?, sc.at(x), rows, sc.at(out));
            }
            Op::MatMulShared { x, rows, products } => {
                for &(w, out) in products {
                    rec.matmul(device_matrix(w)?, sc.at(x), rows, sc.at(out));
                }
            }
            Op::AddBias { x, rows, bias } => {
                let group = device_vector(bias)?;
                let dim = bias.len();
                rec.dispatch_count(
                    &k.add_bias,
                    group,
                    [sc.at(x), dim as u32, (rows * dim) as u32, 0],
                    rows * dim,
                );
            }
            Op::Rope {
                x,
                n_heads,
                head_dim,
                ..
            } => {
                let none = rec.none;
                rec.dispatch_count(
                    &k.rope,
                    none,
                    [
                        sc.at(x),
                        n_heads as u32,
                        head_dim as u32,
                        n as u32,
                        sc.own.tab,
                    ],
                    n * n_heads * head_dim / 2,
                );
            }
            Op::StoreKv { layer, k: kb, v } => {
                let kv_dim = sc.width(kb) as u32;
                for (r0, s) in with_first_rows(self.seqs) {
                    let (kv, kvh, hd) = device_cache(s)?;
                    let (r0, m) = (r0 as u32, s.tokens.len() as u32);
                    rec.dispatch_count(
                        &k.kv_store,
                        kv.group(layer),
                        [
                            sc.at(kb) + r0 * kv_dim,
                            sc.at(v) + r0 * kv_dim,
                            m,
                            s.kv.len() as u32,
                            kvh,
                            hd,
                            kv.capacity() as u32,
                            kv.codes().0,
                            kv.codes().1,
                        ],
                        (m * kv_dim) as usize,
                    );
                }
            }
            Op::Attention {
                layer,
                q,
                out,
                n_heads,
                scale,
            } => {
                for (r0, s) in with_first_rows(self.seqs) {
                    let (kv, kvh, hd) = device_cache(s)?;
                    let q_dim = n_heads as u32 * hd;
                    let (r0, m) = (r0 as u32, s.tokens.len() as u32);
                    rec.dispatch(
                        &k.attention,
                        kv.group(layer),
                        &[
                            sc.at(q) + r0 * q_dim,
                            sc.at(out) + r0 * q_dim,
                            s.kv.len() as u32,
                            n_heads as u32,
                            kvh,
                            hd,
                            kv.capacity() as u32,
                            scale.to_bits(),
                            q_dim,
                            kv.codes().0,
                            kv.codes().1,
                        ],
                        (n_heads as u32, m, 1),
                    );
                }
            }
            Op::SiluMul { gate, up, rows } => {
                let count = rows * sc.width(gate);
                let none = rec.none;
                rec.dispatch_count(
                    &k.silu_mul,
                    none,
                    [sc.at(gate), sc.at(up), count as u32],
                    count,
                );
            }
            Op::MoeFfn(m) => rec.moe_ffn(sc, m)?,
            Op::Add { x, y, rows } => {
                let count = rows * sc.width(x);
                let none = rec.none;
                rec.dispatch_count(&k.add, none, [sc.at(x), sc.at(y), count as u32], count);
            }
            Op::GatherWanted {
                src,
                dst,
                first,
                count,
            } => {
                let w = sc.width(src);
                let none = rec.none;
                rec.dispatch_count(
                    &k.gather_rows,
                    none,
                    [
                        sc.at(src),
                        sc.at(dst),
                        w as u32,
                        sc.list + first as u32,
                        count as u32,
                    ],
                    count * w,
                );
            }
        }
        Ok(())
    }

    /// Writes the RoPE table for the step's rows (made on the host like the CPU kernels
    /// make theirs, so both rotate by the same angles); one table per step.
    fn rope_table(&mut self, inv_freq: &[f32], head_dim: usize) -> Result<(), GpuError> {
        let key = (inv_freq.as_ptr() as usize, head_dim);
        if let Some(had) = self.rope {
            if had != key {
                return Err(GpuError::Device(
                    "one step uses one RoPE table: two frequency sets were asked for".into(),
                ));
            }
            return Ok(());
        }
        let half = head_dim / 2;
        if head_dim != self.sc.head_dim || inv_freq.len() < half {
            return Err(GpuError::Device(format!(
                "RoPE over heads of {head_dim} values, but the scratch holds tables of {}",
                self.sc.head_dim
            )));
        }
        for (r0, s) in with_first_rows(self.seqs) {
            let pos0 = s.kv.len();
            for t in 0..s.tokens.len() {
                let r = r0 + t;
                let row = &mut self.sc.tab_host[r * head_dim..(r + 1) * head_dim];
                for (i, &f) in inv_freq.iter().enumerate().take(half) {
                    let (cos, sin) = rope_angle(pos0 + t, f);
                    row[i] = cos;
                    row[half + i] = sin;
                }
            }
        }
        let ctx = self.gpu.context();
        ctx.queue.write_buffer(
            &self.sc.act,
            self.sc.own.tab as u64 * 4,
            as_bytes(&self.sc.tab_host[..self.rows * head_dim]),
        );
        self.rope = Some(key);
        Ok(())
    }

    /// Ends the open pass, copies `count` rows of logits back, submits, waits, and hands
    /// each row to the sequence that asked for it (rows `first .. first + count` of the
    /// wanted list).
    fn submit(&mut self, first: usize, count: usize) -> Result<(), GpuError> {
        let (Some(rec), Some(mut enc)) = (self.rec.take(), self.enc.take()) else {
            return Ok(());
        };
        drop(rec);
        let ctx = self.gpu.context();
        let sc = &*self.sc;
        let timer = sc
            .timer
            .as_ref()
            .filter(|_| self.profiling && !self.submitted);
        if let Some(t) = timer {
            enc.resolve_query_set(&t.set, 0..2, &t.resolve, 0);
            enc.copy_buffer_to_buffer(&t.resolve, 0, &t.read, 0, 16);
        }
        let encoded = Instant::now();
        let vocab = sc.vocab;
        let bytes = (count * vocab * 4) as u64;
        if count > 0 {
            enc.copy_buffer_to_buffer(&sc.act, sc.logits as u64 * 4, &sc.readback, 0, bytes);
        }
        ctx.queue.submit([enc.finish()]);
        if count == 0 {
            ctx.device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .map_err(device_error)?;
        } else {
            map_and_wait(ctx, &sc.readback, bytes, &sc.mapped)?;
            {
                let data = sc
                    .readback
                    .slice(0..bytes)
                    .get_mapped_range()
                    .map_err(device_error)?;
                let mut idx = 0;
                for s in self.seqs.iter_mut() {
                    let rows = s.logits.rows(s.tokens.len());
                    let out = s.logits.buffer();
                    for row in 0..rows {
                        if (first..first + count).contains(&idx) {
                            let src =
                                &data[(idx - first) * vocab * 4..(idx - first + 1) * vocab * 4];
                            for (o, b) in out[row * vocab..(row + 1) * vocab]
                                .iter_mut()
                                .zip(src.chunks_exact(4))
                            {
                                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                            }
                        }
                        idx += 1;
                    }
                }
            }
            sc.readback.unmap();
        }
        if let Some(e) = ctx.take_error() {
            return Err(GpuError::Device(e));
        }
        if let Some(t) = timer {
            let done = Instant::now();
            let gpu_time = read_timer(ctx, t, sc)?;
            self.gpu.add_step_times(StepTimes {
                steps: 1,
                encode: encoded - self.started,
                submit_to_results: done - encoded,
                gpu: gpu_time,
            });
        } else if self.profiling && !self.submitted {
            self.gpu.add_step_times(StepTimes {
                steps: 1,
                encode: encoded - self.started,
                submit_to_results: encoded.elapsed(),
                gpu: Duration::ZERO,
            });
        }
        self.submitted = true;
        Ok(())
    }

    /// Submits whatever is still recorded and reports the step's first error.
    pub(crate) fn finish(mut self) -> Result<(), GpuError> {
        if self.error.is_none() {
            let (first, count) = match self.block.take() {
                Some(b) => (b.first, b.count),
                None => (0, 0),
            };
            if let Err(e) = self.submit(first, count) {
                self.fail(e);
            }
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The GPU time between the two timestamps of the last step.
fn read_timer(ctx: &GpuContext, t: &Timer, sc: &GpuScratch) -> Result<Duration, GpuError> {
    map_and_wait(ctx, &t.read, 16, &sc.mapped)?;
    let ticks = {
        let data = t
            .read
            .slice(0..16)
            .get_mapped_range()
            .map_err(device_error)?;
        let stamp = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        stamp(1).saturating_sub(stamp(0))
    };
    t.read.unmap();
    let ns = ticks as f64 * f64::from(ctx.queue.get_timestamp_period());
    Ok(Duration::from_nanos(ns as u64))
}

impl Executor for GpuExec<'_, '_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn run(&mut self, op: Op<'_>) {
        if let Err(e) = self.record(op) {
            self.fail(e);
        }
    }

    fn logit_block(&mut self, first: usize) -> Option<usize> {
        if let Some(b) = self.block.take() {
            if let Err(e) = self.submit(b.first, b.count) {
                self.fail(e);
            }
        }
        if self.error.is_some() || first >= self.wanted {
            return None;
        }
        if self.rec.is_none() {
            self.open_pass();
        }
        let count = (self.wanted - first).min(self.sc.logit_rows);
        self.block = Some(Block { first, count });
        Some(count)
    }
}
