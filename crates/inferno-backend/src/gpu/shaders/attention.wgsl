// The KV store and causal grouped-query attention of one sequence over its cache (bind group
// 1): per layer [kv_head][capacity] rows of head_dim values in the cache's type (KV_F32; KV_F16,
// two values a word; KV_Q8_0, every row's quants four a word, then every 32-value block's
// scale as f32), the same values as the host cache holds.

@group(1) @binding(0) var<storage, read_write> kc: array<u32>;
@group(1) @binding(1) var<storage, read_write> vc: array<u32>;

const KV_F32: u32 = 0u;
const KV_F16: u32 = 1u;
const KV_Q8_0: u32 = 2u;

// Value d of cache row `row` (rows of hd values; `rows` rows in the buffer) stored as `ty`.
fn kv_value(w: u32, ty: u32, d: u32) -> f32 {
    if (ty == KV_F16) {
        return unpack2x16float(w)[d & 1u];
    }
    if (ty == KV_Q8_0) {
        return f32((bitcast<i32>(w << (24u - 8u * (d & 3u)))) >> 24u);
    }
    return bitcast<f32>(w);
}

fn kv_word(ty: u32, row: u32, d: u32, hd: u32) -> u32 {
    if (ty == KV_F16) {
        return (row * hd + d) / 2u;
    }
    if (ty == KV_Q8_0) {
        return (row * hd + d) / 4u;
    }
    return row * hd + d;
}

// Index of row `row`'s scale for value d (Q8_0), after the quants of `rows` rows.
fn kv_scale_word(row: u32, d: u32, hd: u32, rows: u32) -> u32 {
    return rows * hd / 4u + (row * hd + d) / 32u;
}

fn k_at(row: u32, d: u32, hd: u32, rows: u32) -> f32 {
    let ty = p.j;
    let x = kv_value(kc[kv_word(ty, row, d, hd)], ty, d);
    if (ty == KV_Q8_0) {
        return x * bitcast<f32>(kc[kv_scale_word(row, d, hd, rows)]);
    }
    return x;
}

fn v_at(row: u32, d: u32, hd: u32, rows: u32) -> f32 {
    let ty = p.k;
    let x = kv_value(vc[kv_word(ty, row, d, hd)], ty, d);
    if (ty == KV_Q8_0) {
        return x * bitcast<f32>(vc[kv_scale_word(row, d, hd, rows)]);
    }
    return x;
}

// Rounds to nearest, ties away from zero (as the host's quantization does).
fn round_away(x: f32) -> f32 {
    return sign(x) * floor(abs(x) + 0.5);
}

// The f16 bits of x rounded to nearest, ties to even, as the host converts (pack2x16float
// leaves the rounding to the implementation).
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let exp = (b >> 23u) & 0xffu;
    let man = b & 0x7fffffu;
    if (exp == 0xffu) {
        return sign | 0x7c00u | select(0u, 0x200u, man != 0u);
    }
    let e = i32(exp) - 112;
    if (e >= 31) {
        return sign | 0x7c00u;
    }
    if (e <= 0) {
        if (e < -10) {
            return sign;
        }
        let m = man | 0x800000u;
        let sh = u32(14 - e);
        let rest = m & ((1u << sh) - 1u);
        let halfway = 1u << (sh - 1u);
        var r = m >> sh;
        if (rest > halfway || (rest == halfway && (r & 1u) == 1u)) {
            r += 1u;
        }
        return sign | r;
    }
    var r = (u32(e) << 10u) | (man >> 13u);
    let rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u) == 1u)) {
        r += 1u;
    }
    return sign | r;
}

// The f16 value nearest x, as f32.
fn to_f16(x: f32) -> f32 {
    return unpack2x16float(f16_bits(x)).x;
}

// Writes value `idx` of the new rows (element `src` of act) into one cache buffer: F32 one word
// per value; F16 the even value of a pair writes both; Q8_0 the first value of a block writes
// its quants and scale.
fn store_one(is_v: bool, ty: u32, src: u32, dst_row: u32, d: u32, hd: u32, rows: u32) {
    if (ty == KV_F32) {
        let w = bitcast<u32>(act[src]);
        if (is_v) { vc[dst_row * hd + d] = w; } else { kc[dst_row * hd + d] = w; }
        return;
    }
    if (ty == KV_F16) {
        if ((d & 1u) != 0u) {
            return;
        }
        let w = f16_bits(act[src]) | (f16_bits(act[src + 1u]) << 16u);
        let at = (dst_row * hd + d) / 2u;
        if (is_v) { vc[at] = w; } else { kc[at] = w; }
        return;
    }
    if ((d & 31u) != 0u) {
        return;
    }
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(act[src + i]));
    }
    let scale = amax / 127.0;
    var inv = 0.0;
    if (scale != 0.0) {
        inv = 1.0 / scale;
    }
    for (var wi = 0u; wi < 8u; wi++) {
        var w = 0u;
        for (var b = 0u; b < 4u; b++) {
            let q = i32(round_away(act[src + wi * 4u + b] * inv));
            w = w | ((bitcast<u32>(q) & 0xffu) << (8u * b));
        }
        let at = (dst_row * hd + d) / 4u + wi;
        if (is_v) { vc[at] = w; } else { kc[at] = w; }
    }
    let s = bitcast<u32>(to_f16(scale));
    let at = kv_scale_word(dst_row, d, hd, rows);
    if (is_v) { vc[at] = s; } else { kc[at] = s; }
}

// Writes `rows` new rows of keys and values at positions pos0... a: key offset (act), b: value
// offset, c: rows, d: pos0, e: kv heads, f: head_dim, g: capacity, h: key type, i: value type.
@compute @workgroup_size(64)
fn kv_store(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid) * WG + lid;
    let kvd = p.e * p.f;
    if (idx >= p.c * kvd) {
        return;
    }
    let t = idx / kvd;
    let rem = idx % kvd;
    let h = rem / p.f;
    let d = rem % p.f;
    let row = h * p.g + p.d + t;
    let rows = p.e * p.g;
    store_one(false, p.h, p.a + idx, row, d, p.f, rows);
    store_one(true, p.i, p.b + idx, row, d, p.f, rows);
}

var<workgroup> q_sh: array<f32, 256>;
var<workgroup> score: array<f32, 64>;

// One workgroup per (head, token): scores over positions 0..=pos0+t in tiles of 64, with a
// running max and sum (online softmax), each invocation accumulating up to 4 output dims.
// a: q offset, b: out offset, c: pos0, d: heads, e: kv heads, f: head_dim, g: capacity,
// h: scale (f32 bits), i: row stride of q and out, j: key type, k: value type.
@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let hd = p.f;
    let kvh = h / (p.d / p.e);
    let qb = p.a + t * p.i + h * hd;
    for (var d = lid; d < hd; d += WG) {
        q_sh[d] = act[qb + d];
    }
    workgroupBarrier();
    let kv_len = p.c + t + 1u;
    let base = kvh * p.g;
    let rows = p.e * p.g;
    let scale = bitcast<f32>(p.h);
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var j0 = 0u; j0 < kv_len; j0 += WG) {
        let j = j0 + lid;
        var s = -3.0e38;
        if (j < kv_len) {
            var dot = 0.0;
            for (var d = 0u; d < hd; d++) {
                dot += q_sh[d] * k_at(base + j, d, hd, rows);
            }
            s = dot * scale;
        }
        score[lid] = s;
        workgroupBarrier();
        let cnt = min(WG, kv_len - j0);
        var tmax = m;
        for (var i = 0u; i < cnt; i++) {
            tmax = max(tmax, score[i]);
        }
        let corr = exp(m - tmax);
        l *= corr;
        for (var k = 0u; k < 4u; k++) {
            acc[k] *= corr;
        }
        for (var i = 0u; i < cnt; i++) {
            let pw = exp(score[i] - tmax);
            l += pw;
            for (var k = 0u; k < 4u; k++) {
                let d = lid + k * WG;
                if (d < hd) {
                    acc[k] += pw * v_at(base + j0 + i, d, hd, rows);
                }
            }
        }
        m = tmax;
        workgroupBarrier();
    }
    let ob = p.b + t * p.i + h * hd;
    for (var k = 0u; k < 4u; k++) {
        let d = lid + k * WG;
        if (d < hd) {
            act[ob + d] = acc[k] / l;
        }
    }
}
