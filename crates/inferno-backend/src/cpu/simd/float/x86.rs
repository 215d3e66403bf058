//! x86-64 float kernels (AVX2, FMA, F16C): float-weight dot products (F32, F16, BF16) and
//! the element-wise operations (RMSNorm, SiLU · up, add, RoPE). Callers check the CPU
//! features first; every function here is `unsafe` for that reason.

use super::super::x86::{exp256, hsum};
use inferno_tensor::GgmlType;
use std::arch::x86_64::*;

// ---------------------------------------------------------------------------------------
// Float-weight products
// ---------------------------------------------------------------------------------------

/// Eight weights widened to f32.
#[inline(always)]
unsafe fn load8(dtype: GgmlType, w: *const u8, i: usize) -> __m256 {
    // SAFETY (all arms): the caller guarantees 8 values at index `i`; the features are
    // enabled in every caller.
    unsafe {
        match dtype {
            GgmlType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(i * 2) as *const __m128i)),
            GgmlType::BF16 => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(i * 2) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            }
            _ => _mm256_loadu_ps(w.add(i * 4) as *const f32),
        }
    }
}

/// Dot product of a float weight row (F32, F16 or BF16 bytes) with `x`, four 8-lane
/// accumulators. Conversions are exact (F16C for F16, a shift for BF16).
///
/// # Safety
/// AVX2, FMA and F16C must be present; `w` holds `x.len()` values of `dtype`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_float(dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every index below `n` is inside both rows.
    unsafe {
        while i + 32 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                let k = i + j * 8;
                *a = _mm256_fmadd_ps(load8(dtype, wp, k), _mm256_loadu_ps(xp.add(k)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(load8(dtype, wp, i), _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(v);
    if i < n {
        s += super::portable::dot_float(
            dtype,
            &w[i * dtype.type_size()..n * dtype.type_size()],
            &x[i..],
        );
    }
    s
}

// ---------------------------------------------------------------------------------------
// Element-wise operations
// ---------------------------------------------------------------------------------------

/// RMSNorm rows in place: the sum of squares with eight lanes of FMA, then `v * inv * g` in
/// the scalar order.
///
/// # Safety
/// AVX2 and FMA must be present.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    let gp = weight.as_ptr();
    for row in x.chunks_exact_mut(dim) {
        let p = row.as_mut_ptr();
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY: indices below `dim` are inside the row and the weight.
        unsafe {
            while i + 16 <= dim {
                let v0 = _mm256_loadu_ps(p.add(i));
                let v1 = _mm256_loadu_ps(p.add(i + 8));
                a0 = _mm256_fmadd_ps(v0, v0, a0);
                a1 = _mm256_fmadd_ps(v1, v1, a1);
                i += 16;
            }
        }
        let mut ss = hsum(_mm256_add_ps(a0, a1));
        for v in &row[i..] {
            ss += v * v;
        }
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        let iv = _mm256_set1_ps(inv);
        let mut i = 0;
        // SAFETY: as above.
        unsafe {
            while i + 8 <= dim {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), iv);
                _mm256_storeu_ps(p.add(i), _mm256_mul_ps(v, _mm256_loadu_ps(gp.add(i))));
                i += 8;
            }
        }
        for (v, &g) in row[i..].iter_mut().zip(&weight[i..]) {
            *v = *v * inv * g;
        }
    }
}

/// `gate = silu(gate) * up` with the vector exponential. The last values (fewer than 8) go
/// through the same vector arithmetic in a padded vector, so every value's bits are the same
/// wherever it sits: the rows of a multi-row step start at other lanes than a one-row
/// step's when the row length is not a multiple of 8.
///
/// # Safety
/// AVX2 and FMA must be present; `up` is at least as long as `gate`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let one = _mm256_set1_ps(1.0);
    let neg = _mm256_set1_ps(-0.0);
    let silu8 = |x: __m256, u: __m256| {
        let e = exp256(_mm256_xor_ps(x, neg));
        _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), u)
    };
    let mut i = 0;
    // SAFETY: indices below `n` are inside both slices.
    unsafe {
        while i + 8 <= n {
            let y = silu8(_mm256_loadu_ps(g.add(i)), _mm256_loadu_ps(u.add(i)));
            _mm256_storeu_ps(g.add(i), y);
            i += 8;
        }
    }
    if i < n {
        let (mut gt, mut ut) = ([0f32; 8], [0f32; 8]);
        gt[..n - i].copy_from_slice(&gate[i..n]);
        ut[..n - i].copy_from_slice(&up[i..n]);
        // SAFETY: both are 8 floats.
        let y = unsafe { silu8(_mm256_loadu_ps(gt.as_ptr()), _mm256_loadu_ps(ut.as_ptr())) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(gt.as_mut_ptr(), y) };
        gate[i..n].copy_from_slice(&gt[..n - i]);
    }
}

/// `x += y` (the same single rounding as the scalar loop).
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2")]
pub unsafe fn add(x: &mut [f32], y: &[f32]) {
    let n = x.len().min(y.len());
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    // SAFETY: indices below `n` are inside both slices.
    unsafe {
        while i + 8 <= n {
            let s = _mm256_add_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(xp.add(i), s);
            i += 8;
        }
    }
    for (a, &b) in x[i..n].iter_mut().zip(&y[i..n]) {
        *a += b;
    }
}

/// RoPE rotation with precomputed cosines and sines; the same products and single
/// add/subtract per value as the scalar code, so the result is identical.
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2")]
pub unsafe fn rope_apply(x: &mut [f32], n_heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for (t, tok) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in tok.chunks_exact_mut(head_dim) {
            let p = head.as_mut_ptr();
            let mut i = 0;
            // SAFETY: `i + 8 <= half`, so both halves' lanes are inside the head.
            unsafe {
                while i + 8 <= half {
                    let a = _mm256_loadu_ps(p.add(i));
                    let b = _mm256_loadu_ps(p.add(i + half));
                    let cv = _mm256_loadu_ps(c.as_ptr().add(i));
                    let sv = _mm256_loadu_ps(s.as_ptr().add(i));
                    let lo = _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv));
                    let hi = _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv));
                    _mm256_storeu_ps(p.add(i), lo);
                    _mm256_storeu_ps(p.add(i + half), hi);
                    i += 8;
                }
            }
            for j in i..half {
                let (a, b) = (head[j], head[j + half]);
                head[j] = a * c[j] - b * s[j];
                head[j + half] = b * c[j] + a * s[j];
            }
        }
    }
}
