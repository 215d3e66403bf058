//! Products of the quantized weight types multiplied in their stored layout (Q8_0, Q4_0,
//! Q5_0, Q4_1, Q5_1 and Q2_K–Q6_K where no packed copy was made; a packed K-quant copy is
//! handed to [`PackedK::rows`]): each type's vector dot kernel for the
//! instruction set ([`Kernels::quant_dot`]), and [`QuantMatmul`], which quantizes the
//! activation rows once and computes any range of output rows, so `simd` runs a whole
//! product on one thread and `pool` / `parallel` hand row ranges to threads.
//!
//! Numerics: every output is one call of a dot kernel that reproduces its scalar definition
//! in `inferno_tensor` bit for bit (exact integer sums, then the scalar f32 expression per
//! block in block order), on activations quantized by the scalar quantizers. So the results
//! equal the `scalar` backend's, whatever the instruction set, split or thread count.

use super::packed_k::{write_min_pairs, MIN_PAIR_BYTES};
use super::{Isa, Kernels, OutPtr, PackedK};

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;
use crate::cpu::scalar::with_quant_scratch;
use inferno_tensor::{self as tensor, k_quants, GgmlType, Matrix, QuantDot};

type DotFn = fn(&[u8], &[u8]) -> f32;

/// A dot kernel for four weight rows (`rb` bytes apart, from the start of the slice) with
/// one activation row, each result bit-identical to `DotFn`'s for that row.
pub type Dot4Fn = fn(&[u8], usize, &[u8]) -> [f32; 4];

/// Tokens taken per pass over a range of weight rows: each weight row is used for all of
/// them while it is in L1, and their activation rows (≤ a few KB each) stay in L2.
const TOKEN_TILE: usize = 16;

/// Safe wrappers `$f(w, x)` (and with `rb`, `$f(w, rb, x)` for four rows) around the
/// unsafe kernels of the same names in `$k`, for the modules below: each is handed out only
/// by [`simd_dot`] / [`simd_dot4`] after they have checked the CPU's features.
#[allow(unused_macros)]
macro_rules! safe_kernels {
    ($k:ident; $($f:ident),* $(; four: $($f4:ident),*)?) => {
        $(
            pub(super) fn $f(w: &[u8], x: &[u8]) -> f32 {
                // SAFETY: only reachable through `simd_dot`, which checked the features.
                unsafe { $k::$f(w, x) }
            }
        )*
        $($(
            pub(super) fn $f4(w: &[u8], rb: usize, x: &[u8]) -> [f32; 4] {
                // SAFETY: only reachable through `simd_dot4`, which checked the features.
                unsafe { $k::$f4(w, rb, x) }
            }
        )*)?
    };
}

/// [`safe_kernels`] for the dot kernel of every quantized type, which each ISA module has.
#[allow(unused_macros)]
macro_rules! every_type_kernels {
    ($k:ident $(; four: $($f4:ident),*)?) => {
        safe_kernels!(
            $k;
            dot_q4_0_q8_0,
            dot_q5_0_q8_0,
            dot_q8_0_q8_0,
            dot_q4_1_q8_1,
            dot_q5_1_q8_1,
            dot_q2_k_q8_k,
            dot_q3_k_q8_k,
            dot_q4_k_q8_k,
            dot_q5_k_q8_k,
            dot_q6_k_q8_k
            $(; four: $($f4),*)?
        );
    };
}

/// Safe entry points to the x86 kernels (AVX2, and AVX-512 where the name says so).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::x86 as k;

    every_type_kernels!(k; four: dot4_q4_0_q8_0, dot4_q5_0_q8_0);

    pub(super) fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
        // SAFETY: only reachable through `simd_quantize`, which checked the features.
        unsafe { k::quantize_q8_k(x, out) }
    }

    pub(super) fn quantize_q8_k_avx512(x: &[f32], out: &mut [u8]) {
        // SAFETY: only reachable through `simd_quantize`, which checked the features.
        unsafe { k::quantize_q8_k_avx512(x, out) }
    }
}

/// Safe entry points to the NEON kernels.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::aarch64 as k;

    every_type_kernels!(k);
}

/// The vector dot kernel for `weight` on `isa`, if it has one and this CPU can run it.
/// AVX-512 CPUs use the AVX2 kernels.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_variables, unused_imports)
)]
fn simd_dot(isa: Isa, weight: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni if Isa::Avx2.is_available() => Some(match weight {
            Q4_0 => avx2::dot_q4_0_q8_0,
            Q5_0 => avx2::dot_q5_0_q8_0,
            Q8_0 => avx2::dot_q8_0_q8_0,
            Q4_1 => avx2::dot_q4_1_q8_1,
            Q5_1 => avx2::dot_q5_1_q8_1,
            Q2_K => avx2::dot_q2_k_q8_k,
            Q3_K => avx2::dot_q3_k_q8_k,
            Q4_K => avx2::dot_q4_k_q8_k,
            Q5_K => avx2::dot_q5_k_q8_k,
            Q6_K => avx2::dot_q6_k_q8_k,
            _ => return None,
        }),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon if isa.is_available() => Some(match weight {
            Q4_0 => neon::dot_q4_0_q8_0,
            Q5_0 => neon::dot_q5_0_q8_0,
            Q8_0 => neon::dot_q8_0_q8_0,
            Q4_1 => neon::dot_q4_1_q8_1,
            Q5_1 => neon::dot_q5_1_q8_1,
            Q2_K => neon::dot_q2_k_q8_k,
            Q3_K => neon::dot_q3_k_q8_k,
            Q4_K => neon::dot_q4_k_q8_k,
            Q5_K => neon::dot_q5_k_q8_k,
            Q6_K => neon::dot_q6_k_q8_k,
            _ => return None,
        }),
        _ => None,
    }
}

/// The vector quantizer for activations of type `act` on `isa`, where there is one (each
/// writes exactly the bytes of the scalar quantizer).
fn simd_quantize(isa: Isa, act: GgmlType) -> Option<tensor::QuantizeFn> {
    match (isa, act) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, GgmlType::Q8_K) if isa.is_available() => Some(avx2::quantize_q8_k_avx512),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2 | Isa::Avx512Vnni, GgmlType::Q8_K) if Isa::Avx2.is_available() => {
            Some(avx2::quantize_q8_k)
        }
        _ => None,
    }
}

/// The four-row dot kernel for `weight` on `isa`, where there is one: the activation-side
/// work of a block is then shared by four weight rows.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn simd_dot4(isa: Isa, weight: GgmlType) -> Option<Dot4Fn> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni if Isa::Avx2.is_available() => match weight {
            GgmlType::Q4_0 => Some(avx2::dot4_q4_0_q8_0),
            GgmlType::Q5_0 => Some(avx2::dot4_q5_0_q8_0),
            _ => None,
        },
        _ => None,
    }
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block, as
/// `k_quants::scale_min_k4` unpacks them, with whole-word bit operations: bytes 0–3 of the
/// 12 hold scales 0–3 (low 6 bits), bytes 4–7 mins 0–3, and scales / mins 4–7 take their
/// low nibbles from bytes 8–11 and their top two bits from the spare bits of bytes 0–7.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline]
pub(super) fn scale_min_k4_words(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let sc_hi = (c & LOW4) | (((a >> 6) & TOP2) << 4);
    let m_hi = ((c >> 4) & LOW4) | (((b >> 6) & TOP2) << 4);
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    sc[..4].copy_from_slice(&(a & LOW6).to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    m[..4].copy_from_slice(&(b & LOW6).to_le_bytes());
    m[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, m)
}

impl Kernels {
    /// How this instruction set multiplies `weight` in its stored layout: the scheme of
    /// [`tensor::quant_dot`] (activation type and scalar quantizer) with the vector dot kernel
    /// in place of the scalar one where there is one (the portable kernels are the scalar
    /// functions). `None` for float and unsupported types.
    pub fn quant_dot(&self, weight: GgmlType) -> Option<QuantDot> {
        let mut k = tensor::quant_dot(weight)?;
        if let Some(dot) = simd_dot(self.isa, weight) {
            k.dot = dot;
        }
        if let Some(quantize) = simd_quantize(self.isa, k.activation) {
            k.quantize = quantize;
        }
        Some(k)
    }
}

/// A product of a quantized matrix (stored layout) with activation rows: its kernels and the
/// size of one quantized activation row.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatmul {
    pub k: QuantDot,
    /// The four-row kernel for `k.weight`, if this instruction set has one.
    pub dot4: Option<Dot4Fn>,
    /// The instruction set, for the kernels of packed K-quant weights.
    pub isa: Isa,
    pub cols: usize,
    /// Bytes of one activation row quantized to `k.activation` (for Q8_K, with its min pairs
    /// after the blocks).
    pub qrow: usize,
}

impl QuantMatmul {
    /// `None` for types without an integer product, or a row length that is not a whole
    /// number of activation blocks (shapes are validated at load, so that means "not ours").
    pub fn new(kernels: &Kernels, w: &Matrix) -> Option<Self> {
        let k = kernels.quant_dot(w.dtype)?;
        let mut qrow = k.activation.row_size(w.cols as u64)? as usize;
        if k.activation == GgmlType::Q8_K {
            // Each row is followed by its min pairs (see `packed_k::write_min_pairs`), for
            // every K-quant alike, so rows quantized once serve the products of all of them.
            qrow += w.cols / k_quants::QK * MIN_PAIR_BYTES;
        }
        (w.cols > 0 && qrow > 0).then_some(Self {
            k,
            dot4: simd_dot4(kernels.isa, w.dtype),
            isa: kernels.isa,
            cols: w.cols,
            qrow,
        })
    }

    /// Quantizes the whole `cols`-long rows of `x` into consecutive `qrow`-byte rows of `q`.
    pub fn quantize(&self, x: &[f32], q: &mut [u8]) {
        for (xr, qr) in x.chunks_exact(self.cols).zip(q.chunks_exact_mut(self.qrow)) {
            self.quantize_row(xr, qr);
        }
    }

    /// Quantizes one `cols`-long row into one `qrow`-byte row.
    pub fn quantize_row(&self, x: &[f32], q: &mut [u8]) {
        (self.k.quantize)(x, q);
        if self.k.activation == GgmlType::Q8_K {
            write_min_pairs(q, self.cols / k_quants::QK);
        }
    }

    /// `out[t * ldo + r] = w[r] · xq[t]` for rows `r0..r1` and tokens `t < n`, with `xq`
    /// holding `n` activation rows quantized by [`QuantMatmul::quantize`]. Weight rows are
    /// the outer loop and tokens the inner one (in tiles of `TOKEN_TILE`); with a
    /// four-row kernel, rows go four at a time (the rest one by one), which changes no
    /// result: every output is still one row's dot in that row's block order.
    ///
    /// # Safety
    /// `out` must be valid for writes at those offsets, and no other thread may access them
    /// during the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rows(
        &self,
        w: &Matrix,
        xq: &[u8],
        n: usize,
        r0: usize,
        r1: usize,
        out: OutPtr,
        ldo: usize,
    ) {
        if let Some(p) = PackedK::of(w) {
            // SAFETY: the kernels' ISA was checked when `Kernels` was built; the rest is the
            // caller's promise.
            if unsafe { p.rows(self.isa, xq, self.qrow, n, r0, r1, out, ldo) } {
                return;
            }
        }
        let rb = w.row_bytes();
        let data = w.bytes();
        assert!(xq.len() >= n * self.qrow && r1 <= w.rows && data.len() >= w.rows * rb);
        let dot = self.k.dot;
        let mut t0 = 0;
        while t0 < n {
            let t1 = (t0 + TOKEN_TILE).min(n);
            let mut r = r0;
            while r < r1 {
                match self.dot4 {
                    Some(dot4) if r + 4 <= r1 => {
                        let rows = &data[r * rb..(r + 4) * rb];
                        for t in t0..t1 {
                            let v = dot4(rows, rb, &xq[t * self.qrow..(t + 1) * self.qrow]);
                            for (i, v) in v.into_iter().enumerate() {
                                // SAFETY: the caller owns this output element.
                                unsafe { *out.0.add(t * ldo + r + i) = v };
                            }
                        }
                        r += 4;
                    }
                    _ => {
                        let row = &data[r * rb..(r + 1) * rb];
                        for t in t0..t1 {
                            let v = dot(row, &xq[t * self.qrow..(t + 1) * self.qrow]);
                            // SAFETY: the caller owns this output element.
                            unsafe { *out.0.add(t * ldo + r) = v };
                        }
                        r += 1;
                    }
                }
            }
            t0 = t1;
        }
    }

    /// The whole product on this thread: `out` is `n × w.rows`, `x` is `n × cols`.
    pub fn run(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        assert!(x.len() >= n * self.cols && out.len() >= n * w.rows);
        with_quant_scratch(n * self.qrow, |qx| {
            self.quantize(&x[..n * self.cols], qx);
            // SAFETY: `out` holds n × rows floats (checked above) and is borrowed mutably.
            unsafe { self.rows(w, qx, n, 0, w.rows, OutPtr(out.as_mut_ptr()), w.rows) };
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four-row kernels against the single-row ones on random bytes (random f16 scales
    /// included: subnormals, infinities, NaNs), for several row lengths.
    #[test]
    fn four_row_kernels_match_the_single_row_kernel_bit_for_bit() {
        let mut state = 0x2545_f491u32;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        };
        for isa in [Isa::Avx2, Isa::Neon, Isa::Portable] {
            for t in [GgmlType::Q4_0, GgmlType::Q5_0] {
                let (Some(dot4), Some(dot)) = (simd_dot4(isa, t), simd_dot(isa, t)) else {
                    continue;
                };
                for blocks in [0usize, 1, 3, 4, 7, 28] {
                    let rb = t.row_size(blocks as u64 * 32).unwrap() as usize;
                    let w: Vec<u8> = (0..4 * rb).map(|_| byte()).collect();
                    let x: Vec<u8> = (0..blocks * 34).map(|_| byte()).collect();
                    let got = dot4(&w, rb, &x);
                    for (r, g) in got.iter().enumerate() {
                        let want = dot(&w[r * rb..(r + 1) * rb], &x);
                        // NaN payloads are not specified (the compiler may swap the
                        // operands of an add), so a NaN only has to stay a NaN.
                        if want.is_nan() {
                            assert!(g.is_nan(), "{t} {blocks} row {r}");
                        } else {
                            assert_eq!(g.to_bits(), want.to_bits(), "{t} {blocks} row {r}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn word_unpacking_of_k4_scales_matches_the_scalar_one() {
        // Every value of each byte position, with the other bytes pseudo-random.
        let mut state = 0x9e37_79b9u32;
        for pos in 0..12 {
            for v in 0..=255u8 {
                let mut s = [0u8; 12];
                for b in s.iter_mut() {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    *b = state as u8;
                }
                s[pos] = v;
                assert_eq!(
                    scale_min_k4_words(&s),
                    tensor::k_quants::scale_min_k4(&s),
                    "{s:?}"
                );
            }
        }
    }
}
