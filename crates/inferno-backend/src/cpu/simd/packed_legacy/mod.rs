//! Q4_0, Q5_0, Q4_1 and Q5_1 weights repacked at load for the integer kernels, in the
//! same 16-row interleaving as [`super::PackedQ8`] but keeping 4 (or 5) bits per weight, so
//! the packed copy is exactly the size of the stored one and replaces it in memory.
//!
//! Per group of 16 rows and block of 32 columns:
//! - 4 lines of 64 bytes: byte `4r + i` of line `j` holds, for row `r`, the code of element
//!   `8j + i` in its low nibble and of element `8j + 4 + i` in its high nibble — so one line
//!   gives two 4-element slices (`2j`, `2j + 1`) of all 16 rows, laid out as a Q8_0 slice;
//! - for Q5_0 and Q5_1, one line of 64 bytes (kept as 8 little-endian words): bit `k` of
//!   byte `4r + i` is the fifth bit of row `r`'s element `4k + i`, so a line's two slices
//!   (`2j`, `2j + 1`) find theirs at bits `2j`, `2j + 1` of the same byte as their codes, and
//!   a shift and a mask (or a bit test) take them out;
//! - the 16 f16 scales `d`, and for Q4_1 and Q5_1 the 16 f16 minimums `m`.
//!
//! Codes are unsigned: the x86 kernels multiply them as the unsigned operand of `vpdpbusd`
//! / `maddubs` against the signed activations, NEON's as signed bytes of `sdot` (all ≤ 31).
//! For Q4_0 and Q5_0 (value `d · (q − 8)` or `d · (q − 16)`) each block's integer sum
//! starts from `−8·Σx` (or `−16·Σx`), derived exactly from the activation block's stored
//! `−128·Σx`, and is scaled and accumulated as `legacy::dot_q4_0_q8_0` does. For Q4_1 and
//! Q5_1 (value `d · q + m`) the sum starts from zero and each block adds
//! `(d_w · d_x) · Σqx + m_w · s_x` as `legacy::dot_q4_1_q8_1` does, `d_x` and `s_x` being
//! the Q8_1 fields of the activation block (see [`super::ActQ8`]).
//! Each block's integer sum is the scalar code's exact one, so results are bit-identical to
//! the scalar dots.

use super::{Isa, Line, GROUP};

#[cfg(target_arch = "aarch64")]
pub(super) mod aarch64;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;
use inferno_tensor::{legacy, q8_0, GgmlType, Matrix};
use rayon::prelude::*;

/// Q4_0, Q5_0, Q4_1 or Q5_1 weights in the interleaved layout described in the module
/// documentation.
pub struct PackedLegacy {
    pub rows: usize,
    pub cols: usize,
    /// Blocks per row.
    pub nb: usize,
    pub groups: usize,
    /// Five-bit codes (Q5_0, Q5_1: fifth bits present) rather than four.
    pub five: bool,
    /// A per-block minimum (Q4_1, Q5_1: value `d · q + m`) rather than a fixed offset.
    pub min: bool,
    nibbles: Vec<Line>,
    high: Vec<u64>,
    scales: Vec<u16>,
    mins: Vec<u16>,
}

/// Where the fifth bit of row `r`'s element `4k + i` lies in its block's fifth-bit line
/// (see the module documentation): the little-endian word and the bit in it.
fn fifth_bit_at(r: usize, i: usize, k: usize) -> (usize, u32) {
    let byte = 4 * r + i;
    (byte / 8, (8 * (byte % 8) + k) as u32)
}

impl PackedLegacy {
    /// Whether `isa` has kernels for this layout (the vector paths).
    pub fn supported_on(isa: Isa) -> bool {
        matches!(isa, Isa::Avx2 | Isa::Avx512Vnni | Isa::Neon)
    }

    /// Whether `t` has this layout.
    pub fn packs(t: GgmlType) -> bool {
        matches!(
            t,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4_1 | GgmlType::Q5_1
        )
    }

    /// Repacks a Q4_0, Q5_0, Q4_1 or Q5_1 matrix; `None` for other types, a bad size, or an
    /// instruction set without kernels for the layout.
    pub fn pack(isa: Isa, m: &Matrix) -> Option<PackedLegacy> {
        let (five, min) = match m.dtype {
            GgmlType::Q4_0 => (false, false),
            GgmlType::Q5_0 => (true, false),
            GgmlType::Q4_1 => (false, true),
            GgmlType::Q5_1 => (true, true),
            _ => return None,
        };
        if !Self::supported_on(isa) || !m.cols.is_multiple_of(q8_0::BLOCK) || m.rows == 0 {
            return None;
        }
        let nb = m.cols / q8_0::BLOCK;
        let bsize = m.dtype.type_size();
        let row_bytes = nb * bsize;
        let data = m.bytes();
        if data.len() != m.rows.checked_mul(row_bytes)? {
            return None;
        }
        let groups = m.rows.div_ceil(GROUP);
        let (glines, ghigh, gscales) = (nb * 4, if five { nb * 8 } else { 0 }, nb * GROUP);
        let mut nibbles = vec![Line([0; 64]); groups * glines];
        let mut high = vec![0u64; groups * ghigh];
        let mut scales = vec![0u16; groups * gscales];
        let mut mins = vec![0u16; if min { groups * gscales } else { 0 }];
        let fill = |g: usize, nl: &mut [Line], hw: &mut [u64], sc: &mut [u16], mn: &mut [u16]| {
            for r in 0..GROUP.min(m.rows - g * GROUP) {
                let row = g * GROUP + r;
                let src = &data[row * row_bytes..(row + 1) * row_bytes];
                for b in 0..nb {
                    let blk = &src[b * bsize..(b + 1) * bsize];
                    sc[b * GROUP + r] = u16::from_le_bytes([blk[0], blk[1]]);
                    let codes = if min {
                        mn[b * GROUP + r] = u16::from_le_bytes([blk[2], blk[3]]);
                        legacy::min_codes(five, blk)
                    } else {
                        legacy::offset_codes(five, blk)
                    };
                    for j in 0..4 {
                        let line = &mut nl[b * 4 + j].0;
                        for i in 0..4 {
                            let (lo, hi) = (codes[8 * j + i], codes[8 * j + 4 + i]);
                            line[r * 4 + i] = (lo & 0x0f) | ((hi & 0x0f) << 4);
                        }
                    }
                    if five {
                        for k in 0..8 {
                            for i in 0..4 {
                                let bit = (codes[4 * k + i] >> 4) as u64 & 1;
                                let (word, shift) = fifth_bit_at(r, i, k);
                                hw[b * 8 + word] |= bit << shift;
                            }
                        }
                    }
                }
            }
        };
        // Rows absent from the last group stay zero codes with zero scales and minimums:
        // their lanes are computed and never stored.
        nibbles
            .par_chunks_mut(glines)
            .zip(super::par_chunks_or_empty(&mut high, ghigh, groups))
            .zip(scales.par_chunks_mut(gscales))
            .zip(super::par_chunks_or_empty(
                &mut mins,
                if min { gscales } else { 0 },
                groups,
            ))
            .enumerate()
            .for_each(|(g, (((nl, hw), sc), mn))| fill(g, nl, hw, sc, mn));
        Some(PackedLegacy {
            rows: m.rows,
            cols: m.cols,
            nb,
            groups,
            five,
            min,
            nibbles,
            high,
            scales,
            mins,
        })
    }

    /// The stored type.
    pub fn dtype(&self) -> GgmlType {
        match (self.five, self.min) {
            (false, false) => GgmlType::Q4_0,
            (true, false) => GgmlType::Q5_0,
            (false, true) => GgmlType::Q4_1,
            (true, true) => GgmlType::Q5_1,
        }
    }

    /// Real rows in group `g` (16 except perhaps the last).
    #[inline]
    pub fn rows_in_group(&self, g: usize) -> usize {
        GROUP.min(self.rows - g * GROUP)
    }

    /// The nibble lines of group `g`: `nb` blocks of 256 bytes.
    #[inline]
    pub fn group_nibbles(&self, g: usize) -> &[u8] {
        let lines = &self.nibbles[g * self.nb * 4..(g + 1) * self.nb * 4];
        // SAFETY: `Line` is 64 plain bytes with no padding; the slice covers exactly them.
        unsafe { std::slice::from_raw_parts(lines.as_ptr() as *const u8, lines.len() * 64) }
    }

    /// The fifth-bit lines of group `g` (`nb` blocks of 8 words, 64 bytes); empty for Q4_0
    /// and Q4_1.
    #[inline]
    pub fn group_high(&self, g: usize) -> &[u64] {
        if self.five {
            &self.high[g * self.nb * 8..(g + 1) * self.nb * 8]
        } else {
            &[]
        }
    }

    #[inline]
    pub fn group_scales16(&self, g: usize) -> &[u16] {
        &self.scales[g * self.nb * GROUP..(g + 1) * self.nb * GROUP]
    }

    /// The f16 minimums of group `g` (`nb` blocks of 16); empty for Q4_0 and Q5_0.
    #[inline]
    pub fn group_mins16(&self, g: usize) -> &[u16] {
        if self.min {
            &self.mins[g * self.nb * GROUP..(g + 1) * self.nb * GROUP]
        } else {
            &[]
        }
    }

    /// The code of row `r` of group `g`, element `e` of block `b` (as stored in the file).
    pub fn code(&self, g: usize, b: usize, r: usize, e: usize) -> u8 {
        let (k, i) = (e / 4, e % 4);
        let byte = self.group_nibbles(g)[b * 256 + (k / 2) * 64 + r * 4 + i];
        let nib = if k % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        let hi = if self.five {
            let (word, shift) = fifth_bit_at(r, i, k);
            ((self.group_high(g)[b * 8 + word] >> shift) & 1) as u8
        } else {
            0
        };
        nib | (hi << 4)
    }

    /// Row `r` as f32, exactly as `legacy::dequantize_q4_0` (`_q5_0`, `_q4_1`, `_q5_1`)
    /// computes it from the stored blocks. `false` (and `out` untouched) if `r` or `out`'s
    /// length does not fit.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> bool {
        if r >= self.rows || out.len() != self.cols {
            return false;
        }
        let (g, i) = (r / GROUP, r % GROUP);
        let offset = if self.five { 16 } else { 8 };
        let f16 = |bits: u16| half::f16::from_bits(bits).to_f32();
        for (b, o) in out.chunks_exact_mut(q8_0::BLOCK).enumerate() {
            let d = f16(self.group_scales16(g)[b * GROUP + i]);
            if self.min {
                let m = f16(self.group_mins16(g)[b * GROUP + i]);
                for (e, v) in o.iter_mut().enumerate() {
                    *v = d * self.code(g, b, i, e) as f32 + m;
                }
            } else {
                for (e, v) in o.iter_mut().enumerate() {
                    *v = d * (self.code(g, b, i, e) as i32 - offset) as f32;
                }
            }
        }
        true
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.nibbles.len() * 64 + self.high.len() * 8 + self.scales.len() * 2 + self.mins.len() * 2
    }

    /// The packed form stored on `m` by `SimdBackend::prepare`, if it matches `m`.
    pub fn of(m: &Matrix) -> Option<&PackedLegacy> {
        let p = m.prepared.as_ref()?.downcast_ref::<PackedLegacy>()?;
        (p.dtype() == m.dtype && p.rows == m.rows && p.cols == m.cols).then_some(p)
    }
}
