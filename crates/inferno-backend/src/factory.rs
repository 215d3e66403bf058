//! Builds a device (a host kernel stack, or the GPU) from its backend name.

use super::gpu::GpuBackend;
use super::{Backend, Device, ParallelBackend, PoolBackend, ScalarBackend, SimdBackend};
use std::sync::Arc;

/// Every name `create_backend` accepts (`gpu` also answers to `metal` on macOS and
/// `vulkan` elsewhere).
pub const BACKEND_NAMES: &[&str] = &["scalar", "simd", "parallel", "pool", "gpu"];

/// The platform's name for the GPU backend.
const GPU_ALIAS: &str = if cfg!(target_os = "macos") {
    "metal"
} else {
    "vulkan"
};

#[derive(Clone, Debug, Default)]
pub struct BackendOptions {
    /// Worker threads for the multi-threaded backends (0 = the default for this machine).
    pub threads: usize,
    /// A TRACE span around every operation of every step.
    pub tracing: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend {name:?} (supported: {supported})")]
    Unknown { name: String, supported: String },
    #[error(transparent)]
    Gpu(#[from] super::gpu::GpuError),
}

/// The device named `name` (one of [`BACKEND_NAMES`], or the GPU's platform alias).
pub fn create_backend(name: &str, opts: &BackendOptions) -> Result<Device, BackendError> {
    let host: Arc<dyn Backend> = match name.trim() {
        "scalar" => Arc::new(ScalarBackend::new()),
        "simd" => Arc::new(SimdBackend::new(ScalarBackend::new())),
        "parallel" => Arc::new(ParallelBackend::new(
            SimdBackend::new(ScalarBackend::new()),
            opts.threads,
        )),
        "pool" => Arc::new(PoolBackend::new(
            SimdBackend::new(ScalarBackend::new()),
            opts.threads,
        )),
        name if name == "gpu" || name == GPU_ALIAS => {
            return Ok(Device::gpu(Arc::new(GpuBackend::new()?)).traced(opts.tracing))
        }
        other => {
            return Err(BackendError::Unknown {
                name: other.to_string(),
                supported: format!("{}, {GPU_ALIAS}", BACKEND_NAMES.join(", ")),
            })
        }
    };
    Ok(Device::host(host).traced(opts.tracing))
}
