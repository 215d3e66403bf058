//! Every WGSL shader variant translates to Metal Shading Language within Apple GPU limits,
//! checked with naga (the translator wgpu's Metal backend uses) on any host, so a shader
//! change that would fail only on the Apple Silicon hosts fails here first.

use super::{rows_per_group, shader_sources};
use naga::back::msl;
use naga::valid::{Capabilities, ValidationFlags, Validator};

/// Threads per threadgroup an Apple GPU runs at most.
const MAX_THREADS_PER_GROUP: u32 = 1024;
/// Threadgroup memory an Apple GPU gives a dispatch, in bytes.
const MAX_THREADGROUP_MEMORY: u32 = 32 * 1024;
/// Buffer argument slots a Metal function has.
const MAX_BUFFERS: usize = 31;

#[test]
fn every_shader_variant_translates_to_metal_within_apple_limits() {
    // What wgpu's Metal backend offers the shaders: immediates (push constants), f16
    // packing in f32 (`unpack2x16float`) and, on Apple7 and later, subgroups (SIMD groups).
    let capabilities =
        Capabilities::IMMEDIATES | Capabilities::SHADER_FLOAT16_IN_FLOAT32 | Capabilities::SUBGROUP;
    let mut translated = 0;
    for subgroups in [false, true] {
        for dot4 in [false, true] {
            // Every row count a device's subgroup sizes can select.
            let mut rows: Vec<u32> = (1..=128)
                .map(|size| rows_per_group(subgroups, size, size))
                .collect();
            rows.sort_unstable();
            rows.dedup();
            for rows_per_group in rows {
                for (label, src) in shader_sources(subgroups, dot4, rows_per_group) {
                    let what = format!(
                        "{label} (subgroups {subgroups}, dot4 {dot4}, rows {rows_per_group})"
                    );
                    let module = naga::front::wgsl::parse_str(&src)
                        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&src)));
                    let info = Validator::new(ValidationFlags::all(), capabilities)
                        .validate(&module)
                        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                    for ep in &module.entry_points {
                        let [x, y, z] = ep.workgroup_size;
                        assert!(
                            x * y * z <= MAX_THREADS_PER_GROUP,
                            "{what}: {} has {x}x{y}x{z} threads",
                            ep.name
                        );
                    }
                    let shared: u32 = module
                        .global_variables
                        .iter()
                        .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
                        .map(|(_, v)| module.types[v.ty].inner.size(module.to_ctx()))
                        .sum();
                    assert!(
                        shared <= MAX_THREADGROUP_MEMORY,
                        "{what}: {shared} bytes of threadgroup memory"
                    );
                    let buffers = module
                        .global_variables
                        .iter()
                        .filter(|(_, v)| matches!(v.space, naga::AddressSpace::Storage { .. }))
                        .count();
                    assert!(buffers <= MAX_BUFFERS, "{what}: {buffers} buffers");
                    let options = msl::Options {
                        // Metal 2.4: macOS 12, the first with every SIMD-group function used.
                        lang_version: (2, 4),
                        fake_missing_bindings: true,
                        ..msl::Options::default()
                    };
                    let (metal, _) = msl::write_string(
                        &module,
                        &info,
                        &options,
                        &msl::PipelineOptions::default(),
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                    assert_eq!(
                        metal.matches("kernel void ").count(),
                        module.entry_points.len(),
                        "{what}: not every entry point became a Metal kernel"
                    );
                    translated += 1;
                }
            }
        }
    }
    // 2 plain variants and 10 subgroup ones, of three modules each.
    assert_eq!(translated, 36);
}
