//! The Qwen forward pass as one GPU command buffer: [`GpuModel`] holds the uploaded weights,
//! [`GpuScratch`] one engine's (or one sequence's) activation buffers, and
//! [`GpuModel::forward`] records a whole step — embedding, every block's norms,
//! projections, RoPE, KV store and attention, SwiGLU MLP, the final norm and LM head — and
//! submits it once. The order of operations is the host model's (`model::qwen`), so a reader
//! of one can follow the other.

use super::{as_bytes, raw_kind, weight_kind, GpuContext, GpuError, GpuKv, Kernels};
use crate::model::{Logits, ModelConfig, ModelWeights, SeqStep};
use crate::tensor::{legacy, q8_0};
use crate::tensor::{GgmlType, Matrix};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Workgroups along x before a grid spills into y (the shaders' `GRID_X`).
const GRID_X: u32 = 32768;
/// Invocations per workgroup (the shaders' `WG`).
const WG: u32 = 64;
/// Tokens one matrix-product workgroup covers (the shaders' `TN`).
const TN: u32 = 8;
/// Largest head the attention kernel holds in workgroup memory.
const MAX_HEAD_DIM: usize = 256;

/// One weight matrix on the device, split into row chunks that each fit one binding.
struct GpuMatrix {
    kind: usize,
    /// The type code the shaders switch on: the kind (0 Q8_0, 1 F16, 2 F32) for stored
    /// elements, the `RAW_*` code for raw blocks.
    code: u32,
    /// Bytes of one stored row (raw blocks are addressed by byte).
    row_bytes: u32,
    rows: usize,
    cols: usize,
    chunks: Vec<Chunk>,
}

struct Chunk {
    row0: usize,
    rows: usize,
    group: wgpu::BindGroup,
}

struct GpuLayer {
    attn_norm: u32,
    bq: Option<u32>,
    bk: Option<u32>,
    bv: Option<u32>,
    q_norm: Option<u32>,
    k_norm: Option<u32>,
    ffn_norm: u32,
    wq: GpuMatrix,
    wk: GpuMatrix,
    wv: GpuMatrix,
    wo: GpuMatrix,
    w_gate: GpuMatrix,
    w_up: GpuMatrix,
    w_down: GpuMatrix,
}

/// The model's sizes, as the kernels need them.
#[derive(Clone, Copy)]
struct Dims {
    hidden: usize,
    q_dim: usize,
    kv_dim: usize,
    ffn: usize,
    vocab: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    eps: f32,
}

impl Dims {
    /// The widest input a matrix product quantizes.
    fn max_k(&self) -> usize {
        self.hidden.max(self.q_dim).max(self.ffn)
    }

    /// Float activations per token row (excluding logits).
    fn floats_per_row(&self) -> usize {
        2 * self.hidden
            + 2 * self.q_dim
            + 2 * self.kv_dim
            + 2 * self.ffn
            + self.max_k() / 32
            + self.head_dim
    }
}

/// Where a step's time goes, summed over the steps run while profiling was on.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTimes {
    pub steps: u64,
    /// Host time recording the command buffer.
    pub encode: Duration,
    /// From submit until the logits are on the host: GPU execution, submission, the
    /// read-back copy and the wait.
    pub submit_to_results: Duration,
    /// GPU execution of the step's compute pass (timestamps; zero where the adapter has
    /// none).
    pub gpu: Duration,
}

pub struct GpuModel {
    ctx: Arc<GpuContext>,
    profiling: AtomicBool,
    times: Mutex<StepTimes>,
    dims: Dims,
    inv_freq: Vec<f32>,
    aux_group: wgpu::BindGroup,
    token_embd: Arc<GpuMatrix>,
    output: Arc<GpuMatrix>,
    output_norm: u32,
    layers: Vec<GpuLayer>,
}

/// Offsets (in elements) of each activation region in the scratch buffers.
#[derive(Clone, Copy, Default)]
struct Regions {
    x: u32,
    xn: u32,
    q: u32,
    k: u32,
    v: u32,
    attn: u32,
    gate: u32,
    up: u32,
    xs: u32,
    tab: u32,
    logits: u32,
    // In the integer buffer:
    xq: u32,
    ids: u32,
    list: u32,
}

/// Device activation buffers for forward passes of up to `rows` token rows, of which up to
/// `logit_rows` rows' logits are computed and read back per submit; with the host staging
/// for each step's token ids, RoPE tables and output rows. Made once, reused every step.
pub struct GpuScratch {
    rows: usize,
    logit_rows: usize,
    reg: Regions,
    act: wgpu::Buffer,
    actq: wgpu::Buffer,
    group: wgpu::BindGroup,
    readback: wgpu::Buffer,
    mapped: Arc<AtomicBool>,
    timer: Option<Timer>,
    ids: Vec<u32>,
    tab: Vec<f32>,
    list: Vec<u32>,
}

/// Two GPU timestamps around the step's compute pass, and where they are read back.
struct Timer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
}

impl GpuScratch {
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Maps `buf[..bytes]` for reading and waits for it.
fn map_and_wait(
    ctx: &GpuContext,
    buf: &wgpu::Buffer,
    bytes: u64,
    done: &Arc<AtomicBool>,
) -> Result<(), GpuError> {
    done.store(false, Ordering::SeqCst);
    let flag = Arc::clone(done);
    buf.slice(0..bytes)
        .map_async(wgpu::MapMode::Read, move |r| {
            flag.store(r.is_ok(), Ordering::SeqCst);
        });
    ctx.device
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        })
        .map_err(|e| GpuError::Device(e.to_string()))?;
    if !done.load(Ordering::SeqCst) {
        return Err(GpuError::Device("reading the results back failed".into()));
    }
    Ok(())
}

fn device_error(e: impl std::fmt::Display) -> GpuError {
    GpuError::Device(e.to_string())
}

/// Little-endian words of `bytes` (a multiple of 4 long).
fn words_of(bytes: &[u8], out: &mut Vec<u32>) {
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
}

impl GpuMatrix {
    /// Uploads `m` in its stored type: Q8_0 as its quantized bytes plus f32 block scales,
    /// F16 and F32 as they are.
    fn upload(ctx: &GpuContext, m: &Matrix) -> Result<Self, GpuError> {
        let kind = weight_kind(m.dtype).ok_or_else(|| {
            GpuError::Device(format!("{}: type {} has no GPU kernel", m.name, m.dtype))
        })?;
        // Rows are uploaded as whole words.
        if m.dtype == GgmlType::F16 && !m.cols.is_multiple_of(2) {
            return Err(GpuError::Device(format!(
                "{}: an F16 matrix needs an even number of columns, not {}",
                m.name, m.cols
            )));
        }
        let raw = raw_kind(m.dtype);
        let widen = matches!(m.dtype, GgmlType::Q4_0 | GgmlType::Q5_0);
        let dev_row_bytes = match m.dtype {
            _ if raw.is_some() => m.row_bytes(),
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => m.cols,
            GgmlType::F16 => m.cols * 2,
            _ => m.cols * 4,
        } as u64;
        let per_chunk = ((ctx.max_binding / dev_row_bytes) as usize).clamp(1, m.rows.max(1));
        let mut chunks = Vec::new();
        let mut words = Vec::new();
        let mut scales = Vec::new();
        let mut bytes = Vec::new();
        let mut wide = vec![0u8; m.cols / q8_0::BLOCK * q8_0::BLOCK_BYTES];
        let mut row0 = 0;
        while row0 < m.rows {
            let rows = per_chunk.min(m.rows - row0);
            words.clear();
            scales.clear();
            bytes.clear();
            for r in row0..row0 + rows {
                let mut row = m.row(r);
                if widen {
                    legacy::widen_to_q8_0(m.dtype == GgmlType::Q5_0, row, &mut wide);
                    row = &wide;
                }
                if raw.is_some() {
                    bytes.extend_from_slice(row);
                } else if kind == 0 {
                    for b in row.chunks_exact(q8_0::BLOCK_BYTES) {
                        scales.push(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
                        words_of(&b[2..], &mut words);
                    }
                } else {
                    words_of(row, &mut words);
                }
            }
            if raw.is_some() {
                // Rows of raw blocks need not end on a word; the chunk is padded once.
                bytes.resize(bytes.len().next_multiple_of(4), 0);
                words_of(&bytes, &mut words);
            }
            let wbuf = ctx.upload_words(&m.name, &words);
            let sbuf = ctx.storage_buffer(&m.name, (scales.len() * 4) as u64);
            if !scales.is_empty() {
                ctx.queue.write_buffer(&sbuf, 0, as_bytes(&scales));
            }
            let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&m.name),
                layout: &ctx.kernels.weight_layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wbuf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: sbuf.as_entire_binding(),
                    },
                ],
            });
            chunks.push(Chunk { row0, rows, group });
            row0 += rows;
        }
        Ok(Self {
            kind,
            code: raw.unwrap_or(kind as u32),
            row_bytes: m.row_bytes() as u32,
            rows: m.rows,
            cols: m.cols,
            chunks,
        })
    }
}

/// Collects the model's small f32 vectors into one buffer, remembering each one's offset.
struct AuxBuilder(Vec<f32>);

impl AuxBuilder {
    fn push(&mut self, v: &[f32]) -> u32 {
        let at = self.0.len() as u32;
        self.0.extend_from_slice(v);
        at
    }

    fn push_opt(&mut self, v: &Option<Vec<f32>>) -> Option<u32> {
        v.as_deref().map(|v| self.push(v))
    }
}

impl GpuModel {
    /// Uploads the weights (once, at load) and checks the shapes the kernels handle.
    pub fn upload(
        ctx: &Arc<GpuContext>,
        config: &ModelConfig,
        weights: &ModelWeights,
        inv_freq: &[f32],
    ) -> Result<Self, GpuError> {
        let dims = Dims {
            hidden: config.hidden,
            q_dim: config.q_dim(),
            kv_dim: config.kv_dim(),
            ffn: config.ffn,
            vocab: config.vocab,
            n_heads: config.n_heads,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            eps: config.rms_eps,
        };
        if dims.head_dim > MAX_HEAD_DIM || !dims.head_dim.is_multiple_of(2) {
            return Err(GpuError::Device(format!(
                "head size {} (the attention kernel takes even sizes up to {MAX_HEAD_DIM})",
                dims.head_dim
            )));
        }
        let mut aux = AuxBuilder(Vec::new());
        let mut layers = Vec::with_capacity(weights.layers.len());
        for lw in &weights.layers {
            layers.push(GpuLayer {
                attn_norm: aux.push(&lw.attn_norm),
                bq: aux.push_opt(&lw.bq),
                bk: aux.push_opt(&lw.bk),
                bv: aux.push_opt(&lw.bv),
                q_norm: aux.push_opt(&lw.q_norm),
                k_norm: aux.push_opt(&lw.k_norm),
                ffn_norm: aux.push(&lw.ffn_norm),
                wq: GpuMatrix::upload(ctx, &lw.wq)?,
                wk: GpuMatrix::upload(ctx, &lw.wk)?,
                wv: GpuMatrix::upload(ctx, &lw.wv)?,
                wo: GpuMatrix::upload(ctx, &lw.wo)?,
                w_gate: GpuMatrix::upload(ctx, &lw.w_gate)?,
                w_up: GpuMatrix::upload(ctx, &lw.w_up)?,
                w_down: GpuMatrix::upload(ctx, &lw.w_down)?,
            });
        }
        let output_norm = aux.push(&weights.output_norm);
        let token_embd = Arc::new(GpuMatrix::upload(ctx, &weights.token_embd)?);
        let output = if weights.tied_embeddings {
            Arc::clone(&token_embd)
        } else {
            Arc::new(GpuMatrix::upload(ctx, &weights.output)?)
        };
        let aux_buf = ctx.storage_buffer("norms and biases", (aux.0.len() * 4) as u64);
        ctx.queue.write_buffer(&aux_buf, 0, as_bytes(&aux.0));
        let aux_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("aux"),
            layout: &ctx.kernels.aux_layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: aux_buf.as_entire_binding(),
            }],
        });
        ctx.queue.submit([]);
        if let Some(e) = ctx.take_error() {
            return Err(GpuError::Device(e));
        }
        Ok(Self {
            ctx: Arc::clone(ctx),
            profiling: AtomicBool::new(false),
            times: Mutex::new(StepTimes::default()),
            dims,
            inv_freq: inv_freq.to_vec(),
            aux_group,
            token_embd,
            output,
            output_norm,
            layers,
        })
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Starts (or stops) timing each step; the sums start again from zero.
    pub fn set_profiling(&self, on: bool) {
        self.profiling.store(on, Ordering::Relaxed);
        *self.times.lock().unwrap_or_else(|p| p.into_inner()) = StepTimes::default();
    }

    /// The step times summed since profiling was turned on.
    pub fn step_times(&self) -> StepTimes {
        *self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Most token rows one scratch can hold on this device.
    pub fn max_rows(&self) -> usize {
        let per_row = (self.dims.floats_per_row() * 4) as u64;
        ((self.ctx.max_binding / 2 / per_row) as usize).max(1)
    }

    /// The most positions a KV cache can hold on this device.
    pub fn max_kv_capacity(&self) -> usize {
        GpuKv::max_capacity(&self.ctx, self.dims.n_kv_heads, self.dims.head_dim)
    }

    pub fn new_kv(&self, n_layers: usize, capacity: usize) -> GpuKv {
        GpuKv::new(
            &self.ctx,
            n_layers,
            self.dims.n_kv_heads,
            self.dims.head_dim,
            capacity,
        )
    }

    /// Buffers for passes of up to `rows` token rows (capped by [`Self::max_rows`]);
    /// `logit_rows` rows of logits come back per submit (at least one, and as many as fit
    /// in a quarter of a binding when `rows` asks for more).
    pub fn new_scratch(&self, rows: usize, logit_rows: usize) -> GpuScratch {
        let d = self.dims;
        let rows = rows.clamp(1, self.max_rows());
        let fit = ((self.ctx.max_binding / 4 / (d.vocab * 4) as u64) as usize).max(1);
        let logit_rows = logit_rows.max(rows.min(fit)).clamp(1, fit.max(logit_rows));
        let mut reg = Regions::default();
        let mut at = 0u32;
        let mut take = |n: usize| {
            let o = at;
            at += n as u32;
            o
        };
        reg.x = take(rows * d.hidden);
        reg.xn = take(rows * d.hidden);
        reg.q = take(rows * d.q_dim);
        reg.k = take(rows * d.kv_dim);
        reg.v = take(rows * d.kv_dim);
        reg.attn = take(rows * d.q_dim);
        reg.gate = take(rows * d.ffn);
        reg.up = take(rows * d.ffn);
        reg.xs = take(rows * d.max_k() / 32);
        reg.tab = take(rows * d.head_dim);
        reg.logits = take(logit_rows * d.vocab);
        let floats = at;
        let mut at = 0u32;
        let mut take = |n: usize| {
            let o = at;
            at += n as u32;
            o
        };
        reg.xq = take(rows * d.max_k() / 4);
        reg.ids = take(rows);
        reg.list = take(rows);
        let words = at;
        let ctx = &self.ctx;
        let act = ctx.storage_buffer("activations", floats as u64 * 4);
        let actq = ctx.storage_buffer("integer activations", words as u64 * 4);
        let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("activations"),
            layout: &ctx.kernels.act_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: act.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: actq.as_entire_binding(),
                },
            ],
        });
        let readback = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("logits read back"),
            size: (logit_rows * d.vocab * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let timer = ctx.timestamps.then(|| Timer {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("step time"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolve: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("step time resolve"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            read: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("step time read back"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        });
        GpuScratch {
            rows,
            logit_rows,
            reg,
            act,
            actq,
            group,
            readback,
            mapped: Arc::new(AtomicBool::new(false)),
            timer,
            ids: vec![0; rows],
            tab: vec![0.0; rows * d.head_dim],
            list: vec![0; rows],
        }
    }

    /// One forward pass over the new tokens of every sequence in `seqs` (shapes and sizes
    /// already checked by the model; every cache is a device cache): one command buffer,
    /// one submit, then the logits the sequences asked for are read back (in further
    /// submits only when more rows of logits are wanted than the scratch holds).
    pub fn forward(&self, seqs: &mut [SeqStep<'_>], sc: &mut GpuScratch) -> Result<(), GpuError> {
        let d = self.dims;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n > sc.rows {
            return Err(GpuError::Device(format!(
                "{n} token rows exceed the {} this scratch holds",
                sc.rows
            )));
        }
        // Per row: its token id and the RoPE table at its position (made on the host in
        // f64 like the CPU kernels, so both rotate by the same angles).
        let half = d.head_dim / 2;
        let mut r = 0;
        let mut wanted = 0;
        for s in seqs.iter() {
            let pos0 = s.kv.len();
            let m = s.tokens.len();
            for (t, &id) in s.tokens.iter().enumerate() {
                sc.ids[r] = id;
                let pos = (pos0 + t) as f32;
                let row = &mut sc.tab[r * d.head_dim..(r + 1) * d.head_dim];
                for (i, &f) in self.inv_freq.iter().enumerate().take(half) {
                    let angle = (pos * f) as f64;
                    row[i] = angle.cos() as f32;
                    row[half + i] = angle.sin() as f32;
                }
                r += 1;
            }
            let out_rows = match s.logits {
                Logits::None => 0,
                Logits::Last(_) => 1,
                Logits::All(_) => m,
            };
            for i in r - out_rows..r {
                sc.list[wanted] = i as u32;
                wanted += 1;
            }
        }
        let ctx = &self.ctx;
        ctx.queue
            .write_buffer(&sc.actq, sc.reg.ids as u64 * 4, as_bytes(&sc.ids[..n]));
        ctx.queue.write_buffer(
            &sc.actq,
            sc.reg.list as u64 * 4,
            as_bytes(&sc.list[..wanted]),
        );
        ctx.queue.write_buffer(
            &sc.act,
            sc.reg.tab as u64 * 4,
            as_bytes(&sc.tab[..n * d.head_dim]),
        );

        let profiling = self.profiling.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("forward"),
            });
        let timer = sc.timer.as_ref().filter(|_| profiling);
        {
            let mut rec = Recorder::new(&mut enc, &ctx.kernels, sc, &self.aux_group, timer);
            self.record_layers(&mut rec, seqs, n)?;
            if wanted > 0 {
                self.record_output(&mut rec, 0, wanted.min(sc.logit_rows));
            }
        }
        if let Some(t) = timer {
            enc.resolve_query_set(&t.set, 0..2, &t.resolve, 0);
            enc.copy_buffer_to_buffer(&t.resolve, 0, &t.read, 0, 16);
        }
        let encoded = Instant::now();
        let first = wanted.min(sc.logit_rows);
        self.submit_and_read(enc, sc, seqs, 0, first)?;
        if profiling {
            let done = Instant::now();
            let gpu = match timer {
                Some(t) => self.read_timer(t, sc)?,
                None => Duration::ZERO,
            };
            let mut times = self.times.lock().unwrap_or_else(|p| p.into_inner());
            times.steps += 1;
            times.encode += encoded - started;
            times.submit_to_results += done - encoded;
            times.gpu += gpu;
        }
        let mut done = first;
        while done < wanted {
            let cnt = (wanted - done).min(sc.logit_rows);
            let mut enc = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("logits"),
                });
            {
                let mut rec = Recorder::new(&mut enc, &ctx.kernels, sc, &self.aux_group, None);
                self.record_output(&mut rec, done, cnt);
            }
            self.submit_and_read(enc, sc, seqs, done, cnt)?;
            done += cnt;
        }
        Ok(())
    }

    /// The GPU time between the two timestamps of the last step.
    fn read_timer(&self, t: &Timer, sc: &GpuScratch) -> Result<Duration, GpuError> {
        map_and_wait(&self.ctx, &t.read, 16, &sc.mapped)?;
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
        let ns = ticks as f64 * f64::from(self.ctx.queue.get_timestamp_period());
        Ok(Duration::from_nanos(ns as u64))
    }

    /// Embedding lookup and every transformer block.
    fn record_layers(
        &self,
        rec: &mut Recorder<'_>,
        seqs: &[SeqStep<'_>],
        n: usize,
    ) -> Result<(), GpuError> {
        let reg = rec.reg;
        let k = rec.k;
        let e = &self.token_embd;
        let raw = e.kind == 3;
        for chunk in &e.chunks {
            rec.dispatch_count(
                if raw { &k.embed_raw } else { &k.embed },
                &chunk.group,
                [
                    self.dims.hidden as u32,
                    n as u32,
                    reg.ids,
                    reg.x,
                    chunk.row0 as u32,
                    chunk.rows as u32,
                    e.code,
                    e.row_bytes,
                ],
                // Raw blocks: one invocation per 32 values.
                n * self.dims.hidden / if raw { 32 } else { 1 },
            );
        }
        for (l, lw) in self.layers.iter().enumerate() {
            self.attention_block(rec, seqs, l, lw, n)?;
            self.mlp_block(rec, lw, n);
        }
        Ok(())
    }

    /// `x += Wo · Attention(RoPE(QNorm(Wq·n)), RoPE(KNorm(Wk·n)), Wv·n)`, `n = RMSNorm(x)`.
    fn attention_block(
        &self,
        rec: &mut Recorder<'_>,
        seqs: &[SeqStep<'_>],
        l: usize,
        lw: &GpuLayer,
        n: usize,
    ) -> Result<(), GpuError> {
        let d = self.dims;
        let reg = rec.reg;
        rec.rms_norm(reg.x, reg.xn, n, d.hidden, lw.attn_norm, d.eps);
        rec.matmul(&lw.wq, reg.xn, n, reg.q);
        rec.matmul(&lw.wk, reg.xn, n, reg.k);
        rec.matmul(&lw.wv, reg.xn, n, reg.v);
        if let (Some(bq), Some(bk), Some(bv)) = (lw.bq, lw.bk, lw.bv) {
            rec.add_bias(reg.q, n, d.q_dim, bq);
            rec.add_bias(reg.k, n, d.kv_dim, bk);
            rec.add_bias(reg.v, n, d.kv_dim, bv);
        }
        if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
            rec.rms_norm(reg.q, reg.q, n * d.n_heads, d.head_dim, qn, d.eps);
            rec.rms_norm(reg.k, reg.k, n * d.n_kv_heads, d.head_dim, kn, d.eps);
        }
        rec.rope(reg.q, n, d.n_heads, d.head_dim);
        rec.rope(reg.k, n, d.n_kv_heads, d.head_dim);

        let k = rec.k;
        let mut r0 = 0u32;
        for s in seqs {
            let kv = s
                .kv
                .gpu()
                .ok_or_else(|| GpuError::Device("a host KV cache reached the GPU model".into()))?;
            let m = s.tokens.len() as u32;
            let pos0 = s.kv.len() as u32;
            let (hd, kvh, cap) = (d.head_dim as u32, d.n_kv_heads as u32, kv.capacity() as u32);
            rec.dispatch_count(
                &k.kv_store,
                kv.group(l),
                [
                    reg.k + r0 * d.kv_dim as u32,
                    reg.v + r0 * d.kv_dim as u32,
                    m,
                    pos0,
                    kvh,
                    hd,
                    cap,
                ],
                (m as usize) * d.kv_dim,
            );
            rec.dispatch(
                &k.attention,
                kv.group(l),
                &[
                    reg.q + r0 * d.q_dim as u32,
                    reg.attn + r0 * d.q_dim as u32,
                    pos0,
                    d.n_heads as u32,
                    kvh,
                    hd,
                    cap,
                    (1.0 / (d.head_dim as f32).sqrt()).to_bits(),
                    d.q_dim as u32,
                ],
                (d.n_heads as u32, m, 1),
            );
            r0 += m;
        }
        rec.matmul(&lw.wo, reg.attn, n, reg.xn);
        rec.add(reg.x, reg.xn, n * d.hidden);
        Ok(())
    }

    /// `x += Wdown · (SiLU(Wgate · m) ⊙ Wup · m)` with `m = RMSNorm(x)`.
    fn mlp_block(&self, rec: &mut Recorder<'_>, lw: &GpuLayer, n: usize) {
        let d = self.dims;
        let reg = rec.reg;
        rec.rms_norm(reg.x, reg.xn, n, d.hidden, lw.ffn_norm, d.eps);
        rec.matmul(&lw.w_gate, reg.xn, n, reg.gate);
        rec.matmul(&lw.w_up, reg.xn, n, reg.up);
        rec.silu_mul(reg.gate, reg.up, n * d.ffn);
        rec.matmul(&lw.w_down, reg.gate, n, reg.xn);
        rec.add(reg.x, reg.xn, n * d.hidden);
    }

    /// `logits = Woutput · RMSNorm(x)` for the `cnt` wanted rows from `first` in the list.
    fn record_output(&self, rec: &mut Recorder<'_>, first: usize, cnt: usize) {
        let d = self.dims;
        let reg = rec.reg;
        let (k, aux) = (rec.k, rec.aux);
        rec.dispatch_count(
            &k.gather_rows,
            aux,
            [
                reg.x,
                reg.xn,
                d.hidden as u32,
                reg.list + first as u32,
                cnt as u32,
            ],
            cnt * d.hidden,
        );
        rec.rms_norm(reg.xn, reg.xn, cnt, d.hidden, self.output_norm, d.eps);
        rec.matmul(&self.output, reg.xn, cnt, reg.logits);
    }

    /// Copies `cnt` rows of logits back, submits, waits, and hands each row to the sequence
    /// that asked for it (rows `first..first + cnt` of the wanted list).
    fn submit_and_read(
        &self,
        mut enc: wgpu::CommandEncoder,
        sc: &GpuScratch,
        seqs: &mut [SeqStep<'_>],
        first: usize,
        cnt: usize,
    ) -> Result<(), GpuError> {
        let ctx = &self.ctx;
        let vocab = self.dims.vocab;
        let bytes = (cnt * vocab * 4) as u64;
        if cnt > 0 {
            enc.copy_buffer_to_buffer(&sc.act, sc.reg.logits as u64 * 4, &sc.readback, 0, bytes);
        }
        ctx.queue.submit([enc.finish()]);
        if cnt == 0 {
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
                for s in seqs.iter_mut() {
                    let m = s.tokens.len();
                    let (rows, out) = match &mut s.logits {
                        Logits::None => continue,
                        Logits::Last(o) => (1, &mut **o),
                        Logits::All(o) => (m, &mut **o),
                    };
                    for row in 0..rows {
                        if idx >= first && idx < first + cnt {
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
        match ctx.take_error() {
            Some(e) => Err(GpuError::Device(e)),
            None => Ok(()),
        }
    }
}

/// Records dispatches into one compute pass. Bind group 0 (the activations) stays set;
/// group 1 and the parameters are set per dispatch.
struct Recorder<'a> {
    pass: wgpu::ComputePass<'static>,
    k: &'a Kernels,
    reg: Regions,
    aux: &'a wgpu::BindGroup,
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
        aux: &'a wgpu::BindGroup,
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
            reg: sc.reg,
            aux,
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

    fn rms_norm(&mut self, src: u32, dst: u32, rows: usize, dim: usize, gain: u32, eps: f32) {
        let (x, y) = Self::grid(rows);
        let (k, aux) = (self.k, self.aux);
        self.dispatch(
            &k.rms_norm,
            aux,
            &[src, dst, dim as u32, gain, eps.to_bits()],
            (x, y, 1),
        );
    }

    fn rope(&mut self, off: u32, rows: usize, heads: usize, head_dim: usize) {
        let (k, aux) = (self.k, self.aux);
        self.dispatch_count(
            &k.rope,
            aux,
            [
                off,
                heads as u32,
                head_dim as u32,
                rows as u32,
                self.reg.tab,
            ],
            rows * heads * head_dim / 2,
        );
    }

    fn add_bias(&mut self, off: u32, rows: usize, dim: usize, bias: u32) {
        let (k, aux) = (self.k, self.aux);
        self.dispatch_count(
            &k.add_bias,
            aux,
            [off, dim as u32, (rows * dim) as u32, bias],
            rows * dim,
        );
    }

    fn silu_mul(&mut self, gate: u32, up: u32, count: usize) {
        let (k, aux) = (self.k, self.aux);
        self.dispatch_count(&k.silu_mul, aux, [gate, up, count as u32], count);
    }

    fn add(&mut self, x: u32, y: u32, count: usize) {
        let (k, aux) = (self.k, self.aux);
        self.dispatch_count(&k.add, aux, [x, y, count as u32], count);
    }

    /// `out[t] = W · x[t]` for `n` rows, chunk by chunk; Q8_0 weights take the activations
    /// quantized to Q8_0 first (as the CPU kernels do).
    fn matmul(&mut self, w: &GpuMatrix, x: u32, n: usize, out: u32) {
        let (k, aux) = (self.k, self.aux);
        let kept = self.quantized;
        let x_in = if w.kind == 0 {
            if kept != Some((x, n, w.cols)) {
                let blocks = n * w.cols / 32;
                self.dispatch_count(
                    &k.quantize_q8,
                    aux,
                    [x, self.reg.xq, self.reg.xs, blocks as u32],
                    blocks,
                );
            }
            self.reg.xq
        } else {
            x
        };
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
                    self.reg.xs,
                    out,
                    w.rows as u32,
                    c.row0 as u32,
                    w.code,
                    w.row_bytes,
                ],
                (gx, gy, (n as u32).div_ceil(TN)),
            );
        }
        // The quantized input stays valid for the next product unless this one overwrote
        // its source.
        self.quantized = match (w.kind == 0, kept) {
            (true, _) if out != x => Some((x, n, w.cols)),
            (false, Some(q)) if out != q.0 => Some(q),
            _ => None,
        };
    }
}
