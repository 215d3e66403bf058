//! Builds a backend stack from its name.

use super::gpu::GpuBackend;
use super::{Backend, ParallelBackend, PoolBackend, ScalarBackend, SimdBackend, TracingBackend};
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
    /// Wrap the stack in the tracing decorator.
    pub tracing: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend {name:?} (supported: {supported})")]
    Unknown { name: String, supported: String },
    #[error(transparent)]
    Gpu(#[from] super::gpu::GpuError),
}

pub fn create_backend(name: &str, opts: &BackendOptions) -> Result<Arc<dyn Backend>, BackendError> {
    let base: Box<dyn Backend> = match name.trim() {
        "scalar" => Box::new(ScalarBackend::new()),
        "simd" => Box::new(SimdBackend::new(ScalarBackend::new())),
        "parallel" => Box::new(ParallelBackend::new(
            SimdBackend::new(ScalarBackend::new()),
            opts.threads,
        )),
        "pool" => Box::new(PoolBackend::new(
            SimdBackend::new(ScalarBackend::new()),
            opts.threads,
        )),
        name if name == "gpu" || name == GPU_ALIAS => Box::new(GpuBackend::new()?),
        other => {
            return Err(BackendError::Unknown {
                name: other.to_string(),
                supported: format!("{}, {GPU_ALIAS}", BACKEND_NAMES.join(", ")),
            })
        }
    };
    Ok(if opts.tracing {
        Arc::new(TracingBackend::new(base))
    } else {
        Arc::from(base)
    })
}
