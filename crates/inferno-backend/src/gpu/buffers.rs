//! The GPU's device memory for a model and its steps: [`GpuMatrix`], [`GpuVector`] and
//! [`GpuExperts`] are the weights' device copies, made at load; [`GpuScratch`] one engine's
//! (or one sequence's) activation buffers, with the timers a profiled step reads back.

use super::{as_bytes, raw_kind, weight_kind, GpuContext, GpuError};
use crate::exec::{Buf, ScratchSpec, LOGITS};
use inferno_tensor::{legacy, q8_0};
use inferno_tensor::{GgmlType, Matrix, Vector};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Workgroups along x before a grid spills into y (the shaders' `GRID_X`).
pub(super) const GRID_X: u32 = 32768;
/// Invocations per workgroup (the shaders' `WG`).
pub(super) const WG: u32 = 64;
/// Tokens one matrix-product workgroup covers (the shaders' `TN`).
pub(super) const TN: u32 = 8;
/// Largest head the attention kernel holds in workgroup memory.
pub(super) const MAX_HEAD_DIM: usize = 256;

/// One weight matrix on the device, split into row chunks that each fit one binding.
pub(super) struct GpuMatrix {
    pub(super) kind: usize,
    /// The type code the shaders switch on: the kind (0 Q8_0, 1 F16, 2 F32) for stored
    /// elements, the `RAW_*` code for raw blocks.
    pub(super) code: u32,
    /// Bytes of one stored row (raw blocks are addressed by byte).
    pub(super) row_bytes: u32,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) chunks: Vec<Chunk>,
}

pub(super) struct Chunk {
    pub(super) row0: usize,
    pub(super) rows: usize,
    pub(super) group: wgpu::BindGroup,
}

/// A vector (norm gains, a bias) on the device: its own buffer, bound where the kernels
/// read their `aux` values.
pub(super) struct GpuVector {
    pub(super) group: wgpu::BindGroup,
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

/// Offsets (in elements) of the executor's own regions: in the float buffer the quantized
/// activations' scales and the RoPE table, in the integer buffer the quantized activations;
/// for a mixture of experts, each routed (row, expert) slot's weight, gate, up and output
/// rows (floats) and its expert (integers).
#[derive(Clone, Copy, Default)]
pub(super) struct Internal {
    pub(super) xs: u32,
    pub(super) tab: u32,
    pub(super) xq: u32,
    pub(super) route_w: u32,
    pub(super) slot_g: u32,
    pub(super) slot_u: u32,
    pub(super) slot_y: u32,
    pub(super) route_e: u32,
}

/// Device activation buffers for forward passes of up to `rows` token rows, of which up to
/// `logit_rows` rows' logits are computed and read back per submit; with the host staging
/// for each step's token ids, RoPE tables and output rows. Made once, reused every step.
pub struct GpuScratch {
    pub(super) rows: usize,
    pub(super) logit_rows: usize,
    /// Floats per row and offset of each of the model's buffers.
    pub(super) widths: Vec<usize>,
    pub(super) offsets: Vec<u32>,
    pub(super) vocab: usize,
    pub(super) head_dim: usize,
    /// The mixture-of-experts slots' shape (see [`ScratchSpec`]).
    pub(super) experts_used: usize,
    pub(super) expert_ffn: usize,
    pub(super) expert_out: usize,
    pub(super) logits: u32,
    pub(super) ids: u32,
    pub(super) list: u32,
    pub(super) own: Internal,
    pub(super) act: wgpu::Buffer,
    pub(super) actq: wgpu::Buffer,
    pub(super) group: wgpu::BindGroup,
    pub(super) readback: wgpu::Buffer,
    pub(super) mapped: Arc<AtomicBool>,
    pub(super) timer: Option<Timer>,
    pub(super) ids_host: Vec<u32>,
    pub(super) tab_host: Vec<f32>,
    pub(super) list_host: Vec<u32>,
}

/// Two GPU timestamps around the step's compute pass, and where they are read back.
pub(super) struct Timer {
    pub(super) set: wgpu::QuerySet,
    pub(super) resolve: wgpu::Buffer,
    pub(super) read: wgpu::Buffer,
}

impl GpuScratch {
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Float activations per token row (excluding logits): the model's buffers, the
    /// quantized activations' scales, the RoPE table and the experts' slots.
    pub(super) fn floats_per_row(spec: &ScratchSpec) -> usize {
        spec.widths.iter().sum::<usize>()
            + Self::max_k(spec) / 32
            + spec.head_dim
            + spec.experts_used * (1 + 2 * spec.expert_ffn + spec.expert_out)
    }

    /// The most values per token row a matrix product quantizes: the widest input, or a
    /// row's routed slots of an expert's down projection.
    pub(super) fn max_k(spec: &ScratchSpec) -> usize {
        let widest = spec.widths.iter().copied().max().unwrap_or(0);
        widest.max(spec.experts_used * spec.expert_ffn)
    }

    /// Most token rows one scratch of this shape can hold on this device.
    pub(super) fn max_rows(ctx: &GpuContext, spec: &ScratchSpec) -> usize {
        let per_row = (Self::floats_per_row(spec) * 4) as u64;
        ((ctx.max_binding / 2 / per_row.max(1)) as usize).max(1)
    }

    /// Buffers for passes of up to `spec.rows` token rows (capped by what one binding
    /// holds); `spec.logit_rows` rows of logits come back per submit (at least one, and as
    /// many as fit in a quarter of a binding when `rows` asks for more).
    pub(super) fn new(ctx: &GpuContext, spec: &ScratchSpec) -> Self {
        let rows = spec.rows.clamp(1, Self::max_rows(ctx, spec));
        let vocab = spec.vocab;
        let fit = ((ctx.max_binding / 4 / (vocab * 4).max(1) as u64) as usize).max(1);
        let logit_rows = spec
            .logit_rows
            .max(rows.min(fit))
            .clamp(1, fit.max(spec.logit_rows));
        let max_k = Self::max_k(spec);
        let mut at = 0u32;
        let mut take = |n: usize| {
            let o = at;
            at += n as u32;
            o
        };
        let offsets: Vec<u32> = spec.widths.iter().map(|w| take(rows * w)).collect();
        let xs = take(rows * max_k / 32);
        let tab = take(rows * spec.head_dim);
        let slots = rows * spec.experts_used;
        let route_w = take(slots);
        let slot_g = take(slots * spec.expert_ffn);
        let slot_u = take(slots * spec.expert_ffn);
        let slot_y = take(slots * spec.expert_out);
        let logits = take(logit_rows * vocab);
        let floats = at;
        let mut at = 0u32;
        let mut take = |n: usize| {
            let o = at;
            at += n as u32;
            o
        };
        let xq = take(rows * max_k / 4);
        let ids = take(rows);
        let list = take(rows);
        let route_e = take(slots);
        let words = at;
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
            size: (logit_rows * vocab * 4).max(4) as u64,
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
            widths: spec.widths.clone(),
            offsets,
            vocab,
            head_dim: spec.head_dim,
            experts_used: spec.experts_used,
            expert_ffn: spec.expert_ffn,
            expert_out: spec.expert_out,
            logits,
            ids,
            list,
            own: Internal {
                xs,
                tab,
                xq,
                route_w,
                slot_g,
                slot_u,
                slot_y,
                route_e,
            },
            act,
            actq,
            group,
            readback,
            mapped: Arc::new(AtomicBool::new(false)),
            timer,
            ids_host: vec![0; rows],
            tab_host: vec![0.0; rows * spec.head_dim],
            list_host: vec![0; rows],
        }
    }

    /// Offset of buffer `b` in the float buffer.
    pub(super) fn at(&self, b: Buf) -> u32 {
        if b == LOGITS {
            self.logits
        } else {
            self.offsets[b.0]
        }
    }

    pub(super) fn width(&self, b: Buf) -> usize {
        if b == LOGITS {
            self.vocab
        } else {
            self.widths[b.0]
        }
    }
}

/// Maps `buf[..bytes]` for reading and waits for it.
pub(super) fn map_and_wait(
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

pub(super) fn device_error(e: impl std::fmt::Display) -> GpuError {
    GpuError::Device(e.to_string())
}

/// Little-endian words of `bytes` (a multiple of 4 long).
pub(super) fn words_of(bytes: &[u8], out: &mut Vec<u32>) {
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
}

impl GpuVector {
    pub(super) fn upload(ctx: &GpuContext, v: &Vector) -> Self {
        let buf = ctx.storage_buffer(&v.name, (v.len() * 4) as u64);
        if !v.is_empty() {
            ctx.queue.write_buffer(&buf, 0, as_bytes(&v.data));
        }
        let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&v.name),
            layout: &ctx.kernels.aux_layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: buf.as_entire_binding(),
            }],
        });
        Self { group }
    }
}

impl GpuMatrix {
    /// Uploads `m` in its stored type: Q8_0 as its quantized bytes plus f32 block scales,
    /// F16 and F32 as they are.
    pub(super) fn upload(ctx: &GpuContext, m: &Matrix) -> Result<Self, GpuError> {
        Self::upload_aligned(ctx, m, 1)
    }

    /// As [`GpuMatrix::upload`], with every chunk a whole number of `align` rows (a stack of
    /// experts splits only between experts).
    pub(super) fn upload_aligned(
        ctx: &GpuContext,
        m: &Matrix,
        align: usize,
    ) -> Result<Self, GpuError> {
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
        let fit = (ctx.max_binding / dev_row_bytes) as usize / align * align;
        if fit == 0 && align > 1 {
            return Err(GpuError::Device(format!(
                "{}: one expert ({} bytes) is larger than a GPU binding ({} bytes)",
                m.name,
                align as u64 * dev_row_bytes,
                ctx.max_binding
            )));
        }
        let per_chunk = fit.clamp(1, m.rows.max(1));
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

/// The experts of one projection of a mixture-of-experts layer, stacked into one device
/// matrix (expert `e`'s rows at `e * rows`) whose row chunks hold whole experts; every
/// expert's [`Matrix`] points at it.
pub(super) struct GpuExperts {
    pub(super) m: GpuMatrix,
    pub(super) experts: usize,
    pub(super) rows: usize,
}

impl GpuExperts {
    pub(super) fn upload(
        ctx: &GpuContext,
        stacked: &Matrix,
        experts: usize,
    ) -> Result<Self, GpuError> {
        let rows = stacked.rows / experts.max(1);
        Ok(Self {
            m: GpuMatrix::upload_aligned(ctx, stacked, rows.max(1))?,
            experts,
            rows,
        })
    }
}

/// The device stack behind one projection's experts, checked to be theirs.
pub(super) fn device_experts(ms: &[Matrix]) -> Result<&GpuExperts, GpuError> {
    let first = ms
        .first()
        .ok_or_else(|| GpuError::Device("a mixture of no experts".into()))?;
    let missing = || GpuError::Device(format!("{} was not uploaded to the GPU", first.name));
    let stack = first.prepared.as_ref().ok_or_else(missing)?;
    let e = stack.downcast_ref::<GpuExperts>().ok_or_else(missing)?;
    let shared = ms
        .iter()
        .all(|m| m.prepared.as_ref().is_some_and(|p| Arc::ptr_eq(p, stack)));
    if !shared || e.experts != ms.len() || e.rows != first.rows || e.m.cols != first.cols {
        return Err(GpuError::Device(format!(
            "{}: the experts are not one uploaded stack",
            first.name
        )));
    }
    Ok(e)
}
