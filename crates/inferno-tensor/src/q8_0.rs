//! Q8_0: blocks of 32 signed 8-bit values sharing one f16 scale (34 bytes a block).
//!
//! Matrix products quantize the activation row to Q8_0 as well and accumulate integer dot
//! products per block, as llama.cpp does; the scalar functions here define the exact order
//! of operations that faster kernels reproduce.

use half::f16;

pub const BLOCK: usize = 32;
pub const BLOCK_BYTES: usize = 34;

#[inline]
pub fn block_scale(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

pub fn dequantize(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = block_scale(b);
        for (v, &q) in o.iter_mut().zip(&b[2..]) {
            *v = (q as i8) as f32 * d;
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into Q8_0 blocks in `out`: scale = max|x| / 127,
/// values rounded to nearest (ties away from zero), scale stored as f16.
pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (q, &v) in ob[2..].iter_mut().zip(xb) {
            *q = ((v * id).round() as i8) as u8;
        }
    }
}

/// Dot product of two Q8_0 rows: per block an exact integer sum, scaled by both block scales
/// and accumulated in f32 block by block.
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, xb) in w.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(BLOCK_BYTES)) {
        let mut isum = 0i32;
        for (&a, &b) in wb[2..].iter().zip(&xb[2..]) {
            isum += (a as i8) as i32 * (b as i8) as i32;
        }
        acc += isum as f32 * (block_scale(wb) * block_scale(xb));
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_dequantize_within_half_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let mut q = vec![0u8; 2 * BLOCK_BYTES];
        quantize(&x, &mut q);
        let mut y = vec![0.0f32; 64];
        dequantize(&q, &mut y);
        for b in 0..2 {
            let amax = x[b * 32..(b + 1) * 32]
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()));
            for i in b * 32..(b + 1) * 32 {
                assert!((x[i] - y[i]).abs() <= amax / 127.0 * 0.5 + 1e-3 * amax);
            }
        }
        let exact: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        assert!((dot(&q, &q) - exact).abs() < 1e-2 * exact.abs());
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let mut q = vec![0xffu8; BLOCK_BYTES];
        quantize(&[0.0; 32], &mut q);
        assert!(q.iter().all(|&b| b == 0));
    }
}
