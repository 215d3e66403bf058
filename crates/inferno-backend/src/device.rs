//! What a model runs on: a [`Device`] is either a host kernel stack (a [`Backend`]) or the
//! GPU. It prepares weights at load, makes KV caches and activation buffers where its
//! executor reads them, and runs one forward-pass step through the matching [`Executor`].

use super::cpu::host::{HostExec, HostScratch};
use super::exec::{Executor, ScratchSpec, SeqStep, Traced};
use super::gpu::{GpuBackend, GpuError, GpuExec, GpuScratch};
use super::kv_cache::{KvCache, KvShape, KvType};
use super::Backend;
use inferno_tensor::{GgmlType, Matrix, Vector};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("head size {head_dim} is not supported (1 to {max})")]
    HeadDim { head_dim: usize, max: usize },
    #[error("the scratch buffers were made for another device")]
    ForeignScratch,
    #[error("a KV cache in {found} memory reached a step on the {device} device")]
    ForeignCache {
        found: &'static str,
        device: &'static str,
    },
    #[error(transparent)]
    KvType(#[from] super::kv_cache::KvTypeError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

#[derive(Clone)]
enum Target {
    Host(Arc<dyn Backend>),
    Gpu(Arc<GpuBackend>),
}

/// A compute device for whole forward passes (see the module docs).
#[derive(Clone)]
pub struct Device {
    target: Target,
    /// Wrap every step's executor in [`Traced`].
    tracing: bool,
}

/// A step's activation buffers, made by the device that reads them.
pub enum Scratch {
    Host(HostScratch),
    Gpu(GpuScratch),
}

impl Scratch {
    /// Token rows one forward pass may hold.
    pub fn rows(&self) -> usize {
        match self {
            Scratch::Host(s) => s.rows(),
            Scratch::Gpu(s) => s.rows(),
        }
    }
}

impl From<Arc<dyn Backend>> for Device {
    fn from(be: Arc<dyn Backend>) -> Self {
        Self::host(be)
    }
}

impl From<Arc<GpuBackend>> for Device {
    fn from(gpu: Arc<GpuBackend>) -> Self {
        Self::gpu(gpu)
    }
}

impl Device {
    /// Host kernels: the model runs operation by operation on host buffers.
    pub fn host(be: Arc<dyn Backend>) -> Self {
        Self {
            target: Target::Host(be),
            tracing: false,
        }
    }

    /// The GPU: each step is recorded into one command buffer.
    pub fn gpu(gpu: Arc<GpuBackend>) -> Self {
        Self {
            target: Target::Gpu(gpu),
            tracing: false,
        }
    }

    /// With a TRACE span around every operation of every step.
    pub fn traced(mut self, on: bool) -> Self {
        self.tracing = on;
        self
    }

    /// The backend's name (`pool`, `gpu`, ...).
    pub fn name(&self) -> &str {
        match &self.target {
            Target::Host(be) => be.name(),
            Target::Gpu(_) => "gpu",
        }
    }

    /// Threads the device computes on (host threads; 1 for the GPU's host side).
    pub fn threads(&self) -> usize {
        match &self.target {
            Target::Host(be) => be.threads(),
            Target::Gpu(_) => 1,
        }
    }

    /// The host kernels, for a host device.
    pub fn host_backend(&self) -> Option<&Arc<dyn Backend>> {
        match &self.target {
            Target::Host(be) => Some(be),
            Target::Gpu(_) => None,
        }
    }

    /// The GPU, for a GPU device.
    pub fn gpu_backend(&self) -> Option<&GpuBackend> {
        match &self.target {
            Target::Gpu(g) => Some(g),
            Target::Host(_) => None,
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.target, Target::Gpu(_))
    }

    /// Whether matrices of this type can be multiplied and looked up.
    pub fn supports(&self, dtype: GgmlType) -> bool {
        match &self.target {
            Target::Host(be) => be.supports(dtype),
            Target::Gpu(g) => g.supports(dtype),
        }
    }

    /// Once per weight matrix at load: the host kernels may attach a repacked copy, the GPU
    /// uploads it.
    pub fn prepare_matrix(&self, m: &mut Matrix) -> Result<(), DeviceError> {
        match &self.target {
            Target::Host(be) => be.prepare(m),
            Target::Gpu(g) => g.upload_matrix(m)?,
        }
        Ok(())
    }

    /// Once per stacked expert tensor at load: `stacked` is every expert of one projection
    /// as one matrix (expert `e`'s rows at `e * rows ..`), `experts` the views of it the
    /// model keeps. The host has nothing to do here (the loader repacks the views one by one
    /// or leaves them mapped, see `ExpertWeights`); the GPU uploads the stack once, so one
    /// dispatch reaches every expert.
    pub fn prepare_experts(
        &self,
        stacked: &Matrix,
        experts: &mut [Matrix],
    ) -> Result<(), DeviceError> {
        if let Target::Gpu(g) = &self.target {
            g.upload_experts(stacked, experts)?;
        }
        Ok(())
    }

    /// Once per vector (norm gains, biases) at load.
    pub fn prepare_vector(&self, v: &mut Vector) -> Result<(), DeviceError> {
        if let Target::Gpu(g) = &self.target {
            g.upload_vector(v)?;
        }
        Ok(())
    }

    /// Whether attention heads of this size can run here.
    pub fn check_head_dim(&self, head_dim: usize) -> Result<(), DeviceError> {
        match &self.target {
            Target::Host(_) if head_dim > super::cpu::scalar::MAX_HEAD_DIM || head_dim == 0 => {
                Err(DeviceError::HeadDim {
                    head_dim,
                    max: super::cpu::scalar::MAX_HEAD_DIM,
                })
            }
            Target::Host(_) => Ok(()),
            Target::Gpu(g) => Ok(g.check_head_dim(head_dim)?),
        }
    }

    /// Whether KV caches of these key and value types with heads of `head_dim` values can
    /// be made here.
    pub fn check_kv_types(
        &self,
        types: (KvType, KvType),
        head_dim: usize,
    ) -> Result<(), DeviceError> {
        types.0.check_head_dim(head_dim)?;
        types.1.check_head_dim(head_dim)?;
        Ok(())
    }

    /// An empty KV cache of up to `capacity` positions (fewer where one layer's buffer
    /// cannot hold that many on the GPU), of this shape (its types checked with
    /// [`Self::check_kv_types`]).
    pub fn new_kv_cache(&self, kv: KvShape, capacity: usize) -> KvCache {
        match &self.target {
            Target::Host(_) => KvCache::with_shape(kv, capacity.max(1)),
            Target::Gpu(g) => {
                let capacity = capacity.min(g.max_kv_capacity(kv)).max(1);
                KvCache::on_device_memory(Box::new(g.new_kv(kv, capacity)), kv)
            }
        }
    }

    pub fn new_scratch(&self, spec: &ScratchSpec) -> Scratch {
        match &self.target {
            Target::Host(_) => Scratch::Host(HostScratch::new(spec)),
            Target::Gpu(g) => Scratch::Gpu(g.new_scratch(spec)),
        }
    }

    /// Runs one forward-pass step over `seqs` (their shapes and sizes already checked by
    /// the model): `pass` issues the step's operations to the device's executor.
    pub fn step(
        &self,
        seqs: &mut [SeqStep<'_>],
        scratch: &mut Scratch,
        pass: &dyn Fn(&mut dyn Executor),
    ) -> Result<(), DeviceError> {
        let on_gpu = self.is_gpu();
        if let Some(s) = seqs.iter().find(|s| s.kv.on_device() != on_gpu) {
            let (found, device) = match s.kv.on_device() {
                true => ("device", "host"),
                false => ("host", "gpu"),
            };
            return Err(DeviceError::ForeignCache { found, device });
        }
        let run = |ex: &mut dyn Executor| {
            if self.tracing {
                pass(&mut Traced(ex))
            } else {
                pass(ex)
            }
        };
        match (&self.target, scratch) {
            (Target::Host(be), Scratch::Host(sc)) => {
                run(&mut HostExec::new(be.as_ref(), sc, seqs));
                Ok(())
            }
            (Target::Gpu(g), Scratch::Gpu(sc)) => {
                let mut ex = GpuExec::new(g, sc, seqs);
                run(&mut ex);
                Ok(ex.finish()?)
            }
            _ => Err(DeviceError::ForeignScratch),
        }
    }
}
