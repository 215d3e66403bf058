//! NEON (`sdot`) dot products of the quantized weight types kept in their stored layout
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K–Q6_K) with one activation row (Q8_0, Q8_1 or
//! Q8_K).
//!
//! Each function reproduces its scalar definition in `inferno_tensor` bit for bit: weights are
//! unpacked to their signed values as i8 (every one fits), `sdot` forms exact i32 sums of
//! four products per lane, group scales are applied in i32 (`mla`), and each block is then
//! folded into the f32 accumulator with the scalar expression, block after block. Every byte
//! value of the activations gives the exact sum.
//!
//! Slices are cut to whole blocks, as the scalar code does. Every function needs NEON and the
//! dot-product extension (checked by the caller; see [`super::Isa`]), hence `unsafe`.

use super::super::aarch64::sdot;
use super::scale_min_k4_words as scale_min_k4;
use half::f16;
use inferno_tensor::k_quants::{q3_k_scales, Q2_K_BYTES, Q3_K_BYTES};
use inferno_tensor::k_quants::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES};
use inferno_tensor::legacy::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_1_BYTES};
use inferno_tensor::q8_0::BLOCK_BYTES as Q8_0_BYTES;
use std::arch::aarch64::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The f32 scale of a Q8_K block.
#[inline]
fn q8k_d(xb: &[u8]) -> f32 {
    f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]])
}

/// Group sum `g` of a Q8_K block.
#[inline]
fn q8k_bsum(xb: &[u8], g: usize) -> i32 {
    i16::from_le_bytes([xb[260 + 2 * g], xb[261 + 2 * g]]) as i32
}

/// 16 bytes at `p`.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline(always)]
unsafe fn ld_u8(p: *const u8) -> uint8x16_t {
    // SAFETY: the caller's promise.
    unsafe { vld1q_u8(p) }
}

/// 16 signed bytes at `p`.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline(always)]
unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    // SAFETY: the caller's promise.
    unsafe { vld1q_s8(p as *const i8) }
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a register reinterpretation; NEON is baseline on AArch64.
    unsafe { vreinterpretq_s8_u8(v) }
}

/// Σ over 32 values of `a·x`: `a` as two signed 16-byte halves, `x` the 32 activation
/// bytes at `x`.
///
/// # Safety
/// `x..x + 32` must be readable; the dot-product extension must be present.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn isum32(a0: int8x16_t, a1: int8x16_t, x: *const u8) -> i32 {
    // SAFETY: the caller's promise.
    let s = unsafe {
        let s = sdot(vdupq_n_s32(0), a0, ld_s8(x));
        sdot(s, a1, ld_s8(x.add(16)))
    };
    vaddvq_s32(s)
}

/// 0x10 in byte `i` of the pair (bytes 0–15, bytes 16–31) where bit `i` of `qh` is set:
/// the fifth bits of a Q5_0/Q5_1 block.
#[inline]
#[target_feature(enable = "neon")]
fn fifth_bits(qh: u32) -> (uint8x16_t, uint8x16_t) {
    const IDX_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const IDX_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const SEL: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // The four bytes of qh (repeated); byte i of the result takes byte i / 8 of qh and
    // tests bit i % 8 of it.
    let v = vreinterpretq_u8_u32(vdupq_n_u32(qh));
    // SAFETY: the constants are 16 bytes each.
    let (il, ih, sel) = unsafe {
        (
            ld_u8(IDX_LO.as_ptr()),
            ld_u8(IDX_HI.as_ptr()),
            ld_u8(SEL.as_ptr()),
        )
    };
    let bit = vdupq_n_u8(0x10);
    (
        vandq_u8(vtstq_u8(vqtbl1q_u8(v, il), sel), bit),
        vandq_u8(vtstq_u8(vqtbl1q_u8(v, ih), sel), bit),
    )
}

// ---------------------------------------------------------------------------------------
// 32-value blocks (Q4_0, Q5_0, Q8_0 · Q8_0; Q4_1, Q5_1 · Q8_1)
// ---------------------------------------------------------------------------------------

/// Q4_0 weights · Q8_0 activations, as `legacy::dot_q4_0_q8_0`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q4_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let (m4, eight) = (vdupq_n_u8(0x0f), vdupq_n_s8(8));
    for (wb, xb) in w.chunks_exact(Q4_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        // SAFETY: quants at 2..18 of the weight block, 2..34 of the activation block.
        let s = unsafe {
            let v = ld_u8(wb.as_ptr().add(2));
            let lo = vsubq_s8(s8(vandq_u8(v, m4)), eight);
            let hi = vsubq_s8(s8(vshrq_n_u8::<4>(v)), eight);
            isum32(lo, hi, xb.as_ptr().add(2))
        };
        acc += s as f32 * (f16_at(wb, 0) * f16_at(xb, 0));
    }
    acc
}

/// Q5_0 weights · Q8_0 activations, as `legacy::dot_q5_0_q8_0`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q5_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let (m4, sixteen) = (vdupq_n_u8(0x0f), vdupq_n_s8(16));
    for (wb, xb) in w.chunks_exact(Q5_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        let (h0, h1) = fifth_bits(u32_at(wb, 2));
        // SAFETY: quants at 6..22 of the weight block, 2..34 of the activation block.
        let s = unsafe {
            let v = ld_u8(wb.as_ptr().add(6));
            let lo = vsubq_s8(s8(vorrq_u8(vandq_u8(v, m4), h0)), sixteen);
            let hi = vsubq_s8(s8(vorrq_u8(vshrq_n_u8::<4>(v), h1)), sixteen);
            isum32(lo, hi, xb.as_ptr().add(2))
        };
        acc += s as f32 * (f16_at(wb, 0) * f16_at(xb, 0));
    }
    acc
}

/// Q8_0 weights (unpacked) · Q8_0 activations, as `q8_0::dot`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q8_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        // SAFETY: quants at 2..34 of both blocks.
        let s = unsafe {
            let p = wb.as_ptr().add(2);
            isum32(ld_s8(p), ld_s8(p.add(16)), xb.as_ptr().add(2))
        };
        acc += s as f32 * (f16_at(wb, 0) * f16_at(xb, 0));
    }
    acc
}

/// Q4_1 weights · Q8_1 activations, as `legacy::dot_q4_1_q8_1`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q4_1_q8_1(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = vdupq_n_u8(0x0f);
    for (wb, xb) in w.chunks_exact(Q4_1_BYTES).zip(x.chunks_exact(Q8_1_BYTES)) {
        // SAFETY: quants at 4..20 of the weight block, 4..36 of the activation block.
        let s = unsafe {
            let v = ld_u8(wb.as_ptr().add(4));
            isum32(
                s8(vandq_u8(v, m4)),
                s8(vshrq_n_u8::<4>(v)),
                xb.as_ptr().add(4),
            )
        };
        acc += (f16_at(wb, 0) * f16_at(xb, 0)) * s as f32 + f16_at(wb, 2) * f16_at(xb, 2);
    }
    acc
}

/// Q5_1 weights · Q8_1 activations, as `legacy::dot_q5_1_q8_1`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q5_1_q8_1(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = vdupq_n_u8(0x0f);
    for (wb, xb) in w.chunks_exact(Q5_1_BYTES).zip(x.chunks_exact(Q8_1_BYTES)) {
        let (h0, h1) = fifth_bits(u32_at(wb, 4));
        // SAFETY: quants at 8..24 of the weight block, 4..36 of the activation block.
        let s = unsafe {
            let v = ld_u8(wb.as_ptr().add(8));
            let lo = s8(vorrq_u8(vandq_u8(v, m4), h0));
            let hi = s8(vorrq_u8(vshrq_n_u8::<4>(v), h1));
            isum32(lo, hi, xb.as_ptr().add(4))
        };
        acc += (f16_at(wb, 0) * f16_at(xb, 0)) * s as f32 + f16_at(wb, 2) * f16_at(xb, 2);
    }
    acc
}

// ---------------------------------------------------------------------------------------
// 256-value super-blocks (Q2_K … Q6_K · Q8_K)
// ---------------------------------------------------------------------------------------

/// `sdot` of 16 signed weights with the 16 activations at `x`.
///
/// # Safety
/// `x..x + 16` must be readable; the dot-product extension must be present.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot16(q: int8x16_t, x: *const u8) -> int32x4_t {
    // SAFETY: the caller's promise.
    unsafe { sdot(vdupq_n_s32(0), q, ld_s8(x)) }
}

/// Q2_K weights · Q8_K activations, as `k_quants::dot_q2_k_q8_k`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q2_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m3 = vdupq_n_u8(3);
    for (wb, xb) in w.chunks_exact(Q2_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let sc = &wb[..16];
        let (qs, xq) = (wb[16..80].as_ptr(), xb[4..260].as_ptr());
        let mut s = vdupq_n_s32(0);
        for h in 0..2 {
            // SAFETY: quants at 16..80 of the block (two 32-byte halves).
            let qv = unsafe { [ld_u8(qs.add(32 * h)), ld_u8(qs.add(32 * h + 16))] };
            for k in 0..4 {
                // Logical right shift by 2k (a negative count shifts right).
                let sh = vdupq_n_s8(-(2 * k as i8));
                for (p, &v) in qv.iter().enumerate() {
                    let q = s8(vandq_u8(vshlq_u8(v, sh), m3));
                    let g = 8 * h + 2 * k + p;
                    // SAFETY: elements 16g .. 16g + 16 of the activation block.
                    let part = unsafe { dot16(q, xq.add(16 * g)) };
                    s = vmlaq_n_s32(s, part, (sc[g] & 0x0f) as i32);
                }
            }
        }
        let isum = vaddvq_s32(s);
        let msum: i32 = (0..16).map(|g| (sc[g] >> 4) as i32 * q8k_bsum(xb, g)).sum();
        let dx = q8k_d(xb);
        acc += (f16_at(wb, 80) * dx) * isum as f32 - (f16_at(wb, 82) * dx) * msum as f32;
    }
    acc
}

/// Q3_K weights · Q8_K activations, as `k_quants::dot_q3_k_q8_k`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q3_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let (m3, four_u, four) = (vdupq_n_u8(3), vdupq_n_u8(4), vdupq_n_s8(4));
    for (wb, xb) in w.chunks_exact(Q3_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let sc = q3_k_scales(&wb[96..108]);
        let (wp, xq) = (wb.as_ptr(), xb[4..260].as_ptr());
        // SAFETY: hmask is the block's first 32 bytes.
        let hm = unsafe { [ld_u8(wp), ld_u8(wp.add(16))] };
        let mut s = vdupq_n_s32(0);
        for h in 0..2 {
            // SAFETY: quants at 32..96 of the block.
            let qv = unsafe { [ld_u8(wp.add(32 + 32 * h)), ld_u8(wp.add(48 + 32 * h))] };
            for k in 0..4 {
                let sh = vdupq_n_s8(-(2 * k as i8));
                let bit = vdupq_n_u8(1u8 << (4 * h + k));
                for p in 0..2 {
                    let low = vandq_u8(vshlq_u8(qv[p], sh), m3);
                    let hb = vandq_u8(vtstq_u8(hm[p], bit), four_u);
                    // low2 + 4·hbit − 4: the signed 3-bit value.
                    let q = vsubq_s8(s8(vorrq_u8(low, hb)), four);
                    let g = 8 * h + 2 * k + p;
                    // SAFETY: elements 16g .. 16g + 16 of the activation block.
                    let part = unsafe { dot16(q, xq.add(16 * g)) };
                    s = vmlaq_n_s32(s, part, sc[g] as i32);
                }
            }
        }
        let isum = vaddvq_s32(s);
        acc += (f16_at(wb, 108) * q8k_d(xb)) * isum as f32;
    }
    acc
}

/// Σ_j sc[j] · Σ q·x over the eight 32-value sub-blocks of Q4_K/Q5_K, given the unsigned
/// codes of each sub-block as two 16-byte halves.
///
/// # Safety
/// `xq` points to 256 activation bytes; the dot-product extension must be present.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn k4_isum(q: &[[uint8x16_t; 2]; 8], sc: &[u8; 8], xq: *const u8) -> i32 {
    let mut s = vdupq_n_s32(0);
    for (j, qj) in q.iter().enumerate() {
        // SAFETY: elements 32j .. 32j + 32 of the activation block.
        let part = unsafe {
            sdot(
                dot16(s8(qj[0]), xq.add(32 * j)),
                s8(qj[1]),
                ld_s8(xq.add(32 * j + 16)),
            )
        };
        s = vmlaq_n_s32(s, part, sc[j] as i32);
    }
    vaddvq_s32(s)
}

/// Σ_j m[j] · (bsum[2j] + bsum[2j+1]), as the scalar code forms it.
#[inline]
fn k4_min_sum(m: &[u8; 8], xb: &[u8]) -> i32 {
    (0..8)
        .map(|j| m[j] as i32 * (q8k_bsum(xb, 2 * j) + q8k_bsum(xb, 2 * j + 1)))
        .sum()
}

/// Q4_K weights · Q8_K activations, as `k_quants::dot_q4_k_q8_k`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q4_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let m4 = vdupq_n_u8(0x0f);
    for (wb, xb) in w.chunks_exact(Q4_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (sc, m) = scale_min_k4(&wb[4..16]);
        let qs = wb[16..144].as_ptr();
        let mut q = [[vdupq_n_u8(0); 2]; 8];
        for c in 0..4 {
            // SAFETY: chunk c of the quants, 32 bytes.
            let v = unsafe { [ld_u8(qs.add(32 * c)), ld_u8(qs.add(32 * c + 16))] };
            for p in 0..2 {
                q[2 * c][p] = vandq_u8(v[p], m4);
                q[2 * c + 1][p] = vshrq_n_u8::<4>(v[p]);
            }
        }
        // SAFETY: the activation quants are 256 bytes at 4.
        let isum = unsafe { k4_isum(&q, &sc, xb[4..260].as_ptr()) };
        let msum = k4_min_sum(&m, xb);
        let dx = q8k_d(xb);
        acc += (f16_at(wb, 0) * dx) * isum as f32 - (f16_at(wb, 2) * dx) * msum as f32;
    }
    acc
}

/// Q5_K weights · Q8_K activations, as `k_quants::dot_q5_k_q8_k`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q5_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let (m4, sixteen) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x10));
    for (wb, xb) in w.chunks_exact(Q5_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let (sc, m) = scale_min_k4(&wb[4..16]);
        let (qh, qs) = (wb[16..48].as_ptr(), wb[48..176].as_ptr());
        // SAFETY: qh is 32 bytes.
        let hv = unsafe { [ld_u8(qh), ld_u8(qh.add(16))] };
        let mut q = [[vdupq_n_u8(0); 2]; 8];
        for c in 0..4 {
            // SAFETY: chunk c of the quants, 32 bytes.
            let v = unsafe { [ld_u8(qs.add(32 * c)), ld_u8(qs.add(32 * c + 16))] };
            let (b0, b1) = (vdupq_n_u8(1u8 << (2 * c)), vdupq_n_u8(1u8 << (2 * c + 1)));
            for p in 0..2 {
                // Bit j of qh[l] is the fifth bit of element l of sub-block j.
                let h0 = vandq_u8(vtstq_u8(hv[p], b0), sixteen);
                let h1 = vandq_u8(vtstq_u8(hv[p], b1), sixteen);
                q[2 * c][p] = vorrq_u8(vandq_u8(v[p], m4), h0);
                q[2 * c + 1][p] = vorrq_u8(vshrq_n_u8::<4>(v[p]), h1);
            }
        }
        // SAFETY: the activation quants are 256 bytes at 4.
        let isum = unsafe { k4_isum(&q, &sc, xb[4..260].as_ptr()) };
        let msum = k4_min_sum(&m, xb);
        let dx = q8k_d(xb);
        acc += (f16_at(wb, 0) * dx) * isum as f32 - (f16_at(wb, 2) * dx) * msum as f32;
    }
    acc
}

/// Q6_K weights · Q8_K activations, as `k_quants::dot_q6_k_q8_k`.
///
/// # Safety
/// NEON and the dot-product extension must be present.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_q6_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    let (m4, m3, mc, m30, m_c0) = (
        vdupq_n_u8(0x0f),
        vdupq_n_u8(0x03),
        vdupq_n_u8(0x0c),
        vdupq_n_u8(0x30),
        vdupq_n_u8(0xc0),
    );
    let off = vdupq_n_s8(32);
    for (wb, xb) in w.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let sc = &wb[192..208];
        let (ql, qh, xq) = (wb.as_ptr(), wb[128..192].as_ptr(), xb[4..260].as_ptr());
        let mut s = vdupq_n_s32(0);
        for h in 0..2 {
            for p in 0..2 {
                // Elements 128h + 16p + l (+32, +64, +96) for l < 16: ql bytes 64h + 16p + l
                // (low nibbles, then high) and 64h + 32 + 16p + l, qh byte 32h + 16p + l.
                // SAFETY: inside ql (0..128) and qh (128..192).
                let (a, b, hh) = unsafe {
                    (
                        ld_u8(ql.add(64 * h + 16 * p)),
                        ld_u8(ql.add(64 * h + 32 + 16 * p)),
                        ld_u8(qh.add(32 * h + 16 * p)),
                    )
                };
                let q = [
                    vorrq_u8(vandq_u8(a, m4), vshlq_n_u8::<4>(vandq_u8(hh, m3))),
                    vorrq_u8(vandq_u8(b, m4), vshlq_n_u8::<2>(vandq_u8(hh, mc))),
                    vorrq_u8(vshrq_n_u8::<4>(a), vandq_u8(hh, m30)),
                    vorrq_u8(vshrq_n_u8::<4>(b), vshrq_n_u8::<2>(vandq_u8(hh, m_c0))),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    let g = 8 * h + 2 * k + p;
                    // SAFETY: elements 16g .. 16g + 16 of the activation block.
                    let part = unsafe { dot16(vsubq_s8(s8(qk), off), xq.add(16 * g)) };
                    s = vmlaq_n_s32(s, part, (sc[g] as i8) as i32);
                }
            }
        }
        let isum = vaddvq_s32(s);
        acc += (f16_at(wb, 208) * q8k_d(xb)) * isum as f32;
    }
    acc
}
