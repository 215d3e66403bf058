// The KV store and causal grouped-query attention of one sequence over its cache (bind group
// 1), laid out [kv_head][capacity][head_dim] per layer.

@group(1) @binding(0) var<storage, read_write> kc: array<f32>;
@group(1) @binding(1) var<storage, read_write> vc: array<f32>;

// Writes `rows` new rows of keys and values at positions pos0... a: key offset (act), b: value
// offset, c: rows, d: pos0, e: kv heads, f: head_dim, g: capacity.
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
    let dst = (h * p.g + p.d + t) * p.f + d;
    kc[dst] = act[p.a + idx];
    vc[dst] = act[p.b + idx];
}

var<workgroup> q_sh: array<f32, 256>;
var<workgroup> score: array<f32, 64>;

// One workgroup per (head, token): scores over positions 0..=pos0+t in tiles of 64, with a
// running max and sum (online softmax), each invocation accumulating up to 4 output dims.
// a: q offset, b: out offset, c: pos0, d: heads, e: kv heads, f: head_dim, g: capacity,
// h: scale (f32 bits), i: row stride of q and out.
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
    let base = kvh * p.g * hd;
    let scale = bitcast<f32>(p.h);
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var j0 = 0u; j0 < kv_len; j0 += WG) {
        let j = j0 + lid;
        var s = -3.0e38;
        if (j < kv_len) {
            var dot = 0.0;
            let kb = base + j * hd;
            for (var d = 0u; d < hd; d++) {
                dot += q_sh[d] * kc[kb + d];
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
            let vb = base + (j0 + i) * hd;
            for (var k = 0u; k < 4u; k++) {
                let d = lid + k * WG;
                if (d < hd) {
                    acc[k] += pw * vc[vb + d];
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
