//! Plain-Rust activation quantization, for CPUs without a vector path: the scalar backend's
//! arithmetic exactly. Each concern's folder has its own portable kernels beside its x86 and
//! AArch64 ones (`float/portable.rs`, `packed_q8/portable.rs`, `attention/portable.rs`).

use half::f16;
use inferno_tensor::q8_0;

/// Q8_0 quantization of whole rows, as `q8_0::quantize` (round half away from zero), with the
/// per-block scale widened back from f16, −128 × the per-block sum of the quants, and the
/// Q8_1 sum field of `legacy::quantize_q8_1` (`Σq · amax / 127` rounded to f16), widened.
pub fn quantize_rows(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32], m: &mut [f32]) {
    for (bi, xb) in x.chunks_exact(q8_0::BLOCK).enumerate() {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        d[bi] = f16::from_f32(dd).to_f32();
        let mut sum = 0i32;
        for (o, &v) in q[bi * q8_0::BLOCK..(bi + 1) * q8_0::BLOCK]
            .iter_mut()
            .zip(xb)
        {
            *o = (v * id).round() as i8;
            sum += *o as i32;
        }
        s[bi] = -128 * sum;
        m[bi] = f16::from_f32(sum as f32 * dd).to_f32();
    }
}
