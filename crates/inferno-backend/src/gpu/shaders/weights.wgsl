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

// Element `i` of a Q8_0 (0), F16 (1) or F32 (2) matrix chunk.
fn w_elem(kind: u32, i: u32) -> f32 {
    var v: f32;
    switch kind {
        case 0u: {
            v = w_q8(i);
        }
        case 1u: {
            v = w_f16(i);
        }
        default: {
            v = w_f32(i);
        }
    }
    return v;
}

// Row `id - row0` of this chunk for every token row whose id falls in it.
// a: cols, b: rows (tokens), c: ids offset (actq), d: out offset, e: row0, f: chunk rows,
// g: element type (0 Q8_0, 1 F16, 2 F32).
@compute @workgroup_size(64)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.a * p.b) {
        return;
    }
    let t = idx / p.a;
    let c = idx % p.a;
    let id = actq[p.c + t];
    if (id < p.e || id >= p.e + p.f) {
        return;
    }
    let v = w_elem(p.g, (id - p.e) * p.a + c);
    act[p.d + idx] = v;
}

// 4 x i8 dot product: the hardware instruction where the adapter has it, else unpacked.
fn dot4(a: u32, b: u32) -> i32 {
    DOT4_BODY
}

var<workgroup> partial: array<f32, 512>;

// Adds the products of Q8_0 weight row `row` with tokens t0..t0 + nt over unit `u` (8
// columns: two words, in block u / 4) to `acc`: exact integer sums, scaled by both scales.
// Parameters as mm_q8.
fn q8_unit(row: u32, u: u32, t0: u32, nt: u32, acc: ptr<function, array<f32, 8>>) {
    let wpr = p.b / 4u;
    let bpr = p.b / 32u;
    let blk = u / 4u;
    let w0 = wq[row * wpr + 2u * u];
    let w1 = wq[row * wpr + 2u * u + 1u];
    let dw = ws[row * bpr + blk];
    for (var t = 0u; t < nt; t++) {
        let xb = p.d + (t0 + t) * wpr + 2u * u;
        let isum = dot4(w0, actq[xb]) + dot4(w1, actq[xb + 1u]);
        (*acc)[t] += f32(isum) * (dw * act[p.e + (t0 + t) * bpr + blk]);
    }
}

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
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var u = lid; u < p.b / 8u; u += WG) {
        q8_unit(row, u, t0, nt, &acc);
    }
    finish(&acc, lid, SG_VALUES, row, t0, nt);
}

// Float weights: each invocation takes every 64th column, so neighbouring invocations read
// neighbouring weights. Parameters as mm_q8 (d: the f32 activations), i: element type (1 F16,
// 2 F32).
@compute @workgroup_size(64)
fn mm_float(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let row = group_index(wid);
    if (row >= p.a) {
        return;
    }
    let t0 = wid.z * TN;
    let nt = min(TN, p.c - t0);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var c = lid; c < p.b; c += WG) {
        let w = w_elem(p.i, row * p.b + c);
        for (var t = 0u; t < nt; t++) {
            acc[t] += w * act[p.d + (t0 + t) * p.b + c];
        }
    }
    finish(&acc, lid, SG_VALUES, row, t0, nt);
}

// ---------------------------------------------------------------------------------------
// Raw blocks: Q4_1, Q5_1, Q4_K, Q5_K and Q6_K stay as stored, read byte by byte and
// dequantized 32 values at a time in the product (with f32 activations).
// ---------------------------------------------------------------------------------------

const RAW_Q4_1: u32 = 1u;
const RAW_Q5_1: u32 = 2u;
const RAW_Q4_K: u32 = 3u;
const RAW_Q5_K: u32 = 4u;
const RAW_Q6_K: u32 = 5u;

fn wbyte(o: u32) -> u32 {
    return (wq[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

fn wf16(o: u32) -> f32 {
    return unpack2x16float(wbyte(o) | (wbyte(o + 1u) << 8u)).x;
}

fn wu32(o: u32) -> u32 {
    return wbyte(o) | (wbyte(o + 1u) << 8u) | (wbyte(o + 2u) << 16u) | (wbyte(o + 3u) << 24u);
}

// The 6-bit scale and min of sub-block `j` from a K-quant's 12 packed scale bytes at `o`.
fn scale_min_k4(j: u32, o: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(wbyte(o + j) & 63u), f32(wbyte(o + j + 4u) & 63u));
    }
    let sc = (wbyte(o + j + 4u) & 0xfu) | ((wbyte(o + j - 4u) >> 6u) << 4u);
    let m = (wbyte(o + j + 4u) >> 4u) | ((wbyte(o + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// The 32 values of group `g` (32-value groups along the row) of a row starting at byte `ro`.
fn group32(kind: u32, ro: u32, g: u32, out: ptr<function, array<f32, 32>>) {
    switch kind {
        case 1u, 2u: {
            // Q4_1 (20 bytes): d, m, 16 bytes of nibbles. Q5_1 (24): d, m, 32 high bits, nibbles.
            let five = kind == RAW_Q5_1;
            let b = ro + g * select(20u, 24u, five);
            let d = wf16(b);
            let m = wf16(b + 2u);
            let qs = b + select(4u, 8u, five);
            var qh = 0u;
            if (five) {
                qh = wu32(b + 4u);
            }
            for (var j = 0u; j < 16u; j++) {
                let byte = wbyte(qs + j);
                let lo = (byte & 0xfu) | (((qh >> j) & 1u) << 4u);
                let hi = (byte >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
                (*out)[j] = f32(lo) * d + m;
                (*out)[j + 16u] = f32(hi) * d + m;
            }
        }
        case 3u, 4u: {
            // Q4_K (144 bytes per 256 values): d, dmin, 12 scale bytes, 128 bytes of nibbles.
            // Q5_K (176): the same with 32 bytes of high bits before the nibbles.
            let five = kind == RAW_Q5_K;
            let b = ro + (g / 8u) * select(144u, 176u, five);
            let s = g % 8u;
            let d = wf16(b);
            let dmin = wf16(b + 2u);
            let sm = scale_min_k4(s, b + 4u);
            let d1 = d * sm.x;
            let m1 = dmin * sm.y;
            let qs = b + select(16u, 48u, five) + 32u * (s / 2u);
            for (var l = 0u; l < 32u; l++) {
                var q = wbyte(qs + l);
                q = select(q & 0xfu, q >> 4u, (s & 1u) == 1u);
                if (five) {
                    q += ((wbyte(b + 16u + l) >> s) & 1u) << 4u;
                }
                (*out)[l] = d1 * f32(q) - m1;
            }
        }
        default: {
            // Q6_K (210 bytes per 256 values): 128 bytes of low nibbles, 64 of high bit
            // pairs, 16 signed scales, d.
            let b = ro + (g / 8u) * 210u;
            let s = g % 8u;
            let n = s / 4u;
            let sg = s % 4u;
            let d = wf16(b + 208u);
            for (var l = 0u; l < 32u; l++) {
                var lo = wbyte(b + 64u * n + l + 32u * (sg & 1u));
                lo = select(lo & 0xfu, lo >> 4u, sg >= 2u);
                let hi = (wbyte(b + 128u + 32u * n + l) >> (2u * sg)) & 3u;
                let q = i32(lo | (hi << 4u)) - 32;
                let sc = i32(wbyte(b + 192u + 8u * n + l / 16u + 2u * sg) << 24u) >> 24u;
                (*out)[l] = d * f32(sc) * f32(q);
            }
        }
    }
}

// a: cols, b: rows (tokens), c: ids offset (actq), d: out offset, e: row0, f: chunk rows,
// g: kind, h: row bytes. One invocation per 32 values.
@compute @workgroup_size(64)
fn embed_raw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    let groups = p.a / 32u;
    if (idx >= groups * p.b) {
        return;
    }
    let t = idx / groups;
    let g = idx % groups;
    let id = actq[p.c + t];
    if (id < p.e || id >= p.e + p.f) {
        return;
    }
    var w: array<f32, 32>;
    group32(p.g, (id - p.e) * p.h, g, &w);
    for (var j = 0u; j < 32u; j++) {
        act[p.d + t * p.a + 32u * g + j] = w[j];
    }
}

// As mm_f32, with raw blocks: each invocation takes 32-value groups. i: kind, j: row bytes.
@compute @workgroup_size(64)
fn mm_raw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let row = group_index(wid);
    if (row >= p.a) {
        return;
    }
    let t0 = wid.z * TN;
    let nt = min(TN, p.c - t0);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    var w: array<f32, 32>;
    for (var g = lid; g < p.b / 32u; g += WG) {
        group32(p.i, row * p.j, g, &w);
        for (var t = 0u; t < nt; t++) {
            let xb = p.d + (t0 + t) * p.b + 32u * g;
            var s = 0.0;
            for (var j = 0u; j < 32u; j++) {
                s += w[j] * act[xb + j];
            }
            acc[t] += s;
        }
    }
    finish(&acc, lid, SG_VALUES, row, t0, nt);
}

// ---------------------------------------------------------------------------------------
// Products with routed experts: the matrix is one projection's experts stacked (a chunk
// holds experts e0 .. e0 + k, whole), and output slot s (one row's routed expert) is expert
// ids[s]'s rows times input row s / l. One output value per workgroup; a workgroup whose
// slot's expert lies in another chunk (or is not routed at all) leaves before reading a
// weight. The column loops and the reduction are those of the dense products.
// a: rows per expert, b: cols, c: slots, d: x offset (act; for Q8_0 the quantized words in
// actq), e: x scale offset (Q8_0), f: out offset (a values per slot), g: slot experts
// (actq), h: e0, i: element type or raw kind, j: row bytes, k: experts in the chunk,
// l: slots per input row.
// ---------------------------------------------------------------------------------------

var<workgroup> slot_expert: u32;

// The expert of `slot`, the same in every invocation (read once, through workgroup memory,
// so the early exit and the reductions after it stay in uniform control flow).
fn expert_of(slot: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        slot_expert = actq[p.g + slot];
    }
    return workgroupUniformLoad(&slot_expert);
}

fn finish_slot(acc: ptr<function, array<f32, 8>>, lid: u32, sg_lane: u32, sg_id: u32, sg_n: u32, o: u32) {
    let nt = 1u;
    REDUCE_BODY
    if (lid == 0u) {
        act[o] = partial[0];
    }
}

@compute @workgroup_size(64)
fn mm_id_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let idx = group_index(wid);
    if (idx >= p.a * p.c) {
        return;
    }
    let slot = idx / p.a;
    let e = expert_of(slot, lid);
    if (e < p.h || e >= p.h + p.k) {
        return;
    }
    let row = (e - p.h) * p.a + idx % p.a;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var u = lid; u < p.b / 8u; u += WG) {
        q8_unit(row, u, slot / p.l, 1u, &acc);
    }
    finish_slot(&acc, lid, SG_VALUES, p.f + idx);
}

@compute @workgroup_size(64)
fn mm_id_float(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let idx = group_index(wid);
    if (idx >= p.a * p.c) {
        return;
    }
    let slot = idx / p.a;
    let e = expert_of(slot, lid);
    if (e < p.h || e >= p.h + p.k) {
        return;
    }
    let row = (e - p.h) * p.a + idx % p.a;
    let xb = p.d + (slot / p.l) * p.b;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var c = lid; c < p.b; c += WG) {
        acc[0] += w_elem(p.i, row * p.b + c) * act[xb + c];
    }
    finish_slot(&acc, lid, SG_VALUES, p.f + idx);
}

@compute @workgroup_size(64)
fn mm_id_raw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_ARGS) {
    let idx = group_index(wid);
    if (idx >= p.a * p.c) {
        return;
    }
    let slot = idx / p.a;
    let e = expert_of(slot, lid);
    if (e < p.h || e >= p.h + p.k) {
        return;
    }
    let row = (e - p.h) * p.a + idx % p.a;
    let x0 = p.d + (slot / p.l) * p.b;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    var w: array<f32, 32>;
    for (var g = lid; g < p.b / 32u; g += WG) {
        group32(p.i, row * p.j, g, &w);
        let xb = x0 + 32u * g;
        var s = 0.0;
        for (var j = 0u; j < 32u; j++) {
            s += w[j] * act[xb + j];
        }
        acc[0] += s;
    }
    finish_slot(&acc, lid, SG_VALUES, p.f + idx);
}
