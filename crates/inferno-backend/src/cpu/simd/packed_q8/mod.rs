//! Q8_0 weights repacked at load for the integer kernels: 16-row interleaved groups, one
//! 4-byte slice of each row side by side, so each 32-bit lane of a vector accumulates one
//! output row. The x86, AArch64 and portable products are beside this file.

#[cfg(target_arch = "aarch64")]
pub(super) mod aarch64;
pub(super) mod portable;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::{par_chunks_or_empty, Isa, Line, GROUP};
use inferno_tensor::{q8_0, GgmlType, Matrix};
use rayon::prelude::*;

/// Q8_0 weights regrouped for the integer kernels: rows in groups of 16 (the last padded with
/// zero rows); per group and block of 32 columns, 8 slices of 64 bytes, slice `k` holding
/// bytes `4k..4k+4` of the block for each of the 16 rows; the 16 block scales beside, as f16
/// (x86, portable) or widened to f32 (NEON, which has no stable f16 conversion intrinsic).
/// For VNNI the quants are stored offset by 128 (`w ^ 0x80`).
pub struct PackedQ8 {
    pub rows: usize,
    pub cols: usize,
    /// Blocks per row.
    pub nb: usize,
    pub groups: usize,
    offset: bool,
    quants: Vec<Line>,
    scales16: Vec<u16>,
    scales32: Vec<f32>,
}

impl PackedQ8 {
    /// Repacks a Q8_0 matrix for `isa`'s kernels; `None` for other types or a bad size.
    pub fn pack(isa: Isa, m: &Matrix) -> Option<PackedQ8> {
        if m.dtype != GgmlType::Q8_0 || !m.cols.is_multiple_of(q8_0::BLOCK) || m.rows == 0 {
            return None;
        }
        let nb = m.cols / q8_0::BLOCK;
        let row_bytes = nb * q8_0::BLOCK_BYTES;
        let data = m.bytes();
        if data.len() != m.rows.checked_mul(row_bytes)? {
            return None;
        }
        let groups = m.rows.div_ceil(GROUP);
        let offset = isa == Isa::Avx512Vnni;
        let f32_scales = isa == Isa::Neon;
        let glines = nb * 8; // 64-byte lines per group
        let mut quants = vec![Line([0; 64]); groups * glines];
        let mut scales16 = vec![0u16; if f32_scales { 0 } else { groups * nb * GROUP }];
        let mut scales32 = vec![0f32; if f32_scales { groups * nb * GROUP } else { 0 }];
        let fill = |g: usize, ql: &mut [Line], s16: &mut [u16], s32: &mut [f32]| {
            for r in 0..GROUP {
                let row = g * GROUP + r;
                let src = (row < m.rows).then(|| &data[row * row_bytes..(row + 1) * row_bytes]);
                for b in 0..nb {
                    let (scale, qs): (u16, &[u8]) = match src {
                        Some(s) => {
                            let blk = &s[b * q8_0::BLOCK_BYTES..(b + 1) * q8_0::BLOCK_BYTES];
                            (u16::from_le_bytes([blk[0], blk[1]]), &blk[2..])
                        }
                        None => (0, &[0u8; 32][..]),
                    };
                    if f32_scales {
                        s32[b * GROUP + r] = half::f16::from_bits(scale).to_f32();
                    } else {
                        s16[b * GROUP + r] = scale;
                    }
                    for k in 0..8 {
                        let line = &mut ql[b * 8 + k].0;
                        for j in 0..4 {
                            let v = qs[k * 4 + j];
                            line[r * 4 + j] = if offset { v ^ 0x80 } else { v };
                        }
                    }
                }
            }
        };
        let sg = if f32_scales { 0 } else { nb * GROUP };
        let sg32 = if f32_scales { nb * GROUP } else { 0 };
        // Packing a whole model is ~0.6 GB of shuffling: spread it over the cores.
        quants
            .par_chunks_mut(glines)
            .zip(par_chunks_or_empty(&mut scales16, sg, groups))
            .zip(par_chunks_or_empty(&mut scales32, sg32, groups))
            .enumerate()
            .for_each(|(g, ((ql, s16), s32))| fill(g, ql, s16, s32));
        Some(PackedQ8 {
            rows: m.rows,
            cols: m.cols,
            nb,
            groups,
            offset,
            quants,
            scales16,
            scales32,
        })
    }

    /// Real rows in group `g` (16 except perhaps the last).
    #[inline]
    pub fn rows_in_group(&self, g: usize) -> usize {
        GROUP.min(self.rows - g * GROUP)
    }

    /// All quants of group `g`: `nb` blocks of 512 bytes.
    #[inline]
    pub fn group_quants(&self, g: usize) -> &[u8] {
        let lines = &self.quants[g * self.nb * 8..(g + 1) * self.nb * 8];
        // SAFETY: `Line` is 64 plain bytes with no padding; the slice covers exactly them.
        unsafe { std::slice::from_raw_parts(lines.as_ptr() as *const u8, lines.len() * 64) }
    }

    /// The 512 bytes of block `b` of group `g`.
    pub fn block_quants(&self, g: usize, b: usize) -> &[u8] {
        &self.group_quants(g)[b * 512..(b + 1) * 512]
    }

    #[inline]
    pub fn group_scales16(&self, g: usize) -> &[u16] {
        &self.scales16[g * self.nb * GROUP..(g + 1) * self.nb * GROUP]
    }

    #[inline]
    pub fn group_scales32(&self, g: usize) -> &[f32] {
        &self.scales32[g * self.nb * GROUP..(g + 1) * self.nb * GROUP]
    }

    /// Scale of row `r` of group `g`, block `b`, as f32.
    pub fn scale(&self, g: usize, b: usize, r: usize) -> f32 {
        let i = (g * self.nb + b) * GROUP + r;
        if self.scales32.is_empty() {
            half::f16::from_bits(self.scales16[i]).to_f32()
        } else {
            self.scales32[i]
        }
    }

    /// A stored quant byte as the signed weight.
    #[inline]
    pub fn weight_value(&self, byte: u8) -> i8 {
        (if self.offset { byte ^ 0x80 } else { byte }) as i8
    }

    /// Whether `isa`'s kernel can read this packing (else the portable kernel is used).
    pub(super) fn fits(&self, isa: Isa) -> bool {
        match isa {
            Isa::Avx512Vnni => self.offset && !self.scales16.is_empty(),
            Isa::Avx2 => !self.offset && !self.scales16.is_empty(),
            Isa::Neon => !self.offset && !self.scales32.is_empty(),
            Isa::Portable => true,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.quants.len() * 64 + self.scales16.len() * 2 + self.scales32.len() * 4
    }

    /// The packed form stored on `m` by [`super::SimdBackend`]'s `prepare`, if any.
    pub fn of(m: &Matrix) -> Option<&PackedQ8> {
        m.prepared.as_ref()?.downcast_ref::<PackedQ8>()
    }

    /// The packed form of a Q8_0 matrix, which every product and row lookup of the `simd`
    /// family reads in place of the stored bytes.
    pub fn for_q8_0(m: &Matrix) -> Option<&PackedQ8> {
        Self::of(m).filter(|p| m.dtype == GgmlType::Q8_0 && p.rows == m.rows && p.cols == m.cols)
    }

    /// Row `r` as f32, exactly as `q8_0::dequantize` computes it from the stored blocks
    /// (`q as f32 * d`, the f16 scale widened exactly). `false` (and `out` untouched) if `r`
    /// or `out`'s length does not fit.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> bool {
        if r >= self.rows || out.len() != self.cols {
            return false;
        }
        let (g, i) = (r / GROUP, r % GROUP);
        for (b, o) in out.chunks_exact_mut(q8_0::BLOCK).enumerate() {
            let d = self.scale(g, b, i);
            let q = self.block_quants(g, b);
            for (k, o4) in o.chunks_exact_mut(4).enumerate() {
                // Slice k of the block holds values 4k..4k + 4 of each of the 16 rows.
                let src = &q[k * 64 + i * 4..k * 64 + i * 4 + 4];
                for (v, &byte) in o4.iter_mut().zip(src) {
                    *v = self.weight_value(byte) as f32 * d;
                }
            }
        }
        true
    }
}
