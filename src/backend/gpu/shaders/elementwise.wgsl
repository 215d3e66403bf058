// Norms, RoPE, biases, the SwiGLU gate, residual adds, row gathers. Bind group 1 holds the
// model's small f32 vectors (norm gains, biases), concatenated.

@group(1) @binding(0) var<storage, read> aux: array<f32>;

// RMSNorm of `rows` rows of `dim`: dst = src / sqrt(mean(src^2) + eps) * gain.
// a: src offset, b: dst offset, c: dim, d: gain offset (aux), e: eps (f32 bits).
@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid);
    let dim = p.c;
    let src = p.a + r * dim;
    let dst = p.b + r * dim;
    var ss = 0.0;
    for (var i = lid; i < dim; i += WG) {
        let v = act[src + i];
        ss += v * v;
    }
    let total = wg_sum(ss, lid);
    let inv = 1.0 / sqrt(total / f32(dim) + bitcast<f32>(p.e));
    for (var i = lid; i < dim; i += WG) {
        act[dst + i] = act[src + i] * inv * aux[p.d + i];
    }
}

// Rotary embedding (NEOX half-split) of `rows` rows of `heads` heads. Each row has its own
// table of cos (first half) and sin (second half) at its position, made on the host.
// a: offset, b: heads, c: head_dim, d: rows, e: table offset.
@compute @workgroup_size(64)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    let half = p.c / 2u;
    if (idx >= p.d * p.b * half) {
        return;
    }
    let i = idx % half;
    let rh = idx / half;
    let r = rh / p.b;
    let base = p.a + rh * p.c;
    let cs = act[p.e + r * p.c + i];
    let sn = act[p.e + r * p.c + half + i];
    let x0 = act[base + i];
    let x1 = act[base + i + half];
    act[base + i] = x0 * cs - x1 * sn;
    act[base + i + half] = x1 * cs + x0 * sn;
}

// Adds a bias (aux) to every `dim`-long row. a: offset, b: dim, c: count, d: bias offset.
@compute @workgroup_size(64)
fn add_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.c) {
        return;
    }
    act[p.a + idx] += aux[p.d + idx % p.b];
}

// gate = silu(gate) * up. a: gate offset, b: up offset, c: count.
@compute @workgroup_size(64)
fn silu_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.c) {
        return;
    }
    let g = act[p.a + idx];
    act[p.a + idx] = g / (1.0 + exp(-g)) * act[p.b + idx];
}

// x += y. a: x offset, b: y offset, c: count.
@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.c) {
        return;
    }
    act[p.a + idx] += act[p.b + idx];
}

// dst row i = src row list[i]. a: src offset, b: dst offset, c: dim, d: list offset (actq),
// e: rows.
@compute @workgroup_size(64)
fn gather_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.e * p.c) {
        return;
    }
    let i = idx / p.c;
    let c = idx % p.c;
    act[p.b + idx] = act[p.a + actq[p.d + i] * p.c + c];
}

// Quantizes `count` values (whole 32-value blocks) to Q8_0 as the CPU kernels do: scale =
// max|x| / 127 stored as f16, values rounded to nearest with ties away from zero, four to a
// word. a: src offset, b: quantized word offset (actq), c: scale offset, d: blocks.
@compute @workgroup_size(64)
fn quantize_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let blk = group_index(wid) * WG + lid;
    if (blk >= p.d) {
        return;
    }
    let src = p.a + blk * 32u;
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(act[src + i]));
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (d != 0.0) {
        id = 1.0 / d;
    }
    act[p.c + blk] = unpack2x16float(pack2x16float(vec2<f32>(d, 0.0))).x;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var j = 0u; j < 4u; j++) {
            let v = act[src + w * 4u + j] * id;
            let q = clamp(sign(v) * floor(abs(v) + 0.5), -128.0, 127.0);
            word |= (u32(i32(q)) & 0xffu) << (8u * j);
        }
        actq[p.b + blk * 8u + w] = word;
    }
}
