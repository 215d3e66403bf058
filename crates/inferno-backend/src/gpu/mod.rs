//! The `gpu` backend: the whole forward pass on a GPU through wgpu (Vulkan on Linux and
//! Windows, Metal on macOS), as WGSL compute shaders.
//!
//! The model drives it through the same executor interface as the host kernels
//! (`backend::exec`), but nothing runs until the step ends: weights are uploaded once at load
//! in their stored (quantized) layout, each sequence's KV cache lives on the device
//! ([`GpuKv`]), and `GpuExec` records every operation of a step into one command buffer
//! with one submit; only the logits come back.
//!
//! Types: Q8_0 (and Q4_0 and Q5_0, widened exactly to Q8_0 at upload), F16 and F32 keep their
//! values in device memory as stored; Q4_1, Q5_1, Q4_K, Q5_K and Q6_K keep their raw blocks and
//! are dequantized in the product. Q2_K, Q3_K and BF16 are refused at load.
//!
//! A mixture-of-experts layer keeps each projection's experts stacked in one device matrix;
//! the step routes every row on the device and multiplies only the routed experts' rows.
//!
//! Adapter features are used where present: subgroup reductions in the matrix products and
//! the packed 4 × i8 dot product for Q8_0; `INFERNO_GPU_PLAIN=1` selects the plain paths (a
//! workgroup-memory reduction and unpacked bytes), which every adapter runs.

mod buffers;
mod exec;
mod kv;
#[cfg(test)]
mod metal_translation;

pub use buffers::{GpuScratch, StepTimes};
pub(crate) use exec::GpuExec;
pub use kv::GpuKv;

use super::exec::ScratchSpec;
use super::KvShape;
use buffers::{GpuExperts, GpuMatrix, GpuVector, MAX_HEAD_DIM};
use inferno_tensor::{GgmlType, Matrix, Vector};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of per-dispatch parameters (twelve `u32`s, `Params` in the shaders).
const PARAMS_BYTES: u32 = 48;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("the gpu backend found no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("the GPU adapter {adapter:?} cannot run the gpu backend: {reason}")]
    Unsuitable { adapter: String, reason: String },
    #[error("GPU error: {0}")]
    Device(String),
}

/// The device, its queue and the compiled kernels, shared by the model, its scratch buffers
/// and its KV caches.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// Subgroup reductions in the matrix products.
    pub subgroups: bool,
    /// The packed 4 × i8 dot product instruction for Q8_0.
    pub dot4: bool,
    /// Weight rows per workgroup in the Q8_0 product: one per subgroup where every subgroup
    /// has the same size, else 1 (the whole workgroup reduces one row).
    pub rows_per_group: u32,
    /// The largest buffer one binding may cover (big matrices are split into row chunks).
    pub max_binding: u64,
    /// GPU timestamps around a step's compute pass (for the step-time breakdown).
    pub timestamps: bool,
    kernels: Kernels,
    /// The first validation or device error wgpu reported; a step that sees one fails.
    error: Arc<Mutex<Option<String>>>,
}

struct Kernels {
    act_layout: wgpu::BindGroupLayout,
    weight_layout: wgpu::BindGroupLayout,
    aux_layout: wgpu::BindGroupLayout,
    kv_layout: wgpu::BindGroupLayout,
    rms_norm: wgpu::ComputePipeline,
    rope: wgpu::ComputePipeline,
    add_bias: wgpu::ComputePipeline,
    silu_mul: wgpu::ComputePipeline,
    add: wgpu::ComputePipeline,
    gather_rows: wgpu::ComputePipeline,
    quantize_q8: wgpu::ComputePipeline,
    /// Embedding lookup: the stored-element types (Q8_0, F16, F32), and raw blocks.
    embed: wgpu::ComputePipeline,
    embed_raw: wgpu::ComputePipeline,
    /// Matrix products: Q8_0 (integer), float elements (F16, F32), raw blocks.
    mm_q8: wgpu::ComputePipeline,
    mm_float: wgpu::ComputePipeline,
    mm_raw: wgpu::ComputePipeline,
    /// Mixture of experts: routing, the products of routed experts (per weight kind, as the
    /// dense products), the weighted sum.
    moe_route: wgpu::ComputePipeline,
    mm_id_q8: wgpu::ComputePipeline,
    mm_id_float: wgpu::ComputePipeline,
    mm_id_raw: wgpu::ComputePipeline,
    moe_sum: wgpu::ComputePipeline,
    kv_store: wgpu::ComputePipeline,
    attention: wgpu::ComputePipeline,
    /// Weight rows each Q8_0 product workgroup covers.
    q8_rows: u32,
}

/// How the kernels read a weight type:
/// 0 Q8_0 (Q4_0 and Q5_0 are widened to it exactly at upload, as the CPU's multi-row
/// products do), 1 F16, 2 F32, 3 raw blocks dequantized in the shader.
fn weight_kind(dtype: GgmlType) -> Option<usize> {
    match dtype {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => Some(0),
        GgmlType::F16 => Some(1),
        GgmlType::F32 => Some(2),
        _ => raw_kind(dtype).map(|_| 3),
    }
}

/// The raw-block code the shaders' `group32` switches on (`RAW_*` in weights.wgsl).
fn raw_kind(dtype: GgmlType) -> Option<u32> {
    match dtype {
        GgmlType::Q4_1 => Some(1),
        GgmlType::Q5_1 => Some(2),
        GgmlType::Q4_K => Some(3),
        GgmlType::Q5_K => Some(4),
        GgmlType::Q6_K => Some(5),
        _ => None,
    }
}

fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

impl GpuContext {
    /// Opens the first adapter wgpu offers (a discrete or integrated GPU before a software
    /// one) and compiles the kernels; `plain` keeps to the paths every adapter runs;
    /// `binding_cap` lowers the largest binding used (so small models take the row-chunk and
    /// grouped-logits paths that big ones need).
    pub fn open(plain: bool, binding_cap: Option<u64>) -> Result<Self, GpuError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        }))
        .map_err(|e| {
            GpuError::NoAdapter(format!(
                "{e} (Linux needs a Vulkan driver, e.g. Mesa's lavapipe from the package \
                 mesa-vulkan-drivers; macOS uses Metal)"
            ))
        })?;
        let info = adapter.get_info();
        let unsuitable = |reason: String| GpuError::Unsuitable {
            adapter: info.name.clone(),
            reason,
        };
        let have = adapter.features();
        if !have.contains(wgpu::Features::IMMEDIATES) {
            return Err(unsuitable(
                "it has no immediate data (push constants)".into(),
            ));
        }
        let subgroups = !plain && have.contains(wgpu::Features::SUBGROUP);
        let dot4 = !plain
            && instance
                .wgsl_language_features()
                .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
        let timestamps = have.contains(wgpu::Features::TIMESTAMP_QUERY);
        let mut features = wgpu::Features::IMMEDIATES;
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
        }
        if timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let adapter_limits = adapter.limits();
        if adapter_limits.max_immediate_size < PARAMS_BYTES {
            return Err(unsuitable(format!(
                "it holds {} bytes of immediate data, {PARAMS_BYTES} needed",
                adapter_limits.max_immediate_size
            )));
        }
        let limits = wgpu::Limits {
            max_immediate_size: PARAMS_BYTES,
            max_storage_buffer_binding_size: adapter_limits.max_storage_buffer_binding_size,
            max_buffer_size: adapter_limits.max_buffer_size,
            max_compute_workgroup_storage_size: adapter_limits
                .max_compute_workgroup_storage_size
                .max(16384),
            ..wgpu::Limits::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("inferno"),
            required_features: features,
            required_limits: limits,
            ..Default::default()
        }))
        .map_err(|e| unsuitable(e.to_string()))?;
        let error = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&error);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!(error = %e, "GPU error");
            let mut slot = sink.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| e.to_string());
        }));
        let rows_per_group =
            rows_per_group(subgroups, info.subgroup_min_size, info.subgroup_max_size);
        let kernels = Kernels::compile(&device, subgroups, dot4, rows_per_group);
        let max_binding = device
            .limits()
            .max_storage_buffer_binding_size
            .min(binding_cap.unwrap_or(u64::MAX).max(1024));
        Ok(Self {
            device,
            queue,
            info,
            subgroups,
            dot4,
            rows_per_group,
            max_binding,
            timestamps,
            kernels,
            error,
        })
    }

    /// One line naming the adapter and the paths in use.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}; subgroups {}, Q8_0 rows per workgroup {}, dot4I8Packed {})",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            if self.subgroups { "on" } else { "off" },
            self.rows_per_group,
            if self.dot4 { "on" } else { "off" },
        )
    }

    /// The first error the device reported, if any.
    pub(crate) fn take_error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn storage_buffer(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            // Never zero-sized: a binding needs at least one element.
            size: bytes.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `words`.
    fn upload_words(&self, label: &str, words: &[u32]) -> wgpu::Buffer {
        let buf = self.storage_buffer(label, (words.len() * 4) as u64);
        if !words.is_empty() {
            self.queue.write_buffer(&buf, 0, as_bytes(words));
        }
        buf
    }
}

/// The bytes of a `u32`/`f32` slice, for uploads.
fn as_bytes<T: word::Word>(v: &[T]) -> &[u8] {
    // SAFETY: `Word` is implemented only for u32 and f32, plain 4-byte values with no padding
    // and no invalid bit patterns; the slice covers exactly `len * 4` initialised bytes, and
    // u8 has no alignment requirement.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

mod word {
    /// Plain 4-byte values that may be viewed as bytes.
    pub trait Word: Copy {}
    impl Word for u32 {}
    impl Word for f32 {}
}

/// Rows of a Q8_0 product one workgroup of 64 threads takes: one per subgroup, where the
/// subgroup size is fixed (`min == max`) and divides 64; else one for the whole workgroup.
fn rows_per_group(subgroups: bool, min: u32, max: u32) -> u32 {
    match (min, max) {
        (a, b) if subgroups && a == b && (4..=64).contains(&a) && 64 % a == 0 => 64 / a,
        _ => 1,
    }
}

/// The WGSL of the three shader modules (weights, elementwise, attention) for a device's
/// features: subgroup reductions, packed 8-bit dot products, and how many rows a workgroup
/// of subgroups takes. Every variant a device can ask for is one of these.
fn shader_sources(subgroups: bool, dot4: bool, rows_per_group: u32) -> [(&'static str, String); 3] {
    let common = include_str!("shaders/common.wgsl");
    let mut weights_src = include_str!("shaders/weights.wgsl").to_string();
    if rows_per_group > 1 {
        weights_src.push_str(
            &include_str!("shaders/rows.wgsl").replace("SG_ROWS", &format!("{rows_per_group}u")),
        );
    }
    let weights_src = weights_src
        .replace(
            "DOT4_BODY",
            if dot4 {
                "return dot4I8Packed(a, b);"
            } else {
                "let x = vec4<i32>(i32(a << 24u) >> 24u, i32(a << 16u) >> 24u, \
                 i32(a << 8u) >> 24u, i32(a) >> 24u);\n    \
                 let y = vec4<i32>(i32(b << 24u) >> 24u, i32(b << 16u) >> 24u, \
                 i32(b << 8u) >> 24u, i32(b) >> 24u);\n    return dot(x, y);"
            },
        )
        .replace(
            "REDUCE_BODY",
            if subgroups {
                REDUCE_SUBGROUP
            } else {
                REDUCE_PLAIN
            },
        )
        .replace(
            "SG_ARGS",
            if subgroups {
                ", @builtin(subgroup_invocation_id) sg_lane: u32, \
                 @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) sg_n: u32"
            } else {
                ""
            },
        )
        .replace(
            "SG_VALUES",
            if subgroups {
                "sg_lane, sg_id, sg_n"
            } else {
                "0u, 0u, 1u"
            },
        );
    [
        ("weights", weights_src),
        (
            "elementwise",
            include_str!("shaders/elementwise.wgsl").to_string(),
        ),
        (
            "attention",
            include_str!("shaders/attention.wgsl").to_string(),
        ),
    ]
    .map(|(label, body)| (label, format!("{common}\n{body}")))
}

impl Kernels {
    fn compile(device: &wgpu::Device, subgroups: bool, dot4: bool, rows_per_group: u32) -> Self {
        let layout = |label: &str, entries: &[wgpu::BindGroupLayoutEntry]| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(label),
                entries,
            })
        };
        let act_layout = layout("act", &[storage_entry(0, false), storage_entry(1, false)]);
        let weight_layout = layout("weights", &[storage_entry(0, true), storage_entry(1, true)]);
        let aux_layout = layout("aux", &[storage_entry(0, true)]);
        let kv_layout = layout("kv", &[storage_entry(0, false), storage_entry(1, false)]);

        let [weights, elementwise, attention] = shader_sources(subgroups, dot4, rows_per_group)
            .map(|(label, src)| {
                device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(label),
                    source: wgpu::ShaderSource::Wgsl(Cow::Owned(src)),
                })
            });

        let pipeline_layout = |group1: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&act_layout), Some(group1)],
                immediate_size: PARAMS_BYTES,
            })
        };
        let (wl, al, kl) = (
            pipeline_layout(&weight_layout),
            pipeline_layout(&aux_layout),
            pipeline_layout(&kv_layout),
        );
        let pipeline = |layout: &wgpu::PipelineLayout, module: &wgpu::ShaderModule, entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(layout),
                module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        Self {
            rms_norm: pipeline(&al, &elementwise, "rms_norm"),
            rope: pipeline(&al, &elementwise, "rope"),
            add_bias: pipeline(&al, &elementwise, "add_bias"),
            silu_mul: pipeline(&al, &elementwise, "silu_mul"),
            add: pipeline(&al, &elementwise, "add"),
            gather_rows: pipeline(&al, &elementwise, "gather_rows"),
            quantize_q8: pipeline(&al, &elementwise, "quantize_q8"),
            embed: pipeline(&wl, &weights, "embed"),
            embed_raw: pipeline(&wl, &weights, "embed_raw"),
            mm_q8: pipeline(
                &wl,
                &weights,
                if rows_per_group > 1 {
                    "mm_q8_rows"
                } else {
                    "mm_q8"
                },
            ),
            mm_float: pipeline(&wl, &weights, "mm_float"),
            mm_raw: pipeline(&wl, &weights, "mm_raw"),
            moe_route: pipeline(&al, &elementwise, "moe_route"),
            mm_id_q8: pipeline(&wl, &weights, "mm_id_q8"),
            mm_id_float: pipeline(&wl, &weights, "mm_id_float"),
            mm_id_raw: pipeline(&wl, &weights, "mm_id_raw"),
            moe_sum: pipeline(&al, &elementwise, "moe_sum"),
            kv_store: pipeline(&kl, &attention, "kv_store"),
            attention: pipeline(&kl, &attention, "attention"),
            q8_rows: rows_per_group,
            act_layout,
            weight_layout,
            aux_layout,
            kv_layout,
        }
    }
}

/// Sums the per-token accumulators across the workgroup through workgroup memory.
const REDUCE_PLAIN: &str = "
    for (var t = 0u; t < nt; t++) {
        partial[t * WG + lid] = (*acc)[t];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var t = 0u; t < nt; t++) {
                partial[t * WG + lid] += partial[t * WG + lid + s];
            }
        }
        workgroupBarrier();
    }";

/// Sums within each subgroup first, then the few subgroup totals.
const REDUCE_SUBGROUP: &str = "
    for (var t = 0u; t < nt; t++) {
        let v = subgroupAdd((*acc)[t]);
        if (sg_lane == 0u) {
            partial[t * WG + sg_id] = v;
        }
    }
    workgroupBarrier();
    if (lid < nt) {
        var s = 0.0;
        for (var i = 0u; i < sg_n; i++) {
            s += partial[lid * WG + i];
        }
        partial[lid * WG] = s;
    }
    workgroupBarrier();";

/// The `gpu` backend: a device and its compiled kernels, which the model's weights, KV
/// caches and scratch buffers are made on.
pub struct GpuBackend {
    ctx: Arc<GpuContext>,
    /// Group 1 for kernels that read no weights (every pipeline has the slot).
    no_weights: wgpu::BindGroup,
    profiling: AtomicBool,
    times: Mutex<StepTimes>,
}

impl GpuBackend {
    /// The backend on the best paths the adapter offers (plain ones when
    /// `INFERNO_GPU_PLAIN=1`).
    pub fn new() -> Result<Self, GpuError> {
        Self::with_paths(std::env::var("INFERNO_GPU_PLAIN").is_ok_and(|v| v == "1"))
    }

    /// `plain`: no subgroup operations and no packed dot product, whatever the adapter has.
    pub fn with_paths(plain: bool) -> Result<Self, GpuError> {
        Self::with_options(plain, None)
    }

    /// `binding_cap`: see [`GpuContext::open`].
    pub fn with_options(plain: bool, binding_cap: Option<u64>) -> Result<Self, GpuError> {
        let ctx = Arc::new(GpuContext::open(plain, binding_cap)?);
        let no_weights = GpuVector::upload(&ctx, &Vector::new("no weights", vec![0.0])).group;
        Ok(Self {
            ctx,
            no_weights,
            profiling: AtomicBool::new(false),
            times: Mutex::new(StepTimes::default()),
        })
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn no_weights(&self) -> &wgpu::BindGroup {
        &self.no_weights
    }

    /// Whether matrices of this type have GPU kernels.
    pub fn supports(&self, dtype: GgmlType) -> bool {
        weight_kind(dtype).is_some()
    }

    /// Uploads a weight matrix (once, at load) as `m.prepared`.
    pub fn upload_matrix(&self, m: &mut Matrix) -> Result<(), GpuError> {
        let on_device = GpuMatrix::upload(&self.ctx, m)?;
        if let Some(e) = self.ctx.take_error() {
            return Err(GpuError::Device(e));
        }
        m.prepared = Some(Arc::new(on_device));
        Ok(())
    }

    /// Uploads the stacked experts of one projection (once, at load) and makes the stack
    /// every expert's `prepared`.
    pub fn upload_experts(&self, stacked: &Matrix, experts: &mut [Matrix]) -> Result<(), GpuError> {
        let on_device: Arc<dyn std::any::Any + Send + Sync> =
            Arc::new(GpuExperts::upload(&self.ctx, stacked, experts.len())?);
        if let Some(e) = self.ctx.take_error() {
            return Err(GpuError::Device(e));
        }
        for m in experts {
            m.prepared = Some(Arc::clone(&on_device));
        }
        Ok(())
    }

    /// Uploads a vector (once, at load) as `v.prepared`.
    pub fn upload_vector(&self, v: &mut Vector) -> Result<(), GpuError> {
        v.prepared = Some(Arc::new(GpuVector::upload(&self.ctx, v)));
        Ok(())
    }

    /// The attention kernel holds a head in workgroup memory and rotates pairs.
    pub fn check_head_dim(&self, head_dim: usize) -> Result<(), GpuError> {
        if head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(2) {
            return Err(GpuError::Device(format!(
                "head size {head_dim} (the attention kernel takes even sizes up to {MAX_HEAD_DIM})"
            )));
        }
        Ok(())
    }

    /// The most positions a KV cache of this shape can hold on this device.
    pub fn max_kv_capacity(&self, kv: KvShape) -> usize {
        GpuKv::max_capacity(&self.ctx, kv)
    }

    pub fn new_kv(&self, kv: KvShape, capacity: usize) -> GpuKv {
        GpuKv::new(&self.ctx, kv, capacity)
    }

    pub fn new_scratch(&self, spec: &ScratchSpec) -> GpuScratch {
        GpuScratch::new(&self.ctx, spec)
    }

    /// Starts (or stops) timing each step; the sums start again from zero.
    pub fn set_profiling(&self, on: bool) {
        self.profiling.store(on, Ordering::Relaxed);
        *self.times.lock().unwrap_or_else(|p| p.into_inner()) = StepTimes::default();
    }

    fn profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    /// The step times summed since profiling was turned on.
    pub fn step_times(&self) -> StepTimes {
        *self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add_step_times(&self, t: StepTimes) {
        let mut times = self.times.lock().unwrap_or_else(|p| p.into_inner());
        times.steps += t.steps;
        times.encode += t.encode;
        times.submit_to_results += t.submit_to_results;
        times.gpu += t.gpu;
    }
}
