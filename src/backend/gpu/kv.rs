//! A sequence's KV cache in device memory: per layer one key and one value buffer laid out
//! `[kv_head][capacity][head_dim]` in f32 (as on the host), with the bind group the KV store
//! and attention kernels use, built once when the cache is made.

use super::GpuContext;
use std::sync::Arc;

pub struct GpuKv {
    ctx: Arc<GpuContext>,
    k: Vec<wgpu::Buffer>,
    v: Vec<wgpu::Buffer>,
    groups: Vec<wgpu::BindGroup>,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl GpuKv {
    /// The most positions one layer's buffer can hold on this device.
    pub fn max_capacity(ctx: &GpuContext, n_kv_heads: usize, head_dim: usize) -> usize {
        (ctx.max_binding / (n_kv_heads * head_dim * 4) as u64) as usize
    }

    pub fn new(
        ctx: &Arc<GpuContext>,
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Self {
        let bytes = (n_kv_heads * capacity * head_dim * 4) as u64;
        let k: Vec<_> = (0..n_layers)
            .map(|_| ctx.storage_buffer("k cache", bytes))
            .collect();
        let v: Vec<_> = (0..n_layers)
            .map(|_| ctx.storage_buffer("v cache", bytes))
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
        }
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
        let row = (self.head_dim * 4) as u64;
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kv prefix copy"),
            });
        for (dst, src) in [(&self.k, &other.k), (&self.v, &other.v)] {
            for (d, s) in dst.iter().zip(src) {
                for h in 0..self.n_kv_heads {
                    enc.copy_buffer_to_buffer(
                        s,
                        (h * other.capacity) as u64 * row,
                        d,
                        (h * self.capacity) as u64 * row,
                        n as u64 * row,
                    );
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
    }
}
