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

// Mixture-of-experts routing, one invocation per row: the softmax of the row's router
// logits (written back over them: nothing reads the logits after), the `k` most probable
// experts (among equal probabilities the lower index; chosen ones are skipped by index, so
// even NaN picks `k` different experts), their probabilities (divided by their sum, taken
// in the order chosen, when normalizing), and last the row's slots ordered by expert, so
// the mixture is summed in expert order as on the host.
// a: router offset, b: experts, c: rows, d: k, e: normalize, f: slot experts (actq),
// g: slot weights.
@compute @workgroup_size(64)
fn moe_route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid) * WG + lid;
    if (t >= p.c) {
        return;
    }
    let lo = p.a + t * p.b;
    let ids = p.f + t * p.d;
    let ws = p.g + t * p.d;
    var mx = bitcast<f32>(0xff800000u);
    for (var e = 0u; e < p.b; e++) {
        mx = max(mx, act[lo + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < p.b; e++) {
        let v = exp(act[lo + e] - mx);
        act[lo + e] = v;
        sum += v;
    }
    for (var e = 0u; e < p.b; e++) {
        act[lo + e] = act[lo + e] / sum;
    }
    var total = 0.0;
    for (var j = 0u; j < p.d; j++) {
        var best = 0u;
        var have = false;
        for (var e = 0u; e < p.b; e++) {
            var taken = false;
            for (var i = 0u; i < j; i++) {
                taken = taken || actq[ids + i] == e;
            }
            if (!taken && (!have || act[lo + e] > act[lo + best])) {
                best = e;
                have = true;
            }
        }
        actq[ids + j] = best;
        act[ws + j] = act[lo + best];
        total += act[lo + best];
    }
    if (p.e != 0u) {
        for (var j = 0u; j < p.d; j++) {
            act[ws + j] = act[ws + j] / total;
        }
    }
    for (var j = 1u; j < p.d; j++) {
        let e = actq[ids + j];
        let w = act[ws + j];
        var i = j;
        while (i > 0u && actq[ids + i - 1u] > e) {
            actq[ids + i] = actq[ids + i - 1u];
            act[ws + i] = act[ws + i - 1u];
            i--;
        }
        actq[ids + i] = e;
        act[ws + i] = w;
    }
}

// The mixture: out[t] = sum over row t's slots, in order, of weight * expert output.
// a: slot outputs, b: out offset, c: width, d: slots per row, e: slot weights, f: rows.
@compute @workgroup_size(64)
fn moe_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    if (idx >= p.f * p.c) {
        return;
    }
    let t = idx / p.c;
    let c = idx % p.c;
    var s = 0.0;
    for (var j = 0u; j < p.d; j++) {
        let slot = t * p.d + j;
        s += act[p.a + slot * p.c + c] * act[p.e + slot];
    }
    act[p.b + idx] = s;
}
