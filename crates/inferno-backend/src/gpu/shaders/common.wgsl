// Shared by every kernel: the per-dispatch parameters (immediate data, set per dispatch) and
// the sequence's activation buffers (bind group 0). Offsets are in elements.

struct Params {
    a: u32, b: u32, c: u32, d: u32,
    e: u32, f: u32, g: u32, h: u32,
    i: u32, j: u32, k: u32, l: u32,
}
var<immediate> p: Params;

// Float activations: residual, normed copy, Q/K/V, FFN, logits, quantized-activation scales,
// RoPE tables.
@group(0) @binding(0) var<storage, read_write> act: array<f32>;
// Integer data: quantized activations (4 x i8 per word), token ids, row lists.
@group(0) @binding(1) var<storage, read_write> actq: array<u32>;

const WG: u32 = 64u;
// Large grids are laid out two-dimensionally: x counts up to this many workgroups.
const GRID_X: u32 = 32768u;

fn group_index(wid: vec3<u32>) -> u32 {
    return wid.x + wid.y * GRID_X;
}

var<workgroup> red: array<f32, 64>;

// Sum of `v` over the workgroup (every invocation gets the total).
fn wg_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}
