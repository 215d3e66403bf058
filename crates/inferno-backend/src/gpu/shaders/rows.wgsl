
// Q8_0 products with one weight row per subgroup (SG_ROWS rows per workgroup), where every
// subgroup has the same size: each row's sum is one subgroupAdd, with no workgroup memory and
// no barrier. Parameters as mm_q8.
@compute @workgroup_size(64)
fn mm_q8_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32,
              @builtin(subgroup_id) sg: u32, @builtin(subgroup_size) sg_size: u32) {
    let row = group_index(wid) * SG_ROWS + sg;
    let t0 = wid.z * TN;
    let nt = min(TN, p.c - t0);
    let live = row < p.a;
    let r = select(0u, row, live);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    // Every lane runs the same iterations, so the subgroup is whole again at subgroupAdd
    // (Vulkan does not promise reconvergence after a loop that lanes leave at different
    // times).
    for (var u0 = 0u; u0 < p.b / 8u; u0 += sg_size) {
        let u = u0 + lane;
        if (u < p.b / 8u) {
            q8_unit(r, u, t0, nt, &acc);
        }
    }
    for (var t = 0u; t < nt; t++) {
        let s = subgroupAdd(acc[t]);
        if (live && lane == 0u) {
            act[p.f + (t0 + t) * p.g + p.h + row] = s;
        }
    }
}
