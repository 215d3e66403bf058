//! Plain float storage: little-endian F32, IEEE half (F16) and bfloat16 (BF16).

use half::{bf16, f16};

pub fn f32_from_le(src: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub fn f16_to_f32(src: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

pub fn bf16_to_f32(src: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

/// Dot product of an F32 weight row (raw little-endian bytes) with `x`, summed in order.
pub fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (c, &xv) in w.chunks_exact(4).zip(x) {
        acc += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * xv;
    }
    acc
}

/// Dot product of an F16 weight row with `x`; the weights are widened to f32 first, so the
/// only rounding is the weights' own storage rounding.
pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (c, &xv) in w.chunks_exact(2).zip(x) {
        acc += f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32() * xv;
    }
    acc
}

/// Dot product of a BF16 weight row with `x`, widened to f32.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (c, &xv) in w.chunks_exact(2).zip(x) {
        acc += bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32() * xv;
    }
    acc
}

pub fn f32_to_le_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32_to_f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
        .collect()
}

pub fn f32_to_bf16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let x = [0.0f32, 1.5, -2.25, 65504.0, 1e-3];
        let mut out = [0.0f32; 5];
        f32_from_le(&f32_to_le_bytes(&x), &mut out);
        assert_eq!(out, x);
        f16_to_f32(&f32_to_f16_bytes(&x), &mut out);
        assert_eq!(&out[..4], &x[..4]);
        assert!((out[4] - 1e-3).abs() < 1e-6);
        bf16_to_f32(&f32_to_bf16_bytes(&x), &mut out);
        assert_eq!(&out[..3], &x[..3]);
        let w = f32_to_f16_bytes(&[1.0, 2.0, 3.0]);
        assert_eq!(dot_f16(&w, &[1.0, 1.0, 2.0]), 9.0);
    }
}
