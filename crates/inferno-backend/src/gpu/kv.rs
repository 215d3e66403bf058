//! A sequence's KV cache in device memory: per layer one key and one value buffer holding
//! `[kv_head][capacity]` rows of `head_dim` values in the cache's type, with the bind group
//! the KV store and attention kernels use, built once when the cache is made.
//!
//! F32 and F16 rows are stored as on the host (F16 two values a word). Q8_0 keeps the same
//! values as the host's blocks in a layout without unaligned words: first every row's
//! quants (four a word), then every block's scale as f32 (the f16 scale, widened).

use super::GpuContext;
use crate::{DeviceKv, KvShape, KvType};
use std::any::Any;
use std::sync::Arc;

pub struct GpuKv {
    ctx: Arc<GpuContext>,
    k: Vec<wgpu::Buffer>,
    v: Vec<wgpu::Buffer>,
    groups: Vec<wgpu::BindGroup>,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    types: (KvType, KvType),
}

/// The type code the shaders switch on (`KV_*` in attention.wgsl).
pub(super) fn kv_code(t: KvType) -> u32 {
    match t {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
    }
}

/// Words of one layer's buffer for `rows` rows of `hd` values, and the regions a row spans:
/// `(region start, words a row)`.
fn layout(t: KvType, rows: usize, hd: usize) -> (usize, Vec<(usize, usize)>) {
    match t {
        KvType::F32 => (rows * hd, vec![(0, hd)]),
        KvType::F16 => (rows * hd / 2, vec![(0, hd / 2)]),
        KvType::Q8_0 => (
            rows * hd / 4 + rows * hd / 32,
            vec![(0, hd / 4), (rows * hd / 4, hd / 32)],
        ),
    }
}

impl GpuKv {
    /// The most positions one layer's buffer can hold on this device.
    pub fn max_capacity(ctx: &GpuContext, kv: KvShape) -> usize {
        let words = |t| layout(t, kv.n_kv_heads, kv.head_dim).0;
        let per_position = (words(kv.types.0).max(words(kv.types.1)) * 4).max(1);
        (ctx.max_binding / per_position as u64) as usize
    }

    pub fn new(ctx: &Arc<GpuContext>, kv: KvShape, capacity: usize) -> Self {
        let KvShape {
            n_layers,
            n_kv_heads,
            head_dim,
            types,
        } = kv;
        let rows = n_kv_heads * capacity;
        let bytes = |t| (layout(t, rows, head_dim).0 * 4) as u64;
        let k: Vec<_> = (0..n_layers)
            .map(|_| ctx.storage_buffer("k cache", bytes(types.0)))
            .collect();
        let v: Vec<_> = (0..n_layers)
            .map(|_| ctx.storage_buffer("v cache", bytes(types.1)))
            .collect();
        let groups = k
            .iter()
            .zip(&v)
            .map(|(k, v)| {
                ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("kv"),
                    layout: &ctx.kernels.kv_layout,
                    entries: &[
                        wgpu::BindGroupEntry {
                            binding: 0,
                            resource: k.as_entire_binding(),
                        },
                        wgpu::BindGroupEntry {
                            binding: 1,
                            resource: v.as_entire_binding(),
                        },
                    ],
                })
            })
            .collect();
        Self {
            ctx: Arc::clone(ctx),
            k,
            v,
            groups,
            n_kv_heads,
            head_dim,
            capacity,
            types,
        }
    }

    /// The key and value type codes, for the kernels.
    pub(super) fn codes(&self) -> (u32, u32) {
        (kv_code(self.types.0), kv_code(self.types.1))
    }

    pub(super) fn group(&self, layer: usize) -> &wgpu::BindGroup {
        &self.groups[layer]
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Copies the first `n` positions of every layer and head from `other` (same shape,
    /// checked by the caller), on the device.
    pub fn copy_prefix_from(&mut self, other: &GpuKv, n: usize) {
        if n == 0 {
            return;
        }
        let hd = self.head_dim;
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kv prefix copy"),
            });
        let (rows, other_rows) = (
            self.n_kv_heads * self.capacity,
            self.n_kv_heads * other.capacity,
        );
        for (dst, src, t) in [
            (&self.k, &other.k, self.types.0),
            (&self.v, &other.v, self.types.1),
        ] {
            let (_, to) = layout(t, rows, hd);
            let (_, from) = layout(t, other_rows, hd);
            for (d, s) in dst.iter().zip(src) {
                for (&(d0, words), &(s0, _)) in to.iter().zip(&from) {
                    for h in 0..self.n_kv_heads {
                        enc.copy_buffer_to_buffer(
                            s,
                            ((s0 + h * other.capacity * words) * 4) as u64,
                            d,
                            ((d0 + h * self.capacity * words) * 4) as u64,
                            (n * words * 4) as u64,
                        );
                    }
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
    }
}

impl DeviceKv for GpuKv {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn copy_prefix_from(&mut self, other: &dyn DeviceKv, n: usize) -> bool {
        match other.as_any().downcast_ref::<GpuKv>() {
            Some(other) => {
                GpuKv::copy_prefix_from(self, other, n);
                true
            }
            None => false,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
