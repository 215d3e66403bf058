// Kernels that read a weight matrix (bind group 1) in its stored type: the token-embedding
// lookup and the matrix products. A matrix may be split into row chunks (a chunk per
// binding); each dispatch covers one chunk.
//
// Q8_0 keeps its quantized values, 4 to a word, with the block scales widened to f32 beside
// them; F16 keeps two halves to a word; F32 one float to a word.

@group(1) @binding(0) var<storage, read> wq: array<u32>;
@group(1) @binding(1) var<storage, read> ws: array<f32>;

// Tokens one workgroup multiplies with each weight row it reads.
const TN: u32 = 8u;

fn w_q8(i: u32) -> f32 {
    let word = wq[i / 4u];
    let byte = i32(word << (24u - 8u * (i % 4u))) >> 24u;
    return f32(byte) * ws[i / 32u];
}

fn w_f16(i: u32) -> f32 {
    let pair = unpack2x16float(wq[i / 2u]);
    return select(pair.x, pair.y, (i % 2u) == 1u);
}

fn w_f32(i: u32) -> f32 {
    return bitcast<f32>(wq[i]);
}

// Row `id - row0` of this chunk for every token row whose id falls in it.
// a: cols, b: rows (tokens), c: ids offset (actq), d: out offset, e: row0, f: chunk rows.
fn embed_at(idx: u32) -> vec2<u32> {
    let t = idx / p.a;
    let c = idx % p.a;
    return vec2<u32>(t, c);
}

@compute @workgroup_size(64)
fn embed_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.a * p.b) {
        return;
    }
    let tc = embed_at(idx);
    let id = actq[p.c + tc.x];
    if (id < p.e || id >= p.e + p.f) {
        return;
    }
    act[p.d + idx] = w_q8((id - p.e) * p.a + tc.y);
}

@compute @workgroup_size(64)
fn embed_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.a * p.b) {
        return;
    }
    let tc = embed_at(idx);
    let id = actq[p.c + tc.x];
    if (id < p.e || id >= p.e + p.f) {
        return;
    }
    act[p.d + idx] = w_f16((id - p.e) * p.a + tc.y);
}

@compute @workgroup_size(64)
fn embed_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.a * p.b) {
        return;
    }
    let tc = embed_at(idx);
    let id = actq[p.c + tc.x];
    if (id < p.e || id >= p.e + p.f) {
        return;
    }
    act[p.d + idx] = w_f32((id - p.e) * p.a + tc.y);
}

// 4 x i8 dot product: the hardware instruction where the adapter has it, else unpacked.
fn dot4(a: u32, b: u32) -> i32 {
    DOT4_BODY
}

var<workgroup> partial: array<f32, 512>;

// Sums each token's accumulator over the workgroup and writes the tile's outputs.
fn finish(acc: ptr<function, array<f32, 8>>, lid: u32, sg_lane: u32, sg_id: u32, sg_n: u32, row: u32, t0: u32, nt: u32) {
    REDUCE_BODY
    if (lid < nt) {
        act[p.f + (t0 + lid) * p.g + p.h + row] = partial[lid * WG];
    }
}

// out[t][row0 + r] = sum_c x[t][c] * w[r][c] for a tile of up to TN tokens (grid z) and one
// weight row per workgroup; each invocation takes 8 columns at a time.
// a: chunk rows, b: cols, c: tokens, d: x offset (act; for Q8_0 the quantized words in actq),
// e: x scale offset (Q8_0), f: out offset, g: out row stride, h: row0 of the chunk.
@compute @workgroup_size(64)
fn mm_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let row = group_index(wid);
    if (row >= p.a) {
        return;
    }
    let t0 = wid.z * TN;
    let nt = min(TN, p.c - t0);
    let wpr = p.b / 4u;
    let bpr = p.b / 32u;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var u = lid; u < p.b / 8u; u += WG) {
        let blk = u / 4u;
        let w0 = wq[row * wpr + 2u * u];
        let w1 = wq[row * wpr + 2u * u + 1u];
        let dw = ws[row * bpr + blk];
        for (var t = 0u; t < nt; t++) {
            let xb = p.d + (t0 + t) * wpr + 2u * u;
            let isum = dot4(w0, actq[xb]) + dot4(w1, actq[xb + 1u]);
            acc[t] += f32(isum) * (dw * act[p.e + (t0 + t) * bpr + blk]);
        }
    }
    finish(&acc, lid, SG_VALUES, row, t0, nt);
}

// Float weights: each invocation takes every 64th column, so neighbouring invocations read
// neighbouring weights.
@compute @workgroup_size(64)
fn mm_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let row = group_index(wid);
    if (row >= p.a) {
        return;
    }
    let t0 = wid.z * TN;
    let nt = min(TN, p.c - t0);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var c = lid; c < p.b; c += WG) {
        let w = w_f16(row * p.b + c);
        for (var t = 0u; t < nt; t++) {
            acc[t] += w * act[p.d + (t0 + t) * p.b + c];
        }
    }
    finish(&acc, lid, SG_VALUES, row, t0, nt);
}

@compute @workgroup_size(64)
fn mm_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let row = group_index(wid);
    if (row >= p.a) {
        return;
    }
    let t0 = wid.z * TN;
    let nt = min(TN, p.c - t0);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var c = lid; c < p.b; c += WG) {
        let w = w_f32(row * p.b + c);
        for (var t = 0u; t < nt; t++) {
            acc[t] += w * act[p.d + (t0 + t) * p.b + c];
        }
    }
    finish(&acc, lid, SG_VALUES, row, t0, nt);
}
