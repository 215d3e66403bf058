//! AArch64 kernels shared by the host's vector code: NEON activation quantization and the
//! helpers of the packed-weight products in the folders beside this file (`sdot`, f16
//! widening, storing a group's rows).
//!
//! The products use the interleaved layouts of [`super::PackedQ8`] and
//! [`super::PackedLegacy`]: a 64-byte slice holds four bytes of each of 16 rows, i.e. four
//! 16-byte registers of four rows each, and `sdot` with the activation's four bytes broadcast
//! to every lane adds each row's four products into its own lane. Lanes then follow the
//! scalar definition exactly: an exact integer sum per block, then
//! `acc += isum as f32 * (d_w * d_x)` (plus `m_w * s_x` for Q4_1 and Q5_1) as separate
//! multiplies and adds, never fused. Packed Q8_0 keeps its scales widened to f32 for this
//! path; the legacy types' f16 scales are widened as they are read.
//!
//! `sdot` is emitted with inline assembly: its intrinsic is not stable in Rust yet.

use super::GROUP;
use std::arch::aarch64::*;
use std::arch::asm;

/// `acc[i] += Σ_{j<4} a[4i+j] · b[4i+j]` over signed bytes.
#[inline(always)]
pub(super) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a pure register operation; the callers run only where the CPU reports the
    // dot-product extension.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// Four f16 values at `p` widened to f32 (exact).
///
/// # Safety
/// 8 bytes at `p` must be readable.
#[inline(always)]
pub(super) unsafe fn f16x4(p: *const u8) -> float32x4_t {
    let mut v = [0f32; 4];
    for (i, o) in v.iter_mut().enumerate() {
        // SAFETY: inside the 8 bytes.
        let bits = unsafe { (p.add(2 * i) as *const u16).read_unaligned() };
        *o = half::f16::from_bits(bits).to_f32();
    }
    // SAFETY: `v` holds 4 floats.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// Q8_0 quantization identical to `q8_0::quantize`: `FCVTAS` rounds to nearest with ties
/// away from zero, as `f32::round` does.
///
/// # Safety
/// NEON must be present (it always is on AArch64); `q` holds `x.len()` values, `d`, `s`
/// and `m` (the Q8_1 sum field, as in the portable version) one per block.
#[target_feature(enable = "neon")]
pub unsafe fn quantize_rows(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32], m: &mut [f32]) {
    let nb = x.len() / 32;
    for b in 0..nb {
        // SAFETY: block `b` lies inside `x`.
        let v: [float32x4_t; 8] = unsafe {
            let p = x.as_ptr().add(b * 32);
            std::array::from_fn(|i| vld1q_f32(p.add(i * 4)))
        };
        let mut mx = vabsq_f32(v[0]);
        for vi in &v[1..] {
            mx = vmaxq_f32(mx, vabsq_f32(*vi));
        }
        let amax = vmaxvq_f32(mx).max(0.0);
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        d[b] = half::f16::from_f32(dd).to_f32();
        let qi: [int32x4_t; 8] = std::array::from_fn(|i| vcvtaq_s32_f32(vmulq_n_f32(v[i], id)));
        let mut sum = qi[0];
        for qv in &qi[1..] {
            sum = vaddq_s32(sum, *qv);
        }
        let total = vaddvq_s32(sum);
        s[b] = -128 * total;
        m[b] = half::f16::from_f32(total as f32 * dd).to_f32();
        let h: [int16x8_t; 4] =
            std::array::from_fn(|i| vcombine_s16(vqmovn_s32(qi[2 * i]), vqmovn_s32(qi[2 * i + 1])));
        let lo = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
        let hi = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
        // SAFETY: the block's 32 bytes lie inside `q`.
        unsafe {
            vst1q_s8(q.as_mut_ptr().add(b * 32), lo);
            vst1q_s8(q.as_mut_ptr().add(b * 32 + 16), hi);
        }
    }
}

/// Writes the first `rows` of a group's 16 accumulated rows (four vectors) to `dst`: the
/// last group of a matrix may be partial.
///
/// # Safety
/// `dst` must be writable for `rows` floats, `rows <= 16`.
#[inline(always)]
pub(super) unsafe fn store_group(ac: &[float32x4_t; 4], dst: *mut f32, rows: usize) {
    let mut lanes = [0.0f32; GROUP];
    // SAFETY: `lanes` holds 16 floats; `dst` is the caller's, for `rows` of them.
    unsafe {
        for (q, a) in ac.iter().enumerate() {
            vst1q_f32(lanes.as_mut_ptr().add(q * 4), *a);
        }
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, rows);
    }
}
