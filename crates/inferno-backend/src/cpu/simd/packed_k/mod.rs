//! Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights regrouped at load for multi-row integer
//! products: rows in groups of 16 and, per group and 256-value super-block, every field of
//! the 16 blocks laid out so one 64-byte line holds four consecutive quant bytes of each
//! row (the operand shape of `vpdpbusd`, of two AVX2 `maddubs` and of four NEON `sdot`),
//! with the f16 scales and the 6-bit sub-block scales unpacked to one byte per row beside
//! them. Nothing is widened: the packed form is within 3% of the stored size (Q3_K: 5.5%,
//! its 6-bit scales taking a byte each), so it can replace the stored bytes.
//!
//! Lines of one (group, super-block), for row `r` and byte `i < 4` of each 4-byte slot:
//!
//! | type | lines | content                                                               |
//! |------|------:|-----------------------------------------------------------------------|
//! | all  | 0     | `d` of the 16 rows (f16), then `dmin` (Q4_K, Q5_K; zero for Q6_K)     |
//! | Q4_K, Q5_K | 1–2 | sub-block scales: byte `16·j + r` for sub-block `j`            |
//! | Q4_K, Q5_K | 3–4 | mins in pairs of sub-blocks: byte `32·p + 2r + e` holds the min of sub-block `2p + e`, so one widening gives the 16-bit pairs of `vpdpwssd` / `madd` |
//! | Q5_K, `Bytes` form | 5–12 | the fifth bits: line `k` holds `qh[4k + i]` of row `r` at byte `4r + i` |
//! | Q4_K; Q5_K `Bytes` | 5–36; 13–44 | line `8c + k` of the quants (Q4_K from line 5, Q5_K from 13): `qs[32c + 4k + i]` (elements `64c + 4k + i` in the low nibbles, `64c + 32 + 4k + i` in the high ones) |
//! | Q5_K, `Chunks` form | 5–44 | per chunk `c < 4`, two lines of fifth bits then its 8 quant lines: quant line `8c + k` is line `7 + 10c + k`, and bits `2m` and `2m + 1` (`m = k mod 4`) of byte `4r + i` of line `5 + 10c + k div 4` are bits `2c` and `2c + 1` of `qh[4k + i]`, the fifth bits of its low and high nibbles |
//! | Q6_K | 1–4   | the 16 signed scales: byte `16·g + r` for group `g`                   |
//! | Q6_K | 5–52  | per half `h` and `k < 8`, three lines: `ql[64h + 4k + i]`, `ql[64h + 32 + 4k + i]`, `qh[32h + 4k + i]` |
//! | Q3_K | 1–4   | the 16 scales, signed (offset 32 taken off): byte `16·g + r` for sub-block `g` |
//! | Q3_K | 5–28  | per `k < 8`, three lines `X`, `Y`, `Z` of the 3-bit codes `c_j` (low 2 bits + 4·hmask bit, 0–7) of elements `32j + 4k + i`: `X = c0 + 8·c1 + 64·(c6 mod 4)`, `Y = c2 + 8·c3 + 64·(c7 mod 4)`, `Z = c4 + 8·c5 + 64·(c6 div 4) + 128·(c7 div 4)`: six codes come out with a shift and a mask, the last two with four ops |
//! | Q2_K | 0     | `d` then `dmin` of the 16 rows (f16), as Q4_K                         |
//! | Q2_K | 1–4   | the stored scale bytes (scale in the low nibble, min in the high): byte `16·g + r` |
//! | Q2_K | 5–20  | line `5 + 8h + k`: `qs[32h + 4k + i]` (elements `128h + 32s + 4k + i` in bit pairs `2s`) |
//!
//! The kernels (`x86.rs`, `aarch64.rs` beside this file) form exactly the integer sums of
//! the scalar dot products in `inferno_tensor::k_quants` and fold each super-block into the
//! f32 accumulator with the scalar expression, so every output equals the scalar dot of its
//! row with that token's Q8_K row, bit for bit. They read each Q8_K block's sums of 16 values
//! (`bsums`, which the quantizer writes) for the mins and for the offsets of Q6_K (32) and
//! Q3_K (4), as the scalar Q2_K/Q4_K/Q5_K products do for their mins; Q4_K and Q5_K read
//! them summed per 32-value sub-block, once per activation row (`write_min_pairs`).

use super::{Isa, Line, OutPtr, GROUP};

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;
use inferno_tensor::k_quants::{self, QK};
use inferno_tensor::{GgmlType, Matrix};
use rayon::prelude::*;

/// Lines per (group, super-block) for each type.
const fn lines_per_block(t: GgmlType) -> usize {
    match t {
        GgmlType::Q4_K => 37,
        GgmlType::Q5_K => 45,
        GgmlType::Q6_K => 53,
        GgmlType::Q3_K => 29,
        GgmlType::Q2_K => 21,
        _ => 0,
    }
}

/// First line of the quants (Q2_K, Q4_K, Q5_K) or of the line triples (Q3_K, Q6_K).
pub(super) const fn quant_line(t: GgmlType) -> usize {
    match t {
        GgmlType::Q5_K => 13,
        _ => 5,
    }
}

/// How a packed Q5_K keeps its fifth bits: as the stored bytes (lines 5–12, before all the
/// quants), which the AVX2 and NEON kernels shift into place, or regrouped per chunk, two
/// lines in front of the chunk's eight quant lines, for the VNNI kernel: it then reads each
/// super-block front to back (decode with all the fifth bits first ran at about 70% of
/// this speed) and takes a line's fifth bits out with shifts and a mask, which issue beside
/// `vpdpbusd` (byte masks moved through mask registers compete with it). Same size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FifthBits {
    Bytes,
    Chunks,
}

impl FifthBits {
    /// The form `isa`'s kernels read.
    pub fn for_isa(isa: Isa) -> FifthBits {
        match isa {
            Isa::Avx512Vnni => FifthBits::Chunks,
            _ => FifthBits::Bytes,
        }
    }
}

/// Q2_K–Q6_K weights in the packed layout (see the module documentation).
pub struct PackedK {
    pub dtype: GgmlType,
    /// The form of the fifth bits (Q5_K; `Bytes` for the other types).
    pub fifth: FifthBits,
    pub rows: usize,
    pub cols: usize,
    /// Super-blocks per row.
    pub nsb: usize,
    pub groups: usize,
    /// Whether the VNNI Q2_K products scale the codes by a byte lookup (see
    /// [`q2_lookups`]): set only where this CPU has the instructions, so not public. Only
    /// the x86 kernels read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    q2_lookups: bool,
    lines: Vec<Line>,
}

/// Whether `isa`'s Q2_K products of several tokens look each code's product with its
/// sub-block scale up in a table (`vpermb`, AVX-512 VBMI) instead of multiplying each
/// sub-block's sum by its scale (`vpmulld`): a 2-bit code times a 4-bit scale is at most 45,
/// a byte, so the integer sums are the same. The lookups issue beside `vpdpbusd`, where the
/// multiplies take its port (`cargo bench --bench kernels -- vpdpbusd_beside`).
pub fn q2_lookups(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Avx512Vnni && is_x86_feature_detected!("avx512vbmi");
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

impl PackedK {
    /// Whether `t` has a packed layout.
    pub fn packs(t: GgmlType) -> bool {
        lines_per_block(t) > 0
    }

    /// Whether `isa` has kernels for the packed layout of `t`.
    pub fn isa_has_kernels(isa: Isa, t: GgmlType) -> bool {
        Self::packs(t) && matches!(isa, Isa::Avx2 | Isa::Avx512Vnni | Isa::Neon)
    }

    /// Repacks `m` for `isa`'s kernels; `None` for other types or a size that does not match
    /// the type.
    pub fn pack(isa: Isa, m: &Matrix) -> Option<PackedK> {
        let t = m.dtype;
        let fifth = if t == GgmlType::Q5_K {
            FifthBits::for_isa(isa)
        } else {
            FifthBits::Bytes
        };
        if !Self::packs(t) || !m.cols.is_multiple_of(QK) || m.rows == 0 {
            return None;
        }
        let nsb = m.cols / QK;
        let rb = m.row_bytes();
        let data = m.bytes();
        if data.len() != m.rows.checked_mul(rb)? {
            return None;
        }
        let groups = m.rows.div_ceil(GROUP);
        let per = lines_per_block(t);
        let mut lines = vec![Line([0; 64]); groups * nsb * per];
        let bb = t.type_size();
        // Packing a whole model is a few hundred MB of shuffling: spread it over the cores.
        lines
            .par_chunks_mut(nsb * per)
            .enumerate()
            .for_each(|(g, gl)| {
                for r in 0..GROUP.min(m.rows - g * GROUP) {
                    let row = &data[(g * GROUP + r) * rb..(g * GROUP + r + 1) * rb];
                    for (b, blk) in row.chunks_exact(bb).enumerate() {
                        put_block(t, &mut gl[b * per..(b + 1) * per], r, blk);
                    }
                }
                if fifth == FifthBits::Chunks {
                    gl.chunks_exact_mut(per).for_each(fifth_bytes_to_chunks);
                }
            });
        Some(PackedK {
            dtype: t,
            fifth,
            rows: m.rows,
            cols: m.cols,
            nsb,
            groups,
            q2_lookups: t == GgmlType::Q2_K && q2_lookups(isa),
            lines,
        })
    }

    /// The packed form stored on `m` by `prepare`, if any.
    pub fn of(m: &Matrix) -> Option<&PackedK> {
        m.prepared.as_ref()?.downcast_ref::<PackedK>()
    }

    /// Real rows in group `g` (16 except perhaps the last).
    #[inline]
    pub fn rows_in_group(&self, g: usize) -> usize {
        GROUP.min(self.rows - g * GROUP)
    }

    /// Bytes of one (group, super-block).
    #[inline]
    pub fn block_bytes(&self) -> usize {
        lines_per_block(self.dtype) * 64
    }

    /// All bytes of group `g`: `nsb` packed super-blocks of [`PackedK::block_bytes`].
    #[inline]
    pub fn group(&self, g: usize) -> &[u8] {
        let per = lines_per_block(self.dtype);
        let l = &self.lines[g * self.nsb * per..(g + 1) * self.nsb * per];
        // SAFETY: `Line` is 64 plain bytes with no padding; the slice covers exactly them.
        unsafe { std::slice::from_raw_parts(l.as_ptr() as *const u8, l.len() * 64) }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// `out[t * ldo + r] = w[r] · xq[t]` for rows `r0..r1` and tokens `t < n`, with `xq`
    /// holding `n` Q8_K rows of `qrow` bytes, each followed by its min pairs (quantized by
    /// `QuantMatmul::quantize`), on `isa`'s kernels. Returns `false`, computing nothing,
    /// where `isa` has none.
    ///
    /// # Safety
    /// `isa` must be available on this CPU; `out` must be valid for writes at those offsets,
    /// and no other thread may access them during the call.
    #[allow(clippy::too_many_arguments, unused_variables)]
    pub unsafe fn rows(
        &self,
        isa: Isa,
        xq: &[u8],
        qrow: usize,
        n: usize,
        r0: usize,
        r1: usize,
        out: OutPtr,
        ldo: usize,
    ) -> bool {
        assert!(
            r0 <= r1
                && r1 <= self.rows
                && qrow >= self.nsb * (k_quants::Q8_K_BYTES + MIN_PAIR_BYTES)
        );
        assert!(xq.len() >= n * qrow && ldo >= r1);
        let j = Job {
            p: self,
            xq: xq.as_ptr(),
            qrow,
            out: out.0,
            ldo,
            r0,
            r1,
            pf: std::ptr::null(),
            pf_block: 0,
        };
        // Q5_K's fifth bits are in the form of the ISA it was packed for; another ISA's
        // kernels would misread them.
        if self.dtype == GgmlType::Q5_K && FifthBits::for_isa(isa) != self.fifth {
            return false;
        }
        if !Self::isa_has_kernels(isa, self.dtype) {
            return false;
        }
        let (g0, g1) = (r0 / GROUP, r1.div_ceil(GROUP));
        // SAFETY: the ISA is the caller's promise, the sizes were checked above, the output
        // is the caller's.
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512Vnni => x86::gemm_vnni(j, n, g0, g1),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => x86::gemm_avx2(j, n, g0, g1),
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => aarch64::gemm_sdot(j, n, g0, g1),
                _ => return false,
            }
        }
        true
    }

    /// Row `r` dequantized into `out` (`cols` values), one stored block at a time through a
    /// stack buffer: the embedding lookup of a packed (tied) embedding, allocation-free.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> bool {
        if r >= self.rows || out.len() < self.cols {
            return false;
        }
        let (g, rr) = (r / GROUP, r % GROUP);
        let per = lines_per_block(self.dtype);
        let gl = &self.lines[g * self.nsb * per..(g + 1) * self.nsb * per];
        let bb = self.dtype.type_size();
        let mut blk = [0u8; k_quants::Q6_K_BYTES];
        for (b, o) in out.chunks_exact_mut(QK).take(self.nsb).enumerate() {
            get_block(
                self.dtype,
                self.fifth,
                &gl[b * per..(b + 1) * per],
                rr,
                &mut blk[..bb],
            );
            if inferno_tensor::dequantize_row(self.dtype, &blk[..bb], o).is_err() {
                return false;
            }
        }
        true
    }

    /// Row `r` in its stored layout, written to `out` (one row's bytes): the exact inverse
    /// of the packing, for the products and lookups that read a single row.
    pub fn stored_row(&self, r: usize, out: &mut [u8]) {
        let (g, rr) = (r / GROUP, r % GROUP);
        let per = lines_per_block(self.dtype);
        let bb = self.dtype.type_size();
        let gl = &self.lines[g * self.nsb * per..(g + 1) * self.nsb * per];
        for (b, blk) in out.chunks_exact_mut(bb).take(self.nsb).enumerate() {
            get_block(self.dtype, self.fifth, &gl[b * per..(b + 1) * per], rr, blk);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared by the kernels
// ---------------------------------------------------------------------------------------

/// Offset of the quants in a Q8_K block (after its f32 scale), and of its 16 block sums.
const XQS: usize = 4;
const XBS: usize = 4 + QK;

/// The Q8_K scale of the block at `x`.
///
/// # Safety
/// A whole Q8_K block must be readable at `x`.
#[inline(always)]
pub(super) unsafe fn x_d(x: *const u8) -> f32 {
    // SAFETY: the first 4 bytes of the block.
    unsafe { (x as *const f32).read_unaligned() }
}

/// Sum `g` of the 16 sums of 16 activation quants of the block at `x`.
///
/// # Safety
/// As for [`x_d`].
#[inline(always)]
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) unsafe fn x_bsum(x: *const u8, g: usize) -> i32 {
    // SAFETY: inside the block's sums.
    unsafe { (x.add(XBS + 2 * g) as *const i16).read_unaligned() as i32 }
}

/// The 16 sums of 16 activation quants of the block at `x` (i16 each, in order).
///
/// # Safety
/// As for [`x_d`]; the pointer is valid for 32 bytes.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) unsafe fn x_bsums(x: *const u8) -> *const u8 {
    // SAFETY: the sums end the block.
    unsafe { x.add(XBS) }
}

/// Bytes of min pairs per super-block after an activation row's Q8_K blocks.
pub(crate) const MIN_PAIR_BYTES: usize = 16;

/// Writes, after the `nsb` Q8_K blocks at the start of `row`, each block's four min pairs:
/// pair `p` holds the sums of the 32 quants of sub-blocks `2p` and `2p + 1` (each the sum
/// of two 16-value sums, at most 32·128 in magnitude) as the two i16 halves of one i32,
/// the operand of the Q4_K/Q5_K min terms' 16-bit pair products. Formed once per row
/// here, they are read by every group of rows as one broadcast; formed from the sums in
/// the kernel, for every group again, they took 14% of the VNNI Q5_K product's time.
pub(crate) fn write_min_pairs(row: &mut [u8], nsb: usize) {
    let (blocks, pairs) = row.split_at_mut(nsb * k_quants::Q8_K_BYTES);
    for (blk, out) in blocks
        .chunks_exact(k_quants::Q8_K_BYTES)
        .zip(pairs.chunks_exact_mut(MIN_PAIR_BYTES))
    {
        let bsum = |g: usize| i16::from_le_bytes([blk[XBS + 2 * g], blk[XBS + 2 * g + 1]]);
        for (p, o) in out.chunks_exact_mut(4).enumerate() {
            // Two 16-value sums of i8 quants: |sum| <= 32·128, no i16 overflow.
            let a = bsum(4 * p) + bsum(4 * p + 1);
            let b = bsum(4 * p + 2) + bsum(4 * p + 3);
            o[..2].copy_from_slice(&a.to_le_bytes());
            o[2..].copy_from_slice(&b.to_le_bytes());
        }
    }
}

/// Min pair `p` of the block at `x` (see [`write_min_pairs`]), `off` bytes after it
/// ([`Job::min_pairs_from`]).
///
/// # Safety
/// `x` is block `b` of an activation row quantized with its min pairs and `off` is
/// `min_pairs_from(b)`.
#[inline(always)]
pub(super) unsafe fn x_min_pair(x: *const u8, off: usize, p: usize) -> i32 {
    // SAFETY: inside the row's min pairs, the caller's promise.
    unsafe { (x.add(off + 4 * p) as *const i32).read_unaligned() }
}

/// The activation sums of 16-value groups `2p` and `2p + 1` as the two i16 halves of one
/// i32 (as stored).
///
/// # Safety
/// As for [`x_d`].
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) unsafe fn x_bsum_pair(x: *const u8, p: usize) -> i32 {
    // SAFETY: inside the block's sums.
    unsafe { (x.add(XBS + 4 * p) as *const i32).read_unaligned() }
}

/// Four activation quants at `x + XQS + e` as one i32, for a broadcast.
///
/// # Safety
/// As for [`x_d`], with `e + 4 <= 256`.
#[inline(always)]
pub(super) unsafe fn x4(x: *const u8, e: usize) -> i32 {
    // SAFETY: inside the block's quants.
    unsafe { (x.add(XQS + e) as *const i32).read_unaligned() }
}

/// The lanes `lo..hi` of a group starting at row `first` whose rows fall in `r0..r1`
/// (empty where none do): what a job may write, and read back, of that group's outputs.
#[inline(always)]
pub(super) fn owned_lanes(first: usize, r0: usize, r1: usize) -> (usize, usize) {
    (
        r0.max(first) - first,
        r1.min(first + GROUP).saturating_sub(first),
    )
}

/// Writes the rows of `lanes` (rows `g·16 ..` of the output) that fall in `r0..r1`.
///
/// # Safety
/// The caller owns those elements of the output row at `dst` (element `g·16` of it).
#[inline(always)]
pub(super) unsafe fn store_window(
    dst: *mut f32,
    lanes: &[f32; GROUP],
    first: usize,
    r0: usize,
    r1: usize,
) {
    let (lo, hi) = owned_lanes(first, r0, r1);
    if lo < hi {
        // SAFETY: rows `first + lo .. first + hi` are inside `r0..r1`, the caller's.
        unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr().add(lo), dst.add(lo), hi - lo) };
    }
}

/// The inverse of [`store_window`]: the rows of the output row at `src` (element `g·16` of
/// it) that fall in `r0..r1` into `lanes`, the others left as they are.
///
/// # Safety
/// The caller owns those elements of the output row at `src`.
#[inline(always)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) unsafe fn load_window(
    src: *const f32,
    lanes: &mut [f32; GROUP],
    first: usize,
    r0: usize,
    r1: usize,
) {
    let (lo, hi) = owned_lanes(first, r0, r1);
    if lo < hi {
        // SAFETY: rows `first + lo .. first + hi` are inside `r0..r1`, the caller's.
        unsafe { std::ptr::copy_nonoverlapping(src.add(lo), lanes.as_mut_ptr().add(lo), hi - lo) };
    }
}

/// What one kernel call covers: tokens `t0..t0 + T` of `xq` (rows of `qrow` bytes), output
/// rows `r0..r1` (clipped to the group), written at `out[t * ldo + r]`.
#[derive(Clone, Copy)]
pub(super) struct Job<'a> {
    pub p: &'a PackedK,
    pub xq: *const u8,
    pub qrow: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub r0: usize,
    pub r1: usize,
    /// Where this tile's share of the next group's bytes starts, and its bytes per
    /// super-block, for the x86 kernels to prefetch as they go (null: none).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub pf: *const u8,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub pf_block: usize,
}

impl Job<'_> {
    /// From block `b` of an activation row to that block's min pairs, after the row's
    /// `nsb` blocks: the same offset for every token.
    #[inline(always)]
    pub fn min_pairs_from(&self, b: usize) -> usize {
        (self.p.nsb - b) * k_quants::Q8_K_BYTES + b * MIN_PAIR_BYTES
    }
}

// ---------------------------------------------------------------------------------------
// Prompts: codes unpacked once per group
// ---------------------------------------------------------------------------------------

/// Tokens from which a VNNI or NEON product unpacks each group's codes once instead of in
/// every tile: a second tile already repays the stores and reloads. (AVX2 unpacks from two
/// tokens: see `x86::gemm_avx2`.)
pub(super) const UNPACK_MIN_TOKENS: usize = 16;

/// Super-blocks of a group unpacked at a time: 16 KiB of codes, which stay in L1 beside a
/// tile's activation blocks.
pub(super) const UNPACKED_BLOCKS: usize = 4;

/// Lines of codes per super-block: 256 values of the 16 rows, one byte each.
pub(super) const CODE_LINES: usize = 64;

/// The unpacked codes of up to [`UNPACKED_BLOCKS`] super-blocks of one group: line
/// `64·b + L` holds values `4L .. 4L + 4` of every row of super-block `b` (byte `4r + i`
/// for row `r`), as unsigned codes (Q4_K, Q5_K: 0–31; Q6_K: the value plus 32; Q3_K: plus
/// 4; Q2_K: 0–3, or 0–45 times their sub-block scales where [`q2_lookups`]), the operand of
/// `vpdpbusd`, of two AVX2 `maddubs` and of four NEON `sdot`.
/// The AVX2 products of the packed legacy types (Q4_0–Q5_1) use the same 16 KiB by lines
/// ([`Codes::line`]): 8 a 32-value block, 32 blocks at a time.
///
/// Left uninitialised: every slot a kernel reads was written whole by the unpacking just
/// before (zeroing 16 KiB in every product call took about 4% of the instructions of a
/// batched decode step). Only raw pointers reach the bytes, never a reference.
#[repr(C, align(64))]
pub(super) struct Codes(std::mem::MaybeUninit<[[u8; 64]; UNPACKED_BLOCKS * CODE_LINES]>);

impl Codes {
    pub(super) fn new() -> Self {
        Codes(std::mem::MaybeUninit::uninit())
    }

    /// The first byte of super-block slot `b < UNPACKED_BLOCKS`'s lines.
    pub(super) fn block(&self, b: usize) -> *const u8 {
        assert!(b < UNPACKED_BLOCKS);
        self.line(b * CODE_LINES)
    }

    /// The first byte of line `l` of the scratch, in any unit of lines (the packed legacy
    /// types unpack 8 lines a block, 32 blocks at a time).
    pub(super) fn line(&self, l: usize) -> *const u8 {
        assert!(l < UNPACKED_BLOCKS * CODE_LINES);
        self.0.as_ptr().cast::<u8>().wrapping_add(l * 64)
    }

    /// As [`Codes::line`], for writing.
    pub(super) fn line_mut(&mut self, l: usize) -> *mut u8 {
        assert!(l < UNPACKED_BLOCKS * CODE_LINES);
        self.0.as_mut_ptr().cast::<u8>().wrapping_add(l * 64)
    }

    /// As [`Codes::block`], for writing.
    pub(super) fn block_mut(&mut self, b: usize) -> *mut u8 {
        assert!(b < UNPACKED_BLOCKS);
        self.line_mut(b * CODE_LINES)
    }
}

/// Which packed type a codes kernel reads (its sub-block scales and the end of its
/// super-block): Q4_K and Q5_K differ only in their unpacking.
pub(super) const KIND_Q4: u8 = 0;
pub(super) const KIND_Q5: u8 = 1;
pub(super) const KIND_Q6: u8 = 2;
pub(super) const KIND_Q3: u8 = 3;
pub(super) const KIND_Q2: u8 = 4;
/// Q2_K with each code times its sub-block scale in the unpacked bytes ([`q2_lookups`]);
/// an x86 kernel's form only.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const KIND_Q2_SCALED: u8 = 5;

// ---------------------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------------------

/// Byte `i` of row `r`'s 4-byte slot in a line.
#[inline]
fn slot(r: usize, i: usize) -> usize {
    4 * r + i
}

/// Offset of the min of sub-block `j` of row `r` in lines 3–4 (Q4_K, Q5_K).
#[inline]
fn min_at(j: usize, r: usize) -> usize {
    32 * (j / 2) + 2 * r + j % 2
}

/// Line and bit of the `Chunks` form that hold bit `2c + h` of a row's `qh[4k + i]` (at the
/// row's byte `slot(r, i)` of that line).
#[inline]
fn fifth_chunk_bit(c: usize, k: usize, h: usize) -> (usize, u32) {
    (fifth_line(c, k), (2 * (k % 4) + h) as u32)
}

/// Writes row `r`'s stored block `blk` into one packed (group, super-block), Q5_K's fifth
/// bits in the `Bytes` form.
fn put_block(t: GgmlType, l: &mut [Line], r: usize, blk: &[u8]) {
    match t {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            l[0].0[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
            l[0].0[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk[2..4]);
            let (sc, mn) = k_quants::scale_min_k4(&blk[4..16]);
            for j in 0..8 {
                let at = 16 * j + r;
                l[1 + at / 64].0[at % 64] = sc[j];
                let am = min_at(j, r);
                l[3 + am / 64].0[am % 64] = mn[j];
            }
            let (qh, qs) = if t == GgmlType::Q5_K {
                (&blk[16..48], &blk[48..176])
            } else {
                (&blk[0..0], &blk[16..144])
            };
            for k in 0..8 {
                for i in 0..4 {
                    if !qh.is_empty() {
                        l[5 + k].0[slot(r, i)] = qh[4 * k + i];
                    }
                    for c in 0..4 {
                        l[quant_line(t) + 8 * c + k].0[slot(r, i)] = qs[32 * c + 4 * k + i];
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            l[0].0[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
            for g in 0..16 {
                let at = 16 * g + r;
                l[1 + at / 64].0[at % 64] = blk[192 + g];
            }
            let (ql, qh) = (&blk[..128], &blk[128..192]);
            for h in 0..2 {
                for k in 0..8 {
                    let base = 5 + (8 * h + k) * 3;
                    for i in 0..4 {
                        l[base].0[slot(r, i)] = ql[64 * h + 4 * k + i];
                        l[base + 1].0[slot(r, i)] = ql[64 * h + 32 + 4 * k + i];
                        l[base + 2].0[slot(r, i)] = qh[32 * h + 4 * k + i];
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            l[0].0[2 * r..2 * r + 2].copy_from_slice(&blk[108..110]);
            let sc = k_quants::q3_k_scales(&blk[96..108]);
            for (g, &s) in sc.iter().enumerate() {
                let at = 16 * g + r;
                l[1 + at / 64].0[at % 64] = s as u8;
            }
            let (hm, qs) = (&blk[..32], &blk[32..96]);
            for k in 0..8 {
                for i in 0..4 {
                    let e = 4 * k + i;
                    let c: [u8; 8] = std::array::from_fn(|j| {
                        ((qs[32 * (j / 4) + e] >> (2 * (j % 4))) & 3) | (((hm[e] >> j) & 1) << 2)
                    });
                    let [x, y, z] = q3_code_bytes(&c);
                    l[5 + 3 * k].0[slot(r, i)] = x;
                    l[6 + 3 * k].0[slot(r, i)] = y;
                    l[7 + 3 * k].0[slot(r, i)] = z;
                }
            }
        }
        GgmlType::Q2_K => {
            l[0].0[2 * r..2 * r + 2].copy_from_slice(&blk[80..82]);
            l[0].0[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk[82..84]);
            for (g, &sc) in blk[..16].iter().enumerate() {
                let at = 16 * g + r;
                l[1 + at / 64].0[at % 64] = sc;
            }
            for h in 0..2 {
                for k in 0..8 {
                    for i in 0..4 {
                        l[5 + 8 * h + k].0[slot(r, i)] = blk[16 + 32 * h + 4 * k + i];
                    }
                }
            }
        }
        _ => {}
    }
}

/// The three packed bytes `X`, `Y`, `Z` of Q3_K codes `c` (see the module documentation).
#[inline]
fn q3_code_bytes(c: &[u8; 8]) -> [u8; 3] {
    [
        c[0] | (c[1] << 3) | ((c[6] & 3) << 6),
        c[2] | (c[3] << 3) | ((c[7] & 3) << 6),
        c[4] | (c[5] << 3) | ((c[6] >> 2) << 6) | ((c[7] >> 2) << 7),
    ]
}

/// The eight Q3_K codes of the packed bytes `X`, `Y`, `Z` (the inverse of `q3_code_bytes`).
#[inline]
fn q3_codes(b: [u8; 3]) -> [u8; 8] {
    let [x, y, z] = b;
    [
        x & 7,
        (x >> 3) & 7,
        y & 7,
        (y >> 3) & 7,
        z & 7,
        (z >> 3) & 7,
        (x >> 6) | (((z >> 6) & 1) << 2),
        (y >> 6) | ((z >> 7) << 2),
    ]
}

/// Line of quant bytes `8c + k` (Q4_K, Q5_K) in a packed super-block.
#[inline]
pub(super) const fn qs_line(t: GgmlType, fifth: FifthBits, c: usize, k: usize) -> usize {
    match (t, fifth) {
        (GgmlType::Q5_K, FifthBits::Chunks) => 7 + 10 * c + k,
        _ => quant_line(t) + 8 * c + k,
    }
}

/// Line of the `Chunks` form holding the fifth bits of quant line `8c + k`: the first of
/// chunk `c`'s two for `k < 4`, else the second.
#[inline]
pub(super) const fn fifth_line(c: usize, k: usize) -> usize {
    5 + 10 * c + k / 4
}

/// Rearranges one (group, super-block) written in the `Bytes` form into the `Chunks` form:
/// bits `2c`, `2c + 1` of fifth-bit line `k` move to bits `2(k mod 4)`, `+ 1` of the same
/// byte of chunk `c`'s line for `k`, and each chunk's quant lines move behind its two.
fn fifth_bytes_to_chunks(l: &mut [Line]) {
    let t = GgmlType::Q5_K;
    let bytes: [[u8; 64]; 8] = std::array::from_fn(|k| l[5 + k].0);
    let quants: [[u8; 64]; 32] = std::array::from_fn(|q| l[quant_line(t) + q].0);
    for c in 0..4 {
        for half in 0..2 {
            let mut line = [0u8; 64];
            for (b, out) in line.iter_mut().enumerate() {
                for m in 0..4 {
                    let qh = bytes[4 * half + m][b];
                    *out |= ((qh >> (2 * c)) & 3) << (2 * m);
                }
            }
            l[fifth_line(c, 4 * half)].0 = line;
        }
        for k in 0..8 {
            l[qs_line(t, FifthBits::Chunks, c, k)].0 = quants[8 * c + k];
        }
    }
}

/// Row `r`'s `qh[4k + i]` read back from the form `fifth`.
fn get_fifth(fifth: FifthBits, l: &[Line], k: usize, r: usize, i: usize) -> u8 {
    match fifth {
        FifthBits::Bytes => l[5 + k].0[slot(r, i)],
        FifthBits::Chunks => {
            let mut qh = 0;
            for c in 0..4 {
                for h in 0..2 {
                    let (line, bit) = fifth_chunk_bit(c, k, h);
                    qh |= ((l[line].0[slot(r, i)] >> bit) & 1) << (2 * c + h);
                }
            }
            qh
        }
    }
}

/// Reads row `r`'s stored block back out of one packed (group, super-block).
fn get_block(t: GgmlType, fifth: FifthBits, l: &[Line], r: usize, blk: &mut [u8]) {
    match t {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            blk[0..2].copy_from_slice(&l[0].0[2 * r..2 * r + 2]);
            blk[2..4].copy_from_slice(&l[0].0[32 + 2 * r..32 + 2 * r + 2]);
            let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
            for j in 0..8 {
                let at = 16 * j + r;
                sc[j] = l[1 + at / 64].0[at % 64];
                let am = min_at(j, r);
                mn[j] = l[3 + am / 64].0[am % 64];
            }
            k_quants::pack_scale_min_k4(&sc, &mn, &mut blk[4..16]);
            let qs0 = if t == GgmlType::Q5_K { 48 } else { 16 };
            for k in 0..8 {
                for i in 0..4 {
                    if t == GgmlType::Q5_K {
                        blk[16 + 4 * k + i] = get_fifth(fifth, l, k, r, i);
                    }
                    for c in 0..4 {
                        blk[qs0 + 32 * c + 4 * k + i] = l[qs_line(t, fifth, c, k)].0[slot(r, i)];
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            blk[208..210].copy_from_slice(&l[0].0[2 * r..2 * r + 2]);
            for g in 0..16 {
                let at = 16 * g + r;
                blk[192 + g] = l[1 + at / 64].0[at % 64];
            }
            for h in 0..2 {
                for k in 0..8 {
                    let base = 5 + (8 * h + k) * 3;
                    for i in 0..4 {
                        blk[64 * h + 4 * k + i] = l[base].0[slot(r, i)];
                        blk[64 * h + 32 + 4 * k + i] = l[base + 1].0[slot(r, i)];
                        blk[128 + 32 * h + 4 * k + i] = l[base + 2].0[slot(r, i)];
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            blk[108..110].copy_from_slice(&l[0].0[2 * r..2 * r + 2]);
            let sc: [i8; 16] = std::array::from_fn(|g| {
                let at = 16 * g + r;
                l[1 + at / 64].0[at % 64] as i8
            });
            k_quants::pack_q3_k_scales(&sc, &mut blk[96..108]);
            blk[..96].fill(0);
            for k in 0..8 {
                for i in 0..4 {
                    let e = 4 * k + i;
                    let c = q3_codes(std::array::from_fn(|q| l[5 + 3 * k + q].0[slot(r, i)]));
                    for (j, &cj) in c.iter().enumerate() {
                        blk[32 + 32 * (j / 4) + e] |= (cj & 3) << (2 * (j % 4));
                        blk[e] |= (cj >> 2) << j;
                    }
                }
            }
        }
        GgmlType::Q2_K => {
            blk[80..82].copy_from_slice(&l[0].0[2 * r..2 * r + 2]);
            blk[82..84].copy_from_slice(&l[0].0[32 + 2 * r..32 + 2 * r + 2]);
            for (g, sc) in blk[..16].iter_mut().enumerate() {
                let at = 16 * g + r;
                *sc = l[1 + at / 64].0[at % 64];
            }
            for h in 0..2 {
                for k in 0..8 {
                    for i in 0..4 {
                        blk[16 + 32 * h + 4 * k + i] = l[5 + 8 * h + k].0[slot(r, i)];
                    }
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferno_tensor::k_quants::{Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
    use inferno_tensor::TensorBytes;

    /// ISAs whose kernels read the two forms of the fifth bits.
    const BOTH_FORMS: [Isa; 2] = [Isa::Avx2, Isa::Avx512Vnni];

    const STORED: [(GgmlType, usize); 5] = [
        (GgmlType::Q2_K, Q2_K_BYTES),
        (GgmlType::Q3_K, Q3_K_BYTES),
        (GgmlType::Q4_K, Q4_K_BYTES),
        (GgmlType::Q5_K, Q5_K_BYTES),
        (GgmlType::Q6_K, Q6_K_BYTES),
    ];

    fn matrix(t: GgmlType, rows: usize, cols: usize, seed: u32) -> Matrix {
        let mut state = seed | 1;
        let rb = t.row_size(cols as u64).unwrap() as usize;
        let data: Vec<u8> = (0..rows * rb)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state as u8
            })
            .collect();
        Matrix {
            name: "w".into(),
            dtype: t,
            rows,
            cols,
            data: TensorBytes::from_vec(data),
            prepared: None,
        }
    }

    /// Packing then reading a row back gives the stored bytes, for every byte value the
    /// fields can hold (random bytes; the 6-bit scale packing round-trips all 12 bytes).
    #[test]
    fn stored_rows_round_trip_through_the_packing() {
        for (t, bb) in STORED {
            for rows in [1usize, 15, 16, 17, 40] {
                let m = matrix(t, rows, 512, rows as u32 * 7 + bb as u32);
                for isa in BOTH_FORMS {
                    let p = PackedK::pack(isa, &m).unwrap();
                    let rb = m.row_bytes();
                    let mut back = vec![0u8; rb];
                    for r in 0..rows {
                        p.stored_row(r, &mut back);
                        assert_eq!(&back[..], m.row(r), "{t} {:?} row {r} of {rows}", p.fifth);
                    }
                }
            }
        }
    }

    /// Looking a row up in the packed form gives the stored row's values.
    #[test]
    fn rows_dequantize_from_the_packing_as_from_the_stored_bytes() {
        for (t, _) in STORED {
            let m = matrix(t, 20, 768, 11);
            for isa in BOTH_FORMS {
                let p = PackedK::pack(isa, &m).unwrap();
                let (mut a, mut b) = (vec![0f32; 768], vec![0f32; 768]);
                for r in [0, 7, 16, 19] {
                    assert!(p.dequantize_row(r, &mut a));
                    inferno_tensor::dequantize_row(t, m.row(r), &mut b).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{t} {:?} row {r}", p.fifth);
                }
                assert!(!p.dequantize_row(20, &mut a));
            }
        }
    }

    /// The packed form is within 3% of the stored bytes (Q3_K: 6%, its scales a byte each),
    /// plus the zero rows padding the last group.
    #[test]
    fn packing_adds_under_three_percent() {
        for (t, bb) in STORED {
            let m = matrix(t, 64, 1024, 3);
            let p = PackedK::pack(Isa::Avx512Vnni, &m).unwrap();
            let stored = 64 * 4 * bb;
            let bound = if t == GgmlType::Q3_K { 1.06 } else { 1.03 };
            assert!(
                p.bytes() as f64 <= stored as f64 * bound,
                "{t}: {} vs {stored}",
                p.bytes()
            );
        }
    }

    /// Each min pair holds the sums of the quants of its two 32-value sub-blocks.
    #[test]
    fn min_pairs_sum_the_quants_of_each_sub_block() {
        let nsb = 3;
        let x: Vec<f32> = (0..nsb * QK)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.7)
            .collect();
        let mut row = vec![0u8; nsb * (k_quants::Q8_K_BYTES + MIN_PAIR_BYTES)];
        k_quants::quantize_q8_k(&x, &mut row);
        write_min_pairs(&mut row, nsb);
        for b in 0..nsb {
            let blk = &row[b * k_quants::Q8_K_BYTES..];
            let q = |i: usize| blk[XQS + i] as i8 as i32;
            let sub = |j: usize| (32 * j..32 * j + 32).map(q).sum::<i32>();
            for p in 0..4 {
                let at = nsb * k_quants::Q8_K_BYTES + b * MIN_PAIR_BYTES + 4 * p;
                let half = |o: usize| i16::from_le_bytes([row[at + o], row[at + o + 1]]) as i32;
                assert_eq!(
                    (half(0), half(2)),
                    (sub(2 * p), sub(2 * p + 1)),
                    "block {b} pair {p}"
                );
            }
        }
    }

    /// The VNNI Q2_K products that scale the codes by lookup give the bits of those that
    /// multiply each sub-block's sum by its scale, at every token tile, on random bytes (all
    /// scale and code values) against activations that reach ±127.
    #[test]
    fn q2_k_lookups_give_the_bits_of_the_scale_multiplies() {
        if !q2_lookups(Isa::Avx512Vnni) || !Isa::Avx512Vnni.is_available() {
            return;
        }
        let (rows, cols) = (40, 768);
        let nsb = cols / QK;
        let mut p =
            PackedK::pack(Isa::Avx512Vnni, &matrix(GgmlType::Q2_K, rows, cols, 11)).unwrap();
        assert!(p.q2_lookups);
        let qrow = nsb * (k_quants::Q8_K_BYTES + MIN_PAIR_BYTES);
        for n in (1..=10).chain([16, 17, 23]) {
            let mut xq = vec![0u8; n * qrow];
            for (t, row) in xq.chunks_exact_mut(qrow).enumerate() {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 131 + t * 17) % 255) as f32 - 127.0)
                    .collect();
                k_quants::quantize_q8_k(&x, row);
                write_min_pairs(row, nsb);
            }
            let mut product = |lookups: bool| {
                p.q2_lookups = lookups;
                let mut out = vec![0f32; n * rows];
                // SAFETY: AVX-512 VNNI is available (checked above); `out` holds n · rows.
                let ran = unsafe {
                    p.rows(
                        Isa::Avx512Vnni,
                        &xq,
                        qrow,
                        n,
                        0,
                        rows,
                        OutPtr(out.as_mut_ptr()),
                        rows,
                    )
                };
                assert!(ran);
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            assert_eq!(product(true), product(false), "{n} tokens");
        }
    }

    #[test]
    fn other_types_and_ragged_rows_are_not_packed() {
        assert!(PackedK::pack(Isa::Avx2, &matrix(GgmlType::Q8_0, 16, 256, 1)).is_none());
        let mut m = matrix(GgmlType::Q4_K, 16, 256, 1);
        m.cols = 128;
        assert!(PackedK::pack(Isa::Avx2, &m).is_none());
    }
}
