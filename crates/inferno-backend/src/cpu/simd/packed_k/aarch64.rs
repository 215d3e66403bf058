//! NEON (`sdot`) products of packed Q2_K–Q6_K weights ([`super::PackedK`]) with
//! Q8_K activation rows. A packed 64-byte line holds four bytes of each of 16 rows, i.e. four
//! 16-byte registers of four rows; the kernels take one such quarter of a group at a time,
//! so each token needs only a handful of accumulators.
//!
//! The integer sums are those of the x86 kernels (see `x86.rs` beside this file): `sdot` of the weight
//! codes (at most 6 bits, so they are valid signed bytes) with the activation's four bytes
//! broadcast; per sub-block the lane is multiplied by the row's scale (`vmlaq_s32`, exact);
//! the mins (Q2_K, Q4_K, Q5_K) and the offsets of Q6_K (32) and Q3_K (4) come off with the
//! activation's sums of 16 values. Each super-block is folded in f32 with the scalar
//! expression, as separate multiplies and adds (never `vfma`), so every output equals the
//! scalar dot product of its row bit for bit. The packed f16 scales are widened with `half`
//! (exact), four at a time.

use super::super::aarch64::{f16x4, sdot};
use super::GROUP;
use super::{
    load_window, quant_line, store_window, x4, x_bsum, x_d, x_min_pair, Codes, Job, CODE_LINES,
    KIND_Q2, KIND_Q3, KIND_Q4, KIND_Q5, KIND_Q6, UNPACKED_BLOCKS, UNPACK_MIN_TOKENS,
};
use inferno_tensor::k_quants::Q8_K_BYTES;
use inferno_tensor::GgmlType;
use std::arch::aarch64::*;

/// Four bytes at `p` widened to u32 lanes.
///
/// # Safety
/// 4 bytes at `p` must be readable.
#[inline(always)]
unsafe fn widen4_u8(p: *const u8) -> int32x4_t {
    // SAFETY: the caller guarantees 4 bytes.
    let v = unsafe { (p as *const u32).read_unaligned() } as u64;
    vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(v)))))
}

/// Four signed bytes at `p` widened to i32 lanes.
///
/// # Safety
/// As for [`widen4_u8`].
#[inline(always)]
unsafe fn widen4_i8(p: *const u8) -> int32x4_t {
    // SAFETY: the caller guarantees 4 bytes.
    let v = unsafe { (p as *const u32).read_unaligned() } as u64;
    vmovl_s16(vget_low_s16(vmovl_s8(vcreate_s8(v))))
}

/// The four activation quants at element `e` of the block at `x`, in every lane.
///
/// # Safety
/// As for [`x4`].
#[inline(always)]
unsafe fn bcast(x: *const u8, e: usize) -> int8x16_t {
    // SAFETY: forwarded.
    vreinterpretq_s8_s32(vdupq_n_s32(unsafe { x4(x, e) }))
}

/// Q4_K / Q5_K, rows `4·qr ..` of group `g`, tokens `t0..t0 + T`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q45_quarter<const T: usize, const FIVE: bool>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    qr: usize,
) -> [float32x4_t; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..p.nsb {
        // SAFETY: super-block `b` of group `g` exists (checked by the caller).
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [vdupq_n_s32(0); T];
        for c in 0..4 {
            let mut lo = [vdupq_n_s32(0); T];
            let mut hi = [vdupq_n_s32(0); T];
            for k in 0..8 {
                // SAFETY (this block): lines inside the super-block, activation bytes inside
                // the tokens' blocks; the dot-product extension is enabled here.
                unsafe {
                    let [wl, wh] = q45_codes::<FIVE>(blk, c, k, qr);
                    for t in 0..T {
                        lo[t] = sdot(lo[t], wl, bcast(x[t], 64 * c + 4 * k));
                        hi[t] = sdot(hi[t], wh, bcast(x[t], 64 * c + 32 + 4 * k));
                    }
                }
            }
            // SAFETY: sub-block scales 2c and 2c+1 of these four rows.
            let (sl, sh) = unsafe {
                (
                    widen4_u8(blk.add(64 + 32 * c + 4 * qr)),
                    widen4_u8(blk.add(64 + 32 * c + 16 + 4 * qr)),
                )
            };
            for t in 0..T {
                isum[t] = vmlaq_s32(vmlaq_s32(isum[t], lo[t], sl), hi[t], sh);
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_q45(j, b, blk, qr, &x, &isum, &mut acc) };
    }
    acc
}

/// The two code registers (low and high nibbles, the fifth bits merged for Q5_K in the
/// `Bytes` form) of quant line `8c + k` of a packed Q4_K/Q5_K super-block, rows `4·qr ..`:
/// elements `64c + 4k ..` and `64c + 32 + 4k ..`.
///
/// # Safety
/// `blk` is such a super-block.
#[inline(always)]
unsafe fn q45_codes<const FIVE: bool>(
    blk: *const u8,
    c: usize,
    k: usize,
    qr: usize,
) -> [int8x16_t; 2] {
    let ql = quant_line(if FIVE { GgmlType::Q5_K } else { GgmlType::Q4_K });
    // SAFETY: the quant line and the fifth-bit line k are inside the super-block.
    unsafe {
        let wv = vld1q_u8(blk.add((ql + 8 * c + k) * 64 + 16 * qr));
        let mut wl = vandq_u8(wv, vdupq_n_u8(0x0f));
        let mut wh = vshrq_n_u8::<4>(wv);
        if FIVE {
            let sixteen = vdupq_n_u8(0x10);
            let h = vld1q_u8(blk.add((5 + k) * 64 + 16 * qr));
            let bl = vdupq_n_u8((1u32 << (2 * c)) as u8);
            let bh = vdupq_n_u8((2u32 << (2 * c)) as u8);
            wl = vorrq_u8(wl, vandq_u8(vtstq_u8(h, bl), sixteen));
            wh = vorrq_u8(wh, vandq_u8(vtstq_u8(h, bh), sixteen));
        }
        [vreinterpretq_s8_u8(wl), vreinterpretq_s8_u8(wh)]
    }
}

/// The end of a Q4_K or Q5_K super-block for rows `4·qr ..`: the mins (two sub-blocks'
/// pair against the activation's min pair) and the fold of `d · dx · isum − dmin · dx ·
/// msum` into `acc`.
///
/// # Safety
/// `blk` is packed super-block `b`; each `x` a token's Q8_K block `b` of a row quantized
/// with its min pairs.
#[inline(always)]
unsafe fn fold_q45<const T: usize>(
    j: Job<'_>,
    b: usize,
    blk: *const u8,
    qr: usize,
    x: &[*const u8; T],
    isum: &[int32x4_t; T],
    acc: &mut [float32x4_t; T],
) {
    let po = j.min_pairs_from(b);
    let mut msum = [vdupq_n_s32(0); T];
    for pp in 0..4 {
        // SAFETY: the mins of sub-blocks 2pp, 2pp+1 of these rows (8 bytes: a pair per
        // row); the token's min pairs (`PackedK::rows` checked the row size).
        unsafe {
            let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(blk.add(192 + 32 * pp + 8 * qr))));
            for t in 0..T {
                // (a, b) per row: the two sub-blocks' activation sums, as i16 lanes.
                let bs = vreinterpretq_s16_s32(vdupq_n_s32(x_min_pair(x[t], po, pp)));
                let lo = vmull_s16(vget_low_s16(m), vget_low_s16(bs));
                let hi = vmull_s16(vget_high_s16(m), vget_high_s16(bs));
                msum[t] = vaddq_s32(msum[t], vpaddq_s32(lo, hi));
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { fold_dmin(blk, qr, x, isum, &msum, acc) };
}

/// `acc += d · dx · isum − dmin · dx · msum` for rows `4·qr ..`, the scalar expression.
///
/// # Safety
/// `blk` is a packed super-block with the d then the dmin of its 16 rows at line 0; each
/// `x` a token's Q8_K block.
#[inline(always)]
unsafe fn fold_dmin<const T: usize>(
    blk: *const u8,
    qr: usize,
    x: &[*const u8; T],
    isum: &[int32x4_t; T],
    msum: &[int32x4_t; T],
    acc: &mut [float32x4_t; T],
) {
    // SAFETY: line 0: the d of the 16 rows, then their dmin.
    let (dw, dm) = unsafe { (f16x4(blk.add(8 * qr)), f16x4(blk.add(32 + 8 * qr))) };
    for t in 0..T {
        // SAFETY: the token's block scale.
        let dx = vdupq_n_f32(unsafe { x_d(x[t]) });
        let a = vmulq_f32(vmulq_f32(dw, dx), vcvtq_f32_s32(isum[t]));
        let m = vmulq_f32(vmulq_f32(dm, dx), vcvtq_f32_s32(msum[t]));
        acc[t] = vaddq_f32(acc[t], vsubq_f32(a, m));
    }
}

/// `acc += d · dx · isum` for rows `4·qr ..` (Q6_K, Q3_K), the scalar expression.
///
/// # Safety
/// `blk` is a packed super-block with the d of its 16 rows at line 0; each `x` a token's
/// Q8_K block.
#[inline(always)]
unsafe fn fold_d<const T: usize>(
    blk: *const u8,
    qr: usize,
    x: &[*const u8; T],
    isum: &[int32x4_t; T],
    acc: &mut [float32x4_t; T],
) {
    // SAFETY: line 0: the d of the 16 rows.
    let dw = unsafe { f16x4(blk.add(8 * qr)) };
    for t in 0..T {
        // SAFETY: the token's block scale.
        let dx = vdupq_n_f32(unsafe { x_d(x[t]) });
        acc[t] = vaddq_f32(acc[t], vmulq_f32(vmulq_f32(dw, dx), vcvtq_f32_s32(isum[t])));
    }
}

/// The four Q6_K code registers of the line triple at `l` (rows `4·qr ..`, see
/// `packed_k`): slot `s` holds elements `128h + 32s + 4k ..`, a nibble of `la` or `lb` and
/// two bits of `hh`.
///
/// # Safety
/// 16 bytes must be readable at `l`, `l + 64` and `l + 128`.
#[inline(always)]
unsafe fn q6_codes(l: *const u8) -> [int8x16_t; 4] {
    let m4 = vdupq_n_u8(0x0f);
    let m30 = vdupq_n_u8(0x30);
    // SAFETY: the caller's promise.
    let (la, lb, hh) = unsafe { (vld1q_u8(l), vld1q_u8(l.add(64)), vld1q_u8(l.add(128))) };
    [
        vorrq_u8(vandq_u8(la, m4), vandq_u8(vshlq_n_u8::<4>(hh), m30)),
        vorrq_u8(vandq_u8(lb, m4), vandq_u8(vshlq_n_u8::<2>(hh), m30)),
        vorrq_u8(vshrq_n_u8::<4>(la), vandq_u8(hh, m30)),
        vorrq_u8(vshrq_n_u8::<4>(lb), vandq_u8(vshrq_n_u8::<2>(hh), m30)),
    ]
    .map(|r| vreinterpretq_s8_u8(r))
}

/// The four Q2_K code registers of the quant line quarter at `l`: bit pair `s` of each byte.
///
/// # Safety
/// 16 bytes must be readable at `l`.
#[inline(always)]
unsafe fn q2_codes(l: *const u8) -> [int8x16_t; 4] {
    let m3 = vdupq_n_u8(3);
    // SAFETY: the caller's promise.
    let w = unsafe { vld1q_u8(l) };
    [
        vandq_u8(w, m3),
        vandq_u8(vshrq_n_u8::<2>(w), m3),
        vandq_u8(vshrq_n_u8::<4>(w), m3),
        vshrq_n_u8::<6>(w),
    ]
    .map(|r| vreinterpretq_s8_u8(r))
}

/// Q6_K, rows `4·qr ..` of group `g`, tokens `t0..t0 + T`.
// Index loops: the slot index is also the layout's arithmetic (lines, sub-blocks).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q6_quarter<const T: usize>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    qr: usize,
) -> [float32x4_t; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..p.nsb {
        // SAFETY: as in `q45_quarter`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [vdupq_n_s32(0); T];
        for h in 0..2 {
            for q in 0..2 {
                // Slot s: elements 128h + 32s + 16q .. +16, group 8h + 2s + q.
                let mut a = [[vdupq_n_s32(0); 4]; T];
                for kk in 0..4 {
                    let k = 4 * q + kk;
                    // SAFETY (this block): the three lines of (h, k) and the activation
                    // quants; the dot-product extension is enabled here.
                    unsafe {
                        let c = q6_codes(blk.add((5 + (8 * h + k) * 3) * 64 + 16 * qr));
                        for t in 0..T {
                            for s in 0..4 {
                                let xv = bcast(x[t], 128 * h + 32 * s + 4 * k);
                                a[t][s] = sdot(a[t][s], c[s], xv);
                            }
                        }
                    }
                }
                for s in 0..4 {
                    let gi = 8 * h + 2 * s + q;
                    // SAFETY: group gi's signed scales of these rows; the activation sums.
                    unsafe {
                        let sc = widen4_i8(blk.add(64 + 16 * gi + 4 * qr));
                        for t in 0..T {
                            let v = vsubq_s32(a[t][s], vdupq_n_s32(32 * x_bsum(x[t], gi)));
                            isum[t] = vmlaq_s32(isum[t], v, sc);
                        }
                    }
                }
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_d(blk, qr, &x, &isum, &mut acc) };
    }
    acc
}

/// Q2_K, rows `4·qr ..` of group `g`, tokens `t0..t0 + T`: the 2-bit codes into `sdot`,
/// each sub-block's sum times its 4-bit scale, the 4-bit mins against the activation sums.
// Index loops: the slot index is also the layout's arithmetic (lines, sub-blocks).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q2_quarter<const T: usize>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    qr: usize,
) -> [float32x4_t; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let ql = quant_line(p.dtype);
    let m15 = vdupq_n_s32(0x0f);
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..p.nsb {
        // SAFETY: as in `q45_quarter`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [vdupq_n_s32(0); T];
        let mut msum = [vdupq_n_s32(0); T];
        for h in 0..2 {
            for q in 0..2 {
                // Slot s: elements 128h + 32s + 16q .. +16, sub-block 8h + 2s + q.
                let mut a = [[vdupq_n_s32(0); 4]; T];
                for kk in 0..4 {
                    let k = 4 * q + kk;
                    // SAFETY (this block): the quant line of (h, k) and the activation
                    // quants; the dot-product extension is enabled here.
                    unsafe {
                        let c = q2_codes(blk.add((ql + 8 * h + k) * 64 + 16 * qr));
                        for t in 0..T {
                            for s in 0..4 {
                                let xv = bcast(x[t], 128 * h + 32 * s + 4 * k);
                                a[t][s] = sdot(a[t][s], c[s], xv);
                            }
                        }
                    }
                }
                for s in 0..4 {
                    let gi = 8 * h + 2 * s + q;
                    // SAFETY: sub-block gi's scale bytes of these rows (scale in the low
                    // nibble, min in the high one); the activation sums.
                    unsafe {
                        let sm = widen4_u8(blk.add(64 + 16 * gi + 4 * qr));
                        let (sc, mn) = (vandq_s32(sm, m15), vshrq_n_s32::<4>(sm));
                        for t in 0..T {
                            isum[t] = vmlaq_s32(isum[t], a[t][s], sc);
                            msum[t] = vmlaq_s32(msum[t], mn, vdupq_n_s32(x_bsum(x[t], gi)));
                        }
                    }
                }
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_dmin(blk, qr, &x, &isum, &msum, &mut acc) };
    }
    acc
}

/// The four Q3_K codes (0–7) of runs `4·pass ..` (elements `32j + 4k + i`) from the three
/// packed lines `X`, `Y`, `Z` of one `k` (see `packed_k`), four rows a register: six come
/// out with a shift and a mask; codes 6 and 7 take their low pair from the top of `X` (`Y`)
/// and their third bit from bit 6 (7) of `Z`, selected into place.
///
/// # Safety
/// 16 bytes must be readable at `l`, `l + 64` and `l + 128`.
#[inline(always)]
unsafe fn q3_codes(l: *const u8, pass: usize) -> [int8x16_t; 4] {
    let m7 = vdupq_n_u8(7);
    let m4 = vdupq_n_u8(4);
    // SAFETY: the caller guarantees the three lines at `l`.
    let (lx, ly, lz) = unsafe { (vld1q_u8(l), vld1q_u8(l.add(64)), vld1q_u8(l.add(128))) };
    let c = if pass == 0 {
        [
            vandq_u8(lx, m7),
            vandq_u8(vshrq_n_u8::<3>(lx), m7),
            vandq_u8(ly, m7),
            vandq_u8(vshrq_n_u8::<3>(ly), m7),
        ]
    } else {
        [
            vandq_u8(lz, m7),
            vandq_u8(vshrq_n_u8::<3>(lz), m7),
            // Bit 2 from `Z >> 4` (`Z >> 5`), bits 0–1 from `X >> 6` (`Y >> 6`), whose bit
            // 2 is clear.
            vbslq_u8(m4, vshrq_n_u8::<4>(lz), vshrq_n_u8::<6>(lx)),
            vbslq_u8(m4, vshrq_n_u8::<5>(lz), vshrq_n_u8::<6>(ly)),
        ]
    };
    c.map(|r| vreinterpretq_s8_u8(r))
}

/// Q3_K, rows `4·qr ..` of group `g`, tokens `t0..t0 + T`: the codes (the values plus 4)
/// into `sdot`, `4 ·` the activation's sum of each sub-block taken off its sum, which is
/// then multiplied by the signed scale.
// Index loops: the slot index is also the layout's arithmetic (lines, sub-blocks).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q3_quarter<const T: usize>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    qr: usize,
) -> [float32x4_t; T] {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    let ql = quant_line(p.dtype);
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..p.nsb {
        // SAFETY: as in `q45_quarter`.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let mut isum = [vdupq_n_s32(0); T];
        for q in 0..2 {
            for pass in 0..2 {
                // Slot s: run 4·pass + s, elements 32(4·pass + s) + 16q .. +16, sub-block
                // 2(4·pass + s) + q.
                let mut a = [[vdupq_n_s32(0); 4]; T];
                for kk in 0..4 {
                    let k = 4 * q + kk;
                    // SAFETY (this block): the three lines of k and the activation quants;
                    // the dot-product extension is enabled here.
                    unsafe {
                        let c = q3_codes(blk.add((ql + 3 * k) * 64 + 16 * qr), pass);
                        for t in 0..T {
                            for s in 0..4 {
                                let xv = bcast(x[t], 32 * (4 * pass + s) + 4 * k);
                                a[t][s] = sdot(a[t][s], c[s], xv);
                            }
                        }
                    }
                }
                for s in 0..4 {
                    let gi = 2 * (4 * pass + s) + q;
                    // SAFETY: sub-block gi's signed scales of these rows; the activation sums.
                    unsafe {
                        let sc = widen4_i8(blk.add(64 + 16 * gi + 4 * qr));
                        for t in 0..T {
                            let v = vsubq_s32(a[t][s], vdupq_n_s32(4 * x_bsum(x[t], gi)));
                            isum[t] = vmlaq_s32(isum[t], v, sc);
                        }
                    }
                }
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row.
        unsafe { fold_d(blk, qr, &x, &isum, &mut acc) };
    }
    acc
}

/// Group `g`, tokens `t0..t0 + T`, stored.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn group_sdot<const T: usize>(j: Job<'_>, g: usize, t0: usize) {
    let mut lanes = [[0.0f32; GROUP]; T];
    for qr in 0..4 {
        // SAFETY: forwarded from the caller.
        let acc = unsafe {
            match j.p.dtype {
                GgmlType::Q4_K => q45_quarter::<T, false>(j, g, t0, qr),
                GgmlType::Q5_K => q45_quarter::<T, true>(j, g, t0, qr),
                GgmlType::Q6_K => q6_quarter::<T>(j, g, t0, qr),
                GgmlType::Q3_K => q3_quarter::<T>(j, g, t0, qr),
                _ => q2_quarter::<T>(j, g, t0, qr),
            }
        };
        for (l, a) in lanes.iter_mut().zip(acc) {
            // SAFETY: 4 floats at lane offset 4·qr.
            unsafe { vst1q_f32(l.as_mut_ptr().add(4 * qr), a) };
        }
    }
    for (t, l) in lanes.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe {
            store_window(
                j.out.add((t0 + t) * j.ldo + g * GROUP),
                l,
                g * GROUP,
                j.r0,
                j.r1,
            )
        };
    }
}

/// Writes the codes of the packed super-block at `blk` (a Q5_K in the `Bytes` form) to the
/// 64 lines at `dst` (see [`Codes`]), four rows (a quarter line) at a time.
///
/// # Safety
/// `blk` is a packed super-block of the kind's type; `dst` holds 64 lines.
#[inline(always)]
unsafe fn unpack_block<const KIND: u8>(blk: *const u8, dst: *mut u8) {
    for qr in 0..4 {
        let put = |line: usize, v: int8x16_t| {
            // SAFETY: line < 64, inside `dst`.
            unsafe { vst1q_s8(dst.add(line * 64 + 16 * qr) as *mut i8, v) }
        };
        // SAFETY (whole body): every line read is inside the packed super-block.
        unsafe {
            match KIND {
                KIND_Q4 | KIND_Q5 => {
                    for c in 0..4 {
                        for k in 0..8 {
                            let [wl, wh] = if KIND == KIND_Q5 {
                                q45_codes::<true>(blk, c, k, qr)
                            } else {
                                q45_codes::<false>(blk, c, k, qr)
                            };
                            // Elements 64c + 4k .. and 64c + 32 + 4k ..
                            put(16 * c + k, wl);
                            put(16 * c + 8 + k, wh);
                        }
                    }
                }
                KIND_Q6 => {
                    for h in 0..2 {
                        for k in 0..8 {
                            let c = q6_codes(blk.add((5 + (8 * h + k) * 3) * 64 + 16 * qr));
                            for (s, v) in c.into_iter().enumerate() {
                                // Elements 128h + 32s + 4k ..
                                put(32 * h + 8 * s + k, v);
                            }
                        }
                    }
                }
                KIND_Q3 => {
                    let ql = quant_line(GgmlType::Q3_K);
                    for k in 0..8 {
                        for pass in 0..2 {
                            let c = q3_codes(blk.add((ql + 3 * k) * 64 + 16 * qr), pass);
                            for (s, v) in c.into_iter().enumerate() {
                                // Elements 32(4·pass + s) + 4k ..
                                put(8 * (4 * pass + s) + k, v);
                            }
                        }
                    }
                }
                _ => {
                    let ql = quant_line(GgmlType::Q2_K);
                    for h in 0..2 {
                        for k in 0..8 {
                            let c = q2_codes(blk.add((ql + 8 * h + k) * 64 + 16 * qr));
                            for (s, v) in c.into_iter().enumerate() {
                                // Elements 128h + 32s + 4k ..
                                put(32 * h + 8 * s + k, v);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Rows `4·qr ..` of group `g`, super-blocks `b0..b1` (their codes in `codes`), tokens
/// `t0..t0 + T`, continuing `acc`: sub-blocks in pairs, one accumulator per token for each
/// (eight `sdot` chains at four tokens), each sum times its scale (Q6_K and Q3_K after
/// taking off the offset times the activation's sum, as [`q6_quarter`] does); each
/// super-block ends as in the kernels that unpack as they go, so the sums are theirs.
// Index loops: the sub-block and row indices are also the layout's arithmetic.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn codes_quarter<const T: usize, const KIND: u8>(
    j: Job<'_>,
    (g, t0, qr): (usize, usize, usize),
    (b0, b1): (usize, usize),
    codes: &Codes,
    acc: &mut [float32x4_t; T],
) {
    let p = j.p;
    let base = p.group(g).as_ptr();
    let bb = p.block_bytes();
    // Lines per sub-block: 8 (32 values) for Q4_K and Q5_K, 4 (16 values) for the others.
    let sl = if KIND <= KIND_Q5 { 8 } else { 4 };
    for b in b0..b1 {
        // SAFETY: super-block `b` of group `g` and of each token's row exist.
        let blk = unsafe { base.add(b * bb) };
        // SAFETY: block `b` of each of the T tokens' rows is inside `xq`.
        let x: [*const u8; T] =
            std::array::from_fn(|t| unsafe { j.xq.add((t0 + t) * j.qrow + b * Q8_K_BYTES) });
        let cb = codes.block(b - b0);
        let mut isum = [vdupq_n_s32(0); T];
        let mut msum = [vdupq_n_s32(0); T];
        for pair in 0..CODE_LINES / (2 * sl) {
            let mut a = [[vdupq_n_s32(0); 2]; T];
            for k in 0..sl {
                for e in 0..2 {
                    let line = (2 * pair + e) * sl + k;
                    // SAFETY: a line of super-block `b` in `codes`; activation bytes inside
                    // the tokens' blocks; the dot-product extension is enabled here.
                    unsafe {
                        let w = vld1q_s8(cb.add(line * 64 + 16 * qr) as *const i8);
                        for t in 0..T {
                            a[t][e] = sdot(a[t][e], w, bcast(x[t], 4 * line));
                        }
                    }
                }
            }
            for e in 0..2 {
                let i = 2 * pair + e;
                // SAFETY: sub-block i's scale bytes of these rows (lines 1–4); the
                // activation sums.
                unsafe {
                    let sb = blk.add(64 + 16 * i + 4 * qr);
                    for t in 0..T {
                        match KIND {
                            KIND_Q6 | KIND_Q3 => {
                                let off = if KIND == KIND_Q6 { 32 } else { 4 };
                                let v = vsubq_s32(a[t][e], vdupq_n_s32(off * x_bsum(x[t], i)));
                                isum[t] = vmlaq_s32(isum[t], v, widen4_i8(sb));
                            }
                            KIND_Q2 => {
                                let sm = widen4_u8(sb);
                                let (sc, mn) =
                                    (vandq_s32(sm, vdupq_n_s32(0x0f)), vshrq_n_s32::<4>(sm));
                                isum[t] = vmlaq_s32(isum[t], a[t][e], sc);
                                msum[t] = vmlaq_s32(msum[t], mn, vdupq_n_s32(x_bsum(x[t], i)));
                            }
                            _ => isum[t] = vmlaq_s32(isum[t], a[t][e], widen4_u8(sb)),
                        }
                    }
                }
            }
        }
        // SAFETY: super-block `b` of the group and of each token's row (see above).
        unsafe {
            match KIND {
                KIND_Q4 | KIND_Q5 => fold_q45(j, b, blk, qr, &x, &isum, acc),
                KIND_Q6 | KIND_Q3 => fold_d(blk, qr, &x, &isum, acc),
                _ => fold_dmin(blk, qr, &x, &isum, &msum, acc),
            }
        }
    }
}

/// Group `g`, tokens `t0..t0 + T`, super-blocks `b0..b1` from `codes`, continuing the sums
/// the slices before stored in the rows this job owns.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn codes_group<const T: usize, const KIND: u8>(
    j: Job<'_>,
    g: usize,
    t0: usize,
    sb: (usize, usize),
    codes: &Codes,
) {
    let first = g * GROUP;
    // The running sums of the owned rows, from the slices before.
    let mut lanes = [[0.0f32; GROUP]; T];
    if sb.0 > 0 {
        for (t, l) in lanes.iter_mut().enumerate() {
            // SAFETY: the rows of token t0 + t that this job owns.
            unsafe { load_window(j.out.add((t0 + t) * j.ldo + first), l, first, j.r0, j.r1) };
        }
    }
    for qr in 0..4 {
        // SAFETY: 4 floats at lane offset 4·qr.
        let mut acc: [float32x4_t; T] =
            std::array::from_fn(|t| unsafe { vld1q_f32(lanes[t].as_ptr().add(4 * qr)) });
        // SAFETY: forwarded from the caller.
        unsafe { codes_quarter::<T, KIND>(j, (g, t0, qr), sb, codes, &mut acc) };
        for (l, a) in lanes.iter_mut().zip(acc) {
            // SAFETY: 4 floats at lane offset 4·qr.
            unsafe { vst1q_f32(l.as_mut_ptr().add(4 * qr), a) };
        }
    }
    for (t, l) in lanes.iter().enumerate() {
        // SAFETY: the destination rows are the caller's.
        unsafe { store_window(j.out.add((t0 + t) * j.ldo + first), l, first, j.r0, j.r1) };
    }
}

/// The products for groups `g0..g1` and tokens `0..n` (a prompt) with each group's codes
/// unpacked once, [`UNPACKED_BLOCKS`] super-blocks at a time, for all its token tiles.
///
/// # Safety
/// As for [`gemm_sdot`].
#[target_feature(enable = "neon,dotprod")]
unsafe fn gemm_codes_sdot<const KIND: u8>(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    let mut codes = Codes::new();
    let nsb = j.p.nsb;
    for g in g0..g1 {
        let base = j.p.group(g).as_ptr();
        for b0 in (0..nsb).step_by(UNPACKED_BLOCKS) {
            let b1 = nsb.min(b0 + UNPACKED_BLOCKS);
            for b in b0..b1 {
                // SAFETY: super-block `b` of the group; slot `b - b0` of `codes`.
                unsafe {
                    unpack_block::<KIND>(base.add(b * j.p.block_bytes()), codes.block_mut(b - b0))
                };
            }
            let sb = (b0, b1);
            for_token_tiles!(n, t, [4, 2, 1], codes_group::<_, KIND>(j, g, t, sb, &codes));
        }
    }
}

/// The product for groups `g0..g1` and tokens `0..n` with `sdot`.
///
/// # Safety
/// The dot-product extension must be present; `p` must be packed with the `Bytes` form of
/// the fifth bits; `xq` must hold `n` Q8_K rows of `qrow` bytes covering `p.cols`, each
/// with its min pairs after its blocks; `out` must be writable at `t * ldo + r` for those
/// tokens and the rows `r0..r1`, which no other thread touches during the call.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn gemm_sdot(j: Job<'_>, n: usize, g0: usize, g1: usize) {
    if n >= UNPACK_MIN_TOKENS {
        // SAFETY: forwarded.
        unsafe {
            match j.p.dtype {
                GgmlType::Q4_K => gemm_codes_sdot::<KIND_Q4>(j, n, g0, g1),
                GgmlType::Q5_K => gemm_codes_sdot::<KIND_Q5>(j, n, g0, g1),
                GgmlType::Q6_K => gemm_codes_sdot::<KIND_Q6>(j, n, g0, g1),
                GgmlType::Q3_K => gemm_codes_sdot::<KIND_Q3>(j, n, g0, g1),
                _ => gemm_codes_sdot::<KIND_Q2>(j, n, g0, g1),
            }
        }
        return;
    }
    for g in g0..g1 {
        for_token_tiles!(n, t, [4, 2, 1], group_sdot(j, g, t));
    }
}
